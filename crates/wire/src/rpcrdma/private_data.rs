//! The RDMA-CM private data of RPC-over-RDMA Version One (RFC 8797 §4), and the inline
//! threshold a peer assumes without it (RFC 8166 §3.3.3).

use super::LAYER;
use crate::error::need;
use crate::field::{be32, set_be32};
use crate::{Error, Result};

/// RFC 8166 §3.3.3: inline threshold assumed without RFC 8797 private data.
pub const DEFAULT_INLINE_THRESHOLD: u32 = 1024;

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
mod tests;
