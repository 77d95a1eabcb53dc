//! Chunk memory: a fresh registration (new keys) per use over memory that is reused.
//!
//! RFC 8166 §8.1.2 wants a handle per call that the peer cannot guess and that is gone once
//! the call is over; nothing asks for fresh memory. Allocating a megabyte per call costs
//! more than moving it: the allocator returns freed blocks to the kernel and the next call
//! page-faults them back in, one page at a time. So the buffers stay, and only the
//! registration is per use.

use std::ops::Deref;
use std::sync::Arc;

use parking_lot::Mutex;
use softrdma::{Access, Buffer, Mr, MrAttr, MrFlags, Pd};

/// Smallest buffer kept (one page).
const MIN_CLASS: usize = 4096;

/// Page-aligned buffers waiting for their next registration, with a ceiling on what is kept.
pub(crate) struct Pool {
    free: Mutex<Vec<Arc<Buffer>>>,
    /// Buffers kept at most.
    max_kept: usize,
    /// Octets kept at most.
    max_bytes: usize,
}

impl Pool {
    pub(crate) fn new(max_kept: usize, max_bytes: usize) -> Arc<Pool> {
        Arc::new(Pool {
            free: Mutex::new(Vec::new()),
            max_kept,
            max_bytes,
        })
    }

    /// Registers `len` octets (a buffer reused when one is big enough) with `access`; the
    /// region covers exactly `len`, so the rest of the buffer is out of the peer's reach.
    pub(crate) fn lease(
        self: &Arc<Self>,
        pd: &Pd,
        len: usize,
        access: Access,
        flags: MrFlags,
    ) -> Result<Lease, softrdma::Error> {
        let len = len.max(1);
        let buf = {
            let mut free = self.free.lock();
            // The smallest free buffer that holds `len`.
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= len)
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        }
        .unwrap_or_else(|| Buffer::new(len.next_power_of_two().max(MIN_CLASS)));
        let mr = pd.reg_mr_with(
            buf,
            MrAttr {
                range: 0..len,
                iova: 0,
                access,
                flags,
            },
        )?;
        Ok(Lease {
            mr: Some(mr),
            pool: Some(self.clone()),
        })
    }

    fn give_back(&self, buf: Arc<Buffer>) {
        // Only memory nobody else can still reach (the engine drops its references with
        // the registration).
        if Arc::strong_count(&buf) != 1 {
            return;
        }
        let mut free = self.free.lock();
        let kept: usize = free.iter().map(|b| b.len()).sum();
        if free.len() < self.max_kept && kept + buf.len() <= self.max_bytes {
            free.push(buf);
        }
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.free.lock().len()
    }
}

/// A registered region over pooled memory; deregistered on drop, its memory back to the
/// pool (if it came from one).
pub(crate) struct Lease {
    mr: Option<Mr>,
    pool: Option<Arc<Pool>>,
}

impl Lease {
    /// A region over memory that is not the pool's (freed with the region).
    pub(crate) fn own(mr: Mr) -> Lease {
        Lease {
            mr: Some(mr),
            pool: None,
        }
    }
}

impl Deref for Lease {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        self.mr
            .as_ref()
            .expect("a lease holds its region until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            let buf = mr.buffer().clone();
            // Deregistered first: every key of the region is dead before the memory is
            // handed to anyone else (RPCRDMA-55).
            drop(mr);
            if let Some(p) = &self.pool {
                p.give_back(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma::Device;

    #[test]
    fn memory_is_reused_under_new_keys() {
        let ctx = Device::tcp().open().unwrap();
        let pd = ctx.alloc_pd();
        let pool = Pool::new(4, 1 << 20);
        let a = pool
            .lease(&pd, 5000, Access::REMOTE_READ, MrFlags::empty())
            .unwrap();
        assert_eq!(
            a.len(),
            5000,
            "the region covers what was asked, not the class"
        );
        let (key, mem) = (a.rkey(), Arc::as_ptr(a.buffer()));
        drop(a);
        assert_eq!(pool.kept(), 1);
        let b = pool
            .lease(
                &pd,
                3000,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                MrFlags::empty(),
            )
            .unwrap();
        assert_eq!(Arc::as_ptr(b.buffer()), mem, "the buffer is reused");
        assert_ne!(b.rkey(), key, "under a new key");
        assert_eq!(pool.kept(), 0);
        drop(b);
    }

    #[test]
    fn what_is_kept_has_a_ceiling() {
        let ctx = Device::tcp().open().unwrap();
        let pd = ctx.alloc_pd();
        let pool = Pool::new(2, 64 << 10);
        let leases: Vec<_> = (0..3)
            .map(|_| {
                pool.lease(&pd, 20 << 10, Access::LOCAL_WRITE, MrFlags::empty())
                    .unwrap()
            })
            .collect();
        drop(leases);
        // Three 32 KiB buffers: the octet ceiling keeps two.
        assert_eq!(pool.kept(), 2);
        let big = pool
            .lease(&pd, 1 << 20, Access::LOCAL_WRITE, MrFlags::empty())
            .unwrap();
        drop(big);
        assert_eq!(pool.kept(), 2, "a buffer over the ceiling is freed");
    }
}
