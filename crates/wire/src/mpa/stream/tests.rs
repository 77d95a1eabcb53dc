//! Tests of the stream codec (RFC 5044 §4.1-§4.4): the seed figures byte-exact, octet-
//! at-a-time delivery, bit flips, CRCs off, real FPDUs, ULPDU bounds and error paths.

use super::*;
use crate::error::Error;
use crate::mpa::test_util::*;
use crate::mpa::{fpdu_len, pad_len};
use crate::vectors::mpa_fpdus::*;
use proptest::prelude::*;

/// MPA-11, MPA-22, MPA-32, MPA-33, MPA-76: seed Figure 5 byte-exact; the
/// first octets of Full Operation are the Marker 00000000.
#[test]
fn mpa_11_22_76_seed_fig5_encode_decode() {
    let u = seed_ulpdu(1);
    let wire = encode_vec(&[&u[..18], &u[18..]], 0, true, true);
    assert_eq!(wire, seed_fig5());
    assert_eq!(&wire[..4], &[0, 0, 0, 0]);
    assert_eq!(encoded_len(42, 0, true), 0x34);
    assert_eq!(reference_encode(&u, 0, true, true), wire);
    let mut out = [0u8; 64];
    let info = decode_fpdu(&wire, 0, true, &mut out).unwrap().unwrap();
    assert_eq!(
        info,
        FpduInfo {
            consumed: 52,
            ulpdu_len: 42,
            pad_len: 0,
            markers: 1,
            crc_field: 0x8399_2352,
            crc_computed: 0x8399_2352
        }
    );
    assert!(info.crc_ok());
    assert_eq!(&out[..42], &u[..]);
    // MPA-76 without Markers: the ULPDU_Length comes first.
    let plain = encode_vec(&[&u], 0, false, true);
    assert_eq!(&plain[..2], &[0x00, 0x2a]);
    assert_eq!(plain.len(), 48);
}

/// MPA-12, MPA-19, MPA-26, MPA-33: seed Figure 6 at stream offset 0x1ec,
/// after a 492-octet first FPDU; DDP gets exactly 42 octets.
#[test]
fn mpa_12_19_26_seed_fig6_second_fpdu() {
    let first = pattern(482, 9);
    let (stream, spans) = encode_stream(&[first.clone(), seed_ulpdu(2)], 0, true, true);
    assert_eq!(spans, vec![(0, 492), (0x1ec, 52)]);
    assert_eq!(&stream[0x1ec..], &seed_fig6()[..]);
    let mut out = [0u8; 64];
    let info = decode_fpdu(&stream[0x1ec..], 0x1ec, true, &mut out)
        .unwrap()
        .unwrap();
    assert_eq!(info.ulpdu_len, 0x2a);
    assert_eq!(info.markers, 1);
    assert_eq!(info.consumed, 52);
    assert!(info.crc_ok());
    assert_eq!(info.crc_field, 0x9858_9284);
    assert_eq!(&out[..42], &seed_ulpdu(2)[..]);
    let recs = decode_stream(&stream, 0, true);
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].0, first);
}

/// MPA-48, MPA-44, MPA-95: fed one octet at a time, each FPDU is
/// delivered exactly when its last CRC octet arrives, never earlier.
#[test]
fn mpa_48_one_octet_increments() {
    let ulpdus: Vec<Vec<u8>> = [1usize, 16, 42, 490, 502, 506, 1000, 2000, 3, 0]
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, u64::from(i as u8)))
        .collect();
    for (start, markers) in [(0u32, true), (0xFFFF_FF00, true), (492, true), (7, false)] {
        let (stream, spans) = encode_stream(&ulpdus, start, markers, true);
        let mut out = vec![0u8; 4096];
        let mut off = 0;
        let mut got = Vec::new();
        for end in 0..=stream.len() {
            let pos = start.wrapping_add(off as u32);
            match decode_fpdu(&stream[off..end], pos, markers, &mut out).unwrap() {
                None => {}
                Some(info) => {
                    assert_eq!(end, off + info.consumed, "delivered at the last CRC octet");
                    assert!(info.crc_ok());
                    got.push((
                        off,
                        info.consumed,
                        out[..usize::from(info.ulpdu_len)].to_vec(),
                    ));
                    off += info.consumed;
                    // Nothing more is visible yet.
                    let pos = start.wrapping_add(off as u32);
                    assert_eq!(
                        decode_fpdu(&stream[off..end], pos, markers, &mut out).unwrap(),
                        None
                    );
                }
            }
        }
        assert_eq!(off, stream.len());
        assert_eq!(got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(), spans);
        assert_eq!(got.into_iter().map(|g| g.2).collect::<Vec<_>>(), ulpdus);
    }
}

