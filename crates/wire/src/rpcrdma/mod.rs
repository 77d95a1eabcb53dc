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

use crate::xdr::XdrReader;
use crate::{Error, Layer, Result};

const LAYER: Layer = Layer::RpcRdma;

// Shared by the chunk-list files: XDR optional-data discriminators, the octets a list
// spans, bound errors.
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

mod chunks;
mod header;
mod private_data;
mod rdma_msg;
mod read_list;
mod segment;
mod write_list;

#[cfg(test)]
mod test_util;

pub use chunks::Chunks;
pub use header::{
    ERR_CHUNK_LEN, ERR_VERS_LEN, ErrCode, FIXED_LEN, Header, MIN_HEADER_LEN, Proc, RPCRDMA_VERSION,
};
pub use private_data::{
    DEFAULT_INLINE_THRESHOLD, PRIVATE_DATA_FLAG_REMOTE_INVALIDATE, PRIVATE_DATA_LEN,
    PRIVATE_DATA_MAGIC, PRIVATE_DATA_VERSION, PrivateData, PrivateDataRepr, decode_buffer_size,
    encode_buffer_size,
};
pub use rdma_msg::{Body, ErrorBody, Repr};
pub use read_list::{MAX_READ_SEGMENTS, ReadList, ReadSegments, WireReadList};
pub use segment::{ReadSegment, Segment};
pub use write_list::{
    MAX_CHUNK_SEGMENTS, MAX_WRITE_CHUNKS, Segments, WireSegments, WireWriteList, WriteChunk,
    WriteChunks, WriteList,
};
