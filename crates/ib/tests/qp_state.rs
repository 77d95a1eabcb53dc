//! The QP state machine (`modify_qp`: transitions, required attributes, ranges), what each
//! state accepts (posting, receiving), the Error flush and the SQD drain, and the receive
//! header pipeline of IBA 9.6 with its drop counters.

mod sim;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sim::{Faults, Node, Setup, Sim, summary};
use softrdma_ib::{
    HeaderCounters, ModifyError, PostError, QpAttr, QpState, QpType, RecvWr, SendWr, Sge, UdDest,
    WcOpcode, WcStatus,
};
use softrdma_memory::Access;
use softrdma_testkit::pattern;
use softrdma_wire::ib::{BthRepr, DethRepr, Opcode, Operation, PacketRepr, RdethRepr, Service};

use QpState::*;

const STATES: [QpState; 6] = [Reset, Init, Rtr, Rts, Sqd, Error];

/// Every attribute, valid, with `state`.
fn full(state: QpState) -> QpAttr {
    QpAttr {
        state: Some(state),
        pkey: Some(0xFFFF),
        qkey: Some(0x1111_1111),
        access: Some(Access::REMOTE),
        pmtu: Some(1024),
        dest_qp: Some(0x22),
        rq_psn: Some(100),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(12),
        sq_psn: Some(200),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(4),
    }
}

/// A QP of `ty` brought to `state` along the usual path.
fn qp_in(ty: QpType, state: QpState) -> Node {
    let mut n = Node::new(ty, 0x11, 1 << 16, 1);
    let path: &[QpState] = match state {
        Reset => &[],
        Init => &[Init],
        Rtr => &[Init, Rtr],
        Rts => &[Init, Rtr, Rts],
        Sqd => &[Init, Rtr, Rts, Sqd],
        Error => &[Error],
        Sqe => unreachable!("not entered through modify_qp"),
    };
    for &s in path {
        n.qp.modify(&full(s)).unwrap();
    }
    assert_eq!(n.qp.state(), state);
    n
}

/// IBA 10.3.1 / the verbs table: which `modify_qp` transitions exist; a refused one leaves
/// the QP as it was.
#[test]
fn modify_transitions_allowed_and_refused() {
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for from in STATES {
            for to in STATES {
                let allowed = matches!(
                    (from, to),
                    (_, Reset)
                        | (_, Error)
                        | (Reset, Init)
                        | (Init, Init)
                        | (Init, Rtr)
                        | (Rtr, Rts)
                        | (Rts, Rts)
                        | (Rts, Sqd)
                        | (Sqd, Sqd)
                        | (Sqd, Rts)
                );
                let mut n = qp_in(ty, from);
                let r = n.qp.modify(&full(to));
                if allowed {
                    assert_eq!(r, Ok(()), "{ty:?} {from:?} -> {to:?}");
                    assert_eq!(n.qp.state(), to);
                } else {
                    assert_eq!(
                        r,
                        Err(ModifyError::Transition { from, to }),
                        "{ty:?} {from:?} -> {to:?}"
                    );
                    assert_eq!(n.qp.state(), from);
                }
            }
            // SQE is entered by a send-queue error, never by modify_qp.
            let mut n = qp_in(ty, from);
            assert_eq!(
                n.qp.modify(&full(Sqe)),
                Err(ModifyError::Transition { from, to: Sqe })
            );
        }
    }
}

