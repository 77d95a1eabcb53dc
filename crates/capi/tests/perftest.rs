//! Debian's perftest on softrdma through the drop-in library, a pair of processes over
//! loopback (issue 43): every bandwidth and latency tool on the RoCE device with QPs brought
//! up out of band (perftest's default `ibv_wr_*` posting and `--use_old_post_send`) and
//! through rdma_cm (`-R`), and over iWARP through rdma_cm (`-R`, as iWARP hardware needs).

mod common;

use common::{finish, loopback_device, start, wait_for_server};

/// One pair at a time: perftest's clients connect their data QPs as soon as the control
/// exchange is done, and a server slowed by another pair on the same two cores may not be
/// listening again yet (perftest's retry after that refusal then fails inside perftest).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `prog` as server and client with `args`; the client's report must carry a result
/// row for `bytes`-octet messages.
fn pair(prog: &str, args: &[&str], bytes: u32) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let with_port = |port: u16| -> Vec<String> {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.extend(["-p".to_string(), port.to_string()]);
        a
    };
    let (server, port) = common::listening_server(prog, with_port, &[]);
    let mut a = with_port(port);
    a.push("127.0.0.1".into());
    let client = start(prog, &a, &[]);
    let c = finish(client, &format!("{prog} {args:?} client"));
    finish(server, &format!("{prog} {args:?} server"));
    assert!(
        has_row(&c, bytes),
        "{prog} {args:?}: no result row for {bytes} octets:\n{c}"
    );
}

#[test]
fn every_perftest_tool_on_roce_both_post_apis() {
    let dev = loopback_device();
    for (prog, bytes) in [
        ("ib_write_bw", 65536),
        ("ib_read_bw", 65536),
        ("ib_send_bw", 65536),
        ("ib_atomic_bw", 8),
        ("ib_write_lat", 2),
        ("ib_read_lat", 2),
        ("ib_send_lat", 2),
    ] {
        for old in [false, true] {
            let mut args = vec!["-d", &dev, "-x", "0", "-n", "200"];
            if old {
                args.push("--use_old_post_send");
            }
            pair(prog, &args, bytes);
        }
    }
}

/// Every tool, as `(program, size of its result row)`.
const TOOLS: [(&str, u32); 7] = [
    ("ib_write_bw", 65536),
    ("ib_read_bw", 65536),
    ("ib_send_bw", 65536),
    ("ib_atomic_bw", 8),
    ("ib_write_lat", 2),
    ("ib_read_lat", 2),
    ("ib_send_lat", 2),
];

#[test]
fn perftest_over_iwarp_through_rdma_cm() {
    let dev = softrdma::TCP_DEVICE_NAME;
    for (prog, bytes) in TOOLS {
        pair(prog, &["-R", "-d", dev, "-n", "200"], bytes);
    }
}

/// `-R` on RoCE: perftest's control exchange and its data QP each through rdma_cm (the IB
/// CM on QP1). Its client connects the data QP as soon as the exchange ends, racing the
/// server's second `rdma_listen` (the library's connect tries again while the server
/// answers that nobody listens yet).
#[test]
fn perftest_over_roce_through_rdma_cm() {
    let dev = loopback_device();
    let env = [(softrdma_capi::cm::TRANSPORT_VAR, "roce")];
    for (prog, bytes) in TOOLS {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let port = common::free_port().to_string();
        let args: Vec<String> = ["-R", "-d", &dev, "-x", "0", "-n", "200", "-p", &port]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let server = start(prog, &args, &env);
        wait_for_server("roce", 0);
        let mut client_args = args.clone();
        client_args.push("127.0.0.1".into());
        // The server's socket is bound just before it listens: a client that came in
        // between is refused (perftest says so and exits) and runs again.
        let t0 = std::time::Instant::now();
        let c = loop {
            let out = start(prog, &client_args, &env)
                .wait_with_output()
                .expect("wait");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                break text;
            }
            assert!(
                text.contains("RDMA_CM_EVENT_REJECTED")
                    && t0.elapsed() < std::time::Duration::from_secs(30),
                "{prog} -R on RoCE, client: {text}"
            );
        };
        finish(server, &format!("{prog} -R on RoCE, server"));
        assert!(
            has_row(&c, bytes),
            "{prog} -R on RoCE: no result row for {bytes} octets:\n{c}"
        );
    }
}

