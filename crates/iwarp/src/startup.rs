//! MPA connection setup (RFC 5044 §7.1, enhanced by RFC 6581): the startup
//! phase of one TCP connection, from the first octet of the MPA Request to
//! Full Operation, as a sans-IO state machine.
//!
//! ```text
//! Initiator:  new ─► Request out ─► AwaitingReply ─► Reply R=0 ─► FullOperation
//!                                         │          Reply R=1 ─► Rejected (TCP stays open)
//!                                         └─ Request, bad key/Rev/PD_Length, EOF, timeout ─► Failed
//! Responder:  new ─► AwaitingRequest ─► valid Request ─► AwaitingDecision (ULP)
//!                        │                 accept() ─► Reply R=0 ─► AwaitingFirstFpdu ─► FullOperation
//!                        │                 reject() ─► Reply R=1 ─► Rejected (TCP stays open)
//!                        └─ malformed, extra octets, EOF, timeout ─► Failed
//! ```
//!
//! The driver moves octets ([`Startup::handle_input`] / [`Startup::poll_transmit`]),
//! time ([`Startup::poll_timeout`] / [`Startup::handle_timeout`]) and ULP
//! decisions ([`Startup::accept`] / [`Startup::reject`]); events come out of
//! [`Startup::poll_event`]. `handle_input` consumes exactly the startup frame:
//! octets after it belong to Full Operation (the caller hands them to a
//! [`Deframer`]) or, after a rejection, to the ULP.
//!
//! **Negotiation** (mpa.md §7.3): CRCs are on when either frame has C=1
//! (MPA-30, MPA-57); Markers are per direction, toward the side whose frame
//! has M=1 (MPA-56). **Revisions**: we send Rev 1 or Rev 2 (RFC 6581; the
//! first 4 Private Data octets carry IRD/ORD and the peer-to-peer RTR
//! options); a Rev-2 Responder answers a Rev-1 Request with Rev 1. A Rev-2
//! Initiator does *not* accept a Rev-1 Reply: Linux siw's
//! `siw_proc_mpareply()` fails that connection ("the responder MUST reply with
//! MPA version 2"), and so do we. A Rev-2 frame always carries the IRD/ORD
//! word here; we also set the Res bit `0x10` that Linux (`MPA_RR_FLAG_ENHANCED`)
//! requires before it reads the word, but do not require it (Res is not
//! checked, MPA-60).
//!
//! **Octets after the frame** (mpa.md §7.6): at the Responder, any octet
//! between the Request and our Reply is a violation (the Initiator may not
//! send FPDUs before it has the Reply) and fails the connection, as siw's
//! `siw_recv_mpa_rr()` does. At the Initiator, octets right behind the Reply
//! break RFC 5044 §7.1.2 r4 (MPA-73), but Linux siw as Responder does send
//! FPDUs right after its Reply in client-server mode (captures
//! `siw-ucmatose.pcap` and `siw-mpa1-ucmatose.pcap`: frames 9 → 11, before the
//! Initiator's first FPDU), so [`StartupConfig::allow_early_fpdus`] (default
//! on) leaves them to the caller; in peer-to-peer mode (the Responder must
//! wait for our RTR) they are always an error.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use softrdma_wire::Error as WireError;
use softrdma_wire::mpa::{
    FRAME_HEADER_LEN, FrameKind, FrameRepr, LlpError, MAX_PRIVATE_DATA, RES_ENHANCED, REV_1, REV_2,
    Rev2Params,
};

use crate::framing::{Deframer, Framer};

/// Default bound on the startup exchange (MPA-78, MPA-80). Linux siw waits
/// 10 s for a Reply and 5 s for a Request (`MPAREQ_TIMEOUT`,
/// `MPAREP_TIMEOUT` in siw_cm.h).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Octets of the RFC 6581 IRD/ORD word at the front of Rev-2 Private Data.
const REV2_WORD_LEN: usize = Rev2Params::LEN;

/// The largest IRD / ORD a Rev-2 frame can carry (14 bits).
pub const MAX_IRD_ORD: u16 = Rev2Params::IRD_ORD_MASK;

// ---------------------------------------------------------------------------
// Configuration and results
// ---------------------------------------------------------------------------

/// Which startup frame this end sends (RFC 5044 §7.1: chosen by the
/// Consumer, not necessarily the TCP active opener).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sends the MPA Request.
    Initiator,
    /// Waits for the Request and sends the Reply.
    Responder,
}

/// A "ready to receive" message type of RFC 6581 peer-to-peer mode: the
/// Initiator's first FPDU, which lets the Responder transmit (MPA-73).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rtr {
    /// Zero-length Send (flag Z in the IRD word; consumes a receive buffer).
    ZeroLengthSend,
    /// Zero-length RDMA Write (flag W in the ORD word).
    ZeroLengthWrite,
    /// Zero-length RDMA Read Request (flag R in the ORD word; needs ORD ≥ 1
    /// at the Initiator and draws a zero-length Read Response).
    ZeroLengthRead,
}

/// A set of [`Rtr`] types: the ones an Initiator can send, or a Responder
/// can take, in peer-to-peer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSet {
    /// Zero-length Send.
    pub send: bool,
    /// Zero-length RDMA Write.
    pub write: bool,
    /// Zero-length RDMA Read.
    pub read: bool,
}

impl RtrSet {
    /// No RTR type.
    pub const NONE: RtrSet = RtrSet {
        send: false,
        write: false,
        read: false,
    };
    /// All three types.
    pub const ALL: RtrSet = RtrSet {
        send: true,
        write: true,
        read: true,
    };
    /// What Linux siw offers as Initiator and takes as Responder
    /// (`rtr_type = MPA_V2_RDMA_READ_RTR | MPA_V2_RDMA_WRITE_RTR`).
    pub const WRITE_OR_READ: RtrSet = RtrSet {
        send: false,
        write: true,
        read: true,
    };

    /// The set holding only `rtr`.
    pub const fn only(rtr: Rtr) -> Self {
        RtrSet {
            send: matches!(rtr, Rtr::ZeroLengthSend),
            write: matches!(rtr, Rtr::ZeroLengthWrite),
            read: matches!(rtr, Rtr::ZeroLengthRead),
        }
    }

    /// `rtr` is in the set.
    pub const fn contains(self, rtr: Rtr) -> bool {
        match rtr {
            Rtr::ZeroLengthSend => self.send,
            Rtr::ZeroLengthWrite => self.write,
            Rtr::ZeroLengthRead => self.read,
        }
    }

    /// No type in the set.
    pub const fn is_empty(self) -> bool {
        !(self.send || self.write || self.read)
    }

    /// Types in both sets.
    pub const fn intersection(self, other: RtrSet) -> RtrSet {
        RtrSet {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// The type to use from this set: Write, else Read, else Send — the
    /// order of Linux siw (`siw_proc_mpareq`, `siw_qp_mpa_rts`): a
    /// zero-length Write costs the Responder nothing, a Read costs an IRD
    /// slot and a Read Response, a Send costs a posted receive.
    pub const fn preferred(self) -> Option<Rtr> {
        if self.write {
            Some(Rtr::ZeroLengthWrite)
        } else if self.read {
            Some(Rtr::ZeroLengthRead)
        } else if self.send {
            Some(Rtr::ZeroLengthSend)
        } else {
            None
        }
    }

    fn from_rev2(p: &Rev2Params) -> RtrSet {
        RtrSet {
            send: p.zero_len_rtr,
            write: p.write_rtr,
            read: p.read_rtr,
        }
    }
}

impl From<Rtr> for RtrSet {
    fn from(rtr: Rtr) -> Self {
        RtrSet::only(rtr)
    }
}

/// How this end starts MPA on one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupConfig {
    /// MPA revision: 1 (RFC 5044) or 2 (RFC 6581). An Initiator sends it; a
    /// Responder takes Requests up to it (a Rev-2 Responder answers Rev 1 with
    /// Rev 1; a Rev-1 Responder refuses Rev 2, MPA-61).
    pub rev: u8,
    /// Our CRC preference (C bit). Default on (MPA-02, MPA-27); turn it off
    /// only on an administrator's request for a path with protection at
    /// least as strong as CRC32c (MPA-28). CRCs are used if either side asks.
    pub crc: bool,
    /// We want Markers in the stream we receive (M bit, MPA-56).
    pub markers: bool,
    /// Initiator, Rev 2: our inbound RDMA Read depth (at most 0x3fff).
    /// A Responder passes its values to [`Startup::accept`].
    pub ird: u16,
    /// Initiator, Rev 2: our outbound RDMA Read depth (at most 0x3fff).
    pub ord: u16,
    /// Rev 2 peer-to-peer mode (RFC 6581). Initiator: request it, offering
    /// these RTR types (offering Read needs `ord` ≥ 1). Responder: the RTR
    /// types we can take; `None`
    /// declines peer-to-peer mode (a Linux Initiator then fails the
    /// connection with "no matching RTR").
    pub p2p: Option<RtrSet>,
    /// Initiator: the Request's Private Data (at most 512 octets, 508 with
    /// Rev 2). A Responder passes its Private Data to [`Startup::accept`] /
    /// [`Startup::reject`].
    pub private_data: Vec<u8>,
    /// Bound on the wait for the peer's startup frame (MPA-78, MPA-80).
    pub timeout: Duration,
    /// Initiator, client-server mode: leave octets that arrive right behind
    /// the Reply to the caller as FPDUs instead of failing the connection.
    /// RFC 5044 §7.1.2 r4 forbids a Responder to send them, but Linux siw
    /// does (see the module documentation). Never applies in peer-to-peer
    /// mode, nor at a Responder.
    pub allow_early_fpdus: bool,
}

impl Default for StartupConfig {
    /// Rev 2, CRC on, no Markers, IRD = ORD = 16, client-server mode, no
    /// Private Data, [`DEFAULT_TIMEOUT`], early FPDUs allowed.
    fn default() -> Self {
        StartupConfig {
            rev: REV_2,
            crc: true,
            markers: false,
            ird: 16,
            ord: 16,
            p2p: None,
            private_data: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            allow_early_fpdus: true,
        }
    }
}

impl StartupConfig {
    fn validate(&self, role: Role) -> Result<(), StartupError> {
        if self.rev != REV_1 && self.rev != REV_2 {
            return Err(StartupError::InvalidConfig("rev must be 1 or 2"));
        }
        if let Some(set) = self.p2p {
            if self.rev != REV_2 {
                return Err(StartupError::InvalidConfig(
                    "peer-to-peer mode needs MPA revision 2",
                ));
            }
            if set.is_empty() {
                return Err(StartupError::InvalidConfig("p2p: empty RTR set"));
            }
        }
        if role == Role::Initiator {
            check_private_data(self.rev, self.private_data.len())?;
            if self.rev == REV_2 {
                check_ird_ord(self.ird, self.ord)?;
            }
            if self.p2p.is_some_and(|s| s.read) && self.ord == 0 {
                // Linux siw_connect() forces ORD 1 in p2p mode; we say so instead.
                return Err(StartupError::InvalidConfig(
                    "offering the zero-length Read RTR needs ORD >= 1",
                ));
            }
        }
        Ok(())
    }
}

fn private_data_limit(rev: u8) -> usize {
    if rev == REV_2 {
        MAX_PRIVATE_DATA - REV2_WORD_LEN
    } else {
        MAX_PRIVATE_DATA
    }
}

fn check_private_data(rev: u8, len: usize) -> Result<(), StartupError> {
    let limit = private_data_limit(rev);
    if len > limit {
        Err(StartupError::PrivateDataTooLong { len, limit })
    } else {
        Ok(())
    }
}

fn check_ird_ord(ird: u16, ord: u16) -> Result<(), StartupError> {
    if ird > MAX_IRD_ORD || ord > MAX_IRD_ORD {
        Err(StartupError::InvalidConfig(
            "IRD and ORD are 14-bit values (RFC 6581)",
        ))
    } else {
        Ok(())
    }
}

/// What the peer's startup frame said, as reported to the ULP (MPA-61:
/// the received Rev; MPA-62: the Private Data goes separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerParams {
    /// Rev of the peer's frame.
    pub rev: u8,
    /// M: the peer wants Markers in the stream it receives.
    pub markers: bool,
    /// C: the peer's CRC preference.
    pub crc: bool,
    /// The 5 Res bits as received (not checked, MPA-60).
    pub res: u8,
    /// The RFC 6581 IRD/ORD word (Rev 2 only).
    pub rev2: Option<Rev2Params>,
}

