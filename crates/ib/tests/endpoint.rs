//! The RoCEv2 endpoint (`softrdma_ib::endpoint`): known answers from real Linux rxe captures
//! (every captured IPv4 RoCEv2 datagram is accepted and demultiplexed; our raw encapsulation
//! rebuilds every captured packet octet for octet), every drop reason and its counter, IPv6,
//! the UD GRH image, routing and registration, and hostile input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Instant;

use proptest::prelude::*;
use softrdma_ib::endpoint::{GRH_LEN, emit_raw_ipv4, grh_image};
use softrdma_ib::{
    DropReason, EndpointCounters, EndpointError, IbQp, QpType, RoceEndpoint, SocketKind, Transmit,
    TxError, UdDest,
};
use softrdma_wire::ib::{BthRepr, DethRepr, Opcode, PacketRepr, Service};
use softrdma_wire::icrc::{Endpoints, IcrcVerifier, icrc_for, verify_exact};
use softrdma_wire::rocev2::{
    Ipv4Header, Ipv4Repr, Ipv6Repr, ROCEV2_UDP_PORT, UDP_HEADER_LEN, UdpHeader, rocev2_flow_label,
    rocev2_src_port,
};

// ------------------------------------------------------------ captures

fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/captures")
}

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

/// Frames of a classic pcap file (Ethernet).
fn frames(data: &[u8]) -> Vec<&[u8]> {
    let le = match u32::from_le_bytes(data[..4].try_into().unwrap()) {
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
    let mut out = Vec::new();
    let mut o = 24;
    while o + 16 <= data.len() {
        let incl = u32_at(o + 8) as usize;
        out.push(&data[o + 16..o + 16 + incl]);
        o += 16 + incl;
    }
    out
}

/// One captured RoCEv2 IPv4 packet.
struct Captured {
    name: String,
    /// IPv4 header .. ICRC (total length).
    ip: Vec<u8>,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
}

impl Captured {
    /// The UDP payload, as a socket returns it.
    fn datagram(&self) -> &[u8] {
        &self.ip[28..]
    }

    /// BTH .. pad.
    fn payload(&self) -> &[u8] {
        &self.ip[28..self.ip.len() - 4]
    }

    fn packet(&self) -> PacketRepr<'_> {
        PacketRepr::parse(self.payload()).unwrap()
    }

    fn file(&self) -> &str {
        self.name.split(" frame").next().unwrap()
    }
}

/// Every IPv4 RoCEv2 packet of every capture.
fn captured() -> Vec<Captured> {
    let mut files = Vec::new();
    pcaps(&captures_dir(), &mut files);
    let mut out = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let short = f
            .strip_prefix(captures_dir())
            .unwrap()
            .display()
            .to_string();
        for (i, frame) in frames(&data).into_iter().enumerate() {
            if frame.len() < 14 || frame[12..14] != [0x08, 0x00] {
                continue;
            }
            let ip = &frame[14..];
            let Ok(h) = Ipv4Header::new_checked(ip) else {
                continue;
            };
            if h.protocol() != 17 || h.header_len() != 20 {
                continue;
            }
            let ip = &ip[..h.total_len() as usize];
            let u = UdpHeader::new_checked(&ip[20..]).unwrap();
            if u.dst_port() != ROCEV2_UDP_PORT {
                continue;
            }
            out.push(Captured {
                name: format!("{short} frame {}", i + 1),
                ip: ip.to_vec(),
                src: SocketAddrV4::new(h.src_addr(), u.src_port()),
                dst: SocketAddrV4::new(h.dst_addr(), u.dst_port()),
                ident: h.ident(),
            });
        }
    }
    assert!(out.len() > 1000, "{} RoCEv2 packets", out.len());
    out
}

fn qp_type_of(p: &PacketRepr<'_>) -> QpType {
    match p.bth.opcode.service() {
        Service::Rc => QpType::Rc,
        Service::Uc => QpType::Uc,
        Service::Ud => QpType::Ud,
        s => panic!("service {s:?} in a capture"),
    }
}

/// The GRH image the driver always built from a captured header: the header itself with
/// Identification 0 (the socket does not report it) and its checksum recomputed.
fn expected_grh(c: &Captured) -> [u8; 40] {
    let mut g = [0u8; 40];
    g[20..].copy_from_slice(&c.ip[..20]);
    let mut h = Ipv4Header::new_unchecked(&mut g[20..]);
    h.set_ident(0);
    h.fill_checksum();
    g
}

