//! An iWARP QP's half in the posting threads: its submission queues and their accounting
//! (posted, retired, depth), the checks a request passes before the engine sees it, and
//! how a post reaches its connection: into the engine and out to the socket in the posting
//! thread when the driver is free ([`Driver::post_direct`]), else queued for whoever holds
//! the driver, who runs the ready list as it lets go ([`DriverGuard`]).

use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use mio::Token;
use parking_lot::Mutex;
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_iwarp::rdmap::{check_send, send_limits};
use softrdma_memory::PdId;
use softrdma_verbs_types::{
    CheckedRecv, CheckedSend, PostError, RecvWr, SendLimits, SendWr, WorkCompletion, check_recv,
};

use softrdma_ib::QpAttr;

use super::conn::{BURST_GAP, Conn, touch};
use super::connect::{Abandon, reply_async};
use super::progress::Driver;
use super::{Cmd, TcpShared};
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
    fn post_list<W, C: Hand>(
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

/// The locked driver (see [`TcpShared::lock_driver`]).
pub(crate) struct DriverGuard<'a> {
    ctx: &'a TcpShared,
    d: Option<parking_lot::MutexGuard<'a, Driver>>,
}

impl std::ops::Deref for DriverGuard<'_> {
    type Target = Driver;
    fn deref(&self) -> &Driver {
        self.d.as_deref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for DriverGuard<'_> {
    fn deref_mut(&mut self) -> &mut Driver {
        self.d.as_deref_mut().expect("held until dropped")
    }
}

impl Drop for DriverGuard<'_> {
    fn drop(&mut self) {
        drop(self.d.take());
        // Not while unwinding: a second panic in there would abort the process.
        if !std::thread::panicking() {
            self.ctx.run_scheduled();
        }
    }
}

impl TcpShared {
    /// Hands `qp`'s new work requests to the driver (once until it looks): run here if the
    /// driver is free, else by its holder as it lets go (no wake-up of anyone: a thread
    /// that waits on the sockets does not hold the driver).
    pub(crate) fn schedule(&self, qp: &Arc<TcpQp>) {
        if !qp.scheduled.swap(true, Ordering::AcqRel) {
            self.ready.lock().push(qp.clone());
            self.ready_pending.store(true, Ordering::Relaxed);
            self.run_scheduled();
        }
    }

    /// The driver, locked; whatever is scheduled meanwhile runs as it is let go.
    pub(crate) fn lock_driver(&self) -> DriverGuard<'_> {
        DriverGuard {
            ctx: self,
            d: Some(self.driver.lock()),
        }
    }

    /// [`TcpShared::lock_driver`] if nobody holds it.
    pub(crate) fn try_lock_driver(&self) -> Option<DriverGuard<'_>> {
        Some(DriverGuard {
            ctx: self,
            d: Some(self.driver.try_lock()?),
        })
    }

    /// Runs the ready list if something waits in it and the driver is free. Whoever pushes
    /// to the list and whoever lets the driver go both come here: with the fence between
    /// each one's write (the flag, the unlock) and its read (the lock, the flag), one of
    /// them sees the other's write, so nothing is left in the list unseen.
    fn run_scheduled(&self) {
        loop {
            std::sync::atomic::fence(Ordering::SeqCst);
            if !self.ready_pending.load(Ordering::Relaxed) {
                return;
            }
            let Some(mut d) = self.driver.try_lock() else {
                return;
            };
            d.ready(self);
        }
    }

    /// New work requests of `qp`: handed to its engine and sent in this thread when the
    /// driver is free, else by whoever holds it next.
    pub(crate) fn submit(&self, qp: &Arc<TcpQp>) {
        match self.try_lock_driver() {
            Some(mut d) => d.post(self, qp),
            None => self.schedule(qp),
        }
    }
}

impl Driver {
    /// A poster's turn: the QP's queued requests go to its engine and out to the socket in
    /// the posting thread.
    pub(crate) fn post(&mut self, ctx: &TcpShared, qp: &Arc<TcpQp>) {
        qp.scheduled.store(false, Ordering::Release);
        if let Some(c) = self
            .qp_conn
            .get(&qp.qpn)
            .and_then(|t| touch(&mut self.conns, &mut self.touched, *t))
        {
            c.posted(ctx, &mut self.bufs);
        } else if qp.state().is_dead() {
            qp.flush_orphan();
        }
    }

