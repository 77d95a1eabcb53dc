//! RPC over TCP, served (RFC 5531 §11): one thread polls the listener and every connection,
//! reassembles call records and queues them for the pool; replies are written by the worker
//! that made them while the socket takes them, the rest queued and written by the polling
//! thread as the client reads. No worker ever waits on a client.
//!
//! Every connection is bounded as Linux's svc_xprt bounds its transports: connections in all
//! and per address (the least recently active one closed to admit a new one), an idle
//! lifetime, a deadline for a client to take its replies, and two server-wide budgets of
//! octets — calls being assembled and replies waiting — past which the connection holding
//! the oldest unfinished record, or the one whose replies overflow, is closed.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
// Keyed by our own connection numbers.
use rustc_hash::FxHashMap as HashMap;

use crate::buffers::Buffers;
use crate::record::{MAX_FRAGMENT, RecordDecoder, encode_record};
use crate::server::{Server, ServerConfig};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Connection ids start here (tokens are ids).
const FIRST_ID: usize = 2;
/// Octets read from one connection per turn before the others get theirs.
const READ_PER_TURN: usize = 256 << 10;

/// Counters of a TCP service's limits at work.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Connections accepted.
    pub accepted: AtomicUsize,
    /// Connections open now.
    pub open: AtomicUsize,
    /// Connections closed to admit a newer one (`max_connections`, `max_connections_per_addr`).
    pub evicted: AtomicUsize,
    /// Connections closed idle (`idle_timeout`).
    pub idle_closed: AtomicUsize,
    /// Connections closed because their client did not take its replies (`send_timeout`,
    /// `max_queued`).
    pub stalled_closed: AtomicUsize,
    /// Connections closed holding the oldest unfinished record past `max_assembling`.
    pub assembling_closed: AtomicUsize,
    /// Calls read and not yet answered, now.
    pub in_flight: AtomicUsize,
    /// Octets of calls being assembled or waiting for the pool, now.
    pub assembling: AtomicUsize,
}

/// What the polling thread and the workers share.
struct Hub {
    waker: Waker,
    /// Connections the workers ask the polling thread to look at.
    notes: Mutex<Vec<usize>>,
    /// Reply octets queued on all connections.
    queued: AtomicUsize,
    cfg: ServerConfig,
    stats: TcpStats,
    /// The server's kept buffers: records come from there and replies go back once written.
    buffers: Arc<Buffers>,
}

impl Hub {
    fn note(&self, id: usize) {
        self.notes.lock().push(id);
        let _ = self.waker.wake();
    }
}

/// A connection's replies not yet taken by its client.
struct Out {
    queue: VecDeque<Vec<u8>>,
    /// Octets of `queue[0]` written.
    head: usize,
    /// Octets queued, over every entry.
    octets: usize,
    /// Calls read and not yet answered (their replies not yet queued or written).
    in_flight: usize,
    /// The connection is closed (or to be): replies are dropped.
    dead: bool,
    /// When the client last took octets, or the queue last became non-empty.
    progress: Instant,
    /// The polling thread stopped reading (too many calls in flight or replies queued):
    /// whoever makes room tells it.
    paused: bool,
}

/// One connection, shared by the polling thread and the jobs of its calls.
struct Link {
    id: usize,
    sock: TcpStream,
    out: Mutex<Out>,
    hub: Arc<Hub>,
}

