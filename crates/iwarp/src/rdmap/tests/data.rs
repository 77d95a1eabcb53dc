//! Data path: Send/Recv, Write, Read of every size, gather/scatter, ordering, limits.

use softrdma_memory::{Access, Key, PdId};
use softrdma_wire::ddp;
use softrdma_wire::rdmap::Opcode;

use super::pair::{Dir, Mr, PD, Pair, QP_A, QP_B, cfg, ddp_of, opcode_of};
use super::{flushed, ok};
use crate::rdmap::{RdmapEngine, StreamState};
use crate::verbs_types::{PostError, RecvWr, SendFlags, SendWr, WcOpcode};
use softrdma_testkit::pattern;

const SIZES: [usize; 5] = [0, 1, 4095, 4096, 1 << 20];
const MULPDUS: [u16; 2] = [128, 64768];
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Segments a message of `size` octets takes with `per` payload octets per segment.
fn segments(size: usize, per: usize) -> usize {
    size.div_ceil(per).max(1)
}

/// RDMAP-03, RDMAP-05, RDMAP-58, RDMAP-59, RDMAP-60, RDMAP-82, MPA-05: Sends of 0, 1, 4095,
/// 4096 and 1 MiB octets at MULPDU 128 and 64768, unaligned, into a larger receive buffer:
/// every octet arrives, the completion reports the length, one MSN per message, MO advances,
/// L only on the last segment, no ULPDU above MULPDU.
#[test]
fn rdmap_03_59_60_send_recv_every_size() {
    for mulpdu in MULPDUS {
        for size in SIZES {
            let mut p = Pair::new(mulpdu);
            let src = Mr::new(&p.ka, PD, size + 7, 0x1000_0003, Access::empty());
            let dst = Mr::new(&p.kb, PD, size + 100, 0x2000_0005, Access::LOCAL_WRITE);
            let data = pattern(size, size as u64);
            src.put(3, &data);
            p.b.post_recv(RecvWr::new(7, vec![dst.sge(1, size + 50)]))
                .unwrap();
            p.a.post_send(SendWr::send(1, vec![src.sge(3, size)]))
                .unwrap();
            p.drive();
            assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::Send, size)]);
            assert_eq!(p.cq_b(), vec![ok(7, WcOpcode::Recv, size)]);
            let got = dst.bytes();
            assert!(got[1..1 + size] == data[..], "mulpdu {mulpdu} size {size}");
            assert!(got[..1].iter().chain(&got[1 + size..]).all(|&b| b == 0));
            dst.assert_guards_intact();

            let per = usize::from(mulpdu) - ddp::UNTAGGED_HEADER_LEN;
            let segs = p.sent(Dir::AtoB);
            assert_eq!(segs.len(), segments(size, per));
            for (i, u) in segs.iter().enumerate() {
                let ddp::Repr::Untagged {
                    qn, msn, mo, last, ..
                } = ddp_of(u)
                else {
                    panic!("tagged Send")
                };
                assert_eq!((qn, msn, mo as usize), (0, 1, i * per));
                assert_eq!(last, i + 1 == segs.len());
            }
            assert_eq!(
                (p.a.state(), p.b.state()),
                (StreamState::Rts, StreamState::Rts)
            );
        }
    }
}

/// RDMAP-35, RDMAP-36, RDMAP-11, RDMAP-40: RDMA Writes of every size at both MULPDUs to an
/// unaligned sink offset: placed exactly, no completion at the sink, tagged segments with
/// the sink STag and a TO advancing by the octets already sent.
#[test]
fn rdmap_35_36_40_write_every_size() {
    for mulpdu in MULPDUS {
        for size in SIZES {
            let mut p = Pair::new(mulpdu);
            let src = Mr::new(&p.ka, PD, size + 5, 0x1000_0001, Access::empty());
            let dst = Mr::new(&p.kb, PD, size + 64, 0x3000_0001, RW);
            let data = pattern(size, size as u64 + 99);
            src.put(5, &data);
            let to = dst.iova + 9;
            p.a.post_send(SendWr::write(1, vec![src.sge(5, size)], dst.key, to))
                .unwrap();
            p.drive();
            assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::RdmaWrite, size)]);
            assert!(p.cq_b().is_empty(), "RDMAP-11: no completion at the sink");
            let got = dst.bytes();
            assert!(got[9..9 + size] == data[..]);
            assert!(got[..9].iter().chain(&got[9 + size..]).all(|&b| b == 0));
            dst.assert_guards_intact();

            let per = usize::from(mulpdu) - ddp::TAGGED_HEADER_LEN;
            let segs = p.sent(Dir::AtoB);
            assert_eq!(segs.len(), segments(size, per));
            for (i, u) in segs.iter().enumerate() {
                let ddp::Repr::Tagged {
                    stag,
                    to: seg_to,
                    last,
                    ..
                } = ddp_of(u)
                else {
                    panic!("untagged Write")
                };
                assert_eq!((stag, seg_to), (dst.key.0, to + (i * per) as u64));
                assert_eq!(last, i + 1 == segs.len());
                assert_eq!(opcode_of(u), Some(Opcode::RdmaWrite));
            }
        }
    }
}

