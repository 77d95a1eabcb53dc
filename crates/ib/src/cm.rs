//! The InfiniBand Communication Manager (IBA vol. 1 ch. 12) as a sans-IO engine: the
//! connection state machine of both sides (REQ, MRA, REJ, REP, RTU, DREQ, DREP) and
//! service ID resolution for UD (SIDR_REQ, SIDR_REP), with response timeouts, retries,
//! delayed MRAs, time-wait and the handling of duplicate and stale messages.
//!
//! The engine speaks MADs (256 octets, the payload of a UD Send to QP1 with Q_Key
//! [`GSI_QKEY`]) to peers named by IP address (RoCEv2: a GID is an IP address). The driver
//! feeds it what arrives on QP1 ([`Cm::handle_mad`]) and the clock ([`Cm::handle_timeout`]),
//! sends what [`Cm::poll_transmit`] gives, and acts on [`Cm::poll_event`]: it moves the QPs
//! through their states and answers requests with [`Cm::accept`], [`Cm::reject`],
//! [`Cm::rtu`], [`Cm::sidr_reply`].
//!
//! Timing follows Linux's `ib_cm` and `rdma_cm` over RoCE, so that a Linux peer sees what it
//! sees from another Linux host: CM response timeout 20 (4.3 s), 15 retries, packet life
//! time 16, an MRA (service timeout 24) sent only when the peer repeats a message the
//! consumer has not answered yet, time-wait of one local ACK timeout. Every message from
//! the network is checked against the connection it names (its IDs, its sender, the state)
//! and dropped, counted, when it does not fit; nothing a peer sends makes the engine hold
//! more than [`CmConfig::max_ids`] connections, nor one address more than
//! [`CmConfig::max_pending_per_source`] unsettled requests, nor a REP wait for its RTU past
//! [`CmConfig::rtu_timeout`]; an answered SIDR request holds no ID.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use softrdma_wire::ib::cm::{
    CmMessage, CmPath, CommIdsRepr, DreqRepr, MraRepr, RejRepr, RepRepr, ReqRepr, SidrRepRepr,
    SidrReqRepr,
};
use softrdma_wire::ib::cma::gid_of;
use softrdma_wire::ib::mad::{
    BASE_VERSION, CM_CLASS_VERSION, MAD_HEADER_LEN, MAD_LEN, MGMT_CLASS_CM, MadHeaderRepr, method,
};

/// The General Services Interface QP (IBA 13.5.1).
pub const GSI_QPN: u32 = 1;
/// QP1's Q_Key (IBA 13.5.1, the well-known GSI Q_Key).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// A local communication ID.
pub type CommId = u32;

/// REJ reasons (IBA 12.6.7.2, table 112) the engine sends or a consumer may use.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources (too many connections).
    pub const NO_RESOURCES: u16 = 3;
    /// The peer did not answer within its retries.
    pub const TIMEOUT: u16 = 4;
    /// A message names a connection ID we do not know.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Nobody listens on the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Neither RC nor UC.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// A connection of that QP is known already (or in time-wait).
    pub const STALE_CONN: u16 = 10;
    /// The REQ's primary path names a GID that is not ours.
    pub const INVALID_GID: u16 = 12;
    /// The path MTU is not one of 256..4096.
    pub const INVALID_MTU: u16 = 26;
    /// The consumer rejected (with its private data).
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// SIDR_REP statuses (IBA 12.11.2, table 117).
pub mod sidr_status {
    /// The QP is valid.
    pub const OK: u8 = 0;
    /// Nobody serves the service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The consumer rejected.
    pub const REJECT: u8 = 2;
    /// No QP.
    pub const NO_QP: u8 = 3;
}

/// What the engine uses of the port and its timing.
#[derive(Clone, Debug)]
pub struct CmConfig {
    /// Our address (the GID of the port).
    pub local: IpAddr,
    /// The CA GUID put in REQ and REP (and duplicate REQs are recognised by it).
    pub ca_guid: u64,
    /// The upper half of every TID we issue (Linux: the MAD agent's id).
    pub tid_high: u32,
    /// Seeds the local communication IDs (unpredictable ones make stale messages of an
    /// earlier run miss).
    pub id_seed: u32,
    /// How long we take to answer, as told to the peer: 4.096 µs × 2^value.
    pub cm_response_timeout: u8,
    /// Retransmissions of a message before giving up.
    pub max_cm_retries: u8,
    /// Packet life time of the path (4.096 µs × 2^value).
    pub packet_life_time: u8,
    /// Our CA's ACK delay (REP's Target ACK Delay).
    pub ack_delay: u8,
    /// The service timeout we put in MRAs.
    pub mra_service_timeout: u8,
    /// Connections and SIDR requests held at once (time-wait included).
    pub max_ids: usize,
    /// Requests from one address held before the connection is established or the SIDR
    /// request answered (REQ received, REP sent; SIDR_REQ received): past it a REQ is
    /// refused with REJ "no resources" and a SIDR_REQ with SIDR_REP "rejected", so that
    /// one peer's burst leaves room for others.
    pub max_pending_per_source: usize,
    /// The longest our REP waits for its RTU, whatever the requester's response timeout,
    /// retries and MRAs ask for (they could make a REQ hold its ID for hours); then it is
    /// given up as if its retries ran out (REJ "timeout", IBA 12.9.6). The default, 16
    /// request intervals (77 s), is past the 16 REPs a Linux requester's timing asks for
    /// (69 s), so such peers see Linux's behaviour.
    pub rtu_timeout: Duration,
    /// SIDR_REPs kept to answer a repeated SIDR_REQ (for time-wait); they hold no ID and
    /// the oldest makes room for a new one past this.
    pub max_sidr_answers: usize,
}

impl CmConfig {
    /// Linux's values over RoCE (`rdma_cm`, rxe): response timeout 20, 15 retries, packet
    /// life time 16, ACK delay 15, MRA service timeout 24; 4096 IDs; 64 pending requests
    /// per source; 16 request intervals (77 s) for an RTU; 1024 SIDR answers kept.
    pub fn new(local: IpAddr, ca_guid: u64, tid_high: u32, id_seed: u32) -> CmConfig {
        let mut c = CmConfig {
            local,
            ca_guid,
            tid_high,
            id_seed,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 16,
            ack_delay: 15,
            mra_service_timeout: 24,
            max_ids: 4096,
            max_pending_per_source: 64,
            rtu_timeout: Duration::ZERO,
            max_sidr_answers: 1024,
        };
        c.rtu_timeout = c.request_interval() * (u32::from(c.max_cm_retries) + 1);
        c
    }

