//! Shared receive queues over the simulated network: several QP pairs between two endpoints
//! whose receiving QPs (side 1) all take their WQEs from one `SharedRecvQueue`. Every posted
//! WQE is accounted for exactly once: it completes on the QP whose message used it (checked
//! by content, immediate data and the per-QP message order, C9-28) or is still in the SRQ.
//!
//! The SRQ is not in the seed (`ib-transport.md` §13.8 points at IBA ch. 10/11); the rows
//! exercised on the way are EXT-PSN-03 (a duplicate SEND is re-ACKed, not re-executed: it takes
//! no second WQE), IBT-C9-11 (multi-packet messages reassembled into the one WQE taken at
//! First), IBT-C9-28 (in-order execution per QP), EXT-PSN-05 (RNR retry), IBT-X-18 (a dropped
//! packet consumes no WQE).

mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use sim::{Faults, Setup, Sim, pair_qpns};
use softrdma_ib::{
    CreateError, IbQp, PostError, QpAttr, QpCaps, QpState, QpType, RecvWr, SendWr, Sge,
    SharedRecvQueue, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
use softrdma_memory::{KeyTable, PdId};
use softrdma_testkit::pattern;
use softrdma_wire::ib::Operation;

const PMTU: usize = 1024;
/// Octets of side 1's buffer per WQE: WQE `j` covers slot `j`. Also the largest message.
const SLOT: u64 = 8192;
const BUF: usize = 4 << 20;
const QKEY: u32 = 0x1111_1111;

/// `pairs` QP pairs of `ty`; side 1's QPs all take their receives from one SRQ of `max_wr`.
fn shared(
    ty: QpType,
    pairs: usize,
    setup: &Setup,
    faults: Faults,
    seed: u64,
    max_wr: u32,
) -> (Sim, Arc<SharedRecvQueue>) {
    let srq = Arc::new(SharedRecvQueue::new(PdId(1), max_wr, 4));
    let mut s = Sim::new_srq(ty, BUF, setup, faults, seed, [None, Some(srq.clone())]);
    while s.pairs() < pairs {
        s.add_pair(setup, [None, Some(srq.clone())]);
    }
    (s, srq)
}

/// Posts WQE `wr_id` to `srq`: slot `wr_id` of side 1's buffer, in two entries.
fn post_slot(s: &Sim, srq: &SharedRecvQueue, wr_id: u64) {
    let (k, at) = (s.n[1].key, wr_id * SLOT);
    let sges = vec![
        Sge::new(k, at, 1000),
        Sge::new(k, at + 1000, (SLOT - 1000) as u32),
    ];
    srq.post_recv(RecvWr::new(wr_id, sges), &s.n[1].keys)
        .unwrap();
}

/// Message `i` of pair `k`: its size, its place in side 0's buffer, its immediate data.
#[derive(Clone, Copy, Debug)]
struct Msg {
    k: usize,
    i: usize,
    size: usize,
}

impl Msg {
    fn new(k: usize, i: usize) -> Msg {
        // 0, 1, around the PMTU, and up to eight packets.
        let sizes = [
            0,
            1,
            PMTU - 1,
            PMTU,
            PMTU + 1,
            3000,
            4096,
            5000,
            SLOT as usize,
        ];
        Msg {
            k,
            i,
            size: sizes[(k * 7 + i * 5) % sizes.len()],
        }
    }

    fn off(&self) -> u64 {
        (self.k as u64 * 64 + self.i as u64) * SLOT
    }

    fn imm(&self) -> u32 {
        ((self.k as u32) << 16) | self.i as u32
    }

    fn data(&self, seed: u64) -> Vec<u8> {
        pattern(self.size, seed ^ u64::from(self.imm()) << 8)
    }

    /// Fills side 0 and posts the SEND with immediate (wr_id `i`) on pair `k`'s sender;
    /// UD datagrams go to pair `k`'s receiver.
    fn post(&self, s: &mut Sim, seed: u64) {
        s.n[0].fill(self.off() as usize, &self.data(seed));
        let sge = vec![Sge::new(s.n[0].key, self.off(), self.size as u32)];
        let mut wr = SendWr::send_with_imm(self.i as u64, sge, self.imm());
        if s.n[0].qp.qp_type() == QpType::Ud {
            wr = wr.to(UdDest {
                ah: 0,
                remote_qpn: pair_qpns(self.k)[1],
                remote_qkey: QKEY,
            });
        }
        s.node_mut(0, self.k).qp.post_send(wr).unwrap();
    }
}

/// Receive completions of every side-1 QP: (pair, completion).
fn recvs(s: &Sim) -> Vec<(usize, WorkCompletion)> {
    (0..s.pairs())
        .flat_map(|k| s.node(1, k).recvs.iter().map(move |w| (k, *w)))
        .collect()
}

/// Every completed WQE completed once; successful ones hold, on their pair, the pair's
/// messages in order (C9-28), byte for byte at the WQE's slot (shifted by the GRH on UD).
/// Returns the wr_ids that completed.
fn check_receives(s: &Sim, seed: u64) -> BTreeSet<u64> {
    let all = recvs(s);
    let ids: BTreeSet<u64> = all.iter().map(|(_, w)| w.wr_id).collect();
    assert_eq!(ids.len(), all.len(), "a WQE completed twice: {all:?}");
    let ud = s.n[1].qp.qp_type() == QpType::Ud;
    for k in 0..s.pairs() {
        let mut i = 0;
        for w in &s.node(1, k).recvs {
            if w.status != WcStatus::Success {
                continue;
            }
            let imm = w.imm.expect("every message carries immediate data");
            assert_eq!(imm >> 16, k as u32, "pair {k} got another pair's message");
            // UC and UD may lose messages; RC delivers each in order.
            let got = (imm & 0xFFFF) as usize;
            assert!(got >= i, "pair {k}: message {got} after {i}");
            if s.n[1].qp.qp_type() == QpType::Rc {
                assert_eq!(got, i, "pair {k}: RC message out of order");
            }
            i = got + 1;
            let m = Msg::new(k, got);
            let grh = if ud { 40 } else { 0 };
            assert_eq!(w.opcode, WcOpcode::Recv);
            assert_eq!(w.byte_len as usize, m.size + grh, "{m:?}");
            let at = (w.wr_id * SLOT) as usize + grh;
            assert!(
                s.n[1].read(at, m.size) == m.data(seed),
                "{m:?}: bytes differ in WQE {}",
                w.wr_id
            );
            if ud {
                assert_eq!(w.src_qp, Some(pair_qpns(k)[0]));
            }
        }
    }
    ids
}

/// Most side-1 QPs with a SEND in progress at once, from the delivered packets.
fn max_interleaved(s: &Sim) -> usize {
    let mut open = BTreeSet::new();
    let mut most = 0;
    for r in s.log.iter().filter(|r| !r.tx && r.from == 0) {
        match r.opcode.operation() {
            Operation::SendFirst => {
                open.insert(r.dest_qp);
            }
            Operation::SendLast | Operation::SendLastWithImmediate => {
                open.remove(&r.dest_qp);
            }
            _ => {}
        }
        most = most.max(open.len());
    }
    most
}

/// Four RC pairs share one SRQ holding exactly one WQE per message; each sender posts 40
/// SENDs with immediate of 0 to 8 packets, with a send window of 2 so the senders' packets
/// interleave mid-message at the responders. Every SEND completes, every WQE completes once
/// on the QP whose message it holds, byte for byte; the SRQ ends empty. How far the senders
/// interleaved ([`max_interleaved`]) is the seed's schedule: the callers check it.
fn rc_shared_run(faults: Faults, seed: u64) -> Sim {
    const PAIRS: usize = 4;
    const PER: usize = 40;
    let (mut s, srq) = shared(
        QpType::Rc,
        PAIRS,
        &Setup::default(),
        faults,
        seed,
        (PAIRS * PER) as u32,
    );
    s.capture = true;
    for j in 0..(PAIRS * PER) as u64 {
        post_slot(&s, &srq, j);
    }
    for k in 0..PAIRS {
        s.node_mut(0, k).qp.set_window(2);
    }
    for i in 0..PER {
        for k in 0..PAIRS {
            Msg::new(k, i).post(&mut s, seed);
        }
    }
    s.run_idle(10_000_000);
    for k in 0..PAIRS {
        let sends = &s.node(0, k).sends;
        assert_eq!(sends.len(), PER, "pair {k}");
        for (i, w) in sends.iter().enumerate() {
            assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::Success));
        }
        assert_eq!(s.node(1, k).recvs.len(), PER, "pair {k}");
        assert_eq!(s.node(1, k).qp.state(), QpState::Rts);
    }
    let ids = check_receives(&s, seed);
    assert_eq!(ids, (0..(PAIRS * PER) as u64).collect());
    assert!(srq.is_empty());
    s
}

