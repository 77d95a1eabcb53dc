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
//! RoCE: the InfiniBand CM on QP1 with librdmacm's conventions: a listener
//! is a port in the RDMA_PS_TCP and RDMA_PS_UDP port spaces, requests are REQs (RC, UC)
//! and SIDR_REQs (UD) from softrdma or any `rdma_cm` peer (rping, perftest -R, udaddy,
//! the kernel's NFS over RDMA). Private data: 56 octets in a request (after librdmacm's
//! CMA header), 196 in a reply, 148 in a reject; what arrives is the whole field, padding
//! included, as `rdma_cm` hands it over.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use softrdma_iwarp::startup::PeerParams;

use crate::Error;
use crate::connparams::{AcceptParams, ConnectionInfo, ListenParams};
use crate::device::Context;
use crate::provider::{ListenOps, RequestOps};
use crate::qp::Qp;

/// A connection request a listener received. iWARP: the TCP connection is up and a valid
/// MPA Request arrived; RoCE: a valid request of the connection exchange arrived. Answer
/// with [`accept`](ConnRequest::accept) or [`reject`](ConnRequest::reject); dropping it
/// rejects without private data.
pub struct ConnRequest {
    inner: Box<dyn RequestOps>,
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
        self.inner.peer_addr()
    }

    /// Our address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The request's private data (iWARP: revision 2's IRD/ORD word removed).
    pub fn private_data(&self) -> &[u8] {
        self.inner.private_data()
    }

    /// iWARP: revision, M, C and the revision 2 IRD/ORD word of the MPA Request.
    pub fn peer_params(&self) -> Option<PeerParams> {
        self.inner.peer_params()
    }

    /// The initiator's IRD and ORD (iWARP: MPA revision 2 only).
    pub fn peer_ird_ord(&self) -> Option<(u16, u16)> {
        self.inner.peer_ird_ord()
    }

    /// Accepts (`rdma_accept`) on `qp` — in `Init` (as created; RoCE also takes `Reset`) — which is in
    /// [`QpState::Rts`](crate::QpState::Rts) when this returns: iWARP once the MPA Reply went out, RoCE once the
    /// initiator confirmed (RTU) — or, while other requests wait on the listener, once the
    /// REP went out (an RTU that never comes must not hold the acceptor from them; the
    /// connection then completes with [`AsyncEvent::Established`](crate::AsyncEvent::Established) or, given up,
    /// [`AsyncEvent::Disconnected`](crate::AsyncEvent::Disconnected)).
    pub fn accept(self, qp: &Qp, params: AcceptParams) -> Result<ConnectionInfo, Error> {
        self.inner.accept(qp.ops(), params)
    }

    /// [`accept`](Self::accept) as a future of any runtime: it resolves when the QP is in
    /// [`QpState::Rts`](crate::QpState::Rts) (iWARP: the MPA Reply went out; RoCE: the RTU arrived, within the
    /// CM's timers, or the REP went out while other requests wait). Dropped before that, the connection is abandoned (iWARP: closed;
    /// RoCE: the QP goes to Error).
    pub async fn accept_async(
        self,
        qp: &Qp,
        params: AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        self.inner.accept_async(qp.ops(), params).await
    }

    /// Rejects (`rdma_reject`) with `private_data` (iWARP: an MPA Reply with R=1, then the
    /// TCP connection is closed).
    pub fn reject(self, private_data: &[u8]) -> Result<(), Error> {
        self.inner.reject(private_data)
    }
}

/// A listener for connection requests (`rdma_listen`), bound to an address. iWARP: the
/// progress thread accepts TCP connections and runs MPA as responder; RoCE: the CM on QP1
/// takes requests for the port in librdmacm's TCP and UDP port spaces. Requests surface
/// through [`accept`](Listener::accept). Closed on drop.
pub struct Listener {
    inner: Box<dyn ListenOps>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local_addr())
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
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        Ok(Listener {
            inner: ctx.shared.provider().listen(&addrs, params)?,
        })
    }

    /// The bound address (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The next connection request, without blocking.
    pub fn try_accept(&self) -> Option<ConnRequest> {
        self.inner.try_accept().map(|inner| ConnRequest { inner })
    }

    /// Blocks for the next connection request (`rdma_get_request`).
    pub fn accept(&self) -> Result<ConnRequest, Error> {
        self.accept_until(None)
    }

    /// The next connection request, as a future of any runtime (async
    /// [`accept`](Self::accept); cancel-safe: a request stays queued until returned).
    pub async fn accept_async(&self) -> Result<ConnRequest, Error> {
        let inner = self.inner.accept_async().await?;
        Ok(ConnRequest { inner })
    }

    /// Blocks at most `timeout` for the next connection request.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<ConnRequest, Error> {
        self.accept_until(Some(Instant::now() + timeout))
    }

    fn accept_until(&self, deadline: Option<Instant>) -> Result<ConnRequest, Error> {
        let inner = self.inner.accept(deadline)?;
        Ok(ConnRequest { inner })
    }
}
