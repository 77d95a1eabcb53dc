//! One iWARP connection, sans-IO: MPA startup, then FPDU framing around the
//! DDP/RDMAP engine of its queue pair.
//!
//! A driver moves bytes and time and nothing else:
//!
//! ```text
//! conn.handle_input(now, bytes_read_from_tcp);
//! while conn.needs_recv() { /* SRQ: post one buffer */ conn.handle_input(now, &[]); }
//! conn.poll_transmit_bounded(&mut out, room); // whole frames to write to TCP
//! conn.poll_timeout() / conn.handle_timeout(now);
//! conn.poll_event();                         // startup decisions, establishment, errors
//! conn.next_read() / conn.rx_placed(..)      // where each read goes (payload straight into memory)
//! conn.post_send(..) / post_recv(..) / poll_completion() / queued() / counters()
//! ```
//!
//! This is the one place that glues MPA startup, framing and the engine: the
//! startup-to-framing handoff, the P2P RTR (sent by our Initiator, swallowed by
//! our Responder), the Responder's first-FPDU rule (MPA-73) and the negotiated
//! MULPDU, IRD, ORD and RDMAP version put into the engine.
//!
//! Work requests may be posted before the connection is established: they sit
//! in the engine, so receives posted then are in place before any FPDU is
//! delivered (even one that arrives in the same read as the MPA Reply). Sends
//! wait until Full Operation (and, at a Responder, until the first FPDU from
//! the Initiator has arrived, RFC 5044 §7.1.2 r4 / MPA-73, unless
//! [`ConnectionConfig::early_fpdus`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use softrdma_memory::{AccessError, KeyTable, Target, TxBuf, TxSink};
use softrdma_wire::ddp;
use softrdma_wire::mpa::{self, LlpError};
use softrdma_wire::rdmap::{Body, Control, Opcode, Segment};

use crate::framing::{Deframer, Framer, FramingError};
use crate::rdmap::{Placement, QpConfig, QpEvent, RdmapEngine, StreamCounters, StreamState};
use crate::startup::{
    Negotiated, PeerParams, Role, Rtr, Startup, StartupConfig, StartupError, StartupEvent,
    StartupState,
};
use softrdma_verbs_types::{CheckedRecv, CheckedSend, PostError, WorkCompletion};

/// How large our FPDUs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FpduSizing {
    /// One FPDU fits one TCP segment of the path (RFC 5044 §5.1; what hardware peers need).
    PathMss,
    /// A fixed MULPDU (soft peers only; clamped to [128, 64768]).
    Fixed(u16),
}

/// Everything one connection needs to start.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    pub role: Role,
    pub startup: StartupConfig,
    /// The queue pair: PD, QP id, queue depths. MULPDU, IRD and ORD are set
    /// from the negotiation when the connection is established.
    pub qp: QpConfig,
    /// The TCP connection's effective MSS (`TCP_MAXSEG`).
    pub emss: u32,
    pub fpdu: FpduSizing,
    /// Responder, client-server mode: send FPDUs right after the Reply instead
    /// of waiting for the Initiator's first FPDU, as Linux siw does. Breaks
    /// RFC 5044 §7.1.2 r4 (MPA-73), which hardware Initiators may rely on; off
    /// by default. Ignored at an Initiator and in P2P mode (the RTR comes first).
    pub early_fpdus: bool,
    /// Receive buffers come from a shared receive queue: delivery pauses before
    /// the first segment of a Send that finds no receive posted, so the driver
    /// can post one ([`Connection::needs_recv`]).
    pub srq: bool,
    /// Direct placement ([`Connection::rx_window`]) for a segment with at least this many
    /// payload octets still to arrive; `usize::MAX`: never.
    pub rx_direct_min: usize,
    /// Initiator: how long to wait after our first FPDU for an octet from the Responder
    /// before the nudge ([`NUDGE_AFTER`] by default; `None`: never nudge).
    pub nudge_after: Option<std::time::Duration>,
}

/// [`ConnectionConfig::rx_direct_min`] by default: below it a read into a buffer and a copy
/// cost less than the system call a window needs per FPDU.
pub const DEFAULT_RX_DIRECT_MIN: usize = 16 * 1024;

/// Octets a driver reads after a window's last piece: the PAD and CRC, then the next FPDU's
/// length and headers (at most 2 + 28 for any data segment), so that its payload can go
/// straight into memory too.
const WINDOW_TAIL: usize = 3 + mpa::CRC_LEN + 2 + 28;

