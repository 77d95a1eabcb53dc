//! The responder's side of RPC-over-RDMA (RFC 8166; the digest's §7.2 and §11): header
//! checks and RDMA_ERROR, Read chunks pulled with RDMA Read, the reply through Write and
//! Reply chunks, a constant grant backed by posted Receives.

// Keyed by our own slot and pull numbers.
use rustc_hash::FxHashMap as HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use softrdma::{
    AcceptParams, Access, Buffer, ConnRequest, Context, Key, Listener, MrAttr, MrFlags, SendFlags,
    SendWr, WcStatus, WorkCompletion,
};
use softrdma_wire::rpcrdma::{Chunks, Header, ReadList, Repr, Segment, WriteChunk, WriteList};
use softrdma_wire::xdr::pad_len;

use super::plan::{CallPlan, Offered, fill, plan_call};
use super::pool::Lease;
use super::{Endpoint, RdmaConfig, Thresholds, io_err, thresholds, wrid};
use crate::buffers::Buffers;
use crate::msg::peek;
use crate::payload::{Payload, removed, splice_with};
use crate::server::{Eligible, OutReply, Server, ServerConfig};

/// A call whose Read chunks are being pulled.
struct Pulling {
    xid: u32,
    /// When its Reads were posted: unanswered past `read_chunk_timeout`, the connection
    /// ends and the buffer is freed.
    since: Instant,
    /// RDMA Reads not yet complete.
    left: usize,
    mr: Lease,
    /// (Position, offset in `mr`, length) per Read chunk.
    chunks: Vec<(u32, usize, usize)>,
    /// The reduced Payload stream (empty for a Long Call).
    payload: Vec<u8>,
    long: bool,
    offered: Offered,
}

struct Sends {
    free: Vec<usize>,
    /// Memory RDMA Writes of a reply read from, kept until its Send completes (Writes are
    /// done before the Send after them).
    held: HashMap<usize, Vec<Lease>>,
}

struct Conn {
    server: Arc<Server>,
    /// This connection's calls on the pool, in turn with other connections'.
    flow: u64,
    ep: Endpoint,
    cfg: RdmaConfig,
    th: Thresholds,
    peer: SocketAddr,
    sends: Mutex<Sends>,
    send_room: Condvar,
    pulling: Mutex<HashMap<u64, Pulling>>,
    next_pull: AtomicU64,
    dead: AtomicBool,
    /// Last completion of any kind: the idle clock, and which connection the limits close.
    active: Mutex<Instant>,
    /// Read chunk targets and Write/Reply chunk sources (shared by the server's connections).
    pool: Arc<Buffers>,
}

/// A running RPC-over-RDMA service; shut down when dropped.
pub struct RdmaServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl RdmaServer {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; connections end as their clients leave or the server is dropped.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Server {
    /// Serves RPC-over-RDMA on `listener` (bound on `ctx`): each connection gets its QP,
    /// `cfg.credits` Receives and the RFC 8797 private data; calls run on the pool.
    pub fn serve_rdma(
        self: &Arc<Self>,
        ctx: &Context,
        listener: Listener,
        cfg: RdmaConfig,
    ) -> io::Result<RdmaServer> {
        let cfg = cfg.normalized();
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let (server, ctx, stop2) = (self.clone(), ctx.clone(), stop.clone());
        let accept = std::thread::Builder::new()
            .name("rpc-rdma-accept".into())
            .spawn(move || {
                let mut conns: Vec<(Arc<Conn>, JoinHandle<()>)> = Vec::new();
                let pool = server.buffers().clone();
                while !stop2.load(Ordering::Acquire) {
                    let Ok(req) = listener.accept_timeout(Duration::from_millis(100)) else {
                        conns.retain(|(_, h)| !h.is_finished());
                        continue;
                    };
                    conns.retain(|(_, h)| !h.is_finished());
                    make_room(&conns, server.config(), req.peer_addr());
                    match Conn::accept(&server, &ctx, req, cfg, &pool) {
                        Ok(c) => {
                            let c2 = c.clone();
                            if let Ok(h) = std::thread::Builder::new()
                                .name("rpc-rdma-conn".into())
                                .spawn(move || c2.run())
                            {
                                conns.push((c, h));
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "RPC-over-RDMA accept failed"),
                    }
                }
                for (c, h) in conns {
                    c.end();
                    let _ = h.join();
                }
            })?;
        Ok(RdmaServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }
}

/// Before a connection from `peer` is accepted: room under the connection limits, the
/// least recently active connections ended ([`ServerConfig::closing_for`]).
fn make_room(conns: &[(Arc<Conn>, JoinHandle<()>)], cfg: &ServerConfig, peer: SocketAddr) {
    let live: Vec<(usize, std::net::IpAddr)> = conns
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| !c.dead.load(Ordering::Acquire))
        .map(|(i, (c, _))| (i, c.peer.ip()))
        .collect();
    for i in cfg.closing_for(peer.ip(), &live, |i| *conns[i].0.active.lock()) {
        let c = &conns[i].0;
        tracing::info!(%peer, old = %c.peer, "RPC-over-RDMA connections at the limit: the least active closed");
        c.end();
    }
}

impl Conn {
    /// Ends the connection from any thread: its own thread sees it within a tick.
    fn end(&self) {
        self.dead.store(true, Ordering::Release);
        let _ = self.ep.qp.disconnect();
    }

