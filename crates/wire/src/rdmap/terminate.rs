//! The Terminate Header (RFC 5040 §4.8): its control word in RFC 5040's bit layout or
//! Linux siw's, then the optional Terminated DDP and RDMA headers.

use super::read_request::{READ_REQUEST_HEADER_LEN, ReadRequestRepr};
use super::terminate_code::TerminateCode;
use super::violation::Violation;
use crate::ddp;
use crate::error::{Error, Layer, Result, need};
use crate::field::{be16, set_be16};

/// RFC 5040 §4.8: Terminate Control plus Reserved.
pub const TERMINATE_CONTROL_LEN: usize = 4;
/// RFC 5040 §4.8: DDP Segment Length field.
pub const DDP_SEGMENT_LENGTH_LEN: usize = 2;
/// RFC 5040 §4.8: largest Terminate Header (all optional fields, untagged DDP header).
pub const MAX_TERMINATE_HEADER_LEN: usize = TERMINATE_CONTROL_LEN
    + DDP_SEGMENT_LENGTH_LEN
    + ddp::UNTAGGED_HEADER_LEN
    + READ_REQUEST_HEADER_LEN;

/// Field offsets inside the Terminate Header.
mod field {
    // RFC 5040 §4.8: Terminate Header.
    pub const TERM_SEG_LEN: usize = 4;
    pub const TERM_DDP_HDR: usize = 6;
}

/// Bit layout of the Terminate control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TerminateLayout {
    /// RFC 5040 §4.8: octet 0 = Layer<<4 | EType, octet 1 = Error Code,
    /// octet 2 = M (0x80), D (0x40), R (0x20), then 13 reserved bits.
    #[default]
    Rfc5040,
    /// Linux siw (`struct iwarp_terminate`, little-endian bitfields on x86):
    /// octet 0 = EType<<4 | Layer, octet 1 = Error Code, octet 2 bit 0 = M,
    /// bit 1 = D, bit 2 = R, reserved = octet 3 << 5 | octet 2 >> 3.
    LinuxSiw,
}

impl core::fmt::Display for TerminateLayout {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            TerminateLayout::Rfc5040 => "RFC 5040",
            TerminateLayout::LinuxSiw => "Linux siw",
        })
    }
}

/// The Terminate control word, decoded in some layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TermControl {
    layer: u8,
    etype: u8,
    code: u8,
    m: bool,
    d: bool,
    r: bool,
    reserved: u16,
}

impl TermControl {
    fn decode(w: [u8; 4], layout: TerminateLayout) -> Self {
        match layout {
            TerminateLayout::Rfc5040 => TermControl {
                layer: w[0] >> 4,
                etype: w[0] & 0x0F,
                code: w[1],
                m: w[2] & 0x80 != 0,
                d: w[2] & 0x40 != 0,
                r: w[2] & 0x20 != 0,
                reserved: (u16::from(w[2] & 0x1F) << 8) | u16::from(w[3]),
            },
            TerminateLayout::LinuxSiw => TermControl {
                layer: w[0] & 0x0F,
                etype: w[0] >> 4,
                code: w[1],
                m: w[2] & 0x01 != 0,
                d: w[2] & 0x02 != 0,
                r: w[2] & 0x04 != 0,
                reserved: (u16::from(w[3]) << 5) | u16::from(w[2] >> 3),
            },
        }
    }

    /// Bits above each field's width are dropped; callers range-check first.
    fn encode(&self, layout: TerminateLayout) -> [u8; 4] {
        let (layer, etype, rsvd) = (self.layer & 0x0F, self.etype & 0x0F, self.reserved & 0x1FFF);
        match layout {
            TerminateLayout::Rfc5040 => [
                (layer << 4) | etype,
                self.code,
                (u8::from(self.m) << 7)
                    | (u8::from(self.d) << 6)
                    | (u8::from(self.r) << 5)
                    | (rsvd >> 8) as u8,
                rsvd as u8,
            ],
            TerminateLayout::LinuxSiw => [
                (etype << 4) | layer,
                self.code,
                u8::from(self.m)
                    | (u8::from(self.d) << 1)
                    | (u8::from(self.r) << 2)
                    | ((rsvd as u8) << 3),
                (rsvd >> 5) as u8,
            ],
        }
    }

    fn read(buf: &[u8], layout: TerminateLayout) -> Self {
        let mut w = [0u8; 4];
        for (d, s) in w.iter_mut().zip(buf) {
            *d = *s;
        }
        Self::decode(w, layout)
    }

