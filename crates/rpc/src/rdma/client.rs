//! The requester's side of RPC-over-RDMA (RFC 8166 §3.5, §4.3; the steps of the digest's
//! §7.1): credits, the call forms (short, chunked, long), Write and Reply chunks for the
//! reply, and the reply's reconstruction.

use std::collections::VecDeque;

// Keyed by our own xids.
use rustc_hash::FxHashMap as HashMap;
use std::io;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use softrdma::{Access, ConnectParams, Context, Mr, MrFlags, WcOpcode, WcStatus, WorkCompletion};
use softrdma_wire::rpcrdma::{Chunks, ReadList, ReadSegment, Repr, Segment, WriteChunk, WriteList};

use super::plan::{Lent, ReplyForm, plan_reply};
use super::pool::Lease;
use super::{Endpoint, RdmaConfig, Thresholds, io_err, thresholds, wrid};
use crate::buffers::{Buffers, Bulk};
use crate::client::{Client, ClientTransport, Connector, DEFAULT_MAX_IN_FLIGHT, Incoming, OutCall};
use crate::msg::peek;
use crate::payload::reduce_all;

/// Memory a call lent the responder; deregistered (invalidated) when the call is over.
#[derive(Default)]
struct CallMemory {
    /// The Send buffer slot.
    slot: Option<usize>,
    /// Read chunk source (argument data or the whole call).
    read: Option<Lease>,
    /// Write chunk target for the DDP-eligible result: the vector the caller gets.
    write: Option<Lease>,
    /// Reply chunk target (a long reply).
    reply: Option<Lease>,
    /// The reply arrived: its credit is returned.
    answered: bool,
}

/// How this connection's calls and replies travelled (RFC 8166 §3.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// Calls sent whole in the Send (short).
    pub calls_short: u64,
    /// Calls with their DDP-eligible argument in a Read chunk.
    pub calls_chunked: u64,
    /// Long Calls: the message in a Position-Zero Read chunk (RDMA_NOMSG).
    pub calls_long: u64,
    /// Replies received inline.
    pub replies_inline: u64,
    /// Replies whose DDP-eligible result came through our Write chunk.
    pub replies_write_chunk: u64,
    /// Long Replies, through our Reply chunk (RDMA_NOMSG).
    pub replies_reply_chunk: u64,
    /// RDMA_ERROR received.
    pub errors: u64,
    /// Replies that came with Send With Invalidate of the call's chunk handle.
    pub remotely_invalidated: u64,
    /// The most calls in flight at once.
    pub max_in_flight: u32,
}

struct State {
    /// The latest grant (RPCRDMA-04; 1 until the first reply, RPCRDMA-08).
    granted: u32,
    /// Calls sent and not answered (a call abandoned by its caller still counts until its
    /// reply comes: the responder has not acknowledged it).
    unanswered: u32,
    calls: HashMap<u32, CallMemory>,
    free_slots: Vec<usize>,
    closed: bool,
    stats: RdmaStats,
}

/// A client's RPC-over-RDMA connection ([`ClientTransport`]).
pub struct RdmaTransport {
    _ctx: Context,
    ep: Endpoint,
    cfg: RdmaConfig,
    th: Thresholds,
    state: Mutex<State>,
    room: Condvar,
    /// Messages decoded from a batch of completions, not yet handed out.
    ready: Mutex<VecDeque<Incoming>>,
    pool: Arc<Buffers>,
    /// Sends posted, and how often one is signaled.
    sends: AtomicU64,
    signal_every: u64,
    /// Completions of the last wait (kept for its capacity).
    wcs: Mutex<Vec<WorkCompletion>>,
}

impl RdmaTransport {
    /// Connects to the RPC-over-RDMA server at `addr` on `ctx`'s device.
    pub fn connect(
        ctx: &Context,
        addr: impl ToSocketAddrs,
        cfg: RdmaConfig,
    ) -> io::Result<RdmaTransport> {
        let cfg = cfg.normalized();
        let credits = cfg.credits;
        // RPCRDMA-06: a Receive for every reply we may get, before anything is sent.
        let ep = Endpoint::new(ctx, &cfg, credits)?;
        let info = ep
            .qp
            .connect(
                addr,
                ConnectParams {
                    private_data: cfg.private_data(),
                    roce: softrdma::roce::ConnectParams {
                        pmtu: cfg.roce_pmtu,
                    },
                    ..ConnectParams::default()
                },
            )
            .map_err(io_err)?;
        let th = thresholds(&cfg, &info.peer_private_data, true);
        Ok(RdmaTransport {
            _ctx: ctx.clone(),
            ep,
            cfg,
            th,
            state: Mutex::new(State {
                granted: 1,
                unanswered: 0,
                calls: HashMap::default(),
                free_slots: (0..credits as usize).rev().collect(),
                closed: false,
                stats: RdmaStats::default(),
            }),
            room: Condvar::new(),
            ready: Mutex::new(VecDeque::new()),
            pool: Buffers::new(3 * credits as usize, 8 * cfg.max_message),
            sends: AtomicU64::new(0),
            signal_every: u64::from(credits.div_ceil(2)),
            wcs: Mutex::new(Vec::with_capacity(32)),
        })
    }

