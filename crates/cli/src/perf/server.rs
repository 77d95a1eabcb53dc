//! The server of `softrdma perf`'s RDMA tests, written once over the verbs surface (see
//! [`super::client`] for the tests). The listening thread takes connection requests: a
//! test's request gets a thread that accepts it and serves the test until the client's
//! `End` (or until its QP dies); `End` stops that thread and is rejected with its report;
//! `Bye` ends a session. A `Reverse` request (`-b`) gets a thread that measures toward the
//! client as a client would; a scale session (`-q`) is one region and its QPs, accepted on
//! the listening thread (nothing completes at the server: the Writes and Reads are the
//! responder's).
//!
//! Against hostile clients: test ids are random and an `End` from an address other than the
//! test's is answered as for an unknown test; a test or session whose client sends nothing
//! for [`ServerOpts::idle_timeout`] is ended; all tests together take at most
//! [`ServerOpts::mem_budget`] octets, a request past it refused with a [`Refusal`].

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use softrdma::iwarp::FpduSize;
use softrdma::{
    AsyncEvent, BusyPoll, ConnRequest, Context, Cq, Error, Key, Listener, Mr, Qp, QpCap,
    QpInitAttr, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::client::{Client, ClientOpts, INLINE_MAX, REMOTE, check, unsignaled, verify};
use super::proto::{
    CLIENT_SEED, EndReport, Measure, Refusal, RemoteBuf, Reply, Request, Reverse, SERVER_SEED,
    Test, fill,
};
use super::scale::ScaleSession;
use super::stats::Bw;
use super::{PerfError, baseline};
use crate::verbs_util::{WaitMode, spin_until, wait_some};

/// How often a test thread looks whether its test was ended.
const POLL: Duration = Duration::from_millis(50);
/// How long an ended Send test waits for receives the client counted and it did not see yet.
const DRAIN: Duration = Duration::from_secs(2);
/// Test threads kept for their `End` before finished ones are forgotten.
const KEEP: usize = 64;
/// Tests one client address may run at once (a perf client runs one at a time, two with -b;
/// perftest-style parallel runs or several clients behind one address stay well below it).
const PER_PEER: usize = 16;
/// How long a `Reverse` measurement may wait to connect to the client.
const REVERSE_CONNECT: Duration = Duration::from_secs(10);

/// What the server does.
#[derive(Clone, Copy, Debug)]
pub struct ServerOpts {
    /// iWARP: FPDU size policy.
    pub fpdu: FpduSize,
    /// RoCE: the largest path MTU accepted.
    pub pmtu: u32,
    /// Print a line per test.
    pub log: bool,
    /// Blocking or busy-polling waits.
    pub wait: WaitMode,
    /// How blocking waits poll before they sleep.
    pub busy_poll: BusyPoll,
    /// The largest buffer a client may ask for, octets (each test registers its size twice,
    /// Send bandwidth once per receive credit at most `rx_depth` × size worth of posts).
    pub max_buffer: u64,
    /// The memory all tests together may take, octets (a test takes its buffers' worth:
    /// twice its size, a scale session its slots); a request past it is refused until
    /// others end.
    pub mem_budget: u64,
    /// A test or scale session whose client sends nothing for this long is ended and its
    /// slot and memory reclaimed (its `End` then gets the reason).
    pub idle_timeout: Duration,
}

/// Default of [`ServerOpts::mem_budget`]: one test of the largest size (1 GiB, twice), or
/// many smaller ones.
pub const MEM_BUDGET: u64 = 2 << 30;
/// Default of [`ServerOpts::idle_timeout`]: a running client's traffic never pauses this
/// long (its own waits give up after 30 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the listening thread tells a test thread its test is over.
#[derive(Default)]
struct Ctl {
    ended: AtomicBool,
    /// Messages the client sent.
    sent: AtomicU64,
}

/// Tests by id, running or finished and waiting for their `End`: their control, their
/// thread, the client's address.
type Tests<'s> = HashMap<u64, (Arc<Ctl>, ScopedJoinHandle<'s, EndReport>, IpAddr)>;

