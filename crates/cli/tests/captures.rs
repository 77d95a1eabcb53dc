//! Done-when #1 of issue 2: every packet of every bundled Linux capture decodes
//! with no error, every MPA CRC and ICRC present verifies, and every parsed
//! header re-emits to the captured octets.

mod common;

use softrdma_cli::decode::{Options, Output, capture, decode_bytes, decode_file};

fn decode(name: &str) -> Output {
    decode_file(&common::captures_dir().join(name), &Options::default()).expect("capture reads")
}

fn count(out: &Output, proto: &str) -> usize {
    out.records.iter().filter(|r| r.proto == proto).count()
}

fn checks<'a>(out: &'a Output, what: &'a str) -> impl Iterator<Item = Option<bool>> + 'a {
    out.records.iter().flat_map(move |r| {
        r.checks
            .iter()
            .filter(move |c| c.what == what)
            .map(|c| c.ok)
    })
}

/// Walk the whole folder: nothing fails, and each file yields RDMA messages.
#[test]
fn every_capture_decodes_verifies_and_reemits() {
    let files = common::captures();
    assert!(
        files.len() >= 40,
        "expected the bundled capture set, found {}",
        files.len()
    );
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let out = decode_file(&f, &Options::default()).expect("capture reads");
        assert!(out.frames > 0, "{name}: no frames");
        for r in &out.records {
            assert!(
                r.errors.is_empty(),
                "{name}: frame {}: {:?}",
                r.frame,
                r.errors
            );
            for c in &r.checks {
                assert_ne!(
                    c.ok,
                    Some(false),
                    "{name}: frame {}: {} failed: {}",
                    r.frame,
                    c.what,
                    c.detail
                );
            }
        }
        assert!(
            out.stream_errors.is_empty(),
            "{name}: {:?}",
            out.stream_errors
        );
        let rdma = count(&out, "iWARP") + count(&out, "RoCEv2");
        assert!(rdma > 0, "{name}: no RDMA message decoded");
        // Every RDMA message went through the re-emit check.
        let reemits = out
            .records
            .iter()
            .filter(|r| r.proto != "TCP" && r.proto != "UDP")
            .filter(|r| {
                r.checks
                    .iter()
                    .any(|c| c.what == "reemit" && c.ok == Some(true))
            })
            .count();
        assert_eq!(
            reemits,
            out.records.len(),
            "{name}: a message skipped the re-emit check"
        );
    }
}

/// MPA-32/MPA-34 on real traffic: siw built with SIW_MPA_CRC=1 puts a real
/// CRC32c on every FPDU and each one verifies; without it the check does not apply.
#[test]
fn mpa_32_real_crcs_verify_and_unnegotiated_ones_are_not_checked() {
    for name in ["siw-crc-rping.pcap", "siw-crc-ib_write_bw.pcap"] {
        let out = decode(name);
        let crcs: Vec<_> = checks(&out, "crc").collect();
        assert_eq!(crcs.len(), count(&out, "iWARP"), "{name}");
        assert!(crcs.len() >= 20, "{name}: {} FPDUs", crcs.len());
        assert!(crcs.iter().all(|c| *c == Some(true)), "{name}");
    }
    let out = decode("siw-rping.pcap");
    assert!(checks(&out, "crc").all(|c| c.is_none()));
}

/// EXT-ROCE-02 on real traffic: every rxe packet's ICRC verifies.
#[test]
fn ext_roce_02_every_rxe_icrc_verifies() {
    for f in common::captures() {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        if !(name.starts_with("rxe-") || name.ends_with("-rxe.pcap")) {
            continue;
        }
        let out = decode(&name);
        let icrc: Vec<_> = checks(&out, "icrc").collect();
        assert_eq!(icrc.len(), count(&out, "RoCEv2"), "{name}");
        assert!(
            !icrc.is_empty() && icrc.iter().all(|c| *c == Some(true)),
            "{name}"
        );
    }
}

