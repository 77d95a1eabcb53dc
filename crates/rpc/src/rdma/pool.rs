//! Chunk memory: a fresh registration (new keys) per use over memory that is reused.
//!
//! RFC 8166 §8.1.2 wants a handle per call that the peer cannot guess and that is gone once
//! the call is over; nothing asks for fresh memory. So the vectors come from
//! [`Buffers`](crate::buffers::Buffers) and only the registration is per use.

use std::ops::Deref;
use std::sync::Arc;

use softrdma::{Access, Buffer, Mr, MrAttr, MrFlags, Pd};

use crate::buffers::{Buffers, Bulk};

/// A registered region over pooled memory; deregistered on drop, its memory back to the
/// pool (if it came from one and nothing else holds it).
pub(crate) struct Lease {
    mr: Option<Mr>,
    pool: Option<Arc<Buffers>>,
}

impl Lease {
    /// Registers `len` octets of pooled memory with `access`; the region covers exactly
    /// `len`, so the rest of the vector is out of the peer's reach.
    pub(crate) fn new(
        pool: &Arc<Buffers>,
        pd: &Pd,
        len: usize,
        access: Access,
        flags: MrFlags,
    ) -> Result<Lease, softrdma::Error> {
        let len = len.max(1);
        let mr = pd.reg_mr_with(
            Buffer::adopt(pool.filled(len)),
            MrAttr {
                range: 0..len,
                iova: 0,
                access,
                flags,
            },
        )?;
        Ok(Lease::over(mr, Some(pool)))
    }

    /// `mr`, whose memory goes to `pool` (when given) once the last region over it is gone.
    pub(crate) fn over(mr: Mr, pool: Option<&Arc<Buffers>>) -> Lease {
        Lease {
            mr: Some(mr),
            pool: pool.cloned(),
        }
    }

    /// The first `n` octets, the region gone first (its keys dead before the data is looked
    /// at, RPCRDMA-55); `None` if the region is shorter.
    pub(crate) fn into_bulk(mut self, n: usize) -> Option<Bulk> {
        let mr = self.mr.take()?;
        if n > mr.len() {
            return None;
        }
        let buf = mr.buffer().clone();
        drop(mr);
        Some(match (Buffer::into_vec(buf), self.pool.take()) {
            (Ok(v), Some(pool)) => Bulk::pooled(v, n, pool),
            (Ok(mut v), None) => {
                v.truncate(n);
                Bulk::from(v)
            }
            // Still held by the network: a copy.
            (Err(buf), _) => Bulk::from(buf.read()[..n].to_vec()),
        })
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
                p.recycle(buf);
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
        let pool = Buffers::new(4, 1 << 20);
        let a = Lease::new(&pool, &pd, 5000, Access::REMOTE_READ, MrFlags::empty()).unwrap();
        assert_eq!(
            a.len(),
            5000,
            "the region covers what was asked, not the class"
        );
        let (key, mem) = (a.rkey(), a.buffer().read().as_ptr());
        drop(a);
        assert_eq!(pool.kept(), 1);
        let b = Lease::new(
            &pool,
            &pd,
            3000,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            MrFlags::empty(),
        )
        .unwrap();
        assert_eq!(b.buffer().read().as_ptr(), mem, "the memory is reused");
        assert_ne!(b.rkey(), key, "under a new key");
        assert_eq!(pool.kept(), 0);
        drop(b);
        assert_eq!(pool.kept(), 1);
    }

    #[test]
    fn shared_memory_goes_back_with_its_last_region() {
        let ctx = Device::tcp().open().unwrap();
        let pd = ctx.alloc_pd();
        let pool = Buffers::new(4, 1 << 20);
        let buf = Buffer::adopt(pool.filled(8192));
        let reg = |r: std::ops::Range<usize>| {
            let mr = pd
                .reg_mr_with(
                    buf.clone(),
                    MrAttr {
                        range: r,
                        iova: 0,
                        access: Access::empty(),
                        flags: MrFlags::empty(),
                    },
                )
                .unwrap();
            Lease::over(mr, Some(&pool))
        };
        let (a, b) = (reg(0..100), reg(200..300));
        drop(buf);
        drop(a);
        assert_eq!(pool.kept(), 0, "still registered by the other");
        drop(b);
        assert_eq!(pool.kept(), 1);
    }

    #[test]
    fn bulk_is_the_written_prefix_without_a_copy() {
        let ctx = Device::tcp().open().unwrap();
        let pd = ctx.alloc_pd();
        let pool = Buffers::new(4, 1 << 20);
        let l = Lease::new(&pool, &pd, 6000, Access::LOCAL_WRITE, MrFlags::empty()).unwrap();
        l.copy_in(0, &[9; 6000]).unwrap();
        let at = l.buffer().read().as_ptr();
        assert!(
            Lease::new(&pool, &pd, 10, Access::LOCAL_WRITE, MrFlags::empty())
                .unwrap()
                .into_bulk(11)
                .is_none(),
            "more than the region holds"
        );
        let bulk = l.into_bulk(4000).unwrap();
        assert_eq!(bulk.as_ptr(), at);
        assert_eq!(&bulk[..], &[9; 4000][..]);
        let kept = pool.kept();
        drop(bulk);
        assert_eq!(pool.kept(), kept + 1);
    }
}
