//! RPC-over-RDMA Version One transport header (RFC 8166 §4) and the RDMA-CM
//! private data that RFC 8797 adds to it.
//!
//! An RPC-over-RDMA message is the Transport stream (this header) followed,
//! for `RDMA_MSG` only, by the Payload stream (the RPC message, starting with
//! its XID). [`Repr::parse`] returns the header length so the caller finds the
//! Payload stream; [`Header`] reads only the first four words, whose layout is
//! fixed across all versions (RFC 8166 §7, RPCRDMA-77), so a Responder can
//! answer `ERR_VERS` to a version it cannot parse.
//!
//! Chunk lists are never copied: a parsed list borrows the received octets
//! (validated once, decoded lazily by its iterator), and a list to emit can be
//! the caller's own array ([`ReadList::Slice`], [`WriteChunk::Slice`],
//! [`WriteList::Slice`]). Both compare equal when their entries are equal, so
//! `parse` followed by `emit` is byte-identical.
//!
//! Bounds against hostile input (`Error::TooLarge` past them):
//! [`MAX_READ_SEGMENTS`], [`MAX_WRITE_CHUNKS`], [`MAX_CHUNK_SEGMENTS`], all 64.
//! Linux's client (xprtrdma, `xprt_rdma.h`) caps the segments it puts in a
//! header's chunk lists at `RPCRDMA_MAX_HDR_SEGS` = 16 (8, then 12, in older
//! kernels); its server (svcrdma) bounds them only by the Receive buffer,
//! about 40 read or 60 plain segments per KiB of inline threshold. 64 is four
//! times what Linux sends and lets a 4 KiB header be used in full, while a
//! forged count (checked before any segment is read) can no longer make a
//! receiver walk or reserve an unbounded list.

use crate::error::need;
use crate::field::{be32, set_be32};
use crate::macros::wire_enum;
use crate::xdr::{XdrReader, XdrWriter};
use crate::{Error, Layer, Result};

const LAYER: Layer = Layer::RpcRdma;

/// RFC 8166 §4.2.2: `rdma_vers` of this protocol (RPCRDMA-39).
pub const RPCRDMA_VERSION: u32 = 1;
/// RFC 8166 §4.2: the four fixed words `rdma_xid, rdma_vers, rdma_credit, rdma_proc`.
pub const FIXED_LEN: usize = 16;
/// RFC 8166 §4.5: shortest valid message: the fixed words and three empty
/// chunk lists (RPCRDMA-56).
pub const MIN_HEADER_LEN: usize = 28;
/// RFC 8166 §4.5.2: an `RDMA_ERROR` carrying `ERR_CHUNK` is 20 octets
/// (rpc-rdma.md §11: accepted although below [`MIN_HEADER_LEN`]).
pub const ERR_CHUNK_LEN: usize = 20;
/// RFC 8166 §4.5.1: an `RDMA_ERROR` carrying `ERR_VERS` is 28 octets.
pub const ERR_VERS_LEN: usize = 28;
/// Most read segments accepted in one Read list (see the module doc).
pub const MAX_READ_SEGMENTS: usize = 64;
/// Most Write chunks accepted in one Write list (see the module doc).
pub const MAX_WRITE_CHUNKS: usize = 64;
/// Most plain segments accepted in one Write chunk or Reply chunk.
pub const MAX_CHUNK_SEGMENTS: usize = 64;
/// RFC 8166 §3.3.3: inline threshold assumed without RFC 8797 private data.
pub const DEFAULT_INLINE_THRESHOLD: u32 = 1024;

mod field {
    // RFC 8166 §4.2: the fixed part of every RPC-over-RDMA header.
    pub const XID: usize = 0;
    pub const VERS: usize = 4;
    pub const CREDIT: usize = 8;
    pub const PROC: usize = 12;
    /// First word of the body: `rdma_err` in an RDMA_ERROR.
    pub const BODY: usize = 16;
}

wire_enum! {
    /// RFC 8166 §4.2.4: `enum rdma_proc`.
    pub enum Proc: u32 => (LAYER, "rdma_proc") {
        /// `RDMA_MSG` (0): header, chunk lists, then the Payload stream.
        Msg = 0,
        /// `RDMA_NOMSG` (1): header and chunk lists only (Long Call / Long Reply).
        NoMsg = 1,
        /// `RDMA_MSGP` (2): obsolete padded form, never sent (RPCRDMA-69).
        MsgP = 2,
        /// `RDMA_DONE` (3): obsolete, never sent (RPCRDMA-70).
        Done = 3,
        /// `RDMA_ERROR` (4): sent by Responders only (RPCRDMA-42).
        Error = 4,
    }
}

wire_enum! {
    /// RFC 8166 §4.2.4: `enum rpc_rdma_errcode`.
    pub enum ErrCode: u32 => (LAYER, "rdma_err") {
        /// `ERR_VERS` (1): value fixed across versions (RFC 8166 §7).
        Vers = 1,
        /// `ERR_CHUNK` (2).
        Chunk = 2,
    }
}

/// A view of the fixed part of any RPC-over-RDMA header (RFC 8166 §4.2): the
/// four words every version keeps in place (RFC 8166 §7, RPCRDMA-77).
#[derive(Debug, Clone)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wrap without checking; accessors may panic on fewer than 16 octets.
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wrap, checking that the four fixed words are present (16 octets).
    /// This does not apply the 28-octet rule: see [`check_message_len`](Self::check_message_len).
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` unless the four fixed words are present.
    pub fn check_len(&self) -> Result<()> {
        need(LAYER, self.buffer.as_ref(), FIXED_LEN)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// RFC 8166 §4.2.1: `rdma_xid`, the XID of the carried RPC message.
    pub fn rdma_xid(&self) -> u32 {
        be32(self.buffer.as_ref(), field::XID)
    }

    /// RFC 8166 §4.2.2: `rdma_vers`.
    pub fn rdma_vers(&self) -> u32 {
        be32(self.buffer.as_ref(), field::VERS)
    }

    /// RFC 8166 §4.2.3: `rdma_credit` (requested in a Call, granted in a Reply).
    pub fn rdma_credit(&self) -> u32 {
        be32(self.buffer.as_ref(), field::CREDIT)
    }

    /// RFC 8166 §4.2.4: the `rdma_proc` discriminator, raw (any version).
    pub fn rdma_proc(&self) -> u32 {
        be32(self.buffer.as_ref(), field::PROC)
    }

    /// The octets after the fixed part.
    pub fn body(&self) -> &[u8] {
        self.buffer.as_ref().get(FIXED_LEN..).unwrap_or(&[])
    }

    /// Shortest acceptable message for this header (rpc-rdma.md §11): 20
    /// octets for `RDMA_ERROR`/`ERR_CHUNK`, 28 for everything else
    /// (`ERR_VERS` included; an `RDMA_ERROR` too short to hold `rdma_err`
    /// needs at least 20).
    pub fn min_message_len(&self) -> usize {
        let b = self.buffer.as_ref();
        if b.len() < FIXED_LEN || self.rdma_proc() != u32::from(Proc::Error) {
            return MIN_HEADER_LEN;
        }
        match b.get(field::BODY..field::BODY + 4) {
            None => ERR_CHUNK_LEN,
            Some(_) if be32(b, field::BODY) == u32::from(ErrCode::Chunk) => ERR_CHUNK_LEN,
            Some(_) => ERR_VERS_LEN,
        }
    }

    /// RPCRDMA-56: `Err(Truncated)` for a message the receiver must discard
    /// unparsed (shorter than [`min_message_len`](Self::min_message_len)).
    pub fn check_message_len(&self) -> Result<()> {
        self.check_len()?;
        need(LAYER, self.buffer.as_ref(), self.min_message_len())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Set `rdma_xid`.
    pub fn set_rdma_xid(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::XID, v)
    }
    /// Set `rdma_vers`.
    pub fn set_rdma_vers(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::VERS, v)
    }
    /// Set `rdma_credit`.
    pub fn set_rdma_credit(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::CREDIT, v)
    }
    /// Set `rdma_proc`.
    pub fn set_rdma_proc(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::PROC, v)
    }
}

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

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
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

    fn read(r: &mut XdrReader<'_>) -> Result<ReadSegment> {
        let position = r.read_u32()?;
        let s = ReadSegment::new(position, Segment::read(r)?);
        s.check()?;
        Ok(s)
    }

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        w.write_u32(self.position)?;
        self.target().write(w)
    }
}

// ---------------------------------------------------------------------------
// Chunk lists (RFC 8166 §4.3, rpc-rdma.md §4.2)
// ---------------------------------------------------------------------------

/// Read the "is present" word of an XDR optional-data (RFC 4506 §4.19).
fn read_present(r: &mut XdrReader<'_>, field: &'static str) -> Result<bool> {
    match r.read_u32()? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Error::Unknown {
            layer: LAYER,
            field,
            value: v.into(),
        }),
    }
}

/// The octets a reader consumed since it was at `start` (a copy of it).
fn consumed<'a>(start: &XdrReader<'a>, now: &XdrReader<'a>) -> Result<&'a [u8]> {
    let len = now.position().saturating_sub(start.position());
    start.rest().get(..len).ok_or(Error::Malformed {
        layer: LAYER,
        reason: "reader went backwards",
    })
}

fn too_large(what: &'static str, value: usize, limit: usize) -> Error {
    Error::TooLarge {
        layer: LAYER,
        what,
        value: value as u64,
        limit: limit as u64,
    }
}

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

    fn parse(r: &mut XdrReader<'a>) -> Result<ReadList<'a>> {
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

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
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

    fn parse(r: &mut XdrReader<'a>) -> Result<WriteChunk<'a>> {
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

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
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

    fn parse(r: &mut XdrReader<'a>) -> Result<WriteList<'a>> {
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

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
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

/// The three chunk lists of `RDMA_MSG`, `RDMA_NOMSG` and `RDMA_MSGP`
/// (RFC 8166 §4.1.2 `rpc_rdma_header`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Chunks<'a> {
    /// `rdma_reads`: Read list (always empty in replies, RPCRDMA-44).
    pub read_list: ReadList<'a>,
    /// `rdma_writes`: Write list.
    pub write_list: WriteList<'a>,
    /// `rdma_reply`: optional Reply chunk (`0`, or `1` + a Write chunk).
    pub reply_chunk: Option<WriteChunk<'a>>,
}

impl Chunks<'static> {
    /// No chunks at all: `0 0 0`.
    pub const NONE: Chunks<'static> = Chunks {
        read_list: ReadList::EMPTY,
        write_list: WriteList::EMPTY,
        reply_chunk: None,
    };
}

impl<'a> Chunks<'a> {
    /// True when all three lists are empty / absent.
    pub fn is_empty(&self) -> bool {
        self.read_list.is_empty() && self.write_list.is_empty() && self.reply_chunk.is_none()
    }

    /// Encoded size of the three lists.
    pub fn buffer_len(&self) -> usize {
        let reply = match &self.reply_chunk {
            None => 4,
            Some(c) => c.buffer_len().saturating_add(4),
        };
        self.read_list
            .buffer_len()
            .saturating_add(self.write_list.buffer_len())
            .saturating_add(reply)
    }

    /// Bounds and Position alignment, as `parse` enforces them.
    pub fn check(&self) -> Result<()> {
        self.read_list.check()?;
        self.write_list.check()?;
        if let Some(c) = &self.reply_chunk {
            c.check()?;
        }
        Ok(())
    }

    fn parse(r: &mut XdrReader<'a>) -> Result<Chunks<'a>> {
        let read_list = ReadList::parse(r)?;
        let write_list = WriteList::parse(r)?;
        let reply_chunk = if read_present(r, "reply chunk discriminator")? {
            Some(WriteChunk::parse(r)?)
        } else {
            None
        };
        Ok(Chunks {
            read_list,
            write_list,
            reply_chunk,
        })
    }

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        self.read_list.write(w)?;
        self.write_list.write(w)?;
        match &self.reply_chunk {
            None => w.write_bool(false),
            Some(c) => {
                w.write_bool(true)?;
                c.write(w)
            }
        }
    }

    /// RPCRDMA-41: an `RDMA_NOMSG` carries its Payload stream in a chunk, so it
    /// needs a Read list (Long Call) or a Reply chunk (Long Reply).
    fn check_nomsg(&self) -> Result<()> {
        if self.read_list.is_empty() && self.reply_chunk.is_none() {
            return Err(Error::Malformed {
                layer: LAYER,
                reason: "RDMA_NOMSG without a Read list or Reply chunk (RFC 8166 §4.2.4)",
            });
        }
        Ok(())
    }
}

impl Default for Chunks<'_> {
    fn default() -> Self {
        Chunks::NONE
    }
}

/// RFC 8166 §4.2.4 `union rpc_rdma_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum ErrorBody {
    /// `ERR_VERS`: the inclusive range of versions the Responder supports
    /// (`rpc_rdma_errvers`, layout fixed across versions).
    Vers {
        rdma_vers_low: u32,
        rdma_vers_high: u32,
    },
    /// `ERR_CHUNK`: a header (XDR) error; void.
    Chunk,
}