/// RDMAP-41, RDMAP-53, RDMAP-87, RDMAP-12, RDMAP-43, RDMAP-24, RDMAP-51: RDMA Reads of every
/// size at both MULPDUs: one Read Request, one Read Response message whose segments carry
/// the request's sink STag and TO (advancing), completion at the sink only.
#[test]
fn rdmap_41_53_87_read_every_size() {
    for mulpdu in MULPDUS {
        for size in SIZES {
            let mut p = Pair::new(mulpdu);
            let src = Mr::new(&p.kb, PD, size + 13, 0x4000_0007, Access::REMOTE_READ);
            let sink = Mr::new(&p.ka, PD, size + 11, 0x5000_0003, Access::LOCAL_WRITE);
            let data = pattern(size, size as u64 + 7);
            src.put(13, &data);
            p.a.post_send(SendWr::read(
                1,
                Some(sink.sge(11, size)),
                src.key,
                src.iova + 13,
            ))
            .unwrap();
            p.drive();
            assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::RdmaRead, size)]);
            assert!(p.cq_b().is_empty(), "RDMAP-12: nothing at the data source");
            assert!(sink.bytes()[11..] == data[..]);
            sink.assert_guards_intact();

            assert_eq!(p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest).len(), 1);
            let per = usize::from(mulpdu) - ddp::TAGGED_HEADER_LEN;
            let resp = p.sent_op(Dir::BtoA, Opcode::RdmaReadResponse);
            assert_eq!(resp.len(), segments(size, per));
            for (i, u) in resp.iter().enumerate() {
                let ddp::Repr::Tagged { stag, to, last, .. } = ddp_of(u) else {
                    panic!()
                };
                assert_eq!((stag, to), (sink.key.0, sink.iova + 11 + (i * per) as u64));
                assert_eq!(last, i + 1 == resp.len());
            }
        }
    }
}

/// RDMAP-80, RDMAP-82: a multi-segment Send completes at the source only once its last
/// segment was handed out, and is delivered at the sink only once its last segment was
/// placed.
#[test]
fn rdmap_80_82_no_completion_before_the_last_segment() {
    let mut p = Pair::new(128);
    let src = Mr::new(&p.ka, PD, 1000, 0x1000, Access::empty());
    let dst = Mr::new(&p.kb, PD, 1000, 0x2000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(1, vec![dst.sge(0, 1000)]))
        .unwrap();
    p.a.post_send(SendWr::send(1, vec![src.sge(0, 1000)]))
        .unwrap();
    p.burst = 1;
    let segs = segments(1000, 110);
    for i in 1..=segs {
        assert_eq!(p.step(), 1);
        let (a, b) = (p.cq_a(), p.cq_b());
        assert_eq!(a.len(), usize::from(i == segs), "source, segment {i}");
        assert_eq!(b.len(), usize::from(i == segs), "sink, segment {i}");
    }
}

/// Gather from several unaligned entries of two regions (one entry zero-length) into a
/// scatter list of several unaligned entries; the same gather list as an RDMA Write.
#[test]
fn several_sges_unaligned_gather_and_scatter() {
    let mut p = Pair::new(128);
    let s1 = Mr::new(&p.ka, PD, 1000, 0x1001, Access::empty());
    let s2 = Mr::new(&p.ka, PD, 5000, 0x7777_0003, Access::empty());
    s1.put(0, &pattern(1000, 1));
    s2.put(0, &pattern(5000, 2));
    let gather = vec![
        s1.sge(3, 333),
        s2.sge(17, 4001),
        s1.sge(400, 0),
        s1.sge(501, 77),
    ];
    let mut expect = Vec::new();
    expect.extend_from_slice(&s1.bytes()[3..336]);
    expect.extend_from_slice(&s2.bytes()[17..4018]);
    expect.extend_from_slice(&s1.bytes()[501..578]);
    let total = expect.len();

    let d1 = Mr::new(&p.kb, PD, 1000, 0x9001, Access::LOCAL_WRITE);
    let d2 = Mr::new(&p.kb, PD, 8000, 0xA003, Access::LOCAL_WRITE);
    let scatter = vec![d1.sge(1, 100), d2.sge(5, 4000), d1.sge(300, 500)];
    p.b.post_recv(RecvWr::new(3, scatter)).unwrap();
    p.a.post_send(SendWr::send(1, gather.clone())).unwrap();

    let w = Mr::new(&p.kb, PD, 6000, 0xB005, RW);
    p.a.post_send(SendWr::write(2, gather, w.key, w.iova + 3))
        .unwrap();
    p.drive();
    assert_eq!(
        p.cq_a(),
        vec![
            ok(1, WcOpcode::Send, total),
            ok(2, WcOpcode::RdmaWrite, total)
        ]
    );
    assert_eq!(p.cq_b(), vec![ok(3, WcOpcode::Recv, total)]);
    assert!(d1.bytes()[1..101] == expect[..100]);
    assert!(d2.bytes()[5..4005] == expect[100..4100]);
    assert!(d1.bytes()[300..300 + total - 4100] == expect[4100..]);
    assert!(w.bytes()[3..3 + total] == expect[..]);
    for m in [&d1, &d2, &w] {
        m.assert_guards_intact();
    }
}

