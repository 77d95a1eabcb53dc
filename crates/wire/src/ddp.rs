//! DDP — Direct Data Placement over Reliable Transports (RFC 5041 §4).
//!
//! The input is one ULPDU as MPA hands it up (MPA length, PAD and CRC already
//! stripped): the DDP header, then the ULP (RDMAP) octets. DDP does not
//! interpret RsvdULP; it is kept raw (1 octet tagged, 5 octets untagged) and
//! `crate::rdmap` reads its RDMAP control field and Invalidate STag from it.
//!
//! Also here: the DDP error types and codes a Terminate carries in Layer 1
//! (RFC 5041 §7.2, registered by RFC 6580; `docs/spec/rdmap.md` §13.2).

use crate::error::{Error, Layer, Result, need};
use crate::field::{be32, be64, set_be32, set_be64};
use crate::macros::wire_enum;

/// RFC 5041 §4.2: the T (Tagged) flag of the DDP control field.
pub const FLAG_TAGGED: u8 = 0x80;
/// RFC 5041 §4.2: the L (Last) flag of the DDP control field.
pub const FLAG_LAST: u8 = 0x40;
/// RFC 5041 §4.2: the four reserved bits of the DDP control field.
pub const MASK_RESERVED: u8 = 0x3C;
/// RFC 5041 §4.2: the DDP version (DV) bits of the DDP control field.
pub const MASK_DV: u8 = 0x03;
/// RFC 5041 §4.2: the DDP version this stack speaks (`01b`).
pub const DDP_VERSION: u8 = 1;
/// RFC 5041 §4.3: tagged buffer DDP header length.
pub const TAGGED_HEADER_LEN: usize = 14;
/// RFC 5041 §4.4: untagged buffer DDP header length.
pub const UNTAGGED_HEADER_LEN: usize = 18;
/// RFC 5041 §4.3: RsvdULP octets in a tagged header.
pub const TAGGED_RSVD_ULP_LEN: usize = 1;
/// RFC 5041 §4.4: RsvdULP octets in an untagged header.
pub const UNTAGGED_RSVD_ULP_LEN: usize = 5;

/// Field offsets from the first octet of the DDP header.
mod field {
    use core::ops::Range;
    pub const CONTROL: usize = 0;
    pub const RSVD_ULP: usize = 1;
    // RFC 5041 §4.3: tagged buffer model.
    pub const STAG: Range<usize> = 2..6;
    pub const TO: Range<usize> = 6..14;
    // RFC 5041 §4.4: untagged buffer model.
    pub const QN: Range<usize> = 6..10;
    pub const MSN: Range<usize> = 10..14;
    pub const MO: Range<usize> = 14..18;
}

