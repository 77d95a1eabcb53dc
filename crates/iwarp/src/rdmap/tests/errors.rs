//! Error handling: one test per remote error of `docs/spec/rdmap.md` §9.3, asserting the exact
//! Terminate octets on the wire, the completions on both sides, the QP states, and that no
//! octet outside the registered region changed.

use softrdma_memory::{Access, Key, KeyState, MrFlags, MwType, PdId, QpId};
use softrdma_wire::ddp;
use softrdma_wire::rdmap::{LlpError, Opcode, TerminateCode, TerminateLayout, TerminatedDdp};

use super::pair::{Dir, GUARD, Mr, PD, Pair, QP_A, QP_B, cfg, ddp_of, opcode_of};
use super::{flushed, ok, wc};
use crate::rdmap::{QpEvent, StreamState};
use crate::verbs_types::{RecvWr, SendWr, WcOpcode, WcStatus};
use softrdma_testkit::pattern;

pub(super) const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Our Terminate's DDP header: untagged, L, DV 1, RV 1 opcode 7, QN 2, MSN 1, MO 0.
const TERM_HDR: [u8; 18] = [0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];

/// The Terminate ULPDU RFC 5040 §4.8 prescribes (RFC layout): Layer/EType, code, M D R,
/// then DDP Segment Length + Terminated DDP Header, then the Terminated RDMA Header.
pub(super) fn terminate(
    layer: u8,
    etype: u8,
    code: u8,
    ddp: Option<(usize, &[u8])>,
    rdma: Option<&[u8]>,
) -> Vec<u8> {
    let mut v = TERM_HDR.to_vec();
    let flags = if ddp.is_some() { 0xC0 } else { 0 } | if rdma.is_some() { 0x20 } else { 0 };
    v.extend([(layer << 4) | etype, code, flags, 0]);
    if let Some((len, hdr)) = ddp {
        v.extend((len as u16).to_be_bytes());
        v.extend_from_slice(hdr);
    }
    if let Some(r) = rdma {
        v.extend_from_slice(r);
    }
    v
}

/// (length DDP handed up, DDP header) of a failing segment.
pub(super) fn seg(u: &[u8]) -> (usize, &[u8]) {
    let hl = ddp::header_len_for(u[0]);
    (u.len() - hl, &u[..hl])
}

/// The one Terminate `dir` carried, checking it is the last ULPDU that way (RDMAP-69,
/// RDMAP-73).
pub(super) fn only_terminate(p: &Pair, dir: Dir) -> Vec<u8> {
    let sent = p.sent(dir);
    let terms: Vec<_> = sent
        .iter()
        .filter(|u| opcode_of(u) == Some(Opcode::Terminate))
        .collect();
    assert_eq!(terms.len(), 1, "exactly one Terminate (RDMAP-69)");
    assert_eq!(sent.last(), Some(terms[0]), "nothing after it (RDMAP-73)");
    terms[0].to_vec()
}

/// B detected the error: its Terminate is `expect`, both QPs are dead, B reported the local
/// error (RDMAP-98) and A's ULP saw the Terminate (RDMAP-70, RDMAP-10).
pub(super) fn assert_b_terminated(p: &mut Pair, expect: &[u8]) {
    assert_eq!(only_terminate(p, Dir::BtoA), expect);
    assert_eq!(
        (p.a.state(), p.b.state()),
        (StreamState::Error, StreamState::Error)
    );
    let t = *p.b.terminate_sent().expect("B sent a Terminate");
    assert_eq!(p.events_b(), vec![QpEvent::LocalError(t)]);
    assert_eq!(p.events_a(), vec![QpEvent::TerminateReceived(t)]);
    assert_eq!(p.a.terminate_received(), Some(&t));
    assert!(
        p.a.terminate_sent().is_none(),
        "no Terminate answers a Terminate"
    );
    assert!(!p.a.wants_transmit() && !p.b.wants_transmit());
}

/// A detected the error (mirror of [`assert_b_terminated`]).
pub(super) fn assert_a_terminated(p: &mut Pair, expect: &[u8]) {
    assert_eq!(only_terminate(p, Dir::AtoB), expect);
    assert_eq!(
        (p.a.state(), p.b.state()),
        (StreamState::Error, StreamState::Error)
    );
    let t = *p.a.terminate_sent().expect("A sent a Terminate");
    assert_eq!(p.events_a(), vec![QpEvent::LocalError(t)]);
    assert_eq!(p.events_b(), vec![QpEvent::TerminateReceived(t)]);
    assert!(p.b.terminate_sent().is_none());
}

/// The first ULPDU of `dir` is rewritten by `f`.
pub(super) fn tamper_first(p: &mut Pair, dir: Dir, f: impl Fn(&mut Vec<u8>) + 'static) {
    tamper_nth(p, dir, 0, f);
}

/// The `n`th ULPDU of `dir` is rewritten by `f`.
pub(super) fn tamper_nth(p: &mut Pair, dir: Dir, n: usize, f: impl Fn(&mut Vec<u8>) + 'static) {
    let mut seen = 0;
    p.tamper = Some(Box::new(move |d, u| {
        if d == dir {
            if seen == n {
                f(u);
            }
            seen += 1;
        }
        true
    }));
}

// ---- RDMA Write sink (RDMAP-37, §9.3 derived row: DDP tagged buffer codes)

/// A writes `len` octets to (`rkey`, `to`) on B, which keeps one receive posted.
fn write_to(p: &mut Pair, rkey: Key, to: u64, len: usize) -> Vec<u8> {
    let src = Mr::new(&p.ka, PD, len.max(1), 0x77_0000, Access::empty());
    src.put(0, &pattern(len, 42));
    let rb = Mr::new(&p.kb, PD, 8, 0x66_0000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(100, vec![rb.sge(0, 8)])).unwrap();
    let before = p.sent_op(Dir::AtoB, Opcode::RdmaWrite).len();
    p.a.post_send(SendWr::write(1, vec![src.sge(0, len)], rkey, to))
        .unwrap();
    p.drive();
    p.sent_op(Dir::AtoB, Opcode::RdmaWrite)[before].to_vec()
}

/// The Write was handed to the LLP before the Terminate came back (RFC 5040 §5.5 rule 9:
/// its completion says nothing about the peer); B's receive is flushed (RDMAP-72).
fn assert_write_outcome(p: &mut Pair, len: usize) {
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::RdmaWrite, len)]);
    assert_eq!(p.cq_b(), vec![flushed(100, WcOpcode::Recv)]);
}

