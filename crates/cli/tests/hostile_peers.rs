//! Issue 14's findings against the tools' servers: a peer that connects and then idles, a
//! request for a huge buffer, an out-of-band message sent half. None may stop the server
//! for others or make it allocate what it was asked without a limit.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use softrdma::roce::RoceConfig;
use softrdma::{ConnectParams, Context, Device, Error, QpInitAttr};
use softrdma_cli::perf::proto::{Request, Test};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
/// Safety net: a hung server fails the test instead of hanging it.
const SAFETY: Duration = Duration::from_secs(60);

/// Kills `child` unless told to stand down first.
fn watchdog(pid: u32) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx.recv_timeout(SAFETY).is_err() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    });
    tx
}

/// `perf --server` on free ports, once it says it serves.
fn perf_server(extra: &[&str]) -> (Child, String) {
    let port = common::free_ports().to_string();
    let mut server = Command::new(BIN)
        .args(["perf", "--server", "-B", "127.0.0.1", "-p", &port])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving on") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "the server exited");
    }
    std::thread::spawn(move || for _ in err.lines() {});
    (server, port)
}

fn client_run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("perf")
        .args(args)
        .args([
            "-n",
            "20",
            "-s",
            "4096",
            "--op",
            "write",
            "--connect-timeout",
            "10",
        ])
        .output()
        .unwrap()
}

/// Peers that complete connection setup with a valid test request and then send nothing
/// hold their connections, not the server: a client runs its tests meanwhile (iWARP, a few
/// idle peers from its own address); one address gets at most 16 tests at once, the 17th
/// refused as busy, and a client from another address is still served (RoCE, where a
/// context has an address of its own).
#[test]
fn idle_peers_do_not_stop_the_perf_server() {
    // iWARP.
    let (mut server, port) = perf_server(&[]);
    let dog = watchdog(server.id());
    let ctx = Context::open().unwrap();
    let idle = idle_tests(&ctx, &format!("127.0.0.1:{port}"), 4);
    let out = client_run(&["127.0.0.1", "-p", &port]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(idle);
    let _ = server.kill();
    let _ = server.wait();
    let _ = dog.send(());

    // RoCE: three contexts on one UDP port, 127.0.0.1 (server), .3 (client), .4 (idle).
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let roce_port = udp.local_addr().unwrap().port().to_string();
    drop(udp);
    let (mut server, port) = perf_server(&["--transport", "roce", "--roce-port", &roce_port]);
    let dog = watchdog(server.id());
    let mut cfg = RoceConfig::new("127.0.0.4".parse().unwrap());
    cfg.port = roce_port.parse().unwrap();
    let ctx = Device::roce(cfg).open().unwrap();
    let target = format!("127.0.0.1:{port}");
    let idle = idle_tests(&ctx, &target, 16);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4, None).unwrap();
    let one_more = pd.create_qp(QpInitAttr::new(&cq, &cq)).unwrap();
    match one_more.connect(target.as_str(), idle_request()) {
        Err(Error::Rejected { private_data, .. }) => {
            let why = String::from_utf8_lossy(&private_data);
            assert!(why.contains("busy"), "{why}");
        }
        other => panic!("the 17th test of one address: {other:?}"),
    }
    let out = client_run(&[
        "--transport",
        "roce",
        "127.0.0.1",
        "-p",
        &port,
        "-B",
        "127.0.0.3",
        "--roce-port",
        &roce_port,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(idle);
    let _ = server.kill();
    let _ = server.wait();
    let _ = dog.send(());
}

/// A valid Write bandwidth request, whose client then never writes.
fn idle_request() -> ConnectParams {
    let req = Request {
        size: 4096,
        ..Request::new(Test::WriteBw)
    };
    ConnectParams {
        private_data: req.emit(),
        ..ConnectParams::default()
    }
}

/// `n` connected QPs of `ctx` that never do anything.
fn idle_tests(ctx: &Context, target: &str, n: usize) -> Vec<softrdma::Qp> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None).unwrap();
    (0..n)
        .map(|_| {
            let qp = pd.create_qp(QpInitAttr::new(&cq, &cq)).unwrap();
            qp.connect(target, idle_request()).unwrap();
            qp
        })
        .collect()
}

/// A request for a buffer above the server's `--max-buffer` is refused with the reason in
/// the reject (nothing allocated), and the server goes on serving.
#[test]
fn a_request_above_the_buffer_cap_is_refused() {
    let (mut server, port) = perf_server(&["--max-buffer", "1048576"]);
    let dog = watchdog(server.id());
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    for (test, size) in [(Test::WriteBw, u32::MAX), (Test::SendBw, 2 << 20)] {
        let qp = pd.create_qp(QpInitAttr::new(&cq, &cq)).unwrap();
        let req = Request {
            size,
            rx_depth: 64,
            ..Request::new(test)
        };
        let r = qp.connect(
            format!("127.0.0.1:{port}"),
            ConnectParams {
                private_data: req.emit(),
                ..ConnectParams::default()
            },
        );
        match r {
            Err(Error::Rejected { private_data, .. }) => {
                let why = String::from_utf8_lossy(&private_data);
                assert!(why.contains("1048576"), "{why}");
            }
            other => panic!("{size} octets: {other:?}"),
        }
    }
    let out = client_run(&["127.0.0.1", "-p", &port]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = server.kill();
    let _ = server.wait();
    let _ = dog.send(());
}

/// The pingpong server reads the client's address message with a deadline (`--timeout`):
/// a client that sends half of it and waits makes the server give up with an error naming
/// the exchange, not wait forever.
#[test]
fn a_half_sent_exchange_message_times_out() {
    let (mut server, port, _rest) = common::spawn_server(
        &["pingpong", "--rc", "-p", "0", "--timeout", "2"],
        "listening on ",
    );
    let dog = watchdog(server.id());
    let mut s = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    s.write_all(b"0000:000011:").unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut err).unwrap();
    let status = server.wait().unwrap();
    let _ = dog.send(());
    assert!(!status.success(), "{err}");
    assert!(err.contains("remote address"), "{err}");
    drop(s);
}

