//! Extended transport headers (IBA §9.3; ib-transport.md §4), except the
//! AETH, which has its own module (`super::aeth`). All fields big-endian.

use crate::error::{Layer, Result, need};
use crate::field::{be24, be32, be64, set_be24, set_be32, set_be64};

use super::fits;

/// RDETH length (IBA §9.3.1).
pub const RDETH_LEN: usize = 4;
/// DETH length (IBA §9.3.2).
pub const DETH_LEN: usize = 8;
/// RETH length (IBA §9.3.3).
pub const RETH_LEN: usize = 16;
/// AtomicETH length (IBA §9.3.4).
pub const ATOMIC_ETH_LEN: usize = 28;
/// AETH length (IBA §9.3.5).
pub const AETH_LEN: usize = 4;
/// AtomicAckETH length (IBA §9.3.5.3).
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// ImmDt length (IBA §9.3.6).
pub const IMMDT_LEN: usize = 4;
/// IETH length (IBA §9.3.7).
pub const IETH_LEN: usize = 4;
/// XRCETH length (IBA §9.3.8; size from the field widths).
pub const XRCETH_LEN: usize = 4;
/// FETH length (IBA 1.5 FLUSH; Linux `struct rxe_feth`).
pub const FETH_LEN: usize = 4;

/// Q_Key of QP1, the GSI (IBT-C9-49).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// View boilerplate shared by every header of this module.
macro_rules! view {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps without checking the length (accessors may then panic).
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps after checking the length.
            pub fn new_checked(buffer: T) -> Result<Self> {
                let h = Self::new_unchecked(buffer);
                h.check_len()?;
                Ok(h)
            }

            /// `Err(Truncated)` when the buffer is shorter than the header.
            pub fn check_len(&self) -> Result<()> {
                need(Layer::IbExt, self.buffer.as_ref(), $len)
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use view;

// ---------------------------------------------------------------- RDETH

view!(
    /// IBA §9.3.1: RDETH = Reserved(8) | EE Context(24). RD only.
    Rdeth,
    RDETH_LEN
);

impl<T: AsRef<[u8]>> Rdeth<T> {
    /// Reserved octet (o9-2: send 0, ignore).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    pub fn ee_context(&self) -> u32 {
        be24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Rdeth<T> {
    pub fn set_reserved(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }
    /// Keeps the low 24 bits.
    pub fn set_ee_context(&mut self, v: u32) {
        set_be24(self.buffer.as_mut(), 1, v & 0xFF_FFFF);
    }
}

/// RDETH fields, reserved octet kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RdethRepr {
    pub reserved: u8,
    pub ee_context: u32,
}

impl RdethRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Rdeth::new_checked(buf)?;
        Ok(Self {
            reserved: h.reserved(),
            ee_context: h.ee_context(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        RDETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, RDETH_LEN)?;
        fits(Layer::IbExt, "EE Context", self.ee_context as u64, 24)?;
        let mut h = Rdeth::new_unchecked(buf);
        h.set_reserved(self.reserved);
        h.set_ee_context(self.ee_context);
        Ok(RDETH_LEN)
    }
}

// ---------------------------------------------------------------- DETH

view!(
    /// IBA §9.3.2: DETH = Q_Key(32) | Reserved(8) | SrcQP(24). UD and RD.
    Deth,
    DETH_LEN
);

impl<T: AsRef<[u8]>> Deth<T> {
    pub fn q_key(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
    /// Reserved octet (C9-8: send 0, ignore).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[4]
    }
    pub fn src_qp(&self) -> u32 {
        be24(self.buffer.as_ref(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    pub fn set_q_key(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), 0, v);
    }
    pub fn set_reserved(&mut self, v: u8) {
        self.buffer.as_mut()[4] = v;
    }
    /// Keeps the low 24 bits.
    pub fn set_src_qp(&mut self, v: u32) {
        set_be24(self.buffer.as_mut(), 5, v & 0xFF_FFFF);
    }
}

/// DETH fields, reserved octet kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DethRepr {
    pub q_key: u32,
    pub reserved: u8,
    pub src_qp: u32,
}

impl DethRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Deth::new_checked(buf)?;
        Ok(Self {
            q_key: h.q_key(),
            reserved: h.reserved(),
            src_qp: h.src_qp(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, DETH_LEN)?;
        fits(Layer::IbExt, "SrcQP", self.src_qp as u64, 24)?;
        let mut h = Deth::new_unchecked(buf);
        h.set_q_key(self.q_key);
        h.set_reserved(self.reserved);
        h.set_src_qp(self.src_qp);
        Ok(DETH_LEN)
    }
}

// ---------------------------------------------------------------- RETH

view!(
    /// IBA §9.3.3: RETH = VA(64) | R_Key(32) | DMALen(32).
    Reth,
    RETH_LEN
);

impl<T: AsRef<[u8]>> Reth<T> {
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
    pub fn r_key(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    /// 0 ..= 2^31 is legal (C9-9); the codec keeps any value.
    pub fn dma_len(&self) -> u32 {
        be32(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    pub fn set_va(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), 0, v);
    }
    pub fn set_r_key(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), 8, v);
    }
    pub fn set_dma_len(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), 12, v);
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RethRepr {
    pub va: u64,
    pub r_key: u32,
    pub dma_len: u32,
}

impl RethRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Reth::new_checked(buf)?;
        Ok(Self {
            va: h.va(),
            r_key: h.r_key(),
            dma_len: h.dma_len(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, RETH_LEN)?;
        let mut h = Reth::new_unchecked(buf);
        h.set_va(self.va);
        h.set_r_key(self.r_key);
        h.set_dma_len(self.dma_len);
        Ok(RETH_LEN)
    }
}

// ---------------------------------------------------------------- AtomicETH

view!(
    /// IBA §9.3.4: AtomicETH = VA(64) | R_Key(32) | Swap/Add Data(64) |
    /// Compare Data(64). 28 octets, so the 64-bit fields are not aligned.
    AtomicEth,
    ATOMIC_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
    pub fn r_key(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    /// Swap data (CmpSwap) or Add data (FetchAdd).
    pub fn swap_add_data(&self) -> u64 {
        be64(self.buffer.as_ref(), 12)
    }
    /// Compare data (CmpSwap; FetchAdd ignores it).
    pub fn compare_data(&self) -> u64 {
        be64(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    pub fn set_va(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), 0, v);
    }
    pub fn set_r_key(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), 8, v);
    }
    pub fn set_swap_add_data(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), 12, v);
    }
    pub fn set_compare_data(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), 20, v);
    }
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AtomicEthRepr {
    pub va: u64,
    pub r_key: u32,
    pub swap_add_data: u64,
    pub compare_data: u64,
}

