//! The iWARP progress thread: one per context, `mio` (epoll) underneath.
//!
//! The thread owns every socket and, per socket, one [`Conn`](super::conn::Conn) around a
//! sans-IO iWARP connection (MPA startup, FPDU framing and the QP's RDMAP engine, glued
//! together there); it moves bytes, time and events and does the verbs bookkeeping. Users
//! reach it through commands and per-QP submission queues (see [`crate::qp`]), and it
//! hands back completions (CQs), events and state.
//!
//! Its parts: this file, the loop (turns on the sockets, timers, reaping); `qp.rs`, how a
//! post reaches its connection (the driver's lock, the ready list); `commands.rs`, the
//! connection manager's commands, connects and accepts; `conn.rs`, one connection.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::io;
use std::net::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Registry, Token};
use softrdma_iwarp::startup::StartupConfig;
use softrdma_memory::TxBuf;

use super::conn::{Bufs, Conn, RX_CHUNK, WriteSide, touch};
use crate::leader::Turn;

use super::{ListenerShared, Reply, TcpQp, TcpShared};
use crate::Error;
use crate::connparams::FpduSize;
use crate::event::AsyncEvent;
use crate::state::QpState;

/// The waker's token.
pub(crate) const WAKER: Token = Token(0);
/// First token handed to listeners and connections.
pub(crate) const FIRST_TOKEN: usize = 1;

pub(super) struct Listening {
    pub(super) listener: TcpListener,
    pub(super) shared: Arc<ListenerShared>,
}

/// A TCP connect the thread makes for a task ([`Cmd::Dial`]): connected once writable.
pub(super) struct Dialing {
    pub(super) stream: TcpStream,
    pub(super) qp: Arc<TcpQp>,
    pub(super) startup: StartupConfig,
    pub(super) started: Instant,
    pub(super) fpdu: FpduSize,
    pub(super) reply: Reply,
}

impl Dialing {
    pub(super) fn deadline(&self) -> Instant {
        self.started + self.startup.timeout
    }

    /// The attempt ended before MPA: the QP goes back to `Init`.
    pub(super) fn fail(self, e: Error) {
        self.qp.transition(QpState::Connecting, QpState::Init);
        let _ = self.reply.send(Err(e));
    }
}

pub(crate) struct Driver {
    pub(super) registry: Registry,
    pub(super) conns: HashMap<Token, Conn>,
    pub(super) dialing: HashMap<Token, Dialing>,
    pub(super) listeners: HashMap<Token, Listening>,
    pub(super) qp_conn: HashMap<u32, Token>,
    pub(super) bufs: Bufs,
    /// Connections handled since the last [`Driver::settle`]: only they can have changed
    /// what the sets below record, so a turn costs what it handled, not the number of
    /// connections.
    pub(super) touched: Vec<Token>,
    /// The other half of [`TcpShared::ready`] (see [`Driver::ready`]).
    pub(super) ready_spare: Vec<Arc<TcpQp>>,
    /// Connections whose read budget ran out.
    pub(super) more_rx: HashSet<Token>,
    /// Connections with a timer.
    pub(super) timed: HashSet<Token>,
    /// Dead connections, to be removed.
    pub(super) dead: Vec<Token>,
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
    if !ctx.leader.is_live() {
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

/// One round of the background thread ([`Leader::start_background`]).
pub(crate) fn round(c: &TcpShared) -> bool {
    c.leader.background(
        |slot, until| turn(c, slot, until),
        || {
            idle(c);
            true
        },
    )
}

fn shut_down(ctx: &TcpShared) {
    ctx.leader.stop();
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
            if c.is_dead() && !self.dead.contains(&t) {
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
                if c.was_established() {
                    tracing::info!(qp = qp.qpn, local = %c.local, peer = %c.peer, "iWARP connection closed");
                    if !qp.state().is_dead() {
                        qp.set_state(QpState::Error);
                    }
                    ctx.post_event(AsyncEvent::Disconnected { qp_num: qp.qpn });
                    // Requests posted after the engine stopped looking.
                    qp.flush_orphan();
                }
            }
        }
    }
}
