//! One queue pair, sans-IO: the QP state machine of IBA Vol. 1 §10.3 with `modify_qp`
//! attributes as verbs users know them (`ibv_qp_attr` + mask), the receive-side header
//! validation pipeline of §9.6 (ib-transport.md §8.2, as mapped onto RoCEv2 in §13.7), and the
//! requester / responder of [`crate::requester`] and [`crate::responder`] behind it.
//!
//! A driver parses each datagram (ICRC checked, `PacketRepr::parse`), finds the QP by the
//! BTH DestQP and calls [`IbQp::handle_packet`]; it sends what [`IbQp::poll_transmit`] writes
//! and calls [`IbQp::handle_timeout`] at [`IbQp::poll_timeout`].
//!
//! # Shared receive queues
//! [`IbQp::new_with_srq`] attaches the QP to a [`SharedRecvQueue`] of its protection domain
//! (`ibv_qp_init_attr.srq`); any QP type may. The QP then has no receive queue of its own:
//! [`IbQp::post_recv`] is refused with `PostError::SrqAttached` and `QpCaps::max_recv_wr` /
//! `max_recv_sge` are not used (the SRQ's `max_wr` / `max_sge` are). The responder takes a WQE
//! from the SRQ when a message needs one and completes it on this QP's receive completions
//! ([`IbQp::poll_recv_completion`], the WQE's own `wr_id`); see [`crate::responder`] for when
//! and what happens on errors. The verbs layer posts to the SRQ
//! ([`SharedRecvQueue::post_recv`]), arms and polls its limit
//! ([`SharedRecvQueue::arm_limit`], [`SharedRecvQueue::take_limit_event`]: the
//! `IBV_EVENT_SRQ_LIMIT_REACHED` async event of the SRQ) and, per QP, polls
//! [`IbQp::take_last_wqe_reached`] (`IBV_EVENT_QP_LAST_WQE_REACHED`) after an Error
//! transition. Entering Error flushes only the WQE this QP holds for a message in progress;
//! the SRQ's WQEs stay for the other QPs.

use std::sync::Arc;
use std::time::Instant;

use softrdma_memory::{Access, KeyTable, PdId, QpId};
use softrdma_verbs_types::{PostError, RecvWr, SendWr, SharedRecvQueue, WorkCompletion};
use softrdma_wire::ib::{DEFAULT_PKEY, PSN_MASK, PacketRepr, Service};

use crate::requester::{Requester, RequesterConfig, RequesterCounters, Tx};
use crate::responder::{Responder, ResponderConfig, ResponderCounters};

/// Transport service of a QP (`ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
}

impl QpType {
    /// The BTH service of this type's opcodes.
    pub const fn service(self) -> Service {
        match self {
            QpType::Rc => Service::Rc,
            QpType::Uc => Service::Uc,
            QpType::Ud => Service::Ud,
        }
    }
}

/// QP states (IBA 10.3.1, `ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created or reset: nothing is processed.
    Reset,
    /// Receives may be posted; nothing is processed.
    Init,
    /// Ready to Receive: inbound requests are processed.
    Rtr,
    /// Ready to Send.
    Rts,
    /// Send Queue Drain: no new request starts.
    Sqd,
    /// Send Queue Error (UC/UD): the send queue failed, receives go on.
    Sqe,
    /// Error: every request completes flushed.
    Error,
}

/// Queue sizes fixed at creation (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter entries per receive request.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// RC: most request PSNs in flight unacknowledged (not a verbs attribute; bounds what
    /// one loss costs under go-back-N).
    pub window: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
            window: 1024,
        }
    }
}

/// Attributes of `modify_qp`; `None` is "not in the attribute mask" (`ibv_qp_attr_mask`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// The new state (`IBV_QP_STATE`).
    pub state: Option<QpState>,
    /// P_Key (verbs name a P_Key table index; RoCE has the one default partition).
    pub pkey: Option<u16>,
    /// UD Q_Key (`IBV_QP_QKEY`).
    pub qkey: Option<u32>,
    /// Remote operations accepted (`IBV_QP_ACCESS_FLAGS`).
    pub access: Option<Access>,
    /// Path MTU in octets (`IBV_QP_PATH_MTU`): 256, 512, 1024, 2048 or 4096.
    pub pmtu: Option<u32>,
    /// Remote QP number (`IBV_QP_DEST_QPN`).
    pub dest_qp: Option<u32>,
    /// Expected PSN of the receive side (`IBV_QP_RQ_PSN`).
    pub rq_psn: Option<u32>,
    /// READ/ATOMIC requests accepted at once (`IBV_QP_MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer code (`IBV_QP_MIN_RNR_TIMER`).
    pub min_rnr_timer: Option<u8>,
    /// First PSN of the send side (`IBV_QP_SQ_PSN`).
    pub sq_psn: Option<u32>,
    /// Local ACK timeout code (`IBV_QP_TIMEOUT`).
    pub timeout: Option<u8>,
    /// `IBV_QP_RETRY_CNT`, 0..=7.
    pub retry_cnt: Option<u8>,
    /// `IBV_QP_RNR_RETRY`, 0..=7 (7: forever).
    pub rnr_retry: Option<u8>,
    /// READ/ATOMIC requests outstanding at once (`IBV_QP_MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: Option<u8>,
}