/// Of the runs' seeds, how many had at least three senders mid-message at once. A loss early
/// in a run can leave the pairs apart for the rest of it (at 5 % loss about one seed in
/// 7,000 peaks at two), so runs over many seeds are held to most, not all.
fn interleaved_runs(faults: Faults, seeds: std::ops::Range<u64>) -> (usize, usize) {
    let n = (seeds.end - seeds.start) as usize;
    let k = seeds
        .filter(|&seed| max_interleaved(&rc_shared_run(faults, seed)) >= 3)
        .count();
    (k, n)
}

#[test]
fn rc_pairs_share_one_srq_clean_network() {
    let s = rc_shared_run(Faults::default(), 1);
    assert!(max_interleaved(&s) >= 3, "senders did not interleave");
    let dups: u64 = (0..s.pairs())
        .map(|k| s.node(1, k).qp.responder_counters().duplicates)
        .sum();
    assert_eq!(dups, 0);
}

fn lossy() -> Faults {
    Faults {
        loss: 0.05,
        dup: 0.02,
        reorder: 0.05,
        corrupt: 0.01,
    }
}

/// EXT-PSN-03 under an SRQ: at 5% loss with duplication and reordering, retransmitted and
/// duplicated SEND packets are answered as duplicates and take no second WQE (the exactly-once
/// accounting above would catch one).
#[test]
fn ext_psn_03_rc_pairs_share_one_srq_5_percent_loss() {
    let mut interleaved = 0;
    for seed in [2, 3, 4] {
        let s = rc_shared_run(lossy(), seed);
        let dups: u64 = (0..s.pairs())
            .map(|k| s.node(1, k).qp.responder_counters().duplicates)
            .sum();
        assert!(dups > 0, "seed {seed}: no duplicate reached a responder");
        assert!(s.stats.lost > 0 && s.stats.duplicated > 0);
        interleaved += usize::from(max_interleaved(&s) >= 3);
    }
    assert!(
        interleaved >= 2,
        "senders interleaved in {interleaved} of 3 runs"
    );
}

