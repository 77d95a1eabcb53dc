//! `softrdma rpc bench`: ONC RPC over RPC-over-RDMA beside the same RPC over TCP, in one
//! process over loopback: the NULL-call rate with calls in flight, and 1 MiB calls whose
//! result comes back through a Write chunk (RFC 8166 §3.4.6) — as `perf` sets RDMA beside raw
//! sockets.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma::roce::RoceConfig;
use softrdma::{Buffer, BusyPoll, Context, Device, Listener};

use crate::pcap_out::{PcapTap, with_pcap_or_fail};
use crate::perf::RawTxArg;
use clap::ValueEnum;
use softrdma_rpc::rdma::{RdmaConfig, RdmaTransport};
use softrdma_rpc::tcp::TcpTransport;
use softrdma_rpc::{
    CallContext, Client, Payload, Pending, ProcError, Registry, ReplySpace, Server, ServerConfig,
};

use crate::verbs_util::TransportArg;

const PROG: u32 = 0x2000_5150;
const NULL: u32 = 0;
/// Results: an opaque of the length the arguments ask for (DDP-eligible).
const FETCH: u32 = 1;
/// Arguments: an opaque (DDP-eligible); results: its length.
const STORE: u32 = 2;
/// The octets FETCH returns.
const FILL: u8 = 0x5A;

/// `softrdma rpc bench` arguments.
#[derive(clap::Args, Debug)]
pub struct RpcBenchArgs {
    /// RDMA device: iwarp or roce.
    #[arg(long, value_enum, default_value = "iwarp")]
    pub transport: TransportArg,
    /// Seconds per test.
    #[arg(short = 'D', long, default_value_t = 2.0)]
    pub duration: f64,
    /// RoCE path MTU of the RPC connection and of the plain RDMA Write beside it (perf's
    /// default over loopback).
    #[arg(long, default_value_t = 4096)]
    pub mtu: u32,
    /// RoCE: how IPv4 datagrams leave (as `perf --raw-tx`; the plain RDMA Write beside
    /// the large calls uses the same).
    #[arg(long, value_enum, default_value_t = RawTxArg::Auto)]
    pub raw_tx: RawTxArg,
    /// Calls in flight per connection.
    #[arg(short = 'q', long, default_value_t = 16)]
    pub depth: usize,
    /// Size of the large calls' result.
    #[arg(short = 's', long, default_value_t = 1 << 20)]
    pub size: usize,
    /// Large calls in flight (each lends a Write chunk of `size` octets).
    #[arg(long, default_value_t = 4)]
    pub large_depth: usize,
    /// The server's handler threads (its pool).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Run the procedures in the thread that reads the calls (`Registry::inline`: they
    /// never block) instead of handing each to the server's pool, over both transports.
    #[arg(long)]
    pub inline: bool,
    /// Busy poll of the RPC-over-RDMA connections' CQs, adaptive up to this many µs
    /// (`RdmaConfig::busy_poll`; 0: off, the default, as RPC over TCP sleeps in its reads).
    #[arg(long, default_value_t = 0)]
    pub busy_poll: u64,
    /// Which tests to run (NULL calls, large results, large arguments); the plain RDMA
    /// Write runs with `results`.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "null,results,args"
    )]
    pub tests: Vec<RpcTest>,
    /// One side only (for profiling): `rdma` leaves out RPC over TCP and the plain RDMA
    /// Write, `tcp` RPC-over-RDMA and the plain Write.
    #[arg(long, value_enum)]
    pub only: Option<RpcSide>,
    /// After the run: the RDMA client's QP counters and both devices' counters.
    #[arg(long)]
    pub counters: bool,
    /// One JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write the RPC-over-RDMA traffic, as the client saw it, to this pcap file (for
    /// `softrdma decode` and tshark; every octet is kept: use a short -D).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// The side `rpc bench --only` runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcSide {
    /// RPC-over-RDMA.
    Rdma,
    /// RPC over TCP.
    Tcp,
}

/// One of `rpc bench`'s tests.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcTest {
    /// NULL calls with `--depth` in flight.
    Null,
    /// Large results through a Write chunk.
    Results,
    /// Large arguments through a Read chunk.
    Args,
}

/// `softrdma rpc` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum RpcCmd {
    /// NULL-call rate and large calls, RPC-over-RDMA beside RPC over TCP (loopback).
    Bench(RpcBenchArgs),
}