/// Required attributes per transition and service (verbs `ibv_modify_qp` table): leaving one
/// out is refused with its name and changes nothing.
#[test]
fn modify_required_attributes() {
    type Clear = fn(&mut QpAttr);
    let rtr: [(&str, Clear); 5] = [
        ("path_mtu", |a| a.pmtu = None),
        ("dest_qp_num", |a| a.dest_qp = None),
        ("rq_psn", |a| a.rq_psn = None),
        ("max_dest_rd_atomic", |a| a.max_dest_rd_atomic = None),
        ("min_rnr_timer", |a| a.min_rnr_timer = None),
    ];
    let rts: [(&str, Clear); 5] = [
        ("sq_psn", |a| a.sq_psn = None),
        ("timeout", |a| a.timeout = None),
        ("retry_cnt", |a| a.retry_cnt = None),
        ("rnr_retry", |a| a.rnr_retry = None),
        ("max_rd_atomic", |a| a.max_rd_atomic = None),
    ];
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for (from, to, list) in [(Init, Rtr, &rtr), (Rtr, Rts, &rts)] {
            for (i, &(name, clear)) in list.iter().enumerate() {
                let mut n = qp_in(ty, from);
                let mut a = full(to);
                clear(&mut a);
                let required = match ty {
                    QpType::Rc => true,
                    // UC: the path and PSNs; UD: only sq_psn.
                    QpType::Uc => i < 3 && (from == Init || i == 0),
                    QpType::Ud => from == Rtr && i == 0,
                };
                let r = n.qp.modify(&a);
                if required {
                    assert_eq!(r, Err(ModifyError::Missing(name)), "{ty:?} {name}");
                    assert_eq!(n.qp.state(), from);
                } else {
                    assert_eq!(r, Ok(()), "{ty:?} {name}");
                }
            }
        }
        // Q_Key at RESET -> INIT: UD only.
        let mut n = qp_in(ty, Reset);
        let r = n.qp.modify(&QpAttr {
            qkey: None,
            ..full(Init)
        });
        if ty == QpType::Ud {
            assert_eq!(r, Err(ModifyError::Missing("qkey")));
            assert_eq!(n.qp.state(), Reset);
        } else {
            assert_eq!(r, Ok(()));
        }
    }
}

/// Attribute ranges: path MTU one of 256..4096, retry counts 0..=7, timer codes 0..=31, PSNs
/// and QP numbers 24 bits; out of range is refused by name and nothing is applied.
#[test]
fn modify_attribute_ranges() {
    type Set = fn(&mut QpAttr);
    let bad: [(&str, Set); 10] = [
        ("path_mtu", |a| a.pmtu = Some(300)),
        ("path_mtu", |a| a.pmtu = Some(128)),
        ("path_mtu", |a| a.pmtu = Some(8192)),
        ("retry_cnt", |a| a.retry_cnt = Some(8)),
        ("rnr_retry", |a| a.rnr_retry = Some(8)),
        ("timeout", |a| a.timeout = Some(32)),
        ("min_rnr_timer", |a| a.min_rnr_timer = Some(32)),
        ("rq_psn", |a| a.rq_psn = Some(1 << 24)),
        ("sq_psn", |a| a.sq_psn = Some(1 << 24)),
        ("dest_qp_num", |a| a.dest_qp = Some(1 << 24)),
    ];
    for (name, set) in bad {
        let mut n = qp_in(QpType::Rc, Rtr);
        let mut a = full(Rts);
        a.pmtu = Some(4096);
        set(&mut a);
        assert_eq!(n.qp.modify(&a), Err(ModifyError::Invalid(name)));
        assert_eq!((n.qp.state(), n.qp.pmtu()), (Rtr, 1024));
    }
    for pmtu in [256, 512, 1024, 2048, 4096] {
        let mut n = qp_in(QpType::Rc, Init);
        let mut a = full(Rtr);
        a.pmtu = Some(pmtu);
        a.rq_psn = Some((1 << 24) - 1);
        a.dest_qp = Some((1 << 24) - 1);
        a.min_rnr_timer = Some(31);
        n.qp.modify(&a).unwrap();
        assert_eq!(n.qp.pmtu(), pmtu);
        assert_eq!(n.qp.dest_qp(), (1 << 24) - 1);
    }
}

/// What `post_send` / `post_recv` do in each state: Reset refuses both; Init and RTR take
/// receives only; RTS both; SQD queues sends; Error completes both flushed at once (even if
/// the QP never reached RTS).
#[test]
fn posting_in_each_state() {
    for state in STATES {
        let mut n = qp_in(QpType::Rc, state);
        let k = n.key;
        let s = n.qp.post_send(SendWr::send(1, vec![Sge::new(k, 0, 10)]));
        let r = n.qp.post_recv(RecvWr::new(2, vec![Sge::new(k, 0, 10)]));
        match state {
            Reset => {
                assert_eq!((s, r), (Err(PostError::State), Err(PostError::State)));
            }
            Init | Rtr => {
                assert_eq!((s, r), (Err(PostError::State), Ok(())));
            }
            Rts | Sqd | Error => assert_eq!((s, r), (Ok(()), Ok(())), "{state:?}"),
            Sqe => unreachable!(),
        }
        let mut out = Vec::new();
        let tx = n.qp.poll_transmit(std::time::Instant::now(), &mut out);
        assert_eq!(tx.is_some(), state == Rts, "{state:?} transmits");
        n.drain();
        if state == Error {
            assert_eq!(
                summary(&n.sends),
                vec![(1, WcStatus::WorkRequestFlushed, WcOpcode::Send)]
            );
            assert_eq!(
                summary(&n.recvs),
                vec![(2, WcStatus::WorkRequestFlushed, WcOpcode::Recv)]
            );
        } else {
            assert!(n.sends.is_empty() && n.recvs.is_empty(), "{state:?}");
        }
    }
}

