//! One DDP segment carrying RDMAP, the whole ULPDU (RFC 5040 §4, RFC 7306): the DDP
//! header with the RDMAP control field, then the body its opcode carries.

use super::atomic::{
    ATOMIC_REQUEST_HEADER_LEN, ATOMIC_RESPONSE_HEADER_LEN, AtomicRequestRepr, AtomicResponseRepr,
};
use super::control::{Control, Opcode, Queue};
use super::immediate_data::{IMMEDIATE_DATA_HEADER_LEN, ImmediateDataRepr};
use super::read_request::{READ_REQUEST_HEADER_LEN, ReadRequestRepr};
use super::terminate::{TerminateLayout, TerminateRepr};
use super::violation::Violation;
use crate::ddp;
use crate::error::{Error, Layer, Result, need};
use crate::field::{be32, set_be32};

/// What follows the DDP header, one variant per opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Body<'a> {
    RdmaWrite {
        payload: &'a [u8],
    },
    RdmaReadRequest(ReadRequestRepr),
    RdmaReadResponse {
        payload: &'a [u8],
    },
    Send {
        payload: &'a [u8],
    },
    /// The Invalidate STag travels in RsvdULP octets 1..5 (RDMAP-15, RDMAP-66).
    SendWithInvalidate {
        invalidate_stag: u32,
        payload: &'a [u8],
    },
    SendWithSe {
        payload: &'a [u8],
    },
    SendWithSeAndInvalidate {
        invalidate_stag: u32,
        payload: &'a [u8],
    },
    Terminate(TerminateRepr),
    ImmediateData(ImmediateDataRepr),
    ImmediateDataWithSe(ImmediateDataRepr),
    AtomicRequest(AtomicRequestRepr),
    AtomicResponse(AtomicResponseRepr),
}

impl<'a> Body<'a> {
    /// The opcode this body belongs to.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Body::RdmaWrite { .. } => Opcode::RdmaWrite,
            Body::RdmaReadRequest(_) => Opcode::RdmaReadRequest,
            Body::RdmaReadResponse { .. } => Opcode::RdmaReadResponse,
            Body::Send { .. } => Opcode::Send,
            Body::SendWithInvalidate { .. } => Opcode::SendWithInvalidate,
            Body::SendWithSe { .. } => Opcode::SendWithSe,
            Body::SendWithSeAndInvalidate { .. } => Opcode::SendWithSeAndInvalidate,
            Body::Terminate(_) => Opcode::Terminate,
            Body::ImmediateData(_) => Opcode::ImmediateData,
            Body::ImmediateDataWithSe(_) => Opcode::ImmediateDataWithSe,
            Body::AtomicRequest(_) => Opcode::AtomicRequest,
            Body::AtomicResponse(_) => Opcode::AtomicResponse,
        }
    }

    /// ULP payload of Write, Read Response and the Send family.
    pub const fn payload(&self) -> Option<&'a [u8]> {
        match *self {
            Body::RdmaWrite { payload }
            | Body::RdmaReadResponse { payload }
            | Body::Send { payload }
            | Body::SendWithInvalidate { payload, .. }
            | Body::SendWithSe { payload }
            | Body::SendWithSeAndInvalidate { payload, .. } => Some(payload),
            _ => None,
        }
    }

    /// The Invalidate STag of the two Invalidate opcodes.
    pub const fn invalidate_stag(&self) -> Option<u32> {
        match *self {
            Body::SendWithInvalidate {
                invalidate_stag, ..
            }
            | Body::SendWithSeAndInvalidate {
                invalidate_stag, ..
            } => Some(invalidate_stag),
            _ => None,
        }
    }

    /// Octets after the DDP header.
    pub const fn buffer_len(&self) -> usize {
        match self {
            Body::RdmaReadRequest(r) => r.buffer_len(),
            Body::Terminate(t) => t.buffer_len(),
            Body::ImmediateData(i) | Body::ImmediateDataWithSe(i) => i.buffer_len(),
            Body::AtomicRequest(a) => a.buffer_len(),
            Body::AtomicResponse(a) => a.buffer_len(),
            Body::RdmaWrite { payload }
            | Body::RdmaReadResponse { payload }
            | Body::Send { payload }
            | Body::SendWithInvalidate { payload, .. }
            | Body::SendWithSe { payload }
            | Body::SendWithSeAndInvalidate { payload, .. } => payload.len(),
        }
    }

    /// Writes exactly [`buffer_len`](Self::buffer_len) octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        match self {
            Body::RdmaReadRequest(r) => r.emit(buf),
            Body::Terminate(t) => t.emit(buf),
            Body::ImmediateData(i) | Body::ImmediateDataWithSe(i) => i.emit(buf),
            Body::AtomicRequest(a) => a.emit(buf),
            Body::AtomicResponse(a) => a.emit(buf),
            Body::RdmaWrite { payload }
            | Body::RdmaReadResponse { payload }
            | Body::Send { payload }
            | Body::SendWithInvalidate { payload, .. }
            | Body::SendWithSe { payload }
            | Body::SendWithSeAndInvalidate { payload, .. } => {
                need(Layer::Rdmap, buf, payload.len())?;
                buf[..payload.len()].copy_from_slice(payload);
                Ok(payload.len())
            }
        }
    }
}