/// The same over many seeds: `SEEDS` at 5 % loss from `SEED_BASE` (default 300 from 100),
/// then a sixth as many at 20 % loss.
#[test]
#[ignore = "many seeds; run with --release -- --ignored"]
fn ext_psn_03_rc_pairs_share_one_srq_lossy_many_seeds() {
    let heavy = Faults {
        loss: 0.2,
        ..lossy()
    };
    let light = sim::seeds(300, 100);
    let heavy_seeds = light.end..light.end + (light.end - light.start).div_ceil(6);
    for (faults, seeds) in [(lossy(), light), (heavy, heavy_seeds)] {
        let (k, n) = interleaved_runs(faults, seeds);
        // A tenth may miss, and one always may (a single seed replayed).
        assert!(
            n - k <= (n / 10).max(1),
            "senders interleaved in only {k} of {n} runs"
        );
    }
}

/// EXT-PSN-05 / RNR over an SRQ: three RC pairs send into an empty SRQ: every responder
/// RNR-NAKs (an empty SRQ is an empty RQ, 9.7.5.2.8) and nothing is consumed; five WQEs
/// posted later go to the first five messages to be retried, each QP's completions in its
/// own order; the rest RNR-loop until the remaining WQEs arrive, then all complete.
#[test]
fn rnr_nak_while_srq_empty_then_recovery() {
    const PAIRS: usize = 3;
    const PER: usize = 4;
    let setup = Setup {
        min_rnr_timer: 3, // 0.03 ms
        ..Setup::default()
    };
    let (mut s, srq) = shared(QpType::Rc, PAIRS, &setup, Faults::default(), 5, 64);
    for i in 0..PER {
        for k in 0..PAIRS {
            Msg::new(k, i).post(&mut s, 5);
        }
    }
    let rnr = |s: &Sim, k: usize| s.node(1, k).qp.responder_counters().rnr_naks;
    s.run_until(1_000_000, |s| (0..PAIRS).all(|k| rnr(s, k) >= 3));
    assert!(recvs(&s).is_empty());
    assert!((0..PAIRS).all(|k| s.node(0, k).sends.is_empty()));
    for j in 0..5 {
        post_slot(&s, &srq, j);
    }
    s.run_until(1_000_000, |s| recvs(s).len() == 5);
    assert!(srq.is_empty());
    assert_eq!(check_receives(&s, 5), (0..5).collect());
    // The SRQ is empty again: the others keep getting RNR NAKs.
    let before: u64 = (0..PAIRS).map(|k| rnr(&s, k)).sum();
    s.run_until(1_000_000, |s| {
        (0..PAIRS).map(|k| rnr(s, k)).sum::<u64>() >= before + 6
    });
    assert_eq!(recvs(&s).len(), 5);
    for j in 5..(PAIRS * PER) as u64 {
        post_slot(&s, &srq, j);
    }
    s.run_until(1_000_000, |s| {
        (0..PAIRS).all(|k| s.node(0, k).sends.len() == PER)
    });
    s.run_idle(100_000);
    assert_eq!(check_receives(&s, 5), (0..(PAIRS * PER) as u64).collect());
    for k in 0..PAIRS {
        assert!(
            s.node(0, k)
                .sends
                .iter()
                .all(|w| w.status == WcStatus::Success)
        );
        assert!(s.node(0, k).qp.requester_counters().rnr_naks > 0);
    }
}

