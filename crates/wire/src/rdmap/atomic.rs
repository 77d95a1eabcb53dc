//! RFC 7306 §5 Atomic Operations: the Atomic Request Header (52 octets) with its Atomic
//! Operation codes, and the Atomic Response Header (12 octets).

use crate::error::{Error, Layer, Result, need};
use crate::field::{be32, be64, set_be32, set_be64};
use crate::macros::wire_enum;

/// RFC 7306: Atomic Request Header length.
pub const ATOMIC_REQUEST_HEADER_LEN: usize = 52;
/// RFC 7306: Atomic Response Header length.
pub const ATOMIC_RESPONSE_HEADER_LEN: usize = 12;

/// `Error::Unknown::field` of an undefined RFC 7306 Atomic Operation code (see
/// [`classify`](super::classify)).
pub const FIELD_ATOMIC_OPCODE: &str = "RDMAP Atomic Operation code";

/// Field offsets inside the Atomic Request and Atomic Response Headers.
mod field {
    // RFC 7306: Atomic Request Header.
    pub const ATOMIC_OPCODE_WORD: usize = 0;
    pub const REQUEST_ID: usize = 4;
    pub const REMOTE_STAG: usize = 8;
    pub const REMOTE_TO: usize = 12;
    pub const ADD_SWAP_DATA: usize = 20;
    pub const ADD_SWAP_MASK: usize = 28;
    pub const COMPARE_DATA: usize = 36;
    pub const COMPARE_MASK: usize = 44;
    // RFC 7306: Atomic Response Header.
    pub const ORIG_REQUEST_ID: usize = 0;
    pub const ORIG_VALUE: usize = 4;
}

wire_enum! {
    /// RFC 7306 §5 (Atomic Request Header): Atomic Operation code, the low 4 bits of the
    /// first word. 0x3..0xF are undefined: `TryFrom` gives `Error::Unknown` with
    /// [`FIELD_ATOMIC_OPCODE`]
    /// ([`Violation::UndefinedAtomicOpcode`](super::Violation::UndefinedAtomicOpcode)).
    pub enum AtomicOpcode: u8 => (Layer::Rdmap, FIELD_ATOMIC_OPCODE) {
        FetchAdd = 0x0,
        Swap = 0x1,
        CompareSwap = 0x2,
    }
}

fixed_view! {
    /// RFC 7306: a checked view of the 52-octet Atomic Request Header.
    AtomicRequestHeader, ATOMIC_REQUEST_HEADER_LEN
}

impl<T: AsRef<[u8]>> AtomicRequestHeader<T> {
    /// The 28 reserved bits before the Atomic Operation code.
    pub fn reserved(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ATOMIC_OPCODE_WORD) >> 4
    }
    /// Atomic Operation code (raw 4 bits).
    pub fn atomic_opcode(&self) -> u8 {
        (be32(self.buffer.as_ref(), field::ATOMIC_OPCODE_WORD) & 0x0F) as u8
    }
    /// Request Identifier, echoed in the Atomic Response.
    pub fn request_identifier(&self) -> u32 {
        be32(self.buffer.as_ref(), field::REQUEST_ID)
    }
    /// Remote STag.
    pub fn remote_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::REMOTE_STAG)
    }
    /// Remote Tagged Offset.
    pub fn remote_tagged_offset(&self) -> u64 {
        be64(self.buffer.as_ref(), field::REMOTE_TO)
    }
    /// Add or Swap Data.
    pub fn add_or_swap_data(&self) -> u64 {
        be64(self.buffer.as_ref(), field::ADD_SWAP_DATA)
    }
    /// Add or Swap Mask.
    pub fn add_or_swap_mask(&self) -> u64 {
        be64(self.buffer.as_ref(), field::ADD_SWAP_MASK)
    }
    /// Compare Data.
    pub fn compare_data(&self) -> u64 {
        be64(self.buffer.as_ref(), field::COMPARE_DATA)
    }
    /// Compare Mask.
    pub fn compare_mask(&self) -> u64 {
        be64(self.buffer.as_ref(), field::COMPARE_MASK)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicRequestHeader<T> {
    /// Sets the reserved bits (low 28 used) and the Atomic Operation code (low 4 used).
    pub fn set_reserved_and_opcode(&mut self, reserved: u32, opcode: u8) {
        let w = (reserved << 4) | u32::from(opcode & 0x0F);
        set_be32(self.buffer.as_mut(), field::ATOMIC_OPCODE_WORD, w);
    }
    pub fn set_request_identifier(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::REQUEST_ID, v);
    }
    pub fn set_remote_stag(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::REMOTE_STAG, v);
    }
    pub fn set_remote_tagged_offset(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::REMOTE_TO, v);
    }
    pub fn set_add_or_swap_data(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::ADD_SWAP_DATA, v);
    }
    pub fn set_add_or_swap_mask(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::ADD_SWAP_MASK, v);
    }
    pub fn set_compare_data(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::COMPARE_DATA, v);
    }
    pub fn set_compare_mask(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::COMPARE_MASK, v);
    }
}

