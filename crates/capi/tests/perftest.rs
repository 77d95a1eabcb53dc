//! Debian's perftest on softrdma through the drop-in library, a pair of processes over
//! loopback (issue 43): every bandwidth and latency tool on the RoCE device with QPs brought
//! up out of band (perftest's default `ibv_wr_*` posting and `--use_old_post_send`) and
//! through rdma_cm (`-R`), and over iWARP through rdma_cm (`-R`, as iWARP hardware needs).

mod common;

use common::{loopback_device, start, wait_for_server};

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
    attempts(&format!("{prog} {args:?}"), || {
        let (server, port) = common::listening_server(prog, with_port, &[]);
        let mut a = with_port(port);
        a.push("127.0.0.1".into());
        let c = outcome(start(prog, &a, &[]));
        let s = server_outcome(server, &c);
        calibrated(&[&c, &s])?;
        let c = ok(c, &format!("{prog} {args:?} client"));
        ok(s, &format!("{prog} {args:?} server"));
        assert!(
            has_row(&c, bytes),
            "{prog} {args:?}: no result row for {bytes} octets:\n{c}"
        );
        Ok(())
    });
}

/// A finished program: whether it succeeded, and all it said.
type Outcome = (bool, String);

fn outcome(c: std::process::Child) -> Outcome {
    let out = c.wait_with_output().expect("wait");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A server's outcome once its client had `client`'s: at once, killed, if the client
/// failed (perftest's server then waits for a client that is gone), else when it ends.
fn server_outcome(mut s: std::process::Child, client: &Outcome) -> Outcome {
    if !client.0 {
        let _ = s.kill();
    }
    outcome(s)
}

/// What a program said, which must have succeeded.
fn ok(o: Outcome, who: &str) -> String {
    assert!(o.0, "{who}:\n{}", o.1);
    o.1
}

/// `Err` when a program of the pair failed because perftest could not measure its CPU's
/// clock (its own calibration, which a loaded machine's timing spoils: "Correlation
/// coefficient r^2 < 0.9", then no report): nothing the library did.
fn calibrated(outcomes: &[&Outcome]) -> Result<(), String> {
    match outcomes
        .iter()
        .find(|o| !o.0 && o.1.contains("Correlation coefficient"))
    {
        Some(o) => Err(o.1.clone()),
        None => Ok(()),
    }
}

/// Runs `pair` (a server and its client) again, up to three times in all, while perftest's
/// clock calibration spoils it ([`calibrated`]).
fn attempts(what: &str, mut pair: impl FnMut() -> Result<(), String>) {
    for i in 1..=3 {
        match pair() {
            Ok(()) => return,
            Err(e) if i < 3 => eprintln!("{what}: perftest's calibration failed; again:\n{e}"),
            Err(e) => panic!("{what}: perftest's calibration failed three times:\n{e}"),
        }
    }
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
    for ((prog, bytes), old) in TOOLS.iter().flat_map(|t| [(*t, false), (*t, true)]) {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        attempts(&format!("{prog} -R on RoCE (old post {old})"), || {
            let port = common::free_port().to_string();
            let mut args = strs(&["-R", "-d", &dev, "-x", "0", "-n", "200", "-p", &port]);
            if old {
                args.push("--use_old_post_send".into());
            }
            let server = start(prog, &args, &env);
            wait_for_server("roce", 0);
            let mut client_args = args.clone();
            client_args.push("127.0.0.1".into());
            // The server's socket is bound just before it listens: a client that came in
            // between is refused (perftest says so and exits) and runs again.
            let t0 = std::time::Instant::now();
            let c = loop {
                let c = outcome(start(prog, &client_args, &env));
                if c.0 || !refused(&c.1) {
                    break c;
                }
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(30),
                    "{prog} -R on RoCE, client: {}",
                    c.1
                );
            };
            let s = server_outcome(server, &c);
            calibrated(&[&c, &s])?;
            let c = ok(c, &format!("{prog} -R on RoCE, client"));
            ok(s, &format!("{prog} -R on RoCE, server"));
            assert!(
                has_row(&c, bytes),
                "{prog} -R on RoCE: no result row for {bytes} octets:\n{c}"
            );
            Ok(())
        });
    }
}

