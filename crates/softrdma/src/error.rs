//! The verbs layer's error type.

use std::io;

use softrdma_iwarp::startup::StartupError;
use softrdma_memory::MemError;
use softrdma_verbs_types::PostError;

use crate::state::QpState;

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
    /// The responder rejected the connection (MPA Reply with R=1, MPA-71).
    #[error("connection rejected by the peer ({} octets of private data)", private_data.len())]
    Rejected {
        /// The Reply's private data (may say why).
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
}
