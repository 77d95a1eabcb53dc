//! Responder conformance tests: packets built with the wire codecs, responses parsed back.

use super::*;
use softrdma_memory::Buffer;
use softrdma_verbs_types::Sge;
use softrdma_wire::ib::{AtomicEthRepr, IethRepr, ImmDtRepr, RethRepr};

const PMTU: u32 = 256;
const QPN: u32 = 0x11;
const PEER: u32 = 0x22;

struct Env {
    r: Responder,
    keys: Arc<KeyTable>,
    buf: Arc<Buffer>,
    key: Key,
    recv_key: Key,
    recv_buf: Arc<Buffer>,
}

fn env(epsn: u32) -> Env {
    let keys = Arc::new(KeyTable::with_seed(7));
    let buf = Buffer::new(8192);
    let key = keys
        .reg_mr(
            PdId(1),
            buf.clone(),
            0,
            8192,
            0x1000,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    let recv_buf = Buffer::new(8192);
    let recv_key = keys
        .reg_fast_mr(
            PdId(1),
            recv_buf.clone(),
            0,
            8192,
            0x10_0000,
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let cfg = ResponderConfig {
        pd: PdId(1),
        qp: QpId(QPN),
        pmtu: PMTU,
        epsn,
        max_rd_atomic: 4,
        min_rnr_timer: 12,
        dest_qp: PEER,
        service: Service::Rc,
        access: Access::REMOTE,
    };
    Env {
        r: Responder::new(cfg, keys.clone()),
        keys,
        buf,
        key,
        recv_key,
        recv_buf,
    }
}

impl Env {
    fn post(&mut self, wr_id: u64, len: u32) {
        let sge = Sge::new(self.recv_key, 0x10_0000, len);
        self.r.post_recv(RecvWr::new(wr_id, vec![sge])).unwrap();
    }

    fn feed(&mut self, p: &PacketRepr<'_>) {
        // Round-trip through the wire format, as the driver would.
        let mut b = vec![0; p.buffer_len()];
        p.emit(&mut b).unwrap();
        let q = PacketRepr::parse(&b).unwrap();
        self.r.handle_packet(&q);
    }

    fn responses(&mut self) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        // Appended behind what the buffer holds: each response is its last `n` octets.
        let mut out = vec![0xA5; 3];
        while let Some(n) = self.r.poll_response(&mut out) {
            v.push(out[out.len() - n..].to_vec());
        }
        assert_eq!(out.len(), 3 + v.iter().map(Vec::len).sum::<usize>());
        v
    }

    fn completions(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.r.poll_completion()).collect()
    }

    fn mem(&self, off: usize, len: usize) -> Vec<u8> {
        self.buf.read()[off..off + len].to_vec()
    }

    fn u64_at(&self, off: usize) -> u64 {
        let mut b = [0; 8];
        self.buf.copy_out(off, &mut b).unwrap();
        u64::from_ne_bytes(b)
    }
}

fn req<'a>(op: Opcode, psn: u32, payload: &'a [u8]) -> PacketRepr<'a> {
    PacketRepr::new(BthRepr::new(op, QPN, psn), payload)
}

/// The same packet with AckReq set (what requesters put on a message's last packet).
fn acked(mut p: PacketRepr<'_>) -> PacketRepr<'_> {
    p.bth.ack_req = true;
    p
}

fn with_reth(mut p: PacketRepr<'_>, key: Key, va: u64, len: u32) -> PacketRepr<'_> {
    p.reth = Some(RethRepr {
        va,
        r_key: key.0,
        dma_len: len,
    });
    p
}

fn atomic(op: Opcode, psn: u32, key: Key, va: u64, swap_add: u64, cmp: u64) -> PacketRepr<'static> {
    let mut p = req(op, psn, &[]);
    p.atomic_eth = Some(AtomicEthRepr {
        va,
        r_key: key.0,
        swap_add_data: swap_add,
        compare_data: cmp,
    });
    p
}

/// (opcode, PSN, syndrome, MSN) of a parsed response.
fn decode(b: &[u8]) -> (Opcode, u32, Option<Syndrome>, Option<u32>) {
    let p = PacketRepr::parse(b).unwrap();
    assert_eq!(p.bth.dest_qp, PEER);
    (
        p.bth.opcode,
        p.bth.psn,
        p.aeth.map(|a| a.syndrome),
        p.aeth.map(|a| a.msn),
    )
}

fn ack(psn: u32, msn: u32) -> (Opcode, u32, Option<Syndrome>, Option<u32>) {
    (Opcode::RC_ACKNOWLEDGE, psn, Some(Syndrome::ACK), Some(msn))
}

fn nak(psn: u32, code: NakCode, msn: u32) -> (Opcode, u32, Option<Syndrome>, Option<u32>) {
    (
        Opcode::RC_ACKNOWLEDGE,
        psn,
        Some(Syndrome::Nak(code)),
        Some(msn),
    )
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// IBT-X-04 (positive), SEND First/Middle/Last into one WQE; one ACK at the Last (coalescing),
/// MSN 1.
#[test]
fn send_multi_packet_places_and_acks_once() {
    let mut e = env(100);
    e.post(7, 1000);
    let d = data(600, 1);
    e.feed(&req(Opcode::RC_SEND_FIRST, 100, &d[..256]));
    e.feed(&req(Opcode::RC_SEND_MIDDLE, 101, &d[256..512]));
    let mut last = req(Opcode::RC_SEND_LAST_WITH_IMMEDIATE, 102, &d[512..]);
    last.immdt = Some(ImmDtRepr {
        immediate_data: 0xdead_beef,
    });
    e.feed(&last);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(102, 1)]);
    let c = e.completions();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].byte_len),
        (7, WcStatus::Success, 600)
    );
    assert_eq!(c[0].imm, Some(0xdead_beef));
    assert_eq!(e.recv_buf.read()[..600], d[..]);
    assert_eq!(e.r.epsn(), 103);
}

