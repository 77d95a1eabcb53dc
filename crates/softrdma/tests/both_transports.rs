//! The same verbs over iWARP and RoCEv2 (issue 8, Done-when 2): shared receive queues,
//! memory windows (types 1 and 2, bind, local and remote invalidation), atomics from several
//! QPs onto one word (RFC 7306 on iWARP, IBA 9.4.5 on RoCE) and immediate data. Every test
//! body is written once and run over both transports; every byte and result is checked.
//!
//! Waits block on CQs with a generous timeout as a safety net only.

mod util;

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::Duration;

use softrdma::iwarp::QpEvent;
use softrdma::*;
use softrdma_testkit::pattern;
use util::{ACCESS, Pair, Side, TIMEOUT, setup, summary, until};

fn both(test: impl Fn(Transport)) {
    for t in util::BOTH {
        test(t);
    }
}

/// RDMAP-134 / SRQ: four QPs take their receive buffers from one SRQ; every message lands in
/// exactly one buffer and completes on the QP it arrived on.
#[test]
fn srq_serves_several_qps() {
    both(|t| {
        const MSG: usize = 3000;
        const PER_QP: usize = 8;
        let srq_attr = SrqAttr {
            max_wr: 256,
            max_sge: 4,
        };
        let p = setup(t).qps(4).mr_len(64 * MSG).srq(srq_attr).pair();
        let Pair {
            server,
            client,
            srq: Some(srq),
            ..
        } = p
        else {
            unreachable!()
        };
        let slots = 4 * PER_QP;
        for i in 0..slots {
            srq.post_recv(RecvWr::new(
                i as u64,
                vec![server.mr.sge(i * MSG, MSG as u32)],
            ))
            .unwrap();
        }
        assert_eq!(srq.len(), slots);
        for (q, qp) in client.qps.iter().enumerate() {
            for k in 0..PER_QP {
                let seed = (q * PER_QP + k) as u8;
                let off = (q * PER_QP + k) * MSG;
                client
                    .mr
                    .copy_in(off, &pattern(MSG, u64::from(seed)))
                    .unwrap();
                qp.post_send(SendWr::send(
                    seed.into(),
                    vec![client.mr.sge(off, MSG as u32)],
                ))
                .unwrap();
            }
        }
        let sends = client.wait(slots);
        assert!(
            sends.iter().all(|w| w.status == WcStatus::Success),
            "{t:?} {sends:?}"
        );
        let recvs = server.wait(slots);
        let mut used = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for w in &recvs {
            assert_eq!(
                (w.status, w.opcode),
                (WcStatus::Success, WcOpcode::Recv),
                "{t:?}"
            );
            assert_eq!(w.byte_len as usize, MSG);
            assert!(used.insert(w.wr_id), "{t:?}: buffer {} used twice", w.wr_id);
            let got = server.mr.to_vec()[w.wr_id as usize * MSG..][..MSG].to_vec();
            let seed = (0..slots as u64)
                .find(|&s| got == pattern(MSG, s))
                .unwrap_or_else(|| panic!("{t:?}: buffer {} holds no message", w.wr_id));
            assert!(seen.insert(seed), "{t:?}: message {seed} twice");
        }
        assert_eq!(seen.len(), slots);
        assert!(srq.is_empty());
        // The server's QPs refuse receives of their own.
        assert!(matches!(
            server.qps[0].post_recv(RecvWr::new(99, vec![server.mr.sge(0, 1)])),
            Err(Error::SrqAttached) | Err(Error::Post(PostError::SrqAttached))
        ));
    });
}