/// RDMAP-37, RDMAP-06, RDMAP-100: RDMA Write to an invalid STag (wrong consumer key) →
/// Terminate DDP / tagged / 0x00, M+D, the Write's DDP header quoted.
#[test]
fn rdmap_37_write_invalid_stag_is_ddp_tagged_00() {
    let mut p = Pair::new(1024);
    let dst = Mr::new(&p.kb, PD, 4096, 0x10_0000, RW);
    let w = write_to(&mut p, Key(dst.key.0 ^ 0x5A), dst.iova, 100);
    assert_b_terminated(&mut p, &terminate(1, 1, 0x00, Some(seg(&w)), None));
    assert_write_outcome(&mut p, 100);
    assert!(dst.bytes().iter().all(|&b| b == 0));
    dst.assert_guards_intact();
}

/// RDMAP-117, RDMAP-37: a multi-segment Write running off the end of the region: the
/// segments inside are placed, the first one crossing the end is refused (DDP tagged 0x01,
/// its header quoted) and no octet outside the region changes.
#[test]
fn rdmap_117_write_past_the_end_is_ddp_tagged_01() {
    let mut p = Pair::new(128);
    let dst = Mr::new(&p.kb, PD, 1000, 0x10_0000, RW);
    write_to(&mut p, dst.key, dst.iova + 700, 1000);
    let writes = p.sent_op(Dir::AtoB, Opcode::RdmaWrite);
    // 114-octet segments: [700, 814) and [814, 928) fit, [928, 1042) does not.
    let third = writes[2].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 1, 0x01, Some(seg(&third)), None));
    assert_write_outcome(&mut p, 1000);
    let got = dst.bytes();
    assert!(got[700..928] == pattern(228, 42)[..]);
    assert!(got[..700].iter().chain(&got[928..]).all(|&b| b == 0));
    dst.assert_guards_intact();
}

/// RDMAP-115: an STag of another protection domain → DDP tagged 0x02 (not associated).
#[test]
fn rdmap_115_write_other_pd_is_ddp_tagged_02() {
    let mut p = Pair::new(1024);
    let dst = Mr::new(&p.kb, PdId(2), 4096, 0x10_0000, RW);
    let w = write_to(&mut p, dst.key, dst.iova, 64);
    assert_b_terminated(&mut p, &terminate(1, 1, 0x02, Some(seg(&w)), None));
    assert_write_outcome(&mut p, 64);
    assert!(dst.bytes().iter().all(|&b| b == 0));
    dst.assert_guards_intact();
}

/// RDMAP-116: a type 2A window bound to this QP works; one bound to another QP → DDP
/// tagged 0x02.
#[test]
fn rdmap_116_window_of_another_qp_is_ddp_tagged_02() {
    let mut p = Pair::new(1024);
    let mr = Mr::new(&p.kb, PD, 8192, 0x10_0000, RW | Access::MW_BIND);
    let bind = |qp: QpId, off: u64| {
        let mw = p.kb.alloc_mw(PD, MwType::Type2A).unwrap();
        p.kb.bind_mw(
            mw,
            mr.key,
            qp,
            PD,
            mr.iova + off,
            4096,
            Access::REMOTE_WRITE,
        )
        .unwrap()
    };
    let mine = bind(QP_B, 0);
    let theirs = bind(QpId(99), 4096);
    let src = Mr::new(&p.ka, PD, 64, 0x77_0000, Access::empty());
    src.put(0, &pattern(64, 1));
    p.a.post_send(SendWr::write(7, vec![src.sge(0, 64)], mine, mr.iova))
        .unwrap();
    p.drive();
    assert!(mr.bytes()[..64] == pattern(64, 1)[..]);
    assert_eq!(p.cq_a(), vec![ok(7, WcOpcode::RdmaWrite, 64)]);
    let w = write_to(&mut p, theirs, mr.iova + 4096, 64);
    assert_b_terminated(&mut p, &terminate(1, 1, 0x02, Some(seg(&w)), None));
    assert_write_outcome(&mut p, 64);
    assert!(mr.bytes()[64..].iter().all(|&b| b == 0));
    mr.assert_guards_intact();
}

/// RDMAP-25, RFC 5041 §7.2: a Write whose TO + length wraps 2^64 → DDP tagged 0x03.
#[test]
fn write_to_wrap_is_ddp_tagged_03() {
    let mut p = Pair::new(1024);
    let dst = Mr::new(&p.kb, PD, 4096, 0x10_0000, RW);
    let w = write_to(&mut p, dst.key, u64::MAX - 5, 10);
    assert_b_terminated(&mut p, &terminate(1, 1, 0x03, Some(seg(&w)), None));
    assert_write_outcome(&mut p, 10);
    assert!(dst.bytes().iter().all(|&b| b == 0));
    dst.assert_guards_intact();
}

/// RDMAP-119, §9.3 derived row: a Write to an STag without remote write → RDMA Remote
/// Protection 0x02 (DDP has no code for rights), M+D, no RDMA header.
#[test]
fn rdmap_119_write_without_rights_is_rdma_protection_02() {
    let mut p = Pair::new(1024);
    let dst = Mr::new(
        &p.kb,
        PD,
        4096,
        0x10_0000,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    );
    let w = write_to(&mut p, dst.key, dst.iova, 64);
    assert_b_terminated(&mut p, &terminate(0, 1, 0x02, Some(seg(&w)), None));
    assert_write_outcome(&mut p, 64);
    assert!(dst.bytes().iter().all(|&b| b == 0));
    dst.assert_guards_intact();
}

