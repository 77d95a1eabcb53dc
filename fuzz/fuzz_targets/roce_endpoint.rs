#![no_main]
//! The RoCEv2 endpoint's receive path on hostile datagrams (`RoceEndpoint::handle`): the
//! input is given as a UDP payload from an IPv4 and from an IPv6 peer to endpoints with RC,
//! UC and UD QPs registered, and, read as an IPv4 packet (the `rocev2` corpus: captured rxe
//! packets), its UDP payload from its own source to its own destination. Nothing may panic;
//! every drop is counted once; a datagram accepted from an IPv4 peer is rebuilt octet for
//! octet by the raw encapsulation with the Identification the check recovered.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use libfuzzer_sys::fuzz_target;
use softrdma_ib::endpoint::emit_raw_ipv4;
use softrdma_ib::{QpType, RoceEndpoint, SocketKind};
use softrdma_wire::icrc::IcrcVerifier;

fn endpoint(local: SocketAddr, peer: SocketAddr) -> RoceEndpoint {
    let mut e = RoceEndpoint::new(local, SocketKind::RawIpv4);
    for (qpn, ty) in [
        (0x11, QpType::Rc),
        (0x12, QpType::Uc),
        (0x13, QpType::Ud),
        (1, QpType::Ud),
    ] {
        e.insert_qp(qpn, ty).unwrap();
    }
    e.set_path(0x11, peer).unwrap();
    e
}

fuzz_target!(|data: &[u8]| {
    let mut v = IcrcVerifier::with_cached_lengths(8);
    let v4 = |a: [u8; 4], p| SocketAddr::from((Ipv4Addr::from(a), p));
    let v6 = |a: u128, p| SocketAddr::from((Ipv6Addr::from(a), p));
    for (local, peer) in [
        (v4([10, 0, 0, 2], 4791), v4([10, 0, 0, 1], 0xC001)),
        (v6(2, 4791), v6(1, 0xC001)),
    ] {
        let e = endpoint(local, peer);
        let r = e.handle(peer, data, &mut v);
        let c = e.counters();
        assert_eq!(c.rx_datagrams, 1);
        assert_eq!(
            c.bad_icrc + c.malformed + c.unknown_qp + c.wrong_source,
            u64::from(r.is_err())
        );
    }

    // As an IPv4 packet: IHL 5, UDP.
    if data.len() < 28 || data[0] != 0x45 || data[9] != 17 {
        return;
    }
    let ip = |o: usize| Ipv4Addr::new(data[o], data[o + 1], data[o + 2], data[o + 3]);
    let port = |o: usize| u16::from_be_bytes([data[o], data[o + 1]]);
    let src = SocketAddrV4::new(ip(12), port(20));
    let dst = SocketAddrV4::new(ip(16), port(22));
    let dgram = &data[28..];
    let mut e = endpoint(dst.into(), src.into());
    if let Some(q) = dgram.get(5..8) {
        let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
        let _ = e.insert_qp(qpn, QpType::Rc);
        let _ = e.set_path(qpn, src.into());
    }
    let Ok(inc) = e.handle(src.into(), dgram, &mut v) else {
        return;
    };
    let id = inc.ipv4_id.expect("an IPv4 peer's Identification");
    let mut out = Vec::new();
    let n = emit_raw_ipv4(&mut out, src, dst, id, &dgram[..dgram.len() - 4]).unwrap();
    assert_eq!(n, out.len());
    assert_eq!(
        &out[28..],
        dgram,
        "re-encapsulated with the recovered Identification"
    );
});
