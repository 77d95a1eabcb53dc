//! Work requests from C (`ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`) as softrdma's, and the
//! errno a refused one gives.

use core::ffi::c_int;

use std::ptr::NonNull;
use std::sync::Arc;

use softrdma::{
    Access, Buffer, Key, MrAttr, MrFlags, PostError, SendFlags, SendWr, Sge, UdDest, WrOpcode,
};

use crate::device::MAX_SGE;
use crate::sys;

/// The `n` entries at `list`, or `None` for a count out of range.
pub(crate) fn sges(list: *const sys::ibv_sge, n: c_int) -> Option<impl Iterator<Item = Sge>> {
    if n < 0 || (n > 0 && list.is_null()) || n as u32 > MAX_SGE {
        return None;
    }
    Some((0..n as usize).map(move |i| {
        // SAFETY: the program's array of `n` entries.
        let s = unsafe { *list.add(i) };
        Sge::new(Key(s.lkey), s.addr, s.length)
    }))
}

/// `IBV_SEND_SIGNALED`, `_SOLICITED` and `_FENCE` as softrdma's flags (inline is the
/// caller's: it copies the octets).
pub(crate) fn send_flags(bits: u32) -> SendFlags {
    let mut flags = SendFlags::empty();
    for (bit, f) in [
        (sys::IBV_SEND_SIGNALED, SendFlags::SIGNALED),
        (sys::IBV_SEND_SOLICITED, SendFlags::SOLICITED),
        (sys::IBV_SEND_FENCE, SendFlags::FENCE),
    ] {
        if bits & bit != 0 {
            flags |= f;
        }
    }
    flags
}

/// A C send request as softrdma's, or `None` for one it does not carry. `ud`: the QP is
/// UD, and the request names its destination.
pub(crate) fn send_wr(w: &sys::ibv_send_wr, ud: bool) -> Option<SendWr> {
    let opcode = opcode(w)?;
    let mut flags = send_flags(w.send_flags);
    if w.send_flags & sys::IBV_SEND_INLINE != 0 {
        flags |= SendFlags::INLINE;
    }
    let ud = match ud {
        false => None,
        true => {
            // SAFETY: a UD QP's requests carry the `ud` member.
            let u = unsafe { w.wr.ud };
            if u.ah.is_null() {
                return None;
            }
            Some(UdDest {
                // SAFETY: the program names an address handle of ours.
                ah: unsafe { crate::ah::ah_id(u.ah) },
                remote_qpn: u.remote_qpn,
                remote_qkey: u.remote_qkey,
            })
        }
    };
    Some(SendWr {
        wr_id: w.wr_id,
        opcode,
        sg_list: sges(w.sg_list, w.num_sge)?.collect(),
        flags,
        ud,
    })
}

/// What a C send request does.
fn opcode(w: &sys::ibv_send_wr) -> Option<WrOpcode> {
    // SAFETY: which member of the union is meant follows from the opcode, read below.
    let (rdma, atomic) = unsafe { (w.wr.rdma, w.wr.atomic) };
    // SAFETY: as above (the immediate data and the invalidated key share a union).
    let (imm, inv) = unsafe {
        (
            u32::from_be(w.__bindgen_anon_1.imm_data),
            w.__bindgen_anon_1.invalidate_rkey,
        )
    };
    Some(match w.opcode {
        sys::IBV_WR_SEND => WrOpcode::Send,
        sys::IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm { imm },
        sys::IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInvalidate {
            invalidate_rkey: Key(inv),
        },
        sys::IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: Key(rdma.rkey),
        },
        sys::IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: Key(rdma.rkey),
            imm,
        },
        sys::IBV_WR_RDMA_READ => WrOpcode::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: Key(rdma.rkey),
        },
        sys::IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpSwap {
            remote_addr: atomic.remote_addr,
            rkey: Key(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        sys::IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: Key(atomic.rkey),
            add: atomic.compare_add,
        },
        _ => return None,
    })
}

