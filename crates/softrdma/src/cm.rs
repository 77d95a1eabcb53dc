//! The connection manager (`rdma_cm`): [`Listener`], [`ConnRequest`] and
//! [`Qp::connect`](crate::Qp::connect), one API for every transport.
//!
//! iWARP: a TCP listener and MPA negotiation (RFC 5044 §7.1, RFC 6581) run by the progress
//! thread. Defaults follow Linux rdma_cm over siw: MPA revision 2 with the IRD/ORD word, CRC
//! only when asked (either side asking turns it on), no Markers, client-server mode. Our
//! responder sends no FPDU before the initiator's first one (RFC 5044 §7.1.2 r4, MPA-73),
//! unless [`ListenParams::early_fpdus`] asks for siw's behaviour. Peer-to-peer mode (RFC
//! 6581) with a zero-length RDMA Write as the RTR is available on both sides.
//!
//! RoCE: the InfiniBand CM on QP1 with librdmacm's conventions (`roce::cm`): a listener
//! is a port in the RDMA_PS_TCP and RDMA_PS_UDP port spaces, requests are REQs (RC, UC)
//! and SIDR_REQs (UD) from softrdma or any `rdma_cm` peer (rping, perftest -R, udaddy,
//! the kernel's NFS over RDMA). Private data: 56 octets in a request (after librdmacm's
//! CMA header), 196 in a reply, 148 in a reject; what arrives is the whole field, padding
//! included, as `rdma_cm` hands it over.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_iwarp::startup::{MAX_IRD_ORD, PeerParams, Startup};

use crate::Error;
use crate::connparams::{AcceptParams, ConnectionInfo, ListenParams};
use crate::device::{Context, Driver};
use crate::qp::{Inner, Qp};
use crate::roce::RoceShared;
use crate::roce::cm::{RoceListener, RoceRequest};
use crate::state::QpState;
use crate::tcp::{
    Abandon, Cmd, ListenerShared, PendingRequest, TcpQp, TcpShared, check_private_data,
    reply_async, wait_reply,
};

/// A connection request a listener received. iWARP: the TCP connection is up and a valid
/// MPA Request arrived; RoCE: a valid request of the connection exchange arrived. Answer
/// with [`accept`](ConnRequest::accept) or [`reject`](ConnRequest::reject); dropping it
/// rejects without private data.
pub struct ConnRequest {
    inner: Req,
}

enum Req {
    Tcp(TcpRequest),
    Roce {
        drv: Arc<RoceShared>,
        req: RoceRequest,
    },
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer_addr", &self.peer_addr())
            .field("peer_ird_ord", &self.peer_ird_ord())
            .finish()
    }
}

