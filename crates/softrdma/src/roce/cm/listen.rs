//! The passive side of the RoCE CM: listeners (`rdma_listen`) and the requests they take,
//! answered with a REP and awaited RTU or a SIDR_REP (`rdma_accept`), or refused
//! (`rdma_reject`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use softrdma_ib::cm::{CmEvent, CmService, CommId, reason, sidr_status};
use softrdma_ib::rdma_cm::{Agreed, Message, RDMA_UDP_QKEY, Refusal};
use softrdma_ib::{QpAttr, QpState as IbQpState, QpType};
use softrdma_wire::ib::cma::{PortSpace, service_id};

use super::{
    Forget, Gsi, ListenQueue, Pending, PendingKind, RoceQpShared, RoceShared, Rtu, Slot, bring_up,
    bring_up_ud, cm_error, info, invalid, mtu_code, random_u32,
};
use crate::Error;
use crate::backlog::Backlog;
use crate::connparams::{AcceptParams, ConnectionInfo};

/// A listener's registration: the port in both port spaces.
pub(crate) struct RoceListener {
    drv: Arc<RoceShared>,
    queue: Arc<ListenQueue>,
    port: u16,
    pub(crate) local_addr: SocketAddr,
}

impl RoceListener {
    /// `rdma_listen` on `addr` (our address or the wildcard; port 0: any free port).
    pub(crate) fn bind(
        drv: &Arc<RoceShared>,
        addr: impl ToSocketAddrs,
        backlog: u32,
    ) -> Result<RoceListener, Error> {
        let a = addr
            .to_socket_addrs()?
            .next()
            .ok_or(Error::InvalidArgument("no address to listen on"))?;
        if !a.ip().is_unspecified() && a.ip() != drv.local.ip() {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::AddrNotAvailable,
                format!(
                    "{} is not this RoCE device's address {}",
                    a.ip(),
                    drv.local.ip()
                ),
            )));
        }
        let queue = Arc::new(ListenQueue {
            requests: Backlog::new(backlog),
            rtu_waiters: Mutex::new(Vec::new()),
        });
        let mut g = drv.gsi.lock();
        let free = |g: &Gsi, p: u16| p != 0 && !g.listeners.contains_key(&p);
        let port = if a.port() != 0 {
            if !free(&g, a.port()) {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("RoCE port {} is listened on already", a.port()),
                )));
            }
            a.port()
        } else {
            let start = random_u32();
            (0..28232u32)
                .map(|i| 32768 + ((start + i) % 28232) as u16)
                .find(|&p| free(&g, p))
                .ok_or(Error::Io(std::io::ErrorKind::AddrInUse.into()))?
        };
        for ps in [PortSpace::Tcp, PortSpace::Udp] {
            g.cm.listen(service_id(ps, port)).map_err(cm_error)?;
        }
        g.listeners.insert(port, queue.clone());
        Ok(RoceListener {
            drv: drv.clone(),
            queue,
            port,
            local_addr: SocketAddr::new(drv.local.ip(), port),
        })
    }

    fn request(&self, p: Pending) -> RoceRequest {
        RoceRequest {
            drv: self.drv.clone(),
            queue: self.queue.clone(),
            p,
            answered: false,
        }
    }

    /// The next request, if one is queued.
    pub(crate) fn try_accept(&self) -> Option<RoceRequest> {
        self.queue.requests.try_pop().map(|p| self.request(p))
    }

    /// The next request, once there is one (cancel-safe).
    pub(crate) async fn accept_async(&self) -> Result<RoceRequest, Error> {
        let p = self.queue.requests.wait_async().await?;
        Ok(self.request(p))
    }

    /// The next request; `None` deadline: wait forever.
    pub(crate) fn accept(&self, deadline: Option<Instant>) -> Result<RoceRequest, Error> {
        let p = self.queue.requests.wait(deadline)?;
        Ok(self.request(p))
    }
}

impl Drop for RoceListener {
    fn drop(&mut self) {
        let pending = self.queue.requests.drain();
        {
            let mut g = self.drv.gsi.lock();
            g.listeners.remove(&self.port);
            for ps in [PortSpace::Tcp, PortSpace::Udp] {
                g.cm.unlisten(service_id(ps, self.port));
            }
        }
        for p in pending {
            self.request(p).refuse();
        }
    }
}

/// What [`RoceRequest::accept_start`] did.
enum Answer {
    /// UD: answered.
    Done(ConnectionInfo),
    /// RC, UC: the REP is out; the RTU is awaited.
    Wait(AcceptWait),
}

