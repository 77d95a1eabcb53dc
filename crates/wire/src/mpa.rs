//! MPA — Marker PDU Aligned Framing for TCP (RFC 5044, updated by RFC 6581).
//!
//! Three layers of codec live here, none of which allocates or panics:
//!
//! * **Startup frames** (RFC 5044 §7.1.1): [`Frame`] view and [`FrameRepr`], the
//!   RFC 6581 IRD/ORD word [`Rev2Params`] at the front of rev-2 Private Data.
//! * **FPDUs** (RFC 5044 §4.1): [`Fpdu`] view and [`FpduRepr`] over one FPDU
//!   *without* Markers, plus [`pad_len`] / [`fpdu_len`].
//! * **The stream codec** (RFC 5044 §4.2-4.4): [`encoded_len`], [`encode_fpdu`]
//!   and [`decode_fpdu`] place, strip and check Markers for an FPDU at any
//!   position of the Full Operation stream and compute the CRC over exactly
//!   the octets §4.4 names (MPA-33).
//!
//! Plus the CRC32c helpers (§4.4), the MULPDU rule (§4.5, [`mulpdu`]) and the
//! LLP Terminate error codes ([`LlpError`], RFC 5044 §8 / RFC 6581).
//!
//! **Interop.** Linux siw (6.12) does not zero its PAD: siw-crc-ib_write_bw
//! frame 18 ends its ULPDU with PAD `00 40`, covered by a valid CRC. Decoding
//! therefore ignores PAD except as CRC input (MPA-13) and [`FpduRepr`] keeps it
//! for byte-exact re-emission; our encoder always sends zeros.
//!
//! **Stream positions.** `stream_pos` is always the offset of an octet from
//! `SeqStart` (the TCP sequence number of the first octet of Full Operation in
//! that direction, where the first Marker sits), modulo 2^32. A Marker starts
//! at every `stream_pos` with `stream_pos % 512 == 0` (MPA-18); since 2^32 is a
//! multiple of 512, sequence-number wrap needs no special case (MPA-20). A
//! caller holding absolute sequence numbers passes `seq.wrapping_sub(seq_start)`.

use crate::error::{Error, Layer, Result, need};
use crate::field::{be16, set_be16};
use crate::macros::wire_enum;

// ---------------------------------------------------------------------------
// Constants (RFC 5044 §3, §4, §7.1.1)
// ---------------------------------------------------------------------------

/// RFC 5044 §4.1: the ULPDU_Length field is 2 octets.
pub const ULPDU_LENGTH_LEN: usize = 2;
/// RFC 5044 §4.1: the CRC field is 4 octets and always present (MPA-14).
pub const CRC_LEN: usize = 4;
/// RFC 5044 §4.2: a Marker is 4 octets (RESERVED 16 | FPDUPTR 16).
pub const MARKER_LEN: usize = 4;
/// RFC 5044 §4.3: one Marker every 512 octets of TCP sequence space.
pub const MARKER_INTERVAL: u32 = 512;
/// RFC 5044 §3 / §4.5: MULPDU lower bound (MPA-06, MPA-40).
pub const MULPDU_MIN: u16 = 128;
/// RFC 5044 §3: the largest ULPDU DDP may ever post (MPA-07); also the MULPDU
/// upper bound (MPA-06). The stream codec refuses larger ULPDUs both ways.
pub const MAX_ULPDU: usize = 64768;
/// RFC 5044 §7.1.1: Private Data is 0..512 octets (MPA-63).
pub const MAX_PRIVATE_DATA: usize = 512;
/// RFC 5044 §7.1.1: key (16) + flags/Rev (2) + PD_Length (2).
pub const FRAME_HEADER_LEN: usize = 20;
/// RFC 5044 §7.1.1: length of the key field.
pub const KEY_LEN: usize = 16;
/// RFC 5044 §7.1.1: "MPA ID Req Frame" (MPA-52).
pub const REQUEST_KEY: [u8; KEY_LEN] = *b"MPA ID Req Frame";
/// RFC 5044 §7.1.1: "MPA ID Rep Frame" (MPA-54).
pub const REPLY_KEY: [u8; KEY_LEN] = *b"MPA ID Rep Frame";
/// RFC 5044 App. C: RDMA Consortium MPA revision.
pub const REV_RDMAC: u8 = 0;
/// RFC 5044 §7.1.1: the revision this RFC defines (MPA-61).
pub const REV_1: u8 = 1;
/// RFC 6581: enhanced connection establishment (IRD/ORD word in Private Data).
pub const REV_2: u8 = 2;
/// The Res bit rev-2 peers set (value of [`FrameRepr::res`]): Linux siw
/// `MPA_RR_FLAG_ENHANCED` / cxgb4 `MPA_ENHANCED_RDMA_CONN`, octet 16 = 0x10.
pub const RES_ENHANCED: u8 = 0x10;

/// `Error::Malformed` reason when a Marker's FPDUPTR disagrees with the FPDU
/// start found by length chaining: RFC 5044 §8 error 3 (MPA-87).
pub const REASON_MARKER_MISMATCH: &str =
    "Marker FPDUPTR disagrees with the FPDU start (RFC 5044 §8 error 3)";
/// `Error::Malformed` reason for an FPDU start that is not a multiple of 4
/// octets from SeqStart while Markers are on (RFC 5044 §4.3 keeps FPDUs 4-aligned).
pub const REASON_UNALIGNED: &str =
    "FPDU start not 4-octet aligned to SeqStart with Markers on (RFC 5044 §4.3)";
/// `Error::Malformed` reason for a key that is neither Request nor Reply (§7.1.1).
pub const REASON_BAD_KEY: &str = "MPA key is neither \"MPA ID Req Frame\" nor \"MPA ID Rep Frame\"";

const fn mpa_err(reason: &'static str) -> Error {
    Error::Malformed {
        layer: Layer::Mpa,
        reason,
    }
}

const fn too_large(what: &'static str, value: usize, limit: usize) -> Error {
    Error::TooLarge {
        layer: Layer::Mpa,
        what,
        value: value as u64,
        limit: limit as u64,
    }
}

// ---------------------------------------------------------------------------
// CRC32c (RFC 5044 §4.4; algorithm of RFC 3720 §12.1 / RFC 7143)
// ---------------------------------------------------------------------------

/// CRC32c (Castagnoli, reflected 0x82F63B78, init and xorout 0xFFFFFFFF) of
/// `data`, as iSCSI digests compute it (RFC 5044 §4.4, MPA-32).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC32c of octets following those `crc` was computed over (start from 0).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The register after the earlier octets is `crc` before its final inversion.
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// CRC32c over the concatenation of `parts` (same value as [`crc32c()`] of the
/// joined octets).
#[inline]
pub fn crc32c_gather(parts: &[&[u8]]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for p in parts {
        d.update(p);
    }
    d.finalize() as u32
}

/// The CRC field as it goes on the wire: least-significant octet first
/// (RFC 5044 §4.4 hex dumps, Fig. 5: 0x83992352 -> `52 23 99 83`; mpa.md §4.2).
#[inline]
pub const fn crc_to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC value carried by a wire CRC field (inverse of [`crc_to_wire`]).
#[inline]
pub const fn crc_from_wire(field: [u8; 4]) -> u32 {
    u32::from_le_bytes(field)
}

// ---------------------------------------------------------------------------
// LLP error codes (RFC 5044 §8, RFC 6581) — EXT-MPA-01
// ---------------------------------------------------------------------------

wire_enum! {
/// MPA (LLP) error codes, reported in an RDMAP Terminate with Layer = LLP (0x2),
/// EType = MPA (0x0) (RFC 5044 §8, codes 5..7 from RFC 6581). EXT-MPA-01.
pub enum LlpError: u8 => (Layer::Mpa, "LLP error code") {
    /// 1: TCP connection closed, terminated or lost (MPA-85).
    TcpConnectionLost = 0x01,
    /// 2: received MPA CRC does not match the computed value (MPA-86).
    CrcError = 0x02,
    /// 3: Marker and ULPDU_Length disagree on the FPDU start (MPA-87).
    MarkerMismatch = 0x03,
    /// 4: invalid MPA Request or Reply frame (MPA-88).
    InvalidRequestReply = 0x04,
    /// 5: local catastrophic error (RFC 6581).
    LocalCatastrophic = 0x05,
    /// 6: insufficient IRD resources (RFC 6581).
    InsufficientIrd = 0x06,
    /// 7: no matching RTR option (RFC 6581).
    NoMatchingRtr = 0x07,
}
}

impl LlpError {
    /// Terminate Layer value for the LLP (RFC 5040 §4.8 / RFC 6580).
    pub const LAYER: u8 = 0x2;
    /// Terminate EType value for MPA within the LLP layer.
    pub const ETYPE_MPA: u8 = 0x0;
}

// ---------------------------------------------------------------------------
// Startup frames (RFC 5044 §7.1.1, Figure 8)
// ---------------------------------------------------------------------------

/// Which startup frame a key announces (RFC 5044 §7.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum FrameKind {
    /// "MPA ID Req Frame", sent by the Initiator (MPA-52).
    Request,
    /// "MPA ID Rep Frame", sent by the Responder (MPA-54).
    Reply,
}

impl FrameKind {
    /// The 16-octet key of this frame kind.
    pub const fn key(self) -> &'static [u8; KEY_LEN] {
        match self {
            FrameKind::Request => &REQUEST_KEY,
            FrameKind::Reply => &REPLY_KEY,
        }
    }

    /// Classify a key field; anything else is `Error::Malformed` (MPA-53, MPA-55).
    pub fn from_key(key: &[u8]) -> Result<Self> {
        if key == REQUEST_KEY {
            Ok(FrameKind::Request)
        } else if key == REPLY_KEY {
            Ok(FrameKind::Reply)
        } else {
            Err(mpa_err(REASON_BAD_KEY))
        }
    }
}

impl TryFrom<[u8; KEY_LEN]> for FrameKind {
    type Error = Error;
    fn try_from(key: [u8; KEY_LEN]) -> Result<Self> {
        FrameKind::from_key(&key)
    }
}

impl From<FrameKind> for [u8; KEY_LEN] {
    fn from(k: FrameKind) -> [u8; KEY_LEN] {
        *k.key()
    }
}

mod frame_field {
    use core::ops::Range;
    // RFC 5044 §7.1.1, Figure 8: MPA Request/Reply Frame.
    pub const KEY: Range<usize> = 0..16;
    /// |M|C|R| Res (5) |
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LENGTH: usize = 18;
    pub const PRIVATE_DATA: usize = 20;

    pub const M: u8 = 0x80;
    pub const C: u8 = 0x40;
    pub const R: u8 = 0x20;
    pub const RES: u8 = 0x1f;
}

/// Checked view of an MPA Request or Reply frame (RFC 5044 §7.1.1, Figure 8):
///
/// ```text
/// 0..16  Key ("MPA ID Req Frame" / "MPA ID Rep Frame")
/// 16     |M|C|R| Res(5) |      17  Rev      18..20  PD_Length (big-endian)
/// 20..   Private Data (PD_Length octets, 0..512)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wrap without checks (accessors may then panic on short buffers).
    pub const fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    /// Wrap and [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// The buffer holds the 20-octet header and all PD_Length octets.
    /// (The key and PD_Length bound are checked by [`FrameRepr::parse`].)
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(Layer::Mpa, b, FRAME_HEADER_LEN)?;
        need(
            Layer::Mpa,
            b,
            FRAME_HEADER_LEN + usize::from(self.pd_length()),
        )
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16 key octets.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[frame_field::KEY]
    }

    /// Request or Reply, from the key (MPA-53, MPA-55).
    pub fn kind(&self) -> Result<FrameKind> {
        FrameKind::from_key(self.key())
    }

    /// M: the sender of this frame wants Markers in the stream it receives (MPA-56).
    pub fn m(&self) -> bool {
        self.buffer.as_ref()[frame_field::FLAGS] & frame_field::M != 0
    }

    /// C: CRC preference of the sender (MPA-57).
    pub fn c(&self) -> bool {
        self.buffer.as_ref()[frame_field::FLAGS] & frame_field::C != 0
    }

    /// R: reject (meaningful in a Reply only, MPA-59).
    pub fn r(&self) -> bool {
        self.buffer.as_ref()[frame_field::FLAGS] & frame_field::R != 0
    }

    /// The 5 Res bits (MPA-60: not checked; rev-2 Linux sets [`RES_ENHANCED`]).
    pub fn res(&self) -> u8 {
        self.buffer.as_ref()[frame_field::FLAGS] & frame_field::RES
    }

    /// Rev (MPA-61).
    pub fn rev(&self) -> u8 {
        self.buffer.as_ref()[frame_field::REV]
    }

    /// PD_Length (MPA-62).
    pub fn pd_length(&self) -> u16 {
        be16(self.buffer.as_ref(), frame_field::PD_LENGTH)
    }

    /// The Private Data, exactly PD_Length octets (MPA-79: never more).
    pub fn private_data(&self) -> &[u8] {
        let end = frame_field::PRIVATE_DATA + usize::from(self.pd_length());
        &self.buffer.as_ref()[frame_field::PRIVATE_DATA..end]
    }

    /// Octets the whole frame occupies: 20 + PD_Length.
    pub fn total_len(&self) -> usize {
        FRAME_HEADER_LEN + usize::from(self.pd_length())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    fn set_flag(&mut self, mask: u8, on: bool) {
        let b = &mut self.buffer.as_mut()[frame_field::FLAGS];
        *b = if on { *b | mask } else { *b & !mask };
    }

    pub fn set_key(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[frame_field::KEY].copy_from_slice(kind.key());
    }
    pub fn set_m(&mut self, v: bool) {
        self.set_flag(frame_field::M, v);
    }
    pub fn set_c(&mut self, v: bool) {
        self.set_flag(frame_field::C, v);
    }
    pub fn set_r(&mut self, v: bool) {
        self.set_flag(frame_field::R, v);
    }
    /// Sets the 5 Res bits (higher bits of `v` are ignored).
    pub fn set_res(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[frame_field::FLAGS];
        *b = (*b & !frame_field::RES) | (v & frame_field::RES);
    }
    pub fn set_rev(&mut self, v: u8) {
        self.buffer.as_mut()[frame_field::REV] = v;
    }
    pub fn set_pd_length(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), frame_field::PD_LENGTH, v);
    }
    /// Private Data area, PD_Length octets (set PD_Length first).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = frame_field::PRIVATE_DATA + usize::from(self.pd_length());
        &mut self.buffer.as_mut()[frame_field::PRIVATE_DATA..end]
    }
}

/// An MPA Request or Reply (RFC 5044 §7.1.1). Every header bit is kept, so
/// `emit(parse(x)) == x` for real traffic (Linux rev 2 sets `res = 0x10`).
///
/// `parse` reports whatever Rev it finds; whether that Rev is usable (MPA-61)
/// and whether extra octets after the frame are a violation (mpa.md §7.6) are
/// decisions of the connection state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FrameRepr<'a> {
    pub kind: FrameKind,
    /// M: Markers wanted toward the sender of this frame (MPA-56).
    pub m: bool,
    /// C: CRC preference (MPA-57).
    pub c: bool,
    /// R: reject, Reply only (MPA-59).
    pub r: bool,
    /// The 5 raw Res bits (MPA-60), e.g. [`RES_ENHANCED`].
    pub res: u8,
    pub rev: u8,
    /// 0..=512 octets (MPA-63).
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// How many octets the frame at the front of `buf` occupies, once known:
    /// `Ok(None)` while fewer than 20 octets are present, `Ok(Some(20 + PD_Length))`
    /// after. Fails as soon as the octets present cannot start a valid key
    /// (MPA-53/55) or PD_Length exceeds 512 (MPA-62/79), so a stream reader
    /// never buffers more than 532 octets for a startup frame.
    pub fn frame_len(buf: &[u8]) -> Result<Option<usize>> {
        let n = buf.len().min(KEY_LEN);
        let head = &buf[..n];
        if head != &REQUEST_KEY[..n] && head != &REPLY_KEY[..n] {
            return Err(mpa_err(REASON_BAD_KEY));
        }
        if buf.len() < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let pd = usize::from(be16(buf, frame_field::PD_LENGTH));
        if pd > MAX_PRIVATE_DATA {
            return Err(too_large("PD_Length", pd, MAX_PRIVATE_DATA));
        }
        Ok(Some(FRAME_HEADER_LEN + pd))
    }

    /// Parse the frame at the front of `buf` (octets after it are ignored).
    /// Errors: `Truncated`, `Malformed` (unknown key), `TooLarge` (PD_Length > 512).
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        need(Layer::Mpa, buf, FRAME_HEADER_LEN)?;
        let f = Frame::new_unchecked(buf);
        let kind = f.kind()?;
        let pd = usize::from(f.pd_length());
        if pd > MAX_PRIVATE_DATA {
            return Err(too_large("PD_Length", pd, MAX_PRIVATE_DATA));
        }
        need(Layer::Mpa, buf, FRAME_HEADER_LEN + pd)?;
        Ok(FrameRepr {
            kind,
            m: f.m(),
            c: f.c(),
            r: f.r(),
            res: f.res(),
            rev: f.rev(),
            private_data: &buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + pd],
        })
    }

    /// 20 + Private Data length.
    pub fn buffer_len(&self) -> usize {
        FRAME_HEADER_LEN + self.private_data.len()
    }

    /// Write the frame; refuses Private Data over 512 octets (MPA-63) and Res
    /// wider than 5 bits (`TooLarge`), a short `buf` (`Truncated`).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let pd = self.private_data.len();
        if pd > MAX_PRIVATE_DATA {
            return Err(too_large("Private Data length", pd, MAX_PRIVATE_DATA));
        }
        if self.res > frame_field::RES {
            return Err(too_large(
                "Res",
                usize::from(self.res),
                usize::from(frame_field::RES),
            ));
        }
        let len = self.buffer_len();
        need(Layer::Mpa, buf, len)?;
        let mut f = Frame::new_unchecked(&mut buf[..len]);
        f.set_key(self.kind);
        f.buffer[frame_field::FLAGS] = 0;
        f.set_m(self.m);
        f.set_c(self.c);
        f.set_r(self.r);
        f.set_res(self.res);
        f.set_rev(self.rev);
        // pd <= 512 checked above.
        f.set_pd_length(pd as u16);
        f.private_data_mut().copy_from_slice(self.private_data);
        Ok(len)
    }

    /// The RFC 6581 IRD/ORD word when `rev == 2` (`Ok(None)` for other revs);
    /// a rev-2 frame with fewer than 4 Private Data octets is `Truncated`.
    pub fn rev2_params(&self) -> Result<Option<Rev2Params>> {
        if self.rev == REV_2 {
            Rev2Params::parse(self.private_data).map(Some)
        } else {
            Ok(None)
        }
    }
}