/// The octets of an `IBV_SEND_INLINE` request, gathered from its entries' addresses (no
/// region covers them: their keys are not looked at), or `None` for a count out of range.
pub(crate) fn inline_octets(w: &sys::ibv_send_wr) -> Option<Vec<u8>> {
    if w.num_sge < 0 || (w.num_sge > 0 && w.sg_list.is_null()) || w.num_sge as u32 > MAX_SGE {
        return None;
    }
    let mut v = Vec::new();
    for i in 0..w.num_sge as usize {
        // SAFETY: the program's array of `num_sge` entries, each naming its own octets.
        let s = unsafe { *w.sg_list.add(i) };
        if s.length > 0 {
            // SAFETY: `length` octets at `addr`, the program's to read (the verbs' contract).
            let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
            v.extend_from_slice(src);
        }
    }
    Some(v)
}

/// An inline request's octets in memory a region covers for as long as the post takes:
/// softrdma copies an `INLINE` request's octets when it is posted, so the region goes once
/// the post has returned. Fields drop in order: the region, its buffer, the octets.
pub(crate) struct InlineCopy {
    _mr: softrdma::Mr,
    _buf: Arc<Buffer>,
    _data: Vec<u8>,
}

/// Points `wr` at `data` through a region of `pd` made for it; the returned copy holds
/// them until the post is done.
pub(crate) fn inline_copy(
    pd: &softrdma::Pd,
    wr: &mut SendWr,
    mut data: Vec<u8>,
) -> Result<Option<InlineCopy>, c_int> {
    wr.flags |= SendFlags::INLINE;
    wr.sg_list.clear();
    if data.is_empty() {
        return Ok(None);
    }
    let len = data.len();
    let ptr = NonNull::new(data.as_mut_ptr()).ok_or(libc::EINVAL)?;
    // SAFETY: the vector's octets stay where they are (it is not touched again) until the
    // copy drops, after its region (field order).
    let buf = unsafe { Buffer::foreign(ptr, len) };
    let iova = ptr.as_ptr() as u64;
    let mr = pd
        .reg_mr_with(
            buf.clone(),
            MrAttr {
                range: 0..len,
                iova,
                access: Access::empty(),
                flags: MrFlags::empty(),
            },
        )
        .map_err(|_| libc::ENOMEM)?;
    wr.sg_list.push(Sge::new(mr.lkey(), iova, len as u32));
    Ok(Some(InlineCopy {
        _mr: mr,
        _buf: buf,
        _data: data,
    }))
}

/// The errno rdma-core's providers give for a refused request.
pub(crate) fn post_errno(e: &softrdma::Error) -> c_int {
    match e {
        softrdma::Error::Post(PostError::QueueFull) => libc::ENOMEM,
        softrdma::Error::Post(PostError::Unsupported) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    }
}

/// A request of the program's linked lists.
pub(crate) trait Linked {
    fn next(&self) -> *mut Self;
}

impl Linked for sys::ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl Linked for sys::ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Posts the program's list from `first`: each request converted by `convert` (refused:
/// its errno), the converted ones handed to `post` in order. The first refused request is
/// named in `*bad` and its errno returned; those before it are posted (rdma-core's rule).
///
/// # Safety
/// `first` is NULL or the program's NULL-terminated list; `bad` is NULL or writable.
pub(crate) unsafe fn post_list<W: Linked, R>(
    first: *mut W,
    bad: *mut *mut W,
    mut convert: impl FnMut(&W) -> Result<R, c_int>,
    post: impl FnOnce(&mut dyn Iterator<Item = R>) -> Result<(), (usize, softrdma::Error)>,
) -> c_int {
    let mut cur = first;
    let mut taken = 0usize;
    let mut refused: Option<(usize, c_int)> = None;
    let mut list = std::iter::from_fn(|| {
        if cur.is_null() || refused.is_some() {
            return None;
        }
        // SAFETY: the program's list (the caller's promise).
        let w = unsafe { &*cur };
        match convert(w) {
            Ok(r) => {
                cur = w.next();
                taken += 1;
                Some(r)
            }
            Err(e) => {
                refused = Some((taken, e));
                None
            }
        }
    });
    let posted = post(&mut list);
    let failed = match posted {
        Ok(()) => refused,
        Err((i, e)) => Some((i, post_errno(&e))),
    };
    let Some((i, e)) = failed else {
        return 0;
    };
    if !bad.is_null() {
        let mut at = first;
        for _ in 0..i {
            // SAFETY: the first `i` requests were walked above.
            at = unsafe { (*at).next() };
        }
        // SAFETY: the program's out-pointer.
        unsafe { *bad = at };
    }
    e
}