/// AckReq on a Middle packet asks for an ACK of that PSN.
#[test]
fn ack_req_on_middle_is_acked() {
    let mut e = env(0);
    e.post(1, 1000);
    let d = data(512, 2);
    e.feed(&req(Opcode::RC_SEND_FIRST, 0, &d[..256]));
    let mut m = req(Opcode::RC_SEND_LAST, 1, &d[256..]);
    m.bth.ack_req = true;
    let r0: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert!(r0.is_empty(), "no ACK for a First without AckReq");
    e.feed(&m);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(1, 1)]);
}

/// ACK coalescing: two SEND Only without a poll in between give one ACK of the later PSN.
#[test]
fn acks_coalesce() {
    let mut e = env(5);
    e.post(1, 64);
    e.post(2, 64);
    e.feed(&req(Opcode::RC_SEND_ONLY, 5, b"one"));
    e.feed(&req(Opcode::RC_SEND_ONLY, 6, b"two"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(6, 2)]);
    assert_eq!(e.completions().len(), 2);
}

/// RNR: no receive WQE -> RNR NAK with min_rnr_timer, nothing consumed, ePSN unchanged;
/// the retry after posting succeeds.
#[test]
fn rnr_nak_without_wqe() {
    let mut e = env(9);
    e.feed(&req(Opcode::RC_SEND_ONLY, 9, b"hello"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    let timer = RnrTimer::try_from(12).unwrap();
    assert_eq!(
        r,
        vec![(
            Opcode::RC_ACKNOWLEDGE,
            9,
            Some(Syndrome::RnrNak { timer }),
            Some(0)
        )]
    );
    assert_eq!(e.r.epsn(), 9);
    assert_eq!(e.r.counters().rnr_naks, 1);
    e.post(3, 16);
    e.feed(&req(Opcode::RC_SEND_ONLY, 9, b"hello"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(9, 1)]);
    assert_eq!(&e.recv_buf.read()[..5], b"hello");
}

/// IBT-X-04: a Middle packet shorter than PMTU -> NAK Invalid Request, ePSN unchanged.
#[test]
fn ibt_x_04_short_middle_naks() {
    let mut e = env(0);
    e.post(1, 4096);
    let d = data(600, 3);
    e.feed(&req(Opcode::RC_SEND_FIRST, 0, &d[..256]));
    e.feed(&req(Opcode::RC_SEND_MIDDLE, 1, &d[256..400]));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(1, NakCode::InvalidRequest, 0)]);
    assert_eq!(e.r.epsn(), 1);
    let c = e.completions();
    assert_eq!(c[0].status, WcStatus::RemoteInvalidRequest);
    // Write First longer than PMTU, too.
    let big = data(300, 0);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_FIRST, 1, &big),
        e.key,
        0x1000,
        600,
    ));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(1, NakCode::InvalidRequest, 0)]);
}

/// A SEND longer than the WQE: NAK Invalid Request (rxe), WQE completes with LocalLength.
#[test]
fn send_too_long_for_wqe() {
    let mut e = env(0);
    e.post(4, 10);
    e.feed(&req(Opcode::RC_SEND_ONLY, 0, &data(11, 0)));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(0, NakCode::InvalidRequest, 0)]);
    let c = e.completions();
    assert_eq!((c[0].wr_id, c[0].status), (4, WcStatus::LocalLength));
}

