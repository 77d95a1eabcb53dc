//! Two connections over a simulated byte stream that TCP may cut anywhere:
//! every split (1-octet reads, random splits), CRC on and off, Markers on and
//! off, rev 1 and 2, P2P RTR (issue 3, Done-when 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId, QpId};

use super::*;
use crate::startup::RtrSet;
use crate::verbs_types::{RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

const PD: PdId = PdId(1);
const IOVA: u64 = 0x7f00_0000_1000;

struct Side {
    conn: Connection,
    keys: Arc<KeyTable>,
    buf: Arc<Buffer>,
    key: Key,
    /// Octets in flight towards this side.
    inbound: Vec<u8>,
    completions: Vec<WorkCompletion>,
    established: bool,
}

#[derive(Clone, Copy, Debug)]
struct Knobs {
    rev: u8,
    crc_i: bool,
    crc_r: bool,
    markers_i: bool,
    markers_r: bool,
    p2p: bool,
    emss: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            rev: 2,
            crc_i: true,
            crc_r: false,
            markers_i: false,
            markers_r: false,
            p2p: false,
            emss: 1460,
        }
    }
}

fn side(role: Role, k: &Knobs, qp: u32, len: usize, now: Instant) -> Side {
    let keys = Arc::new(KeyTable::with_seed(u64::from(qp)));
    let buf = Buffer::new(len);
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let key = keys.reg_mr(PD, buf.clone(), 0, len, IOVA, access).unwrap();
    let initiator = role == Role::Initiator;
    let startup = StartupConfig {
        rev: k.rev,
        crc: if initiator { k.crc_i } else { k.crc_r },
        markers: if initiator { k.markers_i } else { k.markers_r },
        ird: 4,
        ord: 4,
        p2p: k.p2p.then_some(RtrSet::only(Rtr::ZeroLengthWrite)),
        private_data: if initiator {
            b"hello".to_vec()
        } else {
            Vec::new()
        },
        timeout: Duration::from_secs(5),
        allow_early_fpdus: true,
    };
    let mut qpc = QpConfig::new(PD, QpId(qp));
    qpc.sq_depth = 1024;
    qpc.rq_depth = 1024;
    let cfg = ConnectionConfig {
        role,
        startup,
        qp: qpc,
        emss: k.emss,
        fpdu: FpduSizing::PathMss,
    };
    Side {
        conn: Connection::new(cfg, keys.clone(), now).unwrap(),
        keys,
        buf,
        key,
        inbound: Vec::new(),
        completions: Vec::new(),
        established: false,
    }
}

/// Move octets both ways until nothing moves; `cut` says how many of the
/// octets in flight the next read returns.
fn drive(a: &mut Side, b: &mut Side, cut: &mut dyn FnMut(usize) -> usize, now: Instant) {
    for _ in 0..1_000_000 {
        let mut moved = transfer(a, b, cut, now);
        moved |= transfer(b, a, cut, now);
        for s in [&mut *a, &mut *b] {
            while let Some(wc) = s.conn.engine_mut().poll_completion() {
                s.completions.push(wc);
                moved = true;
            }
        }
        if !moved && !a.conn.wants_transmit() && !b.conn.wants_transmit() {
            return;
        }
    }
    panic!("no quiescence");
}

/// `from` transmits; `to` reads what arrived, `cut` octets at a time.
fn transfer(
    from: &mut Side,
    to: &mut Side,
    cut: &mut dyn FnMut(usize) -> usize,
    now: Instant,
) -> bool {
    let mut out = Vec::new();
    from.conn.poll_transmit(&mut out);
    to.inbound.extend_from_slice(&out);
    let mut moved = false;
    while !to.inbound.is_empty() {
        let n = cut(to.inbound.len()).clamp(1, to.inbound.len());
        let chunk: Vec<u8> = to.inbound.drain(..n).collect();
        to.conn.handle_input(now, &chunk);
        moved = true;
        events(to);
    }
    events(from);
    moved
}

