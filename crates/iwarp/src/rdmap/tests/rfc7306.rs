//! RFC 7306 between two engines: atomics (§5) and immediate data (§6) as the verbs post them,
//! their errors, and hostile RFC 7306 messages. The conformance matrix has no RFC 7306 rows;
//! test names carry the RFC 5040 / DDP rows they exercise on the new messages and the IBA rows
//! (IBT-*) whose verbs semantics the mapping keeps.

use std::sync::Arc;

use softrdma_memory::{Access, Key, KeyTable, PdId, QpId};
use softrdma_wire::ddp::{self, DDP_VERSION};
use softrdma_wire::rdmap::{
    AtomicOpcode, AtomicRequestRepr, AtomicResponseRepr, Body, ImmediateDataRepr, Opcode, Segment,
};

use super::errors::{RW, assert_a_terminated, assert_b_terminated, seg, tamper_first, terminate};
use super::pair::{Dir, GUARD, GUARD_BYTE, Mr, PD, Pair, QP_A, QP_B, cfg, ddp_of, opcode_of};
use super::{flushed, ok, wc};
use crate::rdmap::{IMM_SEND_FOLLOWS, MAX_WRITE_WITH_IMM, StreamState};
use crate::verbs_types::{
    PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
use softrdma_testkit::pattern;

/// Rights of an atomic target (remote atomics need local write, as remote writes do).
const ATOMIC: Access = Access::LOCAL_WRITE.union(Access::REMOTE_ATOMIC);

fn word(m: &Mr, off: usize) -> u64 {
    u64::from_ne_bytes(m.bytes()[off..off + 8].try_into().unwrap())
}

fn set_word(m: &Mr, off: usize, v: u64) {
    m.put(off, &v.to_ne_bytes());
}

/// The ULPDU of one untagged RDMAP message as a peer would build it.
fn untagged(qn: u32, msn: u32, body: Body<'_>) -> Vec<u8> {
    let hdr = ddp::Repr::Untagged {
        last: true,
        reserved: 0,
        dv: DDP_VERSION,
        rsvd_ulp: [0; 5],
        qn,
        msn,
        mo: 0,
    };
    let s = Segment::new(hdr, body);
    let mut v = vec![0; s.buffer_len()];
    s.emit(&mut v).unwrap();
    v
}

/// A FetchAdd of `add` at (`stag`, `to`) with identifier `id` (Add Mask 0).
fn fetch_add_req(id: u32, stag: Key, to: u64, add: u64) -> AtomicRequestRepr {
    AtomicRequestRepr {
        reserved: 0,
        opcode: AtomicOpcode::FetchAdd,
        request_identifier: id,
        remote_stag: stag.0,
        remote_tagged_offset: to,
        add_or_swap_data: add,
        add_or_swap_mask: 0,
        compare_data: 0,
        compare_mask: 0,
    }
}

fn atomic_ulpdu(msn: u32, req: AtomicRequestRepr) -> Vec<u8> {
    untagged(1, msn, Body::AtomicRequest(req))
}

fn response_ulpdu(msn: u32, id: u32, value: u64) -> Vec<u8> {
    untagged(
        3,
        msn,
        Body::AtomicResponse(AtomicResponseRepr {
            original_request_identifier: id,
            original_remote_data_value: value,
        }),
    )
}

fn imm_ulpdu(msn: u32, imm: u32, word: u32, se: bool) -> Vec<u8> {
    let mut d = [0u8; 8];
    d[..4].copy_from_slice(&imm.to_be_bytes());
    d[4..].copy_from_slice(&word.to_be_bytes());
    let i = ImmediateDataRepr { immediate_data: d };
    let body = if se {
        Body::ImmediateDataWithSe(i)
    } else {
        Body::ImmediateData(i)
    };
    untagged(0, msn, body)
}

fn with_imm(mut w: WorkCompletion, imm: u32, solicited: bool) -> WorkCompletion {
    w.imm = Some(imm);
    w.flags.solicited = solicited;
    w
}

// ---- Atomics (RFC 7306 §5)

/// IBT-X-12, RDMAP-81: FetchAdd returns the original value and adds modulo 2^64 (carry
/// discarded); CmpSwap returns the original value and swaps only on a match (a miss leaves
/// memory alone). Each completes `FetchAdd` / `CompSwap` with 8 octets, in order; the
/// responder completes nothing. On the wire: Atomic Requests on QN 1 (Request Identifier =
/// MSN), Atomic Responses on QN 3 with their own MSNs.
#[test]
fn ibt_x_12_fetch_add_and_cmp_swap_return_the_original_value() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC);
    let sink = Mr::new(&p.ka, PD, 64, 0x8000, Access::LOCAL_WRITE);
    set_word(&t, 8, 5);
    set_word(&t, 16, u64::MAX - 1);
    let w = |off: u64| t.iova + off;
    let posts = [
        SendWr::fetch_add(1, sink.sge(0, 8), t.key, w(8), 3),
        SendWr::cmp_swap(2, sink.sge(8, 8), t.key, w(8), 8, 100),
        SendWr::cmp_swap(3, sink.sge(16, 8), t.key, w(8), 7, 1),
        SendWr::fetch_add(4, sink.sge(24, 8), t.key, w(16), 3),
    ];
    for wr in posts {
        p.a.post_send(wr).unwrap();
    }
    p.drive();
    assert_eq!(
        p.cq_a(),
        vec![
            ok(1, WcOpcode::FetchAdd, 8),
            ok(2, WcOpcode::CompSwap, 8),
            ok(3, WcOpcode::CompSwap, 8),
            ok(4, WcOpcode::FetchAdd, 8),
        ]
    );
    assert!(p.cq_b().is_empty());
    let results: Vec<u64> = (0..4).map(|i| word(&sink, i * 8)).collect();
    assert_eq!(results, [5, 8, 100, u64::MAX - 1]);
    assert_eq!((word(&t, 8), word(&t, 16)), (100, 1));
    assert_eq!((word(&t, 0), word(&t, 24)), (0, 0));

    // The first request, octet by octet: QN 1, MSN 1, FetchAdd, identifier 1, Add Mask 0.
    let reqs = p.sent_op(Dir::AtoB, Opcode::AtomicRequest);
    let mut first = vec![0x41, 0x4A, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
    first.extend([0, 0, 0, 0, 0, 0, 0, 1]);
    first.extend(t.key.0.to_be_bytes());
    first.extend(w(8).to_be_bytes());
    first.extend(3u64.to_be_bytes());
    first.extend([0; 24]);
    assert_eq!(reqs[0], &first[..]);
    for (i, r) in reqs.iter().enumerate() {
        let msn = i as u32 + 1;
        assert!(
            matches!(ddp_of(r), ddp::Repr::Untagged { qn: 1, msn: m, mo: 0, last: true, .. } if m == msn)
        );
        let Body::AtomicRequest(a) = Segment::parse(r).unwrap().body else {
            panic!("not an Atomic Request")
        };
        assert_eq!(a.request_identifier, msn);
        if a.opcode == AtomicOpcode::CompareSwap {
            assert_eq!((a.add_or_swap_mask, a.compare_mask), (u64::MAX, u64::MAX));
        }
    }
    let resps = p.sent_op(Dir::BtoA, Opcode::AtomicResponse);
    assert_eq!(resps.len(), 4);
    for (i, r) in resps.iter().enumerate() {
        let msn = i as u32 + 1;
        assert!(matches!(ddp_of(r), ddp::Repr::Untagged { qn: 3, msn: m, .. } if m == msn));
        let Body::AtomicResponse(a) = Segment::parse(r).unwrap().body else {
            panic!("not an Atomic Response")
        };
        assert_eq!(a.original_request_identifier, msn);
        assert_eq!(a.original_remote_data_value, results[i]);
    }
    t.assert_guards_intact();
    sink.assert_guards_intact();
}