/// Opcode sequence (C9-28 / 9.5): a Middle without a First -> NAK Invalid Request.
#[test]
fn middle_without_first_naks() {
    let mut e = env(0);
    e.feed(&req(Opcode::RC_SEND_MIDDLE, 0, &data(256, 0)));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(0, NakCode::InvalidRequest, 0)]);
}

/// SEND with Invalidate: the key is invalidated and reported.
#[test]
fn send_with_invalidate() {
    let mut e = env(0);
    e.post(1, 64);
    let inv = e
        .keys
        .reg_fast_mr(PdId(1), Buffer::new(4096), 0, 4096, 0, Access::LOCAL_WRITE)
        .unwrap();
    let mut p = req(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 0, b"x");
    p.ieth = Some(IethRepr { r_key: inv.0 });
    e.feed(&p);
    let c = e.completions();
    assert_eq!(c[0].invalidated_key, Some(inv));
    assert!(
        e.keys
            .check_local(inv, PdId(1), Access::empty(), 0, 1)
            .is_err()
    );
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(0, 1)]);
}

/// RDMA WRITE First/Middle/Last with immediate: placed, one WQE consumed, byte_len = DMALen.
#[test]
fn write_multi_with_immediate() {
    let mut e = env(50);
    e.post(9, 0);
    let d = data(700, 5);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_FIRST, 50, &d[..256]),
        e.key,
        0x1100,
        700,
    ));
    e.feed(&req(Opcode::RC_RDMA_WRITE_MIDDLE, 51, &d[256..512]));
    let mut last = req(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 52, &d[512..]);
    last.immdt = Some(ImmDtRepr { immediate_data: 42 });
    e.feed(&last);
    assert_eq!(e.mem(0x100, 700), d);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(52, 1)]);
    let c = e.completions();
    assert_eq!(c[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!((c[0].wr_id, c[0].byte_len, c[0].imm), (9, 700, Some(42)));
}

/// WRITE with a bad R_Key / out of bounds -> NAK Remote Access Error, nothing written.
#[test]
fn write_remote_access_error() {
    let mut e = env(0);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 0, b"abcd"),
        Key(e.key.0 ^ 0x55),
        0x1000,
        4,
    ));
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 0, b"abcd"),
        e.key,
        0x1000 + 8190,
        4,
    ));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(
        r,
        vec![
            nak(0, NakCode::RemoteAccessError, 0),
            nak(0, NakCode::RemoteAccessError, 0)
        ]
    );
    assert_eq!(e.mem(0, 4), vec![0; 4]);
    assert_eq!(e.r.epsn(), 0);
}

/// EXT-PSN-02: READ 700 @ 256 at PSN 10 -> First/Middle/Last at 10, 11, 12 with AETH on
/// First and Last; ePSN 13.
#[test]
fn ext_psn_02_read_multi_packet() {
    let mut e = env(10);
    let d = data(700, 9);
    e.buf.copy_in(0x200, &d).unwrap();
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 10, &[]),
        e.key,
        0x1200,
        700,
    ));
    assert_eq!(e.r.epsn(), 13);
    let rs = e.responses();
    let r: Vec<_> = rs.iter().map(|b| decode(b)).collect();
    assert_eq!(
        r,
        vec![
            (
                Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                10,
                Some(Syndrome::ACK),
                Some(1)
            ),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 11, None, None),
            (
                Opcode::RC_RDMA_READ_RESPONSE_LAST,
                12,
                Some(Syndrome::ACK),
                Some(1)
            ),
        ]
    );
    let got: Vec<u8> = rs
        .iter()
        .flat_map(|b| PacketRepr::parse(b).unwrap().payload.to_vec())
        .collect();
    assert_eq!(got, d);
}

/// IBT-X-09: a zero-length READ -> one READ Response Only with AETH and no payload.
#[test]
fn ibt_x_09_zero_length_read() {
    let mut e = env(3);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 3, &[]),
        Key(0),
        0,
        0,
    ));
    let rs = e.responses();
    assert_eq!(rs.len(), 1);
    let p = PacketRepr::parse(&rs[0]).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!((p.bth.psn, p.payload.len()), (3, 0));
    assert_eq!(p.aeth.map(|a| a.syndrome), Some(Syndrome::ACK));
    assert_eq!(e.r.epsn(), 4);
}

