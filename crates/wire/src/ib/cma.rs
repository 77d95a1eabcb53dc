//! What librdmacm puts on top of the CM for IP addressing: service IDs made of a port
//! space and a port, the CMA header that leads the private data of REQ and SIDR_REQ, and
//! RoCE GIDs made from IP addresses (IBA Annex A17, RoCEv2: a GID is an IPv6 address, an
//! IPv4 address IPv4-mapped).
//!
//! Layouts as Linux's `drivers/infiniband/core/cma.c` puts them on the wire (the IBTA's
//! "IP addressing annex" to ch. 12 describes the same header); checked against the REQ
//! and SIDR_REQ of `rxe-rping.pcap` and `rxe-udaddy.pcap`.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::{Error, Layer, Result, need};
use crate::macros::wire_enum;

/// The CMA header: version, IP version, source port, source and destination addresses.
pub const CMA_HDR_LEN: usize = 36;
/// The only CMA header version.
pub const CMA_VERSION: u8 = 0;

wire_enum! {
    /// librdmacm port spaces (`enum rdma_ucm_port_space`): the service ID's bits 16–31.
    pub enum PortSpace: u16 => (Layer::Cm, "port space") {
        /// RDMA_PS_IPOIB.
        Ipoib = 0x0002,
        /// RDMA_PS_TCP: RC (rping, perftest -R, NFS over RDMA).
        Tcp = 0x0106,
        /// RDMA_PS_UDP: UD through SIDR (udaddy).
        Udp = 0x0111,
        /// RDMA_PS_IB: any QP type.
        Ib = 0x013F,
    }
}

/// The service ID of `port` in port space `ps`: `0x0000_0000_SSSS_PPPP`.
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (u64::from(u16::from(ps)) << 16) | u64::from(port)
}

/// The port space and port of a librdmacm service ID; `None` for any other service ID.
pub fn port_of_service(id: u64) -> Option<(PortSpace, u16)> {
    if id >> 32 != 0 {
        return None;
    }
    let ps = PortSpace::try_from((id >> 16) as u16).ok()?;
    Some((ps, id as u16))
}

/// The RoCEv2 GID of `ip` (an IPv4 address IPv4-mapped, `::ffff:a.b.c.d`).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a RoCEv2 GID stands for (IPv4-mapped GIDs as IPv4).
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    Ipv6Addr::from(gid).to_canonical()
}

