//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (the limit), `ibv_query_srq`,
//! `ibv_destroy_srq`, and the context's `post_srq_recv` op.

use core::ffi::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma::{RecvWr, SrqAttr};

use crate::device::MAX_SGE;
use crate::errno;
use crate::live::Live;
use crate::pd::pd;
use crate::sys;

/// A shared receive queue as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrSrq {
    srq: sys::ibv_srq,
    pub inner: softrdma::Srq,
    /// QPs taking their receives from it.
    pub(crate) users: AtomicU32,
}

static SRQS: Live = Live::new();

/// Ours, if `p` is a live SRQ.
pub(crate) fn srq<'a>(p: *const sys::ibv_srq) -> Option<&'a SrSrq> {
    // SAFETY: a live SRQ is the first field of a boxed SrSrq.
    SRQS.contains(p).then(|| unsafe { &*p.cast::<SrSrq>() })
}

/// `ibv_create_srq`: the sizes granted are written back.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_srq(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    let fail = |e| {
        errno::set(e);
        ptr::null_mut()
    };
    let Some(p) = self::pd(pd) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attributes (checked non-NULL).
    let a = unsafe { &mut *attr };
    let limits = p.ctx.dev.inner.limits();
    if a.attr.max_wr == 0 || a.attr.max_wr > limits.max_srq_wr || a.attr.max_sge > MAX_SGE {
        return fail(libc::EINVAL);
    }
    let inner = match p.inner.create_srq(SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge.max(1),
    }) {
        Ok(s) => s,
        Err(softrdma::Error::ResourceLimit { .. }) => return fail(libc::ENOMEM),
        Err(_) => return fail(libc::EINVAL),
    };
    let got = inner.attr();
    a.attr.max_wr = got.max_wr;
    a.attr.max_sge = got.max_sge;
    if a.attr.srq_limit > 0 && inner.arm_limit(a.attr.srq_limit).is_err() {
        return fail(libc::EINVAL);
    }
    let b = Box::new(SrSrq {
        srq: sys::ibv_srq {
            context: p.ctx_ptr(),
            srq_context: a.srq_context,
            pd,
            handle: 0,
            ..Default::default()
        },
        inner,
        users: AtomicU32::new(0),
    });
    let s = Box::into_raw(b).cast::<sys::ibv_srq>();
    SRQS.insert(s);
    s
}

/// `ibv_modify_srq`: arms the limit (`IBV_SRQ_LIMIT`); the size is fixed (`IBV_SRQ_MAX_WR`
/// is refused, as by providers without SRQ resize).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_modify_srq(
    p: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let Some(s) = srq(p) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let mask = mask as u32;
    if mask & sys::IBV_SRQ_MAX_WR != 0 {
        return libc::EOPNOTSUPP;
    }
    if mask & sys::IBV_SRQ_LIMIT != 0 {
        // SAFETY: the program's attributes (checked non-NULL).
        let limit = unsafe { (*attr).srq_limit };
        if s.inner.arm_limit(limit).is_err() {
            return libc::EINVAL;
        }
    }
    0
}

/// `ibv_query_srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_srq(
    p: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    let Some(s) = srq(p) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let a = s.inner.attr();
    // SAFETY: the program passes room for the attributes.
    unsafe {
        attr.write(sys::ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: 0,
        })
    };
    0
}

/// `ibv_destroy_srq`: `EBUSY` while a QP takes from it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_destroy_srq(p: *mut sys::ibv_srq) -> c_int {
    let Some(s) = srq(p) else {
        return libc::EINVAL;
    };
    if s.users.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    SRQS.remove(p);
    // SAFETY: it was live: a boxed SrSrq, now ours alone.
    drop(unsafe { Box::from_raw(p.cast::<SrSrq>()) });
    0
}

/// The `post_srq_recv` op: the requests in order; at the first refused one, `*bad` names
/// it and its errno is returned.
pub(crate) unsafe extern "C" fn post_srq_recv(
    p: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: the op is reached through an SRQ of ours (the program's promise).
    let s = unsafe { &*p.cast::<SrSrq>() };
    let convert = |w: &sys::ibv_recv_wr| {
        crate::wr::sges(w.sg_list, w.num_sge)
            .map(|sg| RecvWr::new(w.wr_id, sg))
            .ok_or(libc::EINVAL)
    };
    let post = |l: &mut dyn Iterator<Item = RecvWr>| {
        for (i, w) in l.enumerate() {
            s.inner.post_recv(w).map_err(|e| (i, e))?;
        }
        Ok(())
    };
    // SAFETY: the program's list and out-pointer.
    unsafe { crate::wr::post_list(wr, bad, convert, post) }
}
