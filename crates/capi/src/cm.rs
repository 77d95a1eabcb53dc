//! librdmacm over softrdma's connection manager: event channels with a pollable fd, ids,
//! address and route resolution, listen / connect / accept / reject / disconnect, and
//! `rdma_create_qp`. Over iWARP the connection is MPA's (RFC 5044), over RoCE the IB CM's on
//! QP1 with librdmacm's conventions, both as softrdma's `Listener` and `Qp::connect` run
//! them; calls that wait for the peer run on a thread of their own and answer with an event,
//! as librdmacm's do through the kernel.
//!
//! Which device an address is on: `$SOFTRDMA_TRANSPORT` (`iwarp`, the default, or `roce`,
//! which `softrdma run --transport` sets): the iWARP device reaches any address, a RoCE
//! device is the one of the local address the route leaves from.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use softrdma::{AcceptParams, ConnRequest, ConnectParams, Listener, Transport};

use crate::context::{SrContext, context};
use crate::device::SrDevice;
use crate::errno;
use crate::live::Live;
use crate::stop::Stop;
use crate::sys;

/// The environment variable that picks the transport of librdmacm's connections.
pub const TRANSPORT_VAR: &str = "SOFTRDMA_TRANSPORT";

// --- event channels ---------------------------------------------------------------------

/// An event channel as librdmacm lays it out (`fd` first), its queue behind it. The fd is
/// a pipe holding one octet while an event waits, so `poll` says readable exactly then.
#[repr(C)]
pub struct SrEventChannel {
    ch: sys::rdma_event_channel,
    q: Mutex<VecDeque<usize>>,
    cond: Condvar,
    rx: PipeReader,
    tx: PipeWriter,
    /// Ids reporting here: the channel cannot go before them.
    ids: std::sync::atomic::AtomicU32,
}

static CHANNELS: Live = Live::new();

/// Destroyed channels, by address, and whether each was non-blocking then; an address
/// leaves when a new channel takes it.
static GONE: Mutex<Option<HashMap<usize, bool>>> = Mutex::new(None);

/// How many destroyed channels [`GONE`] remembers (the allocator gives their addresses to
/// new ones, which take them out).
const MAX_GONE: usize = 4096;

/// A live channel with a reference of the caller's own: its memory outlives a destroy
/// meanwhile ([`sr_rdma_get_cm_event`] blocks in it).
fn channel_held(p: *const sys::rdma_event_channel) -> Option<Arc<SrEventChannel>> {
    CHANNELS.while_live(p, || {
        let p = p.cast::<SrEventChannel>();
        // SAFETY: a live channel is an Arc's data (`Arc::into_raw` at its creation, whose
        // count the registry holds until destroy, which takes the lock held here).
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    })
}

fn channel<'a>(p: *const sys::rdma_event_channel) -> Option<&'a SrEventChannel> {
    // SAFETY: a live channel is the first field of an SrEventChannel the registry holds a
    // reference to (`Arc::into_raw`); callers that may race its destroy use `channel_held`.
    CHANNELS
        .contains(p)
        .then(|| unsafe { &*p.cast::<SrEventChannel>() })
}

impl SrEventChannel {
    fn push(&self, ev: Box<SrEvent>) {
        let mut q = self.q.lock();
        if q.is_empty() {
            // At most one octet sits in the pipe: this never blocks.
            let _ = (&self.tx).write_all(&[1]);
        }
        q.push_back(Box::into_raw(ev) as usize);
        drop(q);
        self.cond.notify_all();
    }

    /// Drops the queued events of id `p` (never reported: they go with it).
    fn forget(&self, p: *mut sys::rdma_cm_id) {
        let mut q = self.q.lock();
        let had = !q.is_empty();
        q.retain(|&e| {
            // SAFETY: queued events are boxed SrEvents nobody was handed.
            let mine = unsafe { (*(e as *const SrEvent)).ev.id } == p;
            if mine {
                // SAFETY: as above; taken out of the queue, so freed once.
                drop(unsafe { Box::from_raw(e as *mut SrEvent) });
            }
            !mine
        });
        if had && q.is_empty() {
            let _ = (&self.rx).read(&mut [0u8; 1]);
        }
    }

    /// Moves the queued events of id `p` to `to` (`rdma_migrate_id`), in their order.
    fn move_events(&self, p: *mut sys::rdma_cm_id, to: &SrEventChannel) {
        let mut q = self.q.lock();
        let had = !q.is_empty();
        let mut moved = Vec::new();
        q.retain(|&e| {
            // SAFETY: queued events are boxed SrEvents nobody was handed.
            let mine = unsafe { (*(e as *const SrEvent)).ev.id } == p;
            if mine {
                moved.push(e);
            }
            !mine
        });
        if had && q.is_empty() {
            let _ = (&self.rx).read(&mut [0u8; 1]);
        }
        drop(q);
        for e in moved {
            // SAFETY: taken out of this queue just above: boxed, and handed to `to` alone.
            to.push(unsafe { Box::from_raw(e as *mut SrEvent) });
        }
    }

    /// The next event; `None` at once when `nonblocking` and there is none.
    fn pop(&self, nonblocking: bool) -> Option<*mut SrEvent> {
        let mut q = self.q.lock();
        loop {
            if let Some(e) = q.pop_front() {
                if q.is_empty() {
                    let _ = (&self.rx).read(&mut [0u8; 1]);
                }
                return Some(e as *mut SrEvent);
            }
            if nonblocking {
                return None;
            }
            self.cond.wait(&mut q);
        }
    }
}

/// `rdma_create_event_channel`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_rdma_create_event_channel() -> *mut sys::rdma_event_channel {
    let Ok((rx, tx)) = std::io::pipe() else {
        errno::set(libc::EMFILE);
        return ptr::null_mut();
    };
    let b = Arc::new(SrEventChannel {
        ch: sys::rdma_event_channel { fd: rx.as_raw_fd() },
        q: Mutex::default(),
        cond: Condvar::new(),
        rx,
        tx,
        ids: std::sync::atomic::AtomicU32::new(0),
    });
    let p = Arc::into_raw(b)
        .cast::<sys::rdma_event_channel>()
        .cast_mut();
    if let Some(g) = GONE.lock().as_mut() {
        g.remove(&(p as usize));
    }
    CHANNELS.insert(p);
    p
}

/// `rdma_destroy_event_channel` (librdmacm leaves it to the program not to destroy a
/// channel its ids still use; here such a channel is kept).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_destroy_event_channel(p: *mut sys::rdma_event_channel) {
    let Some(c) = channel(p) else {
        return;
    };
    if c.ids.load(Ordering::Acquire) > 0 {
        return;
    }
    // SAFETY: fcntl on the channel's own fd, open until the last reference goes.
    let flags = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) };
    if !CHANNELS.remove(p) {
        return;
    }
    {
        let mut g = GONE.lock();
        let g = g.get_or_insert_with(HashMap::new);
        if g.len() >= MAX_GONE
            && let Some(&old) = g.keys().next()
        {
            g.remove(&old);
        }
        g.insert(p as usize, flags >= 0 && flags & libc::O_NONBLOCK != 0);
    }
    for e in c.q.lock().drain(..) {
        // SAFETY: queued events are boxed SrEvents nobody was handed.
        drop(unsafe { Box::from_raw(e as *mut SrEvent) });
    }
    // SAFETY: the registry's reference, given up once (the removal above succeeded). A
    // thread blocked in `rdma_get_cm_event` holds its own and keeps the memory.
    drop(unsafe { Arc::from_raw(p.cast::<SrEventChannel>()) });
}

// --- events -----------------------------------------------------------------------------

/// An event as librdmacm lays it out, with the private data it points at.
#[repr(C)]
struct SrEvent {
    ev: sys::rdma_cm_event,
    private: Vec<u8>,
}

/// What an event carries besides its kind.
#[derive(Default)]
struct Conn {
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    qp_num: u32,
    /// A UD peer found (`param.ud`): its address, QP number and Q_Key.
    ud: Option<(IpAddr, u32, u32)>,
}

// --- ids --------------------------------------------------------------------------------