/// What the INDEX says each capture shows is what the decoder finds.
#[test]
fn message_kinds_match_the_capture_index() {
    let has = |out: &Output, needle: &str| out.records.iter().any(|r| r.summary.contains(needle));
    let siw = decode("siw-rping.pcap");
    for k in [
        "MPA Request rev 2",
        "MPA Reply rev 2",
        "IRD 1 ORD 1",
        "RDMA Read Request",
        "RDMA Read Response",
        "RDMA Write",
        "Send QN 0",
    ] {
        assert!(has(&siw, k), "siw-rping: {k}");
    }
    assert!(has(&decode("siw-mpa1-ucmatose.pcap"), "MPA Request rev 1"));
    assert!(has(&decode("siw-send_inv.pcap"), "Send with Invalidate"));
    let t = decode("siw-terminate-bad_write.pcap");
    assert!(
        has(&t, "Terminate") && has(&t, "Linux siw layout"),
        "siw Terminate layout recognised"
    );
    let rxe = decode("rxe-rping.pcap");
    for k in [
        "CM ConnectRequest",
        "CM ConnectReply",
        "CM ReadyToUse",
        "RC Send Only",
        "RC Acknowledge",
        "RDMA Read Request",
        "RDMA Read Response Only",
        "RDMA Write Only",
    ] {
        assert!(has(&rxe, k), "rxe-rping: {k}");
    }
    // The CM messages' own fields (IBA §12.6): rping's port 7174 in the TCP port space,
    // the QPN and PSN the REQ proposes, the connection ids REP and RTU echo.
    for k in [
        "(RDMA_PS_TCP port 7174) 10.77.0.3:",
        "RC resp_res 1 init_depth 1",
        "CM DisconnectRequest",
        "CM DisconnectReply",
    ] {
        assert!(has(&rxe, k), "rxe-rping: {k}");
    }
    let udaddy = decode("rxe-udaddy.pcap");
    for k in [
        "(RDMA_PS_UDP port",
        "CM ServiceIDResReqResp",
        "status 0 QPN",
    ] {
        assert!(has(&udaddy, k), "rxe-udaddy: {k}");
    }
    let atomic = decode("rxe-ib_atomic_bw-cmp_swap.pcap");
    assert!(has(&atomic, "RC CmpSwap") && has(&atomic, "RC Atomic Acknowledge"));
    assert!(has(&decode("rxe-rnr_nak.pcap"), "RNR NAK"));
    assert!(has(
        &decode("rxe-bad_rkey_write.pcap"),
        "NAK remote access error"
    ));
    assert!(has(&decode("rxe-ud_pingpong.pcap"), "UD Send Only"));
    assert!(has(&decode("rxe-send_inv.pcap"), "invalidate R_Key"));
    assert!(has(&decode("rxe-write_imm.pcap"), "imm 0x"));
}

