//! Link, IP and transport slicing of one captured frame.

use std::net::IpAddr;

use etherparse::{
    Ipv4HeaderSlice, Ipv4Slice, Ipv6Slice, LaxIpv4Slice, LaxIpv6Slice, TcpSlice, UdpSlice,
};

use super::capture::Link;

const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// RoCE v1 (IBA Annex A16): GRH + BTH straight over Ethernet.
pub const ETH_P_ROCEV1: u16 = 0x8915;

/// The transport part of an IP packet.
#[derive(Debug, Clone)]
pub enum L4<'a> {
    Tcp {
        src_port: u16,
        dst_port: u16,
        seq: u32,
        syn: bool,
        fin: bool,
        rst: bool,
        /// The payload as captured (all of it unless the frame was cut).
        payload: &'a [u8],
        /// The payload's length on the wire.
        len: usize,
    },
    Udp {
        src_port: u16,
        dst_port: u16,
        /// UDP header and payload, trimmed to the UDP length.
        datagram: &'a [u8],
        payload: &'a [u8],
    },
    Other {
        protocol: u8,
    },
    /// A fragment other than the first: nothing above IP to decode.
    Fragment,
}

/// What one frame holds, as far as the decoder cares.
#[derive(Debug, Clone)]
pub enum NetPacket<'a> {
    Ip {
        src: IpAddr,
        dst: IpAddr,
        /// The whole IP packet (header through payload, link padding removed), or as much
        /// of it as the capture kept.
        ip: &'a [u8],
        /// The IP packet's length on the wire when the capture cut it short (snap length).
        cut: Option<usize>,
        l4: L4<'a>,
    },
    /// Not IP (ARP, LLDP, RoCE v1, ...): the EtherType, if any.
    NonIp { ethertype: Option<u16> },
}

/// Why a frame could not be sliced.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetError {
    #[error("link header truncated")]
    LinkTruncated,
    #[error("IP: {0}")]
    Ip(String),
    #[error("TCP: {0}")]
    Tcp(String),
    #[error("UDP: {0}")]
    Udp(String),
}

/// Find the network-layer start and its EtherType.
fn link_payload(link: Link, d: &[u8]) -> Result<(Option<u16>, &[u8]), NetError> {
    let be16 = |o: usize| -> Result<u16, NetError> {
        d.get(o..o + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or(NetError::LinkTruncated)
    };
    match link {
        Link::Ethernet => {
            let mut off = 12;
            let mut et = be16(off)?;
            while et == ETH_P_8021Q || et == ETH_P_8021AD {
                off += 4;
                et = be16(off)?;
            }
            Ok((Some(et), &d[off + 2..]))
        }
        // SLL: 16-octet header, protocol at 14.
        Link::LinuxSll => Ok((Some(be16(14)?), d.get(16..).ok_or(NetError::LinkTruncated)?)),
        // SLL2: 20-octet header, protocol at 0.
        Link::LinuxSll2 => Ok((Some(be16(0)?), d.get(20..).ok_or(NetError::LinkTruncated)?)),
        Link::RawIp => {
            let v = d.first().ok_or(NetError::LinkTruncated)? >> 4;
            let et = match v {
                4 => ETH_P_IPV4,
                6 => ETH_P_IPV6,
                _ => return Ok((None, d)),
            };
            Ok((Some(et), d))
        }
        Link::Null | Link::Loop => {
            let rest = d.get(4..).ok_or(NetError::LinkTruncated)?;
            let v = rest.first().map(|b| b >> 4);
            let et = match v {
                Some(4) => Some(ETH_P_IPV4),
                Some(6) => Some(ETH_P_IPV6),
                _ => None,
            };
            Ok((et, rest))
        }
    }
}

/// Slice one frame down to its transport payload. `sliced`: the capture kept less of the
/// frame than was sent (its snap length); the packet's own lengths then say what is missing
/// instead of making the frame malformed.
pub fn slice(link: Link, data: &[u8], sliced: bool) -> Result<NetPacket<'_>, NetError> {
    let (ethertype, rest) = link_payload(link, data)?;
    let ip_err = |e: &dyn std::fmt::Display| NetError::Ip(e.to_string());
    // (src, dst, IP packet as captured, its length on the wire, protocol, payload as
    // captured, first fragment or none)
    let (src, dst, ip, wire_len, proto, payload, fragment) = match ethertype {
        Some(ETH_P_IPV4) => {
            // Checked lengths, or, cut, the header's own (the payload what was kept).
            let (proto, payload, fragmented) = if sliced {
                let (s, _) = LaxIpv4Slice::from_slice(rest).map_err(|e| ip_err(&e))?;
                let p = s.payload();
                (p.ip_number.0, p.payload, s.is_payload_fragmented())
            } else {
                let s = Ipv4Slice::from_slice(rest).map_err(|e| ip_err(&e))?;
                let p = s.payload();
                (p.ip_number.0, p.payload, s.is_payload_fragmented())
            };
            let h = Ipv4HeaderSlice::from_slice(rest).map_err(|e| ip_err(&e))?;
            let wire = usize::from(h.total_len());
            (
                IpAddr::from(h.source_addr()),
                IpAddr::from(h.destination_addr()),
                &rest[..wire.min(rest.len())],
                wire,
                proto,
                payload,
                fragmented && h.fragments_offset().value() != 0,
            )
        }
        Some(ETH_P_IPV6) => {
            let (h, proto, payload, fragmented) = if sliced {
                let (s, _) = LaxIpv6Slice::from_slice(rest).map_err(|e| ip_err(&e))?;
                let p = s.payload();
                (
                    s.header(),
                    p.ip_number.0,
                    p.payload,
                    s.is_payload_fragmented(),
                )
            } else {
                let s = Ipv6Slice::from_slice(rest).map_err(|e| ip_err(&e))?;
                let p = s.payload();
                (
                    s.header(),
                    p.ip_number.0,
                    p.payload,
                    s.is_payload_fragmented(),
                )
            };
            let wire = 40 + usize::from(h.payload_length());
            (
                IpAddr::from(h.source_addr()),
                IpAddr::from(h.destination_addr()),
                &rest[..wire.min(rest.len())],
                wire,
                proto,
                payload,
                fragmented,
            )
        }
        other => return Ok(NetPacket::NonIp { ethertype: other }),
    };
    let cut = (ip.len() < wire_len).then_some(wire_len);
    // The transport payload's length on the wire: what the capture lacks comes off its end.
    let missing = wire_len - ip.len();
    let l4 = if fragment {
        L4::Fragment
    } else {
        match proto {
            6 => {
                let t = TcpSlice::from_slice(payload).map_err(|e| NetError::Tcp(e.to_string()))?;
                L4::Tcp {
                    src_port: t.source_port(),
                    dst_port: t.destination_port(),
                    seq: t.sequence_number(),
                    syn: t.syn(),
                    fin: t.fin(),
                    rst: t.rst(),
                    payload: t.payload(),
                    len: t.payload().len() + missing,
                }
            }
            17 => {
                let u = if cut.is_some() {
                    UdpSlice::from_slice_lax(payload)
                } else {
                    UdpSlice::from_slice(payload)
                }
                .map_err(|e| NetError::Udp(e.to_string()))?;
                let len = usize::from(u.length()).clamp(8, payload.len());
                L4::Udp {
                    src_port: u.source_port(),
                    dst_port: u.destination_port(),
                    datagram: &payload[..len],
                    payload: &payload[8..len],
                }
            }
            p => L4::Other { protocol: p },
        }
    };
    Ok(NetPacket::Ip {
        src,
        dst,
        ip,
        cut,
        l4,
    })
}
