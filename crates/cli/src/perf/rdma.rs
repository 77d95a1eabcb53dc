//! The RDMA side of `softrdma perf`: one connection per test, the test's parameters in the
//! MPA private data (see [`super::proto`]).
//!
//! Bandwidth: the client keeps `tx_depth` requests outstanding, signals one in `cq_mod`, and
//! ends with a one-octet RDMA Read of the server's buffer. A Read Response comes after every
//! earlier message was placed at the server, so the time runs until delivery is confirmed,
//! not until the last request left. Send bandwidth needs flow control (iWARP has no RNR: a
//! Send that finds no receive kills the stream), so the server returns credits, a small Send
//! for every quarter of its receive window it posted again.
//!
//! Latency: Send is a ping-pong (half the round trip, as ib_send_lat), RDMA Write has both
//! sides poll the last octet of their buffer (half the round trip, as ib_write_lat), RDMA
//! Read is the time of one Read (a full round trip, as ib_read_lat).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use softrdma::{
    AcceptParams, Access, AsyncEvent, ConnRequest, ConnectParams, ConnectionInfo, Context, Cq,
    Error, FpduSize, Listener, Mr, Pd, Qp, QpCap, QpInitAttr, RecvWr, SendFlags, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

use super::lat::{LatLoop, SAFETY, check};
use super::proto::{RemoteBuf, Reply, Request, Test};
use super::stats::Bw;
use super::{Limit, PerfError};
use crate::verbs_util::{WaitMode, spin_until, wait_some};

/// Rights of the buffers a peer reads or writes.
const REMOTE: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// wr_id bit of the client's credit receives.
const CREDIT: u64 = 1 << 63;
/// wr_id of the final, delivery-confirming Read.
const SYNC: u64 = 1 << 62;
/// Receives the client keeps posted for credit messages.
const CREDIT_SLOTS: u32 = 64;
/// Largest message sent INLINE (copied at post time).
const INLINE_MAX: u32 = 256;

/// How connections are made and completions awaited.
#[derive(Clone, Copy, Debug)]
pub struct RdmaOpts {
    /// Ask for MPA CRC.
    pub crc: bool,
    /// FPDU size policy.
    pub fpdu: FpduSize,
    /// Requests outstanding (bandwidth).
    pub tx_depth: u32,
    /// Receives the server keeps posted (Send bandwidth).
    pub rx_depth: u32,
    /// Blocking or busy-polling waits.
    pub wait: WaitMode,
}

/// The client's end of a session: one context, one connection per test.
pub struct Client {
    ctx: Context,
    addr: SocketAddr,
    opts: RdmaOpts,
    /// The first test's connection (what MPA negotiated, the MULPDU).
    pub first_conn: Option<ConnectionInfo>,
}

/// A connected test.
struct TestQp {
    qp: Qp,
    cq: Cq,
    server: RemoteBuf,
}

impl Client {
    /// A client of the server at `addr`.
    pub fn new(addr: SocketAddr, opts: RdmaOpts) -> Result<Client, PerfError> {
        Ok(Client {
            ctx: Context::open()?,
            addr,
            opts,
            first_conn: None,
        })
    }

    fn connect(
        &mut self,
        pd: &Pd,
        cap: QpCap,
        req: Request,
        prepost: impl FnOnce(&Qp) -> Result<(), Error>,
    ) -> Result<TestQp, PerfError> {
        let cq = self
            .ctx
            .create_cq((cap.max_send_wr + cap.max_recv_wr) as usize, None);
        let qp = pd.create_qp(QpInitAttr {
            cap,
            ..QpInitAttr::new(&cq, &cq)
        })?;
        prepost(&qp)?;
        let params = ConnectParams {
            private_data: req.emit(),
            ird: 16,
            ord: self.opts.tx_depth.clamp(1, 16383) as u16,
            crc: self.opts.crc,
            fpdu: self.opts.fpdu,
            ..ConnectParams::default()
        };
        let conn = qp.connect(self.addr, params)?;
        let reply = Reply::parse(&conn.peer_private_data).ok_or_else(|| {
            PerfError::Protocol("the server's MPA Reply is not a softrdma perf reply".into())
        })?;
        if self.first_conn.is_none() {
            self.first_conn = Some(conn);
        }
        Ok(TestQp {
            qp,
            cq,
            server: reply.buf,
        })
    }

