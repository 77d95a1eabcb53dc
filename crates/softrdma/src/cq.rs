//! Completion queues and completion channels (`ibv_cq`, `ibv_comp_channel`).
//!
//! The progress thread appends work completions; users poll them. A CQ armed with
//! [`Cq::req_notify`] reports the next completion (or the next solicited / unsuccessful one)
//! once to its [`CompletionChannel`], which offers a blocking wait and a pollable file
//! descriptor: one end of a pipe holding one octet while events are pending, so it polls
//! readable exactly when [`CompletionChannel::try_get_cq_event`] would return a CQ.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use event_listener::{Event, EventListener};
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;
use softrdma_verbs_types::{WcStatus, WorkCompletion};

use crate::Error;
use crate::event::{AsyncEvent, EventQueue};
pub use crate::leader::{BusyPoll, DEFAULT_BACKGROUND_POLL, DEFAULT_BUSY_POLL};

mod channel;

use self::channel::ChannelShared;
pub use self::channel::CompletionChannel;
use crate::leader::{Leader, STAND_DOWN, Spin, Turn, Wait, Waiter};

/// How long the polls of a CQ find nothing before each yields its core ([`Cq::poll_each`]):
/// longer than a round trip here, so that a ping-pong's poller keeps its core.
const YIELD_AFTER: Duration = Duration::from_micros(50);

/// What [`Cq::poll`] does on a queue that has stayed quiet a long time — no completion, and
/// nothing arriving for its QPs, polled by a thread whose polls of every queue have found
/// nothing as long: each poll first waits up to `wait` for a completion or an arrival
/// (returning as soon as one comes) instead of returning at once, and runs the transport
/// meanwhile when it can (`Cq::back_off`).
///
/// A program that spins on a CQ that nothing completes into — perftest's `-R` server on its
/// control queue for a whole bandwidth test — otherwise holds a core the library's own
/// threads need to move data (a NIC's CQ is memory the NIC writes; here, the data path is
/// threads of the program's process): issue 43, 64 KiB Writes on two cores, 1.5 GB/s
/// without, 2.2 GB/s with (2.6 with a 1 ms `wait`). Arrivals count as activity, so a program
/// polling the queue while it watches memory its QPs' peers write into never waits. The
/// cost: one that polls a quiet queue while it waits for something that concerns none of
/// the queue's QPs (another context, a socket, another thread) sees it up to `wait` late,
/// and only after `after` of quiet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollBackoff {
    /// How long the polls find nothing first.
    pub after: Duration,
    /// The longest wait of each poll after that.
    pub wait: Duration,
}

/// What a new `Cq` does: waits of up to 100 µs once its polls found nothing for 1 ms.
pub const DEFAULT_POLL_BACKOFF: Option<PollBackoff> = Some(PollBackoff {
    after: Duration::from_millis(1),
    wait: Duration::from_micros(100),
});

static NEXT_CQ_ID: AtomicU32 = AtomicU32::new(1);