/// DDP header length selected by the T bit of a control octet.
#[inline]
pub const fn header_len_for(control: u8) -> usize {
    if control & FLAG_TAGGED != 0 {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

#[inline]
fn get_be32(b: &[u8], r: core::ops::Range<usize>) -> Option<u32> {
    b.get(r).map(|s| be32(s, 0))
}

#[inline]
fn get_be64(b: &[u8], r: core::ops::Range<usize>) -> Option<u64> {
    b.get(r).map(|s| be64(s, 0))
}

/// A checked view of a DDP header (tagged or untagged, by its own T bit).
///
/// Getters never panic, even on an unchecked or later re-flagged buffer: the
/// model-specific ones return `None` for the other buffer model or when the
/// buffer is too short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps `buffer` without any check.
    pub const fn new_unchecked(buffer: T) -> Self {
        Header { buffer }
    }

    /// Wraps `buffer` after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` unless the buffer holds the whole header its T bit announces.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(Layer::Ddp, b, 1)?;
        need(Layer::Ddp, b, header_len_for(b[field::CONTROL]))
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// RFC 5041 §4.2: the whole DDP control octet (0 on an empty buffer).
    pub fn control(&self) -> u8 {
        self.buffer.as_ref().first().copied().unwrap_or(0)
    }

    /// RFC 5041 §4.2: T, tagged buffer model.
    pub fn tagged(&self) -> bool {
        self.control() & FLAG_TAGGED != 0
    }

    /// RFC 5041 §4.2: L, last segment of the DDP message.
    pub fn last(&self) -> bool {
        self.control() & FLAG_LAST != 0
    }

    /// RFC 5041 §4.2: the four reserved bits (sent as 0; kept raw).
    pub fn reserved(&self) -> u8 {
        (self.control() & MASK_RESERVED) >> 2
    }

    /// RFC 5041 §4.2: DV, the DDP version.
    pub fn dv(&self) -> u8 {
        self.control() & MASK_DV
    }

    /// Header length announced by the T bit (14 or 18).
    pub fn header_len(&self) -> usize {
        header_len_for(self.control())
    }

    /// RFC 5041 §4.3/§4.4: RsvdULP (1 or 5 octets; empty if the buffer is short).
    pub fn rsvd_ulp(&self) -> &[u8] {
        let n = if self.tagged() {
            TAGGED_RSVD_ULP_LEN
        } else {
            UNTAGGED_RSVD_ULP_LEN
        };
        self.buffer
            .as_ref()
            .get(field::RSVD_ULP..field::RSVD_ULP + n)
            .unwrap_or(&[])
    }

    /// RFC 5041 §4.3: Data Sink STag (tagged only).
    pub fn stag(&self) -> Option<u32> {
        self.tagged()
            .then(|| get_be32(self.buffer.as_ref(), field::STAG))
            .flatten()
    }

    /// RFC 5041 §4.3: Data Sink Tagged Offset (tagged only).
    pub fn to(&self) -> Option<u64> {
        self.tagged()
            .then(|| get_be64(self.buffer.as_ref(), field::TO))
            .flatten()
    }

    /// RFC 5041 §4.4: Queue Number (untagged only).
    pub fn qn(&self) -> Option<u32> {
        (!self.tagged())
            .then(|| get_be32(self.buffer.as_ref(), field::QN))
            .flatten()
    }

    /// RFC 5041 §4.4: Message Sequence Number (untagged only).
    pub fn msn(&self) -> Option<u32> {
        (!self.tagged())
            .then(|| get_be32(self.buffer.as_ref(), field::MSN))
            .flatten()
    }

    /// RFC 5041 §4.4: Message Offset (untagged only).
    pub fn mo(&self) -> Option<u32> {
        (!self.tagged())
            .then(|| get_be32(self.buffer.as_ref(), field::MO))
            .flatten()
    }

    /// The ULP octets after the DDP header (empty if the buffer is short).
    pub fn payload(&self) -> &[u8] {
        let hl = self.header_len();
        self.buffer.as_ref().get(hl..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn control_mut(&mut self) -> Option<&mut u8> {
        self.buffer.as_mut().first_mut()
    }

    fn update_control(&mut self, mask: u8, bits: u8) {
        if let Some(c) = self.control_mut() {
            *c = (*c & !mask) | (bits & mask);
        }
    }

    /// Sets T (changes which model-specific fields exist).
    pub fn set_tagged(&mut self, value: bool) {
        self.update_control(FLAG_TAGGED, if value { FLAG_TAGGED } else { 0 });
    }

    /// Sets L.
    pub fn set_last(&mut self, value: bool) {
        self.update_control(FLAG_LAST, if value { FLAG_LAST } else { 0 });
    }

    /// Sets the four reserved bits (bits above the field are ignored).
    pub fn set_reserved(&mut self, value: u8) {
        self.update_control(MASK_RESERVED, value << 2);
    }

    /// Sets DV (bits above the field are ignored).
    pub fn set_dv(&mut self, value: u8) {
        self.update_control(MASK_DV, value);
    }

    fn model_field(&mut self, tagged: bool, r: core::ops::Range<usize>) -> Result<&mut [u8]> {
        if self.tagged() != tagged {
            return Err(Error::Malformed {
                layer: Layer::Ddp,
                reason: "field does not exist in this DDP buffer model",
            });
        }
        let b = self.buffer.as_mut();
        need(Layer::Ddp, b, r.end)?;
        Ok(&mut b[r])
    }

    /// Writes RsvdULP; `value` must be exactly 1 (tagged) or 5 (untagged) octets.
    pub fn set_rsvd_ulp(&mut self, value: &[u8]) -> Result<()> {
        let tagged = self.tagged();
        let n = if tagged {
            TAGGED_RSVD_ULP_LEN
        } else {
            UNTAGGED_RSVD_ULP_LEN
        };
        if value.len() != n {
            return Err(Error::Malformed {
                layer: Layer::Ddp,
                reason: "RsvdULP is 1 octet (tagged) or 5 octets (untagged)",
            });
        }
        self.model_field(tagged, field::RSVD_ULP..field::RSVD_ULP + n)?
            .copy_from_slice(value);
        Ok(())
    }

    /// Writes the STag (tagged headers only).
    pub fn set_stag(&mut self, value: u32) -> Result<()> {
        set_be32(self.model_field(true, field::STAG)?, 0, value);
        Ok(())
    }

    /// Writes the TO (tagged headers only).
    pub fn set_to(&mut self, value: u64) -> Result<()> {
        set_be64(self.model_field(true, field::TO)?, 0, value);
        Ok(())
    }

    /// Writes the QN (untagged headers only).
    pub fn set_qn(&mut self, value: u32) -> Result<()> {
        set_be32(self.model_field(false, field::QN)?, 0, value);
        Ok(())
    }

    /// Writes the MSN (untagged headers only).
    pub fn set_msn(&mut self, value: u32) -> Result<()> {
        set_be32(self.model_field(false, field::MSN)?, 0, value);
        Ok(())
    }

    /// Writes the MO (untagged headers only).
    pub fn set_mo(&mut self, value: u32) -> Result<()> {
        set_be32(self.model_field(false, field::MO)?, 0, value);
        Ok(())
    }

    /// The ULP octets after the DDP header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        self.buffer.as_mut().get_mut(hl..).unwrap_or(&mut [])
    }
}

/// A parsed DDP header, keeping every bit (reserved bits, DV and RsvdULP raw).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Repr {
    /// RFC 5041 §4.3: tagged buffer model (T=1), 14 octets.
    Tagged {
        last: bool,
        /// The four reserved control bits (0..=0xF).
        reserved: u8,
        /// DDP version (0..=3).
        dv: u8,
        /// RsvdULP: for RDMAP, the RDMAP control field.
        rsvd_ulp: u8,
        stag: u32,
        to: u64,
    },
    /// RFC 5041 §4.4: untagged buffer model (T=0), 18 octets.
    Untagged {
        last: bool,
        /// The four reserved control bits (0..=0xF).
        reserved: u8,
        /// DDP version (0..=3).
        dv: u8,
        /// RsvdULP: for RDMAP, the control field then the Invalidate STag.
        rsvd_ulp: [u8; 5],
        qn: u32,
        msn: u32,
        mo: u32,
    },
}

impl Repr {
    /// Parses the DDP header at the start of `buf` (octets after it are ignored).
    pub fn parse(buf: &[u8]) -> Result<Repr> {
        let h = Header::new_checked(buf)?;
        let c = h.control();
        let (last, reserved, dv) = (c & FLAG_LAST != 0, (c & MASK_RESERVED) >> 2, c & MASK_DV);
        Ok(if h.tagged() {
            Repr::Tagged {
                last,
                reserved,
                dv,
                rsvd_ulp: buf[field::RSVD_ULP],
                stag: be32(buf, field::STAG.start),
                to: be64(buf, field::TO.start),
            }
        } else {
            let mut rsvd_ulp = [0u8; UNTAGGED_RSVD_ULP_LEN];
            rsvd_ulp.copy_from_slice(&buf[field::RSVD_ULP..field::RSVD_ULP + 5]);
            Repr::Untagged {
                last,
                reserved,
                dv,
                rsvd_ulp,
                qn: be32(buf, field::QN.start),
                msn: be32(buf, field::MSN.start),
                mo: be32(buf, field::MO.start),
            }
        })
    }

    /// 14 (tagged) or 18 (untagged).
    pub const fn header_len(&self) -> usize {
        match self {
            Repr::Tagged { .. } => TAGGED_HEADER_LEN,
            Repr::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Octets [`emit`](Self::emit) writes (the header only).
    pub const fn buffer_len(&self) -> usize {
        self.header_len()
    }

    /// T flag.
    pub const fn is_tagged(&self) -> bool {
        matches!(self, Repr::Tagged { .. })
    }

    /// L flag.
    pub const fn last(&self) -> bool {
        match *self {
            Repr::Tagged { last, .. } | Repr::Untagged { last, .. } => last,
        }
    }

    /// DV.
    pub const fn dv(&self) -> u8 {
        match *self {
            Repr::Tagged { dv, .. } | Repr::Untagged { dv, .. } => dv,
        }
    }

    /// The four reserved control bits.
    pub const fn reserved(&self) -> u8 {
        match *self {
            Repr::Tagged { reserved, .. } | Repr::Untagged { reserved, .. } => reserved,
        }
    }

    /// RsvdULP (1 or 5 octets).
    pub fn rsvd_ulp(&self) -> &[u8] {
        match self {
            Repr::Tagged { rsvd_ulp, .. } => core::slice::from_ref(rsvd_ulp),
            Repr::Untagged { rsvd_ulp, .. } => rsvd_ulp,
        }
    }

    /// RsvdULP, writable (1 or 5 octets).
    pub fn rsvd_ulp_mut(&mut self) -> &mut [u8] {
        match self {
            Repr::Tagged { rsvd_ulp, .. } => core::slice::from_mut(rsvd_ulp),
            Repr::Untagged { rsvd_ulp, .. } => rsvd_ulp,
        }
    }

    /// QN of an untagged header.
    pub const fn qn(&self) -> Option<u32> {
        match *self {
            Repr::Untagged { qn, .. } => Some(qn),
            Repr::Tagged { .. } => None,
        }
    }

    /// MO of an untagged header.
    pub const fn mo(&self) -> Option<u32> {
        match *self {
            Repr::Untagged { mo, .. } => Some(mo),
            Repr::Tagged { .. } => None,
        }
    }

    /// The DDP control octet this header emits (after range checks).
    pub fn control(&self) -> Result<u8> {
        let (reserved, dv) = (self.reserved(), self.dv());
        if reserved > 0x0F {
            return Err(Error::TooLarge {
                layer: Layer::Ddp,
                what: "DDP reserved control bits",
                value: reserved.into(),
                limit: 0x0F,
            });
        }
        if dv > 0x03 {
            return Err(Error::TooLarge {
                layer: Layer::Ddp,
                what: "DDP version",
                value: dv.into(),
                limit: 0x03,
            });
        }
        let t = if self.is_tagged() { FLAG_TAGGED } else { 0 };
        let l = if self.last() { FLAG_LAST } else { 0 };
        Ok(t | l | (reserved << 2) | dv)
    }

    /// Writes exactly [`buffer_len`](Self::buffer_len) octets.
    ///
    /// `Err(TooLarge)` if `reserved` or `dv` exceed their bit width,
    /// `Err(Truncated)` if `buf` is short; never panics.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let control = self.control()?;
        let len = self.header_len();
        need(Layer::Ddp, buf, len)?;
        buf[field::CONTROL] = control;
        match *self {
            Repr::Tagged {
                rsvd_ulp, stag, to, ..
            } => {
                buf[field::RSVD_ULP] = rsvd_ulp;
                set_be32(buf, field::STAG.start, stag);
                set_be64(buf, field::TO.start, to);
            }
            Repr::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
                ..
            } => {
                buf[field::RSVD_ULP..field::RSVD_ULP + 5].copy_from_slice(&rsvd_ulp);
                set_be32(buf, field::QN.start, qn);
                set_be32(buf, field::MSN.start, msn);
                set_be32(buf, field::MO.start, mo);
            }
        }
        Ok(len)
    }
}

wire_enum! {
    /// RFC 5041 §7.2 (Terminate Layer 1): DDP error types.
    ///
    /// EType 0x3 ("reserved for the LLP") defines no codes and is rejected
    /// like any other undefined value.
    pub enum DdpErrorType: u8 => (Layer::Ddp, "DDP error type") {
        LocalCatastrophic = 0x0,
        TaggedBuffer = 0x1,
        UntaggedBuffer = 0x2,
    }
}

wire_enum! {
    /// RFC 5041 §7.2: error codes for DDP error type 0x1, Tagged Buffer Error (EXT-DDP-04).
    pub enum TaggedBufferError: u8 => (Layer::Ddp, "DDP tagged buffer error code") {
        InvalidStag = 0x00,
        BaseOrBoundsViolation = 0x01,
        StagNotAssociatedWithStream = 0x02,
        ToWrap = 0x03,
        InvalidDdpVersion = 0x04,
    }
}

wire_enum! {
    /// RFC 5041 §7.2: error codes for DDP error type 0x2, Untagged Buffer Error (EXT-DDP-05).
    pub enum UntaggedBufferError: u8 => (Layer::Ddp, "DDP untagged buffer error code") {
        InvalidQn = 0x01,
        InvalidMsnNoBuffer = 0x02,
        InvalidMsnRange = 0x03,
        InvalidMo = 0x04,
        MessageTooLong = 0x05,
        InvalidDdpVersion = 0x06,
    }
}

/// A complete DDP error (EType plus Error Code) as carried by a Terminate
/// with Layer 1 (`docs/spec/rdmap.md` §13.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum DdpError {
    /// EType 0x0, code 0x00.
    LocalCatastrophic,
    /// EType 0x1.
    TaggedBuffer(TaggedBufferError),
    /// EType 0x2.
    UntaggedBuffer(UntaggedBufferError),
}

