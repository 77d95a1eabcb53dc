//! The duplicate request cache: a retransmitted non-idempotent call is answered from the
//! reply the first execution made, not executed again (RFC 5531 §8 leaves it to the server;
//! what Linux `nfsd`'s reply cache does). A client retransmits with the same xid, usually on
//! a new connection (a new source port), so a call is known by its client's address without
//! the port, its xid, procedure and a checksum of its arguments.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use parking_lot::Mutex;

/// A reply the cache can keep: cloned out again, counted in octets.
pub trait Cached: Clone {
    /// Octets it takes.
    fn cached_len(&self) -> usize;
}

/// Octets of the arguments the checksum covers (as Linux's `RC_CSUMLEN`, a little more).
const CSUM_LEN: usize = 256;

/// Who sent which call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallKey {
    pub addr: Option<IpAddr>,
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc: u32,
    pub args_len: usize,
    pub csum: u32,
}

impl CallKey {
    pub fn new(
        addr: Option<IpAddr>,
        xid: u32,
        (prog, vers, proc): (u32, u32, u32),
        args: &[u8],
    ) -> CallKey {
        CallKey {
            addr,
            xid,
            prog,
            vers,
            proc,
            args_len: args.len(),
            csum: crc_fast::crc32_iscsi(&args[..args.len().min(CSUM_LEN)]),
        }
    }
}

enum Entry<R> {
    /// Executing now: a retransmission is dropped (the reply is on its way, or will be
    /// cached for the next one), as Linux's `RC_DROPIT`.
    InProgress,
    Done(R),
}

/// What [`ReplyCache::begin`] found.
pub enum Seen<R> {
    /// New: execute it, then [`ReplyCache::finish`].
    New,
    /// Executing: drop the retransmission.
    InProgress,
    /// Answered before: send this again.
    Done(R),
}

struct Inner<R> {
    map: HashMap<CallKey, Entry<R>>,
    /// Keys, oldest first (eviction order).
    order: VecDeque<CallKey>,
    bytes: usize,
}

/// Bounded in entries and in octets of cached replies; the oldest go first.
pub struct ReplyCache<R> {
    inner: Mutex<Inner<R>>,
    max_entries: usize,
    max_bytes: usize,
}

impl<R: Cached> Default for ReplyCache<R> {
    /// 4096 replies, 8 MiB.
    fn default() -> ReplyCache<R> {
        ReplyCache::new(4096, 8 << 20)
    }
}

impl<R: Cached> ReplyCache<R> {
    pub fn new(max_entries: usize, max_bytes: usize) -> ReplyCache<R> {
        ReplyCache {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
            }),
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    /// Looks `key` up; a new call is entered as executing.
    pub fn begin(&self, key: CallKey) -> Seen<R> {
        let mut g = self.inner.lock();
        match g.map.get(&key) {
            Some(Entry::InProgress) => return Seen::InProgress,
            Some(Entry::Done(r)) => return Seen::Done(r.clone()),
            None => {}
        }
        g.map.insert(key, Entry::InProgress);
        g.order.push_back(key);
        self.evict(&mut g);
        Seen::New
    }

    /// The call `key` was answered with `reply` (kept unless larger than the whole cache).
    pub fn finish(&self, key: CallKey, reply: &R) {
        let mut g = self.inner.lock();
        let size = reply.cached_len();
        match g.map.get_mut(&key) {
            Some(e @ Entry::InProgress) if size <= self.max_bytes => {
                *e = Entry::Done(reply.clone());
                g.bytes += size;
            }
            Some(Entry::InProgress) => {
                g.map.remove(&key);
            }
            _ => {}
        }
        self.evict(&mut g);
    }

    fn evict(&self, g: &mut Inner<R>) {
        while g.map.len() > self.max_entries || g.bytes > self.max_bytes {
            let Some(k) = g.order.pop_front() else { break };
            if let Some(Entry::Done(r)) = g.map.remove(&k) {
                g.bytes -= r.cached_len();
            }
        }
        // Keys whose entry went (too large to keep) are dropped lazily.
        while g.order.len() > 2 * self.max_entries {
            let Some(k) = g.order.pop_front() else { break };
            if let Some(Entry::Done(r)) = g.map.remove(&k) {
                g.bytes -= r.cached_len();
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct R(u32, usize);

    impl Cached for R {
        fn cached_len(&self) -> usize {
            4 + self.1
        }
    }

    fn key(xid: u32) -> CallKey {
        CallKey::new(Some([10, 0, 0, 1].into()), xid, (100003, 3, 8), b"args")
    }

    fn reply(xid: u32, n: usize) -> R {
        R(xid, n)
    }

    #[test]
    fn a_retransmission_is_dropped_while_executing_and_answered_after() {
        let c = ReplyCache::<R>::default();
        assert!(matches!(c.begin(key(1)), Seen::New));
        assert!(matches!(c.begin(key(1)), Seen::InProgress));
        c.finish(key(1), &reply(1, 8));
        match c.begin(key(1)) {
            Seen::Done(r) => assert_eq!(r, reply(1, 8)),
            _ => panic!("the cached reply"),
        }
        // Another xid, another address, other arguments: other calls.
        assert!(matches!(c.begin(key(2)), Seen::New));
        let mut k = key(1);
        k.addr = Some([10, 0, 0, 2].into());
        assert!(matches!(c.begin(k), Seen::New));
        let k = CallKey::new(Some([10, 0, 0, 1].into()), 1, (100003, 3, 8), b"other");
        assert!(matches!(c.begin(k), Seen::New));
    }

    #[test]
    fn bounded_in_entries_and_octets() {
        let c = ReplyCache::<R>::new(4, 100);
        for x in 0..10 {
            assert!(matches!(c.begin(key(x)), Seen::New));
            c.finish(key(x), &reply(x, 20));
        }
        assert!(c.len() <= 4);
        // 4 replies of 24 octets fit 100; the oldest went.
        assert!(matches!(c.begin(key(0)), Seen::New));
        assert!(matches!(c.begin(key(9)), Seen::Done(_)));
        // A reply larger than the cache is not kept.
        assert!(matches!(c.begin(key(50)), Seen::New));
        c.finish(key(50), &reply(50, 1000));
        assert!(matches!(c.begin(key(50)), Seen::New));
    }
}
