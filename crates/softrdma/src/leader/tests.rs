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
    assert!(l.drive(
        Wait {
            waiter: weak,
            spin: Duration::ZERO,
            flow,
            until: Some(deadline),
            done: &done,
        },
        || {},
        |_, until| {
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
        }
    ));
    (
        polls.into_inner(),
        blocked_after.get().expect("a blocking turn"),
    )
}

/// A push by the thread that holds the slot interrupts nobody (it would be itself) and
/// makes its next wait a poll, once; anyone else's push interrupts the holder.
#[test]
fn a_wake_from_the_holder_marks_it_instead_of_interrupting() {
    let l = Leader::new(());
    let interrupts = Cell::new(0);
    l.wake(|| interrupts.set(interrupts.get() + 1));
    assert_eq!(interrupts.get(), 1);
    assert!(!l.take_self_wake());
    let (_w, weak) = waiter();
    let seen = Cell::new(None);
    assert!(l.drive(
        Wait {
            waiter: weak,
            spin: Duration::ZERO,
            flow: Duration::ZERO,
            until: None,
            done: &|| seen.get().is_some(),
        },
        || {},
        |_, _| {
            l.wake(|| interrupts.set(interrupts.get() + 1));
            seen.set(Some((l.take_self_wake(), l.take_self_wake())));
            Turn::Idle
        },
    ));
    assert_eq!(seen.get(), Some((true, false)), "marked once");
    assert_eq!(interrupts.get(), 1, "the holder did not interrupt itself");
    l.wake(|| interrupts.set(interrupts.get() + 1));
    assert_eq!(interrupts.get(), 2, "the slot let go: back to interrupting");
}

#[test]
fn an_arrival_makes_the_caller_poll_for_the_flow_then_sleep() {
    let flow = Duration::from_millis(2);
    let (polls, after) = drive_after_arrival(flow);
    assert!(!polls[0], "the first turn may sleep: nothing flowed yet");
    assert!(polls.len() > 2, "turns after the arrival poll: {polls:?}");
    assert!(polls[1..polls.len() - 1].iter().all(|&p| p));
    assert!(
        after >= flow,
        "slept {after:?} after the arrival, before the flow ended"
    );
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
    // Arrivals back to back: the poll grows (each gap is far below FLOW_POLL unless
    // the machine is very slow), and a turn soon after an arrival polls.
    let mut polled = 0;
    for _ in 0..20 {
        let before = Instant::now();
        assert!(l.background(
            |_, until| {
                seen.push(until.is_some());
                Turn::Worked
            },
            || true
        ));
        let poll = l.bg_poll.now();
        let after = Instant::now();
        let mut p = false;
        assert!(l.background(
            |_, until| {
                p = until.is_some();
                Turn::Idle
            },
            || true
        ));
        // Within the poll of the arrival just before: polled.
        assert!(p || Instant::now() >= after.min(before) + poll || poll.is_zero());
        polled += usize::from(p);
    }
    assert!(
        !seen[0] && !seen[1],
        "nothing flowed before the first arrival"
    );
    assert!(l.bg_poll.now() > Duration::ZERO);
    assert!(polled > 0, "no turn polled after 20 quick arrivals");
    assert!(!l.background(|_, _| Turn::Stop, || true));
    // An idle turn teaches nothing.
    let fresh = Leader::new(());
    fresh.note(Turn::Idle);
    assert!(!fresh.flowing(Instant::now()));
    assert_eq!(fresh.bg_arrival.load(Ordering::Relaxed), 0);
}

