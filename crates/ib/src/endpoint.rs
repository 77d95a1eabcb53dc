//! The RoCEv2 endpoint, sans-IO (IBA Vol. 1 Annex A17; ib-transport.md §13.6): what sits
//! between a UDP socket and the queue pairs of one local address. On the way in it checks the
//! ICRC, parses the transport headers, finds the QP by BTH DestQP, checks that a connected QP's
//! packet comes from its path, and builds the GRH image a UD receive needs; on the way out it
//! wraps a QP's packet in RoCEv2 — the UDP payload with its ICRC, or a whole IPv4 packet for a
//! raw socket — and says where it goes.
//!
//! The model is quinn-proto's `Endpoint`: it demultiplexes, it does not own the connections.
//! The [`RoceEndpoint`] keeps only routing state (QPN → service type and path, address
//! handles, the IPv4 Identification counter, counters); each [`IbQp`] stays with the driver,
//! under a lock of its own, so threads posting to different QPs never serialize. Registration
//! and path changes take `&mut self`; the per-datagram paths ([`RoceEndpoint::handle`],
//! [`RoceEndpoint::encapsulate`], [`RoceEndpoint::poll_transmit`]) take `&self` (counters and
//! the Identification counter are atomics), so a driver keeps the endpoint in an `RwLock`
//! and read-locks it per batch. No socket, clock or thread lives here: the simulator of the
//! crate's tests drives the same code as the UDP driver.
//!
//! # Receive
//!
//! A UDP socket gives the UDP payload (BTH .. pad, ICRC) and the sender's address; the
//! endpoint knows its own ([`RoceEndpoint::local`]). In order, as the driver always did:
//!
//! 1. ICRC (IBT-X-20), with [`IcrcVerifier`]: IPv6 in full; IPv4 recovering the sender's
//!    Identification, which the socket hides (16 of the 32 check bits left for errors: see
//!    `softrdma_wire::icrc`) → [`DropReason::BadIcrc`];
//! 2. [`PacketRepr::parse`] → [`DropReason::Malformed`];
//! 3. a QP registered under BTH DestQP (C9-37) → [`DropReason::UnknownQp`];
//! 4. a connected (RC, UC) QP with a path accepts only its path's IP address, any port (the
//!    RoCE form of C9-46: the GID is the address) → [`DropReason::WrongSource`]; UD accepts
//!    any source;
//!
//! then [`Incoming`] carries the QPN, the parsed packet and the 40-octet GRH image for
//! [`IbQp::handle_packet`]. Every datagram is counted once in [`EndpointCounters`]: in
//! `rx_datagrams`, and in the counter of its drop reason if dropped.
//!
//! # Transmit
//!
//! [`RoceEndpoint::encapsulate`] appends one datagram to the caller's buffer and returns a
//! [`Transmit`]: where it goes and through which [`SocketKind`].
//!
//! * [`SocketKind::Udp`]: payload ‖ ICRC computed with IPv4 Identification 0 (the kernel picks
//!   the real one; a peer that recovers it, as this endpoint does, accepts; a strict one such
//!   as rxe does not), or over IPv6 in full. Send it from the endpoint's UDP socket to
//!   [`Transmit::dest`].
//! * [`SocketKind::RawIpv4`], when the endpoint was made with it, its local address and the
//!   destination are IPv4: IPv4 header (IHL 5, DF, TTL 64, TOS 0, our Identification: a
//!   counter that skips 0, since a raw socket replaces 0 with the kernel's own) ‖ UDP header
//!   (source port: rxe's per-QP port, `rocev2_src_port(rocev2_flow_label(src QPN, BTH
//!   DestQP))`; checksum 0, as rxe) ‖ payload ‖ ICRC over exactly that header. For a QP
//!   connected without rdma_cm that is octet for octet what Linux rxe sends (the tests
//!   rebuild captured rxe packets); rxe derives the port of rdma_cm connections and of UD
//!   address handles from a flow label of their own, so there only the port differs (any
//!   port verifies: the receiver hashes the one it sees). Send it through an `IPPROTO_RAW`
//!   socket to [`Transmit::socket_addr`] (port 0).
//!
//! IPv6 always takes the UDP form. A connected QP's packets go to its path
//! ([`RoceEndpoint::set_path`]); a UD send goes to its work request's address handle
//! ([`RoceEndpoint::create_ah`], `UdDest::ah`). A packet with no route (unknown QP, no path,
//! unknown address handle) or not a transport packet is refused and counted.
//!
//! # A driver
//!
//! ```text
//! // Setup (write lock): one endpoint per bound address.
//! let ep = RwLock::new(RoceEndpoint::new(local, if raw_ok { SocketKind::RawIpv4 } else { SocketKind::Udp }));
//! let qpn = ep.write().add_qp(QpType::Rc)?;             // ibv_create_qp: the QPN for IbQp::new
//! ep.write().set_path(qpn, peer)?;                      // before RTR (ah_attr)
//! let ah = ep.write().create_ah(SocketAddr::new(ip, 4791))?; // ibv_create_ah → UdDest::ah
//! ep.write().destroy_ah(ah); ep.write().remove_qp(qpn);  // ibv_destroy_ah / ibv_destroy_qp
//!
//! // Receive, one recvmmsg batch (per-thread IcrcVerifier).
//! let now = Instant::now();
//! {
//!     let ep = ep.read();
//!     for (buf, peer) in batch {
//!         let Ok(inc) = ep.handle(peer, buf, &mut verifier) else { continue }; // counted
//!         // The driver's own QPN → QP map; a QP being created or destroyed may be missing:
//!         // drop the packet (register after inserting, remove before destroying).
//!         let Some(q) = qps.get(&inc.qpn) else { continue };
//!         q.engine.lock().qp.handle_packet(&inc.packet, &inc.grh, now);
//!         touched.insert(q);
//!     }
//! }
//! for q in touched { flush(q) }                         // ACKs of the batch coalesce
//!
//! // Transmit (flush), under the QP's own lock; `scratch` and `dgrams` are reused buffers.
//! let ep = ep.read();
//! dgrams.clear();
//! while let Some(t) = ep.poll_transmit(&mut e.qp, now, &mut scratch, &mut dgrams) {
//!     batch.push(t);                                    // dgrams[t.range()] to t.socket_addr()
//!     if batch.len() == SEND_BATCH { sendmmsg per t.kind; dgrams.clear(); batch.clear() }
//! }
//! ```
//!
//! The driver's `RoceCounters` map onto [`EndpointCounters`]: `rx_packets` = `rx_datagrams`,
//! `bad_icrc`, `malformed`, `unknown_qp`, `wrong_source` as named; `tx_errors` = the
//! endpoint's `tx_no_route` + `tx_invalid` + the socket's refusals; `tx_packets` stays the
//! driver's (datagrams the kernel took).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::ops::Range;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Instant;

