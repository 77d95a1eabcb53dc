//! The iWARP provider: the verbs API's operations ([`crate::provider`]) on this driver.
//! QPs and requests are answered through the progress thread's commands; a listener's
//! requests arrive on its [`ListenerShared`] queue.

use std::any::Any;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use softrdma_ib::{QpAttr, QpType};
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_iwarp::startup::{MAX_IRD_ORD, PeerParams, Startup};
use softrdma_verbs_types::{RecvWr, SendWr};

use softrdma_iwarp::startup::{Rtr, RtrSet, StartupConfig, StartupError};
use softrdma_wire::mpa::{MAX_PRIVATE_DATA, REV_2};

use super::{Cmd, ListenerShared, PendingRequest, TcpQp, TcpShared, prepare_stream};
use crate::Error;
use crate::connparams::{AcceptParams, ConnectParams, ConnectionInfo, ListenParams};
use crate::cq::Progress;
use crate::provider::{
    BoxFuture, Connected, Destroy, DriverQp, ListenOps, Provider, QpCreate, QpOps, RequestOps,
    Settings,
};
use crate::state::{QpCounters, QpState};

/// An iWARP QP: its submission queues, and the driver that runs its connection.
type IwarpQp = DriverQp<TcpShared, TcpQp>;

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
        Startup::responder(params.startup_config(), Instant::now())?;
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

/// Extra time a blocking call waits beyond the MPA timeout before giving up on the
/// progress thread (a safety net, not a protocol timer).
const REPLY_GRACE: Duration = Duration::from_secs(5);

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
