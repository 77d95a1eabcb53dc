//! Contexts: `ibv_open_device`, `ibv_close_device`, and what a context is asked about its
//! device, port, GIDs and P_Keys.
//!
//! A context is `[verbs_context … | ibv_context]` (rdma-core's extended context: the ops a
//! program finds at negative offsets from the `ibv_context` it holds), `abi_compat` set to
//! mark it extended, and its own state after it.

use core::ffi::{c_int, c_void};
use std::io::{PipeReader, PipeWriter};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;

use crate::device::{PORT, SrDevice, device_attr, gid_entry, port_attr};
use crate::errno;

use crate::live::Live;
use crate::sys;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;

/// A context as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrContext {
    vctx: sys::verbs_context,
    pub inner: softrdma::Context,
    pub dev: &'static SrDevice,
    /// GID index 0: the address this context's RoCE socket is bound to.
    pub gid: [u8; 16],
    /// Opened for the active side of librdmacm (see [`open`]).
    leave_loopback: bool,
    /// `async_fd` reads this pipe: it holds one octet while an event waits in `async_q`.
    async_rx: PipeReader,
    async_tx: PipeWriter,
    /// Asynchronous events not yet taken (`ibv_get_async_event`), oldest first.
    async_q: Mutex<std::collections::VecDeque<sys::ibv_async_event>>,
    async_cond: parking_lot::Condvar,
    _cmd: OwnedFd,
}

// SAFETY: the C half is written when the context is made, then read by the program; its
// `mutex` is the program's.
unsafe impl Send for SrContext {}
// SAFETY: as above.
unsafe impl Sync for SrContext {}

/// Live contexts, by the address programs hold.
static LIVE: Live = Live::new();

const CONTEXT_AT: usize =
    core::mem::offset_of!(SrContext, vctx) + core::mem::offset_of!(sys::verbs_context, context);

/// Ours, if `p` is a context `ibv_open_device` returned and `ibv_close_device` did not end.
pub(crate) fn context<'a>(p: *const sys::ibv_context) -> Option<&'a SrContext> {
    if !LIVE.contains(p) {
        return None;
    }
    // SAFETY: `p` is the `context` field of a live boxed SrContext (checked above).
    Some(unsafe { &*p.byte_sub(CONTEXT_AT).cast::<SrContext>() })
}

/// Opens a context on `d` whose ops are `ops` (`ibv_open_device`).
pub(crate) fn open(
    d: &'static SrDevice,
    ops: sys::ibv_context_ops,
    verbs_ops: impl FnOnce(&mut sys::verbs_context),
    leave_loopback: bool,
    dispatch: Dispatch,
) -> Result<*mut sys::ibv_context, c_int> {
    let inner = acquire(d, leave_loopback, dispatch)?;
    let gid = match inner.roce_gid() {
        Ok(g) => g,
        Err(_) => d.gid(),
    };
    let (rx, tx) = std::io::pipe().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let cmd = OwnedFd::from(std::fs::File::open("/dev/null").map_err(|_| libc::EMFILE)?);
    let mut vctx = sys::verbs_context {
        sz: core::mem::size_of::<sys::verbs_context>(),
        query_port: Some(query_port_op),
        query_device_ex: Some(query_device_ex_op),
        ..Default::default()
    };
    verbs_ops(&mut vctx);
    let c = &mut vctx.context;
    c.device = d.as_ptr();
    c.ops = ops;
    c.cmd_fd = cmd.as_raw_fd();
    c.async_fd = rx.as_raw_fd();
    c.num_comp_vectors = 1;
    // __VERBS_ABI_IS_EXTENDED: the verbs ops before the context are there.
    c.abi_compat = usize::MAX as *mut c_void;
    let b = Box::new(SrContext {
        vctx,
        inner,
        dev: d,
        gid,
        leave_loopback,
        async_rx: rx,
        async_tx: tx,
        async_q: Mutex::default(),
        async_cond: parking_lot::Condvar::new(),
        _cmd: cmd,
    });
    let raw = Box::into_raw(b);
    // SAFETY: `raw` is the box just made.
    let p = unsafe { &raw mut (*raw).vctx.context };
    LIVE.insert(p);
    Ok(p)
}

