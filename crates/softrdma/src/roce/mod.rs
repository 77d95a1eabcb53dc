//! The RoCEv2 driver: InfiniBand QPs ([`softrdma_ib::IbQp`]) over one UDP socket bound to
//! port 4791 of a local address (IBA Annex A17; ib-transport.md §13.6).
//!
//! Sending happens in the caller's thread: `post_send` runs the requester and writes the
//! datagrams at once, so a message leaves without a thread hand-off. One receive thread per
//! context reads datagrams, checks the ICRC (`softrdma_wire::icrc`: the socket hides the IP
//! header, so the IPv4 Identification is recovered from the CRC), finds the QP by BTH
//! DestQP, runs the engine, sends what it answers (ACKs, READ responses) and runs the
//! retransmission timers. Bad datagrams are dropped and counted, never passed on.
//!
//! Addressing: GIDs are IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) or IPv6 addresses; a
//! connected QP's path is the peer's IP address (`RoceQp::set_remote`), a UD send's is an
//! address handle ([`Pd::create_ah`]). IPv4 datagrams leave through a raw socket when the
//! process may open one ([`RawTx`]), with the per-QP UDP source port rxe uses (flow-label
//! hash of the QP pair); otherwise through the UDP socket, from its port.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use parking_lot::{Mutex, RwLock};
use softrdma_ib::{IbQp, QpAttr, QpCaps, QpState as IbQpState, QpType};
use softrdma_memory::{KeyTable, PdId};
use softrdma_verbs_types::{RecvWr, SendWr, WorkCompletion};
use softrdma_wire::ib::PacketRepr;
use softrdma_wire::icrc::{Endpoints, IcrcCheck, IcrcVerifier, icrc_for};
use softrdma_wire::rocev2::{
    ICRC_LEN, IPV4_HEADER_LEN, Ipv4Repr, Ipv6Repr, ROCEV2_UDP_PORT, UDP_HEADER_LEN, UdpHeader,
    UdpRepr, gid_from_ip, rocev2_flow_label, rocev2_src_port,
};

pub(crate) mod oob;

use crate::Error;
use crate::cq::{CqShared, Progress};
use crate::state::QpCounters;

/// Largest datagram the driver reads: PMTU 4096 plus every header.
const MAX_DATAGRAM: usize = 4096 + 128;

/// Largest RC window (PSNs unacknowledged) the driver allows.
const MAX_WINDOW: u32 = 1024;

/// Datagrams handed to the kernel per `sendmmsg` / taken per `recvmmsg`.
const SEND_BATCH: usize = 64;
const RECV_BATCH: usize = 32;

/// How long the receive thread blocks when no timer is armed (it checks for shutdown).
const IDLE_WAIT: Duration = Duration::from_millis(50);

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
}

/// How IPv4 datagrams leave.
///
/// The ICRC covers the IPv4 Identification, which a UDP socket neither lets us choose nor
/// tells us (Linux draws it from a hashed per-destination counter). A peer that verifies
/// ICRCs exactly — Linux rxe, RoCE NICs — needs the IP header we computed it over, so we
/// send through a raw socket (`IPPROTO_RAW`, needs `CAP_NET_RAW`) with our own header: our
/// Identification, DF, TTL 64 and the per-QP UDP source port of rxe. Without the capability,
/// datagrams go through the UDP socket: softrdma peers accept them (their check recovers the
/// Identification), strict peers drop them. IPv6 has no Identification and always uses UDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RawTx {
    /// Raw socket if it can be opened, else UDP.
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
        RoceConfig {
            addr,
            port: ROCEV2_UDP_PORT,
            recv_buffer: 4 << 20,
            raw_tx: RawTx::Auto,
        }
    }
}

/// Datagrams the driver dropped, by reason, and what it moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// Sends the socket refused (e.g. buffer full); the transport retransmits.
    pub tx_errors: u64,
}

#[derive(Default)]
struct AtomicCounters {
    tx_packets: AtomicU64,
    rx_packets: AtomicU64,
    bad_icrc: AtomicU64,
    malformed: AtomicU64,
    unknown_qp: AtomicU64,
    wrong_source: AtomicU64,
    tx_errors: AtomicU64,
}

