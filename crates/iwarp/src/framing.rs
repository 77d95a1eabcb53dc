//! MPA Full Operation framing (RFC 5044 §4-§6): one [`Framer`] per transmit
//! half connection, one [`Deframer`] per receive half connection.
//!
//! Both sides keep the stream position of their half connection as an offset
//! from `SeqStart` (the TCP sequence number of the first octet of Full
//! Operation in that direction, where the first Marker sits), modulo 2^32, and
//! leave the octet work (Marker placement, PAD, CRC coverage) to the stream
//! codec in `softrdma_wire::mpa` ([`encode_fpdu`](mpa::encode_fpdu),
//! [`decode_fpdu`](mpa::decode_fpdu)). What lives here is the state: the
//! position, the negotiated Marker and CRC settings, the MULPDU bound on the
//! transmit side, and on the receive side the reassembly of FPDUs from
//! arbitrary byte chunks and the "nothing after an error" rule (MPA-90).
//!
//! Sans-IO: no sockets, no clocks; the caller moves the octets.

use softrdma_memory::{AccessError, TxMark, TxSink};
use softrdma_wire::mpa::{
    self, CRC_LEN, LlpError, MARKER_LEN, MAX_ULPDU, MULPDU_MIN, ULPDU_LENGTH_LEN,
};

/// MULPDU for an EMSS (RFC 5044 §4.5, MPA-04/35/36/40): re-exported from the
/// wire codec so the data path finds it next to the [`Framer`].
pub use softrdma_wire::mpa::mulpdu;

/// Transmit-side errors. Nothing is written when one is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// The ULPDU is larger than the MULPDU in force (RFC 5044 §3, MPA-05,
    /// MPA-07); DDP must segment it first.
    #[error("ULPDU of {len} octets exceeds the MULPDU of {limit} octets (RFC 5044 §3)")]
    UlpduTooLarge {
        /// Octets in the gather list.
        len: usize,
        /// The MULPDU that applied.
        limit: usize,
    },
    /// A source of the ULPDU became unreachable while its CRC was computed (its key was
    /// revoked meanwhile): the FPDU cannot be completed.
    #[error("ULPDU source unreachable while framing: {0}")]
    Source(AccessError),
    /// With Markers on every FPDU starts 4-aligned to SeqStart (RFC 5044 §4.3),
    /// so a stream position that is not a multiple of 4 cannot be right.
    #[error(
        "stream position {pos:#010x} is not a multiple of 4 while Markers are on (RFC 5044 §4.3)"
    )]
    Unaligned {
        /// The rejected position.
        pos: u32,
    },
}

fn check_position(pos: u32, markers: bool) -> Result<(), FramingError> {
    if markers && !pos.is_multiple_of(4) {
        Err(FramingError::Unaligned { pos })
    } else {
        Ok(())
    }
}

/// Clamp a MULPDU to [128, 64768] (MPA-06, MPA-40, MPA-41).
fn clamp_mulpdu(m: u16) -> u16 {
    m.clamp(MULPDU_MIN, MAX_ULPDU as u16)
}

// ---------------------------------------------------------------------------
// Transmit
// ---------------------------------------------------------------------------

/// The transmit side of one half connection in Full Operation (RFC 5044
/// §4.1-§4.4, §5.1): turns each ULPDU (a DDP segment, given as a gather list)
/// into exactly one FPDU (MPA-03) at the current stream position, with
/// Markers when the peer asked for them (MPA-17/18) and a CRC32c when CRCs
/// were negotiated (else a zero CRC field, MPA-14).
///
/// The first FPDU of a fresh `Framer` (position 0 = SeqStart) starts with the
/// Marker `00000000` when Markers are on (MPA-22, MPA-76). Under RFC 5044
/// §7.1.2 r4 (MPA-73) a Responder must not call [`frame`](Self::frame) before
/// it has received an FPDU: see `Startup::may_transmit_fpdus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framer {
    pos: u32,
    markers: bool,
    crc: bool,
    mulpdu: u16,
}

impl Framer {
    /// A framer at SeqStart (position 0) with the largest MULPDU (64768);
    /// lower it with [`with_mulpdu`](Self::with_mulpdu) /
    /// [`set_mulpdu`](Self::set_mulpdu) from the path's EMSS ([`mulpdu`]).
    pub fn new(markers: bool, crc: bool) -> Self {
        Framer {
            pos: 0,
            markers,
            crc,
            mulpdu: MAX_ULPDU as u16,
        }
    }

    /// A framer whose next FPDU starts `pos` octets after SeqStart (mod 2^32);
    /// with Markers `pos` must be a multiple of 4.
    pub fn with_position(markers: bool, crc: bool, pos: u32) -> Result<Self, FramingError> {
        check_position(pos, markers)?;
        Ok(Framer {
            pos,
            ..Framer::new(markers, crc)
        })
    }

    /// Builder form of [`set_mulpdu`](Self::set_mulpdu).
    pub fn with_mulpdu(mut self, mulpdu: u16) -> Self {
        self.set_mulpdu(mulpdu);
        self
    }

    /// Set the MULPDU enforced by [`frame`](Self::frame), e.g. after an EMSS
    /// change (MPA-39); clamped to [128, 64768] (MPA-06, MPA-40).
    pub fn set_mulpdu(&mut self, mulpdu: u16) {
        self.mulpdu = clamp_mulpdu(mulpdu);
    }

    /// The MULPDU in force (MPA-04).
    pub fn mulpdu(&self) -> u16 {
        self.mulpdu
    }

    /// Offset of the next FPDU's first octet from SeqStart (mod 2^32).
    pub fn position(&self) -> u32 {
        self.pos
    }

    /// Markers are inserted in this direction.
    pub fn markers(&self) -> bool {
        self.markers
    }

    /// CRC32c is generated in this direction.
    pub fn crc(&self) -> bool {
        self.crc
    }

    /// Octets the next FPDU takes on the wire for a ULPDU of `ulpdu_len`
    /// octets, Markers included (they depend on the position).
    pub fn encoded_len(&self, ulpdu_len: usize) -> usize {
        mpa::encoded_len(ulpdu_len, self.pos, self.markers)
    }

    /// Append one FPDU carrying the concatenation of `parts` to `out` and
    /// advance the position; returns the octets appended. The ULPDU must not
    /// exceed [`mulpdu`](Self::mulpdu) (MPA-05, MPA-07); on error nothing is
    /// appended and the position is unchanged.
    pub fn frame(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) -> Result<usize, FramingError> {
        self.frame_limited(parts, self.mulpdu, out)
    }

    /// Starts an FPDU in place at the end of `out`, for a ULPDU appended there next and
    /// [`close`](Self::close)d: the ULPDU is written once (or referenced where it lies in
    /// registered memory), where it is sent from. `None` with Markers on (they cut into the
    /// body: use [`frame`](Self::frame)).
    pub fn open(&self, out: &mut dyn TxSink) -> Option<OpenFpdu> {
        if self.markers {
            return None;
        }
        let mark = out.mark();
        out.staged().extend_from_slice(&[0, 0]);
        Some(OpenFpdu { mark })
    }

