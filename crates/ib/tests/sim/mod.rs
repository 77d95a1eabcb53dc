//! A seeded simulated network between two [`IbQp`]s, each behind its own [`RoceEndpoint`] as
//! in the UDP driver: the sending endpoint wraps every packet in RoCEv2 (by default the raw
//! IPv4 form, IPv4 | UDP | BTH .. | ICRC, as a driver with a raw socket sends; see [`Wire`]),
//! the network delivers the UDP payload and the sender's address as a UDP socket would, and
//! the receiving endpoint checks the ICRC, parses and demultiplexes it as the driver does.
//! Loss, duplication, reordering and corruption are drawn from a seeded RNG and virtual time,
//! so a failing seed replays exactly; corruption flips a bit of the UDP payload and is caught
//! (and counted) by the receiving endpoint's ICRC check. Optionally every packet is logged
//! ([`Sim::capture`]: what each side put on the wire and what was delivered) and chosen
//! packets are dropped ([`Sim::drop_filter`]) or held back ([`Sim::delay_filter`]) for
//! targeted fault injection.
//!
//! More QP pairs can share the two endpoints ([`Sim::add_pair`]): each side's QPs share its
//! key table and registered buffer, the endpoints demultiplex by QP number, and any QP may
//! take its receives from a [`SharedRecvQueue`] ([`Sim::new_srq`], [`Sim::add_pair`]).

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softrdma_ib::{
    DropReason, IbQp, QpAttr, QpCaps, QpState, QpType, RoceEndpoint, SharedRecvQueue, SocketKind,
    Transmit, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId};
use softrdma_wire::ib::{Opcode, PacketRepr, RethRepr, Syndrome};
use softrdma_wire::icrc::IcrcVerifier;
use softrdma_wire::rocev2::{Ipv4Repr, ROCEV2_UDP_PORT, UDP_HEADER_LEN, UdpRepr};

pub const ADDR: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)];
pub const ADDR6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
];

/// How the two endpoints talk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wire {
    /// IPv4, whole packets through raw sockets (our Identification, rxe's source ports).
    #[default]
    Ipv4Raw,
    /// IPv4 through UDP sockets (ICRC over Identification 0, recovered on receive).
    Ipv4Udp,
    /// IPv6 (always the UDP form, full ICRC).
    Ipv6,
}

impl Wire {
    /// The socket address of side `i`.
    pub fn addr(self, i: usize) -> SocketAddr {
        let ip = match self {
            Wire::Ipv4Raw | Wire::Ipv4Udp => IpAddr::V4(ADDR[i]),
            Wire::Ipv6 => IpAddr::V6(ADDR6[i]),
        };
        SocketAddr::new(ip, ROCEV2_UDP_PORT)
    }
}

/// Address handles every endpoint of the simulator has, all to the other side (tests name
/// both 0 and 1 in their `UdDest`s).
pub const AHS: u32 = 2;

/// Fault probabilities per packet.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub corrupt: f64,
}