pub(crate) struct RoceShared {
    socket: UdpSocket,
    /// IPv4 raw sender (see [`RawTx`]).
    pub(crate) raw: Option<socket2::Socket>,
    next_ip_id: std::sync::atomic::AtomicU16,
    /// Held while datagrams are read and processed (receive thread or a polling caller).
    rx_lock: Mutex<()>,
    pub(crate) local: SocketAddr,
    qps: RwLock<HashMap<u32, Arc<RoceQpShared>>>,
    ahs: RwLock<Vec<SocketAddr>>,
    next_qpn: AtomicU32,
    counters: AtomicCounters,
    /// The receive buffer the kernel granted (octets of kernel memory).
    pub(crate) rcvbuf: usize,
    alive: AtomicBool,
}

struct Engine {
    qp: IbQp,
    /// Peer address of a connected QP.
    remote: Option<SocketAddr>,

    scratch: Vec<u8>,
    /// Datagrams of one flush, back to back, and where each starts and ends and goes.
    dgram: Vec<u8>,
    batch: Vec<(usize, usize, SocketAddr, bool)>,
    wcs: Vec<WorkCompletion>,
}

pub(crate) struct RoceQpShared {
    qpn: u32,
    engine: Mutex<Engine>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
}

impl RoceShared {
    pub(crate) fn open(cfg: &RoceConfig) -> Result<Arc<RoceShared>, Error> {
        if cfg.addr.is_unspecified() {
            return Err(Error::InvalidArgument(
                "RoCE needs a specific local address (it is covered by the ICRC)",
            ));
        }
        let domain = socket2::Domain::for_address(SocketAddr::new(cfg.addr, cfg.port));
        let sock =
            socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        let _ = sock.set_recv_buffer_size(cfg.recv_buffer);
        if sock.recv_buffer_size().unwrap_or(0) < cfg.recv_buffer {
            // Above net.core.rmem_max: SO_RCVBUFFORCE works with CAP_NET_ADMIN; without it
            // the capped size stands (UC/UD bursts larger than it are lost at the socket).
            let _ = nix::sys::socket::setsockopt(
                &sock,
                nix::sys::socket::sockopt::RcvBufForce,
                &cfg.recv_buffer,
            );
        }
        let _ = sock.set_send_buffer_size(cfg.recv_buffer);
        sock.bind(&SocketAddr::new(cfg.addr, cfg.port).into())?;
        let rcvbuf = sock.recv_buffer_size().unwrap_or(208 * 1024);
        let socket: UdpSocket = sock.into();
        let local = socket.local_addr()?;
        let raw = match (cfg.raw_tx, cfg.addr) {
            (RawTx::Off, _) | (_, IpAddr::V6(_)) => None,
            (mode, IpAddr::V4(_)) => {
                let r = socket2::Socket::new(
                    socket2::Domain::IPV4,
                    socket2::Type::RAW,
                    Some(socket2::Protocol::from(255)), // IPPROTO_RAW: send only, header ours
                );
                match (r, mode) {
                    (Ok(r), _) => {
                        let _ = r.set_send_buffer_size(cfg.recv_buffer);
                        Some(r)
                    }
                    (Err(e), RawTx::Required) => return Err(e.into()),
                    (Err(_), _) => None,
                }
            }
        };
        let shared = Arc::new(RoceShared {
            socket,
            raw,
            next_ip_id: std::sync::atomic::AtomicU16::new(1),
            rx_lock: Mutex::new(()),
            local,
            qps: RwLock::new(HashMap::new()),
            ahs: RwLock::new(Vec::new()),
            // QPN 0 and 1 are special (SMI/GSI); rxe starts at 0x11.
            next_qpn: AtomicU32::new(0x11),
            counters: AtomicCounters::default(),
            rcvbuf,
            alive: AtomicBool::new(true),
        });
        let weak = Arc::downgrade(&shared);
        let sock = shared.socket.try_clone()?;
        std::thread::Builder::new()
            .name("softrdma-roce-rx".into())
            .spawn(move || rx_loop(weak, sock))?;
        Ok(shared)
    }

