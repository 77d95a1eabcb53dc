//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp` (the IB state machine, for programs that
//! exchange QP numbers out of band, as `ibv_rc_pingpong` and perftest do on RoCE),
//! `ibv_query_qp`, `ibv_destroy_qp`, and the context's `post_send` and `post_recv` ops.

use core::ffi::c_int;
use std::net::SocketAddr;
use std::ptr;
use std::sync::atomic::Ordering;

use softrdma::roce::{QpAttr, QpState};
use softrdma::{Access, QpCap, QpInitAttr, QpType, RecvWr};

use crate::cq::{SrCq, cq};
use crate::device::{MAX_SGE, PORT};
use crate::errno;
use crate::live::Live;
use crate::pd::{SrPd, pd};
use crate::sys;
use crate::wr::{post_errno, post_list, send_wr, sges};

/// The UDP port of RoCEv2 (IBA Annex A17), where every context receives.
const ROCE_PORT: u16 = 4791;

/// A queue pair as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrQp {
    /// What the program reads (`state` follows `ibv_modify_qp`; `ibv_qp_ex` carries the
    /// `ibv_wr_*` calls and the next request's id and flags), hence a cell.
    qp: std::cell::UnsafeCell<sys::ibv_qp_ex>,
    /// Requests built between `ibv_wr_start` and `ibv_wr_complete`.
    batch: parking_lot::Mutex<Batch>,
    /// The Q_Key last set (`ibv_query_qp` reports it).
    qkey: std::sync::atomic::AtomicU32,
    /// Shared with librdmacm's connecting threads, which may outlive the handle.
    pub inner: std::sync::Arc<softrdma::Qp>,
    send_cq: &'static SrCq,
    recv_cq: &'static SrCq,
    srq: Option<&'static crate::srq::SrSrq>,
    pd: &'static SrPd,
}

static QPS: Live = Live::new();

/// The live QP numbered `qp_num` among those of the contexts `mine` picks, with its
/// context.
pub(crate) fn find(
    qp_num: u32,
    mine: impl Fn(&crate::context::SrContext) -> bool,
) -> Option<(&'static crate::context::SrContext, *mut sys::ibv_qp)> {
    QPS.snapshot().into_iter().find_map(|p| {
        let q: &'static SrQp = qp(p as *const sys::ibv_qp)?;
        let ctx = q.pd.ctx;
        (q.inner.qp_num() == qp_num && mine(ctx)).then_some((ctx, p as *mut sys::ibv_qp))
    })
}

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
        || cap.max_inline_data > limits.max_inline_data
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
        batch: parking_lot::Mutex::default(),
        qkey: std::sync::atomic::AtomicU32::new(0),
        qp: std::cell::UnsafeCell::new(with_wr_ops(sys::ibv_qp {
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
        })),
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
    crate::pd::rights(
        f & (sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_ATOMIC),
    )
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
                unsafe { (*q.qp.get()).qp_base.state = a.qp_state };
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
        let ip = softrdma::roce::gid_to_ip(&dgid);
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
    })?;
    if let Some(k) = attr.qkey {
        q.qkey.store(k, Ordering::Release);
    }
    Ok(())
}

