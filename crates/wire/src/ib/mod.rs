//! InfiniBand transport headers (IBA Vol. 1 ch. 9), as carried by RoCEv2.
//!
//! * [`Bth`] / [`BthRepr`]: Base Transport Header (§9.2).
//! * [`Opcode`], [`Service`], [`Operation`], [`Headers`]: Table 38 and the
//!   headers each opcode carries (IBT-C9-2).
//! * Extended headers (§9.3): [`Rdeth`], [`Deth`], [`XrcEth`], [`Feth`],
//!   [`Reth`], [`AtomicEth`], [`Aeth`] (with [`Syndrome`]),
//!   [`AtomicAckEth`], [`ImmDt`], [`Ieth`], each with a `*Repr`.
//! * [`PacketRepr`]: BTH + extended headers + payload + pad.
//! * [`psn`]: 24-bit PSN arithmetic and responder regions.
//! * [`mad`], [`cm`]: Management Datagrams on QP1 (§13.4) and the Communication Manager's
//!   messages (§12.6).
//!
//! Spec digest: `../shared/spec/ib-transport.md`. The ICRC and the IP/UDP
//! encapsulation live in [`crate::rocev2`].

pub mod aeth;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod eth;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;

/// CM MADs of real Linux traffic, for golden tests here and in the engines.
#[cfg(any(test, feature = "test-vectors"))]
pub mod cm_vectors;
#[cfg(test)]
pub(crate) mod testdata;

pub use aeth::{Aeth, AethRepr, CreditCode, NakCode, RnrTimer, Syndrome};
pub use bth::{BTH_LEN, Bth, BthRepr, DEFAULT_PKEY, MULTICAST_QPN};
pub use eth::{
    AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, AtomicAckEth, AtomicAckEthRepr, AtomicEth,
    AtomicEthRepr, DETH_LEN, Deth, DethRepr, FETH_LEN, Feth, FethRepr, GSI_QKEY, IETH_LEN,
    IMMDT_LEN, Ieth, IethRepr, ImmDt, ImmDtRepr, RDETH_LEN, RETH_LEN, Rdeth, RdethRepr, Reth,
    RethRepr, XRCETH_LEN, XrcEth, XrcEthRepr,
};
pub use opcode::{Headers, Opcode, Operation, Service};
pub use packet::{PacketRepr, pad_count};
pub use psn::{
    PSN_MASK, PsnRegion, psn_add, psn_cmp, psn_diff, psn_in_window, psn_region, psn_sub,
    read_psn_count,
};

use crate::error::{Error, Layer, Result};

/// `TooLarge` unless `value` fits in `bits` bits (emit-side range check).
pub(crate) fn fits(layer: Layer, what: &'static str, value: u64, bits: u32) -> Result<()> {
    let limit = (1u64 << bits) - 1;
    if value > limit {
        Err(Error::TooLarge {
            layer,
            what,
            value,
            limit,
        })
    } else {
        Ok(())
    }
}