    /// Finishes the FPDU [`open`](Self::open) started (RFC 5044 §4.1-§4.4): ULPDU_Length,
    /// the zero PAD (MPA-13), and the CRC32c over the FPDU read where its octets are (MPA-32/33), else a zero CRC
    /// (MPA-14). On error `out` is as it was before [`open`](Self::open).
    pub fn close(&mut self, out: &mut dyn TxSink, o: OpenFpdu) -> Result<usize, FramingError> {
        let len = out.len().saturating_sub(o.mark.len() + 2);
        let limit = usize::from(clamp_mulpdu(self.mulpdu));
        if len > limit {
            out.rewind(o.mark);
            return Err(FramingError::UlpduTooLarge { len, limit });
        }
        let at = o.mark.staged();
        let staged = out.staged();
        // <= 64768 checked above.
        staged[at..at + 2].copy_from_slice(&(len as u16).to_be_bytes());
        staged.extend_from_slice(&[0u8; 3][..mpa::pad_len(len)]);
        let crc = if self.crc {
            let mut c = 0;
            if let Err(e) = out.for_each_since(o.mark, &mut |s| c = mpa::crc32c_append(c, s)) {
                out.rewind(o.mark);
                return Err(FramingError::Source(e));
            }
            c
        } else {
            0
        };
        out.staged().extend_from_slice(&mpa::crc_to_wire(crc));
        let n = out.len() - o.mark.len();
        self.pos = self.pos.wrapping_add(n as u32);
        Ok(n)
    }

    /// [`frame`](Self::frame) with a MULPDU for this one FPDU (RFC 5044 §4.5
    /// allows adjusting it, MPA-37), clamped to [128, 64768] (MPA-41).
    pub fn frame_limited(
        &mut self,
        parts: &[&[u8]],
        mulpdu: u16,
        out: &mut Vec<u8>,
    ) -> Result<usize, FramingError> {
        let len = parts.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
        let limit = usize::from(clamp_mulpdu(mulpdu));
        if len > limit {
            return Err(FramingError::UlpduTooLarge { len, limit });
        }
        let total = self.encoded_len(len);
        let at = out.len();
        out.resize(at + total, 0);
        match mpa::encode_fpdu(parts, self.pos, self.markers, self.crc, &mut out[at..]) {
            Ok(n) => {
                debug_assert_eq!(n, total);
                // FPDUs are < 2^17 octets: the truncation is modular, as is the position.
                self.pos = self.pos.wrapping_add(n as u32);
                Ok(n)
            }
            Err(_) => {
                // Unreachable: the length and the alignment were checked above.
                out.truncate(at);
                Err(FramingError::Unaligned { pos: self.pos })
            }
        }
    }
}

/// An FPDU [`Framer::open`] started, for [`Framer::close`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct OpenFpdu {
    mark: TxMark,
}

impl OpenFpdu {
    /// Where the FPDU starts: rewind to it to drop the FPDU.
    pub fn mark(&self) -> TxMark {
        self.mark
    }
}

// ---------------------------------------------------------------------------
// Receive
// ---------------------------------------------------------------------------

/// Compact the reassembly buffer once this many consumed octets sit in front.
const COMPACT_AT: usize = 64 * 1024;

/// The receive side of one half connection in Full Operation (RFC 5044 §5.2,
/// §6, §8): [`push`](Self::push) arbitrary chunks of the TCP byte stream
/// (MPA-44, MPA-95), then iterate to get the ULPDUs in order, Markers,
/// length field, PAD and CRC removed (MPA-25, MPA-26).
///
/// * FPDUs are delimited by ULPDU_Length (length chaining, MPA-45/47); nothing
///   is delivered before the last CRC octet is in (MPA-48).
/// * The CRC is checked when CRCs were negotiated (MPA-34) and never when not
///   (MPA-14, MPA-31, MPA-58); PAD contents are ignored except as CRC input
///   (MPA-13, Linux siw sends non-zero PAD).
/// * Every Marker is checked against the FPDU start (MPA-87); RESERVED is
///   ignored (MPA-15), FPDUPTR's low 2 bits count as 0 (MPA-16).
/// * Errors: a CRC mismatch is [`LlpError::CrcError`] (code 2, MPA-86); a
///   Marker that disagrees with the length chaining while the CRC is good (or
///   not in use) is [`LlpError::MarkerMismatch`] (code 3). A ULPDU_Length above
///   64768 or above [`max_ulpdu`](Self::max_ulpdu) means the FPDU start can no
///   longer be trusted and is also reported as code 3 — before any octet of
///   that FPDU is buffered beyond its header, so a hostile length never turns
///   into an allocation.
/// * After an error the iterator yields it once, then only `None`; pushed
///   octets are dropped (MPA-90). Closing TCP is the ULP's decision (MPA-91).
///
/// The iterator is not fused: after `None`, push more octets and iterate again.
#[derive(Debug, Clone)]
pub struct Deframer {
    /// Stream position of `buf[start]`.
    pos: u32,
    markers: bool,
    crc: bool,
    max_ulpdu: usize,
    buf: Vec<u8>,
    start: usize,
    error: Option<LlpError>,
    error_reported: bool,
    delivered: u64,
    /// Octets of the largest FPDU among the last few delivered (see
    /// [`Deframer::recent_fpdu_len`]), and how many smaller ones may still come before it is
    /// forgotten.
    recent_len: usize,
    recent_left: u8,
    /// A ULPDU taken out from between Markers (without them it is read in place).
    scratch: Vec<u8>,
    /// The head FPDU while its payload goes around the buffer.
    bypass: Option<Bypass>,
}

/// Direct placement: the head FPDU's payload is placed by the caller as it arrives and only
/// passes through here to be counted (and CRC'd); the buffer holds its length field and
/// headers, then its PAD and CRC.
#[derive(Debug, Clone, Copy)]
struct Bypass {
    ulpdu_len: usize,
    /// ULPDU octets kept in the buffer (the headers).
    kept: usize,
    /// Payload octets still to come around.
    left: usize,
    /// CRC32c so far over the FPDU's octets (with CRCs on).
    crc: u32,
}

impl Deframer {
    /// A deframer at SeqStart (position 0) accepting ULPDUs up to 64768 octets.
    pub fn new(markers: bool, crc: bool) -> Self {
        Deframer {
            pos: 0,
            markers,
            crc,
            max_ulpdu: MAX_ULPDU,
            buf: Vec::new(),
            start: 0,
            error: None,
            error_reported: false,
            delivered: 0,
            recent_len: 0,
            recent_left: 0,
            scratch: Vec::new(),
            bypass: None,
        }
    }

    /// A deframer whose next FPDU starts `pos` octets after SeqStart (mod
    /// 2^32); with Markers `pos` must be a multiple of 4.
    pub fn with_position(markers: bool, crc: bool, pos: u32) -> Result<Self, FramingError> {
        check_position(pos, markers)?;
        Ok(Deframer {
            pos,
            ..Deframer::new(markers, crc)
        })
    }

    /// Refuse ULPDUs longer than `max` octets (at most 64768, MPA-07): e.g. the
    /// largest DDP segment the receive path can hold.
    pub fn with_max_ulpdu(mut self, max: usize) -> Self {
        self.max_ulpdu = max.min(MAX_ULPDU);
        self
    }

    /// The largest ULPDU accepted.
    pub fn max_ulpdu(&self) -> usize {
        self.max_ulpdu
    }

    /// Markers are expected (and stripped) in this direction.
    pub fn markers(&self) -> bool {
        self.markers
    }

    /// CRCs are checked in this direction.
    pub fn crc(&self) -> bool {
        self.crc
    }

    /// Stream position (from SeqStart, mod 2^32) of the first octet not yet
    /// delivered as part of a ULPDU.
    pub fn position(&self) -> u32 {
        self.pos
    }

