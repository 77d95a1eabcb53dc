//! The RDMA Read Request Header (RFC 5040 §4.4), also a Terminate's Terminated RDMA
//! Header (§4.8).

use crate::error::{Layer, Result, need};
use crate::field::{be32, be64, set_be32, set_be64};

/// RFC 5040 §4.4: RDMA Read Request Header length.
pub const READ_REQUEST_HEADER_LEN: usize = 28;

/// Field offsets inside the Read Request Header.
mod field {
    // RFC 5040 §4.4: Read Request Header.
    pub const SINK_STAG: usize = 0;
    pub const SINK_TO: usize = 4;
    pub const RDMARDSZ: usize = 12;
    pub const SRC_STAG: usize = 16;
    pub const SRC_TO: usize = 20;
}

fixed_view! {
    /// RFC 5040 §4.4: a checked view of the 28-octet RDMA Read Request Header.
    ReadRequestHeader, READ_REQUEST_HEADER_LEN
}

impl<T: AsRef<[u8]>> ReadRequestHeader<T> {
    /// Data Sink STag, copied uninterpreted into the Read Response (RDMAP-24).
    pub fn sink_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SINK_STAG)
    }
    /// Data Sink Tagged Offset.
    pub fn sink_to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SINK_TO)
    }
    /// RDMA Read Message Size.
    pub fn rdmardsz(&self) -> u32 {
        be32(self.buffer.as_ref(), field::RDMARDSZ)
    }
    /// Data Source STag.
    pub fn src_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SRC_STAG)
    }
    /// Data Source Tagged Offset.
    pub fn src_to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SRC_TO)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequestHeader<T> {
    pub fn set_sink_stag(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::SINK_STAG, v);
    }
    pub fn set_sink_to(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::SINK_TO, v);
    }
    pub fn set_rdmardsz(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::RDMARDSZ, v);
    }
    pub fn set_src_stag(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::SRC_STAG, v);
    }
    pub fn set_src_to(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), field::SRC_TO, v);
    }
}

/// RFC 5040 §4.4: RDMA Read Request Header (RDMAP-23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ReadRequestRepr {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub rdmardsz: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Parses the first 28 octets of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = ReadRequestHeader::new_checked(buf)?;
        Ok(ReadRequestRepr {
            sink_stag: h.sink_stag(),
            sink_to: h.sink_to(),
            rdmardsz: h.rdmardsz(),
            src_stag: h.src_stag(),
            src_to: h.src_to(),
        })
    }

    /// 28.
    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_HEADER_LEN
    }

    /// Writes 28 octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Rdmap, buf, READ_REQUEST_HEADER_LEN)?;
        let mut h = ReadRequestHeader::new_unchecked(buf);
        h.set_sink_stag(self.sink_stag);
        h.set_sink_to(self.sink_to);
        h.set_rdmardsz(self.rdmardsz);
        h.set_src_stag(self.src_stag);
        h.set_src_to(self.src_to);
        Ok(READ_REQUEST_HEADER_LEN)
    }

    /// RFC 5040 §4.8 (RDMAP-33): the Terminated RDMA Header of a Read whose
    /// first `sent` octets were already sent: both TOs advanced, the size
    /// reduced to what was left, the STags unchanged.
    pub const fn advanced(&self, sent: u32) -> Self {
        ReadRequestRepr {
            sink_stag: self.sink_stag,
            sink_to: self.sink_to.wrapping_add(sent as u64),
            rdmardsz: self.rdmardsz.saturating_sub(sent),
            src_stag: self.src_stag,
            src_to: self.src_to.wrapping_add(sent as u64),
        }
    }
}

#[cfg(test)]
mod tests;