impl Link {
    /// Writes `buf` while the socket takes octets: how many it took.
    fn write_now(&self, buf: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match (&self.sock).write(&buf[done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Writes from the queue while the socket takes octets; the queue's lock is held.
    fn flush(&self, o: &mut Out) -> io::Result<()> {
        while let Some(front) = o.queue.front() {
            let n = self.write_now(&front[o.head..])?;
            if n == 0 {
                return Ok(());
            }
            let whole = o.head + n == front.len();
            o.head += n;
            o.octets -= n;
            self.hub.queued.fetch_sub(n, Ordering::AcqRel);
            o.progress = Instant::now();
            if !whole {
                return Ok(());
            }
            if let Some(done) = o.queue.pop_front() {
                self.hub.buffers.give(done);
            }
            o.head = 0;
        }
        Ok(())
    }

    /// A call's end: its reply record (if any) written now, what the socket does not take
    /// queued within the server's `max_queued` (past it the connection is closed: its
    /// client is not reading).
    fn finish(&self, record: Option<Vec<u8>>) {
        let mut o = self.out.lock();
        o.in_flight = o.in_flight.saturating_sub(1);
        self.hub.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut note = o.paused;
        if let Some(rec) = record
            && !o.dead
            && !rec.is_empty()
        {
            // Replies leave in order: written at once only behind an empty queue.
            let written = if o.queue.is_empty() {
                self.write_now(&rec)
            } else {
                Ok(0)
            };
            match written {
                Err(_) => o.dead = true,
                Ok(n) if n == rec.len() => self.hub.buffers.give(rec),
                Ok(n) => {
                    let rest = rec.len() - n;
                    let max = self.hub.cfg.max_queued;
                    let room =
                        self.hub
                            .queued
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                                q.checked_add(rest).filter(|&t| t <= max)
                            });
                    if room.is_err() {
                        tracing::info!(
                            id = self.id,
                            octets = o.octets,
                            "RPC/TCP client not reading its replies: closed (max_queued)"
                        );
                        self.hub
                            .stats
                            .stalled_closed
                            .fetch_add(1, Ordering::Relaxed);
                        o.dead = true;
                    } else {
                        if o.queue.is_empty() {
                            o.head = n;
                            o.progress = Instant::now();
                        }
                        o.octets += rest;
                        o.queue.push_back(rec);
                        // The polling thread writes the rest as the client reads.
                        note = true;
                    }
                }
            }
        }
        note |= o.dead;
        drop(o);
        if note {
            self.hub.note(self.id);
        }
    }

    /// Drops every queued reply (the connection is closing).
    fn discard(&self) {
        let mut o = self.out.lock();
        o.dead = true;
        self.hub.queued.fetch_sub(o.octets, Ordering::AcqRel);
        o.octets = 0;
        o.queue.clear();
    }
}

/// The polling thread's view of a connection.
struct Conn {
    link: Arc<Link>,
    peer: SocketAddr,
    decoder: RecordDecoder,
    /// Whole calls not yet handed to the pool (the in-flight limit was reached).
    ready: VecDeque<Vec<u8>>,
    /// Octets held in `decoder` and `ready`, as counted in the assembling budget.
    held: usize,
    /// When its record being assembled began (`None` between records).
    record_start: Option<Instant>,
    /// Last octets received or a reply taken: the idle clock and eviction order.
    active: Instant,
    /// The stream ended; the connection closes once its calls are answered.
    eof: bool,
}

/// A running TCP service; shut down when dropped.
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    hub: Arc<Hub>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The service's counters.
    pub fn stats(&self) -> &TcpStats {
        &self.hub.stats
    }

    /// Reply octets waiting for clients to read them, now.
    pub fn queued(&self) -> usize {
        self.hub.queued.load(Ordering::Acquire)
    }

