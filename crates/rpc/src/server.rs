//! The RPC server: programs registered by (program, version), calls dispatched on a pool of
//! threads, every reply status of RFC 5531 §9 where it applies.

use std::collections::BTreeMap;

// Keys are the registry's own: no hashing hostile input (the reply cache keeps SipHash).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use softrdma_wire::onc_rpc::AuthStat;

use crate::buffers::Buffers;
use crate::drc::{Cached, CallKey, ReplyCache, Seen};
use crate::msg::{Auth, CallHeader, ReplyStatus, decode_call, encode_reply};
use crate::payload::Payload;
use crate::sched::Sched;
use crate::tcp::DEFAULT_MAX_RECORD;

/// What a procedure's handler sees besides its arguments.
#[derive(Debug, Clone, Copy)]
pub struct CallContext<'a> {
    /// The call's header: credential, procedure.
    pub header: &'a CallHeader,
    /// Where it came from.
    pub peer: Option<SocketAddr>,
    buffers: &'a Buffers,
}

impl CallContext<'_> {
    /// An empty vector with room for `capacity` octets, from memory the server reuses:
    /// results built in it (e.g. with [`Payload::with_opaque`]) cost no allocation per call,
    /// and over RDMA they are written from where they are.
    pub fn buffer(&self, capacity: usize) -> Vec<u8> {
        self.buffers.vec(capacity)
    }
}

/// A procedure that does not return results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcError {
    /// `PROC_UNAVAIL`: no such procedure in this version.
    ProcUnavail,
    /// `GARBAGE_ARGS`: the arguments do not decode.
    GarbageArgs,
    /// `SYSTEM_ERR`: the server failed.
    SystemErr,
    /// `AUTH_ERROR` with this status (e.g. `TooWeak` for a credential the program refuses).
    Auth(AuthStat),
}

/// One version of a program: its procedures.
pub trait Program: Send + Sync + 'static {
    /// Runs procedure `ctx.header.proc` on XDR `args` (whole: DDP-eligible data the
    /// transport moved apart is back in place); its XDR results, with the DDP-eligible
    /// result item marked if the procedure has one (RFC 8166 §6).
    fn call(&self, ctx: &CallContext<'_>, args: &[u8]) -> Result<Payload, ProcError>;
}

impl<F, R> Program for F
where
    F: Fn(&CallContext<'_>, &[u8]) -> Result<R, ProcError> + Send + Sync + 'static,
    R: Into<Payload>,
{
    fn call(&self, ctx: &CallContext<'_>, args: &[u8]) -> Result<Payload, ProcError> {
        self(ctx, args).map(Into::into)
    }
}

/// A reply message on its way out: the RPC reply header, then the procedure's results as
/// the program made them (never copied to put the header in front).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutReply {
    /// The call's xid.
    pub xid: u32,
    /// The reply header (through the accept status).
    pub head: Vec<u8>,
    /// The results, unreduced, with their DDP-eligible item.
    pub body: Payload,
}

impl Cached for OutReply {
    fn cached_len(&self) -> usize {
        self.len()
    }
}

impl OutReply {
    /// Runs `f` on the message in order as slices: header, then results (a shared result
    /// item read where it is).
    pub fn with_parts<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        self.body.with_parts(|body| {
            // The body is at most four slices (`Payload::with_parts`).
            let mut parts: [&[u8]; 5] = [&[]; 5];
            let n = body.len().min(4);
            parts[0] = &self.head;
            parts[1..=n].copy_from_slice(&body[..n]);
            f(&parts[..=n])
        })
    }

    /// Octets of the whole message.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// `true` for an empty message (never for one [`Registry::dispatch`] made).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole message in one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with_parts(|p| p.concat())
    }
}

/// An Upper-Layer Binding's rule for arguments (RFC 8166 §6): given a procedure and its
/// arguments as they arrived (reduced), the offset in the arguments where the data of its
/// DDP-eligible argument belongs (right after the item's length word), or `None` when the
/// procedure has no DDP-eligible argument (or the arguments do not decode that far).
pub type ArgumentBinding = Arc<dyn Fn(u32, &[u8]) -> Option<usize> + Send + Sync>;

/// Where a call's Read chunk may go, by its program's Upper-Layer Binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eligible {
    /// The program declares no binding: any one item may come through a chunk.
    Unbound,
    /// Nothing of this call may be reduced.
    Nothing,
    /// Only the data at this offset of the call message.
    At(usize),
}

