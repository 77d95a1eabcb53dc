//! RC error paths over the simulated network: RNR NAKs both ways, local ACK timeouts and
//! retry exhaustion, fatal NAKs (Remote Access Error, Invalid Request) with the QP going to
//! Error and every later request flushed, ATOMIC replay, the READ/ATOMIC initiator depth and
//! fences. Every transfer is byte-verified.

mod sim;

use std::time::Duration;

use sim::{Faults, Setup, Sim, summary};
use softrdma_ib::{
    PostError, QpAttr, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus,
};
use softrdma_memory::{Access, Buffer, Key, PdId};
use softrdma_testkit::pattern;
use softrdma_wire::ib::{
    AethRepr, AtomicEthRepr, BthRepr, NakCode, Opcode, Operation, PacketRepr, RethRepr, RnrTimer,
    Syndrome, psn_add,
};

const REGION: usize = 1 << 20;

fn rc(setup: &Setup, faults: Faults, seed: u64) -> Sim {
    let mut s = Sim::new(QpType::Rc, REGION, setup, faults, seed);
    s.capture = true;
    s
}

/// Local ACK timeout of `Setup::timeout` (4.096 µs × 2^t).
fn ack_timeout(t: u8) -> Duration {
    Duration::from_nanos(4096 << t)
}

/// NAKs (and RNR NAKs) side `from` put on the wire, with their PSNs.
fn naks(s: &Sim, from: usize) -> Vec<(u32, Syndrome)> {
    s.log
        .iter()
        .filter(|r| r.tx && r.from == from)
        .filter_map(|r| r.syndrome.filter(|y| !y.is_ack()).map(|y| (r.psn, y)))
        .collect()
}

/// RNR: a SEND that finds no receive WQE gets an RNR NAK carrying the responder's
/// `min_rnr_timer`; the requester waits that long before each retry, retries forever with
/// `rnr_retry` 7, and succeeds once a receive is posted.
#[test]
fn rnr_nak_without_receive_then_success_once_posted() {
    let setup = Setup {
        min_rnr_timer: 14, // 1.28 ms, longer than the 1.05 ms ACK timeout
        ..Setup::default()
    };
    let mut s = rc(&setup, Faults::default(), 1);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let data = pattern(3000, 1);
    s.n[0].fill(0, &data);
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 3000)]))
        .unwrap();
    s.run_until(100_000, |s| s.n[0].qp.requester_counters().rnr_naks >= 1);
    let rnr = Syndrome::RnrNak {
        timer: RnrTimer::try_from(14).unwrap(),
    };
    assert_eq!(naks(&s, 1)[0], (setup.psn[0], rnr));
    // rnr_retry 7: forever. Ten RNR rounds and the request is still waiting.
    s.run_until(1_000_000, |s| s.n[0].qp.requester_counters().rnr_naks >= 10);
    assert!(s.n[0].sends.is_empty() && s.n[1].recvs.is_empty());
    assert_eq!(s.n[0].qp.state(), QpState::Rts);
    assert_eq!(s.n[1].qp.responder_counters().rnr_naks, 10);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(7, vec![Sge::new(k1, 4096, 4096)]))
        .unwrap();
    s.run_until(1_000_000, |s| {
        !s.n[0].sends.is_empty() && !s.n[1].recvs.is_empty()
    });
    assert_eq!(
        summary(&s.n[0].sends),
        vec![(1, WcStatus::Success, WcOpcode::Send)]
    );
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(7, WcStatus::Success, WcOpcode::Recv)]
    );
    assert_eq!(s.n[1].recvs[0].byte_len, 3000);
    assert_eq!(s.n[1].read(4096, 3000), data);
    // Every retry of the SEND First waited out the RNR timer.
    let firsts: Vec<Duration> = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 0 && r.opcode.operation() == Operation::SendFirst)
        .map(|r| r.at)
        .collect();
    assert_eq!(firsts.len(), 11);
    for w in firsts.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_micros(1280), "{w:?}");
    }
}