/// RDMAP-62, RDMAP-65, RDMAP-76, RDMAP-81: 200 Sends of varying sizes, all posted before the
/// first moves: delivered and completed in order, every octet right.
#[test]
fn rdmap_62_65_many_sends_delivered_in_order() {
    let mut p = Pair::new(1024);
    let n = 200;
    let size = |i: usize| (i * 37) % 3000;
    let src = Mr::new(&p.ka, PD, n * 3000, 0x10_0000, Access::empty());
    let dst = Mr::new(&p.kb, PD, n * 3000, 0x20_0000, Access::LOCAL_WRITE);
    src.put(0, &pattern(n * 3000, 5));
    for i in 0..n {
        p.b.post_recv(RecvWr::new(i as u64, vec![dst.sge(i * 3000, 3000)]))
            .unwrap();
        p.a.post_send(SendWr::send(i as u64, vec![src.sge(i * 3000, size(i))]))
            .unwrap();
    }
    p.burst = 3;
    p.drive();
    let want_a: Vec<_> = (0..n)
        .map(|i| ok(i as u64, WcOpcode::Send, size(i)))
        .collect();
    let want_b: Vec<_> = (0..n)
        .map(|i| ok(i as u64, WcOpcode::Recv, size(i)))
        .collect();
    assert_eq!(p.cq_a(), want_a);
    assert_eq!(p.cq_b(), want_b);
    let (s, d) = (src.bytes(), dst.bytes());
    for i in 0..n {
        let r = i * 3000..i * 3000 + size(i);
        assert!(s[r.clone()] == d[r]);
    }
}

/// RDMAP-46, RDMAP-55, RDMAP-77, RDMAP-86: pipelined Reads of varying sizes (large first):
/// responses go out in request order, the Reads complete in order with the right octets.
#[test]
fn rdmap_46_55_86_pipelined_reads_keep_order() {
    let mut p = Pair::new(1024);
    let sizes = [70_000usize, 1, 5000, 0, 12_345, 300, 65_536, 9];
    let total: usize = sizes.iter().sum();
    let src = Mr::new(&p.kb, PD, total, 0x40_0000, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, total, 0x80_0000, Access::LOCAL_WRITE);
    src.put(0, &pattern(total, 9));
    let mut off = 0;
    let mut starts = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        p.a.post_send(SendWr::read(
            i as u64,
            Some(sink.sge(off, s)),
            src.key,
            src.iova + off as u64,
        ))
        .unwrap();
        starts.push(off);
        off += s;
    }
    p.burst = 2;
    p.drive();
    let want: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| ok(i as u64, WcOpcode::RdmaRead, s))
        .collect();
    assert_eq!(p.cq_a(), want);
    assert!(sink.bytes() == src.bytes());
    // Map every response segment to the request it answers: never goes backwards.
    let mut last_idx = 0;
    let mut seen = Vec::new();
    for u in p.sent_op(Dir::BtoA, Opcode::RdmaReadResponse) {
        let ddp::Repr::Tagged { to, last, .. } = ddp_of(u) else {
            panic!()
        };
        let rel = (to - sink.iova) as usize;
        let empty = u.len() == ddp::TAGGED_HEADER_LEN;
        let idx = (0..sizes.len())
            .find(|&i| {
                if empty {
                    sizes[i] == 0 && starts[i] == rel
                } else {
                    starts[i] <= rel && rel < starts[i] + sizes[i]
                }
            })
            .unwrap();
        assert!(idx >= last_idx, "responses out of request order");
        last_idx = idx;
        if last {
            seen.push(idx);
        }
    }
    assert_eq!(seen, (0..sizes.len()).collect::<Vec<_>>());
}