use rustc_hash::FxHashMap;
use softrdma_verbs_types::UdDest;
use softrdma_wire::ib::{Bth, PacketRepr};
use softrdma_wire::icrc::{
    Endpoints, IcrcCheck, IcrcVerifier, MAX_IPV4_PAYLOAD_LEN, icrc_checked, icrc_for,
};
use softrdma_wire::rocev2::{
    ICRC_LEN, IPV4_HEADER_LEN, Ipv4Repr, Ipv6Repr, UDP_HEADER_LEN, UdpRepr, rocev2_flow_label,
    rocev2_src_port,
};

use crate::qp::{IbQp, QpType};

/// Octets of the GRH area ahead of a UD receive (IBA 11.4.1.1).
pub const GRH_LEN: usize = 40;

/// The largest QPN (24 bits).
pub const MAX_QPN: u32 = 0xFF_FFFF;

/// The first QPN [`RoceEndpoint::add_qp`] hands out (0 and 1 are the SMI and GSI QPs; rxe
/// starts at 0x11 too).
pub const FIRST_QPN: u32 = 0x11;

/// Which socket a datagram leaves through (module docs, "Transmit").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SocketKind {
    /// The endpoint's UDP socket: the datagram is the UDP payload (BTH .. ICRC).
    Udp,
    /// An IPv4 raw socket (`IPPROTO_RAW`, header included): the datagram is the whole IPv4
    /// packet, with the Identification the ICRC was computed over.
    RawIpv4,
}

/// Why a datagram was dropped on receive; each reason has its counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum DropReason {
    /// The ICRC did not verify, or the datagram is shorter than BTH + ICRC or longer than an
    /// IP packet allows (IBT-X-20).
    #[error("bad ICRC")]
    BadIcrc,
    /// The ICRC verified but the octets are not an IB transport packet.
    #[error("malformed transport packet")]
    Malformed,
    /// No QP registered under the BTH DestQP (C9-37).
    #[error("no QP with that DestQP")]
    UnknownQp,
    /// A connected QP's packet from an address other than its path's (C9-46 on RoCE).
    #[error("connected QP's packet from an address other than its path")]
    WrongSource,
}

