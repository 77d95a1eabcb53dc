//! Large message memory kept for reuse, and the bulk data handed out in it.
//!
//! Allocating a megabyte per call costs more than moving it: the allocator hands freed
//! blocks back to the kernel and the next call faults them in again, a page at a time (and
//! zeroes them). So the vectors behind chunks, results and Write-chunk targets stay with the
//! transport that used them, up to a ceiling, and go out again for the next call.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::Mutex;
use softrdma::Buffer;

/// Smallest vector worth keeping: the allocator serves smaller ones from its own lists.
pub(crate) const MIN_KEPT: usize = 4096;

/// Vectors waiting for their next use, with a ceiling on how many and how many octets.
pub struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
    max_kept: usize,
    max_bytes: usize,
}

impl fmt::Debug for Buffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffers")
            .field("kept", &self.free.lock().len())
            .field("max_kept", &self.max_kept)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl Buffers {
    /// Keeps at most `max_kept` vectors of at most `max_bytes` octets in all.
    pub fn new(max_kept: usize, max_bytes: usize) -> Arc<Buffers> {
        Arc::new(Buffers {
            free: Mutex::new(Vec::new()),
            max_kept,
            max_bytes,
        })
    }

    /// An empty vector with room for at least `capacity` octets: results built in it leave
    /// without a fresh allocation per call.
    pub fn vec(&self, capacity: usize) -> Vec<u8> {
        self.reuse(capacity)
            .unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// A kept vector with room for `capacity`, emptied, if there is one (nothing is
    /// allocated): for memory a peer's claim alone would otherwise reserve.
    pub(crate) fn reuse(&self, capacity: usize) -> Option<Vec<u8>> {
        let mut v = self.take(capacity)?;
        v.clear();
        Some(v)
    }

    /// A vector at least `len` octets long whose contents are whatever its last use left
    /// (zero when new): memory the network is about to overwrite.
    pub(crate) fn filled(&self, len: usize) -> Vec<u8> {
        match self.take(len) {
            Some(mut v) => {
                if v.len() < len {
                    v.resize(len, 0);
                }
                v
            }
            None => vec![0; len.next_power_of_two().max(MIN_KEPT)],
        }
    }

    /// The smallest kept vector with room for `capacity`; of equals, the one given back
    /// last (its memory most likely still in the cache).
    fn take(&self, capacity: usize) -> Option<Vec<u8>> {
        let mut free = self.free.lock();
        let i = free
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, v)| v.capacity() >= capacity)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)?;
        Some(free.remove(i))
    }

    /// Keeps `v` for a later call, if it is worth it and under the ceiling.
    pub fn give(&self, v: Vec<u8>) {
        if v.capacity() < MIN_KEPT {
            return;
        }
        let mut free = self.free.lock();
        if free.len() < self.max_kept && octets(&free) + v.capacity() <= self.max_bytes {
            free.push(v);
        }
    }

    /// Keeps the memory under `buf` once nothing else holds it (its regions deregistered,
    /// the network done with it).
    pub(crate) fn recycle(&self, buf: Arc<Buffer>) {
        if let Ok(v) = Buffer::into_vec(buf) {
            self.give(v);
        }
    }

    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().len()
    }

    /// Octets held for reuse now (the vectors' capacities).
    pub fn kept_octets(&self) -> usize {
        octets(&self.free.lock())
    }
}

/// What `free` holds: its vectors' capacities.
fn octets(free: &[Vec<u8>]) -> usize {
    free.iter().map(Vec::capacity).sum()
}

/// Data that came apart from its message (a Write chunk's, RFC 8166 §3.4.6), placed where
/// the network put it: no copy on the way to the caller. Its memory goes back to the
/// transport when dropped; [`Bulk::into_vec`] keeps it instead.
#[derive(Default)]
pub struct Bulk {
    v: Vec<u8>,
    len: usize,
    home: Option<Arc<Buffers>>,
}

impl Bulk {
    /// The first `len` octets of `v`, which go back to `home` when dropped.
    pub(crate) fn pooled(v: Vec<u8>, len: usize, home: Arc<Buffers>) -> Bulk {
        debug_assert!(len <= v.len());
        Bulk {
            len: len.min(v.len()),
            v,
            home: Some(home),
        }
    }

    /// The data as a vector of its own (not given back).
    pub fn into_vec(mut self) -> Vec<u8> {
        self.home = None;
        let mut v = std::mem::take(&mut self.v);
        v.truncate(self.len);
        v
    }
}

impl From<Vec<u8>> for Bulk {
    fn from(v: Vec<u8>) -> Bulk {
        Bulk {
            len: v.len(),
            v,
            home: None,
        }
    }
}

impl Deref for Bulk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[..self.len]
    }
}

impl AsRef<[u8]> for Bulk {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Clone for Bulk {
    fn clone(&self) -> Bulk {
        Bulk::from(self.to_vec())
    }
}

impl fmt::Debug for Bulk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bulk({} octets)", self.len)
    }
}

impl PartialEq for Bulk {
    fn eq(&self, other: &Bulk) -> bool {
        **self == **other
    }
}

impl Eq for Bulk {}

impl PartialEq<[u8]> for Bulk {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for Bulk {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give(std::mem::take(&mut self.v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_and_go_out_again() {
        let b = Buffers::new(4, 1 << 20);
        let v = b.filled(5000);
        assert!(v.len() >= 5000);
        let p = v.as_ptr();
        b.give(v);
        assert_eq!(b.kept(), 1);
        let w = b.vec(3000);
        assert_eq!(w.as_ptr(), p, "the same memory");
        assert!(w.is_empty() && w.capacity() >= 3000);
        b.give(w);
        // Too small to be kept.
        b.give(Vec::with_capacity(100));
        assert_eq!(b.kept(), 1);
    }

    #[test]
    fn what_is_kept_has_a_ceiling() {
        let b = Buffers::new(2, 64 << 10);
        for _ in 0..3 {
            b.give(vec![0; 20 << 10]);
        }
        assert_eq!(b.kept(), 2, "two of three under the count ceiling");
        let b = Buffers::new(8, 64 << 10);
        for _ in 0..4 {
            b.give(vec![0; 20 << 10]);
        }
        assert_eq!(b.kept(), 3, "three of four under the octet ceiling");
        assert_eq!(b.kept_octets(), 3 * (20 << 10));
        b.give(vec![0; 1 << 20]);
        assert_eq!(b.kept(), 3, "a vector over the ceiling is freed");
    }

    #[test]
    fn the_smallest_that_fits_is_taken() {
        let b = Buffers::new(8, 4 << 20);
        b.give(vec![1; 1 << 20]);
        b.give(vec![2; 8 << 10]);
        assert_eq!(b.filled(6000)[0], 2);
        assert_eq!(b.filled(10_000)[0], 1);
        assert_eq!(
            b.filled(10_000).len(),
            16 << 10,
            "a new one, of the next class"
        );
    }

    #[test]
    fn bulk_shows_its_length_and_goes_home() {
        let b = Buffers::new(4, 1 << 20);
        let bulk = Bulk::pooled(vec![7; 8192], 100, b.clone());
        assert_eq!(bulk.len(), 100);
        assert_eq!(bulk, vec![7u8; 100]);
        assert_eq!(bulk.clone(), bulk);
        drop(bulk);
        assert_eq!(b.kept(), 1);
        let kept = Bulk::pooled(b.filled(8192), 10, b.clone());
        assert_eq!(b.kept(), 0);
        assert_eq!(kept.into_vec().len(), 10);
        assert_eq!(b.kept(), 0, "into_vec keeps the memory");
    }
}