    fn accept(
        server: &Arc<Server>,
        ctx: &Context,
        req: ConnRequest,
        cfg: RdmaConfig,
        pool: &Arc<Buffers>,
    ) -> io::Result<Arc<Conn>> {
        let credits = cfg.credits.max(1);
        let th = thresholds(&cfg, req.private_data(), false);
        let peer = req.peer_addr();
        // RPCRDMA-05: every credit granted has its Receive posted before the grant is sent.
        let ep = Endpoint::new(ctx, &cfg, 4 * credits + 192)?;
        req.accept(
            &ep.qp,
            AcceptParams {
                private_data: cfg.private_data(),
                roce: softrdma::roce::AcceptParams {
                    pmtu: cfg.roce_pmtu,
                },
                ..AcceptParams::default()
            },
        )
        .map_err(io_err)?;
        Ok(Arc::new(Conn {
            server: server.clone(),
            flow: server.new_flow(),
            ep,
            cfg,
            th,
            peer,
            sends: Mutex::new(Sends {
                free: (0..credits as usize).rev().collect(),
                held: HashMap::default(),
            }),
            send_room: Condvar::new(),
            pulling: Mutex::new(HashMap::default()),
            next_pull: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            active: Mutex::new(Instant::now()),
            pool: pool.clone(),
        }))
    }

    /// Runs the connection's completions until it ends.
    fn run(self: Arc<Self>) {
        let mut wcs = Vec::with_capacity(64);
        let scfg = *self.server.config();
        // Deadlines are looked at a few times within the shortest of them.
        let tick = (scfg.read_chunk_timeout.min(scfg.idle_timeout) / 4)
            .clamp(Duration::from_millis(5), Duration::from_millis(200));
        while !self.dead.load(Ordering::Acquire) {
            wcs.clear();
            match self.ep.cq.wait(1, 64, tick, &mut wcs) {
                Ok(_) => *self.active.lock() = Instant::now(),
                Err(softrdma::Error::Timeout) => {
                    if self.ep.qp.state().is_dead() || self.overdue(&scfg) {
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            }
            // Every Receive of the batch posted again before any of its calls is answered
            // (a reply grants credits, each backed by a posted Receive, RPCRDMA-05).
            let msgs = match self.ep.take_received(self.cfg.inline_recv, &wcs) {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, error = %e, "RPC-over-RDMA connection ends");
                    break;
                }
            };
            let mut msgs = msgs.into_iter().peekable();
            for (k, wc) in wcs.iter().enumerate() {
                let msg = msgs.next_if(|(at, _)| *at == k).map(|(_, m)| m);
                if let Err(e) = self.on_completion(wc, msg.as_deref()) {
                    tracing::debug!(peer = %self.peer, error = %e, "RPC-over-RDMA connection ends");
                    self.dead.store(true, Ordering::Release);
                    break;
                }
            }
        }
        self.end();
        // The chunk buffers of calls never pulled whole go back now, not when the last
        // reply in progress lets the connection go.
        self.pulling.lock().clear();
        self.send_room.notify_all();
    }

