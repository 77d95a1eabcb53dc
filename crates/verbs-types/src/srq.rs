//! A shared receive queue (`ibv_srq`): receive WQEs of one protection domain that several
//! QPs draw from, on either transport.
//!
//! The queue only holds checked receive requests ([`CheckedRecv`]) and keeps the SRQ limit;
//! the engines decide when a message needs a WQE and [`SharedRecvQueue::take`] it at that
//! moment. A WQE taken by a QP belongs to that QP from then on: it completes (successfully,
//! in error or flushed) on that QP's receive completions with its own `wr_id`, never goes back
//! to the queue, and is not flushed when another QP fails. WQEs still in the queue belong to
//! the SRQ and outlive any one QP's Error state (IBA 10.3.1 note on QPs associated with an
//! SRQ; Linux rxe `flush_recv_queue` leaves an SRQ alone).
//!
//! # SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`)
//! [`SharedRecvQueue::arm_limit`] arms a low-watermark: when a [`SharedRecvQueue::take`]
//! leaves fewer WQEs than the limit, the limit event ("SRQ Limit Reached", the affiliated
//! asynchronous event `IBV_EVENT_SRQ_LIMIT_REACHED`) becomes pending and the limit disarms (it
//! reads 0 again), so the event fires once per arming. The owner polls it with
//! [`SharedRecvQueue::take_limit_event`] and re-arms after replenishing. The check runs when a
//! WQE is taken, as in Linux rxe (`get_srq_wqe`): arming while the queue already holds fewer
//! than the limit fires at the next take, not at once; a take that finds the queue empty takes
//! nothing and fires nothing. A limit of 0 disarms; a limit above `max_wr` is refused (rxe:
//! `EINVAL`).
//!
//! Thread-safe: the verbs layer posts from application threads while a transport thread takes.
//! A poisoned lock is recovered (the queue's state is consistent after every operation).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use softrdma_memory::{KeyTable, PdId};

use crate::{CheckedRecv, PostError, RecvWr, check_recv};

/// `arm_limit` refused; the armed limit is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("SRQ limit {limit} above the queue's max_wr {max_wr}")]
pub struct SrqLimitError {
    /// The limit asked for.
    pub limit: u32,
    /// The queue's depth.
    pub max_wr: u32,
}

struct Inner {
    wqes: VecDeque<CheckedRecv>,
    /// Armed low-watermark; 0 when disarmed.
    limit: u32,
    /// The limit fired and the owner has not taken the event yet.
    limit_event: bool,
}

/// A shared receive queue (`ibv_srq`): up to `max_wr` receive WQEs of protection domain `pd`,
/// each with at most `max_sge` entries, taken by the QPs attached to it when a message needs
/// one. See the module docs for ownership of taken WQEs and the SRQ limit. Share it as an
/// `Arc<SharedRecvQueue>`; the InfiniBand engine takes one in `IbQp::new_with_srq`.
pub struct SharedRecvQueue {
    pd: PdId,
    max_wr: u32,
    max_sge: u32,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for SharedRecvQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.lock();
        f.debug_struct("SharedRecvQueue")
            .field("pd", &self.pd)
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .field("len", &g.wqes.len())
            .field("limit", &g.limit)
            .field("limit_event", &g.limit_event)
            .finish()
    }
}

