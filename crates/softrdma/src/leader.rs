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
//! background thread stands down and looks again every [`STAND_DOWN`].
//!
//! Lock order: slot, then the driver's state, then a QP's submission queue, then a CQ.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

/// Something a thread sleeps on (a CQ, a completion channel): told when a driver's slot is
/// free to take (see [`crate::leader`]).
pub(crate) trait Waiter: Send + Sync {
    /// Wakes the sleepers.
    fn notify(&self);
}

/// How long the background thread stands down while callers drive, before it looks again.
pub(crate) const STAND_DOWN: Duration = Duration::from_millis(1);

/// How long a caller waits for the kicked background thread to hand the slot over.
const HANDOVER: Duration = Duration::from_millis(20);

/// How long the background thread keeps polling after a turn that handled something
/// (callers bring their CQ's busy poll instead; see [`Leader::drive`]).
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

/// The slot and the bookkeeping of who wants it.
pub(crate) struct Leader<S> {
    slot: Mutex<S>,
    /// The background thread holds the slot (it gives it up when kicked).
    bg_holds: AtomicBool,
    /// Callers that want the slot or hold it.
    want: AtomicUsize,
    /// The thread holding the slot (a hash of its id; 0: none).
    holder: AtomicU64,
    /// CQs whose waiters found the slot held by another caller: told when it is free.
    pending: Mutex<Vec<Weak<dyn Waiter>>>,
    bg: OnceLock<Thread>,
    /// Until when the holder polls instead of sleeping (nanoseconds after `base`; see
    /// [`Leader::flowing`]). Only the holder writes it.
    flow_until: AtomicU64,
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
            pending: Mutex::new(Vec::new()),
            bg: OnceLock::new(),
            flow_until: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// Names the background thread (to unpark it).
    pub(crate) fn set_background(&self, t: Thread) {
        let _ = self.bg.set(t);
    }

    /// Wakes the background thread if it stands down (a command arrived).
    pub(crate) fn unpark_background(&self) {
        if let Some(t) = self.bg.get() {
            t.unpark();
        }
    }

    /// The calling thread holds the slot.
    pub(crate) fn is_holder(&self) -> bool {
        KEY.with(|k| self.holder.load(Ordering::Acquire) == *k)
    }

