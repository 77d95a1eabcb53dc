//! The asynchronous events of each softrdma context, handed to the program's contexts on
//! it (`ibv_get_async_event`): a CQ that overran (`IBV_EVENT_CQ_ERR`), a QP whose stream
//! failed (`IBV_EVENT_QP_FATAL`, or `IBV_EVENT_QP_ACCESS_ERR` for a protection error, as
//! siw reports them); and a connection's end to the librdmacm id that made it
//! (`RDMA_CM_EVENT_DISCONNECTED`). One thread per softrdma context, ended with it.

use core::ffi::c_int;
use std::sync::Arc;

use crate::context::{SrContext, context, live_contexts};
use crate::errno;
use crate::stop::Stop;
use crate::sys;

/// Where a context's `Disconnected` goes (librdmacm's ids, which set it as they connect):
/// called with the program's context and the QP number.
static DISCONNECTED: std::sync::OnceLock<fn(usize, u32)> = std::sync::OnceLock::new();

/// Sets where `Disconnected` events go (once; later calls keep the first).
pub(crate) fn on_disconnected(hook: fn(usize, u32)) {
    let _ = DISCONNECTED.set(hook);
}

/// The thread that dispatches one softrdma context's events.
pub(crate) struct Dispatcher {
    stop: Arc<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Dispatcher {
    /// Starts dispatching `inner`'s events to the program's contexts `mine` says are on it.
    pub(crate) fn start(
        inner: softrdma::Context,
        mine: impl Fn(&SrContext) -> bool + Send + 'static,
    ) -> Dispatcher {
        let stop = Arc::new(Stop::default());
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("softrdma-async".into())
            .spawn(move || {
                loop {
                    let next = futures_lite::future::block_on(futures_lite::future::or(
                        async { Some(inner.next_async_event().await) },
                        async {
                            s.wait().await;
                            None
                        },
                    ));
                    let Some(ev) = next else {
                        return;
                    };
                    dispatch(&ev, &mine);
                }
            })
            .ok();
        Dispatcher { stop, thread }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn dispatch(ev: &softrdma::AsyncEvent, mine: &impl Fn(&SrContext) -> bool) {
    match *ev {
        softrdma::AsyncEvent::Disconnected { qp_num } => {
            if let Some(hook) = DISCONNECTED.get() {
                for c in live_contexts().iter().filter(|c| mine(c)) {
                    hook(c.as_ptr() as usize, qp_num);
                }
            }
        }
        softrdma::AsyncEvent::Qp { qp_num, .. } => {
            let kind = if ev.is_access_error() {
                sys::IBV_EVENT_QP_ACCESS_ERR
            } else {
                sys::IBV_EVENT_QP_FATAL
            };
            if let Some((ctx, qp)) = crate::qp::find(qp_num, mine) {
                ctx.post_async(sys::ibv_async_event {
                    element: sys::ibv_async_event__bindgen_ty_1 { qp },
                    event_type: kind,
                });
            }
        }
        softrdma::AsyncEvent::CqError { cq_id } => {
            if let Some((ctx, cq)) = crate::cq::find(cq_id, mine) {
                ctx.post_async(sys::ibv_async_event {
                    element: sys::ibv_async_event__bindgen_ty_1 { cq },
                    event_type: sys::IBV_EVENT_CQ_ERR,
                });
            }
        }
        softrdma::AsyncEvent::Established { .. } => {}
    }
}

/// `ibv_get_async_event`: the next asynchronous event (a CQ overrun, a QP's stream
/// failing), blocking unless the program made `async_fd` non-blocking (then -1, `EAGAIN`,
/// as UCX, SPDK and Ceph poll it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_async_event(
    ctx: *mut sys::ibv_context,
    event: *mut sys::ibv_async_event,
) -> c_int {
    let Some(c) = context(ctx) else {
        return errno::fail(libc::EINVAL);
    };
    if event.is_null() {
        return errno::fail(libc::EINVAL);
    }
    match c.next_async() {
        Ok(ev) => {
            // SAFETY: the program's room for one event (checked non-NULL).
            unsafe { event.write(ev) };
            0
        }
        Err(e) => errno::fail(e),
    }
}

/// `ibv_ack_async_event`: counted where rdma-core counts it (the QP's `events_completed`,
/// the CQ's `async_events_completed`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_ack_async_event(event: *mut sys::ibv_async_event) {
    // SAFETY: an event this library handed out (the program's promise), if any.
    let Some(ev) = (unsafe { event.as_ref() }) else {
        return;
    };
    match ev.event_type {
        sys::IBV_EVENT_CQ_ERR => {
            // SAFETY: a CQ event names a CQ (checked live before it is touched).
            let p = unsafe { ev.element.cq };
            if crate::cq::cq(p).is_some() {
                // SAFETY: a live CQ of ours; the program only reads this field.
                unsafe { (*p).async_events_completed += 1 };
            }
        }
        sys::IBV_EVENT_QP_FATAL | sys::IBV_EVENT_QP_ACCESS_ERR => {
            // SAFETY: a QP event names a QP (checked live before it is touched).
            let p = unsafe { ev.element.qp };
            if crate::qp::qp(p).is_some() {
                // SAFETY: a live QP of ours; the program only reads this field.
                unsafe { (*p).events_completed += 1 };
            }
        }
        _ => {}
    }
}
