//! perftest's `-b` and `-q` against a `softrdma perf --server` in another process, over
//! both transports: the server runs the other direction of `-b` toward the client's own
//! listeners, and holds a scale session's QPs; its `--once` ends with the client's session.

mod common;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// A free UDP port on 127.0.0.1 (RoCE's, shared by server and client addresses).
fn free_udp_port() -> String {
    softrdma::spare_ports(&[std::net::Ipv4Addr::LOCALHOST.into()], 1)
        .unwrap()
        .to_string()
}

/// A server process, killed if the test ends before it exited.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Its exit status was success.
    fn exited_ok(&mut self) -> bool {
        self.0.wait().unwrap().success()
    }
}

/// `perf --server` on 127.0.0.1 with `extra`, once both listeners are up; its port, and the
/// RoCE options client and server share.
fn server(transport: &str, extra: &[&str]) -> (Server, String, Vec<String>) {
    let port = common::free_ports().to_string();
    let roce: Vec<String> = match transport {
        "roce" => vec![
            "--roce-port".into(),
            free_udp_port(),
            "--raw-tx".into(),
            "off".into(),
        ],
        _ => Vec::new(),
    };
    let mut child = Command::new(BIN)
        .args(["perf", "--transport", transport, "--server"])
        .args(["-B", "127.0.0.1", "-p", &port])
        .args(&roce)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving on") {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("{transport}: the server exited");
        }
    }
    // The rest of its standard error is drained so that it never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (Server(child), port, roce)
}

/// The client of the server at `port`, from 127.0.0.3: its output.
fn client(transport: &str, port: &str, roce: &[String], a: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["perf", "--transport", transport, "127.0.0.1", "-p", port])
        .args(["-B", "127.0.0.3"])
        .args(roce)
        .args(a)
        .output()
        .unwrap()
}