/// The programs a server serves, and the dispatch of one call message to them.
#[derive(Default, Clone)]
pub struct Registry {
    progs: HashMap<u32, BTreeMap<u32, Arc<dyn Program>>>,
    /// Procedures whose replies go into the duplicate request cache.
    non_idempotent: HashSet<(u32, u32, u32)>,
    /// Procedures run by the thread that read the call.
    inline: HashSet<(u32, u32, u32)>,
    /// Upper-Layer Bindings of the programs' DDP-eligible arguments, by (program, version).
    bindings: HashMap<(u32, u32), ArgumentBinding>,
    drc: Arc<ReplyCache<OutReply>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Serves version `vers` of program `prog` with `p` (replacing an earlier one).
    pub fn register(&mut self, prog: u32, vers: u32, p: impl Program) -> &mut Registry {
        self.progs
            .entry(prog)
            .or_default()
            .insert(vers, Arc::new(p));
        self
    }

    /// Marks procedures `procs` of `prog`/`vers` as not idempotent: a retransmission of one
    /// of their calls (same client address, xid, procedure and arguments) is answered from
    /// the duplicate request cache, never executed twice.
    pub fn non_idempotent(&mut self, prog: u32, vers: u32, procs: &[u32]) -> &mut Registry {
        self.non_idempotent
            .extend(procs.iter().map(|&p| (prog, vers, p)));
        self
    }

    /// Marks procedures `procs` of `prog`/`vers` as never blocking (no I/O, no waiting on
    /// anything but memory): their calls run in the thread that read them, not handed to
    /// the pool — one thread wake-up less per call. A procedure that may block must not be
    /// marked: it would hold up every call behind it on its connection.
    pub fn inline(&mut self, prog: u32, vers: u32, procs: &[u32]) -> &mut Registry {
        self.inline.extend(procs.iter().map(|&p| (prog, vers, p)));
        self
    }

    /// Whether call message `msg` is for a procedure marked [`Registry::inline`].
    pub fn runs_inline(&self, msg: &[u8]) -> bool {
        !self.inline.is_empty()
            && crate::msg::peek_call(msg).is_some_and(|p| self.inline.contains(&p))
    }

    /// Declares the Upper-Layer Binding of version `vers` of program `prog` for arguments:
    /// an RPC-over-RDMA responder then refuses a call whose Read chunk is anywhere else
    /// (ERR_CHUNK, RFC 8166 §6.1, RPCRDMA-73).
    pub fn bind_arguments(
        &mut self,
        prog: u32,
        vers: u32,
        f: impl Fn(u32, &[u8]) -> Option<usize> + Send + Sync + 'static,
    ) -> &mut Registry {
        self.bindings.insert((prog, vers), Arc::new(f));
        self
    }

    /// Where a Read chunk of the call whose reduced message is `reduced` may go.
    pub fn eligible_argument(&self, reduced: &[u8]) -> Eligible {
        let Ok((h, off)) = decode_call(reduced) else {
            // A chunk inside the call header, or no call at all.
            return Eligible::Nothing;
        };
        match self.bindings.get(&(h.prog, h.vers)) {
            None => Eligible::Unbound,
            Some(f) => match f(h.proc, &reduced[off..]) {
                Some(at) => Eligible::At(off + at),
                None => Eligible::Nothing,
            },
        }
    }

    /// Answers the call message `msg`: the reply message, or `None` when there is nothing
    /// to answer (not a call, or a retransmission of a call still executing). A handler
    /// that panics answers `SYSTEM_ERR`.
    pub fn dispatch(
        &self,
        msg: &[u8],
        peer: Option<SocketAddr>,
        buffers: &Buffers,
    ) -> Option<OutReply> {
        let (h, off) = match decode_call(msg) {
            Ok(c) => c,
            Err(bad) => {
                let (xid, st) = bad.answer()?;
                return Some(reply(xid, st));
            }
        };
        let status = match self.route(&h) {
            Err(st) => st,
            Ok(p) => {
                let args = &msg[off..];
                if self.non_idempotent.contains(&(h.prog, h.vers, h.proc)) {
                    let key =
                        CallKey::new(peer.map(|a| a.ip()), h.xid, (h.prog, h.vers, h.proc), args);
                    return match self.drc.begin(key) {
                        Seen::New => {
                            let out = self.execute(&h, p, args, peer, buffers);
                            self.drc.finish(key, &out);
                            Some(out)
                        }
                        Seen::InProgress => None,
                        Seen::Done(r) => Some(r),
                    };
                }
                return Some(self.execute(&h, p, args, peer, buffers));
            }
        };
        Some(reply(h.xid, status))
    }

