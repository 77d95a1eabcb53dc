//! The DDP/RDMAP data path of one queue pair (RFC 5040, RFC 5041), sans-IO.
//!
//! [`RdmapEngine`] works on ULPDUs: MPA (framing, CRC, markers) is below it and hands it one
//! ULPDU at a time ([`handle_ulpdu`](RdmapEngine::handle_ulpdu)); it hands back ULPDUs of at
//! most MULPDU octets ([`poll_ulpdu`](RdmapEngine::poll_ulpdu)). It never touches a socket, a
//! clock or a thread.
//!
//! ```text
//!  post_send ─► send queue ─► DDP segments (QN 0 Send / Immediate Data, QN 1 Read or Atomic
//!                             Request, tagged Write) ─────────────────────────────────────┐
//!  inbound Read / Atomic Requests (≤ IRD) ─► Read Response segments (tagged), Atomic      │
//!                                            Responses (QN 3), in request order ──────────┤─► poll_ulpdu
//!  first error ─► one Terminate (QN 2), then nothing (RDMAP-73) ──────────────────────────┘
//!  handle_ulpdu ─► DV / QN / RV / opcode checks ─► tagged placement (check_remote per segment)
//!                                              └─► untagged: QN 0 receive WQE, QN 1 IRD slot, QN 2,
//!                                                  QN 3 outstanding atomic
//! ```
//!
//! Decisions (see `docs/spec/rdmap.md` for the ambiguities they settle):
//! * Local completions in submission order (RDMAP-81): a Send or Write completes when its last
//!   segment was handed out (RDMAP-80, ambiguity 8), a Read when its response was placed
//!   (RDMAP-85, RDMAP-87); a completion waits for every earlier one.
//! * Memory is reached only through `softrdma_memory`: every tagged segment through
//!   `KeyTable::check_remote`; receive, gather and Read sink buffers through the grants
//!   `KeyTable::check_local` gave at post time, which the memory crate re-validates on every
//!   copy, so a key revoked mid-message stops placement at once (RDMAP-120).
//! * The tagged and untagged receive contexts are separate (a Read Response may interleave
//!   with a Send). On transmit a Read Response interleaves segment by segment with untagged
//!   messages, never with an RDMA Write (two tagged messages are never interleaved; Linux siw
//!   relies on that).
//! * Errors follow RFC 5040 §7: the first one (RDMAP-102) produces exactly one Terminate
//!   (RDMAP-69), sent before anything else and followed by nothing (RDMAP-73); the QP goes to
//!   Error and every pending request is flushed (RDMAP-72, RDMAP-93). Terminates are emitted in
//!   the RFC 5040 layout; received ones are read in either layout (`TerminateLayout::detect`).
//! * The Terminate's DDP Segment Length is the length DDP handed up: the segment's octets after
//!   its DDP header (RFC 5040 §4.8).
//!
//! RFC 7306 (atomics, immediate data) between two softrdma peers. Nothing is negotiated: Linux
//! siw never sends these messages, and they go out only when the ULP posts one of the four
//! verbs operations below.
//! * Atomics (RFC 7306 §5): an Atomic Request on QN 1, sharing the Read Request MSN sequence,
//!   ORD at the requester and the IRD slots at the responder with RDMA Reads (a QN 1 buffer
//!   is an IRD slot); Request Identifier = the request's QN 1 MSN. The responder checks the
//!   target through `check_remote` (`REMOTE_ATOMIC`, 8 octets, 8-aligned), executes it once,
//!   when the request is accepted in order (in order with Sends and Writes, IBT-C9-28), and
//!   queues the Atomic Response (QN 3, own MSN) behind earlier Read Responses. The requester
//!   matches each response to its oldest outstanding atomic by MSN and Request Identifier,
//!   places the original value (host order) into the 8-octet sink and completes
//!   `FetchAdd` / `CompSwap`. A fence waits for Reads and atomics (IBT-C9-31). Executed: FetchAdd
//!   with Add Mask 0 and CmpSwap with all-ones Compare and Swap Masks (the verbs forms);
//!   Swap, other masks and undefined codes are refused (0/2/0x06).
//! * Immediate Data (RFC 7306 §6): QN 0 messages of 8 octets that take an untagged buffer
//!   (a receive WQE). The octets are ULP data to RDMAP; this ULP (the verbs layer) puts the
//!   32-bit immediate, big-endian, in octets 0..4 and a word in octets 4..8 (see
//!   [`IMM_SEND_FOLLOWS`]). Write with immediate = RDMA Write, then Immediate Data whose word
//!   is the Write's length: the WQE completes `RecvRdmaWithImm` with `byte_len` = that length,
//!   as InfiniBand reports it (nothing is placed in the receive buffer, IBT-X-08). Send with
//!   immediate = Immediate Data with the word's `IMM_SEND_FOLLOWS` bit, which takes the WQE,
//!   then the Send, placed in that same WQE, which completes `Recv` with the immediate and the
//!   Send's `byte_len`: one WQE per verbs operation, as the verbs user expects (the two
//!   messages use two QN 0 MSNs). The solicited flag makes the Immediate Data 0x9. The sender
//!   completes once, after its last message.

use std::collections::VecDeque;
use std::sync::Arc;