    /// Octets the optional fields need (the DDP header's own T bit picks 14/18).
    fn header_len(&self, buf: &[u8]) -> Option<usize> {
        let mut len = TERMINATE_CONTROL_LEN;
        if self.d {
            let control = *buf.get(field::TERM_DDP_HDR)?;
            len += DDP_SEGMENT_LENGTH_LEN + ddp::header_len_for(control);
        }
        if self.r {
            len += READ_REQUEST_HEADER_LEN;
        }
        Some(len)
    }
}

impl TerminateLayout {
    /// Picks the layout of a received Terminate Header (the octets after the
    /// DDP header of a Terminate). RFC 5040, unless the siw reading parses
    /// cleanly (known code, the optional headers its flags announce present,
    /// nothing but zeros after them) and either
    /// * the RFC reading has M, D and R clear but a non-zero reserved field
    ///   (what siw's flags look like in RFC bit order), or
    /// * the RFC reading names no defined Layer / EType / Error Code (siw's
    ///   swapped nibbles, e.g. an LLP error `02 01 00 00` reads as Layer 0,
    ///   EType 2, code 1 in RFC order). A truncated RFC Terminate is not
    ///   re-read the siw way.
    ///
    /// A word both readings explain stays ambiguous: then siw wins only when
    /// the RFC reading has reserved bits set, which an RFC 5040 sender never
    /// does (RDMAP-29). Engines that know their peer can skip the guess with
    /// [`TerminateRepr::parse_with_layout`] or
    /// [`Segment::parse_with_layout`](super::Segment::parse_with_layout).
    pub fn detect(buf: &[u8]) -> TerminateLayout {
        if buf.len() < TERMINATE_CONTROL_LEN {
            return TerminateLayout::Rfc5040;
        }
        let rfc = TermControl::read(buf, TerminateLayout::Rfc5040);
        let siw_flags = !rfc.m && !rfc.d && !rfc.r && rfc.reserved != 0;
        let rfc_undefined = matches!(
            TerminateRepr::parse_with_layout(buf, TerminateLayout::Rfc5040),
            Err(Error::Unknown { .. })
        );
        if (siw_flags || rfc_undefined)
            && TerminateRepr::parse_with_layout(buf, TerminateLayout::LinuxSiw).is_ok()
        {
            TerminateLayout::LinuxSiw
        } else {
            TerminateLayout::Rfc5040
        }
    }
}

/// RFC 5040 §4.8: a checked view of a Terminate Header, read in one [`TerminateLayout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminateHeader<T: AsRef<[u8]>> {
    buffer: T,
    layout: TerminateLayout,
}

impl<T: AsRef<[u8]>> TerminateHeader<T> {
    /// Wraps `buffer`, RFC 5040 layout, no check.
    pub const fn new_unchecked(buffer: T) -> Self {
        TerminateHeader {
            buffer,
            layout: TerminateLayout::Rfc5040,
        }
    }

    /// Wraps `buffer` in the given layout, no check.
    pub const fn new_unchecked_with_layout(buffer: T, layout: TerminateLayout) -> Self {
        TerminateHeader { buffer, layout }
    }

