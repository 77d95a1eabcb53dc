//! `softrdma rping -s` against `softrdma rping -c` over loopback, iWARP and RoCE: rping's exchange (Send of
//! the source, RDMA Read, go ahead, Send of the sink, RDMA Write, go ahead) with the data
//! verified on both sides (`-V`), through the library and through the binary's flags.
//!
//! No sleeps: the binary test learns the server's port from its `-d` output and waits for
//! processes to exit; timeouts are safety nets only.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use softrdma::roce::RoceConfig;
use softrdma::{Context, Device};
use softrdma_cli::rping::{self, Opts, Stats};

const SAFETY: Duration = Duration::from_secs(60);

fn opts(size: u32, count: u64) -> Opts {
    Opts {
        count,
        size,
        verbose: true,
        validate: true,
        timeout: Some(SAFETY),
        ..Opts::default()
    }
}

fn roce(cfg: RoceConfig) -> Context {
    Device::roce(cfg).open().unwrap()
}

/// A server and a client context in one process, at rping's smallest and largest sizes and
/// between, every ping verified by both sides: iWARP, then RoCE (the server on 127.0.0.1,
/// the client on 127.0.0.2).
#[test]
fn library_server_and_client_verify_every_size() {
    let sizes = [
        (23u32, 3u64),
        (26, 3),
        (64, 10),
        (1000, 5),
        (4096, 5),
        (65535, 3),
    ];
    let iwarp = sizes.map(|s| (s, false));
    let roce_runs = sizes.map(|s| (s, true));
    for ((size, count), roce_dev) in iwarp.into_iter().chain(roce_runs) {
        let (server_ctx, client_ctx) = if roce_dev {
            let ips = ["127.0.0.1", "127.0.0.2"].map(|ip| ip.parse().unwrap());
            let c = RoceConfig::sharing_a_port(&ips).unwrap();
            (roce(c[0]), roce(c[1]))
        } else {
            (Context::open().unwrap(), Context::open().unwrap())
        };
        let listener = rping::listen(&server_ctx, Some("127.0.0.1"), 0, false).unwrap();
        let addr = listener.local_addr();
        let (sres, cres, sout, cout) = std::thread::scope(|s| {
            let server = s.spawn(|| {
                let mut out = Vec::new();
                let r = rping::serve_one(&server_ctx, &listener, &opts(size, 0), &mut out);
                (r, out)
            });
            let mut cout = Vec::new();
            let cres = rping::client(&client_ctx, addr, &opts(size, count), &mut cout);
            let (sres, sout) = server.join().unwrap();
            (sres, cres, sout, cout)
        });
        let want = Stats {
            pings: count,
            verified: count,
        };
        assert_eq!(cres.unwrap(), want, "client, size {size}");
        assert_eq!(sres.unwrap(), want, "server, size {size}");
        let cout = String::from_utf8(cout).unwrap();
        let sout = String::from_utf8(sout).unwrap();
        for i in 0..count {
            let text =
                String::from_utf8(rping::pattern(i, size as usize)[..size as usize - 1].to_vec())
                    .unwrap();
            let line = format!("ping data: {text}");
            assert_eq!(
                cout.lines().nth(i as usize),
                Some(line.as_str()),
                "size {size}"
            );
            let line = format!("server ping data: {text}");
            assert_eq!(
                sout.lines().nth(i as usize),
                Some(line.as_str()),
                "size {size}"
            );
        }
    }
}

/// Over the CLI with rping's flags: `softrdma rping -s -a 127.0.0.1 -p 0 -V -v -d` and
/// `softrdma rping -c -a 127.0.0.1 -p PORT -C 10 -S 1000 -V -v`, both exit 0, every ping
/// printed and verified; with MPA CRC asked for by the client.
#[test]
fn binary_server_against_binary_client() {
    let rest = binary_pair(&[], &["--crc"]);
    assert!(rest.iter().any(|l| l.contains("CRC true")), "{rest:?}");
}

/// The same over RoCE: `--transport roce`, the client on 127.0.0.2 (`-I`), both on UDP
/// UDP port the system picks for the server (`--roce-port 0`), which the client then uses
/// on its own address (RoCE peers are sent to at one's own port).
#[test]
fn binary_server_against_binary_client_over_roce() {
    let roce = ["--transport", "roce", "--roce-port", "0"];
    let client = [
        "--transport",
        "roce",
        "-I",
        "127.0.0.2",
        "--roce-port",
        "{roce}",
    ];
    let rest = binary_pair(&roce, &client);
    assert!(rest.iter().any(|l| l.contains("RoCE QPN")), "{rest:?}");
}

/// Runs the binary's server and client (with `server_extra` and `client_extra` flags) and
/// checks both; the server's output after its port line.
fn binary_pair(server_extra: &[&str], client_extra: &[&str]) -> Vec<String> {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let mut server = Command::new(bin)
        .args([
            "rping",
            "-s",
            "-a",
            "127.0.0.1",
            "-p",
            "0",
            "-V",
            "-v",
            "-d",
        ])
        .args(server_extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let server_pid = server.id();
    // Safety net: kill a hung server (by its pid) after SAFETY.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(SAFETY).is_err() {
            let _ = Command::new("kill").arg(server_pid.to_string()).status();
        }
    });
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let mut roce_port = String::new();
    let port = loop {
        let line = lines.next().expect("server output ended").unwrap();
        if let Some(a) = line.strip_prefix("RoCE device on ") {
            roce_port = a.rsplit(':').next().unwrap().to_string();
        }
        if let Some(a) = line.strip_prefix("rdma_listen on ") {
            break a.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        }
    };
    let client_extra: Vec<String> = client_extra
        .iter()
        .map(|a| a.replace("{roce}", &roce_port))
        .collect();
    let client = Command::new(bin)
        .args(["rping", "-c", "-a", "127.0.0.1", "-p", &port.to_string()])
        .args(["-C", "10", "-S", "1000", "-V", "-v", "--timeout", "60"])
        .args(&client_extra)
        .output()
        .unwrap();
    let cout = String::from_utf8(client.stdout).unwrap();
    assert!(
        client.status.success(),
        "client failed: {cout}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = server.wait().unwrap();
    let _ = done_tx.send(());
    watchdog.join().unwrap();
    assert!(status.success(), "server: {rest:?}");
    let pings: Vec<&str> = cout
        .lines()
        .filter(|l| l.starts_with("ping data: "))
        .collect();
    assert_eq!(pings.len(), 10, "{cout}");
    for (i, l) in pings.iter().enumerate() {
        let text = String::from_utf8(rping::pattern(i as u64, 1000)[..999].to_vec()).unwrap();
        assert_eq!(l.strip_prefix("ping data: "), Some(text.as_str()));
    }
    assert_eq!(
        rest.iter()
            .filter(|l| l.starts_with("server ping data: rdma-ping-"))
            .count(),
        10,
        "{rest:?}"
    );
    assert!(
        rest.iter().any(|l| l == "server: 10 pings, 10 verified"),
        "{rest:?}"
    );
    rest
}

/// rping's size limits are refused before anything connects.
#[test]
fn sizes_outside_rpings_range_are_refused() {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    for size in ["22", "65536"] {
        let out = Command::new(bin)
            .args(["rping", "-c", "-a", "127.0.0.1", "-S", size])
            .output()
            .unwrap();
        assert!(!out.status.success(), "-S {size} accepted");
        // Refused as an argument, not by a connection that failed.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid value"), "-S {size}: {err}");
    }
}
