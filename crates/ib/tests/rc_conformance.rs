//! RC ordering, segmentation and solicited-event rules of IBA 9.2–9.5 checked on the wire of
//! the simulated network (every packet logged) and byte-verified.

mod sim;

use std::sync::Arc;

use sim::{Faults, Node, Setup, Sim, connect, summary};
use softrdma_ib::{IbQp, QpCaps, QpType, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus};
use softrdma_memory::{Access, Buffer, KeyTable, PdId, QpId};
use softrdma_testkit::pattern;
use softrdma_wire::ib::{
    BthRepr, IethRepr, Opcode, Operation, PacketRepr, RethRepr, psn_add, psn_diff,
};

fn rc(setup: &Setup, seed: u64) -> Sim {
    let mut s = Sim::new(QpType::Rc, 1 << 20, setup, Faults::default(), seed);
    s.capture = true;
    s
}

/// What side `from` put on the wire: (operation, PSN, payload length).
fn sent(s: &Sim, from: usize) -> Vec<(Operation, u32, usize)> {
    s.log
        .iter()
        .filter(|r| r.tx && r.from == from)
        .map(|r| (r.opcode.operation(), r.psn, r.payload.len()))
        .collect()
}

/// IBT-C9-11, IBT-C9-13, IBT-C9-17, IBT-C9-18, IBT-C9-21, IBT-C9-25: at PMTU 256 the
/// requester sends the messages in posting order, each segmented into PMTU packets
/// (700 octets -> 256 + 256 + 188) with no packet of another message in between; a READ takes
/// one PSN per response packet; the responder splits the 700-octet READ into Response First,
/// Middle and Last.
#[test]
fn ibt_c9_13_c9_18_c9_25_posting_order_and_no_interleaving() {
    use Operation::*;
    let setup = Setup {
        pmtu: 256,
        ..Setup::default()
    };
    let mut s = rc(&setup, 1);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let src = pattern(700, 1);
    s.n[0].fill(0, &src);
    s.n[1].fill(65536, &pattern(700, 2));
    for id in 0..4 {
        s.n[1]
            .qp
            .post_recv(RecvWr::new(id, vec![Sge::new(k1, 8192 * (id + 1), 1024)]))
            .unwrap();
    }
    let qp = &mut s.n[0].qp;
    let wrs = vec![
        SendWr::send(1, vec![Sge::new(k0, 0, 700)]),
        SendWr::write(2, vec![Sge::new(k0, 0, 700)], k1, 4096),
        SendWr::read(3, Some(Sge::new(k0, 32768, 700)), k1, 65536),
        SendWr::send(4, vec![]),
        SendWr::fetch_add(5, Sge::new(k0, 40960, 8), k1, 0x10000 + 1024, 3),
        SendWr::write_with_imm(6, vec![Sge::new(k0, 0, 300)], k1, 49152, 6),
        SendWr::send_with_imm(7, vec![Sge::new(k0, 0, 1)], 7),
    ];
    for wr in wrs {
        qp.post_send(wr).unwrap();
    }
    s.run_until(100_000, |s| s.n[0].sends.len() == 7);
    let p0 = setup.psn[0];
    let expect: Vec<(Operation, u32, usize)> = [
        (SendFirst, 0, 256),
        (SendMiddle, 1, 256),
        (SendLast, 2, 188),
        (RdmaWriteFirst, 3, 256),
        (RdmaWriteMiddle, 4, 256),
        (RdmaWriteLast, 5, 188),
        (RdmaReadRequest, 6, 0), // takes PSNs 6, 7, 8
        (SendOnly, 9, 0),
        (FetchAdd, 10, 0),
        (RdmaWriteFirst, 11, 256),
        (RdmaWriteLastWithImmediate, 12, 44),
        (SendOnlyWithImmediate, 13, 1),
    ]
    .into_iter()
    .map(|(op, d, n)| (op, psn_add(p0, d), n))
    .collect();
    assert_eq!(sent(&s, 0), expect);
    let responses: Vec<_> = sent(&s, 1)
        .into_iter()
        .filter(|(op, ..)| op.is_response() && *op != Acknowledge)
        .collect();
    assert_eq!(
        responses,
        vec![
            (RdmaReadResponseFirst, psn_add(p0, 6), 256),
            (RdmaReadResponseMiddle, psn_add(p0, 7), 256),
            (RdmaReadResponseLast, psn_add(p0, 8), 188),
            (AtomicAcknowledge, psn_add(p0, 10), 0),
        ]
    );
    let ids: Vec<u64> = s.n[0].sends.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (1..=7).collect::<Vec<_>>());
    assert!(s.n[0].sends.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(s.n[1].read(8192, 700), src);
    assert_eq!(s.n[1].read(4096, 700), src);
    assert_eq!(s.n[0].read(32768, 700), pattern(700, 2));
    assert_eq!(s.n[1].read(49152, 300), src[..300]);
}

