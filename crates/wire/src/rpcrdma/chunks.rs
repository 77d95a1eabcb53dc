//! The three chunk lists of `RDMA_MSG`, `RDMA_NOMSG` and `RDMA_MSGP` (RFC 8166 §4.1.2
//! `rpc_rdma_header`; encodings in `rpc-rdma.md` §4.2): Read list, Write list, Reply chunk.

use super::read_list::ReadList;
use super::write_list::{WriteChunk, WriteList};
use super::{LAYER, read_present};
use crate::xdr::{XdrReader, XdrWriter};
use crate::{Error, Result};

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

    // pub(super) here, on write and on check_nomsg: Repr (rdma_msg.rs) uses them.
    pub(super) fn parse(r: &mut XdrReader<'a>) -> Result<Chunks<'a>> {
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

    pub(super) fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
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
    pub(super) fn check_nomsg(&self) -> Result<()> {
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

#[cfg(test)]
mod tests;
