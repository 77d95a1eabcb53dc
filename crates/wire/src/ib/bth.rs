//! Base Transport Header (IBA §9.2; ib-transport.md §3), 12 octets.
//!
//! ```text
//!  octet 0    | OpCode(8)
//!  octet 1    | SE(1) M(1) PadCnt(2) TVer(4)
//!  octets 2-3 | P_Key(16)
//!  octet 4    | F(1) B(1) Resv6(6)       -- variant, not ICRC-covered (C9-6)
//!  octets 5-7 | DestQP(24)
//!  octet 8    | A(1) Resv7(7)            -- ICRC-covered (C9-7)
//!  octets 9-11| PSN(24)
//! ```

use crate::error::{Layer, Result, need};
use crate::field::{be16, be24, set_be16, set_be24};

use super::fits;
use super::opcode::Opcode;

/// BTH length.
pub const BTH_LEN: usize = 12;
/// Default partition key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// DestQP of a multicast packet (IBT-C9-58).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// A BTH view. `new_checked` checks only the length: the OpCode is
/// validated by [`Bth::opcode`] and [`BthRepr::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps without checking the length (accessors may then panic).
    pub const fn new_unchecked(buffer: T) -> Self {
        Bth { buffer }
    }

    /// Wraps after checking the length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` when shorter than 12 octets.
    pub fn check_len(&self) -> Result<()> {
        need(Layer::Bth, self.buffer.as_ref(), BTH_LEN)
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self, i: usize) -> u8 {
        self.buffer.as_ref()[i]
    }

    /// The OpCode octet as sent.
    pub fn opcode_raw(&self) -> u8 {
        self.b(0)
    }
    /// The OpCode, `Unknown` if reserved.
    pub fn opcode(&self) -> Result<Opcode> {
        Opcode::try_from(self.b(0))
    }
    /// SE, solicited event.
    pub fn se(&self) -> bool {
        self.b(1) & 0x80 != 0
    }
    /// M, MigReq.
    pub fn migreq(&self) -> bool {
        self.b(1) & 0x40 != 0
    }
    /// PadCnt, 0..=3 octets of pad after the payload.
    pub fn pad_cnt(&self) -> u8 {
        (self.b(1) >> 4) & 0x3
    }
    /// TVer, transport header version (0; C9-5).
    pub fn tver(&self) -> u8 {
        self.b(1) & 0xF
    }
    pub fn pkey(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// F / Res1 (FECN).
    pub fn fecn(&self) -> bool {
        self.b(4) & 0x80 != 0
    }
    /// B / Res1 (BECN).
    pub fn becn(&self) -> bool {
        self.b(4) & 0x40 != 0
    }
    /// Resv6, the low 6 bits of octet 4.
    pub fn resv6(&self) -> u8 {
        self.b(4) & 0x3F
    }
    pub fn dest_qp(&self) -> u32 {
        be24(self.buffer.as_ref(), 5)
    }
    /// A, AckReq.
    pub fn ack_req(&self) -> bool {
        self.b(8) & 0x80 != 0
    }
    /// Resv7, the low 7 bits of octet 8.
    pub fn resv7(&self) -> u8 {
        self.b(8) & 0x7F
    }
    pub fn psn(&self) -> u32 {
        be24(self.buffer.as_ref(), 9)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn update(&mut self, i: usize, mask: u8, v: u8) {
        let b = &mut self.buffer.as_mut()[i];
        *b = (*b & !mask) | (v & mask);
    }
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[0] = op.value();
    }
    /// Any octet, reserved values included (for negative tests).
    pub fn set_opcode_raw(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }
    pub fn set_se(&mut self, v: bool) {
        self.update(1, 0x80, if v { 0x80 } else { 0 });
    }
    pub fn set_migreq(&mut self, v: bool) {
        self.update(1, 0x40, if v { 0x40 } else { 0 });
    }
    /// Keeps the low 2 bits.
    pub fn set_pad_cnt(&mut self, v: u8) {
        self.update(1, 0x30, v << 4);
    }
    /// Keeps the low 4 bits.
    pub fn set_tver(&mut self, v: u8) {
        self.update(1, 0x0F, v);
    }
    pub fn set_pkey(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 2, v);
    }
    pub fn set_fecn(&mut self, v: bool) {
        self.update(4, 0x80, if v { 0x80 } else { 0 });
    }
    pub fn set_becn(&mut self, v: bool) {
        self.update(4, 0x40, if v { 0x40 } else { 0 });
    }
    /// Keeps the low 6 bits.
    pub fn set_resv6(&mut self, v: u8) {
        self.update(4, 0x3F, v);
    }
    /// Keeps the low 24 bits.
    pub fn set_dest_qp(&mut self, v: u32) {
        set_be24(self.buffer.as_mut(), 5, v & 0xFF_FFFF);
    }
    pub fn set_ack_req(&mut self, v: bool) {
        self.update(8, 0x80, if v { 0x80 } else { 0 });
    }
    /// Keeps the low 7 bits.
    pub fn set_resv7(&mut self, v: u8) {
        self.update(8, 0x7F, v);
    }
    /// Keeps the low 24 bits.
    pub fn set_psn(&mut self, v: u32) {
        set_be24(self.buffer.as_mut(), 9, v & 0xFF_FFFF);
    }
}

