//! Who waits on a driver's sockets: the leader/follower rule behind caller-driven progress
//! (docs/progress.md).
//!
//! A driver's I/O state — its epoll set or socket and receive buffers — sits in one slot.
//! Whoever holds the slot may block on the sockets and then runs the whole transport: reads,
//! engines, transmits, completions to every CQ. A thread waiting on a CQ takes the slot, so
//! the datagram or segment it waits for wakes it directly and no other thread is involved
//! (one wake-up between arrival and waiter). The driver's background thread holds the slot
//! only while nobody else wants it, so timers, ACKs, Read Responses and a peer's Writes
//! still make progress when no thread is in the library; while a caller drives, the
//! background thread stands down and looks again after [`STAND_DOWN`], then after longer
//! naps while callers keep driving (up to [`STAND_DOWN_MAX`]).
//!
//! Lock order: slot, then the driver's state, then a QP's submission queue, then a CQ.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

/// Something a thread sleeps on (a CQ, a completion channel): told when a driver's slot is
/// free to take (see [`crate::leader`]).
pub(crate) trait Waiter: Send + Sync {
    /// Wakes the sleepers.
    fn notify(&self);
}

/// How long the background thread stands down while callers drive, before it looks again;
/// also how long after a caller gave the slot up it leaves the slot to callers.
pub(crate) const STAND_DOWN: Duration = Duration::from_millis(1);

/// The longest the background thread naps while callers keep driving: each look that finds
/// them driving doubles its nap from [`STAND_DOWN`] up to this. Every look is a wake-up
/// on a core that carries the data path (on a VM, a timer interrupt and a preemption of a
/// busy thread; a 1 MiB Write stream moved 8 % more with these naps). The cost is how late
/// the background thread takes over once callers stop: at most this long after a stream
/// of caller-driven turns, [`STAND_DOWN`] after a look that found nobody. A caller that
/// comes back after an absence longer than the grace makes the naps short again: callers
/// that leave for that long (a server's handler at its disk) keep the background thread
/// on duty in their gaps.
pub(crate) const STAND_DOWN_MAX: Duration = Duration::from_millis(16);

/// How long a caller waits for the kicked background thread to hand the slot over.
const HANDOVER: Duration = Duration::from_millis(20);

/// How a wait on a CQ polls before it sleeps (`Cq::set_busy_poll`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyPoll {
    /// Sleep at once.
    Off,
    /// Poll this long, then sleep (as Linux's `SO_BUSY_POLL`): a completion arriving within
    /// it costs no wake-up, at the price of that much CPU per wait that finds nothing.
    Fixed(Duration),
    /// Poll about as long as the last completions took to come, never longer than `max`,
    /// then sleep — KVM's halt polling applied to a CQ. A ping-pong whose answers come
    /// within `max` stops sleeping (a wake-up on an idle core costs more than the answer
    /// takes); a queue whose completions come rarely goes back to sleeping at once.
    Adaptive {
        /// The longest poll.
        max: Duration,
    },
}

/// What a new `Cq` does: adaptive, up to 200 µs, KVM's default `halt_poll_ns`.
///
/// The cap is what a wait may take and still teach the poll to grow. A ping-pong whose two
/// sides sleep takes two wake-ups per round trip, each tens of microseconds on an idle
/// virtual core (40 µs here): a cap of 50 µs judged those waits too long to poll for, so
/// both sides stayed asleep for good at several times the round trip they would have had
/// polling (issue 42: RoCE Send 45 µs against 4 µs once polling).
pub const DEFAULT_BUSY_POLL: BusyPoll = BusyPoll::Adaptive {
    max: Duration::from_micros(200),
};

/// What a new context's background thread does after its arrivals: adaptive up to 50 µs,
/// learnt from the gaps between arrivals (`Context::set_background_poll`).
pub const DEFAULT_BACKGROUND_POLL: BusyPoll = BusyPoll::Adaptive { max: FLOW_POLL };