/// Waiting out RNR NAKs uses `rnr_retry`, not `retry_cnt`: a multi-packet SEND (whose
/// Middle and Last packets arrive out of sequence behind the RNR-NAKed First) still succeeds
/// with `retry_cnt` 0 once a receive is posted.
#[test]
fn rnr_wait_does_not_use_retry_cnt() {
    let setup = Setup {
        retry_cnt: 0,
        min_rnr_timer: 10, // 0.32 ms
        ..Setup::default()
    };
    let mut s = rc(&setup, Faults::default(), 2);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let data = pattern(2500, 2);
    s.n[0].fill(0, &data);
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 2500)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::write(2, vec![Sge::new(k0, 0, 2500)], k1, 65536))
        .unwrap();
    s.run_until(100_000, |s| s.n[0].qp.requester_counters().rnr_naks >= 3);
    assert!(s.n[0].sends.is_empty(), "{:?}", s.n[0].sends);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(7, vec![Sge::new(k1, 4096, 4096)]))
        .unwrap();
    s.run_until(1_000_000, |s| s.n[0].sends.len() == 2);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite)
        ]
    );
    assert_eq!(s.n[1].read(4096, 2500), data);
    assert_eq!(s.n[1].read(65536, 2500), data);
}

/// RDMA WRITE with immediate consumes a receive WQE: none posted -> RNR NAK, the data is not
/// placed twice, and the retry succeeds once a receive is posted.
#[test]
fn write_with_imm_without_receive_is_rnr_naked() {
    let mut s = rc(&Setup::default(), Faults::default(), 3);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let data = pattern(1500, 3);
    s.n[0].fill(0, &data);
    s.n[0]
        .qp
        .post_send(SendWr::write_with_imm(
            1,
            vec![Sge::new(k0, 0, 1500)],
            k1,
            8192,
            0xABCD,
        ))
        .unwrap();
    s.run_until(100_000, |s| s.n[0].qp.requester_counters().rnr_naks >= 2);
    assert!(s.n[0].sends.is_empty());
    s.n[1].qp.post_recv(RecvWr::new(9, vec![])).unwrap();
    s.run_until(100_000, |s| {
        !s.n[0].sends.is_empty() && !s.n[1].recvs.is_empty()
    });
    assert_eq!(s.n[0].sends[0].status, WcStatus::Success);
    let r = s.n[1].recvs[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm, r.byte_len),
        (
            9,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            Some(0xABCD),
            1500
        )
    );
    assert_eq!(s.n[1].read(8192, 1500), data);
}

/// `rnr_retry` exhausted: the SEND completes with `RnrRetryExceeded` after 1 + rnr_retry RNR
/// NAKs, every later request is flushed (and was not executed), the QP is in Error, its
/// receives are flushed, and requests posted afterwards complete flushed at once.
#[test]
fn rnr_retry_exhausted_flushes_the_rest() {
    let setup = Setup {
        rnr_retry: 2,
        ..Setup::default()
    };
    let mut s = rc(&setup, Faults::default(), 4);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, &pattern(4096, 4));
    s.n[0]
        .qp
        .post_recv(RecvWr::new(50, vec![Sge::new(k0, 65536, 4096)]))
        .unwrap();
    let qp = &mut s.n[0].qp;
    qp.post_send(SendWr::send(1, vec![Sge::new(k0, 0, 100)]))
        .unwrap();
    qp.post_send(SendWr::write(2, vec![Sge::new(k0, 0, 100)], k1, 8192))
        .unwrap();
    qp.post_send(SendWr::send(3, vec![Sge::new(k0, 0, 100)]))
        .unwrap();
    s.run_until(100_000, |s| s.n[0].sends.len() == 3);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::RnrRetryExceeded, WcOpcode::Send),
            (2, WcStatus::WorkRequestFlushed, WcOpcode::RdmaWrite),
            (3, WcStatus::WorkRequestFlushed, WcOpcode::Send),
        ]
    );
    assert_eq!(s.n[0].qp.requester_counters().rnr_naks, 3);
    assert_eq!(s.n[1].qp.responder_counters().rnr_naks, 3);
    assert_eq!(s.n[0].qp.state(), QpState::Error);
    assert_eq!(
        summary(&s.n[0].recvs),
        vec![(50, WcStatus::WorkRequestFlushed, WcOpcode::Recv)]
    );
    assert_eq!(s.n[1].read(8192, 100), vec![0; 100], "WRITE executed");
    s.n[0]
        .qp
        .post_send(SendWr::send(4, vec![Sge::new(k0, 0, 100)]))
        .unwrap();
    s.n[0]
        .qp
        .post_recv(RecvWr::new(51, vec![Sge::new(k0, 65536, 100)]))
        .unwrap();
    s.run_idle(100_000);
    assert_eq!(
        summary(&s.n[0].sends[3..]),
        vec![(4, WcStatus::WorkRequestFlushed, WcOpcode::Send)]
    );
    assert_eq!(
        summary(&s.n[0].recvs[1..]),
        vec![(51, WcStatus::WorkRequestFlushed, WcOpcode::Recv)]
    );
    // The responder side is unaffected.
    assert_eq!(s.n[1].qp.state(), QpState::Rts);
}