/// RDMAP-120: the region is deregistered while a Write is in flight: the next segment is
/// refused (DDP tagged 0x00, its header quoted), nothing changes after the revoke, and the
/// half-sent Write fails at A with the mapped status.
#[test]
fn rdmap_120_revoke_during_write_stops_placement() {
    let mut p = Pair::new(128);
    let dst = Mr::new(&p.kb, PD, 20_000, 0x10_0000, RW);
    let src = Mr::new(&p.ka, PD, 10_000, 0x77_0000, Access::empty());
    src.put(0, &pattern(10_000, 120));
    p.a.post_send(SendWr::write(
        1,
        vec![src.sge(0, 10_000)],
        dst.key,
        dst.iova,
    ))
    .unwrap();
    p.burst = 1;
    for _ in 0..20 {
        p.step();
    }
    p.kb.dereg_mr(dst.key).unwrap();
    let frozen = dst.snapshot();
    p.drive();
    assert!(
        dst.snapshot() == frozen,
        "placement after the revoke returned"
    );
    let w = p.sent_op(Dir::AtoB, Opcode::RdmaWrite)[20].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 1, 0x00, Some(seg(&w)), None));
    assert!(frozen[GUARD..GUARD + 20 * 114] == pattern(20 * 114, 120)[..]);
    dst.assert_guards_intact();
    // The Terminate quotes the Write A is still sending.
    assert_eq!(
        p.cq_a(),
        vec![wc(1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite, 0)]
    );
}

// ---- RDMA Read source (RFC 5040 §7.2 checks 4a-4e, RDMAP-101: M+D+R)

/// A reads `len` octets from (`rkey`, `to`) on B; returns the Read Request ULPDU and the
/// sink.
fn read_from(p: &mut Pair, rkey: Key, to: u64, len: u32) -> (Vec<u8>, Mr) {
    let sink = Mr::new(
        &p.ka,
        PD,
        len.max(1) as usize,
        0x55_0000,
        Access::LOCAL_WRITE,
    );
    p.a.post_send(SendWr::read(9, Some(sink.sge(0, len as usize)), rkey, to))
        .unwrap();
    p.drive();
    let rr = p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest)[0].to_vec();
    (rr, sink)
}

/// The Read failed at the source with `code`: the Terminate quotes the request's DDP header
/// and its original Read Request Header (nothing was sent, RDMAP-33); A's Read completes
/// with RemoteAccess; the sink and the source are untouched.
fn assert_read_refused(p: &mut Pair, code: u8, source: &Mr) {
    let rr = p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest)[0].to_vec();
    let expect = terminate(0, 1, code, Some((28, &rr[..18])), Some(&rr[18..46]));
    assert_b_terminated(p, &expect);
    assert_eq!(
        p.cq_a(),
        vec![wc(9, WcStatus::RemoteAccess, WcOpcode::RdmaRead, 0)]
    );
    assert!(p.cq_b().is_empty(), "no WR at the source (RDMAP-12)");
    assert!(p.sent_op(Dir::BtoA, Opcode::RdmaReadResponse).is_empty());
    source.assert_guards_intact();
}

fn read_source(p: &Pair, pd: PdId, access: Access) -> Mr {
    let src = Mr::new(&p.kb, pd, 4096, 0x40_0000, access);
    src.put(0, &pattern(4096, 40));
    src
}

/// RDMAP-109 (4a), RDMAP-44, RDMAP-101: invalid SrcSTag → RDMA Remote Protection 0x00,
/// M+D+R.
#[test]
fn rdmap_109_read_invalid_stag_is_rdma_protection_00() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    let (_, sink) = read_from(&mut p, Key(src.key.0 ^ 0x33), src.iova, 100);
    assert_read_refused(&mut p, 0x00, &src);
    assert!(sink.bytes().iter().all(|&b| b == 0));
    sink.assert_guards_intact();
}

/// RDMAP-110 (4b), RDMAP-115: SrcSTag of another protection domain → 0x03.
#[test]
fn rdmap_110_read_other_pd_is_rdma_protection_03() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PdId(3), Access::REMOTE_READ);
    read_from(&mut p, src.key, src.iova, 100);
    assert_read_refused(&mut p, 0x03, &src);
}

/// RDMAP-111 (4c): SrcTO below the region's base → 0x01.
#[test]
fn rdmap_111_read_below_base_is_rdma_protection_01() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    read_from(&mut p, src.key, src.iova - 1, 10);
    assert_read_refused(&mut p, 0x01, &src);
}

/// RDMAP-112 (4d): SrcTO + size one octet past the end → 0x01.
#[test]
fn rdmap_112_read_one_past_end_is_rdma_protection_01() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    read_from(&mut p, src.key, src.iova + 4096 - 9, 10);
    assert_read_refused(&mut p, 0x01, &src);
}

/// RDMAP-113 (4e): SrcTO = 2^64 - 1, size 2 → TO wrap 0x04.
#[test]
fn rdmap_113_read_to_wrap_is_rdma_protection_04() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    read_from(&mut p, src.key, u64::MAX, 2);
    assert_read_refused(&mut p, 0x04, &src);
}

/// RDMAP-114, RDMAP-119: reading a write-only STag → access rights 0x02.
#[test]
fn rdmap_114_read_without_rights_is_rdma_protection_02() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, RW);
    read_from(&mut p, src.key, src.iova, 100);
    assert_read_refused(&mut p, 0x02, &src);
}

/// RDMAP-33, RDMAP-101, RDMAP-120: the source is deregistered while its Read Response is
/// half sent: the Terminate's RDMA header has both TOs advanced and the size reduced by
/// the octets already sent; A's Read fails with RemoteAccess.
#[test]
fn rdmap_33_read_revoked_mid_response_quotes_advanced_header() {
    let mut p = Pair::new(128);
    let src = Mr::new(&p.kb, PD, 100_000, 0x40_0000, Access::REMOTE_READ);
    src.put(0, &pattern(100_000, 33));
    let sink = Mr::new(&p.ka, PD, 100_000, 0x55_0000, Access::LOCAL_WRITE);
    p.a.post_send(SendWr::read(
        9,
        Some(sink.sge(0, 100_000)),
        src.key,
        src.iova,
    ))
    .unwrap();
    p.burst = 1;
    for _ in 0..11 {
        p.step();
    }
    p.kb.dereg_mr(src.key).unwrap();
    p.drive();
    let sent = p.sent_op(Dir::BtoA, Opcode::RdmaReadResponse).len() as u32 * 114;
    assert_eq!(sent, 10 * 114);
    let rr = p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest)[0].to_vec();
    let mut advanced = Vec::new();
    advanced.extend(sink.key.0.to_be_bytes());
    advanced.extend((sink.iova + u64::from(sent)).to_be_bytes());
    advanced.extend((100_000 - sent).to_be_bytes());
    advanced.extend(src.key.0.to_be_bytes());
    advanced.extend((src.iova + u64::from(sent)).to_be_bytes());
    let expect = terminate(0, 1, 0x00, Some((28, &rr[..18])), Some(&advanced));
    assert_b_terminated(&mut p, &expect);
    assert_eq!(
        p.cq_a(),
        vec![wc(9, WcStatus::RemoteAccess, WcOpcode::RdmaRead, 0)]
    );
    assert!(sink.bytes()[..sent as usize] == pattern(sent as usize, 33)[..]);
    sink.assert_guards_intact();
}