/// MPA-03, MPA-25: N ULPDUs make N FPDUs, decoded back as N records.
#[test]
fn mpa_03_one_ulpdu_per_fpdu() {
    let ulpdus: Vec<Vec<u8>> = (0..40)
        .map(|i| pattern(i * 37 % 1500, u64::from(i as u8)))
        .collect();
    for markers in [false, true] {
        let (stream, spans) = encode_stream(&ulpdus, 0, markers, true);
        assert_eq!(spans.len(), 40);
        let recs = decode_stream(&stream, 0, markers);
        assert_eq!(recs.into_iter().map(|r| r.0).collect::<Vec<_>>(), ulpdus);
    }
}

/// MPA-34, MPA-86: flipping any single bit of a Marker-carrying FPDU is
/// caught: CRC mismatch, Marker mismatch (error 3), or a different length
/// (incomplete / refused) — never a clean delivery.
#[test]
fn mpa_34_single_bit_flips_detected() {
    let u = pattern(1000, 11);
    let pos = 492;
    let w = encode_vec(&[&u[..18], &u[18..]], pos, true, true);
    let mut out = vec![0u8; MAX_ULPDU];
    let (mut crc_bad, mut marker_bad, mut other) = (0, 0, 0);
    for i in 0..w.len() {
        for bit in 0..8 {
            let mut b = w.clone();
            b[i] ^= 1 << bit;
            match decode_fpdu(&b, pos, true, &mut out) {
                Ok(Some(info)) => {
                    assert!(!info.crc_ok(), "flip at {i}.{bit} delivered cleanly");
                    crc_bad += 1;
                }
                Err(e) if is_marker_mismatch(&e) => marker_bad += 1,
                _ => other += 1,
            }
        }
    }
    assert!(crc_bad > 0 && marker_bad > 0 && other > 0);
}

/// MPA-34: targeted flips in ULPDU, PAD, Marker RESERVED, Marker FPDUPTR
/// low bits (all CRC errors) and the CRC field itself.
#[test]
fn mpa_34_flip_in_ulpdu_pad_marker_crc() {
    let u = pattern(41, 3); // 2 + 41 + 1 PAD
    let pos = 500; // Marker after 8 ULPDU octets (offset 12)
    let w = encode_vec(&[&u], pos, true, true);
    assert_eq!(w.len(), 2 + 41 + 1 + 4 + 4);
    let mut out = [0u8; 64];
    let pad_at = w.len() - 5;
    assert_eq!(w[pad_at], 0);
    for (what, at, mask) in [
        ("ULPDU", 5usize, 0x10u8),
        ("PAD", pad_at, 0x01),
        ("Marker RESERVED", 12, 0x80),
        ("Marker FPDUPTR low bits (MPA-16)", 15, 0x03),
        ("CRC", w.len() - 1, 0x40),
    ] {
        let mut b = w.clone();
        b[at] ^= mask;
        let info = decode_fpdu(&b, pos, true, &mut out).unwrap().unwrap();
        assert!(!info.crc_ok(), "{what}");
        assert_eq!(info.consumed, w.len(), "{what}");
    }
    // FPDUPTR high bits: the Marker disagrees with the start (error 3).
    let mut b = w.clone();
    b[15] ^= 0x04;
    assert!(is_marker_mismatch(
        &decode_fpdu(&b, pos, true, &mut out).unwrap_err()
    ));
}

