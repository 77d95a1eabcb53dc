#![no_main]
//! MPA stream codec (RFC 5044 §4.1-4.4): `decode_fpdu` never panics for any
//! input, stream position or Marker setting; whatever decodes re-encodes to the
//! same length and Marker count and decodes back to the same ULPDU.
//!
//! Input: byte 0 = flags (bit 0 Markers, bit 1 CRC on re-encode, bit 2 force a
//! 4-aligned position), bytes 1..5 = stream_pos (big-endian), rest = stream.

use libfuzzer_sys::fuzz_target;
use softrdma_wire::mpa::{
    CRC_LEN, FpduRepr, MAX_ULPDU, decode_fpdu, encode_fpdu, encoded_len, peek_encoded_len,
};

fuzz_target!(|data: &[u8]| {
    let Some((head, input)) = data.split_first_chunk::<5>() else {
        return;
    };
    let flags = head[0];
    let markers = flags & 1 != 0;
    let crc = flags & 2 != 0;
    let mut pos = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if flags & 4 != 0 {
        pos &= !3;
    }

    let _ = FpduRepr::parse(input);
    let peek = peek_encoded_len(input, pos, markers);
    let mut ulpdu = vec![0u8; MAX_ULPDU];
    let Ok(Some(info)) = decode_fpdu(input, pos, markers, &mut ulpdu) else {
        return;
    };
    assert_eq!(peek, Ok(Some(info.consumed)));
    let u = &ulpdu[..usize::from(info.ulpdu_len)];

    // Re-encode what decoded (gather list split in two to exercise it).
    let mut out = vec![0u8; encoded_len(u.len(), pos, markers)];
    let half = u.len() / 2;
    let n = encode_fpdu(&[&u[..half], &u[half..]], pos, markers, crc, &mut out)
        .expect("re-encode of a decoded ULPDU");
    assert_eq!(n, info.consumed);

    let mut again = vec![0u8; u.len()];
    let info2 = decode_fpdu(&out, pos, markers, &mut again)
        .expect("decode of our own encoding")
        .expect("complete");
    assert_eq!(&again[..], u);
    assert_eq!(info2.consumed, n);
    assert_eq!(info2.markers, info.markers);
    assert_eq!(info2.pad_len, info.pad_len);
    if crc {
        assert!(info2.crc_ok());
    }
    // Octets differ only in PAD, Marker RESERVED / low FPDUPTR bits and the
    // CRC field; when the rest is identical, so is the CRC coverage.
    if out[..n - CRC_LEN] == input[..n - CRC_LEN] {
        assert_eq!(info2.crc_computed, info.crc_computed);
        if crc && info.crc_ok() {
            assert_eq!(&out[..n], &input[..n]);
        }
    }
});
