//! The provider boundary: what a transport does, as one table of operations.
//!
//! As the Linux RDMA core asks each driver (siw, rxe) for one `ib_device_ops`, the verbs API
//! (`qp`, `cm`) asks a context's provider to create QPs and listeners, and each QP, listener
//! and request for the rest. The API keeps what both transports do alike (limits, the QP's
//! shadow attributes, `sq_sig_all`, inline buffers); a driver implements these traits and is
//! named only where a device is opened (`device`).

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use softrdma_ib::{QpAttr, QpType};
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_iwarp::startup::PeerParams;
use softrdma_memory::{KeyTable, PdId};
use softrdma_verbs_types::{RecvWr, SendWr};

use crate::Error;
use crate::connparams::{AcceptParams, ConnectParams, ConnectionInfo, ListenParams, QpCap};
use crate::cq::CqShared;
use crate::leader::{Leader, Spin};
use crate::srq::SrqShared;
use crate::state::{QpCounters, QpState};
use crate::tap::TapSlot;

/// A future a provider returns for one of the API's async calls.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The future of an async connect or accept.
pub(crate) type Connected<'a> = BoxFuture<'a, Result<ConnectionInfo, Error>>;

/// A QP to create, checked against the device's limits already.
pub(crate) struct QpCreate<'a> {
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdId,
    pub(crate) cap: QpCap,
    pub(crate) keys: &'a Arc<KeyTable>,
    pub(crate) send_cq: &'a Arc<CqShared>,
    pub(crate) recv_cq: &'a Arc<CqShared>,
    pub(crate) srq: Option<&'a Arc<SrqShared>>,
}

/// A transport's driver, one per open context.
pub(crate) trait Provider: Send + Sync {
    /// `ibv_create_qp`: RC and UC QPs come back in [`QpState::Init`], UD QPs in `Reset`.
    fn create_qp(&self, attr: QpCreate<'_>) -> Result<Box<dyn QpOps>, Error>;

    /// `rdma_listen` on the first of `addrs`.
    fn listen(
        &self,
        addrs: &[SocketAddr],
        params: ListenParams,
    ) -> Result<Box<dyn ListenOps>, Error>;

    /// The settings the context's API changes.
    fn settings(&self) -> Settings<'_>;

    /// The context is closed: stop the driver's threads.
    fn close(&self) {}
}

/// A driver's QP: the driver's half of it, and the driver that runs it. Dropping it
/// destroys the QP.
pub(crate) struct DriverQp<D: Destroy<Q>, Q> {
    pub(crate) drv: Arc<D>,
    pub(crate) q: Arc<Q>,
}

/// How a driver destroys one of its QPs (`ibv_destroy_qp`).
pub(crate) trait Destroy<Q> {
    fn destroy(&self, q: &Arc<Q>);
}

impl<D: Destroy<Q>, Q> Drop for DriverQp<D, Q> {
    fn drop(&mut self) {
        self.drv.destroy(&self.q);
    }
}

/// What every driver keeps alike and the context's API changes.
pub(crate) struct Settings<'a> {
    /// How the background thread polls before it sleeps.
    pub(crate) background_poll: &'a Spin,
    /// Where what the transport sends and receives is copied, once set.
    pub(crate) tap: &'a TapSlot,
}

impl<'a> Settings<'a> {
    pub(crate) fn of<S>(leader: &'a Leader<S>, tap: &'a TapSlot) -> Settings<'a> {
        Settings {
            background_poll: leader.background_poll(),
            tap,
        }
    }
}

/// One QP of a provider. Dropping it destroys the QP.
pub(crate) trait QpOps: Send + Sync {
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    /// The connection's parameters, where the transport keeps them with the QP.
    fn connection(&self) -> Option<ConnectionInfo> {
        None
    }
    fn counters(&self) -> QpCounters;
    /// The last asynchronous event of a stream (Terminate, LLP error).
    fn last_event(&self) -> Option<QpEvent> {
        None
    }
    fn sq_outstanding(&self) -> u64;

    /// Posts in order up to the first refused request, whose index comes back (`bad_wr`).
    fn post_send_list(&self, wrs: &mut dyn Iterator<Item = SendWr>) -> Result<(), (usize, Error)>;
    fn post_recv_list(&self, wrs: &mut dyn Iterator<Item = RecvWr>) -> Result<(), (usize, Error)>;

    /// `ibv_modify_qp`.
    fn modify(&self, attr: &QpAttr) -> Result<(), Error>;
    /// The path of a QP brought up by hand (`ah_attr`).
    fn set_remote(&self, addr: SocketAddr) -> Result<(), Error>;

    /// `rdma_connect` to the first of `addrs` that answers.
    fn connect(
        &self,
        addrs: &[SocketAddr],
        params: &ConnectParams,
    ) -> Result<ConnectionInfo, Error>;
    fn connect_async(&self, addr: SocketAddr, params: ConnectParams) -> Connected<'_>;
    /// `rdma_disconnect`.
    fn disconnect(&self) -> Result<(), Error>;

    /// For a request's accept to find its own provider's QP.
    fn as_any(&self) -> &dyn Any;
}

/// A listener of a provider. Dropping it stops listening.
pub(crate) trait ListenOps: Send + Sync {
    fn local_addr(&self) -> SocketAddr;
    fn try_accept(&self) -> Option<Box<dyn RequestOps>>;
    /// The next request; `None`: wait for ever.
    fn accept(&self, deadline: Option<Instant>) -> Result<Box<dyn RequestOps>, Error>;
    /// The next request, cancel-safe.
    fn accept_async(&self) -> BoxFuture<'_, Result<Box<dyn RequestOps>, Error>>;
}

/// A connection request of a provider. Dropping it unanswered rejects it.
pub(crate) trait RequestOps: Send {
    fn peer_addr(&self) -> SocketAddr;
    fn local_addr(&self) -> SocketAddr;
    fn private_data(&self) -> &[u8];
    /// iWARP: the MPA Request's parameters.
    fn peer_params(&self) -> Option<PeerParams> {
        None
    }
    fn peer_ird_ord(&self) -> Option<(u16, u16)>;
    /// `rdma_accept` on `qp`, one of the same context's QPs.
    fn accept(
        self: Box<Self>,
        qp: &dyn QpOps,
        params: AcceptParams,
    ) -> Result<ConnectionInfo, Error>;
    fn accept_async(self: Box<Self>, qp: &dyn QpOps, params: AcceptParams) -> Connected<'_>;
    /// `rdma_reject`.
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), Error>;
}