/// An id's state that its threads share with the program's calls.
#[derive(Default)]
struct IdState {
    ctx: Option<&'static SrContext>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    /// A connection request waiting for `rdma_accept` or `rdma_reject`.
    req: Option<ConnRequest>,
    /// Events handed out and not yet acknowledged: `rdma_destroy_id` waits for them.
    unacked: u32,
    /// Set when the connection ended (`DISCONNECTED` delivered once).
    disconnected: bool,
}

/// An id as librdmacm lays it out, with its state behind it.
#[repr(C)]
pub struct SrCmId {
    /// What the program reads; written by this library as the id moves on (before the
    /// event or return that says so), hence a cell.
    id: std::cell::UnsafeCell<sys::rdma_cm_id>,
    /// Its channel, and whether the id is synchronous (made without a channel: the
    /// channel is the id's own, and each call that asks the peer returns once its event is
    /// in, `id.event`). `rdma_migrate_id` changes both, under the live-id lock that every
    /// event is posted under.
    chan: Mutex<(&'static SrEventChannel, bool)>,
    st: Mutex<IdState>,
    acked: Condvar,
    /// Stops the listener's thread, at once (it waits on this and on the listener).
    stop: Arc<Stop>,
    listener: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// `rdma_create_ep` on a passive id: the QP each request's id gets in
    /// `rdma_get_request`.
    ep_attr: Mutex<Option<QpInit>>,
}

/// A program's `ibv_qp_init_attr`, kept for `rdma_get_request`.
struct QpInit(sys::ibv_qp_init_attr);

// SAFETY: the attributes' pointers are the program's objects, only handed back to its
// own calls (`rdma_create_qp`).
unsafe impl Send for QpInit {}

impl SrCmId {
    /// Its channel now.
    fn chan(&self) -> &'static SrEventChannel {
        self.chan.lock().0
    }

    /// Whether it is synchronous now.
    fn sync(&self) -> bool {
        self.chan.lock().1
    }

    /// Acknowledges the event a synchronous call kept in `id.event`, if any.
    fn ack_kept(&self) {
        // SAFETY: our own struct; the event kept is one this library handed out and
        // nobody acknowledged.
        unsafe {
            let kept = std::mem::replace(&mut (*self.c()).event, ptr::null_mut());
            if !kept.is_null() {
                sr_rdma_ack_cm_event(kept);
            }
        }
    }

    /// The C id, to read or write a field (the program reads it only between our calls
    /// and events, as librdmacm's contract has it).
    fn c(&self) -> *mut sys::rdma_cm_id {
        self.id.get()
    }
}

/// Live ids. Every event is posted under this lock, and an id leaves it before it is
/// freed, so no event ever names a freed id.
fn ids() -> &'static Mutex<HashSet<usize>> {
    static IDS: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    IDS.get_or_init(Mutex::default)
}

fn id<'a>(p: *const sys::rdma_cm_id) -> Option<&'a SrCmId> {
    // SAFETY: a live id is the first field of a boxed SrCmId.
    ids()
        .lock()
        .contains(&(p as usize))
        .then(|| unsafe { &*p.cast::<SrCmId>() })
}

/// `$SOFTRDMA_CM_TRACE` set: each event posted is said on standard error (which id, what,
/// the status), for a user finding out what a program and its peer did.
fn trace(what: std::fmt::Arguments<'_>) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("SOFTRDMA_CM_TRACE").is_some()) {
        // CLOCK_MONOTONIC, the same in every process: what took long, and which side of a
        // connection came first, shows.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a timespec of ours to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        eprintln!("softrdma cm {}.{:06}: {what}", ts.tv_sec, ts.tv_nsec / 1000);
    }
}

/// Posts `kind` for id `p` (and `listen`, for a connection request) if it still exists.
fn post(p: usize, listen: usize, kind: sys::rdma_cm_event_type, status: c_int, conn: Conn) {
    // SAFETY: the name of an event kind is a static C string.
    let name = unsafe { std::ffi::CStr::from_ptr(crate::strs::sr_rdma_event_str(kind as c_int)) };
    trace(format_args!(
        "id {p:#x}: {} status {status}",
        name.to_string_lossy()
    ));
    let live = ids().lock();
    if !live.contains(&p) {
        return;
    }
    // SAFETY: live (checked under the lock that destroy_id takes to remove it).
    let i = unsafe { &*(p as *const SrCmId) };
    // A connection request is the listener's event (its child may have a channel of its
    // own).
    let chan = match listen != 0 && live.contains(&listen) {
        // SAFETY: as above.
        true => unsafe { &*(listen as *const SrCmId) }.chan(),
        false => i.chan(),
    };
    if kind == sys::RDMA_CM_EVENT_DISCONNECTED {
        let mut st = i.st.lock();
        if st.disconnected {
            return;
        }
        st.disconnected = true;
    }
    let mut e = Box::new(SrEvent {
        ev: sys::rdma_cm_event {
            id: p as *mut sys::rdma_cm_id,
            listen_id: listen as *mut sys::rdma_cm_id,
            event: kind,
            status,
            ..Default::default()
        },
        private: conn.private,
    });
    let len = u8::try_from(e.private.len()).unwrap_or(u8::MAX);
    let private_data = if e.private.is_empty() {
        ptr::null()
    } else {
        e.private.as_ptr().cast()
    };
    if let Some((ip, qp_num, qkey)) = conn.ud {
        e.ev.param.ud = sys::rdma_ud_param {
            private_data,
            private_data_len: len,
            ah_attr: crate::ah::ah_attr_to(ip, crate::device::PORT, 64),
            qp_num,
            qkey,
        };
        chan.push(e);
        return;
    }
    e.ev.param.conn = sys::rdma_conn_param {
        private_data: if e.private.is_empty() {
            ptr::null()
        } else {
            e.private.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: conn.responder_resources,
        initiator_depth: conn.initiator_depth,
        qp_num: conn.qp_num,
        ..Default::default()
    };
    chan.push(e);
}

fn new_id(
    chan: &'static SrEventChannel,
    context: *mut c_void,
    ps: sys::rdma_port_space,
    qp_type: sys::ibv_qp_type,
    sync: bool,
) -> *mut SrCmId {
    chan.ids.fetch_add(1, Ordering::AcqRel);
    let b = Box::new(SrCmId {
        id: std::cell::UnsafeCell::new(sys::rdma_cm_id {
            channel: ptr::from_ref(&chan.ch).cast_mut(),
            context,
            ps,
            port_num: crate::device::PORT,
            qp_type,
            ..Default::default()
        }),
        chan: Mutex::new((chan, sync)),
        st: Mutex::default(),
        acked: Condvar::new(),
        stop: Arc::new(Stop::default()),
        listener: Mutex::new(None),
        ep_attr: Mutex::new(None),
    });
    let p = Box::into_raw(b);
    ids().lock().insert(p as usize);
    p
}

/// `rdma_create_id`. With a NULL channel the id is synchronous (librdmacm's mode): it gets
/// a channel of its own, and the calls that wait for an event return with it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_create_id(
    ch: *mut sys::rdma_event_channel,
    out: *mut *mut sys::rdma_cm_id,
    context: *mut c_void,
    ps: sys::rdma_port_space,
) -> c_int {
    let qp_type = match ps {
        sys::RDMA_PS_TCP => sys::IBV_QPT_RC,
        sys::RDMA_PS_UDP => sys::IBV_QPT_UD,
        _ => return errno::fail(libc::EINVAL),
    };
    if out.is_null() {
        return errno::fail(libc::EINVAL);
    }
    let sync = ch.is_null();
    let Some(chan) = (match sync {
        true => own_channel(),
        false => channel(ch),
    }) else {
        return errno::fail(if sync { libc::EMFILE } else { libc::EINVAL });
    };
    // SAFETY: a live channel lives until destroyed, which waits for its ids.
    let chan: &'static SrEventChannel = unsafe { &*ptr::from_ref(chan) };
    let p = new_id(chan, context, ps, qp_type, sync);
    trace(format_args!("id {:#x}: created", p as usize));
    // SAFETY: the program's out-pointer (checked non-NULL).
    unsafe { *out = p.cast() };
    0
}

