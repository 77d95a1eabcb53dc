//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`: inline in `verbs.h`,
//! reached through the context's ops) and the Bind requests C programs post.

use core::ffi::c_int;
use std::ptr;

use softrdma::{Key, MwBind, MwType, SendWr};

use crate::live::Live;
use crate::{errno, sys};

/// A memory window as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrMw {
    mw: sys::ibv_mw,
    inner: softrdma::Mw,
}

static MWS: Live = Live::new();

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
    let remote = sys::IBV_ACCESS_REMOTE_WRITE
        | sys::IBV_ACCESS_REMOTE_READ
        | sys::IBV_ACCESS_REMOTE_ATOMIC
        | sys::IBV_ACCESS_ZERO_BASED;
    if info.mw_access_flags & !remote != 0 || info.mw_access_flags & sys::IBV_ACCESS_ZERO_BASED != 0
    {
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

/// The `bind_mw` op (`ibv_bind_mw`, type 1 windows): posts a Bind request to `qp` with the
/// window's next key (`ibv_inc_rkey`), which `mw->rkey` holds once posted; the bind
/// completes on the QP's send CQ (`IBV_WC_BIND_MW`) if signaled.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    bind: *mut sys::ibv_mw_bind,
) -> c_int {
    let (Some(q), false) = (crate::qp::qp(qp), bind.is_null()) else {
        return libc::EINVAL;
    };
    if !MWS.contains(mw) {
        return libc::EINVAL;
    }
    // SAFETY: a live window of ours; the program's bind request (checked non-NULL).
    let (m, b) = unsafe { (&mut *mw.cast::<SrMw>(), &*bind) };
    // Type 2 windows are bound by the program's own Bind requests (`IBV_WR_BIND_MW`).
    if m.mw.type_ != sys::IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    let old = m.inner.rkey().0;
    let new = (old & !0xff) | (old.wrapping_add(1) & 0xff);
    let spec = match bind_of(mw, new, &b.bind_info) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let wr = SendWr::bind_mw(b.wr_id, spec).with_flags(crate::wr::send_flags(b.send_flags));
    match q.inner.post_send(wr) {
        Ok(()) => {
            m.mw.rkey = new;
            0
        }
        Err(e) => crate::wr::post_errno(&e),
    }
}