    /// Wraps `buffer` in the layout [`TerminateLayout::detect`] picks, after
    /// [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let layout = TerminateLayout::detect(buffer.as_ref());
        let v = Self::new_unchecked_with_layout(buffer, layout);
        v.check_len()?;
        Ok(v)
    }

    /// `Err(Truncated)` unless the control word and every optional field
    /// its flags announce are present.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(Layer::Rdmap, b, TERMINATE_CONTROL_LEN)?;
        let c = self.control();
        if c.d {
            need(Layer::Rdmap, b, field::TERM_DDP_HDR + 1)?;
        }
        need(Layer::Rdmap, b, c.header_len(b).unwrap_or(usize::MAX))
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The layout the control word is read in.
    pub const fn layout(&self) -> TerminateLayout {
        self.layout
    }

    fn control(&self) -> TermControl {
        TermControl::read(self.buffer.as_ref(), self.layout)
    }

    /// Layer (raw).
    pub fn layer(&self) -> u8 {
        self.control().layer
    }
    /// EType (raw).
    pub fn etype(&self) -> u8 {
        self.control().etype
    }
    /// Error Code (raw).
    pub fn error_code(&self) -> u8 {
        self.control().code
    }
    /// M: the DDP Segment Length is valid.
    pub fn m(&self) -> bool {
        self.control().m
    }
    /// D: DDP Segment Length and Terminated DDP Header present.
    pub fn d(&self) -> bool {
        self.control().d
    }
    /// R: Terminated RDMA Header present.
    pub fn r(&self) -> bool {
        self.control().r
    }
    /// The 13 reserved bits (RDMAP-29), as a number in this layout.
    pub fn reserved(&self) -> u16 {
        self.control().reserved
    }

    /// Length of the header its flags announce (`None` if D is set but the
    /// Terminated DDP Header's control octet is missing).
    pub fn header_len(&self) -> Option<usize> {
        self.control().header_len(self.buffer.as_ref())
    }

    /// DDP Segment Length, when D is set.
    pub fn ddp_segment_length(&self) -> Option<u16> {
        let b = self.buffer.as_ref();
        (self.d())
            .then(|| b.get(field::TERM_SEG_LEN..field::TERM_DDP_HDR))
            .flatten()
            .map(|s| be16(s, 0))
    }

    /// Terminated DDP Header octets (14 or 18 by their own T bit), when D is set.
    pub fn terminated_ddp_header(&self) -> Option<&[u8]> {
        let b = self.buffer.as_ref();
        if !self.d() {
            return None;
        }
        let control = *b.get(field::TERM_DDP_HDR)?;
        b.get(field::TERM_DDP_HDR..field::TERM_DDP_HDR + ddp::header_len_for(control))
    }

    /// Terminated RDMA Header octets (28), when R is set; at offset 4 if D is
    /// clear (ambiguity 11).
    pub fn terminated_rdma_header(&self) -> Option<&[u8]> {
        let b = self.buffer.as_ref();
        if !self.r() {
            return None;
        }
        let start = match self.terminated_ddp_header() {
            Some(h) => field::TERM_DDP_HDR + h.len(),
            None if self.d() => return None,
            None => TERMINATE_CONTROL_LEN,
        };
        b.get(start..start + READ_REQUEST_HEADER_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TerminateHeader<T> {
    fn update(&mut self, f: impl FnOnce(&mut TermControl)) {
        let layout = self.layout;
        let mut c = self.control();
        f(&mut c);
        for (d, s) in self.buffer.as_mut().iter_mut().zip(c.encode(layout)) {
            *d = s;
        }
    }
    /// Sets Layer (low 4 bits used).
    pub fn set_layer(&mut self, v: u8) {
        self.update(|c| c.layer = v);
    }
    /// Sets EType (low 4 bits used).
    pub fn set_etype(&mut self, v: u8) {
        self.update(|c| c.etype = v);
    }
    /// Sets Error Code.
    pub fn set_error_code(&mut self, v: u8) {
        self.update(|c| c.code = v);
    }
    /// Sets M.
    pub fn set_m(&mut self, v: bool) {
        self.update(|c| c.m = v);
    }
    /// Sets D.
    pub fn set_d(&mut self, v: bool) {
        self.update(|c| c.d = v);
    }
    /// Sets R.
    pub fn set_r(&mut self, v: bool) {
        self.update(|c| c.r = v);
    }
    /// Sets the 13 reserved bits (low 13 bits used).
    pub fn set_reserved(&mut self, v: u16) {
        self.update(|c| c.reserved = v);
    }
    /// Writes the DDP Segment Length (needs D set and the field present).
    pub fn set_ddp_segment_length(&mut self, v: u16) -> Result<()> {
        if !self.d() {
            return Err(Error::Malformed {
                layer: Layer::Rdmap,
                reason: "Terminate DDP Segment Length needs D set",
            });
        }
        let b = self.buffer.as_mut();
        need(Layer::Rdmap, b, field::TERM_DDP_HDR)?;
        set_be16(b, field::TERM_SEG_LEN, v);
        Ok(())
    }
}

/// RFC 5040 §4.8: DDP Segment Length plus Terminated DDP Header (present iff D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TerminatedDdp {
    /// Meaningful when M is set (RDMAP-30).
    pub segment_length: u16,
    /// Copy of the failing segment's DDP header, RsvdULP included (RDMAP-31).
    pub header: ddp::Repr,
}

/// RFC 5040 §4.8: the Terminate Header (RDMAP-26), every bit kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TerminateRepr {
    /// Bit order of the control word on the wire; emit honours it.
    pub layout: TerminateLayout,
    /// Layer / EType / Error Code.
    pub code: TerminateCode,
    /// M: DDP Segment Length valid.
    pub m: bool,
    /// The 13 reserved bits (0..=0x1FFF, RDMAP-29).
    pub reserved: u16,
    /// D set iff `Some`.
    pub ddp: Option<TerminatedDdp>,
    /// R set iff `Some` (RDMAP-32).
    pub rdma: Option<ReadRequestRepr>,
    /// Zero octets after the header, tolerated and kept (`docs/spec/rdmap.md`
    /// ambiguity 5: §7.1 zeroes fields it does not use).
    pub trailing_zeros: u16,
}

