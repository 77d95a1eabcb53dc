//! RC responder of one QP, sans-IO (IBA Vol. 1 §9.7.5; ib-transport.md §5, §10, §13.3–§13.5;
//! the `rxe_resp.c` state machine of Linux rxe).
//!
//! The caller hands in request packets already validated by the header pipeline (TVer,
//! destination QP, P_Key; ib-transport.md §8) with [`Responder::handle_packet`], and drains
//! [`Responder::poll_response`] (ACK/NAK, RDMA READ responses, ATOMIC ACKs, BTH .. payload,
//! no ICRC) and [`Responder::poll_completion`] (receive completions).
//!
//! Per packet, in rxe's order: PSN region (§13.5) → opcode sequence (§9.5 / C9-28) →
//! resources (receive WQE, RNR NAK; READ/ATOMIC limit) → length (IBT-X-04) → R_Key
//! (`KeyTable::check_remote`, IBT-X-03) → execute → acknowledge.
//!
//! Choices where the spec leaves room (documented here, tested in `tests.rs`):
//! * An inbound SEND longer than its receive WQE: NAK *Invalid Request* and the WQE completes
//!   with `LocalLength` — what rxe does (`RESPST_ERR_LENGTH`), rather than *Remote Operational
//!   Error*.
//! * After a NAK other than PSN Sequence Error the responder stays usable: ePSN is unchanged and
//!   the message in progress is discarded (IBT-X-16: "the same PSN may later succeed").
//! * A SEND with Invalidate whose IETH R_Key fails the o9-5.2.2 checks is acknowledged like any
//!   valid SEND (o9-5.2.1: the ACK does not reflect the invalidation); its receive WQE completes
//!   with `RemoteInvalidRequest`.
//! * A duplicate SEND/WRITE is re-ACKed with PSN ePSN − 1 and the current MSN (as rxe), except
//!   that the ACK stops before a READ or ATOMIC executed after the duplicate (its PSN − 1, the
//!   MSN before it): the requester may have lost that request's answer, and rxe takes an ACK
//!   carrying a READ's PSN for the READ's completion, without its data.
//! * More than `max_rd_atomic` READ responses still queued (not yet polled) when a new READ or
//!   ATOMIC arrives: NAK *Invalid Request* (the requester exceeded the negotiated limit).
//! * MSN counts completed messages; a READ counts when accepted, its responses carry that MSN.
//! * A NAK that abandons a SEND in progress (an opcode out of sequence, C9-28) completes its
//!   receive WQE with `RemoteInvalidRequest` (rxe class C) rather than losing it.
//!
//! # Receive WQEs: the QP's own queue or a shared receive queue
//! A responder built with [`Responder::with_srq`] takes its receive WQEs from a
//! [`SharedRecvQueue`] instead of its own queue, exactly when a message needs one (rxe
//! `check_resource` / `get_srq_wqe`): at a SEND First or Only, an RDMA WRITE with immediate
//! Only or Last, a UD SEND Only. A multi-packet SEND keeps the WQE taken at its First until its
//! Last. Duplicates are answered before any WQE is taken (§13.5), so a retransmitted packet
//! never takes a second one. An empty SRQ is an empty receive queue: RC RNR-NAKs (9.7.5.2.8),
//! UC drops the message, UD drops the datagram (`no_wqe`).
//!
//! A WQE taken from an SRQ belongs to this QP: it always completes here, with this QP's
//! completions, and never returns to the SRQ. Where an own-queue WQE would be kept for the
//! next message (a UC message abandoned after a lost packet, IBA responder error class D1; an
//! RDMA WRITE with immediate refused after its WQE was taken), an SRQ WQE completes in error
//! instead: `RemoteInvalidRequest` for an abandoned UC message (class E, as rxe
//! `do_class_d1e_error`), the NAK's status for a refused WRITE (`RemoteInvalidRequest`,
//! `RemoteAccess`). [`Responder::flush`] (Error state) completes the WQE in progress as
//! flushed and leaves the SRQ's WQEs to the SRQ (IBA 10.3.1; rxe `flush_recv_queue`).

use std::collections::VecDeque;
use std::sync::Arc;

use softrdma_memory::{Access, AccessError, IbNak, Key, KeyTable, PdId, QpId, Target};
use softrdma_verbs_types::{
    CheckedRecv, PostError, RecvWr, SharedRecvQueue, WcFlags, WcOpcode, WcStatus, WorkCompletion,
    check_recv,
};
use softrdma_wire::ib::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, Operation, PSN_MASK, PacketRepr,
    PsnRegion, RnrTimer, Service, Syndrome, psn_add, psn_diff, psn_in_window, psn_region, psn_sub,
    read_psn_count,
};

#[cfg(test)]
mod tests;

/// Largest RETH DMA Length (IBA 9.3.3.3, C9-9: 0 ..= 2^31); longer is an Invalid Request.
const MAX_DMA_LEN: u32 = 1 << 31;

/// Static attributes of the responder side of one RC QP (`ibv_modify_qp` to RTR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponderConfig {
    /// Protection domain of the QP.
    pub pd: PdId,
    /// This QP (for type 2 windows and remote invalidation).
    pub qp: QpId,
    /// Path MTU, 256..=4096.
    pub pmtu: u32,
    /// Initial expected PSN (`rq_psn`).
    pub epsn: u32,
    /// Outstanding RDMA READ / ATOMIC requests this responder accepts (`max_dest_rd_atomic`).
    pub max_rd_atomic: u16,
    /// RNR NAK timer code (`min_rnr_timer`, 5 bits; ib-transport.md §13.3).
    pub min_rnr_timer: u8,
    /// Remote QP number (`dest_qp_num`): the BTH DestQP of every response.
    pub dest_qp: u32,
    /// RC, UC (no responses; §13.5 resynchronisation) or UD ([`Responder::handle_datagram`]).
    pub service: Service,
    /// Remote operations the QP accepts (`qp_access_flags`: `REMOTE_WRITE`, `REMOTE_READ`,
    /// `REMOTE_ATOMIC`); a request for another is NAKed *Invalid Request* (rxe).
    pub access: Access,
}