    /// Runs the handler of call `h`.
    fn execute(
        &self,
        h: &CallHeader,
        p: &Arc<dyn Program>,
        args: &[u8],
        peer: Option<SocketAddr>,
        buffers: &Buffers,
    ) -> OutReply {
        let ctx = CallContext {
            header: h,
            peer,
            buffers,
        };
        let status = match catch_unwind(AssertUnwindSafe(|| p.call(&ctx, args))) {
            Ok(Ok(r)) if r.check().is_ok() => {
                let mut out = reply(h.xid, ReplyStatus::Success);
                out.body = r;
                return out;
            }
            Ok(Ok(_)) => {
                tracing::error!(xid = h.xid, "RPC handler marked a bad DDP-eligible item");
                ReplyStatus::SystemErr
            }
            Ok(Err(e)) => match e {
                ProcError::ProcUnavail => ReplyStatus::ProcUnavail,
                ProcError::GarbageArgs => ReplyStatus::GarbageArgs,
                ProcError::SystemErr => ReplyStatus::SystemErr,
                ProcError::Auth(s) => ReplyStatus::AuthError(s),
            },
            Err(_) => {
                tracing::error!(
                    xid = h.xid,
                    prog = h.prog,
                    proc = h.proc,
                    "RPC handler panicked"
                );
                ReplyStatus::SystemErr
            }
        };
        reply(h.xid, status)
    }

    /// The handler of a call, or the status that refuses it.
    fn route(&self, h: &CallHeader) -> Result<&Arc<dyn Program>, ReplyStatus> {
        // RFC 5531 §8.2, §10: AUTH_NONE and AUTH_SYS credentials, with AUTH_NONE verifiers
        // (what Linux's svcauth accepts without RPCSEC_GSS).
        match h.cred {
            Auth::None | Auth::Sys(_) => {}
            Auth::Other { .. } => return Err(ReplyStatus::AuthError(AuthStat::BadCred)),
        }
        if h.verf != Auth::None {
            return Err(ReplyStatus::AuthError(AuthStat::BadVerf));
        }
        let versions = self.progs.get(&h.prog).ok_or(ReplyStatus::ProgUnavail)?;
        versions.get(&h.vers).ok_or_else(|| {
            let low = versions.keys().next().copied().unwrap_or(0);
            let high = versions.keys().next_back().copied().unwrap_or(0);
            ReplyStatus::ProgMismatch { low, high }
        })
    }
}

/// The reply header for `st`; the results follow it.
fn reply(xid: u32, st: ReplyStatus) -> OutReply {
    let mut head = Vec::with_capacity(32);
    // AUTH_NONE verifier and a status: always encodable.
    encode_reply(xid, st, &Auth::None, &[], &mut head).expect("AUTH_NONE reply encodes");
    OutReply {
        xid,
        head,
        body: Payload::default(),
    }
}

/// How a [`Server`] runs.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Threads running handlers.
    pub threads: usize,
    /// Calls of one connection being served at once; its next call is not read before one
    /// of them is answered (a client cannot make the server queue without limit).
    pub max_in_flight: usize,
    /// Largest call record accepted over TCP (a larger one ends the connection).
    pub max_record: usize,
    /// Octets of message memory (results, chunks) kept for the next calls rather than
    /// handed back to the allocator ([`Buffers`]).
    pub kept_octets: usize,
    /// Connections served at once, per transport (TCP, RPC-over-RDMA); a new one past it
    /// closes the least recently active. 0: `(threads + 3) × 20`, Linux's svc default
    /// (`sv_maxconn`), which bounds the RDMA connections' threads and memory with the pool.
    pub max_connections: usize,
    /// Connections from one address at once, per transport; past it, that address's least
    /// recently active connection is closed for the new one.
    pub max_connections_per_addr: usize,
    /// A TCP connection with nothing in flight and nothing received for this long is
    /// closed (the client reconnects when it needs to; Linux's svc closes idle transports
    /// after 6 minutes).
    pub idle_timeout: Duration,
    /// A TCP client that takes none of its queued replies for this long is disconnected.
    pub send_timeout: Duration,
    /// Octets of TCP call records being assembled, over every connection; past it the
    /// connection whose unfinished record began first is closed.
    pub max_assembling: usize,
    /// Octets of TCP replies waiting for their clients to read them, over every
    /// connection; a reply that would pass it closes its connection.
    pub max_queued: usize,
    /// RPC-over-RDMA: RDMA Reads of a call's Read chunks unanswered for this long end the
    /// connection, its buffers freed.
    pub read_chunk_timeout: Duration,
}

/// Counters of the RPC-over-RDMA service's limits at work.
#[derive(Debug, Default)]
pub struct RdmaStats {
    /// Connections ended for Read chunks unanswered (`read_chunk_timeout`).
    pub read_timeouts: std::sync::atomic::AtomicUsize,
    /// Connections ended idle (`idle_timeout`).
    pub idle_closed: std::sync::atomic::AtomicUsize,
}

impl ServerConfig {
    /// `max_connections` as it applies (its 0 worked out).
    pub fn connection_limit(&self) -> usize {
        match self.max_connections {
            0 => (self.threads.max(1) + 3) * 20,
            n => n,
        }
    }