struct AcceptWait {
    id: CommId,
    slot: Arc<Slot>,
    peer_qpn: u32,
    pmtu: u32,
    ird: u16,
    ord: u16,
}

/// An acceptor's place among its listener's RTU waiters, left when dropped.
struct WaitingRtu<'a>(&'a ListenQueue, Arc<Slot>);

impl WaitingRtu<'_> {
    fn start(&self) {
        self.0.rtu_waiters.lock().push(self.1.clone());
        if !self.0.requests.is_empty() {
            self.1.nudge();
        }
    }
}

impl Drop for WaitingRtu<'_> {
    fn drop(&mut self) {
        self.0
            .rtu_waiters
            .lock()
            .retain(|s| !Arc::ptr_eq(s, &self.1));
    }
}

/// A connection request a RoCE listener received.
pub(crate) struct RoceRequest {
    drv: Arc<RoceShared>,
    /// The listener's queue: while other requests wait there, the RTU is not waited for.
    queue: Arc<ListenQueue>,
    p: Pending,
    answered: bool,
}

impl RoceRequest {
    pub(crate) fn driver(&self) -> &Arc<RoceShared> {
        &self.drv
    }

    pub(crate) fn peer_addr(&self) -> SocketAddr {
        self.p.peer_addr
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.p.local_addr
    }

    pub(crate) fn private_data(&self) -> &[u8] {
        &self.p.private_data
    }

    pub(crate) fn peer_ird_ord(&self) -> (u16, u16) {
        match &self.p.kind {
            PendingKind::Conn(r) => (
                u16::from(r.responder_resources),
                u16::from(r.initiator_depth),
            ),
            PendingKind::Sidr => (0, 0),
        }
    }

    /// Passive side (`rdma_accept`): the QP to RTS, then REP and wait for the RTU (RC,
    /// UC), or SIDR_REP with the QP's number and Q_Key (UD). While other requests wait on
    /// the listener, the RTU is not waited for (as `rdma_accept` does not): a requester
    /// whose RTU never comes must not hold the acceptor from the others. Its connection
    /// then completes on its own: [`AsyncEvent::Established`] on the RTU, or the QP to
    /// Error and [`AsyncEvent::Disconnected`] when the CM gives it up.
    pub(crate) fn accept(
        &mut self,
        q: &RoceQpShared,
        params: &AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        let deadline = Instant::now() + params.timeout;
        match self.accept_start(q, params)? {
            Answer::Done(info) => Ok(info),
            Answer::Wait(w) => {
                let waiting = WaitingRtu(&self.queue, w.slot.clone());
                waiting.start();
                let rtu = w.slot.wait_rtu(deadline);
                drop(waiting);
                self.accept_finish(q, &w, rtu)
            }
        }
    }

    /// [`accept`](Self::accept) for a task: the CM's timers bound the wait for the RTU;
    /// dropped early, the connection is abandoned and the QP goes to Error.
    pub(crate) async fn accept_async(
        &mut self,
        q: &RoceQpShared,
        params: &AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        match self.accept_start(q, params)? {
            Answer::Done(info) => Ok(info),
            Answer::Wait(w) => {
                let mut forget = Forget(&self.drv, Some(w.id), Some(q));
                let waiting = WaitingRtu(&self.queue, w.slot.clone());
                waiting.start();
                let rtu = w.slot.wait_rtu_async().await;
                drop(waiting);
                forget.1 = None;
                drop(forget);
                self.accept_finish(q, &w, rtu)
            }
        }
    }

    /// The RTU (or what came instead, or nothing in time, or other requests waiting) for
    /// the REP sent.
    fn accept_finish(
        &self,
        q: &RoceQpShared,
        w: &AcceptWait,
        rtu: Rtu,
    ) -> Result<ConnectionInfo, Error> {
        let drv = &self.drv;
        let ev = match rtu {
            Rtu::Came(ev) => Some(ev),
            Rtu::Nothing => None,
            Rtu::Others => {
                // Nobody waits for this connection's events any more (they go to the
                // context's async events); one that came meanwhile is taken here.
                if drv.gsi.lock().slots.remove(&w.id).is_some() {
                    w.slot
                        .ev
                        .lock()
                        .take()
                        .or(Some(CmEvent::Established { id: w.id }))
                } else {
                    // The CM took the slot to answer it: the event is being put there.
                    w.slot
                        .wait(Instant::now() + std::time::Duration::from_secs(1))
                }
            }
        };
        match ev {
            Some(CmEvent::Established { .. }) => Ok(info(
                drv,
                self.p.peer_addr,
                (w.peer_qpn, w.pmtu, 0),
                w.ird,
                w.ord,
                self.p.private_data.clone(),
            )),
            other => {
                if other.is_none() {
                    drv.forget(w.id);
                }
                let _ = drv.modify(q, &QpAttr::state(IbQpState::Error));
                Err(match other {
                    Some(CmEvent::Rejected {
                        reason,
                        private_data,
                        ..
                    }) => Error::Rejected {
                        reason: Some(reason),
                        private_data,
                    },
                    _ => Error::Timeout,
                })
            }
        }
    }

