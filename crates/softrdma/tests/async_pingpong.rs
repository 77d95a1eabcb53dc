//! Issue 13, Done-when 3: the async example (`examples/async_pingpong.rs`, tokio) runs its
//! ping-pong over iWARP and over RoCEv2, every byte of every message and of the RDMA Write
//! checked by the example itself (any difference is an error here).
//!
//! On a single-threaded runtime: a call that blocked the thread would stall the peer task
//! and the run would not finish.

#[path = "../examples/async_pingpong.rs"]
mod app;

use softrdma::Transport;

async fn ping_pong(t: Transport) {
    let (server, client) = app::loopback_devices(t);
    for (count, size) in [(200, 1), (50, 4096), (5, 256 << 10)] {
        let r = app::run(&server, &client, count, size)
            .await
            .unwrap_or_else(|e| panic!("{t:?}, {count} × {size} octets: {e}"));
        assert_eq!(
            (r.round_trips, r.octets, r.written),
            (count, count * size, size),
            "{t:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn async_ping_pong_over_iwarp() {
    ping_pong(Transport::Iwarp).await;
}

#[tokio::test(flavor = "current_thread")]
async fn async_ping_pong_over_roce() {
    ping_pong(Transport::Roce).await;
}

/// The same on a multi-threaded runtime (the tasks' futures are `Send`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_ping_pong_on_a_thread_pool() {
    ping_pong(Transport::Iwarp).await;
    ping_pong(Transport::Roce).await;
}
