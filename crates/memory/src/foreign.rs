//! Memory a program owns and registered as it is (a C program's `ibv_reg_mr`): the one
//! place this crate reaches memory through a pointer. As with a NIC's DMA, the program
//! promises the pages stay mapped until the region is deregistered, and knows that the
//! network reads and writes them meanwhile; softrdma touches them only under the
//! [`Buffer`](crate::Buffer)'s lock, through a [`Target`](crate::Target) whose grant is checked
//! (so never once deregistration has returned, RDMAP-120).
#![allow(unsafe_code)]

use std::ptr::NonNull;

/// `len` octets at `ptr`, owned by the program.
pub(crate) struct Foreign {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the octets are plain memory any thread may read or write; this crate takes them
// only under the buffer's lock.
unsafe impl Send for Foreign {}
// SAFETY: as above: shared access hands out `&[u8]` only under the buffer's read lock.
unsafe impl Sync for Foreign {}

impl Foreign {
    /// # Safety
    /// `ptr` is valid for reads (and, if the region may be written, writes) of `len` octets
    /// for as long as the value lives.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Foreign {
        Foreign { ptr, len }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: valid for `len` octets while `self` lives (the constructor's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` (the buffer's write lock) makes it the only slice
        // this crate holds.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}
