//! iWARP over TCP: the driver of an iWARP device (MPA, DDP and RDMAP run by the sans-IO
//! engine of `softrdma_iwarp`; this module owns the sockets and the threads).
//!
//! The API layer talks to it through [`TcpShared`]: commands (listen, connect, accept,
//! reject, disconnect, destroy), per-QP submission queues ([`TcpQp`]) and a ready list; the
//! progress thread ([`progress`]) moves bytes, time and events, and hands completions to CQs
//! and events to the context's queue.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use event_listener::Event;
use mio::Token;
use mio::net::TcpListener;
use parking_lot::{Condvar, Mutex};
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_iwarp::rdmap::{check_send, send_limits};
use softrdma_iwarp::startup::{PeerParams, Rtr, RtrSet, Startup, StartupConfig, StartupError};
use softrdma_memory::{KeyTable, PdId};
use softrdma_verbs_types::{
    CheckedRecv, CheckedSend, PostError, RecvWr, SendLimits, SendWr, check_recv,
};
use softrdma_wire::mpa::{MAX_PRIVATE_DATA, REV_2};

use crate::Error;
use crate::connparams::{
    ConnectParams, ConnectionInfo, FALLBACK_EMSS, FpduSize, ListenParams, QpCap,
};
use crate::cq::{CqShared, Progress};
use crate::event::{AsyncEvent, EventQueue};
use crate::leader::{Leader, Waiter};
use crate::srq::SrqShared;
use crate::state::{QpCounters, QpState};
use crate::tap::TapSlot;

mod commands;
mod conn;
pub(crate) mod progress;
mod verbs;

pub(crate) use self::verbs::Iwarp;

/// The locked driver (see [`TcpShared::lock_driver`]).
pub(crate) struct DriverGuard<'a> {
    ctx: &'a TcpShared,
    d: Option<parking_lot::MutexGuard<'a, progress::Driver>>,
}

impl std::ops::Deref for DriverGuard<'_> {
    type Target = progress::Driver;
    fn deref(&self) -> &progress::Driver {
        self.d.as_deref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for DriverGuard<'_> {
    fn deref_mut(&mut self) -> &mut progress::Driver {
        self.d.as_deref_mut().expect("held until dropped")
    }
}

impl Drop for DriverGuard<'_> {
    fn drop(&mut self) {
        drop(self.d.take());
        // Not while unwinding: a second panic in there would abort the process.
        if !std::thread::panicking() {
            self.ctx.run_scheduled();
        }
    }
}

/// The state the API layer shares with the progress thread of one iWARP context.
pub(crate) struct TcpShared {
    pub(crate) keys: Arc<KeyTable>,
    pub(crate) events: Arc<EventQueue>,
    /// Every connection and listener (see [`progress::Driver`]).
    pub(crate) driver: Mutex<progress::Driver>,
    /// Who waits on the sockets (see [`crate::leader`]).
    pub(crate) leader: Leader<progress::Slot>,
    waker: mio::Waker,
    pub(crate) cmds: Mutex<Vec<Cmd>>,
    pub(crate) ready: Mutex<Vec<Arc<TcpQp>>>,
    /// Set after a push to `ready`, cleared when the driver takes the list.
    pub(crate) ready_pending: AtomicBool,
    next_token: AtomicUsize,
    next_qp: AtomicU32,
    /// Cleared when the progress thread exits.
    pub(crate) alive: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Told what the connections send and receive (set once).
    pub(crate) tap: TapSlot,
    /// The device's counters ([`IwarpDeviceCounters`]).
    pub(crate) stats: DeviceStats,
    /// Tests: run once at the start of a caller's turn ([`progress::turn`]).
    #[cfg(test)]
    pub(crate) turn_hook: Mutex<Option<TurnHook>>,
    /// Tests: how long that turn's poll was allowed to block.
    #[cfg(test)]
    pub(crate) hooked_poll: Mutex<Option<Option<Duration>>>,
    /// Tests: every post counts as one of a burst (`progress::BURST_GAP`).
    #[cfg(test)]
    pub(crate) always_burst: AtomicBool,
}

#[cfg(test)]
pub(crate) type TurnHook = Box<dyn FnOnce(&TcpShared) + Send>;