/// RDMAP-91, RDMAP-125: a peer exceeding IRD (its ORD 4, our IRD 2): the third Read Request
/// finds no QN 1 buffer → DDP untagged 0x02 quoting it; it fails at A with
/// RemoteInvalidRequest, the two accepted ones are flushed, no response went out.
#[test]
fn rdmap_91_ird_exceeded_is_ddp_untagged_02() {
    let mut a = cfg(QP_A, 1024);
    a.ord = 4;
    let mut b = cfg(QP_B, 1024);
    b.ird = 2;
    let mut p = Pair::with(a, b);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 3000, 0x55_0000, Access::LOCAL_WRITE);
    for i in 0..3u64 {
        let sge = sink.sge(i as usize * 1000, 1000);
        p.a.post_send(SendWr::read(i, Some(sge), src.key, src.iova))
            .unwrap();
    }
    p.drive();
    let third = p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest)[2].to_vec();
    assert_eq!(&third[10..14], &3u32.to_be_bytes(), "MSN 3 on QN 1");
    assert_b_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&third)), None));
    assert_eq!(
        p.cq_a(),
        vec![
            flushed(0, WcOpcode::RdmaRead),
            flushed(1, WcOpcode::RdmaRead),
            wc(2, WcStatus::RemoteInvalidRequest, WcOpcode::RdmaRead, 0),
        ]
    );
    assert!(p.sent_op(Dir::BtoA, Opcode::RdmaReadResponse).is_empty());
    assert!(sink.bytes().iter().all(|&b| b == 0));
}

// ---- Send family (RDMAP-61, RDMAP-64, RDMAP-67)

/// A sends `len` octets; B has a receive buffer of `cap` octets (in a region of `cap + 50`)
/// unless `cap` is `None`.
fn send_to(p: &mut Pair, len: usize, cap: Option<usize>) -> Option<Mr> {
    let src = Mr::new(&p.ka, PD, len.max(1), 0x77_0000, Access::empty());
    src.put(0, &pattern(len, 61));
    let rb = cap.map(|cap| {
        let rb = Mr::new(&p.kb, PD, cap + 50, 0x66_0000, Access::LOCAL_WRITE);
        p.b.post_recv(RecvWr::new(100, vec![rb.sge(0, cap)]))
            .unwrap();
        rb
    });
    p.a.post_send(SendWr::send(1, vec![src.sge(0, len)]))
        .unwrap();
    p.drive();
    rb
}

/// RDMAP-61, RDMAP-10: a Send longer than the receive buffer → DDP untagged 0x05 quoting
/// the segment that overflows; the receive completes LocalLength; nothing outside the
/// buffer changes.
#[test]
fn rdmap_61_send_too_long_is_ddp_untagged_05() {
    let mut p = Pair::new(128);
    let rb = send_to(&mut p, 400, Some(250)).unwrap();
    // 110-octet segments: the third, [220, 330), overflows 250.
    let third = p.sent_op(Dir::AtoB, Opcode::Send)[2].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x05, Some(seg(&third)), None));
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::Send, 400)]);
    assert_eq!(
        p.cq_b(),
        vec![wc(100, WcStatus::LocalLength, WcOpcode::Recv, 220)]
    );
    let got = rb.bytes();
    assert!(got[..220] == pattern(220, 61)[..]);
    assert!(got[220..].iter().all(|&b| b == 0));
    rb.assert_guards_intact();
}

/// RDMAP-59, RDMAP-64: a Send with no receive posted → DDP untagged 0x02 (no buffer).
#[test]
fn rdmap_59_send_without_receive_is_ddp_untagged_02() {
    let mut p = Pair::new(1024);
    send_to(&mut p, 10, None);
    let s = p.sent_op(Dir::AtoB, Opcode::Send)[0].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&s)), None));
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::Send, 10)]);
    assert!(p.cq_b().is_empty());
}

/// A Send with Invalidate of `stag` into a posted receive; returns the receive region.
fn send_inv(p: &mut Pair, stag: Key) -> Mr {
    let src = Mr::new(&p.ka, PD, 32, 0x77_0000, Access::empty());
    src.put(0, &pattern(32, 67));
    let rb = Mr::new(&p.kb, PD, 64, 0x66_0000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(100, vec![rb.sge(0, 64)]))
        .unwrap();
    p.a.post_send(SendWr::send_with_invalidate(1, vec![src.sge(0, 32)], stag))
        .unwrap();
    p.drive();
    rb
}

/// The invalidation failed: Terminate RDMA Remote Protection 0x09 "STag cannot be
/// Invalidated", M+D, no RDMA header (`docs/spec/rdmap.md` ambiguities 3 and 4); the receive
/// completes RemoteInvalidRequest (its octets were placed, RDMAP-07).
fn assert_invalidate_refused(p: &mut Pair, rb: &Mr) {
    let s = p.sent_op(Dir::AtoB, Opcode::SendWithInvalidate)[0].to_vec();
    assert_b_terminated(p, &terminate(0, 1, 0x09, Some(seg(&s)), None));
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::Send, 32)]);
    assert_eq!(
        p.cq_b(),
        vec![wc(100, WcStatus::RemoteInvalidRequest, WcOpcode::Recv, 32)]
    );
    rb.assert_guards_intact();
}

/// RDMAP-67, RDMAP-100: Send with Invalidate of a plain (not fast-registered) region →
/// 0/1/0x09; the STag stays valid.
#[test]
fn rdmap_67_invalidate_plain_region_is_rdma_protection_09() {
    let mut p = Pair::new(1024);
    let target = Mr::new(&p.kb, PD, 4096, 0x10_0000, RW);
    let rb = send_inv(&mut p, target.key);
    assert_invalidate_refused(&mut p, &rb);
    assert_eq!(p.kb.state(target.key), KeyState::Valid);
}

