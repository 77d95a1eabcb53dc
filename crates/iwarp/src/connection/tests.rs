//! Two connections over a simulated byte stream that TCP may cut anywhere:
//! every split (1-octet reads, random splits), CRC on and off, Markers on and
//! off, rev 1 and 2, P2P RTR (issue 3, Done-when 2); bounded transmit at every
//! bound, early FPDUs from the Responder, receives posted before the
//! connection, the shared-receive-queue hook.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId, QpId};
use softrdma_testkit::pattern;

use super::*;
use crate::framing::Deframer;
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
    /// Octets one `poll_transmit_bounded` call may add.
    bound: usize,
    frames: FrameCheck,
    /// A shared receive queue serving `needs_recv`.
    srq: VecDeque<RecvWr>,
    /// Times the connection asked for a shared receive.
    srq_asks: usize,
    /// Resume after an SRQ stop with the next read rather than at once.
    lazy_resume: bool,
    qp_events: Vec<QpEvent>,
    /// Transmit through a [`TxBuf`] (payloads referenced, written in pieces) instead of a
    /// `Vec`.
    tx: Option<TxBuf>,
    /// Read as [`Connection::next_read`] says.
    direct: bool,
    /// Payload octets read straight into memory.
    placed: usize,
}

/// Checks what one side transmits: every call hands out whole frames (the
/// MPA Request or Reply, then FPDUs), within the call's bound unless it is a
/// single frame.
#[derive(Default)]
struct FrameCheck {
    startup_done: bool,
    deframer: Option<Deframer>,
}

