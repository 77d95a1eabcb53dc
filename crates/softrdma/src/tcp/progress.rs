//! The iWARP progress thread: one per context, `mio` (epoll) underneath.
//!
//! The thread owns every socket and, per socket, one sans-IO iWARP [`IwConn`] (MPA startup,
//! FPDU framing and the QP's RDMAP engine, glued together there); it moves bytes, time and
//! events and does the verbs bookkeeping. Users reach it through commands and per-QP
//! submission queues (see [`crate::qp`]), and it hands back completions (CQs), events and
//! state.
//!
//! Per connection:
//! * receive: read until `WouldBlock` (at most [`RX_BUDGET`] octets per turn), every read
//!   to the connection; a QP on a shared receive queue gets a buffer when the connection
//!   asks for one ([`IwConn::needs_recv`]);
//! * transmit: whole frames from the connection into one transmit queue until it holds
//!   [`TX_HIGH`] octets, headers copied and payloads referenced in registered memory, then
//!   written with one vectored `write` (large writes, not one per FPDU, no user-space copy
//!   of the payload); a send completes once its last octet is written;
//! * close: a dead stream (Terminate sent or received, [`Qp::disconnect`](crate::Qp::disconnect))
//!   flushes its transmit buffer, shuts the write side and waits for the peer's FIN.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Registry, Token};
use softrdma_iwarp::connection::{
    ConnEvent, ConnState, Connection as IwConn, ConnectionConfig, DEFAULT_RX_DIRECT_MIN,
    FpduSizing, NUDGE_AFTER, RxWindow,
};
use softrdma_iwarp::rdmap::{MAX_MULPDU, QpConfig, QpEvent, StreamState};
use softrdma_iwarp::startup::{Negotiated, Role, StartupConfig};
use softrdma_memory::{PdId, QpId, TxBuf, TxSink};
use softrdma_verbs_types::{
    CheckedRecv, CheckedSend, PostError, WcOpcode, WcStatus, WorkCompletion,
};

use crate::leader::Turn;

use super::{
    Cmd, DeviceStats, HalfOpen, ListenerShared, PendingRequest, Reply, TcpQp, TcpShared, emss,
    prepare_stream,
};
use crate::Error;
use crate::connparams::{ConnectionDetail, ConnectionInfo, FpduSize, IwarpConnection};
use crate::cq::Pushed;
use crate::event::AsyncEvent;
use crate::state::{QpCounters, QpState};
use crate::tap::{self, Direction, Tap, Tapped};

/// An IPv4 peer seen through an IPv6 socket counts as its IPv4 address.
fn canonical_ip(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, Into::into),
        v4 => v4,
    }
}

/// The waker's token.
pub(crate) const WAKER: Token = Token(0);
/// First token handed to listeners and connections.
pub(crate) const FIRST_TOKEN: usize = 1;

/// Receive chunk (one `read`).
const RX_CHUNK: usize = 256 * 1024;
/// Octets read from one connection before the others get a turn.
const RX_BUDGET: usize = 4 * 1024 * 1024;
/// Transmit buffer fill level that triggers a write.
const TX_HIGH: usize = 256 * 1024;

/// Posts that follow the one before on their connection within this are a burst
/// ([`Conn::align`]): a loop posting back to back, not a program that waited for anything
/// in between (a round trip takes longer).
const BURST_GAP: Duration = Duration::from_micros(2);

/// The longest a burst's last partial segment waits for the next post or a poll before
/// whoever waits on the sockets writes it ([`Conn::align`]).
const HOLD: Duration = Duration::from_micros(20);

/// Silent connections read again, at most, before one gives its place to a newcomer: a
/// bound on the work one accept can cause.
const HALF_OPEN_RECHECKS: usize = 8;

struct Listening {
    listener: TcpListener,
    shared: Arc<ListenerShared>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteSide {
    Open,
    /// Shut down once the transmit buffer is empty.
    CloseWhenFlushed,
    Closed,
}

/// Scratch space shared by all connections.
struct Bufs {
    rx: Vec<u8>,
    send_wcs: Vec<WorkCompletion>,
    recv_wcs: Vec<WorkCompletion>,
    /// The transmit queue a connection with nothing queued writes through
    /// ([`Conn::transmit`]).
    tx: TxBuf,
}

pub(crate) struct Conn {
    token: Token,
    stream: TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    /// The context's tap, if any ([`crate::Context::set_tap`]).
    tap: Option<Arc<dyn Tap>>,
    emss: u32,
    /// MPA startup, framing and the QP's engine.
    iw: IwConn,
    /// Responder before the ULP's decision.
    listener: Option<Arc<ListenerShared>>,
    /// The blocked `connect` or `accept`.
    reply: Option<Reply>,
    qp: Option<Arc<TcpQp>>,
    /// The connection's `Established` event was handled: the QP is connected.
    established: bool,
    /// Receives handed to the engine before that (so an FPDU right behind the MPA Reply
    /// finds them); they go back to the QP's queue if the startup fails, as the QP goes
    /// back to `Init`.
    early_rq: Vec<CheckedRecv>,
    /// Events of the stream, published with the state and the completions.
    qp_events: Vec<QpEvent>,
    /// A completion queue of the QP overran: the stream fails at the next hand-out.
    cq_overrun: bool,
    /// Accepted and waiting for the MPA Request: counted against the listener's
    /// `max_half_open`.
    half_open: Option<HalfOpen>,
    /// Frames to write: headers copied, large payloads referenced in registered memory.
    tx: TxBuf,
    write_side: WriteSide,
    /// Inbound octets are read and dropped (closing).
    discard_rx: bool,
    eof: bool,
    dead: bool,
    /// Its QP was destroyed while octets of completed sends were still to be written: they
    /// go out (a send completion promised them), then the connection dies without waiting
    /// for the peer's FIN.
    die_when_flushed: bool,
    /// The read budget ran out with data possibly left in the socket.
    more_rx: bool,
    /// A readiness event said the stream ended (FIN, RST): the read that returns the end
    /// is made even after a short read, as no later edge will come for it.
    end_signalled: bool,
    /// Send requests handed to the engine and not yet retired.
    sq_in_engine: usize,
    rq_in_engine: usize,
    /// Scratch of `submit_to_engine`.
    sends: VecDeque<CheckedSend>,
    recvs: VecDeque<CheckedRecv>,
    /// While a post in a burst transmits: write whole multiples of this (the EMSS) only,
    /// and keep the partial segment after them for the next post ([`BURST_GAP`]); 0:
    /// write everything.
    ///
    /// Every write of a message a little over a segment (64 KiB on `lo`, whose MSS is
    /// 65483) otherwise ends in a segment of a few dozen octets, pushed at once
    /// (`TCP_NODELAY`): two segments per message, each costing both sides a pass through
    /// the TCP stack. A program posting one request per call (perftest) then moved 64 KiB
    /// Writes a quarter slower than one posting lists (issue 43). What is kept goes out
    /// with the next post's octets, at the next poll or wait (whose writes take
    /// everything), or after [`HOLD`] (a timer of the connection).
    align: usize,
    /// When the last post returned (for [`BURST_GAP`]).
    last_post: Option<Instant>,
    /// Since when octets are kept back ([`Conn::align`]): the timer that writes them.
    held_since: Option<Instant>,
}

/// A TCP connect the thread makes for a task ([`Cmd::Dial`]): connected once writable.
struct Dialing {
    stream: TcpStream,
    qp: Arc<TcpQp>,
    startup: StartupConfig,
    started: Instant,
    fpdu: FpduSize,
    reply: Reply,
}

impl Dialing {
    fn deadline(&self) -> Instant {
        self.started + self.startup.timeout
    }

