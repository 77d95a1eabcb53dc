//! Big-endian field access for checked views.
//!
//! Callers check lengths first (`new_checked`), so these index directly; the
//! checked views guarantee the offsets are in range.

#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}
#[inline]
pub(crate) fn be24(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([0, b[off], b[off + 1], b[off + 2]])
}
#[inline]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
#[inline]
pub(crate) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}
#[inline]
pub(crate) fn set_be16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn set_be24(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
#[inline]
pub(crate) fn set_be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn set_be64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}
