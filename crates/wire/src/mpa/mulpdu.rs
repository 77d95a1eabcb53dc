//! MULPDU, the largest ULPDU whose FPDU fits one TCP segment (RFC 5044 §4.5), and the
//! bounds §3 sets on it.

use super::marker::MARKER_INTERVAL;

/// RFC 5044 §3 / §4.5: MULPDU lower bound (MPA-06, MPA-40).
pub const MULPDU_MIN: u16 = 128;
/// RFC 5044 §3: the largest ULPDU DDP may ever post (MPA-07); also the MULPDU
/// upper bound (MPA-06). The stream codec refuses larger ULPDUs both ways.
pub const MAX_ULPDU: usize = 64768;

/// MULPDU for an EMSS (RFC 5044 §4.5): with Markers
/// `EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)` (MPA-35), without
/// `EMSS - (6 + EMSS mod 4)` (MPA-36), clamped to [128, 64768] (MPA-06, MPA-40).
pub const fn mulpdu(emss: u32, markers: bool) -> u16 {
    let e = emss as u64;
    let mut overhead = 6 + e % 4;
    if markers {
        overhead += 4 * e.div_ceil(MARKER_INTERVAL as u64);
    }
    let m = e.saturating_sub(overhead);
    if m < MULPDU_MIN as u64 {
        MULPDU_MIN
    } else if m > MAX_ULPDU as u64 {
        MAX_ULPDU as u16
    } else {
        m as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mpa::{encoded_len, fpdu_len};

    /// MPA-35, MPA-36, MPA-40: mpa.md §5 table plus the matrix vectors.
    #[test]
    fn mpa_35_36_40_mulpdu_table() {
        for (emss, on, off) in [
            (1460u32, 1442u16, 1454u16),
            (1448, 1430, 1442),
            (8960, 8882, 8954),
            (536, 522, 530),
            (100, 128, 128),
        ] {
            assert_eq!(mulpdu(emss, true), on, "{emss} markers");
            assert_eq!(mulpdu(emss, false), off, "{emss}");
        }
        assert_eq!(mulpdu(1461, false), 1454);
        assert_eq!(mulpdu(0, true), 128);
        assert_eq!(mulpdu(u32::MAX, true), 64768);
        assert_eq!(mulpdu(u32::MAX, false), 64768);
    }

    /// MPA-06, MPA-35, MPA-36, MPA-40: sweep EMSS 1..=65535: always within
    /// [128, 64768]; unclamped values give FPDUs (with the worst Marker
    /// placement) that fit one EMSS segment.
    #[test]
    fn mpa_06_mulpdu_sweep() {
        for emss in 1u32..=65535 {
            for markers in [false, true] {
                let m = mulpdu(emss, markers);
                assert!((MULPDU_MIN..=MAX_ULPDU as u16).contains(&m), "{emss}");
                if m == MULPDU_MIN || usize::from(m) == MAX_ULPDU {
                    continue;
                }
                if markers {
                    for pos in [0u32, 4, 256, 508] {
                        assert!(
                            encoded_len(usize::from(m), pos, true) <= emss as usize,
                            "{emss} @ {pos}"
                        );
                    }
                } else {
                    assert!(fpdu_len(usize::from(m)) <= emss as usize);
                    assert!(
                        fpdu_len(usize::from(m) + 1) > emss as usize,
                        "largest that fits"
                    );
                }
            }
        }
    }
}