/// What an iWARP context counted over all its connections (a snapshot of
/// [`Context::counters`](crate::Context::counters)); each QP's own are its
/// [`QpCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IwarpDeviceCounters {
    /// TCP connections this context opened (`connect`).
    pub connects: u64,
    /// TCP connections its listeners accepted.
    pub accepts: u64,
    /// Connections whose MPA startup completed (Full Operation).
    pub established: u64,
    /// Connects the peer rejected (MPA Reply with the Rejected bit).
    pub rejected: u64,
    /// MPA startups that failed otherwise (a bad frame, a timeout, a lost stream).
    pub startup_failures: u64,
    /// TCP connections a listener closed before their MPA Request came, to make room for a
    /// newer one: `max_half_open` startups (or `max_half_open_per_source` from its address)
    /// were waiting for their Request.
    pub half_open_evicted: u64,
    /// Octets written to the TCP sockets.
    pub octets_tx: u64,
    /// Octets read from them.
    pub octets_rx: u64,
}

/// The atomics behind [`IwarpDeviceCounters`].
#[derive(Default)]
pub(crate) struct DeviceStats {
    pub(crate) connects: AtomicU64,
    pub(crate) accepts: AtomicU64,
    pub(crate) established: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) startup_failures: AtomicU64,
    pub(crate) half_open_evicted: AtomicU64,
    pub(crate) octets_tx: AtomicU64,
    pub(crate) octets_rx: AtomicU64,
}

impl DeviceStats {
    pub(crate) fn add(c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> IwarpDeviceCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IwarpDeviceCounters {
            connects: g(&self.connects),
            accepts: g(&self.accepts),
            established: g(&self.established),
            half_open_evicted: g(&self.half_open_evicted),
            rejected: g(&self.rejected),
            startup_failures: g(&self.startup_failures),
            octets_tx: g(&self.octets_tx),
            octets_rx: g(&self.octets_rx),
        }
    }
}

