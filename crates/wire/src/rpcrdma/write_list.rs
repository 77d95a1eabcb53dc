//! Write chunks (RFC 8166 §4.1.2 `xdr_write_chunk`, the Reply chunk's type too) and the
//! Write list (§4.3.2), decoded lazily from a received header or taken from the caller's arrays.

use super::segment::Segment;
use super::{consumed, read_present, too_large};
use crate::Result;
use crate::xdr::{XdrReader, XdrWriter};

/// Most Write chunks accepted in one Write list (see the module doc).
pub const MAX_WRITE_CHUNKS: usize = 64;
/// Most plain segments accepted in one Write chunk or Reply chunk.
pub const MAX_CHUNK_SEGMENTS: usize = 64;

/// A Write chunk as received: its XDR octets (count, then the segments).
#[derive(Clone, Copy)]
pub struct WireSegments<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> WireSegments<'a> {
    /// The chunk's XDR encoding (`n HLOO ...`).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// RFC 8166 §4.1.2 `xdr_write_chunk`: a counted array of plain segments
/// (`3 HLOO HLOO HLOO`). Used for Write chunks and for the Reply chunk.
/// Chunk length = sum of segment lengths (RPCRDMA-13).
#[derive(Clone, Copy)]
pub enum WriteChunk<'a> {
    /// Octets of a received header, decoded lazily.
    Wire(WireSegments<'a>),
    /// The caller's own segments, for emitting.
    Slice(&'a [Segment]),
}

impl<'a> WriteChunk<'a> {
    /// The empty Write chunk (count 0, RFC 8166 §4.3.2.3).
    pub const EMPTY: WriteChunk<'static> = WriteChunk::Slice(&[]);

    /// Number of segments.
    pub fn len(&self) -> usize {
        match self {
            WriteChunk::Wire(w) => w.count,
            WriteChunk::Slice(s) => s.len(),
        }
    }

    /// True for an empty chunk (count 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments in array order.
    pub fn iter(&self) -> Segments<'a> {
        match *self {
            WriteChunk::Wire(w) => Segments(SegIter::Wire {
                bytes: w.bytes,
                next: 0,
                count: w.count,
            }),
            WriteChunk::Slice(s) => Segments(SegIter::Slice(s.iter())),
        }
    }

    /// RPCRDMA-13: the chunk's length, the sum of its segment lengths.
    pub fn total_len(&self) -> u64 {
        self.iter().map(|s| u64::from(s.length)).sum()
    }

    /// RPCRDMA-49: count > 0 and every length 0 (returned but not used).
    pub fn is_unused(&self) -> bool {
        !self.is_empty() && self.iter().all(|s| s.length == 0)
    }

    /// Encoded size: count word plus 16 octets per segment.
    pub fn buffer_len(&self) -> usize {
        match self {
            WriteChunk::Wire(w) => w.bytes.len(),
            WriteChunk::Slice(s) => s.len().saturating_mul(Segment::LEN).saturating_add(4),
        }
    }

    /// Bounds, as `parse` enforces them.
    pub fn check(&self) -> Result<()> {
        if self.len() > MAX_CHUNK_SEGMENTS {
            return Err(too_large("chunk segments", self.len(), MAX_CHUNK_SEGMENTS));
        }
        Ok(())
    }

    // pub(super) here and on write: Chunks (chunks.rs) reads and writes the Reply chunk.
    pub(super) fn parse(r: &mut XdrReader<'a>) -> Result<WriteChunk<'a>> {
        let start = *r;
        let count = r.read_u32()? as usize;
        if count > MAX_CHUNK_SEGMENTS {
            return Err(too_large("chunk segments", count, MAX_CHUNK_SEGMENTS));
        }
        r.skip(count * Segment::LEN)?;
        Ok(WriteChunk::Wire(WireSegments {
            bytes: consumed(&start, r)?,
            count,
        }))
    }

    pub(super) fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        match self {
            WriteChunk::Wire(c) => w.write_opaque_fixed(c.bytes),
            WriteChunk::Slice(s) => {
                w.write_count(s.len(), MAX_CHUNK_SEGMENTS as u32)?;
                s.iter().try_for_each(|seg| seg.write(w))
            }
        }
    }
}

impl<'a> From<&'a [Segment]> for WriteChunk<'a> {
    fn from(s: &'a [Segment]) -> Self {
        WriteChunk::Slice(s)
    }
}

impl<'a> IntoIterator for WriteChunk<'a> {
    type Item = Segment;
    type IntoIter = Segments<'a>;
    fn into_iter(self) -> Segments<'a> {
        self.iter()
    }
}

impl PartialEq for WriteChunk<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for WriteChunk<'_> {}

impl core::fmt::Debug for WriteChunk<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl core::fmt::Debug for WireSegments<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&WriteChunk::Wire(*self), f)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for WriteChunk<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> core::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// Iterator over the plain segments of a [`WriteChunk`].
#[derive(Clone, Debug)]
pub struct Segments<'a>(SegIter<'a>);

#[derive(Clone, Debug)]
enum SegIter<'a> {
    Wire {
        bytes: &'a [u8],
        next: usize,
        count: usize,
    },
    Slice(core::slice::Iter<'a, Segment>),
}

