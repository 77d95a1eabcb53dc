//! The client of `softrdma perf`'s RDMA tests, written once over the verbs surface: the
//! device its context was opened on (iWARP or RoCE) is the only difference. One connection
//! per test ([`super::proto`]): the test's parameters ride in the connection request, the
//! server's buffer comes back in the accept, an `End` request ends the test and brings the
//! server's report.
//!
//! Bandwidth: the client keeps `tx_depth` requests outstanding, signals one in `cq_mod`, and
//! ends with a one-octet RDMA Read of the server's buffer. A Read Response comes after every
//! earlier message was placed at the server, so the time runs until delivery is confirmed,
//! not until the last request left. Send bandwidth is flow-controlled with credits on both
//! transports (iWARP has no RNR: a Send that finds no receive kills the stream; RoCE would
//! pay an RNR wait): the server returns a small Send for every quarter of its receive
//! window it posted again.
//!
//! Latency: Send is a ping-pong (half the round trip, as ib_send_lat), RDMA Write has both
//! sides poll the last octet of their buffer (half the round trip, as ib_write_lat), RDMA
//! Read is the time of one Read (a full round trip, as ib_read_lat). A side spinning on
//! memory polls its CQ as it spins, which runs the transport in its own thread: the peer's
//! Write is placed without a thread hand-off.
//!
//! Every octet is checked once the test is over (outside the timed part): what landed here
//! by the client, what landed at the server by the server (its `End` report), and the number
//! and length of every message received.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use softrdma::iwarp::FpduSize;
use softrdma::roce::RequesterCounters;
use softrdma::{
    Access, BusyPoll, ConnectParams, ConnectionInfo, Context, Cq, Error, Key, Mr, Pd, Qp, QpCap,
    QpInitAttr, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::proto::{
    CLIENT_SEED, EndReport, Refusal, RemoteBuf, Reply, Request, Reverse, SERVER_SEED, Test, fill,
    first_mismatch,
};
use super::stats::{Bw, Peak};
use super::{Limit, PerfError};
use crate::verbs_util::{WaitMode, spin_until, wait_some};

/// Rights of the buffers a peer reads or writes.
pub(crate) const REMOTE: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
/// Largest message sent INLINE (copied at post time).
pub(crate) const INLINE_MAX: u32 = 256;
/// Safety net of every wait: a test that stalls this long has failed.
pub(crate) const SAFETY: Duration = Duration::from_secs(30);

/// wr_id bit of the client's credit receives.
const CREDIT: u64 = 1 << 63;
/// wr_id of the final, delivery-confirming Read.
const SYNC: u64 = 1 << 62;
/// Receives the client keeps posted for credit messages.
const CREDIT_SLOTS: u32 = 64;

/// A completion in error ends the test.
pub(crate) fn check(wc: &WorkCompletion) -> Result<(), PerfError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(PerfError::Completion(format!(
            "{:?} of wr_id {:#x} completed with {:?}",
            wc.opcode, wc.wr_id, wc.status
        )))
    }
}

/// Flags of latency Sends and Writes and of credits: unsignaled (a completion would cost a
/// wake-up), INLINE when small.
pub(crate) fn unsignaled(size: u32) -> SendFlags {
    if size <= INLINE_MAX {
        SendFlags::INLINE
    } else {
        SendFlags::empty()
    }
}

/// The first octet of `mr[..len]` that is not the pattern of `seed`, as an error.
pub(crate) fn verify(mr: &Mr, len: usize, seed: u8, what: &str) -> Result<(), PerfError> {
    match first_mismatch(&mr.read()[..len], seed) {
        None => Ok(()),
        Some(i) => Err(PerfError::Protocol(format!(
            "{what}: octet {i} of {len} is not what was sent"
        ))),
    }
}

/// How the client connects and waits.
#[derive(Clone, Copy, Debug)]
pub struct ClientOpts {
    /// iWARP: ask for MPA CRC.
    pub crc: bool,
    /// iWARP: FPDU size policy.
    pub fpdu: FpduSize,
    /// RoCE: the path MTU asked for.
    pub pmtu: u32,
    /// Requests outstanding (bandwidth).
    pub tx_depth: u32,
    /// Receives the server keeps posted (Send bandwidth).
    pub rx_depth: u32,
    /// Blocking or busy-polling waits.
    pub wait: WaitMode,
    /// How blocking waits poll before they sleep.
    pub busy_poll: BusyPoll,
    /// Bound on each connection's setup.
    pub connect_timeout: std::time::Duration,
}

