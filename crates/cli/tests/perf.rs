//! `softrdma perf --loopback`: every test runs and reports figures beside raw TCP; the Send
//! bandwidth test survives a credit window far smaller than what is in flight (iWARP has no
//! RNR: one Send without a receive would kill the stream); the binary prints the table and
//! `--json`.

mod common;

use std::process::Command;

use clap::Parser;
use softrdma_cli::perf::{self, PerfArgs, proto::Test};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

fn args(a: &[&str]) -> PerfArgs {
    let mut v = vec!["perf"];
    v.extend_from_slice(a);
    Cli::try_parse_from(v).unwrap().perf
}

#[test]
fn loopback_all_tests_small() {
    let r = perf::run_loopback(&args(&["--loopback", "-n", "300", "-s", "4096"])).unwrap();
    // perftest's BW peak: the best stretch of the run (the whole run is one of them, so at
    // least the average; 300 messages cover the 256-message window of tx depth 128).
    for b in &r.bw {
        let peak = b.rdma.peak_gbit_s.expect("a peak");
        assert!(
            peak >= b.rdma.gbit_s * 0.999,
            "{}: {peak} < {}",
            b.test,
            b.rdma.gbit_s
        );
    }
    let bw: Vec<Test> = r.bw.iter().map(|b| b.test).collect();
    assert_eq!(bw, [Test::WriteBw, Test::ReadBw, Test::SendBw]);
    let lat: Vec<Test> = r.lat.iter().map(|l| l.test).collect();
    assert_eq!(lat, [Test::WriteLat, Test::ReadLat, Test::SendLat]);
    for b in &r.bw {
        assert_eq!(
            (b.bytes, b.rdma.iters, b.rdma.bytes),
            (4096, 300, 300 * 4096)
        );
        assert!(
            b.rdma.gbit_s > 0.0 && b.raw_tcp.gbit_s > 0.0 && b.ratio > 0.0,
            "{b:?}"
        );
        assert_eq!(b.raw_tcp.iters, 300);
    }
    for l in &r.lat {
        assert_eq!(l.rdma.iters, 300);
        assert!(l.rdma.t_min <= l.rdma.t_typical && l.rdma.t_typical <= l.rdma.t_max);
        assert!(l.raw_tcp.t_typical > 0.0 && l.ratio > 0.0);
    }
    let m = r.mpa.unwrap();
    assert_eq!((m.rev, m.crc, m.markers), (2, false, false));
    let table = perf::render(
        &perf::run_loopback(&args(&["--loopback", "-n", "20", "--op", "read", "--lat"])).unwrap(),
    );
    assert!(table.contains("RDMA_Read Lat"), "{table}");
}

/// Many more Sends in flight (tx depth 64) than receives posted (8): the credits hold the
/// sender back; with CRC on and small FPDUs for good measure.
#[test]
fn send_bandwidth_credit_window() {
    let r = perf::run_loopback(&args(&[
        "--loopback",
        "--op",
        "send",
        "--bw",
        "-n",
        "3000",
        "-s",
        "1000",
        "-t",
        "64",
        "-r",
        "8",
        "--crc",
        "--fpdu",
        "512",
    ]))
    .unwrap();
    assert_eq!(r.bw.len(), 1);
    assert_eq!(r.bw[0].rdma.iters, 3000);
    assert!(r.mpa.unwrap().crc);
}