impl TcpShared {
    /// Starts the progress thread of a new context.
    pub(crate) fn start(
        keys: Arc<KeyTable>,
        events: Arc<EventQueue>,
    ) -> Result<Arc<TcpShared>, Error> {
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), progress::WAKER)?;
        let registry = poll.registry().try_clone()?;
        let shared = Arc::new(TcpShared {
            keys,
            events,
            driver: Mutex::new(progress::Driver::new(registry)),
            leader: Leader::new(progress::Slot::new(poll)),
            waker,
            cmds: Mutex::new(Vec::new()),
            ready: Mutex::new(Vec::new()),
            ready_pending: AtomicBool::new(false),
            next_token: AtomicUsize::new(progress::FIRST_TOKEN),
            next_qp: AtomicU32::new(1),
            alive: AtomicBool::new(true),
            thread: Mutex::new(None),
            tap: TapSlot::default(),
            stats: DeviceStats::default(),
            #[cfg(test)]
            turn_hook: Mutex::new(None),
            #[cfg(test)]
            hooked_poll: Mutex::new(None),
            #[cfg(test)]
            always_burst: AtomicBool::new(false),
        });
        let weak: Weak<TcpShared> = Arc::downgrade(&shared);
        let handle = std::thread::Builder::new()
            .name("softrdma-progress".into())
            .spawn(move || progress::run(weak))?;
        shared.leader.set_background(handle.thread().clone());
        *shared.thread.lock() = Some(handle);
        Ok(shared)
    }

    /// Whether the calling thread is this context's progress thread.
    pub(crate) fn on_progress_thread(&self) -> bool {
        self.thread
            .lock()
            .as_ref()
            .is_some_and(|h| h.thread().id() == std::thread::current().id())
    }

    /// Queues a command for the progress thread.
    pub(crate) fn command(&self, cmd: Cmd) -> Result<(), Error> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(Error::ContextClosed);
        }
        self.cmds.lock().push(cmd);
        self.wake();
        Ok(())
    }

    /// Hands `qp`'s new work requests to the driver (once until it looks): run here if the
    /// driver is free, else by its holder as it lets go (no wake-up of anyone: a thread
    /// that waits on the sockets does not hold the driver).
    pub(crate) fn schedule(&self, qp: &Arc<TcpQp>) {
        if !qp.scheduled.swap(true, Ordering::AcqRel) {
            self.ready.lock().push(qp.clone());
            self.ready_pending.store(true, Ordering::Relaxed);
            self.run_scheduled();
        }
    }

    /// The driver, locked; whatever is scheduled meanwhile runs as it is let go.
    pub(crate) fn lock_driver(&self) -> DriverGuard<'_> {
        DriverGuard {
            ctx: self,
            d: Some(self.driver.lock()),
        }
    }

    /// [`TcpShared::lock_driver`] if nobody holds it.
    pub(crate) fn try_lock_driver(&self) -> Option<DriverGuard<'_>> {
        Some(DriverGuard {
            ctx: self,
            d: Some(self.driver.try_lock()?),
        })
    }

    /// Runs the ready list if something waits in it and the driver is free. Whoever pushes
    /// to the list and whoever lets the driver go both come here: with the fence between
    /// each one's write (the flag, the unlock) and its read (the lock, the flag), one of
    /// them sees the other's write, so nothing is left in the list unseen.
    fn run_scheduled(&self) {
        loop {
            std::sync::atomic::fence(Ordering::SeqCst);
            if !self.ready_pending.load(Ordering::Relaxed) {
                return;
            }
            let Some(mut d) = self.driver.try_lock() else {
                return;
            };
            d.ready(self);
        }
    }

    /// Interrupts whoever waits on the sockets, and the background thread if it stands
    /// down and no caller holds the slot, so commands and scheduled QPs are seen.
    pub(crate) fn wake(&self) {
        // Fails only if the poll instance is gone, i.e. the thread exited.
        let _ = self.waker.wake();
        // A caller holding the slot is interrupted by the waker and runs them in its turn
        // (were the slot let go meanwhile, the waker's event waits in the poll instance for
        // the background thread's next look).
        if !self.leader.caller_holds() {
            self.leader.unpark_background();
        }
    }

    /// New work requests of `qp`: handed to its engine and sent in this thread when the
    /// driver is free, else by whoever holds it next.
    pub(crate) fn submit(&self, qp: &Arc<TcpQp>) {
        match self.try_lock_driver() {
            Some(mut d) => d.post(self, qp),
            None => self.schedule(qp),
        }
    }

    /// Runs the test hook if one is set; whether it ran.
    #[cfg(test)]
    pub(crate) fn run_turn_hook(&self) -> bool {
        let hook = self.turn_hook.lock().take();
        hook.map(|h| h(self)).is_some()
    }

    pub(crate) fn token(&self) -> mio::Token {
        mio::Token(self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn next_qp_num(&self) -> u32 {
        self.next_qp.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn post_event(&self, ev: AsyncEvent) {
        self.events.post(ev);
    }
}

impl Progress for TcpShared {
    fn progress(&self, cq: &CqShared) {
        // No slot and no stand-down: the background thread stays on the sockets for an
        // application that polls now and then spins on memory (ib_write_lat's receiver).
        if let Some(mut d) = self.try_lock_driver() {
            d.sweep(self, cq);
        }
    }

    fn block(
        &self,
        waiter: Weak<dyn Waiter>,
        spin: Duration,
        flow: Duration,
        until: Option<Instant>,
        done: &dyn Fn() -> bool,
    ) -> bool {
        self.leader.drive(
            waiter,
            spin,
            flow,
            until,
            done,
            || {
                let _ = self.waker.wake();
            },
            |slot, until| progress::turn(self, slot, until),
        )
    }

    fn nudge(&self) {
        self.leader.unpark_background();
    }

    fn wake(&self) {
        self.leader.wake(|| {
            let _ = self.waker.wake();
        });
    }
}

impl Drop for TcpShared {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        self.wake();
        if let Some(h) = self.thread.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

/// Extra time a blocking call waits beyond the MPA timeout before giving up on the
/// progress thread (a safety net, not a protocol timer).
const REPLY_GRACE: Duration = Duration::from_secs(5);

impl ListenParams {
    pub(crate) fn startup_config(&self) -> StartupConfig {
        StartupConfig {
            rev: self.rev,
            crc: self.crc,
            markers: self.markers,
            p2p: self.p2p.then_some(RtrSet::WRITE_OR_READ),
            timeout: self.timeout,
            ..StartupConfig::default()
        }
    }
}

pub(crate) fn check_private_data(rev: u8, len: usize) -> Result<(), Error> {
    let limit = if rev == REV_2 {
        MAX_PRIVATE_DATA - 4
    } else {
        MAX_PRIVATE_DATA
    };
    if len > limit {
        return Err(Error::Startup(StartupError::PrivateDataTooLong {
            len,
            limit,
        }));
    }
    Ok(())
}

/// TCP settings of every connection: no Nagle delay; the EMSS for the MULPDU.
pub(crate) fn prepare_stream(stream: &TcpStream) -> Result<u32, Error> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    Ok(emss(socket2::SockRef::from(stream)))
}

/// The connected socket's EMSS (the fallback if the system does not say).
pub(crate) fn emss(sock: socket2::SockRef<'_>) -> u32 {
    let mss = sock
        .tcp_mss()
        .ok()
        .filter(|&m| m > 0)
        .unwrap_or(FALLBACK_EMSS);
    loopback_mss(&sock).map_or(mss, |m| m.max(mss))
}

/// A TCP header with the timestamp option, which Linux puts on every segment.
const TCP_HEADER_WITH_TIMESTAMPS: u32 = 20 + 12;

/// The MSS of a loopback connection's MTU. The kernel first bounds a connection's MSS by
/// half the peer's largest window so far (32 KiB on `lo`, whose MTU is 64 KiB) and reaches
/// the MTU's within the first window: FPDUs sized at connect time would stay half of every
/// later segment. No router clamps a loopback path, so its MTU is the one to go by.
fn loopback_mss(sock: &socket2::SockRef<'_>) -> Option<u32> {
    let peer = sock.peer_addr().ok()?.as_socket()?;
    let ip = match peer.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer.ip(), Into::into),
        v4 => v4,
    };
    if !ip.is_loopback() {
        return None;
    }
    let (mtu, ip_header) = match peer {
        SocketAddr::V4(_) => (rustix::net::sockopt::ip_mtu(&**sock).ok()?, 20),
        SocketAddr::V6(_) => (rustix::net::sockopt::ipv6_mtu(&**sock).ok()?, 40),
    };
    mtu.checked_sub(ip_header + TCP_HEADER_WITH_TIMESTAMPS)
}

