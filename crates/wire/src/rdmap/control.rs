//! The RDMAP control field (RFC 5040 §4.1, Figure 3) and its OpCodes (§4.2 Figure 4, with
//! RFC 7306's 0x8..0xB), each with the untagged DDP queue it uses (§3.1).

use crate::error::{Error, Layer, Result, need};
use crate::macros::wire_enum;

/// RFC 5040 §4.1: RV of this specification (`01b`, RDMAP-19).
pub const RDMAP_VERSION: u8 = 1;
/// RFC 5040 §4.1: RV bits of the RDMAP control field.
pub const MASK_RV: u8 = 0xC0;
/// RFC 5040 §4.1: Rsv bits of the RDMAP control field.
pub const MASK_RSV: u8 = 0x30;
/// RFC 5040 §4.1: OpCode bits of the RDMAP control field.
pub const MASK_OPCODE: u8 = 0x0F;

/// `Error::Unknown::field` of a reserved OpCode (see [`classify`](super::classify)).
pub const FIELD_OPCODE: &str = "RDMAP OpCode";
/// `Error::Unknown::field` of a QN that names no RDMAP queue (see [`classify`](super::classify)).
pub const FIELD_QN: &str = "DDP Queue Number";

wire_enum! {
    /// RFC 5040 §4.2 Figure 4 (0x0..0x7, RDMAP-17) and RFC 7306 (0x8..0xB).
    /// 0xC..0xF are reserved: `TryFrom` gives `Error::Unknown` with
    /// [`FIELD_OPCODE`], which [`terminate_code_for`](super::terminate_code_for) maps to
    /// Unexpected OpCode.
    pub enum Opcode: u8 => (Layer::Rdmap, FIELD_OPCODE) {
        RdmaWrite = 0x0,
        RdmaReadRequest = 0x1,
        RdmaReadResponse = 0x2,
        Send = 0x3,
        SendWithInvalidate = 0x4,
        SendWithSe = 0x5,
        SendWithSeAndInvalidate = 0x6,
        Terminate = 0x7,
        /// RFC 7306.
        ImmediateData = 0x8,
        /// RFC 7306.
        ImmediateDataWithSe = 0x9,
        /// RFC 7306.
        AtomicRequest = 0xA,
        /// RFC 7306.
        AtomicResponse = 0xB,
    }
}

impl Opcode {
    /// RFC 5040 Figure 4 / RFC 7306: the DDP T flag this opcode requires (RDMAP-16).
    pub const fn tagged(self) -> bool {
        matches!(self, Opcode::RdmaWrite | Opcode::RdmaReadResponse)
    }

    /// RFC 5040 Figure 4 / RFC 7306: the untagged queue (RDMAP-02, -42, -58,
    /// -68); `None` for the tagged opcodes.
    pub const fn queue(self) -> Option<Queue> {
        Some(match self {
            Opcode::RdmaWrite | Opcode::RdmaReadResponse => return None,
            Opcode::Send
            | Opcode::SendWithInvalidate
            | Opcode::SendWithSe
            | Opcode::SendWithSeAndInvalidate
            | Opcode::ImmediateData
            | Opcode::ImmediateDataWithSe => Queue::Send,
            Opcode::RdmaReadRequest | Opcode::AtomicRequest => Queue::ReadRequest,
            Opcode::Terminate => Queue::Terminate,
            Opcode::AtomicResponse => Queue::AtomicResponse,
        })
    }

    /// RFC 5040 §4.1: RsvdULP octets 1..5 hold a valid Invalidate STag (RDMAP-15).
    pub const fn carries_invalidate_stag(self) -> bool {
        matches!(
            self,
            Opcode::SendWithInvalidate | Opcode::SendWithSeAndInvalidate
        )
    }

    /// The Solicited Event variants (RDMAP-63).
    pub const fn solicited_event(self) -> bool {
        matches!(
            self,
            Opcode::SendWithSe | Opcode::SendWithSeAndInvalidate | Opcode::ImmediateDataWithSe
        )
    }

    /// Defined by RFC 7306 rather than RFC 5040.
    pub const fn is_rfc7306(self) -> bool {
        self as u8 >= Opcode::ImmediateData as u8
    }

    /// Carries an RDMAP header instead of ULP payload (RDMAP-22), so the
    /// message must be one DDP segment at MO 0.
    pub const fn has_rdmap_header(self) -> bool {
        matches!(
            self,
            Opcode::RdmaReadRequest
                | Opcode::Terminate
                | Opcode::ImmediateData
                | Opcode::ImmediateDataWithSe
                | Opcode::AtomicRequest
                | Opcode::AtomicResponse
        )
    }
}

wire_enum! {
    /// RFC 5040 §3.1 (RDMAP-02) and RFC 7306: the untagged DDP queues RDMAP uses.
    pub enum Queue: u32 => (Layer::Ddp, FIELD_QN) {
        /// QN 0: Send family and RFC 7306 Immediate Data.
        Send = 0,
        /// QN 1: RDMA Read Requests and RFC 7306 Atomic Requests.
        ReadRequest = 1,
        /// QN 2: Terminate.
        Terminate = 2,
        /// QN 3 (RFC 7306): Atomic Responses.
        AtomicResponse = 3,
    }
}

/// RFC 5040 §4.1 Figure 3: the RDMAP control field (RsvdULP octet 0, RDMAP-14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Control {
    /// RV (0..=3), kept raw: the engine compares it with the negotiated
    /// version (RDMAP-105, Terminate 0/2/0x05).
    pub rv: u8,
    /// Rsv (0..=3): sent as 0, ignored, kept raw (RDMAP-20).
    pub rsv: u8,
    pub opcode: Opcode,
}

impl Control {
    /// RV 1, Rsv 0.
    pub const fn new(opcode: Opcode) -> Self {
        Control {
            rv: RDMAP_VERSION,
            rsv: 0,
            opcode,
        }
    }

    /// Decodes the control octet; `Err(Unknown)` for a reserved opcode.
    pub fn from_octet(octet: u8) -> Result<Self> {
        Ok(Control {
            rv: (octet & MASK_RV) >> 6,
            rsv: (octet & MASK_RSV) >> 4,
            opcode: Opcode::try_from(octet & MASK_OPCODE)?,
        })
    }

    /// The control octet; `Err(TooLarge)` if RV or Rsv exceed two bits.
    pub fn octet(&self) -> Result<u8> {
        for (what, v) in [("RDMAP RV", self.rv), ("RDMAP Rsv", self.rsv)] {
            if v > 3 {
                return Err(Error::TooLarge {
                    layer: Layer::Rdmap,
                    what,
                    value: v.into(),
                    limit: 3,
                });
            }
        }
        Ok((self.rv << 6) | (self.rsv << 4) | u8::from(self.opcode))
    }

    /// Parses the control octet at `buf[0]`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        need(Layer::Rdmap, buf, 1)?;
        Self::from_octet(buf[0])
    }

    /// One octet.
    pub const fn buffer_len(&self) -> usize {
        1
    }

    /// Writes the control octet at `buf[0]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let octet = self.octet()?;
        need(Layer::Rdmap, buf, 1)?;
        buf[0] = octet;
        Ok(1)
    }
}

#[cfg(test)]
mod tests;