impl TerminateRepr {
    /// A Terminate with only the control word (RFC layout, M clear).
    pub const fn new(code: TerminateCode) -> Self {
        TerminateRepr {
            layout: TerminateLayout::Rfc5040,
            code,
            m: false,
            reserved: 0,
            ddp: None,
            rdma: None,
            trailing_zeros: 0,
        }
    }

    /// Parses a Terminate Header (all of `buf`), layout by [`TerminateLayout::detect`].
    pub fn parse(buf: &[u8]) -> Result<Self> {
        Self::parse_with_layout(buf, TerminateLayout::detect(buf))
    }

    /// Parses a Terminate Header (all of `buf`) in the given layout.
    pub fn parse_with_layout(buf: &[u8], layout: TerminateLayout) -> Result<Self> {
        need(Layer::Rdmap, buf, TERMINATE_CONTROL_LEN)?;
        let c = TermControl::read(buf, layout);
        let code = TerminateCode::from_parts(c.layer, c.etype, c.code)?;
        let mut off = TERMINATE_CONTROL_LEN;
        let ddp = if c.d {
            need(Layer::Rdmap, buf, field::TERM_DDP_HDR + 1)?;
            let hl = ddp::header_len_for(buf[field::TERM_DDP_HDR]);
            need(Layer::Rdmap, buf, field::TERM_DDP_HDR + hl)?;
            off = field::TERM_DDP_HDR + hl;
            Some(TerminatedDdp {
                segment_length: be16(buf, field::TERM_SEG_LEN),
                header: ddp::Repr::parse(&buf[field::TERM_DDP_HDR..off])?,
            })
        } else {
            None
        };
        let rdma = if c.r {
            need(Layer::Rdmap, buf, off + READ_REQUEST_HEADER_LEN)?;
            let r = ReadRequestRepr::parse(&buf[off..])?;
            off += READ_REQUEST_HEADER_LEN;
            Some(r)
        } else {
            None
        };
        let rest = &buf[off..];
        if rest.iter().any(|&b| b != 0) {
            return Err(Violation::TrailingOctets.error());
        }
        let trailing_zeros = u16::try_from(rest.len()).map_err(|_| Error::TooLarge {
            layer: Layer::Rdmap,
            what: "Terminate trailing zero octets",
            value: rest.len() as u64,
            limit: u16::MAX.into(),
        })?;
        Ok(TerminateRepr {
            layout,
            code,
            m: c.m,
            reserved: c.reserved,
            ddp,
            rdma,
            trailing_zeros,
        })
    }

    /// D flag.
    pub const fn d(&self) -> bool {
        self.ddp.is_some()
    }

    /// R flag.
    pub const fn r(&self) -> bool {
        self.rdma.is_some()
    }

    /// Octets [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        let mut len = TERMINATE_CONTROL_LEN + self.trailing_zeros as usize;
        if let Some(d) = &self.ddp {
            len += DDP_SEGMENT_LENGTH_LEN + d.header.header_len();
        }
        if self.rdma.is_some() {
            len += READ_REQUEST_HEADER_LEN;
        }
        len
    }

    /// Writes exactly [`buffer_len`](Self::buffer_len) octets in `self.layout`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if self.reserved > 0x1FFF {
            return Err(Error::TooLarge {
                layer: Layer::Rdmap,
                what: "Terminate reserved bits",
                value: self.reserved.into(),
                limit: 0x1FFF,
            });
        }
        let len = self.buffer_len();
        need(Layer::Rdmap, buf, len)?;
        let (layer, etype, code) = self.code.parts();
        let word = TermControl {
            layer,
            etype,
            code,
            m: self.m,
            d: self.d(),
            r: self.r(),
            reserved: self.reserved,
        }
        .encode(self.layout);
        buf[..TERMINATE_CONTROL_LEN].copy_from_slice(&word);
        let mut off = TERMINATE_CONTROL_LEN;
        if let Some(d) = &self.ddp {
            set_be16(buf, field::TERM_SEG_LEN, d.segment_length);
            off = field::TERM_DDP_HDR + d.header.emit(&mut buf[field::TERM_DDP_HDR..])?;
        }
        if let Some(r) = &self.rdma {
            off += r.emit(&mut buf[off..])?;
        }
        buf[off..len].fill(0);
        Ok(len)
    }
}

#[cfg(test)]
mod tests;
