//! Requester and completer of one QP's send queue, sans-IO (IBA Vol. 1 §9.7.1–§9.7.6 for RC,
//! §9.8 for UC and UD; ib-transport.md §5, §7, §13.3–§13.5; the `rxe_req.c` / `rxe_comp.c`
//! split of Linux rxe, folded into one object because both walk the same queue).
//!
//! PSNs are assigned when a work request is posted, in posting order (C9-25): a SEND or
//! WRITE takes one per packet, a READ `max(1, ceil(len / PMTU))`, an ATOMIC one. The queue is
//! then a PSN-ordered list, so go-back-N retransmission is "move the transmit cursor back to
//! the oldest unacknowledged PSN" and a READ resent from the middle is re-issued for its
//! remaining bytes (IBA 9.7.6.1.1).
//!
//! RC completion (C9-30, C9-32): an ACK for PSN p completes every SEND/WRITE whose last PSN
//! is ≤ p, stopping at an uncompleted READ or ATOMIC, which complete only on their responses;
//! an ACK or response beyond such a request means its responses were lost (an implicit NAK,
//! 9.7.5.1.x) and the requester goes back — over UDP only once enough later responses passed
//! the gap to rule out reordering (`reorder`). UC and UD messages complete when their last
//! packet is handed to the network.
//!
//! Choices where the spec leaves room:
//! * AckReq is set on the last packet of every message and on every 64th packet otherwise
//!   (as rxe, which only acknowledges when asked).
//! * `retry_cnt` counts local ACK timeouts, PSN Sequence Error NAKs and implicit NAKs (lost
//!   READ responses) alike; `retry_cnt` 7 means seven retries (IBA; rxe treats 7 as forever),
//!   `rnr_retry` 7 means forever (IBA). Both counters are reloaded on forward progress.
//! * A READ or ATOMIC response whose length or position does not fit the outstanding request
//!   completes that request with `BadResponse` and moves the QP to the error state.
//! * At most 2^22 PSNs may be queued at once (far below the 2^23 half-space of §13.5).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::reorder::{MAX_AHEAD, Reorder};
use softrdma_memory::{AccessError, KeyTable, PdId, QpId};
use softrdma_verbs_types::{
    IB_MAX_MESSAGE, Payload, PostError, SendFlags, SendLimits, SendWr, UdDest, WcStatus,
    WorkCompletion, WrOpcode, check_send,
};
use softrdma_wire::ib::Opcode;
use softrdma_wire::ib::{
    AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, NakCode, Operation, PSN_MASK,
    PacketRepr, RethRepr, Service, Syndrome, pad_count, psn_add, psn_diff, psn_sub, read_psn_count,
};

/// PSNs that may be queued at once (ib-transport.md §13.5: keep far below 2^23).
pub const MAX_QUEUED_PSNS: u32 = 1 << 22;

/// Congestion window bounds, in packets (see [`Requester::poll_transmit`]).
const MIN_CWND: u32 = 4;
const INITIAL_CWND: u32 = 32;

/// Packets sent without AckReq before one asks for an ACK (rxe `RXE_MAX_PKT_PER_ACK`).
const PKTS_PER_ACKREQ: u32 = 64;

/// A retried READ asking for at most this many responses may be sent more than once
/// (`retry_copies`).
const FEW_RESPONSES: u32 = 4;

/// The send-side attributes of one QP (`ibv_qp_attr` fields of INIT → RTR → RTS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequesterConfig {
    /// RC, UC or UD.
    pub service: Service,
    /// Protection domain of the QP.
    pub pd: PdId,
    /// This QP's number (DETH source QP on UD).
    pub qpn: u32,
    /// Remote QP (`dest_qp_num`; RC and UC).
    pub dest_qp: u32,
    /// Path MTU, 256..=4096.
    pub pmtu: u32,
    /// First PSN (`sq_psn`).
    pub sq_psn: u32,
    /// Outstanding READ / ATOMIC requests (`max_rd_atomic`, the initiator depth).
    pub max_rd_atomic: u8,
    /// Local ACK timeout code: 4.096 µs × 2^timeout; 0 disables the timer (§13.4).
    pub timeout: u8,
    /// Retries after timeouts and sequence errors, 0..=7.
    pub retry_cnt: u8,
    /// Retries after RNR NAKs, 0..=7; 7 retries forever.
    pub rnr_retry: u8,
    /// P_Key put in every BTH.
    pub pkey: u16,
    /// UD: this QP's Q_Key, sent when a work request's Q_Key has its high bit set (C9-49).
    pub qkey: u32,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Largest `INLINE` payload.
    pub max_inline: u32,
    /// RC: most PSNs sent and not yet acknowledged.
    pub window: u32,
}

impl RequesterConfig {
    /// An RC requester with rxe-like defaults: PMTU 1024, `max_rd_atomic` 16, timeout 14
    /// (67 ms), retry 7, RNR retry 7, window 1024.
    pub fn rc(pd: PdId, qpn: u32, dest_qp: u32, sq_psn: u32) -> Self {
        RequesterConfig {
            service: Service::Rc,
            pd,
            qpn,
            dest_qp,
            pmtu: 1024,
            sq_psn,
            max_rd_atomic: 16,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            pkey: softrdma_wire::ib::DEFAULT_PKEY,
            qkey: 0,
            sq_depth: 4096,
            max_sge: 32,
            max_inline: 256,
            window: 1024,
        }
    }
}

/// Requester counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RequesterCounters {
    /// Request packets sent, retransmissions included.
    pub packets: u64,
    /// Request packets sent again after going back.
    pub retransmitted: u64,
    /// Local ACK timer expiries.
    pub timeouts: u64,
    /// PSN Sequence Error NAKs received.
    pub seq_naks: u64,
    /// RNR NAKs received.
    pub rnr_naks: u64,
    /// Responses dropped: outside the outstanding PSN range, duplicates, wrong service.
    pub stale_responses: u64,
}

