//! Tests of Marker placement (RFC 5044 §4.2, §4.3; MPA-15 to MPA-24, MPA-33): the seed
//! figures, sequence wrap, Markers between FPDUs and before the CRC, forged Markers.

use super::*;
use crate::mpa::test_util::*;
use crate::mpa::{crc_to_wire, crc32c, decode_fpdu, fpdu_len};

#[test]
fn marker_repr_roundtrip() {
    let m = MarkerRepr {
        reserved: 0xffff,
        fpduptr: 0x0017,
    };
    let mut b = [0u8; 4];
    assert_eq!(m.emit(&mut b).unwrap(), 4);
    assert_eq!(b, [0xff, 0xff, 0x00, 0x17]);
    assert_eq!(MarkerRepr::parse(&b).unwrap(), m);
    assert_eq!(m.effective_fpduptr(), 0x14);
    assert_eq!(m.buffer_len(), 4);
    assert!(MarkerRepr::parse(&b[..3]).is_err());
    assert!(m.emit(&mut b[..3]).is_err());
}

/// MPA-19: seed Figure 4 (ULPDU 16, Marker after 10 ULPDU octets with
/// FPDUPTR 0x000C, PAD 2): 28 octets.
#[test]
fn mpa_19_seed_fig4_layout() {
    let u = pattern(16, 1);
    let pos = 500; // 500 + 12 = 512
    let w = encode_vec(&[&u], pos, true, false);
    assert_eq!(w.len(), 28);
    assert_eq!(&w[..2], &[0x00, 0x10]);
    assert_eq!(&w[2..12], &u[..10]);
    assert_eq!(&w[12..16], &[0, 0, 0, 0x0c]);
    assert_eq!(&w[16..22], &u[10..]);
    assert_eq!(&w[22..24], &[0, 0]);
    assert_eq!(&w[24..], &[0, 0, 0, 0]);
    let mut out = [0u8; 16];
    let info = decode_fpdu(&w, pos, true, &mut out).unwrap().unwrap();
    assert_eq!(
        (info.ulpdu_len, info.pad_len, info.markers, info.consumed),
        (16, 2, 1, 28)
    );
    assert_eq!(out.to_vec(), u);
}

/// MPA-18, MPA-22: SeqStart = 11 puts Markers at sequence numbers 11, 523,
/// 1035, ... (seed example); nothing else looks like a Marker slot.
#[test]
fn mpa_18_seq_start_11_marker_positions() {
    let seq_start: u32 = 11;
    let ulpdus: Vec<Vec<u8>> = (0..12)
        .map(|i| pattern(97 + 13 * i, u64::from(i as u8)))
        .collect();
    let (stream, spans) = encode_stream(&ulpdus, 0, true, true);
    assert!(stream.len() > 1100);
    let header_seqs: Vec<u32> = spans
        .iter()
        .map(|&(off, _)| {
            let lead = if off % 512 == 0 { 4 } else { 0 };
            seq_start + (off + lead) as u32
        })
        .collect();
    for seq in [11u32, 523, 1035] {
        let off = (seq - seq_start) as usize;
        let ptr = u16::from_be_bytes([stream[off + 2], stream[off + 3]]);
        assert_eq!(&stream[off..off + 2], &[0, 0]);
        if ptr == 0 {
            assert!(
                header_seqs.contains(&(seq + 4)),
                "Marker at {seq} sits between FPDUs"
            );
        } else {
            assert!(
                header_seqs.contains(&(seq - u32::from(ptr))),
                "Marker at {seq}"
            );
        }
    }
    let recs = decode_stream(&stream, 0, true);
    assert_eq!(recs.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), ulpdus);
    let total_markers: usize = recs.iter().map(|r| usize::from(r.1.markers)).sum();
    assert_eq!(total_markers, stream.len().div_ceil(512));
}