// ---------------------------------------------------------------------------
// RFC 6581 (enhanced MPA frames): IRD/ORD word at the start of rev-2 Private Data (EXT-6581-01)
// ---------------------------------------------------------------------------

/// RFC 6581 enhanced connection data, the first 4 Private Data octets of a
/// rev-2 Request/Reply, as two big-endian 16-bit words (same layout as Linux
/// siw `struct mpa_v2_data` / cxgb4 `struct mpa_v2_conn_params`):
///
/// ```text
///  0 1 2 ............ 15  16 17 18 ............ 31
/// |P|Z|   IRD (14)       | W| R|    ORD (14)       |
/// ```
/// P = `MPA_V2_PEER_TO_PEER` 0x8000, Z = `MPA_V2_ZERO_LENGTH_RTR` 0x4000 (IRD
/// word); W = `MPA_V2_RDMA_WRITE_RTR` 0x8000, R = `MPA_V2_RDMA_READ_RTR` 0x4000
/// (ORD word); IRD/ORD masked by `MPA_IRD_ORD_MASK` 0x3fff. EXT-6581-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Rev2Params {
    /// P: peer-to-peer mode (an RTR message follows the Reply).
    pub p2p: bool,
    /// Z: a zero-length Send may serve as RTR.
    pub zero_len_rtr: bool,
    /// W: a zero-length RDMA Write may serve as RTR.
    pub write_rtr: bool,
    /// R: a zero-length RDMA Read may serve as RTR.
    pub read_rtr: bool,
    /// Inbound RDMA Read queue depth of the sender (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth of the sender (14 bits).
    pub ord: u16,
}

impl Rev2Params {
    /// Wire size: 4 octets.
    pub const LEN: usize = 4;
    /// IRD word: peer-to-peer flag.
    pub const PEER_TO_PEER: u16 = 0x8000;
    /// IRD word: zero-length Send RTR.
    pub const ZERO_LENGTH_RTR: u16 = 0x4000;
    /// ORD word: zero-length RDMA Write RTR.
    pub const RDMA_WRITE_RTR: u16 = 0x8000;
    /// ORD word: zero-length RDMA Read RTR.
    pub const RDMA_READ_RTR: u16 = 0x4000;
    /// IRD / ORD value mask (14 bits).
    pub const IRD_ORD_MASK: u16 = 0x3fff;

    /// Parse the first 4 octets of `private_data` (the rest is the ULP's).
    pub fn parse(private_data: &[u8]) -> Result<Self> {
        need(Layer::Mpa, private_data, Self::LEN)?;
        let ird = be16(private_data, 0);
        let ord = be16(private_data, 2);
        Ok(Rev2Params {
            p2p: ird & Self::PEER_TO_PEER != 0,
            zero_len_rtr: ird & Self::ZERO_LENGTH_RTR != 0,
            write_rtr: ord & Self::RDMA_WRITE_RTR != 0,
            read_rtr: ord & Self::RDMA_READ_RTR != 0,
            ird: ird & Self::IRD_ORD_MASK,
            ord: ord & Self::IRD_ORD_MASK,
        })
    }

    /// 4.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Write the 4 octets; IRD or ORD above 0x3fff is `TooLarge`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        for (what, v) in [("IRD", self.ird), ("ORD", self.ord)] {
            if v > Self::IRD_ORD_MASK {
                return Err(too_large(
                    what,
                    usize::from(v),
                    usize::from(Self::IRD_ORD_MASK),
                ));
            }
        }
        need(Layer::Mpa, buf, Self::LEN)?;
        let flag = |on: bool, bit: u16| if on { bit } else { 0 };
        let ird = self.ird
            | flag(self.p2p, Self::PEER_TO_PEER)
            | flag(self.zero_len_rtr, Self::ZERO_LENGTH_RTR);
        let ord = self.ord
            | flag(self.write_rtr, Self::RDMA_WRITE_RTR)
            | flag(self.read_rtr, Self::RDMA_READ_RTR);
        set_be16(buf, 0, ird);
        set_be16(buf, 2, ord);
        Ok(Self::LEN)
    }
}

// ---------------------------------------------------------------------------
// FPDU without Markers (RFC 5044 §4.1, Figure 2)
// ---------------------------------------------------------------------------

/// PAD octets after a ULPDU of `ulpdu_len` octets: makes `2 + len + PAD` a
/// multiple of 4 (RFC 5044 §4.1, MPA-13).
#[inline]
pub const fn pad_len(ulpdu_len: usize) -> usize {
    // Wrapping is exact: 2^64 is a multiple of 4.
    (4 - ulpdu_len.wrapping_add(ULPDU_LENGTH_LEN) % 4) % 4
}

/// Octets of an FPDU carrying `ulpdu_len` octets, Markers not counted:
/// `2 + len + PAD + 4` (RFC 5044 §4.1). Saturates instead of overflowing.
#[inline]
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    ulpdu_len
        .saturating_add(ULPDU_LENGTH_LEN + CRC_LEN)
        .saturating_add(pad_len(ulpdu_len))
}

/// Checked view of one FPDU **without Markers** (RFC 5044 §4.1, Figure 2):
///
/// ```text
/// | ULPDU_Length (16, BE) | ULPDU (len) | PAD (0-3) | CRC (32, LSB first) |
/// ```
/// For streams with Markers use [`decode_fpdu`] / [`encode_fpdu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Fpdu { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// The buffer holds the whole FPDU that ULPDU_Length announces.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(Layer::Mpa, b, ULPDU_LENGTH_LEN)?;
        need(Layer::Mpa, b, self.total_len())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// ULPDU_Length: ULPDU octets only (MPA-12).
    pub fn ulpdu_length(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }

    /// PAD octets for this ULPDU_Length.
    pub fn pad_len(&self) -> usize {
        pad_len(usize::from(self.ulpdu_length()))
    }

    /// Octets of the FPDU: 2 + ULPDU_Length + PAD + 4.
    pub fn total_len(&self) -> usize {
        fpdu_len(usize::from(self.ulpdu_length()))
    }

    /// The ULPDU (a DDP segment).
    pub fn ulpdu(&self) -> &[u8] {
        let end = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        &self.buffer.as_ref()[ULPDU_LENGTH_LEN..end]
    }

    /// The PAD octets (sent as zero, only CRC input on receipt: MPA-13).
    pub fn pad(&self) -> &[u8] {
        let start = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        &self.buffer.as_ref()[start..start + self.pad_len()]
    }

    /// The CRC field as a value (wire octets read least-significant first).
    pub fn crc(&self) -> u32 {
        let at = self.total_len() - CRC_LEN;
        let b = self.buffer.as_ref();
        crc_from_wire([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// CRC32c over ULPDU_Length, ULPDU and PAD (MPA-33, no Markers here).
    pub fn compute_crc(&self) -> u32 {
        crc32c(&self.buffer.as_ref()[..self.total_len() - CRC_LEN])
    }

    /// The CRC field matches (MPA-34). Only meaningful when CRCs are on (MPA-14).
    pub fn verify_crc(&self) -> bool {
        self.crc() == self.compute_crc()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Fpdu<T> {
    pub fn set_ulpdu_length(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 0, v);
    }

    pub fn ulpdu_mut(&mut self) -> &mut [u8] {
        let end = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        &mut self.buffer.as_mut()[ULPDU_LENGTH_LEN..end]
    }

    pub fn pad_mut(&mut self) -> &mut [u8] {
        let start = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        let end = start + self.pad_len();
        &mut self.buffer.as_mut()[start..end]
    }

    pub fn set_crc(&mut self, crc: u32) {
        let at = self.total_len() - CRC_LEN;
        self.buffer.as_mut()[at..at + CRC_LEN].copy_from_slice(&crc_to_wire(crc));
    }

    /// Compute and store the CRC (MPA-32).
    pub fn fill_crc(&mut self) {
        let crc = self.compute_crc();
        self.set_crc(crc);
    }
}

/// One FPDU without Markers (RFC 5044 §4.1), every octet kept: the ULPDU, the
/// PAD contents (`pad[..pad_len(ulpdu.len())]`; the rest is ignored and parsed
/// as zero) and the CRC field value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FpduRepr<'a> {
    pub ulpdu: &'a [u8],
    pub pad: [u8; 3],
    /// CRC field value (not checked by `parse`: see [`Fpdu::verify_crc`]).
    pub crc: u32,
}

impl<'a> FpduRepr<'a> {
    /// An FPDU with zero PAD and a correct CRC32c (MPA-32) or a zero CRC field.
    pub fn new(ulpdu: &'a [u8], with_crc: bool) -> Self {
        let mut r = FpduRepr {
            ulpdu,
            pad: [0; 3],
            crc: 0,
        };
        if with_crc {
            r.crc = r.compute_crc();
        }
        r
    }

    /// CRC32c over ULPDU_Length | ULPDU | PAD of this repr (saturating the
    /// length field for oversize ULPDUs, which `emit` refuses anyway).
    pub fn compute_crc(&self) -> u32 {
        let len = u16::try_from(self.ulpdu.len()).unwrap_or(u16::MAX);
        let p = pad_len(self.ulpdu.len());
        crc32c_gather(&[&len.to_be_bytes(), self.ulpdu, &self.pad[..p]])
    }

    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let f = Fpdu::new_checked(buf)?;
        let mut pad = [0u8; 3];
        let p = f.pad();
        pad[..p.len()].copy_from_slice(p);
        let crc = f.crc();
        let n = usize::from(f.ulpdu_length());
        Ok(FpduRepr {
            ulpdu: &buf[ULPDU_LENGTH_LEN..ULPDU_LENGTH_LEN + n],
            pad,
            crc,
        })
    }

    pub fn buffer_len(&self) -> usize {
        fpdu_len(self.ulpdu.len())
    }

    /// Errors: ULPDU over 65535 octets (`TooLarge`), short `buf` (`Truncated`).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let n = u16::try_from(self.ulpdu.len())
            .map_err(|_| too_large("ULPDU length", self.ulpdu.len(), usize::from(u16::MAX)))?;
        let len = self.buffer_len();
        need(Layer::Mpa, buf, len)?;
        let mut f = Fpdu::new_unchecked(&mut buf[..len]);
        f.set_ulpdu_length(n);
        f.ulpdu_mut().copy_from_slice(self.ulpdu);
        let p = f.pad_len();
        f.pad_mut().copy_from_slice(&self.pad[..p]);
        f.set_crc(self.crc);
        Ok(len)
    }
}

/// A Marker (RFC 5044 §4.2, Figure 3): `| RESERVED (16) | FPDUPTR (16) |`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MarkerRepr {
    /// Sent as 0, ignored on receipt except as CRC input (MPA-15).
    pub reserved: u16,
    /// Octets back from this Marker to the ULPDU_Length of its FPDU; 0 when the
    /// Marker sits between FPDUs (MPA-19, MPA-21). Low 2 bits kept raw (MPA-16).
    pub fpduptr: u16,
}

impl MarkerRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        need(Layer::Mpa, buf, MARKER_LEN)?;
        Ok(MarkerRepr {
            reserved: be16(buf, 0),
            fpduptr: be16(buf, 2),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        MARKER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Mpa, buf, MARKER_LEN)?;
        set_be16(buf, 0, self.reserved);
        set_be16(buf, 2, self.fpduptr);
        Ok(MARKER_LEN)
    }

    /// FPDUPTR as the receiver uses it: low 2 bits treated as 0 (MPA-16).
    pub const fn effective_fpduptr(&self) -> u16 {
        self.fpduptr & !3
    }
}

// ---------------------------------------------------------------------------
// Stream codec with Markers (RFC 5044 §4.2-4.4)
// ---------------------------------------------------------------------------

/// Is a Marker due at `stream_pos` (MPA-18)? Wrap-safe (MPA-20).
#[inline]
pub const fn marker_at(stream_pos: u32) -> bool {
    stream_pos.is_multiple_of(MARKER_INTERVAL)
}

/// Octets on the wire of an FPDU carrying `ulpdu_len` octets whose first octet
/// (its ULPDU_Length, or the Marker that precedes it) sits at `stream_pos`:
/// `2 + len + PAD + 4 + 4 * Markers` (RFC 5044 §4.1, §4.3).
///
/// The FPDU owns every Marker from its first octet up to its CRC field: a
/// Marker at `stream_pos` itself (FPDUPTR 0, MPA-21), those inside the
/// ULPDU/PAD and one directly after the PAD (MPA-33). A Marker right after the
/// CRC belongs to the next FPDU. With Markers on, conforming FPDUs start at
/// multiples of 4 ([`encode_fpdu`] and [`decode_fpdu`] refuse others); for
/// other starts the value assumes no Marker falls inside the CRC field.
/// Saturates rather than overflowing for absurd `ulpdu_len`.
pub const fn encoded_len(ulpdu_len: usize, stream_pos: u32, markers: bool) -> usize {
    let body = ulpdu_len
        .saturating_add(ULPDU_LENGTH_LEN)
        .saturating_add(pad_len(ulpdu_len));
    let n = if markers {
        marker_count(body, stream_pos)
    } else {
        0
    };
    body.saturating_add(CRC_LEN)
        .saturating_add(n.saturating_mul(MARKER_LEN))
}

/// Markers inside an FPDU whose ULPDU_Length|ULPDU|PAD is `body` octets.
/// Marker k sits at wire offset `m0 + 512k`, after `m0 + 508k` body octets; it
/// belongs to the FPDU while that is `<= body` (the last one may directly
/// follow the PAD).
const fn marker_count(body: usize, stream_pos: u32) -> usize {
    let m0 = ((MARKER_INTERVAL - stream_pos % MARKER_INTERVAL) % MARKER_INTERVAL) as usize;
    if m0 > body {
        0
    } else {
        (body - m0) / (MARKER_INTERVAL as usize - MARKER_LEN) + 1
    }
}

/// One piece of an FPDU's wire image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// A Marker at wire offset `at` whose FPDUPTR must be `fpduptr`.
    Marker { at: usize, fpduptr: usize },
    /// Body octets `[body, body + len)` (ULPDU_Length | ULPDU | PAD) at `at`.
    Body { at: usize, body: usize, len: usize },
}

/// Walks an FPDU's wire image: body octets split at 512-octet stream
/// boundaries, a Marker at each boundary before the CRC field (RFC 5044 §4.3).
struct Layout {
    pos: u32,
    markers: bool,
    body_len: usize,
    /// Current wire offset from the FPDU's first octet.
    at: usize,
    /// Body octets laid out so far.
    body: usize,
    /// Wire offset of the ULPDU_Length field once reached.
    hdr: Option<usize>,
    /// Markers emitted.
    count: usize,
}

impl Layout {
    fn new(ulpdu_len: usize, stream_pos: u32, markers: bool) -> Self {
        Layout {
            pos: stream_pos,
            markers,
            body_len: ULPDU_LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len),
            at: 0,
            body: 0,
            hdr: None,
            count: 0,
        }
    }

    fn here(&self) -> u32 {
        // `at` < 2^17 for ULPDUs <= 64768; truncation is modular and harmless.
        self.pos.wrapping_add(self.at as u32)
    }
}

impl Iterator for Layout {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        if self.markers && marker_at(self.here()) {
            // Before the next body octet, or directly before the CRC (MPA-33).
            // FPDUPTR: distance back to ULPDU_Length, 0 ahead of it (MPA-19/21).
            let fpduptr = self.hdr.map_or(0, |h| self.at - h);
            let run = Run::Marker {
                at: self.at,
                fpduptr,
            };
            self.at += MARKER_LEN;
            self.count += 1;
            return Some(run);
        }
        if self.body >= self.body_len {
            return None;
        }
        if self.hdr.is_none() {
            self.hdr = Some(self.at);
        }
        let left = self.body_len - self.body;
        let len = if self.markers {
            let room = (MARKER_INTERVAL - self.here() % MARKER_INTERVAL) as usize;
            left.min(room)
        } else {
            left
        };
        let run = Run::Body {
            at: self.at,
            body: self.body,
            len,
        };
        self.at += len;
        self.body += len;
        Some(run)
    }
}

fn check_alignment(stream_pos: u32, markers: bool) -> Result<()> {
    if markers && !stream_pos.is_multiple_of(4) {
        Err(mpa_err(REASON_UNALIGNED))
    } else {
        Ok(())
    }
}

/// Copy body octets `[from, from + dst.len())` of the logical body
/// `len_field | parts... | pad zeros` into `dst`.
fn gather_body(len_field: &[u8; 2], parts: &[&[u8]], pad: usize, from: usize, dst: &mut [u8]) {
    const ZEROS: [u8; 3] = [0; 3];
    let to = from + dst.len();
    let mut seg_start = 0usize;
    let segs = core::iter::once(&len_field[..])
        .chain(parts.iter().copied())
        .chain(core::iter::once(&ZEROS[..pad.min(3)]));
    for seg in segs {
        let seg_end = seg_start + seg.len();
        let lo = from.max(seg_start);
        let hi = to.min(seg_end);
        if lo < hi {
            dst[lo - from..hi - from].copy_from_slice(&seg[lo - seg_start..hi - seg_start]);
        }
        if seg_end >= to {
            break;
        }
        seg_start = seg_end;
    }
}

