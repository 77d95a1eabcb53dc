//! The RoCEv2 ICRC from the UDP payload alone, for drivers on an ordinary
//! UDP socket (ib-transport.md §13.6; EXT-ROCE-02).
//!
//! [`rocev2::icrc`](crate::rocev2::icrc) hashes the whole packet from the
//! first IP octet. A socket hands over only the UDP payload (BTH .. ICRC),
//! the peer's address and port (`recvmsg` `msg_name`) and the local ones
//! (`IP_PKTINFO` `ipi_addr` / `IPV6_PKTINFO`, the bound port): an
//! [`Endpoints`]. The ICRC masks the IPv4 TOS, TTL and header checksum, the
//! IPv6 traffic class, flow label and hop limit, and the UDP checksum; the
//! lengths follow from the payload length, RoCEv2 senders set DF with
//! fragment offset 0, rxe uses IHL 5 and no IPv6 extension headers. So
//! every covered header octet is known, with one exception: the 16-bit
//! IPv4 **Identification**, which no socket API reports on receive.
//!
//! * [`icrc_for`] computes the ICRC of the packet that would carry a
//!   payload, given the endpoints and (IPv4) the Identification — the value
//!   a sender puts on the wire and exactly what `rocev2::icrc` computes
//!   over the emitted packet. It hashes the masked pseudo-headers from a
//!   small stack buffer, then the payload in place (no packet copy).
//! * [`IcrcVerifier::verify`] checks a received datagram. IPv6: recompute
//!   and compare. IPv4: the CRC is affine over GF(2), so for a fixed
//!   packet length `crc(M with ID x) = crc(M with ID 0) ^ L_n(x)` with
//!   `L_n` linear in the 16 ID bits (and injective: `L_n(x)` is `x(t)`
//!   times a power of `t` modulo the CRC polynomial, which is coprime to
//!   `t`). The verifier hashes once with ID 0 — the fast path, done when the
//!   peer sent ID 0 (see below) — and otherwise
//!   solves `L_n(x) = received ^ crc(M_0)` with a basis of `L_n` in reduced
//!   echelon form, precomputed once per payload length (O(log n) GF(2)
//!   polynomial products, no pass over the packet) and kept in a bounded
//!   cache. A solution is the Identification the sender used (Linux rxe
//!   sends a hashed, non-zero one); none means the packet is corrupt.
//!
//! # What an IPv4 check is worth
//!
//! For an IPv4 peer the verifier cannot know the Identification, so it
//! accepts a packet whose ICRC matches *any* of the 2^16 possible values:
//! of the 32 check bits, 16 still detect errors and 16 are spent on
//! recovering the unknown ID. A random corruption (one that leaves the
//! received-minus-computed syndrome uniformly distributed) passes with
//! probability 2^-16 instead of 2^-32. The Ethernet FCS still guards each
//! hop, and a single-bit error is always caught for every payload of up to
//! [`SINGLE_BIT_SAFE_PAYLOAD_LEN`] octets (far above any IB MTU): a flip
//! `m` bits after the ID field would pass only if `t^-m mod P` had degree
//! below 16, and the smallest such `m` is [`FIRST_BLIND_DISTANCE`] (checked
//! exhaustively by the tests). Beyond that length particular single-bit
//! flips are accepted (with a wrong ID); a test exhibits one. When the peer
//! is known to send a fixed Identification (a Linux UDP socket, unconnected
//! and with `IP_MTU_DISCOVER` = `IP_PMTUDISC_DO`, sends 0 with DF),
//! [`verify_exact`] keeps all 32 bits. IPv6 keeps all 32.
//!
//! BTH octet 4 (FECN, BECN, Resv6) is masked by the ICRC itself (IBT-C9-6)
//! and is never covered, whichever check is used.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use rustc_hash::FxHashMap;

use crate::ib::BTH_LEN;
use crate::rocev2::{ICRC_LEN, IP_PROTO_UDP, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};

/// Largest payload (BTH .. pad, ICRC excluded) an IPv4 packet can carry.
pub const MAX_IPV4_PAYLOAD_LEN: usize = 0xFFFF - IPV4_HEADER_LEN - UDP_HEADER_LEN - ICRC_LEN;
/// Largest payload (BTH .. pad, ICRC excluded) an IPv6 packet without a
/// jumbogram can carry.
pub const MAX_IPV6_PAYLOAD_LEN: usize = 0xFFFF - UDP_HEADER_LEN - ICRC_LEN;
/// The smallest `m >= 1` with `t^-m mod P` of degree below 16 (P the CRC-32
/// polynomial): a single-bit error `m` bit positions after the last bit of
/// the IPv4 Identification (the ICRC counted as 32 bits after the payload,
/// its `t^31` coefficient first) is indistinguishable from a change of ID.
pub const FIRST_BLIND_DISTANCE: u64 = 214_135;
/// Every single-bit flip in the payload or ICRC of an IPv4 packet with a
/// payload (ICRC excluded) of at most this many octets is rejected by
/// [`IcrcVerifier::verify`], whatever the ID: the farthest flip, in the
/// ICRC, is `(22 + len) * 8 + 32` bit positions from the ID field, below
/// [`FIRST_BLIND_DISTANCE`].
pub const SINGLE_BIT_SAFE_PAYLOAD_LEN: usize =
    ((FIRST_BLIND_DISTANCE - 1 - 32) / 8) as usize - OCTETS_AFTER_ID;
/// Octets of the IPv4 header after the Identification, plus the UDP header.
const OCTETS_AFTER_ID: usize = IPV4_HEADER_LEN - 6 + UDP_HEADER_LEN;

