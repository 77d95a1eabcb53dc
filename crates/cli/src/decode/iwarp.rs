//! Following one TCP connection: MPA startup, then FPDUs carrying DDP/RDMAP.

use std::collections::VecDeque;

use softrdma_wire::mpa;
use softrdma_wire::rdmap;

use super::record::Record;
use super::tcp::{Delivered, HalfStream};
use super::{Ctx, rpc};

/// What one direction of the connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing seen yet.
    Unknown,
    /// Plain TCP payload (not MPA): skipped.
    Stream,
    /// MPA startup frame expected next.
    Startup,
    /// Startup frame done; waiting for the peer's frame to learn CRC/markers.
    AwaitNegotiation,
    /// Full Operation (RFC 5044 §7.1): FPDUs.
    Fpdu { markers: bool },
    /// An error stopped decoding (RFC 5044 §8: nothing more is delivered).
    Stopped,
}

#[derive(Debug)]
struct Direction {
    half: HalfStream,
    /// Undecoded stream octets, starting at stream offset `buf_off`.
    buf: Vec<u8>,
    buf_off: u64,
    /// Which frame delivered which range (for attributing messages).
    ranges: VecDeque<Delivered>,
    mode: Mode,
    /// Offset from SeqStart of `buf[0]` once in Full Operation (mod 2^32).
    fpdu_pos: u32,
    frame: Option<mpa::FrameKind>,
    /// The ULPDU scratch buffer, allocated when the stream turns out to be MPA
    /// (largest ULPDU: 65535 octets).
    ulpdu: Vec<u8>,
}

impl Default for Direction {
    fn default() -> Self {
        Direction {
            half: HalfStream::default(),
            buf: Vec::new(),
            buf_off: 0,
            ranges: VecDeque::new(),
            mode: Mode::Unknown,
            fpdu_pos: 0,
            frame: None,
            ulpdu: Vec::new(),
        }
    }
}

/// Negotiated MPA parameters, from the Request and Reply.
#[derive(Debug, Clone, Copy)]
struct Negotiated {
    initiator: usize,
    req_m: bool,
    rep_m: bool,
    crc: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Connection {
    dirs: [Direction; 2],
    request: Option<(usize, bool, bool)>,
    reply: Option<(usize, bool, bool)>,
    negotiated: Option<Negotiated>,
}

impl Direction {
    fn frame_of(&mut self, end: u64) -> u64 {
        // The frame that delivered stream octet `end - 1`.
        while let Some(d) = self.ranges.front() {
            if d.end < end {
                self.ranges.pop_front();
            } else {
                return d.frame;
            }
        }
        0
    }

    fn consume(&mut self, n: usize) {
        self.buf.drain(..n);
        self.buf_off += n as u64;
    }
}

impl Connection {
    pub(crate) fn segment(
        &mut self,
        ctx: &Ctx,
        dir: usize,
        seq: u32,
        syn: bool,
        payload: &[u8],
        out: &mut Vec<Record>,
    ) {
        let d = &mut self.dirs[dir];
        for (range, bytes) in d.half.segment(ctx.frame, seq, syn, payload) {
            d.ranges.push_back(range);
            if matches!(d.mode, Mode::Stream | Mode::Stopped) {
                // Keep nothing of streams we do not decode.
                d.buf_off += bytes.len() as u64;
            } else {
                d.buf.extend_from_slice(&bytes);
            }
        }
        self.process(ctx, dir, out);
        // A Reply can release FPDUs held in the other direction.
        if self.negotiated.is_some() && self.dirs[1 - dir].mode == Mode::AwaitNegotiation {
            self.process(ctx, 1 - dir, out);
        }
    }

    fn process(&mut self, ctx: &Ctx, dir: usize, out: &mut Vec<Record>) {
        loop {
            let mode = self.dirs[dir].mode;
            let progressed = match mode {
                Mode::Unknown => self.classify(dir),
                Mode::Startup => self.startup_frame(ctx, dir, out),
                Mode::AwaitNegotiation => match self.negotiated {
                    Some(n) => {
                        let markers = if dir == n.initiator { n.rep_m } else { n.req_m };
                        self.dirs[dir].mode = Mode::Fpdu { markers };
                        true
                    }
                    None => false,
                },
                Mode::Fpdu { markers } => self.fpdu(ctx, dir, markers, out),
                Mode::Stream | Mode::Stopped => {
                    let d = &mut self.dirs[dir];
                    let n = d.buf.len();
                    d.consume(n);
                    false
                }
            };
            if !progressed {
                return;
            }
        }
    }