/// RDMAP-90, RDMAP-125: with ORD 2, seven posted Reads never have more than two Read
/// Requests unanswered on the wire; the rest (and a Send behind them) wait their turn.
#[test]
fn rdmap_90_ord_limits_outbound_reads_which_queue_locally() {
    let mut a = cfg(QP_A, 128);
    a.ord = 2;
    let mut b = cfg(QP_B, 128);
    b.ird = 2;
    let mut p = Pair::with(a, b);
    let src = Mr::new(&p.kb, PD, 7000, 0x1000, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 7000, 0x2000, Access::LOCAL_WRITE);
    let msg = Mr::new(&p.ka, PD, 10, 0x3000, Access::empty());
    let rbuf = Mr::new(&p.kb, PD, 10, 0x3000, Access::LOCAL_WRITE);
    src.put(0, &pattern(7000, 3));
    for i in 0..7 {
        p.a.post_send(SendWr::read(
            i,
            Some(sink.sge(i as usize * 1000, 1000)),
            src.key,
            src.iova + i * 1000,
        ))
        .unwrap();
    }
    p.b.post_recv(RecvWr::new(0, vec![rbuf.sge(0, 10)]))
        .unwrap();
    p.a.post_send(SendWr::send(7, vec![msg.sge(0, 10)]))
        .unwrap();
    p.burst = 1;
    let mut max_seen = 0;
    while p.step() > 0 {
        assert!(p.a.outstanding_reads() <= 2);
        let requests = p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest).len();
        let answered = p
            .sent_op(Dir::BtoA, Opcode::RdmaReadResponse)
            .iter()
            .filter(|u| ddp_of(u).last())
            .count();
        assert!(requests - answered <= 2, "more than ORD Reads unanswered");
        max_seen = max_seen.max(requests - answered);
        assert!(p.b.inbound_reads() <= 2);
    }
    assert_eq!(max_seen, 2);
    let mut want: Vec<_> = (0..7).map(|i| ok(i, WcOpcode::RdmaRead, 1000)).collect();
    want.push(ok(7, WcOpcode::Send, 10));
    assert_eq!(p.cq_a(), want);
    assert!(sink.bytes() == src.bytes());
    assert_eq!(p.cq_b(), vec![ok(0, WcOpcode::Recv, 10)]);
}

/// RDMAP-52, RDMAP-89: a peer may have IRD Reads outstanding back to back; all are
/// accepted and answered.
#[test]
fn rdmap_52_ird_reads_back_to_back_accepted() {
    let mut a = cfg(QP_A, 256);
    a.ord = 4;
    let mut b = cfg(QP_B, 256);
    b.ird = 4;
    let mut p = Pair::with(a, b);
    assert_eq!((p.a.config().ord, p.b.config().ird), (4, 4));
    let src = Mr::new(&p.kb, PD, 4000, 0x1000, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 4000, 0x2000, Access::LOCAL_WRITE);
    src.put(0, &pattern(4000, 4));
    for i in 0..4u64 {
        let sge = sink.sge(i as usize * 1000, 1000);
        p.a.post_send(SendWr::read(i, Some(sge), src.key, src.iova + i * 1000))
            .unwrap();
    }
    p.burst = 4;
    p.pull_only_a();
    assert_eq!(p.b.inbound_reads(), 4);
    assert_eq!(p.b.state(), StreamState::Rts);
    p.drive();
    assert_eq!(p.cq_a().len(), 4);
    assert!(sink.bytes() == src.bytes());
}

/// RDMAP-81, RDMAP-85: Write, Read, Send, unsignaled Write, Send complete in submission
/// order even though the Read finishes last on the wire; the unsignaled Write reports
/// nothing.
#[test]
fn rdmap_81_completions_in_submission_order() {
    let mut p = Pair::new(128);
    let src = Mr::new(&p.ka, PD, 4096, 0x1000, Access::empty());
    let sink = Mr::new(&p.ka, PD, 65536, 0x2_0000, Access::LOCAL_WRITE);
    let rsrc = Mr::new(&p.kb, PD, 65536, 0x3_0000, Access::REMOTE_READ);
    let wdst = Mr::new(&p.kb, PD, 4096, 0x4_0000, RW);
    let rbuf = Mr::new(&p.kb, PD, 4096, 0x5_0000, Access::LOCAL_WRITE);
    for i in 0..2 {
        p.b.post_recv(RecvWr::new(i, vec![rbuf.sge(0, 4096)]))
            .unwrap();
    }
    p.a.post_send(SendWr::write(1, vec![src.sge(0, 100)], wdst.key, wdst.iova))
        .unwrap();
    p.a.post_send(SendWr::read(
        2,
        Some(sink.sge(0, 65536)),
        rsrc.key,
        rsrc.iova,
    ))
    .unwrap();
    p.a.post_send(SendWr::send(3, vec![src.sge(0, 10)]))
        .unwrap();
    p.a.post_send(
        SendWr::write(4, vec![src.sge(0, 10)], wdst.key, wdst.iova).with_flags(SendFlags::empty()),
    )
    .unwrap();
    p.a.post_send(SendWr::send(5, vec![src.sge(0, 20)]))
        .unwrap();
    let want = vec![
        ok(1, WcOpcode::RdmaWrite, 100),
        ok(2, WcOpcode::RdmaRead, 65536),
        ok(3, WcOpcode::Send, 10),
        ok(5, WcOpcode::Send, 20),
    ];
    p.burst = 1;
    let mut got = Vec::new();
    while p.step() > 0 {
        got.extend(p.cq_a());
        assert!(want.starts_with(&got), "out of order: {got:?}");
    }
    assert_eq!(got, want);
    assert_eq!(p.cq_b().len(), 2);
}