/// Moving to Error flushes every outstanding send (in order, also those already on the wire)
/// and every receive, stops the timers, and nothing more is transmitted.
#[test]
fn error_flushes_sends_and_receives() {
    let mut s = Sim::new(QpType::Rc, 1 << 20, &Setup::default(), Faults::default(), 3);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.hold[1] = true; // no ACK comes back
    for id in 0..3 {
        s.n[0]
            .qp
            .post_recv(RecvWr::new(100 + id, vec![Sge::new(k0, 0, 100)]))
            .unwrap();
    }
    s.n[0]
        .qp
        .post_send(SendWr::write(1, vec![Sge::new(k0, 0, 3000)], k1, 0))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::read(2, Some(Sge::new(k0, 8192, 100)), k1, 0))
        .unwrap();
    s.pump();
    s.n[0]
        .qp
        .post_send(SendWr::send(3, vec![Sge::new(k0, 0, 10)]))
        .unwrap();
    assert!(s.n[0].qp.poll_timeout().is_some());
    s.n[0].qp.modify(&QpAttr::state(Error)).unwrap();
    s.n[0].drain();
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::WorkRequestFlushed, WcOpcode::RdmaWrite),
            (2, WcStatus::WorkRequestFlushed, WcOpcode::RdmaRead),
            (3, WcStatus::WorkRequestFlushed, WcOpcode::Send),
        ]
    );
    assert_eq!(
        summary(&s.n[0].recvs),
        (100..103)
            .map(|id| (id, WcStatus::WorkRequestFlushed, WcOpcode::Recv))
            .collect::<Vec<_>>()
    );
    assert_eq!(s.n[0].qp.poll_timeout(), None);
    assert_eq!(s.n[0].qp.sq_outstanding(), 0);
    let mut out = Vec::new();
    assert!(s.n[0].qp.poll_transmit(s.now, &mut out).is_none());
    // Error -> Reset -> usable again from scratch.
    s.n[0].qp.modify(&QpAttr::state(Reset)).unwrap();
    assert_eq!(
        s.n[0].qp.post_send(SendWr::send(4, vec![])),
        Err(PostError::State)
    );
}

/// SQD: the message in progress finishes, no new one starts; the drained event comes once,
/// after the in-progress message completed; SQD -> RTS resumes with the queued ones.
#[test]
fn sqd_finishes_the_message_in_progress_then_reports_drained() {
    let setup = Setup::default();
    let mut s = Sim::new(QpType::Rc, 1 << 20, &setup, Faults::default(), 4);
    s.capture = true;
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let data = pattern(9000, 4);
    s.n[0].fill(0, &data);
    for id in 0..3u64 {
        s.n[1]
            .qp
            .post_recv(RecvWr::new(id, vec![Sge::new(k1, 10_000 * id, 4000)]))
            .unwrap();
        s.n[0]
            .qp
            .post_send(SendWr::send(id, vec![Sge::new(k0, 3000 * id, 3000)]))
            .unwrap();
    }
    // One packet (SEND First of message 0) leaves, then SQD.
    let mut out = Vec::new();
    let tx = s.n[0].qp.poll_transmit(s.now, &mut out).unwrap();
    let first = PacketRepr::parse(&out[..tx.len]).unwrap();
    assert_eq!(first.bth.opcode.operation(), Operation::SendFirst);
    s.inject(1, &first);
    s.n[0].qp.modify(&QpAttr::state(Sqd)).unwrap();
    assert!(!s.n[0].qp.take_sq_drained());
    // SQD -> SQD with new timer attributes is allowed.
    s.n[0]
        .qp
        .modify(&QpAttr {
            state: Some(Sqd),
            retry_cnt: Some(5),
            ..QpAttr::default()
        })
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(3, vec![Sge::new(k0, 0, 10)]))
        .unwrap();
    s.run_idle(10_000);
    let ops: Vec<Operation> = s
        .log
        .iter()
        .filter(|r| r.tx && r.from == 0)
        .map(|r| r.opcode.operation())
        .collect();
    assert_eq!(ops, vec![Operation::SendMiddle, Operation::SendLast]);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![(0, WcStatus::Success, WcOpcode::Send)]
    );
    assert_eq!(s.n[1].read(0, 3000), data[..3000]);
    assert!(s.n[0].qp.take_sq_drained());
    assert!(!s.n[0].qp.take_sq_drained(), "reported once");
    s.n[0].qp.modify(&QpAttr::state(Rts)).unwrap();
    s.n[1]
        .qp
        .post_recv(RecvWr::new(3, vec![Sge::new(k1, 50_000, 100)]))
        .unwrap();
    s.run_until(10_000, |s| s.n[0].sends.len() == 4);
    let ids: Vec<u64> = s.n[0].sends.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    for id in 1..3 {
        assert_eq!(
            s.n[1].read(10_000 * id, 3000),
            data[3000 * id..3000 * (id + 1)]
        );
    }
}