    /// The attempt ended before MPA: the QP goes back to `Init`.
    fn fail(self, e: Error) {
        self.qp.transition(QpState::Connecting, QpState::Init);
        let _ = self.reply.send(Err(e));
    }
}

pub(crate) struct Driver {
    registry: Registry,
    conns: HashMap<Token, Conn>,
    dialing: HashMap<Token, Dialing>,
    listeners: HashMap<Token, Listening>,
    qp_conn: HashMap<u32, Token>,
    bufs: Bufs,
    /// Connections handled since the last [`Driver::settle`]: only they can have changed
    /// what the sets below record, so a turn costs what it handled, not the number of
    /// connections.
    touched: Vec<Token>,
    /// The other half of [`TcpShared::ready`] (see [`Driver::ready`]).
    ready_spare: Vec<Arc<TcpQp>>,
    /// Connections whose read budget ran out.
    more_rx: HashSet<Token>,
    /// Connections with a timer.
    timed: HashSet<Token>,
    /// Dead connections, to be removed.
    dead: Vec<Token>,
}

/// The I/O slot of an iWARP context: the epoll set of every socket (see [`crate::leader`]).
pub(crate) struct Slot {
    pub(crate) poll: mio::Poll,
    events: Events,
}

impl Slot {
    pub(crate) fn new(poll: mio::Poll) -> Slot {
        Slot {
            poll,
            events: Events::with_capacity(1024),
        }
    }
}

impl Driver {
    pub(crate) fn new(registry: Registry) -> Driver {
        Driver {
            registry,
            conns: HashMap::default(),
            dialing: HashMap::default(),
            listeners: HashMap::default(),
            qp_conn: HashMap::default(),
            touched: Vec::new(),
            ready_spare: Vec::new(),
            more_rx: HashSet::default(),
            timed: HashSet::default(),
            dead: Vec::new(),
            bufs: Bufs {
                rx: vec![0u8; RX_CHUNK],
                send_wcs: Vec::new(),
                recv_wcs: Vec::new(),
                tx: TxBuf::new(),
            },
        }
    }
}

/// One turn with the slot: wait on the sockets at most until `until` (and the next timer),
/// then run everything that is ready.
pub(crate) fn turn(ctx: &TcpShared, slot: &mut Slot, until: Option<Instant>) -> Turn {
    #[cfg(test)]
    let hooked = ctx.leader.caller_holds() && ctx.run_turn_hook();
    let now = Instant::now();
    // Letting the driver go runs posts scheduled meanwhile, in this thread: their
    // completions may be what this thread waits for (`Leader::wake`).
    let mut timeout = ctx.lock_driver().timeout(now);
    if let Some(u) = until {
        let left = u.saturating_duration_since(now);
        timeout = Some(timeout.map_or(left, |t| t.min(left)));
    }
    if ctx.leader.take_self_wake() {
        timeout = Some(Duration::ZERO);
    }
    #[cfg(test)]
    if hooked {
        *ctx.hooked_poll.lock() = Some(timeout);
    }
    if let Err(e) = slot.poll.poll(&mut slot.events, timeout)
        && e.kind() != io::ErrorKind::Interrupted
    {
        shut_down(ctx);
        return Turn::Stop;
    }
    if !ctx.alive.load(Ordering::Acquire) {
        return Turn::Stop;
    }
    let mut worked = Turn::Idle;
    let mut d = ctx.lock_driver();
    let now = Instant::now();
    d.commands(ctx, now);
    d.ready(ctx);
    for ev in slot.events.iter() {
        let t = ev.token();
        if t == WAKER {
            continue;
        }
        worked = Turn::Worked;
        if d.listeners.contains_key(&t) {
            d.accept_all(ctx, t, now);
        } else if d.dialing.contains_key(&t) {
            d.dialed(ctx, t, now);
        } else {
            let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
            // The end of the stream (FIN, RST) came with this edge: nothing later will say
            // so again.
            let ended = ev.is_read_closed() || ev.is_error();
            d.conn_event(ctx, t, readable, ended, now);
        }
    }
    // The time read after the wait serves the whole turn: timers are coarse next to it,
    // and a clock read per step was a measurable share of a 1,024-connection receiver.
    d.rest(ctx, now);
    worked
}

/// What a turn does besides socket events: connections with more to read, timers, reaping,
/// commands and new work requests. Also run while the background thread stands down.
pub(crate) fn idle(ctx: &TcpShared) {
    let mut d = ctx.lock_driver();
    let now = Instant::now();
    d.commands(ctx, now);
    d.ready(ctx);
    d.rest(ctx, now);
}

/// The background thread's body.
pub(crate) fn run(ctx: Weak<TcpShared>) {
    loop {
        let Some(c) = ctx.upgrade() else { return };
        if !c.alive.load(Ordering::Acquire) {
            return;
        }
        let go_on = c.leader.background(
            |slot, until| turn(&c, slot, until),
            || {
                idle(&c);
                true
            },
        );
        if !go_on {
            return;
        }
    }
}

fn shut_down(ctx: &TcpShared) {
    ctx.alive.store(false, Ordering::Release);
    // Dropping the commands drops their reply senders: blocked callers see the context
    // closed.
    ctx.cmds.lock().clear();
}

impl Driver {
    fn rest(&mut self, ctx: &TcpShared, now: Instant) {
        self.settle();
        let again: Vec<Token> = self.more_rx.iter().copied().collect();
        for t in again {
            self.conn_event(ctx, t, true, false, now);
        }
        self.timeouts(ctx, now);
        self.remove_dead(ctx);
    }

    /// Brings `more_rx`, `timed` and `dead` up to date with the connections touched.
    fn settle(&mut self) {
        for t in self.touched.drain(..) {
            let Some(c) = self.conns.get(&t) else {
                self.more_rx.remove(&t);
                self.timed.remove(&t);
                continue;
            };
            if c.more_rx {
                self.more_rx.insert(t);
            } else {
                self.more_rx.remove(&t);
            }
            if c.poll_timeout().is_some() {
                self.timed.insert(t);
            } else {
                self.timed.remove(&t);
            }
            // The list is short: what died since the last removal.
            if c.dead && !self.dead.contains(&t) {
                self.dead.push(t);
            }
        }
    }

    /// A busy poller's turn: read what has arrived on the connections of `cq`'s QPs.
    pub(crate) fn sweep(&mut self, ctx: &TcpShared, cq: &crate::cq::CqShared) {
        let now = Instant::now();
        let feeds = |c: &Conn| {
            c.qp.as_ref().is_some_and(|q| {
                std::ptr::eq(Arc::as_ptr(&q.send_cq), cq)
                    || std::ptr::eq(Arc::as_ptr(&q.recv_cq), cq)
            })
        };
        for (t, c) in self.conns.iter_mut().filter(|(_, c)| feeds(c)) {
            self.touched.push(*t);
            c.on_event(ctx, &mut self.bufs, true, false, now);
        }
    }

    /// A poster's turn: the QP's queued requests go to its engine and out to the socket in
    /// the posting thread.
    pub(crate) fn post(&mut self, ctx: &TcpShared, qp: &Arc<TcpQp>) {
        qp.scheduled.store(false, Ordering::Release);
        if let Some(c) = self
            .qp_conn
            .get(&qp.qpn)
            .and_then(|t| touch(&mut self.conns, &mut self.touched, *t))
        {
            c.posted(ctx, &mut self.bufs);
        } else if qp.state().is_dead() {
            flush_orphan(qp);
        }
    }