/// Fence: a fenced Send waits until the earlier Read completed; without the fence it goes
/// out right behind the Read Request.
#[test]
fn fenced_send_waits_for_prior_read() {
    for fence in [false, true] {
        let mut p = Pair::new(128);
        let rsrc = Mr::new(&p.kb, PD, 8192, 0x1000, Access::REMOTE_READ);
        let sink = Mr::new(&p.ka, PD, 8192, 0x2000, Access::LOCAL_WRITE);
        let msg = Mr::new(&p.ka, PD, 16, 0x3000, Access::empty());
        let rbuf = Mr::new(&p.kb, PD, 16, 0x4000, Access::LOCAL_WRITE);
        p.b.post_recv(RecvWr::new(0, vec![rbuf.sge(0, 16)]))
            .unwrap();
        p.a.post_send(SendWr::read(
            1,
            Some(sink.sge(0, 8192)),
            rsrc.key,
            rsrc.iova,
        ))
        .unwrap();
        let flags = if fence {
            SendFlags::SIGNALED | SendFlags::FENCE
        } else {
            SendFlags::SIGNALED
        };
        p.a.post_send(SendWr::send(2, vec![msg.sge(0, 16)]).with_flags(flags))
            .unwrap();
        p.burst = 1;
        p.drive();
        let pos = |pred: &dyn Fn(&[u8]) -> bool| p.wire.iter().position(|(_, u)| pred(u));
        let send_at = pos(&|u| opcode_of(u) == Some(Opcode::Send)).unwrap();
        let last_resp =
            pos(&|u| opcode_of(u) == Some(Opcode::RdmaReadResponse) && ddp_of(u).last()).unwrap();
        assert_eq!(send_at > last_resp, fence, "fence {fence}");
        assert_eq!(
            p.cq_a(),
            vec![ok(1, WcOpcode::RdmaRead, 8192), ok(2, WcOpcode::Send, 16)]
        );
    }
}

/// RDMAP-78, RDMAP-83: a Read posted after a Write to the same remote range returns the
/// written octets (the Read Request is processed after the Write was placed).
#[test]
fn rdmap_78_read_after_write_returns_written_data() {
    let mut p = Pair::new(512);
    let src = Mr::new(&p.ka, PD, 5000, 0x1000, Access::empty());
    let sink = Mr::new(&p.ka, PD, 5000, 0x9000, Access::LOCAL_WRITE);
    let remote = Mr::new(&p.kb, PD, 5000, 0x5000, RW | Access::REMOTE_READ);
    let data = pattern(5000, 78);
    src.put(0, &data);
    p.a.post_send(SendWr::write(
        1,
        vec![src.sge(0, 5000)],
        remote.key,
        remote.iova,
    ))
    .unwrap();
    p.a.post_send(SendWr::read(
        2,
        Some(sink.sge(0, 5000)),
        remote.key,
        remote.iova,
    ))
    .unwrap();
    p.drive();
    assert_eq!(p.cq_a().len(), 2);
    assert!(sink.bytes() == data);
}