impl AtomicEthRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = AtomicEth::new_checked(buf)?;
        Ok(Self {
            va: h.va(),
            r_key: h.r_key(),
            swap_add_data: h.swap_add_data(),
            compare_data: h.compare_data(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, ATOMIC_ETH_LEN)?;
        let mut h = AtomicEth::new_unchecked(buf);
        h.set_va(self.va);
        h.set_r_key(self.r_key);
        h.set_swap_add_data(self.swap_add_data);
        h.set_compare_data(self.compare_data);
        Ok(ATOMIC_ETH_LEN)
    }
}

// ---------------------------------------------------------------- AtomicAckETH

view!(
    /// IBA §9.3.5.3: AtomicAckETH = Orig Rem Dt(64), the value read before
    /// the operation.
    AtomicAckEth,
    ATOMIC_ACK_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    pub fn orig_remote_data(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    pub fn set_orig_remote_data(&mut self, v: u64) {
        set_be64(self.buffer.as_mut(), 0, v);
    }
}

/// AtomicAckETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AtomicAckEthRepr {
    pub orig_remote_data: u64,
}

impl AtomicAckEthRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = AtomicAckEth::new_checked(buf)?;
        Ok(Self {
            orig_remote_data: h.orig_remote_data(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, ATOMIC_ACK_ETH_LEN)?;
        AtomicAckEth::new_unchecked(buf).set_orig_remote_data(self.orig_remote_data);
        Ok(ATOMIC_ACK_ETH_LEN)
    }
}