/// Default bound on the number of payload lengths [`IcrcVerifier`] keeps a
/// basis for.
pub const DEFAULT_CACHED_LENGTHS: usize = 256;

// ------------------------------------------------------------ endpoints

/// Addresses and ports of a received (or to-be-sent) RoCEv2 datagram:
/// `src` / `src_port` the sender's, `dst` / `dst_port` the receiver's.
///
/// Both addresses should be of one family. A dual-stack socket reports
/// IPv4 traffic with IPv4-mapped addresses (`::ffff:a.b.c.d`); a pair whose
/// members are both IPv4 or IPv4-mapped is taken as IPv4 (what was on the
/// wire). Otherwise the packet is IPv6, an IPv4 address standing for its
/// mapped form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
}

impl Endpoints {
    /// From the sender's and the receiver's socket addresses.
    pub const fn from_socket_addrs(src: SocketAddr, dst: SocketAddr) -> Self {
        Endpoints {
            src: src.ip(),
            dst: dst.ip(),
            src_port: src.port(),
            dst_port: dst.port(),
        }
    }

    /// True when the packet travels over IPv4 (see the type's docs).
    pub fn is_ipv4(&self) -> bool {
        self.family().is_v4()
    }

    fn family(&self) -> Family {
        match (v4_of(self.src), v4_of(self.dst)) {
            (Some(s), Some(d)) => Family::V4(s, d),
            _ => Family::V6(v6_of(self.src), v6_of(self.dst)),
        }
    }
}

enum Family {
    V4(Ipv4Addr, Ipv4Addr),
    V6(Ipv6Addr, Ipv6Addr),
}

impl Family {
    fn is_v4(&self) -> bool {
        matches!(self, Family::V4(..))
    }

    fn max_payload_len(&self) -> usize {
        if self.is_v4() {
            MAX_IPV4_PAYLOAD_LEN
        } else {
            MAX_IPV6_PAYLOAD_LEN
        }
    }
}

fn v4_of(a: IpAddr) -> Option<Ipv4Addr> {
    match a {
        IpAddr::V4(a) => Some(a),
        // `to_ipv4_mapped` as one compare of the high 96 bits (it runs twice a packet).
        IpAddr::V6(a) => {
            let bits = a.to_bits();
            (bits >> 32 == 0xffff).then(|| Ipv4Addr::from_bits(bits as u32))
        }
    }
}

fn v6_of(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

// ------------------------------------------------------------ ICRC

/// Longest masked prefix: LRH stand-in, IPv6 header, UDP header, BTH.
const PREFIX_MAX: usize = 8 + IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;

/// The ICRC of the RoCEv2 packet that carries `payload` (the UDP payload
/// without the 4 ICRC octets: BTH .. pad) between `ep`, over IPv4 with
/// IHL 5, DF, fragment offset 0 and Identification `ipv4_id`, or over IPv6
/// without extension headers (`ipv4_id` ignored). Equal to
/// [`rocev2::icrc`](crate::rocev2::icrc) over that packet; store it with
/// `to_le_bytes`.
///
/// The IP and UDP length fields are `payload.len()` plus the headers and
/// ICRC, truncated to 16 bits: keep the payload within
/// [`MAX_IPV4_PAYLOAD_LEN`] / [`MAX_IPV6_PAYLOAD_LEN`]. A payload shorter
/// than a BTH is hashed as it is (octet 4, if present, masked).
pub fn icrc_for(ep: &Endpoints, ipv4_id: u16, payload: &[u8]) -> u32 {
    icrc_in(&ep.family(), ep, ipv4_id, payload)
}

/// [`icrc_for`], or `None` for a payload longer than an IP packet between `ep` carries
/// ([`MAX_IPV4_PAYLOAD_LEN`] / [`MAX_IPV6_PAYLOAD_LEN`]): the transmit side's check and
/// ICRC, the family worked out once.
pub fn icrc_checked(ep: &Endpoints, ipv4_id: u16, payload: &[u8]) -> Option<u32> {
    let family = ep.family();
    (payload.len() <= family.max_payload_len()).then(|| icrc_in(&family, ep, ipv4_id, payload))
}

/// [`icrc_for`] with the address family already worked out (once a packet).
fn icrc_in(family: &Family, ep: &Endpoints, ipv4_id: u16, payload: &[u8]) -> u32 {
    let mut buf = [0xFFu8; PREFIX_MAX];
    let udp_len = (UDP_HEADER_LEN + payload.len() + ICRC_LEN) as u16;
    let mut n = 8; // masked LRH: eight 0xFF octets
    match *family {
        Family::V4(src, dst) => {
            let total = (IPV4_HEADER_LEN as u16).wrapping_add(udp_len);
            let h = &mut buf[n..n + IPV4_HEADER_LEN];
            h[0] = 0x45;
            // h[1] TOS: masked
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[4..6].copy_from_slice(&ipv4_id.to_be_bytes());
            h[6] = 0x40; // DF, fragment offset 0
            h[7] = 0;
            // h[8] TTL: masked
            h[9] = IP_PROTO_UDP;
            // h[10..12] header checksum: masked
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
            n += IPV4_HEADER_LEN;
        }
        Family::V6(src, dst) => {
            let h = &mut buf[n..n + IPV6_HEADER_LEN];
            // h[0..4] version 6, traffic class and flow label masked to ones.
            h[0] = 0x6F;
            h[4..6].copy_from_slice(&udp_len.to_be_bytes());
            h[6] = IP_PROTO_UDP;
            // h[7] hop limit: masked
            h[8..24].copy_from_slice(&src.octets());
            h[24..40].copy_from_slice(&dst.octets());
            n += IPV6_HEADER_LEN;
        }
    }
    let u = &mut buf[n..n + UDP_HEADER_LEN];
    u[0..2].copy_from_slice(&ep.src_port.to_be_bytes());
    u[2..4].copy_from_slice(&ep.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    // u[6..8] checksum: masked
    n += UDP_HEADER_LEN;
    let b = payload.len().min(BTH_LEN);
    buf[n..n + b].copy_from_slice(&payload[..b]);
    if b > 4 {
        buf[n + 4] = 0xFF; // F, B, Resv6
    }
    n += b;
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..n]);
    h.update(&payload[b..]);
    h.finalize()
}

