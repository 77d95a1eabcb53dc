//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`): on RoCE a destination is its GID,
//! an IP address, where its RoCEv2 port receives.

use core::ffi::c_int;
use std::ptr;

use crate::device::PORT;
use crate::errno;
use crate::live::Live;
use crate::pd::pd;
use crate::sys;

/// An address handle as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrAh {
    ah: sys::ibv_ah,
    pub inner: softrdma::Ah,
}

static AHS: Live = Live::new();

/// `ibv_create_ah`: RoCE needs the GRH (`is_global`); there is no LID routing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_ah(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    let Some(p) = self::pd(pd) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    if attr.is_null() {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the program's attributes (checked non-NULL).
    let a = unsafe { &*attr };
    if a.is_global == 0 || (a.port_num != PORT && a.port_num != 0) {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: a GID is 16 octets whichever way the union is read.
    let dgid = unsafe { a.grh.dgid.raw };
    let inner = match p.inner.create_ah(softrdma::gid_to_ip(&dgid)) {
        Ok(ah) => ah,
        Err(softrdma::Error::Unsupported(_)) => {
            errno::set(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        Err(_) => {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
    };
    let b = Box::new(SrAh {
        ah: sys::ibv_ah {
            context: p.ctx_ptr(),
            pd,
            handle: inner.id(),
        },
        inner,
    });
    let h = Box::into_raw(b).cast::<sys::ibv_ah>();
    AHS.insert(h);
    h
}

/// `ibv_destroy_ah`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
    if !AHS.remove(ah) {
        return libc::EINVAL;
    }
    // SAFETY: it was live: a boxed SrAh, now ours alone.
    drop(unsafe { Box::from_raw(ah.cast::<SrAh>()) });
    0
}

/// softrdma's handle behind `ah` (posting: the program's promise that it is one of ours,
/// as rdma-core's providers take it).
///
/// # Safety
/// `ah` is a live address handle of this library.
pub(crate) unsafe fn ah_id(ah: *mut sys::ibv_ah) -> u32 {
    // SAFETY: the caller's promise: the first field of a boxed SrAh.
    unsafe { (*ah.cast::<SrAh>()).inner.id() }
}