/// IBT-X-20, C9-37: every IPv4 RoCEv2 datagram of the rxe captures, given to an endpoint at
/// its destination as a UDP socket delivers it (payload and real source), is accepted and
/// demultiplexed to the QP of its DestQP, with the Identification rxe used and the GRH image
/// of its real IP header; a connected QP with that source as its path takes it.
#[test]
fn captured_rxe_datagrams_are_accepted_and_demultiplexed() {
    let caps = captured();
    let mut v = IcrcVerifier::new();
    let (mut ud, mut conn) = (0, 0);
    for c in &caps {
        let p = c.packet();
        let ty = qp_type_of(&p);
        let mut ep = RoceEndpoint::new(c.dst.into(), SocketKind::RawIpv4);
        ep.insert_qp(p.bth.dest_qp, ty).unwrap();
        if ty != QpType::Ud {
            // The port is not part of the check (rxe sends from per-QP ports).
            ep.set_path(
                p.bth.dest_qp,
                SocketAddr::new(IpAddr::V4(*c.src.ip()), 4791),
            )
            .unwrap();
            conn += 1;
        } else {
            ud += 1;
        }
        let inc = ep
            .handle(c.src.into(), c.datagram(), &mut v)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(inc.qpn, p.bth.dest_qp, "{}", c.name);
        assert_eq!(inc.packet, p, "{}", c.name);
        assert_eq!(inc.ipv4_id, Some(c.ident), "{}", c.name);
        // The GRH image is a UD receive's; the other types get none.
        let grh = match ty {
            QpType::Ud => expected_grh(c),
            _ => [0; GRH_LEN],
        };
        assert_eq!(inc.grh, grh, "{}", c.name);
        assert_eq!(
            ep.counters(),
            EndpointCounters {
                rx_datagrams: 1,
                ..EndpointCounters::default()
            }
        );
    }
    eprintln!(
        "{} captured datagrams: {conn} connected, {ud} UD",
        caps.len()
    );
    assert!(ud > 50 && conn > 1000);
}

/// EXT-ROCE-01/02/03: our raw IPv4 form of each captured packet's BTH .. pad, with its
/// Identification, addresses and ports, is the captured IPv4 packet octet for octet (IPv4
/// header with DF and TTL 64, UDP with checksum 0, payload, ICRC).
#[test]
fn raw_form_rebuilds_every_captured_packet() {
    let caps = captured();
    let mut out = Vec::new();
    for c in &caps {
        out.clear();
        out.extend_from_slice(b"prefix");
        let n = emit_raw_ipv4(&mut out, c.src, c.dst, c.ident, c.payload()).unwrap();
        assert_eq!(n, c.ip.len());
        assert_eq!(&out[..6], b"prefix", "appended");
        assert_eq!(out[6..], c.ip[..], "{}", c.name);
    }
}

/// The endpoint's own transmit path rebuilds the captured packets of QPs set up without
/// rdma_cm (where rxe's source port is the flow label of the QP pair, as ours): the same
/// Identification, path and QPNs give the captured octets.
#[test]
fn endpoint_encapsulation_matches_rxe_captures() {
    let caps = captured();
    let files = [
        "rxe-rc_pingpong.pcap",
        "rxe-rc_pingpong-4096-mtu1024.pcap",
        "rxe-uc_pingpong.pcap",
        "rxe-ib_write_bw.pcap",
        "rxe-ib_read_bw.pcap",
        "rxe-ib_atomic_bw-cmp_swap.pcap",
        "rxe-lossy-rc_pingpong.pcap",
        "rxe-interop/ib_read_bw-n5.pcap",
    ];
    let mut checked = 0;
    for file in files {
        let pkts: Vec<&Captured> = caps.iter().filter(|c| c.file() == file).collect();
        assert!(!pkts.is_empty(), "{file}");
        for c in &pkts {
            let p = c.packet();
            let ty = qp_type_of(&p);
            // The sender's QPN: a DestQP of the other direction whose flow label gives the port.
            let src_qpn = pkts
                .iter()
                .filter(|r| r.src.ip() == c.dst.ip() && r.dst.ip() == c.src.ip())
                .map(|r| r.packet().bth.dest_qp)
                .find(|&q| rocev2_src_port(rocev2_flow_label(q, p.bth.dest_qp)) == c.src.port())
                .unwrap_or_else(|| panic!("{}: no QP pair gives the port", c.name));
            let local = SocketAddr::new(IpAddr::V4(*c.src.ip()), 4791);
            let mut ep = RoceEndpoint::new(local, SocketKind::RawIpv4);
            ep.insert_qp(src_qpn, ty).unwrap();
            ep.set_path(src_qpn, c.dst.into()).unwrap();
            ep.set_next_ipv4_id(c.ident);
            let mut out = vec![0xEE; 3];
            let t = ep
                .encapsulate(src_qpn, None, c.payload(), &mut out)
                .unwrap();
            assert_eq!(
                t,
                Transmit {
                    dest: c.dst.into(),
                    kind: SocketKind::RawIpv4,
                    start: 3,
                    end: out.len(),
                }
            );
            assert_eq!(out[t.range()], c.ip[..], "{}", c.name);
            assert_eq!(out[t.packet_range()], *c.payload());
            assert_eq!(t.socket_addr(), sa(*c.dst.ip(), 0));
            checked += 1;
        }
    }
    eprintln!("{checked} packets rebuilt by the endpoint");
    assert!(checked > 400);
}