    /// Octets pushed but not yet delivered.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Octets of the largest of the last FPDUs delivered (Markers, PAD and CRC included): a
    /// large one is remembered across up to [`RECENT_SMALL`] smaller ones after it, so a
    /// stream of large FPDUs with a small one between (a reply's Send after its Write)
    /// still counts as large; 0 before the first.
    pub fn recent_fpdu_len(&self) -> usize {
        self.recent_len
    }

    /// ULPDUs delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The error that stopped this half connection, if any (MPA-90).
    pub fn error(&self) -> Option<LlpError> {
        self.error
    }

    /// Append received stream octets. Dropped after an error (MPA-90).
    pub fn push(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            self.compact();
            self.buf.extend_from_slice(bytes);
        }
    }

    /// How many octets [`push`](Self::push) should be given next to complete the FPDU
    /// at the head of the buffer (only its header's first octets, while its ULPDU_Length is
    /// not in), so that what follows can be read in place with
    /// [`next_in`](Self::next_in): a partial FPDU is then the only input copied. 0 when
    /// nothing is buffered or the head FPDU is whole.
    pub fn wanted(&self) -> usize {
        let b = &self.buf[self.start..];
        if let Some(bp) = self.bypass {
            // Only the PAD and CRC, once the payload went around.
            return match bp.left {
                0 => bypass_trailer_end(bp).saturating_sub(b.len()),
                _ => 0,
            };
        }
        if b.is_empty() || self.error.is_some() {
            return 0;
        }
        // A Marker at the FPDU's first octet precedes ULPDU_Length (MPA-21).
        let lead = if self.markers && mpa::marker_at(self.pos) {
            MARKER_LEN
        } else {
            0
        };
        match b.get(lead..lead + 2) {
            None => lead + 2 - b.len(),
            // Too long for any FPDU: what is buffered already fails it.
            Some(l) if usize::from(u16::from_be_bytes([l[0], l[1]])) > self.max_ulpdu => 0,
            Some(l) => {
                let n = usize::from(u16::from_be_bytes([l[0], l[1]]));
                mpa::encoded_len(n, self.pos, self.markers).saturating_sub(b.len())
            }
        }
    }

    /// Drops the delivered octets in front of the buffer: all of them for free when
    /// nothing is left behind them, else once they outweigh what is (each octet is moved
    /// a bounded number of times).
    fn compact(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start >= COMPACT_AT && self.start >= self.buf.len() - self.start {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    fn fail(&mut self, e: LlpError) -> LlpError {
        self.error = Some(e);
        self.error_reported = true;
        self.buf = Vec::new();
        self.start = 0;
        self.bypass = None;
        e
    }

    /// Without Markers and before any error: the FPDU at the head of the buffer while it is
    /// partial, its ULPDU_Length in and acceptable and its ULPDU not all in: that length and
    /// the ULPDU octets buffered. What [`bypass`](Self::bypass) can start on.
    pub fn head(&self) -> Option<(usize, &[u8])> {
        if self.markers || self.error.is_some() || self.bypass.is_some() {
            return None;
        }
        let b = &self.buf[self.start..];
        let l = b.get(..ULPDU_LENGTH_LEN)?;
        let n = usize::from(u16::from_be_bytes([l[0], l[1]]));
        if n > self.max_ulpdu || b.len() >= ULPDU_LENGTH_LEN + n {
            return None;
        }
        Some((n, &b[ULPDU_LENGTH_LEN..]))
    }

    /// Direct placement of the [`head`](Self::head) FPDU's payload: its first `keep` ULPDU
    /// octets (the DDP/RDMAP headers) stay buffered; the caller has placed the buffered
    /// octets behind them, and places the [`bypass_left`](Self::bypass_left) octets still to
    /// come itself, passing each through [`bypassed`](Self::bypassed). [`push`](Self::push)
    /// then only the PAD and CRC ([`wanted`](Self::wanted)), and take the FPDU with
    /// [`next_bypassed`](Self::next_bypassed): the CRC is checked over the octets as they
    /// passed (MPA-34), so a corrupt FPDU still fails with code 2. `false` (nothing changed)
    /// when there is no such head or `keep` exceeds what is buffered.
    pub fn bypass(&mut self, keep: usize) -> bool {
        let Some((ulpdu_len, ulpdu)) = self.head() else {
            return false;
        };
        if keep > ulpdu.len() {
            return false;
        }
        let left = ulpdu_len - ulpdu.len();
        let crc = if self.crc {
            mpa::crc32c(&self.buf[self.start..])
        } else {
            0
        };
        self.buf.truncate(self.start + ULPDU_LENGTH_LEN + keep);
        self.bypass = Some(Bypass {
            ulpdu_len,
            kept: keep,
            left,
            crc,
        });
        true
    }

    /// Payload octets of the bypassed FPDU still to come around (`None`: no bypass).
    pub fn bypass_left(&self) -> Option<usize> {
        self.bypass.map(|b| b.left)
    }

    /// The next payload octets of the bypassed FPDU, placed by the caller (at most
    /// [`bypass_left`](Self::bypass_left)).
    pub fn bypassed(&mut self, octets: &[u8]) {
        let crc = self.crc;
        if let Some(bp) = self.bypass.as_mut() {
            debug_assert!(octets.len() <= bp.left, "more than the payload bypassed");
            let octets = &octets[..octets.len().min(bp.left)];
            if crc {
                bp.crc = mpa::crc32c_append(bp.crc, octets);
            }
            bp.left -= octets.len();
        }
    }

    /// The bypassed FPDU once its payload went around and its PAD and CRC are in: its
    /// kept headers and the payload octets placed, or the CRC error (once, MPA-90).
    pub fn next_bypassed(&mut self) -> Option<Result<(&[u8], usize), LlpError>> {
        let bp = self.bypass.filter(|b| b.left == 0)?;
        let end = bypass_trailer_end(bp);
        let b = self.buf.get(self.start..self.start + end)?;
        if self.crc {
            let head = ULPDU_LENGTH_LEN + bp.kept;
            let pad = &b[head..end - CRC_LEN];
            let f = &b[end - CRC_LEN..];
            if mpa::crc_from_wire([f[0], f[1], f[2], f[3]]) != mpa::crc32c_append(bp.crc, pad) {
                return Some(Err(self.fail(LlpError::CrcError))); // MPA-34, MPA-86
            }
        }
        self.bypass = None;
        self.advance(mpa::encoded_len(bp.ulpdu_len, self.pos, false));
        let at = self.start + ULPDU_LENGTH_LEN;
        self.start += end;
        Some(Ok((&self.buf[at..at + bp.kept], bp.ulpdu_len - bp.kept)))
    }

    /// The error to report now, once (MPA-90).
    fn report(&mut self) -> Option<Option<LlpError>> {
        let e = self.error?;
        if self.error_reported {
            return Some(None);
        }
        self.error_reported = true;
        Some(Some(e))
    }

    /// The next ULPDU, read where it lies (in the buffer, or out from between Markers):
    /// [`Iterator::next`] without the copy.
    pub fn next_ulpdu(&mut self) -> Option<Result<&[u8], LlpError>> {
        self.compact();
        let at = self.start;
        let buf = std::mem::take(&mut self.buf);
        let step = self.step(&buf[at..]);
        // After an error the buffer stays dropped (MPA-90).
        if self.error.is_none() {
            self.buf = buf;
        }
        Some(step?.map(|f| {
            self.start += f.total;
            match f.ulpdu {
                Some(r) => &self.buf[at + r.start..at + r.end],
                None => &self.scratch[..],
            }
        }))
    }

    /// The next ULPDU of `input`, octets of the stream that follow everything pushed so
    /// far, read in place; `input` is advanced past it. Only while nothing is buffered
    /// ([`buffered`](Self::buffered) is 0): otherwise, and for a partial FPDU left at the
    /// end of `input`, [`push`](Self::push) the rest. `None` when `input` holds no whole
    /// FPDU (or after the error was reported).
    pub fn next_in<'s, 'i: 's>(
        &'s mut self,
        input: &mut &'i [u8],
    ) -> Option<Result<&'s [u8], LlpError>> {
        debug_assert_eq!(self.buffered(), 0, "next_in behind buffered octets");
        let bytes: &'i [u8] = input;
        Some(self.step(bytes)?.map(|f| {
            *input = &bytes[f.total..];
            match f.ulpdu {
                Some(r) => &bytes[r],
                None => &self.scratch[..],
            }
        }))
    }

    /// One FPDU at the start of `bytes` (the octets after those delivered): its length and
    /// where its ULPDU lies in `bytes` (`None`: in `scratch`); the error once.
    fn step(&mut self, bytes: &[u8]) -> Option<Result<Fpdu, LlpError>> {
        if let Some(e) = self.report() {
            return e.map(Err);
        }
        if self.bypass.is_some() {
            return None; // `next_bypassed` delivers it
        }
        match parse(
            bytes,
            self.pos,
            self.markers,
            self.crc,
            self.max_ulpdu,
            &mut self.scratch,
        ) {
            Parsed::Need => None,
            Parsed::Fail(e) => Some(Err(self.fail(e))),
            Parsed::Done(f) => {
                self.advance(f.total);
                Some(Ok(f))
            }
        }
    }

    fn advance(&mut self, n: usize) {
        // FPDUs are < 2^17 octets: the truncation is modular, as is the position.
        self.pos = self.pos.wrapping_add(n as u32);
        self.delivered += 1;
        if n >= self.recent_len || self.recent_left == 0 {
            self.recent_len = n;
            self.recent_left = RECENT_SMALL;
        } else {
            self.recent_left -= 1;
        }
    }
}