use softrdma_memory::{Key, KeyTable, PdId, QpId, Target};
use softrdma_wire::mpa;
use softrdma_wire::rdmap::{AtomicResponseRepr, LlpError, ReadRequestRepr, TerminateRepr};

use crate::verbs_types::{
    CheckedRecv, CheckedSend, IWARP_MAX_MESSAGE, Payload, PostError, RecvWr, SendFlags, SendLimits,
    SendWr, Sgl, WcOpcode, WcStatus, WorkCompletion, WrOpcode, check_recv,
};

mod rx;
mod term;
mod tx;

#[cfg(test)]
mod tests;

pub use term::status_for_terminate;

/// RFC 5044 §3: smallest MULPDU (MPA-06).
pub const MIN_MULPDU: u16 = mpa::MULPDU_MIN;
/// RFC 5044 §3: largest MULPDU (MPA-07).
pub const MAX_MULPDU: u16 = mpa::MAX_ULPDU as u16;

/// Parameters of one queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Protection domain: every key this QP uses must belong to it (RDMAP-115).
    pub pd: PdId,
    /// The QP (RDMAP stream) id, for type 2 windows (RDMAP-116).
    pub qp: QpId,
    /// Largest ULPDU MPA accepts (RFC 5044 §3); clamped to `[128, 64768]`.
    pub mulpdu: u16,
    /// Inbound RDMA Read Requests this side serves at a time (RDMAP-52, RDMAP-91).
    pub ird: u16,
    /// Outbound RDMA Read Requests outstanding at a time (RDMAP-90).
    pub ord: u16,
    /// Send queue depth: requests posted and not yet completed.
    pub sq_depth: u32,
    /// Receive queue depth.
    pub rq_depth: u32,
    /// Scatter/gather entries per request.
    pub max_sge: u32,
    /// Largest `INLINE` send.
    pub max_inline: u32,
    /// Negotiated RDMAP version (RV): 1 for RFC 5040, 0 for RDMA Consortium peers (MPA Rev 0).
    pub rdmap_version: u8,
}

impl QpConfig {
    /// Defaults: MULPDU for a 1460-octet MSS without markers, IRD = ORD = 16, queue depths
    /// 256, 16 SGEs, 256 octets inline, RV 1.
    pub fn new(pd: PdId, qp: QpId) -> QpConfig {
        QpConfig {
            pd,
            qp,
            mulpdu: mpa::mulpdu(1460, false),
            ird: 16,
            ord: 16,
            sq_depth: 256,
            rq_depth: 256,
            max_sge: 16,
            max_inline: 256,
            rdmap_version: softrdma_wire::rdmap::RDMAP_VERSION,
        }
    }
}

/// QP state as RDMAP sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamState {
    /// Full operation: data moves both ways.
    Rts,
    /// An error was detected and a Terminate waits for `poll_ulpdu`; nothing else is sent.
    Terminating,
    /// The stream is dead (Terminate sent or received, or the LLP failed); the driver should
    /// close the connection (RDMAP-94, RDMAP-97). Posts are flushed at once.
    Error,
    /// [`close`](RdmapEngine::close)d by the ULP.
    Closed,
}

/// Asynchronous events (errors not tied to one work request, and the Terminate contents the
/// ULP must see: RDMAP-70, RDMAP-98).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpEvent {
    /// This side detected an error; the Terminate describing it is queued (RDMAP-99..102).
    LocalError(TerminateRepr),
    /// The peer's Terminate (RDMAP-70): the stream is dead.
    TerminateReceived(TerminateRepr),
    /// A Terminate that could not be parsed or validated (RDMAP-71): the stream is dead and no
    /// Terminate is sent back.
    InvalidTerminate,
    /// MPA or TCP failed below (RDMAP-92); a Terminate with Layer LLP is queued unless the
    /// connection is gone.
    LlpError(LlpError),
}

/// Per-QP counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StreamCounters {
    /// ULPDUs handed out by `poll_ulpdu`.
    pub ulpdus_tx: u64,
    /// ULPDUs given to `handle_ulpdu`.
    pub ulpdus_rx: u64,
    /// Payload octets sent (Send, Write, Read Response).
    pub payload_tx: u64,
    /// Payload octets placed (Send, Write, Read Response).
    pub payload_rx: u64,
    /// Of those, octets placed straight from the LLP before their segment was handed over
    /// (the connection's direct placement, [`RdmapEngine::handle_placed`]).
    pub payload_rx_direct: u64,
    /// Inbound ULPDUs ignored because the stream was already terminating or closed.
    pub dropped_rx: u64,
    /// Terminates sent.
    pub terminates_tx: u64,
    /// Terminates received.
    pub terminates_rx: u64,
}

/// Counters of several streams, summed.
impl std::ops::AddAssign for StreamCounters {
    fn add_assign(&mut self, o: StreamCounters) {
        self.ulpdus_tx += o.ulpdus_tx;
        self.ulpdus_rx += o.ulpdus_rx;
        self.payload_tx += o.payload_tx;
        self.payload_rx += o.payload_rx;
        self.payload_rx_direct += o.payload_rx_direct;
        self.dropped_rx += o.dropped_rx;
        self.terminates_tx += o.terminates_tx;
        self.terminates_rx += o.terminates_rx;
    }
}