/// UC over an SRQ on a clean network: three pairs, every message delivered once into a WQE
/// of the SRQ, byte for byte.
#[test]
fn uc_pairs_share_one_srq() {
    let (mut s, srq) = shared(QpType::Uc, 3, &Setup::default(), Faults::default(), 6, 64);
    s.capture = true;
    for j in 0..30 {
        post_slot(&s, &srq, j);
    }
    for i in 0..10 {
        for k in 0..3 {
            Msg::new(k, i).post(&mut s, 6);
        }
    }
    s.run_idle(1_000_000);
    assert_eq!(check_receives(&s, 6), (0..30).collect());
    assert!(srq.is_empty());
    assert!(
        !s.log.is_empty() && s.log.iter().all(|r| r.from == 0),
        "UC answered"
    );
}

/// UC over an SRQ with 5% loss (no reordering: UC has no duplicate detection, a late Only is
/// a new message, 9.8.3): a message whose First is lost takes no WQE (IBT-X-18); a message
/// abandoned after its First cannot give its WQE back to the SRQ and completes it with
/// `RemoteInvalidRequest` on its QP (responder error class E, rxe `do_class_d1e_error`).
/// Every WQE is accounted for once: completed or still in the SRQ.
#[test]
fn uc_lossy_srq_accounts_for_every_wqe() {
    let faults = Faults::loss(0.05);
    const POSTED: u64 = 90;
    let (mut s, srq) = shared(QpType::Uc, 3, &Setup::default(), faults, 7, 128);
    for j in 0..POSTED {
        post_slot(&s, &srq, j);
    }
    for i in 0..30 {
        for k in 0..3 {
            Msg::new(k, i).post(&mut s, 7);
        }
    }
    s.run_idle(1_000_000);
    let ids = check_receives(&s, 7);
    assert_eq!(ids.len() + srq.len(), POSTED as usize);
    // The SRQ hands out WQEs in order: what completed is a prefix.
    assert_eq!(ids, (0..ids.len() as u64).collect());
    let all = recvs(&s);
    let ok = all
        .iter()
        .filter(|(_, w)| w.status == WcStatus::Success)
        .count();
    let class_e = all
        .iter()
        .filter(|(_, w)| w.status == WcStatus::RemoteInvalidRequest)
        .count();
    assert_eq!(ok + class_e, all.len(), "{all:?}");
    assert!(ok > 40, "{ok} delivered");
    assert!(class_e > 0, "no message was abandoned mid-way");
    assert!(
        !srq.is_empty(),
        "messages whose First was lost left their WQEs in the SRQ"
    );
}

