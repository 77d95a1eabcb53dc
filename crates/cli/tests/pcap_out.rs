//! `--pcap FILE` (issue 13): what `perf`, `rping`, `pingpong`, `rpc bench`, `nfs` and
//! `nfsd` sent and received, written as a capture that `softrdma decode --strict` and tshark
//! both read — on both transports, with and without MPA CRCs, from the active and the
//! passive side.

mod common;

use std::collections::BTreeMap;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softrdma-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(args: &[&str]) -> (String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{args:?}: {o}\n{e}");
    (o, e)
}

/// `decode --strict --json`: must succeed (every check passed), one value per message.
fn decode_strict(path: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["decode", "--strict", "--json"];
    args.extend(extra);
    args.push(path.to_str().unwrap());
    let (out, _) = run(&args);
    out.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn opcode(r: &Value) -> u64 {
    r.pointer("/layers/rdmap/control/opcode_code")
        .or_else(|| r.pointer("/layers/ib/bth/opcode"))
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no opcode: {r}"))
}

/// Per frame, the opcodes both decoders see, in order; and the frames tshark marks
/// malformed (none expected).
fn agree_with_tshark(path: &Path, ours: &[Value], filter: &str, field: &str, extra: &[&str]) {
    let ts = common::tshark_fields(path, filter, &[field, "_ws.malformed"], extra);
    let theirs: BTreeMap<u64, Vec<u64>> = ts
        .iter()
        .map(|(f, m)| {
            assert!(m["_ws.malformed"].is_empty(), "tshark: frame {f} malformed");
            (*f, m[field].iter().map(|v| common::num(v)).collect())
        })
        .collect();
    let mut mine: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in ours.iter().filter(|r| r["proto"] != "MPA") {
        mine.entry(r["frame"].as_u64().unwrap())
            .or_default()
            .push(opcode(r));
    }
    assert!(!mine.is_empty(), "{}: no messages", path.display());
    assert_eq!(mine, theirs, "{}: opcodes per frame", path.display());
}

/// Payload octets of the messages with these opcodes.
fn payload(ours: &[Value], opcodes: &[u64]) -> u64 {
    ours.iter()
        .filter(|r| r["proto"] != "MPA" && opcodes.contains(&opcode(r)))
        .map(|r| {
            let l = &r["layers"];
            l.pointer("/ib/payload_len")
                .or_else(|| {
                    l["rdmap"]["body"]
                        .as_object()
                        .and_then(|b| b.values().next())
                        .and_then(|v| v.get("payload_len"))
                })
                .and_then(Value::as_u64)
                .unwrap_or(0)
        })
        .sum()
}

/// iWARP opcodes (RFC 5040 §4.3): Write, Read Response, Send.
const IW_WRITE: u64 = 0;
const IW_READ_RESP: u64 = 2;
const IW_SEND: u64 = 3;

#[test]
fn perf_iwarp_capture_decodes_strictly_and_as_tshark_reads_it() {
    let (n, size) = (4u64, 70_000u64);
    for crc in [false, true] {
        let path = tmp(&format!("perf-iwarp-crc{crc}.pcap"));
        let (n_s, size_s) = (n.to_string(), size.to_string());
        let mut args = vec!["perf", "--loopback", "--bw", "-n", &n_s, "-s", &size_s];
        args.extend(["--pcap", path.to_str().unwrap()]);
        if crc {
            args.push("--crc");
        }
        let (_, err) = run(&args);
        assert!(err.contains("frames written to"), "{err}");
        let ours = decode_strict(&path, &[]);
        // Every test's messages are all there, whole.
        for (op, what) in [
            (IW_WRITE, "Write"),
            (IW_READ_RESP, "Read Response"),
            (IW_SEND, "Send"),
        ] {
            let got = payload(&ours, &[op]);
            assert!(got >= n * size, "crc {crc}: {what}: {got} octets");
        }
        let crcs_ok = ours
            .iter()
            .flat_map(|r| r["checks"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["what"] == "crc" && c["ok"] == true)
            .count();
        if crc {
            assert!(crcs_ok > 0, "CRCs verified");
        } else {
            assert_eq!(crcs_ok, 0);
        }
        let mpa = ours.iter().filter(|r| r["proto"] == "MPA").count();
        assert!(mpa >= 2, "the MPA Request and Reply: {mpa}");
        agree_with_tshark(
            &path,
            &ours,
            "iwarp_ddp_rdmap",
            "iwarp_rdma.opcode",
            &["--disable-protocol", "rpcordma"],
        );
    }
}

#[test]
fn perf_roce_capture_decodes_strictly_and_as_tshark_reads_it() {
    let path = tmp("perf-roce.pcap");
    let args = [
        "perf",
        "--loopback",
        "--transport",
        "roce",
        "--bw",
        "-n",
        "4",
        "-s",
        "10000",
        "--pcap",
        path.to_str().unwrap(),
    ];
    let (_, err) = run(&args);
    // Loopback contexts share a UDP port other than 4791: the tool says which.
    let port = err
        .split("--roce-port ")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .unwrap_or_else(|| panic!("no port hint: {err}"));
    let ours = decode_strict(&path, &["--roce-port", port]);
    let icrcs = ours
        .iter()
        .flat_map(|r| r["checks"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["what"] == "icrc")
        .map(|c| c["ok"] == true)
        .collect::<Vec<_>>();
    assert!(icrcs.len() > 40 && icrcs.iter().all(|&ok| ok), "{icrcs:?}");
    // RDMA WRITE First/Middle/Last/Only; READ Response First/Middle/Last/Only; SEND.
    assert!(payload(&ours, &[6, 7, 8, 10]) >= 40_000);
    assert!(payload(&ours, &[13, 14, 15, 16]) >= 40_000);
    assert!(payload(&ours, &[0, 1, 2, 4]) >= 40_000);
    let decode_as = format!("udp.port=={port},infiniband");
    agree_with_tshark(
        &path,
        &ours,
        "infiniband",
        "infiniband.bth.opcode",
        &["-d", &decode_as],
    );
}

/// Messages per direction, in order, as (source, destination, summary).
fn per_direction(ours: &[Value]) -> BTreeMap<(String, String), Vec<String>> {
    let mut m: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for r in ours {
        let s = r["summary"].as_str().unwrap().to_string();
        m.entry((r["src"].to_string(), r["dst"].to_string()))
            .or_default()
            .push(s);
    }
    m
}

/// The passive side is tapped as the active one: server and client captures hold the same
/// messages each way (the order between directions is each side's own).
fn sides_agree(server: &[Value], client: &[Value], min: usize) {
    let (s, c) = (per_direction(server), per_direction(client));
    assert_eq!(s, c);
    let n: usize = s.values().map(Vec::len).sum();
    assert!(n >= min, "{n} messages");
}

#[test]
fn rping_server_and_client_captures_agree() {
    let (spcap, cpcap) = (tmp("rping-s.pcap"), tmp("rping-c.pcap"));
    let (server, port, _rest) = common::spawn_server(
        &[
            "rping",
            "-s",
            "-d",
            "-a",
            "127.0.0.1",
            "-p",
            "0",
            "--pcap",
            spcap.to_str().unwrap(),
        ],
        "rdma_listen on ",
    );
    let (_, cerr) = run(&[
        "rping",
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &port,
        "-C",
        "5",
        "-S",
        "1000",
        "-V",
        "--pcap",
        cpcap.to_str().unwrap(),
    ]);
    assert!(cerr.contains("frames written"), "{cerr}");
    let out = server.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (s, c) = (decode_strict(&spcap, &[]), decode_strict(&cpcap, &[]));
    // MPA Request and Reply, then per ping: Send, Read Request, Read Response, Send,
    // Send, Write, Send.
    sides_agree(&s, &c, 2 + 5 * 7);
    agree_with_tshark(
        &cpcap,
        &c,
        "iwarp_ddp_rdmap",
        "iwarp_rdma.opcode",
        &["--disable-protocol", "rpcordma"],
    );
}

#[test]
fn pingpong_server_and_client_captures_agree() {
    let (sip, cip) = ("127.0.77.1", "127.0.77.2");
    let (spcap, cpcap) = (tmp("pp-s.pcap"), tmp("pp-c.pcap"));
    let (server, port, _rest) = common::spawn_server(
        &[
            "pingpong",
            "--rc",
            "-n",
            "5",
            "-s",
            "3000",
            "-g",
            "1",
            "-p",
            "0",
            "--linger",
            "20",
            "--timeout",
            "30",
            "--pcap",
            spcap.to_str().unwrap(),
        ],
        "listening on ",
    );
    run(&[
        "pingpong",
        "--rc",
        "-n",
        "5",
        "-s",
        "3000",
        "-g",
        "1",
        "-p",
        &port,
        "--bind",
        cip,
        "--linger",
        "20",
        "--timeout",
        "30",
        "--pcap",
        cpcap.to_str().unwrap(),
        sip,
    ]);
    let out = server.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (s, c) = (decode_strict(&spcap, &[]), decode_strict(&cpcap, &[]));
    // 5 round trips of 3000 octets at PMTU 1024: three packets each way, acknowledged.
    sides_agree(&s, &c, 2 * 5 * 3);
    agree_with_tshark(&cpcap, &c, "infiniband", "infiniband.bth.opcode", &[]);
}

/// A file that cannot be created is refused before anything runs, naming it.
#[test]
fn unwritable_pcap_is_a_one_line_error() {
    let bad = "/nonexistent-dir/x.pcap";
    for args in [
        vec!["perf", "--loopback", "-n", "1", "--pcap", bad],
        vec!["rping", "-c", "-a", "127.0.0.1", "--pcap", bad],
        vec!["pingpong", "--rc", "--pcap", bad, "127.0.0.1"],
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(matches!(out.status.code(), Some(1 | 2)), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(bad), "{args:?}: {err}");
    }
}

/// The port hint a tool prints when RoCEv2 did not use 4791.
fn roce_port_hint(err: &str) -> Option<&str> {
    err.split("--roce-port ")
        .nth(1)
        .and_then(|s| s.split('`').next())
}

/// `rpc bench --pcap`: the RPC-over-RDMA calls and replies (inline, and with Write and
/// Reply chunks behind them) decode strictly over both transports, tshark agreeing.
#[test]
fn rpc_bench_capture_decodes() {
    for t in ["iwarp", "roce"] {
        let path = tmp(&format!("rpc-bench-{t}.pcap"));
        let (_, err) = run(&[
            "rpc",
            "bench",
            "--transport",
            t,
            "-D",
            "0.1",
            "-s",
            "20000",
            "--large-depth",
            "1",
            "-q",
            "2",
            "--pcap",
            path.to_str().unwrap(),
        ]);
        assert!(err.contains("frames written to"), "{t}: {err}");
        let extra: Vec<&str> = match (t, roce_port_hint(&err)) {
            ("roce", Some(p)) => vec!["--roce-port", p],
            ("roce", None) => panic!("no port hint: {err}"),
            _ => Vec::new(),
        };
        let ours = decode_strict(&path, &extra);
        let summary = |r: &Value| r["summary"].as_str().unwrap_or_default().to_owned();
        let calls = ours
            .iter()
            .filter(|r| summary(r).contains("RDMA_MSG") && summary(r).contains(" Call "))
            .count();
        let replies = ours
            .iter()
            .filter(|r| summary(r).contains(" Reply "))
            .count();
        assert!(
            calls > 10 && replies > 10,
            "{t}: {calls} calls, {replies} replies"
        );
        match t {
            "iwarp" => agree_with_tshark(
                &path,
                &ours,
                "iwarp_ddp_rdmap",
                "iwarp_rdma.opcode",
                &["--disable-protocol", "rpcordma"],
            ),
            _ => {
                let decode_as = format!("udp.port=={},infiniband", extra[1]);
                agree_with_tshark(
                    &path,
                    &ours,
                    "infiniband",
                    "infiniband.bth.opcode",
                    &["-d", &decode_as],
                );
            }
        }
    }
}

/// `nfsd --pcap` and `nfs --pcap`: a file put and got back over NFS/RDMA; both captures
/// decode strictly, name the NFSv3 procedures as tshark does (WRITE, READ), and hold the
/// same messages each way. The server's is written whole when SIGTERM stops it.
#[test]
fn nfs_and_nfsd_captures_agree() {
    use std::io::{BufRead, BufReader};
    let root = tmp("nfs-export");
    let export = root.join("e");
    std::fs::create_dir_all(&export).unwrap();
    let export = export.canonicalize().unwrap();
    let (spcap, cpcap) = (tmp("nfsd.pcap"), tmp("nfs.pcap"));
    let mut server = Command::new(BIN)
        .args(["nfsd", "--export"])
        .arg(&export)
        .args(["--bind", "127.0.0.1", "--rdma-port", "0", "--tcp-port", "0"])
        .args(["--no-portmap", "--pcap", spcap.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let (rdma, tcp) = common::nfsd_ports(&mut lines);
    let url = format!("nfs://127.0.0.1:{rdma}{}/f", export.display());
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    let src = root.join("src");
    std::fs::write(&src, &data).unwrap();
    let nfs = |args: &[&str], pcap: &Path| {
        let mut a = vec![
            "nfs",
            "-q",
            "--mount-port",
            &tcp,
            "--uid",
            "0",
            "--gid",
            "0",
        ];
        a.extend(["--pcap", pcap.to_str().unwrap()]);
        a.extend(args);
        run(&a)
    };
    nfs(&["put", src.to_str().unwrap(), &url], &cpcap);
    assert_eq!(std::fs::read(export.join("f")).unwrap(), data);
    let back = root.join("back");
    let cpcap2 = tmp("nfs-get.pcap");
    nfs(&["get", &url, back.to_str().unwrap()], &cpcap2);
    assert_eq!(std::fs::read(&back).unwrap(), data);
    // SIGTERM: the server stops cleanly and writes its capture whole.
    let _ = Command::new("kill").arg(server.id().to_string()).status();
    let status = server.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "nfsd: {status}: {err}");
    assert!(err.contains("frames written to"), "{err}");
    let s = decode_strict(&spcap, &[]);
    let (c_put, c_get) = (decode_strict(&cpcap, &[]), decode_strict(&cpcap2, &[]));
    let named = |v: &[Value], what: &str| {
        v.iter()
            .filter(|r| r["summary"].as_str().unwrap_or_default().contains(what))
            .count()
    };
    assert!(
        named(&c_put, "NFS V3 WRITE Call") > 0,
        "the client's WRITE calls"
    );
    assert!(
        named(&c_get, "NFS V3 READ Call") > 0,
        "the client's READ calls"
    );
    assert!(named(&s, "NFS V3 WRITE Reply") > 0 && named(&s, "NFS V3 READ Reply") > 0);
    // The server saw both client connections: every message of each, each way.
    let mut both = c_put.clone();
    both.extend(c_get.iter().cloned());
    assert_eq!(
        s.len(),
        both.len(),
        "messages in the server's capture and the clients'"
    );
    agree_with_tshark(
        &spcap,
        &s,
        "iwarp_ddp_rdmap",
        "iwarp_rdma.opcode",
        &["--disable-protocol", "rpcordma"],
    );
}