/// Why [`RoceEndpoint::encapsulate`] refused a packet; nothing was appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum TxError {
    /// The source QPN is not registered.
    #[error("QP {0:#x} is not registered")]
    UnknownQp(u32),
    /// A connected QP's packet and no path set ([`RoceEndpoint::set_path`]).
    #[error("QP {0:#x} has no path")]
    NoPath(u32),
    /// A UD send to an address handle that does not exist.
    #[error("no address handle {0}")]
    UnknownAh(u32),
    /// Shorter than a BTH, or longer than one IP packet carries.
    #[error("{0} octets is not a transport packet this family can carry")]
    BadLength(usize),
}

/// Why a registration call failed; the endpoint is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EndpointError {
    /// The QPN is registered already.
    #[error("QPN {0:#x} is in use")]
    QpnInUse(u32),
    /// Not a 24-bit QPN.
    #[error("QPN {0:#x} does not fit 24 bits")]
    QpnOutOfRange(u32),
    /// The QPN is not registered.
    #[error("QP {0:#x} is not registered")]
    UnknownQp(u32),
    /// Every QPN from [`FIRST_QPN`] to 2^24 - 1 is in use.
    #[error("no free QPN")]
    QpnsExhausted,
    /// 2^32 address handles exist.
    #[error("no free address handle")]
    AhsExhausted,
}

/// Counters of an endpoint (a snapshot of [`RoceEndpoint::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointCounters {
    /// Datagrams given to [`RoceEndpoint::handle`], whatever became of them.
    pub rx_datagrams: u64,
    /// ICRC did not verify (IBT-X-20).
    pub bad_icrc: u64,
    /// Not a parseable IB transport packet.
    pub malformed: u64,
    /// No QP with the BTH DestQP (C9-37).
    pub unknown_qp: u64,
    /// A connected QP's packet from an address other than its path's (C9-46 on RoCE).
    pub wrong_source: u64,
    /// Datagrams built by [`RoceEndpoint::encapsulate`].
    pub tx_datagrams: u64,
    /// Packets with nowhere to go: unknown source QP, no path, unknown address handle.
    pub tx_no_route: u64,
    /// Packets of a length no datagram carries.
    pub tx_invalid: u64,
}

#[derive(Default)]
struct AtomicCounters {
    rx_datagrams: AtomicU64,
    bad_icrc: AtomicU64,
    malformed: AtomicU64,
    unknown_qp: AtomicU64,
    wrong_source: AtomicU64,
    tx_datagrams: AtomicU64,
    tx_no_route: AtomicU64,
    tx_invalid: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What the endpoint knows of one QP.
#[derive(Clone, Copy, Debug)]
struct Route {
    qp_type: QpType,
    /// A connected QP's peer (its GID as an address, and UDP port).
    path: Option<SocketAddr>,
}

/// A datagram accepted by [`RoceEndpoint::handle`]: hand `packet` and `grh` to the
/// [`IbQp`] numbered `qpn` ([`IbQp::handle_packet`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming<'a> {
    /// The destination QP (BTH DestQP), registered with the endpoint.
    pub qpn: u32,
    /// The transport packet, borrowing the datagram.
    pub packet: PacketRepr<'a>,
    /// The GRH area of a UD receive ([`grh_image`]); zero for the other QP types, which
    /// do not read it.
    pub grh: [u8; GRH_LEN],
    /// The sender's IPv4 Identification recovered from the ICRC (`None` over IPv6); what a
    /// packet capture needs to rebuild the IP header.
    pub ipv4_id: Option<u16>,
}

/// One datagram [`RoceEndpoint::encapsulate`] appended to the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transmit {
    /// The peer: IP address and UDP port (4791 unless testing on one host).
    pub dest: SocketAddr,
    /// The socket to send it through.
    pub kind: SocketKind,
    /// Where the datagram starts in the buffer.
    pub start: usize,
    /// Where it ends.
    pub end: usize,
}

impl Transmit {
    /// The datagram's octets in the buffer.
    pub fn range(&self) -> Range<usize> {
        self.start..self.end
    }

