//! `softrdma perf --loopback`: every test runs and reports figures beside raw TCP; the Send
//! bandwidth test survives a credit window far smaller than what is in flight (iWARP has no
//! RNR: one Send without a receive would kill the stream); the binary prints the table and
//! `--json`.

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
    let r = perf::run_loopback(&args(&["--loopback", "-n", "200", "-s", "4096"])).unwrap();
    let bw: Vec<Test> = r.bw.iter().map(|b| b.test).collect();
    assert_eq!(bw, [Test::WriteBw, Test::ReadBw, Test::SendBw]);
    let lat: Vec<Test> = r.lat.iter().map(|l| l.test).collect();
    assert_eq!(lat, [Test::WriteLat, Test::ReadLat, Test::SendLat]);
    for b in &r.bw {
        assert_eq!(
            (b.bytes, b.rdma.iters, b.rdma.bytes),
            (4096, 200, 200 * 4096)
        );
        assert!(
            b.rdma.gbit_s > 0.0 && b.raw_tcp.gbit_s > 0.0 && b.ratio > 0.0,
            "{b:?}"
        );
        assert_eq!(b.raw_tcp.iters, 200);
    }
    for l in &r.lat {
        assert_eq!(l.rdma.iters, 200);
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
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "perf",
            "--loopback",
            "-D",
            "0.2",
            "--op",
            "write",
            "-s",
            "256",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