/// The client's end of a session: one context, one connection per test.
pub struct Client {
    ctx: Context,
    server: SocketAddr,
    o: ClientOpts,
    /// The first test's connection (what MPA negotiated, the RoCE path MTU).
    pub first_conn: Option<ConnectionInfo>,
    /// RoCE: the requester counters of every test QP, summed.
    pub requester: RequesterCounters,
    /// iWARP: the RDMAP counters of every test QP, summed.
    pub stream: softrdma::iwarp::StreamCounters,
    /// Every test QP's counters as it ended: the test, its QP number and the counters.
    pub qps: Vec<(&'static str, u32, softrdma::QpCounters)>,
}

/// A connected test.
struct TestQp {
    qp: Qp,
    cq: Cq,
    id: u64,
    test: Test,
    server: RemoteBuf,
}

impl Client {
    /// A client on `ctx` of the server whose connection manager listens at `server`.
    pub fn new(ctx: Context, server: SocketAddr, o: ClientOpts) -> Client {
        Client {
            ctx,
            server,
            o,
            first_conn: None,
            requester: RequesterCounters::default(),
            stream: Default::default(),
            qps: Vec::new(),
        }
    }

    /// The client's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn params(&self, req: &Request) -> ConnectParams {
        ConnectParams {
            private_data: req.emit(),
            ird: 16,
            ord: self.o.tx_depth.clamp(1, 16383) as u16,
            timeout: self.o.connect_timeout,
            iwarp: softrdma::iwarp::ConnectParams {
                crc: self.o.crc,
                fpdu: self.o.fpdu,
                ..Default::default()
            },
            roce: softrdma::roce::ConnectParams { pmtu: self.o.pmtu },
        }
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
            .create_cq((cap.max_send_wr + cap.max_recv_wr) as usize, None)?;
        cq.set_busy_poll(self.o.busy_poll);
        let qp = pd.create_qp(QpInitAttr {
            cap,
            ..QpInitAttr::new(&cq, &cq)
        })?;
        prepost(&qp)?;
        let conn = qp
            .connect(self.server, self.params(&req))
            .map_err(|e| PerfError::connecting(e).at(format!("connecting to {}", self.server)))?;
        let reply = Reply::parse(&conn.peer_private_data).ok_or_else(|| {
            PerfError::Protocol("the server's accept is not a softrdma perf reply".into())
        })?;
        if reply.buf.len < req.size.max(1) {
            return Err(PerfError::Protocol(
                "the server's buffer is too small".into(),
            ));
        }
        if self.first_conn.is_none() {
            self.first_conn = Some(conn);
        }
        Ok(TestQp {
            qp,
            cq,
            id: reply.id,
            test: req.test,
            server: reply.buf,
        })
    }

    /// A request the server answers with a rejection (`End`, `Bye`): its private data.
    fn request(&self, req: Request) -> Result<Vec<u8>, PerfError> {
        self.ask(req.emit(), req.test, self.o.connect_timeout)
    }

    /// Sends `private_data` (a `test` request) in a connection request the server rejects,
    /// waiting up to `timeout` for the rejection: its private data.
    pub(super) fn ask(
        &self,
        private_data: Vec<u8>,
        test: Test,
        timeout: Duration,
    ) -> Result<Vec<u8>, PerfError> {
        let pd = self.ctx.alloc_pd();
        let cq = self.ctx.create_cq(4, None)?;
        let qp = pd.create_qp(QpInitAttr {
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInitAttr::new(&cq, &cq)
        })?;
        let params = ConnectParams {
            private_data,
            timeout,
            ..self.params(&Request::new(test))
        };
        match qp.connect(self.server, params) {
            Err(Error::Rejected { private_data, .. }) => Ok(private_data),
            Err(e) => Err(PerfError::from(e).at(format!("connecting to {}", self.server))),
            Ok(_) => Err(PerfError::Protocol(format!(
                "the server accepted a {test} request"
            ))),
        }
    }