/// MPA-14, MPA-58: with CRCs off the field is zero on send and decode
/// still delivers whatever the field holds (the caller does not check).
#[test]
fn mpa_14_58_crc_off() {
    let u = pattern(100, 1);
    for markers in [false, true] {
        let w = encode_vec(&[&u], 0, markers, false);
        assert_eq!(&w[w.len() - 4..], &[0, 0, 0, 0]);
        let mut b = w.clone();
        let n = b.len();
        b[n - 4..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let mut out = [0u8; 100];
        let info = decode_fpdu(&b, 0, markers, &mut out).unwrap().unwrap();
        assert_eq!(info.crc_field, 0xefbe_adde);
        assert_eq!(info.crc_computed, crc32c(&w[..n - 4]));
        assert_eq!(out.to_vec(), u);
        // MPA-31: a receiver with CRCs off need not compute it at all.
        let mut out2 = [0u8; 100];
        let lazy = decode_fpdu_with(&b, 0, markers, &mut out2, false)
            .unwrap()
            .unwrap();
        assert_eq!(
            (lazy.crc_computed, lazy.consumed),
            (0xefbe_adde, info.consumed)
        );
        assert!(lazy.crc_ok());
        assert_eq!(out2, out);
    }
}

/// Real FPDUs through decode_fpdu (Markers off), including the 1448-octet
/// FPDU that arrived in two TCP segments (MPA-44/48).
#[test]
fn mpa_44_capture_fpdus_decode_and_split() {
    let mut out = vec![0u8; 2048];
    let seg1 = &CRC_WRITE_BW_FPDU_1442[..CRC_WRITE_BW_SEG40_LEN];
    assert_eq!(decode_fpdu(seg1, 0, false, &mut out).unwrap(), None);
    assert_eq!(peek_encoded_len(seg1, 0, false).unwrap(), Some(1448));
    let info = decode_fpdu(&CRC_WRITE_BW_FPDU_1442, 0, false, &mut out)
        .unwrap()
        .unwrap();
    assert_eq!(
        (info.consumed, info.ulpdu_len, info.pad_len, info.markers),
        (1448, 1442, 0, 0)
    );
    assert!(info.crc_ok());
    assert_eq!(crc_to_wire(info.crc_field), [0xaf, 0xc9, 0xad, 0xe8]);
    assert_eq!(
        encode_vec(&[&out[..1442]], 0, false, true),
        CRC_WRITE_BW_FPDU_1442
    );

    for (bytes, crc_on) in [
        (&SIW_RPING_FPDU_SEND[..], false),
        (&SIW_RPING_FPDU_READ_RESP, false),
        (&SIW_MPA1_FPDU, false),
        (&CRC_RPING_FPDU_SEND, true),
        (&CRC_RPING_FPDU_READ_REQ, true),
    ] {
        let info = decode_fpdu(bytes, 24, false, &mut out).unwrap().unwrap();
        assert_eq!(info.consumed, bytes.len());
        assert_eq!(info.crc_ok(), crc_on);
        let ul = usize::from(info.ulpdu_len);
        assert_eq!(encode_vec(&[&out[..ul]], 24, false, crc_on), bytes);
    }
    // MPA-13: siw's non-zero PAD is accepted (CRC valid), stripped, and
    // our re-encode differs only in PAD and CRC.
    let info = decode_fpdu(&CRC_WRITE_BW_FPDU_PAD2, 24, false, &mut out)
        .unwrap()
        .unwrap();
    assert!(info.crc_ok());
    assert_eq!((info.ulpdu_len, info.pad_len), (20, 2));
    assert_eq!(&out[..20], &CRC_WRITE_BW_FPDU_PAD2[2..22]);
    let ours = encode_vec(&[&out[..20]], 24, false, true);
    assert_eq!(&ours[..22], &CRC_WRITE_BW_FPDU_PAD2[..22]);
    assert_eq!(&ours[22..24], &[0, 0]);
    // Two captured FPDUs back to back (siw-crc-rping, frames 11 then 13 of
    // the Initiator direction) decode as a stream.
    let mut s = CRC_RPING_FPDU_SEND.to_vec();
    s.extend_from_slice(&CRC_RPING_FPDU_READ_RESP);
    let recs = decode_stream(&s, 0, false);
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|r| r.1.crc_ok()));
}

