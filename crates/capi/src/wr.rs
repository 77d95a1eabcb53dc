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

/// A C send request as softrdma's, or `None` for one it does not carry. `ud`: the QP is
/// UD, and the request names its destination.
pub(crate) fn send_wr(w: &sys::ibv_send_wr, ud: bool) -> Option<SendWr> {
    let mut flags = SendFlags::empty();
    for (bit, f) in [
        (sys::IBV_SEND_SIGNALED, SendFlags::SIGNALED),
        (sys::IBV_SEND_SOLICITED, SendFlags::SOLICITED),
        (sys::IBV_SEND_FENCE, SendFlags::FENCE),
        (sys::IBV_SEND_INLINE, SendFlags::INLINE),
    ] {
        if w.send_flags & bit != 0 {
            flags |= f;
        }
    }
    // SAFETY: which member of the union is meant follows from the opcode, read below.
    let (rdma, atomic) = unsafe { (w.wr.rdma, w.wr.atomic) };
    // SAFETY: as above (the immediate data and the invalidated key share a union).
    let (imm, inv) = unsafe {
        (
            u32::from_be(w.__bindgen_anon_1.imm_data),
            w.__bindgen_anon_1.invalidate_rkey,
        )
    };
    let opcode = match w.opcode {
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
    };
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

/// The errno rdma-core's providers give for a refused request.
pub(crate) fn post_errno(e: &softrdma::Error) -> c_int {
    match e {
        softrdma::Error::Post(PostError::QueueFull) => libc::ENOMEM,
        softrdma::Error::Post(PostError::Unsupported) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    }
}