    /// The connection's inline thresholds.
    pub fn thresholds(&self) -> Thresholds {
        self.th
    }

    /// How calls and replies travelled so far.
    pub fn stats(&self) -> RdmaStats {
        self.state.lock().stats
    }

    /// The connection's QP counters (packets, retransmissions, timeouts, NAKs).
    pub fn qp_counters(&self) -> softrdma::QpCounters {
        self.ep.qp.counters()
    }

    /// The connection's QP number.
    pub fn qp_num(&self) -> u32 {
        self.ep.qp.qp_num()
    }

    /// The credits the server grants now.
    pub fn granted(&self) -> u32 {
        self.state.lock().granted
    }

    /// Registers `parts`, one after the other, for the responder to read (a Read chunk's
    /// source), or `room` octets for it to write (a Reply chunk). A fresh registration per
    /// call: a new handle the peer cannot guess from earlier ones, gone once the call is
    /// over (RFC 8166 §8.1).
    fn lend_parts(&self, parts: &[&[u8]]) -> io::Result<Lease> {
        let len = parts.iter().map(|p| p.len()).sum();
        let mr = Lease::new(
            &self.pool,
            &self.ep.pd,
            len,
            Access::REMOTE_READ,
            self.chunk_flags(),
        )
        .map_err(io_err)?;
        let mut off = 0;
        for p in parts {
            mr.copy_in(off, p).map_err(io_err)?;
            off += p.len();
        }
        Ok(mr)
    }

    fn lend_room(&self, room: usize) -> io::Result<Lease> {
        Lease::new(
            &self.pool,
            &self.ep.pd,
            room,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            self.chunk_flags(),
        )
        .map_err(io_err)
    }

    /// Chunk regions are remotely invalidatable when we said we take Send With Invalidate.
    fn chunk_flags(&self) -> MrFlags {
        if self.cfg.remote_invalidate {
            MrFlags::FAST_REG
        } else {
            MrFlags::empty()
        }
    }

    fn segment(mr: &Mr, len: usize) -> Segment {
        Segment {
            handle: mr.rkey().0,
            length: len as u32,
            offset: mr.addr(0),
        }
    }

    /// Turns a completion into a message for `recv` (`msg`: what a Receive delivered).
    fn on_completion(&self, wc: &WorkCompletion, msg: Option<Vec<u8>>) -> io::Result<()> {
        match wrid::kind(wc.wr_id) {
            wrid::RECV => {
                let Some(buf) = msg.filter(|_| wc.status == WcStatus::Success) else {
                    return Err(io_err(format!("receive completed {:?}", wc.status)));
                };
                {
                    let mut st = self.state.lock();
                    // RFC 8797: the responder invalidated the call's chunk handle itself;
                    // deregistering it once the call is over is all that is left.
                    if wc.flags.with_invalidate {
                        st.stats.remotely_invalidated += 1;
                    }
                }
                if let Some(inc) = self.on_message(buf) {
                    self.ready.lock().push_back(inc);
                }
                Ok(())
            }
            _ if wc.status != WcStatus::Success => {
                Err(io_err(format!("{:?} completed {:?}", wc.opcode, wc.status)))
            }
            _ => Ok(()),
        }
    }

