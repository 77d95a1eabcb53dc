//! The TCP driver: one progress thread per context, `mio` (epoll) underneath.
//!
//! The thread owns every socket and every QP's sans-IO engines (MPA [`Startup`], [`Framer`],
//! [`Deframer`], [`RdmapEngine`]); users reach it through commands and per-QP submission
//! queues (see [`crate::qp`]), and it hands back completions (CQs), events and state.
//!
//! Per connection:
//! * receive: read until `WouldBlock` (at most [`RX_BUDGET`] octets per turn), startup
//!   octets to the [`Startup`], the rest to the [`Deframer`], each ULPDU to the engine;
//! * transmit: ULPDUs from the engine are framed into one transmit buffer until it holds
//!   [`TX_HIGH`] octets, then written with one `write` (large writes, not one per FPDU);
//! * close: a dead stream (Terminate sent or received, [`Qp::disconnect`](crate::Qp::disconnect))
//!   flushes its transmit buffer, shuts the write side and waits for the peer's FIN.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use softrdma_iwarp::framing::{Deframer, Framer};
use softrdma_iwarp::rdmap::{QpConfig, QpState as EngineState, RdmapEngine};
use softrdma_iwarp::startup::{Negotiated, Role, Rtr, Startup, StartupEvent, StartupState};
use softrdma_iwarp::verbs_types::{
    PostError, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use softrdma_memory::{Access, Buffer, QpId};
use softrdma_wire::ddp::{self, DDP_VERSION, TAGGED_HEADER_LEN};
use softrdma_wire::mpa::LlpError;
use softrdma_wire::rdmap::{Control, Opcode};

use crate::Error;
use crate::cm::{Connection, FpduSize, ListenerShared, PendingRequest, prepare_stream};
use crate::device::{AsyncEvent, CtxShared};
use crate::qp::{QpShared, QpState, SqItem};

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
/// Below this many unsent octets the transmit buffer is compacted and refilled.
const TX_LOW: usize = 64 * 1024;

/// Work for the progress thread.
pub(crate) enum Cmd {
    Listen {
        token: Token,
        listener: TcpListener,
        shared: Arc<ListenerShared>,
    },
    Unlisten(Token),
    Connect {
        qp: Arc<QpShared>,
        stream: TcpStream,
        startup: Box<Startup>,
        emss: u32,
        fpdu: FpduSize,
        reply: SyncSender<Result<Connection, Error>>,
    },
    Accept {
        token: Token,
        qp: Arc<QpShared>,
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
        fpdu: FpduSize,
        early_fpdus: bool,
        reply: SyncSender<Result<Connection, Error>>,
    },
    Reject {
        token: Token,
        private_data: Vec<u8>,
    },
    Disconnect(Arc<QpShared>),
    Destroy(Arc<QpShared>),
}

struct Listening {
    listener: TcpListener,
    shared: Arc<ListenerShared>,
}

struct DataPath {
    engine: RdmapEngine,
    framer: Framer,
    deframer: Deframer,
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
    ulpdu: Vec<u8>,
    send_wcs: Vec<WorkCompletion>,
    recv_wcs: Vec<WorkCompletion>,
}

struct Conn {
    token: Token,
    stream: TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    emss: u32,
    fpdu: FpduSize,
    startup: Startup,
    /// Responder before the ULP's decision.
    listener: Option<Arc<ListenerShared>>,
    early_fpdus: bool,
    /// Initiator: the blocked `connect`.
    reply: Option<SyncSender<Result<Connection, Error>>>,
    qp: Option<Arc<QpShared>>,
    dp: Option<DataPath>,
    /// FPDUs may be sent (MPA-72, MPA-73).
    can_tx: bool,
    /// Initiator, peer-to-peer: the RTR still has to go out first.
    rtr_tx: bool,
    /// Responder, peer-to-peer with a zero-length Write RTR: drop that first FPDU.
    rtr_rx: bool,
    seen_fpdu: bool,
    tx: Vec<u8>,
    tx_off: usize,
    write_side: WriteSide,
    /// Inbound octets are read and dropped (closing).
    discard_rx: bool,
    eof: bool,
    dead: bool,
    /// The read budget ran out with data possibly left in the socket.
    more_rx: bool,
    /// Send requests handed to the engine and not yet retired.
    sq_in_engine: usize,
    rq_in_engine: usize,
    /// An Invalidate waits for earlier send requests to retire.
    local_waiting: bool,
}

struct Driver {
    poll: Poll,
    conns: HashMap<Token, Conn>,
    listeners: HashMap<Token, Listening>,
    qp_conn: HashMap<u32, Token>,
    bufs: Bufs,
}

/// The progress thread's body.
pub(crate) fn run(ctx: Weak<CtxShared>, poll: Poll) {
    let mut d = Driver {
        poll,
        conns: HashMap::new(),
        listeners: HashMap::new(),
        qp_conn: HashMap::new(),
        bufs: Bufs {
            rx: vec![0u8; RX_CHUNK],
            ulpdu: Vec::with_capacity(64 * 1024),
            send_wcs: Vec::new(),
            recv_wcs: Vec::new(),
        },
    };
    let mut events = Events::with_capacity(1024);
    loop {
        let timeout = d.timeout(Instant::now());
        if let Err(e) = d.poll.poll(&mut events, timeout)
            && e.kind() != io::ErrorKind::Interrupted
        {
            if let Some(ctx) = ctx.upgrade() {
                shut_down(&ctx);
            }
            return;
        }
        let Some(ctx) = ctx.upgrade() else { return };
        if !ctx.alive.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        d.commands(&ctx, now);
        d.ready(&ctx, now);
        for ev in events.iter() {
            let t = ev.token();
            if t == WAKER {
                continue;
            }
            if d.listeners.contains_key(&t) {
                d.accept_all(&ctx, t, now);
            } else {
                let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                d.conn_event(&ctx, t, readable, now);
            }
        }
        let again: Vec<Token> = d
            .conns
            .iter()
            .filter(|(_, c)| c.more_rx)
            .map(|(t, _)| *t)
            .collect();
        for t in again {
            d.conn_event(&ctx, t, true, now);
        }
        d.timeouts(&ctx, Instant::now());
        d.reap(&ctx);
    }
}

fn shut_down(ctx: &CtxShared) {
    ctx.alive.store(false, Ordering::Release);
    // Dropping the commands drops their reply senders: blocked callers see the context
    // closed.
    ctx.cmds.lock().clear();
}

impl Driver {
    fn timeout(&self, now: Instant) -> Option<Duration> {
        if self.conns.values().any(|c| c.more_rx) {
            return Some(Duration::ZERO);
        }
        self.conns
            .values()
            .filter_map(|c| c.startup.poll_timeout())
            .min()
            .map(|d| d.saturating_duration_since(now))
    }

    fn commands(&mut self, ctx: &CtxShared, now: Instant) {
        let cmds = std::mem::take(&mut *ctx.cmds.lock());
        for cmd in cmds {
            self.command(ctx, cmd, now);
        }
    }

    fn command(&mut self, ctx: &CtxShared, cmd: Cmd, now: Instant) {
        match cmd {
            Cmd::Listen {
                token,
                mut listener,
                shared,
            } => {
                if self
                    .poll
                    .registry()
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
            Cmd::Unlisten(token) => {
                if let Some(mut l) = self.listeners.remove(&token) {
                    let _ = self.poll.registry().deregister(&mut l.listener);
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
                }
            }
            Cmd::Connect {
                qp,
                stream,
                startup,
                emss,
                fpdu,
                reply,
            } => {
                let token = ctx.token();
                match Conn::new(&self.poll, token, stream, *startup, emss, fpdu) {
                    Ok(mut c) => {
                        c.reply = Some(reply);
                        self.qp_conn.insert(qp.qpn, token);
                        c.qp = Some(qp);
                        c.pump(ctx, &mut self.bufs);
                        self.conns.insert(token, c);
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
                let Some(c) = self.conns.get_mut(&token) else {
                    qp.transition(QpState::Connecting, QpState::Init);
                    let _ = reply.send(Err(Error::Io(io::ErrorKind::ConnectionAborted.into())));
                    return;
                };
                c.fpdu = fpdu;
                c.early_fpdus = early_fpdus;
                if let Err(e) = c.startup.accept(&private_data, ird, ord) {
                    c.dead = true;
                    qp.transition(QpState::Connecting, QpState::Init);
                    let _ = reply.send(Err(e.into()));
                    return;
                }
                c.listener = None;
                while c.startup.poll_event().is_some() {}
                let Some(outcome) = c.startup.outcome().cloned() else {
                    c.dead = true;
                    let _ = reply.send(Err(Error::InvalidArgument("MPA accept without outcome")));
                    return;
                };
                self.qp_conn.insert(qp.qpn, token);
                c.qp = Some(qp);
                let info = c.start_data_path(ctx, &outcome);
                let _ = reply.send(Ok(info));
                c.pump(ctx, &mut self.bufs);
            }
            Cmd::Reject {
                token,
                private_data,
            } => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.listener = None;
                    if c.startup.reject(&private_data).is_ok() {
                        c.write_side = WriteSide::CloseWhenFlushed;
                        c.discard_rx = true;
                        c.pump(ctx, &mut self.bufs);
                    } else {
                        c.dead = true;
                    }
                }
            }
            Cmd::Disconnect(qp) => {
                if let Some(c) = self
                    .qp_conn
                    .get(&qp.qpn)
                    .and_then(|t| self.conns.get_mut(t))
                {
                    c.disconnect(ctx, &mut self.bufs);
                } else if !qp.state().is_dead() {
                    qp.set_state(QpState::Closed);
                    flush_orphan(ctx, &qp);
                }
            }
            Cmd::Destroy(qp) => {
                if let Some(c) = self
                    .qp_conn
                    .remove(&qp.qpn)
                    .and_then(|t| self.conns.get_mut(&t))
                {
                    c.disconnect(ctx, &mut self.bufs);
                    // Abortive: no waiting for the peer's FIN.
                    c.dead = true;
                    c.qp = None;
                }
                let mut sub = qp.sub.lock();
                sub.sq.clear();
                sub.rq.clear();
            }
        }
    }

    /// QPs with new work requests.
    fn ready(&mut self, ctx: &CtxShared, _now: Instant) {
        let ready = std::mem::take(&mut *ctx.ready.lock());
        for qp in ready {
            qp.scheduled.store(false, Ordering::Release);
            match self
                .qp_conn
                .get(&qp.qpn)
                .and_then(|t| self.conns.get_mut(t))
            {
                Some(c) if c.dp.is_some() => c.pump(ctx, &mut self.bufs),
                Some(_) => {}
                None if qp.state().is_dead() => flush_orphan(ctx, &qp),
                None => {}
            }
        }
    }

    fn accept_all(&mut self, ctx: &CtxShared, token: Token, now: Instant) {
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
            let std_stream: std::net::TcpStream = stream.into();
            let Ok(emss) = prepare_stream(&std_stream) else {
                continue;
            };
            let Ok(startup) = Startup::responder(shared.params.startup_config(), now) else {
                continue;
            };
            let t = ctx.token();
            if let Ok(mut c) = Conn::new(
                &self.poll,
                t,
                TcpStream::from_std(std_stream),
                startup,
                emss,
                FpduSize::PathMss,
            ) {
                c.early_fpdus = shared.params.early_fpdus;
                c.listener = Some(shared);
                // The Request may already be in.
                c.read(ctx, &mut self.bufs, now);
                c.pump(ctx, &mut self.bufs);
                self.conns.insert(t, c);
            }
        }
    }

    fn conn_event(&mut self, ctx: &CtxShared, token: Token, readable: bool, now: Instant) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if readable {
            c.more_rx = false;
            c.read(ctx, &mut self.bufs, now);
        }
        c.pump(ctx, &mut self.bufs);
    }

    fn timeouts(&mut self, ctx: &CtxShared, now: Instant) {
        for c in self.conns.values_mut() {
            if c.startup.poll_timeout().is_some_and(|d| d <= now) {
                c.startup.handle_timeout(now);
                c.startup_events(ctx);
                c.pump(ctx, &mut self.bufs);
            }
        }
    }

    /// Removes dead connections.
    fn reap(&mut self, ctx: &CtxShared) {
        let dead: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.dead)
            .map(|(t, _)| *t)
            .collect();
        for t in dead {
            let Some(mut c) = self.conns.remove(&t) else {
                continue;
            };
            let _ = self.poll.registry().deregister(&mut c.stream);
            let _ = c.stream.shutdown(Shutdown::Both);
            if let Some(qp) = c.qp.take() {
                if self.qp_conn.get(&qp.qpn) == Some(&t) {
                    self.qp_conn.remove(&qp.qpn);
                }
                if c.dp.is_some() {
                    if !qp.state().is_dead() {
                        qp.set_state(QpState::Error);
                    }
                    ctx.post_event(AsyncEvent::Disconnected { qp_num: qp.qpn });
                    // Requests posted after the engine stopped looking.
                    flush_orphan(ctx, &qp);
                }
            }
        }
    }
}