/// Atomics from several QPs (each posted from its own thread) onto one word: every original
/// value 0..N is returned exactly once and the word ends at N (each executed once, RFC 7306
/// §5 / IBA 9.4.5); then a Compare-and-Swap that matches and one that does not.
#[test]
fn atomics_from_several_qps_onto_one_word() {
    both(|t| {
        const QPS: usize = 4;
        const EACH: usize = 250;
        const RESULTS: usize = 4096;
        let Pair { server, client, .. } = setup(t)
            .qps(QPS)
            .mr_len(RESULTS + 8 * QPS * EACH + 64)
            .pair();
        let rkey = server.mr.rkey();
        let word = server.mr.addr(64);
        std::thread::scope(|s| {
            for (q, qp) in client.qps.iter().enumerate() {
                let mr = &client.mr;
                s.spawn(move || {
                    for i in 0..EACH {
                        let slot = RESULTS + 8 * (q * EACH + i);
                        let wr_id = (q * EACH + i) as u64;
                        qp.post_send(SendWr::fetch_add(wr_id, mr.sge(slot, 8), rkey, word, 1))
                            .unwrap();
                    }
                });
            }
        });
        let wcs = client.wait(QPS * EACH);
        for w in &wcs {
            assert_eq!(
                (w.status, w.opcode),
                (WcStatus::Success, WcOpcode::FetchAdd),
                "{t:?}"
            );
            assert_eq!(w.byte_len, 8);
        }
        let bytes = client.mr.to_vec();
        let originals: BTreeSet<u64> = (0..QPS * EACH)
            .map(|k| {
                let at = RESULTS + 8 * k;
                u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
            })
            .collect();
        let want: BTreeSet<u64> = (0..(QPS * EACH) as u64).collect();
        assert_eq!(originals, want, "{t:?}: every original value exactly once");
        let final_word = u64::from_ne_bytes(server.mr.to_vec()[64..72].try_into().unwrap());
        assert_eq!(final_word, (QPS * EACH) as u64, "{t:?}");

        // Compare-and-Swap: equal swaps, unequal leaves the word; both return the original.
        let n = final_word;
        let qp = &client.qps[0];
        qp.post_send(SendWr::cmp_swap(1, client.mr.sge(0, 8), rkey, word, n, 7))
            .unwrap();
        qp.post_send(SendWr::cmp_swap(2, client.mr.sge(8, 8), rkey, word, n, 9))
            .unwrap();
        let wcs = client.wait(2);
        assert!(
            wcs.iter()
                .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::CompSwap)
        );
        let b = client.mr.to_vec();
        assert_eq!(u64::from_ne_bytes(b[0..8].try_into().unwrap()), n);
        assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 7);
        assert_eq!(
            u64::from_ne_bytes(server.mr.to_vec()[64..72].try_into().unwrap()),
            7,
            "{t:?}"
        );
    });
}

/// Send and RDMA Write with immediate data: the receive completes with the immediate value,
/// the Write's length and opcode `RecvRdmaWithImm`; the Send's bytes land in the buffer.
#[test]
fn immediate_data() {
    both(|t| {
        const LEN: usize = 5000;
        let Pair { server, client, .. } = setup(t).mr_len(4 * LEN).pair();
        let (sqp, cqp) = (&server.qps[0], &client.qps[0]);
        for i in 0..3 {
            sqp.post_recv(RecvWr::new(
                i,
                vec![server.mr.sge(i as usize * LEN, LEN as u32)],
            ))
            .unwrap();
        }
        client.mr.copy_in(0, &pattern(LEN, 1)).unwrap();
        client.mr.copy_in(LEN, &pattern(LEN, 2)).unwrap();
        cqp.post_send(SendWr::send_with_imm(
            1,
            vec![client.mr.sge(0, LEN as u32)],
            0xDEAD_BEEF,
        ))
        .unwrap();
        cqp.post_send(SendWr::write_with_imm(
            2,
            vec![client.mr.sge(LEN, LEN as u32)],
            server.mr.rkey(),
            server.mr.addr(3 * LEN),
            0x0102_0304,
        ))
        .unwrap();
        // Zero-length Write with immediate: only the notification.
        cqp.post_send(SendWr::write_with_imm(3, vec![], server.mr.rkey(), 0, 42))
            .unwrap();
        let sends = client.wait(3);
        assert!(
            sends.iter().all(|w| w.status == WcStatus::Success),
            "{t:?} {sends:?}"
        );
        let r = server.wait(3);
        assert_eq!(
            (r[0].wr_id, r[0].opcode, r[0].imm),
            (0, WcOpcode::Recv, Some(0xDEAD_BEEF))
        );
        assert_eq!(r[0].byte_len as usize, LEN);
        assert_eq!(server.mr.to_vec()[..LEN], pattern(LEN, 1)[..], "{t:?}");
        assert_eq!(
            (r[1].wr_id, r[1].opcode, r[1].imm, r[1].byte_len as usize),
            (1, WcOpcode::RecvRdmaWithImm, Some(0x0102_0304), LEN),
            "{t:?}"
        );
        assert_eq!(server.mr.to_vec()[3 * LEN..], pattern(LEN, 2)[..], "{t:?}");
        assert_eq!(
            (r[2].wr_id, r[2].opcode, r[2].imm, r[2].byte_len),
            (2, WcOpcode::RecvRdmaWithImm, Some(42), 0),
            "{t:?}"
        );
    });
}