    /// `-b`: asks the server to run `r` toward us; the id its `End` names.
    pub(super) fn reverse_start(&self, r: &Reverse) -> Result<u64, PerfError> {
        let answer = self.ask(r.emit(), Test::Reverse, self.o.connect_timeout)?;
        if let Some(why) = Refusal::parse(&answer) {
            return Err(PerfError::Refused(why));
        }
        Reply::parse(&answer).map(|a| a.id).ok_or_else(|| {
            PerfError::Protocol(format!(
                "the server at {} refused -b: {}",
                self.server,
                String::from_utf8_lossy(&answer)
            ))
        })
    }

    /// `-b`: ends the server's measurement `id` (it is answered once the measurement is
    /// over, within `timeout`): what it measured.
    pub(super) fn reverse_end(&self, id: u64, timeout: Duration) -> Result<Option<Bw>, PerfError> {
        let req = Request {
            id,
            ..Request::new(Test::End)
        };
        let answer = self.ask(req.emit(), Test::End, timeout)?;
        let report = EndReport::parse(&answer).ok_or_else(|| {
            PerfError::Protocol("the server's answer to End is not a report".into())
        })?;
        match report.error {
            Some(e) => Err(PerfError::Protocol(format!(
                "the server's measurement toward us (-b): {e}"
            ))),
            None => Ok(report.bw),
        }
    }

    /// Ends test `t`: the server tears its side down and reports (an error it met is
    /// ours), then our QP goes. `sent`: messages the server should have received.
    fn end(&mut self, t: TestQp, sent: u64) -> Result<EndReport, PerfError> {
        let c = t.qp.counters();
        self.requester += c.ib_requester();
        self.stream += c.iwarp();
        self.qps.push((t.test.name(), t.qp.qp_num(), c));
        let r = self.request(Request {
            id: t.id,
            count: sent,
            ..Request::new(Test::End)
        });
        let _ = t.qp.disconnect();
        let report = EndReport::parse(&r?).ok_or_else(|| {
            PerfError::Protocol("the server's answer to End is not a report".into())
        })?;
        match &report.error {
            Some(e) => Err(PerfError::Protocol(format!("the server: {e}"))),
            None => Ok(report),
        }
    }