/// A connected pair for header tests: side 1 is the QP under test.
fn pair(ty: QpType, seed: u64) -> Sim {
    let mut s = Sim::new(ty, 1 << 16, &Setup::default(), Faults::default(), seed);
    s.capture = true;
    s
}

/// A SEND Only (UD: with DETH) to side 1 at its expected PSN, asking for an ACK.
fn send_only(ty: QpType, payload: &[u8]) -> PacketRepr<'_> {
    let op = Opcode::new(ty.service(), Operation::SendOnly).unwrap();
    let mut p = PacketRepr::new(BthRepr::new(op, 0x22, Setup::default().psn[0]), payload);
    p.bth.ack_req = true;
    if ty == QpType::Ud {
        p.deth = Some(DethRepr {
            q_key: 0x1111_1111,
            reserved: 0,
            src_qp: 0x11,
        });
    }
    p
}

fn counters(s: &Sim) -> HeaderCounters {
    s.n[1].qp.counters()
}

/// The silent-drop checks of IBT-X-18 after one bad packet: no response, no receive
/// consumed; then the same packet made valid is accepted at the same PSN (ePSN unchanged).
fn assert_dropped_then_valid_accepted(s: &mut Sim, ty: QpType) {
    s.run_idle(1000);
    assert!(
        s.log.iter().all(|r| !r.tx),
        "a response to a dropped packet"
    );
    assert!(s.n[1].recvs.is_empty());
    let p = send_only(ty, b"good");
    s.inject(1, &p);
    s.run_idle(1000);
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(7, WcStatus::Success, WcOpcode::Recv)]
    );
    let at = if ty == QpType::Ud { 40 } else { 0 };
    assert_eq!(s.n[1].read(at, 4), b"good");
}

fn post_one(s: &mut Sim) {
    let k1 = s.n[1].key;
    s.n[1]
        .qp
        .post_recv(RecvWr::new(7, vec![Sge::new(k1, 0, 4096)]))
        .unwrap();
}

/// IBT-C9-36, IBT-X-02: TVer other than 0 -> silently dropped (no NAK, ePSN unchanged), on
/// every service.
#[test]
fn ibt_c9_36_tver_nonzero_dropped() {
    for (i, ty) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        for tver in [1, 15] {
            let mut s = pair(ty, 10 + i as u64);
            post_one(&mut s);
            let mut p = send_only(ty, b"bad!");
            p.bth.tver = tver;
            s.inject(1, &p);
            assert_eq!(
                counters(&s),
                HeaderCounters {
                    bad_tver: 1,
                    ..HeaderCounters::default()
                }
            );
            assert_dropped_then_valid_accepted(&mut s, ty);
        }
    }
}

/// IBT-C9-37: packets for a QP in RESET or INIT are dropped (receives posted in INIT stay).
#[test]
fn ibt_c9_37_reset_and_init_drop_packets() {
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let mut n = qp_in(ty, Reset);
        let p = send_only(ty, b"x");
        let now = std::time::Instant::now();
        n.qp.handle_packet(&p, &[0; 40], now);
        n.qp.modify(&full(Init)).unwrap();
        let k = n.key;
        n.qp.post_recv(RecvWr::new(1, vec![Sge::new(k, 0, 100)]))
            .unwrap();
        n.qp.handle_packet(&p, &[0; 40], now);
        let mut out = Vec::new();
        assert!(n.qp.poll_transmit(now, &mut out).is_none());
        n.drain();
        assert!(n.recvs.is_empty());
        assert_eq!(n.qp.counters().bad_state, 2, "{ty:?}");
        assert_eq!(n.qp.responder_counters(), Default::default());
    }
}