/// `Qp::post_recv_list` (`ibv_post_recv` with a list): the requests before a refused one are
/// posted, in order, and messages land in them; the refused one and those after it are not.
#[test]
fn receive_lists_post_up_to_the_first_refused_request() {
    both(|t| {
        const LEN: usize = 1000;
        let Pair { server, client, .. } = setup(t).mr_len(8 * LEN).pair();
        let (sqp, cqp) = (&server.qps[0], &client.qps[0]);
        let foreign = server.ctx.alloc_pd().alloc_mr(LEN, ACCESS).unwrap();
        let wrs = vec![
            RecvWr::new(10, [server.mr.sge(0, LEN as u32)]),
            RecvWr::new(11, [server.mr.sge(LEN, LEN as u32)]),
            // Another domain's region: refused (its L_Key is not this QP's PD's).
            RecvWr::new(12, [foreign.sge(0, LEN as u32)]),
            RecvWr::new(13, [server.mr.sge(2 * LEN, LEN as u32)]),
        ];
        let (bad, _) = sqp.post_recv_list(wrs).unwrap_err();
        assert_eq!(bad, 2, "{t:?}");
        for i in 0..2u8 {
            client
                .mr
                .copy_in(i as usize * LEN, &pattern(LEN, u64::from(i)))
                .unwrap();
            cqp.post_send(SendWr::send(
                u64::from(i),
                vec![client.mr.sge(i as usize * LEN, LEN as u32)],
            ))
            .unwrap();
        }
        let sends = client.wait(2);
        assert!(
            sends.iter().all(|w| w.status == WcStatus::Success),
            "{t:?} {sends:?}"
        );
        let r = server.wait(2);
        assert_eq!(
            r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(10, WcStatus::Success), (11, WcStatus::Success)],
            "{t:?}"
        );
        let mem = server.mr.to_vec();
        assert_eq!(mem[..LEN], pattern(LEN, 0)[..], "{t:?}");
        assert_eq!(mem[LEN..2 * LEN], pattern(LEN, 1)[..], "{t:?}");
        // An empty list posts nothing and succeeds.
        sqp.post_recv_list(Vec::new()).unwrap();
    });
}

