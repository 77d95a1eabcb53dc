//! Which handles are ours and alive: a program may pass any pointer, and the calls that
//! make, query or end an object check it here first (the hot paths — posting and polling
//! through the context's ops — trust the program, as rdma-core's providers do).

use std::collections::HashSet;
use std::sync::OnceLock;

use parking_lot::Mutex;

/// The addresses of one kind of live handle.
pub(crate) struct Live(OnceLock<Mutex<HashSet<usize>>>);

impl Live {
    pub(crate) const fn new() -> Live {
        Live(OnceLock::new())
    }

    fn set(&self) -> &Mutex<HashSet<usize>> {
        self.0.get_or_init(Mutex::default)
    }

    pub(crate) fn insert<T>(&self, p: *const T) {
        self.set().lock().insert(p as usize);
    }

    /// Whether `p` was live (and is no longer).
    pub(crate) fn remove<T>(&self, p: *const T) -> bool {
        self.set().lock().remove(&(p as usize))
    }

    /// `f()` while `p` is live, under the lock that [`Live::remove`] takes: what `f` takes
    /// hold of (a reference count) is taken before the handle can go.
    pub(crate) fn while_live<T, R>(&self, p: *const T, f: impl FnOnce() -> R) -> Option<R> {
        if p.is_null() {
            return None;
        }
        let set = self.set().lock();
        set.contains(&(p as usize)).then(f)
    }

    pub(crate) fn contains<T>(&self, p: *const T) -> bool {
        self.while_live(p, || ()).is_some()
    }

    /// The live handles now (for the rare walks over all of them).
    pub(crate) fn snapshot(&self) -> Vec<usize> {
        self.set().lock().iter().copied().collect()
    }
}