/// How long a finished test keeps its report for the client's `End`.
const FORGET: Duration = Duration::from_secs(60);

/// Forgets the tests whose client left without its `End`: finished more than [`FORGET`]
/// ago, or the oldest finished beyond [`KEEP`]. A finished test is not forgotten at once: a
/// `-b` measurement toward the client often finishes before the client's own test does,
/// and the client's next request then came before that `End` (which got "no test N to
/// end"). `done` holds when each test was first seen finished.
fn forget_finished(tests: &mut Tests<'_>, done: &mut HashMap<u64, Instant>, now: Instant) {
    for (id, (_, h, _)) in tests.iter() {
        if h.is_finished() {
            done.entry(*id).or_insert(now);
        }
    }
    done.retain(|id, t| tests.contains_key(id) && now.saturating_duration_since(*t) < FORGET);
    if done.len() > KEEP {
        let mut by_age: Vec<(Instant, u64)> = done.iter().map(|(id, t)| (*t, *id)).collect();
        by_age.sort_unstable();
        for (_, id) in &by_age[..done.len() - KEEP] {
            done.remove(id);
        }
    }
    tests.retain(|id, (_, h, _)| !h.is_finished() || done.contains_key(id));
}

/// Scale sessions by id: the session, the client's address and the session's memory.
type Sessions<'b> = HashMap<u64, (ScaleSession, IpAddr, Lease<'b>)>;

/// Answers kept for requests a lossy network may bring again.
const ANSWERED: usize = 64;

/// The last answers to `End` and `Reverse` requests, by client address and request: a
/// connection request whose rejection was lost is sent again and handed up anew by the
/// connection manager (as Linux's does once it rejected), and must get the same answer
/// rather than a second effect ("no test to end", a second measurement).
#[derive(Default)]
struct Answered(std::sync::Mutex<std::collections::VecDeque<AnsweredRequest>>);

/// The client's address, its request's private data, and the answer's.
type AnsweredRequest = (IpAddr, Vec<u8>, Vec<u8>);

impl Answered {
    fn get(&self, peer: IpAddr, request: &[u8]) -> Option<Vec<u8>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(p, r, _)| *p == peer && r == request)
            .map(|(_, _, a)| a.clone())
    }

    /// Keeps `answer` to `request` (before it is sent, so a repeat finds it).
    fn put(&self, peer: IpAddr, request: &[u8], answer: &[u8]) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= ANSWERED {
            q.pop_front();
        }
        q.push_back((peer, request.to_vec(), answer.to_vec()));
    }
}

/// Ends every running test.
fn stop_all(tests: &mut Tests<'_>) {
    for (_, (ctl, h, _)) in tests.drain() {
        ctl.ended.store(true, Ordering::Release);
        h.thread().unpark();
        let _ = h.join();
    }
}

/// Octets of test memory the server holds at once, against [`ServerOpts::mem_budget`]:
/// each test takes its share before anything is allocated and gives it back when it ends.
struct Budget {
    limit: u64,
    used: AtomicU64,
}

/// A test's share of the [`Budget`], given back when dropped.
struct Lease<'b> {
    budget: &'b Budget,
    octets: u64,
}

impl Budget {
    fn new(limit: u64) -> Budget {
        Budget {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// `octets` of the budget, or why not.
    fn take(&self, octets: u64) -> Result<Lease<'_>, Refusal> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(octets).filter(|&u| u <= self.limit)
            })
            .map(|_| Lease {
                budget: self,
                octets,
            })
            .map_err(|used| Refusal::OverBudget {
                asked: octets,
                used,
                budget: self.limit,
            })
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.octets, Ordering::AcqRel);
    }
}

/// Octets the server allocates for `r`: a test's buffer and its source (twice the size),
/// a scale session's N slots, a reverse measurement's buffer.
fn charge(r: &Request) -> u64 {
    let n = u64::from(r.size.max(1));
    match r.test {
        Test::Bye | Test::End => 0,
        Test::ScaleQp if r.id == 0 => n.saturating_mul(r.count),
        Test::ScaleQp => 0,
        Test::Reverse => n,
        _ => n + n.max(8),
    }
}

