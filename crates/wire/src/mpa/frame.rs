//! The MPA Request and Reply frames that start a connection (RFC 5044 §7.1.1, Figure 8).

use super::rev2::Rev2Params;
use super::{mpa_err, too_large};
use crate::error::{Error, Layer, Result, need};
use crate::field::{be16, set_be16};

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
/// `Error::Malformed` reason for a key that is neither Request nor Reply (§7.1.1).
pub const REASON_BAD_KEY: &str = "MPA key is neither \"MPA ID Req Frame\" nor \"MPA ID Rep Frame\"";

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

#[cfg(test)]
mod tests;