impl FrameCheck {
    fn check(&mut self, from: &Connection, out: &[u8], bound: usize) {
        let mut rest = out;
        let mut frames = 0;
        if !self.startup_done && !rest.is_empty() {
            // MPA Request/Reply: Key (16), flags, Rev, PD_Length (2), Private Data.
            assert!(rest.len() >= 20, "startup frame cut");
            let len = 20 + usize::from(u16::from_be_bytes([rest[18], rest[19]]));
            assert!(rest.len() >= len, "startup frame cut");
            rest = &rest[len..];
            self.startup_done = true;
            frames += 1;
        }
        if !rest.is_empty() {
            let d = self.deframer.get_or_insert_with(|| {
                let n = from.negotiated().expect("FPDUs only once negotiated");
                Deframer::new(n.markers_tx, n.crc)
            });
            d.push(rest);
            for u in d.by_ref() {
                u.expect("a valid FPDU");
                frames += 1;
            }
            assert_eq!(d.buffered(), 0, "an FPDU was cut at bound {bound}");
        }
        assert!(
            out.len() <= bound || frames == 1,
            "{} octets in {frames} frames over bound {bound}",
            out.len()
        );
    }
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
    /// Both sides transmit from registered memory (a [`TxBuf`] referencing every payload).
    gather: bool,
    /// Both sides read payloads straight into memory whenever a window is offered (any
    /// payload size), as the TCP driver does for large ones.
    direct: bool,
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
            gather: false,
            direct: false,
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
    let mut cfg = ConnectionConfig::new(role, startup, qpc, k.emss);
    if k.direct {
        cfg.rx_direct_min = 1;
    }
    Side {
        conn: Connection::new(cfg, keys.clone(), now).unwrap(),
        keys,
        buf,
        key,
        inbound: Vec::new(),
        completions: Vec::new(),
        established: false,
        bound: usize::MAX,
        frames: FrameCheck::default(),
        srq: VecDeque::new(),
        srq_asks: 0,
        lazy_resume: false,
        qp_events: Vec::new(),
        tx: k.gather.then(|| TxBuf::new().with_min_reference(1)),
        direct: k.direct,
        placed: 0,
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
    let n = match from.tx.as_mut() {
        None => from.conn.poll_transmit_bounded(&mut out, from.bound),
        Some(tx) => {
            let n = from.conn.poll_transmit_into(tx, from.bound);
            assert_eq!(n, tx.len());
            // Written in pieces `cut` chooses, as a socket takes them.
            while tx.len() > 0 {
                let want = cut(tx.len()).clamp(1, tx.len());
                assert_eq!(write_some(tx, want, &mut out), want);
                from.conn.transmitted(tx);
            }
            n
        }
    };
    assert_eq!(n, out.len());
    from.frames.check(&from.conn, &out, from.bound);
    to.inbound.extend_from_slice(&out);
    let moved = receive(to, cut, now);
    events(from);
    moved
}

/// `to` reads what is in flight towards it, `cut` octets at a time (through windows when
/// it reads directly).
fn receive(to: &mut Side, cut: &mut dyn FnMut(usize) -> usize, now: Instant) -> bool {
    let mut moved = false;
    while !to.inbound.is_empty() {
        let mut n = cut(to.inbound.len()).clamp(1, to.inbound.len());
        if to.direct {
            let next = to.conn.next_read();
            if let NextRead::Direct(w) = next {
                // One read: the window's memory first, then up to `tail` into a buffer.
                let n = n.min(w.len + w.tail);
                let k = n.min(w.len);
                let chunk: Vec<u8> = to.inbound.drain(..n).collect();
                let conn = &mut to.conn;
                w.target
                    .write_with(w.at, k, |mem| {
                        mem.copy_from_slice(&chunk[..k]);
                        conn.rx_placed(Ok(mem));
                    })
                    .unwrap();
                to.placed += k;
                to.conn.handle_input(now, &chunk[k..]);
                moved = true;
                serve_srq(to, now);
                events(to);
                continue;
            }
            if let NextRead::Buffered(limit) = next {
                n = n.min(limit);
            }
        }
        let chunk: Vec<u8> = to.inbound.drain(..n).collect();
        to.conn.handle_input(now, &chunk);
        moved = true;
        serve_srq(to, now);
        events(to);
    }
    moved
}

/// The driver's side of the SRQ hook: one shared receive per stop, then on.
fn serve_srq(s: &mut Side, now: Instant) {
    while s.conn.needs_recv() {
        s.srq_asks += 1;
        let seen = s.conn.engine().counters().ulpdus_rx;
        if let Some(wr) = s.srq.pop_front() {
            s.conn.engine_mut().post_recv(wr).unwrap();
        }
        // The Send's first segment waits outside the engine.
        assert_eq!(s.conn.engine().counters().ulpdus_rx, seen);
        if s.lazy_resume && !s.inbound.is_empty() {
            return; // the next read delivers it first
        }
        s.conn.handle_input(now, &[]);
    }
}

fn events(s: &mut Side) {
    while let Some(e) = s.conn.poll_event() {
        match e {
            ConnEvent::ConnectRequest { private_data, .. } => {
                assert_eq!(private_data, b"hello");
                s.conn.accept(b"welcome", 4, 4).unwrap();
            }
            ConnEvent::Established { .. } => s.established = true,
            ConnEvent::Qp(e) => s.qp_events.push(e),
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// What an exchange moves: Sends of `sizes` (at most 5), one RDMA Write of
/// `write` octets, one RDMA Read of `read` octets.
#[derive(Clone, Copy, Debug)]
struct Load<'a> {
    sizes: &'a [usize],
    write: usize,
    read: usize,
}

/// Sizes that cross FPDU and marker boundaries.
const FULL: Load<'static> = Load {
    sizes: &[0, 1, 4095, 4096, 20_000],
    write: 30_000,
    read: 10_000,
};

/// One full exchange: Sends, a Write, a Read, with sizes that cross FPDU and
/// marker boundaries; every byte and completion checked.
fn exchange(k: Knobs, cut: &mut dyn FnMut(usize) -> usize) -> (Side, Side) {
    exchange_bounded(k, cut, usize::MAX, FULL)
}

/// [`exchange`] with every transmit call bounded to `bound` octets.
fn exchange_bounded(
    k: Knobs,
    cut: &mut dyn FnMut(usize) -> usize,
    bound: usize,
    load: Load,
) -> (Side, Side) {
    let Load { sizes, write, read } = load;
    let max = sizes.iter().copied().max().unwrap_or(0);
    // Responder: receives, the Write's target, the Read's source, apart.
    let recv_at = |n: usize| 3 + n * (max + 1000);
    let write_to = recv_at(sizes.len()) + 1;
    let read_from = write_to + write + 99;
    // Initiator: Send sources, the Write's source (may overlap), the Read's sink.
    let send_at = |n: usize| 1 + n * (max / 2 + 1);
    let write_src = 5;
    let read_into = send_at(sizes.len()) + max + write + 16;
    let len = (read_from + read).max(read_into + read) + 64;

    let now = Instant::now();
    let mut i = side(Role::Initiator, &k, 10, len, now);
    let mut r = side(Role::Responder, &k, 20, len, now);
    i.bound = bound;
    r.bound = bound;
    // Receives posted before the connection exists, at unaligned offsets.
    for (n, &sz) in sizes.iter().enumerate() {
        let sge = Sge::new(r.key, IOVA + recv_at(n) as u64, sz.max(1) as u32);
        r.conn
            .engine_mut()
            .post_recv(RecvWr::new(n as u64, vec![sge]))
            .unwrap();
    }
    // Initiator data: sends from an unaligned region, then a Write and a Read.
    let data = pattern(len, 7);
    i.buf.copy_in(0, &data).unwrap();
    for (n, &sz) in sizes.iter().enumerate() {
        let sge = Sge::new(i.key, IOVA + send_at(n) as u64, sz as u32);
        let wr = SendWr::send(100 + n as u64, vec![sge]);
        i.conn.engine_mut().post_send(wr).unwrap();
    }
    let wr = SendWr::write(
        200,
        vec![Sge::new(i.key, IOVA + write_src as u64, write as u32)],
        r.key,
        IOVA + write_to as u64,
    );
    i.conn.engine_mut().post_send(wr).unwrap();
    let remote = pattern(read, 9);
    r.buf.copy_in(read_from, &remote).unwrap();
    let rd = SendWr::read(
        300,
        Some(Sge::new(i.key, IOVA + read_into as u64, read as u32)),
        r.key,
        IOVA + read_from as u64,
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
    for (n, (wc, &sz)) in recvs.iter().zip(sizes).enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (n as u64, WcStatus::Success, sz)
        );
        let mut got = vec![0u8; sz];
        r.buf.copy_out(recv_at(n), &mut got).unwrap();
        assert_eq!(got, data[send_at(n)..send_at(n) + sz], "send {n} {k:?}");
    }
    let mut got = vec![0u8; write];
    r.buf.copy_out(write_to, &mut got).unwrap();
    assert_eq!(got, data[write_src..write_src + write], "write {k:?}");
    let mut got = vec![0u8; read];
    i.buf.copy_out(read_into, &mut got).unwrap();
    assert_eq!(got, remote, "read {k:?}");
    // Initiator completions: all successful, in submission order (RDMAP-81).
    let ids: Vec<u64> = i.completions.iter().map(|c| c.wr_id).collect();
    let mut want: Vec<u64> = (0..sizes.len() as u64).map(|n| 100 + n).collect();
    want.extend([200, 300]);
    assert_eq!(ids, want, "{k:?}");
    assert!(i.completions.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(i.conn.state(), ConnState::Established);
    assert_eq!(r.conn.state(), ConnState::Established);
    assert!(i.qp_events.is_empty() && r.qp_events.is_empty(), "{k:?}");
    let _ = (&i.keys, &r.keys);
    (i, r)
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
                            gather: false,
                            direct: false,
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

/// Transmit from registered memory (every payload referenced, the queue written in random
/// pieces): the same octets as copying, for every negotiation, CRC over the referenced
/// memory included.
#[test]
fn gather_transmit_every_negotiation_random_writes() {
    for (n, k) in all_knobs().into_iter().enumerate() {
        let k = Knobs { gather: true, ..k };
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
        exchange(k, &mut |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x as usize) % n.min(5000)
        });
    }
}

fn xorshift(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed | 1;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        1 + (x as usize) % n.min(5000)
    }
}