/// A test id no running test or session has: random, so that a client cannot name
/// another's test; never 0 (a scale request's "open a session").
fn fresh_id(in_use: impl Fn(u64) -> bool) -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 && !in_use(id) {
            return id;
        }
    }
}

/// Ends the scale sessions that saw no traffic for `idle`; each keeps its report (with the
/// reason) for its client's `End` as a finished test does.
fn reclaim_idle_sessions<'s>(
    s: &'s Scope<'s, '_>,
    sessions: &mut Sessions<'_>,
    tests: &mut Tests<'s>,
    idle: Duration,
    now: Instant,
    log: bool,
) {
    let stale: Vec<u64> = sessions
        .iter_mut()
        .filter_map(|(id, (x, _, _))| (x.idle_for(now) >= idle).then_some(*id))
        .collect();
    for id in stale {
        let Some((session, ip, lease)) = sessions.remove(&id) else {
            continue;
        };
        let mut report = session.end();
        drop(lease);
        if log {
            eprintln!("softrdma perf: {ip}: scale session idle for {idle:?}: reclaimed");
        }
        report.error = Some(PerfError::Idle(idle).to_string());
        tests.insert(id, (Arc::default(), s.spawn(move || report), ip));
    }
}

/// Serves tests from `listener` until a client's `Bye` (with `once`), until `quit` is set,
/// or forever.
pub fn serve(
    ctx: &Context,
    listener: &Listener,
    o: ServerOpts,
    once: bool,
    quit: Option<&AtomicBool>,
) -> Result<(), PerfError> {
    let answered = &Answered::default();
    let budget = &Budget::new(o.mem_budget);
    std::thread::scope(|s| {
        let mut tests: Tests = HashMap::new();
        let mut done: HashMap<u64, Instant> = HashMap::new();
        let mut sessions: Sessions = HashMap::new();
        // --once: the addresses given a test; only their Bye ends the server.
        let mut clients: HashSet<IpAddr> = HashSet::new();
        loop {
            // The context's async events (every connection's Established and Disconnected)
            // are read here, or a long-running server would hold the last 4,096 of them.
            while let Some(ev) = ctx.poll_async_event() {
                if o.log && matches!(ev, AsyncEvent::Qp { .. } | AsyncEvent::CqError { .. }) {
                    eprintln!("softrdma perf: {ev:?}");
                }
            }
            reclaim_idle_sessions(
                s,
                &mut sessions,
                &mut tests,
                o.idle_timeout,
                Instant::now(),
                o.log,
            );
            let req = match listener.accept_timeout(Duration::from_millis(200)) {
                Ok(r) => r,
                Err(Error::Timeout) if !quit.is_some_and(|q| q.load(Ordering::Acquire)) => {
                    continue;
                }
                Err(Error::Timeout) => {
                    stop_all(&mut tests);
                    return Ok(());
                }
                Err(e) => {
                    stop_all(&mut tests);
                    return Err(e.into());
                }
            };
            let peer = req.peer_addr();
            if let Some(a) = answered.get(peer.ip(), req.private_data()) {
                let _ = req.reject(&a);
                continue;
            }
            let Some(r) = Request::parse(req.private_data()) else {
                eprintln!("softrdma perf: {peer}: not a softrdma perf request, rejected");
                let _ = req.reject(b"softrdma perf: unknown request");
                continue;
            };
            // A client says how much memory its test takes: never more than the cap (a
            // scale session: its N slots together).
            let asked = match r.test {
                Test::Bye | Test::End => 0,
                Test::ScaleQp if r.id == 0 => u64::from(r.size.max(1)).saturating_mul(r.count),
                _ => u64::from(r.size),
            };
            if asked > o.max_buffer {
                let why = Refusal::TooLarge {
                    asked,
                    cap: o.max_buffer,
                };
                eprintln!("softrdma perf: {peer}: {why}: rejected");
                let _ = req.reject(&why.emit());
                continue;
            }
            match r.test {
                Test::Bye => {
                    // Another address's Bye does not end this client's session.
                    if once && !clients.is_empty() && !clients.contains(&peer.ip()) {
                        eprintln!(
                            "softrdma perf: {peer}: Bye from an address with no test: ignored"
                        );
                        let _ = req.reject(b"softrdma perf: no session of this address");
                        continue;
                    }
                    let _ = req.reject(b"bye");
                    if o.log {
                        eprintln!("softrdma perf: {peer}: session done");
                    }
                    if once {
                        stop_all(&mut tests);
                        return Ok(());
                    }
                }
                Test::End => {
                    // Only the address that opened a test ends it (and reads its report);
                    // to any other the test does not exist.
                    let owner = |ip: IpAddr| ip == peer.ip();
                    if sessions.get(&r.id).is_some_and(|x| owner(x.1))
                        && let Some((session, _, lease)) = sessions.remove(&r.id)
                    {
                        let report = session.end().emit();
                        drop(lease);
                        answered.put(peer.ip(), req.private_data(), &report);
                        let _ = req.reject(&report);
                        continue;
                    }
                    let mine = tests.get(&r.id).is_some_and(|t| owner(t.2));
                    match mine.then(|| tests.remove(&r.id)).flatten() {
                        Some((ctl, h, _)) => {
                            ctl.sent.store(r.count, Ordering::Release);
                            ctl.ended.store(true, Ordering::Release);
                            h.thread().unpark();
                            // A reverse measurement runs to its own end: its answer waits
                            // for it on a thread of its own, not on the listening one.
                            s.spawn(move || {
                                let report = h.join().unwrap_or_else(|_| EndReport {
                                    error: Some("the server's test thread panicked".into()),
                                    ..EndReport::default()
                                });
                                let report = report.emit();
                                answered.put(peer.ip(), req.private_data(), &report);
                                let _ = req.reject(&report);
                            });
                        }
                        None => {
                            if o.log && (tests.contains_key(&r.id) || sessions.contains_key(&r.id))
                            {
                                eprintln!(
                                    "softrdma perf: {peer}: End of another address's test: refused"
                                );
                            }
                            let report = EndReport {
                                error: Some(format!("no test {} to end", r.id)),
                                ..EndReport::default()
                            };
                            let _ = req.reject(&report.emit());
                        }
                    }
                }
                Test::ScaleQp if r.id != 0 => {
                    let answer = match sessions.get_mut(&r.id) {
                        Some((session, ip, _)) if *ip == peer.ip() => session.accept(req),
                        _ => req
                            .reject(format!("softrdma perf: no scale session {}", r.id).as_bytes())
                            .map_err(PerfError::from),
                    };
                    if let Err(e) = answer {
                        eprintln!("softrdma perf: {peer}: scale session {}: {e}", r.id);
                    }
                }
                test => {
                    if o.log {
                        eprintln!("softrdma perf: {peer}: {test} {} octets", r.size);
                    }
                    forget_finished(&mut tests, &mut done, Instant::now());
                    sessions.retain(|_, (session, _, _)| !session.is_dead());
                    // One client (address) holds at most PER_PEER tests at once and all
                    // together at most KEEP: a peer that connects and idles cannot take the
                    // server from the others (and an idle test is reclaimed).
                    // Finished tests waiting for their End hold no more than a report.
                    let running = || tests.values().filter(|t| !t.1.is_finished());
                    let mine = running().filter(|t| t.2 == peer.ip()).count()
                        + sessions.values().filter(|t| t.1 == peer.ip()).count();
                    let all = running().count() + sessions.len();
                    if mine >= PER_PEER || all >= KEEP {
                        let why = Refusal::Busy {
                            mine: mine as u64,
                            all: all as u64,
                        };
                        eprintln!(
                            "softrdma perf: {peer}: {why} (at most {PER_PEER} per client and {KEEP} in all)"
                        );
                        let _ = req.reject(&why.emit());
                        continue;
                    }
                    // The test's memory, from the budget of all tests, before any is taken.
                    let lease = match budget.take(charge(&r)) {
                        Ok(l) => l,
                        Err(why) => {
                            eprintln!("softrdma perf: {peer}: {why}");
                            let _ = req.reject(&why.emit());
                            continue;
                        }
                    };
                    let id = fresh_id(|id| tests.contains_key(&id) || sessions.contains_key(&id));
                    if once && clients.len() < KEEP {
                        clients.insert(peer.ip());
                    }
                    if test == Test::ScaleQp {
                        match ScaleSession::open(ctx, id, r, (o.pmtu, o.fpdu), req) {
                            Ok(session) => {
                                sessions.insert(id, (session, peer.ip(), lease));
                            }
                            Err(e) => eprintln!("softrdma perf: {peer}: scale session: {e}"),
                        }
                        continue;
                    }
                    if test == Test::Reverse {
                        let Some(rev) = Reverse::parse(req.private_data()) else {
                            let _ = req.reject(b"softrdma perf: not a valid -b request");
                            continue;
                        };
                        // Started: the client runs its own side now and ends ours later.
                        let started = Reply {
                            id,
                            buf: RemoteBuf::default(),
                        }
                        .emit();
                        answered.put(peer.ip(), req.private_data(), &started);
                        let _ = req.reject(&started);
                        let ctl = Arc::new(Ctl::default());
                        let h = s.spawn(move || {
                            let _lease = lease;
                            let mut report = EndReport::default();
                            match reverse(ctx, peer.ip(), rev, o) {
                                Ok(bw) => report.bw = bw,
                                Err(e) => {
                                    if o.log {
                                        eprintln!("softrdma perf: {peer}: -b toward it: {e}");
                                    }
                                    report.error = Some(e.to_string());
                                }
                            }
                            report
                        });
                        tests.insert(id, (ctl, h, peer.ip()));
                        continue;
                    }
                    let ctl = Arc::new(Ctl::default());
                    let c = ctl.clone();
                    let h = s.spawn(move || {
                        let mut report = EndReport::default();
                        if let Err(e) = serve_test(ctx, req, r, id, o, &c, &mut report) {
                            if o.log {
                                eprintln!("softrdma perf: {peer}: {test}: {e}");
                            }
                            report.error = Some(e.to_string());
                        }
                        // The memory is free again once the test's buffers are gone.
                        drop(lease);
                        report
                    });
                    tests.insert(id, (ctl, h, peer.ip()));
                }
            }
        }
    })
}

