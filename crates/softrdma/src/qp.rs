//! Queue pairs and shared receive queues (`ibv_qp`, `ibv_srq`).
//!
//! Posting never waits for the progress thread: a request is checked here (the engine's
//! post-time checks: SGE count, length, inline size, L_Keys through
//! `KeyTable::check_local`), queued, and the thread is woken once; it hands queued requests
//! to the QP's RDMAP engine, which it alone owns. So a user holding a buffer guard can
//! always post, and the thread's placement never waits for a lock a poster holds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};

use parking_lot::Mutex;
use softrdma_iwarp::rdmap::{QpCounters, QpEvent};
use softrdma_iwarp::rdmap::{check_send, send_limits};
use softrdma_memory::{Key, KeyTable, MemError, PdId};
use softrdma_verbs_types::{
    CheckedRecv, CheckedSend, PostError, RecvWr, SendFlags, SendWr, check_recv,
};

use crate::Error;
use crate::cm::Connection;
use crate::cq::{Cq, CqShared};
use crate::device::{CtxShared, Pd};
use crate::driver::Cmd;

/// QP state (iWARP flavour of `ibv_qp_state`, as Linux siw names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Created, not connected (also after a rejected or failed connect). Receives may be
    /// posted; sends wait for the connection.
    Init = 0,
    /// TCP connection and MPA negotiation in progress.
    Connecting = 1,
    /// Full operation (ready to send).
    Rts = 2,
    /// An error was detected; the Terminate describing it is being sent.
    Terminate = 3,
    /// The stream is dead (Terminate sent or received, connection lost): every request
    /// was flushed and new ones complete at once with `WorkRequestFlushed`.
    Error = 4,
    /// Closed by [`Qp::disconnect`]; requests are flushed as in `Error`.
    Closed = 5,
}

impl QpState {
    fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Init,
            1 => QpState::Connecting,
            2 => QpState::Rts,
            3 => QpState::Terminate,
            4 => QpState::Error,
            _ => QpState::Closed,
        }
    }

    /// Error or Closed: requests are flushed.
    pub fn is_dead(self) -> bool {
        matches!(self, QpState::Error | QpState::Closed)
    }
}

/// Queue sizes of a QP (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Send requests posted and not yet completed.
    pub max_send_wr: u32,
    /// Receive requests posted and not yet consumed.
    pub max_recv_wr: u32,
    /// SGEs per send request.
    pub max_send_sge: u32,
    /// SGEs per receive request.
    pub max_recv_sge: u32,
    /// Largest `INLINE` send.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    /// 256 requests each way, 16 SGEs, 256 octets inline.
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
        }
    }
}

/// What [`Pd::create_qp`] needs (`ibv_qp_init_attr`).
#[derive(Clone, Debug)]
pub struct QpInitAttr {
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
    /// Default capacities, no SRQ, signaling per request.
    pub fn new(send_cq: &Cq, recv_cq: &Cq) -> QpInitAttr {
        QpInitAttr {
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// A send-queue entry waiting for the progress thread.
pub(crate) enum SqItem {
    /// A work request for the engine, checked (and `INLINE` octets copied) at post time.
    Send(CheckedSend),
    /// Local Invalidate, run once every earlier request completed.
    Invalidate {
        key: Key,
        reply: SyncSender<Result<(), MemError>>,
    },
}

#[derive(Default)]
pub(crate) struct Submissions {
    pub(crate) sq: VecDeque<SqItem>,
    pub(crate) rq: VecDeque<CheckedRecv>,
}

pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) pd: PdId,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) srq: Option<Arc<SrqShared>>,
    pub(crate) sub: Mutex<Submissions>,
    /// Queued in the context's ready list and not yet looked at.
    pub(crate) scheduled: AtomicBool,
    state: AtomicU8,
    /// Send requests accepted by `post_send` (written under `sub`).
    sq_posted: AtomicU64,
    /// Send requests completed, with or without a completion (progress thread).
    pub(crate) sq_retired: AtomicU64,
    rq_posted: AtomicU64,
    pub(crate) rq_retired: AtomicU64,
    /// Negotiated ORD (`u32::MAX` before the connection).
    pub(crate) ord: AtomicU32,
    pub(crate) conn: Mutex<Option<Connection>>,
    pub(crate) counters: Mutex<QpCounters>,
    pub(crate) last_event: Mutex<Option<QpEvent>>,
}