impl ConnectionConfig {
    /// MSS-sized FPDUs, no early FPDUs, no SRQ.
    pub fn new(role: Role, startup: StartupConfig, qp: QpConfig, emss: u32) -> ConnectionConfig {
        ConnectionConfig {
            role,
            startup,
            qp,
            emss,
            fpdu: FpduSizing::PathMss,
            early_fpdus: false,
            srq: false,
            rx_direct_min: DEFAULT_RX_DIRECT_MIN,
            nudge_after: Some(NUDGE_AFTER),
        }
    }
}

/// Memory the next octets of the TCP stream belong in ([`NextRead::Direct`]): `len` octets
/// of `target` at `at`.
#[derive(Debug, Clone)]
pub struct RxWindow {
    pub target: Target,
    pub at: usize,
    pub len: usize,
    /// Octets worth reading into the ordinary buffer in the same call, after these.
    pub tail: usize,
}

/// Where a driver's next read from the stream goes ([`Connection::next_read`]).
#[derive(Debug)]
pub enum NextRead {
    /// Straight into registered memory (RFC 5041 §5): `len` octets at `at` in `target`,
    /// then up to `tail` more into the driver's buffer in the same call.
    Direct(RxWindow),
    /// Into the driver's buffer, at most this many octets (`usize::MAX`: no limit).
    Buffered(usize),
}

/// The FPDU whose payload is placed straight into memory: where it goes and how far it got.
#[derive(Debug)]
struct Direct {
    placement: Placement,
    /// The piece being filled and the octets of it filled.
    piece: usize,
    filled: usize,
    /// Every octet so far went where it belongs.
    ok: bool,
}

impl Direct {
    /// Copies `octets`, the next of the payload, to where they belong (the path for octets
    /// that came through a buffer after all); a refusal spoils the rest.
    fn copy_in(&mut self, mut octets: &[u8]) {
        while !octets.is_empty() && self.ok {
            let Some((t, at, len)) = self.placement.pieces().get(self.piece) else {
                self.ok = false;
                break;
            };
            let n = (len - self.filled).min(octets.len());
            self.ok = t.place(at + self.filled, &octets[..n]).is_ok();
            self.advance(n);
            octets = &octets[n..];
        }
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(&(_, _, len)) = self.placement.pieces().get(self.piece) else {
                return;
            };
            let k = (len - self.filled).min(n);
            self.filled += k;
            n -= k;
            if self.filled == len {
                self.piece += 1;
                self.filled = 0;
            }
        }
    }
}

/// What the ULP (or the driver) hears about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Responder: a valid MPA Request; answer with [`Connection::accept`] or [`Connection::reject`].
    ConnectRequest {
        private_data: Vec<u8>,
        params: PeerParams,
    },
    /// Full Operation: data may move (`mulpdu` is what we send).
    Established { negotiated: Negotiated, mulpdu: u16 },
    /// Initiator: the Responder said R=1 (MPA-71). The TCP connection is the ULP's.
    Rejected {
        private_data: Vec<u8>,
        params: PeerParams,
    },
    /// Startup failed; close the TCP connection (MPA-88).
    StartupFailed(StartupError),
    /// An error of the data path (Terminate sent or received, LLP error).
    Qp(QpEvent),
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    Startup,
    Established,
    /// Rejected, or startup failed: no FPDU will ever flow.
    Failed,
    /// The data path stopped (error or close); the driver should close TCP.
    Dead,
}

/// One iWARP connection (one TCP connection, one queue pair).
pub struct Connection {
    startup: Startup,
    engine: RdmapEngine,
    keys: Arc<KeyTable>,
    framer: Option<Framer>,
    deframer: Option<Deframer>,
    cfg: ConnectionConfig,
    /// Responder with [`ConnectionConfig::early_fpdus`]: FPDUs may go out
    /// before the Initiator's first one.
    early_tx: bool,
    /// SRQ: a ULPDU that starts a Send and found no receive posted; delivered
    /// by the next [`Connection::handle_input`].
    held: Option<Vec<u8>>,
    events: VecDeque<ConnEvent>,
    /// Startup frames waiting to go out.
    tx_startup: VecDeque<Vec<u8>>,
    /// The Initiator still owes its zero-length Write RTR (RFC 6581 P2P).
    rtr_due: bool,
    failed: bool,
    scratch: Vec<u8>,
    /// Direct placement in progress.
    direct: Option<Direct>,
    /// Initiator: the silent-peer nudge ([`NUDGE_AFTER`]).
    nudge: Nudge,
}