/// `-b`: measures `r` toward the client at `peer`, as a client of its servers.
fn reverse(
    ctx: &Context,
    peer: IpAddr,
    r: Reverse,
    o: ServerOpts,
) -> Result<Option<Bw>, PerfError> {
    match r.what {
        Measure::Rdma(test) => {
            let opts = ClientOpts {
                crc: false,
                fpdu: o.fpdu,
                pmtu: o.pmtu,
                tx_depth: r.tx_depth.clamp(1, 16383),
                rx_depth: r.rx_depth.clamp(4, 1 << 16),
                wait: o.wait,
                busy_poll: o.busy_poll,
                connect_timeout: REVERSE_CONNECT,
            };
            let mut c = Client::new(ctx.clone(), SocketAddr::new(peer, r.rdma_port), opts);
            c.bw(test, r.size, r.limit).map(Some)
        }
        Measure::Raw | Measure::RawGso => {
            let base = baseline(ctx, SocketAddr::new(peer, r.raw_port), o.pmtu);
            match r.what {
                Measure::Raw => base.bw(r.size, r.limit).map(Some),
                _ => base.bw_gso(r.size, r.limit),
            }
        }
    }
}

/// The server's end of one test.
struct Served<'a> {
    qp: Qp,
    cq: Cq,
    /// What the client writes, reads or sends into.
    buf: Mr,
    /// What this side writes back (Write latency) or sends credits from.
    src: Mr,
    size: u32,
    wait: WaitMode,
    ctl: &'a Ctl,
    /// How long the client may send nothing.
    idle: Duration,
    /// Units the QP had received at the last look, and since when.
    seen: Cell<(u64, Instant)>,
}