/// `rdma_destroy_id`: waits until every event reported on it is acknowledged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_destroy_id(p: *mut sys::rdma_cm_id) -> c_int {
    trace(format_args!("id {:#x}: destroyed", p as usize));
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    // The event a synchronous call kept (librdmacm acknowledges it here too).
    i.ack_kept();
    i.stop.set();
    if let Some(h) = i.listener.lock().take() {
        let _ = h.join();
    }
    {
        let mut st = i.st.lock();
        while st.unacked > 0 {
            i.acked.wait(&mut st);
        }
    }
    {
        let mut live = ids().lock();
        live.remove(&(p as usize));
        // Events never reported go with it.
        i.chan().forget(p);
    }
    let (chan, sync) = *i.chan.lock();
    chan.ids.fetch_sub(1, Ordering::AcqRel);
    let own = sync.then_some(chan);
    // SAFETY: it was live and no thread posts to it any more: ours alone.
    drop(unsafe { Box::from_raw(p.cast::<SrCmId>()) });
    if let Some(c) = own {
        // SAFETY: the id's own channel, which nothing else reports to.
        unsafe { sr_rdma_destroy_event_channel(ptr::from_ref(&c.ch).cast_mut()) };
    }
    0
}

/// `rdma_migrate_id`: the id, and its events not yet reported, move to channel `ch` (NULL:
/// a channel of its own, the id synchronous from then on); first every event it reported
/// must be acknowledged (librdmacm waits for that too). A synchronous id's own channel goes,
/// with the event it kept.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_migrate_id(
    p: *mut sys::rdma_cm_id,
    ch: *mut sys::rdma_event_channel,
) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    let was_sync = i.sync();
    let sync = ch.is_null();
    if sync && was_sync {
        return errno::fail(libc::EINVAL);
    }
    let Some(to) = (match sync {
        true => own_channel(),
        false => channel(ch),
    }) else {
        return errno::fail(if sync { libc::EMFILE } else { libc::EINVAL });
    };
    // SAFETY: a live channel lives until destroyed, which waits for its ids.
    let to: &'static SrEventChannel = unsafe { &*ptr::from_ref(to) };
    if was_sync {
        i.ack_kept();
    }
    {
        let mut st = i.st.lock();
        while st.unacked > 0 {
            i.acked.wait(&mut st);
        }
    }
    let from = {
        // Under the live-id lock, as every event is posted: none lands on the old channel
        // once the queued ones have moved.
        let _live = ids().lock();
        let mut c = i.chan.lock();
        let from = c.0;
        from.move_events(p, to);
        to.ids.fetch_add(1, Ordering::AcqRel);
        from.ids.fetch_sub(1, Ordering::AcqRel);
        *c = (to, sync);
        // SAFETY: our own struct; the program reads `channel` once the call returned.
        unsafe { (*i.c()).channel = ptr::from_ref(&to.ch).cast_mut() };
        from
    };
    if was_sync {
        // SAFETY: the id's own channel, which nothing reports to any more.
        unsafe { sr_rdma_destroy_event_channel(ptr::from_ref(&from.ch).cast_mut()) };
    }
    0
}

/// A channel of a synchronous id's own.
fn own_channel() -> Option<&'static SrEventChannel> {
    let ch = sr_rdma_create_event_channel();
    channel(ch)
}

/// librdmacm's `ucma_complete`: a synchronous id's call waits for its event, keeps it in
/// `id.event` (acknowledging the one kept before) and fails with the event's status.
fn complete(i: &SrCmId) -> c_int {
    if !i.sync() {
        return 0;
    }
    let c = i.c();
    i.ack_kept();
    let mut ev = ptr::null_mut();
    // SAFETY: the id's own channel, live while the id is.
    if unsafe { sr_rdma_get_cm_event(ptr::from_ref(&i.chan().ch).cast_mut(), &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: our own struct; the event just handed out.
    let (kind, status) = unsafe {
        (*c).event = ev;
        ((*ev).event, (*ev).status)
    };
    match status {
        0 => 0,
        _ if kind == sys::RDMA_CM_EVENT_REJECTED => errno::fail(libc::ECONNREFUSED),
        s => errno::fail(s.saturating_abs()),
    }
}

/// `rdma_get_cm_event`: the next event, blocking unless the program made the channel's fd
/// non-blocking (then -1, `EAGAIN`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_get_cm_event(
    ch: *mut sys::rdma_event_channel,
    out: *mut *mut sys::rdma_cm_event,
) -> c_int {
    if out.is_null() {
        return errno::fail(libc::EINVAL);
    }
    let Some(c) = channel_held(ch) else {
        return gone(ch);
    };
    // SAFETY: fcntl on the channel's own fd.
    let flags = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) };
    let nonblocking = flags >= 0 && flags & libc::O_NONBLOCK != 0;
    match c.pop(nonblocking) {
        Some(e) => {
            // Reported now: its id cannot be destroyed before the program acknowledges it
            // (events still queued go with the id, as librdmacm's do).
            // SAFETY: a queued event is a boxed SrEvent; its id is live (destroy_id takes
            // its events out of the queue before the id goes).
            let ev_id = unsafe { (*e).ev.id };
            if let Some(i) = id(ev_id) {
                i.st.lock().unacked += 1;
            }
            // SAFETY: the program's out-pointer; the event's first field is the C event.
            unsafe { *out = e.cast() };
            0
        }
        None => errno::fail(libc::EAGAIN),
    }
}

/// `rdma_get_cm_event` on a channel that is no more. librdmacm reads the channel's fd: a
/// thread already blocked there stays blocked through the destroy (the kernel holds the
/// file while a read waits), one that comes after fails on the closed fd. Here one that
/// comes just after waits as well (until the process ends), unless the channel was
/// non-blocking: a program whose event thread loops back to the channel while the main
/// thread tears down — rping up to rdma-core 44 — would otherwise fail or pass on which
/// thread ran first. Never a channel: `EINVAL`.
fn gone(ch: *const sys::rdma_event_channel) -> c_int {
    let nonblocking = GONE
        .lock()
        .as_ref()
        .and_then(|g| g.get(&(ch as usize)).copied());
    match nonblocking {
        None => errno::fail(libc::EINVAL),
        Some(true) => errno::fail(libc::EBADF),
        Some(false) => loop {
            std::thread::park();
        },
    }
}

/// `rdma_ack_cm_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_ack_cm_event(e: *mut sys::rdma_cm_event) -> c_int {
    if e.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: an event this library handed out (the program's promise, as librdmacm's).
    let ev = unsafe { Box::from_raw(e.cast::<SrEvent>()) };
    if let Some(i) = id(ev.ev.id) {
        let mut st = i.st.lock();
        st.unacked = st.unacked.saturating_sub(1);
        if st.unacked == 0 {
            i.acked.notify_all();
        }
    }
    0
}

// --- addresses --------------------------------------------------------------------------

/// A C socket address as Rust's (IPv4 and IPv6 only).
///
/// # Safety
/// `a` is NULL or points at a socket address as long as its family says.
unsafe fn sockaddr(a: *const sys::sockaddr) -> Option<SocketAddr> {
    if a.is_null() {
        return None;
    }
    // SAFETY: the family field is first in every socket address.
    match unsafe { (*a).sa_family } as c_int {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let s = unsafe { ptr::read_unaligned(a.cast::<libc::sockaddr_in>()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(s.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let s = unsafe { ptr::read_unaligned(a.cast::<libc::sockaddr_in6>()) };
            let ip = std::net::Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(s.sin6_port)))
        }
        _ => None,
    }
}

/// Writes `a` into a C address union's storage.
fn set_storage(dst: &mut sys::sockaddr_storage, a: SocketAddr) {
    let sa = socket2::SockAddr::from(a);
    let n = (sa.len() as usize).min(size_of::<sys::sockaddr_storage>());
    // SAFETY: both are plain octets; `n` fits both.
    unsafe {
        ptr::write_bytes(
            ptr::from_mut(dst).cast::<u8>(),
            0,
            size_of::<sys::sockaddr_storage>(),
        );
        ptr::copy_nonoverlapping(sa.as_ptr().cast::<u8>(), ptr::from_mut(dst).cast::<u8>(), n);
    }
}