/// One request of the mixed stream below, and what it must produce.
enum Expect {
    Atomic { slot: usize, original: u64 },
    Read { slot: usize },
    Write { slot: usize },
    Send { slot: usize },
    WriteImm { slot: usize, imm: u32 },
    SendImm { slot: usize, imm: u32 },
}

/// RDMAP-81, RDMAP-90, RDMAP-91, IBT-C9-28, IBT-X-12: atomics interleaved with Reads, Writes,
/// Sends and Writes / Sends with immediate in one stream (MULPDU 128, ORD = IRD = 3, one
/// ULPDU per side per step): ORD and IRD are never exceeded by Reads and atomics together,
/// every atomic returns the value a serial execution gives, every octet lands, every
/// completion comes in order with its opcode and length.
#[test]
fn rdmap_81_90_91_atomics_interleaved_with_reads_writes_sends() {
    let (mut ca, mut cb) = (cfg(QP_A, 128), cfg(QP_B, 128));
    (ca.ord, ca.ird, cb.ord, cb.ird) = (3, 3, 3, 3);
    let mut p = Pair::with(ca, cb);
    p.burst = 1;
    p.record = false;
    const N: usize = 70;
    const SLOT: usize = 400;
    let src = Mr::new(&p.ka, PD, N * SLOT, 0x10_0000, Access::empty());
    let sink = Mr::new(&p.ka, PD, N * SLOT, 0x20_0000, Access::LOCAL_WRITE);
    let words = Mr::new(&p.kb, PD, 32, 0x30_0000, ATOMIC);
    let rd = Mr::new(&p.kb, PD, N * SLOT, 0x40_0000, Access::REMOTE_READ);
    let wr = Mr::new(&p.kb, PD, N * SLOT, 0x50_0000, RW);
    let rcv = Mr::new(&p.kb, PD, N * SLOT, 0x60_0000, Access::LOCAL_WRITE);
    src.put(0, &pattern(N * SLOT, 7));
    rd.put(0, &pattern(N * SLOT, 8));
    let mut model = [0u64; 4];
    let mut expect = Vec::new();
    let mut x = 0x1234_5678u64;
    for i in 0..N {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let kind = (x >> 33) % 8;
        let off = i * SLOT;
        let id = i as u64;
        let len = 1 + (x >> 40) as usize % 300;
        let (req, e) = match kind {
            0 | 1 => {
                let k = i % 4;
                let add = x >> 20;
                let e = Expect::Atomic {
                    slot: off,
                    original: model[k],
                };
                model[k] = model[k].wrapping_add(add);
                let r = SendWr::fetch_add(
                    id,
                    sink.sge(off, 8),
                    words.key,
                    words.iova + 8 * k as u64,
                    add,
                );
                (r, e)
            }
            2 => {
                let k = i % 4;
                let hit = x & 1 == 0;
                let compare = if hit { model[k] } else { model[k] ^ 1 };
                let e = Expect::Atomic {
                    slot: off,
                    original: model[k],
                };
                if hit {
                    model[k] = id * 1000;
                }
                let r = SendWr::cmp_swap(
                    id,
                    sink.sge(off, 8),
                    words.key,
                    words.iova + 8 * k as u64,
                    compare,
                    id * 1000,
                );
                (r, e)
            }
            3 => (
                SendWr::read(id, Some(sink.sge(off, len)), rd.key, rd.iova + off as u64),
                Expect::Read { slot: off },
            ),
            4 => (
                SendWr::write(id, vec![src.sge(off, len)], wr.key, wr.iova + off as u64),
                Expect::Write { slot: off },
            ),
            5 => {
                p.b.post_recv(RecvWr::new(id, vec![rcv.sge(off, SLOT)]))
                    .unwrap();
                (
                    SendWr::send(id, vec![src.sge(off, len)]),
                    Expect::Send { slot: off },
                )
            }
            6 => {
                p.b.post_recv(RecvWr::new(id, vec![rcv.sge(off, SLOT)]))
                    .unwrap();
                let imm = x as u32;
                (
                    SendWr::write_with_imm(
                        id,
                        vec![src.sge(off, len)],
                        wr.key,
                        wr.iova + off as u64,
                        imm,
                    ),
                    Expect::WriteImm { slot: off, imm },
                )
            }
            _ => {
                p.b.post_recv(RecvWr::new(id, vec![rcv.sge(off, SLOT)]))
                    .unwrap();
                let imm = x as u32;
                (
                    SendWr::send_with_imm(id, vec![src.sge(off, len)], imm),
                    Expect::SendImm { slot: off, imm },
                )
            }
        };
        p.a.post_send(req).unwrap();
        expect.push((e, len));
    }
    for _ in 0..1_000_000 {
        assert!(p.a.outstanding_reads() + p.a.outstanding_atomics() <= 3);
        assert!(p.b.inbound_reads() + p.b.inbound_atomics() <= 3);
        if p.step() == 0 {
            break;
        }
    }
    let (cq_a, cq_b) = (p.cq_a(), p.cq_b());
    assert_eq!(cq_a.len(), N);
    let (s, k, w, r) = (src.bytes(), sink.bytes(), wr.bytes(), rcv.bytes());
    let orig = pattern(N * SLOT, 8);
    let mut recvs = cq_b.iter();
    for (i, ((e, len), c)) in expect.iter().zip(&cq_a).enumerate() {
        let id = i as u64;
        let len = *len;
        let (op, n) = match e {
            Expect::Atomic { slot, original } => {
                assert_eq!(word(&sink, *slot), *original, "atomic {i}");
                (c.opcode, 8)
            }
            Expect::Read { slot } => {
                assert!(k[*slot..slot + len] == orig[*slot..slot + len]);
                (WcOpcode::RdmaRead, len)
            }
            Expect::Write { slot } => {
                assert!(w[*slot..slot + len] == s[*slot..slot + len]);
                (WcOpcode::RdmaWrite, len)
            }
            Expect::Send { slot } => {
                assert_eq!(recvs.next(), Some(&ok(id, WcOpcode::Recv, len)));
                assert!(r[*slot..slot + len] == s[*slot..slot + len]);
                (WcOpcode::Send, len)
            }
            Expect::WriteImm { slot, imm } => {
                let want = with_imm(ok(id, WcOpcode::RecvRdmaWithImm, len), *imm, false);
                assert_eq!(recvs.next(), Some(&want));
                assert!(w[*slot..slot + len] == s[*slot..slot + len]);
                (WcOpcode::RdmaWrite, len)
            }
            Expect::SendImm { slot, imm } => {
                let want = with_imm(ok(id, WcOpcode::Recv, len), *imm, false);
                assert_eq!(recvs.next(), Some(&want));
                assert!(r[*slot..slot + len] == s[*slot..slot + len]);
                (WcOpcode::Send, len)
            }
        };
        assert_eq!(*c, ok(id, op, n), "completion {i}");
        assert!(
            matches!(c.opcode, WcOpcode::FetchAdd | WcOpcode::CompSwap)
                == matches!(e, Expect::Atomic { .. })
        );
    }
    assert_eq!(recvs.next(), None);
    for (k, &m) in model.iter().enumerate() {
        assert_eq!(word(&words, 8 * k), m);
    }
    for m in [&sink, &words, &wr, &rcv] {
        m.assert_guards_intact();
    }
}

/// Posts `n` FetchAdds of 1 from `p.a` into consecutive 8-octet entries of a new sink.
fn post_adds(p: &mut Pair, word: Key, to: u64, n: usize) -> Mr {
    let sink = Mr::new(&p.ka, PD, n * 8, 0x70_0000, Access::LOCAL_WRITE);
    for i in 0..n {
        p.a.post_send(SendWr::fetch_add(i as u64, sink.sge(i * 8, 8), word, to, 1))
            .unwrap();
    }
    sink
}