/// IBT-C9-38, IBT-C9-39 (engine part: wrong service and bad state are dropped silently;
/// finding the QP by DestQP is the driver's), IBT-C9-47.2.1: an opcode of another service
/// (UC to RC, RC to UC, UD to RC, RD 0x44 to any, CNP) is dropped without a response.
#[test]
fn ibt_c9_38_wrong_service_dropped() {
    let rd_send_only = Opcode::new(Service::Rd, Operation::SendOnly).unwrap();
    assert_eq!(rd_send_only.value(), 0x44);
    for (i, ty) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        let others = [
            Opcode::RC_SEND_ONLY,
            Opcode::UC_SEND_ONLY,
            Opcode::UD_SEND_ONLY,
            rd_send_only,
            Opcode::CNP,
        ];
        let mut s = pair(ty, 20 + i as u64);
        post_one(&mut s);
        let mut n = 0;
        for op in others.into_iter().filter(|o| o.service() != ty.service()) {
            let mut p = PacketRepr::new(BthRepr::new(op, 0x22, Setup::default().psn[0]), &[]);
            p.bth.ack_req = true;
            if op.headers().deth {
                p.deth = Some(DethRepr {
                    q_key: 0x1111_1111,
                    reserved: 0,
                    src_qp: 0x11,
                });
            }
            if op.headers().rdeth {
                p.rdeth = Some(RdethRepr {
                    reserved: 0,
                    ee_context: 1,
                });
            }
            s.inject(1, &p);
            n += 1;
        }
        assert_eq!(
            counters(&s),
            HeaderCounters {
                bad_service: n,
                ..HeaderCounters::default()
            },
            "{ty:?}"
        );
        assert_dropped_then_valid_accepted(&mut s, ty);
    }
}

/// IBT-C9-43, IBT-C9-51: the P_Key must match the QP's under the rules of IBA 10.9.3 (low 15
/// bits equal, at least one full member); a mismatch is dropped before any ACK is generated.
/// (A limited member 0x7FFF does match a full-member 0xFFFF QP.)
#[test]
fn ibt_c9_43_pkey_mismatch_dropped_before_any_ack() {
    // (QP P_Key, packet P_Key, accepted)
    let cases = [
        (0xFFFF, 0xFFFF, true),
        (0xFFFF, 0x7FFF, true),
        (0x7FFF, 0xFFFF, true),
        (0x7FFF, 0x7FFF, false), // both limited
        (0xFFFF, 0x8001, false), // another partition
        (0xFFFF, 0x0000, false), // invalid P_Key
        (0x8001, 0x8002, false),
    ];
    for (i, ty) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        for (j, &(mine, theirs, ok)) in cases.iter().enumerate() {
            let mut s = pair(ty, 30 + 10 * i as u64 + j as u64);
            s.n[1]
                .qp
                .modify(&QpAttr {
                    state: Some(Rts),
                    pkey: Some(mine),
                    ..QpAttr::default()
                })
                .unwrap();
            post_one(&mut s);
            let mut p = send_only(ty, b"good");
            p.bth.pkey = theirs;
            s.inject(1, &p);
            let why = format!("{ty:?} QP {mine:#x} packet {theirs:#x}");
            if ok {
                let accepted = HeaderCounters {
                    accepted: 1,
                    ..HeaderCounters::default()
                };
                assert_eq!(counters(&s), accepted, "{why}");
                assert_eq!(s.n[1].recvs.len(), 1, "{why}");
            } else {
                assert_eq!(
                    counters(&s),
                    HeaderCounters {
                        bad_pkey: 1,
                        ..HeaderCounters::default()
                    },
                    "{why}"
                );
                // IBT-C9-51: no ACK (the packet asked for one).
                s.run_idle(1000);
                assert!(s.log.iter().all(|r| !r.tx), "{why}");
                assert!(s.n[1].recvs.is_empty(), "{why}");
            }
        }
    }
}