impl PeerParams {
    fn from_repr(f: &FrameRepr<'_>, rev2: Option<Rev2Params>) -> Self {
        PeerParams {
            rev: f.rev,
            markers: f.m,
            crc: f.c,
            res: f.res,
            rev2,
        }
    }
}

/// The result of a successful startup: what Full Operation uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// MPA revision in use (MPA-10). DDP and RDMAP run version 1 for both
    /// Rev 1 and Rev 2 ([`ddp_version`](Self::ddp_version), MPA-96).
    pub rev: u8,
    /// CRC32c generated and checked in both directions (MPA-30, MPA-31, MPA-57).
    pub crc: bool,
    /// We insert Markers in what we send (the peer's frame had M=1, MPA-56).
    pub markers_tx: bool,
    /// The peer inserts Markers in what we receive (our frame had M=1).
    pub markers_rx: bool,
    /// Our inbound RDMA Read depth: our own resources.
    pub ird: u16,
    /// Our outbound RDMA Read depth; with Rev 2 never above the peer's IRD.
    pub ord: u16,
    /// Peer-to-peer mode: the RTR the Initiator sends as its first FPDU.
    pub rtr: Option<Rtr>,
    /// The peer's Private Data for the ULP (Rev-2 IRD/ORD word removed).
    pub peer_private_data: Vec<u8>,
    /// This end was the Initiator.
    pub initiator: bool,
}

impl Negotiated {
    /// DDP version for DDP headers (RFC 5041; Rev 1 and 2 both mean 1, MPA-10/96).
    pub const fn ddp_version(&self) -> u8 {
        1
    }

    /// RDMAP version for RDMAP headers (RFC 5040; 1 for Rev 1 and 2, MPA-96).
    pub const fn rdmap_version(&self) -> u8 {
        1
    }

    /// The transmit framer of this connection, at SeqStart, with `mulpdu`.
    pub fn framer(&self, mulpdu: u16) -> Framer {
        Framer::new(self.markers_tx, self.crc).with_mulpdu(mulpdu)
    }

    /// The receive deframer of this connection, at SeqStart.
    pub fn deframer(&self) -> Deframer {
        Deframer::new(self.markers_rx, self.crc)
    }
}

/// Where a [`Startup`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StartupState {
    /// Initiator: Request sent, waiting for the Reply (timer running).
    AwaitingReply,
    /// Responder: waiting for the Request (timer running, MPA-78).
    AwaitingRequest,
    /// Responder: a valid Request was reported; waiting for
    /// [`Startup::accept`] or [`Startup::reject`].
    AwaitingDecision,
    /// Responder: Reply (R=0) sent; FPDUs may arrive but none may be sent
    /// until one was received (MPA-73, [`Startup::fpdu_received`]).
    AwaitingFirstFpdu,
    /// Full Operation in both directions.
    FullOperation,
    /// A Reply with R=1 was sent or received: MPA is exited, the TCP
    /// connection stays open for the ULP (MPA-67, MPA-71).
    Rejected,
    /// A fatal error: the connection must be closed (MPA-88).
    Failed,
}

/// What a [`Startup`] reports to its ULP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupEvent {
    /// Responder: a valid Request; the ULP calls [`Startup::accept`] or
    /// [`Startup::reject`] (MPA-65, MPA-75).
    RequestReceived {
        /// The Request's Private Data for the ULP (Rev-2 word removed, MPA-62).
        private_data: Vec<u8>,
        /// Rev, M, C and the Rev-2 word of the Request.
        params: PeerParams,
    },
    /// Startup succeeded (Initiator: valid Reply with R=0, MPA-72;
    /// Responder: after [`Startup::accept`]).
    Accepted {
        /// The negotiated parameters (also [`Startup::outcome`]).
        outcome: Negotiated,
    },
    /// Initiator: the Responder rejected the connection (R=1, MPA-71); MPA is
    /// exited and the TCP connection left to the ULP.
    Rejected {
        /// The Reply's Private Data (may explain why; Rev-2 word removed).
        private_data: Vec<u8>,
        /// Rev, M, C and the Rev-2 word of the Reply.
        params: PeerParams,
    },
    /// Startup failed; close the TCP connection (MPA-88).
    Failed {
        /// Why ([`StartupError::llp_error`] gives the RFC 5044 §8 code).
        error: StartupError,
    },
}

/// Why a startup failed, or why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartupError {
    /// The key is not the one our role expects (MPA-53, MPA-55, MPA-74).
    #[error("MPA startup frame with a wrong key (RFC 5044 §7.1.1)")]
    BadKey,
    /// A Request arrived where a Reply was expected: both ends are
    /// Initiators (RFC 5044 §7.1.2 r8, MPA-77).
    #[error("Initiator/Initiator start-up: an MPA Request arrived instead of a Reply")]
    InitiatorInitiator,
    /// The peer's Rev is not one we can use (MPA-61).
    #[error("unusable MPA revision {rev}")]
    UnusableRev {
        /// The Rev received.
        rev: u8,
    },
    /// PD_Length above 512 (MPA-62, MPA-79); detected from the header alone.
    #[error("MPA PD_Length {len} exceeds 512 (RFC 5044 §7.1.1)")]
    PdLengthTooLarge {
        /// The PD_Length received.
        len: usize,
    },
    /// A structurally invalid frame (e.g. a Rev-2 frame without the IRD/ORD word).
    #[error("malformed MPA startup frame: {0}")]
    Malformed(&'static str),
    /// Octets arrived after the peer's frame where the peer may not send any
    /// (mpa.md §7.6: how a PD_Length/Private Data mismatch shows on a stream).
    #[error(
        "{octets} octet(s) after the MPA startup frame before the peer may send FPDUs (RFC 5044 §7.1.2)"
    )]
    ExtraOctets {
        /// Octets seen after the frame.
        octets: usize,
    },
    /// No complete frame in time (MPA-78, MPA-80).
    #[error("MPA startup timed out with {partial_octets} octet(s) of a frame received")]
    Timeout {
        /// Octets of an incomplete frame (e.g. a body shorter than PD_Length).
        partial_octets: usize,
    },
    /// The peer closed the connection during startup.
    #[error(
        "TCP connection closed during MPA startup ({partial_octets} octet(s) of a frame received)"
    )]
    ConnectionClosed {
        /// Octets of an incomplete frame.
        partial_octets: usize,
    },
    /// Rev 2: the Responder's ORD exceeds our IRD (RFC 6581, LLP code 6).
    #[error("insufficient IRD: the Responder's ORD {peer_ord} exceeds our IRD {ird}")]
    InsufficientIrd {
        /// Our IRD.
        ird: u16,
        /// The ORD of the Reply.
        peer_ord: u16,
    },
    /// Rev 2 peer-to-peer mode without an RTR type both sides support
    /// (RFC 6581, LLP code 7).
    #[error("no matching RTR option for peer-to-peer mode (RFC 6581)")]
    NoMatchingRtr,
    /// Local Private Data over 512 octets (508 with Rev 2) (MPA-63). Not a
    /// protocol error: nothing changed.
    #[error("Private Data of {len} octets exceeds {limit}")]
    PrivateDataTooLong {
        /// Octets given.
        len: usize,
        /// The limit for the revision.
        limit: usize,
    },
    /// A configuration or argument the protocol cannot express. Nothing changed.
    #[error("invalid MPA startup configuration: {0}")]
    InvalidConfig(&'static str),
    /// The call does not fit the current state. Nothing changed.
    #[error("not possible in startup state {0:?}")]
    InvalidState(StartupState),
}

impl StartupError {
    /// The RFC 5044 §8 / RFC 6581 code to report (to DDP and, where the
    /// connection allows, in an LLP Terminate); `None` for a refused local
    /// call. Every error with a code ends the startup: close the connection
    /// (code 4 is treated like code 1, MPA-88).
    pub fn llp_error(&self) -> Option<LlpError> {
        match self {
            StartupError::BadKey
            | StartupError::InitiatorInitiator
            | StartupError::UnusableRev { .. }
            | StartupError::PdLengthTooLarge { .. }
            | StartupError::Malformed(_)
            | StartupError::ExtraOctets { .. } => Some(LlpError::InvalidRequestReply),
            StartupError::Timeout { partial_octets } if *partial_octets > 0 => {
                Some(LlpError::InvalidRequestReply)
            }
            StartupError::Timeout { .. } | StartupError::ConnectionClosed { .. } => {
                Some(LlpError::TcpConnectionLost)
            }
            StartupError::InsufficientIrd { .. } => Some(LlpError::InsufficientIrd),
            StartupError::NoMatchingRtr => Some(LlpError::NoMatchingRtr),
            StartupError::PrivateDataTooLong { .. }
            | StartupError::InvalidConfig(_)
            | StartupError::InvalidState(_) => None,
        }
    }

    /// The startup is over and the TCP connection must be closed.
    pub fn is_fatal(&self) -> bool {
        self.llp_error().is_some()
    }
}

/// Responder: a validated Request waiting for the ULP.
#[derive(Debug, Clone)]
struct Pending {
    peer: PeerParams,
    rtr: Option<Rtr>,
    private_data: Vec<u8>,
}

impl Pending {
    fn rev(&self) -> u8 {
        self.peer.rev
    }
}

// ---------------------------------------------------------------------------
// The state machine
// ---------------------------------------------------------------------------

/// The MPA startup of one TCP connection (RFC 5044 §7.1, RFC 6581), sans-IO.
#[derive(Debug, Clone)]
pub struct Startup {
    role: Role,
    cfg: StartupConfig,
    state: StartupState,
    /// The peer's frame so far (at most 532 octets).
    rx: Vec<u8>,
    tx: Option<Vec<u8>>,
    events: VecDeque<StartupEvent>,
    deadline: Option<Instant>,
    pending: Option<Pending>,
    outcome: Option<Negotiated>,
    error: Option<StartupError>,
}

impl Startup {
    /// Start as Initiator: the Request is queued for
    /// [`poll_transmit`](Self::poll_transmit) (MPA-64) and the timer armed.
    pub fn initiator(cfg: StartupConfig, now: Instant) -> Result<Self, StartupError> {
        cfg.validate(Role::Initiator)?;
        let word = (cfg.rev == REV_2).then(|| Rev2Params {
            p2p: cfg.p2p.is_some(),
            zero_len_rtr: cfg.p2p.is_some_and(|s| s.send),
            write_rtr: cfg.p2p.is_some_and(|s| s.write),
            read_rtr: cfg.p2p.is_some_and(|s| s.read),
            ird: cfg.ird,
            ord: cfg.ord,
        });
        let request = emit_frame(
            FrameKind::Request,
            cfg.markers,
            cfg.crc,
            false,
            cfg.rev,
            word,
            &cfg.private_data,
        )?;
        let deadline = now.checked_add(cfg.timeout);
        Ok(Startup {
            state: StartupState::AwaitingReply,
            tx: Some(request),
            deadline,
            ..Startup::empty(Role::Initiator, cfg)
        })
    }