impl QpAttr {
    /// Only a state change.
    pub fn state(state: QpState) -> Self {
        QpAttr {
            state: Some(state),
            ..QpAttr::default()
        }
    }
}

/// Why `modify_qp` refused; the QP is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// Not a transition of IBA Figure 124 / the verbs table.
    #[error("no transition from {from:?} to {to:?}")]
    Transition {
        /// The current state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// A required attribute is not in the mask.
    #[error("attribute {0} is required for this transition")]
    Missing(&'static str),
    /// An attribute out of range.
    #[error("attribute {0} out of range")]
    Invalid(&'static str),
}

/// Why a QP could not be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    /// The shared receive queue belongs to another protection domain than the QP (verbs:
    /// `EINVAL`; the SRQ's WQEs name memory of its own domain).
    #[error("SRQ of protection domain {srq:?} given to a QP of domain {qp:?}")]
    SrqPd {
        /// The QP's domain.
        qp: PdId,
        /// The SRQ's domain.
        srq: PdId,
    },
}

/// Packets dropped by the header pipeline, by reason (IBT-X-18).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeaderCounters {
    /// BTH:TVer not 0 (C9-36).
    pub bad_tver: u64,
    /// The QP's state cannot receive (C9-37).
    pub bad_state: u64,
    /// OpCode of another service (C9-38).
    pub bad_service: u64,
    /// P_Key mismatch (C9-42).
    pub bad_pkey: u64,
    /// Q_Key mismatch on UD (C9-50).
    pub bad_qkey: u64,
    /// Malformed for its opcode (no DETH on UD etc.).
    pub malformed: u64,
    /// Packets that passed every check and went to the requester or responder.
    pub accepted: u64,
}

/// The receive-side path attributes set at INIT → RTR.
#[derive(Clone, Copy, Debug)]
struct Path {
    pmtu: u32,
    dest_qp: u32,
    rq_psn: u32,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
}

/// One InfiniBand queue pair.
pub struct IbQp {
    qpn: u32,
    qp_type: QpType,
    pd: PdId,
    caps: QpCaps,
    keys: Arc<KeyTable>,
    state: QpState,
    pkey: u16,
    qkey: u32,
    access: Access,
    path: Path,
    send: RequesterConfig,
    requester: Option<Requester>,
    responder: Responder,
    counters: HeaderCounters,
    drained_reported: bool,
    /// The shared receive queue receives come from, if any.
    srq: Option<Arc<SharedRecvQueue>>,
    /// Last WQE Reached is due (entered Error with an SRQ) and not yet taken.
    last_wqe_reached: bool,
    /// Request packets sent while a lone positive ACK waited behind them.
    passed_ack: u32,
}

/// Request packets a lone positive ACK lets go first at most: a stream of requests that never
/// pauses (a large Write posted behind another) would otherwise keep it back until the
/// peer's send queue fills with requests it cannot retire.
pub const ACK_WAITS_PACKETS: u32 = 16;

/// P_Key matching (IBA 10.9.3): the low 15 bits equal and not both limited members.
pub fn pkey_matches(a: u16, b: u16) -> bool {
    (a & 0x7FFF) == (b & 0x7FFF) && (a | b) & 0x8000 != 0 && a & 0x7FFF != 0
}

impl IbQp {
    /// A QP in the Reset state with its own receive queue.
    pub fn new(qpn: u32, qp_type: QpType, pd: PdId, caps: QpCaps, keys: Arc<KeyTable>) -> Self {
        Self::build(qpn, qp_type, pd, caps, keys, None)
    }

