#![no_main]
//! One sans-IO iWARP connection (`softrdma_iwarp::connection::Connection`: MPA startup, then
//! FPDU framing around the DDP/RDMAP engine) on a hostile peer's TCP byte stream, cut
//! anywhere, during startup and after it, between the local calls a driver and its ULP make.
//! Nothing may panic; every octet we send parses with the wire crate: our MPA Request or
//! Reply first, then whole FPDUs (RFC 5044 §4, CRC and Markers as negotiated, at most MULPDU)
//! whose ULPDUs parse as DDP/RDMAP segments; at most one Terminate and nothing after it
//! (RDMAP-69, RDMAP-73); nothing after a close but a Terminate already queued (RDMAP-94);
//! the octets around the two registered regions stay untouched, and region B (no remote
//! write) changes only where a local receive or Read sink exposed it; inbound Reads stay
//! within IRD, outbound within ORD, and one drain never yields more than the queued work
//! can account for.
//!
//! Input: octet 0 = configuration: bit 0 Responder (else Initiator), bit 1 our CRC wish,
//! bit 2 Markers wanted, bits 3-4 mode (0 Rev 2 client-server, 1 Rev 2 P2P, 2 Rev 1,
//! 3 Rev 2 with a shared receive queue), bit 5 early FPDUs (Responder) / FPDUs right after
//! the Reply allowed (Initiator), bits 6-7 FPDU sizing (MSS 1460, MSS 536, fixed 128,
//! MSS 9000). Then records, each led by a little-endian u16 `h`:
//! * `h & 0x8000 == 0`: `h & 0x3FF` octets of the peer's stream follow. Bit 10: they are one
//!   ULPDU instead, framed here as the peer frames (negotiated CRC and Markers at the
//!   stream's position), after one `cut` octet: the FPDU goes in reads of `cut & 0x7F`
//!   octets (0: one read), the last held back until the next stream record if `cut & 0x80`
//!   (so local actions come in between); bits 11-12 then patch in a real STag (1: region A,
//!   2: region B, 3: A with a wrong consumer key) where the segment names one of ours. Bit
//!   13: read like a driver with direct placement (`next_read`, `rx_placed`). Bit 14: no
//!   drain after.
//! * `h & 0x8000 != 0`: a local action, `(h >> 11) & 0xF` = kind, `h & 0x7FF` = flags (bit
//!   10: no drain after), then 8 octets of parameters `x` (little-endian, zero-padded).
//!   Kinds: 0 receive in A, 1 receive in B, 2 Send, 3 Send with Invalidate, 4 Write, 5 Read
//!   into A, 6 Read into B, 7 Send / Write with immediate, 8 FetchAdd / CmpSwap, 9 accept,
//!   10 reject, 11 time passes (`handle_timeout` when due), 12 EOF / write failure /
//!   `wants_transmit` then a poll, 13 close, 14 one bounded poll (and a partial `TxBuf`
//!   write), 15 SRQ resume, `set_data_path` or B invalidated locally. `x`: bits 0-11 offset
//!   and 12-24 length of an entry in A, 25-34 and 35-45 of one in B, 32-63 the remote STag;
//!   flags: 0x20 a B entry too, 0x40 fence, 0x80 inline, 0x100 signaled, 0x200 solicited,
//!   low bits the variant and (x 8) the remote address.
//!
//! Even-length inputs transmit into a `Vec`; odd-length ones through a `TxBuf` that
//! references registered memory and is written out in input-chosen pieces.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use softrdma_iwarp::connection::{
    ConnEvent, ConnState, Connection, ConnectionConfig, FpduSizing, NextRead,
};
use softrdma_iwarp::rdmap::{QpConfig, QpEvent, StreamState};
use softrdma_iwarp::startup::{Negotiated, PeerParams, Role, Rtr, RtrSet, StartupConfig};
use softrdma_iwarp::verbs_types::{RecvWr, SendFlags, SendWr, Sge};
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId, QpId, TxBuf, TxSink};
use softrdma_wire::ddp;
use softrdma_wire::mpa::{self, FrameKind, FrameRepr};
use softrdma_wire::rdmap::{MASK_OPCODE, Opcode, Segment, TerminateLayout};

