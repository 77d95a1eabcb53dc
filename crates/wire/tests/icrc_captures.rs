//! Golden test for `softrdma_wire::icrc`: every RoCEv2 packet of the real
//! Linux rxe captures, reduced to what a UDP socket sees (UDP payload,
//! addresses, ports), verifies, and the recovered IPv4 Identification is
//! the one on the wire.
//!
//! The captures are classic pcap over Ethernet; a minimal reader here keeps
//! the wire crate free of capture-library dependencies.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use softrdma_wire::icrc::{Endpoints, IcrcCheck, IcrcVerifier, icrc_for};
use softrdma_wire::rocev2::{
    Ipv4Header, Ipv6Header, ROCEV2_UDP_PORT, RoceV2Packet, UDP_HEADER_LEN, UdpHeader,
};

fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures")
}

/// All `*.pcap` files under `dir`, recursively, sorted.
fn pcaps(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            pcaps(&p, out);
        } else if p.extension().is_some_and(|x| x == "pcap") {
            out.push(p);
        }
    }
    out.sort();
}

/// Frames of a classic pcap file with Ethernet link type.
fn frames(data: &[u8]) -> Vec<&[u8]> {
    let magic = u32::from_le_bytes(data[..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("not a classic pcap: magic {m:#x}"),
    };
    let u32_at = |o: usize| {
        let b: [u8; 4] = data[o..o + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    assert_eq!(u32_at(20) & 0x0FFF_FFFF, 1, "link type Ethernet");
    let mut out = Vec::new();
    let mut o = 24;
    while o + 16 <= data.len() {
        let incl = u32_at(o + 8) as usize;
        let orig = u32_at(o + 12) as usize;
        assert_eq!(incl, orig, "sliced frame");
        out.push(&data[o + 16..o + 16 + incl]);
        o += 16 + incl;
    }
    assert_eq!(o, data.len(), "trailing octets");
    out
}

/// IP packet of an Ethernet frame (VLAN tags skipped), if IPv4 or IPv6.
fn ip_of(frame: &[u8]) -> Option<&[u8]> {
    let mut o = 12;
    loop {
        let et = u16::from_be_bytes([*frame.get(o)?, *frame.get(o + 1)?]);
        match et {
            0x8100 | 0x88a8 => o += 4,
            0x0800 | 0x86dd => return frame.get(o + 2..),
            _ => return None,
        }
    }
}

struct Rocev2<'a> {
    ep: Endpoints,
    ipv4_id: Option<u16>,
    /// UDP payload: BTH .. ICRC.
    datagram: &'a [u8],
}

/// The RoCEv2 datagram of an IP packet, as a socket would deliver it.
fn rocev2_of(ip: &[u8]) -> Option<Rocev2<'_>> {
    let (src, dst, ipv4_id, l4) = match ip.first()? >> 4 {
        4 => {
            let h = Ipv4Header::new_checked(ip).ok()?;
            if h.protocol() != 17 || h.more_frags() || h.frag_offset() != 0 {
                return None;
            }
            assert_eq!(h.ihl(), 5, "rxe sends no IPv4 options");
            assert!(h.dont_frag(), "RoCEv2 sets DF");
            let end = h.total_len() as usize;
            (
                IpAddr::V4(h.src_addr()),
                IpAddr::V4(h.dst_addr()),
                Some(h.ident()),
                &ip[h.header_len()..end],
            )
        }
        6 => {
            let h = Ipv6Header::new_checked(ip).ok()?;
            if h.next_header() != 17 {
                return None;
            }
            let end = 40 + h.payload_len() as usize;
            (
                IpAddr::V6(h.src_addr()),
                IpAddr::V6(h.dst_addr()),
                None,
                &ip[40..end],
            )
        }
        _ => return None,
    };
    let u = UdpHeader::new_checked(l4).ok()?;
    if u.dst_port() != ROCEV2_UDP_PORT {
        return None;
    }
    Some(Rocev2 {
        ep: Endpoints {
            src,
            dst,
            src_port: u.src_port(),
            dst_port: u.dst_port(),
        },
        ipv4_id,
        datagram: &l4[UDP_HEADER_LEN..u.length() as usize],
    })
}

#[test]
fn every_rxe_capture_packet_verifies_with_its_ipv4_id() {
    let mut files = Vec::new();
    pcaps(&captures_dir(), &mut files);
    assert!(files.len() >= 40, "{} capture files", files.len());
    let mut v = IcrcVerifier::new();
    let (mut total, mut v4, mut v6, mut nonzero_id, mut files_with_roce) = (0, 0, 0, 0, 0);
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let mut n = 0;
        for (i, frame) in frames(&data).into_iter().enumerate() {
            let Some(ip) = ip_of(frame) else { continue };
            let Some(r) = rocev2_of(ip) else { continue };
            let name = format!("{} frame {}", f.display(), i + 1);
            // The full-packet ICRC agrees (the capture is sound).
            let p = RoceV2Packet::parse(ip).unwrap();
            assert!(p.icrc_ok(), "{name}");
            assert_eq!(
                v.verify(&r.ep, r.datagram),
                IcrcCheck::Valid { ipv4_id: r.ipv4_id },
                "{name}"
            );
            let payload = &r.datagram[..r.datagram.len() - 4];
            assert_eq!(
                icrc_for(&r.ep, r.ipv4_id.unwrap_or(0), payload),
                p.icrc,
                "{name}"
            );
            match r.ipv4_id {
                Some(id) => {
                    v4 += 1;
                    nonzero_id += usize::from(id != 0);
                }
                None => v6 += 1,
            }
            n += 1;
        }
        total += n;
        files_with_roce += usize::from(n > 0);
    }
    eprintln!(
        "{total} RoCEv2 packets from {files_with_roce} of {} capture files verified \
         ({v4} IPv4, {nonzero_id} of them with a non-zero ID; {v6} IPv6); {} lengths cached",
        files.len(),
        v.cached_lengths()
    );
    assert!(total > 1000 && files_with_roce >= 30);
}

