//! `softrdma perf --loopback -q N[,N...]`: many connected RC QPs between two contexts of
//! this process. For each N: N QPs are connected through the connection manager, the RSS
//! the idle connections added is taken, then every round posts one Write per QP (4 KiB by
//! default, `-s`) and waits for all N completions; the figures are the aggregate bandwidth
//! and operations per second. A final one-octet Read on every QP confirms delivery, and
//! every QP's slot of the server's region is checked.
//!
//! Both ends live in this process, so the memory figure of a connection counts both of its
//! QPs (and their sockets' user-space state); per QP is half of it. iWARP rows over loopback
//! also run the same rounds over raw TCP connections (`raw_tcp`): how much of the fall from
//! one QP to many is the kernel's own.
//!
//! `perf HOST -q N` runs the same rounds against a `softrdma perf --server`: the first
//! connection's request opens a session there (one region of N slots), the others join it,
//! and `End` has the server check every slot ([`ScaleSession`]). The memory figure is then
//! this process's QP alone.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrdma::{
    AcceptParams, ConnRequest, ConnectParams, Context, Cq, Key, Listener, Mr, Pd, Qp, QpCap,
    QpInitAttr, SendFlags, SendWr, WorkCompletion,
};

use super::client::{Client, REMOTE, SAFETY, check};
use super::proto::{EndReport, RemoteBuf, Reply, Request, Test, fill, first_mismatch};
use super::stats::Bw;
use super::{Limit, PerfArgs, PerfError};
use crate::verbs_util::{WaitMode, wait_some};

/// wr_id bit of the delivery-confirming Reads.
const SYNC: u64 = 1 << 62;

/// One scale row.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScaleRow {
    /// Connected RC QPs (client side; as many on the server).
    pub qps: u32,
    /// Octets per Write.
    pub bytes: u32,
    /// Rounds run (one Write per QP each).
    pub rounds: u64,
    /// Time to connect all of them, seconds.
    pub connect_seconds: f64,
    /// Aggregate figures (`iters`: Writes).
    pub bw: Bw,
    /// RSS the idle connections added, per connection (both QPs, both contexts), octets.
    pub idle_bytes_per_connection: u64,
    /// RSS after the rounds, per connection, octets.
    pub active_bytes_per_connection: u64,
    /// QPs of a connection in this process: 2 over loopback (both ends), 1 against a
    /// server.
    #[serde(default = "two")]
    pub ends_here: u32,
    /// Aggregate bandwidth / the one-QP row's (1.0 for the first row).
    pub vs_first: f64,
    /// iWARP over loopback: the same rounds over `qps` raw TCP connections of this process
    /// ([`super::tcp::rounds`]), run right after.
    #[serde(default)]
    pub raw_tcp: Option<Bw>,
    /// The raw rounds' bandwidth / the first row's (what the kernel does with more
    /// connections).
    #[serde(default)]
    pub raw_vs_first: Option<f64>,
}

fn two() -> u32 {
    2
}

impl ScaleRow {
    /// The row of `n` QPs, `size`-octet Writes, `rounds` rounds in `elapsed`; RSS before
    /// connecting, with the connections idle and after the rounds; `ends_here` QPs of a
    /// connection in this process.
    fn measured(
        (n, size, rounds): (u32, u32, u64),
        connect_seconds: f64,
        elapsed: Duration,
        [rss0, idle, active]: [u64; 3],
        ends_here: u32,
    ) -> ScaleRow {
        let per = |after: u64| after.saturating_sub(rss0) / u64::from(n.max(1));
        ScaleRow {
            qps: n,
            bytes: size,
            rounds,
            connect_seconds,
            bw: Bw::new(rounds * u64::from(n), size, elapsed),
            idle_bytes_per_connection: per(idle),
            active_bytes_per_connection: per(active),
            ends_here,
            vs_first: 1.0,
            raw_tcp: None,
            raw_vs_first: None,
        }
    }
}

/// Resident set size of this process, octets (`/proc/self/statm`).
fn rss() -> u64 {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |p| p * page)
}