    /// RDMA Reads unanswered past `read_chunk_timeout` (the requester holds the chunk
    /// buffers it leased us: RFC 8166 §3.4 puts no bound on it, we do), or nothing at all
    /// for `idle_timeout`: the connection is to end.
    fn overdue(&self, cfg: &ServerConfig) -> bool {
        let now = Instant::now();
        let pulling = self.pulling.lock();
        if let Some(p) = pulling
            .values()
            .find(|p| now.duration_since(p.since) > cfg.read_chunk_timeout)
        {
            tracing::info!(peer = %self.peer, xid = p.xid, "RPC-over-RDMA Read chunk unanswered past read_chunk_timeout: connection ended");
            self.server
                .rdma_stats()
                .read_timeouts
                .fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let busy = !pulling.is_empty() || {
            let s = self.sends.lock();
            s.free.len() < self.credits() as usize
        };
        if !busy && now.duration_since(*self.active.lock()) > cfg.idle_timeout {
            tracing::debug!(peer = %self.peer, "RPC-over-RDMA connection idle past idle_timeout: ended");
            self.server
                .rdma_stats()
                .idle_closed
                .fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    fn on_completion(self: &Arc<Self>, wc: &WorkCompletion, msg: Option<&[u8]>) -> io::Result<()> {
        if wc.status != WcStatus::Success {
            // RPCRDMA-65, -68: a failed Read, Write or Send (a bad chunk, a lost peer) ends
            // the connection; the requester retransmits on a new one.
            return Err(io_err(format!("{:?} completed {:?}", wc.opcode, wc.status)));
        }
        let i = wrid::index(wc.wr_id);
        match wrid::kind(wc.wr_id) {
            wrid::RECV => match msg {
                Some(m) => self.on_call(m),
                None => Err(io_err("a Receive completed without its message")),
            },
            wrid::READ => {
                let done = {
                    let mut p = self.pulling.lock();
                    match p.get_mut(&i) {
                        Some(c) => {
                            c.left -= 1;
                            if c.left == 0 { p.remove(&i) } else { None }
                        }
                        None => None,
                    }
                };
                if let Some(c) = done {
                    self.pulled(c)?;
                }
                Ok(())
            }
            wrid::SEND => {
                let mut s = self.sends.lock();
                s.held.remove(&(i as usize));
                s.free.push(i as usize);
                self.send_room.notify_one();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A message from the requester (RFC 8166 §4.5 for everything that is wrong with it).
    fn on_call(self: &Arc<Self>, msg: &[u8]) -> io::Result<()> {
        let p = match plan_call(msg, self.cfg.max_message) {
            Ok(p) => p,
            Err(r) => {
                return match r.answer(msg, self.credits()) {
                    Some(e) => self.refuse(e),
                    None => Ok(()),
                };
            }
        };
        let CallPlan {
            xid,
            long,
            payload,
            reads,
            read_len: total,
            offered,
        } = p;
        if reads.is_empty() {
            self.dispatch(xid, payload, offered);
            return Ok(());
        }
        // RPCRDMA-73: a Read chunk where the program's binding has no DDP-eligible argument
        // is refused before anything is pulled.
        if !long {
            let ok = match self.server.registry().eligible_argument(&payload) {
                Eligible::Unbound => true,
                Eligible::Nothing => false,
                Eligible::At(at) => reads.iter().all(|(pos, _)| *pos as usize == at),
            };
            if !ok {
                return self.refuse(err_chunk_for(xid, self.credits()));
            }
        }
        // RPCRDMA-22: pull the chunks (segments in list order, one chunk per Position).
        let mr = Lease::new(
            &self.pool,
            &self.ep.pd,
            total,
            Access::LOCAL_WRITE,
            MrFlags::empty(),
        )
        .map_err(io_err)?;
        let id = self.next_pull.fetch_add(1, Ordering::Relaxed);
        let mut chunks: Vec<(u32, usize, usize)> = Vec::new();
        let mut wrs = Vec::new();
        let mut off = 0;
        for s in reads.iter().flat_map(|(_, segs)| segs) {
            match chunks.last_mut() {
                Some(c) if c.0 == s.position => c.2 += s.length as usize,
                _ => chunks.push((s.position, off, s.length as usize)),
            }
            if s.length > 0 {
                wrs.push(
                    SendWr::read(
                        wrid::READ | id,
                        Some(mr.sge(off, s.length)),
                        Key(s.handle),
                        s.offset,
                    )
                    .with_flags(SendFlags::SIGNALED),
                );
            }
            off += s.length as usize;
        }
        if wrs.is_empty() {
            let c = Pulling {
                xid,
                since: Instant::now(),
                left: 0,
                mr,
                chunks,
                payload,
                long,
                offered,
            };
            return self.pulled(c);
        }
        self.pulling.lock().insert(
            id,
            Pulling {
                xid,
                since: Instant::now(),
                left: wrs.len(),
                mr,
                chunks,
                payload,
                long,
                offered,
            },
        );
        self.ep.qp.post_send_list(wrs).map_err(|(_, e)| io_err(e))
    }

    /// Every Read chunk of a call arrived: the call, whole, goes to the pool.
    fn pulled(self: &Arc<Self>, c: Pulling) -> io::Result<()> {
        // Read in place: the chunks' octets are copied once, into the call (in kept memory,
        // given back when the call is answered).
        let msg = {
            let g = c.mr.read();
            let data = &g[c.mr.buffer_offset()..c.mr.buffer_offset() + c.mr.len()];
            if c.long {
                let len = c.chunks.iter().map(|x| x.2).sum::<usize>();
                let mut v = self.pool.vec(len);
                v.extend_from_slice(&data[..len]);
                Some(v)
            } else {
                let parts: Vec<(u32, &[u8])> = c
                    .chunks
                    .iter()
                    .map(|&(pos, off, len)| (pos, &data[off..off + len]))
                    .collect();
                splice_with(&c.payload, &parts, self.cfg.max_message, |n| {
                    self.pool.vec(n)
                })
                .ok()
            }
        };
        let Some(msg) = msg else {
            return self.refuse(err_chunk_for(c.xid, self.credits()));
        };
        if peek(&msg) != Some((c.xid, false)) {
            return self.refuse(err_chunk_for(c.xid, self.credits()));
        }
        self.dispatch(c.xid, msg, c.offered);
        Ok(())
    }

    /// Runs the call: in this thread (the connection's) if its procedure is marked inline
    /// and a send slot is free for the reply, else on the pool.
    fn dispatch(self: &Arc<Self>, xid: u32, msg: Vec<u8>, offered: Offered) {
        if self.server.registry().runs_inline(&msg)
            && let Some(mut r) = self.try_reserve()
        {
            self.answer(xid, &msg, &offered, &mut r);
            self.pool.give(msg);
            return;
        }
        let conn = self.clone();
        self.server.spawn_in(self.flow, move || {
            let mut r = Reserved::none(&conn);
            conn.answer(xid, &msg, &offered, &mut r);
            conn.pool.give(msg);
        });
    }

    /// Executes call `msg` and sends its reply.
    fn answer(&self, xid: u32, msg: &[u8], offered: &Offered, slot: &mut Reserved<'_>) {
        if let Some(out) = self
            .server
            .registry()
            .dispatch(msg, Some(self.peer), &self.pool)
            && let Err(e) = self.reply(xid, out, offered, slot)
        {
            // RPCRDMA-68: a reply that cannot be sent ends the connection.
            tracing::debug!(peer = %self.peer, error = %e, "RPC-over-RDMA reply lost");
            self.end();
        }
    }

    /// A send slot taken now, if one is free.
    fn try_reserve(&self) -> Option<Reserved<'_>> {
        let i = self.sends.lock().free.pop()?;
        Some(Reserved {
            conn: self,
            slot: Some(i),
        })
    }

    /// RDMA_ERROR `e` from the connection's thread: with a free slot at once, else as any
    /// reply does (waiting for one).
    fn refuse(&self, e: Repr<'_>) -> io::Result<()> {
        let mut r = self.try_reserve().unwrap_or(Reserved::none(self));
        self.send_error(e, &mut r)
    }

    fn credits(&self) -> u32 {
        self.cfg.credits.max(1)
    }

    /// RDMA-Writes the whole of `mr` through `segs` in order (RPCRDMA-27); the lengths
    /// written per segment, or `None` if they hold less. The Writes go out with the reply's
    /// Send, in one submission; `mr` is held until that Send completes (the Writes before
    /// it are then done).
    fn write_through(
        &self,
        mr: Lease,
        segs: &[Segment],
        out: &mut Outgoing,
    ) -> Option<Vec<Segment>> {
        let filled = fill(mr.len(), segs)?;
        let mut off = 0;
        for s in filled.iter().filter(|s| s.length > 0) {
            // Unsignaled: the reply's Send after it completes only once it is done (a
            // failed Write still completes, with its error).
            out.wrs.push(
                SendWr::write(
                    wrid::WRITE,
                    [mr.sge(off, s.length)],
                    Key(s.handle),
                    s.offset,
                )
                .with_flags(SendFlags::empty()),
            );
            off += s.length as usize;
        }
        out.held.push(mr);
        Some(filled)
    }

    /// Sends the reply the way RFC 8166 §4.3 says (the digest's §7.2).
    fn reply(
        &self,
        xid: u32,
        out: OutReply,
        offered: &Offered,
        slot: &mut Reserved<'_>,
    ) -> io::Result<()> {
        let mut held = Outgoing::default();
        let OutReply { head, body, .. } = out;
        // Write list: the DDP-eligible results into the Write chunks in order, one per
        // chunk (RPCRDMA-45, -46): a union arm without its eligible item leaves the chunk
        // to the next one (RPCRDMA-47); chunks left over come back unused (RPCRDMA-49), an
        // empty one is echoed empty with its result inline (RPCRDMA-51), results past the
        // last chunk stay inline.
        let mut writes: Vec<Vec<Segment>> = offered
            .writes
            .iter()
            .map(|c| c.iter().map(|s| Segment { length: 0, ..*s }).collect())
            .collect();
        // The results, reduced or whole: the results' memory itself, registered for the
        // Writes (no copy); the rest of the message is read from it. A shared item (the
        // last) is written from its own memory, or put back inline if no chunk takes it.
        let Payload { xdr, ddp, shared } = body;
        let results = Buffer::adopt(xdr);
        let mut cuts = Vec::new();
        let mut shared_inline = shared.as_ref();
        for (i, chunk) in offered.writes.iter().enumerate() {
            if chunk.is_empty() {
                continue;
            }
            let (mem, range) = match (ddp.get(i), &shared) {
                (Some(r), _) => (results.clone(), r.clone()),
                (None, Some(s)) if i == ddp.len() => (s.data.clone(), s.range.clone()),
                _ => break,
            };
            let mr = self
                .ep
                .pd
                .reg_mr_with(
                    mem,
                    MrAttr {
                        range,
                        iova: 0,
                        access: Access::empty(),
                        flags: MrFlags::empty(),
                    },
                )
                .map_err(io_err)?;
            match self.write_through(Lease::over(mr, Some(&self.pool)), chunk, &mut held) {
                Some(segs) => {
                    writes[i] = segs;
                    // RPCRDMA-18: the data and its padding leave the stream.
                    match ddp.get(i) {
                        Some(r) => cuts.push(removed(results.len(), r)),
                        None => shared_inline = None,
                    }
                }
                None => return self.send_error(err_chunk_for(xid, self.credits()), slot),
            }
        }
        let g = results.read();
        let sg = shared_inline.map(|s| (s, s.data.read()));
        let mut parts: Vec<&[u8]> = vec![&head];
        let mut at = 0;
        for c in &cuts {
            parts.push(&g[at..c.start]);
            at = c.end;
        }
        if let Some((s, d)) = &sg {
            let data = &d[s.range.clone()];
            parts.push(&g[at..s.at]);
            parts.push(data);
            parts.push(&[0u8; 3][..pad_len(data.len())]);
            at = s.at;
        }
        parts.push(&g[at..]);
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let write_chunks: Vec<WriteChunk<'_>> =
            writes.iter().map(|c| WriteChunk::from(&c[..])).collect();
        let inline_hdr = Repr::msg(
            xid,
            self.credits(),
            Chunks {
                read_list: ReadList::EMPTY, // RPCRDMA-44
                write_list: WriteList::from(&write_chunks[..]),
                reply_chunk: None,
            },
        );
        // Send With Invalidate of the call's one handle when the client takes it (RFC 8797).
        let inv = offered
            .invalidate
            .filter(|_| self.th.remote_invalidate && self.cfg.remote_invalidate);
        if inline_hdr.buffer_len() + len <= self.th.reply.min(self.cfg.inline_send) {
            let sent = self.send(&inline_hdr, &parts, held, inv, slot);
            drop(parts);
            drop((g, sg));
            // Without Writes the results are done with now (with them, the last region's
            // lease gives them back once the Send completes).
            self.pool.recycle(results);
            return sent;
        }
        // Long Reply (RPCRDMA-34, -54): the message through the Reply chunk.
        let Some(rc) = offered.reply.as_ref() else {
            return self.send_error(err_chunk_for(xid, self.credits()), slot);
        };
        let mr = Lease::new(
            &self.pool,
            &self.ep.pd,
            len,
            Access::empty(),
            MrFlags::empty(),
        )
        .map_err(io_err)?;
        {
            let mut w = mr.write();
            let mut at = mr.buffer_offset();
            for p in &parts {
                w[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        }
        drop((g, sg));
        let Some(segs) = self.write_through(mr, rc, &mut held) else {
            return self.send_error(err_chunk_for(xid, self.credits()), slot);
        };
        let hdr = Repr::nomsg(
            xid,
            self.credits(),
            Chunks {
                read_list: ReadList::EMPTY,
                write_list: WriteList::from(&write_chunks[..]),
                reply_chunk: Some(WriteChunk::from(&segs[..])),
            },
        );
        self.send(&hdr, &[], held, inv, slot)
    }

    fn send_error(&self, r: Repr<'_>, slot: &mut Reserved<'_>) -> io::Result<()> {
        self.send(&r, &[], Outgoing::default(), None, slot)
    }

    /// One Send of `hdr` and `payload` from a send slot: the one reserved, else a free one
    /// (waiting for one).
    fn send(
        &self,
        hdr: &Repr<'_>,
        parts: &[&[u8]],
        out: Outgoing,
        invalidate: Option<u32>,
        reserved: &mut Reserved<'_>,
    ) -> io::Result<()> {
        if hdr.buffer_len() + parts.iter().map(|p| p.len()).sum::<usize>() > self.cfg.inline_send {
            return Err(io_err("an RPC-over-RDMA message larger than a Send"));
        }
        let Outgoing { held, mut wrs } = out;
        let slot = if let Some(i) = reserved.slot.take() {
            self.sends.lock().held.insert(i, held);
            i
        } else {
            let mut s = self.sends.lock();
            loop {
                if self.dead.load(Ordering::Acquire) {
                    return Err(io::ErrorKind::NotConnected.into());
                }
                if let Some(i) = s.free.pop() {
                    s.held.insert(i, held);
                    break i;
                }
                self.send_room.wait_for(&mut s, Duration::from_millis(100));
            }
        };
        let posted = self
            .ep
            .send_wr(
                slot,
                self.cfg.inline_send,
                hdr,
                parts,
                wrid::SEND | slot as u64,
                invalidate,
            )
            .and_then(|send| {
                if wrs.is_empty() {
                    return self.ep.qp.post_send(send).map_err(io_err);
                }
                wrs.push(send);
                self.ep.qp.post_send_list(wrs).map_err(|(_, e)| io_err(e))
            });
        if posted.is_err() {
            // Nothing will complete in this slot: it is free again.
            let mut s = self.sends.lock();
            s.held.remove(&slot);
            s.free.push(slot);
        }
        posted
    }
}

/// A send slot taken before a reply is built, by the connection's own thread: it never
/// waits for one, being the thread that frees them (their Sends' completions). Back to the
/// free list if no Send used it.
struct Reserved<'a> {
    conn: &'a Conn,
    slot: Option<usize>,
}

impl<'a> Reserved<'a> {
    fn none(conn: &'a Conn) -> Reserved<'a> {
        Reserved { conn, slot: None }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            self.conn.sends.lock().free.push(i);
            self.conn.send_room.notify_one();
        }
    }
}

/// A reply's RDMA Writes and the memory they read, for the one submission with its Send.
#[derive(Default)]
struct Outgoing {
    held: Vec<Lease>,
    wrs: Vec<SendWr>,
}

/// ERR_CHUNK for call `xid` (RPCRDMA-59: its xid and version 1 echoed).
fn err_chunk_for(xid: u32, credits: u32) -> Repr<'static> {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&xid.to_be_bytes());
    b[4..8].copy_from_slice(&1u32.to_be_bytes());
    let h = Header::new_unchecked(&b[..]);
    Repr::err_chunk(&h, credits)
}
