//! The RPC client: blocking calls and many calls in flight on one connection.
//!
//! [`Client::start`] sends a call and returns a [`Pending`] to wait on; [`Client::call`] is
//! `start` then `wait`. One receiving thread per connection matches replies to calls by xid
//! (RFC 5531 §9: the xid is the only link). At most `max_in_flight` calls are outstanding:
//! `start` blocks for a free slot, as the Linux client's slot table does.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use parking_lot::{Condvar, Mutex};

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
    pub bulk: Option<Vec<u8>>,
}

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
    /// The DDP-eligible argument data, a range of `msg`.
    pub ddp: Option<std::ops::Range<usize>>,
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
        bulk: Option<Vec<u8>>,
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
    /// The call `xid` is over (answered, abandoned, failed): its resources may go.
    fn release(&self, xid: u32) {
        let _ = xid;
    }
    /// Ends the connection: a thread blocked in `recv` returns.
    fn shutdown(&self);
}

type Outcome = Result<Reply, RpcError>;

struct Slots {
    waiting: HashMap<u32, Sender<Outcome>>,
    /// The receiving thread ended (the error it ended with, once).
    closed: bool,
}

struct Shared {
    transport: Arc<dyn ClientTransport>,
    slots: Mutex<Slots>,
    freed: Condvar,
    max_in_flight: usize,
    next_xid: AtomicU32,
    cred: Mutex<Auth>,
}

/// An RPC client on one connection. Clones share it.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    _rx: Arc<ReceiverThread>,
}

struct ReceiverThread {
    shared: Arc<Shared>,
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for ReceiverThread {
    fn drop(&mut self) {
        self.shared.transport.shutdown();
        if let Some(h) = self.handle.lock().take() {
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

    /// Waits for the reply.
    pub fn wait(self) -> Result<Reply, RpcError> {
        self.rx.recv().unwrap_or(Err(RpcError::Disconnected))
    }

    /// Waits at most `timeout`; on timeout the call is abandoned (its slot freed, a late
    /// reply dropped).
    pub fn wait_timeout(self, timeout: Duration) -> Result<Reply, RpcError> {
        match self.rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                self.shared.release(self.xid);
                Err(RpcError::Timeout)
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(RpcError::Disconnected),
        }
    }
}

impl Shared {
    fn release(&self, xid: u32) {
        if self.slots.lock().waiting.remove(&xid).is_some() {
            self.freed.notify_one();
        }
        self.transport.release(xid);
    }

    fn deliver(&self, inc: Incoming) {
        let (msg, bulk) = match inc {
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
        let tx = self.slots.lock().waiting.remove(&h.xid);
        self.freed.notify_one();
        self.transport.release(h.xid);
        let Some(tx) = tx else {
            tracing::debug!(xid = h.xid, "RPC client: reply to no call in flight");
            return;
        };
        let out = match h.status {
            ReplyStatus::Success => Ok(Reply {
                header: h,
                results: msg[off..].to_vec(),
                bulk,
            }),
            st => Err(RpcError::Status(st)),
        };
        let _ = tx.send(out);
    }

    fn fail(&self, xid: u32, e: RpcError) {
        let tx = self.slots.lock().waiting.remove(&xid);
        self.freed.notify_one();
        self.transport.release(xid);
        if let Some(tx) = tx {
            let _ = tx.send(Err(e));
        }
    }

    fn close(&self) {
        let mut s = self.slots.lock();
        s.closed = true;
        for (_, tx) in s.waiting.drain() {
            let _ = tx.send(Err(RpcError::Disconnected));
        }
        self.freed.notify_all();
    }
}

/// Default bound on calls in flight (the Linux client's default TCP slot table is 2..65536,
/// growing on demand; a server's credit grant bounds RPC-over-RDMA).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 128;

impl Client {
    /// A client over `transport`, with at most `max_in_flight` calls outstanding.
    pub fn new(transport: Arc<dyn ClientTransport>, max_in_flight: usize) -> Client {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
            .unwrap_or(1)
            ^ std::process::id().rotate_left(16);
        let shared = Arc::new(Shared {
            transport,
            slots: Mutex::new(Slots {
                waiting: HashMap::new(),
                closed: false,
            }),
            freed: Condvar::new(),
            max_in_flight: max_in_flight.max(1),
            next_xid: AtomicU32::new(seed),
            cred: Mutex::new(Auth::None),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("rpc-client-rx".into())
            .spawn(move || {
                loop {
                    match s.transport.recv() {
                        Ok(Some(inc)) => s.deliver(inc),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "RPC client connection ended");
                            break;
                        }
                    }
                }
                s.close();
            })
            .expect("spawn the RPC client's receiving thread");
        Client {
            _rx: Arc::new(ReceiverThread {
                shared: shared.clone(),
                handle: Mutex::new(Some(handle)),
            }),
            shared,
        }
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
        self.send_call(prog, vers, proc, args, None, ReplySpace::default())
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
        self.send_call(prog, vers, proc, &args.xdr, args.ddp.clone(), reply)
    }

    /// Encodes and sends a call of XDR `args` (`ddp`: its DDP-eligible range).
    fn send_call(
        &self,
        prog: u32,
        vers: u32,
        proc: u32,
        args: &[u8],
        ddp: Option<std::ops::Range<usize>>,
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
        let mut msg = Vec::with_capacity(args.len() + 128);
        encode_call(&h, args, &mut msg).map_err(|e| RpcError::Encode(e.to_string()))?;
        let at = msg.len() - args.len();
        let call = OutCall {
            msg,
            ddp: ddp.map(|r| r.start + at..r.end + at),
            reply,
        };
        let (tx, rx) = bounded(1);
        {
            let mut slots = s.slots.lock();
            while !slots.closed && slots.waiting.len() >= s.max_in_flight {
                s.freed.wait(&mut slots);
            }
            if slots.closed {
                return Err(RpcError::Disconnected);
            }
            slots.waiting.insert(xid, tx);
        }
        if let Err(e) = s.transport.send(&call) {
            s.release(xid);
            return Err(e.into());
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