    /// Start as Responder: wait for the Request, timer armed (MPA-65, MPA-78).
    pub fn responder(cfg: StartupConfig, now: Instant) -> Result<Self, StartupError> {
        cfg.validate(Role::Responder)?;
        let deadline = now.checked_add(cfg.timeout);
        Ok(Startup {
            state: StartupState::AwaitingRequest,
            deadline,
            ..Startup::empty(Role::Responder, cfg)
        })
    }

    fn empty(role: Role, cfg: StartupConfig) -> Self {
        Startup {
            role,
            cfg,
            state: StartupState::Failed,
            rx: Vec::new(),
            tx: None,
            events: VecDeque::new(),
            deadline: None,
            pending: None,
            outcome: None,
            error: None,
        }
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Where the startup is.
    pub fn state(&self) -> StartupState {
        self.state
    }

    /// The configuration this startup runs with.
    pub fn config(&self) -> &StartupConfig {
        &self.cfg
    }

    /// The negotiated parameters, once accepted (Initiator: valid Reply R=0;
    /// Responder: after [`accept`](Self::accept)).
    pub fn outcome(&self) -> Option<&Negotiated> {
        self.outcome.as_ref()
    }

    /// The fatal error, once [`Failed`](StartupState::Failed).
    pub fn error(&self) -> Option<&StartupError> {
        self.error.as_ref()
    }

    /// The next startup frame to write to the TCP connection.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.tx.take()
    }

    /// The next event for the ULP.
    pub fn poll_event(&mut self) -> Option<StartupEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called: while
    /// the peer's frame is awaited. (The ULP's decision and, in client-server
    /// mode, the Initiator's first FPDU are not timed here; MPA-81 leaves
    /// those to the ULP.)
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            StartupState::AwaitingReply | StartupState::AwaitingRequest => self.deadline,
            _ => None,
        }
    }

    /// Fail the startup if its deadline has passed (MPA-78, MPA-80); a
    /// partial frame at that point is an invalid frame (MPA-62).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|d| now >= d) {
            let partial_octets = self.rx.len();
            self.fail(StartupError::Timeout { partial_octets });
        }
    }

    /// The peer closed its half of the TCP connection (FIN) or it was lost.
    /// During the frame exchange that fails the startup; afterwards it is the
    /// data path's business and this is a no-op.
    pub fn handle_eof(&mut self) {
        if matches!(
            self.state,
            StartupState::AwaitingReply
                | StartupState::AwaitingRequest
                | StartupState::AwaitingDecision
        ) {
            let partial_octets = self.rx.len();
            self.fail(StartupError::ConnectionClosed { partial_octets });
        }
    }

    /// Octets received from the TCP connection. Returns how many belong to
    /// the startup frame; the rest (if any) are Full Operation octets for a
    /// [`Deframer`] or, after a rejection, the ULP's. After acceptance and
    /// after a rejection nothing more is consumed (`Ok(0)`).
    ///
    /// Errors are fatal (see [`StartupError::llp_error`]) and also reported
    /// as [`StartupEvent::Failed`]; once failed, every call returns the error.
    pub fn handle_input(&mut self, _now: Instant, bytes: &[u8]) -> Result<usize, StartupError> {
        match self.state {
            StartupState::Failed => Err(self
                .error
                .clone()
                .unwrap_or(StartupError::InvalidState(StartupState::Failed))),
            StartupState::AwaitingReply | StartupState::AwaitingRequest => {
                let r = self.read_frame(bytes);
                r.inspect_err(|e| self.fail(e.clone()))
            }
            // The Initiator may not send before it has our Reply (§7.6).
            StartupState::AwaitingDecision if !bytes.is_empty() => {
                let e = StartupError::ExtraOctets {
                    octets: bytes.len(),
                };
                self.fail(e.clone());
                Err(e)
            }
            StartupState::AwaitingDecision
            | StartupState::AwaitingFirstFpdu
            | StartupState::FullOperation
            | StartupState::Rejected => Ok(0),
        }
    }

    /// Responder: accept the Request (MPA-68) with our Private Data (at most
    /// 512 octets, 508 with Rev 2) and, for Rev 2, our IRD and ORD. The Reply
    /// (R=0) is queued; our ORD is capped by the Initiator's IRD, and our IRD
    /// is at least 1 when the chosen RTR is a zero-length Read. Full
    /// Operation starts for receiving; transmitting waits for the first
    /// FPDU (MPA-73, [`fpdu_received`](Self::fpdu_received)).
    ///
    /// Refused calls (`PrivateDataTooLong`, `InvalidConfig`, `InvalidState`)
    /// change nothing.
    pub fn accept(&mut self, private_data: &[u8], ird: u16, ord: u16) -> Result<(), StartupError> {
        let pending = self.pending_for_decision()?;
        let rev = pending.rev();
        check_private_data(rev, private_data.len())?;
        if rev == REV_2 {
            check_ird_ord(ird, ord)?;
        }
        let crc = self.cfg.crc || pending.peer.crc;
        let rtr = pending.rtr;
        // The zero-length Read RTR takes one inbound Read slot.
        let ird = if rtr == Some(Rtr::ZeroLengthRead) {
            ird.max(1)
        } else {
            ird
        };
        // RFC 6581: we never issue more Reads than the Initiator can take.
        let ord = match pending.peer.rev2 {
            Some(w) => ord.min(w.ird),
            None => ord,
        };
        let word = (rev == REV_2).then(|| Rev2Params {
            p2p: rtr.is_some(),
            zero_len_rtr: rtr == Some(Rtr::ZeroLengthSend),
            write_rtr: rtr == Some(Rtr::ZeroLengthWrite),
            read_rtr: rtr == Some(Rtr::ZeroLengthRead),
            ird,
            ord,
        });
        let reply = emit_frame(
            FrameKind::Reply,
            self.cfg.markers,
            crc,
            false,
            rev,
            word,
            private_data,
        )?;
        let Some(pending) = self.pending.take() else {
            return Err(StartupError::InvalidState(self.state));
        };
        let outcome = Negotiated {
            rev,
            crc,
            markers_tx: pending.peer.markers,
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            peer_private_data: pending.private_data,
            initiator: false,
        };
        self.tx = Some(reply);
        self.state = StartupState::AwaitingFirstFpdu;
        self.events.push_back(StartupEvent::Accepted {
            outcome: outcome.clone(),
        });
        self.outcome = Some(outcome);
        Ok(())
    }

    /// Responder: reject the Request (MPA-67, MPA-75): a Reply with R=1 and
    /// `private_data` (at most 512 octets, 508 with Rev 2) is queued; MPA is
    /// exited and the TCP connection left open for the ULP, which closes it
    /// after the Reply went out.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let pending = self.pending_for_decision()?;
        let rev = pending.rev();
        check_private_data(rev, private_data.len())?;
        let crc = self.cfg.crc || pending.peer.crc;
        let word = (rev == REV_2).then(Rev2Params::default);
        let reply = emit_frame(
            FrameKind::Reply,
            self.cfg.markers,
            crc,
            true,
            rev,
            word,
            private_data,
        )?;
        self.pending = None;
        self.tx = Some(reply);
        self.state = StartupState::Rejected;
        Ok(())
    }

    /// Responder: the data path received and validated its first FPDU
    /// (in peer-to-peer mode: the RTR); from now on we may transmit
    /// (MPA-73). Idempotent; a no-op in other states.
    pub fn fpdu_received(&mut self) {
        if self.state == StartupState::AwaitingFirstFpdu {
            self.state = StartupState::FullOperation;
        }
    }

    /// May the data path send FPDUs (and Markers) now? Initiator: once
    /// accepted (MPA-72). Responder: once accepted *and* an FPDU was received
    /// (RFC 5044 §7.1.2 r4, MPA-73).
    pub fn may_transmit_fpdus(&self) -> bool {
        self.state == StartupState::FullOperation
    }

    /// Initiator in peer-to-peer mode: the zero-length RTR message the data
    /// path must send as its very first FPDU (RFC 6581). `None` otherwise.
    pub fn rtr_required(&self) -> Option<Rtr> {
        match (self.role, self.state) {
            (Role::Initiator, StartupState::FullOperation) => {
                self.outcome.as_ref().and_then(|o| o.rtr)
            }
            _ => None,
        }
    }

    // -- internals ----------------------------------------------------------

    fn pending_for_decision(&self) -> Result<&Pending, StartupError> {
        match (&self.pending, self.state) {
            (Some(p), StartupState::AwaitingDecision) => Ok(p),
            _ => Err(StartupError::InvalidState(self.state)),
        }
    }

    fn fail(&mut self, e: StartupError) {
        if self.state == StartupState::Failed {
            return;
        }
        self.state = StartupState::Failed;
        self.tx = None;
        self.pending = None;
        self.rx = Vec::new();
        self.error = Some(e.clone());
        self.events.push_back(StartupEvent::Failed { error: e });
    }

    /// Accumulate the peer's frame; once complete, act on it.
    fn read_frame(&mut self, bytes: &[u8]) -> Result<usize, StartupError> {
        let mut used = 0;
        loop {
            // Validates the key prefix and PD_Length as soon as they are in,
            // so we never buffer more than 20 + 512 octets (MPA-79).
            let total = match FrameRepr::frame_len(&self.rx) {
                Ok(Some(total)) => total,
                Ok(None) => FRAME_HEADER_LEN,
                Err(e) => return Err(map_wire_error(e)),
            };
            if self.rx.len() >= total {
                break;
            }
            let take = (total - self.rx.len()).min(bytes.len() - used);
            if take == 0 {
                return Ok(used);
            }
            self.rx.extend_from_slice(&bytes[used..used + take]);
            used += take;
        }
        let frame = std::mem::take(&mut self.rx);
        let repr = FrameRepr::parse(&frame).map_err(map_wire_error)?;
        let rest = &bytes[used..];
        match self.role {
            Role::Responder => self.on_request(&repr, rest)?,
            Role::Initiator => self.on_reply(&repr, rest)?,
        }
        Ok(used)
    }

    fn on_request(&mut self, f: &FrameRepr<'_>, rest: &[u8]) -> Result<(), StartupError> {
        if f.kind != FrameKind::Request {
            return Err(StartupError::BadKey); // MPA-53
        }
        // MPA-61: Rev 1 always; Rev 2 when configured. (Rev 0 = RDMA
        // Consortium would need DDP/RDMAP version 0: not supported.)
        let usable = f.rev == REV_1 || (f.rev == REV_2 && self.cfg.rev == REV_2);
        if !usable {
            return Err(StartupError::UnusableRev { rev: f.rev });
        }
        let (rev2, ulp_pd) = split_rev2(f)?;
        let rtr = match rev2 {
            Some(w) if w.p2p => match self.cfg.p2p {
                Some(ours) => Some(
                    ours.intersection(RtrSet::from_rev2(&w))
                        .preferred()
                        .ok_or(StartupError::NoMatchingRtr)?,
                ),
                None => None,
            },
            _ => None,
        };
        if !rest.is_empty() {
            return Err(StartupError::ExtraOctets { octets: rest.len() });
        }
        let params = PeerParams::from_repr(f, rev2);
        self.pending = Some(Pending {
            peer: params,
            rtr,
            private_data: ulp_pd.to_vec(),
        });
        self.state = StartupState::AwaitingDecision;
        self.events.push_back(StartupEvent::RequestReceived {
            private_data: ulp_pd.to_vec(),
            params,
        });
        Ok(())
    }

    fn on_reply(&mut self, f: &FrameRepr<'_>, rest: &[u8]) -> Result<(), StartupError> {
        if f.kind != FrameKind::Reply {
            return Err(StartupError::InitiatorInitiator); // MPA-77
        }
        // MPA-61: a Responder never answers with a higher Rev than asked.
        if f.rev != REV_1 && f.rev != REV_2 || f.rev > self.cfg.rev {
            return Err(StartupError::UnusableRev { rev: f.rev });
        }
        if f.r {
            // MPA-71: exit MPA, TCP left open; the octets after the frame
            // are the ULP's. A Rev-2 reject may lack the word (siw sends
            // none when it rejects a short Rev-2 Request): keep all then.
            let (rev2, pd) = match split_rev2(f) {
                Ok(x) => x,
                Err(_) => (None, f.private_data),
            };
            self.state = StartupState::Rejected;
            self.events.push_back(StartupEvent::Rejected {
                private_data: pd.to_vec(),
                params: PeerParams::from_repr(f, rev2),
            });
            return Ok(());
        }
        // Linux siw_proc_mpareply(): a Rev-2 Initiator requires a Rev-2 Reply.
        if f.rev != self.cfg.rev {
            return Err(StartupError::UnusableRev { rev: f.rev });
        }
        let (rev2, ulp_pd) = split_rev2(f)?;
        let (ird, mut ord, mut rtr) = (self.cfg.ird, self.cfg.ord, None);
        if let Some(w) = rev2 {
            if w.ord > self.cfg.ird {
                return Err(StartupError::InsufficientIrd {
                    ird: self.cfg.ird,
                    peer_ord: w.ord,
                });
            }
            ord = ord.min(w.ird);
            if let Some(mut offered) = self.cfg.p2p {
                // A Read RTR we could not issue (Responder IRD 0) is no match.
                offered.read &= ord > 0;
                rtr = Some(
                    offered
                        .intersection(RtrSet::from_rev2(&w))
                        .preferred()
                        .ok_or(StartupError::NoMatchingRtr)?,
                );
            }
        }
        if !rest.is_empty() && (rtr.is_some() || !self.cfg.allow_early_fpdus) {
            return Err(StartupError::ExtraOctets { octets: rest.len() });
        }
        let outcome = Negotiated {
            rev: f.rev,
            crc: self.cfg.crc || f.c,
            markers_tx: f.m,
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            peer_private_data: ulp_pd.to_vec(),
            initiator: true,
        };
        self.state = StartupState::FullOperation;
        self.events.push_back(StartupEvent::Accepted {
            outcome: outcome.clone(),
        });
        self.outcome = Some(outcome);
        Ok(())
    }
}