    /// Bandwidth of `test` (Write, Read or Send) with `size`-octet messages.
    pub fn bw(&mut self, test: Test, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        let o = self.opts;
        let tx_depth = u64::from(o.tx_depth.max(1));
        let cq_mod = (tx_depth / 4).clamp(1, 100);
        let send = test == Test::SendBw;
        let pd = self.ctx.alloc_pd();
        let local = pd.alloc_mr(size as usize, REMOTE)?;
        local.write()[..size as usize].fill(0x5a);
        let credits = pd.alloc_mr(CREDIT_SLOTS as usize * 8, Access::LOCAL_WRITE)?;
        let cap = QpCap {
            max_send_wr: o.tx_depth.max(1) + 2,
            max_recv_wr: CREDIT_SLOTS,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let req = Request {
            test,
            size,
            rx_depth: o.rx_depth,
            buf: RemoteBuf::default(),
        };
        let t = self.connect(&pd, cap, req, |qp| {
            if send {
                for i in 0..CREDIT_SLOTS {
                    qp.post_recv(RecvWr::new(
                        CREDIT | u64::from(i),
                        vec![credits.sge(i as usize * 8, 8)],
                    ))?;
                }
            }
            Ok(())
        })?;
        if t.server.len < size.max(1) {
            return Err(PerfError::Protocol(
                "the server's buffer is too small".into(),
            ));
        }
        let wr = |id: u64, signaled: bool| {
            let sge = vec![local.sge(0, size)];
            let wr = match test {
                Test::WriteBw => {
                    SendWr::write(id, sge, softrdma::Key(t.server.rkey), t.server.addr)
                }
                Test::ReadBw => SendWr::read(
                    id,
                    Some(local.sge(0, size)),
                    softrdma::Key(t.server.rkey),
                    t.server.addr,
                ),
                _ => SendWr::send(id, sge),
            };
            wr.with_flags(if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            })
        };
        let total = match limit {
            Limit::Iters(n) => n,
            Limit::Duration(_) => u64::MAX,
        };
        let mut allowed = if send {
            u64::from(o.rx_depth)
        } else {
            u64::MAX
        };
        let (mut posted, mut retired) = (0u64, 0u64);
        let mut wcs = Vec::with_capacity(128);
        let mut stopping = false;
        let start = Instant::now();
        let deadline = match limit {
            Limit::Duration(d) => Some(start + d),
            Limit::Iters(_) => None,
        };
        loop {
            if !stopping {
                while posted < total && posted - retired < tx_depth && posted < allowed {
                    t.qp.post_send(wr(posted, (posted + 1) % cq_mod == 0))?;
                    posted += 1;
                }
                if posted >= total || deadline.is_some_and(|d| Instant::now() >= d) {
                    stopping = true;
                    // One octet read back: its response follows every earlier message.
                    t.qp.post_send(SendWr::read(
                        SYNC,
                        Some(local.sge(0, 1)),
                        softrdma::Key(t.server.rkey),
                        t.server.addr,
                    ))?;
                }
            }
            wcs.clear();
            wait_some(&t.cq, o.wait, 128, SAFETY, &mut wcs)?;
            let mut done = false;
            for wc in &wcs {
                check(wc)?;
                if wc.wr_id & CREDIT != 0 {
                    let slot = (wc.wr_id & !CREDIT) as usize;
                    let mut c = [0u8; 8];
                    credits.copy_out(slot * 8, &mut c)?;
                    allowed = allowed.max(u64::from(o.rx_depth) + u64::from_le_bytes(c));
                    t.qp.post_recv(RecvWr::new(wc.wr_id, vec![credits.sge(slot * 8, 8)]))?;
                } else if wc.wr_id == SYNC {
                    done = true;
                } else {
                    retired = retired.max(wc.wr_id + 1);
                }
            }
            if done {
                break;
            }
        }
        let elapsed = start.elapsed();
        let _ = t.qp.disconnect();
        Ok(Bw::new(posted, size, elapsed))
    }