/// The word in octets 4..8 of our Immediate Data: this bit set means "a Send follows and
/// belongs to the same receive WQE" (Send with immediate); clear, the other 31 bits are the
/// length of the RDMA Write it follows (Write with immediate).
pub const IMM_SEND_FOLLOWS: u32 = 0x8000_0000;
/// Longest RDMA Write with immediate: its length must fit the word's 31 bits.
pub const MAX_WRITE_WITH_IMM: u32 = IMM_SEND_FOLLOWS - 1;

/// The 8 octets of an Immediate Data message (RFC 7306 §6) as this ULP fills them.
fn imm_octets(imm: u32, word: u32) -> [u8; 8] {
    let mut o = [0u8; 8];
    o[..4].copy_from_slice(&imm.to_be_bytes());
    o[4..].copy_from_slice(&word.to_be_bytes());
    o
}

#[derive(Debug)]
enum SqOp {
    Send {
        solicited: bool,
        invalidate: Option<Key>,
    },
    Write {
        rkey: Key,
        raddr: u64,
    },
    Read {
        rkey: Key,
        raddr: u64,
        sink_stag: Key,
        sink_to: u64,
        /// `None` for a zero-length Read without an entry.
        sink: Option<Target>,
    },
    /// RFC 7306 §5: one Atomic Request.
    Atomic {
        rkey: Key,
        raddr: u64,
        op: AtomicOp,
        /// The 8-octet local entry for the original value (taken when the request goes out).
        sink: Option<Target>,
    },
    /// RDMA Write, then Immediate Data carrying `imm` and the Write's length.
    WriteImm {
        rkey: Key,
        raddr: u64,
        imm: u32,
        solicited: bool,
        /// Every Write segment went out; the Immediate Data is next.
        data_done: bool,
    },
    /// Local Invalidate or Bind Memory Window: runs on the key table once it is the oldest
    /// request ([`RdmapEngine::retire`]); nothing goes on the wire.
    Local(WrOpcode),
    /// Immediate Data announcing a Send, then the Send.
    SendImm {
        imm: u32,
        solicited: bool,
        /// The Immediate Data went out; the Send's segments are next.
        imm_done: bool,
    },
}

/// The atomic operations the verbs post (IBA §9.4.5 semantics, RFC 7306 §5 encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtomicOp {
    FetchAdd { add: u64 },
    CmpSwap { compare: u64, swap: u64 },
}

impl SqOp {
    fn wc_opcode(&self) -> WcOpcode {
        match self {
            SqOp::Send { .. } | SqOp::SendImm { .. } => WcOpcode::Send,
            SqOp::Write { .. } | SqOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            SqOp::Read { .. } => WcOpcode::RdmaRead,
            SqOp::Atomic {
                op: AtomicOp::FetchAdd { .. },
                ..
            } => WcOpcode::FetchAdd,
            SqOp::Atomic {
                op: AtomicOp::CmpSwap { .. },
                ..
            } => WcOpcode::CompSwap,
            SqOp::Local(op) => op.wc_opcode(),
        }
    }