    /// A QP in the Reset state whose receives come from `srq` (`ibv_create_qp` with
    /// `init_attr.srq`; see the module docs). `SrqPd` when `srq` belongs to another
    /// protection domain.
    pub fn new_with_srq(
        qpn: u32,
        qp_type: QpType,
        pd: PdId,
        caps: QpCaps,
        keys: Arc<KeyTable>,
        srq: Arc<SharedRecvQueue>,
    ) -> Result<Self, CreateError> {
        if srq.pd() != pd {
            return Err(CreateError::SrqPd {
                qp: pd,
                srq: srq.pd(),
            });
        }
        Ok(Self::build(qpn, qp_type, pd, caps, keys, Some(srq)))
    }

    fn build(
        qpn: u32,
        qp_type: QpType,
        pd: PdId,
        caps: QpCaps,
        keys: Arc<KeyTable>,
        srq: Option<Arc<SharedRecvQueue>>,
    ) -> Self {
        let path = Path {
            pmtu: 1024,
            dest_qp: 0,
            rq_psn: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
        };
        let responder = Self::new_responder(
            Self::resp_cfg(qpn, qp_type, pd, &path, Access::REMOTE),
            &keys,
            &srq,
        );
        let mut send = RequesterConfig::rc(pd, qpn, 0, 0);
        send.service = qp_type.service();
        send.sq_depth = caps.max_send_wr;
        send.max_sge = caps.max_send_sge;
        send.max_inline = caps.max_inline_data;
        send.window = caps.window.max(1);
        IbQp {
            qpn,
            qp_type,
            pd,
            caps,
            keys,
            state: QpState::Reset,
            pkey: DEFAULT_PKEY,
            qkey: 0,
            access: Access::REMOTE,
            path,
            send,
            requester: None,
            responder,
            counters: HeaderCounters::default(),
            drained_reported: false,
            srq,
            last_wqe_reached: false,
            passed_ack: 0,
        }
    }

    fn new_responder(
        cfg: ResponderConfig,
        keys: &Arc<KeyTable>,
        srq: &Option<Arc<SharedRecvQueue>>,
    ) -> Responder {
        match srq {
            Some(srq) => Responder::with_srq(cfg, keys.clone(), srq.clone()),
            None => Responder::new(cfg, keys.clone()),
        }
    }

    fn resp_cfg(
        qpn: u32,
        qp_type: QpType,
        pd: PdId,
        path: &Path,
        access: Access,
    ) -> ResponderConfig {
        ResponderConfig {
            pd,
            qp: QpId(qpn),
            pmtu: path.pmtu,
            epsn: path.rq_psn,
            max_rd_atomic: u16::from(path.max_dest_rd_atomic),
            min_rnr_timer: path.min_rnr_timer,
            dest_qp: path.dest_qp,
            service: qp_type.service(),
            access,
        }
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Service type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The UD Q_Key set at INIT (`IBV_QP_QKEY`).
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Path MTU in force.
    pub fn pmtu(&self) -> u32 {
        self.path.pmtu
    }

    /// Remote QP (RC/UC).
    pub fn dest_qp(&self) -> u32 {
        self.path.dest_qp
    }

    /// The shared receive queue this QP takes its receives from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedRecvQueue>> {
        self.srq.as_ref()
    }

    /// Header-pipeline drop counters.
    pub fn counters(&self) -> HeaderCounters {
        self.counters
    }

    /// Requester counters (zero before RTS).
    pub fn requester_counters(&self) -> RequesterCounters {
        self.requester
            .as_ref()
            .map(|r| r.counters())
            .unwrap_or_default()
    }

    /// Responder counters.
    pub fn responder_counters(&self) -> ResponderCounters {
        self.responder.counters()
    }

    /// Caps the RC send window (PSNs unacknowledged) at `window`, e.g. to what the peer's
    /// socket buffer holds; applies now and to later RTR → RTS transitions.
    pub fn set_window(&mut self, window: u32) {
        self.send.window = window.max(1);
        if let Some(r) = &mut self.requester {
            r.set_window(self.send.window);
        }
    }

    /// Send requests posted and not completed.
    pub fn sq_outstanding(&self) -> usize {
        self.requester.as_ref().map_or(0, |r| r.outstanding())
    }

