//! Protection domains and memory regions over the program's own memory (`ibv_alloc_pd`,
//! `ibv_reg_mr` and its relatives, `ibv_dereg_mr`).

use core::ffi::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use softrdma::{Access, Buffer, MrAttr, MrFlags};

use crate::context::{SrContext, context};
use crate::errno;
use crate::live::Live;
use crate::sys;

/// A protection domain as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrPd {
    pd: sys::ibv_pd,
    pub inner: softrdma::Pd,
    pub ctx: &'static SrContext,
}

static PDS: Live = Live::new();

/// Ours, if `p` is a live PD.
pub(crate) fn pd<'a>(p: *const sys::ibv_pd) -> Option<&'a SrPd> {
    // SAFETY: a live PD is the first field of a boxed SrPd.
    PDS.contains(p).then(|| unsafe { &*p.cast::<SrPd>() })
}

impl SrPd {
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        ptr::from_ref(&self.pd).cast_mut()
    }
}

/// `ibv_alloc_pd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_alloc_pd(ctx: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    let Some(c) = context(ctx) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    let inner = c.inner.alloc_pd();
    let b = Box::new(SrPd {
        pd: sys::ibv_pd {
            context: ctx,
            handle: inner.id().0,
        },
        inner,
        ctx: c,
    });
    let p = Box::into_raw(b).cast::<sys::ibv_pd>();
    PDS.insert(p);
    p
}

/// `ibv_dealloc_pd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    if !PDS.remove(pd) {
        return libc::EINVAL;
    }
    // SAFETY: it was live: a boxed SrPd, now ours alone.
    drop(unsafe { Box::from_raw(pd.cast::<SrPd>()) });
    0
}

/// A memory region as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrMr {
    mr: sys::ibv_mr,
    inner: softrdma::Mr,
    buf: Arc<Buffer>,
}

static MRS: Live = Live::new();

/// The key of `m`, if it is a live region of ours.
pub(crate) fn mr_key(m: *const sys::ibv_mr) -> Option<softrdma::Key> {
    // SAFETY: a live region is the first field of a boxed SrMr.
    MRS.contains(m)
        .then(|| unsafe { &*m.cast::<SrMr>() }.inner.lkey())
}

/// `ibv_access_flags` this library knows; anything else is refused, as rdma-core's
/// providers refuse what they do not support.
const KNOWN_ACCESS: c_int = (sys::IBV_ACCESS_LOCAL_WRITE
    | sys::IBV_ACCESS_REMOTE_WRITE
    | sys::IBV_ACCESS_REMOTE_READ
    | sys::IBV_ACCESS_REMOTE_ATOMIC
    | sys::IBV_ACCESS_MW_BIND
    | sys::IBV_ACCESS_RELAXED_ORDERING) as c_int;

/// The rights of `access`, or `EINVAL` (IBA 10.6.3.1: remote writes and atomics need local
/// write).
pub(crate) fn access_of(access: c_int) -> Result<Access, c_int> {
    // The optional bits (IBV_ACCESS_OPTIONAL_RANGE: 20 and up) may be ignored by definition.
    let access = access & (sys::IBV_ACCESS_OPTIONAL_FIRST as c_int - 1);
    if access & !KNOWN_ACCESS != 0 {
        return Err(libc::EINVAL);
    }
    let has = |f: u32| access & f as c_int != 0;
    if (has(sys::IBV_ACCESS_REMOTE_WRITE) || has(sys::IBV_ACCESS_REMOTE_ATOMIC))
        && !has(sys::IBV_ACCESS_LOCAL_WRITE)
    {
        return Err(libc::EINVAL);
    }
    Ok(rights(access as u32))
}

/// The rights `ibv_access_flags` bits name (unknown bits ignored: callers check them).
pub(crate) fn rights(bits: u32) -> Access {
    let mut a = Access::empty();
    for (f, r) in [
        (sys::IBV_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE),
        (sys::IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (sys::IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (sys::IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
        (sys::IBV_ACCESS_MW_BIND, Access::MW_BIND),
    ] {
        if bits & f != 0 {
            a |= r;
        }
    }
    a
}

fn reg(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut sys::ibv_mr, c_int> {
    let p = self::pd(pd).ok_or(libc::EINVAL)?;
    let access = access_of(access)?;
    let ptr = match NonNull::new(addr.cast::<u8>()) {
        Some(p) => p,
        None if len == 0 => NonNull::dangling(),
        None => return Err(libc::EINVAL),
    };
    if (addr as usize).checked_add(len).is_none() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program registers `len` octets at `addr` it owns and keeps them mapped
    // until ibv_dereg_mr returns (the verbs' contract, as for a NIC's DMA); sr_ibv_dereg_mr
    // deregisters and waits out any placement before the buffer is dropped.
    let buf = unsafe { Buffer::foreign(ptr, len) };
    let inner = p
        .inner
        .reg_mr_with(
            buf.clone(),
            MrAttr {
                range: 0..len,
                iova,
                access,
                flags: MrFlags::empty(),
            },
        )
        .map_err(|e| match e {
            softrdma::Error::ResourceLimit { .. } => libc::ENOMEM,
            _ => libc::EINVAL,
        })?;
    let b = Box::new(SrMr {
        mr: sys::ibv_mr {
            context: p.ctx_ptr(),
            pd,
            addr,
            length: len,
            handle: inner.lkey().0,
            lkey: inner.lkey().0,
            rkey: inner.rkey().0,
        },
        inner,
        buf,
    });
    let m = Box::into_raw(b).cast::<sys::ibv_mr>();
    MRS.insert(m);
    Ok(m)
}

impl SrPd {
    pub(crate) fn ctx_ptr(&self) -> *mut sys::ibv_context {
        self.pd.context
    }
}

fn reg_or_null(r: Result<*mut sys::ibv_mr, c_int>) -> *mut sys::ibv_mr {
    r.unwrap_or_else(|e| {
        errno::set(e);
        ptr::null_mut()
    })
}

/// `ibv_reg_mr`: the region's address is the memory's own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut sys::ibv_mr {
    reg_or_null(reg(pd, addr, len, addr as u64, access))
}

/// `ibv_reg_mr_iova`: the region addressed from `iova`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_reg_mr_iova(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    reg_or_null(reg(pd, addr, len, iova, access))
}

/// `ibv_reg_mr_iova2` (what `ibv_reg_mr` becomes when its access is not a constant).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut sys::ibv_mr {
    reg_or_null(reg(pd, addr, len, iova, access as c_int))
}

/// `ibv_dereg_mr`: once it returns, nothing of softrdma touches the memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    if !MRS.remove(mr) {
        return libc::EINVAL;
    }
    // SAFETY: it was live: a boxed SrMr, now ours alone.
    let m = unsafe { Box::from_raw(mr.cast::<SrMr>()) };
    let SrMr { inner, buf, .. } = *m;
    // Deregistration revokes every grant and waits for placements in progress; a send that
    // validated its octets before it and is writing them to its socket holds the buffer's
    // read lock, which the write lock waits for.
    drop(inner);
    drop(buf.write());
    0
}
