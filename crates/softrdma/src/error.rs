//! The verbs layer's error type.

use std::io;

use softrdma_iwarp::startup::StartupError;
use softrdma_memory::MemError;
use softrdma_verbs_types::PostError;

use crate::state::QpState;

/// What an IB CM REJ reason means (IBA 12.6.7.2).
pub fn ib_reject_reason(r: u16) -> &'static str {
    match r {
        1 => "no QP available",
        3 => "no resources",
        4 => "timeout",
        6 => "invalid communication ID",
        8 => "nobody listens on that port (invalid service ID)",
        9 => "invalid transport service type",
        10 => "stale connection",
        12 => "invalid GID",
        26 => "invalid path MTU",
        28 => "rejected by the application",
        _ => "see IBA table 112",
    }
}

/// Errors of the verbs API and the TCP driver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A work request was refused at post time; nothing was queued.
    #[error(transparent)]
    Post(#[from] PostError),
    /// A memory registration or window operation failed.
    #[error("memory: {0}")]
    Mem(#[from] MemError),
    /// A socket call failed.
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    /// MPA negotiation failed (RFC 5044 §7.1, RFC 6581).
    #[error("MPA startup: {0}")]
    Startup(#[from] StartupError),
    /// The responder rejected the connection (iWARP: MPA Reply with R=1, MPA-71; RoCE:
    /// the IB CM's REJ, or a SIDR_REP whose status is not "valid").
    #[error("connection rejected by the peer{}", match reason {
        Some(r) => format!(" (reason {r}: {})", ib_reject_reason(*r)),
        None => String::new(),
    })]
    Rejected {
        /// RoCE: the REJ's reason (IBA 12.6.7.2; 8: nobody listens on the port, 28: the
        /// application rejected) or the SIDR_REP's status; iWARP: `None`.
        reason: Option<u16>,
        /// The private data of the reject (may say why).
        private_data: Vec<u8>,
    },
    /// A blocking call did not finish in time.
    #[error("timed out")]
    Timeout,
    /// The QP is not in a state that allows the call.
    #[error("not possible in QP state {0:?}")]
    InvalidState(QpState),
    /// A parameter the verbs layer cannot use.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Receive requests go to the QP's shared receive queue, not to the QP.
    #[error("the QP takes its receive buffers from a shared receive queue")]
    SrqAttached,
    /// `modify_qp` refused the transition or an attribute (InfiniBand QPs).
    #[error("modify_qp: {0}")]
    Modify(#[from] softrdma_ib::ModifyError),
    /// A connection-setup message from the peer was malformed.
    #[error("connection setup: {0}")]
    Protocol(&'static str),
    /// The transport or QP type cannot do this (what, in words).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// The context's progress thread is gone.
    #[error("the device context was closed")]
    ContextClosed,
    /// A limit of the device ([`crate::DeviceLimits`]) is reached; nothing was created.
    #[error("{what}: the device's limit of {limit} is reached")]
    ResourceLimit {
        /// What ran out.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
}