/// Completes every queued request of a QP without a live engine as flushed.
fn flush_orphan(ctx: &CtxShared, qp: &QpShared) {
    let (sq, rq) = {
        let mut sub = qp.sub.lock();
        (std::mem::take(&mut sub.sq), std::mem::take(&mut sub.rq))
    };
    let mut send = Vec::new();
    for item in sq {
        match item {
            SqItem::Send { wr, .. } => {
                send.push(flushed(wr.wr_id, wc_opcode(&wr.opcode)));
            }
            SqItem::Invalidate { key, reply } => {
                let _ = reply.send(ctx.keys.invalidate_local(key, qp.pd));
                continue;
            }
        }
        qp.sq_retired.fetch_add(1, Ordering::AcqRel);
    }
    let mut recv: Vec<WorkCompletion> = rq
        .iter()
        .map(|wr| flushed(wr.wr_id, WcOpcode::Recv))
        .collect();
    qp.rq_retired.fetch_add(recv.len() as u64, Ordering::AcqRel);
    qp.send_cq.push(&mut send);
    qp.recv_cq.push(&mut recv);
}

fn flushed(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    error_wc(wr_id, WcStatus::WorkRequestFlushed, opcode)
}

fn error_wc(wr_id: u64, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        flags: WcFlags::default(),
        invalidated_key: None,
    }
}