    /// Latency samples of `test` (nanoseconds per round trip; one Read for Read).
    pub fn lat(
        &mut self,
        test: Test,
        size: u32,
        limit: Limit,
        warmup: u64,
    ) -> Result<Vec<u64>, PerfError> {
        let o = self.opts;
        let n = size as usize;
        let pd = self.ctx.alloc_pd();
        let local = pd.alloc_mr(n, REMOTE)?;
        local.write()[..n].fill(0x5a);
        let sink = pd.alloc_mr(n, REMOTE)?;
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        };
        let req = Request {
            test,
            size,
            rx_depth: 0,
            buf: RemoteBuf {
                addr: sink.addr(0),
                rkey: sink.rkey().0,
                len: size,
            },
        };
        let t = self.connect(&pd, cap, req, |qp| {
            if test == Test::SendLat {
                qp.post_recv(RecvWr::new(1, vec![sink.sge(0, size)]))?;
            }
            Ok(())
        })?;
        if t.server.len < size {
            return Err(PerfError::Protocol(
                "the server's buffer is too small".into(),
            ));
        }
        let rkey = softrdma::Key(t.server.rkey);
        let inline = if size <= INLINE_MAX {
            SendFlags::INLINE
        } else {
            SendFlags::empty()
        };
        let samples = LatLoop {
            qp: &t.qp,
            cq: &t.cq,
            local: &local,
            sink: &sink,
            rkey,
            raddr: t.server.addr,
            flags: inline,
            wait: o.wait,
        }
        .run(test, size, limit, warmup);
        let _ = t.qp.disconnect();
        samples
    }

    /// Ends the session: a request the server rejects.
    pub fn bye(&self) {
        let pd = self.ctx.alloc_pd();
        let cq = self.ctx.create_cq(4, None);
        let Ok(qp) = pd.create_qp(QpInitAttr::new(&cq, &cq)) else {
            return;
        };
        let req = Request {
            test: Test::Bye,
            size: 0,
            rx_depth: 0,
            buf: RemoteBuf::default(),
        };
        let params = ConnectParams {
            private_data: req.emit(),
            crc: self.opts.crc,
            ..ConnectParams::default()
        };
        let _ = qp.connect(self.addr, params);
    }
}

/// What the server does.
#[derive(Clone, Copy, Debug)]
pub struct ServerOpts {
    /// FPDU size policy.
    pub fpdu: FpduSize,
    /// Print a line per test.
    pub log: bool,
    /// Blocking or busy-polling waits.
    pub wait: WaitMode,
}

/// Serves tests from `listener` until a client's Bye (with `once`) or forever.
pub fn serve(
    ctx: &Context,
    listener: &Listener,
    opts: ServerOpts,
    once: bool,
) -> Result<(), PerfError> {
    loop {
        let req = listener.accept()?;
        let peer = req.peer_addr();
        let Some(r) = Request::parse(req.private_data()) else {
            eprintln!("softrdma perf: {peer}: not a softrdma perf request, rejected");
            let _ = req.reject(b"softrdma perf: unknown request");
            continue;
        };
        if r.test == Test::Bye {
            let _ = req.reject(b"bye");
            if opts.log {
                eprintln!("softrdma perf: {peer}: session done");
            }
            if once {
                return Ok(());
            }
            continue;
        }
        if opts.log {
            eprintln!("softrdma perf: {peer}: {} {} octets", r.test, r.size);
        }
        if let Err(e) = serve_test(ctx, req, r, opts) {
            eprintln!("softrdma perf: {peer}: {}: {e}", r.test);
        }
    }
}

/// Waits until `qp` is dead (the client closed), without a deadline while it lives.
fn wait_dead(ctx: &Context, qp: &Qp) {
    while !qp.state().is_dead() {
        if let Some(AsyncEvent::Disconnected { qp_num }) =
            ctx.get_async_event(Duration::from_secs(1))
            && qp_num == qp.qp_num()
        {
            return;
        }
    }
}

fn serve_test(ctx: &Context, req: ConnRequest, r: Request, o: ServerOpts) -> Result<(), PerfError> {
    let size = r.size.max(1);
    let n = size as usize;
    let pd = ctx.alloc_pd();
    let rx_depth = match r.test {
        Test::SendBw => r.rx_depth.clamp(1, 1 << 16),
        Test::SendLat => 4,
        _ => 1,
    };
    let cq = ctx.create_cq(rx_depth as usize + 256, None);
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
    let recv = |qp: &Qp, id: u64| qp.post_recv(RecvWr::new(id, vec![buf.sge(0, size)]));
    if matches!(r.test, Test::SendBw | Test::SendLat) {
        for i in 0..rx_depth {
            recv(&qp, u64::from(i))?;
        }
    }
    let (peer_ird, peer_ord) = req.peer_ird_ord().unwrap_or((16, 16));
    let reply = Reply {
        buf: RemoteBuf {
            addr: buf.addr(0),
            rkey: buf.rkey().0,
            len: size,
        },
    };
    req.accept(
        &qp,
        AcceptParams {
            private_data: reply.emit(),
            ird: peer_ord.max(1),
            ord: peer_ird,
            fpdu: o.fpdu,
            ..AcceptParams::default()
        },
    )?;
    match r.test {
        Test::SendBw => serve_send_bw(&qp, &cq, &buf, &src, rx_depth, o.wait),
        Test::SendLat => serve_send_lat(&qp, &cq, &buf, size, o.wait),
        Test::WriteLat => serve_write_lat(&qp, &cq, &buf, &src, size, r.buf),
        _ => {
            wait_dead(ctx, &qp);
            Ok(())
        }
    }
}