/// IBT-C9-35: the first failing check of the pipeline decides (TVer, then state, then service,
/// then P_Key, then Q_Key): each packet is counted once, under its first failure.
#[test]
fn ibt_c9_35_first_failing_check_decides() {
    let mut s = pair(QpType::Ud, 40);
    let bad = |tver: u8, service: bool, pkey: bool, qkey: bool| {
        let op = if service {
            Opcode::RC_SEND_ONLY
        } else {
            Opcode::UD_SEND_ONLY
        };
        let mut p = PacketRepr::new(BthRepr::new(op, 0x22, 0), &[]);
        p.bth.tver = tver;
        if pkey {
            p.bth.pkey = 0x8001;
        }
        if !service {
            p.deth = Some(DethRepr {
                q_key: if qkey { 0x2222_2222 } else { 0x1111_1111 },
                reserved: 0,
                src_qp: 0x11,
            });
        }
        p
    };
    s.inject(1, &bad(1, true, true, false)); // TVer first
    s.inject(1, &bad(1, false, true, true));
    s.inject(1, &bad(0, true, true, false)); // then service
    s.inject(1, &bad(0, false, true, true)); // then P_Key
    s.inject(1, &bad(0, false, false, true)); // then Q_Key
    assert_eq!(
        counters(&s),
        HeaderCounters {
            bad_tver: 2,
            bad_service: 1,
            bad_pkey: 1,
            bad_qkey: 1,
            ..HeaderCounters::default()
        }
    );
    // TVer is checked before the state: a QP in Error counts a TVer 1 packet as bad TVer.
    s.n[1].qp.modify(&QpAttr::state(Error)).unwrap();
    s.inject(1, &bad(1, false, false, false));
    s.inject(1, &bad(0, true, true, true));
    let c = counters(&s);
    assert_eq!((c.bad_tver, c.bad_state, c.bad_service), (3, 1, 1));
}

/// IBT-C9-34: random packets (every opcode, random TVer, P_Key, PSN, headers, payload)
/// through the full pipeline of an RC, a UC and a UD QP: nothing panics, every packet failing
/// a header check is counted under the right reason and answered by nothing.
#[test]
fn ibt_c9_34_random_headers_through_the_pipeline() {
    let mut rng = StdRng::seed_from_u64(34);
    for (i, ty) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
        let mut s = pair(ty, 50 + i as u64);
        let k1 = s.n[1].key;
        for id in 0..64 {
            s.n[1]
                .qp
                .post_recv(RecvWr::new(id, vec![Sge::new(k1, 0, 8192)]))
                .unwrap();
        }
        let mut expect = HeaderCounters::default();
        let mut injected = 0;
        let mut buf = vec![0u8; 1200];
        for _ in 0..3000 {
            rng.fill(&mut buf[..]);
            // Half of them of the QP's own service.
            let opcodes: Vec<Opcode> = Opcode::all()
                .filter(|o| rng.random_bool(0.5) || o.service() == ty.service())
                .collect();
            let op = opcodes[rng.random_range(0..opcodes.len())];
            buf[0] = op.value();
            // TVer 0 most of the time.
            buf[1] = (buf[1] & 0xF0)
                | if rng.random_bool(0.2) {
                    buf[1] & 0x0F
                } else {
                    0
                };
            // P_Key: mostly the default.
            let pkey: u16 = if rng.random_bool(0.7) {
                0xFFFF
            } else {
                rng.random()
            };
            buf[2..4].copy_from_slice(&pkey.to_be_bytes());
            buf[5..8].copy_from_slice(&[0, 0, 0x22]);
            let len = rng.random_range(12..buf.len());
            let Ok(p) = PacketRepr::parse(&buf[..len]) else {
                continue; // a driver drops what does not parse
            };
            let sent_before = s.log.iter().filter(|r| r.tx && r.from == 1).count();
            s.inject(1, &p);
            injected += 1;
            let bad = if p.bth.tver != 0 {
                expect.bad_tver += 1;
                true
            } else if p.bth.opcode.service() != ty.service() {
                expect.bad_service += 1;
                true
            } else if !softrdma_ib::pkey_matches(p.bth.pkey, 0xFFFF) {
                expect.bad_pkey += 1;
                true
            } else if ty == QpType::Ud && p.deth.is_some_and(|d| d.q_key != 0x1111_1111) {
                expect.bad_qkey += 1;
                true
            } else {
                expect.accepted += 1;
                false
            };
            assert_eq!(s.n[1].qp.counters(), expect, "{ty:?} {p:?}");
            if bad {
                s.pump();
                let sent = s.log.iter().filter(|r| r.tx && r.from == 1).count();
                assert_eq!(sent, sent_before, "response to a dropped packet {p:?}");
            }
            s.run_idle(100_000);
        }
        eprintln!(
            "{ty:?}: {injected} packets, {expect:?}, {:?}",
            s.n[1].qp.responder_counters()
        );
        assert!(injected > 1000);
        assert!(expect.bad_tver > 0 && expect.bad_service > 0 && expect.bad_pkey > 0);
        if ty == QpType::Ud {
            assert!(expect.bad_qkey > 0);
        }
    }
}

