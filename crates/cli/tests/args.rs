//! The tools' command lines: `softrdma perf` refuses bad sizes, counts and options up front,
//! before anything is allocated or connected (one line naming the option and what it
//! accepts, exit status 2, never a panic, an abort or a silent clamp), and takes perftest's
//! flags with perftest's meaning; `rping` asks for a role by both its letters.

use std::process::Command;

/// Runs `softrdma TOOL ARGS`; its exit status, standard output and standard error.
fn tool(tool: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg(tool)
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn perf(args: &[&str]) -> (Option<i32>, String) {
    let (code, _, err) = tool("perf", args);
    (code, err)
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
        // perftest's flags outside what perf measures, or contradicting each other.
        (&["--loopback", "-c", "UD"], &["--connection", "UD", "RC"]),
        (&["--server", "-b"], &["-b", "HOST", "--loopback"]),
        (&["--server", "-q", "4"], &["-q", "HOST", "--loopback"]),
        (&["--loopback", "-b", "--lat"], &["-b", "--lat"]),
        (&["--loopback", "-b", "-q", "4"], &["-b", "-q"]),
        (
            &["--loopback", "-d", "mlx5_0"],
            &["--ib-dev", "mlx5_0", "softrdma_tcp0"],
        ),
        (
            &["--loopback", "-d", "rxe0", "--transport", "iwarp"],
            &["--ib-dev", "--transport"],
        ),
        (&["--loopback", "-e", "--busy"], &["--events", "--busy"]),
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
        // One line of error; clap adds only the usage and its pointer to --help after it.
        let rest: Vec<&str> = err
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(
            rest.iter()
                .all(|l| l.contains("--help") || l.starts_with("Usage: softrdma perf")),
            "{args:?}: more than one line: {err}"
        );
    }
}

/// perftest's flags, with perftest's meaning: -d picks the device (and so the transport),
/// -R connects through the connection manager, -c RC, -e sleeps on events, -F and
/// --report_gbits are accepted, --out_json writes the report into --out_json_file.
#[test]
fn perftest_flags_accepted_with_their_meaning() {
    let dir = std::env::temp_dir().join(format!("softrdma-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (dev, transport) in [
        ("siw0", "iwarp"),
        ("softrdma_tcp0", "iwarp"),
        ("rxe0", "roce"),
    ] {
        let json = dir.join(format!("{dev}.json"));
        let json_arg = json.to_str().unwrap();
        let (code, out, err) = tool(
            "perf",
            &[
                "--loopback",
                "-d",
                dev,
                "-R",
                "-F",
                "-e",
                "-c",
                "RC",
                "--report_gbits",
                "--out_json",
                "--out_json_file",
                json_arg,
                "-n",
                "20",
                "-s",
                "64",
                "--op",
                "write",
                "--bw",
            ],
        );
        assert_eq!(code, Some(0), "{dev}: {err}");
        assert!(out.contains("RDMA_Write BW"), "{dev}: {out}");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(v["transport"], transport, "{dev}");
        assert_eq!(v["completion_wait"], "block", "{dev}: -e sleeps on events");
        assert_eq!(v["bw"][0]["rdma"]["iters"], 20, "{dev}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// rping without -s or -c names both.
#[test]
fn rping_asks_for_either_role() {
    let (code, _, err) = tool("rping", &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.lines().any(|l| l.contains("-s") && l.contains("-c")),
        "{err}"
    );
}

/// RUST_LOG is honoured: the libraries' events on standard error when asked (the iWARP
/// connection's negotiation), nothing when not.
#[test]
fn rust_log_is_honoured() {
    let run = |log: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_softrdma"));
        c.args([
            "perf",
            "--loopback",
            "-n",
            "5",
            "-s",
            "64",
            "--op",
            "write",
            "--bw",
        ]);
        match log {
            Some(l) => c.env("RUST_LOG", l),
            None => c.env_remove("RUST_LOG"),
        };
        let out = c.output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let logged = run(Some("softrdma_iwarp=debug"));
    assert!(
        logged.contains("softrdma_iwarp") && logged.contains("MPA negotiated"),
        "{logged}"
    );
    assert!(!run(None).contains("softrdma_iwarp"));
}

/// `perf -a` prints each row as it completes; Ctrl-C (SIGINT) lets the row in progress
/// finish, prints the rows done and the table's end, and exits 130.
#[test]
fn rows_stream_and_ctrl_c_keeps_them() {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "perf",
            "--loopback",
            "-a",
            "-D",
            "0.05",
            "--op",
            "write",
            "--bw",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    // The first row arrives while the sweep (23 sizes) goes on.
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "ended early: {seen:?}"
        );
        let row = line.starts_with(" RDMA_Write BW");
        seen.push(line);
        if row {
            break;
        }
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running after its first row"
    );
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    let rows = seen
        .iter()
        .map(String::as_str)
        .chain(rest.lines())
        .filter(|l| l.starts_with(" RDMA_Write BW"))
        .count();
    assert!((1..23).contains(&rows), "{rows} rows: {rest}");
    assert!(rest.contains("MPA rev 2"), "the table's end: {rest}");
}

/// Errors name what failed: the address a server could not listen on, the address a
/// client could not reach.
#[test]
fn errors_name_the_address() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let (code, _, err) = tool("perf", &["--server", "-B", "127.0.0.1", "-p", &port]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.lines().count() == 1
            && err.contains(&format!("127.0.0.1:{port}"))
            && err.contains("-p"),
        "{err}"
    );
    // Nothing listens on the port after the held one's: the client says where it went.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let free = closed.local_addr().unwrap().port();
    drop(closed);
    let (code, _, err) = tool(
        "perf",
        &[
            "127.0.0.1",
            "-p",
            &free.to_string(),
            "--connect-timeout",
            "2",
            "-n",
            "2",
            "-s",
            "64",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.lines().count() == 1 && err.contains("127.0.0.1:"),
        "{err}"
    );
    drop(held);
}
