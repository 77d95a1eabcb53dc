//! The RPC client: blocking calls and many calls in flight on one connection.
//!
//! [`Client::start`] sends a call and returns a [`Pending`] to wait on; [`Client::call`] is
//! `start` then `wait`. Replies are matched to calls by xid (RFC 5531 §9: the xid is the
//! only link). At most `max_in_flight` calls are outstanding: `start` blocks for a free
//! slot, as the Linux client's slot table does.
//!
//! Who reads the connection: a thread waiting for its reply does (leader/follower, as the
//! verbs layer's caller-driven progress, docs/progress.md). One waiter at a time holds the
//! *receive role*: it reads the replies, hands the others' to them and leaves with its own;
//! the next waiter takes the role over. So a reply wakes the thread that waits for it
//! directly, with no thread in between. A receiving thread per connection takes the role
//! only when no caller has wanted it for [`GRACE`] (replies to abandoned calls, credits for
//! senders, a connection nobody waits on), and replaces a lost connection.

// Keys are our own (xids, program numbers): no hashing hostile input.
use rustc_hash::FxHashMap as HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, select};
use parking_lot::{Condvar, Mutex};

use crate::buffers::Bulk;
use crate::msg::{Auth, CallHeader, ReplyHeader, ReplyStatus, decode_reply, encode_call};
use crate::payload::Payload;

/// Why a call did not return results.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The transport failed.
    #[error("RPC transport: {0}")]
    Io(#[from] io::Error),
    /// The connection ended with the call in flight.
    #[error("the RPC connection ended with the call in flight")]
    Disconnected,
    /// No reply within the time asked.
    #[error("no RPC reply in time")]
    Timeout,
    /// The server answered, but not with results.
    #[error("the RPC server answered {0:?}")]
    Status(ReplyStatus),
    /// A reply that does not decode.
    #[error("undecodable RPC reply: {0}")]
    BadReply(softrdma_wire::Error),
    /// The call cannot be encoded (an over-long credential, a DDP-eligible range that is
    /// not an XDR item).
    #[error("RPC call not encodable: {0}")]
    Encode(String),
    /// The transport refused the call for good (RPC-over-RDMA `RDMA_ERROR`, RFC 8166 §4.5).
    #[error("the RPC transport refused the call: {0}")]
    Transport(String),
}

/// A reply with results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The reply's header (status `Success`).
    pub header: ReplyHeader,
    /// The procedure's results (XDR). When `bulk` is `Some`, the data of the DDP-eligible
    /// result was taken out of this stream (its length word stays, RFC 8166 §3.4.4).
    pub results: Vec<u8>,
    /// The DDP-eligible result's data, when it came apart (an RPC-over-RDMA Write chunk).
    pub bulk: Option<Bulk>,
    /// Where `bulk` belongs in `results` (after its length word), when the program's
    /// result binding ([`Client::bind_results`]) says.
    pub bulk_at: Option<usize>,
}

impl Reply {
    /// The results as the server's procedure made them: `bulk` and its XDR padding put
    /// back at `bulk_at` (RFC 8166 §3.4.6.1, the Requester's reassembly); `results` itself
    /// when nothing came apart. `None` if `bulk` came without a place to go.
    pub fn unreduced(&self) -> Option<Vec<u8>> {
        match (&self.bulk, self.bulk_at) {
            (None, _) => Some(self.results.clone()),
            (Some(b), Some(at)) if at <= self.results.len() => {
                crate::payload::splice(&self.results, &[(at as u32, b)], usize::MAX).ok()
            }
            _ => None,
        }
    }
}

/// An Upper-Layer Binding's rule for results (RFC 8166 §6): given a procedure and its
/// results as they arrived (reduced), the offset where the data of its DDP-eligible result
/// belongs (right after the item's length word), or `None` when this reply has none (e.g.
/// an error status).
pub type ResultBinding = Arc<dyn Fn(u32, &[u8]) -> Option<usize> + Send + Sync>;

/// Room a call's reply may need (the Upper-Layer Binding's maximum reply size,
/// RFC 8166 §6, RPCRDMA-76): transports that place replies in advance size for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplySpace {
    /// Largest reply message (RPC header and results).
    pub max: usize,
    /// Largest DDP-eligible result data, if the procedure has one (RPCRDMA-48).
    pub ddp: Option<usize>,
}

impl Default for ReplySpace {
    fn default() -> ReplySpace {
        ReplySpace {
            max: 64 * 1024,
            ddp: None,
        }
    }
}

/// A call message on its way out.
#[derive(Debug, Clone)]
pub struct OutCall {
    /// The RPC call message (header and arguments), unreduced.
    pub msg: Vec<u8>,
    /// The DDP-eligible arguments' data, ranges of `msg` in order.
    pub ddp: Vec<std::ops::Range<usize>>,
    /// What the reply may need.
    pub reply: ReplySpace,
}

/// A message from the server.
#[derive(Debug)]
pub enum Incoming {
    /// An RPC reply message (`bulk`: see [`Reply::bulk`]).
    Reply {
        /// The RPC reply message.
        msg: Vec<u8>,
        /// The DDP-eligible result's data, delivered apart.
        bulk: Option<Bulk>,
    },
    /// The transport refused call `xid` for good.
    Refused {
        /// The call.
        xid: u32,
        /// Why.
        why: String,
    },
}