    /// The connections (of `conns`: key and address) to close so that one more from `peer`
    /// fits the limits, on either transport: the least recently active of its address when
    /// that address holds `max_connections_per_addr`, then the least recently active of all
    /// when `connection_limit` are served (Linux's svc closes the oldest). `rank` orders
    /// them, the lowest closed first.
    pub(crate) fn closing_for<K: Copy + PartialEq, R: Ord>(
        &self,
        peer: IpAddr,
        conns: &[(K, IpAddr)],
        rank: impl Fn(K) -> R,
    ) -> Vec<K> {
        let mut out = Vec::new();
        let least = |same: bool, out: &[K]| {
            conns
                .iter()
                .filter(|(k, ip)| (!same || *ip == peer) && !out.contains(k))
                .min_by_key(|(k, _)| rank(*k))
                .map(|(k, _)| *k)
        };
        let from_peer = conns.iter().filter(|(_, ip)| *ip == peer).count();
        if from_peer >= self.max_connections_per_addr.max(1) {
            out.extend(least(true, &out));
        }
        if conns.len() - out.len() >= self.connection_limit() {
            out.extend(least(false, &out));
        }
        out
    }
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            threads: 4,
            max_in_flight: 64,
            max_record: DEFAULT_MAX_RECORD,
            kept_octets: 32 << 20,
            max_connections: 0,
            max_connections_per_addr: 64,
            idle_timeout: Duration::from_secs(360),
            send_timeout: Duration::from_secs(30),
            max_assembling: 256 << 20,
            max_queued: 256 << 20,
            read_chunk_timeout: Duration::from_secs(30),
        }
    }
}

/// A pool of handler threads and the registry they dispatch to.
pub struct Server {
    registry: Arc<Registry>,
    buffers: Arc<Buffers>,
    cfg: ServerConfig,
    jobs: Arc<Sched>,
    flows: AtomicU64,
    rdma_stats: RdmaStats,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Starts `cfg.threads` handler threads for `registry`.
    pub fn new(registry: Registry, cfg: ServerConfig) -> Server {
        let threads = cfg.threads.max(1);
        let jobs = Arc::new(Sched::default());
        let workers = (0..threads)
            .map(|i| {
                let jobs = jobs.clone();
                std::thread::Builder::new()
                    .name(format!("rpc-worker-{i}"))
                    .spawn(move || {
                        while let Some(job) = jobs.pop() {
                            job();
                        }
                    })
                    .expect("spawn an RPC worker")
            })
            .collect();
        Server {
            registry: Arc::new(registry),
            buffers: Buffers::new(256, cfg.kept_octets),
            cfg,
            jobs,
            flows: AtomicU64::new(0),
            rdma_stats: RdmaStats::default(),
            workers,
        }
    }

    /// The programs served.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The memory calls are answered in, kept across calls.
    pub fn buffers(&self) -> &Arc<Buffers> {
        &self.buffers
    }

    /// How it runs.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// The RPC-over-RDMA service's counters.
    pub fn rdma_stats(&self) -> &RdmaStats {
        &self.rdma_stats
    }

    /// Runs `job` on the pool, among the jobs of no connection.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        self.spawn_in(u64::MAX, job);
    }

    /// Runs `job` on the pool behind the earlier jobs of `flow` (a connection): the pool
    /// takes one job of each flow with jobs waiting in turn, so no connection's queue of
    /// calls holds up another's.
    pub fn spawn_in(&self, flow: u64, job: impl FnOnce() + Send + 'static) {
        self.jobs.push(flow, Box::new(job));
    }

    /// A number for [`Server::spawn_in`] no other caller has.
    pub fn new_flow(&self) -> u64 {
        // Above every TCP connection id, below `spawn`'s own.
        (1 << 62) + self.flows.fetch_add(1, Ordering::Relaxed)
    }

    /// Serves calls over UDP on `socket` (RFC 5531 §11: one call per datagram, no record
    /// marking), answered in the receiving thread — for small services such as portmap,
    /// which clients ask over UDP first.
    pub fn serve_udp(self: &Arc<Self>, socket: UdpSocket) -> io::Result<UdpServer> {
        let addr = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        // Wakes now and then to see `stop`.
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let (server, stop2) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("rpc-udp".into())
            .spawn(move || {
                // The largest datagram UDP carries.
                let mut buf = vec![0u8; 65_536];
                while !stop2.load(Ordering::Acquire) {
                    let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    let Some(r) = server
                        .registry
                        .dispatch(&buf[..n], Some(peer), &server.buffers)
                    else {
                        continue;
                    };
                    // A reply larger than a datagram is not sent (the caller times out).
                    let _ = socket.send_to(&r.to_vec(), peer);
                }
            })?;
        Ok(UdpServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.jobs.close();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A running UDP service; stopped when dropped.
pub struct UdpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpServer {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
