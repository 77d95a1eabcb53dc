//! RoCEv2 encapsulation (IBA Vol. 1 Annex A17; ib-transport.md §13.6):
//! IPv4 or IPv6 | UDP (destination port 4791) | BTH .. payload | pad |
//! ICRC (EXT-ROCE-01). No LRH, no GRH, no VCRC.
//!
//! * [`Ipv4Header`] / [`Ipv4Repr`] (RFC 791, options and checksum),
//!   [`Ipv6Header`] / [`Ipv6Repr`] (RFC 8200, no extension headers),
//!   [`UdpHeader`] / [`UdpRepr`] (RFC 768).
//! * [`icrc`]: the invariant CRC exactly as Linux rxe computes it
//!   (`drivers/infiniband/sw/rxe/rxe_icrc.c`; EXT-ROCE-02).
//! * [`RoceV2Packet`]: lenient parse from the first IP octet (ICRC field
//!   and computed value side by side) and re-emit; [`RoceV2Repr`]: strict
//!   parse (ICRC must match) into an [`ib::PacketRepr`] and emit from one.
//! * GID helpers for IPv4-mapped GIDs (`::ffff:a.b.c.d`).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Layer, Result, need};
use crate::field::{be16, be32, set_be16, set_be32};
use crate::ib::{self, BTH_LEN};

/// UDP destination port of RoCEv2 (IANA "roce"; EXT-ROCE-01).
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv4 header with 40 octets of options (IHL 15).
pub const IPV4_MAX_HEADER_LEN: usize = 60;
/// Fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// ICRC trailer.
pub const ICRC_LEN: usize = 4;
/// IP protocol / IPv6 next header of UDP.
pub const IP_PROTO_UDP: u8 = 17;
/// First UDP source port Linux uses for RoCEv2 flow entropy (EXT-ROCE-03).
pub const ROCEV2_SPORT_MIN: u16 = 0xC000;

// ------------------------------------------------------------ checksum

/// RFC 1071 one's-complement sum over a sequence of slices of any parity.
#[derive(Default)]
struct Checksum {
    sum: u64,
    odd: Option<u8>,
}

impl Checksum {
    fn add(&mut self, mut data: &[u8]) {
        if let (Some(hi), Some((&lo, rest))) = (self.odd, data.split_first()) {
            self.sum += u16::from_be_bytes([hi, lo]) as u64;
            self.odd = None;
            data = rest;
        }
        let mut chunks = data.chunks_exact(2);
        for c in &mut chunks {
            self.sum += u16::from_be_bytes([c[0], c[1]]) as u64;
        }
        if let [b] = chunks.remainder() {
            self.odd = Some(*b);
        }
    }

    /// The complemented, folded 16-bit checksum.
    fn finish(self) -> u16 {
        let mut s = self.sum + self.odd.map_or(0, |b| (b as u64) << 8);
        while s >> 16 != 0 {
            s = (s & 0xFFFF) + (s >> 16);
        }
        !(s as u16)
    }
}

fn checksum(data: &[u8]) -> u16 {
    let mut c = Checksum::default();
    c.add(data);
    c.finish()
}

/// The IPv4 header checksum `header` should carry (its own field skipped).
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut c = Checksum::default();
    c.add(&header[..10]);
    c.add(&header[12..]);
    c.finish()
}

// ------------------------------------------------------------ IPv4

/// IPv4 header view (RFC 791 §3.1). `new_checked` guarantees IHL >= 5 and
/// that the whole header (options included) is in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Header<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Header { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Truncated` below 20 octets or below IHL * 4; `Malformed` for IHL < 5.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(Layer::Ip, b, IPV4_HEADER_LEN)?;
        if (b[0] & 0xF) < 5 {
            return Err(Error::Malformed {
                layer: Layer::Ip,
                reason: "IPv4 IHL below 5",
            });
        }
        need(Layer::Ip, b, self.header_len())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }
    /// Header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        self.b()[0] & 0xF
    }
    /// Header length in octets.
    pub fn header_len(&self) -> usize {
        (self.ihl() as usize) * 4
    }
    /// The whole TOS octet (DSCP | ECN); variant for the ICRC.
    pub fn tos(&self) -> u8 {
        self.b()[1]
    }
    pub fn dscp(&self) -> u8 {
        self.b()[1] >> 2
    }
    pub fn ecn(&self) -> u8 {
        self.b()[1] & 0x3
    }
    pub fn total_len(&self) -> u16 {
        be16(self.b(), 2)
    }
    pub fn ident(&self) -> u16 {
        be16(self.b(), 4)
    }
    /// The 3 flag bits: reserved, DF, MF.
    pub fn flags(&self) -> u8 {
        self.b()[6] >> 5
    }
    pub fn dont_frag(&self) -> bool {
        self.flags() & 0x2 != 0
    }
    pub fn more_frags(&self) -> bool {
        self.flags() & 0x1 != 0
    }
    /// Fragment offset, in 8-octet units.
    pub fn frag_offset(&self) -> u16 {
        be16(self.b(), 6) & 0x1FFF
    }
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }
    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }
    pub fn checksum(&self) -> u16 {
        be16(self.b(), 10)
    }
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be32(self.b(), 12))
    }
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be32(self.b(), 16))
    }
    pub fn options(&self) -> &[u8] {
        &self.b()[IPV4_HEADER_LEN..self.header_len()]
    }
    /// True when the header checksum (options included) is right.
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.b()[..self.header_len()]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Header<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Keeps the low 4 bits.
    pub fn set_version(&mut self, v: u8) {
        let b = &mut self.m()[0];
        *b = (*b & 0x0F) | (v << 4);
    }
    /// Keeps the low 4 bits.
    pub fn set_ihl(&mut self, v: u8) {
        let b = &mut self.m()[0];
        *b = (*b & 0xF0) | (v & 0xF);
    }
    pub fn set_tos(&mut self, v: u8) {
        self.m()[1] = v;
    }
    /// Keeps the low 6 bits.
    pub fn set_dscp(&mut self, v: u8) {
        let b = &mut self.m()[1];
        *b = (*b & 0x3) | (v << 2);
    }
    /// Keeps the low 2 bits.
    pub fn set_ecn(&mut self, v: u8) {
        let b = &mut self.m()[1];
        *b = (*b & !0x3) | (v & 0x3);
    }
    pub fn set_total_len(&mut self, v: u16) {
        set_be16(self.m(), 2, v);
    }
    pub fn set_ident(&mut self, v: u16) {
        set_be16(self.m(), 4, v);
    }
    /// Keeps the low 3 bits.
    pub fn set_flags(&mut self, v: u8) {
        let b = &mut self.m()[6];
        *b = (*b & 0x1F) | (v << 5);
    }
    /// Keeps the low 13 bits.
    pub fn set_frag_offset(&mut self, v: u16) {
        let old = be16(self.b(), 6);
        set_be16(self.m(), 6, (old & 0xE000) | (v & 0x1FFF));
    }
    pub fn set_ttl(&mut self, v: u8) {
        self.m()[8] = v;
    }
    pub fn set_protocol(&mut self, v: u8) {
        self.m()[9] = v;
    }
    pub fn set_checksum(&mut self, v: u16) {
        set_be16(self.m(), 10, v);
    }
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        set_be32(self.m(), 12, a.to_bits());
    }
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        set_be32(self.m(), 16, a.to_bits());
    }
    /// Options area (IHL must be set first).
    pub fn options_mut(&mut self) -> &mut [u8] {
        let n = self.header_len();
        &mut self.m()[IPV4_HEADER_LEN..n]
    }
    /// Computes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        let n = self.header_len();
        let c = ipv4_checksum(&self.b()[..n]);
        self.set_checksum(c);
    }
}