/// Encode one FPDU into `out` (RFC 5044 §4.1-4.4, MPA-11): ULPDU_Length, the
/// ULPDU given as a gather list (`parts`, e.g. DDP/RDMAP header then payload
/// pieces; one ULPDU per FPDU, MPA-03), zero PAD (MPA-13) and the CRC field,
/// with Markers spliced in at every `(pos % 512) == 0` when `markers` is on
/// (MPA-18/19/21/23/24; a Marker at `stream_pos` is this FPDU's, FPDUPTR 0).
/// The CRC field holds CRC32c over every octet before it (MPA-32/33) when
/// `crc`, else zero (MPA-14). Returns the octets written, [`encoded_len`].
///
/// Errors: ULPDU over 64768 octets (`TooLarge`, MPA-07); `stream_pos` not a
/// multiple of 4 with Markers on (`Malformed`, [`REASON_UNALIGNED`]);
/// `out` shorter than [`encoded_len`] (`Truncated`).
pub fn encode_fpdu(
    parts: &[&[u8]],
    stream_pos: u32,
    markers: bool,
    crc: bool,
    out: &mut [u8],
) -> Result<usize> {
    let ulpdu_len = parts.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
    if ulpdu_len > MAX_ULPDU {
        return Err(too_large("ULPDU length", ulpdu_len, MAX_ULPDU));
    }
    check_alignment(stream_pos, markers)?;
    let total = encoded_len(ulpdu_len, stream_pos, markers);
    need(Layer::Mpa, out, total)?;
    // <= 64768 checked above.
    let len_field = (ulpdu_len as u16).to_be_bytes();
    let pad = pad_len(ulpdu_len);
    let mut layout = Layout::new(ulpdu_len, stream_pos, markers);
    for run in &mut layout {
        match run {
            Run::Marker { at, fpduptr } => {
                // RFC 5044 §4.2: RESERVED = 0 (MPA-15), FPDUPTR low bits 0 (MPA-16).
                // fpduptr < 65536 because the ULPDU is <= 64768 octets.
                let m = MarkerRepr {
                    reserved: 0,
                    fpduptr: fpduptr as u16,
                };
                m.emit(&mut out[at..at + MARKER_LEN])?;
            }
            Run::Body { at, body, len } => {
                gather_body(&len_field, parts, pad, body, &mut out[at..at + len]);
            }
        }
    }
    let crc_at = layout.at;
    let value = if crc { crc32c(&out[..crc_at]) } else { 0 };
    out[crc_at..crc_at + CRC_LEN].copy_from_slice(&crc_to_wire(value));
    Ok(crc_at + CRC_LEN)
}

/// What [`decode_fpdu`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FpduInfo {
    /// Stream octets the FPDU occupied, Markers included.
    pub consumed: usize,
    /// ULPDU_Length (the octets copied out, MPA-12/26).
    pub ulpdu_len: u16,
    /// PAD octets (MPA-13).
    pub pad_len: u8,
    /// Markers stripped (MPA-26).
    pub markers: u8,
    /// The CRC field as a value (wire octets read least-significant first).
    pub crc_field: u32,
    /// CRC32c over the FPDU as RFC 5044 §4.4 covers it (MPA-33).
    pub crc_computed: u32,
}

impl FpduInfo {
    /// CRC field equals the computed CRC (MPA-34). Consult only when CRCs are
    /// in use on this connection (MPA-14, MPA-58); a mismatch is error 2.
    pub const fn crc_ok(&self) -> bool {
        self.crc_field == self.crc_computed
    }
}

/// Octets the FPDU at the front of `input` occupies on the wire, once its
/// ULPDU_Length is visible (`Ok(None)` before). Same checks as [`decode_fpdu`]
/// on what it has read: alignment, a leading Marker, ULPDU_Length <= 64768.
pub fn peek_encoded_len(input: &[u8], stream_pos: u32, markers: bool) -> Result<Option<usize>> {
    Ok(peek_header(input, stream_pos, markers)?.map(|l| encoded_len(l, stream_pos, markers)))
}

/// ULPDU_Length of the FPDU at the front of `input`, once visible.
fn peek_header(input: &[u8], stream_pos: u32, markers: bool) -> Result<Option<usize>> {
    check_alignment(stream_pos, markers)?;
    let lead = if markers && marker_at(stream_pos) {
        MARKER_LEN
    } else {
        0
    };
    if input.len() < lead + ULPDU_LENGTH_LEN {
        return Ok(None);
    }
    if lead != 0 {
        // A Marker ahead of ULPDU_Length sits between FPDUs: FPDUPTR 0 (MPA-21).
        let m = MarkerRepr::parse(input)?;
        if m.effective_fpduptr() != 0 {
            return Err(mpa_err(REASON_MARKER_MISMATCH));
        }
    }
    let l = usize::from(be16(input, lead));
    if l > MAX_ULPDU {
        return Err(too_large("ULPDU_Length", l, MAX_ULPDU));
    }
    Ok(Some(l))
}

/// Decode the FPDU at the front of `input`, the contiguous unconsumed receive
/// stream whose first octet sits at `stream_pos` (RFC 5044 §4, §5.2, §6).
///
/// Returns `Ok(None)` until the whole FPDU, CRC included, is present (MPA-48);
/// then copies the ULPDU, Markers stripped, to the front of `ulpdu_out`
/// (MPA-25/26) and reports it. The FPDU start comes from length chaining
/// (MPA-45/47); every Marker is cross-checked against it, low FPDUPTR bits
/// ignored (MPA-16), RESERVED ignored (MPA-15). The CRC is computed, not
/// judged: check [`FpduInfo::crc_ok`] when CRCs are on (MPA-34, MPA-14).
///
/// Errors: ULPDU_Length over 64768 (MPA-07) or over `ulpdu_out.len()`
/// (`TooLarge`, raised as soon as the length field is visible); a Marker
/// pointing elsewhere (`Malformed`, [`REASON_MARKER_MISMATCH`] = error 3,
/// MPA-87; reported even when the CRC would also fail); a misaligned start
/// with Markers on (`Malformed`, [`REASON_UNALIGNED`]).
pub fn decode_fpdu(
    input: &[u8],
    stream_pos: u32,
    markers: bool,
    ulpdu_out: &mut [u8],
) -> Result<Option<FpduInfo>> {
    decode_fpdu_with(input, stream_pos, markers, ulpdu_out, true)
}

/// [`decode_fpdu`] for a receiver that negotiated CRCs off (MPA-14, MPA-31):
/// with `compute_crc` false the CRC32c is not computed (it is 5% of a bulk
/// receive) and `crc_computed` repeats the field, so `crc_ok()` holds.
pub fn decode_fpdu_with(
    input: &[u8],
    stream_pos: u32,
    markers: bool,
    ulpdu_out: &mut [u8],
    compute_crc: bool,
) -> Result<Option<FpduInfo>> {
    let Some(l) = peek_header(input, stream_pos, markers)? else {
        return Ok(None);
    };
    if l > ulpdu_out.len() {
        return Err(too_large(
            "ULPDU_Length (receive buffer)",
            l,
            ulpdu_out.len(),
        ));
    }
    let total = encoded_len(l, stream_pos, markers);
    if input.len() < total {
        return Ok(None);
    }
    let ulpdu_end = ULPDU_LENGTH_LEN + l;
    let mut layout = Layout::new(l, stream_pos, markers);
    for run in &mut layout {
        match run {
            Run::Marker { at, fpduptr } => {
                let m = MarkerRepr::parse(&input[at..at + MARKER_LEN])?;
                if usize::from(m.effective_fpduptr()) != fpduptr {
                    return Err(mpa_err(REASON_MARKER_MISMATCH));
                }
            }
            Run::Body { at, body, len } => {
                // Intersect with the ULPDU part [2, 2 + l) of the body.
                let lo = body.max(ULPDU_LENGTH_LEN);
                let hi = (body + len).min(ulpdu_end);
                if lo < hi {
                    let src = &input[at + (lo - body)..at + (hi - body)];
                    ulpdu_out[lo - ULPDU_LENGTH_LEN..hi - ULPDU_LENGTH_LEN].copy_from_slice(src);
                }
            }
        }
    }
    let crc_at = layout.at;
    let field = &input[crc_at..crc_at + CRC_LEN];
    let crc_field = crc_from_wire([field[0], field[1], field[2], field[3]]);
    Ok(Some(FpduInfo {
        consumed: crc_at + CRC_LEN,
        // l <= 64768, pad <= 3, markers <= 129 (see MULPDU bound).
        ulpdu_len: l as u16,
        pad_len: pad_len(l) as u8,
        markers: layout.count as u8,
        crc_field,
        crc_computed: if compute_crc {
            crc32c(&input[..crc_at])
        } else {
            crc_field
        },
    }))
}

// ---------------------------------------------------------------------------
// MULPDU (RFC 5044 §4.5)
// ---------------------------------------------------------------------------