/// How long an Initiator waits, after its first FPDU, for any octet from the Responder
/// before it sends the engine's zero-length message ([`RdmapEngine::nudge`]). Linux siw (6.12,
/// `siw_accept`) sends its MPA Reply before it hands the socket's receive upcall to the
/// QP, and FPDUs that arrive in between stay unread until more octets come: a ULP that
/// waits for the answer to its first message (rping, perftest's handshake, an RPC call)
/// would wait forever. The nudge's octets wake the reader; every peer takes it (RDMAP-40),
/// so a healthy one that is merely slow costs one zero-length message per connection.
pub const NUDGE_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// The Initiator's watch for a silent Responder.
#[derive(Debug, Default)]
struct Nudge {
    /// An octet came from the peer after the MPA Reply.
    heard: bool,
    /// When Full Operation began (the Reply arrived).
    established: Option<Instant>,
    /// When our first FPDU was seen to be out ([`Connection::handle_timeout`]).
    first_fpdu: Option<Instant>,
    /// The nudge was sent (or could not be): there is only one.
    done: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("role", &self.cfg.role)
            .field("startup", &self.startup.state())
            .field("qp", &self.engine.state())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// A new connection in its startup phase. The Initiator's Request is
    /// queued at once.
    pub fn new(
        cfg: ConnectionConfig,
        keys: Arc<KeyTable>,
        now: Instant,
    ) -> Result<Connection, StartupError> {
        let startup = match cfg.role {
            Role::Initiator => Startup::initiator(cfg.startup.clone(), now)?,
            Role::Responder => Startup::responder(cfg.startup.clone(), now)?,
        };
        let mut c = Connection {
            startup,
            engine: RdmapEngine::new(cfg.qp, keys.clone()),
            keys,
            framer: None,
            deframer: None,
            cfg,
            early_tx: false,
            held: None,
            events: VecDeque::new(),
            tx_startup: VecDeque::new(),
            rtr_due: false,
            failed: false,
            scratch: Vec::new(),
            direct: None,
            nudge: Nudge::default(),
        };
        c.pump_startup();
        Ok(c)
    }

    /// A checked send request for the QP (the engine's queue, RDMAP's ordering).
    pub fn post_send(&mut self, wr: CheckedSend) -> Result<(), PostError> {
        self.engine.post_checked(wr)
    }

    /// A checked receive request for the QP.
    pub fn post_recv(&mut self, wr: CheckedRecv) -> Result<(), PostError> {
        self.engine.post_checked_recv(wr)
    }

