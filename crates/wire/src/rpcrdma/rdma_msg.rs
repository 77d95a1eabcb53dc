//! A whole RPC-over-RDMA Version One header (RFC 8166 §4.1.2 `struct rdma_msg`): the body
//! each `rdma_proc` carries (§4.2.4), the `RDMA_ERROR` bodies and the receiver's errors (§4.5).

use super::LAYER;
use super::chunks::Chunks;
use super::header::{ErrCode, FIXED_LEN, Header, Proc, RPCRDMA_VERSION};
use crate::error::need;
use crate::field::be32;
use crate::xdr::{XdrReader, XdrWriter};
use crate::{Error, Result};

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

#[cfg(test)]
mod tests;