    /// The transport packet within the buffer (BTH .. pad: no IP, UDP or ICRC), e.g. for a
    /// packet log.
    pub fn packet_range(&self) -> Range<usize> {
        let head = match self.kind {
            SocketKind::Udp => 0,
            SocketKind::RawIpv4 => IPV4_HEADER_LEN + UDP_HEADER_LEN,
        };
        self.start.saturating_add(head)..self.end.saturating_sub(ICRC_LEN)
    }

    /// The address to give `sendto`/`sendmmsg`: `dest` for the UDP socket; `dest` with port
    /// 0 for the raw socket (the UDP port is in the packet).
    pub fn socket_addr(&self) -> SocketAddr {
        match self.kind {
            SocketKind::Udp => self.dest,
            SocketKind::RawIpv4 => SocketAddr::new(self.dest.ip(), 0),
        }
    }
}

/// The RoCEv2 endpoint of one local address (module docs).
pub struct RoceEndpoint {
    local: SocketAddr,
    ipv4: SocketKind,
    // Keys are our own QPNs (a peer's only look up): a fast hash is safe.
    qps: FxHashMap<u32, Route>,
    next_qpn: u32,
    ahs: Vec<Option<SocketAddr>>,
    /// Destroyed handles, reused oldest first.
    free_ahs: VecDeque<u32>,
    next_ip_id: AtomicU16,
    counters: AtomicCounters,
}

impl std::fmt::Debug for RoceEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceEndpoint")
            .field("local", &self.local)
            .field("ipv4", &self.ipv4)
            .field("qps", &self.qps.len())
            .field("ahs", &(self.ahs.len() - self.free_ahs.len()))
            .finish()
    }
}

impl RoceEndpoint {
    /// An endpoint at `local` (the bound socket's address and port: both are covered by the
    /// ICRC, so not the wildcard) whose IPv4 datagrams leave as `ipv4` says: through a raw
    /// socket if the driver could open one, else the UDP socket. IPv6 always uses UDP.
    pub fn new(local: SocketAddr, ipv4: SocketKind) -> Self {
        RoceEndpoint {
            local,
            ipv4,
            qps: FxHashMap::default(),
            next_qpn: FIRST_QPN,
            ahs: Vec::new(),
            free_ahs: VecDeque::new(),
            next_ip_id: AtomicU16::new(1),
            counters: AtomicCounters::default(),
        }
    }

    /// The local address and port.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// How IPv4 datagrams leave.
    pub fn ipv4_socket(&self) -> SocketKind {
        self.ipv4
    }

    /// Changes how IPv4 datagrams leave (e.g. the raw socket failed for good).
    pub fn set_ipv4_socket(&mut self, kind: SocketKind) {
        self.ipv4 = kind;
    }

    /// The Identification of the next raw IPv4 datagram (0 is skipped). It counts from 1; a
    /// driver may start it elsewhere, a test to rebuild a captured packet.
    pub fn set_next_ipv4_id(&mut self, id: u16) {
        *self.next_ip_id.get_mut() = id;
    }

    /// Where [`add_qp`](Self::add_qp) starts handing out QPNs (folded into
    /// [`FIRST_QPN`]..=[`MAX_QPN`]). A driver starts each context somewhere unpredictable:
    /// a peer keeps a closed connection's QPN in time-wait, and a REQ from the same QPN
    /// soon after is refused as stale (IBA 12.9.8.3.1).
    pub fn set_next_qpn(&mut self, qpn: u32) {
        self.next_qpn = FIRST_QPN + qpn % (MAX_QPN + 1 - FIRST_QPN);
    }

    // ------------------------------------------------------------ registration

    /// Registers a new QP of `qp_type` under the next free QPN (from [`FIRST_QPN`], wrapping
    /// within 24 bits, skipping numbers in use) and returns it: the number for
    /// [`IbQp::new`].
    pub fn add_qp(&mut self, qp_type: QpType) -> Result<u32, EndpointError> {
        let span = MAX_QPN + 1 - FIRST_QPN;
        for _ in 0..span {
            let qpn = self.next_qpn;
            self.next_qpn = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = self.qps.entry(qpn) {
                e.insert(Route {
                    qp_type,
                    path: None,
                });
                return Ok(qpn);
            }
        }
        Err(EndpointError::QpnsExhausted)
    }

