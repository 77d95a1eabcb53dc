//! What the workspace's tests share. A dev-dependency of every crate, so it depends on none
//! of them: the floor under `softrdma-wire`.

#![forbid(unsafe_code)]

/// `len` deterministic octets, different for each `seed`: xorshift64, all eight octets of
/// each state. No period a transfer's length, offset or segmentation could line up with, so
/// a misplaced or repeated piece never compares equal by accident (as `i * k + seed` would
/// every 256 octets).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn a_pattern_is_its_seeds_and_a_prefix_of_a_longer_one() {
        let long = pattern(1000, 7);
        assert_eq!(long.len(), 1000);
        assert_eq!(pattern(1000, 7), long);
        for len in [0, 1, 7, 8, 9, 999] {
            assert_eq!(pattern(len, 7), long[..len]);
        }
        assert_ne!(pattern(64, 7), pattern(64, 8));
    }

    #[test]
    fn no_window_repeats_at_a_power_of_two() {
        let p = pattern(1 << 16, 1);
        for period in [256, 512, 4096] {
            let same = (0..p.len() - period)
                .filter(|&i| p[i] == p[i + period])
                .count();
            // About 1 in 256 by chance; `i * k + seed` would repeat every time.
            assert!(same < p.len() / 64, "{period}: {same}");
        }
    }
}