/// True when `datagram` (UDP payload, ICRC included) carries the ICRC of a
/// packet between `ep` with IPv4 Identification `ipv4_id` (ignored for
/// IPv6): the full 32-bit check, for peers whose Identification is known.
pub fn verify_exact(ep: &Endpoints, ipv4_id: u16, datagram: &[u8]) -> bool {
    let family = ep.family();
    match split(family.max_payload_len(), datagram) {
        Some((payload, received)) => icrc_in(&family, ep, ipv4_id, payload) == received,
        None => false,
    }
}

/// Payload and received ICRC, or `None` when the datagram is too short for
/// BTH + ICRC or too long for the family.
fn split(max: usize, datagram: &[u8]) -> Option<(&[u8], u32)> {
    if datagram.len() < BTH_LEN + ICRC_LEN || datagram.len() - ICRC_LEN > max {
        return None;
    }
    let (payload, t) = datagram.split_at(datagram.len() - ICRC_LEN);
    Some((payload, u32::from_le_bytes([t[0], t[1], t[2], t[3]])))
}

// ------------------------------------------------------------ verifier

/// Outcome of [`IcrcVerifier::verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcrcCheck {
    /// The ICRC is right. `ipv4_id`: the Identification the sender used
    /// (IPv4), `None` for IPv6.
    Valid { ipv4_id: Option<u16> },
    /// Wrong ICRC, or a datagram shorter than BTH + ICRC or longer than an
    /// IP packet allows: drop it (IBT-X-20).
    Invalid,
}

/// Receive-side ICRC check from the UDP payload, with a bounded cache of
/// per-length bases for solving the IPv4 Identification (module docs).
#[derive(Debug, Clone)]
pub struct IcrcVerifier {
    // Lengths come from the peer, but the map is bounded by `max_lengths`.
    bases: FxHashMap<usize, Basis>,
    max_lengths: usize,
}

impl Default for IcrcVerifier {
    fn default() -> Self {
        Self::new()
    }
}

impl IcrcVerifier {
    /// A verifier caching bases for up to [`DEFAULT_CACHED_LENGTHS`]
    /// payload lengths.
    pub fn new() -> Self {
        Self::with_cached_lengths(DEFAULT_CACHED_LENGTHS)
    }

    /// A verifier caching bases for up to `max_lengths` payload lengths
    /// (0: build one per packet that needs it). At the bound an arbitrary
    /// entry is evicted.
    pub fn with_cached_lengths(max_lengths: usize) -> Self {
        IcrcVerifier {
            bases: FxHashMap::default(),
            max_lengths,
        }
    }

    /// Payload lengths currently cached.
    pub fn cached_lengths(&self) -> usize {
        self.bases.len()
    }

    /// Checks the ICRC of `datagram` (UDP payload: BTH .. pad, then the
    /// ICRC least-significant octet first) received between `ep`. For IPv4
    /// the Identification is recovered (module docs: 16 of the 32 bits
    /// then detect errors).
    pub fn verify(&mut self, ep: &Endpoints, datagram: &[u8]) -> IcrcCheck {
        let family = ep.family();
        let ipv4 = family.is_v4();
        let Some((payload, received)) = split(family.max_payload_len(), datagram) else {
            return IcrcCheck::Invalid;
        };
        let computed = icrc_in(&family, ep, 0, payload);
        if !ipv4 {
            return if computed == received {
                IcrcCheck::Valid { ipv4_id: None }
            } else {
                IcrcCheck::Invalid
            };
        }
        if computed == received {
            return IcrcCheck::Valid { ipv4_id: Some(0) };
        }
        let syndrome = computed ^ received;
        let solved = match self.bases.get(&payload.len()) {
            Some(b) => b.solve(syndrome),
            None => {
                let b = Basis::for_payload_len(payload.len());
                let s = b.solve(syndrome);
                if self.max_lengths > 0 {
                    if self.bases.len() >= self.max_lengths
                        && let Some(&k) = self.bases.keys().next()
                    {
                        self.bases.remove(&k);
                    }
                    self.bases.insert(payload.len(), b);
                }
                s
            }
        };
        match solved {
            Some(id) => IcrcCheck::Valid { ipv4_id: Some(id) },
            None => IcrcCheck::Invalid,
        }
    }
}

// ------------------------------------------------------------ GF(2) algebra

// CRC-32 (zlib) in its reflected representation: the coefficient of t^k
// sits in bit 31 - k, so ONE = t^0 is the top bit and multiplying by t is a
// right shift (with reduction). A raw CRC (register starting at 0, no final
// complement) of a message M(t) is M(t) * t^32 mod P.

/// P without its t^32 term, reflected.
const POLY: u32 = 0xEDB8_8320;
/// t^0.
const ONE: u32 = 0x8000_0000;