/// Smaller FPDUs after a large one before [`Deframer::recent_fpdu_len`] forgets it.
pub const RECENT_SMALL: u8 = 4;

/// Buffered octets of a bypassed FPDU once complete: length field, kept headers, PAD, CRC.
fn bypass_trailer_end(bp: Bypass) -> usize {
    ULPDU_LENGTH_LEN + bp.kept + mpa::pad_len(bp.ulpdu_len) + CRC_LEN
}

/// One step of deframing.
enum Parsed {
    /// The FPDU is not all there yet (MPA-48).
    Need,
    Fail(LlpError),
    Done(Fpdu),
}

/// An FPDU of `total` octets; its ULPDU at `ulpdu` in the input, or in the scratch vector
/// (`None`: taken out from between Markers).
struct Fpdu {
    total: usize,
    ulpdu: Option<std::ops::Range<usize>>,
}

/// The FPDU at the start of `input`, whose first octet is at stream position `pos`.
fn parse(
    input: &[u8],
    pos: u32,
    markers: bool,
    crc: bool,
    max_ulpdu: usize,
    scratch: &mut Vec<u8>,
) -> Parsed {
    // A Marker at the FPDU's first octet precedes ULPDU_Length (MPA-21).
    let lead = if markers && mpa::marker_at(pos) {
        MARKER_LEN
    } else {
        0
    };
    let Some(len_field) = input.get(lead..lead + 2) else {
        return Parsed::Need;
    };
    let ulpdu_len = usize::from(u16::from_be_bytes([len_field[0], len_field[1]]));
    if ulpdu_len > max_ulpdu {
        // No sender may post this (MPA-07): the FPDU start is lost (§8 code 3).
        return Parsed::Fail(LlpError::MarkerMismatch);
    }
    let total = mpa::encoded_len(ulpdu_len, pos, markers);
    let Some(fpdu) = input.get(..total) else {
        return Parsed::Need; // MPA-48: wait for the whole FPDU.
    };
    let crc_at = total - CRC_LEN;
    let crc_good = || {
        let f = &fpdu[crc_at..];
        mpa::crc_from_wire([f[0], f[1], f[2], f[3]]) == mpa::crc32c(&fpdu[..crc_at])
    };
    if !markers {
        // The ULPDU lies whole after its length (RFC 5044 §4.1).
        if crc && !crc_good() {
            return Parsed::Fail(LlpError::CrcError); // MPA-34, MPA-86
        }
        return Parsed::Done(Fpdu {
            total,
            ulpdu: Some(2..2 + ulpdu_len),
        });
    }
    scratch.clear();
    scratch.resize(ulpdu_len, 0);
    match mpa::decode_fpdu_with(fpdu, pos, markers, scratch, crc) {
        Ok(Some(info)) if !crc || info.crc_ok() => Parsed::Done(Fpdu { total, ulpdu: None }),
        Ok(Some(_)) => Parsed::Fail(LlpError::CrcError),
        // A Marker disagrees with the length chaining. RFC 5044 §8 calls that code 3 only
        // when the CRC is valid; a bad CRC is code 2.
        Ok(None) | Err(_) => Parsed::Fail(if crc && !crc_good() {
            LlpError::CrcError
        } else {
            LlpError::MarkerMismatch
        }),
    }
}

impl Iterator for Deframer {
    type Item = Result<Vec<u8>, LlpError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_ulpdu().map(|r| r.map(<[u8]>::to_vec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use softrdma_testkit::pattern;

    /// Frame `ulpdus` back to back from `start`.
    fn stream(ulpdus: &[Vec<u8>], start: u32, markers: bool, crc: bool) -> Vec<u8> {
        let mut f = Framer::with_position(markers, crc, start).unwrap();
        let mut out = Vec::new();
        for u in ulpdus {
            f.frame(&[u], &mut out).unwrap();
        }
        assert_eq!(f.position(), start.wrapping_add(out.len() as u32));
        out
    }

    fn drain(d: &mut Deframer) -> Vec<Result<Vec<u8>, LlpError>> {
        d.by_ref().collect()
    }

    fn deframe_chunks(
        s: &[u8],
        start: u32,
        markers: bool,
        crc: bool,
        chunks: impl Iterator<Item = usize>,
    ) -> Vec<Vec<u8>> {
        let mut d = Deframer::with_position(markers, crc, start).unwrap();
        let mut got = Vec::new();
        let mut off = 0;
        for c in chunks {
            if off >= s.len() {
                break;
            }
            let end = (off + c.max(1)).min(s.len());
            d.push(&s[off..end]);
            off = end;
            for r in d.by_ref() {
                got.push(r.expect("valid stream"));
            }
        }
        if off < s.len() {
            d.push(&s[off..]);
            for r in d.by_ref() {
                got.push(r.expect("valid stream"));
            }
        }
        assert_eq!(d.buffered(), 0);
        assert_eq!(d.position(), start.wrapping_add(s.len() as u32));
        got
    }

    /// Sizes that exercise every PAD length and Markers at every place an
    /// FPDU can hold one (between FPDUs, inside, right before the CRC).
    fn sizes() -> Vec<Vec<u8>> {
        [
            0usize, 1, 2, 3, 4, 5, 14, 18, 28, 42, 100, 127, 128, 500, 502, 503, 506, 507, 508,
            509, 510, 511, 512, 513, 1014, 1018, 1454, 2000,
        ]
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, u64::from(i as u8)))
        .collect()
    }

    const STARTS: [u32; 9] = [
        0,
        4,
        252,
        508,
        0xFFFF_FE00,
        0xFFFF_FF00,
        0xFFFF_FFF0,
        0xFFFF_FFFC,
        0x7FFF_FFFC,
    ];