impl core::fmt::Display for DdpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DdpError::LocalCatastrophic => f.write_str("local catastrophic"),
            DdpError::TaggedBuffer(e) => write!(f, "tagged buffer: {e}"),
            DdpError::UntaggedBuffer(e) => write!(f, "untagged buffer: {e}"),
        }
    }
}

impl DdpError {
    /// Every defined DDP error, in (EType, code) order.
    pub fn all() -> impl Iterator<Item = DdpError> {
        core::iter::once(DdpError::LocalCatastrophic)
            .chain(
                TaggedBufferError::ALL
                    .iter()
                    .map(|&c| DdpError::TaggedBuffer(c)),
            )
            .chain(
                UntaggedBufferError::ALL
                    .iter()
                    .map(|&c| DdpError::UntaggedBuffer(c)),
            )
    }

    /// Decodes an (EType, code) pair; `Err(Unknown)` for undefined ones.
    pub fn from_parts(etype: u8, code: u8) -> Result<Self> {
        Ok(match DdpErrorType::try_from(etype)? {
            DdpErrorType::LocalCatastrophic => {
                if code != 0 {
                    return Err(Error::Unknown {
                        layer: Layer::Ddp,
                        field: "DDP local catastrophic error code",
                        value: code.into(),
                    });
                }
                DdpError::LocalCatastrophic
            }
            DdpErrorType::TaggedBuffer => DdpError::TaggedBuffer(code.try_into()?),
            DdpErrorType::UntaggedBuffer => DdpError::UntaggedBuffer(code.try_into()?),
        })
    }