fn serve_test(
    ctx: &Context,
    req: ConnRequest,
    r: Request,
    id: u64,
    o: ServerOpts,
    ctl: &Ctl,
    report: &mut EndReport,
) -> Result<(), PerfError> {
    let size = r.size.max(1);
    let n = size as usize;
    let pd = ctx.alloc_pd();
    let rx_depth = match r.test {
        Test::SendBw => r.rx_depth.clamp(1, 1 << 16),
        Test::SendLat => 4,
        _ => 1,
    };
    let cq = ctx.create_cq(rx_depth as usize + 256, None)?;
    cq.set_busy_poll(o.busy_poll);
    let qp = pd.create_qp(QpInitAttr {
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        },
        ..QpInitAttr::new(&cq, &cq)
    })?;
    let buf = pd.alloc_mr(n, REMOTE)?;
    let src = pd.alloc_mr(n.max(8), REMOTE)?;
    fill(&mut buf.write()[..n], SERVER_SEED);
    fill(&mut src.write()[..n], SERVER_SEED);
    if matches!(r.test, Test::SendBw | Test::SendLat) {
        for i in 0..rx_depth {
            qp.post_recv(RecvWr::new(u64::from(i), vec![buf.sge(0, size)]))?;
        }
    }
    let reply = Reply {
        id,
        buf: RemoteBuf::of(&buf, size),
    };
    reply.accept(req, &qp, (16, 16), (o.pmtu, o.fpdu))?;
    let t = Served {
        qp,
        cq,
        buf,
        src,
        size,
        wait: o.wait,
        ctl,
        idle: o.idle_timeout,
        seen: Cell::new((0, Instant::now())),
    };
    match r.test {
        Test::SendBw => t.recvs(rx_depth, false, report)?,
        Test::SendLat => t.recvs(rx_depth, true, report)?,
        Test::WriteLat => t.write_lat(r.buf)?,
        _ => t.idle()?,
    }
    // Every octet the client sent or wrote is what it holds (Write latency: but the last,
    // the iteration's tag).
    match r.test {
        Test::WriteBw | Test::SendBw | Test::SendLat => {
            verify(&t.buf, n, CLIENT_SEED, "received data")
        }
        Test::WriteLat => verify(&t.buf, n - 1, CLIENT_SEED, "received data"),
        _ => Ok(()),
    }
}

