//! Following one TCP connection: MPA startup, then FPDUs carrying DDP/RDMAP; or ONC RPC
//! records.
//!
//! A hole the capture never fills (see [`super::tcp`]) loses the FPDU it cuts; deframing
//! resumes at the first later segment that starts with a plausible FPDU, as tshark does,
//! and the hole is reported once as a stream error.

use std::collections::VecDeque;

use softrdma_rpc::record::RecordDecoder;
use softrdma_wire::mpa;
use softrdma_wire::rdmap;

use super::record::Record;
use super::tcp::{Delivered, HalfStream, Segment};
use super::{Ctx, rpc};

/// Holes reported one by one per direction; more are counted.
const MAX_GAP_REPORTS: usize = 16;

/// Segment starts of a stream of unknown kind tried for FPDUs: without a CRC the evidence is
/// two headers that parse and chain, which a long search through other data could meet.
const MAX_SEARCH_SEGMENTS: u32 = 64;

/// Octets of a stream of unknown kind searched before it is taken to carry neither FPDUs nor
/// ONC RPC records: a capture may begin inside an NFS WRITE of 1 MiB (the largest rsize and
/// wsize Linux offers).
const MAX_SEARCH_OCTETS: u64 = 4 << 20;

/// What one direction of the connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing seen yet.
    Unknown,
    /// Plain TCP payload (not MPA): skipped.
    Stream,
    /// ONC RPC records (RFC 5531 §11): portmap, MOUNT, NFS over TCP.
    OncRpc,
    /// Neither a startup frame nor a record first: FPDUs or ONC RPC records of a connection
    /// the capture joined late are looked for at segment starts, up to [`MAX_SEARCH_OCTETS`].
    Search,
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
    /// The endpoints, as records show them.
    src: String,
    dst: String,
    /// Reassembles ONC RPC records, in [`Mode::OncRpc`] (`None` while looking for one after
    /// a hole over a record mark).
    records: Option<RecordDecoder>,
    /// The record being reassembled lost octets to a hole: how many of it were kept before.
    rpc_cut: Option<usize>,
    /// Looking for an FPDU after a hole, or in a stream not yet told apart: the segment
    /// starts (stream offsets) to try.
    resync: Option<VecDeque<u64>>,
    gaps: Vec<Gap>,
    /// Holes beyond [`MAX_GAP_REPORTS`].
    more_gaps: u64,
    /// The last hole was left by a segment the capture cut at its snap length (such holes
    /// are not in `gaps`: the capture chose not to keep those octets).
    in_cut_hole: bool,
    /// Stream offset where an FPDU is known to start: the end of one a cut left, or of a
    /// startup frame a cut left (its lengths were kept).
    sync_at: Option<u64>,
    /// FPDUs found without the startup frames (the capture began after them), and how.
    inferred: Option<Inferred>,
    /// In [`Mode::Search`]: the stream offset it began at, the segment starts tried for
    /// FPDUs, and where the FPDU whose head a cut segment kept ends (the next FPDU's head
    /// there confirms both).
    search_from: u64,
    searched: u32,
    expect: Option<u64>,
    /// The capture has ended: nothing more will arrive.
    ended: bool,
}

/// How FPDUs were found in a stream whose startup frames the capture missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inferred {
    /// Whole FPDUs: with a CRC that checks (`true`), or without one, the FPDU after the first
    /// parsing too.
    Whole { crc: bool },
    /// Segments cut at the snap length: an FPDU header whose length fills its segment, or
    /// reaches the next FPDU header kept; the CRC could not be looked at.
    CutHead,
}

/// One hole the capture never filled, for the stream error.
#[derive(Debug)]
struct Gap {
    /// Stream offset of the first octet lost, and how many.
    at: u64,
    lost: u64,
    /// The last frame delivered before it (0: none).
    after_frame: u64,
    /// Octets received around it but not decoded: an FPDU cut by it, and what came before
    /// the FPDU deframing resumed at.
    dropped: u64,
    /// The frame and stream offset where deframing resumed.
    resumed: Option<(u64, u64)>,
    /// It lay inside an ONC RPC record fragment: the records after it stayed in step.
    in_step: bool,
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
            src: String::new(),
            dst: String::new(),
            records: None,
            rpc_cut: None,
            // Mode::Unknown: a search may follow.
            resync: Some(VecDeque::new()),
            gaps: Vec::new(),
            more_gaps: 0,
            in_cut_hole: false,
            sync_at: None,
            inferred: None,
            search_from: 0,
            searched: 0,
            expect: None,
            ended: false,
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
    /// The frame (and its time) that delivered stream octet `end - 1`.
    fn frame_of(&mut self, end: u64) -> (u64, f64) {
        while let Some(d) = self.ranges.front() {
            if d.end < end {
                self.ranges.pop_front();
            } else {
                return (d.frame, d.time);
            }
        }
        (0, 0.0)
    }

    /// A record of a message whose last octet is stream octet `end - 1`.
    fn record(&mut self, end: u64, proto: &'static str) -> Record {
        let (frame, time) = self.frame_of(end);
        Record::new(frame, time, self.src.clone(), self.dst.clone(), proto)
    }

