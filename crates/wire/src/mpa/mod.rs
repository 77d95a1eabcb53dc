//! MPA — Marker PDU Aligned Framing for TCP (RFC 5044, updated by RFC 6581).
//!
//! Three layers of codec live here, none of which allocates or panics:
//!
//! * **Startup frames** (RFC 5044 §7.1.1): [`Frame`] view and [`FrameRepr`], the
//!   RFC 6581 IRD/ORD word [`Rev2Params`] at the front of rev-2 Private Data.
//! * **FPDUs** (RFC 5044 §4.1): [`Fpdu`] view and [`FpduRepr`] over one FPDU
//!   *without* Markers, plus [`pad_len`] / [`fpdu_len`].
//! * **The stream codec** (RFC 5044 §4.2-4.4): [`encoded_len`], [`encode_fpdu`]
//!   and [`decode_fpdu`] place, strip and check Markers for an FPDU at any
//!   position of the Full Operation stream and compute the CRC over exactly
//!   the octets §4.4 names (MPA-33).
//!
//! Plus the CRC32c helpers (§4.4), the MULPDU rule (§4.5, [`mulpdu`](fn@mulpdu)) and the
//! LLP Terminate error codes ([`LlpError`], RFC 5044 §8 / RFC 6581).
//!
//! **Interop.** Linux siw (6.12) does not zero its PAD: siw-crc-ib_write_bw
//! frame 18 ends its ULPDU with PAD `00 40`, covered by a valid CRC. Decoding
//! therefore ignores PAD except as CRC input (MPA-13) and [`FpduRepr`] keeps it
//! for byte-exact re-emission; our encoder always sends zeros.
//!
//! **Stream positions.** `stream_pos` is always the offset of an octet from
//! `SeqStart` (the TCP sequence number of the first octet of Full Operation in
//! that direction, where the first Marker sits), modulo 2^32. A Marker starts
//! at every `stream_pos` with `stream_pos % 512 == 0` (MPA-18); since 2^32 is a
//! multiple of 512, sequence-number wrap needs no special case (MPA-20). A
//! caller holding absolute sequence numbers passes `seq.wrapping_sub(seq_start)`.

use crate::error::{Error, Layer};

// The errors several of the files below raise.
const fn mpa_err(reason: &'static str) -> Error {
    Error::Malformed {
        layer: Layer::Mpa,
        reason,
    }
}

const fn too_large(what: &'static str, value: usize, limit: usize) -> Error {
    Error::TooLarge {
        layer: Layer::Mpa,
        what,
        value: value as u64,
        limit: limit as u64,
    }
}

mod crc;
mod fpdu;
mod frame;
mod llp_error;
mod marker;
mod mulpdu;
mod rev2;
mod stream;

#[cfg(test)]
mod test_util;

pub use crc::{crc_from_wire, crc_to_wire, crc32c, crc32c_append, crc32c_gather};
pub use fpdu::{CRC_LEN, Fpdu, FpduRepr, ULPDU_LENGTH_LEN, fpdu_len, pad_len};
pub use frame::{
    FRAME_HEADER_LEN, Frame, FrameKind, FrameRepr, KEY_LEN, MAX_PRIVATE_DATA, REASON_BAD_KEY,
    REPLY_KEY, REQUEST_KEY, RES_ENHANCED, REV_1, REV_2, REV_RDMAC,
};
pub use llp_error::LlpError;
pub use marker::{MARKER_INTERVAL, MARKER_LEN, MarkerRepr, encoded_len, marker_at};
pub use mulpdu::{MAX_ULPDU, MULPDU_MIN, mulpdu};
pub use rev2::Rev2Params;
pub use stream::{
    FpduInfo, REASON_MARKER_MISMATCH, REASON_UNALIGNED, decode_fpdu, decode_fpdu_with, encode_fpdu,
    peek_encoded_len,
};