/// Where the progress thread answers a `connect` or an `accept`: a blocked caller or a task.
pub(crate) type Reply = oneshot::Sender<Result<ConnectionInfo, Error>>;

pub(crate) struct PendingRequest {
    pub(crate) token: mio::Token,
    pub(crate) local_addr: SocketAddr,
    pub(crate) peer_addr: SocketAddr,
    pub(crate) private_data: Vec<u8>,
    pub(crate) params: PeerParams,
    pub(crate) early_fpdus: bool,
}

pub(crate) struct ListenerShared {
    pub(crate) params: ListenParams,
    queue: Mutex<VecDeque<PendingRequest>>,
    cond: Condvar,
    /// Wakes tasks awaiting a request.
    ready: Event,
    closed: AtomicBool,
    /// Accepted connections still waiting for their MPA Request ([`HalfOpen`]).
    pub(crate) half_open: Mutex<HalfOpenSet>,
}

/// A listener's accepted connections whose MPA Request has not arrived yet, oldest first,
/// and how many each source address holds.
#[derive(Default)]
pub(crate) struct HalfOpenSet {
    next: u64,
    by_age: BTreeMap<u64, (Token, IpAddr, Instant)>,
    per_source: HashMap<IpAddr, u32>,
}

impl HalfOpenSet {
    fn insert(&mut self, token: Token, ip: IpAddr, now: Instant) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.by_age.insert(seq, (token, ip, now));
        *self.per_source.entry(ip).or_default() += 1;
        seq
    }

    fn remove(&mut self, seq: u64) -> Option<Token> {
        let (token, ip, _) = self.by_age.remove(&seq)?;
        if let Some(n) = self.per_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&ip);
            }
        }
        Some(token)
    }

    /// Connections held.
    pub(crate) fn len(&self) -> usize {
        self.by_age.len()
    }
}

/// How long a source's silent connections may stay past its quota while the listener has
/// room ([`HalfOpen::victim`]).
const HALF_OPEN_GRACE: Duration = Duration::from_secs(1);