/// How many asynchronous events a context keeps for the program; the oldest goes first.
const ASYNC_EVENTS: usize = 1024;

impl SrContext {
    /// The pointer programs hold.
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        ptr::from_ref(&self.vctx.context).cast_mut()
    }

    /// Queues an asynchronous event for `ibv_get_async_event` (`async_fd` readable).
    pub(crate) fn post_async(&self, ev: sys::ibv_async_event) {
        let mut q = self.async_q.lock();
        if q.len() >= ASYNC_EVENTS {
            q.pop_front();
        }
        if q.is_empty() {
            // At most one octet sits in the pipe: this never blocks.
            let _ = std::io::Write::write_all(&mut &self.async_tx, &[1]);
        }
        q.push_back(ev);
        drop(q);
        self.async_cond.notify_all();
    }

    /// The next asynchronous event for `ibv_get_async_event`: waits for one unless the
    /// program made `async_fd` non-blocking (then `EAGAIN`).
    pub(crate) fn next_async(&self) -> Result<sys::ibv_async_event, c_int> {
        // SAFETY: fcntl on the context's own fd.
        let flags = unsafe { libc::fcntl(self.vctx.context.async_fd, libc::F_GETFL) };
        let nonblocking = flags >= 0 && flags & libc::O_NONBLOCK != 0;
        let mut q = self.async_q.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                if q.is_empty() {
                    let _ = std::io::Read::read(&mut &self.async_rx, &mut [0u8; 1]);
                }
                return Ok(ev);
            }
            if nonblocking {
                return Err(libc::EAGAIN);
            }
            self.async_cond.wait(&mut q);
        }
    }

    /// Whether this context shares the softrdma context that `key` names.
    pub(crate) fn on(&self, key: SharedKey) -> bool {
        (ptr::from_ref(self.dev) as usize, self.leave_loopback) == key
    }
}

/// The program's live contexts (a snapshot).
pub(crate) fn live_contexts() -> Vec<&'static SrContext> {
    LIVE.snapshot()
        .into_iter()
        .filter_map(|p| context(p as *const sys::ibv_context))
        .collect()
}

/// Which shared softrdma context: the device's address, and whether it leaves 127.0.0.1.
pub(crate) type SharedKey = (usize, bool);

/// Starts what hands a new shared context's asynchronous events to the program's contexts
/// on it; dropped (and so stopped) when the last of those closes.
pub(crate) type Dispatch = fn(softrdma::Context, SharedKey) -> Box<dyn Send>;

/// softrdma's contexts on each device, shared by the program's contexts on it (and
/// librdmacm's): one socket per device and process, as one kernel device serves every
/// context of a process. Counted; the last close closes it.
type Shared = Mutex<HashMap<SharedKey, (softrdma::Context, usize, Box<dyn Send>)>>;

fn shared() -> &'static Shared {
    static S: OnceLock<Shared> = OnceLock::new();
    S.get_or_init(Mutex::default)
}

fn acquire(
    d: &'static SrDevice,
    leave_loopback: bool,
    dispatch: Dispatch,
) -> Result<softrdma::Context, c_int> {
    let mut s = shared().lock();
    let key = (ptr::from_ref(d) as usize, leave_loopback);
    if let Some((c, n, _)) = s.get_mut(&key) {
        *n += 1;
        return Ok(c.clone());
    }
    let c = open_inner(d, leave_loopback)?;
    let events = dispatch(c.clone(), key);
    s.insert(key, (c.clone(), 1, events));
    Ok(c)
}

fn release(d: &'static SrDevice, leave_loopback: bool) {
    let key = (ptr::from_ref(d) as usize, leave_loopback);
    let gone = {
        let mut s = shared().lock();
        match s.get_mut(&key) {
            Some((_, n, _)) if *n > 1 => {
                *n -= 1;
                None
            }
            Some(_) => s.remove(&key),
            None => None,
        }
    };
    // Outside the lock: the dispatcher's thread is joined as it drops.
    drop(gone);
}