impl Faults {
    pub fn loss(p: f64) -> Self {
        Faults {
            loss: p,
            ..Faults::default()
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct NetStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub bad_icrc: u64,
    pub delivered: u64,
}

/// One packet in the capture log.
#[derive(Clone, Debug)]
pub struct Rec {
    /// Put on the wire (true) or delivered to the receiving QP (false).
    pub tx: bool,
    /// The sending side.
    pub from: usize,
    /// Virtual time since the start.
    pub at: Duration,
    pub opcode: Opcode,
    /// BTH DestQP.
    pub dest_qp: u32,
    pub psn: u32,
    pub se: bool,
    pub ack_req: bool,
    pub syndrome: Option<Syndrome>,
    pub reth: Option<RethRepr>,
    pub payload: Vec<u8>,
}

impl Rec {
    fn of(tx: bool, from: usize, at: Duration, p: &PacketRepr<'_>) -> Rec {
        Rec {
            tx,
            from,
            at,
            opcode: p.bth.opcode,
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn,
            se: p.bth.se,
            ack_req: p.bth.ack_req,
            syndrome: p.aeth.map(|a| a.syndrome),
            reth: p.reth,
            payload: p.payload.to_vec(),
        }
    }
}

/// Decides per packet (sending side, packet) whether the network loses it.
pub type DropFilter = Box<dyn FnMut(usize, &PacketRepr<'_>) -> bool>;

/// Extra delay for a packet sent by side `from` (reordering it behind later ones).
pub type DelayFilter = Box<dyn FnMut(usize, &PacketRepr<'_>) -> Duration>;

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    /// What the sender gave its socket: a whole IPv4 packet (raw) or the UDP payload.
    kind: SocketKind,
    /// The sender's UDP socket address (what the receiving socket reports for `Udp`).
    from: SocketAddr,
    bytes: Vec<u8>,
}

impl InFlight {
    /// What the receiving UDP socket returns: the sender's address and the UDP payload.
    fn received(&self) -> (SocketAddr, &[u8]) {
        match self.kind {
            SocketKind::Udp => (self.from, &self.bytes),
            SocketKind::RawIpv4 => {
                // Faults never touch the IP and UDP headers (a kernel drops what breaks them).
                let ip = Ipv4Repr::parse(&self.bytes).expect("IPv4 header intact");
                let l4 = &self.bytes[ip.buffer_len()..];
                let udp = UdpRepr::parse(l4).expect("UDP header intact");
                let src = SocketAddr::new(IpAddr::V4(ip.src_addr), udp.src_port);
                (src, &l4[UDP_HEADER_LEN..usize::from(udp.length)])
            }
        }
    }
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// One side: its QP, key table and one registered buffer.
pub struct Node {
    pub qp: IbQp,
    pub keys: Arc<KeyTable>,
    pub buf: Arc<Buffer>,
    pub key: Key,
    pub sends: Vec<WorkCompletion>,
    pub recvs: Vec<WorkCompletion>,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 1 << 16,
        max_recv_wr: 1 << 16,
        window: 64,
        ..QpCaps::default()
    }
}

/// The QP: over `srq` if given (same domain, PdId(1)).
fn make_qp(ty: QpType, qpn: u32, keys: &Arc<KeyTable>, srq: Option<Arc<SharedRecvQueue>>) -> IbQp {
    match srq {
        Some(srq) => IbQp::new_with_srq(qpn, ty, PdId(1), caps(), keys.clone(), srq).unwrap(),
        None => IbQp::new(qpn, ty, PdId(1), caps(), keys.clone()),
    }
}

impl Node {
    /// A QP of `ty` (number `qpn`) with a `len`-octet region registered at iova 0.
    pub fn new(ty: QpType, qpn: u32, len: usize, seed: u64) -> Node {
        Node::with_srq(ty, qpn, len, seed, None)
    }

    /// As [`Node::new`], the QP taking its receives from `srq` if given.
    pub fn with_srq(
        ty: QpType,
        qpn: u32,
        len: usize,
        seed: u64,
        srq: Option<Arc<SharedRecvQueue>>,
    ) -> Node {
        let keys = Arc::new(KeyTable::with_seed(seed));
        let buf = Buffer::new(len);
        let key = keys
            .reg_mr(
                PdId(1),
                buf.clone(),
                0,
                len,
                0,
                Access::LOCAL_WRITE | Access::REMOTE,
            )
            .unwrap();
        let qp = make_qp(ty, qpn, &keys, srq);
        Node {
            qp,
            keys,
            buf,
            key,
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    /// Another QP on the same side as `other`: its key table, buffer and key.
    pub fn beside(other: &Node, ty: QpType, qpn: u32, srq: Option<Arc<SharedRecvQueue>>) -> Node {
        Node {
            qp: make_qp(ty, qpn, &other.keys, srq),
            keys: other.keys.clone(),
            buf: other.buf.clone(),
            key: other.key,
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    pub fn fill(&self, off: usize, data: &[u8]) {
        self.buf.copy_in(off, data).unwrap();
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.buf.copy_out(off, &mut v).unwrap();
        v
    }

    fn collect(&mut self) {
        while let Some(wc) = self.qp.poll_send_completion() {
            self.sends.push(wc);
        }
        while let Some(wc) = self.qp.poll_recv_completion() {
            self.recvs.push(wc);
        }
    }
}

/// The seeds a many-seed test runs: `SEEDS` of them from `SEED_BASE`, from the environment
/// when set (so any range can be replayed), else `n` from `base`.
pub fn seeds(n: u64, base: u64) -> std::ops::Range<u64> {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (n, base) = (env("SEEDS", n), env("SEED_BASE", base));
    base..base + n
}

impl Node {
    /// The native-order u64 at `off` of the buffer.
    pub fn word(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.read(off, 8).try_into().unwrap())
    }

    /// Collects the completions the QP has (after a direct call into it).
    pub fn drain(&mut self) {
        self.collect();
    }
}

/// Connection attributes for both sides.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub pmtu: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub psn: [u32; 2],
    /// `qp_access_flags` of both QPs.
    pub access: Access,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            pmtu: 1024,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 8,
            psn: [0x00AB_CDEF, 0x00FF_FFF0],
            access: Access::REMOTE,
        }
    }
}

/// Brings `n` (number `me`) to RTS facing `peer_qpn` as `ibv_rc_pingpong` does.
pub fn connect(n: &mut Node, me: usize, peer_qpn: u32, s: &Setup) {
    let ty = n.qp.qp_type();
    n.qp.modify(&QpAttr {
        state: Some(QpState::Init),
        qkey: (ty == QpType::Ud).then_some(0x1111_1111),
        access: Some(s.access),
        ..QpAttr::default()
    })
    .unwrap();
    let conn = ty != QpType::Ud;
    let rc = ty == QpType::Rc;
    n.qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: Some(s.pmtu),
        dest_qp: conn.then_some(peer_qpn),
        rq_psn: conn.then_some(s.psn[1 - me]),
        max_dest_rd_atomic: rc.then_some(s.max_rd_atomic),
        min_rnr_timer: rc.then_some(s.min_rnr_timer),
        ..QpAttr::default()
    })
    .unwrap();
    n.qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(s.psn[me]),
        timeout: rc.then_some(s.timeout),
        retry_cnt: rc.then_some(s.retry_cnt),
        rnr_retry: rc.then_some(s.rnr_retry),
        max_rd_atomic: rc.then_some(s.max_rd_atomic),
        ..QpAttr::default()
    })
    .unwrap();
}