/// One accepted connection in MPA startup, counted against the listener's
/// `max_half_open` and `max_half_open_per_source` until its Request arrives or it goes.
pub(crate) struct HalfOpen {
    l: Arc<ListenerShared>,
    seq: u64,
}

impl HalfOpen {
    /// Takes a place for connection `token` from `ip`, and names the connection that must
    /// give its place up for it, if any: the oldest of the same source when that source
    /// holds its quota, else the oldest of all when the listener is full. A flood of
    /// silent connections then only pushes out its own (or older silent ones), never
    /// locks a newcomer out: one that sends its Request promptly is through before its
    /// turn to be evicted comes.
    pub(crate) fn take(
        l: &Arc<ListenerShared>,
        token: Token,
        ip: IpAddr,
        now: Instant,
    ) -> (HalfOpen, Option<Token>) {
        let mut s = l.half_open.lock();
        let victim = Self::victim_in(l, &s, ip, now);
        let evicted = victim.and_then(|seq| s.remove(seq));
        let seq = s.insert(token, ip, now);
        drop(s);
        (HalfOpen { l: l.clone(), seq }, evicted)
    }
}

impl HalfOpen {
    /// The connection that would give its place up to a newcomer from `ip` (see
    /// [`HalfOpen::take`]), if one would.
    pub(crate) fn victim(l: &Arc<ListenerShared>, ip: IpAddr, now: Instant) -> Option<Token> {
        let s = l.half_open.lock();
        Self::victim_in(l, &s, ip, now).and_then(|seq| s.by_age.get(&seq).map(|(t, ..)| *t))
    }

    /// The oldest of `ip`'s when it holds its quota — unless that one is younger than
    /// [`HALF_OPEN_GRACE`] and the listener has room: a client opening many connections
    /// at once (Debian's cmtime opens 100) may have them all accepted before it sent the
    /// first Request, and a flood from one address still only pushes out its own once they
    /// are that old; the oldest of all when the listener is full.
    fn victim_in(l: &ListenerShared, s: &HalfOpenSet, ip: IpAddr, now: Instant) -> Option<u64> {
        let max = l.params.max_half_open.max(1) as usize;
        let per_source = l.params.max_half_open_per_source.max(1);
        let full = s.len() >= max;
        if s.per_source.get(&ip).copied().unwrap_or(0) >= per_source {
            let own = s
                .by_age
                .iter()
                .find(|(_, (_, from, _))| *from == ip)
                .map(|(&seq, &(_, _, at))| (seq, at));
            match own {
                Some((seq, at)) if full || now.saturating_duration_since(at) >= HALF_OPEN_GRACE => {
                    return Some(seq);
                }
                _ => {}
            }
        }
        if full {
            s.by_age.keys().next().copied()
        } else {
            None
        }
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        // Evicted already, or leaving now.
        self.l.half_open.lock().remove(self.seq);
    }
}

impl ListenerShared {
    /// Queues a connection request for `accept`; `false` (nothing queued) when `backlog`
    /// requests already wait: a peer cannot make us hold connections without a limit.
    pub(crate) fn push(&self, req: PendingRequest) -> bool {
        {
            let mut q = self.queue.lock();
            if q.len() >= self.params.backlog.max(1) as usize {
                return false;
            }
            q.push_back(req);
        }
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
        true
    }

    pub(crate) fn drain(&self) -> Vec<PendingRequest> {
        self.queue.lock().drain(..).collect()
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
    }

    pub(crate) fn new(params: ListenParams) -> ListenerShared {
        ListenerShared {
            params,
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            ready: Event::new(),
            closed: AtomicBool::new(false),
            half_open: Mutex::new(HalfOpenSet::default()),
        }
    }

    pub(crate) fn try_pop(&self) -> Option<PendingRequest> {
        self.queue.lock().pop_front()
    }

    /// The next request, once there is one (cancel-safe); an error once closed.
    pub(crate) async fn wait_async(&self) -> Result<PendingRequest, Error> {
        let look = || match self.try_pop() {
            Some(r) => Some(Ok(r)),
            None if self.closed.load(Ordering::Acquire) => Some(Err(Error::ContextClosed)),
            None => None,
        };
        loop {
            if let Some(r) = look() {
                return r;
            }
            let l = self.ready.listen();
            if let Some(r) = look() {
                return r;
            }
            l.await;
        }
    }