    /// How long we wait for the answer to our REQ or DREQ before sending it again (Linux:
    /// twice the packet life time plus the responder's response time).
    pub fn request_interval(&self) -> Duration {
        iba_time(self.packet_life_time) * 2 + iba_time(self.cm_response_timeout)
    }

    /// The Local ACK Timeout of our REQs' paths (Linux's `cm_ack_timeout`: about
    /// 2 × packet life time + ACK delay, rounded to the larger term).
    pub fn local_ack_timeout(&self) -> u8 {
        let d = i32::from(self.ack_delay);
        let mut t = i32::from(self.packet_life_time) + 1;
        if t >= d {
            t += i32::from(d >= t - 1);
        } else {
            t = d + i32::from(t >= d - 1);
        }
        t.min(31) as u8
    }
}

/// IBA time: 4.096 µs × 2^`t` (12.6.5).
pub fn iba_time(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << t.min(31))
}

/// The QP service a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmService {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
}

/// What [`Cm::connect`] puts in the REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReqParams {
    /// Where to.
    pub peer: IpAddr,
    /// The service ID asked for.
    pub service_id: u64,
    /// Our QP.
    pub qpn: u32,
    /// RC or UC.
    pub service: CmService,
    /// The first PSN our QP expects: the responder sends from it (Linux's reading of
    /// IBA 12.7.23, which `rxe-rping.pcap` shows: each side names its receive PSN).
    pub starting_psn: u32,
    /// RDMA Reads and atomics we serve at a time.
    pub responder_resources: u8,
    /// RDMA Reads and atomics we keep outstanding.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits, 7 = forever).
    pub rnr_retry_count: u8,
    /// Path MTU code (1 = 256 .. 5 = 4096).
    pub path_mtu: u8,
    /// Our QP takes receives from an SRQ.
    pub srq: bool,
    /// The path's flow label (20 bits).
    pub flow_label: u32,
    /// At most [`REQ_PRIVATE_LEN`](softrdma_wire::ib::cm::REQ_PRIVATE_LEN) octets.
    pub private_data: Vec<u8>,
}

/// A REQ as the passive side sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReqInfo {
    /// The sender.
    pub peer: IpAddr,
    /// The service ID asked for.
    pub service_id: u64,
    /// The requester's QP.
    pub qpn: u32,
    /// RC or UC.
    pub service: CmService,
    /// The first PSN the requester's QP expects: ours to send from.
    pub starting_psn: u32,
    /// What the requester serves.
    pub responder_resources: u8,
    /// What the requester keeps outstanding.
    pub initiator_depth: u8,
    /// Transport retries asked for.
    pub retry_count: u8,
    /// RNR retries asked for.
    pub rnr_retry_count: u8,
    /// Path MTU code.
    pub path_mtu: u8,
    /// The primary path's Local ACK Timeout.
    pub local_ack_timeout: u8,
    /// The requester uses an SRQ.
    pub srq: bool,
    /// The primary path.
    pub path: CmPath,
    /// All 92 octets.
    pub private_data: Vec<u8>,
}

/// What [`Cm::accept`] puts in the REP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepParams {
    /// Our QP.
    pub qpn: u32,
    /// The first PSN our QP expects: the requester sends from it.
    pub starting_psn: u32,
    /// What we serve.
    pub responder_resources: u8,
    /// What we keep outstanding.
    pub initiator_depth: u8,
    /// RNR retries the requester's QP should make.
    pub rnr_retry_count: u8,
    /// Our QP takes receives from an SRQ.
    pub srq: bool,
    /// At most [`REP_PRIVATE_LEN`](softrdma_wire::ib::cm::REP_PRIVATE_LEN) octets.
    pub private_data: Vec<u8>,
}

/// A REP as the active side sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepInfo {
    /// The responder's QP.
    pub qpn: u32,
    /// The first PSN the responder's QP expects: ours to send from.
    pub starting_psn: u32,
    /// What the responder serves.
    pub responder_resources: u8,
    /// What the responder keeps outstanding.
    pub initiator_depth: u8,
    /// RNR retries for our QP.
    pub rnr_retry_count: u8,
    /// The responder uses an SRQ.
    pub srq: bool,
    /// All 196 octets.
    pub private_data: Vec<u8>,
}

/// What the driver must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service we listen on: answer with [`Cm::accept`] or [`Cm::reject`].
    Request {
        /// The new connection.
        id: CommId,
        /// What it asks.
        req: ReqInfo,
    },
    /// Our REQ was answered: bring the QP to RTS, then [`Cm::rtu`] (or [`Cm::reject`]).
    Reply {
        /// The connection.
        id: CommId,
        /// What the responder said.
        rep: RepInfo,
    },
    /// The requester's RTU arrived: the connection is established.
    Established {
        /// The connection.
        id: CommId,
    },
    /// The peer rejected our REQ or REP; the ID is gone.
    Rejected {
        /// The connection.
        id: CommId,
        /// Why ([`reason`]).
        reason: u16,
        /// The peer's private data (148 octets).
        private_data: Vec<u8>,
    },
    /// The peer never answered our REQ, REP or SIDR_REQ (a REJ with reason Timeout went
    /// to it for REQ and REP); the ID is gone.
    TimedOut {
        /// The connection.
        id: CommId,
    },
    /// The connection ended: the peer's DREQ (answered), its DREP to ours, or our DREQ
    /// unanswered. The QP should go to Error; the ID is in time-wait.
    Disconnected {
        /// The connection.
        id: CommId,
        /// The peer asked (DREQ).
        by_peer: bool,
    },
    /// A SIDR_REQ for a service we listen on: answer with [`Cm::sidr_reply`].
    SidrRequest {
        /// The request.
        id: CommId,
        /// The sender.
        peer: IpAddr,
        /// The service ID asked for.
        service_id: u64,
        /// All 216 octets.
        private_data: Vec<u8>,
    },
    /// The answer to our SIDR_REQ; the ID is gone.
    SidrReply {
        /// The request.
        id: CommId,
        /// [`sidr_status`].
        status: u8,
        /// The responder's UD QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// All 136 octets.
        private_data: Vec<u8>,
    },
}