// ------------------------------------------------------------ helpers

const A4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const C4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// An RC SEND Only (or UD SEND Only with a DETH) to `dest_qp`, emitted.
fn packet(ud: bool, dest_qp: u32, payload: &[u8]) -> Vec<u8> {
    let op = if ud {
        Opcode::UD_SEND_ONLY
    } else {
        Opcode::RC_SEND_ONLY
    };
    let mut p = PacketRepr::new(BthRepr::new(op, dest_qp, 77), payload);
    if ud {
        p.deth = Some(DethRepr {
            q_key: 0x1111_1111,
            reserved: 0,
            src_qp: 0x11,
        });
    }
    let mut b = vec![0; p.buffer_len()];
    let n = p.emit(&mut b).unwrap();
    b.truncate(n);
    b
}

/// What a UDP socket returns for a datagram the endpoint built: the UDP payload, and the
/// source the receiver sees.
fn as_received<'a>(from: &RoceEndpoint, t: &Transmit, out: &'a [u8]) -> (SocketAddr, &'a [u8]) {
    match t.kind {
        SocketKind::Udp => (from.local(), &out[t.range()]),
        SocketKind::RawIpv4 => {
            let d = &out[t.range()];
            let ip = Ipv4Repr::parse(d).unwrap();
            let u = UdpHeader::new_checked(&d[20..]).unwrap();
            (sa(ip.src_addr, u.src_port()), &d[28..])
        }
    }
}

fn counters(f: impl FnOnce(&mut EndpointCounters)) -> EndpointCounters {
    let mut c = EndpointCounters::default();
    f(&mut c);
    c
}

// ------------------------------------------------------------ receive