    /// Part of this request is already on the wire although no data segment is half sent
    /// (`sq_tx_off` is 0): the Write of a Write with immediate, or the Immediate Data of a
    /// Send with immediate.
    fn partly_sent(&self) -> bool {
        matches!(
            self,
            SqOp::WriteImm {
                data_done: true,
                ..
            } | SqOp::SendImm { imm_done: true, .. }
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SqState {
    /// Not (completely) handed to DDP yet.
    Queued,
    /// Read Request sent, response not yet complete.
    Outstanding,
    Done(WcStatus),
}

#[derive(Debug)]
struct SqEntry {
    /// Position in submission order (never reused).
    seq: u64,
    wr_id: u64,
    op: SqOp,
    data: Payload,
    len: u32,
    signaled: bool,
    fence: bool,
    state: SqState,
    /// Ordinal of the ULPDU that carried its last octets; it completes once that one is
    /// released ([`RdmapEngine::release_transmitted`]).
    tx_ord: u64,
    /// Posted by the engine itself ([`RdmapEngine::nudge`]): never completes to the ULP and
    /// takes no place of the ULP's in the queue.
    internal: bool,
}

/// Where a segment's payload goes ([`RdmapEngine::placement`]): pieces of registered memory
/// (target, offset in it, octets), in payload order.
#[derive(Debug, Clone)]
pub struct Placement {
    pieces: smallvec::SmallVec<[(Target, usize, usize); 2]>,
}

impl Placement {
    /// The pieces, in payload order.
    pub fn pieces(&self) -> &[(Target, usize, usize)] {
        &self.pieces
    }
}

/// Payload octets placed straight from the LLP before their segment was handed over;
/// `ok` false when the memory refused them.
#[derive(Debug, Clone, Copy)]
struct Placed {
    len: usize,
    ok: bool,
}

/// A received segment's payload: in its ULPDU, or placed already.
#[derive(Debug, Clone, Copy)]
enum RxPayload<'a> {
    Here(&'a [u8]),
    Placed(Placed),
}

impl<'a> RxPayload<'a> {
    /// The payload a segment's body holds, or the one placed behind its headers.
    fn of(payload: &'a [u8], placed: Option<Placed>) -> RxPayload<'a> {
        match placed {
            Some(p) if payload.is_empty() => RxPayload::Placed(p),
            _ => RxPayload::Here(payload),
        }
    }

    fn len(&self) -> usize {
        match self {
            RxPayload::Here(p) => p.len(),
            RxPayload::Placed(p) => p.len,
        }
    }

    /// Places the octets with `place` unless there are none or they are placed already.
    fn place(
        &self,
        place: impl FnOnce(&[u8]) -> Result<(), softrdma_memory::AccessError>,
    ) -> Result<(), softrdma_memory::AccessError> {
        match *self {
            RxPayload::Here([]) => Ok(()),
            RxPayload::Here(p) => place(p),
            RxPayload::Placed(Placed { ok: true, .. }) => Ok(()),
            RxPayload::Placed(Placed { ok: false, .. }) => {
                Err(softrdma_memory::AccessError::Invalidated)
            }
        }
    }
}

/// An RDMA Read this side sent and whose response is not complete (ORD accounting).
#[derive(Debug)]
struct OutboundRead {
    seq: u64,
    /// MSN of its Read Request on QN 1 (to match a Terminate's DDP header).
    msn: u32,
    sink_stag: Key,
    sink_to: u64,
    len: u32,
    received: u32,
    sink: Option<Target>,
}

/// An Atomic Request this side sent and whose response has not arrived (ORD accounting).
#[derive(Debug)]
struct OutboundAtomic {
    seq: u64,
    /// MSN of its Atomic Request on QN 1, which is also its Request Identifier.
    msn: u32,
    sink: Option<Target>,
}

/// One IRD slot in use: a response this side owes, in request order (RFC 5040 §5.2.2,
/// RFC 7306 §5).
#[derive(Debug)]
enum Response {
    Read(InboundRead),
    /// An executed Atomic Request: the Atomic Response to send.
    Atomic(AtomicResponseRepr),
}

/// An inbound RDMA Read Request being answered (IRD accounting).
#[derive(Debug)]
struct InboundRead {
    req: ReadRequestRepr,
    /// The request's DDP header and length, for a Terminate (RDMAP-101).
    ddp: softrdma_wire::ddp::Repr,
    seg_len: u16,
    /// Validated source (`None` for a zero-length Read, RDMAP-50).
    source: Option<Target>,
    sent: u32,
}

#[derive(Debug)]
struct RecvEntry {
    wr_id: u64,
    sgl: Sgl,
}

/// The Send being received on QN 0 and the receive WQE it consumed.
#[derive(Debug)]
struct ActiveRecv {
    entry: RecvEntry,
    received: u32,
    /// The immediate (and its solicited flag) of the Immediate Data that took this WQE and
    /// announced the Send (Send with immediate).
    imm: Option<(u32, bool)>,
}

/// One queue pair's DDP/RDMAP state.
#[derive(Debug)]
pub struct RdmapEngine {
    cfg: QpConfig,
    keys: Arc<KeyTable>,
    state: StreamState,
    /// `close` was called while the Terminate was still queued.
    closing: bool,

    // Send queue (RFC 5040 §5.5 rules 13-15).
    sq: VecDeque<SqEntry>,
    /// Of `sq`, the entries the engine posted itself.
    sq_internal: usize,
    next_seq: u64,
    /// Index in `sq` of the message being (or next to be) segmented.
    sq_tx: usize,
    /// Octets of `sq[sq_tx]` already segmented.
    sq_tx_off: u32,
    /// Next MSN on QN 0, 1 and 3, by QN (RFC 5041 §5.1: from 1, modulo 2^32); QN 2 is
    /// unused (the one Terminate always has MSN 1).
    tx_msn: [u32; 4],
    outbound_reads: VecDeque<OutboundRead>,
    outbound_atomics: VecDeque<OutboundAtomic>,

    // Responder (RFC 5040 §5.2.2, RFC 7306 §5): Read Responses and Atomic Responses owed.
    responses: VecDeque<Response>,
    /// Round-robin between Read Responses and the send queue.
    prefer_responder: bool,

    // Receive side.
    rq: VecDeque<RecvEntry>,
    rx_send: Option<ActiveRecv>,
    /// Next expected MSN on QN 0, 1, 2, 3.
    rx_msn: [u32; 4],

    // Terminate (RFC 5040 §5.4).
    term_pending: Option<TerminateRepr>,
    term_sent: Option<TerminateRepr>,
    term_received: Option<TerminateRepr>,
    /// A Terminate (valid or not) arrived: later ones are ignored.
    term_rx_seen: bool,

    /// ULPDUs emitted, and the number of them whose octets the LLP has taken (RDMAP-80:
    /// a request completes once its last octet is handed over, not when it is framed).
    tx_emitted: u64,
    tx_released: u64,

    completions: VecDeque<WorkCompletion>,
    events: VecDeque<QpEvent>,
    counters: StreamCounters,
}

impl RdmapEngine {
    /// An engine in [`StreamState::Rts`] (MPA negotiation is over). `cfg.mulpdu` is clamped to
    /// RFC 5044's bounds.
    pub fn new(cfg: QpConfig, keys: Arc<KeyTable>) -> RdmapEngine {
        let mut cfg = cfg;
        cfg.mulpdu = cfg.mulpdu.clamp(MIN_MULPDU, MAX_MULPDU);
        cfg.rdmap_version &= 0x3;
        RdmapEngine {
            cfg,
            keys,
            state: StreamState::Rts,
            closing: false,
            sq: VecDeque::new(),
            sq_internal: 0,
            next_seq: 0,
            sq_tx: 0,
            sq_tx_off: 0,
            tx_msn: [1; 4],
            outbound_reads: VecDeque::new(),
            outbound_atomics: VecDeque::new(),
            responses: VecDeque::new(),
            prefer_responder: true,
            rq: VecDeque::new(),
            rx_send: None,
            rx_msn: [1; 4],
            term_pending: None,
            term_sent: None,
            term_received: None,
            term_rx_seen: false,
            tx_emitted: 0,
            tx_released: 0,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            counters: StreamCounters::default(),
        }
    }

    /// Apply what the connection negotiated before data moves: the MULPDU of
    /// the path (RFC 5044 §4.5) and the IRD/ORD agreed in MPA (RFC 6581).
    /// `mulpdu` is clamped to [`MIN_MULPDU`, `MAX_MULPDU`].
    pub fn set_limits(&mut self, mulpdu: u16, ird: u16, ord: u16) {
        self.cfg.mulpdu = mulpdu.clamp(MIN_MULPDU, MAX_MULPDU);
        self.cfg.ird = ird;
        self.cfg.ord = ord;
    }

    /// The RDMAP version MPA negotiated (RV of every RDMAP header, RDMAP-105), before data
    /// moves.
    pub fn set_rdmap_version(&mut self, rv: u8) {
        self.cfg.rdmap_version = rv & 0x3;
    }

    /// `true` when `ulpdu` is the first segment of a Send (untagged, QN 0, MO 0) and no
    /// receive is posted for it while the stream is up: the moment a shared receive queue
    /// hands this QP a buffer, before [`handle_ulpdu`](Self::handle_ulpdu).
    pub fn needs_recv(&self, ulpdu: &[u8]) -> bool {
        self.state == StreamState::Rts
            && self.rq_len() == 0
            && matches!(
                softrdma_wire::ddp::Repr::parse(ulpdu),
                Ok(softrdma_wire::ddp::Repr::Untagged { qn: 0, mo: 0, .. })
            )
    }

    /// The configuration in effect (after clamping).
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Current state.
    pub fn state(&self) -> StreamState {
        self.state
    }

    /// Counters.
    pub fn counters(&self) -> StreamCounters {
        self.counters
    }

    /// The Terminate this side generated (queued or sent), if any.
    pub fn terminate_sent(&self) -> Option<&TerminateRepr> {
        self.term_sent.as_ref()
    }

    /// The Terminate the peer sent, if one arrived.
    pub fn terminate_received(&self) -> Option<&TerminateRepr> {
        self.term_received.as_ref()
    }

    /// Outbound RDMA Reads whose Read Request is on the wire (≤ ORD, RDMAP-90).
    pub fn outstanding_reads(&self) -> usize {
        self.outbound_reads.len()
    }

    /// Outbound Atomic Requests on the wire without their response (with the Reads,
    /// ≤ ORD).
    pub fn outstanding_atomics(&self) -> usize {
        self.outbound_atomics.len()
    }

    /// Inbound RDMA Read Requests accepted and not yet fully answered (with the atomics,
    /// ≤ IRD, RDMAP-91).
    pub fn inbound_reads(&self) -> usize {
        self.responses
            .iter()
            .filter(|r| matches!(r, Response::Read(_)))
            .count()
    }

    /// Inbound Atomic Requests executed whose Atomic Response is not sent yet.
    pub fn inbound_atomics(&self) -> usize {
        self.responses.len() - self.inbound_reads()
    }

    /// Send requests posted and not yet completed.
    pub fn sq_len(&self) -> usize {
        self.sq.len() - self.sq_internal
    }

    /// Receive requests posted and not yet consumed.
    pub fn rq_len(&self) -> usize {
        self.rq.len() + usize::from(self.rx_send.is_some())
    }

    /// Posts a send-queue request: Send (SE with [`SendFlags::SOLICITED`]), Send with
    /// Invalidate, RDMA Write, RDMA Read, and the RFC 7306 ones: Send and RDMA Write with
    /// immediate, atomic Fetch and Add and Compare and Swap (see the module documentation).
    /// Every gather entry is checked through `KeyTable::check_local` now (the sink of a Read
    /// or an atomic needs `LOCAL_WRITE`); `INLINE` data is copied now. In the Error or Closed
    /// state the request is accepted and flushed at once.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        let lim = send_limits(self.cfg.max_sge, self.cfg.max_inline);
        let c = check_send(wr, &lim, &self.keys, self.cfg.pd)?;
        self.post_checked(c)
    }

    /// Posts a request already checked with [`check_send`] (by a driver, in the posting
    /// thread, with this QP's limits), so the engine's owner never waits on a key check.
    pub fn post_checked(&mut self, c: CheckedSend) -> Result<(), PostError> {
        if c.opcode.is_read_or_atomic() && self.cfg.ord == 0 {
            return Err(PostError::ReadsDisabled);
        }
        if self.state != StreamState::Rts {
            self.completions.push_back(c.flushed());
            return Ok(());
        }
        if self.sq_len() >= self.cfg.sq_depth as usize {
            return Err(PostError::QueueFull);
        }
        let signaled = c.signaled();
        let fence = c.flags.contains(SendFlags::FENCE);
        let solicited = c.flags.contains(SendFlags::SOLICITED);
        let (wr_id, len, first) = (c.wr_id, c.len, c.first_sge);
        let data = c.payload;
        let (op, data) = match c.opcode {
            WrOpcode::Send => (
                SqOp::Send {
                    solicited,
                    invalidate: None,
                },
                data,
            ),
            WrOpcode::SendWithInvalidate { invalidate_rkey } => (
                SqOp::Send {
                    solicited,
                    invalidate: Some(invalidate_rkey),
                },
                data,
            ),
            WrOpcode::RdmaWrite { remote_addr, rkey } => (
                SqOp::Write {
                    rkey,
                    raddr: remote_addr,
                },
                data,
            ),
            WrOpcode::RdmaRead { remote_addr, rkey } => {
                let sink = first_target(data);
                (
                    SqOp::Read {
                        rkey,
                        raddr: remote_addr,
                        // RFC 5040 §4.4: the sink is named by this side's own STag.
                        sink_stag: first.map_or(Key(0), |s| s.lkey),
                        sink_to: first.map_or(0, |s| s.addr),
                        sink,
                    },
                    Payload::Inline(Default::default()),
                )
            }
            WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => (
                SqOp::Atomic {
                    rkey,
                    raddr: remote_addr,
                    op: AtomicOp::FetchAdd { add },
                    sink: first_target(data),
                },
                Payload::Inline(Default::default()),
            ),
            WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => (
                SqOp::Atomic {
                    rkey,
                    raddr: remote_addr,
                    op: AtomicOp::CmpSwap { compare, swap },
                    sink: first_target(data),
                },
                Payload::Inline(Default::default()),
            ),
            WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (
                SqOp::WriteImm {
                    rkey,
                    raddr: remote_addr,
                    imm,
                    solicited,
                    data_done: false,
                },
                data,
            ),
            WrOpcode::SendWithImm { imm } => (
                SqOp::SendImm {
                    imm,
                    solicited,
                    imm_done: false,
                },
                data,
            ),
            op @ (WrOpcode::LocalInv { .. } | WrOpcode::BindMw(_)) => (SqOp::Local(op), data),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sq.push_back(SqEntry {
            seq,
            wr_id,
            op,
            data,
            len,
            signaled,
            fence,
            state: SqState::Queued,
            tx_ord: 0,
            internal: false,
        });
        // A local operation posted to an empty queue runs now.
        self.retire();
        Ok(())
    }

    /// Queues a zero-length message of the engine's own behind everything posted: new octets
    /// on the stream that every peer takes without looking at an STag, and that complete to
    /// no one — a zero-length RDMA Write to STag 0 (RDMAP-40), the shape of RFC 6581's RTR.
    /// A connection uses it when the peer stays silent after our first FPDUs (see
    /// [`Connection`](crate::connection::Connection)). `false`, nothing queued, when the
    /// stream is not in Full Operation.
    ///
    /// Not a zero-length Read, which RDMAP-50 allows as well: Linux siw (6.12) answers one
    /// that arrives while its own Read Request is being sent from its inbound-read queue,
    /// where a zero-length request keeps the previous entry's scatter element
    /// (`siw_activate_tx` copies it only for a non-zero count, `siw_qp_sq_proc_tx` sends a
    /// Read Response from one element always): 23 octets to STag 0 for a 0-octet Read, which
    /// ends the stream (seen with rping's first Read, interop-siw `rping-c-S23`).
    pub fn nudge(&mut self) -> bool {
        if self.state != StreamState::Rts {
            return false;
        }
        let op = SqOp::Write {
            rkey: Key(0),
            raddr: 0,
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sq.push_back(SqEntry {
            seq,
            wr_id: 0,
            op,
            data: Payload::Inline(Default::default()),
            len: 0,
            signaled: false,
            fence: false,
            state: SqState::Queued,
            tx_ord: 0,
            internal: true,
        });
        self.sq_internal += 1;
        true
    }

    /// Posts a receive buffer for one inbound Send (RDMAP-59). Every entry is checked through
    /// `KeyTable::check_local` with `LOCAL_WRITE` now. In the Error or Closed state the
    /// request is accepted and flushed at once.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        let r = check_recv(wr, self.cfg.max_sge, &self.keys, self.cfg.pd)?;
        self.post_checked_recv(r)
    }

    /// Posts a receive already checked with [`check_recv`].
    pub fn post_checked_recv(&mut self, r: CheckedRecv) -> Result<(), PostError> {
        if self.state != StreamState::Rts {
            self.completions.push_back(r.flushed());
            return Ok(());
        }
        if self.rq_len() >= self.cfg.rq_depth as usize {
            return Err(PostError::QueueFull);
        }
        self.rq.push_back(RecvEntry {
            wr_id: r.wr_id,
            sgl: r.sgl,
        });
        Ok(())
    }

    /// Completions or events wait to be polled.
    pub fn has_output(&self) -> bool {
        !self.completions.is_empty() || !self.events.is_empty()
    }

    /// The next completion, in order: send-queue completions in submission order
    /// (RDMAP-81), receive completions in delivery order (RDMAP-62, RDMAP-76).
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// MPA (or TCP) reports an error below RDMAP (RFC 5040 §6.2.1, RDMAP-92): a Terminate with
    /// Layer LLP (no headers, Figure 10) is queued unless the connection is lost, and the QP
    /// goes to Error with every request flushed.
    pub fn handle_llp_error(&mut self, e: LlpError) {
        tracing::debug!(qp = self.cfg.qp.0, error = %e, "LLP error");
        self.events.push_back(QpEvent::LlpError(e));
        let lost = e == LlpError::TcpConnectionLost;
        if lost {
            self.tx_lost();
        }
        match self.state {
            StreamState::Rts if lost => {
                self.state = StreamState::Error;
                self.abort(None, None);
            }
            StreamState::Rts => self.fail(term::Fault::new(
                softrdma_wire::rdmap::TerminateCode::Llp(e),
            )),
            StreamState::Terminating if lost => {
                // Nothing can be sent any more.
                self.term_pending = None;
                self.state = if self.closing {
                    StreamState::Closed
                } else {
                    StreamState::Error
                };
            }
            _ => {}
        }
    }

    /// An LLP error before the connection's first valid FPDU (a Responder waiting for it,
    /// MPA-73): RFC 5044 §8 lets the receiver close without a Terminate, and its Terminate
    /// could not leave anyway (the Responder sends nothing before that FPDU). The stream
    /// ends in Error at once, every request flushed; the connection then closes.
    pub fn handle_llp_error_before_first_fpdu(&mut self, e: LlpError) {
        tracing::debug!(qp = self.cfg.qp.0, error = %e, "LLP error before the first FPDU");
        self.events.push_back(QpEvent::LlpError(e));
        if self.state == StreamState::Rts {
            self.state = StreamState::Error;
            self.abort(None, None);
        }
    }

    /// A local error the peer did not cause (the completion queue this QP completes into
    /// overran): the one Terminate, RDMAP Local Catastrophic without headers (RFC 5040
    /// §7.2, RDMAP-99), and the stream goes to Error with every request flushed.
    pub fn local_catastrophic(&mut self) {
        self.fail(term::Fault::local());
    }

    /// ULP graceful close (RFC 5040 §6.2): every uncompleted request is flushed and nothing
    /// more is sent or accepted, except a Terminate already queued, which still goes out
    /// (RDMAP-94).
    pub fn close(&mut self) {
        match self.state {
            StreamState::Closed => {}
            StreamState::Terminating => self.closing = true,
            StreamState::Rts | StreamState::Error => {
                self.abort(None, None);
                self.state = StreamState::Closed;
            }
        }
    }

    /// `true` when [`poll_ulpdu`](Self::poll_ulpdu) would return a ULPDU now.
    pub fn wants_transmit(&self) -> bool {
        match self.state {
            StreamState::Terminating => self.term_pending.is_some(),
            StreamState::Rts => self.responder_ready() || self.sq_ready(),
            StreamState::Error | StreamState::Closed => false,
        }
    }

    /// Hands completed send-queue entries to the CQ, oldest first, stopping at the first one
    /// still in progress (RDMAP-81).
    /// ULPDUs [`poll_ulpdu_into`](Self::poll_ulpdu_into) has emitted so far (the ordinal of
    /// the last one).
    pub fn ulpdus_emitted(&self) -> u64 {
        self.tx_emitted
    }

    /// The LLP has taken every octet of the first `ord` ULPDUs emitted: requests whose last
    /// ULPDU is among them complete.
    pub fn release_transmitted(&mut self, ord: u64) {
        let ord = ord.min(self.tx_emitted);
        if ord > self.tx_released {
            self.tx_released = ord;
            self.retire();
        }
    }

    /// The LLP can take nothing more (connection lost, write side failed): requests whose
    /// octets were framed but not handed over never left, and are flushed
    /// (`WorkRequestFlushed`) — in the Rts state the loss is also an LLP error.
    pub fn tx_lost(&mut self) {
        for e in self.sq.iter_mut() {
            if e.state == SqState::Done(WcStatus::Success) && e.tx_ord > self.tx_released {
                e.state = SqState::Done(WcStatus::WorkRequestFlushed);
            }
        }
        self.tx_released = self.tx_emitted;
        self.retire();
    }

    /// Local operations run here, once they are the oldest request: every request posted
    /// before them has completed, and none posted after them has started (`sq_ready`), so
    /// a Send may carry a key its window was just bound to. One that fails completes with
    /// its error and, as any local error, ends the stream (a Local Catastrophic Terminate).
    fn retire(&mut self) {
        while let Some(e) = self.sq.front() {
            let status = match (e.state, &e.op) {
                (SqState::Done(status), _) => status,
                (SqState::Queued, SqOp::Local(op)) => {
                    let (seq, op) = (e.seq, *op);
                    match op.run_local(&self.keys, self.cfg.qp, self.cfg.pd) {
                        Ok(()) => {
                            self.sq[0].state = SqState::Done(WcStatus::Success);
                            continue;
                        }
                        Err(status) => {
                            self.fail(term::Fault::local().sq(seq, status));
                            return;
                        }
                    }
                }
                _ => break,
            };
            if status == WcStatus::Success && self.sq[0].tx_ord > self.tx_released {
                break;
            }
            let Some(e) = self.sq.pop_front() else { break };
            self.sq_tx = self.sq_tx.saturating_sub(1);
            if e.internal {
                self.sq_internal -= 1;
            } else if e.signaled || status != WcStatus::Success {
                let len = if status == WcStatus::Success {
                    e.len
                } else {
                    0
                };
                self.completions
                    .push_back(wc(e.wr_id, status, e.op.wc_opcode(), len));
            }
        }
    }

    fn complete_sq(&mut self, seq: u64, status: WcStatus) {
        if let Some(e) = self.sq.iter_mut().find(|e| e.seq == seq) {
            e.state = SqState::Done(status);
        }
        self.retire();
    }

    /// Completes every pending request in error (RDMAP-72, RDMAP-93): `sq` names the one
    /// send-queue entry and `rq` the status of the receive WQE in use that failed for a
    /// reason of their own; everything else is flushed.
    fn abort(&mut self, sq: Option<(u64, WcStatus)>, rq: Option<WcStatus>) {
        // Requests already framed stay held until their octets are out (ahead of the
        // Terminate, or of the close) or the LLP is lost (`tx_lost`).
        for e in self.sq.iter_mut() {
            if !matches!(e.state, SqState::Done(_)) {
                e.state = SqState::Done(match sq {
                    Some((seq, status)) if seq == e.seq => status,
                    _ => WcStatus::WorkRequestFlushed,
                });
            }
        }
        self.retire();
        self.sq_tx = 0;
        self.sq_tx_off = 0;
        self.outbound_reads.clear();
        self.outbound_atomics.clear();
        self.responses.clear();
        if let Some(active) = self.rx_send.take() {
            let status = rq.unwrap_or(WcStatus::WorkRequestFlushed);
            let len = if status == WcStatus::WorkRequestFlushed {
                0
            } else {
                active.received
            };
            self.completions
                .push_back(wc(active.entry.wr_id, status, WcOpcode::Recv, len));
        }
        while let Some(r) = self.rq.pop_front() {
            self.completions.push_back(wc(
                r.wr_id,
                WcStatus::WorkRequestFlushed,
                WcOpcode::Recv,
                0,
            ));
        }
    }

    /// RFC 5040 §7.1: the first local error (RDMAP-102) queues the one Terminate
    /// (RDMAP-69) that describes it and kills the stream (RDMAP-95).
    fn fail(&mut self, fault: term::Fault) {
        if self.state != StreamState::Rts {
            return;
        }
        let t = fault.terminate();
        tracing::warn!(qp = self.cfg.qp.0, code = %t.code, "local error: Terminate sent, stream stops");
        self.term_pending = Some(t);
        self.term_sent = Some(t);
        self.state = StreamState::Terminating;
        self.events.push_back(QpEvent::LocalError(t));
        self.abort(fault.sq, fault.rq);
    }
}

fn wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
    WorkCompletion::new(wr_id, status, opcode, byte_len)
}

/// The one local entry of a Read or an atomic (`None` for a zero-length Read).
fn first_target(data: Payload) -> Option<Target> {
    data.sgl().and_then(|s| s.first().cloned())
}

/// The iWARP-specific acceptance rules of a send-queue request, before the common ones
/// (which include the RFC 7306 §5 atomic shape: one 64-bit word at an 8-aligned Tagged
/// Offset into exactly one 8-octet local entry). Datagrams do not exist on iWARP. A Write
/// with immediate tells its length in 31 bits ([`MAX_WRITE_WITH_IMM`]).
fn iwarp_accepts(wr: &SendWr) -> Result<(), PostError> {
    if wr.ud.is_some() {
        return Err(PostError::Destination);
    }
    if let WrOpcode::RdmaWriteWithImm { .. } = wr.opcode {
        let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(MAX_WRITE_WITH_IMM) {
            return Err(PostError::MessageTooLong);
        }
    }
    Ok(())
}

/// iWARP's send-queue limits for a QP's capacities: a Read's sink is one entry (RFC 5040
/// §4.4 names it with one STag and offset), a message at most 2^32 − 1 octets.
pub fn send_limits(max_sge: u32, max_inline: u32) -> SendLimits {
    SendLimits {
        max_sge,
        max_read_sge: 1,
        max_inline,
        max_message: IWARP_MAX_MESSAGE,
    }
}

/// Checks a send request for an iWARP QP: the transport's rules, then the common ones
/// ([`crate::verbs_types::check_send`]).
pub fn check_send(
    wr: SendWr,
    lim: &SendLimits,
    keys: &KeyTable,
    pd: PdId,
) -> Result<CheckedSend, PostError> {
    iwarp_accepts(&wr)?;
    crate::verbs_types::check_send(wr, lim, keys, pd)
}
