//! Captures taken with a snap length (`tcpdump -s 128`, the usual way to trace RDMA without
//! its payload): every frame is cut, its headers kept. Made here by cutting the bundled
//! captures, the decode must find what the whole capture holds wherever the headers were
//! kept — each RoCEv2 packet's IB headers, each FPDU that starts a segment — invent
//! nothing, and report no error: what was not captured is a note, not a fault.

mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Cursor;

use pcap_file::pcap::{PcapHeader, PcapReader, PcapWriter};
use softrdma_cli::decode::{Options, Output, Record, decode_bytes};

/// `img` with every frame cut to `snap` octets (its original length kept), as a capture
/// with that snap length holds it; and how many frames were longer.
fn cut(img: &[u8], snap: usize) -> (Vec<u8>, usize) {
    let mut rd = PcapReader::new(Cursor::new(img)).unwrap();
    let header = PcapHeader {
        snaplen: snap as u32,
        ..rd.header()
    };
    let mut out = Vec::new();
    let mut w = PcapWriter::with_header(&mut out, header).unwrap();
    let mut n = 0;
    while let Some(p) = rd.next_packet() {
        let mut p = p.unwrap();
        if p.data.len() > snap {
            p.data = Cow::Owned(p.data[..snap].to_vec());
            n += 1;
        }
        w.write_packet(&p).unwrap();
    }
    w.into_writer();
    (out, n)
}

fn decode(img: &[u8]) -> Output {
    decode_bytes(img, &Options::default()).unwrap()
}

/// What identifies a packet or FPDU apart from its payload, and how often it occurs:
/// direction and the IB BTH and extended headers (with the frame: one packet a frame), or
/// the DDP header and RDMAP control (without it: an FPDU over two segments is the later
/// frame's when whole, the earlier one's when the capture kept only its headers).
fn keys(out: &Output, proto: &str) -> BTreeMap<(u64, String, String), usize> {
    keys_of(out.records.iter(), proto)
}