/// QP numbers of pair `k` (0: the [`Sim::n`] pair).
pub fn pair_qpns(k: usize) -> [u32; 2] {
    let k = k as u32;
    [0x11 + 0x100 * k, 0x22 + 0x100 * k]
}

pub struct Sim {
    pub n: [Node; 2],
    /// Pairs 1.. ([`Sim::add_pair`]), side 0 and side 1.
    pub more: Vec<[Node; 2]>,
    /// Each side's RoCEv2 endpoint (its QP registered, the path and [`AHS`] address handles
    /// to the other side).
    pub ep: [RoceEndpoint; 2],
    pub wire: Wire,
    verifier: [IcrcVerifier; 2],
    pub now: Instant,
    pub faults: Faults,
    pub stats: NetStats,
    rng: StdRng,
    net: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Serialisation time per packet and one-way latency.
    pub per_packet: Duration,
    pub latency: Duration,
    link_free: [Instant; 2],
    dgram: Vec<u8>,
    /// Transmissions are paused on a side (to starve or overflow on purpose).
    pub hold: [bool; 2],
    start: Instant,
    /// Log every packet sent and delivered in [`Sim::log`].
    pub capture: bool,
    pub log: Vec<Rec>,
    /// Packets for which this returns true are lost (counted in `stats.lost`).
    pub drop_filter: Option<DropFilter>,
    /// Chosen packets are delayed by what it returns.
    pub delay_filter: Option<DelayFilter>,
}