/// EXT-PSN-03: a duplicate READ for the tail sub-range regenerates only those responses.
#[test]
fn ext_psn_03_duplicate_read_subrange() {
    let mut e = env(10);
    let d = data(700, 4);
    e.buf.copy_in(0, &d).unwrap();
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 10, &[]),
        e.key,
        0x1000,
        700,
    ));
    e.responses();
    // Requester lost PSN 11 onwards: re-issues READ for [256, 700) at PSN 11.
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 11, &[]),
        e.key,
        0x1000 + 256,
        444,
    ));
    let rs = e.responses();
    let r: Vec<_> = rs.iter().map(|b| decode(b)).collect();
    assert_eq!(
        r,
        vec![
            (
                Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                11,
                Some(Syndrome::ACK),
                Some(1)
            ),
            (
                Opcode::RC_RDMA_READ_RESPONSE_LAST,
                12,
                Some(Syndrome::ACK),
                Some(1)
            ),
        ]
    );
    assert_eq!(PacketRepr::parse(&rs[1]).unwrap().payload, &d[512..]);
    assert_eq!(e.r.epsn(), 13);
    assert_eq!(e.r.msn(), 1);
}

/// A duplicate READ from PSN k while the original's responses are still queued: the queued
/// tail from k on is dropped, so the responses the requester asks for come next, in sequence.
#[test]
fn duplicate_read_replaces_the_queued_tail() {
    let mut e = env(10);
    let d = data(256 * 8, 6);
    e.buf.copy_in(0, &d).unwrap();
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 10, &[]),
        e.key,
        0x1000,
        256 * 8,
    ));
    // Two of the eight responses leave, then the requester goes back to PSN 12.
    let mut out = Vec::new();
    for _ in 0..2 {
        out.clear();
        e.r.poll_response(&mut out).unwrap();
    }
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 12, &[]),
        e.key,
        0x1000 + 512,
        256 * 6,
    ));
    let rs = e.responses();
    let psns: Vec<u32> = rs.iter().map(|b| decode(b).1).collect();
    assert_eq!(psns, (12..18).collect::<Vec<_>>());
    assert_eq!(PacketRepr::parse(&rs[0]).unwrap().payload, &d[512..768]);
    assert_eq!(e.r.counters().duplicates, 1);
}

/// max_rd_atomic: more queued READs than the limit -> NAK Invalid Request.
#[test]
fn read_limit_naks() {
    let mut e = env(0);
    for i in 0..5u32 {
        e.feed(&with_reth(
            req(Opcode::RC_RDMA_READ_REQUEST, i, &[]),
            e.key,
            0x1000,
            8,
        ));
    }
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r.len(), 5);
    assert_eq!(r[4], nak(4, NakCode::InvalidRequest, 4));
    assert_eq!(e.r.epsn(), 4);
}

/// IBT-X-12: FetchAdd wraps (carry discarded) and returns the old value; CmpSwap miss leaves
/// memory unchanged; an unaligned VA -> NAK Invalid Request.
#[test]
fn ibt_x_12_atomics() {
    let mut e = env(0);
    e.buf.copy_in(8, &u64::MAX.to_ne_bytes()).unwrap();
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 0, e.key, 0x1008, 2, 0));
    e.feed(&atomic(Opcode::RC_COMPARE_SWAP, 1, e.key, 0x1008, 99, 5));
    e.feed(&atomic(Opcode::RC_COMPARE_SWAP, 2, e.key, 0x1008, 99, 1));
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 3, e.key, 0x1004, 1, 0));
    let rs = e.responses();
    let origs: Vec<_> = rs
        .iter()
        .map(|b| {
            let p = PacketRepr::parse(b).unwrap();
            (
                p.bth.opcode,
                p.bth.psn,
                p.atomic_ack_eth.map(|a| a.orig_remote_data),
            )
        })
        .collect();
    let aa = Opcode::RC_ATOMIC_ACKNOWLEDGE;
    assert_eq!(
        origs,
        vec![
            (aa, 0, Some(u64::MAX)),
            (aa, 1, Some(1)),
            (aa, 2, Some(1)),
            (Opcode::RC_ACKNOWLEDGE, 3, None)
        ]
    );
    assert_eq!(decode(&rs[3]), nak(3, NakCode::InvalidRequest, 3));
    assert_eq!(e.u64_at(8), 99);
    // Big-endian on the wire: the AtomicAckETH octets are the value's BE bytes.
    let p = PacketRepr::parse(&rs[0]).unwrap();
    assert_eq!(
        &rs[0][p.header_len() - 8..p.header_len()],
        &u64::MAX.to_be_bytes()
    );
}

/// IBT-X-13, IBT-X-15: a duplicate FetchAdd is answered from the saved result, even after
/// memory changed, and does not add twice.
#[test]
fn ibt_x_13_x_15_atomic_replay_once() {
    let mut e = env(20);
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 20, e.key, 0x1010, 5, 0));
    e.responses();
    assert_eq!(e.u64_at(0x10), 5);
    // Memory changes by another operation (WRITE at PSN 21).
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 21, &100u64.to_ne_bytes()),
        e.key,
        0x1010,
        8,
    ));
    e.responses();
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 20, e.key, 0x1010, 5, 0));
    let rs = e.responses();
    let p = PacketRepr::parse(&rs[0]).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(p.bth.psn, 20);
    assert_eq!(p.atomic_ack_eth.unwrap().orig_remote_data, 0);
    assert_eq!(e.u64_at(0x10), 100, "not executed again");
    assert_eq!(e.r.counters().duplicates, 1);
}

