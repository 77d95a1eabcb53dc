//! Sans-IO InfiniBand transport engine (IBA Vol. 1 ch. 9), in the roles of the
//! spec and Linux rxe: requester and completer ([`requester`]), responder
//! ([`responder`]), tied together with the QP state machine and the header
//! validation pipeline in [`qp`] (see `DESIGN.md`). RC, UC and UD. [`endpoint`] is the RoCEv2
//! endpoint between a UDP socket and the QPs: ICRC, demultiplexing, encapsulation. QPs may
//! share a receive queue ([`SharedRecvQueue`], [`IbQp::new_with_srq`]). [`cm`] is the IB
//! connection manager, [`rdma_cm`] librdmacm's conventions on top of it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod endpoint;
pub mod qp;
pub mod rdma_cm;
mod reorder;
pub mod requester;
pub mod responder;

pub use endpoint::{
    DropReason, EndpointCounters, EndpointError, Incoming, RoceEndpoint, SocketKind, Transmit,
    TxError,
};
pub use qp::{
    ACK_WAITS_PACKETS, CreateError, HeaderCounters, IbQp, ModifyError, QpAttr, QpCaps, QpState,
    QpType, pkey_matches,
};
pub use requester::{Requester, RequesterConfig, RequesterCounters, Tx};
pub use responder::{Responder, ResponderConfig, ResponderCounters};
pub use softrdma_verbs_types::{
    MwBind, PostError, RecvWr, SendFlags, SendWr, Sge, SharedRecvQueue, SrqLimitError, UdDest,
    WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