/// RPC-over-RDMA in Sends, both transports: the NFS captures' RDMA_MSG and
/// RDMA_NOMSG headers and the ONC RPC calls and replies inside.
#[test]
fn rpc_over_rdma_decodes_on_both_transports() {
    // (file, calls, replies, RDMA_NOMSG replies), as INDEX.md counts them.
    for (name, calls, replies, nomsgs) in [
        ("nfs3-rdma-siw.pcap", 20, 20, 2),
        ("nfs3-rdma-rxe.pcap", 20, 20, 2),
        ("nfs42-rdma-rxe.pcap", 37, 37, 5),
    ] {
        let out = decode(name);
        let rpc: Vec<_> = out
            .records
            .iter()
            .filter(|r| r.layers.contains_key("rpcrdma"))
            .collect();
        assert_eq!(rpc.len(), calls + replies, "{name}");
        let nomsg = rpc
            .iter()
            .filter(|r| r.summary.contains("RDMA_NOMSG"))
            .count();
        assert_eq!(nomsg, nomsgs, "{name}");
        assert!(
            rpc.iter().any(|r| r.summary.contains("read list")),
            "{name}"
        );
        assert!(
            rpc.iter().any(|r| r.summary.contains("write list")),
            "{name}"
        );
        assert!(
            rpc.iter().any(|r| r.summary.contains("reply chunk")),
            "{name}"
        );
        assert!(
            rpc.iter()
                .any(|r| r.summary.contains(" | NFS V") && r.summary.contains(" Call xid ")),
            "{name}"
        );
        assert_eq!(
            rpc.iter()
                .filter(|r| r.summary.contains("credits 128"))
                .count(),
            calls,
            "{name}"
        );
        assert_eq!(
            rpc.iter()
                .filter(|r| r.summary.contains("credits 64"))
                .count(),
            replies,
            "{name}"
        );
        // Every reply is named after its call (xid tracking, as tshark does), the call
        // an earlier frame; RDMA_NOMSG replies too.
        let named: Vec<_> = rpc
            .iter()
            .filter(|r| r.summary.contains(" Reply (Call In "))
            .collect();
        assert_eq!(named.len(), replies, "{name}");
        for r in &named {
            let call: u64 = r.summary.rsplit("Call In ").next().unwrap()[..]
                .split(')')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(call < r.frame, "{name}: {}", r.summary);
        }
        if name.starts_with("nfs3") {
            assert!(
                named
                    .iter()
                    .any(|r| r.summary.contains("NFS V3 READ Reply (Call In ")),
                "{name}"
            );
        }
    }
    // perftest's Send payloads are not mistaken for RPC-over-RDMA (unlike tshark's heuristic).
    for name in [
        "siw-ib_send_bw.pcap",
        "rxe-ib_send_lat-rdma_cm.pcap",
        "rxe-ib_send_bw.pcap",
    ] {
        let out = decode(name);
        assert!(
            out.records
                .iter()
                .all(|r| !r.layers.contains_key("rpcrdma")),
            "{name}"
        );
    }
}

/// Lossy links: TCP retransmissions and reordering do not disturb the MPA stream.
#[test]
fn lossy_iwarp_stream_reassembles() {
    let out = decode("siw-lossy-ib_write_bw.pcap");
    let writes = out
        .records
        .iter()
        .filter(|r| r.summary.starts_with("RDMA Write"))
        .count();
    // 30 iterations of a 4096-octet write at MSS 1448 → 3 FPDUs each (plus warm-up).
    assert!(writes >= 90, "{writes} RDMA Write segments");
}