    /// Sends everything the QP has to send, then moves its completions to the CQs.
    fn flush(&self, q: &RoceQpShared, e: &mut Engine, now: Instant) {
        let mut out = std::mem::take(&mut e.scratch);
        let mut dgram = std::mem::take(&mut e.dgram);
        let mut batch = std::mem::take(&mut e.batch);
        dgram.clear();
        batch.clear();
        while let Some(tx) = e.qp.poll_transmit(now, &mut out) {
            let dest = match tx.dest {
                Some(ud) => self.ahs.read().get(ud.ah as usize).copied(),
                None => e.remote,
            };
            let Some(dest) = dest else {
                self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let payload = &out[..tx.len];
            let start = dgram.len();
            let raw = match (&self.raw, self.local.ip(), dest) {
                (Some(_), IpAddr::V4(src), SocketAddr::V4(dst)) => {
                    let src_port = match tx.dest {
                        Some(ud) => rocev2_src_port(rocev2_flow_label(q.qpn, ud.remote_qpn)),
                        None => rocev2_src_port(rocev2_flow_label(q.qpn, e.qp.dest_qp())),
                    };
                    let mut id = self.next_ip_id.fetch_add(1, Ordering::Relaxed);
                    if id == 0 {
                        // The kernel would pick its own Identification for 0 (raw(7)).
                        id = self.next_ip_id.fetch_add(1, Ordering::Relaxed);
                    }
                    let src = SocketAddrV4::new(src, src_port);
                    let ep = Endpoints::from_socket_addrs(src.into(), dest);
                    ipv4_udp_frame(&mut dgram, src, dst, id, payload);
                    dgram.extend_from_slice(&icrc_for(&ep, id, payload).to_le_bytes());
                    true
                }
                _ => {
                    // Through the UDP socket: the kernel's Identification is unknown; ID 0 is
                    // what a peer that recovers it needs least work for.
                    let ep = Endpoints::from_socket_addrs(self.local, dest);
                    dgram.extend_from_slice(payload);
                    dgram.extend_from_slice(&icrc_for(&ep, 0, payload).to_le_bytes());
                    false
                }
            };
            batch.push((start, dgram.len(), dest, raw));
            if batch.len() == SEND_BATCH {
                self.send_batch(&dgram, &batch);
                dgram.clear();
                batch.clear();
            }
        }
        self.send_batch(&dgram, &batch);
        e.scratch = out;
        e.dgram = dgram;
        e.batch = batch;
        while let Some(wc) = e.qp.poll_send_completion() {
            e.wcs.push(wc);
        }
        q.send_cq.push(&mut e.wcs);
        while let Some(wc) = e.qp.poll_recv_completion() {
            e.wcs.push(wc);
        }
        q.recv_cq.push(&mut e.wcs);
    }

    /// Sends datagrams `buf[start..end]` to their destinations with as few `sendmmsg` calls
    /// as the socket changes allow. A datagram the kernel refuses (a full buffer) is counted
    /// and left to the transport's retransmission.
    fn send_batch(&self, buf: &[u8], batch: &[(usize, usize, SocketAddr, bool)]) {
        let mut rest = batch;
        while let Some(&(_, _, _, raw)) = rest.first() {
            let n = rest.iter().take_while(|b| b.3 == raw).count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let fd = match (raw, &self.raw) {
                (true, Some(r)) => r.as_raw_fd(),
                _ => self.socket.as_raw_fd(),
            };
            let slices: Vec<[IoSlice<'_>; 1]> = group
                .iter()
                .map(|&(s, e, _, _)| [IoSlice::new(&buf[s..e])])
                .collect();
            let addrs: Vec<Option<SockaddrStorage>> = group
                .iter()
                .map(|&(_, _, d, raw)| {
                    // A raw IPv4 socket takes the destination address with port 0.
                    let d = if raw { SocketAddr::new(d.ip(), 0) } else { d };
                    Some(SockaddrStorage::from(d))
                })
                .collect();
            let mut done = 0;
            while done < group.len() {
                let mut hdrs =
                    MultiHeaders::<SockaddrStorage>::preallocate(group.len() - done, None);
                let sent = sendmmsg(
                    fd,
                    &mut hdrs,
                    slices[done..].iter(),
                    &addrs[done..],
                    [],
                    MsgFlags::empty(),
                )
                .map(|r| r.count());
                match sent {
                    Ok(k) if k > 0 => {
                        self.counters
                            .tx_packets
                            .fetch_add(k as u64, Ordering::Relaxed);
                        done += k;
                    }
                    _ => {
                        // The first unsent datagram failed: count it and go on with the rest.
                        self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                        done += 1;
                    }
                }
            }
        }
    }
}

/// IPv4 (20 octets, DF, TTL 64, as rxe) | UDP (checksum 0, as rxe) | payload, appended to
/// `out`; the ICRC follows.
fn ipv4_udp_frame(
    out: &mut Vec<u8>,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    id: u16,
    payload: &[u8],
) {
    let udp_len = UDP_HEADER_LEN + payload.len() + ICRC_LEN;
    let ip = Ipv4Repr {
        total_len: (IPV4_HEADER_LEN + udp_len) as u16,
        ident: id,
        ..Ipv4Repr::new_udp(*src.ip(), *dst.ip())
    };
    let udp = UdpRepr {
        length: udp_len as u16,
        ..UdpRepr::rocev2(src.port())
    };
    let at = out.len();
    out.resize(at + IPV4_HEADER_LEN + UDP_HEADER_LEN, 0);
    let n = ip
        .emit(&mut out[at..])
        .expect("a 20-octet IPv4 header fits");
    udp.emit(&mut out[at + n..]).expect("a UDP header fits");
    UdpHeader::new_unchecked(&mut out[at + n..]).set_dst_port(dst.port());
    out.extend_from_slice(payload);
}

/// The 40-octet GRH area of a UD receive: rxe puts an IPv4 header in its last 20 octets, an
/// IPv6 header fills it; `len` is the UDP payload's length.
fn grh_image(src: SocketAddr, dst: SocketAddr, len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = UDP_HEADER_LEN + len;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = Ipv4Repr {
                total_len: (IPV4_HEADER_LEN + udp_len) as u16,
                ..Ipv4Repr::new_udp(s, d)
            };
            ip.emit(&mut g[20..]).expect("a 20-octet IPv4 header fits");
        }
        (s, d) => {
            let ip = Ipv6Repr {
                payload_len: udp_len as u16,
                ..Ipv6Repr::new_udp(ipv6_of(s), ipv6_of(d))
            };
            ip.emit(&mut g).expect("a 40-octet IPv6 header fits");
        }
    }
    g
}

