//! What the RPC-over-RDMA integration tests share: the two RDMA transports over loopback,
//! a data pattern and raw call messages.

#![allow(dead_code)] // each test file uses a part

use std::net::{IpAddr, Ipv4Addr};

use softrdma::{Context, Device};
use softrdma_rpc::msg::encode_call;
use softrdma_rpc::{Auth, CallHeader};

/// An RDMA transport under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum T {
    Iwarp,
    Roce,
}

/// Runs `f` on each transport.
pub fn both(f: impl Fn(T)) {
    for t in [T::Iwarp, T::Roce] {
        f(t);
    }
}

/// (server side, client side) devices on loopback: RoCE on 127.0.0.1 and 127.0.0.2.
pub fn contexts(t: T) -> (Context, Context) {
    match t {
        T::Iwarp => (Device::tcp().open().unwrap(), Device::tcp().open().unwrap()),
        T::Roce => {
            let [a, b] = roce_pair();
            (a, b)
        }
    }
}

/// RoCEv2 devices on 127.0.0.1 and 127.0.0.2, one free UDP port.
pub fn roce_pair() -> [Context; 2] {
    let ips = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)].map(IpAddr::V4);
    let cfgs = ips.map(softrdma::roce::RoceConfig::new);
    let [a, b]: [Context; 2] = Device::open_sharing_a_port(&cfgs)
        .unwrap()
        .try_into()
        .unwrap_or_else(|_| unreachable!());
    [a, b]
}

/// An RPC call message of `prog` version 1, AUTH_NONE.
pub fn call_msg(prog: u32, xid: u32, proc: u32, args: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    let h = CallHeader {
        xid,
        prog,
        vers: 1,
        proc,
        cred: Auth::None,
        verf: Auth::None,
    };
    encode_call(&h, args, &mut m).unwrap();
    m
}

/// A figure of this process's `/proc/self/status` (`VmRSS:` in KiB, `Threads:`).
pub fn proc_status(key: &str) -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}
