//! ACK Extended Transport Header (IBA §9.3.5; ib-transport.md §4, §13.3).
//!
//! AETH = Syndrome(8) | MSN(24). Syndrome bit 7 is reserved; bits 6:5 are
//! the class (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK); bits 4:0 the
//! credit count code, RNR timer code or NAK code (EXT-PSN-04).

use crate::error::{Error, Layer, Result, need};
use crate::field::{be24, set_be24};

use super::eth::{AETH_LEN, view};
use super::fits;

/// 5-bit end-to-end credit count code of an ACK (IBA §9.7.7.2; Table in
/// ib-transport.md §13.3). Code 31 means "no credit information".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CreditCode(u8);

/// Credits for codes 0..=30 (IBA Table 42 / Linux `rxe_comp.c`).
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl CreditCode {
    /// Code 31: invalid credit count / no flow-control information (rxe
    /// always sends it: syndrome 0x1F).
    pub const UNLIMITED: CreditCode = CreditCode(31);

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// Number of receive credits, `None` for code 31.
    pub const fn credits(self) -> Option<u32> {
        if self.0 < 31 {
            Some(CREDITS[self.0 as usize])
        } else {
            None
        }
    }

    /// The largest code whose credit count does not exceed `n` (never 31).
    pub const fn from_credits(n: u32) -> CreditCode {
        let mut code = 30;
        while CREDITS[code] > n {
            code -= 1;
        }
        CreditCode(code as u8)
    }
}

impl TryFrom<u8> for CreditCode {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        if v < 32 {
            Ok(CreditCode(v))
        } else {
            Err(Error::Unknown {
                layer: Layer::IbExt,
                field: "AETH credit count",
                value: v as u64,
            })
        }
    }
}

impl From<CreditCode> for u8 {
    fn from(c: CreditCode) -> u8 {
        c.0
    }
}

/// 5-bit RNR NAK timer code (IBA Table 45; ib-transport.md §13.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RnrTimer(u8);

/// Microseconds for codes 0..=31; code 0 is the longest, 655.36 ms.
const RNR_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// Time to wait before retrying, in microseconds.
    pub const fn micros(self) -> u32 {
        RNR_MICROS[self.0 as usize]
    }

    /// The shortest timer lasting at least `us` microseconds (code 0,
    /// 655.36 ms, when nothing shorter is long enough).
    pub const fn from_micros(us: u32) -> RnrTimer {
        let mut code = 1;
        while code < 32 {
            if RNR_MICROS[code] >= us {
                return RnrTimer(code as u8);
            }
            code += 1;
        }
        RnrTimer(0)
    }
}

impl TryFrom<u8> for RnrTimer {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        if v < 32 {
            Ok(RnrTimer(v))
        } else {
            Err(Error::Unknown {
                layer: Layer::IbExt,
                field: "RNR timer",
                value: v as u64,
            })
        }
    }
}

impl From<RnrTimer> for u8 {
    fn from(t: RnrTimer) -> u8 {
        t.0
    }
}

/// NAK codes, syndrome bits 4:0 when bits 6:5 = 11 (IBA Table 44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[repr(u8)]
pub enum NakCode {
    /// Packet ahead of the expected PSN; retransmit from the AETH's PSN.
    PsnSequenceError = 0,
    InvalidRequest = 1,
    RemoteAccessError = 2,
    RemoteOperationalError = 3,
    InvalidRdRequest = 4,
}

impl core::fmt::Display for NakCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
        })
    }
}

/// Credits as a person reads them: the count, or "unlimited" for code 31 (no credit
/// information), then the code.
impl core::fmt::Display for CreditCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.credits() {
            Some(n) => write!(f, "{n} (code {})", self.code()),
            None => write!(f, "unlimited (code {})", self.code()),
        }
    }
}

/// The RNR timer as a time, then its code.
impl core::fmt::Display for RnrTimer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let us = self.micros();
        if us >= 1000 {
            write!(
                f,
                "{}.{:02} ms (code {})",
                us / 1000,
                us % 1000 / 10,
                self.code()
            )
        } else {
            write!(f, "{us} us (code {})", self.code())
        }
    }
}

impl TryFrom<u8> for NakCode {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        Ok(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => {
                return Err(Error::Unknown {
                    layer: Layer::IbExt,
                    field: "NAK code",
                    value: v as u64,
                });
            }
        })
    }
}

impl From<NakCode> for u8 {
    fn from(c: NakCode) -> u8 {
        c as u8
    }
}

impl NakCode {
    /// Name as tshark prints it.
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN Sequence Error",
            NakCode::InvalidRequest => "Invalid Request",
            NakCode::RemoteAccessError => "Remote Access Error",
            NakCode::RemoteOperationalError => "Remote Operational Error",
            NakCode::InvalidRdRequest => "Invalid RD Request",
        }
    }
}

/// Decoded AETH syndrome, bits 6:0 (bit 7 is reserved, see [`AethRepr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Syndrome {
    /// `00` + credit count code.
    Ack { credit: CreditCode },
    /// `01` + RNR timer code.
    RnrNak { timer: RnrTimer },
    /// `11` + NAK code.
    Nak(NakCode),
}