/// IBT-C9-26: a SEND and a WRITE gathered from three entries arrive in entry order; a receive
/// with three entries is filled in entry order.
#[test]
fn ibt_c9_26_gather_and_scatter_in_sge_order() {
    let mut s = rc(&Setup::default(), 2);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let src = pattern(8192, 3);
    s.n[0].fill(0, &src);
    let gather = vec![
        Sge::new(k0, 5000, 100),
        Sge::new(k0, 0, 1500),
        Sge::new(k0, 3000, 333),
    ];
    let expect: Vec<u8> = [&src[5000..5100], &src[..1500], &src[3000..3333]].concat();
    s.n[1]
        .qp
        .post_recv(RecvWr::new(
            9,
            vec![
                Sge::new(k1, 20000, 500),
                Sge::new(k1, 10000, 10),
                Sge::new(k1, 30000, 2000),
            ],
        ))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(1, gather.clone()))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::write(2, gather, k1, 40000))
        .unwrap();
    s.run_until(10_000, |s| {
        s.n[0].sends.len() == 2 && !s.n[1].recvs.is_empty()
    });
    assert_eq!(s.n[1].recvs[0].byte_len, 1933);
    let got = [
        s.n[1].read(20000, 500),
        s.n[1].read(10000, 10),
        s.n[1].read(30000, 1423),
    ]
    .concat();
    assert_eq!(got, expect);
    assert_eq!(s.n[1].read(40000, 1933), expect);
}

/// IBT-C9-27: responses are strictly ordered: the READ's response packets go out before the
/// ACK of the SEND posted after it.
#[test]
fn ibt_c9_27_read_responses_precede_later_ack() {
    let setup = Setup::default();
    let mut s = rc(&setup, 3);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(9, vec![Sge::new(k1, 0, 100)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::read(1, Some(Sge::new(k0, 0, 8000)), k1, 4096))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 0, 100)]))
        .unwrap();
    s.run_until(10_000, |s| s.n[0].sends.len() == 2);
    let send_psn = psn_add(setup.psn[0], 8);
    let out = sent(&s, 1);
    let ack = out
        .iter()
        .position(|&(op, psn, _)| op == Operation::Acknowledge && psn_diff(psn, send_psn) >= 0)
        .expect("the SEND is acknowledged");
    let reads: Vec<usize> = out
        .iter()
        .enumerate()
        .filter(|(_, (op, ..))| op.is_response() && *op != Operation::Acknowledge)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(reads.len(), 8);
    assert!(reads.iter().all(|&i| i < ack), "{out:?}");
}

/// IBT-C9-29: the responder completing a SEND says nothing about an earlier READ of the same
/// requester: here the SEND's receive completes while the 64 KiB READ is still in flight.
#[test]
fn ibt_c9_29_responder_send_completion_before_earlier_read_completes() {
    let mut s = rc(&Setup::default(), 4);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let src = pattern(65536, 4);
    s.n[1].fill(65536, &src);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(9, vec![Sge::new(k1, 0, 100)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::read(1, Some(Sge::new(k0, 0, 65536)), k1, 65536))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 200_000, 100)]))
        .unwrap();
    s.run_until(10_000, |s| !s.n[1].recvs.is_empty());
    assert_eq!(s.n[1].recvs[0].status, WcStatus::Success);
    assert!(s.n[0].sends.is_empty(), "the READ completed first here");
    s.run_until(10_000, |s| s.n[0].sends.len() == 2);
    assert_eq!(s.n[0].read(0, 65536), src);
}