    /// The next request; `None` deadline: wait forever.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> Result<PendingRequest, Error> {
        let mut q = self.queue.lock();
        loop {
            if let Some(req) = q.pop_front() {
                return Ok(req);
            }
            if self.closed.load(Ordering::Acquire) {
                return Err(Error::ContextClosed);
            }
            match deadline {
                None => self.cond.wait(&mut q),
                Some(d) => {
                    if self.cond.wait_until(&mut q, d).timed_out() && q.is_empty() {
                        return Err(Error::Timeout);
                    }
                }
            }
        }
    }
}

/// Work for the progress thread.
pub(crate) enum Cmd {
    Listen {
        token: Token,
        listener: TcpListener,
        shared: Arc<ListenerShared>,
    },
    /// Stop listening; the listening socket is closed before `done` is answered (so the
    /// port is free again when the [`Listener`](crate::Listener)'s drop returns).
    Unlisten(Token, Option<SyncSender<()>>),
    Connect {
        qp: Arc<TcpQp>,
        stream: mio::net::TcpStream,
        /// Checked by the caller; its timeout runs from `started`.
        startup: StartupConfig,
        started: Instant,
        emss: u32,
        fpdu: FpduSize,
        reply: Reply,
    },
    /// [`Cmd::Connect`] with the TCP connect made by the progress thread (a task's
    /// `connect`: nothing blocks); `startup.timeout` covers both.
    Dial {
        qp: Arc<TcpQp>,
        addr: SocketAddr,
        startup: StartupConfig,
        started: Instant,
        fpdu: FpduSize,
        reply: Reply,
    },
    Accept {
        token: Token,
        qp: Arc<TcpQp>,
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
        fpdu: FpduSize,
        early_fpdus: bool,
        reply: Reply,
    },
    Reject {
        token: Token,
        private_data: Vec<u8>,
    },
    Disconnect(Arc<TcpQp>),
    Destroy(Arc<TcpQp>),
}

#[derive(Default)]
pub(crate) struct Submissions {
    /// Work requests for the engine, checked (and `INLINE` octets copied) at post time.
    pub(crate) sq: VecDeque<CheckedSend>,
    pub(crate) rq: VecDeque<CheckedRecv>,
}

/// Accounts for a checked request under its submission queue's lock (`posted`, `retired`,
/// the queue's depth): returned for the engine when `direct` and nothing waits before it,
/// else queued (`wrap`ped).
fn enqueue<T, Q>(
    queue: &mut VecDeque<Q>,
    (posted, retired, depth): (&AtomicU64, &AtomicU64, u32),
    wr: T,
    wrap: impl FnOnce(T) -> Q,
    direct: bool,
) -> Result<Option<T>, Error> {
    if posted.load(Ordering::Relaxed) - retired.load(Ordering::Acquire) >= u64::from(depth) {
        return Err(PostError::QueueFull.into());
    }
    posted.fetch_add(1, Ordering::Release);
    if direct && queue.is_empty() {
        return Ok(Some(wr));
    }
    queue.push_back(wrap(wr));
    Ok(None)
}

pub(crate) struct TcpQp {
    pub(crate) qpn: u32,
    pub(crate) pd: PdId,
    pub(crate) cap: QpCap,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) srq: Option<Arc<SrqShared>>,
    pub(crate) sub: Mutex<Submissions>,
    /// Queued in the context's ready list and not yet looked at.
    pub(crate) scheduled: AtomicBool,
    pub(crate) state: AtomicU8,
    /// Send requests accepted by `post_send` (written under `sub`).
    pub(crate) sq_posted: AtomicU64,
    /// Send requests completed, with or without a completion (progress thread).
    pub(crate) sq_retired: AtomicU64,
    pub(crate) rq_posted: AtomicU64,
    pub(crate) rq_retired: AtomicU64,
    /// Negotiated ORD (`u32::MAX` before the connection).
    pub(crate) ord: AtomicU32,
    pub(crate) conn: Mutex<Option<ConnectionInfo>>,
    /// Its counters once its connection let it go (before, the engine has them).
    pub(crate) counters: Mutex<QpCounters>,
    pub(crate) last_event: Mutex<Option<QpEvent>>,
}