/// The results of `n` FetchAdds: each QP saw increasing values; all QPs together saw every
/// value 0..total exactly once.
fn assert_each_value_once(per_qp: &[Vec<u64>], total: usize) {
    for r in per_qp {
        assert!(
            r.windows(2).all(|w| w[0] < w[1]),
            "one QP's adds are in order"
        );
    }
    let mut all: Vec<u64> = per_qp.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..total as u64).collect::<Vec<_>>());
}

/// IBT-o9-17, IBT-X-15: four QPs (four responder engines over one key table and one
/// registered word) add 1 to the same word 50 times each, their ULPDUs interleaved one by
/// one in a rotating order: every original value 0, 1, 2, .. is seen exactly once and the
/// final value is the number of adds.
#[test]
fn ibt_o9_17_several_qps_fetch_add_one_word_interleaved() {
    const QPS: u32 = 4;
    const N: usize = 50;
    let kb = Arc::new(KeyTable::with_seed(0xB));
    let target = Mr::new(&kb, PD, 8, 0x1000, ATOMIC);
    let mut pairs: Vec<(Pair, Mr)> = (0..QPS)
        .map(|i| {
            let ka = Arc::new(KeyTable::with_seed(u64::from(i) + 0x100));
            let mut p = Pair::with_tables(
                cfg(QpId(100 + i), 256),
                cfg(QpId(200 + i), 256),
                ka,
                kb.clone(),
            );
            p.burst = 1;
            p.record = false;
            let sink = post_adds(&mut p, target.key, target.iova, N);
            (p, sink)
        })
        .collect();
    let mut round = 0usize;
    loop {
        let mut moved = 0;
        for j in 0..pairs.len() {
            let k = (j * 3 + round) % pairs.len();
            moved += pairs[k].0.step();
        }
        round += 1;
        if moved == 0 {
            break;
        }
    }
    let mut per_qp = Vec::new();
    for (p, sink) in &mut pairs {
        let cq = p.cq_a();
        assert_eq!(
            cq,
            (0..N as u64)
                .map(|i| ok(i, WcOpcode::FetchAdd, 8))
                .collect::<Vec<_>>()
        );
        per_qp.push((0..N).map(|i| word(sink, i * 8)).collect::<Vec<_>>());
    }
    assert_each_value_once(&per_qp, QPS as usize * N);
    assert_eq!(word(&target, 0), u64::from(QPS) * N as u64);
    target.assert_guards_intact();
}

/// IBT-o9-17: the same from four threads, each driving its own pair over the shared key
/// table: the memory crate's atomics serialise the read-modify-writes.
#[test]
fn ibt_o9_17_several_qps_fetch_add_one_word_from_threads() {
    const QPS: u32 = 4;
    const N: usize = 200;
    let kb = Arc::new(KeyTable::with_seed(0xB));
    let target = Mr::new(&kb, PD, 8, 0x1000, ATOMIC);
    let (key, iova) = (target.key, target.iova);
    let per_qp: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..QPS)
            .map(|i| {
                let kb = kb.clone();
                s.spawn(move || {
                    let ka = Arc::new(KeyTable::with_seed(u64::from(i) + 0x100));
                    let mut p =
                        Pair::with_tables(cfg(QpId(100 + i), 256), cfg(QpId(200 + i), 256), ka, kb);
                    p.burst = 1;
                    p.record = false;
                    let sink = post_adds(&mut p, key, iova, N);
                    p.drive();
                    assert_eq!(p.cq_a().len(), N);
                    (0..N).map(|j| word(&sink, j * 8)).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_each_value_once(&per_qp, QPS as usize * N);
    assert_eq!(word(&target, 0), u64::from(QPS) * N as u64);
}

/// A posts one FetchAdd (wr_id 1) to (`rkey`, `to`) on B; returns the Atomic Request as it
/// crossed the wire.
fn atomic_to(p: &mut Pair, rkey: Key, to: u64) -> Vec<u8> {
    let sink = Mr::new(&p.ka, PD, 8, 0x9_0000, Access::LOCAL_WRITE);
    p.a.post_send(SendWr::fetch_add(1, sink.sge(0, 8), rkey, to, 1))
        .unwrap();
    p.drive();
    assert_eq!(word(&sink, 0), 0, "no original value placed");
    p.sent_op(Dir::AtoB, Opcode::AtomicRequest)[0].to_vec()
}

/// B refused A's atomic with Terminate 0/`etype`/`code` quoting the request's DDP header
/// (M, D; no RDMA header: only a Read Request has one), A's FetchAdd failed with `status`.
fn assert_atomic_refused(p: &mut Pair, req: &[u8], etype: u8, code: u8, status: WcStatus) {
    assert_b_terminated(p, &terminate(0, etype, code, Some(seg(req)), None));
    assert_eq!(p.cq_a(), vec![wc(1, status, WcOpcode::FetchAdd, 0)]);
}

/// RDMAP-109 on an Atomic Request (RFC 7306 §8): an invalid STag → 0/1/0x00, RemoteAccess.
#[test]
fn rdmap_109_atomic_invalid_stag_is_rdma_protection_00() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC);
    let req = atomic_to(&mut p, Key(t.key.0 ^ 0x01), t.iova);
    assert_atomic_refused(&mut p, &req, 1, 0x00, WcStatus::RemoteAccess);
    assert_eq!(word(&t, 0), 0);
}

/// RDMAP-112 on an Atomic Request: the word just past the end → 0/1/0x01, RemoteAccess.
#[test]
fn rdmap_112_atomic_past_the_end_is_rdma_protection_01() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC);
    let req = atomic_to(&mut p, t.key, t.iova + 64);
    assert_atomic_refused(&mut p, &req, 1, 0x01, WcStatus::RemoteAccess);
    t.assert_guards_intact();
}

/// RDMAP-114 on an Atomic Request: a region without REMOTE_ATOMIC (read and write are not
/// enough) → 0/1/0x02, RemoteAccess; memory untouched.
#[test]
fn rdmap_114_atomic_without_remote_atomic_is_rdma_protection_02() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 64, 0x4000, RW | Access::REMOTE_READ);
    set_word(&t, 0, 41);
    let req = atomic_to(&mut p, t.key, t.iova);
    assert_atomic_refused(&mut p, &req, 1, 0x02, WcStatus::RemoteAccess);
    assert_eq!(word(&t, 0), 41);
}

/// RDMAP-110 on an Atomic Request: a region of another PD → 0/1/0x03, RemoteAccess.
#[test]
fn rdmap_110_atomic_other_pd_is_rdma_protection_03() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PdId(2), 64, 0x4000, ATOMIC);
    let req = atomic_to(&mut p, t.key, t.iova);
    assert_atomic_refused(&mut p, &req, 1, 0x03, WcStatus::RemoteAccess);
}

/// IBT-X-12, RFC 7306 §8: a target that is not 8-aligned in memory (an aligned Tagged Offset
/// in a region registered 4 octets off) → 0/1/0xFF (Remote Protection, no code of its own),
/// RemoteAccess; a peer's misaligned Tagged Offset likewise. Nothing changes.
#[test]
fn ibt_x_12_misaligned_atomic_is_rdma_protection_ff() {
    let mut p = Pair::new(1024);
    let buf = softrdma_memory::Buffer::new(64 + 2 * GUARD);
    buf.write().fill(GUARD_BYTE);
    let key =
        p.kb.reg_mr(PD, buf.clone(), GUARD + 4, 32, 0x4000, ATOMIC)
            .unwrap();
    let before = buf.read().to_vec();
    let req = atomic_to(&mut p, key, 0x4000);
    assert_atomic_refused(&mut p, &req, 1, 0xFF, WcStatus::RemoteAccess);
    assert!(buf.read().to_vec() == before);

    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC);
    let u = atomic_ulpdu(1, fetch_add_req(1, t.key, t.iova + 4, 1));
    p.inject(Dir::AtoB, &u);
    p.drive();
    assert_b_terminated(&mut p, &terminate(0, 1, 0xFF, Some(seg(&u)), None));
    assert!(t.bytes().iter().all(|&b| b == 0));
}

