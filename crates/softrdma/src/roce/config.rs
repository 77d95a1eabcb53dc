//! Where a RoCE context listens and how its datagrams leave ([`RoceConfig`]), and what
//! its driver counts ([`RoceCounters`]).

use std::net::IpAddr;

use softrdma_wire::rocev2::ROCEV2_UDP_PORT;

use crate::Error;

/// Where a RoCE context listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceConfig {
    /// Local address (a specific address, not the wildcard: it is part of the ICRC).
    pub addr: IpAddr,
    /// UDP port, 4791 unless two contexts must share an address in tests.
    pub port: u16,
    /// Socket receive buffer asked for: capped at `net.core.rmem_max` unless the process has
    /// `CAP_NET_ADMIN` (`SO_RCVBUFFORCE`). RC adapts its window to it; UC and UD, which have
    /// no flow control, lose what a burst overflows.
    pub recv_buffer: usize,
    /// How IPv4 datagrams are sent (see [`RawTx`]).
    pub raw_tx: RawTx,
    /// UDP segmentation offload on the UDP socket (where the kernel has it): a run of
    /// equal-size packets to one peer leaves as one super-datagram (`UDP_SEGMENT`), and
    /// received runs come up as one (`UDP_GRO`), each cut back into its packets. Raw-socket
    /// sends go one datagram each.
    pub gso: bool,
    /// Connection manager: connection requests (REQ received or REP sent, not yet
    /// established) and SIDR requests from one address held at once; more are refused
    /// (REJ "no resources", SIDR_REP "rejected"), so one peer's burst leaves room for
    /// others. 64.
    pub cm_pending_per_source: usize,
    /// Connection manager: the longest a REP waits for the requester's RTU, whatever the
    /// requester's timing asks for; then the connection is given up (REJ "timeout") and the
    /// QP goes to Error. 77 s: past the 69 s of a Linux requester's 16 tries.
    pub cm_rtu_timeout: std::time::Duration,
}

/// How IPv4 datagrams leave.
///
/// The ICRC covers the IPv4 Identification, which a UDP socket does not let us choose. A
/// peer that verifies ICRCs exactly — Linux rxe, RoCE NICs — needs the Identification we
/// computed it over. Linux gives a datagram of an unconnected UDP socket Identification 0
/// when the socket asked for strict path MTU discovery (`IP_PMTUDISC_DO`: DF set, never
/// fragmented locally), and numbers the segments of a GSO super-datagram 0, 1, 2, ...;
/// otherwise it draws the Identification from a hashed per-destination counter. The
/// driver sets `IP_PMTUDISC_DO` and computes each ICRC for the Identification the kernel
/// will write. A raw socket (`IPPROTO_RAW`, needs `CAP_NET_RAW`) sends our own IPv4 header
/// instead (our Identification, DF, TTL 64, the per-QP UDP source port of rxe), one
/// datagram per system call and with a route lookup each: far dearer. softrdma peers accept
/// either (their check recovers the Identification). IPv6 has no Identification and always
/// uses UDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RawTx {
    /// The UDP socket when the kernel writes the Identification its ICRCs assume
    /// (`IP_PMTUDISC_DO` could be set); else the raw socket if it can be opened; else UDP.
    #[default]
    Auto,
    /// Always the UDP socket.
    Off,
    /// Raw socket or fail to open the context.
    Required,
}

impl RoceConfig {
    /// `addr`, port 4791, 4 MiB receive buffer.
    pub fn new(addr: IpAddr) -> Self {
        let cm_defaults = softrdma_ib::cm::CmConfig::new(addr, 0, 0, 0);
        RoceConfig {
            addr,
            port: ROCEV2_UDP_PORT,
            recv_buffer: 4 << 20,
            raw_tx: RawTx::Auto,
            gso: true,
            cm_pending_per_source: cm_defaults.max_pending_per_source,
            cm_rtu_timeout: cm_defaults.rtu_timeout,
        }
    }

    /// Configurations for contexts on several addresses of one host (127.0.0.1,
    /// 127.0.0.2, ...) that reach each other: peers are sent to at the context's own UDP
    /// port, so all get one port, free on every address, other than 4791 (which a kernel
    /// rxe or another test may hold), from [`crate::spare_ports`]. In one process
    /// [`crate::Device::open_sharing_a_port`] also closes the window between this choice
    /// and the opening.
    pub fn sharing_a_port(addrs: &[IpAddr]) -> Result<Vec<RoceConfig>, Error> {
        let port = crate::net::spare_ports(addrs, 1)?;
        Ok(addrs
            .iter()
            .map(|&a| RoceConfig {
                port,
                ..RoceConfig::new(a)
            })
            .collect())
    }
}

/// Datagrams the driver dropped, by reason, and what it moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RoceCounters {
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Datagrams received.
    pub rx_packets: u64,
    /// ICRC did not verify (IBT-X-20).
    pub bad_icrc: u64,
    /// Not a parseable IB transport packet.
    pub malformed: u64,
    /// No QP with the BTH DestQP (C9-37).
    pub unknown_qp: u64,
    /// A connected QP got a packet from an address other than its path's (C9-46 on RoCE).
    pub wrong_source: u64,
    /// Packets not sent: no route (an unknown address handle, no path) or refused by the
    /// socket (e.g. buffer full); the transport recovers as from a loss.
    pub tx_errors: u64,
    /// GSO super-datagrams sent (each a run of packets, [`RoceConfig::gso`]).
    pub gso_sends: u64,
    /// Receives that held a GRO run of packets.
    pub gro_receives: u64,
    /// Posts (and other flushes) that found another thread sending the QP's datagrams and
    /// left theirs to it.
    pub tx_handed_over: u64,
    /// Posts of 64 KiB or more to a QP still sending, left to the thread waiting on the
    /// socket (which takes the QP's ACKs) to send.
    pub tx_deferred: u64,
    /// Packets for QP1 that were not a MAD as the GSI takes them (UD Send Only of 256
    /// octets, Q_Key 0x80010000, default P_Key; IBA 13.5.1).
    pub qp1_dropped: u64,
    /// The connection manager's own counts (MADs, malformed and stray ones, retries).
    pub cm: softrdma_ib::cm::CmCounters,
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, UdpSocket};

    use super::*;

    /// A port taken by a bind to port 0 while a chooser's port was between its choice and
    /// its opening refused the opening (a CI failure): shared ports come from below the
    /// ephemeral range, differ from one choice to the next, and are free on every address.
    #[test]
    fn shared_ports_are_free_everywhere_and_outside_the_ephemeral_range() {
        let ips = [1, 2].map(|l| IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, l)));
        let ports: Vec<u16> = (0..8)
            .map(|_| {
                let c = RoceConfig::sharing_a_port(&ips).unwrap();
                assert_eq!((c[0].addr, c[1].addr), (ips[0], ips[1]));
                assert_eq!(c[0].port, c[1].port);
                for c in &c {
                    UdpSocket::bind(SocketAddr::new(c.addr, c.port)).unwrap();
                }
                c[0].port
            })
            .collect();
        let low = crate::net::ephemeral_low();
        assert!(
            ports.iter().all(|&p| p >= 1024 && p < low.max(2048)),
            "{ports:?}"
        );
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "the same port each time: {ports:?}");
        assert!(!ports.contains(&ROCEV2_UDP_PORT));
    }
}
