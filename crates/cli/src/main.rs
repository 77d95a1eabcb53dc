//! `softrdma`: the command-line front of the softrdma stack.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use softrdma_cli::decode;
use softrdma_cli::{nfs, nfsd, perf, pingpong, rpcbench, rping, run, udaddy};

mod alloc;

#[global_allocator]
static GLOBAL: alloc::Allocator = alloc::Allocator;

#[derive(Parser)]
#[command(
    name = "softrdma",
    version,
    about = "softrdma: software RDMA (iWARP and RoCEv2) in user space"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Decode iWARP (MPA/DDP/RDMAP), RoCEv2 and RPC-over-RDMA in a pcap or pcapng file.
    Decode {
        /// The capture file (pcap or pcapng); `-`: standard input.
        file: PathBuf,
        /// Decode only the first N frames (as tshark -c).
        #[arg(short = 'c', long = "count", value_name = "N",
              value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Also decode UDP datagrams to this port as RoCEv2 (4791 always is; repeatable).
        #[arg(long = "roce-port", value_name = "PORT")]
        roce_port: Vec<u16>,
        /// Print every field of every message.
        #[arg(short, long)]
        verbose: bool,
        /// One JSON object per message (JSON Lines), for machines.
        #[arg(long)]
        json: bool,
        /// Exit non-zero when anything fails to decode or verify.
        #[arg(long)]
        strict: bool,
        /// Also print frames that carry no RDMA message (TCP ACKs, other traffic).
        #[arg(short = 'a', long)]
        all: bool,
    },
    /// Bandwidth and latency of RDMA Write, RDMA Read and Send, beside raw TCP (iWARP) or
    /// raw UDP (--transport roce), perftest style: --loopback, --server, or a client of HOST.
    Perf(perf::PerfArgs),
    /// A peer of librdmacm's rping: -s server, -c client (-a addr -p port -C count -S size
    /// -v -V).
    Rping(rping::RpingArgs),
    /// A peer of librdmacm's udaddy over RoCEv2 (UD through SIDR): server, or client of
    /// -s HOST (-C count -S size).
    Udaddy(udaddy::UdaddyArgs),
    /// A peer of rdma-core's ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong over
    /// RoCEv2: server without HOST, client with it.
    Pingpong(pingpong::PingpongArgs),
    /// An NFSv3 client over RPC-over-RDMA (default) or TCP: ls, get, put, rm, stat of
    /// nfs://HOST[:PORT]/EXPORT/PATH.
    Nfs(nfs::NfsArgs),
    /// An NFSv3 server of local directories over RPC-over-RDMA (port 20049) and TCP (2049),
    /// for the Linux client's `mount -o vers=3,proto=rdma,port=20049`.
    Nfsd(nfsd::NfsdArgs),
    /// ONC RPC tools: `bench` (RPC-over-RDMA beside RPC over TCP, loopback).
    #[command(subcommand)]
    Rpc(rpcbench::RpcCmd),
    /// Run an unmodified C RDMA program (rdma-core's libibverbs and librdmacm) on softrdma:
    /// `softrdma run -- ibv_devinfo -v`.
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    // RUST_LOG=softrdma_iwarp=debug,... : the libraries' events on standard error (nothing
    // when unset).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::OFF.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Decode {
            file,
            count,
            roce_port,
            verbose,
            json,
            strict,
            all,
        } => run_decode(
            &file,
            &decode::Options {
                all,
                roce_ports: roce_port,
                max_frames: count,
                ..decode::Options::default()
            },
            verbose,
            json,
            strict,
        ),
        Cmd::Perf(args) => match perf::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            // Bad options exit 2, as clap's own refusals do.
            // As a shell reports a SIGINT: 128 + 2.
            Err(perf::PerfError::Interrupted) => ExitCode::from(130),
            Err(e @ perf::PerfError::Usage(_)) => {
                eprintln!("softrdma perf: {e}");
                ExitCode::from(2)
            }
            Err(e) => {
                eprintln!("softrdma perf: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Rping(args) => ExitCode::from(rping::run(&args).clamp(0, 255) as u8),
        Cmd::Pingpong(args) => ExitCode::from(pingpong::run(&args).clamp(0, 255) as u8),
        Cmd::Udaddy(args) => ExitCode::from(udaddy::run(&args).clamp(0, 255) as u8),
        Cmd::Nfs(args) => ExitCode::from(nfs::run(&args).clamp(0, 255) as u8),
        Cmd::Nfsd(mut args) => {
            args.memory = Some(alloc::describe);
            ExitCode::from(nfsd::run(&args).clamp(0, 255) as u8)
        }
        Cmd::Rpc(cmd) => ExitCode::from(rpcbench::run(&cmd).clamp(0, 255) as u8),
        Cmd::Run(args) => ExitCode::from(run::run(&args).clamp(0, 255) as u8),
    }
}

fn run_decode(
    file: &std::path::Path,
    opts: &decode::Options,
    verbose: bool,
    json: bool,
    strict: bool,
) -> ExitCode {
    let out = if file.as_os_str() == "-" {
        decode::decode_reader("<stdin>", std::io::stdin().lock(), opts)
    } else {
        decode::decode_file(file, opts)
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("softrdma decode: {e}");
            return ExitCode::from(2);
        }
    };
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    for r in &out.records {
        let line = if json {
            serde_json::to_string(r).unwrap_or_default()
        } else if verbose {
            r.verbose()
        } else {
            r.line()
        };
        if writeln!(w, "{line}").is_err() {
            return ExitCode::SUCCESS; // reader went away (e.g. `| head`)
        }
    }
    let _ = w.flush();
    let bad = out.records.iter().filter(|r| !r.clean()).count()
        + out.stream_errors.len()
        + usize::from(out.cut.is_some());
    for e in &out.stream_errors {
        eprintln!("softrdma decode: {e}");
    }
    for n in &out.notes {
        eprintln!("softrdma decode: note: {n}");
    }
    if let Some(c) = &out.cut {
        eprintln!("softrdma decode: {}: {c}", file.display());
    }
    if !json {
        eprintln!(
            "{} frames, {} messages, {} with errors",
            out.frames,
            out.records.len(),
            bad
        );
    }
    if strict && bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