    /// The capture lost `lost` octets just before stream offset `start`: drop what was
    /// buffered (an FPDU the hole cuts), and look for an FPDU after it. `cut`: the octets
    /// were cut off a segment by the capture's snap length; the FPDU they belong to, if
    /// the buffer starts one, is returned as far as its headers were kept.
    fn hole(&mut self, start: u64, lost: u64, cut: bool) -> Option<Record> {
        let cut_fpdu = match self.mode {
            Mode::Fpdu { markers } if cut => self.cut_fpdu(markers).map(|(r, end)| {
                self.sync_at = Some(end);
                // Found while looking for an FPDU after a segment the capture lost: the
                // deframing resumed there.
                if self.resync.is_some()
                    && !self.in_cut_hole
                    && self.more_gaps == 0
                    && let Some(g) = self.gaps.last_mut()
                    && g.resumed.is_none()
                {
                    g.resumed = Some((r.frame, self.buf_off));
                }
                r
            }),
            _ => None,
        };
        let (rpc_cut, in_step) = match self.mode {
            Mode::OncRpc => self.rpc_hole(start, lost),
            _ => (None, false),
        };
        let dropped = self.buf.len() as u64;
        let after_frame = self.ranges.back().map_or(0, |d| d.frame);
        let advance = start.saturating_sub(self.buf_off);
        self.buf.clear();
        self.buf_off = start;
        // fpdu_pos follows the stream across the hole: Markers sit at fixed offsets.
        self.fpdu_pos = self.fpdu_pos.wrapping_add(advance as u32);
        match self.mode {
            Mode::Stream | Mode::Stopped => return None,
            // Still looking: from the segment after the hole on.
            Mode::Unknown | Mode::Search => {
                self.resync = Some(VecDeque::new());
                return None;
            }
            // The startup frame cut: there is no telling what was negotiated.
            Mode::Startup => self.mode = Mode::Stopped,
            // A hole over a record mark: records are looked for at segment starts.
            Mode::OncRpc if !in_step => {
                self.records = None;
                self.rpc_cut = None;
                self.resync = Some(VecDeque::new());
            }
            Mode::OncRpc => {}
            // Where the next FPDU starts is known when what the hole cut said its length
            // and ends at or after the hole; else it is looked for at segment starts.
            Mode::AwaitNegotiation | Mode::Fpdu { .. } => {
                if cut && self.sync_at.is_some_and(|at| at >= start) {
                    self.resync = None;
                } else {
                    self.sync_at = None;
                    self.resync = Some(VecDeque::new());
                }
            }
        }
        self.in_cut_hole = cut;
        if cut {
            return cut_fpdu.or(rpc_cut);
        }
        let gap = Gap {
            at: start.saturating_sub(lost),
            lost,
            after_frame,
            dropped,
            resumed: None,
            in_step,
        };
        if self.gaps.len() < MAX_GAP_REPORTS {
            self.gaps.push(gap);
        } else {
            self.more_gaps += 1;
        }
        rpc_cut
    }

    /// A hole of `lost` octets before stream offset `start` in ONC RPC records. Inside a
    /// fragment, whose length says where the next mark is, the reassembly stays in step: the
    /// hole's octets go in as zeros and the record is decoded only as far as it was kept.
    /// Returns the record the hole ends, if it ends one, and whether the reassembly is
    /// still in step (`false`: the next mark was in the hole, or it began in one).
    fn rpc_hole(&mut self, start: u64, lost: u64) -> (Option<Record>, bool) {
        const ZEROS: [u8; 4096] = [0; 4096];
        let Some(dec) = self.records.as_mut() else {
            return (None, false);
        };
        let (kept, left) = dec.progress();
        let Some(left) = left else {
            return (None, false);
        };
        let kept = *self.rpc_cut.get_or_insert(kept);
        let fill = usize::try_from(lost).map_or(left, |l| l.min(left));
        let mut whole = None;
        let mut n = fill;
        while n > 0 && whole.is_none() {
            let mut zeros = &ZEROS[..n.min(ZEROS.len())];
            n -= zeros.len();
            // Inside a fragment's body: nothing to refuse.
            whole = dec.decode(&mut zeros).ok().flatten();
        }
        let in_step = fill as u64 == lost;
        let Some(rec) = whole else {
            return (None, in_step);
        };
        self.rpc_cut = None;
        let mut r = self.record(start.saturating_sub(lost), "RPC");
        rpc::decode_record(&mut r, &rec, Some(kept));
        (Some(r), in_step)
    }

    /// The FPDU at the front of the buffer, which the capture cut at its snap length: its
    /// MPA length and DDP/RDMAP headers, when they were kept and parse; the rest (payload,
    /// PAD, CRC) cannot be checked. The front is an FPDU's start when the deframer is in
    /// step, or, after a hole, at a segment start (FPDUs are aligned to segments, RFC 5044
    /// §8, as siw and softrdma send them). Not with Markers, which sit inside FPDUs.
    fn cut_fpdu(&mut self, markers: bool) -> Option<(Record, u64)> {
        let at_start = match &self.resync {
            None => true,
            Some(starts) => starts.front() == Some(&self.buf_off),
        };
        if markers || !at_start || self.buf.len() < mpa::ULPDU_LENGTH_LEN {
            return None;
        }
        let (ulpdu_len, head) = cut_head(&self.buf)?;
        let (summary, ddp, control, ctl_octet) = match head {
            CutHead::Whole(seg) => (
                format!("{} [cut]", super::summary::segment(&seg)),
                serde_json::to_value(seg.ddp).ok()?,
                serde_json::to_value(seg.control).ok()?,
                u8::from(seg.control.opcode),
            ),
            CutHead::Control(ddp, control) => (
                format!(
                    "{} [cut inside its RDMAP header]",
                    super::summary::opcode_name(control.opcode)
                ),
                serde_json::to_value(ddp).ok()?,
                serde_json::to_value(control).ok()?,
                u8::from(control.opcode),
            ),
        };
        let fpdu_len = mpa::fpdu_len(ulpdu_len);
        let mut r = self.record(self.buf_off + self.buf.len() as u64, "iWARP");
        r.summary = summary;
        r.layer("mpa", serde_json::json!({ "ulpdu_len": ulpdu_len }));
        r.layer("ddp", ddp);
        r.layer("rdmap", serde_json::json!({ "control": control }));
        opcode_code(&mut r, ctl_octet);
        r.check(
            "captured",
            None,
            format!(
                "{} of {fpdu_len} octets of this FPDU: payload and CRC not verified",
                self.buf.len()
            ),
        );
        Some((r, self.buf_off + fpdu_len as u64))
    }

    /// Drops what lies before `sync_at`, where an FPDU is known to start (past a cut);
    /// `true` once there.
    fn skip_to_sync(&mut self) -> bool {
        let Some(at) = self.sync_at else {
            return false;
        };
        let n = usize::try_from(at.saturating_sub(self.buf_off))
            .map_or(self.buf.len(), |n| n.min(self.buf.len()));
        self.pass(n);
        if self.buf_off >= at {
            self.sync_at = None;
            return true;
        }
        false
    }