impl QpShared {
    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: QpState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// Moves the state from `from` to `to`; `false` if it was not `from`.
    pub(crate) fn transition(&self, from: QpState, to: QpState) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A queue pair (`ibv_qp`): an RDMAP stream over one TCP connection, once connected with
/// [`Qp::connect`] or accepted through a [`Listener`](crate::Listener). `Send + Sync`:
/// several threads may post. Dropping it closes the connection (abortively if still open).
pub struct Qp {
    pub(crate) ctx: Arc<CtxShared>,
    pub(crate) shared: Arc<QpShared>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.shared.qpn)
            .field("state", &self.state())
            .finish()
    }
}

impl Pd {
    /// Creates a QP in [`QpState::Init`] (`ibv_create_qp`).
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
        let shared = Arc::new(QpShared {
            qpn: self.ctx.next_qp_num(),
            pd: self.id,
            cap,
            sq_sig_all: attr.sq_sig_all,
            send_cq: attr.send_cq.shared.clone(),
            recv_cq: attr.recv_cq.shared.clone(),
            srq: attr.srq.map(|s| s.shared),
            sub: Mutex::new(Submissions::default()),
            scheduled: AtomicBool::new(false),
            state: AtomicU8::new(QpState::Init as u8),
            sq_posted: AtomicU64::new(0),
            sq_retired: AtomicU64::new(0),
            rq_posted: AtomicU64::new(0),
            rq_retired: AtomicU64::new(0),
            ord: AtomicU32::new(u32::MAX),
            conn: Mutex::new(None),
            counters: Mutex::new(QpCounters::default()),
            last_event: Mutex::new(None),
        });
        Ok(Qp {
            ctx: self.ctx.clone(),
            shared,
        })
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq, Error> {
        if attr.max_wr == 0 {
            return Err(Error::InvalidArgument("SRQ depth must be at least 1"));
        }
        Ok(Srq {
            shared: Arc::new(SrqShared {
                pd: self.id,
                attr,
                keys: self.ctx.keys.clone(),
                queue: Mutex::new(VecDeque::new()),
            }),
        })
    }
}

impl Qp {
    /// The QP number (also the RDMAP stream's `QpId` for type 2 windows).
    pub fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    /// The QP's protection domain.
    pub fn pd_id(&self) -> PdId {
        self.shared.pd
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.shared.state()
    }

    /// Queue sizes.
    pub fn cap(&self) -> QpCap {
        self.shared.cap
    }

    /// The connection's parameters once connected.
    pub fn connection(&self) -> Option<Connection> {
        self.shared.conn.lock().clone()
    }

    /// The engine's counters (updated by the progress thread).
    pub fn counters(&self) -> QpCounters {
        *self.shared.counters.lock()
    }

    /// The last asynchronous event of the stream (Terminate sent or received, LLP error).
    pub fn last_event(&self) -> Option<QpEvent> {
        *self.shared.last_event.lock()
    }

    /// Send requests posted and not yet completed.
    pub fn sq_outstanding(&self) -> u64 {
        let s = &self.shared;
        s.sq_posted
            .load(Ordering::Acquire)
            .saturating_sub(s.sq_retired.load(Ordering::Acquire))
    }

    /// Posts a send-queue request (`ibv_post_send`): Send, Send with Invalidate, RDMA Write
    /// or RDMA Read, with the engine's flags (signaled, solicited, fence, inline). The SGEs
    /// are checked now; `INLINE` octets are copied now. Before the QP is connected the
    /// request waits for the connection; in Error or Closed it completes at once with
    /// `WorkRequestFlushed`.
    pub fn post_send(&self, mut wr: SendWr) -> Result<(), Error> {
        let s = &self.shared;
        if s.sq_sig_all {
            wr.flags |= SendFlags::SIGNALED;
        }
        let wr = self.check_send(wr)?;
        {
            let mut sub = s.sub.lock();
            let outstanding =
                s.sq_posted.load(Ordering::Relaxed) - s.sq_retired.load(Ordering::Acquire);
            if outstanding >= u64::from(s.cap.max_send_wr) {
                return Err(PostError::QueueFull.into());
            }
            sub.sq.push_back(SqItem::Send(wr));
            s.sq_posted.fetch_add(1, Ordering::Release);
        }
        self.ctx.schedule(&self.shared);
        Ok(())
    }

