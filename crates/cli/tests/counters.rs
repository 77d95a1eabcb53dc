//! `--counters` (issue 13): per-QP and per-device counters from `rping`, `pingpong` and
//! `perf`, checked against what the run must have sent and received.

mod common;

use std::collections::HashMap;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// The counter blocks of a tool's output: heading → (name → value).
fn blocks(out: &str) -> HashMap<String, HashMap<String, u64>> {
    let mut m: HashMap<String, HashMap<String, u64>> = HashMap::new();
    let mut cur: Option<String> = None;
    for l in out.lines() {
        if l.ends_with("counters:") {
            // "QP 0x1 (client) counters:" → "client"; "device NAME (iWARP) counters:" →
            // "device".
            let key = if l.starts_with("device") {
                "device".to_string()
            } else {
                l.split(['(', ')']).nth(1).unwrap().to_string()
            };
            cur = Some(key);
            continue;
        }
        let mut w = l.split_whitespace();
        match (&cur, w.next(), w.next().and_then(|v| v.parse::<u64>().ok())) {
            (Some(c), Some(k), Some(v)) if l.starts_with("  ") => {
                m.entry(c.clone()).or_default().insert(k.to_string(), v);
            }
            _ => cur = None,
        }
    }
    m
}

fn output(c: Command) -> String {
    let mut c = c;
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// rping over iWARP, 5 pings of 1000 octets. Per ping the client sends its source (Send),
/// answers the server's Read (one Read Response, under the MULPDU) and sends its sink
/// (Send): 3 ULPDUs; it receives the Read Request, the go-ahead Send, the server's Write
/// and the last Send: 4. The server counts the mirror image, and the devices agree on the
/// octets that crossed.
#[test]
fn rping_counters_count_every_message_both_sides() {
    let (pings, size) = (5u64, 1000u64);
    let (mut server, port, rest) = common::spawn_server(
        &[
            "rping",
            "-s",
            "-d",
            "-a",
            "127.0.0.1",
            "-p",
            "0",
            "--counters",
        ],
        "rdma_listen on ",
    );
    let mut c = Command::new(BIN);
    c.args([
        "rping",
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &port,
        "-V",
        "--counters",
    ]);
    c.args(["-C", &pings.to_string(), "-S", &size.to_string()]);
    let cout = output(c);
    assert!(server.wait().unwrap().success());
    let sout = rest.join().unwrap();
    let (cb, sb) = (blocks(&cout), blocks(&sout));
    let (cq, sq) = (&cb["client"], &sb["server"]);
    assert_eq!(cq["tx_units"], 3 * pings, "{cout}");
    assert_eq!(cq["rx_units"], 4 * pings, "{cout}");
    assert_eq!(sq["tx_units"], cq["rx_units"], "{sout}");
    assert_eq!(sq["rx_units"], cq["tx_units"], "{sout}");
    // The client's payload: the Read Responses and two 16-octet Sends a ping.
    assert_eq!(cq["payload_tx"], pings * (size + 2 * 16));
    assert_eq!(sq["payload_rx"], cq["payload_tx"]);
    for q in [cq, sq] {
        assert_eq!(q["errors_tx"] + q["errors_rx"] + q["dropped"], 0);
    }
    let (cd, sd) = (&cb["device"], &sb["device"]);
    assert_eq!(
        (cd["connects"], cd["accepts"], cd["established"]),
        (1, 0, 1)
    );
    assert_eq!(
        (sd["connects"], sd["accepts"], sd["established"]),
        (0, 1, 1)
    );
    assert_eq!(cd["octets_tx"], sd["octets_rx"]);
    assert_eq!(cd["octets_rx"], sd["octets_tx"]);
    // What crossed is at least the payload, plus headers.
    assert!(cd["octets_tx"] > cq["payload_tx"]);
}

/// RC pingpong over RoCE: the requester sends each 3000-octet message as three packets at
/// PMTU 1024; the device counts at least what its QP sent.
#[test]
fn pingpong_counters_count_packets() {
    let (iters, size) = (5u64, 3000u64);
    let (sip, cip) = ("127.0.78.1", "127.0.78.2");
    let common = [
        "pingpong",
        "--rc",
        "-n",
        "5",
        "-s",
        "3000",
        "-g",
        "1",
        "--linger",
        "20",
        "--timeout",
        "30",
        "--counters",
    ];
    let (mut server, port, _rest) =
        common::spawn_server(&[&common[..], &["-p", "0"]].concat(), "listening on ");
    let mut c = Command::new(BIN);
    c.args(common).args(["-p", &port, "--bind", cip, sip]);
    let cout = output(c);
    assert!(server.wait().unwrap().success());
    let b = blocks(&cout);
    let (q, d) = (&b["client"], &b["device"]);
    let packets = iters * size.div_ceil(1024);
    assert_eq!(q["requester.packets"], packets, "{cout}");
    assert_eq!(q["requester.retransmitted"], 0);
    // Its requests, and the server's (the pongs) it accepted, and their ACKs.
    assert!(q["header.accepted"] >= packets, "{cout}");
    assert!(d["tx_packets"] >= q["tx_units"], "{cout}");
    assert_eq!(d["bad_icrc"], 0);
}

/// perf --counters --json: a QP per test with its name, the device's octets.
#[test]
fn perf_counters_in_json() {
    let mut c = Command::new(BIN);
    c.args(["perf", "--loopback", "--bw", "-n", "3", "-s", "8192"]);
    c.args(["--counters", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&output(c)).unwrap();
    let qps = v["counters"]["qps"].as_array().unwrap();
    let tests: Vec<&str> = qps.iter().map(|q| q["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["RDMA_Write BW", "RDMA_Read BW", "Send BW"]);
    let payload_tx: u64 = qps
        .iter()
        .map(|q| {
            q["counters"]["detail"]["Iwarp"]["payload_tx"]
                .as_u64()
                .unwrap()
        })
        .sum();
    // Writes and Sends of at least 3 × 8192 octets each (and any warm-up).
    assert!(payload_tx >= 2 * 3 * 8192, "{payload_tx}");
    let dev = &v["counters"]["device"]["Iwarp"];
    assert!(dev["octets_tx"].as_u64().unwrap() > payload_tx);
    assert!(dev["established"].as_u64().unwrap() >= 3);
}
