//! `softrdma perf`: bandwidth and latency of RDMA Write, RDMA Read and Send between two
//! softrdma endpoints, beside the raw socket the transport runs over (TCP for iWARP, UDP
//! for RoCEv2) measured in the same run with the same message size, reported the way
//! perftest reports them.
//!
//! The tests are written once against the verbs surface ([`client`], [`server`]): one
//! connection of the connection manager per test, on either transport; `--transport` only
//! picks the device and the raw baseline ([`tcp`], [`udp`]). `--loopback` runs a server and
//! a client in one process over 127.0.0.1 (RoCE: the server on 127.0.0.1, the client on
//! 127.0.0.2); `--server` and `HOST` run them on two machines.
//!
//! perftest interop: `--server --perftest` serves perftest's own clients over rdma_cm
//! (`ib_write_bw -R` and friends, iWARP), see [`perftest_server`]; `--transport roce
//! --perftest HOST` is the client of perftest's `ib_write_bw`-style servers over their own
//! TCP exchange, see [`perftest_client`].
//!
//! Here: the errors. `args.rs` holds the command line and what it selects, `report.rs` the
//! rows and their text and JSON, `run.rs` the runs that measure them.

mod args;
mod client;
pub mod perftest_client;
pub mod perftest_cm_client;
pub mod perftest_server;
pub mod plot;
pub mod proto;
pub mod raw;
mod report;
mod run;
pub mod scale;
mod server;
pub mod stats;
pub mod tcp;
pub mod udp;

use std::time::Duration;

use softrdma::MemError;

pub use self::client::{Client, ClientOpts};
pub use self::perftest_client::{PerftestResult, PerftestTest, perftest_client};
pub use self::server::{ServerOpts, serve};
pub use crate::verbs_util::TransportArg as Transport;

pub use self::args::*;
pub use self::report::*;
pub use self::run::*;

/// Errors of `softrdma perf`.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// A verbs call failed.
    #[error("{0}")]
    Verbs(#[from] softrdma::Error),
    /// A registered-memory access failed.
    #[error("memory: {0}")]
    Mem(#[from] MemError),
    /// A socket call failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer did not follow the protocol.
    #[error("{0}")]
    Protocol(String),
    /// A work request completed in error.
    #[error("{0}")]
    Completion(String),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
    /// What was being done when `source` happened (an address, a port, a file).
    #[error("{what}: {source}")]
    At {
        what: String,
        source: Box<PerfError>,
    },
    /// The server refused the test (too large, past its memory budget, busy).
    #[error("rejected by the server: {0}")]
    Refused(proto::Refusal),
    /// A server's test whose client sent nothing for this long: given up.
    #[error("no traffic from the client for {0:?}: the server reclaimed the test")]
    Idle(Duration),
    /// Interrupted (SIGINT) after the rows reported.
    #[error("interrupted")]
    Interrupted,
    /// A file the run writes.
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
}

impl PerfError {
    /// A failed connect: a rejection whose private data is the server's reason in words
    /// (a softrdma perf server's: busy, a size above its cap) says it.
    pub fn connecting(e: softrdma::Error) -> PerfError {
        if let softrdma::Error::Rejected { private_data, .. } = &e
            && let Some(why) = proto::Refusal::parse(private_data)
        {
            return PerfError::Refused(why);
        }
        // RoCE's REJ pads its private data with zeros to 148 octets.
        if let softrdma::Error::Rejected { private_data, .. } = &e
            && let Ok(text) = std::str::from_utf8(private_data)
            && let text = text.trim_end_matches('\0')
            && !text.is_empty()
            && !text.contains(|c: char| c.is_control())
        {
            let text = text.strip_prefix("softrdma perf: ").unwrap_or(text);
            return PerfError::Protocol(format!("rejected by the server: {text}"));
        }
        PerfError::Verbs(e)
    }

    /// This error, said to have happened while doing `what`.
    pub fn at(self, what: impl Into<String>) -> PerfError {
        PerfError::At {
            what: what.into(),
            source: Box::new(self),
        }
    }
}