const GUARD: usize = 256;
const GUARD_BYTE: u8 = 0xA5;
/// Region A: every right, at TO 0.
const LEN_A: usize = 4096;
const IOVA_A: u64 = 0;
/// Region B: local write and remote read, no remote write; fast-registered, so a Send with
/// Invalidate may revoke it.
const LEN_B: usize = 1024;
const IOVA_B: u64 = 0x1_0000;
const OFF_A: usize = GUARD;
const OFF_B: usize = GUARD + LEN_A + GUARD;
const TOTAL: usize = OFF_B + LEN_B + GUARD;
const PD: PdId = PdId(1);
const SQ_DEPTH: u32 = 64;
const RQ_DEPTH: u32 = 64;
/// The largest payload one of our send requests carries: one entry in A, one in B.
const MAX_WR: usize = LEN_A + LEN_B;

/// What B held before anything ran.
fn b_fill(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(3)
}

/// Checks what we transmit, as the peer would read it.
struct TxCheck {
    role: Role,
    /// Octets written and not parsed yet (a `TxBuf` writes in pieces).
    pending: Vec<u8>,
    startup_sent: bool,
    /// Our Reply said R=1: nothing may follow it.
    rejected: bool,
    /// What FPDUs look like: Markers, CRC, MULPDU (from the Established event).
    fpdus: Option<(bool, bool, u16)>,
    /// Stream position of the next FPDU (Markers count from the first octet after the
    /// startup frame, RFC 5044 §7.1.2).
    pos: u32,
    fpdus_sent: u64,
    terminates: usize,
    /// Our first FPDU is the RTR (Initiator, P2P), framed outside the engine (RFC 6581).
    rtr_first: bool,
    /// Every poll is parsed at once (a `Vec`, not a `TxBuf`).
    vec_mode: bool,
    /// The engine's ULPDUs seen.
    engine_ulpdus: u64,
    /// `close` was called when the engine had handed out this many ULPDUs, with a Terminate
    /// queued or not: after those, only that Terminate (RDMAP-94).
    closed: Option<(u64, bool)>,
    /// The stream was cut (a write failed): nothing after is checked.
    cut: bool,
    ulpdu: Vec<u8>,
}

impl TxCheck {
    /// Parses what `bytes` completes; returns the frames parsed.
    fn feed(&mut self, bytes: &[u8]) -> usize {
        if self.cut {
            return 0;
        }
        self.pending.extend_from_slice(bytes);
        let mut frames = 0;
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            if rest.is_empty() {
                break;
            }
            if !self.startup_sent {
                let Some(len) = FrameRepr::frame_len(rest).expect("our startup frame") else {
                    break;
                };
                if rest.len() < len {
                    break;
                }
                let f = FrameRepr::parse(&rest[..len]).expect("our startup frame parses");
                let want = match self.role {
                    Role::Initiator => FrameKind::Request,
                    Role::Responder => FrameKind::Reply,
                };
                assert_eq!(f.kind, want, "we sent the wrong startup frame");
                assert!(f.rev == 1 || f.rev == 2, "we sent Rev {}", f.rev);
                if f.rev == 2 {
                    f.rev2_params()
                        .expect("our Rev-2 frame has the IRD/ORD word");
                }
                self.rejected = f.r;
                self.startup_sent = true;
                at += len;
                frames += 1;
                continue;
            }
            assert!(!self.rejected, "octets after our reject: {rest:02x?}");
            let (markers, crc, mulpdu) = self.fpdus.expect("an FPDU before Full Operation");
            self.ulpdu.resize(mpa::MAX_ULPDU, 0);
            let info = match mpa::decode_fpdu(rest, self.pos, markers, &mut self.ulpdu) {
                Ok(Some(info)) => info,
                Ok(None) => break,
                Err(e) => panic!("our FPDU does not parse: {e:?}: {rest:02x?}"),
            };
            if crc {
                assert!(info.crc_ok(), "our FPDU's CRC is wrong");
            } else {
                assert_eq!(
                    info.crc_field, 0,
                    "CRC field not zero without CRCs (MPA-14)"
                );
            }
            assert!(
                info.ulpdu_len <= mulpdu,
                "ULPDU of {} octets above MULPDU {mulpdu}",
                info.ulpdu_len
            );
            let u = &self.ulpdu[..usize::from(info.ulpdu_len)];
            ddp::Repr::parse(u).expect("our ULPDU has a DDP header");
            let seg = Segment::parse(u)
                .unwrap_or_else(|e| panic!("our ULPDU does not parse: {e:?}: {u:02x?}"));
            assert!(self.terminates == 0, "a ULPDU after our Terminate: {seg:?}");
            let terminate = seg.opcode() == Opcode::Terminate;
            if terminate {
                Segment::parse_with_layout(u, TerminateLayout::Rfc5040)
                    .expect("our Terminate in the RFC 5040 layout");
                self.terminates += 1;
            }
            if self.rtr_first && self.fpdus_sent == 0 {
                assert!(is_zero_length_write(u), "the RTR first (RFC 6581): {seg:?}");
                // After a close only ahead of the Terminate queued then (RDMAP-94).
                if let Some((_, term_queued)) = self.closed
                    && self.vec_mode
                {
                    assert!(term_queued, "the RTR after close");
                }
            } else {
                if let Some((emitted, term_queued)) = self.closed
                    && self.engine_ulpdus >= emitted
                {
                    assert!(
                        terminate && term_queued,
                        "after close, something other than a queued Terminate: {seg:?}"
                    );
                }
                self.engine_ulpdus += 1;
            }
            self.fpdus_sent += 1;
            self.pos = self.pos.wrapping_add(info.consumed as u32);
            at += info.consumed;
            frames += 1;
        }
        self.pending.drain(..at);
        frames
    }
}