/// Issue 14: a peer killed (SIGKILL) in the middle of a stream of RDMA Writes. The QP goes
/// to Error with every outstanding request completed (flushed or failed, none lost), and a
/// new connection to a new peer works. iWARP: the kernel resets or closes the TCP
/// connection; RoCE: nothing more is heard, the ACK timer runs out of retries.
#[test]
fn a_peer_killed_mid_write_fails_the_qp_and_a_new_connection_works() {
    use softrdma::{Access, QpState, SendWr, WcStatus};
    use softrdma_cli::perf::proto::Reply;
    for transport in ["iwarp", "roce"] {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let roce_port = udp.local_addr().unwrap().port();
        drop(udp);
        let rp = roce_port.to_string();
        let extra: Vec<&str> = match transport {
            "roce" => vec!["--transport", "roce", "--roce-port", &rp],
            _ => vec![],
        };
        let ctx = match transport {
            "roce" => {
                let mut cfg = RoceConfig::new("127.0.0.4".parse().unwrap());
                cfg.port = roce_port;
                Device::roce(cfg).open().unwrap()
            }
            _ => Context::open().unwrap(),
        };
        let pd = ctx.alloc_pd();
        let mr = pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
        let cq = ctx.create_cq(4096, None).unwrap();
        // Connects a QP to a fresh server for a Write test of 1 MiB; the server's buffer.
        let start = |cq: &softrdma::Cq| {
            let (server, port) = perf_server(&extra);
            let qp = pd
                .create_qp(QpInitAttr {
                    cap: softrdma::QpCap {
                        max_send_wr: 1024,
                        ..softrdma::QpCap::default()
                    },
                    ..QpInitAttr::new(cq, cq)
                })
                .unwrap();
            let req = Request {
                size: 1 << 20,
                ..Request::new(Test::WriteBw)
            };
            let conn = qp
                .connect(
                    format!("127.0.0.1:{port}"),
                    ConnectParams {
                        private_data: req.emit(),
                        ..ConnectParams::default()
                    },
                )
                .unwrap();
            let reply = Reply::parse(&conn.peer_private_data).expect("a perf reply");
            (server, qp, reply)
        };
        let (mut server, qp, reply) = start(&cq);
        let dog = watchdog(server.id());
        let write = |qp: &softrdma::Qp, id: u64| {
            qp.post_send(SendWr::write(
                id,
                [mr.sge(0, 1 << 20)],
                softrdma::Key(reply.buf.rkey),
                reply.buf.addr,
            ))
        };
        // A first Write completes: the connection carries data.
        write(&qp, 0).unwrap();
        let mut wcs = Vec::new();
        cq.wait(1, 1, SAFETY, &mut wcs).unwrap();
        assert_eq!(wcs[0].status, WcStatus::Success, "{transport}");
        // Writes in flight, then the peer dies. Stopped first, so that it reads none of them:
        // 256 MiB cannot all leave before the kill, however fast both sides are.
        let pid = nix::unistd::Pid::from_raw(server.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        let posted = 256u64;
        for id in 1..=posted {
            write(&qp, id).unwrap();
        }
        server.kill().unwrap();
        let _ = server.wait();
        let _ = dog.send(());
        let mut done = 0;
        let mut failed = 0;
        while done < posted as usize {
            wcs.clear();
            cq.wait(1, 256, SAFETY, &mut wcs)
                .unwrap_or_else(|e| panic!("{transport}: {done} of {posted} completed: {e}"));
            done += wcs.len();
            failed += wcs.iter().filter(|w| w.status != WcStatus::Success).count();
        }
        assert!(
            failed > 0,
            "{transport}: the peer died under {posted} Writes"
        );
        assert_eq!(qp.state(), QpState::Error, "{transport}");
        // Posting to the dead QP completes at once as flushed (or is refused), never hangs.
        if write(&qp, 999).is_ok() {
            wcs.clear();
            cq.wait(1, 1, SAFETY, &mut wcs).unwrap();
            assert_eq!(wcs[0].status, WcStatus::WorkRequestFlushed, "{transport}");
        }
        // A new connection to a new peer, on the same context and CQ.
        let (mut server, qp2, reply2) = start(&cq);
        let dog = watchdog(server.id());
        qp2.post_send(SendWr::write(
            7,
            [mr.sge(0, 4096)],
            softrdma::Key(reply2.buf.rkey),
            reply2.buf.addr,
        ))
        .unwrap();
        wcs.clear();
        cq.wait(1, 1, SAFETY, &mut wcs).unwrap();
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status),
            (7, WcStatus::Success),
            "{transport}"
        );
        let _ = server.kill();
        let _ = server.wait();
        let _ = dog.send(());
    }
}