/// File offsets where each packet record of a pcap or pcapng image ends, in order.
fn record_ends(img: &[u8]) -> Vec<usize> {
    let u32_at = |o: usize, le: bool| {
        let b = [img[o], img[o + 1], img[o + 2], img[o + 3]];
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let mut ends = Vec::new();
    if img[..4] == [0x0a, 0x0d, 0x0d, 0x0a] {
        // pcapng: blocks of (type, total length, ..., total length); each section says its
        // byte order; packets are Enhanced (6), Simple (3) and obsolete Packet (2) blocks.
        let (mut off, mut le) = (0, true);
        while off + 12 <= img.len() {
            if img[off..off + 4] == [0x0a, 0x0d, 0x0d, 0x0a] {
                le = img[off + 8..off + 12] == [0x4d, 0x3c, 0x2b, 0x1a];
            }
            let ty = u32_at(off, le);
            let len = u32_at(off + 4, le) as usize;
            off += len;
            if matches!(ty, 2 | 3 | 6) {
                ends.push(off);
            }
        }
    } else {
        // pcap: a 24-octet file header, then 16-octet record headers with the captured length
        // at octet 8.
        let le = matches!(
            img[..4],
            [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1]
        );
        let mut off = 24;
        while off + 16 <= img.len() {
            off += 16 + u32_at(off + 8, le) as usize;
            ends.push(off);
        }
    }
    ends
}

/// Every capture cut at every 997th octet (a killed tcpdump): every frame whose record is
/// whole before the cut is read, the cut says where it is (and only a cut inside a record is
/// one); and, at some of those cuts in each capture, the decode is the decode of the file
/// truncated at its last whole record: every message before the cut, as it was.
#[test]
fn captures_cut_anywhere_keep_every_frame_before_the_cut() {
    for f in common::captures() {
        let img = std::fs::read(&f).unwrap();
        let ends = record_ends(&img);
        let whole = capture::read_frames_from("whole", &img[..]).unwrap();
        assert_eq!(whole.frames.len(), ends.len(), "{f:?}");
        assert!(whole.cut.is_none(), "{f:?}");
        let cuts: Vec<usize> = (997..img.len()).step_by(997).collect();
        for (i, &at) in cuts.iter().enumerate() {
            let before = ends.iter().filter(|&&e| e <= at).count();
            let c = capture::read_frames_from("cut", &img[..at])
                .unwrap_or_else(|e| panic!("{f:?} cut at {at}: {e}"));
            assert_eq!(c.frames.len(), before, "{f:?} cut at {at}");
            for (a, b) in c.frames.iter().zip(&whole.frames) {
                assert_eq!(
                    (a.number, &a.data),
                    (b.number, &b.data),
                    "{f:?} cut at {at}"
                );
            }
            match &c.cut {
                Some(k) => {
                    assert!(k.short && k.at == at as u64, "{f:?} cut at {at}: {k:?}");
                    assert_eq!(k.after_frame as usize, before, "{f:?} cut at {at}");
                }
                None => assert!(ends.contains(&at), "{f:?} cut at {at} not reported"),
            }
            // Decoding is the costly part: eight cuts a capture, spread over it.
            if i % cuts.len().div_ceil(8) != 0 {
                continue;
            }
            let out = decode_bytes(&img[..at], &Options::default()).unwrap();
            let lines = |o: &Output| -> Vec<(u64, String)> {
                o.records
                    .iter()
                    .map(|r| (r.frame, r.summary.clone()))
                    .collect()
            };
            match before.checked_sub(1) {
                None => assert!(out.records.is_empty(), "{f:?} cut at {at}"),
                Some(last) => {
                    let want = decode_bytes(&img[..ends[last]], &Options::default()).unwrap();
                    assert!(want.cut.is_none());
                    assert_eq!(lines(&out), lines(&want), "{f:?} cut at {at}");
                }
            }
        }
    }
}

/// A clear error for an unreadable file, the frames before the cut of a truncated one.
#[test]
fn unreadable_and_truncated_files_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("softrdma-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.pcap");
    let e = decode_file(&missing, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot open"), "{e}");

    let junk = dir.join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture").unwrap();
    let e = decode_file(&junk, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a pcap"), "{e}");

    let whole = std::fs::read(common::captures_dir().join("siw-rping.pcap")).unwrap();
    let cut = dir.join("cut.pcap");
    std::fs::write(&cut, &whole[..whole.len() - 7]).unwrap();
    // Cut short: the frames before the cut are decoded, the cut is reported.
    let out = decode_file(&cut, &Options::default()).unwrap();
    assert_eq!(out.frames, 36);
    let c = out.cut.expect("the cut is reported");
    assert!(
        c.short && c.after_frame == 36 && c.at == whole.len() as u64 - 7,
        "{c:?}"
    );
    let text = c.to_string();
    assert!(
        text.contains("cut short") && text.contains("after frame 36"),
        "{text}"
    );
    // Through the binary: the messages, then one line saying where the file was cut.
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("decode")
        .arg(&cut)
        .output()
        .unwrap();
    assert!(run.status.success());
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(stdout.lines().count(), out.records.len(), "{stdout}");
    assert!(
        stderr.contains("cut.pcap: cut short") && stderr.contains("after frame 36"),
        "{stderr}"
    );
    let strict = std::process::Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["decode", "--strict"])
        .arg(&cut)
        .status()
        .unwrap();
    assert_eq!(strict.code(), Some(1), "--strict counts the cut");
    std::fs::remove_dir_all(&dir).ok();
}

/// Rust's `Debug` look in text meant for people: `Some(`, a bare `None`, or a CamelCase
/// name followed by `(` or ` {` (`CreditCode(31)`, `Ddp(TaggedBuffer(InvalidStag))`).
fn debug_formatting(line: &str) -> Option<&str> {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_alphabetic() || (i > 0 && b[i - 1].is_ascii_alphanumeric()) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        let word = &line[start..i];
        let rest = &line[i..];
        let camel = word.as_bytes()[0].is_ascii_uppercase()
            && word
                .as_bytes()
                .windows(2)
                .any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
        if word == "None"
            || (word == "Some" && rest.starts_with('('))
            || (camel && (rest.starts_with('(') || rest.starts_with(" {")))
        {
            return Some(word);
        }
    }
    None
}