fn is_zero_length_write(u: &[u8]) -> bool {
    matches!(
        Segment::parse(u).map(|s| (s.opcode(), s.ddp)),
        Ok((Opcode::RdmaWrite, ddp::Repr::Tagged { .. })) if u.len() == ddp::TAGGED_HEADER_LEN
    )
}

/// Writes `key` at `at` when the ULPDU is long enough.
fn put_key(u: &mut [u8], at: usize, key: Key) {
    if let Some(s) = u.get_mut(at..at + 4) {
        s.copy_from_slice(&key.0.to_be_bytes());
    }
}

/// Puts `key` where the segment names an STag of ours: a tagged segment's STag, the
/// Invalidate STag of a Send with Invalidate (RFC 5040 §4.3), a Read Request's Data Source
/// STag (§4.4), an Atomic Request's Remote STag (RFC 7306 §5).
fn patch(u: &mut [u8], key: Key) {
    let (Some(&control), Some(&rdmap)) = (u.first(), u.get(1)) else {
        return;
    };
    if control & ddp::FLAG_TAGGED != 0 {
        put_key(u, 2, key);
        return;
    }
    let h = ddp::UNTAGGED_HEADER_LEN;
    match Opcode::try_from(rdmap & MASK_OPCODE) {
        Ok(Opcode::SendWithInvalidate | Opcode::SendWithSeAndInvalidate) => put_key(u, 2, key),
        Ok(Opcode::RdmaReadRequest) => put_key(u, h + 16, key),
        Ok(Opcode::AtomicRequest) => put_key(u, h + 8, key),
        _ => {}
    }
}

/// The parameters of a record, zero-padded at the end of the input.
fn take8(rest: &mut &[u8]) -> u64 {
    let mut x = [0u8; 8];
    let n = rest.len().min(8);
    x[..n].copy_from_slice(&rest[..n]);
    *rest = &rest[n..];
    u64::from_le_bytes(x)
}

struct Harness {
    conn: Connection,
    now: Instant,
    role: Role,
    crc: bool,
    markers: bool,
    fpdu: FpduSizing,
    emss: u32,
    buf: Arc<Buffer>,
    key_a: Key,
    key_b: Key,
    /// Octets of B a local receive or Read sink may have had written.
    exposed_b: Vec<bool>,
    /// The peer's first octets (its startup frame) and all octets handed over.
    rx_head: Vec<u8>,
    fed: u64,
    request: Option<PeerParams>,
    established: Option<Negotiated>,
    tx: TxCheck,
    /// `Some`: transmit through a `TxBuf` (odd-length inputs).
    txbuf: Option<TxBuf>,
    /// The peer's FIN came while established: the engine's ULPDUs handed out by then; it
    /// hands out no more (RFC 5044 §8 code 1, RDMAP-92), nor does the connection frame any.
    lost: Option<u64>,
    local_errors: usize,
    wr_id: u64,
}

impl Harness {
    /// Octets of the peer's startup frame, once its header is in.
    fn peer_frame_len(&self) -> Option<usize> {
        FrameRepr::frame_len(&self.rx_head).ok().flatten()
    }

    /// Where the next octet handed over sits in the peer's FPDU stream.
    fn rx_pos(&self) -> u32 {
        let start = self.peer_frame_len().unwrap_or(0) as u64;
        self.fed.saturating_sub(start) as u32
    }

