#![no_main]
//! The MPA deframer (RFC 5044 §4, §6) on a hostile byte stream, read the way the driver reads
//! it: in random pieces, the payload of a partial FPDU passed around the buffer
//! (`Deframer::bypass`, direct placement) whenever a read ends inside one. Nothing may panic,
//! and the ULPDUs and the error come out exactly as from the stream pushed whole with no
//! bypass: bypassed octets are the same octets, CRC'd the same way (MPA-34, MPA-48, MPA-90).
//!
//! Input: octet 0 = flags (bit 0 CRC, bits 1-2 how many ULPDU octets stay buffered when
//! bypassing: 0, 1, 14 or 18, bit 3 never bypass), octet 1 = largest ULPDU accepted / 256
//! (0: 64768), octets 2..4 = seed of the read sizes, the rest = the stream.

use libfuzzer_sys::fuzz_target;
use softrdma_iwarp::framing::Deframer;
use softrdma_wire::mpa::LlpError;

type Item = Result<Vec<u8>, LlpError>;

fn deframer(crc: bool, max: usize) -> Deframer {
    let d = Deframer::new(false, crc);
    if max == 0 { d } else { d.with_max_ulpdu(max) }
}

fuzz_target!(|data: &[u8]| {
    let Some((head, stream)) = data.split_first_chunk::<4>() else {
        return;
    };
    let crc = head[0] & 1 != 0;
    let keep = [0usize, 1, 14, 18][usize::from(head[0] >> 1 & 3)];
    let bypassing = head[0] & 8 == 0;
    let max = usize::from(head[1]) * 256;
    let mut seed = u32::from(u16::from_le_bytes([head[2], head[3]])) | 1;

    // The reference: everything pushed at once, no bypass.
    let mut whole = deframer(crc, max);
    whole.push(stream);
    let want: Vec<Item> = std::iter::from_fn(|| whole.next_ulpdu().map(|r| r.map(<[u8]>::to_vec)))
        .collect();

    let mut d = deframer(crc, max);
    let mut got: Vec<Item> = Vec::new();
    // The bypassed FPDU being assembled: its kept headers, then what went around.
    let mut around: Vec<u8> = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let mut n = 1 + (seed as usize) % rest.len().min(9000);
        if let Some(left) = d.bypass_left().filter(|&l| l > 0) {
            let k = n.min(left);
            around.extend_from_slice(&rest[..k]);
            d.bypassed(&rest[..k]);
            rest = &rest[k..];
            continue;
        }
        if d.bypass_left() == Some(0) {
            // Only the PAD and CRC go in now.
            n = n.min(d.wanted());
            assert!(n > 0, "a bypass waits for its trailer");
            d.push(&rest[..n]);
            rest = &rest[n..];
            match d.next_bypassed() {
                None => {}
                Some(Ok((h, placed))) => {
                    let mut u = h.to_vec();
                    u.extend_from_slice(&around);
                    assert_eq!(u.len(), h.len() + placed);
                    around.clear();
                    got.push(Ok(u));
                }
                Some(Err(e)) => got.push(Err(e)),
            }
            continue;
        }
        d.push(&rest[..n]);
        rest = &rest[n..];
        while let Some(r) = d.next_ulpdu() {
            got.push(r.map(<[u8]>::to_vec));
        }
        if bypassing
            && let Some((_, buffered)) = d.head()
            && keep <= buffered.len()
        {
            around = buffered[keep..].to_vec();
            assert!(d.bypass(keep));
        }
    }
    // A stream that ends inside a bypassed FPDU delivers nothing more, as one pushed whole.
    assert_eq!(got, want);
});