impl core::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ErrorBody::Vers {
                rdma_vers_low,
                rdma_vers_high,
            } => write!(f, "ERR_VERS (versions {rdma_vers_low} to {rdma_vers_high})"),
            ErrorBody::Chunk => f.write_str("ERR_CHUNK"),
        }
    }
}

impl ErrorBody {
    /// The `rdma_err` code.
    pub fn code(&self) -> ErrCode {
        match self {
            ErrorBody::Vers { .. } => ErrCode::Vers,
            ErrorBody::Chunk => ErrCode::Chunk,
        }
    }
}

/// RFC 8166 §4.2.4 `union rdma_body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Body<'a> {
    /// `RDMA_MSG`: chunk lists; the Payload stream follows the header.
    Msg(Chunks<'a>),
    /// `RDMA_NOMSG`: chunk lists only (RPCRDMA-41: a Read list or Reply chunk).
    NoMsg(Chunks<'a>),
    /// `RDMA_MSGP` (`rpc_rdma_header_padded`): parsed for reporting only;
    /// `emit` refuses it (RPCRDMA-69).
    MsgP {
        rdma_align: u32,
        rdma_thresh: u32,
        chunks: Chunks<'a>,
    },
    /// `RDMA_DONE`: void; parsed for reporting only (RPCRDMA-70).
    Done,
    /// `RDMA_ERROR`.
    Error(ErrorBody),
}

impl<'a> Body<'a> {
    /// The `rdma_proc` value.
    pub fn proc(&self) -> Proc {
        match self {
            Body::Msg(_) => Proc::Msg,
            Body::NoMsg(_) => Proc::NoMsg,
            Body::MsgP { .. } => Proc::MsgP,
            Body::Done => Proc::Done,
            Body::Error(_) => Proc::Error,
        }
    }

    /// The chunk lists, for the procedures that carry them.
    pub fn chunks(&self) -> Option<&Chunks<'a>> {
        match self {
            Body::Msg(c) | Body::NoMsg(c) | Body::MsgP { chunks: c, .. } => Some(c),
            Body::Done | Body::Error(_) => None,
        }
    }

    fn buffer_len(&self) -> usize {
        match self {
            Body::Msg(c) | Body::NoMsg(c) => c.buffer_len(),
            Body::MsgP { chunks, .. } => chunks.buffer_len().saturating_add(8),
            Body::Done => 0,
            Body::Error(ErrorBody::Vers { .. }) => 12,
            Body::Error(ErrorBody::Chunk) => 4,
        }
    }
}

/// An RPC-over-RDMA Version One header (RFC 8166 §4.1.2 `struct rdma_msg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr<'a> {
    /// `rdma_xid`: equals the XID of the carried RPC message (RPCRDMA-38).
    pub rdma_xid: u32,
    /// `rdma_vers`: 1, except in an `ERR_VERS` reply, which echoes the
    /// version of the failing message (RPCRDMA-59).
    pub rdma_vers: u32,
    /// `rdma_credit`: requested (Call) or granted (Reply) credits (RPCRDMA-40).
    pub rdma_credit: u32,
    /// `rdma_body`.
    pub body: Body<'a>,
}

impl<'a> Repr<'a> {
    /// Parse a received RPC-over-RDMA message. Returns the header and its
    /// length: for `RDMA_MSG` the Payload stream starts there.
    ///
    /// Errors, and what a receiver does with them (RFC 8166 §4.5):
    /// * `Truncated` because [`Header::check_message_len`] fails (under 28
    ///   octets, 20 for `ERR_CHUNK`): discard silently (RPCRDMA-56);
    /// * `Truncated` past that (chunk lists longer than the message), or
    ///   `TooLarge` (a bound exceeded): an XDR error, `ERR_CHUNK` for a Call;
    /// * `Unknown { field: "rdma_vers" }`: answer `ERR_VERS` using [`Header`]
    ///   (RPCRDMA-62); an `ERR_VERS` reply itself parses with any version;
    /// * any other error on a known version: answer `ERR_CHUNK` (RPCRDMA-63);
    /// * an `RDMA_ERROR` that does not parse is discarded (RPCRDMA-61).
    ///
    /// Octets after an `RDMA_NOMSG`, `RDMA_DONE` or `RDMA_ERROR` header are
    /// not looked at.
    pub fn parse(buf: &'a [u8]) -> Result<(Repr<'a>, usize)> {
        let h = Header::new_checked(buf)?;
        h.check_message_len()?;
        let mut r = XdrReader::with_layer(buf, LAYER);
        let rdma_xid = r.read_u32()?;
        let rdma_vers = r.read_u32()?;
        let rdma_credit = r.read_u32()?;
        let proc_raw = r.read_u32()?;
        // RFC 8166 §7: only ERR_VERS keeps its layout in every version.
        let is_err_vers = proc_raw == u32::from(Proc::Error)
            && XdrReader::new(h.body()).read_u32().ok() == Some(u32::from(ErrCode::Vers));
        if rdma_vers != RPCRDMA_VERSION && !is_err_vers {
            return Err(Error::Unknown {
                layer: LAYER,
                field: "rdma_vers",
                value: rdma_vers.into(),
            });
        }
        let body = match Proc::try_from(proc_raw)? {
            Proc::Msg => Body::Msg(Chunks::parse(&mut r)?),
            Proc::NoMsg => {
                let c = Chunks::parse(&mut r)?;
                c.check_nomsg()?;
                Body::NoMsg(c)
            }
            Proc::MsgP => {
                let rdma_align = r.read_u32()?;
                let rdma_thresh = r.read_u32()?;
                Body::MsgP {
                    rdma_align,
                    rdma_thresh,
                    chunks: Chunks::parse(&mut r)?,
                }
            }
            Proc::Done => Body::Done,
            Proc::Error => Body::Error(match ErrCode::try_from(r.read_u32()?)? {
                ErrCode::Vers => ErrorBody::Vers {
                    rdma_vers_low: r.read_u32()?,
                    rdma_vers_high: r.read_u32()?,
                },
                ErrCode::Chunk => ErrorBody::Chunk,
            }),
        };
        let repr = Repr {
            rdma_xid,
            rdma_vers,
            rdma_credit,
            body,
        };
        Ok((repr, r.position()))
    }

    /// Header length in octets (what `parse` returned, what `emit` writes).
    pub fn buffer_len(&self) -> usize {
        FIXED_LEN.saturating_add(self.body.buffer_len())
    }

    /// Everything `emit` requires beyond buffer room: the version (1 unless
    /// `ERR_VERS`), the bounds and Position alignment `parse` enforces, the
    /// `RDMA_NOMSG` rule, and no `RDMA_MSGP`/`RDMA_DONE` (never sent).
    pub fn check(&self) -> Result<()> {
        let err_vers = matches!(self.body, Body::Error(ErrorBody::Vers { .. }));
        if self.rdma_vers != RPCRDMA_VERSION && !err_vers {
            return Err(Error::Unknown {
                layer: LAYER,
                field: "rdma_vers",
                value: self.rdma_vers.into(),
            });
        }
        match &self.body {
            Body::Msg(c) => c.check(),
            Body::NoMsg(c) => {
                c.check()?;
                c.check_nomsg()
            }
            Body::MsgP { .. } => Err(Error::Malformed {
                layer: LAYER,
                reason: "RDMA_MSGP is never sent (RFC 8166 §4.6.1)",
            }),
            Body::Done => Err(Error::Malformed {
                layer: LAYER,
                reason: "RDMA_DONE is never sent (RFC 8166 §4.6.2)",
            }),
            Body::Error(_) => Ok(()),
        }
    }