fn set_addrs(i: &SrCmId, local: Option<SocketAddr>, peer: Option<SocketAddr>) {
    // SAFETY: our own struct, in a cell; the program reads these addresses once the event
    // or call that says they are set has returned.
    let a = unsafe { &mut (*i.c()).route.addr };
    if let Some(l) = local {
        // SAFETY: writing the storage member of the union.
        set_storage(unsafe { &mut a.__bindgen_anon_1.src_storage }, l);
    }
    if let Some(p) = peer {
        // SAFETY: as above.
        set_storage(unsafe { &mut a.__bindgen_anon_2.dst_storage }, p);
    }
}

/// The port of an id's address (network order, as librdmacm gives it): 0 for none, or for
/// a pointer that is no id of ours.
fn port_of(p: *mut sys::rdma_cm_id, src: bool) -> u16 {
    let Some(i) = id(p) else {
        return 0;
    };
    // SAFETY: our own struct; the storage members of the unions, which set_addrs writes.
    let s = unsafe {
        let a = &(*i.c()).route.addr;
        match src {
            true => &a.__bindgen_anon_1.src_storage,
            false => &a.__bindgen_anon_2.dst_storage,
        }
    };
    match c_int::from(s.ss_family) {
        // SAFETY: the family says which address the storage holds; it is large and
        // aligned enough for either.
        libc::AF_INET => unsafe { (*(&raw const *s).cast::<libc::sockaddr_in>()).sin_port },
        // SAFETY: as above.
        libc::AF_INET6 => unsafe { (*(&raw const *s).cast::<libc::sockaddr_in6>()).sin6_port },
        _ => 0,
    }
}

/// `rdma_get_src_port`: the local port, network order.
#[unsafe(no_mangle)]
pub extern "C" fn sr_rdma_get_src_port(p: *mut sys::rdma_cm_id) -> u16 {
    port_of(p, true)
}

/// `rdma_get_dst_port`: the peer's port, network order.
#[unsafe(no_mangle)]
pub extern "C" fn sr_rdma_get_dst_port(p: *mut sys::rdma_cm_id) -> u16 {
    port_of(p, false)
}

/// The device a connection from local address `local` runs on.
fn device_for(local: IpAddr) -> Option<&'static SrDevice> {
    let roce = std::env::var(TRANSPORT_VAR).is_ok_and(|t| t.eq_ignore_ascii_case("roce"));
    let devs = crate::list::devices();
    if !roce {
        return devs
            .iter()
            .find(|d| d.inner.transport() == Transport::Iwarp);
    }
    let want = match local {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        other => other,
    };
    devs.iter()
        .find(|d| d.inner.roce_config().is_some_and(|c| c.addr == want))
}

/// The context librdmacm's ids share on `d` (one per device and process, as librdmacm's;
/// and one for the active side, which leaves the loopback's 127.0.0.1 to servers).
fn shared_context(d: &'static SrDevice, active: bool) -> Result<&'static SrContext, c_int> {
    static OPEN: OnceLock<Mutex<HashMap<(usize, bool), usize>>> = OnceLock::new();
    let mut open = OPEN.get_or_init(Mutex::default).lock();
    let key = (ptr::from_ref(d) as usize, active);
    let p = match open.get(&key) {
        Some(&p) => p as *mut sys::ibv_context,
        None => {
            let p = crate::ops::open_device(d, active)?;
            open.insert(key, p as usize);
            p
        }
    };
    context(p).ok_or(libc::ENODEV)
}

/// Puts `i` on the device of `local`: `active` for an id that connects out.
fn attach(i: &SrCmId, local: IpAddr, active: bool) -> Result<&'static SrContext, c_int> {
    let d = device_for(local).ok_or(libc::EADDRNOTAVAIL)?;
    let c = shared_context(d, active)?;
    i.st.lock().ctx = Some(c);
    let pd = default_pd(c);
    // SAFETY: our own struct; the program reads `verbs` and `pd` once the call or event
    // says so.
    unsafe {
        (*i.c()).verbs = c.as_ptr();
        if (*i.c()).pd.is_null() {
            (*i.c()).pd = pd;
        }
    }
    Ok(c)
}

/// `rdma_bind_addr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_bind_addr(
    p: *mut sys::rdma_cm_id,
    addr: *mut sys::sockaddr,
) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    // SAFETY: the program's address.
    let Some(a) = (unsafe { sockaddr(addr) }) else {
        return errno::fail(libc::EAFNOSUPPORT);
    };
    if let Err(e) = attach(i, a.ip(), false) {
        return errno::fail(e);
    }
    i.st.lock().local = Some(a);
    set_addrs(i, Some(a), None);
    0
}

/// `rdma_resolve_addr`: the local address is the one the route to `dst` leaves from (or
/// `src`); `ADDR_RESOLVED` follows at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_resolve_addr(
    p: *mut sys::rdma_cm_id,
    src: *mut sys::sockaddr,
    dst: *mut sys::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    trace(format_args!("id {:#x}: resolve_addr", p as usize));
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    // SAFETY: the program's addresses.
    let (src, dst) = unsafe { (sockaddr(src), sockaddr(dst)) };
    let Some(dst) = dst else {
        return errno::fail(libc::EINVAL);
    };
    let local = match src.or(i.st.lock().local) {
        Some(s) => s,
        None => match route_from(dst) {
            Some(ip) => SocketAddr::new(ip, 0),
            None => {
                post(
                    p as usize,
                    0,
                    sys::RDMA_CM_EVENT_ADDR_ERROR,
                    -libc::ENETUNREACH,
                    Conn::default(),
                );
                return complete(i);
            }
        },
    };
    if let Err(e) = attach(i, local.ip(), true) {
        return errno::fail(e);
    }
    {
        let mut st = i.st.lock();
        st.local = Some(local);
        st.peer = Some(dst);
    }
    set_addrs(i, Some(local), Some(dst));
    post(
        p as usize,
        0,
        sys::RDMA_CM_EVENT_ADDR_RESOLVED,
        0,
        Conn::default(),
    );
    complete(i)
}

/// The local address the kernel would send to `dst` from.
fn route_from(dst: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        SocketAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(dst).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// `rdma_resolve_route`: nothing to find beyond the address; `ROUTE_RESOLVED` at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_resolve_route(
    p: *mut sys::rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    if i.st.lock().peer.is_none() {
        return errno::fail(libc::EINVAL);
    }
    post(
        p as usize,
        0,
        sys::RDMA_CM_EVENT_ROUTE_RESOLVED,
        0,
        Conn::default(),
    );
    complete(i)
}

// --- QPs --------------------------------------------------------------------------------

/// The PD librdmacm's ids on `ctx` share (`id.pd` until a QP says otherwise), made once:
/// the shared contexts live for the process, and so does it.
fn default_pd(ctx: &SrContext) -> *mut sys::ibv_pd {
    static PDS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let mut pds = PDS.get_or_init(Mutex::default).lock();
    let key = ctx.as_ptr() as usize;
    if let Some(&pd) = pds.get(&key) {
        return pd as *mut sys::ibv_pd;
    }
    // SAFETY: a live context of ours.
    let pd = unsafe { crate::pd::sr_ibv_alloc_pd(ctx.as_ptr()) };
    if !pd.is_null() {
        pds.insert(key, pd as usize);
    }
    pd
}

/// `rdma_create_qp`: as `rdma_create_qp_ex` with `pd` (NULL: the id's); the attributes the
/// QP got are written back.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_create_qp(
    p: *mut sys::rdma_cm_id,
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    if attr.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program's attributes (checked non-NULL).
    let a = unsafe { &mut *attr };
    let mut ex = sys::ibv_qp_init_attr_ex {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
        comp_mask: sys::IBV_QP_INIT_ATTR_PD,
        // SAFETY: our own struct.
        pd: if pd.is_null() {
            unsafe { (*i.c()).pd }
        } else {
            pd
        },
        ..Default::default()
    };
    let r = create_qp_ex(i, &mut ex);
    a.send_cq = ex.send_cq;
    a.recv_cq = ex.recv_cq;
    a.srq = ex.srq;
    a.cap = ex.cap;
    r
}

/// `rdma_create_qp_ex`: a QP on the id's device, in the attributes' PD or the id's; a CQ
/// and completion channel of the id's own (`id.send_cq`, `id.recv_cq`) for each queue the
/// program gave none, as librdmacm makes them, sized by that queue.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_create_qp_ex(
    p: *mut sys::rdma_cm_id,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    if attr.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program's attributes (checked non-NULL).
    create_qp_ex(i, unsafe { &mut *attr })
}

