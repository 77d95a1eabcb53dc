//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp` (the IB state machine, for programs that
//! exchange QP numbers out of band, as `ibv_rc_pingpong` and perftest do on RoCE),
//! `ibv_query_qp`, `ibv_destroy_qp`, and the context's `post_send` and `post_recv` ops.

use core::ffi::c_int;
use std::net::SocketAddr;
use std::ptr;
use std::sync::atomic::Ordering;

use softrdma::ib::{QpAttr, QpState};
use softrdma::{Access, QpCap, QpInitAttr, QpType, RecvWr};

use crate::cq::{SrCq, cq};
use crate::device::{MAX_SGE, PORT};
use crate::errno;
use crate::live::Live;
use crate::pd::{SrPd, pd};
use crate::sys;
use crate::wr::{post_errno, send_wr, sges};

/// The UDP port of RoCEv2 (IBA Annex A17), where every context receives.
const ROCE_PORT: u16 = 4791;

/// A queue pair as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrQp {
    /// What the program reads (`state` follows `ibv_modify_qp`), hence a cell.
    qp: std::cell::UnsafeCell<sys::ibv_qp>,
    /// Shared with librdmacm's connecting threads, which may outlive the handle.
    pub inner: std::sync::Arc<softrdma::Qp>,
    send_cq: &'static SrCq,
    recv_cq: &'static SrCq,
    srq: Option<&'static crate::srq::SrSrq>,
    pd: &'static SrPd,
}

static QPS: Live = Live::new();

pub(crate) fn qp<'a>(p: *const sys::ibv_qp) -> Option<&'a SrQp> {
    // SAFETY: a live QP is the first field of a boxed SrQp.
    QPS.contains(p).then(|| unsafe { &*p.cast::<SrQp>() })
}

fn qp_type(t: sys::ibv_qp_type) -> Result<QpType, c_int> {
    match t {
        sys::IBV_QPT_RC => Ok(QpType::Rc),
        sys::IBV_QPT_UC => Ok(QpType::Uc),
        sys::IBV_QPT_UD => Ok(QpType::Ud),
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// `ibv_create_qp`: the capabilities granted are written back into `attr.cap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_qp(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    if attr.is_null() {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the program's init attributes (checked non-NULL).
    let a = unsafe { &mut *attr };
    match create_qp(pd, a) {
        Ok(p) => p,
        Err(e) => {
            errno::set(e);
            ptr::null_mut()
        }
    }
}

fn create_qp(
    pd: *mut sys::ibv_pd,
    a: &mut sys::ibv_qp_init_attr,
) -> Result<*mut sys::ibv_qp, c_int> {
    let p: &'static SrPd = self::pd(pd).ok_or(libc::EINVAL)?;
    let ty = qp_type(a.qp_type)?;
    let (scq, rcq) = match (cq(a.send_cq), cq(a.recv_cq)) {
        (Some(s), Some(r)) => (s, r),
        _ => return Err(libc::EINVAL),
    };
    let srq = match a.srq.is_null() {
        true => None,
        false => Some(crate::srq::srq(a.srq).ok_or(libc::EINVAL)?),
    };
    let limits = p.ctx.dev.inner.limits();
    let cap = a.cap;
    if cap.max_send_wr > limits.max_qp_wr
        || cap.max_recv_wr > limits.max_qp_wr
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
    {
        return Err(libc::EINVAL);
    }
    let mut init = QpInitAttr::typed(ty, &scq.inner, &rcq.inner);
    init.cap = QpCap {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data,
    };
    init.sq_sig_all = a.sq_sig_all != 0;
    init.srq = srq.map(|s| s.inner.clone());
    let inner = p.inner.create_qp(init).map_err(|e| match e {
        softrdma::Error::ResourceLimit { .. } => libc::ENOMEM,
        softrdma::Error::Unsupported(_) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    })?;
    let got = inner.cap();
    a.cap = sys::ibv_qp_cap {
        max_send_wr: got.max_send_wr,
        max_recv_wr: got.max_recv_wr,
        max_send_sge: got.max_send_sge,
        max_recv_sge: got.max_recv_sge,
        max_inline_data: got.max_inline_data,
    };
    // SAFETY: live CQs stay until destroy_cq, which refuses while `users` counts this QP.
    let (scq, rcq): (&'static SrCq, &'static SrCq) =
        unsafe { (&*ptr::from_ref(scq), &*ptr::from_ref(rcq)) };
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    // SAFETY: as for the CQs: destroy_srq refuses while `users` counts this QP.
    let srq: Option<&'static crate::srq::SrSrq> = srq.map(|s| unsafe { &*ptr::from_ref(s) });
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let b = Box::new(SrQp {
        qp: std::cell::UnsafeCell::new(sys::ibv_qp {
            context: p.ctx_ptr(),
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: inner.qp_num(),
            qp_num: inner.qp_num(),
            state: sys::IBV_QPS_RESET,
            qp_type: a.qp_type,
            ..Default::default()
        }),
        inner: std::sync::Arc::new(inner),
        send_cq: scq,
        recv_cq: rcq,
        srq,
        pd: p,
    });
    let q = Box::into_raw(b).cast::<sys::ibv_qp>();
    QPS.insert(q);
    Ok(q)
}

/// `ibv_destroy_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_destroy_qp(p: *mut sys::ibv_qp) -> c_int {
    if !QPS.remove(p) {
        return libc::EINVAL;
    }
    // SAFETY: it was live: a boxed SrQp, now ours alone.
    let q = unsafe { Box::from_raw(p.cast::<SrQp>()) };
    let (scq, rcq, srq) = (q.send_cq, q.recv_cq, q.srq);
    drop(q);
    scq.users.fetch_sub(1, Ordering::AcqRel);
    rcq.users.fetch_sub(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_sub(1, Ordering::AcqRel);
    }
    0
}