/// Requests dropped without a response, by reason (IBT-X-18).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ResponderCounters {
    /// Not an RC request opcode (responses, other services, unsupported RC operations).
    pub bad_opcode: u64,
    /// Ahead of ePSN after the one PSN Sequence Error NAK (§13.5).
    pub out_of_sequence: u64,
    /// Duplicate READ/ATOMIC matching no saved resource (IBT-X-14).
    pub duplicate_unmatched: u64,
    /// NAKs sent (any code but RNR).
    pub naks: u64,
    /// RNR NAKs sent.
    pub rnr_naks: u64,
    /// UC messages dropped for an error (bad R_Key, length, no receive WQE).
    pub uc_dropped: u64,
    /// UD datagrams dropped for want of a receive WQE.
    pub no_wqe: u64,
    /// Duplicates answered (re-ACK, READ regeneration, ATOMIC replay).
    pub duplicates: u64,
}

/// A receive WQE with its scatter list checked at post time.
struct Rwqe(CheckedRecv);

impl Rwqe {
    fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// Scatters `data` at message offset `off`; `LocalLength` when it does not fit,
    /// `LocalProtection` when a buffer was revoked.
    fn place(&self, off: u64, data: &[u8]) -> Result<(), WcStatus> {
        self.0.sgl.scatter(off, data).map_err(|e| match e {
            AccessError::Bounds => WcStatus::LocalLength,
            _ => WcStatus::LocalProtection,
        })
    }
}

/// Where receive WQEs come from.
enum RecvQueue {
    /// The QP's own receive queue (`post_recv`).
    Own(VecDeque<Rwqe>),
    /// A shared receive queue: a WQE is taken when a message needs it.
    Shared(Arc<SharedRecvQueue>),
}

/// The multi-packet message in progress (§9.5: First, Middle*, Last).
enum InProgress {
    None,
    /// SEND: the WQE taken at First and the octets placed so far.
    Send {
        wqe: Rwqe,
        off: u64,
    },
    /// RDMA WRITE: the target from the First's RETH and the octets placed so far.
    Write {
        target: Option<Target>,
        off: u64,
        len: u64,
    },
}

/// Saved READ / ATOMIC state, FIFO of depth `max_rd_atomic` (IBT-X-13, ib-transport.md §10);
/// `msn` is the MSN before the request.
#[derive(Clone, Copy, Debug)]
enum Resource {
    Read {
        psn: u32,
        count: u32,
        msn: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
        opcode: Opcode,
        msn: u32,
    },
}

impl Resource {
    fn first_psn(&self) -> u32 {
        match *self {
            Resource::Read { psn, .. } | Resource::Atomic { psn, .. } => psn,
        }
    }

    fn msn_before(&self) -> u32 {
        match *self {
            Resource::Read { msn, .. } | Resource::Atomic { msn, .. } => msn,
        }
    }
}

struct ReadJob {
    target: Option<Target>,
    psn: u32,
    next: u32,
    count: u32,
    len: u32,
    msn: u32,
}

enum Pending {
    Ack {
        psn: u32,
        syndrome: Syndrome,
        msn: u32,
    },
    Read(ReadJob),
    AtomicAck {
        psn: u32,
        orig: u64,
        msn: u32,
    },
}

/// The RC responder of one QP.
pub struct Responder {
    cfg: ResponderConfig,
    keys: Arc<KeyTable>,
    epsn: u32,
    msn: u32,
    /// A PSN Sequence Error NAK was sent for the current ePSN (§13.5).
    seq_nak_sent: bool,
    rq: RecvQueue,
    cur: InProgress,
    resources: VecDeque<Resource>,
    responses: VecDeque<Pending>,
    completions: VecDeque<WorkCompletion>,
    counters: ResponderCounters,
    /// The queued ACK answers a duplicate: a requester is retrying, it must not wait.
    ack_now: bool,
}

/// The outcome of checking/executing one expected packet.
enum Verdict {
    /// Executed; ACK if asked for or at the end of a message.
    Done {
        ack: bool,
        psns: u32,
    },
    /// Executed and answered already (READ, ATOMIC).
    Answered {
        psns: u32,
    },
    Nak(NakCode),
    Rnr,
    Drop,
}

fn nak_of(e: AccessError) -> NakCode {
    match e.ib_nak() {
        IbNak::InvalidRequest => NakCode::InvalidRequest,
        IbNak::RemoteAccess => NakCode::RemoteAccessError,
    }
}

impl Responder {
    /// A responder in RTR with the attributes of `cfg`, placing through `keys`, with its own
    /// receive queue.
    pub fn new(cfg: ResponderConfig, keys: Arc<KeyTable>) -> Self {
        Self::build(cfg, keys, RecvQueue::Own(VecDeque::new()))
    }

    /// As [`Responder::new`], taking receive WQEs from `srq` (see the module docs);
    /// [`Responder::post_recv`] is refused. The caller checks that `srq` belongs to `cfg.pd`
    /// (`IbQp::new_with_srq` does).
    pub fn with_srq(cfg: ResponderConfig, keys: Arc<KeyTable>, srq: Arc<SharedRecvQueue>) -> Self {
        Self::build(cfg, keys, RecvQueue::Shared(srq))
    }

