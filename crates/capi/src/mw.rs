//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`: inline in `verbs.h`,
//! reached through the context's ops) and the Bind requests C programs post.

use core::ffi::c_int;
use std::ptr;

use softrdma::{Key, MwBind, MwType};

use crate::live::Live;
use crate::{errno, sys};

/// A memory window as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrMw {
    pub(crate) mw: sys::ibv_mw,
    pub(crate) inner: softrdma::Mw,
}

static MWS: Live = Live::new();

/// Ours, if `m` is a live window.
///
/// # Safety
/// No other reference to the window is alive (the program does not free it meanwhile).
pub(crate) unsafe fn window<'a>(m: *mut sys::ibv_mw) -> Option<&'a mut SrMw> {
    // SAFETY: a live window is the first field of a boxed SrMw; the caller's promise.
    MWS.contains(m).then(|| unsafe { &mut *m.cast::<SrMw>() })
}

/// The window's key now, if `m` is a live window of ours.
pub(crate) fn mw_key(m: *const sys::ibv_mw) -> Option<Key> {
    // SAFETY: a live window is the first field of a boxed SrMw.
    MWS.contains(m)
        .then(|| unsafe { &*m.cast::<SrMw>() }.inner.rkey())
}

/// What a Bind request binds: `mw` (ours), the key it is to have, and the range of a
/// region of ours with remote rights only (`EINVAL` otherwise, as rdma-core's providers).
pub(crate) fn bind_of(
    mw: *const sys::ibv_mw,
    new_rkey: u32,
    info: &sys::ibv_mw_bind_info,
) -> Result<MwBind, c_int> {
    let mw = mw_key(mw).ok_or(libc::EINVAL)?;
    let mr = crate::pd::mr_key(info.mr).ok_or(libc::EINVAL)?;
    // Remote rights only (zero-based windows are not offered).
    let remote =
        sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_ATOMIC;
    if info.mw_access_flags & !remote != 0 {
        return Err(libc::EINVAL);
    }
    Ok(MwBind {
        mw,
        new_rkey: Key(new_rkey),
        mr,
        addr: info.addr,
        len: info.length,
        access: crate::pd::rights(info.mw_access_flags),
    })
}

/// The `alloc_mw` op (`ibv_alloc_mw`): type 1, or type 2 (IBA's 2B: bound to one QP).
pub(crate) unsafe extern "C" fn alloc_mw(
    pd: *mut sys::ibv_pd,
    ty: sys::ibv_mw_type,
) -> *mut sys::ibv_mw {
    let (Some(p), Some(t)) = (
        crate::pd::pd(pd),
        match ty {
            sys::IBV_MW_TYPE_1 => Some(MwType::Type1),
            sys::IBV_MW_TYPE_2 => Some(MwType::Type2B),
            _ => None,
        },
    ) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    let inner = match p.inner.alloc_mw(t) {
        Ok(m) => m,
        Err(_) => {
            errno::set(libc::ENOMEM);
            return ptr::null_mut();
        }
    };
    let b = Box::new(SrMw {
        mw: sys::ibv_mw {
            context: p.ctx_ptr(),
            pd,
            rkey: inner.rkey().0,
            handle: inner.rkey().0 >> 8,
            type_: ty,
        },
        inner,
    });
    let m = Box::into_raw(b).cast::<sys::ibv_mw>();
    MWS.insert(m);
    m
}

/// The `dealloc_mw` op (`ibv_dealloc_mw`): access through the window ends now.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    if !MWS.remove(mw) {
        return libc::EINVAL;
    }
    // SAFETY: it was live: a boxed SrMw, now ours alone.
    drop(unsafe { Box::from_raw(mw.cast::<SrMw>()) });
    0
}