/// Check every Marker of an encoded stream starting at `start`: RESERVED 0,
/// FPDUPTR (seq arithmetic mod 2^32) resolving to the containing FPDU's
/// ULPDU_Length, or 0 right before the next ULPDU_Length.
fn check_stream_markers(stream: &[u8], spans: &[(usize, usize)], start: u32, seq_start: u32) {
    let mut n = 0;
    for &(off, len) in spans {
        let lead = if start.wrapping_add(off as u32).is_multiple_of(512) {
            4
        } else {
            0
        };
        let hdr_seq = seq_start
            .wrapping_add(start)
            .wrapping_add((off + lead) as u32);
        for at in off..off + len {
            let pos = start.wrapping_add(at as u32);
            if !pos.is_multiple_of(512) {
                continue;
            }
            n += 1;
            assert!(at + 4 <= off + len - 4, "Marker never inside the CRC");
            assert_eq!(&stream[at..at + 2], &[0, 0]);
            let ptr = u16::from_be_bytes([stream[at + 2], stream[at + 3]]);
            assert_eq!(ptr & 3, 0, "MPA-16");
            let seq = seq_start.wrapping_add(pos);
            if at == off {
                assert_eq!(ptr, 0, "MPA-21");
            } else {
                assert_eq!(seq.wrapping_sub(u32::from(ptr)), hdr_seq, "MPA-20/23");
            }
        }
    }
    let first = start.wrapping_add(0);
    let expect = (0..stream.len())
        .filter(|&i| first.wrapping_add(i as u32).is_multiple_of(512))
        .count();
    assert_eq!(n, expect);
}

/// MPA-20: SeqStart 0xFFFFFF00 — sequence numbers wrap inside a
/// 2000-octet FPDU; back-pointers still resolve modulo 2^32. Also a stream
/// offset that itself wraps (stream_pos near 2^32).
#[test]
fn mpa_20_sequence_wrap() {
    let seq_start = 0xFFFF_FF00u32;
    let ulpdus = vec![pattern(2000, 1), pattern(700, 2), pattern(2000, 3)];
    let (stream, spans) = encode_stream(&ulpdus, 0, true, true);
    check_stream_markers(&stream, &spans, 0, seq_start);
    // Absolute sequence numbers of the Markers: 0xFFFFFF00, 0x100, 0x300, ...
    assert_eq!(seq_start.wrapping_add(512), 0x100);
    let ptr = u16::from_be_bytes([stream[514], stream[515]]);
    assert_eq!(
        0x100u32.wrapping_sub(u32::from(ptr)),
        seq_start.wrapping_add(4)
    );

    for start in [0xFFFF_FF00u32, 0xFFFF_FFFC, 0xFFFF_FE04, 0xFFFF_F800] {
        let (stream, spans) = encode_stream(&ulpdus, start, true, true);
        check_stream_markers(&stream, &spans, start, 0);
        let recs = decode_stream(&stream, start, true);
        assert_eq!(recs.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), ulpdus);
        assert!(recs.iter().all(|r| r.1.crc_ok()));
        for (i, u) in ulpdus.iter().enumerate() {
            let pos = start.wrapping_add(spans[i].0 as u32);
            assert_eq!(
                reference_encode(u, pos, true, true),
                stream[spans[i].0..][..spans[i].1]
            );
        }
    }
}

/// MPA-23: a 2000-octet ULPDU holds 3-5 Markers, all pointing back to the
/// same ULPDU_Length, from every 4-aligned start within a 512 interval.
#[test]
fn mpa_23_large_fpdu_markers_point_to_same_header() {
    let u = pattern(2000, 7);
    for pos in (0u32..512).step_by(4) {
        let w = encode_vec(&[&u[..100], &u[100..1500], &u[1500..]], pos, true, true);
        assert_eq!(w, reference_encode(&u, pos, true, true));
        let hdr = if pos % 512 == 0 { 4 } else { 0 };
        let mut seen = 0;
        for at in 0..w.len() {
            if !(pos as usize + at).is_multiple_of(512) {
                continue;
            }
            seen += 1;
            let ptr = usize::from(u16::from_be_bytes([w[at + 2], w[at + 3]]));
            if at == 0 {
                assert_eq!(ptr, 0);
            } else {
                assert_eq!(at - ptr, hdr, "pos {pos} marker at {at}");
            }
        }
        assert!((3..=5).contains(&seen), "{seen}");
        let mut out = vec![0u8; 2000];
        let info = decode_fpdu(&w, pos, true, &mut out).unwrap().unwrap();
        assert_eq!(usize::from(info.markers), seen);
        assert_eq!(info.consumed, w.len());
        assert_eq!(out, u);
        assert!(info.crc_ok());
    }
}