/// a * b mod P (zlib's `multmodp`).
const fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut m = ONE;
    let mut p = 0u32;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        if m == 0 {
            return p;
        }
    }
}

/// X2N[k] = t^(2^k) mod P.
const X2N: [u32; 64] = {
    let mut t = [0u32; 64];
    let mut p = ONE >> 1; // t^1
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = multmodp(p, p);
        k += 1;
    }
    t
};

/// t^(8 n) mod P: the operator appending `n` zero octets to a raw CRC.
fn zeros_op(mut n: u64) -> u32 {
    let mut p = ONE;
    let mut k = 3;
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(X2N[k & 63], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// Raw CRC of `bytes` continuing from register `crc` (bitwise).
const fn raw_crc(mut crc: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i < bytes.len() {
        crc ^= bytes[i] as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            k += 1;
        }
        i += 1;
    }
    crc
}

/// b * t mod P.
const fn mul_t(b: u32) -> u32 {
    if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 }
}

/// ID_SHIFT[j]: how many bits after Identification bit j the field ends.
/// The ID is sent big-endian and a reflected CRC takes each octet least
/// significant bit first, so bit 7 goes last and bit 8 first; the raw CRC
/// of the field with bit j set is that of bit 7 times t^ID_SHIFT[j].
const ID_SHIFT: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut j = 0;
    while j < 16 {
        t[j] = if j >= 8 { 23 - j as u8 } else { 7 - j as u8 };
        j += 1;
    }
    t
};

/// L_n(id) for a payload of `payload_len` octets (BTH .. pad): what the ICRC
/// of an IPv4 packet changes by (XOR) when its Identification goes from 0 to
/// `id`. A sender whose kernel numbers the segments of a UDP GSO run (0, 1, 2,
/// ... after a first ID of 0) fixes each segment's ICRC with it.
pub fn ipv4_id_syndrome(payload_len: usize, id: u16) -> u32 {
    Ipv4IdSyndromes::new(payload_len).of(id)
}

/// [`ipv4_id_syndrome`] for one payload length and many Identifications: the
/// syndromes of the 16 ID bits, computed once (the zero-extension operator, one
/// product, shifts); an ID's is then the XOR of its bits'. A GSO run's segments
/// share their length, and so do most runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdSyndromes {
    payload_len: usize,
    /// `bits[j]`: L_n(1 << j).
    bits: [u32; 16],
}

impl Ipv4IdSyndromes {
    /// The syndromes of payloads of `payload_len` octets (BTH .. pad).
    pub fn new(payload_len: usize) -> Ipv4IdSyndromes {
        let op = zeros_op((OCTETS_AFTER_ID + payload_len) as u64);
        // L_n(bit 7) * t^k for k = 0..=15.
        let mut pow = [multmodp(op, raw_crc(0, &[0, 0x80])); 16];
        for k in 1..16 {
            pow[k] = mul_t(pow[k - 1]);
        }
        Ipv4IdSyndromes {
            payload_len,
            bits: ID_SHIFT.map(|shift| pow[shift as usize]),
        }
    }

    /// The payload length these syndromes are for.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// L_n(id).
    pub fn of(&self, id: u16) -> u32 {
        let (mut s, mut rest) = (0, id);
        while rest != 0 {
            s ^= self.bits[rest.trailing_zeros() as usize];
            rest &= rest - 1;
        }
        s
    }

    /// Makes the ICRC at the end of `datagram` (UDP payload: BTH .. ICRC, computed for
    /// Identification 0) the one for `id`. A datagram whose payload is not of this
    /// length gets its own syndrome; one shorter than an ICRC is left as it is.
    pub fn set(&self, datagram: &mut [u8], id: u16) {
        let Some(n) = datagram.len().checked_sub(ICRC_LEN) else {
            return;
        };
        let syndrome = if n == self.payload_len {
            self.of(id)
        } else {
            ipv4_id_syndrome(n, id)
        };
        let icrc = &mut datagram[n..];
        let old = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
        icrc.copy_from_slice(&(old ^ syndrome).to_le_bytes());
    }
}

/// Makes the ICRC at the end of `datagram` (UDP payload: BTH .. ICRC, the ICRC computed
/// for IPv4 Identification 0) the one for Identification `id`. A datagram shorter than
/// an ICRC is left as it is.
pub fn set_ipv4_id(datagram: &mut [u8], id: u16) {
    let n = datagram.len().saturating_sub(ICRC_LEN);
    Ipv4IdSyndromes::new(n).set(datagram, id);
}

#[derive(Debug, Clone, Copy, Default)]
struct Row {
    /// Syndrome contribution, pivot bit cleared in every other row.
    vec: u32,
    /// The row's pivot bit.
    pivot: u32,
    /// The ID bits whose syndromes sum to `vec`.
    id: u16,
}

/// `L_n` in reduced row echelon form.
#[derive(Debug, Clone, Copy)]
struct Basis {
    rows: [Row; 16],
    len: usize,
}