    /// The EType.
    pub const fn error_type(&self) -> DdpErrorType {
        match self {
            DdpError::LocalCatastrophic => DdpErrorType::LocalCatastrophic,
            DdpError::TaggedBuffer(_) => DdpErrorType::TaggedBuffer,
            DdpError::UntaggedBuffer(_) => DdpErrorType::UntaggedBuffer,
        }
    }

    /// The Error Code octet.
    pub const fn code(&self) -> u8 {
        match *self {
            DdpError::LocalCatastrophic => 0,
            DdpError::TaggedBuffer(c) => c as u8,
            DdpError::UntaggedBuffer(c) => c as u8,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// MPA Fig. 5 (`docs/spec/mpa.md` §3.3): the DDP header of the seed ULPDU.
    const SEED_FIG5_HEADER: [u8; 18] = [
        0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
        0x00, 0x00, 0x00,
    ];

    /// siw-ib_send_bw.pcap frames 41, 43, 45: the DDP headers of the three
    /// segments of the first 4096-octet Send (ULPDU lengths 1442, 1442, 1266).
    const SIW_SEND_BW_HEADERS: [[u8; 18]; 3] = [
        [
            0x01, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0x00, 0x00,
        ],
        [
            0x01, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0x05, 0x90,
        ],
        [
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0x0b, 0x20,
        ],
    ];
    const SIW_SEND_BW_LENS: [usize; 3] = [1442, 1442, 1266];

    /// siw-ib_write_bw.pcap frames 40, 42, 44: the DDP headers of the three
    /// segments of one 4096-octet RDMA Write (ULPDU lengths 1442, 1442, 1254).
    const SIW_WRITE_BW_HEADERS: [[u8; 14]; 3] = [
        [
            0x81, 0x40, 0x0a, 0x78, 0x6c, 0x00, 0x00, 0x00, 0x55, 0xb3, 0x17, 0xba, 0xa0, 0x00,
        ],
        [
            0x81, 0x40, 0x0a, 0x78, 0x6c, 0x00, 0x00, 0x00, 0x55, 0xb3, 0x17, 0xba, 0xa5, 0x94,
        ],
        [
            0xc1, 0x40, 0x0a, 0x78, 0x6c, 0x00, 0x00, 0x00, 0x55, 0xb3, 0x17, 0xba, 0xab, 0x28,
        ],
    ];
    const SIW_WRITE_BW_LENS: [usize; 3] = [1442, 1442, 1254];

    /// EXT-DDP-01: seed MPA Fig. 5 bytes 0x0006..0x0017 decode as an untagged
    /// header (T=0, L=1, DV=1, QN 0, MSN 1, MO 0) and re-emit identically.
    #[test]
    fn ext_ddp_01_seed_fig5_untagged_header() {
        let h = Header::new_checked(&SEED_FIG5_HEADER[..]).unwrap();
        assert!(!h.tagged());
        assert!(h.last());
        assert_eq!(h.reserved(), 0);
        assert_eq!(h.dv(), DDP_VERSION);
        assert_eq!(h.header_len(), UNTAGGED_HEADER_LEN);
        assert_eq!(h.rsvd_ulp(), &[0x43, 0, 0, 0, 0]);
        assert_eq!((h.qn(), h.msn(), h.mo()), (Some(0), Some(1), Some(0)));
        assert_eq!((h.stag(), h.to()), (None, None));

        let repr = Repr::parse(&SEED_FIG5_HEADER).unwrap();
        assert_eq!(
            repr,
            Repr::Untagged {
                last: true,
                reserved: 0,
                dv: 1,
                rsvd_ulp: [0x43, 0, 0, 0, 0],
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        let mut out = [0u8; 18];
        assert_eq!(repr.emit(&mut out), Ok(18));
        assert_eq!(out, SEED_FIG5_HEADER);
    }

    /// EXT-DDP-01, RDMAP-04: tagged header layout, hand-built from RFC 5041 §4.3.
    #[test]
    fn ext_ddp_01_tagged_header_golden() {
        let repr = Repr::Tagged {
            last: true,
            reserved: 0,
            dv: 1,
            rsvd_ulp: 0x40,
            stag: 0x1122_3344,
            to: 0x0102_0304_0506_0708,
        };
        let golden = [
            0xc1, 0x40, 0x11, 0x22, 0x33, 0x44, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
        ];
        let mut out = [0u8; 14];
        assert_eq!(repr.emit(&mut out), Ok(14));
        assert_eq!(out, golden);
        assert_eq!(Repr::parse(&golden), Ok(repr));
        let h = Header::new_checked(&golden[..]).unwrap();
        assert_eq!(h.stag(), Some(0x1122_3344));
        assert_eq!(h.to(), Some(0x0102_0304_0506_0708));
        assert_eq!((h.qn(), h.msn(), h.mo()), (None, None, None));
        assert_eq!(h.rsvd_ulp(), &[0x40]);
    }

    /// EXT-DDP-02: siw-ib_send_bw.pcap — one MSN for the whole message, MO
    /// advances by the payload already sent, L=1 only on the last segment.
    #[test]
    fn ext_ddp_02_siw_send_bw_multi_segment_mo_msn() {
        let mut expected_mo = 0u32;
        for (i, hdr) in SIW_SEND_BW_HEADERS.iter().enumerate() {
            let h = Header::new_checked(&hdr[..]).unwrap();
            assert!(!h.tagged());
            assert_eq!(h.last(), i == 2);
            assert_eq!(h.dv(), 1);
            assert_eq!(h.qn(), Some(0));
            assert_eq!(h.msn(), Some(1));
            assert_eq!(h.mo(), Some(expected_mo));
            expected_mo += (SIW_SEND_BW_LENS[i] - UNTAGGED_HEADER_LEN) as u32;
            let repr = Repr::parse(hdr).unwrap();
            let mut out = [0u8; 18];
            repr.emit(&mut out).unwrap();
            assert_eq!(&out, hdr);
        }
        assert_eq!(expected_mo, 4096);
    }

    /// EXT-DDP-03: siw-ib_write_bw.pcap — the STag is constant and each TO is
    /// the message TO plus the octets already sent.
    #[test]
    fn ext_ddp_03_siw_write_bw_tagged_offsets() {
        let first_to = 0x0000_55b3_17ba_a000u64;
        let mut sent = 0u64;
        for (i, hdr) in SIW_WRITE_BW_HEADERS.iter().enumerate() {
            let h = Header::new_checked(&hdr[..]).unwrap();
            assert!(h.tagged());
            assert_eq!(h.last(), i == 2);
            assert_eq!(h.stag(), Some(0x0a78_6c00));
            assert_eq!(h.to(), Some(first_to + sent));
            assert_eq!(h.rsvd_ulp(), &[0x40]);
            sent += (SIW_WRITE_BW_LENS[i] - TAGGED_HEADER_LEN) as u64;
            let mut out = [0u8; 14];
            Repr::parse(hdr).unwrap().emit(&mut out).unwrap();
            assert_eq!(&out, hdr);
        }
        assert_eq!(sent, 4096);
    }

    /// RDMAP-04: RsvdULP is 1 (tagged) or 5 (untagged) octets and is carried untouched.
    #[test]
    fn rdmap_04_rsvd_ulp_round_trip() {
        let mut buf = [0u8; 18];
        let mut h = Header::new_unchecked(&mut buf[..]);
        h.set_dv(1);
        h.set_rsvd_ulp(&[0xde, 0xad, 0xbe, 0xef, 0x99]).unwrap();
        assert!(h.set_rsvd_ulp(&[1]).is_err());
        h.set_qn(7).unwrap();
        h.set_msn(8).unwrap();
        h.set_mo(9).unwrap();
        assert!(h.set_stag(1).is_err());
        assert!(h.set_to(1).is_err());
        let repr = Repr::parse(&buf).unwrap();
        assert_eq!(repr.rsvd_ulp(), &[0xde, 0xad, 0xbe, 0xef, 0x99]);
        assert_eq!(repr.qn(), Some(7));
        assert_eq!(repr.mo(), Some(9));

        let mut tbuf = [0u8; 14];
        let mut t = Header::new_unchecked(&mut tbuf[..]);
        t.set_tagged(true);
        t.set_rsvd_ulp(&[0x42]).unwrap();
        assert!(t.set_rsvd_ulp(&[1, 2, 3, 4, 5]).is_err());
        assert!(t.set_qn(1).is_err());
        t.set_stag(0xfeed_f00d).unwrap();
        t.set_to(u64::MAX).unwrap();
        let repr = Repr::parse(&tbuf).unwrap();
        assert_eq!(repr.rsvd_ulp(), &[0x42]);
        assert_eq!(
            repr,
            Repr::Tagged {
                last: false,
                reserved: 0,
                dv: 0,
                rsvd_ulp: 0x42,
                stag: 0xfeed_f00d,
                to: u64::MAX
            }
        );
    }

    /// Construct with setters: control bits, payload access.
    #[test]
    fn setters_build_a_segment() {
        let mut buf = [0u8; 20];
        let mut h = Header::new_unchecked(&mut buf[..]);
        h.set_last(true);
        h.set_dv(DDP_VERSION);
        h.set_reserved(0xA);
        h.set_rsvd_ulp(&[0x43, 0, 0, 0, 0]).unwrap();
        h.set_qn(0).unwrap();
        h.set_msn(1).unwrap();
        h.set_mo(0).unwrap();
        h.payload_mut().copy_from_slice(b"hi");
        assert_eq!(h.control(), 0x40 | (0xA << 2) | 1);
        assert_eq!(h.reserved(), 0xA);
        assert_eq!(h.payload(), b"hi");
        h.set_reserved(0);
        h.set_last(false);
        assert_eq!(h.control(), 0x01);
    }

    /// Getters never panic, even after T is flipped on a buffer checked for the other model.
    #[test]
    fn getters_survive_model_flip() {
        let mut buf = [0x81u8; 14];
        let mut h = Header::new_checked(&mut buf[..]).unwrap();
        h.set_tagged(false);
        assert_eq!(h.header_len(), 18);
        assert_eq!(h.qn(), Some(0x8181_8181));
        assert_eq!(h.mo(), None);
        assert!(h.payload().is_empty());
        assert!(h.payload_mut().is_empty());
        assert!(h.set_mo(1).is_err());
        assert!(h.check_len().is_err());
        let empty = Header::new_unchecked(&[][..]);
        assert_eq!(empty.control(), 0);
        assert!(empty.rsvd_ulp().is_empty());
        assert_eq!(empty.qn(), None);
    }

    /// Every truncation of a tagged and an untagged header is an error.
    #[test]
    fn truncations_are_errors() {
        for len in 0..18 {
            let e = Repr::parse(&SEED_FIG5_HEADER[..len]).unwrap_err();
            assert!(matches!(
                e,
                Error::Truncated {
                    layer: Layer::Ddp,
                    ..
                }
            ));
        }
        for len in 0..14 {
            assert!(Repr::parse(&SIW_WRITE_BW_HEADERS[0][..len]).is_err());
            assert!(Header::new_checked(&SIW_WRITE_BW_HEADERS[0][..len]).is_err());
        }
        let repr = Repr::parse(&SEED_FIG5_HEADER).unwrap();
        for len in 0..18 {
            let mut out = [0u8; 18];
            assert_eq!(
                repr.emit(&mut out[..len]),
                Err(Error::Truncated {
                    layer: Layer::Ddp,
                    need: 18,
                    have: len
                })
            );
        }
    }

    /// Emit refuses field values wider than their bits.
    #[test]
    fn emit_rejects_out_of_range_control_bits() {
        let mut out = [0u8; 18];
        let bad_rsvd = Repr::Untagged {
            last: false,
            reserved: 0x10,
            dv: 1,
            rsvd_ulp: [0; 5],
            qn: 0,
            msn: 0,
            mo: 0,
        };
        assert!(matches!(
            bad_rsvd.emit(&mut out),
            Err(Error::TooLarge { .. })
        ));
        let bad_dv = Repr::Tagged {
            last: false,
            reserved: 0,
            dv: 4,
            rsvd_ulp: 0,
            stag: 0,
            to: 0,
        };
        assert!(matches!(bad_dv.emit(&mut out), Err(Error::TooLarge { .. })));
    }

    /// EXT-DDP-04, EXT-DDP-05, RDMAP-27: every DDP error of `docs/spec/rdmap.md` §13.2.
    #[test]
    fn ext_ddp_04_05_error_table() {
        let table: [(u8, u8, DdpError); 12] = [
            (0, 0x00, DdpError::LocalCatastrophic),
            (
                1,
                0x00,
                DdpError::TaggedBuffer(TaggedBufferError::InvalidStag),
            ),
            (
                1,
                0x01,
                DdpError::TaggedBuffer(TaggedBufferError::BaseOrBoundsViolation),
            ),
            (
                1,
                0x02,
                DdpError::TaggedBuffer(TaggedBufferError::StagNotAssociatedWithStream),
            ),
            (1, 0x03, DdpError::TaggedBuffer(TaggedBufferError::ToWrap)),
            (
                1,
                0x04,
                DdpError::TaggedBuffer(TaggedBufferError::InvalidDdpVersion),
            ),
            (
                2,
                0x01,
                DdpError::UntaggedBuffer(UntaggedBufferError::InvalidQn),
            ),
            (
                2,
                0x02,
                DdpError::UntaggedBuffer(UntaggedBufferError::InvalidMsnNoBuffer),
            ),
            (
                2,
                0x03,
                DdpError::UntaggedBuffer(UntaggedBufferError::InvalidMsnRange),
            ),
            (
                2,
                0x04,
                DdpError::UntaggedBuffer(UntaggedBufferError::InvalidMo),
            ),
            (
                2,
                0x05,
                DdpError::UntaggedBuffer(UntaggedBufferError::MessageTooLong),
            ),
            (
                2,
                0x06,
                DdpError::UntaggedBuffer(UntaggedBufferError::InvalidDdpVersion),
            ),
        ];
        for (etype, code, err) in table {
            assert_eq!(DdpError::from_parts(etype, code), Ok(err));
            assert_eq!(u8::from(err.error_type()), etype);
            assert_eq!(err.code(), code);
        }
        assert_eq!(DdpError::all().count(), table.len());
        for (etype, code) in [(0, 1), (1, 5), (2, 0), (2, 7), (3, 0), (0xF, 0)] {
            assert!(matches!(
                DdpError::from_parts(etype, code),
                Err(Error::Unknown {
                    layer: Layer::Ddp,
                    ..
                })
            ));
        }
    }

    pub(crate) fn arb_repr() -> impl Strategy<Value = Repr> {
        prop_oneof![
            (
                any::<bool>(),
                0u8..16,
                0u8..4,
                any::<u8>(),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|(last, reserved, dv, rsvd_ulp, stag, to)| Repr::Tagged {
                    last,
                    reserved,
                    dv,
                    rsvd_ulp,
                    stag,
                    to
                }),
            (
                any::<bool>(),
                0u8..16,
                0u8..4,
                any::<[u8; 5]>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>()
            )
                .prop_map(|(last, reserved, dv, rsvd_ulp, qn, msn, mo)| {
                    Repr::Untagged {
                        last,
                        reserved,
                        dv,
                        rsvd_ulp,
                        qn,
                        msn,
                        mo,
                    }
                }),
        ]
    }

    proptest! {
        /// EXT-DDP-01: emit -> parse -> emit for any header.
        #[test]
        fn prop_repr_round_trip(repr in arb_repr()) {
            let mut buf = [0u8; 18];
            let n = repr.emit(&mut buf).unwrap();
            prop_assert_eq!(n, repr.buffer_len());
            let parsed = Repr::parse(&buf[..n]).unwrap();
            prop_assert_eq!(parsed, repr);
            let mut again = [0u8; 18];
            parsed.emit(&mut again).unwrap();
            prop_assert_eq!(&again[..n], &buf[..n]);
        }

        /// Arbitrary bytes never panic the view or the parser; a parse re-emits the same header.
        #[test]
        fn prop_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let h = Header::new_unchecked(&bytes[..]);
            let _ = (h.control(), h.rsvd_ulp(), h.stag(), h.to(), h.qn(), h.msn(), h.mo(), h.payload());
            if let Ok(h) = Header::new_checked(&bytes[..]) {
                prop_assert!(h.header_len() <= bytes.len());
            }
            if let Ok(repr) = Repr::parse(&bytes) {
                let mut out = [0u8; 18];
                let n = repr.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..n], &bytes[..n]);
            }
        }
    }
}
