//! The RoCEv2 driver: InfiniBand QPs ([`softrdma_ib::IbQp`]) over one UDP socket bound to
//! port 4791 of a local address (IBA Annex A17; ib-transport.md §13.6).
//!
//! A thin driver over the sans-IO [`RoceEndpoint`] of `softrdma_ib`, which does everything
//! about the datagrams' contents: ICRC check (the socket hides the IP header, so the IPv4
//! Identification is recovered from the CRC), parsing, demultiplexing by BTH DestQP, the
//! source check of connected QPs, the GRH image of UD receives, and the IPv4/UDP/ICRC
//! encapsulation; it hands out QPNs and address handle ids and counts drops by reason. This
//! driver only moves datagrams and time: sockets, threads, the clock, the QPs' locks.
//!
//! Sending happens in the caller's thread: `post_send` runs the requester and writes the
//! datagrams at once, so a message leaves without a thread hand-off. One thread at a time
//! sends a QP's datagrams, without its engine lock during the system call; a post that
//! comes meanwhile leaves its datagrams to that thread, which looks again before it
//! returns (posts never wait for another thread's `sendmmsg`, and theirs go in its next
//! batch). One receive thread per
//! context — or a thread polling a CQ, which drains the socket itself — reads datagrams,
//! gives them to the endpoint and the accepted ones to their QP's engine, sends what the
//! engines answer (ACKs, READ responses) and runs the retransmission timers. Bad datagrams
//! are dropped and counted, never passed on.
//!
//! Addressing: GIDs are IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) or IPv6 addresses; a
//! connected QP's path is the peer's IP address (`Qp::set_remote`), a UD send's is an
//! address handle (`Pd::create_ah`). IPv4 datagrams leave through a raw socket when the
//! process may open one ([`RawTx`]), with the per-QP UDP source port rxe uses (flow-label
//! hash of the QP pair); otherwise through the UDP socket, from its port.

use std::cell::RefCell;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6, SockaddrLike, sendmmsg};
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use smallvec::SmallVec;
use softrdma_ib::{
    EndpointError, IbQp, Incoming, QpAttr, QpCaps, QpState as IbQpState, QpType, RoceEndpoint,
    SocketKind, Transmit,
};
use softrdma_memory::{KeyTable, PdId};
use softrdma_verbs_types::{RecvWr, SendWr, SharedRecvQueue, WorkCompletion, WrOpcode};
use softrdma_wire::icrc::{IcrcVerifier, Ipv4IdSyndromes};
use softrdma_wire::rocev2::ROCEV2_UDP_PORT;

pub(crate) mod cm;
// The one module of this crate with `unsafe`: the socket layer's receive headers.
#[allow(unsafe_code)]
mod mmsg;

use crate::Error;
use crate::cq::{CqShared, Progress, Pushed};
use crate::event::EventQueue;
use crate::leader::{Leader, Turn, Waiter, WakePipe};
use crate::state::QpCounters;
use crate::tap::{Direction, TapSlot, Tapped};

/// Largest datagram the driver reads: PMTU 4096 plus every header.
const MAX_DATAGRAM: usize = 4096 + 128;

/// Largest RC window (PSNs unacknowledged) the driver allows.
const MAX_WINDOW: u32 = 1024;

/// Datagrams handed to the kernel per `sendmmsg` / taken per `recvmmsg`.
const SEND_BATCH: usize = 64;
/// Batches a QP sends from the receive path before the socket is read again.
const BACKLOG_BATCHES: usize = 4;
const RECV_BATCH: usize = 32;
/// Datagrams of one receive batch routed without a heap allocation (a GRO batch may hold
/// more; those spill).
const ROUTED_INLINE: usize = 16;
/// With GRO a receive holds a run of packets: fewer, larger buffers.
const GRO_BATCH: usize = 8;
const GRO_BUFFER: usize = 65_536;
/// GSO: packets per super-datagram at most (`UDP_MAX_SEGMENTS`) and its size at most.
const GSO_SEGMENTS: usize = 64;
const GSO_OCTETS: usize = 65_000;

/// How long a closing context keeps its unanswered DREQs going (so a peer learns of the
/// close though the first DREQ was lost), and how often it repeats them meanwhile.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_REPEAT: Duration = Duration::from_millis(200);

/// How long the receive thread blocks when no timer is armed (it checks for shutdown).
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// How often polling turns walk the timers at most (see [`RoceShared::turn`]).
const POLL_TIMERS: Duration = Duration::from_millis(1);

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

/// What the driver itself counts: the socket's side. Everything about the datagrams' contents
/// is the endpoint's ([`EndpointCounters`](softrdma_ib::EndpointCounters)).
#[derive(Default)]
struct SocketCounters {
    /// Datagrams the kernel took.
    tx_packets: AtomicU64,
    /// Datagrams the kernel refused.
    tx_refused: AtomicU64,
    /// Packets for QP1 that were no MAD.
    pub(crate) qp1_dropped: AtomicU64,
    /// GSO super-datagrams sent, GRO runs received.
    gso_sends: AtomicU64,
    gro_receives: AtomicU64,
    tx_handed_over: AtomicU64,
    tx_deferred: AtomicU64,
}

pub(crate) struct RoceShared {
    socket: UdpSocket,
    /// IPv4 raw sender (see [`RawTx`]).
    pub(crate) raw: Option<socket2::Socket>,
    /// Held while datagrams are read and processed (receive thread or a polling caller).
    rx_lock: Mutex<()>,
    /// Who waits on the socket (see [`crate::leader`]); receive buffers are per thread.
    /// The slot holds when a polling turn next walks the timers (see [`RoceShared::turn`]).
    pub(crate) leader: Leader<Instant>,
    /// Interrupts that wait.
    wake_pipe: WakePipe,
    pub(crate) local: SocketAddr,
    /// ICRC, demultiplexing, source check, GRH image and encapsulation; QPNs, paths and
    /// address handles. Read-locked per receive batch and per transmit batch; write-locked
    /// to (un)register a QP, set a path, create or destroy an address handle.
    ///
    /// Lock order: a QP's engine, then the endpoint, then `qps`. Nothing locks an engine
    /// while holding the endpoint (a writer queued on the fair `RwLock` would otherwise
    /// deadlock a receive batch against a flush).
    endpoint: RwLock<RoceEndpoint>,
    /// The QPs registered with the endpoint, by QPN, for their locks. Changed only under the
    /// endpoint's write lock, so under its read lock the two agree.
    qps: RwLock<rustc_hash::FxHashMap<u32, Arc<RoceQpShared>>>,
    counters: SocketCounters,
    /// The receive buffer the kernel granted (octets of kernel memory).
    pub(crate) rcvbuf: usize,
    alive: AtomicBool,
    /// The receive thread, joined when the context closes (so its socket is closed when
    /// the context's drop returns, and the port can be bound again).
    rx_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// QP1 and the connection manager ([`cm`]).
    gsi: Mutex<cm::Gsi>,
    /// Told when the CM reported something (a closing context waits for its DREPs).
    gsi_changed: Condvar,
    /// The context's asynchronous events.
    events: Arc<EventQueue>,
    /// Some QP holds back an ACK ([`RoceQpShared::ack_held`]).
    acks_held: AtomicBool,
    /// The UDP socket segments our runs (`UDP_SEGMENT`) and coalesces what it receives
    /// (`UDP_GRO`).
    gso: bool,
    gro: bool,
    /// The kernel writes IPv4 Identification 0 on our UDP datagrams and numbers a GSO
    /// run's segments from it (`IP_PMTUDISC_DO` is set; see [`RawTx`]).
    ipv4_id_known: bool,
    /// Told what the socket sends and receives (set once).
    pub(crate) tap: TapSlot,
    /// QPs whose posted requests wait for the slot's holder to send them
    /// ([`RoceShared::defer`]); each at most once ([`RoceQpShared::tx_queued`]).
    tx_ready: Mutex<Vec<Arc<RoceQpShared>>>,
    /// `tx_ready` may hold something: every turn looks, most find nothing.
    tx_ready_any: AtomicBool,
}

