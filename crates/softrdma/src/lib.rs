//! softrdma's verbs API: one surface over iWARP (TCP) and RoCEv2 (UDP).
//!
//! Names follow libibverbs and librdmacm, so a verbs user finds their way:
//!
//! ```text
//! Device::list() / Context::open()      ibv_get_device_list / ibv_open_device
//! Context::alloc_pd()                   ibv_alloc_pd
//! Pd::reg_mr / alloc_mr / reg_mr_with   ibv_reg_mr          Mr::lkey() / rkey() = STag
//! Pd::alloc_mw, Mw::bind                ibv_alloc_mw / ibv_bind_mw (types 1, 2A, 2B)
//! SendWr::bind_mw / local_inv           IBV_WR_BIND_MW / IBV_WR_LOCAL_INV (in SQ order)
//! Context::create_comp_channel          ibv_create_comp_channel (a pollable fd)
//! Context::create_cq, Cq::poll          ibv_create_cq / ibv_poll_cq / ibv_req_notify_cq
//! Pd::create_qp, Qp::post_send / recv   ibv_create_qp / ibv_post_send / ibv_post_recv
//! Pd::create_srq, Srq::post_recv        ibv_create_srq / ibv_post_srq_recv
//! Qp::connect, Listener, ConnRequest    rdma_connect / rdma_listen / rdma_accept / rdma_reject
//! Qp::disconnect                        rdma_disconnect
//! ```
//!
//! Async: each call that waits for the network has a future beside it, for any runtime
//! (the crate depends on none): [`Cq::next`], [`Cq::wait_async`], [`Cq::completions`] (`poll_*` methods),
//! [`CompletionChannel::get_cq_event_async`] (or its fd under tokio's `AsyncFd`),
//! [`Context::next_async_event`], [`Listener::accept_async`], [`ConnRequest::accept_async`],
//! [`Qp::connect_async`]. They are cancel-safe; `docs/async.md` says how they make progress.
//!
//! Work requests and completions are the engine's types ([`SendWr`], [`RecvWr`], [`Sge`],
//! [`WorkCompletion`], ...), re-exported here.
//!
//! The device decides the transport: [`Device::tcp`] (iWARP) or a RoCEv2 device
//! ([`Device::roce`], [`Device::list`]); everything after [`Device::open`] is the same code.
//! Progress is caller-driven (`docs/progress.md`): a thread waiting on a CQ or a completion
//! channel runs the transport itself, posts transmit in the posting thread, and a background
//! thread per context does the work only while nobody waits. iWARP connections use
//! `TCP_NODELAY` and FPDUs no larger than the path MSS by default ([`FpduSize`]).
//!
//! ```no_run
//! use softrdma::*;
//! # fn main() -> Result<(), Error> {
//! let ctx = Context::open()?;
//! let pd = ctx.alloc_pd();
//! let ch = ctx.create_comp_channel()?;
//! let cq = ctx.create_cq(256, Some(&ch))?;
//! let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
//! let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
//! qp.connect("127.0.0.1:7174", ConnectParams::default())?; // an iWARP peer (rping's port)
//! mr.copy_in(0, b"hello")?;
//! qp.post_send(SendWr::send(1, vec![mr.sge(0, 5)]))?;
//! let mut wcs = Vec::new();
//! cq.wait(1, 16, std::time::Duration::from_secs(5), &mut wcs)?;
//! assert_eq!(wcs[0].status, WcStatus::Success);
//! # Ok(()) }
//! ```
// `unsafe` only in `roce::mmsg` (recvmmsg headers nix cannot reuse).
#![deny(unsafe_code)]
#![warn(missing_docs)]

// Floors, top-down: the API (device, mr, qp, cm) over the transport drivers (tcp, roce)
// over what every layer shares (backlog, connparams, cq, srq, event, state, leader, net, tap, error); no module imports one above.
mod backlog;
mod cm;
mod connparams;
mod cq;
mod device;
mod error;
mod event;
mod leader;
mod mr;
mod net;
mod provider;
mod qp;
mod roce;
mod srq;
mod state;
mod tap;
mod tcp;

pub use cm::{ConnRequest, Listener};
pub use connparams::{
    AcceptParams, ConnectParams, ConnectionDetail, ConnectionInfo, DEFAULT_ROCE_PMTU,
    FALLBACK_EMSS, FpduSize, IwarpConnection, ListenParams, QpCap,
};
pub use cq::{
    BusyPoll, CompletionChannel, Completions, Cq, DEFAULT_BACKGROUND_POLL, DEFAULT_BUSY_POLL,
    DEFAULT_POLL_BACKOFF, PollBackoff,
};
pub use device::{Context, Device, DeviceCounters, DeviceLimits, Pd, TCP_DEVICE_NAME, Transport};
pub use error::Error;
pub use event::AsyncEvent;
pub use mr::{Mr, MrAttr, Mw};
pub use net::spare_ports;
pub use qp::{Qp, QpInitAttr};
pub use roce::cm::RDMA_UDP_QKEY;
pub use roce::{Ah, RawTx, RoceConfig, RoceCounters, gid_from_ip, gid_to_ip};
pub use srq::{Srq, SrqAttr};
pub use state::{QpCounters, QpState, TransportCounters};
pub use tap::{Direction, Tap, Tapped};
pub use tcp::IwarpDeviceCounters;
/// InfiniBand attributes of RoCE QPs (`ibv_qp_attr` for [`Qp::modify`], whose `state` is
/// the InfiniBand subset of [`QpState`], comparable with it) and the engine's own counters.
pub mod ib {
    pub use softrdma_ib::{
        HeaderCounters, ModifyError, QpAttr, QpState, QpType, RequesterCounters, ResponderCounters,
    };
}

pub use softrdma_ib::QpType;
pub use softrdma_iwarp::rdmap::{QpEvent, StreamCounters};
pub use softrdma_iwarp::startup::{Negotiated, PeerParams, Rtr, StartupError};
pub use softrdma_memory::{
    Access, AccessError, Buffer, BufferReadGuard, BufferWriteGuard, Key, KeyState, MemError,
    MrFlags, MwType, PageBuf, PdId, QpId,
};
pub use softrdma_verbs_types::{
    InlineBuf, MwBind, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