/// One DDP segment carrying RDMAP: the whole ULPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Segment<'a> {
    /// The DDP header. Its RsvdULP keeps the raw octets; on emit octet 0 is
    /// replaced by `control` and, for the Invalidate opcodes, octets 1..5 by
    /// the body's Invalidate STag (otherwise they are kept, RDMAP-21).
    pub ddp: ddp::Repr,
    pub control: Control,
    pub body: Body<'a>,
}

/// RFC 5040 Figure 4 / RFC 7306: T flag, QN and segmentation rules (RDMAP-104).
fn check_ddp(opcode: Opcode, ddp: &ddp::Repr) -> Result<()> {
    if ddp.is_tagged() != opcode.tagged() {
        return Err(Violation::TaggedFlagMismatch.error());
    }
    if let ddp::Repr::Untagged { qn, mo, last, .. } = *ddp {
        let queue = Queue::try_from(qn)?;
        if opcode.queue() != Some(queue) {
            return Err(Violation::QueueMismatch.error());
        }
        if opcode.has_rdmap_header() && (mo != 0 || !last) {
            return Err(Violation::NotSingleSegment.error());
        }
    }
    Ok(())
}

/// A fixed-size RDMAP header that must fill the rest of the ULPDU.
fn exact<R>(
    ulpdu: &[u8],
    hl: usize,
    len: usize,
    parse: impl FnOnce(&[u8]) -> Result<R>,
) -> Result<R> {
    need(Layer::Rdmap, ulpdu, hl + len)?;
    if ulpdu.len() > hl + len {
        return Err(Violation::TrailingOctets.error());
    }
    parse(&ulpdu[hl..])
}

impl<'a> Segment<'a> {
    /// A segment with `Control::new(body.opcode())`.
    pub const fn new(ddp: ddp::Repr, body: Body<'a>) -> Self {
        Segment {
            ddp,
            control: Control::new(body.opcode()),
            body,
        }
    }

    /// Parses one ULPDU. Besides `Truncated`, rejects what
    /// [`terminate_code_for`](super::terminate_code_for) maps to a Terminate: reserved opcode,
    /// T flag or QN not as Figure 4 says, header messages split or followed by octets.
    pub fn parse(ulpdu: &'a [u8]) -> Result<Self> {
        Self::parse_inner(ulpdu, None)
    }

    /// [`parse`](Self::parse), reading a Terminate's control word in `layout`
    /// instead of guessing it with [`TerminateLayout::detect`].
    pub fn parse_with_layout(ulpdu: &'a [u8], layout: TerminateLayout) -> Result<Self> {
        Self::parse_inner(ulpdu, Some(layout))
    }