/// RDMAP-99: the requester's 8-octet entry was deregistered while the atomic was out: the
/// Atomic Response cannot be placed, a local error (Terminate 0/0/0 without headers) fails
/// the atomic LocalProtection; the atomic did execute at B, once.
#[test]
fn rdmap_99_atomic_sink_gone_is_a_local_error() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
    let sink = Mr::new(&p.ka, PD, 8, 0x8000, Access::LOCAL_WRITE);
    p.a.post_send(SendWr::fetch_add(1, sink.sge(0, 8), t.key, t.iova, 1))
        .unwrap();
    p.ka.dereg_mr(sink.key).unwrap();
    p.drive();
    assert_a_terminated(&mut p, &terminate(0, 0, 0, None, None));
    assert_eq!(
        p.cq_a(),
        vec![wc(1, WcStatus::LocalProtection, WcOpcode::FetchAdd, 0)]
    );
    assert_eq!(word(&t, 0), 1);
    assert!(sink.bytes().iter().all(|&b| b == 0));
}

/// RDMAP-104 for RFC 7306 §5 operations the responder does not execute: Swap, a FetchAdd
/// with an Add Mask, a CmpSwap with partial masks, an undefined Atomic Operation code →
/// 0/2/0x06 before anything is touched; A's request fails RemoteInvalidRequest.
#[test]
fn rdmap_104_unsupported_atomic_operation_is_rdma_operation_06() {
    type Edit = fn(&mut Vec<u8>);
    let edits: [Edit; 5] = [
        |u| u[21] = 0x01,          // Swap
        |u| u[21] = 0x05,          // undefined
        |u| u[21] = 0x0F,          // undefined
        |u| u[18 + 28 + 7] = 0x80, // Add Mask bit
        |u| u[21] = 0x02,          // CmpSwap with masks 0
    ];
    for edit in edits {
        let mut p = Pair::new(1024);
        let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC);
        tamper_first(&mut p, Dir::AtoB, edit);
        let req = atomic_to(&mut p, t.key, t.iova);
        assert_atomic_refused(&mut p, &req, 2, 0x06, WcStatus::RemoteInvalidRequest);
        assert_eq!(word(&t, 0), 0);
    }
}

/// RDMAP-91, RFC 7306 §5: Atomic Requests take IRD slots with Read Requests. A peer that
/// exceeds B's IRD 2 with a Read and two atomics gets DDP untagged 0x02 for the third, which
/// is not executed; the first atomic was executed once.
#[test]
fn rdmap_91_atomics_share_ird_with_reads() {
    let (mut ca, mut cb) = (cfg(QP_A, 1024), cfg(QP_B, 1024));
    ca.ord = 3;
    cb.ird = 2;
    let mut p = Pair::with(ca, cb);
    let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC | Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 64, 0x8000, Access::LOCAL_WRITE);
    p.a.post_send(SendWr::read(1, Some(sink.sge(16, 8)), t.key, t.iova + 8))
        .unwrap();
    p.a.post_send(SendWr::fetch_add(2, sink.sge(0, 8), t.key, t.iova, 1))
        .unwrap();
    p.a.post_send(SendWr::fetch_add(3, sink.sge(8, 8), t.key, t.iova, 1))
        .unwrap();
    p.drive();
    let third = p.sent_op(Dir::AtoB, Opcode::AtomicRequest)[1].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&third)), None));
    assert_eq!(
        p.cq_a(),
        vec![
            flushed(1, WcOpcode::RdmaRead),
            flushed(2, WcOpcode::FetchAdd),
            wc(3, WcStatus::RemoteInvalidRequest, WcOpcode::FetchAdd, 0),
        ]
    );
    assert_eq!(word(&t, 0), 1);
}

/// RDMAP-90, IBT-X-11: Reads and atomics together never exceed ORD 2 on the wire; the rest
/// waits and everything completes in order.
#[test]
fn rdmap_90_atomics_share_ord_with_reads() {
    let (mut ca, mut cb) = (cfg(QP_A, 1024), cfg(QP_B, 1024));
    (ca.ord, cb.ird) = (2, 2);
    let mut p = Pair::with(ca, cb);
    p.burst = 1;
    let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC | Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 128, 0x8000, Access::LOCAL_WRITE);
    for i in 0..8u64 {
        let s = sink.sge(i as usize * 8, 8);
        let wr = if i % 3 == 1 {
            SendWr::read(i, Some(s), t.key, t.iova + 32)
        } else {
            SendWr::fetch_add(i, s, t.key, t.iova, 1)
        };
        p.a.post_send(wr).unwrap();
    }
    // B silent: A stops at ORD.
    for _ in 0..5 {
        p.pull_only_a();
    }
    assert_eq!(p.sent(Dir::AtoB).len(), 2);
    assert_eq!((p.a.outstanding_atomics(), p.a.outstanding_reads()), (1, 1));
    assert_eq!((p.b.inbound_atomics(), p.b.inbound_reads()), (1, 1));
    loop {
        assert!(p.a.outstanding_reads() + p.a.outstanding_atomics() <= 2);
        assert!(p.b.inbound_reads() + p.b.inbound_atomics() <= 2);
        if p.step() == 0 {
            break;
        }
    }
    let cq = p.cq_a();
    assert_eq!(cq.len(), 8);
    assert!(
        cq.iter()
            .enumerate()
            .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success)
    );
    assert_eq!(word(&t, 0), 5);
}

/// IBT-C9-31: a fenced Send waits until the earlier atomic has its response.
#[test]
fn ibt_c9_31_fence_waits_for_atomics() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
    let sink = Mr::new(&p.ka, PD, 16, 0x8000, Access::LOCAL_WRITE);
    let rb = Mr::new(&p.kb, PD, 16, 0x9000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(7, vec![rb.sge(0, 16)])).unwrap();
    p.a.post_send(SendWr::fetch_add(1, sink.sge(0, 8), t.key, t.iova, 1))
        .unwrap();
    let fenced =
        SendWr::send(2, vec![sink.sge(8, 8)]).with_flags(SendFlags::SIGNALED | SendFlags::FENCE);
    p.a.post_send(fenced).unwrap();
    p.pull_only_a();
    p.pull_only_a();
    assert_eq!(
        p.sent(Dir::AtoB).len(),
        1,
        "only the Atomic Request went out"
    );
    p.drive();
    let ops: Vec<_> = p.sent(Dir::AtoB).iter().map(|u| opcode_of(u)).collect();
    assert_eq!(ops, [Some(Opcode::AtomicRequest), Some(Opcode::Send)]);
    assert_eq!(
        p.cq_a(),
        vec![ok(1, WcOpcode::FetchAdd, 8), ok(2, WcOpcode::Send, 8)]
    );
}

/// IBT-X-15, RFC 5041 §7.2: an Atomic Request repeated after it was executed (old MSN) is
/// refused (DDP untagged 0x03), not executed again.
#[test]
fn ibt_x_15_repeated_atomic_request_is_not_executed_twice() {
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
    let req = atomic_to(&mut p, t.key, t.iova);
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::FetchAdd, 8)]);
    assert_eq!(word(&t, 0), 1);
    p.inject(Dir::AtoB, &req);
    p.drive();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x03, Some(seg(&req)), None));
    assert_eq!(word(&t, 0), 1);
}

