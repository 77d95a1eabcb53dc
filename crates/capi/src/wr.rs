//! Work requests from C (`ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`) as softrdma's, and the
//! errno a refused one gives.

use core::ffi::c_int;

use softrdma::{Key, PostError, SendFlags, SendWr, Sge, UdDest, WrOpcode};

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
        inline: None,
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
        sys::IBV_WR_LOCAL_INV => WrOpcode::LocalInv { key: Key(inv) },
        sys::IBV_WR_BIND_MW => {
            // SAFETY: a Bind request carries the `bind_mw` member.
            let b = unsafe { w.__bindgen_anon_2.bind_mw };
            WrOpcode::BindMw(crate::mw::bind_of(b.mw, b.rkey, &b.bind_info).ok()?)
        }
        _ => return None,
    })
}

/// Makes `wr` an `INLINE` request of the octets `pieces` name, copied now into a buffer
/// of `qp`'s (no region covers them: an entry's key is not looked at); `EINVAL` past the
/// QP's inline limit.
pub(crate) fn set_inline(
    qp: &softrdma::Qp,
    wr: &mut SendWr,
    pieces: impl Iterator<Item = (*const u8, usize)> + Clone,
) -> Result<(), c_int> {
    let total = pieces
        .clone()
        .try_fold(0usize, |t, (_, n)| t.checked_add(n))
        .ok_or(libc::EINVAL)?;
    if total > qp.cap().max_inline_data as usize {
        return Err(libc::EINVAL);
    }
    let mut buf = qp.inline_buf();
    for (p, n) in pieces {
        if n > 0 {
            if p.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: `n` octets at `p`, the program's to read (the verbs' contract).
            buf.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        }
    }
    wr.sg_list.clear();
    wr.flags |= SendFlags::INLINE;
    wr.inline = Some(buf);
    Ok(())
}

/// The pieces of an `IBV_SEND_INLINE` request: its entries' addresses and lengths, or
/// `None` for a count out of range.
pub(crate) fn inline_pieces(
    w: &sys::ibv_send_wr,
) -> Option<impl Iterator<Item = (*const u8, usize)> + Clone + '_> {
    if w.num_sge < 0 || (w.num_sge > 0 && w.sg_list.is_null()) || w.num_sge as u32 > MAX_SGE {
        return None;
    }
    Some((0..w.num_sge as usize).map(|i| {
        // SAFETY: the program's array of `num_sge` entries.
        let s = unsafe { *w.sg_list.add(i) };
        (s.addr as *const u8, s.length as usize)
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
