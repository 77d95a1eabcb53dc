//! Tests of the CRC32c (RFC 5044 §4.4): check values, iSCSI vectors in wire order, the
//! seed figures and real siw FPDUs, whole, appended and gathered (MPA-32, MPA-33).

use super::*;
use crate::mpa::Fpdu;
use crate::mpa::test_util::*;
use crate::vectors::mpa_fpdus::*;
use proptest::prelude::*;

#[test]
fn mpa_32_crc32c_check_value() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c_bitwise(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
}

/// mpa.md §4.2 iSCSI vectors (RFC 3720 §B.4), in wire order.
#[test]
fn mpa_32_crc32c_iscsi_vectors_wire_order() {
    let asc: Vec<u8> = (0u8..32).collect();
    let desc: Vec<u8> = (0u8..32).rev().collect();
    let cases: [(&[u8], [u8; 4]); 4] = [
        (&[0u8; 32], [0xaa, 0x36, 0x91, 0x8a]),
        (&[0xffu8; 32], [0x43, 0xab, 0xa8, 0x62]),
        (&asc, [0x4e, 0x79, 0xdd, 0x46]),
        (&desc, [0x5c, 0xdb, 0x3f, 0x11]),
    ];
    for (data, wire) in cases {
        assert_eq!(crc_to_wire(crc32c(data)), wire);
        assert_eq!(crc_from_wire(wire), crc32c_bitwise(data));
    }
}

/// MPA-32, MPA-33: seed Fig. 5 (leading Marker covered) and Fig. 6
/// (embedded Marker covered) CRCs, `52 23 99 83` and `84 92 58 98`.
#[test]
fn mpa_32_mpa_33_crc_seed_fig5_fig6() {
    let f5 = seed_fig5();
    let f6 = seed_fig6();
    assert_eq!(crc32c(&f5[..f5.len() - 4]), 0x8399_2352);
    assert_eq!(
        crc_to_wire(crc32c(&f5[..f5.len() - 4])),
        [0x52, 0x23, 0x99, 0x83]
    );
    assert_eq!(crc32c(&f6[..f6.len() - 4]), 0x9858_9284);
    assert_eq!(crc_to_wire(0x9858_9284), [0x84, 0x92, 0x58, 0x98]);
}

#[test]
fn crc32c_gather_matches_flat() {
    let d = pattern(1000, 3);
    assert_eq!(
        crc32c_gather(&[&d[..1], &d[1..500], &[], &d[500..]]),
        crc32c(&d)
    );
    assert_eq!(crc32c_gather(&[]), 0);
    assert_eq!(crc32c(&d), crc32c_bitwise(&d));
}

/// MPA-32/33/34: every real CRC32c of the siw-crc captures verifies, in
/// wire order, with both CRC implementations.
#[test]
fn mpa_32_crc_of_real_siw_crc_fpdus() {
    let fpdus: [(&[u8], [u8; 4]); 7] = [
        (&CRC_RPING_FPDU_SEND, [0x00, 0x83, 0x31, 0x57]),
        (&CRC_RPING_FPDU_READ_REQ, [0x86, 0x81, 0xd4, 0x6c]),
        (&CRC_RPING_FPDU_READ_RESP, [0x2f, 0xfa, 0x03, 0x76]),
        (&CRC_RPING_FPDU_WRITE, [0xf6, 0x5f, 0xb5, 0x29]),
        (&CRC_WRITE_BW_FPDU_PAD2, [0xbf, 0xe0, 0xac, 0x94]),
        (&CRC_WRITE_BW_FPDU_SEND22, [0x2f, 0xd8, 0x88, 0x6e]),
        (&CRC_WRITE_BW_FPDU_1442, [0xaf, 0xc9, 0xad, 0xe8]),
    ];
    for (bytes, wire) in fpdus {
        let f = Fpdu::new_checked(bytes).unwrap();
        assert_eq!(f.total_len(), bytes.len());
        assert_eq!(f.crc(), crc_from_wire(wire));
        assert_eq!(f.compute_crc(), crc_from_wire(wire));
        assert_eq!(
            crc32c_bitwise(&bytes[..bytes.len() - 4]),
            crc_from_wire(wire)
        );
        assert!(f.verify_crc());
    }
}

proptest! {
    /// CRC32c of any length (across the SIMD paths' thresholds), whole, continued
    /// from any cut, and gathered from pieces: the bit-wise model's value.
    #[test]
    fn prop_crc32c_whole_appended_gathered(len in prop_oneof![0usize..300, 300usize..70_000],
                                           seed in any::<u8>(), cuts in proptest::collection::vec(any::<usize>(), 1..5)) {
        let d = pattern(len, u64::from(seed));
        let want = crc32c_bitwise(&d);
        prop_assert_eq!(crc32c(&d), want);
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
        at.push(0);
        at.push(len);
        at.sort_unstable();
        let parts: Vec<&[u8]> = at.windows(2).map(|w| &d[w[0]..w[1]]).collect();
        prop_assert_eq!(crc32c_gather(&parts), want);
        let appended = parts.iter().fold(0, |crc, p| crc32c_append(crc, p));
        prop_assert_eq!(appended, want);
    }
}