/// Every drop reason, its typed error and its counter; what is not dropped is delivered.
#[test]
fn every_drop_reason_is_typed_and_counted() {
    let mut rx = RoceEndpoint::new(sa(B4, 4791), SocketKind::Udp);
    let tx = {
        let mut e = RoceEndpoint::new(sa(A4, 4791), SocketKind::Udp);
        e.insert_qp(0x11, QpType::Rc).unwrap();
        e.set_path(0x11, sa(B4, 4791)).unwrap();
        e
    };
    rx.insert_qp(0x22, QpType::Rc).unwrap();
    rx.set_path(0x22, sa(A4, 4791)).unwrap();
    rx.insert_qp(0x33, QpType::Ud).unwrap();
    rx.insert_qp(0x44, QpType::Uc).unwrap(); // no path yet
    let mut v = IcrcVerifier::new();
    let mut out = Vec::new();
    let mut wrap = |p: &[u8]| {
        out.clear();
        let t = tx.encapsulate(0x11, None, p, &mut out).unwrap();
        out[t.range()].to_vec()
    };
    let from_a = sa(A4, 4791);

    // Accepted.
    let good = wrap(&packet(false, 0x22, b"hello"));
    let inc = rx.handle(from_a, &good, &mut v).unwrap();
    assert_eq!((inc.qpn, inc.packet.payload), (0x22, &b"hello"[..]));
    assert_eq!(inc.ipv4_id, Some(0));

    // Bad ICRC: a flipped bit, a wrong ICRC, the right ICRC of other endpoints, too short.
    let mut flipped = good.clone();
    flipped[14] ^= 0x10;
    let other_port = sa(A4, 4792);
    for (src, d) in [
        (from_a, &flipped[..]),
        (from_a, &good[..good.len() - 1]),
        (other_port, &good[..]),
        (from_a, &[][..]),
        (from_a, &good[..15]),
    ] {
        assert_eq!(rx.handle(src, d, &mut v), Err(DropReason::BadIcrc));
    }
    // Malformed: a valid ICRC over octets that are no transport packet (opcode 0xFF,
    // a SEND Only too short for its RETH-less header is fine, so use an unknown opcode).
    let mut junk = packet(false, 0x22, b"x");
    junk[0] = 0xFF;
    let junk = wrap(&junk);
    assert_eq!(rx.handle(from_a, &junk, &mut v), Err(DropReason::Malformed));
    // Unknown QP.
    let stray = wrap(&packet(false, 0x99, b""));
    assert_eq!(
        rx.handle(from_a, &stray, &mut v),
        Err(DropReason::UnknownQp)
    );
    // Wrong source: QP 0x22's path is A; the same packet from C (right ICRC for C).
    let from_c = sa(C4, 4791);
    let mut c_tx = RoceEndpoint::new(from_c, SocketKind::Udp);
    c_tx.insert_qp(0x11, QpType::Rc).unwrap();
    c_tx.set_path(0x11, sa(B4, 4791)).unwrap();
    let mut o = Vec::new();
    let t = c_tx
        .encapsulate(0x11, None, &packet(false, 0x22, b"spoof"), &mut o)
        .unwrap();
    assert_eq!(
        rx.handle(from_c, &o[t.range()], &mut v),
        Err(DropReason::WrongSource)
    );
    // ... but the UD QP and the connected QP without a path take packets from anywhere.
    let t = c_tx
        .encapsulate(0x11, None, &packet(true, 0x33, b"ud"), &mut o)
        .unwrap();
    assert_eq!(rx.handle(from_c, &o[t.range()], &mut v).unwrap().qpn, 0x33);
    let t = c_tx
        .encapsulate(0x11, None, &packet(false, 0x44, b"uc"), &mut o)
        .unwrap();
    assert_eq!(rx.handle(from_c, &o[t.range()], &mut v).unwrap().qpn, 0x44);
    // The source port is not checked (rxe sends from per-QP ports).
    let mut a_other = RoceEndpoint::new(other_port, SocketKind::Udp);
    a_other.insert_qp(0x11, QpType::Rc).unwrap();
    a_other.set_path(0x11, sa(B4, 4791)).unwrap();
    let t = a_other
        .encapsulate(0x11, None, &packet(false, 0x22, b"port"), &mut o)
        .unwrap();
    assert_eq!(
        rx.handle(other_port, &o[t.range()], &mut v).unwrap().qpn,
        0x22
    );
    // An IPv4-mapped source is the same address.
    let mapped = sa(A4.to_ipv6_mapped(), 4791);
    assert_eq!(rx.handle(mapped, &good, &mut v).unwrap().qpn, 0x22);
    // A removed QP is unknown.
    assert!(rx.remove_qp(0x44));
    assert!(!rx.remove_qp(0x44));
    let t = c_tx
        .encapsulate(0x11, None, &packet(false, 0x44, b"gone"), &mut o)
        .unwrap();
    assert_eq!(
        rx.handle(from_c, &o[t.range()], &mut v),
        Err(DropReason::UnknownQp)
    );

    assert_eq!(
        rx.counters(),
        counters(|c| {
            c.rx_datagrams = 14;
            c.bad_icrc = 5;
            c.malformed = 1;
            c.unknown_qp = 2;
            c.wrong_source = 1;
        })
    );
}

/// IPv6: the UDP form with the full 32-bit ICRC (whatever the IPv4 setting), accepted with no
/// Identification, an IPv6 GRH image; every flipped bit but the masked BTH octet 4 is caught.
#[test]
fn ipv6_udp_form_full_icrc_and_grh() {
    let mut a = RoceEndpoint::new(sa(A6, 4791), SocketKind::RawIpv4);
    let mut b = RoceEndpoint::new(sa(B6, 4791), SocketKind::RawIpv4);
    a.insert_qp(0x11, QpType::Ud).unwrap();
    b.insert_qp(0x22, QpType::Ud).unwrap();
    let ah = a.create_ah(sa(B6, 4791)).unwrap();
    let ud = UdDest {
        ah,
        remote_qpn: 0x22,
        remote_qkey: 0x1111_1111,
    };
    let p = packet(true, 0x22, &[7; 100]);
    let mut out = Vec::new();
    let t = a.encapsulate(0x11, Some(ud), &p, &mut out).unwrap();
    assert_eq!(
        (t.kind, t.dest, t.socket_addr()),
        (SocketKind::Udp, sa(B6, 4791), sa(B6, 4791))
    );
    assert_eq!(out.len(), p.len() + 4);
    let ep = Endpoints::from_socket_addrs(sa(A6, 4791), sa(B6, 4791));
    assert_eq!(out[p.len()..], icrc_for(&ep, 0, &p).to_le_bytes());
    let mut v = IcrcVerifier::new();
    let inc = b.handle(sa(A6, 4791), &out, &mut v).unwrap();
    assert_eq!((inc.qpn, inc.ipv4_id), (0x22, None));
    let want = {
        let mut g = [0u8; GRH_LEN];
        Ipv6Repr {
            payload_len: (UDP_HEADER_LEN + out.len()) as u16,
            ..Ipv6Repr::new_udp(A6, B6)
        }
        .emit(&mut g)
        .unwrap();
        g
    };
    assert_eq!(inc.grh, want);
    assert_eq!(inc.grh[0] >> 4, 6);
    assert_eq!(inc.grh[8..24], A6.octets());
    assert_eq!(inc.grh[24..40], B6.octets());
    for i in 0..out.len() {
        for bit in 0..8 {
            let mut d = out.clone();
            d[i] ^= 1 << bit;
            let r = b.handle(sa(A6, 4791), &d, &mut v);
            if i == 4 {
                assert!(r.is_ok(), "BTH octet 4 is not covered (C9-6)");
            } else {
                assert_eq!(r, Err(DropReason::BadIcrc), "octet {i} bit {bit}");
            }
        }
    }
}