fn create_qp_ex(i: &SrCmId, a: &mut sys::ibv_qp_init_attr_ex) -> c_int {
    let m = i.c();
    // SAFETY: our own struct (read).
    let (verbs, has_qp, id_pd) = unsafe { ((*m).verbs, !(*m).qp.is_null(), (*m).pd) };
    if verbs.is_null() || has_qp {
        return errno::fail(libc::EINVAL);
    }
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= sys::IBV_QP_INIT_ATTR_PD;
        a.pd = id_pd;
    }
    match crate::pd::pd(a.pd) {
        Some(pd) if pd.ctx.as_ptr() == verbs => {}
        _ => return errno::fail(libc::EINVAL),
    }
    // SAFETY: our own struct, written before the program reads it.
    unsafe {
        let made = if a.send_cq.is_null() && (*m).send_cq.is_null() {
            own_cq(
                verbs,
                a.cap.max_send_wr,
                &mut (*m).send_cq_channel,
                &mut (*m).send_cq,
            )
        } else {
            Ok(())
        }
        .and_then(|()| match a.recv_cq.is_null() && (*m).recv_cq.is_null() {
            true => own_cq(
                verbs,
                a.cap.max_recv_wr,
                &mut (*m).recv_cq_channel,
                &mut (*m).recv_cq,
            ),
            false => Ok(()),
        });
        if let Err(e) = made {
            destroy_own_cqs(m);
            return errno::fail(e);
        }
        if a.send_cq.is_null() {
            a.send_cq = (*m).send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = (*m).recv_cq;
        }
        if a.srq.is_null() {
            a.srq = (*m).srq;
        }
    }
    // SAFETY: the attributes, filled in; our own verbs op.
    let q = unsafe { crate::qp::create_qp_ex(verbs, a) };
    if q.is_null() {
        destroy_own_cqs(m);
        return -1;
    }
    if let Some(sq) = crate::qp::qp(q)
        && a.qp_type == sys::IBV_QPT_UD
        && let Err(e) = crate::qp::ready_ud(sq)
    {
        // SAFETY: the QP just made.
        unsafe { crate::qp::sr_ibv_destroy_qp(q) };
        destroy_own_cqs(m);
        return errno::fail(e);
    }
    // SAFETY: our own struct, written before the program reads it.
    unsafe {
        (*m).qp = q;
        (*m).pd = a.pd;
    }
    0
}

/// A completion channel and a CQ of `size` entries on it, for an id (librdmacm's
/// `ucma_create_cqs`).
///
/// # Safety
/// `verbs` is a live context; the out-pointers are the id's fields.
unsafe fn own_cq(
    verbs: *mut sys::ibv_context,
    size: u32,
    ch: &mut *mut sys::ibv_comp_channel,
    cq: &mut *mut sys::ibv_cq,
) -> Result<(), c_int> {
    // SAFETY: a live context (the caller's promise).
    let c = unsafe { crate::cq::sr_ibv_create_comp_channel(verbs) };
    if c.is_null() {
        return Err(errno::or(libc::ENOMEM));
    }
    *ch = c;
    let size = c_int::try_from(size.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: as above; the channel just made.
    let q = unsafe { crate::cq::sr_ibv_create_cq(verbs, size, ptr::null_mut(), c, 0) };
    if q.is_null() {
        return Err(errno::or(libc::EINVAL));
    }
    *cq = q;
    Ok(())
}

/// Destroys the CQs and channels this library made for id `m` (librdmacm's
/// `ucma_destroy_cqs`).
fn destroy_own_cqs(m: *mut sys::rdma_cm_id) {
    // SAFETY: our own struct; its CQ and channel fields are only ever ones `own_cq` made.
    unsafe {
        for cq in [&mut (*m).recv_cq, &mut (*m).send_cq] {
            let q = std::mem::replace(cq, ptr::null_mut());
            if !q.is_null() {
                crate::cq::sr_ibv_destroy_cq(q);
            }
        }
        for ch in [&mut (*m).recv_cq_channel, &mut (*m).send_cq_channel] {
            let c = std::mem::replace(ch, ptr::null_mut());
            if !c.is_null() {
                crate::cq::sr_ibv_destroy_comp_channel(c);
            }
        }
    }
}

/// `rdma_destroy_qp`: the id's QP, and the CQs made for it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_destroy_qp(p: *mut sys::rdma_cm_id) {
    if let Some(i) = id(p) {
        // SAFETY: our own struct; the QP this id made, if any.
        unsafe {
            let q = std::mem::replace(&mut (*i.c()).qp, ptr::null_mut());
            if !q.is_null() {
                crate::qp::sr_ibv_destroy_qp(q);
            }
        }
        destroy_own_cqs(i.c());
    }
}

/// `rdma_create_ep`: a synchronous id for `res` — passive (`RAI_PASSIVE`): bound to its
/// source address, `qp_init_attr` kept for the QP of each request `rdma_get_request`
/// returns; active: its address and route resolved and, with `qp_init_attr`, its QP made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_create_ep(
    out: *mut *mut sys::rdma_cm_id,
    res: *mut sys::rdma_addrinfo,
    pd: *mut sys::ibv_pd,
    qp_init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    if out.is_null() || res.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program's address information (checked non-NULL).
    let r = unsafe { &*res };
    let Ok(ps) = sys::rdma_port_space::try_from(r.ai_port_space) else {
        return errno::fail(libc::EINVAL);
    };
    let mut p = ptr::null_mut();
    // SAFETY: a NULL channel (synchronous), our own out-pointer.
    if unsafe { sr_rdma_create_id(ptr::null_mut(), &mut p, ptr::null_mut(), ps) } != 0 {
        return -1;
    }
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    // SAFETY: the program's attributes, if any.
    let attr = unsafe { qp_init_attr.as_mut() };
    let qp_type = sys::ibv_qp_type::try_from(r.ai_qp_type).unwrap_or(sys::IBV_QPT_RC);
    let r = if r.ai_flags & crate::addrinfo::RAI_PASSIVE != 0 {
        // SAFETY: as above, and our own id.
        let ret = unsafe { sr_rdma_bind_addr(p, r.ai_src_addr) };
        if ret == 0 {
            if !pd.is_null() {
                // SAFETY: our own struct.
                unsafe { (*i.c()).pd = pd };
            }
            if let Some(a) = attr {
                let mut a = *a;
                a.qp_type = qp_type;
                *i.ep_attr.lock() = Some(QpInit(a));
            }
        }
        ret
    } else {
        // SAFETY: as above.
        let mut ret = unsafe { sr_rdma_resolve_addr(p, r.ai_src_addr, r.ai_dst_addr, 2000) };
        if ret == 0 {
            // SAFETY: our own id.
            ret = unsafe { sr_rdma_resolve_route(p, 2000) };
        }
        if ret == 0
            && let Some(a) = attr
        {
            a.qp_type = qp_type;
            // SAFETY: our own id, the program's attributes.
            ret = unsafe { sr_rdma_create_qp(p, pd, a) };
        }
        ret
    };
    if r != 0 {
        let e = errno::get();
        // SAFETY: the id just made.
        unsafe { sr_rdma_destroy_ep(p) };
        return errno::fail(e);
    }
    // SAFETY: the program's out-pointer (checked non-NULL).
    unsafe { *out = p };
    0
}

/// `rdma_destroy_ep`: the id's QP (and CQs made for it), then the id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_destroy_ep(p: *mut sys::rdma_cm_id) {
    // SAFETY: our own calls; each checks the id.
    unsafe {
        sr_rdma_destroy_qp(p);
        sr_rdma_destroy_id(p);
    }
}

