//! Page-aligned registered memory behind a reader-writer lock.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::MemError;

/// Alignment of every [`Buffer`]'s first byte.
pub const PAGE_SIZE: usize = 4096;

/// Buffers of at least this many bytes are mapped from the kernel, not taken from the heap.
pub const MAP_MIN: usize = 128 * 1024;

/// Where a [`Buffer`]'s bytes live.
enum Backing {
    /// An over-allocated vector, never resized (so its block and the alignment never move).
    Heap(Vec<u8>),
    /// An anonymous private mapping (page-aligned and zeroed by the kernel). A large buffer
    /// goes back to the kernel when dropped: on the heap, glibc raises its mmap threshold
    /// after the first large free and keeps later blocks of that size in its arenas, so a
    /// server allocating a 1 MiB buffer per client kept ~12 MB it no longer used (host probe,
    /// `perf --server` through the soak's workload: 19.9 MB after 8 cycles, 8.5 MB with the
    /// threshold fixed).
    Mapped(memmap2::MmapMut),
    /// A program's own memory ([`Buffer::foreign`]).
    Foreign(crate::foreign::Foreign),
}

/// Page-aligned, zeroed memory of a fixed length, without `unsafe`: the backing store of a
/// [`Buffer`], and on its own where no lock is needed (a raw-socket benchmark's buffers).
pub struct PageBuf {
    raw: Backing,
    start: usize,
    len: usize,
}

impl PageBuf {
    /// `len` zeroed octets starting on a page boundary; from the kernel if `len` ≥ [`MAP_MIN`].
    pub fn zeroed(len: usize) -> PageBuf {
        if len >= MAP_MIN
            && let Ok(map) = memmap2::MmapOptions::new().len(len).map_anon()
        {
            return PageBuf {
                raw: Backing::Mapped(map),
                start: 0,
                len,
            };
        }
        // Pointer-to-address casts are safe; only the address is used, to find the first
        // page boundary inside the allocation.
        let raw = vec![0u8; len + PAGE_SIZE - 1];
        let addr = raw.as_ptr() as usize;
        let start = (PAGE_SIZE - addr % PAGE_SIZE) % PAGE_SIZE;
        PageBuf {
            raw: Backing::Heap(raw),
            start,
            len,
        }
    }

    /// `raw` itself, neither copied nor aligned (an adopted or already aligned vector).
    fn heap(raw: Vec<u8>) -> PageBuf {
        let len = raw.len();
        PageBuf {
            raw: Backing::Heap(raw),
            start: 0,
            len,
        }
    }

    /// The octets.
    pub fn as_slice(&self) -> &[u8] {
        let all: &[u8] = match &self.raw {
            Backing::Heap(v) => v,
            Backing::Mapped(m) => m,
            Backing::Foreign(f) => f.as_slice(),
        };
        &all[self.start..self.start + self.len]
    }

    /// The octets, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let all: &mut [u8] = match &mut self.raw {
            Backing::Heap(v) => v,
            Backing::Mapped(m) => m,
            Backing::Foreign(f) => f.as_mut_slice(),
        };
        &mut all[self.start..self.start + self.len]
    }
}

/// Registered memory: page-aligned (4096), zero-initialised, fixed length; `Send + Sync`.
/// (A buffer [adopted](Buffer::adopt) from a vector keeps the vector's contents and address.)
///
/// The network places data under the write lock ([`Target`](crate::Target) methods); the user
/// accesses it through [`read`](Buffer::read) / [`write`](Buffer::write) guards or the copy and
/// atomic helpers, which lock for the duration of the call. As with any `RwLock`, a thread must
/// not hold two guards of the same buffer at once (a queued writer makes the second wait).
pub struct Buffer {
    mem: RwLock<PageBuf>,
    len: usize,
}

impl Buffer {
    /// A zeroed buffer of `len` bytes whose first byte is 4096-aligned.
    pub fn new(len: usize) -> Arc<Buffer> {
        Arc::new(Buffer {
            mem: RwLock::new(PageBuf::zeroed(len)),
            len,
        })
    }

    /// A buffer holding `data` (copied once into page-aligned memory unless the vector's
    /// block already starts on a page boundary).
    pub fn from_vec(data: Vec<u8>) -> Arc<Buffer> {
        let len = data.len();
        let storage = if len > 0 && (data.as_ptr() as usize).is_multiple_of(PAGE_SIZE) {
            PageBuf::heap(data)
        } else {
            let mut s = PageBuf::zeroed(len);
            s.as_mut_slice().copy_from_slice(&data);
            s
        };
        Arc::new(Buffer {
            mem: RwLock::new(storage),
            len,
        })
    }

    /// `data` itself as a buffer, neither copied nor aligned: for memory that is already
    /// filled (a reply's results) or that the caller wants back ([`Buffer::into_vec`]).
    pub fn adopt(data: Vec<u8>) -> Arc<Buffer> {
        let len = data.len();
        Arc::new(Buffer {
            mem: RwLock::new(PageBuf::heap(data)),
            len,
        })
    }

