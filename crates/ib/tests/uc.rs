//! UC over the simulated network: SEND / WRITE (with and without immediate) at the sizes
//! around the PMTU and 1 MiB, byte-verified; a lost packet loses only its message (the
//! receive WQE is reused by the next one); errors are silent; READ and atomics do not exist.

mod sim;

use sim::{Faults, Setup, Sim, summary};
use softrdma_ib::{PostError, QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus};
use softrdma_memory::Key;
use softrdma_testkit::pattern;
use softrdma_wire::ib::{Operation, Service};

const PMTU: usize = 1024;

fn uc(seed: u64) -> Sim {
    let mut s = Sim::new(
        QpType::Uc,
        4 << 20,
        &Setup::default(),
        Faults::default(),
        seed,
    );
    s.capture = true;
    s
}

/// No UC packet ever goes from the responder back to the requester.
fn assert_no_responses(s: &Sim) {
    assert!(s.log.iter().all(|r| r.from == 0), "a UC responder answered");
    assert!(s.log.iter().all(|r| r.opcode.service() == Service::Uc));
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
}

/// Every UC operation at 0, 1, PMTU-1, PMTU, PMTU+1 and 1 MiB: the requester completes each
/// once its last packet is sent, the data arrives byte for byte, the receive completions
/// carry length and immediate data.
#[test]
fn every_operation_every_size() {
    let sizes = [0, 1, PMTU - 1, PMTU, PMTU + 1, 1 << 20];
    for (i, size) in sizes.into_iter().enumerate() {
        for (j, op) in [Op::Send, Op::SendImm, Op::Write, Op::WriteImm]
            .into_iter()
            .enumerate()
        {
            let seed = (10 * i + j) as u64;
            let mut s = uc(seed);
            let (k0, k1) = (s.n[0].key, s.n[1].key);
            let data = pattern(size, seed);
            s.n[0].fill(5, &data);
            let sge = vec![Sge::new(k0, 5, size as u32)];
            let recv_at = 1 << 20;
            let write_at = 3;
            if !matches!(op, Op::Write) {
                s.n[1]
                    .qp
                    .post_recv(RecvWr::new(
                        77,
                        vec![Sge::new(k1, recv_at, size as u32 + 100)],
                    ))
                    .unwrap();
            }
            let wr = match op {
                Op::Send => SendWr::send(1, sge),
                Op::SendImm => SendWr::send_with_imm(1, sge, 0x1234_5678),
                Op::Write => SendWr::write(1, sge, k1, write_at),
                Op::WriteImm => SendWr::write_with_imm(1, sge, k1, write_at, 0x9ABC_DEF0),
            };
            s.n[0].qp.post_send(wr).unwrap();
            s.run_idle(1_000_000);
            let what = format!("{op:?} size {size}");
            let wc_op = if matches!(op, Op::Send | Op::SendImm) {
                WcOpcode::Send
            } else {
                WcOpcode::RdmaWrite
            };
            assert_eq!(
                summary(&s.n[0].sends),
                vec![(1, WcStatus::Success, wc_op)],
                "{what}"
            );
            assert_eq!(s.n[0].sends[0].byte_len as usize, size, "{what}");
            let packets = size.div_ceil(PMTU).max(1);
            assert_eq!(s.log.iter().filter(|r| r.tx).count(), packets, "{what}");
            assert_no_responses(&s);
            match op {
                Op::Send | Op::SendImm => {
                    let r = s.n[1].recvs[0];
                    assert_eq!(
                        (r.wr_id, r.status, r.opcode, r.byte_len as usize),
                        (77, WcStatus::Success, WcOpcode::Recv, size),
                        "{what}"
                    );
                    let imm = matches!(op, Op::SendImm).then_some(0x1234_5678);
                    assert_eq!(r.imm, imm, "{what}");
                    assert_eq!(s.n[1].read(recv_at as usize, size), data, "{what}");
                }
                Op::Write => {
                    assert!(s.n[1].recvs.is_empty());
                    assert_eq!(s.n[1].read(write_at as usize, size), data, "{what}");
                }
                Op::WriteImm => {
                    let r = s.n[1].recvs[0];
                    assert_eq!(
                        (r.wr_id, r.status, r.opcode, r.byte_len as usize, r.imm),
                        (
                            77,
                            WcStatus::Success,
                            WcOpcode::RecvRdmaWithImm,
                            size,
                            Some(0x9ABC_DEF0)
                        ),
                        "{what}"
                    );
                    assert_eq!(s.n[1].read(write_at as usize, size), data, "{what}");
                    // Immediate data is not written to memory (IBT-X-08).
                    assert_eq!(s.n[1].read(write_at as usize + size, 4), vec![0; 4]);
                }
            }
        }
    }
}