/// RDMAP-106: Send with Invalidate of an STag that names nothing, or of one already
/// invalidated → 0/1/0x09.
#[test]
fn rdmap_106_invalidate_invalid_stag_is_rdma_protection_09() {
    let mut p = Pair::new(1024);
    let rb = send_inv(&mut p, Key(0x00ab_cd17));
    assert_invalidate_refused(&mut p, &rb);

    let mut p = Pair::new(1024);
    let target = Mr::fast(&p.kb, PD, 4096, 0x10_0000, RW);
    p.kb.invalidate_local(target.key, PD).unwrap();
    let rb = send_inv(&mut p, target.key);
    assert_invalidate_refused(&mut p, &rb);
}

/// RDMAP-107, RDMAP-115: Send with Invalidate of a fast-registered region of another
/// protection domain → 0/1/0x09; the STag stays valid.
#[test]
fn rdmap_107_invalidate_other_pd_is_rdma_protection_09() {
    let mut p = Pair::new(1024);
    let target = Mr::fast(&p.kb, PdId(2), 4096, 0x10_0000, RW);
    let rb = send_inv(&mut p, target.key);
    assert_invalidate_refused(&mut p, &rb);
    assert_eq!(p.kb.state(target.key), KeyState::Valid);
}

/// RDMAP-121: Send with Invalidate of a shared region → 0/1/0x09; the STag stays valid.
#[test]
fn rdmap_121_invalidate_shared_region_is_rdma_protection_09() {
    let mut p = Pair::new(1024);
    let buf = softrdma_memory::Buffer::new(4096);
    let key =
        p.kb.reg_mr_with(
            PD,
            buf,
            0,
            4096,
            0x10_0000,
            RW,
            MrFlags::FAST_REG | MrFlags::SHARED,
        )
        .unwrap();
    let rb = send_inv(&mut p, key);
    assert_invalidate_refused(&mut p, &rb);
    assert_eq!(p.kb.state(key), KeyState::Valid);
}

// ---- DDP header, versions, opcode (RDMAP-103..105, RDMAP-108)

/// A sends 10 octets into a posted receive, the first ULPDU rewritten by `f`; returns the
/// rewritten ULPDU as it crossed the wire. The segment is refused before placement: the
/// receive buffer is untouched and flushed, A's Send had completed.
fn tampered_send(p: &mut Pair, f: impl Fn(&mut Vec<u8>) + 'static) -> Vec<u8> {
    tamper_first(p, Dir::AtoB, f);
    let rb = send_to(p, 10, Some(16)).unwrap();
    assert_eq!(p.cq_a(), vec![ok(1, WcOpcode::Send, 10)]);
    assert_eq!(p.cq_b(), vec![flushed(100, WcOpcode::Recv)]);
    assert!(rb.bytes().iter().all(|&b| b == 0));
    rb.assert_guards_intact();
    p.sent(Dir::AtoB)[0].to_vec()
}

/// RDMAP-103, RFC 5041 §7.2: DDP version 2 on a tagged segment → DDP tagged 0x04.
#[test]
fn rdmap_103_ddp_version_tagged_is_ddp_tagged_04() {
    let mut p = Pair::new(1024);
    let dst = Mr::new(&p.kb, PD, 4096, 0x10_0000, RW);
    tamper_first(&mut p, Dir::AtoB, |u| u[0] = (u[0] & !0x03) | 0x02);
    let w = write_to(&mut p, dst.key, dst.iova, 64);
    assert_b_terminated(&mut p, &terminate(1, 1, 0x04, Some(seg(&w)), None));
    assert!(dst.bytes().iter().all(|&b| b == 0));
}

/// RDMAP-103: DDP version 0 on an untagged segment → DDP untagged 0x06.
#[test]
fn rdmap_103_ddp_version_untagged_is_ddp_untagged_06() {
    let mut p = Pair::new(1024);
    let s = tampered_send(&mut p, |u| u[0] &= !0x03);
    assert_b_terminated(&mut p, &terminate(1, 2, 0x06, Some(seg(&s)), None));
}

/// RDMAP-105: RV 0, 2 or 3 on an RV 1 stream → RDMA Remote Operation 0x05.
#[test]
fn rdmap_105_rdmap_version_is_rdma_operation_05() {
    for rv in [0u8, 2, 3] {
        let mut p = Pair::new(1024);
        let s = tampered_send(&mut p, move |u| u[1] = (u[1] & 0x3F) | (rv << 6));
        assert_b_terminated(&mut p, &terminate(0, 2, 0x05, Some(seg(&s)), None));
    }
}

/// RDMAP-104, RDMAP-17: reserved opcodes (0xC..0xF) → RDMA Remote Operation 0x06 (the RFC
/// 7306 ones, 0x8..0xB, are understood: see `rfc7306.rs`).
#[test]
fn rdmap_104_unexpected_opcode_is_rdma_operation_06() {
    for op in [0xCu8, 0xD, 0xE, 0xF] {
        let mut p = Pair::new(1024);
        let s = tampered_send(&mut p, move |u| u[1] = (u[1] & 0xF0) | op);
        assert_b_terminated(&mut p, &terminate(0, 2, 0x06, Some(seg(&s)), None));
    }
}

/// RDMAP-104, RDMAP-16: a Send with T = 1 → 0/2/0x06 (the header quoted as tagged).
#[test]
fn rdmap_104_send_with_tagged_flag_is_rdma_operation_06() {
    let mut p = Pair::new(1024);
    let s = tampered_send(&mut p, |u| u[0] |= 0x80);
    assert_b_terminated(&mut p, &terminate(0, 2, 0x06, Some(seg(&s)), None));
}

/// RDMAP-108: a Read Request on QN 0 → 0/2/0x06 (no RDMA header: Remote Operation,
/// Figure 10).
#[test]
fn rdmap_108_read_request_on_qn0_is_rdma_operation_06() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    tamper_first(&mut p, Dir::AtoB, |u| {
        u[6..10].copy_from_slice(&[0, 0, 0, 0])
    });
    read_from(&mut p, src.key, src.iova, 100);
    let rr = p.sent(Dir::AtoB)[0].to_vec();
    assert_b_terminated(&mut p, &terminate(0, 2, 0x06, Some(seg(&rr)), None));
    assert_eq!(
        p.cq_a(),
        vec![wc(9, WcStatus::RemoteInvalidRequest, WcOpcode::RdmaRead, 0)]
    );
}