    /// The QP's next completion.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.engine.poll_completion()
    }

    /// Send and receive requests the QP holds, not yet retired.
    pub fn queued(&self) -> (usize, usize) {
        (self.engine.sq_len(), self.engine.rq_len())
    }

    /// The RDMAP stream's state (RDMAP-94's, not the MPA connection's [`state`](Self::state)).
    pub fn stream_state(&self) -> StreamState {
        self.engine.state()
    }

    /// Ends the stream with a Local Catastrophic Terminate: the verbs' CQ overrun
    /// (IBA 11.4.2.1).
    pub fn local_catastrophic(&mut self) {
        self.engine.local_catastrophic();
    }

    /// The RDMAP stream's counters.
    pub fn counters(&self) -> StreamCounters {
        self.engine.counters()
    }

    /// Whether the QP has nothing to frame, report or complete: established, in RTS, no
    /// output and no event pending.
    pub fn is_quiet(&self) -> bool {
        self.state() == ConnState::Established
            && !self.wants_transmit()
            && !self.has_event()
            && self.engine.state() == StreamState::Rts
            && !self.engine.has_output()
    }

    /// The engine itself (tests and tools that drive RDMAP directly).
    pub fn engine_mut(&mut self) -> &mut RdmapEngine {
        &mut self.engine
    }

    pub fn engine(&self) -> &RdmapEngine {
        &self.engine
    }

    /// The configuration (as last set by [`set_data_path`](Self::set_data_path)).
    pub fn config(&self) -> &ConnectionConfig {
        &self.cfg
    }

    /// Before establishment, typically at a Responder between
    /// [`ConnEvent::ConnectRequest`] and [`accept`](Self::accept): the queue
    /// pair the ULP chose for this connection (`rdma_accept` names it only
    /// then) and how its data path runs. The engine is rebuilt from `qp`, so
    /// this is refused (`InvalidState`, nothing changed) once established,
    /// after a failure or a [`close`](Self::close), or when work requests
    /// already sit in the engine.
    pub fn set_data_path(
        &mut self,
        qp: QpConfig,
        fpdu: FpduSizing,
        srq: bool,
        early_fpdus: bool,
    ) -> Result<(), StartupError> {
        if self.framer.is_some()
            || self.failed
            // RFC 5040 §6.2 (RDMAP-94): a closed stream sends nothing more; a new
            // engine would.
            || self.engine.state() != StreamState::Rts
            || self.engine.sq_len() != 0
            || self.engine.rq_len() != 0
        {
            let state = if self.failed {
                StartupState::Failed
            } else {
                self.startup.state()
            };
            return Err(StartupError::InvalidState(state));
        }
        self.engine = RdmapEngine::new(qp, self.keys.clone());
        self.cfg.qp = qp;
        self.cfg.fpdu = fpdu;
        self.cfg.srq = srq;
        self.cfg.early_fpdus = early_fpdus;
        Ok(())
    }

    pub fn state(&self) -> ConnState {
        if self.failed {
            return ConnState::Failed;
        }
        if self.framer.is_none() {
            return ConnState::Startup;
        }
        match self.engine.state() {
            StreamState::Rts | StreamState::Terminating => ConnState::Established,
            StreamState::Error | StreamState::Closed => ConnState::Dead,
        }
    }

    /// What MPA negotiated, once established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.startup.outcome()
    }

    /// Octets read from the TCP connection, in order. With
    /// [`ConnectionConfig::srq`], delivery may pause ([`needs_recv`](Self::needs_recv));
    /// the next call (with new octets or none) goes on.
    pub fn handle_input(&mut self, now: Instant, mut bytes: &[u8]) {
        if self.failed {
            return;
        }
        if let Some(ulpdu) = self.held.take() {
            self.engine.handle_ulpdu(&ulpdu);
        }
        if self.deframer.is_none() {
            match self.startup.handle_input(now, bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(_) => {
                    self.pump_startup();
                    return;
                }
            }
            self.pump_startup();
            if self.deframer.is_some() {
                self.nudge.established = Some(now);
            }
            if self.deframer.is_none() {
                if !bytes.is_empty() && !self.failed {
                    match self.startup.state() {
                        // Octets behind a Reject belong to the ULP.
                        StartupState::Rejected => {}
                        // Octets before our Reply (§7.6): the startup fails itself,
                        // so a late accept is refused.
                        StartupState::AwaitingDecision => {
                            let _ = self.startup.handle_input(now, bytes);
                            self.pump_startup();
                        }
                        // Anything else before Full Operation is a protocol violation.
                        _ => self.fail(StartupError::ExtraOctets {
                            octets: bytes.len(),
                        }),
                    }
                }
                return;
            }
        }
        self.deliver_input(bytes);
    }

    /// SRQ ([`ConnectionConfig::srq`]): delivery stopped before the first
    /// segment of a Send because no receive is posted. Post one from the
    /// shared queue if there is one (`engine_mut().post_recv`), then call
    /// [`handle_input`](Self::handle_input) (with new octets or none): it
    /// delivers that segment whether or not a receive was posted (none: the
    /// engine terminates the stream, RFC 5041 §7.2) and goes on.
    pub fn needs_recv(&self) -> bool {
        self.held.is_some()
    }

    /// Where the driver's next read from the stream goes: straight into registered memory
    /// ([`NextRead::Direct`], then [`rx_placed`](Self::rx_placed)) or into its buffer, at
    /// most so many octets ([`NextRead::Buffered`], then [`handle_input`](Self::handle_input)).
    /// One call per read: whatever the read returns after the window goes to `handle_input`.
    pub fn next_read(&mut self) -> NextRead {
        match self.rx_window() {
            Some(w) => NextRead::Direct(w),
            None => NextRead::Buffered(self.rx_read_limit()),
        }
    }

    /// What came of a read into the window of the last [`NextRead::Direct`]: `Ok` with the
    /// octets read straight into its memory, from its start (at most its `len`); `Err` when
    /// the memory refused the write (its key was revoked): the rest of that payload is then
    /// read and dropped, and the segment fails as a placement into a revoked key does.
    pub fn rx_placed(&mut self, placed: Result<&[u8], AccessError>) {
        let Ok(octets) = placed else {
            if let Some(direct) = self.direct.as_mut() {
                direct.ok = false;
            }
            return;
        };
        self.nudge.heard |= !octets.is_empty();
        if let (Some(d), Some(direct)) = (self.deframer.as_mut(), self.direct.as_mut()) {
            d.bypassed(octets);
            direct.advance(octets.len());
        }
    }

    /// Direct placement (RFC 5041 §5, placement straight from the LLP): when the next octets
    /// of the TCP stream are payload of an RDMA Write, Read Response or Send segment whose
    /// headers are in and pass every check, with at least
    /// [`rx_direct_min`](ConnectionConfig::rx_direct_min) octets still to come, the memory
    /// they belong in. A driver may read straight into it (`target.write_with(at, len, ..)`,
    /// with up to `tail` more octets into its own buffer in the same call), report those
    /// octets with [`rx_placed`](Self::rx_placed) and hand what followed them to
    /// [`handle_input`](Self::handle_input) as always; or ignore the window and hand
    /// everything to `handle_input`, which then places by copying ([`NextRead::Direct`]). Payload octets are in
    /// memory before their FPDU's CRC is checked, as on hardware; the segment is only
    /// delivered (and checked again) once the CRC is good (MPA-34, MPA-48), and until then
    /// the memory is indeterminate (RDMAP-75).
    fn rx_window(&mut self) -> Option<RxWindow> {
        if self.direct.is_none() {
            self.start_direct();
        }
        let direct = self.direct.as_ref().filter(|d| d.ok)?;
        let left = self.deframer.as_ref()?.bypass_left()?;
        let (target, at, len) = direct.placement.pieces().get(direct.piece)?;
        let n = (len - direct.filled).min(left);
        if n == 0 {
            return None;
        }
        Some(RxWindow {
            target: target.clone(),
            at: at + direct.filled,
            len: n,
            tail: if n == left { WINDOW_TAIL } else { 0 },
        })
    }

    /// At most how many octets the next read into a buffer should take (when there is no
    /// [`rx_window`](Self::rx_window)). While large FPDUs arrive (at least
    /// [`rx_direct_min`](ConnectionConfig::rx_direct_min) octets: the one at the head of the
    /// buffer, or one of the last the deframer delivered), the rest of the head FPDU and the next one's
    /// headers, so that the next payload gets a window instead of being swallowed by a
    /// large read; otherwise no limit.
    fn rx_read_limit(&self) -> usize {
        let Some(d) = self.deframer.as_ref() else {
            return usize::MAX;
        };
        if self.direct.is_some() || d.markers() || d.error().is_some() {
            return usize::MAX;
        }
        let large = d.recent_fpdu_len() >= self.cfg.rx_direct_min;
        match d.head() {
            Some((n, ulpdu)) if large || n >= self.cfg.rx_direct_min => {
                n - ulpdu.len() + WINDOW_TAIL
            }
            None if large && d.buffered() == 0 => WINDOW_TAIL,
            _ => usize::MAX,
        }
    }

    /// Starts direct placement of the partial FPDU at the head of the receive buffer, if it
    /// qualifies: its octets buffered behind the headers are placed now.
    fn start_direct(&mut self) {
        if self.failed
            || self.held.is_some()
            || self.startup.state() == StartupState::AwaitingFirstFpdu
        {
            return;
        }
        let Some(d) = self.deframer.as_mut() else {
            return;
        };
        let Some((ulpdu_len, ulpdu)) = d.head() else {
            return;
        };
        let Ok(hdr) = ddp::Repr::parse(ulpdu) else {
            return;
        };
        let keep = hdr.header_len();
        if ulpdu.len() < keep || ulpdu_len - ulpdu.len() < self.cfg.rx_direct_min {
            return;
        }
        let Some(placement) = self.engine.placement(&ulpdu[..keep], ulpdu_len) else {
            return;
        };

        let mut direct = Direct {
            placement,
            piece: 0,
            filled: 0,
            ok: true,
        };
        direct.copy_in(&ulpdu[keep..]);
        if direct.ok && d.bypass(keep) {
            self.direct = Some(direct);
        }
    }

    /// The TCP connection delivered FIN or failed.
    pub fn handle_eof(&mut self) {
        if self.deframer.is_none() {
            self.startup.handle_eof();
            self.pump_startup();
        } else {
            // What arrived before the FIN still counts.
            if let Some(ulpdu) = self.held.take() {
                self.engine.handle_ulpdu(&ulpdu);
            }
            // RFC 5044 §8 code 1: the LLP is gone. After a Terminate or a
            // close the peer's FIN is the expected end (RDMAP-94), not an error.
            if matches!(
                self.engine.state(),
                StreamState::Rts | StreamState::Terminating
            ) {
                self.engine.handle_llp_error(LlpError::TcpConnectionLost);
            }
            self.pump_engine_events();
        }
    }

    /// Append everything ready to send to `out`; returns the octets added.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> usize {
        self.poll_transmit_bounded(out, usize::MAX)
    }

    /// Append whole frames (startup frames, FPDUs) to `out` while the octets
    /// added stay within `max_bytes`; returns the octets added. A frame is
    /// never split and nothing is taken from the engine that does not fit
    /// (the next FPDU is assumed as large as MULPDU allows). When even the
    /// first frame is larger than `max_bytes` that one frame goes out alone,
    /// so every call with work ready makes progress.
    pub fn poll_transmit_bounded(&mut self, out: &mut Vec<u8>, max_bytes: usize) -> usize {
        let n = self.fill(out, max_bytes);
        // Copied: the sources are free at once.
        self.release_all();
        n
    }

    /// [`poll_transmit_bounded`](Self::poll_transmit_bounded) into a [`TxBuf`], which
    /// keeps large payloads as references to registered memory and writes them from there.
    /// The requests they belong to complete once [`transmitted`](Self::transmitted) hears
    /// that their last octet was written (RDMAP-80).
    pub fn poll_transmit_into(&mut self, out: &mut TxBuf, max_bytes: usize) -> usize {
        let n = self.fill(out, max_bytes);
        if out.references() == 0 {
            self.release_all();
        } else {
            out.push_tag(self.engine.ulpdus_emitted());
        }
        n
    }

    /// Octets of `out` were written: requests whose last ULPDU is out complete.
    pub fn transmitted(&mut self, out: &mut TxBuf) {
        if let Some(ord) = out.take_passed() {
            self.engine.release_transmitted(ord);
            self.pump_engine_events();
        }
    }

    /// Nothing more can be written: the write failed, or a reference in the transmit queue
    /// could not be written (its key was revoked after the request was framed, so the
    /// stream would be cut short). Requests not yet written are flushed; an established
    /// stream has lost its LLP.
    pub fn transmit_failed(&mut self) {
        if self.deframer.is_some() {
            if matches!(
                self.engine.state(),
                StreamState::Rts | StreamState::Terminating
            ) {
                self.engine.handle_llp_error(LlpError::TcpConnectionLost);
            } else {
                self.engine.tx_lost();
            }
        }
        self.pump_engine_events();
    }

    fn release_all(&mut self) {
        self.engine
            .release_transmitted(self.engine.ulpdus_emitted());
    }

    fn fill(&mut self, out: &mut dyn TxSink, max_bytes: usize) -> usize {
        let start = out.len();
        let fits = |out: &dyn TxSink, n: usize| {
            out.len() == start || (out.len() - start).saturating_add(n) <= max_bytes
        };
        while let Some(f) = self.tx_startup.front() {
            if !fits(out, f.len()) {
                return out.len() - start;
            }
            out.staged().extend_from_slice(f);
            self.tx_startup.pop_front();
        }
        if !self.may_transmit_fpdus() {
            return out.len() - start;
        }
        if self.rtr_due && !self.rtr_pending() {
            // The stream stopped first (LLP lost, ULP close): nothing goes out
            // (RFC 5044 §8, RDMAP-92, RDMAP-94), the RTR neither.
            self.rtr_due = false;
        }
        let Some(framer) = self.framer.as_mut() else {
            return out.len() - start;
        };
        if self.rtr_due {
            // RFC 6581 P2P: a zero-length RDMA Write (STag 0, TO 0) is the
            // Initiator's first FPDU.
            let rtr = zero_length_write_rtr();
            if !fits(out, framer.encoded_len(rtr.len())) {
                return out.len() - start;
            }
            self.rtr_due = false;
            if framer.frame(&[&rtr], out.staged()).is_err() {
                self.failed = true;
            }
        }
        let largest = usize::from(framer.mulpdu());
        // Most calls find nothing to send (a transmit pass looks again after each write):
        // no FPDU is opened and rewound for them.
        while self.engine.wants_transmit() && fits(out, framer.encoded_len(largest)) {
            let framed = match framer.open(out) {
                // Without Markers the engine writes the ULPDU into its FPDU.
                Some(o) => {
                    if self.engine.poll_ulpdu_into(out).is_none() {
                        out.rewind(o.mark());
                        break;
                    }
                    framer.close(out, o)
                }
                None => {
                    self.scratch.clear();
                    if self.engine.poll_ulpdu_into(&mut self.scratch).is_none() {
                        break;
                    }
                    framer.frame(&[&self.scratch], out.staged())
                }
            };
            if let Err(e) = framed {
                // The engine never exceeds the MULPDU it was given; if it did (or a
                // source was revoked while its CRC was computed), the stream is unusable.
                debug_assert!(
                    matches!(e, FramingError::Source(_)),
                    "engine ULPDU refused by the framer: {e:?}"
                );
                // The request whose ULPDU was dropped did not go out: nothing held
                // completes as sent.
                self.engine.tx_lost();
                self.engine.handle_llp_error(LlpError::LocalCatastrophic);
                break;
            }
        }
        self.pump_engine_events();
        out.len() - start
    }

    /// True when [`poll_transmit`](Self::poll_transmit) would produce octets.
    pub fn wants_transmit(&self) -> bool {
        !self.tx_startup.is_empty()
            || (self.may_transmit_fpdus() && (self.rtr_pending() || self.engine.wants_transmit()))
    }

    /// The RTR is owed and may still go out: the stream is up, or only its
    /// Terminate is left, which the RTR precedes (RFC 6581: the first FPDU).
    fn rtr_pending(&self) -> bool {
        self.rtr_due
            && matches!(
                self.engine.state(),
                StreamState::Rts | StreamState::Terminating
            )
    }

    /// FPDUs may go out: Initiator once accepted (MPA-72); Responder once the
    /// Initiator's first FPDU arrived (MPA-73), or at once with early FPDUs.
    fn may_transmit_fpdus(&self) -> bool {
        self.framer.is_some() && (self.startup.may_transmit_fpdus() || self.early_tx)
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) has work: the startup's
    /// deadline, or the Initiator's nudge. An instant already past means "now": the nudge's
    /// clock starts when our first FPDU is out, and this is how it learns the time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.deframer.is_none() {
            return self.startup.poll_timeout();
        }
        let n = &self.nudge;
        let after = self.cfg.nudge_after?;
        if self.cfg.role != Role::Initiator
            || n.heard
            || n.done
            || self.engine.state() != StreamState::Rts
        {
            return None;
        }
        // Our first FPDU is out: an ordinary one, or the RTR (P2P).
        let rtr_sent = self.negotiated().is_some_and(|n| n.rtr.is_some()) && !self.rtr_due;
        match n.first_fpdu {
            Some(t) => Some(t + after),
            None if self.engine.ulpdus_emitted() > 0 || rtr_sent => n.established,
            None => None,
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.deframer.is_none() {
            self.startup.handle_timeout(now);
            self.pump_startup();
            return;
        }
        let Some(due) = self.poll_timeout() else {
            return;
        };
        match self.nudge.first_fpdu {
            None => self.nudge.first_fpdu = Some(now),
            Some(_) if due <= now => {
                self.nudge.done = true;
                if self.engine.nudge() {
                    tracing::debug!(
                        qp = self.cfg.qp.qp.0,
                        "peer silent after our first FPDUs: nudged with a zero-length message"
                    );
                }
            }
            Some(_) => {}
        }
    }

    /// True when [`poll_event`](Self::poll_event) has an event to give.
    pub fn has_event(&self) -> bool {
        !self.events.is_empty()
    }

    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// Responder: accept the MPA Request with our Private Data, IRD and ORD.
    pub fn accept(&mut self, private_data: &[u8], ird: u16, ord: u16) -> Result<(), StartupError> {
        if self.failed {
            return Err(StartupError::InvalidState(StartupState::Failed));
        }
        self.startup.accept(private_data, ird, ord)?;
        self.pump_startup();
        Ok(())
    }

    /// Responder: reject the MPA Request (R=1) with an explanation in Private Data.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        if self.failed {
            return Err(StartupError::InvalidState(StartupState::Failed));
        }
        self.startup.reject(private_data)?;
        self.pump_startup();
        self.failed = true;
        Ok(())
    }

    /// Graceful close: flush outstanding work (a queued Terminate still goes out).
    pub fn close(&mut self) {
        self.engine.close();
        self.pump_engine_events();
    }

    fn fail(&mut self, e: StartupError) {
        if !self.failed {
            tracing::warn!(role = ?self.cfg.role, error = %e, "MPA startup failed");
            self.failed = true;
            self.events.push_back(ConnEvent::StartupFailed(e));
        }
    }

    /// Move startup frames and events out of the startup machine.
    fn pump_startup(&mut self) {
        while let Some(f) = self.startup.poll_transmit() {
            self.tx_startup.push_back(f);
        }
        while let Some(ev) = self.startup.poll_event() {
            match ev {
                StartupEvent::RequestReceived {
                    private_data,
                    params,
                } => self.events.push_back(ConnEvent::ConnectRequest {
                    private_data,
                    params,
                }),
                StartupEvent::Accepted { outcome } => self.establish(outcome),
                StartupEvent::Rejected {
                    private_data,
                    params,
                } => {
                    self.failed = true;
                    self.events.push_back(ConnEvent::Rejected {
                        private_data,
                        params,
                    });
                }
                StartupEvent::Failed { error } => self.fail(error),
            }
        }
    }

    fn establish(&mut self, n: Negotiated) {
        let mulpdu = match self.cfg.fpdu {
            FpduSizing::PathMss => mpa::mulpdu(self.cfg.emss, n.markers_tx),
            FpduSizing::Fixed(m) => m.clamp(mpa::MULPDU_MIN, mpa::MAX_ULPDU as u16),
        };
        self.engine.set_limits(mulpdu, n.ird, n.ord);
        self.engine.set_rdmap_version(n.rdmap_version());
        self.framer = Some(n.framer(mulpdu));
        self.deframer = Some(n.deframer());
        self.early_tx = !n.initiator && n.rtr.is_none() && self.cfg.early_fpdus;
        // A peer's RTR of any kind is an ordinary RDMAP message to our Responder (a
        // zero-length Write is taken unchecked, RDMAP-40); our Initiator only offers the
        // Write (a Read or Send RTR would complete on the data path), see StartupConfig.
        self.rtr_due = n.initiator && n.rtr == Some(Rtr::ZeroLengthWrite);
        tracing::debug!(
            qp = self.cfg.qp.qp.0,
            rev = n.rev,
            crc = n.crc,
            markers_tx = n.markers_tx,
            markers_rx = n.markers_rx,
            ird = n.ird,
            ord = n.ord,
            mulpdu,
            "MPA negotiated: Full Operation"
        );
        self.events.push_back(ConnEvent::Established {
            negotiated: n,
            mulpdu,
        });
    }

    /// Hands the ULPDUs of `bytes` (and of what was buffered) to the engine: whole FPDUs
    /// are read where they arrived (no copy before placement); what follows a partial one,
    /// or a pause for a shared receive, is buffered.
    fn deliver_input(&mut self, bytes: &[u8]) {
        self.nudge.heard |= !bytes.is_empty();
        let Connection {
            deframer,
            startup,
            cfg,
            engine,
            held,
            direct,
            ..
        } = self;
        if let Some(d) = deframer.as_mut() {
            let mut go = true;
            let mut rest = bytes;
            // The rest of a payload placed straight into memory, then its PAD and CRC.
            if let Some(left) = d.bypass_left() {
                let n = left.min(rest.len());
                if let Some(direct) = direct.as_mut() {
                    direct.copy_in(&rest[..n]);
                }
                d.bypassed(&rest[..n]);
                rest = &rest[n..];
                let n = d.wanted().min(rest.len());
                d.push(&rest[..n]);
                rest = &rest[n..];
                match d.next_bypassed() {
                    None => {}
                    Some(Ok((head, placed))) => {
                        let ok = direct.take().is_some_and(|x| x.ok);
                        engine.handle_placed(head, placed, ok);
                    }
                    Some(Err(e)) => {
                        *direct = None;
                        engine.handle_llp_error(e);
                        go = false;
                    }
                }
            }
            while go {
                // FPDUs read where they arrived while nothing is buffered ...
                while go && d.buffered() == 0 && !rest.is_empty() {
                    match d.next_in(&mut rest) {
                        Some(next) => go = hand_over(startup, cfg.srq, engine, held, next),
                        None => break,
                    }
                }
                // ... and a partial one left from earlier input completed from this input,
                // no more copied than it lacks.
                let n = d.wanted().min(rest.len());
                if !go || n == 0 {
                    break;
                }
                d.push(&rest[..n]);
                rest = &rest[n..];
                while go {
                    match d.next_ulpdu() {
                        Some(next) => go = hand_over(startup, cfg.srq, engine, held, next),
                        None => break,
                    }
                }
            }
            d.push(rest);
            while go {
                match d.next_ulpdu() {
                    Some(next) => go = hand_over(startup, cfg.srq, engine, held, next),
                    None => break,
                }
            }
        }
        self.pump_engine_events();
    }

    fn pump_engine_events(&mut self) {
        while let Some(e) = self.engine.poll_event() {
            self.events.push_back(ConnEvent::Qp(e));
        }
    }
}