/// softrdma's context on `d`. A RoCE context binds its device's address and port 4791, so
/// on one host only one process at a time can have the loopback device's 127.0.0.1; the
/// others take another address of 127.0.0.0/8 (all of it is the loopback's), chosen from
/// the process id, and report it as their GID, which programs exchange to connect. One that
/// only connects out (`leave_loopback`: librdmacm's active side) takes another address at
/// once, leaving 127.0.0.1 to the servers its peers are told to reach.
fn open_inner(d: &SrDevice, leave_loopback: bool) -> Result<softrdma::Context, c_int> {
    let first = if leave_loopback && is_loopback_v4(d) {
        softrdma::Error::Unsupported("127.0.0.1 left to servers")
    } else {
        match d.inner.open() {
            Ok(c) => return Ok(c),
            Err(e) => e,
        }
    };
    let Some(cfg) = d
        .inner
        .roce_config()
        .filter(|c| c.addr == std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
    else {
        say_why(&first);
        return Err(libc::ENODEV);
    };
    let pid = std::process::id();
    for k in 0u32..64 {
        let h = crate::env::fnv1a(&[pid.to_le_bytes(), k.to_le_bytes()].concat());
        let [_, a, b, c] = (h as u32).to_be_bytes();
        let ip = std::net::Ipv4Addr::new(127, a.max(1), b, c.max(1));
        let mut alt = *cfg;
        alt.addr = ip.into();
        if let Ok(ctx) = softrdma::Device::roce(alt)
            .with_limits(d.inner.limits())
            .open()
        {
            return Ok(ctx);
        }
    }
    say_why(&first);
    Err(libc::ENODEV)
}

fn is_loopback_v4(d: &SrDevice) -> bool {
    d.inner
        .roce_config()
        .is_some_and(|c| c.addr == std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// Says why a device did not open, once, where a C program's user looks (rdma-core's
/// providers print to stderr too).
fn say_why(e: &softrdma::Error) {
    if std::env::var_os("SOFTRDMA_QUIET").is_none() {
        eprintln!("softrdma: cannot open the device: {e}");
    }
}

/// `ibv_close_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    if !LIVE.remove(ctx) {
        return libc::EINVAL;
    }
    // SAFETY: it was live, so it is the context field of a boxed SrContext, now ours alone.
    let c = unsafe { Box::from_raw(ctx.byte_sub(CONTEXT_AT).cast::<SrContext>()) };
    release(c.dev, c.leave_loopback);
    drop(c);
    0
}

/// `ibv_query_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_device(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program passes room for an ibv_device_attr.
    unsafe { attr.write(device_attr(c.dev)) };
    0
}

/// Copies `v` into the program's `len` octets at `out`, zeroing what its struct has beyond
/// ours (a newer program's fields we do not know).
///
/// # Safety
/// `out` points at `len` writable octets.
unsafe fn write_sized<T>(v: &T, out: *mut c_void, len: usize) {
    let n = len.min(core::mem::size_of::<T>());
    // SAFETY: `v` is `size_of::<T>()` octets; `out` has `len` (the caller's promise).
    unsafe {
        ptr::copy_nonoverlapping(ptr::from_ref(v).cast::<u8>(), out.cast::<u8>(), n);
        ptr::write_bytes(out.cast::<u8>().add(n), 0, len - n);
    }
}

/// The verbs op behind `ibv_query_device_ex`.
unsafe extern "C" fn query_device_ex_op(
    ctx: *mut sys::ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    // SAFETY: NULL or the program's input struct.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    let base = core::mem::offset_of!(sys::ibv_device_attr_ex, comp_mask) + 4;
    if attr.is_null() || attr_size < base {
        return libc::EINVAL;
    }
    let orig_attr = device_attr(c.dev);
    let a = sys::ibv_device_attr_ex {
        device_cap_flags_ex: u64::from(orig_attr.device_cap_flags),
        phys_port_cnt_ex: u32::from(PORT),
        orig_attr,
        ..Default::default()
    };
    // SAFETY: the program gave `attr_size` octets at `attr`.
    unsafe { write_sized(&a, attr.cast(), attr_size) };
    0
}

