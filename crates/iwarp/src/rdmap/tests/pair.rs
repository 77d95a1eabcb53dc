//! The test harness: a `Pair` of engines exchanging ULPDUs in memory, each with its own
//! `KeyTable` and real `Buffer`s. Deterministic: seeded key tables, a fixed poll order, and
//! `step()` / `drive()` moving at most `burst` ULPDUs per side per step.

use std::collections::VecDeque;
use std::sync::Arc;

use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId, QpId};
use softrdma_wire::ddp;
use softrdma_wire::rdmap::Opcode;

use crate::rdmap::{QpConfig, QpEvent, RdmapEngine};
use crate::verbs_types::{Sge, WorkCompletion};

pub(super) const PD: PdId = PdId(1);
pub(super) const QP_A: QpId = QpId(10);
pub(super) const QP_B: QpId = QpId(20);
/// Unregistered octets on both sides of every test region.
pub(super) const GUARD: usize = 4096;
/// Filler of the guard octets.
pub(super) const GUARD_BYTE: u8 = 0xE5;

/// Direction of a ULPDU on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    AtoB,
    BtoA,
}

/// Rewrites a ULPDU in flight; returning `false` drops it.
pub(super) type Tamper = Box<dyn FnMut(Dir, &mut Vec<u8>) -> bool>;

/// A configuration for one side.
pub(super) fn cfg(qp: QpId, mulpdu: u16) -> QpConfig {
    let mut c = QpConfig::new(PD, qp);
    c.mulpdu = mulpdu;
    c.sq_depth = 4096;
    c.rq_depth = 4096;
    c
}

/// A registered region `[GUARD, GUARD + len)` of a buffer with guard octets around it.
pub(super) struct Mr {
    pub buf: Arc<Buffer>,
    pub key: Key,
    pub iova: u64,
    pub len: usize,
}

impl Mr {
    /// Registers `len` octets at `iova` in `pd` with `access` (plain region).
    pub fn new(keys: &KeyTable, pd: PdId, len: usize, iova: u64, access: Access) -> Mr {
        let buf = Buffer::new(len + 2 * GUARD);
        buf.write().fill(GUARD_BYTE);
        buf.write()[GUARD..GUARD + len].fill(0);
        let key = keys
            .reg_mr(pd, buf.clone(), GUARD, len, iova, access)
            .expect("register");
        Mr {
            buf,
            key,
            iova,
            len,
        }
    }

    /// As [`new`](Mr::new), fast-registered (remotely invalidatable).
    pub fn fast(keys: &KeyTable, pd: PdId, len: usize, iova: u64, access: Access) -> Mr {
        let buf = Buffer::new(len + 2 * GUARD);
        buf.write().fill(GUARD_BYTE);
        buf.write()[GUARD..GUARD + len].fill(0);
        let key = keys
            .reg_fast_mr(pd, buf.clone(), GUARD, len, iova, access)
            .expect("register");
        Mr {
            buf,
            key,
            iova,
            len,
        }
    }

    /// `len` octets at region offset `off`.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge::new(self.key, self.iova + off as u64, len as u32)
    }

    /// Region octets.
    pub fn bytes(&self) -> Vec<u8> {
        self.buf.read()[GUARD..GUARD + self.len].to_vec()
    }

    /// Writes region octets at `off`.
    pub fn put(&self, off: usize, data: &[u8]) {
        self.buf.write()[GUARD + off..GUARD + off + data.len()].copy_from_slice(data);
    }

    /// The whole buffer, guards included.
    pub fn snapshot(&self) -> Vec<u8> {
        self.buf.read().to_vec()
    }

    /// No octet outside the registered range differs from its filler.
    pub fn assert_guards_intact(&self) {
        let all = self.buf.read();
        assert!(
            all[..GUARD].iter().all(|&b| b == GUARD_BYTE),
            "octet before the region changed"
        );
        assert!(
            all[GUARD + self.len..].iter().all(|&b| b == GUARD_BYTE),
            "octet after the region changed"
        );
    }
}

/// Two engines connected back to back.
pub(super) struct Pair {
    pub a: RdmapEngine,
    pub b: RdmapEngine,
    pub ka: Arc<KeyTable>,
    pub kb: Arc<KeyTable>,
    /// Every ULPDU that crossed, in order, when `record` is set.
    pub wire: Vec<(Dir, Vec<u8>)>,
    pub record: bool,
    /// ULPDUs each side may emit per step.
    pub burst: usize,
    pub tamper: Option<Tamper>,
    flight: [VecDeque<Vec<u8>>; 2],
}

impl Pair {
    /// Both sides with `mulpdu` and default limits.
    pub fn new(mulpdu: u16) -> Pair {
        Pair::with(cfg(QP_A, mulpdu), cfg(QP_B, mulpdu))
    }

