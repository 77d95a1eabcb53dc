//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bundled captures (copies of ../shared/captures).
pub fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures")
}

pub fn captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .expect("fixtures/captures exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    v.sort();
    v
}

/// Per frame, per field: every occurrence tshark reports (`-E occurrence=a`).
pub type TsharkFields = BTreeMap<u64, BTreeMap<String, Vec<String>>>;

/// Run tshark over `file` and collect `fields` for frames matching `filter`.
/// `extra` are extra tshark arguments (e.g. `--disable-protocol rpcordma`).
pub fn tshark_fields(file: &Path, filter: &str, fields: &[&str], extra: &[&str]) -> TsharkFields {
    let mut cmd = Command::new("tshark");
    cmd.arg("-n").arg("-r").arg(file).arg("-Y").arg(filter);
    // Heuristic dissectors (MPA's among them) before port numbers: an ephemeral port that is
    // another protocol's (44322, pmproxy) would otherwise take an iWARP stream from MPA.
    cmd.args(["-o", "tcp.try_heuristic_first:TRUE"]);
    cmd.args(extra);
    cmd.args([
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ]);
    cmd.args(["-e", "frame.number"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("tshark is needed for this test (apt-get install tshark; .ci/run installs it): {e}")
    });
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut m = TsharkFields::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let frame: u64 = cols[0].parse().expect("frame number");
        let e = m.entry(frame).or_default();
        for (i, f) in fields.iter().enumerate() {
            let v = cols.get(i + 1).copied().unwrap_or("");
            let vals: Vec<String> = if v.is_empty() {
                Vec::new()
            } else {
                v.split(',').map(str::to_string).collect()
            };
            e.insert((*f).to_string(), vals);
        }
    }
    m
}

/// Parse a tshark number ("0x1c", "28", "True") to u64 for comparison.
pub fn num(s: &str) -> u64 {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("hex {s}"))
    } else if s == "True" || s == "1" && s.len() == 1 {
        1
    } else if s == "False" {
        0
    } else {
        s.parse().unwrap_or_else(|_| panic!("number {s}"))
    }
}

/// Runs the `softrdma` binary with `args`, which must succeed (its stderr is the failure
/// message) and print one JSON document: that document.
pub fn softrdma_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "softrdma {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Starts `softrdma ARGS` as a server and waits for the standard-output line that starts
/// with `ready` and names its port (`... on ADDR:PORT`); the rest of its standard output is
/// read by a thread and returned when joined (the server exited).
pub fn spawn_server(
    args: &[&str],
    ready: &str,
) -> (std::process::Child, String, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = loop {
        let l = lines.next().expect("server output").unwrap();
        if let Some(a) = l.strip_prefix(ready) {
            break a.rsplit(':').next().unwrap().to_string();
        }
    };
    let rest = std::thread::spawn(move || lines.map(|l| l.unwrap() + "\n").collect::<String>());
    (child, port, rest)
}

/// A free port on 127.0.0.1 whose successor is free too (perf's raw baseline port).
pub fn free_ports() -> u16 {
    softrdma::spare_ports(&[std::net::Ipv4Addr::LOCALHOST.into()], 2).unwrap()
}

/// Reads `softrdma nfsd`'s standard output until it named its ports: (NFS/RDMA, TCP).
pub fn nfsd_ports(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> (String, String) {
    let port_of = |l: &str| {
        let last = l.rsplit(':').next().unwrap_or_default();
        last.split(' ').next().unwrap_or_default().to_string()
    };
    let (mut rdma, mut tcp) = (None, None);
    while rdma.is_none() || tcp.is_none() {
        let l = lines.next().expect("nfsd output ended").unwrap();
        if l.starts_with("softrdma nfsd: NFS/RDMA on ") {
            rdma = Some(port_of(&l));
        } else if l.starts_with("softrdma nfsd: NFS and MOUNT over TCP on ") {
            tcp = Some(port_of(&l));
        }
    }
    (rdma.unwrap_or_default(), tcp.unwrap_or_default())
}

/// pcap image `img` without the frames numbered (from 1) in `drop`.
pub fn without(img: &[u8], drop: &[u64]) -> Vec<u8> {
    use pcap_file::pcap::{PcapReader, PcapWriter};
    let mut rd = PcapReader::new(std::io::Cursor::new(img)).unwrap();
    let mut out = Vec::new();
    let mut w = PcapWriter::with_header(&mut out, rd.header()).unwrap();
    let mut frame = 0;
    while let Some(p) = rd.next_packet() {
        frame += 1;
        let p = p.unwrap();
        if !drop.contains(&frame) {
            w.write_packet(&p).unwrap();
        }
    }
    w.into_writer();
    out
}

/// The frame of the last MPA startup frame (Request or Reply) a decode found.
pub fn last_startup_frame(out: &softrdma_cli::decode::Output) -> u64 {
    out.records
        .iter()
        .filter(|r| r.proto == "MPA")
        .map(|r| r.frame)
        .max()
        .expect("an MPA startup frame")
}