thread_local! {
    /// When this thread's polls, of every queue, began to find nothing (`None`: its last
    /// poll found a completion).
    static THREAD_QUIET_SINCE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Whether this thread's polls have found nothing, on any queue, for `after`: a thread that
/// polls a quiet queue beside a busy one (a send queue and a receive queue, one queue per
/// peer, as UCX's and MPI's progress loops do) is not idle, and a poll that waited would
/// hold up the busy queue's completions ([`PollBackoff`]).
fn thread_quiet(after: Duration) -> bool {
    let now = Instant::now();
    match THREAD_QUIET_SINCE.get() {
        Some(since) => now.saturating_duration_since(since) >= after,
        None => {
            THREAD_QUIET_SINCE.set(Some(now));
            false
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Off,
    Next,
    Solicited,
}

struct CqState {
    entries: VecDeque<WorkCompletion>,
    arm: Arm,
    /// Completions that arrived while the queue held `capacity` entries, or after it
    /// overran: dropped.
    overflows: u64,
}

/// What [`CqShared::push`] found: the queue overran (now or before), so the pusher's QP
/// goes to Error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Pushed {
    /// Every completion was queued.
    Queued,
    /// The queue is in error.
    Overrun,
}

/// A driver that a thread polling or waiting on a CQ runs itself (caller-driven progress,
/// see [`crate::leader`]).
pub(crate) trait Progress: Send + Sync {
    /// Processes what has arrived for `cq`'s QPs, without blocking (a busy poller's turn).
    fn progress(&self, cq: &CqShared);
    /// Blocks on the driver's sockets until `done()`, `until`, or a wake, running what
    /// arrives — polling without sleeping for the first `spin` (hybrid wait, as
    /// `SO_BUSY_POLL`) and for `flow` after each arrival (see `Leader::drive`); `false`
    /// when another thread drives (then wait on the CQ).
    fn block(&self, wait: Wait<'_>) -> bool;
    /// A completion was queued for a waiter that may be blocked in [`Progress::block`].
    fn wake(&self);
    /// A task awaits completions: the background thread, if it stands down after a
    /// caller drove, looks again now rather than after [`STAND_DOWN`].
    fn nudge(&self);
}

/// What a driver whose sockets are waited on through a [`Leader`] supplies; the waiting
/// and waking around it ([`Progress`]) is the same for every driver.
pub(crate) trait Driven: Send + Sync {
    /// What the thread that waits on the sockets holds.
    type Slot;
    fn leader(&self) -> &Leader<Self::Slot>;
    /// Interrupts a thread blocked in the sockets' poll.
    fn interrupt(&self);
    /// A caller's turn: waits on the sockets until `until` and runs what arrives.
    fn caller_turn(&self, slot: &mut Self::Slot, until: Option<Instant>) -> Turn;
    /// After a caller's blocking wait: what a post left to the thread that waited.
    fn after_block(&self) {}
    /// A busy poller's pass: what has arrived for `cq`'s QPs, without blocking.
    fn poll_once(&self, cq: &CqShared);
}

/// Every driver waits and wakes alike: the [`Leader`](crate::leader::Leader) decides who
/// waits on the sockets; the driver says how to interrupt that wait and what one turn is.
impl<D: Driven> Progress for D {
    fn progress(&self, cq: &CqShared) {
        self.poll_once(cq);
    }

    fn block(&self, wait: Wait<'_>) -> bool {
        let drove = self.leader().drive(
            wait,
            || self.interrupt(),
            |slot, until| self.caller_turn(slot, until),
        );
        self.after_block();
        drove
    }

    fn nudge(&self) {
        self.leader().unpark_background();
    }

    fn wake(&self) {
        self.leader().wake(|| self.interrupt());
    }
}

pub(crate) struct CqShared {
    /// Drivers of the QPs that complete into this queue (see [`Progress`]).
    progress: Mutex<Vec<Weak<dyn Progress>>>,
    /// Waiters blocked in a driver's [`Progress::block`] for this queue.
    io_waiters: AtomicUsize,
    /// How long [`Cq::wait`] polls before it blocks.
    spin: Spin,
    id: u32,
    capacity: usize,
    state: Mutex<CqState>,
    /// The queue overran: it is in error for good (IBA 11.4.2.1 "CQ overrun"). Set once,
    /// under `state`; read without it (a push of nothing, which every driver pass makes,
    /// only asks this).
    overran: AtomicBool,
    /// Wakes [`Cq::wait`] callers on every push.
    cond: Condvar,
    /// Wakes tasks awaiting the queue ([`Completions`]) on every push.
    ready: Event,
    channel: Option<Arc<ChannelShared>>,
    /// The context's asynchronous events (`CqError`).
    events: Option<Arc<EventQueue>>,
    /// When the polls that found nothing began (nanoseconds after `base`; 0: the last poll
    /// found something), see [`Cq::poll_each`].
    empty_since: AtomicU64,
    base: Instant,
    /// [`PollBackoff`] in nanoseconds (`after` 0: none).
    backoff_after: AtomicU64,
    backoff_wait: AtomicU64,
    /// Polls that waited ([`Cq::poll_backoffs`]).
    backoffs: AtomicU64,
    /// Arrivals for QPs completing here ([`CqShared::arrived`]), and the count the last
    /// poll saw.
    arrivals: AtomicU64,
    seen_arrivals: AtomicU64,
    /// When polls began to find neither completions nor arrivals (nanoseconds after
    /// `base`; 0: the last one found one), for [`PollBackoff`].
    quiet_since: AtomicU64,
    /// Polls waiting ([`PollBackoff`]): arrivals wake them.
    parked: AtomicUsize,
}

impl Waiter for CqShared {
    fn notify(&self) {
        let _s = self.state.lock();
        self.cond.notify_all();
    }
}

impl CqShared {
    /// A driver of QPs completing here: pollers and waiters of the queue run it.
    pub(crate) fn attach(&self, d: Weak<dyn Progress>) {
        let mut p = self.progress.lock();
        p.retain(|x| x.strong_count() > 0);
        if !p.iter().any(|x| x.ptr_eq(&d)) {
            p.push(d);
        }
    }

    pub(crate) fn drivers(&self) -> SmallVec<[Arc<dyn Progress>; 1]> {
        self.progress
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Octets or packets arrived for a QP completing here: polls of the queue are not idle
    /// ([`PollBackoff`]: a program polling it while it watches memory the peer writes into
    /// is waiting for those), and one waiting is woken.
    pub(crate) fn arrived(&self) {
        self.arrivals.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            // Under the lock: a poll that counted itself parked and saw no arrival yet
            // holds it until it waits, so the notification cannot come before the wait.
            let _s = self.state.lock();
            self.cond.notify_all();
        }
    }

    /// Drives `d` as this queue's waiter ([`Progress::block`], the queue's flow poll),
    /// counted among the waiters a push interrupts; `false` when another thread drives.
    fn block_on(
        self: &Arc<Self>,
        d: &dyn Progress,
        spin: Duration,
        until: Option<Instant>,
        done: &dyn Fn() -> bool,
    ) -> bool {
        self.io_waiters.fetch_add(1, Ordering::AcqRel);
        let w: Weak<dyn Waiter> = Arc::downgrade(self) as Weak<dyn Waiter>;
        let drove = d.block(Wait {
            waiter: w,
            spin,
            flow: self.spin.flow(),
            until,
            done,
        });
        self.io_waiters.fetch_sub(1, Ordering::AcqRel);
        drove
    }

    fn has_entries(&self) -> bool {
        !self.state.lock().entries.is_empty()
    }

    /// Appends completions (progress thread); fires the channel if armed and matching.
    ///
    /// A completion that finds the queue full overruns it (IBA 11.4.2.1): it and every later
    /// one are dropped and counted, what the queue holds stays to be polled, and the
    /// pushers learn it so that their QPs go to Error — the QPs of other queues are not
    /// touched (RFC 5040 §8.1.1 #10, RDMAP-124). Memory stays bounded by the capacity.
    /// Each is marked as `qp_num`'s (`ibv_wc.qp_num`).
    pub(crate) fn push(self: &Arc<Self>, qp_num: u32, wcs: &mut Vec<WorkCompletion>) -> Pushed {
        if wcs.is_empty() {
            return match self.overran.load(Ordering::Acquire) {
                true => Pushed::Overrun,
                false => Pushed::Queued,
            };
        }
        let mut fire = false;
        let pushed;
        {
            let mut s = self.state.lock();
            let was = self.overran.load(Ordering::Acquire);
            let mut overrun = was;
            for mut wc in wcs.drain(..) {
                wc.qp_num = qp_num;
                if overrun || s.entries.len() >= self.capacity {
                    overrun = true;
                    s.overflows += 1;
                    continue;
                }
                fire |= match s.arm {
                    Arm::Off => false,
                    Arm::Next => true,
                    // IBA 11.4.2.2: solicited, or completed in error.
                    Arm::Solicited => wc.flags.solicited || wc.status != WcStatus::Success,
                };
                s.entries.push_back(wc);
            }
            pushed = match overrun {
                true => Pushed::Overrun,
                false => Pushed::Queued,
            };
            if overrun && !was {
                self.overran.store(true, Ordering::Release);
                tracing::warn!(
                    cq = self.id,
                    capacity = self.capacity,
                    "completion queue overran: in error, its QPs go to Error"
                );
                if let Some(ev) = &self.events {
                    ev.post(AsyncEvent::CqError { cq_id: self.id });
                }
            }
            if fire {
                s.arm = Arm::Off;
            }
        }
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
        let ch = self.channel.as_ref().filter(|_| fire);
        let channel_waits = ch.is_some_and(|c| c.io_waiters.load(Ordering::Acquire) > 0);
        if channel_waits || self.io_waiters.load(Ordering::Acquire) > 0 {
            for d in self.drivers() {
                d.wake();
            }
        }
        if let Some(ch) = ch {
            ch.push_event(Arc::downgrade(self));
        }
        pushed
    }
}

/// A completion queue (`ibv_cq`). Cheap to clone: clones name the same queue.
///
/// A queue holds at most [`capacity`](Cq::capacity) completions. One more overruns it, as a
/// hardware CQ (IBA 11.4.2.1): the queue goes to error for good ([`is_overrun`](Cq::is_overrun)),
/// that completion and every later one are dropped and counted in
/// [`overflows`](Cq::overflows), [`AsyncEvent::CqError`](crate::AsyncEvent::CqError) is
/// posted, and each QP that completes into it goes to Error (iWARP: a Local Catastrophic
/// Terminate). QPs of other queues carry on (RDMAP-124). What the queue held can still be
/// polled. Size it for every request its QPs may have outstanding.
#[derive(Clone)]
pub struct Cq {
    pub(crate) shared: Arc<CqShared>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("id", &self.shared.id)
            .field("capacity", &self.shared.capacity)
            .finish()
    }
}

impl PartialEq for Cq {
    fn eq(&self, other: &Cq) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for Cq {}

impl Cq {
    pub(crate) fn new(
        capacity: usize,
        channel: Option<&CompletionChannel>,
        events: Option<Arc<EventQueue>>,
    ) -> Cq {
        let cq = Cq {
            shared: Arc::new(CqShared {
                progress: Mutex::new(Vec::new()),
                io_waiters: AtomicUsize::new(0),
                spin: Spin::new(DEFAULT_BUSY_POLL),
                id: NEXT_CQ_ID.fetch_add(1, Ordering::Relaxed),
                capacity: capacity.max(1),
                state: Mutex::new(CqState {
                    entries: VecDeque::new(),
                    arm: Arm::Off,
                    overflows: 0,
                }),
                overran: AtomicBool::new(false),
                cond: Condvar::new(),
                ready: Event::new(),
                channel: channel.map(|c| c.shared.clone()),
                events,
                empty_since: AtomicU64::new(0),
                base: Instant::now(),
                backoff_after: AtomicU64::new(0),
                backoff_wait: AtomicU64::new(0),
                backoffs: AtomicU64::new(0),
                arrivals: AtomicU64::new(0),
                seen_arrivals: AtomicU64::new(0),
                quiet_since: AtomicU64::new(0),
                parked: AtomicUsize::new(0),
            }),
        };
        cq.set_poll_backoff(DEFAULT_POLL_BACKOFF);
        if let Some(ch) = channel {
            let mut cqs = ch.shared.cqs.lock();
            cqs.retain(|w| w.strong_count() > 0);
            cqs.push(Arc::downgrade(&cq.shared));
        }
        cq
    }

    /// A process-unique id.
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// The number of entries the queue was created for (`cqe`).
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Completions that arrived while the queue was full or after it overran (dropped).
    pub fn overflows(&self) -> u64 {
        self.shared.state.lock().overflows
    }

    /// The queue overran and is in error: no completion is queued any more.
    pub fn is_overrun(&self) -> bool {
        self.shared.overran.load(Ordering::Acquire)
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.shared.state.lock().entries.len()
    }

    /// `true` when nothing waits to be polled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The channel this queue reports to, if any.
    pub fn channel(&self) -> Option<CompletionChannel> {
        self.shared
            .channel
            .as_ref()
            .map(|c| CompletionChannel { shared: c.clone() })
    }

    /// Moves up to `max` completions, oldest first, to the end of `out` (`ibv_poll_cq`);
    /// returns how many.
    ///
    /// On an empty queue fed by RoCE QPs, the calling thread first reads and processes the
    /// datagrams that have arrived (a busy-polling caller then sees a completion without any
    /// thread hand-off, as with a hardware CQ).
    pub fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        self.poll_each(max, |wc| out.push(wc))
    }

    /// [`Cq::poll`] handing each completion to `f` instead of a vector (a C caller's array):
    /// the transport is driven at most once per call, however many are taken.
    pub fn poll_each(&self, max: usize, mut f: impl FnMut(WorkCompletion)) -> usize {
        self.drive();
        let mut s = self.shared.state.lock();
        let n = max.min(s.entries.len());
        s.entries.drain(..n).for_each(&mut f);
        n
    }

    /// The oldest completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        self.drive();
        self.shared.state.lock().entries.pop_front()
    }

    /// A poll found completions: neither the queue nor this thread is quiet.
    fn found(&self) {
        self.shared.empty_since.store(0, Ordering::Relaxed);
        self.shared.quiet_since.store(0, Ordering::Relaxed);
        THREAD_QUIET_SINCE.set(None);
    }

    fn drive(&self) {
        let q = &self.shared;
        if q.has_entries() {
            return self.found();
        }
        let drivers = q.drivers();
        for d in &drivers {
            d.progress(q);
        }
        if q.has_entries() {
            return self.found();
        }
        // A program that spins on its CQ (perftest, every verbs benchmark) holds a core the
        // background thread may need to move its data: once its polls have found nothing
        // for a while, each gives the core to whoever else is runnable there (issue 43:
        // 64 KiB Writes on two cores, 0.65 GB/s without, 2.1 GB/s with). Sooner, a poll
        // that waits for an answer would yield to the thread that handles that answer's
        // arrival and lose the race for it; alone on its core, a yield returns at once.
        // Found nothing for longer still, each waits for a push ([`PollBackoff`]).
        // Another poller may have stored a later instant than this thread's `now`.
        let now = (q.base.elapsed().as_nanos() as u64).max(1);
        let a = q.arrivals.load(Ordering::Relaxed);
        let quiet = match q.quiet_since.load(Ordering::Relaxed) {
            t if t == 0 || q.seen_arrivals.swap(a, Ordering::Relaxed) != a => {
                q.quiet_since.store(now, Ordering::Relaxed);
                now
            }
            t => t,
        };
        let after = q.backoff_after.load(Ordering::Relaxed);
        if after > 0
            && now.saturating_sub(quiet) >= after
            && thread_quiet(Duration::from_nanos(after))
        {
            return self.back_off(&drivers, a);
        }
        match q.empty_since.load(Ordering::Relaxed) {
            0 => q.empty_since.store(now, Ordering::Relaxed),
            t if now.saturating_sub(t) >= YIELD_AFTER.as_nanos() as u64 => std::thread::yield_now(),
            _ => {}
        }
    }

    /// A poll of a queue quiet for longer than its back-off's `after`: waits until a push,
    /// an arrival, or the back-off's `wait`.
    ///
    /// With one driver, this thread drives it meanwhile, as [`Cq::wait`] does: it blocks on
    /// the sockets and runs whatever arrives, for every QP of the context. The program's
    /// polling thread is then the one that moves the data — a perftest `-R` server's
    /// Writes, which complete into another queue, or a sender's frames still queued behind
    /// a full socket — not a second thread it sleeps beside, woken to hand over work and
    /// competing with it for the core (issue 43). Otherwise (another thread drives, or
    /// several drivers), it sleeps on the queue and the drivers' background threads are
    /// told to look now, so that what arrives meanwhile is handled.
    fn back_off(&self, drivers: &[Arc<dyn Progress>], seen: u64) {
        let q = &self.shared;
        let wait = Duration::from_nanos(q.backoff_wait.load(Ordering::Relaxed));
        if let [d] = drivers {
            let until = Instant::now() + wait;
            let done = || q.has_entries() || q.arrivals.load(Ordering::Relaxed) != seen;
            if q.block_on(&**d, Duration::ZERO, Some(until), &done) {
                q.backoffs.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        for d in drivers {
            d.nudge();
        }
        let mut s = q.state.lock();
        q.parked.fetch_add(1, Ordering::SeqCst);
        if s.entries.is_empty() && q.arrivals.load(Ordering::SeqCst) == seen {
            // Counted under the lock the wait lets go: a push seen after the count comes
            // while this thread waits. Every push notifies `cond`, and so does an arrival
            // seen after `parked` (one just before it waits for the next).
            q.backoffs.fetch_add(1, Ordering::Relaxed);
            let _ = q.cond.wait_for(&mut s, wait);
        }
        q.parked.fetch_sub(1, Ordering::Relaxed);
    }

    /// How polls of a queue that stays empty back off ([`PollBackoff`]; `None`: they never
    /// wait). New queues have [`DEFAULT_POLL_BACKOFF`].
    pub fn set_poll_backoff(&self, b: Option<PollBackoff>) {
        let ns = |d: Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64;
        let (after, wait) = b.map_or((0, 0), |b| (ns(b.after).max(1), ns(b.wait)));
        self.shared.backoff_wait.store(wait, Ordering::Relaxed);
        self.shared.backoff_after.store(after, Ordering::Relaxed);
    }

    /// How many polls have waited for a push ([`PollBackoff`]).
    pub fn poll_backoffs(&self) -> u64 {
        self.shared.backoffs.load(Ordering::Relaxed)
    }

    /// The back-off of [`Cq::set_poll_backoff`].
    pub fn poll_backoff(&self) -> Option<PollBackoff> {
        let after = self.shared.backoff_after.load(Ordering::Relaxed);
        (after > 0).then(|| PollBackoff {
            after: Duration::from_nanos(after),
            wait: Duration::from_nanos(self.shared.backoff_wait.load(Ordering::Relaxed)),
        })
    }

    /// How [`Cq::wait`] polls the transport before it sleeps ([`DEFAULT_BUSY_POLL`]:
    /// adaptive).
    pub fn set_busy_poll(&self, mode: BusyPoll) {
        self.shared.spin.set(mode);
    }

    /// The busy-poll setting of [`Cq::wait`].
    pub fn busy_poll(&self) -> BusyPoll {
        self.shared.spin.get()
    }

    /// Arms the queue (`ibv_req_notify_cq`): the next completion added after this call — with
    /// `solicited_only`, the next solicited or unsuccessful one — sends one event to the
    /// completion channel. Completions already queued do not; poll after arming.
    pub fn req_notify(&self, solicited_only: bool) {
        let mut s = self.shared.state.lock();
        s.arm = match (s.arm, solicited_only) {
            // Asking for "any" widens an earlier "solicited only".
            (_, false) => Arm::Next,
            (Arm::Next, true) => Arm::Next,
            (_, true) => Arm::Solicited,
        };
    }

    /// Blocks until at least `min` completions were moved to `out` (at most `max`), or
    /// `timeout` passes ([`Error::Timeout`], with what arrived so far still in `out`). Waits
    /// on the queue itself, independent of any channel or arming.
    ///
    /// The waiting thread runs the transport of the queue's QPs itself when it can (it
    /// blocks on their sockets, so what it waits for wakes it directly); otherwise the
    /// thread that runs it hands the completions over.
    pub fn wait(
        &self,
        min: usize,
        max: usize,
        timeout: Duration,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize, Error> {
        let deadline = Instant::now() + timeout;
        let mut got = 0;
        loop {
            {
                let mut s = self.shared.state.lock();
                let n = (max - got).min(s.entries.len());
                out.extend(s.entries.drain(..n));
                got += n;
            }
            if got >= min || got >= max {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            let drivers = self.shared.drivers();
            if let [d] = &drivers[..] {
                let q = &self.shared;
                let spin = q.spin.now();
                let t0 = Instant::now();
                if q.block_on(&**d, spin, Some(deadline), &|| q.has_entries()) {
                    q.spin.learn(spin, q.has_entries().then(|| t0.elapsed()));
                    continue;
                }
            }
            // Another thread drives: it hands completions over through the condition
            // variable (and says when the driver is free to take).
            let mut s = self.shared.state.lock();
            if s.entries.is_empty() {
                let until = if drivers.is_empty() {
                    deadline
                } else {
                    deadline.min(Instant::now() + STAND_DOWN)
                };
                let _ = self.shared.cond.wait_until(&mut s, until);
            }
        }
    }
}

/// Async forms of [`Cq::poll_one`] and [`Cq::wait`]: futures of any runtime.
///
/// A task awaiting a queue never drives the sockets itself: it reads what has already
/// arrived (as [`Cq::poll`] does) and then sleeps until a completion is pushed, by the
/// context's background thread (which runs the transport while no thread blocks in
/// [`Cq::wait`]), a posting thread or a blocked waiter. Every future here is cancel-safe:
/// a completion is taken from the queue only when the future returns it.
impl Cq {
    /// A handle for a task polling this queue by hand (`poll_*` methods, for a `Stream` or
    /// a future of your own).
    pub fn completions(&self) -> Completions {
        Completions {
            cq: self.clone(),
            listener: None,
        }
    }

    /// Resolves once the queue holds a completion, taking none (readiness, as tokio's
    /// `AsyncFd::readable`: then [`Cq::poll`] in batches). Transport progress as in
    /// [`Cq::poll`].
    pub fn ready(&self) -> impl Future<Output = ()> + Send + '_ {
        let mut c = self.completions();
        poll_fn(move |cx| c.poll_ready(cx))
    }

    /// The oldest completion, once there is one (async [`Cq::poll_one`]).
    pub fn next(&self) -> impl Future<Output = WorkCompletion> + Send + '_ {
        let mut c = self.completions();
        poll_fn(move |cx| c.poll_next(cx))
    }

    /// Moves between `min` (at least 1) and `max` completions to the end of `out`, once
    /// `min` are there (async [`Cq::wait`], without a timeout: wrap it in your runtime's);
    /// returns how many. Dropped early, what it moved stays in `out`.
    pub fn wait_async<'a>(
        &'a self,
        min: usize,
        max: usize,
        out: &'a mut Vec<WorkCompletion>,
    ) -> impl Future<Output = usize> + Send + 'a {
        let mut c = self.completions();
        let (min, mut got) = (min.max(1).min(max), 0);
        poll_fn(move |cx| {
            while got < min {
                got += std::task::ready!(c.poll_batch(cx, max - got, out));
            }
            Poll::Ready(got)
        })
    }
}

/// A task's view of a [`Cq`] ([`Cq::completions`]): `poll_*` methods that register the
/// task's waker when the queue is empty. Cheap; one per task.
pub struct Completions {
    cq: Cq,
    listener: Option<EventListener>,
}

impl std::fmt::Debug for Completions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions").field("cq", &self.cq).finish()
    }
}

