#![no_main]
//! The iWARP DDP/RDMAP engine (`softrdma_iwarp::rdmap::RdmapEngine`) on a hostile peer's
//! ULPDUs, RFC 7306 opcodes (Immediate Data, Atomic Request / Response) included, with work
//! requests of its own posted in between. Nothing may panic; every ULPDU the engine hands out
//! (`poll_ulpdu`) parses with the wire crate and fits MULPDU; at most one Terminate goes out
//! and nothing after it (RDMAP-69, RDMAP-73); the octets around the two registered regions
//! stay untouched.
//!
//! Input: octet 0 = configuration (bits 0-1 MULPDU, 2-3 IRD, 4-5 ORD, bit 6 RDMAP version 0
//! instead of 1, bit 7 region B fast-registered, i.e. remotely invalidatable); then records,
//! each led by a little-endian u16 `h`:
//! * `h & 0x8000 == 0`: a ULPDU of `h & 0x7FF` octets follows. Bits 11-12 patch in a real
//!   STag (1: region A, 2: region B, 3: A with a wrong consumer key) where the segment names
//!   one of ours: a tagged segment's STag, a Send with Invalidate's Invalidate STag, a Read
//!   Request's Data Source STag, an Atomic Request's Remote STag. Bit 13 set: the engine's
//!   output is not drained afterwards (so IRD / ORD fill up). Bit 14 set: where the engine
//!   names a placement for the payload (`placement`), it is copied there and the segment
//!   handed over with `handle_placed`, as direct placement from a socket does.
//! * `h & 0x8000 != 0`: a local action, `(h >> 11) & 0xF` = kind, `h & 0x7FF` = flags, then 8
//!   octets of parameters (little-endian, zero-padded at the end of the input).

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use softrdma_iwarp::rdmap::{QpConfig, RdmapEngine, StreamState};
use softrdma_iwarp::verbs_types::{RecvWr, SendFlags, SendWr, Sge};
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId, QpId, TxBuf};
use softrdma_wire::ddp;
use softrdma_wire::rdmap::{LlpError, MASK_OPCODE, Opcode, Segment, TerminateLayout};

const GUARD: usize = 256;
const GUARD_BYTE: u8 = 0xA5;
/// Region A: every right, at TO 0.
const LEN_A: usize = 4096;
const IOVA_A: u64 = 0;
/// Region B: local write, remote read and write (no atomics), at TO 0x10000.
const LEN_B: usize = 1024;
const IOVA_B: u64 = 0x1_0000;
const OFF_A: usize = GUARD;
const OFF_B: usize = GUARD + LEN_A + GUARD;
const TOTAL: usize = OFF_B + LEN_B + GUARD;
const PD: PdId = PdId(1);

/// Bounds the work of one input: ULPDUs handed out per drain.
const DRAIN_MAX: usize = 4096;

struct Tx {
    mulpdu: usize,
    terminates: usize,
    out: Vec<u8>,
    /// Odd-length inputs: every ULPDU goes through a `TxBuf` that references its payload
    /// and is written out (flattened into `out`) before the next.
    gather: Option<TxBuf>,
}

impl Tx {
    /// Pulls up to `max` ULPDUs and checks each.
    fn drain(&mut self, e: &mut RdmapEngine, max: usize) {
        for _ in 0..max {
            self.out.clear();
            let n = match self.gather.as_mut() {
                None => e.poll_ulpdu(&mut self.out),
                Some(g) => {
                    let n = e.poll_ulpdu_into(g);
                    let out = &mut self.out;
                    let written = g.write_with(|iov| {
                        Ok::<_, ()>(
                            iov.iter()
                                .map(|s| {
                                    out.extend_from_slice(s);
                                    s.len()
                                })
                                .sum(),
                        )
                    });
                    match written {
                        Ok(_) => e.release_transmitted(e.ulpdus_emitted()),
                        Err(_) => {
                            // Revoked under the reference: nothing was written.
                            g.clear();
                            e.tx_lost();
                            break;
                        }
                    }
                    n
                }
            };
            let Some(n) = n else {
                break;
            };
            let u = &self.out[..];
            assert_eq!(n, u.len(), "poll_ulpdu length");
            assert!(
                n <= self.mulpdu,
                "ULPDU of {n} octets above MULPDU {}",
                self.mulpdu
            );
            ddp::Repr::parse(u).expect("emitted ULPDU has a DDP header");
            let seg = Segment::parse(u)
                .unwrap_or_else(|err| panic!("emitted ULPDU does not parse: {err:?}: {u:02x?}"));
            assert!(self.terminates == 0, "ULPDU after the Terminate: {seg:?}");
            if seg.opcode() == Opcode::Terminate {
                Segment::parse_with_layout(u, TerminateLayout::Rfc5040)
                    .expect("our Terminate in the RFC 5040 layout");
                self.terminates += 1;
            }
            while e.poll_completion().is_some() {}
            while e.poll_event().is_some() {}
        }
        while e.poll_completion().is_some() {}
        while e.poll_event().is_some() {}
    }
}