/// librdmacm's UD QPs go to RTS as `rdma_create_qp` makes them (INIT with librdmacm's Q_Key,
/// RTR, RTS): their peers are found per message, not connected.
pub(crate) fn ready_ud(q: &SrQp) -> Result<(), c_int> {
    for (state, qkey, c_state) in [
        (
            QpState::Init,
            Some(softrdma::roce::RDMA_UDP_QKEY),
            sys::IBV_QPS_INIT,
        ),
        (QpState::Rtr, None, sys::IBV_QPS_RTR),
        (QpState::Rts, None, sys::IBV_QPS_RTS),
    ] {
        let attr = QpAttr {
            state: Some(state),
            qkey,
            sq_psn: (state == QpState::Rts).then_some(0),
            ..QpAttr::default()
        };
        q.inner.modify(&attr).map_err(|_| libc::EINVAL)?;
        if let Some(k) = qkey {
            q.qkey.store(k, Ordering::Release);
        }
        // SAFETY: our own struct, in a cell.
        unsafe { (*q.qp.get()).qp_base.state = c_state };
    }
    Ok(())
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
    let c = unsafe { &(*q.qp.get()).qp_base };
    // SAFETY: the program passes room for both structs (checked non-NULL).
    unsafe {
        attr.write(sys::ibv_qp_attr {
            qp_state: state,
            cur_qp_state: state,
            qkey: q.qkey.load(Ordering::Acquire),
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
    let ud = unsafe { (*q.qp.get()).qp_base.qp_type } == sys::IBV_QPT_UD;
    let convert = |w: &sys::ibv_send_wr| {
        let mut s = send_wr(w, ud).ok_or(libc::EINVAL)?;
        if w.send_flags & sys::IBV_SEND_INLINE != 0 {
            let pieces = crate::wr::inline_pieces(w).ok_or(libc::EINVAL)?;
            crate::wr::set_inline(&q.inner, &mut s, pieces)?;
        }
        Ok(s)
    };
    // SAFETY: the program's list and out-pointer.
    unsafe { post_list(wr, bad, convert, |l| q.inner.post_send_list(l)) }
}

/// The `post_recv` op, as `post_send`.
pub(crate) unsafe extern "C" fn post_recv(
    p: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: as for post_send.
    let q = unsafe { &*p.cast::<SrQp>() };
    let convert = |w: &sys::ibv_recv_wr| {
        sges(w.sg_list, w.num_sge)
            .map(|s| RecvWr::new(w.wr_id, s))
            .ok_or(libc::EINVAL)
    };
    // SAFETY: the program's list and out-pointer.
    unsafe { post_list(wr, bad, convert, |l| q.inner.post_recv_list(l)) }
}

// --- the extended QP: ibv_create_qp_ex and the ibv_wr_* calls -------------------------

/// The verbs op behind `ibv_create_qp_ex`: a PD is required; the send operations asked
/// for are all carried (the `ibv_wr_*` calls of each QP refuse the others at
/// `ibv_wr_complete`).
pub(crate) unsafe extern "C" fn create_qp_ex(
    _ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    if attr.is_null() {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the program's attributes (checked non-NULL).
    let a = unsafe { &mut *attr };
    let known = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 || a.comp_mask & !known != 0 {
        errno::set(if a.comp_mask & !known != 0 {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        });
        return ptr::null_mut();
    }
    let mut init = sys::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    match create_qp(a.pd, &mut init) {
        Ok(q) => {
            a.cap = init.cap;
            q
        }
        Err(e) => {
            errno::set(e);
            ptr::null_mut()
        }
    }
}

/// `ibv_qp_to_qp_ex`: every QP of ours is an extended one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_qp_to_qp_ex(p: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex {
    match qp(p) {
        Some(q) => q.qp.get(),
        None => {
            errno::set(libc::EINVAL);
            ptr::null_mut()
        }
    }
}

/// Requests built by the `ibv_wr_*` calls, posted together by `ibv_wr_complete`.
#[derive(Default)]
struct Batch {
    wrs: Vec<softrdma::SendWr>,
    /// The first call that could not be carried: `ibv_wr_complete` reports it.
    error: Option<c_int>,
}

fn with_wr_ops(base: sys::ibv_qp) -> sys::ibv_qp_ex {
    sys::ibv_qp_ex {
        qp_base: base,
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_rdma_read: Some(wr_rdma_read),
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_atomic_write: Some(wr_atomic_write),
        ..Default::default()
    }
}

/// The QP behind an `ibv_qp_ex` (the program's promise that it is one of ours, as with the
/// ops).
///
/// # Safety
/// `x` is the extended QP of a live QP of this library.
unsafe fn of<'a>(x: *mut sys::ibv_qp_ex) -> &'a SrQp {
    // SAFETY: the caller's promise: the first field of a boxed SrQp.
    unsafe { &*x.cast::<SrQp>() }
}

/// Starts a request of `opcode`, taking the id and flags the program set in the struct.
unsafe fn begin(x: *mut sys::ibv_qp_ex, opcode: softrdma::WrOpcode) {
    // SAFETY: as `of`.
    let q = unsafe { of(x) };
    // SAFETY: the program wrote these fields before this call.
    let (wr_id, wr_flags) = unsafe { ((*x).wr_id, (*x).wr_flags) };
    let flags = crate::wr::send_flags(wr_flags);
    q.batch.lock().wrs.push(softrdma::SendWr {
        wr_id,
        opcode,
        sg_list: Default::default(),
        flags,
        ud: None,
        inline: None,
    });
}

/// Records that the program asked for what is not carried.
unsafe fn refuse(x: *mut sys::ibv_qp_ex) {
    // SAFETY: as `of`.
    let q = unsafe { of(x) };
    q.batch.lock().error.get_or_insert(libc::EOPNOTSUPP);
}

impl Batch {
    /// Empty, its storage kept for the next batch (no allocation per batch).
    fn reset(&mut self) {
        self.wrs.clear();
        self.error = None;
    }
}

unsafe extern "C" fn wr_start(x: *mut sys::ibv_qp_ex) {
    // SAFETY: as `of`.
    unsafe { of(x) }.batch.lock().reset();
}

unsafe extern "C" fn wr_abort(x: *mut sys::ibv_qp_ex) {
    // SAFETY: as `of`.
    unsafe { of(x) }.batch.lock().reset();
}

/// `ibv_wr_complete`: posts what was built; 0 or the errno of the first refused request
/// (as rdma-core's providers, nothing of a refused batch is posted after it).
unsafe extern "C" fn wr_complete(x: *mut sys::ibv_qp_ex) -> c_int {
    // SAFETY: as `of`.
    let q = unsafe { of(x) };
    let mut b = q.batch.lock();
    if let Some(e) = b.error.take() {
        b.reset();
        return e;
    }
    let posted = q.inner.post_send_list(b.wrs.drain(..));
    b.reset();
    match posted {
        Ok(()) => 0,
        Err((_, e)) => post_errno(&e),
    }
}

unsafe extern "C" fn wr_send(x: *mut sys::ibv_qp_ex) {
    // SAFETY: the program's extended QP.
    unsafe { begin(x, softrdma::WrOpcode::Send) }
}

unsafe extern "C" fn wr_send_imm(x: *mut sys::ibv_qp_ex, imm: u32) {
    let imm = u32::from_be(imm);
    // SAFETY: the program's extended QP.
    unsafe { begin(x, softrdma::WrOpcode::SendWithImm { imm }) }
}

unsafe extern "C" fn wr_send_inv(x: *mut sys::ibv_qp_ex, rkey: u32) {
    let invalidate_rkey = softrdma::Key(rkey);
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            x,
            softrdma::WrOpcode::SendWithInvalidate { invalidate_rkey },
        )
    }
}

unsafe extern "C" fn wr_rdma_write(x: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let rkey = softrdma::Key(rkey);
    // SAFETY: the program's extended QP.
    unsafe { begin(x, softrdma::WrOpcode::RdmaWrite { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_rdma_write_imm(
    x: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: u32,
) {
    let (rkey, imm) = (softrdma::Key(rkey), u32::from_be(imm));
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            x,
            softrdma::WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
        )
    }
}

unsafe extern "C" fn wr_rdma_read(x: *mut sys::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let rkey = softrdma::Key(rkey);
    // SAFETY: the program's extended QP.
    unsafe { begin(x, softrdma::WrOpcode::RdmaRead { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    x: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let rkey = softrdma::Key(rkey);
    let op = softrdma::WrOpcode::AtomicCmpSwap {
        remote_addr,
        rkey,
        compare,
        swap,
    };
    // SAFETY: the program's extended QP.
    unsafe { begin(x, op) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    x: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let rkey = softrdma::Key(rkey);
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            x,
            softrdma::WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
        )
    }
}

/// Sets the entries of the request begun last.
unsafe fn set_sges(x: *mut sys::ibv_qp_ex, sges: impl Iterator<Item = softrdma::Sge>) {
    // SAFETY: as `of`.
    let q = unsafe { of(x) };
    let mut b = q.batch.lock();
    match b.wrs.last_mut() {
        Some(w) => w.sg_list = sges.collect(),
        None => {
            b.error.get_or_insert(libc::EINVAL);
        }
    }
}

unsafe extern "C" fn wr_set_sge(x: *mut sys::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the program's extended QP.
    unsafe {
        set_sges(
            x,
            std::iter::once(softrdma::Sge::new(softrdma::Key(lkey), addr, length)),
        )
    }
}

unsafe extern "C" fn wr_set_sge_list(x: *mut sys::ibv_qp_ex, n: usize, list: *const sys::ibv_sge) {
    match c_int::try_from(n).ok().and_then(|n| sges(list, n)) {
        // SAFETY: the program's extended QP.
        Some(s) => unsafe { set_sges(x, s) },
        // SAFETY: as above.
        None => unsafe { refuse(x) },
    }
}

/// Inline octets of the request begun last, copied now (the program may reuse them).
unsafe fn set_inline(
    x: *mut sys::ibv_qp_ex,
    pieces: impl Iterator<Item = (*const u8, usize)> + Clone,
) {
    // SAFETY: as `of`.
    let q = unsafe { of(x) };
    let mut b = q.batch.lock();
    let set = match b.wrs.last_mut() {
        Some(w) => crate::wr::set_inline(&q.inner, w, pieces),
        None => Err(libc::EINVAL),
    };
    if let Err(e) = set {
        b.error.get_or_insert(e);
    }
}

unsafe extern "C" fn wr_set_inline_data(
    x: *mut sys::ibv_qp_ex,
    addr: *mut core::ffi::c_void,
    length: usize,
) {
    // SAFETY: the program's extended QP and octets.
    unsafe { set_inline(x, std::iter::once((addr.cast::<u8>().cast_const(), length))) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    x: *mut sys::ibv_qp_ex,
    n: usize,
    list: *const sys::ibv_data_buf,
) {
    if n > MAX_SGE as usize || (n > 0 && list.is_null()) {
        // SAFETY: the program's extended QP.
        unsafe { refuse(x) };
        return;
    }
    let pieces = (0..n).map(|i| {
        // SAFETY: the program's array of `n` buffers.
        let b = unsafe { *list.add(i) };
        (b.addr.cast::<u8>().cast_const(), b.length)
    });
    // SAFETY: the program's extended QP and octets.
    unsafe { set_inline(x, pieces) }
}

unsafe extern "C" fn wr_set_ud_addr(
    x: *mut sys::ibv_qp_ex,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: as `of`.
    let q = unsafe { of(x) };
    let mut b = q.batch.lock();
    match (b.wrs.last_mut(), ah.is_null()) {
        (Some(w), false) => {
            w.ud = Some(softrdma::UdDest {
                // SAFETY: the program names an address handle of ours.
                ah: unsafe { crate::ah::ah_id(ah) },
                remote_qpn,
                remote_qkey,
            })
        }
        _ => {
            b.error.get_or_insert(libc::EINVAL);
        }
    }
}

/// The `bind_mw` op (`ibv_bind_mw`, type 1 windows): posts a Bind request to `qp` with the
/// window's next key (`ibv_inc_rkey`), which `mw->rkey` holds once posted; the bind
/// completes on the QP's send CQ (`IBV_WC_BIND_MW`) if signaled.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    bind: *mut sys::ibv_mw_bind,
) -> c_int {
    // SAFETY: the program's window, not freed during the call (foreign ones refused).
    let m = unsafe { crate::mw::window(mw) };
    // SAFETY: the program's bind request, if not NULL.
    let b = unsafe { bind.as_ref() };
    let (Some(q), Some(m), Some(b)) = (self::qp(qp), m, b) else {
        return libc::EINVAL;
    };
    // Type 2 windows are bound by the program's own Bind requests (`IBV_WR_BIND_MW`).
    if m.mw.type_ != sys::IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    let new = m.inner.rkey().next_consumer(1).0;
    let spec = match crate::mw::bind_of(mw, new, &b.bind_info) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let wr =
        softrdma::SendWr::bind_mw(b.wr_id, spec).with_flags(crate::wr::send_flags(b.send_flags));
    match q.inner.post_send(wr) {
        Ok(()) => {
            m.mw.rkey = new;
            0
        }
        Err(e) => crate::wr::post_errno(&e),
    }
}

// Not carried yet: TSO, XRC and atomic write; a batch that asks for one fails at
// `ibv_wr_complete` with EOPNOTSUPP.

unsafe extern "C" fn wr_bind_mw(
    x: *mut sys::ibv_qp_ex,
    mw: *mut sys::ibv_mw,
    rkey: u32,
    bind: *const sys::ibv_mw_bind_info,
) {
    // SAFETY: the program's bind information, if not NULL.
    let spec = unsafe { bind.as_ref() }.map(|b| crate::mw::bind_of(mw, rkey, b));
    match spec {
        // SAFETY: the program's extended QP.
        Some(Ok(b)) => unsafe { begin(x, softrdma::WrOpcode::BindMw(b)) },
        // SAFETY: as above.
        _ => {
            unsafe { of(x) }
                .batch
                .lock()
                .error
                .get_or_insert(libc::EINVAL);
        }
    }
}

unsafe extern "C" fn wr_local_inv(x: *mut sys::ibv_qp_ex, rkey: u32) {
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            x,
            softrdma::WrOpcode::LocalInv {
                key: softrdma::Key(rkey),
            },
        )
    }
}

unsafe extern "C" fn wr_send_tso(
    x: *mut sys::ibv_qp_ex,
    _hdr: *mut core::ffi::c_void,
    _hdr_sz: u16,
    _mss: u16,
) {
    // SAFETY: the program's extended QP.
    unsafe { refuse(x) }
}

unsafe extern "C" fn wr_set_xrc_srqn(x: *mut sys::ibv_qp_ex, _srqn: u32) {
    // SAFETY: the program's extended QP.
    unsafe { refuse(x) }
}

unsafe extern "C" fn wr_atomic_write(
    x: *mut sys::ibv_qp_ex,
    _rkey: u32,
    _remote_addr: u64,
    _data: *const core::ffi::c_void,
) {
    // SAFETY: the program's extended QP.
    unsafe { refuse(x) }
}