/// A `-v` field line's serde or Debug look: `null`, `[]`, `{}`, a quoted string, or a Rust
/// variant name as the value (`opcode: RdmaReadRequest`, `kind: Request`).
fn serde_look(line: &str) -> Option<&str> {
    let value = line.trim_start().split_once(": ").map_or("", |(_, v)| v);
    let variant = value.len() > 1
        && value.as_bytes()[0].is_ascii_uppercase()
        && value.bytes().all(|b| b.is_ascii_alphanumeric())
        && value.bytes().any(|b| b.is_ascii_lowercase());
    let bad = ["null", "[]", "{}", "\""]
        .into_iter()
        .find(|b| line.contains(b));
    bad.or(variant.then_some(value))
}

/// The protocols in the order their headers sit on the wire (IP, UDP, the IB transport,
/// a MAD inside it, the ICRC last; MPA, DDP, RDMAP; RPC-over-RDMA, then the RPC inside).
const WIRE_ORDER: &[&str] = &[
    "ip",
    "udp",
    "iwarp_mpa",
    "mpa_rev2",
    "iwarp_ddp",
    "iwarp_rdma",
    "infiniband",
    "mad",
    "rpcordma",
    "rpc",
    "icrc",
];

/// The decoder's lines (summaries, stream errors, the cut) over every capture carry no
/// `Debug` formatting: names and codes as words (`ACK credit unlimited (code 31)`,
/// `DDP tagged buffer: invalid STag`). Nor does `-v`, whose layers come in wire order.
#[test]
fn summaries_carry_no_debug_formatting() {
    assert_eq!(serde_look("      verf: None"), Some("None"));
    assert_eq!(
        serde_look("      opcode: RdmaReadRequest"),
        Some("RdmaReadRequest")
    );
    assert_eq!(serde_look("      reply_chunk: null"), Some("null"));
    assert_eq!(serde_look("      opcode: rdma read request"), None);
    assert_eq!(serde_look("      iwarp_ddp.stag: 0x6d617b00"), None);
    assert_eq!(
        debug_formatting("ACK credit CreditCode(31)"),
        Some("CreditCode")
    );
    assert_eq!(debug_formatting("x Some((1, 1))"), Some("Some"));
    assert_eq!(debug_formatting("verf: None"), Some("None"));
    assert_eq!(
        debug_formatting("RoCEv2 RC ACK credit unlimited (code 31)"),
        None
    );
    for f in common::captures() {
        let out = decode_file(
            &f,
            &Options {
                all: true,
                ..Options::default()
            },
        )
        .unwrap();
        let cut = out.cut.as_ref().map(|c| c.to_string());
        for line in out
            .records
            .iter()
            .map(|r| r.line())
            .chain(out.stream_errors.iter().cloned())
            .chain(cut)
        {
            assert_eq!(debug_formatting(&line), None, "{f:?}: {line}");
        }
        for r in &out.records {
            let v = r.verbose();
            let mut layers = Vec::new();
            for line in v.lines().skip(1) {
                assert_eq!(
                    debug_formatting(line),
                    None,
                    "{f:?}: frame {}: {line}",
                    r.frame
                );
                assert_eq!(serde_look(line), None, "{f:?}: frame {}: {line}", r.frame);
                let indent = line.len() - line.trim_start().len();
                if indent == 4 && !line.trim_start().starts_with("check ") {
                    let name = line.split_whitespace().next().unwrap();
                    layers.push(
                        WIRE_ORDER
                            .iter()
                            .position(|l| *l == name)
                            .unwrap_or_else(|| {
                                panic!("{f:?}: frame {}: layer {name} of unknown place", r.frame)
                            }),
                    );
                }
            }
            assert!(
                layers.windows(2).all(|w| w[0] < w[1]),
                "{f:?}: frame {}: layers out of wire order:\n{v}",
                r.frame
            );
        }
    }
}