impl Iterator for Segments<'_> {
    type Item = Segment;
    fn next(&mut self) -> Option<Segment> {
        match &mut self.0 {
            SegIter::Wire { bytes, next, count } => {
                if *next >= *count {
                    return None;
                }
                // Count word, then HLOO, 16 octets each.
                let off = next.checked_mul(Segment::LEN)?.checked_add(4)?;
                *next += 1;
                Segment::parse(bytes.get(off..)?).ok()
            }
            SegIter::Slice(it) => it.next().copied(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.0 {
            SegIter::Wire { next, count, .. } => count.saturating_sub(*next),
            SegIter::Slice(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segments<'_> {}

/// A Write list as received: its XDR octets (`1 n HLOO.. 1 m HLOO.. 0`).
#[derive(Clone, Copy)]
pub struct WireWriteList<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> WireWriteList<'a> {
    /// The list's XDR encoding, terminator included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// RFC 8166 §4.3.2 Write list: `xdr_write_list *rdma_writes`, each Write chunk
/// preceded by `1`, terminated by `0` (`1 3 HLOO HLOO HLOO 1 2 HLOO HLOO 0`).
#[derive(Clone, Copy)]
pub enum WriteList<'a> {
    /// Octets of a received header, decoded lazily.
    Wire(WireWriteList<'a>),
    /// The caller's own chunks, for emitting.
    Slice(&'a [WriteChunk<'a>]),
}

impl<'a> WriteList<'a> {
    /// The empty list (`0`).
    pub const EMPTY: WriteList<'static> = WriteList::Slice(&[]);

    /// Number of Write chunks.
    pub fn len(&self) -> usize {
        match self {
            WriteList::Wire(w) => w.count,
            WriteList::Slice(s) => s.len(),
        }
    }

    /// True for the empty list.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The chunks in list order.
    pub fn iter(&self) -> WriteChunks<'a> {
        match *self {
            WriteList::Wire(w) => WriteChunks(ChunkIter::Wire {
                bytes: w.bytes,
                off: 0,
                left: w.count,
            }),
            WriteList::Slice(s) => WriteChunks(ChunkIter::Slice(s.iter())),
        }
    }

    /// Encoded size: per chunk its discriminator and encoding, then the terminator.
    pub fn buffer_len(&self) -> usize {
        match self {
            WriteList::Wire(w) => w.bytes.len(),
            WriteList::Slice(s) => s.iter().fold(4usize, |n, c| {
                n.saturating_add(4).saturating_add(c.buffer_len())
            }),
        }
    }

    /// Bounds, as `parse` enforces them.
    pub fn check(&self) -> Result<()> {
        match self {
            WriteList::Wire(_) => Ok(()),
            WriteList::Slice(s) => {
                if s.len() > MAX_WRITE_CHUNKS {
                    return Err(too_large("write chunks", s.len(), MAX_WRITE_CHUNKS));
                }
                s.iter().try_for_each(WriteChunk::check)
            }
        }
    }

    // pub(super) here and on write: Chunks (chunks.rs) reads and writes the list.
    pub(super) fn parse(r: &mut XdrReader<'a>) -> Result<WriteList<'a>> {
        let start = *r;
        let mut count = 0;
        while read_present(r, "write list discriminator")? {
            if count == MAX_WRITE_CHUNKS {
                return Err(too_large("write chunks", count + 1, MAX_WRITE_CHUNKS));
            }
            WriteChunk::parse(r)?;
            count += 1;
        }
        Ok(WriteList::Wire(WireWriteList {
            bytes: consumed(&start, r)?,
            count,
        }))
    }

    pub(super) fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        match self {
            WriteList::Wire(l) => w.write_opaque_fixed(l.bytes),
            WriteList::Slice(s) => {
                for c in s.iter() {
                    w.write_bool(true)?;
                    c.write(w)?;
                }
                w.write_bool(false)
            }
        }
    }
}

impl<'a> From<&'a [WriteChunk<'a>]> for WriteList<'a> {
    fn from(s: &'a [WriteChunk<'a>]) -> Self {
        WriteList::Slice(s)
    }
}

impl<'a> IntoIterator for WriteList<'a> {
    type Item = WriteChunk<'a>;
    type IntoIter = WriteChunks<'a>;
    fn into_iter(self) -> WriteChunks<'a> {
        self.iter()
    }
}

impl PartialEq for WriteList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for WriteList<'_> {}

impl core::fmt::Debug for WriteList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl core::fmt::Debug for WireWriteList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&WriteList::Wire(*self), f)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for WriteList<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> core::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// Iterator over the Write chunks of a [`WriteList`].
#[derive(Clone, Debug)]
pub struct WriteChunks<'a>(ChunkIter<'a>);

#[derive(Clone, Debug)]
enum ChunkIter<'a> {
    Wire {
        bytes: &'a [u8],
        off: usize,
        left: usize,
    },
    Slice(core::slice::Iter<'a, WriteChunk<'a>>),
}

impl<'a> Iterator for WriteChunks<'a> {
    type Item = WriteChunk<'a>;
    fn next(&mut self) -> Option<WriteChunk<'a>> {
        match &mut self.0 {
            ChunkIter::Wire { bytes, off, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // `1`, then the chunk: count word and `count` segments.
                let rest = bytes.get(*off..)?;
                let count = XdrReader::new(rest.get(4..)?).read_u32().ok()? as usize;
                let len = count.checked_mul(Segment::LEN)?.checked_add(4)?;
                let chunk = rest.get(4..4 + len)?;
                *off += 4 + len;
                Some(WriteChunk::Wire(WireSegments {
                    bytes: chunk,
                    count,
                }))
            }
            ChunkIter::Slice(it) => it.next().copied(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.0 {
            ChunkIter::Wire { left, .. } => *left,
            ChunkIter::Slice(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for WriteChunks<'_> {}

#[cfg(test)]
mod tests;