impl Basis {
    /// The 16 ID bits' syndromes, then a 16 x 32 elimination.
    fn for_payload_len(payload_len: usize) -> Basis {
        let bits = Ipv4IdSyndromes::new(payload_len).bits;
        let mut b = Basis {
            rows: [Row::default(); 16],
            len: 0,
        };
        for (j, &vec) in bits.iter().enumerate() {
            let mut r = Row {
                vec,
                pivot: 0,
                id: 1 << j,
            };
            for e in &b.rows[..b.len] {
                if r.vec & e.pivot != 0 {
                    r.vec ^= e.vec;
                    r.id ^= e.id;
                }
            }
            if r.vec == 0 {
                // Dependent: cannot happen (L_n is injective), kept total.
                continue;
            }
            r.pivot = 1 << (31 - r.vec.leading_zeros());
            for e in &mut b.rows[..b.len] {
                if e.vec & r.pivot != 0 {
                    e.vec ^= r.vec;
                    e.id ^= r.id;
                }
            }
            b.rows[b.len] = r;
            b.len += 1;
        }
        b
    }

    /// The `id` with `L_n(id) == syndrome`, if any.
    fn solve(&self, mut syndrome: u32) -> Option<u16> {
        let mut id = 0u16;
        for r in &self.rows[..self.len] {
            if syndrome & r.pivot != 0 {
                syndrome ^= r.vec;
                id ^= r.id;
            }
        }
        (syndrome == 0).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::{BthRepr, DethRepr, Opcode, PacketRepr};
    use crate::rocev2::{self, IpRepr, Ipv4Repr, Ipv6Repr, RoceV2Repr, UdpChecksum, UdpRepr};
    use proptest::prelude::*;

    /// xorshift64*: deterministic randomness for the measured tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn v4_ep() -> Endpoints {
        Endpoints {
            src: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 3)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2)),
            src_port: 0xC211,
            dst_port: rocev2::ROCEV2_UDP_PORT,
        }
    }

    fn v6_ep() -> Endpoints {
        Endpoints {
            src: IpAddr::V6("fe80::5054:ff:fe77:3".parse().unwrap()),
            dst: IpAddr::V6("2001:db8::2".parse().unwrap()),
            src_port: 0xD00D,
            dst_port: rocev2::ROCEV2_UDP_PORT,
        }
    }

    /// Emits a UD SEND Only (BTH + DETH + payload + pad) with `rocev2` and
    /// returns the whole packet and the offset of the UDP payload. The
    /// masked fields get non-zero values to prove they are masked.
    fn emit(ep: &Endpoints, id: u16, payload: &[u8], csum: UdpChecksum) -> (Vec<u8>, usize) {
        let ip = match ep.family() {
            Family::V4(s, d) => {
                let mut r = Ipv4Repr::new_udp(s, d);
                r.ident = id;
                r.dscp = 26;
                r.ecn = 3;
                r.ttl = 17;
                IpRepr::Ipv4(r)
            }
            Family::V6(s, d) => {
                let mut r = Ipv6Repr::new_udp(s, d);
                r.traffic_class = 0xB9;
                r.flow_label = 0xABCDE;
                r.hop_limit = 3;
                IpRepr::Ipv6(r)
            }
        };
        let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, 0x11, 0x123456);
        bth.becn = true;
        let mut packet = PacketRepr::new(bth, payload);
        packet.deth = Some(DethRepr {
            q_key: 0x1111_2222,
            reserved: 0,
            src_qp: 0x33,
        });
        let udp = UdpRepr {
            dst_port: ep.dst_port,
            ..UdpRepr::rocev2(ep.src_port)
        };
        let r = RoceV2Repr { ip, udp, packet };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf, csum).unwrap();
        let off = r.ip.buffer_len() + UDP_HEADER_LEN;
        (buf, off)
    }

    #[test]
    fn algebra_sanity() {
        // The ID bits' raw CRCs are shifts of bit 7's.
        let last = raw_crc(0, &[0, 0x80]);
        for (j, &k) in ID_SHIFT.iter().enumerate() {
            let mut p = last;
            for _ in 0..k {
                p = mul_t(p);
            }
            assert_eq!(p, raw_crc(0, &(1u16 << j).to_be_bytes()), "bit {j}");
        }
        // t * t^-1 = 1, with t^-1 = (P - 1) / t.
        let inv_t = (POLY << 1) | 1;
        assert_eq!(multmodp(ONE >> 1, inv_t), ONE);
        assert_eq!(X2N[3], ONE >> 8);
        // The zero-extension operator agrees with hashing zeros.
        for n in [0u64, 1, 2, 3, 7, 100, 1000, 4133] {
            let c = raw_crc(0, b"abc");
            let z = vec![0u8; n as usize];
            assert_eq!(multmodp(zeros_op(n), c), raw_crc(c, &z), "n={n}");
        }
    }

    /// L_n(x) = icrc(M_x) ^ icrc(M_0), and the basis solves it exactly.
    #[test]
    fn syndrome_and_basis_match_the_crc() {
        let ep = v4_ep();
        let mut rng = Rng(1);
        for len in [
            0usize,
            1,
            12,
            13,
            40,
            255,
            1024,
            1036,
            4124,
            MAX_IPV4_PAYLOAD_LEN,
        ] {
            let p = rng.bytes(len);
            let base = icrc_for(&ep, 0, &p);
            let b = Basis::for_payload_len(len);
            assert_eq!(b.len, 16, "L_n injective for len {len}");
            for id in [1u16, 2, 0x8000, 0xFFFF, rng.next() as u16] {
                let s = icrc_for(&ep, id, &p) ^ base;
                assert_eq!(s, ipv4_id_syndrome(len, id), "len {len} id {id:#x}");
                assert_eq!(b.solve(s), Some(id));
                let mut d = [&p[..], &base.to_le_bytes()].concat();
                let fixed = icrc_for(&ep, id, &p).to_le_bytes();
                let mut e = d.clone();
                set_ipv4_id(&mut d, id);
                assert_eq!(d[len..], fixed, "len {len}");
                // A run's syndromes: of its own length, and of a shorter last segment.
                let run = Ipv4IdSyndromes::new(len);
                assert_eq!(run.of(id), s);
                let mut f = e.clone();
                run.set(&mut f, id);
                Ipv4IdSyndromes::new(len + 1).set(&mut e, id);
                assert_eq!(
                    (&f[len..], &e[len..]),
                    (&fixed[..], &fixed[..]),
                    "len {len}"
                );
            }
            assert_eq!(b.solve(0), Some(0));
        }
    }

    /// icrc_for equals rocev2::icrc over emitted packets (EXT-ROCE-02).
    #[test]
    fn icrc_for_matches_rocev2_icrc() {
        let mut rng = Rng(2);
        for ep in [v4_ep(), v6_ep()] {
            for len in [0usize, 1, 2, 3, 4, 5, 100, 1024, 4096] {
                let p = rng.bytes(len);
                for id in [0u16, 1, 0x4000, 0xFFFF, rng.next() as u16] {
                    for csum in [UdpChecksum::Zero, UdpChecksum::Compute] {
                        let (pkt, off) = emit(&ep, id, &p, csum);
                        let body = &pkt[..pkt.len() - ICRC_LEN];
                        let want = rocev2::icrc(body).unwrap();
                        assert_eq!(icrc_for(&ep, id, &body[off..]), want);
                        assert_eq!(pkt[pkt.len() - 4..], want.to_le_bytes());
                    }
                }
            }
        }
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        let v4 = v4_ep();
        let mapped = Endpoints {
            src: IpAddr::V6("::ffff:10.77.0.3".parse().unwrap()),
            dst: IpAddr::V6("::ffff:10.77.0.2".parse().unwrap()),
            ..v4
        };
        assert!(v4.is_ipv4() && mapped.is_ipv4() && !v6_ep().is_ipv4());
        // Near the mapped prefix, but IPv6: IPv4-compatible, and one bit off either way.
        for other in ["::10.77.0.2", "::fffe:10.77.0.2", "::1:ffff:10.77.0.2"] {
            let near = Endpoints {
                src: IpAddr::V6(other.parse().unwrap()),
                ..mapped
            };
            assert!(!near.is_ipv4(), "{other}");
        }
        let p = [7u8; 40];
        assert_eq!(icrc_for(&v4, 9, &p), icrc_for(&mapped, 9, &p));
        // The length limit follows the family, mapped addresses IPv4's.
        assert_eq!(icrc_checked(&mapped, 9, &p), Some(icrc_for(&v4, 9, &p)));
        let long = vec![7u8; MAX_IPV4_PAYLOAD_LEN + 1];
        assert_eq!(icrc_checked(&mapped, 0, &long), None);
        assert_eq!(
            icrc_checked(&v4, 0, &long[..MAX_IPV4_PAYLOAD_LEN]),
            Some(icrc_for(&v4, 0, &long[..MAX_IPV4_PAYLOAD_LEN]))
        );
        assert!(icrc_checked(&v6_ep(), 0, &long).is_some());
        let longer = vec![7u8; MAX_IPV6_PAYLOAD_LEN + 1];
        assert_eq!(icrc_checked(&v6_ep(), 0, &longer), None);
        // Mixed families: IPv6 with the mapped address.
        let mixed = Endpoints {
            dst: IpAddr::V6("2001:db8::2".parse().unwrap()),
            ..v4
        };
        let as_v6 = Endpoints {
            src: IpAddr::V6("::ffff:10.77.0.3".parse().unwrap()),
            ..mixed
        };
        assert!(!mixed.is_ipv4());
        assert_eq!(icrc_for(&mixed, 0, &p), icrc_for(&as_v6, 0, &p));
        let s = SocketAddr::new(v4.src, v4.src_port);
        let d = SocketAddr::new(v4.dst, v4.dst_port);
        assert_eq!(Endpoints::from_socket_addrs(s, d), v4);
    }

    #[test]
    fn verifier_recovers_ids_and_caches() {
        let ep = v4_ep();
        let mut v = IcrcVerifier::with_cached_lengths(3);
        let mut rng = Rng(3);
        for len in [12usize, 16, 40, 1024, 12, 16, 2000, 3000] {
            let p = rng.bytes(len);
            for id in [0u16, 1, 0x1234, 0xFFFF] {
                let (pkt, off) = emit(&ep, id, &p, UdpChecksum::Zero);
                let d = &pkt[off..];
                assert_eq!(v.verify(&ep, d), IcrcCheck::Valid { ipv4_id: Some(id) });
                assert!(verify_exact(&ep, id, d));
                assert!(!verify_exact(&ep, id ^ 1, d));
            }
            assert!(v.cached_lengths() <= 3);
        }
        // No cache at all still verifies.
        let mut nc = IcrcVerifier::with_cached_lengths(0);
        let (pkt, off) = emit(&ep, 0xBEEF, &[1, 2, 3], UdpChecksum::Zero);
        assert_eq!(
            nc.verify(&ep, &pkt[off..]),
            IcrcCheck::Valid {
                ipv4_id: Some(0xBEEF)
            }
        );
        assert_eq!(nc.cached_lengths(), 0);
        // IPv6.
        let e6 = v6_ep();
        let (pkt, off) = emit(&e6, 0, b"hello", UdpChecksum::Compute);
        assert_eq!(
            v.verify(&e6, &pkt[off..]),
            IcrcCheck::Valid { ipv4_id: None }
        );
        // Wrong endpoints fail.
        let other = Endpoints {
            src_port: 0xC212,
            ..e6
        };
        assert_eq!(v.verify(&other, &pkt[off..]), IcrcCheck::Invalid);
    }

    #[test]
    fn short_and_oversized_datagrams_are_invalid() {
        let mut v = IcrcVerifier::new();
        for ep in [v4_ep(), v6_ep()] {
            for n in 0..BTH_LEN + ICRC_LEN {
                let d = vec![0u8; n];
                assert_eq!(v.verify(&ep, &d), IcrcCheck::Invalid);
                assert!(!verify_exact(&ep, 0, &d));
            }
        }
        let ep = v4_ep();
        let big = vec![0u8; MAX_IPV4_PAYLOAD_LEN + 1];
        let c = icrc_for(&ep, 0, &big);
        let mut d = big;
        d.extend_from_slice(&c.to_le_bytes());
        assert_eq!(v.verify(&ep, &d), IcrcCheck::Invalid);
        let e6 = v6_ep();
        let c6 = icrc_for(&e6, 0, &d[..d.len() - 4]);
        let n = d.len();
        d[n - 4..].copy_from_slice(&c6.to_le_bytes());
        assert_eq!(
            v.verify(&e6, &d),
            IcrcCheck::Valid { ipv4_id: None },
            "fits IPv6"
        );
    }

    /// The proof behind SINGLE_BIT_SAFE_PAYLOAD_LEN: over every distance an
    /// IPv4 packet allows, `t^-m mod P` first has degree < 16 at
    /// FIRST_BLIND_DISTANCE.
    #[test]
    fn single_bit_blind_distance_exhaustive() {
        let max_m = ((OCTETS_AFTER_ID + MAX_IPV4_PAYLOAD_LEN) * 8 + 32) as u64;
        // y <- y * t^-1: undo `(b >> 1) ^ (POLY if b & 1)`.
        let div_t = |y: u32| {
            if y & ONE != 0 {
                ((y ^ POLY) << 1) | 1
            } else {
                y << 1
            }
        };
        let mut y = ONE;
        let mut blind = Vec::new();
        for m in 1..=max_m {
            y = div_t(y);
            // Degree < 16: the coefficients of t^16..t^31 (bits 15..0) vanish.
            if y & 0xFFFF == 0 {
                blind.push(m);
            }
        }
        assert_eq!(blind.first(), Some(&FIRST_BLIND_DISTANCE));
        assert_eq!(SINGLE_BIT_SAFE_PAYLOAD_LEN, 26_740);
        let reach = |len: usize| ((OCTETS_AFTER_ID + len) * 8 + 32) as u64;
        assert!(reach(SINGLE_BIT_SAFE_PAYLOAD_LEN) < FIRST_BLIND_DISTANCE);
        assert!(reach(SINGLE_BIT_SAFE_PAYLOAD_LEN + 1) >= FIRST_BLIND_DISTANCE);
        eprintln!("blind distances up to {max_m}: {blind:?}");
    }

    /// The bound is tight: one octet more and a flip of ICRC bit 30 (t^1)
    /// passes, with a wrong ID.
    #[test]
    fn single_bit_bound_is_tight() {
        let ep = v4_ep();
        let mut v = IcrcVerifier::new();
        let mut rng = Rng(4);
        let len = SINGLE_BIT_SAFE_PAYLOAD_LEN + 1;
        let p = rng.bytes(len);
        let mut d = p.clone();
        d.extend_from_slice(&icrc_for(&ep, 0x5555, &p).to_le_bytes());
        let n = d.len();
        d[n - 4..].copy_from_slice(&(icrc_for(&ep, 0x5555, &p) ^ (1 << 30)).to_le_bytes());
        assert!(matches!(
            v.verify(&ep, &d),
            IcrcCheck::Valid { ipv4_id: Some(x) } if x != 0x5555
        ));
        // At the safe length every ICRC bit flip is rejected.
        let p = &p[..len - 1];
        let good = icrc_for(&ep, 0x5555, p);
        for bit in 0..32 {
            let mut d = p.to_vec();
            d.extend_from_slice(&(good ^ (1 << bit)).to_le_bytes());
            assert_eq!(v.verify(&ep, &d), IcrcCheck::Invalid, "bit {bit}");
        }
    }

    /// Every single-bit flip in payload (but the masked BTH octet 4) and
    /// ICRC is rejected, exhaustively for a few packets.
    #[test]
    fn single_bit_flips_rejected_exhaustively() {
        let mut v = IcrcVerifier::new();
        let mut rng = Rng(5);
        for (ep, id, len) in [
            (v4_ep(), 0u16, 12usize),
            (v4_ep(), 0x9A3C, 13),
            (v4_ep(), 0xFFFF, 300),
            (v4_ep(), 0x0001, 1036),
            (v6_ep(), 0, 64),
        ] {
            let p = rng.bytes(len);
            let mut d = p.clone();
            d.extend_from_slice(&icrc_for(&ep, id, &p).to_le_bytes());
            let want = IcrcCheck::Valid {
                ipv4_id: ep.is_ipv4().then_some(id),
            };
            assert_eq!(v.verify(&ep, &d), want);
            for i in 0..d.len() {
                for bit in 0..8 {
                    d[i] ^= 1 << bit;
                    let r = v.verify(&ep, &d);
                    if i == 4 {
                        assert_eq!(r, want, "BTH octet 4 is masked");
                    } else {
                        assert_eq!(r, IcrcCheck::Invalid, "octet {i} bit {bit}");
                    }
                    d[i] ^= 1 << bit;
                }
            }
        }
    }

    /// Random 32-bit ICRC replacement: accepted 2^-16 of the time for IPv4
    /// (16 bits spent on the ID), never in the sample for IPv6.
    #[test]
    fn random_corruption_acceptance_rate() {
        let mut v = IcrcVerifier::new();
        let mut rng = Rng(6);
        let p = rng.bytes(20);
        let trials = 1u32 << 20;
        let mut accepted = [0u32; 2];
        for (k, ep) in [v4_ep(), v6_ep()].iter().enumerate() {
            let good = icrc_for(ep, 0x77, &p);
            let mut d = p.clone();
            d.extend_from_slice(&[0; 4]);
            for _ in 0..trials {
                let c = (rng.next() >> 32) as u32;
                if c == good {
                    continue;
                }
                d[20..].copy_from_slice(&c.to_le_bytes());
                if v.verify(ep, &d) != IcrcCheck::Invalid {
                    accepted[k] += 1;
                }
            }
        }
        eprintln!(
            "accepted of {trials}: IPv4 {}, IPv6 {}",
            accepted[0], accepted[1]
        );
        // Expected 16 (Poisson); fixed seed.
        assert!((4..=40).contains(&accepted[0]), "{accepted:?}");
        assert_eq!(accepted[1], 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn prop_icrc_for_matches_emitted(payload in proptest::collection::vec(any::<u8>(), 0..1500),
                                         id in any::<u16>(), v6 in any::<bool>(),
                                         s in any::<u32>(), d in any::<u128>(), sport in any::<u16>()) {
            let ep = if v6 {
                Endpoints { src: IpAddr::V6(Ipv6Addr::from(d ^ 1)), dst: IpAddr::V6(Ipv6Addr::from(d)),
                            src_port: sport, dst_port: 4791 }
            } else {
                Endpoints { src: IpAddr::V4(Ipv4Addr::from(s)), dst: IpAddr::V4(Ipv4Addr::from(d as u32)),
                            src_port: sport, dst_port: 4791 }
            };
            let (pkt, off) = emit(&ep, id, &payload, UdpChecksum::Compute);
            let body = &pkt[..pkt.len() - ICRC_LEN];
            prop_assert_eq!(icrc_for(&ep, id, &body[off..]), rocev2::icrc(body).unwrap());
            let mut v = IcrcVerifier::new();
            let want = IcrcCheck::Valid { ipv4_id: (!v6).then_some(id) };
            prop_assert_eq!(v.verify(&ep, &pkt[off..]), want);
        }

        #[test]
        fn prop_single_bit_flip_rejected(len in 12usize..4200, id in any::<u16>(), v6 in any::<bool>(),
                                         seed in any::<u64>(), flips in proptest::collection::vec(any::<u32>(), 32)) {
            let ep = if v6 { v6_ep() } else { v4_ep() };
            let mut rng = Rng(seed | 1);
            let p = rng.bytes(len);
            let mut d = p.clone();
            d.extend_from_slice(&icrc_for(&ep, id, &p).to_le_bytes());
            let mut v = IcrcVerifier::new();
            for f in flips {
                let bit = f as usize % (d.len() * 8);
                if bit / 8 == 4 {
                    continue; // BTH octet 4: masked
                }
                d[bit / 8] ^= 1 << (bit % 8);
                prop_assert_eq!(v.verify(&ep, &d), IcrcCheck::Invalid);
                d[bit / 8] ^= 1 << (bit % 8);
            }
        }
    }

    /// Time per verify of a 1024-octet payload. Run with
    /// `cargo test --release -p softrdma-wire icrc::tests::timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timing_verify_1024() {
        use std::hint::black_box;
        use std::time::Instant;
        let ep = v4_ep();
        let mut rng = Rng(7);
        let p = rng.bytes(1024);
        let mut v = IcrcVerifier::new();
        let iters = 2_000_000u32;
        let report = |what: &str, d: &[u8], v: &mut IcrcVerifier| {
            for _ in 0..10_000 {
                black_box(v.verify(&ep, black_box(d)));
            }
            let t = Instant::now();
            for _ in 0..iters {
                black_box(v.verify(&ep, black_box(d)));
            }
            let ns = t.elapsed().as_nanos() as f64 / iters as f64;
            eprintln!("{what}: {ns:.1} ns/verify");
        };
        let mk = |id: u16| {
            let mut d = p.clone();
            d.extend_from_slice(&icrc_for(&ep, id, &p).to_le_bytes());
            d
        };
        report("IPv4, ID 0", &mk(0), &mut v);
        report("IPv4, ID 0xA5C3", &mk(0xA5C3), &mut v);
        let mut nc = IcrcVerifier::with_cached_lengths(0);
        report("IPv4, ID 0xA5C3, no cache", &mk(0xA5C3), &mut nc);
        let e6 = v6_ep();
        let mut d = p.clone();
        d.extend_from_slice(&icrc_for(&e6, 0, &p).to_le_bytes());
        let t = Instant::now();
        for _ in 0..iters {
            black_box(v.verify(&e6, black_box(&d)));
        }
        eprintln!(
            "IPv6: {:.1} ns/verify",
            t.elapsed().as_nanos() as f64 / iters as f64
        );
        let t = Instant::now();
        for _ in 0..iters {
            black_box(Basis::for_payload_len(black_box(1024)));
        }
        eprintln!(
            "basis build: {:.1} ns",
            t.elapsed().as_nanos() as f64 / iters as f64
        );
    }
}
