//! The Read list (RFC 8166 §4.3.1): read segments, decoded lazily from a received header
//! or taken from the caller's array.

use super::segment::ReadSegment;
use super::{LAYER, consumed, read_present, too_large};
use crate::Result;
use crate::xdr::{XdrReader, XdrWriter};

/// Most read segments accepted in one Read list (see the module doc).
pub const MAX_READ_SEGMENTS: usize = 64;

/// A Read list as received: its XDR octets (`1 PHLOO ... 0`), validated.
#[derive(Clone, Copy)]
pub struct WireReadList<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> WireReadList<'a> {
    /// The list's XDR encoding, terminator included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// RFC 8166 §4.3.1 Read list: `xdr_read_list *rdma_reads`, each entry one read
/// segment preceded by `1`, terminated by `0` (`1 PHLOO 1 PHLOO 0`; empty = `0`).
/// Consecutive segments with the same Position form one Read chunk.
#[derive(Clone, Copy)]
pub enum ReadList<'a> {
    /// Octets of a received header, decoded lazily.
    Wire(WireReadList<'a>),
    /// The caller's own segments, for emitting.
    Slice(&'a [ReadSegment]),
}

impl<'a> ReadList<'a> {
    /// The empty list (`0`).
    pub const EMPTY: ReadList<'static> = ReadList::Slice(&[]);

    /// Number of read segments.
    pub fn len(&self) -> usize {
        match self {
            ReadList::Wire(w) => w.count,
            ReadList::Slice(s) => s.len(),
        }
    }

    /// True for the empty list.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments in list order.
    pub fn iter(&self) -> ReadSegments<'a> {
        match *self {
            ReadList::Wire(w) => ReadSegments(ReadIter::Wire {
                bytes: w.bytes,
                next: 0,
                count: w.count,
            }),
            ReadList::Slice(s) => ReadSegments(ReadIter::Slice(s.iter())),
        }
    }

    /// RPCRDMA-32: a non-empty list whose every segment has Position 0 (a
    /// Position-Zero Read chunk, carrying a whole Call: Long Call).
    pub fn is_position_zero(&self) -> bool {
        !self.is_empty() && self.iter().all(|s| s.position == 0)
    }

    /// Encoded size: 24 octets per segment plus the terminator.
    pub fn buffer_len(&self) -> usize {
        match self {
            ReadList::Wire(w) => w.bytes.len(),
            ReadList::Slice(s) => s
                .len()
                .saturating_mul(4 + ReadSegment::LEN)
                .saturating_add(4),
        }
    }

    /// Bounds and Position alignment, as `parse` enforces them.
    pub fn check(&self) -> Result<()> {
        match self {
            ReadList::Wire(_) => Ok(()),
            ReadList::Slice(s) => {
                if s.len() > MAX_READ_SEGMENTS {
                    return Err(too_large("read segments", s.len(), MAX_READ_SEGMENTS));
                }
                s.iter().try_for_each(ReadSegment::check)
            }
        }
    }

    // pub(super) here and on write: Chunks (chunks.rs) reads and writes the list.
    pub(super) fn parse(r: &mut XdrReader<'a>) -> Result<ReadList<'a>> {
        let start = *r;
        let mut count = 0;
        while read_present(r, "read list discriminator")? {
            if count == MAX_READ_SEGMENTS {
                return Err(too_large("read segments", count + 1, MAX_READ_SEGMENTS));
            }
            ReadSegment::read(r)?;
            count += 1;
        }
        Ok(ReadList::Wire(WireReadList {
            bytes: consumed(&start, r)?,
            count,
        }))
    }

    pub(super) fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        match self {
            ReadList::Wire(l) => w.write_opaque_fixed(l.bytes),
            ReadList::Slice(s) => {
                for seg in s.iter() {
                    w.write_bool(true)?;
                    seg.write(w)?;
                }
                w.write_bool(false)
            }
        }
    }
}

impl<'a> From<&'a [ReadSegment]> for ReadList<'a> {
    fn from(s: &'a [ReadSegment]) -> Self {
        ReadList::Slice(s)
    }
}

impl<'a> IntoIterator for ReadList<'a> {
    type Item = ReadSegment;
    type IntoIter = ReadSegments<'a>;
    fn into_iter(self) -> ReadSegments<'a> {
        self.iter()
    }
}

impl PartialEq for ReadList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for ReadList<'_> {}

impl core::fmt::Debug for ReadList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl core::fmt::Debug for WireReadList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&ReadList::Wire(*self), f)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for ReadList<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> core::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// Iterator over the read segments of a [`ReadList`].
#[derive(Clone, Debug)]
pub struct ReadSegments<'a>(ReadIter<'a>);

#[derive(Clone, Debug)]
enum ReadIter<'a> {
    Wire {
        bytes: &'a [u8],
        next: usize,
        count: usize,
    },
    Slice(core::slice::Iter<'a, ReadSegment>),
}

impl Iterator for ReadSegments<'_> {
    type Item = ReadSegment;
    fn next(&mut self) -> Option<ReadSegment> {
        match &mut self.0 {
            ReadIter::Wire { bytes, next, count } => {
                if *next >= *count {
                    return None;
                }
                // Entry i: `1` then PHLOO, 24 octets each.
                let off = next.checked_mul(4 + ReadSegment::LEN)?.checked_add(4)?;
                *next += 1;
                let mut r = XdrReader::with_layer(bytes.get(off..)?, LAYER);
                ReadSegment::read(&mut r).ok()
            }
            ReadIter::Slice(it) => it.next().copied(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.0 {
            ReadIter::Wire { next, count, .. } => count.saturating_sub(*next),
            ReadIter::Slice(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for ReadSegments<'_> {}

#[cfg(test)]
mod tests;
