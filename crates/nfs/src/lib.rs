//! NFSv3 and MOUNT v3 (RFC 1813) on `softrdma-rpc`: a client over TCP or RPC-over-RDMA with
//! the NFS Upper-Layer Binding of RFC 8267 (READ and WRITE data DDP-eligible).

pub mod client;
pub mod names;
pub mod proto;
pub mod server;

pub use client::{Error, Nfs3, NfsConfig, Proto, getport};
pub use proto::{DirEntry, Fattr, FileType, NfsError};
