//! iWARP over TCP: the driver of an iWARP device (MPA, DDP and RDMAP run by the sans-IO
//! engine of `softrdma_iwarp`; this module owns the sockets and the threads).
//!
//! The API layer talks to it through [`TcpShared`]: commands (listen, connect, accept,
//! reject, disconnect, destroy), per-QP submission queues ([`TcpQp`]) and a ready list; the
//! progress thread ([`progress`]) moves bytes, time and events, and hands completions to CQs
//! and events to the context's queue.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Instant;

use mio::Token;
use mio::net::TcpListener;
use parking_lot::Mutex;
use softrdma_iwarp::startup::StartupConfig;
use softrdma_memory::KeyTable;

use crate::Error;
use crate::connparams::{ConnectionInfo, FALLBACK_EMSS, FpduSize};
use crate::cq::{CqShared, Driven};
use crate::event::{AsyncEvent, EventQueue};
use crate::leader::{Leader, Turn};
use crate::tap::TapSlot;

mod commands;
mod conn;
mod connect;
mod listen;
pub(crate) mod progress;
mod qp;
mod verbs;

pub(crate) use self::listen::{HalfOpen, ListenerShared, PendingRequest};
pub(crate) use self::qp::TcpQp;

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
    /// Told what the connections send and receive (set once).
    pub(crate) tap: TapSlot,
    /// The device's counters ([`IwarpDeviceCounters`]).
    pub(crate) stats: DeviceStats,
    /// Tests: run once at the start of a caller's turn ([`progress::turn`]).
    #[cfg(test)]
    pub(crate) turn_hook: Mutex<Option<TurnHook>>,
    /// Tests: how long that turn's poll was allowed to block.
    #[cfg(test)]
    pub(crate) hooked_poll: Mutex<Option<Option<std::time::Duration>>>,
    /// Tests: every post counts as one of a burst (`progress::BURST_GAP`).
    #[cfg(test)]
    pub(crate) always_burst: AtomicBool,
}

#[cfg(test)]
pub(crate) type TurnHook = Box<dyn FnOnce(&TcpShared) + Send>;

/// What an iWARP context counted over all its connections (a snapshot of
/// [`Context::counters`](crate::Context::counters)); each QP's own are its
/// [`QpCounters`](crate::QpCounters).
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
            tap: TapSlot::default(),
            stats: DeviceStats::default(),
            #[cfg(test)]
            turn_hook: Mutex::new(None),
            #[cfg(test)]
            hooked_poll: Mutex::new(None),
            #[cfg(test)]
            always_burst: AtomicBool::new(false),
        });
        Leader::start_background(&shared, "softrdma-progress", |d| &d.leader, progress::round)?;
        Ok(shared)
    }

    /// Whether the calling thread is this context's progress thread.
    pub(crate) fn on_progress_thread(&self) -> bool {
        self.leader.on_background()
    }

    /// Queues a command for the progress thread.
    pub(crate) fn command(&self, cmd: Cmd) -> Result<(), Error> {
        if !self.leader.is_live() {
            return Err(Error::ContextClosed);
        }
        self.cmds.lock().push(cmd);
        self.wake();
        Ok(())
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

impl Driven for TcpShared {
    type Slot = progress::Slot;

    fn leader(&self) -> &Leader<progress::Slot> {
        &self.leader
    }

    fn interrupt(&self) {
        let _ = self.waker.wake();
    }

    fn caller_turn(&self, slot: &mut progress::Slot, until: Option<Instant>) -> Turn {
        progress::turn(self, slot, until)
    }

    fn poll_once(&self, cq: &CqShared) {
        // No slot and no stand-down: the background thread stays on the sockets for an
        // application that polls now and then spins on memory (ib_write_lat's receiver).
        if let Some(mut d) = self.try_lock_driver() {
            d.sweep(self, cq);
        }
    }
}

impl Drop for TcpShared {
    fn drop(&mut self) {
        self.leader.stop();
        self.wake();
        self.leader.join_background();
    }
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

#[cfg(test)]
mod tests;