/// The first adaptive poll after a sleep that a poll would have saved.
const GROW_START: Duration = Duration::from_micros(4);

/// The busy-poll setting and, when adaptive, the current poll (nanoseconds).
pub(crate) struct Spin {
    /// Fixed: the poll; adaptive: the longest.
    max_ns: AtomicU64,
    adaptive: AtomicBool,
    /// Adaptive: the poll now.
    cur_ns: AtomicU64,
}

impl Spin {
    pub(crate) fn new(mode: BusyPoll) -> Spin {
        let s = Spin {
            max_ns: AtomicU64::new(0),
            adaptive: AtomicBool::new(false),
            cur_ns: AtomicU64::new(0),
        };
        s.set(mode);
        s
    }

    pub(crate) fn set(&self, mode: BusyPoll) {
        let ns = |d: Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64;
        let (max, adaptive) = match mode {
            BusyPoll::Off => (0, false),
            BusyPoll::Fixed(d) => (ns(d), false),
            BusyPoll::Adaptive { max } => (ns(max), true),
        };
        self.max_ns.store(max, Ordering::Relaxed);
        self.cur_ns.store(0, Ordering::Relaxed);
        self.adaptive.store(adaptive, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> BusyPoll {
        let max = Duration::from_nanos(self.max_ns.load(Ordering::Relaxed));
        if self.adaptive.load(Ordering::Relaxed) {
            BusyPoll::Adaptive { max }
        } else if max.is_zero() {
            BusyPoll::Off
        } else {
            BusyPoll::Fixed(max)
        }
    }

    /// How long a wait polls after each arrival while data flows: a fixed poll, or the
    /// adaptive cap up to [`FLOW_POLL`] (`Off`: never; a caller who asked to sleep at once
    /// sleeps).
    pub(crate) fn flow(&self) -> Duration {
        let max = Duration::from_nanos(self.max_ns.load(Ordering::Relaxed));
        if self.adaptive.load(Ordering::Relaxed) {
            // The adaptive cap is about sleeps; a stream's pieces come far closer.
            max.min(FLOW_POLL)
        } else {
            max
        }
    }

    /// How long this wait polls.
    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(if self.adaptive.load(Ordering::Relaxed) {
            self.cur_ns.load(Ordering::Relaxed)
        } else {
            self.max_ns.load(Ordering::Relaxed)
        })
    }

    /// Adapts to a wait that polled `polled` and then took `took` in all (`None`: it timed
    /// out). Caught while polling: keep; a sleep a longer poll would have saved: double;
    /// a long sleep: halve (polling would have wasted it).
    pub(crate) fn learn(&self, polled: Duration, took: Option<Duration>) {
        if !self.adaptive.load(Ordering::Relaxed) {
            return;
        }
        let max = Duration::from_nanos(self.max_ns.load(Ordering::Relaxed));
        let next = match took {
            Some(t) if t <= polled => return,
            Some(t) if t <= max => (polled * 2).max(GROW_START).min(max),
            _ if polled / 2 < GROW_START => Duration::ZERO,
            _ => polled / 2,
        };
        self.cur_ns.store(next.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The longest the background thread polls after a turn that handled something (its
/// [`Leader::flowing`] poll adapts below it), and how long a channel waiter polls (CQ
/// waiters bring their CQ's busy poll; see [`Leader::drive`]).
pub(crate) const FLOW_POLL: Duration = Duration::from_micros(50);

/// What one turn with the slot did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It handled something that arrived: more is likely on its way.
    Worked,
    /// Nothing arrived before its deadline, or only a wake.
    Idle,
    /// The context is gone.
    Stop,
}

/// A caller's wait for completions ([`Leader::drive`], `Progress::block`): who waits, how
/// long it polls first (`spin`) and after each arrival (`flow`), until when, and what ends it.
pub(crate) struct Wait<'a> {
    pub(crate) waiter: Weak<dyn Waiter>,
    pub(crate) spin: Duration,
    pub(crate) flow: Duration,
    pub(crate) until: Option<Instant>,
    pub(crate) done: &'a dyn Fn() -> bool,
}

/// The slot and the bookkeeping of who wants it.
pub(crate) struct Leader<S> {
    slot: Mutex<S>,
    /// The background thread holds the slot (it gives it up when kicked).
    bg_holds: AtomicBool,
    /// Callers that want the slot or hold it.
    want: AtomicUsize,
    /// The thread holding the slot (a hash of its id; 0: none).
    holder: AtomicU64,
    /// The holder pushed a completion while a waiter was registered ([`Leader::wake`]).
    self_woken: AtomicBool,
    /// CQs whose waiters found the slot held by another caller: told when it is free.
    pending: Mutex<Vec<Weak<dyn Waiter>>>,
    bg: OnceLock<Thread>,
    /// The background thread, until it is joined ([`Leader::join_background`]).
    bg_handle: Mutex<Option<JoinHandle<()>>>,
    /// The driver runs: cleared when its context closes or its I/O fails, which ends the
    /// background thread.
    live: AtomicBool,
    /// The background thread's poll after an arrival ([`Leader::flowing`]), adaptive up
    /// to [`FLOW_POLL`]; learnt from its own turns only, as a caller's stream (the answers
    /// to its requests) ends when the caller stops waiting.
    bg_poll: Spin,
    /// When the background thread's last turn that handled something ended (nanoseconds
    /// after `base`; 0: none yet).
    bg_arrival: AtomicU64,
    /// When a caller last gave the slot up (nanoseconds after `base`; 0: never).
    caller_left: AtomicU64,
    /// How long after that the background thread still stands down ([`STAND_DOWN`]).
    caller_grace: Duration,
    /// The background thread's next nap while callers drive, nanoseconds
    /// ([`STAND_DOWN`]..=[`STAND_DOWN_MAX`]).
    bg_nap: AtomicU64,
    base: Instant,
}

fn thread_key() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut h);
    h.finish() | 1
}

thread_local! {
    static KEY: u64 = thread_key();
}

impl<S> Leader<S> {
    pub(crate) fn new(slot: S) -> Leader<S> {
        Leader {
            slot: Mutex::new(slot),
            bg_holds: AtomicBool::new(false),
            want: AtomicUsize::new(0),
            holder: AtomicU64::new(0),
            self_woken: AtomicBool::new(false),
            pending: Mutex::new(Vec::new()),
            bg: OnceLock::new(),
            bg_handle: Mutex::new(None),
            live: AtomicBool::new(true),
            bg_poll: Spin::new(DEFAULT_BACKGROUND_POLL),
            bg_arrival: AtomicU64::new(0),
            caller_left: AtomicU64::new(0),
            caller_grace: STAND_DOWN,
            bg_nap: AtomicU64::new(STAND_DOWN.as_nanos() as u64),
            base: Instant::now(),
        }
    }