/// Counters of several QPs, summed.
impl std::ops::AddAssign for RequesterCounters {
    fn add_assign(&mut self, o: RequesterCounters) {
        self.packets += o.packets;
        self.retransmitted += o.retransmitted;
        self.timeouts += o.timeouts;
        self.seq_naks += o.seq_naks;
        self.rnr_naks += o.rnr_naks;
        self.stale_responses += o.stale_responses;
    }
}

/// Where a packet from [`Requester::poll_transmit`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tx {
    /// Octets written (BTH .. pad, no ICRC).
    pub len: usize,
    /// UD: the work request's destination; `None` on connected QPs (the QP's path).
    pub dest: Option<UdDest>,
}

/// Payload access with the requester's completion statuses.
trait PayloadExt {
    fn scatter_wc(&self, off: usize, data: &[u8]) -> Result<(), WcStatus>;
}

impl PayloadExt for Payload {
    /// READ and ATOMIC responses land in the request's entries (never inline).
    fn scatter_wc(&self, off: usize, data: &[u8]) -> Result<(), WcStatus> {
        match self {
            Payload::Sgl(s) => s.scatter(off as u64, data).map_err(|e| match e {
                AccessError::Bounds => WcStatus::LocalLength,
                _ => WcStatus::LocalProtection,
            }),
            Payload::Inline(_) => Err(WcStatus::LocalQpOperation),
        }
    }
}

struct Wqe {
    wr_id: u64,
    op: WrOpcode,
    data: Payload,
    len: u32,
    signaled: bool,
    solicited: bool,
    fence: bool,
    ud: Option<UdDest>,
    first_psn: u32,
    npsn: u32,
}

impl Wqe {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npsn - 1)
    }

    fn contains(&self, psn: u32) -> bool {
        let d = psn_diff(psn, self.first_psn);
        d >= 0 && (d as u32) < self.npsn
    }
}

/// The send queue of one QP: requester and completer.
pub struct Requester {
    cfg: RequesterConfig,
    keys: Arc<KeyTable>,
    sq: VecDeque<Wqe>,
    /// PSN of the next work request posted.
    next_psn: u32,
    queued_psns: u32,
    /// Transmit cursor: index in `sq`, packet index within it.
    tx_idx: usize,
    tx_pkt: u32,
    /// RC: oldest unacknowledged PSN.
    una: u32,
    /// RC: one past the highest PSN ever sent.
    max_sent: u32,
    /// RC: one past the highest PSN the responder is known to have executed.
    acked: u32,
    /// READ / ATOMIC requests among `sq[..tx_idx]`.
    rd_outstanding: u32,
    retry_left: u8,
    rnr_left: u8,
    /// Gone back and no progress since: further implicit NAKs are echoes of the same loss.
    retrying: bool,
    /// READ responses and ATOMIC results that arrived ahead of `una`.
    reorder: Reorder,
    /// RC congestion window in packets (≤ `cfg.window`), its slow-start threshold and the
    /// acknowledged packets counted towards the next additive increase.
    cwnd: u32,
    ssthresh: u32,
    cwnd_acc: u32,
    /// Extra copies of the packet at `una` to send the next time it goes out (after a
    /// retry; see `retry_copies`).
    dup_head: u8,
    /// UC/UD send queue error (SQE): requests are flushed until resumed.
    sqe: bool,
    timer: Option<Instant>,
    rnr_until: Option<Instant>,
    noack_pkts: u32,
    /// SQD: no PSN at or after this one starts.
    drain_psn: Option<u32>,
    error: bool,
    completions: VecDeque<WorkCompletion>,
    counters: RequesterCounters,
}

impl Requester {
    /// A send queue in RTS with the attributes of `cfg`, gathering through `keys`.
    pub fn new(cfg: RequesterConfig, keys: Arc<KeyTable>) -> Self {
        let psn = cfg.sq_psn & PSN_MASK;
        Requester {
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            retrying: false,
            reorder: Reorder::default(),
            cwnd: cfg.window.clamp(MIN_CWND, INITIAL_CWND),
            ssthresh: cfg.window,
            cwnd_acc: 0,
            dup_head: 0,
            sqe: false,
            cfg,
            keys,
            sq: VecDeque::new(),
            next_psn: psn,
            queued_psns: 0,
            tx_idx: 0,
            tx_pkt: 0,
            una: psn,
            max_sent: psn,
            acked: psn,
            rd_outstanding: 0,
            timer: None,
            rnr_until: None,
            noack_pkts: 0,
            drain_psn: None,
            error: false,
            completions: VecDeque::new(),
            counters: RequesterCounters::default(),
        }
    }

    /// The attributes in force.
    pub fn config(&self) -> &RequesterConfig {
        &self.cfg
    }

    /// Changes the attributes an RTS → RTS or SQD → RTS modify may change (timeouts, retry
    /// counts, `max_rd_atomic`); the rest are ignored.
    pub fn update(&mut self, cfg: RequesterConfig) {
        self.cfg.timeout = cfg.timeout;
        self.cfg.retry_cnt = cfg.retry_cnt;
        self.cfg.rnr_retry = cfg.rnr_retry;
        self.cfg.max_rd_atomic = cfg.max_rd_atomic;
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
    }

    /// Changes the most PSNs kept unacknowledged.
    pub fn set_window(&mut self, window: u32) {
        self.cfg.window = window.max(1);
        self.cwnd = self.cwnd.min(self.cfg.window);
        self.ssthresh = self.ssthresh.min(self.cfg.window);
    }