fn wc_opcode(op: &WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::Send | WrOpcode::SendWithInvalidate { .. } => WcOpcode::Send,
        WrOpcode::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
    }
}

/// The status of a request the engine refused when the thread handed it over (its key
/// was revoked after the post-time check).
fn post_error_status(e: &PostError) -> WcStatus {
    match e {
        PostError::LocalProtection { .. } => WcStatus::LocalProtection,
        _ => WcStatus::LocalQpOperation,
    }
}

/// RFC 6581 RTR: a zero-length RDMA Write (tagged, STag 0, TO 0, L=1).
fn rtr_write() -> Vec<u8> {
    let control = Control::new(Opcode::RdmaWrite)
        .octet()
        .expect("RV and Rsv fit two bits");
    let mut b = vec![0u8; TAGGED_HEADER_LEN];
    ddp::Repr::Tagged {
        last: true,
        reserved: 0,
        dv: DDP_VERSION,
        rsvd_ulp: control,
        stag: 0,
        to: 0,
    }
    .emit(&mut b)
    .expect("buffer of the header's length");
    b
}

fn is_zero_length_write(ulpdu: &[u8]) -> bool {
    ulpdu.len() == TAGGED_HEADER_LEN
        && matches!(
            ddp::Repr::parse(ulpdu),
            Ok(ddp::Repr::Tagged { rsvd_ulp, .. })
                if rsvd_ulp & softrdma_wire::rdmap::MASK_OPCODE == Opcode::RdmaWrite as u8
        )
}