#[test]
fn the_background_poll_shrinks_when_arrivals_are_sparse() {
    let l = Leader::new(());
    let mut t = 1_000_000_000u64;
    l.arrived(t);
    // Arrivals 30 µs apart: 0 → 4 → 8 → 16 → 32 µs, then each is caught by the poll.
    let mut polls = Vec::new();
    for _ in 0..6 {
        t += 30_000;
        l.arrived(t);
        polls.push(l.bg_poll.now().as_micros());
    }
    assert_eq!(polls, [4, 8, 16, 32, 32, 32]);
    // Arrivals a millisecond apart: halved at each, down to no poll (then sleeps).
    let mut polls = Vec::new();
    for _ in 0..5 {
        t += 1_000_000;
        l.arrived(t);
        polls.push(l.bg_poll.now().as_micros());
    }
    assert_eq!(polls, [16, 8, 4, 0, 0]);
    // Turned off: quick arrivals teach it nothing, and no turn polls.
    l.background_poll().set(BusyPoll::Off);
    for _ in 0..6 {
        t += 30_000;
        l.arrived(t);
    }
    assert_eq!(l.background_poll().get(), BusyPoll::Off);
    assert!(!l.flowing(Instant::now()));
}

const US: Duration = Duration::from_micros(1);

#[test]
fn adaptive_poll_grows_to_cover_quick_answers_and_falls_back_to_sleeping() {
    let s = Spin::new(BusyPoll::Adaptive { max: 50 * US });
    assert_eq!(s.now(), Duration::ZERO);
    // Answers 14 µs after the wait starts: 0 → 4 → 8 → 16, then caught while polling.
    let mut polls = Vec::new();
    for _ in 0..6 {
        let p = s.now();
        polls.push(p);
        s.learn(p, Some(14 * US));
    }
    assert_eq!(
        polls,
        [Duration::ZERO, 4 * US, 8 * US, 16 * US, 16 * US, 16 * US]
    );
    // Never past the cap.
    for _ in 0..10 {
        s.learn(s.now(), Some(49 * US));
    }
    assert_eq!(s.now(), 50 * US);
    // Answers that take longer than the cap: halve, then stop polling.
    let mut polls = Vec::new();
    for _ in 0..5 {
        polls.push(s.now());
        s.learn(s.now(), Some(Duration::from_millis(3)));
    }
    assert_eq!(
        polls,
        [
            50 * US,
            25 * US,
            12500 * Duration::from_nanos(1),
            6250 * Duration::from_nanos(1),
            Duration::ZERO
        ]
    );
    // A timeout counts as a long sleep.
    s.learn(Duration::ZERO, Some(10 * US));
    assert_eq!(s.now(), 4 * US);
    s.learn(4 * US, None);
    assert_eq!(s.now(), Duration::ZERO);
}

#[test]
fn the_default_learns_to_poll_through_two_wake_ups() {
    // Both sides of a ping-pong asleep: each wait takes the peer's wake-up and its own,
    // ~90 µs on an idle virtual core. The default still grows to poll through them (the
    // round trip then falls to what polling gives), and a stream's flow poll stays short.
    let s = Spin::new(DEFAULT_BUSY_POLL);
    for _ in 0..8 {
        s.learn(s.now(), Some(90 * US));
    }
    assert!(s.now() >= 90 * US, "{:?}", s.now());
    assert_eq!(s.flow(), FLOW_POLL);
    // Waits as long as a cold start of a process, or a peer that thinks: back to sleep.
    for _ in 0..8 {
        s.learn(s.now(), Some(Duration::from_millis(5)));
    }
    assert_eq!(s.now(), Duration::ZERO);
    assert_eq!(Spin::new(BusyPoll::Fixed(300 * US)).flow(), 300 * US);
}

#[test]
fn fixed_and_off_do_not_adapt() {
    let s = Spin::new(BusyPoll::Fixed(30 * US));
    s.learn(30 * US, Some(Duration::from_secs(1)));
    assert_eq!((s.now(), s.get()), (30 * US, BusyPoll::Fixed(30 * US)));
    s.set(BusyPoll::Off);
    s.learn(Duration::ZERO, Some(US));
    assert_eq!((s.now(), s.get()), (Duration::ZERO, BusyPoll::Off));
    s.set(DEFAULT_BUSY_POLL);
    assert_eq!(s.get(), DEFAULT_BUSY_POLL);
}