/// `rdma_get_request`: on a synchronous listening id, the next connection request's id,
/// with a QP if `rdma_create_ep` was given attributes (in its PD). The request's event is
/// kept in the new id's `event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_get_request(
    listen: *mut sys::rdma_cm_id,
    out: *mut *mut sys::rdma_cm_id,
) -> c_int {
    let Some(l) = id(listen) else {
        return errno::fail(libc::EINVAL);
    };
    if !l.sync() || out.is_null() {
        return errno::fail(libc::EINVAL);
    }
    let m = l.c();
    l.ack_kept();
    let mut ev = ptr::null_mut();
    // SAFETY: the listener's own channel.
    if unsafe { sr_rdma_get_cm_event(ptr::from_ref(&l.chan().ch).cast_mut(), &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: the event just handed out.
    let e = unsafe { &*ev };
    let fail = |err: c_int| {
        // SAFETY: our own struct: the event stays with the listener, as librdmacm's.
        unsafe { (*m).event = ev };
        errno::fail(err)
    };
    if e.event == sys::RDMA_CM_EVENT_REJECTED {
        return fail(libc::ECONNREFUSED);
    }
    if e.status != 0 {
        return fail(e.status.saturating_abs());
    }
    if e.event != sys::RDMA_CM_EVENT_CONNECT_REQUEST {
        return fail(libc::EINVAL);
    }
    let attr = l.ep_attr.lock().as_ref().map(|a| a.0);
    if let Some(mut a) = attr {
        // SAFETY: the request's id (live: its event is not acknowledged) and the
        // listener's PD.
        if unsafe { sr_rdma_create_qp(e.id, (*m).pd, &mut a) } != 0 {
            return fail(errno::get());
        }
    }
    // SAFETY: the program's out-pointer; the request's id.
    unsafe {
        *out = e.id;
        (*e.id).event = ev;
    }
    0
}

// --- connections ------------------------------------------------------------------------

/// `rdma_listen`: connection requests arrive as `CONNECT_REQUEST` events, each with a new
/// id of its own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_listen(p: *mut sys::rdma_cm_id, backlog: c_int) -> c_int {
    trace(format_args!("id {:#x}: listen", p as usize));
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    let (ctx, local) = {
        let st = i.st.lock();
        match (st.ctx, st.local) {
            (Some(c), Some(l)) => (c, l),
            _ => return errno::fail(libc::EINVAL),
        }
    };
    // A RoCE listener serves its context's address (a wildcard names it).
    let local = match ctx.inner.roce_local_addr() {
        Ok(r) if local.ip().is_unspecified() => SocketAddr::new(r.ip(), local.port()),
        _ => local,
    };
    // Linux siw's responder: in client-server mode its first FPDUs may follow the MPA Reply
    // without waiting for the initiator's (librdmacm's programs may have the passive side
    // send first, as cmatose does). Initiators that need the wait ask for peer-to-peer mode.
    let mut params = softrdma::ListenParams::default();
    params.iwarp.early_fpdus = true;
    if backlog > 0 {
        params.backlog = backlog as u32;
    }
    let l = match Listener::bind_with(&ctx.inner, local, params) {
        Ok(l) => l,
        Err(softrdma::Error::Io(e)) => {
            return errno::fail(e.raw_os_error().unwrap_or(libc::EADDRINUSE));
        }
        Err(_) => return errno::fail(libc::EADDRINUSE),
    };
    let bound = l.local_addr();
    trace(format_args!("id {:#x}: listening on {bound}", p as usize));
    i.st.lock().local = Some(bound);
    set_addrs(i, Some(bound), None);
    let stop = i.stop.clone();
    let listen_id = p as usize;
    // SAFETY: our own struct.
    let c_id = unsafe { &*i.c() };
    let (ctx_p, context_v, ps, qp_type) = (
        ctx.as_ptr() as usize,
        c_id.context as usize,
        c_id.ps,
        c_id.qp_type,
    );
    let h = std::thread::Builder::new()
        .name("softrdma-cm-listen".into())
        .spawn(move || {
            loop {
                // The next request, or the id's end (accepting is cancel-safe: a request
                // not taken stays with the listener, which goes with the thread).
                let next = futures_lite::future::block_on(futures_lite::future::or(
                    async { Some(l.accept_async().await) },
                    async {
                        stop.wait().await;
                        None
                    },
                ));
                let req = match next {
                    Some(Ok(r)) => r,
                    Some(Err(_)) => continue,
                    None => break,
                };
                // The listener's channel and mode now (it may have been migrated since it
                // listened). A synchronous listener's requests get ids of their own mode
                // and channel (librdmacm migrates them); the request itself goes to the
                // listener's.
                let Some((chan, sync)) = channel_of(listen_id) else {
                    let _ = req.reject(&[]);
                    break;
                };
                let child_chan = match sync {
                    true => match own_channel() {
                        Some(c) => c,
                        None => {
                            let _ = req.reject(&[]);
                            continue;
                        }
                    },
                    false => chan,
                };
                let child = new_id(child_chan, context_v as *mut c_void, ps, qp_type, sync);
                // SAFETY: the id just made; no event names it yet.
                let c = unsafe { &*child };
                let (ird, ord) = req.peer_ird_ord().unwrap_or((0, 0));
                let (la, pa) = (req.local_addr(), req.peer_addr());
                let conn = Conn {
                    private: req.private_data().to_vec(),
                    responder_resources: ird.min(255) as u8,
                    initiator_depth: ord.min(255) as u8,
                    qp_num: 0,
                    // A UD request (SIDR) says who asks in `param.ud`.
                    ud: (qp_type == sys::IBV_QPT_UD).then_some((pa.ip(), 0, 0)),
                };
                {
                    let mut st = c.st.lock();
                    st.ctx = context(ctx_p as *const sys::ibv_context);
                    st.local = Some(la);
                    st.peer = Some(pa);
                    st.req = Some(req);
                }
                // The device's shared PD, as librdmacm gives a request's id.
                let pd =
                    context(ctx_p as *const sys::ibv_context).map_or(ptr::null_mut(), default_pd);
                // SAFETY: our own struct, before the event hands it out.
                unsafe {
                    (*c.c()).verbs = ctx_p as *mut _;
                    (*c.c()).pd = pd;
                }
                set_addrs(c, Some(la), Some(pa));
                post(
                    child as usize,
                    listen_id,
                    sys::RDMA_CM_EVENT_CONNECT_REQUEST,
                    0,
                    conn,
                );
            }
        });
    match h {
        Ok(h) => {
            *i.listener.lock() = Some(h);
            0
        }
        Err(_) => errno::fail(libc::ENOMEM),
    }
}

/// The channel and mode of the live id `p` (`None` once destroyed).
fn channel_of(p: usize) -> Option<(&'static SrEventChannel, bool)> {
    let live = ids().lock();
    // SAFETY: live (checked under the lock that destroy_id takes to remove it).
    live.contains(&p)
        .then(|| *unsafe { &*(p as *const SrCmId) }.chan.lock())
}

/// The QP behind an id, if it made one.
fn id_qp(i: &SrCmId) -> Option<&'static crate::qp::SrQp> {
    // SAFETY: our own struct.
    crate::qp::qp(unsafe { (*i.c()).qp })
}

/// The id `p`, its QP, and the program's connection parameters (private data, responder
/// resources, initiator depth), for `rdma_connect` and `rdma_accept`.
fn id_qp_param<'a>(
    p: *mut sys::rdma_cm_id,
    param: *const sys::rdma_conn_param,
) -> Option<(&'a SrCmId, &'static crate::qp::SrQp, ConnParam)> {
    let i = id(p)?;
    let q = id_qp(i)?;
    Some((i, q, conn_param(param)))
}

/// Private data, responder resources (IRD), initiator depth (ORD).
type ConnParam = (Vec<u8>, u16, u16);

fn conn_param(c: *const sys::rdma_conn_param) -> ConnParam {
    if c.is_null() {
        return (Vec::new(), 16, 16);
    }
    // SAFETY: the program's parameters.
    let c = unsafe { &*c };
    let pd = match (c.private_data.is_null(), c.private_data_len) {
        (false, n) if n > 0 => {
            // SAFETY: `private_data_len` octets at `private_data`.
            unsafe { std::slice::from_raw_parts(c.private_data.cast::<u8>(), n as usize) }.to_vec()
        }
        _ => Vec::new(),
    };
    (
        pd,
        u16::from(c.responder_resources),
        u16::from(c.initiator_depth),
    )
}