    /// Looks for where decoding resumes after a hole: the first segment start whose octets
    /// `plausible(buf, fpdu_pos, ended)` takes (`None`: more octets needed), what lies before
    /// it dropped. `true` once found. A segment whose start fails may hold a place to resume
    /// inside it: `within(buf, segment length)` says where, and decoding resumes there.
    fn resync_by(
        &mut self,
        mut plausible: impl FnMut(&[u8], u32, bool) -> Option<bool>,
        mut within: impl FnMut(&[u8], usize) -> Option<usize>,
    ) -> bool {
        loop {
            let buf_off = self.buf_off;
            let next = match self.resync.as_mut() {
                None => return false,
                Some(starts) => {
                    while starts.front().is_some_and(|&s| s < buf_off) {
                        starts.pop_front();
                    }
                    starts.front().copied()
                }
            };
            let Some(s) = next else {
                // No segment starts in what is buffered: none of it can be decoded.
                let n = self.buf.len();
                self.drop_unsynced(n);
                return false;
            };
            let before =
                usize::try_from(s - self.buf_off).map_or(self.buf.len(), |n| n.min(self.buf.len()));
            self.drop_unsynced(before);
            let at = match plausible(&self.buf, self.fpdu_pos, self.ended) {
                Some(true) => s,
                Some(false) => {
                    let Some(starts) = self.resync.as_mut() else {
                        return false;
                    };
                    starts.pop_front();
                    let seg = starts.front().map_or(u64::MAX, |&n| n - s);
                    let seg = usize::try_from(seg).unwrap_or(usize::MAX);
                    let Some(k) = within(&self.buf, seg) else {
                        continue;
                    };
                    self.drop_unsynced(k);
                    s + k as u64
                }
                None => return false, // more octets needed
            };
            let (frame, _) = self.frame_of(at + 1);
            if !self.in_cut_hole
                && self.more_gaps == 0
                && let Some(g) = self.gaps.last_mut()
            {
                g.resumed = Some((frame, at));
            }
            self.resync = None;
            return true;
        }
    }

    /// ONC RPC records start at the front of the buffer.
    fn start_records(&mut self) {
        self.mode = Mode::OncRpc;
        self.resync = None;
        self.expect = None;
        self.records = Some(RecordDecoder::new(rpc::MAX_RECORD));
    }

    /// Searching: past [`MAX_SEARCH_OCTETS`], or at the capture's end with nothing left,
    /// the stream is taken to be plain TCP (`true`).
    fn give_up_search(&mut self) -> bool {
        let past = self.buf_off.saturating_sub(self.search_from) > MAX_SEARCH_OCTETS;
        let drained = self.ended && self.buf.is_empty();
        if !(past || drained) {
            return false;
        }
        self.mode = Mode::Stream;
        self.resync = None;
        self.expect = None;
        true
    }

    /// Searching, FPDUs found at the front of the buffer: deframe from there on.
    fn found_fpdus(&mut self, how: Inferred) {
        self.mode = Mode::Fpdu { markers: false };
        self.inferred = Some(how);
        self.resync = None;
        self.expect = None;
    }

    /// Searching, with the end of an FPDU whose head a cut segment kept: when the buffer
    /// holds the octets there and they start an FPDU header, the stream is FPDUs from there
    /// on (`true`). The candidate is dropped when they do not, or were not kept (`cut_end`:
    /// the buffer's end is a cut that ends there, so nothing more of what it holds arrives).
    fn confirm_expected(&mut self, cut_end: Option<u64>) -> bool {
        // Enough octets for any DDP/RDMAP header behind the ULPDU_Length.
        const HEAD: u64 = 2 + 32;
        let Some(e) = self.expect else {
            return false;
        };
        let end = self.buf_off + self.buf.len() as u64;
        if e < self.buf_off || cut_end.is_some_and(|c| (end..c).contains(&e)) {
            self.expect = None;
            return false;
        }
        if e >= end || (cut_end.is_none() && end - e < HEAD) {
            return false; // not here yet
        }
        let at = (e - self.buf_off) as usize;
        let head = &self.buf[at..];
        if !reserved_clear(head.get(2..).unwrap_or_default()) || cut_head(head).is_none() {
            self.expect = None;
            return false;
        }
        self.pass(at);
        self.found_fpdus(Inferred::CutHead);
        true
    }

    /// Skip `n` octets that cannot be decoded while resynchronising.
    fn drop_unsynced(&mut self, n: usize) {
        if !self.in_cut_hole
            && self.more_gaps == 0
            && let Some(g) = self.gaps.last_mut()
        {
            g.dropped += n as u64;
        }
        self.pass(n);
    }

    fn consume(&mut self, n: usize) {
        self.buf.drain(..n);
        self.buf_off += n as u64;
    }

    /// [`consume`](Self::consume) `n` octets of the FPDU stream, `fpdu_pos` following them
    /// (Markers sit at fixed stream offsets).
    fn pass(&mut self, n: usize) {
        self.consume(n);
        self.fpdu_pos = self.fpdu_pos.wrapping_add(n as u32);
    }
}

impl Connection {
    pub(crate) fn segment(
        &mut self,
        ctx: &Ctx,
        dir: usize,
        seg: Segment<'_>,
        out: &mut Vec<Record>,
    ) {
        let d = &mut self.dirs[dir];
        if d.src.is_empty() {
            d.src.clone_from(&ctx.src);
            d.dst.clone_from(&ctx.dst);
        }
        let chunks = d.half.segment_cut(ctx.frame, ctx.time, seg);
        self.deliver(ctx.sends, dir, chunks, out);
    }

    /// Hand newly in-order octets to the follower of direction `dir`.
    fn deliver(
        &mut self,
        sends: bool,
        dir: usize,
        chunks: Vec<(Delivered, Vec<u8>)>,
        out: &mut Vec<Record>,
    ) {
        for (range, bytes) in chunks {
            let start = range.end - bytes.len() as u64;
            if range.lost_before > 0 {
                // Decode what is whole before the hole first.
                self.process(sends, dir, out);
                let cut = range.cut_before == range.lost_before;
                self.hole(dir, start, range.lost_before, cut, out);
            }
            let d = &mut self.dirs[dir];
            if matches!(d.mode, Mode::Stream | Mode::Stopped) {
                // Keep nothing of streams we do not decode.
                d.buf_off += bytes.len() as u64;
            } else {
                d.ranges.push_back(range);
                if let Some(starts) = &mut d.resync {
                    // Bounded: one per segment held, and segments are dropped once tried.
                    starts.push_back(start);
                }
                d.buf.extend_from_slice(&bytes);
            }
        }
        self.process(sends, dir, out);
        // A Reply can release FPDUs held in the other direction.
        if self.negotiated.is_some() && self.dirs[1 - dir].mode == Mode::AwaitNegotiation {
            self.process(sends, 1 - dir, out);
        }
    }