/// Waits for completions while the QP lives; `None` once it is dead and drained.
fn next_wcs(qp: &Qp, cq: &Cq, wait: WaitMode, wcs: &mut Vec<WorkCompletion>) -> Option<()> {
    loop {
        wcs.clear();
        match wait_some(cq, wait, 128, Duration::from_secs(1), wcs) {
            Ok(_) => return Some(()),
            Err(_) if qp.state().is_dead() => return None,
            Err(_) => {}
        }
    }
}

fn serve_send_bw(
    qp: &Qp,
    cq: &Cq,
    buf: &Mr,
    src: &Mr,
    rx_depth: u32,
    wait: WaitMode,
) -> Result<(), PerfError> {
    let batch = u64::from((rx_depth / 4).max(1));
    let mut rcnt = 0u64;
    let mut wcs = Vec::with_capacity(128);
    while next_wcs(qp, cq, wait, &mut wcs).is_some() {
        for wc in &wcs {
            if wc.status == WcStatus::WorkRequestFlushed {
                return Ok(());
            }
            check(wc)?;
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            qp.post_recv(RecvWr::new(wc.wr_id, vec![buf.sge(0, buf.len() as u32)]))?;
            rcnt += 1;
            if rcnt.is_multiple_of(batch) {
                // INLINE: the count is copied now, so `src` may change at once.
                src.copy_in(0, &rcnt.to_le_bytes())?;
                qp.post_send(
                    SendWr::send(rcnt, vec![src.sge(0, 8)]).with_flags(SendFlags::INLINE),
                )?;
            }
        }
    }
    Ok(())
}

fn serve_send_lat(qp: &Qp, cq: &Cq, buf: &Mr, size: u32, wait: WaitMode) -> Result<(), PerfError> {
    let inline = if size <= INLINE_MAX {
        SendFlags::INLINE
    } else {
        SendFlags::empty()
    };
    let mut wcs = Vec::with_capacity(16);
    while next_wcs(qp, cq, wait, &mut wcs).is_some() {
        for wc in &wcs {
            if wc.status == WcStatus::WorkRequestFlushed {
                return Ok(());
            }
            check(wc)?;
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            // The pong leaves from the receive buffer: the next ping cannot arrive before
            // the client has the pong.
            qp.post_send(SendWr::send(wc.wr_id, vec![buf.sge(0, wc.byte_len)]).with_flags(inline))?;
            qp.post_recv(RecvWr::new(wc.wr_id, vec![buf.sge(0, size)]))?;
        }
    }
    Ok(())
}

fn serve_write_lat(
    qp: &Qp,
    cq: &Cq,
    buf: &Mr,
    src: &Mr,
    size: u32,
    client: RemoteBuf,
) -> Result<(), PerfError> {
    let n = size as usize;
    if client.len < size {
        return Err(PerfError::Protocol(
            "the client's buffer is too small".into(),
        ));
    }
    let inline = if size <= INLINE_MAX {
        SendFlags::INLINE
    } else {
        SendFlags::empty()
    };
    let mut i = 0u64;
    loop {
        let tag = (i % 255) as u8 + 1;
        let mut b = [0u8; 1];
        // No deadline while the client lives: it decides how long the test runs.
        while !(buf.copy_out(n - 1, &mut b).is_ok() && b[0] == tag) {
            if qp.state().is_dead() {
                return Ok(());
            }
            // Polling the CQ runs the transport in this thread (the Writes are unsignaled:
            // nothing completes here, but each arrives without a hand-off).
            let mut wcs = Vec::new();
            spin_until(Duration::from_millis(100), || {
                wcs.clear();
                cq.poll(16, &mut wcs);
                buf.copy_out(n - 1, &mut b).is_ok() && b[0] == tag || qp.state().is_dead()
            });
        }
        src.copy_in(n - 1, &[tag])?;
        qp.post_send(
            SendWr::write(
                i,
                vec![src.sge(0, size)],
                softrdma::Key(client.rkey),
                client.addr,
            )
            .with_flags(inline),
        )?;
        i += 1;
    }
}