    fn standing_down(&self) -> bool {
        self.want.load(Ordering::Acquire) > 0
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Data flowed within the last flow poll: the next turn polls rather than sleeps.
    ///
    /// A stream arriving in pieces (a large Read's responses, a Write's segments) would
    /// otherwise put the reader to sleep between pieces, and every piece would pay a
    /// wake-up on another core, which costs the sender more than the piece (in a VM, an
    /// IPI): KVM's halt polling, applied to a socket instead of a CQ.
    fn flowing(&self, now: Instant) -> bool {
        self.nanos(now) < self.flow_until.load(Ordering::Relaxed)
    }

    /// Records what a turn did: one that handled something starts a flow poll of `poll`.
    fn note(&self, t: Turn, poll: Duration) {
        if t == Turn::Worked && !poll.is_zero() {
            let until = self.nanos(Instant::now() + poll);
            self.flow_until.store(until, Ordering::Relaxed);
        }
    }

    /// One turn of the background thread: `turn(slot, until)` with the slot unless callers
    /// drive (then it parks for [`STAND_DOWN`] and `idle` runs, for timers). `until` is
    /// now while data flows ([`FLOW_POLL`]: a poll), else `None` (the turn's own wait).
    /// Returns `false` when `turn` says to stop.
    pub(crate) fn background(
        &self,
        turn: impl FnOnce(&mut S, Option<Instant>) -> Turn,
        idle: impl FnOnce() -> bool,
    ) -> bool {
        if self.standing_down() {
            std::thread::park_timeout(STAND_DOWN);
            return idle();
        }
        let Some(mut slot) = self.slot.try_lock() else {
            std::thread::park_timeout(STAND_DOWN);
            return idle();
        };
        self.bg_holds.store(true, Ordering::Release);
        let now = Instant::now();
        let poll = self.flowing(now).then_some(now);
        let t = self.hold(&mut slot, |s| turn(s, poll));
        self.note(t, FLOW_POLL);
        self.bg_holds.store(false, Ordering::Release);
        drop(slot);
        self.release();
        t != Turn::Stop
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
    /// after a turn that handled something ([`Leader::flowing`]; zero: never). `kick`
    /// interrupts the holder's wait. Returns `false` when another caller holds the slot:
    /// that caller runs everything, and this one waits on its CQ (it is told when the slot
    /// is free).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn drive(
        &self,
        waiter: Weak<dyn Waiter>,
        spin: Duration,
        flow: Duration,
        until: Option<Instant>,
        done: &dyn Fn() -> bool,
        kick: impl Fn(),
        mut turn: impl FnMut(&mut S, Option<Instant>) -> Turn,
    ) -> bool {
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
        self.hold(&mut slot, |s| {
            let spin_end = Instant::now() + spin;
            loop {
                let now = Instant::now();
                if done() || until.is_some_and(|u| now >= u) {
                    break;
                }
                // Non-blocking turns first, then sleeping ones, unless data flows.
                let poll = now < spin_end || (!flow.is_zero() && self.flowing(now));
                let t = turn(s, if poll { Some(now) } else { until });
                self.note(t, flow);
            }
        });
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
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::sync::Arc;

    struct NoWaiter;
    impl Waiter for NoWaiter {
        fn notify(&self) {}
    }

    fn waiter() -> (Arc<NoWaiter>, Weak<dyn Waiter>) {
        let w = Arc::new(NoWaiter);
        let weak: Weak<dyn Waiter> = Arc::downgrade(&w) as Weak<dyn Waiter>;
        (w, weak)
    }

    /// Drives with `flow` until the first blocking turn after an arrival; returns the
    /// turns' deadlines (`true`: a poll) and the time from the arrival to that turn.
    fn drive_after_arrival(flow: Duration) -> (Vec<bool>, Duration) {
        let l = Leader::new(());
        let (_w, weak) = waiter();
        let deadline = Instant::now() + Duration::from_secs(3600);
        let polls = RefCell::new(Vec::new());
        let arrived = Cell::new(None::<Instant>);
        let blocked_after = Cell::new(None::<Duration>);
        let done = || blocked_after.get().is_some();
        assert!(l.drive(weak, Duration::ZERO, flow, Some(deadline), &done, || {}, |_, until| {
            let poll = until != Some(deadline);
            polls.borrow_mut().push(poll);
            match arrived.get() {
                None => {
                    arrived.set(Some(Instant::now()));
                    Turn::Worked
                }
                Some(at) => {
                    if !poll {
                        blocked_after.set(Some(at.elapsed()));
                    }
                    Turn::Idle
                }
            }
        }));
        (polls.into_inner(), blocked_after.get().expect("a blocking turn"))
    }

    #[test]
    fn an_arrival_makes_the_caller_poll_for_the_flow_then_sleep() {
        let flow = Duration::from_millis(2);
        let (polls, after) = drive_after_arrival(flow);
        assert!(!polls[0], "the first turn may sleep: nothing flowed yet");
        assert!(polls.len() > 2, "turns after the arrival poll: {polls:?}");
        assert!(polls[1..polls.len() - 1].iter().all(|&p| p));
        assert!(after >= flow, "slept {after:?} after the arrival, before the flow ended");
    }

    #[test]
    fn without_a_flow_the_caller_sleeps_right_after_an_arrival() {
        let (polls, _) = drive_after_arrival(Duration::ZERO);
        assert_eq!(polls, [false, false]);
    }

    #[test]
    fn the_background_thread_polls_while_data_flows() {
        let l = Leader::new(());
        let mut seen = Vec::new();
        assert!(l.background(
            |_, until| {
                seen.push(until.is_some());
                Turn::Idle
            },
            || true
        ));
        // A caller's turn handled something, with a flow far longer than this test.
        l.note(Turn::Worked, Duration::from_secs(3600));
        assert!(l.background(
            |_, until| {
                seen.push(until.is_some());
                Turn::Worked
            },
            || true
        ));
        assert!(!l.background(|_, _| Turn::Stop, || true));
        assert_eq!(seen, [false, true]);
        // An idle turn ends no flow and starts none; a flow of zero starts none.
        let fresh = Leader::new(());
        fresh.note(Turn::Idle, Duration::from_secs(3600));
        fresh.note(Turn::Worked, Duration::ZERO);
        assert!(!fresh.flowing(Instant::now()));
    }
}