fn json(transport: &str, out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{transport}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `-b` against a server: every bandwidth row holds both directions' messages (the server's
/// figures came back in its answer to End), and so does its raw baseline.
#[test]
fn bidirectional_against_a_server() {
    for t in ["iwarp", "roce"] {
        let (mut srv, port, roce) = server(t, &["--once"]);
        let (n, size) = (40u64, 4096u64);
        let out = client(
            t,
            &port,
            &roce,
            &["-b", "--bw", "-n", "40", "-s", "4096", "--json"],
        );
        let v = json(t, &out);
        assert!(srv.exited_ok(), "{t}: the server's exit");
        assert_eq!(v["bidirectional"], true, "{t}");
        assert_eq!(v["mode"], "client");
        let rows = v["bw"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "{t}: Write, Read, Send: {v}");
        for row in rows {
            assert_eq!(row["rdma"]["iters"], 2 * n, "{t}: {row}");
            assert_eq!(row["rdma"]["bytes"], 2 * n * size, "{t}: {row}");
            let raw = match t {
                "roce" => &row["raw_udp"],
                _ => &row["raw_tcp"],
            };
            let lost = raw["lost_bytes"].as_u64().unwrap_or(0);
            assert_eq!(
                raw["bytes"].as_u64().unwrap() + lost,
                2 * n * size,
                "{t}: {row}"
            );
        }
    }
}

/// `-q` against a server: N connected QPs into one session there, one Write per QP per
/// round; the server checked every slot before it answered End. A list runs each count in
/// a child process, and the session's server still ends with the parent's Bye.
#[test]
fn scale_against_a_server() {
    for t in ["iwarp", "roce"] {
        let (mut srv, port, roce) = server(t, &["--once"]);
        let out = client(
            t,
            &port,
            &roce,
            &["-q", "1,24", "-n", "6", "-s", "1000", "--json"],
        );
        let v = json(t, &out);
        assert!(srv.exited_ok(), "{t}: the server's exit");
        let rows = v["scale"].as_array().unwrap();
        let qps: Vec<u64> = rows.iter().map(|r| r["qps"].as_u64().unwrap()).collect();
        assert_eq!(qps, [1, 24], "{t}");
        for r in rows {
            assert_eq!(r["rounds"], 6, "{t}: {r}");
            assert_eq!(r["ends_here"], 1, "{t}: {r}");
            let q = r["qps"].as_u64().unwrap();
            assert_eq!(r["bw"]["bytes"], 6 * 1000 * q, "{t}: {r}");
        }
        assert_eq!(v["mode"], "client");
    }
}

/// A scale session past the server's limits is refused with the reason, and the server
/// goes on serving: the next clients' sessions run.
#[test]
fn scale_sessions_past_the_limits_are_refused() {
    for t in ["iwarp", "roce"] {
        let (mut srv, port, roce) = server(t, &["--max-buffer", "100000"]);
        let big = client(t, &port, &roce, &["-q", "200", "-n", "2", "-s", "1000"]);
        assert!(!big.status.success(), "{t}");
        let err = String::from_utf8_lossy(&big.stderr);
        assert!(
            err.contains("rejected by the server") && err.contains("--max-buffer 100000"),
            "{t}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{t}: {err}");
        let many = client(t, &port, &roce, &["-q", "5000", "-n", "1", "-s", "1"]);
        assert!(!many.status.success(), "{t}");
        let err = String::from_utf8_lossy(&many.stderr);
        assert!(err.contains("1 to 4096 QPs"), "{t}: {err}");
        let ok = client(
            t,
            &port,
            &roce,
            &["-q", "10", "-n", "3", "-s", "1000", "--json"],
        );
        let v = json(t, &ok);
        assert_eq!(v["scale"][0]["qps"], 10, "{t}");
        // Still serving (not --once): the Server guard stops it.
        assert!(srv.0.try_wait().unwrap().is_none(), "{t}");
    }
}

/// A request the network repeats after its rejection was lost comes up again as a new
/// connection request; the server answers an `End` it already answered with the same report
/// (not "no test to end"), and a repeated `Reverse` with the same test id (no second
/// measurement). Seen in the soak over RoCE with loss and duplication.
#[test]
fn repeated_end_and_reverse_get_the_first_answer() {
    use softrdma::{ConnectParams, Device, Error, QpCap, QpInitAttr};
    use softrdma_cli::perf::proto::{EndReport, Measure, Reply, Request, Reverse, Test};
    let (srv, port, _) = server("iwarp", &[]);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let ctx = Device::tcp().open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp_of = || {
        pd.create_qp(QpInitAttr {
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                ..QpCap::default()
            },
            ..QpInitAttr::new(&cq, &cq)
        })
        .unwrap()
    };
    // Rejected requests: their private data.
    let ask = |pd: Vec<u8>| match qp_of().connect(
        addr,
        ConnectParams {
            private_data: pd,
            ..ConnectParams::default()
        },
    ) {
        Err(Error::Rejected { private_data, .. }) => private_data,
        other => panic!("{other:?}"),
    };
    // A Read test (the server checks nothing of it), connected and ended twice.
    let test = qp_of();
    let conn = test
        .connect(
            addr,
            ConnectParams {
                private_data: Request {
                    size: 4096,
                    ..Request::new(Test::ReadBw)
                }
                .emit(),
                ..ConnectParams::default()
            },
        )
        .unwrap();
    let id = Reply::parse(&conn.peer_private_data).unwrap().id;
    let end = Request {
        id,
        ..Request::new(Test::End)
    }
    .emit();
    let first = ask(end.clone());
    assert_eq!(EndReport::parse(&first).unwrap().error, None);
    assert_eq!(ask(end), first, "the repeated End");
    // A Reverse toward a port with nobody: the same id twice; its End reports the failure.
    let rev = Reverse {
        what: Measure::Raw,
        size: 64,
        limit: softrdma_cli::perf::Limit::Iters(1),
        tx_depth: 1,
        rx_depth: 4,
        rdma_port: 9,
        raw_port: 9,
        nonce: 42,
    }
    .emit();
    let a = Reply::parse(&ask(rev.clone())).unwrap().id;
    let b = Reply::parse(&ask(rev)).unwrap().id;
    assert_eq!(a, b);
    let r = EndReport::parse(&ask(Request {
        id: a,
        ..Request::new(Test::End)
    }
    .emit()))
    .unwrap();
    assert!(r.error.is_some(), "{r:?}");
    drop(srv);
}