    /// Counters.
    pub fn counters(&self) -> RequesterCounters {
        self.counters
    }

    /// Work requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }

    /// The PSN the next posted request will take.
    pub fn next_psn(&self) -> u32 {
        self.next_psn
    }

    /// The send queue hit a fatal error (the QP must go to the Error state).
    pub fn is_error(&self) -> bool {
        self.error
    }

    /// Next send completion.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// Whether a completion waits for [`poll_completion`](Self::poll_completion).
    pub fn has_completion(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Posts a send-queue work request. Every entry is checked with `check_local` now
    /// (READ and ATOMIC sinks need `LOCAL_WRITE`); `INLINE` data is copied now.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        let svc = self.cfg.service;
        let ok_op = match (&wr.opcode, svc) {
            (WrOpcode::Send | WrOpcode::SendWithImm { .. }, _) => true,
            (WrOpcode::SendWithInvalidate { .. }, Service::Rc) => true,
            (WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. }, s) => s != Service::Ud,
            (
                WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpSwap { .. }
                | WrOpcode::AtomicFetchAdd { .. },
                Service::Rc,
            ) => true,
            // 10.6.7: windows and local invalidation on connected QPs (as rxe).
            (WrOpcode::LocalInv { .. } | WrOpcode::BindMw(_), s) => s != Service::Ud,
            _ => false,
        };
        if !ok_op {
            return Err(PostError::Unsupported);
        }
        if (svc == Service::Ud) != wr.ud.is_some() {
            return Err(PostError::Destination);
        }
        let lim = SendLimits {
            max_sge: self.cfg.max_sge,
            max_read_sge: self.cfg.max_sge,
            max_inline: self.cfg.max_inline,
            max_message: IB_MAX_MESSAGE,
        };
        let sink = wr.opcode.is_read_or_atomic();
        if sink && self.cfg.max_rd_atomic == 0 {
            return Err(PostError::ReadsDisabled);
        }
        let c = check_send(wr, &lim, &self.keys, self.cfg.pd)?;
        let len = c.len;
        // UD: one packet per message (9.8.4).
        if svc == Service::Ud && len > self.cfg.pmtu {
            return Err(PostError::MessageTooLong);
        }
        let npsn = match c.opcode {
            op if op.is_local() => 0,
            WrOpcode::RdmaRead { .. } => read_psn_count(len, self.cfg.pmtu),
            WrOpcode::AtomicCmpSwap { .. } | WrOpcode::AtomicFetchAdd { .. } => 1,
            _ => len.div_ceil(self.cfg.pmtu).max(1),
        };
        if self.error || self.sqe {
            self.completions.push_back(c.flushed());
            return Ok(());
        }
        if self.sq.len() >= self.cfg.sq_depth as usize || self.queued_psns + npsn > MAX_QUEUED_PSNS
        {
            return Err(PostError::QueueFull);
        }
        let first_psn = self.next_psn;
        self.next_psn = psn_add(self.next_psn, npsn);
        self.queued_psns += npsn;
        self.sq.push_back(Wqe {
            wr_id: c.wr_id,
            op: c.opcode,
            signaled: c.signaled(),
            solicited: c.flags.contains(SendFlags::SOLICITED),
            fence: c.flags.contains(SendFlags::FENCE),
            ud: c.ud,
            data: c.payload,
            len,
            first_psn,
            npsn,
        });
        self.run_locals();
        Ok(())
    }

    /// Local Invalidate and Bind Memory Window requests at the front of the queue run now
    /// (they use no PSN): every request before them has completed, and transmission stops
    /// at them until they ran, so a message posted after a bind may carry the new key. One
    /// that fails completes with its error: a local error (10.8.3.2), RC to Error, UC to SQE.
    fn run_locals(&mut self) {
        while let Some(w) = self.sq.front()
            && w.op.is_local()
        {
            match w.op.run_local(&self.keys, QpId(self.cfg.qpn), self.cfg.pd) {
                Ok(()) => {
                    let w = self.sq.pop_front().expect("front request");
                    if self.tx_idx > 0 {
                        self.tx_idx -= 1;
                    } else {
                        self.tx_pkt = 0;
                    }
                    self.complete(w, WcStatus::Success);
                }
                Err(status) if self.cfg.service == Service::Rc => return self.fail(status),
                Err(status) => return self.fail_front_unreliable(status),
            }
        }
    }

    /// SQD: finish the message in progress, start no new one.
    pub fn drain(&mut self) {
        let psn = match self.sq.get(self.tx_idx) {
            Some(w) if self.tx_pkt > 0 => psn_add(w.last_psn(), 1),
            Some(w) => psn_add(w.first_psn, self.tx_pkt),
            None => self.next_psn,
        };
        self.drain_psn = Some(psn);
    }

    /// SQD → RTS.
    pub fn resume(&mut self) {
        self.drain_psn = None;
        self.sqe = false;
    }

    /// SQD and every request before the drain point completed (the SQ drained event).
    pub fn is_drained(&self) -> bool {
        match (self.drain_psn, self.sq.front()) {
            (Some(_), None) => true,
            (Some(d), Some(w)) => psn_diff(w.first_psn, d) >= 0,
            (None, _) => false,
        }
    }

    /// Moves the queue to the error state: every request completes with
    /// `WorkRequestFlushed` (IBA 10.3.1: the Error state flushes).
    pub fn flush(&mut self) {
        self.error = true;
        self.timer = None;
        self.rnr_until = None;
        self.flush_queue();
    }

    /// Completes every queued request with `WorkRequestFlushed` and empties the queue.
    fn flush_queue(&mut self) {
        while let Some(w) = self.sq.pop_front() {
            self.completions.push_back(WorkCompletion::new(
                w.wr_id,
                WcStatus::WorkRequestFlushed,
                w.op.wc_opcode(),
                0,
            ));
        }
        self.queued_psns = 0;
        self.tx_idx = 0;
        self.tx_pkt = 0;
        self.rd_outstanding = 0;
        self.reorder.clear();
    }

    /// The earliest instant [`Requester::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.timer, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the local ACK timer and the RNR wait.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            if self.sq.is_empty() || psn_diff(self.max_sent, self.una) <= 0 {
                return;
            }
            self.counters.timeouts += 1;
            self.on_loss(true);
            tracing::debug!(qpn = self.cfg.qpn, una = self.una, "local ACK timeout");
            self.retry(WcStatus::RetryExceeded);
            self.dup_head = self.retry_copies(true);
            self.reorder.timed_out();
        }
    }

    fn ack_timeout(&self) -> Option<Duration> {
        match self.cfg.timeout {
            0 => None,
            t => Some(Duration::from_nanos(4096u64 << t.min(31))),
        }
    }

    /// Takes one retry from `retry_cnt` and goes back to the oldest unacknowledged PSN, or
    /// fails the oldest request with `exhausted`.
    fn retry(&mut self, exhausted: WcStatus) {
        tracing::debug!(
            qpn = self.cfg.qpn,
            una = self.una,
            left = self.retry_left,
            "retry"
        );
        if self.retry_left == 0 {
            self.fail(exhausted);
            return;
        }
        self.retry_left -= 1;
        self.go_back(self.una);
        self.dup_head = self.retry_copies(false);
        if self.dup_head == 0 {
            self.reorder.went_back(self.una);
        } else {
            self.reorder.no_probe();
        }
    }

    /// Extra copies of the oldest unacknowledged packet a retry sends. Each retry is one of
    /// the `retry_cnt` a request may use without forward progress, and the whole queue
    /// waits on that one packet: at 20 % loss one copy and its answer fail a round 36 % of
    /// the time, and eight rounds in a row came once in ~3,500 retried requests, which a
    /// 10,000-request run meets. k copies (the responder executes one and answers each
    /// duplicate again: 9.7.5.1.5, IBT-X-13) fail a round about 0.36^k of the time: one
    /// extra on the first retry, two from the second on. A READ/ATOMIC duplicate has every
    /// response generated again, so it gets its extra copy only after an ACK timeout
    /// (`timeout`) or once retries run back to back — and only while it asks for a few
    /// responses: each copy of a long READ makes the responder send all of it again, and
    /// those copies queue ahead of the one that counts (at 30 % reordering, 256 KiB READs
    /// fed the queue faster than the ACK timer drained it, timeout after timeout).
    fn retry_copies(&self, timeout: bool) -> u8 {
        let used = self.cfg.retry_cnt.saturating_sub(self.retry_left);
        if let Some(w) = self.sq.front()
            && w.op.is_read_or_atomic()
        {
            let left = w.npsn - (psn_diff(self.una, w.first_psn).max(0) as u32).min(w.npsn);
            if left > FEW_RESPONSES || (!timeout && used < 2) {
                return 0;
            }
        }
        used.clamp(1, 2)
    }

    /// Responses show that some were lost. Once per go-back: the responses to packets sent
    /// before it keep arriving and say the same thing again (rxe `started_retry`).
    fn implicit_nak(&mut self) {
        if !self.retrying {
            self.on_loss(false);
            self.retry(WcStatus::RetryExceeded);
        }
    }

    /// A loss (sequence NAK, lost responses, or — `timeout` — the ACK timer): halve the
    /// congestion window, or after a timeout start again from the minimum. IBA leaves how
    /// many packets a requester keeps in flight to the implementation; over UDP a burst that
    /// overflows a socket buffer is lost whole, and go-back-N would resend it whole, so the
    /// window adapts like TCP's (slow start, additive increase, multiplicative decrease).
    fn on_loss(&mut self, timeout: bool) {
        self.ssthresh = (self.cwnd / 2).max(MIN_CWND);
        self.cwnd = if timeout { MIN_CWND } else { self.ssthresh };
        self.cwnd_acc = 0;
    }

    fn on_progress(&mut self, packets: u32) {
        if self.cwnd < self.ssthresh {
            self.cwnd += packets;
        } else {
            self.cwnd_acc += packets;
            if self.cwnd_acc >= self.cwnd {
                self.cwnd_acc -= self.cwnd;
                self.cwnd += 1;
            }
        }
        self.cwnd = self.cwnd.min(self.cfg.window);
    }

    /// Completes the oldest request with `status` and flushes the rest (§13.3: the QP goes
    /// to the Error state).
    fn fail(&mut self, status: WcStatus) {
        tracing::debug!(
            qpn = self.cfg.qpn,
            una = self.una,
            ?status,
            "send queue failed"
        );
        if let Some(w) = self.sq.pop_front() {
            self.completions
                .push_back(WorkCompletion::new(w.wr_id, status, w.op.wc_opcode(), 0));
        }
        self.flush();
    }

    fn tx_psn(&self) -> u32 {
        match self.sq.get(self.tx_idx) {
            Some(w) => psn_add(w.first_psn, self.tx_pkt),
            None => self.next_psn,
        }
    }

    /// Moves the transmit cursor to `psn` (which lies in `sq` or is `next_psn`).
    fn go_back(&mut self, psn: u32) {
        tracing::trace!(qpn = self.cfg.qpn, psn, "go back");
        self.retrying = true;
        self.timer = None;
        self.noack_pkts = 0;
        let (idx, pkt) = self
            .sq
            .iter()
            .enumerate()
            .find(|(_, w)| w.contains(psn))
            .map_or((self.sq.len(), 0), |(i, w)| {
                (i, psn_diff(psn, w.first_psn) as u32)
            });
        self.tx_idx = idx;
        self.tx_pkt = pkt;
        self.rd_outstanding = self
            .sq
            .iter()
            .take(idx)
            .filter(|w| w.op.is_read_or_atomic())
            .count() as u32;
    }

    /// Appends the next request packet (BTH .. pad, no ICRC) to `out`, or `None` when
    /// nothing may be sent now (empty, window full, ORD reached, fence, RNR wait, drained).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Tx> {
        if self.error || self.sqe || self.rnr_until.is_some() {
            return None;
        }
        let rc = self.cfg.service == Service::Rc;
        if rc {
            self.skip_executed();
        }
        self.run_locals();
        if self.error || self.sqe {
            return None;
        }
        let psn = self.tx_psn();
        let w = self.sq.get(self.tx_idx)?;
        // A local operation waits to be the oldest (`run_locals`).
        if w.op.is_local() {
            return None;
        }
        if let Some(d) = self.drain_psn
            && psn_diff(psn, d) >= 0
        {
            return None;
        }
        if rc {
            if psn_diff(psn, self.una) >= self.cwnd.min(self.cfg.window) as i32 {
                return None;
            }
            let sink = w.op.is_read_or_atomic();
            // C9-31: a fenced request waits for every earlier READ and ATOMIC.
            if self.tx_pkt == 0 && w.fence && self.rd_outstanding > 0 {
                return None;
            }
            if sink && self.rd_outstanding >= u32::from(self.cfg.max_rd_atomic) {
                return None;
            }
        }
        let retransmit = psn_diff(psn, self.max_sent) < 0;
        let (len, last) = match self.build(psn, out) {
            Ok(x) => x,
            Err(status) => {
                // A local buffer was revoked after post: the request fails locally.
                if rc {
                    self.fail(status);
                } else {
                    self.fail_front_unreliable(status);
                }
                return None;
            }
        };
        self.counters.packets += 1;
        if retransmit {
            self.counters.retransmitted += 1;
        }
        let dest = self.sq[self.tx_idx].ud;
        // A retry sends the packet at `una` more than once (`retry_copies`).
        if self.dup_head > 0 && rc && psn == self.una {
            self.dup_head -= 1;
            return Some(Tx { len, dest });
        }
        if last {
            if self.sq[self.tx_idx].op.is_read_or_atomic() {
                self.rd_outstanding += 1;
            }
            self.tx_idx += 1;
            self.tx_pkt = 0;
        } else {
            self.tx_pkt += 1;
        }
        if rc {
            let next = self.tx_psn();
            if psn_diff(next, self.max_sent) > 0 {
                self.max_sent = next;
            }
            if self.timer.is_none()
                && let Some(d) = self.ack_timeout()
            {
                self.timer = Some(now + d);
            }
        } else if last {
            // UC / UD: complete as soon as the last packet leaves (9.8.3).
            let w = self.sq.pop_front().expect("transmitted request");
            self.tx_idx -= 1;
            self.queued_psns -= w.npsn;
            self.complete(w, WcStatus::Success);
        }
        Some(Tx { len, dest })
    }

    /// After going back, SEND/WRITE packets the responder has executed (its ACKs and NAKs
    /// say so) are not sent again; only READ/ATOMIC requests whose responses went missing
    /// are (a duplicate READ is regenerated, a duplicate ATOMIC replayed: IBT-X-13), and a
    /// READ only from its first response still missing.
    fn skip_executed(&mut self) {
        while let Some(w) = self.sq.get(self.tx_idx) {
            let psn = psn_add(w.first_psn, self.tx_pkt);
            if w.op.is_read_or_atomic() {
                let missing = (self.tx_pkt..w.npsn).find(|&k| {
                    let ahead = psn_diff(psn_add(w.first_psn, k), self.una);
                    ahead < 0 || !self.reorder.has(ahead as u32)
                });
                match missing {
                    Some(k) => {
                        self.tx_pkt = k;
                        return;
                    }
                    None => {
                        // Every response is here: counts as outstanding until it completes.
                        self.rd_outstanding += 1;
                        self.tx_idx += 1;
                        self.tx_pkt = 0;
                        continue;
                    }
                }
            }
            if psn_diff(psn, self.acked) >= 0 {
                return;
            }
            if psn_diff(w.last_psn(), self.acked) < 0 {
                self.tx_idx += 1;
                self.tx_pkt = 0;
            } else {
                self.tx_pkt = psn_diff(self.acked, w.first_psn) as u32;
                return;
            }
        }
    }

    /// UC/UD local error (IBA 10.3.1): the request completes in error, the rest of the send
    /// queue is flushed and the queue enters SQE until the QP is modified back to RTS;
    /// receives go on.
    fn fail_front_unreliable(&mut self, status: WcStatus) {
        if let Some(w) = self.sq.remove(self.tx_idx) {
            self.queued_psns -= w.npsn;
            self.completions
                .push_back(WorkCompletion::new(w.wr_id, status, w.op.wc_opcode(), 0));
        }
        self.flush_queue();
        self.sqe = true;
    }

    /// The send queue entered SQE (UC/UD local error); cleared by [`Requester::resume`].
    pub fn is_sqe(&self) -> bool {
        self.sqe
    }

    fn complete(&mut self, w: Wqe, status: WcStatus) {
        if w.signaled || status != WcStatus::Success {
            self.completions.push_back(WorkCompletion::new(
                w.wr_id,
                status,
                w.op.wc_opcode(),
                w.len,
            ));
        }
    }

    /// Builds the packet at `psn` of the request under the cursor; returns its length and
    /// whether it was the request's last packet.
    fn build(&mut self, psn: u32, out: &mut Vec<u8>) -> Result<(usize, bool), WcStatus> {
        let pmtu = self.cfg.pmtu;
        let svc = self.cfg.service;
        let k = self.tx_pkt;
        let w = &self.sq[self.tx_idx];
        // The payload: `plen` octets from message offset `from`.
        let (mut from, mut plen) = (0usize, 0usize);
        let dest_qp = w.ud.map_or(self.cfg.dest_qp, |u| u.remote_qpn);
        let (op, last) = match w.op {
            WrOpcode::RdmaRead { .. } => (Operation::RdmaReadRequest, true),
            WrOpcode::AtomicCmpSwap { .. } => (Operation::CompareSwap, true),
            WrOpcode::AtomicFetchAdd { .. } => (Operation::FetchAdd, true),
            _ => {
                let n = w.npsn;
                let start = (k * pmtu) as usize;
                from = start;
                plen = (w.len as usize - start.min(w.len as usize)).min(pmtu as usize);
                let only = n == 1;
                let last = k + 1 == n;
                let send = !matches!(
                    w.op,
                    WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. }
                );
                let imm = matches!(
                    w.op,
                    WrOpcode::SendWithImm { .. } | WrOpcode::RdmaWriteWithImm { .. }
                );
                let inv = matches!(w.op, WrOpcode::SendWithInvalidate { .. });
                use Operation::*;
                let op = match (send, only, k == 0, last) {
                    (true, true, ..) if imm => SendOnlyWithImmediate,
                    (true, true, ..) if inv => SendOnlyWithInvalidate,
                    (true, true, ..) => SendOnly,
                    (true, false, true, _) => SendFirst,
                    (true, false, false, true) if imm => SendLastWithImmediate,
                    (true, false, false, true) if inv => SendLastWithInvalidate,
                    (true, false, false, true) => SendLast,
                    (true, false, false, false) => SendMiddle,
                    (false, true, ..) if imm => RdmaWriteOnlyWithImmediate,
                    (false, true, ..) => RdmaWriteOnly,
                    (false, false, true, _) => RdmaWriteFirst,
                    (false, false, false, true) if imm => RdmaWriteLastWithImmediate,
                    (false, false, false, true) => RdmaWriteLast,
                    (false, false, false, false) => RdmaWriteMiddle,
                };
                (op, last)
            }
        };
        let opcode = Opcode::new(svc, op).expect("operation valid for the service");
        let mut bth = BthRepr::new(opcode, dest_qp, psn);
        bth.pkey = self.cfg.pkey;
        let end = last || opcode.operation().is_only();
        if svc == Service::Rc {
            self.noack_pkts += 1;
            // Ask at least twice per window, or a window smaller than the AckReq period
            // would wait for the ACK timer.
            let period = PKTS_PER_ACKREQ.min((self.cwnd.min(self.cfg.window) / 2).max(1));
            if end || self.noack_pkts >= period {
                bth.ack_req = true;
                self.noack_pkts = 0;
            }
        }
        let se_op = matches!(
            w.op,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::SendWithInvalidate { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
        );
        bth.se = last && se_op && w.solicited;
        let mut p = PacketRepr::new(bth, &[]);
        if svc == Service::Ud {
            let u = w.ud.expect("UD request has a destination");
            // C9-49 / verbs: a Q_Key with the high bit set means "the QP's own".
            let q_key = if u.remote_qkey & 0x8000_0000 != 0 {
                self.cfg.qkey
            } else {
                u.remote_qkey
            };
            p.deth = Some(DethRepr {
                q_key,
                reserved: 0,
                src_qp: self.cfg.qpn,
            });
        }
        match w.op {
            WrOpcode::RdmaWrite { remote_addr, rkey }
            | WrOpcode::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } if k == 0 => {
                p.reth = Some(RethRepr {
                    va: remote_addr,
                    r_key: rkey.0,
                    dma_len: w.len,
                });
            }
            WrOpcode::RdmaRead { remote_addr, rkey } => {
                // 9.7.6.1.1: a READ resent from its k-th response PSN asks for the rest.
                let skip = (k * pmtu).min(w.len);
                p.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(u64::from(skip)),
                    r_key: rkey.0,
                    dma_len: w.len - skip,
                });
            }
            WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                p.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    r_key: rkey.0,
                    swap_add_data: swap,
                    compare_data: compare,
                });
            }
            WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                p.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    r_key: rkey.0,
                    swap_add_data: add,
                    compare_data: 0,
                });
            }
            _ => {}
        }
        if last {
            match w.op {
                WrOpcode::SendWithImm { imm } | WrOpcode::RdmaWriteWithImm { imm, .. } => {
                    p.immdt = Some(ImmDtRepr {
                        immediate_data: imm,
                    });
                }
                WrOpcode::SendWithInvalidate { invalidate_rkey } => {
                    p.ieth = Some(IethRepr {
                        r_key: invalidate_rkey.0,
                    });
                }
                _ => {}
            }
        }
        // Headers in place, then the payload gathered from registered memory straight
        // behind them: one copy.
        let start = out.len();
        p.emit_headers(plen, out)
            .expect("request repr is well-formed");
        if plen > 0 && w.data.gather_extend(from as u64, plen, out).is_err() {
            out.truncate(start);
            return Err(WcStatus::LocalProtection);
        }
        out.resize(out.len() + pad_count(plen) as usize, 0);
        Ok((out.len() - start, last))
    }

    /// Handles one RC response packet (ACK, NAK, RDMA READ response, ATOMIC ACK) addressed
    /// to this QP, header pipeline already passed.
    pub fn handle_response(&mut self, pkt: &PacketRepr<'_>, now: Instant) {
        let op = pkt.bth.opcode;
        if self.error || self.cfg.service != Service::Rc || op.service() != Service::Rc {
            self.counters.stale_responses += 1;
            return;
        }
        let psn = pkt.bth.psn & PSN_MASK;
        // Only PSNs sent and not yet acknowledged (9.7.5.1.x: older ones are duplicates,
        // newer ones were never requested).
        if psn_diff(psn, self.una) < 0 || psn_diff(psn, self.max_sent) >= 0 {
            // An ACK/NAK for una − 1 is a harmless duplicate; anything else is stale too.
            self.counters.stale_responses += 1;
            // A READ response or ATOMIC result again: was the last go-back needed?
            if op.operation().is_response() && op.operation() != Operation::Acknowledge {
                self.reorder.duplicate(psn);
            }
            return;
        }
        // Forward progress is the oldest request advancing; the responder executing later
        // requests (`acked`) is not: those responses are echoes of a loss already acted on.
        let before = (self.una, self.sq.len());
        // How far the responder has executed (9.7.5.1: an ACK covers its PSN, a NAK the PSNs
        // before it, a READ response or ATOMIC ACK its request).
        let executed = match (op.operation(), pkt.aeth.map(|a| a.syndrome)) {
            (Operation::Acknowledge, Some(Syndrome::Ack { .. })) | (_, None) => psn_add(psn, 1),
            (Operation::Acknowledge, _) => psn,
            _ => psn_add(psn, 1),
        };
        if psn_diff(executed, self.acked) > 0 {
            self.acked = executed;
        }
        match op.operation() {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.aeth else {
                    self.counters.stale_responses += 1;
                    return;
                };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.ack_through(psn);
                        // An ACK past an uncompleted READ/ATOMIC: its responses were lost,
                        // or are late.
                        if let Some(w) = self.sq.front()
                            && w.op.is_read_or_atomic()
                            && psn_diff(psn, w.first_psn) >= 0
                        {
                            self.reorder.other();
                            self.gap_check();
                        }
                    }
                    Syndrome::RnrNak { timer } => {
                        self.ack_through(psn_add(psn, PSN_MASK));
                        self.counters.rnr_naks += 1;
                        if self.rnr_left == 0 {
                            self.fail(WcStatus::RnrRetryExceeded);
                            return;
                        }
                        if self.cfg.rnr_retry != 7 {
                            self.rnr_left -= 1;
                        }
                        // From `una`, not `psn`: an older READ/ATOMIC still waiting lost its
                        // responses (everything before `psn` was executed).
                        self.go_back(self.una);
                        self.rnr_until =
                            Some(now + Duration::from_micros(u64::from(timer.micros())));
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        tracing::debug!(qpn = self.cfg.qpn, psn, "NAK: PSN sequence error");
                        self.ack_through(psn_add(psn, PSN_MASK));
                        self.counters.seq_naks += 1;
                        self.on_loss(false);
                        // The packets sent behind an RNR-NAKed one reach the responder out of
                        // sequence (rxe then NAKs them): not a loss, the RNR wait already
                        // resends from there; it must not use up `retry_cnt`.
                        if self.rnr_until.is_some() && psn == self.una {
                            return;
                        }
                        if self.retry_left == 0 {
                            self.fail(WcStatus::RetryExceeded);
                            return;
                        }
                        self.retry_left -= 1;
                        self.go_back(self.una);
                        self.dup_head = self.retry_copies(false);
                    }
                    Syndrome::Nak(code) => {
                        tracing::warn!(qpn = self.cfg.qpn, psn, code = %code, "NAK: request failed");
                        self.ack_through(psn_add(psn, PSN_MASK));
                        // §13.3: fatal; the request completes in error, the QP goes to Error.
                        let status = match code {
                            NakCode::RemoteAccessError => WcStatus::RemoteAccess,
                            NakCode::RemoteOperationalError => WcStatus::RemoteOperation,
                            _ => WcStatus::RemoteInvalidRequest,
                        };
                        self.fail(status);
                        return;
                    }
                }
            }
            Operation::AtomicAcknowledge => {
                self.ack_through(psn_add(psn, PSN_MASK));
                if !self.atomic_response(pkt, psn) {
                    return;
                }
            }
            Operation::RdmaReadResponseFirst
            | Operation::RdmaReadResponseMiddle
            | Operation::RdmaReadResponseLast
            | Operation::RdmaReadResponseOnly => {
                self.ack_through(psn_add(psn, PSN_MASK));
                if !self.read_response(pkt, psn) {
                    return;
                }
            }
            _ => {
                self.counters.stale_responses += 1;
                return;
            }
        }
        if self.error {
            return;
        }
        self.settle();
        if (self.una, self.sq.len()) != before {
            self.on_progress(psn_diff(self.una, before.0).max(1) as u32);
            // Forward progress: reload the retry counters and restart the timer.
            self.retrying = false;
            self.retry_left = self.cfg.retry_cnt;
            self.rnr_left = self.cfg.rnr_retry;
            self.timer = if psn_diff(self.max_sent, self.una) > 0 {
                self.ack_timeout().map(|d| now + d)
            } else {
                None
            };
        }
        // ACKs past a go-back point: do not resend what is acknowledged.
        if psn_diff(self.tx_psn(), self.una) < 0 {
            self.go_back(self.una);
        }
        // What the ACK completed may have left a local operation at the front.
        self.run_locals();
    }

    /// Enough later responses passed the gap at `una`: its responses were lost (an
    /// implicit NAK, counted as a retry).
    fn gap_check(&mut self) {
        if self.reorder.gap_lost() {
            self.implicit_nak();
        }
    }

    /// The request that owns response PSN `psn`, if it is of the kind `is` accepts.
    fn owner(&self, psn: u32, is: impl Fn(&WrOpcode) -> bool) -> Option<&Wqe> {
        self.sq
            .iter()
            .find(|w| w.contains(psn))
            .filter(|w| is(&w.op))
    }

    /// Records a READ response or ATOMIC result placed at `psn`: at `una` it moves `una` on
    /// (`settle` completes the request), past it the gap is checked.
    fn placed(&mut self, psn: u32) {
        let ahead = psn_diff(psn, self.una) as u32;
        if ahead == 0 {
            self.reorder.filled(psn);
            self.set_una(psn_add(psn, 1));
        } else {
            self.reorder.mark(ahead);
            self.gap_check();
        }
    }

    /// Before a response at `psn` is placed: one too far ahead to keep is only counted (as
    /// evidence of a gap), one already placed is a duplicate. `Some(ok)` when there is
    /// nothing to place.
    fn screen(&mut self, psn: u32) -> Option<bool> {
        let ahead = psn_diff(psn, self.una) as u32;
        if ahead >= MAX_AHEAD {
            self.reorder.other();
            self.gap_check();
            return Some(!self.error);
        }
        if self.reorder.has(ahead) {
            self.counters.stale_responses += 1;
            return Some(true);
        }
        None
    }

    /// Places one ATOMIC result, in order or early; false if the queue failed. A response
    /// that cannot be placed fails the queue from its front, which keeps completions in order
    /// (the QP goes to the Error state either way).
    fn atomic_response(&mut self, pkt: &PacketRepr<'_>, psn: u32) -> bool {
        if let Some(ok) = self.screen(psn) {
            return ok;
        }
        let atomic = |op: &WrOpcode| {
            matches!(
                op,
                WrOpcode::AtomicCmpSwap { .. } | WrOpcode::AtomicFetchAdd { .. }
            )
        };
        let (Some(w), Some(ack)) = (self.owner(psn, atomic), pkt.atomic_ack_eth) else {
            self.fail(WcStatus::BadResponse);
            return false;
        };
        // The original value lands in host order, as verbs users read it.
        if let Err(s) = w.data.scatter_wc(0, &ack.orig_remote_data.to_ne_bytes()) {
            self.fail(s);
            return false;
        }
        self.placed(psn);
        !self.error
    }

    /// Places one READ response at its offset, in order or early; false if the queue failed.
    fn read_response(&mut self, pkt: &PacketRepr<'_>, psn: u32) -> bool {
        let pmtu = self.cfg.pmtu;
        if let Some(ok) = self.screen(psn) {
            return ok;
        }
        let Some(w) = self.owner(psn, |op| matches!(op, WrOpcode::RdmaRead { .. })) else {
            self.fail(WcStatus::BadResponse);
            return false;
        };
        let off = psn_diff(psn, w.first_psn) as u32 * pmtu;
        let remaining = w.len - off.min(w.len);
        let op = pkt.bth.opcode.operation();
        let final_pkt = remaining <= pmtu;
        // First/Middle carry exactly PMTU, Last/Only the rest; First vs Middle (Only vs
        // Last) may differ after a READ was re-issued mid-way, the data is the same.
        let fits = match op {
            Operation::RdmaReadResponseFirst | Operation::RdmaReadResponseMiddle => {
                !final_pkt && pkt.payload.len() == pmtu as usize
            }
            _ => final_pkt && pkt.payload.len() == remaining as usize,
        };
        if !fits {
            self.fail(WcStatus::BadResponse);
            return false;
        }
        if let Err(s) = w.data.scatter_wc(off as usize, pkt.payload) {
            self.fail(s);
            return false;
        }
        self.placed(psn);
        !self.error
    }

    /// Completes what the responses so far allow: SEND/WRITEs the responder executed, and
    /// READ/ATOMICs at the front whose responses all arrived (some of them early).
    fn settle(&mut self) {
        loop {
            // SEND/WRITEs after a READ/ATOMIC that just completed may be acknowledged already.
            self.ack_through(psn_sub(self.acked, 1));
            let Some(w) = self.sq.front() else {
                return;
            };
            if !w.op.is_read_or_atomic() {
                return;
            }
            if psn_diff(self.una, w.last_psn()) > 0 {
                let w = self.pop_front();
                self.rd_done(&w);
                self.complete(w, WcStatus::Success);
            } else if self.reorder.at_una() {
                self.set_una(psn_add(self.una, 1));
            } else {
                return;
            }
        }
    }

    /// Moves `una` forward to `psn`.
    fn set_una(&mut self, psn: u32) {
        let n = psn_diff(psn, self.una);
        if n > 0 {
            self.reorder.advance(n as u32);
            self.una = psn;
        }
    }

    fn rd_done(&mut self, w: &Wqe) {
        if w.op.is_read_or_atomic() && self.rd_outstanding > 0 {
            self.rd_outstanding -= 1;
        }
    }

    fn pop_front(&mut self) -> Wqe {
        let w = self.sq.pop_front().expect("front request");
        self.queued_psns -= w.npsn;
        self.set_una(psn_add(w.last_psn(), 1));
        if self.tx_idx > 0 {
            self.tx_idx -= 1;
        } else {
            self.tx_pkt = 0;
        }
        w
    }

    /// Completes SEND/WRITE requests acknowledged through `psn`, stopping at an uncompleted
    /// READ/ATOMIC (they complete on their own responses).
    fn ack_through(&mut self, psn: u32) {
        while let Some(w) = self.sq.front() {
            if w.op.is_read_or_atomic() || w.op.is_local() {
                return;
            }
            if psn_diff(psn, w.first_psn) < 0 {
                return;
            }
            if psn_diff(psn, w.last_psn()) >= 0 {
                let w = self.pop_front();
                self.complete(w, WcStatus::Success);
            } else {
                // Part of a multi-packet message.
                self.set_una(psn_add(psn, 1));
                return;
            }
        }
    }
}