/// IBT-X-14: a duplicate ATOMIC whose PSN matches no saved one (or another opcode) is dropped;
/// the R_Key is not re-checked on replay.
#[test]
fn ibt_x_14_replay_mismatch_dropped() {
    let mut e = env(30);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 30, b"zzzzzzzz"),
        e.key,
        0x1000,
        8,
    ));
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 31, e.key, 0x1018, 1, 0));
    e.responses();
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 30, e.key, 0x1018, 1, 0));
    e.feed(&atomic(Opcode::RC_COMPARE_SWAP, 31, e.key, 0x1018, 1, 0));
    assert!(e.responses().is_empty());
    assert_eq!(e.r.counters().duplicate_unmatched, 2);
    // Replay with a garbage R_Key still answers (no re-check).
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 31, Key(0xdead), 0x7, 1, 0));
    assert_eq!(e.responses().len(), 1);
    assert_eq!(e.u64_at(0x18), 1);
}

/// IBT-X-16: bounds failure -> NAK Remote Access Error, nothing saved; after a registration
/// covering the address the same PSN succeeds.
#[test]
fn ibt_x_16_atomic_access_error_then_success() {
    let mut e = env(40);
    let buf2 = Buffer::new(4096);
    let k2 = e
        .keys
        .reg_mr(
            PdId(1),
            buf2.clone(),
            0,
            8,
            0x9000,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 40, k2, 0x9008, 1, 0));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(40, NakCode::RemoteAccessError, 0)]);
    assert_eq!(e.r.epsn(), 40);
    let k3 = e
        .keys
        .reg_mr(
            PdId(1),
            buf2.clone(),
            0,
            16,
            0x9000,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 40, k3, 0x9008, 1, 0));
    let rs = e.responses();
    assert_eq!(decode(&rs[0]).0, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(e.r.epsn(), 41);
    let mut b = [0; 8];
    buf2.copy_out(8, &mut b).unwrap();
    assert_eq!(u64::from_ne_bytes(b), 1);
}

/// EXT-PSN-03: ahead of ePSN -> exactly one NAK PSN Sequence Error carrying ePSN, further
/// ahead packets silently dropped, then ePSN processed normally.
#[test]
fn ext_psn_03_sequence_error_once() {
    let mut e = env(0);
    e.post(1, 64);
    e.post(2, 64);
    e.feed(&req(Opcode::RC_SEND_ONLY, 2, b"late"));
    e.feed(&req(Opcode::RC_SEND_ONLY, 3, b"later"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(0, NakCode::PsnSequenceError, 0)]);
    assert_eq!(e.r.counters().out_of_sequence, 1);
    assert!(e.completions().is_empty());
    e.feed(&req(Opcode::RC_SEND_ONLY, 0, b"first"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(0, 1)]);
    // A new gap gets a new NAK.
    e.feed(&req(Opcode::RC_SEND_ONLY, 5, b"x"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(1, NakCode::PsnSequenceError, 1)]);
}

/// EXT-PSN-03: duplicate SEND and WRITE are re-ACKed (ePSN - 1) without re-executing or
/// consuming a WQE — when AckReq asks, as for a new request (C9-105); a duplicate without
/// AckReq (the First/Middle of a message being resent) gets no ACK of its own.
#[test]
fn ext_psn_03_duplicate_send_write_reacked() {
    let mut e = env(7);
    e.post(1, 64);
    e.post(2, 64);
    e.feed(&req(Opcode::RC_SEND_ONLY, 7, b"aaaa"));
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 8, b"bbbb"),
        e.key,
        0x1000,
        4,
    ));
    e.responses();
    e.completions();
    e.buf.copy_in(0, b"cccc").unwrap();
    e.feed(&req(Opcode::RC_SEND_ONLY, 7, b"aaaa"));
    assert!(e.responses().is_empty(), "no AckReq, no ACK");
    e.feed(&acked(req(Opcode::RC_SEND_ONLY, 7, b"aaaa")));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(8, 2)]);
    e.feed(&acked(with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 8, b"bbbb"),
        e.key,
        0x1000,
        4,
    )));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(8, 2)]);
    assert_eq!(e.mem(0, 4), b"cccc", "duplicate WRITE not re-executed");
    assert!(e.completions().is_empty(), "no WQE consumed");
    assert_eq!(e.r.epsn(), 9);
}

