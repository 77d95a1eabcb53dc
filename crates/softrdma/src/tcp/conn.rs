//! One TCP connection of the iWARP driver: its socket, its sans-IO iWARP connection
//! (MPA startup, framing, the QP's engine) and the verbs bookkeeping around them: reads,
//! transmits, completions.
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

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustc_hash::FxHashMap as HashMap;
use softrdma_iwarp::connection::{ConnEvent, ConnState, Connection as IwConn, NextRead, RxWindow};
use softrdma_iwarp::rdmap::{QpEvent, StreamState};
use softrdma_iwarp::startup::Negotiated;
use softrdma_memory::{TxBuf, TxSink};
use softrdma_verbs_types::{
    CheckedRecv, CheckedSend, PostError, WcOpcode, WcStatus, WorkCompletion,
};

use super::{DeviceStats, HalfOpen, ListenerShared, PendingRequest, Reply, TcpQp, TcpShared};
use crate::Error;
use crate::connparams::{ConnectionDetail, ConnectionInfo, IwarpConnection};
use crate::cq::Pushed;
use crate::event::AsyncEvent;
use crate::state::{QpCounters, QpState};
use crate::tap::{Direction, Tap, Tapped};

mod tx;

/// Receive chunk (one `read`).
pub(super) const RX_CHUNK: usize = 256 * 1024;
/// Octets read from one connection before the others get a turn.
pub(super) const RX_BUDGET: usize = 4 * 1024 * 1024;
/// Transmit buffer fill level that triggers a write.
pub(super) const TX_HIGH: usize = 256 * 1024;

/// Posts that follow the one before on their connection within this are a burst
/// ([`Conn::align`]): a loop posting back to back, not a program that waited for anything
/// in between (a round trip takes longer).
pub(super) const BURST_GAP: Duration = Duration::from_micros(2);

/// The longest a burst's last partial segment waits for the next post or a poll before
/// whoever waits on the sockets writes it ([`Conn::align`]).
pub(super) const HOLD: Duration = Duration::from_micros(20);

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Life {
    /// MPA startup: receives posted go into the engine (a copy kept), sends wait.
    Starting,
    /// Full Operation: the QP is connected (its `Established` event was handled).
    Established,
    /// Ended after Full Operation: removed at the end of the turn, its QP told.
    Closed,
    /// Ended before Full Operation: removed at the end of the turn.
    Failed,
}

/// The inbound side of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadSide {
    Open,
    /// Closing: inbound octets are read and dropped.
    Discard,
    /// Its QP was destroyed while octets of completed sends were still to be written: they
    /// go out (a send completion promised them), then the connection dies without waiting
    /// for the peer's FIN; inbound octets are dropped meanwhile.
    Abandoned,
    /// The peer closed its side, or the connection failed.
    Ended,
}

/// The outbound side of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteSide {
    Open,
    /// Shut down once the transmit buffer is empty.
    CloseWhenFlushed,
    Closed,
}

/// Scratch space shared by all connections.
pub(super) struct Bufs {
    pub(super) rx: Vec<u8>,
    pub(super) send_wcs: Vec<WorkCompletion>,
    pub(super) recv_wcs: Vec<WorkCompletion>,
    /// The transmit queue a connection with nothing queued writes through
    /// ([`Conn::transmit`]).
    pub(super) tx: TxBuf,
}