    /// Requests of `qp` posted while this thread holds the driver: `admit(wr, true)` checks
    /// each and returns it unless it had to queue behind others; those go to the engine
    /// here, without a trip through the submission queue, and out. `None` (and nothing taken
    /// from `wrs`) when the QP has no established connection: they queue.
    pub(crate) fn post_direct<W, C: Hand>(
        &mut self,
        ctx: &TcpShared,
        qp: &Arc<TcpQp>,
        wrs: &mut impl Iterator<Item = (usize, W)>,
        admit: impl Fn(W, bool) -> Result<Option<C>, Error>,
    ) -> Option<Result<(), (usize, Error)>> {
        let t = self.established_conn(qp).filter(|t| !self.conns[t].dead)?;
        let c = touch(&mut self.conns, &mut self.touched, t)?;
        let start = Instant::now();
        #[cfg(test)]
        let burst = ctx.always_burst.load(Ordering::Relaxed);
        #[cfg(not(test))]
        let burst = false;
        if burst
            || c.last_post
                .is_some_and(|l| start.saturating_duration_since(l) < BURST_GAP)
        {
            c.align = c.emss as usize;
        }
        let held = c.held_since.is_some();
        let (mut res, mut handed, mut serve, mut queued) = (Ok(()), false, false, false);
        for (i, wr) in wrs {
            match admit(wr, true) {
                Ok(Some(wr)) => {
                    serve |= wr.hand(c, qp);
                    handed = true;
                }
                Ok(None) => queued = true,
                Err(e) => {
                    res = Err((i, e));
                    break;
                }
            }
        }
        if queued {
            c.posted(ctx, &mut self.bufs);
        } else if serve || (handed && !c.quiet()) {
            c.serve_submitted(ctx, &mut self.bufs);
        }
        c.align = 0;
        c.last_post = Some(Instant::now());
        if !held && c.held_since.is_some() {
            // A new timer: whoever waits on the sockets looks again.
            ctx.wake();
        }
        Some(res)
    }

    /// `qp`'s counters: its connection's engine's while it has one, else those it kept.
    pub(crate) fn qp_counters(&self, qp: &Arc<TcpQp>) -> QpCounters {
        self.established_conn(qp)
            .map_or_else(|| *qp.counters.lock(), |t| self.conns[&t].counters())
    }

    /// The established connection that carries `qp`.
    fn established_conn(&self, qp: &Arc<TcpQp>) -> Option<Token> {
        let t = *self.qp_conn.get(&qp.qpn)?;
        let c = self.conns.get(&t)?;
        (c.established && c.qp.as_ref().is_some_and(|q| Arc::ptr_eq(q, qp))).then_some(t)
    }

    fn timeout(&mut self, now: Instant) -> Option<Duration> {
        self.settle();
        if !self.more_rx.is_empty() {
            return Some(Duration::ZERO);
        }
        self.timed
            .iter()
            .filter_map(|t| self.conns.get(t)?.poll_timeout())
            .chain(self.dialing.values().map(Dialing::deadline))
            .min()
            .map(|d| d.saturating_duration_since(now))
    }

    fn commands(&mut self, ctx: &TcpShared, now: Instant) {
        let cmds = std::mem::take(&mut *ctx.cmds.lock());
        for cmd in cmds {
            self.command(ctx, cmd, now);
        }
    }

    fn command(&mut self, ctx: &TcpShared, cmd: Cmd, now: Instant) {
        match cmd {
            Cmd::Listen {
                token,
                mut listener,
                shared,
            } => {
                if self
                    .registry
                    .register(&mut listener, token, Interest::READABLE)
                    .is_ok()
                {
                    self.listeners.insert(token, Listening { listener, shared });
                    // Connections may have queued before the registration.
                    self.accept_all(ctx, token, now);
                } else {
                    shared.close();
                }
            }
            Cmd::Unlisten(token, done) => {
                if let Some(mut l) = self.listeners.remove(&token) {
                    let _ = self.registry.deregister(&mut l.listener);
                    l.shared.close();
                    // Requests nobody will take are rejected.
                    for req in l.shared.drain() {
                        self.command(
                            ctx,
                            Cmd::Reject {
                                token: req.token,
                                private_data: Vec::new(),
                            },
                            now,
                        );
                    }
                    drop(l);
                }
                if let Some(d) = done {
                    let _ = d.try_send(());
                }
            }
            Cmd::Connect {
                qp,
                stream,
                startup,
                started,
                emss,
                fpdu,
                reply,
            } => {
                let d = Dialing {
                    stream,
                    qp,
                    startup,
                    started,
                    fpdu,
                    reply,
                };
                self.start_initiator(ctx, ctx.token(), d, emss);
            }
            Cmd::Dial {
                qp,
                addr,
                startup,
                started,
                fpdu,
                reply,
            } => {
                let token = ctx.token();
                let dialed = TcpStream::connect(addr).and_then(|mut stream| {
                    self.registry
                        .register(&mut stream, token, Interest::WRITABLE)?;
                    Ok(stream)
                });
                match dialed {
                    Ok(stream) => {
                        let d = Dialing {
                            stream,
                            qp,
                            startup,
                            started,
                            fpdu,
                            reply,
                        };
                        self.dialing.insert(token, d);
                    }
                    Err(e) => {
                        qp.transition(QpState::Connecting, QpState::Init);
                        let _ = reply.send(Err(e.into()));
                    }
                }
            }
            Cmd::Accept {
                token,
                qp,
                private_data,
                ird,
                ord,
                fpdu,
                early_fpdus,
                reply,
            } => {
                let Some(c) = touch(&mut self.conns, &mut self.touched, token) else {
                    qp.transition(QpState::Connecting, QpState::Init);
                    let _ = reply.send(Err(Error::Io(io::ErrorKind::ConnectionAborted.into())));
                    return;
                };
                // The ULP names the QP only now (rdma_accept).
                let srq = qp.srq.is_some();
                let r =
                    c.iw.set_data_path(qp_config(&qp), fpdu_sizing(fpdu), srq, early_fpdus)
                        .and_then(|()| c.iw.accept(&private_data, ird, ord));
                if let Err(e) = r {
                    c.dead = true;
                    qp.transition(QpState::Connecting, QpState::Init);
                    let _ = reply.send(Err(e.into()));
                    return;
                }
                c.listener = None;
                self.qp_conn.insert(qp.qpn, token);
                c.qp = Some(qp);
                c.reply = Some(reply);
                // `Established`: the QP goes to RTS and the reply goes out.
                c.events(ctx);
                if let Some(reply) = c.reply.take() {
                    c.dead = true;
                    let _ = reply.send(Err(Error::InvalidArgument("MPA accept without outcome")));
                    return;
                }
                c.service(ctx, &mut self.bufs);
            }
            Cmd::Reject {
                token,
                private_data,
            } => {
                if let Some(c) = touch(&mut self.conns, &mut self.touched, token) {
                    c.listener = None;
                    if c.iw.reject(&private_data).is_ok() {
                        c.write_side = WriteSide::CloseWhenFlushed;
                        c.discard_rx = true;
                        c.service(ctx, &mut self.bufs);
                    } else {
                        c.dead = true;
                    }
                }
            }
            Cmd::Disconnect(qp) => {
                if self.abort_dial(&qp) {
                    return;
                }
                if let Some(c) = self
                    .qp_conn
                    .get(&qp.qpn)
                    .and_then(|t| touch(&mut self.conns, &mut self.touched, *t))
                {
                    c.disconnect(ctx, &mut self.bufs);
                } else if !qp.state().is_dead() {
                    qp.set_state(QpState::Closed);
                    flush_orphan(&qp);
                }
            }
            Cmd::Destroy(qp) => {
                self.abort_dial(&qp);
                if let Some(c) = self
                    .qp_conn
                    .remove(&qp.qpn)
                    .and_then(|t| touch(&mut self.conns, &mut self.touched, t))
                {
                    c.disconnect(ctx, &mut self.bufs);
                    // Abortive: no waiting for the peer's FIN; but what completed sends put
                    // in the transmit buffer is still written (as a kernel socket would).
                    if c.write_side == WriteSide::CloseWhenFlushed {
                        c.die_when_flushed = true;
                    } else {
                        c.dead = true;
                    }
                    c.detach_qp();
                }
                let mut sub = qp.sub.lock();
                sub.sq.clear();
                sub.rq.clear();
            }
        }
    }