impl TcpQp {
    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: QpState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// Moves the state from `from` to `to`; `false` if it was not `from`.
    pub(crate) fn transition(&self, from: QpState, to: QpState) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl TcpQp {
    /// A QP in [`QpState::Init`].
    pub(crate) fn new(
        qpn: u32,
        pd: PdId,
        cap: QpCap,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        srq: Option<Arc<SrqShared>>,
    ) -> TcpQp {
        TcpQp {
            qpn,
            pd,
            cap,
            send_cq,
            recv_cq,
            srq,
            sub: Mutex::new(Submissions::default()),
            scheduled: AtomicBool::new(false),
            state: AtomicU8::new(QpState::Init as u8),
            sq_posted: AtomicU64::new(0),
            sq_retired: AtomicU64::new(0),
            rq_posted: AtomicU64::new(0),
            rq_retired: AtomicU64::new(0),
            ord: AtomicU32::new(u32::MAX),
            conn: Mutex::new(None),
            counters: Mutex::new(QpCounters::default()),
            last_event: Mutex::new(None),
        }
    }

    /// Send requests posted and not yet completed.
    pub(crate) fn sq_outstanding(&self) -> u64 {
        self.sq_posted
            .load(Ordering::Acquire)
            .saturating_sub(self.sq_retired.load(Ordering::Acquire))
    }

    /// Queues a checked send request for the engine (which the progress thread alone owns).
    pub(crate) fn post_send(self: &Arc<Self>, drv: &TcpShared, wr: SendWr) -> Result<(), Error> {
        self.post_send_list(drv, std::iter::once(wr))
            .map_err(|(_, e)| e)
    }

    /// Checks send requests in order and hands them to the engine, then writes the lot at
    /// once (one write, not one per message); stops at the first refused one and returns
    /// its index. Those before it are sent.
    pub(crate) fn post_send_list(
        self: &Arc<Self>,
        drv: &TcpShared,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        let lim = send_limits(self.cap.max_send_sge, self.cap.max_inline_data);
        self.post_list(drv, wrs, |wr, direct| self.admit(drv, &lim, wr, direct))
    }

    /// Posts checked requests in order, up to the first refused one. With the driver free
    /// and nothing queued before them they go to the engine directly; otherwise they wait
    /// in the submission queue for whoever holds the driver (`admit(wr, direct)` checks one
    /// and returns it for the engine, or queues it).
    fn post_list<W, C: progress::Hand>(
        self: &Arc<Self>,
        drv: &TcpShared,
        wrs: impl IntoIterator<Item = W>,
        admit: impl Fn(W, bool) -> Result<Option<C>, Error>,
    ) -> Result<(), (usize, Error)> {
        let mut wrs = wrs.into_iter().enumerate();
        if let Some(mut d) = drv.try_lock_driver()
            && let Some(res) = d.post_direct(drv, self, &mut wrs, &admit)
        {
            return res;
        }
        let mut res = Ok(());
        let mut queued = 0;
        for (i, wr) in wrs {
            if let Err(e) = admit(wr, false) {
                res = Err((i, e));
                break;
            }
            queued += 1;
        }
        if queued > 0 {
            drv.submit(self);
        }
        res
    }

    /// Checks a send request and accounts for it: returned for the engine when `direct`
    /// and nothing waits in the submission queue before it, else queued there.
    fn admit(
        &self,
        drv: &TcpShared,
        lim: &SendLimits,
        wr: SendWr,
        direct: bool,
    ) -> Result<Option<CheckedSend>, Error> {
        if wr.opcode.is_read_or_atomic() && self.ord.load(Ordering::Acquire) == 0 {
            return Err(PostError::ReadsDisabled.into());
        }
        let wr = check_send(wr, lim, &drv.keys, self.pd)?;
        let mut sub = self.sub.lock();
        let room = (&self.sq_posted, &self.sq_retired, self.cap.max_send_wr);
        enqueue(&mut sub.sq, room, wr, |wr| wr, direct)
    }

    /// Queues a checked receive request.
    pub(crate) fn post_recv(self: &Arc<Self>, drv: &TcpShared, wr: RecvWr) -> Result<(), Error> {
        self.post_recv_list(drv, [wr]).map_err(|(_, e)| e)
    }

    /// Checks and posts receive requests in order, up to the first refused one.
    pub(crate) fn post_recv_list(
        self: &Arc<Self>,
        drv: &TcpShared,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), (usize, Error)> {
        if self.srq.is_some() {
            return Err((0, Error::SrqAttached));
        }
        self.post_list(drv, wrs, |wr, direct| self.admit_recv(drv, wr, direct))
    }

    /// [`TcpQp::admit`] for a receive request.
    fn admit_recv(
        &self,
        drv: &TcpShared,
        wr: RecvWr,
        direct: bool,
    ) -> Result<Option<CheckedRecv>, Error> {
        let wr = check_recv(wr, self.cap.max_recv_sge, &drv.keys, self.pd)?;
        let mut sub = self.sub.lock();
        let room = (&self.rq_posted, &self.rq_retired, self.cap.max_recv_wr);
        enqueue(&mut sub.rq, room, wr, |wr| wr, direct)
    }
}

impl TcpShared {
    /// TCP connect, then MPA negotiation as initiator run by the progress thread
    /// (`rdma_connect`); the QP is `Connecting`.
    pub(crate) fn connect(
        &self,
        qp: &Arc<TcpQp>,
        addr: impl ToSocketAddrs,
        params: &ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        let start = Instant::now();
        let cfg = startup_config(params)?;
        let stream = crate::net::connect(addr, params.timeout)?;
        let emss = prepare_stream(&stream)?;
        let remaining = params.timeout.saturating_sub(start.elapsed());
        let (reply, rx) = oneshot::channel();
        self.command(Cmd::Connect {
            qp: qp.clone(),
            stream: mio::net::TcpStream::from_std(stream),
            startup: StartupConfig {
                timeout: remaining,
                ..cfg
            },
            started: Instant::now(),
            emss,
            fpdu: params.fpdu,
            reply,
        })?;
        wait_reply(rx, params.timeout)
    }