fn established(p: usize, info: &softrdma::ConnectionInfo, qp_num: u32) {
    let ud = match info.detail {
        softrdma::ConnectionDetail::Roce {
            remote_qpn,
            remote_qkey,
            ..
        } if remote_qkey != 0 => Some((info.peer_addr.ip(), remote_qpn, remote_qkey)),
        _ => None,
    };
    let conn = Conn {
        private: info.peer_private_data.clone(),
        responder_resources: info.ird.min(255) as u8,
        initiator_depth: info.ord.min(255) as u8,
        qp_num,
        ud,
    };
    post(p, 0, sys::RDMA_CM_EVENT_ESTABLISHED, 0, conn);
}

/// `rdma_connect`: `ESTABLISHED`, `REJECTED` or `UNREACHABLE` follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_connect(
    p: *mut sys::rdma_cm_id,
    param: *mut sys::rdma_conn_param,
) -> c_int {
    let Some((i, q, (private_data, ird, ord))) = id_qp_param(p, param) else {
        return errno::fail(libc::EINVAL);
    };
    let Some(peer) = i.st.lock().peer else {
        return errno::fail(libc::EINVAL);
    };
    // Client-server mode, as Linux siw's initiator (module parameter peer_to_peer off): an
    // RTR would race siw's accept, which reads the socket again only once its RTR handler
    // is in place. A responder that sends first does so right after its Reply (siw's and
    // ours, above), which we take.
    let params = ConnectParams {
        private_data,
        ird,
        ord,
        iwarp: softrdma::iwarp::ConnectParams {
            p2p: false,
            ..Default::default()
        },
        ..ConnectParams::default()
    };
    let (pu, qn) = (p as usize, q.inner.qp_num());
    watch(i, qn);
    let qp = q.inner.clone();
    let started = in_background("softrdma-cm-connect", move || {
        match connect_retrying(&qp, peer, params) {
            Ok(info) => established(pu, &info, qn),
            Err(softrdma::Error::Rejected {
                reason,
                private_data,
            }) => {
                let conn = Conn {
                    private: private_data,
                    ..Conn::default()
                };
                // librdmacm's status: the IB CM's reason, or ECONNREFUSED over iWARP.
                let status = reason.map_or(libc::ECONNREFUSED, c_int::from);
                post(pu, 0, sys::RDMA_CM_EVENT_REJECTED, status, conn);
            }
            // Nobody listens (a TCP reset): rejected, as the kernel's iWARP CM says it.
            Err(softrdma::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                post(
                    pu,
                    0,
                    sys::RDMA_CM_EVENT_REJECTED,
                    -libc::ECONNREFUSED,
                    Conn::default(),
                )
            }
            Err(e) => {
                trace(format_args!("id {pu:#x}: connect failed: {e}"));
                post(
                    pu,
                    0,
                    sys::RDMA_CM_EVENT_UNREACHABLE,
                    -libc::ETIMEDOUT,
                    Conn::default(),
                )
            }
        }
    });
    match started {
        0 => complete(i),
        e => e,
    }
}

/// IB CM REJ reason 8, "invalid service ID": nobody listens on the port (IBA 12.6.7.2).
const REJ_INVALID_SERVICE_ID: u16 = 8;

/// How often a connect refused for want of a listener is tried again, and the first
/// pause (doubling).
const NO_LISTENER_RETRIES: u32 = 4;
const NO_LISTENER_PAUSE: Duration = Duration::from_millis(5);

/// Whether `e` says nobody listens on the peer's port: the IB CM's REJ (RoCE), a TCP reset
/// (iWARP).
fn nobody_listens(e: &softrdma::Error) -> bool {
    match e {
        softrdma::Error::Rejected { reason, .. } => *reason == Some(REJ_INVALID_SERVICE_ID),
        softrdma::Error::Io(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        _ => false,
    }
}

/// `qp.connect`, tried again over the next 75 ms while the peer answers that nobody
/// listens yet: programs that hand a server's rdma_cm a second connection right after the
/// first (perftest's `-R` connects its data QP as soon as its control exchange ends) race
/// the server's new `rdma_listen`, which the kernel's slower address and route resolution
/// lets them win. A port nobody listens on is reported that much later.
fn connect_retrying(
    qp: &softrdma::Qp,
    peer: SocketAddr,
    params: ConnectParams,
) -> Result<softrdma::ConnectionInfo, softrdma::Error> {
    let mut pause = NO_LISTENER_PAUSE;
    for _ in 0..NO_LISTENER_RETRIES {
        match qp.connect(peer, params.clone()) {
            Err(e) if nobody_listens(&e) => {
                std::thread::sleep(pause);
                pause *= 2;
            }
            r => return r,
        }
    }
    qp.connect(peer, params)
}

/// Runs `f` on a thread of its own (a call that waits for the peer answers with an event):
/// 0, or -1 with `ENOMEM` if no thread can be made.
fn in_background(name: &str, f: impl FnOnce() + Send + 'static) -> c_int {
    match std::thread::Builder::new().name(name.into()).spawn(f) {
        Ok(_) => 0,
        Err(_) => errno::fail(libc::ENOMEM),
    }
}

/// `rdma_accept`: `ESTABLISHED` follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_accept(
    p: *mut sys::rdma_cm_id,
    param: *mut sys::rdma_conn_param,
) -> c_int {
    let Some((i, q, (private_data, ird, ord))) = id_qp_param(p, param) else {
        return errno::fail(libc::EINVAL);
    };
    let Some(req) = i.st.lock().req.take() else {
        return errno::fail(libc::EINVAL);
    };
    let params = AcceptParams {
        private_data,
        ird,
        ord,
        ..AcceptParams::default()
    };
    let (pu, qn) = (p as usize, q.inner.qp_num());
    watch(i, qn);
    let qp = q.inner.clone();
    // librdmacm's passive side of a UD exchange (SIDR) hears nothing after its answer.
    // SAFETY: our own struct (read).
    let ud = unsafe { (*i.c()).qp_type } == sys::IBV_QPT_UD;
    let started = in_background("softrdma-cm-accept", move || {
        match req.accept(&qp, params) {
            Ok(_) if ud => {}
            Ok(info) => established(pu, &info, qn),
            Err(_) => post(
                pu,
                0,
                sys::RDMA_CM_EVENT_CONNECT_ERROR,
                -libc::ECONNABORTED,
                Conn::default(),
            ),
        }
    });
    // A UD answer has no event to wait for (librdmacm returns at once too).
    match started {
        0 if !ud => complete(i),
        e => e,
    }
}

/// `rdma_reject`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_reject(
    p: *mut sys::rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    let Some(req) = i.st.lock().req.take() else {
        return errno::fail(libc::EINVAL);
    };
    let data = match (private_data.is_null(), len) {
        (false, n) if n > 0 => {
            // SAFETY: `len` octets at `private_data`.
            unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), n as usize) }.to_vec()
        }
        _ => Vec::new(),
    };
    match req.reject(&data) {
        Ok(()) => 0,
        Err(_) => errno::fail(libc::EINVAL),
    }
}

/// `rdma_disconnect`: the peer and this side each get `DISCONNECTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_disconnect(p: *mut sys::rdma_cm_id) -> c_int {
    let Some(i) = id(p) else {
        return errno::fail(libc::EINVAL);
    };
    let was = i.st.lock().disconnected;
    if let Some(q) = id_qp(i) {
        let _ = q.inner.disconnect();
    }
    post(
        p as usize,
        0,
        sys::RDMA_CM_EVENT_DISCONNECTED,
        0,
        Conn::default(),
    );
    // A synchronous id waits for its DISCONNECTED, unless it was taken already (the peer's,
    // which a call of the program's consumed): then there is none to come.
    if was && i.chan().q.lock().is_empty() {
        return 0;
    }
    complete(i)
}

/// `rdma_establish` (RDMACM_1.2): for ids whose QP the program connected itself; softrdma's
/// are established by the time their event says so.
#[unsafe(no_mangle)]
pub extern "C" fn sr_rdma_establish(_p: *mut sys::rdma_cm_id) -> c_int {
    0
}

/// `rdma_set_option`: accepted and ignored (type of service, reuse address, ACK timeout:
/// nothing softrdma's connections take).
#[unsafe(no_mangle)]
pub extern "C" fn sr_rdma_set_option(
    _p: *mut sys::rdma_cm_id,
    _level: c_int,
    _name: c_int,
    _val: *mut c_void,
    _len: usize,
) -> c_int {
    0
}