/// RDMAP-103, EXT-DDP-05: QN 5 names no queue → DDP untagged 0x01.
#[test]
fn invalid_qn_is_ddp_untagged_01() {
    let mut p = Pair::new(1024);
    let s = tampered_send(&mut p, |u| u[9] = 5);
    assert_b_terminated(&mut p, &terminate(1, 2, 0x01, Some(seg(&s)), None));
}

/// RDMAP-64, RFC 5041 §7.2: a Send repeating an old MSN → DDP untagged 0x03 (MSN range);
/// the first Send was delivered, the second receive is flushed.
#[test]
fn rdmap_64_msn_out_of_range_is_ddp_untagged_03() {
    let mut p = Pair::new(1024);
    let src = Mr::new(&p.ka, PD, 20, 0x77_0000, Access::empty());
    let rb = Mr::new(&p.kb, PD, 20, 0x66_0000, Access::LOCAL_WRITE);
    for i in 0..2 {
        p.b.post_recv(RecvWr::new(i, vec![rb.sge(i as usize * 10, 10)]))
            .unwrap();
        p.a.post_send(SendWr::send(i, vec![src.sge(0, 10)]))
            .unwrap();
    }
    tamper_nth(&mut p, Dir::AtoB, 1, |u| u[13] = 1);
    p.drive();
    let second = p.sent(Dir::AtoB)[1].to_vec();
    assert_b_terminated(&mut p, &terminate(1, 2, 0x03, Some(seg(&second)), None));
    assert_eq!(
        p.cq_b(),
        vec![ok(0, WcOpcode::Recv, 10), flushed(1, WcOpcode::Recv)]
    );
}

/// RFC 5041 §7.2: an MSN ahead of every posted buffer → DDP untagged 0x02 (no buffer).
#[test]
fn msn_ahead_of_buffers_is_ddp_untagged_02() {
    let mut p = Pair::new(1024);
    let s = tampered_send(&mut p, |u| u[13] = 3);
    assert_b_terminated(&mut p, &terminate(1, 2, 0x02, Some(seg(&s)), None));
}

/// RDMAP-64, RFC 5041 §7.2: the first segment of a Send at MO 4 → DDP untagged 0x04.
#[test]
fn invalid_mo_is_ddp_untagged_04() {
    let mut p = Pair::new(1024);
    let s = tampered_send(&mut p, |u| u[17] = 4);
    assert_b_terminated(&mut p, &terminate(1, 2, 0x04, Some(seg(&s)), None));
}

// ---- Read Response at the Data Sink (RDMAP-54, RDMAP-56)

/// RDMAP-56, RDMAP-54: a Read Response answering no outstanding Read → 0/2/0x06.
#[test]
fn rdmap_56_read_response_without_request_is_rdma_operation_06() {
    let mut p = Pair::new(1024);
    let sink = Mr::new(&p.ka, PD, 64, 0x55_0000, RW);
    let mut u = vec![0xC1, 0x42];
    u.extend(sink.key.0.to_be_bytes());
    u.extend(sink.iova.to_be_bytes());
    u.extend([1, 2, 3, 4]);
    p.inject(Dir::BtoA, &u);
    p.drive();
    assert_a_terminated(&mut p, &terminate(0, 2, 0x06, Some((4, &u[..14])), None));
    assert!(sink.bytes().iter().all(|&b| b == 0));
    sink.assert_guards_intact();
}

/// A reads 300 octets (MULPDU 128), B's Read Response rewritten by `f` in its `n`th segment.
fn tampered_read(p: &mut Pair, n: usize, f: impl Fn(&mut Vec<u8>) + 'static) -> Mr {
    let src = read_source(p, PD, Access::REMOTE_READ);
    tamper_nth(p, Dir::BtoA, n, f);
    let (_, sink) = read_from(p, src.key, src.iova, 300);
    sink
}

/// RDMAP-56: a Read Response to another STag → DDP tagged 0x00 at the sink; the Read fails
/// with RemoteOperation.
#[test]
fn rdmap_56_read_response_wrong_stag_is_ddp_tagged_00() {
    let mut p = Pair::new(128);
    let sink = tampered_read(&mut p, 0, |u| u[5] ^= 1);
    let r = p.sent(Dir::BtoA)[0].to_vec();
    assert_a_terminated(&mut p, &terminate(1, 1, 0x00, Some(seg(&r)), None));
    assert_eq!(
        p.cq_a(),
        vec![wc(9, WcStatus::RemoteOperation, WcOpcode::RdmaRead, 0)]
    );
    assert!(sink.bytes().iter().all(|&b| b == 0));
    sink.assert_guards_intact();
}

/// RDMAP-56: a Read Response segment at the wrong TO, or longer than the Read → DDP tagged
/// 0x01.
#[test]
fn rdmap_56_read_response_wrong_to_or_length_is_ddp_tagged_01() {
    for (n, f) in [
        (
            1usize,
            Box::new(|u: &mut Vec<u8>| u[13] ^= 1) as Box<dyn Fn(&mut Vec<u8>)>,
        ),
        (2, Box::new(|u: &mut Vec<u8>| u.extend([0u8; 5]))),
    ] {
        let mut p = Pair::new(128);
        let sink = tampered_read(&mut p, n, f);
        let r = p.sent(Dir::BtoA)[n].to_vec();
        assert_a_terminated(&mut p, &terminate(1, 1, 0x01, Some(seg(&r)), None));
        assert_eq!(
            p.cq_a(),
            vec![wc(9, WcStatus::RemoteOperation, WcOpcode::RdmaRead, 0)]
        );
        sink.assert_guards_intact();
        assert!(sink.bytes()[n * 114..].iter().all(|&b| b == 0));
    }
}

/// RDMAP-99, RDMAP-98: the local source region is deregistered between post and transmit:
/// a Terminate with Local Catastrophic and no headers goes out instead of the Send, which
/// completes LocalProtection.
#[test]
fn rdmap_99_source_gone_before_transmit_sends_local_catastrophic() {
    let mut p = Pair::new(1024);
    let src = Mr::new(&p.ka, PD, 64, 0x77_0000, Access::empty());
    let rb = Mr::new(&p.kb, PD, 64, 0x66_0000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(100, vec![rb.sge(0, 64)]))
        .unwrap();
    p.a.post_send(SendWr::send(1, vec![src.sge(0, 64)]))
        .unwrap();
    p.ka.dereg_mr(src.key).unwrap();
    p.drive();
    assert_eq!(p.sent(Dir::AtoB).len(), 1);
    assert_a_terminated(&mut p, &terminate(0, 0, 0x00, None, None));
    assert_eq!(
        p.cq_a(),
        vec![wc(1, WcStatus::LocalProtection, WcOpcode::Send, 0)]
    );
    assert_eq!(p.cq_b(), vec![flushed(100, WcOpcode::Recv)]);
    rb.assert_guards_intact();
}