/// Issue 11, Done-when 3: every CM MAD of the captures (UD Sends to QP1: rping, perftest
/// over rdma_cm, udaddy, NFS over RDMA, all over rxe) parses, header and message, and
/// re-emits octet for octet.
#[test]
fn every_cm_mad_of_the_captures_parses_and_reemits() {
    use softrdma_wire::ib::cm::CmMessage;
    use softrdma_wire::ib::mad::{MAD_DATA_LEN, MAD_HEADER_LEN, MAD_LEN, MadHeaderRepr};
    let mut files = Vec::new();
    pcaps(&captures_dir(), &mut files);
    let mut per_file = std::collections::BTreeMap::new();
    let mut attrs = std::collections::BTreeSet::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        for frame in frames(&data) {
            let Some(r) = ip_of(frame).and_then(rocev2_of) else {
                continue;
            };
            let d = r.datagram;
            // BTH DestQP 1, UD Send Only (opcode 0x64): BTH 12, DETH 8, the MAD, ICRC 4.
            if d.len() != 12 + 8 + MAD_LEN + 4 || d[0] != 0x64 || d[5..8] != [0, 0, 1] {
                continue;
            }
            let mad = &d[20..20 + MAD_LEN];
            let h = MadHeaderRepr::parse(mad).unwrap();
            assert_eq!((h.mgmt_class, h.class_version), (0x07, 2), "{f:?}");
            let m = CmMessage::parse(h.attribute_id, &mad[MAD_HEADER_LEN..])
                .unwrap_or_else(|e| panic!("{f:?}: {e}"));
            let mut out = [0u8; MAD_LEN];
            h.emit(&mut out).unwrap();
            m.emit(&mut out[MAD_HEADER_LEN..]).unwrap();
            assert_eq!(out[..], mad[..], "{f:?}: attribute {:#x}", h.attribute_id);
            assert_eq!(MAD_HEADER_LEN + MAD_DATA_LEN, MAD_LEN);
            attrs.insert(h.attribute_id);
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            *per_file.entry(name).or_insert(0) += 1;
        }
    }
    for name in [
        "rxe-rping.pcap",
        "rxe-ib_send_lat-rdma_cm.pcap",
        "rxe-udaddy.pcap",
        "nfs3-rdma-rxe.pcap",
        "nfs42-rdma-rxe.pcap",
    ] {
        assert!(
            per_file.get(name).copied().unwrap_or(0) >= 2,
            "{name}: {per_file:?}"
        );
    }
    // REQ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP all seen.
    for a in [0x10, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18] {
        assert!(
            attrs.contains(&a),
            "attribute {a:#x} in no capture: {attrs:?}"
        );
    }
}