    /// How the background thread polls after its arrivals ([`Leader::flowing`]).
    pub(crate) fn background_poll(&self) -> &Spin {
        &self.bg_poll
    }

    /// Starts the driver's background thread, `name`d: while the driver lives (the thread
    /// holds it only for a round, so its context's last handle ends it) and runs
    /// ([`Leader::stop`]), `round` (one pass of [`Leader::background`]; `false` ends it).
    pub(crate) fn start_background<D: Send + Sync + 'static>(
        driver: &Arc<D>,
        name: &str,
        leader: fn(&D) -> &Leader<S>,
        round: fn(&D) -> bool,
    ) -> std::io::Result<()>
    where
        S: 'static,
    {
        let weak = Arc::downgrade(driver);
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Some(d) = weak.upgrade()
                    && leader(&d).is_live()
                    && round(&d)
                {}
            })?;
        let me = leader(driver);
        let _ = me.bg.set(h.thread().clone());
        *me.bg_handle.lock() = Some(h);
        Ok(())
    }

    /// The driver runs (see [`Leader::stop`]).
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// The driver stops: its background thread ends at its next look (the caller wakes it).
    pub(crate) fn stop(&self) {
        self.live.store(false, Ordering::Release);
    }

    /// Waits for the background thread to end (at once when called on it).
    pub(crate) fn join_background(&self) {
        let h = self.bg_handle.lock().take();
        if let Some(h) = h
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }

    /// Whether the calling thread is the background thread.
    pub(crate) fn on_background(&self) -> bool {
        self.bg
            .get()
            .is_some_and(|t| t.id() == std::thread::current().id())
    }

    /// Wakes the background thread if it stands down (a command arrived, work was queued
    /// with no caller holding the slot, an async waiter starts): it looks at once, without
    /// waiting out the stand-down after a caller's last turn.
    pub(crate) fn unpark_background(&self) {
        self.caller_left.store(0, Ordering::Release);
        self.shorten_nap();
        if let Some(t) = self.bg.get() {
            t.unpark();
        }
    }

    /// A completion was pushed to a CQ that a thread waits on: `interrupt` the thread that
    /// waits on the sockets, unless that is the caller. Then the waiter may be the holder
    /// itself, and what its own turn ran before blocking (a post scheduled while another
    /// thread had the driver) may be what it waits for, after it last looked: its next
    /// wait does not sleep instead ([`Leader::take_self_wake`]).
    pub(crate) fn wake(&self, interrupt: impl FnOnce()) {
        if self.is_holder() {
            self.self_woken.store(true, Ordering::Release);
        } else {
            interrupt();
        }
    }

    /// Whether the holder woke itself ([`Leader::wake`]) since the last look: if so, the
    /// turn about to block polls without sleeping instead.
    pub(crate) fn take_self_wake(&self) -> bool {
        self.self_woken.load(Ordering::Relaxed) && self.self_woken.swap(false, Ordering::AcqRel)
    }

    /// The calling thread holds the slot.
    pub(crate) fn is_holder(&self) -> bool {
        KEY.with(|k| self.holder.load(Ordering::Acquire) == *k)
    }

    /// A caller (not the background thread) holds the slot: its turns run the commands,
    /// new work and timers.
    pub(crate) fn caller_holds(&self) -> bool {
        self.holder.load(Ordering::Acquire) != 0 && !self.bg_holds.load(Ordering::Acquire)
    }

    /// Callers drive: one wants or holds the slot, or gave it up less than [`STAND_DOWN`]
    /// ago. A caller that handles what its wait returned (a reply to send, a call to run)
    /// comes back in microseconds: the background thread taking the slot meanwhile would
    /// have to be kicked out again, and its turn, or its look at the driver, would
    /// compete for the driver's lock with that caller's transmissions.
    fn standing_down(&self) -> bool {
        if self.want.load(Ordering::Acquire) > 0 {
            return true;
        }
        let left = self.caller_left.load(Ordering::Acquire);
        left != 0
            && self.nanos(Instant::now()).saturating_sub(left) < self.caller_grace.as_nanos() as u64
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// The background thread's data flows: its last arrival is more recent than its
    /// current poll, so its next turn polls rather than sleeps.
    ///
    /// A stream arriving in pieces (a large Read's responses, a Write's segments, a peer's
    /// requests in a ping-pong) would otherwise put the reader to sleep between pieces, and
    /// every piece would pay a wake-up on another core, which costs the sender more than
    /// the piece (in a VM, an IPI): KVM's halt polling, applied to a socket instead of a
    /// CQ, and adaptive as the CQ's poll is (`BusyPoll::Adaptive`): arrivals that come
    /// soon after each other make the poll grow, sparse ones make it shrink to nothing.
    /// Callers waiting in [`Leader::drive`] poll after their own arrivals.
    fn flowing(&self, now: Instant) -> bool {
        let last = self.bg_arrival.load(Ordering::Relaxed);
        let poll = self.bg_poll.now().as_nanos() as u64;
        poll > 0 && last != 0 && self.nanos(now) < last.saturating_add(poll)
    }

    /// Records what a background turn did: an arrival teaches the poll how long it came
    /// after the one before.
    fn note(&self, t: Turn) {
        if t == Turn::Worked {
            self.arrived(self.nanos(Instant::now()));
        }
    }

    /// An arrival at `now` (nanoseconds after `base`).
    fn arrived(&self, now: u64) {
        let now = now.max(1);
        let last = self.bg_arrival.swap(now, Ordering::Relaxed);
        if last != 0 {
            let gap = Duration::from_nanos(now.saturating_sub(last));
            self.bg_poll.learn(self.bg_poll.now(), Some(gap));
        }
    }

    /// One turn of the background thread: `turn(slot, until)` with the slot unless callers
    /// drive (then it naps, see [`STAND_DOWN_MAX`], and `idle` runs, for timers). `until` is
    /// now while data flows ([`FLOW_POLL`]: a poll), else `None` (the turn's own wait).
    /// Returns `false` when `turn` says to stop.
    pub(crate) fn background(
        &self,
        turn: impl FnOnce(&mut S, Option<Instant>) -> Turn,
        idle: impl FnOnce() -> bool,
    ) -> bool {
        if self.standing_down() {
            self.nap();
            return self.idle_unless_driven(idle);
        }
        let Some(mut slot) = self.slot.try_lock() else {
            self.nap();
            return self.idle_unless_driven(idle);
        };
        // Callers stopped: the next stand-down starts short again.
        self.shorten_nap();
        self.bg_holds.store(true, Ordering::Release);
        let now = Instant::now();
        let poll = self.flowing(now).then_some(now);
        let t = self.hold(&mut slot, |s| turn(s, poll));
        self.note(t);
        self.bg_holds.store(false, Ordering::Release);
        drop(slot);
        self.release();
        t != Turn::Stop
    }

    /// `idle` while the background thread stands down, unless a caller holds the slot:
    /// the caller's turns do all of it, and work the background thread took from them
    /// (a queued Send's transmission) would make a third thread busy on the data path,
    /// preempting the two that carry it.
    fn idle_unless_driven(&self, idle: impl FnOnce() -> bool) -> bool {
        let nap = self.bg_nap.load(Ordering::Relaxed);
        if self.caller_holds() || self.standing_down() {
            let longer = nap.saturating_mul(2).min(STAND_DOWN_MAX.as_nanos() as u64);
            // An unpark meanwhile set it back: that look is due now, not doubled.
            let _ = self
                .bg_nap
                .compare_exchange(nap, longer, Ordering::Relaxed, Ordering::Relaxed);
            true
        } else {
            self.shorten_nap();
            idle()
        }
    }

    /// The next nap is [`STAND_DOWN`] again.
    fn shorten_nap(&self) {
        self.bg_nap
            .store(STAND_DOWN.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The background thread stands down: parks for its current nap (an unpark ends it).
    fn nap(&self) {
        std::thread::park_timeout(Duration::from_nanos(self.bg_nap.load(Ordering::Relaxed)));
    }

    fn hold<R>(&self, slot: &mut MutexGuard<'_, S>, f: impl FnOnce(&mut S) -> R) -> R {
        KEY.with(|k| self.holder.store(*k, Ordering::Release));
        let r = f(slot);
        self.holder.store(0, Ordering::Release);
        r
    }

    /// The slot was given up: callers waiting for it on their CQs look again.
    fn release(&self) {
        let pending = std::mem::take(&mut *self.pending.lock());
        for w in pending.iter().filter_map(Weak::upgrade) {
            w.notify();
        }
    }

    /// A caller waiting on `waiter` (a CQ or a channel) drives the transport until `done()`, `until` or a wake:
    /// `turn(slot, until)` blocks on the sockets at most until then and runs what arrived.
    /// The first `spin` of the wait polls (non-blocking turns), and so does each `flow`
    /// after a turn that handled something (zero: never; the background thread's own
    /// poll is [`Leader::flowing`]). `kick`
    /// interrupts the holder's wait. Returns `false` when another caller holds the slot:
    /// that caller runs everything, and this one waits on its CQ (it is told when the slot
    /// is free).
    pub(crate) fn drive(
        &self,
        wait: Wait<'_>,
        kick: impl Fn(),
        mut turn: impl FnMut(&mut S, Option<Instant>) -> Turn,
    ) -> bool {
        let Wait {
            waiter,
            spin,
            flow,
            until,
            done,
        } = wait;
        self.want.fetch_add(1, Ordering::AcqRel);
        let slot = match self.slot.try_lock() {
            Some(s) => Some(s),
            None => {
                // The background thread gives it up as soon as it is kicked; another
                // caller keeps it until its own CQ is served.
                let from_bg = self.bg_holds.load(Ordering::Acquire) && {
                    kick();
                    true
                };
                match from_bg.then(|| self.slot.try_lock_for(HANDOVER)).flatten() {
                    Some(s) => Some(s),
                    None => {
                        self.pending.lock().push(waiter);
                        None
                    }
                }
            }
        };
        let Some(mut slot) = slot else {
            self.want.fetch_sub(1, Ordering::AcqRel);
            return false;
        };
        // One clock reading per turn (after it): the next turn's start, the poll's
        // extension and the time the slot was given up.
        let left = self.hold(&mut slot, |s| {
            let mut now = Instant::now();
            // Callers were away longer than the grace (a server's handler at its disk): the
            // background thread's naps stay short, so it is on duty in such gaps; only
            // callers that come back within the grace let them grow.
            let last = self.caller_left.load(Ordering::Acquire);
            if last != 0
                && self.nanos(now).saturating_sub(last) >= self.caller_grace.as_nanos() as u64
            {
                self.shorten_nap();
            }
            // Non-blocking turns first, then sleeping ones, except for `flow` after each
            // arrival.
            let mut poll_end = now + spin;
            loop {
                if done() || until.is_some_and(|u| now >= u) {
                    break now;
                }
                let poll = now < poll_end;
                let t = turn(s, if poll { Some(now) } else { until });
                now = Instant::now();
                if t == Turn::Worked {
                    poll_end = poll_end.max(now + flow);
                }
            }
        });
        self.caller_left
            .store(self.nanos(left).max(1), Ordering::Release);
        self.want.fetch_sub(1, Ordering::AcqRel);
        drop(slot);
        self.release();
        true
    }
}

/// A pipe that interrupts a `poll(2)` on a driver's socket: one octet while signalled.
pub(crate) struct WakePipe {
    reader: std::io::PipeReader,
    writer: std::io::PipeWriter,
    set: AtomicBool,
}

impl WakePipe {
    pub(crate) fn new() -> std::io::Result<WakePipe> {
        let (reader, writer) = std::io::pipe()?;
        Ok(WakePipe {
            reader,
            writer,
            set: AtomicBool::new(false),
        })
    }

    /// Makes the read end readable (once until cleared; never blocks: one octet at most).
    pub(crate) fn signal(&self) {
        if !self.set.swap(true, Ordering::AcqRel) {
            let _ = (&self.writer).write_all(&[1]);
        }
    }

    /// Takes the octet after `poll` said the read end is readable.
    pub(crate) fn clear(&self) {
        if self.set.swap(false, Ordering::AcqRel) {
            let mut b = [0u8; 1];
            // The signaller wrote it, or is about to.
            let _ = (&self.reader).read_exact(&mut b);
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.reader.as_fd()
    }
}

#[cfg(test)]
mod tests;
