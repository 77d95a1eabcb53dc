//! Markers (RFC 5044 §4.2 format, §4.3 placement): where they fall in the wire image of
//! an FPDU at a given stream position, and the length they give it.

use super::fpdu::{CRC_LEN, ULPDU_LENGTH_LEN, pad_len};
use crate::error::{Layer, Result, need};
use crate::field::{be16, set_be16};

/// RFC 5044 §4.2: a Marker is 4 octets (RESERVED 16 | FPDUPTR 16).
pub const MARKER_LEN: usize = 4;
/// RFC 5044 §4.3: one Marker every 512 octets of TCP sequence space.
pub const MARKER_INTERVAL: u32 = 512;

/// A Marker (RFC 5044 §4.2, Figure 3): `| RESERVED (16) | FPDUPTR (16) |`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MarkerRepr {
    /// Sent as 0, ignored on receipt except as CRC input (MPA-15).
    pub reserved: u16,
    /// Octets back from this Marker to the ULPDU_Length of its FPDU; 0 when the
    /// Marker sits between FPDUs (MPA-19, MPA-21). Low 2 bits kept raw (MPA-16).
    pub fpduptr: u16,
}

impl MarkerRepr {
    pub fn parse(buf: &[u8]) -> Result<Self> {
        need(Layer::Mpa, buf, MARKER_LEN)?;
        Ok(MarkerRepr {
            reserved: be16(buf, 0),
            fpduptr: be16(buf, 2),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        MARKER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need(Layer::Mpa, buf, MARKER_LEN)?;
        set_be16(buf, 0, self.reserved);
        set_be16(buf, 2, self.fpduptr);
        Ok(MARKER_LEN)
    }

    /// FPDUPTR as the receiver uses it: low 2 bits treated as 0 (MPA-16).
    pub const fn effective_fpduptr(&self) -> u16 {
        self.fpduptr & !3
    }
}

/// Is a Marker due at `stream_pos` (MPA-18)? Wrap-safe (MPA-20).
#[inline]
pub const fn marker_at(stream_pos: u32) -> bool {
    stream_pos.is_multiple_of(MARKER_INTERVAL)
}

/// Octets on the wire of an FPDU carrying `ulpdu_len` octets whose first octet
/// (its ULPDU_Length, or the Marker that precedes it) sits at `stream_pos`:
/// `2 + len + PAD + 4 + 4 * Markers` (RFC 5044 §4.1, §4.3).
///
/// The FPDU owns every Marker from its first octet up to its CRC field: a
/// Marker at `stream_pos` itself (FPDUPTR 0, MPA-21), those inside the
/// ULPDU/PAD and one directly after the PAD (MPA-33). A Marker right after the
/// CRC belongs to the next FPDU. With Markers on, conforming FPDUs start at
/// multiples of 4 ([`encode_fpdu`](super::encode_fpdu) and
/// [`decode_fpdu`](super::decode_fpdu) refuse others); for
/// other starts the value assumes no Marker falls inside the CRC field.
/// Saturates rather than overflowing for absurd `ulpdu_len`.
pub const fn encoded_len(ulpdu_len: usize, stream_pos: u32, markers: bool) -> usize {
    let body = ulpdu_len
        .saturating_add(ULPDU_LENGTH_LEN)
        .saturating_add(pad_len(ulpdu_len));
    let n = if markers {
        marker_count(body, stream_pos)
    } else {
        0
    };
    body.saturating_add(CRC_LEN)
        .saturating_add(n.saturating_mul(MARKER_LEN))
}

/// Markers inside an FPDU whose ULPDU_Length|ULPDU|PAD is `body` octets.
/// Marker k sits at wire offset `m0 + 512k`, after `m0 + 508k` body octets; it
/// belongs to the FPDU while that is `<= body` (the last one may directly
/// follow the PAD).
const fn marker_count(body: usize, stream_pos: u32) -> usize {
    let m0 = ((MARKER_INTERVAL - stream_pos % MARKER_INTERVAL) % MARKER_INTERVAL) as usize;
    if m0 > body {
        0
    } else {
        (body - m0) / (MARKER_INTERVAL as usize - MARKER_LEN) + 1
    }
}

/// One piece of an FPDU's wire image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    /// A Marker at wire offset `at` whose FPDUPTR must be `fpduptr`.
    Marker { at: usize, fpduptr: usize },
    /// Body octets `[body, body + len)` (ULPDU_Length | ULPDU | PAD) at `at`.
    Body { at: usize, body: usize, len: usize },
}

// pub(super) here and on Run: encode_fpdu and decode_fpdu (stream.rs) walk it.
/// Walks an FPDU's wire image: body octets split at 512-octet stream
/// boundaries, a Marker at each boundary before the CRC field (RFC 5044 §4.3).
pub(super) struct Layout {
    pos: u32,
    markers: bool,
    body_len: usize,
    /// Current wire offset from the FPDU's first octet.
    pub(super) at: usize,
    /// Body octets laid out so far.
    body: usize,
    /// Wire offset of the ULPDU_Length field once reached.
    hdr: Option<usize>,
    /// Markers emitted.
    pub(super) count: usize,
}

impl Layout {
    pub(super) fn new(ulpdu_len: usize, stream_pos: u32, markers: bool) -> Self {
        Layout {
            pos: stream_pos,
            markers,
            body_len: ULPDU_LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len),
            at: 0,
            body: 0,
            hdr: None,
            count: 0,
        }
    }

    fn here(&self) -> u32 {
        // `at` < 2^17 for ULPDUs <= 64768; truncation is modular and harmless.
        self.pos.wrapping_add(self.at as u32)
    }
}

impl Iterator for Layout {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        if self.markers && marker_at(self.here()) {
            // Before the next body octet, or directly before the CRC (MPA-33).
            // FPDUPTR: distance back to ULPDU_Length, 0 ahead of it (MPA-19/21).
            let fpduptr = self.hdr.map_or(0, |h| self.at - h);
            let run = Run::Marker {
                at: self.at,
                fpduptr,
            };
            self.at += MARKER_LEN;
            self.count += 1;
            return Some(run);
        }
        if self.body >= self.body_len {
            return None;
        }
        if self.hdr.is_none() {
            self.hdr = Some(self.at);
        }
        let left = self.body_len - self.body;
        let len = if self.markers {
            let room = (MARKER_INTERVAL - self.here() % MARKER_INTERVAL) as usize;
            left.min(room)
        } else {
            left
        };
        let run = Run::Body {
            at: self.at,
            body: self.body,
            len,
        };
        self.at += len;
        self.body += len;
        Some(run)
    }
}

#[cfg(test)]
mod tests;