/// Moves RPC messages for a [`Client`]: record marking over TCP, RPC-over-RDMA.
pub trait ClientTransport: Send + Sync + 'static {
    /// Sends one call (blocking while the transport has no room, e.g. no credit).
    fn send(&self, call: &OutCall) -> io::Result<()>;
    /// Blocks for the next message from the server; `Ok(None)` at a clean end.
    fn recv(&self) -> io::Result<Option<Incoming>>;
    /// As [`ClientTransport::recv`], for at most about `timeout`: an error of kind
    /// [`io::ErrorKind::TimedOut`] when nothing came (the connection is not the worse for
    /// it).
    fn recv_timeout(&self, timeout: Duration) -> io::Result<Option<Incoming>>;
    /// Whether [`ClientTransport::send`] would wait now (no credit, no buffer): a reply
    /// must be read first.
    fn send_would_wait(&self) -> bool {
        false
    }
    /// Whether the DDP-eligible result of a call with [`ReplySpace::ddp`] comes apart (an
    /// RPC-over-RDMA Write chunk), so that one returned inline breaks the binding
    /// (RPCRDMA-75). Over a stream transport everything is inline.
    fn places_results(&self) -> bool {
        false
    }
    /// The call `xid` is over (answered, abandoned, failed): its resources may go.
    fn release(&self, xid: u32) {
        let _ = xid;
    }
    /// Ends the connection: a thread blocked in `recv` returns.
    fn shutdown(&self);
}

type Outcome = Result<Reply, RpcError>;

/// Makes a new connection to the server a [`Client`] talks to.
pub type Connector = Box<dyn Fn() -> io::Result<Arc<dyn ClientTransport>> + Send + Sync>;

/// What a [`Client`] does when its connection is lost: connect again and retransmit every
/// call in flight on the new connection with its xid unchanged, so that a server's
/// duplicate request cache recognises the calls it already executed (RFC 5531 §9;
/// RFC 8166 §4.4: RPC-over-RDMA retransmits only on a new connection).
pub struct Reconnect {
    /// Makes the new connection.
    pub connect: Connector,
    /// Connection attempts per loss (50 ms apart, doubling up to 2 s) before the calls in
    /// flight fail.
    pub attempts: u32,
    /// A call unanswered this long makes the client drop the connection and retransmit on
    /// a new one (the Linux RPC-over-RDMA client's major timeout); `None`: only on loss.
    pub retransmit_after: Option<Duration>,
    /// Retransmissions of one call before it fails with [`RpcError::Timeout`].
    pub max_retransmits: u32,
}

impl Reconnect {
    /// Five attempts per loss, three retransmissions per call, no retransmit timer.
    pub fn new(connect: Connector) -> Reconnect {
        Reconnect {
            connect,
            attempts: 5,
            retransmit_after: None,
            max_retransmits: 3,
        }
    }
}

/// A call in flight.
struct Waiting {
    tx: Sender<Outcome>,
    /// (program, version, procedure), and whether a place for a DDP-eligible result was
    /// offered.
    proc: (u32, u32, u32),
    ddp_offered: bool,
    /// Kept for retransmission (with a [`Reconnect`] only).
    call: Option<Arc<OutCall>>,
    /// The connection it was last sent on.
    generation: u64,
    sent: Instant,
    retransmits: u32,
}

struct Slots {
    waiting: HashMap<u32, Waiting>,
    /// The receiving thread ended (the error it ended with, once).
    closed: bool,
    /// The connection now, and how many connections came before it.
    conn: Arc<dyn ClientTransport>,
    generation: u64,
    /// The connection now has ended; the receiving thread replaces it (or closes).
    ended: bool,
    /// A sender waits for a reply to be read and no caller reads: the receiving thread
    /// takes the role without waiting for [`GRACE`].
    urgent: bool,
}

/// How long callers leave the receive role untaken before the receiving thread takes it:
/// far longer than a caller takes between two waits (a reply handled, the next call sent),
/// so that a caller with calls in flight keeps reading its own replies; short enough for
/// replies nobody waits on (abandoned calls, a connection's end) to be read soon.
const GRACE: Duration = Duration::from_millis(5);

struct Shared {
    slots: Mutex<Slots>,
    freed: Condvar,
    /// The receive role: one token, taken by whoever reads the connection.
    role_tx: Sender<()>,
    role_rx: Receiver<()>,
    /// Callers in [`Pending::wait`] that want the role.
    drivers: AtomicUsize,
    /// Bumped whenever a caller starts wanting the role.
    wanted: AtomicU64,
    /// Wakes the receiving thread (no drivers left, a connection ended, stop).
    rx_cv: Condvar,
    max_in_flight: usize,
    next_xid: AtomicU32,
    cred: Mutex<Auth>,
    reconnect: Option<Reconnect>,
    /// The client is going away: no reconnection.
    stopping: AtomicBool,
    /// Result bindings by (program, version).
    results: Mutex<HashMap<(u32, u32), ResultBinding>>,
    stop_cv: Condvar,
}

