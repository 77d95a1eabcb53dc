//! One 64 MiB RDMA WRITE and one 64 MiB RDMA READ over the lossless simulated network at
//! PMTU 4096 (16,384 packets each way), byte-verified.

mod sim;

use sim::{Faults, Setup, Sim};
use softrdma_ib::{QpType, SendWr, Sge, WcOpcode, WcStatus};
use softrdma_testkit::pattern;

const LEN: usize = 64 << 20;

#[test]
fn write_and_read_64_mib_pmtu_4096() {
    let setup = Setup {
        pmtu: 4096,
        ..Setup::default()
    };
    let mut s = Sim::new(QpType::Rc, 2 * LEN, &setup, Faults::default(), 64);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let data = pattern(LEN, 64);
    s.n[0].fill(0, &data);
    // WRITE a[0, 64 MiB) to b[64 MiB, ..); READ it back into a[64 MiB, ..).
    s.n[0]
        .qp
        .post_send(SendWr::write(
            1,
            vec![Sge::new(k0, 0, LEN as u32)],
            k1,
            LEN as u64,
        ))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::read(
            2,
            Some(Sge::new(k0, LEN as u64, LEN as u32)),
            k1,
            LEN as u64,
        ))
        .unwrap();
    s.run_until(1_000_000, |s| s.n[0].sends.len() == 2);
    let w: Vec<_> = s.n[0]
        .sends
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len as usize))
        .collect();
    assert_eq!(
        w,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, LEN),
            (2, WcStatus::Success, WcOpcode::RdmaRead, LEN)
        ]
    );
    assert!(s.n[1].read(LEN, LEN) == data, "WRITE data differs");
    assert!(s.n[0].read(LEN, LEN) == data, "READ data differs");
    let c = s.n[0].qp.requester_counters();
    eprintln!(
        "{c:?} {:?} {:?}",
        s.n[1].qp.responder_counters(),
        s.elapsed()
    );
    assert_eq!((c.packets, c.retransmitted), (LEN as u64 / 4096 + 1, 0));
}

/// UC: one 64 MiB SEND and one 64 MiB RDMA WRITE over the lossless simulated network.
#[test]
fn uc_send_and_write_64_mib() {
    let mut s = Sim::new(
        QpType::Uc,
        2 * LEN,
        &Setup::default(),
        Faults::default(),
        65,
    );
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let data = pattern(LEN, 65);
    s.n[0].fill(0, &data);
    s.n[1]
        .qp
        .post_recv(softrdma_ib::RecvWr::new(
            7,
            vec![Sge::new(k1, LEN as u64, LEN as u32)],
        ))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, LEN as u32)]))
        .unwrap();
    s.run_until(1_000_000, |s| !s.n[1].recvs.is_empty());
    let r = s.n[1].recvs[0];
    assert_eq!(
        (r.wr_id, r.status, r.byte_len as usize),
        (7, WcStatus::Success, LEN)
    );
    assert!(s.n[1].read(LEN, LEN) == data, "SEND data differs");
    s.n[1].fill(0, &vec![0; 4096]);
    s.n[0]
        .qp
        .post_send(SendWr::write(2, vec![Sge::new(k0, 0, LEN as u32)], k1, 0))
        .unwrap();
    s.run_idle(1_000_000);
    assert!(s.n[1].read(0, LEN) == data, "WRITE data differs");
    let w: Vec<_> = s.n[0].sends.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(w, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
}