fn state_of(s: sys::ibv_qp_state) -> Result<QpState, c_int> {
    Ok(match s {
        sys::IBV_QPS_RESET => QpState::Reset,
        sys::IBV_QPS_INIT => QpState::Init,
        sys::IBV_QPS_RTR => QpState::Rtr,
        sys::IBV_QPS_RTS => QpState::Rts,
        sys::IBV_QPS_SQD => QpState::Sqd,
        sys::IBV_QPS_SQE => QpState::Sqe,
        sys::IBV_QPS_ERR => QpState::Error,
        _ => return Err(libc::EINVAL),
    })
}

fn state_to_c(s: softrdma::QpState) -> sys::ibv_qp_state {
    use softrdma::QpState as S;
    match s {
        S::Reset => sys::IBV_QPS_RESET,
        S::Init | S::Connecting => sys::IBV_QPS_INIT,
        S::Rtr => sys::IBV_QPS_RTR,
        S::Rts => sys::IBV_QPS_RTS,
        S::Sqd => sys::IBV_QPS_SQD,
        S::Sqe => sys::IBV_QPS_SQE,
        _ => sys::IBV_QPS_ERR,
    }
}

/// What a QP's access flags allow peers (`IBV_ACCESS_REMOTE_*`).
fn qp_access(f: u32) -> Access {
    let mut a = Access::empty();
    for (bit, r) in [
        (sys::IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (sys::IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (sys::IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if f & bit != 0 {
            a |= r;
        }
    }
    a
}

/// `ibv_modify_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_modify_qp(
    p: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let Some(q) = qp(p) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program's attributes (checked non-NULL).
    let a = unsafe { &*attr };
    match modify(q, a, mask as u32) {
        Ok(()) => {
            if mask as u32 & sys::IBV_QP_STATE != 0 {
                // SAFETY: our own struct, in a cell; rdma-core keeps the state the program
                // reads here.
                unsafe { (*q.qp.get()).state = a.qp_state };
            }
            0
        }
        Err(e) => e,
    }
}

fn modify(q: &SrQp, a: &sys::ibv_qp_attr, mask: u32) -> Result<(), c_int> {
    let has = |m: u32| mask & m != 0;
    let known = sys::IBV_QP_STATE
        | sys::IBV_QP_CUR_STATE
        | sys::IBV_QP_ACCESS_FLAGS
        | sys::IBV_QP_PKEY_INDEX
        | sys::IBV_QP_PORT
        | sys::IBV_QP_QKEY
        | sys::IBV_QP_AV
        | sys::IBV_QP_PATH_MTU
        | sys::IBV_QP_TIMEOUT
        | sys::IBV_QP_RETRY_CNT
        | sys::IBV_QP_RNR_RETRY
        | sys::IBV_QP_RQ_PSN
        | sys::IBV_QP_MAX_QP_RD_ATOMIC
        | sys::IBV_QP_MIN_RNR_TIMER
        | sys::IBV_QP_SQ_PSN
        | sys::IBV_QP_MAX_DEST_RD_ATOMIC
        | sys::IBV_QP_DEST_QPN
        | sys::IBV_QP_EN_SQD_ASYNC_NOTIFY;
    if mask & !known != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if has(sys::IBV_QP_PORT) && a.port_num != PORT {
        return Err(libc::EINVAL);
    }
    if has(sys::IBV_QP_PKEY_INDEX) && a.pkey_index != 0 {
        return Err(libc::EINVAL);
    }
    if has(sys::IBV_QP_CUR_STATE) && state_to_c(q.inner.state()) != a.cur_qp_state {
        return Err(libc::EINVAL);
    }
    if has(sys::IBV_QP_AV) {
        // RoCE: the path is the peer's GID (its IP address); there is no LID routing.
        if a.ah_attr.is_global == 0 || a.ah_attr.port_num != PORT && a.ah_attr.port_num != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: a GID is 16 octets whichever way the union is read.
        let dgid = unsafe { a.ah_attr.grh.dgid.raw };
        let ip = softrdma::gid_to_ip(&dgid);
        q.inner
            .set_remote(SocketAddr::new(ip, ROCE_PORT))
            .map_err(|_| libc::EINVAL)?;
    }
    let pmtu = if has(sys::IBV_QP_PATH_MTU) {
        if !(sys::IBV_MTU_256..=sys::IBV_MTU_4096).contains(&a.path_mtu) {
            return Err(libc::EINVAL);
        }
        Some(128u32 << a.path_mtu)
    } else {
        None
    };
    let attr = QpAttr {
        state: if has(sys::IBV_QP_STATE) {
            Some(state_of(a.qp_state)?)
        } else {
            None
        },
        qkey: has(sys::IBV_QP_QKEY).then_some(a.qkey),
        access: has(sys::IBV_QP_ACCESS_FLAGS).then(|| qp_access(a.qp_access_flags)),
        pmtu,
        dest_qp: has(sys::IBV_QP_DEST_QPN).then_some(a.dest_qp_num & 0xFF_FFFF),
        rq_psn: has(sys::IBV_QP_RQ_PSN).then_some(a.rq_psn & 0xFF_FFFF),
        max_dest_rd_atomic: has(sys::IBV_QP_MAX_DEST_RD_ATOMIC).then_some(a.max_dest_rd_atomic),
        min_rnr_timer: has(sys::IBV_QP_MIN_RNR_TIMER).then_some(a.min_rnr_timer),
        sq_psn: has(sys::IBV_QP_SQ_PSN).then_some(a.sq_psn & 0xFF_FFFF),
        timeout: has(sys::IBV_QP_TIMEOUT).then_some(a.timeout),
        retry_cnt: has(sys::IBV_QP_RETRY_CNT).then_some(a.retry_cnt),
        rnr_retry: has(sys::IBV_QP_RNR_RETRY).then_some(a.rnr_retry),
        max_rd_atomic: has(sys::IBV_QP_MAX_QP_RD_ATOMIC).then_some(a.max_rd_atomic),
        ..QpAttr::default()
    };
    q.inner.modify(&attr).map_err(|e| match e {
        softrdma::Error::Unsupported(_) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    })
}

/// `ibv_query_qp`: the state and capabilities, and the attributes the QP was made with.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_qp(
    p: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    _mask: c_int,
    init: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let Some(q) = qp(p) else {
        return libc::EINVAL;
    };
    if attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    let c = q.inner.cap();
    let cap = sys::ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    };
    let state = state_to_c(q.inner.state());
    // SAFETY: our own struct (read).
    let c = unsafe { &*q.qp.get() };
    // SAFETY: the program passes room for both structs (checked non-NULL).
    unsafe {
        attr.write(sys::ibv_qp_attr {
            qp_state: state,
            cur_qp_state: state,
            cap,
            port_num: PORT,
            ..Default::default()
        });
        init.write(sys::ibv_qp_init_attr {
            qp_context: c.qp_context,
            send_cq: c.send_cq,
            recv_cq: c.recv_cq,
            srq: c.srq,
            cap,
            qp_type: c.qp_type,
            sq_sig_all: 0,
        });
    }
    0
}