/// The verbs op behind `ibv_query_port` (rdma-core 44's macro calls it with its size).
unsafe extern "C" fn query_port_op(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut sys::ibv_port_attr,
    len: usize,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if port != PORT || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program gave `len` octets at `attr`.
    unsafe { write_sized(&port_attr(c.dev), attr.cast(), len) };
    0
}

/// `ibv_query_port` as exported: programs built without the verbs op path pass the old,
/// 48-octet `struct _compat_ibv_port_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_port(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut c_void,
) -> c_int {
    // SAFETY: the compat struct is the first 48 octets of ibv_port_attr.
    unsafe { query_port_op(ctx, port, attr.cast(), 48) }
}

/// `ibv_query_gid`: 0, or -1 for a port or index that has none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_gid(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut sys::ibv_gid,
) -> c_int {
    let Some(c) = context(ctx) else {
        return errno::fail(libc::EINVAL);
    };
    if port != PORT || index != 0 || gid.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program passes room for a GID.
    unsafe { (*gid).raw = c.gid };
    0
}

/// `_ibv_query_gid_ex` (`ibv_query_gid_ex`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr__ibv_query_gid_ex(
    ctx: *mut sys::ibv_context,
    port: u32,
    index: u32,
    entry: *mut sys::ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if flags != 0 || entry.is_null() || entry_size < core::mem::size_of::<sys::ibv_gid_entry>() {
        return libc::EINVAL;
    }
    if port != u32::from(PORT) {
        return libc::EINVAL;
    }
    if index != 0 {
        return libc::ENODATA;
    }
    // SAFETY: the program gave `entry_size` octets at `entry`.
    unsafe { write_sized(&gid_entry(c.dev, c.gid), entry.cast(), entry_size) };
    0
}

/// `_ibv_query_gid_table` (`ibv_query_gid_table`): entries written, or a negative errno.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr__ibv_query_gid_table(
    ctx: *mut sys::ibv_context,
    entries: *mut sys::ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let Some(c) = context(ctx) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0 || entry_size < core::mem::size_of::<sys::ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    if max_entries < 1 || entries.is_null() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: the program gave `max_entries` entries of `entry_size` octets.
    unsafe { write_sized(&gid_entry(c.dev, c.gid), entries.cast(), entry_size) };
    1
}

/// `ibv_query_gid_type` (rdma-core's private ABI, which `ibv_devinfo` calls): the sysfs
/// kind, 0 for IB/RoCE v1 and 1 for RoCE v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_gid_type(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    let Some(c) = context(ctx) else {
        return errno::fail(libc::EINVAL);
    };
    if port != PORT || index != 0 || ty.is_null() {
        return errno::fail(libc::EINVAL);
    }
    let v = u32::from(c.dev.gid_type() == sys::IBV_GID_TYPE_ROCE_V2);
    // SAFETY: the program passes room for the enum.
    unsafe { *ty = v };
    0
}

/// The one P_Key: the default, full membership.
const PKEY: u16 = 0xffff;

/// `ibv_query_pkey`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_pkey(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if context(ctx).is_none() || port != PORT || index != 0 || pkey.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program passes room for a __be16.
    unsafe { *pkey = PKEY.to_be() };
    0
}

/// `ibv_get_pkey_index`: the index of a P_Key (network order), or -1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_pkey_index(
    ctx: *mut sys::ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    if context(ctx).is_none() || port != PORT {
        return errno::fail(libc::EINVAL);
    }
    if u16::from_be(pkey) == PKEY {
        0
    } else {
        errno::fail(libc::ENOENT)
    }
}

/// `ibv_fork_init`: nothing to do; registered memory is not pinned.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_is_fork_initialized() -> sys::ibv_fork_status {
    sys::IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: as `ibv_fork_init`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_dontfork_range(_base: *mut c_void, _len: usize) -> c_int {
    0
}

/// `ibv_dofork_range`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_dofork_range(_base: *mut c_void, _len: usize) -> c_int {
    0
}
