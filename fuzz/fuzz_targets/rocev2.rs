#![no_main]
//! RoCEv2 packet from the first IP octet (IPv4 or IPv6): `RoceV2Packet::parse`
//! never panics; the ICRC it computes is the one `icrc` gives; re-emit keeps
//! the IP/UDP/transport octets (modulo the UDP checksum, written as 0) and
//! always yields a packet whose ICRC verifies. `RoceV2Repr` round-trips.

use libfuzzer_sys::fuzz_target;
use softrdma_wire::rocev2::{
    ICRC_LEN, Ipv4Repr, Ipv6Repr, RoceV2Packet, RoceV2Repr, UdpChecksum, UdpRepr, icrc,
};

fuzz_target!(|data: &[u8]| {
    let _ = Ipv4Repr::parse(data);
    let _ = Ipv6Repr::parse(data);
    let _ = UdpRepr::parse(data);
    let _ = icrc(data);

    if let Ok(p) = RoceV2Packet::parse(data) {
        let end = p.buffer_len();
        assert_eq!(icrc(&data[..end - ICRC_LEN]), Ok(p.computed_icrc));
        let mut out = vec![0u8; end];
        assert_eq!(p.emit(&mut out, UdpChecksum::Zero), Ok(end));
        let q = RoceV2Packet::parse(&out).expect("re-parse of our own emit");
        assert!(q.icrc_ok());
        assert!(q.udp_checksum_ok());
        assert_eq!(q.transport, p.transport);
        assert_eq!(q.computed_icrc, p.computed_icrc);
        let ip_end = end - 8 - p.transport.len() - ICRC_LEN;
        assert_eq!(&out[..ip_end], &data[..ip_end]);
        let _ = p.ib_packet();
        assert_eq!(p.emit(&mut out, UdpChecksum::Compute), Ok(end));
        assert!(
            RoceV2Packet::parse(&out)
                .expect("checksummed")
                .udp_checksum_ok()
        );
    }

    if let Ok(r) = RoceV2Repr::parse(data) {
        let mut out = vec![0u8; r.buffer_len()];
        assert_eq!(r.emit(&mut out, UdpChecksum::Zero), Ok(out.len()));
        let back = RoceV2Repr::parse(&out).expect("re-parse of our own emit");
        assert_eq!(back.packet, r.packet);
        if data[..out.len()] == out[..] {
            assert_eq!(back, r);
        }
    }
});