pub(crate) struct Conn {
    pub(super) token: Token,
    pub(super) stream: TcpStream,
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
    /// The context's tap, if any ([`crate::Context::set_tap`]).
    pub(super) tap: Option<Arc<dyn Tap>>,
    pub(super) emss: u32,
    /// MPA startup, framing and the QP's engine.
    pub(super) iw: IwConn,
    /// Responder before the ULP's decision.
    pub(super) listener: Option<Arc<ListenerShared>>,
    /// The blocked `connect` or `accept`.
    pub(super) reply: Option<Reply>,
    pub(super) qp: Option<Arc<TcpQp>>,
    pub(super) life: Life,
    /// Receives handed to the engine before that (so an FPDU right behind the MPA Reply
    /// finds them); they go back to the QP's queue if the startup fails, as the QP goes
    /// back to `Init`.
    pub(super) early_rq: Vec<CheckedRecv>,
    /// Events of the stream, published with the state and the completions.
    pub(super) qp_events: Vec<QpEvent>,
    /// A completion queue of the QP overran: the stream fails at the next hand-out.
    pub(super) cq_overrun: bool,
    /// Accepted and waiting for the MPA Request: counted against the listener's
    /// `max_half_open`.
    pub(super) half_open: Option<HalfOpen>,
    /// Frames to write: headers copied, large payloads referenced in registered memory.
    pub(super) tx: TxBuf,
    pub(super) read_side: ReadSide,
    pub(super) write_side: WriteSide,
    /// The read budget ran out with data possibly left in the socket.
    pub(super) more_rx: bool,
    /// A readiness event said the stream ended (FIN, RST): the read that returns the end
    /// is made even after a short read, as no later edge will come for it.
    pub(super) end_signalled: bool,
    /// Send requests handed to the engine and not yet retired.
    pub(super) sq_in_engine: usize,
    pub(super) rq_in_engine: usize,
    /// Scratch of `submit_to_engine`.
    pub(super) sends: VecDeque<CheckedSend>,
    pub(super) recvs: VecDeque<CheckedRecv>,
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
    pub(super) align: usize,
    /// When the last post returned (for [`BURST_GAP`]).
    pub(super) last_post: Option<Instant>,
    /// Since when octets are kept back ([`Conn::align`]): the timer that writes them.
    pub(super) held_since: Option<Instant>,
}

pub(super) fn error_wc(wr_id: u64, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion::new(wr_id, status, opcode, 0)
}

/// The status of a request the engine refused when the thread handed it over (its key
/// was revoked after the post-time check).
pub(super) fn post_error_status(e: &PostError) -> WcStatus {
    match e {
        PostError::LocalProtection { .. } => WcStatus::LocalProtection,
        _ => WcStatus::LocalQpOperation,
    }
}