/// The `post_send` op: the requests in order; at the first refused one, `*bad` names it
/// and its errno is returned (those before it are posted).
pub(crate) unsafe extern "C" fn post_send(
    p: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> c_int {
    // SAFETY: the op is reached through a QP of ours (the program's promise; rdma-core's
    // providers do not check either).
    let q = unsafe { &*p.cast::<SrQp>() };
    // SAFETY: our own struct (read).
    let ud = unsafe { (*q.qp.get()).qp_type } == sys::IBV_QPT_UD;
    let mut cur = wr;
    let mut refused: Option<(*mut sys::ibv_send_wr, c_int)> = None;
    let mut ptrs: smallvec::SmallVec<[*mut sys::ibv_send_wr; 8]> = smallvec::SmallVec::new();
    let list = std::iter::from_fn(|| {
        if cur.is_null() || refused.is_some() {
            return None;
        }
        // SAFETY: the program's linked list of requests.
        let w = unsafe { &*cur };
        match send_wr(w, ud) {
            Some(s) => {
                ptrs.push(cur);
                cur = w.next;
                Some(s)
            }
            None => {
                refused = Some((cur, libc::EINVAL));
                None
            }
        }
    });
    let posted = q.inner.post_send_list(list);
    let failed = match posted {
        Ok(()) => refused,
        Err((i, e)) => Some((ptrs.get(i).copied().unwrap_or(cur), post_errno(&e))),
    };
    match failed {
        None => 0,
        Some((at, e)) => {
            if !bad.is_null() {
                // SAFETY: the program's out-pointer.
                unsafe { *bad = at };
            }
            e
        }
    }
}

/// The `post_recv` op, as `post_send`.
pub(crate) unsafe extern "C" fn post_recv(
    p: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: as for post_send.
    let q = unsafe { &*p.cast::<SrQp>() };
    let mut cur = wr;
    let mut refused: Option<(*mut sys::ibv_recv_wr, c_int)> = None;
    let mut ptrs: smallvec::SmallVec<[*mut sys::ibv_recv_wr; 8]> = smallvec::SmallVec::new();
    let list = std::iter::from_fn(|| {
        if cur.is_null() || refused.is_some() {
            return None;
        }
        // SAFETY: the program's linked list of requests.
        let w = unsafe { &*cur };
        match sges(w.sg_list, w.num_sge) {
            Some(s) => {
                ptrs.push(cur);
                cur = w.next;
                Some(RecvWr::new(w.wr_id, s))
            }
            None => {
                refused = Some((cur, libc::EINVAL));
                None
            }
        }
    });
    let posted = q.inner.post_recv_list(list);
    let failed = match posted {
        Ok(()) => refused,
        Err((i, e)) => Some((ptrs.get(i).copied().unwrap_or(cur), post_errno(&e))),
    };
    match failed {
        None => 0,
        Some((at, e)) => {
            if !bad.is_null() {
                // SAFETY: the program's out-pointer.
                unsafe { *bad = at };
            }
            e
        }
    }
}
