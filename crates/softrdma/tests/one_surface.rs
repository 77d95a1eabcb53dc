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

#[test]
fn the_same_application_runs_over_iwarp() {
    let (server, client) = app::loopback_devices(Transport::Iwarp);
    for size in [1, 4096, 1 << 20] {
        let r = app::run(&server, &client, bind(), size).unwrap();
        assert_eq!((r.sent, r.written, r.read), (size, size, size));
    }
}

#[test]
fn the_same_application_runs_over_roce() {
    let (server, client) = app::loopback_devices(Transport::Roce);
    for size in [1, 4096, 1 << 20] {
        let r = app::run(&server, &client, bind(), size).unwrap();
        assert_eq!((r.sent, r.written, r.read), (size, size, size));
    }
}
