//! One iWARP connection, sans-IO: MPA startup, then FPDU framing around the
//! DDP/RDMAP engine of its queue pair.
//!
//! A driver moves bytes and time and nothing else:
//!
//! ```text
//! conn.handle_input(now, bytes_read_from_tcp);
//! conn.poll_transmit(&mut out);              // bytes to write to TCP
//! conn.poll_timeout() / conn.handle_timeout(now);
//! conn.poll_event();                         // startup decisions, establishment, errors
//! conn.engine_mut().post_send(..) / post_recv(..) / poll_completion()
//! ```
//!
//! Work requests may be posted before the connection is established; they
//! wait until Full Operation (and, at a Responder, until the first FPDU from
//! the Initiator has arrived, RFC 5044 §7.1.2 r4 / MPA-73).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use softrdma_memory::KeyTable;
use softrdma_wire::ddp;
use softrdma_wire::mpa::{self, LlpError};
use softrdma_wire::rdmap::{Body, Control, Opcode, Segment};

use crate::framing::{Deframer, Framer};
use crate::rdmap::{QpConfig, QpEvent, QpState, RdmapEngine};
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
    framer: Option<Framer>,
    deframer: Option<Deframer>,
    cfg: ConnectionConfig,
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
            engine: RdmapEngine::new(cfg.qp, keys),
            framer: None,
            deframer: None,
            cfg,
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

    pub fn state(&self) -> ConnState {
        if self.failed {
            return ConnState::Failed;
        }
        if self.framer.is_none() {
            return ConnState::Startup;
        }
        match self.engine.state() {
            QpState::Rts | QpState::Terminating => ConnState::Established,
            QpState::Error | QpState::Closed => ConnState::Dead,
        }
    }

    /// What MPA negotiated, once established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.startup.outcome()
    }

    /// Octets read from the TCP connection, in order.
    pub fn handle_input(&mut self, now: Instant, mut bytes: &[u8]) {
        if self.failed {
            return;
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
                    // Octets behind a Reject belong to the ULP; anything else
                    // before Full Operation is a protocol violation.
                    if self.startup.state() != StartupState::Rejected {
                        self.fail(StartupError::ExtraOctets {
                            octets: bytes.len(),
                        });
                    }
                }
                return;
            }
        }
        let Some(d) = self.deframer.as_mut() else {
            return;
        };
        d.push(bytes);
        self.drain_deframer();
    }

    /// The TCP connection delivered FIN or failed.
    pub fn handle_eof(&mut self) {
        if self.deframer.is_none() {
            self.startup.handle_eof();
            self.pump_startup();
        } else {
            // RFC 5044 §8 code 1: the LLP is gone.
            self.engine.handle_llp_error(LlpError::TcpConnectionLost);
            self.pump_engine_events();
        }
    }

    /// Append everything ready to send to `out`; returns the octets added.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        while let Some(f) = self.tx_startup.pop_front() {
            out.extend_from_slice(&f);
        }
        if self.framer.is_none() || !self.startup.may_transmit_fpdus() {
            return out.len() - start;
        }
        let Some(framer) = self.framer.as_mut() else {
            return out.len() - start;
        };
        if self.rtr_due {
            // RFC 6581 P2P: a zero-length RDMA Write (STag 0, TO 0) is the
            // Initiator's first FPDU.
            self.rtr_due = false;
            let rtr = zero_length_write_rtr();
            if framer.frame(&[&rtr], out).is_err() {
                self.failed = true;
            }
        }
        loop {
            self.scratch.clear();
            if self.engine.poll_ulpdu(&mut self.scratch).is_none() {
                break;
            }
            if let Err(e) = framer.frame(&[&self.scratch], out) {
                // The engine never exceeds the MULPDU it was given; if it did,
                // the stream is unusable.
                debug_assert!(false, "engine ULPDU refused by the framer: {e:?}");
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
            || (self.framer.is_some()
                && self.startup.may_transmit_fpdus()
                && (self.rtr_due || self.engine.wants_transmit()))
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
        self.startup.accept(private_data, ird, ord)?;
        self.pump_startup();
        Ok(())
    }

    /// Responder: reject the MPA Request (R=1) with an explanation in Private Data.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
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
        self.framer = Some(n.framer(mulpdu));
        self.deframer = Some(n.deframer());
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

    fn drain_deframer(&mut self) {
        loop {
            let next = match self.deframer.as_mut() {
                Some(d) => d.next(),
                None => return,
            };
            match next {
                None => break,
                Some(Ok(ulpdu)) => {
                    if self.startup.state() == StartupState::AwaitingFirstFpdu {
                        // MPA-73: the Responder may transmit from now on.
                        self.startup.fpdu_received();
                    }
                    if let Some(rtr) = self.rtr_expected.take()
                        && rtr == Rtr::ZeroLengthWrite
                        && is_zero_length_write(&ulpdu)
                    {
                        continue; // the RTR carries nothing for the QP
                    }
                    self.engine.handle_ulpdu(&ulpdu);
                }
                Some(Err(e)) => {
                    // RFC 5044 §8: report to DDP; nothing more is delivered (MPA-90).
                    self.engine.handle_llp_error(e);
                    break;
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