/// Raises the soft limit of open files to the hard one: an iWARP connection holds two
/// sockets in this process.
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Runs the scale rows `args.qps` asks for: over loopback, or (`server`: the context and the
/// server's address) against a server.
/// A list runs each count in a child process (which opens a context of its own: `ctx` is
/// needed for a single row only).
pub fn run(
    args: &PerfArgs,
    server: Option<(Option<&Context>, SocketAddr)>,
) -> Result<Vec<ScaleRow>, PerfError> {
    raise_nofile();
    let size = args.size.unwrap_or(4096);
    let limit = match (args.duration, args.iters) {
        (Some(d), _) => Limit::Duration(Duration::from_secs_f64(d.max(0.001))),
        (None, Some(n)) => Limit::Iters(n.max(1)),
        (None, None) => Limit::Duration(Duration::from_secs(1)),
    };
    if args.qps.contains(&0) {
        return Err(PerfError::Usage("-q: at least one QP".into()));
    }
    let mut rows: Vec<ScaleRow> = Vec::new();
    for &n in &args.qps {
        // Each N of a list in a process of its own: a later row would reuse what the
        // allocator kept of an earlier one and its memory figure would be too small.
        let mut row = match (args.qps.len(), server) {
            (1, None) => one(args, n, size, limit)?,
            (1, Some((Some(ctx), addr))) => remote(args, ctx, addr, n, size, limit)?,
            _ => in_child(args, n)?,
        };
        row.vs_first = rows.first().map_or(1.0, |f| row.bw.gbit_s / f.bw.gbit_s);
        row.raw_vs_first = match (rows.first(), row.raw_tcp) {
            (None, Some(_)) => Some(1.0),
            (Some(f), Some(r)) => f.raw_tcp.map(|fr| r.gbit_s / fr.gbit_s),
            _ => None,
        };
        rows.push(row);
    }
    Ok(rows)
}

/// Row `n` from a child process: this program, `perf --loopback -q N --json` (or `perf HOST
/// ...`) with the options that shape the row.
fn in_child(args: &PerfArgs, n: u32) -> Result<ScaleRow, PerfError> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("perf");
    match &args.host {
        Some(host) => {
            cmd.args([
                host.as_str(),
                "-p",
                &args.port.to_string(),
                "-B",
                &args.bind,
            ]);
            cmd.args(["--tcp-port", &args.raw_port().to_string()]);
            cmd.args(["--connect-timeout", &args.connect_timeout.to_string()]);
            cmd.arg("--scale-child");
        }
        None => {
            cmd.arg("--loopback");
        }
    }
    cmd.args(["--json", "-q", &n.to_string()]);
    cmd.args(["--transport", &flag(args.transport)]);
    cmd.args(["--raw-tx", &flag(args.raw_tx)]);
    for (name, v) in [
        ("-s", args.size.map(|x| x.to_string())),
        ("-D", args.duration.map(|x| x.to_string())),
        ("-n", args.iters.map(|x| x.to_string())),
        ("-m", args.mtu.map(|x| x.to_string())),
        ("--roce-port", args.roce_port.map(|x| x.to_string())),
    ] {
        if let Some(v) = v {
            cmd.args([name, &v]);
        }
    }
    if args.busy {
        cmd.arg("--busy");
    }
    if args.no_gso {
        cmd.arg("--no-gso");
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output()?;
    if !out.status.success() {
        return Err(PerfError::Protocol(format!(
            "the run of {n} QPs ({}) failed: {}",
            exe.display(),
            out.status
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| PerfError::Protocol(format!("the run of {n} QPs: {e}")))?;
    v.get("scale")
        .and_then(|r| r.get(0))
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .ok_or_else(|| PerfError::Protocol(format!("the run of {n} QPs reported no row")))
}

/// How `v` is spelled on the command line.
fn flag(v: impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

/// One end: its PD, the CQ of all its QPs, and one region with a slot per QP.
struct Side {
    pd: Pd,
    cq: Cq,
    mr: Mr,
}

impl Side {
    fn new(ctx: Context, n: u32, size: u32) -> Result<Side, PerfError> {
        let pd = ctx.alloc_pd();
        // Two completions per QP at most outstanding: the round's Write and the final Read.
        let cq = ctx.create_cq(2 * n as usize + 16, None)?;
        let mr = pd.alloc_mr(n as usize * size as usize, REMOTE)?;
        Ok(Side { pd, cq, mr })
    }

    fn qp(&self) -> Result<Qp, PerfError> {
        Ok(self.pd.create_qp(QpInitAttr {
            cap: QpCap {
                max_send_wr: 2,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInitAttr::new(&self.cq, &self.cq)
        })?)
    }
}

fn one(args: &PerfArgs, n: u32, size: u32, limit: Limit) -> Result<ScaleRow, PerfError> {
    let (sctx, cctx) = super::loopback_contexts(args)?;
    let listener = Listener::bind(&sctx, "127.0.0.1:0")?;
    let addr: SocketAddr = (Ipv4Addr::LOCALHOST, listener.local_addr().port()).into();
    let server = Side::new(sctx, n, size)?;
    let client = Side::new(cctx, n, size)?;
    for i in 0..n as usize {
        let at = i * size as usize;
        fill(&mut client.mr.write()[at..at + size as usize], seed(i));
    }
    let pmtu = args.mtu.unwrap_or(4096);
    let quit = AtomicBool::new(false);
    let rss0 = rss();
    let t0 = Instant::now();
    let (served, qps) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| -> Result<Vec<Qp>, PerfError> {
            let mut qps = Vec::with_capacity(n as usize);
            while qps.len() < n as usize {
                if quit.load(Ordering::Acquire) {
                    break;
                }
                let req = match listener.accept_timeout(Duration::from_millis(200)) {
                    Ok(r) => r,
                    Err(softrdma::Error::Timeout) => continue,
                    Err(e) => return Err(e.into()),
                };
                let qp = server.qp()?;
                req.accept(
                    &qp,
                    AcceptParams {
                        ird: 1,
                        ord: 1,
                        roce: softrdma::roce::AcceptParams { pmtu },
                        ..AcceptParams::default()
                    },
                )?;
                qps.push(qp);
            }
            Ok(qps)
        });
        let connect = || -> Result<Vec<Qp>, PerfError> {
            let mut qps = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let qp = client.qp()?;
                qp.connect(
                    addr,
                    ConnectParams {
                        ird: 1,
                        ord: 1,
                        roce: softrdma::roce::ConnectParams { pmtu },
                        ..ConnectParams::default()
                    },
                )?;
                qps.push(qp);
            }
            Ok(qps)
        };
        let qps = connect();
        quit.store(true, Ordering::Release);
        let served = acceptor
            .join()
            .map_err(|_| PerfError::Protocol("the accepting thread panicked".into()));
        (served, qps)
    });
    let qps = qps?;
    let _served = served??;
    let connect_seconds = t0.elapsed().as_secs_f64();
    let rss_idle = rss();
    let wait = args.wait();
    let target = RemoteBuf {
        addr: server.mr.addr(0),
        rkey: server.mr.rkey().0,
        len: 0,
    };
    let (rounds, elapsed) = rounds(&client, target, &qps, size, limit, wait)?;
    let rss_active = rss();
    for (i, _) in qps.iter().enumerate() {
        let at = i * size as usize;
        if let Some(k) = first_mismatch(&server.mr.read()[at..at + size as usize], seed(i)) {
            return Err(PerfError::Protocol(format!(
                "QP {i} of {n}: octet {k} of its {size}-octet slot is not what it wrote"
            )));
        }
    }
    for qp in &qps {
        let _ = qp.disconnect();
    }
    drop(qps);
    let mut row = ScaleRow::measured(
        (n, size, rounds),
        connect_seconds,
        elapsed,
        [rss0, rss_idle, rss_active],
        2,
    );
    if args.transport == super::Transport::Iwarp {
        row.raw_tcp = Some(super::tcp::rounds(n, size, limit)?);
    }
    Ok(row)
}

/// One row against the server at `addr`: N connections into one session there.
fn remote(
    args: &PerfArgs,
    ctx: &Context,
    addr: SocketAddr,
    n: u32,
    size: u32,
    limit: Limit,
) -> Result<ScaleRow, PerfError> {
    let o = args.client_opts()?;
    let client = Side::new(ctx.clone(), n, size)?;
    for i in 0..n as usize {
        let at = i * size as usize;
        fill(&mut client.mr.write()[at..at + size as usize], seed(i));
    }
    let rss0 = rss();
    let t0 = Instant::now();
    let mut qps = Vec::with_capacity(n as usize);
    let mut session: Option<(u64, RemoteBuf)> = None;
    for _ in 0..n {
        let qp = client.qp()?;
        let req = Request {
            size,
            count: u64::from(n),
            id: session.map_or(0, |s| s.0),
            ..Request::new(Test::ScaleQp)
        };
        let conn = qp
            .connect(
                addr,
                ConnectParams {
                    private_data: req.emit(),
                    ird: 1,
                    ord: 1,
                    timeout: o.connect_timeout,
                    iwarp: softrdma::iwarp::ConnectParams {
                        crc: o.crc,
                        fpdu: o.fpdu,
                        ..Default::default()
                    },
                    roce: softrdma::roce::ConnectParams { pmtu: o.pmtu },
                },
            )
            .map_err(|e| {
                PerfError::connecting(e)
                    .at(format!("connecting QP {} of {n} to {addr}", qps.len() + 1))
            })?;
        let reply = Reply::parse(&conn.peer_private_data)
            .filter(|r| u64::from(r.buf.len) >= u64::from(n) * u64::from(size))
            .ok_or_else(|| {
                PerfError::Protocol(format!(
                    "{addr}: the accept of a scale QP is not a softrdma perf reply with {n} slots"
                ))
            })?;
        session = Some((reply.id, reply.buf));
        qps.push(qp);
    }
    let Some((id, target)) = session else {
        return Err(PerfError::Usage("-q: at least one QP".into()));
    };
    let connect_seconds = t0.elapsed().as_secs_f64();
    let rss_idle = rss();
    let (rounds, elapsed) = rounds(&client, target, &qps, size, limit, o.wait)?;
    let rss_active = rss();
    // The server checks every slot.
    let end = Request {
        id,
        ..Request::new(Test::End)
    };
    let answer = Client::new(ctx.clone(), addr, o).ask(end.emit(), Test::End, o.connect_timeout);
    for qp in &qps {
        let _ = qp.disconnect();
    }
    let report = EndReport::parse(&answer?)
        .ok_or_else(|| PerfError::Protocol("the server's answer to End is not a report".into()))?;
    if let Some(e) = report.error {
        return Err(PerfError::Protocol(format!("the server: {e}")));
    }
    Ok(ScaleRow::measured(
        (n, size, rounds),
        connect_seconds,
        elapsed,
        [rss0, rss_idle, rss_active],
        1,
    ))
}

/// QPs of one scale session at a server (`-q` against `perf --server`), at most.
pub const SCALE_MAX_QPS: u32 = 4096;

/// The server's end of a remote scale session: one region of N slots and the QPs accepted
/// into it (nothing completes here: the Writes and Reads are the responder's).
pub struct ScaleSession {
    id: u64,
    n: u32,
    size: u32,
    pmtu: u32,
    fpdu: softrdma::iwarp::FpduSize,
    side: Side,
    qps: Vec<Qp>,
    /// Progress at the last look (units its QPs received, QPs accepted), and since when.
    seen: (u64, Instant),
}

impl ScaleSession {
    /// Opens session `id` for the request `r` (`count`: its QPs) and accepts `req` into it
    /// with the server's path MTU and FPDU policy; a request past the limits is rejected
    /// with the reason.
    pub fn open(
        ctx: &Context,
        id: u64,
        r: Request,
        (pmtu, fpdu): (u32, softrdma::iwarp::FpduSize),
        req: ConnRequest,
    ) -> Result<ScaleSession, PerfError> {
        let size = r.size.max(1);
        let n = match u32::try_from(r.count) {
            Ok(n) if (1..=SCALE_MAX_QPS).contains(&n) => n,
            _ => {
                let why = format!(
                    "softrdma perf: a scale session has 1 to {SCALE_MAX_QPS} QPs, not {}",
                    r.count
                );
                let _ = req.reject(why.as_bytes());
                return Err(PerfError::Protocol(why));
            }
        };
        let side = match Side::new(ctx.clone(), n, size) {
            Ok(side) => side,
            Err(e) => {
                let _ = req.reject(format!("softrdma perf: {e}").as_bytes());
                return Err(e);
            }
        };
        let mut session = ScaleSession {
            id,
            n,
            size,
            pmtu,
            fpdu,
            side,
            qps: Vec::with_capacity(n as usize),
            seen: (0, Instant::now()),
        };
        session.accept(req)?;
        Ok(session)
    }

    /// Accepts one more QP of the session (rejected once it has all of them).
    pub fn accept(&mut self, req: ConnRequest) -> Result<(), PerfError> {
        if self.qps.len() >= self.n as usize {
            let _ = req.reject(b"softrdma perf: the scale session has all its QPs");
            return Err(PerfError::Protocol(format!(
                "a QP past the session's {}",
                self.n
            )));
        }
        let qp = match self.side.qp() {
            Ok(qp) => qp,
            Err(e) => {
                let _ = req.reject(format!("softrdma perf: {e}").as_bytes());
                return Err(e);
            }
        };
        let reply = Reply {
            id: self.id,
            buf: RemoteBuf::of(&self.side.mr, self.n * self.size),
        };
        reply.accept(req, &qp, (1, 1), (self.pmtu, self.fpdu))?;
        self.qps.push(qp);
        Ok(())
    }

    /// How long the session made no progress (no QP joined, none received anything), as
    /// of `now`.
    pub fn idle_for(&mut self, now: Instant) -> Duration {
        let progress = self
            .qps
            .iter()
            .map(|qp| qp.counters().rx_units)
            .fold(self.qps.len() as u64, u64::wrapping_add);
        if progress != self.seen.0 {
            self.seen = (progress, now);
        }
        now.saturating_duration_since(self.seen.1)
    }

    /// Every QP of the session is gone (its client left without `End`).
    pub fn is_dead(&self) -> bool {
        self.qps.iter().all(|qp| qp.state().is_dead())
    }

    /// `End`: every slot holds what its QP wrote.
    pub fn end(self) -> EndReport {
        let mut report = EndReport::default();
        let mem = self.side.mr.read();
        for i in 0..self.n as usize {
            let at = i * self.size as usize;
            if let Some(k) = first_mismatch(&mem[at..at + self.size as usize], seed(i)) {
                report.error = Some(format!(
                    "QP {i} of {}: octet {k} of its slot is not what it wrote",
                    self.n
                ));
                break;
            }
        }
        drop(mem);
        for qp in &self.qps {
            let _ = qp.disconnect();
        }
        report
    }
}

/// QP `i`'s pattern.
fn seed(i: usize) -> u8 {
    (i % 251) as u8
}

/// Rounds of one Write per QP, until `limit`; then a one-octet Read per QP confirms every
/// Write was placed. The rounds run and the time from the first post to the last Read.
fn rounds(
    client: &Side,
    target: RemoteBuf,
    qps: &[Qp],
    size: u32,
    limit: Limit,
    wait: WaitMode,
) -> Result<(u64, Duration), PerfError> {
    let n = qps.len();
    let rkey = Key(target.rkey);
    let base = target.addr;
    let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(n.min(1024));
    let collect = |want: usize, wcs: &mut Vec<WorkCompletion>| -> Result<(), PerfError> {
        let mut got = 0;
        while got < want {
            wcs.clear();
            got += wait_some(&client.cq, wait, 1024, SAFETY, wcs)?;
            wcs.iter().try_for_each(check)?;
        }
        Ok(())
    };
    let start = Instant::now();
    let mut done = 0u64;
    while !limit.reached(done, start) {
        for (i, qp) in qps.iter().enumerate() {
            let at = (i * size as usize) as u64;
            qp.post_send(
                SendWr::write(
                    done,
                    vec![client.mr.sge(at as usize, size)],
                    rkey,
                    base + at,
                )
                .with_flags(SendFlags::SIGNALED),
            )?;
        }
        collect(n, &mut wcs)?;
        done += 1;
    }
    for (i, qp) in qps.iter().enumerate() {
        let at = i * size as usize;
        qp.post_send(
            SendWr::read(SYNC, Some(client.mr.sge(at, 1)), rkey, base + at as u64)
                .with_flags(SendFlags::SIGNALED),
        )?;
    }
    collect(n, &mut wcs)?;
    let elapsed = start.elapsed();
    Ok((done, elapsed))
}
