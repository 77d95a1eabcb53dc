//! RFC 6581 enhanced connection establishment: the IRD/ORD word at the front of a rev-2
//! Request's or Reply's Private Data (EXT-6581-01).

use super::too_large;
use crate::error::{Layer, Result, need};
use crate::field::{be16, set_be16};

/// RFC 6581 enhanced connection data, the first 4 Private Data octets of a
/// rev-2 Request/Reply, as two big-endian 16-bit words (same layout as Linux
/// siw `struct mpa_v2_data` / cxgb4 `struct mpa_v2_conn_params`):
///
/// ```text
///  0 1 2 ............ 15  16 17 18 ............ 31
/// |P|Z|   IRD (14)       | W| R|    ORD (14)       |
/// ```
/// P = `MPA_V2_PEER_TO_PEER` 0x8000, Z = `MPA_V2_ZERO_LENGTH_RTR` 0x4000 (IRD
/// word); W = `MPA_V2_RDMA_WRITE_RTR` 0x8000, R = `MPA_V2_RDMA_READ_RTR` 0x4000
/// (ORD word); IRD/ORD masked by `MPA_IRD_ORD_MASK` 0x3fff. EXT-6581-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Rev2Params {
    /// P: peer-to-peer mode (an RTR message follows the Reply).
    pub p2p: bool,
    /// Z: a zero-length Send may serve as RTR.
    pub zero_len_rtr: bool,
    /// W: a zero-length RDMA Write may serve as RTR.
    pub write_rtr: bool,
    /// R: a zero-length RDMA Read may serve as RTR.
    pub read_rtr: bool,
    /// Inbound RDMA Read queue depth of the sender (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth of the sender (14 bits).
    pub ord: u16,
}

impl Rev2Params {
    /// Wire size: 4 octets.
    pub const LEN: usize = 4;
    /// IRD word: peer-to-peer flag.
    pub const PEER_TO_PEER: u16 = 0x8000;
    /// IRD word: zero-length Send RTR.
    pub const ZERO_LENGTH_RTR: u16 = 0x4000;
    /// ORD word: zero-length RDMA Write RTR.
    pub const RDMA_WRITE_RTR: u16 = 0x8000;
    /// ORD word: zero-length RDMA Read RTR.
    pub const RDMA_READ_RTR: u16 = 0x4000;
    /// IRD / ORD value mask (14 bits).
    pub const IRD_ORD_MASK: u16 = 0x3fff;

    /// Parse the first 4 octets of `private_data` (the rest is the ULP's).
    pub fn parse(private_data: &[u8]) -> Result<Self> {
        need(Layer::Mpa, private_data, Self::LEN)?;
        let ird = be16(private_data, 0);
        let ord = be16(private_data, 2);
        Ok(Rev2Params {
            p2p: ird & Self::PEER_TO_PEER != 0,
            zero_len_rtr: ird & Self::ZERO_LENGTH_RTR != 0,
            write_rtr: ord & Self::RDMA_WRITE_RTR != 0,
            read_rtr: ord & Self::RDMA_READ_RTR != 0,
            ird: ird & Self::IRD_ORD_MASK,
            ord: ord & Self::IRD_ORD_MASK,
        })
    }

    /// 4.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Write the 4 octets; IRD or ORD above 0x3fff is `TooLarge`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        for (what, v) in [("IRD", self.ird), ("ORD", self.ord)] {
            if v > Self::IRD_ORD_MASK {
                return Err(too_large(
                    what,
                    usize::from(v),
                    usize::from(Self::IRD_ORD_MASK),
                ));
            }
        }
        need(Layer::Mpa, buf, Self::LEN)?;
        let flag = |on: bool, bit: u16| if on { bit } else { 0 };
        let ird = self.ird
            | flag(self.p2p, Self::PEER_TO_PEER)
            | flag(self.zero_len_rtr, Self::ZERO_LENGTH_RTR);
        let ord = self.ord
            | flag(self.write_rtr, Self::RDMA_WRITE_RTR)
            | flag(self.read_rtr, Self::RDMA_READ_RTR);
        set_be16(buf, 0, ird);
        set_be16(buf, 2, ord);
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests;
