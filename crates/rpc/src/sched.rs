//! The handler pool's queue: calls waiting to run, taken one flow (connection) at a time in
//! turn, so that one connection's pipeline of expensive calls cannot queue ahead of every
//! other client (a FIFO would run all 64 of its calls first). Workers are woken through a
//! channel, one token a job: its short spin before sleeping is what kept RPC over iWARP at
//! its rate (a condition variable cost a fifth, docs/performance.md).

use std::collections::VecDeque;

// Keyed by our own flow numbers.
use rustc_hash::FxHashMap as HashMap;

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;

/// A call's work.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

struct State {
    /// Waiting jobs by flow.
    flows: HashMap<u64, VecDeque<Job>>,
    /// Flows with jobs waiting, in turn.
    turn: VecDeque<u64>,
    /// A token per job queued; gone once closed.
    tokens: Option<Sender<()>>,
}

/// Jobs by flow, handed out round robin over the flows that have any.
pub(crate) struct Sched {
    state: Mutex<State>,
    wake: Receiver<()>,
}

impl Default for Sched {
    fn default() -> Sched {
        let (tx, wake) = unbounded();
        Sched {
            state: Mutex::new(State {
                flows: HashMap::default(),
                turn: VecDeque::new(),
                tokens: Some(tx),
            }),
            wake,
        }
    }
}

impl Sched {
    /// Queues `job` behind the jobs of its `flow` (dropped once closed).
    pub(crate) fn push(&self, flow: u64, job: Job) {
        let mut s = self.state.lock();
        if s.tokens.is_none() {
            return;
        }
        let q = s.flows.entry(flow).or_default();
        q.push_back(job);
        if q.len() == 1 {
            s.turn.push_back(flow);
        }
        // Unbounded: the send never waits, under the lock or not.
        if let Some(tx) = &s.tokens {
            let _ = tx.send(());
        }
    }

    /// The next job, from the flow whose turn it is; `None` once closed and drained.
    pub(crate) fn pop(&self) -> Option<Job> {
        loop {
            // A token per job: when one is had, a job is queued.
            self.wake.recv().ok()?;
            let mut s = self.state.lock();
            while let Some(flow) = s.turn.pop_front() {
                let Some(q) = s.flows.get_mut(&flow) else {
                    continue;
                };
                let Some(job) = q.pop_front() else {
                    s.flows.remove(&flow);
                    continue;
                };
                if q.is_empty() {
                    s.flows.remove(&flow);
                } else {
                    s.turn.push_back(flow);
                }
                return Some(job);
            }
        }
    }

    /// No more jobs: `pop` drains what is queued, then returns `None`.
    pub(crate) fn close(&self) {
        self.state.lock().tokens = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn flows_take_turns() {
        let s = Sched::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        // Flow 1 queues five jobs before flows 2 and 3 queue theirs.
        for (flow, n) in [(1u64, 5), (2, 2), (3, 1)] {
            for i in 0..n {
                let log = log.clone();
                s.push(flow, Box::new(move || log.lock().push((flow, i))));
            }
        }
        s.close();
        while let Some(j) = s.pop() {
            j();
        }
        assert_eq!(
            *log.lock(),
            [
                (1, 0),
                (2, 0),
                (3, 0),
                (1, 1),
                (2, 1),
                (1, 2),
                (1, 3),
                (1, 4)
            ]
        );
    }

    #[test]
    fn closed_drains_then_ends() {
        let s = Sched::default();
        s.push(7, Box::new(|| {}));
        s.close();
        s.push(7, Box::new(|| panic!("queued after close")));
        assert!(s.pop().is_some());
        assert!(s.pop().is_none());
    }
}