    /// Requests of `qp` posted while this thread holds the driver: `admit(wr, true)` checks
    /// each and returns it unless it had to queue behind others; those go to the engine
    /// here, without a trip through the submission queue, and out. `None` (and nothing taken
    /// from `wrs`) when the QP has no established connection: they queue.
    pub(crate) fn post_direct<W, C: Hand>(
        &mut self,
        ctx: &TcpShared,
        qp: &Arc<TcpQp>,
        wrs: &mut impl Iterator<Item = (usize, W)>,
        admit: impl Fn(W, bool) -> Result<Option<C>, Error>,
    ) -> Option<Result<(), (usize, Error)>> {
        let t = self
            .established_conn(qp)
            .filter(|t| !self.conns[t].is_dead())?;
        let c = touch(&mut self.conns, &mut self.touched, t)?;
        let start = Instant::now();
        #[cfg(test)]
        let burst = ctx.always_burst.load(Ordering::Relaxed);
        #[cfg(not(test))]
        let burst = false;
        if burst
            || c.last_post
                .is_some_and(|l| start.saturating_duration_since(l) < BURST_GAP)
        {
            c.align = c.emss as usize;
        }
        let held = c.held_since.is_some();
        let (mut res, mut handed, mut serve, mut queued) = (Ok(()), false, false, false);
        for (i, wr) in wrs {
            match admit(wr, true) {
                Ok(Some(wr)) => {
                    serve |= wr.hand(c, qp);
                    handed = true;
                }
                Ok(None) => queued = true,
                Err(e) => {
                    res = Err((i, e));
                    break;
                }
            }
        }
        if queued {
            c.posted(ctx, &mut self.bufs);
        } else if serve || (handed && !c.quiet()) {
            c.serve_submitted(ctx, &mut self.bufs);
        }
        c.align = 0;
        c.last_post = Some(Instant::now());
        if !held && c.held_since.is_some() {
            // A new timer: whoever waits on the sockets looks again.
            ctx.wake();
        }
        Some(res)
    }

    /// `qp`'s counters: its connection's engine's while it has one, else those it kept.
    pub(crate) fn qp_counters(&self, qp: &Arc<TcpQp>) -> QpCounters {
        self.established_conn(qp)
            .map_or_else(|| *qp.counters.lock(), |t| self.conns[&t].counters())
    }

    /// The established connection that carries `qp`.
    fn established_conn(&self, qp: &Arc<TcpQp>) -> Option<Token> {
        let t = *self.qp_conn.get(&qp.qpn)?;
        let c = self.conns.get(&t)?;
        (c.was_established() && c.qp.as_ref().is_some_and(|q| Arc::ptr_eq(q, qp))).then_some(t)
    }

    /// QPs with new work requests.
    pub(crate) fn ready(&mut self, ctx: &TcpShared) {
        // Swapped with a list kept for the purpose, so neither side's capacity is lost
        // (a post that schedules its QP then allocates nothing).
        let mut ready = std::mem::take(&mut self.ready_spare);
        ctx.ready_pending.store(false, Ordering::Relaxed);
        std::mem::swap(&mut ready, &mut *ctx.ready.lock());
        for qp in ready.drain(..) {
            // Before the connection is up too: receives go in at once.
            self.post(ctx, &qp);
        }
        self.ready_spare = ready;
    }
}

/// A checked request a connection's engine takes ([`Driver::post_direct`]).
pub(crate) trait Hand {
    /// Into `c`'s engine; `true` when the connection must be served (a send to write, a
    /// refused request's completion).
    fn hand(self, c: &mut Conn, qp: &TcpQp) -> bool;
}

impl Hand for CheckedSend {
    fn hand(self, c: &mut Conn, qp: &TcpQp) -> bool {
        c.hand_send(qp, self);
        true
    }
}

impl Hand for CheckedRecv {
    fn hand(self, c: &mut Conn, qp: &TcpQp) -> bool {
        c.hand_recv(qp, self)
    }
}

impl TcpQp {
    /// Completes every queued request of a QP without a live engine as flushed.
    pub(super) fn flush_orphan(&self) {
        let (sq, rq) = {
            let mut sub = self.sub.lock();
            (std::mem::take(&mut sub.sq), std::mem::take(&mut sub.rq))
        };
        let mut send: Vec<WorkCompletion> = sq.iter().map(|wr| wr.flushed()).collect();
        self.sq_retired
            .fetch_add(send.len() as u64, Ordering::AcqRel);
        let mut recv: Vec<WorkCompletion> = rq.iter().map(|wr| wr.flushed()).collect();
        self.rq_retired
            .fetch_add(recv.len() as u64, Ordering::AcqRel);
        // The QP is gone: an overrun only drops these flushes.
        let _ = self.send_cq.push(self.qpn, &mut send);
        let _ = self.recv_cq.push(self.qpn, &mut recv);
    }
}