    /// Registers a QP under a number of the caller's choosing (QP1 for the GSI, a test's).
    pub fn insert_qp(&mut self, qpn: u32, qp_type: QpType) -> Result<(), EndpointError> {
        if qpn > MAX_QPN {
            return Err(EndpointError::QpnOutOfRange(qpn));
        }
        match self.qps.entry(qpn) {
            std::collections::hash_map::Entry::Occupied(_) => Err(EndpointError::QpnInUse(qpn)),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Route {
                    qp_type,
                    path: None,
                });
                Ok(())
            }
        }
    }

    /// Unregisters a QP (`ibv_destroy_qp`): its packets count as unknown from now on.
    /// Returns whether it was registered.
    pub fn remove_qp(&mut self, qpn: u32) -> bool {
        self.qps.remove(&qpn).is_some()
    }

    /// Sets a QP's path: where a connected QP sends, and the only IP address it accepts
    /// packets from (the port is not checked: rxe sends from per-QP ports). Needed before
    /// a connected QP sends; unused by UD QPs, which address each send.
    pub fn set_path(&mut self, qpn: u32, remote: SocketAddr) -> Result<(), EndpointError> {
        let r = self
            .qps
            .get_mut(&qpn)
            .ok_or(EndpointError::UnknownQp(qpn))?;
        r.path = Some(remote);
        Ok(())
    }

    /// A QP's path.
    pub fn path(&self, qpn: u32) -> Option<SocketAddr> {
        self.qps.get(&qpn)?.path
    }

    /// A registered QP's service type.
    pub fn qp_type(&self, qpn: u32) -> Option<QpType> {
        self.qps.get(&qpn).map(|r| r.qp_type)
    }

    /// QPs registered.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Creates an address handle (`ibv_create_ah`) for UD sends to `addr`; its id goes into
    /// `UdDest::ah`. Ids of destroyed handles are reused, oldest first.
    pub fn create_ah(&mut self, addr: SocketAddr) -> Result<u32, EndpointError> {
        if let Some(id) = self.free_ahs.pop_front()
            && let Some(slot) = self.ahs.get_mut(id as usize)
        {
            *slot = Some(addr);
            return Ok(id);
        }
        let id = u32::try_from(self.ahs.len()).map_err(|_| EndpointError::AhsExhausted)?;
        self.ahs.push(Some(addr));
        Ok(id)
    }

    /// Destroys an address handle (`ibv_destroy_ah`); returns where it pointed. As in verbs,
    /// no send request in flight may still name it: its id will be reused.
    pub fn destroy_ah(&mut self, id: u32) -> Option<SocketAddr> {
        let addr = self.ahs.get_mut(id as usize)?.take()?;
        self.free_ahs.push_back(id);
        Some(addr)
    }

    /// Where an address handle points.
    pub fn ah(&self, id: u32) -> Option<SocketAddr> {
        *self.ahs.get(id as usize)?
    }

    /// The counters.
    pub fn counters(&self) -> EndpointCounters {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EndpointCounters {
            rx_datagrams: l(&c.rx_datagrams),
            bad_icrc: l(&c.bad_icrc),
            malformed: l(&c.malformed),
            unknown_qp: l(&c.unknown_qp),
            wrong_source: l(&c.wrong_source),
            tx_datagrams: l(&c.tx_datagrams),
            tx_no_route: l(&c.tx_no_route),
            tx_invalid: l(&c.tx_invalid),
        }
    }

    // ------------------------------------------------------------ receive

    /// Checks one received datagram — `datagram` the UDP payload as the socket returned it
    /// (BTH .. ICRC), `src` the sender's address and port — and finds its QP (module docs,
    /// "Receive"). `verifier` is the caller's (one per receiving thread: it caches per-length
    /// bases for the IPv4 Identification). Any octets at all are safe here: no panic, no
    /// allocation beyond the verifier's bounded cache.
    pub fn handle<'a>(
        &self,
        src: SocketAddr,
        datagram: &'a [u8],
        verifier: &mut IcrcVerifier,
    ) -> Result<Incoming<'a>, DropReason> {
        let c = &self.counters;
        bump(&c.rx_datagrams);
        let ep = Endpoints::from_socket_addrs(src, self.local);
        let ipv4_id = match verifier.verify(&ep, datagram) {
            IcrcCheck::Valid { ipv4_id } => ipv4_id,
            IcrcCheck::Invalid => {
                bump(&c.bad_icrc);
                return Err(DropReason::BadIcrc);
            }
        };
        // Valid implies at least BTH + ICRC octets; checked again rather than sliced blind.
        let Some(body) = datagram
            .len()
            .checked_sub(ICRC_LEN)
            .and_then(|n| datagram.get(..n))
        else {
            bump(&c.bad_icrc);
            return Err(DropReason::BadIcrc);
        };
        let Ok(packet) = PacketRepr::parse(body) else {
            bump(&c.malformed);
            return Err(DropReason::Malformed);
        };
        let qpn = packet.bth.dest_qp;
        let Some(route) = self.qps.get(&qpn) else {
            bump(&c.unknown_qp);
            return Err(DropReason::UnknownQp);
        };
        if route.qp_type != QpType::Ud
            && route
                .path
                .is_some_and(|p| p.ip().to_canonical() != src.ip().to_canonical())
        {
            bump(&c.wrong_source);
            return Err(DropReason::WrongSource);
        }
        // Only a UD receive reports the GRH (IBA 11.4.1.1); building it is a fifth of the
        // work on a small packet.
        let grh = match route.qp_type {
            QpType::Ud => grh_image(src, self.local, datagram.len()),
            _ => [0; GRH_LEN],
        };
        Ok(Incoming {
            qpn,
            packet,
            grh,
            ipv4_id,
        })
    }

    // ------------------------------------------------------------ transmit

    /// Wraps one packet of QP `src_qpn` — `payload` as [`IbQp::poll_transmit`] wrote it
    /// (BTH .. pad, `Tx::len` octets), `ud` its `Tx::dest` — in RoCEv2 and appends the
    /// datagram to `out` (module docs, "Transmit"). On error nothing is appended and the
    /// packet is counted (`tx_no_route` or `tx_invalid`); the transport recovers as from a
    /// loss.
    pub fn encapsulate(
        &self,
        src_qpn: u32,
        ud: Option<UdDest>,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Transmit, TxError> {
        self.counted(self.encapsulate_inner(src_qpn, ud, payload, out))
    }

    /// Counts a datagram wrapped, or why not.
    fn counted(&self, r: Result<Transmit, TxError>) -> Result<Transmit, TxError> {
        let c = &self.counters;
        match r {
            Ok(_) => bump(&c.tx_datagrams),
            Err(TxError::BadLength(_)) => bump(&c.tx_invalid),
            Err(_) => bump(&c.tx_no_route),
        }
        r
    }

    /// Wraps a packet of QP `src_qpn` for `dest` (a UD packet without an address handle,
    /// such as a MAD of QP1 answering its sender), as [`encapsulate`](Self::encapsulate).
    pub fn encapsulate_to(
        &self,
        src_qpn: u32,
        dest: SocketAddr,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Transmit, TxError> {
        self.counted(
            self.qps
                .get(&src_qpn)
                .ok_or(TxError::UnknownQp(src_qpn))
                .and_then(|_| self.wrap_copy(src_qpn, dest, payload, out)),
        )
    }

    fn encapsulate_inner(
        &self,
        src_qpn: u32,
        ud: Option<UdDest>,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Transmit, TxError> {
        let dest = self.route(src_qpn, ud)?;
        self.wrap_copy(src_qpn, dest, payload, out)
    }

    /// Where a packet of QP `src_qpn` goes: the UD request's address handle, or the path.
    fn route(&self, src_qpn: u32, ud: Option<UdDest>) -> Result<SocketAddr, TxError> {
        let route = self.qps.get(&src_qpn).ok_or(TxError::UnknownQp(src_qpn))?;
        match ud {
            Some(u) => self.ah(u.ah).ok_or(TxError::UnknownAh(u.ah)),
            None => route.path.ok_or(TxError::NoPath(src_qpn)),
        }
    }

    /// Octets left in front of a packet built in place for the headers the socket needs:
    /// IPv4 and UDP when IPv4 leaves through a raw socket.
    fn reserve(&self) -> usize {
        match self.ipv4 {
            SocketKind::RawIpv4 => IPV4_HEADER_LEN + UDP_HEADER_LEN,
            SocketKind::Udp => 0,
        }
    }

    /// [`RoceEndpoint::wrap`] of a packet copied in from `payload`.
    fn wrap_copy(
        &self,
        src_qpn: u32,
        dest: SocketAddr,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Transmit, TxError> {
        let start = out.len();
        out.resize(start + self.reserve(), 0);
        out.extend_from_slice(payload);
        let r = self.wrap(src_qpn, dest, out, start);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    /// Makes the packet at `out[start + self.reserve()..]` (BTH .. pad) a datagram to `dest`
    /// in place: the IPv4 and UDP headers written into the reserved octets (raw socket) or
    /// the reserve removed (UDP socket), the ICRC appended. On error `out` is to be cut back
    /// to `start` by the caller.
    fn wrap(
        &self,
        src_qpn: u32,
        dest: SocketAddr,
        out: &mut Vec<u8>,
        start: usize,
    ) -> Result<Transmit, TxError> {
        let at = start + self.reserve();
        let payload = &out[at..];
        let bad_len = TxError::BadLength(payload.len());
        let bth = Bth::new_checked(payload).map_err(|_| bad_len)?;
        let kind = match (self.ipv4, self.local.ip(), dest) {
            (SocketKind::RawIpv4, IpAddr::V4(src), SocketAddr::V4(dst)) => {
                // rxe's port for a QP without a flow label: the QP pair's flow label (the
                // BTH DestQP is the path's or the UD request's remote QPN).
                let port = rocev2_src_port(rocev2_flow_label(src_qpn, bth.dest_qp()));
                let id = self.next_ipv4_id();
                let src = SocketAddrV4::new(src, port);
                let hdr = raw_ipv4_headers(src, dst, id, payload.len())?;
                let ep = Endpoints::from_socket_addrs(src.into(), dest);
                let icrc = icrc_for(&ep, id, payload);
                out[start..at].copy_from_slice(&hdr);
                out.extend_from_slice(&icrc.to_le_bytes());
                SocketKind::RawIpv4
            }
            _ => {
                let ep = Endpoints::from_socket_addrs(self.local, dest);
                // The ICRC with IPv4 Identification 0: the kernel chooses the real one
                // (ignored for IPv6).
                let icrc = icrc_checked(&ep, 0, payload).ok_or(bad_len)?;
                if at > start {
                    // A raw IPv4 socket's reserve in front of a datagram for the UDP one.
                    out.drain(start..at);
                }
                out.extend_from_slice(&icrc.to_le_bytes());
                SocketKind::Udp
            }
        };
        Ok(Transmit {
            dest,
            kind,
            start,
            end: out.len(),
        })
    }

    /// The next Identification: a counter skipping 0 (a raw socket would replace 0 by the
    /// kernel's own, and the ICRC would no longer match).
    fn next_ipv4_id(&self) -> u16 {
        let id = self.next_ip_id.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            self.next_ip_id.fetch_add(1, Ordering::Relaxed)
        } else {
            id
        }
    }

    /// Runs `qp`'s transmit and appends the next packet that has a route to `out` as a
    /// datagram, built in place (headers reserved in front, the payload gathered from
    /// registered memory once, the ICRC over it); packets without a route are counted and
    /// skipped (the transport recovers as from a loss). `None` when the QP has nothing to
    /// send.
    pub fn poll_transmit(
        &self,
        qp: &mut IbQp,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Option<Transmit> {
        self.poll_transmit_holding(qp, now, out, false)
    }

    /// As [`RoceEndpoint::poll_transmit`], holding back a lone positive ACK with `hold_ack`
    /// ([`IbQp::poll_transmit_holding`]).
    pub fn poll_transmit_holding(
        &self,
        qp: &mut IbQp,
        now: Instant,
        out: &mut Vec<u8>,
        hold_ack: bool,
    ) -> Option<Transmit> {
        loop {
            let start = out.len();
            out.resize(start + self.reserve(), 0);
            let Some(tx) = qp.append_transmit(now, out, hold_ack) else {
                out.truncate(start);
                return None;
            };
            let r = self
                .route(qp.qpn(), tx.dest)
                .and_then(|dest| self.wrap(qp.qpn(), dest, out, start));
            match self.counted(r) {
                Ok(t) => return Some(t),
                Err(e) => {
                    out.truncate(start);
                    tracing::debug!(qpn = qp.qpn(), error = %e, "packet not sent");
                }
            }
        }
    }
}

/// The IPv4 and UDP headers of a RoCEv2 datagram as rxe sends it (IHL 5, TOS 0,
/// Identification `ident`, DF, TTL 64, checksum; UDP checksum 0) around a `len`-octet
/// packet (BTH .. pad) and its ICRC. [`TxError::BadLength`] above `MAX_IPV4_PAYLOAD_LEN`.
fn raw_ipv4_headers(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
    len: usize,
) -> Result<[u8; IPV4_HEADER_LEN + UDP_HEADER_LEN], TxError> {
    let bad_len = TxError::BadLength(len);
    if len > MAX_IPV4_PAYLOAD_LEN {
        return Err(bad_len);
    }
    let udp_len = UDP_HEADER_LEN + len + ICRC_LEN;
    let ip = Ipv4Repr {
        total_len: (IPV4_HEADER_LEN + udp_len) as u16,
        ident,
        ..Ipv4Repr::new_udp(*src.ip(), *dst.ip())
    };
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        length: udp_len as u16,
        checksum: 0,
    };
    let mut hdr = [0u8; IPV4_HEADER_LEN + UDP_HEADER_LEN];
    // Both fit their fixed sizes: emit cannot fail here.
    ip.emit(&mut hdr[..IPV4_HEADER_LEN]).map_err(|_| bad_len)?;
    udp.emit(&mut hdr[IPV4_HEADER_LEN..]).map_err(|_| bad_len)?;
    Ok(hdr)
}

/// Appends a whole RoCEv2 IPv4 packet as rxe sends it: IPv4 (IHL 5, TOS 0, Identification
/// `ident`, DF, TTL 64, checksum) ‖ UDP (`src` port to `dst` port, checksum 0) ‖ `payload`
/// (BTH .. pad) ‖ ICRC; returns the octets appended. [`TxError::BadLength`], with nothing
/// appended, for a payload longer than `MAX_IPV4_PAYLOAD_LEN`. The form
/// [`RoceEndpoint::encapsulate`] builds for a raw socket.
pub fn emit_raw_ipv4(
    out: &mut Vec<u8>,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
    payload: &[u8],
) -> Result<usize, TxError> {
    let hdr = raw_ipv4_headers(src, dst, ident, payload.len())?;
    out.extend_from_slice(&hdr);
    out.extend_from_slice(payload);
    let ep = Endpoints::from_socket_addrs(src.into(), dst.into());
    out.extend_from_slice(&icrc_for(&ep, ident, payload).to_le_bytes());
    Ok(hdr.len() + payload.len() + ICRC_LEN)
}

/// The 40-octet GRH area of a UD receive from `src` to `dst` of a `len`-octet UDP payload
/// (BTH .. ICRC), as the driver has always built it: for IPv4, rxe's layout — 20 zero octets,
/// then an IPv4 header (TOS 0, Identification 0, DF, TTL 64, UDP, the addresses, checksum);
/// for IPv6 an IPv6 header filling the area (traffic class and flow label 0, hop limit 64). An
/// IPv4-mapped address counts as IPv4 (what was on the wire).
pub fn grh_image(src: SocketAddr, dst: SocketAddr, len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let udp_len = UDP_HEADER_LEN + len;
    match (src.ip().to_canonical(), dst.ip().to_canonical()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = Ipv4Repr {
                total_len: (IPV4_HEADER_LEN + udp_len) as u16,
                ..Ipv4Repr::new_udp(s, d)
            };
            // 20 octets into 20: cannot fail.
            let _ = ip.emit(&mut g[GRH_LEN - IPV4_HEADER_LEN..]);
        }
        (s, d) => {
            let ip = Ipv6Repr {
                payload_len: udp_len as u16,
                ..Ipv6Repr::new_udp(ipv6_of(s), ipv6_of(d))
            };
            let _ = ip.emit(&mut g);
        }
    }
    g
}

fn ipv6_of(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QPN allocation wraps within 24 bits back to FIRST_QPN and skips numbers in use (the
    /// driver's counter wrapped onto QPNs 0 and 1 and onto live QPs).
    #[test]
    fn qpn_allocation_wraps_and_skips() {
        let mut e = RoceEndpoint::new("10.0.0.1:4791".parse().unwrap(), SocketKind::Udp);
        e.insert_qp(MAX_QPN, QpType::Rc).unwrap();
        e.insert_qp(FIRST_QPN, QpType::Rc).unwrap();
        e.next_qpn = MAX_QPN - 1;
        assert_eq!(e.add_qp(QpType::Rc), Ok(MAX_QPN - 1));
        assert_eq!(
            e.add_qp(QpType::Uc),
            Ok(FIRST_QPN + 1),
            "wrapped, 0x11 in use"
        );
        assert_eq!(e.qp_type(FIRST_QPN + 1), Some(QpType::Uc));
        assert_eq!(
            e.insert_qp(MAX_QPN + 1, QpType::Rc),
            Err(EndpointError::QpnOutOfRange(MAX_QPN + 1))
        );
    }
}