/// IBT-C9-30, IBT-C9-32, IBT-X-10: a READ Response Middle is lost; the later responses show
/// the gap and the requester re-issues the READ from that PSN for the remaining octets only
/// (VA and length adjusted); the responder regenerates identical packets. The SEND posted
/// after the READ, acknowledged meanwhile, still completes after the READ.
#[test]
fn ibt_x_10_read_reissued_from_the_middle_and_c9_32_completion_order() {
    let setup = Setup::default();
    let mut s = rc(&setup, 5);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let src = pattern(5000, 5);
    s.n[1].fill(100_000, &src);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(9, vec![Sge::new(k1, 0, 100)]))
        .unwrap();
    let p0 = setup.psn[0];
    let lost = psn_add(p0, 2);
    let mut dropped = false;
    s.drop_filter = Some(Box::new(move |from, p| {
        let hit =
            !dropped && from == 1 && p.bth.psn == lost && p.bth.opcode.operation().is_response();
        dropped |= hit;
        hit
    }));
    s.n[0]
        .qp
        .post_send(SendWr::read(1, Some(Sge::new(k0, 0, 5000)), k1, 100_000))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 200_000, 100)]))
        .unwrap();
    s.run_until(100_000, |s| s.n[0].sends.len() == 2);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::Send)
        ]
    );
    assert_eq!(s.n[0].read(0, 5000), src);
    let reads: Vec<(u32, RethRepr)> = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 0 && r.opcode.operation() == Operation::RdmaReadRequest)
        .map(|r| (r.psn, r.reth.unwrap()))
        .collect();
    assert_eq!(reads.len(), 2);
    assert_eq!(reads[0].0, p0);
    assert_eq!((reads[0].1.va, reads[0].1.dma_len), (100_000, 5000));
    assert_eq!(reads[1].0, lost);
    assert_eq!(
        (reads[1].1.va, reads[1].1.dma_len),
        (100_000 + 2048, 5000 - 2048)
    );
    // Every response PSN sent twice carries the same payload both times.
    for d in 2..5 {
        let psn = psn_add(p0, d);
        let copies: Vec<&Vec<u8>> = s
            .log
            .iter()
            .filter(|r| r.tx && r.from == 1 && r.psn == psn && !r.payload.is_empty())
            .map(|r| &r.payload)
            .collect();
        assert_eq!(copies.len(), 2, "PSN +{d}");
        assert_eq!(copies[0], copies[1]);
    }
    assert_eq!(s.n[1].recvs.len(), 1, "the SEND executed once");
}

/// EXT-PSN-03: a SEND and the READ after it, the SEND's ACK and the READ's response both
/// lost. The requester goes back to the SEND; the duplicate is re-ACKed, but not with ePSN - 1
/// (the READ's PSN): that ACK would say the READ is done without its data (Linux rxe then
/// completes it with its buffer untouched, seen against rxe over a lossy link). The READ's own
/// regenerated response acknowledges it, and the data arrives.
#[test]
fn ext_psn_03_duplicate_send_re_ack_stops_before_a_later_read() {
    let setup = Setup::default();
    let mut s = rc(&setup, 21);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let src = pattern(64, 21);
    s.n[1].fill(50_000, &src);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(9, vec![Sge::new(k1, 0, 100)]))
        .unwrap();
    let send_psn = setup.psn[0];
    let read_psn = psn_add(send_psn, 1);
    let mut lost = (false, false);
    s.drop_filter = Some(Box::new(move |from, p| {
        if from != 1 {
            return false;
        }
        let op = p.bth.opcode.operation();
        if op == Operation::Acknowledge && !lost.0 {
            lost.0 = true;
            true
        } else if op.is_response() && op != Operation::Acknowledge && !lost.1 {
            lost.1 = true;
            true
        } else {
            false
        }
    }));
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 200_000, 16)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::read(2, Some(Sge::new(k0, 0, 64)), k1, 50_000))
        .unwrap();
    s.run_until(100_000, |s| s.n[0].sends.len() == 2);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
    assert_eq!(s.n[0].read(0, 64), src);
    assert_eq!(s.n[1].recvs.len(), 1, "the SEND executed once");
    let sends = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 0 && r.psn == send_psn)
        .count();
    assert!(sends >= 2, "the SEND went out again");
    // Every plain ACK after the READ arrived stays before the READ's PSN.
    let acks: Vec<u32> = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 1 && r.opcode.operation() == Operation::Acknowledge)
        .map(|r| r.psn)
        .collect();
    assert!(acks.len() >= 2, "the duplicate was re-ACKed: {acks:?}");
    assert!(
        acks.iter().all(|&a| psn_diff(a, read_psn) < 0),
        "an ACK covers the READ at {read_psn}: {acks:?}"
    );
}

