//! CRC32c over an FPDU (RFC 5044 §4.4; the algorithm of RFC 3720 §12.1 / RFC 7143) and
//! the octet order of the CRC field on the wire.

/// CRC32c (Castagnoli, reflected 0x82F63B78, init and xorout 0xFFFFFFFF) of
/// `data`, as iSCSI digests compute it (RFC 5044 §4.4, MPA-32).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC32c of octets following those `crc` was computed over (start from 0).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The register after the earlier octets is `crc` before its final inversion.
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// CRC32c over the concatenation of `parts` (same value as [`crc32c()`] of the
/// joined octets).
#[inline]
pub fn crc32c_gather(parts: &[&[u8]]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for p in parts {
        d.update(p);
    }
    d.finalize() as u32
}

/// The CRC field as it goes on the wire: least-significant octet first
/// (RFC 5044 §4.4 hex dumps, Fig. 5: 0x83992352 -> `52 23 99 83`; mpa.md §4.2).
#[inline]
pub const fn crc_to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC value carried by a wire CRC field (inverse of [`crc_to_wire`]).
#[inline]
pub const fn crc_from_wire(field: [u8; 4]) -> u32 {
    u32::from_le_bytes(field)
}

#[cfg(test)]
mod tests;