/// The UD GRH image over IPv4: rxe's layout, 20 zero octets then an IPv4 header (TOS 0,
/// total length of the packet, Identification 0, DF, TTL 64, UDP, checksum, addresses).
#[test]
fn ipv4_grh_image() {
    let g = grh_image(sa(A4, 0xC123), sa(B4, 4791), 112);
    assert_eq!(g[..20], [0; 20]);
    let h = Ipv4Header::new_checked(&g[20..]).unwrap();
    assert_eq!((h.version(), h.ihl(), h.tos()), (4, 5, 0));
    assert_eq!(h.total_len(), 20 + 8 + 112);
    assert_eq!((h.ident(), h.dont_frag(), h.frag_offset()), (0, true, 0));
    assert_eq!((h.ttl(), h.protocol()), (64, 17));
    assert!(h.verify_checksum());
    assert_eq!((h.src_addr(), h.dst_addr()), (A4, B4));
    // IPv4-mapped addresses are IPv4 on the wire.
    let m = grh_image(
        sa(A4.to_ipv6_mapped(), 1),
        sa(B4.to_ipv6_mapped(), 4791),
        112,
    );
    assert_eq!(m, g);
    // Mixed families: IPv6 with the mapped address.
    let x = grh_image(sa(A4, 1), sa(B6, 4791), 112);
    assert_eq!(x[0] >> 4, 6);
    assert_eq!(x[8..24], A4.to_ipv6_mapped().octets());
}

// ------------------------------------------------------------ transmit

/// The raw IPv4 form: our Identification (a counter that skips 0), DF, TTL 64, rxe's port of
/// the QP pair, UDP checksum 0; the receiving endpoint recovers the Identification. The UDP
/// form: ICRC over Identification 0, from the endpoint's port.
#[test]
fn raw_and_udp_forms() {
    let mut a = RoceEndpoint::new(sa(A4, 4791), SocketKind::RawIpv4);
    let mut b = RoceEndpoint::new(sa(B4, 4791), SocketKind::RawIpv4);
    a.insert_qp(0x11, QpType::Rc).unwrap();
    a.set_path(0x11, sa(B4, 4791)).unwrap();
    b.insert_qp(0x22, QpType::Rc).unwrap();
    b.set_path(0x22, sa(A4, 4791)).unwrap();
    a.set_next_ipv4_id(0xFFFE);
    let mut v = IcrcVerifier::new();
    let mut out = Vec::new();
    let mut ids = Vec::new();
    for i in 0..4u8 {
        let p = packet(false, 0x22, &[i; 33]);
        let t = a.encapsulate(0x11, None, &p, &mut out).unwrap();
        assert_eq!((t.kind, t.socket_addr()), (SocketKind::RawIpv4, sa(B4, 0)));
        let d = &out[t.range()];
        let ip = Ipv4Repr::parse(d).unwrap();
        assert_eq!((ip.flags, ip.ttl, ip.dscp, ip.ecn), (0b010, 64, 0, 0));
        assert_eq!(ip.total_len as usize, d.len());
        let u = UdpHeader::new_checked(&d[20..]).unwrap();
        let port = rocev2_src_port(rocev2_flow_label(0x11, 0x22));
        assert_eq!(
            (
                u.src_port(),
                u.dst_port(),
                u.length() as usize,
                u.checksum()
            ),
            (port, 4791, d.len() - 20, 0)
        );
        assert_eq!(out[t.packet_range()], p[..]);
        let (src, dgram) = as_received(&a, &t, &out);
        let inc = b.handle(src, dgram, &mut v).unwrap();
        assert_eq!(inc.ipv4_id, Some(ip.ident));
        ids.push(ip.ident);
    }
    assert_eq!(ids, [0xFFFE, 0xFFFF, 1, 2], "0 is skipped");
    // Datagrams append back to back.
    assert_eq!(out.len(), 4 * (28 + 12 + 36 + 4));

    // The UDP form.
    a.set_ipv4_socket(SocketKind::Udp);
    assert_eq!(a.ipv4_socket(), SocketKind::Udp);
    out.clear();
    let p = packet(false, 0x22, b"udp");
    let t = a.encapsulate(0x11, None, &p, &mut out).unwrap();
    assert_eq!(
        (t.kind, t.dest, t.socket_addr()),
        (SocketKind::Udp, sa(B4, 4791), sa(B4, 4791))
    );
    assert_eq!(t.packet_range(), 0..p.len());
    let ep = Endpoints::from_socket_addrs(sa(A4, 4791), sa(B4, 4791));
    assert!(verify_exact(&ep, 0, &out));
    assert_eq!(
        b.handle(sa(A4, 4791), &out, &mut v).unwrap().ipv4_id,
        Some(0)
    );
    assert_eq!(a.counters().tx_datagrams, 5);
    // A raw endpoint sends to an IPv6 destination in the UDP form.
    a.set_ipv4_socket(SocketKind::RawIpv4);
    a.set_path(0x11, sa(B6, 4791)).unwrap();
    let t = a.encapsulate(0x11, None, &p, &mut out).unwrap();
    assert_eq!(t.kind, SocketKind::Udp);
}