    /// Hands `bytes` over as reads from TCP; `direct`: as a driver with direct placement
    /// reads them (the payload straight into the window's memory, as a socket read would).
    fn input(&mut self, bytes: &[u8], direct: bool) {
        let cap = mpa::FRAME_HEADER_LEN + mpa::MAX_PRIVATE_DATA;
        let k = cap.saturating_sub(self.rx_head.len()).min(bytes.len());
        self.rx_head.extend_from_slice(&bytes[..k]);
        self.fed += bytes.len() as u64;
        if !direct {
            self.conn.handle_input(self.now, bytes);
            self.events();
            return;
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            match self.conn.next_read() {
                NextRead::Direct(w) => {
                    assert!(w.len > 0, "an empty window");
                    let k = w.len.min(rest.len());
                    let src = &rest[..k];
                    match w.target.write_with(w.at, k, |m| m.copy_from_slice(src)) {
                        Ok(()) => self.conn.rx_placed(Ok(src)),
                        Err(e) => {
                            // Revoked meanwhile: the octets go through the buffer and are
                            // dropped.
                            self.conn.rx_placed(Err(e));
                            self.conn.handle_input(self.now, src);
                        }
                    }
                    rest = &rest[k..];
                    let t = w.tail.min(rest.len());
                    self.conn.handle_input(self.now, &rest[..t]);
                    rest = &rest[t..];
                }
                NextRead::Buffered(limit) => {
                    let n = limit.clamp(1, rest.len());
                    self.conn.handle_input(self.now, &rest[..n]);
                    rest = &rest[n..];
                }
            }
            self.events();
        }
    }