/// IBT-X-15: the same request repeated before its response went out, a request skipping an
/// MSN, and a second request reusing a pending Request Identifier: none executes; the first
/// one executed once.
#[test]
fn ibt_x_15_duplicate_or_out_of_order_atomic_never_executes() {
    // Repeated before the response: old MSN.
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
    let sink = Mr::new(&p.ka, PD, 8, 0x8000, Access::LOCAL_WRITE);
    p.a.post_send(SendWr::fetch_add(1, sink.sge(0, 8), t.key, t.iova, 1))
        .unwrap();
    p.pull_only_a();
    let req = p.sent(Dir::AtoB)[0].to_vec();
    p.inject(Dir::AtoB, &req);
    p.drive();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x03, Some(seg(&req)), None));
    assert_eq!(word(&t, 0), 1);
    assert_eq!(
        p.cq_a(),
        vec![wc(1, WcStatus::RemoteInvalidRequest, WcOpcode::FetchAdd, 0)]
    );

    // MSN 2 first: out of order.
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
    let u = atomic_ulpdu(2, fetch_add_req(2, t.key, t.iova, 1));
    p.inject(Dir::AtoB, &u);
    p.drive();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x03, Some(seg(&u)), None));
    assert_eq!(word(&t, 0), 0);

    // Two requests, one identifier, the first response still owed.
    let mut p = Pair::new(1024);
    let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
    let (u1, u2) = (
        atomic_ulpdu(1, fetch_add_req(77, t.key, t.iova, 1)),
        atomic_ulpdu(2, fetch_add_req(77, t.key, t.iova, 1)),
    );
    p.inject(Dir::AtoB, &u1);
    p.inject(Dir::AtoB, &u2);
    p.drive();
    assert_b_terminated(&mut p, &terminate(0, 2, 0xFF, Some(seg(&u2)), None));
    assert_eq!(word(&t, 0), 1);
}

/// RFC 7306 §5, EXT-DDP-05: Atomic Responses A did not ask for. None outstanding → DDP
/// untagged 0x02; a wrong Request Identifier → 0/2/0xFF and the atomic fails
/// RemoteOperation; an MSN ahead → 0x02; an old MSN → 0x03. The sink is never written.
#[test]
fn unexpected_atomic_responses_are_refused() {
    let mut p = Pair::new(1024);
    let u = response_ulpdu(1, 1, 99);
    p.inject(Dir::BtoA, &u);
    p.drive();
    assert_a_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&u)), None));

    type Edit = fn(&mut Vec<u8>);
    let cases: [(Edit, u8, u8, WcStatus); 3] = [
        (|u| u[21] ^= 0x40, 0, 0xFF, WcStatus::RemoteOperation), // identifier
        (|u| u[13] = 2, 1, 0x02, WcStatus::WorkRequestFlushed),  // MSN ahead
        (|u| u[13] = 0, 1, 0x03, WcStatus::WorkRequestFlushed),  // MSN behind
    ];
    for (edit, layer, code, status) in cases {
        let mut p = Pair::new(1024);
        let t = Mr::new(&p.kb, PD, 8, 0x4000, ATOMIC);
        let sink = Mr::new(&p.ka, PD, 8, 0x8000, Access::LOCAL_WRITE);
        set_word(&sink, 0, 0x5555);
        tamper_first(&mut p, Dir::BtoA, edit);
        p.a.post_send(SendWr::fetch_add(1, sink.sge(0, 8), t.key, t.iova, 1))
            .unwrap();
        p.drive();
        let resp = p.sent_op(Dir::BtoA, Opcode::AtomicResponse)[0].to_vec();
        assert_a_terminated(&mut p, &terminate(layer, 2, code, Some(seg(&resp)), None));
        assert_eq!(p.cq_a(), vec![wc(1, status, WcOpcode::FetchAdd, 0)]);
        assert_eq!(word(&sink, 0), 0x5555);
        assert_eq!(word(&t, 0), 1, "executed once at B");
    }
}

// ---- Immediate Data (RFC 7306 §6)

/// RDMAP-59, IBT-X-08: Write with immediate = the RDMA Write, then one Immediate Data (QN 0,
/// 8 octets: immediate, Write length). Every octet lands at the Write's target; the receive
/// WQE completes `RecvRdmaWithImm` with the immediate and the Write's length, and its buffer
/// is not written; the sender completes once, `RdmaWrite`. A zero-length one sends only the
/// Immediate Data.
#[test]
fn rdmap_59_write_with_imm_completes_recv_rdma_with_imm() {
    for len in [0usize, 1, 114, 115, 1000] {
        let mut p = Pair::new(128);
        let src = Mr::new(&p.ka, PD, 1000, 0x1000, Access::empty());
        let dst = Mr::new(&p.kb, PD, 1000, 0x2000, RW);
        let rb = Mr::new(&p.kb, PD, 16, 0x3000, Access::LOCAL_WRITE);
        src.put(0, &pattern(1000, 3));
        p.b.post_recv(RecvWr::new(9, vec![rb.sge(0, 16)])).unwrap();
        let imm = 0xCAFE_F00D;
        p.a.post_send(SendWr::write_with_imm(
            1,
            vec![src.sge(0, len)],
            dst.key,
            dst.iova,
            imm,
        ))
        .unwrap();
        p.drive();
        assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::RdmaWrite, len)]);
        assert_eq!(
            p.cq_b(),
            vec![with_imm(ok(9, WcOpcode::RecvRdmaWithImm, len), imm, false)]
        );
        assert!(dst.bytes()[..len] == src.bytes()[..len]);
        assert!(dst.bytes()[len..].iter().all(|&b| b == 0));
        assert!(
            rb.bytes().iter().all(|&b| b == 0),
            "nothing placed in the WQE"
        );
        let sent = p.sent(Dir::AtoB);
        let writes = sent.len() - 1;
        assert_eq!(writes, if len == 0 { 0 } else { len.div_ceil(114) });
        let mut imm_ulpdu = vec![0x41, 0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        imm_ulpdu.extend(imm.to_be_bytes());
        imm_ulpdu.extend((len as u32).to_be_bytes());
        assert_eq!(sent.last().copied(), Some(&imm_ulpdu[..]));
        dst.assert_guards_intact();
    }
}