impl ConnRequest {
    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        match &self.inner {
            Req::Tcp(r) => r.req.peer_addr,
            Req::Roce { req, .. } => req.peer_addr(),
        }
    }

    /// Our address.
    pub fn local_addr(&self) -> SocketAddr {
        match &self.inner {
            Req::Tcp(r) => r.req.local_addr,
            Req::Roce { req, .. } => req.local_addr(),
        }
    }

    /// The request's private data (iWARP: revision 2's IRD/ORD word removed).
    pub fn private_data(&self) -> &[u8] {
        match &self.inner {
            Req::Tcp(r) => &r.req.private_data,
            Req::Roce { req, .. } => req.private_data(),
        }
    }

    /// iWARP: revision, M, C and the revision 2 IRD/ORD word of the MPA Request.
    pub fn peer_params(&self) -> Option<PeerParams> {
        match &self.inner {
            Req::Tcp(r) => Some(r.req.params),
            Req::Roce { .. } => None,
        }
    }

    /// The initiator's IRD and ORD (iWARP: MPA revision 2 only).
    pub fn peer_ird_ord(&self) -> Option<(u16, u16)> {
        match &self.inner {
            Req::Tcp(r) => r.req.params.rev2.map(|w| (w.ird, w.ord)),
            Req::Roce { req, .. } => Some(req.peer_ird_ord()),
        }
    }

    /// Accepts (`rdma_accept`) on `qp` — in `Init` (as created; RoCE also takes `Reset`) — which is in
    /// [`QpState::Rts`] when this returns: iWARP once the MPA Reply went out, RoCE once the
    /// initiator confirmed (RTU) — or, while other requests wait on the listener, once the
    /// REP went out (an RTU that never comes must not hold the acceptor from them; the
    /// connection then completes with [`AsyncEvent::Established`](crate::AsyncEvent::Established) or, given up,
    /// [`AsyncEvent::Disconnected`](crate::AsyncEvent::Disconnected)).
    pub fn accept(self, qp: &Qp, params: AcceptParams) -> Result<ConnectionInfo, Error> {
        match self.inner {
            Req::Tcp(r) => r.accept(qp, params),
            Req::Roce { drv, mut req } => {
                let q = match (&qp.inner, qp.ctx.roce()) {
                    (Inner::Roce(q), Ok(d)) if Arc::ptr_eq(d, &drv) => q,
                    _ => return Err(Error::InvalidArgument("QP of another context")),
                };
                req.accept(q, &params)
            }
        }
    }

    /// [`accept`](Self::accept) as a future of any runtime: it resolves when the QP is in
    /// [`QpState::Rts`] (iWARP: the MPA Reply went out; RoCE: the RTU arrived, within the
    /// CM's timers, or the REP went out while other requests wait). Dropped before that, the connection is abandoned (iWARP: closed;
    /// RoCE: the QP goes to Error).
    pub async fn accept_async(
        self,
        qp: &Qp,
        params: AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        match self.inner {
            Req::Tcp(mut r) => {
                let (q, rx) = r.accept_start(qp, params)?;
                let tcp = r.tcp.clone();
                let mut guard = Abandon(&tcp, Some(q));
                let res = reply_async(rx).await;
                let q = guard.1.take();
                if res.is_err()
                    && let Some(q) = q
                {
                    q.transition(QpState::Connecting, QpState::Init);
                }
                res
            }
            Req::Roce { drv, mut req } => {
                let q = match (&qp.inner, qp.ctx.roce()) {
                    (Inner::Roce(q), Ok(d)) if Arc::ptr_eq(d, &drv) => q,
                    _ => return Err(Error::InvalidArgument("QP of another context")),
                };
                req.accept_async(q, &params).await
            }
        }
    }

    /// Rejects (`rdma_reject`) with `private_data` (iWARP: an MPA Reply with R=1, then the
    /// TCP connection is closed).
    pub fn reject(self, private_data: &[u8]) -> Result<(), Error> {
        match self.inner {
            Req::Tcp(r) => r.reject(private_data),
            Req::Roce { mut req, .. } => req.reject(private_data),
        }
    }
}

/// An iWARP request: answered through the progress thread.
struct TcpRequest {
    tcp: Arc<TcpShared>,
    req: PendingRequest,
    answered: bool,
}

impl TcpRequest {
    fn accept(mut self, qp: &Qp, params: AcceptParams) -> Result<ConnectionInfo, Error> {
        let (q, rx) = self.accept_start(qp, params)?;
        let r = wait_reply(rx, Duration::ZERO);
        if r.is_err() {
            q.transition(QpState::Connecting, QpState::Init);
        }
        r
    }

    /// Hands the QP and the answer to the progress thread, whose reply comes on the
    /// channel returned.
    #[allow(clippy::type_complexity)]
    fn accept_start(
        &mut self,
        qp: &Qp,
        params: AcceptParams,
    ) -> Result<(Arc<TcpQp>, oneshot::Receiver<Result<ConnectionInfo, Error>>), Error> {
        self.answered = true;
        check_private_data(self.req.params.rev, params.private_data.len())?;
        if params.ird > MAX_IRD_ORD || params.ord > MAX_IRD_ORD {
            return Err(Error::InvalidArgument("IRD and ORD are 14-bit values"));
        }
        let q = match (qp.tcp(), qp.ctx.tcp()) {
            (Ok(q), Ok(t)) if Arc::ptr_eq(t, &self.tcp) => q.clone(),
            _ => return Err(Error::InvalidArgument("QP of another context")),
        };
        if !q.transition(QpState::Init, QpState::Connecting) {
            let _ = self.tcp.command(Cmd::Reject {
                token: self.req.token,
                private_data: Vec::new(),
            });
            return Err(Error::InvalidState(qp.state()));
        }
        let (reply, rx) = oneshot::channel();
        let r = self.tcp.command(Cmd::Accept {
            token: self.req.token,
            qp: q.clone(),
            private_data: params.private_data,
            ird: params.ird,
            ord: params.ord,
            fpdu: params.fpdu,
            early_fpdus: self.req.early_fpdus,
            reply,
        });
        if let Err(e) = r {
            q.transition(QpState::Connecting, QpState::Init);
            return Err(e);
        }
        Ok((q, rx))
    }

