//! `softrdma perf --transport roce`: the loopback run (RoCE server and client in one process
//! beside raw UDP) from the library and from the binary (`--json`), a server and a client
//! in two processes, and the perftest client
//! (`--perftest --test write|read|atomic HOST`) against a perftest server written here from
//! docs/rxe-interop.md: the server half of perftest 6.06's TCP exchange, every message read
//! with its exact length, and a passive RC QP on a softrdma RoCE context.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;

use clap::Parser;
use softrdma::roce::{QpAttr, QpState};
use softrdma::roce::{RoceConfig, gid_to_ip};
use softrdma::*;
use softrdma_cli::perf::{self, PerfArgs, proto::Test};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

fn args(a: &[&str]) -> PerfArgs {
    let mut v = vec!["perf", "--transport", "roce"];
    v.extend_from_slice(a);
    Cli::try_parse_from(v).unwrap().perf
}

#[test]
fn loopback_every_test_from_the_library() {
    let r = perf::run_loopback(&args(&[
        "--loopback",
        "-n",
        "100",
        "-s",
        "4096",
        "-m",
        "1024",
    ]))
    .unwrap();
    assert_eq!(r.transport, "roce");
    let bw: Vec<Test> = r.bw.iter().map(|b| b.test).collect();
    assert_eq!(bw, [Test::WriteBw, Test::ReadBw, Test::SendBw]);
    let lat: Vec<Test> = r.lat.iter().map(|l| l.test).collect();
    assert_eq!(lat, [Test::WriteLat, Test::ReadLat, Test::SendLat]);
    for b in &r.bw {
        assert_eq!((b.bytes, b.rdma.iters, b.rdma.bytes), (4096, 100, 409_600));
        assert_eq!(b.raw_tcp.iters, 100, "the raw UDP baseline");
        assert!(b.rdma.gbit_s > 0.0 && b.raw_tcp.gbit_s > 0.0 && b.ratio > 0.0);
    }
    for l in &r.lat {
        assert_eq!(l.rdma.iters, 100);
        assert!(l.rdma.t_min <= l.rdma.t_typical && l.rdma.t_typical <= l.rdma.t_max);
        assert!(l.raw_tcp.t_typical > 0.0 && l.ratio > 0.0);
    }
    let info = r.roce.as_ref().unwrap();
    assert_eq!(info.pmtu, 1024);
    assert_eq!(info.bad_icrc, 0);
    assert!(info.packets >= 3 * 100 * 4, "{info:?}");
    let table = perf::render(&r);
    assert!(table.contains("RoCEv2"), "{table}");
    assert!(
        table.contains("raw UDP[Gb/s]") && !table.contains("raw TCP"),
        "{table}"
    );
}

#[test]
fn loopback_json_from_the_binary() {
    let v = common::softrdma_json(&[
        "perf",
        "--transport",
        "roce",
        "--loopback",
        "-n",
        "50",
        "--op",
        "write",
        "--json",
    ]);
    assert_eq!(v["transport"], "roce");
    assert_eq!(v["mode"], "loopback");
    assert_eq!(v["roce"]["pmtu"], 4096);
    let bw = &v["bw"][0];
    assert_eq!(bw["test"], "WriteBw");
    assert_eq!(bw["bytes"], 65536);
    assert_eq!(bw["rdma"]["iters"], 50);
    assert!(bw.get("raw_tcp").is_none(), "{bw}");
    let (g, u) = (
        bw["rdma"]["gbit_s"].as_f64().unwrap(),
        bw["raw_udp"]["gbit_s"].as_f64().unwrap(),
    );
    // Sane: positive, below what memory could copy, the ratio consistent.
    assert!(g > 0.0 && g < 1000.0 && u > 0.0 && u < 1000.0, "{bw}");
    assert!((bw["ratio"].as_f64().unwrap() - g / u).abs() < 1e-9);
    // The GSO baseline (Linux 4.18 and later have UDP_SEGMENT): all 50 messages acknowledged.
    let gso = &bw["raw_udp_gso"];
    assert_eq!(gso["iters"], 50, "{bw}");
    let x = gso["gbit_s"].as_f64().unwrap();
    assert!(x > 0.0 && x < 1000.0, "{bw}");
    assert!((bw["ratio_gso"].as_f64().unwrap() - g / x).abs() < 1e-9);
    let lat = &v["lat"][0];
    assert_eq!(lat["test"], "WriteLat");
    assert_eq!(lat["bytes"], 64);
    let t = lat["rdma"]["t_typical"].as_f64().unwrap();
    assert!(t > 0.0 && t < 100_000.0, "{lat}");
    assert!(lat["raw_udp"]["t_typical"].as_f64().unwrap() > 0.0);
}