/// Why a call into the engine was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such connection (or it is gone).
    #[error("unknown connection id {0:#x}")]
    UnknownId(CommId),
    /// The connection is not in a state where this is allowed.
    #[error("connection {id:#x} is {state:?}")]
    InvalidState {
        /// The connection.
        id: CommId,
        /// Its state.
        state: CmState,
    },
    /// Someone listens on this service ID already.
    #[error("service ID {0:#x} is in use")]
    ServiceIdInUse(u64),
    /// [`CmConfig::max_ids`] connections exist.
    #[error("too many connections")]
    NoResources,
    /// Private data longer than the message carries, or a field out of range.
    #[error("{0}")]
    Invalid(&'static str),
}

/// A connection's state (IBA 12.9.6, figures 147–148).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmState {
    /// REQ sent, waiting for REP.
    ReqSent,
    /// The responder sent an MRA for our REQ.
    MraReqRcvd,
    /// REQ received, the consumer has not answered.
    ReqRcvd,
    /// REQ received and MRA sent.
    MraReqSent,
    /// REP sent, waiting for RTU.
    RepSent,
    /// The requester sent an MRA for our REP.
    MraRepRcvd,
    /// REP received, the consumer has not sent the RTU.
    RepRcvd,
    /// REP received and MRA sent.
    MraRepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected; the ID waits before it is reused.
    TimeWait,
    /// SIDR_REQ sent.
    SidrReqSent,
    /// SIDR_REQ received, the consumer has not answered.
    SidrReqRcvd,
    /// SIDR_REP sent. No ID stays in it any more: answers are kept apart, for repeats
    /// ([`CmConfig::max_sidr_answers`]).
    SidrAnswered,
}

/// What the engine counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CmCounters {
    /// MADs handled.
    pub rx: u64,
    /// MADs sent.
    pub tx: u64,
    /// Not a CM MAD of class version 2, or a CM message that does not parse.
    pub malformed: u64,
    /// A message for an ID we do not have, from another sender, or not fitting the state.
    pub dropped: u64,
    /// Duplicates answered (MRA, RTU, DREP, SIDR_REP resent).
    pub duplicates: u64,
    /// Messages sent again after a timeout.
    pub retransmits: u64,
    /// Connections and requests given up for want of an answer.
    pub timeouts: u64,
    /// REJs sent.
    pub rejects_sent: u64,
}

type Mad = Box<[u8; MAD_LEN]>;

struct Conn {
    state: CmState,
    peer: IpAddr,
    tid: u64,
    remote_id: u32,
    remote_guid: u64,
    local_qpn: u32,
    remote_qpn: u32,
    service_id: u64,
    /// The message resent until it is answered.
    out: Option<Mad>,
    retries_left: u8,
    /// How long we wait for an answer to `out`.
    interval: Duration,
    /// The peer's own retries (what our REP gets) and answer time.
    peer_retries: u8,
    peer_interval: Duration,
    deadline: Option<Instant>,
    /// Our last answer (RTU, DREP, SIDR_REP, MRA), sent again when the peer repeats itself.
    answer: Option<Mad>,
    /// A passive request not settled yet: counted in `pending_from` for its peer.
    pending: bool,
    /// REP sent: when we stop waiting for the RTU ([`CmConfig::rtu_timeout`]).
    give_up: Option<Instant>,
}

impl Conn {
    /// A connection in `state` with `peer`, nothing learnt of it yet.
    fn new(state: CmState, peer: IpAddr, tid: u64, service_id: u64) -> Conn {
        Conn {
            state,
            peer,
            tid,
            remote_id: 0,
            remote_guid: 0,
            local_qpn: 0,
            remote_qpn: 0,
            service_id,
            out: None,
            retries_left: 0,
            interval: Duration::ZERO,
            peer_retries: 0,
            peer_interval: Duration::ZERO,
            deadline: None,
            answer: None,
            pending: false,
            give_up: None,
        }
    }
}

/// The CM of one port.
pub struct Cm {
    cfg: CmConfig,
    conns: HashMap<CommId, Conn>,
    /// Passive connections by the requester's (communication ID, CA GUID): duplicate REQs.
    by_remote: HashMap<(u32, u64), CommId>,
    /// Connections by the peer's (address, QPN): stale REQs.
    by_qpn: HashMap<(IpAddr, u32), CommId>,
    /// SIDR requests received, by (sender, request ID).
    sidr_in: HashMap<(IpAddr, u32), CommId>,
    /// SIDR_REPs sent, by (sender, request ID), for repeats: the answer and when it is
    /// forgotten; `sidr_order` has them oldest first.
    sidr_answers: HashMap<(IpAddr, u32), (Instant, Mad)>,
    sidr_order: VecDeque<(Instant, (IpAddr, u32))>,
    /// Passive requests not settled yet, by peer ([`CmConfig::max_pending_per_source`]).
    pending_from: HashMap<IpAddr, usize>,
    timers: BTreeSet<(Instant, CommId)>,
    listening: std::collections::HashSet<u64>,
    out: VecDeque<(IpAddr, Mad)>,
    events: VecDeque<CmEvent>,
    next_id: u32,
    next_tid: u32,
    counters: CmCounters,
}

/// Our MADs in flight and events held at most (a peer flooding duplicates cannot grow
/// them further: what overflows is dropped, and the peer retries).
const QUEUE_LIMIT: usize = 8192;

