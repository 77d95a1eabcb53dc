//! The octets of `INLINE` send requests, copied when the request is posted (the caller may
//! reuse its memory at once) into buffers a QP keeps for the purpose, so a post costs no
//! allocation once the QP has as many as it has inline requests in flight.

use std::sync::{Arc, Mutex, PoisonError};

/// Inline buffers a QP has had back from requests that ended, for its next posts.
#[derive(Clone, Debug, Default)]
pub struct InlinePool {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    free: Mutex<Vec<Vec<u8>>>,
    /// Buffers kept at most (the send queue's depth: more are never in flight at once).
    keep: usize,
    /// Largest capacity a kept buffer may have (the QP's inline limit): one grown past it
    /// by a request that was then refused is let go.
    max_len: usize,
}

impl InlinePool {
    /// A pool that keeps up to `keep` buffers of up to `max_len` octets.
    pub fn new(keep: usize, max_len: usize) -> InlinePool {
        InlinePool {
            shared: Arc::new(Shared {
                free: Mutex::new(Vec::new()),
                keep,
                max_len,
            }),
        }
    }

    /// An empty buffer: one given back earlier, or a new one; given back when it drops.
    pub fn take(&self) -> InlineBuf {
        let bytes = self
            .shared
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        InlineBuf {
            bytes,
            home: Some(self.shared.clone()),
        }
    }

    /// Buffers waiting to be taken again.
    pub fn idle(&self) -> usize {
        self.shared
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The octets of one inline request; back to its pool, if it has one, when dropped.
#[derive(Default)]
pub struct InlineBuf {
    bytes: Vec<u8>,
    home: Option<Arc<Shared>>,
}

impl InlineBuf {
    /// `bytes`, belonging to no pool.
    pub fn new(bytes: Vec<u8>) -> InlineBuf {
        InlineBuf { bytes, home: None }
    }

    /// Appends `data`.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
    }

    /// Empties the buffer (its capacity stays).
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Its octets, to be written to.
    pub fn as_mut_vec(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }
}

impl std::ops::Deref for InlineBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for InlineBuf {
    fn drop(&mut self) {
        let Some(home) = self.home.take() else {
            return;
        };
        if self.bytes.capacity() > home.max_len {
            return;
        }
        let mut free = home.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < home.keep {
            let mut bytes = std::mem::take(&mut self.bytes);
            bytes.clear();
            free.push(bytes);
        }
    }
}

impl Clone for InlineBuf {
    fn clone(&self) -> InlineBuf {
        InlineBuf {
            bytes: self.bytes.clone(),
            home: self.home.clone(),
        }
    }
}

impl PartialEq for InlineBuf {
    fn eq(&self, other: &InlineBuf) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for InlineBuf {}

impl std::fmt::Debug for InlineBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("InlineBuf").field(&self.bytes.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_goes_back_to_its_pool_emptied_and_is_taken_again() {
        let pool = InlinePool::new(2, 64);
        let mut a = pool.take();
        a.extend_from_slice(&[1, 2, 3]);
        let cap = a.as_mut_vec().capacity();
        let at = a.as_ptr();
        drop(a);
        assert_eq!(pool.idle(), 1);
        let b = pool.take();
        assert!(b.is_empty(), "given back emptied");
        assert_eq!(
            (b.as_ptr(), b.bytes.capacity()),
            (at, cap),
            "the same storage"
        );
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn a_pool_keeps_no_more_than_it_was_told() {
        let pool = InlinePool::new(2, 64);
        let bufs: Vec<InlineBuf> = (0..5)
            .map(|i| {
                let mut b = pool.take();
                b.extend_from_slice(&[i]);
                b
            })
            .collect();
        drop(bufs);
        assert_eq!(pool.idle(), 2);
        // Clones belong to the pool too; one without a pool goes nowhere.
        let c = pool.take().clone();
        drop(InlineBuf::new(vec![9]));
        drop(c);
        assert_eq!(pool.idle(), 2);
    }

    #[test]
    fn a_buffer_grown_past_the_limit_is_not_kept() {
        let pool = InlinePool::new(2, 64);
        let mut big = pool.take();
        big.extend_from_slice(&[0; 65]);
        drop(big);
        assert_eq!(pool.idle(), 0);
    }
}
