//! Management Datagrams (IBA Vol. 1 §13.4): the 256-octet MAD and its common header, as the
//! General Services Interface (QP1) carries them — the Communication Manager's (class 0x07,
//! [`crate::ib::cm`]) among them.

use crate::error::{Layer, Result, need};

/// Every MAD on QP1 is this long (IBA §13.4.2).
pub const MAD_LEN: usize = 256;
/// The common MAD header (IBA §13.4.2, Table 145).
pub const MAD_HEADER_LEN: usize = 24;
/// Octets after the header: a CM message's room.
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// BaseVersion of every MAD (IBA §13.4.2).
pub const BASE_VERSION: u8 = 1;
/// MgmtClass of the Communication Manager (IBA §13.4.4, Table 147).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// ClassVersion of the CM that Linux speaks (IBA §12.11: version 2).
pub const CM_CLASS_VERSION: u8 = 2;

/// `Method` values (IBA §13.4.5, Table 148) the CM uses: every CM message is a Send.
pub mod method {
    /// Get.
    pub const GET: u8 = 0x01;
    /// Set.
    pub const SET: u8 = 0x02;
    /// Send: a datagram with no response expected (all CM messages, IBA §12.6).
    pub const SEND: u8 = 0x03;
    /// The response bit (R) of the Method octet.
    pub const RESPONSE: u8 = 0x80;
}

/// The common MAD header (IBA §13.4.2, Table 145).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeaderRepr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// R bit and Method.
    pub method: u8,
    /// Status (class-specific meaning in the upper bits).
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID: the requester's, echoed by responses.
    pub transaction_id: u64,
    /// AttributeID: which message (for the CM, [`crate::ib::cm::CmAttr`]).
    pub attribute_id: u16,
    /// AttributeModifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// A CM header (class 0x07, version 2, Send) for `attribute_id`.
    pub fn cm(attribute_id: u16, transaction_id: u64) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Reads the header; only its length is checked (BaseVersion and class are the
    /// receiver's to judge, IBA §13.5.3).
    pub fn parse(b: &[u8]) -> Result<MadHeaderRepr> {
        need(Layer::Mad, b, MAD_HEADER_LEN)?;
        let h = &b[..MAD_HEADER_LEN];
        let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let mut tid = [0u8; 8];
        tid.copy_from_slice(&h[8..16]);
        Ok(MadHeaderRepr {
            base_version: h[0],
            mgmt_class: h[1],
            class_version: h[2],
            method: h[3],
            status: be16(4),
            class_specific: be16(6),
            transaction_id: u64::from_be_bytes(tid),
            attribute_id: be16(16),
            attribute_modifier: u32::from_be_bytes([h[20], h[21], h[22], h[23]]),
        })
    }

    /// Writes the header into the first [`MAD_HEADER_LEN`] octets of `b` (the reserved
    /// field zero).
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need(Layer::Mad, b, MAD_HEADER_LEN)?;
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        b[4..6].copy_from_slice(&self.status.to_be_bytes());
        b[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        b[8..16].copy_from_slice(&self.transaction_id.to_be_bytes());
        b[16..18].copy_from_slice(&self.attribute_id.to_be_bytes());
        b[18..20].copy_from_slice(&[0, 0]);
        b[20..24].copy_from_slice(&self.attribute_modifier.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::cm_vectors::RPING_REQ;

    #[test]
    fn header_of_a_linux_cm_req() {
        let h = MadHeaderRepr::parse(&RPING_REQ).unwrap();
        assert_eq!(
            (h.base_version, h.mgmt_class, h.class_version, h.method),
            (1, MGMT_CLASS_CM, CM_CLASS_VERSION, method::SEND)
        );
        assert_eq!(h.attribute_id, 0x0010);
        assert_eq!(h.transaction_id, 0x2_5cc4_d3d6);
        let mut b = [0xFFu8; MAD_HEADER_LEN];
        h.emit(&mut b).unwrap();
        assert_eq!(b[..], RPING_REQ[..MAD_HEADER_LEN]);
        assert!(MadHeaderRepr::parse(&RPING_REQ[..23]).is_err());
        assert!(h.emit(&mut [0u8; 23]).is_err());
    }
}