/// Direct placement: payloads read straight into the Write's target, the Read's sink and
/// the receive buffers through windows, the rest of each read handed over as usual; every
/// negotiation, whole and random reads, CRC checked over what went around the buffer.
/// Without Markers towards a side, its payloads did go straight into memory.
#[test]
fn direct_placement_every_negotiation() {
    for (n, k) in all_knobs().into_iter().enumerate() {
        let k = Knobs {
            direct: true,
            gather: n % 2 == 0,
            ..k
        };
        for whole in [true, false] {
            let (i, r) = if whole {
                exchange(k, &mut |n| n)
            } else {
                exchange(k, &mut xorshift(n as u64 + 77))
            };
            // FULL's payloads towards each side, and what went straight into memory: none
            // with Markers, none from whole reads (no FPDU is partial, nothing to wait for).
            let sent: usize = FULL.sizes.iter().sum::<usize>() + FULL.write;
            assert_eq!(r.placed > 0, !k.markers_r && !whole, "{k:?}");
            assert_eq!(i.placed > 0, !k.markers_i && !whole, "{k:?}");
            assert!(r.placed <= sent && i.placed <= FULL.read, "{k:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Direct placement under random reads, random negotiation, 1-octet reads included.
    #[test]
    fn direct_placement_random_splits(seed in any::<u64>(), idx in 0usize..24, one in 0u8..4) {
        let ks = all_knobs();
        let k = Knobs { direct: true, gather: seed % 3 == 0, ..ks[idx % ks.len()] };
        if one == 0 {
            exchange(k, &mut |_| 1);
        } else {
            exchange(k, &mut xorshift(seed));
        }
    }
}

/// A connected pair of `len`-octet regions, `recvs` receives (ids 1..) posted on each side
/// and one good Send each way done (the Responder transmits only after it received an FPDU,
/// MPA-73).
fn connected(k: &Knobs, len: usize, recvs: u64, now: Instant) -> (Side, Side) {
    let mut i = side(Role::Initiator, k, 10, len, now);
    let mut r = side(Role::Responder, k, 20, len, now);
    for s in [&mut i, &mut r] {
        let key = s.key;
        let e = s.conn.engine_mut();
        for id in 1..=recvs {
            e.post_recv(RecvWr::new(id, vec![Sge::new(key, IOVA, 4096)]))
                .unwrap();
        }
        e.post_send(SendWr::send(8, vec![Sge::new(key, IOVA, 10)]))
            .unwrap();
    }
    drive(&mut i, &mut r, &mut |n| n, now);
    assert!(i.established && r.established);
    (i, r)
}

/// [`connected`], reading directly, CRC on.
fn direct_pair(now: Instant, len: usize) -> (Side, Side) {
    let k = Knobs {
        direct: true,
        crc_i: true,
        crc_r: true,
        emss: 9000,
        ..Knobs::default()
    };
    connected(&k, len, 1, now)
}

/// MPA-34 with direct placement: a payload octet flipped on the wire is placed, but the
/// FPDU's CRC (computed over the octets as they went around the buffer) fails: code 2,
/// the Send is not delivered, its receive is flushed, nothing after it is delivered.
#[test]
fn direct_placement_crc_error_terminates() {
    let now = Instant::now();
    let (mut i, mut r) = direct_pair(now, 64 * 1024);
    r.conn
        .engine_mut()
        .post_recv(RecvWr::new(2, vec![Sge::new(r.key, IOVA, 20_000)]))
        .unwrap();
    let p = pattern(20_000, 3);
    i.buf.copy_in(0, &p).unwrap();
    for id in [9, 10] {
        i.conn
            .engine_mut()
            .post_send(SendWr::send(id, vec![Sge::new(i.key, IOVA, 6000)]))
            .unwrap();
    }
    let mut out = Vec::new();
    i.conn.poll_transmit(&mut out);
    out[3000] ^= 0x10; // payload of the first Send's first FPDU
    r.inbound = out;
    receive(&mut r, &mut |n| n.min(700), now);
    assert!(r.placed > 0, "a window was used");
    assert!(
        r.qp_events.contains(&QpEvent::LlpError(LlpError::CrcError)),
        "{:?}",
        r.qp_events
    );
    let wcs: Vec<_> = std::iter::from_fn(|| r.conn.engine_mut().poll_completion()).collect();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (2, WcStatus::WorkRequestFlushed)
    );
    let mut t = Vec::new();
    r.conn.poll_transmit(&mut t);
    assert_eq!(r.conn.state(), ConnState::Dead);
}

/// The Write's target deregistered while its payload is being read straight into it: the
/// window's memory refuses the rest, nothing more is written there, the octets are read
/// and dropped, and the segment fails as a Write to an invalid STag does (a Terminate).
#[test]
fn direct_placement_target_revoked_midway() {
    let now = Instant::now();
    let len = 64 * 1024;
    let (mut i, mut r) = direct_pair(now, len);
    // A second region at the Responder for the Write (the first holds the receives).
    let target = Buffer::new(len);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let tkey = r
        .keys
        .reg_mr(PD, target.clone(), 0, len, IOVA, access)
        .unwrap();
    i.buf.copy_in(0, &pattern(30_000, 5)).unwrap();
    i.conn
        .engine_mut()
        .post_send(SendWr::write(
            7,
            vec![Sge::new(i.key, IOVA, 30_000)],
            tkey,
            IOVA,
        ))
        .unwrap();
    let mut out = Vec::new();
    i.conn.poll_transmit(&mut out);
    // The first 2,000 octets: headers, then the start of the payload, copied in.
    r.conn.handle_input(now, &out[..2000]);
    let NextRead::Direct(w) = r.conn.next_read() else {
        panic!("a window for the rest of the payload");
    };
    r.keys.dereg_mr(tkey).unwrap();
    let refused = w.target.write_with(w.at, w.len, |_| ());
    r.conn
        .rx_placed(Err(refused.expect_err("the key is revoked")));
    assert!(
        matches!(r.conn.next_read(), NextRead::Buffered(_)),
        "no window once refused"
    );
    r.conn.handle_input(now, &out[2000..]);
    events(&mut r);
    let mut tail = vec![0u8; len - 2000];
    target.copy_out(2000, &mut tail).unwrap();
    assert!(tail.iter().all(|&b| b == 0), "written after deregistration");
    assert!(
        r.qp_events
            .iter()
            .any(|e| matches!(e, QpEvent::LocalError(_))),
        "{:?}",
        r.qp_events
    );
    let mut t = Vec::new();
    r.conn.poll_transmit(&mut t);
    assert_eq!(r.conn.state(), ConnState::Dead);
    let mut d = Deframer::new(false, true);
    d.push(&t);
    let seg_bytes = d.next().unwrap().unwrap();
    let seg = Segment::parse(&seg_bytes).unwrap();
    assert!(matches!(seg.body, Body::Terminate(_)), "{seg:?}");
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
    let (mut i, mut r) = connected(&k, 8192, 2, now);
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

/// Transmit bounded at every bound from 1 octet to past two FPDUs: every call
/// hands out whole frames (startup frames, the RTR, FPDUs with Markers at
/// every position), stays within its bound unless it carries a single frame,
/// and nothing is lost: every byte and completion of the exchange is checked.
#[test]
fn mpa_05_bounded_transmit_keeps_fpdus_whole_at_every_bound() {
    let markers_p2p = Knobs {
        markers_i: true,
        markers_r: true,
        p2p: true,
        emss: 536,
        ..Knobs::default()
    };
    let plain = Knobs {
        rev: 1,
        crc_i: false,
        emss: 536,
        ..Knobs::default()
    };
    let small = Load {
        sizes: &[0, 1, 1500],
        write: 3000,
        read: 1000,
    };
    // The largest FPDU here is 536 octets: 1..=1100 covers "not even one",
    // "one" and "two whole ones", at every length in between.
    for bound in 1..=1100 {
        exchange_bounded(markers_p2p, &mut |n| n, bound, small);
    }
    for bound in 1..=1100 {
        exchange_bounded(plain, &mut |n| n.min(333), bound, small);
    }
    // Full-size FPDUs and messages, a few bounds.
    for bound in [1, 1459, 1460, 1461, 2921, 64 * 1024] {
        exchange_bounded(Knobs::default(), &mut |n| n, bound, FULL);
    }
}

/// Initiator with a receive posted before the connection; Responder with a
/// Send queued before the Request arrives (`early` / `p2p` as asked). Runs
/// the startup to the Responder's accept and returns both sides and what the
/// Responder sends first.
fn responder_first(early: bool, p2p: bool, now: Instant) -> (Side, Side, Vec<u8>) {
    let k = Knobs {
        p2p,
        ..Knobs::default()
    };
    let mut i = side(Role::Initiator, &k, 10, 8192, now);
    let mut r = side(Role::Responder, &k, 20, 8192, now);
    let qp = r.conn.config().qp;
    r.conn
        .set_data_path(qp, FpduSizing::PathMss, false, early)
        .unwrap();
    // Work requests posted before the connection sit in the engine at once.
    let rkey = i.key;
    i.conn
        .engine_mut()
        .post_recv(RecvWr::new(1, vec![Sge::new(rkey, IOVA + 100, 64)]))
        .unwrap();
    assert_eq!(i.conn.engine().rq_len(), 1);
    assert_eq!(i.conn.state(), ConnState::Startup);
    r.buf.copy_in(0, b"responder speaks first").unwrap();
    let skey = r.key;
    r.conn
        .engine_mut()
        .post_send(SendWr::send(2, vec![Sge::new(skey, IOVA, 22)]))
        .unwrap();
    // The Request; the Responder accepts (events()).
    let mut out = Vec::new();
    i.conn.poll_transmit(&mut out);
    i.frames.check(&i.conn, &out, usize::MAX);
    r.conn.handle_input(now, &out);
    events(&mut r);
    assert!(r.established);
    let mut first = Vec::new();
    r.conn.poll_transmit(&mut first);
    r.frames.check(&r.conn, &first, usize::MAX);
    (i, r, first)
}

fn reply_len(bytes: &[u8]) -> usize {
    20 + usize::from(u16::from_be_bytes([bytes[18], bytes[19]]))
}

/// MPA-73 (RFC 5044 §7.1.2 r4), the default: the Responder sends its Reply
/// and nothing else, a Send queued or not, until the Initiator's first FPDU.
#[test]
fn mpa_73_responder_waits_for_first_fpdu_by_default() {
    let now = Instant::now();
    for p2p in [false, true] {
        for early in [false, true] {
            if early && !p2p {
                continue;
            }
            // With P2P, early FPDUs are ignored: the RTR comes first.
            let (mut i, mut r, first) = responder_first(early, p2p, now);
            assert_eq!(first.len(), reply_len(&first), "only the Reply");
            assert!(!r.conn.wants_transmit(), "p2p {p2p} early {early}");
            i.conn.handle_input(now, &first);
            events(&mut i);
            assert!(i.established);
            assert!(i.conn.engine_mut().poll_completion().is_none());
            if !p2p {
                // Client-server: the Initiator speaks first.
                r.conn
                    .engine_mut()
                    .post_recv(RecvWr::new(3, vec![Sge::new(r.key, IOVA + 200, 64)]))
                    .unwrap();
                i.conn
                    .engine_mut()
                    .post_send(SendWr::send(4, vec![Sge::new(i.key, IOVA, 5)]))
                    .unwrap();
            }
            drive(&mut i, &mut r, &mut |n| n, now);
            let ri: Vec<u64> = r.completions.iter().map(|c| c.wr_id).collect();
            let want: &[u64] = if p2p { &[2] } else { &[3, 2] };
            assert_eq!(
                ri, want,
                "the Responder's Send left only after an FPDU came in"
            );
            let got = i.completions.iter().find(|c| c.wr_id == 1).unwrap();
            assert_eq!((got.status, got.byte_len), (WcStatus::Success, 22));
        }
    }
}

/// `early_fpdus` (siw's Responder): the Send follows the Reply in the same
/// transmit, before the Initiator sent anything. The Initiator reads Reply
/// and FPDU in one piece; the receive it posted before the connection
/// existed is already in the engine and takes the Send.
#[test]
fn early_fpdus_land_in_receives_posted_before_connect() {
    let now = Instant::now();
    let (mut i, r, first) = responder_first(true, false, now);
    let reply = reply_len(&first);
    assert!(first.len() > reply, "an FPDU follows the Reply");
    // One read: Reply and FPDU together.
    i.conn.handle_input(now, &first);
    events(&mut i);
    assert!(i.established);
    let wc = i.conn.engine_mut().poll_completion().unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 22)
    );
    let mut got = [0u8; 22];
    i.buf.copy_out(100, &mut got).unwrap();
    assert_eq!(&got, b"responder speaks first");
    assert!(i.qp_events.is_empty());
    let _ = r;
}

/// The SRQ hook: the connection stops before the first segment of each Send
/// that finds no receive posted, once per Send (not per segment, not for a
/// Write or a Read), with that segment held outside the engine; what the
/// driver then posts takes the Send. At every split, resuming at once or
/// with the next read.
#[test]
fn srq_hook_asks_once_per_send_that_finds_no_receive() {
    for (cut, lazy) in [(usize::MAX, false), (1, false), (1, true), (700, true)] {
        let now = Instant::now();
        let k = Knobs::default();
        let mut i = side(Role::Initiator, &k, 10, 64 * 1024, now);
        let mut r = side(Role::Responder, &k, 20, 64 * 1024, now);
        let qp = r.conn.config().qp;
        r.conn
            .set_data_path(qp, FpduSizing::PathMss, true, false)
            .unwrap();
        r.lazy_resume = lazy;
        // One receive of the QP's own, then the shared ones.
        r.conn
            .engine_mut()
            .post_recv(RecvWr::new(50, vec![Sge::new(r.key, IOVA, 4096)]))
            .unwrap();
        for n in 0..4u64 {
            let at = IOVA + 4096 * (n + 1);
            r.srq
                .push_back(RecvWr::new(60 + n, vec![Sge::new(r.key, at, 4096)]));
        }
        let data = pattern(16 * 1024, 3);
        i.buf.copy_in(0, &data).unwrap();
        r.buf.copy_in(40_000, &data[..2000]).unwrap();
        let sizes = [10usize, 3000, 0];
        let post = |i: &mut Side, wr: SendWr| i.conn.engine_mut().post_send(wr).unwrap();
        let ik = i.key;
        let rk = r.key;
        post(
            &mut i,
            SendWr::send(1, vec![Sge::new(ik, IOVA, sizes[0] as u32)]),
        );
        post(
            &mut i,
            SendWr::write(2, vec![Sge::new(ik, IOVA, 3000)], rk, IOVA + 30_000),
        );
        post(
            &mut i,
            SendWr::send(3, vec![Sge::new(ik, IOVA + 1, sizes[1] as u32)]),
        );
        post(
            &mut i,
            SendWr::read(4, Some(Sge::new(ik, IOVA + 8000, 2000)), rk, IOVA + 40_000),
        );
        post(
            &mut i,
            SendWr::send(5, vec![Sge::new(ik, IOVA + 2, sizes[2] as u32)]),
        );
        let mut c = cut;
        drive(&mut i, &mut r, &mut |n| n.min(c), now);
        c = 0;
        let _ = c;
        // Own receive first, then one shared receive per Send: two asks.
        assert_eq!(r.srq_asks, 2, "cut {cut} lazy {lazy}");
        assert_eq!(r.srq.len(), 2);
        let recvs: Vec<_> = r
            .completions
            .iter()
            .map(|w| (w.wr_id, w.status, w.byte_len as usize))
            .collect();
        assert_eq!(
            recvs,
            [
                (50, WcStatus::Success, sizes[0]),
                (60, WcStatus::Success, sizes[1]),
                (61, WcStatus::Success, sizes[2]),
            ]
        );
        let mut got = vec![0u8; sizes[1]];
        r.buf.copy_out(4096, &mut got).unwrap();
        assert_eq!(got, data[1..1 + sizes[1]]);
        let ids: Vec<u64> = i.completions.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
        assert!(i.completions.iter().all(|w| w.status == WcStatus::Success));
        assert!(r.qp_events.is_empty() && i.qp_events.is_empty());
    }
}

/// The SRQ hook with an empty shared queue: the held segment is delivered
/// anyway and the engine terminates the stream for want of a buffer
/// (RFC 5041 §7.2); the stop is not a deadlock.
#[test]
fn srq_hook_with_nothing_to_give_terminates() {
    let now = Instant::now();
    let k = Knobs::default();
    let mut i = side(Role::Initiator, &k, 10, 8192, now);
    let mut r = side(Role::Responder, &k, 20, 8192, now);
    let qp = r.conn.config().qp;
    r.conn
        .set_data_path(qp, FpduSizing::PathMss, true, false)
        .unwrap();
    let ik = i.key;
    i.conn
        .engine_mut()
        .post_send(SendWr::send(1, vec![Sge::new(ik, IOVA, 10)]))
        .unwrap();
    drive(&mut i, &mut r, &mut |n| n, now);
    assert_eq!(r.srq_asks, 1);
    assert!(
        matches!(r.qp_events.as_slice(), [QpEvent::LocalError(_)]),
        "{:?}",
        r.qp_events
    );
    assert!(
        matches!(i.qp_events.as_slice(), [QpEvent::TerminateReceived(_)]),
        "{:?}",
        i.qp_events
    );
    assert_eq!(r.conn.state(), ConnState::Dead);
    assert!(!r.conn.needs_recv());
}

/// `set_data_path` (the Responder's QP chosen at accept) is refused once work
/// sits in the engine, once established, and after a failure; nothing changes.
#[test]
fn set_data_path_only_before_establishment() {
    let now = Instant::now();
    let k = Knobs::default();
    let mut r = side(Role::Responder, &k, 20, 8192, now);
    let mut qp = r.conn.config().qp;
    qp.rq_depth = 3;
    r.conn
        .set_data_path(qp, FpduSizing::Fixed(1000), false, false)
        .unwrap();
    assert_eq!(r.conn.engine().config().rq_depth, 3);
    let rk = r.key;
    r.conn
        .engine_mut()
        .post_recv(RecvWr::new(1, vec![Sge::new(rk, IOVA, 8)]))
        .unwrap();
    let busy = r.conn.set_data_path(qp, FpduSizing::PathMss, true, true);
    assert!(
        matches!(busy, Err(StartupError::InvalidState(_))),
        "{busy:?}"
    );
    assert_eq!(r.conn.config().fpdu, FpduSizing::Fixed(1000));

    let mut i = side(Role::Initiator, &k, 10, 8192, now);
    let mut r2 = side(Role::Responder, &k, 30, 8192, now);
    drive(&mut i, &mut r2, &mut |n| n, now);
    assert!(i.established && r2.established);
    let late = r2.conn.set_data_path(qp, FpduSizing::PathMss, false, false);
    assert!(
        matches!(late, Err(StartupError::InvalidState(_))),
        "{late:?}"
    );
    let mulpdu = i.conn.engine().config().mulpdu;
    assert_eq!(
        mulpdu,
        mpa::mulpdu(k.emss, false),
        "negotiated MULPDU in the engine"
    );
    assert_eq!(i.conn.engine().config().ird, 4);

    // The Initiator speaks before our Reply (§7.6): failed, accept refused.
    let mut r3 = side(Role::Responder, &k, 40, 8192, now);
    let mut i3 = side(Role::Initiator, &k, 50, 8192, now);
    let mut req = Vec::new();
    i3.conn.poll_transmit(&mut req);
    req.extend_from_slice(&[0, 0, 0, 0]);
    r3.conn.handle_input(now, &req);
    let mut failed = false;
    while let Some(e) = r3.conn.poll_event() {
        failed |= matches!(
            e,
            ConnEvent::StartupFailed(StartupError::ExtraOctets { .. })
        );
    }
    assert!(failed);
    assert_eq!(r3.conn.state(), ConnState::Failed);
    assert!(r3.conn.accept(&[], 1, 1).is_err());
    assert!(
        r3.conn
            .set_data_path(qp, FpduSizing::PathMss, false, false)
            .is_err()
    );
}

/// RDMAP-94: after the ULP's close nothing more goes out; rebuilding the data path before
/// establishment must not bring the closed queue pair back (found by `iwarp_connection`).
#[test]
fn rdmap_94_set_data_path_refused_after_close() {
    let now = Instant::now();
    let k = Knobs::default();
    let mut r = side(Role::Responder, &k, 20, 8192, now);
    r.conn.close();
    let qp = r.conn.config().qp;
    let again = r.conn.set_data_path(qp, FpduSizing::PathMss, false, true);
    assert!(
        matches!(again, Err(StartupError::InvalidState(_))),
        "{again:?}"
    );
    assert_eq!(r.conn.engine().state(), StreamState::Closed);
    assert!(!r.conn.config().early_fpdus, "nothing changed");
}

/// RFC 6581: the RTR is the Initiator's first FPDU, but once the LLP is lost (EOF, RFC 5044
/// §8, RDMAP-92) or the ULP closed (RDMAP-94) before it went out, nothing goes out at all
/// (found by `iwarp_connection`).
#[test]
fn p2p_rtr_not_sent_after_eof_or_close() {
    for close in [false, true] {
        let now = Instant::now();
        let k = Knobs {
            p2p: true,
            ..Knobs::default()
        };
        let mut i = side(Role::Initiator, &k, 10, 8192, now);
        let mut r = side(Role::Responder, &k, 20, 8192, now);
        let mut req = Vec::new();
        i.conn.poll_transmit(&mut req);
        r.conn.handle_input(now, &req);
        events(&mut r);
        let mut reply = Vec::new();
        r.conn.poll_transmit(&mut reply);
        i.conn.handle_input(now, &reply);
        events(&mut i);
        assert!(i.established && i.conn.wants_transmit(), "the RTR is due");
        if close {
            i.conn.close();
        } else {
            i.conn.handle_eof();
        }
        assert!(!i.conn.wants_transmit(), "close {close}");
        let mut out = Vec::new();
        assert_eq!(
            i.conn.poll_transmit(&mut out),
            0,
            "close {close}: {out:02x?}"
        );
    }
}

/// Two sides with [`TxBuf`] transmit, established, nothing in flight.
fn gather_pair(now: Instant, len: usize) -> (Side, Side) {
    let k = Knobs {
        gather: true,
        ..Knobs::default()
    };
    let mut i = side(Role::Initiator, &k, 10, len, now);
    let mut r = side(Role::Responder, &k, 20, len, now);
    drive(&mut i, &mut r, &mut |n| n, now);
    assert!(i.established && r.established);
    (i, r)
}

/// Writes at most `max` octets of `tx` into `wire`, as a socket would take them.
fn write_some(tx: &mut TxBuf, max: usize, wire: &mut Vec<u8>) -> usize {
    let r = tx.write_with(|iov| {
        let mut k = 0;
        for s in iov {
            let take = s.len().min(max - k);
            wire.extend_from_slice(&s[..take]);
            k += take;
        }
        Ok::<_, ()>(k)
    });
    r.expect("written").unwrap_or(0)
}

/// RDMAP-80 with the payload written from registered memory: a Send completes once its last
/// octet is written, not when it is framed (until then the memory is still being read).
#[test]
fn gather_send_completes_once_its_last_octet_is_written() {
    let now = Instant::now();
    let len = 30_000;
    let (mut i, mut r) = gather_pair(now, 65536);
    let recv = RecvWr::new(1, vec![Sge::new(r.key, IOVA + 8, len as u32)]);
    r.conn.engine_mut().post_recv(recv).unwrap();
    let data = pattern(len, 3);
    i.buf.copy_in(100, &data).unwrap();
    let wr = SendWr::send(7, vec![Sge::new(i.key, IOVA + 100, len as u32)]);
    i.conn.engine_mut().post_send(wr).unwrap();
    let mut tx = i.tx.take().unwrap();
    let framed = i.conn.poll_transmit_into(&mut tx, usize::MAX);
    assert!(framed > len && tx.references() > 0, "payload referenced");
    let mut wire = Vec::new();
    assert_eq!(write_some(&mut tx, framed - 1, &mut wire), framed - 1);
    i.conn.transmitted(&mut tx);
    assert_eq!(
        i.conn.engine_mut().poll_completion(),
        None,
        "one octet unwritten"
    );
    assert_eq!(write_some(&mut tx, usize::MAX, &mut wire), 1);
    i.conn.transmitted(&mut tx);
    let wc = i
        .conn
        .engine_mut()
        .poll_completion()
        .expect("completed once written");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    assert_eq!(tx.references(), 0);
    // The octets are the Send, intact.
    r.conn.handle_input(now, &wire);
    let wc = r.conn.engine_mut().poll_completion().expect("received");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len as usize),
        (1, WcStatus::Success, len)
    );
    let mut got = vec![0; len];
    r.buf.copy_out(8, &mut got).unwrap();
    assert_eq!(got, data);
}