/// The Rev-2 word and the ULP's part of the Private Data.
fn split_rev2<'a>(f: &FrameRepr<'a>) -> Result<(Option<Rev2Params>, &'a [u8]), StartupError> {
    if f.rev != REV_2 {
        return Ok((None, f.private_data));
    }
    let w = Rev2Params::parse(f.private_data).map_err(|_| {
        StartupError::Malformed("Rev 2 Private Data without the 4-octet IRD/ORD word (RFC 6581)")
    })?;
    Ok((Some(w), &f.private_data[REV2_WORD_LEN..]))
}

fn map_wire_error(e: WireError) -> StartupError {
    match e {
        WireError::Malformed { .. } => StartupError::BadKey,
        WireError::TooLarge { value, .. } => StartupError::PdLengthTooLarge {
            len: usize::try_from(value).unwrap_or(usize::MAX),
        },
        WireError::Truncated { .. } | WireError::Unknown { .. } => {
            StartupError::Malformed("MPA startup frame")
        }
    }
}

/// One startup frame: key, flags, Rev, PD_Length, [Rev-2 word,] Private Data.
/// Rev-2 frames carry Res = 0x10 (`MPA_RR_FLAG_ENHANCED`), which Linux
/// requires before it reads the IRD/ORD word.
fn emit_frame(
    kind: FrameKind,
    m: bool,
    c: bool,
    r: bool,
    rev: u8,
    word: Option<Rev2Params>,
    private_data: &[u8],
) -> Result<Vec<u8>, StartupError> {
    let mut pd = Vec::with_capacity(REV2_WORD_LEN + private_data.len());
    if let Some(w) = word {
        let mut b = [0u8; REV2_WORD_LEN];
        w.emit(&mut b)
            .map_err(|_| StartupError::InvalidConfig("IRD and ORD are 14-bit values (RFC 6581)"))?;
        pd.extend_from_slice(&b);
    }
    pd.extend_from_slice(private_data);
    let repr = FrameRepr {
        kind,
        m,
        c,
        r,
        res: if word.is_some() { RES_ENHANCED } else { 0 },
        rev,
        private_data: &pd,
    };
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut out)
        .map_err(|_| StartupError::PrivateDataTooLong {
            len: private_data.len(),
            limit: private_data_limit(rev),
        })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::Deframer;
    use proptest::prelude::*;
    use softrdma_testkit::pattern;
    use softrdma_wire::mpa::{REPLY_KEY, REQUEST_KEY};
    use softrdma_wire::vectors::mpa_frames::{
        NFS3_REPLY, NFS3_REQUEST, SEND_INV_REPLY, SIW_CRC_RPING_REPLY as SIW_CRC_REPLY,
        SIW_CRC_RPING_REQUEST as SIW_CRC_REQUEST, SIW_MPA1_REPLY, SIW_MPA1_REQUEST,
        SIW_RPING_REPLY, SIW_RPING_REQUEST,
    };
    use std::mem::discriminant;

    // -----------------------------------------------------------------------
    // Static arrays cut from ../shared/captures (tshark -e tcp.payload)
    // -----------------------------------------------------------------------

    /// siw-mpa1-ucmatose.pcap frame 11 (10.77.1.2 -> 10.77.1.3): the Responder's first FPDU (Send, 118 octets), sent 13 ms after its Reply and before any FPDU of the Initiator.
    const SIW_MPA1_EARLY_FPDU: [u8; 124] = [
        0x00, 0x76, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0xca, 0x84, 0x68, 0x5d, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x75, 0x76, 0x65, 0x72, 0x62, 0x73, 0x31, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    /// siw-send_inv.pcap frame 7: Request, Rev 2, IRD 1 / ORD 1 + 16 octets (rdmazoo "RZOO" connect data).
    const SEND_INV_REQUEST: [u8; 40] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x10, 0x02, 0x00, 0x14, 0x00, 0x01, 0x00, 0x01, 0x52, 0x5a, 0x4f, 0x4f, 0x02, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x03, 0xe8,
    ];

    /// siw-rping.pcap frame 11 (10.77.1.3 -> 10.77.1.2): the Initiator's first FPDU (Send, 34 octets, CRC field zero).
    const SIW_RPING_FIRST_FPDU: [u8; 40] = [
        0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x39, 0x90, 0xb5, 0x03, 0x70, 0x51, 0xa1,
        0x6c, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    ];
    // -----------------------------------------------------------------------
    // Helpers
    // -----------------------------------------------------------------------

    /// A raw startup frame: key, flags octet, Rev, PD_Length = `pd.len()`, `pd`.
    fn raw(kind: FrameKind, flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
        let mut v = kind.key().to_vec();
        v.extend_from_slice(&[flags, rev]);
        v.extend_from_slice(&(pd.len() as u16).to_be_bytes());
        v.extend_from_slice(pd);
        v
    }

    fn word(ird: u16, ord: u16) -> [u8; 4] {
        let mut b = [0u8; 4];
        b[..2].copy_from_slice(&ird.to_be_bytes());
        b[2..].copy_from_slice(&ord.to_be_bytes());
        b
    }

    fn cfg(rev: u8, crc: bool, markers: bool) -> StartupConfig {
        StartupConfig {
            rev,
            crc,
            markers,
            ..StartupConfig::default()
        }
    }

    fn events(s: &mut Startup) -> Vec<StartupEvent> {
        std::iter::from_fn(|| s.poll_event()).collect()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// What the Responder's ULP does with a Request.
    #[derive(Debug, Clone)]
    enum Ulp {
        Accept(Vec<u8>, u16, u16),
        Reject(Vec<u8>),
    }

    struct Run {
        i: Startup,
        r: Startup,
        ie: Vec<StartupEvent>,
        re: Vec<StartupEvent>,
        request: Option<Vec<u8>>,
        reply: Option<Vec<u8>>,
    }

    /// Wire an Initiator and a Responder together and run the exchange.
    fn run(icfg: StartupConfig, rcfg: StartupConfig, ulp: Ulp) -> Run {
        let now = Instant::now();
        let mut i = Startup::initiator(icfg, now).unwrap();
        let mut r = Startup::responder(rcfg, now).unwrap();
        assert_eq!(
            r.poll_transmit(),
            None,
            "MPA-65: the Responder speaks second"
        );
        let request = i.poll_transmit();
        assert_eq!(i.poll_transmit(), None);
        if let Some(f) = &request {
            let _ = r.handle_input(now, f);
        }
        let mut re = Vec::new();
        for ev in events(&mut r) {
            if matches!(ev, StartupEvent::RequestReceived { .. }) {
                assert_eq!(r.state(), StartupState::AwaitingDecision);
                assert_eq!(r.poll_transmit(), None, "no Reply before the ULP decides");
                match &ulp {
                    Ulp::Accept(pd, ird, ord) => r.accept(pd, *ird, *ord).unwrap(),
                    Ulp::Reject(pd) => r.reject(pd).unwrap(),
                }
            }
            re.push(ev);
        }
        re.extend(events(&mut r));
        let reply = r.poll_transmit();
        if let Some(f) = &reply {
            let _ = i.handle_input(now, f);
        }
        let ie = events(&mut i);
        Run {
            i,
            r,
            ie,
            re,
            request,
            reply,
        }
    }

    fn failed_with(s: &Startup, e: &StartupError) {
        assert_eq!(s.state(), StartupState::Failed);
        assert_eq!(s.error(), Some(e));
        assert!(e.is_fatal());
    }

    // -----------------------------------------------------------------------
    // Two Startups wired together
    // -----------------------------------------------------------------------

    /// MPA-56/57/30/31, MPA-10, MPA-62/63, MPA-64/65/68/69/72, MPA-52/54:
    /// every combination of Rev 1/2 × CRC (each side) × Markers (each side) ×
    /// Private Data of 0, 1, 508 and 512 octets in both frames: both ends
    /// agree on the outcome of mpa.md §7.3, the frames carry exactly what was
    /// asked, and Private Data over the Rev's limit is refused locally.
    #[test]
    fn mpa_56_57_negotiation_matrix() {
        let now = Instant::now();
        let mut runs = 0;
        for rev in [REV_1, REV_2] {
            let limit = if rev == REV_2 { 508 } else { 512 };
            let w = if rev == REV_2 { 4 } else { 0 };
            for pd_len in [0usize, 1, 508, 512] {
                for bits in 0u8..16 {
                    let (ci, cr, mi, mr) =
                        (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0);
                    let req_pd = pattern(pd_len, 1);
                    let rep_pd = pattern(pd_len, 2);
                    let icfg = StartupConfig {
                        ird: 2,
                        ord: 7,
                        private_data: req_pd.clone(),
                        ..cfg(rev, ci, mi)
                    };
                    let rcfg = cfg(rev, cr, mr);
                    if pd_len > limit {
                        assert_eq!(
                            Startup::initiator(icfg, now).unwrap_err(),
                            StartupError::PrivateDataTooLong { len: pd_len, limit }
                        );
                        let mut i = Startup::initiator(cfg(rev, ci, mi), now).unwrap();
                        let mut r = Startup::responder(rcfg, now).unwrap();
                        r.handle_input(now, &i.poll_transmit().unwrap()).unwrap();
                        let e = StartupError::PrivateDataTooLong { len: pd_len, limit };
                        assert_eq!(r.accept(&rep_pd, 4, 3), Err(e.clone()));
                        assert_eq!(r.reject(&rep_pd), Err(e.clone()));
                        assert_eq!(e.llp_error(), None);
                        assert_eq!(r.state(), StartupState::AwaitingDecision);
                        assert_eq!(r.poll_transmit(), None);
                        continue;
                    }
                    let run = run(icfg, rcfg, Ulp::Accept(rep_pd.clone(), 4, 3));
                    runs += 1;
                    let crc = ci || cr;
                    let res = if rev == REV_2 { RES_ENHANCED } else { 0 };
                    // The frames (MPA-50: plain octets, no Marker, no CRC).
                    let req = run.request.as_ref().unwrap();
                    assert_eq!(req.len(), 20 + w + pd_len);
                    assert_eq!(&req[..16], &REQUEST_KEY);
                    assert_eq!(req[16], u8::from(mi) << 7 | u8::from(ci) << 6 | res);
                    assert_eq!(req[17], rev);
                    assert_eq!(
                        usize::from(u16::from_be_bytes([req[18], req[19]])),
                        w + pd_len
                    );
                    assert_eq!(&req[20 + w..], &req_pd[..]);
                    let rep = run.reply.as_ref().unwrap();
                    assert_eq!(rep.len(), 20 + w + pd_len);
                    assert_eq!(&rep[..16], &REPLY_KEY);
                    assert_eq!(rep[16], u8::from(mr) << 7 | u8::from(crc) << 6 | res);
                    assert_eq!(rep[17], rev);
                    assert_eq!(&rep[20 + w..], &rep_pd[..]);
                    if rev == REV_2 {
                        assert_eq!(&req[20..24], &word(2, 7));
                        // Responder ORD capped by the Initiator's IRD.
                        assert_eq!(&rep[20..24], &word(4, 2));
                    }
                    // Both outcomes (mpa.md §7.3).
                    let io = Negotiated {
                        rev,
                        crc,
                        markers_tx: mr,
                        markers_rx: mi,
                        ird: 2,
                        ord: if rev == REV_2 { 4 } else { 7 },
                        rtr: None,
                        peer_private_data: rep_pd.clone(),
                        initiator: true,
                    };
                    let ro = Negotiated {
                        rev,
                        crc,
                        markers_tx: mi,
                        markers_rx: mr,
                        ird: 4,
                        ord: if rev == REV_2 { 2 } else { 3 },
                        rtr: None,
                        peer_private_data: req_pd.clone(),
                        initiator: false,
                    };
                    assert_eq!(run.i.outcome(), Some(&io));
                    assert_eq!(run.r.outcome(), Some(&ro));
                    assert_eq!((io.ddp_version(), io.rdmap_version()), (1, 1));
                    assert_eq!(run.ie, vec![StartupEvent::Accepted { outcome: io }]);
                    let rev2 = (rev == REV_2).then_some(Rev2Params {
                        ird: 2,
                        ord: 7,
                        ..Rev2Params::default()
                    });
                    assert_eq!(
                        run.re,
                        vec![
                            StartupEvent::RequestReceived {
                                private_data: req_pd,
                                params: PeerParams {
                                    rev,
                                    markers: mi,
                                    crc: ci,
                                    res,
                                    rev2
                                },
                            },
                            StartupEvent::Accepted { outcome: ro },
                        ]
                    );
                    assert_eq!(run.i.state(), StartupState::FullOperation);
                    assert_eq!(run.r.state(), StartupState::AwaitingFirstFpdu);
                    assert!(run.i.may_transmit_fpdus());
                    assert!(!run.r.may_transmit_fpdus());
                    assert_eq!(run.i.poll_timeout(), None);
                    assert_eq!(run.r.poll_timeout(), None);
                }
            }
        }
        assert_eq!(runs, 2 * 16 * 4 - 16);
    }

    /// MPA-02/27: the default configuration asks for CRCs.
    #[test]
    fn mpa_02_crc_on_by_default() {
        let d = StartupConfig::default();
        assert!(d.crc && !d.markers && d.rev == REV_2 && d.p2p.is_none());
        let run = run(
            StartupConfig::default(),
            StartupConfig::default(),
            Ulp::Accept(vec![], 16, 16),
        );
        assert!(run.i.outcome().unwrap().crc && run.r.outcome().unwrap().crc);
        assert_eq!(run.request.unwrap()[16] & 0x40, 0x40);
    }

    /// MPA-10, MPA-61: a Rev-1 Initiator and a Rev-2 Responder agree on Rev 1
    /// (no IRD/ORD word, Res 0), and both report it.
    #[test]
    fn mpa_10_rev2_responder_answers_rev1_with_rev1() {
        let icfg = StartupConfig {
            private_data: b"hello".to_vec(),
            ..cfg(REV_1, false, false)
        };
        let run = run(
            icfg,
            cfg(REV_2, false, false),
            Ulp::Accept(b"hi".to_vec(), 3, 3),
        );
        let rep = run.reply.unwrap();
        assert_eq!((rep[16], rep[17], rep.len()), (0, 1, 22));
        assert_eq!(run.i.outcome().unwrap().rev, 1);
        assert_eq!(run.r.outcome().unwrap().rev, 1);
        assert_eq!(run.i.outcome().unwrap().peer_private_data, b"hi");
        assert_eq!(run.r.outcome().unwrap().peer_private_data, b"hello");
    }

    /// MPA-61: a Rev-1-only Responder refuses a Rev-2 Request; a Rev-2
    /// Initiator refuses a Rev-1 Reply (as Linux siw_proc_mpareply() does)
    /// but still honours a Rev-1 *reject*, which siw checks first.
    #[test]
    fn mpa_61_rev2_initiator_and_rev1_peer() {
        let run = run(
            cfg(REV_2, true, false),
            cfg(REV_1, true, false),
            Ulp::Reject(vec![]),
        );
        let e = StartupError::UnusableRev { rev: 2 };
        failed_with(&run.r, &e);
        assert_eq!(e.llp_error(), Some(LlpError::InvalidRequestReply));
        assert_eq!(run.reply, None);
        assert_eq!(run.re, vec![StartupEvent::Failed { error: e }]);
        assert_eq!(run.i.state(), StartupState::AwaitingReply);

        let now = Instant::now();
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(
            i.handle_input(now, &SIW_MPA1_REPLY),
            Err(StartupError::UnusableRev { rev: 1 })
        );
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        let reject = raw(FrameKind::Reply, 0x20, REV_1, b"no");
        assert_eq!(i.handle_input(now, &reject), Ok(22));
        assert_eq!(i.state(), StartupState::Rejected);
        assert!(
            matches!(&events(&mut i)[..], [StartupEvent::Rejected { private_data, .. }] if private_data == b"no")
        );
    }

    /// MPA-61: Rev 0 (RDMA Consortium), 3 and 255 are unusable both ways; a
    /// Responder may not answer a Rev-1 Request with Rev 2.
    #[test]
    fn mpa_61_unusable_revs() {
        let now = Instant::now();
        for rev in [0u8, 3, 4, 255] {
            let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
            let e = StartupError::UnusableRev { rev };
            assert_eq!(
                r.handle_input(now, &raw(FrameKind::Request, 0, rev, &word(1, 1))),
                Err(e.clone())
            );
            failed_with(&r, &e);
            let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
            assert_eq!(
                i.handle_input(now, &raw(FrameKind::Reply, 0, rev, &word(1, 1))),
                Err(e.clone())
            );
            failed_with(&i, &e);
        }
        let mut i = Startup::initiator(cfg(REV_1, false, false), now).unwrap();
        assert_eq!(
            i.handle_input(now, &SIW_RPING_REPLY),
            Err(StartupError::UnusableRev { rev: 2 })
        );
    }

    /// MPA-67, MPA-71, MPA-75: the Responder's ULP rejects: Reply with R=1 and
    /// the explaining Private Data; both ends exit MPA with TCP left open, and
    /// octets after the reject belong to the ULP (not consumed).
    #[test]
    fn mpa_67_71_reject_both_roles() {
        for rev in [REV_1, REV_2] {
            for pd_len in [0usize, 1, private_data_limit(rev)] {
                let why = pattern(pd_len, 9);
                let run = run(
                    cfg(rev, false, true),
                    cfg(rev, false, false),
                    Ulp::Reject(why.clone()),
                );
                let rep = run.reply.clone().unwrap();
                assert_eq!(rep[16] & 0x20, 0x20, "R=1 on the wire");
                assert_eq!(rep[17], rev);
                assert_eq!(run.r.state(), StartupState::Rejected);
                assert_eq!(run.r.outcome(), None);
                assert!(!run.r.may_transmit_fpdus());
                assert_eq!(run.r.poll_timeout(), None);
                assert_eq!(run.i.state(), StartupState::Rejected);
                assert_eq!(run.i.outcome(), None);
                assert_eq!(run.i.error(), None);
                assert_eq!(run.ie.len(), 1);
                match &run.ie[0] {
                    StartupEvent::Rejected {
                        private_data,
                        params,
                    } => {
                        assert_eq!(private_data, &why);
                        assert_eq!(params.rev, rev);
                    }
                    e => panic!("{e:?}"),
                }
                // TCP stays open: streaming octets behind the reject are the ULP's.
                let now = Instant::now();
                let mut i = Startup::initiator(cfg(rev, false, true), now).unwrap();
                let mut wire = rep.clone();
                wire.extend_from_slice(b"goodbye");
                assert_eq!(i.handle_input(now, &wire), Ok(rep.len()));
                assert_eq!(i.handle_input(now, b"more"), Ok(0));
                assert_eq!(i.state(), StartupState::Rejected);
                // And at the Responder too.
                let mut r = run.r;
                assert_eq!(r.handle_input(now, b"late"), Ok(0));
                assert_eq!(
                    r.accept(&[], 1, 1),
                    Err(StartupError::InvalidState(StartupState::Rejected))
                );
            }
        }
    }

    // -----------------------------------------------------------------------
    // Malformed input
    // -----------------------------------------------------------------------

    /// MPA-53, MPA-55, MPA-74: any key octet changed is a wrong key, detected
    /// at that very octet (the frame is never buffered further); a Reply at a
    /// Responder is a wrong key too.
    #[test]
    fn mpa_53_55_74_bad_key_detected_at_the_octet() {
        let now = Instant::now();
        for (good, role) in [
            (&SIW_RPING_REQUEST, Role::Responder),
            (&SIW_RPING_REPLY, Role::Initiator),
        ] {
            for k in 0..16 {
                let mut bad = *good;
                bad[k] ^= 0x80;
                let c = StartupConfig {
                    ird: 1,
                    ord: 1,
                    ..cfg(REV_2, false, false)
                };
                let mut s = match role {
                    Role::Responder => Startup::responder(c, now).unwrap(),
                    Role::Initiator => Startup::initiator(c, now).unwrap(),
                };
                for (j, b) in bad.iter().enumerate() {
                    let r = s.handle_input(now, &[*b]);
                    if j < k {
                        assert_eq!(r, Ok(1));
                    } else {
                        assert_eq!(r, Err(StartupError::BadKey), "key octet {k}");
                        break;
                    }
                }
                failed_with(&s, &StartupError::BadKey);
                assert_eq!(s.handle_input(now, &good[..]), Err(StartupError::BadKey));
            }
        }
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(
            r.handle_input(now, &SIW_RPING_REPLY),
            Err(StartupError::BadKey)
        );
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(
            r.handle_input(now, b"GET / HTTP/1.1\r\n"),
            Err(StartupError::BadKey)
        );
    }

    /// MPA-77: two Initiators wired together both detect the Initiator/
    /// Initiator start-up from the key, with octet-by-octet feeding too.
    #[test]
    fn mpa_77_initiator_initiator() {
        let now = Instant::now();
        let mut a = Startup::initiator(cfg(REV_2, true, false), now).unwrap();
        let mut b = Startup::initiator(
            StartupConfig {
                private_data: b"b".to_vec(),
                ..cfg(REV_1, false, false)
            },
            now,
        )
        .unwrap();
        let fa = a.poll_transmit().unwrap();
        let fb = b.poll_transmit().unwrap();
        assert_eq!(
            b.handle_input(now, &fa),
            Err(StartupError::InitiatorInitiator)
        );
        for (j, x) in fb.iter().enumerate() {
            let r = a.handle_input(now, &[*x]);
            if j + 1 < fb.len() {
                assert_eq!(r, Ok(1));
            } else {
                assert_eq!(r, Err(StartupError::InitiatorInitiator));
            }
        }
        for s in [&mut a, &mut b] {
            failed_with(s, &StartupError::InitiatorInitiator);
            assert_eq!(
                events(s),
                vec![StartupEvent::Failed {
                    error: StartupError::InitiatorInitiator
                }]
            );
        }
        assert_eq!(
            StartupError::InitiatorInitiator.llp_error(),
            Some(LlpError::InvalidRequestReply)
        );
    }

    /// MPA-62, MPA-79: PD_Length above 512 fails as soon as the 20-octet
    /// header is in, without waiting for (or buffering) any Private Data.
    #[test]
    fn mpa_62_79_pd_length_over_512() {
        let now = Instant::now();
        for len in [513u16, 1000, 0xFFFF] {
            for role in [Role::Responder, Role::Initiator] {
                let (kind, mut s) = match role {
                    Role::Responder => (
                        FrameKind::Request,
                        Startup::responder(cfg(REV_2, true, false), now).unwrap(),
                    ),
                    Role::Initiator => (
                        FrameKind::Reply,
                        Startup::initiator(cfg(REV_2, true, false), now).unwrap(),
                    ),
                };
                let mut hdr = raw(kind, 0x10, REV_2, &[]);
                hdr[18..20].copy_from_slice(&len.to_be_bytes());
                assert_eq!(s.handle_input(now, &hdr[..19]), Ok(19));
                let e = StartupError::PdLengthTooLarge {
                    len: usize::from(len),
                };
                assert_eq!(s.handle_input(now, &hdr[19..]), Err(e.clone()));
                failed_with(&s, &e);
                assert_eq!(e.llp_error(), Some(LlpError::InvalidRequestReply));
            }
        }
    }

    /// MPA-62/66/88, mpa.md §7.6: octets behind the Request before our Reply
    /// (same read or a later one, while the ULP decides) are a violation;
    /// after the Reply they are FPDUs, left to the caller.
    #[test]
    fn mpa_88_extra_octets_at_responder() {
        let now = Instant::now();
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        let mut wire = SIW_RPING_REQUEST.to_vec();
        wire.push(0);
        let e = StartupError::ExtraOctets { octets: 1 };
        assert_eq!(r.handle_input(now, &wire), Err(e.clone()));
        failed_with(&r, &e);
        assert_eq!(
            events(&mut r),
            vec![StartupEvent::Failed { error: e.clone() }]
        );
        assert_eq!(
            r.accept(&[], 1, 1),
            Err(StartupError::InvalidState(StartupState::Failed))
        );
        assert_eq!(r.poll_transmit(), None);

        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(r.handle_input(now, &SIW_RPING_REQUEST), Ok(24));
        assert_eq!(r.handle_input(now, &[]), Ok(0));
        assert_eq!(
            r.handle_input(now, &SIW_RPING_FIRST_FPDU),
            Err(StartupError::ExtraOctets { octets: 40 })
        );

        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(r.handle_input(now, &SIW_RPING_REQUEST), Ok(24));
        r.accept(&[], 1, 1).unwrap();
        assert_eq!(r.handle_input(now, &SIW_RPING_FIRST_FPDU), Ok(0));
    }

    /// mpa.md §7.6, MPA-73: octets right behind the Reply. Client-server mode:
    /// left to the caller by default (Linux siw sends them: siw-mpa1-ucmatose
    /// frames 9 and 11), an error when `allow_early_fpdus` is off. Peer-to-
    /// peer mode: always an error (the Responder must wait for our RTR).
    #[test]
    fn initiator_octets_behind_the_reply() {
        let now = Instant::now();
        let mut wire = SIW_MPA1_REPLY.to_vec();
        wire.extend_from_slice(&SIW_MPA1_EARLY_FPDU);
        let mut i = Startup::initiator(cfg(REV_1, false, false), now).unwrap();
        assert!(StartupConfig::default().allow_early_fpdus);
        assert_eq!(i.handle_input(now, &wire), Ok(20));
        let mut d = i.outcome().unwrap().deframer();
        d.push(&wire[20..]);
        assert_eq!(d.next(), Some(Ok(SIW_MPA1_EARLY_FPDU[2..120].to_vec())));

        let strict = StartupConfig {
            allow_early_fpdus: false,
            ..cfg(REV_1, false, false)
        };
        let mut i = Startup::initiator(strict, now).unwrap();
        let e = StartupError::ExtraOctets { octets: 124 };
        assert_eq!(i.handle_input(now, &wire), Err(e.clone()));
        failed_with(&i, &e);

        let p2p = StartupConfig {
            p2p: Some(RtrSet::WRITE_OR_READ),
            ird: 1,
            ord: 1,
            ..cfg(REV_2, false, false)
        };
        let mut i = Startup::initiator(p2p, now).unwrap();
        let mut wire = raw(FrameKind::Reply, 0x10, REV_2, &word(0x8001, 0x8001));
        wire.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(
            i.handle_input(now, &wire),
            Err(StartupError::ExtraOctets { octets: 4 })
        );
    }

    /// RFC 6581: a Rev-2 frame must hold the IRD/ORD word; a Rev-2 *reject*
    /// without it (siw rejects a short Rev-2 Request that way) is still a reject.
    #[test]
    fn rev2_frame_without_word_is_malformed() {
        let now = Instant::now();
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        let e = r
            .handle_input(now, &raw(FrameKind::Request, 0x10, REV_2, &[0, 1, 0]))
            .unwrap_err();
        assert!(matches!(e, StartupError::Malformed(_)), "{e:?}");
        assert_eq!(e.llp_error(), Some(LlpError::InvalidRequestReply));
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        let e = i
            .handle_input(now, &raw(FrameKind::Reply, 0x10, REV_2, &[]))
            .unwrap_err();
        assert!(matches!(e, StartupError::Malformed(_)), "{e:?}");
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(
            i.handle_input(now, &raw(FrameKind::Reply, 0x30, REV_2, &[])),
            Ok(20)
        );
        assert!(
            matches!(&events(&mut i)[..], [StartupEvent::Rejected { private_data, params }] if private_data.is_empty() && params.rev2.is_none())
        );
    }

    /// MPA-59, MPA-60: R in a Request and the Res bits are not checked; Rev 2
    /// without Linux's Res 0x10 is still RFC 6581 (the word is read).
    #[test]
    fn mpa_59_60_r_and_res_not_checked() {
        let now = Instant::now();
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(
            r.handle_input(now, &raw(FrameKind::Request, 0x3F, REV_2, &word(3, 4))),
            Ok(24)
        );
        match &events(&mut r)[..] {
            [
                StartupEvent::RequestReceived {
                    params,
                    private_data,
                },
            ] => {
                assert_eq!(params.res, 0x1F);
                assert_eq!(params.rev2.map(|w| (w.ird, w.ord)), Some((3, 4)));
                assert!(private_data.is_empty());
            }
            e => panic!("{e:?}"),
        }
        r.accept(&[], 4, 4).unwrap();
        assert_eq!(r.outcome().unwrap().ord, 3);
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(
            i.handle_input(now, &raw(FrameKind::Reply, 0x0F, REV_2, &word(5, 6))),
            Ok(24)
        );
        assert_eq!(i.state(), StartupState::FullOperation);
    }

    // -----------------------------------------------------------------------
    // Timeouts and EOF
    // -----------------------------------------------------------------------

    /// MPA-78: two Responders wired together: neither speaks; both time out
    /// at the configured deadline (not a moment earlier).
    #[test]
    fn mpa_78_responder_responder_times_out() {
        let now = Instant::now();
        let c = StartupConfig {
            timeout: secs(3),
            ..cfg(REV_2, true, false)
        };
        let mut a = Startup::responder(c.clone(), now).unwrap();
        let mut b = Startup::responder(c, now).unwrap();
        for s in [&mut a, &mut b] {
            assert_eq!(s.poll_transmit(), None);
            assert_eq!(s.poll_timeout(), Some(now + secs(3)));
            s.handle_timeout(now + secs(3) - Duration::from_nanos(1));
            assert_eq!(s.state(), StartupState::AwaitingRequest);
            s.handle_timeout(now + secs(3));
            let e = StartupError::Timeout { partial_octets: 0 };
            failed_with(s, &e);
            assert_eq!(e.llp_error(), Some(LlpError::TcpConnectionLost));
            assert_eq!(events(s), vec![StartupEvent::Failed { error: e }]);
            assert_eq!(s.poll_timeout(), None);
        }
    }

    /// MPA-80, MPA-62: a peer dribbling one octet per second cannot hold the
    /// startup open past the deadline; a body shorter than PD_Length at the
    /// deadline is an invalid frame.
    #[test]
    fn mpa_80_dribbling_peer_times_out() {
        let now = Instant::now();
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        assert_eq!(i.poll_timeout(), Some(now + DEFAULT_TIMEOUT));
        for k in 0..10u64 {
            let t = now + secs(k);
            i.handle_timeout(t);
            assert_eq!(
                i.handle_input(t, &SIW_RPING_REPLY[k as usize..k as usize + 1]),
                Ok(1)
            );
        }
        i.handle_timeout(now + secs(10));
        let e = StartupError::Timeout { partial_octets: 10 };
        failed_with(&i, &e);
        assert_eq!(e.llp_error(), Some(LlpError::InvalidRequestReply));

        // PD_Length 8, only 4 octets of Private Data before the deadline.
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        let mut short = raw(FrameKind::Request, 0x10, REV_2, &[0, 1, 0, 1, 9, 9, 9, 9]);
        short.truncate(24);
        assert_eq!(r.handle_input(now, &short), Ok(24));
        r.handle_timeout(now + DEFAULT_TIMEOUT);
        failed_with(&r, &StartupError::Timeout { partial_octets: 24 });
    }

    /// The timer is off while the ULP decides and after success.
    #[test]
    fn timer_only_while_waiting_for_the_frame() {
        let now = Instant::now();
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        r.handle_input(now, &SIW_RPING_REQUEST).unwrap();
        assert_eq!(r.poll_timeout(), None);
        r.handle_timeout(now + secs(3600));
        assert_eq!(r.state(), StartupState::AwaitingDecision);
        r.accept(&[], 1, 1).unwrap();
        r.handle_timeout(now + secs(7200));
        assert_eq!(r.state(), StartupState::AwaitingFirstFpdu);
    }

    /// EOF during the exchange fails the startup (code 1, or code 4 with a
    /// partial frame); afterwards it is the data path's business.
    #[test]
    fn eof_during_startup() {
        let now = Instant::now();
        let mut i = Startup::initiator(cfg(REV_2, false, false), now).unwrap();
        i.handle_eof();
        let e = StartupError::ConnectionClosed { partial_octets: 0 };
        failed_with(&i, &e);
        assert_eq!(e.llp_error(), Some(LlpError::TcpConnectionLost));
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        r.handle_input(now, &SIW_RPING_REQUEST[..5]).unwrap();
        r.handle_eof();
        failed_with(&r, &StartupError::ConnectionClosed { partial_octets: 5 });
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        r.handle_input(now, &SIW_RPING_REQUEST).unwrap();
        r.handle_eof();
        failed_with(&r, &StartupError::ConnectionClosed { partial_octets: 0 });
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        r.handle_input(now, &SIW_RPING_REQUEST).unwrap();
        r.accept(&[], 1, 1).unwrap();
        r.handle_eof();
        assert_eq!(r.state(), StartupState::AwaitingFirstFpdu);
    }

    // -----------------------------------------------------------------------
    // Peer-to-peer mode, IRD/ORD (RFC 6581)
    // -----------------------------------------------------------------------

    fn p2p(set: Option<RtrSet>, ird: u16, ord: u16) -> StartupConfig {
        StartupConfig {
            p2p: set,
            ird,
            ord,
            ..cfg(REV_2, false, false)
        }
    }

    /// RFC 6581 peer-to-peer mode: the Initiator offers RTR types, the
    /// Responder picks one (Write, else Read, else Send — siw's order), both
    /// report it; the Initiator must send it first; the Responder may not
    /// transmit before an FPDU arrived (MPA-73).
    #[test]
    fn mpa_73_p2p_rtr_negotiation() {
        let cases = [
            (
                RtrSet::WRITE_OR_READ,
                RtrSet::ALL,
                Rtr::ZeroLengthWrite,
                word(0x8004, 0x8003),
            ),
            (
                RtrSet::only(Rtr::ZeroLengthRead),
                RtrSet::ALL,
                Rtr::ZeroLengthRead,
                word(0x8004, 0x4003),
            ),
            (
                RtrSet::only(Rtr::ZeroLengthSend),
                RtrSet::ALL,
                Rtr::ZeroLengthSend,
                word(0xC004, 0x0003),
            ),
            (
                RtrSet::ALL,
                RtrSet::only(Rtr::ZeroLengthSend),
                Rtr::ZeroLengthSend,
                word(0xC004, 0x0003),
            ),
            (
                RtrSet::ALL,
                RtrSet::WRITE_OR_READ,
                Rtr::ZeroLengthWrite,
                word(0x8004, 0x8003),
            ),
        ];
        for (offer, take, want, reply_word) in cases {
            let run = run(
                p2p(Some(offer), 8, 3),
                p2p(Some(take), 0, 0),
                Ulp::Accept(vec![], 4, 3),
            );
            let req = run.request.unwrap();
            let mut ord_word = 3u16;
            if offer.write {
                ord_word |= 0x8000;
            }
            if offer.read {
                ord_word |= 0x4000;
            }
            let ird_word = 0x8008 | if offer.send { 0x4000 } else { 0 };
            assert_eq!(&req[20..24], &word(ird_word, ord_word));
            assert_eq!(&run.reply.unwrap()[20..24], &reply_word);
            let (io, ro) = (run.i.outcome().unwrap(), run.r.outcome().unwrap());
            assert_eq!((io.rtr, ro.rtr), (Some(want), Some(want)));
            assert_eq!(run.i.rtr_required(), Some(want));
            assert_eq!(run.r.rtr_required(), None);
            assert!(run.i.may_transmit_fpdus());
            let mut r = run.r;
            assert!(!r.may_transmit_fpdus());
            r.fpdu_received();
            assert!(r.may_transmit_fpdus());
            r.fpdu_received();
            assert_eq!(r.state(), StartupState::FullOperation);
        }
        // Client-server mode: nothing to send first.
        let run = run(
            p2p(None, 1, 1),
            p2p(Some(RtrSet::ALL), 0, 0),
            Ulp::Accept(vec![], 1, 1),
        );
        assert_eq!(run.i.rtr_required(), None);
        assert_eq!(run.r.outcome().unwrap().rtr, None);
        assert_eq!(&run.reply.unwrap()[20..24], &word(1, 1));
    }

    /// RFC 6581 "no matching RTR" (LLP code 7): at the Responder when it takes
    /// none of the offered types; at the Initiator when the Reply picks none
    /// of ours (a Responder that declines peer-to-peer mode: Linux siw's
    /// Initiator fails that way too).
    #[test]
    fn p2p_no_matching_rtr() {
        let run1 = run(
            p2p(Some(RtrSet::only(Rtr::ZeroLengthSend)), 1, 1),
            p2p(Some(RtrSet::WRITE_OR_READ), 0, 0),
            Ulp::Accept(vec![], 1, 1),
        );
        failed_with(&run1.r, &StartupError::NoMatchingRtr);
        assert_eq!(run1.reply, None);
        assert_eq!(
            StartupError::NoMatchingRtr.llp_error(),
            Some(LlpError::NoMatchingRtr)
        );
        let run2 = run(
            p2p(Some(RtrSet::ALL), 1, 1),
            p2p(None, 0, 0),
            Ulp::Accept(vec![], 1, 1),
        );
        assert_eq!(&run2.reply.unwrap()[20..24], &word(1, 1));
        failed_with(&run2.i, &StartupError::NoMatchingRtr);
        // A Reply choosing a type we did not offer.
        let now = Instant::now();
        let mut i =
            Startup::initiator(p2p(Some(RtrSet::only(Rtr::ZeroLengthWrite)), 1, 1), now).unwrap();
        let e = i.handle_input(
            now,
            &raw(FrameKind::Reply, 0x10, REV_2, &word(0x8001, 0x4001)),
        );
        assert_eq!(e, Err(StartupError::NoMatchingRtr));
    }

    /// The zero-length Read RTR needs ORD >= 1 at the Initiator (refused
    /// configuration otherwise; siw_connect() forces ORD 1) and an IRD slot
    /// at the Responder (raised to 1); a Reply choosing Read while leaving us
    /// ORD 0 is no match.
    #[test]
    fn p2p_read_rtr_needs_a_read_slot() {
        let now = Instant::now();
        let read = Some(RtrSet::only(Rtr::ZeroLengthRead));
        assert!(matches!(
            Startup::initiator(p2p(read, 1, 0), now),
            Err(StartupError::InvalidConfig(_))
        ));
        let run = run(
            p2p(read, 1, 1),
            p2p(Some(RtrSet::ALL), 0, 0),
            Ulp::Accept(vec![], 0, 0),
        );
        assert_eq!(&run.reply.unwrap()[20..24], &word(0x8001, 0x4000));
        assert_eq!(run.r.outcome().unwrap().ird, 1);
        assert_eq!(run.i.outcome().unwrap().ord, 1);
        assert_eq!(run.i.rtr_required(), Some(Rtr::ZeroLengthRead));
        let mut i = Startup::initiator(p2p(Some(RtrSet::ALL), 1, 1), now).unwrap();
        let e = i.handle_input(
            now,
            &raw(FrameKind::Reply, 0x10, REV_2, &word(0x8000, 0x4000)),
        );
        assert_eq!(e, Err(StartupError::NoMatchingRtr));
    }

    /// Our peer-to-peer Initiator against a Linux siw Responder: siw answers
    /// with P set and the Write RTR (siw_proc_mpareq prefers Write).
    #[test]
    fn p2p_initiator_vs_siw_style_reply() {
        let now = Instant::now();
        let mut i = Startup::initiator(p2p(Some(RtrSet::WRITE_OR_READ), 1, 1), now).unwrap();
        // What siw's own P2P Initiator sends: P | IRD 1, W | R | ORD 1.
        assert_eq!(
            &i.poll_transmit().unwrap()[16..24],
            &[0x10, 2, 0, 4, 0x80, 0x01, 0xC0, 0x01]
        );
        assert_eq!(
            i.handle_input(
                now,
                &raw(FrameKind::Reply, 0x10, REV_2, &word(0x8001, 0x8001))
            ),
            Ok(24)
        );
        assert_eq!(i.rtr_required(), Some(Rtr::ZeroLengthWrite));
    }

    /// RFC 6581 IRD/ORD: each side's ORD is capped by the peer's IRD; a
    /// Responder ORD above our IRD is "insufficient IRD" (LLP code 6), as in
    /// siw_proc_mpareply().
    #[test]
    fn rev2_ird_ord_and_insufficient_ird() {
        let run = run(
            p2p(None, 10, 20),
            p2p(None, 0, 0),
            Ulp::Accept(vec![], 5, 50),
        );
        assert_eq!(&run.reply.unwrap()[20..24], &word(5, 10));
        let (io, ro) = (run.i.outcome().unwrap(), run.r.outcome().unwrap());
        assert_eq!((io.ird, io.ord), (10, 5));
        assert_eq!((ro.ird, ro.ord), (5, 10));
        let now = Instant::now();
        let mut i = Startup::initiator(p2p(None, 2, 2), now).unwrap();
        let e = StartupError::InsufficientIrd {
            ird: 2,
            peer_ord: 3,
        };
        assert_eq!(
            i.handle_input(now, &raw(FrameKind::Reply, 0x10, REV_2, &word(2, 3))),
            Err(e.clone())
        );
        assert_eq!(e.llp_error(), Some(LlpError::InsufficientIrd));
        failed_with(&i, &e);
    }

    // -----------------------------------------------------------------------
    // Real Linux siw frames
    // -----------------------------------------------------------------------

    /// Our Responder takes siw's Requests (rping, CRC, MPA rev 1, NFS, rdmazoo)
    /// and answers with the very octets siw answered with; siw's first FPDU
    /// then releases our transmit side (MPA-73).
    #[test]
    fn siw_requests_accepted_our_reply_matches_capture() {
        let now = Instant::now();
        // (Request, our Private Data, IRD, ORD, siw's Reply, CRC on)
        type Case<'a> = (&'a [u8], &'a [u8], u16, u16, &'a [u8], bool);
        let cases: [Case<'_>; 5] = [
            (&SIW_RPING_REQUEST, &[], 1, 1, &SIW_RPING_REPLY, false),
            (&SIW_CRC_REQUEST, &[], 1, 1, &SIW_CRC_REPLY, true),
            (&SIW_MPA1_REQUEST, &[], 1, 1, &SIW_MPA1_REPLY, false),
            (&NFS3_REQUEST, &NFS3_REPLY[24..], 0, 128, &NFS3_REPLY, false),
            (
                &SEND_INV_REQUEST,
                &SEND_INV_REPLY[24..],
                1,
                1,
                &SEND_INV_REPLY,
                false,
            ),
        ];
        for (req, pd, ird, ord, reply, crc) in cases {
            // Our own preference: no CRC; siw's C=1 switches it on (MPA-30).
            let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
            // Octet by octet, as a slow TCP might deliver it.
            for b in req {
                assert_eq!(r.handle_input(now, &[*b]), Ok(1));
            }
            let rev = req[17];
            let ulp_pd = if rev == REV_2 { &req[24..] } else { &req[20..] };
            match &events(&mut r)[..] {
                [
                    StartupEvent::RequestReceived {
                        private_data,
                        params,
                    },
                ] => {
                    assert_eq!(private_data, ulp_pd);
                    assert_eq!((params.rev, params.crc, params.markers), (rev, crc, false));
                    assert_eq!(params.res, if rev == REV_2 { 0x10 } else { 0 });
                }
                e => panic!("{e:?}"),
            }
            r.accept(pd, ird, ord).unwrap();
            assert_eq!(r.poll_transmit().unwrap(), reply, "Reply to {req:02x?}");
            let o = r.outcome().unwrap().clone();
            assert_eq!((o.rev, o.crc, o.ird, o.ord), (rev, crc, ird, ord));
            assert!(!r.may_transmit_fpdus());
        }
        // siw-rping: the Initiator's first FPDU follows; it is an FPDU, not ours.
        let mut r = Startup::responder(cfg(REV_2, false, false), now).unwrap();
        r.handle_input(now, &SIW_RPING_REQUEST).unwrap();
        r.accept(&[], 1, 1).unwrap();
        assert_eq!(r.handle_input(now, &SIW_RPING_FIRST_FPDU), Ok(0));
        let mut d = r.outcome().unwrap().deframer();
        d.push(&SIW_RPING_FIRST_FPDU);
        assert_eq!(d.next(), Some(Ok(SIW_RPING_FIRST_FPDU[2..36].to_vec())));
        r.fpdu_received();
        assert!(r.may_transmit_fpdus());
    }

    /// Our Initiator sends siw's Requests byte for byte for the same settings
    /// and takes siw's Replies.
    #[test]
    fn siw_replies_accepted_our_request_matches_capture() {
        let now = Instant::now();
        let c = |rev, crc, ird, ord, pd: &[u8]| StartupConfig {
            rev,
            crc,
            ird,
            ord,
            private_data: pd.to_vec(),
            ..cfg(rev, crc, false)
        };
        // (our configuration, siw's Request, siw's Reply, CRC on, IRD, ORD)
        type Case<'a> = (StartupConfig, &'a [u8], &'a [u8], bool, u16, u16);
        let cases: [Case<'_>; 5] = [
            (
                c(REV_2, false, 1, 1, &[]),
                &SIW_RPING_REQUEST,
                &SIW_RPING_REPLY,
                false,
                1,
                1,
            ),
            (
                c(REV_2, true, 1, 1, &[]),
                &SIW_CRC_REQUEST,
                &SIW_CRC_REPLY,
                true,
                1,
                1,
            ),
            (
                c(REV_1, false, 1, 1, &[]),
                &SIW_MPA1_REQUEST,
                &SIW_MPA1_REPLY,
                false,
                1,
                1,
            ),
            (
                c(REV_2, false, 128, 0, &NFS3_REQUEST[24..]),
                &NFS3_REQUEST,
                &NFS3_REPLY,
                false,
                128,
                0,
            ),
            (
                c(REV_2, false, 1, 1, &SEND_INV_REQUEST[24..]),
                &SEND_INV_REQUEST,
                &SEND_INV_REPLY,
                false,
                1,
                1,
            ),
        ];
        for (config, req, reply, crc, ird, ord) in cases {
            let mut i = Startup::initiator(config, now).unwrap();
            assert_eq!(i.poll_transmit().unwrap(), req);
            assert_eq!(i.handle_input(now, reply), Ok(reply.len()));
            let o = i.outcome().unwrap();
            let rev = reply[17];
            let pd = if rev == REV_2 {
                &reply[24..]
            } else {
                &reply[20..]
            };
            assert_eq!(
                (o.rev, o.crc, o.ird, o.ord, o.markers_tx, o.markers_rx),
                (rev, crc, ird, ord, false, false)
            );
            assert_eq!(o.peer_private_data, pd);
            assert!(i.may_transmit_fpdus());
        }
        // MPA-30: we asked for no CRC, siw's Reply says C=1: CRCs on.
        let mut i = Startup::initiator(c(REV_2, false, 1, 1, &[]), now).unwrap();
        i.handle_input(now, &SIW_CRC_REPLY).unwrap();
        assert!(i.outcome().unwrap().crc);
    }

    // -----------------------------------------------------------------------
    // Startup then Full Operation
    // -----------------------------------------------------------------------

    /// MPA-68, MPA-72, MPA-73, MPA-49: after the exchange both ends frame
    /// with the negotiated settings from SeqStart; the Responder's first
    /// transmission waits for the Initiator's first FPDU; every Markers × CRC
    /// combination round-trips.
    #[test]
    fn mpa_73_startup_then_full_operation() {
        let now = Instant::now();
        for bits in 0u8..16 {
            let (ci, cr, mi, mr) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0);
            let mut i = Startup::initiator(cfg(REV_2, ci, mi), now).unwrap();
            let mut r = Startup::responder(cfg(REV_2, cr, mr), now).unwrap();
            // The Initiator's stream: Request, then (once accepted) FPDUs.
            let req = i.poll_transmit().unwrap();
            r.handle_input(now, &req).unwrap();
            r.accept(b"ok", 16, 16).unwrap();
            let reply = r.poll_transmit().unwrap();
            assert_eq!(i.handle_input(now, &reply), Ok(reply.len()));
            let (io, ro) = (i.outcome().unwrap().clone(), r.outcome().unwrap().clone());
            let mut ifr = io.framer(mpa_mulpdu());
            let mut rfr = ro.framer(mpa_mulpdu());
            let (mut idf, mut rdf): (Deframer, Deframer) = (io.deframer(), ro.deframer());
            assert!(i.may_transmit_fpdus() && !r.may_transmit_fpdus());
            let mut to_r = Vec::new();
            for k in 0..5 {
                ifr.frame(&[&pattern(300 + 97 * k, u64::from(k as u8))], &mut to_r)
                    .unwrap();
            }
            // All of it in one read: nothing is startup.
            assert_eq!(r.handle_input(now, &to_r), Ok(0));
            for cut in to_r.chunks(77) {
                rdf.push(cut);
                for u in rdf.by_ref() {
                    assert!(u.is_ok());
                    r.fpdu_received();
                }
            }
            assert_eq!(rdf.delivered(), 5);
            assert!(r.may_transmit_fpdus());
            let mut to_i = Vec::new();
            rfr.frame(&[b"pong"], &mut to_i).unwrap();
            if mi {
                assert_eq!(&to_i[..4], &[0, 0, 0, 0], "MPA-22: first Marker");
            }
            idf.push(&to_i);
            assert_eq!(idf.next(), Some(Ok(b"pong".to_vec())));
        }
    }

    fn mpa_mulpdu() -> u16 {
        crate::framing::mulpdu(1448, false)
    }

    // -----------------------------------------------------------------------
    // API misuse and configuration
    // -----------------------------------------------------------------------

    #[test]
    fn invalid_configuration_and_calls() {
        let now = Instant::now();
        for c in [
            cfg(0, true, false),
            cfg(3, true, false),
            StartupConfig {
                p2p: Some(RtrSet::ALL),
                ..cfg(REV_1, true, false)
            },
            StartupConfig {
                p2p: Some(RtrSet::NONE),
                ..cfg(REV_2, true, false)
            },
            StartupConfig {
                ird: 0x4000,
                ..cfg(REV_2, true, false)
            },
            StartupConfig {
                ord: 0x4000,
                ..cfg(REV_2, true, false)
            },
        ] {
            let e = Startup::initiator(c, now).unwrap_err();
            assert!(matches!(e, StartupError::InvalidConfig(_)), "{e:?}");
            assert_eq!(e.llp_error(), None);
            assert!(!e.is_fatal());
        }
        // Rev 1 sends no IRD/ORD: any value is fine.
        assert!(
            Startup::initiator(
                StartupConfig {
                    ird: u16::MAX,
                    ..cfg(REV_1, true, false)
                },
                now
            )
            .is_ok()
        );
        // A Responder ignores Private Data and IRD/ORD in its configuration.
        assert!(
            Startup::responder(
                StartupConfig {
                    private_data: vec![0; 600],
                    ..cfg(REV_2, true, false)
                },
                now
            )
            .is_ok()
        );
        let mut i = Startup::initiator(cfg(REV_2, true, false), now).unwrap();
        assert_eq!(i.role(), Role::Initiator);
        assert_eq!(
            i.accept(&[], 1, 1),
            Err(StartupError::InvalidState(StartupState::AwaitingReply))
        );
        assert_eq!(
            i.reject(&[]),
            Err(StartupError::InvalidState(StartupState::AwaitingReply))
        );
        let mut r = Startup::responder(cfg(REV_2, true, false), now).unwrap();
        assert_eq!(
            r.accept(&[], 1, 1),
            Err(StartupError::InvalidState(StartupState::AwaitingRequest))
        );
        r.handle_input(now, &SIW_RPING_REQUEST).unwrap();
        assert!(matches!(
            r.accept(&[], 0x4000, 1),
            Err(StartupError::InvalidConfig(_))
        ));
        assert_eq!(r.state(), StartupState::AwaitingDecision);
        r.accept(&[], 1, 1).unwrap();
        assert_eq!(
            r.accept(&[], 1, 1),
            Err(StartupError::InvalidState(StartupState::AwaitingFirstFpdu))
        );
        assert_eq!(r.config().rev, REV_2);
    }

    // -----------------------------------------------------------------------
    // Property tests
    // -----------------------------------------------------------------------

    fn feed_all(s: &mut Startup, data: &[u8]) -> (usize, Option<StartupError>) {
        match s.handle_input(Instant::now(), data) {
            Ok(n) => (n, None),
            Err(e) => (0, Some(e)),
        }
    }

    fn feed_octets(s: &mut Startup, data: &[u8]) -> (usize, Option<StartupError>) {
        let mut used = 0;
        for b in data {
            match s.handle_input(Instant::now(), &[*b]) {
                Ok(n) => used += n,
                Err(e) => return (0, Some(e)),
            }
        }
        (used, None)
    }

    fn arb_input() -> impl Strategy<Value = Vec<u8>> {
        (
            proptest::collection::vec(any::<u8>(), 0..600),
            0u8..4,
            any::<u8>(),
            0u16..600,
        )
            .prop_map(|(mut v, key, rev, pdl)| {
                // Steer most cases past the key check.
                if v.len() >= 20 && key > 0 {
                    let k = if key == 1 { REQUEST_KEY } else { REPLY_KEY };
                    v[..16].copy_from_slice(&k);
                    v[17] = rev % 4;
                    v[18..20].copy_from_slice(&pdl.to_be_bytes());
                }
                v
            })
    }

    proptest! {
        /// MPA-79, MPA-66/70: arbitrary octets never panic either role; the
        /// consumed count never exceeds the input; octet-by-octet feeding
        /// ends in the same state, error kind and consumed count.
        #[test]
        fn prop_arbitrary_input(data in arb_input(), initiator: bool, rev2: bool) {
            let now = Instant::now();
            let c = cfg(if rev2 { REV_2 } else { REV_1 }, false, false);
            let mk = |c: StartupConfig| if initiator {
                Startup::initiator(c, now).unwrap()
            } else {
                Startup::responder(c, now).unwrap()
            };
            let (mut a, mut b) = (mk(c.clone()), mk(c));
            let (na, ea) = feed_all(&mut a, &data);
            let (nb, eb) = feed_octets(&mut b, &data);
            prop_assert!(na <= data.len());
            prop_assert_eq!(a.state(), b.state());
            prop_assert_eq!(ea.as_ref().map(discriminant), eb.as_ref().map(discriminant));
            if ea.is_none() {
                prop_assert_eq!(na, nb);
                prop_assert!(na <= 20 + 512);
            }
            if a.state() == StartupState::AwaitingDecision {
                prop_assert!(a.accept(&[], 1, 1).is_ok());
            }
        }

        /// RFC 6581 peer-to-peer mode with random offers: either both ends
        /// agree on one RTR from both sets, or exactly one end fails with
        /// "no matching RTR".
        #[test]
        fn prop_p2p_random_sets(offer in (any::<bool>(), any::<bool>(), any::<bool>()), take in proptest::option::of((any::<bool>(), any::<bool>(), any::<bool>()))) {
            let offer = RtrSet { send: offer.0, write: offer.1, read: offer.2 };
            let take = take.map(|t| RtrSet { send: t.0, write: t.1, read: t.2 });
            prop_assume!(!offer.is_empty() && take.is_none_or(|t| !t.is_empty()));
            let run = run(p2p(Some(offer), 1, 1), p2p(take, 0, 0), Ulp::Accept(vec![], 1, 1));
            let common = take.map(|t| t.intersection(offer));
            match common {
                Some(c) if !c.is_empty() => {
                    let want = c.preferred();
                    prop_assert_eq!(run.i.outcome().unwrap().rtr, want);
                    prop_assert_eq!(run.r.outcome().unwrap().rtr, want);
                    prop_assert!(offer.contains(want.unwrap()));
                }
                Some(_) => prop_assert_eq!(run.r.error(), Some(&StartupError::NoMatchingRtr)),
                None => prop_assert_eq!(run.i.error(), Some(&StartupError::NoMatchingRtr)),
            }
        }
    }
}
