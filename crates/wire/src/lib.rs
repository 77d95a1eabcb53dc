//! Wire codecs for every header and frame softrdma speaks.
//!
//! Layout follows smoltcp's `wire` module: for each header a checked view over
//! bytes (`Header::new_checked(&[u8])`, getters and setters named as the spec
//! names the fields) and a plain `Repr` struct with `parse` and `emit`.
//!
//! Contract, for every header in this crate:
//! * after `new_checked` succeeds no accessor panics;
//! * `Repr::parse` never panics, on any input;
//! * `Repr::emit` never panics into a buffer of at least `buffer_len()` octets
//!   and returns an error (never panics) into a shorter one;
//! * no allocation on the parse or emit path.
//!
//! No state and no IO live here: engines and drivers sit above.

#![forbid(unsafe_code)]

pub mod error;
pub(crate) mod field;
pub(crate) mod macros;

pub mod ddp;
pub mod ib;
pub mod icrc;
pub mod mpa;
pub mod onc_rpc;
pub mod rdmap;
pub mod rocev2;
pub mod rpcrdma;
#[cfg(any(test, feature = "test-vectors"))]
pub mod vectors;
pub mod xdr;

pub use error::{Error, Layer, Result};
