//! `softrdma perf`'s runs: contexts and baselines set up, a client, a server or both in
//! one process driven through the tests, rows measured.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrdma::roce::RoceConfig;
use softrdma::{Context, Device, Listener};

use super::args::{Limit, PerfArgs};
use super::proto::{Measure, Reverse, Test};
use super::report::{
    BwRow, CountersReport, IwarpCounters, LatRow, MpaInfo, QpCountersRow, Report, RoceInfo, json,
    render_body, render_tail,
};
use super::stats::{Bw, Lat};
use super::udp::UdpBaseline;
use super::{
    Client, PerfError, Transport, perftest_client, perftest_cm_client, perftest_server, plot, raw,
    scale, serve, tcp,
};
use crate::pcap_out::PcapTap;
use crate::verbs_util::{default_roce_ip, local_ip_toward};

/// The RoCE address `-B` names, if it names one.
pub(super) fn bind_ip(args: &PerfArgs) -> Result<Option<IpAddr>, PerfError> {
    let ip: IpAddr = args
        .bind
        .parse()
        .map_err(|_| PerfError::Usage(format!("-B wants an IP address, got {}", args.bind)))?;
    Ok((!ip.is_unspecified()).then_some(ip))
}

pub(super) fn resolve(host: &str, port: u16) -> Result<SocketAddr, PerfError> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| PerfError::Usage(format!("{host} resolves to nothing")))
}

/// Opens the device of `transport`; RoCE on `ip` and UDP `port`.
pub(super) fn open(args: &PerfArgs, ip: IpAddr, port: u16) -> Result<Context, PerfError> {
    let dev = match args.transport {
        Transport::Iwarp => Device::tcp(),
        Transport::Roce => Device::roce(roce_config(args, ip, port)),
    };
    let ctx = dev.open().map_err(|e| match args.transport {
        Transport::Iwarp => PerfError::Usage(format!("cannot open {}: {e}", dev.name())),
        Transport::Roce => PerfError::Usage(format!(
            "cannot open a RoCE device on {ip} port {port}: {e}"
        )),
    })?;
    ready(args, ctx)
}

/// The RoCE settings of `args` on `ip` and UDP `port`.
fn roce_config(args: &PerfArgs, ip: IpAddr, port: u16) -> RoceConfig {
    let mut cfg = RoceConfig::new(ip);
    cfg.port = port;
    cfg.raw_tx = args.raw_tx.into();
    cfg.gso = !args.no_gso;
    cfg
}

/// An opened context with the polling and capture `args` ask for.
fn ready(args: &PerfArgs, ctx: Context) -> Result<Context, PerfError> {
    ctx.set_background_poll(args.background_poll());
    tap(args, &ctx)?;
    Ok(ctx)
}

/// Taps `ctx` into the `--pcap` file, if any.
pub(super) fn tap(args: &PerfArgs, ctx: &Context) -> Result<(), PerfError> {
    match &args.tap {
        Some(t) => t.attach(ctx).map_err(PerfError::Usage),
        None => Ok(()),
    }
}

/// Latency warm-up round trips (not counted).
const WARMUP: u64 = 16;

/// The raw socket baseline of a run.
pub(super) enum Baseline {
    /// Raw TCP, served at this address.
    Tcp(SocketAddr),
    /// Raw UDP.
    Udp(UdpBaseline),
}

impl Baseline {
    pub(super) fn bw(&self, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        match self {
            Baseline::Tcp(a) => tcp::bw(*a, size, limit),
            Baseline::Udp(u) => u.bw(size, limit),
        }
    }

    /// RoCE: the raw UDP baseline with GSO (none for TCP, or without kernel support).
    pub(super) fn bw_gso(&self, size: u32, limit: Limit) -> Result<Option<Bw>, PerfError> {
        match self {
            Baseline::Tcp(_) => Ok(None),
            Baseline::Udp(u) => u.bw_gso(size, limit),
        }
    }