/// MPA-07: the codec refuses ULPDUs above 64768 both ways; a receive
/// buffer that is too small is refused as soon as the length is visible.
#[test]
fn mpa_07_ulpdu_bounds() {
    let big = vec![0u8; MAX_ULPDU + 1];
    let mut out = vec![0u8; 70000];
    assert!(matches!(
        encode_fpdu(&[&big], 0, false, true, &mut out),
        Err(Error::TooLarge {
            value: 64769,
            limit: 64768,
            ..
        })
    ));
    assert!(matches!(
        encode_fpdu(&[&big[..40000], &big[40000..]], 0, true, true, &mut out),
        Err(Error::TooLarge { .. })
    ));
    // 64768 works everywhere, Markers and all (FPDUPTR fits 16 bits).
    let max = pattern(MAX_ULPDU, 1);
    for pos in [0u32, 4, 252, 508, 0xFFFF_FFFC] {
        let w = encode_vec(&[&max], pos, true, true);
        assert_eq!(w, reference_encode(&max, pos, true, true));
        let info = decode_fpdu(&w, pos, true, &mut out).unwrap().unwrap();
        assert!(info.crc_ok());
        assert!(info.markers >= 127);
        assert_eq!(&out[..MAX_ULPDU], &max[..]);
    }
    let len = (MAX_ULPDU as u16 + 1).to_be_bytes();
    assert!(matches!(
        decode_fpdu(&len, 4, false, &mut out),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        decode_fpdu(&[0xff, 0xff], 4, true, &mut out),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        peek_encoded_len(&[0xff, 0xff], 4, false),
        Err(Error::TooLarge { .. })
    ));
    // Receive buffer smaller than ULPDU_Length.
    let mut small = [0u8; 33];
    assert!(matches!(
        decode_fpdu(&SIW_RPING_FPDU_SEND[..2], 0, false, &mut small),
        Err(Error::TooLarge {
            value: 34,
            limit: 33,
            ..
        })
    ));
}

/// Misaligned FPDU starts with Markers on, short output buffers.
#[test]
fn stream_codec_error_paths() {
    let u = [1u8; 10];
    let mut out = [0u8; 64];
    for pos in [1u32, 2, 3, 513, 0xFFFF_FFFF] {
        let e = encode_fpdu(&[&u], pos, true, true, &mut out).unwrap_err();
        assert!(matches!(e, Error::Malformed { reason, .. } if reason == REASON_UNALIGNED));
        let e = decode_fpdu(&[0; 32], pos, true, &mut out).unwrap_err();
        assert!(matches!(e, Error::Malformed { reason, .. } if reason == REASON_UNALIGNED));
        // Without Markers the position does not matter.
        assert!(encode_fpdu(&[&u], pos, false, true, &mut out).is_ok());
    }
    let need = encoded_len(10, 508, true);
    assert_eq!(need, 2 + 10 + 4 + 4); // PAD 0
    for n in 0..need {
        assert!(matches!(
            encode_fpdu(&[&u], 508, true, true, &mut out[..n]),
            Err(Error::Truncated { .. })
        ));
    }
    // Empty gather list = empty ULPDU: 2 + 0 + 2 + 4.
    assert_eq!(encode_fpdu(&[], 8, true, true, &mut out).unwrap(), 8);
    let info = decode_fpdu(&out[..8], 8, true, &mut [0u8; 0])
        .unwrap()
        .unwrap();
    assert_eq!((info.ulpdu_len, info.pad_len, info.consumed), (0, 2, 8));
    assert!(info.crc_ok());
    // Never panics on absurd sizes.
    assert_eq!(encoded_len(usize::MAX, 0, true), usize::MAX);
    assert_eq!(encoded_len(usize::MAX, 3, false), usize::MAX);
    // Partial input: None, never an error, until the length is visible.
    assert_eq!(decode_fpdu(&[], 0, true, &mut out).unwrap(), None);
    assert_eq!(
        decode_fpdu(&[0, 0, 0, 0, 0], 0, true, &mut out).unwrap(),
        None
    );
    assert_eq!(peek_encoded_len(&[0, 0, 0, 0], 0, true).unwrap(), None);
    assert_eq!(
        peek_encoded_len(&[0, 0, 0, 0, 0, 42], 0, true).unwrap(),
        Some(52)
    );
}

/// Start positions: 4-aligned (Markers on), near 0, a 512 boundary, or 2^32.
fn arb_pos() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..2048,
        any::<u32>(),
        (0u32..64).prop_map(|d| 0u32.wrapping_sub(d * 4)),
        (0u32..64).prop_map(|k| k * 512),
    ]
    .prop_map(|p| p & !3)
}