    /// `ibv_modify_qp`: validates the transition and its required attributes, then applies
    /// them (IBA 10.3 and Table 91 of the verbs chapter, as Linux checks them).
    pub fn modify(&mut self, attr: &QpAttr) -> Result<(), ModifyError> {
        use QpState::*;
        let from = self.state;
        let to = attr.state.unwrap_or(from);
        let rc = self.qp_type == QpType::Rc;
        let conn = self.qp_type != QpType::Ud;
        let ok = matches!(
            (from, to),
            (_, Reset)
                | (_, Error)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Sqd)
                | (Sqd, Rts)
                | (Sqe, Rts)
        ) && !(from == Sqe && to == Rts && rc);
        if !ok {
            return Err(ModifyError::Transition { from, to });
        }
        // Ranges (verbs: EINVAL).
        if let Some(m) = attr.pmtu
            && !matches!(m, 256 | 512 | 1024 | 2048 | 4096)
        {
            return Err(ModifyError::Invalid("path_mtu"));
        }
        for (v, name) in [(attr.retry_cnt, "retry_cnt"), (attr.rnr_retry, "rnr_retry")] {
            if v.is_some_and(|v| v > 7) {
                return Err(ModifyError::Invalid(name));
            }
        }
        for (v, name) in [
            (attr.timeout, "timeout"),
            (attr.min_rnr_timer, "min_rnr_timer"),
        ] {
            if v.is_some_and(|v| v > 31) {
                return Err(ModifyError::Invalid(name));
            }
        }
        for (v, name) in [
            (attr.rq_psn, "rq_psn"),
            (attr.sq_psn, "sq_psn"),
            (attr.dest_qp, "dest_qp_num"),
        ] {
            if v.is_some_and(|v| v > PSN_MASK) {
                return Err(ModifyError::Invalid(name));
            }
        }
        let require = |v: bool, name: &'static str| {
            if v {
                Ok(())
            } else {
                Err(ModifyError::Missing(name))
            }
        };
        match (from, to) {
            (Reset, Init) if !conn => require(attr.qkey.is_some(), "qkey")?,
            (Init, Rtr) if conn => {
                require(attr.pmtu.is_some(), "path_mtu")?;
                require(attr.dest_qp.is_some(), "dest_qp_num")?;
                require(attr.rq_psn.is_some(), "rq_psn")?;
                if rc {
                    require(attr.max_dest_rd_atomic.is_some(), "max_dest_rd_atomic")?;
                    require(attr.min_rnr_timer.is_some(), "min_rnr_timer")?;
                }
            }
            (Rtr, Rts) => {
                require(attr.sq_psn.is_some(), "sq_psn")?;
                if rc {
                    require(attr.timeout.is_some(), "timeout")?;
                    require(attr.retry_cnt.is_some(), "retry_cnt")?;
                    require(attr.rnr_retry.is_some(), "rnr_retry")?;
                    require(attr.max_rd_atomic.is_some(), "max_rd_atomic")?;
                }
            }
            _ => {}
        }
        // Apply.
        if let Some(p) = attr.pkey {
            self.pkey = p;
        }
        if let Some(q) = attr.qkey {
            self.qkey = q;
        }
        if let Some(a) = attr.access {
            self.access = a;
        }
        if let Some(m) = attr.pmtu {
            self.path.pmtu = m;
        }
        if let Some(d) = attr.dest_qp {
            self.path.dest_qp = d;
        }
        if let Some(p) = attr.rq_psn {
            self.path.rq_psn = p;
        }
        if let Some(n) = attr.max_dest_rd_atomic {
            self.path.max_dest_rd_atomic = n;
        }
        if let Some(t) = attr.min_rnr_timer {
            self.path.min_rnr_timer = t;
        }
        let s = &mut self.send;
        s.pmtu = self.path.pmtu;
        s.dest_qp = self.path.dest_qp;
        s.pkey = self.pkey;
        s.qkey = self.qkey;
        if let Some(p) = attr.sq_psn {
            s.sq_psn = p;
        }
        if let Some(t) = attr.timeout {
            s.timeout = t;
        }
        if let Some(n) = attr.retry_cnt {
            s.retry_cnt = n;
        }
        if let Some(n) = attr.rnr_retry {
            s.rnr_retry = n;
        }
        if let Some(n) = attr.max_rd_atomic {
            s.max_rd_atomic = n;
        }
        let rcfg = Self::resp_cfg(self.qpn, self.qp_type, self.pd, &self.path, self.access);
        match (from, to) {
            (_, Reset) => {
                // IBA 10.3.1: a QP with an SRQ should go through Error (and Last WQE
                // Reached) first; a WQE it still held for a message is dropped here like
                // every other queued request.
                self.requester = None;
                self.responder = Self::new_responder(rcfg, &self.keys, &self.srq);
                self.last_wqe_reached = false;
            }
            (_, Error) => {
                if let Some(r) = &mut self.requester {
                    r.flush();
                }
                self.responder.flush();
                if from != Error {
                    self.last_wqe_reached = self.srq.is_some();
                }
            }
            (Init, Rtr) => self.responder.reconfigure(rcfg),
            (Rtr, Rts) => {
                self.requester = Some(Requester::new(self.send, self.keys.clone()));
            }
            (Rts, Sqd) => {
                self.drained_reported = false;
                if let Some(r) = &mut self.requester {
                    r.drain();
                }
            }
            (Sqd | Sqe | Rts, Rts) => {
                if let Some(r) = &mut self.requester {
                    r.update(self.send);
                    r.resume();
                }
            }
            _ => {}
        }
        // `qp_access_flags` may change in INIT -> INIT, RTR -> RTS, RTS -> RTS, SQD -> RTS too.
        self.responder.set_access(self.access);
        self.state = to;
        Ok(())
    }

    /// `ibv_post_send`: RTS and SQD accept requests (SQD queues them); Error flushes them;
    /// the other states refuse.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        match (self.state, &mut self.requester) {
            (QpState::Rts | QpState::Sqd | QpState::Error | QpState::Sqe, Some(r)) => {
                r.post_send(wr)
            }
            (QpState::Error, None) => {
                // Never reached RTS: a requester only to flush.
                let mut r = Requester::new(self.send, self.keys.clone());
                r.flush();
                let res = r.post_send(wr);
                self.requester = Some(r);
                res
            }
            _ => Err(PostError::State),
        }
    }

    /// `ibv_post_recv`: any state but Reset; Error completes it flushed at once.
    /// `SrqAttached` on a QP with a shared receive queue (post to the SRQ).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        match self.state {
            _ if self.srq.is_some() => Err(PostError::SrqAttached),
            QpState::Reset => Err(PostError::State),
            _ if wr.sg_list.len() > self.caps.max_recv_sge as usize => Err(PostError::TooManySge {
                max: self.caps.max_recv_sge as usize,
            }),
            _ if self.responder.rq_len() >= self.caps.max_recv_wr as usize => {
                Err(PostError::QueueFull)
            }
            QpState::Error => {
                self.responder.push_flushed(wr.wr_id);
                Ok(())
            }
            _ => self.responder.post_recv(wr),
        }
    }

    /// Handles one parsed packet addressed to this QP (ICRC already checked by the driver).
    /// `grh` is the 40-octet GRH image of the packet's IP header, placed ahead of UD
    /// payloads.
    pub fn handle_packet(&mut self, pkt: &PacketRepr<'_>, grh: &[u8; 40], now: Instant) {
        // ib-transport.md §8.2, in order.
        if pkt.bth.tver != 0 {
            self.counters.bad_tver += 1; // C9-36
            return;
        }
        let can_receive = matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if !can_receive {
            self.counters.bad_state += 1; // C9-37
            return;
        }
        let op = pkt.bth.opcode;
        if op.service() != self.qp_type.service() {
            self.counters.bad_service += 1; // C9-38
            return;
        }
        if !pkey_matches(pkt.bth.pkey, self.pkey) {
            self.counters.bad_pkey += 1; // C9-42
            return;
        }
        if self.qp_type == QpType::Ud {
            let Some(deth) = pkt.deth else {
                self.counters.malformed += 1;
                return;
            };
            if deth.q_key != self.qkey {
                self.counters.bad_qkey += 1; // C9-50
                return;
            }
            self.counters.accepted += 1;
            self.responder.handle_datagram(pkt, grh);
            return;
        }
        self.counters.accepted += 1;
        if op.operation().is_response() {
            match &mut self.requester {
                Some(r) => {
                    r.handle_response(pkt, now);
                    self.follow_send_queue();
                }
                None => self.counters.bad_state += 1,
            }
        } else {
            self.responder.handle_packet(pkt);
        }
    }

    /// Writes the next packet to send into `out` (cleared first): responses first, then
    /// requests — but a lone positive ACK ([`Responder::ack_may_wait`]) goes after the
    /// requests, so a reply reaches the peer before the ACK of what it answers; after at most
    /// [`ACK_WAITS_PACKETS`] of them.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Tx> {
        self.poll_transmit_holding(now, out, false)
    }

    /// As [`IbQp::poll_transmit`]; with `hold_ack`, a lone positive ACK is not sent at all
    /// ([`IbQp::ack_held`] then says so): a driver whose caller is about to post the reply
    /// sends it with that reply, in one batch, instead of before it. The driver must send it
    /// later without `hold_ack`, whatever happens (the peer's requester retries without it).
    pub fn poll_transmit_holding(
        &mut self,
        now: Instant,
        out: &mut Vec<u8>,
        hold_ack: bool,
    ) -> Option<Tx> {
        out.clear();
        self.append_transmit(now, out, hold_ack)
    }

    /// As [`IbQp::poll_transmit_holding`], the packet appended to `out` (`Tx::len` octets
    /// from its former end): a driver builds datagrams in place, behind the headers it
    /// reserved, and batches of them in one buffer.
    pub fn append_transmit(
        &mut self,
        now: Instant,
        out: &mut Vec<u8>,
        hold_ack: bool,
    ) -> Option<Tx> {
        if self.state == QpState::Reset || self.state == QpState::Init {
            return None;
        }
        let lone_ack = self.responder.ack_may_wait() && self.passed_ack < ACK_WAITS_PACKETS;
        if !lone_ack && let Some(len) = self.responder.poll_response(out) {
            self.passed_ack = 0;
            return Some(Tx { len, dest: None });
        }
        if matches!(self.state, QpState::Rts | QpState::Sqd)
            && let Some(r) = self.requester.as_mut()
        {
            let tx = r.poll_transmit(now, out);
            self.follow_send_queue();
            if tx.is_some() {
                if lone_ack {
                    self.passed_ack += 1;
                }
                return tx;
            }
        }
        if lone_ack && !hold_ack {
            self.passed_ack = 0;
            return self
                .responder
                .poll_response(out)
                .map(|len| Tx { len, dest: None });
        }
        None
    }

    /// Whether a positive ACK waits to be sent (see [`IbQp::poll_transmit_holding`]).
    pub fn ack_held(&self) -> bool {
        self.state != QpState::Reset && self.state != QpState::Init && self.responder.ack_may_wait()
    }

    /// Next send-queue completion.
    pub fn poll_send_completion(&mut self) -> Option<WorkCompletion> {
        self.requester.as_mut()?.poll_completion()
    }

    /// Next receive-queue completion.
    pub fn poll_recv_completion(&mut self) -> Option<WorkCompletion> {
        self.responder.poll_completion()
    }

    /// Whether either queue has a completion to poll.
    pub fn has_completion(&self) -> bool {
        self.responder.has_completion()
            || self.requester.as_ref().is_some_and(|r| r.has_completion())
    }

    /// When [`IbQp::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.requester.as_ref()?.poll_timeout()
    }

    /// Runs the requester's timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(r) = &mut self.requester {
            r.handle_timeout(now);
            self.follow_send_queue();
        }
    }

    /// The QP state after the send queue acted: a fatal NAK or exhausted retries put the QP
    /// in Error (§13.3), receives flushed too; a UC/UD send error stops only the send queue
    /// (SQE, IBA 10.3.1).
    fn follow_send_queue(&mut self) {
        let Some(r) = &self.requester else { return };
        if r.is_error() {
            if self.state != QpState::Error {
                self.state = QpState::Error;
                self.responder.flush();
                self.last_wqe_reached = self.srq.is_some();
            }
        } else if r.is_sqe() && matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.state = QpState::Sqe;
        }
    }

    /// Last WQE Reached (`IBV_EVENT_QP_LAST_WQE_REACHED`), reported once per entry into the
    /// Error state of a QP with an SRQ. IBA o11-5.2.5: the event is due on a QP in Error
    /// associated with an SRQ once a completion was generated for its last WQE or it holds
    /// none; the engine completes the WQE in progress (flushed) during the transition itself,
    /// so the event is due as soon as the QP is in Error. o11-5.2.5 names RC and UD; UC QPs
    /// report it too (as rxe does). Afterwards the QP takes no WQE from
    /// the SRQ: once its receive completions are polled it may be destroyed or reset without
    /// leaking SRQ WQEs (IBA 10.3.1).
    pub fn take_last_wqe_reached(&mut self) -> bool {
        std::mem::take(&mut self.last_wqe_reached)
    }

    /// SQD and the send queue drained (reported once per SQD transition, as the
    /// `IBV_EVENT_SQ_DRAINED` async event).
    pub fn take_sq_drained(&mut self) -> bool {
        if self.state == QpState::Sqd
            && !self.drained_reported
            && self.requester.as_ref().is_none_or(|r| r.is_drained())
        {
            self.drained_reported = true;
            return true;
        }
        false
    }
}
