//! softrdma's verbs API: one surface over iWARP (TCP) and RoCEv2 (UDP), in user space.
//!
//! # The objects
//!
//! Names follow libibverbs and librdmacm, so a verbs user finds their way; every object is
//! the same type whatever the transport:
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
//! Work requests and completions are the engine's types ([`SendWr`], [`RecvWr`], [`Sge`],
//! [`WorkCompletion`], ...), re-exported here.
//!
//! # Choosing a transport
//!
//! The device decides: [`Device::tcp`] (iWARP: MPA, DDP and RDMAP over TCP, RFC 5040/5041/
//! 5044; any address reaches it) or a RoCEv2 device on one local address ([`Device::roce`],
//! [`Device::list`]: the InfiniBand transport over UDP port 4791). Everything after
//! [`Device::open`] is the same code. What only one transport has lives in its module:
//! [`iwarp`] (MPA negotiation, FPDU sizing, a stream's events) and [`roce`] (a device's
//! settings, address handles for UD, the InfiniBand attributes of [`Qp::modify`] for QPs
//! brought up by hand). Connection parameters have a common part and a part per transport
//! ([`ConnectParams::iwarp`], [`ConnectParams::roce`]), as [`ConnectionInfo::detail`]
//! reports what a connection agreed.
//!
//! # Connecting, posting, completing
//!
//! A [`Listener`] takes [`ConnRequest`]s; [`Qp::connect`] reaches one (iWARP: TCP and MPA;
//! RoCE: the InfiniBand CM on QP1 with librdmacm's conventions, so `rdma_cm` peers answer).
//! Posting never waits for another thread: a request is checked in the posting thread and
//! handed to its engine. Progress is caller-driven (`docs/progress.md`): a thread waiting on
//! a CQ or a completion channel runs the transport itself, and a background thread per
//! context does the work only while nobody waits.
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
//!
//! # Async
//!
//! Each call that waits for the network has a future beside it, for any runtime (the crate
//! depends on none): [`Cq::next`], [`Cq::wait_async`], [`Cq::completions`] (`poll_*`
//! methods), [`CompletionChannel::get_cq_event_async`] (or its fd under tokio's `AsyncFd`),
//! [`Context::next_async_event`], [`Listener::accept_async`], [`ConnRequest::accept_async`],
//! [`Qp::connect_async`]. They are cancel-safe; `docs/async.md` says how they make progress.
//!
//! # Observing
//!
//! [`Qp::counters`] and [`Context::counters`] count what the engines and drivers did;
//! [`Context::set_tap`] hands over every octet the transport sends and receives (the tools'
//! `--pcap`).
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
pub mod roce;
mod srq;
mod state;
mod tap;
mod tcp;

pub use cm::{ConnRequest, Listener};
pub use connparams::{
    AcceptParams, ConnectParams, ConnectionDetail, ConnectionInfo, ListenParams, QpCap,
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
pub use srq::{Srq, SrqAttr};
pub use state::{QpCounters, QpState, TransportCounters};
pub use tap::{Direction, Tap, Tapped};

/// iWARP specifics: MPA negotiation and framing (the connection parameters only iWARP
/// takes, [`FpduSize`](iwarp::FpduSize)), what a connection agreed, a stream's events and counters, and the
/// device's counters.
pub mod iwarp {
    pub use crate::connparams::iwarp::{AcceptParams, ConnectParams, ListenParams};
    pub use crate::connparams::{FALLBACK_EMSS, FpduSize, IwarpConnection};
    pub use crate::tcp::IwarpDeviceCounters;
    pub use softrdma_iwarp::rdmap::{QpEvent, StreamCounters};
    pub use softrdma_iwarp::startup::{Negotiated, PeerParams, Rtr, StartupError};
}

pub use softrdma_ib::QpType;
pub use softrdma_memory::{
    Access, AccessError, Buffer, BufferReadGuard, BufferWriteGuard, Key, KeyState, MemError,
    MrFlags, MwType, PageBuf, PdId, QpId,
};
pub use softrdma_verbs_types::{
    InlineBuf, MwBind, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