/// Hands one deframed ULPDU (or the framing error) to the engine; `false` when delivery
/// stops (an error, or a Send waiting for a shared receive).
fn hand_over(
    startup: &mut Startup,
    srq: bool,
    engine: &mut RdmapEngine,
    held: &mut Option<Vec<u8>>,
    next: Result<&[u8], LlpError>,
) -> bool {
    match next {
        Ok(ulpdu) => {
            if startup.state() == StartupState::AwaitingFirstFpdu {
                // MPA-73: the Responder may transmit from now on.
                startup.fpdu_received();
            }
            if srq && engine.needs_recv(ulpdu) {
                // The driver hands over a shared receive first.
                *held = Some(ulpdu.to_vec());
                return false;
            }
            engine.handle_ulpdu(ulpdu);
            true
        }
        Err(e) => {
            // RFC 5044 §8: report to DDP; nothing more is delivered (MPA-90). Before the
            // first valid FPDU the connection closes without a Terminate.
            if startup.state() == StartupState::AwaitingFirstFpdu {
                engine.handle_llp_error_before_first_fpdu(e);
            } else {
                engine.handle_llp_error(e);
            }
            false
        }
    }
}

/// RFC 6581 §4: the zero-length RDMA Write RTR (tagged, L=1, STag 0, TO 0).
fn zero_length_write_rtr() -> Vec<u8> {
    let seg = Segment {
        ddp: ddp::Repr::Tagged {
            last: true,
            reserved: 0,
            dv: ddp::DDP_VERSION,
            rsvd_ulp: 0,
            stag: 0,
            to: 0,
        },
        control: Control::new(Opcode::RdmaWrite),
        body: Body::RdmaWrite { payload: &[] },
    };
    let mut v = vec![0u8; seg.buffer_len()];
    let n = seg.emit(&mut v).unwrap_or(0);
    v.truncate(n);
    v
}

#[cfg(test)]
mod tests;