    /// Bandwidth of `test` (Write, Read or Send) with `size`-octet messages.
    pub fn bw(&mut self, test: Test, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        let o = self.o;
        let tx_depth = u64::from(o.tx_depth.max(1));
        let cq_mod = (tx_depth / 4).clamp(1, 100);
        let send = test == Test::SendBw;
        let n = size as usize;
        let pd = self.ctx.alloc_pd();
        let local = pd.alloc_mr(n, REMOTE)?;
        fill(&mut local.write()[..n], CLIENT_SEED);
        let credits = pd.alloc_mr(CREDIT_SLOTS as usize * 8, Access::LOCAL_WRITE)?;
        let cap = QpCap {
            max_send_wr: o.tx_depth.max(1) + 2,
            max_recv_wr: CREDIT_SLOTS,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let req = Request {
            size,
            rx_depth: o.rx_depth,
            ..Request::new(test)
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
        let (rkey, raddr) = (Key(t.server.rkey), t.server.addr);
        let wr = |id: u64, signaled: bool| {
            let wr = match test {
                Test::WriteBw => SendWr::write(id, vec![local.sge(0, size)], rkey, raddr),
                Test::ReadBw => SendWr::read(id, Some(local.sge(0, size)), rkey, raddr),
                _ => SendWr::send(id, vec![local.sge(0, size)]),
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
        let mut batch = Vec::with_capacity(tx_depth as usize);
        let mut stopping = false;
        let start = Instant::now();
        let deadline = match limit {
            Limit::Duration(d) => Some(start + d),
            Limit::Iters(_) => None,
        };
        // Peak over stretches of twice the requests in flight (and at least 1/20 of a
        // counted run).
        let window = (2 * tx_depth).max(if total == u64::MAX { 0 } else { total / 20 });
        let mut peak = Peak::new(size, window, start);
        let run = (|| -> Result<Duration, PerfError> {
            loop {
                if !stopping {
                    while posted < total && posted - retired < tx_depth && posted < allowed {
                        batch.push(wr(posted, (posted + 1) % cq_mod == 0));
                        posted += 1;
                    }
                    if !batch.is_empty() {
                        t.qp.post_send_list(batch.drain(..)).map_err(|(_, e)| e)?;
                    }
                    if posted >= total || deadline.is_some_and(|d| Instant::now() >= d) {
                        stopping = true;
                        // One octet read back: its response follows every earlier message.
                        t.qp.post_send(SendWr::read(SYNC, Some(local.sge(0, 1)), rkey, raddr))?;
                    }
                }
                wcs.clear();
                wait_some(&t.cq, o.wait, 128, SAFETY, &mut wcs)?;
                for wc in &wcs {
                    check(wc)?;
                    if wc.wr_id & CREDIT != 0 {
                        let slot = (wc.wr_id & !CREDIT) as usize;
                        let mut c = [0u8; 8];
                        credits.copy_out(slot * 8, &mut c)?;
                        allowed = allowed.max(u64::from(o.rx_depth) + u64::from_le_bytes(c));
                        t.qp.post_recv(RecvWr::new(wc.wr_id, vec![credits.sge(slot * 8, 8)]))?;
                    } else if wc.wr_id == SYNC {
                        // Its response follows every message: all of them are done.
                        peak.mark(Instant::now(), posted);
                        return Ok(start.elapsed());
                    } else {
                        retired = retired.max(wc.wr_id + 1);
                    }
                }
                peak.mark(Instant::now(), retired);
            }
        })();
        let report = self.end(t, posted);
        let elapsed = run?;
        let report = report?;
        match test {
            Test::ReadBw => verify(&local, n, SERVER_SEED, "RDMA Read")?,
            Test::SendBw => received(&report, posted, size)?,
            _ => {}
        }
        Ok(Bw {
            peak_gbit_s: peak.gbit_s(),
            ..Bw::new(posted, size, elapsed)
        })
    }

    /// Latency samples of `test` (nanoseconds per round trip; one Read for Read).
    pub fn lat(
        &mut self,
        test: Test,
        size: u32,
        limit: Limit,
        warmup: u64,
    ) -> Result<Vec<u64>, PerfError> {
        let n = size as usize;
        let pd = self.ctx.alloc_pd();
        let local = pd.alloc_mr(n, REMOTE)?;
        fill(&mut local.write()[..n], CLIENT_SEED);
        let sink = pd.alloc_mr(n, REMOTE)?;
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        };
        let req = Request {
            size,
            buf: RemoteBuf::of(&sink, size),
            ..Request::new(test)
        };
        let t = self.connect(&pd, cap, req, |qp| {
            if test == Test::SendLat {
                qp.post_recv(RecvWr::new(1, vec![sink.sge(0, size)]))?;
            }
            Ok(())
        })?;
        let mut l = LatLoop {
            qp: &t.qp,
            cq: &t.cq,
            local: &local,
            sink: &sink,
            rkey: Key(t.server.rkey),
            raddr: t.server.addr,
            size,
            flags: unsignaled(size),
            wait: self.o.wait,
            wcs: Vec::with_capacity(16),
            iters: 0,
        };
        let samples = l.run(test, limit, warmup);
        let iters = l.iters;
        let report = self.end(t, iters);
        let samples = samples?;
        let report = report?;
        match test {
            Test::SendLat => {
                received(&report, iters, size)?;
                verify(&sink, n, CLIENT_SEED, "Send pong")?;
            }
            Test::WriteLat => verify(&sink, n - 1, SERVER_SEED, "RDMA Write")?,
            _ => verify(&local, n, SERVER_SEED, "RDMA Read")?,
        }
        Ok(samples)
    }

    /// Ends the session: a request the server rejects.
    pub fn bye(&self) {
        let _ = self.request(Request::new(Test::Bye));
    }
}

/// The server received `sent` messages of `size` octets, no more, no fewer.
fn received(r: &EndReport, sent: u64, size: u32) -> Result<(), PerfError> {
    if (r.recvs, r.recv_bytes) == (sent, sent * u64::from(size)) {
        Ok(())
    } else {
        Err(PerfError::Protocol(format!(
            "sent {sent} messages of {size} octets, the server received {} ({} octets)",
            r.recvs, r.recv_bytes
        )))
    }
}

/// One latency test on a connected QP whose peer serves it.
struct LatLoop<'a> {
    qp: &'a Qp,
    cq: &'a Cq,
    /// What this side sends from (Send, Write) or reads into (Read).
    local: &'a Mr,
    /// Where the peer's Sends and Writes land.
    sink: &'a Mr,
    /// The peer's buffer.
    rkey: Key,
    raddr: u64,
    size: u32,
    /// Flags of Sends and Writes.
    flags: SendFlags,
    wait: WaitMode,
    wcs: Vec<WorkCompletion>,
    /// Iterations run, warm-up included.
    iters: u64,
}

impl LatLoop<'_> {
    /// Round-trip samples (ns) of `test` after `warmup` untimed iterations. A Send
    /// ping-pong needs one receive posted on `sink` before the first iteration.
    fn run(&mut self, test: Test, limit: Limit, warmup: u64) -> Result<Vec<u64>, PerfError> {
        limit.sample(warmup, |i| {
            self.iters = i + 1;
            match test {
                Test::SendLat => self.send(i),
                Test::WriteLat => self.write(i),
                _ => self.read(i),
            }
        })
    }

    /// A Send and the server's echo.
    fn send(&mut self, i: u64) -> Result<Duration, PerfError> {
        let size = self.size;
        let t0 = Instant::now();
        self.qp
            .post_send(SendWr::send(i, vec![self.local.sge(0, size)]).with_flags(self.flags))?;
        let len = self.wait_for(WcOpcode::Recv)?;
        if len != size {
            return Err(PerfError::Protocol(format!(
                "pong {i} has {len} octets, not {size}"
            )));
        }
        self.qp
            .post_recv(RecvWr::new(1, vec![self.sink.sge(0, size)]))?;
        Ok(t0.elapsed())
    }

    /// A Write and the server's, each side watching the last octet of its buffer.
    fn write(&mut self, i: u64) -> Result<Duration, PerfError> {
        let last = self.size as usize - 1;
        let tag = (i % 255) as u8 + 1;
        self.local.copy_in(last, &[tag])?;
        let t0 = Instant::now();
        self.qp.post_send(
            SendWr::write(i, vec![self.local.sge(0, self.size)], self.rkey, self.raddr)
                .with_flags(self.flags),
        )?;
        let mut b = [0u8; 1];
        // Polling the CQ while spinning on memory runs the transport in this thread (the
        // Write lands without a hand-off); its completions (errors: the Writes are
        // unsignaled) are checked below.
        self.wcs.clear();
        let arrived = spin_until(SAFETY, || {
            self.cq.poll(16, &mut self.wcs);
            self.sink.copy_out(last, &mut b).is_ok() && b[0] == tag || self.qp.state().is_dead()
        });
        let dt = t0.elapsed();
        if !arrived || b[0] != tag {
            return Err(PerfError::Protocol(format!(
                "the server's RDMA Write {i} did not arrive (QP {:?})",
                self.qp.state()
            )));
        }
        self.wcs.iter().try_for_each(check)?;
        Ok(dt)
    }

    /// One Read.
    fn read(&mut self, i: u64) -> Result<Duration, PerfError> {
        let t0 = Instant::now();
        self.qp.post_send(SendWr::read(
            i,
            Some(self.local.sge(0, self.size)),
            self.rkey,
            self.raddr,
        ))?;
        self.wait_for(WcOpcode::RdmaRead)?;
        Ok(t0.elapsed())
    }

    /// Waits for a completion of `op`; its length.
    fn wait_for(&mut self, op: WcOpcode) -> Result<u32, PerfError> {
        loop {
            self.wcs.clear();
            wait_some(self.cq, self.wait, 8, SAFETY, &mut self.wcs)?;
            let mut got = None;
            for wc in &self.wcs {
                check(wc)?;
                if wc.opcode == op {
                    got = Some(wc.byte_len);
                }
            }
            if let Some(len) = got {
                return Ok(len);
            }
        }
    }
}