/// Memory windows: a type 1 window bound over part of a region admits Writes and Reads
/// inside it only; a type 2 window bound to the server's QP is invalidated locally
/// (a Local Invalidate request) and another one by the peer's Send with Invalidate; after either, an
/// access through its key fails (and, the error being fatal, comes last).
#[test]
fn memory_windows() {
    both(|t| {
        let Pair { server, client, .. } = setup(t).mr_len(1 << 16).pair();
        let (sqp, cqp) = (&server.qps[0], &client.qps[0]);
        let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
        // Type 1: Write through it, then Read back through it.
        let mw1 = server.pd.alloc_mw(MwType::Type1).unwrap();
        let k1 = mw1
            .bind(sqp, &server.mr, server.mr.addr(4096), 4096, rw)
            .unwrap();
        client.write_read_back(cqp, (k1, &server.mr, 4096), 0, 8192, 4096, 5);

        // Type 2A, invalidated by the peer's Send with Invalidate.
        let mw2 = server.pd.alloc_mw(MwType::Type2A).unwrap();
        let k2 = mw2
            .bind(sqp, &server.mr, server.mr.addr(16384), 1024, rw)
            .unwrap();
        assert_eq!(mw2.state(), KeyState::Valid);
        sqp.post_recv(RecvWr::new(7, vec![server.mr.sge(0, 64)]))
            .unwrap();
        cqp.post_send(SendWr::send_with_invalidate(
            3,
            vec![client.mr.sge(0, 16)],
            k2,
        ))
        .unwrap();
        assert_eq!(client.wait(1)[0].status, WcStatus::Success);
        let r = server.wait(1);
        assert!(r[0].flags.with_invalidate, "{t:?} {r:?}");
        assert_eq!(r[0].invalidated_key, Some(k2));
        assert_eq!(mw2.state(), KeyState::Free, "{t:?}");

        // Type 2B, invalidated locally in send-queue order.
        let mw3 = server.pd.alloc_mw(MwType::Type2B).unwrap();
        let k3 = mw3
            .bind(sqp, &server.mr, server.mr.addr(20480), 1024, rw)
            .unwrap();
        sqp.post_send(SendWr::local_inv(5, k3)).unwrap();
        let w = server.wait(1);
        assert_eq!((w[0].wr_id, w[0].opcode), (5, WcOpcode::LocalInv), "{t:?}");
        assert_eq!(mw3.state(), KeyState::Free, "{t:?}");

        // Outside the type 1 window: refused, nothing placed, and the connection dies (last).
        let before = server.mr.to_vec()[..16].to_vec();
        cqp.post_send(SendWr::write(
            4,
            vec![client.mr.sge(0, 16)],
            k1,
            server.mr.addr(0),
        ))
        .unwrap();
        let w = client.wait(1);
        match t {
            // IBA 9.7.5.2.4: the NAK completes the Write in error.
            Transport::Roce => assert_eq!(w[0].status, WcStatus::RemoteAccess, "{w:?}"),
            // RFC 5040 §5.1 (RDMAP-80): a Write completes when sent; the peer's Terminate
            // reports the protection error.
            Transport::Iwarp => loop {
                match client.ctx.get_async_event(*TIMEOUT) {
                    Some(AsyncEvent::Qp {
                        event: QpEvent::TerminateReceived(_),
                        ..
                    }) => break,
                    Some(_) => continue,
                    None => panic!("no Terminate after a Write outside the window"),
                }
            },
        }
        assert_eq!(server.mr.to_vec()[..16], before[..], "{t:?}");
    });
}

/// Windows bound and invalidated by work requests (`IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`),
/// as C programs post them: the bind takes the key the poster chose, the peer writes
/// through it, and a Local Invalidate posted after a Send completes after it and frees
/// the window.
#[test]
fn memory_windows_by_work_requests() {
    both(|t| {
        let Pair { server, client, .. } = setup(t).mr_len(1 << 16).pair();
        let (sqp, cqp) = (&server.qps[0], &client.qps[0]);
        // An MPA responder sends once the initiator has (RFC 5044 §7.1.2).
        sqp.post_recv(RecvWr::new(8, vec![server.mr.sge(0, 64)]))
            .unwrap();
        cqp.post_send(SendWr::send(0, vec![client.mr.sge(0, 8)]))
            .unwrap();
        assert_eq!(client.wait(1)[0].status, WcStatus::Success);
        assert_eq!(server.wait(1)[0].wr_id, 8);
        let mw = server.pd.alloc_mw(MwType::Type2A).unwrap();
        let old = mw.rkey();
        let new = old.next_consumer(7);
        let bind = MwBind {
            mw: old,
            new_rkey: new,
            mr: server.mr.key(),
            addr: server.mr.addr(8192),
            len: 4096,
            access: Access::REMOTE_WRITE,
        };
        cqp.post_recv(RecvWr::new(9, vec![client.mr.sge(0, 64)]))
            .unwrap();
        sqp.post_send(SendWr::bind_mw(1, bind)).unwrap();
        sqp.post_send(SendWr::send(2, vec![server.mr.sge(0, 8)]))
            .unwrap();
        let w = server.wait(2);
        assert_eq!(
            summary(&w),
            [
                (1, WcStatus::Success, WcOpcode::BindMw),
                (2, WcStatus::Success, WcOpcode::Send)
            ],
            "{t:?}"
        );
        assert_eq!((mw.rkey(), mw.state()), (new, KeyState::Valid), "{t:?}");
        assert_eq!(client.wait(1)[0].wr_id, 9);

        client.mr.copy_in(100, &pattern(512, 3)).unwrap();
        cqp.post_send(SendWr::write(
            3,
            vec![client.mr.sge(100, 512)],
            new,
            server.mr.addr(8192 + 64),
        ))
        .unwrap();
        // A Send after it: once it arrived, the Write was placed (an iWARP Write completes
        // when sent).
        sqp.post_recv(RecvWr::new(11, vec![server.mr.sge(0, 64)]))
            .unwrap();
        cqp.post_send(SendWr::send(30, vec![client.mr.sge(0, 8)]))
            .unwrap();
        assert!(
            client.wait(2).iter().all(|w| w.status == WcStatus::Success),
            "{t:?}"
        );
        assert_eq!(server.wait(1)[0].wr_id, 11);
        assert_eq!(
            server.mr.to_vec()[8192 + 64..8192 + 64 + 512],
            pattern(512, 3)[..],
            "{t:?}"
        );

        sqp.post_send(SendWr::send(4, vec![server.mr.sge(0, 8)]))
            .unwrap();
        sqp.post_send(SendWr::local_inv(5, new)).unwrap();
        cqp.post_recv(RecvWr::new(10, vec![client.mr.sge(0, 64)]))
            .unwrap();
        let w = server.wait(2);
        assert_eq!(
            summary(&w),
            [
                (4, WcStatus::Success, WcOpcode::Send),
                (5, WcStatus::Success, WcOpcode::LocalInv)
            ],
            "{t:?}"
        );
        assert_eq!(mw.state(), KeyState::Free, "{t:?}");
    });
}