#[test]
fn perftest_needs_a_server_over_iwarp() {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["perf", "--perftest", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

// ---- a perftest 6.06 server (no -R) -------------------------------------------------------

fn read_exact_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

/// Server side of `ctx_xchg_data`: read the client's message, then write ours.
fn xchg(s: &mut TcpStream, mine: &[u8]) -> Vec<u8> {
    let b = read_exact_n(s, mine.len());
    s.write_all(mine).unwrap();
    b
}

struct Dest {
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: [u8; 16],
}

/// `KEY_PRINT_FMT_GID`, checked field by field.
fn parse_dest(b: &[u8]) -> Dest {
    assert_eq!(b.len(), 108);
    assert_eq!(b[107], 0);
    let s = std::str::from_utf8(&b[..107]).unwrap();
    let f: Vec<&str> = s.split(':').collect();
    assert_eq!(f.len(), 24, "{s}");
    let widths = [4, 4, 6, 6, 8, 16];
    for (i, w) in widths.iter().enumerate() {
        assert_eq!(f[i].len(), *w, "field {i} of {s}");
    }
    for g in &f[6..22] {
        assert_eq!(g.len(), 2, "{s}");
    }
    assert_eq!(f[22], "00000000", "srqn");
    assert_eq!(f[23], "", "trailing colon");
    let h = |i: usize| u64::from_str_radix(f[i], 16).unwrap();
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = h(6 + i) as u8;
    }
    Dest {
        out_reads: h(1) as u32,
        qpn: h(2) as u32,
        psn: h(3) as u32,
        rkey: h(4) as u32,
        vaddr: h(5),
        gid,
    }
}

fn dest_msg(d: &Dest) -> Vec<u8> {
    let mut s = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
        0, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr
    );
    for b in d.gid {
        s.push_str(&format!("{b:02x}:"));
    }
    s.push_str("00000000:");
    let mut v = s.into_bytes();
    v.push(0);
    assert_eq!(v.len(), 108);
    v
}

/// What the server saw: the client's report (size, iters, bw_peak, bw_avg, msg_rate) and
/// its buffer afterwards.
struct Seen {
    size: u64,
    iters: u64,
    bw_avg: f64,
    msg_rate: f64,
    client_out_reads: u32,
    buf: Vec<u8>,
}