    /// The TCP connection of `d` (made without blocking, or by the caller): MPA as
    /// initiator.
    fn start_initiator(&mut self, ctx: &TcpShared, token: Token, d: Dialing, emss: u32) {
        let Dialing {
            stream,
            qp,
            startup,
            started,
            fpdu,
            reply,
        } = d;
        let cfg = ConnectionConfig {
            rx_direct_min: rx_direct_min(),
            nudge_after: nudge_after(),
            fpdu: fpdu_sizing(fpdu),
            srq: qp.srq.is_some(),
            ..ConnectionConfig::new(Role::Initiator, startup, qp_config(&qp), emss)
        };
        let conn = IwConn::new(cfg, ctx.keys.clone(), started)
            .map_err(Error::from)
            .and_then(|iw| {
                Ok(Conn::new(
                    ctx,
                    &self.registry,
                    token,
                    stream,
                    iw,
                    emss,
                    true,
                )?)
            });
        match conn {
            Ok(mut c) => {
                c.reply = Some(reply);
                self.qp_conn.insert(qp.qpn, token);
                c.qp = Some(qp);
                c.service(ctx, &mut self.bufs);
                self.conns.insert(token, c);
                self.touched.push(token);
            }
            Err(e) => {
                qp.transition(QpState::Connecting, QpState::Init);
                let _ = reply.send(Err(e));
            }
        }
    }

    /// An event on a socket being connected: on to MPA once connected, or the error.
    fn dialed(&mut self, ctx: &TcpShared, token: Token, now: Instant) {
        let Some(d) = self.dialing.get(&token) else {
            return;
        };
        // Connected: a peer address and no pending error (as after `connect(2)` polls
        // writable).
        let outcome = match d.stream.take_error() {
            Ok(Some(e)) | Err(e) => Err(e),
            Ok(None) => match d.stream.peer_addr() {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => Err(e),
            },
        };
        let Some(mut d) = self.dialing.remove(&token) else {
            return;
        };
        let _ = self.registry.deregister(&mut d.stream);
        match outcome.and_then(|()| d.stream.set_nodelay(true)) {
            Ok(()) => {
                let emss = emss(socket2::SockRef::from(&d.stream));
                d.startup.timeout = d.deadline().saturating_duration_since(now);
                d.started = now;
                self.start_initiator(ctx, token, d, emss);
            }
            Err(e) => d.fail(e.into()),
        }
    }

    /// Ends the TCP connect of `qp` if one is under way (disconnect or destroy); `true` if
    /// there was one.
    fn abort_dial(&mut self, qp: &Arc<TcpQp>) -> bool {
        let Some(t) = self
            .dialing
            .iter()
            .find_map(|(t, d)| Arc::ptr_eq(&d.qp, qp).then_some(*t))
        else {
            return false;
        };
        if let Some(mut d) = self.dialing.remove(&t) {
            let _ = self.registry.deregister(&mut d.stream);
            d.fail(Error::InvalidState(QpState::Closed));
        }
        true
    }

    /// QPs with new work requests.
    pub(crate) fn ready(&mut self, ctx: &TcpShared) {
        // Swapped with a list kept for the purpose, so neither side's capacity is lost
        // (a post that schedules its QP then allocates nothing).
        let mut ready = std::mem::take(&mut self.ready_spare);
        ctx.ready_pending.store(false, Ordering::Relaxed);
        std::mem::swap(&mut ready, &mut *ctx.ready.lock());
        for qp in ready.drain(..) {
            // Before the connection is up too: receives go in at once.
            self.post(ctx, &qp);
        }
        self.ready_spare = ready;
    }

    fn accept_all(&mut self, ctx: &TcpShared, token: Token, now: Instant) {
        loop {
            let Some(l) = self.listeners.get(&token) else {
                return;
            };
            let (stream, _) = match l.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ECONNABORTED and friends concern one connection; EMFILE would spin, so
                // stop until the next event.
                Err(_) => return,
            };
            let shared = l.shared.clone();
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            let std_stream: std::net::TcpStream = stream.into();
            let Ok(emss) = prepare_stream(&std_stream) else {
                continue;
            };
            // The QP and the data path's settings come with the accept.
            let cfg = ConnectionConfig {
                rx_direct_min: rx_direct_min(),
                ..ConnectionConfig::new(
                    Role::Responder,
                    shared.params.startup_config(),
                    QpConfig::new(PdId(0), QpId(0)),
                    emss,
                )
            };
            let Ok(iw) = IwConn::new(cfg, ctx.keys.clone(), now) else {
                continue;
            };
            let t = ctx.token();
            if let Ok(mut c) = Conn::new(
                ctx,
                &self.registry,
                t,
                TcpStream::from_std(std_stream),
                iw,
                emss,
                false,
            ) {
                // Silent connections are bounded by `max_half_open` (and per source): the
                // oldest silent one makes room rather than the newcomer being refused. One
                // due to go may have sent its Request since it was accepted (a client's
                // burst of connections, all accepted before any was read: Debian's
                // cmtime opens 100 at once): read it first, and a few after it.
                let ip = canonical_ip(peer.ip());
                for _ in 0..HALF_OPEN_RECHECKS {
                    let Some(v) = HalfOpen::victim(&shared, ip, now)
                        .and_then(|old| touch(&mut self.conns, &mut self.touched, old))
                    else {
                        break;
                    };
                    v.read(ctx, &mut self.bufs, now);
                    v.service(ctx, &mut self.bufs);
                    if v.half_open.is_some() {
                        break;
                    }
                }
                let (half_open, evicted) = HalfOpen::take(&shared, t, ip, now);
                if let Some(old) = evicted
                    && let Some(v) = touch(&mut self.conns, &mut self.touched, old)
                {
                    DeviceStats::add(&ctx.stats.half_open_evicted, 1);
                    tracing::info!(peer = %v.peer, new = %peer, "TCP connection closed before its MPA Request: its place goes to a newer one");
                    v.half_open = None;
                    v.listener = None;
                    v.dead = true;
                }
                c.listener = Some(shared);
                c.half_open = Some(half_open);
                // The Request may already be in.
                c.read(ctx, &mut self.bufs, now);
                c.service(ctx, &mut self.bufs);
                self.conns.insert(t, c);
                self.touched.push(t);
            }
        }
    }

    fn conn_event(
        &mut self,
        ctx: &TcpShared,
        token: Token,
        readable: bool,
        ended: bool,
        now: Instant,
    ) {
        if let Some(c) = touch(&mut self.conns, &mut self.touched, token) {
            c.on_event(ctx, &mut self.bufs, readable, ended, now);
        }
    }