/// A source deregistered after its FPDUs were framed and before they were written: the
/// write refuses it (not one octet of that write leaves), the connection is lost, and the
/// Send is flushed rather than completed.
#[test]
fn gather_source_revoked_before_write_flushes_the_send() {
    let now = Instant::now();
    let len = 30_000;
    let (mut i, _r) = gather_pair(now, 65536);
    let wr = SendWr::send(7, vec![Sge::new(i.key, IOVA + 100, len as u32)]);
    i.conn.engine_mut().post_send(wr).unwrap();
    let mut tx = i.tx.take().unwrap();
    i.conn.poll_transmit_into(&mut tx, usize::MAX);
    i.keys.dereg_mr(i.key).unwrap();
    let mut called = false;
    let r = tx.write_with(|_| {
        called = true;
        Ok::<_, ()>(0)
    });
    assert_eq!(r, Err(Err(softrdma_memory::AccessError::Invalidated)));
    assert!(!called, "nothing handed to the socket");
    i.conn.transmit_failed();
    let wc = i.conn.engine_mut().poll_completion().expect("completed");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WorkRequestFlushed));
    assert_eq!(i.conn.state(), ConnState::Dead);
}

/// RFC 5044 §8 (MPA-90) and issue 14: a Responder waiting for the Initiator's first FPDU
/// (MPA-73) that gets one failing framing — a bad CRC when CRC was negotiated, or an
/// ULPDU_Length beyond any this connection takes — may leave the Terminate out, but must
/// close the connection; it must not sit there open.
#[test]
fn mpa_90_a_first_fpdu_that_fails_framing_closes_the_connection() {
    let now = Instant::now();
    for crc in [true, false] {
        let k = Knobs {
            crc_i: crc,
            crc_r: crc,
            ..Knobs::default()
        };
        let mut i = side(Role::Initiator, &k, 10, 8192, now);
        let mut r = side(Role::Responder, &k, 20, 8192, now);
        let qp = r.conn.config().qp;
        r.conn
            .set_data_path(qp, FpduSizing::PathMss, false, false)
            .unwrap();
        let mut out = Vec::new();
        i.conn.poll_transmit(&mut out);
        r.conn.handle_input(now, &out);
        events(&mut r);
        let mut reply = Vec::new();
        r.conn.poll_transmit(&mut reply);
        i.conn.handle_input(now, &reply);
        events(&mut i);
        assert!(i.established);
        i.conn
            .engine_mut()
            .post_send(SendWr::send(4, vec![Sge::new(i.key, IOVA, 100)]))
            .unwrap();
        let mut fpdu = Vec::new();
        i.conn.poll_transmit(&mut fpdu);
        if crc {
            fpdu[30] ^= 0x40; // inside the ULPDU: the CRC no longer matches
        } else {
            fpdu[0] = 0xff; // ULPDU_Length 0xff.. : beyond the largest FPDU
        }
        r.conn.handle_input(now, &fpdu);
        events(&mut r);
        let mut t = Vec::new();
        r.conn.poll_transmit(&mut t);
        assert_eq!(r.conn.state(), ConnState::Dead, "crc {crc}");
    }
}