    /// A message from the responder: the reply it carries (in `buf`'s memory, its RPC-over-RDMA
    /// header dropped), or nothing (discarded).
    fn on_message(&self, mut buf: Vec<u8>) -> Option<Incoming> {
        let mut st = self.state.lock();
        let lent_of = |m: Option<&Mr>| {
            m.map(|m| Lent {
                handle: m.rkey().0,
                offset: m.addr(0),
                len: m.len(),
            })
        };
        let (xid, credit, form) = plan_reply(&buf, |xid| {
            let l = st.calls.get(&xid).filter(|l| !l.answered)?;
            Some((lent_of(l.write.as_deref()), lent_of(l.reply.as_deref())))
        })?;
        // The Write chunk's region is invalidated now, before its data is looked at
        // (RPCRDMA-55); the vector under it becomes the bulk data.
        let written = st.calls.get_mut(&xid)?.write.take();
        let bulk = |n: usize| -> Result<Bulk, String> {
            written
                .ok_or("no Write chunk was offered")?
                .into_bulk(n)
                .ok_or_else(|| "more written than the chunk holds".into())
        };
        let lent = st.calls.get(&xid)?;
        let copy = |m: Option<&Mr>, n: usize| -> Result<Vec<u8>, String> {
            let mut v = vec![0u8; n];
            m.ok_or("no such chunk")?
                .copy_out(0, &mut v)
                .map_err(|e| e.to_string())?;
            Ok(v)
        };
        let out = match form {
            Err(why) => return Some(self.refuse(&mut st, xid, why)),
            Ok(ReplyForm::Refused(why)) => {
                st.stats.errors += 1;
                Incoming::Refused { xid, why }
            }
            Ok(ReplyForm::Inline { at, write }) => {
                let bulk = match write.map(bulk).transpose() {
                    Ok(b) => b,
                    Err(why) => return Some(self.refuse(&mut st, xid, why)),
                };
                if bulk.is_some() {
                    st.stats.replies_write_chunk += 1;
                } else {
                    st.stats.replies_inline += 1;
                }
                buf.drain(..at);
                Incoming::Reply { msg: buf, bulk }
            }
            Ok(ReplyForm::Long { len, write }) => {
                let (msg, bulk) = match (
                    copy(lent.reply.as_deref(), len),
                    write.map(bulk).transpose(),
                ) {
                    (Ok(m), Ok(b)) => (m, b),
                    (Err(why), _) | (_, Err(why)) => return Some(self.refuse(&mut st, xid, why)),
                };
                st.stats.replies_reply_chunk += 1;
                if bulk.is_some() {
                    st.stats.replies_write_chunk += 1;
                }
                Incoming::Reply { msg, bulk }
            }
        };
        st.granted = credit.clamp(1, self.cfg.credits.max(1));
        self.answer(&mut st, xid);
        Some(out)
    }

    fn refuse(&self, st: &mut State, xid: u32, why: String) -> Incoming {
        self.answer(st, xid);
        // RPCRDMA-74, -75: a reply that breaks the chunk rules is a permanent error.
        Incoming::Refused { xid, why }
    }

    fn answer(&self, st: &mut State, xid: u32) {
        if let Some(l) = st.calls.get_mut(&xid)
            && !l.answered
        {
            l.answered = true;
            st.unanswered -= 1;
            self.room.notify_all();
        }
    }
}

/// Octets of an RDMA_MSG/NOMSG header with these lists.
fn header_len(reads: usize, write: bool, reply: bool) -> usize {
    // Fixed 16, Read list (1 + 20 per segment, then 0), Write list, Reply chunk.
    16 + 4
        + reads * 24
        + 4
        + if write { 4 + 4 + 16 } else { 0 }
        + 4
        + if reply { 4 + 16 } else { 0 }
}

impl ClientTransport for RdmaTransport {
    fn places_results(&self) -> bool {
        true
    }