/// EXT-PSN-01: PSNs wrap at 0xFFFFFF; a READ straddling the wrap and ePSN after it.
#[test]
fn ext_psn_01_wrap() {
    let mut e = env(0xFF_FFFE);
    e.post(1, 64);
    e.feed(&req(Opcode::RC_SEND_ONLY, 0xFF_FFFE, b"a"));
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_READ_REQUEST, 0xFF_FFFF, &[]),
        e.key,
        0x1000,
        300,
    ));
    assert_eq!(e.r.epsn(), 1);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r[0], ack(0xFF_FFFE, 1));
    assert_eq!((r[1].1, r[2].1), (0xFF_FFFF, 0));
    // 0xFFFFFE is now a duplicate, not ahead: re-ACKed, up to the PSN before the READ that
    // came after it (not ePSN - 1 = 0, the READ's last PSN, which would say it is done).
    e.feed(&acked(req(Opcode::RC_SEND_ONLY, 0xFF_FFFE, b"a")));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(0xFF_FFFE, 1)]);
}

/// IBT-X-18: a request with an opcode invalid for RC is silently dropped: no response, no
/// WQE consumed, ePSN unchanged, the next valid packet accepted.
#[test]
fn ibt_x_18_silent_drop() {
    let mut e = env(0);
    e.post(1, 64);
    e.feed(&req(Opcode::UC_SEND_ONLY, 0, b"uc"));
    e.feed(&req(Opcode::RC_ACKNOWLEDGE, 0, &[]).tap_aeth());
    assert!(e.responses().is_empty());
    assert_eq!(e.r.counters().bad_opcode, 2);
    assert_eq!(e.r.epsn(), 0);
    e.feed(&req(Opcode::RC_SEND_ONLY, 0, b"rc"));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(0, 1)]);
    assert_eq!(e.completions()[0].wr_id, 1);
}

trait TapAeth {
    fn tap_aeth(self) -> Self;
}

impl TapAeth for PacketRepr<'_> {
    fn tap_aeth(mut self) -> Self {
        self.aeth = Some(aeth(Syndrome::ACK, 0));
        self
    }
}

/// IBT-C9-28: interleaved WRITE / SEND / ATOMIC to overlapping memory execute in PSN order;
/// responses come in PSN order.
#[test]
fn ibt_c9_28_in_order_execution() {
    let mut e = env(0);
    e.post(1, 64);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY, 0, &10u64.to_ne_bytes()),
        e.key,
        0x1000,
        8,
    ));
    e.feed(&atomic(Opcode::RC_FETCH_ADD, 1, e.key, 0x1000, 3, 0));
    e.feed(&req(Opcode::RC_SEND_ONLY, 2, b"s"));
    e.feed(&atomic(Opcode::RC_COMPARE_SWAP, 3, e.key, 0x1000, 77, 13));
    let rs = e.responses();
    let r: Vec<_> = rs.iter().map(|b| decode(b)).collect();
    assert_eq!(
        r.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
        vec![
            (Opcode::RC_ACKNOWLEDGE, 0),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 1),
            (Opcode::RC_ACKNOWLEDGE, 2),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 3),
        ]
    );
    let orig = |i: usize| {
        PacketRepr::parse(&rs[i])
            .unwrap()
            .atomic_ack_eth
            .unwrap()
            .orig_remote_data
    };
    assert_eq!((orig(1), orig(3)), (10, 13));
    assert_eq!(e.u64_at(0), 77);
    assert_eq!(r[3].3, Some(4));
}

/// A responder of `service` taking its receives from a fresh SRQ of the same domain.
fn srq_env(epsn: u32, service: Service) -> (Env, Arc<SharedRecvQueue>) {
    let mut e = env(epsn);
    let srq = Arc::new(SharedRecvQueue::new(PdId(1), 64, 4));
    let cfg = ResponderConfig {
        service,
        ..*e.r.config()
    };
    e.r = Responder::with_srq(cfg, e.keys.clone(), srq.clone());
    (e, srq)
}

impl Env {
    /// Posts `len` octets at `off` of the receive buffer to `srq` as `wr_id`.
    fn post_srq(&self, srq: &SharedRecvQueue, wr_id: u64, off: u64, len: u32) {
        let sge = Sge::new(self.recv_key, 0x10_0000 + off, len);
        srq.post_recv(RecvWr::new(wr_id, vec![sge]), &self.keys)
            .unwrap();
    }
}

