//! The RoCEv2 provider: the verbs API's operations ([`crate::provider`]) on this driver.
//! Posts go to the QP's InfiniBand engine in the caller's thread; connections are the CM's
//! (`cm`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use softrdma_ib::{QpAttr, QpCaps, QpType};

use super::cm::{RoceListener, RoceRequest};
use super::{RoceQp, RoceQpShared, RoceShared};
use crate::Error;
use crate::connparams::{AcceptParams, ConnectionInfo, ListenParams};
use crate::provider::{
    BoxFuture, Connected, ListenOps, Provider, QpCreate, QpOps, RequestOps, Settings,
};

/// A RoCE context's provider.
impl Provider for Arc<RoceShared> {
    fn create_qp(&self, a: QpCreate<'_>) -> Result<Box<dyn QpOps>, Error> {
        let caps = QpCaps {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
            ..QpCaps::default()
        };
        let q = self.create_qp(
            a.qp_type,
            a.pd,
            caps,
            a.keys.clone(),
            [a.send_cq, a.recv_cq],
            a.srq.map(|s| s.queue.clone()),
        )?;
        let qp = RoceQp {
            drv: self.clone(),
            q,
        };
        // Connected QPs start in Init, as after `rdma_create_qp`, so receives can be posted
        // before the connection on both transports; Init → Init keeps libibverbs' explicit
        // bring-up working. UD needs its Q_Key first.
        if a.qp_type != QpType::Ud {
            qp.modify(&QpAttr::state(softrdma_ib::QpState::Init))?;
        }
        Ok(Box::new(qp))
    }

    fn listen(
        &self,
        addrs: &[SocketAddr],
        params: ListenParams,
    ) -> Result<Box<dyn ListenOps>, Error> {
        Ok(Box::new(RoceListener::bind(self, addrs, params.backlog)?))
    }

    fn settings(&self) -> Settings<'_> {
        Settings::of(&self.leader, &self.tap)
    }

    fn close(&self) {
        self.shutdown();
    }
}

impl ListenOps for RoceListener {
    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn try_accept(&self) -> Option<Box<dyn RequestOps>> {
        RoceListener::try_accept(self).map(|r| Box::new(r) as Box<dyn RequestOps>)
    }

    fn accept(&self, deadline: Option<Instant>) -> Result<Box<dyn RequestOps>, Error> {
        Ok(Box::new(RoceListener::accept(self, deadline)?))
    }

    fn accept_async(&self) -> BoxFuture<'_, Result<Box<dyn RequestOps>, Error>> {
        Box::pin(async move {
            let r = RoceListener::accept_async(self).await?;
            Ok(Box::new(r) as Box<dyn RequestOps>)
        })
    }
}

impl RoceRequest {
    /// The QP of `qp`, if it is one of this request's context.
    fn own<'a>(&self, qp: &'a dyn QpOps) -> Result<&'a Arc<RoceQpShared>, Error> {
        match qp.as_any().downcast_ref::<RoceQp>() {
            Some(rq) if Arc::ptr_eq(&rq.drv, self.driver()) => Ok(&rq.q),
            _ => Err(Error::InvalidArgument("QP of another context")),
        }
    }
}

impl RequestOps for RoceRequest {
    fn peer_addr(&self) -> SocketAddr {
        RoceRequest::peer_addr(self)
    }

    fn local_addr(&self) -> SocketAddr {
        RoceRequest::local_addr(self)
    }

    fn private_data(&self) -> &[u8] {
        RoceRequest::private_data(self)
    }

    fn peer_ird_ord(&self) -> Option<(u16, u16)> {
        Some(RoceRequest::peer_ird_ord(self))
    }

    fn accept(
        mut self: Box<Self>,
        qp: &dyn QpOps,
        params: AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        let q = self.own(qp)?;
        RoceRequest::accept(&mut self, q, &params)
    }

    fn accept_async(mut self: Box<Self>, qp: &dyn QpOps, p: AcceptParams) -> Connected<'_> {
        Box::pin(async move {
            let q = self.own(qp)?;
            RoceRequest::accept_async(&mut self, q, &p).await
        })
    }

    fn reject(mut self: Box<Self>, private_data: &[u8]) -> Result<(), Error> {
        RoceRequest::reject(&mut self, private_data)
    }
}