/// Every IPv4 header field but the version (always 4), IHL (from
/// `options`) and checksum (verified by `parse`, computed by `emit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Ipv4Repr<'a> {
    pub dscp: u8,
    pub ecn: u8,
    pub total_len: u16,
    pub ident: u16,
    /// Reserved, DF, MF.
    pub flags: u8,
    pub frag_offset: u16,
    pub ttl: u8,
    pub protocol: u8,
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    /// 0..=40 octets, a multiple of 4.
    pub options: &'a [u8],
}

impl<'a> Ipv4Repr<'a> {
    /// A DF-flagged UDP header like the ones rxe sends (TTL 64).
    pub const fn new_udp(src_addr: Ipv4Addr, dst_addr: Ipv4Addr) -> Self {
        Ipv4Repr {
            dscp: 0,
            ecn: 0,
            total_len: 0,
            ident: 0,
            flags: 0x2,
            frag_offset: 0,
            ttl: 64,
            protocol: IP_PROTO_UDP,
            src_addr,
            dst_addr,
            options: &[],
        }
    }

    /// Parses the header; `Malformed` for version != 4, a checksum other
    /// than the one `emit` would write, or a total length shorter than the
    /// header.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let h = Ipv4Header::new_checked(buf)?;
        if h.version() != 4 {
            return Err(Error::Malformed {
                layer: Layer::Ip,
                reason: "IPv4 version is not 4",
            });
        }
        // The canonical value (RFC 1071 `!sum`), not merely a verifying one:
        // 0x0000 and 0xFFFF both verify in one case; emit writes the former.
        if h.checksum() != ipv4_checksum(&buf[..h.header_len()]) {
            return Err(Error::Malformed {
                layer: Layer::Ip,
                reason: "IPv4 header checksum",
            });
        }
        if (h.total_len() as usize) < h.header_len() {
            return Err(Error::Malformed {
                layer: Layer::Ip,
                reason: "IPv4 total length below header length",
            });
        }
        let n = h.header_len();
        Ok(Ipv4Repr {
            dscp: h.dscp(),
            ecn: h.ecn(),
            total_len: h.total_len(),
            ident: h.ident(),
            flags: h.flags(),
            frag_offset: h.frag_offset(),
            ttl: h.ttl(),
            protocol: h.protocol(),
            src_addr: h.src_addr(),
            dst_addr: h.dst_addr(),
            options: &buf[IPV4_HEADER_LEN..n],
        })
    }

    pub fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN + self.options.len()
    }

    /// Writes the header with a computed checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let n = self.buffer_len();
        need(Layer::Ip, buf, n)?;
        if !self.options.len().is_multiple_of(4) || n > IPV4_MAX_HEADER_LEN {
            return Err(Error::Malformed {
                layer: Layer::Ip,
                reason: "IPv4 options not a multiple of 4 or over 40 octets",
            });
        }
        ib::fits(Layer::Ip, "DSCP", self.dscp as u64, 6)?;
        ib::fits(Layer::Ip, "ECN", self.ecn as u64, 2)?;
        ib::fits(Layer::Ip, "IPv4 flags", self.flags as u64, 3)?;
        ib::fits(Layer::Ip, "fragment offset", self.frag_offset as u64, 13)?;
        let mut h = Ipv4Header::new_unchecked(&mut buf[..n]);
        h.set_version(4);
        h.set_ihl((n / 4) as u8);
        h.set_dscp(self.dscp);
        h.set_ecn(self.ecn);
        h.set_total_len(self.total_len);
        h.set_ident(self.ident);
        h.set_flags(self.flags);
        h.set_frag_offset(self.frag_offset);
        h.set_ttl(self.ttl);
        h.set_protocol(self.protocol);
        h.set_src_addr(self.src_addr);
        h.set_dst_addr(self.dst_addr);
        h.options_mut().copy_from_slice(self.options);
        h.fill_checksum();
        Ok(n)
    }
}

// ------------------------------------------------------------ IPv6

/// IPv6 fixed header view (RFC 8200 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Header<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Header { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    pub fn check_len(&self) -> Result<()> {
        need(Layer::Ip, self.buffer.as_ref(), IPV6_HEADER_LEN)
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }
    /// Traffic class (DSCP | ECN); variant for the ICRC.
    pub fn traffic_class(&self) -> u8 {
        ((be16(self.b(), 0) >> 4) & 0xFF) as u8
    }
    /// 20-bit flow label; variant for the ICRC.
    pub fn flow_label(&self) -> u32 {
        be32(self.b(), 0) & 0xF_FFFF
    }
    pub fn payload_len(&self) -> u16 {
        be16(self.b(), 4)
    }
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }
    /// Hop limit; variant for the ICRC.
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[8..24]);
        Ipv6Addr::from(a)
    }
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[24..40]);
        Ipv6Addr::from(a)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Header<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Keeps the low 4 bits.
    pub fn set_version(&mut self, v: u8) {
        let b = &mut self.m()[0];
        *b = (*b & 0x0F) | (v << 4);
    }
    pub fn set_traffic_class(&mut self, v: u8) {
        let w = be16(self.b(), 0);
        set_be16(self.m(), 0, (w & 0xF00F) | ((v as u16) << 4));
    }
    /// Keeps the low 20 bits.
    pub fn set_flow_label(&mut self, v: u32) {
        let w = be32(self.b(), 0);
        set_be32(self.m(), 0, (w & 0xFFF0_0000) | (v & 0xF_FFFF));
    }
    pub fn set_payload_len(&mut self, v: u16) {
        set_be16(self.m(), 4, v);
    }
    pub fn set_next_header(&mut self, v: u8) {
        self.m()[6] = v;
    }
    pub fn set_hop_limit(&mut self, v: u8) {
        self.m()[7] = v;
    }
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.m()[8..24].copy_from_slice(&a.octets());
    }
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.m()[24..40].copy_from_slice(&a.octets());
    }
}

/// Every IPv6 fixed-header field but the version (always 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Ipv6Repr {
    pub traffic_class: u8,
    pub flow_label: u32,
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub src_addr: Ipv6Addr,
    pub dst_addr: Ipv6Addr,
}

impl Ipv6Repr {
    /// A UDP header with hop limit 64 and flow label 0.
    pub const fn new_udp(src_addr: Ipv6Addr, dst_addr: Ipv6Addr) -> Self {
        Ipv6Repr {
            traffic_class: 0,
            flow_label: 0,
            payload_len: 0,
            next_header: IP_PROTO_UDP,
            hop_limit: 64,
            src_addr,
            dst_addr,
        }
    }

    /// `Malformed` for version != 6.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Ipv6Header::new_checked(buf)?;
        if h.version() != 6 {
            return Err(Error::Malformed {
                layer: Layer::Ip,
                reason: "IPv6 version is not 6",
            });
        }
        Ok(Ipv6Repr {
            traffic_class: h.traffic_class(),
            flow_label: h.flow_label(),
            payload_len: h.payload_len(),
            next_header: h.next_header(),
            hop_limit: h.hop_limit(),
            src_addr: h.src_addr(),
            dst_addr: h.dst_addr(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Ip, buf, IPV6_HEADER_LEN)?;
        ib::fits(Layer::Ip, "flow label", self.flow_label as u64, 20)?;
        let mut h = Ipv6Header::new_unchecked(&mut buf[..IPV6_HEADER_LEN]);
        h.set_version(6);
        h.set_traffic_class(self.traffic_class);
        h.set_flow_label(self.flow_label);
        h.set_payload_len(self.payload_len);
        h.set_next_header(self.next_header);
        h.set_hop_limit(self.hop_limit);
        h.set_src_addr(self.src_addr);
        h.set_dst_addr(self.dst_addr);
        Ok(IPV6_HEADER_LEN)
    }
}

// ------------------------------------------------------------ IP

/// The IP header of a RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum IpRepr<'a> {
    Ipv4(Ipv4Repr<'a>),
    Ipv6(Ipv6Repr),
}

impl IpRepr<'_> {
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::Ipv4(r) => IpAddr::V4(r.src_addr),
            IpRepr::Ipv6(r) => IpAddr::V6(r.src_addr),
        }
    }
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::Ipv4(r) => IpAddr::V4(r.dst_addr),
            IpRepr::Ipv6(r) => IpAddr::V6(r.dst_addr),
        }
    }
    pub fn buffer_len(&self) -> usize {
        match self {
            IpRepr::Ipv4(r) => r.buffer_len(),
            IpRepr::Ipv6(r) => r.buffer_len(),
        }
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        match self {
            IpRepr::Ipv4(r) => r.emit(buf),
            IpRepr::Ipv6(r) => r.emit(buf),
        }
    }
}