    /// Stops accepting and ends every connection.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.hub.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Server {
    /// Serves RPC over TCP on `listener` until the handle is shut down or dropped, within
    /// the limits of its [`ServerConfig`].
    pub fn serve_tcp(self: &Arc<Self>, listener: TcpListener) -> io::Result<TcpServer> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let fd = listener.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), LISTENER, Interest::READABLE)?;
        let hub = Arc::new(Hub {
            waker,
            notes: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            cfg: *self.config(),
            stats: TcpStats::default(),
            buffers: self.buffers().clone(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut lp = Loop {
            server: self.clone(),
            hub: hub.clone(),
            poll,
            accept_retry: false,
            listener,
            conns: HashMap::default(),
            next_id: FIRST_ID,
            again: Vec::new(),
            scratch: vec![0; 64 << 10].into_boxed_slice(),
        };
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rpc-tcp".into())
            .spawn(move || lp.run(&stop2))?;
        Ok(TcpServer {
            addr,
            stop,
            hub,
            thread: Some(thread),
        })
    }
}

struct Loop {
    server: Arc<Server>,
    hub: Arc<Hub>,
    poll: Poll,
    /// An accept failed (out of descriptors): the backlog is tried again at each sweep.
    accept_retry: bool,
    listener: TcpListener,
    conns: HashMap<usize, Conn>,
    next_id: usize,
    /// Connections to read again without waiting for the socket (their turn ended).
    again: Vec<usize>,
    scratch: Box<[u8]>,
}

impl Loop {
    fn cfg(&self) -> &ServerConfig {
        &self.hub.cfg
    }

    fn run(&mut self, stop: &AtomicBool) {
        let mut events = Events::with_capacity(256);
        let cfg = *self.cfg();
        // Deadlines are checked a few times within the shortest of them.
        let tick = (cfg.idle_timeout.min(cfg.send_timeout) / 4)
            .clamp(Duration::from_millis(5), Duration::from_secs(1));
        let mut next_sweep = Instant::now() + tick;
        while !stop.load(Ordering::Acquire) {
            let wait = if self.again.is_empty() {
                next_sweep.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(wait))
                && e.kind() != io::ErrorKind::Interrupted
            {
                tracing::error!(error = %e, "RPC/TCP poll failed");
                break;
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    Token(id) => {
                        if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                            self.flush(id);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.read(id);
                        }
                    }
                }
            }
            for id in std::mem::take(&mut self.again) {
                self.read(id);
            }
            let notes = std::mem::take(&mut *self.hub.notes.lock());
            for id in notes {
                self.attend(id);
            }
            if Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + tick;
            }
        }
        for id in self.conns.keys().copied().collect::<Vec<_>>() {
            self.close(id);
        }
    }

    fn accept_all(&mut self) {
        loop {
            let (s, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: the backlog keeps the connection for later
                    // (no new event comes for it: the sweep tries again).
                    tracing::warn!(error = %e, "RPC/TCP accept failed");
                    self.accept_retry = true;
                    return;
                }
            };
            self.admit(s, peer);
        }
    }

    /// Makes room under the connection limits (closing the least recently active
    /// connection of the address, or of all), then serves `s`.
    fn admit(&mut self, s: TcpStream, peer: SocketAddr) {
        let cfg = *self.cfg();
        let open: Vec<(usize, IpAddr)> = self
            .conns
            .iter()
            .map(|(&id, c)| (id, c.peer.ip()))
            .collect();
        // Among the least active, one with a call in flight goes last.
        let rank = |id| {
            let c = &self.conns[&id];
            (c.link.out.lock().in_flight > 0, c.active)
        };
        for old in cfg.closing_for(peer.ip(), &open, rank) {
            tracing::info!(%peer, "RPC/TCP connections at the limit: the least active closed");
            self.hub.stats.evicted.fetch_add(1, Ordering::Relaxed);
            self.close(old);
        }
        if s.set_nonblocking(true).is_err() {
            return;
        }
        let _ = s.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        let fd: RawFd = s.as_raw_fd();
        if self
            .poll
            .registry()
            .register(
                &mut SourceFd(&fd),
                Token(id),
                Interest::READABLE | Interest::WRITABLE,
            )
            .is_err()
        {
            return;
        }
        let now = Instant::now();
        let link = Arc::new(Link {
            id,
            sock: s,
            out: Mutex::new(Out {
                queue: VecDeque::new(),
                head: 0,
                octets: 0,
                in_flight: 0,
                dead: false,
                progress: now,
                paused: false,
            }),
            hub: self.hub.clone(),
        });
        self.conns.insert(
            id,
            Conn {
                link,
                peer,
                decoder: RecordDecoder::with_buffers(cfg.max_record, self.hub.buffers.clone()),
                ready: VecDeque::new(),
                held: 0,
                record_start: None,
                active: now,
                eof: false,
            },
        );
        self.hub.stats.accepted.fetch_add(1, Ordering::Relaxed);
        self.hub
            .stats
            .open
            .store(self.conns.len(), Ordering::Relaxed);
        // Octets may have arrived with the connection (edge-triggered polling).
        self.read(id);
    }

    /// Whether the polling thread may read more calls from `c`; if not, the connection is
    /// marked paused under the same lock a finishing call takes, so that the call that
    /// makes room always notes it (no lost wake-up).
    fn may_read(cfg: &ServerConfig, c: &Conn) -> bool {
        let mut o = c.link.out.lock();
        let ok = !c.eof
            && !o.dead
            && c.ready.is_empty()
            && o.in_flight < cfg.max_in_flight.max(1)
            && o.octets <= cfg.max_record;
        o.paused = !ok;
        ok
    }

    /// Reads what the socket has for `id` (up to a turn's worth), hands whole calls to the
    /// pool.
    fn read(&mut self, id: usize) {
        let cfg = *self.cfg();
        let mut budget = READ_PER_TURN;
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            if !Self::may_read(&cfg, c) {
                break;
            }
            if budget == 0 {
                self.again.push(id);
                break;
            }
            let n = match (&c.link.sock).read(&mut self.scratch) {
                Ok(0) => {
                    c.eof = true;
                    if !c.decoder.is_idle() {
                        tracing::debug!(peer = %c.peer, "RPC/TCP connection ended inside a record");
                    }
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(peer = %c.peer, error = %e, "RPC/TCP connection ended");
                    c.eof = true;
                    c.link.out.lock().dead = true;
                    break;
                }
            };
            budget = budget.saturating_sub(n);
            c.active = Instant::now();
            let mut input = &self.scratch[..n];
            let mut bad = false;
            while !input.is_empty() {
                match c.decoder.decode(&mut input) {
                    Ok(Some(rec)) => {
                        c.record_start = None;
                        c.ready.push_back(rec);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(peer = %c.peer, error = %e, "RPC/TCP connection ended");
                        bad = true;
                        break;
                    }
                }
            }
            if bad {
                c.eof = true;
                c.link.out.lock().dead = true;
                break;
            }
            if !c.decoder.is_idle() && c.record_start.is_none() {
                c.record_start = Some(c.active);
            }
            let held = c.decoder.progress().0 + c.ready.iter().map(Vec::len).sum::<usize>();
            // The gauge is the budget's count: only this thread changes it.
            let gauge = &self.hub.stats.assembling;
            gauge.fetch_add(held, Ordering::Relaxed);
            gauge.fetch_sub(std::mem::replace(&mut c.held, held), Ordering::Relaxed);
            self.dispatch(id);
            self.within_assembling_budget(id);
        }
        self.attend(id);
    }

    /// Hands `id`'s whole calls to the pool while its in-flight limit allows.
    fn dispatch(&mut self, id: usize) {
        let max = self.cfg().max_in_flight.max(1);
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            {
                let mut o = c.link.out.lock();
                if c.ready.is_empty() || o.dead || o.in_flight >= max {
                    return;
                }
                o.in_flight += 1;
            }
            self.hub.stats.in_flight.fetch_add(1, Ordering::Relaxed);
            let Some(msg) = c.ready.pop_front() else {
                return;
            };
            c.held -= msg.len();
            self.hub
                .stats
                .assembling
                .fetch_sub(msg.len(), Ordering::Relaxed);
            let (link, peer, server) = (c.link.clone(), c.peer, self.server.clone());
            let inline = server.registry().runs_inline(&msg);
            let job = move || {
                let buffers = server.buffers();
                let (rec, body) = server
                    .registry()
                    .dispatch(&msg, Some(peer), buffers)
                    .map(|r| {
                        let mut out = buffers.vec(r.len() + 8);
                        r.with_parts(|p| encode_record(p, MAX_FRAGMENT, &mut out));
                        (out, r.body.xdr)
                    })
                    .unzip();
                link.finish(rec);
                // After the reply is on its way.
                if let Some(b) = body {
                    buffers.give(b);
                }
                buffers.give(msg);
            };
            if inline {
                job();
            } else {
                self.server.spawn_in(id as u64, job);
            }
        }
    }

    /// Closes connections holding the oldest unfinished records while the octets held over
    /// all connections exceed `max_assembling`.
    fn within_assembling_budget(&mut self, current: usize) {
        let max = self.cfg().max_assembling;
        while self.hub.stats.assembling.load(Ordering::Relaxed) > max {
            let victim = self
                .conns
                .iter()
                .filter_map(|(&id, c)| c.record_start.map(|t| (t, id)))
                .min()
                .map(|(_, id)| id)
                .unwrap_or(current);
            tracing::info!(
                id = victim,
                held = self.hub.stats.assembling.load(Ordering::Relaxed),
                "RPC/TCP records being assembled over max_assembling: the oldest closed"
            );
            self.hub
                .stats
                .assembling_closed
                .fetch_add(1, Ordering::Relaxed);
            let was = self.conns.contains_key(&victim);
            self.close(victim);
            if !was || victim == current {
                break;
            }
        }
    }

    /// Writes what is queued for `id`.
    fn flush(&mut self, id: usize) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let mut o = c.link.out.lock();
        let before = o.octets;
        if c.link.flush(&mut o).is_err() {
            o.dead = true;
        }
        if o.octets < before {
            c.active = Instant::now();
        }
        drop(o);
        self.attend(id);
    }

    /// Looks at `id` after a change: writes, reads again if it was held back, closes it if
    /// it is dead or done.
    fn attend(&mut self, id: usize) {
        let cfg = *self.cfg();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let (dead, done) = {
            let mut o = c.link.out.lock();
            if !o.queue.is_empty() && c.link.flush(&mut o).is_err() {
                o.dead = true;
            }
            (
                o.dead,
                c.eof && o.in_flight == 0 && o.queue.is_empty() && c.ready.is_empty(),
            )
        };
        if dead || done {
            self.close(id);
            return;
        }
        if !c.ready.is_empty() {
            self.dispatch(id);
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let paused = c.link.out.lock().paused;
        if paused && Self::may_read(&cfg, c) {
            // Edge-triggered: what arrived while paused raises no new event.
            self.read(id);
        }
    }

    /// Closes connections idle past `idle_timeout` and those whose client has not taken
    /// its replies for `send_timeout`.
    fn sweep(&mut self) {
        if std::mem::take(&mut self.accept_retry) {
            self.accept_all();
        }
        let cfg = *self.cfg();
        let now = Instant::now();
        let mut stale = Vec::new();
        for (&id, c) in &self.conns {
            let o = c.link.out.lock();
            if !o.queue.is_empty() && now.duration_since(o.progress) > cfg.send_timeout {
                tracing::info!(peer = %c.peer, octets = o.octets, "RPC/TCP client took no reply within send_timeout: closed");
                self.hub
                    .stats
                    .stalled_closed
                    .fetch_add(1, Ordering::Relaxed);
                stale.push(id);
            } else if o.in_flight == 0
                && o.queue.is_empty()
                && now.duration_since(c.active) > cfg.idle_timeout
            {
                tracing::debug!(peer = %c.peer, "RPC/TCP connection idle past idle_timeout: closed");
                self.hub.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                stale.push(id);
            }
        }
        for id in stale {
            self.close(id);
        }
    }

    fn close(&mut self, id: usize) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        let fd = c.link.sock.as_raw_fd();
        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
        let _ = c.link.sock.shutdown(Shutdown::Both);
        c.link.discard();
        self.hub
            .stats
            .assembling
            .fetch_sub(c.held, Ordering::Relaxed);
        self.hub
            .stats
            .open
            .store(self.conns.len(), Ordering::Relaxed);
        // The socket itself closes when the last job of the connection drops the link.
    }
}