fn program(size: usize) -> impl softrdma_rpc::Program {
    // The results are served from memory the program keeps, as an in-memory service
    // serves them: over RDMA they are written from there (no copy per call).
    let data = Buffer::adopt(vec![FILL; size]);
    move |ctx: &CallContext<'_>, args: &[u8]| -> Result<Payload, ProcError> {
        match ctx.header.proc {
            NULL => Ok(Payload::default()),
            STORE => {
                let n = args
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or(ProcError::GarbageArgs)?;
                if args.len() < 4 + n as usize {
                    return Err(ProcError::GarbageArgs);
                }
                Ok(Payload::from(n.to_be_bytes().to_vec()))
            }
            FETCH => {
                let n = args
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or(ProcError::GarbageArgs)?;
                let n = n.min(data.len());
                Ok(Payload::with_shared(
                    Vec::with_capacity(4),
                    data.clone(),
                    0..n,
                ))
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

/// Whether a FETCH reply carries `size` octets of the program's data: an XDR `opaque<>`,
/// its length word in the results, its data there too (with its XDR padding, RPC over TCP
/// or an inline reply) or apart (an RPC-over-RDMA Write chunk, which carries no padding,
/// RFC 8166 §3.4.4). Its first and last octets are looked at, not all of them: the figure
/// is a bandwidth.
fn fetched_whole(r: &softrdma_rpc::Reply, size: usize) -> bool {
    let len = r
        .results
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let data = match &r.bulk {
        Some(b) if r.results.len() == 4 => Some(&b[..]),
        Some(_) => None,
        None if r.results.len() == 4 + softrdma_wire::xdr::padded_len(size) => {
            r.results.get(4..4 + size)
        }
        None => None,
    };
    len == Some(size)
        && data.is_some_and(|d| {
            d.len() == size
                && [d.first(), d.last()]
                    .iter()
                    .all(|o| o.is_none_or(|&o| o == FILL))
        })
}

/// One measured figure per transport.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Figures {
    /// NULL calls per second.
    pub null_per_s: Option<f64>,
    /// Large-call result bandwidth, Gb/s (results through a Write chunk).
    pub large_gbps: Option<f64>,
    /// Large-argument bandwidth, Gb/s (arguments through a Read chunk).
    pub args_gbps: Option<f64>,
}

/// Calls `call` with `depth` in flight for `d`; completed calls per second.
fn rate(
    c: &Client,
    depth: usize,
    d: Duration,
    mut start: impl FnMut(&Client) -> Pending,
    mut check: impl FnMut(softrdma_rpc::Reply),
) -> Result<f64, String> {
    let mut q: std::collections::VecDeque<Pending> = (0..depth).map(|_| start(c)).collect();
    let t0 = Instant::now();
    let mut done = 0u64;
    while let Some(p) = q.pop_front() {
        check(p.wait().map_err(|e| e.to_string())?);
        done += 1;
        if t0.elapsed() < d {
            q.push_back(start(c));
        }
    }
    Ok(done as f64 / t0.elapsed().as_secs_f64())
}

/// One test's figure over client `c`: NULL calls per second, or Gb/s of large results or
/// arguments.
fn measure(c: &Client, a: &RpcBenchArgs, test: RpcTest) -> Result<f64, String> {
    let d = Duration::from_secs_f64(a.duration);
    let gbps = |calls: f64| calls * a.size as f64 * 8.0 / 1e9;
    let size = a.size;
    let mut bad = 0usize;
    let (calls, short) = match test {
        RpcTest::Null => {
            return rate(
                c,
                a.depth,
                d,
                |c| {
                    // A NULL reply is 24 octets: no Reply chunk needed (the ULB's maximum).
                    c.start_with(
                        PROG,
                        1,
                        NULL,
                        &Payload::default(),
                        ReplySpace { max: 64, ddp: None },
                    )
                    .expect("start")
                },
                |_| {},
            );
        }
        RpcTest::Results => {
            let space = ReplySpace {
                max: 256,
                ddp: Some(size),
            };
            let args = Payload::from((size as u32).to_be_bytes().to_vec());
            let calls = rate(
                c,
                a.large_depth.max(1),
                d,
                |c| c.start_with(PROG, 1, FETCH, &args, space).expect("start"),
                |r| {
                    if !fetched_whole(&r, size) {
                        bad += 1;
                    }
                },
            )?;
            (calls, "large calls came back short")
        }
        RpcTest::Args => {
            let data = vec![0xA5u8; size];
            let store = Payload::with_opaque(Vec::new(), &data);
            let calls = rate(
                c,
                a.large_depth.max(1),
                d,
                |c| {
                    c.start_with(PROG, 1, STORE, &store, ReplySpace { max: 64, ddp: None })
                        .expect("start")
                },
                |r| {
                    if r.results != (size as u32).to_be_bytes() {
                        bad += 1;
                    }
                },
            )?;
            (calls, "large arguments arrived short")
        }
    };
    match bad {
        0 => Ok(gbps(calls)),
        n => Err(format!("{n} {short}")),
    }
}

/// Server and client contexts on 127.0.0.1 and 127.0.0.2 (RoCE: one free UDP port).
fn open_pair(t: TransportArg, raw_tx: RawTxArg) -> Result<(Context, Context), String> {
    let ips = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)].map(IpAddr::V4);
    match t {
        TransportArg::Iwarp => {
            let open = || {
                Device::tcp()
                    .open()
                    .map_err(|e| format!("{}: {e}", softrdma::TCP_DEVICE_NAME))
            };
            Ok((open()?, open()?))
        }
        TransportArg::Roce => {
            let cfgs = ips.map(|ip| RoceConfig {
                raw_tx: raw_tx.into(),
                ..RoceConfig::new(ip)
            });
            let mut c = Device::open_sharing_a_port(&cfgs).map_err(|e| format!("RoCE: {e}"))?;
            let client = c.pop().ok_or("RoCE: no context")?;
            Ok((c.pop().ok_or("RoCE: no context")?, client))
        }
    }
}

