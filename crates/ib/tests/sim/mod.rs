//! A seeded simulated network between two [`IbQp`]s: every packet is wrapped in real RoCEv2
//! (IPv4 | UDP | BTH .. | ICRC) and checked on arrival as a driver does, with loss,
//! duplication, reordering and corruption drawn from a seeded RNG and virtual time, so a
//! failing seed replays exactly. Optionally every packet is logged ([`Sim::capture`]: what
//! each side put on the wire and what was delivered) and chosen packets are dropped
//! ([`Sim::drop_filter`]) for targeted fault injection.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softrdma_ib::{IbQp, QpAttr, QpCaps, QpState, QpType, WorkCompletion};
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId};
use softrdma_wire::ib::{Opcode, PacketRepr, RethRepr, Syndrome};
use softrdma_wire::rocev2::{IpRepr, Ipv4Repr, RoceV2Repr, UdpChecksum, UdpRepr};

pub const ADDR: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)];

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

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
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

impl Node {
    /// A QP of `ty` (number `qpn`) with a `len`-octet region registered at iova 0.
    pub fn new(ty: QpType, qpn: u32, len: usize, seed: u64) -> Node {
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
        let caps = QpCaps {
            max_send_wr: 1 << 16,
            max_recv_wr: 1 << 16,
            window: 64,
            ..QpCaps::default()
        };
        let qp = IbQp::new(qpn, ty, PdId(1), caps, keys.clone());
        Node {
            qp,
            keys,
            buf,
            key,
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

/// A deterministic byte pattern (xorshift) for byte-verifying transfers.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
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

pub struct Sim {
    pub n: [Node; 2],
    pub now: Instant,
    pub faults: Faults,
    pub stats: NetStats,
    rng: StdRng,
    wire: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Serialisation time per packet and one-way latency.
    pub per_packet: Duration,
    pub latency: Duration,
    link_free: [Instant; 2],
    scratch: Vec<u8>,
    /// Transmissions are paused on a side (to starve or overflow on purpose).
    pub hold: [bool; 2],
    start: Instant,
    /// Log every packet sent and delivered in [`Sim::log`].
    pub capture: bool,
    pub log: Vec<Rec>,
    /// Packets for which this returns true are lost (counted in `stats.lost`).
    pub drop_filter: Option<DropFilter>,
}

impl Sim {
    pub fn new(ty: QpType, len: usize, setup: &Setup, faults: Faults, seed: u64) -> Sim {
        let mut a = Node::new(ty, 0x11, len, seed);
        let mut b = Node::new(ty, 0x22, len, seed ^ 0x5555);
        connect(&mut a, 0, 0x22, setup);
        connect(&mut b, 1, 0x11, setup);
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
            now,
            faults,
            stats: NetStats::default(),
            rng: StdRng::seed_from_u64(seed),
            wire: BinaryHeap::new(),
            seq: 0,
            per_packet: Duration::from_nanos(300),
            latency: Duration::from_micros(5),
            link_free: [now; 2],
            scratch: Vec::new(),
            hold: [false; 2],
            start: now,
            capture: false,
            log: Vec::new(),
            drop_filter: None,
        }
    }

    fn encap(&self, from: usize, pkt: &[u8]) -> Vec<u8> {
        let p = PacketRepr::parse(pkt).expect("engine emits parseable packets");
        let r = RoceV2Repr {
            ip: IpRepr::Ipv4(Ipv4Repr::new_udp(ADDR[from], ADDR[1 - from])),
            udp: UdpRepr::rocev2(0xC000 | from as u16),
            packet: p,
        };
        let mut out = vec![0; r.buffer_len()];
        let n = r.emit(&mut out, UdpChecksum::Zero).unwrap();
        out.truncate(n);
        out
    }

    /// Virtual time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.now.duration_since(self.start)
    }

    fn send(&mut self, from: usize, bytes: Vec<u8>) {
        self.stats.sent += 1;
        let f = self.faults;
        let p = PacketRepr::parse(&bytes[28..bytes.len() - 4]).unwrap();
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
                let p = PacketRepr::parse(&bytes[28..bytes.len() - 4]).unwrap();
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
            let mut b = bytes.clone();
            if self.rng.random_bool(f.corrupt) {
                self.stats.corrupted += 1;
                let at = self.rng.random_range(28..b.len());
                b[at] ^= 1 << self.rng.random_range(0..8);
            }
            self.seq += 1;
            self.wire.push(Reverse(InFlight {
                at: at + Duration::from_nanos(i * 700),
                seq: self.seq,
                to: 1 - from,
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
            let mut out = std::mem::take(&mut self.scratch);
            while let Some(tx) = self.n[side].qp.poll_transmit(self.now, &mut out) {
                let bytes = self.encap(side, &out[..tx.len]);
                self.send(side, bytes);
            }
            self.scratch = out;
            self.n[side].collect();
        }
    }

    fn deliver(&mut self, f: InFlight) {
        let Ok(r) = RoceV2Repr::parse(&f.bytes) else {
            // ICRC mismatch or a header the corruption broke: dropped and counted (IBT-X-20).
            self.stats.bad_icrc += 1;
            return;
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
        let node = &mut self.n[f.to];
        if r.packet.bth.dest_qp != node.qp.qpn() {
            return;
        }
        // As a driver does (rxe): an IPv4 header fills the last 20 octets of the GRH area.
        let mut grh = [0u8; 40];
        grh[20..].copy_from_slice(&f.bytes[..20]);
        node.qp.handle_packet(&r.packet, &grh, self.now);
        node.collect();
    }

    /// Delivers `p` to side `to` now, as if side `1 - to` had sent it (RoCEv2-wrapped with a
    /// valid ICRC, logged, no faults).
    pub fn inject(&mut self, to: usize, p: &PacketRepr<'_>) {
        let mut b = vec![0; p.buffer_len()];
        let n = p.emit(&mut b).unwrap();
        b.truncate(n);
        let bytes = self.encap(1 - to, &b);
        self.deliver(InFlight {
            at: self.now,
            seq: 0,
            to,
            bytes,
        });
    }

    /// One event: deliver the next packet or fire the next timer. False when idle.
    pub fn step(&mut self) -> bool {
        self.pump();
        let next_pkt = self.wire.peek().map(|Reverse(f)| f.at);
        let next_timer = [0, 1]
            .into_iter()
            .filter_map(|i| self.n[i].qp.poll_timeout())
            .min();
        match (next_pkt, next_timer) {
            (Some(p), t) if t.is_none_or(|t| p <= t) => {
                let Reverse(f) = self.wire.pop().unwrap();
                self.now = self.now.max(f.at);
                self.deliver(f);
            }
            (_, Some(t)) => {
                self.now = self.now.max(t);
                for i in 0..2 {
                    self.n[i].qp.handle_timeout(self.now);
                    self.n[i].collect();
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