    /// [`Direction::hole`] of direction `dir`; a startup frame a cut left is decoded as far
    /// as it was kept first, and so is an FPDU.
    fn hole(&mut self, dir: usize, start: u64, lost: u64, cut: bool, out: &mut Vec<Record>) {
        if cut && self.dirs[dir].mode == Mode::Startup {
            self.cut_startup(dir, out);
        }
        if cut && self.dirs[dir].mode == Mode::Search {
            self.infer_from_cut(dir, start);
        }
        if let Some(r) = self.dirs[dir].hole(start, lost, cut) {
            out.push(r);
        }
    }

    /// The capture has ended: give up the holes still open, and decode what lies behind them.
    pub(crate) fn finish(&mut self, sends: bool, out: &mut Vec<Record>) {
        for dir in 0..2 {
            while self.dirs[dir].half.has_gap() {
                let chunks = self.dirs[dir].half.skip_gap();
                self.deliver(sends, dir, chunks, out);
            }
            // The last segment was cut: what it started is decoded as far as it was kept.
            if let Some((end, cut)) = self.dirs[dir].half.take_trailing_cut() {
                self.process(sends, dir, out);
                self.hole(dir, end, cut, true, out);
            }
            self.dirs[dir].ended = true;
            self.process(sends, dir, out);
        }
    }