/// RDMAP-59, RDMAP-62: Send with immediate = Immediate Data announcing the Send (word
/// `IMM_SEND_FOLLOWS`), then the Send: one WQE completes `Recv` with the immediate and the
/// Send's length; the next Send takes the next WQE. The messages use QN 0 MSNs 1, 2, 3.
#[test]
fn rdmap_59_send_with_imm_takes_one_wqe() {
    for len in [0usize, 10, 110, 1000] {
        let mut p = Pair::new(128);
        let src = Mr::new(&p.ka, PD, 1000, 0x1000, Access::empty());
        let rb = Mr::new(&p.kb, PD, 2000, 0x3000, Access::LOCAL_WRITE);
        src.put(0, &pattern(1000, 4));
        p.b.post_recv(RecvWr::new(8, vec![rb.sge(0, 1000)]))
            .unwrap();
        p.b.post_recv(RecvWr::new(9, vec![rb.sge(1000, 1000)]))
            .unwrap();
        p.a.post_send(SendWr::send_with_imm(1, vec![src.sge(0, len)], 77))
            .unwrap();
        p.a.post_send(SendWr::send(2, vec![src.sge(0, 5)])).unwrap();
        p.drive();
        assert_eq!(
            p.cq_a(),
            vec![ok(1, WcOpcode::Send, len), ok(2, WcOpcode::Send, 5)]
        );
        assert_eq!(
            p.cq_b(),
            vec![
                with_imm(ok(8, WcOpcode::Recv, len), 77, false),
                ok(9, WcOpcode::Recv, 5),
            ]
        );
        let b = rb.bytes();
        assert!(b[..len] == src.bytes()[..len]);
        assert!(b[1000..1005] == src.bytes()[..5]);
        let sent = p.sent(Dir::AtoB);
        let mut first = vec![0x41, 0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        first.extend(77u32.to_be_bytes());
        first.extend(IMM_SEND_FOLLOWS.to_be_bytes());
        assert_eq!(sent[0], &first[..]);
        let msns: Vec<u32> = sent[1..]
            .iter()
            .map(|u| match ddp_of(u) {
                ddp::Repr::Untagged { qn: 0, msn, .. } => msn,
                h => panic!("{h:?}"),
            })
            .collect();
        assert!(msns[..msns.len() - 1].iter().all(|&m| m == 2));
        assert_eq!(msns.last(), Some(&3));
    }
}

/// RDMAP-63: the solicited flag makes the Immediate Data 0x9 and the receive completion
/// solicited, for both kinds.
#[test]
fn rdmap_63_solicited_immediate_data() {
    let mut p = Pair::new(1024);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    let dst = Mr::new(&p.kb, PD, 64, 0x2000, RW);
    p.b.post_recv(RecvWr::new(8, vec![dst.sge(32, 32)]))
        .unwrap();
    p.b.post_recv(RecvWr::new(9, vec![dst.sge(32, 32)]))
        .unwrap();
    let se = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.a.post_send(
        SendWr::write_with_imm(1, vec![src.sge(0, 8)], dst.key, dst.iova, 5).with_flags(se),
    )
    .unwrap();
    p.a.post_send(SendWr::send_with_imm(2, vec![src.sge(0, 4)], 6).with_flags(se))
        .unwrap();
    p.drive();
    assert_eq!(
        p.cq_b(),
        vec![
            with_imm(ok(8, WcOpcode::RecvRdmaWithImm, 8), 5, true),
            with_imm(ok(9, WcOpcode::Recv, 4), 6, true),
        ]
    );
    assert_eq!(p.sent_op(Dir::AtoB, Opcode::ImmediateDataWithSe).len(), 2);
    assert!(p.sent_op(Dir::AtoB, Opcode::SendWithSe).is_empty());
}

/// RDMAP-59, EXT-DDP-05: Immediate Data with no receive posted → DDP untagged 0x02 quoting
/// it. A Write with immediate had completed at the sender (handed to the LLP, RDMAP-80); a
/// Send with immediate whose Send is still going out fails RemoteInvalidRequest.
#[test]
fn rdmap_59_immediate_without_receive_is_ddp_untagged_02() {
    let mut p = Pair::new(1024);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    let dst = Mr::new(&p.kb, PD, 64, 0x2000, RW);
    src.put(0, &[7; 64]);
    p.a.post_send(SendWr::write_with_imm(
        1,
        vec![src.sge(0, 16)],
        dst.key,
        dst.iova,
        5,
    ))
    .unwrap();
    p.drive();
    let imm = p.sent_op(Dir::AtoB, Opcode::ImmediateData)[0].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&imm)), None));
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::RdmaWrite, 16)]);
    assert!(dst.bytes()[..16].iter().all(|&b| b == 7));

    // The Send's three segments are not all out when the Terminate comes back.
    let mut p = Pair::new(128);
    p.burst = 1;
    let src = Mr::new(&p.ka, PD, 300, 0x1000, Access::empty());
    p.a.post_send(SendWr::send_with_imm(1, vec![src.sge(0, 300)], 5))
        .unwrap();
    p.drive();
    let imm = p.sent_op(Dir::AtoB, Opcode::ImmediateData)[0].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&imm)), None));
    assert_eq!(
        p.cq_a(),
        vec![wc(1, WcStatus::RemoteInvalidRequest, WcOpcode::Send, 0)]
    );
}

/// RDMAP-61: the Send a Send with immediate carries is longer than the WQE → DDP untagged
/// 0x05; the WQE completes LocalLength.
#[test]
fn rdmap_61_send_with_imm_too_long_is_ddp_untagged_05() {
    let mut p = Pair::new(1024);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    let rb = Mr::new(&p.kb, PD, 8, 0x3000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(9, vec![rb.sge(0, 8)])).unwrap();
    p.a.post_send(SendWr::send_with_imm(1, vec![src.sge(0, 20)], 5))
        .unwrap();
    p.drive();
    let send = p.sent_op(Dir::AtoB, Opcode::Send)[0].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x05, Some(seg(&send)), None));
    assert_eq!(
        p.cq_b(),
        vec![wc(9, WcStatus::LocalLength, WcOpcode::Recv, 0)]
    );
    rb.assert_guards_intact();
}

/// RDMAP-104 on the announced Send: after an Immediate Data announcing a Send, another
/// Immediate Data or a Send with Invalidate → 0/2/0x06; the WQE is flushed.
#[test]
fn rdmap_104_announced_send_must_be_a_send() {
    let invalidate = untagged(
        0,
        2,
        Body::SendWithInvalidate {
            invalidate_stag: 0x1234,
            payload: &[1, 2, 3],
        },
    );
    for next in [imm_ulpdu(2, 1, 0, false), invalidate] {
        let mut p = Pair::new(1024);
        let rb = Mr::new(&p.kb, PD, 16, 0x3000, Access::LOCAL_WRITE);
        p.b.post_recv(RecvWr::new(8, vec![rb.sge(0, 16)])).unwrap();
        p.b.post_recv(RecvWr::new(9, vec![rb.sge(0, 16)])).unwrap();
        p.inject(Dir::AtoB, &imm_ulpdu(1, 1, IMM_SEND_FOLLOWS, false));
        p.inject(Dir::AtoB, &next);
        p.drive();
        assert_b_terminated(&mut p, &terminate(0, 2, 0x06, Some(seg(&next)), None));
        assert_eq!(
            p.cq_b(),
            vec![flushed(8, WcOpcode::Recv), flushed(9, WcOpcode::Recv)]
        );
        assert!(rb.bytes().iter().all(|&b| b == 0));
    }
}

/// RDMAP-104, RDMAP-108, RFC 7306 §4: RFC 7306 messages that are malformed or on the wrong
/// queue. Too short or too long → 0/2/0xFF; not one segment → 0/2/0xFF; the wrong QN or T
/// flag → 0/2/0x06; an undefined QN → DDP untagged 0x01. Nothing is placed or executed.
#[test]
fn rdmap_104_malformed_rfc7306_messages_are_refused() {
    let imm = imm_ulpdu(1, 5, 0, false);
    let req = atomic_ulpdu(1, fetch_add_req(1, Key(0x100), 0x4000, 1));
    let resp = response_ulpdu(1, 1, 9);
    type Edit = fn(&mut Vec<u8>);
    let cases: [(&Vec<u8>, Edit, u8, u8, u8); 14] = [
        (&imm, |u| u.truncate(25), 0, 2, 0xFF),
        (&imm, |u| u.push(0), 0, 2, 0xFF),
        (&imm, |u| u[0] &= !0x40, 0, 2, 0xFF), // L = 0
        (&imm, |u| u[9] = 1, 0, 2, 0x06),      // QN 1
        (&imm, |u| u[9] = 3, 0, 2, 0x06),      // QN 3
        (&imm, |u| u[0] |= 0x80, 0, 2, 0x06),  // tagged
        (&req, |u| u.truncate(69), 0, 2, 0xFF),
        (&req, |u| u.extend([0; 4]), 0, 2, 0xFF),
        (&req, |u| u[9] = 0, 0, 2, 0x06),  // QN 0
        (&req, |u| u[17] = 8, 0, 2, 0xFF), // MO 8
        (&req, |u| u[9] = 4, 1, 2, 0x01),  // QN 4
        (&resp, |u| u.truncate(29), 0, 2, 0xFF),
        (&resp, |u| u[9] = 1, 0, 2, 0x06),     // QN 1
        (&resp, |u| u[0] |= 0x80, 0, 2, 0x06), // tagged
    ];
    for (base, edit, layer, etype, code) in cases {
        let mut p = Pair::new(1024);
        let t = Mr::new(&p.kb, PD, 64, 0x4000, ATOMIC);
        let rb = Mr::new(&p.kb, PD, 16, 0x3000, Access::LOCAL_WRITE);
        p.b.post_recv(RecvWr::new(9, vec![rb.sge(0, 16)])).unwrap();
        let mut u = base.clone();
        edit(&mut u);
        p.inject(Dir::AtoB, &u);
        p.drive();
        assert_b_terminated(&mut p, &terminate(layer, etype, code, Some(seg(&u)), None));
        assert_eq!(p.cq_b(), vec![flushed(9, WcOpcode::Recv)]);
        assert!(t.bytes().iter().all(|&b| b == 0) && rb.bytes().iter().all(|&b| b == 0));
        t.assert_guards_intact();
    }
}