impl Cm {
    /// An engine with no connections and no listeners.
    pub fn new(cfg: CmConfig) -> Cm {
        Cm {
            next_id: cfg.id_seed,
            next_tid: 1,
            cfg,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            by_qpn: HashMap::new(),
            sidr_in: HashMap::new(),
            sidr_answers: HashMap::new(),
            sidr_order: VecDeque::new(),
            pending_from: HashMap::new(),
            timers: BTreeSet::new(),
            listening: Default::default(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// What was counted.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// The state of a connection, `None` once it is gone.
    pub fn state(&self, id: CommId) -> Option<CmState> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// Connections and requests held (time-wait included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// No connection is held.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Takes REQs and SIDR_REQs for `service_id`.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listening.insert(service_id) {
            return Err(CmError::ServiceIdInUse(service_id));
        }
        Ok(())
    }

    /// Stops taking requests for `service_id` (those received stay).
    pub fn unlisten(&mut self, service_id: u64) {
        self.listening.remove(&service_id);
    }

    /// Whether someone listens on `service_id`.
    pub fn is_listening(&self, service_id: u64) -> bool {
        self.listening.contains(&service_id)
    }

    /// The next MAD to send and where to.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, Mad)> {
        let m = self.out.pop_front()?;
        self.counters.tx += 1;
        Some(m)
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Cm::handle_timeout) is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(t, _)| t)
    }

    fn new_id(&mut self) -> Option<CommId> {
        if self.conns.len() >= self.cfg.max_ids {
            return None;
        }
        loop {
            // A Weyl sequence: every 32-bit value once per cycle, none predictable from the
            // one before without the seed.
            self.next_id = self.next_id.wrapping_add(0x9E37_79B9);
            let id = self.next_id;
            if id != 0 && !self.conns.contains_key(&id) {
                return Some(id);
            }
        }
    }

    fn new_tid(&mut self) -> u64 {
        let t = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        (u64::from(self.cfg.tid_high) << 32) | u64::from(t)
    }

    fn set_timer(&mut self, id: CommId, at: Option<Instant>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        // No retry or MRA keeps a REP waiting past `rtu_timeout`.
        let at = match (at, c.give_up) {
            (Some(t), Some(g)) if waits_for_rtu(c.state) => Some(t.min(g)),
            _ => at,
        };
        if let Some(old) = c.deadline.take() {
            self.timers.remove(&(old, id));
        }
        c.deadline = at;
        if let Some(t) = at {
            self.timers.insert((t, id));
        }
    }

    /// Whether a new passive request from `peer` fits its source's quota.
    fn source_has_room(&self, peer: IpAddr) -> bool {
        let held = self.pending_from.get(&peer).copied().unwrap_or(0);
        held < self.cfg.max_pending_per_source.max(1)
    }

    /// Counts passive request `id` against its peer's quota.
    fn mark_pending(&mut self, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id)
            && !c.pending
        {
            c.pending = true;
            *self.pending_from.entry(c.peer).or_default() += 1;
        }
    }

    /// Passive request `id` is settled (established, answered, ended): its place in its
    /// peer's quota is free.
    fn settle(&mut self, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id)
            && c.pending
        {
            c.pending = false;
            if let Some(n) = self.pending_from.get_mut(&c.peer) {
                *n -= 1;
                if *n == 0 {
                    self.pending_from.remove(&c.peer);
                }
            }
        }
    }

    fn remove(&mut self, id: CommId) {
        self.set_timer(id, None);
        self.settle(id);
        if let Some(c) = self.conns.remove(&id) {
            if self.by_remote.get(&(c.remote_id, c.remote_guid)) == Some(&id) {
                self.by_remote.remove(&(c.remote_id, c.remote_guid));
            }
            if self.by_qpn.get(&(c.peer, c.remote_qpn)) == Some(&id) {
                self.by_qpn.remove(&(c.peer, c.remote_qpn));
            }
            if self.sidr_in.get(&(c.peer, c.remote_id)) == Some(&id) {
                self.sidr_in.remove(&(c.peer, c.remote_id));
            }
        }
    }

    fn time_wait(&self) -> Duration {
        iba_time(self.cfg.local_ack_timeout())
    }

    fn enter_time_wait(&mut self, id: CommId, now: Instant) {
        self.settle(id);
        let tw = self.time_wait();
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::TimeWait;
            c.out = None;
        }
        self.set_timer(id, Some(now + tw));
    }

    fn send(&mut self, peer: IpAddr, mad: Mad) {
        if self.out.len() < QUEUE_LIMIT {
            self.out.push_back((peer, mad));
        }
    }

    fn event(&mut self, ev: CmEvent) {
        if self.events.len() < QUEUE_LIMIT {
            self.events.push_back(ev);
        }
    }

    /// Sends `mad` on `id` and waits for its answer, retrying.
    fn send_expecting(
        &mut self,
        id: CommId,
        mad: Mad,
        retries: u8,
        interval: Duration,
        now: Instant,
    ) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.out = Some(mad.clone());
        c.retries_left = retries;
        c.interval = interval;
        let peer = c.peer;
        self.send(peer, mad);
        self.set_timer(id, Some(now + interval));
    }

    /// Starts a connection (`ib_send_cm_req`): a REQ to `p.peer`.
    pub fn connect(&mut self, now: Instant, p: &ReqParams) -> Result<CommId, CmError> {
        if !(1..=5).contains(&p.path_mtu) {
            return Err(CmError::Invalid("path MTU code is 1 (256) to 5 (4096)"));
        }
        let id = self.new_id().ok_or(CmError::NoResources)?;
        let tid = self.new_tid();
        let c = &self.cfg;
        let req = ReqRepr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: c.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn & 0xFF_FFFF,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: c.cm_response_timeout,
            transport_service_type: match p.service {
                CmService::Rc => 0,
                CmService::Uc => 1,
            },
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn & 0xFF_FFFF,
            local_cm_response_timeout: c.cm_response_timeout,
            retry_count: p.retry_count.min(7),
            pkey: 0xFFFF,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: c.max_cm_retries.min(15),
            srq: p.srq,
            extended_transport_type: 0,
            primary: self.path_to(p.peer, p.flow_label),
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: &p.private_data,
        };
        let mad = mad_of(tid, &CmMessage::Req(req))?;
        let interval = c.request_interval();
        let retries = c.max_cm_retries;
        self.conns.insert(
            id,
            Conn {
                local_qpn: p.qpn,
                ..Conn::new(CmState::ReqSent, p.peer, tid, p.service_id)
            },
        );
        self.send_expecting(id, mad, retries, interval, now);
        Ok(id)
    }

    /// The primary path of a REQ to `peer` over RoCE: permissive LIDs (not subnet-local),
    /// the GIDs of both addresses, hop limit 64, as `rdma_cm` fills it.
    fn path_to(&self, peer: IpAddr, flow_label: u32) -> CmPath {
        CmPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid_of(self.cfg.local),
            remote_gid: gid_of(peer),
            flow_label: flow_label & 0xF_FFFF,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: self.cfg.local_ack_timeout(),
        }
    }

    fn conn_in(&self, id: CommId, ok: &[CmState]) -> Result<&Conn, CmError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        if ok.contains(&c.state) {
            Ok(c)
        } else {
            Err(CmError::InvalidState { id, state: c.state })
        }
    }

    /// Accepts a REQ (`ib_send_cm_rep`): the REP, resent until the RTU comes.
    pub fn accept(&mut self, now: Instant, id: CommId, p: &RepParams) -> Result<(), CmError> {
        let c = self.conn_in(id, &[CmState::ReqRcvd, CmState::MraReqSent])?;
        let rep = RepRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn & 0xFF_FFFF,
            local_eecn: 0,
            starting_psn: p.starting_psn & 0xFF_FFFF,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: self.cfg.ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            vendor_id: 0,
            private_data: &p.private_data,
        };
        let mad = mad_of(c.tid, &CmMessage::Rep(rep))?;
        let (retries, interval) = (c.peer_retries, c.peer_interval);
        let c = self.conns.get_mut(&id).ok_or(CmError::UnknownId(id))?;
        c.state = CmState::RepSent;
        c.local_qpn = p.qpn;
        c.answer = None;
        c.give_up = Some(now + self.cfg.rtu_timeout);
        self.send_expecting(id, mad, retries, interval, now);
        Ok(())
    }

    /// Rejects a REQ or a REP (`ib_send_cm_rej`) with `reason` ([`reason`]) and private
    /// data; the ID is gone.
    pub fn reject(&mut self, id: CommId, why: u16, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conn_in(
            id,
            &[
                CmState::ReqRcvd,
                CmState::MraReqSent,
                CmState::RepRcvd,
                CmState::MraRepSent,
                CmState::ReqSent,
                CmState::MraReqRcvd,
            ],
        )?;
        let msg = match c.state {
            CmState::ReqRcvd | CmState::MraReqSent => 0,
            _ => 1,
        };
        let rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_rejected: msg,
            reject_info_length: 0,
            reason: why,
            ari: &[],
            private_data,
        };
        let mad = mad_of(c.tid, &CmMessage::Rej(rej))?;
        let peer = c.peer;
        self.counters.rejects_sent += 1;
        self.send(peer, mad);
        self.remove(id);
        Ok(())
    }

    /// Completes the active side (`ib_send_cm_rtu`) once the QP is in RTS.
    pub fn rtu(&mut self, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conn_in(id, &[CmState::RepRcvd, CmState::MraRepSent])?;
        let rtu = CommIdsRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data,
        };
        let mad = mad_of(c.tid, &CmMessage::Rtu(rtu))?;
        let peer = c.peer;
        self.send(peer, mad.clone());
        let c = self.conns.get_mut(&id).ok_or(CmError::UnknownId(id))?;
        c.state = CmState::Established;
        // Sent again if the REP comes again (our RTU was lost).
        c.answer = Some(mad);
        self.set_timer(id, None);
        Ok(())
    }

    /// The QP of a connection whose REP was sent got a packet from the peer: that stands
    /// for the RTU (IBA 12.9.6, "communication established"; the RTU may be lost). Nothing
    /// in any other state.
    pub fn established(&mut self, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !matches!(c.state, CmState::RepSent | CmState::MraRepRcvd) {
            return;
        }
        c.state = CmState::Established;
        c.out = None;
        self.set_timer(id, None);
        self.settle(id);
        self.event(CmEvent::Established { id });
    }

    /// Tells the peer we need time to answer its REQ or REP (`ib_send_cm_mra`).
    pub fn delay(&mut self, id: CommId) -> Result<(), CmError> {
        self.conn_in(id, &[CmState::ReqRcvd, CmState::RepRcvd])?;
        self.send_mra(id);
        Ok(())
    }

    fn send_mra(&mut self, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let msg = match c.state {
            CmState::ReqRcvd | CmState::MraReqSent => {
                c.state = CmState::MraReqSent;
                0
            }
            CmState::RepRcvd | CmState::MraRepSent => {
                c.state = CmState::MraRepSent;
                1
            }
            _ => return,
        };
        let mra = MraRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_mraed: msg,
            service_timeout: self.cfg.mra_service_timeout,
            private_data: &[],
        };
        if let Ok(mad) = mad_of(c.tid, &CmMessage::Mra(mra)) {
            let peer = c.peer;
            self.send(peer, mad);
        }
    }

    /// Ends a connection (`ib_send_cm_dreq`): the DREQ, resent until the DREP comes.
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), CmError> {
        let c = self.conn_in(
            id,
            &[CmState::Established, CmState::RepSent, CmState::MraRepRcvd],
        )?;
        let dreq = DreqRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn_eecn: c.remote_qpn,
            private_data: &[],
        };
        let mad = mad_of(c.tid, &CmMessage::Dreq(dreq))?;
        let interval = self.cfg.request_interval();
        let retries = self.cfg.max_cm_retries;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::DreqSent;
        }
        self.send_expecting(id, mad, retries, interval, now);
        Ok(())
    }

    /// Connections whose DREQ is not answered yet.
    pub fn disconnecting(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.state == CmState::DreqSent)
            .count()
    }

    /// Sends every unanswered DREQ again now, without spending a retry: a closing driver
    /// hurries them before it stops (the peer answers a repeated DREQ with a DREP, IBA
    /// 12.9.8.5).
    pub fn hurry_disconnects(&mut self) {
        let again: Vec<_> = self
            .conns
            .values()
            .filter(|c| c.state == CmState::DreqSent)
            .filter_map(|c| Some((c.peer, c.out.clone()?)))
            .collect();
        for (peer, m) in again {
            self.counters.retransmits += 1;
            self.send(peer, m);
        }
    }

    /// Gives up on a connection without telling the peer what to do: a pending REQ, REP
    /// or SIDR is rejected, an established connection disconnected; otherwise nothing.
    pub fn destroy(&mut self, now: Instant, id: CommId) {
        match self.conns.get(&id).map(|c| c.state) {
            Some(CmState::ReqRcvd | CmState::MraReqSent) => {
                let _ = self.reject(id, reason::CONSUMER_DEFINED, &[]);
            }
            Some(
                CmState::RepRcvd | CmState::MraRepSent | CmState::ReqSent | CmState::MraReqRcvd,
            ) => {
                let _ = self.reject(id, reason::TIMEOUT, &[]);
            }
            Some(CmState::Established | CmState::RepSent | CmState::MraRepRcvd) => {
                let _ = self.disconnect(now, id);
            }
            Some(CmState::SidrReqRcvd) => {
                let _ = self.sidr_reply(now, id, sidr_status::REJECT, 0, 0, &[]);
            }
            Some(CmState::SidrReqSent) => self.remove(id),
            _ => {}
        }
    }

    /// Asks `peer` which UD QP serves `service_id` (SIDR_REQ).
    pub fn sidr_request(
        &mut self,
        now: Instant,
        peer: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<CommId, CmError> {
        let id = self.new_id().ok_or(CmError::NoResources)?;
        let tid = self.new_tid();
        let req = SidrReqRepr {
            request_id: id,
            pkey: 0xFFFF,
            service_id,
            private_data,
        };
        let mad = mad_of(tid, &CmMessage::SidrReq(req))?;
        // rdma_cm: 2^(20 - 8) ms per try.
        let interval = iba_time(self.cfg.cm_response_timeout);
        self.conns
            .insert(id, Conn::new(CmState::SidrReqSent, peer, tid, service_id));
        let retries = self.cfg.max_cm_retries;
        self.send_expecting(id, mad, retries, interval, now);
        Ok(id)
    }

    /// Answers a SIDR_REQ (`ib_send_cm_sidr_rep`).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        id: CommId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn_in(id, &[CmState::SidrReqRcvd])?;
        let rep = SidrRepRepr {
            request_id: c.remote_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: qpn & 0xFF_FFFF,
            service_id: c.service_id,
            qkey,
            additional_info: &[],
            private_data,
        };
        let mad = mad_of(c.tid, &CmMessage::SidrRep(rep))?;
        let key = (c.peer, c.remote_id);
        self.send(key.0, mad.clone());
        // The request needs no ID any more: only its answer is kept, for a repeat.
        self.remove(id);
        self.keep_sidr_answer(now, key, mad);
        Ok(())
    }

    /// Keeps a SIDR_REP for time-wait, the oldest making room past `max_sidr_answers`.
    fn keep_sidr_answer(&mut self, now: Instant, key: (IpAddr, u32), mad: Mad) {
        let max = self.cfg.max_sidr_answers;
        while let Some(&(until, k)) = self.sidr_order.front() {
            if until > now && self.sidr_order.len() < max {
                break;
            }
            self.sidr_order.pop_front();
            if self.sidr_answers.get(&k).is_some_and(|(u, _)| *u == until) {
                self.sidr_answers.remove(&k);
            }
        }
        if max == 0 {
            return;
        }
        let until = now + self.time_wait();
        self.sidr_order.push_back((until, key));
        self.sidr_answers.insert(key, (until, mad));
    }

    /// Retransmits what is unanswered, gives up what ran out of retries, ends time-waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.remove(&(t, id));
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.deadline = None;
            match c.state {
                CmState::TimeWait | CmState::SidrAnswered => self.remove(id),
                CmState::ReqRcvd | CmState::MraReqSent | CmState::RepRcvd | CmState::MraRepSent => {
                    // The consumer never answered.
                    self.counters.timeouts += 1;
                    let _ = self.reject(id, reason::TIMEOUT, &[]);
                    self.event(CmEvent::TimedOut { id });
                }
                CmState::SidrReqRcvd => self.remove(id),
                _ if c.retries_left > 0
                    && !(waits_for_rtu(c.state) && c.give_up.is_some_and(|g| now >= g)) =>
                {
                    c.retries_left -= 1;
                    let (peer, interval) = (c.peer, c.interval);
                    if let Some(m) = c.out.clone() {
                        self.counters.retransmits += 1;
                        self.send(peer, m);
                    }
                    self.set_timer(id, Some(now + interval));
                }
                state => {
                    self.counters.timeouts += 1;
                    match state {
                        CmState::DreqSent => {
                            self.enter_time_wait(id, now);
                            self.event(CmEvent::Disconnected { id, by_peer: false });
                        }
                        CmState::ReqSent
                        | CmState::MraReqRcvd
                        | CmState::RepSent
                        | CmState::MraRepRcvd => {
                            self.reject_timeout(id);
                            self.event(CmEvent::TimedOut { id });
                        }
                        _ => {
                            self.remove(id);
                            self.event(CmEvent::TimedOut { id });
                        }
                    }
                }
            }
        }
    }

    /// A REJ with reason Timeout and our CA GUID as its information (IBA 12.6.7.2), then
    /// the ID is gone.
    fn reject_timeout(&mut self, id: CommId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let guid = self.cfg.ca_guid.to_be_bytes();
        let rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_rejected: match c.state {
                CmState::ReqSent | CmState::MraReqRcvd => 1,
                _ => 0,
            },
            reject_info_length: 8,
            reason: reason::TIMEOUT,
            ari: &guid,
            private_data: &[],
        };
        if let Ok(mad) = mad_of(c.tid, &CmMessage::Rej(rej)) {
            let peer = c.peer;
            self.counters.rejects_sent += 1;
            self.send(peer, mad);
        }
        self.remove(id);
    }

    /// A MAD that arrived on QP1 from `from` (the Send's payload; the BTH, DETH, P_Key and
    /// Q_Key were the driver's to check).
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, mad: &[u8]) {
        self.counters.rx += 1;
        let Ok(h) = MadHeaderRepr::parse(mad) else {
            self.counters.malformed += 1;
            return;
        };
        // IBA 13.4.4: only the CM class, version 2, method Send is ours.
        if h.base_version != BASE_VERSION
            || h.mgmt_class != MGMT_CLASS_CM
            || h.class_version != CM_CLASS_VERSION
            || h.method != method::SEND
        {
            self.counters.malformed += 1;
            return;
        }
        let Some(data) = mad.get(MAD_HEADER_LEN..) else {
            self.counters.malformed += 1;
            return;
        };
        let Ok(msg) = CmMessage::parse(h.attribute_id, data) else {
            self.counters.malformed += 1;
            return;
        };
        let tid = h.transaction_id;
        match msg {
            CmMessage::Req(m) => self.on_req(now, from, tid, &m),
            CmMessage::Mra(m) => self.on_mra(now, from, &m),
            CmMessage::Rej(m) => self.on_rej(now, from, &m),
            CmMessage::Rep(m) => self.on_rep(now, from, tid, &m),
            CmMessage::Rtu(m) => self.on_rtu(from, &m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, tid, &m),
            CmMessage::Drep(m) => self.on_drep(now, from, &m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, from, tid, &m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(from, &m),
        }
    }

    /// A REJ answering a message for which we keep no connection (IBA 12.6.7.2).
    fn issue_rej(&mut self, to: IpAddr, tid: u64, their_id: u32, our_id: u32, msg: u8, why: u16) {
        let rej = RejRepr {
            local_comm_id: our_id,
            remote_comm_id: their_id,
            message_rejected: msg,
            reject_info_length: 0,
            reason: why,
            ari: &[],
            private_data: &[],
        };
        if let Ok(mad) = mad_of(tid, &CmMessage::Rej(rej)) {
            self.counters.rejects_sent += 1;
            self.send(to, mad);
        }
    }

    /// The connection a message names with its Remote Communication ID, if it came from
    /// that connection's peer.
    fn named(&mut self, from: IpAddr, our_id: u32) -> Option<&mut Conn> {
        match self.conns.get_mut(&our_id) {
            Some(c) if c.peer == from => Some(c),
            _ => {
                self.counters.dropped += 1;
                None
            }
        }
    }

    fn resend_answer(&mut self, id: CommId) {
        if let Some(c) = self.conns.get(&id)
            && let Some(m) = c.answer.clone()
        {
            let peer = c.peer;
            self.counters.duplicates += 1;
            self.send(peer, m);
        }
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, tid: u64, m: &ReqRepr<'_>) {
        // A repeated REQ (IBA 12.9.6: the requester timed out waiting for us).
        if let Some(&id) = self.by_remote.get(&(m.local_comm_id, m.local_ca_guid)) {
            match self.conns.get(&id).map(|c| c.state) {
                Some(CmState::ReqRcvd | CmState::MraReqSent) => {
                    self.counters.duplicates += 1;
                    self.send_mra(id);
                }
                Some(CmState::TimeWait) => {
                    self.issue_rej(from, tid, m.local_comm_id, id, 0, reason::STALE_CONN)
                }
                // Our REP is on its way and retried; anything else has moved on.
                _ => self.counters.dropped += 1,
            }
            return;
        }
        let reject = |cm: &mut Cm, why: u16| {
            cm.issue_rej(from, tid, m.local_comm_id, 0, 0, why);
        };
        let service = match m.transport_service_type {
            0 => CmService::Rc,
            1 => CmService::Uc,
            _ => return reject(self, reason::INVALID_TRANSPORT_TYPE),
        };
        if !(1..=5).contains(&m.path_mtu) {
            return reject(self, reason::INVALID_MTU);
        }
        if m.primary.remote_gid != gid_of(self.cfg.local) {
            return reject(self, reason::INVALID_GID);
        }
        if let Some(&old) = self.by_qpn.get(&(from, m.local_qpn)) {
            // The peer's QP is ours already, on another connection: that one is stale
            // (IBA 12.9.8.3.1): refuse this REQ and end the old connection.
            reject(self, reason::STALE_CONN);
            if self.conns.get(&old).map(|c| c.state) == Some(CmState::Established) {
                let _ = self.disconnect(now, old);
            }
            return;
        }
        if !self.listening.contains(&m.service_id) {
            return reject(self, reason::INVALID_SERVICE_ID);
        }
        if !self.source_has_room(from) {
            return reject(self, reason::NO_RESOURCES);
        }
        let Some(id) = self.new_id() else {
            return reject(self, reason::NO_RESOURCES);
        };
        // How long the requester waits for our REP, and retries ours: its own figures.
        let peer_interval = iba_time(m.local_cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                remote_id: m.local_comm_id,
                remote_guid: m.local_ca_guid,
                remote_qpn: m.local_qpn,
                peer_retries: m.max_cm_retries,
                peer_interval,
                ..Conn::new(CmState::ReqRcvd, from, tid, m.service_id)
            },
        );
        self.by_remote
            .insert((m.local_comm_id, m.local_ca_guid), id);
        self.by_qpn.insert((from, m.local_qpn), id);
        self.mark_pending(id);
        // The consumer has until our MRA's service timeout ran out.
        let wait = iba_time(self.cfg.mra_service_timeout);
        self.set_timer(id, Some(now + wait));
        self.event(CmEvent::Request {
            id,
            req: ReqInfo {
                peer: from,
                service_id: m.service_id,
                qpn: m.local_qpn,
                service,
                starting_psn: m.starting_psn,
                responder_resources: m.responder_resources,
                initiator_depth: m.initiator_depth,
                retry_count: m.retry_count,
                rnr_retry_count: m.rnr_retry_count,
                path_mtu: m.path_mtu,
                local_ack_timeout: m.primary.local_ack_timeout,
                srq: m.srq,
                path: m.primary,
                private_data: m.private_data.to_vec(),
            },
        });
    }

    fn on_rep(&mut self, now: Instant, from: IpAddr, tid: u64, m: &RepRepr<'_>) {
        let id = m.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id).filter(|c| c.peer == from) else {
            // IBA 12.6.7.2: a REP for no connection of ours is rejected.
            self.counters.dropped += 1;
            self.issue_rej(from, tid, m.local_comm_id, id, 1, reason::INVALID_COMM_ID);
            return;
        };
        match c.state {
            CmState::ReqSent | CmState::MraReqRcvd => {}
            CmState::RepRcvd | CmState::MraRepSent => {
                if c.remote_id == m.local_comm_id {
                    self.counters.duplicates += 1;
                    self.send_mra(id);
                }
                return;
            }
            CmState::Established if c.remote_id == m.local_comm_id => {
                return self.resend_answer(id);
            }
            _ => {
                self.counters.dropped += 1;
                return;
            }
        }
        c.state = CmState::RepRcvd;
        c.remote_id = m.local_comm_id;
        c.remote_guid = m.local_ca_guid;
        c.remote_qpn = m.local_qpn;
        c.out = None;
        // The responder retries its REP on our response timeout.
        let peer = c.peer;
        self.by_qpn.insert((peer, m.local_qpn), id);
        let wait = iba_time(self.cfg.mra_service_timeout);
        self.set_timer(id, Some(now + wait));
        self.event(CmEvent::Reply {
            id,
            rep: RepInfo {
                qpn: m.local_qpn,
                starting_psn: m.starting_psn,
                responder_resources: m.responder_resources,
                initiator_depth: m.initiator_depth,
                rnr_retry_count: m.rnr_retry_count,
                srq: m.srq,
                private_data: m.private_data.to_vec(),
            },
        });
    }

    fn on_rtu(&mut self, from: IpAddr, m: &CommIdsRepr<'_>) {
        let id = m.remote_comm_id;
        let Some(c) = self.named(from, id) else {
            return;
        };
        if c.remote_id != m.local_comm_id
            || !matches!(c.state, CmState::RepSent | CmState::MraRepRcvd)
        {
            self.counters.dropped += 1;
            return;
        }
        c.state = CmState::Established;
        c.out = None;
        self.set_timer(id, None);
        self.settle(id);
        self.event(CmEvent::Established { id });
    }

    fn on_mra(&mut self, now: Instant, from: IpAddr, m: &MraRepr<'_>) {
        let id = m.remote_comm_id;
        let service = iba_time(m.service_timeout) + iba_time(self.cfg.packet_life_time);
        let Some(c) = self.named(from, id) else {
            return;
        };
        let next = match (m.message_mraed, c.state) {
            (0, CmState::ReqSent) => CmState::MraReqRcvd,
            (1, CmState::RepSent) if c.remote_id == m.local_comm_id => CmState::MraRepRcvd,
            // Repeated MRAs keep the wait going.
            (0, CmState::MraReqRcvd) => CmState::MraReqRcvd,
            (1, CmState::MraRepRcvd) if c.remote_id == m.local_comm_id => CmState::MraRepRcvd,
            _ => {
                self.counters.dropped += 1;
                return;
            }
        };
        c.state = next;
        // IBA 12.6.6: the peer answers within its service timeout; our retries wait.
        self.set_timer(id, Some(now + service));
    }

    fn on_rej(&mut self, now: Instant, from: IpAddr, m: &RejRepr<'_>) {
        let id = m.remote_comm_id;
        let Some(c) = self.named(from, id) else {
            return;
        };
        // After our REQ the rejecter may not have an ID for us; later it must be its own.
        let fits = match c.state {
            CmState::ReqSent | CmState::MraReqRcvd => true,
            // The requester gave its REQ up (IBA 12.9.6: REJ in REQ Rcvd goes to Idle).
            CmState::ReqRcvd | CmState::MraReqSent => c.remote_id == m.local_comm_id,
            CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::RepRcvd
            | CmState::MraRepSent
            | CmState::Established => c.remote_id == m.local_comm_id,
            _ => false,
        };
        if !fits {
            self.counters.dropped += 1;
            return;
        }
        let was_established = c.state == CmState::Established;
        let ev = CmEvent::Rejected {
            id,
            reason: m.reason,
            private_data: m.private_data.to_vec(),
        };
        if m.reason == reason::STALE_CONN || was_established {
            self.enter_time_wait(id, now);
        } else {
            self.remove(id);
        }
        self.event(ev);
    }

    fn on_dreq(&mut self, now: Instant, from: IpAddr, tid: u64, m: &DreqRepr<'_>) {
        let id = m.remote_comm_id;
        let drep = |cm: &mut Cm, local: u32| {
            let d = CommIdsRepr {
                local_comm_id: local,
                remote_comm_id: m.local_comm_id,
                private_data: &[],
            };
            mad_of(tid, &CmMessage::Drep(d)).ok().inspect(|mad| {
                cm.send(from, mad.clone());
            })
        };
        let state = match self.conns.get(&id) {
            Some(c)
                if c.peer == from
                    && c.remote_id == m.local_comm_id
                    && c.local_qpn == m.remote_qpn_eecn =>
            {
                c.state
            }
            _ => {
                // IBA 12.9.8.5: answer a DREQ for no connection, so the peer stops.
                self.counters.dropped += 1;
                drep(self, id);
                return;
            }
        };
        match state {
            CmState::Established | CmState::RepSent | CmState::MraRepRcvd | CmState::DreqSent => {
                let mad = drep(self, id);
                self.enter_time_wait(id, now);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.answer = mad;
                }
                self.event(CmEvent::Disconnected { id, by_peer: true });
            }
            CmState::TimeWait => {
                self.counters.duplicates += 1;
                drep(self, id);
            }
            _ => self.counters.dropped += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, from: IpAddr, m: &CommIdsRepr<'_>) {
        let id = m.remote_comm_id;
        let Some(c) = self.named(from, id) else {
            return;
        };
        if c.state != CmState::DreqSent || c.remote_id != m.local_comm_id {
            self.counters.dropped += 1;
            return;
        }
        self.enter_time_wait(id, now);
        self.event(CmEvent::Disconnected { id, by_peer: false });
    }

    fn on_sidr_req(&mut self, now: Instant, from: IpAddr, tid: u64, m: &SidrReqRepr<'_>) {
        if let Some((until, mad)) = self.sidr_answers.get(&(from, m.request_id))
            && *until > now
        {
            let mad = mad.clone();
            self.counters.duplicates += 1;
            self.send(from, mad);
            return;
        }
        if self.sidr_in.contains_key(&(from, m.request_id)) {
            self.counters.duplicates += 1;
            return;
        }
        let status = if !self.listening.contains(&m.service_id) {
            Some(sidr_status::UNSUPPORTED)
        } else if !self.source_has_room(from) || self.conns.len() >= self.cfg.max_ids {
            Some(sidr_status::REJECT)
        } else {
            None
        };
        if let Some(status) = status {
            let rep = SidrRepRepr {
                request_id: m.request_id,
                status,
                additional_info_length: 0,
                vendor_id: 0,
                qpn: 0,
                service_id: m.service_id,
                qkey: 0,
                additional_info: &[],
                private_data: &[],
            };
            if let Ok(mad) = mad_of(tid, &CmMessage::SidrRep(rep)) {
                self.send(from, mad);
            }
            return;
        }
        let Some(id) = self.new_id() else { return };
        self.conns.insert(
            id,
            Conn {
                remote_id: m.request_id,
                ..Conn::new(CmState::SidrReqRcvd, from, tid, m.service_id)
            },
        );
        self.sidr_in.insert((from, m.request_id), id);
        self.mark_pending(id);
        let wait = iba_time(self.cfg.mra_service_timeout);
        self.set_timer(id, Some(now + wait));
        self.event(CmEvent::SidrRequest {
            id,
            peer: from,
            service_id: m.service_id,
            private_data: m.private_data.to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, from: IpAddr, m: &SidrRepRepr<'_>) {
        let id = m.request_id;
        let Some(c) = self.named(from, id) else {
            return;
        };
        if c.state != CmState::SidrReqSent || c.service_id != m.service_id {
            self.counters.dropped += 1;
            return;
        }
        self.remove(id);
        self.event(CmEvent::SidrReply {
            id,
            status: m.status,
            qpn: m.qpn,
            qkey: m.qkey,
            private_data: m.private_data.to_vec(),
        });
    }
}

/// A REP is out and its RTU awaited.
fn waits_for_rtu(state: CmState) -> bool {
    matches!(state, CmState::RepSent | CmState::MraRepRcvd)
}

/// A CM MAD: the header with `tid`, then `msg`.
fn mad_of(tid: u64, msg: &CmMessage<'_>) -> Result<Mad, CmError> {
    let mut b: Mad = Box::new([0u8; MAD_LEN]);
    MadHeaderRepr::cm(msg.attr().into(), tid)
        .emit(&mut b[..])
        .map_err(|_| CmError::Invalid("MAD header"))?;
    msg.emit(&mut b[MAD_HEADER_LEN..])
        .map_err(|_| CmError::Invalid("private data longer than the message carries"))?;
    Ok(b)
}

#[cfg(test)]
mod tests;