    fn send(&self, call: &OutCall) -> io::Result<()> {
        // RPCRDMA-66 (RFC 8166 §4.5.4): a call we cannot carry fails here, at once.
        if call.msg.len() > self.cfg.max_message {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an RPC call larger than the connection's max_message",
            ));
        }
        let Some((xid, false)) = peek(&call.msg) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an RPC call",
            ));
        };
        let mut lent = CallMemory::default();
        // Reply resources first (RPCRDMA-76): a Write chunk for the DDP-eligible result
        // (RPCRDMA-26, -48) and a Reply chunk if the reply may exceed the threshold
        // (RPCRDMA-52).
        if let Some(n) = call.reply.ddp {
            // Placed straight into the memory the reply hands over: no copy (RFC 8166
            // §3.4.6 is direct data placement).
            lent.write = Some(self.lend_room(n)?);
        }
        let fixed = header_len(0, lent.write.is_some(), true);
        if call.reply.max + fixed > self.th.reply {
            lent.reply = Some(self.lend_room(call.reply.max.min(self.cfg.max_message))?);
        }
        let write = lent.write.as_ref().map(|m| [Self::segment(m, m.len())]);
        let reply = lent.reply.as_ref().map(|m| [Self::segment(m, m.len())]);
        let write_chunks: Vec<WriteChunk<'_>> =
            write.iter().map(|s| WriteChunk::from(&s[..])).collect();
        let base = header_len(0, write.is_some(), reply.is_some());
        // The call's form (RFC 8166 §3.5): short, chunked, or long.
        let mut read: Vec<ReadSegment> = Vec::new();
        let short = base + call.msg.len() <= self.th.call;
        let reduced = match call.ddp.is_empty() || short {
            false => Some(reduce_all(&call.msg, &call.ddp)),
            true => None,
        };
        let chunked_len = header_len(call.ddp.len(), write.is_some(), reply.is_some());
        let (nomsg, payload): (bool, &[u8]) = match &reduced {
            _ if short => (false, &call.msg),
            Some(v) if chunked_len + v.len() <= self.th.call => {
                // One Read chunk per item, at its Position in the unreduced stream, all
                // lent from one region (RPCRDMA-17, -19); RPCRDMA-24: without padding.
                let parts: Vec<&[u8]> = call.ddp.iter().map(|r| &call.msg[r.clone()]).collect();
                let mr = self.lend_parts(&parts)?;
                let mut off = 0;
                for r in &call.ddp {
                    read.push(ReadSegment {
                        position: r.start as u32,
                        handle: mr.rkey().0,
                        length: r.len() as u32,
                        offset: mr.addr(off),
                    });
                    off += r.len();
                }
                lent.read = Some(mr);
                (false, v)
            }
            _ => {
                // Long Call: the whole message in a Position-Zero Read chunk
                // (RPCRDMA-31, -32, -35).
                let mr = self.lend_parts(&[&call.msg])?;
                read.push(ReadSegment {
                    position: 0,
                    handle: mr.rkey().0,
                    length: call.msg.len() as u32,
                    offset: mr.addr(0),
                });
                lent.read = Some(mr);
                (true, &[])
            }
        };
        // Credits (RPCRDMA-02, -04, -08), and a Send buffer.
        let slot = {
            let mut st = self.state.lock();
            loop {
                if st.closed {
                    return Err(io::ErrorKind::NotConnected.into());
                }
                if st.unanswered < st.granted.min(self.cfg.credits.max(1))
                    && let Some(s) = st.free_slots.pop()
                {
                    // The credit is taken now, under the lock that checked it.
                    st.unanswered += 1;
                    st.stats.max_in_flight = st.stats.max_in_flight.max(st.unanswered);
                    break s;
                }
                self.room.wait_for(&mut st, Duration::from_millis(100));
                if self.ep.qp.state().is_dead() {
                    st.closed = true;
                }
            }
        };
        lent.slot = Some(slot);
        let chunks = Chunks {
            read_list: ReadList::from(&read[..]),
            write_list: WriteList::from(&write_chunks[..]),
            reply_chunk: reply.as_ref().map(|s| WriteChunk::from(&s[..])),
        };
        let credits = self.cfg.credits.max(1);
        let hdr = if nomsg {
            Repr::nomsg(xid, credits, chunks)
        } else {
            Repr::msg(xid, credits, chunks)
        };
        {
            let mut st = self.state.lock();
            if hdr.buffer_len() + payload.len() > self.cfg.inline_send {
                st.free_slots.push(slot);
                st.unanswered -= 1;
                self.room.notify_all();
                return Err(io_err("the RPC-over-RDMA message does not fit a Send"));
            }
            match (nomsg, read.is_empty()) {
                (true, _) => st.stats.calls_long += 1,
                (false, false) => st.stats.calls_chunked += 1,
                (false, true) => st.stats.calls_short += 1,
            }
            // In the table before the Send leaves: the reply may come at once.
            st.calls.insert(xid, lent);
        }
        // Sends are unsignaled but every `signal_every`-th: the reply says the Send buffer
        // is free again; the signaled ones bound the send queue (RDMA verbs retire
        // unsignaled requests with a later signaled one).
        let n = self.sends.fetch_add(1, Ordering::Relaxed);
        let signaled = n % self.signal_every == self.signal_every - 1;
        let sent = self.ep.send(
            slot,
            self.cfg.inline_send,
            &hdr,
            &[payload],
            wrid::SEND | slot as u64,
            None,
            signaled,
        );
        if let Err(e) = sent {
            let mut st = self.state.lock();
            if st.calls.remove(&xid).is_some() {
                st.unanswered -= 1;
                st.free_slots.push(slot);
            }
            self.room.notify_all();
            return Err(e);
        }
        Ok(())
    }

    fn recv(&self) -> io::Result<Option<Incoming>> {
        self.recv_until(None)
    }

    fn recv_timeout(&self, timeout: Duration) -> io::Result<Option<Incoming>> {
        self.recv_until(Some(Instant::now() + timeout))
    }

    fn send_would_wait(&self) -> bool {
        let st = self.state.lock();
        !st.closed
            && (st.unanswered >= st.granted.min(self.cfg.credits.max(1))
                || st.free_slots.is_empty())
    }
    fn release(&self, xid: u32) {
        let mut st = self.state.lock();
        // A call given up before its reply keeps its credit and its memory registered
        // until the reply comes (the responder may still write into it); then it goes.
        if st.calls.get(&xid).is_some_and(|l| l.answered)
            && let Some(l) = st.calls.remove(&xid)
        {
            if let Some(s) = l.slot {
                st.free_slots.push(s);
            }
            self.room.notify_all();
        }
    }

    fn shutdown(&self) {
        let _ = self.ep.qp.disconnect();
        self.close();
    }
}