/// Runs `softrdma decode ARGS` with `stdin`; its exit status, standard output and error.
fn decode_cli(args: &[&str], stdin: Option<&[u8]>) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_softrdma"));
    c.arg("decode").args(args);
    c.stdin(std::process::Stdio::piped());
    c.stdout(std::process::Stdio::piped());
    c.stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.unwrap_or_default().to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// As tshark: `-` reads the capture from standard input, `-c N` stops after N frames,
/// `--roce-port` decodes another UDP port as RoCEv2 ("decode as").
#[test]
fn stdin_frame_count_and_decode_as() {
    let path = common::captures_dir().join("rxe-rping.pcap");
    let img = std::fs::read(&path).unwrap();
    let p = path.to_str().unwrap();
    let (code, from_file, _) = decode_cli(&[p], None);
    assert_eq!(code, Some(0));
    let (code, from_stdin, _) = decode_cli(&["-"], Some(&img));
    assert_eq!(code, Some(0));
    assert_eq!(from_stdin, from_file);
    assert!(from_file.lines().count() > 10);

    let (code, first, err) = decode_cli(&["-c", "10", "--all", p], None);
    assert_eq!(code, Some(0));
    for line in first.lines() {
        let frame: u64 = line.split_whitespace().next().unwrap().parse().unwrap();
        assert!(frame <= 10, "{line}");
    }
    assert!(err.contains("10 frames"), "{err}");

    // The same capture with RoCEv2 on UDP port 4792 (pcap, Ethernet: record header 16,
    // Ethernet 14, then IPv4 and UDP).
    let mut moved = img.clone();
    let ends = record_ends(&img);
    let mut start = 24;
    let mut n = 0;
    for &end in &ends {
        let ip = start + 16 + 14;
        if end > ip + 24 && moved[ip] >> 4 == 4 && moved[ip + 9] == 17 {
            let udp = ip + usize::from(moved[ip] & 0x0f) * 4;
            if moved[udp + 2..udp + 4] == 4791u16.to_be_bytes() {
                moved[udp + 2..udp + 4].copy_from_slice(&4792u16.to_be_bytes());
                n += 1;
            }
        }
        start = end;
    }
    assert!(n > 10, "{n} datagrams moved");
    let roce = |s: &str| s.lines().filter(|l| l.contains("RoCEv2")).count();
    let (_, plain, _) = decode_cli(&["-"], Some(&moved));
    assert_eq!(roce(&plain), 0);
    // Decoded, not only claimed (the ICRC, over the ports, no longer checks).
    let (_, as_roce, _) = decode_cli(&["--roce-port", "4792", "-"], Some(&moved));
    assert_eq!(roce(&as_roce), roce(&from_file));
    assert!(!as_roce.contains("undecodable"), "{as_roce}");
}