/// Caller-driven progress with several waiters on one context: each server thread blocks on
/// its own QP's CQ (one of them holds the context's I/O slot and runs the transport for all,
/// the others are handed their completions and take the slot when it frees); then one
/// thread waits on a completion channel shared by two CQs. Every message arrives, in order
/// per QP, byte for byte.
#[test]
fn several_waiters_and_a_channel_on_one_context() {
    both(|t| {
        const QPS: usize = 4;
        const MSGS: usize = 50;
        const LEN: usize = 700;
        // The server's QPs each on a CQ of its own, two of them on a channel: set up here.
        let client_setup = setup(t).qps(QPS).mr_len(QPS * MSGS * LEN);
        let (server_ctx, client_ctx) = client_setup.contexts();
        let spd = server_ctx.alloc_pd();
        let smr = spd.alloc_mr(QPS * MSGS * LEN, ACCESS).unwrap();
        let ch = server_ctx.create_comp_channel().unwrap();
        // QPs 0 and 1 report to the channel, 2 and 3 are waited on directly.
        let scqs: Vec<Cq> = (0..QPS)
            .map(|i| {
                server_ctx
                    .create_cq(MSGS + 1, (i < 2).then_some(&ch))
                    .unwrap()
            })
            .collect();
        let sqps: Vec<Qp> = scqs
            .iter()
            .map(|cq| spd.create_qp(QpInitAttr::new(cq, cq)).unwrap())
            .collect();
        for (q, qp) in sqps.iter().enumerate() {
            for m in 0..MSGS {
                let off = (q * MSGS + m) * LEN;
                qp.post_recv(RecvWr::new(m as u64, vec![smr.sge(off, LEN as u32)]))
                    .unwrap();
            }
        }
        let client = Side::open(client_ctx, &client_setup, None);
        let listener = Listener::bind(&server_ctx, "127.0.0.1:0").unwrap();
        let cp = ConnectParams::default();
        let sqp_refs: Vec<&Qp> = sqps.iter().collect();
        let cqp_refs: Vec<&Qp> = client.qps.iter().collect();
        util::connect_qps(
            &listener,
            &sqp_refs,
            &cqp_refs,
            &cp,
            &AcceptParams::default(),
        );
        std::thread::scope(|s| {
            // Direct waiters on CQs 2 and 3.
            let direct: Vec<_> = (2..QPS)
                .map(|q| {
                    let cq = &scqs[q];
                    s.spawn(move || {
                        let mut got = Vec::new();
                        while got.len() < MSGS {
                            cq.wait(1, MSGS, *TIMEOUT, &mut got).unwrap();
                        }
                        got
                    })
                })
                .collect();
            // One channel waiter for CQs 0 and 1.
            let chan = s.spawn(|| {
                let mut got = vec![Vec::new(), Vec::new()];
                // Arm, then take what arrived before arming (the verbs pattern).
                for (i, cq) in scqs[..2].iter().enumerate() {
                    cq.req_notify(false);
                    cq.poll(MSGS, &mut got[i]);
                }
                while got.iter().map(Vec::len).sum::<usize>() < 2 * MSGS {
                    let cq = ch.get_cq_event(Some(*TIMEOUT)).unwrap_or_else(|| {
                        panic!(
                            "{t:?}: no CQ event, got {:?}",
                            got.iter().map(Vec::len).collect::<Vec<_>>()
                        )
                    });
                    let i = scqs.iter().position(|c| *c == cq).unwrap();
                    cq.req_notify(false);
                    cq.poll(MSGS, &mut got[i]);
                }
                got
            });
            for m in 0..MSGS {
                for (q, qp) in client.qps.iter().enumerate() {
                    let off = (q * MSGS + m) * LEN;
                    client
                        .mr
                        .copy_in(off, &pattern(LEN, u64::from((q * MSGS + m) as u8)))
                        .unwrap();
                    qp.post_send(SendWr::send(m as u64, vec![client.mr.sge(off, LEN as u32)]))
                        .unwrap();
                }
            }
            let mut per_qp = chan.join().unwrap();
            per_qp.extend(direct.into_iter().map(|h| h.join().unwrap()));
            for (q, wcs) in per_qp.iter().enumerate() {
                let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
                assert_eq!(ids, (0..MSGS as u64).collect::<Vec<_>>(), "{t:?} QP {q}");
                assert!(
                    wcs.iter()
                        .all(|w| w.status == WcStatus::Success && w.byte_len as usize == LEN)
                );
            }
        });
        client.wait(QPS * MSGS);
        let bytes = smr.to_vec();
        for k in 0..QPS * MSGS {
            assert_eq!(
                bytes[k * LEN..][..LEN],
                pattern(LEN, u64::from(k as u8))[..],
                "{t:?} message {k}"
            );
        }
    });
}