    /// MPA-25/26/44/48/95, MPA-20: a stream fed one octet at a time yields
    /// exactly the ULPDUs framed, for CRC on/off × Markers on/off, from
    /// positions around 0, 512 boundaries and the 2^32 wrap.
    #[test]
    fn mpa_44_one_octet_feeding_all_modes_and_wrap() {
        let u = sizes();
        for markers in [false, true] {
            for crc in [false, true] {
                for start in STARTS {
                    let s = stream(&u, start, markers, crc);
                    let got = deframe_chunks(&s, start, markers, crc, std::iter::repeat(1));
                    assert_eq!(got, u, "markers {markers} crc {crc} start {start:#x}");
                }
            }
        }
    }

    /// MPA-48: with one-octet feeding a ULPDU appears exactly when its last
    /// CRC octet arrives, never earlier.
    #[test]
    fn mpa_48_delivery_only_after_last_crc_octet() {
        for markers in [false, true] {
            let u = pattern(600, 7);
            let mut f = Framer::with_position(markers, true, 500).unwrap();
            let mut s = Vec::new();
            f.frame(&[&u], &mut s).unwrap();
            let mut d = Deframer::with_position(markers, true, 500).unwrap();
            for (i, b) in s.iter().enumerate() {
                d.push(&[*b]);
                let r: Vec<_> = drain(&mut d);
                if i + 1 < s.len() {
                    assert!(r.is_empty(), "delivered early at {i}");
                } else {
                    assert_eq!(r, vec![Ok(u.clone())]);
                }
            }
        }
    }

    /// MPA-03/25: every split point of a two-FPDU stream (cut in two) and the
    /// whole stream at once give the same records.
    #[test]
    fn every_single_cut_point() {
        for markers in [false, true] {
            for crc in [false, true] {
                let u = vec![pattern(505, 1), pattern(9, 2), pattern(1100, 3)];
                let s = stream(&u, 0xFFFF_FF00, markers, crc);
                for cut in 0..=s.len() {
                    let got =
                        deframe_chunks(&s, 0xFFFF_FF00, markers, crc, [cut, s.len()].into_iter());
                    assert_eq!(got, u, "cut {cut}");
                }
            }
        }
    }

