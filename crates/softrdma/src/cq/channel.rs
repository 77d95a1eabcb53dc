//! Completion channels (`ibv_comp_channel`): each armed CQ that gets a completion is
//! reported once; [`CompletionChannel::get_cq_event`] blocks for the next, and the channel's
//! fd (a pipe holding one octet while an event waits) polls readable exactly then.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use event_listener::Event;
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;

use super::{Cq, CqShared, Progress};
use crate::Error;
use crate::leader::{FLOW_POLL, STAND_DOWN, Wait, Waiter};

struct ChanState {
    events: VecDeque<Weak<CqShared>>,
    /// The pipe holds one octet (the fd polls readable).
    signalled: bool,
}

pub(crate) struct ChannelShared {
    state: Mutex<ChanState>,
    cond: Condvar,
    /// The CQs reporting here (their drivers are what a waiter runs).
    pub(super) cqs: Mutex<Vec<Weak<CqShared>>>,
    /// Waiters blocked in a driver's [`Progress::block`] for this channel.
    pub(super) io_waiters: AtomicUsize,
    /// Wakes tasks awaiting an event ([`CompletionChannel::get_cq_event_async`]).
    ready: Event,
    /// Read and written only under `state`'s lock.
    reader: io::PipeReader,
    writer: io::PipeWriter,
}

impl Waiter for ChannelShared {
    fn notify(&self) {
        let _s = self.state.lock();
        self.cond.notify_all();
    }
}

impl ChannelShared {
    /// The drivers of every CQ reporting here, once each.
    fn drivers(&self) -> SmallVec<[Arc<dyn Progress>; 1]> {
        let cqs: Vec<_> = self.cqs.lock().iter().filter_map(Weak::upgrade).collect();
        let mut out: SmallVec<[Arc<dyn Progress>; 1]> = SmallVec::new();
        for d in cqs.iter().flat_map(|c| c.drivers()) {
            if !out.iter().any(|o| Arc::ptr_eq(o, &d)) {
                out.push(d);
            }
        }
        out
    }

    pub(super) fn push_event(&self, cq: Weak<CqShared>) {
        let mut s = self.state.lock();
        s.events.push_back(cq);
        // At most one octet ever sits in the pipe, so this write never blocks.
        if !s.signalled && (&self.writer).write_all(&[1]).is_ok() {
            s.signalled = true;
        }
        drop(s);
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
    }

    fn take(&self, s: &mut ChanState) -> Option<Cq> {
        while let Some(weak) = s.events.pop_front() {
            if s.events.is_empty() && s.signalled {
                // The octet is there (we wrote it), so this read does not block.
                let mut b = [0u8; 1];
                if (&self.reader).read_exact(&mut b).is_ok() {
                    s.signalled = false;
                }
            }
            if let Some(shared) = weak.upgrade() {
                return Some(Cq { shared });
            }
        }
        None
    }
}

/// A completion channel (`ibv_comp_channel`): where armed CQs report. Wait with
/// [`get_cq_event`](CompletionChannel::get_cq_event), or poll its file descriptor
/// ([`AsFd`]) for readability with `epoll`/`mio`/`poll(2)` and then call
/// [`try_get_cq_event`](CompletionChannel::try_get_cq_event). The fd stays the same and open
/// while any clone lives (what tokio's `AsyncFd::register` asks of it). Cheap to clone.
#[derive(Clone)]
pub struct CompletionChannel {
    pub(crate) shared: Arc<ChannelShared>,
}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl CompletionChannel {
    pub(crate) fn new() -> Result<CompletionChannel, Error> {
        let (reader, writer) = io::pipe()?;
        Ok(CompletionChannel {
            shared: Arc::new(ChannelShared {
                state: Mutex::new(ChanState {
                    events: VecDeque::new(),
                    signalled: false,
                }),
                cond: Condvar::new(),
                cqs: Mutex::new(Vec::new()),
                io_waiters: AtomicUsize::new(0),
                ready: Event::new(),
                reader,
                writer,
            }),
        })
    }

    /// The next event without blocking (`ibv_get_cq_event` on a non-blocking channel): the
    /// CQ that was armed and received a matching completion. Re-arm it to get another.
    pub fn try_get_cq_event(&self) -> Option<Cq> {
        let mut s = self.shared.state.lock();
        self.shared.take(&mut s)
    }

    /// Blocks for the next event (`ibv_get_cq_event`); `None` after `timeout`
    /// (`None` timeout: wait forever). Like [`Cq::wait`], the waiting thread runs the
    /// transport of the channel's CQs itself when one driver feeds them all.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Option<Cq> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let ch = &self.shared;
        loop {
            {
                let mut s = ch.state.lock();
                if let Some(cq) = ch.take(&mut s) {
                    return Some(cq);
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            let drivers = ch.drivers();
            if let [d] = drivers.as_slice() {
                ch.io_waiters.fetch_add(1, Ordering::AcqRel);
                let w: Weak<dyn Waiter> = Arc::downgrade(ch) as Weak<dyn Waiter>;
                let drove = d.block(Wait {
                    waiter: w,
                    spin: Duration::ZERO,
                    flow: FLOW_POLL,
                    until: deadline,
                    done: &|| !ch.state.lock().events.is_empty(),
                });
                ch.io_waiters.fetch_sub(1, Ordering::AcqRel);
                if drove {
                    continue;
                }
            }
            let mut s = ch.state.lock();
            if s.events.is_empty() {
                let nap = (!drivers.is_empty()).then(|| Instant::now() + STAND_DOWN);
                match deadline.into_iter().chain(nap).min() {
                    None => ch.cond.wait(&mut s),
                    Some(d) => {
                        let _ = ch.cond.wait_until(&mut s, d);
                    }
                }
            }
        }
    }

    /// The next event, once there is one (async [`get_cq_event`](Self::get_cq_event);
    /// cancel-safe). The context's background thread runs the transport meanwhile.
    pub async fn get_cq_event_async(&self) -> Cq {
        loop {
            if let Some(cq) = self.try_get_cq_event() {
                return cq;
            }
            let l = self.shared.ready.listen();
            if let Some(cq) = self.try_get_cq_event() {
                return cq;
            }
            for d in self.shared.drivers() {
                d.nudge();
            }
            l.await;
        }
    }

    /// Events waiting.
    pub fn pending(&self) -> usize {
        self.shared.state.lock().events.len()
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.reader.as_fd()
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.reader.as_raw_fd()
    }
}