/// MPA-24: many 16-octet ULPDUs (24-octet FPDUs) share each 512-octet
/// interval; each Marker points at its own FPDU or is 0 between FPDUs.
#[test]
fn mpa_24_many_small_fpdus() {
    let ulpdus: Vec<Vec<u8>> = (0..300).map(|i| pattern(16, u64::from(i as u8))).collect();
    for start in [0u32, 4, 8, 12, 20, 0xFFFF_FFF0] {
        let (stream, spans) = encode_stream(&ulpdus, start, true, true);
        check_stream_markers(&stream, &spans, start, 0);
        let between = spans
            .iter()
            .filter(|&&(off, _)| start.wrapping_add(off as u32) % 512 == 0)
            .count();
        let inside = stream.len().div_ceil(512) - between;
        assert!(inside > 0);
        let recs = decode_stream(&stream, start, true);
        assert_eq!(recs.len(), 300);
        assert!(
            recs.iter()
                .zip(&ulpdus)
                .all(|(r, u)| &r.0 == u && r.1.crc_ok())
        );
    }
}

/// MPA-21, MPA-33: a Marker exactly between two FPDUs carries FPDUPTR 0,
/// belongs to (and is covered by the CRC of) the following FPDU.
#[test]
fn mpa_21_marker_between_fpdus() {
    // 4 (Marker) + 2 + 502 + 0 PAD + 4 CRC = 512: the next Marker falls
    // right after the CRC.
    assert_eq!(encoded_len(502, 0, true), 512);
    let ulpdus = vec![pattern(502, 1), pattern(30, 2)];
    let (stream, spans) = encode_stream(&ulpdus, 0, true, true);
    assert_eq!(spans, vec![(0, 512), (512, 4 + 2 + 30 + 4)]);
    assert_eq!(&stream[512..516], &[0, 0, 0, 0]);
    assert_eq!(&stream[516..518], &[0, 30]);
    let crc2 = crc32c(&stream[512..stream.len() - 4]);
    assert_eq!(crc_to_wire(crc2), stream[stream.len() - 4..]);
    // The Marker's RESERVED is CRC input of the *second* FPDU only.
    let mut bad = stream.clone();
    bad[512] = 0xff;
    let recs_ok = decode_stream(&stream, 0, true);
    let mut out = vec![0u8; 600];
    let i1 = decode_fpdu(&bad, 0, true, &mut out).unwrap().unwrap();
    assert!(i1.crc_ok());
    assert_eq!(i1.markers, 1);
    let i2 = decode_fpdu(&bad[512..], 512, true, &mut out)
        .unwrap()
        .unwrap();
    assert!(!i2.crc_ok());
    assert_eq!(i2.markers, 1);
    assert!(recs_ok.iter().all(|r| r.1.crc_ok()));
    // A non-zero FPDUPTR in that slot is a mismatch (MPA-87).
    let mut bad = stream.clone();
    bad[515] = 4;
    let e = decode_fpdu(&bad[512..], 512, true, &mut out).unwrap_err();
    assert!(is_marker_mismatch(&e));
    // Seen as soon as the Marker and length are there.
    assert!(is_marker_mismatch(
        &decode_fpdu(&bad[512..518], 512, true, &mut out).unwrap_err()
    ));
}