    fn rtt(&self, size: u32, limit: Limit, warmup: u64) -> Result<Vec<u64>, PerfError> {
        match self {
            Baseline::Tcp(a) => tcp::ping_pong(*a, size, limit, warmup),
            Baseline::Udp(u) => u.rtt(size, limit, warmup),
        }
    }
}

/// The raw baseline beside `ctx`'s RDMA: UDP from its RoCE address (path MTU `mtu`), or TCP.
pub(super) fn baseline(ctx: &Context, raw: SocketAddr, mtu: u32) -> Baseline {
    match ctx.roce_local_addr() {
        Ok(a) => Baseline::Udp(UdpBaseline {
            server: raw,
            local: a.ip(),
            mtu,
        }),
        Err(_) => Baseline::Tcp(raw),
    }
}

/// `-b`: where the other direction runs.
enum Other<'a> {
    /// One way only.
    One,
    /// A second client in this process, toward our servers (--loopback).
    Local(&'a mut Client, &'a Baseline),
    /// The server, asked by [`Reverse`] requests, toward our listeners.
    Remote(Back),
}

/// `-b` against a server: our listeners and the window the server's side uses.
#[derive(Clone, Copy)]
struct Back {
    rdma_port: u16,
    raw_port: u16,
    tx_depth: u32,
    rx_depth: u32,
}

impl Back {
    /// Has the server run `what` toward us while `here` runs; both figures summed (`None`:
    /// a side without GSO).
    fn beside(
        &self,
        c: &mut Client,
        what: Measure,
        size: u32,
        limit: Limit,
        connect_timeout: Duration,
        here: impl FnOnce(&mut Client) -> Result<Option<Bw>, PerfError>,
    ) -> Result<Option<Bw>, PerfError> {
        let id = c.reverse_start(&Reverse {
            what,
            size,
            limit,
            tx_depth: self.tx_depth,
            rx_depth: self.rx_depth,
            rdma_port: self.rdma_port,
            raw_port: self.raw_port,
            nonce: nonce(),
        })?;
        let t0 = Instant::now();
        let mine = here(c);
        // The server's side started a round trip later and may be slower: its answer is
        // given time in proportion to ours.
        let theirs = c.reverse_end(id, connect_timeout + 2 * t0.elapsed() + REVERSE_SLACK);
        Ok(mine?.zip(theirs?).map(|(a, b)| a.plus(&b)))
    }
}

