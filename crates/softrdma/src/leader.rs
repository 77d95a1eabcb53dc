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

    /// One turn of the background thread: `turn` with the slot unless callers drive (then
    /// it parks for [`STAND_DOWN`] and `idle` runs, for timers). Returns `false` when
    /// `turn` says to stop.
    pub(crate) fn background(
        &self,
        turn: impl FnOnce(&mut S) -> bool,
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
        let go_on = self.hold(&mut slot, turn);
        self.bg_holds.store(false, Ordering::Release);
        drop(slot);
        self.release();
        go_on
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
    /// `kick` interrupts the holder's wait. Returns `false` when another caller holds the
    /// slot: that caller runs everything, and this one waits on its CQ (it is told when the
    /// slot is free).
    pub(crate) fn drive(
        &self,
        waiter: Weak<dyn Waiter>,
        spin: Duration,
        until: Option<Instant>,
        done: &dyn Fn() -> bool,
        kick: impl Fn(),
        mut turn: impl FnMut(&mut S, Option<Instant>),
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
                // Non-blocking turns first, then sleeping ones.
                turn(s, if now < spin_end { Some(now) } else { until });
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
