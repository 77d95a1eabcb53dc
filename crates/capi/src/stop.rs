//! A flag a thread can await (a listener's or a dispatcher's end).

use std::sync::atomic::{AtomicBool, Ordering};

/// A flag a thread can await.
#[derive(Default)]
pub(crate) struct Stop {
    set: AtomicBool,
    event: event_listener::Event,
}

impl Stop {
    pub(crate) fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.event.notify(usize::MAX);
    }

    pub(crate) async fn wait(&self) {
        loop {
            if self.set.load(Ordering::Acquire) {
                return;
            }
            let l = self.event.listen();
            if self.set.load(Ordering::Acquire) {
                return;
            }
            l.await;
        }
    }
}