/// Routing: the path of a connected QP, the address handle of a UD send; errors append
/// nothing and are counted; address handles are freed and their ids reused oldest first.
#[test]
fn routing_and_address_handles() {
    let mut a = RoceEndpoint::new(sa(A4, 4791), SocketKind::RawIpv4);
    a.insert_qp(0x11, QpType::Rc).unwrap();
    a.insert_qp(0x12, QpType::Ud).unwrap();
    let p = packet(false, 0x22, b"x");
    let mut out = vec![1, 2, 3];
    let ud = |ah| {
        Some(UdDest {
            ah,
            remote_qpn: 0x22,
            remote_qkey: 0,
        })
    };
    assert_eq!(
        a.encapsulate(0x11, None, &p, &mut out),
        Err(TxError::NoPath(0x11))
    );
    assert_eq!(
        a.encapsulate(0x99, None, &p, &mut out),
        Err(TxError::UnknownQp(0x99))
    );
    assert_eq!(
        a.encapsulate(0x12, ud(0), &p, &mut out),
        Err(TxError::UnknownAh(0))
    );
    a.set_path(0x11, sa(B4, 4791)).unwrap();
    assert_eq!(a.path(0x11), Some(sa(B4, 4791)));
    assert_eq!(
        a.encapsulate(0x11, None, &p[..11], &mut out),
        Err(TxError::BadLength(11))
    );
    assert_eq!(
        a.encapsulate(0x11, None, &vec![0; 70_000], &mut out),
        Err(TxError::BadLength(70_000))
    );
    assert_eq!(out, [1, 2, 3], "nothing appended on error");
    assert_eq!(
        a.counters(),
        counters(|c| {
            c.tx_no_route = 3;
            c.tx_invalid = 2;
        })
    );

    let ids: Vec<u32> = [B4, C4, A4]
        .iter()
        .map(|&ip| a.create_ah(sa(ip, 4791)).unwrap())
        .collect();
    assert_eq!(ids, [0, 1, 2]);
    let t = a.encapsulate(0x12, ud(1), &p, &mut out).unwrap();
    assert_eq!(t.dest, sa(C4, 4791));
    assert_eq!(a.destroy_ah(1), Some(sa(C4, 4791)));
    assert_eq!(a.destroy_ah(1), None);
    assert_eq!(a.destroy_ah(7), None);
    assert_eq!(a.ah(1), None);
    assert_eq!(
        a.encapsulate(0x12, ud(1), &p, &mut out),
        Err(TxError::UnknownAh(1))
    );
    assert_eq!(a.destroy_ah(0), Some(sa(B4, 4791)));
    assert_eq!(a.create_ah(sa(B6, 4791)), Ok(1), "oldest freed first");
    assert_eq!(a.create_ah(sa(B6, 4792)), Ok(0));
    assert_eq!(a.create_ah(sa(B6, 4793)), Ok(3));
    assert_eq!(a.ah(1), Some(sa(B6, 4791)));
    // UD sends go to the handle, a connected QP's to its path.
    assert_eq!(
        a.encapsulate(0x12, ud(2), &p, &mut out).unwrap().dest,
        sa(A4, 4791)
    );
    assert_eq!(
        a.encapsulate(0x11, None, &p, &mut out).unwrap().dest,
        sa(B4, 4791)
    );
}