impl Completions {
    /// The queue.
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// `Ready` when the queue holds a completion (none taken), or `Pending` with the task
    /// woken on the next one.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_with(cx, |cq| {
            cq.drive();
            cq.shared.has_entries().then_some(())
        })
    }

    /// The oldest completion, or `Pending` with the task woken on the next one (the
    /// signature of `Stream::poll_next` less the `Option`: a queue never ends).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<WorkCompletion> {
        self.poll_with(cx, Cq::poll_one)
    }

    /// Moves up to `max` completions to the end of `out`: `Ready(n)` with `n >= 1` (0 only
    /// for `max == 0`), or `Pending` with the task woken on the next one.
    pub fn poll_batch(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Poll<usize> {
        if max == 0 {
            return Poll::Ready(0);
        }
        self.poll_with(cx, |cq| Some(cq.poll(max, out)).filter(|&n| n > 0))
    }

    fn poll_with<R>(
        &mut self,
        cx: &mut Context<'_>,
        mut take: impl FnMut(&Cq) -> Option<R>,
    ) -> Poll<R> {
        loop {
            if let Some(r) = take(&self.cq) {
                self.listener = None;
                return Poll::Ready(r);
            }
            match &mut self.listener {
                // Listen, then look again: a push between the look and the listen is seen.
                None => {
                    self.listener = Some(self.cq.shared.ready.listen());
                    for d in self.cq.shared.drivers() {
                        d.nudge();
                    }
                }
                Some(l) => {
                    std::task::ready!(Pin::new(l).poll(cx));
                    self.listener = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