/// An RPC client on one connection. Clones share it.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    _rx: Arc<ReceiverThread>,
}

struct ReceiverThread {
    shared: Arc<Shared>,
    /// The receiving thread and the retransmit timer.
    handle: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for ReceiverThread {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        {
            let s = self.shared.slots.lock();
            s.conn.shutdown();
            self.shared.stop_cv.notify_all();
            self.shared.rx_cv.notify_all();
        }
        for h in self.handle.lock().drain(..) {
            let _ = h.join();
        }
    }
}

/// A call in flight.
pub struct Pending {
    xid: u32,
    rx: Receiver<Outcome>,
    shared: Arc<Shared>,
}

impl Pending {
    /// The call's xid.
    pub fn xid(&self) -> u32 {
        self.xid
    }

    /// Waits for the reply, reading the connection meanwhile if no other caller does (the
    /// receive role, see the module's doc).
    pub fn wait(self) -> Result<Reply, RpcError> {
        self.wait_until(None).unwrap_or(Err(RpcError::Timeout))
    }

    /// Waits at most `timeout`; on timeout the call is abandoned (its slot freed, a late
    /// reply dropped).
    pub fn wait_timeout(self, timeout: Duration) -> Result<Reply, RpcError> {
        match self.wait_until(Some(Instant::now() + timeout)) {
            Some(r) => r,
            None => {
                self.shared.release(self.xid);
                Err(RpcError::Timeout)
            }
        }
    }

    /// The outcome, or `None` at `deadline`.
    fn wait_until(&self, deadline: Option<Instant>) -> Option<Outcome> {
        let s = &self.shared;
        // Without a deadline, selects still end now and then (a look at the state).
        let far = Duration::from_secs(3600);
        loop {
            match self.rx.try_recv() {
                Ok(r) => return Some(r),
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    return Some(Err(RpcError::Disconnected));
                }
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return None,
                },
                None => far,
            };
            if !s.readable() {
                // The receiving thread replaces the connection (or closes): the reply, or
                // a look at the new connection.
                match self.rx.recv_timeout(left.min(Duration::from_millis(10))) {
                    Ok(r) => return Some(r),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Some(Err(RpcError::Disconnected));
                    }
                }
            }
            s.drivers.fetch_add(1, Ordering::AcqRel);
            s.wanted.fetch_add(1, Ordering::AcqRel);
            let got = select! {
                recv(self.rx) -> r => Some(r.unwrap_or(Err(RpcError::Disconnected))),
                recv(s.role_rx) -> _ => s.drive(&self.rx, deadline),
                default(left) => None,
            };
            s.drivers.fetch_sub(1, Ordering::AcqRel);
            if got.is_some() {
                return got;
            }
        }
    }
}

impl Shared {
    fn conn(&self) -> Arc<dyn ClientTransport> {
        self.slots.lock().conn.clone()
    }

    /// The connection may be read: neither ended nor closed.
    fn readable(&self) -> bool {
        let s = self.slots.lock();
        !s.ended && !s.closed
    }