/// Debian's perftest against `softrdma perf --perftest` (the native API) in both roles, on
/// both transports, so a bug cannot hide behind its twin (issue 43, Done-when 2): perf
/// serves a Debian client (`-R`), and a Debian server (`-R`, and on RoCE also with its QPs
/// brought up out of band) serves perf. The Debian side's report must carry its row.
#[test]
fn debian_perftest_against_softrdma_perf_both_roles() {
    let bin = common::softrdma_bin();
    let roce_dev = loopback_device();
    let native = |args: &[&str]| {
        std::process::Command::new(&bin)
            .arg("perf")
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("softrdma perf")
    };
    // (transport, the Debian client)
    let perf_serves = [
        ("iwarp", "ib_write_bw"),
        ("iwarp", "ib_read_bw"),
        ("iwarp", "ib_send_bw"),
        ("roce", "ib_write_bw"),
        ("roce", "ib_read_bw"),
        ("roce", "ib_send_bw"),
    ];
    for (transport, prog) in perf_serves {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let port = common::free_port();
        let p = port.to_string();
        let server = native(&[
            "--server",
            "--perftest",
            "--transport",
            transport,
            "-B",
            "127.0.0.1",
            "-p",
            &p,
        ]);
        common::wait_for_server(transport, port);
        let dev = if transport == "iwarp" {
            softrdma::TCP_DEVICE_NAME.to_string()
        } else {
            roce_dev.clone()
        };
        let env = [(softrdma_capi::cm::TRANSPORT_VAR, transport)];
        let args: Vec<String> = [
            "-R",
            "-d",
            &dev,
            "-x",
            "0",
            "-n",
            "200",
            "-p",
            &p,
            "127.0.0.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let c = finish(
            start(prog, &args, &env),
            &format!("{prog} against perf ({transport})"),
        );
        finish(
            server,
            &format!("perf --server --perftest ({transport}, {prog})"),
        );
        assert!(
            has_row(&c, 65536),
            "{prog} against perf ({transport}):\n{c}"
        );
    }
    // (transport, the Debian server's -R, perf's --test, the Debian program, row size)
    let debian_serves = [
        ("iwarp", true, "write", "ib_write_bw", 65536),
        ("iwarp", true, "read", "ib_read_bw", 65536),
        ("iwarp", true, "send", "ib_send_bw", 65536),
        ("roce", true, "write", "ib_write_bw", 65536),
        ("roce", false, "write", "ib_write_bw", 65536),
        ("roce", false, "read", "ib_read_bw", 65536),
        ("roce", false, "atomic", "ib_atomic_bw", 8),
    ];
    for (transport, cm, test, prog, bytes) in debian_serves {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let port = common::free_port();
        let p = port.to_string();
        let dev = if transport == "iwarp" {
            softrdma::TCP_DEVICE_NAME.to_string()
        } else {
            roce_dev.clone()
        };
        let mut args = vec!["-d", &dev, "-x", "0", "-n", "200", "-p", &p];
        if cm {
            args.insert(0, "-R");
        }
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env = [(softrdma_capi::cm::TRANSPORT_VAR, transport)];
        let server = start(prog, &args, &env);
        // Out of band, perftest's own TCP socket; through rdma_cm over RoCE, its UDP socket
        // (the listener follows at once; perf's connect tries again meanwhile).
        common::wait_for_server(if cm { transport } else { "iwarp" }, port);
        let mut perf = vec!["--perftest", "--transport", transport, "--test", test];
        perf.extend(["-n", "200", "-p", &p]);
        if cm {
            perf.push("-R");
        }
        if transport == "roce" {
            // Its own loopback address: the Debian server holds 127.0.0.1.
            perf.extend(["-B", "127.0.0.9"]);
        }
        perf.push("127.0.0.1");
        let c = native(&perf).wait_with_output().expect("wait");
        let s = finish(
            server,
            &format!("{prog} serving perf ({transport}, -R {cm})"),
        );
        assert!(
            c.status.success(),
            "perf --perftest against {prog} ({transport}, -R {cm}): {c:?}"
        );
        assert!(
            has_row(&s, bytes),
            "{prog} serving perf ({transport}):\n{s}"
        );
    }
}

/// A perftest report's result row for `bytes`-octet messages.
fn has_row(report: &str, bytes: u32) -> bool {
    report.lines().any(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(&bytes.to_string()) && f.next().is_some_and(|n| n.parse::<u64>().is_ok())
    })
}