/// A lost First, Middle or Last packet of the second of three 3-packet SENDs: that message is
/// dropped, the receive WQE it had started is reused by the third, which arrives whole; the
/// fourth receive stays posted for a later message.
#[test]
fn lost_packet_drops_only_its_message() {
    for (i, lost) in [
        Operation::SendFirst,
        Operation::SendMiddle,
        Operation::SendLast,
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = uc(100 + i as u64);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        let msgs: Vec<Vec<u8>> = (0..4).map(|m| pattern(2500, 200 + m)).collect();
        for (m, d) in msgs.iter().enumerate() {
            s.n[0].fill(4096 * m, d);
        }
        for id in 0..3u64 {
            s.n[1]
                .qp
                .post_recv(RecvWr::new(10 + id, vec![Sge::new(k1, 8192 * id, 4096)]))
                .unwrap();
        }
        let second = Setup::default().psn[0].wrapping_add(3) & 0xFF_FFFF;
        s.drop_filter = Some(Box::new(move |_, p| {
            p.bth.opcode.operation() == lost && (p.bth.psn.wrapping_sub(second) & 0xFF_FFFF) < 3
        }));
        for m in 0..3u64 {
            s.n[0]
                .qp
                .post_send(SendWr::send(m, vec![Sge::new(k0, 4096 * m, 2500)]))
                .unwrap();
        }
        s.run_idle(100_000);
        assert_eq!(s.stats.lost, 1);
        let ids: Vec<u64> = s.n[0].sends.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, vec![0, 1, 2], "UC completes at transmission");
        assert_eq!(
            summary(&s.n[1].recvs),
            vec![
                (10, WcStatus::Success, WcOpcode::Recv),
                (11, WcStatus::Success, WcOpcode::Recv)
            ],
            "lost {lost:?}"
        );
        assert!(s.n[1].recvs.iter().all(|r| r.byte_len == 2500));
        assert_eq!(s.n[1].read(0, 2500), msgs[0]);
        assert_eq!(s.n[1].read(8192, 2500), msgs[2], "lost {lost:?}");
        assert!(s.n[1].qp.responder_counters().out_of_sequence > 0);
        // The third receive is still there for the next message.
        s.n[0]
            .qp
            .post_send(SendWr::send(3, vec![Sge::new(k0, 4096 * 3, 2500)]))
            .unwrap();
        s.run_idle(100_000);
        assert_eq!(s.n[1].recvs.len(), 3);
        assert_eq!(s.n[1].recvs[2].wr_id, 12);
        assert_eq!(s.n[1].read(16384, 2500), msgs[3]);
        assert_no_responses(&s);
    }
}

/// A lost Middle of a 3-packet WRITE with immediate: no receive completion for it (its
/// immediate is never delivered); the next WRITE with immediate takes that receive.
#[test]
fn lost_write_with_imm_packet_drops_the_message() {
    let mut s = uc(120);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let d = pattern(2500, 120);
    s.n[0].fill(0, &d);
    let first_psn = Setup::default().psn[0];
    s.drop_filter = Some(Box::new(move |_, p| {
        p.bth.psn == (first_psn + 1) & 0xFF_FFFF
    }));
    s.n[1].qp.post_recv(RecvWr::new(10, vec![])).unwrap();
    for (m, at) in [(0u64, 0u64), (1, 65536)] {
        s.n[0]
            .qp
            .post_send(SendWr::write_with_imm(
                m,
                vec![Sge::new(k0, 0, 2500)],
                k1,
                at,
                m as u32 + 1,
            ))
            .unwrap();
    }
    s.run_idle(100_000);
    let r = &s.n[1].recvs;
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].imm, r[0].byte_len),
        (10, WcOpcode::RecvRdmaWithImm, Some(2), 2500)
    );
    assert_eq!(s.n[1].read(65536, 2500), d);
    // The first WRITE's Last packet was not placed (its message was abandoned).
    assert_eq!(s.n[1].read(2048, 452), vec![0; 452]);
}

/// UC errors are silent: a WRITE to a bad R_Key and a SEND finding no receive are dropped
/// without any response (no RNR on UC), and the next message is received normally.
#[test]
fn errors_are_silent_and_the_next_message_arrives() {
    let mut s = uc(130);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let d = pattern(3000, 130);
    s.n[0].fill(0, &d);
    s.n[0]
        .qp
        .post_send(SendWr::write(
            1,
            vec![Sge::new(k0, 0, 3000)],
            Key(k1.0 ^ 1),
            0,
        ))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 0, 3000)]))
        .unwrap();
    s.run_idle(100_000);
    assert_eq!(s.n[1].read(0, 3000), vec![0; 3000]);
    assert!(s.n[1].recvs.is_empty());
    assert_eq!(s.n[1].qp.responder_counters().uc_dropped, 2);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(20, vec![Sge::new(k1, 8192, 4096)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(3, vec![Sge::new(k0, 0, 3000)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::write(4, vec![Sge::new(k0, 0, 3000)], k1, 0))
        .unwrap();
    s.run_idle(100_000);
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(20, WcStatus::Success, WcOpcode::Recv)]
    );
    assert_eq!(s.n[1].read(8192, 3000), d);
    assert_eq!(s.n[1].read(0, 3000), d);
    let ids: Vec<(u64, WcStatus)> = s.n[0].sends.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_no_responses(&s);
}

/// UC has no RDMA READ, no ATOMIC and no SEND with Invalidate: refused at post, nothing queued.
#[test]
fn read_atomics_and_invalidate_unsupported() {
    let mut s = uc(140);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let wrs = [
        SendWr::read(1, Some(Sge::new(k0, 0, 8)), k1, 0),
        SendWr::read(1, None, k1, 0),
        SendWr::fetch_add(2, Sge::new(k0, 0, 8), k1, 0, 1),
        SendWr::cmp_swap(3, Sge::new(k0, 0, 8), k1, 0, 1, 2),
        SendWr::send_with_invalidate(4, vec![Sge::new(k0, 0, 8)], k1),
    ];
    for wr in wrs {
        assert_eq!(
            s.n[0].qp.post_send(wr.clone()),
            Err(PostError::Unsupported),
            "{wr:?}"
        );
    }
    assert_eq!(s.n[0].qp.sq_outstanding(), 0);
    s.run_idle(100);
    assert!(s.log.is_empty());
}