/// Runs `softrdma rpc bench`; the exit status.
pub fn run(cmd: &RpcCmd) -> i32 {
    let RpcCmd::Bench(a) = cmd;
    with_pcap_or_fail(a.pcap.as_deref(), "softrdma rpc bench", |tap| bench(a, tap))
}

fn bench(a: &RpcBenchArgs, tap: Option<&Arc<PcapTap>>) -> Result<(), String> {
    let mut reg = Registry::new();
    reg.register(PROG, 1, program(a.size));
    if a.inline {
        // Memory only, never blocking: run where the calls are read, on both transports.
        reg.inline(PROG, 1, &[NULL, FETCH, STORE]);
    }
    let server = Arc::new(Server::new(
        reg,
        ServerConfig {
            threads: a.threads.max(1),
            max_record: a.size + 4096,
            ..ServerConfig::default()
        },
    ));
    let (sctx, cctx) = open_pair(a.transport, a.raw_tx)?;
    if let Some(t) = tap {
        t.attach(&cctx)?;
    }
    let cfg = RdmaConfig {
        credits: 32,
        max_message: a.size + 4096,
        roce_pmtu: a.mtu,
        busy_poll: match a.busy_poll {
            0 => BusyPoll::Off,
            us => BusyPoll::Adaptive {
                max: Duration::from_micros(us),
            },
        },
        ..RdmaConfig::default()
    };
    let l = Listener::bind(&sctx, "127.0.0.1:0").map_err(|e| e.to_string())?;
    let rdma_srv = server
        .serve_rdma(&sctx, l, cfg)
        .map_err(|e| e.to_string())?;
    let tcp_srv = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let rdma_conn = Arc::new(
        RdmaTransport::connect(&cctx, rdma_srv.local_addr(), cfg).map_err(|e| e.to_string())?,
    );
    let rdma = Client::new(rdma_conn.clone(), a.depth.max(1));
    let tcp = Client::new(
        Arc::new(
            TcpTransport::from_stream(
                std::net::TcpStream::connect(tcp_srv.local_addr()).map_err(|e| e.to_string())?,
                a.size + 4096,
            )
            .map_err(|e| e.to_string())?,
        ),
        a.depth.max(1),
    );
    // Warm both up (the RDMA client's first grant).
    for c in [&rdma, &tcp] {
        c.call(PROG, 1, NULL, &[]).map_err(|e| e.to_string())?;
    }
    let none = Figures {
        null_per_s: None,
        large_gbps: None,
        args_gbps: None,
    };
    let (mut r, mut t, mut write) = (none, none, None);
    // Test by test, each figure next to the ones it is set against: this machine's speed
    // drifts by more than the differences measured from one half-minute to the next.
    for test in [RpcTest::Null, RpcTest::Results, RpcTest::Args] {
        if !a.tests.contains(&test) {
            continue;
        }
        if test == RpcTest::Results && a.only.is_none() {
            // `perf` runs its raw TCP stream first: its RDMA Write ends where the calls
            // begin.
            write = Some(plain_write(a)?);
        }
        let x = match a.only {
            Some(RpcSide::Tcp) => None,
            _ => Some(measure(&rdma, a, test)?),
        };
        let y = match a.only {
            Some(RpcSide::Rdma) => None,
            _ => Some(measure(&tcp, a, test)?),
        };
        for (f, v) in [(&mut r, x), (&mut t, y)] {
            match test {
                RpcTest::Null => f.null_per_s = v,
                RpcTest::Results => f.large_gbps = v,
                RpcTest::Args => f.args_gbps = v,
            }
        }
    }
    let counters = a.counters.then(|| {
        let mut s = String::new();
        s.push_str(&crate::counters::qp(
            "RPC client",
            rdma_conn.qp_num(),
            &rdma_conn.qp_counters(),
        ));
        s.push_str(&crate::counters::device(&cctx));
        s.push_str(&crate::counters::device(&sctx));
        s
    });
    drop((rdma, rdma_conn, tcp, rdma_srv, tcp_srv));
    let ratio = |x: Option<f64>, y: Option<f64>| Some(x? / y?);
    if a.json {
        let doc = serde_json::json!({
            "transport": format!("{:?}", a.transport).to_lowercase(),
            "depth": a.depth,
            "size": a.size,
            "inline": a.inline,
            "busy_poll_us": a.busy_poll,
            "threads": a.threads,
            "mtu": a.mtu,
            "rdma": r,
            "tcp": t,
            "null_ratio": ratio(r.null_per_s, t.null_per_s),
            "large_ratio": ratio(r.large_gbps, t.large_gbps),
            "rdma_write_gbps": write,
            "large_vs_write": ratio(r.large_gbps, write),
            "args_ratio": ratio(r.args_gbps, t.args_gbps),
        });
        println!("{doc}");
    } else {
        println!(
            " test                       {:>14} {:>14}   ratio",
            "RPC-over-RDMA", "RPC over TCP"
        );
        // A figure not measured (its test not run, or its side left out) shows as "-".
        let cell = |v: Option<f64>, prec: usize| v.map_or("-".into(), |v| format!("{v:.prec$}"));
        let row = |name: String, x: Option<f64>, y: Option<f64>, prec: usize| {
            if x.is_some() || y.is_some() {
                println!(
                    " {name:<27} {:>14} {:>14}   {}",
                    cell(x, prec),
                    cell(y, prec),
                    cell(ratio(x, y), 2)
                );
            }
        };
        row(
            format!("NULL calls/s (depth {:>3})", a.depth),
            r.null_per_s,
            t.null_per_s,
            0,
        );
        row(
            format!("{:>7}-octet results Gb/s", a.size),
            r.large_gbps,
            t.large_gbps,
            2,
        );
        row(
            format!("{:>7}-octet args Gb/s", a.size),
            r.args_gbps,
            t.args_gbps,
            2,
        );
        if let (Some(x), Some(w)) = (r.large_gbps, write) {
            println!(
                " plain RDMA Write Gb/s (perf) {w:>12.2} {:>14}   {:.2}  (results / Write)",
                "",
                x / w
            );
        }
    }
    if let Some(c) = counters {
        // After the figures, so that scripts reading the JSON line find it first.
        eprint!("{c}");
    }
    Ok(())
}

/// `softrdma perf --loopback --bw --op write` of `size` octets on the same transport, in
/// this run: what the large calls' Write chunks are measured against.
fn plain_write(a: &RpcBenchArgs) -> Result<f64, String> {
    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        perf: crate::perf::PerfArgs,
    }
    let transport = format!("{:?}", a.transport).to_lowercase();
    let (size, secs, mtu) = (
        a.size.to_string(),
        a.duration.to_string(),
        a.mtu.to_string(),
    );
    let mut argv = vec![
        "perf",
        "--loopback",
        "--bw",
        "--op",
        "write",
        "--transport",
        &transport,
        "-s",
        &size,
        "-D",
        &secs,
    ];
    let raw_tx = a
        .raw_tx
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    if a.transport == TransportArg::Roce {
        argv.extend(["--mtu", &mtu, "--raw-tx", &raw_tx]);
    }
    let p = <P as clap::Parser>::try_parse_from(argv).map_err(|e| e.to_string())?;
    let report = crate::perf::run_loopback(&p.perf).map_err(|e| e.to_string())?;
    report
        .bw
        .first()
        .map(|row| row.rdma.gbit_s)
        .ok_or_else(|| "perf measured no RDMA Write".to_string())
}