    /// `len` octets at `ptr` that the caller owns, registered in place (a C program's
    /// `ibv_reg_mr`): the network reads and writes them as a NIC's DMA would, under this
    /// buffer's lock. Not page-aligned unless `ptr` is.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` octets (reads only, if nothing will be
    /// allowed to write: no `LOCAL_WRITE`, `REMOTE_WRITE` or `REMOTE_ATOMIC` access) until
    /// the buffer is dropped, or until every region over it is deregistered, whichever is
    /// first (deregistration waits for placements in progress and no access starts after
    /// it; the region's key table may hold the buffer longer, without touching it).
    #[allow(unsafe_code)]
    pub unsafe fn foreign(ptr: std::ptr::NonNull<u8>, len: usize) -> Arc<Buffer> {
        // SAFETY: the caller's contract is `Foreign::new`'s.
        let f = unsafe { crate::foreign::Foreign::new(ptr, len) };
        Arc::new(Buffer {
            mem: RwLock::new(PageBuf {
                raw: Backing::Foreign(f),
                start: 0,
                len,
            }),
            len,
        })
    }

    /// The contents as a vector, without a copy when the buffer was adopted; the buffer back
    /// if it is still shared (registered, or in use by the network).
    pub fn into_vec(this: Arc<Buffer>) -> Result<Vec<u8>, Arc<Buffer>> {
        let b = Arc::try_unwrap(this)?;
        let s = b.mem.into_inner();
        match s.raw {
            Backing::Heap(mut raw) if s.start == 0 => {
                raw.truncate(s.len);
                Ok(raw)
            }
            _ => Ok(s.as_slice().to_vec()),
        }
    }

    #[cfg(test)]
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.mem.read().raw, Backing::Mapped(_))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shared access; blocks while the network places data.
    pub fn read(&self) -> BufferReadGuard<'_> {
        BufferReadGuard(self.mem.read())
    }

    /// Exclusive access; blocks placement while held.
    pub fn write(&self) -> BufferWriteGuard<'_> {
        BufferWriteGuard(self.mem.write())
    }

    /// Copies `dst.len()` bytes starting at `off` out of the buffer.
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let r = range(off, dst.len(), self.len)?;
        dst.copy_from_slice(&self.read()[r]);
        Ok(())
    }

    /// Copies `src` into the buffer at `off`.
    pub fn copy_in(&self, off: usize, src: &[u8]) -> Result<(), MemError> {
        let r = range(off, src.len(), self.len)?;
        self.write()[r].copy_from_slice(src);
        Ok(())
    }

    /// Atomically adds `add` (wrapping) to the native-order `u64` at `off` (8-aligned) and
    /// returns the previous value.
    pub fn fetch_add(&self, off: usize, add: u64) -> Result<u64, MemError> {
        let r = atomic_range(off, self.len)?;
        Ok(fetch_add_in(&mut self.write()[r], add))
    }

    /// Atomically replaces the native-order `u64` at `off` (8-aligned) with `swap` if it equals
    /// `compare`; returns the previous value either way.
    pub fn compare_swap(&self, off: usize, compare: u64, swap: u64) -> Result<u64, MemError> {
        let r = atomic_range(off, self.len)?;
        Ok(compare_swap_in(&mut self.write()[r], compare, swap))
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer").field("len", &self.len).finish()
    }
}

/// Shared guard over a whole [`Buffer`].
pub struct BufferReadGuard<'a>(RwLockReadGuard<'a, PageBuf>);

impl Deref for BufferReadGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Exclusive guard over a whole [`Buffer`].
pub struct BufferWriteGuard<'a>(RwLockWriteGuard<'a, PageBuf>);

impl Deref for BufferWriteGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl DerefMut for BufferWriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

/// `off..off + len` if it lies inside `0..cap`.
pub(crate) fn range(
    off: usize,
    len: usize,
    cap: usize,
) -> Result<std::ops::Range<usize>, MemError> {
    match off.checked_add(len) {
        Some(end) if end <= cap => Ok(off..end),
        _ => Err(MemError::OutOfRange),
    }
}

fn atomic_range(off: usize, cap: usize) -> Result<std::ops::Range<usize>, MemError> {
    if !off.is_multiple_of(8) {
        return Err(MemError::Misaligned);
    }
    range(off, 8, cap)
}

/// `word` is exactly 8 bytes; the caller holds the buffer's write lock.
pub(crate) fn fetch_add_in(word: &mut [u8], add: u64) -> u64 {
    let old = u64::from_ne_bytes(word.try_into().expect("8-byte word"));
    word.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
    old
}

/// `word` is exactly 8 bytes; the caller holds the buffer's write lock.
pub(crate) fn compare_swap_in(word: &mut [u8], compare: u64, swap: u64) -> u64 {
    let old = u64::from_ne_bytes(word.try_into().expect("8-byte word"));
    if old == compare {
        word.copy_from_slice(&swap.to_ne_bytes());
    }
    old
}
