//! Queue pairs (`ibv_qp`): one type for every transport.
//!
//! The device a context was opened on decides what is underneath: an RDMAP stream over a TCP
//! connection (iWARP), or an InfiniBand QP over UDP (RoCEv2). QP types are attributes
//! (RC on both; UC and UD on RoCE); what a transport cannot do is refused with a typed error
//! ([`Error::Unsupported`], or the engine's `PostError::Unsupported`).
//!
//! Posting never waits for another thread: a request is checked in the posting thread (the
//! work-request core of `softrdma_verbs_types`: SGE count, length, inline, L_Keys) and then
//! handed to its engine.

use std::net::{SocketAddr, ToSocketAddrs};

use softrdma_ib::{QpAttr, QpType};
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_memory::{MemError, PdId};
use softrdma_verbs_types::{InlineBuf, InlinePool, RecvWr, SendWr};

use crate::Error;
use crate::connparams::{ConnectParams, ConnectionInfo, QpCap};
use crate::cq::Cq;
use crate::device::{Claim, Pd, Resource};
use crate::provider::{QpCreate, QpOps};
use crate::srq::{Srq, SrqAttr};
use crate::state::{QpCounters, QpState};

/// What [`Pd::create_qp`] needs (`ibv_qp_init_attr`).
#[derive(Clone, Debug)]
pub struct QpInitAttr {
    /// RC, UC or UD (iWARP: RC only).
    pub qp_type: QpType,
    /// Completions of send-queue requests.
    pub send_cq: Cq,
    /// Completions of receive requests.
    pub recv_cq: Cq,
    /// Take receive buffers from this shared receive queue instead of the QP's own.
    pub srq: Option<Srq>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send request is signaled, whatever its flags say.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    /// An RC QP with default capacities, no SRQ, signaling per request.
    pub fn new(send_cq: &Cq, recv_cq: &Cq) -> QpInitAttr {
        QpInitAttr::typed(QpType::Rc, send_cq, recv_cq)
    }

    /// A QP of `qp_type` with default capacities.
    pub fn typed(qp_type: QpType, send_cq: &Cq, recv_cq: &Cq) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// A queue pair (`ibv_qp`). `Send + Sync`: several threads may post. Dropping it destroys
/// the QP (an iWARP connection still open is closed abortively).
pub struct Qp {
    /// The provider's QP; first, so it is destroyed before the context can go.
    ops: Box<dyn QpOps>,
    /// Its place under the device's QP limit (which holds the context).
    _claim: Claim,
    pd: PdId,
    qp_type: QpType,
    cap: QpCap,
    sq_sig_all: bool,
    /// Buffers for `INLINE` requests' octets, reused.
    inline: InlinePool,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num())
            .field("qp_type", &self.qp_type)
            .field("state", &self.state())
            .finish()
    }
}

impl Pd {
    /// Creates a QP (`ibv_create_qp`). RC and UC QPs start in [`QpState::Init`] on both
    /// transports (as `rdma_create_qp` leaves them): post receives, then connect or accept
    /// it, or on RoCE bring it up with [`Qp::modify`]. A RoCE UD QP starts in
    /// [`QpState::Reset`] (its Q_Key comes with the move to Init).
    pub fn create_qp(&self, attr: QpInitAttr) -> Result<Qp, Error> {
        let cap = attr.cap;
        if cap.max_send_wr == 0 || cap.max_recv_wr == 0 {
            return Err(Error::InvalidArgument("queue depths must be at least 1"));
        }
        if let Some(srq) = &attr.srq
            && srq.shared.pd != self.id
        {
            return Err(Error::Mem(MemError::WrongPd));
        }
        self.ctx
            .check_depths(&[cap.max_send_wr, cap.max_recv_wr], false)?;
        self.ctx.check_inline(cap.max_inline_data)?;
        let claim = self.ctx.claim(Resource::Qp, 0)?;
        let ops = self.ctx.provider().create_qp(QpCreate {
            qp_type: attr.qp_type,
            pd: self.id,
            cap,
            keys: &self.ctx.keys,
            send_cq: &attr.send_cq.shared,
            recv_cq: &attr.recv_cq.shared,
            srq: attr.srq.as_ref().map(|s| &s.shared),
        })?;
        Ok(Qp {
            ops,
            _claim: claim,
            pd: self.id,
            qp_type: attr.qp_type,
            cap,
            sq_sig_all: attr.sq_sig_all,
            inline: InlinePool::new(cap.max_send_wr as usize, cap.max_inline_data as usize),
        })
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq, Error> {
        self.ctx.check_depths(&[attr.max_wr], true)?;
        Srq::new(self.id, attr, self.ctx.keys.clone())
    }
}

impl Qp {
    /// The QP number (also the QP's `QpId` for type 2 windows).
    pub fn qp_num(&self) -> u32 {
        self.ops.qp_num()
    }

    /// The QP's protection domain.
    pub fn pd_id(&self) -> PdId {
        self.pd
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.ops.state()
    }

    /// Queue sizes.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// The iWARP connection's parameters once connected (`None` on RoCE: keep what
    /// [`Qp::connect`] or [`ConnRequest::accept`](crate::ConnRequest::accept) returned).
    pub fn connection(&self) -> Option<ConnectionInfo> {
        self.ops.connection()
    }

    /// The engine's counters.
    pub fn counters(&self) -> QpCounters {
        self.ops.counters()
    }

    /// The last asynchronous event of an iWARP stream (Terminate sent or received, LLP
    /// error).
    pub fn last_event(&self) -> Option<QpEvent> {
        self.ops.last_event()
    }