impl Sim {
    pub fn new(ty: QpType, len: usize, setup: &Setup, faults: Faults, seed: u64) -> Sim {
        Sim::new_on(Wire::default(), ty, len, setup, faults, seed)
    }

    /// As [`Sim::new`] over `wire`.
    pub fn new_on(
        wire: Wire,
        ty: QpType,
        len: usize,
        setup: &Setup,
        faults: Faults,
        seed: u64,
    ) -> Sim {
        Sim::build(wire, ty, len, setup, faults, seed, [None, None])
    }

    /// As [`Sim::new`], side `i`'s QP taking its receives from `srq[i]` if given (domain
    /// PdId(1); post to it with the side's `keys`).
    pub fn new_srq(
        ty: QpType,
        len: usize,
        setup: &Setup,
        faults: Faults,
        seed: u64,
        srq: [Option<Arc<SharedRecvQueue>>; 2],
    ) -> Sim {
        Sim::build(Wire::default(), ty, len, setup, faults, seed, srq)
    }

    fn build(
        wire: Wire,
        ty: QpType,
        len: usize,
        setup: &Setup,
        faults: Faults,
        seed: u64,
        srq: [Option<Arc<SharedRecvQueue>>; 2],
    ) -> Sim {
        let [srq_a, srq_b] = srq;
        let mut a = Node::with_srq(ty, 0x11, len, seed, srq_a);
        let mut b = Node::with_srq(ty, 0x22, len, seed ^ 0x5555, srq_b);
        connect(&mut a, 0, 0x22, setup);
        connect(&mut b, 1, 0x11, setup);
        let kind = match wire {
            Wire::Ipv4Raw => SocketKind::RawIpv4,
            Wire::Ipv4Udp | Wire::Ipv6 => SocketKind::Udp,
        };
        let ep = [0, 1].map(|i| {
            let mut ep = RoceEndpoint::new(wire.addr(i), kind);
            let qpn = [0x11, 0x22][i];
            ep.insert_qp(qpn, ty).unwrap();
            if ty != QpType::Ud {
                ep.set_path(qpn, wire.addr(1 - i)).unwrap();
            }
            for id in 0..AHS {
                assert_eq!(ep.create_ah(wire.addr(1 - i)), Ok(id));
            }
            ep
        });
        if std::env::var_os("SIM_TRACE").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_test_writer()
                .without_time()
                .try_init();
        }
        let now = Instant::now();
        Sim {
            n: [a, b],
            more: Vec::new(),
            ep,
            wire,
            verifier: [IcrcVerifier::new(), IcrcVerifier::new()],
            now,
            faults,
            stats: NetStats::default(),
            rng: StdRng::seed_from_u64(seed),
            net: BinaryHeap::new(),
            seq: 0,
            per_packet: Duration::from_nanos(300),
            latency: Duration::from_micros(5),
            link_free: [now; 2],
            dgram: Vec::new(),
            hold: [false; 2],
            start: now,
            capture: false,
            log: Vec::new(),
            drop_filter: None,
            delay_filter: None,
        }
    }

    /// Adds QP pair `k` = [`Sim::pairs`] (numbers [`pair_qpns`]`(k)`) of the first pair's type
    /// between the two endpoints, connected with `setup`, side `i` over `srq[i]` if given;
    /// returns `k`.
    pub fn add_pair(&mut self, setup: &Setup, srq: [Option<Arc<SharedRecvQueue>>; 2]) -> usize {
        let k = self.pairs();
        let ty = self.n[0].qp.qp_type();
        let qpn = pair_qpns(k);
        let [srq_a, srq_b] = srq;
        let mut a = Node::beside(&self.n[0], ty, qpn[0], srq_a);
        let mut b = Node::beside(&self.n[1], ty, qpn[1], srq_b);
        connect(&mut a, 0, qpn[1], setup);
        connect(&mut b, 1, qpn[0], setup);
        for (i, ep) in self.ep.iter_mut().enumerate() {
            ep.insert_qp(qpn[i], ty).unwrap();
            if ty != QpType::Ud {
                ep.set_path(qpn[i], self.wire.addr(1 - i)).unwrap();
            }
        }
        self.more.push([a, b]);
        k
    }

    /// QP pairs between the endpoints.
    pub fn pairs(&self) -> usize {
        1 + self.more.len()
    }

    /// Side `side` of pair `k`.
    pub fn node(&self, side: usize, k: usize) -> &Node {
        match k {
            0 => &self.n[side],
            k => &self.more[k - 1][side],
        }
    }

    /// Side `side` of pair `k`, mutably.
    pub fn node_mut(&mut self, side: usize, k: usize) -> &mut Node {
        match k {
            0 => &mut self.n[side],
            k => &mut self.more[k - 1][side],
        }
    }

    /// Virtual time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.now.duration_since(self.start)
    }

    /// Puts the datagram `t` of `buf` that side `from` encapsulated on the wire.
    fn send(&mut self, from: usize, buf: &[u8], t: Transmit) {
        assert_eq!(t.dest, self.wire.addr(1 - from), "routed to the other side");
        let bytes = &buf[t.range()];
        // The part of the packet corruption may hit: the UDP payload (BTH .. ICRC).
        let covered = t.packet_range().start - t.start;
        self.stats.sent += 1;
        let f = self.faults;
        let p = PacketRepr::parse(&buf[t.packet_range()]).unwrap();
        if self.capture {
            self.log.push(Rec::of(true, from, self.elapsed(), &p));
        }
        if let Some(filter) = &mut self.drop_filter
            && filter(from, &p)
        {
            self.stats.lost += 1;
            return;
        }
        if self.rng.random_bool(f.loss) {
            self.stats.lost += 1;
            if std::env::var_os("SIM_TRACE").is_some() {
                eprintln!(
                    "LOST {from} {:?} psn {}",
                    p.bth.opcode.operation(),
                    p.bth.psn
                );
            }
            return;
        }
        let start = self.link_free[from].max(self.now);
        self.link_free[from] = start + self.per_packet;
        let mut at = start + self.per_packet + self.latency;
        if let Some(filter) = &mut self.delay_filter {
            at += filter(from, &p);
        }
        if self.rng.random_bool(f.reorder) {
            self.stats.reordered += 1;
            at += Duration::from_nanos(self.rng.random_range(1_000..40_000));
        }
        let copies = if self.rng.random_bool(f.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for i in 0..copies {
            let mut b = bytes.to_vec();
            if self.rng.random_bool(f.corrupt) {
                self.stats.corrupted += 1;
                let at = self.rng.random_range(covered..b.len());
                b[at] ^= 1 << self.rng.random_range(0..8);
            }
            self.seq += 1;
            self.net.push(Reverse(InFlight {
                at: at + Duration::from_nanos(i * 700),
                seq: self.seq,
                to: 1 - from,
                kind: t.kind,
                from: self.ep[from].local(),
                bytes: b,
            }));
        }
    }

    /// Moves every packet the QPs have to send onto the wire.
    pub fn pump(&mut self) {
        for side in 0..2 {
            if self.hold[side] {
                continue;
            }
            let mut out = std::mem::take(&mut self.dgram);
            for k in 0..self.pairs() {
                loop {
                    out.clear();
                    let ep = &self.ep[side];
                    let node = match k {
                        0 => &mut self.n[side],
                        k => &mut self.more[k - 1][side],
                    };
                    let Some(t) = ep.poll_transmit(&mut node.qp, self.now, &mut out) else {
                        break;
                    };
                    self.send(side, &out, t);
                }
                self.node_mut(side, k).collect();
            }
            self.dgram = out;
        }
    }

    fn deliver(&mut self, f: InFlight) {
        let (src, dgram) = f.received();
        let r = match self.ep[f.to].handle(src, dgram, &mut self.verifier[f.to]) {
            Ok(r) => r,
            Err(DropReason::BadIcrc) => {
                // Dropped and counted by the endpoint (IBT-X-20).
                self.stats.bad_icrc += 1;
                return;
            }
            // Counted by the endpoint.
            Err(_) => return,
        };
        self.stats.delivered += 1;
        if self.capture {
            self.log
                .push(Rec::of(false, 1 - f.to, self.elapsed(), &r.packet));
        }
        if std::env::var_os("SIM_TRACE").is_some() {
            let p = &r.packet;
            eprintln!(
                "{:>9?} {}->{} {:?} psn {} aeth {:?} len {}",
                self.now.duration_since(self.start),
                1 - f.to,
                f.to,
                p.bth.opcode.operation(),
                p.bth.psn,
                p.aeth.map(|a| (a.syndrome, a.msn)),
                p.payload.len()
            );
        }
        let k = (0..self.pairs())
            .find(|&k| self.node(f.to, k).qp.qpn() == r.qpn)
            .expect("the endpoint knows only our QPs");
        let now = self.now;
        let node = self.node_mut(f.to, k);
        node.qp.handle_packet(&r.packet, &r.grh, now);
        node.collect();
    }

    /// Delivers `p` to side `to` now, as if side `1 - to` had sent it (encapsulated by that
    /// side's endpoint with a valid ICRC, logged, no faults).
    pub fn inject(&mut self, to: usize, p: &PacketRepr<'_>) {
        let mut b = vec![0; p.buffer_len()];
        let n = p.emit(&mut b).unwrap();
        b.truncate(n);
        let from = 1 - to;
        let ud = (self.n[from].qp.qp_type() == QpType::Ud).then_some(UdDest {
            ah: 0,
            remote_qpn: p.bth.dest_qp,
            remote_qkey: 0,
        });
        let mut out = Vec::new();
        let t = self.ep[from]
            .encapsulate(self.n[from].qp.qpn(), ud, &b, &mut out)
            .unwrap();
        self.deliver(InFlight {
            at: self.now,
            seq: 0,
            to,
            kind: t.kind,
            from: self.ep[from].local(),
            bytes: out,
        });
    }

    /// One event: deliver the next packet or fire the next timer. False when idle.
    pub fn step(&mut self) -> bool {
        self.pump();
        let next_pkt = self.net.peek().map(|Reverse(f)| f.at);
        let next_timer = (0..self.pairs())
            .flat_map(|k| [0, 1].map(|i| self.node(i, k).qp.poll_timeout()))
            .flatten()
            .min();
        match (next_pkt, next_timer) {
            (Some(p), t) if t.is_none_or(|t| p <= t) => {
                let Reverse(f) = self.net.pop().unwrap();
                self.now = self.now.max(f.at);
                self.deliver(f);
            }
            (_, Some(t)) => {
                self.now = self.now.max(t);
                let now = self.now;
                for k in 0..self.pairs() {
                    for i in 0..2 {
                        let node = self.node_mut(i, k);
                        node.qp.handle_timeout(now);
                        node.collect();
                    }
                }
            }
            (None, None) => return false,
            _ => unreachable!(),
        }
        self.pump();
        true
    }

    /// Steps until `done` holds or the network is idle; panics after `max` events.
    pub fn run_until(&mut self, max: u64, mut done: impl FnMut(&Sim) -> bool) {
        for _ in 0..max {
            if done(self) {
                return;
            }
            if !self.step() {
                assert!(done(self), "network idle before the condition held");
                return;
            }
        }
        panic!("no completion after {max} events");
    }

    /// Runs until nothing is in flight and no timer is armed.
    pub fn run_idle(&mut self, max: u64) {
        for _ in 0..max {
            if !self.step() {
                return;
            }
        }
        panic!("still busy after {max} events");
    }
}

/// Completions as (wr_id, status, opcode), for comparing.
pub fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode)> {
    wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}