struct Engine {
    qp: IbQp,
    wcs: Vec<WorkCompletion>,
    /// Send requests the engine accepted.
    posted: u64,
}

/// A QP's engine, locked.
type EngineGuard<'a> = MutexGuard<'a, Engine>;

/// The sender's role of a QP: datagrams of one transmit batch, back to back, and where
/// each lies and goes.
#[derive(Default)]
struct TxBuf {
    dgram: Vec<u8>,
    batch: Vec<Transmit>,
}

thread_local! {
    /// The datagrams a thread builds and sends for a QP ([`RoceShared::transmit`]): one per
    /// sending thread, not one per QP (a batch is 270 KB; a thousand idle QPs held one each).
    static TX_SCRATCH: std::cell::RefCell<TxBuf> = std::cell::RefCell::new(TxBuf {
        dgram: Vec::with_capacity(SEND_BATCH * MAX_DATAGRAM),
        batch: Vec::with_capacity(SEND_BATCH),
    });
}

/// `f` with this thread's [`TX_SCRATCH`]; a fresh buffer while it is in use further up the
/// stack (a send for another QP).
fn with_tx_scratch<R>(f: impl FnOnce(&mut TxBuf) -> R) -> R {
    TX_SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut tx) => f(&mut tx),
        Err(_) => f(&mut TxBuf::default()),
    })
}

/// [`RoceQpShared::tx_pending`]: a flush found the sender busy.
const TX_PENDING: u8 = 1;
/// ... and it was to send held ACKs too ([`Hold::Nothing`]).
const TX_PENDING_ALL: u8 = 2;

/// A post of at least this many octets to a QP still sending, made while another thread
/// waits on the socket, is sent by that thread ([`RoceShared::post_send`]).
const DEFER_OCTETS: u64 = 64 * 1024;

pub(crate) struct RoceQpShared {
    qpn: u32,
    engine: Mutex<Engine>,
    /// Held by the thread that sends this QP's datagrams. It lets the engine go for each
    /// system call: a thread that posts meanwhile queues its requests and leaves them to
    /// that sender (lock order: `tx`, then `engine`).
    tx: Mutex<()>,
    /// Set (under the engine lock) by a flush that left its datagrams to the sender; the
    /// sender looks again after its system call ([`TX_PENDING`], [`TX_PENDING_ALL`]).
    tx_pending: AtomicU8,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    /// Accepted, REP sent, RTU not seen: the first packet from the peer stands for it
    /// ("communication established", IBA 12.9.6), as when the RTU is lost.
    pub(crate) awaiting_rtu: AtomicBool,
    /// Its engine holds back a positive ACK for the reply the caller is about to post
    /// ([`RoceShared::flush`] with [`Hold::Ack`]).
    ack_held: AtomicBool,
    /// On [`RoceShared::tx_ready`].
    tx_queued: AtomicBool,
}

/// Moves the QP's completions to its CQs. A queue that overran puts the QP in Error
/// (IBA 11.4.2.1): its outstanding requests are flushed, into the other queue if that one
/// is healthy.
fn deliver(q: &RoceQpShared, e: &mut Engine) {
    let Engine { qp, wcs, .. } = e;
    if hand_out(q, qp, wcs) && !matches!(qp.state(), IbQpState::Error | IbQpState::Reset) {
        let _ = qp.modify(&QpAttr::state(IbQpState::Error));
        let _ = hand_out(q, qp, wcs);
    }
}

/// The QP's completions into its CQs; `true` when one of them is overrun.
fn hand_out(q: &RoceQpShared, qp: &mut IbQp, wcs: &mut Vec<WorkCompletion>) -> bool {
    while let Some(wc) = qp.poll_send_completion() {
        wcs.push(wc);
    }
    let a = q.send_cq.push(q.qpn, wcs);
    while let Some(wc) = qp.poll_recv_completion() {
        wcs.push(wc);
    }
    let b = q.recv_cq.push(q.qpn, wcs);
    a == Pushed::Overrun || b == Pushed::Overrun
}

/// Whether a flush may hold back a lone positive ACK.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Send everything.
    Nothing,
    /// The flushing thread is a caller who gets a completion or a Write now and will likely
    /// post the reply: the ACK waits for that reply's batch (and goes after it), so the
    /// peer wakes once, for the reply. Sent no later than the next call into this context,
    /// the next turn of its receive thread (a datagram, a timer, at most [`IDLE_WAIT`]), a
    /// modify, or the QP's destruction.
    Ack,
}