/// The iWARP acceptance rules: an atomic needs exactly one 8-octet entry (with LOCAL_WRITE)
/// and an 8-aligned remote address, no INLINE, and ORD > 0; a Write with immediate at most
/// 2^31 - 1 octets; UD destinations do not exist. Nothing is queued.
#[test]
fn post_rules_for_rfc7306_operations() {
    let mut c = cfg(QP_A, 256);
    c.max_inline = 64;
    let mut p = Pair::with(c, cfg(QP_B, 256));
    let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::LOCAL_WRITE);
    let ro = Mr::new(&p.ka, PD, 64, 0x2000, Access::empty());
    let r = Key(1);
    let fa = |sges: Vec<Sge>, to: u64| SendWr {
        sg_list: sges.into(),
        ..SendWr::fetch_add(1, m.sge(0, 8), r, to, 1)
    };
    for wr in [
        fa(vec![m.sge(0, 4)], 0),
        fa(vec![m.sge(0, 16)], 0),
        fa(vec![m.sge(0, 8), m.sge(8, 8)], 0),
        fa(vec![], 0),
        fa(vec![m.sge(0, 8)], 4),
        SendWr::cmp_swap(1, m.sge(0, 8), r, 0x1001, 1, 2),
    ] {
        assert_eq!(p.a.post_send(wr), Err(PostError::AtomicShape));
    }
    let inline = SendWr::fetch_add(1, m.sge(0, 8), r, 0, 1)
        .with_flags(SendFlags::SIGNALED | SendFlags::INLINE);
    assert_eq!(p.a.post_send(inline), Err(PostError::Inline { max: 64 }));
    assert!(matches!(
        p.a.post_send(SendWr::fetch_add(1, ro.sge(0, 8), r, 0, 1)),
        Err(PostError::LocalProtection { sge: 0, .. })
    ));
    let huge = Sge::new(Key(0xdead), 0, MAX_WRITE_WITH_IMM + 1);
    assert_eq!(
        p.a.post_send(SendWr::write_with_imm(1, vec![huge], r, 0, 1)),
        Err(PostError::MessageTooLong)
    );
    let dest = UdDest {
        ah: 0,
        remote_qpn: 1,
        remote_qkey: 0,
    };
    assert_eq!(
        p.a.post_send(SendWr::send_with_imm(1, vec![m.sge(0, 1)], 1).to(dest)),
        Err(PostError::Destination)
    );
    assert_eq!(p.a.sq_len(), 0);
    assert_eq!(p.a.state(), StreamState::Rts);

    let mut no_ord = cfg(QP_A, 256);
    no_ord.ord = 0;
    let mut e = crate::rdmap::RdmapEngine::new(no_ord, p.ka.clone());
    assert_eq!(
        e.post_send(SendWr::fetch_add(1, m.sge(0, 8), r, 0, 1)),
        Err(PostError::ReadsDisabled)
    );
}

/// RDMAP-72: posted to a dead QP, the RFC 7306 operations are flushed with their opcodes.
#[test]
fn rdmap_72_rfc7306_posts_to_a_dead_qp_are_flushed() {
    let mut p = Pair::new(256);
    let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::LOCAL_WRITE);
    p.a.close();
    p.a.post_send(SendWr::fetch_add(1, m.sge(0, 8), Key(1), 0, 1))
        .unwrap();
    p.a.post_send(SendWr::cmp_swap(2, m.sge(0, 8), Key(1), 0, 1, 2))
        .unwrap();
    p.a.post_send(SendWr::write_with_imm(3, vec![m.sge(0, 8)], Key(1), 0, 1))
        .unwrap();
    p.a.post_send(SendWr::send_with_imm(4, vec![m.sge(0, 8)], 1))
        .unwrap();
    assert_eq!(
        p.cq_a(),
        vec![
            flushed(1, WcOpcode::FetchAdd),
            flushed(2, WcOpcode::CompSwap),
            flushed(3, WcOpcode::RdmaWrite),
            flushed(4, WcOpcode::Send),
        ]
    );
}

mod props {
    //! Property tests: hostile RFC 7306 messages never panic the engine (nor write outside a
    //! registered region, nor execute an atomic twice); random RFC 7306 traffic round-trips.

    use proptest::prelude::*;

    use super::*;