    fn build(cfg: ResponderConfig, keys: Arc<KeyTable>, rq: RecvQueue) -> Self {
        Responder {
            epsn: cfg.epsn & PSN_MASK,
            cfg,
            keys,
            msn: 0,
            seq_nak_sent: false,
            rq,
            cur: InProgress::None,
            resources: VecDeque::new(),
            responses: VecDeque::new(),
            completions: VecDeque::new(),
            counters: ResponderCounters::default(),
            ack_now: false,
        }
    }

    /// INIT → RTR: takes the path attributes of `cfg` (ePSN, PMTU, remote QP, limits),
    /// keeping the receive queue.
    pub fn reconfigure(&mut self, cfg: ResponderConfig) {
        self.epsn = cfg.epsn & PSN_MASK;
        self.cfg = cfg;
    }

    /// `qp_access_flags` changed by `modify_qp` (any state): applies to the next request.
    pub fn set_access(&mut self, access: Access) {
        self.cfg.access = access;
    }

    /// The attributes in force.
    pub fn config(&self) -> &ResponderConfig {
        &self.cfg
    }

    /// Receive WQEs this QP holds and has not completed: posted and not consumed, plus the
    /// one a SEND in progress uses. With an SRQ only the latter (0 or 1); the SRQ's own WQEs
    /// are [`SharedRecvQueue::len`].
    pub fn rq_len(&self) -> usize {
        let own = match &self.rq {
            RecvQueue::Own(rq) => rq.len(),
            RecvQueue::Shared(_) => 0,
        };
        own + usize::from(matches!(self.cur, InProgress::Send { .. }))
    }