/// UD over an SRQ: three UD QPs draw from 20 WQEs for 30 datagrams; the first 20 to arrive
/// take them (GRH area, source QP), the other 10 are dropped and counted as `no_wqe` on the
/// QP they reached (9.8.4: no RNR on UD).
#[test]
fn ud_pairs_share_one_srq() {
    let (mut s, srq) = shared(QpType::Ud, 3, &Setup::default(), Faults::default(), 8, 64);
    for j in 0..20 {
        post_slot(&s, &srq, j);
    }
    for i in 0..10 {
        for k in 0..3 {
            // Datagrams are single-packet: at most one PMTU.
            let mut m = Msg::new(k, i);
            m.size = m.size.min(PMTU);
            m.post(&mut s, 8);
        }
    }
    s.run_idle(100_000);
    // Msg::new picks sizes by index; datagram sizes were capped above, so check by hand.
    let all = recvs(&s);
    assert_eq!(all.len(), 20);
    let ids: BTreeSet<u64> = all.iter().map(|(_, w)| w.wr_id).collect();
    assert_eq!(ids, (0..20).collect());
    let mut next = BTreeMap::new();
    for (k, w) in &all {
        assert_eq!(w.status, WcStatus::Success);
        let imm = w.imm.unwrap();
        assert_eq!(imm >> 16, *k as u32);
        let i = (imm & 0xFFFF) as usize;
        let n = next.entry(*k).or_insert(0);
        assert_eq!(i, *n, "pair {k}: datagrams in order");
        *n += 1;
        let mut m = Msg::new(*k, i);
        m.size = m.size.min(PMTU);
        assert_eq!(w.byte_len as usize, 40 + m.size);
        assert_eq!(w.src_qp, Some(pair_qpns(*k)[0]));
        let at = (w.wr_id * SLOT) as usize + 40;
        assert!(s.n[1].read(at, m.size) == m.data(8), "{m:?}");
    }
    let no_wqe: u64 = (0..3)
        .map(|k| s.node(1, k).qp.responder_counters().no_wqe)
        .sum();
    assert_eq!(no_wqe, 10);
    assert!(srq.is_empty());
    for k in 0..3 {
        assert_eq!(s.node(0, k).sends.len(), 10);
    }
}

/// SRQ limit: armed at 5 over 20 WQEs, it fires once, on the take that leaves 4 (not at 5),
/// then reads 0 (disarmed); further takes do not fire; re-armed above the count it fires at
/// the next take.
#[test]
fn srq_limit_event_fires_once_when_crossing() {
    let (mut s, srq) = shared(QpType::Rc, 3, &Setup::default(), Faults::default(), 9, 32);
    for j in 0..20 {
        post_slot(&s, &srq, j);
    }
    srq.arm_limit(5).unwrap();
    for i in 0..5 {
        for k in 0..3 {
            Msg::new(k, i).post(&mut s, 9);
        }
    }
    s.run_idle(1_000_000);
    assert_eq!(srq.len(), 5);
    assert!(!srq.take_limit_event());
    assert_eq!(srq.limit(), 5);
    Msg::new(0, 5).post(&mut s, 9);
    s.run_idle(100_000);
    assert_eq!(srq.len(), 4);
    assert!(srq.take_limit_event());
    assert!(!srq.take_limit_event());
    assert_eq!(srq.limit(), 0);
    Msg::new(1, 5).post(&mut s, 9);
    Msg::new(2, 5).post(&mut s, 9);
    s.run_idle(100_000);
    assert_eq!(srq.len(), 2);
    assert!(!srq.take_limit_event());
    srq.arm_limit(3).unwrap();
    assert!(!srq.take_limit_event(), "arming does not fire by itself");
    Msg::new(0, 6).post(&mut s, 9);
    s.run_idle(100_000);
    assert!(srq.take_limit_event());
    assert_eq!(check_receives(&s, 9), (0..19).collect());
}