    /// Checks, brings the QP up and answers: SIDR_REP (done) or REP (then the RTU).
    fn accept_start(&mut self, q: &RoceQpShared, params: &AcceptParams) -> Result<Answer, Error> {
        let drv = self.drv.clone();
        let id = self.p.id;
        let req = match &self.p.kind {
            PendingKind::Sidr => {
                if q.qp_type() != QpType::Ud {
                    return Err(Error::InvalidArgument("a UD request needs a UD QP"));
                }
                Message::SidrRep
                    .check(&params.private_data)
                    .map_err(|e| invalid(e, "SIDR_REP private data is at most 136 octets"))?;
                bring_up_ud(&drv, q, RDMA_UDP_QKEY)?;
                let qkey = q.engine.lock().qp.qkey();
                self.answered = true;
                let now = Instant::now();
                let r = drv.gsi.lock().cm.sidr_reply(
                    now,
                    id,
                    sidr_status::OK,
                    q.qpn,
                    qkey,
                    &params.private_data,
                );
                drv.gsi_pump(now);
                r.map_err(cm_error)?;
                return Ok(Answer::Done(info(
                    &drv,
                    self.p.peer_addr,
                    (0, 0, 0),
                    0,
                    0,
                    self.p.private_data.clone(),
                )));
            }
            PendingKind::Conn(r) => r.clone(),
        };
        let want = if req.service == CmService::Rc {
            QpType::Rc
        } else {
            QpType::Uc
        };
        if q.qp_type() != want {
            return Err(Error::InvalidArgument("the QP's type is not the request's"));
        }
        if !matches!(q.state(), IbQpState::Reset | IbQpState::Init) {
            return Err(Error::InvalidState(crate::state::QpState::from(q.state())));
        }
        Message::Rep
            .check(&params.private_data)
            .map_err(|e| invalid(e, "RoCE private data is at most 196 octets in a reply"))?;
        let pmtu = mtu_code(params.roce.pmtu)?;
        let a = Agreed::responder(&req, random_u32() & 0xFF_FFFF, pmtu, params.ird, params.ord);
        self.answered = true;
        let peer = SocketAddr::new(req.peer, drv.local.port());
        if let Err(e) = bring_up(&drv, q, peer, &a) {
            drv.cm_reject(id, reason::NO_QP);
            drv.gsi_pump(Instant::now());
            return Err(e);
        }
        let rep = a.rep(q.qpn, q.has_srq(), params.private_data.clone());
        drv.bind_qp(id, q.qpn);
        q.awaiting_rtu
            .store(true, std::sync::atomic::Ordering::Release);
        let (_, (), slot) = drv.cm_call(|g| {
            g.cm.accept(Instant::now(), id, &rep)?;
            Ok((id, ()))
        })?;
        Ok(Answer::Wait(AcceptWait {
            id,
            slot,
            peer_qpn: req.qpn,
            pmtu: a.pmtu,
            ird: a.ird,
            ord: a.ord,
        }))
    }

    /// `rdma_reject`: REJ (consumer reject) or SIDR_REP (reject) with `private_data`.
    pub(crate) fn reject(&mut self, private_data: &[u8]) -> Result<(), Error> {
        if self.answered {
            return Ok(());
        }
        let (msg, limit) = match self.p.kind {
            PendingKind::Conn(_) => (
                Message::Rej,
                "RoCE private data is at most 148 octets in a reject",
            ),
            PendingKind::Sidr => (
                Message::SidrRep,
                "RoCE private data is at most 136 octets in a SIDR reject",
            ),
        };
        msg.check(private_data).map_err(|e| invalid(e, limit))?;
        self.answered = true;
        self.drv
            .refuse(self.p.id, &self.p.kind, Refusal::Consumer, private_data);
        self.drv.gsi_pump(Instant::now());
        Ok(())
    }

    fn refuse(mut self) {
        let _ = self.reject(&[]);
    }
}

impl Drop for RoceRequest {
    fn drop(&mut self) {
        let _ = self.reject(&[]);
    }
}