    /// An RFC 7306 message with arbitrary fields, then a random DDP header and length edit.
    fn hostile_7306() -> impl Strategy<Value = Vec<u8>> {
        (
            0u8..4,
            any::<u32>(),
            any::<u64>(),
            any::<[u64; 4]>(),
            0u8..4,
            (
                0u32..5,
                0u32..4,
                prop_oneof![Just(0u32), any::<u32>()],
                any::<bool>(),
            ),
            -3i32..3,
            any::<u8>(),
        )
            .prop_map(
                |(kind, id, to, data, aop, (qn, msn, mo, last), grow, tweak)| {
                    let stag = Key(0x0000_0100 | u32::from(tweak & 0x3));
                    let body = match kind {
                        0 | 1 => {
                            let mut d = [0u8; 8];
                            d.copy_from_slice(&data[0].to_be_bytes());
                            let i = ImmediateDataRepr { immediate_data: d };
                            if kind == 0 {
                                Body::ImmediateData(i)
                            } else {
                                Body::ImmediateDataWithSe(i)
                            }
                        }
                        2 => Body::AtomicRequest(AtomicRequestRepr {
                            reserved: 0,
                            opcode: AtomicOpcode::ALL[usize::from(aop) % 3],
                            request_identifier: id,
                            remote_stag: stag.0,
                            remote_tagged_offset: if tweak & 4 == 0 {
                                0x4000 + (to % 72)
                            } else {
                                to
                            },
                            add_or_swap_data: data[1],
                            add_or_swap_mask: if tweak & 8 == 0 { 0 } else { data[2] },
                            compare_data: data[3],
                            compare_mask: if tweak & 16 == 0 { u64::MAX } else { data[0] },
                        }),
                        _ => Body::AtomicResponse(AtomicResponseRepr {
                            original_request_identifier: id % 4,
                            original_remote_data_value: data[0],
                        }),
                    };
                    let opcode_qn = match kind {
                        0 | 1 => 0,
                        2 => 1,
                        _ => 3,
                    };
                    let mut u = untagged(opcode_qn, 0, body);
                    let q = if tweak & 32 == 0 { opcode_qn } else { qn };
                    u[6..10].copy_from_slice(&q.to_be_bytes());
                    u[10..14].copy_from_slice(&msn.to_be_bytes());
                    u[14..18].copy_from_slice(&mo.to_be_bytes());
                    if !last && tweak & 64 != 0 {
                        u[0] &= !0x40;
                    }
                    if tweak & 128 != 0 {
                        u[0] |= 0x80;
                    }
                    let len = (u.len() as i32 + grow).max(0) as usize;
                    u.resize(len, 0xA5);
                    u
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// RDMAP-103, RDMAP-69, RDMAP-73, IBT-X-15: any sequence of RFC 7306 messages from a
        /// hostile peer, to a side with receives posted and an atomic region, and to a side
        /// with atomics outstanding, never panics: at most one Terminate, which parses and
        /// ends the stream; no octet outside a region changes; the word changes only by the
        /// atomics the responder accepted.
        #[test]
        fn hostile_rfc7306_messages_never_panic(
            inputs in proptest::collection::vec(hostile_7306(), 1..8),
            to_requester in any::<bool>(),
        ) {
            let mut p = Pair::new(128);
            let t = Mr::new(&p.kb, PD, 72, 0x4000, ATOMIC | Access::REMOTE_READ);
            let rb = Mr::new(&p.kb, PD, 64, 0x3000, Access::LOCAL_WRITE);
            let sink = Mr::new(&p.ka, PD, 64, 0x8000, Access::LOCAL_WRITE);
            let arb = Mr::new(&p.ka, PD, 64, 0x9000, Access::LOCAL_WRITE);
            p.b.post_recv(RecvWr::new(1, vec![rb.sge(0, 32)])).unwrap();
            p.b.post_recv(RecvWr::new(2, vec![rb.sge(32, 32)])).unwrap();
            p.a.post_recv(RecvWr::new(3, vec![arb.sge(0, 64)])).unwrap();
            let dir = if to_requester {
                // A has atomics on the wire that B never answers.
                for i in 0..3u64 {
                    p.a.post_send(SendWr::fetch_add(i, sink.sge(i as usize * 8, 8), t.key,
                        t.iova, 1)).unwrap();
                }
                p.pull_only_a();
                Dir::BtoA
            } else {
                Dir::AtoB
            };
            let before = word(&t, 0);
            for u in &inputs {
                p.inject(dir, u);
            }
            p.drive();
            let back = match dir { Dir::AtoB => Dir::BtoA, Dir::BtoA => Dir::AtoB };
            let terms: Vec<Vec<u8>> = p.sent(back).into_iter()
                .filter(|u| u.get(1).is_some_and(|c| c & 0x0F == 7))
                .map(|u| u.to_vec())
                .collect();
            prop_assert!(terms.len() <= 1);
            if let Some(tm) = terms.first() {
                prop_assert!(Segment::parse(tm).is_ok());
                prop_assert_eq!(p.sent(back).last().map(|u| u.to_vec()), Some(tm.clone()));
            }
            // Each Atomic Request the responder saw executed at most once: at most one
            // Atomic Response each.
            let requests = p.sent_op(Dir::AtoB, Opcode::AtomicRequest).len();
            let injected = if dir == Dir::BtoA {
                inputs.iter().filter(|u| opcode_of(u) == Some(Opcode::AtomicResponse)).count()
            } else {
                0
            };
            let responses = p.sent_op(Dir::BtoA, Opcode::AtomicResponse).len() - injected;
            prop_assert!(responses <= requests);
            if requests == 0 {
                prop_assert_eq!(word(&t, 0), before);
            }
            for m in [&t, &rb, &sink, &arb] {
                m.assert_guards_intact();
            }
        }

        /// Random mixes of atomics, Reads, Writes, Sends and the immediate-data operations at
        /// a random MULPDU, ORD and IRD: every completion succeeds, in order, with the right
        /// result.
        #[test]
        fn random_rfc7306_traffic_round_trips(
            mulpdu in 128u16..2000,
            ord in 1u16..5,
            ops in proptest::collection::vec((0u8..6, 0usize..3000, any::<u64>()), 1..16),
            burst in 1usize..4,
        ) {
            let (mut ca, mut cb) = (cfg(QP_A, mulpdu), cfg(QP_B, mulpdu));
            (ca.ord, cb.ird) = (ord, ord);
            let mut p = Pair::with(ca, cb);
            p.burst = burst;
            p.record = false;
            let n = ops.len();
            const SLOT: usize = 3000;
            let src = Mr::new(&p.ka, PD, n * SLOT, 0x10_0000, Access::empty());
            let sink = Mr::new(&p.ka, PD, n * SLOT, 0x20_0000, Access::LOCAL_WRITE);
            let words = Mr::new(&p.kb, PD, 16, 0x30_0000, ATOMIC);
            let remote = Mr::new(&p.kb, PD, n * SLOT, 0x40_0000, RW | Access::REMOTE_READ);
            let rcv = Mr::new(&p.kb, PD, n * SLOT, 0x50_0000, Access::LOCAL_WRITE);
            src.put(0, &pattern(n * SLOT, 1));
            remote.put(0, &pattern(n * SLOT, 2));
            let mut model = [0u64; 2];
            let mut originals = vec![None; n];
            for (i, &(kind, len, v)) in ops.iter().enumerate() {
                let (off, id) = (i * SLOT, i as u64);
                let k = (v & 1) as usize;
                let wr = match kind {
                    0 => {
                        originals[i] = Some(model[k]);
                        model[k] = model[k].wrapping_add(v);
                        SendWr::fetch_add(id, sink.sge(off, 8), words.key, words.iova + 8 * k as u64, v)
                    }
                    1 => {
                        originals[i] = Some(model[k]);
                        let compare = if v & 2 == 0 { model[k] } else { !model[k] };
                        if compare == model[k] {
                            model[k] = v;
                        }
                        SendWr::cmp_swap(id, sink.sge(off, 8), words.key, words.iova + 8 * k as u64, compare, v)
                    }
                    2 => SendWr::read(id, Some(sink.sge(off, len)), remote.key, remote.iova + off as u64),
                    3 => SendWr::write(id, vec![src.sge(off, len)], remote.key, remote.iova + off as u64),
                    4 => {
                        p.b.post_recv(RecvWr::new(id, vec![rcv.sge(off, SLOT)])).unwrap();
                        SendWr::write_with_imm(id, vec![src.sge(off, len)], remote.key, remote.iova + off as u64, v as u32)
                    }
                    _ => {
                        p.b.post_recv(RecvWr::new(id, vec![rcv.sge(off, SLOT)])).unwrap();
                        SendWr::send_with_imm(id, vec![src.sge(off, len)], v as u32)
                    }
                };
                p.a.post_send(wr).unwrap();
            }
            p.drive();
            let cq = p.cq_a();
            prop_assert_eq!(cq.len(), n);
            let orig = pattern(n * SLOT, 2);
            let (s, k, r, c) = (src.bytes(), sink.bytes(), remote.bytes(), rcv.bytes());
            let mut recvs = p.cq_b().into_iter();
            for (i, (wc, &(kind, len, v))) in cq.iter().zip(&ops).enumerate() {
                prop_assert_eq!(wc.wr_id, i as u64);
                prop_assert_eq!(wc.status, WcStatus::Success);
                let range = i * SLOT..i * SLOT + len;
                match kind {
                    0 | 1 => prop_assert_eq!(Some(word(&sink, i * SLOT)), originals[i]),
                    2 => prop_assert!(k[range.clone()] == orig[range]),
                    3 => prop_assert!(r[range.clone()] == s[range]),
                    4 => {
                        prop_assert!(r[range.clone()] == s[range]);
                        let rc = recvs.next().unwrap();
                        prop_assert_eq!((rc.opcode, rc.imm, rc.byte_len),
                            (WcOpcode::RecvRdmaWithImm, Some(v as u32), len as u32));
                    }
                    _ => {
                        prop_assert!(c[range.clone()] == s[range]);
                        let rc = recvs.next().unwrap();
                        prop_assert_eq!((rc.opcode, rc.imm, rc.byte_len),
                            (WcOpcode::Recv, Some(v as u32), len as u32));
                    }
                }
            }
            prop_assert!(recvs.next().is_none());
            prop_assert_eq!([word(&words, 0), word(&words, 8)], model);
        }
    }
}