/// Peer silent (every packet lost): the local ACK timer fires every 4.096 µs × 2^timeout, each
/// expiry resends everything outstanding, and after `retry_cnt` retries the oldest request
/// completes with `RetryExceeded`; the rest are flushed, the QP is in Error with its receives
/// flushed. `retry_cnt` 0 fails on the first expiry; 7 means seven retries (not forever).
#[test]
fn retry_exhausted_when_peer_silent() {
    for (i, retry_cnt) in [0u8, 3, 7].into_iter().enumerate() {
        let setup = Setup {
            retry_cnt,
            timeout: 8,
            ..Setup::default()
        };
        let mut s = rc(&setup, Faults::loss(1.0), 10 + i as u64);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        for id in [50, 51] {
            s.n[0]
                .qp
                .post_recv(RecvWr::new(id, vec![Sge::new(k0, 65536, 4096)]))
                .unwrap();
        }
        let qp = &mut s.n[0].qp;
        qp.post_send(SendWr::send(1, vec![Sge::new(k0, 0, 100)]))
            .unwrap();
        qp.post_send(SendWr::write(2, vec![Sge::new(k0, 0, 100)], k1, 0))
            .unwrap();
        qp.post_send(SendWr::read(3, Some(Sge::new(k0, 8192, 100)), k1, 0))
            .unwrap();
        let t0 = s.elapsed();
        s.run_until(100_000, |s| s.n[0].sends.len() == 3);
        let took = s.elapsed() - t0;
        assert_eq!(
            summary(&s.n[0].sends),
            vec![
                (1, WcStatus::RetryExceeded, WcOpcode::Send),
                (2, WcStatus::WorkRequestFlushed, WcOpcode::RdmaWrite),
                (3, WcStatus::WorkRequestFlushed, WcOpcode::RdmaRead),
            ],
            "retry_cnt {retry_cnt}"
        );
        let c = s.n[0].qp.requester_counters();
        let tries = u64::from(retry_cnt) + 1;
        assert_eq!(c.timeouts, tries, "retry_cnt {retry_cnt}");
        // Each retry sends the three again, the oldest twice on the first retry and three
        // times from the second on.
        let r = u64::from(retry_cnt);
        let extra = r.min(1) + 2 * r.saturating_sub(1);
        assert_eq!(c.packets, 3 * tries + extra);
        assert_eq!(c.retransmitted, 3 * r + extra);
        let t = ack_timeout(8) * tries as u32;
        assert!(
            took >= t && took < t + Duration::from_micros(50),
            "{took:?}"
        );
        assert_eq!(s.n[0].qp.state(), QpState::Error);
        assert_eq!(
            summary(&s.n[0].recvs),
            vec![
                (50, WcStatus::WorkRequestFlushed, WcOpcode::Recv),
                (51, WcStatus::WorkRequestFlushed, WcOpcode::Recv),
            ]
        );
        assert_eq!(s.n[0].qp.poll_timeout(), None);
        assert_eq!(s.n[0].qp.sq_outstanding(), 0);
    }
}

