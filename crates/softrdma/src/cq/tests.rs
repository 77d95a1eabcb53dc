use super::*;
use softrdma_verbs_types::WcOpcode;
use std::task::Wake;

/// A waker that counts its wakes (no runtime needed).
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Count {
    fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The QP the tests' completions are pushed for.
const QPN: u32 = 7;

/// A completion as polled (marked as QP `QPN`'s).
fn wc(id: u64) -> WorkCompletion {
    WorkCompletion {
        qp_num: QPN,
        ..WorkCompletion::new(id, WcStatus::Success, WcOpcode::Recv, 8)
    }
}

fn push(cq: &Cq, ids: impl IntoIterator<Item = u64>) {
    let _ = cq.shared.push(QPN, &mut ids.into_iter().map(wc).collect());
}

/// A CQ serves many QPs: each completion says whose it is (`ibv_wc.qp_num`).
#[test]
fn completions_are_marked_with_their_qp() {
    let cq = Cq::new(8, None, None);
    let bare = |id| WorkCompletion::new(id, WcStatus::Success, WcOpcode::Send, 0);
    let _ = cq.shared.push(42, &mut vec![bare(1)]);
    let _ = cq.shared.push(43, &mut vec![bare(2), bare(3)]);
    let mut out = Vec::new();
    assert_eq!(cq.poll(8, &mut out), 3);
    let got: Vec<(u64, u32)> = out.iter().map(|w| (w.wr_id, w.qp_num)).collect();
    assert_eq!(got, [(1, 42), (2, 43), (3, 43)]);
}

/// One completion past the capacity overruns the queue for good (IBA 11.4.2.1): it and
/// every later one are dropped and counted, one CqError is posted, what was queued can
/// still be polled; memory never grows past the capacity.
#[test]
fn overrun_puts_the_queue_in_error() {
    let events = Arc::new(EventQueue::default());
    let cq = Cq::new(3, None, Some(events.clone()));
    assert_eq!(cq.shared.push(QPN, &mut vec![wc(1), wc(2)]), Pushed::Queued);
    assert!(!cq.is_overrun());
    assert_eq!(
        cq.shared.push(QPN, &mut vec![wc(3), wc(4), wc(5)]),
        Pushed::Overrun
    );
    assert!(cq.is_overrun());
    assert_eq!((cq.len(), cq.overflows()), (3, 2));
    assert!(matches!(
        events.try_pop(),
        Some(AsyncEvent::CqError { cq_id }) if cq_id == cq.id()
    ));
    let mut out = Vec::new();
    assert_eq!(cq.poll(8, &mut out), 3);
    let ids: Vec<u64> = out.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3]);
    // Room again, but the queue stays in error: later completions go nowhere, and no
    // second event is posted.
    assert_eq!(cq.shared.push(QPN, &mut vec![wc(6)]), Pushed::Overrun);
    assert_eq!(cq.shared.push(QPN, &mut Vec::new()), Pushed::Overrun);
    assert_eq!((cq.len(), cq.overflows()), (0, 3));
    assert!(events.try_pop().is_none());
}

fn poll_once<F: Future>(f: Pin<&mut F>, w: &Arc<Count>) -> Poll<F::Output> {
    let waker = std::task::Waker::from(w.clone());
    f.poll(&mut Context::from_waker(&waker))
}

#[test]
fn a_completion_pushed_before_the_poll_is_ready_at_once() {
    let cq = Cq::new(4, None, None);
    push(&cq, [7]);
    let w = Arc::new(Count::default());
    let f = std::pin::pin!(cq.next());
    assert_eq!(poll_once(f, &w), Poll::Ready(wc(7)));
    assert!(cq.is_empty());
}

#[test]
fn a_completion_pushed_after_the_poll_wakes_the_task() {
    let cq = Cq::new(4, None, None);
    let w = Arc::new(Count::default());
    let mut f = std::pin::pin!(cq.next());
    assert_eq!(poll_once(f.as_mut(), &w), Poll::Pending);
    assert_eq!(w.wakes(), 0);
    push(&cq, [1]);
    assert_eq!(w.wakes(), 1);
    assert_eq!(poll_once(f.as_mut(), &w), Poll::Ready(wc(1)));
}