// ------------------------------------------------------------ UDP

/// UDP header view (RFC 768).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpHeader<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpHeader { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }
    pub fn check_len(&self) -> Result<()> {
        need(Layer::Udp, self.buffer.as_ref(), UDP_HEADER_LEN)
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Header + data, in octets.
    pub fn length(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// 0 = not computed (what rxe sends).
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpHeader<T> {
    pub fn set_src_port(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 0, v);
    }
    pub fn set_dst_port(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 2, v);
    }
    pub fn set_length(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 4, v);
    }
    pub fn set_checksum(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 6, v);
    }
}

/// The four UDP fields, raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub length: u16,
    pub checksum: u16,
}

impl UdpRepr {
    /// A RoCEv2 UDP header from `src_port` (lengths and checksum are filled
    /// in by the RoCEv2 emitters).
    pub const fn rocev2(src_port: u16) -> Self {
        UdpRepr {
            src_port,
            dst_port: ROCEV2_UDP_PORT,
            length: 0,
            checksum: 0,
        }
    }
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = UdpHeader::new_checked(buf)?;
        Ok(UdpRepr {
            src_port: h.src_port(),
            dst_port: h.dst_port(),
            length: h.length(),
            checksum: h.checksum(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Udp, buf, UDP_HEADER_LEN)?;
        let mut h = UdpHeader::new_unchecked(buf);
        h.set_src_port(self.src_port);
        h.set_dst_port(self.dst_port);
        h.set_length(self.length);
        h.set_checksum(self.checksum);
        Ok(UDP_HEADER_LEN)
    }
}

/// Flow label of a connection from its QPNs, as Linux computes it
/// (`rdma_calc_flow_label` in `include/rdma/ib_verbs.h`); 20 bits.
pub const fn rocev2_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = (lqpn as u64) * (rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// UDP source port from a flow label, in `0xC000..=0xFFFF` (EXT-ROCE-03),
/// as Linux computes it (`rdma_flow_label_to_udp_sport`). Constant for a
/// QP, it keeps the QP on one ECMP path. For a connection set up without a
/// flow label Linux uses `rocev2_src_port(rocev2_flow_label(lqpn, rqpn))`.
pub const fn rocev2_src_port(flow_label: u32) -> u16 {
    let low = (flow_label & 0x3FFF) ^ ((flow_label & 0xF_C000) >> 14);
    (low as u16) | ROCEV2_SPORT_MIN
}

// ------------------------------------------------------------ ICRC

/// The ICRC of an encoded RoCEv2 packet, `pkt` running from the first IP
/// octet to the end of the pad (the ICRC itself excluded). Stored on the
/// wire least-significant octet first: `icrc(..)?.to_le_bytes()`.
///
/// As Linux rxe (`rxe_icrc.c`, EXT-ROCE-02): CRC-32 (zlib: reflected
/// 0x04C11DB7, init and final complement) over 8 octets of 0xFF (the masked
/// LRH) ‖ IP header with the variant fields all ones (IPv4: TOS, TTL,
/// header checksum; IPv6: traffic class, flow label, hop limit) ‖ UDP
/// header with checksum all ones ‖ BTH with octet 4 (F, B, Resv6) all
/// ones ‖ the rest. IPv4 options are covered as they are (rxe assumes
/// IHL 5).
pub fn icrc(pkt: &[u8]) -> Result<u32> {
    need(Layer::RoceV2, pkt, 1)?;
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xFF; 8]);
    let ip_len = match pkt[0] >> 4 {
        4 => {
            let ip = Ipv4Header::new_checked(pkt)?;
            let n = ip.header_len();
            let mut m = [0u8; IPV4_MAX_HEADER_LEN];
            m[..n].copy_from_slice(&pkt[..n]);
            m[1] = 0xFF;
            m[8] = 0xFF;
            m[10] = 0xFF;
            m[11] = 0xFF;
            h.update(&m[..n]);
            n
        }
        6 => {
            need(Layer::Ip, pkt, IPV6_HEADER_LEN)?;
            let mut m = [0u8; IPV6_HEADER_LEN];
            m.copy_from_slice(&pkt[..IPV6_HEADER_LEN]);
            m[0] |= 0x0F;
            m[1] = 0xFF;
            m[2] = 0xFF;
            m[3] = 0xFF;
            m[7] = 0xFF;
            h.update(&m);
            IPV6_HEADER_LEN
        }
        v => {
            return Err(Error::Unknown {
                layer: Layer::Ip,
                field: "IP version",
                value: v as u64,
            });
        }
    };
    need(Layer::RoceV2, pkt, ip_len + UDP_HEADER_LEN + BTH_LEN)?;
    let mut udp = [0u8; UDP_HEADER_LEN];
    udp.copy_from_slice(&pkt[ip_len..ip_len + UDP_HEADER_LEN]);
    udp[6] = 0xFF;
    udp[7] = 0xFF;
    h.update(&udp);
    let t = ip_len + UDP_HEADER_LEN;
    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(&pkt[t..t + BTH_LEN]);
    bth[4] = 0xFF;
    h.update(&bth);
    h.update(&pkt[t + BTH_LEN..]);
    Ok(h.finalize())
}

// ------------------------------------------------------------ packet

/// How the emitters fill the UDP checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum UdpChecksum {
    /// 0, "not computed", as Linux rxe sends.
    #[default]
    Zero,
    /// RFC 768 checksum over the pseudo-header, UDP header and data (ICRC
    /// included).
    Compute,
    /// This value as it is: what a capture on the sending host shows when the
    /// checksum is left to the NIC (a partial sum), re-emitted byte for byte.
    Given(u16),
}

/// A RoCEv2 packet parsed from its first IP octet, without judging the
/// ICRC: `icrc` is the field as received, `computed_icrc` what it should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RoceV2Packet<'a> {
    pub ip: IpRepr<'a>,
    pub udp: UdpRepr,
    /// BTH .. pad: the input of [`ib::PacketRepr::parse`].
    pub transport: &'a [u8],
    pub icrc: u32,
    pub computed_icrc: u32,
}

