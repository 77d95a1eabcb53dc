//! 10,000 mixed RC operations over a seeded lossy, reordering, duplicating, corrupting
//! network: every byte right, completions in posting order, atomics executed exactly once.

mod sim;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sim::{Faults, Setup, Sim};
use softrdma_ib::{QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus};

const OPS: usize = 10_000;
const SLOT: usize = 4096;
const MAX_LEN: usize = 2500;
/// Layout of both regions: [slots A][slots B][counter].
const AREA: usize = OPS * SLOT;
const COUNTER: usize = 2 * AREA;
const REGION: usize = 2 * AREA + 64;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Send(usize),
    Write(usize),
    Read(usize),
    FetchAdd,
}

fn fill_random(rng: &mut StdRng, n: &sim::Node, off: usize, len: usize) {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    n.fill(off, &v);
}

fn run(faults: Faults, seed: u64) {
    let setup = Setup {
        timeout: 6, // 262 µs of virtual time
        ..Setup::default()
    };
    let mut s = Sim::new(QpType::Rc, REGION, &setup, faults, seed);
    let mut rng = StdRng::seed_from_u64(seed);
    // a's slots A: sources of SEND/WRITE; b's slots B: sources of READ.
    fill_random(&mut rng, &s.n[0], 0, AREA);
    fill_random(&mut rng, &s.n[1], AREA, AREA);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let mut ops = Vec::with_capacity(OPS);
    for i in 0..OPS {
        let len = rng.random_range(0..=MAX_LEN);
        let op = match rng.random_range(0..10) {
            0..=2 => Op::Send(len),
            3..=5 => Op::Write(len),
            6..=8 => Op::Read(len),
            _ => Op::FetchAdd,
        };
        let off = (i * SLOT) as u64;
        let wr = match op {
            Op::Send(len) => {
                // b receives into its slot i of area A.
                s.n[1]
                    .qp
                    .post_recv(RecvWr::new(i as u64, vec![Sge::new(k1, off, SLOT as u32)]))
                    .unwrap();
                SendWr::send(i as u64, vec![Sge::new(k0, off, len as u32)])
            }
            Op::Write(len) => SendWr::write(i as u64, vec![Sge::new(k0, off, len as u32)], k1, off),
            Op::Read(len) => SendWr::read(
                i as u64,
                Some(Sge::new(k0, AREA as u64 + off, len as u32)),
                k1,
                AREA as u64 + off,
            ),
            Op::FetchAdd => SendWr::fetch_add(
                i as u64,
                Sge::new(k0, AREA as u64 + off, 8),
                k1,
                COUNTER as u64,
                1,
            ),
        };
        s.n[0].qp.post_send(wr).unwrap();
        ops.push(op);
    }
    s.run_until(50_000_000, |s| s.n[0].sends.len() == OPS);
    // Completions: all, successful, in posting order (C9-30, C9-32).
    for (i, wc) in s.n[0].sends.iter().enumerate() {
        assert_eq!(wc.wr_id, i as u64, "completion order");
        assert_eq!(wc.status, WcStatus::Success, "op {i} {:?}", ops[i]);
    }
    let sends: Vec<usize> = (0..OPS)
        .filter(|&i| matches!(ops[i], Op::Send(_)))
        .collect();
    assert_eq!(s.n[1].recvs.len(), sends.len());
    let mut originals = Vec::new();
    for (j, &i) in sends.iter().enumerate() {
        let wc = s.n[1].recvs[j];
        let Op::Send(len) = ops[i] else {
            unreachable!()
        };
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(wc.byte_len as usize, len);
    }
    for (i, op) in ops.iter().enumerate() {
        let off = i * SLOT;
        match *op {
            Op::Send(len) | Op::Write(len) => {
                assert_eq!(
                    s.n[1].read(off, len),
                    s.n[0].read(off, len),
                    "op {i} {op:?}"
                );
            }
            Op::Read(len) => {
                assert_eq!(
                    s.n[0].read(AREA + off, len),
                    s.n[1].read(AREA + off, len),
                    "op {i}"
                );
            }
            Op::FetchAdd => {
                originals.push(u64::from_ne_bytes(
                    s.n[0].read(AREA + off, 8).try_into().unwrap(),
                ));
            }
        }
    }
    // Exactly once: the counter equals the number of FetchAdds and the originals seen are
    // 0, 1, 2, ... in posting order (responder executes in PSN order, C9-28).
    let n = originals.len() as u64;
    assert_eq!(
        u64::from_ne_bytes(s.n[1].read(COUNTER, 8).try_into().unwrap()),
        n
    );
    assert_eq!(originals, (0..n).collect::<Vec<_>>());
    let st = s.stats;
    let rq = s.n[0].qp.requester_counters();
    eprintln!(
        "faults {faults:?}: {st:?}; requester {rq:?}; responder {:?}",
        s.n[1].qp.responder_counters()
    );
    if faults.loss > 0.0 {
        assert!(st.lost > 0 && rq.retransmitted > 0);
    }
    if faults.corrupt > 0.0 {
        assert!(st.bad_icrc > 0);
    }
}

fn mixed(loss: f64) -> Faults {
    Faults {
        loss,
        dup: 0.01,
        reorder: 0.01,
        corrupt: 0.005,
    }
}

#[test]
fn mixed_ops_1_percent_loss() {
    run(mixed(0.01), 1);
}

#[test]
fn mixed_ops_5_percent_loss() {
    run(mixed(0.05), 5);
}

#[test]
fn mixed_ops_20_percent_loss() {
    run(mixed(0.20), 20);
}

#[test]
fn mixed_ops_clean_network() {
    run(Faults::default(), 0);
}

/// The 20 % case over many seeds (slow; `cargo test --release -p softrdma-ib --test rc_lossy
/// -- --ignored`): completion at this loss rate depends on the retry counter never running out
/// on one request, so one seed passing says little.
#[test]
#[ignore]
fn mixed_ops_20_percent_loss_many_seeds() {
    // Any range: SEEDS seeds from SEED_BASE (default 20 from 100).
    for seed in sim::seeds(20, 100) {
        run(mixed(0.20), seed);
    }
}