/// A UD QP drops datagrams for another Q_Key (IBT-C9-50) and for a QP in RESET; a UD Q_Key
/// with the high bit set in the work request means "the QP's own" (C9-49 rule of verbs).
#[test]
fn ud_qkey_of_the_qp_used_when_high_bit_set() {
    let mut s = pair(QpType::Ud, 60);
    let k0 = s.n[0].key;
    post_one(&mut s);
    s.n[0].fill(0, b"qkey");
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 4)]).to(UdDest {
            ah: 0,
            remote_qpn: 0x22,
            remote_qkey: 0x8000_0000,
        }))
        .unwrap();
    s.run_idle(1000);
    // Both QPs have Q_Key 0x1111_1111: the datagram passes.
    assert_eq!(s.n[1].recvs.len(), 1);
    assert_eq!(s.n[1].read(40, 4), b"qkey");
}

/// IBA 10.3.1: a local error on a UC send (its buffer deregistered after the post) completes
/// that request in error, flushes the rest and moves the QP to SQE; receives go on; SQE → RTS
/// resumes sending.
#[test]
fn uc_local_send_error_enters_sqe_and_resumes() {
    let mut s = Sim::new(
        QpType::Uc,
        1 << 16,
        &Setup::default(),
        Faults::default(),
        77,
    );
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let keys = s.n[0].keys.clone();
    // A second region on side 0 that goes away after the post.
    let gone = softrdma_memory::Buffer::new(4096);
    let gk = keys
        .reg_mr(
            softrdma_memory::PdId(1),
            gone,
            0,
            4096,
            0x100_0000,
            Access::LOCAL_WRITE,
        )
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::write(1, vec![Sge::new(gk, 0x100_0000, 100)], k1, 0))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::write(2, vec![Sge::new(k0, 0, 100)], k1, 0))
        .unwrap();
    keys.dereg_mr(gk).unwrap();
    s.run_idle(1000);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::LocalProtection, WcOpcode::RdmaWrite),
            (2, WcStatus::WorkRequestFlushed, WcOpcode::RdmaWrite)
        ]
    );
    assert_eq!(s.n[0].qp.state(), Sqe);
    // Requests posted in SQE complete flushed; receives still work.
    s.n[0]
        .qp
        .post_send(SendWr::send(3, vec![Sge::new(k0, 0, 10)]))
        .unwrap();
    s.n[0]
        .qp
        .post_recv(RecvWr::new(9, vec![Sge::new(k0, 8192, 100)]))
        .unwrap();
    s.n[1]
        .qp
        .post_send(SendWr::send(4, vec![Sge::new(k1, 0, 20)]))
        .unwrap();
    s.run_idle(1000);
    assert_eq!(
        summary(&s.n[0].sends)[2],
        (3, WcStatus::WorkRequestFlushed, WcOpcode::Send)
    );
    assert_eq!(
        summary(&s.n[0].recvs),
        vec![(9, WcStatus::Success, WcOpcode::Recv)]
    );
    // SQE -> RTS: sending resumes.
    s.n[0].qp.modify(&QpAttr::state(Rts)).unwrap();
    s.n[1]
        .qp
        .post_recv(RecvWr::new(5, vec![Sge::new(k1, 8192, 100)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(6, vec![Sge::new(k0, 0, 30)]))
        .unwrap();
    s.run_idle(1000);
    assert_eq!(
        summary(&s.n[0].sends)[3],
        (6, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(5, WcStatus::Success, WcOpcode::Recv)]
    );
}
