//! RFC 7306 Immediate Data: the 8-octet Immediate Data Header of the Immediate Data
//! and Immediate Data with SE messages.

use crate::error::{Layer, Result, need};

/// RFC 7306: Immediate Data Header length (64 bits of data).
pub const IMMEDIATE_DATA_HEADER_LEN: usize = 8;

/// Field offsets inside the Immediate Data Header.
mod field {
    use core::ops::Range;
    // RFC 7306: Immediate Data Header.
    pub const IMMEDIATE: Range<usize> = 0..8;
}

fixed_view! {
    /// RFC 7306: a checked view of the 8-octet Immediate Data Header.
    ImmediateDataHeader, IMMEDIATE_DATA_HEADER_LEN
}

impl<T: AsRef<[u8]>> ImmediateDataHeader<T> {
    /// Immediate Data (opaque, 8 octets).
    pub fn immediate_data(&self) -> [u8; 8] {
        let mut d = [0u8; 8];
        d.copy_from_slice(&self.buffer.as_ref()[field::IMMEDIATE]);
        d
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmediateDataHeader<T> {
    pub fn set_immediate_data(&mut self, v: [u8; 8]) {
        self.buffer.as_mut()[field::IMMEDIATE].copy_from_slice(&v);
    }
}

/// RFC 7306: Immediate Data Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ImmediateDataRepr {
    pub immediate_data: [u8; 8],
}

impl ImmediateDataRepr {
    /// Parses the first 8 octets of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = ImmediateDataHeader::new_checked(buf)?;
        Ok(ImmediateDataRepr {
            immediate_data: h.immediate_data(),
        })
    }

    /// 8.
    pub const fn buffer_len(&self) -> usize {
        IMMEDIATE_DATA_HEADER_LEN
    }

    /// Writes 8 octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Rdmap, buf, IMMEDIATE_DATA_HEADER_LEN)?;
        ImmediateDataHeader::new_unchecked(buf).set_immediate_data(self.immediate_data);
        Ok(IMMEDIATE_DATA_HEADER_LEN)
    }
}

#[cfg(test)]
mod tests;