impl SharedRecvQueue {
    /// An empty, disarmed queue of domain `pd` holding up to `max_wr` WQEs of up to `max_sge`
    /// entries each (`ibv_create_srq`). The verbs layer checks the attributes against the
    /// device's limits; a `max_wr` of 0 makes a queue every post finds full.
    pub fn new(pd: PdId, max_wr: u32, max_sge: u32) -> SharedRecvQueue {
        SharedRecvQueue {
            pd,
            max_wr,
            max_sge,
            inner: Mutex::new(Inner {
                wqes: VecDeque::new(),
                limit: 0,
                limit_event: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The protection domain; only QPs of this domain may attach.
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// Most WQEs the queue holds.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Most scatter entries per WQE (the `max_sge` to run [`check_recv`] with).
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Queues a receive request the caller checked with `check_recv(wr, self.max_sge(), keys,
    /// self.pd())` (`ibv_post_srq_recv`). `QueueFull` when `max_wr` WQEs wait; `TooManySge`
    /// when it has more than `max_sge` entries; `MessageTooLong` when its entries cover more
    /// than 2^32 − 1 octets (no completion could report the length). Nothing is queued on
    /// error.
    pub fn post(&self, wqe: CheckedRecv) -> Result<(), PostError> {
        if wqe.sgl.entries().len() > self.max_sge as usize {
            return Err(PostError::TooManySge {
                max: self.max_sge as usize,
            });
        }
        if wqe.sgl.len() > u64::from(u32::MAX) {
            return Err(PostError::MessageTooLong);
        }
        let mut g = self.lock();
        if g.wqes.len() >= self.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        g.wqes.push_back(wqe);
        Ok(())
    }

    /// Checks `wr` against the queue's `max_sge` and domain with `keys` (every entry needs
    /// `LOCAL_WRITE`), then [`SharedRecvQueue::post`]s it.
    pub fn post_recv(&self, wr: RecvWr, keys: &KeyTable) -> Result<(), PostError> {
        self.post(check_recv(wr, self.max_sge, keys, self.pd)?)
    }

    /// Takes the oldest WQE for a message that needs one now; `None` when the queue is empty
    /// (the engine then RNR-NAKs or drops). Fires the armed limit if fewer than the limit
    /// remain.
    pub fn take(&self) -> Option<CheckedRecv> {
        let mut g = self.lock();
        let w = g.wqes.pop_front()?;
        if g.limit != 0 && g.wqes.len() < g.limit as usize {
            g.limit = 0;
            g.limit_event = true;
        }
        Some(w)
    }

    /// WQEs waiting (not yet taken by a QP).
    pub fn len(&self) -> usize {
        self.lock().wqes.len()
    }

    /// `true` when no WQE waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the next take that leaves fewer
    /// than `limit` WQEs fires the limit event once. 0 disarms. Refused above `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<(), SrqLimitError> {
        if limit > self.max_wr {
            return Err(SrqLimitError {
                limit,
                max_wr: self.max_wr,
            });
        }
        self.lock().limit = limit;
        Ok(())
    }

    /// The armed limit; 0 when disarmed, including after it fired (`ibv_query_srq`'s
    /// `srq_limit`).
    pub fn limit(&self) -> u32 {
        self.lock().limit
    }

    /// `true` once after the armed limit fired ("SRQ Limit Reached"); the event is then
    /// consumed.
    pub fn take_limit_event(&self) -> bool {
        std::mem::take(&mut self.lock().limit_event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sge;
    use softrdma_memory::{Access, Buffer, Key};
    use std::sync::Arc;

    fn setup() -> (KeyTable, Key) {
        let keys = KeyTable::new();
        let k = keys
            .reg_mr(PdId(3), Buffer::new(4096), 0, 4096, 0, Access::LOCAL_WRITE)
            .unwrap();
        (keys, k)
    }

    fn wr(id: u64, k: Key) -> RecvWr {
        RecvWr::new(id, vec![Sge::new(k, id * 16, 16)])
    }

    #[test]
    fn fifo_depth_and_checks() {
        let (keys, k) = setup();
        let q = SharedRecvQueue::new(PdId(3), 3, 2);
        assert_eq!((q.pd(), q.max_wr(), q.max_sge()), (PdId(3), 3, 2));
        assert!(q.is_empty());
        for id in 0..3 {
            q.post_recv(wr(id, k), &keys).unwrap();
        }
        assert_eq!(q.post_recv(wr(9, k), &keys), Err(PostError::QueueFull));
        assert_eq!(q.len(), 3);
        assert_eq!(q.take().unwrap().wr_id, 0);
        q.post_recv(wr(3, k), &keys).unwrap();
        let order: Vec<u64> = std::iter::from_fn(|| q.take()).map(|w| w.wr_id).collect();
        assert_eq!(order, [1, 2, 3]);
        assert!(q.take().is_none());
        // max_sge, the domain and LOCAL_WRITE come from the queue.
        let three = RecvWr::new(5, vec![Sge::new(k, 0, 1); 3]);
        assert_eq!(
            q.post_recv(three.clone(), &keys),
            Err(PostError::TooManySge { max: 2 })
        );
        let checked_wide = check_recv(three, 8, &keys, PdId(3)).unwrap();
        assert_eq!(q.post(checked_wide), Err(PostError::TooManySge { max: 2 }));
        let other_pd = SharedRecvQueue::new(PdId(4), 3, 2);
        assert!(matches!(
            other_pd.post_recv(wr(1, k), &keys),
            Err(PostError::LocalProtection { sge: 0, .. })
        ));
        assert!(q.is_empty() && other_pd.is_empty());
        let none = SharedRecvQueue::new(PdId(3), 0, 2);
        assert_eq!(none.post_recv(wr(1, k), &keys), Err(PostError::QueueFull));
    }

    #[test]
    fn limit_fires_once_below_the_mark_then_disarms() {
        let (keys, k) = setup();
        let q = SharedRecvQueue::new(PdId(3), 8, 1);
        for id in 0..6 {
            q.post_recv(wr(id, k), &keys).unwrap();
        }
        assert_eq!(
            q.arm_limit(9),
            Err(SrqLimitError {
                limit: 9,
                max_wr: 8
            })
        );
        assert_eq!(q.limit(), 0);
        q.arm_limit(4).unwrap();
        assert_eq!(q.limit(), 4);
        // 6 -> 5 -> 4: not below 4 yet.
        q.take().unwrap();
        q.take().unwrap();
        assert!(!q.take_limit_event());
        // 4 -> 3: below; fires once and disarms.
        q.take().unwrap();
        assert_eq!(q.limit(), 0);
        assert!(q.take_limit_event());
        assert!(!q.take_limit_event());
        q.take().unwrap();
        assert!(!q.take_limit_event());
        // Posting does not fire; re-arming above the count fires at the next take only.
        q.arm_limit(5).unwrap();
        assert!(!q.take_limit_event());
        q.take().unwrap();
        assert!(q.take_limit_event());
        // Empty: a failed take fires nothing.
        q.take().unwrap();
        q.arm_limit(1).unwrap();
        assert!(q.take().is_none());
        assert!(!q.take_limit_event());
        assert_eq!(q.limit(), 1);
        // 0 disarms.
        q.post_recv(wr(7, k), &keys).unwrap();
        q.arm_limit(0).unwrap();
        q.take().unwrap();
        assert!(!q.take_limit_event());
    }

    #[test]
    fn threads_take_each_wqe_exactly_once() {
        let (keys, k) = setup();
        let q = Arc::new(SharedRecvQueue::new(PdId(3), 4096, 1));
        for id in 0..4000 {
            q.post_recv(RecvWr::new(id, vec![Sge::new(k, 0, 16)]), &keys)
                .unwrap();
        }
        q.arm_limit(100).unwrap();
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(w) = q.take() {
                        got.push(w.wr_id);
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<u64> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..4000).collect::<Vec<_>>());
        assert!(q.take_limit_event());
        assert!(!q.take_limit_event());
    }
}