/// QPNs: allocated from 0x11 upwards, skipping numbers in use, within 24 bits; chosen ones
/// (QP1, a test's) registered as given.
#[test]
fn qp_registration() {
    let mut e = RoceEndpoint::new(sa(A4, 4791), SocketKind::Udp);
    assert_eq!(e.insert_qp(1, QpType::Ud), Ok(()));
    assert_eq!(e.insert_qp(0x12, QpType::Rc), Ok(()));
    assert_eq!(
        e.insert_qp(0x12, QpType::Uc),
        Err(EndpointError::QpnInUse(0x12))
    );
    assert_eq!(
        e.insert_qp(1 << 24, QpType::Rc),
        Err(EndpointError::QpnOutOfRange(1 << 24))
    );
    assert_eq!(e.add_qp(QpType::Rc), Ok(0x11));
    assert_eq!(e.add_qp(QpType::Uc), Ok(0x13), "0x12 is taken");
    assert_eq!(e.qp_type(0x13), Some(QpType::Uc));
    assert_eq!(e.qp_type(0x12), Some(QpType::Rc));
    assert_eq!(e.qp_count(), 4);
    assert_eq!(
        e.set_path(0x77, sa(B4, 4791)),
        Err(EndpointError::UnknownQp(0x77))
    );
    assert_eq!(e.path(0x11), None);
    assert!(e.remove_qp(0x11));
    assert_eq!(e.add_qp(QpType::Rc), Ok(0x14), "not reused at once");
}

/// The per-datagram paths take `&self`: the endpoint is shared between threads (behind an
/// `RwLock` in the driver).
#[test]
fn endpoint_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<RoceEndpoint>();
}

/// `poll_transmit` runs a QP's transmit through the endpoint and skips (counts) what has no
/// route: an RC pair over two endpoints, SEND and ACK.
#[test]
fn poll_transmit_drives_a_qp() {
    use std::sync::Arc;

    use softrdma_ib::{QpAttr, QpCaps, QpState, RecvWr, SendWr, Sge};
    use softrdma_memory::{Access, Buffer, KeyTable, PdId};

    let now = Instant::now();
    let mk = |qpn: u32, peer: u32| {
        let keys = Arc::new(KeyTable::with_seed(u64::from(qpn)));
        let buf = Buffer::new(4096);
        let key = keys
            .reg_mr(PdId(1), buf.clone(), 0, 4096, 0, Access::LOCAL_WRITE)
            .unwrap();
        let mut qp = IbQp::new(qpn, QpType::Rc, PdId(1), QpCaps::default(), keys);
        for a in [
            QpAttr::state(QpState::Init),
            QpAttr {
                state: Some(QpState::Rtr),
                pmtu: Some(1024),
                dest_qp: Some(peer),
                rq_psn: Some(0),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(1),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(1),
                ..QpAttr::default()
            },
        ] {
            qp.modify(&a).unwrap();
        }
        (qp, buf, key)
    };
    let (mut qa, ba, ka) = mk(0x11, 0x22);
    let (mut qb, bb, kb) = mk(0x22, 0x11);
    let mut ea = RoceEndpoint::new(sa(A4, 4791), SocketKind::RawIpv4);
    let mut eb = RoceEndpoint::new(sa(B4, 4791), SocketKind::RawIpv4);
    ea.insert_qp(0x11, QpType::Rc).unwrap();
    eb.insert_qp(0x22, QpType::Rc).unwrap();
    eb.set_path(0x22, sa(A4, 4791)).unwrap();
    ba.copy_in(0, &[9; 3000]).unwrap();
    qb.post_recv(RecvWr::new(5, vec![Sge::new(kb, 0, 4096)]))
        .unwrap();
    qa.post_send(SendWr::send(1, vec![Sge::new(ka, 0, 3000)]))
        .unwrap();
    let mut out = Vec::new();
    // No path yet: the three packets are counted and skipped.
    assert_eq!(ea.poll_transmit(&mut qa, now, &mut out), None);
    assert!(out.is_empty());
    assert_eq!(ea.counters().tx_no_route, 3);
    // With the path: the retransmission (timeout) goes out and arrives.
    ea.set_path(0x11, sa(B4, 4791)).unwrap();
    let later = qa.poll_timeout().unwrap();
    qa.handle_timeout(later);
    let mut v = IcrcVerifier::new();
    let mut sent = Vec::new();
    while let Some(t) = ea.poll_transmit(&mut qa, later, &mut out) {
        sent.push(t);
    }
    // The three packets, the first twice (a retry sends the oldest unacknowledged twice).
    assert_eq!(sent.len(), 4);
    for t in &sent {
        let (src, d) = as_received(&ea, t, &out);
        let inc = eb.handle(src, d, &mut v).unwrap();
        qb.handle_packet(&inc.packet, &inc.grh, later);
    }
    out.clear();
    sent.clear();
    while let Some(t) = eb.poll_transmit(&mut qb, later, &mut out) {
        sent.push(t);
    }
    assert!(!sent.is_empty());
    for t in &sent {
        let (src, d) = as_received(&eb, t, &out);
        let inc = ea.handle(src, d, &mut v).unwrap();
        assert!(inc.packet.bth.opcode.operation().is_response());
        qa.handle_packet(&inc.packet, &inc.grh, later);
    }
    assert_eq!(qa.poll_send_completion().map(|w| w.wr_id), Some(1));
    assert_eq!(qb.poll_recv_completion().map(|w| w.byte_len), Some(3000));
    let mut got = vec![0; 3000];
    bb.copy_out(0, &mut got).unwrap();
    assert_eq!(got, [9; 3000]);
}