    fn process(&mut self, sends: bool, dir: usize, out: &mut Vec<Record>) {
        loop {
            let mode = self.dirs[dir].mode;
            let progressed = match mode {
                Mode::Unknown => self.classify(dir),
                Mode::Search => self.search(dir),
                Mode::Startup => self.startup_frame(dir, out),
                Mode::AwaitNegotiation => match self.negotiated {
                    Some(n) => {
                        let markers = if dir == n.initiator { n.rep_m } else { n.req_m };
                        self.dirs[dir].mode = Mode::Fpdu { markers };
                        true
                    }
                    None => false,
                },
                Mode::Fpdu { .. } if self.dirs[dir].sync_at.is_some() => {
                    self.dirs[dir].skip_to_sync()
                }
                Mode::Fpdu { markers } if self.dirs[dir].resync.is_some() => {
                    self.resync(dir, markers)
                }
                Mode::Fpdu { markers } => self.fpdu(sends, dir, markers, out),
                Mode::OncRpc if self.dirs[dir].resync.is_some() => {
                    let d = &mut self.dirs[dir];
                    let found =
                        d.resync_by(|buf, _, _| rpc::is_record_stream(buf), rpc::record_within);
                    if found {
                        d.start_records();
                    }
                    found
                }
                Mode::OncRpc => self.rpc_records(dir, out),
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
            d.resync = None;
        } else {
            match rpc::is_record_stream(&d.buf) {
                None => return false,
                Some(true) => d.start_records(),
                // The segment starts delivered so far are where FPDUs may start.
                Some(false) => {
                    d.mode = Mode::Search;
                    d.search_from = d.buf_off;
                }
            }
        }
        true
    }

    /// A stream that starts with neither an MPA startup frame nor an ONC RPC record: the
    /// capture may have begun after the connection did, anywhere in an FPDU or a record.
    /// FPDUs are looked for at segment starts (FPDUs are aligned to segments) as after a
    /// hole: with a CRC that checks, else without one when the FPDU after the first parses
    /// too; or, in segments the capture cut, by lengths that chain
    /// ([`Connection::infer_from_cut`]). Markers are taken to be off. Failing that, a
    /// segment start that holds a plausible ONC RPC record starts records, as after a hole
    /// over a record mark. `false`: more octets needed.
    fn search(&mut self, dir: usize) -> bool {
        let known = self.negotiated.map(|n| n.crc);
        let d = &mut self.dirs[dir];
        if d.expect.is_some() && d.confirm_expected(None) {
            self.infer_negotiation(dir, None);
            return true;
        }
        let mut scratch = std::mem::take(&mut d.ulpdu);
        scratch.resize(usize::from(u16::MAX) + 1, 0);
        // Some(crc): FPDUs; None: records.
        let mut found = None;
        let mut searched = d.searched;
        let ok = d.resync_by(
            |buf, pos, ended| {
                let mut verdict = Some(false);
                for crc in [true, false] {
                    if known.is_some_and(|k| k != crc) || searched >= MAX_SEARCH_SEGMENTS {
                        continue;
                    }
                    match plausible(buf, pos, false, crc, ended, &mut scratch, true) {
                        Some(true) => {
                            found = Some(crc);
                            return Some(true);
                        }
                        Some(false) => {}
                        None => verdict = None,
                    }
                }
                let verdict = match rpc::is_record_stream(buf) {
                    Some(true) if known.is_none() => return Some(true),
                    None if !ended => None,
                    _ => verdict,
                };
                if verdict == Some(false) {
                    searched += 1;
                }
                verdict
            },
            |buf, seg| {
                // FPDUs begin at segment starts; records may not.
                known
                    .is_none()
                    .then(|| rpc::record_within(buf, seg))
                    .flatten()
            },
        );
        d.ulpdu = scratch;
        d.searched = searched;
        if ok {
            match found {
                Some(crc) => {
                    d.found_fpdus(Inferred::Whole { crc });
                    self.infer_negotiation(dir, Some(crc));
                }
                None => d.start_records(),
            }
            return true;
        }
        d.give_up_search()
    }

    /// FPDUs found in direction `dir` without both startup frames: what they carry is taken
    /// from the startup frame the capture kept, if any (the peer's, when the capture began
    /// between the Request and the Reply), else Markers off; `crc` when the FPDUs told.
    fn infer_negotiation(&mut self, dir: usize, crc: Option<bool>) {
        let (initiator, req_m, rep_m, c) = match (self.request, self.reply) {
            (Some((d, m, c)), _) => (d, m, false, c),
            (None, Some((d, m, c))) => (1 - d, false, m, c),
            (None, None) => (dir, false, false, false),
        };
        self.negotiated.get_or_insert(Negotiated {
            initiator,
            req_m,
            rep_m,
            crc: crc.unwrap_or(c),
        });
    }

    /// A stream being searched whose last segment the capture cut at its snap length, the
    /// cut ending at stream offset `end`: whole FPDUs cannot show there. The segment starts
    /// FPDUs when its kept head is an FPDU header whose length fills the segment
    /// ([`cut_head_plausible`]), or ends where a later segment's kept octets hold the next
    /// FPDU's header ([`Direction::confirm_expected`]); one such candidate at a time. The
    /// caller's [`Direction::hole`] then decodes the head as far as it was kept.
    fn infer_from_cut(&mut self, dir: usize, end: u64) {
        let d = &mut self.dirs[dir];
        if d.expect.is_some() && d.confirm_expected(Some(end)) {
            self.infer_negotiation(dir, None);
            return;
        }
        if d.expect.is_some() {
            return; // it lies beyond this segment, which it says is inside an FPDU
        }
        // The cut segment's kept octets are the last range delivered.
        let seg_start = d
            .ranges
            .iter()
            .rev()
            .nth(1)
            .map_or(d.buf_off, |r| r.end)
            .max(d.buf_off);
        let Ok(skip) = usize::try_from(seg_start - d.buf_off) else {
            return;
        };
        let Some(head) = d.buf.get(skip..) else {
            return;
        };
        let seg_len = end.saturating_sub(seg_start);
        if d.searched >= MAX_SEARCH_SEGMENTS {
            d.give_up_search();
            return;
        }
        d.searched += 1;
        if cut_head_plausible(head, seg_len) {
            d.pass(skip);
            d.found_fpdus(Inferred::CutHead);
            self.infer_negotiation(dir, None);
        } else {
            let fpdu_end = cut_head(head).map(|(n, _)| seg_start + mpa::fpdu_len(n) as u64);
            d.expect = fpdu_end.filter(|&e| e > end);
            if d.expect.is_none() {
                d.give_up_search();
            }
        }
    }

    /// Whole ONC RPC records; the decoder keeps a record's start until its end is in.
    fn rpc_records(&mut self, dir: usize, out: &mut Vec<Record>) -> bool {
        let d = &mut self.dirs[dir];
        let Some(dec) = d.records.as_mut() else {
            return false;
        };
        let mut input = &d.buf[..];
        let mut whole = Vec::new();
        let mut failed = None;
        while !input.is_empty() {
            match dec.decode(&mut input) {
                Ok(Some(rec)) => whole.push((d.buf.len() - input.len(), rec)),
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let n = d.buf.len();
        let (base, progressed) = (d.buf_off, !whole.is_empty() || failed.is_some());
        for (end, rec) in whole {
            let mut r = d.record(base + end as u64, "RPC");
            rpc::decode_record(&mut r, &rec, d.rpc_cut.take());
            out.push(r);
        }
        if let Some(e) = failed {
            let mut r = d.record(base + n as u64, "RPC");
            r.summary = "ONC RPC record refused; rest of this half connection not decoded".into();
            r.error(e);
            out.push(r);
            d.mode = Mode::Stopped;
        }
        d.consume(n);
        progressed && d.mode != Mode::Stopped
    }

    fn startup_frame(&mut self, dir: usize, out: &mut Vec<Record>) -> bool {
        let d = &mut self.dirs[dir];
        // frame_len knows the length once the 20-octet header is in; the
        // Private Data may still be on its way (a startup frame split across
        // TCP segments).
        let len = match mpa::FrameRepr::frame_len(&d.buf) {
            Ok(Some(n)) if n <= d.buf.len() => n,
            Ok(_) => return false,
            Err(e) => {
                let mut r = d.record(d.buf_off + d.buf.len() as u64, "MPA");
                r.summary = "malformed MPA startup frame".into();
                r.error(e);
                out.push(r);
                d.mode = Mode::Stopped;
                return true;
            }
        };
        let mut r = d.record(d.buf_off + len as u64, "MPA");
        let bytes = d.buf[..len].to_vec();
        match mpa::FrameRepr::parse(&bytes) {
            Ok(f) => {
                r.summary = super::summary::mpa_frame(&f);
                r.layer("mpa", f);
                if let Ok(Some(p)) = f.rev2_params() {
                    r.layer("mpa_rev2", p);
                }
                r.reemit(&bytes, |buf| f.emit(buf), f.buffer_len());
                out.push(r);
                self.dirs[dir].consume(len);
                self.started(dir, &f);
            }
            Err(e) => {
                r.summary = "malformed MPA startup frame".into();
                r.error(e);
                d.mode = Mode::Stopped;
                out.push(r);
            }
        }
        true
    }

    /// Direction `dir` sent startup frame `f`: FPDUs follow once both frames are known.
    fn started(&mut self, dir: usize, f: &mpa::FrameRepr<'_>) {
        let d = &mut self.dirs[dir];
        d.frame = Some(f.kind);
        d.mode = Mode::AwaitNegotiation;
        match f.kind {
            mpa::FrameKind::Request => self.request = Some((dir, f.m, f.c)),
            mpa::FrameKind::Reply => self.reply = Some((dir, f.m, f.c)),
        }
        if let (Some((i, req_m, req_c)), Some((_, rep_m, rep_c))) = (self.request, self.reply) {
            self.negotiated = Some(Negotiated {
                initiator: i,
                req_m,
                rep_m,
                crc: req_c || rep_c,
            });
        }
    }

    /// The startup frame at the front of `dir`'s buffer, which the capture cut at its snap
    /// length: its 20-octet header says what the FPDUs after it carry (Markers, CRC); its
    /// Private Data is kept as far as it was captured.
    fn cut_startup(&mut self, dir: usize, out: &mut Vec<Record>) {
        let d = &mut self.dirs[dir];
        let Some(head) = d.buf.get(..mpa::FRAME_HEADER_LEN) else {
            return;
        };
        let h = mpa::Frame::new_unchecked(head);
        let Ok(kind) = h.kind() else {
            return;
        };
        let total = h.total_len();
        let bytes = d.buf.clone();
        let f = mpa::FrameRepr {
            kind,
            m: h.m(),
            c: h.c(),
            r: h.r(),
            res: h.res(),
            rev: h.rev(),
            private_data: &bytes[mpa::FRAME_HEADER_LEN..bytes.len().min(total)],
        };
        let mut r = d.record(d.buf_off + bytes.len() as u64, "MPA");
        r.summary = format!("{} [cut]", super::summary::mpa_frame(&f));
        r.layer("mpa", f);
        r.check(
            "captured",
            None,
            format!("{} of {total} octets of this frame", bytes.len()),
        );
        out.push(r);
        self.dirs[dir].sync_at = Some(self.dirs[dir].buf_off + total as u64);
        self.started(dir, &f);
    }

    fn fpdu(&mut self, sends: bool, dir: usize, markers: bool, out: &mut Vec<Record>) -> bool {
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
                let mut r = d.record(d.buf_off + info.consumed as u64, "iWARP");
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
                decode_ulpdu(&mut r, u, sends);
                out.push(r);
                d.pass(info.consumed);
                true
            }
            Err(e) => {
                let mut r = d.record(d.buf_off + d.buf.len() as u64, "iWARP");
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

    /// Look for the FPDU to resume at after a hole: the first segment start whose octets
    /// are a plausible FPDU (see [`plausible`]; without a CRC, with reserved bits clear:
    /// payload that looks like two headers in a row is less rare than it seems). Octets
    /// before it are dropped.
    fn resync(&mut self, dir: usize, markers: bool) -> bool {
        let crc = self.negotiated.is_some_and(|n| n.crc);
        let d = &mut self.dirs[dir];
        let mut scratch = std::mem::take(&mut d.ulpdu);
        scratch.resize(usize::from(u16::MAX) + 1, 0);
        let found = d.resync_by(
            |buf, pos, ended| plausible(buf, pos, markers, crc, ended, &mut scratch, !crc),
            |_, _| None,
        );
        d.ulpdu = scratch;
        found
    }

    /// What the capture's snap length kept from being decoded, one line per direction.
    pub(crate) fn finish_notes(&self) -> Vec<String> {
        let mut v = Vec::new();
        for d in &self.dirs {
            if let Some(how) = d.inferred {
                v.push(format!(
                    "{} → {}: the MPA startup frames are not in the capture (it began later): \
                     FPDUs found by their headers, {}, Markers taken to be off",
                    d.src,
                    d.dst,
                    match how {
                        Inferred::Whole { crc: true } => "each CRC checking",
                        Inferred::Whole { crc: false } => "without a CRC",
                        Inferred::CutHead => {
                            "in segments cut at the snap length (CRC and payload not verified)"
                        }
                    }
                ));
            }
            if d.half.cut_octets > 0 {
                v.push(format!(
                    "{} → {}: {} octets of {} segments not captured (cut at the capture's snap \
                     length): what they carried was not decoded",
                    d.src, d.dst, d.half.cut_octets, d.half.cut_segments
                ));
            }
        }
        v
    }

    /// Problems visible only at the end of the capture: the holes, one line each.
    pub(crate) fn finish_errors(&self) -> Vec<String> {
        let mut v = Vec::new();
        for d in &self.dirs {
            for g in &d.gaps {
                let what = match d.mode {
                    Mode::OncRpc => "ONC RPC records",
                    _ => "FPDUs",
                };
                let resumed = match g.resumed {
                    _ if g.in_step => format!("{what} kept in step (it lay inside one)"),
                    Some((frame, at)) => {
                        format!("{what} resynchronised at frame {frame} (stream offset {at})")
                    }
                    None => "not resynchronised".into(),
                };
                v.push(format!(
                    "{} → {}: TCP gap: {} octets not captured at stream offset {} (after frame {}); \
                     {} octets around it not decoded; {resumed}",
                    d.src, d.dst, g.lost, g.at, g.after_frame, g.dropped
                ));
            }
            if d.more_gaps > 0 {
                v.push(format!(
                    "{} → {}: {} more TCP gaps",
                    d.src, d.dst, d.more_gaps
                ));
            }
        }
        v
    }
}

/// What the octets kept of an FPDU's head say: the whole DDP/RDMAP header, or the DDP
/// header and RDMAP's control octet (a Read Request's or a Terminate's fixed fields cut).
enum CutHead<'a> {
    Whole(rdmap::Segment<'a>),
    Control(softrdma_wire::ddp::Repr, rdmap::Control),
}

/// The ULPDU_Length and the header of the FPDU `buf` starts with, as far as `buf` holds
/// it; `None` when what is kept does not parse.
fn cut_head(buf: &[u8]) -> Option<(usize, CutHead<'_>)> {
    let len = buf.get(..mpa::ULPDU_LENGTH_LEN)?;
    let ulpdu_len = usize::from(u16::from_be_bytes([len[0], len[1]]));
    let kept = buf.get(2..buf.len().min(2 + ulpdu_len))?;
    let head = match rdmap::Segment::parse(kept) {
        Ok(seg) => CutHead::Whole(seg),
        Err(_) => {
            let ddp = softrdma_wire::ddp::Repr::parse(kept).ok()?;
            let ctl = match ddp {
                softrdma_wire::ddp::Repr::Tagged { rsvd_ulp, .. } => rsvd_ulp,
                softrdma_wire::ddp::Repr::Untagged { rsvd_ulp, .. } => rsvd_ulp[0],
            };
            CutHead::Control(ddp, rdmap::Control::from_octet(ctl).ok()?)
        }
    };
    Some((ulpdu_len, head))
}

/// Is `head`, what the capture kept of a segment of `seg_len` octets, the start of FPDUs?
/// Its header must parse and its FPDUs fill the segment exactly (siw and softrdma align
/// FPDUs to segments, RFC 5044 §8): the first one alone, or with the ones after it whose
/// heads were kept and parse too. Without a CRC to check, the length is the evidence.
fn cut_head_plausible(head: &[u8], seg_len: u64) -> bool {
    let mut at = 0usize;
    loop {
        let Some((ulpdu_len, _)) = head
            .get(at..)
            .filter(|h| reserved_clear(h.get(2..).unwrap_or_default()))
            .and_then(cut_head)
        else {
            return false;
        };
        let end = at as u64 + mpa::fpdu_len(ulpdu_len) as u64;
        if end >= seg_len {
            return end == seg_len;
        }
        at = end as usize;
    }
}

/// Are the reserved bits of the DDP control field and of RDMAP's control octet at the front
/// of ULPDU `u` zero, as RFC 5041 §4.2 and RFC 5040 §4.1 have senders set them? The
/// parsers ignore them (as receivers must); a search through a stream of unknown kind
/// takes them as evidence, six bits a header.
fn reserved_clear(u: &[u8]) -> bool {
    use softrdma_wire::ddp::MASK_RESERVED;
    matches!(u, [ddp, ctl, ..] if ddp & MASK_RESERVED == 0 && ctl & rdmap::MASK_RSV == 0)
}

/// Does `buf` start with an FPDU to resume deframing at? RFC 5044 §4 has no sync pattern
/// (Markers aside), so as tshark: a ULPDU_Length that fits, a DDP/RDMAP header that parses
/// (versions, opcode), and the CRC when negotiated; without a CRC the FPDU after it must
/// parse too, or end the capture's stream exactly. `clear`: the headers' reserved bits must
/// be zero too ([`reserved_clear`]). `None`: more octets needed.
fn plausible(
    buf: &[u8],
    pos: u32,
    markers: bool,
    crc: bool,
    ended: bool,
    scratch: &mut [u8],
    clear: bool,
) -> Option<bool> {
    let fpdu_at = |at: usize, scratch: &mut [u8]| -> Option<Option<usize>> {
        let pos = pos.wrapping_add(at as u32);
        match mpa::decode_fpdu_with(&buf[at..], pos, markers, scratch, crc) {
            Err(_) => Some(None),
            Ok(None) => None,
            Ok(Some(info)) => {
                let u = &scratch[..usize::from(info.ulpdu_len)];
                let ok = rdmap::Segment::parse(u).is_ok()
                    && (!crc || info.crc_ok())
                    && (!clear || reserved_clear(u));
                Some(ok.then_some(info.consumed))
            }
        }
    };
    let verdict = match fpdu_at(0, scratch) {
        None => None,
        Some(None) => Some(false),
        Some(Some(_)) if crc => Some(true),
        Some(Some(n)) if n == buf.len() => ended.then_some(true),
        Some(Some(n)) => fpdu_at(n, scratch).map(|next| next.is_some()),
    };
    // At the end of the capture nothing more comes: a candidate still waiting is not one.
    verdict.or(ended.then_some(false))
}

/// The raw RDMAP opcode beside the decoded one (what tshark shows).
fn opcode_code(r: &mut Record, code: u8) {
    if let Some(c) = r
        .layer_mut("rdmap")
        .and_then(|m| m.get_mut("control"))
        .and_then(|c| c.as_object_mut())
    {
        c.insert("opcode_code".into(), code.into());
    }
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
            opcode_code(r, u8::from(seg.control.opcode));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment captured whole.
    fn whole(seq: u32, payload: &[u8]) -> Segment<'_> {
        Segment {
            seq,
            syn: false,
            payload,
            len: payload.len(),
        }
    }

    fn ctx(frame: u64) -> Ctx {
        Ctx {
            frame,
            time: 0.0,
            src: "a".into(),
            dst: "b".into(),
            sends: false,
        }
    }

    /// An untagged Send's ULPDU (RFC 5041 §4.4, RFC 5040 §4): MSN `msn`, `len` octets.
    fn send(msn: u32, len: usize) -> Vec<u8> {
        let mut u = vec![0x41, 0x43, 0, 0, 0, 0];
        u.extend(0u32.to_be_bytes()); // QN
        u.extend(msn.to_be_bytes());
        u.extend(0u32.to_be_bytes()); // MO
        u.extend(std::iter::repeat_n(0x5a, len));
        u
    }

    /// A stream whose MPA Request and Reply (rev 1, `markers`, `crc`) start at `seq`, the
    /// Request in frame 1, the Reply in frame 1 (`same_frame`) or 2.
    fn started(
        markers: bool,
        crc: bool,
        seq: u32,
        same_frame: bool,
        out: &mut Vec<Record>,
    ) -> Connection {
        let mut c = Connection::default();
        for (dir, kind) in [(0, mpa::FrameKind::Request), (1, mpa::FrameKind::Reply)] {
            let f = mpa::FrameRepr {
                kind,
                m: markers,
                c: crc,
                r: false,
                res: 0,
                rev: 1,
                private_data: &[],
            };
            let mut b = vec![0; f.buffer_len()];
            f.emit(&mut b).unwrap();
            let frame = if same_frame { 1 } else { 1 + dir as u64 };
            c.segment(&ctx(frame), dir, whole(seq, &b), out);
        }
        c
    }

    /// A connection after the MPA startup (`markers`, `crc` both ways): the initiator's
    /// stream of `fpdus`, one segment each, with the segments `lost` never delivered; the
    /// records decoded and the stream errors.
    fn follow(
        fpdus: &[Vec<u8>],
        markers: bool,
        crc: bool,
        lost: &[usize],
    ) -> (Vec<Record>, Vec<String>) {
        follow_kept(fpdus, markers, crc, |i, n| {
            if lost.contains(&i) { 0..0 } else { 0..n }
        })
    }

    /// [`follow`], each FPDU `i` of `n` octets one segment of which the capture holds the
    /// octets `kept(i, n)` (none: lost).
    fn follow_kept(
        fpdus: &[Vec<u8>],
        markers: bool,
        crc: bool,
        kept: impl Fn(usize, usize) -> std::ops::Range<usize>,
    ) -> (Vec<Record>, Vec<String>) {
        let mut out = Vec::new();
        let mut c = started(markers, crc, 1000, false, &mut out);
        let mut seq = 1000 + mpa::FRAME_HEADER_LEN as u32;
        let mut pos = 0u32;
        for (i, u) in fpdus.iter().enumerate() {
            let mut b = vec![0; 2 * u.len() + 64];
            let n = mpa::encode_fpdu(&[u], pos, markers, crc, &mut b).unwrap();
            let k = kept(i, n);
            if !k.is_empty() {
                let at = seq.wrapping_add(k.start as u32);
                c.segment(&ctx(10 + i as u64), 0, whole(at, &b[k]), &mut out);
            }
            seq = seq.wrapping_add(n as u32);
            pos = pos.wrapping_add(n as u32);
        }
        c.finish(false, &mut out);
        out.retain(|r| r.proto == "iWARP");
        (out, c.finish_errors())
    }

    fn msns(records: &[Record]) -> Vec<u64> {
        records
            .iter()
            .map(|r| {
                assert!(r.errors.is_empty(), "{:?}", r.errors);
                r.layers["ddp"]["Untagged"]["msn"].as_u64().unwrap()
            })
            .collect()
    }

    #[test]
    fn resynchronises_after_a_hole_with_markers_and_crc() {
        // Sizes that put Markers (every 512 octets of the stream) inside FPDUs and between.
        let fpdus: Vec<Vec<u8>> = (1..=8).map(|m| send(m, 100 + 97 * m as usize)).collect();
        for (markers, crc) in [(false, false), (true, false), (false, true), (true, true)] {
            let (r, e) = follow(&fpdus, markers, crc, &[]);
            assert_eq!(msns(&r), [1, 2, 3, 4, 5, 6, 7, 8]);
            assert!(e.is_empty());
            let (r, e) = follow(&fpdus, markers, crc, &[2, 3]);
            assert_eq!(msns(&r), [1, 2, 5, 6, 7, 8], "markers {markers} crc {crc}");
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(e[0].contains("resynchronised at frame 14"), "{}", e[0]);
        }
    }

    /// After a hole, the first segment holds the tail of an FPDU: resynchronising drops it
    /// and tries the next segment start, where Markers must still sit at their stream
    /// offsets (the dropped octets count).
    #[test]
    fn resynchronises_past_a_segment_that_starts_inside_an_fpdu() {
        let fpdus: Vec<Vec<u8>> = (1..=8).map(|m| send(m, 100 + 97 * m as usize)).collect();
        for (markers, crc) in [(true, false), (true, true), (false, false)] {
            // FPDU 3 (index 2) is lost, and the first half of FPDU 4: its second half starts
            // the first segment after the hole.
            let (out, _) = follow_kept(&fpdus, markers, crc, |i, n| match i {
                2 => 0..0,
                3 => n / 2..n,
                _ => 0..n,
            });
            assert_eq!(
                msns(&out),
                [1, 2, 5, 6, 7, 8],
                "markers {markers} crc {crc}"
            );
        }
    }

    #[test]
    fn false_fpdus_after_a_hole_are_passed_over() {
        // After the hole, a segment whose first octets make a whole FPDU that parses, but
        // followed by octets that are no FPDU: not where deframing resumes (no CRC).
        let fake = {
            let mut b = vec![0; 64];
            let n = mpa::encode_fpdu(&[&send(99, 2)], 0, false, false, &mut b).unwrap();
            b.truncate(n);
            b.extend([0xff; 7]);
            b
        };
        let mut out = Vec::new();
        let mut c = started(false, false, 0, true, &mut out);
        let real = |m| {
            let mut b = vec![0; 128];
            let n = mpa::encode_fpdu(&[&send(m, 10)], 0, false, false, &mut b).unwrap();
            b.truncate(n);
            b
        };
        let (out, e) = after_a_hole(&mut c, out, &[fake, real(7), real(8)]);
        assert_eq!(msns(&out), [7, 8]);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].contains("100 octets not captured") && e[0].contains("at frame 21"),
            "{}",
            e[0]
        );
        // The fake FPDU (2 + 20 + 2 + 4 octets) and the 7 after it: dropped, not decoded.
        assert!(e[0].contains("35 octets around it not decoded"), "{}", e[0]);
    }

    /// Without a CRC, two FPDUs in a row that parse are not enough after a hole when their
    /// headers set reserved bits (payload octets that happen to look like headers: an
    /// interop capture with dropped packets resumed inside RDMA Read data and reported
    /// segments of unknown queues); deframing resumes at the real FPDUs after them.
    #[test]
    fn fpdus_with_reserved_bits_set_are_no_place_to_resume() {
        use softrdma_wire::ddp::MASK_RESERVED;
        let fpdu = |m, reserved: bool| {
            let mut u = send(m, 10);
            if reserved {
                u[0] |= MASK_RESERVED;
            }
            let mut b = vec![0; 128];
            let n = mpa::encode_fpdu(&[&u], 0, false, false, &mut b).unwrap();
            b.truncate(n);
            b
        };
        let fake = [fpdu(98, true), fpdu(99, true)].concat();
        let mut out = Vec::new();
        let mut c = started(false, false, 0, true, &mut out);
        let (out, e) = after_a_hole(&mut c, out, &[fake, fpdu(7, false), fpdu(8, false)]);
        assert_eq!(msns(&out), [7, 8]);
        assert!(e.len() == 1 && e[0].contains("at frame 21"), "{e:?}");
    }

    /// `segs` in frames 20, 21, ... after the first 100 octets past the startup frames were
    /// lost: the iWARP records and the capture's errors.
    fn after_a_hole(
        c: &mut Connection,
        mut out: Vec<Record>,
        segs: &[Vec<u8>],
    ) -> (Vec<Record>, Vec<String>) {
        let mut seq = mpa::FRAME_HEADER_LEN as u32 + 100;
        for (i, seg) in segs.iter().enumerate() {
            c.segment(&ctx(20 + i as u64), 0, whole(seq, seg), &mut out);
            seq += seg.len() as u32;
        }
        c.finish(false, &mut out);
        out.retain(|r| r.proto == "iWARP");
        (out, c.finish_errors())
    }

    #[test]
    fn a_bad_crc_is_no_place_to_resume() {
        let fpdus: Vec<Vec<u8>> = (1..=4).map(|m| send(m, 40)).collect();
        let mut out = Vec::new();
        let mut c = started(false, true, 0, true, &mut out);
        let mut seq = mpa::FRAME_HEADER_LEN as u32;
        for (i, u) in fpdus.iter().enumerate() {
            let mut b = vec![0; 128];
            let n = mpa::encode_fpdu(&[u], 0, false, true, &mut b).unwrap();
            if i == 2 {
                b[n - 1] ^= 1; // the FPDU after the hole: its CRC does not check
            }
            if i != 1 {
                c.segment(&ctx(10 + i as u64), 0, whole(seq, &b[..n]), &mut out);
            }
            seq += n as u32;
        }
        c.finish(false, &mut out);
        out.retain(|r| r.proto == "iWARP");
        assert_eq!(msns(&out), [1, 4]);
    }
}
