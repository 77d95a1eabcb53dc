//! An iWARP QP's half in the posting threads: its submission queues and their accounting
//! (posted, retired, depth), and the checks a request passes before the engine sees it.

use std::any::Any;
use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_iwarp::rdmap::{check_send, send_limits};
use softrdma_memory::PdId;
use softrdma_verbs_types::{
    CheckedRecv, CheckedSend, PostError, RecvWr, SendLimits, SendWr, check_recv,
};

use softrdma_ib::QpAttr;
use softrdma_iwarp::startup::{Rtr, RtrSet, Startup, StartupConfig};

use super::{Cmd, TcpShared, prepare_stream, progress};
use crate::Error;
use crate::connparams::{ConnectParams, ConnectionInfo, QpCap};
use crate::cq::CqShared;
use crate::provider::{Connected, Destroy, DriverQp, QpOps};
use crate::srq::SrqShared;
use crate::state::{QpCounters, QpState};

#[derive(Default)]
pub(crate) struct Submissions {
    /// Work requests for the engine, checked (and `INLINE` octets copied) at post time.
    pub(crate) sq: VecDeque<CheckedSend>,
    pub(crate) rq: VecDeque<CheckedRecv>,
}

/// Accounts for a checked request under its submission queue's lock (`posted`, `retired`,
/// the queue's depth): returned for the engine when `direct` and nothing waits before it,
/// else queued (`wrap`ped).
fn enqueue<T, Q>(
    queue: &mut VecDeque<Q>,
    (posted, retired, depth): (&AtomicU64, &AtomicU64, u32),
    wr: T,
    wrap: impl FnOnce(T) -> Q,
    direct: bool,
) -> Result<Option<T>, Error> {
    if posted.load(Ordering::Relaxed) - retired.load(Ordering::Acquire) >= u64::from(depth) {
        return Err(PostError::QueueFull.into());
    }
    posted.fetch_add(1, Ordering::Release);
    if direct && queue.is_empty() {
        return Ok(Some(wr));
    }
    queue.push_back(wrap(wr));
    Ok(None)
}

pub(crate) struct TcpQp {
    pub(crate) qpn: u32,
    pub(crate) pd: PdId,
    pub(crate) cap: QpCap,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) srq: Option<Arc<SrqShared>>,
    pub(crate) sub: Mutex<Submissions>,
    /// Queued in the context's ready list and not yet looked at.
    pub(crate) scheduled: AtomicBool,
    pub(crate) state: AtomicU8,
    /// Send requests accepted by `post_send` (written under `sub`).
    pub(crate) sq_posted: AtomicU64,
    /// Send requests completed, with or without a completion (progress thread).
    pub(crate) sq_retired: AtomicU64,
    pub(crate) rq_posted: AtomicU64,
    pub(crate) rq_retired: AtomicU64,
    /// Negotiated ORD (`u32::MAX` before the connection).
    pub(crate) ord: AtomicU32,
    pub(crate) conn: Mutex<Option<ConnectionInfo>>,
    /// Its counters once its connection let it go (before, the engine has them).
    pub(crate) counters: Mutex<QpCounters>,
    pub(crate) last_event: Mutex<Option<QpEvent>>,
}

impl TcpQp {
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

impl TcpQp {
    /// A QP in [`QpState::Init`].
    pub(crate) fn new(
        qpn: u32,
        pd: PdId,
        cap: QpCap,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        srq: Option<Arc<SrqShared>>,
    ) -> TcpQp {
        TcpQp {
            qpn,
            pd,
            cap,
            send_cq,
            recv_cq,
            srq,
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
        }
    }

    /// Send requests posted and not yet completed.
    pub(crate) fn sq_outstanding(&self) -> u64 {
        self.sq_posted
            .load(Ordering::Acquire)
            .saturating_sub(self.sq_retired.load(Ordering::Acquire))
    }

    /// Checks send requests in order and hands them to the engine, then writes the lot at
    /// once (one write, not one per message); stops at the first refused one and returns
    /// its index. Those before it are sent.
    pub(crate) fn post_send_list(
        self: &Arc<Self>,
        drv: &TcpShared,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        let lim = send_limits(self.cap.max_send_sge, self.cap.max_inline_data);
        self.post_list(drv, wrs, |wr, direct| self.admit(drv, &lim, wr, direct))
    }