fn keys_of<'a>(
    records: impl Iterator<Item = &'a Record>,
    proto: &str,
) -> BTreeMap<(u64, String, String), usize> {
    let mut m = BTreeMap::new();
    for r in records.filter(|r| r.proto == proto) {
        let k = match proto {
            "RoCEv2" => {
                // The headers only: a whole packet's "ib" layer also holds its payload.
                let mut ib = r.layers.get("ib").cloned().unwrap_or_default();
                if let Some(m) = ib.as_object_mut() {
                    m.remove("payload");
                    m.remove("payload_len");
                    m.remove("pad");
                }
                (r.frame, r.src.clone() + &r.dst, ib.to_string())
            }
            _ => {
                let layer = |name: &str| r.layers.get(name).map(|v| v.to_string());
                let control = r.layers.get("rdmap").and_then(|m| m.get("control"));
                let id = layer("ddp").unwrap_or_default()
                    + &control.map(|c| c.to_string()).unwrap_or_default();
                (0, r.src.clone() + &r.dst, id)
            }
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

/// No record failed a check and no stream error was reported.
fn assert_clean(got: &Output, what: &str) {
    let bad: Vec<&Record> = got.records.iter().filter(|r| !r.clean()).collect();
    assert!(
        bad.is_empty(),
        "{what}: {:?}",
        bad.first().map(|r| r.line())
    );
    assert!(
        got.stream_errors.is_empty(),
        "{what}: {:?}",
        got.stream_errors
    );
}

fn check(name: &str, snaps: &[usize], exact: bool) {
    let img = std::fs::read(common::captures_dir().join(name)).unwrap();
    let whole = decode(&img);
    let proto = if name.starts_with("rxe") || name.contains("rxe") {
        "RoCEv2"
    } else {
        "iWARP"
    };
    let want = keys(&whole, proto);
    assert!(!want.is_empty(), "{name}: nothing to compare");
    for &snap in snaps {
        let what = format!("{name} cut at {snap}");
        let (img_cut, n_cut) = cut(&img, snap);
        let got = decode(&img_cut);
        assert_clean(&got, &what);
        let found = keys(&got, proto);
        let invented: Vec<_> = found
            .iter()
            .filter(|(k, n)| want.get(k).is_none_or(|w| w < n))
            .collect();
        assert!(
            invented.is_empty(),
            "{what}: not in the whole capture: {invented:?}"
        );
        if exact {
            let missed: Vec<_> = want
                .iter()
                .filter(|(k, n)| found.get(k).is_none_or(|f| f < n))
                .collect();
            assert!(
                missed.is_empty(),
                "{what}: missed {} of {}: {:?}",
                missed.len(),
                want.len(),
                missed.first()
            );
        }
        // What was cut is said.
        let cut_records = got
            .records
            .iter()
            .filter(|r| {
                r.checks
                    .iter()
                    .any(|c| c.what == "captured" && c.ok.is_none())
            })
            .count();
        assert!(
            n_cut == 0 || cut_records > 0 || !got.notes.is_empty(),
            "{what}: nothing says the {n_cut} frames were cut"
        );
    }
}

/// RoCEv2: every packet's IB headers, down to a snap length that keeps only Ethernet, IPv4,
/// UDP and 18 octets of the transport headers.
#[test]
fn roce_headers_survive_a_snap_length() {
    for name in [
        "rxe-ib_write_bw.pcap",
        "rxe-ib_read_bw.pcap",
        "rxe-rping.pcap",
        "rxe-lossy-rc_pingpong.pcap",
        "nfs3-rdma-rxe.pcap",
        "rxe-send_inv.pcap",
    ] {
        check(name, &[80, 96, 128, 200], true);
    }
}

/// iWARP: FPDUs are aligned to segments (RFC 5044 §8, as siw sends them), so the FPDU at a
/// cut segment's start is decoded as far as its headers were kept, and the lengths kept say
/// where the next one starts; the MPA startup frames' headers decide Markers and CRC.
#[test]
fn iwarp_fpdus_survive_a_snap_length() {
    for name in [
        "siw-rping.pcap",
        "siw-ib_write_bw.pcap",
        "siw-lossy-ib_write_bw.pcap",
        "siw-mpa1-ib_read_bw.pcap",
        "siw-crc-ib_write_bw.pcap",
        "siw-terminate-bad_read.pcap",
    ] {
        check(name, &[96, 128, 200, 400], true);
    }
    // Segments the sender's offload merged hold several FPDUs, and a cut keeps only the
    // first one's headers: found in part, never invented.
    check("siw-ib_read_bw.pcap", &[96, 200], false);
    check("nfs3-rdma-siw.pcap", &[96, 200], false);
}

/// A capture that began after the connection did (no handshake, no MPA startup frames, as
/// when tcpdump is started after an NFS mount): FPDUs are found by their headers from the
/// first segment on, with the CRC when one checks, and every FPDU of the whole capture after
/// that point is decoded; a note says how.
#[test]
fn iwarp_captured_from_the_middle_of_a_connection() {
    for (name, crc) in [
        ("siw-ib_write_bw.pcap", false),
        ("siw-crc-ib_write_bw.pcap", true),
        ("siw-rping.pcap", false),
        ("nfs3-rdma-siw.pcap", false),
    ] {
        let img = std::fs::read(common::captures_dir().join(name)).unwrap();
        let whole = decode(&img);
        // Every frame up to the last MPA startup frame is gone.
        let last_startup = common::last_startup_frame(&whole);
        let gone: Vec<u64> = (1..=last_startup).collect();
        let got = decode(&common::without(&img, &gone));
        assert_clean(&got, name);
        let want = keys_of(
            whole.records.iter().filter(|r| r.frame > last_startup),
            "iWARP",
        );
        assert!(!want.is_empty(), "{name}");
        assert_eq!(keys(&got, "iWARP"), want, "{name}");
        let how = if crc {
            "each CRC checking"
        } else {
            "without a CRC"
        };
        assert!(
            got.notes
                .iter()
                .any(|n| n.contains("startup frames are not in the capture") && n.contains(how)),
            "{name}: {:?}",
            got.notes
        );
    }
}

/// Whole frames decode as before: a capture that cut nothing has no notes.
#[test]
fn whole_captures_carry_no_cut_notes() {
    for p in common::captures() {
        let out = decode(&std::fs::read(&p).unwrap());
        assert!(out.notes.is_empty(), "{}: {:?}", p.display(), out.notes);
        let cut = out
            .records
            .iter()
            .filter(|r| r.checks.iter().any(|c| c.what == "captured"))
            .count();
        assert_eq!(cut, 0, "{}", p.display());
    }
}

/// A frame cut inside its IB headers is a note, and the record says so.
#[test]
fn a_frame_cut_inside_its_headers_is_a_note() {
    let img = std::fs::read(common::captures_dir().join("rxe-ib_write_bw.pcap")).unwrap();
    // Ethernet 14 + IPv4 20 + UDP 8 + 4 octets of BTH.
    let got = decode(&cut(&img, 46).0);
    let roce: Vec<&Record> = got.records.iter().filter(|r| r.proto == "RoCEv2").collect();
    assert!(!roce.is_empty());
    for r in roce {
        assert!(r.clean(), "{}", r.line());
        assert!(r.summary.contains("cut inside its headers"), "{}", r.line());
    }
}