    fn parse_inner(ulpdu: &'a [u8], layout: Option<TerminateLayout>) -> Result<Self> {
        let ddp = ddp::Repr::parse(ulpdu)?;
        let control = Control::from_octet(ddp.rsvd_ulp()[0])?;
        let opcode = control.opcode;
        check_ddp(opcode, &ddp)?;
        let hl = ddp.header_len();
        let rest = &ulpdu[hl..];
        let invalidate_stag = || be32(ddp.rsvd_ulp(), 1);
        let body = match opcode {
            Opcode::RdmaWrite => Body::RdmaWrite { payload: rest },
            Opcode::RdmaReadResponse => Body::RdmaReadResponse { payload: rest },
            Opcode::Send => Body::Send { payload: rest },
            Opcode::SendWithSe => Body::SendWithSe { payload: rest },
            Opcode::SendWithInvalidate => Body::SendWithInvalidate {
                invalidate_stag: invalidate_stag(),
                payload: rest,
            },
            Opcode::SendWithSeAndInvalidate => Body::SendWithSeAndInvalidate {
                invalidate_stag: invalidate_stag(),
                payload: rest,
            },
            Opcode::RdmaReadRequest => Body::RdmaReadRequest(exact(
                ulpdu,
                hl,
                READ_REQUEST_HEADER_LEN,
                ReadRequestRepr::parse,
            )?),
            Opcode::Terminate => Body::Terminate(
                match layout {
                    Some(layout) => TerminateRepr::parse_with_layout(rest, layout),
                    None => TerminateRepr::parse(rest),
                }
                // Report lengths relative to the ULPDU, like the other bodies.
                .map_err(|e| match e {
                    Error::Truncated { layer, need, have } => Error::Truncated {
                        layer,
                        need: need + hl,
                        have: have + hl,
                    },
                    e => e,
                })?,
            ),
            Opcode::ImmediateData => Body::ImmediateData(exact(
                ulpdu,
                hl,
                IMMEDIATE_DATA_HEADER_LEN,
                ImmediateDataRepr::parse,
            )?),
            Opcode::ImmediateDataWithSe => Body::ImmediateDataWithSe(exact(
                ulpdu,
                hl,
                IMMEDIATE_DATA_HEADER_LEN,
                ImmediateDataRepr::parse,
            )?),
            Opcode::AtomicRequest => Body::AtomicRequest(exact(
                ulpdu,
                hl,
                ATOMIC_REQUEST_HEADER_LEN,
                AtomicRequestRepr::parse,
            )?),
            Opcode::AtomicResponse => Body::AtomicResponse(exact(
                ulpdu,
                hl,
                ATOMIC_RESPONSE_HEADER_LEN,
                AtomicResponseRepr::parse,
            )?),
        };
        Ok(Segment { ddp, control, body })
    }

    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        self.control.opcode
    }

    /// Octets [`emit`](Self::emit) writes: the whole ULPDU.
    pub const fn buffer_len(&self) -> usize {
        self.ddp.header_len() + self.body.buffer_len()
    }

    /// Writes the ULPDU. Refuses (with the errors `parse` would give) a
    /// segment `parse` would reject, and a `control.opcode` that differs from
    /// the body's.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let opcode = self.control.opcode;
        if self.body.opcode() != opcode {
            return Err(Error::Malformed {
                layer: Layer::Rdmap,
                reason: "control opcode does not match the body",
            });
        }
        check_ddp(opcode, &self.ddp)?;
        let len = self.buffer_len();
        need(Layer::Rdmap, buf, len)?;
        let mut ddp = self.ddp;
        let ulp = ddp.rsvd_ulp_mut();
        ulp[0] = self.control.octet()?;
        if let (Some(stag), true) = (self.body.invalidate_stag(), ulp.len() >= 5) {
            set_be32(ulp, 1, stag);
        }
        let hl = ddp.emit(buf)?;
        self.body.emit(&mut buf[hl..len])?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests;