    fn reject(mut self, private_data: &[u8]) -> Result<(), Error> {
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

/// A listener for connection requests (`rdma_listen`), bound to an address. iWARP: the
/// progress thread accepts TCP connections and runs MPA as responder; RoCE: connection
/// requests of the exchange in [`roce`](crate::Device) contexts arrive on a TCP port.
/// Requests surface through [`accept`](Listener::accept). Closed on drop.
pub struct Listener {
    inner: Lis,
    local_addr: SocketAddr,
}

enum Lis {
    Tcp {
        tcp: Arc<TcpShared>,
        shared: Arc<ListenerShared>,
        token: mio::Token,
    },
    Roce {
        drv: Arc<RoceShared>,
        listener: RoceListener,
    },
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` with [`ListenParams::default`].
    pub fn bind(ctx: &Context, addr: impl ToSocketAddrs) -> Result<Listener, Error> {
        Listener::bind_with(ctx, addr, ListenParams::default())
    }

    /// Listens on `addr` with `params`.
    pub fn bind_with(
        ctx: &Context,
        addr: impl ToSocketAddrs,
        params: ListenParams,
    ) -> Result<Listener, Error> {
        let tcp = match &ctx.shared.driver {
            Driver::Tcp(t) => t.clone(),
            Driver::Roce(drv) => {
                let listener = RoceListener::bind(drv, addr, params.backlog)?;
                return Ok(Listener {
                    local_addr: listener.local_addr,
                    inner: Lis::Roce {
                        drv: drv.clone(),
                        listener,
                    },
                });
            }
        };
        // Refuse a bad configuration now rather than at each request.
        Startup::responder(params.startup_config(), Instant::now())?;
        let std_listener = crate::net::listen(addr, params.backlog)?;
        std_listener.set_nonblocking(true)?;
        let local_addr = std_listener.local_addr()?;
        let shared = Arc::new(ListenerShared::new(params));
        let token = tcp.token();
        tcp.command(Cmd::Listen {
            token,
            listener: mio::net::TcpListener::from_std(std_listener),
            shared: shared.clone(),
        })?;
        Ok(Listener {
            inner: Lis::Tcp { tcp, shared, token },
            local_addr,
        })
    }

    /// The bound address (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next connection request, without blocking (RoCE: a request whose TCP
    /// connection is already up is still read, within the listener's timeout).
    pub fn try_accept(&self) -> Option<ConnRequest> {
        match &self.inner {
            Lis::Tcp { shared, .. } => {
                let req = shared.try_pop()?;
                Some(self.wrap(req))
            }
            Lis::Roce { .. } => self
                .accept_until(Some(Instant::now() + Duration::from_millis(1)))
                .ok(),
        }
    }

    /// Blocks for the next connection request (`rdma_get_request`).
    pub fn accept(&self) -> Result<ConnRequest, Error> {
        self.accept_until(None)
    }

    /// The next connection request, as a future of any runtime (async
    /// [`accept`](Self::accept); cancel-safe: a request stays queued until returned).
    pub async fn accept_async(&self) -> Result<ConnRequest, Error> {
        match &self.inner {
            Lis::Tcp { shared, .. } => {
                let req = shared.wait_async().await?;
                Ok(self.wrap(req))
            }
            Lis::Roce { drv, listener } => Ok(ConnRequest {
                inner: Req::Roce {
                    drv: drv.clone(),
                    req: listener.accept_async().await,
                },
            }),
        }
    }

    /// Blocks at most `timeout` for the next connection request.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<ConnRequest, Error> {
        self.accept_until(Some(Instant::now() + timeout))
    }

    fn accept_until(&self, deadline: Option<Instant>) -> Result<ConnRequest, Error> {
        match &self.inner {
            Lis::Tcp { shared, .. } => {
                let req = shared.wait(deadline)?;
                Ok(self.wrap(req))
            }
            Lis::Roce { drv, listener } => Ok(ConnRequest {
                inner: Req::Roce {
                    drv: drv.clone(),
                    req: listener.accept(deadline)?,
                },
            }),
        }
    }

    fn wrap(&self, req: PendingRequest) -> ConnRequest {
        let Lis::Tcp { tcp, .. } = &self.inner else {
            unreachable!("iWARP requests come from iWARP listeners");
        };
        ConnRequest {
            inner: Req::Tcp(TcpRequest {
                tcp: tcp.clone(),
                req,
                answered: false,
            }),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Lis::Tcp { tcp, shared, token } = &self.inner {
            shared.close();
            // The port is free once this returns (a program listens on it again at once:
            // librdmacm's servers do), unless this is the progress thread itself.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            if tcp.command(Cmd::Unlisten(*token, Some(tx))).is_ok() && !tcp.on_progress_thread() {
                let _ = rx.recv_timeout(Duration::from_secs(5));
            }
        }
    }
}
