//! Devices, contexts and protection domains (`ibv_device`, `ibv_context`, `ibv_pd`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use softrdma_iwarp::rdmap::QpEvent;
use softrdma_memory::{KeyTable, PdId};

use crate::Error;
use crate::cq::{CompletionChannel, Cq};
use crate::driver::{self, Cmd};
use crate::qp::QpShared;

/// Name of the TCP (iWARP) device.
pub const TCP_DEVICE_NAME: &str = "softrdma_tcp0";

/// Async events kept per context before the oldest are dropped.
const ASYNC_EVENT_LIMIT: usize = 4096;

/// A device (`ibv_device`): a transport driver that contexts are opened on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    name: String,
}

impl Device {
    /// Every device this build offers (`ibv_get_device_list`): the TCP (iWARP) driver.
    pub fn list() -> Vec<Device> {
        vec![Device::tcp()]
    }

    /// The TCP (iWARP) device.
    pub fn tcp() -> Device {
        Device {
            name: TCP_DEVICE_NAME.to_owned(),
        }
    }

    /// The device's name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a context (`ibv_open_device`): a key table and a progress thread.
    pub fn open(&self) -> Result<Context, Error> {
        Context::open_device(self)
    }
}

/// An asynchronous event (`ibv_async_event` / `rdma_cm_event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP's connection reached full operation (`RDMA_CM_EVENT_ESTABLISHED`).
    Established {
        /// The QP.
        qp_num: u32,
    },
    /// The QP's TCP connection ended: the peer closed it, it was lost, or it was closed
    /// after a Terminate (`RDMA_CM_EVENT_DISCONNECTED`).
    Disconnected {
        /// The QP.
        qp_num: u32,
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

pub(crate) struct CtxShared {
    pub(crate) device: Device,
    pub(crate) keys: Arc<KeyTable>,
    waker: mio::Waker,
    pub(crate) cmds: Mutex<Vec<Cmd>>,
    pub(crate) ready: Mutex<Vec<Arc<QpShared>>>,
    next_pd: AtomicU32,
    next_qp: AtomicU32,
    next_token: AtomicUsize,
    /// Cleared when the progress thread exits.
    pub(crate) alive: AtomicBool,
    events: Mutex<VecDeque<AsyncEvent>>,
    events_cond: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The RoCEv2 driver of a context opened with `Context::open_roce`.
    pub(crate) roce: std::sync::OnceLock<Arc<crate::roce::RoceShared>>,
}

impl CtxShared {
    /// Queues a command for the progress thread.
    pub(crate) fn command(&self, cmd: Cmd) -> Result<(), Error> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(Error::ContextClosed);
        }
        self.cmds.lock().push(cmd);
        self.wake();
        Ok(())
    }

    /// Tells the progress thread that `qp` has new work requests (once until it looks).
    pub(crate) fn schedule(&self, qp: &Arc<QpShared>) {
        if !qp.scheduled.swap(true, Ordering::AcqRel) {
            self.ready.lock().push(qp.clone());
            self.wake();
        }
    }

    pub(crate) fn wake(&self) {
        // Fails only if the poll instance is gone, i.e. the thread exited.
        let _ = self.waker.wake();
    }

    pub(crate) fn token(&self) -> mio::Token {
        mio::Token(self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn next_qp_num(&self) -> u32 {
        self.next_qp.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn post_event(&self, ev: AsyncEvent) {
        let mut q = self.events.lock();
        if q.len() >= ASYNC_EVENT_LIMIT {
            q.pop_front();
        }
        q.push_back(ev);
        drop(q);
        self.events_cond.notify_all();
    }
}

impl Drop for CtxShared {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        self.wake();
        if let Some(h) = self.thread.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

/// An open device (`ibv_context`): owns the key table (STags of every region and window
/// registered through it) and one progress thread that runs every connection of the
/// context (`mio`/epoll). Cheap to clone; the thread stops when the last handle to the
/// context or to anything created from it is gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<CtxShared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.shared.device.name)
            .finish()
    }
}

impl Context {
    /// Opens the TCP device.
    pub fn open() -> Result<Context, Error> {
        Device::tcp().open()
    }

    fn open_device(device: &Device) -> Result<Context, Error> {
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), driver::WAKER)?;
        let shared = Arc::new(CtxShared {
            device: device.clone(),
            keys: Arc::new(KeyTable::new()),
            waker,
            cmds: Mutex::new(Vec::new()),
            ready: Mutex::new(Vec::new()),
            next_pd: AtomicU32::new(1),
            next_qp: AtomicU32::new(1),
            next_token: AtomicUsize::new(driver::FIRST_TOKEN),
            alive: AtomicBool::new(true),
            events: Mutex::new(VecDeque::new()),
            events_cond: Condvar::new(),
            thread: Mutex::new(None),
            roce: std::sync::OnceLock::new(),
        });
        let weak: Weak<CtxShared> = Arc::downgrade(&shared);
        let handle = std::thread::Builder::new()
            .name("softrdma-progress".into())
            .spawn(move || driver::run(weak, poll))?;
        *shared.thread.lock() = Some(handle);
        Ok(Context { shared })
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// The context's key table (every STag of its regions and windows).
    pub fn key_table(&self) -> &KeyTable {
        &self.shared.keys
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Pd {
        Pd {
            ctx: self.shared.clone(),
            id: PdId(self.shared.next_pd.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel, Error> {
        CompletionChannel::new()
    }

    /// Creates a completion queue of `cqe` entries reporting to `channel`
    /// (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: usize, channel: Option<&CompletionChannel>) -> Cq {
        Cq::new(cqe, channel)
    }

    /// The next asynchronous event, without blocking.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.lock().pop_front()
    }

    /// Blocks for the next asynchronous event (`ibv_get_async_event`); `None` after
    /// `timeout`.
    pub fn get_async_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.events.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                return Some(ev);
            }
            if self
                .shared
                .events_cond
                .wait_until(&mut q, deadline)
                .timed_out()
            {
                return q.pop_front();
            }
        }
    }
}

/// A protection domain (`ibv_pd`): regions, windows, QPs and SRQs of one domain may be used
/// together. Cheap to clone.
#[derive(Clone)]
pub struct Pd {
    pub(crate) ctx: Arc<CtxShared>,
    pub(crate) id: PdId,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pd").field(&self.id.0).finish()
    }
}

impl Pd {
    /// The domain's id in the key table.
    pub fn id(&self) -> PdId {
        self.id
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> Context {
        Context {
            shared: self.ctx.clone(),
        }
    }
}