    /// Decide from the first octets whether this direction speaks MPA.
    fn classify(&mut self, dir: usize) -> bool {
        let d = &mut self.dirs[dir];
        if d.buf.is_empty() {
            return false;
        }
        let n = d.buf.len().min(16);
        let is_prefix = |key: &[u8; 16]| d.buf[..n] == key[..n];
        if is_prefix(&mpa::REQUEST_KEY) || is_prefix(&mpa::REPLY_KEY) {
            if n < 16 {
                return false; // wait for the whole key
            }
            d.mode = Mode::Startup;
        } else {
            d.mode = Mode::Stream;
        }
        true
    }

    fn startup_frame(&mut self, ctx: &Ctx, dir: usize, out: &mut Vec<Record>) -> bool {
        let d = &mut self.dirs[dir];
        // frame_len knows the length once the 20-octet header is in; the
        // Private Data may still be on its way (a startup frame split across
        // TCP segments).
        let len = match mpa::FrameRepr::frame_len(&d.buf) {
            Ok(Some(n)) if n <= d.buf.len() => n,
            Ok(_) => return false,
            Err(e) => {
                let mut r = record(ctx, d, "MPA", d.buf.len());
                r.summary = "malformed MPA startup frame".into();
                r.error(e);
                out.push(r);
                d.mode = Mode::Stopped;
                return true;
            }
        };
        let end = d.buf_off + len as u64;
        let frame = d.frame_of(end);
        let mut r = Record::new(frame, ctx.time, ctx.src.clone(), ctx.dst.clone(), "MPA");
        let bytes = d.buf[..len].to_vec();
        match mpa::FrameRepr::parse(&bytes) {
            Ok(f) => {
                r.summary = super::summary::mpa_frame(&f);
                r.layer("mpa", f);
                if let Ok(Some(p)) = f.rev2_params() {
                    r.layer("mpa_rev2", p);
                }
                r.reemit(&bytes, |buf| f.emit(buf), f.buffer_len());
                d.frame = Some(f.kind);
                match f.kind {
                    mpa::FrameKind::Request => {
                        self.request = Some((dir, f.m, f.c));
                    }
                    mpa::FrameKind::Reply => {
                        self.reply = Some((dir, f.m, f.c));
                    }
                }
            }
            Err(e) => {
                r.summary = "malformed MPA startup frame".into();
                r.error(e);
                d.mode = Mode::Stopped;
                out.push(r);
                return true;
            }
        }
        out.push(r);
        let d = &mut self.dirs[dir];
        d.consume(len);
        d.mode = Mode::AwaitNegotiation;
        if let (Some((i, req_m, req_c)), Some((_, rep_m, rep_c))) = (self.request, self.reply) {
            self.negotiated = Some(Negotiated {
                initiator: i,
                req_m,
                rep_m,
                crc: req_c || rep_c,
            });
        }
        true
    }

