//! Completion channels and completion queues: `ibv_create_comp_channel`,
//! `ibv_create_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events`, the context's `poll_cq` and
//! `req_notify_cq` ops, and the extended CQ (`ibv_create_cq_ex`: `start_poll`, `next_poll`,
//! `end_poll` and the `read_*` calls; every CQ of ours is laid out as one).

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::ptr;

use parking_lot::lock_api::RawMutex as _;
use parking_lot::{Condvar, Mutex, RawMutex};
use softrdma::{CompletionChannel, Cq, WcOpcode, WcStatus, WorkCompletion};

use crate::context::{SrContext, context};
use crate::errno;
use crate::live::Live;
use crate::sys;

/// A completion channel as rdma-core lays it out; its `fd` is the channel's pipe, readable
/// while an event waits.
#[repr(C)]
pub struct SrChannel {
    ch: sys::ibv_comp_channel,
    inner: CompletionChannel,
    /// The CQs reporting here, by softrdma's CQ id: what an event names.
    cqs: Mutex<HashMap<u32, usize>>,
}

static CHANNELS: Live = Live::new();

fn channel<'a>(p: *const sys::ibv_comp_channel) -> Option<&'a SrChannel> {
    // SAFETY: a live channel is the first field of a boxed SrChannel.
    CHANNELS
        .contains(p)
        .then(|| unsafe { &*p.cast::<SrChannel>() })
}

/// `ibv_create_comp_channel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_comp_channel(
    ctx: *mut sys::ibv_context,
) -> *mut sys::ibv_comp_channel {
    let Some(c) = context(ctx) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    let inner = match c.inner.create_comp_channel() {
        Ok(ch) => ch,
        Err(_) => {
            errno::set(libc::EMFILE);
            return ptr::null_mut();
        }
    };
    let b = Box::new(SrChannel {
        ch: sys::ibv_comp_channel {
            context: ctx,
            fd: inner.as_raw_fd(),
            refcnt: 0,
        },
        inner,
        cqs: Mutex::default(),
    });
    let p = Box::into_raw(b).cast::<sys::ibv_comp_channel>();
    CHANNELS.insert(p);
    p
}

/// `ibv_destroy_comp_channel`: `EBUSY` while a CQ reports to it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_destroy_comp_channel(ch: *mut sys::ibv_comp_channel) -> c_int {
    let Some(c) = channel(ch) else {
        return libc::EINVAL;
    };
    if !c.cqs.lock().is_empty() {
        return libc::EBUSY;
    }
    CHANNELS.remove(ch);
    // SAFETY: it was live: a boxed SrChannel, now ours alone.
    drop(unsafe { Box::from_raw(ch.cast::<SrChannel>()) });
    0
}

/// A completion queue as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrCq {
    /// What the program reads (`comp_events_completed` counts acknowledgements; an
    /// extended CQ's `status` and `wr_id` are the current completion's), hence a cell.
    /// `ibv_cq` is its first part.
    cq: std::cell::UnsafeCell<sys::ibv_cq_ex>,
    /// The completion an extended poll is at (`start_poll` to `end_poll`, under `polling`).
    cur: std::cell::UnsafeCell<sys::ibv_wc>,
    /// Held from a `start_poll` that found a completion to its `end_poll` (rdma-core's
    /// providers lock the CQ so too).
    polling: RawMutex,
    pub inner: Cq,
    channel: Option<&'static SrChannel>,
    /// Events handed out and not yet acknowledged; `ibv_destroy_cq` waits for them.
    unacked: Mutex<u64>,
    acked: Condvar,
    /// QPs completing into it.
    pub(crate) users: std::sync::atomic::AtomicU32,
}

static CQS: Live = Live::new();

/// Ours, if `p` is a live CQ.
pub(crate) fn cq<'a>(p: *const sys::ibv_cq) -> Option<&'a SrCq> {
    // SAFETY: a live CQ is the first field of a boxed SrCq.
    CQS.contains(p).then(|| unsafe { &*p.cast::<SrCq>() })
}

/// The live CQ whose softrdma queue is `cq_id` among those of the contexts `mine` picks,
/// with its context.
pub(crate) fn find(
    cq_id: u32,
    mine: impl Fn(&SrContext) -> bool,
) -> Option<(&'static SrContext, *mut sys::ibv_cq)> {
    CQS.snapshot().into_iter().find_map(|p| {
        let c: &'static SrCq = cq(p as *const sys::ibv_cq)?;
        // SAFETY: our own struct (read).
        let ctx = context(unsafe { (*c.cq.get()).context })?;
        (c.inner.id() == cq_id && mine(ctx)).then_some((ctx, p as *mut sys::ibv_cq))
    })
}

impl SrCq {
    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.cq.get().cast()
    }
}

