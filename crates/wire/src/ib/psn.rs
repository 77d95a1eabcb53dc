//! 24-bit Packet Sequence Number arithmetic (IBA §9.7.1, §9.7.3.1;
//! ib-transport.md §13.5; EXT-PSN-01, EXT-PSN-02).
//!
//! PSNs live modulo 2^24. Comparisons use the signed 24-bit difference, as
//! Linux rxe's `psn_compare` does (`(s32)((a - b) << 8)`): `a` is "after"
//! `b` when `a - b` lies in `1 .. 2^23`.

use core::cmp::Ordering;

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00FF_FFFF;
/// Number of distinct PSNs, 2^24.
pub const PSN_MODULUS: u32 = 1 << 24;
/// Half the PSN space, 2^23: the size of the duplicate region.
pub const PSN_HALF: u32 = 1 << 23;

/// `psn + n` modulo 2^24 (`psn` may carry junk above bit 23).
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// `psn - n` modulo 2^24.
pub const fn psn_sub(psn: u32, n: u32) -> u32 {
    psn.wrapping_sub(n) & PSN_MASK
}

/// Signed distance from `b` to `a`, in `-2^23 .. 2^23` (positive when `a`
/// is after `b`). `psn_diff(0, 0xFF_FFFF) == 1`.
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// Orders `a` relative to `b` on the 24-bit circle (rxe `psn_compare`).
pub const fn psn_cmp(a: u32, b: u32) -> Ordering {
    let d = psn_diff(a, b);
    if d < 0 {
        Ordering::Less
    } else if d > 0 {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// Where a received PSN falls relative to the responder's expected PSN
/// (IBA §9.7.5.1.2; ib-transport.md §13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum PsnRegion {
    /// `psn == ePSN`: process it.
    Expected,
    /// The 2^23 PSNs before ePSN: already seen; re-ACK / replay.
    Duplicate,
    /// The 2^23 - 1 PSNs after ePSN: packets were lost (NAK sequence error).
    Invalid,
}

/// Classifies `psn` against `epsn` (EXT-PSN-01).
pub const fn psn_region(psn: u32, epsn: u32) -> PsnRegion {
    let d = psn_diff(psn, epsn);
    if d == 0 {
        PsnRegion::Expected
    } else if d < 0 {
        PsnRegion::Duplicate
    } else {
        PsnRegion::Invalid
    }
}

/// True when `psn` is one of the `len` PSNs starting at `start`
/// (`start, start+1, ..., start+len-1`, wrapping). `len` above 2^24
/// covers everything.
pub const fn psn_in_window(psn: u32, start: u32, len: u32) -> bool {
    psn_sub(psn, start) < len || len > PSN_MODULUS
}

/// PSNs an RDMA READ request consumes: one per response packet,
/// `max(1, ceil(dma_len / pmtu))` (EXT-PSN-02). `pmtu` 0 is treated as 1.
pub const fn read_psn_count(dma_len: u32, pmtu: u32) -> u32 {
    let pmtu = if pmtu == 0 { 1 } else { pmtu };
    let n = dma_len.div_ceil(pmtu);
    if n == 0 { 1 } else { n }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// EXT-PSN-01: wrap around 0xFFFFFF.
    #[test]
    fn ext_psn_01_wrap() {
        assert_eq!(psn_add(0xFF_FFFF, 1), 0);
        assert_eq!(psn_add(0xFF_FFFE, 5), 3);
        assert_eq!(psn_sub(0, 1), 0xFF_FFFF);
        assert_eq!(psn_sub(2, 5), 0xFF_FFFD);
        assert_eq!(psn_diff(0, 0xFF_FFFF), 1);
        assert_eq!(psn_diff(0xFF_FFFF, 0), -1);
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(psn_diff(PSN_HALF, 0), -(PSN_HALF as i32));
        assert_eq!(psn_diff(PSN_HALF - 1, 0), PSN_HALF as i32 - 1);
        assert_eq!(psn_cmp(0, 0xFF_FFFF), Ordering::Greater);
        assert_eq!(psn_cmp(0xFF_FFF0, 0x10), Ordering::Less);
        assert_eq!(psn_cmp(7, 7), Ordering::Equal);
        // High junk bits are ignored, as by rxe's `<< 8`.
        assert_eq!(psn_diff(0xFF00_0001, 0), 1);
    }

    /// EXT-PSN-01: expected / duplicate (2^23 before) / invalid (after).
    #[test]
    fn ext_psn_01_regions() {
        let e = 0x00_0010;
        assert_eq!(psn_region(e, e), PsnRegion::Expected);
        assert_eq!(psn_region(e - 1, e), PsnRegion::Duplicate);
        assert_eq!(psn_region(psn_sub(e, PSN_HALF), e), PsnRegion::Duplicate);
        assert_eq!(psn_region(psn_sub(e, PSN_HALF + 1), e), PsnRegion::Invalid);
        assert_eq!(psn_region(e + 1, e), PsnRegion::Invalid);
        assert_eq!(psn_region(psn_add(e, PSN_HALF - 1), e), PsnRegion::Invalid);
        // Around the wrap.
        assert_eq!(psn_region(0xFF_FFFF, 0), PsnRegion::Duplicate);
        assert_eq!(psn_region(0, 0xFF_FFFF), PsnRegion::Invalid);
    }

    #[test]
    fn window() {
        assert!(psn_in_window(0xFF_FFFE, 0xFF_FFFE, 3));
        assert!(psn_in_window(0, 0xFF_FFFE, 3));
        assert!(!psn_in_window(1, 0xFF_FFFE, 3));
        assert!(!psn_in_window(0xFF_FFFD, 0xFF_FFFE, 3));
        assert!(!psn_in_window(5, 5, 0));
        assert!(psn_in_window(4, 5, PSN_MODULUS));
        assert!(psn_in_window(4, 5, u32::MAX));
    }

    /// EXT-PSN-02: READ 700 @256 at PSN 10 -> next request PSN 13; a
    /// zero-length READ takes one PSN (IBT-X-09).
    #[test]
    fn ext_psn_02_read_consumes_psns() {
        assert_eq!(psn_add(10, read_psn_count(700, 256)), 13);
        assert_eq!(read_psn_count(0, 1024), 1);
        assert_eq!(read_psn_count(1024, 1024), 1);
        assert_eq!(read_psn_count(1025, 1024), 2);
        assert_eq!(read_psn_count(1 << 31, 256), 1 << 23);
        assert_eq!(read_psn_count(5, 0), 5);
    }

    proptest! {
        #[test]
        fn prop_add_sub_inverse(p in 0u32..PSN_MODULUS, n in any::<u32>()) {
            prop_assert_eq!(psn_sub(psn_add(p, n), n), p);
            prop_assert!(psn_add(p, n) <= PSN_MASK);
        }

        #[test]
        fn prop_diff_matches_add(p in 0u32..PSN_MODULUS, d in -(PSN_HALF as i32)..(PSN_HALF as i32)) {
            let q = psn_add(p, d as u32);
            prop_assert_eq!(psn_diff(q, p), d);
            prop_assert_eq!(psn_cmp(q, p), d.cmp(&0));
        }

        #[test]
        fn prop_cmp_antisymmetric(a in 0u32..PSN_MODULUS, b in 0u32..PSN_MODULUS) {
            let d = psn_diff(a, b);
            if d != -(PSN_HALF as i32) {
                prop_assert_eq!(psn_cmp(b, a), psn_cmp(a, b).reverse());
                prop_assert_eq!(psn_diff(b, a), -d);
            }
            prop_assert_eq!(psn_region(a, b) == PsnRegion::Expected, a == b);
        }

        #[test]
        fn prop_window(start in 0u32..PSN_MODULUS, len in 0u32..1000, k in 0u32..2000) {
            prop_assert_eq!(psn_in_window(psn_add(start, k), start, len), k < len);
        }
    }
}