/// The first segment of an inbound Send (untagged, queue 0, MO 0): the moment a shared
/// receive queue hands over a buffer.
fn starts_send(ulpdu: &[u8]) -> bool {
    matches!(
        ddp::Repr::parse(ulpdu),
        Ok(ddp::Repr::Untagged { qn: 0, mo: 0, .. })
    )
}

impl Conn {
    fn new(
        poll: &Poll,
        token: Token,
        mut stream: TcpStream,
        startup: Startup,
        emss: u32,
        fpdu: FpduSize,
    ) -> io::Result<Conn> {
        let local = stream.local_addr()?;
        let peer = stream.peer_addr()?;
        poll.registry()
            .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)?;
        Ok(Conn {
            token,
            stream,
            local,
            peer,
            emss,
            fpdu,
            startup,
            listener: None,
            early_fpdus: false,
            reply: None,
            qp: None,
            dp: None,
            can_tx: false,
            rtr_tx: false,
            rtr_rx: false,
            seen_fpdu: false,
            tx: Vec::new(),
            tx_off: 0,
            write_side: WriteSide::Open,
            discard_rx: false,
            eof: false,
            dead: false,
            more_rx: false,
            sq_in_engine: 0,
            rq_in_engine: 0,
            local_waiting: false,
        })
    }

    /// Builds the engines of full operation from the negotiated parameters.
    fn start_data_path(&mut self, ctx: &CtxShared, outcome: &Negotiated) -> Connection {
        let qp = self
            .qp
            .clone()
            .expect("a QP is attached before the data path starts");
        let mulpdu = self.fpdu.mulpdu(self.emss, outcome.markers_tx);
        let mut cfg = QpConfig::new(qp.pd, QpId(qp.qpn));
        cfg.mulpdu = mulpdu;
        cfg.ird = outcome.ird;
        cfg.ord = outcome.ord;
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
        cfg.rdmap_version = outcome.rdmap_version();
        let engine = RdmapEngine::new(cfg, ctx.keys.clone());
        self.dp = Some(DataPath {
            engine,
            framer: outcome.framer(mulpdu),
            deframer: outcome.deframer(),
        });
        match self.startup.role() {
            Role::Initiator => {
                self.can_tx = true;
                self.rtr_tx = outcome.rtr == Some(Rtr::ZeroLengthWrite);
            }
            Role::Responder => {
                self.rtr_rx = outcome.rtr == Some(Rtr::ZeroLengthWrite);
                self.can_tx = outcome.rtr.is_none() && self.early_fpdus;
            }
        }
        qp.ord.store(u32::from(outcome.ord), Ordering::Release);
        let info = Connection {
            local_addr: self.local,
            peer_addr: self.peer,
            negotiated: outcome.clone(),
            emss: self.emss,
            mulpdu,
        };
        *qp.conn.lock() = Some(info.clone());
        qp.set_state(QpState::Rts);
        ctx.post_event(AsyncEvent::Established { qp_num: qp.qpn });
        // Receives posted before the connection go in before any FPDU is delivered (an
        // early FPDU may sit right behind the MPA Reply).
        self.feed(ctx);
        info
    }

    fn read(&mut self, ctx: &CtxShared, bufs: &mut Bufs, now: Instant) {
        let mut budget = RX_BUDGET;
        while !self.eof && !self.dead {
            match self.stream.read(&mut bufs.rx) {
                Ok(0) => {
                    self.on_eof();
                    break;
                }
                Ok(n) => {
                    self.on_bytes(ctx, &bufs.rx[..n], now);
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        self.more_rx = true;
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
        if self.dp.is_none() {
            self.startup_events(ctx);
        }
    }

    /// The peer closed its side or the connection failed.
    fn on_eof(&mut self) {
        self.eof = true;
        match &mut self.dp {
            Some(dp) => {
                if matches!(
                    dp.engine.state(),
                    EngineState::Rts | EngineState::Terminating
                ) {
                    dp.engine.handle_llp_error(LlpError::TcpConnectionLost);
                }
                // Nothing can be sent to a peer that is gone (or has said all it will).
                self.write_side = match self.write_side {
                    WriteSide::Open => WriteSide::CloseWhenFlushed,
                    w => w,
                };
            }
            None => {
                self.startup.handle_eof();
                if self.write_side == WriteSide::Open {
                    self.dead = true;
                }
            }
        }
    }

    fn on_bytes(&mut self, ctx: &CtxShared, mut bytes: &[u8], now: Instant) {
        if self.discard_rx {
            return;
        }
        if self.dp.is_none() {
            if matches!(
                self.startup.state(),
                StartupState::Rejected | StartupState::Failed
            ) {
                return;
            }
            match self.startup.handle_input(now, bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(_) => bytes = &[],
            }
            self.startup_events(ctx);
            if self.dp.is_none() {
                if !bytes.is_empty() && self.startup.state() == StartupState::AwaitingDecision {
                    // Octets before our Reply: a violation the startup reports (§7.6).
                    let _ = self.startup.handle_input(now, bytes);
                    self.startup_events(ctx);
                }
                return;
            }
        }
        if bytes.is_empty() || self.dp.is_none() {
            return;
        }
        // Receives posted before these octets were read must be in the engine before the
        // Sends among them are delivered (a user may post, then tell the peer out of band).
        self.feed(ctx);
        let Some(dp) = self.dp.as_mut() else { return };
        dp.deframer.push(bytes);
        let srq = self.qp.as_ref().and_then(|q| q.srq.clone());
        for item in dp.deframer.by_ref() {
            let ulpdu = match item {
                Ok(u) => u,
                Err(e) => {
                    dp.engine.handle_llp_error(e);
                    break;
                }
            };
            if !self.seen_fpdu {
                self.seen_fpdu = true;
                self.startup.fpdu_received();
                self.can_tx = true;
                if self.rtr_rx && is_zero_length_write(&ulpdu) {
                    continue;
                }
            }
            if let Some(srq) = &srq
                && dp.engine.rq_len() == 0
                && dp.engine.state() == EngineState::Rts
                && starts_send(&ulpdu)
                && let Some(wr) = srq.queue.lock().pop_front()
            {
                let wr_id = wr.wr_id;
                match dp.engine.post_recv(wr) {
                    Ok(()) => self.rq_in_engine += 1,
                    Err(e) => {
                        if let Some(qp) = &self.qp {
                            let mut v =
                                vec![error_wc(wr_id, post_error_status(&e), WcOpcode::Recv)];
                            qp.recv_cq.push(&mut v);
                        }
                    }
                }
            }
            dp.engine.handle_ulpdu(&ulpdu);
        }
    }

    fn startup_events(&mut self, ctx: &CtxShared) {
        while let Some(ev) = self.startup.poll_event() {
            match ev {
                StartupEvent::RequestReceived {
                    private_data,
                    params,
                } => match &self.listener {
                    Some(l) => l.push(PendingRequest {
                        token: self.token,
                        local_addr: self.local,
                        peer_addr: self.peer,
                        private_data,
                        params,
                        early_fpdus: self.early_fpdus,
                    }),
                    None => {
                        let _ = self.startup.reject(&[]);
                        self.write_side = WriteSide::CloseWhenFlushed;
                    }
                },
                StartupEvent::Accepted { outcome } => {
                    if self.startup.role() == Role::Initiator && self.dp.is_none() {
                        let info = self.start_data_path(ctx, &outcome);
                        if let Some(r) = self.reply.take() {
                            let _ = r.send(Ok(info));
                        }
                    }
                }
                StartupEvent::Rejected { private_data, .. } => {
                    self.fail_connect(Error::Rejected { private_data });
                }
                StartupEvent::Failed { error } => {
                    self.fail_connect(Error::Startup(error));
                }
            }
        }
    }

    /// The startup ended without a data path: report, free the QP, close.
    fn fail_connect(&mut self, e: Error) {
        if let Some(qp) = &self.qp {
            qp.transition(QpState::Connecting, QpState::Init);
        }
        if let Some(r) = self.reply.take() {
            let _ = r.send(Err(e));
        }
        self.listener = None;
        self.dead = true;
    }

    fn disconnect(&mut self, ctx: &CtxShared, bufs: &mut Bufs) {
        match &mut self.dp {
            Some(dp) => {
                dp.engine.close();
                self.discard_rx = true;
                if self.write_side == WriteSide::Open {
                    self.write_side = WriteSide::CloseWhenFlushed;
                }
                self.pump(ctx, bufs);
            }
            None => self.fail_connect(Error::InvalidState(QpState::Closed)),
        }
    }

    /// Moves queued work requests into the engine, transmits, hands out completions.
    fn pump(&mut self, ctx: &CtxShared, bufs: &mut Bufs) {
        if self.dead {
            return;
        }
        loop {
            self.feed(ctx);
            self.transmit(ctx, bufs);
            self.harvest(ctx, bufs);
            let again =
                self.local_waiting && self.dp.as_ref().is_some_and(|dp| dp.engine.sq_len() == 0);
            if !again || self.dead {
                break;
            }
        }
        self.check_close();
    }

    /// Submission queues → engine.
    fn feed(&mut self, ctx: &CtxShared) {
        let (Some(qp), Some(dp)) = (self.qp.clone(), self.dp.as_mut()) else {
            return;
        };
        let mut sends = Vec::new();
        let mut invalidate = None;
        let recvs = {
            let mut sub = qp.sub.lock();
            self.local_waiting = false;
            while let Some(item) = sub.sq.front() {
                match item {
                    SqItem::Send { .. } => {
                        if let Some(SqItem::Send { wr, inline }) = sub.sq.pop_front() {
                            sends.push((wr, inline));
                        }
                    }
                    SqItem::Invalidate { .. } => {
                        // Every earlier request retired and its completion handed to
                        // the CQ (`sq_in_engine` drops to 0 only in `harvest`).
                        if sends.is_empty() && self.sq_in_engine == 0 && dp.engine.sq_len() == 0 {
                            invalidate = sub.sq.pop_front();
                        } else {
                            self.local_waiting = true;
                        }
                        break;
                    }
                }
            }
            std::mem::take(&mut sub.rq)
        };
        // Posting happens without the submission lock: an INLINE copy or a key check must
        // never wait while a poster waits for that lock.
        for wr in recvs {
            let wr_id = wr.wr_id;
            match dp.engine.post_recv(wr) {
                Ok(()) => self.rq_in_engine += 1,
                Err(e) => {
                    qp.rq_retired.fetch_add(1, Ordering::AcqRel);
                    let mut v = vec![error_wc(wr_id, post_error_status(&e), WcOpcode::Recv)];
                    qp.recv_cq.push(&mut v);
                }
            }
        }
        for (wr, inline) in sends {
            let wr_id = wr.wr_id;
            let opcode = wc_opcode(&wr.opcode);
            match post_send(ctx, &qp, &mut dp.engine, wr, inline) {
                Ok(()) => self.sq_in_engine += 1,
                Err(e) => {
                    qp.sq_retired.fetch_add(1, Ordering::AcqRel);
                    let mut v = vec![error_wc(wr_id, post_error_status(&e), opcode)];
                    qp.send_cq.push(&mut v);
                }
            }
        }
        if let Some(SqItem::Invalidate { key, reply }) = invalidate {
            let _ = reply.send(ctx.keys.invalidate_local(key, qp.pd));
            // Others may wait behind it.
            self.local_waiting =
                matches!(qp.sub.lock().sq.front(), Some(SqItem::Invalidate { .. }));
            if !qp.sub.lock().sq.is_empty() {
                ctx.schedule(&qp);
            }
        }
    }

    fn transmit(&mut self, ctx: &CtxShared, bufs: &mut Bufs) {
        loop {
            self.fill_tx(bufs);
            if self.tx_off == self.tx.len() || !self.flush_tx(ctx) {
                return;
            }
        }
    }

    /// Startup frames, the RTR, then FPDUs until [`TX_HIGH`] octets wait.
    fn fill_tx(&mut self, bufs: &mut Bufs) {
        if self.tx_off == self.tx.len() {
            self.tx.clear();
            self.tx_off = 0;
        } else if self.tx_off > 0 && self.tx.len() - self.tx_off < TX_LOW {
            self.tx.drain(..self.tx_off);
            self.tx_off = 0;
        }
        while let Some(frame) = self.startup.poll_transmit() {
            self.tx.extend_from_slice(&frame);
        }
        if !self.can_tx || self.write_side == WriteSide::Closed {
            return;
        }
        let Some(dp) = self.dp.as_mut() else { return };
        if self.rtr_tx {
            self.rtr_tx = false;
            let _ = dp.framer.frame(&[&rtr_write()], &mut self.tx);
        }
        while self.tx.len() - self.tx_off < TX_HIGH {
            bufs.ulpdu.clear();
            if dp.engine.poll_ulpdu(&mut bufs.ulpdu).is_none() {
                break;
            }
            if dp.framer.frame(&[&bufs.ulpdu], &mut self.tx).is_err() {
                // The engine segments to the framer's MULPDU; a mismatch is a local bug.
                dp.engine.handle_llp_error(LlpError::LocalCatastrophic);
            }
        }
    }

    /// Writes the transmit buffer; `true` when it is empty afterwards.
    fn flush_tx(&mut self, _ctx: &CtxShared) -> bool {
        while self.tx_off < self.tx.len() {
            match self.stream.write(&self.tx[self.tx_off..]) {
                Ok(0) => {
                    self.lost();
                    return false;
                }
                Ok(n) => self.tx_off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.lost();
                    return false;
                }
            }
        }
        true
    }

    /// The connection failed under us (write error).
    fn lost(&mut self) {
        self.tx.clear();
        self.tx_off = 0;
        self.write_side = WriteSide::Closed;
        self.on_eof();
        self.dead = true;
    }

    /// Engine → CQs, events, state, counters.
    fn harvest(&mut self, ctx: &CtxShared, bufs: &mut Bufs) {
        let (Some(qp), Some(dp)) = (self.qp.as_ref(), self.dp.as_mut()) else {
            return;
        };
        let same_cq = Arc::ptr_eq(&qp.send_cq, &qp.recv_cq);
        while let Some(wc) = dp.engine.poll_completion() {
            if wc.opcode == WcOpcode::Recv && !same_cq {
                bufs.recv_wcs.push(wc);
            } else {
                bufs.send_wcs.push(wc);
            }
        }
        // Retired before the completions are visible, so a poller that saw a completion
        // may post again at once.
        let sq_now = dp.engine.sq_len();
        if sq_now != self.sq_in_engine {
            let retired = self.sq_in_engine.saturating_sub(sq_now);
            qp.sq_retired.fetch_add(retired as u64, Ordering::AcqRel);
            self.sq_in_engine = sq_now;
        }
        let rq_now = dp.engine.rq_len();
        if rq_now != self.rq_in_engine {
            let retired = self.rq_in_engine.saturating_sub(rq_now);
            qp.rq_retired.fetch_add(retired as u64, Ordering::AcqRel);
            self.rq_in_engine = rq_now;
        }
        // State before completions and events: whoever sees those sees the state too.
        let state = match dp.engine.state() {
            EngineState::Rts => QpState::Rts,
            EngineState::Terminating => QpState::Terminate,
            EngineState::Error => QpState::Error,
            EngineState::Closed => QpState::Closed,
        };
        if qp.state() != state {
            qp.set_state(state);
        }
        qp.send_cq.push(&mut bufs.send_wcs);
        qp.recv_cq.push(&mut bufs.recv_wcs);
        while let Some(ev) = dp.engine.poll_event() {
            *qp.last_event.lock() = Some(ev);
            ctx.post_event(AsyncEvent::Qp {
                qp_num: qp.qpn,
                event: ev,
            });
        }
        let counters = dp.engine.counters();
        let mut c = qp.counters.lock();
        if *c != counters {
            *c = counters;
        }
    }

    /// Shuts the write side once a dead stream's last octets are out; a connection whose
    /// both sides are closed is dead.
    fn check_close(&mut self) {
        let engine_done = self.dp.as_ref().is_some_and(|dp| {
            matches!(dp.engine.state(), EngineState::Error | EngineState::Closed)
        });
        if engine_done && self.write_side == WriteSide::Open {
            // RDMAP-94: after a Terminate the LLP stream is closed.
            self.write_side = WriteSide::CloseWhenFlushed;
            self.discard_rx = true;
        }
        if self.write_side == WriteSide::CloseWhenFlushed && self.tx_off == self.tx.len() {
            let _ = self.stream.shutdown(Shutdown::Write);
            self.write_side = WriteSide::Closed;
        }
        if self.write_side == WriteSide::Closed && self.eof {
            self.dead = true;
        }
    }
}

/// Hands one send request to the engine; an `INLINE` request's octets (copied at post time)
/// go through a short-lived private region the engine copies from at once.
fn post_send(
    ctx: &CtxShared,
    qp: &QpShared,
    engine: &mut RdmapEngine,
    mut wr: SendWr,
    inline: Option<Vec<u8>>,
) -> Result<(), PostError> {
    let Some(bytes) = inline else {
        return engine.post_send(wr);
    };
    if bytes.is_empty() {
        wr.sg_list.clear();
        return engine.post_send(wr);
    }
    let len = bytes.len();
    let buf = Buffer::from_vec(bytes);
    let key = ctx
        .keys
        .reg_mr(qp.pd, buf, 0, len, 0, Access::empty())
        .map_err(|_| PostError::Inline { max: 0 })?;
    wr.sg_list = vec![softrdma_iwarp::verbs_types::Sge::new(key, 0, len as u32)];
    let r = engine.post_send(wr);
    let _ = ctx.keys.dereg_mr(key);
    r
}