fn ids(c: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// With an SRQ: `post_recv` is refused; a SEND First takes one WQE and keeps it for the whole
/// message; a duplicate First (retransmitted after the Middle was lost) takes none (§13.5
/// duplicate region before resources); the Last completes the WQE taken at First.
#[test]
fn srq_send_takes_one_wqe_at_first_duplicates_take_none() {
    let (mut e, srq) = srq_env(50, Service::Rc);
    assert_eq!(
        e.r.post_recv(RecvWr::new(1, vec![])),
        Err(PostError::SrqAttached)
    );
    assert!(e.r.srq().is_some());
    e.post_srq(&srq, 10, 0, 1000);
    e.post_srq(&srq, 11, 1000, 1000);
    let d = data(600, 9);
    e.feed(&req(Opcode::RC_SEND_FIRST, 50, &d[..256]));
    assert_eq!((srq.len(), e.r.rq_len()), (1, 1));
    // Go-back-N retransmission of the First: duplicate, nothing taken.
    e.feed(&acked(req(Opcode::RC_SEND_FIRST, 50, &d[..256])));
    assert_eq!(srq.len(), 1);
    e.feed(&req(Opcode::RC_SEND_MIDDLE, 51, &d[256..512]));
    e.feed(&req(Opcode::RC_SEND_MIDDLE, 51, &d[256..512]));
    e.feed(&req(Opcode::RC_SEND_LAST, 52, &d[512..]));
    assert_eq!((srq.len(), e.r.rq_len()), (1, 0));
    let c = e.completions();
    assert_eq!(ids(&c), vec![(10, WcStatus::Success)]);
    assert_eq!(c[0].byte_len, 600);
    assert_eq!(e.recv_buf.read()[..600], d[..]);
    assert_eq!(e.r.counters().duplicates, 2);
}

/// With an SRQ, an empty SRQ is an empty RQ: RNR NAK, nothing consumed, ePSN unchanged;
/// WRITE with immediate Only and Last too. The retry after posting to the SRQ succeeds.
#[test]
fn srq_empty_rnr_naks_then_succeeds() {
    let (mut e, srq) = srq_env(7, Service::Rc);
    e.feed(&req(Opcode::RC_SEND_ONLY, 7, b"hi"));
    let mut wimm = with_reth(
        req(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 7, b"w"),
        e.key,
        0x1000,
        1,
    );
    wimm.immdt = Some(ImmDtRepr { immediate_data: 5 });
    e.feed(&wimm);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    let rnr = Some(Syndrome::RnrNak {
        timer: RnrTimer::try_from(12).unwrap(),
    });
    assert_eq!(r, vec![(Opcode::RC_ACKNOWLEDGE, 7, rnr, Some(0)); 2]);
    assert_eq!((e.r.epsn(), e.r.counters().rnr_naks), (7, 2));
    e.post_srq(&srq, 1, 0, 16);
    e.feed(&req(Opcode::RC_SEND_ONLY, 7, b"hi"));
    // Multi-packet WRITE with immediate: the Last needs the WQE.
    let d = data(300, 4);
    e.feed(&with_reth(
        req(Opcode::RC_RDMA_WRITE_FIRST, 8, &d[..256]),
        e.key,
        0x1000,
        300,
    ));
    let mut last = req(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 9, &d[256..]);
    last.immdt = Some(ImmDtRepr { immediate_data: 6 });
    e.feed(&last);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(
        r,
        vec![ack(7, 1), (Opcode::RC_ACKNOWLEDGE, 9, rnr, Some(1))]
    );
    e.post_srq(&srq, 2, 16, 16);
    e.feed(&last);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![ack(9, 2)]);
    let c = e.completions();
    assert_eq!(
        c.iter()
            .map(|w| (w.wr_id, w.opcode, w.imm))
            .collect::<Vec<_>>(),
        vec![
            (1, WcOpcode::Recv, None),
            (2, WcOpcode::RecvRdmaWithImm, Some(6))
        ]
    );
    assert_eq!(e.mem(0, 300), d);
}

/// A WQE taken from an SRQ always completes on the QP that took it: an RDMA WRITE with
/// immediate refused after taking it (bad R_Key) completes it with `RemoteAccess` (rxe class
/// C); the own queue keeps its WQE (not consumed).
#[test]
fn srq_refused_write_with_imm_completes_its_wqe() {
    let bad = |e: &Env| {
        let mut p = with_reth(
            req(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0, b"x"),
            e.key,
            0x1000 + 8192,
            1,
        );
        p.immdt = Some(ImmDtRepr { immediate_data: 1 });
        p
    };
    let (mut e, srq) = srq_env(0, Service::Rc);
    e.post_srq(&srq, 3, 0, 16);
    let p = bad(&e);
    e.feed(&p);
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(0, NakCode::RemoteAccessError, 0)]);
    assert_eq!(ids(&e.completions()), vec![(3, WcStatus::RemoteAccess)]);
    assert!(srq.is_empty());

    let mut own = env(0);
    own.post(3, 16);
    let p = bad(&own);
    own.feed(&p);
    assert!(own.completions().is_empty());
    assert_eq!(own.r.rq_len(), 1);
}