/// Writes `key` at `at` when the ULPDU is long enough.
fn put_key(u: &mut [u8], at: usize, key: Key) {
    if let Some(s) = u.get_mut(at..at + 4) {
        s.copy_from_slice(&key.0.to_be_bytes());
    }
}

/// Puts a real STag where the segment names one of this side's.
fn patch(u: &mut [u8], key: Key) {
    let (Some(&control), Some(&rdmap)) = (u.first(), u.get(1)) else {
        return;
    };
    const UNTAGGED: usize = ddp::UNTAGGED_HEADER_LEN;
    if control & ddp::FLAG_TAGGED != 0 {
        put_key(u, 2, key);
        return;
    }
    match Opcode::try_from(rdmap & MASK_OPCODE) {
        Ok(Opcode::SendWithInvalidate | Opcode::SendWithSeAndInvalidate) => put_key(u, 2, key),
        // Read Request: Data Source STag at octet 16 of its header.
        Ok(Opcode::RdmaReadRequest) => put_key(u, UNTAGGED + 16, key),
        // Atomic Request: Remote STag at octet 8 of its header.
        Ok(Opcode::AtomicRequest) => put_key(u, UNTAGGED + 8, key),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&conf, mut rest)) = data.split_first() else {
        return;
    };
    let keys = Arc::new(KeyTable::with_seed(1));
    let buf = Buffer::from_vec(vec![GUARD_BYTE; TOTAL]);
    buf.write()[OFF_A..OFF_A + LEN_A].fill(0);
    buf.write()[OFF_B..OFF_B + LEN_B].fill(0x11);
    let key_a = keys
        .reg_mr(
            PD,
            buf.clone(),
            OFF_A,
            LEN_A,
            IOVA_A,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    let rights_b = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let key_b = if conf & 0x80 != 0 {
        keys.reg_fast_mr(PD, buf.clone(), OFF_B, LEN_B, IOVA_B, rights_b)
    } else {
        keys.reg_mr(PD, buf.clone(), OFF_B, LEN_B, IOVA_B, rights_b)
    }
    .unwrap();
    let bad_a = Key(key_a.0 ^ 0x5A);

    let mut cfg = QpConfig::new(PD, QpId(7));
    cfg.mulpdu = [128, 200, 1024, cfg.mulpdu][usize::from(conf & 3)];
    cfg.ird = [0, 1, 2, 16][usize::from((conf >> 2) & 3)];
    cfg.ord = [0, 1, 2, 16][usize::from((conf >> 4) & 3)];
    cfg.rdmap_version = if conf & 0x40 != 0 { 0 } else { 1 };
    let mut e = RdmapEngine::new(cfg, keys.clone());
    let mut tx = Tx {
        mulpdu: usize::from(e.config().mulpdu),
        terminates: 0,
        out: Vec::new(),
        gather: (data.len() % 2 == 1).then(|| TxBuf::new().with_min_reference(1)),
    };

    let mut wr_id = 0u64;
    let mut ulpdu = Vec::new();
    while rest.len() >= 2 {
        let h = u16::from_le_bytes([rest[0], rest[1]]);
        rest = &rest[2..];
        let mut drain;
        if h & 0x8000 == 0 {
            let n = usize::from(h & 0x7FF).min(rest.len());
            ulpdu.clear();
            ulpdu.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            match (h >> 11) & 3 {
                1 => patch(&mut ulpdu, key_a),
                2 => patch(&mut ulpdu, key_b),
                3 => patch(&mut ulpdu, bad_a),
                _ => {}
            }
            drain = h & 0x2000 == 0;
            let _ = e.needs_recv(&ulpdu);
            let head = ddp::Repr::parse(&ulpdu).map_or(0, |r| r.header_len());
            let placement = if h & 0x4000 != 0 && head <= ulpdu.len() {
                e.placement(&ulpdu[..head], ulpdu.len())
            } else {
                None
            };
            match placement {
                // Direct placement: the payload copied where the engine named, then the
                // segment handed over as placed (and checked again).
                Some(p) => {
                    let mut at = head;
                    let mut ok = true;
                    for (t, off, len) in p.pieces() {
                        ok &= t.place(*off, &ulpdu[at..at + len]).is_ok();
                        at += len;
                    }
                    assert_eq!(at, ulpdu.len(), "the pieces cover the payload");
                    e.handle_placed(&ulpdu[..head], ulpdu.len() - head, ok);
                }
                None => e.handle_ulpdu(&ulpdu),
            }
        } else {
            let kind = (h >> 11) & 0xF;
            let p = h & 0x7FF;
            let mut x = [0u8; 8];
            let n = rest.len().min(8);
            x[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            let x = u64::from_le_bytes(x);
            wr_id += 1;
            drain = p & 0x400 == 0;
            // A local entry in region A (may stray out of it: a post error).
            let off = x & 0xFFF;
            let len = ((x >> 12) & 0xFFF) as u32;
            let sge_a = Sge::new(key_a, IOVA_A + off, len);
            let rkey = Key((x >> 32) as u32);
            let raddr = u64::from(p & 0x3FF) * 8;
            let mut flags = SendFlags::empty();
            for (bit, f) in [
                (1, SendFlags::SIGNALED),
                (2, SendFlags::SOLICITED),
                (4, SendFlags::FENCE),
                (8, SendFlags::INLINE),
            ] {
                if p & bit != 0 {
                    flags |= f;
                }
            }
            // An atomic's 8-octet sink: 8-aligned in A, or the raw entry when bit 4 is set.
            let sink8 = if p & 0x10 != 0 {
                sge_a
            } else {
                Sge::new(key_a, IOVA_A + (off & !7), 8)
            };
            let _ = match kind {
                0 => e.post_recv(RecvWr::new(wr_id, vec![sge_a])),
                1 => {
                    let off2 = (x >> 24) & 0xFFF;
                    let len2 = ((x >> 36) & 0x3FF) as u32;
                    e.post_recv(RecvWr::new(
                        wr_id,
                        vec![
                            Sge::new(key_a, IOVA_A + off, len / 2),
                            Sge::new(key_a, IOVA_A + off2, len2),
                        ],
                    ))
                }
                2 => e.post_recv(RecvWr::new(
                    wr_id,
                    vec![Sge::new(key_b, IOVA_B + (off & 0x3FF), len & 0x7FF)],
                )),
                3 => e.post_send(SendWr::send(wr_id, vec![sge_a]).with_flags(flags)),
                4 => e.post_send(
                    SendWr::send_with_invalidate(wr_id, vec![sge_a], rkey).with_flags(flags),
                ),
                5 => e.post_send(SendWr::write(wr_id, vec![sge_a], rkey, raddr).with_flags(flags)),
                6 => {
                    let sink = (len != 0).then_some(sge_a);
                    e.post_send(SendWr::read(wr_id, sink, rkey, raddr).with_flags(flags))
                }
                7 => e.post_send(
                    SendWr::fetch_add(wr_id, sink8, rkey, raddr, x.rotate_left(7))
                        .with_flags(flags),
                ),
                8 => e.post_send(
                    SendWr::cmp_swap(wr_id, sink8, rkey, raddr, x & 0xFF, !x).with_flags(flags),
                ),
                9 => e.post_send(
                    SendWr::send_with_imm(wr_id, vec![sge_a], (x >> 32) as u32).with_flags(flags),
                ),
                10 => e.post_send(
                    SendWr::write_with_imm(wr_id, vec![sge_a], rkey, raddr, p.into())
                        .with_flags(flags),
                ),
                11 => {
                    if let Ok(err) = LlpError::try_from((x & 7) as u8) {
                        e.handle_llp_error(err);
                    }
                    Ok(())
                }
                12 => {
                    e.close();
                    Ok(())
                }
                13 => {
                    // A Read into region B (its sink STag is B's).
                    let sink = Sge::new(key_b, IOVA_B + (off & 0x3FF), len & 0x7FF);
                    e.post_send(SendWr::read(wr_id, Some(sink), rkey, raddr).with_flags(flags))
                }
                14 => {
                    // A gather list over both regions.
                    let b = Sge::new(key_b, IOVA_B + (off & 0x3FF), (len >> 2) & 0x3FF);
                    e.post_send(SendWr::send(wr_id, vec![sge_a, b]).with_flags(flags))
                }
                _ => {
                    // Pull exactly one ULPDU.
                    tx.drain(&mut e, 1);
                    drain = false;
                    Ok(())
                }
            };
        }
        if drain {
            tx.drain(&mut e, DRAIN_MAX);
        }
        let _ = (
            e.state(),
            e.counters(),
            e.rq_len(),
            e.sq_len(),
            e.wants_transmit(),
        );
    }
    tx.drain(&mut e, DRAIN_MAX);
    if tx.terminates > 0 {
        assert_ne!(
            e.state(),
            StreamState::Rts,
            "Terminate sent, stream still up"
        );
    }

    let g = buf.read();
    assert!(
        g[..OFF_A].iter().all(|&b| b == GUARD_BYTE),
        "write below region A"
    );
    assert!(
        g[OFF_A + LEN_A..OFF_B].iter().all(|&b| b == GUARD_BYTE),
        "write between regions A and B"
    );
    assert!(
        g[OFF_B + LEN_B..].iter().all(|&b| b == GUARD_BYTE),
        "write above region B"
    );
});
