//! The segments chunk lists are made of (RFC 8166 §4.1.2): a plain segment `H L OO`
//! (`xdr_rdma_segment`) and a read segment `P H L OO` (`xdr_read_chunk`).

use super::LAYER;
use crate::xdr::{XdrReader, XdrWriter};
use crate::{Error, Result};

/// RFC 8166 §4.1.2 `xdr_rdma_segment` (a plain segment): `H L OO`, 16 octets.
/// The handle is at most 32 bits and the offset 64 bits (RPCRDMA-01).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Segment {
    /// `handle`: the R_Key / STag of the registered memory.
    pub handle: u32,
    /// `length` in octets (0 = empty segment).
    pub length: u32,
    /// `offset`: address or offset in the region.
    pub offset: u64,
}

impl Segment {
    /// Encoded size: 16 octets.
    pub const LEN: usize = 16;

    /// Parse the first 16 octets of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Segment> {
        Self::read(&mut XdrReader::with_layer(buf, LAYER))
    }

    /// Always 16.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Write 16 octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let mut w = XdrWriter::with_layer(buf, LAYER);
        self.write(&mut w)?;
        Ok(w.finish())
    }

    fn read(r: &mut XdrReader<'_>) -> Result<Segment> {
        Ok(Segment {
            handle: r.read_u32()?,
            length: r.read_u32()?,
            offset: r.read_u64()?,
        })
    }

    // pub(super): the Write and Reply chunks (write_list.rs) write their segments with it.
    pub(super) fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        w.write_u32(self.handle)?;
        w.write_u32(self.length)?;
        w.write_u64(self.offset)
    }
}

/// RFC 8166 §4.1.2 `xdr_read_chunk` (a read segment): `P H L OO`, 20 octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ReadSegment {
    /// `position`: offset in the unreduced Payload stream (RFC 8166 §3.4.5),
    /// a multiple of 4 (RPCRDMA-21). All segments of one Read chunk share it.
    pub position: u32,
    /// `target.handle`.
    pub handle: u32,
    /// `target.length`.
    pub length: u32,
    /// `target.offset`.
    pub offset: u64,
}

impl ReadSegment {
    /// Encoded size: 20 octets.
    pub const LEN: usize = 20;

    /// A read segment for `target` at `position`.
    pub const fn new(position: u32, target: Segment) -> ReadSegment {
        ReadSegment {
            position,
            handle: target.handle,
            length: target.length,
            offset: target.offset,
        }
    }

    /// The plain segment (`target`).
    pub const fn target(&self) -> Segment {
        Segment {
            handle: self.handle,
            length: self.length,
            offset: self.offset,
        }
    }

    /// Parse the first 20 octets of `buf`; a Position that is not a multiple
    /// of 4 is `Error::Malformed` (RPCRDMA-21).
    pub fn parse(buf: &[u8]) -> Result<ReadSegment> {
        Self::read(&mut XdrReader::with_layer(buf, LAYER))
    }

    /// Always 20.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Write 20 octets (`Error::Malformed` for an unaligned Position).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        let mut w = XdrWriter::with_layer(buf, LAYER);
        self.write(&mut w)?;
        Ok(w.finish())
    }

    /// RPCRDMA-21: Position is a multiple of 4.
    pub fn check(&self) -> Result<()> {
        if !self.position.is_multiple_of(4) {
            return Err(Error::Malformed {
                layer: LAYER,
                reason: "read segment Position is not a multiple of 4 (RFC 8166 §3.4.5)",
            });
        }
        Ok(())
    }

    // pub(super) here and on write: the Read list (read_list.rs) reads and writes its entries.
    pub(super) fn read(r: &mut XdrReader<'_>) -> Result<ReadSegment> {
        let position = r.read_u32()?;
        let s = ReadSegment::new(position, Segment::read(r)?);
        s.check()?;
        Ok(s)
    }

    pub(super) fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        w.write_u32(self.position)?;
        self.target().write(w)
    }
}

#[cfg(test)]
mod tests;