impl Syndrome {
    /// Plain ACK with "no credit information" (0x1F, what rxe sends).
    pub const ACK: Syndrome = Syndrome::Ack {
        credit: CreditCode::UNLIMITED,
    };

    /// True for `Ack`.
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

/// From the syndrome octet with bit 7 clear; class `10`, a set bit 7 and
/// NAK codes 5..=31 are `Unknown`.
impl TryFrom<u8> for Syndrome {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        let low = v & 0x1F;
        match v >> 5 {
            0 => Ok(Syndrome::Ack {
                credit: CreditCode(low),
            }),
            1 => Ok(Syndrome::RnrNak {
                timer: RnrTimer(low),
            }),
            3 => Ok(Syndrome::Nak(NakCode::try_from(low)?)),
            _ => Err(Error::Unknown {
                layer: Layer::IbExt,
                field: "AETH syndrome",
                value: v as u64,
            }),
        }
    }
}

impl From<Syndrome> for u8 {
    fn from(s: Syndrome) -> u8 {
        match s {
            Syndrome::Ack { credit } => credit.0,
            Syndrome::RnrNak { timer } => 0x20 | timer.0,
            Syndrome::Nak(c) => 0x60 | c as u8,
        }
    }
}

view!(
    /// IBA §9.3.5: AETH = Syndrome(8) | MSN(24).
    Aeth,
    AETH_LEN
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The raw syndrome octet.
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Decoded syndrome (bit 7 ignored); `Unknown` for reserved encodings.
    pub fn syndrome(&self) -> Result<Syndrome> {
        Syndrome::try_from(self.syndrome_raw() & 0x7F)
    }
    /// Message sequence number.
    pub fn msn(&self) -> u32 {
        be24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    pub fn set_syndrome_raw(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }
    /// Sets bits 6:0, keeps the reserved bit 7.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        let b = &mut self.buffer.as_mut()[0];
        *b = (*b & 0x80) | u8::from(s);
    }
    /// Keeps the low 24 bits.
    pub fn set_msn(&mut self, v: u32) {
        set_be24(self.buffer.as_mut(), 1, v & 0xFF_FFFF);
    }
}

/// AETH fields. `reserved` is syndrome bit 7 (send 0), kept so real
/// traffic re-emits identically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AethRepr {
    pub reserved: bool,
    pub syndrome: Syndrome,
    pub msn: u32,
}

impl Default for AethRepr {
    fn default() -> Self {
        AethRepr {
            reserved: false,
            syndrome: Syndrome::ACK,
            msn: 0,
        }
    }
}