    /// Write the header: exactly `buffer_len()` octets. `Truncated` if `buf`
    /// is shorter; see [`check`](Self::check) for the other errors. Nothing is
    /// written unless the whole header is valid and fits.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        need(LAYER, buf, self.buffer_len())?;
        let mut w = XdrWriter::with_layer(buf, LAYER);
        w.write_u32(self.rdma_xid)?;
        w.write_u32(self.rdma_vers)?;
        w.write_u32(self.rdma_credit)?;
        w.write_enum(self.body.proc())?;
        match &self.body {
            Body::Msg(c) | Body::NoMsg(c) => c.write(&mut w)?,
            Body::MsgP {
                rdma_align,
                rdma_thresh,
                chunks,
            } => {
                w.write_u32(*rdma_align)?;
                w.write_u32(*rdma_thresh)?;
                chunks.write(&mut w)?;
            }
            Body::Done => {}
            Body::Error(e) => {
                w.write_enum(e.code())?;
                if let ErrorBody::Vers {
                    rdma_vers_low,
                    rdma_vers_high,
                } = e
                {
                    w.write_u32(*rdma_vers_low)?;
                    w.write_u32(*rdma_vers_high)?;
                }
            }
        }
        Ok(w.finish())
    }

    /// The `rdma_proc` of the body.
    pub fn proc(&self) -> Proc {
        self.body.proc()
    }

    /// The chunk lists, for the procedures that carry them.
    pub fn chunks(&self) -> Option<&Chunks<'a>> {
        self.body.chunks()
    }

    /// An `RDMA_MSG` header.
    pub const fn msg(rdma_xid: u32, rdma_credit: u32, chunks: Chunks<'a>) -> Repr<'a> {
        Repr {
            rdma_xid,
            rdma_vers: RPCRDMA_VERSION,
            rdma_credit,
            body: Body::Msg(chunks),
        }
    }

    /// An `RDMA_NOMSG` header.
    pub const fn nomsg(rdma_xid: u32, rdma_credit: u32, chunks: Chunks<'a>) -> Repr<'a> {
        Repr {
            rdma_xid,
            rdma_vers: RPCRDMA_VERSION,
            rdma_credit,
            body: Body::NoMsg(chunks),
        }
    }

    /// RPCRDMA-59, RPCRDMA-62: the `ERR_VERS` answer to `failing` (its
    /// `rdma_xid` and `rdma_vers` echoed, supported range 1..=1).
    pub fn err_vers<T: AsRef<[u8]>>(failing: &Header<T>, rdma_credit: u32) -> Repr<'static> {
        Repr {
            rdma_xid: failing.rdma_xid(),
            rdma_vers: failing.rdma_vers(),
            rdma_credit,
            body: Body::Error(ErrorBody::Vers {
                rdma_vers_low: RPCRDMA_VERSION,
                rdma_vers_high: RPCRDMA_VERSION,
            }),
        }
    }

    /// RPCRDMA-59, RPCRDMA-63: the `ERR_CHUNK` answer to `failing`.
    pub fn err_chunk<T: AsRef<[u8]>>(failing: &Header<T>, rdma_credit: u32) -> Repr<'static> {
        Repr {
            rdma_xid: failing.rdma_xid(),
            rdma_vers: failing.rdma_vers(),
            rdma_credit,
            body: Body::Error(ErrorBody::Chunk),
        }
    }

    /// RPCRDMA-38: `Ok` when the Payload stream of an `RDMA_MSG` starts with
    /// `rdma_xid`; a mismatch is an XDR error (`ERR_CHUNK`, RFC 8166 §4.5.2).
    pub fn check_payload_xid(&self, payload: &[u8]) -> Result<()> {
        need(LAYER, payload, 4)?;
        if be32(payload, 0) != self.rdma_xid {
            return Err(Error::Malformed {
                layer: LAYER,
                reason: "rdma_xid differs from the RPC message XID (RFC 8166 §4.2.1)",
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// RFC 8797: RDMA-CM private data for RPC-over-RDMA Version One
// ---------------------------------------------------------------------------

/// RFC 8797 §4: Format Identifier of the private data.
pub const PRIVATE_DATA_MAGIC: u32 = 0xF6AB_0E18;
/// RFC 8797 §4: the message is 8 octets.
pub const PRIVATE_DATA_LEN: usize = 8;
/// RFC 8797 §4: the Version this document defines.
pub const PRIVATE_DATA_VERSION: u8 = 1;
/// RFC 8797 §4: Flags bit 0, "Remote Invalidation" supported.
pub const PRIVATE_DATA_FLAG_REMOTE_INVALIDATE: u8 = 0x01;

mod pd_field {
    // RFC 8797 §4: Format Identifier (4), Version, Flags, Send Size, Receive Size.
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const FLAGS: usize = 5;
    pub const SEND_SIZE: usize = 6;
    pub const RECV_SIZE: usize = 7;
}

/// RFC 8797 §4: an encoded buffer size (`(code + 1) * 1024` octets) in octets.
pub const fn decode_buffer_size(code: u8) -> u32 {
    (code as u32 + 1) * 1024
}

/// RFC 8797 §4: the size code for a buffer of `octets`, rounded down to a
/// multiple of 1024 and clamped to 1 KiB..=256 KiB (never advertises more
/// than the buffer holds, except that 1 KiB is the smallest code).
pub const fn encode_buffer_size(octets: u32) -> u8 {
    let k = octets / 1024;
    let k = if k < 1 {
        1
    } else if k > 256 {
        256
    } else {
        k
    };
    (k - 1) as u8
}

/// A view of RFC 8797 private data (connect request/accept, MPA Request/Reply
/// after MPA's own IRD/ORD words).
#[derive(Debug, Clone)]
pub struct PrivateData<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> PrivateData<T> {
    /// Wrap without checking; accessors may panic on fewer than 8 octets.
    pub const fn new_unchecked(buffer: T) -> PrivateData<T> {
        PrivateData { buffer }
    }

    /// Wrap, checking there are 8 octets (the content is checked by
    /// [`PrivateDataRepr::parse`]).
    pub fn new_checked(buffer: T) -> Result<PrivateData<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// `Err(Truncated)` below 8 octets.
    pub fn check_len(&self) -> Result<()> {
        need(LAYER, self.buffer.as_ref(), PRIVATE_DATA_LEN)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Format Identifier (0xF6AB0E18 for this format).
    pub fn format_identifier(&self) -> u32 {
        be32(self.buffer.as_ref(), pd_field::MAGIC)
    }
    /// Version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[pd_field::VERSION]
    }
    /// Flags octet (bit 0: Remote Invalidation).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[pd_field::FLAGS]
    }
    /// Send Size code.
    pub fn send_size(&self) -> u8 {
        self.buffer.as_ref()[pd_field::SEND_SIZE]
    }
    /// Receive Size code.
    pub fn receive_size(&self) -> u8 {
        self.buffer.as_ref()[pd_field::RECV_SIZE]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PrivateData<T> {
    /// Set the Format Identifier.
    pub fn set_format_identifier(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), pd_field::MAGIC, v)
    }
    /// Set the Version.
    pub fn set_version(&mut self, v: u8) {
        self.buffer.as_mut()[pd_field::VERSION] = v
    }
    /// Set the Flags octet.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[pd_field::FLAGS] = v
    }
    /// Set the Send Size code.
    pub fn set_send_size(&mut self, v: u8) {
        self.buffer.as_mut()[pd_field::SEND_SIZE] = v
    }
    /// Set the Receive Size code.
    pub fn set_receive_size(&mut self, v: u8) {
        self.buffer.as_mut()[pd_field::RECV_SIZE] = v
    }
}

/// RFC 8797 private data, Version 1, decoded (EXT-RPC-01). Sizes are in
/// octets. (The Format Identifier and Version are constants here: `parse`
/// rejects others.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PrivateDataRepr {
    /// Flags, every bit kept (bit 0: Remote Invalidation).
    pub flags: u8,
    /// Largest Send the sender will post: 1024..=262144, a multiple of 1024.
    pub max_send_size: u32,
    /// Largest message its Receives accept: 1024..=262144, a multiple of 1024.
    pub max_receive_size: u32,
}

impl PrivateDataRepr {
    /// Version 1 private data; sizes are rounded down to a multiple of 1024
    /// and clamped to 1 KiB..=256 KiB.
    pub const fn new(max_send_size: u32, max_receive_size: u32, remote_invalidate: bool) -> Self {
        PrivateDataRepr {
            flags: if remote_invalidate {
                PRIVATE_DATA_FLAG_REMOTE_INVALIDATE
            } else {
                0
            },
            max_send_size: decode_buffer_size(encode_buffer_size(max_send_size)),
            max_receive_size: decode_buffer_size(encode_buffer_size(max_receive_size)),
        }
    }

    /// True when the sender can receive Send With Invalidate.
    pub const fn remote_invalidate(&self) -> bool {
        self.flags & PRIVATE_DATA_FLAG_REMOTE_INVALIDATE != 0
    }

    /// Parse the first 8 octets of `buf` (trailing octets, such as the zero
    /// fill of a CM REQ, are ignored). A different Format Identifier or an
    /// unknown Version is `Error::Unknown`: the peer then ignores the private
    /// data and assumes 1024-octet thresholds (RFC 8797 §4, RPCRDMA-10).
    pub fn parse(buf: &[u8]) -> Result<PrivateDataRepr> {
        let p = PrivateData::new_checked(buf)?;
        if p.format_identifier() != PRIVATE_DATA_MAGIC {
            return Err(Error::Unknown {
                layer: LAYER,
                field: "private data format identifier",
                value: p.format_identifier().into(),
            });
        }
        if p.version() != PRIVATE_DATA_VERSION {
            return Err(Error::Unknown {
                layer: LAYER,
                field: "private data version",
                value: p.version().into(),
            });
        }
        Ok(PrivateDataRepr {
            flags: p.flags(),
            max_send_size: decode_buffer_size(p.send_size()),
            max_receive_size: decode_buffer_size(p.receive_size()),
        })
    }

    /// Always 8.
    pub const fn buffer_len(&self) -> usize {
        PRIVATE_DATA_LEN
    }

    /// Write 8 octets. A size that no code encodes exactly is `Malformed`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let send = Self::code(self.max_send_size)?;
        let recv = Self::code(self.max_receive_size)?;
        need(LAYER, buf, PRIVATE_DATA_LEN)?;
        let mut p = PrivateData::new_unchecked(&mut buf[..PRIVATE_DATA_LEN]);
        p.set_format_identifier(PRIVATE_DATA_MAGIC);
        p.set_version(PRIVATE_DATA_VERSION);
        p.set_flags(self.flags);
        p.set_send_size(send);
        p.set_receive_size(recv);
        Ok(PRIVATE_DATA_LEN)
    }

    fn code(octets: u32) -> Result<u8> {
        let c = encode_buffer_size(octets);
        if decode_buffer_size(c) != octets {
            return Err(Error::Malformed {
                layer: LAYER,
                reason: "RFC 8797 size is not a multiple of 1024 in 1 KiB..=256 KiB",
            });
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onc_rpc::{self, AcceptedReplyData, MsgBody, OpaqueAuth, ReplyBody};
    use proptest::prelude::*;

    // Real RPC-over-RDMA messages: the payload of one RDMA Send, cut with
    // tshark/python from the NFS captures in `shared/captures/`. RoCE: after
    // the 12-octet BTH (and the 4-octet IETH of a Send with Invalidate);
    // iWARP: after the 18-octet untagged DDP header. Linux 6.12 xprtrdma
    // (client, credits 128) and svcrdma (server, credits 64).
    /// nfs3-rdma-rxe.pcap frame 26: NFSv3 NULL Call, RDMA_MSG (RC SEND Only)
    #[rustfmt::skip]
    const RXE_NULL_CALL: [u8; 68] = [
        0x26, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x26, 0x05, 0xb9, 0x83,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x86, 0xa3, 0x00, 0x00, 0x00, 0x03,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 28: NFSv3 NULL Reply, RDMA_MSG
    #[rustfmt::skip]
    const RXE_NULL_REPLY: [u8; 52] = [
        0x26, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x26, 0x05, 0xb9, 0x83,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 38: NFSv3 GETATTR Call, RDMA_MSG, no chunks
    #[rustfmt::skip]
    const RXE_GETATTR_CALL: [u8; 108] = [
        0x29, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x29, 0x05, 0xb9, 0x83,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x86, 0xa3, 0x00, 0x00, 0x00, 0x03,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e, 0x65, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x08, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 40: NFSv3 GETATTR Reply, RDMA_MSG, no chunks
    #[rustfmt::skip]
    const RXE_GETATTR_REPLY: [u8; 140] = [
        0x29, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x29, 0x05, 0xb9, 0x83,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x03, 0xff,
        0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x6b, 0x02, 0x60, 0x75, 0x1b, 0x39, 0xd6, 0xc2, 0x6b, 0x02, 0x60, 0x75,
        0x1b, 0x39, 0xd6, 0xc2, 0x6b, 0x02, 0x60, 0x75, 0x1b, 0x76, 0xdf, 0xc3,
    ];
    /// nfs3-rdma-rxe.pcap frame 68: NFSv3 WRITE Call, RDMA_MSG with a Read list
    #[rustfmt::skip]
    const RXE_WRITE_CALL: [u8; 164] = [
        0x30, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x0c, 0xb6, 0x00, 0x02, 0x00, 0x00,
        0x30, 0x05, 0xb9, 0x83, 0x44, 0xa6, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x30, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        0x00, 0x01, 0x86, 0xa3, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e,
        0x65, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x01, 0x00, 0x01, 0x01,
        0x01, 0x00, 0x00, 0x00, 0x0e, 0xae, 0x14, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 293: NFSv3 READ Call, RDMA_MSG with a Write list
    #[rustfmt::skip]
    const RXE_READ_CALL: [u8; 156] = [
        0x36, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x09, 0x35,
        0x00, 0x02, 0x00, 0x00, 0x36, 0x05, 0xb9, 0x83, 0x44, 0xa5, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x36, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        0x00, 0x01, 0x86, 0xa3, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e,
        0x65, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x01, 0x00, 0x01, 0x01,
        0x01, 0x00, 0x00, 0x00, 0x0e, 0xae, 0x14, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 426: NFSv3 READ Reply, RDMA_MSG with a Write list
    /// (RC SEND Only with Invalidate: after the 4-octet IETH)
    #[rustfmt::skip]
    const RXE_READ_REPLY: [u8; 180] = [
        0x36, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x09, 0x35,
        0x00, 0x02, 0x00, 0x00, 0x36, 0x05, 0xb9, 0x83, 0x44, 0xa5, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x36, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x01, 0xa4, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        0x6b, 0x02, 0x60, 0x7b, 0x10, 0xf9, 0x54, 0x73, 0x6b, 0x02, 0x60, 0x7b, 0x0c, 0xeb, 0xbb, 0x71,
        0x6b, 0x02, 0x60, 0x7b, 0x0c, 0xeb, 0xbb, 0x71, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 575: NFSv3 READDIRPLUS Call, RDMA_MSG with a Reply chunk
    #[rustfmt::skip]
    const RXE_READDIRPLUS_CALL: [u8; 184] = [
        0x39, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x03,
        0x00, 0x00, 0x09, 0x37, 0x00, 0x00, 0x00, 0x7c, 0x39, 0x05, 0xb9, 0x83, 0x45, 0x0e, 0xc8, 0x00,
        0x00, 0x00, 0x08, 0x9b, 0x00, 0x01, 0x00, 0x00, 0x39, 0x05, 0xb9, 0x83, 0x41, 0x8a, 0x80, 0x00,
        0x00, 0x00, 0x07, 0x52, 0x00, 0x00, 0x00, 0x04, 0x39, 0x05, 0xb9, 0x83, 0x45, 0x0e, 0xc8, 0x7c,
        0x39, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x86, 0xa3,
        0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x1c,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e, 0x65, 0x29, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 583: NFSv3 READDIRPLUS Reply, RDMA_NOMSG with a Reply chunk
    #[rustfmt::skip]
    const RXE_READDIRPLUS_REPLY: [u8; 80] = [
        0x39, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x03,
        0x00, 0x00, 0x09, 0x37, 0x00, 0x00, 0x00, 0x7c, 0x39, 0x05, 0xb9, 0x83, 0x45, 0x0e, 0xc8, 0x00,
        0x00, 0x00, 0x08, 0x9b, 0x00, 0x00, 0x01, 0x50, 0x39, 0x05, 0xb9, 0x83, 0x41, 0x8a, 0x80, 0x00,
        0x00, 0x00, 0x07, 0x52, 0x00, 0x00, 0x00, 0x00, 0x39, 0x05, 0xb9, 0x83, 0x45, 0x0e, 0xc8, 0x7c,
    ];
    /// nfs42-rdma-rxe.pcap frame 11: NFSv4.2 EXCHANGE_ID Reply, RDMA_NOMSG with a
    /// one-segment Reply chunk (RC SEND Only with Invalidate: after the IETH)
    #[rustfmt::skip]
    const V42_EXCHANGE_ID_REPLY: [u8; 48] = [
        0x44, 0xaf, 0xd9, 0x70, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x18, 0x4f, 0x00, 0x00, 0x00, 0x64, 0x44, 0xaf, 0xd9, 0x70, 0x45, 0x03, 0x20, 0x00,
    ];
    /// nfs3-rdma-siw.pcap frame 57: NFSv3 WRITE Call, RDMA_MSG with a Read list
    /// (iWARP Send, after the 18-octet untagged DDP header)
    #[rustfmt::skip]
    const SIW_WRITE_CALL: [u8; 164] = [
        0x46, 0x04, 0x6f, 0x73, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x70, 0x67, 0x65, 0xd2, 0x02, 0x00, 0x02, 0x00, 0x00,
        0x46, 0x04, 0x6f, 0x73, 0x44, 0x5e, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x46, 0x04, 0x6f, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        0x00, 0x01, 0x86, 0xa3, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e,
        0x65, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x01, 0x00, 0x01, 0x01,
        0x01, 0x00, 0x00, 0x00, 0x1a, 0x43, 0x63, 0xa0, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x00,
    ];
    /// nfs3-rdma-siw.pcap frame 938, second FPDU: NFSv3 READDIRPLUS Reply, RDMA_NOMSG
    /// with a Reply chunk (iWARP Send, after the untagged DDP header)
    #[rustfmt::skip]
    const SIW_READDIRPLUS_REPLY: [u8; 80] = [
        0x4f, 0x04, 0x6f, 0x73, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x03,
        0xc3, 0x7f, 0xd0, 0x04, 0x00, 0x00, 0x00, 0x7c, 0x4f, 0x04, 0x6f, 0x73, 0x45, 0x10, 0x98, 0x00,
        0xd7, 0xa4, 0x7a, 0x01, 0x00, 0x00, 0x01, 0xf0, 0x4f, 0x04, 0x6f, 0x73, 0x7f, 0x91, 0x10, 0x00,
        0x86, 0x4c, 0x2c, 0x01, 0x00, 0x00, 0x00, 0x00, 0x4f, 0x04, 0x6f, 0x73, 0x45, 0x10, 0x98, 0x7c,
    ];

    /// Parse, check `buffer_len`, re-emit byte-identically, and check every
    /// shorter prefix of the header errors (never panics).
    fn round_trip(msg: &[u8]) -> (Repr<'_>, usize) {
        let (repr, len) = Repr::parse(msg).unwrap();
        assert_eq!(repr.buffer_len(), len);
        let mut out = [0u8; 512];
        assert_eq!(repr.emit(&mut out).unwrap(), len);
        assert_eq!(&out[..len], &msg[..len]);
        // Every truncation (so every word boundary) below the header length.
        for n in 0..len {
            assert!(Repr::parse(&msg[..n]).is_err(), "prefix {n} parsed");
            assert!(matches!(
                repr.emit(&mut out[..n]),
                Err(Error::Truncated {
                    layer: Layer::RpcRdma,
                    ..
                })
            ));
        }
        (repr, len)
    }

    fn fixed(msg: &[u8]) -> (u32, u32, u32, u32) {
        let h = Header::new_checked(msg).unwrap();
        (h.rdma_xid(), h.rdma_vers(), h.rdma_credit(), h.rdma_proc())
    }

    fn rpc_call(payload: &[u8]) -> (onc_rpc::CallBody<'_>, usize, u32) {
        let (rpc, len) = onc_rpc::Repr::parse(payload).unwrap();
        let mut out = [0u8; 512];
        assert_eq!(rpc.emit(&mut out).unwrap(), len);
        assert_eq!(&out[..len], &payload[..len]);
        match rpc.body {
            MsgBody::Call(c) => (c, len, rpc.xid),
            other => panic!("not a call: {other:?}"),
        }
    }

    fn rpc_reply(payload: &[u8]) -> (onc_rpc::AcceptedReply<'_>, usize, u32) {
        let (rpc, len) = onc_rpc::Repr::parse(payload).unwrap();
        let mut out = [0u8; 512];
        assert_eq!(rpc.emit(&mut out).unwrap(), len);
        assert_eq!(&out[..len], &payload[..len]);
        match rpc.body {
            MsgBody::Reply(ReplyBody::Accepted(a)) => (a, len, rpc.xid),
            other => panic!("not an accepted reply: {other:?}"),
        }
    }

    /// The kernel client's AUTH_SYS credential: stamp 0, "(none)", uid 0,
    /// gid 0, no groups (tshark: "Flavor: AUTH_UNIX (1) Length: 28").
    fn assert_kernel_auth_sys(cred: &OpaqueAuth<'_>) {
        match cred {
            OpaqueAuth::Sys(s) => {
                assert_eq!(s.stamp, 0);
                assert_eq!(s.machinename_str(), Some("(none)"));
                assert_eq!((s.uid, s.gid), (0, 0));
                assert!(s.gids.is_empty());
                assert_eq!(s.buffer_len(), 28);
            }
            other => panic!("not AUTH_SYS: {other:?}"),
        }
    }

    const NFS_PROGRAM: u32 = 100_003;

    /// RPCRDMA-36, -38, -39, -40, -43: RDMA_MSG with no chunks, NFSv3 GETATTR
    /// Call and Reply (nfs3-rdma-rxe.pcap frames 38, 40).
    #[test]
    fn rpcrdma_36_38_39_40_capture_getattr_no_chunks() {
        assert_eq!(fixed(&RXE_GETATTR_CALL), (0x2905_b983, 1, 128, 0));
        let (call, len) = round_trip(&RXE_GETATTR_CALL);
        assert_eq!(len, MIN_HEADER_LEN);
        assert_eq!(call.proc(), Proc::Msg);
        assert_eq!(call.body, Body::Msg(Chunks::NONE));
        assert!(call.chunks().unwrap().is_empty());
        let payload = &RXE_GETATTR_CALL[len..];
        call.check_payload_xid(payload).unwrap();
        let (c, rpc_len, xid) = rpc_call(payload);
        assert_eq!(xid, call.rdma_xid);
        assert_eq!((c.prog, c.vers, c.proc), (NFS_PROGRAM, 3, 1));
        assert_kernel_auth_sys(&c.cred);
        assert_eq!(c.verf, OpaqueAuth::None);
        // GETATTR3args: a 8-octet file handle follows the RPC header.
        assert_eq!(&payload[rpc_len..rpc_len + 4], &[0, 0, 0, 8]);
        assert_eq!(payload.len() - rpc_len, 12);

        assert_eq!(fixed(&RXE_GETATTR_REPLY), (0x2905_b983, 1, 64, 0));
        let (reply, len) = round_trip(&RXE_GETATTR_REPLY);
        assert_eq!(reply.body, Body::Msg(Chunks::NONE));
        let payload = &RXE_GETATTR_REPLY[len..];
        reply.check_payload_xid(payload).unwrap();
        let (a, rpc_len, _) = rpc_reply(payload);
        assert_eq!(a.verf, OpaqueAuth::None);
        assert_eq!(a.reply_data, AcceptedReplyData::Success);
        assert_eq!(rpc_len, 24);
        // RPCRDMA-43: within the 4096-octet thresholds both peers advertised.
        assert!(RXE_GETATTR_CALL.len() <= 4096 && RXE_GETATTR_REPLY.len() <= 4096);
    }

    /// NFS NULL Call and Reply: AUTH_NONE credential (frames 26, 28).
    #[test]
    fn capture_null_call_auth_none() {
        let (call, len) = round_trip(&RXE_NULL_CALL);
        assert_eq!(call.body, Body::Msg(Chunks::NONE));
        let (c, rpc_len, _) = rpc_call(&RXE_NULL_CALL[len..]);
        assert_eq!((c.prog, c.vers, c.proc), (NFS_PROGRAM, 3, 0));
        assert_eq!((c.cred, c.verf), (OpaqueAuth::None, OpaqueAuth::None));
        assert_eq!(len + rpc_len, RXE_NULL_CALL.len());
        let (reply, len) = round_trip(&RXE_NULL_REPLY);
        let (a, rpc_len, xid) = rpc_reply(&RXE_NULL_REPLY[len..]);
        assert_eq!(xid, reply.rdma_xid);
        assert_eq!(a.reply_data, AcceptedReplyData::Success);
        assert_eq!(len + rpc_len, RXE_NULL_REPLY.len());
    }

    /// RPCRDMA-19, -20, -21: RDMA_MSG with a Read list, NFSv3 WRITE Call
    /// (rxe frame 68, siw frame 57): one read segment at Position 112, the
    /// end of the reduced Payload stream, where the 128 KiB of data go.
    #[test]
    fn rpcrdma_19_20_21_capture_write_call_read_list() {
        for (msg, handle, offset) in [
            (&RXE_WRITE_CALL[..], 0x0000_0cb6, 0x3005_b983_44a6_0000),
            (&SIW_WRITE_CALL[..], 0x6765_d202, 0x4604_6f73_445e_0000),
        ] {
            let (repr, len) = round_trip(msg);
            assert_eq!(len, 52);
            let Body::Msg(c) = repr.body else {
                panic!("{repr:?}")
            };
            assert_eq!(c.read_list.len(), 1);
            let seg = c.read_list.iter().next().unwrap();
            assert_eq!(
                seg,
                ReadSegment {
                    position: 112,
                    handle,
                    length: 131_072,
                    offset
                }
            );
            assert_eq!(seg.position % 4, 0);
            assert!(!c.read_list.is_position_zero());
            assert!(c.write_list.is_empty() && c.reply_chunk.is_none());
            let payload = &msg[len..];
            assert_eq!(payload.len(), 112);
            repr.check_payload_xid(payload).unwrap();
            let (call, _, _) = rpc_call(payload);
            assert_eq!((call.prog, call.vers, call.proc), (NFS_PROGRAM, 3, 7));
            assert_kernel_auth_sys(&call.cred);
            // The Wire list compares equal to the same list from a slice.
            assert_eq!(c.read_list, ReadList::Slice(&[seg]));
            let ReadList::Wire(w) = c.read_list else {
                panic!()
            };
            assert_eq!(w.as_bytes(), &msg[16..44]);
        }
    }

    /// RPCRDMA-28, -44: RDMA_MSG with a Write list, NFSv3 READ Call (frame
    /// 293) and its Reply (frame 426, a Send with Invalidate): the Reply's
    /// Write chunk echoes the handle and offset with the length written, and
    /// its Read list is empty.
    #[test]
    fn rpcrdma_28_44_capture_read_write_list() {
        let (call, len) = round_trip(&RXE_READ_CALL);
        assert_eq!(len, 52);
        let c = *call.chunks().unwrap();
        assert!(c.read_list.is_empty() && c.reply_chunk.is_none());
        assert_eq!(c.write_list.len(), 1);
        let chunk = c.write_list.iter().next().unwrap();
        let offered = Segment {
            handle: 0x935,
            length: 131_072,
            offset: 0x3605_b983_44a5_4000,
        };
        assert_eq!(chunk, WriteChunk::Slice(&[offered]));
        assert_eq!(chunk.total_len(), 131_072);
        let (rpc, _, _) = rpc_call(&RXE_READ_CALL[len..]);
        assert_eq!(rpc.proc, 6);

        let (reply, len) = round_trip(&RXE_READ_REPLY);
        assert_eq!(reply.rdma_credit, 64);
        let r = *reply.chunks().unwrap();
        assert!(r.read_list.is_empty(), "RPCRDMA-44");
        let returned: [WriteChunk<'_>; 1] = [WriteChunk::Slice(&[offered])];
        assert_eq!(r.write_list, WriteList::Slice(&returned));
        let (a, _, xid) = rpc_reply(&RXE_READ_REPLY[len..]);
        assert_eq!(xid, call.rdma_xid);
        assert_eq!(a.reply_data, AcceptedReplyData::Success);
    }

    /// RPCRDMA-13, -54: RDMA_MSG with a Reply chunk of 3 segments, NFSv3
    /// READDIRPLUS Call (frame 575), and the RDMA_NOMSG Reply (frame 583;
    /// siw frame 938) that echoes it with the octets written.
    #[test]
    fn rpcrdma_13_54_capture_readdirplus_reply_chunk() {
        let (call, len) = round_trip(&RXE_READDIRPLUS_CALL);
        assert_eq!(len, 80);
        let c = *call.chunks().unwrap();
        assert!(c.read_list.is_empty() && c.write_list.is_empty());
        let offered = c.reply_chunk.unwrap();
        let lens: [u32; 3] = [0x7c, 0x1_0000, 4];
        assert!(offered.iter().map(|s| s.length).eq(lens));
        assert_eq!(offered.total_len(), 0x7c + 0x1_0000 + 4);
        let (rpc, _, _) = rpc_call(&RXE_READDIRPLUS_CALL[len..]);
        assert_eq!(rpc.proc, 17);

        let (reply, len) = round_trip(&RXE_READDIRPLUS_REPLY);
        assert_eq!(len, RXE_READDIRPLUS_REPLY.len());
        assert_eq!(reply.proc(), Proc::NoMsg);
        let returned = reply.chunks().unwrap().reply_chunk.unwrap();
        assert_eq!(returned.len(), offered.len());
        for (o, r) in offered.iter().zip(returned.iter()) {
            assert_eq!((o.handle, o.offset), (r.handle, r.offset));
            assert!(r.length <= o.length);
        }
        assert!(returned.iter().map(|s| s.length).eq([0x7c, 0x150, 0]));
        assert!(reply.chunks().unwrap().read_list.is_empty());

        let (siw, len) = round_trip(&SIW_READDIRPLUS_REPLY);
        assert_eq!(len, 80);
        let chunk = siw.chunks().unwrap().reply_chunk.unwrap();
        assert!(chunk.iter().map(|s| s.length).eq([0x7c, 0x1f0, 0]));
    }

    /// RPCRDMA-41: RDMA_NOMSG Reply with a one-segment Reply chunk (NFSv4.2
    /// EXCHANGE_ID, nfs42-rdma-rxe.pcap frame 11, Send with Invalidate).
    #[test]
    fn rpcrdma_41_capture_v42_nomsg() {
        let (r, len) = round_trip(&V42_EXCHANGE_ID_REPLY);
        assert_eq!(len, 48);
        let c = r.chunks().unwrap();
        let seg = c.reply_chunk.unwrap().iter().next().unwrap();
        assert_eq!(
            seg,
            Segment {
                handle: 0x184f,
                length: 100,
                offset: 0x44af_d970_4503_2000
            }
        );
    }

    // --- RFC 8166 §4.3 / rpc-rdma.md §4.3 golden bytes --------------------

    /// RPCRDMA-36, -38: rpc-rdma.md §4.3, RDMA_MSG with no chunks.
    #[test]
    fn rpcrdma_36_golden_msg_no_chunks() {
        let golden: [u8; 32] = [
            0x8f, 0x3e, 0x1a, 0x02, 0, 0, 0, 1, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0x8f, 0x3e, 0x1a, 0x02,
        ];
        let repr = Repr::msg(0x8f3e_1a02, 32, Chunks::NONE);
        let mut out = [0xffu8; 28];
        assert_eq!(repr.emit(&mut out).unwrap(), 28);
        assert_eq!(out, golden[..28]);
        let (parsed, len) = Repr::parse(&golden).unwrap();
        assert_eq!((parsed, len), (repr, 28));
        parsed.check_payload_xid(&golden[len..]).unwrap();
    }

    /// RPCRDMA-59, -62, -77: an unsupported version is answered with
    /// ERR_VERS echoing its rdma_xid and rdma_vers, supported range 1..=1
    /// (`xid | 2 | credit | 4 | 1 | 1 | 1`). The pre-parse reads only the four
    /// fixed words, so the unknown body does not matter.
    #[test]
    fn rpcrdma_59_62_77_golden_err_vers() {
        let failing: [u8; 32] = [
            0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0, 9, 0xff, 0xff, 0xff, 0xff,
            0xaa, 0xaa, 0xaa, 0xaa, 0x55, 0x55, 0x55, 0x55, 1, 2, 3, 4,
        ];
        assert!(matches!(
            Repr::parse(&failing),
            Err(Error::Unknown {
                layer: Layer::RpcRdma,
                field: "rdma_vers",
                value: 2
            })
        ));
        let h = Header::new_checked(&failing[..]).unwrap();
        assert_eq!(
            (h.rdma_xid(), h.rdma_vers(), h.rdma_proc()),
            (0xdead_beef, 2, 9)
        );
        let answer = Repr::err_vers(&h, 64);
        let golden: [u8; 28] = [
            0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 2, 0, 0, 0, 64, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0,
            0, 0, 1,
        ];
        let mut out = [0u8; 28];
        assert_eq!(answer.emit(&mut out).unwrap(), ERR_VERS_LEN);
        assert_eq!(out, golden);
        // The requester parses it whatever rdma_vers it echoes.
        let (parsed, len) = round_trip(&golden);
        assert_eq!((parsed, len), (answer, 28));
        assert_eq!(
            parsed.body,
            Body::Error(ErrorBody::Vers {
                rdma_vers_low: 1,
                rdma_vers_high: 1
            })
        );
        // 20..27 octets: an ERR_VERS needs 28 (rpc-rdma.md §11).
        for n in 20..28 {
            assert!(matches!(
                Repr::parse(&golden[..n]),
                Err(Error::Truncated { need: 28, .. })
            ));
        }
    }

    /// RPCRDMA-59, -63, -56: ERR_CHUNK is 20 octets (`xid | 1 | credit | 4 |
    /// 2`) and is accepted although below 28 (rpc-rdma.md §11 decision).
    #[test]
    fn rpcrdma_59_63_golden_err_chunk() {
        let golden: [u8; 20] = [
            0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1, 0, 0, 0, 64, 0, 0, 0, 4, 0, 0, 0, 2,
        ];
        let h = Header::new_checked(&golden[..]).unwrap();
        assert_eq!(h.min_message_len(), ERR_CHUNK_LEN);
        let answer = Repr::err_chunk(&h, 64);
        let mut out = [0u8; 20];
        assert_eq!(answer.emit(&mut out).unwrap(), ERR_CHUNK_LEN);
        assert_eq!(out, golden);
        let (parsed, len) = round_trip(&golden);
        assert_eq!((parsed.body, len), (Body::Error(ErrorBody::Chunk), 20));
    }

    fn words(w: &[u32]) -> ([u8; 512], usize) {
        let mut b = [0u8; 512];
        for (i, v) in w.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
        }
        (b, 4 * w.len())
    }

    const fn seg(i: u32) -> Segment {
        Segment {
            handle: 0x100 + i,
            length: 0x1000 * i + 1,
            offset: 0x0000_0001_0000_0000 * i as u64 + 0x40,
        }
    }

    /// RPCRDMA-01, -13, -19, -20, -36: rpc-rdma.md §4.2 chunk-list encodings:
    /// Read list `1 PHLOO 1 PHLOO 0`, Write list `1 3 HLOO HLOO HLOO 1 2 HLOO
    /// HLOO 0`, Reply chunk `1 2 HLOO HLOO`; emitted from the caller's arrays,
    /// parsed back into wire lists that compare equal, byte-identical.
    #[test]
    fn rpcrdma_01_13_20_golden_chunk_lists() {
        let s: [Segment; 7] = [seg(1), seg(2), seg(3), seg(4), seg(5), seg(6), seg(7)];
        let reads = [ReadSegment::new(8, s[0]), ReadSegment::new(8, s[1])];
        let c1 = [s[2], s[3], s[4]];
        let c2 = [s[5], s[6]];
        let chunks = [WriteChunk::Slice(&c1), WriteChunk::Slice(&c2)];
        let reply = [s[0], s[1]];
        let repr = Repr::msg(
            7,
            1,
            Chunks {
                read_list: ReadList::Slice(&reads),
                write_list: WriteList::Slice(&chunks),
                reply_chunk: Some(WriteChunk::Slice(&reply)),
            },
        );
        let hloo = |x: Segment| [x.handle, x.length, (x.offset >> 32) as u32, x.offset as u32];
        let mut w: [u32; 128] = [0; 128];
        let mut n = 0;
        let mut push = |v: &[u32]| {
            w[n..n + v.len()].copy_from_slice(v);
            n += v.len();
        };
        push(&[7, 1, 1, 0]);
        // 1 PHLOO 1 PHLOO 0
        for r in &reads {
            push(&[1, r.position]);
            push(&hloo(r.target()));
        }
        push(&[0]);
        // 1 3 HLOO HLOO HLOO 1 2 HLOO HLOO 0
        push(&[1, 3]);
        c1.iter().for_each(|x| push(&hloo(*x)));
        push(&[1, 2]);
        c2.iter().for_each(|x| push(&hloo(*x)));
        push(&[0]);
        // 1 2 HLOO HLOO
        push(&[1, 2]);
        reply.iter().for_each(|x| push(&hloo(*x)));
        let (golden, len) = words(&w[..n]);
        assert_eq!(repr.buffer_len(), len);
        let mut out = [0u8; 512];
        assert_eq!(repr.emit(&mut out).unwrap(), len);
        assert_eq!(&out[..len], &golden[..len]);
        let (parsed, plen) = round_trip(&golden[..len]);
        assert_eq!(plen, len);
        assert_eq!(parsed, repr);
        let pc = parsed.chunks().unwrap();
        assert!(pc.read_list.iter().eq(reads.iter().copied()));
        let mut it = pc.write_list.iter();
        assert_eq!(it.len(), 2);
        assert!(it.next().unwrap().iter().eq(c1.iter().copied()));
        assert!(it.next().unwrap().iter().eq(c2.iter().copied()));
        assert!(it.next().is_none());
        assert_eq!(pc.reply_chunk.unwrap().total_len(), 0x1001 + 0x2001);
        // RPCRDMA-20: the two segments share Position 8: one Read chunk.
        assert!(pc.read_list.iter().all(|r| r.position == 8));
    }

    /// RPCRDMA-01: a plain segment is `H L OO`, 32-bit handle, 64-bit offset
    /// (high word first); a read segment prefixes the Position.
    #[test]
    fn rpcrdma_01_segment_codec() {
        let s = Segment {
            handle: 0xffff_fffe,
            length: 0x1234,
            offset: 0x0102_0304_0506_0708,
        };
        let mut b = [0u8; 20];
        assert_eq!(s.emit(&mut b).unwrap(), 16);
        assert_eq!(
            b[..16],
            [
                0xff, 0xff, 0xff, 0xfe, 0, 0, 0x12, 0x34, 1, 2, 3, 4, 5, 6, 7, 8
            ]
        );
        assert_eq!(Segment::parse(&b).unwrap(), s);
        let r = ReadSegment::new(0x84, s);
        assert_eq!(r.emit(&mut b).unwrap(), 20);
        assert_eq!(b[..4], [0, 0, 0, 0x84]);
        assert_eq!(ReadSegment::parse(&b).unwrap(), r);
        assert_eq!(r.target(), s);
        for n in 0..16 {
            assert!(Segment::parse(&b[..n]).is_err());
            assert!(s.emit(&mut [0u8; 16][..n]).is_err());
        }
    }

    // --- Receive-side rules (bad input) ----------------------------------

    /// RPCRDMA-56: fewer than 28 octets is discarded unparsed (Truncated),
    /// except a 20-octet ERR_CHUNK.
    #[test]
    fn rpcrdma_56_short_messages() {
        for n in 0..MIN_HEADER_LEN {
            assert!(matches!(
                Repr::parse(&RXE_GETATTR_CALL[..n]),
                Err(Error::Truncated { .. })
            ));
        }
        // A 16-octet RDMA_DONE is discarded too.
        let (done, n) = words(&[1, 1, 1, 3]);
        assert!(matches!(
            Repr::parse(&done[..n]),
            Err(Error::Truncated { need: 28, .. })
        ));
        // RDMA_ERROR with 16..19 octets: not even rdma_err.
        let (e, _) = words(&[1, 1, 1, 4, 2]);
        for n in 16..20 {
            assert!(matches!(
                Repr::parse(&e[..n]),
                Err(Error::Truncated { need: 20, .. })
            ));
        }
        assert!(Header::new_checked(&e[..15]).is_err());
        assert!(
            Header::new_checked(&e[..16])
                .unwrap()
                .check_message_len()
                .is_err()
        );
    }

    /// RPCRDMA-21: a Position that is not a multiple of 4 is an XDR error.
    #[test]
    fn rpcrdma_21_unaligned_position() {
        let (b, n) = words(&[1, 1, 1, 0, 1, 6, 1, 2, 0, 0, 0, 0, 0]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Malformed {
                layer: Layer::RpcRdma,
                ..
            })
        ));
        let bad = [ReadSegment::new(6, seg(1))];
        let repr = Repr::msg(
            1,
            1,
            Chunks {
                read_list: ReadList::Slice(&bad),
                ..Chunks::NONE
            },
        );
        assert!(matches!(
            repr.emit(&mut [0u8; 64]),
            Err(Error::Malformed { .. })
        ));
        assert!(ReadSegment::parse(&b[20..]).is_err());
    }

    /// RPCRDMA-32: a Position-Zero Read chunk (Long Call, RDMA_NOMSG).
    #[test]
    fn rpcrdma_32_position_zero_read_chunk() {
        let pzrc = [ReadSegment::new(0, seg(1)), ReadSegment::new(0, seg(2))];
        let repr = Repr::nomsg(
            9,
            1,
            Chunks {
                read_list: ReadList::Slice(&pzrc),
                ..Chunks::NONE
            },
        );
        let mut out = [0u8; 128];
        let n = repr.emit(&mut out).unwrap();
        let (p, len) = round_trip(&out[..n]);
        assert_eq!(len, n);
        assert!(p.chunks().unwrap().read_list.is_position_zero());
        assert!(!ReadList::EMPTY.is_position_zero());
    }

    /// RPCRDMA-41, -63: RDMA_NOMSG with no Read list and no Reply chunk is an
    /// XDR error (ERR_CHUNK), on parse and on emit.
    #[test]
    fn rpcrdma_41_63_nomsg_without_chunks() {
        let (b, n) = words(&[1, 1, 1, 1, 0, 0, 0]);
        assert!(matches!(Repr::parse(&b[..n]), Err(Error::Malformed { .. })));
        assert!(
            Repr::nomsg(1, 1, Chunks::NONE)
                .emit(&mut [0u8; 28])
                .is_err()
        );
        // A Write list alone cannot carry a Payload stream either.
        let c = [WriteChunk::Slice(&[])];
        let wl = Chunks {
            write_list: WriteList::Slice(&c),
            ..Chunks::NONE
        };
        assert!(Repr::nomsg(1, 1, wl).emit(&mut [0u8; 64]).is_err());
    }

    /// RPCRDMA-63: other XDR errors on a known version: unknown proc,
    /// discriminators other than 0/1, rdma_xid not the RPC XID.
    #[test]
    fn rpcrdma_63_xdr_errors() {
        let (b, n) = words(&[1, 1, 1, 5, 0, 0, 0]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "rdma_proc",
                value: 5,
                ..
            })
        ));
        for (i, field) in [
            (4, "read list discriminator"),
            (5, "write list discriminator"),
            (6, "reply chunk discriminator"),
        ] {
            let mut w = [1, 1, 1, 0, 0, 0, 0];
            w[i] = 2;
            let (b, n) = words(&w);
            assert!(matches!(
                Repr::parse(&b[..n]),
                Err(Error::Unknown { field: f, value: 2, .. }) if f == field
            ));
        }
        let (repr, len) = Repr::parse(&RXE_GETATTR_CALL).unwrap();
        let mut other = RXE_GETATTR_CALL;
        other[len] ^= 1;
        assert!(repr.check_payload_xid(&other[len..]).is_err());
        assert!(repr.check_payload_xid(&other[len..len + 3]).is_err());
        // A version-1 ERR_CHUNK from a version-2 peer is not accepted.
        let (b, n) = words(&[1, 2, 1, 4, 2]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "rdma_vers",
                ..
            })
        ));
    }

    /// RPCRDMA-61: an RDMA_ERROR that cannot be decoded is an error (the
    /// receiver drops it).
    #[test]
    fn rpcrdma_61_undecodable_error() {
        let (b, n) = words(&[1, 1, 1, 4, 3, 0, 0]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "rdma_err",
                value: 3,
                ..
            })
        ));
        let (b, _) = words(&[1, 1, 1, 4, 1, 1, 1]);
        assert!(Repr::parse(&b[..24]).is_err());
    }

    /// RPCRDMA-69: RDMA_MSGP parses (for reporting), is never emitted.
    #[test]
    fn rpcrdma_69_msgp_parse_only() {
        let (b, n) = words(&[5, 1, 1, 2, 1024, 4096, 0, 0, 0, 0x55]);
        let (repr, len) = Repr::parse(&b[..n]).unwrap();
        assert_eq!(len, 36);
        assert_eq!(repr.buffer_len(), 36);
        assert_eq!(
            repr.body,
            Body::MsgP {
                rdma_align: 1024,
                rdma_thresh: 4096,
                chunks: Chunks::NONE
            }
        );
        assert_eq!(repr.proc(), Proc::MsgP);
        assert!(repr.chunks().is_some());
        assert!(matches!(
            repr.emit(&mut [0u8; 64]),
            Err(Error::Malformed { .. })
        ));
        for k in 28..36 {
            assert!(Repr::parse(&b[..k]).is_err());
        }
    }

    /// RPCRDMA-70: RDMA_DONE parses (void body), is never emitted.
    #[test]
    fn rpcrdma_70_done_parse_only() {
        let (b, _) = words(&[5, 1, 1, 3]);
        let (repr, len) = Repr::parse(&b[..28]).unwrap();
        assert_eq!((repr.body, len), (Body::Done, 16));
        assert!(repr.chunks().is_none());
        assert!(repr.emit(&mut [0u8; 64]).is_err());
    }

    /// RPCRDMA-42: an RDMA_ERROR parses at either end and says so (a
    /// Responder then drops it); RPCRDMA-77: the pre-parse reads only the
    /// four fixed words, whatever the version.
    #[test]
    fn rpcrdma_42_77_header_view() {
        let (e, n) = words(&[1, 1, 64, 4, 2]);
        let (repr, len) = Repr::parse(&e[..n]).unwrap();
        assert_eq!((repr.proc(), len), (Proc::Error, 20));
        assert!(repr.chunks().is_none());
        let mut b = [0u8; 16];
        let mut h = Header::new_unchecked(&mut b[..]);
        h.set_rdma_xid(0x0102_0304);
        h.set_rdma_vers(7);
        h.set_rdma_credit(0xffff_ffff);
        h.set_rdma_proc(0x8000_0000);
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(
            (h.rdma_xid(), h.rdma_vers(), h.rdma_credit(), h.rdma_proc()),
            (0x0102_0304, 7, 0xffff_ffff, 0x8000_0000)
        );
        assert!(h.body().is_empty());
        assert_eq!(h.min_message_len(), MIN_HEADER_LEN);
        assert_eq!(h.into_inner().len(), 16);
        for n in 0..16 {
            assert!(Header::new_checked(&b[..n]).is_err());
        }
    }

    // --- Bounds against hostile input --------------------------------------

    fn hostile(reads: usize, chunks: usize, segs: usize) -> ([u8; 8192], usize) {
        let mut b = [0u8; 8192];
        let mut w = XdrWriter::new(&mut b);
        for v in [1, 1, 1, 0] {
            w.write_u32(v).unwrap();
        }
        for _ in 0..reads {
            w.write_u32(1).unwrap();
            ReadSegment::new(0, seg(1)).write(&mut w).unwrap();
        }
        w.write_u32(0).unwrap();
        for _ in 0..chunks {
            w.write_u32(1).unwrap();
            w.write_u32(segs as u32).unwrap();
            for _ in 0..segs {
                seg(2).write(&mut w).unwrap();
            }
        }
        w.write_u32(0).unwrap();
        w.write_u32(0).unwrap();
        let n = w.finish();
        (b, n)
    }

    /// The bounds: 64 read segments, 64 write chunks, 64 segments per chunk.
    #[test]
    fn bounds_too_large() {
        let (b, n) = hostile(MAX_READ_SEGMENTS, 0, 0);
        assert_eq!(
            Repr::parse(&b[..n])
                .unwrap()
                .0
                .chunks()
                .unwrap()
                .read_list
                .len(),
            64
        );
        let (b, n) = hostile(MAX_READ_SEGMENTS + 1, 0, 0);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::TooLarge {
                what: "read segments",
                limit: 64,
                ..
            })
        ));
        let (b, n) = hostile(0, MAX_WRITE_CHUNKS, 1);
        assert_eq!(
            Repr::parse(&b[..n])
                .unwrap()
                .0
                .chunks()
                .unwrap()
                .write_list
                .len(),
            64
        );
        let (b, n) = hostile(0, MAX_WRITE_CHUNKS + 1, 0);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::TooLarge {
                what: "write chunks",
                ..
            })
        ));
        let (b, n) = hostile(0, 1, MAX_CHUNK_SEGMENTS);
        let (r, _) = Repr::parse(&b[..n]).unwrap();
        assert_eq!(
            r.chunks().unwrap().write_list.iter().next().unwrap().len(),
            64
        );
        let (b, n) = hostile(0, 1, MAX_CHUNK_SEGMENTS + 1);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::TooLarge {
                what: "chunk segments",
                ..
            })
        ));
        // A forged count is refused before any segment is looked for.
        let (b, n) = words(&[1, 1, 1, 0, 0, 0, 1, 0xffff_ffff]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::TooLarge {
                value: 0xffff_ffff,
                ..
            })
        ));
        // Emit enforces the same bounds on the caller's arrays.
        let many = [seg(1); MAX_CHUNK_SEGMENTS + 1];
        let repr = Repr::nomsg(
            1,
            1,
            Chunks {
                reply_chunk: Some(WriteChunk::Slice(&many)),
                ..Chunks::NONE
            },
        );
        assert!(matches!(
            repr.emit(&mut [0u8; 2048]),
            Err(Error::TooLarge { .. })
        ));
        let reads = [ReadSegment::default(); MAX_READ_SEGMENTS + 1];
        let repr = Repr::msg(
            1,
            1,
            Chunks {
                read_list: ReadList::Slice(&reads),
                ..Chunks::NONE
            },
        );
        assert!(matches!(
            repr.emit(&mut [0u8; 2048]),
            Err(Error::TooLarge { .. })
        ));
        let chunks = [WriteChunk::EMPTY; MAX_WRITE_CHUNKS + 1];
        let repr = Repr::msg(
            1,
            1,
            Chunks {
                write_list: WriteList::Slice(&chunks),
                ..Chunks::NONE
            },
        );
        assert!(matches!(
            repr.emit(&mut [0u8; 2048]),
            Err(Error::TooLarge { .. })
        ));
    }

    /// Emit writes nothing unless the whole header fits.
    #[test]
    fn emit_short_buffer_untouched() {
        let (repr, len) = Repr::parse(&RXE_READDIRPLUS_CALL).unwrap();
        let mut out = [0xeeu8; 79];
        assert!(matches!(
            repr.emit(&mut out),
            Err(Error::Truncated {
                need: 80,
                have: 79,
                ..
            })
        ));
        assert!(out.iter().all(|&b| b == 0xee));
        assert_eq!(len, 80);
    }

    /// RPCRDMA-49: an unused Write chunk keeps its segment count with every
    /// length 0; RPCRDMA-51: an empty Write chunk (count 0) is echoed as such.
    #[test]
    fn rpcrdma_49_51_unused_and_empty_write_chunks() {
        let mut unused = [seg(1), seg(2)];
        unused.iter_mut().for_each(|s| s.length = 0);
        let chunks = [WriteChunk::Slice(&unused), WriteChunk::EMPTY];
        let repr = Repr::msg(
            3,
            64,
            Chunks {
                write_list: WriteList::Slice(&chunks),
                ..Chunks::NONE
            },
        );
        let mut out = [0u8; 128];
        let n = repr.emit(&mut out).unwrap();
        assert_eq!(n, 16 + 4 + (4 + 4 + 32) + (4 + 4) + 4 + 4);
        let (p, _) = round_trip(&out[..n]);
        assert_eq!(p, repr);
        let mut it = p.chunks().unwrap().write_list.iter();
        let first = it.next().unwrap();
        assert!(first.is_unused() && first.len() == 2 && first.total_len() == 0);
        let second = it.next().unwrap();
        assert!(second.is_empty() && !second.is_unused());
    }

    /// EXT-RPC-01: RFC 8797 private data from the captures (CM REQ/REP of
    /// nfs3-rdma-rxe.pcap, MPA Request of nfs3-rdma-siw.pcap after MPA's
    /// 4-octet IRD/ORD words): magic 0xF6AB0E18, version 1, flags, sizes 4 KiB.
    #[test]
    fn ext_rpc_01_private_data() {
        let req: [u8; 32] = [
            0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let rep: [u8; 8] = [0xf6, 0xab, 0x0e, 0x18, 0x01, 0x00, 0x03, 0x03];
        let mpa_req: [u8; 12] = [
            0x00, 0x80, 0x00, 0x00, 0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03,
        ];
        let v = PrivateData::new_checked(&req[..]).unwrap();
        assert_eq!(v.format_identifier(), PRIVATE_DATA_MAGIC);
        assert_eq!(
            (v.version(), v.flags(), v.send_size(), v.receive_size()),
            (1, 1, 3, 3)
        );
        let p = PrivateDataRepr::parse(&req).unwrap();
        assert_eq!(p, PrivateDataRepr::new(4096, 4096, true));
        assert!(p.remote_invalidate());
        assert_eq!((p.max_send_size, p.max_receive_size), (4096, 4096));
        let mut out = [0u8; 8];
        assert_eq!(p.emit(&mut out).unwrap(), 8);
        assert_eq!(out, req[..8]);
        let q = PrivateDataRepr::parse(&rep).unwrap();
        assert!(!q.remote_invalidate());
        q.emit(&mut out).unwrap();
        assert_eq!(out, rep);
        assert_eq!(PrivateDataRepr::parse(&mpa_req[4..]).unwrap(), p);
        // Setters.
        let mut b = [0u8; 8];
        let mut w = PrivateData::new_unchecked(&mut b[..]);
        w.set_format_identifier(PRIVATE_DATA_MAGIC);
        w.set_version(1);
        w.set_flags(1);
        w.set_send_size(3);
        w.set_receive_size(3);
        assert_eq!(b, req[..8]);
        // Size codes: (code + 1) * 1024.
        assert_eq!(decode_buffer_size(0), 1024);
        assert_eq!(decode_buffer_size(255), 262_144);
        assert_eq!(encode_buffer_size(4096), 3);
        assert_eq!(encode_buffer_size(5000), 3);
        assert_eq!(encode_buffer_size(0), 0);
        assert_eq!(encode_buffer_size(u32::MAX), 255);
        // Errors.
        for n in 0..8 {
            assert!(matches!(
                PrivateDataRepr::parse(&rep[..n]),
                Err(Error::Truncated { .. })
            ));
            assert!(p.emit(&mut out[..n]).is_err());
        }
        let mut bad = rep;
        bad[0] = 0;
        assert!(matches!(
            PrivateDataRepr::parse(&bad),
            Err(Error::Unknown {
                field: "private data format identifier",
                ..
            })
        ));
        let mut bad = rep;
        bad[4] = 2;
        assert!(matches!(
            PrivateDataRepr::parse(&bad),
            Err(Error::Unknown {
                field: "private data version",
                value: 2,
                ..
            })
        ));
        let odd = PrivateDataRepr {
            flags: 0,
            max_send_size: 1500,
            max_receive_size: 4096,
        };
        assert!(matches!(odd.emit(&mut out), Err(Error::Malformed { .. })));
        // Reserved flag bits are kept.
        let mut res = rep;
        res[5] = 0x81;
        let r = PrivateDataRepr::parse(&res).unwrap();
        r.emit(&mut out).unwrap();
        assert_eq!(out, res);
    }

    #[test]
    fn enums_round_trip() {
        for p in Proc::ALL {
            assert_eq!(Proc::try_from(u32::from(*p)).unwrap(), *p);
        }
        for e in ErrCode::ALL {
            assert_eq!(ErrCode::try_from(u32::from(*e)).unwrap(), *e);
        }
        assert!(Proc::try_from(5).is_err());
        assert!(ErrCode::try_from(0).is_err());
    }

    #[test]
    fn debug_prints_lists() {
        let (repr, _) = Repr::parse(&RXE_READDIRPLUS_CALL).unwrap();
        let s = format!("{repr:?}");
        assert!(s.contains("handle: 2359"), "{s}");
    }

    // --- Property tests ----------------------------------------------------

    fn any_segment() -> impl Strategy<Value = Segment> {
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(handle, length, offset)| Segment {
            handle,
            length,
            offset,
        })
    }

    fn any_read_segment() -> impl Strategy<Value = ReadSegment> {
        (0u32..0x4000_0000, any_segment()).prop_map(|(p, s)| ReadSegment::new(p * 4, s))
    }

    #[derive(Debug, Clone)]
    struct Lists {
        reads: Vec<ReadSegment>,
        writes: Vec<Vec<Segment>>,
        reply: Option<Vec<Segment>>,
    }

    fn any_lists() -> impl Strategy<Value = Lists> {
        (
            proptest::collection::vec(any_read_segment(), 0..5),
            proptest::collection::vec(proptest::collection::vec(any_segment(), 0..4), 0..4),
            proptest::option::of(proptest::collection::vec(any_segment(), 0..4)),
        )
            .prop_map(|(reads, writes, reply)| Lists {
                reads,
                writes,
                reply,
            })
    }

    fn check_round_trip(repr: &Repr<'_>) -> std::result::Result<(), TestCaseError> {
        let mut a = [0u8; 1024];
        let n = repr.emit(&mut a).unwrap();
        prop_assert_eq!(n, repr.buffer_len());
        let (p, len) = Repr::parse(&a[..n]).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(&p, repr);
        let mut b = [0u8; 1024];
        prop_assert_eq!(p.emit(&mut b).unwrap(), n);
        prop_assert_eq!(&a[..n], &b[..n]);
        Ok(())
    }

    proptest! {
        /// emit -> parse -> emit for RDMA_MSG and RDMA_NOMSG with arbitrary lists.
        #[test]
        fn prop_round_trip_msg(xid in any::<u32>(), credit in any::<u32>(), l in any_lists(), nomsg in any::<bool>()) {
            let chunks: Vec<WriteChunk<'_>> = l.writes.iter().map(|c| WriteChunk::Slice(c)).collect();
            let c = Chunks {
                read_list: ReadList::Slice(&l.reads),
                write_list: WriteList::Slice(&chunks),
                reply_chunk: l.reply.as_deref().map(WriteChunk::Slice),
            };
            let repr = if nomsg { Repr::nomsg(xid, credit, c) } else { Repr::msg(xid, credit, c) };
            if nomsg && l.reads.is_empty() && l.reply.is_none() {
                prop_assert!(repr.emit(&mut [0u8; 1024]).is_err());
            } else {
                check_round_trip(&repr)?;
            }
        }

        /// emit -> parse -> emit for RDMA_ERROR (ERR_VERS with any version).
        #[test]
        fn prop_round_trip_error(xid in any::<u32>(), vers in any::<u32>(), credit in any::<u32>(), low in any::<u32>(), high in any::<u32>(), chunk in any::<bool>()) {
            let repr = if chunk {
                Repr { rdma_xid: xid, rdma_vers: 1, rdma_credit: credit, body: Body::Error(ErrorBody::Chunk) }
            } else {
                Repr { rdma_xid: xid, rdma_vers: vers, rdma_credit: credit,
                       body: Body::Error(ErrorBody::Vers { rdma_vers_low: low, rdma_vers_high: high }) }
            };
            check_round_trip(&repr)?;
        }

        #[test]
        fn prop_round_trip_segments(s in any_segment(), r in any_read_segment()) {
            let mut b = [0u8; 20];
            s.emit(&mut b).unwrap();
            prop_assert_eq!(Segment::parse(&b).unwrap(), s);
            r.emit(&mut b).unwrap();
            prop_assert_eq!(ReadSegment::parse(&b).unwrap(), r);
        }

        #[test]
        fn prop_round_trip_private_data(flags in any::<u8>(), s in any::<u8>(), r in any::<u8>()) {
            let p = PrivateDataRepr { flags, max_send_size: decode_buffer_size(s), max_receive_size: decode_buffer_size(r) };
            let mut b = [0u8; 8];
            p.emit(&mut b).unwrap();
            prop_assert_eq!(PrivateDataRepr::parse(&b).unwrap(), p);
        }

        /// Arbitrary octets never panic; whatever parses re-emits identically.
        #[test]
        fn prop_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            parse_emit_compare(&bytes)?;
            let _ = PrivateDataRepr::parse(&bytes);
        }

        /// Arbitrary small words after a valid fixed part reach the list
        /// parsers (discriminators and counts of 0..=3).
        #[test]
        fn prop_arbitrary_words(proc in 0u32..6, ws in proptest::collection::vec(0u32..4, 0..64), cut in 0usize..8) {
            let mut b = vec![0u8, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1];
            b.extend_from_slice(&proc.to_be_bytes());
            for w in ws {
                b.extend_from_slice(&w.to_be_bytes());
            }
            let n = b.len().saturating_sub(cut);
            parse_emit_compare(&b[..n])?;
        }
    }

    fn parse_emit_compare(bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
        if let Ok((repr, len)) = Repr::parse(bytes) {
            prop_assert!(len <= bytes.len());
            prop_assert_eq!(repr.buffer_len(), len);
            // Walk every lazy list.
            if let Some(c) = repr.chunks() {
                let _ = c.read_list.iter().count();
                for ch in c.write_list.iter() {
                    let _ = ch.total_len();
                }
                let _ = c.reply_chunk.map(|c| c.iter().count());
            }
            let mut out = vec![0u8; len];
            match repr.body {
                Body::MsgP { .. } | Body::Done => prop_assert!(repr.emit(&mut out).is_err()),
                _ => {
                    prop_assert_eq!(repr.emit(&mut out).unwrap(), len);
                    prop_assert_eq!(&out[..], &bytes[..len]);
                }
            }
        }
        Ok(())
    }
}
