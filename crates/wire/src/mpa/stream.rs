//! The stream codec (RFC 5044 §4.1-§4.4, §5, §6): one FPDU encoded or decoded at any
//! position of the Full Operation stream, Markers spliced in or checked and stripped.

use super::crc::{crc_from_wire, crc_to_wire, crc32c};
use super::fpdu::{CRC_LEN, ULPDU_LENGTH_LEN, pad_len};
use super::marker::{Layout, MARKER_LEN, MarkerRepr, Run, encoded_len, marker_at};
use super::mulpdu::MAX_ULPDU;
use super::{mpa_err, too_large};
use crate::error::{Layer, Result, need};
use crate::field::be16;

/// `Error::Malformed` reason when a Marker's FPDUPTR disagrees with the FPDU
/// start found by length chaining: RFC 5044 §8 error 3 (MPA-87).
pub const REASON_MARKER_MISMATCH: &str =
    "Marker FPDUPTR disagrees with the FPDU start (RFC 5044 §8 error 3)";
/// `Error::Malformed` reason for an FPDU start that is not a multiple of 4
/// octets from SeqStart while Markers are on (RFC 5044 §4.3 keeps FPDUs 4-aligned).
pub const REASON_UNALIGNED: &str =
    "FPDU start not 4-octet aligned to SeqStart with Markers on (RFC 5044 §4.3)";

fn check_alignment(stream_pos: u32, markers: bool) -> Result<()> {
    if markers && !stream_pos.is_multiple_of(4) {
        Err(mpa_err(REASON_UNALIGNED))
    } else {
        Ok(())
    }
}

/// Copy body octets `[from, from + dst.len())` of the logical body
/// `len_field | parts... | pad zeros` into `dst`.
fn gather_body(len_field: &[u8; 2], parts: &[&[u8]], pad: usize, from: usize, dst: &mut [u8]) {
    const ZEROS: [u8; 3] = [0; 3];
    let to = from + dst.len();
    let mut seg_start = 0usize;
    let segs = core::iter::once(&len_field[..])
        .chain(parts.iter().copied())
        .chain(core::iter::once(&ZEROS[..pad.min(3)]));
    for seg in segs {
        let seg_end = seg_start + seg.len();
        let lo = from.max(seg_start);
        let hi = to.min(seg_end);
        if lo < hi {
            dst[lo - from..hi - from].copy_from_slice(&seg[lo - seg_start..hi - seg_start]);
        }
        if seg_end >= to {
            break;
        }
        seg_start = seg_end;
    }
}

/// Encode one FPDU into `out` (RFC 5044 §4.1-4.4, MPA-11): ULPDU_Length, the
/// ULPDU given as a gather list (`parts`, e.g. DDP/RDMAP header then payload
/// pieces; one ULPDU per FPDU, MPA-03), zero PAD (MPA-13) and the CRC field,
/// with Markers spliced in at every `(pos % 512) == 0` when `markers` is on
/// (MPA-18/19/21/23/24; a Marker at `stream_pos` is this FPDU's, FPDUPTR 0).
/// The CRC field holds CRC32c over every octet before it (MPA-32/33) when
/// `crc`, else zero (MPA-14). Returns the octets written, [`encoded_len`].
///
/// Errors: ULPDU over 64768 octets (`TooLarge`, MPA-07); `stream_pos` not a
/// multiple of 4 with Markers on (`Malformed`, [`REASON_UNALIGNED`]);
/// `out` shorter than [`encoded_len`] (`Truncated`).
pub fn encode_fpdu(
    parts: &[&[u8]],
    stream_pos: u32,
    markers: bool,
    crc: bool,
    out: &mut [u8],
) -> Result<usize> {
    let ulpdu_len = parts.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
    if ulpdu_len > MAX_ULPDU {
        return Err(too_large("ULPDU length", ulpdu_len, MAX_ULPDU));
    }
    check_alignment(stream_pos, markers)?;
    let total = encoded_len(ulpdu_len, stream_pos, markers);
    need(Layer::Mpa, out, total)?;
    // <= 64768 checked above.
    let len_field = (ulpdu_len as u16).to_be_bytes();
    let pad = pad_len(ulpdu_len);
    let mut layout = Layout::new(ulpdu_len, stream_pos, markers);
    for run in &mut layout {
        match run {
            Run::Marker { at, fpduptr } => {
                // RFC 5044 §4.2: RESERVED = 0 (MPA-15), FPDUPTR low bits 0 (MPA-16).
                // fpduptr < 65536 because the ULPDU is <= 64768 octets.
                let m = MarkerRepr {
                    reserved: 0,
                    fpduptr: fpduptr as u16,
                };
                m.emit(&mut out[at..at + MARKER_LEN])?;
            }
            Run::Body { at, body, len } => {
                gather_body(&len_field, parts, pad, body, &mut out[at..at + len]);
            }
        }
    }
    let crc_at = layout.at;
    let value = if crc { crc32c(&out[..crc_at]) } else { 0 };
    out[crc_at..crc_at + CRC_LEN].copy_from_slice(&crc_to_wire(value));
    Ok(crc_at + CRC_LEN)
}

/// What [`decode_fpdu`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FpduInfo {
    /// Stream octets the FPDU occupied, Markers included.
    pub consumed: usize,
    /// ULPDU_Length (the octets copied out, MPA-12/26).
    pub ulpdu_len: u16,
    /// PAD octets (MPA-13).
    pub pad_len: u8,
    /// Markers stripped (MPA-26).
    pub markers: u8,
    /// The CRC field as a value (wire octets read least-significant first).
    pub crc_field: u32,
    /// CRC32c over the FPDU as RFC 5044 §4.4 covers it (MPA-33).
    pub crc_computed: u32,
}

