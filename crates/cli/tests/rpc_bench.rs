//! `softrdma rpc bench`: every measurement runs to the end on both RDMA transports (the
//! bench itself fails if a large call's data comes back short), and `--json` carries each
//! figure beside its TCP baseline and the plain RDMA Write of the same run.

mod common;

#[test]
fn rpc_bench_runs_on_both_transports() {
    for t in ["iwarp", "roce"] {
        let j = common::softrdma_json(&[
            "rpc",
            "bench",
            "--transport",
            t,
            "-D",
            "0.2",
            "-s",
            "65536",
            "--json",
        ]);
        assert_eq!(j["transport"], t);
        assert_eq!(j["size"], 65536);
        for side in ["rdma", "tcp"] {
            for k in ["null_per_s", "large_gbps", "args_gbps"] {
                let v = j[side][k].as_f64().unwrap_or(0.0);
                assert!(v > 0.0, "{t} {side} {k}: {v}");
            }
        }
        for k in [
            "rdma_write_gbps",
            "null_ratio",
            "large_ratio",
            "large_vs_write",
            "args_ratio",
        ] {
            assert!(j[k].as_f64().unwrap_or(0.0) > 0.0, "{t} {k}");
        }
    }
}

/// `--tests` runs only the tests named, `--only rdma` leaves out RPC over TCP and the plain
/// Write: the figures not measured are null in the JSON and "-" in the table, and
/// `--counters` follows the figures with the client QP's counters.
#[test]
fn rpc_bench_runs_the_tests_asked_for() {
    let j = common::softrdma_json(&[
        "rpc", "bench", "-D", "0.2", "-s", "65536", "--tests", "results", "--json",
    ]);
    assert!(j["rdma"]["large_gbps"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
    assert!(j["rdma_write_gbps"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
    for k in ["null_per_s", "args_gbps"] {
        assert!(j["rdma"][k].is_null() && j["tcp"][k].is_null(), "{k}: {j}");
    }
    assert!(j["null_ratio"].is_null(), "{j}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "rpc",
            "bench",
            "-D",
            "0.2",
            "--tests",
            "null",
            "--only",
            "rdma",
            "--counters",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.contains("NULL calls/s"))
        .unwrap_or_else(|| panic!("{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    let n = cells.len();
    assert_eq!(&cells[n - 2..], ["-", "-"], "{row}");
    assert!(cells[n - 3].parse::<f64>().unwrap() > 0.0, "{row}");
    assert!(
        !text.contains("results Gb/s") && !text.contains("plain RDMA Write"),
        "{text}"
    );
    let counters = String::from_utf8_lossy(&out.stderr);
    let sent = counters
        .lines()
        .find_map(|l| l.trim().strip_prefix("tx_units"))
        .unwrap_or_else(|| panic!("{counters}"));
    assert!(sent.trim().parse::<u64>().unwrap() > 0, "{counters}");
}

/// Sizes that are not a multiple of four: RPC over TCP returns the opaque with its XDR
/// padding, RPC-over-RDMA's Write chunk without it (RFC 8166 §3.4.4), and the bench takes
/// both as the whole result (it once counted the padding as data and failed every such run).
#[test]
fn rpc_bench_takes_results_that_need_xdr_padding() {
    for (t, size) in [("iwarp", 1001), ("roce", 65537), ("iwarp", 3)] {
        let j = common::softrdma_json(&[
            "rpc",
            "bench",
            "--transport",
            t,
            "-D",
            "0.1",
            "-s",
            &size.to_string(),
            "--tests",
            "results,args",
            "--json",
        ]);
        assert_eq!(j["size"], size);
        for side in ["rdma", "tcp"] {
            for k in ["large_gbps", "args_gbps"] {
                let v = j[side][k].as_f64().unwrap_or(0.0);
                assert!(v > 0.0, "{t} {size} {side} {k}: {v}");
            }
        }
    }
}