/// Issue 14: connection requests nobody accepts yet wait up to the listener's `backlog`;
/// past it a request is refused at once (iWARP: an MPA Reply with the Rejected bit, private
/// data "busy"; RoCE: a REJ, "backlog full"), so a peer cannot make a listener hold
/// connections without a limit; those that waited are accepted and work.
#[test]
fn requests_past_the_backlog_are_refused() {
    both(|t| {
        let backlog = 3;
        let Pair { server, client, .. } = setup(t).qps(backlog as usize + 2).mr_len(4096).open();
        let listener = Listener::bind_with(
            &server.ctx,
            "127.0.0.1:0",
            ListenParams {
                backlog,
                ..ListenParams::default()
            },
        )
        .unwrap();
        let addr = listener.local_addr();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            for (i, qp) in client.qps.iter().enumerate() {
                let tx = tx.clone();
                s.spawn(move || {
                    let r = qp.connect(addr, ConnectParams::default());
                    tx.send((i, r)).unwrap();
                });
            }
            // Two of the five are refused while three wait, unanswered.
            let mut refused = 0;
            while refused < 2 {
                let (i, r) = rx.recv_timeout(*TIMEOUT).expect("two refusals");
                match r {
                    Err(Error::Rejected { .. }) => refused += 1,
                    other => panic!("{t:?}: connect {i} before any accept: {other:?}"),
                }
            }
            for qp in server.qps.iter().take(backlog as usize) {
                let req = listener.accept_timeout(*TIMEOUT).unwrap();
                req.accept(qp, AcceptParams::default()).unwrap();
            }
            for _ in 0..backlog {
                let (i, r) = rx.recv_timeout(*TIMEOUT).unwrap();
                assert!(r.is_ok(), "{t:?}: connect {i}: {r:?}");
            }
        });
    });
}