impl AethRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = Aeth::new_checked(buf)?;
        Ok(Self {
            reserved: h.syndrome_raw() & 0x80 != 0,
            syndrome: h.syndrome()?,
            msn: h.msn(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::IbExt, buf, AETH_LEN)?;
        fits(Layer::IbExt, "MSN", self.msn as u64, 24)?;
        let mut h = Aeth::new_unchecked(buf);
        h.set_syndrome_raw(if self.reserved { 0x80 } else { 0 } | u8::from(self.syndrome));
        h.set_msn(self.msn);
        Ok(AETH_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// EXT-PSN-04: every syndrome octet decodes or errors as §13.3 says and
    /// re-encodes to itself.
    #[test]
    fn ext_psn_04_all_syndromes() {
        for v in 0u8..=0x7F {
            let s = Syndrome::try_from(v);
            match v {
                0x00..=0x1F => assert_eq!(
                    s,
                    Ok(Syndrome::Ack {
                        credit: CreditCode(v)
                    })
                ),
                0x20..=0x3F => assert_eq!(
                    s,
                    Ok(Syndrome::RnrNak {
                        timer: RnrTimer(v & 0x1F)
                    })
                ),
                0x60..=0x64 => assert!(matches!(s, Ok(Syndrome::Nak(_)))),
                _ => assert!(matches!(s, Err(Error::Unknown { .. })), "{v:#x}"),
            }
            if let Ok(s) = s {
                assert_eq!(u8::from(s), v);
            }
        }
        for v in 0x80u8..=0xFF {
            assert!(Syndrome::try_from(v).is_err());
        }
        assert_eq!(
            Syndrome::try_from(0x60),
            Ok(Syndrome::Nak(NakCode::PsnSequenceError))
        );
        assert_eq!(
            Syndrome::try_from(0x61),
            Ok(Syndrome::Nak(NakCode::InvalidRequest))
        );
        assert_eq!(
            Syndrome::try_from(0x62),
            Ok(Syndrome::Nak(NakCode::RemoteAccessError))
        );
        assert_eq!(
            Syndrome::try_from(0x63),
            Ok(Syndrome::Nak(NakCode::RemoteOperationalError))
        );
        assert_eq!(
            Syndrome::try_from(0x64),
            Ok(Syndrome::Nak(NakCode::InvalidRdRequest))
        );
        assert_eq!(u8::from(Syndrome::ACK), 0x1F);
        assert!(Syndrome::ACK.is_ack());
        assert_eq!(NakCode::RemoteAccessError.name(), "Remote Access Error");
    }

    /// EXT-PSN-04: credit count table (§13.3).
    #[test]
    fn ext_psn_04_credit_table() {
        let want = [
            (0, 0),
            (1, 1),
            (4, 4),
            (5, 6),
            (7, 12),
            (10, 32),
            (16, 256),
            (20, 1024),
            (24, 4096),
            (29, 24576),
            (30, 32768),
        ];
        for (c, n) in want {
            assert_eq!(CreditCode(c).credits(), Some(n));
            assert_eq!(CreditCode::from_credits(n), CreditCode(c));
        }
        assert_eq!(CreditCode::UNLIMITED.credits(), None);
        assert_eq!(CreditCode::from_credits(5), CreditCode(4));
        assert_eq!(CreditCode::from_credits(u32::MAX), CreditCode(30));
        assert!(CreditCode::try_from(32).is_err());
        assert_eq!(u8::from(CreditCode::try_from(31).unwrap()), 31);
        // Monotone table.
        assert!(CREDITS.windows(2).all(|w| w[0] < w[1]));
    }

    /// EXT-PSN-04: RNR timer table (§13.3), in microseconds.
    #[test]
    fn ext_psn_04_rnr_timer_table() {
        let want = [
            (0, 655_360),
            (1, 10),
            (2, 20),
            (5, 60),
            (12, 640),
            (14, 1_280),
            (18, 5_120),
            (22, 20_480),
            (27, 122_880),
            (31, 491_520),
        ];
        for (c, us) in want {
            assert_eq!(RnrTimer::try_from(c).unwrap().micros(), us);
        }
        assert_eq!(RnrTimer::from_micros(0), RnrTimer(1));
        assert_eq!(RnrTimer::from_micros(11), RnrTimer(2));
        assert_eq!(RnrTimer::from_micros(491_520), RnrTimer(31));
        assert_eq!(RnrTimer::from_micros(491_521), RnrTimer(0));
        assert!(RnrTimer::try_from(32).is_err());
        assert!(RNR_MICROS[1..].windows(2).all(|w| w[0] < w[1]));
    }

    /// IBT-C9-15, IBT-C9-20: AETH layout; reserved bit 7 survives.
    #[test]
    fn ibt_c9_15_aeth_layout() {
        let b = [0x62, 0x00, 0x00, 0x2a];
        let h = Aeth::new_checked(&b[..]).unwrap();
        assert_eq!(h.syndrome(), Ok(Syndrome::Nak(NakCode::RemoteAccessError)));
        assert_eq!(h.msn(), 42);
        let r = AethRepr::parse(&b).unwrap();
        assert!(!r.reserved);
        let b2 = [0x9F, 0xFF, 0xFF, 0xFF];
        let r2 = AethRepr::parse(&b2).unwrap();
        assert!(r2.reserved);
        assert_eq!(r2.syndrome, Syndrome::ACK);
        let mut out = [0u8; 4];
        r2.emit(&mut out).unwrap();
        assert_eq!(out, b2);
        let mut v = Aeth::new_unchecked([0x80u8, 0, 0, 0]);
        v.set_syndrome(Syndrome::RnrNak { timer: RnrTimer(0) });
        v.set_msn(0x0100_0005);
        assert_eq!(v.into_inner(), [0xA0, 0, 0, 5]);
        assert!(AethRepr::parse(&[0x40, 0, 0, 0]).is_err());
        assert!(AethRepr::parse(&[0x65, 0, 0, 0]).is_err());
        for n in 0..4 {
            assert!(AethRepr::parse(&b[..n]).is_err());
            assert!(AethRepr::default().emit(&mut out[..n]).is_err());
        }
        assert!(
            AethRepr {
                msn: 1 << 24,
                ..Default::default()
            }
            .emit(&mut out)
            .is_err()
        );
    }

    fn syndrome() -> impl Strategy<Value = Syndrome> {
        prop_oneof![
            (0u8..32).prop_map(|c| Syndrome::Ack {
                credit: CreditCode(c)
            }),
            (0u8..32).prop_map(|c| Syndrome::RnrNak { timer: RnrTimer(c) }),
            (0u8..5).prop_map(|c| Syndrome::Nak(NakCode::try_from(c).unwrap())),
        ]
    }

    proptest! {
        #[test]
        fn prop_aeth_roundtrip(reserved in any::<bool>(), syndrome in syndrome(), msn in 0u32..1 << 24) {
            let r = AethRepr { reserved, syndrome, msn };
            let mut a = [0u8; 4];
            prop_assert_eq!(r.emit(&mut a), Ok(4));
            let p = AethRepr::parse(&a).unwrap();
            prop_assert_eq!(p, r);
            let mut b = [0u8; 4];
            p.emit(&mut b).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn prop_aeth_never_panics(b in proptest::collection::vec(any::<u8>(), 0..8)) {
            if let Ok(r) = AethRepr::parse(&b) {
                let mut out = [0u8; 4];
                r.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..], &b[..4]);
            }
        }
    }
}