    /// Posts several send requests in order; stops at the first refused one and returns
    /// its index with the error (`bad_wr`).
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        for (i, wr) in wrs.into_iter().enumerate() {
            self.post_send(wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// The engine's post-time checks (iWARP rules and the common ones), in the posting
    /// thread; `INLINE` octets are copied now.
    fn check_send(&self, wr: SendWr) -> Result<CheckedSend, Error> {
        let s = &self.shared;
        if wr.opcode.is_read_or_atomic() && s.ord.load(Ordering::Acquire) == 0 {
            return Err(PostError::ReadsDisabled.into());
        }
        let lim = send_limits(s.cap.max_send_sge, s.cap.max_inline_data);
        Ok(check_send(wr, &lim, &self.ctx.keys, s.pd)?)
    }

    /// Posts a receive buffer for one inbound Send (`ibv_post_recv`). Receives may be
    /// posted before the QP is connected (and should be: a Send finding no buffer
    /// terminates the stream). Refused on a QP with an SRQ.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), Error> {
        let s = &self.shared;
        if s.srq.is_some() {
            return Err(Error::SrqAttached);
        }
        let wr = check_recv(wr, s.cap.max_recv_sge, &self.ctx.keys, s.pd)?;
        {
            let mut sub = s.sub.lock();
            let outstanding =
                s.rq_posted.load(Ordering::Relaxed) - s.rq_retired.load(Ordering::Acquire);
            if outstanding >= u64::from(s.cap.max_recv_wr) {
                return Err(PostError::QueueFull.into());
            }
            sub.rq.push_back(wr);
            s.rq_posted.fetch_add(1, Ordering::Release);
        }
        self.ctx.schedule(&self.shared);
        Ok(())
    }

    /// Local Invalidate of a fast-registered region or a type 2 window of this QP's domain
    /// (`IBV_WR_LOCAL_INV`), in send-queue order: it runs once every send request posted
    /// before it has completed, and this call returns when it ran.
    pub fn invalidate(&self, key: Key) -> Result<(), Error> {
        let (reply, rx) = sync_channel(1);
        self.shared
            .sub
            .lock()
            .sq
            .push_back(SqItem::Invalidate { key, reply });
        self.ctx.schedule(&self.shared);
        match rx.recv() {
            Ok(r) => r.map_err(Error::Mem),
            Err(_) => Err(Error::ContextClosed),
        }
    }

    /// Orderly close (`rdma_disconnect`): every outstanding request is flushed
    /// (`WorkRequestFlushed`), a Terminate already queued still goes out, then the TCP
    /// connection is closed; the peer's requests are flushed when it sees the close.
    /// Returns at once; the flush completions arrive on the CQs.
    pub fn disconnect(&self) -> Result<(), Error> {
        self.ctx.command(Cmd::Disconnect(self.shared.clone()))
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let _ = self.ctx.command(Cmd::Destroy(self.shared.clone()));
    }
}

/// What [`Pd::create_srq`] needs (`ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receive requests the queue holds.
    pub max_wr: u32,
    /// SGEs per receive request.
    pub max_sge: u32,
}

impl Default for SrqAttr {
    fn default() -> SrqAttr {
        SrqAttr {
            max_wr: 1024,
            max_sge: 16,
        }
    }
}

pub(crate) struct SrqShared {
    pub(crate) pd: PdId,
    pub(crate) attr: SrqAttr,
    keys: Arc<KeyTable>,
    pub(crate) queue: Mutex<VecDeque<CheckedRecv>>,
}

/// A shared receive queue (`ibv_srq`): receive buffers for several QPs of one domain. A
/// buffer is taken at the moment a Send starts arriving on one of them and completes on
/// that QP's receive CQ. Cheap to clone.
#[derive(Clone)]
pub struct Srq {
    pub(crate) shared: Arc<SrqShared>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("attr", &self.shared.attr)
            .field("len", &self.len())
            .finish()
    }
}

impl Srq {
    /// Posts a receive buffer (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), Error> {
        let s = &self.shared;
        let wr = check_recv(wr, s.attr.max_sge, &s.keys, s.pd)?;
        let mut q = s.queue.lock();
        if q.len() >= s.attr.max_wr as usize {
            return Err(PostError::QueueFull.into());
        }
        q.push_back(wr);
        Ok(())
    }

    /// Buffers waiting.
    pub fn len(&self) -> usize {
        self.shared.queue.lock().len()
    }

    /// `true` when no buffer waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue's attributes.
    pub fn attr(&self) -> SrqAttr {
        self.shared.attr
    }
}