impl Conn {
    pub(super) fn new(
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
            life: Life::Starting,
            early_rq: Vec::new(),
            qp_events: Vec::new(),
            cq_overrun: false,
            half_open: None,
            tx: TxBuf::new(),
            read_side: ReadSide::Open,
            write_side: WriteSide::Open,
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

    /// To be removed at the end of the turn.
    pub(super) fn is_dead(&self) -> bool {
        matches!(self.life, Life::Closed | Life::Failed)
    }

    /// The data path came up (the QP is connected, or was until the connection ended).
    pub(super) fn was_established(&self) -> bool {
        matches!(self.life, Life::Established | Life::Closed)
    }

    /// Ends the connection: removed at the end of the turn.
    pub(super) fn die(&mut self) {
        self.life = match self.life {
            Life::Starting | Life::Failed => Life::Failed,
            Life::Established | Life::Closed => Life::Closed,
        };
    }

    /// Closing: what arrives from now on is read and dropped.
    pub(super) fn discard_rx(&mut self) {
        if self.read_side == ReadSide::Open {
            self.read_side = ReadSide::Discard;
        }
    }

    /// Its QP is gone: the connection dies once its transmit queue is written, without
    /// waiting for the peer's FIN.
    pub(super) fn abandon(&mut self) {
        if self.read_side != ReadSide::Ended {
            self.read_side = ReadSide::Abandoned;
        }
    }

    /// The socket is ready (or polled): read what arrived, then run the connection.
    /// `ended`: the readiness said the peer's side closed or the connection failed.
    pub(super) fn on_event(
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

    pub(super) fn read(&mut self, ctx: &TcpShared, bufs: &mut Bufs, now: Instant) {
        let mut budget = RX_BUDGET;
        while self.read_side != ReadSide::Ended && !self.is_dead() {
            // A read straight into memory for a payload (up to `direct` octets), with what
            // follows it into `rx`; or a read into `rx`. Receives posted before the octets
            // are read go into the engine first: a Send's payload finds its buffer (a user
            // may post, then tell the peer out of band).
            // Receives posted so far (a later post bumps it, under the lock the submission
            // drains).
            let posted = self.rq_posted();
            let next = if self.read_side != ReadSide::Open {
                NextRead::Buffered(usize::MAX)
            } else {
                self.submit_to_engine();
                self.iw.next_read()
            };
            let (got, cap, direct) = match next {
                NextRead::Direct(w) => match self.read_direct(&w, &mut bufs.rx) {
                    Some(r) => (r, w.len + w.tail.min(bufs.rx.len()), w.len),
                    None => continue,
                },
                NextRead::Buffered(limit) => {
                    let cap = limit.min(bufs.rx.len());
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
                        if self.read_side == ReadSide::Open && self.rq_posted() != posted {
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
                iw.rx_placed(Ok(&mem[..placed]));
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
            Err(e) => {
                self.iw.rx_placed(Err(e));
                None
            }
        }
    }

    /// The peer closed its side or the connection failed.
    fn on_eof(&mut self) {
        self.read_side = ReadSide::Ended;
        // The data path reports the loss unless the stream already ended; the startup
        // fails.
        self.iw.handle_eof();
        if matches!(self.iw.state(), ConnState::Established | ConnState::Dead) {
            // Nothing can be sent to a peer that is gone (or has said all it will).
            if self.write_side == WriteSide::Open {
                self.write_side = WriteSide::CloseWhenFlushed;
            }
        } else if self.write_side == WriteSide::Open {
            self.die();
        }
    }

    fn on_bytes(&mut self, ctx: &TcpShared, bytes: &[u8], now: Instant) {
        if self.read_side != ReadSide::Open {
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
        match self.iw.post_recv(wr) {
            Ok(()) => self.rq_in_engine += 1,
            Err(e) => {
                let mut v = vec![error_wc(wr_id, post_error_status(&e), WcOpcode::Recv)];
                self.cq_overrun |= qp.recv_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
            }
        }
    }

    /// The connection's events: startup decisions and outcomes, errors of the stream.
    pub(super) fn events(&mut self, ctx: &TcpShared) {
        while let Some(ev) = self.iw.poll_event() {
            match ev {
                ConnEvent::ConnectRequest {
                    private_data,
                    params,
                } => {
                    self.half_open = None;
                    let queued = self.listener.as_ref().is_some_and(|l| {
                        l.requests
                            .push(PendingRequest {
                                token: self.token,
                                local_addr: self.local,
                                peer_addr: self.peer,
                                private_data,
                                params,
                                early_fpdus: l.params.iwarp.early_fpdus,
                            })
                            .is_ok()
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
            self.die();
            return;
        };
        // (Ended meanwhile: it stays so, as a connection that was established.)
        self.life = if self.is_dead() {
            Life::Closed
        } else {
            Life::Established
        };
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
        self.die();
    }

    pub(super) fn disconnect(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.was_established() {
            self.iw.close();
            self.discard_rx();
            if self.write_side == WriteSide::Open {
                self.write_side = WriteSide::CloseWhenFlushed;
            }
            self.service(ctx, bufs);
        } else {
            self.fail_connect(Error::InvalidState(QpState::Closed));
        }
    }

    /// Moves queued work requests into the engine, transmits, hands out completions.
    pub(super) fn service(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.is_dead() {
            return;
        }
        self.submit_to_engine();
        self.serve_submitted(ctx, bufs);
    }

    /// [`Conn::service`] right after the submission queues went to the engine: a second
    /// look at them would find only what was posted since, and a post made while this
    /// thread holds the driver is run from the ready list as it lets go.
    pub(super) fn serve_submitted(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.is_dead() {
            return;
        }
        loop {
            self.transmit(ctx, &mut bufs.tx);
            self.events(ctx);
            self.collect(ctx, bufs);
            // A queue overran: the Terminate and the flushes go out now.
            let again = std::mem::take(&mut self.cq_overrun);
            if !again || self.is_dead() {
                break;
            }
            self.submit_to_engine();
        }
        self.check_close();
    }

    /// New work requests of the application. When only receives went in, to a stream in
    /// full swing, there is nothing to write, complete or report: no more is done (a
    /// reader takes receives in before each read, so posting them needs no more).
    pub(super) fn posted(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        if self.is_dead() || (!self.submit_to_engine() && self.quiet()) {
            return;
        }
        self.serve_submitted(ctx, bufs);
    }

    /// The connection's next timer: its engine's, or the write of octets kept back
    /// ([`Conn::align`]).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let held = self
            .held_since
            .filter(|_| !self.is_dead())
            .map(|t| t + HOLD);
        match (self.iw.poll_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Established, in RTS, nothing waiting to be written or reported.
    pub(super) fn quiet(&self) -> bool {
        self.life == Life::Established
            && self.write_side == WriteSide::Open
            && self.tx.is_empty()
            && !self.cq_overrun
            && self.iw.is_quiet()
    }

    /// Engine → CQs, events, state, counters.
    fn collect(&mut self, ctx: &TcpShared, bufs: &mut Bufs) {
        let Some(qp) = self.qp.as_ref().filter(|_| self.was_established()) else {
            return;
        };
        let iw = &mut self.iw;
        let same_cq = Arc::ptr_eq(&qp.send_cq, &qp.recv_cq);
        while let Some(wc) = iw.poll_completion() {
            if wc.opcode == WcOpcode::Recv && !same_cq {
                bufs.recv_wcs.push(wc);
            } else {
                bufs.send_wcs.push(wc);
            }
        }
        // Retired before the completions are visible, so a poller that saw a completion
        // may post again at once.
        let (sq_now, rq_now) = iw.queued();
        if sq_now != self.sq_in_engine {
            let retired = self.sq_in_engine.saturating_sub(sq_now);
            qp.sq_retired.fetch_add(retired as u64, Ordering::AcqRel);
            self.sq_in_engine = sq_now;
        }
        if rq_now != self.rq_in_engine {
            let retired = self.rq_in_engine.saturating_sub(rq_now);
            qp.rq_retired.fetch_add(retired as u64, Ordering::AcqRel);
            self.rq_in_engine = rq_now;
        }
        // State before completions and events: whoever sees those sees the state too.
        let state = match iw.stream_state() {
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
            && iw.stream_state() == StreamState::Rts
        {
            // IBA 11.4.2.1: the QPs of an overrun queue go to Error; the stream ends with a
            // Local Catastrophic Terminate ([`Conn::service`] runs the engine again).
            iw.local_catastrophic();
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
    pub(super) fn counters(&self) -> QpCounters {
        QpCounters::from_iwarp(self.iw.counters())
    }

    /// Lets the QP go, its counters kept.
    pub(super) fn detach_qp(&mut self) -> Option<Arc<TcpQp>> {
        let qp = self.qp.take()?;
        if self.was_established() {
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
            self.discard_rx();
        }
        if self.write_side == WriteSide::CloseWhenFlushed && self.tx.is_empty() {
            let _ = self.stream.shutdown(Shutdown::Write);
            self.tap_fin();
            self.write_side = WriteSide::Closed;
        }
        if self.write_side == WriteSide::Closed
            && matches!(self.read_side, ReadSide::Ended | ReadSide::Abandoned)
        {
            self.die();
        }
    }
}

impl Conn {
    /// Submission queues → engine. Before the connection is up only receives go in (sends
    /// wait for it, and stay queued if it fails). Whether anything but accepted receives
    /// came of it (sends or an invalidation handed over, a request refused).
    pub(super) fn submit_to_engine(&mut self) -> bool {
        let Some(qp) = self.qp.clone() else {
            return false;
        };
        let established = self.was_established();
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
    pub(in crate::tcp) fn hand_recv(&mut self, qp: &TcpQp, wr: CheckedRecv) -> bool {
        let wr_id = wr.wr_id;
        let copy = (!self.was_established()).then(|| wr.clone());
        match self.iw.post_recv(wr) {
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
    pub(in crate::tcp) fn hand_send(&mut self, qp: &TcpQp, wr: CheckedSend) {
        let wr_id = wr.wr_id;
        let opcode = wr.opcode.wc_opcode();
        match self.iw.post_send(wr) {
            Ok(()) => self.sq_in_engine += 1,
            Err(e) => {
                qp.sq_retired.fetch_add(1, Ordering::AcqRel);
                let mut v = vec![error_wc(wr_id, post_error_status(&e), opcode)];
                self.cq_overrun |= qp.send_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
            }
        }
    }
}

/// Connection `t`, noted as touched (see [`Driver::settle`]).
pub(super) fn touch<'a>(
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
