//! Issue 8, Done-when 1: the application in `examples/one_surface.rs`, written once against
//! the public API, runs RC Send, Write and Read over iWARP and over RoCEv2; only the devices
//! it opens differ. The connection manager is the same calls on both.

#[path = "../examples/one_surface.rs"]
mod app;

use std::net::SocketAddr;

use softrdma::Transport;

fn bind() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// 1 MiB normally; 64 KiB when `SOFTRDMA_TEST_SMALL` is set (under valgrind, where RoCE's
/// real-time ACK timer would expire while the emulated CPU crawls).
fn sizes() -> [usize; 3] {
    let big = if std::env::var_os("SOFTRDMA_TEST_SMALL").is_some() {
        64 << 10
    } else {
        1 << 20
    };
    [1, 4096, big]
}

#[test]
fn the_same_application_runs_over_iwarp() {
    let (server, client) = app::loopback_devices(Transport::Iwarp);
    for size in sizes() {
        let r = app::run(&server, &client, bind(), size).unwrap();
        assert_eq!((r.sent, r.written, r.read), (size, size, size));
    }
}

#[test]
fn the_same_application_runs_over_roce() {
    let (server, client) = app::loopback_devices(Transport::Roce);
    for size in sizes() {
        let r = app::run(&server, &client, bind(), size).unwrap();
        assert_eq!((r.sent, r.written, r.read), (size, size, size));
    }
}