/// MPA-33: a Marker directly after the PAD (just before the CRC) belongs
/// to the FPDU, points back to its ULPDU_Length and is CRC-covered.
#[test]
fn mpa_33_marker_after_pad_before_crc() {
    // 4 + (2 + 506 + 0) = 512: body ends on the boundary.
    let u = pattern(506, 5);
    let w = encode_vec(&[&u], 0, true, true);
    assert_eq!(w.len(), 4 + 508 + 4 + 4);
    assert_eq!(&w[512..516], &[0, 0, 0x01, 0xfc]); // 512 - 4 = 508
    assert_eq!(crc_to_wire(crc32c(&w[..516])), w[516..]);
    assert_eq!(w, reference_encode(&u, 0, true, true));
    let mut out = vec![0u8; 506];
    let info = decode_fpdu(&w, 0, true, &mut out).unwrap().unwrap();
    assert_eq!(info.markers, 2);
    assert!(info.crc_ok());
    // Same with a PAD: 2 + 505 + 1 = 508.
    let u = pattern(505, 6);
    let w = encode_vec(&[&u], 0, true, true);
    assert_eq!(w.len(), 520);
    assert_eq!(w[511], 0, "PAD");
    assert_eq!(&w[512..516], &[0, 0, 0x01, 0xfc]);
    let info = decode_fpdu(&w, 0, true, &mut out).unwrap().unwrap();
    assert_eq!((info.pad_len, info.markers), (1, 2));
    assert_eq!(&out[..505], &u[..]);
    // Without a leading Marker: from stream_pos 4 the body fills [4, 512)
    // and the Marker at 512 follows it, FPDUPTR 508.
    let u = pattern(506, 7);
    let w = encode_vec(&[&u], 4, true, true);
    assert_eq!(w.len(), 508 + 4 + 4);
    assert_eq!(&w[508..512], &[0, 0, 0x01, 0xfc]);
    let info = decode_fpdu(&w, 4, true, &mut out).unwrap().unwrap();
    assert_eq!(info.markers, 1);
    assert!(info.crc_ok());
}

/// Recompute the CRC after forging octets of `w` (whole-FPDU coverage).
fn refresh_crc(w: &mut [u8]) {
    let n = w.len() - 4;
    let c = crc32c(&w[..n]);
    w[n..].copy_from_slice(&crc_to_wire(c));
}

/// MPA-15, MPA-16, MPA-87: RESERVED = 0xFFFF and FPDUPTR low bits = 3 are
/// accepted when the CRC covers them; a wrong FPDUPTR with a valid CRC is
/// error 3.
#[test]
fn mpa_15_16_87_forged_markers() {
    let u = pattern(2000, 4);
    let pos = 100;
    let w = encode_vec(&[&u], pos, true, true);
    let marks: Vec<usize> = (0..w.len())
        .filter(|a| (pos as usize + a).is_multiple_of(512))
        .collect();
    assert_eq!(marks.len(), 4);
    let mut out = vec![0u8; 2000];

    let mut b = w.clone();
    for &m in &marks {
        b[m] = 0xff;
        b[m + 1] = 0xff;
        b[m + 3] |= 3;
    }
    refresh_crc(&mut b);
    let info = decode_fpdu(&b, pos, true, &mut out).unwrap().unwrap();
    assert!(info.crc_ok());
    assert_eq!(info.markers, 4);
    assert_eq!(out, u);

    for &m in &marks {
        let mut b = w.clone();
        let ptr = u16::from_be_bytes([b[m + 2], b[m + 3]]).wrapping_add(4);
        b[m + 2..m + 4].copy_from_slice(&ptr.to_be_bytes());
        refresh_crc(&mut b);
        let e = decode_fpdu(&b, pos, true, &mut out).unwrap_err();
        assert!(is_marker_mismatch(&e), "{e}");
    }
}

/// `encoded_len` (closed form) agrees with the Layout walk and the
/// octet-wise reference for every 4-aligned start in an interval.
#[test]
fn encoded_len_matches_layout_walk() {
    for len in (0..1600).step_by(7).chain([506, 502, 1018, 1014, 64768]) {
        for pos in (0u32..1024).step_by(4) {
            let mut l = Layout::new(len, pos, true);
            for _ in &mut l {}
            assert_eq!(encoded_len(len, pos, true), l.at + CRC_LEN, "{len} @ {pos}");
            assert_eq!(l.count, (encoded_len(len, pos, true) - fpdu_len(len)) / 4);
        }
        assert_eq!(encoded_len(len, 1, false), fpdu_len(len));
    }
}
