//! softrdma command-line tools, as a library so tests can drive them.

pub mod counters;
pub mod decode;
pub mod nfs;
pub mod nfsd;
pub mod pcap_out;
pub mod perf;
pub mod pingpong;
pub mod rpcbench;
pub mod rping;
pub mod run;
pub mod udaddy;
pub mod verbs_util;