fn events(s: &mut Side) {
    while let Some(e) = s.conn.poll_event() {
        match e {
            ConnEvent::ConnectRequest { private_data, .. } => {
                assert_eq!(private_data, b"hello");
                s.conn.accept(b"welcome", 4, 4).unwrap();
            }
            ConnEvent::Established { .. } => s.established = true,
            other => panic!("unexpected event {other:?}"),
        }
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// One full exchange: Sends both ways, a Write, a Read, with sizes that
/// cross FPDU and marker boundaries; every byte and completion checked.
fn exchange(k: Knobs, cut: &mut dyn FnMut(usize) -> usize) {
    const LEN: usize = 192 * 1024;
    let now = Instant::now();
    let mut i = side(Role::Initiator, &k, 10, LEN, now);
    let mut r = side(Role::Responder, &k, 20, LEN, now);
    let sizes = [0usize, 1, 4095, 4096, 20_000];
    // Receives posted before the connection exists, at unaligned offsets.
    for (n, &sz) in sizes.iter().enumerate() {
        let off = 3 + n as u64 * 21_000;
        r.conn
            .engine_mut()
            .post_recv(RecvWr::new(
                n as u64,
                vec![Sge::new(r.key, IOVA + off, sz.max(1) as u32)],
            ))
            .unwrap();
    }
    // Initiator data: sends from an unaligned region, then a Write and a Read.
    let data = pattern(7, LEN);
    i.buf.copy_in(0, &data).unwrap();
    for (n, &sz) in sizes.iter().enumerate() {
        let off = 1 + n as u64 * 9_001;
        let wr = SendWr::send(100 + n as u64, vec![Sge::new(i.key, IOVA + off, sz as u32)]);
        i.conn.engine_mut().post_send(wr).unwrap();
    }
    let wlen = 30_000u32;
    let wr = SendWr::write(
        200,
        vec![Sge::new(i.key, IOVA + 5, wlen)],
        r.key,
        IOVA + 110_001,
    );
    i.conn.engine_mut().post_send(wr).unwrap();
    let remote = pattern(9, 10_000);
    r.buf.copy_in(150_000, &remote).unwrap();
    let rd = SendWr::read(
        300,
        Some(Sge::new(i.key, IOVA + 70_001, 10_000)),
        r.key,
        IOVA + 150_000,
    );
    i.conn.engine_mut().post_send(rd).unwrap();

    drive(&mut i, &mut r, cut, now);
    assert!(i.established && r.established, "{k:?}");
    let n = i.conn.negotiated().unwrap();
    assert_eq!(n.crc, k.crc_i || k.crc_r, "MPA-57");
    assert_eq!(n.markers_tx, k.markers_r, "MPA-56");
    assert_eq!(n.peer_private_data, b"welcome");

    // Receiver: each Send landed in its own WQE, in order, byte for byte.
    let recvs: Vec<_> = r
        .completions
        .iter()
        .filter(|c| c.opcode == WcOpcode::Recv)
        .collect();
    assert_eq!(recvs.len(), sizes.len(), "{k:?}");
    for (n, (wc, &sz)) in recvs.iter().zip(&sizes).enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (n as u64, WcStatus::Success, sz)
        );
        let src = 1 + n * 9_001;
        let dst = 3 + n * 21_000;
        let mut got = vec![0u8; sz];
        r.buf.copy_out(dst, &mut got).unwrap();
        assert_eq!(got, data[src..src + sz], "send {n} {k:?}");
    }
    let mut got = vec![0u8; wlen as usize];
    r.buf.copy_out(110_001, &mut got).unwrap();
    assert_eq!(got, data[5..5 + wlen as usize], "write {k:?}");
    let mut got = vec![0u8; remote.len()];
    i.buf.copy_out(70_001, &mut got).unwrap();
    assert_eq!(got, remote, "read {k:?}");
    // Initiator completions: all successful, in submission order (RDMAP-81).
    let ids: Vec<u64> = i.completions.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![100, 101, 102, 103, 104, 200, 300], "{k:?}");
    assert!(i.completions.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(i.conn.state(), ConnState::Established);
    assert_eq!(r.conn.state(), ConnState::Established);
    let _ = (&i.keys, &r.keys);
}