/// A NAK that abandons a SEND in progress (First inside a message, C9-28) completes the WQE
/// it held with `RemoteInvalidRequest` instead of losing it, own queue and SRQ alike.
#[test]
fn nak_mid_send_completes_its_wqe() {
    let d = data(256, 1);
    let mut e = env(0);
    e.post(1, 1024);
    e.post(2, 1024);
    e.feed(&req(Opcode::RC_SEND_FIRST, 0, &d));
    e.feed(&req(Opcode::RC_SEND_FIRST, 1, &d));
    let r: Vec<_> = e.responses().iter().map(|b| decode(b)).collect();
    assert_eq!(r, vec![nak(1, NakCode::InvalidRequest, 0)]);
    assert_eq!(
        ids(&e.completions()),
        vec![(1, WcStatus::RemoteInvalidRequest)]
    );
    assert_eq!(e.r.rq_len(), 1);

    let (mut e, srq) = srq_env(0, Service::Rc);
    e.post_srq(&srq, 1, 0, 1024);
    e.post_srq(&srq, 2, 1024, 1024);
    e.feed(&req(Opcode::RC_SEND_FIRST, 0, &d));
    e.feed(&req(Opcode::RC_SEND_FIRST, 1, &d));
    assert_eq!(
        ids(&e.completions()),
        vec![(1, WcStatus::RemoteInvalidRequest)]
    );
    assert_eq!(srq.len(), 1);
}

/// UC over an SRQ: a message abandoned after a lost packet cannot give its WQE back (IBA
/// responder error class E, rxe `do_class_d1e_error`): it completes `RemoteInvalidRequest`
/// on this QP and the next message takes the next WQE. An empty SRQ drops the message.
#[test]
fn srq_uc_abandoned_message_completes_class_e() {
    let (mut e, srq) = srq_env(0, Service::Uc);
    e.post_srq(&srq, 1, 0, 1024);
    e.post_srq(&srq, 2, 1024, 1024);
    let d = data(512, 3);
    e.feed(&req(Opcode::UC_SEND_FIRST, 0, &d[..256]));
    // PSN 1 (Last) lost; the next message starts at 2.
    e.feed(&req(Opcode::UC_SEND_ONLY, 2, b"next"));
    let c = e.completions();
    assert_eq!(
        ids(&c),
        vec![(1, WcStatus::RemoteInvalidRequest), (2, WcStatus::Success)]
    );
    assert_eq!(c[1].byte_len, 4);
    assert!(e.responses().is_empty());
    // Empty SRQ: the message is dropped, its Last too.
    e.feed(&req(Opcode::UC_SEND_FIRST, 3, &d[..256]));
    e.feed(&req(Opcode::UC_SEND_LAST, 4, &d[256..]));
    assert!(e.completions().is_empty());
    assert_eq!(e.r.counters().uc_dropped, 1);
}

/// Error state with an SRQ: the WQE in progress completes flushed on this QP; the SRQ's WQEs
/// are not flushed (IBA 10.3.1, rxe `flush_recv_queue`).
#[test]
fn srq_flush_completes_only_the_wqe_in_progress() {
    let (mut e, srq) = srq_env(0, Service::Rc);
    for id in 1..=3 {
        e.post_srq(&srq, id, 1024 * id, 1024);
    }
    e.feed(&req(Opcode::RC_SEND_FIRST, 0, &data(256, 0)));
    e.r.flush();
    assert_eq!(
        ids(&e.completions()),
        vec![(1, WcStatus::WorkRequestFlushed)]
    );
    assert_eq!((srq.len(), e.r.rq_len()), (2, 0));
    e.r.flush();
    assert!(e.completions().is_empty());
}

/// UD over an SRQ: one WQE per datagram (GRH ahead of the payload); none -> dropped, counted.
#[test]
fn srq_ud_datagrams() {
    let (mut e, srq) = srq_env(0, Service::Ud);
    e.post_srq(&srq, 9, 0, 100);
    let grh = [0xEE; 40];
    let mut p = PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, QPN, 0), b"datagram");
    p.deth = Some(softrdma_wire::ib::DethRepr {
        q_key: 1,
        src_qp: 0x33,
        ..Default::default()
    });
    e.r.handle_datagram(&p, &grh);
    e.r.handle_datagram(&p, &grh);
    let c = e.completions();
    assert_eq!(ids(&c), vec![(9, WcStatus::Success)]);
    assert_eq!((c[0].byte_len, c[0].src_qp), (48, Some(0x33)));
    assert_eq!(&e.recv_buf.read()[40..48], b"datagram");
    assert_eq!(e.r.counters().no_wqe, 1);
}
