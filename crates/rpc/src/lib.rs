//! ONC RPC version 2 (RFC 5531): messages, record marking, a client with many calls in
//! flight, and a server dispatching registered programs on a pool of threads — over TCP
//! today; RPC-over-RDMA (RFC 8166) plugs in as another transport.

pub mod buffers;
pub mod client;
mod drc;
pub mod msg;
pub mod payload;
pub mod rdma;
pub mod record;
mod sched;
pub mod server;
pub mod svc_tcp;
pub mod tcp;

pub use buffers::{Buffers, Bulk};
pub use client::{
    Client, ClientTransport, Connector, Incoming, OutCall, Pending, Reconnect, Reply, ReplySpace,
    ResultBinding, RpcError,
};
pub use msg::{Auth, AuthSysParams, CallHeader, ReplyHeader, ReplyStatus};
pub use payload::{ChunkError, Payload, Shared};
pub use server::{
    ArgumentBinding, CallContext, Eligible, OutReply, ProcError, Program, RdmaStats, Registry,
    Server, ServerConfig, UdpServer,
};
pub use softrdma_wire::onc_rpc::AuthStat;
pub use svc_tcp::{TcpServer, TcpStats};