/// RFC 7306: Atomic Request Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AtomicRequestRepr {
    /// The 28 reserved bits (0..=0x0FFF_FFFF), kept raw.
    pub reserved: u32,
    pub opcode: AtomicOpcode,
    pub request_identifier: u32,
    pub remote_stag: u32,
    pub remote_tagged_offset: u64,
    pub add_or_swap_data: u64,
    pub add_or_swap_mask: u64,
    pub compare_data: u64,
    pub compare_mask: u64,
}

impl AtomicRequestRepr {
    /// Parses the first 52 octets of `buf`; `Err(Unknown)` for an undefined Atomic Operation code.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = AtomicRequestHeader::new_checked(buf)?;
        Ok(AtomicRequestRepr {
            reserved: h.reserved(),
            opcode: AtomicOpcode::try_from(h.atomic_opcode())?,
            request_identifier: h.request_identifier(),
            remote_stag: h.remote_stag(),
            remote_tagged_offset: h.remote_tagged_offset(),
            add_or_swap_data: h.add_or_swap_data(),
            add_or_swap_mask: h.add_or_swap_mask(),
            compare_data: h.compare_data(),
            compare_mask: h.compare_mask(),
        })
    }

    /// 52.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_REQUEST_HEADER_LEN
    }

    /// Writes 52 octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if self.reserved > 0x0FFF_FFFF {
            return Err(Error::TooLarge {
                layer: Layer::Rdmap,
                what: "Atomic Request reserved bits",
                value: self.reserved.into(),
                limit: 0x0FFF_FFFF,
            });
        }
        need(Layer::Rdmap, buf, ATOMIC_REQUEST_HEADER_LEN)?;
        let mut h = AtomicRequestHeader::new_unchecked(buf);
        h.set_reserved_and_opcode(self.reserved, self.opcode.into());
        h.set_request_identifier(self.request_identifier);
        h.set_remote_stag(self.remote_stag);
        h.set_remote_tagged_offset(self.remote_tagged_offset);
        h.set_add_or_swap_data(self.add_or_swap_data);
        h.set_add_or_swap_mask(self.add_or_swap_mask);
        h.set_compare_data(self.compare_data);
        h.set_compare_mask(self.compare_mask);
        Ok(ATOMIC_REQUEST_HEADER_LEN)
    }
}

fixed_view! {
    /// RFC 7306: a checked view of the 12-octet Atomic Response Header.
    AtomicResponseHeader, ATOMIC_RESPONSE_HEADER_LEN
}

impl<T: AsRef<[u8]>> AtomicResponseHeader<T> {
    /// Original Request Identifier.
    pub fn original_request_identifier(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ORIG_REQUEST_ID)
    }
    /// Original Remote Data Value.
    pub fn original_remote_data_value(&self) -> u64 {
        be64(self.buffer.as_ref(), field::ORIG_VALUE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicResponseHeader<T> {
    pub fn set_original_request_identifier(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::ORIG_REQUEST_ID, v);
    }
    pub fn set_original_remote_data_value(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::ORIG_VALUE, v);
    }
}

/// RFC 7306: Atomic Response Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AtomicResponseRepr {
    pub original_request_identifier: u32,
    pub original_remote_data_value: u64,
}

impl AtomicResponseRepr {
    /// Parses the first 12 octets of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = AtomicResponseHeader::new_checked(buf)?;
        Ok(AtomicResponseRepr {
            original_request_identifier: h.original_request_identifier(),
            original_remote_data_value: h.original_remote_data_value(),
        })
    }

    /// 12.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_RESPONSE_HEADER_LEN
    }

    /// Writes 12 octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Rdmap, buf, ATOMIC_RESPONSE_HEADER_LEN)?;
        let mut h = AtomicResponseHeader::new_unchecked(buf);
        h.set_original_request_identifier(self.original_request_identifier);
        h.set_original_remote_data_value(self.original_remote_data_value);
        Ok(ATOMIC_RESPONSE_HEADER_LEN)
    }
}

#[cfg(test)]
mod tests;
