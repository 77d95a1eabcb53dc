//! Helpers shared by the MPA tests: a bit-wise CRC32c, an octet-wise model of the stream
//! codec, stream builders and the seed FPDUs of RFC 5044 §4.4 (Figures 5 and 6).

use super::*;

/// Bit-wise CRC32c (RFC 3720 §B.4 parameters), independent of the crate.
pub(super) fn crc32c_bitwise(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Octet-at-a-time model of RFC 5044 §4.1-4.4, written independently of
/// `Layout`: walk the stream, drop a Marker whenever `pos % 512 == 0`
/// before the next body octet or before the CRC.
pub(super) fn reference_encode(ulpdu: &[u8], pos: u32, markers: bool, crc: bool) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(ulpdu.len() as u16).to_be_bytes());
    body.extend_from_slice(ulpdu);
    body.resize(body.len() + (4 - (2 + ulpdu.len()) % 4) % 4, 0);
    let mut v = Vec::new();
    let mut p = pos;
    let mut hdr: Option<u32> = None;
    let marker = |v: &mut Vec<u8>, p: &mut u32, hdr: Option<u32>| {
        let ptr = hdr.map_or(0, |h| p.wrapping_sub(h));
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&(ptr as u16).to_be_bytes());
        *p = p.wrapping_add(4);
    };
    for (i, &b) in body.iter().enumerate() {
        if markers && p.is_multiple_of(512) {
            marker(&mut v, &mut p, hdr);
        }
        if i == 0 {
            hdr = Some(p);
        }
        v.push(b);
        p = p.wrapping_add(1);
    }
    if markers && p.is_multiple_of(512) {
        marker(&mut v, &mut p, hdr);
    }
    let c = if crc { crc32c_bitwise(&v) } else { 0 };
    v.extend_from_slice(&c.to_le_bytes());
    v
}

pub(super) fn encode_vec(parts: &[&[u8]], pos: u32, markers: bool, crc: bool) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = vec![0xa5u8; encoded_len(total, pos, markers)];
    let n = encode_fpdu(parts, pos, markers, crc, &mut out).expect("encode");
    assert_eq!(n, out.len());
    out
}

/// Encode `ulpdus` back to back from `start`; returns the stream and the
/// (stream offset, wire length) of each FPDU.
pub(super) fn encode_stream(
    ulpdus: &[Vec<u8>],
    start: u32,
    markers: bool,
    crc: bool,
) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut s = Vec::new();
    let mut spans = Vec::new();
    for u in ulpdus {
        let pos = start.wrapping_add(s.len() as u32);
        let f = encode_vec(&[u], pos, markers, crc);
        spans.push((s.len(), f.len()));
        s.extend_from_slice(&f);
    }
    (s, spans)
}

/// Decode a whole stream from `start`; panics on error or leftovers.
pub(super) fn decode_stream(stream: &[u8], start: u32, markers: bool) -> Vec<(Vec<u8>, FpduInfo)> {
    let mut out = vec![0u8; MAX_ULPDU];
    let mut off = 0;
    let mut recs = Vec::new();
    while off < stream.len() {
        let pos = start.wrapping_add(off as u32);
        let info = decode_fpdu(&stream[off..], pos, markers, &mut out)
            .expect("decode")
            .expect("complete FPDU");
        recs.push((out[..usize::from(info.ulpdu_len)].to_vec(), info));
        off += info.consumed;
    }
    recs
}

pub(super) use softrdma_testkit::pattern;

/// RFC 5044 §4.4 Fig. 5 / Fig. 6 ULPDU: DDP/RDMAP Send header + 24 zeros.
pub(super) fn seed_ulpdu(msn: u8) -> Vec<u8> {
    let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, msn, 0, 0, 0, 0];
    u.resize(42, 0);
    u
}

/// RFC 5044 §4.4 Figure 5, offsets 0x0000..=0x0033 (stream_pos 0).
pub(super) fn seed_fig5() -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0, 0x00, 0x2a];
    v.extend_from_slice(&seed_ulpdu(1));
    v.extend_from_slice(&[0x52, 0x23, 0x99, 0x83]);
    v
}

/// RFC 5044 §4.4 Figure 6, offsets 0x01ec..=0x021f.
pub(super) fn seed_fig6() -> Vec<u8> {
    let u = seed_ulpdu(2);
    let mut v = vec![0x00, 0x2a];
    v.extend_from_slice(&u[..18]);
    v.extend_from_slice(&[0, 0, 0, 0x14]);
    v.extend_from_slice(&u[18..]);
    v.extend_from_slice(&[0x84, 0x92, 0x58, 0x98]);
    v
}

pub(super) fn is_marker_mismatch(e: &Error) -> bool {
    matches!(e, Error::Malformed { reason, .. } if *reason == REASON_MARKER_MISMATCH)
}