    /// Posts checked requests in order, up to the first refused one. With the driver free
    /// and nothing queued before them they go to the engine directly; otherwise they wait
    /// in the submission queue for whoever holds the driver (`admit(wr, direct)` checks one
    /// and returns it for the engine, or queues it).
    fn post_list<W, C: progress::Hand>(
        self: &Arc<Self>,
        drv: &TcpShared,
        wrs: impl IntoIterator<Item = W>,
        admit: impl Fn(W, bool) -> Result<Option<C>, Error>,
    ) -> Result<(), (usize, Error)> {
        let mut wrs = wrs.into_iter().enumerate();
        if let Some(mut d) = drv.try_lock_driver()
            && let Some(res) = d.post_direct(drv, self, &mut wrs, &admit)
        {
            return res;
        }
        let mut res = Ok(());
        let mut queued = 0;
        for (i, wr) in wrs {
            if let Err(e) = admit(wr, false) {
                res = Err((i, e));
                break;
            }
            queued += 1;
        }
        if queued > 0 {
            drv.submit(self);
        }
        res
    }

    /// Checks a send request and accounts for it: returned for the engine when `direct`
    /// and nothing waits in the submission queue before it, else queued there.
    fn admit(
        &self,
        drv: &TcpShared,
        lim: &SendLimits,
        wr: SendWr,
        direct: bool,
    ) -> Result<Option<CheckedSend>, Error> {
        if wr.opcode.is_read_or_atomic() && self.ord.load(Ordering::Acquire) == 0 {
            return Err(PostError::ReadsDisabled.into());
        }
        let wr = check_send(wr, lim, &drv.keys, self.pd)?;
        let mut sub = self.sub.lock();
        let room = (&self.sq_posted, &self.sq_retired, self.cap.max_send_wr);
        enqueue(&mut sub.sq, room, wr, |wr| wr, direct)
    }

    /// Checks and posts receive requests in order, up to the first refused one.
    pub(crate) fn post_recv_list(
        self: &Arc<Self>,
        drv: &TcpShared,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), (usize, Error)> {
        if self.srq.is_some() {
            return Err((0, Error::SrqAttached));
        }
        self.post_list(drv, wrs, |wr, direct| self.admit_recv(drv, wr, direct))
    }

    /// [`TcpQp::admit`] for a receive request.
    fn admit_recv(
        &self,
        drv: &TcpShared,
        wr: RecvWr,
        direct: bool,
    ) -> Result<Option<CheckedRecv>, Error> {
        let wr = check_recv(wr, self.cap.max_recv_sge, &drv.keys, self.pd)?;
        let mut sub = self.sub.lock();
        let room = (&self.rq_posted, &self.rq_retired, self.cap.max_recv_wr);
        enqueue(&mut sub.rq, room, wr, |wr| wr, direct)
    }
}

/// An iWARP QP as the verbs API holds it: its submission queues, and the driver that runs
/// its connection.
pub(crate) type IwarpQp = DriverQp<TcpShared, TcpQp>;

impl QpOps for IwarpQp {
    fn qp_num(&self) -> u32 {
        self.q.qpn
    }

    fn state(&self) -> QpState {
        self.q.state()
    }

    fn connection(&self) -> Option<ConnectionInfo> {
        self.q.conn.lock().clone()
    }

    fn counters(&self) -> QpCounters {
        self.drv.lock_driver().qp_counters(&self.q)
    }

    fn last_event(&self) -> Option<QpEvent> {
        *self.q.last_event.lock()
    }

    fn sq_outstanding(&self) -> u64 {
        self.q.sq_outstanding()
    }

    fn post_send_list(&self, wrs: &mut dyn Iterator<Item = SendWr>) -> Result<(), (usize, Error)> {
        self.q.post_send_list(&self.drv, wrs)
    }

    fn post_recv_list(&self, wrs: &mut dyn Iterator<Item = RecvWr>) -> Result<(), (usize, Error)> {
        self.q.post_recv_list(&self.drv, wrs)
    }

    fn modify(&self, attr: &QpAttr) -> Result<(), Error> {
        // iWARP QPs move through the connection manager; to Error is the one move the verbs
        // make (RDMAC verbs 8.2: flush, and an abortive close of a connection), as siw and
        // librdmacm's callers flushing a QP before they destroy it do.
        if *attr == QpAttr::state(softrdma_ib::QpState::Error) {
            return self.disconnect();
        }
        Err(Error::Unsupported("modify_qp on iWARP QPs"))
    }

    fn set_remote(&self, _: SocketAddr) -> Result<(), Error> {
        Err(Error::Unsupported("set_remote on iWARP QPs"))
    }

    fn connect(
        &self,
        addrs: &[SocketAddr],
        params: &ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        let q = &self.q;
        if !q.transition(QpState::Init, QpState::Connecting) {
            return Err(Error::InvalidState(q.state()));
        }
        let r = self.drv.connect(q, addrs, params);
        if r.is_err() {
            // The thread already moved it back unless the failure was local.
            q.transition(QpState::Connecting, QpState::Init);
        }
        r
    }

