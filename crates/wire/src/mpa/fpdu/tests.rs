//! Tests of the FPDU without Markers (RFC 5044 §4.1): PAD lengths, real FPDUs through
//! the view and the Repr, the setters and siw's non-zero PAD.

use super::*;
use crate::error::Error;
use crate::mpa::test_util::*;
use crate::mpa::{MarkerRepr, decode_fpdu};
use crate::vectors::mpa_fpdus::*;
use proptest::prelude::*;

/// MPA-13: lengths 1..8 -> PAD 1,0,3,2,1,0,3,2; MPA-11/12 FPDU size.
#[test]
fn mpa_13_pad_lengths() {
    let want = [2usize, 1, 0, 3, 2, 1, 0, 3, 2];
    for (len, p) in want.iter().enumerate() {
        assert_eq!(pad_len(len), *p);
        assert_eq!(fpdu_len(len), 2 + len + p + 4);
        assert_eq!((2 + len + pad_len(len)) % 4, 0);
    }
    assert_eq!(pad_len(usize::MAX), 3); // (2^64 + 1) % 4 == 1
    assert_eq!(fpdu_len(usize::MAX), usize::MAX);
    assert_eq!(fpdu_len(42), 48);
}

/// MPA-11, MPA-12, MPA-14: real FPDUs (CRC on and off) through the view
/// and FpduRepr, re-emitted byte-identically.
#[test]
fn mpa_11_capture_fpdus_view_and_repr() {
    let cases: [(&[u8], u16, &[u8], bool); 10] = [
        (&SIW_RPING_FPDU_SEND, 34, &[], false),
        (&SIW_RPING_FPDU_READ_RESP, 78, &[], false),
        (&SIW_MPA1_FPDU, 118, &[], false),
        (&CRC_RPING_FPDU_SEND, 34, &[], true),
        (&CRC_RPING_FPDU_READ_REQ, 46, &[], true),
        (&CRC_RPING_FPDU_READ_RESP, 78, &[], true),
        (&CRC_RPING_FPDU_WRITE, 78, &[], true),
        (&CRC_WRITE_BW_FPDU_PAD2, 20, &[0x00, 0x40], true),
        (&CRC_WRITE_BW_FPDU_SEND22, 22, &[], true),
        (&CRC_WRITE_BW_FPDU_1442, 1442, &[], true),
    ];
    for (bytes, len, pad, crc_on) in cases {
        let f = Fpdu::new_checked(bytes).unwrap();
        assert_eq!(f.ulpdu_length(), len);
        assert_eq!(f.pad_len(), pad.len());
        assert_eq!(f.pad(), pad, "Linux siw PAD octets kept as sent");
        assert_eq!(f.ulpdu(), &bytes[2..2 + usize::from(len)]);
        assert_eq!(f.total_len(), bytes.len());
        if crc_on {
            assert!(f.verify_crc());
        } else {
            assert_eq!(f.crc(), 0, "CRC off: Linux sends a zero field");
        }
        let r = FpduRepr::parse(bytes).unwrap();
        assert_eq!(r.ulpdu, f.ulpdu());
        assert_eq!(r.crc, f.crc());
        assert_eq!(r.buffer_len(), bytes.len());
        let mut out = vec![0u8; bytes.len()];
        assert_eq!(r.emit(&mut out).unwrap(), bytes.len());
        assert_eq!(&out[..], bytes);
        if pad.iter().all(|&b| b == 0) {
            // Rebuild from the ULPDU alone.
            assert_eq!(FpduRepr::new(r.ulpdu, crc_on), r);
            // The stream codec (Markers off) gives the same octets.
            assert_eq!(encode_vec(&[r.ulpdu], 0, false, crc_on), bytes);
        } else {
            // Our zero PAD changes the CRC; the ULPDU survives.
            let ours = encode_vec(&[r.ulpdu], 0, false, crc_on);
            assert_eq!(
                &ours[..2 + usize::from(len)],
                &bytes[..2 + usize::from(len)]
            );
            assert_eq!(FpduRepr::parse(&ours).unwrap().pad, [0; 3]);
        }
        // Every truncation is refused.
        for n in 0..bytes.len() {
            assert!(Fpdu::new_checked(&bytes[..n]).is_err());
            assert!(FpduRepr::parse(&bytes[..n]).is_err());
            assert!(matches!(
                r.emit(&mut out[..n]),
                Err(Error::Truncated { .. })
            ));
        }
    }
}

/// Construct an FPDU with the setters; fill_crc gives CRC32c (MPA-32).
#[test]
fn mpa_32_fpdu_view_setters() {
    let mut buf = [0xeeu8; 28];
    let mut f = Fpdu::new_unchecked(&mut buf[..]);
    f.set_ulpdu_length(20);
    f.ulpdu_mut()
        .copy_from_slice(&CRC_WRITE_BW_FPDU_PAD2[2..22]);
    f.pad_mut().copy_from_slice(&[0x00, 0x40]); // siw's PAD octets
    f.fill_crc();
    assert!(f.verify_crc());
    assert_eq!(buf, CRC_WRITE_BW_FPDU_PAD2);
    let mut f = Fpdu::new_unchecked(buf);
    f.set_crc(0x1234_5678);
    assert_eq!(&f.into_inner()[24..], &[0x78, 0x56, 0x34, 0x12]);
}

/// MPA-13: non-zero PAD is CRC input and otherwise ignored.
#[test]
fn mpa_13_nonzero_pad_kept_and_covered() {
    // Linux already sends PAD 00 40 with a matching CRC.
    let real = Fpdu::new_checked(&CRC_WRITE_BW_FPDU_PAD2[..]).unwrap();
    assert_eq!(real.pad(), &[0x00, 0x40]);
    assert!(real.verify_crc());
    let mut b = CRC_WRITE_BW_FPDU_PAD2;
    b[22] = 0xab;
    let f = Fpdu::new_checked(&b[..]).unwrap();
    assert!(!f.verify_crc());
    let r = FpduRepr::parse(&b).unwrap();
    assert_eq!(r.pad, [0xab, 0x40, 0]);
    let mut out = [0u8; 28];
    r.emit(&mut out).unwrap();
    assert_eq!(out, b);
    let mut fixed = Fpdu::new_unchecked(b);
    fixed.fill_crc();
    let b = fixed.into_inner();
    let mut u = [0u8; 64];
    let info = decode_fpdu(&b, 0, false, &mut u).unwrap().unwrap();
    assert!(info.crc_ok());
    assert_eq!(&u[..20], &CRC_WRITE_BW_FPDU_PAD2[2..22]);
}

proptest! {
    /// FpduRepr emit -> parse -> emit; the Fpdu view never panics.
    #[test]
    fn prop_fpdu_repr_roundtrip(ulpdu in proptest::collection::vec(any::<u8>(), 0..600), pad: [u8; 3], crc: u32) {
        let mut r = FpduRepr { ulpdu: &ulpdu, pad, crc };
        r.pad[pad_len(ulpdu.len())..].fill(0);
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf).unwrap();
        let p = FpduRepr::parse(&buf).unwrap();
        prop_assert_eq!(p, r);
        let mut again = vec![0u8; p.buffer_len()];
        p.emit(&mut again).unwrap();
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn prop_fpdu_view_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(f) = Fpdu::new_checked(&data[..]) {
            let _ = (f.ulpdu(), f.pad(), f.crc(), f.verify_crc(), f.total_len());
        }
        let _ = FpduRepr::parse(&data);
        let _ = MarkerRepr::parse(&data);
    }
}