/// IBT-C9-3 (engine part; arming and waking the CQ is the verbs layer's): SE is set on the
/// last packet of a solicited SEND / WRITE with immediate only, and the receive completion
/// carries it; an unsolicited SEND's does not.
#[test]
fn ibt_c9_3_solicited_event_reaches_the_receive_completion() {
    let mut s = rc(&Setup::default(), 6);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    for id in 0..3 {
        s.n[1]
            .qp
            .post_recv(RecvWr::new(id, vec![Sge::new(k1, 8192 * id, 4096)]))
            .unwrap();
    }
    let se = SendFlags::SIGNALED | SendFlags::SOLICITED;
    let qp = &mut s.n[0].qp;
    qp.post_send(SendWr::send(1, vec![Sge::new(k0, 0, 2500)]).with_flags(se))
        .unwrap();
    qp.post_send(SendWr::send(2, vec![Sge::new(k0, 0, 2500)]))
        .unwrap();
    qp.post_send(
        SendWr::write_with_imm(3, vec![Sge::new(k0, 0, 2500)], k1, 65536, 3).with_flags(se),
    )
    .unwrap();
    s.run_until(10_000, |s| {
        s.n[1].recvs.len() == 3 && s.n[0].sends.len() == 3
    });
    let flags: Vec<bool> = s.n[1].recvs.iter().map(|w| w.flags.solicited).collect();
    assert_eq!(flags, vec![true, false, true]);
    let se_pkts: Vec<Operation> = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 0 && r.se)
        .map(|r| r.opcode.operation())
        .collect();
    assert_eq!(
        se_pkts,
        vec![Operation::SendLast, Operation::RdmaWriteLastWithImmediate]
    );
}

/// IBT-C9-4: the responder does not use SE in header validation: a SEND Middle with SE set is
/// processed normally (no NAK) and the message is received whole.
#[test]
fn ibt_c9_4_se_on_a_middle_packet_is_not_validated() {
    let setup = Setup {
        pmtu: 256,
        ..Setup::default()
    };
    let mut s = rc(&setup, 7);
    let k1 = s.n[1].key;
    s.n[1]
        .qp
        .post_recv(RecvWr::new(9, vec![Sge::new(k1, 0, 1024)]))
        .unwrap();
    let data = pattern(600, 7);
    let p0 = setup.psn[0];
    let parts = [
        (Opcode::RC_SEND_FIRST, &data[..256], false),
        (Opcode::RC_SEND_MIDDLE, &data[256..512], true),
        (Opcode::RC_SEND_LAST, &data[512..], false),
    ];
    for (i, (op, payload, se)) in parts.into_iter().enumerate() {
        let mut p = PacketRepr::new(BthRepr::new(op, 0x22, psn_add(p0, i as u32)), payload);
        p.bth.se = se;
        p.bth.ack_req = i == 2;
        s.inject(1, &p);
    }
    s.run_idle(10_000);
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(9, WcStatus::Success, WcOpcode::Recv)]
    );
    assert!(!s.n[1].recvs[0].flags.solicited);
    assert_eq!(s.n[1].read(0, 600), data);
    let acks: Vec<(Operation, u32)> = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 1)
        .map(|r| (r.opcode.operation(), r.psn))
        .collect();
    assert_eq!(acks, vec![(Operation::Acknowledge, psn_add(p0, 2))]);
    assert!(s.log.iter().all(|r| r.syndrome.is_none_or(|y| y.is_ack())));
}