/// RDMAP-99: the Read sink is deregistered while its response arrives: a local error at
/// the sink (Local Catastrophic, no headers), the Read completes LocalProtection.
#[test]
fn rdmap_99_read_sink_gone_is_a_local_error() {
    let mut p = Pair::new(1024);
    let src = read_source(&p, PD, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 100, 0x55_0000, Access::LOCAL_WRITE);
    p.a.post_send(SendWr::read(9, Some(sink.sge(0, 100)), src.key, src.iova))
        .unwrap();
    p.step();
    p.ka.dereg_mr(sink.key).unwrap();
    p.drive();
    assert_a_terminated(&mut p, &terminate(0, 0, 0x00, None, None));
    assert_eq!(
        p.cq_a(),
        vec![wc(9, WcStatus::LocalProtection, WcOpcode::RdmaRead, 0)]
    );
    assert!(sink.bytes().iter().all(|&b| b == 0));
}

// ---- Terminate rules (RDMAP-69..74, RDMAP-92..94, RDMAP-102)

/// RDMAP-102, RDMAP-69, RDMAP-73: two bad Writes back to back while B is sending: one
/// Terminate, describing the first; B's half-sent Send never continues and is flushed.
#[test]
fn rdmap_102_first_error_only_and_nothing_after_terminate() {
    let mut p = Pair::new(128);
    let src = Mr::new(&p.ka, PD, 64, 0x77_0000, Access::empty());
    let (bad1, bad2) = (Key(0x00aa_aa01), Key(0x00bb_bb02));
    p.a.post_send(SendWr::write(1, vec![src.sge(0, 64)], bad1, 0))
        .unwrap();
    p.a.post_send(SendWr::write(2, vec![src.sge(0, 64)], bad2, 0))
        .unwrap();
    let bsrc = Mr::new(&p.kb, PD, 5000, 0x88_0000, Access::empty());
    let arecv = Mr::new(&p.ka, PD, 5000, 0x99_0000, Access::LOCAL_WRITE);
    p.a.post_recv(RecvWr::new(50, vec![arecv.sge(0, 5000)]))
        .unwrap();
    p.b.post_send(SendWr::send(7, vec![bsrc.sge(0, 5000)]))
        .unwrap();
    p.burst = 2;
    p.drive();
    let w1 = p.sent_op(Dir::AtoB, Opcode::RdmaWrite)[0].to_vec();
    assert_eq!(&w1[2..6], &bad1.0.to_be_bytes());
    assert_b_terminated(&mut p, &terminate(1, 1, 0x00, Some(seg(&w1)), None));
    assert_eq!(p.sent_op(Dir::BtoA, Opcode::Send).len(), 2);
    assert_eq!(p.cq_b(), vec![flushed(7, WcOpcode::Send)]);
    assert_eq!(
        p.cq_a(),
        vec![
            ok(1, WcOpcode::RdmaWrite, 64),
            ok(2, WcOpcode::RdmaWrite, 64),
            flushed(50, WcOpcode::Recv),
        ]
    );
    assert_eq!(p.b.counters().terminates_tx, 1);
    assert!(p.b.counters().dropped_rx >= 1);
    arecv.assert_guards_intact();
}

/// RDMAP-70, RDMAP-72, RDMAP-93: a received Terminate fails the Read it quotes (by its RDMA
/// header) with the mapped status and flushes what was never handed to DDP; nothing more
/// goes out (RDMAP-74).
#[test]
fn rdmap_70_72_received_terminate_fails_pending_requests() {
    let mut a = cfg(QP_A, 1024);
    a.ord = 1;
    let mut p = Pair::with(a, cfg(QP_B, 1024));
    let src = read_source(&p, PD, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 200, 0x55_0000, Access::LOCAL_WRITE);
    let rb = Mr::new(&p.kb, PD, 16, 0x66_0000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(100, vec![rb.sge(0, 16)]))
        .unwrap();
    p.a.post_send(SendWr::read(1, Some(sink.sge(0, 100)), Key(0x00dd_dd01), 0))
        .unwrap();
    p.a.post_send(SendWr::read(2, Some(sink.sge(100, 100)), src.key, src.iova))
        .unwrap();
    p.a.post_send(SendWr::send(3, vec![sink.sge(0, 4)]))
        .unwrap();
    p.drive();
    assert_eq!(
        p.sent(Dir::AtoB).len(),
        1,
        "ORD 1: only the first Read went out"
    );
    let t = *p.b.terminate_sent().unwrap();
    assert_eq!(
        t.code,
        TerminateCode::RdmaRemoteProtection(
            softrdma_wire::rdmap::RemoteProtectionError::InvalidStag
        )
    );
    assert_eq!(p.events_a(), vec![QpEvent::TerminateReceived(t)]);
    assert_eq!(
        p.cq_a(),
        vec![
            wc(1, WcStatus::RemoteAccess, WcOpcode::RdmaRead, 0),
            flushed(2, WcOpcode::RdmaRead),
            flushed(3, WcOpcode::Send),
        ]
    );
    assert_eq!(p.cq_b(), vec![flushed(100, WcOpcode::Recv)]);
    assert_eq!(p.a.poll_ulpdu(&mut Vec::new()), None);
}