    fn connect_async(&self, addr: SocketAddr, params: ConnectParams) -> Connected<'_> {
        Box::pin(async move {
            let q = &self.q;
            if !q.transition(QpState::Init, QpState::Connecting) {
                return Err(Error::InvalidState(q.state()));
            }
            let rx = match self.drv.dial(q, addr, &params) {
                Ok(rx) => rx,
                Err(e) => {
                    q.transition(QpState::Connecting, QpState::Init);
                    return Err(e);
                }
            };
            let mut guard = Abandon(&self.drv, Some(q.clone()));
            let r = reply_async(rx).await;
            guard.1 = None;
            if r.is_err() {
                q.transition(QpState::Connecting, QpState::Init);
            }
            r
        })
    }

    fn disconnect(&self) -> Result<(), Error> {
        self.drv.command(Cmd::Disconnect(self.q.clone()))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Destroy<TcpQp> for TcpShared {
    fn destroy(&self, q: &Arc<TcpQp>) {
        // An open connection is closed abortively.
        let _ = self.command(Cmd::Destroy(q.clone()));
    }
}

/// Extra time a blocking call waits beyond the MPA timeout before giving up on the
/// progress thread (a safety net, not a protocol timer).
const REPLY_GRACE: Duration = Duration::from_secs(5);

impl TcpShared {
    /// TCP connect, then MPA negotiation as initiator run by the progress thread
    /// (`rdma_connect`); the QP is `Connecting`.
    pub(crate) fn connect(
        &self,
        qp: &Arc<TcpQp>,
        addr: impl ToSocketAddrs,
        params: &ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        let start = Instant::now();
        let cfg = startup_config(params)?;
        let stream = crate::net::connect(addr, params.timeout)?;
        let emss = prepare_stream(&stream)?;
        let remaining = params.timeout.saturating_sub(start.elapsed());
        let (reply, rx) = oneshot::channel();
        self.command(Cmd::Connect {
            qp: qp.clone(),
            stream: mio::net::TcpStream::from_std(stream),
            startup: StartupConfig {
                timeout: remaining,
                ..cfg
            },
            started: Instant::now(),
            emss,
            fpdu: params.iwarp.fpdu,
            reply,
        })?;
        wait_reply(rx, params.timeout)
    }

    /// [`connect`](Self::connect) for a task: the progress thread makes the TCP connection
    /// too; the answer comes on the returned channel.
    pub(crate) fn dial(
        &self,
        qp: &Arc<TcpQp>,
        addr: SocketAddr,
        params: &ConnectParams,
    ) -> Result<oneshot::Receiver<Result<ConnectionInfo, Error>>, Error> {
        let (reply, rx) = oneshot::channel();
        self.command(Cmd::Dial {
            qp: qp.clone(),
            addr,
            startup: startup_config(params)?,
            started: Instant::now(),
            fpdu: params.iwarp.fpdu,
            reply,
        })?;
        Ok(rx)
    }
}

/// The initiator's MPA settings, checked before anything touches the network.
fn startup_config(params: &ConnectParams) -> Result<StartupConfig, Error> {
    let cfg = StartupConfig {
        rev: params.iwarp.rev,
        crc: params.iwarp.crc,
        markers: params.iwarp.markers,
        ird: params.ird,
        ord: params.ord,
        p2p: params
            .iwarp
            .p2p
            .then_some(RtrSet::only(Rtr::ZeroLengthWrite)),
        private_data: params.private_data.clone(),
        timeout: params.timeout,
        allow_early_fpdus: true,
    };
    Startup::initiator(cfg.clone(), Instant::now())?;
    Ok(cfg)
}

/// Closes the connection of an iWARP `connect` or `accept` whose task stopped waiting
/// (`None` once the answer was seen).
pub(crate) struct Abandon<'a>(pub(crate) &'a TcpShared, pub(crate) Option<Arc<TcpQp>>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.1.take() {
            let _ = self.0.command(Cmd::Disconnect(q));
        }
    }
}

/// Waits for the progress thread's answer to a blocking command.
pub(crate) fn wait_reply<T>(
    rx: oneshot::Receiver<Result<T, Error>>,
    timeout: Duration,
) -> Result<T, Error> {
    match rx.recv_timeout(timeout + REPLY_GRACE) {
        Ok(r) => r,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::ContextClosed),
    }
}

/// The progress thread's answer, awaited by a task.
pub(crate) async fn reply_async<T>(rx: oneshot::Receiver<Result<T, Error>>) -> Result<T, Error> {
    rx.await.unwrap_or(Err(Error::ContextClosed))
}