    /// [`connect`](Self::connect) for a task: the progress thread makes the TCP connection
    /// too; the answer comes on the returned channel.
    pub(crate) fn dial(
        &self,
        qp: &Arc<TcpQp>,
        addr: SocketAddr,
        params: &ConnectParams,
    ) -> Result<oneshot::Receiver<Result<ConnectionInfo, Error>>, Error> {
        let (reply, rx) = oneshot::channel();
        self.command(Cmd::Dial {
            qp: qp.clone(),
            addr,
            startup: startup_config(params)?,
            started: Instant::now(),
            fpdu: params.fpdu,
            reply,
        })?;
        Ok(rx)
    }
}

/// The initiator's MPA settings, checked before anything touches the network.
fn startup_config(params: &ConnectParams) -> Result<StartupConfig, Error> {
    let cfg = StartupConfig {
        rev: params.rev,
        crc: params.crc,
        markers: params.markers,
        ird: params.ird,
        ord: params.ord,
        p2p: params.p2p.then_some(RtrSet::only(Rtr::ZeroLengthWrite)),
        private_data: params.private_data.clone(),
        timeout: params.timeout,
        allow_early_fpdus: true,
    };
    Startup::initiator(cfg.clone(), Instant::now())?;
    Ok(cfg)
}

/// Closes the connection of an iWARP `connect` or `accept` whose task stopped waiting
/// (`None` once the answer was seen).
pub(crate) struct Abandon<'a>(pub(crate) &'a TcpShared, pub(crate) Option<Arc<TcpQp>>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.1.take() {
            let _ = self.0.command(Cmd::Disconnect(q));
        }
    }
}

/// Waits for the progress thread's answer to a blocking command.
pub(crate) fn wait_reply<T>(
    rx: oneshot::Receiver<Result<T, Error>>,
    timeout: Duration,
) -> Result<T, Error> {
    match rx.recv_timeout(timeout + REPLY_GRACE) {
        Ok(r) => r,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::ContextClosed),
    }
}

/// The progress thread's answer, awaited by a task.
pub(crate) async fn reply_async<T>(rx: oneshot::Receiver<Result<T, Error>>) -> Result<T, Error> {
    rx.await.unwrap_or(Err(Error::ContextClosed))
}

#[cfg(test)]
mod tests;