/// RDMAP-09, RDMAP-63, RDMAP-66, RDMAP-67: Send with SE and Invalidate of a fast-registered
/// region: the receive completion reports the invalidated STag and the solicited event,
/// the STag is dead afterwards (a Write to it is refused: DDP tagged 0x00).
#[test]
fn rdmap_09_67_send_with_invalidate_invalidates() {
    let mut p = Pair::new(256);
    let target = Mr::fast(&p.kb, PD, 4096, 0xF000, RW);
    let rbuf = Mr::new(&p.kb, PD, 64, 0x1000, Access::LOCAL_WRITE);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    src.put(0, &pattern(64, 1));
    p.b.post_recv(RecvWr::new(5, vec![rbuf.sge(0, 64)]))
        .unwrap();
    p.a.post_send(
        SendWr::send_with_invalidate(1, vec![src.sge(0, 40)], target.key)
            .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED),
    )
    .unwrap();
    p.drive();
    let u = p.sent(Dir::AtoB)[0];
    assert_eq!(opcode_of(u), Some(Opcode::SendWithSeAndInvalidate));
    assert_eq!(&u[2..6], &target.key.0.to_be_bytes(), "RDMAP-15");
    let mut want = ok(5, WcOpcode::Recv, 40);
    want.flags.with_invalidate = true;
    want.flags.solicited = true;
    want.invalidated_key = Some(target.key);
    assert_eq!(p.cq_b(), vec![want]);
    assert_eq!(p.kb.state(target.key), softrdma_memory::KeyState::Free);

    p.a.post_send(SendWr::write(
        2,
        vec![src.sge(0, 8)],
        target.key,
        target.iova,
    ))
    .unwrap();
    p.drive();
    let t = p.b.terminate_sent().expect("Terminate");
    assert_eq!(t.code.parts(), (1, 1, 0x00));
    assert!(target.bytes().iter().all(|&b| b == 0));
    target.assert_guards_intact();
}

/// RDMAP-63: Send with SE is opcode 0x5 and reports `solicited`; a plain Send does not.
#[test]
fn rdmap_63_solicited_event_flag() {
    let mut p = Pair::new(256);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    let rbuf = Mr::new(&p.kb, PD, 128, 0x1000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(1, vec![rbuf.sge(0, 64)]))
        .unwrap();
    p.b.post_recv(RecvWr::new(2, vec![rbuf.sge(64, 64)]))
        .unwrap();
    p.a.post_send(
        SendWr::send(1, vec![src.sge(0, 3)]).with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED),
    )
    .unwrap();
    p.a.post_send(SendWr::send(2, vec![src.sge(0, 3)])).unwrap();
    p.drive();
    let ops: Vec<_> = p.sent(Dir::AtoB).iter().map(|u| opcode_of(u)).collect();
    assert_eq!(ops, vec![Some(Opcode::SendWithSe), Some(Opcode::Send)]);
    let cq = p.cq_b();
    assert!(cq[0].flags.solicited && !cq[1].flags.solicited);
}

/// Separate tagged and untagged contexts: B's Read Response interleaves segment by segment
/// with B's Sends, never with B's RDMA Write; A places all of them correctly.
#[test]
fn read_response_interleaves_with_sends_not_writes() {
    let mut p = Pair::new(128);
    let rsrc = Mr::new(&p.kb, PD, 16384, 0x1000, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 16384, 0x2000, Access::LOCAL_WRITE);
    rsrc.put(0, &pattern(16384, 11));
    let bsrc = Mr::new(&p.kb, PD, 4000, 0x9000, Access::empty());
    bsrc.put(0, &pattern(4000, 12));
    let arecv = Mr::new(&p.ka, PD, 2500, 0xA000, Access::LOCAL_WRITE);
    let awrite = Mr::new(&p.ka, PD, 2000, 0xB000, RW);
    for i in 0..5 {
        p.a.post_recv(RecvWr::new(i, vec![arecv.sge(i as usize * 500, 500)]))
            .unwrap();
    }
    p.a.post_send(SendWr::read(
        1,
        Some(sink.sge(0, 16384)),
        rsrc.key,
        rsrc.iova,
    ))
    .unwrap();
    p.step(); // the Read Request reaches B
    for i in 0..5 {
        p.b.post_send(SendWr::send(i, vec![bsrc.sge(i as usize * 500, 500)]))
            .unwrap();
    }
    p.b.post_send(SendWr::write(
        9,
        vec![bsrc.sge(2500, 1500)],
        awrite.key,
        awrite.iova,
    ))
    .unwrap();
    p.burst = 1;
    p.drive();
    assert_eq!(p.cq_a().len(), 6);
    assert_eq!(p.cq_b().len(), 6);
    assert!(sink.bytes() == rsrc.bytes());
    assert!(arecv.bytes()[..] == bsrc.bytes()[..2500]);
    assert!(awrite.bytes()[..1500] == bsrc.bytes()[2500..]);

    let b_to_a = p.sent(Dir::BtoA);
    let mut open_tagged: Option<Opcode> = None;
    let mut send_open = false;
    let mut interleaved = false;
    for u in b_to_a {
        let op = opcode_of(u).unwrap();
        let last = ddp_of(u).last();
        match op {
            Opcode::RdmaReadResponse | Opcode::RdmaWrite => {
                if let Some(open) = open_tagged {
                    assert_eq!(open, op, "two tagged messages interleaved");
                }
                open_tagged = (!last).then_some(op);
                if op == Opcode::RdmaReadResponse && send_open {
                    interleaved = true;
                }
            }
            _ => send_open = !last,
        }
    }
    assert!(
        interleaved,
        "a Read Response segment went out inside a Send"
    );
}