fn ipv6_of(a: IpAddr) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(gid_from_ip(a))
}

/// Receive buffers of one thread (the receive thread's own, or a polling caller's).
struct RxBufs {
    bufs: Vec<Vec<u8>>,
    hdrs: MultiHeaders<SockaddrStorage>,
    got: Vec<(usize, Option<SocketAddr>)>,
    touched: Vec<Arc<RoceQpShared>>,
    verifier: IcrcVerifier,
}

impl RxBufs {
    fn new() -> RxBufs {
        RxBufs {
            bufs: (0..RECV_BATCH).map(|_| vec![0u8; MAX_DATAGRAM]).collect(),
            hdrs: MultiHeaders::preallocate(RECV_BATCH, None),
            got: Vec::with_capacity(RECV_BATCH),
            touched: Vec::new(),
            verifier: IcrcVerifier::default(),
        }
    }
}

thread_local! {
    /// Buffers of threads that drive a RoCE context from `Cq::poll`.
    static CALLER_RX: std::cell::RefCell<Option<RxBufs>> = const { std::cell::RefCell::new(None) };
}

impl RoceShared {
    /// Reads what is queued on the socket (without blocking), up to a few batches, and
    /// processes it. The caller holds `rx_lock`: datagrams are handled in arrival order.
    fn drain_socket(&self, rx: &mut RxBufs) -> usize {
        let fd = self.socket.as_raw_fd();
        let mut total = 0;
        for _ in 0..4 {
            rx.got.clear();
            {
                let mut iovs: Vec<[IoSliceMut<'_>; 1]> = rx
                    .bufs
                    .iter_mut()
                    .map(|b| [IoSliceMut::new(&mut b[..])])
                    .collect();
                if let Ok(res) = recvmmsg(
                    fd,
                    &mut rx.hdrs,
                    iovs.iter_mut(),
                    MsgFlags::MSG_DONTWAIT,
                    None,
                ) {
                    rx.got
                        .extend(res.map(|r| (r.bytes, r.address.and_then(|a| socket_addr(&a)))));
                }
            }
            if rx.got.is_empty() {
                break;
            }
            let now = Instant::now();
            for i in 0..rx.got.len() {
                let (n, peer) = rx.got[i];
                let Some(peer) = peer else { continue };
                if let Some(q) = self.receive(&rx.bufs[i][..n], peer, now, &mut rx.verifier)
                    && !rx.touched.iter().any(|t| Arc::ptr_eq(t, &q))
                {
                    rx.touched.push(q);
                }
            }
            for q in rx.touched.drain(..) {
                let mut e = q.engine.lock();
                self.flush(&q, &mut e, now);
            }
            total += rx.got.len();
            if rx.got.len() < RECV_BATCH {
                break;
            }
        }
        total
    }
}

impl Progress for RoceShared {
    fn block(
        &self,
        _cq: &Arc<CqShared>,
        _until: Option<Instant>,
        _done: &dyn Fn() -> bool,
    ) -> bool {
        false
    }