#[test]
fn ready_waits_for_a_completion_and_takes_none() {
    let cq = Cq::new(4, None, None);
    let w = Arc::new(Count::default());
    let mut f = std::pin::pin!(cq.ready());
    assert_eq!(poll_once(f.as_mut(), &w), Poll::Pending);
    push(&cq, [9]);
    assert_eq!(w.wakes(), 1);
    assert_eq!(poll_once(f.as_mut(), &w), Poll::Ready(()));
    assert_eq!(cq.poll_one(), Some(wc(9)));
}

#[test]
fn a_dropped_future_loses_no_completion() {
    let cq = Cq::new(4, None, None);
    let w = Arc::new(Count::default());
    {
        let f = std::pin::pin!(cq.next());
        assert_eq!(poll_once(f, &w), Poll::Pending);
    }
    push(&cq, [3]);
    // Dropped before its wake: nothing was taken, nobody is woken.
    assert_eq!((w.wakes(), cq.len()), (0, 1));
    let f = std::pin::pin!(cq.next());
    assert_eq!(poll_once(f, &w), Poll::Ready(wc(3)));
}

#[test]
fn two_waiters_one_completion_the_other_waits_on() {
    let cq = Cq::new(4, None, None);
    let (wa, wb) = (Arc::new(Count::default()), Arc::new(Count::default()));
    let mut a = std::pin::pin!(cq.next());
    let mut b = std::pin::pin!(cq.next());
    assert_eq!(poll_once(a.as_mut(), &wa), Poll::Pending);
    assert_eq!(poll_once(b.as_mut(), &wb), Poll::Pending);
    push(&cq, [5]);
    assert_eq!((wa.wakes(), wb.wakes()), (1, 1));
    assert_eq!(poll_once(b.as_mut(), &wb), Poll::Ready(wc(5)));
    // The other finds the queue empty and is woken by the next push.
    assert_eq!(poll_once(a.as_mut(), &wa), Poll::Pending);
    push(&cq, [6]);
    assert_eq!(wa.wakes(), 2);
    assert_eq!(poll_once(a.as_mut(), &wa), Poll::Ready(wc(6)));
}

#[test]
fn wait_async_takes_min_to_max_and_keeps_what_it_moved_when_dropped() {
    let cq = Cq::new(16, None, None);
    let w = Arc::new(Count::default());
    let mut out = Vec::new();
    push(&cq, [1, 2, 3]);
    {
        let f = std::pin::pin!(cq.wait_async(2, 2, &mut out));
        assert_eq!(poll_once(f, &w), Poll::Ready(2));
    }
    assert_eq!(out, [wc(1), wc(2)]);
    // Wants 3, finds 1: moves it, waits; dropped, the one moved stays in `out`.
    {
        let f = std::pin::pin!(cq.wait_async(3, 8, &mut out));
        assert_eq!(poll_once(f, &w), Poll::Pending);
    }
    assert_eq!(out, [wc(1), wc(2), wc(3)]);
    assert!(cq.is_empty());
    let mut c = cq.completions();
    let waker = std::task::Waker::from(w.clone());
    let mut cx = Context::from_waker(&waker);
    assert_eq!(c.poll_batch(&mut cx, 0, &mut out), Poll::Ready(0));
    assert_eq!(c.poll_batch(&mut cx, 4, &mut out), Poll::Pending);
    push(&cq, [4, 5]);
    assert_eq!(w.wakes(), 1);
    assert_eq!(c.poll_batch(&mut cx, 4, &mut out), Poll::Ready(2));
    assert_eq!(out.len(), 5);
}