    /// With the receive role: reads replies and hands them out until `own` has one (the
    /// role given back), or the connection ends or `deadline` passes (given back, `None`).
    fn drive(&self, own: &Receiver<Outcome>, deadline: Option<Instant>) -> Option<Outcome> {
        let out = loop {
            if let Ok(r) = own.try_recv() {
                break Some(r);
            }
            let (conn, generation) = {
                let s = self.slots.lock();
                if s.ended || s.closed {
                    break None;
                }
                (s.conn.clone(), s.generation)
            };
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => break None,
                },
                None => None,
            };
            if !self.receive_one(&conn, generation, left) {
                break None;
            }
        };
        self.release_role();
        out
    }

    /// Reads one message from `conn` (connection `generation`), waiting at most `timeout`
    /// if given, and hands it out; `false` when the connection ended (the receiving thread
    /// is told).
    fn receive_one(
        &self,
        conn: &Arc<dyn ClientTransport>,
        generation: u64,
        timeout: Option<Duration>,
    ) -> bool {
        let got = match timeout {
            Some(t) => conn.recv_timeout(t),
            None => conn.recv(),
        };
        match got {
            Ok(Some(inc)) => {
                self.deliver(inc);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => true,
            Ok(None) => {
                self.conn_ended(generation);
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "RPC client connection ended");
                self.conn_ended(generation);
                false
            }
        }
    }

    fn release_role(&self) {
        // One token: the role was held, so there is room for it.
        let _ = self.role_tx.try_send(());
    }

    /// Something must be read before a sender can go on (a slot, a credit): with no caller
    /// reading, the receiving thread takes the role at once.
    fn need_reader(&self) {
        if self.drivers.load(Ordering::Acquire) == 0 {
            let mut s = self.slots.lock();
            s.urgent = true;
            self.rx_cv.notify_all();
        }
    }

    /// Connection `generation` ended: the receiving thread replaces it.
    fn conn_ended(&self, generation: u64) {
        let mut s = self.slots.lock();
        if s.generation == generation {
            s.ended = true;
        }
        self.rx_cv.notify_all();
    }

    fn release(&self, xid: u32) {
        let conn = {
            let mut s = self.slots.lock();
            if s.waiting.remove(&xid).is_some() {
                self.freed.notify_one();
            }
            s.conn.clone()
        };
        conn.release(xid);
    }

    fn deliver(&self, inc: Incoming) {
        let (mut msg, bulk) = match inc {
            Incoming::Reply { msg, bulk } => (msg, bulk),
            Incoming::Refused { xid, why } => {
                self.fail(xid, RpcError::Transport(why));
                return;
            }
        };
        let (h, off) = match decode_reply(&msg) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "RPC client: undecodable message dropped");
                if let Some((xid, _)) = crate::msg::peek(&msg) {
                    self.fail(xid, RpcError::BadReply(e));
                }
                return;
            }
        };
        // Whether or not someone still waits, the call is over for the transport.
        let w = self.slots.lock().waiting.remove(&h.xid);
        self.freed.notify_one();
        self.conn().release(h.xid);
        let Some(w) = w else {
            tracing::debug!(xid = h.xid, "RPC client: reply to no call in flight");
            return;
        };
        let (prog, vers, proc) = w.proc;
        let out = match h.status {
            ReplyStatus::Success => {
                // The message's own memory holds the results (no copy).
                msg.drain(..off);
                let results = msg;
                let binding = self.results.lock().get(&(prog, vers)).cloned();
                let bulk_at = binding.and_then(|f| f(proc, &results));
                match eligible_inline(w.ddp_offered, &bulk, bulk_at, &results) {
                    Some(e) => Err(e),
                    None => Ok(Reply {
                        header: h,
                        results,
                        bulk,
                        bulk_at,
                    }),
                }
            }
            st => Err(RpcError::Status(st)),
        };
        let tx = w.tx;
        let _ = tx.send(out);
    }

    fn fail(&self, xid: u32, e: RpcError) {
        let tx = self.slots.lock().waiting.remove(&xid).map(|w| w.tx);
        self.freed.notify_one();
        self.conn().release(xid);
        if let Some(tx) = tx {
            let _ = tx.send(Err(e));
        }
    }

    fn close(&self) {
        let mut s = self.slots.lock();
        s.closed = true;
        for (_, w) in s.waiting.drain() {
            let _ = w.tx.send(Err(RpcError::Disconnected));
        }
        self.freed.notify_all();
        self.stop_cv.notify_all();
        self.rx_cv.notify_all();
    }

    /// The receiving thread: reads replies while no caller wants the receive role, and
    /// when the connection ends, (with a [`Reconnect`]) makes a new one and sends the calls
    /// in flight again, until the client goes.
    fn receive(self: &Arc<Self>) {
        loop {
            if self.stopping.load(Ordering::Acquire) {
                break;
            }
            if self.slots.lock().ended {
                let conn = self.conn();
                conn.shutdown();
                drop(conn);
                if self.stopping.load(Ordering::Acquire) || !self.reconnect_and_resend() {
                    break;
                }
                continue;
            }
            if !self.role_unwanted() {
                continue;
            }
            match self.role_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(()) => {}
                Err(_) => continue,
            }
            // Read until a caller wants the role (it sees the next message itself).
            loop {
                let (conn, generation) = {
                    let s = self.slots.lock();
                    if s.ended || s.closed {
                        break;
                    }
                    (s.conn.clone(), s.generation)
                };
                if !self.receive_one(&conn, generation, None)
                    || self.drivers.load(Ordering::Acquire) > 0
                    || self.stopping.load(Ordering::Acquire)
                {
                    break;
                }
            }
            self.release_role();
        }
        self.close();
    }

    /// Whether the receiving thread should take the receive role now: no caller has
    /// wanted it for a [`GRACE`] period, or a sender needs a reply read. Waits that period
    /// (checked lazily: callers never wake this thread by just leaving the role).
    fn role_unwanted(&self) -> bool {
        let mut s = self.slots.lock();
        if s.ended || self.stopping.load(Ordering::Acquire) {
            return false;
        }
        let seen = self.wanted.load(Ordering::Acquire);
        if !s.urgent {
            self.rx_cv.wait_for(&mut s, GRACE);
        }
        if s.ended || self.stopping.load(Ordering::Acquire) {
            return false;
        }
        std::mem::take(&mut s.urgent)
            || (self.wanted.load(Ordering::Acquire) == seen
                && self.drivers.load(Ordering::Acquire) == 0)
    }

    /// Connects again and retransmits the calls in flight; `false` if no connection came.
    fn reconnect_and_resend(self: &Arc<Self>) -> bool {
        let Some(r) = &self.reconnect else {
            return false;
        };
        let mut backoff = Duration::from_millis(50);
        let mut conn = None;
        for i in 0..r.attempts.max(1) {
            if self.stopping.load(Ordering::Acquire) {
                return false;
            }
            match (r.connect)() {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, attempt = i + 1, "RPC client reconnect failed");
                    // Backoff between attempts: a wait for the server, not for a thread.
                    let mut s = self.slots.lock();
                    if !self.stopping.load(Ordering::Acquire) {
                        self.stop_cv.wait_for(&mut s, backoff);
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        let Some(conn) = conn else {
            return false;
        };
        // Every call not yet sent on the new connection goes again, oldest first.
        let mut again: Vec<(Instant, u32, Arc<OutCall>)> = Vec::new();
        let mut expired = Vec::new();
        {
            let mut s = self.slots.lock();
            s.conn = conn.clone();
            s.generation += 1;
            s.ended = false;
            let g = s.generation;
            for (&xid, w) in s.waiting.iter_mut() {
                if w.generation >= g {
                    continue;
                }
                w.retransmits += 1;
                match &w.call {
                    Some(c) if w.retransmits <= r.max_retransmits => {
                        w.generation = g;
                        again.push((w.sent, xid, c.clone()));
                        w.sent = Instant::now();
                    }
                    _ => expired.push(xid),
                }
            }
        }
        for xid in expired {
            self.fail(xid, RpcError::Timeout);
        }
        again.sort_by_key(|a| (a.0, a.1));
        if !again.is_empty() {
            // Not on this thread: a send may wait for a credit that only a reply received
            // here returns.
            let _ = std::thread::Builder::new()
                .name("rpc-client-resend".into())
                .spawn(move || {
                    for (_, xid, call) in again {
                        if let Err(e) = conn.send(&call) {
                            // The next connection takes it up again.
                            tracing::debug!(xid, error = %e, "RPC retransmission not sent");
                            break;
                        }
                    }
                });
        }
        true
    }

    /// The retransmit timer: a call unanswered for `after` ends the connection, which
    /// [`Shared::receive`] replaces.
    fn watch(&self, after: Duration) {
        let mut s = self.slots.lock();
        while !self.stopping.load(Ordering::Acquire) && !s.closed {
            let now = Instant::now();
            let g = s.generation;
            let late = s
                .waiting
                .values()
                .any(|w| w.generation == g && now.duration_since(w.sent) >= after);
            if late {
                tracing::debug!("RPC call unanswered: reconnecting to retransmit");
                s.conn.shutdown();
                // Each call's clock restarts when it is sent again.
                for w in s.waiting.values_mut() {
                    w.sent = now;
                }
            }
            let next = s
                .waiting
                .values()
                .map(|w| w.sent + after)
                .min()
                .unwrap_or(now + after);
            let _ = self.stop_cv.wait_for(
                &mut s,
                next.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            );
        }
    }
}

/// RFC 8166 §6.1 (RPCRDMA-75): a place for the DDP-eligible result was offered and came
/// back unused, yet the binding finds a non-empty eligible result inline — a permanent
/// error for the call.
fn eligible_inline(
    offered: bool,
    bulk: &Option<Bulk>,
    at: Option<usize>,
    results: &[u8],
) -> Option<RpcError> {
    let at = at?;
    if !offered || bulk.is_some() || at < 4 {
        return None;
    }
    let len = results.get(at - 4..at)?;
    (len != [0; 4]).then(|| {
        RpcError::Transport("the DDP-eligible result came inline, not in the Write chunk".into())
    })
}

/// RPCSEC_GSS (flavor 6, RFC 2203 §5) with the integrity (2) or privacy (3) service: the
/// credential body is version, procedure, sequence number, service, handle.
fn gss_protected(cred: &Auth) -> bool {
    const RPCSEC_GSS: u32 = 6;
    match cred {
        Auth::Other { flavor, body } if *flavor == RPCSEC_GSS => body
            .get(12..16)
            .is_some_and(|w| matches!(u32::from_be_bytes([w[0], w[1], w[2], w[3]]), 2 | 3)),
        _ => false,
    }
}

/// A transport error that means the connection is gone (a retransmission on the next one
/// delivers the call).
fn is_loss(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotConnected
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

/// Default bound on calls in flight (the Linux client's default TCP slot table is 2..65536,
/// growing on demand; a server's credit grant bounds RPC-over-RDMA).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 128;

impl Client {
    /// A client over `transport`, with at most `max_in_flight` calls outstanding; the calls
    /// in flight fail if the connection is lost.
    pub fn new(transport: Arc<dyn ClientTransport>, max_in_flight: usize) -> Client {
        Client::build(transport, max_in_flight, None)
    }

    /// A client that connects with `reconnect.connect` now and again whenever the
    /// connection is lost, retransmitting the calls in flight (same xids).
    pub fn with_reconnect(reconnect: Reconnect, max_in_flight: usize) -> io::Result<Client> {
        let first = (reconnect.connect)()?;
        Ok(Client::build(first, max_in_flight, Some(reconnect)))
    }

    fn build(
        transport: Arc<dyn ClientTransport>,
        max_in_flight: usize,
        reconnect: Option<Reconnect>,
    ) -> Client {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
            .unwrap_or(1)
            ^ std::process::id().rotate_left(16);
        let timer = reconnect.as_ref().and_then(|r| r.retransmit_after);
        let (role_tx, role_rx) = bounded(1);
        let _ = role_tx.try_send(());
        let shared = Arc::new(Shared {
            slots: Mutex::new(Slots {
                waiting: HashMap::default(),
                closed: false,
                conn: transport,
                generation: 0,
                ended: false,
                urgent: false,
            }),
            freed: Condvar::new(),
            role_tx,
            role_rx,
            drivers: AtomicUsize::new(0),
            wanted: AtomicU64::new(0),
            rx_cv: Condvar::new(),
            max_in_flight: max_in_flight.max(1),
            next_xid: AtomicU32::new(seed),
            cred: Mutex::new(Auth::None),
            reconnect,
            stopping: AtomicBool::new(false),
            stop_cv: Condvar::new(),
            results: Mutex::new(HashMap::default()),
        });
        let s = shared.clone();
        let mut handles = vec![
            std::thread::Builder::new()
                .name("rpc-client-rx".into())
                .spawn(move || s.receive())
                .expect("spawn the RPC client's receiving thread"),
        ];
        if let Some(after) = timer {
            let s = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name("rpc-client-timer".into())
                    .spawn(move || s.watch(after))
                    .expect("spawn the RPC client's retransmit timer"),
            );
        }
        Client {
            _rx: Arc::new(ReceiverThread {
                shared: shared.clone(),
                handle: Mutex::new(handles),
            }),
            shared,
        }
    }

    /// Declares the Upper-Layer Binding of version `vers` of program `prog` for results:
    /// replies then say where their bulk data belongs ([`Reply::bulk_at`],
    /// [`Reply::unreduced`]), and a reply that leaves the offered Write chunk unused while
    /// carrying its eligible result inline fails (RPCRDMA-75).
    pub fn bind_results(
        &self,
        prog: u32,
        vers: u32,
        f: impl Fn(u32, &[u8]) -> Option<usize> + Send + Sync + 'static,
    ) {
        self.shared.results.lock().insert((prog, vers), Arc::new(f));
    }

    /// Ends the current connection: with a [`Reconnect`], the calls in flight go again on
    /// a new one; without, they fail.
    pub fn reconnect(&self) {
        self.shared.conn().shutdown();
    }

    /// Connections made after the first.
    pub fn reconnects(&self) -> u64 {
        self.shared.slots.lock().generation
    }

    /// The credential of the calls from now on (`AUTH_NONE` until set).
    pub fn set_cred(&self, cred: Auth) {
        *self.shared.cred.lock() = cred;
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.shared.slots.lock().waiting.len()
    }

    /// Sends a call of `prog`/`vers`/`proc` with XDR `args`; waits for a slot if
    /// `max_in_flight` calls are outstanding.
    pub fn start(&self, prog: u32, vers: u32, proc: u32, args: &[u8]) -> Result<Pending, RpcError> {
        self.send_call(prog, vers, proc, args, Vec::new(), ReplySpace::default())
    }

    /// As [`Client::start`], with a DDP-eligible argument and the reply's room.
    pub fn start_with(
        &self,
        prog: u32,
        vers: u32,
        proc: u32,
        args: &Payload,
        reply: ReplySpace,
    ) -> Result<Pending, RpcError> {
        args.check().map_err(|e| RpcError::Encode(e.to_string()))?;
        if args.shared.is_some() {
            // The call is encoded into one message anyway: the shared item is copied in.
            let a = args.clone().into_inline();
            return self.send_call(prog, vers, proc, &a.xdr, a.ddp, reply);
        }
        self.send_call(prog, vers, proc, &args.xdr, args.ddp.clone(), reply)
    }

    /// Encodes and sends a call of XDR `args` (`ddp`: its DDP-eligible range).
    fn send_call(
        &self,
        prog: u32,
        vers: u32,
        proc: u32,
        args: &[u8],
        ddp: Vec<std::ops::Range<usize>>,
        reply: ReplySpace,
    ) -> Result<Pending, RpcError> {
        let s = &self.shared;
        let xid = s.next_xid.fetch_add(1, Ordering::Relaxed);
        let h = CallHeader {
            xid,
            prog,
            vers,
            proc,
            cred: s.cred.lock().clone(),
            verf: Auth::None,
        };
        // RFC 8166 §8.2.2.3 (RPCRDMA-85): RPCSEC_GSS integrity or privacy wraps arguments
        // and results whole: nothing is reduced either way (a Long Call, a Reply chunk).
        let (ddp, reply) = if gss_protected(&h.cred) {
            let max = reply.max.saturating_add(reply.ddp.map_or(0, |n| n + 8));
            (Vec::new(), ReplySpace { max, ddp: None })
        } else {
            (ddp, reply)
        };
        let mut msg = Vec::with_capacity(args.len() + 128);
        encode_call(&h, args, &mut msg).map_err(|e| RpcError::Encode(e.to_string()))?;
        let at = msg.len() - args.len();
        let call = OutCall {
            msg,
            ddp: ddp.into_iter().map(|r| r.start + at..r.end + at).collect(),
            reply,
        };
        let call = Arc::new(call);
        let (tx, rx) = bounded(1);
        let conn = {
            let mut slots = s.slots.lock();
            while !slots.closed && slots.waiting.len() >= s.max_in_flight {
                if s.drivers.load(Ordering::Acquire) == 0 {
                    slots.urgent = true;
                    s.rx_cv.notify_all();
                }
                s.freed.wait(&mut slots);
            }
            if slots.closed {
                return Err(RpcError::Disconnected);
            }
            let generation = slots.generation;
            let ddp_offered = reply.ddp.is_some() && slots.conn.places_results();
            slots.waiting.insert(
                xid,
                Waiting {
                    tx,
                    proc: (prog, vers, proc),
                    ddp_offered,
                    call: s.reconnect.is_some().then(|| call.clone()),
                    generation,
                    sent: Instant::now(),
                    retransmits: 0,
                },
            );
            slots.conn.clone()
        };
        if conn.send_would_wait() {
            s.need_reader();
        }
        if conn.send_would_wait() {
            s.need_reader();
        }
        if let Err(e) = conn.send(&call) {
            // A lost connection: the receiving thread connects again and retransmits.
            if s.reconnect.is_some() && is_loss(&e) {
                conn.shutdown();
            } else {
                s.release(xid);
                return Err(e.into());
            }
        }
        Ok(Pending {
            xid,
            rx,
            shared: s.clone(),
        })
    }

    /// One call: its results, or why there are none.
    pub fn call(&self, prog: u32, vers: u32, proc: u32, args: &[u8]) -> Result<Reply, RpcError> {
        self.start(prog, vers, proc, args)?.wait()
    }

    /// One call with a DDP-eligible argument and the reply's room.
    pub fn call_with(
        &self,
        prog: u32,
        vers: u32,
        proc: u32,
        args: &Payload,
        reply: ReplySpace,
    ) -> Result<Reply, RpcError> {
        self.start_with(prog, vers, proc, args, reply)?.wait()
    }

    /// One call, waiting at most `timeout` for the reply.
    pub fn call_timeout(
        &self,
        prog: u32,
        vers: u32,
        proc: u32,
        args: &[u8],
        timeout: Duration,
    ) -> Result<Reply, RpcError> {
        let deadline = Instant::now() + timeout;
        let p = self.start(prog, vers, proc, args)?;
        p.wait_timeout(deadline.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{decode_call, encode_reply};
    use std::thread::ThreadId;

    /// A connection whose server is the test: calls come out on `calls`, replies go in
    /// through `answer`; every read notes the thread that made it.
    struct Scripted {
        calls: Sender<u32>,
        inbox: Receiver<Option<Vec<u8>>>,
        readers: Mutex<Vec<ThreadId>>,
        /// Each read's thread, as it happens.
        read_tx: Sender<ThreadId>,
        full: AtomicBool,
        /// Ends a blocked read (the connection shut down).
        end: Sender<Option<Vec<u8>>>,
    }

    fn scripted() -> (Arc<Scripted>, Receiver<u32>, Sender<Option<Vec<u8>>>) {
        let (t, calls, answer, _) = scripted_with_reads();
        (t, calls, answer)
    }

    /// [`scripted`], and the threads that read, as they read.
    #[allow(clippy::type_complexity)]
    fn scripted_with_reads() -> (
        Arc<Scripted>,
        Receiver<u32>,
        Sender<Option<Vec<u8>>>,
        Receiver<ThreadId>,
    ) {
        let (calls, calls_rx) = crossbeam_channel::unbounded();
        let (answer, inbox) = crossbeam_channel::unbounded();
        let (read_tx, reads) = crossbeam_channel::unbounded();
        let t = Arc::new(Scripted {
            calls,
            inbox,
            readers: Mutex::new(Vec::new()),
            read_tx,
            full: AtomicBool::new(false),
            end: answer.clone(),
        });
        (t, calls_rx, answer, reads)
    }

    fn reply(xid: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        encode_reply(xid, ReplyStatus::Success, &Auth::None, body, &mut m).unwrap();
        m
    }

    impl Scripted {
        fn got(&self, m: Option<Vec<u8>>) -> io::Result<Option<Incoming>> {
            let me = std::thread::current().id();
            self.readers.lock().push(me);
            let _ = self.read_tx.send(me);
            Ok(m.map(|msg| Incoming::Reply { msg, bulk: None }))
        }
    }

    impl ClientTransport for Scripted {
        fn send(&self, call: &OutCall) -> io::Result<()> {
            let (h, _) = decode_call(&call.msg).map_err(|_| io::ErrorKind::InvalidData)?;
            let _ = self.calls.send(h.xid);
            Ok(())
        }
        fn recv(&self) -> io::Result<Option<Incoming>> {
            self.got(self.inbox.recv().unwrap_or(None))
        }
        fn recv_timeout(&self, timeout: Duration) -> io::Result<Option<Incoming>> {
            match self.inbox.recv_timeout(timeout) {
                Ok(m) => self.got(m),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    Err(io::ErrorKind::TimedOut.into())
                }
                Err(_) => self.got(None),
            }
        }
        fn send_would_wait(&self) -> bool {
            self.full.load(Ordering::Acquire)
        }
        fn shutdown(&self) {
            let _ = self.end.send(None);
        }
    }

    const T: Duration = Duration::from_secs(20);

    #[test]
    fn a_waiting_caller_reads_its_own_reply() {
        let (t, calls, answer) = scripted();
        let c = Client::new(t.clone(), 8);
        for round in 0..50u32 {
            let p = c.start(1, 1, 0, &[]).unwrap();
            let xid = calls.recv_timeout(T).unwrap();
            assert_eq!(p.xid(), xid);
            answer.send(Some(reply(xid, &round.to_be_bytes()))).unwrap();
            assert_eq!(p.wait().unwrap().results, round.to_be_bytes());
        }
        // The receiving thread may have read the first reply (it takes the role when no
        // caller has wanted it for a while); after that the caller reads, no hand-off.
        let me = std::thread::current().id();
        let readers = t.readers.lock().clone();
        assert_eq!(readers.len(), 50);
        assert!(
            readers.iter().filter(|&&r| r == me).count() >= 49,
            "replies read by other threads: {readers:?}"
        );
    }

    #[test]
    fn the_reader_hands_other_callers_their_replies() {
        let (t, calls, answer) = scripted();
        let c = Client::new(t.clone(), 64);
        // Four threads wait at once; the replies come in the reverse order of the calls,
        // so whoever reads meets the others' replies first.
        let (go_tx, go_rx) = bounded::<()>(0);
        let waiters: Vec<_> = (0..4u32)
            .map(|i| {
                let c = c.clone();
                let go = go_rx.clone();
                std::thread::spawn(move || {
                    let p = c.start(1, 1, 0, &i.to_be_bytes()).unwrap();
                    go.recv().unwrap();
                    (i, p.xid(), p.wait().unwrap().results)
                })
            })
            .collect();
        let mut xids: Vec<u32> = (0..4).map(|_| calls.recv_timeout(T).unwrap()).collect();
        for _ in 0..4 {
            go_tx.send(()).unwrap();
        }
        xids.reverse();
        for x in &xids {
            answer.send(Some(reply(*x, &x.to_be_bytes()))).unwrap();
        }
        for w in waiters {
            let (_, xid, results) = w.join().unwrap();
            assert_eq!(results, xid.to_be_bytes(), "a caller got another's reply");
        }
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn replies_nobody_waits_for_are_read_and_free_their_slots() {
        let (t, calls, answer) = scripted();
        let c = Client::new(t.clone(), 2);
        let a = c.start(1, 1, 0, &[]).unwrap();
        let b = c.start(1, 1, 0, &[]).unwrap();
        for _ in 0..2 {
            let x = calls.recv_timeout(T).unwrap();
            answer.send(Some(reply(x, b"ok"))).unwrap();
        }
        // Both slots taken and no caller waits: the third call needs a reply read by the
        // receiving thread to get a slot.
        let third = c.start(1, 1, 0, &[]).unwrap();
        let x = calls.recv_timeout(T).unwrap();
        answer.send(Some(reply(x, b"3"))).unwrap();
        assert_eq!(third.wait().unwrap().results, b"3");
        assert_eq!(a.wait().unwrap().results, b"ok");
        assert_eq!(b.wait().unwrap().results, b"ok");
    }

    #[test]
    fn a_sender_short_of_credit_gets_a_reader() {
        let (t, calls, answer, reads) = scripted_with_reads();
        let c = Client::new(t.clone(), 8);
        // The transport has no credit: a reply must be read before the next send can go,
        // and no caller waits to read it.
        t.full.store(true, Ordering::Release);
        let a = c.start(1, 1, 0, &[]).unwrap();
        let x = calls.recv_timeout(T).unwrap();
        answer.send(Some(reply(x, b"a"))).unwrap();
        let reader = reads.recv_timeout(T).expect("nobody read the reply");
        assert_ne!(reader, std::thread::current().id());
        assert_eq!(a.wait().unwrap().results, b"a");
    }

    #[test]
    fn a_caller_reading_for_others_still_times_out() {
        let (t, calls, answer) = scripted();
        let c = Client::new(t.clone(), 8);
        let slow = c.start(1, 1, 0, &[]).unwrap();
        let other = c.start(1, 1, 0, &[]).unwrap();
        let _ = calls.recv_timeout(T).unwrap();
        let x = calls.recv_timeout(T).unwrap();
        let t0 = Instant::now();
        assert!(matches!(
            slow.wait_timeout(Duration::from_millis(50)),
            Err(RpcError::Timeout)
        ));
        assert!(t0.elapsed() < T, "the deadline held while reading");
        assert_eq!(c.in_flight(), 1, "the abandoned call's slot is free");
        answer.send(Some(reply(x, b"o"))).unwrap();
        assert_eq!(other.wait().unwrap().results, b"o");
    }

    #[test]
    fn a_connection_end_seen_by_a_caller_fails_the_calls() {
        let (t, calls, answer) = scripted();
        let c = Client::new(t.clone(), 8);
        let p = c.start(1, 1, 0, &[]).unwrap();
        let q = c.start(1, 1, 0, &[]).unwrap();
        let _ = (
            calls.recv_timeout(T).unwrap(),
            calls.recv_timeout(T).unwrap(),
        );
        answer.send(None).unwrap();
        assert!(matches!(p.wait(), Err(RpcError::Disconnected)));
        assert!(matches!(q.wait(), Err(RpcError::Disconnected)));
        assert!(matches!(c.start(1, 1, 0, &[]), Err(RpcError::Disconnected)));
    }
}
