//! A listener's queue of connection requests waiting for `accept`, as both drivers keep it:
//! at most `backlog` of them (`rdma_listen`'s backlog: a peer cannot make us hold requests
//! without a limit), taken by threads (blocking, with a deadline) and tasks (cancel-safe).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use event_listener::Event;
use parking_lot::{Condvar, Mutex};

use crate::Error;

pub(crate) struct Backlog<T> {
    q: Mutex<VecDeque<T>>,
    cond: Condvar,
    /// Wakes tasks awaiting a request.
    ready: Event,
    closed: AtomicBool,
    limit: usize,
}

impl<T> Backlog<T> {
    /// A queue for at most `backlog` requests (at least one).
    pub(crate) fn new(backlog: u32) -> Backlog<T> {
        Backlog {
            q: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            ready: Event::new(),
            closed: AtomicBool::new(false),
            limit: backlog.max(1) as usize,
        }
    }

    /// Queues a request; when `backlog` already wait, hands it back (to be refused).
    pub(crate) fn push(&self, req: T) -> Result<(), T> {
        {
            let mut q = self.q.lock();
            if q.len() >= self.limit {
                return Err(req);
            }
            q.push_back(req);
        }
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
        Ok(())
    }

    pub(crate) fn try_pop(&self) -> Option<T> {
        self.q.lock().pop_front()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.q.lock().is_empty()
    }

    /// Drops the requests `keep` says no to (withdrawn by their requester).
    pub(crate) fn retain(&self, keep: impl FnMut(&T) -> bool) {
        self.q.lock().retain(keep);
    }

    /// No more requests: waiters get [`Error::ContextClosed`] once the queue is empty.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
    }

    /// What still waits (to be refused).
    pub(crate) fn drain(&self) -> Vec<T> {
        self.q.lock().drain(..).collect()
    }

    /// The next request; `None` deadline: wait for ever.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> Result<T, Error> {
        let mut q = self.q.lock();
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

    /// The next request, once there is one (cancel-safe: a request stays queued until
    /// returned).
    pub(crate) async fn wait_async(&self) -> Result<T, Error> {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn past_the_backlog_a_request_comes_back() {
        let b = Backlog::new(2);
        assert_eq!(b.push(1), Ok(()));
        assert_eq!(b.push(2), Ok(()));
        assert_eq!(b.push(3), Err(3));
        assert_eq!(b.try_pop(), Some(1));
        assert_eq!(b.push(4), Ok(()));
        assert_eq!(b.drain(), vec![2, 4]);
        assert!(b.is_empty());
    }

    #[test]
    fn a_zero_backlog_still_takes_one() {
        let b = Backlog::new(0);
        assert_eq!(b.push('a'), Ok(()));
        assert_eq!(b.push('b'), Err('b'));
    }

    #[test]
    fn waiters_time_out_then_see_the_close() {
        let b = Backlog::<u8>::new(4);
        let soon = Instant::now() + Duration::from_millis(5);
        assert!(matches!(b.wait(Some(soon)), Err(Error::Timeout)));
        b.close();
        assert!(matches!(b.wait(None), Err(Error::ContextClosed)));
    }

    #[test]
    fn a_blocked_waiter_gets_what_another_thread_pushes() {
        let b = Arc::new(Backlog::new(1));
        let w = {
            let b = b.clone();
            std::thread::spawn(move || b.wait(None))
        };
        b.push(7u32).unwrap();
        assert_eq!(w.join().unwrap().ok(), Some(7));
    }

    #[test]
    fn withdrawn_requests_are_dropped() {
        let b = Backlog::new(8);
        for i in 0..5 {
            b.push(i).unwrap();
        }
        b.retain(|&i| i % 2 == 0);
        assert_eq!(b.drain(), vec![0, 2, 4]);
    }
}