#[test]
fn a_callers_flow_is_its_own() {
    // The background thread does not poll after a caller's arrivals: the caller's
    // answers stop when it stops waiting.
    let l = Leader::new(());
    let (_w, weak) = waiter();
    let n = Cell::new(0);
    let done = || n.get() > 0;
    assert!(l.drive(
        Wait {
            waiter: weak,
            spin: Duration::ZERO,
            flow: Duration::from_secs(3600),
            until: None,
            done: &done,
        },
        || {},
        |_, _| {
            n.set(n.get() + 1);
            Turn::Worked
        }
    ));
    // The caller left long ago (the background thread stands down right after).
    l.caller_left.store(0, Ordering::Release);
    let mut polled = None;
    assert!(l.background(
        |_, until| {
            polled = Some(until.is_some());
            Turn::Idle
        },
        || true
    ));
    assert_eq!(polled, Some(false));
}

/// One [`Leader::background`] call: whether it took a turn, whether it did idle work.
fn background_once(l: &Leader<()>) -> (bool, bool) {
    let (mut turned, mut idled) = (false, false);
    assert!(l.background(
        |_, _| {
            turned = true;
            Turn::Idle
        },
        || {
            idled = true;
            true
        }
    ));
    (turned, idled)
}

/// One caller's wait that ends at once (its turn handles nothing).
fn drive_once(l: &Leader<()>) {
    let (_w, weak) = waiter();
    assert!(l.drive(
        Wait {
            waiter: weak,
            spin: Duration::ZERO,
            flow: Duration::ZERO,
            until: None,
            done: &|| true,
        },
        || {},
        |_, _| Turn::Idle
    ));
}

/// A leader whose background thread stands down after a caller for longer than any
/// test run lasts (what happens within the grace is certain), right after one caller.
fn after_a_caller() -> Leader<()> {
    let mut l = Leader::new(());
    l.caller_grace = Duration::from_secs(3600);
    drive_once(&l);
    l
}

#[test]
fn the_background_thread_stands_down_right_after_a_caller() {
    let mut l = after_a_caller();
    // Right after the caller's release: no turn, no idle work either (the caller
    // comes back and does both).
    assert_eq!(background_once(&l), (false, false));
    // An explicit look (a command, work queued with no caller) skips the stand-down.
    l.unpark_background();
    assert!(background_once(&l).0);
    // After another caller's turn, the stand-down ends with its grace.
    drive_once(&l);
    l.caller_grace = Duration::ZERO;
    assert!(background_once(&l).0);
}

#[test]
fn the_background_thread_naps_longer_while_callers_keep_driving() {
    let mut l = after_a_caller();
    let nap = |l: &Leader<()>| Duration::from_nanos(l.bg_nap.load(Ordering::Relaxed));
    assert_eq!(nap(&l), STAND_DOWN);
    // Each look that finds callers driving doubles the next nap, up to the cap.
    let mut naps = Vec::new();
    for _ in 0..6 {
        assert_eq!(background_once(&l), (false, false));
        naps.push(nap(&l).as_millis());
    }
    let max = STAND_DOWN_MAX.as_millis();
    assert_eq!(naps, [2, 4, 8, 16, max, max]);
    // An explicit look is due at once, and the stand-down after it starts short.
    l.unpark_background();
    assert_eq!(nap(&l), STAND_DOWN);
    for _ in 0..3 {
        l.caller_left
            .store(l.nanos(Instant::now()).max(1), Ordering::Release);
        assert_eq!(background_once(&l), (false, false));
    }
    assert_eq!(nap(&l), 8 * STAND_DOWN);
    // A caller back within the grace leaves the nap as it is; one back after longer
    // (the background thread was due on duty meanwhile) makes it short again.
    drive_once(&l);
    assert_eq!(nap(&l), 8 * STAND_DOWN);
    l.caller_grace = Duration::ZERO;
    drive_once(&l);
    assert_eq!(nap(&l), STAND_DOWN);
    // Callers gone: the background thread takes the slot and naps short next time.
    l.bg_nap
        .store(STAND_DOWN_MAX.as_nanos() as u64, Ordering::Relaxed);
    assert!(background_once(&l).0);
    assert_eq!(nap(&l), STAND_DOWN);
}