/// Issue 14: a context holds at most its device's QPs, regions and registered octets
/// (`DeviceLimits`); past a limit creation fails with `Error::ResourceLimit` naming it and
/// nothing else changes: what exists keeps working, and what is dropped is given back.
#[test]
fn device_limits_refuse_and_give_back() {
    both(|t| {
        let limits = DeviceLimits {
            max_qp: 2,
            max_mr: 3,
            max_mr_bytes: 3 * 4096,
            max_qp_wr: 256,
            max_srq_wr: 32,
            max_cqe: 4096,
            max_inline_data: 256,
        };
        // One region held (the side's).
        let s = setup(t).mr_len(4096).client_limits(limits);
        let Pair { server, client, .. } = s.pair();
        let limit = |r: Result<_, Error>, what: &str, n: u64| match r {
            Err(Error::ResourceLimit { what: w, limit }) => {
                assert_eq!((w, limit), (what, n), "{t:?}");
            }
            Err(e) => panic!("{t:?}: {what}: {e}"),
            Ok(_) => panic!("{t:?}: {what}: created past the limit"),
        };
        // QPs: one connected, one more, then the limit; one dropped gives its place back.
        let cq = &client.cq;
        let second = client.pd.create_qp(QpInitAttr::new(cq, cq)).unwrap();
        limit(
            client.pd.create_qp(QpInitAttr::new(cq, cq)).map(|_| ()),
            "QPs",
            2,
        );
        drop(second);
        // Queue depths: past max_qp_wr (send or receive) and max_srq_wr; CQ entries past
        // max_cqe. Nothing was taken by the refusals.
        let deep = |send: u32, recv: u32| QpInitAttr {
            cap: QpCap {
                max_send_wr: send,
                max_recv_wr: recv,
                ..QpCap::default()
            },
            ..QpInitAttr::new(cq, cq)
        };
        limit(
            client.pd.create_qp(deep(257, 1)).map(|_| ()),
            "work requests per queue",
            256,
        );
        limit(
            client.pd.create_qp(deep(1, 257)).map(|_| ()),
            "work requests per queue",
            256,
        );
        let inline = |n: u32| QpInitAttr {
            cap: QpCap {
                max_inline_data: n,
                ..QpCap::default()
            },
            ..QpInitAttr::new(cq, cq)
        };
        limit(
            client.pd.create_qp(inline(257)).map(|_| ()),
            "octets inline",
            256,
        );
        limit(
            client
                .pd
                .create_srq(SrqAttr {
                    max_wr: 33,
                    max_sge: 1,
                })
                .map(|_| ()),
            "work requests per shared receive queue",
            32,
        );
        limit(
            client.ctx.create_cq(4097, None).map(|_| ()),
            "completion queue entries",
            4096,
        );
        let srq = client
            .pd
            .create_srq(SrqAttr {
                max_wr: 32,
                max_sge: 1,
            })
            .unwrap();
        drop((srq, client.ctx.create_cq(4096, None).unwrap()));
        let again = client.pd.create_qp(deep(256, 256)).unwrap();
        // Regions: the side's own, then 4 KiB, then 8 KiB is past the octets and a fourth
        // region past the count.
        let a = client.pd.alloc_mr(4096, ACCESS).unwrap();
        limit(
            client.pd.alloc_mr(8192, ACCESS).map(|_| ()),
            "registered octets",
            3 * 4096,
        );
        let b = client.pd.alloc_mr(4096, ACCESS).unwrap();
        limit(
            client.pd.alloc_mr(1, ACCESS).map(|_| ()),
            "memory regions",
            3,
        );
        drop((a, b));
        let c = client.pd.alloc_mr(8192, ACCESS).unwrap();
        // The connection made before any of this still moves data.
        let to = (server.mr.rkey(), &server.mr, 0);
        client.write_read_back(&client.qps[0], to, 0, 200, 100, 7);
        drop((again, c));
    });
}