/// The CMA header (`struct cma_hdr`): where the connection comes from and goes to, in IP
/// terms, for the listener to match and report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// The requester's address and port.
    pub src: SocketAddr,
    /// The address the requester asked for (the port is the service ID's).
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Reads the header at the start of REQ or SIDR_REQ private data; the rest is the
    /// application's. `Unknown` for another version, `Malformed` for mixed IP versions.
    pub fn parse(b: &[u8]) -> Result<(CmaHeader, &[u8])> {
        need(Layer::Cm, b, CMA_HDR_LEN)?;
        if b[0] != CMA_VERSION {
            return Err(Error::Unknown {
                layer: Layer::Cm,
                field: "CMA version",
                value: u64::from(b[0]),
            });
        }
        let port = u16::from_be_bytes([b[2], b[3]]);
        let addr = |a: &[u8]| -> Result<IpAddr> {
            let mut o = [0u8; 16];
            o.copy_from_slice(a);
            Ok(match b[1] >> 4 {
                // IPv4 in the last four octets of the 16.
                4 => IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15])),
                6 => IpAddr::V6(Ipv6Addr::from(o)),
                v => {
                    return Err(Error::Unknown {
                        layer: Layer::Cm,
                        field: "CMA IP version",
                        value: u64::from(v),
                    });
                }
            })
        };
        let src = addr(&b[4..20])?;
        let dst = addr(&b[20..36])?;
        Ok((
            CmaHeader {
                src: SocketAddr::new(src, port),
                dst,
            },
            &b[CMA_HDR_LEN..],
        ))
    }

    /// Writes the header into the first [`CMA_HDR_LEN`] octets of `b`; `Malformed` when
    /// source and destination are of different IP versions.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need(Layer::Cm, b, CMA_HDR_LEN)?;
        let (ver, src, dst) = match (self.src.ip(), self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut so = [0u8; 16];
                let mut d16 = [0u8; 16];
                so[12..].copy_from_slice(&s.octets());
                d16[12..].copy_from_slice(&d.octets());
                (4u8, so, d16)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s.octets(), d.octets()),
            _ => {
                return Err(Error::Malformed {
                    layer: Layer::Cm,
                    reason: "CMA header addresses of different IP versions",
                });
            }
        };
        b[0] = CMA_VERSION;
        b[1] = ver << 4;
        b[2..4].copy_from_slice(&self.src.port().to_be_bytes());
        b[4..20].copy_from_slice(&src);
        b[20..36].copy_from_slice(&dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::cm::CmMessage;
    use crate::ib::cm_vectors::{RPING_REQ, UDADDY_SIDR_REQ};
    use crate::ib::mad::MAD_HEADER_LEN;

    #[test]
    fn rping_req_and_udaddy_sidr_req_carry_the_cma_header() {
        let Ok(CmMessage::Req(r)) = CmMessage::parse(0x10, &RPING_REQ[MAD_HEADER_LEN..]) else {
            panic!("REQ")
        };
        let (h, rest) = CmaHeader::parse(r.private_data).unwrap();
        assert_eq!(h.src, "10.77.0.3:57619".parse().unwrap());
        assert_eq!(h.dst, IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2)));
        assert_eq!(rest.len(), r.private_data.len() - CMA_HDR_LEN);
        let mut out = [0xEEu8; CMA_HDR_LEN];
        h.emit(&mut out).unwrap();
        assert_eq!(out[..], r.private_data[..CMA_HDR_LEN]);
        // The path's GIDs are the same addresses, IPv4-mapped.
        assert_eq!(r.primary.local_gid, gid_of(h.src.ip()));
        assert_eq!(ip_of_gid(r.primary.remote_gid), h.dst);
        assert_eq!(port_of_service(r.service_id), Some((PortSpace::Tcp, 7174)));
        assert_eq!(service_id(PortSpace::Tcp, 7174), r.service_id);
        let Ok(CmMessage::SidrReq(q)) = CmMessage::parse(0x17, &UDADDY_SIDR_REQ[MAD_HEADER_LEN..])
        else {
            panic!("SIDR_REQ")
        };
        assert_eq!(
            port_of_service(q.service_id).map(|p| p.0),
            Some(PortSpace::Udp)
        );
        assert_eq!(CmaHeader::parse(q.private_data).unwrap().0.dst, h.dst);
    }

    /// RPCRDMA-71: on InfiniBand transports an IP port becomes a service ID (librdmacm's
    /// RDMA_PS_TCP space); NFS/RDMA's 20049 is service 0x0106_4E51, the one the kernel's
    /// client asks for in `nfs3-rdma-rxe.pcap`.
    #[test]
    fn rpcrdma_71_nfs_port_is_an_ib_service_id() {
        assert_eq!(service_id(PortSpace::Tcp, 20049), 0x0106_4E51);
        assert_eq!(port_of_service(0x0106_4E51), Some((PortSpace::Tcp, 20049)));
        assert_eq!(port_of_service(0x0111_1C06), Some((PortSpace::Udp, 7174)));
        assert_eq!(port_of_service(0x1_0106_4E51), None);
        assert_eq!(port_of_service(0x0107_4E51), None);
    }

    #[test]
    fn ipv6_round_trip_and_refusals() {
        let h = CmaHeader {
            src: "[fe80::1]:4791".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        let mut b = [0u8; 40];
        h.emit(&mut b).unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHeader::parse(&b).unwrap(), (h, &b[36..]));
        let mixed = CmaHeader {
            src: "10.0.0.1:1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        assert!(mixed.emit(&mut b).is_err());
        assert!(h.emit(&mut [0u8; 35]).is_err());
        let mut bad = b;
        bad[0] = 1;
        assert!(CmaHeader::parse(&bad).is_err(), "version");
        bad[0] = 0;
        bad[1] = 0x50;
        assert!(CmaHeader::parse(&bad).is_err(), "IP version");
        assert!(CmaHeader::parse(&b[..35]).is_err());
        assert_eq!(port_of_service(0x1_0000_0106_0001), None);
        assert_eq!(port_of_service(0x0999_0001), None);
        assert_eq!(
            ip_of_gid(gid_of("10.1.2.3".parse().unwrap())),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }
}
