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