/// One perftest server session on `listener`, its RoCE QP on `ip`:4791.
fn perftest_server(listener: &TcpListener, ip: Ipv4Addr, test: &str) -> Seen {
    let ctx = Context::open_roce(RoceConfig::new(IpAddr::V4(ip))).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq)).unwrap();
    let len = 2 * 65536;
    let mr = pd
        .alloc_mr(
            len,
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    // 1. version, 2. cycle buffer and cache line, 3. MTU.
    let v = xchg(&mut s, b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
    assert_eq!(&v[..5], b"6.06\0");
    assert_eq!(xchg(&mut s, &4096u32.to_be_bytes()), 4096u32.to_be_bytes());
    assert_eq!(xchg(&mut s, &64u32.to_be_bytes()), 64u32.to_be_bytes());
    let m = xchg(&mut s, b"3\0");
    assert_eq!(&m, b"3\0", "the client's MTU (1024 by default)");
    // 4. The records, then RTR/RTS.
    let out_reads = if test == "write" { 1 } else { 128 };
    let me = Dest {
        out_reads,
        qpn: qp.qp_num(),
        psn: 0x4f5cee,
        rkey: mr.rkey().0,
        vaddr: mr.addr(0),
        gid: ctx.roce_gid().unwrap(),
    };
    let client = parse_dest(&read_exact_n(&mut s, 108));
    let want_reads = if test == "write" { 1 } else { 16 };
    assert_eq!(
        client.out_reads, want_reads,
        "{test}: the client's out_reads"
    );
    qp.set_remote(SocketAddr::new(gid_to_ip(&client.gid), 4791))
        .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: Some(1024),
        dest_qp: Some(client.qpn),
        rq_psn: Some(client.psn),
        max_dest_rd_atomic: Some(out_reads as u8),
        min_rnr_timer: Some(12),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(me.psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(client.out_reads as u8),
        ..QpAttr::default()
    })
    .unwrap();
    let msg = dest_msg(&me);
    s.write_all(&msg).unwrap();
    // 5., 6. the same records again; 7. the client's end of the run (this read blocks
    // while the traffic runs).
    for _ in 0..3 {
        let again = parse_dest(&xchg(&mut s, &msg));
        assert_eq!((again.qpn, again.psn), (client.qpn, client.psn));
    }
    // 8. The report, field by field, big-endian; our fields are garbage, as perftest's.
    let junk = 0x00007fc8b1476340u64.to_be_bytes();
    let mut f = Vec::new();
    for _ in 0..5 {
        f.push(u64::from_be_bytes(xchg(&mut s, &junk).try_into().unwrap()));
    }
    // 9. The last handshake; 10. "done" both ways.
    parse_dest(&xchg(&mut s, &msg));
    s.write_all(b"done\0").unwrap();
    let done = read_exact_n(&mut s, 5);
    assert_eq!(&done, b"done\0");
    Seen {
        size: f[0],
        iters: f[1],
        bw_avg: f64::from_bits(f[3]),
        msg_rate: f64::from_bits(f[4]),
        client_out_reads: client.out_reads,
        buf: mr.to_vec(),
    }
}

fn perftest_case(test: &str, net: u8, extra: &[&str]) -> (Seen, String) {
    let sip = Ipv4Addr::new(127, 0, net, 1);
    let cip = Ipv4Addr::new(127, 0, net, 2);
    let listener = TcpListener::bind((sip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    std::thread::scope(|sc| {
        let server = sc.spawn(|| perftest_server(&listener, sip, test));
        let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
            .args(["perf", "--transport", "roce", "--perftest", "--test", test])
            .args(["-p", &port, "-B", &cip.to_string(), "-x", "1"])
            .args(extra)
            .arg(sip.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen = server.join().unwrap();
        (seen, stdout)
    })
}

#[test]
fn perftest_write_client() {
    let (seen, out) = perftest_case("write", 41, &["-n", "30", "-s", "65536"]);
    assert_eq!((seen.size, seen.iters), (65536, 30));
    assert!(seen.bw_avg > 0.0 && seen.msg_rate > 0.0);
    assert_eq!(seen.client_out_reads, 1);
    // perftest's client writes random octets at the base address (64 KiB > half the cycle
    // buffer): the first 64 KiB changed, the second did not.
    assert!(seen.buf[..65536].iter().filter(|&&b| b != 0).count() > 60000);
    assert!(seen.buf[65536..].iter().all(|&b| b == 0));
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("65536 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(line.split_whitespace().nth(1), Some("30"), "{line}");
}

#[test]
fn perftest_read_client() {
    let (seen, out) = perftest_case("read", 42, &["-n", "20", "-s", "1000"]);
    assert_eq!((seen.size, seen.iters), (1000, 20));
    assert_eq!(seen.client_out_reads, 16);
    assert!(out.contains("RDMA_Read BW"), "{out}");
}

#[test]
fn perftest_atomic_client() {
    let (seen, _) = perftest_case("atomic", 43, &["-n", "100"]);
    assert_eq!((seen.size, seen.iters), (8, 100));
    // FETCH_AND_ADD of 1, the address moving by the cache line within the cycle buffer:
    // 100 increments over 64 words.
    let words: Vec<u64> = (0..64)
        .map(|k| u64::from_ne_bytes(seen.buf[k * 64..k * 64 + 8].try_into().unwrap()))
        .collect();
    assert_eq!(words.iter().sum::<u64>(), 100);
    assert_eq!((words[0], words[35], words[36]), (2, 2, 1));
}