    /// MPA-22/76, MPA-18, MPA-17, MPA-11/32/33: a fresh framer with Markers
    /// reproduces RFC 5044 Fig. 5 and Fig. 6 byte for byte (first Marker
    /// 00000000, then a Marker at stream offset 512 with FPDUPTR 0x14).
    #[test]
    fn mpa_22_seed_figures_5_and_6() {
        let seed = |msn: u8| {
            let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, msn, 0, 0, 0, 0];
            u.resize(42, 0);
            u
        };
        let mut f = Framer::new(true, true);
        let mut out = Vec::new();
        assert_eq!(f.frame(&[&seed(1)], &mut out).unwrap(), 0x34);
        assert_eq!(&out[..6], &[0, 0, 0, 0, 0x00, 0x2a]);
        assert_eq!(&out[0x30..0x34], &[0x52, 0x23, 0x99, 0x83]);
        // Fig. 6: the FPDU at 0x1ec (the first FPDU there occupied 492 octets).
        let mut f = Framer::new(true, true);
        let mut out = Vec::new();
        assert_eq!(f.frame(&[&pattern(482, 0)], &mut out).unwrap(), 492);
        assert_eq!(f.position(), 0x1ec);
        // Gather list: header and payload as separate parts.
        let u = seed(2);
        assert_eq!(f.frame(&[&u[..18], &u[18..]], &mut out).unwrap(), 0x34);
        let fig6 = &out[0x1ec..];
        assert_eq!(&fig6[..2], &[0x00, 0x2a]);
        assert_eq!(&fig6[0x200 - 0x1ec..0x204 - 0x1ec], &[0, 0, 0, 0x14]);
        assert_eq!(&fig6[0x21c - 0x1ec..], &[0x84, 0x92, 0x58, 0x98]);
        // And back: the Deframer strips both Markers (MPA-26).
        let mut d = Deframer::new(true, true);
        d.push(&out);
        assert_eq!(drain(&mut d), vec![Ok(pattern(482, 0)), Ok(seed(2))]);
    }

    /// MPA-18/19/21/23/24: Markers sit at every 512-octet stream offset from
    /// SeqStart (seed example SeqStart=11: 11, 523, 1035 — here as offsets
    /// 0, 512, 1024) and point back to the FPDU that holds them (or are 0
    /// between FPDUs).
    #[test]
    fn mpa_18_marker_every_512_octets() {
        let u: Vec<Vec<u8>> = (0..40)
            .map(|i| pattern(16 + 37 * i, u64::from(i as u8)))
            .collect();
        let s = stream(&u, 0, true, true);
        // FPDU starts by length chaining.
        let mut starts = Vec::new();
        let mut off = 0usize;
        for x in &u {
            starts.push(off);
            off += mpa::encoded_len(x.len(), off as u32, true);
        }
        assert_eq!(off, s.len());
        for m in (0..s.len()).step_by(512) {
            let ptr = usize::from(u16::from_be_bytes([s[m + 2], s[m + 3]]));
            assert_eq!(&s[m..m + 2], &[0, 0], "RESERVED at {m}");
            let owner = starts.iter().rev().find(|&&st| st <= m).copied().unwrap();
            if owner == m {
                assert_eq!(ptr, 0, "Marker between FPDUs at {m}");
            } else {
                // Points at the ULPDU_Length of its FPDU (after a leading Marker).
                let hdr = if owner % 512 == 0 { owner + 4 } else { owner };
                assert_eq!(ptr, m - hdr, "FPDUPTR at {m}");
            }
        }
        assert_eq!(
            deframe_chunks(&s, 0, true, true, [333].into_iter().cycle()),
            u
        );
    }

    /// MPA-03: N ULPDUs make exactly N FPDUs and the Deframer yields N records.
    #[test]
    fn mpa_03_one_ulpdu_per_fpdu() {
        let u: Vec<Vec<u8>> = (0..25)
            .map(|i| pattern(i * 3, u64::from(i as u8)))
            .collect();
        for markers in [false, true] {
            let mut f = Framer::new(markers, true);
            let mut out = Vec::new();
            let mut lens = Vec::new();
            for x in &u {
                lens.push(f.frame(&[x], &mut out).unwrap());
            }
            assert_eq!(lens.len(), 25);
            assert_eq!(lens.iter().sum::<usize>(), out.len());
            let mut d = Deframer::new(markers, true);
            d.push(&out);
            assert_eq!(drain(&mut d).len(), 25);
            assert_eq!(d.delivered(), 25);
        }
    }

    /// MPA-05/07/40: the framer refuses ULPDUs above the MULPDU (construction
    /// or per call) and above 64768 always; nothing is appended, the position
    /// stays; MULPDUs are clamped to [128, 64768].
    /// Closing in place at the length limits: the octets [`Framer::frame`] makes, up to a
    /// 64768-octet ULPDU; one more is refused and leaves `out` as it was.
    #[test]
    fn bypassed_fpdus_checked_and_counted_as_whole_ones() {
        for crc in [false, true] {
            for len in [20usize, 21, 22, 23, 1000, MAX_ULPDU] {
                for keep in [0usize, 1, 14] {
                    let a = pattern(len, 1);
                    let b = pattern(30, 2);
                    let mut wire = Vec::new();
                    let mut f = Framer::new(false, crc);
                    f.frame(&[&a], &mut wire).unwrap();
                    f.frame(&[&b], &mut wire).unwrap();
                    for corrupt in [None, Some(2 + len - 1)] {
                        let mut w = wire.clone();
                        if let Some(at) = corrupt {
                            w[at] ^= 1;
                        }
                        let mut d = Deframer::new(false, crc);
                        // The length and `keep + 3` ULPDU octets, one at a time (MPA-48).
                        for o in &w[..2 + keep + 3] {
                            d.push(std::slice::from_ref(o));
                            assert!(d.next_ulpdu().is_none());
                        }
                        let (n, buffered) = d.head().expect("a partial head FPDU");
                        assert_eq!((n, buffered), (len, &a[..keep + 3]));
                        assert!(d.bypass(keep));
                        assert_eq!(d.bypass_left(), Some(len - keep - 3));
                        assert_eq!(d.wanted(), 0);
                        // The payload goes around in two pieces.
                        let rest = &w[2 + keep + 3..2 + len];
                        let (x, y) = rest.split_at(rest.len() / 2);
                        d.bypassed(x);
                        d.bypassed(y);
                        assert_eq!(d.bypass_left(), Some(0));
                        let trailer = 2 + len + mpa::pad_len(len) + CRC_LEN;
                        assert_eq!(d.wanted(), trailer - 2 - len);
                        for o in &w[2 + len..trailer] {
                            assert!(d.next_bypassed().is_none());
                            d.push(std::slice::from_ref(o));
                        }
                        match (d.next_bypassed(), corrupt, crc) {
                            (Some(Ok((head, placed))), None, _)
                            | (Some(Ok((head, placed))), _, false) => {
                                assert_eq!((head, placed), (&a[..keep], len - keep));
                            }
                            (Some(Err(LlpError::CrcError)), Some(_), true) => {
                                assert!(d.next_ulpdu().is_none());
                                continue;
                            }
                            (other, ..) => panic!("{other:?} {crc} {len} {keep} {corrupt:?}"),
                        }
                        // Positions agree: the next FPDU deframes as usual.
                        assert_eq!(d.position() as usize, trailer);
                        assert_eq!(d.delivered(), 1);
                        d.push(&w[trailer..]);
                        assert_eq!(d.next_ulpdu().unwrap().unwrap(), &b[..]);
                    }
                }
            }
        }
    }

    #[test]
    fn closed_in_place_as_framed_at_the_limits() {
        for len in [0usize, 1, 2, 3, 4, 5, 511, 512, 1000, MAX_ULPDU] {
            let ulpdu = pattern(len, 3);
            for crc in [false, true] {
                let mut f = Framer::new(false, crc);
                let mut out = vec![0xEE; 5];
                let o = f.open(&mut out).expect("no Markers");
                out.extend_from_slice(&ulpdu);
                let n = f.close(&mut out, o).unwrap();
                assert_eq!(n, out.len() - 5);
                assert_eq!(&out[..5], &[0xEE; 5]);
                let mut framed = Vec::new();
                Framer::new(false, crc)
                    .frame(&[&ulpdu], &mut framed)
                    .unwrap();
                assert_eq!(out[5..], framed[..], "{len} {crc}");
            }
        }
        let mut f = Framer::new(false, false);
        let mut out = vec![0xEE; 5];
        let o = f.open(&mut out).expect("no Markers");
        out.resize(out.len() + MAX_ULPDU + 1, 0);
        assert!(matches!(
            f.close(&mut out, o),
            Err(FramingError::UlpduTooLarge { .. })
        ));
        assert_eq!(out, [0xEE; 5]);
        assert_eq!(f.position(), 0);
    }

    #[test]
    fn mpa_07_mulpdu_enforced() {
        let mut f = Framer::new(false, true).with_mulpdu(mulpdu(1460, false));
        assert_eq!(f.mulpdu(), 1454);
        let mut out = vec![9u8; 3];
        let big = vec![0u8; 1455];
        assert_eq!(
            f.frame(&[&big[..1000], &big[1000..]], &mut out),
            Err(FramingError::UlpduTooLarge {
                len: 1455,
                limit: 1454
            })
        );
        assert_eq!((out.len(), f.position()), (3, 0));
        assert_eq!(f.frame(&[&big[..1454]], &mut out), Ok(1460));
        // Per call (MPA-37), clamped up to 128 (MPA-41).
        assert_eq!(
            f.frame_limited(&[&big[..200]], 100, &mut out),
            Err(FramingError::UlpduTooLarge {
                len: 200,
                limit: 128
            })
        );
        assert!(f.frame_limited(&[&big[..128]], 60, &mut out).is_ok());
        // MPA-07: 64769 never goes out, whatever the MULPDU asked for.
        let mut f = Framer::new(true, true).with_mulpdu(u16::MAX);
        assert_eq!(f.mulpdu(), 64768);
        let huge = vec![0u8; MAX_ULPDU + 1];
        let mut out = Vec::new();
        assert_eq!(
            f.frame(&[&huge], &mut out),
            Err(FramingError::UlpduTooLarge {
                len: 64769,
                limit: 64768
            })
        );
        assert!(out.is_empty());
        assert!(f.frame(&[&huge[..MAX_ULPDU]], &mut out).is_ok());
        let mut d = Deframer::new(true, true);
        d.push(&out);
        assert_eq!(drain(&mut d), vec![Ok(huge[..MAX_ULPDU].to_vec())]);
        // MPA-40: the floor.
        f.set_mulpdu(0);
        assert_eq!(f.mulpdu(), 128);
        // MPA-39: recomputed MULPDU for a new EMSS applies to the next FPDU.
        f.set_mulpdu(mulpdu(536, true));
        assert_eq!(f.mulpdu(), 522);
    }

    #[test]
    fn unaligned_positions_refused_with_markers() {
        for pos in [1u32, 2, 3, 0xFFFF_FFFF] {
            assert_eq!(
                Framer::with_position(true, true, pos),
                Err(FramingError::Unaligned { pos })
            );
            assert!(Deframer::with_position(true, false, pos).is_err());
            assert!(Framer::with_position(false, true, pos).is_ok());
            assert!(Deframer::with_position(false, true, pos).is_ok());
        }
    }

    /// MPA-34/86, MPA-90: flipping any single bit of an FPDU with CRCs on
    /// (ULPDU, PAD, embedded Marker or CRC field) is a CRC error; that ULPDU
    /// and every later (valid) FPDU are never delivered. (A flipped
    /// ULPDU_Length changes the framing itself: see `prop_corruption_detected`.)
    #[test]
    fn mpa_90_crc_error_on_any_bit_flip_then_nothing() {
        for markers in [false, true] {
            let u = vec![pattern(40, 1), pattern(530, 2), pattern(33, 3)];
            let s = stream(&u, 0, markers, true);
            let first = mpa::encoded_len(40, 0, markers);
            let second = mpa::encoded_len(530, first as u32, markers);
            assert!(!first.is_multiple_of(512), "no leading Marker on FPDU 2");
            if markers {
                assert!(first < 512 && 516 <= first + second, "Marker inside FPDU 2");
            }
            for byte in first + 2..first + second {
                for bit in 0..8 {
                    let mut bad = s.clone();
                    bad[byte] ^= 1 << bit;
                    let mut d = Deframer::new(markers, true);
                    d.push(&bad);
                    assert_eq!(
                        drain(&mut d),
                        vec![Ok(u[0].clone()), Err(LlpError::CrcError)],
                        "byte {byte} bit {bit}"
                    );
                    // MPA-90: pushing more valid octets changes nothing.
                    d.push(&s);
                    assert!(drain(&mut d).is_empty());
                    assert_eq!(d.error(), Some(LlpError::CrcError));
                }
            }
        }
    }

    /// MPA-14/31/58: with CRCs off the CRC field may hold anything.
    #[test]
    fn mpa_14_crc_not_checked_when_off() {
        for markers in [false, true] {
            let u = vec![pattern(40, 1), pattern(700, 2)];
            let mut s = stream(&u, 0, markers, true); // real CRCs ...
            let n = s.len();
            for b in &mut s[n - 4..] {
                *b ^= 0xA5; // ... one of them now wrong
            }
            let mut d = Deframer::new(markers, false);
            d.push(&s);
            assert_eq!(drain(&mut d), vec![Ok(u[0].clone()), Ok(u[1].clone())]);
            // The same stream with checking on: error 2 for the second one.
            let mut d = Deframer::new(markers, true);
            d.push(&s);
            assert_eq!(
                drain(&mut d),
                vec![Ok(u[0].clone()), Err(LlpError::CrcError)]
            );
            // Zero CRC fields (what siw sends with CRC off) are fine too.
            let z = stream(&u, 0, markers, false);
            let mut d = Deframer::new(markers, false);
            d.push(&z);
            assert_eq!(drain(&mut d).len(), 2);
        }
    }

    /// Rewrite the CRC field of the FPDU at `s[at..at + len]` (stream position `at`).
    fn fix_crc(s: &mut [u8], at: usize, len: usize) {
        let c = mpa::crc32c(&s[at..at + len - 4]);
        s[at + len - 4..at + len].copy_from_slice(&mpa::crc_to_wire(c));
    }

    /// MPA-87: a Marker whose FPDUPTR is wrong but whose FPDU has a valid CRC
    /// is error 3; with the CRC left stale it is error 2; without CRCs it is
    /// error 3. MPA-15/16: RESERVED and FPDUPTR's low bits are ignored.
    #[test]
    fn mpa_87_marker_mismatch_and_ignored_bits() {
        let u = vec![pattern(600, 1), pattern(20, 2)];
        let s = stream(&u, 0, true, true);
        let first = mpa::encoded_len(600, 0, true);
        // The Marker at offset 512 lies inside the first FPDU.
        let mut bad = s.clone();
        bad[515] = bad[515].wrapping_add(4);
        let mut d = Deframer::new(true, true);
        d.push(&bad);
        assert_eq!(drain(&mut d), vec![Err(LlpError::CrcError)]);
        fix_crc(&mut bad, 0, first);
        let mut d = Deframer::new(true, true);
        d.push(&bad);
        assert_eq!(drain(&mut d), vec![Err(LlpError::MarkerMismatch)]);
        let mut d = Deframer::new(true, false);
        d.push(&bad);
        assert_eq!(drain(&mut d), vec![Err(LlpError::MarkerMismatch)]);
        // Leading Marker (offset 0) with a non-zero FPDUPTR, valid CRC.
        let mut bad = s.clone();
        bad[3] = 8;
        fix_crc(&mut bad, 0, first);
        let mut d = Deframer::new(true, true);
        d.push(&bad);
        assert_eq!(drain(&mut d), vec![Err(LlpError::MarkerMismatch)]);
        // MPA-15: RESERVED = 0xFFFF with a recomputed CRC is accepted.
        let mut ok = s.clone();
        ok[512] = 0xFF;
        ok[513] = 0xFF;
        fix_crc(&mut ok, 0, first);
        // MPA-16: FPDUPTR low bits set, recomputed CRC: same back-pointer.
        ok[515] |= 3;
        fix_crc(&mut ok, 0, first);
        let mut d = Deframer::new(true, true);
        d.push(&ok);
        assert_eq!(drain(&mut d), vec![Ok(u[0].clone()), Ok(u[1].clone())]);
    }

    /// MPA-13: a non-zero PAD covered by a valid CRC is accepted (siw does not
    /// zero its PAD); siw-crc-ib_write_bw.pcap frame 18.
    #[test]
    fn mpa_13_siw_nonzero_pad_accepted() {
        const SIW_PAD2: [u8; 28] = [
            0x00, 0x14, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x33, 0x00, 0x00, 0x40, 0xbf, 0xe0, 0xac, 0x94,
        ];
        let mut d = Deframer::new(false, true);
        d.push(&SIW_PAD2);
        assert_eq!(drain(&mut d), vec![Ok(SIW_PAD2[2..22].to_vec())]);
    }

    /// siw-crc-rping.pcap frames 11 and 13 (10.77.1.3 -> 10.77.1.2, the
    /// Initiator's first two FPDUs, stream offsets 0 and 40 from SeqStart)
    /// carry real CRC32c values: the Deframer accepts both, even split at
    /// every octet boundary; our Framer re-encodes frame 11 byte for byte.
    #[test]
    fn siw_crc_rping_fpdus() {
        const F11: [u8; 40] = [
            0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x51, 0x73, 0x0d, 0xd3, 0x70,
            0x2e, 0xca, 0x7c, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x83, 0x31, 0x57,
        ];
        const F13: [u8; 84] = [
            0x00, 0x4e, 0xc1, 0x42, 0x23, 0x32, 0x96, 0x00, 0x00, 0x00, 0x55, 0xb6, 0x53, 0x8e,
            0x75, 0x50, 0x72, 0x64, 0x6d, 0x61, 0x2d, 0x70, 0x69, 0x6e, 0x67, 0x2d, 0x30, 0x3a,
            0x20, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d,
            0x4e, 0x4f, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b,
            0x5c, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
            0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0x00, 0x2f, 0xfa, 0x03, 0x76,
        ];
        let s = [&F11[..], &F13[..]].concat();
        let want = vec![F11[2..36].to_vec(), F13[2..80].to_vec()];
        assert_eq!(
            deframe_chunks(&s, 0, false, true, std::iter::repeat(1)),
            want
        );
        for cut in 0..=s.len() {
            assert_eq!(
                deframe_chunks(&s, 0, false, true, [cut, s.len()].into_iter()),
                want
            );
        }
        // PAD of frame 11 is `00 40`: our encoder sends zeros, so the
        // octets differ only there and in the CRC.
        let mut f = Framer::new(false, true);
        let mut out = Vec::new();
        f.frame(&[&F11[2..36]], &mut out).unwrap();
        assert_eq!(&out[..36], &F11[..36]);
    }

    /// Hostile ULPDU_Length: above 64768 (or the configured bound) is error 3
    /// as soon as the two length octets are in, without buffering the body.
    #[test]
    fn hostile_length_is_an_error_not_an_allocation() {
        for markers in [false, true] {
            let lead: &[u8] = if markers { &[0, 0, 0, 0] } else { &[] };
            let mut d = Deframer::new(markers, true);
            d.push(lead);
            d.push(&[0xFD]);
            assert!(drain(&mut d).is_empty());
            d.push(&[0x01]); // 0xFD01 = 64769
            assert_eq!(drain(&mut d), vec![Err(LlpError::MarkerMismatch)]);
            assert_eq!(d.buffered(), 0);
            let mut d = Deframer::new(markers, false).with_max_ulpdu(1000);
            assert_eq!(d.max_ulpdu(), 1000);
            d.push(lead);
            d.push(&1001u16.to_be_bytes());
            assert_eq!(drain(&mut d), vec![Err(LlpError::MarkerMismatch)]);
            // 64768 itself is fine (and still waits for the body).
            let mut d = Deframer::new(markers, false).with_max_ulpdu(usize::MAX);
            assert_eq!(d.max_ulpdu(), MAX_ULPDU);
            d.push(lead);
            d.push(&64768u16.to_be_bytes());
            assert!(drain(&mut d).is_empty());
        }
    }

    /// After an error the iterator yields it exactly once.
    #[test]
    fn error_reported_once_then_none() {
        let mut d = Deframer::new(false, true);
        d.push(&[0xFF, 0xFF]);
        assert_eq!(d.next(), Some(Err(LlpError::MarkerMismatch)));
        assert_eq!(d.next(), None);
        assert_eq!(d.next(), None);
        assert_eq!(d.error(), Some(LlpError::MarkerMismatch));
        d.push(&[0; 100]);
        assert_eq!(d.buffered(), 0);
    }

    /// Long runs keep the reassembly buffer compact.
    #[test]
    fn buffer_stays_bounded() {
        let u: Vec<Vec<u8>> = (0..400)
            .map(|i| pattern(1000, u64::from(i as u8)))
            .collect();
        let s = stream(&u, 0, true, true);
        let mut d = Deframer::new(true, true);
        let mut n = 0;
        for c in s.chunks(1500) {
            d.push(c);
            for r in d.by_ref() {
                assert_eq!(r.unwrap(), u[n]);
                n += 1;
            }
            assert!(d.buf.len() < COMPACT_AT + 4096, "{}", d.buf.len());
        }
        assert_eq!(n, 400);
    }

    fn arb_start() -> impl Strategy<Value = u32> {
        prop_oneof![
            0u32..4096,
            any::<u32>(),
            (0u32..256).prop_map(|d| 0u32.wrapping_sub(d * 4)),
        ]
        .prop_map(|p| p & !3)
    }

    proptest! {
        /// MPA-25/44/95: random ULPDU sizes, random chunking, any start
        /// position (wrap included), CRC and Markers on/off.
        #[test]
        fn prop_random_splits(
            sizes in proptest::collection::vec(0usize..2000, 1..16),
            chunks in proptest::collection::vec(1usize..1500, 1..40),
            start in arb_start(),
            markers: bool,
            crc: bool,
        ) {
            let u: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, u64::from(i as u8))).collect();
            let s = stream(&u, start, markers, crc);
            let got = deframe_chunks(&s, start, markers, crc, chunks.iter().copied().cycle());
            prop_assert_eq!(&got, &u);
            // Read in place as a connection does: whole FPDUs from each chunk as it comes,
            // a partial one completed from the next chunk with only what it lacks
            // (`wanted`), the rest buffered.
            let mut d = Deframer::with_position(markers, crc, start).unwrap();
            let mut direct = Vec::new();
            let mut off = 0;
            let mut pushed = 0;
            let mut cuts = Vec::new();
            for c in chunks.iter().copied().cycle() {
                if off >= s.len() {
                    break;
                }
                let end = (off + c).min(s.len());
                let mut rest = &s[off..end];
                off = end;
                cuts.push(end);
                loop {
                    while d.buffered() == 0 {
                        match d.next_in(&mut rest) {
                            Some(r) => direct.push(r.expect("valid stream").to_vec()),
                            None => break,
                        }
                    }
                    let n = d.wanted().min(rest.len());
                    if n == 0 {
                        break;
                    }
                    d.push(&rest[..n]);
                    pushed += n;
                    rest = &rest[n..];
                    while let Some(r) = d.next_ulpdu() {
                        direct.push(r.expect("valid stream").to_vec());
                    }
                }
                pushed += rest.len();
                d.push(rest);
                while let Some(r) = d.next_ulpdu() {
                    direct.push(r.expect("valid stream").to_vec());
                }
            }
            // Copied: only FPDUs that a chunk's end cuts.
            let (mut at, mut pos, mut bound) = (0usize, start, 0usize);
            for x in &u {
                let len = mpa::encoded_len(x.len(), pos, markers);
                if cuts.iter().any(|&c| at < c && c < at + len) {
                    bound += len;
                }
                at += len;
                pos = pos.wrapping_add(len as u32);
            }
            prop_assert!(pushed <= bound, "{} octets pushed, {} in cut FPDUs", pushed, bound);
            prop_assert_eq!(d.buffered(), 0);
            prop_assert_eq!(d.position(), start.wrapping_add(s.len() as u32));
            prop_assert_eq!(direct, u);
        }

        /// Framing in place ([`Framer::open`], [`Framer::close`]) puts out the octets
        /// [`Framer::frame`] does.
        #[test]
        fn prop_sealed_in_place_as_framed(
            sizes in proptest::collection::vec(0usize..2000, 1..16),
            start in arb_start(),
            crc: bool,
        ) {
            let u: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, u64::from(i as u8))).collect();
            let mut f = Framer::with_position(false, crc, start).unwrap();
            let mut out = vec![0xAB; 3];
            for x in &u {
                let o = f.open(&mut out).expect("no Markers");
                out.extend_from_slice(x);
                f.close(&mut out, o).unwrap();
            }
            prop_assert_eq!(f.position(), start.wrapping_add(out.len() as u32 - 3));
            prop_assert_eq!(&out[3..], &stream(&u, start, false, crc)[..]);
            prop_assert!(Framer::new(true, crc).open(&mut out).is_none());
        }

        /// Arbitrary octets never panic the Deframer; whatever it delivers
        /// before an error re-frames to a prefix of the input.
        #[test]
        fn prop_garbage_never_panics(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
            start in arb_start(),
            markers: bool,
            crc: bool,
            chunk in 1usize..700,
        ) {
            let mut d = Deframer::with_position(markers, crc, start).unwrap();
            let mut f = Framer::with_position(markers, true, start).unwrap();
            let mut re = Vec::new();
            let mut errors = 0;
            for c in data.chunks(chunk) {
                d.push(c);
                for r in d.by_ref() {
                    match r {
                        Ok(u) => { f.frame(&[&u], &mut re).unwrap(); }
                        Err(_) => errors += 1,
                    }
                }
            }
            prop_assert!(errors <= 1);
            prop_assert!(re.len() <= data.len());
            prop_assert_eq!(d.position(), start.wrapping_add(re.len() as u32));
        }

        /// MPA-34/90: one corrupted octet anywhere in a CRC-protected stream:
        /// every ULPDU before the damaged FPDU is delivered intact, then one
        /// error, then nothing.
        #[test]
        fn prop_corruption_detected(
            sizes in proptest::collection::vec(0usize..1200, 2..8),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
            start in arb_start(),
            markers: bool,
        ) {
            let u: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, u64::from(i as u8))).collect();
            let mut s = stream(&u, start, markers, true);
            let i = at.index(s.len());
            s[i] ^= flip;
            let mut d = Deframer::with_position(markers, true, start).unwrap();
            d.push(&s);
            let r: Vec<_> = d.by_ref().collect();
            let ok: Vec<Vec<u8>> = r.iter().filter_map(|x| x.clone().ok()).collect();
            let errors = r.iter().filter(|x| x.is_err()).count();
            if errors == 0 {
                // Only a ULPDU_Length made larger can do this: the FPDU then
                // waits for octets that never come, and nothing is delivered.
                prop_assert!(d.buffered() > 0);
            } else {
                prop_assert_eq!(errors, 1);
                prop_assert!(r.last().unwrap().is_err());
            }
            prop_assert!(ok.len() < u.len());
            prop_assert_eq!(&ok[..], &u[..ok.len()]);
            // The damaged FPDU is the first one not delivered.
            let mut off = 0usize;
            for x in &u[..ok.len()] {
                off += mpa::encoded_len(x.len(), start.wrapping_add(off as u32), markers);
            }
            prop_assert!(i >= off);
        }
    }
}