/// Three ways to get NAK Remote Access Error (IBT-X-03): an unknown R_Key, a range past the
/// region's end, a region without the right. The request completes with `RemoteAccess`, the
/// later SEND is flushed (and not executed at the peer), the QP is in Error.
#[test]
fn remote_access_error_is_fatal() {
    enum Bad {
        Key,
        Bounds,
        Rights,
    }
    for (i, bad) in [Bad::Key, Bad::Bounds, Bad::Rights].into_iter().enumerate() {
        for read in [false, true] {
            let mut s = rc(&Setup::default(), Faults::default(), 20 + i as u64);
            let (k0, k1) = (s.n[0].key, s.n[1].key);
            s.n[0].fill(0, &pattern(200, 5));
            // A second region at b allowing local access only (and REMOTE_READ for WRITE
            // tests, REMOTE_WRITE for READ tests: the other right is missing).
            let other = if read {
                Access::LOCAL_WRITE | Access::REMOTE_WRITE
            } else {
                Access::LOCAL_WRITE | Access::REMOTE_READ
            };
            let narrow = s.n[1]
                .keys
                .reg_mr(PdId(1), Buffer::new(4096), 0, 4096, 0x7000_0000, other)
                .unwrap();
            let (key, va) = match bad {
                Bad::Key => (Key(k1.0 ^ 0x01), 0),
                Bad::Bounds => (k1, REGION as u64 - 50),
                Bad::Rights => (narrow, 0x7000_0000),
            };
            s.n[1]
                .qp
                .post_recv(RecvWr::new(60, vec![Sge::new(k1, 0, 4096)]))
                .unwrap();
            s.n[0]
                .qp
                .post_recv(RecvWr::new(50, vec![Sge::new(k0, 65536, 4096)]))
                .unwrap();
            let wr = if read {
                SendWr::read(1, Some(Sge::new(k0, 8192, 100)), key, va)
            } else {
                SendWr::write(1, vec![Sge::new(k0, 0, 100)], key, va)
            };
            s.n[0].qp.post_send(wr).unwrap();
            s.n[0]
                .qp
                .post_send(SendWr::send(2, vec![Sge::new(k0, 0, 100)]))
                .unwrap();
            s.run_idle(100_000);
            let op = if read {
                WcOpcode::RdmaRead
            } else {
                WcOpcode::RdmaWrite
            };
            assert_eq!(
                summary(&s.n[0].sends),
                vec![
                    (1, WcStatus::RemoteAccess, op),
                    (2, WcStatus::WorkRequestFlushed, WcOpcode::Send),
                ]
            );
            assert_eq!(
                naks(&s, 1)[0],
                (setup_psn0(), Syndrome::Nak(NakCode::RemoteAccessError))
            );
            assert_eq!(s.n[0].qp.state(), QpState::Error);
            assert_eq!(
                summary(&s.n[0].recvs),
                vec![(50, WcStatus::WorkRequestFlushed, WcOpcode::Recv)]
            );
            assert!(s.n[1].recvs.is_empty(), "the SEND after the NAK executed");
            assert_eq!(s.n[0].read(8192, 100), vec![0; 100]);
        }
    }
}

fn setup_psn0() -> u32 {
    Setup::default().psn[0]
}

/// NAK Invalid Request: an operation the responder QP's access flags do not enable
/// (`qp_access_flags` without REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC) completes with
/// `RemoteInvalidRequest`, the rest is flushed, the QP is in Error.
#[test]
fn qp_access_flags_refuse_with_invalid_request() {
    for (i, missing) in [
        Access::REMOTE_WRITE,
        Access::REMOTE_READ,
        Access::REMOTE_ATOMIC,
    ]
    .into_iter()
    .enumerate()
    {
        let setup = Setup {
            access: Access::REMOTE - missing,
            ..Setup::default()
        };
        let mut s = rc(&setup, Faults::default(), 30 + i as u64);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        s.n[0].fill(0, &pattern(100, 6));
        let (wr, op) = if missing == Access::REMOTE_WRITE {
            (
                SendWr::write(1, vec![Sge::new(k0, 0, 100)], k1, 0),
                WcOpcode::RdmaWrite,
            )
        } else if missing == Access::REMOTE_READ {
            (
                SendWr::read(1, Some(Sge::new(k0, 8192, 100)), k1, 0),
                WcOpcode::RdmaRead,
            )
        } else {
            (
                SendWr::fetch_add(1, Sge::new(k0, 8192, 8), k1, 0, 1),
                WcOpcode::FetchAdd,
            )
        };
        s.n[0].qp.post_send(wr).unwrap();
        s.n[0]
            .qp
            .post_send(SendWr::write(2, vec![Sge::new(k0, 0, 100)], k1, 4096))
            .unwrap();
        s.run_idle(100_000);
        assert_eq!(
            summary(&s.n[0].sends),
            vec![
                (1, WcStatus::RemoteInvalidRequest, op),
                (2, WcStatus::WorkRequestFlushed, WcOpcode::RdmaWrite),
            ]
        );
        // The NAK, then (for the WRITE behind it, out of sequence now) one PSN Sequence Error.
        assert_eq!(
            naks(&s, 1),
            vec![
                (setup.psn[0], Syndrome::Nak(NakCode::InvalidRequest)),
                (setup.psn[0], Syndrome::Nak(NakCode::PsnSequenceError))
            ]
        );
        assert_eq!(s.n[0].qp.state(), QpState::Error);
        assert_eq!(s.n[1].read(0, 100), vec![0; 100]);
        assert_eq!(s.n[1].read(4096, 100), vec![0; 100]);
    }
}