// --- the peer's disconnect --------------------------------------------------------------

/// QP numbers of connected ids, per context: the context's `Disconnected` event is the
/// id's `DISCONNECTED`.
fn watched() -> &'static Mutex<HashMap<(usize, u32), usize>> {
    static W: OnceLock<Mutex<HashMap<(usize, u32), usize>>> = OnceLock::new();
    W.get_or_init(Mutex::default)
}

/// Routes the id's context's `Disconnected` for `qp_num` to the id (the context's events
/// come through [`disconnected`]).
fn watch(i: &SrCmId, qp_num: u32) {
    let Some(ctx) = i.st.lock().ctx else {
        return;
    };
    let key = ctx.as_ptr() as usize;
    crate::async_events::on_disconnected(disconnected);
    watched()
        .lock()
        .insert((key, qp_num), ptr::from_ref(i) as usize);
}

/// Context `ctx`'s QP `qp_num` was disconnected: its id hears `DISCONNECTED`.
fn disconnected(ctx: usize, qp_num: u32) {
    if let Some(id) = watched().lock().remove(&(ctx, qp_num)) {
        post(id, 0, sys::RDMA_CM_EVENT_DISCONNECTED, 0, Conn::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sin(ip: [u8; 4], port: u16) -> libc::sockaddr_in {
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(ip),
            },
            sin_zero: [0; 8],
        }
    }

    /// `rdma_get_cm_event` across `rdma_destroy_event_channel`: a thread blocked in it stays
    /// blocked, in memory that stays valid (its own reference); one that comes after on a
    /// blocking channel waits as well, on a non-blocking one fails with `EBADF`; a pointer
    /// that never was a channel gets `EINVAL`.
    #[test]
    fn a_destroyed_channel_keeps_its_waiters_waiting() {
        fn waiter(ch: usize) -> std::thread::JoinHandle<c_int> {
            std::thread::spawn(move || {
                let mut ev = ptr::null_mut();
                // SAFETY: a channel pointer this test made; `ev` is ours.
                unsafe { sr_rdma_get_cm_event(ch as *mut _, &mut ev) }
            })
        }
        let held = |ch: *mut sys::rdma_event_channel| {
            channel_held(ch).map_or(0, |c| Arc::strong_count(&c) - 1)
        };
        // SAFETY: this library's calls on objects it made.
        unsafe {
            let ch = sr_rdma_create_event_channel();
            let mine = channel_held(ch).unwrap();
            let blocked = waiter(ch as usize);
            // The waiter holds a reference once it is in the call.
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while held(ch) < 3 {
                assert!(std::time::Instant::now() < end, "the waiter never blocked");
                std::thread::yield_now();
            }
            sr_rdma_destroy_event_channel(ch);
            assert_eq!(Arc::strong_count(&mine), 2, "the registry's reference went");
            assert!(channel(ch).is_none());
            assert!(!blocked.is_finished(), "a blocked waiter returned");
            drop(mine);

            let nb = sr_rdma_create_event_channel();
            let fd = (*nb).fd;
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
            sr_rdma_destroy_event_channel(nb);
            let mut ev = ptr::null_mut();
            // A new channel may take the address of the first: only check if it did not.
            if nb != ch {
                assert_eq!(sr_rdma_get_cm_event(nb, &mut ev), -1);
                assert_eq!(errno::get(), libc::EBADF);
            }
            let never = ptr::from_mut(&mut ev).cast::<sys::rdma_event_channel>();
            assert_eq!(sr_rdma_get_cm_event(never, &mut ev), -1);
            assert_eq!(errno::get(), libc::EINVAL);
        }
    }

    fn readable(fd: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of ours; no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// `rdma_migrate_id`: an event not yet reported moves with the id to the new channel
    /// (the old one's fd goes quiet, the new one's readable); to no channel, the id turns
    /// synchronous; a synchronous id cannot go to no channel again.
    #[test]
    fn a_migrated_id_takes_its_events_along_and_may_turn_synchronous() {
        // SAFETY: this library's calls on objects it made, as librdmacm's callers make them.
        unsafe {
            let (a, b) = (
                sr_rdma_create_event_channel(),
                sr_rdma_create_event_channel(),
            );
            let mut p = ptr::null_mut();
            assert_eq!(
                sr_rdma_create_id(a, &mut p, ptr::null_mut(), sys::RDMA_PS_TCP),
                0
            );
            let mut dst = sin([127, 0, 0, 1], 9);
            assert_eq!(
                sr_rdma_resolve_addr(p, ptr::null_mut(), (&raw mut dst).cast(), 1000),
                0
            );
            assert!(readable((*a).fd) && !readable((*b).fd));
            assert_eq!(sr_rdma_migrate_id(p, b), 0);
            assert_eq!((*p).channel, b);
            assert!(!readable((*a).fd) && readable((*b).fd));
            let mut ev = ptr::null_mut();
            assert_eq!(sr_rdma_get_cm_event(b, &mut ev), 0);
            assert_eq!((*ev).event, sys::RDMA_CM_EVENT_ADDR_RESOLVED);
            assert_eq!((*ev).id, p);
            assert_eq!(sr_rdma_ack_cm_event(ev), 0);
            // To no channel: synchronous from then on.
            assert_eq!(sr_rdma_migrate_id(p, ptr::null_mut()), 0);
            assert!(!(*p).channel.is_null() && (*p).channel != b);
            assert_eq!(sr_rdma_resolve_route(p, 1000), 0);
            assert_eq!((*(*p).event).event, sys::RDMA_CM_EVENT_ROUTE_RESOLVED);
            assert_eq!(sr_rdma_migrate_id(p, ptr::null_mut()), -1);
            assert_eq!(crate::errno::get(), libc::EINVAL);
            assert_eq!(sr_rdma_destroy_id(p), 0);
            sr_rdma_destroy_event_channel(a);
            sr_rdma_destroy_event_channel(b);
        }
    }

    /// A listener migrated after `rdma_listen`: the requests that come afterwards, and the
    /// ids made for them, are on its new channel.
    #[test]
    fn a_migrated_listener_reports_requests_on_its_new_channel() {
        // SAFETY: this library's calls on objects it made, as librdmacm's callers make them.
        unsafe {
            let (a, b) = (
                sr_rdma_create_event_channel(),
                sr_rdma_create_event_channel(),
            );
            let mut l = ptr::null_mut();
            assert_eq!(
                sr_rdma_create_id(a, &mut l, ptr::null_mut(), sys::RDMA_PS_TCP),
                0
            );
            let mut at = sin([127, 0, 0, 1], 0);
            assert_eq!(sr_rdma_bind_addr(l, (&raw mut at).cast()), 0);
            assert_eq!(sr_rdma_listen(l, 4), 0);
            let port = u16::from_be(sr_rdma_get_src_port(l));
            assert_eq!(sr_rdma_migrate_id(l, b), 0);
            // A native iWARP client asks; the request is rejected below.
            let client = std::thread::spawn(move || {
                let ctx = softrdma::Device::tcp().open().unwrap();
                let cq = ctx.create_cq(4, None).unwrap();
                let qp = ctx
                    .alloc_pd()
                    .create_qp(softrdma::QpInitAttr::new(&cq, &cq))
                    .unwrap();
                qp.connect(("127.0.0.1", port), ConnectParams::default())
            });
            let mut ev = ptr::null_mut();
            assert_eq!(sr_rdma_get_cm_event(b, &mut ev), 0, "on the new channel");
            assert_eq!((*ev).event, sys::RDMA_CM_EVENT_CONNECT_REQUEST);
            assert_eq!((*ev).listen_id, l);
            let child = (*ev).id;
            assert_eq!((*child).channel, b, "the request's id too");
            assert!(!readable((*a).fd));
            assert_eq!(sr_rdma_reject(child, ptr::null(), 0), 0);
            assert_eq!(sr_rdma_ack_cm_event(ev), 0);
            assert!(client.join().unwrap().is_err(), "rejected");
            assert_eq!(sr_rdma_destroy_id(child), 0);
            assert_eq!(sr_rdma_destroy_id(l), 0);
            sr_rdma_destroy_event_channel(a);
            sr_rdma_destroy_event_channel(b);
        }
    }
}