    pub fn with(a: QpConfig, b: QpConfig) -> Pair {
        let ka = Arc::new(KeyTable::with_seed(0xA));
        let kb = Arc::new(KeyTable::with_seed(0xB));
        Pair::with_tables(a, b, ka, kb)
    }

    /// As [`with`](Pair::with) over given key tables (several pairs may share one side's).
    pub fn with_tables(a: QpConfig, b: QpConfig, ka: Arc<KeyTable>, kb: Arc<KeyTable>) -> Pair {
        Pair {
            a: RdmapEngine::new(a, ka.clone()),
            b: RdmapEngine::new(b, kb.clone()),
            ka,
            kb,
            wire: Vec::new(),
            record: true,
            burst: usize::MAX,
            tamper: None,
            flight: [VecDeque::new(), VecDeque::new()],
        }
    }

    fn pull(&mut self, dir: Dir) -> usize {
        let mut moved = 0;
        while moved < self.burst {
            let mut out = Vec::new();
            let eng = match dir {
                Dir::AtoB => &mut self.a,
                Dir::BtoA => &mut self.b,
            };
            let Some(n) = eng.poll_ulpdu(&mut out) else {
                break;
            };
            assert_eq!(n, out.len());
            assert!(n <= usize::from(eng.config().mulpdu), "ULPDU above MULPDU");
            moved += 1;
            if let Some(t) = self.tamper.as_mut()
                && !t(dir, &mut out)
            {
                continue;
            }
            if self.record {
                self.wire.push((dir, out.clone()));
            }
            self.flight[dir as usize].push_back(out);
        }
        moved
    }

    /// Each side emits up to `burst` ULPDUs, then everything in flight is delivered.
    /// Returns the number of ULPDUs emitted.
    pub fn step(&mut self) -> usize {
        let moved = self.pull(Dir::AtoB) + self.pull(Dir::BtoA);
        while let Some(u) = self.flight[0].pop_front() {
            self.b.handle_ulpdu(&u);
        }
        while let Some(u) = self.flight[1].pop_front() {
            self.a.handle_ulpdu(&u);
        }
        moved
    }

    /// A emits up to `burst` ULPDUs and B receives them; B sends nothing.
    pub fn pull_only_a(&mut self) -> usize {
        let moved = self.pull(Dir::AtoB);
        while let Some(u) = self.flight[0].pop_front() {
            self.b.handle_ulpdu(&u);
        }
        moved
    }

    /// Steps until neither side has anything to send.
    pub fn drive(&mut self) {
        for _ in 0..10_000_000 {
            if self.step() == 0 {
                return;
            }
        }
        panic!("pair did not settle");
    }

    /// Hands a hand-made ULPDU to the receiving side of `dir` (a hostile peer).
    pub fn inject(&mut self, dir: Dir, ulpdu: &[u8]) {
        if self.record {
            self.wire.push((dir, ulpdu.to_vec()));
        }
        match dir {
            Dir::AtoB => self.b.handle_ulpdu(ulpdu),
            Dir::BtoA => self.a.handle_ulpdu(ulpdu),
        }
    }

    pub fn cq_a(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.a.poll_completion()).collect()
    }

    pub fn cq_b(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.b.poll_completion()).collect()
    }

    pub fn events_a(&mut self) -> Vec<QpEvent> {
        std::iter::from_fn(|| self.a.poll_event()).collect()
    }

    pub fn events_b(&mut self) -> Vec<QpEvent> {
        std::iter::from_fn(|| self.b.poll_event()).collect()
    }

    /// The recorded ULPDUs of one direction.
    pub fn sent(&self, dir: Dir) -> Vec<&[u8]> {
        self.wire
            .iter()
            .filter(|(d, _)| *d == dir)
            .map(|(_, u)| &u[..])
            .collect()
    }

    /// The recorded ULPDUs of one direction carrying `opcode`.
    pub fn sent_op(&self, dir: Dir, opcode: Opcode) -> Vec<&[u8]> {
        self.sent(dir)
            .into_iter()
            .filter(|u| opcode_of(u) == Some(opcode))
            .collect()
    }
}

/// The RDMAP opcode of a ULPDU (read raw, so that tampered segments still show theirs).
pub(super) fn opcode_of(ulpdu: &[u8]) -> Option<Opcode> {
    let octet = *ulpdu.get(1)?;
    Opcode::try_from(octet & softrdma_wire::rdmap::MASK_OPCODE).ok()
}

/// The DDP header of a ULPDU.
pub(super) fn ddp_of(ulpdu: &[u8]) -> ddp::Repr {
    ddp::Repr::parse(ulpdu).expect("DDP header")
}