proptest! {
    /// MPA-11/18/19/21/23/24/33: encode -> decode round trip against the
    /// octet-wise reference, for random sizes, gather splits and starts.
    #[test]
    fn prop_encode_decode_roundtrip(
        ulpdu in proptest::collection::vec(any::<u8>(), 0..3000),
        cut1 in any::<prop::sample::Index>(),
        cut2 in any::<prop::sample::Index>(),
        pos in arb_pos(),
        markers: bool,
        crc: bool,
    ) {
        let (a, b) = {
            let x = cut1.index(ulpdu.len() + 1);
            let y = cut2.index(ulpdu.len() + 1);
            (x.min(y), x.max(y))
        };
        let parts: [&[u8]; 3] = [&ulpdu[..a], &ulpdu[a..b], &ulpdu[b..]];
        let w = encode_vec(&parts, pos, markers, crc);
        prop_assert_eq!(&w, &reference_encode(&ulpdu, pos, markers, crc));
        prop_assert_eq!(w.len(), encoded_len(ulpdu.len(), pos, markers));
        prop_assert_eq!(peek_encoded_len(&w, pos, markers).unwrap(), Some(w.len()));
        let mut out = vec![0u8; ulpdu.len()];
        let info = decode_fpdu(&w, pos, markers, &mut out).unwrap().unwrap();
        prop_assert_eq!(info.consumed, w.len());
        prop_assert_eq!(usize::from(info.ulpdu_len), ulpdu.len());
        prop_assert_eq!(usize::from(info.pad_len), pad_len(ulpdu.len()));
        prop_assert_eq!(usize::from(info.markers) * 4 + fpdu_len(ulpdu.len()), w.len());
        prop_assert_eq!(info.crc_ok(), crc);
        prop_assert_eq!(&out, &ulpdu);
        // Any strict prefix is "need more" (MPA-48).
        let cut = cut1.index(w.len());
        prop_assert_eq!(decode_fpdu(&w[..cut], pos, markers, &mut out).unwrap(), None);
    }

    /// MPA-25/44: a stream cut into random chunks decodes to the same records.
    #[test]
    fn prop_stream_random_chunks(
        sizes in proptest::collection::vec(0usize..1200, 1..12),
        chunks in proptest::collection::vec(1usize..700, 1..64),
        pos in arb_pos(),
        markers: bool,
    ) {
        let ulpdus: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(n, u64::from(i as u8))).collect();
        let (stream, _) = encode_stream(&ulpdus, pos, markers, true);
        let mut out = vec![0u8; 1200];
        let (mut off, mut end, mut k, mut got) = (0usize, 0usize, 0usize, Vec::new());
        while off < stream.len() {
            end = (end + chunks[k % chunks.len()]).min(stream.len());
            k += 1;
            while let Some(info) = decode_fpdu(&stream[off..end], pos.wrapping_add(off as u32), markers, &mut out).unwrap() {
                prop_assert!(info.crc_ok());
                got.push(out[..usize::from(info.ulpdu_len)].to_vec());
                off += info.consumed;
            }
        }
        prop_assert_eq!(got, ulpdus);
    }

    /// Arbitrary bytes never panic decode_fpdu, at any position, Markers
    /// on or off; what decodes re-encodes to the same length.
    #[test]
    fn prop_decode_never_panics(
        data in proptest::collection::vec(any::<u8>(), 0..2100),
        pos: u32,
        markers: bool,
        out_len in 0usize..2100,
        len_hint in 0u16..2000,
    ) {
        let mut data = data;
        // Steer half the cases to a plausible ULPDU_Length.
        if data.len() >= 6 && len_hint % 2 == 0 {
            let lead = if markers && pos % 512 == 0 { 4 } else { 0 };
            data[lead..lead + 2].copy_from_slice(&(len_hint / 2).to_be_bytes());
        }
        let mut out = vec![0u8; out_len];
        let _ = peek_encoded_len(&data, pos, markers);
        if let Ok(Some(info)) = decode_fpdu(&data, pos, markers, &mut out) {
            let u = &out[..usize::from(info.ulpdu_len)];
            let w = encode_vec(&[u], pos, markers, true);
            prop_assert_eq!(w.len(), info.consumed);
        }
    }
}