    fn fpdu(&mut self, ctx: &Ctx, dir: usize, markers: bool, out: &mut Vec<Record>) -> bool {
        let crc_on = self.negotiated.is_some_and(|n| n.crc);
        let d = &mut self.dirs[dir];
        if d.buf.is_empty() {
            return false;
        }
        let mut ulpdu = std::mem::take(&mut d.ulpdu);
        ulpdu.resize(usize::from(u16::MAX) + 1, 0);
        let res = mpa::decode_fpdu(&d.buf, d.fpdu_pos, markers, &mut ulpdu);
        let progressed = match res {
            Ok(None) => false,
            Ok(Some(info)) => {
                let end = d.buf_off + info.consumed as u64;
                let frame = d.frame_of(end);
                let mut r = Record::new(frame, ctx.time, ctx.src.clone(), ctx.dst.clone(), "iWARP");
                let u = &ulpdu[..usize::from(info.ulpdu_len)];
                r.layer("mpa", info);
                if crc_on {
                    r.check(
                        "crc",
                        Some(info.crc_ok()),
                        format!(
                            "field {:#010x}, computed {:#010x}",
                            info.crc_field, info.crc_computed
                        ),
                    );
                } else {
                    r.check(
                        "crc",
                        None,
                        format!("not negotiated; field {:#010x}", info.crc_field),
                    );
                }
                // Re-emit the FPDU and compare with the wire. Without markers
                // FpduRepr keeps PAD and CRC as sent (siw does not zero its PAD).
                let wire = &d.buf[..info.consumed];
                let same = if markers {
                    // Markers: re-encode, then check it decodes to the same ULPDU.
                    let mut again = vec![0u8; info.consumed];
                    let mut u2 = vec![0u8; u.len()];
                    matches!(
                        mpa::encode_fpdu(&[u], d.fpdu_pos, markers, crc_on, &mut again),
                        Ok(n) if n == info.consumed
                    ) && matches!(
                        mpa::decode_fpdu(&again, d.fpdu_pos, markers, &mut u2),
                        Ok(Some(i2)) if i2.consumed == info.consumed && u2 == u
                    )
                } else {
                    match mpa::FpduRepr::parse(wire) {
                        Ok(f) => {
                            let mut again = vec![0u8; f.buffer_len()];
                            matches!(f.emit(&mut again), Ok(n) if n == wire.len()) && again == wire
                        }
                        Err(_) => false,
                    }
                };
                r.check(
                    "reemit",
                    Some(same),
                    if same { "" } else { "FPDU re-encode differs" },
                );
                decode_ulpdu(&mut r, u, ctx.sends);
                out.push(r);
                d.fpdu_pos = d.fpdu_pos.wrapping_add(info.consumed as u32);
                d.consume(info.consumed);
                true
            }
            Err(e) => {
                let mut r = record(ctx, d, "iWARP", d.buf.len());
                r.summary = "FPDU framing error; rest of this half connection not decoded".into();
                r.error(e);
                out.push(r);
                d.mode = Mode::Stopped;
                true
            }
        };
        self.dirs[dir].ulpdu = ulpdu;
        progressed
    }

    /// Problems visible only at the end of the capture.
    pub(crate) fn finish_errors(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (i, d) in self.dirs.iter().enumerate() {
            let mpa = !matches!(d.mode, Mode::Unknown | Mode::Stream);
            if mpa && d.half.stranded_octets() > 0 {
                v.push(format!(
                    "direction {i}: {} octets behind a TCP gap that the capture never fills",
                    d.half.stranded_octets()
                ));
            }
        }
        v
    }
}

fn record(ctx: &Ctx, d: &mut Direction, proto: &'static str, upto: usize) -> Record {
    let frame = d.frame_of(d.buf_off + upto as u64);
    Record::new(frame, ctx.time, ctx.src.clone(), ctx.dst.clone(), proto)
}

/// DDP + RDMAP, and RPC-over-RDMA inside a Send; `keep_send`: [`super::Options::sends`].
fn decode_ulpdu(r: &mut Record, u: &[u8], keep_send: bool) {
    match rdmap::Segment::parse(u) {
        Ok(seg) => {
            r.summary = super::summary::segment(&seg);
            r.layer("ddp", seg.ddp);
            r.layer(
                "rdmap",
                serde_json::json!({ "control": seg.control, "body": seg.body }),
            );
            if let Some(c) = r
                .layer_mut("rdmap")
                .and_then(|m| m.get_mut("control"))
                .and_then(|c| c.as_object_mut())
            {
                c.insert("opcode_code".into(), u8::from(seg.control.opcode).into());
            }
            r.reemit(u, |b| seg.emit(b), seg.buffer_len());
            if keep_send {
                r.send = super::summary::send_segment(&seg);
            }
            if let Some(payload) = super::summary::rpc_candidate(&seg) {
                rpc::decode_into(r, payload);
            }
        }
        Err(e) => {
            r.summary = "undecodable DDP/RDMAP segment".into();
            r.error(e);
        }
    }
}