/// `qp_access_flags` changed by an RTS -> RTS modify take effect for the next request.
#[test]
fn qp_access_flags_modified_in_rts_apply() {
    let mut s = rc(&Setup::default(), Faults::default(), 35);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, &pattern(100, 7));
    s.n[0]
        .qp
        .post_send(SendWr::write(1, vec![Sge::new(k0, 0, 100)], k1, 0))
        .unwrap();
    s.run_idle(100_000);
    assert_eq!(s.n[0].sends[0].status, WcStatus::Success);
    s.n[1]
        .qp
        .modify(&QpAttr {
            state: Some(QpState::Rts),
            access: Some(Access::REMOTE_READ),
            ..QpAttr::default()
        })
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::write(2, vec![Sge::new(k0, 0, 100)], k1, 4096))
        .unwrap();
    s.run_idle(100_000);
    assert_eq!(
        summary(&s.n[0].sends[1..]),
        vec![(2, WcStatus::RemoteInvalidRequest, WcOpcode::RdmaWrite)]
    );
    assert_eq!(s.n[1].read(4096, 100), vec![0; 100]);
}

/// A SEND longer than the receive buffer: NAK Invalid Request; the requester completes with
/// `RemoteInvalidRequest` (QP to Error, the rest flushed), the receive with `LocalLength`.
#[test]
fn send_longer_than_receive_buffer() {
    let mut s = rc(&Setup::default(), Faults::default(), 36);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, &pattern(2000, 8));
    s.n[1]
        .qp
        .post_recv(RecvWr::new(60, vec![Sge::new(k1, 0, 1000)]))
        .unwrap();
    s.n[1]
        .qp
        .post_recv(RecvWr::new(61, vec![Sge::new(k1, 4096, 1000)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 2000)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 0, 10)]))
        .unwrap();
    s.run_idle(100_000);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::RemoteInvalidRequest, WcOpcode::Send),
            (2, WcStatus::WorkRequestFlushed, WcOpcode::Send),
        ]
    );
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(60, WcStatus::LocalLength, WcOpcode::Recv)]
    );
    assert_eq!(s.n[0].qp.state(), QpState::Error);
    // The SEND First already overflows the 1000-octet buffer.
    assert_eq!(
        naks(&s, 1)[0],
        (setup_psn0(), Syndrome::Nak(NakCode::InvalidRequest))
    );
}

/// Atomics must be 8-byte aligned with one 8-octet result entry: refused at post; a
/// misaligned ATOMIC reaching a responder (built by hand) is NAKed Invalid Request
/// (IBT-X-12), executes nothing, and the QP keeps working.
#[test]
fn misaligned_atomic() {
    let mut s = rc(&Setup::default(), Faults::default(), 37);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[1].fill(0, &5u64.to_ne_bytes());
    let qp = &mut s.n[0].qp;
    assert_eq!(
        qp.post_send(SendWr::fetch_add(1, Sge::new(k0, 0, 8), k1, 4, 1)),
        Err(PostError::AtomicShape)
    );
    assert_eq!(
        qp.post_send(SendWr::cmp_swap(1, Sge::new(k0, 0, 4), k1, 0, 1, 2)),
        Err(PostError::AtomicShape)
    );
    let mut p = PacketRepr::new(BthRepr::new(Opcode::RC_FETCH_ADD, 0x22, setup_psn0()), &[]);
    p.bth.ack_req = true;
    p.atomic_eth = Some(AtomicEthRepr {
        va: 4,
        r_key: k1.0,
        swap_add_data: 1,
        compare_data: 0,
    });
    s.inject(1, &p);
    s.run_idle(10_000);
    assert_eq!(
        naks(&s, 1),
        vec![(setup_psn0(), Syndrome::Nak(NakCode::InvalidRequest))]
    );
    assert_eq!(s.n[1].word(0), 5);
    // The aligned request at the same PSN then succeeds.
    s.n[0]
        .qp
        .post_send(SendWr::fetch_add(2, Sge::new(k0, 0, 8), k1, 0, 1))
        .unwrap();
    s.run_idle(10_000);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![(2, WcStatus::Success, WcOpcode::FetchAdd)]
    );
    assert_eq!((s.n[0].word(0), s.n[1].word(0)), (5, 6));
}

