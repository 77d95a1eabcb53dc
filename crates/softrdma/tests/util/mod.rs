//! What the integration tests share: devices over loopback, the safety-net timeout and
//! waiting for completions. Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::LazyLock;
use std::time::Duration;

use softrdma::{Cq, Device, RoceConfig, Transport, WorkCompletion};

/// Safety net for every blocking wait, never a synchronisation: 60 s, or
/// `SOFTRDMA_TEST_TIMEOUT` seconds (runs under valgrind are ~50 times slower).
pub static TIMEOUT: LazyLock<Duration> = LazyLock::new(|| {
    let secs = std::env::var("SOFTRDMA_TEST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
});

/// Both transports, for tests that run the same steps over each.
pub const BOTH: [Transport; 2] = [Transport::Iwarp, Transport::Roce];

/// A server's and a client's device over loopback: two iWARP devices, or RoCEv2 on
/// 127.0.0.1 and 127.0.0.2 sharing one ephemeral UDP port (RoCE peers are sent to at the
/// sender's own port).
pub fn devices(t: Transport) -> (Device, Device) {
    match t {
        Transport::Iwarp => (Device::tcp(), Device::tcp()),
        Transport::Roce => {
            let ips = [1, 2].map(|l| IpAddr::V4(Ipv4Addr::new(127, 0, 0, l)));
            let c = RoceConfig::sharing_a_port(&ips).unwrap();
            (Device::roce(c[0]), Device::roce(c[1]))
        }
    }
}

/// Blocks until `n` completions came to `cq`; panics with those that did at the timeout.
pub fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    cq.wait(n, n, *TIMEOUT, &mut out)
        .unwrap_or_else(|e| panic!("waiting for {n} completions, got {out:?}: {e}"));
    out
}
