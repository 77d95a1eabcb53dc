//! Asynchronous events (`ibv_async_event`, `rdma_cm_event`) and the per-context queue the
//! drivers post them to.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use event_listener::Event;
use parking_lot::{Condvar, Mutex};
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_wire::rdmap::TerminateCode;

/// Async events kept per context before the oldest are dropped.
const ASYNC_EVENT_LIMIT: usize = 4096;

/// An asynchronous event (`ibv_async_event` / `rdma_cm_event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP's connection reached full operation (`RDMA_CM_EVENT_ESTABLISHED`).
    Established {
        /// The QP.
        qp_num: u32,
    },
    /// The QP's connection ended: the peer closed it, it was lost, or it was closed after a
    /// Terminate (`RDMA_CM_EVENT_DISCONNECTED`).
    Disconnected {
        /// The QP.
        qp_num: u32,
    },
    /// A completion queue overran (`IBV_EVENT_CQ_ERR`): it is in error, and the QPs that
    /// complete into it go to Error.
    CqError {
        /// The queue ([`crate::Cq::id`]).
        cq_id: u32,
    },
    /// An event of the RDMAP stream: a Terminate sent or received, an LLP error
    /// (`IBV_EVENT_QP_FATAL` and friends).
    Qp {
        /// The QP.
        qp_num: u32,
        /// What the engine reported.
        event: QpEvent,
    },
}

impl AsyncEvent {
    /// A QP's event caused by a protection error (a Terminate of class RDMAP remote
    /// protection, sent or received): the verbs report it as `IBV_EVENT_QP_ACCESS_ERR`
    /// rather than `IBV_EVENT_QP_FATAL`.
    pub fn is_access_error(&self) -> bool {
        matches!(
            self,
            AsyncEvent::Qp {
                event: QpEvent::LocalError(t) | QpEvent::TerminateReceived(t),
                ..
            } if matches!(t.code, TerminateCode::RdmaRemoteProtection(_))
        )
    }
}

/// A bounded queue of events: the oldest is dropped when it is full.
#[derive(Default)]
pub(crate) struct EventQueue {
    q: Mutex<VecDeque<AsyncEvent>>,
    cond: Condvar,
    /// Wakes tasks awaiting an event.
    ready: Event,
}

impl EventQueue {
    pub(crate) fn post(&self, ev: AsyncEvent) {
        let mut q = self.q.lock();
        if q.len() >= ASYNC_EVENT_LIMIT {
            q.pop_front();
        }
        q.push_back(ev);
        drop(q);
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
    }

    pub(crate) fn try_pop(&self) -> Option<AsyncEvent> {
        self.q.lock().pop_front()
    }

    /// The next event, once there is one (cancel-safe).
    pub(crate) async fn pop_async(&self) -> AsyncEvent {
        loop {
            if let Some(ev) = self.try_pop() {
                return ev;
            }
            let l = self.ready.listen();
            if let Some(ev) = self.try_pop() {
                return ev;
            }
            l.await;
        }
    }

    pub(crate) fn pop_timeout(&self, timeout: Duration) -> Option<AsyncEvent> {
        let deadline = Instant::now() + timeout;
        let mut q = self.q.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                return Some(ev);
            }
            if self.cond.wait_until(&mut q, deadline).timed_out() {
                return q.pop_front();
            }
        }
    }
}