/// IBT-C9-9: RETH DMA Length ranges 0..=2^31; 2^31 + 1 in a WRITE or READ request is NAKed
/// Invalid Request (not Remote Access: the length is malformed whatever the key).
#[test]
fn ibt_c9_9_dmalen_above_2_31_is_invalid_request() {
    for (i, op) in [Opcode::RC_RDMA_WRITE_ONLY, Opcode::RC_RDMA_READ_REQUEST]
        .into_iter()
        .enumerate()
    {
        for (len, code) in [
            ((1u32 << 31) + 1, NakCode::InvalidRequest),
            (u32::MAX, NakCode::InvalidRequest),
            // 2^31 is a valid length: the region is too small for it.
            (1u32 << 31, NakCode::RemoteAccessError),
        ] {
            let mut s = rc(&Setup::default(), Faults::default(), 40 + i as u64);
            let k1 = s.n[1].key;
            let mut p = PacketRepr::new(BthRepr::new(op, 0x22, setup_psn0()), &[]);
            p.bth.ack_req = true;
            p.reth = Some(RethRepr {
                va: 0,
                r_key: k1.0,
                dma_len: len,
            });
            s.inject(1, &p);
            s.run_idle(10_000);
            assert_eq!(
                naks(&s, 1),
                vec![(setup_psn0(), Syndrome::Nak(code))],
                "{op:?} DMALen {len:#x}"
            );
        }
    }
}

/// IBT-X-13, IBT-X-15: the ATOMIC Acknowledge is lost; the requester times out and resends
/// the FetchAdd; the responder answers the duplicate from its saved result (the original
/// value, although the word has changed since) and does not add again.
#[test]
fn ibt_x_15_duplicate_atomic_replayed_exactly_once() {
    let mut s = rc(&Setup::default(), Faults::default(), 50);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[1].fill(64, &40u64.to_ne_bytes());
    let mut dropped = false;
    s.drop_filter = Some(Box::new(move |from, p| {
        let hit = !dropped && from == 1 && p.bth.opcode.operation() == Operation::AtomicAcknowledge;
        dropped |= hit;
        hit
    }));
    s.n[0]
        .qp
        .post_send(SendWr::fetch_add(1, Sge::new(k0, 0, 8), k1, 64, 2))
        .unwrap();
    s.run_until(10_000, |s| s.n[1].word(64) == 42);
    // Someone else changes the word before the retry arrives.
    s.n[1].fill(64, &1000u64.to_ne_bytes());
    s.run_until(100_000, |s| !s.n[0].sends.is_empty());
    assert_eq!(
        summary(&s.n[0].sends),
        vec![(1, WcStatus::Success, WcOpcode::FetchAdd)]
    );
    assert_eq!(s.n[0].word(0), 40, "the original value");
    assert_eq!(s.n[1].word(64), 1000, "executed twice");
    assert_eq!(s.n[0].qp.requester_counters().timeouts, 1);
    // After the timeout the head ATOMIC goes out twice (requester.rs: `dup_head`): both
    // copies are duplicates the responder answers from the saved result.
    assert_eq!(s.n[1].qp.responder_counters().duplicates, 2);
    let fetch_adds = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 0 && r.opcode.operation() == Operation::FetchAdd)
        .count();
    assert_eq!(fetch_adds, 3);
}