// ---------------------------------------------------------------- ImmDt

view!(
    /// IBA §9.3.6: ImmDt = 32 bits of immediate data (last/only packet of
    /// SEND/WRITE with Immediate). Opaque: read here as big-endian.
    ImmDt,
    IMMDT_LEN
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    pub fn immediate_data(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    pub fn set_immediate_data(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), 0, v);
    }
}

/// ImmDt field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ImmDtRepr {
    pub immediate_data: u32,
}

impl ImmDtRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = ImmDt::new_checked(buf)?;
        Ok(Self {
            immediate_data: h.immediate_data(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        IMMDT_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, IMMDT_LEN)?;
        ImmDt::new_unchecked(buf).set_immediate_data(self.immediate_data);
        Ok(IMMDT_LEN)
    }
}

// ---------------------------------------------------------------- IETH

view!(
    /// IBA §9.3.7: IETH = R_Key(32) to invalidate (SEND Last/Only with
    /// Invalidate).
    Ieth,
    IETH_LEN
);

impl<T: AsRef<[u8]>> Ieth<T> {
    pub fn r_key(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    pub fn set_r_key(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), 0, v);
    }
}

/// IETH field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IethRepr {
    pub r_key: u32,
}

impl IethRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Ieth::new_checked(buf)?;
        Ok(Self { r_key: h.r_key() })
    }
    pub const fn buffer_len(&self) -> usize {
        IETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, IETH_LEN)?;
        Ieth::new_unchecked(buf).set_r_key(self.r_key);
        Ok(IETH_LEN)
    }
}

// ---------------------------------------------------------------- XRCETH

view!(
    /// IBA §9.3.8: XRCETH = Reserved(8) | XRCSRQ(24). XRC requests only.
    XrcEth,
    XRCETH_LEN
);

impl<T: AsRef<[u8]>> XrcEth<T> {
    /// Reserved octet (o9-3.a1: send 0, ignore).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    pub fn xrc_srq(&self) -> u32 {
        be24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> XrcEth<T> {
    pub fn set_reserved(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }
    /// Keeps the low 24 bits.
    pub fn set_xrc_srq(&mut self, v: u32) {
        set_be24(self.buffer.as_mut(), 1, v & 0xFF_FFFF);
    }
}

/// XRCETH fields, reserved octet kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct XrcEthRepr {
    pub reserved: u8,
    pub xrc_srq: u32,
}

impl XrcEthRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = XrcEth::new_checked(buf)?;
        Ok(Self {
            reserved: h.reserved(),
            xrc_srq: h.xrc_srq(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        XRCETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, XRCETH_LEN)?;
        fits(Layer::IbExt, "XRCSRQ", self.xrc_srq as u64, 24)?;
        let mut h = XrcEth::new_unchecked(buf);
        h.set_reserved(self.reserved);
        h.set_xrc_srq(self.xrc_srq);
        Ok(XRCETH_LEN)
    }
}

// ---------------------------------------------------------------- FETH