    /// The shared receive queue this responder takes WQEs from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedRecvQueue>> {
        match &self.rq {
            RecvQueue::Own(_) => None,
            RecvQueue::Shared(srq) => Some(srq),
        }
    }

    /// Error state (IBA 10.3.1): every receive WQE of this QP, the one in progress first,
    /// completes with `WorkRequestFlushed`; saved responses are dropped. With an SRQ only the
    /// WQE in progress is this QP's: the SRQ's WQEs stay there for the other QPs.
    pub fn flush(&mut self) {
        self.abandon(WcStatus::WorkRequestFlushed);
        self.responses.clear();
        self.ack_now = false;
        if let RecvQueue::Own(rq) = &mut self.rq {
            for w in rq.drain(..) {
                self.completions.push_back(WorkCompletion::new(
                    w.wr_id(),
                    WcStatus::WorkRequestFlushed,
                    WcOpcode::Recv,
                    0,
                ));
            }
        }
    }

    /// A receive posted in the Error state completes at once as flushed.
    pub fn push_flushed(&mut self, wr_id: u64) {
        self.completions.push_back(WorkCompletion::new(
            wr_id,
            WcStatus::WorkRequestFlushed,
            WcOpcode::Recv,
            0,
        ));
    }

    /// The expected PSN.
    pub fn epsn(&self) -> u32 {
        self.epsn
    }

    /// Messages completed (the MSN of the next AETH).
    pub fn msn(&self) -> u32 {
        self.msn
    }

    /// Drop and NAK counters.
    pub fn counters(&self) -> ResponderCounters {
        self.counters
    }

    /// Posts a receive WQE; every entry is checked with `check_local(LOCAL_WRITE)` now.
    /// `SrqAttached` with an SRQ.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        let RecvQueue::Own(rq) = &mut self.rq else {
            return Err(PostError::SrqAttached);
        };
        let r = check_recv(wr, u32::MAX, &self.keys, self.cfg.pd)?;
        if r.sgl.len() > u64::from(u32::MAX) {
            return Err(PostError::MessageTooLong);
        }
        rq.push_back(Rwqe(r));
        Ok(())
    }

    /// The next receive WQE for a message that needs one now (taken from the SRQ, if any).
    fn take_wqe(&mut self) -> Option<Rwqe> {
        match &mut self.rq {
            RecvQueue::Own(rq) => rq.pop_front(),
            RecvQueue::Shared(srq) => srq.take().map(Rwqe),
        }
    }

    /// A taken WQE whose message did not happen: back to the head of the own queue, untouched
    /// from the consumer's view; an SRQ WQE cannot go back and completes here with `status`.
    fn release(&mut self, wqe: Rwqe, status: WcStatus) {
        match &mut self.rq {
            RecvQueue::Own(rq) => rq.push_front(wqe),
            RecvQueue::Shared(_) => self.complete_error(wqe, status),
        }
    }

    /// `Verdict::Nak(code)`, releasing the WQE an RDMA WRITE with immediate had taken.
    fn refuse(&mut self, wqe: Option<Rwqe>, code: NakCode) -> Verdict {
        if let Some(w) = wqe {
            let status = match code {
                NakCode::RemoteAccessError => WcStatus::RemoteAccess,
                NakCode::InvalidRequest => WcStatus::RemoteInvalidRequest,
                _ => WcStatus::RemoteOperation,
            };
            self.release(w, status);
        }
        Verdict::Nak(code)
    }

    /// Next receive completion.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// Whether a completion waits for [`poll_completion`](Self::poll_completion).
    pub fn has_completion(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Handles one request packet addressed to this QP (header pipeline already passed).
    pub fn handle_packet(&mut self, pkt: &PacketRepr<'_>) {
        let op = pkt.bth.opcode;
        let svc = self.cfg.service;
        if op.service() != svc || svc == Service::Ud || !is_supported_request(svc, op.operation()) {
            // ib-transport.md §8: opcode not valid for this QP's service: silent drop.
            self.counters.bad_opcode += 1;
            return;
        }
        let psn = pkt.bth.psn & PSN_MASK;
        if svc == Service::Uc {
            self.uc_packet(pkt, psn);
            return;
        }
        match psn_region(psn, self.epsn) {
            PsnRegion::Expected => self.expected(pkt),
            PsnRegion::Duplicate => self.duplicate(pkt),
            PsnRegion::Invalid => {
                // §13.5 / IBA 9.7.5.1.2: one NAK PSN Sequence Error carrying ePSN, then drop
                // until ePSN arrives.
                if self.seq_nak_sent {
                    self.counters.out_of_sequence += 1;
                } else {
                    self.seq_nak_sent = true;
                    self.counters.naks += 1;
                    self.push_ack(
                        self.epsn,
                        Syndrome::Nak(NakCode::PsnSequenceError),
                        self.msn,
                    );
                }
            }
        }
    }

    /// UC (9.8.3, §13.5): no responses; a PSN other than ePSN abandons the message in
    /// progress and the receiver resynchronises on the next First or Only.
    fn uc_packet(&mut self, pkt: &PacketRepr<'_>, psn: u32) {
        let op = pkt.bth.opcode.operation();
        if psn != self.epsn {
            self.counters.out_of_sequence += 1;
            self.abandon(WcStatus::RemoteInvalidRequest);
            self.epsn = psn;
        }
        let starts = op.is_first() || op.is_only();
        let in_msg = !matches!(self.cur, InProgress::None);
        if starts == in_msg {
            // A Middle/Last without its First (lost), or a First inside a message: the
            // message is dropped; wait for the next First/Only.
            self.counters.out_of_sequence += 1;
            self.abandon(WcStatus::RemoteInvalidRequest);
            if !starts {
                self.epsn = psn_add(psn, 1);
                return;
            }
        }
        match self.execute(pkt) {
            Verdict::Done { psns, .. } | Verdict::Answered { psns } => {
                self.epsn = psn_add(self.epsn, psns);
            }
            Verdict::Nak(_) | Verdict::Rnr | Verdict::Drop => {
                // 9.8.3: UC errors are silent; the rest of the message is discarded.
                self.counters.uc_dropped += 1;
                self.abandon(WcStatus::RemoteInvalidRequest);
                self.epsn = psn_add(psn, 1);
            }
        }
    }

    /// Drops the message in progress; a receive WQE it had taken goes back to the head of
    /// the own queue untouched from the consumer's view (UC reuses it for the next message,
    /// class D1), or, taken from an SRQ, completes here with `srq_status` (class E).
    fn abandon(&mut self, srq_status: WcStatus) {
        if let InProgress::Send { wqe, .. } = std::mem::replace(&mut self.cur, InProgress::None) {
            self.release(wqe, srq_status);
        }
    }

    /// UD receive (9.8.4): one SEND Only (with immediate) per message. `grh` is the 40-octet
    /// GRH image the driver builds from the IP header (rxe: an IPv4 header fills the last 20
    /// octets); it is placed ahead of the payload, as verbs users expect. The header
    /// pipeline (Q_Key included) has passed.
    pub fn handle_datagram(&mut self, pkt: &PacketRepr<'_>, grh: &[u8; 40]) {
        let op = pkt.bth.opcode;
        let Some(deth) = pkt.deth else {
            self.counters.bad_opcode += 1;
            return;
        };
        if op != Opcode::UD_SEND_ONLY && op != Opcode::UD_SEND_ONLY_WITH_IMMEDIATE {
            self.counters.bad_opcode += 1;
            return;
        }
        if pkt.payload.len() > self.cfg.pmtu as usize {
            self.counters.bad_opcode += 1;
            return;
        }
        // No receive WQE: silently dropped (9.8.4, no RNR on UD).
        let Some(wqe) = self.take_wqe() else {
            self.counters.no_wqe += 1;
            return;
        };
        let placed = wqe.place(0, grh).and_then(|()| wqe.place(40, pkt.payload));
        match placed {
            Ok(()) => {
                let mut wc = WorkCompletion::new(
                    wqe.wr_id(),
                    WcStatus::Success,
                    WcOpcode::Recv,
                    (40 + pkt.payload.len()) as u32,
                );
                wc.flags.grh = true;
                wc.flags.solicited = pkt.bth.se;
                wc.imm = pkt.immdt.map(|i| i.immediate_data);
                wc.src_qp = Some(deth.src_qp);
                self.completions.push_back(wc);
            }
            Err(status) => self.complete_error(wqe, status),
        }
    }

    fn expected(&mut self, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn & PSN_MASK;
        match self.execute(pkt) {
            Verdict::Done { ack, psns } => {
                self.seq_nak_sent = false;
                self.epsn = psn_add(self.epsn, psns);
                if ack {
                    self.push_ack(psn, Syndrome::ACK, self.msn);
                }
            }
            Verdict::Answered { psns } => {
                self.seq_nak_sent = false;
                self.epsn = psn_add(self.epsn, psns);
            }
            Verdict::Nak(code) => {
                // 9.7.5.2.4: NAK with the request's PSN, ePSN unchanged; the message in
                // progress is abandoned, a receive WQE it held completes in error.
                if let InProgress::Send { wqe, .. } =
                    std::mem::replace(&mut self.cur, InProgress::None)
                {
                    self.complete_error(wqe, WcStatus::RemoteInvalidRequest);
                }
                self.counters.naks += 1;
                self.push_ack(psn, Syndrome::Nak(code), self.msn);
            }
            Verdict::Rnr => {
                // 9.7.5.2.8: RNR NAK, nothing consumed, ePSN unchanged.
                self.counters.rnr_naks += 1;
                let timer = RnrTimer::try_from(self.cfg.min_rnr_timer & 0x1F)
                    .expect("a 5-bit RNR timer code is valid");
                self.push_ack(psn, Syndrome::RnrNak { timer }, self.msn);
            }
            Verdict::Drop => {}
        }
    }

    fn execute(&mut self, pkt: &PacketRepr<'_>) -> Verdict {
        let op = pkt.bth.opcode.operation();
        let pmtu = self.cfg.pmtu as usize;
        let len = pkt.payload.len();
        // §9.5 (C9-28) opcode sequence: Middle/Last only inside a message of the same kind,
        // First/Only only outside one. rxe: RESPST_ERR_MISSING_OPCODE_* -> NAK Invalid Request.
        let in_send = matches!(self.cur, InProgress::Send { .. });
        let in_write = matches!(self.cur, InProgress::Write { .. });
        let ok_seq = match op {
            Operation::SendMiddle
            | Operation::SendLast
            | Operation::SendLastWithImmediate
            | Operation::SendLastWithInvalidate => in_send,
            Operation::RdmaWriteMiddle
            | Operation::RdmaWriteLast
            | Operation::RdmaWriteLastWithImmediate => in_write,
            _ => !in_send && !in_write,
        };
        if !ok_seq {
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        // IBT-X-04: First/Middle carry exactly PMTU, Last 1..=PMTU, Only 0..=PMTU.
        let len_ok = if op.is_first() || op.is_middle() {
            len == pmtu
        } else if op.is_last() {
            len > 0 && len <= pmtu
        } else {
            len <= pmtu
        };
        if !len_ok {
            if let InProgress::Send { wqe, .. } = std::mem::replace(&mut self.cur, InProgress::None)
            {
                self.complete_error(wqe, WcStatus::RemoteInvalidRequest);
            }
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        // QP access flags (verbs `qp_access_flags`; rxe check_op_valid): Invalid Request.
        let needs = match op {
            Operation::RdmaWriteFirst
            | Operation::RdmaWriteOnly
            | Operation::RdmaWriteOnlyWithImmediate => Access::REMOTE_WRITE,
            Operation::RdmaReadRequest => Access::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => Access::REMOTE_ATOMIC,
            _ => Access::empty(),
        };
        if !self.cfg.access.contains(needs) {
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        let end = op.is_last() || op.is_only();
        let ack = pkt.bth.ack_req || end;
        let imm = pkt.immdt.map(|i| i.immediate_data);
        match op {
            Operation::SendFirst
            | Operation::SendOnly
            | Operation::SendOnlyWithImmediate
            | Operation::SendOnlyWithInvalidate => {
                // 9.7.5.2.8: no receive WQE -> RNR NAK, nothing consumed.
                let Some(wqe) = self.take_wqe() else {
                    return Verdict::Rnr;
                };
                self.cur = InProgress::Send { wqe, off: 0 };
                self.send_data(pkt, end, imm, ack)
            }
            Operation::SendMiddle
            | Operation::SendLast
            | Operation::SendLastWithImmediate
            | Operation::SendLastWithInvalidate => self.send_data(pkt, end, imm, ack),
            Operation::RdmaWriteFirst
            | Operation::RdmaWriteOnly
            | Operation::RdmaWriteOnlyWithImmediate => {
                // Resources before the R_Key (rxe check_resource): the WQE the immediate
                // data consumes, RNR NAK without one.
                let wqe = if op == Operation::RdmaWriteOnlyWithImmediate {
                    match self.take_wqe() {
                        Some(w) => Some(w),
                        None => return Verdict::Rnr,
                    }
                } else {
                    None
                };
                let Some(reth) = pkt.reth else {
                    return self.refuse(wqe, NakCode::InvalidRequest);
                };
                if reth.dma_len > MAX_DMA_LEN {
                    return self.refuse(wqe, NakCode::InvalidRequest); // C9-9
                }
                // IBA 9.4.3: a zero-length WRITE need not check the R_Key (rxe skips it).
                let target = if reth.dma_len == 0 {
                    None
                } else {
                    match self.keys.check_remote(
                        Key(reth.r_key),
                        self.cfg.pd,
                        self.cfg.qp,
                        Access::REMOTE_WRITE,
                        reth.va,
                        reth.dma_len as u64,
                    ) {
                        Ok(t) => Some(t),
                        Err(e) => return self.refuse(wqe, nak_of(e)),
                    }
                };
                self.cur = InProgress::Write {
                    target,
                    off: 0,
                    len: reth.dma_len as u64,
                };
                self.write_data(pkt, end, imm, ack, wqe)
            }
            Operation::RdmaWriteMiddle => self.write_data(pkt, end, imm, ack, None),
            Operation::RdmaWriteLast | Operation::RdmaWriteLastWithImmediate => {
                let wqe = if op == Operation::RdmaWriteLastWithImmediate {
                    match self.take_wqe() {
                        Some(w) => Some(w),
                        None => return Verdict::Rnr,
                    }
                } else {
                    None
                };
                self.write_data(pkt, end, imm, ack, wqe)
            }
            Operation::RdmaReadRequest => self.read_request(pkt),
            Operation::CompareSwap | Operation::FetchAdd => self.atomic(pkt),
            _ => {
                self.counters.bad_opcode += 1;
                Verdict::Drop
            }
        }
    }

    fn send_data(
        &mut self,
        pkt: &PacketRepr<'_>,
        end: bool,
        imm: Option<u32>,
        ack: bool,
    ) -> Verdict {
        let InProgress::Send { wqe, off } = std::mem::replace(&mut self.cur, InProgress::None)
        else {
            return Verdict::Nak(NakCode::InvalidRequest);
        };
        if let Err(status) = wqe.place(off, pkt.payload) {
            // Too long for the WQE: rxe RESPST_ERR_LENGTH -> NAK Invalid Request; the WQE
            // completes in error (see the module docs).
            self.complete_error(wqe, status);
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        let off = off + pkt.payload.len() as u64;
        if !end {
            self.cur = InProgress::Send { wqe, off };
            return Verdict::Done { ack, psns: 1 };
        }
        // IBA o9-5.2.2 / ib-transport.md §9: Send with Invalidate after placement.
        let mut invalidated_key = None;
        if let Some(ieth) = pkt.ieth {
            let key = Key(ieth.r_key);
            if self
                .keys
                .invalidate_remote(key, self.cfg.pd, self.cfg.qp)
                .is_err()
            {
                // o9-5.2.1: the ACK does not reflect the invalidation outcome; the failure is
                // reported locally, in the receive completion.
                self.msn = psn_add(self.msn, 1);
                self.complete_error(wqe, WcStatus::RemoteInvalidRequest);
                return Verdict::Done { ack, psns: 1 };
            }
            invalidated_key = Some(key);
        }
        self.msn = psn_add(self.msn, 1);
        self.completions.push_back(WorkCompletion {
            wr_id: wqe.wr_id(),
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: off as u32,
            flags: WcFlags {
                with_invalidate: invalidated_key.is_some(),
                solicited: pkt.bth.se,
                grh: false,
            },
            imm,
            invalidated_key,
            src_qp: None,
            qp_num: 0,
        });
        Verdict::Done { ack, psns: 1 }
    }

    /// Places a WRITE packet; `wqe` is the receive WQE an RDMA WRITE with immediate Only or
    /// Last took, completed here (or released if the packet is refused).
    fn write_data(
        &mut self,
        pkt: &PacketRepr<'_>,
        end: bool,
        imm: Option<u32>,
        ack: bool,
        wqe: Option<Rwqe>,
    ) -> Verdict {
        let InProgress::Write { target, off, len } =
            std::mem::replace(&mut self.cur, InProgress::None)
        else {
            return self.refuse(wqe, NakCode::InvalidRequest);
        };
        let n = pkt.payload.len() as u64;
        // More data than the RETH's DMA Length, or a Last that leaves some missing:
        // NAK Invalid Request (rxe RESPST_ERR_LENGTH).
        if off + n > len || (end && off + n != len) {
            return self.refuse(wqe, NakCode::InvalidRequest);
        }
        if n > 0 {
            let Some(t) = &target else {
                return self.refuse(wqe, NakCode::InvalidRequest);
            };
            if let Err(e) = t.place(off as usize, pkt.payload) {
                return self.refuse(wqe, nak_of(e));
            }
        }
        if !end {
            self.cur = InProgress::Write {
                target,
                off: off + n,
                len,
            };
            if let Some(w) = wqe {
                // Only Only/Last take one; a non-final packet never has one.
                self.release(w, WcStatus::LocalQpOperation);
            }
            return Verdict::Done { ack, psns: 1 };
        }
        self.msn = psn_add(self.msn, 1);
        // The WQE an RDMA WRITE with immediate took carries the immediate data.
        if let Some(wqe) = wqe {
            self.completions.push_back(WorkCompletion {
                wr_id: wqe.wr_id(),
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: len as u32,
                flags: WcFlags {
                    with_invalidate: false,
                    solicited: pkt.bth.se,
                    grh: false,
                },
                imm,
                invalidated_key: None,
                src_qp: None,
                qp_num: 0,
            });
        }
        Verdict::Done { ack, psns: 1 }
    }

    fn queued_reads(&self) -> usize {
        self.responses
            .iter()
            .filter(|p| matches!(p, Pending::Read(_)))
            .count()
    }

    fn save(&mut self, r: Resource) {
        // IBT-X-13: FIFO of depth max_rd_atomic; the oldest record is forgotten.
        if self.resources.len() >= self.cfg.max_rd_atomic as usize {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    fn read_request(&mut self, pkt: &PacketRepr<'_>) -> Verdict {
        if self.queued_reads() >= self.cfg.max_rd_atomic as usize {
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        let Some(reth) = pkt.reth else {
            return Verdict::Nak(NakCode::InvalidRequest);
        };
        if reth.dma_len > MAX_DMA_LEN {
            return Verdict::Nak(NakCode::InvalidRequest); // C9-9
        }
        let target = match self.read_target(reth.r_key, reth.va, reth.dma_len) {
            Ok(t) => t,
            Err(code) => return Verdict::Nak(code),
        };
        let psn = pkt.bth.psn & PSN_MASK;
        // EXT-PSN-02: one PSN per response packet (IBT-X-09: at least one).
        let count = read_psn_count(reth.dma_len, self.cfg.pmtu);
        self.save(Resource::Read {
            psn,
            count,
            msn: self.msn,
        });
        self.msn = psn_add(self.msn, 1);
        self.responses.push_back(Pending::Read(ReadJob {
            target,
            psn,
            next: 0,
            count,
            len: reth.dma_len,
            msn: self.msn,
        }));
        Verdict::Answered { psns: count }
    }

    fn read_target(&self, r_key: u32, va: u64, len: u32) -> Result<Option<Target>, NakCode> {
        if len == 0 {
            // ib-transport.md §5.5: a zero-length READ is not checked.
            return Ok(None);
        }
        self.keys
            .check_remote(
                Key(r_key),
                self.cfg.pd,
                self.cfg.qp,
                Access::REMOTE_READ,
                va,
                len as u64,
            )
            .map(Some)
            .map_err(nak_of)
    }

    fn atomic(&mut self, pkt: &PacketRepr<'_>) -> Verdict {
        if self.cfg.max_rd_atomic == 0 || self.queued_reads() >= self.cfg.max_rd_atomic as usize {
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        let Some(a) = pkt.atomic_eth else {
            return Verdict::Nak(NakCode::InvalidRequest);
        };
        // IBT-X-12: 8-aligned VA, else NAK Invalid Request (before the key checks).
        if !a.va.is_multiple_of(8) {
            return Verdict::Nak(NakCode::InvalidRequest);
        }
        // IBT-X-16: protection failure -> NAK, nothing saved.
        let t = match self.keys.check_remote(
            Key(a.r_key),
            self.cfg.pd,
            self.cfg.qp,
            Access::REMOTE_ATOMIC,
            a.va,
            8,
        ) {
            Ok(t) => t,
            Err(e) => return Verdict::Nak(nak_of(e)),
        };
        // Operands arrive big-endian and are parsed into host order; memory is host order.
        let r = if pkt.bth.opcode.operation() == Operation::FetchAdd {
            t.fetch_add(0, a.swap_add_data)
        } else {
            t.compare_swap(0, a.compare_data, a.swap_add_data)
        };
        let orig = match r {
            Ok(v) => v,
            Err(e) => return Verdict::Nak(nak_of(e)),
        };
        let psn = pkt.bth.psn & PSN_MASK;
        self.save(Resource::Atomic {
            psn,
            orig,
            opcode: pkt.bth.opcode,
            msn: self.msn,
        });
        self.msn = psn_add(self.msn, 1);
        self.responses.push_back(Pending::AtomicAck {
            psn,
            orig,
            msn: self.msn,
        });
        Verdict::Answered { psns: 1 }
    }

    /// §13.5 duplicate region: never re-execute.
    fn duplicate(&mut self, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn & PSN_MASK;
        match pkt.bth.opcode.operation() {
            Operation::RdmaReadRequest => {
                // Regenerate the responses for the (sub)range the duplicate asks for, if it
                // lies inside a saved READ.
                let Some(reth) = pkt.reth else {
                    self.counters.duplicate_unmatched += 1;
                    return;
                };
                let count = read_psn_count(reth.dma_len, self.cfg.pmtu);
                let found = self.resources.iter().any(|r| match *r {
                    Resource::Read {
                        psn: p, count: c, ..
                    } => {
                        psn_in_window(psn, p, c)
                            && psn_diff(psn_add(psn, count), psn_add(p, c)) <= 0
                    }
                    Resource::Atomic { .. } => false,
                });
                if !found {
                    self.counters.duplicate_unmatched += 1;
                    return;
                }
                match self.read_target(reth.r_key, reth.va, reth.dma_len) {
                    Ok(target) => {
                        self.counters.duplicates += 1;
                        // The requester went back to `psn`: responses still queued from there
                        // on would reach it ahead of the ones it asks for now, out of
                        // sequence, and be thrown away (a large READ's tail can outlast its
                        // ACK timeout, retry after retry). It asks again for what lies
                        // beyond; the regenerated range replaces them (rxe restarts its
                        // in-progress READ the same way).
                        self.responses.retain(|r| match r {
                            Pending::Read(j) => psn_diff(psn_add(j.psn, j.next), psn) < 0,
                            _ => true,
                        });
                        self.responses.push_back(Pending::Read(ReadJob {
                            target,
                            psn,
                            next: 0,
                            count,
                            len: reth.dma_len,
                            msn: self.msn,
                        }));
                    }
                    Err(_) => self.counters.duplicate_unmatched += 1,
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                // IBT-X-14: replay the saved result for the same PSN and opcode, no R_Key
                // re-check; otherwise drop.
                let saved = self.resources.iter().find_map(|r| match *r {
                    Resource::Atomic {
                        psn: p,
                        orig,
                        opcode,
                        ..
                    } if p == psn && opcode == pkt.bth.opcode => Some(orig),
                    _ => None,
                });
                match saved {
                    Some(orig) => {
                        self.counters.duplicates += 1;
                        self.responses.push_back(Pending::AtomicAck {
                            psn,
                            orig,
                            msn: self.msn,
                        });
                    }
                    None => self.counters.duplicate_unmatched += 1,
                }
            }
            _ => {
                // SEND / WRITE: do not re-execute or consume a receive WQE; acknowledge as a new
                // request would be, i.e. when AckReq asks (C9-105 / 9.7.5.1.5; rxe since 6.x),
                // with everything up to ePSN - 1. An ACK for every duplicate packet reaches a
                // requester in the middle of its go-back and completes the message under it:
                // Linux rxe stalls for good when that happens (seen against rxe 6.12 with loss).
                self.counters.duplicates += 1;
                if pkt.bth.ack_req {
                    let (ack, msn) = self.dup_ack(psn);
                    self.push_ack(ack, Syndrome::ACK, msn);
                    self.ack_now = true;
                }
            }
        }
    }

    /// The PSN and MSN that answer a duplicate SEND/WRITE at `psn`: ePSN − 1, but never at or
    /// past a READ or ATOMIC executed after it. Its answer may be what the requester lost
    /// (it is retrying from before it): an ACK covering the request's PSN tells it the
    /// request is done without its data (Linux rxe then completes a READ with the buffer
    /// untouched, seen over lossy links). Only its own responses acknowledge it (IBA
    /// 9.7.5.1.4: an ACK acknowledges every PSN up to its own).
    fn dup_ack(&self, psn: u32) -> (u32, u32) {
        self.resources
            .iter()
            .find(|r| psn_diff(r.first_psn(), psn) > 0)
            .map_or((psn_sub(self.epsn, 1), self.msn), |r| {
                (psn_sub(r.first_psn(), 1), r.msn_before())
            })
    }

    /// Queues an ACK/NAK; a plain ACK replaces a plain ACK at the tail (coalescing: the newer
    /// one acknowledges everything the older one did, IBA 9.7.5.1.4).
    fn push_ack(&mut self, psn: u32, syndrome: Syndrome, msn: u32) {
        if self.cfg.service != Service::Rc {
            return;
        }
        if syndrome.is_ack()
            && let Some(Pending::Ack {
                syndrome: s,
                psn: p,
                msn: m,
            }) = self.responses.back_mut()
            && s.is_ack()
            && psn_diff(psn, *p) >= 0
        {
            *p = psn;
            *m = msn;
            return;
        }
        self.responses
            .push_back(Pending::Ack { psn, syndrome, msn });
    }

    fn complete_error(&mut self, wqe: Rwqe, status: WcStatus) {
        self.completions
            .push_back(WorkCompletion::new(wqe.wr_id(), status, WcOpcode::Recv, 0));
    }

    /// Whether all there is to send is one positive ACK of new requests, which may wait for
    /// the next packet this QP sends: an ACK acknowledges everything before it (IBA
    /// 9.7.5.1.4), so a later one replaces it, and a requester waits a whole local ACK timeout
    /// (C9-139; 67 ms at rxe's default) before it retries. An ACK answering a duplicate or a
    /// NAK never waits.
    pub fn ack_may_wait(&self) -> bool {
        !self.ack_now
            && self.responses.len() == 1
            && matches!(self.responses.front(), Some(Pending::Ack { syndrome, .. }) if syndrome.is_ack())
    }

    /// Appends the next response packet (BTH .. pad, no ICRC) to `out` and returns its
    /// length.
    pub fn poll_response(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let dest = self.cfg.dest_qp;
        let pending = self.responses.pop_front()?;
        if self.responses.is_empty() {
            self.ack_now = false;
        }
        let start = out.len();
        let (mut repr, read) = match pending {
            Pending::Ack { psn, syndrome, msn } => {
                let mut p = PacketRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest, psn), &[]);
                p.aeth = Some(aeth(syndrome, msn));
                (p, None)
            }
            Pending::AtomicAck { psn, orig, msn } => {
                let mut p =
                    PacketRepr::new(BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest, psn), &[]);
                p.aeth = Some(aeth(Syndrome::ACK, msn));
                p.atomic_ack_eth = Some(AtomicAckEthRepr {
                    orig_remote_data: orig,
                });
                (p, None)
            }
            Pending::Read(job) => {
                let i = job.next;
                let psn = psn_add(job.psn, i);
                let opcode = if job.count == 1 {
                    Opcode::RC_RDMA_READ_RESPONSE_ONLY
                } else if i == 0 {
                    Opcode::RC_RDMA_READ_RESPONSE_FIRST
                } else if i + 1 == job.count {
                    Opcode::RC_RDMA_READ_RESPONSE_LAST
                } else {
                    Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
                };
                let mut p = PacketRepr::new(BthRepr::new(opcode, dest, psn), &[]);
                // IBA 9.3.5: AETH on First, Last and Only responses.
                if opcode != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    p.aeth = Some(aeth(Syndrome::ACK, job.msn));
                }
                (p, Some(job))
            }
        };
        let Some(mut job) = read else {
            repr.emit_headers(0, out)
                .expect("response repr is well-formed");
            return Some(out.len() - start);
        };
        let off = job.next * self.cfg.pmtu;
        let n = job.len.saturating_sub(off).min(self.cfg.pmtu) as usize;
        repr.emit_headers(n, out)
            .expect("response repr is well-formed");
        // The payload straight from the region behind the headers: one copy.
        if n > 0 {
            let ok = job.target.as_ref().is_some_and(|t| {
                t.read_with(off as usize, n, |src| out.extend_from_slice(src))
                    .is_ok()
            });
            if !ok {
                // Source revoked mid-READ: NAK Remote Access Error, abandon the READ.
                out.truncate(start);
                self.counters.naks += 1;
                self.responses.push_front(Pending::Ack {
                    psn: repr.bth.psn,
                    syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                    msn: job.msn,
                });
                return self.poll_response(out);
            }
        }
        out.resize(out.len() + softrdma_wire::ib::pad_count(n) as usize, 0);
        job.next += 1;
        if job.next < job.count {
            self.responses.push_front(Pending::Read(job));
        }
        Some(out.len() - start)
    }
}

fn aeth(syndrome: Syndrome, msn: u32) -> AethRepr {
    AethRepr {
        reserved: false,
        syndrome,
        msn: msn & PSN_MASK,
    }
}

/// Requests this responder executes (IBA Table 38; FLUSH and ATOMIC WRITE not supported; UC
/// has no READ, ATOMIC or Send with Invalidate).
fn is_supported_request(svc: Service, op: Operation) -> bool {
    use Operation::*;
    if svc == Service::Uc
        && matches!(
            op,
            RdmaReadRequest
                | CompareSwap
                | FetchAdd
                | SendLastWithInvalidate
                | SendOnlyWithInvalidate
        )
    {
        return false;
    }
    matches!(
        op,
        SendFirst
            | SendMiddle
            | SendLast
            | SendLastWithImmediate
            | SendLastWithInvalidate
            | SendOnly
            | SendOnlyWithImmediate
            | SendOnlyWithInvalidate
            | RdmaWriteFirst
            | RdmaWriteMiddle
            | RdmaWriteLast
            | RdmaWriteLastWithImmediate
            | RdmaWriteOnly
            | RdmaWriteOnlyWithImmediate
            | RdmaReadRequest
            | CompareSwap
            | FetchAdd
    )
}