/// Debian's perftest against `softrdma perf --perftest` (the native API) in both roles, on
/// both transports, so a bug cannot hide behind its twin (issue 43, Done-when 2): perf
/// serves a Debian client (`-R`), and a Debian server (`-R`, and on RoCE also with its QPs
/// brought up out of band) serves perf. The Debian side's report must carry its row.
#[test]
fn debian_perftest_against_softrdma_perf_both_roles() {
    let roce_dev = loopback_device();
    let dev = |transport: &str| match transport {
        "iwarp" => softrdma::TCP_DEVICE_NAME.to_string(),
        _ => roce_dev.clone(),
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
        attempts(&format!("{prog} against perf ({transport})"), || {
            let p = common::free_port().to_string();
            let server = NativeServer::start(&[
                "--server",
                "--perftest",
                "--transport",
                transport,
                "-B",
                "127.0.0.1",
                "-p",
                &p,
            ]);
            let d = dev(transport);
            let args = strs(&[
                "-R",
                "-d",
                &d,
                "-x",
                "0",
                "-n",
                "200",
                "-p",
                &p,
                "127.0.0.1",
            ]);
            let env = [(softrdma_capi::cm::TRANSPORT_VAR, transport)];
            let c = outcome(start(prog, &args, &env));
            if let Err(e) = calibrated(&[&c]) {
                // The client gave up before its session: perf still waits for one.
                server.kill();
                return Err(e);
            }
            let c = ok(c, &format!("{prog} against perf ({transport})"));
            server.finish(&format!("perf --server --perftest ({transport}, {prog})"));
            assert!(
                has_row(&c, 65536),
                "{prog} against perf ({transport}):\n{c}"
            );
            Ok(())
        });
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
        attempts(
            &format!("{prog} serving perf ({transport}, -R {cm})"),
            || {
                let port = common::free_port();
                let p = port.to_string();
                let d = dev(transport);
                let mut args = strs(&["-d", &d, "-x", "0", "-n", "200", "-p", &p]);
                if cm {
                    args.insert(0, "-R".into());
                }
                let env = [(softrdma_capi::cm::TRANSPORT_VAR, transport)];
                let server = start(prog, &args, &env);
                // Out of band, perftest's own TCP socket; through rdma_cm over RoCE, its UDP
                // socket (its listener follows: a perf that came between is refused and runs
                // again).
                common::wait_for_server(if cm { transport } else { "iwarp" }, port);
                let mut perf = vec![
                    "perf",
                    "--perftest",
                    "--transport",
                    transport,
                    "--test",
                    test,
                ];
                perf.extend(["-n", "200", "-p", &p]);
                if cm {
                    perf.push("-R");
                }
                if transport == "roce" {
                    // Its own loopback address: the Debian server holds 127.0.0.1.
                    perf.extend(["-B", "127.0.0.9"]);
                }
                perf.push("127.0.0.1");
                let t0 = std::time::Instant::now();
                loop {
                    let c = common::command(common::softrdma_bin())
                        .args(&perf)
                        .output()
                        .expect("softrdma perf");
                    if c.status.success() {
                        break;
                    }
                    let said = String::from_utf8_lossy(&c.stderr).into_owned();
                    if !refused(&said) {
                        // The server may have failed first (its calibration): say that then.
                        let s = server_outcome(server, &(false, String::new()));
                        calibrated(&[&s])?;
                        panic!(
                            "perf --perftest against {prog} ({transport}, -R {cm}): {c:?}\nserver: {}",
                            s.1
                        );
                    }
                    assert!(
                        t0.elapsed() < std::time::Duration::from_secs(30),
                        "perf --perftest against {prog} ({transport}, -R {cm}): {c:?}"
                    );
                }
                let s = outcome(server);
                calibrated(&[&s])?;
                let s = ok(s, &format!("{prog} serving perf ({transport}, -R {cm})"));
                assert!(
                    has_row(&s, bytes),
                    "{prog} serving perf ({transport}):\n{s}"
                );
                Ok(())
            },
        );
    }
}

/// Whether a client's words say its RoCE connection request was refused for want of a
/// listener (the server's socket was up before its listener): perftest's "REJECTED" or
/// its "Unexpected CM event ... 8" (the IB CM's "invalid service ID"), softrdma's
/// "rejected".
fn refused(said: &str) -> bool {
    said.contains("RDMA_CM_EVENT_REJECTED")
        || said.contains("Unexpected CM event")
        || said.to_lowercase().contains("rejected")
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `softrdma perf --server` with its standard error in a file, started and waited for
/// until it says it listens.
struct NativeServer {
    child: std::process::Child,
    said: std::path::PathBuf,
}

impl NativeServer {
    fn start(args: &[&str]) -> NativeServer {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let said = std::env::temp_dir().join(format!(
            "softrdma-perf-server-{}-{}.txt",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let err = std::fs::File::create(&said).expect("a file for its words");
        let mut child = common::command(common::softrdma_bin())
            .arg("perf")
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("softrdma perf --server");
        let t0 = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(&said).unwrap_or_default();
            if text.contains("waiting for a perftest client") {
                return NativeServer { child, said };
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("perf --server exited ({st}): {text}");
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "perf --server never listened: {text}"
            );
            std::thread::yield_now();
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.said);
    }

    fn finish(self, who: &str) {
        let out = self.child.wait_with_output().expect("wait");
        let said = std::fs::read_to_string(&self.said).unwrap_or_default();
        let _ = std::fs::remove_file(&self.said);
        assert!(out.status.success(), "{who}: {out:?} {said}");
    }
}

/// A perftest report's result row for `bytes`-octet messages.
fn has_row(report: &str, bytes: u32) -> bool {
    report.lines().any(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(&bytes.to_string()) && f.next().is_some_and(|n| n.parse::<u64>().is_ok())
    })
}