impl<'a> RoceV2Packet<'a> {
    /// Parses IPv4 or IPv6 | UDP | transport | ICRC. Octets after the IP
    /// datagram (Ethernet padding) are ignored.
    ///
    /// Errors: `Unknown` for an IP version other than 4/6, a protocol or
    /// next header other than UDP, or a destination port other than 4791;
    /// `Malformed` for a bad IPv4 checksum, a fragment, or a UDP length that
    /// disagrees with the IP length; `Truncated` when the datagram is cut or
    /// too short for BTH + ICRC.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        Self::parse_on_port(buf, ROCEV2_UDP_PORT)
    }

    /// [`parse`](Self::parse) of a flow on UDP destination port `port` instead of 4791
    /// (two contexts sharing a host in tests; a capture's "decode as").
    pub fn parse_on_port(buf: &'a [u8], port: u16) -> Result<Self> {
        need(Layer::Ip, buf, 1)?;
        let (ip, ip_hdr_len, ip_end) = match buf[0] >> 4 {
            4 => {
                let r = Ipv4Repr::parse(buf)?;
                if r.protocol != IP_PROTO_UDP {
                    return Err(Error::Unknown {
                        layer: Layer::Ip,
                        field: "IPv4 protocol",
                        value: r.protocol as u64,
                    });
                }
                if r.flags & 0x1 != 0 || r.frag_offset != 0 {
                    return Err(Error::Malformed {
                        layer: Layer::Ip,
                        reason: "IPv4 fragment",
                    });
                }
                (IpRepr::Ipv4(r), r.buffer_len(), r.total_len as usize)
            }
            6 => {
                let r = Ipv6Repr::parse(buf)?;
                if r.next_header != IP_PROTO_UDP {
                    return Err(Error::Unknown {
                        layer: Layer::Ip,
                        field: "IPv6 next header",
                        value: r.next_header as u64,
                    });
                }
                (
                    IpRepr::Ipv6(r),
                    IPV6_HEADER_LEN,
                    IPV6_HEADER_LEN + r.payload_len as usize,
                )
            }
            v => {
                return Err(Error::Unknown {
                    layer: Layer::Ip,
                    field: "IP version",
                    value: v as u64,
                });
            }
        };
        need(Layer::Ip, buf, ip_end)?;
        let datagram = &buf[ip_hdr_len..ip_end];
        let udp = UdpRepr::parse(datagram)?;
        if udp.length as usize != datagram.len() {
            return Err(Error::Malformed {
                layer: Layer::Udp,
                reason: "UDP length disagrees with the IP length",
            });
        }
        if udp.dst_port != port {
            return Err(Error::Unknown {
                layer: Layer::Udp,
                field: "UDP destination port",
                value: udp.dst_port as u64,
            });
        }
        let rest = &datagram[UDP_HEADER_LEN..];
        need(Layer::RoceV2, rest, BTH_LEN + ICRC_LEN)?;
        let (transport, trailer) = rest.split_at(rest.len() - ICRC_LEN);
        let icrc_field = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let computed_icrc = icrc(&buf[..ip_end - ICRC_LEN])?;
        Ok(RoceV2Packet {
            ip,
            udp,
            transport,
            icrc: icrc_field,
            computed_icrc,
        })
    }

    /// True when the received ICRC is right (IBT-X-20: drop otherwise).
    pub fn icrc_ok(&self) -> bool {
        self.icrc == self.computed_icrc
    }

    /// True when the UDP checksum is 0 (absent) or right.
    pub fn udp_checksum_ok(&self) -> bool {
        self.udp.checksum == 0 || udp_checksum(&self.ip, &self.udp, self.transport, self.icrc) == 0
    }

    /// The transport packet.
    pub fn ib_packet(&self) -> Result<ib::PacketRepr<'a>> {
        ib::PacketRepr::parse(self.transport)
    }

    /// Length of the datagram `emit` writes.
    pub fn buffer_len(&self) -> usize {
        self.ip.buffer_len() + UDP_HEADER_LEN + self.transport.len() + ICRC_LEN
    }

    /// Re-encodes: IP and UDP lengths, IPv4 checksum, ICRC and (per
    /// `csum`) the UDP checksum are recomputed; everything else is kept.
    pub fn emit(&self, buf: &mut [u8], csum: UdpChecksum) -> Result<usize> {
        let t = self.transport;
        emit_frame(&self.ip, &self.udp, t.len(), buf, csum, |b| {
            b.copy_from_slice(t);
            Ok(t.len())
        })
    }
}

/// RFC 768 checksum over pseudo-header, UDP header (checksum as given),
/// transport and ICRC; 0 when the stored checksum is right.
fn udp_checksum(ip: &IpRepr<'_>, udp: &UdpRepr, transport: &[u8], icrc: u32) -> u16 {
    let mut c = Checksum::default();
    let udp_len = UDP_HEADER_LEN + transport.len() + ICRC_LEN;
    match ip {
        IpRepr::Ipv4(r) => {
            c.add(&r.src_addr.octets());
            c.add(&r.dst_addr.octets());
            c.add(&[0, IP_PROTO_UDP]);
            c.add(&(udp_len as u16).to_be_bytes());
        }
        IpRepr::Ipv6(r) => {
            c.add(&r.src_addr.octets());
            c.add(&r.dst_addr.octets());
            c.add(&(udp_len as u32).to_be_bytes());
            c.add(&[0, 0, 0, IP_PROTO_UDP]);
        }
    }
    let mut h = [0u8; UDP_HEADER_LEN];
    let _ = udp.emit(&mut h);
    c.add(&h);
    c.add(transport);
    c.add(&icrc.to_le_bytes());
    c.finish()
}

/// Writes IP | UDP | transport (via `write`) | ICRC with lengths,
/// IPv4 checksum, ICRC and UDP checksum filled in.
fn emit_frame(
    ip: &IpRepr<'_>,
    udp: &UdpRepr,
    transport_len: usize,
    buf: &mut [u8],
    csum: UdpChecksum,
    write: impl FnOnce(&mut [u8]) -> Result<usize>,
) -> Result<usize> {
    let ip_len = ip.buffer_len();
    let udp_len = UDP_HEADER_LEN + transport_len + ICRC_LEN;
    let total = ip_len + udp_len;
    need(Layer::RoceV2, buf, total)?;
    if transport_len < BTH_LEN {
        return Err(Error::Malformed {
            layer: Layer::RoceV2,
            reason: "transport shorter than a BTH",
        });
    }
    let over = |what, value: usize, limit: usize| Error::TooLarge {
        layer: Layer::Ip,
        what,
        value: value as u64,
        limit: limit as u64,
    };
    let mut ip = *ip;
    match &mut ip {
        IpRepr::Ipv4(r) => {
            if total > 0xFFFF {
                return Err(over("IPv4 total length", total, 0xFFFF));
            }
            r.total_len = total as u16;
        }
        IpRepr::Ipv6(r) => {
            if udp_len > 0xFFFF {
                return Err(over("IPv6 payload length", udp_len, 0xFFFF));
            }
            r.payload_len = udp_len as u16;
        }
    }
    let mut udp = *udp;
    udp.length = udp_len as u16;
    udp.checksum = 0;
    ip.emit(buf)?;
    udp.emit(&mut buf[ip_len..])?;
    let t = ip_len + UDP_HEADER_LEN;
    let n = write(&mut buf[t..t + transport_len])?;
    if n != transport_len {
        return Err(Error::Malformed {
            layer: Layer::RoceV2,
            reason: "transport length changed while emitting",
        });
    }
    let crc = icrc(&buf[..total - ICRC_LEN])?;
    buf[total - ICRC_LEN..total].copy_from_slice(&crc.to_le_bytes());
    let checksum = match csum {
        UdpChecksum::Zero => None,
        UdpChecksum::Compute => {
            let c = udp_checksum(&ip, &udp, &buf[t..t + transport_len], crc);
            // RFC 768: a computed 0 is sent as all ones.
            Some(if c == 0 { 0xFFFF } else { c })
        }
        UdpChecksum::Given(c) => Some(c),
    };
    if let Some(c) = checksum {
        udp.checksum = c;
        udp.emit(&mut buf[ip_len..])?;
    }
    Ok(total)
}

/// A RoCEv2 packet as reprs: IP, UDP (ports; lengths and checksum are
/// computed on emit) and the transport packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RoceV2Repr<'a> {
    pub ip: IpRepr<'a>,
    pub udp: UdpRepr,
    pub packet: ib::PacketRepr<'a>,
}

