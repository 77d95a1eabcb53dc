//! ONC RPC version 2 (RFC 5531): messages, record marking, a client with many calls in
//! flight, and a server dispatching registered programs on a pool of threads — over TCP
//! today; RPC-over-RDMA (RFC 8166) plugs in as another transport.

pub mod client;
pub mod msg;
pub mod record;
pub mod server;
pub mod tcp;

pub use client::{Client, ClientTransport, Pending, Reply, RpcError};
pub use msg::{Auth, AuthSysParams, CallHeader, ReplyHeader, ReplyStatus};
pub use server::{CallContext, ProcError, Program, Registry, Server, ServerConfig, TcpServer};
pub use softrdma_wire::onc_rpc::AuthStat;