// ------------------------------------------------------------ hostile input

fn any_src() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<u32>(), any::<u16>()).prop_map(|(a, p)| sa(Ipv4Addr::from(a), p)),
        (any::<u128>(), any::<u16>()).prop_map(|(a, p)| sa(Ipv6Addr::from(a), p)),
        any::<u16>().prop_map(|p| sa(A4, p)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary octets from an arbitrary source never panic and are dropped or delivered,
    /// each counted once.
    #[test]
    fn arbitrary_datagrams_never_panic(
        d in proptest::collection::vec(any::<u8>(), 0..2048),
        src in any_src(),
        v6 in any::<bool>(),
    ) {
        let local = if v6 { sa(B6, 4791) } else { sa(B4, 4791) };
        let mut e = RoceEndpoint::new(local, SocketKind::RawIpv4);
        for (q, ty) in [(0x22, QpType::Rc), (0x33, QpType::Ud), (0x44, QpType::Uc)] {
            e.insert_qp(q, ty).unwrap();
        }
        e.set_path(0x22, sa(A4, 4791)).unwrap();
        let mut v = IcrcVerifier::with_cached_lengths(4);
        let r = e.handle(src, &d, &mut v);
        let c = e.counters();
        prop_assert_eq!(c.rx_datagrams, 1);
        prop_assert_eq!(
            c.bad_icrc + c.malformed + c.unknown_qp + c.wrong_source,
            u64::from(r.is_err())
        );
    }

    /// Valid datagrams (any opcode-shaped payload, both families, both forms) with one bit
    /// flipped anywhere but the BTH octet 4 the ICRC masks are dropped as bad ICRC.
    #[test]
    fn near_valid_datagrams_are_bad_icrc(
        body in proptest::collection::vec(any::<u8>(), 12..4200),
        form in 0..3u8,
        flips in proptest::collection::vec(any::<u32>(), 1..16),
    ) {
        let (la, lb, kind) = match form {
            0 => (sa(A4, 4791), sa(B4, 4791), SocketKind::RawIpv4),
            1 => (sa(A4, 4791), sa(B4, 4791), SocketKind::Udp),
            _ => (sa(A6, 4791), sa(B6, 4791), SocketKind::Udp),
        };
        let mut a = RoceEndpoint::new(la, kind);
        a.insert_qp(0x11, QpType::Rc).unwrap();
        a.set_path(0x11, lb).unwrap();
        a.set_next_ipv4_id(body[0] as u16 * 251);
        let b = RoceEndpoint::new(lb, kind);
        let mut out = Vec::new();
        let t = a.encapsulate(0x11, None, &body, &mut out).unwrap();
        let (src, d) = as_received(&a, &t, &out);
        let mut v = IcrcVerifier::new();
        // Intact: past the ICRC (then malformed or an unknown QP: b has none).
        let r = b.handle(src, d, &mut v);
        prop_assert!(r != Err(DropReason::BadIcrc));
        let mut d = d.to_vec();
        for f in flips {
            let bit = f as usize % (d.len() * 8);
            if bit / 8 == 4 {
                continue;
            }
            d[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(b.handle(src, &d, &mut v), Err(DropReason::BadIcrc));
            d[bit / 8] ^= 1 << (bit % 8);
        }
    }

    /// Captured rxe datagrams with a flipped bit are dropped as bad ICRC.
    #[test]
    fn captured_datagrams_with_a_flipped_bit_are_bad_icrc(
        pick in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
    ) {
        thread_local! {
            static CAPS: Vec<Captured> = captured();
        }
        CAPS.with(|caps| {
            let c = pick.get(caps);
            let mut d = c.datagram().to_vec();
            let bit = flip.index(d.len() * 8);
            let mut e = RoceEndpoint::new(c.dst.into(), SocketKind::Udp);
            e.insert_qp(c.packet().bth.dest_qp, qp_type_of(&c.packet())).unwrap();
            let mut v = IcrcVerifier::new();
            d[bit / 8] ^= 1 << (bit % 8);
            let r = e.handle(c.src.into(), &d, &mut v);
            if bit / 8 == 4 {
                assert!(r.is_ok(), "{}: octet 4 is masked", c.name);
            } else {
                assert_eq!(r, Err(DropReason::BadIcrc), "{} bit {bit}", c.name);
            }
        });
    }
}
