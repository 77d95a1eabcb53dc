//! The iWARP provider: the verbs API's operations ([`crate::provider`]) on this driver.
//! QPs and requests are answered through the progress thread's commands; a listener's
//! requests arrive on its [`ListenerShared`] queue.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use softrdma_ib::QpType;
use softrdma_iwarp::startup::{MAX_IRD_ORD, PeerParams, Startup};

use softrdma_iwarp::startup::StartupError;
use softrdma_wire::mpa::{MAX_PRIVATE_DATA, REV_2};

use super::connect::{Abandon, reply_async, wait_reply};
use super::qp::IwarpQp;
use super::{Cmd, ListenerShared, PendingRequest, TcpQp, TcpShared};
use crate::Error;
use crate::connparams::{AcceptParams, ConnectionInfo, ListenParams};
use crate::cq::Progress;
use crate::provider::{
    BoxFuture, Connected, ListenOps, Provider, QpCreate, QpOps, RequestOps, Settings,
};
use crate::state::QpState;

/// An iWARP context's provider.
impl Provider for Arc<TcpShared> {
    fn create_qp(&self, a: QpCreate<'_>) -> Result<Box<dyn QpOps>, Error> {
        if a.qp_type != QpType::Rc {
            return Err(Error::Unsupported("iWARP QPs are reliable connected"));
        }
        for cq in [a.send_cq, a.recv_cq] {
            cq.attach(Arc::downgrade(self) as Weak<dyn Progress>);
        }
        let q = TcpQp::new(
            self.next_qp_num(),
            a.pd,
            a.cap,
            a.send_cq.clone(),
            a.recv_cq.clone(),
            a.srq.cloned(),
        );
        Ok(Box::new(IwarpQp {
            drv: self.clone(),
            q: Arc::new(q),
        }))
    }

    fn listen(
        &self,
        addrs: &[SocketAddr],
        params: ListenParams,
    ) -> Result<Box<dyn ListenOps>, Error> {
        // Refuse a bad configuration now rather than at each request.
        Startup::responder(params.iwarp.startup_config(), Instant::now())?;
        let std_listener = crate::net::listen(addrs, params.backlog)?;
        std_listener.set_nonblocking(true)?;
        let local_addr = std_listener.local_addr()?;
        let shared = Arc::new(ListenerShared::new(params));
        let tcp = self.clone();
        let token = tcp.token();
        tcp.command(Cmd::Listen {
            token,
            listener: mio::net::TcpListener::from_std(std_listener),
            shared: shared.clone(),
        })?;
        Ok(Box::new(IwarpListener {
            tcp,
            shared,
            token,
            local_addr,
        }))
    }

    fn settings(&self) -> Settings<'_> {
        Settings::of(&self.leader, &self.tap)
    }
}

/// An iWARP listener: the progress thread accepts TCP connections and runs MPA as
/// responder; requests whose MPA Request arrived wait in `shared`.
struct IwarpListener {
    tcp: Arc<TcpShared>,
    shared: Arc<ListenerShared>,
    token: mio::Token,
    local_addr: SocketAddr,
}

impl IwarpListener {
    fn wrap(&self, req: PendingRequest) -> Box<dyn RequestOps> {
        Box::new(TcpRequest {
            tcp: self.tcp.clone(),
            req,
            answered: false,
        })
    }
}

impl ListenOps for IwarpListener {
    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn try_accept(&self) -> Option<Box<dyn RequestOps>> {
        self.shared.requests.try_pop().map(|r| self.wrap(r))
    }

    fn accept(&self, deadline: Option<Instant>) -> Result<Box<dyn RequestOps>, Error> {
        self.shared.requests.wait(deadline).map(|r| self.wrap(r))
    }

    fn accept_async(&self) -> BoxFuture<'_, Result<Box<dyn RequestOps>, Error>> {
        Box::pin(async move {
            self.shared
                .requests
                .wait_async()
                .await
                .map(|r| self.wrap(r))
        })
    }
}