/// RDMAP-40, RDMAP-50, RDMAP-59: zero-length Send (consumes a WQE, completes with 0),
/// zero-length Write (one segment, L=1, valid STag), zero-length Reads with a garbage
/// source STag (not validated) with and without a sink entry.
#[test]
fn rdmap_40_50_59_zero_length_everything() {
    let mut p = Pair::new(128);
    let rbuf = Mr::new(&p.kb, PD, 16, 0x1000, Access::LOCAL_WRITE);
    let wdst = Mr::new(&p.kb, PD, 16, 0x2000, RW);
    let sink = Mr::new(&p.ka, PD, 16, 0x3000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(1, vec![rbuf.sge(0, 16)]))
        .unwrap();
    p.a.post_send(SendWr::send(1, vec![])).unwrap();
    p.a.post_send(SendWr::write(2, vec![], wdst.key, wdst.iova + 16))
        .unwrap();
    p.a.post_send(SendWr::read(3, None, Key(0xdead_beef), u64::MAX))
        .unwrap();
    p.a.post_send(SendWr::read(4, Some(sink.sge(5, 0)), Key(0x0bad_0bad), 7))
        .unwrap();
    p.drive();
    assert_eq!(
        p.cq_a(),
        vec![
            ok(1, WcOpcode::Send, 0),
            ok(2, WcOpcode::RdmaWrite, 0),
            ok(3, WcOpcode::RdmaRead, 0),
            ok(4, WcOpcode::RdmaRead, 0),
        ]
    );
    assert_eq!(p.cq_b(), vec![ok(1, WcOpcode::Recv, 0)]);
    let lens: Vec<_> = p.sent(Dir::AtoB).iter().map(|u| u.len()).collect();
    assert_eq!(lens, vec![18, 14, 46, 46]);
    let resp = p.sent(Dir::BtoA);
    assert_eq!(resp.len(), 2);
    for (u, stag, to) in [(resp[0], 0, 0), (resp[1], sink.key.0, sink.iova + 5)] {
        assert_eq!(u.len(), 14);
        let ddp::Repr::Tagged {
            stag: s,
            to: t,
            last,
            ..
        } = ddp_of(u)
        else {
            panic!()
        };
        assert_eq!((s, t, last), (stag, to, true));
    }
    assert_eq!(
        (p.a.state(), p.b.state()),
        (StreamState::Rts, StreamState::Rts)
    );
}

/// `INLINE`: the octets are copied when posting; the buffer may change right after.
#[test]
fn inline_send_copies_at_post() {
    let mut p = Pair::new(256);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    let rbuf = Mr::new(&p.kb, PD, 64, 0x1000, Access::LOCAL_WRITE);
    let data = pattern(64, 3);
    src.put(0, &data);
    p.b.post_recv(RecvWr::new(1, vec![rbuf.sge(0, 64)]))
        .unwrap();
    p.a.post_send(
        SendWr::send(1, vec![src.sge(0, 64)]).with_flags(SendFlags::SIGNALED | SendFlags::INLINE),
    )
    .unwrap();
    src.put(0, &[0u8; 64]);
    p.ka.dereg_mr(src.key).unwrap();
    p.drive();
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::Send, 64)]);
    assert!(rbuf.bytes() == data);
}