/// A number no earlier [`Reverse`] request of this process had, and unlikely in another's.
fn nonce() -> u64 {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    (t ^ (u64::from(std::process::id()) << 32)).wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// What the server's side of a `-b` measurement may take beyond twice ours.
const REVERSE_SLACK: Duration = Duration::from_secs(30);

/// Told the report so far each time a row completes; `false` stops the run there (its
/// report then holds the rows done).
pub type Progress<'a> = &'a mut dyn FnMut(&Report) -> bool;

/// Runs the client on `ctx` against the RDMA server at `rdma` and the raw server at `raw`.
pub fn run_client(
    args: &PerfArgs,
    ctx: Context,
    rdma: SocketAddr,
    raw: SocketAddr,
    mode: &'static str,
) -> Result<Report, PerfError> {
    run_client_with(args, ctx, rdma, raw, mode, &mut |_| true)
}

/// [`run_client`], telling `progress` of each row.
pub fn run_client_with(
    args: &PerfArgs,
    ctx: Context,
    rdma: SocketAddr,
    raw: SocketAddr,
    mode: &'static str,
    progress: Progress<'_>,
) -> Result<Report, PerfError> {
    run_client_both(args, ctx, rdma, raw, OtherWay::One, mode, progress)
}

/// `-b`'s other direction, as [`run_client_both`] is told of it.
enum OtherWay {
    /// None.
    One,
    /// A second client on `ctx`, toward the servers at `rdma` and `raw` (--loopback).
    Local {
        ctx: Context,
        rdma: SocketAddr,
        raw: SocketAddr,
    },
    /// The server, toward our listeners.
    Remote(Back),
}

/// [`run_client_with`], with `-b`'s other direction running the same tests the other way.
fn run_client_both(
    args: &PerfArgs,
    ctx: Context,
    rdma: SocketAddr,
    raw: SocketAddr,
    other: OtherWay,
    mode: &'static str,
    progress: Progress<'_>,
) -> Result<Report, PerfError> {
    let roce = ctx.transport() == softrdma::Transport::Roce;
    let o = args.client_opts()?;
    let local = ctx.roce_local_addr().ok();
    let base = baseline(&ctx, raw, o.pmtu);
    let mut report = Report {
        transport: if roce { "roce" } else { "iwarp" },
        mode,
        server: rdma.to_string(),
        device: ctx.device().name().to_owned(),
        mpa: None,
        roce: None,
        iwarp: None,
        tx_depth: args.tx_depth,
        completion_wait: if args.busy { "busy" } else { "block" },
        bw: Vec::new(),
        lat: Vec::new(),
        scale: Vec::new(),
        counters: None,
        bidirectional: !matches!(other, OtherWay::One),
    };
    let mut client = Client::new(ctx, rdma, o);
    // -b over loopback: the other side's client, toward our context's server.
    let (mut rev, back) = match other {
        OtherWay::Local { ctx, rdma, raw } => {
            let base = baseline(&ctx, raw, o.pmtu);
            (Some((Client::new(ctx, rdma, o), base, raw)), None)
        }
        OtherWay::Remote(back) => (None, Some(back)),
        OtherWay::One => (None, None),
    };
    let way = match (back, rev.as_mut()) {
        (Some(back), _) => Other::Remote(back),
        (None, Some((c, b, _))) => Other::Local(c, b),
        (None, None) => Other::One,
    };
    let r = measure(args, &mut client, &base, way, &mut report, progress);
    client.bye();
    let _ = tcp::bye(raw);
    if let Some((c, _, raw)) = &mut rev {
        c.bye();
        let _ = tcp::bye(*raw);
    }
    r?;
    if args.counters {
        report.counters = Some(CountersReport {
            qps: client
                .qps
                .iter()
                .map(|&(test, qp_num, counters)| QpCountersRow {
                    test,
                    qp_num,
                    counters,
                })
                .collect(),
            device: client.context().counters(),
        });
    }
    let conn = client.first_conn.as_ref();
    report.mpa = conn.and_then(|c| c.iwarp()).map(|c| MpaInfo {
        rev: c.negotiated.rev,
        crc: c.negotiated.crc,
        markers: c.negotiated.markers_tx || c.negotiated.markers_rx,
        mulpdu: c.mulpdu,
        emss: c.emss,
    });
    if !roce {
        let w = &client.stream;
        report.iwarp = Some(IwarpCounters {
            ulpdus_tx: w.ulpdus_tx,
            ulpdus_rx: w.ulpdus_rx,
            payload_rx: w.payload_rx,
            payload_rx_direct: w.payload_rx_direct,
            terminates_tx: w.terminates_tx,
            terminates_rx: w.terminates_rx,
        });
    }
    if roce {
        let pmtu = match conn.map(|c| &c.detail) {
            Some(softrdma::ConnectionDetail::Roce { pmtu, .. }) => *pmtu,
            _ => o.pmtu,
        };
        let (q, c) = (&client.requester, client.context().roce_counters()?);
        report.roce = Some(RoceInfo {
            pmtu,
            client: local.map(|a| a.to_string()).unwrap_or_default(),
            packets: q.packets,
            retransmitted: q.retransmitted,
            timeouts: q.timeouts,
            seq_naks: q.seq_naks,
            rnr_naks: q.rnr_naks,
            tx_datagrams: c.tx_packets,
            rx_datagrams: c.rx_packets,
            bad_icrc: c.bad_icrc,
            tx_errors: c.tx_errors,
        });
    }
    Ok(report)
}

/// Runs the bandwidth and latency tests `args` asks for, each beside the raw baseline of the
/// same size measured in the same run, into `report`.
fn measure(
    args: &PerfArgs,
    c: &mut Client,
    base: &Baseline,
    mut rev: Other<'_>,
    report: &mut Report,
    progress: Progress<'_>,
) -> Result<(), PerfError> {
    if !args.lat {
        let limit = args.limit(5000);
        let ct = Duration::from_secs_f64(args.connect_timeout);
        let missing = || PerfError::Protocol("the raw baseline measured nothing".into());
        for size in args.sizes(65536) {
            let raw = match &mut rev {
                Other::One => base.bw(size, limit)?,
                Other::Local(_, other) => {
                    let (a, b) = at_once(|| base.bw(size, limit), || other.bw(size, limit));
                    a?.plus(&b?)
                }
                Other::Remote(back) => back
                    .beside(c, Measure::Raw, size, limit, ct, |_| {
                        base.bw(size, limit).map(Some)
                    })?
                    .ok_or_else(missing)?,
            };
            let gso = match &mut rev {
                Other::One => base.bw_gso(size, limit)?,
                Other::Local(_, other) => {
                    let (a, b) = at_once(|| base.bw_gso(size, limit), || other.bw_gso(size, limit));
                    a?.zip(b?).map(|(a, b)| a.plus(&b))
                }
                Other::Remote(_) if matches!(base, Baseline::Tcp(_)) => None,
                Other::Remote(back) => back.beside(c, Measure::RawGso, size, limit, ct, |_| {
                    base.bw_gso(size, limit)
                })?,
            };
            for (test, _) in args.ops() {
                let rdma = match &mut rev {
                    Other::One => c.bw(test, size, limit)?,
                    Other::Local(other, _) => {
                        let (a, b) =
                            at_once(|| c.bw(test, size, limit), || other.bw(test, size, limit));
                        a?.plus(&b?)
                    }
                    Other::Remote(back) => back
                        .beside(c, Measure::Rdma(test), size, limit, ct, |c| {
                            c.bw(test, size, limit).map(Some)
                        })?
                        .ok_or_else(|| {
                            PerfError::Protocol("the server's side of -b measured nothing".into())
                        })?,
                };
                report.bw.push(BwRow {
                    test,
                    bytes: size,
                    rdma,
                    raw_tcp: raw,
                    ratio: rdma.gbit_s / raw.gbit_s,
                    raw_udp_gso: gso,
                    ratio_gso: gso.map(|g| rdma.gbit_s / g.gbit_s),
                });
                if !progress(report) {
                    return Ok(());
                }
            }
        }
    }
    if !args.bw {
        let limit = args.limit(1000);
        for size in args.sizes(64) {
            let mut raw_rtt = base.rtt(size, limit, WARMUP)?;
            for (_, test) in args.ops() {
                let half = test != Test::ReadLat;
                let mut s = c.lat(test, size, limit, WARMUP)?;
                let rdma = Lat::from_nanos(&mut s, if half { 2.0 } else { 1.0 });
                let raw = tcp::lat(&mut raw_rtt, half);
                if let (Some(rdma), Some(raw)) = (rdma, raw) {
                    report.lat.push(LatRow {
                        test,
                        bytes: size,
                        rdma,
                        raw_tcp: raw,
                        basis: if half {
                            "half_round_trip"
                        } else {
                            "round_trip"
                        },
                        ratio: rdma.t_typical / raw.t_typical,
                    });
                    if !progress(report) {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

/// A bar on standard error for `rows` rows: rows done, time so far; hidden when standard
/// error is not a terminal.
fn progress_bar(rows: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(rows),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        " {spinner} {pos}/{len} rows  {elapsed}  {wide_bar}",
    ) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Runs `a` here and `b` on another thread at once.
fn at_once<A: Send, B: Send>(a: impl FnOnce() -> A, b: impl FnOnce() -> B + Send) -> (A, B) {
    std::thread::scope(|s| {
        let h = s.spawn(b);
        let ra = a();
        let rb = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (ra, rb)
    })
}

/// Runs `--loopback`: a server (RDMA and raw) on threads of this process and the client,
/// over 127.0.0.1 (RoCE: the client on 127.0.0.2, UDP `--roce-port` or any free one).
pub fn run_loopback(args: &PerfArgs) -> Result<Report, PerfError> {
    run_loopback_with(args, &mut |_| true)
}

/// [`run_loopback`], telling `progress` of each row.
pub fn run_loopback_with(args: &PerfArgs, progress: Progress<'_>) -> Result<Report, PerfError> {
    if !args.qps.is_empty() {
        return run_scale(args, None);
    }
    let (server_ctx, client_ctx) = loopback_contexts(args)?;
    let listener = Listener::bind_with(&server_ctx, "127.0.0.1:0", args.listen_params())?;
    let rdma_addr = listener.local_addr();
    let raw_listener = TcpListener::bind("127.0.0.1:0")?;
    let raw_addr = raw_listener.local_addr()?;
    let sopts = args.server_opts(false)?;
    // -b: servers on the client's side too (RoCE: at its address), for the other direction.
    let back_ip = match args.transport {
        Transport::Iwarp => "127.0.0.1",
        Transport::Roce => "127.0.0.2",
    };
    let back = if args.bidirectional {
        let l = Listener::bind_with(&client_ctx, (back_ip, 0), args.listen_params())?;
        let raw = TcpListener::bind((back_ip, 0))?;
        Some((l, raw))
    } else {
        None
    };
    let reverse = match &back {
        Some((l, raw)) => OtherWay::Local {
            ctx: server_ctx.clone(),
            rdma: l.local_addr(),
            raw: raw.local_addr()?,
        },
        None => OtherWay::One,
    };
    let back_raw = match &reverse {
        OtherWay::Local { raw, .. } => Some(*raw),
        _ => None,
    };
    let quit = AtomicBool::new(false);
    std::thread::scope(|s| {
        let rdma_server = s.spawn(|| serve(&server_ctx, &listener, sopts, true, Some(&quit)));
        let raw_server = s.spawn(move || raw::serve(raw_listener, true));
        let back_servers = back.map(|(l, raw)| {
            let (cctx, quit) = (&client_ctx, &quit);
            (
                s.spawn(move || serve(cctx, &l, sopts, true, Some(quit))),
                s.spawn(move || raw::serve(raw, true)),
            )
        });
        let report = run_client_both(
            args,
            client_ctx.clone(),
            rdma_addr,
            raw_addr,
            reverse,
            "loopback",
            progress,
        );
        // A client that failed before its Bye leaves the servers waiting.
        quit.store(true, Ordering::Release);
        if report.is_err() {
            let _ = tcp::bye(raw_addr);
        }
        if report.is_err()
            && let Some(raw) = back_raw
        {
            let _ = tcp::bye(raw);
        }
        let r1 = rdma_server.join();
        let r2 = raw_server.join();
        if let Some((a, b)) = back_servers {
            for r in [a.join(), b.join().map(|r| r.map_err(PerfError::from))] {
                match r {
                    Ok(r) => r?,
                    Err(_) => return Err(PerfError::Protocol("a server thread panicked".into())),
                }
            }
        }
        let report = report?;
        match r1 {
            Ok(r) => r?,
            Err(_) => return Err(PerfError::Protocol("the server thread panicked".into())),
        }
        match r2 {
            Ok(r) => r?,
            Err(_) => return Err(PerfError::Protocol("the raw server thread panicked".into())),
        }
        Ok(report)
    })
}

/// `-b` against a server: our own RDMA and raw servers on `ctx` (ports the system picks,
/// which the server is told), and the client beside them.
fn run_remote_both(
    args: &PerfArgs,
    ctx: Context,
    rdma: SocketAddr,
    raw: SocketAddr,
    progress: Progress<'_>,
) -> Result<Report, PerfError> {
    let ip: IpAddr = match ctx.roce_local_addr() {
        Ok(a) => a.ip(),
        Err(_) => Ipv4Addr::UNSPECIFIED.into(),
    };
    let listener = Listener::bind_with(&ctx, (ip, 0), args.listen_params())
        .map_err(|e| PerfError::from(e).at(format!("listening on {ip} for -b")))?;
    let raw_listener = TcpListener::bind((ip, 0))
        .map_err(|e| PerfError::from(e).at(format!("listening on {ip} for -b's raw baseline")))?;
    let raw_here = raw_listener.local_addr()?;
    let raw_bye = match raw_here.ip().is_unspecified() {
        true => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), raw_here.port()),
        false => raw_here,
    };
    let back = Back {
        rdma_port: listener.local_addr().port(),
        raw_port: raw_here.port(),
        tx_depth: args.tx_depth.clamp(1, 16383),
        rx_depth: args.rx_depth.clamp(4, 1 << 16),
    };
    let sopts = args.server_opts(false)?;
    let quit = AtomicBool::new(false);
    std::thread::scope(|s| {
        let rdma_server = s.spawn(|| serve(&ctx, &listener, sopts, false, Some(&quit)));
        let raw_server = s.spawn(move || raw::serve(raw_listener, true));
        let report = run_client_both(
            args,
            ctx.clone(),
            rdma,
            raw,
            OtherWay::Remote(back),
            "client",
            progress,
        );
        quit.store(true, Ordering::Release);
        let _ = tcp::bye(raw_bye);
        let r1 = rdma_server.join();
        let r2 = raw_server.join();
        let report = report?;
        match r1 {
            Ok(r) => r?,
            Err(_) => return Err(PerfError::Protocol("the -b server thread panicked".into())),
        }
        match r2 {
            Ok(r) => r?,
            Err(_) => {
                return Err(PerfError::Protocol(
                    "the -b raw server thread panicked".into(),
                ));
            }
        }
        Ok(report)
    })
}

/// The server's and the client's context of a loopback run: iWARP, or RoCE on 127.0.0.1
/// and 127.0.0.2 sharing `--roce-port` or any free one.
pub(super) fn loopback_contexts(args: &PerfArgs) -> Result<(Context, Context), PerfError> {
    let ips = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)].map(IpAddr::from);
    // One side is captured: the other would write every segment again.
    let untapped = PerfArgs {
        tap: None,
        ..args.clone()
    };
    let port = args.roce_port.unwrap_or(0);
    if port != 0 || args.transport == Transport::Iwarp {
        return Ok((open(&untapped, ips[0], port)?, open(args, ips[1], port)?));
    }
    // Both RoCE contexts on one UDP port (peers are sent to at our own port).
    let cfgs = ips.map(|ip| roce_config(args, ip, 0));
    let mut ctxs = Device::open_sharing_a_port(&cfgs)
        .map_err(|e| PerfError::Usage(format!("no free UDP port for RoCE on loopback: {e}")))?;
    let client = ready(args, ctxs.pop().expect("two contexts"))?;
    Ok((ready(&untapped, ctxs.pop().expect("two contexts"))?, client))
}

/// Runs `-q`: the scale rows, over loopback or (`server`: our context, the server's
/// address) against a server.
fn run_scale(
    args: &PerfArgs,
    server: Option<(Option<&Context>, SocketAddr)>,
) -> Result<Report, PerfError> {
    let scale = scale::run(args, server)?;
    let ctx = server.and_then(|s| s.0);
    Ok(Report {
        transport: match args.transport {
            Transport::Iwarp => "iwarp",
            Transport::Roce => "roce",
        },
        mode: if server.is_some() {
            "client"
        } else {
            "loopback"
        },
        server: server.map_or_else(|| "127.0.0.1".into(), |(_, a)| a.to_string()),
        device: match ctx {
            Some(ctx) => ctx.device().name().to_owned(),
            None => match args.transport {
                Transport::Iwarp => Device::tcp(),
                Transport::Roce => Device::roce(RoceConfig::new(Ipv4Addr::LOCALHOST.into())),
            }
            .name()
            .to_owned(),
        },
        mpa: None,
        roce: None,
        iwarp: None,
        tx_depth: 1,
        completion_wait: if args.busy { "busy" } else { "block" },
        bw: Vec::new(),
        lat: Vec::new(),
        scale,
        counters: None,
        bidirectional: false,
    })
}

/// Runs `--server`.
pub fn run_server(args: &PerfArgs) -> Result<(), PerfError> {
    let ip = match args.transport {
        Transport::Roce => bind_ip(args)?.unwrap_or_else(default_roce_ip),
        Transport::Iwarp => Ipv4Addr::UNSPECIFIED.into(),
    };
    let ctx = open(args, ip, args.roce_port())?;
    let addr = resolve(&args.bind, args.port)?;
    let listener = Listener::bind_with(&ctx, addr, args.listen_params())
        .map_err(|e| PerfError::from(e).at(format!("listening on {addr} (-B, -p)")))?;
    let wait = args.wait();
    if args.perftest {
        let buf_len = args.size.map_or(16 << 20, |s| s as usize);
        eprintln!(
            "softrdma perf: waiting for a perftest client (-R) on {} ({}, {} octets of buffer)",
            listener.local_addr(),
            match args.transport {
                Transport::Iwarp => "iWARP",
                Transport::Roce => "RoCE",
            },
            buf_len
        );
        let sum = perftest_server::serve(&ctx, &listener, buf_len, args.fpdu.0, wait, true)?;
        println!(
            "perftest session done: {} out-of-band messages, {} Sends received",
            sum.oob_messages, sum.data_recvs
        );
        if let Some((size, iters, peak, avg, mpps)) = sum.report {
            println!(
                " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
            );
            println!(
                " {size:<10} {iters:<14} {peak:<18.2} {avg:<20.2} {mpps:.6}   (the client's report)"
            );
        }
        return Ok(());
    }
    let raw_addr = resolve(&args.bind, args.raw_port())?;
    let raw_listener = TcpListener::bind(raw_addr).map_err(|e| {
        PerfError::from(e).at(format!(
            "listening on {raw_addr} for the raw baseline (--tcp-port)"
        ))
    })?;
    match ctx.roce_local_addr() {
        Ok(roce) => eprintln!(
            "softrdma perf: serving on {} (RoCE connections; RoCE on {roce}) and {} (raw UDP)",
            listener.local_addr(),
            raw_listener.local_addr()?
        ),
        Err(_) => eprintln!(
            "softrdma perf: serving on {} (iWARP) and {} (raw TCP)",
            listener.local_addr(),
            raw_listener.local_addr()?
        ),
    }
    let once = args.once;
    let raw_thread = std::thread::spawn(move || raw::serve(raw_listener, once));
    serve(&ctx, &listener, args.server_opts(true)?, once, None)?;
    if once {
        let _ = raw_thread.join();
    }
    Ok(())
}

/// Entry point of `softrdma perf`.
pub fn run(args: &PerfArgs) -> Result<(), PerfError> {
    // perftest's -d picks the transport.
    let mut args = args.clone();
    if let Some(t) = args.ib_dev {
        args.transport = t;
    }
    args.check()?;
    if let Some(path) = &args.pcap {
        args.tap = Some(PcapTap::create(path).map_err(PerfError::Usage)?);
    }
    let r = run_checked(&args);
    // What was captured is kept whatever the outcome (an interrupted or failed run too).
    if let Some(t) = &args.tap
        && !t.finish_and_tell("softrdma perf")
        && r.is_ok()
    {
        return Err(PerfError::Protocol(format!(
            "--pcap {}: not written",
            t.path().display()
        )));
    }
    r
}

fn run_checked(args: &PerfArgs) -> Result<(), PerfError> {
    if args.server {
        return run_server(args);
    }
    // Ctrl-C: the row in progress finishes, then the rows done are reported (a second one
    // exits at once).
    let stop = interrupt_flag();
    // The table streams: each row is printed as it completes; on a terminal a bar on
    // standard error shows the rows done and the time (indicatif draws nothing elsewhere).
    let mut shown = 0;
    let stream = !args.json;
    let bar = progress_bar(args.expected_rows());
    let mut progress = |r: &Report| {
        if stream {
            let body = render_body(r);
            let lines: Vec<&str> = body.lines().collect();
            // The body's last line is its closing rule, printed at the end.
            let upto = lines.len().saturating_sub(1);
            bar.suspend(|| {
                let mut out = std::io::stdout().lock();
                for l in lines.iter().take(upto).skip(shown) {
                    let _ = writeln!(out, "{l}");
                }
                let _ = out.flush();
            });
            shown = shown.max(upto);
        }
        bar.set_position((r.bw.len() + r.lat.len()) as u64);
        !stop.load(Ordering::Acquire)
    };
    let report = if args.loopback {
        let r = run_loopback_with(args, &mut progress);
        bar.finish_and_clear();
        r?
    } else {
        let host = args.host.as_deref().unwrap_or_default();
        if args.perftest {
            let r = if args.rdma_cm {
                perftest_cm_client::perftest_cm_client(args, host)?
            } else {
                perftest_client(args, host)?
            };
            bar.finish_and_clear();
            print!("{}", r.render());
            return Ok(());
        }
        let rdma = resolve(host, args.port)?;
        let raw = resolve(host, args.raw_port())?;
        let ip = match (args.transport, bind_ip(args)) {
            (Transport::Iwarp, _) => Ipv4Addr::UNSPECIFIED.into(),
            (Transport::Roce, Ok(Some(ip))) => ip,
            (Transport::Roce, Ok(None)) => local_ip_toward(rdma)?,
            (Transport::Roce, Err(e)) => return Err(e),
        };
        let r = if !args.qps.is_empty() {
            // A list's rows run in child processes, each with a context on our address:
            // ours opens only for a single row, or after them for the Bye.
            let (r, ctx) = if args.qps.len() == 1 {
                let ctx = open(args, ip, args.roce_port())?;
                (run_scale(args, Some((Some(&ctx), rdma))), Some(ctx))
            } else {
                (run_scale(args, Some((None, rdma))), None)
            };
            if !args.scale_child {
                let ctx = match ctx {
                    Some(c) => c,
                    None => open(args, ip, args.roce_port())?,
                };
                Client::new(ctx, rdma, args.client_opts()?).bye();
                let _ = tcp::bye(raw);
            }
            r
        } else if args.bidirectional {
            let ctx = open(args, ip, args.roce_port())?;
            run_remote_both(args, ctx, rdma, raw, &mut progress)
        } else {
            let ctx = open(args, ip, args.roce_port())?;
            run_client_with(args, ctx, rdma, raw, "client", &mut progress)
        };
        bar.finish_and_clear();
        r?
    };
    if let Some(path) = &args.plot {
        plot::plot(&report, path)?;
    }
    if args.out_json {
        let file = |source| PerfError::File {
            path: args.out_json_file.display().to_string(),
            source,
        };
        let f = std::fs::File::create(&args.out_json_file).map_err(file)?;
        let mut w = std::io::BufWriter::new(f);
        serde_json::to_writer_pretty(&mut w, &json(&report))
            .map_err(std::io::Error::from)
            .and_then(|()| w.flush())
            .map_err(file)?;
    }
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    if args.json {
        let _ = serde_json::to_writer_pretty(&mut w, &json(&report));
        let _ = writeln!(w);
    } else {
        // What the rows did not print yet: a table without rows (scale), the closing rule,
        // the negotiated parameters and counters.
        for l in render_body(&report).lines().skip(shown) {
            let _ = writeln!(w, "{l}");
        }
        let _ = write!(w, "{}", render_tail(&report));
    }
    let _ = w.flush();
    if stop.load(Ordering::Acquire) {
        return Err(PerfError::Interrupted);
    }
    Ok(())
}

/// Set by the first SIGINT (the run reports what it has); a second one ends the process.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let sig = signal_hook::consts::SIGINT;
    // Registered first: it acts only once the flag is set, i.e. on the second signal.
    let _ = signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone());
    let _ = signal_hook::flag::register(sig, flag.clone());
    flag
}