impl RoceShared {
    pub(crate) fn open(
        cfg: &RoceConfig,
        events: Arc<EventQueue>,
    ) -> Result<Arc<RoceShared>, Error> {
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
        // Offloads where the kernel has them (Linux 4.18 for GSO, 5.0 for GRO); a value of 0
        // leaves the socket's own segmentation off, each send names its size.
        let (gso, gro) = if cfg.gso {
            use nix::sys::socket::{setsockopt, sockopt};
            (
                setsockopt(&socket, sockopt::UdpGsoSegment, &0).is_ok(),
                setsockopt(&socket, sockopt::UdpGroSegment, &true).is_ok(),
            )
        } else {
            (false, false)
        };
        let local = socket.local_addr()?;
        // Strict path MTU discovery: DF set and Identification 0 on every datagram (and
        // 0, 1, 2, ... on a GSO run's segments), the IDs our ICRCs are computed for
        // ([`RawTx`]). Packets are never larger than the path MTU the QP was given.
        let ipv4_id_known = cfg.addr.is_ipv4()
            && rustix::net::sockopt::set_ip_mtu_discover(
                &socket,
                rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
            )
            .is_ok();
        let raw = match (cfg.raw_tx, cfg.addr) {
            (RawTx::Off, _) | (_, IpAddr::V6(_)) => None,
            (RawTx::Auto, _) if ipv4_id_known => None,
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
        let ipv4 = match raw {
            Some(_) => SocketKind::RawIpv4,
            None => SocketKind::Udp,
        };
        let mut endpoint = RoceEndpoint::new(local, ipv4);
        endpoint.set_next_qpn(cm::random_u32());
        // QP1, the GSI: its MADs go to the connection manager.
        endpoint
            .insert_qp(softrdma_ib::cm::GSI_QPN, QpType::Ud)
            .map_err(out_of_resources)?;
        let shared = Arc::new(RoceShared {
            gsi: Mutex::new(cm::Gsi::new(local.ip(), cfg)),
            gsi_changed: Condvar::new(),
            rx_thread: Mutex::new(None),
            events,
            socket,
            raw,
            rx_lock: Mutex::new(()),
            leader: Leader::new(Instant::now()),
            wake_pipe: WakePipe::new()?,
            local,
            endpoint: RwLock::new(endpoint),
            qps: RwLock::new(Default::default()),
            counters: SocketCounters::default(),
            rcvbuf,
            alive: AtomicBool::new(true),
            acks_held: AtomicBool::new(false),
            gso,
            gro,
            ipv4_id_known,
            tap: TapSlot::default(),
            tx_ready: Mutex::new(Vec::new()),
            tx_ready_any: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&shared);
        let h = std::thread::Builder::new()
            .name("softrdma-roce-rx".into())
            .spawn(move || rx_loop(weak))?;
        shared.leader.set_background(h.thread().clone());
        *shared.rx_thread.lock() = Some(h);
        Ok(shared)
    }

    /// Moves the QP's completions to the CQs (a waiter on another thread starts on them
    /// while the datagrams go out), then sends what the QP has to send — or, when another
    /// thread is sending this QP's datagrams right now, leaves them to it.
    fn flush(&self, q: &RoceQpShared, e: &mut EngineGuard<'_>, now: Instant, hold: Hold) {
        self.flush_some(q, e, now, hold, usize::MAX);
    }

    /// [`flush`](Self::flush) that sends before it returns, waiting for the QP's sender if
    /// there is one: what must be out before the engine changes state (a held ACK before
    /// Error drops it).
    fn flush_now(&self, q: &RoceQpShared, e: &mut EngineGuard<'_>, now: Instant) {
        deliver(q, e);
        let _sender = MutexGuard::unlocked(e, || q.tx.lock());
        with_tx_scratch(|tx| self.transmit(q, e, tx, now, Hold::Nothing, usize::MAX));
    }

    /// [`flush`](Self::flush) of at most `batches` batches of datagrams; `true` when the QP
    /// has more to send.
    fn flush_some(
        &self,
        q: &RoceQpShared,
        e: &mut EngineGuard<'_>,
        now: Instant,
        hold: Hold,
        batches: usize,
    ) -> bool {
        deliver(q, e);
        match q.tx.try_lock() {
            Some(_sender) => with_tx_scratch(|tx| self.transmit(q, e, tx, now, hold, batches)),
            None => {
                // The sender is in a system call, the engine let go: it looks again when
                // it comes back, under this lock.
                let flag = match hold {
                    Hold::Nothing => TX_PENDING_ALL,
                    Hold::Ack => TX_PENDING,
                };
                q.tx_pending.fetch_max(flag, Ordering::Relaxed);
                self.counters.tx_handed_over.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The sender's part of a flush (the caller holds `q.tx`; `tx` is scratch): batches of
    /// datagrams built under the engine lock and sent without it, until the engine has
    /// nothing more (or `batches` are out: then `true`).
    fn transmit(
        &self,
        q: &RoceQpShared,
        e: &mut EngineGuard<'_>,
        tx: &mut TxBuf,
        now: Instant,
        mut hold: Hold,
        batches: usize,
    ) -> bool {
        let mut more = false;
        let mut n = 0;
        loop {
            if q.tx_pending.swap(0, Ordering::Relaxed) == TX_PENDING_ALL {
                hold = Hold::Nothing;
            }
            tx.dgram.clear();
            tx.batch.clear();
            {
                // Not held across the system call: it would keep writers waiting.
                let ep = self.endpoint.read();
                while tx.batch.len() < SEND_BATCH {
                    let Some(t) =
                        ep.poll_transmit_holding(&mut e.qp, now, &mut tx.dgram, hold == Hold::Ack)
                    else {
                        break;
                    };
                    tx.batch.push(t);
                }
            }
            if tx.batch.is_empty() {
                break;
            }
            MutexGuard::unlocked(e, || self.send_batch(&mut tx.dgram, &tx.batch));
            // UD and UC sends complete as they leave.
            deliver(q, e);
            n += 1;
            let full = tx.batch.len() == SEND_BATCH;
            if full && n >= batches {
                more = true;
                break;
            }
            // A flush left its datagrams to this one while the engine was let go.
            if !full && q.tx_pending.load(Ordering::Relaxed) == 0 {
                break;
            }
        }
        let held = hold == Hold::Ack && e.qp.ack_held();
        if held != q.ack_held.load(Ordering::Relaxed) {
            q.ack_held.store(held, Ordering::Release);
            if held {
                self.acks_held.store(true, Ordering::Release);
            }
        }
        more
    }

    /// Sends the ACKs callers held back ([`Hold::Ack`]).
    fn release_acks(&self, now: Instant) {
        if !self.acks_held.load(Ordering::Acquire) || !self.acks_held.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let held: SmallVec<[Arc<RoceQpShared>; 4]> = self
            .qps
            .read()
            .values()
            .filter(|q| q.ack_held.load(Ordering::Acquire))
            .cloned()
            .collect();
        for q in held {
            let mut e = q.engine.lock();
            self.flush(&q, &mut e, now, Hold::Nothing);
        }
    }

    /// Sends the datagrams `batch` describes in `buf` with as few `sendmmsg` calls as the
    /// socket changes allow, each through the socket its [`Transmit::kind`] names. A datagram
    /// the kernel refuses (a full buffer) is counted and left to the transport's
    /// retransmission.
    fn send_batch(&self, buf: &mut [u8], batch: &[Transmit]) {
        let mut rest = batch;
        while let Some(first) = rest.first() {
            let kind = first.kind;
            let n = rest.iter().take_while(|t| t.kind == kind).count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let fd = match (kind, &self.raw) {
                (SocketKind::RawIpv4, Some(r)) => r.as_raw_fd(),
                _ => self.socket.as_raw_fd(),
            };
            if kind == SocketKind::Udp && self.gso {
                self.send_segmented(fd, buf, group);
                continue;
            }
            self.send_each(fd, buf, group);
        }
    }

    /// Sends `group` (one socket's datagrams, back to back in `buf`): runs of equal-size
    /// datagrams to one peer (the last may be shorter) as GSO super-datagrams, the rest with
    /// `sendmmsg`.
    fn send_segmented(&self, fd: std::os::fd::RawFd, buf: &mut [u8], group: &[Transmit]) {
        let mut i = 0;
        let mut singles = 0;
        while i < group.len() {
            let first = &group[i];
            let seg = first.range().len();
            let (mut j, mut end) = (i + 1, first.end);
            while j < group.len() && j - i < GSO_SEGMENTS {
                let t = &group[j];
                let l = t.range().len();
                if t.start != end
                    || t.socket_addr() != first.socket_addr()
                    || l > seg
                    || end + l - first.start > GSO_OCTETS
                {
                    break;
                }
                end = t.end;
                j += 1;
                if l < seg {
                    break;
                }
            }
            if j - i < 2 || seg > usize::from(u16::MAX) {
                singles += 1;
                i += 1;
                continue;
            }
            // What came before goes first, in order.
            if singles > 0 {
                self.send_each(fd, buf, &group[i - singles..i]);
                singles = 0;
            }
            // Segment k leaves with Identification k, which the ICRC covers: computed for 0,
            // it changes by that ID's syndrome (exact for peers that check the whole ICRC).
            if self.ipv4_id_known && first.socket_addr().is_ipv4() {
                for (k, t) in group[i..j].iter().enumerate().skip(1) {
                    let d = buf.get_mut(t.range()).unwrap_or(&mut []);
                    id_syndromes(d.len().saturating_sub(softrdma_wire::rocev2::ICRC_LEN))
                        .set(d, k as u16);
                }
            }
            let data = buf.get(first.start..end).unwrap_or(&[]);
            let sent = match self.local {
                SocketAddr::V4(_) => {
                    send_gso::<SockaddrIn>(fd, data, seg as u16, first.socket_addr())
                }
                SocketAddr::V6(_) => {
                    send_gso::<SockaddrIn6>(fd, data, seg as u16, first.socket_addr())
                }
            };
            match sent {
                Ok(_) => {
                    self.tap_sent(buf, &group[i..j]);
                    self.counters.gso_sends.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .tx_packets
                        .fetch_add((j - i) as u64, Ordering::Relaxed)
                }
                // Refused (a full buffer): lost, the transport recovers.
                Err(_) => self
                    .counters
                    .tx_refused
                    .fetch_add((j - i) as u64, Ordering::Relaxed),
            };
            i = j;
        }
        if singles > 0 {
            self.send_each(fd, buf, &group[group.len() - singles..]);
        }
    }

    /// Tells the tap, if any, that the datagrams `sent` describes in `buf` left.
    fn tap_sent(&self, buf: &[u8], sent: &[Transmit]) {
        let Some(tap) = self.tap.get() else { return };
        for t in sent {
            let d = buf.get(t.range()).unwrap_or(&[]);
            tap.tapped(match t.kind {
                SocketKind::RawIpv4 => Tapped::Ipv4 { packet: d },
                SocketKind::Udp => Tapped::Udp {
                    local: self.local,
                    peer: t.dest,
                    dir: Direction::Sent,
                    payload: d,
                },
            });
        }
    }

    /// Sends each datagram of `group` on its own, with as few `sendmmsg` calls as it takes.
    fn send_each(&self, fd: std::os::fd::RawFd, buf: &[u8], group: &[Transmit]) {
        // Filled in place: a collected array this size would be copied on return.
        let mut slices: SmallVec<[[IoSlice<'_>; 1]; SEND_BATCH]> = SmallVec::new();
        slices.extend(
            group
                .iter()
                .map(|t| [IoSlice::new(buf.get(t.range()).unwrap_or(&[]))]),
        );
        let mut done = 0;
        while done < group.len() {
            let sent = match self.local {
                SocketAddr::V4(_) => send_group::<SockaddrIn>(fd, &slices[done..], &group[done..]),
                SocketAddr::V6(_) => send_group::<SockaddrIn6>(fd, &slices[done..], &group[done..]),
            };
            match sent {
                Ok(k) if k > 0 => {
                    self.tap_sent(buf, group.get(done..done + k).unwrap_or(&[]));
                    self.counters
                        .tx_packets
                        .fetch_add(k as u64, Ordering::Relaxed);
                    done += k;
                }
                _ => {
                    // The first unsent datagram failed: count it and go on with the rest.
                    self.counters.tx_refused.fetch_add(1, Ordering::Relaxed);
                    done += 1;
                }
            }
        }
    }
}

/// A socket address of one family, as `sendmmsg` takes it.
trait FamilyAddr: SockaddrLike + Copy + Sized {
    fn of(a: SocketAddr) -> Self;
    /// This thread's `sendmmsg` headers for this family, for at least `n` messages.
    fn with_headers<R>(n: usize, f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R;
    /// This thread's header for one message with a `UDP_SEGMENT` control message.
    fn with_gso_header<R>(f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R;
}

impl FamilyAddr for SockaddrIn {
    fn with_headers<R>(n: usize, f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&HDRS_V4, n, false, f)
    }

    fn with_gso_header<R>(f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&GSO_HDR_V4, 1, true, f)
    }

    fn of(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V4(v4) => v4.into(),
            // An IPv4-mapped address on an IPv4 socket; anything else cannot be sent there
            // (the unspecified address makes the kernel refuse it, and it is counted).
            SocketAddr::V6(v6) => {
                let ip = v6
                    .ip()
                    .to_ipv4_mapped()
                    .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
                std::net::SocketAddrV4::new(ip, v6.port()).into()
            }
        }
    }
}

impl FamilyAddr for SockaddrIn6 {
    fn with_headers<R>(n: usize, f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&HDRS_V6, n, false, f)
    }

    fn with_gso_header<R>(f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&GSO_HDR_V6, 1, true, f)
    }

    fn of(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V6(v6) => v6.into(),
            SocketAddr::V4(v4) => {
                std::net::SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0).into()
            }
        }
    }
}

/// One `sendmsg` of a GSO super-datagram: `data`, cut by the kernel into `seg`-octet
/// datagrams to `to` (`UDP_SEGMENT`).
fn send_gso<S: FamilyAddr>(
    fd: std::os::fd::RawFd,
    data: &[u8],
    seg: u16,
    to: SocketAddr,
) -> nix::Result<usize> {
    // Through `sendmmsg` and a kept header: `sendmsg` with a control message allocates
    // its buffer on every call.
    let iov = [[IoSlice::new(data)]];
    let cmsg = [nix::sys::socket::ControlMessage::UdpGsoSegments(&seg)];
    let to = [Some(S::of(to))];
    S::with_gso_header(|hdr| {
        let mut sent = sendmmsg(fd, hdr, iov.iter(), to, cmsg, MsgFlags::empty())?;
        Ok(sent.next().map_or(0, |r| r.bytes))
    })
}

/// One `sendmmsg` of datagrams to addresses of the socket's family; returns how many left.
/// The address type is the family's own, not `SockaddrStorage`: counting the results then
/// reads nothing uninitialised (nix parses a storage's family to size it).
fn send_group<S: FamilyAddr>(
    fd: std::os::fd::RawFd,
    slices: &[[IoSlice<'_>; 1]],
    group: &[Transmit],
) -> nix::Result<usize> {
    let mut addrs: SmallVec<[Option<S>; SEND_BATCH]> = SmallVec::new();
    addrs.extend(group.iter().map(|t| Some(S::of(t.socket_addr()))));
    S::with_headers(slices.len(), |hdrs| {
        sendmmsg(fd, hdrs, slices.iter(), &addrs, [], MsgFlags::empty()).map(|r| r.count())
    })
}

/// Cached `sendmmsg` headers and how many messages they hold.
type HdrCache<S> = RefCell<Option<(MultiHeaders<S>, usize)>>;

thread_local! {
    /// `sendmmsg` headers of this thread, kept between calls (a send allocates nothing).
    static HDRS_V4: HdrCache<SockaddrIn> = const { RefCell::new(None) };
    static HDRS_V6: HdrCache<SockaddrIn6> = const { RefCell::new(None) };
    /// One message with room for a `UDP_SEGMENT` control message each.
    static GSO_HDR_V4: HdrCache<SockaddrIn> = const { RefCell::new(None) };
    static GSO_HDR_V6: HdrCache<SockaddrIn6> = const { RefCell::new(None) };
}

/// This thread's headers for at least `n` messages (at least a batch), each with room for
/// a `UDP_SEGMENT` control message if `gso`, to `f`.
fn with_cached_headers<S: SockaddrLike + Copy, R>(
    cache: &'static std::thread::LocalKey<HdrCache<S>>,
    n: usize,
    gso: bool,
    f: impl FnOnce(&mut MultiHeaders<S>) -> R,
) -> R {
    let make = |cap| MultiHeaders::<S>::preallocate(cap, gso.then(|| nix::cmsg_space!(u16)));
    cache.with(|c| match c.try_borrow_mut() {
        Ok(mut slot) => {
            let (hdrs, cap) = match slot.take() {
                Some((h, cap)) if cap >= n => (h, cap),
                _ => {
                    let cap = n.max(SEND_BATCH);
                    (make(cap), cap)
                }
            };
            let mut hdrs = hdrs;
            let r = f(&mut hdrs);
            *slot = Some((hdrs, cap));
            r
        }
        // Re-entered (cannot happen: `f` only sends): headers of its own.
        Err(_) => f(&mut make(n)),
    })
}

/// Segment lengths whose Identification syndromes a thread keeps: a Write stream's runs
/// have a few (the first packet's with its RETH, the middle ones', a shorter last one).
const ID_SYNDROME_LENGTHS: usize = 4;

thread_local! {
    /// The Identification syndromes of this thread's latest GSO segment lengths, the most
    /// recent first.
    static ID_SYNDROMES: RefCell<[Option<Ipv4IdSyndromes>; ID_SYNDROME_LENGTHS]> =
        const { RefCell::new([None; ID_SYNDROME_LENGTHS]) };
}

/// The Identification syndromes of segments of `payload_len` octets, from the thread's
/// few latest lengths when there (computing them costs O(log n) products).
fn id_syndromes(payload_len: usize) -> Ipv4IdSyndromes {
    ID_SYNDROMES.with_borrow_mut(|kept| {
        let at = kept
            .iter()
            .position(|s| s.is_some_and(|s| s.payload_len() == payload_len));
        let s = at
            .and_then(|i| kept[i].take())
            .unwrap_or_else(|| Ipv4IdSyndromes::new(payload_len));
        // Most recent first: the one found (or made) moves to the front.
        let end = at.unwrap_or(ID_SYNDROME_LENGTHS - 1);
        kept[..=end].rotate_right(1);
        kept[0] = Some(s);
        s
    })
}

/// Receive buffers of one thread (the receive thread's own, or a polling caller's).
struct RxBufs {
    bufs: Vec<Vec<u8>>,
    hdrs: mmsg::RecvHeaders,
    /// Per receive: octets, sender, and the GRO segment size (0: one datagram).
    got: Vec<mmsg::Got>,
    touched: Vec<Arc<RoceQpShared>>,
    verifier: IcrcVerifier,
    /// Buffers large enough for GRO runs, with room for the segment size.
    gro: bool,
}

impl RxBufs {
    fn new(gro: bool) -> RxBufs {
        let (n, len) = if gro {
            (GRO_BATCH, GRO_BUFFER)
        } else {
            (RECV_BATCH, MAX_DATAGRAM)
        };
        RxBufs {
            bufs: (0..n).map(|_| vec![0u8; len]).collect(),
            hdrs: mmsg::RecvHeaders::new(n, gro),
            got: Vec::with_capacity(n),
            touched: Vec::new(),
            verifier: IcrcVerifier::default(),
            gro,
        }
    }
}

thread_local! {
    /// Receive buffers of each thread that drives a RoCE context (its receive thread, a CQ
    /// waiter or poller).
    static CALLER_RX: std::cell::RefCell<Option<RxBufs>> = const { std::cell::RefCell::new(None) };
}

impl RoceShared {
    /// This thread's receive buffers, made (again) for this context's GRO setting: a thread
    /// may drive contexts of both kinds, and a GRO run must never meet a small buffer (it
    /// would be cut short).
    fn rx_bufs<'a>(&self, c: &'a mut Option<RxBufs>) -> &'a mut RxBufs {
        if c.as_ref().is_some_and(|r| self.gro && !r.gro) {
            *c = None;
        }
        c.get_or_insert_with(|| RxBufs::new(self.gro))
    }

    /// Reads what is queued on the socket (without blocking), up to a few batches, and
    /// processes it. The caller holds `rx_lock`: datagrams are handled in arrival order.
    fn drain_socket(&self, rx: &mut RxBufs, hold: Hold) -> usize {
        let fd = self.socket.as_raw_fd();
        let mut total = 0;
        // QPs with more to send than one turn's budget (a large READ's responses): the
        // socket is read between their budgets, so what the peer sends meanwhile (a READ
        // re-issued after a loss, which replaces the queued responses) is not left waiting
        // behind the whole burst.
        let mut backlog: SmallVec<[Arc<RoceQpShared>; 4]> = SmallVec::new();
        let mut rounds = 0;
        while rounds < 4 || !backlog.is_empty() {
            rounds += 1;
            rx.got.clear();
            // A receive allocates nothing: the headers are the thread's, used again.
            let _ = rx.hdrs.recv(fd, &mut rx.bufs, &mut rx.got);
            if rx.got.is_empty() {
                if !self.send_backlog(&mut backlog, hold) {
                    break;
                }
                continue;
            }
            let runs = rx.got.iter().filter(|g| g.2 != 0).count() as u64;
            if runs > 0 {
                self.counters
                    .gro_receives
                    .fetch_add(runs, Ordering::Relaxed);
            }
            let now = Instant::now();
            // The endpoint checks and routes the whole batch under one read lock; the QPs'
            // engines are locked only after it is released (lock order: engine, endpoint).
            // Each accepted datagram is kept with the index of its QP in `touched`.
            let mut routed: SmallVec<[(usize, Incoming<'_>); ROUTED_INLINE]> = SmallVec::new();
            let mut mads: Vec<(IpAddr, Incoming<'_>)> = Vec::new();
            {
                let ep = self.endpoint.read();
                let qps = self.qps.read();
                // A GRO receive is a run of datagrams of `seg` octets (the last may be
                // shorter): each is handled as if it came alone.
                let datagrams = rx
                    .bufs
                    .iter()
                    .zip(&rx.got)
                    .flat_map(|(buf, &(n, peer, seg))| {
                        let all = buf.get(..n).unwrap_or(&[]);
                        let step = if seg == 0 { n.max(1) } else { seg };
                        all.chunks(step).map(move |d| (peer, d))
                    });
                let tap = self.tap.get();
                for (peer, dgram) in datagrams {
                    let Some(peer) = peer else {
                        continue;
                    };
                    if let Some(t) = tap {
                        t.tapped(Tapped::Udp {
                            local: self.local,
                            peer,
                            dir: Direction::Received,
                            payload: dgram,
                        });
                    }
                    // A drop is counted by the endpoint.
                    let Ok(inc) = ep.handle(peer, dgram, &mut rx.verifier) else {
                        continue;
                    };
                    if inc.qpn == softrdma_ib::cm::GSI_QPN {
                        mads.push((peer.ip(), inc));
                        continue;
                    }
                    // Registered with the endpoint, so in `qps` (both change under its write
                    // lock).
                    let Some(q) = qps.get(&inc.qpn) else { continue };
                    let i = match rx.touched.iter().position(|t| Arc::ptr_eq(t, q)) {
                        Some(i) => i,
                        None => {
                            q.send_cq.arrived();
                            if !Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
                                q.recv_cq.arrived();
                            }
                            rx.touched.push(q.clone());
                            rx.touched.len() - 1
                        }
                    };
                    routed.push((i, inc));
                }
            }
            for (i, inc) in &routed {
                if let Some(q) = rx.touched.get(*i) {
                    q.engine.lock().qp.handle_packet(&inc.packet, &inc.grh, now);
                    if q.awaiting_rtu.load(Ordering::Relaxed)
                        && q.awaiting_rtu.swap(false, Ordering::AcqRel)
                    {
                        self.comm_established(q.qpn, now);
                    }
                }
            }
            drop(routed);
            if !mads.is_empty() {
                for (peer, inc) in &mads {
                    self.gsi_input(now, *peer, &inc.packet);
                }
                drop(mads);
                self.gsi_pump(now);
            }
            for q in rx.touched.drain(..) {
                if !backlog.iter().any(|b| Arc::ptr_eq(b, &q)) {
                    backlog.push(q);
                }
            }
            total += rx.got.len();
            if !self.send_backlog(&mut backlog, hold) && rx.got.len() < rx.bufs.len() {
                break;
            }
        }
        total
    }

    /// One budget of sending for each QP in `backlog`; those with nothing more to send
    /// leave it. Whether any is left.
    fn send_backlog(&self, backlog: &mut SmallVec<[Arc<RoceQpShared>; 4]>, hold: Hold) -> bool {
        let now = Instant::now();
        backlog.retain(|q| {
            let mut e = q.engine.lock();
            self.flush_some(q, &mut e, now, hold, BACKLOG_BATCHES)
        });
        !backlog.is_empty()
    }
}

impl Progress for RoceShared {
    fn block(
        &self,
        waiter: Weak<dyn Waiter>,
        spin: Duration,
        flow: Duration,
        until: Option<Instant>,
        done: &dyn Fn() -> bool,
    ) -> bool {
        let drove = self.leader.drive(
            waiter,
            spin,
            flow,
            until,
            done,
            || self.wake_pipe.signal(),
            |timers, until| self.turn(timers, until, Hold::Ack),
        );
        // What a post left to this thread after its last turn (see `defer`).
        std::sync::atomic::fence(Ordering::SeqCst);
        self.send_ready(Instant::now());
        drove
    }

    fn nudge(&self) {
        self.leader.unpark_background();
    }

    fn wake(&self) {
        self.leader.wake(|| self.wake_pipe.signal());
    }

    fn progress(&self, _cq: &CqShared) {
        self.release_acks(Instant::now());
        // The receive thread is handling datagrams right now: nothing to add.
        let Some(_g) = self.rx_lock.try_lock() else {
            return;
        };
        CALLER_RX.with(|c| {
            let mut c = c.borrow_mut();
            let rx = self.rx_bufs(&mut c);
            self.drain_socket(rx, Hold::Ack);
        });
    }
}

/// The receive thread: waits on the socket while no caller does (see [`crate::leader`]),
/// and runs the retransmission timers.
fn rx_loop(weak: Weak<RoceShared>) {
    loop {
        let Some(d) = weak.upgrade() else { return };
        if !d.alive.load(Ordering::Acquire) {
            return;
        }
        d.leader.background(
            |timers, until| {
                let until = until.unwrap_or_else(|| Instant::now() + IDLE_WAIT);
                d.turn(timers, Some(until), Hold::Nothing)
            },
            || {
                d.run_timers(Instant::now());
                true
            },
        );
    }
}

impl RoceShared {
    /// One turn with the slot: fire due timers, wait on the socket (and the wake pipe) until
    /// the next timer or `until`, read and process what arrived (`hold`: a caller's turn).
    ///
    /// A poll (`until` now, while data flows) walks the QPs' timers only once `timers` is
    /// reached, at most every [`POLL_TIMERS`]: polls come back to back, and the walk locks
    /// every QP.
    fn turn(&self, timers: &mut Instant, until: Option<Instant>, hold: Hold) -> Turn {
        let now = Instant::now();
        let mut wait = if until.is_some_and(|u| u <= now) && now < *timers {
            // What `run_timers` does first, without the walk of every QP.
            self.send_ready(now);
            self.release_acks(now);
            Duration::ZERO
        } else {
            let w = self.run_timers(now);
            *timers = now + w.min(POLL_TIMERS);
            w
        };
        if let Some(u) = until {
            wait = wait.min(u.saturating_duration_since(now));
        }
        // The timers may have completed what this thread waits for.
        if self.leader.take_self_wake() {
            wait = Duration::ZERO;
        }
        if wait.is_zero() {
            // A turn that may not wait reads the socket at once: a poll first would be a
            // system call that says only what `recvmmsg` finds out anyway. A wake-up left in
            // the pipe meanwhile ends the next wait that may block.
            return self.drain_now(hold);
        }
        let ms = wait.as_micros().div_ceil(1000).min(1000) as u16;
        let mut fds = [
            PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.wake_pipe.fd(), PollFlags::POLLIN),
        ];
        let ready = poll(&mut fds, PollTimeout::from(ms)).unwrap_or(0);
        if ready == 0 {
            return Turn::Idle;
        }
        if fds[1].any().unwrap_or(false) {
            self.wake_pipe.clear();
            self.send_ready(Instant::now());
        }
        if fds[0].any().unwrap_or(false) {
            return self.drain_now(hold);
        }
        Turn::Idle
    }

    /// Reads and processes what the socket holds, without waiting.
    fn drain_now(&self, hold: Hold) -> Turn {
        let _g = self.rx_lock.lock();
        let n = CALLER_RX.with(|c| {
            let mut c = c.borrow_mut();
            let rx = self.rx_bufs(&mut c);
            self.drain_socket(rx, hold)
        });
        if n > 0 { Turn::Worked } else { Turn::Idle }
    }
}

impl RoceShared {
    /// Sends held ACKs and fires due timers; returns how long until the next one.
    fn run_timers(&self, now: Instant) -> Duration {
        self.send_ready(now);
        self.release_acks(now);
        let mut next = now + IDLE_WAIT;
        if let Some(t) = self.gsi_timeout() {
            if t <= now {
                self.gsi_pump(now);
            }
            if let Some(t) = self.gsi_timeout() {
                next = next.min(t);
            }
        }
        // On the stack for the usual few QPs: a timer pass allocates nothing.
        let qps: SmallVec<[Arc<RoceQpShared>; 16]> = self.qps.read().values().cloned().collect();
        for q in qps {
            let mut e = q.engine.lock();
            if let Some(t) = e.qp.poll_timeout() {
                if t <= now {
                    e.qp.handle_timeout(now);
                    self.flush(&q, &mut e, now, Hold::Nothing);
                }
                if let Some(t) = e.qp.poll_timeout() {
                    next = next.min(t);
                }
            }
        }
        next.saturating_duration_since(now)
    }
}

impl RoceShared {
    /// The context is closed: the receive thread stops and lets go of the driver.
    pub(crate) fn shutdown(&self) {
        self.send_ready(Instant::now());
        self.release_acks(Instant::now());
        self.linger();
        self.alive.store(false, Ordering::Release);
        self.wake_pipe.signal();
        self.leader.unpark_background();
        let h = self.rx_thread.lock().take();
        if let Some(h) = h
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

impl Drop for RoceShared {
    fn drop(&mut self) {
        self.release_acks(Instant::now());
        self.alive.store(false, Ordering::Release);
    }
}

impl RoceShared {
    /// The driver's counters: the endpoint's, and the socket's.
    pub(crate) fn counters(&self) -> RoceCounters {
        let e = self.endpoint.read().counters();
        let c = &self.counters;
        RoceCounters {
            tx_packets: c.tx_packets.load(Ordering::Relaxed),
            rx_packets: e.rx_datagrams,
            bad_icrc: e.bad_icrc,
            malformed: e.malformed,
            unknown_qp: e.unknown_qp,
            wrong_source: e.wrong_source,
            tx_errors: e.tx_no_route + e.tx_invalid + c.tx_refused.load(Ordering::Relaxed),
            qp1_dropped: c.qp1_dropped.load(Ordering::Relaxed),
            gso_sends: c.gso_sends.load(Ordering::Relaxed),
            gro_receives: c.gro_receives.load(Ordering::Relaxed),
            tx_handed_over: c.tx_handed_over.load(Ordering::Relaxed),
            tx_deferred: c.tx_deferred.load(Ordering::Relaxed),
            cm: self.gsi.lock().cm_counters(),
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
        [send_cq, recv_cq]: [&Arc<CqShared>; 2],
        srq: Option<Arc<SharedRecvQueue>>,
    ) -> Result<Arc<RoceQpShared>, Error> {
        let shared = {
            // The QPN is the endpoint's; the QP joins `qps` before a datagram can be routed
            // to it.
            let mut ep = self.endpoint.write();
            let qpn = ep.add_qp(qp_type).map_err(out_of_resources)?;
            let qp = match srq {
                None => IbQp::new(qpn, qp_type, pd, cap, keys),
                Some(srq) => match IbQp::new_with_srq(qpn, qp_type, pd, cap, keys, srq) {
                    Ok(qp) => qp,
                    Err(_) => {
                        ep.remove_qp(qpn);
                        return Err(Error::Mem(softrdma_memory::MemError::WrongPd));
                    }
                },
            };
            let shared = Arc::new(RoceQpShared {
                qpn,
                awaiting_rtu: AtomicBool::new(false),
                ack_held: AtomicBool::new(false),
                tx_queued: AtomicBool::new(false),
                engine: Mutex::new(Engine {
                    qp,
                    wcs: Vec::new(),
                    posted: 0,
                }),
                tx: Mutex::new(()),
                tx_pending: AtomicU8::new(0),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
            });
            self.qps.write().insert(qpn, shared.clone());
            shared
        };
        for cq in [send_cq, recv_cq] {
            cq.attach(Arc::downgrade(self) as Weak<dyn Progress>);
        }
        Ok(shared)
    }

    /// Removes a QP (`ibv_destroy_qp`): from now on its QPN is unknown to the endpoint.
    pub(crate) fn destroy_qp(&self, qpn: u32) {
        let q = self.qps.read().get(&qpn).cloned();
        if let Some(q) = q {
            // The peer gets the ACK of what this QP received, not a retry.
            let mut e = q.engine.lock();
            self.flush_now(&q, &mut e, Instant::now());
        }
        // Then the DREQ, after those ACKs.
        self.cm_forget_qp(qpn);
        let mut ep = self.endpoint.write();
        ep.remove_qp(qpn);
        self.qps.write().remove(&qpn);
    }

    /// An address handle for UD sends to `addr` (`ibv_create_ah`); dropping its last clone
    /// destroys it.
    pub(crate) fn create_ah(self: &Arc<Self>, addr: SocketAddr) -> Result<Ah, Error> {
        let id = self
            .endpoint
            .write()
            .create_ah(addr)
            .map_err(out_of_resources)?;
        Ok(Ah {
            slot: Arc::new(AhSlot {
                id,
                addr,
                driver: self.clone(),
            }),
        })
    }

    /// Sets the path of a connected QP: where it sends, the address it accepts packets from.
    pub(crate) fn set_remote(&self, q: &RoceQpShared, addr: SocketAddr) {
        // Registered for as long as `q` exists: cannot fail.
        let r = self.endpoint.write().set_path(q.qpn, addr);
        debug_assert!(r.is_ok(), "{r:?}");
    }

    /// `ibv_modify_qp`. For RC/UC the path must be set before RTR.
    pub(crate) fn modify(&self, q: &RoceQpShared, attr: &QpAttr) -> Result<(), Error> {
        let mut e = q.engine.lock();
        if attr.state == Some(IbQpState::Rtr)
            && e.qp.qp_type() != QpType::Ud
            && self.endpoint.read().path(q.qpn).is_none()
        {
            return Err(Error::InvalidArgument(
                "RTR needs the path (Qp::set_remote)",
            ));
        }
        if q.ack_held.load(Ordering::Acquire) {
            // Error and Reset drop what is queued: the peer must have its ACK first.
            self.flush_now(q, &mut e, Instant::now());
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
        self.flush(q, &mut e, Instant::now(), Hold::Nothing);
        Ok(())
    }

    /// Posts send requests and sends what may leave now (one lock, one flush); stops at the
    /// first refused one and returns its index.
    ///
    /// A large post to a QP that is still sending, made while another caller waits on the
    /// socket, is left to that caller (woken to send it): the thread that takes the QP's
    /// ACKs, which open its window, then sends the whole stream, instead of taking turns at
    /// the QP's sender and its cache lines with the threads that post (a server's pool
    /// workers posting replies' Writes while the connection's thread waits for the next
    /// call). Small posts, and posts to an idle QP, leave at once: there a wake-up would
    /// cost more than it saves.
    pub(crate) fn post_send(
        &self,
        q: &Arc<RoceQpShared>,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        let mut e = q.engine.lock();
        let sending = e.qp.sq_outstanding() > 0;
        let mut res = Ok(());
        let mut octets = 0u64;
        for (i, wr) in wrs.into_iter().enumerate() {
            if !matches!(wr.opcode, WrOpcode::RdmaRead { .. }) {
                octets += wr.sg_list.iter().map(|s| u64::from(s.length)).sum::<u64>();
            }
            if let Err(err) = e.qp.post_send(wr) {
                res = Err((i, err.into()));
                break;
            }
            e.posted += 1;
        }
        if sending
            && octets >= DEFER_OCTETS
            && self.leader.caller_holds()
            && !self.leader.is_holder()
        {
            deliver(q, &mut e);
            drop(e);
            self.defer(q);
            return res;
        }
        // A held ACK goes after the requests (IbQp::poll_transmit), in the same batch.
        self.flush(q, &mut e, Instant::now(), Hold::Nothing);
        res
    }

    /// Leaves `q`'s transmission to the caller holding the slot, and wakes it; sends at once
    /// if that caller has let the slot go meanwhile.
    fn defer(&self, q: &Arc<RoceQpShared>) {
        if !q.tx_queued.swap(true, Ordering::AcqRel) {
            self.tx_ready.lock().push(q.clone());
            self.tx_ready_any.store(true, Ordering::Relaxed);
        }
        self.counters.tx_deferred.fetch_add(1, Ordering::Relaxed);
        self.wake_pipe.signal();
        // Either the holder, letting go, finds `q` on the list (`block` looks after
        // `drive`), or this thread sees that it let go (the fence pairs with `block`'s).
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.leader.caller_holds() {
            self.send_ready(Instant::now());
        }
    }

    /// Sends for the QPs [`defer`](Self::defer) left to this thread.
    fn send_ready(&self, now: Instant) {
        if !self.tx_ready_any.load(Ordering::Relaxed) {
            return;
        }
        let ready = {
            let mut r = self.tx_ready.lock();
            self.tx_ready_any.store(false, Ordering::Relaxed);
            std::mem::take(&mut *r)
        };
        for q in ready {
            q.tx_queued.store(false, Ordering::Release);
            let mut e = q.engine.lock();
            self.flush(&q, &mut e, now, Hold::Nothing);
        }
    }

    /// Posts a receive request (in the Error state it completes flushed at once).
    pub(crate) fn post_recv(&self, q: &RoceQpShared, wr: RecvWr) -> Result<(), Error> {
        self.post_recv_list(q, [wr]).map_err(|(_, e)| e)
    }

    /// Receive requests in order, up to the first refused one, under one engine lock.
    pub(crate) fn post_recv_list(
        &self,
        q: &RoceQpShared,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), (usize, Error)> {
        let mut e = q.engine.lock();
        let mut res = Ok(());
        for (i, wr) in wrs.into_iter().enumerate() {
            if let Err(err) = e.qp.post_recv(wr) {
                res = Err((i, err.into()));
                break;
            }
        }
        // Only flushed completions to deliver; a held ACK waits for the next Send.
        self.flush(q, &mut e, Instant::now(), Hold::Ack);
        res
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

    pub(crate) fn has_srq(&self) -> bool {
        self.engine.lock().qp.srq().is_some()
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
///
/// Clones share the handle; dropping the last one destroys it (`ibv_destroy_ah`) and its id
/// goes to the next handle created on the context, so, as in verbs, no send request still
/// queued may name it.
#[derive(Clone)]
pub struct Ah {
    slot: Arc<AhSlot>,
}

struct AhSlot {
    id: u32,
    addr: SocketAddr,
    driver: Arc<RoceShared>,
}

impl Drop for AhSlot {
    fn drop(&mut self) {
        self.driver.endpoint.write().destroy_ah(self.id);
    }
}

impl Ah {
    /// The handle's index (`UdDest::ah`).
    pub fn id(&self) -> u32 {
        self.slot.id
    }

    /// Where it points.
    pub fn addr(&self) -> SocketAddr {
        self.slot.addr
    }
}

impl PartialEq for Ah {
    /// The same handle (ids are unique among a context's live handles).
    fn eq(&self, other: &Ah) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }
}

impl Eq for Ah {}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah")
            .field("id", &self.slot.id)
            .field("addr", &self.slot.addr)
            .finish()
    }
}

/// An endpoint that ran out of QPNs or address handle ids: `ENOMEM`, as verbs reports it.
fn out_of_resources(e: EndpointError) -> Error {
    Error::Io(std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))
}

/// The IPv4 address of an IPv4-mapped GID, or the IPv6 address of any other.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    softrdma_wire::rocev2::gid_to_ip(gid)
}

/// The GID of an address: IPv4-mapped for IPv4 (RoCEv2's convention), the address itself
/// for IPv6.
pub fn gid_from_ip(ip: IpAddr) -> [u8; 16] {
    softrdma_wire::rocev2::gid_from_ip(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_syndromes_are_those_of_the_length_asked() {
        // More lengths than are kept, revisited in several orders.
        let lens = [4124, 4108, 1000, 4124, 12, 4108, 4124, 33, 77, 4124, 1000];
        for _ in 0..3 {
            for &len in &lens {
                let s = id_syndromes(len);
                assert_eq!(s, Ipv4IdSyndromes::new(len), "len {len}");
            }
        }
    }

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