view!(
    /// IBA 1.5 FLUSH Extended Transport Header (Linux `struct rxe_feth`):
    /// Reserved(26) | Selectivity Level(2) | Placement Type(4).
    Feth,
    FETH_LEN
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// Bits 31:6, reserved.
    pub fn reserved(&self) -> u32 {
        be32(self.buffer.as_ref(), 0) >> 6
    }
    /// Bits 5:4 (SEL).
    pub fn selectivity_level(&self) -> u8 {
        ((be32(self.buffer.as_ref(), 0) >> 4) & 0x3) as u8
    }
    /// Bits 3:0 (PLT).
    pub fn placement_type(&self) -> u8 {
        (be32(self.buffer.as_ref(), 0) & 0xF) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    fn update(&mut self, mask: u32, v: u32) {
        let old = be32(self.buffer.as_ref(), 0);
        set_be32(self.buffer.as_mut(), 0, (old & !mask) | (v & mask));
    }
    /// Keeps the low 26 bits.
    pub fn set_reserved(&mut self, v: u32) {
        self.update(!0x3F, v << 6);
    }
    /// Keeps the low 2 bits.
    pub fn set_selectivity_level(&mut self, v: u8) {
        self.update(0x30, (v as u32) << 4);
    }
    /// Keeps the low 4 bits.
    pub fn set_placement_type(&mut self, v: u8) {
        self.update(0xF, v as u32);
    }
}

/// FETH fields, reserved bits kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FethRepr {
    pub reserved: u32,
    pub selectivity_level: u8,
    pub placement_type: u8,
}