    fn wake(&self) {}

    fn progress(&self, _cq: &CqShared) {
        // The receive thread is handling datagrams right now: nothing to add.
        let Some(_g) = self.rx_lock.try_lock() else {
            return;
        };
        CALLER_RX.with(|c| {
            let mut c = c.borrow_mut();
            let rx = c.get_or_insert_with(RxBufs::new);
            self.drain_socket(rx);
        });
    }
}

fn rx_loop(weak: Weak<RoceShared>, sock: UdpSocket) {
    let mut rx = RxBufs::new();
    let mut wait = IDLE_WAIT;
    loop {
        // Wait for readiness without holding the receive lock, so a thread polling a CQ can
        // take the datagram first (no hand-off); then read under the lock.
        let ms = wait.as_millis().clamp(1, 1000) as u16;
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut fds, PollTimeout::from(ms)).unwrap_or(0);
        let Some(d) = weak.upgrade() else { return };
        if !d.alive.load(Ordering::Acquire) {
            return;
        }
        if ready > 0 {
            let _g = d.rx_lock.lock();
            d.drain_socket(&mut rx);
        }
        wait = d.run_timers(Instant::now());
    }
}

fn socket_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        Some(SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
    } else {
        a.as_sockaddr_in6()
            .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
    }
}

impl RoceShared {
    /// Checks and hands one datagram to its QP; returns the QP, to be flushed once the
    /// whole batch is in (its ACKs coalesce).
    fn receive(
        &self,
        dgram: &[u8],
        peer: SocketAddr,
        now: Instant,
        v: &mut IcrcVerifier,
    ) -> Option<Arc<RoceQpShared>> {
        self.counters.rx_packets.fetch_add(1, Ordering::Relaxed);
        let ep = Endpoints::from_socket_addrs(peer, self.local);
        if dgram.len() < 16 || matches!(v.verify(&ep, dgram), IcrcCheck::Invalid) {
            self.counters.bad_icrc.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let Ok(pkt) = PacketRepr::parse(&dgram[..dgram.len() - 4]) else {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let Some(q) = self.qps.read().get(&pkt.bth.dest_qp).cloned() else {
            self.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let mut e = q.engine.lock();
        if e.qp.qp_type() != QpType::Ud && e.remote.is_some_and(|r| r.ip() != peer.ip()) {
            self.counters.wrong_source.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let grh = grh_image(peer, self.local, dgram.len());
        e.qp.handle_packet(&pkt, &grh, now);
        drop(e);
        Some(q)
    }

    /// Fires due timers; returns how long until the next one.
    fn run_timers(&self, now: Instant) -> Duration {
        let qps: Vec<_> = self.qps.read().values().cloned().collect();
        let mut next = now + IDLE_WAIT;
        for q in qps {
            let mut e = q.engine.lock();
            if let Some(t) = e.qp.poll_timeout() {
                if t <= now {
                    e.qp.handle_timeout(now);
                    self.flush(&q, &mut e, now);
                }
                if let Some(t) = e.qp.poll_timeout() {
                    next = next.min(t);
                }
            }
        }
        next.saturating_duration_since(now)
    }
}

impl Drop for RoceShared {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
    }
}

impl RoceShared {
    /// The driver's counters.
    pub(crate) fn counters(&self) -> RoceCounters {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RoceCounters {
            tx_packets: l(&c.tx_packets),
            rx_packets: l(&c.rx_packets),
            bad_icrc: l(&c.bad_icrc),
            malformed: l(&c.malformed),
            unknown_qp: l(&c.unknown_qp),
            wrong_source: l(&c.wrong_source),
            tx_errors: l(&c.tx_errors),
        }
    }

    /// Creates an InfiniBand QP in the Reset state; polling either CQ may drive this
    /// driver's receive path.
    pub(crate) fn create_qp(
        self: &Arc<Self>,
        qp_type: QpType,
        pd: PdId,
        cap: QpCaps,
        keys: Arc<KeyTable>,
        send_cq: &Arc<CqShared>,
        recv_cq: &Arc<CqShared>,
    ) -> Arc<RoceQpShared> {
        let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xFF_FFFF;
        let qp = IbQp::new(qpn, qp_type, pd, cap, keys);
        let shared = Arc::new(RoceQpShared {
            qpn,
            engine: Mutex::new(Engine {
                qp,
                remote: None,
                scratch: Vec::new(),
                dgram: Vec::with_capacity(SEND_BATCH * MAX_DATAGRAM),
                batch: Vec::with_capacity(SEND_BATCH),
                wcs: Vec::new(),
            }),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
        });
        self.qps.write().insert(qpn, shared.clone());
        for cq in [send_cq, recv_cq] {
            cq.attach(Arc::downgrade(self) as Weak<dyn Progress>);
        }
        shared
    }

    /// Removes a QP (`ibv_destroy_qp`).
    pub(crate) fn destroy_qp(&self, qpn: u32) {
        self.qps.write().remove(&qpn);
    }

    /// An address handle for UD sends to `addr` (`ibv_create_ah`).
    pub(crate) fn create_ah(&self, addr: SocketAddr) -> Ah {
        let mut ahs = self.ahs.write();
        let id = ahs.len() as u32;
        ahs.push(addr);
        Ah { id, addr }
    }

    /// Sets the path of a connected QP.
    pub(crate) fn set_remote(&self, q: &RoceQpShared, addr: SocketAddr) {
        q.engine.lock().remote = Some(addr);
    }

    /// `ibv_modify_qp`. For RC/UC the path must be set before RTR.
    pub(crate) fn modify(&self, q: &RoceQpShared, attr: &QpAttr) -> Result<(), Error> {
        let mut e = q.engine.lock();
        if attr.state == Some(IbQpState::Rtr) && e.qp.qp_type() != QpType::Ud && e.remote.is_none()
        {
            return Err(Error::InvalidArgument(
                "RTR needs the path (Qp::set_remote)",
            ));
        }
        e.qp.modify(attr)?;
        if let Some(m) = attr.pmtu {
            // Go-back-N resends whatever overflowed the peer's socket buffer: keep a window
            // it can hold (a datagram costs about 2.25 times its size in kernel memory). The
            // peer's buffer is not known; ours is the estimate.
            let w = (self.rcvbuf * 4 / 9 / m as usize).clamp(16, 1 << 20) as u32;
            e.qp.set_window(w.min(MAX_WINDOW));
        }
        // Error flushes: deliver those completions now.
        self.flush(q, &mut e, Instant::now());
        Ok(())
    }

    /// Posts send requests and sends what may leave now (one lock, one flush); stops at the
    /// first refused one and returns its index.
    pub(crate) fn post_send(
        &self,
        q: &RoceQpShared,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        let mut e = q.engine.lock();
        let mut res = Ok(());
        for (i, wr) in wrs.into_iter().enumerate() {
            if let Err(err) = e.qp.post_send(wr) {
                res = Err((i, err.into()));
                break;
            }
        }
        self.flush(q, &mut e, Instant::now());
        res
    }

    /// Posts a receive request (in the Error state it completes flushed at once).
    pub(crate) fn post_recv(&self, q: &RoceQpShared, wr: RecvWr) -> Result<(), Error> {
        let mut e = q.engine.lock();
        e.qp.post_recv(wr)?;
        self.flush(q, &mut e, Instant::now());
        Ok(())
    }
}

impl RoceQpShared {
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    pub(crate) fn state(&self) -> IbQpState {
        self.engine.lock().qp.state()
    }

    pub(crate) fn qp_type(&self) -> QpType {
        self.engine.lock().qp.qp_type()
    }

    pub(crate) fn sq_outstanding(&self) -> usize {
        self.engine.lock().qp.sq_outstanding()
    }

    pub(crate) fn counters(&self) -> QpCounters {
        let e = self.engine.lock();
        QpCounters::from_ib(
            e.qp.counters(),
            e.qp.requester_counters(),
            e.qp.responder_counters(),
        )
    }
}

/// An address handle (`ibv_ah`) for UD sends: put [`Ah::id`] in `UdDest::ah`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ah {
    id: u32,
    addr: SocketAddr,
}

impl Ah {
    /// The handle's index (`UdDest::ah`).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Where it points.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The IPv4 address of an IPv4-mapped GID, or the IPv6 address of any other.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    softrdma_wire::rocev2::gid_to_ip(gid)
}