/// A QP over an SRQ goes to Error in the middle of a SEND: the WQE it took at the First
/// completes flushed on that QP (and only there), Last WQE Reached is reported once, and the
/// SRQ's other WQEs are not flushed: the other QPs use them. Receives posted to the QP are
/// refused; the failed QP takes no more WQEs while its peer retries.
#[test]
fn qp_error_flushes_its_wqe_in_progress_not_the_srq() {
    let (mut s, srq) = shared(QpType::Rc, 3, &Setup::default(), Faults::default(), 10, 32);
    for j in 0..6 {
        post_slot(&s, &srq, j);
    }
    // Pair 0's SEND never gets past its First: the network loses its Middle and Last.
    let victim = pair_qpns(0)[1];
    s.drop_filter = Some(Box::new(move |from, p| {
        from == 0
            && p.bth.dest_qp == victim
            && matches!(
                p.bth.opcode.operation(),
                Operation::SendMiddle | Operation::SendLastWithImmediate
            )
    }));
    let m = Msg {
        k: 0,
        i: 0,
        size: 3000,
    };
    m.post(&mut s, 10);
    let q = srq.clone();
    s.run_until(10_000, move |_| q.len() == 5);
    assert!(recvs(&s).is_empty());
    let n = s.node_mut(1, 0);
    assert_eq!(
        n.qp.post_recv(RecvWr::new(99, vec![])),
        Err(PostError::SrqAttached)
    );
    n.qp.modify(&QpAttr::state(QpState::Error)).unwrap();
    n.drain();
    assert_eq!(
        n.recvs
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(0, WcStatus::WorkRequestFlushed)]
    );
    assert!(n.qp.take_last_wqe_reached());
    assert!(!n.qp.take_last_wqe_reached());
    assert_eq!(srq.len(), 5);
    // The other QPs go on with the SRQ's WQEs.
    for i in 0..2 {
        for k in 1..3 {
            Msg::new(k, i).post(&mut s, 10);
        }
    }
    s.run_until(1_000_000, |s| {
        (1..3).all(|k| s.node(0, k).sends.len() == 2) && recvs(s).len() == 5
    });
    assert_eq!(srq.len(), 1);
    assert_eq!(check_receives(&s, 10), (0..5).collect());
    for k in 1..3 {
        assert!(
            s.node(1, k)
                .recvs
                .iter()
                .all(|w| w.status == WcStatus::Success)
        );
        assert!(!s.node_mut(1, k).qp.take_last_wqe_reached());
    }
    // Pair 0's requester retries into a QP in Error until it gives up; no WQE is taken.
    s.run_until(10_000_000, |s| !s.node(0, 0).sends.is_empty());
    assert_eq!(s.node(0, 0).sends[0].status, WcStatus::RetryExceeded);
    assert_eq!(srq.len(), 1);
    assert_eq!(s.node(1, 0).recvs.len(), 1);
    assert!(s.node(1, 0).qp.counters().bad_state > 0);
}

/// A QP and an SRQ of different protection domains: refused at creation. Any QP type may
/// attach; QPs without one keep `post_recv`.
#[test]
fn srq_of_another_domain_is_refused() {
    let keys = Arc::new(KeyTable::new());
    let srq = Arc::new(SharedRecvQueue::new(PdId(2), 8, 1));
    let r = IbQp::new_with_srq(
        5,
        QpType::Rc,
        PdId(1),
        QpCaps::default(),
        keys.clone(),
        srq.clone(),
    );
    assert_eq!(
        r.err(),
        Some(CreateError::SrqPd {
            qp: PdId(1),
            srq: PdId(2)
        })
    );
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let qp = IbQp::new_with_srq(6, ty, PdId(2), QpCaps::default(), keys.clone(), srq.clone())
            .unwrap();
        assert!(Arc::ptr_eq(qp.srq().unwrap(), &srq));
    }
    let own = IbQp::new(7, QpType::Rc, PdId(2), QpCaps::default(), keys);
    assert!(own.srq().is_none());
}