    fn timeouts(&mut self, ctx: &TcpShared, now: Instant) {
        let late: Vec<Token> = self
            .dialing
            .iter()
            .filter_map(|(t, d)| (d.deadline() <= now).then_some(*t))
            .collect();
        for t in late {
            if let Some(mut d) = self.dialing.remove(&t) {
                let _ = self.registry.deregister(&mut d.stream);
                d.fail(Error::Timeout);
            }
        }
        self.settle();
        for t in &self.timed {
            let Some(c) = self.conns.get_mut(t) else {
                continue;
            };
            if c.poll_timeout().is_some_and(|d| d <= now) {
                self.touched.push(*t);
                if c.iw.poll_timeout().is_some_and(|d| d <= now) {
                    c.iw.handle_timeout(now);
                    c.events(ctx);
                }
                // Writes everything, kept-back octets too.
                c.service(ctx, &mut self.bufs);
            }
        }
    }

    /// Removes dead connections.
    fn remove_dead(&mut self, ctx: &TcpShared) {
        self.settle();
        for t in std::mem::take(&mut self.dead) {
            let Some(mut c) = self.conns.remove(&t) else {
                continue;
            };
            self.more_rx.remove(&t);
            self.timed.remove(&t);
            let _ = self.registry.deregister(&mut c.stream);
            let _ = c.stream.shutdown(Shutdown::Both);
            if c.write_side != WriteSide::Closed {
                c.tap_fin();
            }
            if let Some(qp) = c.detach_qp() {
                if self.qp_conn.get(&qp.qpn) == Some(&t) {
                    self.qp_conn.remove(&qp.qpn);
                }
                if c.established {
                    tracing::info!(qp = qp.qpn, local = %c.local, peer = %c.peer, "iWARP connection closed");
                    if !qp.state().is_dead() {
                        qp.set_state(QpState::Error);
                    }
                    ctx.post_event(AsyncEvent::Disconnected { qp_num: qp.qpn });
                    // Requests posted after the engine stopped looking.
                    flush_orphan(&qp);
                }
            }
        }
    }
}

/// A checked request a connection's engine takes ([`Driver::post_direct`]).
pub(crate) trait Hand {
    /// Into `c`'s engine; `true` when the connection must be served (a send to write, a
    /// refused request's completion).
    fn hand(self, c: &mut Conn, qp: &TcpQp) -> bool;
}

impl Hand for CheckedSend {
    fn hand(self, c: &mut Conn, qp: &TcpQp) -> bool {
        c.hand_send(qp, self);
        true
    }
}

impl Hand for CheckedRecv {
    fn hand(self, c: &mut Conn, qp: &TcpQp) -> bool {
        c.hand_recv(qp, self)
    }
}

/// Connection `t`, noted as touched (see [`Driver::settle`]).
fn touch<'a>(
    conns: &'a mut HashMap<Token, Conn>,
    touched: &mut Vec<Token>,
    t: Token,
) -> Option<&'a mut Conn> {
    let c = conns.get_mut(&t)?;
    // A connection posted to again and again between two turns is noted once.
    if touched.last() != Some(&t) {
        touched.push(t);
    }
    Some(c)
}

/// Completes every queued request of a QP without a live engine as flushed.
fn flush_orphan(qp: &TcpQp) {
    let (sq, rq) = {
        let mut sub = qp.sub.lock();
        (std::mem::take(&mut sub.sq), std::mem::take(&mut sub.rq))
    };
    let mut send: Vec<WorkCompletion> = sq.iter().map(|wr| wr.flushed()).collect();
    qp.sq_retired.fetch_add(send.len() as u64, Ordering::AcqRel);
    let mut recv: Vec<WorkCompletion> = rq.iter().map(|wr| wr.flushed()).collect();
    qp.rq_retired.fetch_add(recv.len() as u64, Ordering::AcqRel);
    // The QP is gone: an overrun only drops these flushes.
    let _ = qp.send_cq.push(qp.qpn, &mut send);
    let _ = qp.recv_cq.push(qp.qpn, &mut recv);
}

fn error_wc(wr_id: u64, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion::new(wr_id, status, opcode, 0)
}

/// The status of a request the engine refused when the thread handed it over (its key
/// was revoked after the post-time check).
fn post_error_status(e: &PostError) -> WcStatus {
    match e {
        PostError::LocalProtection { .. } => WcStatus::LocalProtection,
        _ => WcStatus::LocalQpOperation,
    }
}

/// The engine's queue sizes from the QP's capabilities; MULPDU, IRD, ORD and the RDMAP
/// version come from the MPA negotiation.
fn qp_config(qp: &TcpQp) -> QpConfig {
    let mut cfg = QpConfig::new(qp.pd, QpId(qp.qpn));
    cfg.sq_depth = qp.cap.max_send_wr;
    let srq_attr = qp.srq.as_ref().map(|s| s.attr);
    cfg.rq_depth = srq_attr.map_or(qp.cap.max_recv_wr, |a| a.max_wr);
    cfg.max_sge = qp
        .cap
        .max_send_sge
        .max(qp.cap.max_recv_sge)
        .max(srq_attr.map_or(0, |a| a.max_sge))
        .max(1);
    cfg.max_inline = qp.cap.max_inline_data;
    cfg
}

/// The payload size from which a receive reads straight into registered memory
/// (`ConnectionConfig::rx_direct_min`): `SOFTRDMA_RX_DIRECT_MIN` (octets, or `off`) where set,
/// for tuning and for interop runs whose FPDUs are small.
fn rx_direct_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| match std::env::var("SOFTRDMA_RX_DIRECT_MIN") {
        Ok(v) if v == "off" => usize::MAX,
        Ok(v) => v.parse().unwrap_or(DEFAULT_RX_DIRECT_MIN),
        Err(_) => DEFAULT_RX_DIRECT_MIN,
    })
}

/// How long an initiator waits for its silent peer before the nudge
/// (`ConnectionConfig::nudge_after`): `SOFTRDMA_NUDGE_AFTER_MS` (milliseconds, or `off`) where
/// set, for interop runs that want the nudge on every connection (0).
fn nudge_after() -> Option<std::time::Duration> {
    static AFTER: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| match std::env::var("SOFTRDMA_NUDGE_AFTER_MS") {
        Ok(v) if v == "off" => None,
        Ok(v) => Some(
            v.parse()
                .map_or(NUDGE_AFTER, std::time::Duration::from_millis),
        ),
        Err(_) => Some(NUDGE_AFTER),
    })
}

fn fpdu_sizing(f: FpduSize) -> FpduSizing {
    match f {
        FpduSize::PathMss => FpduSizing::PathMss,
        FpduSize::Largest => FpduSizing::Fixed(MAX_MULPDU),
        FpduSize::Mulpdu(m) => FpduSizing::Fixed(m),
    }
}