    /// Send requests posted and not yet completed.
    pub fn sq_outstanding(&self) -> u64 {
        self.ops.sq_outstanding()
    }

    /// Posts a send-queue request (`ibv_post_send`). The SGEs are checked now; `INLINE`
    /// octets are copied now. An iWARP QP not yet connected keeps the request until it is;
    /// in Error or Closed it completes at once with `WorkRequestFlushed`.
    pub fn post_send(&self, wr: SendWr) -> Result<(), Error> {
        let wr = self.prepared(wr);
        // A list of one: one path for both.
        self.ops
            .post_send_list(&mut std::iter::once(wr))
            .map_err(|(_, e)| e)
    }

    /// An empty buffer for an `INLINE` request's octets ([`SendWr::inline`]), one of this
    /// QP's: posts cost no allocation once as many have come back as are in flight.
    pub fn inline_buf(&self) -> InlineBuf {
        self.inline.take()
    }

    /// `sq_sig_all` (every request signaled), and a buffer of the QP's own for the octets
    /// of an `INLINE` request with entries.
    fn prepared(&self, mut wr: SendWr) -> SendWr {
        use softrdma_verbs_types::SendFlags;
        if self.sq_sig_all {
            wr.flags |= SendFlags::SIGNALED;
        }
        if wr.flags.contains(SendFlags::INLINE) && wr.inline.is_none() && !wr.sg_list.is_empty() {
            wr.inline = Some(self.inline.take());
        }
        wr
    }

    /// Posts several send requests in order; stops at the first refused one and returns
    /// its index with the error (`bad_wr`).
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        let mut wrs = wrs.into_iter().map(|wr| self.prepared(wr));
        self.ops.post_send_list(&mut wrs)
    }

    /// Posts a receive buffer for one inbound message (`ibv_post_recv`). Receives may be
    /// posted before the QP is connected (and should be: an iWARP Send finding no buffer
    /// terminates the stream). Refused on a QP with an SRQ.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), Error> {
        self.ops
            .post_recv_list(&mut std::iter::once(wr))
            .map_err(|(_, e)| e)
    }

    /// Posts several receive requests in order (`ibv_post_recv` with a list): one pass of
    /// the transport for all of them. Stops at the first refused one and returns its index
    /// with the error (`bad_wr`); the ones before it are posted.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), (usize, Error)> {
        self.ops.post_recv_list(&mut wrs.into_iter())
    }

    /// `ibv_modify_qp` (InfiniBand QPs: state transitions and their attributes, for users
    /// who exchange QP numbers out of band, as pingpong and perftest do). For RC/UC the path
    /// must be set ([`Qp::set_remote`]) before RTR. An iWARP QP's state follows its
    /// connection ([`Qp::connect`], [`Qp::disconnect`]); the one move it takes here is to
    /// Error, which is [`Qp::disconnect`].
    pub fn modify(&self, attr: &QpAttr) -> Result<(), Error> {
        self.ops.modify(attr)
    }

    /// Sets the path of a connected RoCE QP (`ibv_qp_attr.ah_attr`): the peer's IP (its GID)
    /// and UDP port (4791 unless testing on one host). Needed before RTR.
    pub fn set_remote(&self, addr: SocketAddr) -> Result<(), Error> {
        self.ops.set_remote(addr)
    }

    /// Connects to `addr` (`rdma_connect`), the address of a [`Listener`](crate::Listener);
    /// blocks until the QP is in [`QpState::Rts`] or the attempt failed. iWARP: TCP
    /// connect, then MPA negotiation as initiator; a rejection ([`Error::Rejected`]) or
    /// failure leaves the QP in `Init`, ready for another try. RoCE: the QP must be in
    /// `Init` (as created) or `Reset`; the InfiniBand CM on QP1 exchanges QP numbers, PSNs
    /// and limits (REQ, REP, RTU; librdmacm's service ID and CMA header, so `rdma_cm` peers
    /// answer) and the QP is moved INIT → RTR → RTS as librdmacm does. A UD QP resolves the
    /// listener's UD QP and Q_Key instead (SIDR; [`ConnectionDetail::Roce`](crate::ConnectionDetail)).
    pub fn connect(
        &self,
        addr: impl ToSocketAddrs,
        params: ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        self.ops.connect(&addrs, &params)
    }

    /// [`connect`](Self::connect) as a future of any runtime: nothing blocks (iWARP: the
    /// context's progress thread makes the TCP connection too, within `params.timeout`;
    /// RoCE: the CM's timers bound the wait). Dropped before it resolves, the attempt is
    /// abandoned (iWARP: the QP goes back to `Init`, or is disconnected if it got there;
    /// RoCE: a reply that comes later is refused).
    pub async fn connect_async(
        &self,
        addr: SocketAddr,
        params: ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        self.ops.connect_async(addr, params).await
    }

    /// Orderly close (`rdma_disconnect`): every outstanding request is flushed
    /// (`WorkRequestFlushed`), a Terminate already queued still goes out, then the TCP
    /// connection is closed; the peer's requests are flushed when it sees the close.
    /// Returns at once; the flush completions arrive on the CQs. On RoCE the QP moves to
    /// Error and the CM's DREQ tells the peer, whose QP then flushes as well.
    pub fn disconnect(&self) -> Result<(), Error> {
        self.ops.disconnect()
    }

    pub(crate) fn ops(&self) -> &dyn QpOps {
        &*self.ops
    }
}