impl Served<'_> {
    fn ended(&self) -> bool {
        self.ctl.ended.load(Ordering::Acquire) || self.qp.state().is_dead()
    }

    /// An error once the client sent nothing (not a packet, not a ULPDU) for the idle
    /// timeout: the test is given up and its slot and memory are free for others. Called
    /// when a wait found nothing.
    fn progressing(&self) -> Result<(), PerfError> {
        let now = Instant::now();
        let units = self.qp.counters().rx_units;
        let (last, since) = self.seen.get();
        if units != last {
            self.seen.set((units, now));
            Ok(())
        } else if now.saturating_duration_since(since) >= self.idle {
            Err(PerfError::Idle(self.idle))
        } else {
            Ok(())
        }
    }

    /// Waits for completions until the test is ended (`None` then) or idle too long.
    fn next_wcs(&self, wcs: &mut Vec<WorkCompletion>) -> Result<Option<()>, PerfError> {
        loop {
            if self.ended() {
                return Ok(None);
            }
            wcs.clear();
            if wait_some(&self.cq, self.wait, 128, POLL, wcs).is_ok() {
                return Ok(Some(()));
            }
            self.progressing()?;
        }
    }

    /// Write and Read: the work is the responder's, and nothing completes here; like
    /// perftest's server, this thread sleeps outside the library, which leaves the context's
    /// progress thread to run the transport (one wake-up per arrival, whatever the wait
    /// mode: a spinning server would take a core from the client's side).
    fn idle(&self) -> Result<(), PerfError> {
        while !self.ended() {
            std::thread::park_timeout(POLL);
            self.progressing()?;
        }
        let mut wcs = Vec::with_capacity(16);
        self.cq.poll(16, &mut wcs);
        wcs.iter().try_for_each(check)
    }

    /// Send bandwidth (`echo` false): posts every receive again and returns a credit (the
    /// running count, INLINE) for every quarter of the window; Send latency (`echo`):
    /// echoes each message from its receive buffer (the next ping cannot arrive before
    /// the client has the pong). Counts what arrived, up to what the client says it sent.
    fn recvs(&self, rx_depth: u32, echo: bool, report: &mut EndReport) -> Result<(), PerfError> {
        let batch = u64::from((rx_depth / 4).max(1));
        let mut wcs = Vec::with_capacity(128);
        while self.next_wcs(&mut wcs)?.is_some() {
            self.on_recvs(&wcs, echo, batch, report)?;
        }
        // Ended: completions of what the client sent may still be on their way to the CQ.
        let until = Instant::now() + DRAIN;
        while report.recvs < self.ctl.sent.load(Ordering::Acquire)
            && !self.qp.state().is_dead()
            && Instant::now() < until
        {
            wcs.clear();
            if wait_some(&self.cq, self.wait, 128, POLL, &mut wcs).is_ok() {
                self.on_recvs(&wcs, echo, batch, report)?;
            }
        }
        Ok(())
    }

    fn on_recvs(
        &self,
        wcs: &[WorkCompletion],
        echo: bool,
        batch: u64,
        report: &mut EndReport,
    ) -> Result<(), PerfError> {
        for wc in wcs {
            if wc.status == WcStatus::WorkRequestFlushed {
                continue;
            }
            check(wc)?;
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            if wc.byte_len != self.size {
                return Err(PerfError::Protocol(format!(
                    "a Send of {} octets, not {}",
                    wc.byte_len, self.size
                )));
            }
            report.recvs += 1;
            report.recv_bytes += u64::from(wc.byte_len);
            if echo {
                self.qp.post_send(
                    SendWr::send(wc.wr_id, vec![self.buf.sge(0, wc.byte_len)])
                        .with_flags(unsignaled(self.size)),
                )?;
            }
            self.qp
                .post_recv(RecvWr::new(wc.wr_id, vec![self.buf.sge(0, self.size)]))?;
            if !echo && report.recvs.is_multiple_of(batch) {
                // INLINE: the count is copied now, so `src` may change at once.
                self.src.copy_in(0, &report.recvs.to_le_bytes())?;
                self.qp.post_send(
                    SendWr::send(report.recvs, vec![self.src.sge(0, 8)]).with_flags(unsignaled(8)),
                )?;
            }
        }
        Ok(())
    }

    /// Write latency: waits for the client's Write (its last octet), writes back.
    fn write_lat(&self, client: RemoteBuf) -> Result<(), PerfError> {
        let n = self.size as usize;
        if client.len < self.size {
            return Err(PerfError::Protocol(
                "the client's buffer is too small".into(),
            ));
        }
        let flags = unsignaled(self.size);
        let mut wcs = Vec::with_capacity(16);
        let mut i = 0u64;
        loop {
            let tag = (i % 255) as u8 + 1;
            let mut b = [0u8; 1];
            // No deadline while the test lasts: the client decides how long it runs.
            while !(self.buf.copy_out(n - 1, &mut b).is_ok() && b[0] == tag) {
                if self.ended() {
                    return Ok(());
                }
                // Polling the CQ runs the transport in this thread (the Writes are
                // unsignaled: only errors complete here, but each Write lands without a
                // hand-off).
                wcs.clear();
                spin_until(POLL, || {
                    self.cq.poll(16, &mut wcs);
                    self.buf.copy_out(n - 1, &mut b).is_ok() && b[0] == tag || self.ended()
                });
                wcs.iter().try_for_each(check)?;
                self.progressing()?;
            }
            self.src.copy_in(n - 1, &[tag])?;
            self.qp.post_send(
                SendWr::write(
                    i,
                    vec![self.src.sge(0, self.size)],
                    Key(client.rkey),
                    client.addr,
                )
                .with_flags(flags),
            )?;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::Scope;

    /// A test thread that has finished.
    fn finished<'s>(s: &'s Scope<'s, '_>) -> ScopedJoinHandle<'s, EndReport> {
        let h = s.spawn(EndReport::default);
        while !h.is_finished() {
            std::thread::yield_now();
        }
        h
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// A finished test keeps its report for its `End` for [`FORGET`], while new tests
    /// arrive; after that it is forgotten. A running test is never forgotten.
    #[test]
    fn a_finished_test_waits_for_its_end() {
        std::thread::scope(|s| {
            let mut tests: Tests = HashMap::new();
            let mut done = HashMap::new();
            let stop = Arc::new(AtomicBool::new(false));
            let st = stop.clone();
            let running = s.spawn(move || {
                while !st.load(Ordering::Acquire) {
                    std::thread::park();
                }
                EndReport::default()
            });
            tests.insert(1, (Arc::default(), finished(s), IP));
            tests.insert(2, (Arc::default(), running, IP));
            let t0 = Instant::now();
            forget_finished(&mut tests, &mut done, t0);
            assert!(tests.contains_key(&1) && tests.contains_key(&2));
            forget_finished(&mut tests, &mut done, t0 + FORGET / 2);
            assert!(tests.contains_key(&1), "forgotten before FORGET");
            forget_finished(&mut tests, &mut done, t0 + FORGET);
            assert!(!tests.contains_key(&1), "kept past FORGET");
            assert!(tests.contains_key(&2), "a running test was forgotten");
            assert!(done.is_empty());
            stop.store(true, Ordering::Release);
            let (_, h, _) = tests.remove(&2).unwrap();
            h.thread().unpark();
            assert!(h.join().is_ok());
        });
    }

    /// The budget is shared by every test: what one holds another cannot take, a request
    /// past it is refused with the figures, and a lease dropped (its test over) gives its
    /// octets back.
    #[test]
    fn the_memory_budget_is_shared_and_given_back() {
        let b = Budget::new(8 << 20);
        let big = Request {
            size: 3 << 20,
            ..Request::new(Test::WriteBw)
        };
        assert_eq!(charge(&big), 6 << 20);
        let first = b.take(charge(&big)).unwrap();
        assert_eq!(
            b.take(charge(&big)).err(),
            Some(Refusal::OverBudget {
                asked: 6 << 20,
                used: 6 << 20,
                budget: 8 << 20
            })
        );
        let small = b.take(charge(&Request::new(Test::ReadBw))).unwrap();
        drop(first);
        let again = b.take(charge(&big)).unwrap();
        drop((small, again));
        assert_eq!(b.used.load(Ordering::Acquire), 0);
        // A scale session's slots, however many it claims: no overflow, refused.
        let scale = Request {
            size: u32::MAX,
            count: u64::MAX,
            ..Request::new(Test::ScaleQp)
        };
        assert_eq!(charge(&scale), u64::MAX);
        assert!(b.take(charge(&scale)).is_err());
        assert_eq!(b.used.load(Ordering::Acquire), 0);
    }

    /// At most KEEP finished tests wait for their End: the oldest go first.
    #[test]
    fn finished_tests_beyond_keep_are_forgotten_oldest_first() {
        std::thread::scope(|s| {
            let mut tests: Tests = HashMap::new();
            let mut done = HashMap::new();
            let t0 = Instant::now();
            for id in 0..(KEEP as u64 + 3) {
                tests.insert(id, (Arc::default(), finished(s), IP));
                forget_finished(&mut tests, &mut done, t0 + Duration::from_millis(id));
            }
            assert_eq!(tests.len(), KEEP);
            assert!((0..3).all(|id| !tests.contains_key(&id)));
            assert!((3..KEEP as u64 + 3).all(|id| tests.contains_key(&id)));
        });
    }
}