/// IBT-o9-5.2.1: SEND with Invalidate. A packet failing header validation (P_Key) is dropped
/// and its IETH key stays valid; an IETH key that may not be invalidated (a plain region,
/// o9-5.2.2 rule 3) is acknowledged all the same (the ACK does not reflect the invalidation)
/// and the failure is reported locally in the receive completion; a valid one is invalidated.
#[test]
fn ibt_o9_5_2_1_send_with_invalidate_ack_independent_of_invalidation() {
    let setup = Setup::default();
    let mut s = rc(&setup, 8);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let fast = s.n[1]
        .keys
        .reg_fast_mr(
            PdId(1),
            Buffer::new(4096),
            0,
            4096,
            0x10_0000,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let valid = |s: &Sim, k, va| {
        s.n[1]
            .keys
            .check_remote(k, PdId(1), QpId(0x22), Access::REMOTE_WRITE, va, 8)
            .is_ok()
    };
    for id in 0..3 {
        s.n[1]
            .qp
            .post_recv(RecvWr::new(id, vec![Sge::new(k1, 4096 * id, 4096)]))
            .unwrap();
    }
    // Invalid packet: P_Key of another partition.
    let mut p = PacketRepr::new(
        BthRepr::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 0x22, setup.psn[0]),
        b"abc",
    );
    p.bth.pkey = 0x8001;
    p.ieth = Some(IethRepr { r_key: fast.0 });
    s.inject(1, &p);
    s.run_idle(1000);
    assert!(valid(&s, fast, 0x10_0000));
    assert!(s.n[1].recvs.is_empty() && s.log.iter().all(|r| !r.tx));
    assert_eq!(s.n[1].qp.counters().bad_pkey, 1);
    // A key that cannot be invalidated, then one that can.
    s.n[0].fill(0, b"hello");
    s.n[0]
        .qp
        .post_send(SendWr::send_with_invalidate(
            1,
            vec![Sge::new(k0, 0, 5)],
            k1,
        ))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send_with_invalidate(
            2,
            vec![Sge::new(k0, 0, 5)],
            fast,
        ))
        .unwrap();
    s.run_until(10_000, |s| {
        s.n[0].sends.len() == 2 && s.n[1].recvs.len() == 2
    });
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::Send)
        ]
    );
    assert!(s.log.iter().all(|r| r.syndrome.is_none_or(|y| y.is_ack())));
    let r = &s.n[1].recvs;
    assert_eq!(
        (r[0].wr_id, r[0].status),
        (0, WcStatus::RemoteInvalidRequest)
    );
    assert_eq!(r[0].invalidated_key, None);
    assert!(valid(&s, k1, 0));
    assert_eq!((r[1].wr_id, r[1].status), (1, WcStatus::Success));
    assert_eq!(r[1].invalidated_key, Some(fast));
    assert!(r[1].flags.with_invalidate);
    assert!(!valid(&s, fast, 0x10_0000));
    assert_eq!(s.n[1].read(4096, 5), b"hello");
}

/// IBT-o9-17: ATOMICs are atomic with respect to other QPs of the same CA: four RC QPs on one
/// key table, each driven from its own thread, FetchAdd the same word 500 times each; the
/// final value is the sum and every original value was seen exactly once.
#[test]
fn ibt_o9_17_atomics_atomic_across_qps() {
    const QPS: usize = 4;
    const OPS: u64 = 500;
    let keys = Arc::new(KeyTable::with_seed(99));
    let target = Buffer::new(4096);
    let tkey = keys
        .reg_mr(
            PdId(1),
            target.clone(),
            0,
            4096,
            0,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    let setup = Setup::default();
    let originals: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..QPS as u32)
            .map(|t| {
                let keys = keys.clone();
                let target = target.clone();
                sc.spawn(move || {
                    let mut req = Node::new(QpType::Rc, 0x100 + t, 8 * OPS as usize, u64::from(t));
                    let mut resp = Node {
                        qp: IbQp::new(
                            0x200 + t,
                            QpType::Rc,
                            PdId(1),
                            QpCaps::default(),
                            keys.clone(),
                        ),
                        keys,
                        buf: target,
                        key: tkey,
                        sends: Vec::new(),
                        recvs: Vec::new(),
                    };
                    connect(&mut req, 0, 0x200 + t, &setup);
                    connect(&mut resp, 1, 0x100 + t, &setup);
                    let k = req.key;
                    for i in 0..OPS {
                        req.qp
                            .post_send(SendWr::fetch_add(i, Sge::new(k, 8 * i, 8), tkey, 64, 1))
                            .unwrap();
                    }
                    let now = std::time::Instant::now();
                    let mut out = Vec::new();
                    let mut done = 0;
                    while done < OPS {
                        for dir in 0..2 {
                            let (from, to) = if dir == 0 {
                                (&mut req.qp, &mut resp.qp)
                            } else {
                                (&mut resp.qp, &mut req.qp)
                            };
                            while let Some(tx) = from.poll_transmit(now, &mut out) {
                                let p = PacketRepr::parse(&out[..tx.len]).unwrap();
                                to.handle_packet(&p, &[0; 40], now);
                            }
                        }
                        while let Some(wc) = req.qp.poll_send_completion() {
                            assert_eq!(wc.status, WcStatus::Success);
                            done += 1;
                        }
                    }
                    (0..OPS as usize)
                        .map(|i| req.word(8 * i))
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total = QPS as u64 * OPS;
    let mut word = [0u8; 8];
    target.copy_out(64, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), total);
    let mut all: Vec<u64> = originals.concat();
    for per_qp in &originals {
        assert!(per_qp.windows(2).all(|w| w[0] < w[1]), "in order per QP");
    }
    all.sort_unstable();
    assert_eq!(all, (0..total).collect::<Vec<_>>());
}
