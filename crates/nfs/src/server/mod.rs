//! The NFSv3 server side: an exported [`Backend`] served as NFS (RFC 1813) and MOUNT v3 over
//! ONC RPC, on TCP and RPC-over-RDMA with the RFC 8267 binding.

pub mod backend;
pub mod localfs;
pub mod memfs;
pub mod nfs3;
pub mod portmap;

pub use backend::{
    Attr, Backend, CreateHow, DirEntry, FileId, FileKind, FsStat, Nfs3Error, NfsTime, SetAttr,
    SetTime, Stable,
};
pub use localfs::LocalFs;
pub use memfs::MemFs;
pub use nfs3::{MAX_IO, MAX_MOUNT_ENTRIES, NfsService, NfsStats};
pub use portmap::{Mapping, PortMap, register_with_rpcbind};