fn all_knobs() -> Vec<Knobs> {
    let mut v = Vec::new();
    for rev in [1u8, 2] {
        for crc in [false, true] {
            for markers_i in [false, true] {
                for markers_r in [false, true] {
                    for p2p in [false, true] {
                        if p2p && rev == 1 {
                            continue;
                        }
                        v.push(Knobs {
                            rev,
                            crc_i: crc,
                            crc_r: crc,
                            markers_i,
                            markers_r,
                            p2p,
                            emss: 1460,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Whole reads: every combination of revision, CRC, Markers each way, P2P.
#[test]
fn mpa_25_every_negotiation_moves_data_whole_reads() {
    for k in all_knobs() {
        exchange(k, &mut |n| n);
    }
}

/// MPA-44 / MPA-95: the stream cut into 1-octet reads.
#[test]
fn mpa_44_one_octet_reads() {
    for k in all_knobs() {
        exchange(k, &mut |_| 1);
    }
}

/// A small EMSS (markers every few FPDUs) and CRC asked by only one side.
#[test]
fn mpa_30_crc_asked_by_one_side_and_small_mss() {
    for (crc_i, crc_r) in [(true, false), (false, true)] {
        for markers in [false, true] {
            let k = Knobs {
                crc_i,
                crc_r,
                markers_i: markers,
                markers_r: markers,
                emss: 536,
                ..Knobs::default()
            };
            exchange(k, &mut |n| n.min(100));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// MPA-44: random split points, random negotiation.
    #[test]
    fn mpa_44_random_splits(seed in any::<u64>(), idx in 0usize..24) {
        let ks = all_knobs();
        let k = ks[idx % ks.len()];
        let mut x = seed | 1;
        exchange(k, &mut |n| {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            1 + (x as usize) % n.min(3000)
        });
    }
}

/// A CRC error in the byte stream (MPA-34/-86): the receiver Terminates with
/// LLP/CRC and nothing after the bad FPDU is delivered (MPA-90).
#[test]
fn mpa_86_corrupted_fpdu_terminates() {
    let now = Instant::now();
    let k = Knobs::default();
    let mut i = side(Role::Initiator, &k, 10, 8192, now);
    let mut r = side(Role::Responder, &k, 20, 8192, now);
    // One good Send each way first (the Responder transmits only after it
    // received an FPDU, MPA-73).
    for s in [&mut i, &mut r] {
        let key = s.key;
        let e = s.conn.engine_mut();
        e.post_recv(RecvWr::new(1, vec![Sge::new(key, IOVA, 4096)]))
            .unwrap();
        e.post_recv(RecvWr::new(2, vec![Sge::new(key, IOVA, 4096)]))
            .unwrap();
        e.post_send(SendWr::send(8, vec![Sge::new(key, IOVA, 10)]))
            .unwrap();
    }
    drive(&mut i, &mut r, &mut |n| n, now);
    assert!(i.established && r.established);
    assert_eq!(i.completions.len(), 2);
    // The Responder's next FPDU is corrupted on its way to the Initiator.
    r.conn
        .engine_mut()
        .post_send(SendWr::send(9, vec![Sge::new(r.key, IOVA, 100)]))
        .unwrap();
    r.conn
        .engine_mut()
        .post_send(SendWr::send(10, vec![Sge::new(r.key, IOVA, 100)]))
        .unwrap();
    let mut out = Vec::new();
    r.conn.poll_transmit(&mut out);
    out[30] ^= 0x40; // inside the first ULPDU
    i.conn.handle_input(now, &out);
    let mut saw = false;
    while let Some(e) = i.conn.poll_event() {
        if let ConnEvent::Qp(QpEvent::LlpError(LlpError::CrcError)) = e {
            saw = true;
        }
    }
    assert!(saw, "CRC error reported");
    // MPA-90: the second, intact Send was not delivered; the posted receive is flushed.
    let wc = i.conn.engine_mut().poll_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WorkRequestFlushed));
    let mut t = Vec::new();
    i.conn.poll_transmit(&mut t);
    let mut d = crate::framing::Deframer::new(false, true);
    d.push(&t);
    let ulpdu = d.next().unwrap().unwrap();
    let seg = Segment::parse(&ulpdu).unwrap();
    let Body::Terminate(term) = seg.body else {
        panic!("a Terminate")
    };
    assert_eq!(
        term.code,
        softrdma_wire::rdmap::TerminateCode::Llp(LlpError::CrcError)
    );
    assert_eq!(i.conn.state(), ConnState::Dead);
}
