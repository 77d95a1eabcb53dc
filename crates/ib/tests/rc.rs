//! RC end to end over the simulated network: every operation at the sizes around the PMTU,
//! byte-verified, lossless and lossy.

mod sim;

use sim::{Faults, Setup, Sim};
use softrdma_ib::{QpType, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus};
use softrdma_testkit::pattern;

const PMTU: usize = 1024;

fn sizes() -> Vec<usize> {
    vec![0, 1, PMTU - 1, PMTU, PMTU + 1, 1 << 20]
}

fn sim(len: usize, faults: Faults, seed: u64) -> Sim {
    Sim::new(QpType::Rc, len, &Setup::default(), faults, seed)
}

#[test]
fn send_every_size_lossless() {
    for (i, size) in sizes().into_iter().enumerate() {
        let mut s = sim(2 << 20, Faults::default(), i as u64);
        let data = pattern(size, i as u64);
        s.n[0].fill(0, &data);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        s.n[1]
            .qp
            .post_recv(RecvWr::new(7, vec![Sge::new(k1, 4096, size as u32 + 5)]))
            .unwrap();
        s.n[0]
            .qp
            .post_send(SendWr::send(1, vec![Sge::new(k0, 0, size as u32)]))
            .unwrap();
        s.run_until(1_000_000, |s| {
            !s.n[1].recvs.is_empty() && !s.n[0].sends.is_empty()
        });
        let r = s.n[1].recvs[0];
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (7, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(r.byte_len as usize, size);
        assert_eq!(s.n[1].read(4096, size), data, "size {size}");
        let w = s.n[0].sends[0];
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            (1, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(w.byte_len as usize, size);
    }
}

#[test]
fn write_and_read_every_size_lossless() {
    for (i, size) in sizes().into_iter().enumerate() {
        let mut s = sim(4 << 20, Faults::default(), 100 + i as u64);
        let data = pattern(size, i as u64 + 50);
        s.n[0].fill(1, &data);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        // WRITE a's [1, 1+size) to b's [3, ..); READ it back into a's [2 MiB + 5, ..).
        s.n[0]
            .qp
            .post_send(SendWr::write(1, vec![Sge::new(k0, 1, size as u32)], k1, 3))
            .unwrap();
        s.n[0]
            .qp
            .post_send(SendWr::read(
                2,
                Some(Sge::new(k0, (2 << 20) + 5, size as u32)),
                k1,
                3,
            ))
            .unwrap();
        s.run_until(1_000_000, |s| s.n[0].sends.len() == 2);
        let w = &s.n[0].sends;
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].opcode),
            (1, WcStatus::Success, WcOpcode::RdmaWrite)
        );
        assert_eq!(
            (w[1].wr_id, w[1].status, w[1].opcode),
            (2, WcStatus::Success, WcOpcode::RdmaRead)
        );
        assert_eq!(w[1].byte_len as usize, size);
        assert_eq!(s.n[1].read(3, size), data, "write size {size}");
        assert_eq!(s.n[0].read((2 << 20) + 5, size), data, "read size {size}");
        assert!(s.n[1].recvs.is_empty());
    }
}

#[test]
fn immediate_data_and_atomics() {
    let mut s = sim(1 << 16, Faults::default(), 9);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, &pattern(3000, 1));
    s.n[1].fill(64, &40u64.to_ne_bytes());
    for id in 0..2 {
        s.n[1]
            .qp
            .post_recv(RecvWr::new(id, vec![Sge::new(k1, 8192, 4096)]))
            .unwrap();
    }
    let qp = &mut s.n[0].qp;
    qp.post_send(SendWr::send_with_imm(
        1,
        vec![Sge::new(k0, 0, 3000)],
        0xDEAD_BEEF,
    ))
    .unwrap();
    qp.post_send(SendWr::write_with_imm(
        2,
        vec![Sge::new(k0, 0, 2000)],
        k1,
        16384,
        0x1234,
    ))
    .unwrap();
    qp.post_send(SendWr::fetch_add(3, Sge::new(k0, 4096, 8), k1, 64, 2))
        .unwrap();
    qp.post_send(SendWr::cmp_swap(4, Sge::new(k0, 4104, 8), k1, 64, 42, 7))
        .unwrap();
    qp.post_send(SendWr::cmp_swap(5, Sge::new(k0, 4112, 8), k1, 64, 42, 9))
        .unwrap();
    s.run_until(100_000, |s| {
        s.n[0].sends.len() == 5 && s.n[1].recvs.len() == 2
    });
    let r = &s.n[1].recvs;
    assert_eq!(
        (r[0].opcode, r[0].imm, r[0].byte_len),
        (WcOpcode::Recv, Some(0xDEAD_BEEF), 3000)
    );
    assert_eq!(
        (r[1].opcode, r[1].imm, r[1].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(0x1234), 2000)
    );
    assert_eq!(s.n[1].read(8192, 3000), pattern(3000, 1));
    assert_eq!(s.n[1].read(16384, 2000), pattern(3000, 1)[..2000]);
    let ops: Vec<_> = s.n[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(
        ops,
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::FetchAdd),
            (4, WcStatus::Success, WcOpcode::CompSwap),
            (5, WcStatus::Success, WcOpcode::CompSwap),
        ]
    );
    let word = |n: &sim::Node, off| u64::from_ne_bytes(n.read(off, 8).try_into().unwrap());
    assert_eq!(word(&s.n[0], 4096), 40); // FetchAdd saw 40, made 42
    assert_eq!(word(&s.n[0], 4104), 42); // CmpSwap 42 -> 7
    assert_eq!(word(&s.n[0], 4112), 7); // CmpSwap 42 -> 9 failed, saw 7
    assert_eq!(word(&s.n[1], 64), 7);
}

#[test]
fn unsignaled_requests_complete_silently_in_order() {
    let mut s = sim(1 << 16, Faults::default(), 3);
    let k1 = s.n[1].key;
    let k0 = s.n[0].key;
    for i in 0..10u64 {
        let flags = if i % 3 == 2 {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        s.n[0]
            .qp
            .post_send(SendWr::write(i, vec![Sge::new(k0, 0, 100)], k1, 0).with_flags(flags))
            .unwrap();
    }
    s.run_idle(100_000);
    let ids: Vec<_> = s.n[0].sends.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![2, 5, 8]);
    assert_eq!(s.n[0].qp.sq_outstanding(), 0);
}
