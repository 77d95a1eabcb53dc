//! Sans-IO InfiniBand transport engine (IBA Vol. 1 ch. 9), in the roles of the
//! spec and Linux rxe: requester, responder, completer (see `DESIGN.md`).
//!
//! So far: the RC [`responder`] of one QP.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod responder;

pub use responder::{Responder, ResponderConfig, ResponderCounters};
pub use softrdma_iwarp::verbs_types::{PostError, RecvWr, Sge, WcStatus};
pub use softrdma_iwarp::verbs_types::{WcFlags, WcOpcode, WorkCompletion};