/// IBT-X-11: with `max_rd_atomic` 2, at most two READ/ATOMIC requests are outstanding: the
/// third waits until the first completes; all complete in order with the right data.
#[test]
fn ibt_x_11_read_atomic_initiator_depth() {
    let setup = Setup {
        max_rd_atomic: 2,
        ..Setup::default()
    };
    let mut s = rc(&setup, Faults::default(), 51);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let src = pattern(9 * 4096, 9);
    s.n[1].fill(0, &src);
    for i in 0..5u64 {
        let wr = if i == 2 {
            SendWr::fetch_add(i, Sge::new(k0, 65536 + i * 4096, 8), k1, 32768, 1)
        } else {
            SendWr::read(i, Some(Sge::new(k0, 65536 + i * 4096, 3000)), k1, i * 4096)
        };
        s.n[0].qp.post_send(wr).unwrap();
    }
    // The responder holds its responses: exactly two requests go out.
    s.hold[1] = true;
    s.pump();
    let sent = |s: &Sim| {
        s.log
            .iter()
            .filter(|r| r.tx && r.from == 0)
            .map(|r| r.opcode.operation())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        sent(&s),
        vec![Operation::RdmaReadRequest, Operation::RdmaReadRequest]
    );
    s.hold[1] = false;
    s.run_until(100_000, |s| s.n[0].sends.len() == 5);
    // Replay the log: requests sent minus final responses received never exceeds 2, and
    // reaches it.
    let mut out = 0i32;
    let mut max = 0;
    for r in &s.log {
        let op = r.opcode.operation();
        if r.tx && r.from == 0 && waits_for_response(op) {
            out += 1;
        }
        if !r.tx
            && r.from == 1
            && matches!(
                op,
                Operation::RdmaReadResponseLast
                    | Operation::RdmaReadResponseOnly
                    | Operation::AtomicAcknowledge
            )
        {
            out -= 1;
        }
        max = max.max(out);
    }
    assert_eq!(max, 2);
    for (i, w) in s.n[0].sends.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::Success));
        let off = 65536 + i * 4096;
        if i == 2 {
            assert_eq!(
                s.n[0].word(off),
                u64::from_ne_bytes(src[32768..32776].try_into().unwrap())
            );
        } else {
            assert_eq!(s.n[0].read(off, 3000), src[i * 4096..i * 4096 + 3000]);
        }
    }
}

fn waits_for_response(op: Operation) -> bool {
    matches!(
        op,
        Operation::RdmaReadRequest | Operation::FetchAdd | Operation::CompareSwap
    )
}

/// IBT-C9-31: a fenced WRITE after a READ of the same remote buffer waits until the READ has
/// completed, so the READ returns the old data. Without the fence the WRITE goes out at once.
#[test]
fn ibt_c9_31_fenced_write_waits_for_read() {
    for fence in [true, false] {
        let mut s = rc(&Setup::default(), Faults::default(), 52);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        let old = pattern(3000, 10);
        let new = pattern(3000, 11);
        s.n[1].fill(0, &old);
        s.n[0].fill(0, &new);
        s.n[0]
            .qp
            .post_send(SendWr::read(1, Some(Sge::new(k0, 65536, 3000)), k1, 0))
            .unwrap();
        let flags = if fence {
            SendFlags::SIGNALED | SendFlags::FENCE
        } else {
            SendFlags::SIGNALED
        };
        s.n[0]
            .qp
            .post_send(SendWr::write(2, vec![Sge::new(k0, 0, 3000)], k1, 0).with_flags(flags))
            .unwrap();
        s.run_until(100_000, |s| s.n[0].sends.len() == 2);
        assert_eq!(
            summary(&s.n[0].sends),
            vec![
                (1, WcStatus::Success, WcOpcode::RdmaRead),
                (2, WcStatus::Success, WcOpcode::RdmaWrite)
            ]
        );
        assert_eq!(s.n[1].read(0, 3000), new);
        let read_done = s
            .log
            .iter()
            .position(|r| {
                !r.tx && r.from == 1 && r.opcode.operation() == Operation::RdmaReadResponseLast
            })
            .unwrap();
        let write_sent = s
            .log
            .iter()
            .position(|r| r.tx && r.from == 0 && r.opcode.operation() == Operation::RdmaWriteFirst)
            .unwrap();
        if fence {
            assert!(
                write_sent > read_done,
                "fenced WRITE sent before the READ completed"
            );
            assert_eq!(s.n[0].read(65536, 3000), old);
        } else {
            assert!(write_sent < read_done);
        }
    }
}