#[test]
fn duration_mode_and_json_from_the_binary() {
    let v = common::softrdma_json(&[
        "perf",
        "--loopback",
        "-D",
        "0.2",
        "--op",
        "write",
        "-s",
        "256",
        "--json",
    ]);
    assert_eq!(v["mode"], "loopback");
    assert_eq!(v["bw"][0]["test"], "WriteBw");
    assert!(v["bw"][0]["rdma"]["iters"].as_u64().unwrap() > 0);
    assert!(v["lat"][0]["raw_tcp"]["t_typical"].as_f64().unwrap() > 0.0);
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["perf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// The one client and server over both transports: every op, blocking and busy waits, a
/// bandwidth and a latency row each, beside the transport's raw baseline. A run that
/// returns has checked every octet (what landed at the client here, what landed at the
/// server in its End report) and the count and length of every Send.
#[test]
fn every_op_both_wait_modes_both_transports() {
    for transport in ["iwarp", "roce"] {
        for (op, bw, lat) in [
            ("write", Test::WriteBw, Test::WriteLat),
            ("read", Test::ReadBw, Test::ReadLat),
            ("send", Test::SendBw, Test::SendLat),
        ] {
            for busy in [false, true] {
                let mut a = vec![
                    "--transport",
                    transport,
                    "--loopback",
                    "--op",
                    op,
                    "-n",
                    "40",
                    "-s",
                    "3000",
                    "-t",
                    "8",
                    "-r",
                    "8",
                ];
                if transport == "roce" {
                    // Three packets a message, the last one short.
                    a.extend(["-m", "1024"]);
                }
                if busy {
                    a.push("--busy");
                }
                let what = format!("{transport} {op} busy={busy}");
                let r = perf::run_loopback(&args(&a)).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(r.transport, transport, "{what}");
                assert_eq!(r.completion_wait, if busy { "busy" } else { "block" });
                assert_eq!(r.bw.len(), 1, "{what}");
                assert_eq!(r.lat.len(), 1, "{what}");
                let b = &r.bw[0];
                assert_eq!(b.test, bw, "{what}");
                assert_eq!(
                    (b.bytes, b.rdma.iters, b.rdma.bytes, b.raw_tcp.iters),
                    (3000, 40, 40 * 3000, 40),
                    "{what}"
                );
                assert!((b.ratio - b.rdma.gbit_s / b.raw_tcp.gbit_s).abs() < 1e-9);
                let l = &r.lat[0];
                assert_eq!((l.test, l.bytes, l.rdma.iters), (lat, 3000, 40), "{what}");
                assert_eq!(
                    l.basis,
                    if op == "read" {
                        "round_trip"
                    } else {
                        "half_round_trip"
                    }
                );
                assert!(l.rdma.t_min <= l.rdma.t_typical && l.rdma.t_typical <= l.rdma.t_max);
                assert!((l.ratio - l.rdma.t_typical / l.raw_tcp.t_typical).abs() < 1e-9);
                match transport {
                    "iwarp" => assert!(r.mpa.is_some() && r.roce.is_none(), "{what}"),
                    _ => {
                        let x = r.roce.as_ref().unwrap();
                        assert!(r.mpa.is_none(), "{what}");
                        assert_eq!((x.pmtu, x.bad_icrc, x.tx_errors), (1024, 0, 0), "{what}");
                        assert!(x.client.starts_with("127.0.0.2:"), "{x:?}");
                    }
                }
                let table = perf::render(&r);
                for row in [bw.name(), lat.name()] {
                    assert_eq!(
                        table.lines().filter(|x| x.contains(row)).count(),
                        1,
                        "{table}"
                    );
                }
                let base = if transport == "iwarp" {
                    "raw_tcp"
                } else {
                    "raw_udp"
                };
                let v = perf::json(&r);
                assert!(v["bw"][0][base]["gbit_s"].as_f64().unwrap() > 0.0, "{v}");
                assert!(
                    v["lat"][0][base]["t_typical"].as_f64().unwrap() > 0.0,
                    "{v}"
                );
            }
        }
    }
}

/// `--server --once` and a client of HOST in two processes, over each transport: the
/// client's session ends the server, which exits 0.
#[test]
fn server_and_client_processes() {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let cases: [(&str, &[&str]); 2] = [("iwarp", &[]), ("roce", &["--roce-port", "24791"])];
    for (transport, roce) in cases {
        let port = common::free_ports().to_string();
        let mut server = Command::new(bin)
            .args(["perf", "--transport", transport, "--server", "--once"])
            .args(["-B", "127.0.0.1", "-p", &port])
            .args(roce)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Both listeners are up once it says so.
        let mut err = std::io::BufReader::new(server.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("serving on") {
            line.clear();
            if std::io::BufRead::read_line(&mut err, &mut line).unwrap() == 0 {
                panic!("{transport}: the server exited");
            }
        }
        let out = Command::new(bin)
            .args(["perf", "--transport", transport, "127.0.0.1", "-p", &port])
            .args(["-B", "127.0.0.3"])
            .args(roce)
            .args(["-n", "30", "-s", "2000", "--op", "send", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status = server.wait().unwrap();
        assert!(status.success(), "{transport} server");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["transport"], transport);
        assert_eq!(v["mode"], "client");
        assert_eq!(v["bw"][0]["test"], "SendBw");
        assert_eq!(v["bw"][0]["rdma"]["bytes"], 30 * 2000);
        assert_eq!(v["lat"][0]["test"], "SendLat");
        assert_eq!(v["lat"][0]["rdma"]["iters"], 30);
        if transport == "roce" {
            assert!(
                v["roce"]["client"]
                    .as_str()
                    .unwrap()
                    .starts_with("127.0.0.3:"),
                "{v}"
            );
        }
    }
}

/// `--plot`: a sweep of a few sizes drawn as SVG, every series of the run in its legend.
#[test]
fn plot_draws_the_run() {
    let dir = std::env::temp_dir().join(format!("softrdma-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("run.svg");
    let args = args(&[
        "--loopback",
        "-n",
        "20",
        "-s",
        "1024",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let r = perf::run_loopback(&args).unwrap();
    perf::plot::plot(&r, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
    for name in [
        "RDMA_Write BW",
        "RDMA_Read BW",
        "Send BW",
        "raw TCP",
        "RDMA_Write Lat",
        "raw TCP round trip",
    ] {
        assert!(text.contains(name), "{name} missing from the plot");
    }
    // Nothing to draw is an error, not an empty picture.
    let empty = perf::Report {
        bw: Vec::new(),
        lat: Vec::new(),
        ..r
    };
    assert!(perf::plot::plot(&empty, &dir.join("empty.svg")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// iWARP: the client's counters are reported, and a Read's responses (1 MiB, FPDUs of the
/// loopback MSS, far above the 16 KiB threshold) are read straight from the socket into the
/// sink: all but the octets that came in with FPDU headers.
#[test]
fn iwarp_counters_show_payload_placed_straight_from_the_socket() {
    let r = perf::run_loopback(&args(&[
        "--loopback",
        "--op",
        "read",
        "--bw",
        "-s",
        "1048576",
        "-n",
        "20",
    ]))
    .unwrap();
    let c = r.iwarp.clone().expect("iWARP counters");
    let mulpdu = usize::from(r.mpa.as_ref().unwrap().mulpdu);
    // 21 reads: the test's 20 and the check of the data.
    assert!(c.payload_rx >= 20 << 20, "{c:?}");
    assert_eq!((c.terminates_tx, c.terminates_rx), (0, 0));
    if mulpdu >= 20 * 1024 {
        assert!(c.payload_rx_direct * 2 > c.payload_rx, "{c:?}");
    }
    assert!(c.payload_rx_direct <= c.payload_rx);
    let table = perf::render(&r);
    assert!(table.contains("straight from the socket"), "{table}");
}

/// perftest's -b on loopback: both sides run each bandwidth test toward the other at once;
/// every row holds both directions' messages, and so does its raw baseline (two streams).
#[test]
fn bidirectional_bandwidth_runs_both_ways() {
    for t in ["iwarp", "roce"] {
        let r = perf::run_loopback(&args(&[
            "--loopback",
            "-b",
            "--bw",
            "-n",
            "50",
            "-s",
            "8192",
            "--transport",
            t,
        ]))
        .unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(r.bidirectional);
        assert_eq!(r.bw.len(), 3, "{t}: Write, Read, Send");
        for row in &r.bw {
            assert_eq!(row.rdma.iters, 2 * 50, "{t}: {}", row.test);
            assert_eq!(row.rdma.bytes, 2 * 50 * 8192, "{t}: {}", row.test);
            assert_eq!(row.raw_tcp.bytes + row.raw_tcp.lost_bytes, 2 * 50 * 8192);
        }
        let text = perf::render(&r);
        assert!(text.contains("bidirectional"), "{text}");
    }
}