/// Linux siw-terminate-bad_write.pcap frame 12 (siw's bit layout): read, surfaced with its
/// code and quoted header (RDMAP-70), and the QP dies with everything flushed.
#[test]
fn rdmap_70_siw_layout_terminate_is_understood() {
    const SIW_BAD_WRITE_TERMINATE: [u8; 38] = [
        0x41, 0x47, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x01, 0x00,
        0x00, 0x00, 0x00, 0x11, 0x00, 0x03, 0x00, 0x00, 0x40, 0xc1, 0x40, 0xba, 0xb4, 0x22, 0xff,
        0x00, 0x00, 0x55, 0xd1, 0x5e, 0x19, 0x60, 0x00,
    ];
    let mut p = Pair::new(1024);
    let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::LOCAL_WRITE);
    p.a.post_recv(RecvWr::new(1, vec![m.sge(0, 64)])).unwrap();
    p.a.post_send(SendWr::send(2, vec![m.sge(0, 8)])).unwrap();
    p.inject(Dir::BtoA, &SIW_BAD_WRITE_TERMINATE);
    let [QpEvent::TerminateReceived(t)] = p.events_a()[..] else {
        panic!("no Terminate event")
    };
    assert_eq!(t.layout, TerminateLayout::LinuxSiw);
    assert_eq!(t.code.parts(), (1, 1, 0x00));
    assert_eq!(
        t.ddp,
        Some(TerminatedDdp {
            segment_length: 0x40,
            header: ddp_of(&SIW_BAD_WRITE_TERMINATE[24..]),
        })
    );
    assert_eq!(p.a.state(), StreamState::Error);
    assert_eq!(
        p.cq_a(),
        vec![flushed(2, WcOpcode::Send), flushed(1, WcOpcode::Recv)]
    );
    assert_eq!(p.a.poll_ulpdu(&mut Vec::new()), None, "RDMAP-74");
}

/// RDMAP-71: a Terminate with an undefined Layer, or on the wrong queue, is a local error:
/// the QP dies and no Terminate is sent back; a second Terminate is ignored.
#[test]
fn rdmap_71_invalid_terminate_gets_no_terminate_back() {
    let mut bad_layer = TERM_HDR.to_vec();
    bad_layer.extend([0x30, 0x00, 0x00, 0x00]);
    let mut wrong_qn = TERM_HDR.to_vec();
    wrong_qn[9] = 0;
    wrong_qn.extend([0x20, 0x01, 0x00, 0x00]);
    for bad in [bad_layer, wrong_qn] {
        let mut p = Pair::new(1024);
        let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
        p.a.post_send(SendWr::send(2, vec![m.sge(0, 8)])).unwrap();
        p.inject(Dir::BtoA, &bad);
        assert_eq!(p.events_a(), vec![QpEvent::InvalidTerminate]);
        assert_eq!(p.a.state(), StreamState::Error);
        assert_eq!(p.a.poll_ulpdu(&mut Vec::new()), None);
        assert!(p.a.terminate_sent().is_none());
        assert_eq!(p.cq_a(), vec![flushed(2, WcOpcode::Send)]);
        // Anything after the first Terminate, valid or not, is ignored.
        let mut good = TERM_HDR.to_vec();
        good.extend([0x20, 0x01, 0x00, 0x00]);
        p.inject(Dir::BtoA, &good);
        p.inject(Dir::BtoA, &bad);
        assert!(p.events_a().is_empty());
        assert!(p.a.terminate_received().is_none());
        assert_eq!(p.a.counters().terminates_rx, 3);
    }
}

/// RDMAP-92, RDMAP-95: an MPA CRC error below → Terminate LLP / 0 / 0x02 with no headers
/// (Figure 10); the peer's outstanding Read (no DDP header to match) fails Fatal. A lost
/// connection sends nothing.
#[test]
fn rdmap_92_llp_error_sends_llp_terminate() {
    let mut p = Pair::new(1024);
    let src = Mr::new(&p.ka, PD, 100, 0x1000, Access::REMOTE_READ);
    let sink = Mr::new(&p.kb, PD, 100, 0x2000, Access::LOCAL_WRITE);
    p.b.post_send(SendWr::read(5, Some(sink.sge(0, 100)), src.key, src.iova))
        .unwrap();
    p.step();
    assert_eq!(p.a.inbound_reads(), 1);
    p.a.handle_llp_error(LlpError::CrcError);
    assert_eq!(p.a.state(), StreamState::Terminating);
    p.drive();
    let t = *p.a.terminate_sent().unwrap();
    assert_eq!(
        only_terminate(&p, Dir::AtoB),
        terminate(2, 0, 0x02, None, None)
    );
    assert_eq!(
        p.events_a(),
        vec![
            QpEvent::LlpError(LlpError::CrcError),
            QpEvent::LocalError(t)
        ]
    );
    assert_eq!(p.events_b(), vec![QpEvent::TerminateReceived(t)]);
    assert_eq!(
        p.cq_b(),
        vec![wc(5, WcStatus::Fatal, WcOpcode::RdmaRead, 0)]
    );
    assert!(p.sent_op(Dir::AtoB, Opcode::RdmaReadResponse).is_empty());

    let mut p = Pair::new(1024);
    let m = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    p.a.post_send(SendWr::send(2, vec![m.sge(0, 8)])).unwrap();
    p.a.handle_llp_error(LlpError::TcpConnectionLost);
    assert_eq!(p.a.state(), StreamState::Error);
    assert_eq!(p.a.poll_ulpdu(&mut Vec::new()), None);
    assert_eq!(p.cq_a(), vec![flushed(2, WcOpcode::Send)]);
}

/// RDMAP-94: `close` while the Terminate is queued still lets it out, then the QP is
/// Closed.
#[test]
fn rdmap_94_close_lets_the_queued_terminate_out() {
    let mut p = Pair::new(1024);
    p.a.handle_llp_error(LlpError::MarkerMismatch);
    p.a.close();
    assert_eq!(p.a.state(), StreamState::Terminating);
    p.drive();
    assert_eq!(
        only_terminate(&p, Dir::AtoB),
        terminate(2, 0, 0x03, None, None)
    );
    assert_eq!(p.a.state(), StreamState::Closed);
    assert_eq!(p.b.state(), StreamState::Error);
}

/// Figure 10 / RDMAP-34: the generator never sets R without a Read Request, and D only for
/// errors tied to a segment (table-driven over every code).
#[test]
fn rdmap_34_figure10_header_presence() {
    use super::super::term::Fault;
    let hdr = ddp_of(&TERM_HDR);
    let rr = softrdma_wire::rdmap::ReadRequestRepr::default();
    for code in TerminateCode::all() {
        let t = Fault::new(code)
            .segment(hdr, 0)
            .read_request(rr)
            .terminate();
        let fig = code.figure10();
        assert_eq!((t.m, t.d()), (fig.ddp, fig.ddp), "{code:?}");
        assert_eq!(t.r(), fig.rdma, "{code:?}");
        let bare = Fault::new(code).terminate();
        assert!(!bare.m && !bare.d() && !bare.r());
    }
}