impl Drop for IwarpListener {
    fn drop(&mut self) {
        self.shared.requests.close();
        // The port is free once this returns (a program listens on it again at once:
        // librdmacm's servers do), unless this is the progress thread itself.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if self
            .tcp
            .command(Cmd::Unlisten(self.token, Some(tx)))
            .is_ok()
            && !self.tcp.on_progress_thread()
        {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }
}

/// An iWARP request: its TCP connection is up and a valid MPA Request arrived; answered
/// through the progress thread.
struct TcpRequest {
    tcp: Arc<TcpShared>,
    req: PendingRequest,
    answered: bool,
}

impl TcpRequest {
    /// Hands the QP and the answer to the progress thread, whose reply comes on the
    /// channel returned.
    #[allow(clippy::type_complexity)]
    fn accept_start(
        &mut self,
        qp: &dyn QpOps,
        params: AcceptParams,
    ) -> Result<(Arc<TcpQp>, oneshot::Receiver<Result<ConnectionInfo, Error>>), Error> {
        self.answered = true;
        check_private_data(self.req.params.rev, params.private_data.len())?;
        if params.ird > MAX_IRD_ORD || params.ord > MAX_IRD_ORD {
            return Err(Error::InvalidArgument("IRD and ORD are 14-bit values"));
        }
        let q = match qp.as_any().downcast_ref::<IwarpQp>() {
            Some(iq) if Arc::ptr_eq(&iq.drv, &self.tcp) => iq.q.clone(),
            _ => return Err(Error::InvalidArgument("QP of another context")),
        };
        if !q.transition(QpState::Init, QpState::Connecting) {
            let _ = self.tcp.command(Cmd::Reject {
                token: self.req.token,
                private_data: Vec::new(),
            });
            return Err(Error::InvalidState(q.state()));
        }
        let (reply, rx) = oneshot::channel();
        let r = self.tcp.command(Cmd::Accept {
            token: self.req.token,
            qp: q.clone(),
            private_data: params.private_data,
            ird: params.ird,
            ord: params.ord,
            fpdu: params.iwarp.fpdu,
            early_fpdus: self.req.early_fpdus,
            reply,
        });
        if let Err(e) = r {
            q.transition(QpState::Connecting, QpState::Init);
            return Err(e);
        }
        Ok((q, rx))
    }
}

impl RequestOps for TcpRequest {
    fn peer_addr(&self) -> SocketAddr {
        self.req.peer_addr
    }

    fn local_addr(&self) -> SocketAddr {
        self.req.local_addr
    }

    fn private_data(&self) -> &[u8] {
        &self.req.private_data
    }

    fn peer_params(&self) -> Option<PeerParams> {
        Some(self.req.params)
    }

    fn peer_ird_ord(&self) -> Option<(u16, u16)> {
        self.req.params.rev2.map(|w| (w.ird, w.ord))
    }

    fn accept(
        mut self: Box<Self>,
        qp: &dyn QpOps,
        params: AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        let (q, rx) = self.accept_start(qp, params)?;
        let r = wait_reply(rx, Duration::ZERO);
        if r.is_err() {
            q.transition(QpState::Connecting, QpState::Init);
        }
        r
    }

    fn accept_async(mut self: Box<Self>, qp: &dyn QpOps, p: AcceptParams) -> Connected<'_> {
        Box::pin(async move {
            let (q, rx) = self.accept_start(qp, p)?;
            let mut guard = Abandon(&self.tcp, Some(q));
            let res = reply_async(rx).await;
            let q = guard.1.take();
            if res.is_err()
                && let Some(q) = q
            {
                q.transition(QpState::Connecting, QpState::Init);
            }
            res
        })
    }

    fn reject(mut self: Box<Self>, private_data: &[u8]) -> Result<(), Error> {
        self.answered = true;
        check_private_data(self.req.params.rev, private_data.len())?;
        self.tcp.command(Cmd::Reject {
            token: self.req.token,
            private_data: private_data.to_vec(),
        })
    }
}

impl Drop for TcpRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.tcp.command(Cmd::Reject {
                token: self.req.token,
                private_data: Vec::new(),
            });
        }
    }
}

pub(crate) fn check_private_data(rev: u8, len: usize) -> Result<(), Error> {
    let limit = if rev == REV_2 {
        MAX_PRIVATE_DATA - 4
    } else {
        MAX_PRIVATE_DATA
    };
    if len > limit {
        return Err(Error::Startup(StartupError::PrivateDataTooLong {
            len,
            limit,
        }));
    }
    Ok(())
}
