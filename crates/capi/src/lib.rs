//! softrdma behind rdma-core's C ABI: one shared object that is both `libibverbs.so.1` and
//! `librdmacm.so.1` (rdma-core 44's symbols, each at its version node; `build.rs`), so that
//! unmodified C programs run on softrdma (`softrdma run`), with no kernel module.
//!
//! Every exported function is `sr_<name>`, which the linker aliases to `<name>` at its
//! node. Handles are Rust objects with rdma-core's struct first (`#[repr(C)]`), so the
//! pointer a program holds is the object's.
//!
//! What rdma-core's functions promise (return values, `errno`) is in their man pages; the
//! `unsafe extern "C"` functions here trust the program for what C cannot check (that a
//! pointer is one we handed out, or points at as much memory as its type says), and check
//! everything else.

#![allow(clippy::missing_safety_doc)]

pub mod addrinfo;
pub mod ah;
mod async_events;
pub mod cm;
pub mod context;
pub mod cq;
pub mod device;
pub mod env;
mod errno;
pub mod list;
mod live;
pub mod mw;
mod ops;
pub mod pd;
pub mod qp;
pub mod srq;
mod stop;
mod strs;
mod stubs;
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
pub mod sys;
pub mod sysfs;
mod wr;