/// Post-time checks refuse malformed requests without touching the QP.
#[test]
fn post_errors_leave_the_qp_alone() {
    let mut c = cfg(QP_A, 256);
    c.sq_depth = 2;
    c.max_sge = 2;
    c.max_inline = 8;
    let mut p = Pair::with(c, cfg(QP_B, 256));
    let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    let w = Mr::new(&p.ka, PD, 64, 0x2000, Access::LOCAL_WRITE);
    let other_pd = Mr::new(&p.ka, PdId(2), 64, 0x3000, Access::LOCAL_WRITE);
    let s = |len| m.sge(0, len);
    let r = Key(1);
    assert_eq!(
        p.a.post_send(SendWr::send(1, vec![s(1), s(1), s(1)])),
        Err(PostError::TooManySge { max: 2 })
    );
    let mut two = SendWr::read(1, Some(w.sge(0, 1)), r, 0);
    two.sg_list.push(w.sge(1, 1));
    assert_eq!(p.a.post_send(two), Err(PostError::TooManySge { max: 1 }));
    let inline = |wr: SendWr| wr.with_flags(SendFlags::INLINE);
    assert_eq!(
        p.a.post_send(inline(SendWr::send(1, vec![s(9)]))),
        Err(PostError::Inline { max: 8 })
    );
    assert_eq!(
        p.a.post_send(inline(SendWr::read(1, Some(w.sge(0, 1)), r, 0))),
        Err(PostError::Inline { max: 8 })
    );
    let bad = crate::verbs_types::Sge::new(Key(0x00ab_cd01), 0, 1);
    assert_eq!(
        p.a.post_send(SendWr::send(1, vec![s(1), bad])),
        Err(PostError::LocalProtection {
            sge: 1,
            error: softrdma_memory::AccessError::InvalidKey
        })
    );
    assert_eq!(
        p.a.post_send(SendWr::send(1, vec![m.sge(60, 5)])),
        Err(PostError::LocalProtection {
            sge: 0,
            error: softrdma_memory::AccessError::Bounds
        })
    );
    assert_eq!(
        p.a.post_send(SendWr::send(1, vec![other_pd.sge(0, 1)])),
        Err(PostError::LocalProtection {
            sge: 0,
            error: softrdma_memory::AccessError::WrongPd
        })
    );
    // A Read sink and a receive buffer need LOCAL_WRITE.
    assert_eq!(
        p.a.post_send(SendWr::read(1, Some(s(4)), r, 0)),
        Err(PostError::LocalProtection {
            sge: 0,
            error: softrdma_memory::AccessError::Rights
        })
    );
    assert_eq!(
        p.a.post_recv(RecvWr::new(1, vec![s(4)])),
        Err(PostError::LocalProtection {
            sge: 0,
            error: softrdma_memory::AccessError::Rights
        })
    );
    p.a.post_send(SendWr::send(1, vec![s(1)])).unwrap();
    p.a.post_send(SendWr::send(2, vec![s(1)])).unwrap();
    assert_eq!(
        p.a.post_send(SendWr::send(3, vec![s(1)])),
        Err(PostError::QueueFull)
    );
    assert_eq!(p.a.sq_len(), 2);
    assert_eq!(p.a.state(), StreamState::Rts);

    let mut no_reads = cfg(QP_A, 256);
    no_reads.ord = 0;
    let mut e = RdmapEngine::new(no_reads, p.ka.clone());
    assert_eq!(
        e.post_send(SendWr::read(1, Some(w.sge(0, 1)), r, 0)),
        Err(PostError::ReadsDisabled)
    );
    assert_eq!(e.poll_ulpdu(&mut Vec::new()), None);
}

/// RDMAP-72: requests posted to a dead QP are flushed at once; `close` flushes everything
/// pending and stops the engine.
#[test]
fn rdmap_72_posts_to_a_dead_qp_are_flushed_and_close_flushes() {
    let mut p = Pair::new(256);
    let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::LOCAL_WRITE);
    p.a.post_recv(RecvWr::new(1, vec![m.sge(0, 64)])).unwrap();
    p.a.post_send(SendWr::send(2, vec![m.sge(0, 8)])).unwrap();
    p.a.close();
    assert_eq!(p.a.state(), StreamState::Closed);
    assert_eq!(
        p.cq_a(),
        vec![flushed(2, WcOpcode::Send), flushed(1, WcOpcode::Recv)]
    );
    assert_eq!(p.a.poll_ulpdu(&mut Vec::new()), None);
    p.a.post_send(SendWr::write(3, vec![m.sge(0, 8)], Key(5), 0))
        .unwrap();
    p.a.post_recv(RecvWr::new(4, vec![m.sge(0, 8)])).unwrap();
    assert_eq!(
        p.cq_a(),
        vec![flushed(3, WcOpcode::RdmaWrite), flushed(4, WcOpcode::Recv)]
    );
    p.inject(
        Dir::BtoA,
        &[0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
    );
    assert_eq!(p.a.counters().dropped_rx, 1);
    assert!(!p.a.wants_transmit());
}

/// MPA-06: MULPDU is clamped to RFC 5044's bounds.
#[test]
fn mulpdu_is_clamped() {
    let p = Pair::with(cfg(QP_A, 20), cfg(QP_B, u16::MAX));
    assert_eq!(p.a.config().mulpdu, 128);
    assert_eq!(p.b.config().mulpdu, 64768);
}

/// Unsignaled requests report nothing on success; the counters see every octet.
#[test]
fn unsignaled_requests_complete_silently() {
    let mut p = Pair::new(256);
    let src = Mr::new(&p.ka, PD, 1000, 0x1000, Access::empty());
    let dst = Mr::new(&p.kb, PD, 1000, 0x1000, RW);
    for i in 0..3 {
        p.a.post_send(
            SendWr::write(i, vec![src.sge(0, 1000)], dst.key, dst.iova)
                .with_flags(SendFlags::empty()),
        )
        .unwrap();
    }
    p.drive();
    assert!(p.cq_a().is_empty());
    assert_eq!(p.a.sq_len(), 0);
    assert_eq!(p.a.counters().payload_tx, 3000);
    assert_eq!(p.b.counters().payload_rx, 3000);
}