/// MULPDU for an EMSS (RFC 5044 §4.5): with Markers
/// `EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)` (MPA-35), without
/// `EMSS - (6 + EMSS mod 4)` (MPA-36), clamped to [128, 64768] (MPA-06, MPA-40).
pub const fn mulpdu(emss: u32, markers: bool) -> u16 {
    let e = emss as u64;
    let mut overhead = 6 + e % 4;
    if markers {
        overhead += 4 * e.div_ceil(MARKER_INTERVAL as u64);
    }
    let m = e.saturating_sub(overhead);
    if m < MULPDU_MIN as u64 {
        MULPDU_MIN
    } else if m > MAX_ULPDU as u64 {
        MAX_ULPDU as u16
    } else {
        m as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::mpa_frames::*;
    use proptest::prelude::*;

    // -----------------------------------------------------------------------
    // Helpers (tests may allocate)
    // -----------------------------------------------------------------------

    /// Bit-wise CRC32c (RFC 3720 §B.4 parameters), independent of the crate.
    fn crc32c_bitwise(data: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// Octet-at-a-time model of RFC 5044 §4.1-4.4, written independently of
    /// `Layout`: walk the stream, drop a Marker whenever `pos % 512 == 0`
    /// before the next body octet or before the CRC.
    fn reference_encode(ulpdu: &[u8], pos: u32, markers: bool, crc: bool) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&(ulpdu.len() as u16).to_be_bytes());
        body.extend_from_slice(ulpdu);
        body.resize(body.len() + (4 - (2 + ulpdu.len()) % 4) % 4, 0);
        let mut v = Vec::new();
        let mut p = pos;
        let mut hdr: Option<u32> = None;
        let marker = |v: &mut Vec<u8>, p: &mut u32, hdr: Option<u32>| {
            let ptr = hdr.map_or(0, |h| p.wrapping_sub(h));
            v.extend_from_slice(&[0, 0]);
            v.extend_from_slice(&(ptr as u16).to_be_bytes());
            *p = p.wrapping_add(4);
        };
        for (i, &b) in body.iter().enumerate() {
            if markers && p.is_multiple_of(512) {
                marker(&mut v, &mut p, hdr);
            }
            if i == 0 {
                hdr = Some(p);
            }
            v.push(b);
            p = p.wrapping_add(1);
        }
        if markers && p.is_multiple_of(512) {
            marker(&mut v, &mut p, hdr);
        }
        let c = if crc { crc32c_bitwise(&v) } else { 0 };
        v.extend_from_slice(&c.to_le_bytes());
        v
    }

    fn encode_vec(parts: &[&[u8]], pos: u32, markers: bool, crc: bool) -> Vec<u8> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut out = vec![0xa5u8; encoded_len(total, pos, markers)];
        let n = encode_fpdu(parts, pos, markers, crc, &mut out).expect("encode");
        assert_eq!(n, out.len());
        out
    }

    /// Encode `ulpdus` back to back from `start`; returns the stream and the
    /// (stream offset, wire length) of each FPDU.
    fn encode_stream(
        ulpdus: &[Vec<u8>],
        start: u32,
        markers: bool,
        crc: bool,
    ) -> (Vec<u8>, Vec<(usize, usize)>) {
        let mut s = Vec::new();
        let mut spans = Vec::new();
        for u in ulpdus {
            let pos = start.wrapping_add(s.len() as u32);
            let f = encode_vec(&[u], pos, markers, crc);
            spans.push((s.len(), f.len()));
            s.extend_from_slice(&f);
        }
        (s, spans)
    }

    /// Decode a whole stream from `start`; panics on error or leftovers.
    fn decode_stream(stream: &[u8], start: u32, markers: bool) -> Vec<(Vec<u8>, FpduInfo)> {
        let mut out = vec![0u8; MAX_ULPDU];
        let mut off = 0;
        let mut recs = Vec::new();
        while off < stream.len() {
            let pos = start.wrapping_add(off as u32);
            let info = decode_fpdu(&stream[off..], pos, markers, &mut out)
                .expect("decode")
                .expect("complete FPDU");
            recs.push((out[..usize::from(info.ulpdu_len)].to_vec(), info));
            off += info.consumed;
        }
        recs
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// RFC 5044 §4.4 Fig. 5 / Fig. 6 ULPDU: DDP/RDMAP Send header + 24 zeros.
    fn seed_ulpdu(msn: u8) -> Vec<u8> {
        let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, msn, 0, 0, 0, 0];
        u.resize(42, 0);
        u
    }

    /// RFC 5044 §4.4 Figure 5, offsets 0x0000..=0x0033 (stream_pos 0).
    fn seed_fig5() -> Vec<u8> {
        let mut v = vec![0, 0, 0, 0, 0x00, 0x2a];
        v.extend_from_slice(&seed_ulpdu(1));
        v.extend_from_slice(&[0x52, 0x23, 0x99, 0x83]);
        v
    }

    /// RFC 5044 §4.4 Figure 6, offsets 0x01ec..=0x021f.
    fn seed_fig6() -> Vec<u8> {
        let u = seed_ulpdu(2);
        let mut v = vec![0x00, 0x2a];
        v.extend_from_slice(&u[..18]);
        v.extend_from_slice(&[0, 0, 0, 0x14]);
        v.extend_from_slice(&u[18..]);
        v.extend_from_slice(&[0x84, 0x92, 0x58, 0x98]);
        v
    }

    fn is_marker_mismatch(e: &Error) -> bool {
        matches!(e, Error::Malformed { reason, .. } if *reason == REASON_MARKER_MISMATCH)
    }

    // -----------------------------------------------------------------------
    // Static arrays cut from ../shared/captures (tshark -T fields -e tcp.payload)
    // -----------------------------------------------------------------------

    /// siw-rping.pcap frame 11: first FPDU of the Initiator (Send, ULPDU 34), CRC field zero.
    const SIW_RPING_FPDU_SEND: [u8; 40] = [
        0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x39, 0x90, 0xb5, 0x03, 0x70, 0x51, 0xa1,
        0x6c, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    ];

    /// siw-rping.pcap frame 13: FPDU (Read Response, ULPDU 78), CRC field zero.
    const SIW_RPING_FPDU_READ_RESP: [u8; 84] = [
        0x00, 0x4e, 0xc1, 0x42, 0x6d, 0x61, 0x7b, 0x00, 0x00, 0x00, 0x56, 0x3a, 0x2c, 0x0b, 0xa5,
        0x50, 0x72, 0x64, 0x6d, 0x61, 0x2d, 0x70, 0x69, 0x6e, 0x67, 0x2d, 0x30, 0x3a, 0x20, 0x41,
        0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50,
        0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f,
        0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e,
        0x6f, 0x70, 0x71, 0x72, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    /// siw-mpa1-ucmatose.pcap frame 11: FPDU (Send, ULPDU 118) over MPA rev 1, CRC field zero.
    const SIW_MPA1_FPDU: [u8; 124] = [
        0x00, 0x76, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0xca, 0x84, 0x68, 0x5d, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x75, 0x76, 0x65, 0x72, 0x62, 0x73, 0x31, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    /// siw-crc-rping.pcap frame 11: FPDU (Send, ULPDU 34), CRC32c 00 83 31 57.
    const CRC_RPING_FPDU_SEND: [u8; 40] = [
        0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x51, 0x73, 0x0d, 0xd3, 0x70, 0x2e, 0xca,
        0x7c, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x83, 0x31, 0x57,
    ];

    /// siw-crc-rping.pcap frame 12: FPDU (Read Request, ULPDU 46), CRC32c 86 81 d4 6c.
    const CRC_RPING_FPDU_READ_REQ: [u8; 52] = [
        0x00, 0x2e, 0x41, 0x41, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x23, 0x32, 0x96, 0x00, 0x00, 0x00, 0x55, 0xb6, 0x53, 0x8e,
        0x75, 0x50, 0x00, 0x00, 0x00, 0x40, 0x2e, 0xca, 0x7c, 0x00, 0x00, 0x00, 0x56, 0x51, 0x73,
        0x0d, 0xd3, 0x70, 0x86, 0x81, 0xd4, 0x6c,
    ];

    /// siw-crc-rping.pcap frame 13: FPDU (Read Response, ULPDU 78), CRC32c 2f fa 03 76.
    const CRC_RPING_FPDU_READ_RESP: [u8; 84] = [
        0x00, 0x4e, 0xc1, 0x42, 0x23, 0x32, 0x96, 0x00, 0x00, 0x00, 0x55, 0xb6, 0x53, 0x8e, 0x75,
        0x50, 0x72, 0x64, 0x6d, 0x61, 0x2d, 0x70, 0x69, 0x6e, 0x67, 0x2d, 0x30, 0x3a, 0x20, 0x41,
        0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50,
        0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f,
        0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e,
        0x6f, 0x70, 0x71, 0x72, 0x00, 0x2f, 0xfa, 0x03, 0x76,
    ];

    /// siw-crc-rping.pcap frame 16: FPDU (Write, ULPDU 78), CRC32c f6 5f b5 29.
    const CRC_RPING_FPDU_WRITE: [u8; 84] = [
        0x00, 0x4e, 0xc1, 0x40, 0x7d, 0xa9, 0x79, 0x00, 0x00, 0x00, 0x56, 0x51, 0x73, 0x0d, 0xd5,
        0x50, 0x72, 0x64, 0x6d, 0x61, 0x2d, 0x70, 0x69, 0x6e, 0x67, 0x2d, 0x30, 0x3a, 0x20, 0x41,
        0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50,
        0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f,
        0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e,
        0x6f, 0x70, 0x71, 0x72, 0x00, 0xf6, 0x5f, 0xb5, 0x29,
    ];

    /// siw-crc-ib_write_bw.pcap frame 18: FPDU (Send, ULPDU 20, PAD 2), CRC32c bf e0 ac 94.
    /// Note the PAD octets `00 40`: Linux siw does not zero its PAD (RFC 5044
    /// §4.1 says send zeros); the CRC covers them, so receivers must ignore the
    /// PAD value (MPA-13) and a byte-exact re-emit must keep it.
    const CRC_WRITE_BW_FPDU_PAD2: [u8; 28] = [
        0x00, 0x14, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x04, 0x00, 0x00, 0x00, 0x00, 0x33, 0x00, 0x00, 0x40, 0xbf, 0xe0, 0xac, 0x94,
    ];

    /// siw-crc-ib_write_bw.pcap frame 14: FPDU (Send, ULPDU 22), CRC32c 2f d8 88 6e.
    const CRC_WRITE_BW_FPDU_SEND22: [u8; 28] = [
        0x00, 0x16, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x2f, 0xd8, 0x88, 0x6e,
    ];

    /// siw-crc-ib_write_bw.pcap frames 40 (1444 octets) + 41 (4 octets, the CRC): one
    /// FPDU (RDMA Write, ULPDU 1442) split over two TCP segments, CRC32c af c9 ad e8.
    const CRC_WRITE_BW_SEG40_LEN: usize = 1444;

    const CRC_WRITE_BW_FPDU_1442: [u8; 1448] = [
        0x05, 0xa2, 0x81, 0x40, 0xa2, 0xfa, 0x75, 0x00, 0x00, 0x00, 0x55, 0xfa, 0x07, 0x57, 0x10,
        0x00, 0x15, 0xa6, 0xd7, 0x67, 0xb2, 0xbf, 0x01, 0x96, 0xca, 0x66, 0x8a, 0xdf, 0xdc, 0xca,
        0x59, 0x32, 0xcc, 0xa0, 0xbf, 0xd2, 0x64, 0xc3, 0xb8, 0xf1, 0xab, 0x8e, 0x1a, 0x5a, 0x5f,
        0xaf, 0xe4, 0x75, 0x55, 0xbb, 0xdc, 0x07, 0x7a, 0xdd, 0x9d, 0x45, 0x44, 0x28, 0x24, 0x20,
        0xf2, 0x7d, 0x53, 0xbf, 0x1d, 0x12, 0x91, 0x81, 0xd5, 0x4a, 0x72, 0x81, 0xd8, 0x8c, 0xdb,
        0x38, 0x3b, 0xbf, 0xad, 0x91, 0x7a, 0x89, 0x98, 0xf5, 0x66, 0x36, 0x3a, 0xaa, 0x5e, 0x5e,
        0xcb, 0x50, 0xdb, 0x1e, 0x0f, 0xf8, 0x30, 0xa1, 0x79, 0x06, 0xeb, 0xec, 0x87, 0xc3, 0x78,
        0x62, 0xfb, 0xb4, 0x21, 0xa8, 0x45, 0x9b, 0x31, 0xdd, 0x90, 0x98, 0x13, 0xca, 0x42, 0x71,
        0x28, 0x0d, 0xc2, 0x03, 0x2b, 0xd1, 0xfb, 0x5c, 0x72, 0x75, 0x62, 0x5d, 0x61, 0xe9, 0x21,
        0xd9, 0x4b, 0x1c, 0x8d, 0x6c, 0xc5, 0xd2, 0x07, 0xf6, 0xb0, 0x98, 0x8e, 0xc3, 0x62, 0xd1,
        0x35, 0x8b, 0xde, 0xf7, 0x8e, 0x0a, 0xc8, 0x8a, 0x66, 0x3b, 0xff, 0xc8, 0x98, 0x60, 0xb1,
        0xb9, 0x39, 0xfc, 0xd6, 0xc7, 0x68, 0x9b, 0x99, 0x6f, 0x91, 0x49, 0x07, 0x20, 0x0d, 0x6a,
        0xf1, 0x42, 0xf5, 0xcf, 0x39, 0x83, 0xd9, 0x01, 0x0d, 0x3f, 0x3c, 0x0c, 0x07, 0xd5, 0x6c,
        0xb8, 0x8e, 0xa6, 0xb4, 0x64, 0x6d, 0x1c, 0xff, 0x06, 0x8c, 0x91, 0x50, 0x93, 0xb1, 0x5d,
        0xfd, 0xa2, 0x9f, 0xf2, 0x71, 0xd8, 0x76, 0x4b, 0xd9, 0x83, 0x8a, 0x16, 0x90, 0x92, 0xeb,
        0xfc, 0x4a, 0x79, 0xa2, 0xff, 0xde, 0x0f, 0x1b, 0xdd, 0x16, 0xa7, 0x6e, 0x66, 0x3b, 0x1f,
        0xc3, 0x38, 0xc1, 0x62, 0x2b, 0x33, 0x3a, 0xa1, 0x7e, 0x13, 0x24, 0x08, 0x29, 0xb4, 0x9a,
        0x14, 0xb1, 0xe5, 0x8e, 0x53, 0xe4, 0x6c, 0x63, 0xff, 0x49, 0x79, 0xa7, 0xb8, 0xdf, 0xe2,
        0xd7, 0xa2, 0x1a, 0x99, 0x04, 0x45, 0xcc, 0x3e, 0xe6, 0x4a, 0x51, 0x0b, 0x52, 0x7b, 0xbf,
        0xed, 0x8f, 0x70, 0xd2, 0x1d, 0xc4, 0xb6, 0x89, 0x27, 0xb5, 0xd3, 0xa0, 0x5c, 0x8b, 0x7f,
        0x3e, 0x62, 0x21, 0x59, 0xfb, 0x25, 0x9e, 0xc7, 0x63, 0x85, 0x11, 0xb4, 0x90, 0x64, 0x2f,
        0x4f, 0x51, 0xbf, 0xc0, 0x23, 0xdc, 0x84, 0xd9, 0x66, 0xab, 0x8e, 0x39, 0x4b, 0xeb, 0xc4,
        0xca, 0x29, 0x26, 0xeb, 0x82, 0x22, 0x10, 0x21, 0xe9, 0x73, 0xa6, 0xfb, 0x27, 0x36, 0x5f,
        0x57, 0x85, 0xb0, 0x16, 0x45, 0xd3, 0xf2, 0xc9, 0xac, 0x58, 0x74, 0x3a, 0x91, 0xbf, 0x25,
        0x55, 0x89, 0x4f, 0x7c, 0x74, 0xd1, 0x9e, 0x84, 0xf2, 0x87, 0xf7, 0x98, 0x82, 0x1f, 0xce,
        0xe1, 0x76, 0x54, 0x91, 0x8c, 0x99, 0x64, 0x7e, 0x63, 0x10, 0xd7, 0xd7, 0x4b, 0x68, 0x97,
        0x70, 0xbe, 0x20, 0xbf, 0x3a, 0x95, 0x91, 0xd8, 0x19, 0x83, 0x5f, 0x11, 0x1c, 0xe2, 0x30,
        0xea, 0xc3, 0xa6, 0x3e, 0x55, 0x32, 0xd8, 0xb9, 0xb0, 0x3b, 0xca, 0x87, 0x12, 0x15, 0xf0,
        0xa9, 0x85, 0xae, 0xca, 0x45, 0xe8, 0x5f, 0xd6, 0xc0, 0x78, 0x59, 0x1f, 0x89, 0x75, 0x01,
        0xb9, 0x60, 0xc5, 0x5f, 0x9e, 0x1a, 0x91, 0x76, 0xd3, 0x42, 0xb1, 0x9d, 0xc9, 0xc4, 0xb2,
        0xb9, 0x6d, 0x38, 0x67, 0x37, 0x7d, 0x4f, 0x96, 0x53, 0x0f, 0x0f, 0xac, 0x2f, 0x98, 0x22,
        0x30, 0x52, 0x82, 0xf5, 0xb1, 0x20, 0x0f, 0x43, 0x97, 0xe3, 0x85, 0x48, 0x80, 0x4e, 0x0c,
        0x33, 0x08, 0x7a, 0x6b, 0x6f, 0xb1, 0xe8, 0xbf, 0x48, 0x3b, 0xce, 0x57, 0xe7, 0xfd, 0xef,
        0x09, 0x2e, 0x41, 0x8b, 0x23, 0xf3, 0xac, 0x33, 0x36, 0x43, 0x16, 0xbb, 0x8b, 0x96, 0x09,
        0x98, 0xc9, 0x11, 0x12, 0x34, 0x81, 0xc3, 0x1c, 0x40, 0x0b, 0x57, 0x0e, 0x62, 0x3f, 0x0c,
        0x52, 0x48, 0x3a, 0x93, 0xd4, 0x5d, 0x86, 0x80, 0x90, 0xbc, 0xc3, 0xa6, 0x77, 0x4e, 0x3d,
        0x81, 0xe6, 0x06, 0x92, 0xf8, 0x3b, 0x13, 0xbc, 0x57, 0x53, 0xc7, 0xaf, 0x62, 0x2a, 0xee,
        0x6e, 0x7c, 0x36, 0xa8, 0x0f, 0x0a, 0x05, 0x96, 0x8a, 0x96, 0x52, 0x4d, 0x3c, 0xca, 0x9c,
        0x79, 0x4b, 0x82, 0x80, 0xdd, 0x7b, 0xbb, 0xf1, 0x37, 0x12, 0x44, 0xfe, 0xc1, 0xa6, 0x28,
        0xaf, 0x14, 0xa4, 0xe6, 0xbc, 0xb4, 0xf0, 0xc2, 0x4a, 0x7b, 0x58, 0x9c, 0xc8, 0x94, 0x66,
        0x64, 0x0e, 0xb1, 0xe7, 0x8e, 0x8f, 0x62, 0x49, 0x80, 0x99, 0x5b, 0xc4, 0x97, 0x1d, 0x6b,
        0xc0, 0xcc, 0x7f, 0x64, 0xb2, 0x3c, 0x18, 0xa3, 0xfe, 0x62, 0x1e, 0x56, 0xff, 0xe6, 0xea,
        0x65, 0x4b, 0xf8, 0x17, 0x32, 0x86, 0xa6, 0x94, 0xcf, 0x26, 0x2d, 0x2b, 0xea, 0xc4, 0x48,
        0x55, 0x84, 0x14, 0xd5, 0xe9, 0xc7, 0x11, 0x01, 0x6a, 0x0f, 0x64, 0x88, 0x65, 0x63, 0x6e,
        0x4f, 0xc8, 0xb9, 0x48, 0xdf, 0xeb, 0xce, 0x85, 0x7f, 0x9e, 0xab, 0xac, 0xc9, 0x96, 0x71,
        0x11, 0xeb, 0xf5, 0x25, 0xc0, 0xde, 0xec, 0xd1, 0xe0, 0x56, 0xe0, 0x44, 0xde, 0x45, 0xa7,
        0x4d, 0x95, 0x6f, 0x06, 0xdd, 0x4f, 0xf2, 0xab, 0xd4, 0x71, 0x49, 0x80, 0x1e, 0x12, 0x16,
        0x8f, 0x23, 0x01, 0x84, 0x49, 0xc2, 0x63, 0x35, 0x93, 0x43, 0x8c, 0x74, 0x87, 0x6a, 0xb9,
        0x2e, 0xb7, 0x4e, 0x9d, 0xbe, 0x2b, 0xec, 0xb0, 0xd7, 0xc1, 0x21, 0x20, 0x41, 0x3f, 0x33,
        0x57, 0xce, 0x56, 0x58, 0x53, 0x9f, 0x1a, 0xb6, 0xd5, 0xae, 0xf9, 0x61, 0x22, 0x80, 0xcb,
        0xdb, 0xae, 0x83, 0x2a, 0x4b, 0x41, 0x55, 0x38, 0xf1, 0x2c, 0xf9, 0x12, 0x4d, 0x3a, 0x52,
        0x80, 0x91, 0x20, 0xd6, 0xe9, 0x73, 0x76, 0x04, 0x29, 0x4b, 0xb2, 0x22, 0xac, 0xd4, 0xa2,
        0x77, 0xaf, 0x50, 0xfa, 0xd9, 0x9c, 0x3b, 0x2f, 0xd4, 0x2c, 0x5b, 0xcd, 0x3f, 0xa8, 0x07,
        0x91, 0x28, 0x98, 0xb1, 0xff, 0x81, 0x25, 0x75, 0x85, 0x4e, 0xc0, 0x37, 0x71, 0x6c, 0x0b,
        0x13, 0xe3, 0xbb, 0x64, 0xde, 0x94, 0x00, 0x19, 0xc3, 0xd4, 0x46, 0x1f, 0xa1, 0x85, 0xc7,
        0xa8, 0x16, 0xf0, 0x40, 0xc7, 0xef, 0xc1, 0xec, 0x64, 0x47, 0x3b, 0x24, 0x7e, 0xac, 0x90,
        0x8a, 0xbf, 0x73, 0x45, 0x23, 0x51, 0xd9, 0x23, 0x6b, 0x9d, 0xf7, 0xb1, 0xbc, 0x98, 0x36,
        0x83, 0x40, 0x4c, 0x73, 0x80, 0x13, 0x62, 0x42, 0x00, 0xc6, 0x89, 0x3b, 0xea, 0x07, 0xe7,
        0x7a, 0x91, 0xa6, 0xee, 0xd6, 0xca, 0x3f, 0xb0, 0xed, 0xaa, 0x4d, 0xe5, 0x5b, 0x09, 0x7d,
        0x91, 0x8c, 0xbe, 0xdd, 0x00, 0x3e, 0xf1, 0x62, 0x80, 0xf1, 0x29, 0x09, 0x2c, 0x13, 0x11,
        0x13, 0x8e, 0xa2, 0xb9, 0x7c, 0x79, 0x83, 0xbb, 0x29, 0x71, 0x66, 0x76, 0x56, 0xc1, 0x7f,
        0xd3, 0x53, 0x0b, 0x91, 0x30, 0x0b, 0xd0, 0x21, 0x6e, 0x50, 0x12, 0x97, 0x5a, 0x3e, 0xaa,
        0x6b, 0x51, 0x38, 0x0d, 0x0b, 0xb4, 0x86, 0x8e, 0x70, 0xaf, 0xff, 0xd6, 0x25, 0x55, 0x97,
        0xa4, 0x29, 0xea, 0xb0, 0xba, 0x1b, 0xbb, 0x8a, 0x3c, 0x29, 0xdb, 0x4f, 0xc0, 0x35, 0x8d,
        0x6b, 0xa0, 0xdf, 0xa3, 0xad, 0xea, 0x58, 0x34, 0x78, 0xc8, 0xe3, 0x78, 0x9e, 0x09, 0xcd,
        0x35, 0xad, 0xf6, 0x20, 0x5d, 0xb1, 0x3b, 0x19, 0x3b, 0x77, 0x42, 0x16, 0xc6, 0x03, 0x4b,
        0x54, 0x6e, 0xeb, 0x33, 0x11, 0x99, 0x1d, 0x69, 0xcd, 0x95, 0x31, 0xb0, 0x0d, 0xcf, 0xb9,
        0xdb, 0x05, 0x67, 0xd1, 0x25, 0xc4, 0x82, 0x60, 0xdd, 0xbe, 0xd7, 0x20, 0xd4, 0x9e, 0x23,
        0x20, 0xf2, 0x91, 0x0b, 0x25, 0xa2, 0xa4, 0x42, 0x0c, 0x71, 0xd7, 0x3d, 0x22, 0xe5, 0x0d,
        0xdb, 0xc0, 0x12, 0x42, 0x91, 0x37, 0x07, 0x14, 0x97, 0xe4, 0xd2, 0x6e, 0x04, 0xa6, 0x0c,
        0x27, 0xc6, 0xfe, 0xb8, 0xd2, 0x23, 0x5b, 0x76, 0x65, 0x67, 0xe8, 0x3d, 0xa4, 0x0a, 0x22,
        0xb1, 0xe5, 0xe2, 0xc3, 0x28, 0x73, 0xfa, 0x2f, 0x87, 0x91, 0x13, 0x59, 0x00, 0x18, 0x00,
        0x0c, 0x3f, 0xc6, 0x0b, 0xf8, 0x98, 0x2e, 0x53, 0x0f, 0x94, 0xba, 0xf7, 0xd1, 0x5e, 0x01,
        0xf3, 0x10, 0xe6, 0xd5, 0xd3, 0x0e, 0x48, 0xce, 0x3d, 0xd0, 0x5f, 0x51, 0x29, 0x5f, 0x69,
        0x29, 0x6c, 0xa8, 0xf0, 0x77, 0xa0, 0x88, 0xa5, 0xf3, 0x97, 0x39, 0xad, 0x8e, 0x0a, 0x0c,
        0x8f, 0xfd, 0x1c, 0x76, 0xd2, 0xef, 0x84, 0x1b, 0xbd, 0xc2, 0xeb, 0x1d, 0x13, 0x14, 0x7c,
        0x7c, 0x3e, 0xe8, 0x24, 0x2e, 0x5f, 0xc5, 0xb6, 0x05, 0xb8, 0x4e, 0x3e, 0x66, 0xdc, 0x49,
        0x72, 0x6c, 0x46, 0x8e, 0xe2, 0x19, 0x7d, 0x66, 0x34, 0x3b, 0x28, 0x1f, 0x58, 0x3b, 0x33,
        0xd4, 0xb7, 0x71, 0xbd, 0xdc, 0x9f, 0x1c, 0xa1, 0x56, 0x21, 0x59, 0xa4, 0x60, 0xbf, 0x80,
        0xa9, 0x31, 0xec, 0xef, 0xbf, 0xce, 0x08, 0x3d, 0x35, 0x3c, 0x78, 0x5d, 0x5b, 0xd0, 0x99,
        0x8f, 0xa4, 0x50, 0x00, 0x61, 0x2c, 0xa0, 0x7e, 0xcd, 0xf6, 0x9f, 0x27, 0x9a, 0xff, 0xe6,
        0x1a, 0xa8, 0x18, 0x07, 0x98, 0xd7, 0xd5, 0xa0, 0x14, 0x0a, 0xdd, 0x8c, 0x68, 0x38, 0x5c,
        0x01, 0xc7, 0x01, 0x51, 0xc8, 0x62, 0x7e, 0x68, 0xe0, 0x4b, 0x5e, 0x80, 0x72, 0xf8, 0x7f,
        0x59, 0x12, 0x28, 0x71, 0x19, 0xc0, 0x48, 0xef, 0x60, 0x5d, 0xf9, 0x3d, 0xe9, 0x61, 0x76,
        0x46, 0x62, 0x3d, 0x47, 0xb4, 0x05, 0xa9, 0x32, 0x6d, 0x8a, 0x7d, 0xcb, 0x0a, 0xf0, 0xc3,
        0x89, 0x49, 0xd6, 0xb1, 0xba, 0xef, 0x71, 0x02, 0xde, 0xd2, 0x5f, 0xd8, 0x0f, 0x49, 0x39,
        0x85, 0x8f, 0x9c, 0xc3, 0xd6, 0x50, 0xc8, 0x7f, 0x82, 0x36, 0x09, 0xff, 0x01, 0x13, 0xef,
        0xc5, 0x9d, 0x38, 0x9b, 0x4e, 0xf2, 0x8a, 0xc0, 0xf5, 0x69, 0x92, 0x54, 0x41, 0xa1, 0x9d,
        0x7a, 0x27, 0x2c, 0x16, 0xea, 0x02, 0x66, 0xb2, 0x82, 0xe8, 0xe8, 0x8b, 0xe8, 0xea, 0x9f,
        0xd7, 0xaf, 0x3c, 0x10, 0x4a, 0x8a, 0x02, 0xd4, 0x4a, 0xf7, 0x3d, 0xdc, 0x4c, 0x7e, 0x7e,
        0xe9, 0xf9, 0xa5, 0x16, 0x0f, 0x8f, 0x18, 0x76, 0x41, 0x9a, 0x5e, 0x2a, 0x26, 0x46, 0x14,
        0xc5, 0x1e, 0xc3, 0x01, 0x2e, 0x0d, 0x8b, 0x30, 0xe1, 0xd6, 0x28, 0x1f, 0xb2, 0x74, 0x9d,
        0x30, 0x5d, 0x96, 0xd5, 0x73, 0xa6, 0x64, 0x8c, 0x1c, 0xa6, 0x26, 0x7a, 0xd0, 0x4c, 0xc1,
        0xe4, 0x11, 0xdf, 0xa7, 0x12, 0x0d, 0xb4, 0x9e, 0x3d, 0x95, 0x74, 0x65, 0xb4, 0x26, 0xd9,
        0x52, 0x57, 0x37, 0xe8, 0x2c, 0xaa, 0x8e, 0x91, 0x36, 0xaa, 0x37, 0x5d, 0x25, 0x07, 0xa9,
        0xe6, 0xeb, 0xbb, 0xc5, 0x92, 0xcd, 0xd2, 0x46, 0x6b, 0x0f, 0xdb, 0xdf, 0x75, 0x90, 0x06,
        0x4e, 0xe2, 0x5d, 0x85, 0xaf, 0xc9, 0xad, 0xe8,
    ];

    // -----------------------------------------------------------------------
    // CRC32c (RFC 5044 §4.4) — MPA-32
    // -----------------------------------------------------------------------

    #[test]
    fn mpa_32_crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_bitwise(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// mpa.md §4.2 iSCSI vectors (RFC 3720 §B.4), in wire order.
    #[test]
    fn mpa_32_crc32c_iscsi_vectors_wire_order() {
        let asc: Vec<u8> = (0u8..32).collect();
        let desc: Vec<u8> = (0u8..32).rev().collect();
        let cases: [(&[u8], [u8; 4]); 4] = [
            (&[0u8; 32], [0xaa, 0x36, 0x91, 0x8a]),
            (&[0xffu8; 32], [0x43, 0xab, 0xa8, 0x62]),
            (&asc, [0x4e, 0x79, 0xdd, 0x46]),
            (&desc, [0x5c, 0xdb, 0x3f, 0x11]),
        ];
        for (data, wire) in cases {
            assert_eq!(crc_to_wire(crc32c(data)), wire);
            assert_eq!(crc_from_wire(wire), crc32c_bitwise(data));
        }
    }

    /// MPA-32, MPA-33: seed Fig. 5 (leading Marker covered) and Fig. 6
    /// (embedded Marker covered) CRCs, `52 23 99 83` and `84 92 58 98`.
    #[test]
    fn mpa_32_mpa_33_crc_seed_fig5_fig6() {
        let f5 = seed_fig5();
        let f6 = seed_fig6();
        assert_eq!(crc32c(&f5[..f5.len() - 4]), 0x8399_2352);
        assert_eq!(
            crc_to_wire(crc32c(&f5[..f5.len() - 4])),
            [0x52, 0x23, 0x99, 0x83]
        );
        assert_eq!(crc32c(&f6[..f6.len() - 4]), 0x9858_9284);
        assert_eq!(crc_to_wire(0x9858_9284), [0x84, 0x92, 0x58, 0x98]);
    }

    #[test]
    fn crc32c_gather_matches_flat() {
        let d = pattern(1000, 3);
        assert_eq!(
            crc32c_gather(&[&d[..1], &d[1..500], &[], &d[500..]]),
            crc32c(&d)
        );
        assert_eq!(crc32c_gather(&[]), 0);
        assert_eq!(crc32c(&d), crc32c_bitwise(&d));
    }

    /// MPA-32/33/34: every real CRC32c of the siw-crc captures verifies, in
    /// wire order, with both CRC implementations.
    #[test]
    fn mpa_32_crc_of_real_siw_crc_fpdus() {
        let fpdus: [(&[u8], [u8; 4]); 7] = [
            (&CRC_RPING_FPDU_SEND, [0x00, 0x83, 0x31, 0x57]),
            (&CRC_RPING_FPDU_READ_REQ, [0x86, 0x81, 0xd4, 0x6c]),
            (&CRC_RPING_FPDU_READ_RESP, [0x2f, 0xfa, 0x03, 0x76]),
            (&CRC_RPING_FPDU_WRITE, [0xf6, 0x5f, 0xb5, 0x29]),
            (&CRC_WRITE_BW_FPDU_PAD2, [0xbf, 0xe0, 0xac, 0x94]),
            (&CRC_WRITE_BW_FPDU_SEND22, [0x2f, 0xd8, 0x88, 0x6e]),
            (&CRC_WRITE_BW_FPDU_1442, [0xaf, 0xc9, 0xad, 0xe8]),
        ];
        for (bytes, wire) in fpdus {
            let f = Fpdu::new_checked(bytes).unwrap();
            assert_eq!(f.total_len(), bytes.len());
            assert_eq!(f.crc(), crc_from_wire(wire));
            assert_eq!(f.compute_crc(), crc_from_wire(wire));
            assert_eq!(
                crc32c_bitwise(&bytes[..bytes.len() - 4]),
                crc_from_wire(wire)
            );
            assert!(f.verify_crc());
        }
    }

    // -----------------------------------------------------------------------
    // LLP error codes — EXT-MPA-01
    // -----------------------------------------------------------------------

    #[test]
    fn ext_mpa_01_llp_error_codes() {
        let all = [
            (1u8, LlpError::TcpConnectionLost),
            (2, LlpError::CrcError),
            (3, LlpError::MarkerMismatch),
            (4, LlpError::InvalidRequestReply),
            (5, LlpError::LocalCatastrophic),
            (6, LlpError::InsufficientIrd),
            (7, LlpError::NoMatchingRtr),
        ];
        for (v, e) in all {
            assert_eq!(LlpError::try_from(v).unwrap(), e);
            assert_eq!(u8::from(e), v);
        }
        for v in [0u8, 8, 0x10, 0xff] {
            assert!(matches!(
                LlpError::try_from(v),
                Err(Error::Unknown {
                    layer: Layer::Mpa,
                    ..
                })
            ));
        }
        assert_eq!(LlpError::LAYER, 2);
        assert_eq!(LlpError::ETYPE_MPA, 0);
    }

    // -----------------------------------------------------------------------
    // Startup frames (RFC 5044 §7.1.1)
    // -----------------------------------------------------------------------

    /// MPA-52, MPA-54: the key octets.
    #[test]
    fn mpa_52_mpa_54_keys() {
        assert_eq!(
            REQUEST_KEY,
            [
                0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61,
                0x6D, 0x65
            ]
        );
        assert_eq!(
            REPLY_KEY,
            [
                0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61,
                0x6D, 0x65
            ]
        );
        assert_eq!(
            FrameKind::try_from(REQUEST_KEY).unwrap(),
            FrameKind::Request
        );
        assert_eq!(<[u8; 16]>::from(FrameKind::Reply), REPLY_KEY);
    }

    /// MPA-52, MPA-50: golden bytes of an encoded rev-1 Request (no CRC/Marker octets).
    #[test]
    fn mpa_52_request_golden_bytes() {
        let r = FrameRepr {
            kind: FrameKind::Request,
            m: true,
            c: true,
            r: false,
            res: 0,
            rev: REV_1,
            private_data: b"hi",
        };
        let mut buf = [0u8; 22];
        assert_eq!(r.emit(&mut buf).unwrap(), 22);
        let mut want = REQUEST_KEY.to_vec();
        want.extend_from_slice(&[0xc0, 0x01, 0x00, 0x02, b'h', b'i']);
        assert_eq!(&buf[..], &want[..]);
    }

    /// MPA-54, MPA-59: golden Reply with R=1 (reject) and Private Data.
    #[test]
    fn mpa_54_reply_golden_bytes_reject() {
        let r = FrameRepr {
            kind: FrameKind::Reply,
            m: false,
            c: true,
            r: true,
            res: 0,
            rev: REV_1,
            private_data: &[],
        };
        let mut buf = [0u8; 20];
        r.emit(&mut buf).unwrap();
        let mut want = REPLY_KEY.to_vec();
        want.extend_from_slice(&[0x60, 0x01, 0x00, 0x00]);
        assert_eq!(&buf[..], &want[..]);
        assert_eq!(FrameRepr::parse(&buf).unwrap(), r);
    }

    /// Real startup frames: deconstruct with the view, parse, re-emit
    /// byte-identically (rev 2 with Res 0x10, C=1, rev 1, long PD).
    #[test]
    fn capture_frames_parse_and_reemit() {
        struct Case<'a> {
            bytes: &'a [u8],
            kind: FrameKind,
            c: bool,
            res: u8,
            rev: u8,
            pd: &'a [u8],
        }
        let cases = [
            Case {
                bytes: &SIW_RPING_REQUEST,
                kind: FrameKind::Request,
                c: false,
                res: 0x10,
                rev: 2,
                pd: &[0, 1, 0, 1],
            },
            Case {
                bytes: &SIW_RPING_REPLY,
                kind: FrameKind::Reply,
                c: false,
                res: 0x10,
                rev: 2,
                pd: &[0, 1, 0, 1],
            },
            Case {
                bytes: &SIW_CRC_RPING_REQUEST,
                kind: FrameKind::Request,
                c: true,
                res: 0x10,
                rev: 2,
                pd: &[0, 1, 0, 1],
            },
            Case {
                bytes: &SIW_CRC_RPING_REPLY,
                kind: FrameKind::Reply,
                c: true,
                res: 0x10,
                rev: 2,
                pd: &[0, 1, 0, 1],
            },
            Case {
                bytes: &SIW_MPA1_REQUEST,
                kind: FrameKind::Request,
                c: false,
                res: 0,
                rev: 1,
                pd: &[],
            },
            Case {
                bytes: &SIW_MPA1_REPLY,
                kind: FrameKind::Reply,
                c: false,
                res: 0,
                rev: 1,
                pd: &[],
            },
            Case {
                bytes: &NFS3_REQUEST,
                kind: FrameKind::Request,
                c: false,
                res: 0x10,
                rev: 2,
                pd: &NFS3_REQUEST[20..],
            },
            Case {
                bytes: &NFS3_REPLY,
                kind: FrameKind::Reply,
                c: false,
                res: 0x10,
                rev: 2,
                pd: &NFS3_REPLY[20..],
            },
            Case {
                bytes: &SEND_INV_REPLY,
                kind: FrameKind::Reply,
                c: false,
                res: 0x10,
                rev: 2,
                pd: &SEND_INV_REPLY[20..],
            },
        ];
        for c in cases {
            let f = Frame::new_checked(c.bytes).unwrap();
            assert_eq!(f.kind().unwrap(), c.kind);
            assert!(!f.m());
            assert_eq!(f.c(), c.c);
            assert!(!f.r());
            assert_eq!(f.res(), c.res);
            assert_eq!(f.rev(), c.rev);
            assert_eq!(usize::from(f.pd_length()), c.pd.len());
            assert_eq!(f.private_data(), c.pd);
            assert_eq!(f.total_len(), c.bytes.len());
            assert_eq!(FrameRepr::frame_len(c.bytes).unwrap(), Some(c.bytes.len()));

            let r = FrameRepr::parse(c.bytes).unwrap();
            assert_eq!(
                (r.kind, r.m, r.c, r.r, r.res, r.rev),
                (c.kind, false, c.c, false, c.res, c.rev)
            );
            assert_eq!(r.private_data, c.pd);
            assert_eq!(r.buffer_len(), c.bytes.len());
            let mut out = [0u8; 64];
            let n = r.emit(&mut out).unwrap();
            assert_eq!(&out[..n], c.bytes);
        }
    }

    /// EXT-6581-01: IRD/ORD words of real rev-2 frames.
    #[test]
    fn ext_6581_01_rev2_params_from_captures() {
        let p = FrameRepr::parse(&SIW_RPING_REQUEST)
            .unwrap()
            .rev2_params()
            .unwrap()
            .unwrap();
        assert_eq!(
            p,
            Rev2Params {
                ird: 1,
                ord: 1,
                ..Default::default()
            }
        );
        let p = FrameRepr::parse(&NFS3_REQUEST)
            .unwrap()
            .rev2_params()
            .unwrap()
            .unwrap();
        assert_eq!(
            p,
            Rev2Params {
                ird: 128,
                ord: 0,
                ..Default::default()
            }
        );
        let p = FrameRepr::parse(&NFS3_REPLY)
            .unwrap()
            .rev2_params()
            .unwrap()
            .unwrap();
        assert_eq!(
            p,
            Rev2Params {
                ird: 0,
                ord: 128,
                ..Default::default()
            }
        );
        // Rev 1 has no IRD/ORD word.
        assert_eq!(
            FrameRepr::parse(&SIW_MPA1_REQUEST)
                .unwrap()
                .rev2_params()
                .unwrap(),
            None
        );
        // Re-emit the words byte-identically.
        for f in [
            &SIW_RPING_REQUEST[..],
            &NFS3_REQUEST,
            &NFS3_REPLY,
            &SEND_INV_REPLY,
        ] {
            let r = FrameRepr::parse(f).unwrap();
            let p = r.rev2_params().unwrap().unwrap();
            let mut w = [0u8; 4];
            assert_eq!(p.emit(&mut w).unwrap(), 4);
            assert_eq!(&w, &r.private_data[..4]);
        }
    }

    /// EXT-6581-01: flag bits where Linux siw puts them (MPA_V2_* constants on
    /// two big-endian u16s).
    #[test]
    fn ext_6581_01_rev2_flag_layout() {
        assert_eq!(Rev2Params::PEER_TO_PEER, 0x8000);
        assert_eq!(Rev2Params::ZERO_LENGTH_RTR, 0x4000);
        assert_eq!(Rev2Params::RDMA_WRITE_RTR, 0x8000);
        assert_eq!(Rev2Params::RDMA_READ_RTR, 0x4000);
        assert_eq!(Rev2Params::IRD_ORD_MASK, 0x3fff);
        let cases = [
            (
                Rev2Params {
                    p2p: true,
                    ..Default::default()
                },
                [0x80, 0, 0, 0],
            ),
            (
                Rev2Params {
                    zero_len_rtr: true,
                    ..Default::default()
                },
                [0x40, 0, 0, 0],
            ),
            (
                Rev2Params {
                    write_rtr: true,
                    ..Default::default()
                },
                [0, 0, 0x80, 0],
            ),
            (
                Rev2Params {
                    read_rtr: true,
                    ..Default::default()
                },
                [0, 0, 0x40, 0],
            ),
            (
                Rev2Params {
                    ird: 0x3fff,
                    ord: 0x2001,
                    ..Default::default()
                },
                [0x3f, 0xff, 0x20, 0x01],
            ),
            (
                Rev2Params {
                    p2p: true,
                    zero_len_rtr: false,
                    write_rtr: true,
                    read_rtr: true,
                    ird: 16,
                    ord: 4,
                },
                [0x80, 0x10, 0xc0, 0x04],
            ),
        ];
        for (p, wire) in cases {
            let mut w = [0u8; 4];
            p.emit(&mut w).unwrap();
            assert_eq!(w, wire, "{p:?}");
            assert_eq!(Rev2Params::parse(&wire).unwrap(), p);
        }
        let bad = Rev2Params {
            ird: 0x4000,
            ..Default::default()
        };
        assert!(matches!(
            bad.emit(&mut [0u8; 4]),
            Err(Error::TooLarge { .. })
        ));
        let bad = Rev2Params {
            ord: 0xffff,
            ..Default::default()
        };
        assert!(matches!(
            bad.emit(&mut [0u8; 4]),
            Err(Error::TooLarge { .. })
        ));
        assert!(matches!(
            Rev2Params::default().emit(&mut [0u8; 3]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            Rev2Params::parse(&[0, 1, 0]),
            Err(Error::Truncated { .. })
        ));
        // A rev-2 frame too short for the word.
        let r = FrameRepr {
            kind: FrameKind::Request,
            m: false,
            c: false,
            r: false,
            res: RES_ENHANCED,
            rev: 2,
            private_data: &[1],
        };
        assert!(matches!(r.rev2_params(), Err(Error::Truncated { .. })));
    }

    /// Build a frame with the view setters.
    #[test]
    fn frame_view_setters() {
        let mut buf = [0xffu8; 26];
        let mut f = Frame::new_unchecked(&mut buf[..]);
        f.set_key(FrameKind::Reply);
        f.set_m(false);
        f.set_c(true);
        f.set_r(false);
        f.set_res(0x10);
        f.set_rev(2);
        f.set_pd_length(4);
        f.private_data_mut().copy_from_slice(&[0, 1, 0, 1]);
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(f.kind().unwrap(), FrameKind::Reply);
        assert!(f.c() && !f.m() && !f.r());
        assert_eq!(f.res(), 0x10);
        assert_eq!(&buf[..24], &SIW_CRC_RPING_REPLY[..]);
        let mut g = Frame::new_unchecked([0u8; 20]);
        g.set_m(true);
        g.set_m(false);
        g.set_res(0xff);
        assert_eq!(g.res(), 0x1f);
        assert!(!g.m() && !g.c() && !g.r());
        assert_eq!(g.into_inner()[16], 0x1f);
    }

    /// MPA-53, MPA-55, MPA-74, MPA-77: any changed key octet is refused; a
    /// Request key is still recognised as a Request (Initiator/Initiator).
    #[test]
    fn mpa_53_mpa_55_bad_key_rejected() {
        for i in 0..KEY_LEN {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut b = SIW_RPING_REQUEST;
                b[i] ^= flip;
                if b[..16] == REPLY_KEY {
                    // 'q' ^ 0x01 == 'p': that is the other valid key.
                    assert_eq!(FrameRepr::parse(&b).unwrap().kind, FrameKind::Reply);
                    continue;
                }
                let e = FrameRepr::parse(&b).unwrap_err();
                assert!(
                    matches!(e, Error::Malformed { reason, .. } if reason == REASON_BAD_KEY),
                    "{i}"
                );
                assert!(FrameRepr::frame_len(&b).is_err());
                // frame_len refuses as soon as the bad octet is visible.
                assert!(FrameRepr::frame_len(&b[..=i]).is_err());
                assert_eq!(FrameRepr::frame_len(&b[..i]).unwrap(), None);
            }
        }
        assert_eq!(
            FrameRepr::parse(&SIW_RPING_REQUEST).unwrap().kind,
            FrameKind::Request
        );
    }

    /// MPA-62, MPA-63, MPA-79: PD_Length 513 refused on parse and in
    /// frame_len; 512 accepted; emit refuses 513 octets.
    #[test]
    fn mpa_62_mpa_63_pd_length_bound() {
        let mut b = vec![0u8; 20 + 513];
        b[..16].copy_from_slice(&REQUEST_KEY);
        b[17] = 1;
        b[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert!(matches!(
            FrameRepr::parse(&b),
            Err(Error::TooLarge {
                value: 513,
                limit: 512,
                ..
            })
        ));
        assert!(matches!(
            FrameRepr::frame_len(&b[..20]),
            Err(Error::TooLarge { .. })
        ));
        b[18..20].copy_from_slice(&0xffffu16.to_be_bytes());
        assert!(matches!(FrameRepr::parse(&b), Err(Error::TooLarge { .. })));
        b[18..20].copy_from_slice(&512u16.to_be_bytes());
        let r = FrameRepr::parse(&b).unwrap();
        assert_eq!(r.private_data.len(), 512);
        assert_eq!(FrameRepr::frame_len(&b[..20]).unwrap(), Some(532));
        // Body shorter than PD_Length: truncated, not a panic.
        assert!(matches!(
            FrameRepr::parse(&b[..531]),
            Err(Error::Truncated { need: 532, .. })
        ));
        assert!(Frame::new_checked(&b[..531]).is_err());

        let pd = [0u8; 513];
        let r = FrameRepr {
            kind: FrameKind::Reply,
            m: false,
            c: false,
            r: false,
            res: 0,
            rev: 1,
            private_data: &pd,
        };
        assert!(matches!(
            r.emit(&mut [0u8; 600]),
            Err(Error::TooLarge { .. })
        ));
        let r = FrameRepr {
            private_data: &pd[..512],
            ..r
        };
        assert_eq!(r.emit(&mut [0u8; 600]).unwrap(), 532);
    }

    /// MPA-59, MPA-60, MPA-61: R=1 in a Request, Res=0x1f and unusual Revs
    /// are parsed and reported as they are (policy lives above the codec).
    #[test]
    fn mpa_59_60_61_fields_reported_raw() {
        let mut b = SIW_MPA1_REQUEST;
        b[16] = 0x20 | 0x1f;
        for rev in [0u8, 2, 255] {
            b[17] = rev;
            let r = FrameRepr::parse(&b).unwrap();
            assert!(r.r);
            assert_eq!(r.res, 0x1f);
            assert_eq!(r.rev, rev);
            let mut out = [0u8; 20];
            r.emit(&mut out).unwrap();
            assert_eq!(out, b);
        }
        let r = FrameRepr::parse(&b).unwrap();
        let bad = FrameRepr { res: 0x20, ..r };
        assert!(matches!(
            bad.emit(&mut [0u8; 20]),
            Err(Error::TooLarge { .. })
        ));
    }

    /// MPA-66, MPA-79: every truncation of a frame is an error (never a panic),
    /// frame_len says "need more" until the whole header is there.
    #[test]
    fn mpa_66_frame_truncations() {
        for f in [&SIW_RPING_REQUEST[..], &NFS3_REPLY, &SIW_MPA1_REPLY] {
            for n in 0..f.len() {
                assert!(
                    matches!(FrameRepr::parse(&f[..n]), Err(Error::Truncated { .. })),
                    "{n}"
                );
                assert!(Frame::new_checked(&f[..n]).is_err());
                let fl = FrameRepr::frame_len(&f[..n]).unwrap();
                assert_eq!(fl, if n < 20 { None } else { Some(f.len()) });
            }
            let r = FrameRepr::parse(f).unwrap();
            for n in 0..f.len() {
                let mut out = vec![0u8; n];
                assert!(matches!(r.emit(&mut out), Err(Error::Truncated { .. })));
            }
        }
    }

    // -----------------------------------------------------------------------
    // FPDU without Markers (RFC 5044 §4.1)
    // -----------------------------------------------------------------------

    /// MPA-13: lengths 1..8 -> PAD 1,0,3,2,1,0,3,2; MPA-11/12 FPDU size.
    #[test]
    fn mpa_13_pad_lengths() {
        let want = [2usize, 1, 0, 3, 2, 1, 0, 3, 2];
        for (len, p) in want.iter().enumerate() {
            assert_eq!(pad_len(len), *p);
            assert_eq!(fpdu_len(len), 2 + len + p + 4);
            assert_eq!((2 + len + pad_len(len)) % 4, 0);
        }
        assert_eq!(pad_len(usize::MAX), 3); // (2^64 + 1) % 4 == 1
        assert_eq!(fpdu_len(usize::MAX), usize::MAX);
        assert_eq!(fpdu_len(42), 48);
    }

    /// MPA-11, MPA-12, MPA-14: real FPDUs (CRC on and off) through the view
    /// and FpduRepr, re-emitted byte-identically.
    #[test]
    fn mpa_11_capture_fpdus_view_and_repr() {
        let cases: [(&[u8], u16, &[u8], bool); 10] = [
            (&SIW_RPING_FPDU_SEND, 34, &[], false),
            (&SIW_RPING_FPDU_READ_RESP, 78, &[], false),
            (&SIW_MPA1_FPDU, 118, &[], false),
            (&CRC_RPING_FPDU_SEND, 34, &[], true),
            (&CRC_RPING_FPDU_READ_REQ, 46, &[], true),
            (&CRC_RPING_FPDU_READ_RESP, 78, &[], true),
            (&CRC_RPING_FPDU_WRITE, 78, &[], true),
            (&CRC_WRITE_BW_FPDU_PAD2, 20, &[0x00, 0x40], true),
            (&CRC_WRITE_BW_FPDU_SEND22, 22, &[], true),
            (&CRC_WRITE_BW_FPDU_1442, 1442, &[], true),
        ];
        for (bytes, len, pad, crc_on) in cases {
            let f = Fpdu::new_checked(bytes).unwrap();
            assert_eq!(f.ulpdu_length(), len);
            assert_eq!(f.pad_len(), pad.len());
            assert_eq!(f.pad(), pad, "Linux siw PAD octets kept as sent");
            assert_eq!(f.ulpdu(), &bytes[2..2 + usize::from(len)]);
            assert_eq!(f.total_len(), bytes.len());
            if crc_on {
                assert!(f.verify_crc());
            } else {
                assert_eq!(f.crc(), 0, "CRC off: Linux sends a zero field");
            }
            let r = FpduRepr::parse(bytes).unwrap();
            assert_eq!(r.ulpdu, f.ulpdu());
            assert_eq!(r.crc, f.crc());
            assert_eq!(r.buffer_len(), bytes.len());
            let mut out = vec![0u8; bytes.len()];
            assert_eq!(r.emit(&mut out).unwrap(), bytes.len());
            assert_eq!(&out[..], bytes);
            if pad.iter().all(|&b| b == 0) {
                // Rebuild from the ULPDU alone.
                assert_eq!(FpduRepr::new(r.ulpdu, crc_on), r);
                // The stream codec (Markers off) gives the same octets.
                assert_eq!(encode_vec(&[r.ulpdu], 0, false, crc_on), bytes);
            } else {
                // Our zero PAD changes the CRC; the ULPDU survives.
                let ours = encode_vec(&[r.ulpdu], 0, false, crc_on);
                assert_eq!(
                    &ours[..2 + usize::from(len)],
                    &bytes[..2 + usize::from(len)]
                );
                assert_eq!(FpduRepr::parse(&ours).unwrap().pad, [0; 3]);
            }
            // Every truncation is refused.
            for n in 0..bytes.len() {
                assert!(Fpdu::new_checked(&bytes[..n]).is_err());
                assert!(FpduRepr::parse(&bytes[..n]).is_err());
                assert!(matches!(
                    r.emit(&mut out[..n]),
                    Err(Error::Truncated { .. })
                ));
            }
        }
    }

    /// Construct an FPDU with the setters; fill_crc gives CRC32c (MPA-32).
    #[test]
    fn mpa_32_fpdu_view_setters() {
        let mut buf = [0xeeu8; 28];
        let mut f = Fpdu::new_unchecked(&mut buf[..]);
        f.set_ulpdu_length(20);
        f.ulpdu_mut()
            .copy_from_slice(&CRC_WRITE_BW_FPDU_PAD2[2..22]);
        f.pad_mut().copy_from_slice(&[0x00, 0x40]); // siw's PAD octets
        f.fill_crc();
        assert!(f.verify_crc());
        assert_eq!(buf, CRC_WRITE_BW_FPDU_PAD2);
        let mut f = Fpdu::new_unchecked(buf);
        f.set_crc(0x1234_5678);
        assert_eq!(&f.into_inner()[24..], &[0x78, 0x56, 0x34, 0x12]);
    }

    /// MPA-13: non-zero PAD is CRC input and otherwise ignored.
    #[test]
    fn mpa_13_nonzero_pad_kept_and_covered() {
        // Linux already sends PAD 00 40 with a matching CRC.
        let real = Fpdu::new_checked(&CRC_WRITE_BW_FPDU_PAD2[..]).unwrap();
        assert_eq!(real.pad(), &[0x00, 0x40]);
        assert!(real.verify_crc());
        let mut b = CRC_WRITE_BW_FPDU_PAD2;
        b[22] = 0xab;
        let f = Fpdu::new_checked(&b[..]).unwrap();
        assert!(!f.verify_crc());
        let r = FpduRepr::parse(&b).unwrap();
        assert_eq!(r.pad, [0xab, 0x40, 0]);
        let mut out = [0u8; 28];
        r.emit(&mut out).unwrap();
        assert_eq!(out, b);
        let mut fixed = Fpdu::new_unchecked(b);
        fixed.fill_crc();
        let b = fixed.into_inner();
        let mut u = [0u8; 64];
        let info = decode_fpdu(&b, 0, false, &mut u).unwrap().unwrap();
        assert!(info.crc_ok());
        assert_eq!(&u[..20], &CRC_WRITE_BW_FPDU_PAD2[2..22]);
    }

    #[test]
    fn marker_repr_roundtrip() {
        let m = MarkerRepr {
            reserved: 0xffff,
            fpduptr: 0x0017,
        };
        let mut b = [0u8; 4];
        assert_eq!(m.emit(&mut b).unwrap(), 4);
        assert_eq!(b, [0xff, 0xff, 0x00, 0x17]);
        assert_eq!(MarkerRepr::parse(&b).unwrap(), m);
        assert_eq!(m.effective_fpduptr(), 0x14);
        assert_eq!(m.buffer_len(), 4);
        assert!(MarkerRepr::parse(&b[..3]).is_err());
        assert!(m.emit(&mut b[..3]).is_err());
    }

    // -----------------------------------------------------------------------
    // Stream codec with Markers (RFC 5044 §4.2-4.4)
    // -----------------------------------------------------------------------

    /// MPA-11, MPA-22, MPA-32, MPA-33, MPA-76: seed Figure 5 byte-exact; the
    /// first octets of Full Operation are the Marker 00000000.
    #[test]
    fn mpa_11_22_76_seed_fig5_encode_decode() {
        let u = seed_ulpdu(1);
        let wire = encode_vec(&[&u[..18], &u[18..]], 0, true, true);
        assert_eq!(wire, seed_fig5());
        assert_eq!(&wire[..4], &[0, 0, 0, 0]);
        assert_eq!(encoded_len(42, 0, true), 0x34);
        assert_eq!(reference_encode(&u, 0, true, true), wire);
        let mut out = [0u8; 64];
        let info = decode_fpdu(&wire, 0, true, &mut out).unwrap().unwrap();
        assert_eq!(
            info,
            FpduInfo {
                consumed: 52,
                ulpdu_len: 42,
                pad_len: 0,
                markers: 1,
                crc_field: 0x8399_2352,
                crc_computed: 0x8399_2352
            }
        );
        assert!(info.crc_ok());
        assert_eq!(&out[..42], &u[..]);
        // MPA-76 without Markers: the ULPDU_Length comes first.
        let plain = encode_vec(&[&u], 0, false, true);
        assert_eq!(&plain[..2], &[0x00, 0x2a]);
        assert_eq!(plain.len(), 48);
    }

    /// MPA-12, MPA-19, MPA-26, MPA-33: seed Figure 6 at stream offset 0x1ec,
    /// after a 492-octet first FPDU; DDP gets exactly 42 octets.
    #[test]
    fn mpa_12_19_26_seed_fig6_second_fpdu() {
        let first = pattern(482, 9);
        let (stream, spans) = encode_stream(&[first.clone(), seed_ulpdu(2)], 0, true, true);
        assert_eq!(spans, vec![(0, 492), (0x1ec, 52)]);
        assert_eq!(&stream[0x1ec..], &seed_fig6()[..]);
        let mut out = [0u8; 64];
        let info = decode_fpdu(&stream[0x1ec..], 0x1ec, true, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(info.ulpdu_len, 0x2a);
        assert_eq!(info.markers, 1);
        assert_eq!(info.consumed, 52);
        assert!(info.crc_ok());
        assert_eq!(info.crc_field, 0x9858_9284);
        assert_eq!(&out[..42], &seed_ulpdu(2)[..]);
        let recs = decode_stream(&stream, 0, true);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].0, first);
    }

    /// MPA-19: seed Figure 4 (ULPDU 16, Marker after 10 ULPDU octets with
    /// FPDUPTR 0x000C, PAD 2): 28 octets.
    #[test]
    fn mpa_19_seed_fig4_layout() {
        let u = pattern(16, 1);
        let pos = 500; // 500 + 12 = 512
        let w = encode_vec(&[&u], pos, true, false);
        assert_eq!(w.len(), 28);
        assert_eq!(&w[..2], &[0x00, 0x10]);
        assert_eq!(&w[2..12], &u[..10]);
        assert_eq!(&w[12..16], &[0, 0, 0, 0x0c]);
        assert_eq!(&w[16..22], &u[10..]);
        assert_eq!(&w[22..24], &[0, 0]);
        assert_eq!(&w[24..], &[0, 0, 0, 0]);
        let mut out = [0u8; 16];
        let info = decode_fpdu(&w, pos, true, &mut out).unwrap().unwrap();
        assert_eq!(
            (info.ulpdu_len, info.pad_len, info.markers, info.consumed),
            (16, 2, 1, 28)
        );
        assert_eq!(out.to_vec(), u);
    }

    /// MPA-18, MPA-22: SeqStart = 11 puts Markers at sequence numbers 11, 523,
    /// 1035, ... (seed example); nothing else looks like a Marker slot.
    #[test]
    fn mpa_18_seq_start_11_marker_positions() {
        let seq_start: u32 = 11;
        let ulpdus: Vec<Vec<u8>> = (0..12).map(|i| pattern(97 + 13 * i, i as u8)).collect();
        let (stream, spans) = encode_stream(&ulpdus, 0, true, true);
        assert!(stream.len() > 1100);
        let header_seqs: Vec<u32> = spans
            .iter()
            .map(|&(off, _)| {
                let lead = if off % 512 == 0 { 4 } else { 0 };
                seq_start + (off + lead) as u32
            })
            .collect();
        for seq in [11u32, 523, 1035] {
            let off = (seq - seq_start) as usize;
            let ptr = u16::from_be_bytes([stream[off + 2], stream[off + 3]]);
            assert_eq!(&stream[off..off + 2], &[0, 0]);
            if ptr == 0 {
                assert!(
                    header_seqs.contains(&(seq + 4)),
                    "Marker at {seq} sits between FPDUs"
                );
            } else {
                assert!(
                    header_seqs.contains(&(seq - u32::from(ptr))),
                    "Marker at {seq}"
                );
            }
        }
        let recs = decode_stream(&stream, 0, true);
        assert_eq!(recs.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), ulpdus);
        let total_markers: usize = recs.iter().map(|r| usize::from(r.1.markers)).sum();
        assert_eq!(total_markers, stream.len().div_ceil(512));
    }

    /// Check every Marker of an encoded stream starting at `start`: RESERVED 0,
    /// FPDUPTR (seq arithmetic mod 2^32) resolving to the containing FPDU's
    /// ULPDU_Length, or 0 right before the next ULPDU_Length.
    fn check_stream_markers(stream: &[u8], spans: &[(usize, usize)], start: u32, seq_start: u32) {
        let mut n = 0;
        for &(off, len) in spans {
            let lead = if start.wrapping_add(off as u32).is_multiple_of(512) {
                4
            } else {
                0
            };
            let hdr_seq = seq_start
                .wrapping_add(start)
                .wrapping_add((off + lead) as u32);
            for at in off..off + len {
                let pos = start.wrapping_add(at as u32);
                if !pos.is_multiple_of(512) {
                    continue;
                }
                n += 1;
                assert!(at + 4 <= off + len - 4, "Marker never inside the CRC");
                assert_eq!(&stream[at..at + 2], &[0, 0]);
                let ptr = u16::from_be_bytes([stream[at + 2], stream[at + 3]]);
                assert_eq!(ptr & 3, 0, "MPA-16");
                let seq = seq_start.wrapping_add(pos);
                if at == off {
                    assert_eq!(ptr, 0, "MPA-21");
                } else {
                    assert_eq!(seq.wrapping_sub(u32::from(ptr)), hdr_seq, "MPA-20/23");
                }
            }
        }
        let first = start.wrapping_add(0);
        let expect = (0..stream.len())
            .filter(|&i| first.wrapping_add(i as u32).is_multiple_of(512))
            .count();
        assert_eq!(n, expect);
    }

    /// MPA-20: SeqStart 0xFFFFFF00 — sequence numbers wrap inside a
    /// 2000-octet FPDU; back-pointers still resolve modulo 2^32. Also a stream
    /// offset that itself wraps (stream_pos near 2^32).
    #[test]
    fn mpa_20_sequence_wrap() {
        let seq_start = 0xFFFF_FF00u32;
        let ulpdus = vec![pattern(2000, 1), pattern(700, 2), pattern(2000, 3)];
        let (stream, spans) = encode_stream(&ulpdus, 0, true, true);
        check_stream_markers(&stream, &spans, 0, seq_start);
        // Absolute sequence numbers of the Markers: 0xFFFFFF00, 0x100, 0x300, ...
        assert_eq!(seq_start.wrapping_add(512), 0x100);
        let ptr = u16::from_be_bytes([stream[514], stream[515]]);
        assert_eq!(
            0x100u32.wrapping_sub(u32::from(ptr)),
            seq_start.wrapping_add(4)
        );

        for start in [0xFFFF_FF00u32, 0xFFFF_FFFC, 0xFFFF_FE04, 0xFFFF_F800] {
            let (stream, spans) = encode_stream(&ulpdus, start, true, true);
            check_stream_markers(&stream, &spans, start, 0);
            let recs = decode_stream(&stream, start, true);
            assert_eq!(recs.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), ulpdus);
            assert!(recs.iter().all(|r| r.1.crc_ok()));
            for (i, u) in ulpdus.iter().enumerate() {
                let pos = start.wrapping_add(spans[i].0 as u32);
                assert_eq!(
                    reference_encode(u, pos, true, true),
                    stream[spans[i].0..][..spans[i].1]
                );
            }
        }
    }

    /// MPA-23: a 2000-octet ULPDU holds 3-5 Markers, all pointing back to the
    /// same ULPDU_Length, from every 4-aligned start within a 512 interval.
    #[test]
    fn mpa_23_large_fpdu_markers_point_to_same_header() {
        let u = pattern(2000, 7);
        for pos in (0u32..512).step_by(4) {
            let w = encode_vec(&[&u[..100], &u[100..1500], &u[1500..]], pos, true, true);
            assert_eq!(w, reference_encode(&u, pos, true, true));
            let hdr = if pos % 512 == 0 { 4 } else { 0 };
            let mut seen = 0;
            for at in 0..w.len() {
                if !(pos as usize + at).is_multiple_of(512) {
                    continue;
                }
                seen += 1;
                let ptr = usize::from(u16::from_be_bytes([w[at + 2], w[at + 3]]));
                if at == 0 {
                    assert_eq!(ptr, 0);
                } else {
                    assert_eq!(at - ptr, hdr, "pos {pos} marker at {at}");
                }
            }
            assert!((3..=5).contains(&seen), "{seen}");
            let mut out = vec![0u8; 2000];
            let info = decode_fpdu(&w, pos, true, &mut out).unwrap().unwrap();
            assert_eq!(usize::from(info.markers), seen);
            assert_eq!(info.consumed, w.len());
            assert_eq!(out, u);
            assert!(info.crc_ok());
        }
    }

    /// MPA-24: many 16-octet ULPDUs (24-octet FPDUs) share each 512-octet
    /// interval; each Marker points at its own FPDU or is 0 between FPDUs.
    #[test]
    fn mpa_24_many_small_fpdus() {
        let ulpdus: Vec<Vec<u8>> = (0..300).map(|i| pattern(16, i as u8)).collect();
        for start in [0u32, 4, 8, 12, 20, 0xFFFF_FFF0] {
            let (stream, spans) = encode_stream(&ulpdus, start, true, true);
            check_stream_markers(&stream, &spans, start, 0);
            let between = spans
                .iter()
                .filter(|&&(off, _)| start.wrapping_add(off as u32) % 512 == 0)
                .count();
            let inside = stream.len().div_ceil(512) - between;
            assert!(inside > 0);
            let recs = decode_stream(&stream, start, true);
            assert_eq!(recs.len(), 300);
            assert!(
                recs.iter()
                    .zip(&ulpdus)
                    .all(|(r, u)| &r.0 == u && r.1.crc_ok())
            );
        }
    }

    /// MPA-21, MPA-33: a Marker exactly between two FPDUs carries FPDUPTR 0,
    /// belongs to (and is covered by the CRC of) the following FPDU.
    #[test]
    fn mpa_21_marker_between_fpdus() {
        // 4 (Marker) + 2 + 502 + 0 PAD + 4 CRC = 512: the next Marker falls
        // right after the CRC.
        assert_eq!(encoded_len(502, 0, true), 512);
        let ulpdus = vec![pattern(502, 1), pattern(30, 2)];
        let (stream, spans) = encode_stream(&ulpdus, 0, true, true);
        assert_eq!(spans, vec![(0, 512), (512, 4 + 2 + 30 + 4)]);
        assert_eq!(&stream[512..516], &[0, 0, 0, 0]);
        assert_eq!(&stream[516..518], &[0, 30]);
        let crc2 = crc32c(&stream[512..stream.len() - 4]);
        assert_eq!(crc_to_wire(crc2), stream[stream.len() - 4..]);
        // The Marker's RESERVED is CRC input of the *second* FPDU only.
        let mut bad = stream.clone();
        bad[512] = 0xff;
        let recs_ok = decode_stream(&stream, 0, true);
        let mut out = vec![0u8; 600];
        let i1 = decode_fpdu(&bad, 0, true, &mut out).unwrap().unwrap();
        assert!(i1.crc_ok());
        assert_eq!(i1.markers, 1);
        let i2 = decode_fpdu(&bad[512..], 512, true, &mut out)
            .unwrap()
            .unwrap();
        assert!(!i2.crc_ok());
        assert_eq!(i2.markers, 1);
        assert!(recs_ok.iter().all(|r| r.1.crc_ok()));
        // A non-zero FPDUPTR in that slot is a mismatch (MPA-87).
        let mut bad = stream.clone();
        bad[515] = 4;
        let e = decode_fpdu(&bad[512..], 512, true, &mut out).unwrap_err();
        assert!(is_marker_mismatch(&e));
        // Seen as soon as the Marker and length are there.
        assert!(is_marker_mismatch(
            &decode_fpdu(&bad[512..518], 512, true, &mut out).unwrap_err()
        ));
    }

    /// MPA-33: a Marker directly after the PAD (just before the CRC) belongs
    /// to the FPDU, points back to its ULPDU_Length and is CRC-covered.
    #[test]
    fn mpa_33_marker_after_pad_before_crc() {
        // 4 + (2 + 506 + 0) = 512: body ends on the boundary.
        let u = pattern(506, 5);
        let w = encode_vec(&[&u], 0, true, true);
        assert_eq!(w.len(), 4 + 508 + 4 + 4);
        assert_eq!(&w[512..516], &[0, 0, 0x01, 0xfc]); // 512 - 4 = 508
        assert_eq!(crc_to_wire(crc32c(&w[..516])), w[516..]);
        assert_eq!(w, reference_encode(&u, 0, true, true));
        let mut out = vec![0u8; 506];
        let info = decode_fpdu(&w, 0, true, &mut out).unwrap().unwrap();
        assert_eq!(info.markers, 2);
        assert!(info.crc_ok());
        // Same with a PAD: 2 + 505 + 1 = 508.
        let u = pattern(505, 6);
        let w = encode_vec(&[&u], 0, true, true);
        assert_eq!(w.len(), 520);
        assert_eq!(w[511], 0, "PAD");
        assert_eq!(&w[512..516], &[0, 0, 0x01, 0xfc]);
        let info = decode_fpdu(&w, 0, true, &mut out).unwrap().unwrap();
        assert_eq!((info.pad_len, info.markers), (1, 2));
        assert_eq!(&out[..505], &u[..]);
        // Without a leading Marker: from stream_pos 4 the body fills [4, 512)
        // and the Marker at 512 follows it, FPDUPTR 508.
        let u = pattern(506, 7);
        let w = encode_vec(&[&u], 4, true, true);
        assert_eq!(w.len(), 508 + 4 + 4);
        assert_eq!(&w[508..512], &[0, 0, 0x01, 0xfc]);
        let info = decode_fpdu(&w, 4, true, &mut out).unwrap().unwrap();
        assert_eq!(info.markers, 1);
        assert!(info.crc_ok());
    }

    /// MPA-48, MPA-44, MPA-95: fed one octet at a time, each FPDU is
    /// delivered exactly when its last CRC octet arrives, never earlier.
    #[test]
    fn mpa_48_one_octet_increments() {
        let ulpdus: Vec<Vec<u8>> = [1usize, 16, 42, 490, 502, 506, 1000, 2000, 3, 0]
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, i as u8))
            .collect();
        for (start, markers) in [(0u32, true), (0xFFFF_FF00, true), (492, true), (7, false)] {
            let (stream, spans) = encode_stream(&ulpdus, start, markers, true);
            let mut out = vec![0u8; 4096];
            let mut off = 0;
            let mut got = Vec::new();
            for end in 0..=stream.len() {
                let pos = start.wrapping_add(off as u32);
                match decode_fpdu(&stream[off..end], pos, markers, &mut out).unwrap() {
                    None => {}
                    Some(info) => {
                        assert_eq!(end, off + info.consumed, "delivered at the last CRC octet");
                        assert!(info.crc_ok());
                        got.push((
                            off,
                            info.consumed,
                            out[..usize::from(info.ulpdu_len)].to_vec(),
                        ));
                        off += info.consumed;
                        // Nothing more is visible yet.
                        let pos = start.wrapping_add(off as u32);
                        assert_eq!(
                            decode_fpdu(&stream[off..end], pos, markers, &mut out).unwrap(),
                            None
                        );
                    }
                }
            }
            assert_eq!(off, stream.len());
            assert_eq!(got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(), spans);
            assert_eq!(got.into_iter().map(|g| g.2).collect::<Vec<_>>(), ulpdus);
        }
    }

    /// MPA-03, MPA-25: N ULPDUs make N FPDUs, decoded back as N records.
    #[test]
    fn mpa_03_one_ulpdu_per_fpdu() {
        let ulpdus: Vec<Vec<u8>> = (0..40).map(|i| pattern(i * 37 % 1500, i as u8)).collect();
        for markers in [false, true] {
            let (stream, spans) = encode_stream(&ulpdus, 0, markers, true);
            assert_eq!(spans.len(), 40);
            let recs = decode_stream(&stream, 0, markers);
            assert_eq!(recs.into_iter().map(|r| r.0).collect::<Vec<_>>(), ulpdus);
        }
    }

    /// MPA-34, MPA-86: flipping any single bit of a Marker-carrying FPDU is
    /// caught: CRC mismatch, Marker mismatch (error 3), or a different length
    /// (incomplete / refused) — never a clean delivery.
    #[test]
    fn mpa_34_single_bit_flips_detected() {
        let u = pattern(1000, 11);
        let pos = 492;
        let w = encode_vec(&[&u[..18], &u[18..]], pos, true, true);
        let mut out = vec![0u8; MAX_ULPDU];
        let (mut crc_bad, mut marker_bad, mut other) = (0, 0, 0);
        for i in 0..w.len() {
            for bit in 0..8 {
                let mut b = w.clone();
                b[i] ^= 1 << bit;
                match decode_fpdu(&b, pos, true, &mut out) {
                    Ok(Some(info)) => {
                        assert!(!info.crc_ok(), "flip at {i}.{bit} delivered cleanly");
                        crc_bad += 1;
                    }
                    Err(e) if is_marker_mismatch(&e) => marker_bad += 1,
                    _ => other += 1,
                }
            }
        }
        assert!(crc_bad > 0 && marker_bad > 0 && other > 0);
    }

    /// MPA-34: targeted flips in ULPDU, PAD, Marker RESERVED, Marker FPDUPTR
    /// low bits (all CRC errors) and the CRC field itself.
    #[test]
    fn mpa_34_flip_in_ulpdu_pad_marker_crc() {
        let u = pattern(41, 3); // 2 + 41 + 1 PAD
        let pos = 500; // Marker after 8 ULPDU octets (offset 12)
        let w = encode_vec(&[&u], pos, true, true);
        assert_eq!(w.len(), 2 + 41 + 1 + 4 + 4);
        let mut out = [0u8; 64];
        let pad_at = w.len() - 5;
        assert_eq!(w[pad_at], 0);
        for (what, at, mask) in [
            ("ULPDU", 5usize, 0x10u8),
            ("PAD", pad_at, 0x01),
            ("Marker RESERVED", 12, 0x80),
            ("Marker FPDUPTR low bits (MPA-16)", 15, 0x03),
            ("CRC", w.len() - 1, 0x40),
        ] {
            let mut b = w.clone();
            b[at] ^= mask;
            let info = decode_fpdu(&b, pos, true, &mut out).unwrap().unwrap();
            assert!(!info.crc_ok(), "{what}");
            assert_eq!(info.consumed, w.len(), "{what}");
        }
        // FPDUPTR high bits: the Marker disagrees with the start (error 3).
        let mut b = w.clone();
        b[15] ^= 0x04;
        assert!(is_marker_mismatch(
            &decode_fpdu(&b, pos, true, &mut out).unwrap_err()
        ));
    }

    /// Recompute the CRC after forging octets of `w` (whole-FPDU coverage).
    fn refresh_crc(w: &mut [u8]) {
        let n = w.len() - 4;
        let c = crc32c(&w[..n]);
        w[n..].copy_from_slice(&crc_to_wire(c));
    }

    /// MPA-15, MPA-16, MPA-87: RESERVED = 0xFFFF and FPDUPTR low bits = 3 are
    /// accepted when the CRC covers them; a wrong FPDUPTR with a valid CRC is
    /// error 3.
    #[test]
    fn mpa_15_16_87_forged_markers() {
        let u = pattern(2000, 4);
        let pos = 100;
        let w = encode_vec(&[&u], pos, true, true);
        let marks: Vec<usize> = (0..w.len())
            .filter(|a| (pos as usize + a).is_multiple_of(512))
            .collect();
        assert_eq!(marks.len(), 4);
        let mut out = vec![0u8; 2000];

        let mut b = w.clone();
        for &m in &marks {
            b[m] = 0xff;
            b[m + 1] = 0xff;
            b[m + 3] |= 3;
        }
        refresh_crc(&mut b);
        let info = decode_fpdu(&b, pos, true, &mut out).unwrap().unwrap();
        assert!(info.crc_ok());
        assert_eq!(info.markers, 4);
        assert_eq!(out, u);

        for &m in &marks {
            let mut b = w.clone();
            let ptr = u16::from_be_bytes([b[m + 2], b[m + 3]]).wrapping_add(4);
            b[m + 2..m + 4].copy_from_slice(&ptr.to_be_bytes());
            refresh_crc(&mut b);
            let e = decode_fpdu(&b, pos, true, &mut out).unwrap_err();
            assert!(is_marker_mismatch(&e), "{e}");
        }
    }

    /// MPA-14, MPA-58: with CRCs off the field is zero on send and decode
    /// still delivers whatever the field holds (the caller does not check).
    #[test]
    fn mpa_14_58_crc_off() {
        let u = pattern(100, 1);
        for markers in [false, true] {
            let w = encode_vec(&[&u], 0, markers, false);
            assert_eq!(&w[w.len() - 4..], &[0, 0, 0, 0]);
            let mut b = w.clone();
            let n = b.len();
            b[n - 4..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            let mut out = [0u8; 100];
            let info = decode_fpdu(&b, 0, markers, &mut out).unwrap().unwrap();
            assert_eq!(info.crc_field, 0xefbe_adde);
            assert_eq!(info.crc_computed, crc32c(&w[..n - 4]));
            assert_eq!(out.to_vec(), u);
            // MPA-31: a receiver with CRCs off need not compute it at all.
            let mut out2 = [0u8; 100];
            let lazy = decode_fpdu_with(&b, 0, markers, &mut out2, false)
                .unwrap()
                .unwrap();
            assert_eq!(
                (lazy.crc_computed, lazy.consumed),
                (0xefbe_adde, info.consumed)
            );
            assert!(lazy.crc_ok());
            assert_eq!(out2, out);
        }
    }

    /// Real FPDUs through decode_fpdu (Markers off), including the 1448-octet
    /// FPDU that arrived in two TCP segments (MPA-44/48).
    #[test]
    fn mpa_44_capture_fpdus_decode_and_split() {
        let mut out = vec![0u8; 2048];
        let seg1 = &CRC_WRITE_BW_FPDU_1442[..CRC_WRITE_BW_SEG40_LEN];
        assert_eq!(decode_fpdu(seg1, 0, false, &mut out).unwrap(), None);
        assert_eq!(peek_encoded_len(seg1, 0, false).unwrap(), Some(1448));
        let info = decode_fpdu(&CRC_WRITE_BW_FPDU_1442, 0, false, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(
            (info.consumed, info.ulpdu_len, info.pad_len, info.markers),
            (1448, 1442, 0, 0)
        );
        assert!(info.crc_ok());
        assert_eq!(crc_to_wire(info.crc_field), [0xaf, 0xc9, 0xad, 0xe8]);
        assert_eq!(
            encode_vec(&[&out[..1442]], 0, false, true),
            CRC_WRITE_BW_FPDU_1442
        );

        for (bytes, crc_on) in [
            (&SIW_RPING_FPDU_SEND[..], false),
            (&SIW_RPING_FPDU_READ_RESP, false),
            (&SIW_MPA1_FPDU, false),
            (&CRC_RPING_FPDU_SEND, true),
            (&CRC_RPING_FPDU_READ_REQ, true),
        ] {
            let info = decode_fpdu(bytes, 24, false, &mut out).unwrap().unwrap();
            assert_eq!(info.consumed, bytes.len());
            assert_eq!(info.crc_ok(), crc_on);
            let ul = usize::from(info.ulpdu_len);
            assert_eq!(encode_vec(&[&out[..ul]], 24, false, crc_on), bytes);
        }
        // MPA-13: siw's non-zero PAD is accepted (CRC valid), stripped, and
        // our re-encode differs only in PAD and CRC.
        let info = decode_fpdu(&CRC_WRITE_BW_FPDU_PAD2, 24, false, &mut out)
            .unwrap()
            .unwrap();
        assert!(info.crc_ok());
        assert_eq!((info.ulpdu_len, info.pad_len), (20, 2));
        assert_eq!(&out[..20], &CRC_WRITE_BW_FPDU_PAD2[2..22]);
        let ours = encode_vec(&[&out[..20]], 24, false, true);
        assert_eq!(&ours[..22], &CRC_WRITE_BW_FPDU_PAD2[..22]);
        assert_eq!(&ours[22..24], &[0, 0]);
        // Two captured FPDUs back to back (siw-crc-rping, frames 11 then 13 of
        // the Initiator direction) decode as a stream.
        let mut s = CRC_RPING_FPDU_SEND.to_vec();
        s.extend_from_slice(&CRC_RPING_FPDU_READ_RESP);
        let recs = decode_stream(&s, 0, false);
        assert_eq!(recs.len(), 2);
        assert!(recs.iter().all(|r| r.1.crc_ok()));
    }

    /// MPA-07: the codec refuses ULPDUs above 64768 both ways; a receive
    /// buffer that is too small is refused as soon as the length is visible.
    #[test]
    fn mpa_07_ulpdu_bounds() {
        let big = vec![0u8; MAX_ULPDU + 1];
        let mut out = vec![0u8; 70000];
        assert!(matches!(
            encode_fpdu(&[&big], 0, false, true, &mut out),
            Err(Error::TooLarge {
                value: 64769,
                limit: 64768,
                ..
            })
        ));
        assert!(matches!(
            encode_fpdu(&[&big[..40000], &big[40000..]], 0, true, true, &mut out),
            Err(Error::TooLarge { .. })
        ));
        // 64768 works everywhere, Markers and all (FPDUPTR fits 16 bits).
        let max = pattern(MAX_ULPDU, 1);
        for pos in [0u32, 4, 252, 508, 0xFFFF_FFFC] {
            let w = encode_vec(&[&max], pos, true, true);
            assert_eq!(w, reference_encode(&max, pos, true, true));
            let info = decode_fpdu(&w, pos, true, &mut out).unwrap().unwrap();
            assert!(info.crc_ok());
            assert!(info.markers >= 127);
            assert_eq!(&out[..MAX_ULPDU], &max[..]);
        }
        let len = (MAX_ULPDU as u16 + 1).to_be_bytes();
        assert!(matches!(
            decode_fpdu(&len, 4, false, &mut out),
            Err(Error::TooLarge { .. })
        ));
        assert!(matches!(
            decode_fpdu(&[0xff, 0xff], 4, true, &mut out),
            Err(Error::TooLarge { .. })
        ));
        assert!(matches!(
            peek_encoded_len(&[0xff, 0xff], 4, false),
            Err(Error::TooLarge { .. })
        ));
        // Receive buffer smaller than ULPDU_Length.
        let mut small = [0u8; 33];
        assert!(matches!(
            decode_fpdu(&SIW_RPING_FPDU_SEND[..2], 0, false, &mut small),
            Err(Error::TooLarge {
                value: 34,
                limit: 33,
                ..
            })
        ));
    }

    /// Misaligned FPDU starts with Markers on, short output buffers.
    #[test]
    fn stream_codec_error_paths() {
        let u = [1u8; 10];
        let mut out = [0u8; 64];
        for pos in [1u32, 2, 3, 513, 0xFFFF_FFFF] {
            let e = encode_fpdu(&[&u], pos, true, true, &mut out).unwrap_err();
            assert!(matches!(e, Error::Malformed { reason, .. } if reason == REASON_UNALIGNED));
            let e = decode_fpdu(&[0; 32], pos, true, &mut out).unwrap_err();
            assert!(matches!(e, Error::Malformed { reason, .. } if reason == REASON_UNALIGNED));
            // Without Markers the position does not matter.
            assert!(encode_fpdu(&[&u], pos, false, true, &mut out).is_ok());
        }
        let need = encoded_len(10, 508, true);
        assert_eq!(need, 2 + 10 + 4 + 4); // PAD 0
        for n in 0..need {
            assert!(matches!(
                encode_fpdu(&[&u], 508, true, true, &mut out[..n]),
                Err(Error::Truncated { .. })
            ));
        }
        // Empty gather list = empty ULPDU: 2 + 0 + 2 + 4.
        assert_eq!(encode_fpdu(&[], 8, true, true, &mut out).unwrap(), 8);
        let info = decode_fpdu(&out[..8], 8, true, &mut [0u8; 0])
            .unwrap()
            .unwrap();
        assert_eq!((info.ulpdu_len, info.pad_len, info.consumed), (0, 2, 8));
        assert!(info.crc_ok());
        // Never panics on absurd sizes.
        assert_eq!(encoded_len(usize::MAX, 0, true), usize::MAX);
        assert_eq!(encoded_len(usize::MAX, 3, false), usize::MAX);
        // Partial input: None, never an error, until the length is visible.
        assert_eq!(decode_fpdu(&[], 0, true, &mut out).unwrap(), None);
        assert_eq!(
            decode_fpdu(&[0, 0, 0, 0, 0], 0, true, &mut out).unwrap(),
            None
        );
        assert_eq!(peek_encoded_len(&[0, 0, 0, 0], 0, true).unwrap(), None);
        assert_eq!(
            peek_encoded_len(&[0, 0, 0, 0, 0, 42], 0, true).unwrap(),
            Some(52)
        );
    }

    /// `encoded_len` (closed form) agrees with the Layout walk and the
    /// octet-wise reference for every 4-aligned start in an interval.
    #[test]
    fn encoded_len_matches_layout_walk() {
        for len in (0..1600).step_by(7).chain([506, 502, 1018, 1014, 64768]) {
            for pos in (0u32..1024).step_by(4) {
                let mut l = Layout::new(len, pos, true);
                for _ in &mut l {}
                assert_eq!(encoded_len(len, pos, true), l.at + CRC_LEN, "{len} @ {pos}");
                assert_eq!(l.count, (encoded_len(len, pos, true) - fpdu_len(len)) / 4);
            }
            assert_eq!(encoded_len(len, 1, false), fpdu_len(len));
        }
    }

    // -----------------------------------------------------------------------
    // MULPDU (RFC 5044 §4.5)
    // -----------------------------------------------------------------------

    /// MPA-35, MPA-36, MPA-40: mpa.md §5 table plus the matrix vectors.
    #[test]
    fn mpa_35_36_40_mulpdu_table() {
        for (emss, on, off) in [
            (1460u32, 1442u16, 1454u16),
            (1448, 1430, 1442),
            (8960, 8882, 8954),
            (536, 522, 530),
            (100, 128, 128),
        ] {
            assert_eq!(mulpdu(emss, true), on, "{emss} markers");
            assert_eq!(mulpdu(emss, false), off, "{emss}");
        }
        assert_eq!(mulpdu(1461, false), 1454);
        assert_eq!(mulpdu(0, true), 128);
        assert_eq!(mulpdu(u32::MAX, true), 64768);
        assert_eq!(mulpdu(u32::MAX, false), 64768);
    }

    /// MPA-06, MPA-35, MPA-36, MPA-40: sweep EMSS 1..=65535: always within
    /// [128, 64768]; unclamped values give FPDUs (with the worst Marker
    /// placement) that fit one EMSS segment.
    #[test]
    fn mpa_06_mulpdu_sweep() {
        for emss in 1u32..=65535 {
            for markers in [false, true] {
                let m = mulpdu(emss, markers);
                assert!((MULPDU_MIN..=MAX_ULPDU as u16).contains(&m), "{emss}");
                if m == MULPDU_MIN || usize::from(m) == MAX_ULPDU {
                    continue;
                }
                if markers {
                    for pos in [0u32, 4, 256, 508] {
                        assert!(
                            encoded_len(usize::from(m), pos, true) <= emss as usize,
                            "{emss} @ {pos}"
                        );
                    }
                } else {
                    assert!(fpdu_len(usize::from(m)) <= emss as usize);
                    assert!(
                        fpdu_len(usize::from(m) + 1) > emss as usize,
                        "largest that fits"
                    );
                }
            }
        }
    }

    // -----------------------------------------------------------------------
    // Property tests
    // -----------------------------------------------------------------------

    fn arb_frame() -> impl Strategy<Value = (FrameKind, bool, bool, bool, u8, u8, Vec<u8>)> {
        (
            prop_oneof![Just(FrameKind::Request), Just(FrameKind::Reply)],
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0u8..32,
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..=512),
        )
    }

    /// Start positions: 4-aligned (Markers on), near 0, a 512 boundary, or 2^32.
    fn arb_pos() -> impl Strategy<Value = u32> {
        prop_oneof![
            0u32..2048,
            any::<u32>(),
            (0u32..64).prop_map(|d| 0u32.wrapping_sub(d * 4)),
            (0u32..64).prop_map(|k| k * 512),
        ]
        .prop_map(|p| p & !3)
    }

    proptest! {
        /// CRC32c of any length (across the SIMD paths' thresholds), whole, continued
        /// from any cut, and gathered from pieces: the bit-wise model's value.
        #[test]
        fn prop_crc32c_whole_appended_gathered(len in prop_oneof![0usize..300, 300usize..70_000],
                                               seed in any::<u8>(), cuts in proptest::collection::vec(any::<usize>(), 1..5)) {
            let d = pattern(len, seed);
            let want = crc32c_bitwise(&d);
            prop_assert_eq!(crc32c(&d), want);
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
            at.push(0);
            at.push(len);
            at.sort_unstable();
            let parts: Vec<&[u8]> = at.windows(2).map(|w| &d[w[0]..w[1]]).collect();
            prop_assert_eq!(crc32c_gather(&parts), want);
            let appended = parts.iter().fold(0, |crc, p| crc32c_append(crc, p));
            prop_assert_eq!(appended, want);
        }
    }

    proptest! {
        /// MPA-52/54/62: emit -> parse -> emit for arbitrary frames.
        #[test]
        fn prop_frame_roundtrip((kind, m, c, r, res, rev, pd) in arb_frame()) {
            let f = FrameRepr { kind, m, c, r, res, rev, private_data: &pd };
            let mut buf = vec![0u8; f.buffer_len()];
            prop_assert_eq!(f.emit(&mut buf).unwrap(), buf.len());
            prop_assert_eq!(FrameRepr::frame_len(&buf).unwrap(), Some(buf.len()));
            let p = FrameRepr::parse(&buf).unwrap();
            prop_assert_eq!(p, f);
            let mut again = vec![0u8; p.buffer_len()];
            p.emit(&mut again).unwrap();
            prop_assert_eq!(again, buf);
        }

        /// MPA-79: arbitrary bytes never panic any frame parser.
        #[test]
        fn prop_frame_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..600), keyed in any::<bool>(), req in any::<bool>()) {
            let mut data = data;
            if keyed && data.len() >= 16 {
                data[..16].copy_from_slice(if req { &REQUEST_KEY } else { &REPLY_KEY });
            }
            let _ = FrameRepr::frame_len(&data);
            if let Ok(r) = FrameRepr::parse(&data) {
                prop_assert_eq!(FrameRepr::frame_len(&data).unwrap(), Some(r.buffer_len()));
                let mut out = vec![0u8; r.buffer_len()];
                r.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..], &data[..r.buffer_len()]);
                let _ = r.rev2_params();
            }
            if let Ok(f) = Frame::new_checked(&data[..]) {
                let _ = (f.kind(), f.m(), f.c(), f.r(), f.res(), f.rev(), f.private_data(), f.total_len());
            }
            let _ = Rev2Params::parse(&data);
        }

        /// EXT-6581-01 round trip.
        #[test]
        fn prop_rev2_roundtrip(p2p: bool, z: bool, w: bool, r: bool, ird in 0u16..0x4000, ord in 0u16..0x4000) {
            let p = Rev2Params { p2p, zero_len_rtr: z, write_rtr: w, read_rtr: r, ird, ord };
            let mut b = [0u8; 4];
            p.emit(&mut b).unwrap();
            prop_assert_eq!(Rev2Params::parse(&b).unwrap(), p);
        }

        /// FpduRepr emit -> parse -> emit; the Fpdu view never panics.
        #[test]
        fn prop_fpdu_repr_roundtrip(ulpdu in proptest::collection::vec(any::<u8>(), 0..600), pad: [u8; 3], crc: u32) {
            let mut r = FpduRepr { ulpdu: &ulpdu, pad, crc };
            r.pad[pad_len(ulpdu.len())..].fill(0);
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut buf).unwrap();
            let p = FpduRepr::parse(&buf).unwrap();
            prop_assert_eq!(p, r);
            let mut again = vec![0u8; p.buffer_len()];
            p.emit(&mut again).unwrap();
            prop_assert_eq!(again, buf);
        }

        #[test]
        fn prop_fpdu_view_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(f) = Fpdu::new_checked(&data[..]) {
                let _ = (f.ulpdu(), f.pad(), f.crc(), f.verify_crc(), f.total_len());
            }
            let _ = FpduRepr::parse(&data);
            let _ = MarkerRepr::parse(&data);
        }

        /// MPA-11/18/19/21/23/24/33: encode -> decode round trip against the
        /// octet-wise reference, for random sizes, gather splits and starts.
        #[test]
        fn prop_encode_decode_roundtrip(
            ulpdu in proptest::collection::vec(any::<u8>(), 0..3000),
            cut1 in any::<prop::sample::Index>(),
            cut2 in any::<prop::sample::Index>(),
            pos in arb_pos(),
            markers: bool,
            crc: bool,
        ) {
            let (a, b) = {
                let x = cut1.index(ulpdu.len() + 1);
                let y = cut2.index(ulpdu.len() + 1);
                (x.min(y), x.max(y))
            };
            let parts: [&[u8]; 3] = [&ulpdu[..a], &ulpdu[a..b], &ulpdu[b..]];
            let w = encode_vec(&parts, pos, markers, crc);
            prop_assert_eq!(&w, &reference_encode(&ulpdu, pos, markers, crc));
            prop_assert_eq!(w.len(), encoded_len(ulpdu.len(), pos, markers));
            prop_assert_eq!(peek_encoded_len(&w, pos, markers).unwrap(), Some(w.len()));
            let mut out = vec![0u8; ulpdu.len()];
            let info = decode_fpdu(&w, pos, markers, &mut out).unwrap().unwrap();
            prop_assert_eq!(info.consumed, w.len());
            prop_assert_eq!(usize::from(info.ulpdu_len), ulpdu.len());
            prop_assert_eq!(usize::from(info.pad_len), pad_len(ulpdu.len()));
            prop_assert_eq!(usize::from(info.markers) * 4 + fpdu_len(ulpdu.len()), w.len());
            prop_assert_eq!(info.crc_ok(), crc);
            prop_assert_eq!(&out, &ulpdu);
            // Any strict prefix is "need more" (MPA-48).
            let cut = cut1.index(w.len());
            prop_assert_eq!(decode_fpdu(&w[..cut], pos, markers, &mut out).unwrap(), None);
        }

        /// MPA-25/44: a stream cut into random chunks decodes to the same records.
        #[test]
        fn prop_stream_random_chunks(
            sizes in proptest::collection::vec(0usize..1200, 1..12),
            chunks in proptest::collection::vec(1usize..700, 1..64),
            pos in arb_pos(),
            markers: bool,
        ) {
            let ulpdus: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, i as u8)).collect();
            let (stream, _) = encode_stream(&ulpdus, pos, markers, true);
            let mut out = vec![0u8; 1200];
            let (mut off, mut end, mut k, mut got) = (0usize, 0usize, 0usize, Vec::new());
            while off < stream.len() {
                end = (end + chunks[k % chunks.len()]).min(stream.len());
                k += 1;
                while let Some(info) = decode_fpdu(&stream[off..end], pos.wrapping_add(off as u32), markers, &mut out).unwrap() {
                    prop_assert!(info.crc_ok());
                    got.push(out[..usize::from(info.ulpdu_len)].to_vec());
                    off += info.consumed;
                }
            }
            prop_assert_eq!(got, ulpdus);
        }

        /// Arbitrary bytes never panic decode_fpdu, at any position, Markers
        /// on or off; what decodes re-encodes to the same length.
        #[test]
        fn prop_decode_never_panics(
            data in proptest::collection::vec(any::<u8>(), 0..2100),
            pos: u32,
            markers: bool,
            out_len in 0usize..2100,
            len_hint in 0u16..2000,
        ) {
            let mut data = data;
            // Steer half the cases to a plausible ULPDU_Length.
            if data.len() >= 6 && len_hint % 2 == 0 {
                let lead = if markers && pos % 512 == 0 { 4 } else { 0 };
                data[lead..lead + 2].copy_from_slice(&(len_hint / 2).to_be_bytes());
            }
            let mut out = vec![0u8; out_len];
            let _ = peek_encoded_len(&data, pos, markers);
            if let Ok(Some(info)) = decode_fpdu(&data, pos, markers, &mut out) {
                let u = &out[..usize::from(info.ulpdu_len)];
                let w = encode_vec(&[u], pos, markers, true);
                prop_assert_eq!(w.len(), info.consumed);
            }
        }
    }
}