/// The Initiator's nudge, Linux siw's accept race as the Responder's socket shows it: our
/// first FPDU reached a socket nobody reads yet, and stays unread until more octets come.
/// Once that FPDU is out the connection asks for the time at once (a deadline already
/// past), then for [`NUDGE_AFTER`] later; then it sends one zero-length RDMA Write to STag 0
/// behind it, which the Responder takes when it reads both; no completion comes of it, and
/// no second nudge follows.
#[test]
fn a_silent_responder_is_nudged_once_after_our_first_fpdu() {
    let now = Instant::now();
    let k = Knobs::default();
    let mut i = side(Role::Initiator, &k, 10, 8192, now);
    let mut r = side(Role::Responder, &k, 20, 8192, now);
    let mut out = Vec::new();
    i.conn.poll_transmit(&mut out);
    i.frames.check(&i.conn, &out, usize::MAX);
    r.conn.handle_input(now, &out);
    events(&mut r);
    let mut reply = Vec::new();
    r.conn.poll_transmit(&mut reply);
    r.frames.check(&r.conn, &reply, usize::MAX);
    i.conn.handle_input(now, &reply);
    events(&mut i);
    assert!(i.established && r.established);
    assert_eq!(
        i.conn.poll_timeout(),
        None,
        "nothing sent, nothing to wait for"
    );
    assert_eq!(r.conn.poll_timeout(), None);

    r.conn
        .engine_mut()
        .post_recv(RecvWr::new(3, vec![Sge::new(r.key, IOVA, 64)]))
        .unwrap();
    i.conn
        .engine_mut()
        .post_send(SendWr::send(4, vec![Sge::new(i.key, IOVA, 5)]))
        .unwrap();
    let mut stuck = Vec::new();
    i.conn.poll_transmit(&mut stuck);
    i.frames.check(&i.conn, &stuck, usize::MAX);
    assert!(!stuck.is_empty());
    let t0 = now + Duration::from_millis(3);
    let due = i.conn.poll_timeout().expect("the first FPDU is out");
    assert!(
        due <= t0,
        "a deadline already past: the connection wants the time"
    );
    i.conn.handle_timeout(t0);
    assert_eq!(i.conn.poll_timeout(), Some(t0 + NUDGE_AFTER));
    i.conn
        .handle_timeout(t0 + NUDGE_AFTER - Duration::from_millis(1));
    assert!(!i.conn.wants_transmit(), "not before the deadline");
    i.conn.handle_timeout(t0 + NUDGE_AFTER);
    assert_eq!(i.conn.poll_timeout(), None, "one nudge only");
    let mut nudge = Vec::new();
    i.conn.poll_transmit(&mut nudge);
    i.frames.check(&i.conn, &nudge, usize::MAX);
    let mut d = Deframer::new(false, true);
    d.push(&nudge);
    let ulpdu = d.next().unwrap().unwrap();
    assert_eq!(
        softrdma_wire::rdmap::Opcode::try_from(ulpdu[1] & softrdma_wire::rdmap::MASK_OPCODE),
        Ok(softrdma_wire::rdmap::Opcode::RdmaWrite)
    );

    // The Responder's socket wakes: both FPDUs are read.
    r.inbound.extend_from_slice(&stuck);
    r.inbound.extend_from_slice(&nudge);
    receive(&mut r, &mut |n| n, t0);
    drive(&mut i, &mut r, &mut |n| n, t0);
    let ids = |s: &Side| s.completions.iter().map(|c| c.wr_id).collect::<Vec<_>>();
    assert_eq!(ids(&i), vec![4], "the nudge completes to no one");
    assert_eq!(ids(&r), vec![3]);
    assert_eq!(i.conn.engine().sq_len(), 0);
    assert_eq!(i.conn.poll_timeout(), None);
    assert_eq!(i.conn.state(), ConnState::Established);
    assert_eq!(r.conn.state(), ConnState::Established);
}

/// A Responder that answers is never nudged: the connected pair exchanged a Send each way,
/// and the Initiator has nothing to wait for however long it stays idle.
#[test]
fn a_responder_that_answered_is_not_nudged() {
    let now = Instant::now();
    let (mut i, mut r) = connected(&Knobs::default(), 8192, 1, now);
    assert_eq!(i.conn.poll_timeout(), None);
    i.conn.handle_timeout(now + Duration::from_secs(60));
    assert!(!i.conn.wants_transmit());
    drive(&mut i, &mut r, &mut |n| n, now);
    assert_eq!(r.conn.engine().counters().ulpdus_rx, 1, "only the Send");
}