impl RdmaTransport {
    /// The next message, waiting until `deadline` at most (then a `TimedOut` error).
    fn recv_until(&self, deadline: Option<Instant>) -> io::Result<Option<Incoming>> {
        // One reader at a time (the client's receive role): the vector is reused.
        let mut wcs = std::mem::take(&mut *self.wcs.lock());
        let r = self.recv_into(deadline, &mut wcs);
        *self.wcs.lock() = wcs;
        r
    }

    fn recv_into(
        &self,
        deadline: Option<Instant>,
        wcs: &mut Vec<WorkCompletion>,
    ) -> io::Result<Option<Incoming>> {
        loop {
            if let Some(m) = self.ready.lock().pop_front() {
                return Ok(Some(m));
            }
            if self.state.lock().closed {
                return Ok(None);
            }
            // Every 200 ms at most: a look at the QP.
            let step = Duration::from_millis(200);
            let wait = deadline.map_or(step, |d| {
                d.saturating_duration_since(Instant::now()).min(step)
            });
            wcs.clear();
            match self.ep.cq.wait(1, 32, wait, wcs) {
                Ok(_) => {}
                Err(softrdma::Error::Timeout) => {
                    if self.ep.qp.state().is_dead() {
                        self.close();
                        return Ok(None);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    continue;
                }
                Err(e) => return Err(io_err(e)),
            }
            // Every Receive of the batch posted again before any reply frees a credit.
            let msgs = self.ep.take_received(self.cfg.inline_recv, wcs)?;
            let mut msgs = msgs.into_iter().peekable();
            for (k, wc) in wcs.iter().enumerate() {
                let msg = msgs.next_if(|(at, _)| *at == k).map(|(_, m)| m);
                if let Err(e) = self.on_completion(wc, msg) {
                    self.close();
                    if wc.status == WcStatus::WorkRequestFlushed || wc.opcode == WcOpcode::Recv {
                        return Ok(None);
                    }
                    return Err(e);
                }
            }
        }
    }
}

impl RdmaTransport {
    fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        self.room.notify_all();
    }
}

impl RdmaTransport {
    /// Connections to the RPC-over-RDMA server at `addr` on `ctx`'s device, for
    /// [`Client::with_reconnect`].
    pub fn connector(ctx: &Context, addr: std::net::SocketAddr, cfg: RdmaConfig) -> Connector {
        let ctx = ctx.clone();
        Box::new(move || {
            Ok(Arc::new(RdmaTransport::connect(&ctx, addr, cfg)?) as Arc<dyn ClientTransport>)
        })
    }
}

impl Client {
    /// A client of the RPC-over-RDMA server at `addr`, on `ctx`'s device.
    pub fn connect_rdma(
        ctx: &Context,
        addr: impl ToSocketAddrs,
        cfg: RdmaConfig,
    ) -> io::Result<Client> {
        let t = RdmaTransport::connect(ctx, addr, cfg)?;
        Ok(Client::new(
            Arc::new(t),
            DEFAULT_MAX_IN_FLIGHT.min(cfg.credits.max(1) as usize),
        ))
    }
}
