//! `softrdma perf --loopback -q`: many connected RC QPs between two contexts, one Write per
//! QP per round, over both transports. A row that comes back has had every QP's slot of
//! the server's region checked after a Read on each QP confirmed delivery.

mod common;

use std::process::Command;

use clap::Parser;
use softrdma_cli::perf::{self, PerfArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

fn args(a: &[&str]) -> PerfArgs {
    let mut v = vec!["perf", "--loopback"];
    v.extend_from_slice(a);
    Cli::try_parse_from(v).unwrap().perf
}

fn one_row(transport: &str, qps: u32, rounds: u64, size: u32) {
    let (q, n, s) = (qps.to_string(), rounds.to_string(), size.to_string());
    let r = perf::run_loopback(&args(&[
        "--transport",
        transport,
        "--raw-tx",
        "off",
        "-q",
        &q,
        "-n",
        &n,
        "-s",
        &s,
    ]))
    .unwrap();
    assert!(r.bw.is_empty() && r.lat.is_empty());
    let [row] = &r.scale[..] else {
        panic!("{:?}", r.scale)
    };
    assert_eq!((row.qps, row.bytes, row.rounds), (qps, size, rounds));
    assert_eq!(row.bw.iters, rounds * u64::from(qps));
    assert_eq!(row.bw.bytes, row.bw.iters * u64::from(size));
    assert!(row.bw.gbit_s > 0.0 && row.connect_seconds > 0.0);
    assert_eq!(row.vs_first, 1.0);
    // iWARP rows carry the same rounds over raw TCP connections; RoCE's have none.
    match (transport, row.raw_tcp) {
        ("iwarp", Some(raw)) => {
            assert_eq!(raw.iters, rounds * u64::from(qps));
            assert_eq!(raw.bytes, raw.iters * u64::from(size));
            assert_eq!(row.raw_vs_first, Some(1.0));
        }
        ("roce", None) => assert_eq!(row.raw_vs_first, None),
        (t, raw) => panic!("{t}: raw TCP row {raw:?}"),
    }
}

#[test]
fn many_qps_over_iwarp() {
    one_row("iwarp", 300, 4, 4096);
}

#[test]
fn many_qps_over_roce() {
    one_row("roce", 300, 4, 4096);
}

#[test]
fn odd_sizes_few_qps() {
    one_row("iwarp", 3, 7, 1);
    one_row("roce", 5, 3, 9001);
}

/// A list runs each count in a process of its own (the memory figures are then each
/// process's own); the rows come back in order, compared with the first.
#[test]
fn a_list_from_the_binary() {
    let v = common::softrdma_json(&["perf", "--loopback", "-q", "2,16", "-n", "3", "--json"]);
    let rows = v["scale"].as_array().unwrap();
    let qps: Vec<u64> = rows.iter().map(|r| r["qps"].as_u64().unwrap()).collect();
    assert_eq!(qps, [2, 16]);
    assert_eq!(rows[0]["vs_first"], 1.0);
    assert_eq!(rows[0]["raw_vs_first"], 1.0);
    for r in rows {
        assert_eq!(r["rounds"], 3);
        assert_eq!(r["raw_tcp"]["iters"], 3 * r["qps"].as_u64().unwrap());
        assert!(r["raw_vs_first"].as_f64().is_some_and(|v| v > 0.0));
        assert!(r["idle_bytes_per_connection"].as_u64().is_some());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["perf", "--loopback", "-q", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--qp") && err.contains("1..=65536"), "{err}");
}

/// ISSUE12-DONE-4, memory: a thousand idle connected RC QPs cost at most 64 KiB each, on
/// both transports (the RSS the connections added, in a process of its own; two QPs per
/// connection over loopback). A RoCE QP once kept a 270 KB batch of datagrams from birth.
#[test]
fn idle_qps_stay_small() {
    const PER_QP: u64 = 64 * 1024;
    for transport in ["iwarp", "roce"] {
        let v = common::softrdma_json(&[
            "perf",
            "--loopback",
            "--transport",
            transport,
            "-q",
            "1024",
            "-n",
            "1",
            "--json",
        ]);
        let row = &v["scale"][0];
        assert_eq!(row["qps"], 1024, "{v}");
        let idle = row["idle_bytes_per_connection"].as_u64().unwrap();
        let ends = row["ends_here"].as_u64().unwrap();
        assert!(
            idle <= ends * PER_QP,
            "{transport}: {idle} octets per idle connection ({ends} QPs)"
        );
    }
}
