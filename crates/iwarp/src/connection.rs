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
//! conn.engine_mut().post_send(..) / post_recv(..) / poll_completion()
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

use softrdma_memory::{KeyTable, TxBuf, TxSink};
use softrdma_wire::ddp;
use softrdma_wire::mpa::{self, LlpError};
use softrdma_wire::rdmap::{Body, Control, Opcode, Segment};

use crate::framing::{Deframer, Framer, FramingError};
use crate::rdmap::{QpConfig, QpEvent, RdmapEngine, StreamState};
use crate::startup::{
    Negotiated, PeerParams, Role, Rtr, Startup, StartupConfig, StartupError, StartupEvent,
    StartupState,
};

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
}

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
    /// Responder in P2P mode: the next ULPDU is the Initiator's RTR.
    rtr_expected: Option<Rtr>,
    failed: bool,
    scratch: Vec<u8>,
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
            rtr_expected: None,
            failed: false,
            scratch: Vec::new(),
        };
        c.pump_startup();
        Ok(c)
    }

    /// The queue pair's data path: post work requests, poll completions.
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
    /// after a failure, or when work requests already sit in the engine.
    pub fn set_data_path(
        &mut self,
        qp: QpConfig,
        fpdu: FpduSizing,
        srq: bool,
        early_fpdus: bool,
    ) -> Result<(), StartupError> {
        if self.framer.is_some()
            || self.failed
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
        while fits(out, framer.encoded_len(largest)) {
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
            || (self.may_transmit_fpdus() && (self.rtr_due || self.engine.wants_transmit()))
    }

    /// FPDUs may go out: Initiator once accepted (MPA-72); Responder once the
    /// Initiator's first FPDU arrived (MPA-73), or at once with early FPDUs.
    fn may_transmit_fpdus(&self) -> bool {
        self.framer.is_some() && (self.startup.may_transmit_fpdus() || self.early_tx)
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.deframer.is_none() {
            self.startup.poll_timeout()
        } else {
            None
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.deframer.is_none() {
            self.startup.handle_timeout(now);
            self.pump_startup();
        }
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
        match (n.initiator, n.rtr) {
            (true, Some(Rtr::ZeroLengthWrite)) => self.rtr_due = true,
            // Read/Send RTRs are ordinary RDMAP messages; our Initiator never
            // offers them (the data path would complete them), see StartupConfig.
            (false, Some(r)) => self.rtr_expected = Some(r),
            _ => {}
        }
        self.events.push_back(ConnEvent::Established {
            negotiated: n,
            mulpdu,
        });
    }

    /// Hands the ULPDUs of `bytes` (and of what was buffered) to the engine: whole FPDUs
    /// are read where they arrived (no copy before placement); what follows a partial one,
    /// or a pause for a shared receive, is buffered.
    fn deliver_input(&mut self, bytes: &[u8]) {
        let Connection {
            deframer,
            startup,
            rtr_expected,
            cfg,
            engine,
            held,
            ..
        } = self;
        if let Some(d) = deframer.as_mut() {
            let mut go = true;
            let mut rest = bytes;
            while go {
                // FPDUs read where they arrived while nothing is buffered ...
                while go && d.buffered() == 0 && !rest.is_empty() {
                    match d.next_in(&mut rest) {
                        Some(next) => {
                            go = hand_over(startup, rtr_expected, cfg.srq, engine, held, next)
                        }
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
                        Some(next) => {
                            go = hand_over(startup, rtr_expected, cfg.srq, engine, held, next)
                        }
                        None => break,
                    }
                }
            }
            d.push(rest);
            while go {
                match d.next_ulpdu() {
                    Some(next) => {
                        go = hand_over(startup, rtr_expected, cfg.srq, engine, held, next)
                    }
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
    rtr_expected: &mut Option<Rtr>,
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
            if let Some(rtr) = rtr_expected.take()
                && rtr == Rtr::ZeroLengthWrite
                && is_zero_length_write(ulpdu)
            {
                return true; // the RTR carries nothing for the QP
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
            // RFC 5044 §8: report to DDP; nothing more is delivered (MPA-90).
            engine.handle_llp_error(e);
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

fn is_zero_length_write(ulpdu: &[u8]) -> bool {
    matches!(
        Segment::parse(ulpdu),
        Ok(Segment {
            body: Body::RdmaWrite { payload: [] },
            ddp: ddp::Repr::Tagged { last: true, .. },
            ..
        })
    )
}

#[cfg(test)]
mod tests;