impl FethRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Feth::new_checked(buf)?;
        Ok(Self {
            reserved: h.reserved(),
            selectivity_level: h.selectivity_level(),
            placement_type: h.placement_type(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        FETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, FETH_LEN)?;
        fits(Layer::IbExt, "FETH reserved", self.reserved as u64, 26)?;
        fits(Layer::IbExt, "FETH SEL", self.selectivity_level as u64, 2)?;
        fits(Layer::IbExt, "FETH PLT", self.placement_type as u64, 4)?;
        let mut h = Feth::new_unchecked(buf);
        h.set_reserved(self.reserved);
        h.set_selectivity_level(self.selectivity_level);
        h.set_placement_type(self.placement_type);
        Ok(FETH_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    /// IBT-C9-8: DETH layout, reserved octet kept; GSI Q_Key of QP1.
    #[test]
    fn ibt_c9_8_deth_layout() {
        let b = [0x80, 0x01, 0x00, 0x00, 0xAB, 0x00, 0x00, 0x01];
        let h = Deth::new_checked(&b[..]).unwrap();
        assert_eq!(h.q_key(), GSI_QKEY);
        assert_eq!(h.reserved(), 0xAB);
        assert_eq!(h.src_qp(), 1);
        let r = DethRepr::parse(&b).unwrap();
        let mut out = [0u8; 8];
        assert_eq!(r.emit(&mut out), Ok(8));
        assert_eq!(out, b);
        let mut s = Deth::new_unchecked([0u8; 8]);
        s.set_q_key(GSI_QKEY);
        s.set_reserved(0xAB);
        s.set_src_qp(0xFF00_0001);
        assert_eq!(s.into_inner(), b);
    }

    /// IBT-C9-19, IBT-C9-23: RETH layout (VA, R_Key, DMALen).
    #[test]
    fn ibt_c9_19_reth_layout() {
        let b = [
            0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xde, 0xad, 0xbe, 0xef, 0x80, 0x00,
            0x00, 0x00,
        ];
        let r = RethRepr::parse(&b).unwrap();
        assert_eq!(r.va, 0x0000_7f12_3456_789a);
        assert_eq!(r.r_key, 0xdead_beef);
        assert_eq!(r.dma_len, 0x8000_0000); // 2^31, the C9-9 maximum
        let mut out = [0u8; 16];
        r.emit(&mut out).unwrap();
        assert_eq!(out, b);
    }

    /// IBT-o9-15: AtomicETH layout, 64-bit fields at octets 12 and 20.
    #[test]
    fn ibt_o9_15_atomic_eth_layout() {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
        b[8..12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        b[12..20].copy_from_slice(&0xAAAA_BBBB_CCCC_DDDDu64.to_be_bytes());
        b[20..].copy_from_slice(&0x0123_4567_89AB_CDEFu64.to_be_bytes());
        let h = AtomicEth::new_checked(&b[..]).unwrap();
        assert_eq!(h.va(), 0x1122_3344_5566_7788);
        assert_eq!(h.r_key(), 0x0102_0304);
        assert_eq!(h.swap_add_data(), 0xAAAA_BBBB_CCCC_DDDD);
        assert_eq!(h.compare_data(), 0x0123_4567_89AB_CDEF);
        let mut out = [0u8; 28];
        AtomicEthRepr::parse(&b).unwrap().emit(&mut out).unwrap();
        assert_eq!(out, b);
    }

    /// IBT-o9-16: AtomicAckETH; IBT-X-08: ImmDt; IETH; o9-3.a1: XRCETH;
    /// o9-2: RDETH; FETH bit layout.
    #[test]
    fn small_header_layouts() {
        let a = AtomicAckEthRepr::parse(&[0, 0, 0, 0, 0, 0, 0, 7]).unwrap();
        assert_eq!(a.orig_remote_data, 7);
        assert_eq!(
            ImmDtRepr::parse(&[1, 2, 3, 4]).unwrap().immediate_data,
            0x0102_0304
        );
        assert_eq!(IethRepr::parse(&[0, 0, 0x16, 0xf9]).unwrap().r_key, 0x16f9);
        let x = XrcEthRepr::parse(&[0, 0x12, 0x34, 0x56]).unwrap();
        assert_eq!((x.reserved, x.xrc_srq), (0, 0x123456));
        let r = RdethRepr::parse(&[0x5A, 0, 0, 9]).unwrap();
        assert_eq!((r.reserved, r.ee_context), (0x5A, 9));
        let f = FethRepr::parse(&[0x80, 0, 0, 0x23]).unwrap();
        assert_eq!(f.reserved, 0x8000_0023 >> 6);
        assert_eq!((f.selectivity_level, f.placement_type), (2, 3));
        let mut out = [0u8; 4];
        f.emit(&mut out).unwrap();
        assert_eq!(out, [0x80, 0, 0, 0x23]);
        let mut v = Feth::new_unchecked([0u8; 4]);
        v.set_placement_type(0xFF);
        v.set_selectivity_level(0xFF);
        v.set_reserved(1);
        assert_eq!(v.into_inner(), [0, 0, 0, 0x7F]);
    }

    /// Every truncation errors, in views, parsers and emitters.
    #[test]
    fn truncations_error() {
        let big = [0u8; 32];
        macro_rules! t {
            ($view:ident, $repr:ident, $len:expr) => {
                for n in 0..$len {
                    assert!(matches!(
                        $view::new_checked(&big[..n]),
                        Err(Error::Truncated {
                            layer: Layer::IbExt,
                            ..
                        })
                    ));
                    assert!($repr::parse(&big[..n]).is_err());
                    let mut out = [0u8; 32];
                    assert!($repr::default().emit(&mut out[..n]).is_err());
                }
                assert!($view::new_checked(&big[..$len]).is_ok());
                assert_eq!($repr::default().buffer_len(), $len);
            };
        }
        t!(Rdeth, RdethRepr, RDETH_LEN);
        t!(Deth, DethRepr, DETH_LEN);
        t!(Reth, RethRepr, RETH_LEN);
        t!(AtomicEth, AtomicEthRepr, ATOMIC_ETH_LEN);
        t!(AtomicAckEth, AtomicAckEthRepr, ATOMIC_ACK_ETH_LEN);
        t!(ImmDt, ImmDtRepr, IMMDT_LEN);
        t!(Ieth, IethRepr, IETH_LEN);
        t!(XrcEth, XrcEthRepr, XRCETH_LEN);
        t!(Feth, FethRepr, FETH_LEN);
    }

    #[test]
    fn emit_rejects_out_of_range_fields() {
        let mut out = [0u8; 8];
        let too_big = 1 << 24;
        assert!(matches!(
            DethRepr {
                src_qp: too_big,
                ..Default::default()
            }
            .emit(&mut out),
            Err(Error::TooLarge { .. })
        ));
        assert!(
            RdethRepr {
                reserved: 0,
                ee_context: too_big
            }
            .emit(&mut out)
            .is_err()
        );
        assert!(
            XrcEthRepr {
                reserved: 0,
                xrc_srq: too_big
            }
            .emit(&mut out)
            .is_err()
        );
        assert!(
            FethRepr {
                placement_type: 16,
                ..Default::default()
            }
            .emit(&mut out)
            .is_err()
        );
    }

    macro_rules! roundtrip {
        ($name:ident, $repr:ident, $len:expr, $strat:expr) => {
            proptest! {
                #[test]
                fn $name(r in $strat) {
                    let r: $repr = r;
                    let mut a = [0u8; $len];
                    prop_assert_eq!(r.emit(&mut a), Ok($len));
                    let p = $repr::parse(&a).unwrap();
                    prop_assert_eq!(p, r);
                    let mut b = [0u8; $len];
                    p.emit(&mut b).unwrap();
                    prop_assert_eq!(a, b);
                }
            }
        };
    }

    roundtrip!(
        prop_rdeth,
        RdethRepr,
        RDETH_LEN,
        (any::<u8>(), 0u32..1 << 24).prop_map(|(reserved, ee_context)| RdethRepr {
            reserved,
            ee_context
        })
    );
    roundtrip!(
        prop_deth,
        DethRepr,
        DETH_LEN,
        (any::<u32>(), any::<u8>(), 0u32..1 << 24).prop_map(|(q_key, reserved, src_qp)| DethRepr {
            q_key,
            reserved,
            src_qp
        })
    );
    roundtrip!(
        prop_reth,
        RethRepr,
        RETH_LEN,
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, r_key, dma_len)| RethRepr {
            va,
            r_key,
            dma_len
        })
    );
    roundtrip!(
        prop_atomic_eth,
        AtomicEthRepr,
        ATOMIC_ETH_LEN,
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
            |(va, r_key, swap_add_data, compare_data)| AtomicEthRepr {
                va,
                r_key,
                swap_add_data,
                compare_data
            }
        )
    );
    roundtrip!(
        prop_atomic_ack_eth,
        AtomicAckEthRepr,
        ATOMIC_ACK_ETH_LEN,
        any::<u64>().prop_map(|orig_remote_data| AtomicAckEthRepr { orig_remote_data })
    );
    roundtrip!(
        prop_immdt,
        ImmDtRepr,
        IMMDT_LEN,
        any::<u32>().prop_map(|immediate_data| ImmDtRepr { immediate_data })
    );
    roundtrip!(
        prop_ieth,
        IethRepr,
        IETH_LEN,
        any::<u32>().prop_map(|r_key| IethRepr { r_key })
    );
    roundtrip!(
        prop_xrceth,
        XrcEthRepr,
        XRCETH_LEN,
        (any::<u8>(), 0u32..1 << 24)
            .prop_map(|(reserved, xrc_srq)| XrcEthRepr { reserved, xrc_srq })
    );
    roundtrip!(
        prop_feth,
        FethRepr,
        FETH_LEN,
        (0u32..1 << 26, 0u8..4, 0u8..16).prop_map(
            |(reserved, selectivity_level, placement_type)| FethRepr {
                reserved,
                selectivity_level,
                placement_type
            }
        )
    );

    proptest! {
        #[test]
        fn prop_ext_parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = RdethRepr::parse(&b);
            let _ = DethRepr::parse(&b);
            let _ = RethRepr::parse(&b);
            let _ = AtomicEthRepr::parse(&b);
            let _ = AtomicAckEthRepr::parse(&b);
            let _ = ImmDtRepr::parse(&b);
            let _ = IethRepr::parse(&b);
            let _ = XrcEthRepr::parse(&b);
            let _ = FethRepr::parse(&b);
        }
    }
}