/// IBT-X-17 (and C9-31 for ATOMICs): a fenced FetchAdd after a READ of the same word waits for
/// the READ, which therefore returns the value before the add.
#[test]
fn ibt_x_17_fenced_atomic_after_read() {
    let mut s = rc(&Setup::default(), Faults::default(), 53);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[1].fill(128, &7u64.to_ne_bytes());
    s.n[0]
        .qp
        .post_send(SendWr::read(1, Some(Sge::new(k0, 0, 8)), k1, 128))
        .unwrap();
    s.n[0]
        .qp
        .post_send(
            SendWr::fetch_add(2, Sge::new(k0, 8, 8), k1, 128, 10)
                .with_flags(SendFlags::SIGNALED | SendFlags::FENCE),
        )
        .unwrap();
    s.run_until(100_000, |s| s.n[0].sends.len() == 2);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::FetchAdd)
        ]
    );
    assert_eq!(
        (s.n[0].word(0), s.n[0].word(8), s.n[1].word(128)),
        (7, 7, 17)
    );
    let read_done = s
        .log
        .iter()
        .position(|r| {
            !r.tx && r.from == 1 && r.opcode.operation() == Operation::RdmaReadResponseOnly
        })
        .unwrap();
    let atomic_sent = s
        .log
        .iter()
        .position(|r| r.tx && r.from == 0 && r.opcode.operation() == Operation::FetchAdd)
        .unwrap();
    assert!(atomic_sent > read_done);
}

/// IBT-X-19: an ACK for a PSN never sent (and a duplicate ACK) is silently dropped by the
/// requester: no completion, no state change, the ACK timer keeps its deadline; it then
/// expires and the request is resent as if the bogus ACK had never arrived.
#[test]
fn ibt_x_19_bogus_ack_dropped_by_requester() {
    let mut s = rc(&Setup::default(), Faults::default(), 54);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, &pattern(100, 12));
    s.n[1]
        .qp
        .post_recv(RecvWr::new(60, vec![Sge::new(k1, 0, 4096)]))
        .unwrap();
    s.hold[1] = true;
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 100)]))
        .unwrap();
    s.pump();
    let deadline = s.n[0].qp.poll_timeout();
    assert!(deadline.is_some());
    for psn in [psn_add(setup_psn0(), 100), psn_add(setup_psn0(), 0xFF_FFFF)] {
        let mut ack = PacketRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, 0x11, psn), &[]);
        ack.aeth = Some(AethRepr {
            reserved: false,
            syndrome: Syndrome::ACK,
            msn: 1,
        });
        s.inject(0, &ack);
    }
    assert!(s.n[0].sends.is_empty());
    assert_eq!(s.n[0].qp.state(), QpState::Rts);
    assert_eq!(s.n[0].qp.sq_outstanding(), 1);
    assert_eq!(s.n[0].qp.poll_timeout(), deadline);
    assert_eq!(s.n[0].qp.requester_counters().stale_responses, 2);
    s.run_until(10_000, |s| s.n[0].qp.requester_counters().timeouts == 1);
    assert_eq!(Some(s.now), deadline);
    s.hold[1] = false;
    s.run_until(10_000, |s| !s.n[0].sends.is_empty());
    assert_eq!(s.n[0].sends[0].status, WcStatus::Success);
    assert_eq!(s.n[1].read(0, 100), pattern(100, 12));
    // The one retry sends the Send twice.
    assert_eq!(s.n[0].qp.requester_counters().retransmitted, 2);
}

/// IBT-C9-10, IBT-C9-16, IBT-C9-22: SEND, RDMA WRITE and RDMA READ messages are at most 2^31
/// octets: 2^31 + 1 is refused at post; 2^31 passes the length rule (and fails the L_Key
/// check here, whose region is small).
#[test]
fn ibt_c9_10_c9_16_c9_22_message_length_limit_at_post() {
    let mut s = rc(&Setup::default(), Faults::default(), 55);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let big = Key(k0.0 ^ 0x01); // not a key: only the length rule can pass it
    for len in [(1u64 << 31) + 1, 1 << 31] {
        let half = (len / 2) as u32;
        let rest = (len - u64::from(half)) as u32;
        let wrs = [
            SendWr::send(1, vec![Sge::new(big, 0, half), Sge::new(big, 0, rest)]),
            SendWr::write(
                2,
                vec![Sge::new(big, 0, half), Sge::new(big, 0, rest)],
                k1,
                0,
            ),
            SendWr::read(3, Some(Sge::new(big, 0, len as u32)), k1, 0),
        ];
        for wr in wrs {
            let r = s.n[0].qp.post_send(wr.clone());
            if len > 1 << 31 {
                assert_eq!(r, Err(PostError::MessageTooLong), "{wr:?}");
            } else {
                assert!(
                    matches!(r, Err(PostError::LocalProtection { .. })),
                    "{wr:?}: {r:?}"
                );
            }
        }
    }
    assert_eq!(s.n[0].qp.sq_outstanding(), 0);
}