/// Every BTH field, reserved bits included (C9-6, C9-7: senders put 0,
/// receivers ignore; kept here so real traffic re-emits identically).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BthRepr {
    pub opcode: Opcode,
    pub se: bool,
    pub migreq: bool,
    pub pad_cnt: u8,
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub resv6: u8,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub resv7: u8,
    pub psn: u32,
}

impl BthRepr {
    /// A BTH as a conforming sender builds it: TVer 0 (C9-5), reserved
    /// bits 0 (C9-6, C9-7), default P_Key, no flags.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        BthRepr {
            opcode,
            se: false,
            migreq: false,
            pad_cnt: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parses the first 12 octets; `Unknown` for a reserved OpCode. A
    /// non-zero TVer parses (the engine drops it: C9-36).
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Bth::new_checked(buf)?;
        Ok(BthRepr {
            opcode: h.opcode()?,
            se: h.se(),
            migreq: h.migreq(),
            pad_cnt: h.pad_cnt(),
            tver: h.tver(),
            pkey: h.pkey(),
            fecn: h.fecn(),
            becn: h.becn(),
            resv6: h.resv6(),
            dest_qp: h.dest_qp(),
            ack_req: h.ack_req(),
            resv7: h.resv7(),
            psn: h.psn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes 12 octets; `TooLarge` if a field exceeds its width.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Bth, buf, BTH_LEN)?;
        fits(Layer::Bth, "PadCnt", self.pad_cnt as u64, 2)?;
        fits(Layer::Bth, "TVer", self.tver as u64, 4)?;
        fits(Layer::Bth, "Resv6", self.resv6 as u64, 6)?;
        fits(Layer::Bth, "DestQP", self.dest_qp as u64, 24)?;
        fits(Layer::Bth, "Resv7", self.resv7 as u64, 7)?;
        fits(Layer::Bth, "PSN", self.psn as u64, 24)?;
        let b = &mut buf[..BTH_LEN];
        b[0] = self.opcode.value();
        b[1] = (u8::from(self.se) << 7)
            | (u8::from(self.migreq) << 6)
            | (self.pad_cnt << 4)
            | self.tver;
        set_be16(b, 2, self.pkey);
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | self.resv6;
        set_be24(b, 5, self.dest_qp);
        b[8] = (u8::from(self.ack_req) << 7) | self.resv7;
        set_be24(b, 9, self.psn);
        Ok(BTH_LEN)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    /// rxe-rc_pingpong.pcap frame 13, octets 28..40: RC SEND Only BTH.
    const REAL: [u8; 12] = [
        0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x8c, 0xae, 0xba,
    ];

    #[test]
    fn real_bth_deconstruct() {
        let h = Bth::new_checked(&REAL[..]).unwrap();
        assert_eq!(h.opcode(), Ok(Opcode::RC_SEND_ONLY));
        assert!(!h.se() && !h.migreq());
        assert_eq!((h.pad_cnt(), h.tver(), h.pkey()), (0, 0, 0xFFFF));
        assert!(!h.fecn() && !h.becn());
        assert_eq!((h.resv6(), h.dest_qp()), (0, 0x11));
        assert!(h.ack_req());
        assert_eq!((h.resv7(), h.psn()), (0, 0x8caeba));
        let r = BthRepr::parse(&REAL).unwrap();
        let mut out = [0u8; 12];
        assert_eq!(r.emit(&mut out), Ok(12));
        assert_eq!(out, REAL);
        assert_eq!(&REAL[..9], &crate::ib::testdata::RC_SEND_ONLY[28..37]);
    }

    /// IBT-C9-5 (TVer 0 generated), IBT-C9-6 / IBT-C9-7 (reserved bits 0
    /// on send, kept and ignored on receive), IBT-X-01 (SE bit position).
    #[test]
    fn ibt_c9_5_c9_6_c9_7_bit_layout() {
        let r = BthRepr::new(Opcode::RC_SEND_LAST, 0x12_3456, 0xAB_CDEF);
        let mut b = [0u8; 12];
        r.emit(&mut b).unwrap();
        assert_eq!(
            b,
            [
                0x02, 0x00, 0xff, 0xff, 0, 0x12, 0x34, 0x56, 0, 0xab, 0xcd, 0xef
            ]
        );
        // Receiver keeps F, B, Resv6, Resv7 and a non-zero TVer.
        let odd = [
            0x04, 0xFF, 0x80, 0x01, 0xFF, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF,
        ];
        let p = BthRepr::parse(&odd).unwrap();
        assert!(p.se && p.migreq && p.fecn && p.becn && p.ack_req);
        assert_eq!((p.pad_cnt, p.tver, p.resv6, p.resv7), (3, 0xF, 0x3F, 0x7F));
        assert_eq!((p.pkey, p.dest_qp, p.psn), (0x8001, 1, 0xFF_FFFF));
        p.emit(&mut b).unwrap();
        assert_eq!(b, odd);
        // Built with setters.
        let mut v = Bth::new_unchecked([0u8; 12]);
        v.set_opcode(Opcode::RC_SEND_ONLY);
        v.set_se(true);
        v.set_migreq(true);
        v.set_pad_cnt(3);
        v.set_tver(0xF);
        v.set_pkey(0x8001);
        v.set_fecn(true);
        v.set_becn(true);
        v.set_resv6(0x3F);
        v.set_dest_qp(1);
        v.set_ack_req(true);
        v.set_resv7(0x7F);
        v.set_psn(0xFFFF_FFFF);
        assert_eq!(v.into_inner(), odd);
        let mut v = Bth::new_unchecked(odd);
        v.set_se(false);
        v.set_pad_cnt(0);
        v.set_fecn(false);
        v.set_ack_req(false);
        v.set_opcode_raw(0xC0);
        assert!(v.opcode().is_err());
        assert_eq!(
            &v.into_inner()[..9],
            &[0xC0, 0x4F, 0x80, 0x01, 0x7F, 0, 0, 1, 0x7F]
        );
    }

    #[test]
    fn truncation_and_errors() {
        for n in 0..12 {
            assert!(matches!(
                Bth::new_checked(&REAL[..n]),
                Err(Error::Truncated {
                    layer: Layer::Bth,
                    need: 12,
                    ..
                })
            ));
            assert!(BthRepr::parse(&REAL[..n]).is_err());
            let mut out = [0u8; 12];
            assert!(BthRepr::parse(&REAL).unwrap().emit(&mut out[..n]).is_err());
        }
        let mut bad = REAL;
        bad[0] = 0x15;
        assert!(matches!(BthRepr::parse(&bad), Err(Error::Unknown { .. })));
        let mut out = [0u8; 12];
        let r = BthRepr::new(Opcode::RC_ACKNOWLEDGE, 1 << 24, 0);
        assert!(matches!(r.emit(&mut out), Err(Error::TooLarge { .. })));
        let r = BthRepr {
            pad_cnt: 4,
            ..BthRepr::new(Opcode::RC_ACKNOWLEDGE, 0, 0)
        };
        assert!(r.emit(&mut out).is_err());
        let r = BthRepr::new(Opcode::RC_ACKNOWLEDGE, 0, 1 << 24);
        assert!(r.emit(&mut out).is_err());
    }

    pub(crate) fn bth_strategy() -> impl Strategy<Value = BthRepr> {
        (
            proptest::sample::select(Opcode::all().collect::<Vec<_>>()),
            any::<(bool, bool, bool, bool, bool)>(),
            (0u8..4, 0u8..16, any::<u16>(), 0u8..64, 0u8..128),
            (0u32..1 << 24, 0u32..1 << 24),
        )
            .prop_map(
                |(
                    opcode,
                    (se, migreq, fecn, becn, ack_req),
                    (pad_cnt, tver, pkey, resv6, resv7),
                    (dest_qp, psn),
                )| {
                    BthRepr {
                        opcode,
                        se,
                        migreq,
                        pad_cnt,
                        tver,
                        pkey,
                        fecn,
                        becn,
                        resv6,
                        dest_qp,
                        ack_req,
                        resv7,
                        psn,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn prop_bth_roundtrip(r in bth_strategy()) {
            let mut a = [0u8; 12];
            prop_assert_eq!(r.emit(&mut a), Ok(12));
            let p = BthRepr::parse(&a).unwrap();
            prop_assert_eq!(p, r);
            let mut b = [0u8; 12];
            p.emit(&mut b).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn prop_bth_never_panics(b in proptest::collection::vec(any::<u8>(), 0..16)) {
            if let Ok(r) = BthRepr::parse(&b) {
                let mut out = [0u8; 12];
                r.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..], &b[..12]);
            }
        }
    }
}
