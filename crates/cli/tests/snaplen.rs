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

/// `msg` as one ONC RPC record (RFC 5531 §11).
fn rpc_record(msg: Vec<u8>) -> Vec<u8> {
    let mut r = Vec::new();
    softrdma_rpc::record::encode_record(&[&msg], softrdma_rpc::record::MAX_FRAGMENT, &mut r);
    r
}

/// An NFSv3 call of `proc` with AUTH_NONE and `args` octets of arguments (RFC 5531 §9).
fn nfs_call(xid: u32, proc: u32, args: usize) -> Vec<u8> {
    let mut m: Vec<u8> = [xid, 0, 2, 100_003, 3, proc, 0, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_be_bytes())
        .collect();
    m.extend((0..args).map(|i| i as u8));
    rpc_record(m)
}

/// An accepted, successful reply with `results` octets of results.
fn nfs_reply(xid: u32, results: usize) -> Vec<u8> {
    let mut m: Vec<u8> = [xid, 1, 0, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_be_bytes())
        .collect();
    m.extend((0..results).map(|i| (i * 7) as u8));
    rpc_record(m)
}

/// NFS over TCP as a capture holds it: `segments` (true: client to server) in order, each
/// direction's sequence numbers following its octets.
fn tcp_capture(segments: &[(bool, Vec<u8>)]) -> Vec<u8> {
    use etherparse::PacketBuilder;
    use pcap_file::pcap::PcapPacket;
    let mut out = Vec::new();
    let header = PcapHeader {
        datalink: pcap_file::DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(&mut out, header).unwrap();
    let (client, server) = (([10, 0, 0, 1], 801), ([10, 0, 0, 2], 2049));
    let mut seq = [1_000u32, 900_000];
    for (i, (to_server, payload)) in segments.iter().enumerate() {
        let (src, dst, k) = match to_server {
            true => (client, server, 0),
            false => (server, client, 1),
        };
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(src.0, dst.0, 64)
            .tcp(src.1, dst.1, seq[k], 65_535)
            .ack(seq[1 - k]);
        let mut frame = Vec::new();
        b.write(&mut frame, payload).unwrap();
        let t = std::time::Duration::from_millis(i as u64);
        w.write_packet(&PcapPacket::new(t, frame.len() as u32, &frame))
            .unwrap();
        seq[k] = seq[k].wrapping_add(payload.len() as u32);
    }
    w.into_writer();
    out
}

/// Each ONC RPC message a decode found: (its direction, xid, whether a call).
fn rpc_messages(out: &Output) -> Vec<(String, u32, bool)> {
    out.records
        .iter()
        .filter(|r| r.proto == "RPC")
        .map(|r| {
            let m = r
                .layers
                .get("rpc")
                .unwrap_or_else(|| panic!("{}", r.line()));
            let call = r.summary.contains(" Call ");
            (r.src.clone(), m["xid"].as_u64().unwrap() as u32, call)
        })
        .collect()
}

/// ONC RPC records over TCP stay in step through segments cut at the snap length: a record
/// mark says where the next record starts, so a cut inside a record loses nothing after it;
/// a cut over a mark loses that record only, and the next one starting a segment is found
/// again. Each record is decoded as far as its header was kept (its XID, a call's
/// procedure, a reply named after its call), with no error.
#[test]
fn onc_rpc_records_over_tcp_stay_in_step_through_cut_segments() {
    let write = nfs_call(2, 7, 4_000);
    let mut two = nfs_call(3, 1, 24);
    two.extend(nfs_call(4, 1, 24));
    let segments = vec![
        (true, nfs_call(1, 6, 160)),
        (false, nfs_reply(1, 120)),
        // One record over three segments.
        (true, write[..1448].to_vec()),
        (true, write[1448..2896].to_vec()),
        (true, write[2896..].to_vec()),
        (false, nfs_reply(2, 8)),
        // Two records in one segment: the cut takes the second one's mark.
        (true, two),
        (true, nfs_call(5, 1, 24)),
        (false, nfs_reply(3, 100)),
        (false, nfs_reply(4, 100)),
        (false, nfs_reply(5, 100)),
    ];
    let img = tcp_capture(&segments);
    let whole = decode(&img);
    let all = rpc_messages(&whole);
    assert_eq!(all.len(), 10, "{all:?}");
    assert!(whole.records.iter().all(|r| r.clean()));
    // Ethernet 14 + IPv4 20 + TCP 20: 42 octets of each segment kept; every segment is
    // longer but the second reply's (36 octets), which stays whole.
    let (cut_img, n) = cut(&img, 96);
    assert_eq!(n, segments.len() - 1);
    let got = decode(&cut_img);
    let want: Vec<_> = all
        .iter()
        .filter(|(_, xid, call)| !(*xid == 4 && *call))
        .cloned()
        .collect();
    assert_eq!(rpc_messages(&got), want);
    for r in got.records.iter().filter(|r| r.proto == "RPC") {
        assert!(r.clean(), "{}", r.line());
        let whole = r.layers["rpc"]["xid"] == 2 && !r.summary.contains(" Call ");
        assert_eq!(r.summary.ends_with("[cut]"), !whole, "{}", r.line());
        assert_eq!(
            r.checks.iter().any(|c| c.what == "captured"),
            !whole,
            "{}",
            r.line()
        );
    }
    let summary = |xid: u32, call: bool| {
        got.records
            .iter()
            .find(|r| {
                r.layers.get("rpc").is_some_and(|m| m["xid"] == xid)
                    && r.summary.contains(" Call ") == call
            })
            .map(|r| r.summary.clone())
            .unwrap()
    };
    assert!(
        summary(2, true).starts_with("NFS V3 WRITE Call"),
        "{}",
        summary(2, true)
    );
    assert!(
        summary(2, false).starts_with("NFS V3 WRITE Reply"),
        "{}",
        summary(2, false)
    );
    // The call lost to the cut: its reply stays unnamed.
    assert!(
        summary(4, false).starts_with("RPC Reply"),
        "{}",
        summary(4, false)
    );
    assert!(got.stream_errors.is_empty(), "{:?}", got.stream_errors);
    assert!(!got.notes.is_empty());

    // A segment lost in the middle of the long record (not cut: gone): the record is
    // decoded as far as it was captured, every record after it as before.
    let lost = decode(&common::without(&img, &[4]));
    assert_eq!(rpc_messages(&lost), all);
    let write_call = lost
        .records
        .iter()
        .find(|r| r.summary.starts_with("NFS V3 WRITE Call"))
        .unwrap();
    assert!(
        write_call
            .checks
            .iter()
            .any(|c| c.what == "captured" && c.detail.starts_with("1444 of 4040 octets")),
        "{}",
        write_call.verbose()
    );
    assert_eq!(lost.stream_errors.len(), 1, "{:?}", lost.stream_errors);
    assert!(
        lost.stream_errors[0].contains("1448 octets not captured")
            && lost.stream_errors[0].contains("kept in step"),
        "{}",
        lost.stream_errors[0]
    );
}

/// ONC RPC over TCP captured from inside a record (tcpdump started during a large NFS
/// WRITE): the stream's first octets are a record's middle, so the records are found at
/// the first segment start that holds one, whole or cut, and every record after it is
/// decoded; nothing is taken for FPDUs.
#[test]
fn onc_rpc_over_tcp_captured_from_inside_a_record() {
    // Argument octets that look like no record mark: a record starts only where one does.
    let write = nfs_call(2, 7, 40_000);
    let mut segments: Vec<(bool, Vec<u8>)> = vec![(true, nfs_call(1, 6, 160))];
    segments.extend(write.chunks(1448).map(|c| (true, c.to_vec())));
    segments.push((false, nfs_reply(1, 120)));
    segments.push((false, nfs_reply(2, 8)));
    for xid in 3..9 {
        segments.push((true, nfs_call(xid, 1, 24 + xid as usize)));
        segments.push((false, nfs_reply(xid, 100)));
    }
    let img = tcp_capture(&segments);
    let all = rpc_messages(&decode(&img));
    assert_eq!(all.len(), 16, "{all:?}");
    // From the second segment of the WRITE on: the first call, the WRITE call and their
    // replies' calls are not in the capture.
    for first in [3u64, 10, 25] {
        let gone: Vec<u64> = (1..first).collect();
        let late = common::without(&img, &gone);
        let want: Vec<_> = all
            .iter()
            .filter(|(_, xid, call)| !call || *xid >= 3)
            .cloned()
            .collect();
        for snap in [0, 96] {
            let what = format!("from frame {first}, cut at {snap}");
            let got = decode(&if snap == 0 {
                late.clone()
            } else {
                cut(&late, snap).0
            });
            assert_eq!(rpc_messages(&got), want, "{what}");
            assert!(got.records.iter().all(Record::clean), "{what}");
            assert!(got.records.iter().all(|r| r.proto == "RPC"), "{what}");
            assert!(
                got.stream_errors.is_empty(),
                "{what}: {:?}",
                got.stream_errors
            );
            // The calls seen are named, their replies after them.
            let named = got
                .records
                .iter()
                .filter(|r| r.summary.starts_with("NFS V3 "))
                .count();
            assert_eq!(named, 12, "{what}");
        }
    }
}

/// A capture taken on a host whose TCP segments leave coalesced (GSO, TSO): records start
/// anywhere in a segment, not at segment starts. Joined inside a record, the first call
/// that starts after it is found inside its segment and the records after it follow; a
/// WRITE of zeros and one of counting octets hide no call.
#[test]
fn onc_rpc_over_tcp_found_inside_coalesced_segments() {
    let mut calls: Vec<(u32, Vec<u8>)> = vec![(1, nfs_call(1, 6, 160))];
    let mut zeros = nfs_call(2, 7, 0);
    zeros.extend(std::iter::repeat_n(0u8, 30_000));
    let len = (zeros.len() - 4) as u32 | 0x8000_0000;
    zeros[..4].copy_from_slice(&len.to_be_bytes());
    calls.push((2, zeros));
    for xid in 3..40u32 {
        let args = if xid % 9 == 0 {
            20_000
        } else {
            24 + 13 * xid as usize
        };
        calls.push((xid, nfs_call(xid, if xid % 9 == 0 { 7 } else { 1 }, args)));
    }
    // The client's octets in segments of 5,000 (records start inside them); then the
    // replies, a segment each.
    let mut stream = Vec::new();
    let mut starts = Vec::new();
    for (xid, c) in &calls {
        starts.push((*xid, stream.len()));
        stream.extend_from_slice(c);
    }
    const SEG: usize = 5_000;
    let mut segments: Vec<(bool, Vec<u8>)> =
        stream.chunks(SEG).map(|c| (true, c.to_vec())).collect();
    let client_frames = segments.len() as u64;
    segments.extend(calls.iter().map(|(xid, _)| (false, nfs_reply(*xid, 100))));
    let img = tcp_capture(&segments);
    let all = rpc_messages(&decode(&img));
    assert_eq!(all.len(), 2 * calls.len(), "{all:?}");
    let mut inside = 0;
    for first in 2..client_frames {
        // Frame `first` is segment `first - 1`: the calls that start in it or later.
        let from = (first as usize - 1) * SEG;
        let seen: Vec<u32> = starts
            .iter()
            .filter(|&&(_, at)| at >= from)
            .map(|&(x, _)| x)
            .collect();
        inside += usize::from(
            seen.first()
                .is_some_and(|x| starts[*x as usize - 1].1 > from),
        );
        let gone: Vec<u64> = (1..first).collect();
        let got = decode(&common::without(&img, &gone));
        let want: Vec<_> = all
            .iter()
            .filter(|(_, xid, call)| !call || seen.contains(xid))
            .cloned()
            .collect();
        assert_eq!(rpc_messages(&got), want, "from frame {first}");
        assert!(got.records.iter().all(Record::clean), "from frame {first}");
        assert!(got.stream_errors.is_empty(), "from frame {first}");
    }
    // Most starts join inside a record whose successor starts inside a segment.
    assert!(
        inside * 2 > client_frames as usize,
        "{inside} of {client_frames}"
    );
}

/// Of the FPDUs `want` counts, how many `found` has.
fn kept(
    want: &BTreeMap<(u64, String, String), usize>,
    found: &BTreeMap<(u64, String, String), usize>,
) -> usize {
    want.iter()
        .map(|(k, &n)| n.min(found.get(k).copied().unwrap_or(0)))
        .sum()
}

/// A capture that began anywhere in a connection — inside an FPDU, between the MPA Request
/// and Reply — whole or cut at a snap length: FPDUs are found at the segment starts after
/// that (a CRC that checks, an FPDU after the first that parses, or, cut, FPDU lengths that
/// chain from one segment's head to the next), none is invented and no error is reported.
/// Every start frame from the first startup frame on is tried.
#[test]
fn iwarp_captured_from_anywhere_in_a_connection_whole_or_cut() {
    for (name, snaps) in [
        ("siw-ib_write_bw.pcap", &[0, 96, 128][..]),
        ("siw-crc-ib_write_bw.pcap", &[0, 128][..]),
        ("siw-ib_send_bw.pcap", &[0, 128][..]),
        ("siw-lossy-ib_write_bw.pcap", &[0, 128][..]),
        ("nfs3-rdma-siw.pcap", &[0, 128][..]),
    ] {
        let img = std::fs::read(common::captures_dir().join(name)).unwrap();
        let whole = decode(&img);
        let first_startup = whole
            .records
            .iter()
            .filter(|r| r.proto == "MPA")
            .map(|r| r.frame)
            .min()
            .unwrap();
        let frames = whole.records.iter().map(|r| r.frame).max().unwrap();
        let (mut tried, mut total_want, mut total_kept) = (0, 0, 0);
        for start in (first_startup..frames.min(first_startup + 48)).step_by(3) {
            let gone: Vec<u64> = (1..start).collect();
            let late = common::without(&img, &gone);
            // What the whole capture decodes in frames a few segments after the start.
            let want = keys_of(
                whole.records.iter().filter(|r| r.frame >= start + 6),
                "iWARP",
            );
            let all = keys(&whole, "iWARP");
            for &snap in snaps {
                let what = format!("{name} from frame {start}, cut at {snap}");
                let img = if snap == 0 {
                    late.clone()
                } else {
                    cut(&late, snap).0
                };
                let got = decode(&img);
                if name.contains("lossy") {
                    // A segment the link lost may have been resent before the start: the
                    // hole is real in what was captured.
                    assert!(got.records.iter().all(Record::clean), "{what}");
                } else {
                    assert_clean(&got, &what);
                }
                let found = keys(&got, "iWARP");
                let invented: Vec<_> = found
                    .iter()
                    .filter(|(k, n)| all.get(k).is_none_or(|w| w < n))
                    .collect();
                assert!(invented.is_empty(), "{what}: invented {invented:?}");
                let (w, k) = (want.values().sum::<usize>(), kept(&want, &found));
                assert!(
                    k * 10 >= w * 9,
                    "{what}: found {k} of the {w} FPDUs the whole capture has after it"
                );
                tried += 1;
                total_want += w;
                total_kept += k;
            }
        }
        assert!(tried > 10 && total_want > 0, "{name}");
        eprintln!("{name}: {tried} starts, {total_kept} of {total_want} FPDUs found");
    }
}