impl<'a> RoceV2Repr<'a> {
    /// Strict parse: as [`RoceV2Packet::parse`], then `Malformed` if the
    /// ICRC is wrong (IBT-X-20), then the transport packet.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let p = RoceV2Packet::parse(buf)?;
        if !p.icrc_ok() {
            return Err(Error::Malformed {
                layer: Layer::RoceV2,
                reason: "ICRC mismatch",
            });
        }
        Ok(RoceV2Repr {
            ip: p.ip,
            udp: p.udp,
            packet: p.ib_packet()?,
        })
    }

    pub fn buffer_len(&self) -> usize {
        self.ip.buffer_len() + UDP_HEADER_LEN + self.packet.buffer_len() + ICRC_LEN
    }

    /// Writes IP | UDP | BTH .. pad | ICRC, lengths, IPv4 checksum, ICRC
    /// and UDP checksum (per `csum`) filled in.
    pub fn emit(&self, buf: &mut [u8], csum: UdpChecksum) -> Result<usize> {
        self.packet.check()?;
        let p = &self.packet;
        emit_frame(&self.ip, &self.udp, p.buffer_len(), buf, csum, |b| {
            p.emit(b)
        })
    }
}

// ------------------------------------------------------------ GIDs

/// The IPv4-mapped GID `::ffff:a.b.c.d` of an IPv4 address (Annex A17;
/// ib-transport.md §13.6).
pub const fn gid_from_ipv4(a: Ipv4Addr) -> [u8; 16] {
    let o = a.octets();
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, o[0], o[1], o[2], o[3],
    ]
}

/// The IPv4 address of an IPv4-mapped GID, `None` for any other GID.
pub fn gid_to_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    Ipv6Addr::from(*gid).to_ipv4_mapped()
}

