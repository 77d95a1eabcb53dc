//! The async API from tokio (issue 13): a completion channel's fd under tokio's `AsyncFd`
//! (readable → `try_get_cq_event` → poll → re-arm, no lost wake-up), connection events
//! as futures, and `connect_async` failures. Each over iWARP and RoCEv2.
//!
//! Timeouts are safety nets only: a lost wake-up shows as one expiring.

mod util;

use std::net::SocketAddr;
use std::time::Duration;

use softrdma::*;
use tokio::io::unix::AsyncFd;
use tokio::time::timeout;
use util::{BOTH, Pair, Setup, Side, setup};

const LIMIT: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {LIMIT:?}"))
}

/// Both sides, not connected: CQs of 256 entries, a 64 KiB region each.
fn sides(t: Transport) -> Setup {
    setup(t).cqe(256)
}

/// Connects `client` to a listener of `server`, both through the async connection manager,
/// in one task (neither call blocks the thread).
async fn connect(t: Transport, server: &Side, client: &Side) {
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let to = listener.local_addr();
    let accept = async {
        let req = listener.accept_async().await.unwrap();
        assert_eq!(req.private_data().first(), Some(&7), "{t:?}");
        req.accept_async(server.qp(), AcceptParams::default())
            .await
            .unwrap()
    };
    let params = ConnectParams {
        private_data: vec![7],
        ..ConnectParams::default()
    };
    let (_, c) = within("connect", async {
        tokio::join!(accept, client.qp().connect_async(to, params))
    })
    .await;
    c.unwrap();
    assert_eq!(
        (server.qp().state(), client.qp().state()),
        (QpState::Rts, QpState::Rts),
        "{t:?}"
    );
}

/// The channel's fd under `AsyncFd`: the receiver sleeps in the runtime's epoll; each
/// readiness is drained with `try_get_cq_event`, the CQ polled, re-armed and polled again
/// (a completion that came between the poll and the arming would raise no event). Every
/// message arrives, in order, whatever the interleaving with the sender's bursts.
#[tokio::test(flavor = "current_thread")]
async fn completion_channel_fd_under_tokio_asyncfd() {
    const N: usize = 300;
    const MSG: usize = 64;
    const WINDOW: usize = 32;
    for t in BOTH {
        let Pair { server, client, .. } = sides(t).channel().open();
        let ch = server.ch.clone().unwrap();
        for i in 0..WINDOW as u64 {
            server.post_recv(RecvWr::new(
                i,
                vec![server.mr.sge(i as usize * MSG, MSG as u32)],
            ));
        }
        connect(t, &server, &client).await;
        server.cq.req_notify(false);
        // SAFETY: the fd is the channel's pipe, which the clone owned by the `AsyncFd` keeps
        // open and never changes (see `CompletionChannel`'s `AsFd`).
        let fd = unsafe { AsyncFd::register(ch.clone()) }.unwrap();
        // The receiver's count, for the sender.
        let (received, mut seen) = tokio::sync::watch::channel(0usize);
        let sender = async {
            // Bursts of 1 to 7 messages, each burst's sends completed before the next.
            let (mut sent, mut burst) = (0, 1);
            while sent < N {
                let n = burst.min(N - sent);
                // Everything sent is received first: a completion the receiver missed
                // would stop the exchange (and the test, at its time limit).
                seen.wait_for(|&r| r == sent).await.unwrap();
                for k in sent..sent + n {
                    let off = (k % WINDOW) * MSG;
                    client.mr.copy_in(off, &[k as u8; MSG]).unwrap();
                    client.post_send(SendWr::send(k as u64, vec![client.mr.sge(off, MSG as u32)]));
                }
                let mut wcs = Vec::new();
                client.cq.wait_async(n, n, &mut wcs).await;
                assert!(
                    wcs.iter().all(|w| w.status == WcStatus::Success),
                    "{t:?} {wcs:?}"
                );
                sent += n;
                burst = burst % 7 + 1;
            }
        };
        let receiver = async {
            let mut got = Vec::new();
            let mut wcs = Vec::new();
            let mut rounds = 0u32;
            while got.len() < N {
                let mut guard = fd.readable().await.unwrap();
                while let Some(cq) = ch.try_get_cq_event() {
                    assert_eq!(cq, server.cq);
                    loop {
                        wcs.clear();
                        cq.poll(64, &mut wcs);
                        if wcs.is_empty() {
                            // Widen the race now and then: the sender runs between the
                            // last poll and the arming.
                            rounds += 1;
                            if rounds.is_multiple_of(2) && got.len() < N {
                                // The sender has what was sent received: it sends more.
                                cq.ready().await;
                            }
                            // Re-arm, then look once more: what came before the arming
                            // raises no event.
                            cq.req_notify(false);
                            cq.poll(64, &mut wcs);
                            if wcs.is_empty() {
                                break;
                            }
                        }
                        for w in &wcs {
                            assert_eq!((w.status, w.opcode), (WcStatus::Success, WcOpcode::Recv));
                            let off = w.wr_id as usize * MSG;
                            let data = server.mr.to_vec()[off..off + MSG].to_vec();
                            got.push(data[0]);
                            assert_eq!(data, [data[0]; MSG], "{t:?}");
                            received.send_modify(|r| *r += 1);
                            server.post_recv(RecvWr::new(
                                w.wr_id,
                                vec![server.mr.sge(off, MSG as u32)],
                            ));
                        }
                    }
                }
                // Cleared only if nothing became ready since `readable()` returned.
                guard.clear_ready();
            }
            got
        };
        let ((), got) = within("AsyncFd receiver", async { tokio::join!(sender, receiver) }).await;
        assert_eq!(got, (0..N).map(|k| k as u8).collect::<Vec<_>>(), "{t:?}");
    }
}

/// `Established` and `Disconnected` reach a task awaiting the context's events.
#[tokio::test(flavor = "current_thread")]
async fn connection_events_as_futures() {
    for t in BOTH {
        let Pair { server, client, .. } = sides(t).open();
        connect(t, &server, &client).await;
        let qp_num = server.qp().qp_num();
        assert_eq!(
            within("Established", server.ctx.next_async_event()).await,
            AsyncEvent::Established { qp_num },
            "{t:?}"
        );
        client.qp().disconnect().unwrap();
        let ev = within("Disconnected", async {
            loop {
                match server.ctx.next_async_event().await {
                    // iWARP may report the stream's end first.
                    AsyncEvent::Qp { .. } => continue,
                    ev => break ev,
                }
            }
        })
        .await;
        assert_eq!(ev, AsyncEvent::Disconnected { qp_num }, "{t:?}");
    }
}

/// A refused `connect_async` returns the error and leaves the QP ready for another try,
/// which succeeds.
#[tokio::test(flavor = "current_thread")]
async fn connect_async_refused_then_retried() {
    for t in BOTH {
        let Pair { server, client, .. } = sides(t).open();
        // A port nobody listens on: TCP refuses (iWARP), the CM rejects (RoCE).
        let nobody: SocketAddr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let r = within(
            "refused connect",
            client.qp().connect_async(nobody, ConnectParams::default()),
        )
        .await;
        match (t, r) {
            (Transport::Iwarp, Err(Error::Io(e))) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused)
            }
            (Transport::Roce, Err(Error::Rejected { .. })) => {}
            (_, other) => panic!("{t:?}: {other:?}"),
        }
        assert_eq!(client.qp().state(), QpState::Init, "{t:?}");
        connect(t, &server, &client).await;
    }
}
