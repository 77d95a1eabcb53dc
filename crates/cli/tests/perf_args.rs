//! `softrdma perf` refuses bad sizes, counts and options up front, before anything is
//! allocated or connected: one line naming the option and what it accepts, exit status 2,
//! never a panic, an abort or a silent clamp.

use std::process::Command;

/// Runs `softrdma perf ARGS`; its exit status and standard error.
fn perf(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("perf")
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_sizes_counts_and_options_are_refused_up_front() {
    // (arguments, what the error must name)
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--loopback", "-s", "4294967295"],
            &["--size", "1..=1073741824"],
        ),
        (&["--loopback", "-s", "0"], &["--size", "1..=1073741824"]),
        (&["--loopback", "-s", "-1"], &["--size", "-1"]),
        (&["--loopback", "-n", "0"], &["--iters", "0"]),
        (&["--loopback", "-t", "0"], &["--tx-depth", "1..=16383"]),
        (&["--loopback", "-t", "16384"], &["--tx-depth", "1..=16383"]),
        (&["--loopback", "-r", "0"], &["--rx-depth", "4..=65536"]),
        (&["--loopback", "-D", "0"], &["--duration", "above 0"]),
        (&["--loopback", "-D", "nan"], &["--duration", "above 0"]),
        (&["--loopback", "--fpdu", "0"], &["--fpdu", "128 to 64768"]),
        (
            &["--loopback", "--fpdu", "70000"],
            &["--fpdu", "128 to 64768"],
        ),
        (&["--loopback", "-q", "0"], &["--qp", "1..=65536"]),
        (&["--loopback", "--once"], &["--once", "--server"]),
        (
            &["--loopback", "-m", "1024"],
            &["--mtu", "--transport roce"],
        ),
        (
            &["--loopback", "--no-gso"],
            &["--no-gso", "--transport roce"],
        ),
        (
            &["--loopback", "--transport", "roce", "--crc"],
            &["--crc", "--transport iwarp"],
        ),
        (
            &["--loopback", "--transport", "roce", "--fpdu", "largest"],
            &["--fpdu", "--transport iwarp"],
        ),
        (
            &["--loopback", "--transport", "roce", "-m", "1000"],
            &["--mtu", "4096", "1000"],
        ),
        (&["-s", "64"], &["--loopback", "--server", "HOST"]),
    ];
    for (args, names) in cases {
        let (code, err) = perf(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{args:?}: {err}"
        );
        let first = err.lines().next().unwrap_or_default();
        for n in *names {
            assert!(first.contains(n), "{args:?}: {n:?} not in {first:?}");
        }
        // One line of error; clap adds only its pointer to --help after it.
        let rest: Vec<&str> = err
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(
            rest.iter().all(|l| l.contains("--help")),
            "{args:?}: more than one line: {err}"
        );
    }
}