    fn events(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            match e {
                ConnEvent::ConnectRequest {
                    private_data,
                    params,
                } => {
                    assert_eq!(self.role, Role::Responder, "a Request at the Initiator");
                    assert!(self.request.is_none(), "two Requests reported");
                    assert!(private_data.len() <= mpa::MAX_PRIVATE_DATA);
                    self.request = Some(params);
                }
                ConnEvent::Established { negotiated, mulpdu } => {
                    assert!(self.established.is_none(), "established twice");
                    self.check_negotiated(&negotiated, mulpdu);
                    self.tx.fpdus = Some((negotiated.markers_tx, negotiated.crc, mulpdu));
                    self.established = Some(negotiated);
                }
                ConnEvent::Rejected { .. } => {
                    assert_eq!(self.role, Role::Initiator, "a Reject at the Responder");
                }
                ConnEvent::StartupFailed(_) => {}
                ConnEvent::Qp(QpEvent::LocalError(_)) => {
                    self.local_errors += 1;
                    assert!(self.local_errors <= 1, "a second local error (RDMAP-102)");
                }
                ConnEvent::Qp(_) => {}
            }
        }
        while self.conn.engine_mut().poll_completion().is_some() {}
    }

    fn check_negotiated(&self, n: &Negotiated, mulpdu: u16) {
        assert_eq!(n.initiator, self.role == Role::Initiator);
        // MPA-56: Markers toward the side that asked; MPA-30: CRCs if either asked.
        assert_eq!(n.markers_rx, self.markers, "Markers we asked for");
        if self.crc {
            assert!(n.crc, "CRCs asked for, not used");
        }
        if let Some(p) = &self.request {
            assert_eq!(n.crc, self.crc || p.crc, "CRC negotiation");
            assert_eq!(n.markers_tx, p.markers, "Markers the Initiator asked for");
            assert_eq!(n.rev, p.rev, "the Responder answers with the Request's Rev");
        }
        let want = match self.fpdu {
            FpduSizing::PathMss => mpa::mulpdu(self.emss, n.markers_tx),
            FpduSizing::Fixed(m) => m.clamp(mpa::MULPDU_MIN, mpa::MAX_ULPDU as u16),
        };
        assert_eq!(mulpdu, want, "MULPDU");
    }

    /// One bounded poll; returns the octets added.
    fn poll(&mut self, max: usize) -> usize {
        let n = match self.txbuf.as_mut() {
            None => {
                let mut out = Vec::new();
                let n = self.conn.poll_transmit_bounded(&mut out, max);
                assert_eq!(n, out.len(), "poll_transmit_bounded length");
                let fpdus = self.tx.fpdus_sent;
                let frames = self.tx.feed(&out);
                if self.lost.is_some() {
                    assert_eq!(self.tx.fpdus_sent, fpdus, "an FPDU after the LLP was lost");
                }
                if !self.tx.cut {
                    assert!(self.tx.pending.is_empty(), "a frame cut at bound {max}");
                    assert!(
                        n <= max || frames == 1,
                        "{n} octets in {frames} frames over bound {max}"
                    );
                }
                n
            }
            Some(t) => {
                let before = t.len();
                let n = self.conn.poll_transmit_into(t, max);
                assert_eq!(t.len() - before, n, "poll_transmit_into length");
                n
            }
        };
        self.events();
        n
    }

    /// Writes up to `max` octets of the `TxBuf` as a socket takes them; returns the octets
    /// written.
    fn write(&mut self, max: usize) -> usize {
        let Some(t) = self.txbuf.as_mut() else {
            return 0;
        };
        let mut wire = Vec::new();
        let r = t.write_with(|iov| {
            for s in iov {
                let k = s.len().min(max - wire.len());
                wire.extend_from_slice(&s[..k]);
            }
            Ok::<_, ()>(wire.len())
        });
        match r {
            Ok(_) => {
                self.conn.transmitted(t);
                self.tx.feed(&wire);
            }
            // A reference was revoked under it: the stream stops here.
            Err(_) => self.transmit_failed(),
        }
        self.events();
        wire.len()
    }

    /// A write failed: the stream ends where it was cut, nothing more is written.
    fn transmit_failed(&mut self) {
        if let Some(t) = self.txbuf.as_mut() {
            t.clear();
        }
        self.conn.transmit_failed();
        self.tx.cut = true;
        self.events();
    }

    /// Everything the queued work can produce: two ULPDUs (Immediate Data and its Send or
    /// Write) per send request, one per response owed, a Terminate, the RTR and a startup
    /// frame, each framed in at most 128 octets beyond its payload, payload octets at most
    /// doubled by headers, PAD, CRC and Markers (MULPDU >= 128).
    fn backlog_bound(&self) -> usize {
        let e = self.conn.engine();
        let owed = e.inbound_reads() + e.inbound_atomics();
        let msgs = 2 * e.sq_len() + owed + 3;
        let payload = e.sq_len() * MAX_WR
            + e.inbound_reads() * LEN_A
            + mpa::FRAME_HEADER_LEN
            + mpa::MAX_PRIVATE_DATA;
        msgs * 128 + payload * 2
    }

    /// Sends everything ready.
    fn drain(&mut self) {
        let bound = self.backlog_bound();
        let mut total = 0;
        for _ in 0..16 {
            let n = self.poll(usize::MAX);
            total += n;
            while self.txbuf.as_ref().is_some_and(|t| t.len() > 0) {
                if self.write(usize::MAX) == 0 {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        assert!(
            total <= bound,
            "{total} octets from one drain, more than the queued work ({bound})"
        );
    }

    /// Posts a receive; its entry in B (`b`), if any, is the peer's to write with a Send.
    fn post_recv(&mut self, wr: RecvWr, b: Option<(u64, u32)>) {
        if self.conn.engine_mut().post_recv(wr).is_ok()
            && let Some(b) = b
        {
            self.expose_b(b);
        }
    }

    fn expose_b(&mut self, (addr, len): (u64, u32)) {
        let lo = addr.saturating_sub(IOVA_B).min(LEN_B as u64) as usize;
        let hi = (lo + len as usize).min(LEN_B);
        self.exposed_b[lo..hi].fill(true);
    }

    /// Invariants that hold between any two calls.
    fn check(&self) {
        let e = self.conn.engine();
        let c = e.config();
        assert!(
            e.inbound_reads() + e.inbound_atomics() <= usize::from(c.ird),
            "{} inbound Reads / atomics over IRD {} (RDMAP-91)",
            e.inbound_reads() + e.inbound_atomics(),
            c.ird
        );
        assert!(
            e.outstanding_reads() + e.outstanding_atomics() <= usize::from(c.ord),
            "outbound Reads / atomics over ORD {} (RDMAP-90)",
            c.ord
        );
        assert!(e.sq_len() <= SQ_DEPTH as usize, "send queue over its depth");
        assert!(
            e.rq_len() <= RQ_DEPTH as usize,
            "receive queue over its depth"
        );
        if self.tx.terminates > 0 {
            assert_ne!(
                e.state(),
                StreamState::Rts,
                "Terminate sent, stream still up"
            );
        }
        if let Some(n) = self.lost {
            assert_eq!(e.counters().ulpdus_tx, n, "a ULPDU after the LLP was lost");
        }
    }

    /// Our Responder must not send FPDUs before the Initiator's first one (MPA-73), so at
    /// least an FPDU's worth (8 octets) must have come after the Request, unless early
    /// FPDUs are on and no RTR was negotiated (the RTR is that first FPDU, RFC 6581).
    fn check_mpa_73(&self, early: bool) {
        let early = early && self.established.as_ref().is_some_and(|n| n.rtr.is_none());
        if self.role == Role::Responder && !early && self.tx.fpdus_sent > 0 {
            let after = self
                .fed
                .saturating_sub(self.peer_frame_len().unwrap_or(0) as u64);
            assert!(
                after >= 8,
                "our Responder sent an FPDU before the Initiator's first"
            );
        }
    }

    fn memory(&self) {
        let g = self.buf.read();
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
        for (i, &b) in g[OFF_B..OFF_B + LEN_B].iter().enumerate() {
            assert!(
                self.exposed_b[i] || b == b_fill(i),
                "octet {i} of region B (no remote write) written"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&conf, mut rest)) = data.split_first() else {
        return;
    };
    let role = if conf & 1 != 0 {
        Role::Responder
    } else {
        Role::Initiator
    };
    let crc = conf & 2 != 0;
    let markers = conf & 4 != 0;
    let mode = (conf >> 3) & 3;
    let early = conf & 0x20 != 0;
    let (emss, fpdu) = match conf >> 6 {
        0 => (1460, FpduSizing::PathMss),
        1 => (536, FpduSizing::PathMss),
        2 => (1460, FpduSizing::Fixed(128)),
        _ => (9000, FpduSizing::PathMss),
    };

    let keys = Arc::new(KeyTable::with_seed(1));
    let buf = Buffer::from_vec(vec![GUARD_BYTE; TOTAL]);
    buf.write()[OFF_A..OFF_A + LEN_A].fill(0);
    for (i, b) in buf.write()[OFF_B..OFF_B + LEN_B].iter_mut().enumerate() {
        *b = b_fill(i);
    }
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
    let key_b = keys
        .reg_fast_mr(
            PD,
            buf.clone(),
            OFF_B,
            LEN_B,
            IOVA_B,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let bad_a = Key(key_a.0 ^ 0x5A);

    let startup = StartupConfig {
        rev: if mode == 2 { 1 } else { 2 },
        crc,
        markers,
        // The Initiator's IRD takes the Linux Responders' ORD of 128 (captures).
        ird: 128,
        ord: 16,
        // Our Initiator sends only the zero-length Write RTR (see `Connection::establish`).
        p2p: (mode == 1).then_some(match role {
            Role::Initiator => RtrSet::only(Rtr::ZeroLengthWrite),
            Role::Responder => RtrSet::ALL,
        }),
        private_data: match role {
            Role::Initiator => b"iwarp_connection".to_vec(),
            Role::Responder => Vec::new(),
        },
        timeout: Duration::from_secs(10),
        allow_early_fpdus: early,
    };
    let mut qp = QpConfig::new(PD, QpId(7));
    qp.sq_depth = SQ_DEPTH;
    qp.rq_depth = RQ_DEPTH;
    qp.max_sge = 4;
    let mut cfg = ConnectionConfig::new(role, startup, qp, emss);
    cfg.fpdu = fpdu;
    cfg.early_fpdus = early;
    cfg.srq = mode == 3;
    cfg.rx_direct_min = 1;
    let t0 = Instant::now();
    let conn = Connection::new(cfg, keys.clone(), t0).expect("a valid configuration");

    let mut h = Harness {
        conn,
        now: t0,
        role,
        crc,
        markers,
        fpdu,
        emss,
        buf: buf.clone(),
        key_a,
        key_b,
        exposed_b: vec![false; LEN_B],
        rx_head: Vec::new(),
        fed: 0,
        request: None,
        established: None,
        tx: TxCheck {
            role,
            pending: Vec::new(),
            startup_sent: false,
            rejected: false,
            fpdus: None,
            pos: 0,
            fpdus_sent: 0,
            terminates: 0,
            rtr_first: role == Role::Initiator && mode == 1,
            vec_mode: data.len().is_multiple_of(2),
            engine_ulpdus: 0,
            closed: None,
            cut: false,
            ulpdu: Vec::new(),
        },
        txbuf: (!data.len().is_multiple_of(2)).then(|| TxBuf::new().with_min_reference(1)),
        lost: None,
        local_errors: 0,
        wr_id: 0,
    };
    let mut early_tx = early;
    let mut fpdu_buf = Vec::new();
    // The end of a framed FPDU held back for the next stream record.
    let mut held_back = Vec::new();
    let mut ulpdu = Vec::new();

    while rest.len() >= 2 {
        let hd = u16::from_le_bytes([rest[0], rest[1]]);
        rest = &rest[2..];
        let drain;
        if hd & 0x8000 == 0 {
            drain = hd & 0x4000 == 0;
            let direct = hd & 0x2000 != 0;
            let framed = hd & 0x400 != 0;
            let cut = if framed {
                let Some((&c, r)) = rest.split_first() else {
                    break;
                };
                rest = r;
                usize::from(c)
            } else {
                0
            };
            let n = usize::from(hd & 0x3FF).min(rest.len());
            let (chunk, r) = rest.split_at(n);
            if !held_back.is_empty() {
                let tail = std::mem::take(&mut held_back);
                h.input(&tail, direct);
            }
            rest = r;
            if !framed {
                h.input(chunk, direct);
            } else {
                ulpdu.clear();
                ulpdu.extend_from_slice(chunk);
                match (hd >> 11) & 3 {
                    1 => patch(&mut ulpdu, h.key_a),
                    2 => patch(&mut ulpdu, h.key_b),
                    3 => patch(&mut ulpdu, bad_a),
                    _ => {}
                }
                // As the peer frames: the negotiated CRC and Markers, at this position.
                let (m, c) = h
                    .established
                    .as_ref()
                    .map_or((false, crc), |n| (n.markers_rx, n.crc));
                let pos = h.rx_pos() & if m { !3 } else { !0 };
                fpdu_buf.resize(mpa::encoded_len(ulpdu.len(), pos, m), 0);
                let len = mpa::encode_fpdu(&[&ulpdu], pos, m, c, &mut fpdu_buf)
                    .expect("a ULPDU of at most 1023 octets frames");
                let size = if cut & 0x7F == 0 { len } else { cut & 0x7F };
                let frame = std::mem::take(&mut fpdu_buf);
                let mut pieces = frame[..len].chunks(size).peekable();
                while let Some(piece) = pieces.next() {
                    if cut & 0x80 != 0 && pieces.peek().is_none() {
                        held_back.extend_from_slice(piece);
                    } else {
                        h.input(piece, direct);
                    }
                }
                fpdu_buf = frame;
            }
        } else {
            let kind = (hd >> 11) & 0xF;
            let p = hd & 0x7FF;
            let x = take8(&mut rest);
            drain = p & 0x400 == 0;
            h.wr_id += 1;
            let wr_id = h.wr_id;
            // Entries in A (may stray out of it: a post error) and in B.
            let off = x & 0xFFF;
            let len = ((x >> 12) & 0x1FFF) as u32;
            let sge_a = Sge::new(h.key_a, IOVA_A + off, len);
            let b_off = (x >> 25) & 0x3FF;
            let b_len = ((x >> 35) & 0x7FF) as u32;
            let sge_b = Sge::new(h.key_b, IOVA_B + b_off, b_len);
            let rkey = Key((x >> 32) as u32);
            let raddr = u64::from(p & 0xFF) * 8;
            let mut flags = SendFlags::empty();
            for (bit, f) in [
                (0x100, SendFlags::SIGNALED),
                (0x200, SendFlags::SOLICITED),
                (0x40, SendFlags::FENCE),
                (0x80, SendFlags::INLINE),
            ] {
                if p & bit != 0 {
                    flags |= f;
                }
            }
            // A gather list in A, and B too with flag bit 5.
            let sgl = if p & 0x20 != 0 {
                vec![sge_a, sge_b]
            } else {
                vec![sge_a]
            };
            let b_at = (IOVA_B + b_off, b_len);
            let with_b = (p & 0x20 != 0).then_some(b_at);
            let e = h.conn.engine_mut();
            match kind {
                0 => h.post_recv(RecvWr::new(wr_id, sgl), with_b),
                1 => h.post_recv(RecvWr::new(wr_id, [sge_b]), Some(b_at)),
                2 => {
                    let _ = e.post_send(SendWr::send(wr_id, sgl).with_flags(flags));
                }
                3 => {
                    let _ = e.post_send(
                        SendWr::send_with_invalidate(wr_id, sgl, rkey).with_flags(flags),
                    );
                }
                4 => {
                    let _ = e.post_send(SendWr::write(wr_id, sgl, rkey, raddr).with_flags(flags));
                }
                5 => {
                    let sink = (len != 0).then_some(sge_a);
                    let _ = e.post_send(SendWr::read(wr_id, sink, rkey, raddr).with_flags(flags));
                }
                6 => {
                    let wr = SendWr::read(wr_id, Some(sge_b), rkey, raddr).with_flags(flags);
                    if e.post_send(wr).is_ok() {
                        h.expose_b(b_at);
                    }
                }
                7 => {
                    let wr = if p & 1 == 0 {
                        SendWr::send_with_imm(wr_id, sgl, (x >> 32) as u32)
                    } else {
                        SendWr::write_with_imm(wr_id, sgl, rkey, raddr, p.into())
                    };
                    let _ = e.post_send(wr.with_flags(flags));
                }
                8 => {
                    // An atomic's 8-octet sink, 8-aligned in A (the raw entry with bit 1).
                    let sink = if p & 2 != 0 {
                        sge_a
                    } else {
                        Sge::new(h.key_a, IOVA_A + (off & !7), 8)
                    };
                    let wr = if p & 1 == 0 {
                        SendWr::fetch_add(wr_id, sink, rkey, raddr, x.rotate_left(7))
                    } else {
                        SendWr::cmp_swap(wr_id, sink, rkey, raddr, x & 0xFF, !x)
                    };
                    let _ = e.post_send(wr.with_flags(flags));
                }
                9 => {
                    // Accept with some Private Data and an IRD / ORD (some out of range).
                    let pd = vec![0x5C; (x & 0x3FF) as usize];
                    let pick = |v: u64| -> u16 {
                        [0, 1, 4, 16, 0x3FFF, 0x4000, 2, (v >> 3) as u16 & 0x3FFF][(v & 7) as usize]
                    };
                    let _ = h.conn.accept(&pd, pick(x >> 16), pick(x >> 32));
                }
                10 => {
                    let pd = vec![0x3C; (x & 0x3FF) as usize];
                    let _ = h.conn.reject(&pd);
                }
                11 => {
                    // Time passes; the timer is served when due (flag bit 0: regardless).
                    h.now += Duration::from_millis(x & 0xFFFF);
                    let due = h.conn.poll_timeout();
                    let startup = h.conn.state() == ConnState::Startup;
                    if due.is_some_and(|d| h.now >= d) || p & 1 != 0 {
                        let before = h.conn.state();
                        h.conn.handle_timeout(h.now);
                        match due {
                            Some(d) if h.now >= d && startup => {
                                assert_eq!(h.conn.state(), ConnState::Failed, "timer expired");
                            }
                            _ => assert_eq!(h.conn.state(), before, "an early timer acted"),
                        }
                    }
                }
                12 => match p & 3 {
                    0 => {
                        let up = h.conn.state() == ConnState::Established;
                        h.conn.handle_eof();
                        if up && h.lost.is_none() {
                            h.lost = Some(h.conn.engine().counters().ulpdus_tx);
                        }
                    }
                    1 => h.transmit_failed(),
                    // A driver polls when told there is something to send, and only then.
                    _ => {
                        let wants = h.conn.wants_transmit();
                        let n = h.poll(usize::MAX);
                        assert_eq!(wants, n > 0, "wants_transmit, then {n} octets");
                    }
                },
                13 => {
                    let e = h.conn.engine();
                    let terminating = e.state() == StreamState::Terminating;
                    let emitted = e.counters().ulpdus_tx;
                    h.conn.close();
                    if h.tx.closed.is_none() {
                        h.tx.closed = Some((emitted, terminating));
                    }
                }
                14 => {
                    // One bounded poll; a TxBuf then writes a piece.
                    let max = match p & 3 {
                        0 => (x & 0xFF) as usize,
                        1 => (x & 0xFFF) as usize,
                        2 => (x & 0xFFFF) as usize,
                        _ => usize::MAX,
                    };
                    h.poll(max);
                    h.write(((x >> 16) & 0xFFFF) as usize);
                }
                _ => match p & 3 {
                    // SRQ: a shared receive for the held Send (flag bit 2: into B), then on.
                    0 | 1 => {
                        if p & 1 == 0 && h.conn.needs_recv() {
                            h.post_recv(RecvWr::new(wr_id, sgl), with_b);
                        }
                        let now = h.now;
                        h.conn.handle_input(now, &[]);
                    }
                    // The data path as the ULP chooses it before establishment.
                    2 => {
                        let sizing = if x & 1 == 0 {
                            FpduSizing::PathMss
                        } else {
                            FpduSizing::Fixed((x >> 8) as u16)
                        };
                        let (srq, e2) = (x & 2 != 0, x & 4 != 0);
                        if h.conn.set_data_path(qp, sizing, srq, e2).is_ok() {
                            h.fpdu = sizing;
                            early_tx = e2;
                        }
                    }
                    // B revoked under whatever references it (a window, a `TxBuf`, a sink).
                    _ => {
                        let _ = keys.invalidate_local(h.key_b, PD);
                    }
                },
            }
            h.events();
        }
        if drain {
            h.drain();
        }
        h.check_mpa_73(early_tx);
        h.check();
    }
    h.drain();
    h.check_mpa_73(early_tx);
    h.check();
    if !h.tx.cut {
        assert!(h.tx.pending.is_empty(), "a frame left half written");
    }
    h.memory();
});