impl FpduInfo {
    /// CRC field equals the computed CRC (MPA-34). Consult only when CRCs are
    /// in use on this connection (MPA-14, MPA-58); a mismatch is error 2.
    pub const fn crc_ok(&self) -> bool {
        self.crc_field == self.crc_computed
    }
}

/// Octets the FPDU at the front of `input` occupies on the wire, once its
/// ULPDU_Length is visible (`Ok(None)` before). Same checks as [`decode_fpdu`]
/// on what it has read: alignment, a leading Marker, ULPDU_Length <= 64768.
pub fn peek_encoded_len(input: &[u8], stream_pos: u32, markers: bool) -> Result<Option<usize>> {
    Ok(peek_header(input, stream_pos, markers)?.map(|l| encoded_len(l, stream_pos, markers)))
}

/// ULPDU_Length of the FPDU at the front of `input`, once visible.
fn peek_header(input: &[u8], stream_pos: u32, markers: bool) -> Result<Option<usize>> {
    check_alignment(stream_pos, markers)?;
    let lead = if markers && marker_at(stream_pos) {
        MARKER_LEN
    } else {
        0
    };
    if input.len() < lead + ULPDU_LENGTH_LEN {
        return Ok(None);
    }
    if lead != 0 {
        // A Marker ahead of ULPDU_Length sits between FPDUs: FPDUPTR 0 (MPA-21).
        let m = MarkerRepr::parse(input)?;
        if m.effective_fpduptr() != 0 {
            return Err(mpa_err(REASON_MARKER_MISMATCH));
        }
    }
    let l = usize::from(be16(input, lead));
    if l > MAX_ULPDU {
        return Err(too_large("ULPDU_Length", l, MAX_ULPDU));
    }
    Ok(Some(l))
}

/// Decode the FPDU at the front of `input`, the contiguous unconsumed receive
/// stream whose first octet sits at `stream_pos` (RFC 5044 §4, §5.2, §6).
///
/// Returns `Ok(None)` until the whole FPDU, CRC included, is present (MPA-48);
/// then copies the ULPDU, Markers stripped, to the front of `ulpdu_out`
/// (MPA-25/26) and reports it. The FPDU start comes from length chaining
/// (MPA-45/47); every Marker is cross-checked against it, low FPDUPTR bits
/// ignored (MPA-16), RESERVED ignored (MPA-15). The CRC is computed, not
/// judged: check [`FpduInfo::crc_ok`] when CRCs are on (MPA-34, MPA-14).
///
/// Errors: ULPDU_Length over 64768 (MPA-07) or over `ulpdu_out.len()`
/// (`TooLarge`, raised as soon as the length field is visible); a Marker
/// pointing elsewhere (`Malformed`, [`REASON_MARKER_MISMATCH`] = error 3,
/// MPA-87; reported even when the CRC would also fail); a misaligned start
/// with Markers on (`Malformed`, [`REASON_UNALIGNED`]).
pub fn decode_fpdu(
    input: &[u8],
    stream_pos: u32,
    markers: bool,
    ulpdu_out: &mut [u8],
) -> Result<Option<FpduInfo>> {
    decode_fpdu_with(input, stream_pos, markers, ulpdu_out, true)
}

/// [`decode_fpdu`] for a receiver that negotiated CRCs off (MPA-14, MPA-31):
/// with `compute_crc` false the CRC32c is not computed (it is 5% of a bulk
/// receive) and `crc_computed` repeats the field, so `crc_ok()` holds.
pub fn decode_fpdu_with(
    input: &[u8],
    stream_pos: u32,
    markers: bool,
    ulpdu_out: &mut [u8],
    compute_crc: bool,
) -> Result<Option<FpduInfo>> {
    let Some(l) = peek_header(input, stream_pos, markers)? else {
        return Ok(None);
    };
    if l > ulpdu_out.len() {
        return Err(too_large(
            "ULPDU_Length (receive buffer)",
            l,
            ulpdu_out.len(),
        ));
    }
    let total = encoded_len(l, stream_pos, markers);
    if input.len() < total {
        return Ok(None);
    }
    let ulpdu_end = ULPDU_LENGTH_LEN + l;
    let mut layout = Layout::new(l, stream_pos, markers);
    for run in &mut layout {
        match run {
            Run::Marker { at, fpduptr } => {
                let m = MarkerRepr::parse(&input[at..at + MARKER_LEN])?;
                if usize::from(m.effective_fpduptr()) != fpduptr {
                    return Err(mpa_err(REASON_MARKER_MISMATCH));
                }
            }
            Run::Body { at, body, len } => {
                // Intersect with the ULPDU part [2, 2 + l) of the body.
                let lo = body.max(ULPDU_LENGTH_LEN);
                let hi = (body + len).min(ulpdu_end);
                if lo < hi {
                    let src = &input[at + (lo - body)..at + (hi - body)];
                    ulpdu_out[lo - ULPDU_LENGTH_LEN..hi - ULPDU_LENGTH_LEN].copy_from_slice(src);
                }
            }
        }
    }
    let crc_at = layout.at;
    let field = &input[crc_at..crc_at + CRC_LEN];
    let crc_field = crc_from_wire([field[0], field[1], field[2], field[3]]);
    Ok(Some(FpduInfo {
        consumed: crc_at + CRC_LEN,
        // l <= 64768, pad <= 3, markers <= 129 (see MULPDU bound).
        ulpdu_len: l as u16,
        pad_len: pad_len(l) as u8,
        markers: layout.count as u8,
        crc_field,
        crc_computed: if compute_crc {
            crc32c(&input[..crc_at])
        } else {
            crc_field
        },
    }))
}

#[cfg(test)]
mod tests;