/// GID of an address: IPv4-mapped for IPv4, the address itself for IPv6.
pub const fn gid_from_ip(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => gid_from_ipv4(v4),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Address of a GID: IPv4 for an IPv4-mapped GID, else IPv6.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    match gid_to_ipv4(gid) {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(Ipv6Addr::from(*gid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::testdata::{self, ALL};
    use crate::ib::{BthRepr, Opcode, PacketRepr, Syndrome};
    use proptest::prelude::*;

    /// EXT-ROCE-01, EXT-ROCE-02: every capture vector parses, its ICRC
    /// verifies, and it re-emits byte-identically (UDP checksum 0 as rxe).
    #[test]
    fn ext_roce_02_real_packets_icrc_and_reemit() {
        for (name, pkt) in ALL {
            let p = RoceV2Packet::parse(pkt).unwrap();
            assert!(p.icrc_ok(), "{name}");
            assert_eq!(p.icrc.to_le_bytes(), pkt[pkt.len() - 4..], "{name}");
            assert_eq!(icrc(&pkt[..pkt.len() - 4]), Ok(p.computed_icrc));
            assert!(p.udp_checksum_ok());
            assert_eq!(p.buffer_len(), pkt.len());
            for n in 0..pkt.len() {
                assert!(RoceV2Packet::parse(&pkt[..n]).is_err(), "{name} cut at {n}");
            }
            let mut out = vec![0u8; pkt.len()];
            assert_eq!(p.emit(&mut out, UdpChecksum::Zero), Ok(pkt.len()));
            assert_eq!(&out[..], &pkt[..], "{name}");
            let r = RoceV2Repr::parse(pkt).unwrap();
            assert_eq!(r.buffer_len(), pkt.len());
            out.fill(0);
            assert_eq!(r.emit(&mut out, UdpChecksum::Zero), Ok(pkt.len()));
            assert_eq!(&out[..], &pkt[..], "{name}");
            // With a computed UDP checksum the packet still verifies.
            r.emit(&mut out, UdpChecksum::Compute).unwrap();
            let q = RoceV2Packet::parse(&out).unwrap();
            assert!(q.icrc_ok() && q.udp_checksum_ok() && q.udp.checksum != 0);
            assert_eq!(q.icrc, p.icrc, "UDP checksum is masked out of the ICRC");
        }
    }

    /// Known answers: ICRC values as rxe put them on the wire.
    #[test]
    fn ext_roce_02_known_answers() {
        let ack = &testdata::RC_ACK;
        assert_eq!(&ack[44..], &icrc(&ack[..44]).unwrap().to_le_bytes());
        let mad = RoceV2Packet::parse(&testdata::UD_CM_MAD).unwrap();
        assert_eq!(mad.icrc, 0x386a_918c); // tshark: "Invariant CRC: 0x8c916a38"
        assert!(mad.icrc_ok());
    }

    /// Deconstruct the IPv4 / UDP headers of a real packet with getters.
    #[test]
    fn real_ipv4_udp_getters() {
        let pkt = &testdata::RC_SEND_ONLY;
        let ip = Ipv4Header::new_checked(&pkt[..]).unwrap();
        assert_eq!((ip.version(), ip.ihl(), ip.header_len()), (4, 5, 20));
        assert_eq!((ip.dscp(), ip.ecn(), ip.tos()), (0, 0, 0));
        assert_eq!(ip.total_len() as usize, pkt.len());
        assert!(ip.dont_frag() && !ip.more_frags());
        assert_eq!(
            (ip.frag_offset(), ip.ttl(), ip.protocol()),
            (0, 64, IP_PROTO_UDP)
        );
        assert!(ip.verify_checksum());
        assert_eq!(ip.src_addr(), Ipv4Addr::new(10, 77, 0, 3));
        assert_eq!(ip.dst_addr(), Ipv4Addr::new(10, 77, 0, 2));
        assert!(ip.options().is_empty());
        let udp = UdpHeader::new_checked(&pkt[20..]).unwrap();
        assert_eq!(udp.dst_port(), ROCEV2_UDP_PORT);
        assert!(udp.src_port() >= ROCEV2_SPORT_MIN);
        assert_eq!(udp.length() as usize, pkt.len() - 20);
        assert_eq!(udp.checksum(), 0);
        let r = Ipv4Repr::parse(&pkt[..]).unwrap();
        let mut out = [0u8; 20];
        r.emit(&mut out).unwrap();
        assert_eq!(out, pkt[..20]);
    }

    /// EXT-ROCE-03: packets of one QP share a UDP source port from
    /// 0xC000..=0xFFFF.
    #[test]
    fn ext_roce_03_src_port_per_qp() {
        let sport = |p: &[u8]| RoceV2Packet::parse(p).unwrap().udp.src_port;
        let s = sport(&testdata::RC_SEND_FIRST);
        assert_eq!(sport(&testdata::RC_SEND_MIDDLE), s);
        assert_eq!(sport(&testdata::RC_SEND_LAST), s);
        let w = sport(&testdata::RC_WRITE_FIRST);
        assert_eq!(sport(&testdata::RC_WRITE_MIDDLE), w);
        assert_eq!(sport(&testdata::RC_WRITE_LAST), w);
        for (_, p) in ALL {
            assert!(sport(p) >= ROCEV2_SPORT_MIN);
        }
        // Linux derives it from the QPNs when the QP was connected without
        // rdma_cm: both rc_pingpong QPs are 0x11, both ib_send_bw QPs 0x17.
        assert_eq!(s, rocev2_src_port(rocev2_flow_label(0x17, 0x17)));
        assert_eq!(s, 0xC211);
        let ack = sport(&testdata::RC_ACK);
        assert_eq!(ack, rocev2_src_port(rocev2_flow_label(0x11, 0x11)));
        assert_eq!(sport(&testdata::RC_SEND_ONLY), ack);
        assert_eq!(rocev2_src_port(0xF_FFFF), 0xFFC0);
        assert_eq!(rocev2_src_port(0x3FFF), 0xFFFF);
        assert!(rocev2_flow_label(u32::MAX, u32::MAX) <= 0xF_FFFF);
    }

    /// EXT-ROCE-02, IBT-C9-6, IBT-C9-7: which octets the ICRC covers.
    #[test]
    fn ext_roce_02_ipv4_masking() {
        let pkt = &testdata::RC_SEND_ONLY;
        let body = &pkt[..pkt.len() - 4];
        let base = icrc(body).unwrap();
        // Variant: TOS, TTL, IP checksum, UDP checksum, BTH octet 4.
        for i in [1usize, 8, 10, 11, 26, 27, 32] {
            let mut m = body.to_vec();
            m[i] ^= 0xA5;
            assert_eq!(icrc(&m).unwrap(), base, "octet {i} must be masked");
        }
        // Invariant: everything else, including Resv7 (C9-7) and TVer.
        for i in [
            2usize,
            4,
            6,
            9,
            12,
            19,
            20,
            22,
            24,
            28,
            29,
            30,
            33,
            36,
            39,
            40,
            body.len() - 1,
        ] {
            let mut m = body.to_vec();
            m[i] ^= 0x01;
            assert_ne!(icrc(&m).unwrap(), base, "octet {i} must be covered");
        }
        // A receiver accepts F/B/Resv6 set (C9-6): ICRC still verifies.
        let mut m = pkt.to_vec();
        m[32] = 0xFF;
        let p = RoceV2Packet::parse(&m).unwrap();
        assert!(p.icrc_ok());
        let b = p.ib_packet().unwrap().bth;
        assert!(b.fecn && b.becn && b.resv6 == 0x3F);
        // Resv7 set without fixing the ICRC fails the check.
        let mut m = pkt.to_vec();
        m[36] |= 0x01;
        assert!(!RoceV2Packet::parse(&m).unwrap().icrc_ok());
        assert!(matches!(
            RoceV2Repr::parse(&m),
            Err(Error::Malformed {
                layer: Layer::RoceV2,
                ..
            })
        ));
    }

    fn v6_packet<'a>(payload: &'a [u8]) -> RoceV2Repr<'a> {
        let src = "fe80::5054:ff:fe77:3".parse().unwrap();
        let dst = "fe80::5054:ff:fe77:2".parse().unwrap();
        let mut ip = Ipv6Repr::new_udp(src, dst);
        ip.traffic_class = 0x6A;
        ip.flow_label = 0x12345;
        let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, 0x123456);
        bth.ack_req = true;
        RoceV2Repr {
            ip: IpRepr::Ipv6(ip),
            udp: UdpRepr::rocev2(0xC123),
            packet: PacketRepr::new(bth, payload),
        }
    }

    /// EXT-ROCE-01/02 over IPv6. The expected ICRC was computed apart, in
    /// Python with zlib.crc32 over the masked octets (traffic class, flow
    /// label, hop limit, UDP checksum and BTH octet 4 set to all ones).
    #[test]
    fn ext_roce_02_ipv6() {
        let r = v6_packet(b"hello roce v6");
        let mut buf = [0u8; 128];
        let n = r.emit(&mut buf, UdpChecksum::Zero).unwrap();
        assert_eq!(n, 40 + 8 + 12 + 13 + 3 + 4);
        let p = RoceV2Packet::parse(&buf[..n]).unwrap();
        assert!(p.icrc_ok());
        assert_eq!(p.icrc, IPV6_KNOWN_ICRC);
        assert_eq!(RoceV2Repr::parse(&buf[..n]).unwrap(), {
            let mut want = r;
            if let IpRepr::Ipv6(ip) = &mut want.ip {
                ip.payload_len = (n - 40) as u16;
            }
            want.udp.length = (n - 40) as u16;
            want
        });
        let base = p.icrc;
        let body = &buf[..n - 4];
        // Variant: version-nibble's neighbour (traffic class high), TC low
        // + flow label, hop limit, UDP checksum, BTH octet 4.
        for (i, x) in [
            (0usize, 0x0F),
            (1, 0xFF),
            (2, 0xFF),
            (3, 0xFF),
            (7, 0xFF),
            (46, 1),
            (52, 0xC0),
        ] {
            let mut m = body.to_vec();
            m[i] ^= x;
            assert_eq!(icrc(&m).unwrap(), base, "octet {i}");
        }
        for i in [4usize, 6, 8, 39, 40, 42, 48, 53, 56, body.len() - 1] {
            let mut m = body.to_vec();
            m[i] ^= 0x10;
            assert_ne!(icrc(&m).unwrap(), base, "octet {i}");
        }
        let ip = Ipv6Header::new_checked(&buf[..n]).unwrap();
        assert_eq!(
            (ip.version(), ip.traffic_class(), ip.flow_label()),
            (6, 0x6A, 0x12345)
        );
        assert_eq!((ip.next_header(), ip.hop_limit()), (IP_PROTO_UDP, 64));
        assert_eq!(ip.payload_len() as usize, n - 40);
        // Computed UDP checksum over IPv6.
        r.emit(&mut buf, UdpChecksum::Compute).unwrap();
        let q = RoceV2Packet::parse(&buf[..n]).unwrap();
        assert!(q.udp_checksum_ok() && q.udp.checksum != 0 && q.icrc == base);
        buf[60] ^= 1;
        assert!(!RoceV2Packet::parse(&buf[..n]).unwrap().udp_checksum_ok());
    }

    /// `ext_roce_02_ipv6`'s packet ICRC, from Python zlib.crc32.
    const IPV6_KNOWN_ICRC: u32 = 0xd342_3aff;

    /// IPv4 with options: IHL 6, the options are covered by the checksum and
    /// the ICRC.
    #[test]
    fn ipv4_options() {
        let opts = [0x94, 0x04, 0x00, 0x00]; // Router Alert
        let mut ip = Ipv4Repr::new_udp(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        ip.options = &opts;
        ip.ecn = 1;
        ip.dscp = 26;
        let r = RoceV2Repr {
            ip: IpRepr::Ipv4(ip),
            udp: UdpRepr::rocev2(0xD000),
            packet: {
                let mut p = PacketRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, 5, 6), &[]);
                p.aeth = Some(ib::AethRepr {
                    reserved: false,
                    syndrome: Syndrome::ACK,
                    msn: 1,
                });
                p
            },
        };
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, UdpChecksum::Compute).unwrap();
        assert_eq!(n, 24 + 8 + 16 + 4);
        let h = Ipv4Header::new_checked(&buf[..n]).unwrap();
        assert_eq!(
            (h.ihl(), h.options(), h.dscp(), h.ecn()),
            (6, &opts[..], 26, 1)
        );
        assert!(h.verify_checksum());
        let p = RoceV2Packet::parse(&buf[..n]).unwrap();
        assert!(p.icrc_ok() && p.udp_checksum_ok());
        let mut m = buf;
        m[22] ^= 1; // option octet: covered by the ICRC (and the IP checksum)
        assert_ne!(icrc(&m[..n - 4]).unwrap(), p.icrc);
        let back = RoceV2Repr::parse(&buf[..n]).unwrap();
        let mut out = [0u8; 64];
        back.emit(&mut out, UdpChecksum::Compute).unwrap();
        assert_eq!(out[..n], buf[..n]);
    }

    /// EXT-ROCE-04: a CNP (OpCode 0x81, BECN set, 16 reserved octets).
    #[test]
    fn ext_roce_04_cnp() {
        let mut bth = BthRepr::new(Opcode::CNP, 0x1234, 0);
        bth.becn = true;
        let r = RoceV2Repr {
            ip: IpRepr::Ipv4(Ipv4Repr::new_udp(
                Ipv4Addr::new(1, 2, 3, 4),
                Ipv4Addr::new(5, 6, 7, 8),
            )),
            udp: UdpRepr::rocev2(0xC000),
            packet: PacketRepr::new(bth, &[0; 16]),
        };
        let mut buf = [0u8; 80];
        let n = r.emit(&mut buf, UdpChecksum::Zero).unwrap();
        assert_eq!(n, 20 + 8 + 12 + 16 + 4);
        assert_eq!(buf[28], 0x81);
        assert_eq!(buf[32], 0x40);
        let p = RoceV2Repr::parse(&buf[..n]).unwrap();
        assert_eq!(p.packet.bth.opcode.to_string(), "CNP");
    }

    #[test]
    fn parse_errors() {
        let pkt = &testdata::RC_ACK;
        // Every truncation errors.
        for n in 0..pkt.len() {
            assert!(RoceV2Packet::parse(&pkt[..n]).is_err(), "cut at {n}");
            assert!(RoceV2Repr::parse(&pkt[..n]).is_err());
        }
        // Ethernet padding after the datagram is ignored.
        let mut padded = pkt.to_vec();
        padded.extend_from_slice(&[0; 14]);
        let p = RoceV2Packet::parse(&padded).unwrap();
        assert!(p.icrc_ok());
        assert_eq!(p.transport.len(), 16);
        let err = |m: &[u8]| RoceV2Packet::parse(m).unwrap_err();
        let mut m = pkt.to_vec();
        m[0] = 0x55;
        assert!(matches!(
            err(&m),
            Error::Unknown {
                field: "IP version",
                ..
            }
        ));
        let mut m = pkt.to_vec();
        m[0] = 0x44;
        assert!(matches!(
            err(&m),
            Error::Malformed {
                layer: Layer::Ip,
                ..
            }
        ));
        let mut m = pkt.to_vec();
        m[10] ^= 1;
        assert!(matches!(
            err(&m),
            Error::Malformed {
                reason: "IPv4 header checksum",
                ..
            }
        ));
        let fix = |m: &mut Vec<u8>| Ipv4Header::new_unchecked(&mut m[..]).fill_checksum();
        let mut m = pkt.to_vec();
        m[9] = 6;
        fix(&mut m);
        assert!(matches!(
            err(&m),
            Error::Unknown {
                field: "IPv4 protocol",
                ..
            }
        ));
        let mut m = pkt.to_vec();
        m[6] |= 0x20;
        fix(&mut m);
        assert!(matches!(
            err(&m),
            Error::Malformed {
                reason: "IPv4 fragment",
                ..
            }
        ));
        let mut m = pkt.to_vec();
        m[23] = 0x00;
        assert!(matches!(
            err(&m),
            Error::Unknown {
                layer: Layer::Udp,
                ..
            }
        ));
        let mut m = pkt.to_vec();
        m[25] -= 4;
        assert!(matches!(
            err(&m),
            Error::Malformed {
                layer: Layer::Udp,
                ..
            }
        ));
        // IP total length beyond the buffer.
        let mut m = pkt.to_vec();
        m[3] += 4;
        fix(&mut m);
        assert!(matches!(
            err(&m),
            Error::Truncated {
                layer: Layer::Ip,
                ..
            }
        ));
        // Too short for BTH + ICRC.
        let mut m = pkt[..20 + 8 + 12].to_vec();
        m[3] = 40;
        m[25] = 20;
        fix(&mut m);
        assert!(matches!(
            err(&m),
            Error::Truncated {
                layer: Layer::RoceV2,
                ..
            }
        ));
        // IPv6 with another next header.
        let r = v6_packet(b"x");
        let mut buf = [0u8; 96];
        let n = r.emit(&mut buf, UdpChecksum::Zero).unwrap();
        buf[6] = 6;
        assert!(matches!(
            err(&buf[..n]),
            Error::Unknown {
                field: "IPv6 next header",
                ..
            }
        ));
        // Strict parse surfaces transport errors.
        let mut m = pkt.to_vec();
        m[28] = 0xC0;
        let c = icrc(&m[..44]).unwrap();
        m[44..].copy_from_slice(&c.to_le_bytes());
        assert!(RoceV2Packet::parse(&m).unwrap().icrc_ok());
        assert!(matches!(
            RoceV2Repr::parse(&m),
            Err(Error::Unknown {
                layer: Layer::Bth,
                ..
            })
        ));
        assert!(icrc(&[]).is_err());
        assert!(icrc(&pkt[..39]).is_err());
    }

    #[test]
    fn header_views_truncate_and_setters() {
        let pkt = &testdata::RC_ACK;
        for n in 0..20 {
            assert!(Ipv4Header::new_checked(&pkt[..n]).is_err());
            assert!(Ipv4Repr::parse(&pkt[..n]).is_err());
        }
        for n in 0..40 {
            assert!(Ipv6Header::new_checked(&pkt[..n]).is_err());
            assert!(Ipv6Repr::parse(&pkt[..n]).is_err());
        }
        for n in 0..8 {
            assert!(UdpHeader::new_checked(&pkt[20..20 + n]).is_err());
            assert!(UdpRepr::parse(&pkt[20..20 + n]).is_err());
            let mut out = [0u8; 8];
            assert!(UdpRepr::default().emit(&mut out[..n]).is_err());
        }
        let mut m = pkt.to_vec();
        m[0] = 0x46; // IHL 6 but only 20 octets of header present
        assert!(matches!(
            Ipv4Header::new_checked(&m[..20]),
            Err(Error::Truncated { .. })
        ));
        m[0] = 0x44;
        assert!(matches!(
            Ipv4Header::new_checked(&m[..]),
            Err(Error::Malformed { .. })
        ));
        // Setters build the real header.
        let mut h = Ipv4Header::new_unchecked([0u8; 20]);
        h.set_version(4);
        h.set_ihl(5);
        h.set_tos(0);
        h.set_total_len(48);
        h.set_ident(Ipv4Header::new_unchecked(&pkt[..]).ident());
        h.set_flags(2);
        h.set_frag_offset(0);
        h.set_ttl(64);
        h.set_protocol(17);
        h.set_src_addr(Ipv4Addr::new(10, 77, 0, 2));
        h.set_dst_addr(Ipv4Addr::new(10, 77, 0, 3));
        h.fill_checksum();
        assert_eq!(h.into_inner(), pkt[..20]);
        let mut u = UdpHeader::new_unchecked([0u8; 8]);
        let real = UdpHeader::new_unchecked(&pkt[20..28]);
        u.set_src_port(real.src_port());
        u.set_dst_port(4791);
        u.set_length(28);
        u.set_checksum(0);
        assert_eq!(u.into_inner(), pkt[20..28]);
        // Emit range checks.
        let mut out = [0u8; 64];
        let mut ip = Ipv4Repr::new_udp(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST);
        ip.options = &[1, 1, 1];
        assert!(ip.emit(&mut out).is_err());
        ip.options = &[];
        ip.dscp = 64;
        assert!(ip.emit(&mut out).is_err());
        let mut v6 = Ipv6Repr::new_udp(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST);
        v6.flow_label = 1 << 20;
        assert!(v6.emit(&mut out).is_err());
        // Emitters refuse short buffers.
        let r = RoceV2Repr::parse(&pkt[..]).unwrap();
        for n in 0..pkt.len() {
            assert!(matches!(
                r.emit(&mut out[..n], UdpChecksum::Zero),
                Err(Error::Truncated { .. })
            ));
        }
        let p = RoceV2Packet::parse(&pkt[..]).unwrap();
        assert!(p.emit(&mut out[..47], UdpChecksum::Zero).is_err());
        // Transport too large for IPv4.
        let big = vec![0u8; 70_000];
        let rr = RoceV2Repr {
            packet: PacketRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, 1, 1), &big),
            ..r
        };
        let mut huge = vec![0u8; 70_100];
        assert!(matches!(
            rr.emit(&mut huge, UdpChecksum::Zero),
            Err(Error::TooLarge { .. })
        ));
    }

    /// Of the two checksum octets that verify when the other words sum to
    /// 0xFFFF, only the canonical 0x0000 parses (so re-emit is identical).
    #[test]
    fn ipv4_checksum_negative_zero() {
        let mut b = [
            0x45, 0, 0, 20, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let folded = !ipv4_checksum(&b);
        b[4..6].copy_from_slice(&(0xFFFF - folded).to_be_bytes());
        assert_eq!(ipv4_checksum(&b), 0);
        assert!(Ipv4Header::new_checked(&b[..]).unwrap().verify_checksum());
        assert!(Ipv4Repr::parse(&b).is_ok());
        b[10] = 0xFF;
        b[11] = 0xFF;
        assert!(Ipv4Header::new_checked(&b[..]).unwrap().verify_checksum());
        assert!(matches!(Ipv4Repr::parse(&b), Err(Error::Malformed { .. })));
    }

    /// IPv4-mapped GIDs.
    #[test]
    fn gids() {
        let a = Ipv4Addr::new(10, 77, 0, 3);
        let g = gid_from_ipv4(a);
        assert_eq!(g, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 3]);
        assert_eq!(gid_to_ipv4(&g), Some(a));
        assert_eq!(gid_to_ip(&g), IpAddr::V4(a));
        assert_eq!(gid_from_ip(IpAddr::V4(a)), g);
        let v6: Ipv6Addr = "fe80::5054:ff:fe77:3".parse().unwrap();
        assert_eq!(gid_to_ipv4(&v6.octets()), None);
        assert_eq!(gid_to_ip(&v6.octets()), IpAddr::V6(v6));
        assert_eq!(gid_from_ip(IpAddr::V6(v6)), v6.octets());
    }

    fn ipv4_strategy() -> impl Strategy<Value = (Ipv4Repr<'static>, usize)> {
        static OPTS: [u8; 40] = [7; 40];
        (
            (
                0u8..64,
                0u8..4,
                any::<u16>(),
                any::<u16>(),
                0u8..8,
                0u16..8192,
            ),
            (
                any::<u8>(),
                any::<u8>(),
                any::<u32>(),
                any::<u32>(),
                0usize..=10,
            ),
        )
            .prop_map(
                |(
                    (dscp, ecn, total_len, ident, flags, frag_offset),
                    (ttl, protocol, s, d, words),
                )| {
                    let options = &OPTS[..words * 4];
                    let total_len = total_len.max((20 + options.len()) as u16);
                    (
                        Ipv4Repr {
                            dscp,
                            ecn,
                            total_len,
                            ident,
                            flags,
                            frag_offset,
                            ttl,
                            protocol,
                            src_addr: Ipv4Addr::from(s),
                            dst_addr: Ipv4Addr::from(d),
                            options,
                        },
                        words,
                    )
                },
            )
    }

    fn ipv6_strategy() -> impl Strategy<Value = Ipv6Repr> {
        (
            any::<u8>(),
            0u32..1 << 20,
            any::<u16>(),
            any::<u8>(),
            any::<u8>(),
            any::<u128>(),
            any::<u128>(),
        )
            .prop_map(
                |(traffic_class, flow_label, payload_len, next_header, hop_limit, s, d)| Ipv6Repr {
                    traffic_class,
                    flow_label,
                    payload_len,
                    next_header,
                    hop_limit,
                    src_addr: Ipv6Addr::from(s),
                    dst_addr: Ipv6Addr::from(d),
                },
            )
    }

    proptest! {
        #[test]
        fn prop_ipv4_roundtrip((r, _) in ipv4_strategy()) {
            let mut a = [0u8; 60];
            let n = r.emit(&mut a).unwrap();
            prop_assert_eq!(n, r.buffer_len());
            let p = Ipv4Repr::parse(&a[..n]).unwrap();
            prop_assert_eq!(p, r);
            let mut b = [0u8; 60];
            p.emit(&mut b).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn prop_ipv6_roundtrip(r in ipv6_strategy()) {
            let mut a = [0u8; 40];
            r.emit(&mut a).unwrap();
            let p = Ipv6Repr::parse(&a).unwrap();
            prop_assert_eq!(p, r);
            let mut b = [0u8; 40];
            p.emit(&mut b).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn prop_udp_roundtrip(s in any::<u16>(), d in any::<u16>(), l in any::<u16>(), c in any::<u16>()) {
            let r = UdpRepr { src_port: s, dst_port: d, length: l, checksum: c };
            let mut a = [0u8; 8];
            r.emit(&mut a).unwrap();
            prop_assert_eq!(UdpRepr::parse(&a).unwrap(), r);
        }

        /// Full RoCEv2 round trip over IPv4 and IPv6 (EXT-ROCE-01/02).
        #[test]
        fn prop_rocev2_roundtrip((v4, _) in ipv4_strategy(), v6 in ipv6_strategy(), use_v6 in any::<bool>(),
                                 sport in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..200),
                                 compute in any::<bool>()) {
            let mut v4 = v4;
            v4.protocol = IP_PROTO_UDP;
            v4.flags &= 0x6;
            v4.frag_offset = 0;
            let mut v6 = v6;
            v6.next_header = IP_PROTO_UDP;
            let ip = if use_v6 { IpRepr::Ipv6(v6) } else { IpRepr::Ipv4(v4) };
            let r = RoceV2Repr {
                ip,
                udp: UdpRepr::rocev2(sport),
                packet: PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 1, 2), &payload),
            };
            let mut r = r;
            r.packet.deth = Some(ib::DethRepr { q_key: 0x11, reserved: 0, src_qp: 3 });
            let csum = if compute { UdpChecksum::Compute } else { UdpChecksum::Zero };
            let mut a = vec![0u8; r.buffer_len()];
            prop_assert_eq!(r.emit(&mut a, csum), Ok(a.len()));
            let p = RoceV2Packet::parse(&a).unwrap();
            prop_assert!(p.icrc_ok());
            prop_assert!(p.udp_checksum_ok());
            let q = RoceV2Repr::parse(&a).unwrap();
            prop_assert_eq!(q.packet, r.packet);
            let mut b = vec![0u8; q.buffer_len()];
            q.emit(&mut b, csum).unwrap();
            prop_assert_eq!(&a, &b);
            let mut c = vec![0u8; p.buffer_len()];
            p.emit(&mut c, csum).unwrap();
            prop_assert_eq!(a, c);
        }

        #[test]
        fn prop_parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Ipv4Repr::parse(&b);
            let _ = Ipv6Repr::parse(&b);
            let _ = UdpRepr::parse(&b);
            let _ = icrc(&b);
            if let Ok(p) = RoceV2Packet::parse(&b) {
                let mut out = vec![0u8; p.buffer_len()];
                let _ = p.emit(&mut out, UdpChecksum::Zero);
            }
            let _ = RoceV2Repr::parse(&b);
        }

        /// Mutations of a real packet never panic; what parses re-emits.
        #[test]
        fn prop_real_packet_mutations(i in 0usize..140, v in any::<u8>(), which in 0usize..29) {
            let mut m = ALL[which % ALL.len()].1.to_vec();
            let i = i % m.len();
            m[i] = v;
            if let Ok(p) = RoceV2Packet::parse(&m) {
                let mut out = vec![0u8; p.buffer_len()];
                p.emit(&mut out, UdpChecksum::Zero).unwrap();
                let end = 28 + p.transport.len();
                prop_assert_eq!(&out[..26], &m[..26]);
                prop_assert_eq!(&out[28..end], &m[28..end]);
            }
            let _ = RoceV2Repr::parse(&m);
        }
    }
}