/// Issue 14, RDMAP-124 (RFC 5040 §8.1.1 #10), IBA 11.4.2.1: a completion queue that
/// overruns goes to error — `CqError` posted once, what it held still polled, the rest
/// dropped and counted — and the QP that completes into it goes to Error (iWARP: its peer
/// gets a Local Catastrophic Terminate), while a QP of another queue of the same context
/// keeps moving data.
#[test]
fn a_cq_overrun_fails_its_qps_only() {
    both(|t| {
        // QP B, on the client's large queue, and QP A on a small one of its own.
        let Pair { server, client, .. } = setup(t).mr_len(4096).open();
        let sqp_a = server
            .pd
            .create_qp(QpInitAttr::new(&server.cq, &server.cq))
            .unwrap();
        let small = client.ctx.create_cq(4, None).unwrap();
        let qp_a = client
            .pd
            .create_qp(QpInitAttr::new(&small, &small))
            .unwrap();
        let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
        let (cp, ap) = (ConnectParams::default(), AcceptParams::default());
        let (sqps, cqps) = ([server.qp(), &sqp_a], [client.qp(), &qp_a]);
        util::connect_qps(&listener, &sqps, &cqps, &cp, &ap);
        // Eight signaled Writes into a queue of four: the fifth completion overruns it.
        client.mr.copy_in(0, &pattern(64, 3)).unwrap();
        for i in 0..8 {
            qp_a.post_send(SendWr::write(
                i,
                [client.mr.sge(0, 64)],
                server.mr.rkey(),
                server.mr.addr(1024),
            ))
            .unwrap();
        }
        let ev = client.next_event();
        assert!(
            matches!(ev, Some(AsyncEvent::CqError { cq_id }) if cq_id == small.id()),
            "{t:?}: {ev:?}"
        );
        until("QP A in Error", || qp_a.state().is_dead());
        assert!(small.is_overrun(), "{t:?}");
        let mut held = Vec::new();
        assert_eq!(small.poll(16, &mut held), 4, "{t:?}: {held:?}");
        assert!(held.iter().all(|w| w.status == WcStatus::Success), "{t:?}");
        // The state changes before the completions land (whoever sees those sees it): the
        // requests the overrun flushed are counted just after.
        until("the flushed requests counted as overflows", || {
            small.overflows() >= 4
        });
        if t == Transport::Iwarp {
            // The peer hears why: RDMAP, Local Catastrophic, no headers (RFC 5040 §7.2).
            match server.next_event() {
                Some(AsyncEvent::Qp {
                    event: QpEvent::TerminateReceived(term),
                    ..
                }) => assert_eq!(
                    term.code,
                    softrdma_wire::rdmap::TerminateCode::RdmaLocalCatastrophic { code: 0 },
                    "{term:?}"
                ),
                other => panic!("the server's event: {other:?}"),
            }
        }
        // QP B, same context, other queue: unaffected.
        let to = (server.mr.rkey(), &server.mr, 2048);
        client.write_read_back(client.qp(), to, 100, 3000, 200, 9);
        assert!(!client.cq.is_overrun() && client.qps[0].state() == QpState::Rts);
    });
}

/// The background thread's poll is the context's to choose (`Context::set_background_poll`):
/// off, fixed or adaptive, the peer's Writes land and its Reads are served all the same.
#[test]
fn the_background_poll_is_set_per_context() {
    both(|t| {
        const LEN: usize = 64 * 1024;
        let Pair { server, client, .. } = setup(t).mr_len(2 * LEN).pair();
        assert_eq!(
            server.ctx.background_poll(),
            DEFAULT_BACKGROUND_POLL,
            "{t:?}"
        );
        let cqp = &client.qps[0];
        let modes = [
            BusyPoll::Off,
            BusyPoll::Fixed(Duration::from_micros(20)),
            DEFAULT_BUSY_POLL,
            DEFAULT_BACKGROUND_POLL,
        ];
        for (i, mode) in modes.into_iter().enumerate() {
            // Only the server's background thread handles the peer's one-sided requests.
            server.ctx.set_background_poll(mode);
            assert_eq!(server.ctx.background_poll(), mode, "{t:?}");
            let to = (server.mr.rkey(), &server.mr, 0);
            client.write_read_back(cqp, to, 0, LEN, LEN, i as u64);
        }
    });
}