impl Conn {
    fn new(
        ctx: &TcpShared,
        registry: &Registry,
        token: Token,
        mut stream: TcpStream,
        iw: IwConn,
        emss: u32,
        active: bool,
    ) -> io::Result<Conn> {
        let local = stream.local_addr()?;
        let peer = stream.peer_addr()?;
        registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)?;
        DeviceStats::add(
            if active {
                &ctx.stats.connects
            } else {
                &ctx.stats.accepts
            },
            1,
        );
        let tap = ctx.tap.get().cloned();
        if let Some(t) = &tap {
            t.tapped(Tapped::TcpOpen {
                local,
                peer,
                active,
            });
        }
        Ok(Conn {
            token,
            stream,
            local,
            peer,
            tap,
            emss,
            iw,
            listener: None,
            reply: None,
            qp: None,
            established: false,
            early_rq: Vec::new(),
            qp_events: Vec::new(),
            cq_overrun: false,
            half_open: None,
            tx: TxBuf::new(),
            write_side: WriteSide::Open,
            discard_rx: false,
            eof: false,
            dead: false,
            die_when_flushed: false,
            more_rx: false,
            end_signalled: false,
            sq_in_engine: 0,
            rq_in_engine: 0,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            align: 0,
            last_post: None,
            held_since: None,
        })
    }

    /// The socket is ready (or polled): read what arrived, then run the connection.
    /// `ended`: the readiness said the peer's side closed or the connection failed.
    fn on_event(
        &mut self,
        ctx: &TcpShared,
        bufs: &mut Bufs,
        readable: bool,
        ended: bool,
        now: Instant,
    ) {
        self.end_signalled |= ended;
        if readable {
            self.more_rx = false;
            self.read(ctx, bufs, now);
        }
        self.service(ctx, bufs);
    }

    fn read(&mut self, ctx: &TcpShared, bufs: &mut Bufs, now: Instant) {
        let mut budget = RX_BUDGET;
        while !self.eof && !self.dead {
            // A read straight into memory for a payload (up to `direct` octets), with what
            // follows it into `rx`; or a read into `rx`. Receives posted before the octets
            // are read go into the engine first: a Send's payload finds its buffer (a user
            // may post, then tell the peer out of band).
            // Receives posted so far (a later post bumps it, under the lock the submission
            // drains).
            let posted = self.rq_posted();
            let window = if self.discard_rx {
                None
            } else {
                self.submit_to_engine();
                self.iw.rx_window()
            };
            let (got, cap, direct) = match window {
                Some(w) => match self.read_direct(&w, &mut bufs.rx) {
                    Some(r) => (r, w.len + w.tail.min(bufs.rx.len()), w.len),
                    None => continue,
                },
                None => {
                    let cap = self.iw.rx_read_limit().min(bufs.rx.len());
                    let r = self.stream.read(&mut bufs.rx[..cap]);
                    if let (Some(t), Ok(n @ 1..)) = (&self.tap, &r) {
                        t.tapped(Tapped::TcpData {
                            local: self.local,
                            peer: self.peer,
                            dir: Direction::Received,
                            data: &[io::IoSlice::new(&bufs.rx[..*n])],
                        });
                    }
                    (r, cap, 0)
                }
            };
            match got {
                Ok(0) => {
                    if let Some(t) = &self.tap {
                        t.tapped(Tapped::TcpClose {
                            local: self.local,
                            peer: self.peer,
                            dir: Direction::Received,
                        });
                    }
                    self.on_eof();
                    break;
                }
                Ok(n) => {
                    DeviceStats::add(&ctx.stats.octets_rx, n);
                    if let Some(q) = &self.qp {
                        q.send_cq.arrived();
                        if !Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
                            q.recv_cq.arrived();
                        }
                    }
                    let extra = n.saturating_sub(direct);
                    if extra > 0 {
                        // Receives posted while the read was under way go in before the
                        // octets are handled: one posted before the peer sent its Send
                        // (which the read may have just returned) must find it, and the
                        // look before the read can have missed it.
                        if !self.discard_rx && self.rq_posted() != posted {
                            self.submit_to_engine();
                        }
                        self.on_bytes(ctx, &bufs.rx[..extra], now);
                    }
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        self.more_rx = true;
                        break;
                    }
                    // A short read emptied the socket: what arrives later is a new edge,
                    // so the read that would say WouldBlock is saved. Not once an edge
                    // said the stream ended (a FIN or RST behind these octets): no later
                    // edge announces it, and only a read returns it.
                    if n < cap && !self.end_signalled {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.on_eof();
                    break;
                }
            }
        }
        self.events(ctx);
    }

    /// How many receives the QP's user has posted (0 without a QP yet).
    fn rq_posted(&self) -> u64 {
        self.qp
            .as_ref()
            .map_or(0, |q| q.rq_posted.load(Ordering::Acquire))
    }

    /// One read straight into the memory of a direct-placement window, the octets after it
    /// (up to `w.tail`) into `rx`: what was read in all, `None` if the memory refused (the
    /// connection then reads the rest of that payload through `rx` and fails the segment).
    fn read_direct(&mut self, w: &RxWindow, rx: &mut [u8]) -> Option<io::Result<usize>> {
        let tail = w.tail.min(rx.len());
        let Conn {
            stream,
            iw,
            tap,
            local,
            peer,
            ..
        } = self;
        let r = w.target.write_with(w.at, w.len, |mem| {
            let mut iov = [
                io::IoSliceMut::new(mem),
                io::IoSliceMut::new(&mut rx[..tail]),
            ];
            let r = stream.read_vectored(&mut iov);
            if let Ok(n) = r {
                let placed = n.min(w.len);
                iw.rx_placed(&mem[..placed]);
                if let (Some(t), 1..) = (tap, n) {
                    t.tapped(Tapped::TcpData {
                        local: *local,
                        peer: *peer,
                        dir: Direction::Received,
                        data: &[
                            io::IoSlice::new(&mem[..placed]),
                            io::IoSlice::new(&rx[..n - placed]),
                        ],
                    });
                }
            }
            r
        });
        match r {
            Ok(r) => Some(r),
            Err(_) => {
                self.iw.rx_window_failed();
                None
            }
        }
    }

    /// The peer closed its side or the connection failed.
    fn on_eof(&mut self) {
        self.eof = true;
        // The data path reports the loss unless the stream already ended; the startup
        // fails.
        self.iw.handle_eof();
        if matches!(self.iw.state(), ConnState::Established | ConnState::Dead) {
            // Nothing can be sent to a peer that is gone (or has said all it will).
            if self.write_side == WriteSide::Open {
                self.write_side = WriteSide::CloseWhenFlushed;
            }
        } else if self.write_side == WriteSide::Open {
            self.dead = true;
        }
    }

    fn on_bytes(&mut self, ctx: &TcpShared, bytes: &[u8], now: Instant) {
        if self.discard_rx {
            return;
        }
        // (`read` put the receives posted before these octets were read in the engine.)
        self.iw.handle_input(now, bytes);
        while self.iw.needs_recv() {
            self.srq_recv();
            self.iw.handle_input(now, &[]);
        }
        self.events(ctx);
    }

    /// A Send starts on a QP whose own receive queue is empty: the shared receive queue
    /// hands over its next buffer (none: the engine terminates the stream).
    fn srq_recv(&mut self) {
        let Some(qp) = &self.qp else { return };
        let Some(srq) = &qp.srq else { return };
        let Some(wr) = srq.take() else {
            return;
        };
        let wr_id = wr.wr_id;
        match self.iw.engine_mut().post_checked_recv(wr) {
            Ok(()) => self.rq_in_engine += 1,
            Err(e) => {
                let mut v = vec![error_wc(wr_id, post_error_status(&e), WcOpcode::Recv)];
                self.cq_overrun |= qp.recv_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
            }
        }
    }

    /// The connection's events: startup decisions and outcomes, errors of the stream.
    fn events(&mut self, ctx: &TcpShared) {
        while let Some(ev) = self.iw.poll_event() {
            match ev {
                ConnEvent::ConnectRequest {
                    private_data,
                    params,
                } => {
                    self.half_open = None;
                    let queued = self.listener.as_ref().is_some_and(|l| {
                        l.push(PendingRequest {
                            token: self.token,
                            local_addr: self.local,
                            peer_addr: self.peer,
                            private_data,
                            params,
                            early_fpdus: l.params.early_fpdus,
                        })
                    });
                    if !queued {
                        // No listener any more, or `backlog` requests already wait: an MPA
                        // Reply with the Rejected bit (RFC 5044 §7.1.3), then the close.
                        tracing::info!(local = %self.local, peer = %self.peer, "MPA request rejected: listener gone or backlog full");
                        let _ = self.iw.reject(b"busy");
                        self.write_side = WriteSide::CloseWhenFlushed;
                    }
                }
                ConnEvent::Established { negotiated, mulpdu } => {
                    DeviceStats::add(&ctx.stats.established, 1);
                    self.on_established(ctx, negotiated, mulpdu);
                }
                ConnEvent::Rejected { private_data, .. } => {
                    DeviceStats::add(&ctx.stats.rejected, 1);
                    self.fail_connect(Error::Rejected {
                        reason: None,
                        private_data,
                    });
                }
                ConnEvent::StartupFailed(e) => {
                    DeviceStats::add(&ctx.stats.startup_failures, 1);
                    self.fail_connect(Error::Startup(e));
                }
                ConnEvent::Qp(ev) => self.qp_events.push(ev),
            }
        }
    }

    /// Full Operation: the QP is connected; the blocked `connect` or `accept` returns.
    fn on_established(&mut self, ctx: &TcpShared, negotiated: Negotiated, mulpdu: u16) {
        let Some(qp) = self.qp.clone() else {
            // A connection only gets this far with its QP attached.
            self.dead = true;
            return;
        };
        self.established = true;
        self.early_rq.clear();
        qp.ord.store(u32::from(negotiated.ord), Ordering::Release);
        let info = ConnectionInfo {
            local_addr: self.local,
            peer_addr: self.peer,
            peer_private_data: negotiated.peer_private_data.clone(),
            ird: negotiated.ird,
            ord: negotiated.ord,
            detail: ConnectionDetail::Iwarp(IwarpConnection {
                negotiated,
                emss: self.emss,
                mulpdu,
            }),
        };
        *qp.conn.lock() = Some(info.clone());
        qp.set_state(QpState::Rts);
        tracing::info!(
            qp = qp.qpn,
            local = %self.local,
            peer = %self.peer,
            ird = info.ird,
            ord = info.ord,
            mulpdu,
            "iWARP connection established"
        );
        ctx.post_event(AsyncEvent::Established { qp_num: qp.qpn });
        self.submit_to_engine();
        if let Some(r) = self.reply.take() {
            let _ = r.send(Ok(info));
        }
    }

    /// The startup ended without a data path: report, free the QP, close.
    fn fail_connect(&mut self, e: Error) {
        tracing::info!(local = %self.local, peer = %self.peer, error = %e, "iWARP connection setup failed");
        if let Some(qp) = &self.qp {
            // The QP goes back to Init with the receives it had.
            if !self.early_rq.is_empty() {
                let mut sub = qp.sub.lock();
                for wr in self.early_rq.drain(..).rev() {
                    sub.rq.push_front(wr);
                }
            }
            self.rq_in_engine = 0;
            qp.transition(QpState::Connecting, QpState::Init);
        }
        if let Some(r) = self.reply.take() {
            let _ = r.send(Err(e));
        }
        self.listener = None;
        self.dead = true;
    }

    fn disconnect(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.established {
            self.iw.close();
            self.discard_rx = true;
            if self.write_side == WriteSide::Open {
                self.write_side = WriteSide::CloseWhenFlushed;
            }
            self.service(ctx, bufs);
        } else {
            self.fail_connect(Error::InvalidState(QpState::Closed));
        }
    }

    /// Moves queued work requests into the engine, transmits, hands out completions.
    fn service(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.dead {
            return;
        }
        self.submit_to_engine();
        self.serve_submitted(ctx, bufs);
    }

    /// [`Conn::service`] right after the submission queues went to the engine: a second
    /// look at them would find only what was posted since, and a post made while this
    /// thread holds the driver is run from the ready list as it lets go.
    fn serve_submitted(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.dead {
            return;
        }
        loop {
            self.transmit(ctx, &mut bufs.tx);
            self.events(ctx);
            self.collect(ctx, bufs);
            // A queue overran: the Terminate and the flushes go out now.
            let again = std::mem::take(&mut self.cq_overrun);
            if !again || self.dead {
                break;
            }
            self.submit_to_engine();
        }
        self.check_close();
    }

    /// New work requests of the application. When only receives went in, to a stream in
    /// full swing, there is nothing to write, complete or report: no more is done (a
    /// reader takes receives in before each read, so posting them needs no more).
    fn posted(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.dead || (!self.submit_to_engine() && self.quiet()) {
            return;
        }
        self.serve_submitted(ctx, bufs);
    }

    /// The connection's next timer: its engine's, or the write of octets kept back
    /// ([`Conn::align`]).
    fn poll_timeout(&self) -> Option<Instant> {
        let held = self.held_since.filter(|_| !self.dead).map(|t| t + HOLD);
        match (self.iw.poll_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Established, in RTS, nothing waiting to be written or reported.
    fn quiet(&self) -> bool {
        self.established
            && self.write_side == WriteSide::Open
            && self.tx.is_empty()
            && self.iw.state() == ConnState::Established
            && !self.iw.wants_transmit()
            && !self.iw.has_event()
            && !self.cq_overrun
            && self.iw.engine().state() == StreamState::Rts
            && !self.iw.engine().has_output()
    }

    /// Submission queues → engine. Before the connection is up only receives go in (sends
    /// wait for it, and stay queued if it fails). Whether anything but accepted receives
    /// came of it (sends or an invalidation handed over, a request refused).
    fn submit_to_engine(&mut self) -> bool {
        let Some(qp) = self.qp.clone() else {
            return false;
        };
        let established = self.established;
        // Scratch queues kept across calls (no allocation per message); the submission
        // queue gets the empty one back with its capacity.
        let mut sends = std::mem::take(&mut self.sends);
        let mut recvs = std::mem::take(&mut self.recvs);
        {
            let mut sub = qp.sub.lock();
            if established {
                std::mem::swap(&mut sub.sq, &mut sends);
            }
            std::mem::swap(&mut sub.rq, &mut recvs);
        }
        // Posting happens without the submission lock: an INLINE copy or a key check must
        // never wait while a poster waits for that lock.
        let mut handed = !sends.is_empty();
        for wr in recvs.drain(..) {
            handed |= self.hand_recv(&qp, wr);
        }
        for wr in sends.drain(..) {
            self.hand_send(&qp, wr);
        }
        self.sends = sends;
        self.recvs = recvs;
        handed
    }

    /// One receive request to the engine (before the connection is up, a copy is kept in
    /// `early_rq`); refused, it completes in error at once (then `true`).
    fn hand_recv(&mut self, qp: &TcpQp, wr: CheckedRecv) -> bool {
        let wr_id = wr.wr_id;
        let copy = (!self.established).then(|| wr.clone());
        match self.iw.engine_mut().post_checked_recv(wr) {
            Ok(()) => {
                self.rq_in_engine += 1;
                self.early_rq.extend(copy);
                false
            }
            Err(e) => {
                qp.rq_retired.fetch_add(1, Ordering::AcqRel);
                let mut v = vec![error_wc(wr_id, post_error_status(&e), WcOpcode::Recv)];
                self.cq_overrun |= qp.recv_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
                true
            }
        }
    }

    /// One send request to the engine; refused, it completes in error at once.
    fn hand_send(&mut self, qp: &TcpQp, wr: CheckedSend) {
        let wr_id = wr.wr_id;
        let opcode = wr.opcode.wc_opcode();
        match self.iw.engine_mut().post_checked(wr) {
            Ok(()) => self.sq_in_engine += 1,
            Err(e) => {
                qp.sq_retired.fetch_add(1, Ordering::AcqRel);
                let mut v = vec![error_wc(wr_id, post_error_status(&e), opcode)];
                self.cq_overrun |= qp.send_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
            }
        }
    }

    /// Frames and writes what the engine has to send. An idle transmit queue trades places
    /// with the driver's `spare` for it: the spare's memory is in cache from the last
    /// connection that wrote, this one's, among a thousand connections, is not. It goes
    /// back unless octets stay queued (the socket was full).
    fn transmit(&mut self, ctx: &TcpShared, spare: &mut TxBuf) {
        let borrowed = self.tx.is_idle();
        if borrowed {
            std::mem::swap(&mut self.tx, spare);
        }
        loop {
            self.fill_tx();
            let more = !self.tx.is_empty() && self.flush_tx(ctx);
            // Sends whose last octet is written complete (RDMAP-80).
            self.iw.transmitted(&mut self.tx);
            if !more {
                break;
            }
        }
        if self.tx.is_empty() {
            self.held_since = None;
        } else if self.align > 0 && self.held_since.is_none() {
            self.held_since = Some(Instant::now());
        }
        if borrowed && self.tx.is_idle() {
            std::mem::swap(&mut self.tx, spare);
        }
    }

    /// Whole frames from the connection until [`TX_HIGH`] octets wait.
    fn fill_tx(&mut self) {
        if self.write_side == WriteSide::Closed {
            return;
        }
        let waiting = self.tx.len();
        if waiting < TX_HIGH {
            self.iw.poll_transmit_into(&mut self.tx, TX_HIGH - waiting);
        }
    }

    /// Writes the transmit queue, payloads straight from registered memory (one vectored
    /// write per [`softrdma_memory::MAX_IOV`] slices); `true` when it is empty afterwards.
    fn flush_tx(&mut self, ctx: &TcpShared) -> bool {
        let mut wrote = false;
        loop {
            // Kept back: what follows the last whole segment, once one went out.
            let limit = match self.align {
                0 => usize::MAX,
                a => match self.tx.len() / a * a {
                    0 if wrote => return false,
                    0 => usize::MAX,
                    whole => whole,
                },
            };
            wrote = true;
            let Conn {
                stream,
                tap,
                local,
                peer,
                ..
            } = self;
            let r = self.tx.write_with(|iov| {
                let cut;
                let iov = match limit {
                    usize::MAX => iov,
                    n => {
                        cut = crate::net::iov_prefix(iov, n);
                        &cut[..]
                    }
                };
                let r = crate::net::send_vectored(stream, iov);
                if let Ok(n) = r {
                    DeviceStats::add(&ctx.stats.octets_tx, n);
                    if let (Some(t), 1..) = (tap, n) {
                        tap::tcp_written(&**t, *local, *peer, iov, n);
                    }
                }
                r
            });
            match r {
                Ok(None) => return true,
                Ok(Some(0)) => {
                    self.lost();
                    return false;
                }
                Ok(Some(_)) => {}
                Err(Ok(e)) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(Ok(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(Ok(_)) => {
                    self.lost();
                    return false;
                }
                Err(Err(_)) => {
                    // A source was revoked under a framed FPDU: the stream cannot go on.
                    self.lost();
                    return false;
                }
            }
        }
    }

    /// Tells the tap this side's FIN left.
    fn tap_fin(&self) {
        if let Some(t) = &self.tap {
            t.tapped(Tapped::TcpClose {
                local: self.local,
                peer: self.peer,
                dir: Direction::Sent,
            });
        }
    }

    /// The connection failed under us (write error).
    fn lost(&mut self) {
        tracing::info!(local = %self.local, peer = %self.peer, "iWARP connection lost (write failed)");
        // Sends not written never left (RDMAP-80): flushed, not completed.
        self.iw.transmit_failed();
        self.tx.clear();
        self.write_side = WriteSide::Closed;
        self.on_eof();
        self.dead = true;
    }

    /// Engine → CQs, events, state, counters.
    fn collect(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        let Some(qp) = self.qp.as_ref().filter(|_| self.established) else {
            return;
        };
        let engine = self.iw.engine_mut();
        let same_cq = Arc::ptr_eq(&qp.send_cq, &qp.recv_cq);
        while let Some(wc) = engine.poll_completion() {
            if wc.opcode == WcOpcode::Recv && !same_cq {
                bufs.recv_wcs.push(wc);
            } else {
                bufs.send_wcs.push(wc);
            }
        }
        // Retired before the completions are visible, so a poller that saw a completion
        // may post again at once.
        let sq_now = engine.sq_len();
        if sq_now != self.sq_in_engine {
            let retired = self.sq_in_engine.saturating_sub(sq_now);
            qp.sq_retired.fetch_add(retired as u64, Ordering::AcqRel);
            self.sq_in_engine = sq_now;
        }
        let rq_now = engine.rq_len();
        if rq_now != self.rq_in_engine {
            let retired = self.rq_in_engine.saturating_sub(rq_now);
            qp.rq_retired.fetch_add(retired as u64, Ordering::AcqRel);
            self.rq_in_engine = rq_now;
        }
        // State before completions and events: whoever sees those sees the state too.
        let state = match engine.state() {
            StreamState::Rts => QpState::Rts,
            StreamState::Terminating => QpState::Terminate,
            StreamState::Error => QpState::Error,
            StreamState::Closed => QpState::Closed,
        };
        if qp.state() != state {
            qp.set_state(state);
        }
        let a = qp.send_cq.push(qp.qpn, &mut bufs.send_wcs);
        let b = qp.recv_cq.push(qp.qpn, &mut bufs.recv_wcs);
        if (a == Pushed::Overrun || b == Pushed::Overrun || self.cq_overrun)
            && engine.state() == StreamState::Rts
        {
            // IBA 11.4.2.1: the QPs of an overrun queue go to Error; the stream ends with a
            // Local Catastrophic Terminate ([`Conn::service`] runs the engine again).
            engine.local_catastrophic();
            self.cq_overrun = true;
        }
        for ev in self.qp_events.drain(..) {
            *qp.last_event.lock() = Some(ev);
            ctx.post_event(AsyncEvent::Qp {
                qp_num: qp.qpn,
                event: ev,
            });
        }
    }

    /// The engine's counters; read when asked (`Qp::counters`), and kept in the QP when the
    /// connection lets it go: copying them after every message touched several cold lines
    /// per QP.
    fn counters(&self) -> QpCounters {
        QpCounters::from_iwarp(self.iw.engine().counters())
    }

    /// Lets the QP go, its counters kept.
    fn detach_qp(&mut self) -> Option<Arc<TcpQp>> {
        let qp = self.qp.take()?;
        if self.established {
            *qp.counters.lock() = self.counters();
        }
        Some(qp)
    }

    /// Shuts the write side once a dead stream's last octets are out; a connection whose
    /// both sides are closed is dead.
    fn check_close(&mut self) {
        if self.iw.state() == ConnState::Dead && self.write_side == WriteSide::Open {
            // RDMAP-94: after a Terminate the LLP stream is closed.
            self.write_side = WriteSide::CloseWhenFlushed;
            self.discard_rx = true;
        }
        if self.write_side == WriteSide::CloseWhenFlushed && self.tx.is_empty() {
            let _ = self.stream.shutdown(Shutdown::Write);
            self.tap_fin();
            self.write_side = WriteSide::Closed;
        }
        if self.write_side == WriteSide::Closed && (self.eof || self.die_when_flushed) {
            self.dead = true;
        }
    }
}
