//! Listeners' shared state: the requests whose MPA Request arrived, waiting for the
//! application, and the accepted connections still in MPA startup, counted against the
//! listener's limits ([`HalfOpen`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Token;
use parking_lot::Mutex;
use softrdma_iwarp::startup::{PeerParams, RtrSet, StartupConfig};

use crate::backlog::Backlog;
use crate::connparams::{ListenParams, iwarp};

impl iwarp::ListenParams {
    /// The MPA responder's settings.
    pub(crate) fn startup_config(&self) -> StartupConfig {
        StartupConfig {
            rev: self.rev,
            crc: self.crc,
            markers: self.markers,
            p2p: self.p2p.then_some(RtrSet::WRITE_OR_READ),
            timeout: self.timeout,
            ..StartupConfig::default()
        }
    }
}

pub(crate) struct PendingRequest {
    pub(crate) token: mio::Token,
    pub(crate) local_addr: SocketAddr,
    pub(crate) peer_addr: SocketAddr,
    pub(crate) private_data: Vec<u8>,
    pub(crate) params: PeerParams,
    pub(crate) early_fpdus: bool,
}

pub(crate) struct ListenerShared {
    pub(crate) params: ListenParams,
    /// Requests whose MPA Request arrived, for `accept`.
    pub(crate) requests: Backlog<PendingRequest>,
    /// Accepted connections still waiting for their MPA Request ([`HalfOpen`]).
    pub(crate) half_open: Mutex<HalfOpenSet>,
}

/// A listener's accepted connections whose MPA Request has not arrived yet, oldest first,
/// and how many each source address holds.
#[derive(Default)]
pub(crate) struct HalfOpenSet {
    next: u64,
    by_age: BTreeMap<u64, (Token, IpAddr, Instant)>,
    per_source: HashMap<IpAddr, u32>,
}

impl HalfOpenSet {
    fn insert(&mut self, token: Token, ip: IpAddr, now: Instant) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.by_age.insert(seq, (token, ip, now));
        *self.per_source.entry(ip).or_default() += 1;
        seq
    }

    fn remove(&mut self, seq: u64) -> Option<Token> {
        let (token, ip, _) = self.by_age.remove(&seq)?;
        if let Some(n) = self.per_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&ip);
            }
        }
        Some(token)
    }

    /// Connections held.
    pub(crate) fn len(&self) -> usize {
        self.by_age.len()
    }
}

/// How long a source's silent connections may stay past its quota while the listener has
/// room ([`HalfOpen::victim`]).
const HALF_OPEN_GRACE: Duration = Duration::from_secs(1);

/// One accepted connection in MPA startup, counted against the listener's
/// `max_half_open` and `max_half_open_per_source` until its Request arrives or it goes.
pub(crate) struct HalfOpen {
    l: Arc<ListenerShared>,
    seq: u64,
}

impl HalfOpen {
    /// Takes a place for connection `token` from `ip`, and names the connection that must
    /// give its place up for it, if any: the oldest of the same source when that source
    /// holds its quota, else the oldest of all when the listener is full. A flood of
    /// silent connections then only pushes out its own (or older silent ones), never
    /// locks a newcomer out: one that sends its Request promptly is through before its
    /// turn to be evicted comes.
    pub(crate) fn take(
        l: &Arc<ListenerShared>,
        token: Token,
        ip: IpAddr,
        now: Instant,
    ) -> (HalfOpen, Option<Token>) {
        let mut s = l.half_open.lock();
        let victim = Self::victim_in(l, &s, ip, now);
        let evicted = victim.and_then(|seq| s.remove(seq));
        let seq = s.insert(token, ip, now);
        drop(s);
        (HalfOpen { l: l.clone(), seq }, evicted)
    }
}

impl HalfOpen {
    /// The connection that would give its place up to a newcomer from `ip` (see
    /// [`HalfOpen::take`]), if one would.
    pub(crate) fn victim(l: &Arc<ListenerShared>, ip: IpAddr, now: Instant) -> Option<Token> {
        let s = l.half_open.lock();
        Self::victim_in(l, &s, ip, now).and_then(|seq| s.by_age.get(&seq).map(|(t, ..)| *t))
    }

    /// The oldest of `ip`'s when it holds its quota — unless that one is younger than
    /// [`HALF_OPEN_GRACE`] and the listener has room: a client opening many connections
    /// at once (Debian's cmtime opens 100) may have them all accepted before it sent the
    /// first Request, and a flood from one address still only pushes out its own once they
    /// are that old; the oldest of all when the listener is full.
    fn victim_in(l: &ListenerShared, s: &HalfOpenSet, ip: IpAddr, now: Instant) -> Option<u64> {
        let max = l.params.iwarp.max_half_open.max(1) as usize;
        let per_source = l.params.iwarp.max_half_open_per_source.max(1);
        let full = s.len() >= max;
        if s.per_source.get(&ip).copied().unwrap_or(0) >= per_source {
            let own = s
                .by_age
                .iter()
                .find(|(_, (_, from, _))| *from == ip)
                .map(|(&seq, &(_, _, at))| (seq, at));
            match own {
                Some((seq, at)) if full || now.saturating_duration_since(at) >= HALF_OPEN_GRACE => {
                    return Some(seq);
                }
                _ => {}
            }
        }
        if full {
            s.by_age.keys().next().copied()
        } else {
            None
        }
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        // Evicted already, or leaving now.
        self.l.half_open.lock().remove(self.seq);
    }
}

impl ListenerShared {
    pub(crate) fn new(params: ListenParams) -> ListenerShared {
        ListenerShared {
            requests: Backlog::new(params.backlog),
            params,
            half_open: Mutex::new(HalfOpenSet::default()),
        }
    }
}