#[test]
fn an_armed_cq_wakes_a_task_awaiting_its_channel() {
    let ch = CompletionChannel::new().unwrap();
    let cq = Cq::new(4, Some(&ch), None);
    let w = Arc::new(Count::default());
    let mut f = std::pin::pin!(ch.get_cq_event_async());
    assert!(poll_once(f.as_mut(), &w).is_pending());
    // Not armed: no event, no wake.
    push(&cq, [1]);
    assert_eq!(w.wakes(), 0);
    cq.req_notify(false);
    push(&cq, [2]);
    assert_eq!(w.wakes(), 1);
    assert_eq!(poll_once(f.as_mut(), &w), Poll::Ready(cq.clone()));
    assert_eq!(ch.pending(), 0);
}

/// A queue whose polls, once quiet for a nanosecond, wait an hour (only a push or an
/// arrival ends the wait), and a thread polling it that sends the first completion's id.
fn backed_off_poller() -> (
    Cq,
    std::thread::JoinHandle<()>,
    std::sync::mpsc::Receiver<u64>,
) {
    let cq = Cq::new(4, None, None);
    cq.set_poll_backoff(Some(PollBackoff {
        after: Duration::from_nanos(1),
        wait: Duration::from_secs(3600),
    }));
    let (tx, rx) = std::sync::mpsc::channel();
    let poller = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            loop {
                if let Some(wc) = cq.poll_one() {
                    let _ = tx.send(wc.wr_id);
                    return;
                }
            }
        })
    };
    (cq, poller, rx)
}

/// A poll of a queue empty for longer than its back-off's `after` waits for the next
/// push and returns that completion (a wait of an hour: only the push ends it).
#[test]
fn a_backed_off_poll_is_woken_by_a_push() {
    assert_eq!(Cq::new(4, None, None).poll_backoff(), DEFAULT_POLL_BACKOFF);
    let (cq, poller, rx) = backed_off_poller();
    // A poll waits (the count is taken under the lock its wait lets go).
    while cq.poll_backoffs() == 0 {
        std::thread::yield_now();
    }
    push(&cq, [5]);
    let got = rx.recv_timeout(Duration::from_secs(60));
    assert_eq!(got, Ok(5), "the push did not end the poll's wait");
    poller.join().unwrap();
    cq.set_poll_backoff(None);
    assert_eq!(cq.poll_backoff(), None);
}

/// An arrival for a QP of the queue (a segment, a packet) ends a poll's wait, and polls
/// that see arrivals are not quiet: a program polling the queue while it watches memory
/// a peer writes into is waiting for those.
#[test]
fn an_arrival_ends_a_backed_off_poll() {
    let (cq, poller, rx) = backed_off_poller();
    let waits = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while cq.poll_backoffs() < n {
            assert!(Instant::now() < deadline, "no wait number {n}");
            std::thread::yield_now();
        }
    };
    waits(1);
    cq.shared.arrived();
    // Woken, it polls again and (quiet again after 1 ns) waits again.
    waits(2);
    push(&cq, [6]);
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(6));
    poller.join().unwrap();
}

/// Pollers race on the instant the queue went empty: one that read the clock before
/// another stored a later instant must not underflow.
#[test]
fn a_poll_behind_another_pollers_empty_instant_is_harmless() {
    let cq = Cq::new(4, None, None);
    cq.shared.empty_since.store(u64::MAX, Ordering::Relaxed);
    assert!(cq.poll_one().is_none());
    let mut out = Vec::new();
    assert_eq!(cq.poll(4, &mut out), 0);
    push(&cq, [7]);
    assert_eq!(cq.poll_one().map(|wc| wc.wr_id), Some(7));
}

/// Many tasks on one queue, completions pushed from another thread: each is returned
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_one_cq_each_completion_once() {
    const TASKS: u64 = 16;
    const EACH: u64 = 50;
    let cq = Cq::new(1024, None, None);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let cq = cq.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..EACH {
                    got.push(cq.next().await.wr_id);
                }
                got
            })
        })
        .collect();
    let pusher = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            for i in 0..TASKS * EACH {
                push(&cq, [i]);
                if i.is_multiple_of(7) {
                    std::thread::yield_now();
                }
            }
        })
    };
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    pusher.join().unwrap();
    all.sort_unstable();
    assert_eq!(all, (0..TASKS * EACH).collect::<Vec<_>>());
    assert!(cq.is_empty());
}
