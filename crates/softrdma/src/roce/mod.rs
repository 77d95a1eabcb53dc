//! RoCEv2 specifics: a device's settings ([`RoceConfig`], [`Device::roce`](crate::Device::roce))
//! and counters, address handles for UD sends ([`Ah`]), the InfiniBand attributes of
//! [`Qp::modify`](crate::Qp::modify) ([`QpAttr`]) and the engines' counters, GIDs, and the
//! connection parameters only RoCE takes.
//!
//! Underneath is the RoCEv2 driver: InfiniBand QPs ([`softrdma_ib::IbQp`]) over one UDP
//! socket bound to port 4791 of a local address (IBA Annex A17; `docs/spec/ib-transport.md`
//! §13.6).
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
//!
//! Its parts: this file, the context and its QPs (set-up, posting, QP management);
//! `config.rs`, where a context listens and what it counts; `tx.rs`, transmission; `rx.rs`,
//! reception, turns and timers; `ah.rs`, address handles; `cm.rs`, the connection manager.

use std::any::Any;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use softrdma_ib::{
    EndpointError, IbQp, QpCaps, QpState as IbQpState, QpType, RoceEndpoint, SocketKind,
};
use softrdma_memory::{KeyTable, PdId};
use softrdma_verbs_types::{RecvWr, SendWr, SharedRecvQueue, WorkCompletion, WrOpcode};

mod ah;
pub(crate) mod cm;
mod config;
// The one module of this crate with `unsafe`: the socket layer's receive headers.
#[allow(unsafe_code)]
mod mmsg;
mod rx;
mod tx;
mod verbs;

pub use self::ah::Ah;
use self::ah::AhSlot;
pub use self::config::{RawTx, RoceConfig, RoceCounters};

pub use crate::connparams::DEFAULT_ROCE_PMTU;
pub use crate::connparams::roce::{AcceptParams, ConnectParams};
pub use softrdma_ib::rdma_cm::RDMA_UDP_QKEY;
/// InfiniBand attributes of RoCE QPs (`ibv_qp_attr` for [`Qp::modify`](crate::Qp::modify),
/// whose `state` is the InfiniBand subset of [`crate::QpState`], comparable with it) and the
/// engine's own counters.
pub use softrdma_ib::{
    HeaderCounters, ModifyError, QpAttr, QpState, RequesterCounters, ResponderCounters,
};

use crate::Error;
use crate::connparams::ConnectionInfo;
use crate::cq::{CqShared, Progress};
use crate::event::EventQueue;
use crate::leader::{Leader, WakePipe};
use crate::provider::{Connected, Destroy, DriverQp, QpOps};
use crate::state::QpCounters;
use crate::tap::TapSlot;

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
            acks_held: AtomicBool::new(false),
            gso,
            gro,
            ipv4_id_known,
            tap: TapSlot::default(),
            tx_ready: Mutex::new(Vec::new()),
            tx_ready_any: AtomicBool::new(false),
        });
        Leader::start_background(&shared, "softrdma-roce-rx", |d| &d.leader, rx::round)?;
        Ok(shared)
    }
}

impl RoceShared {
    /// The context is closed: the receive thread stops and lets go of the driver.
    pub(crate) fn shutdown(&self) {
        self.send_ready(Instant::now());
        self.release_acks(Instant::now());
        self.linger();
        self.leader.stop();
        self.wake_pipe.signal();
        self.leader.unpark_background();
        self.leader.join_background();
    }
}

impl Drop for RoceShared {
    fn drop(&mut self) {
        self.release_acks(Instant::now());
        self.leader.stop();
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
            tx::deliver(q, &mut e);
            drop(e);
            self.defer(q);
            return res;
        }
        // A held ACK goes after the requests (IbQp::poll_transmit), in the same batch.
        self.flush(q, &mut e, Instant::now(), Hold::Nothing);
        res
    }

    /// Posts a receive request (in the Error state it completes flushed at once).
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

/// A RoCE QP as the verbs API holds it: its engine, and the driver whose socket and CM it
/// uses.
pub(crate) type RoceQp = DriverQp<RoceShared, RoceQpShared>;

impl QpOps for RoceQp {
    fn qp_num(&self) -> u32 {
        self.q.qpn()
    }

    fn state(&self) -> crate::QpState {
        self.q.state().into()
    }

    fn counters(&self) -> QpCounters {
        self.q.counters()
    }

    fn sq_outstanding(&self) -> u64 {
        self.q.sq_outstanding() as u64
    }

    fn post_send_list(&self, wrs: &mut dyn Iterator<Item = SendWr>) -> Result<(), (usize, Error)> {
        self.drv.post_send(&self.q, wrs)
    }

    fn post_recv_list(&self, wrs: &mut dyn Iterator<Item = RecvWr>) -> Result<(), (usize, Error)> {
        self.drv.post_recv_list(&self.q, wrs)
    }

    fn modify(&self, attr: &QpAttr) -> Result<(), Error> {
        self.drv.modify(&self.q, attr)
    }

    fn set_remote(&self, addr: SocketAddr) -> Result<(), Error> {
        self.drv.set_remote(&self.q, addr);
        Ok(())
    }

    fn connect(
        &self,
        addrs: &[SocketAddr],
        params: &crate::ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        cm::connect(&self.drv, &self.q, addrs, params)
    }

    fn connect_async(&self, addr: SocketAddr, params: crate::ConnectParams) -> Connected<'_> {
        Box::pin(async move { cm::connect_async(&self.drv, &self.q, addr, &params).await })
    }

    fn disconnect(&self) -> Result<(), Error> {
        self.drv.cm_disconnect(&self.q)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Destroy<RoceQpShared> for RoceShared {
    fn destroy(&self, q: &Arc<RoceQpShared>) {
        self.destroy_qp(q.qpn());
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
