//! The fixed part of every RPC-over-RDMA header (RFC 8166 §4.2), four words every version
//! keeps in place (§7); the `rdma_proc` and `rdma_err` values and the message lengths.

use super::LAYER;
use crate::Result;
use crate::error::need;
use crate::field::{be32, set_be32};
use crate::macros::wire_enum;

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

#[cfg(test)]
mod tests;