/// `ibv_create_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_cq(
    ctx: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut sys::ibv_cq {
    match create_cq(ctx, cqe, cq_context, ch, comp_vector) {
        Ok(p) => p,
        Err(e) => {
            errno::set(e);
            ptr::null_mut()
        }
    }
}

fn create_cq(
    ctx: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut sys::ibv_cq, c_int> {
    let c: &SrContext = context(ctx).ok_or(libc::EINVAL)?;
    let max = crate::device::device_attr(c.dev).max_cqe;
    if cqe < 1 || cqe > max || comp_vector != 0 {
        return Err(libc::EINVAL);
    }
    let chan = match ch.is_null() {
        true => None,
        false => Some(channel(ch).ok_or(libc::EINVAL)?),
    };
    let inner = c
        .inner
        .create_cq(cqe as usize, chan.map(|c| &c.inner))
        .map_err(|e| match e {
            softrdma::Error::ResourceLimit { .. } => libc::ENOMEM,
            _ => libc::EINVAL,
        })?;
    if let Some(b) = crate::env::poll_backoff() {
        inner.set_poll_backoff(b);
    }
    let b = Box::new(SrCq {
        cq: std::cell::UnsafeCell::new(sys::ibv_cq_ex {
            context: ctx,
            channel: ch,
            cq_context,
            handle: inner.id(),
            cqe: c_int::try_from(inner.capacity()).unwrap_or(c_int::MAX),
            start_poll: Some(start_poll),
            next_poll: Some(next_poll),
            end_poll: Some(end_poll),
            read_opcode: Some(read_opcode),
            read_vendor_err: Some(read_vendor_err),
            read_byte_len: Some(read_byte_len),
            read_imm_data: Some(read_imm_data),
            read_qp_num: Some(read_qp_num),
            read_src_qp: Some(read_src_qp),
            read_wc_flags: Some(read_wc_flags),
            read_slid: Some(read_slid),
            read_sl: Some(read_sl),
            read_dlid_path_bits: Some(read_dlid_path_bits),
            ..Default::default()
        }),
        cur: std::cell::UnsafeCell::new(sys::ibv_wc::default()),
        polling: RawMutex::INIT,
        inner,
        channel: chan,
        unacked: Mutex::new(0),
        acked: Condvar::new(),
        users: std::sync::atomic::AtomicU32::new(0),
    });
    let p = Box::into_raw(b);
    // SAFETY: the box just made.
    let r = unsafe { &*p };
    if let Some(chan) = chan {
        chan.cqs.lock().insert(r.inner.id(), p as usize);
    }
    let p = p.cast::<sys::ibv_cq>();
    CQS.insert(p);
    Ok(p)
}

/// `ibv_destroy_cq`: waits until every event it reported is acknowledged; `EBUSY` while a
/// QP still completes into it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_destroy_cq(p: *mut sys::ibv_cq) -> c_int {
    let Some(c) = cq(p) else {
        return libc::EINVAL;
    };
    if c.users.load(std::sync::atomic::Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    {
        let mut n = c.unacked.lock();
        while *n > 0 {
            c.acked.wait(&mut n);
        }
    }
    CQS.remove(p);
    if let Some(ch) = c.channel {
        ch.cqs.lock().remove(&c.inner.id());
    }
    // SAFETY: it was live: a boxed SrCq, now ours alone.
    drop(unsafe { Box::from_raw(p.cast::<SrCq>()) });
    0
}

/// `ibv_get_cq_event`: the CQ whose event is next, blocking unless the program made the
/// channel's fd non-blocking (then -1, `EAGAIN`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_cq_event(
    ch: *mut sys::ibv_comp_channel,
    cq_out: *mut *mut sys::ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    let Some(c) = channel(ch) else {
        return errno::fail(libc::EINVAL);
    };
    if cq_out.is_null() || ctx_out.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: fcntl on the channel's own fd.
    let flags = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) };
    let nonblocking = flags >= 0 && flags & libc::O_NONBLOCK != 0;
    loop {
        let fired = match nonblocking {
            true => c.inner.try_get_cq_event(),
            false => c.inner.get_cq_event(None),
        };
        let Some(fired) = fired else {
            return errno::fail(libc::EAGAIN);
        };
        let Some(&at) = c.cqs.lock().get(&fired.id()) else {
            continue; // destroyed since it fired
        };
        // SAFETY: registered CQs are live boxed SrCqs (removed before they are freed).
        let q = unsafe { &*(at as *const SrCq) };
        *q.unacked.lock() += 1;
        // SAFETY: the program passes room for the two pointers (checked non-NULL above).
        unsafe {
            *cq_out = q.as_ptr();
            *ctx_out = (*q.cq.get()).cq_context;
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_ack_cq_events(p: *mut sys::ibv_cq, n: u32) {
    if let Some(c) = cq(p) {
        let mut u = c.unacked.lock();
        *u = u.saturating_sub(u64::from(n));
        // rdma-core counts them in the struct the program can read.
        // SAFETY: our own struct, in a cell; the program only reads this field.
        unsafe {
            let f = &raw mut (*c.cq.get()).comp_events_completed;
            *f = (*f).wrapping_add(n);
        }
        if *u == 0 {
            c.acked.notify_all();
        }
    }
}

/// The `req_notify_cq` op.
pub(crate) unsafe extern "C" fn req_notify_cq(p: *mut sys::ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the op is reached through a CQ of ours (the program's promise, as with
    // rdma-core's providers, which do not check either).
    let c = unsafe { &*p.cast::<SrCq>() };
    c.inner.req_notify(solicited_only != 0);
    0
}

/// The `poll_cq` op: up to `n` completions into `wc`, without blocking or allocating.
pub(crate) unsafe extern "C" fn poll_cq(
    p: *mut sys::ibv_cq,
    n: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    if n < 0 || (n > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    // SAFETY: as for req_notify_cq.
    let c = unsafe { &*p.cast::<SrCq>() };
    let mut got = 0;
    // One drive of the transport per call, not one per completion taken.
    c.inner.poll_each(n as usize, |w| {
        // SAFETY: the program gave room for `n` entries; at most `n` are written.
        unsafe { wc.add(got).write(to_c(&w)) };
        got += 1;
    });
    got as c_int
}

// --- the extended CQ -------------------------------------------------------------------

/// What `ibv_create_cq_ex` may ask each completion to carry: the standard fields (time
/// stamps, VLANs, flow tags and tag matching are not softrdma's to give).
pub(crate) const WC_FLAGS: u64 = sys::IBV_WC_STANDARD_FLAGS as u64;

/// The context's `create_cq_ex` op (`ibv_create_cq_ex`): a CQ polled with `start_poll`,
/// `next_poll` and `end_poll` (and with `ibv_poll_cq` through `ibv_cq_ex_to_cq`).
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut sys::ibv_cq_ex {
    // SAFETY: the program's attributes, if any.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    let known = sys::IBV_CQ_INIT_ATTR_MASK_FLAGS | sys::IBV_CQ_INIT_ATTR_MASK_PD;
    let flags = sys::IBV_CREATE_CQ_ATTR_SINGLE_THREADED | sys::IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    let err = if a.comp_mask & !known != 0 {
        Some(libc::EINVAL)
    } else if a.wc_flags & !WC_FLAGS != 0
        || a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_PD != 0
        || (a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !flags != 0)
    {
        // Time stamps, parent domains, unknown flags: not ours to give.
        Some(libc::EOPNOTSUPP)
    } else {
        None
    };
    if let Some(e) = err {
        errno::set(e);
        return ptr::null_mut();
    }
    let cqe = c_int::try_from(a.cqe).unwrap_or(c_int::MAX);
    let comp_vector = c_int::try_from(a.comp_vector).unwrap_or(c_int::MAX);
    match create_cq(ctx, cqe, a.cq_context, a.channel, comp_vector) {
        Ok(p) => p.cast(),
        Err(e) => {
            errno::set(e);
            ptr::null_mut()
        }
    }
}

/// The CQ behind an extended CQ's op.
///
/// # Safety
/// `p` is a CQ of ours (the program's promise, as with rdma-core's providers).
unsafe fn ex<'a>(p: *mut sys::ibv_cq_ex) -> &'a SrCq {
    // SAFETY: the caller's promise; the extended CQ is the first field of a boxed SrCq.
    unsafe { &*p.cast::<SrCq>() }
}

/// Takes the next completion into `cur` and the CQ's `status` and `wr_id`; `ENOENT` if
/// there is none. The caller holds `polling`.
fn advance(c: &SrCq) -> c_int {
    let mut got = None;
    c.inner.poll_each(1, |w| got = Some(to_c(&w)));
    let Some(w) = got else {
        return libc::ENOENT;
    };
    // SAFETY: the poller's own fields, under `polling`; the program reads `status` and
    // `wr_id` only between its poll calls.
    unsafe {
        *c.cur.get() = w;
        (*c.cq.get()).status = w.status;
        (*c.cq.get()).wr_id = w.wr_id;
    }
    0
}

unsafe extern "C" fn start_poll(p: *mut sys::ibv_cq_ex, attr: *mut sys::ibv_poll_cq_attr) -> c_int {
    // SAFETY: the op's contract.
    let c = unsafe { ex(p) };
    // SAFETY: the program's attributes, if any.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    c.polling.lock();
    let r = advance(c);
    if r != 0 {
        // Nothing to poll: the program does not call end_poll.
        // SAFETY: locked just above, by this thread.
        unsafe { c.polling.unlock() };
    }
    r
}

unsafe extern "C" fn next_poll(p: *mut sys::ibv_cq_ex) -> c_int {
    // SAFETY: the op's contract (between start_poll and end_poll: `polling` is held).
    advance(unsafe { ex(p) })
}

unsafe extern "C" fn end_poll(p: *mut sys::ibv_cq_ex) {
    // SAFETY: the op's contract.
    let c = unsafe { ex(p) };
    if c.polling.is_locked() {
        // SAFETY: held since this thread's start_poll (the verbs' contract).
        unsafe { c.polling.unlock() };
    }
}

/// The current completion of an extended poll.
///
/// # Safety
/// As [`ex`], between `start_poll` and `end_poll`.
unsafe fn cur<'a>(p: *mut sys::ibv_cq_ex) -> &'a sys::ibv_wc {
    // SAFETY: the caller's promise.
    unsafe { &*ex(p).cur.get() }
}

unsafe extern "C" fn read_opcode(p: *mut sys::ibv_cq_ex) -> sys::ibv_wc_opcode {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.opcode
}

unsafe extern "C" fn read_vendor_err(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.vendor_err
}

unsafe extern "C" fn read_byte_len(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.byte_len
}

unsafe extern "C" fn read_imm_data(p: *mut sys::ibv_cq_ex) -> sys::__be32 {
    // SAFETY: the op's contract; both members of the union are 32-bit integers.
    unsafe { cur(p).__bindgen_anon_1.imm_data }
}

unsafe extern "C" fn read_qp_num(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.qp_num
}

unsafe extern "C" fn read_src_qp(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.src_qp
}

unsafe extern "C" fn read_wc_flags(p: *mut sys::ibv_cq_ex) -> core::ffi::c_uint {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.wc_flags
}

unsafe extern "C" fn read_slid(p: *mut sys::ibv_cq_ex) -> u32 {
    // SAFETY: the op's contract.
    u32::from(unsafe { cur(p) }.slid)
}

unsafe extern "C" fn read_sl(p: *mut sys::ibv_cq_ex) -> u8 {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.sl
}

unsafe extern "C" fn read_dlid_path_bits(p: *mut sys::ibv_cq_ex) -> u8 {
    // SAFETY: the op's contract.
    unsafe { cur(p) }.dlid_path_bits
}

/// A completion as `ibv_wc` has it.
pub(crate) fn to_c(w: &WorkCompletion) -> sys::ibv_wc {
    let status = match w.status {
        WcStatus::Success => sys::IBV_WC_SUCCESS,
        WcStatus::LocalLength => sys::IBV_WC_LOC_LEN_ERR,
        WcStatus::LocalProtection => sys::IBV_WC_LOC_PROT_ERR,
        WcStatus::LocalQpOperation => sys::IBV_WC_LOC_QP_OP_ERR,
        WcStatus::RemoteAccess => sys::IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOperation => sys::IBV_WC_REM_OP_ERR,
        WcStatus::RemoteInvalidRequest => sys::IBV_WC_REM_INV_REQ_ERR,
        WcStatus::WorkRequestFlushed => sys::IBV_WC_WR_FLUSH_ERR,
        WcStatus::Fatal => sys::IBV_WC_FATAL_ERR,
        WcStatus::RetryExceeded => sys::IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExceeded => sys::IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::BadResponse => sys::IBV_WC_BAD_RESP_ERR,
        WcStatus::MwBind => sys::IBV_WC_MW_BIND_ERR,
    };
    let opcode = match w.opcode {
        WcOpcode::Send => sys::IBV_WC_SEND,
        WcOpcode::RdmaWrite => sys::IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => sys::IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => sys::IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => sys::IBV_WC_FETCH_ADD,
        WcOpcode::Recv => sys::IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => sys::IBV_WC_RECV_RDMA_WITH_IMM,
        WcOpcode::LocalInv => sys::IBV_WC_LOCAL_INV,
        WcOpcode::BindMw => sys::IBV_WC_BIND_MW,
    };
    let mut flags = 0;
    let mut anon = sys::ibv_wc__bindgen_ty_1 { imm_data: 0 };
    if let Some(imm) = w.imm {
        flags |= sys::IBV_WC_WITH_IMM;
        anon.imm_data = imm.to_be();
    } else if let Some(k) = w.invalidated_key.filter(|_| w.flags.with_invalidate) {
        flags |= sys::IBV_WC_WITH_INV;
        anon.invalidated_rkey = k.0;
    }
    if w.flags.grh {
        flags |= sys::IBV_WC_GRH;
    }
    sys::ibv_wc {
        wr_id: w.wr_id,
        status,
        opcode,
        vendor_err: 0,
        byte_len: w.byte_len,
        __bindgen_anon_1: anon,
        qp_num: w.qp_num,
        src_qp: w.src_qp.unwrap_or(0),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}
