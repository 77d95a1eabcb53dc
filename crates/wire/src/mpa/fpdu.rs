//! One FPDU without Markers (RFC 5044 §4.1, Figure 2): ULPDU_Length, ULPDU, PAD and CRC.

use super::crc::{crc_from_wire, crc_to_wire, crc32c, crc32c_gather};
use super::too_large;
use crate::error::{Layer, Result, need};
use crate::field::{be16, set_be16};

/// RFC 5044 §4.1: the ULPDU_Length field is 2 octets.
pub const ULPDU_LENGTH_LEN: usize = 2;
/// RFC 5044 §4.1: the CRC field is 4 octets and always present (MPA-14).
pub const CRC_LEN: usize = 4;

/// PAD octets after a ULPDU of `ulpdu_len` octets: makes `2 + len + PAD` a
/// multiple of 4 (RFC 5044 §4.1, MPA-13).
#[inline]
pub const fn pad_len(ulpdu_len: usize) -> usize {
    // Wrapping is exact: 2^64 is a multiple of 4.
    (4 - ulpdu_len.wrapping_add(ULPDU_LENGTH_LEN) % 4) % 4
}

/// Octets of an FPDU carrying `ulpdu_len` octets, Markers not counted:
/// `2 + len + PAD + 4` (RFC 5044 §4.1). Saturates instead of overflowing.
#[inline]
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    ulpdu_len
        .saturating_add(ULPDU_LENGTH_LEN + CRC_LEN)
        .saturating_add(pad_len(ulpdu_len))
}

/// Checked view of one FPDU **without Markers** (RFC 5044 §4.1, Figure 2):
///
/// ```text
/// | ULPDU_Length (16, BE) | ULPDU (len) | PAD (0-3) | CRC (32, LSB first) |
/// ```
/// For streams with Markers use [`decode_fpdu`](super::decode_fpdu) /
/// [`encode_fpdu`](super::encode_fpdu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Fpdu { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// The buffer holds the whole FPDU that ULPDU_Length announces.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        need(Layer::Mpa, b, ULPDU_LENGTH_LEN)?;
        need(Layer::Mpa, b, self.total_len())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// ULPDU_Length: ULPDU octets only (MPA-12).
    pub fn ulpdu_length(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }

    /// PAD octets for this ULPDU_Length.
    pub fn pad_len(&self) -> usize {
        pad_len(usize::from(self.ulpdu_length()))
    }

    /// Octets of the FPDU: 2 + ULPDU_Length + PAD + 4.
    pub fn total_len(&self) -> usize {
        fpdu_len(usize::from(self.ulpdu_length()))
    }

    /// The ULPDU (a DDP segment).
    pub fn ulpdu(&self) -> &[u8] {
        let end = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        &self.buffer.as_ref()[ULPDU_LENGTH_LEN..end]
    }

    /// The PAD octets (sent as zero, only CRC input on receipt: MPA-13).
    pub fn pad(&self) -> &[u8] {
        let start = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        &self.buffer.as_ref()[start..start + self.pad_len()]
    }

    /// The CRC field as a value (wire octets read least-significant first).
    pub fn crc(&self) -> u32 {
        let at = self.total_len() - CRC_LEN;
        let b = self.buffer.as_ref();
        crc_from_wire([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// CRC32c over ULPDU_Length, ULPDU and PAD (MPA-33, no Markers here).
    pub fn compute_crc(&self) -> u32 {
        crc32c(&self.buffer.as_ref()[..self.total_len() - CRC_LEN])
    }

    /// The CRC field matches (MPA-34). Only meaningful when CRCs are on (MPA-14).
    pub fn verify_crc(&self) -> bool {
        self.crc() == self.compute_crc()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Fpdu<T> {
    pub fn set_ulpdu_length(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 0, v);
    }

    pub fn ulpdu_mut(&mut self) -> &mut [u8] {
        let end = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        &mut self.buffer.as_mut()[ULPDU_LENGTH_LEN..end]
    }

    pub fn pad_mut(&mut self) -> &mut [u8] {
        let start = ULPDU_LENGTH_LEN + usize::from(self.ulpdu_length());
        let end = start + self.pad_len();
        &mut self.buffer.as_mut()[start..end]
    }

    pub fn set_crc(&mut self, crc: u32) {
        let at = self.total_len() - CRC_LEN;
        self.buffer.as_mut()[at..at + CRC_LEN].copy_from_slice(&crc_to_wire(crc));
    }

    /// Compute and store the CRC (MPA-32).
    pub fn fill_crc(&mut self) {
        let crc = self.compute_crc();
        self.set_crc(crc);
    }
}

/// One FPDU without Markers (RFC 5044 §4.1), every octet kept: the ULPDU, the
/// PAD contents (`pad[..pad_len(ulpdu.len())]`; the rest is ignored and parsed
/// as zero) and the CRC field value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FpduRepr<'a> {
    pub ulpdu: &'a [u8],
    pub pad: [u8; 3],
    /// CRC field value (not checked by `parse`: see [`Fpdu::verify_crc`]).
    pub crc: u32,
}

impl<'a> FpduRepr<'a> {
    /// An FPDU with zero PAD and a correct CRC32c (MPA-32) or a zero CRC field.
    pub fn new(ulpdu: &'a [u8], with_crc: bool) -> Self {
        let mut r = FpduRepr {
            ulpdu,
            pad: [0; 3],
            crc: 0,
        };
        if with_crc {
            r.crc = r.compute_crc();
        }
        r
    }

    /// CRC32c over ULPDU_Length | ULPDU | PAD of this repr (saturating the
    /// length field for oversize ULPDUs, which `emit` refuses anyway).
    pub fn compute_crc(&self) -> u32 {
        let len = u16::try_from(self.ulpdu.len()).unwrap_or(u16::MAX);
        let p = pad_len(self.ulpdu.len());
        crc32c_gather(&[&len.to_be_bytes(), self.ulpdu, &self.pad[..p]])
    }

    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let f = Fpdu::new_checked(buf)?;
        let mut pad = [0u8; 3];
        let p = f.pad();
        pad[..p.len()].copy_from_slice(p);
        let crc = f.crc();
        let n = usize::from(f.ulpdu_length());
        Ok(FpduRepr {
            ulpdu: &buf[ULPDU_LENGTH_LEN..ULPDU_LENGTH_LEN + n],
            pad,
            crc,
        })
    }

    pub fn buffer_len(&self) -> usize {
        fpdu_len(self.ulpdu.len())
    }

    /// Errors: ULPDU over 65535 octets (`TooLarge`), short `buf` (`Truncated`).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let n = u16::try_from(self.ulpdu.len())
            .map_err(|_| too_large("ULPDU length", self.ulpdu.len(), usize::from(u16::MAX)))?;
        let len = self.buffer_len();
        need(Layer::Mpa, buf, len)?;
        let mut f = Fpdu::new_unchecked(&mut buf[..len]);
        f.set_ulpdu_length(n);
        f.ulpdu_mut().copy_from_slice(self.ulpdu);
        let p = f.pad_len();
        f.pad_mut().copy_from_slice(&self.pad[..p]);
        f.set_crc(self.crc);
        Ok(len)
    }
}

#[cfg(test)]
mod tests;
