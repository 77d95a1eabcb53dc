//! `softrdma perf`'s command line: the arguments, their checks and what they select.

use std::sync::Arc;
use std::time::Duration;

use softrdma::iwarp::FpduSize;
use softrdma::{BusyPoll, DEFAULT_BACKGROUND_POLL, DEFAULT_BUSY_POLL, ListenParams};

use super::proto::Test;
use super::{ClientOpts, PerfError, PerftestTest, ServerOpts, Transport, server};
use crate::pcap_out::PcapTap;
use crate::verbs_util::WaitMode;

/// How long a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// This many messages (latency: round trips).
    Iters(u64),
    /// This long.
    Duration(Duration),
}

impl Limit {
    /// A loop of rounds that ran `done` of them since `start` is over (one round at least).
    pub fn reached(self, done: u64, start: std::time::Instant) -> bool {
        match self {
            Limit::Iters(k) => done >= k,
            Limit::Duration(d) => done > 0 && start.elapsed() >= d,
        }
    }

    /// The one latency loop: runs `round_trip(i)` (which returns the time of its timed
    /// part) for `warmup` untimed iterations and then until the limit; the samples in
    /// nanoseconds.
    pub fn sample(
        self,
        warmup: u64,
        mut round_trip: impl FnMut(u64) -> Result<Duration, PerfError>,
    ) -> Result<Vec<u64>, PerfError> {
        let mut samples = Vec::new();
        let start = std::time::Instant::now();
        for i in 0.. {
            match self {
                Limit::Iters(k) if i >= k + warmup => break,
                Limit::Duration(d) if i >= warmup && start.elapsed() >= d => break,
                _ => {}
            }
            let dt = round_trip(i)?;
            if i >= warmup {
                samples.push(dt.as_nanos() as u64);
            }
        }
        Ok(samples)
    }
}

/// Which operations to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpArg {
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// Send/Receive.
    Send,
    /// All three.
    All,
}

/// FPDU size policy on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FpduArg(pub FpduSize);

impl std::str::FromStr for FpduArg {
    type Err = String;
    fn from_str(s: &str) -> Result<FpduArg, String> {
        Ok(FpduArg(match s {
            "mss" => FpduSize::PathMss,
            "largest" => FpduSize::Largest,
            n => match n.parse::<u16>() {
                // RFC 5044 §5.1: a ULPDU of 128 to 64768 octets (MPA-07).
                Ok(m) if (128..=64768).contains(&m) => FpduSize::Mulpdu(m),
                _ => {
                    return Err(format!(
                        "expected mss, largest or a MULPDU of 128 to 64768 octets, got {n:?}"
                    ));
                }
            },
        }))
    }
}

/// `--raw-tx`: [`softrdma::roce::RawTx`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RawTxArg {
    /// The UDP socket where the kernel writes the IPv4 Identification its ICRCs assume,
    /// else a raw socket if the process may open one.
    Auto,
    /// Always the UDP socket.
    Off,
    /// A raw socket, or fail.
    Required,
}

impl From<RawTxArg> for softrdma::roce::RawTx {
    fn from(a: RawTxArg) -> softrdma::roce::RawTx {
        match a {
            RawTxArg::Auto => softrdma::roce::RawTx::Auto,
            RawTxArg::Off => softrdma::roce::RawTx::Off,
            RawTxArg::Required => softrdma::roce::RawTx::Required,
        }
    }
}

/// `softrdma perf` options (perftest's names where they overlap).
#[derive(clap::Args, Clone, Debug)]
pub struct PerfArgs {
    /// Run as client of the server on HOST.
    #[arg(conflicts_with_all = ["loopback", "server"])]
    pub host: Option<String>,
    /// Server and client in this process, over 127.0.0.1.
    #[arg(long)]
    pub loopback: bool,
    /// Run as server (serves clients until stopped; see --once).
    #[arg(long, conflicts_with = "loopback")]
    pub server: bool,
    /// With --server (iWARP or RoCE): serve one perftest client over rdma_cm
    /// (ib_write_bw -R, ib_read_bw -R, ib_send_bw -R) instead of softrdma clients, then
    /// exit. RoCE, with HOST: be the client of a perftest server (ib_write_bw, ib_read_bw,
    /// ib_atomic_bw without -R; see --test).
    #[arg(long)]
    pub perftest: bool,
    /// With --perftest and HOST: the perftest server runs over rdma_cm (it was started with
    /// -R): ib_write_bw, ib_read_bw or ib_send_bw (see --test), iWARP or RoCE. Without
    /// --perftest, perftest's meaning: connect through the connection manager, which softrdma
    /// perf always does.
    #[arg(short = 'R', long = "rdma-cm")]
    pub rdma_cm: bool,
    /// RoCE: how IPv4 datagrams leave: the UDP socket, its ICRCs exact for rxe and NICs
    /// where the kernel writes the Identification they assume (auto: else a raw socket if
    /// the process may open one; off: the UDP socket always), or a raw socket, one
    /// datagram per send and no GSO, or fail (required).
    #[arg(long, value_enum, default_value_t = RawTxArg::Auto)]
    pub raw_tx: RawTxArg,
    /// RoCE: no UDP segmentation offload (GSO on send, GRO on receive) on the UDP socket.
    #[arg(long)]
    pub no_gso: bool,
    /// Transport: iwarp (TCP, beside raw TCP) or roce (RoCEv2 over UDP, beside raw UDP).
    #[arg(long, value_enum, default_value = "iwarp")]
    pub transport: Transport,
    /// RoCE --perftest: the perftest server's test (ib_write_bw, ib_read_bw, ib_atomic_bw).
    #[arg(long, value_enum, default_value = "write")]
    pub test: PerftestTest,
    /// RoCE: path MTU (client: asked for, default 4096; server: the largest accepted;
    /// --perftest: 1024, then the smaller of both sides).
    #[arg(short = 'm', long)]
    pub mtu: Option<u32>,
    /// RoCE: UDP port of RoCEv2 (default 4791; --loopback: any free one).
    #[arg(long)]
    pub roce_port: Option<u16>,
    /// RoCE: GID index (accepted as perftest's -x; the GID is always the bound address).
    #[arg(short = 'x', long, allow_negative_numbers = true)]
    pub gid_index: Option<i32>,
    /// With --server: exit after one client session.
    #[arg(long, requires = "server")]
    pub once: bool,
    /// Server: address to listen on. RoCE: also our RoCE address (default: the server's
    /// first address that is not loopback; the client's facing the server).
    #[arg(short = 'B', long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Port of the connection manager's listener (RoCE --perftest: of perftest's exchange).
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Port of the raw baseline's server (raw TCP tests, and the set-up of raw UDP ones;
    /// default: --port + 1).
    #[arg(long)]
    pub tcp_port: Option<u16>,
    /// Message size in octets, 1 to 1 GiB (default: 65536 for bandwidth, 64 for latency;
    /// --perftest: the data buffer, default 16 MiB).
    #[arg(short = 's', long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SIZE)))]
    pub size: Option<u32>,
    /// All sizes from 2 to 2^23 (as perftest -a).
    #[arg(short = 'a', long, conflicts_with = "size")]
    pub all: bool,
    /// Messages per bandwidth test and round trips per latency test (default 5000 and 1000).
    #[arg(short = 'n', long, conflicts_with = "duration", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..=MAX_ITERS))]
    pub iters: Option<u64>,
    /// Client: give up on a connection that is not set up within this many seconds.
    #[arg(long = "connect-timeout", value_name = "S", default_value_t = 10.0,
          allow_negative_numbers = true, value_parser = seconds)]
    pub connect_timeout: f64,
    /// Run each test this many seconds instead of a number of iterations (above 0).
    #[arg(short = 'D', long, allow_negative_numbers = true, value_parser = seconds)]
    pub duration: Option<f64>,
    /// The device, as perftest's -d names one: it picks the transport (softrdma_tcp0, siw0,
    /// iwarp: iWARP; softrdma_roce*, rxe0, roce: RoCE).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE", conflicts_with = "transport",
          value_parser = device_transport)]
    pub ib_dev: Option<Transport>,
    /// perftest's -c: the connection type. RC is what perf measures.
    #[arg(short = 'c', long = "connection", value_name = "RC", value_parser = connection_rc)]
    pub connection: Option<String>,
    /// perftest's -e: sleep on completion events rather than poll; softrdma's default (see
    /// --busy for polling).
    #[arg(short = 'e', long = "events", conflicts_with = "busy")]
    pub events: bool,
    /// perftest's -F (no CPU frequency warning): softrdma gives none; accepted.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// perftest's --report_gbits: the table always shows Gb/s (and MB/s); accepted.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Bidirectional bandwidth (perftest's -b): each side runs the test toward the other at
    /// once (against a server: it connects back to this client's own listeners, on ports
    /// the system picks); the figures are the sum of both directions, beside two raw streams
    /// the same way.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Also write the report as JSON into --out_json_file (as perftest's --out_json).
    #[arg(long = "out_json")]
    pub out_json: bool,
    /// The file --out_json writes.
    #[arg(
        long = "out_json_file",
        value_name = "FILE",
        default_value = "perftest_out.json"
    )]
    pub out_json_file: std::path::PathBuf,
    /// Requests kept outstanding in bandwidth tests, 1 to 16383.
    #[arg(short = 't', long, default_value_t = 128, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..=16383))]
    pub tx_depth: u32,
    /// Receives the server keeps posted in the Send bandwidth test (the credit window), 4 to
    /// 65536.
    #[arg(short = 'r', long, default_value_t = 512, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(4..=65536))]
    pub rx_depth: u32,
    /// Operations to measure.
    #[arg(long, value_enum, default_value = "all")]
    pub op: OpArg,
    /// Latency tests only.
    #[arg(long, conflicts_with = "bw")]
    pub lat: bool,
    /// Bandwidth tests only.
    #[arg(long)]
    pub bw: bool,
    /// Busy-poll completion queues instead of sleeping until a completion arrives.
    #[arg(long)]
    pub busy: bool,
    /// --server: the largest message buffer a client may ask for, octets (its requests above
    /// it are rejected with the reason). Default 1 GiB, -s's own limit.
    #[arg(long, value_name = "OCTETS", default_value_t = 1 << 30,
          value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub max_buffer: u64,
    /// --server: the memory all tests together may take, octets (a test takes twice its
    /// size, a scale session its slots); a request past it is rejected with the reason until
    /// others end. Default 2 GiB.
    #[arg(long, value_name = "OCTETS", default_value_t = server::MEM_BUDGET,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mem_budget: u64,
    /// --server: end a test (or scale session) whose client sends nothing for this many
    /// seconds, freeing its slot and memory.
    #[arg(long, value_name = "S", default_value_t = server::IDLE_TIMEOUT.as_secs_f64(),
          allow_negative_numbers = true, value_parser = seconds)]
    pub idle_timeout: f64,
    /// After the run: every client test QP's counters and the client device's (table and
    /// JSON).
    #[arg(long, conflicts_with = "qps")]
    pub counters: bool,
    /// Blocking waits poll this many microseconds before they sleep (hybrid wait, as
    /// Linux's SO_BUSY_POLL; `Cq::set_busy_poll`), and so does the background thread after
    /// what arrives for it (`Context::set_background_poll`). 0: sleep at once. Default: the
    /// library's adaptive polls (waits up to 200 µs, as long as recent waits took; the
    /// background thread up to 50 µs, as long as the gaps between arrivals).
    #[arg(long, value_name = "US")]
    pub busy_poll_us: Option<u64>,
    /// iWARP: ask for MPA CRC32c.
    #[arg(long)]
    pub crc: bool,
    /// iWARP: FPDU size: mss (default, what hardware peers need), largest, or a MULPDU.
    #[arg(long, default_value = "mss")]
    pub fpdu: FpduArg,
    /// One JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The scale test instead of the others — this many connected RC QPs (a list runs each:
    /// -q 1,16,256,1024) between two contexts with --loopback, or to the server on HOST (at
    /// most 4096 there); one Write per QP per round (-s, default 4096), -n rounds or -D
    /// seconds (default 1 s); aggregate bandwidth, operations per second and RSS per
    /// connection.
    #[arg(short = 'q', long = "qp", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub qps: Vec<u32>,
    /// Draw the run into this SVG file: bandwidth and latency against message size,
    /// softrdma beside the raw baseline (with -a: the whole sweep).
    #[arg(long, value_name = "FILE.svg", conflicts_with = "qps")]
    pub plot: Option<std::path::PathBuf>,
    /// Write the RDMA traffic of the run (not the raw baseline's, nor the out-of-band
    /// exchange's) to this pcap file, for `softrdma decode` and tshark; with --loopback, as
    /// the client saw it. Every octet is kept: use it with -n or a short -D.
    #[arg(long, value_name = "FILE", conflicts_with = "qps")]
    pub pcap: Option<std::path::PathBuf>,
    /// A row of a `-q` list run by its parent process against a server: no `Bye` (the
    /// parent's ends the session).
    #[arg(long, hide = true)]
    pub scale_child: bool,
    /// The open `--pcap` file.
    #[arg(skip)]
    pub tap: Option<Arc<PcapTap>>,
}

impl PerfArgs {
    pub(super) fn wait(&self) -> WaitMode {
        if self.busy {
            WaitMode::Busy
        } else {
            WaitMode::Block
        }
    }

    pub(super) fn client_opts(&self) -> Result<ClientOpts, PerfError> {
        Ok(ClientOpts {
            crc: self.crc,
            fpdu: self.fpdu.0,
            pmtu: valid_mtu(self.mtu.unwrap_or(4096))?,
            tx_depth: self.tx_depth.clamp(1, 16383),
            rx_depth: self.rx_depth.clamp(4, 1 << 16),
            wait: self.wait(),
            busy_poll: self.busy_poll(),
            connect_timeout: Duration::from_secs_f64(self.connect_timeout),
        })
    }

    fn busy_poll(&self) -> BusyPoll {
        self.poll_or(DEFAULT_BUSY_POLL)
    }

    pub(super) fn background_poll(&self) -> BusyPoll {
        self.poll_or(DEFAULT_BACKGROUND_POLL)
    }

    /// `--busy-poll-us`, else `default`.
    fn poll_or(&self, default: BusyPoll) -> BusyPoll {
        match self.busy_poll_us {
            None => default,
            Some(0) => BusyPoll::Off,
            Some(us) => BusyPoll::Fixed(Duration::from_micros(us)),
        }
    }

    pub(super) fn server_opts(&self, log: bool) -> Result<ServerOpts, PerfError> {
        Ok(ServerOpts {
            fpdu: self.fpdu.0,
            pmtu: valid_mtu(self.mtu.unwrap_or(4096))?,
            log,
            wait: self.wait(),
            busy_poll: self.busy_poll(),
            max_buffer: self.max_buffer,
            mem_budget: self.mem_budget,
            idle_timeout: Duration::from_secs_f64(self.idle_timeout),
        })
    }

    pub(super) fn listen_params(&self) -> ListenParams {
        ListenParams {
            iwarp: softrdma::iwarp::ListenParams {
                crc: self.crc,
                ..Default::default()
            },
            ..ListenParams::default()
        }
    }

    pub(super) fn raw_port(&self) -> u16 {
        self.tcp_port.unwrap_or(self.port.wrapping_add(1))
    }

    pub(super) fn roce_port(&self) -> u16 {
        self.roce_port
            .unwrap_or(softrdma_wire::rocev2::ROCEV2_UDP_PORT)
    }

    pub(super) fn ops(&self) -> Vec<(Test, Test)> {
        let all = [
            (Test::WriteBw, Test::WriteLat),
            (Test::ReadBw, Test::ReadLat),
            (Test::SendBw, Test::SendLat),
        ];
        match self.op {
            OpArg::All => all.to_vec(),
            OpArg::Write => vec![all[0]],
            OpArg::Read => vec![all[1]],
            OpArg::Send => vec![all[2]],
        }
    }

    /// Rows the table will have (bandwidth and latency), for the progress bar.
    pub(super) fn expected_rows(&self) -> u64 {
        let ops = self.ops().len();
        let bw = if self.lat {
            0
        } else {
            self.sizes(65536).len() * ops
        };
        let lat = if self.bw {
            0
        } else {
            self.sizes(64).len() * ops
        };
        (bw + lat) as u64
    }

    pub(super) fn sizes(&self, default: u32) -> Vec<u32> {
        if self.all {
            (1..=23).map(|i| 1u32 << i).collect()
        } else {
            vec![self.size.unwrap_or(default)]
        }
    }

    pub(super) fn limit(&self, default_iters: u64) -> Limit {
        match self.duration {
            Some(d) => Limit::Duration(Duration::from_secs_f64(d.max(0.001))),
            None => Limit::Iters(self.iters.unwrap_or(default_iters).max(1)),
        }
    }

    pub(super) fn check(&self) -> Result<(), PerfError> {
        if !self.loopback && !self.server && self.host.is_none() {
            return Err(PerfError::Usage(
                "give --loopback, --server or the server's HOST".into(),
            ));
        }
        if self.perftest
            && match self.transport {
                Transport::Iwarp => !(self.server || (self.rdma_cm && self.host.is_some())),
                Transport::Roce => self.host.is_none() && !self.server,
            }
        {
            return Err(PerfError::Usage(
                "--perftest: --server serves perftest clients over rdma_cm (-R); RoCE with HOST is the client of a perftest server (its TCP exchange)".into(),
            ));
        }
        if self.bidirectional && (self.server || self.perftest) {
            return Err(PerfError::Usage(
                "-b is the client's: give HOST or --loopback (not --server or --perftest)".into(),
            ));
        }
        if !self.qps.is_empty() && (self.server || self.perftest) {
            return Err(PerfError::Usage(
                "-q is the client's: give HOST or --loopback (not --server or --perftest)".into(),
            ));
        }
        if self.bidirectional && !self.qps.is_empty() {
            return Err(PerfError::Usage(
                "-b and -q: the scale test is one way".into(),
            ));
        }
        if self.bidirectional && self.lat {
            return Err(PerfError::Usage(
                "-b measures bandwidth (as perftest's): drop --lat".into(),
            ));
        }
        if self.once && !self.server {
            return Err(PerfError::Usage("--once goes with --server".into()));
        }
        // Options of the other transport are refused rather than ignored.
        match self.transport {
            Transport::Iwarp => {
                if self.mtu.is_some() {
                    return Err(PerfError::Usage(
                        "--mtu is RoCE's path MTU: give --transport roce (iWARP FPDUs: --fpdu)"
                            .into(),
                    ));
                }
                if self.no_gso || self.raw_tx != RawTxArg::Auto || self.roce_port.is_some() {
                    return Err(PerfError::Usage(
                        "--no-gso, --raw-tx and --roce-port are RoCE's: give --transport roce"
                            .into(),
                    ));
                }
            }
            Transport::Roce => {
                if self.crc || self.fpdu.0 != FpduSize::PathMss {
                    return Err(PerfError::Usage(
                        "--crc and --fpdu are iWARP's (MPA): RoCE always has its ICRC; give --transport iwarp".into(),
                    ));
                }
            }
        }
        if let Some(m) = self.mtu {
            valid_mtu(m)?;
        }
        Ok(())
    }
}

/// The largest `--size`: every buffer of a run is allocated (and filled) up front.
pub const MAX_SIZE: u32 = 1 << 30;

/// The largest `-n`.
const MAX_ITERS: u64 = 1_000_000_000_000;

/// `-d`: the transport a perftest device name stands for.
fn device_transport(s: &str) -> Result<Transport, String> {
    let l = s.to_ascii_lowercase();
    if l.starts_with("softrdma_tcp") || l.starts_with("siw") || l == "iwarp" {
        Ok(Transport::Iwarp)
    } else if l.starts_with("softrdma_roce") || l.starts_with("rxe") || l == "roce" {
        Ok(Transport::Roce)
    } else {
        Err(format!(
            "no such device {s:?}: softrdma_tcp0 (or siw0, iwarp) for iWARP, softrdma_roce (or rxe0, roce) for RoCE"
        ))
    }
}

/// `-c`: perftest's connection types; perf measures RC.
fn connection_rc(s: &str) -> Result<String, String> {
    match s.to_ascii_uppercase().as_str() {
        "RC" => Ok("RC".into()),
        "UC" | "UD" | "XRC" | "DC" | "SRD" => Err(format!(
            "perf measures RC connections; {s} is not measured (pingpong has UC and UD)"
        )),
        _ => Err(format!("expected RC, got {s:?}")),
    }
}

/// `-D`: a positive, finite number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(d) if d.is_finite() && d > 0.0 && d <= 86_400.0 => Ok(d),
        _ => Err(format!(
            "expected seconds above 0 (at most 86400), got {s:?}"
        )),
    }
}

pub(super) fn valid_mtu(m: u32) -> Result<u32, PerfError> {
    match m {
        256 | 512 | 1024 | 2048 | 4096 => Ok(m),
        _ => Err(PerfError::Usage(format!(
            "--mtu must be 256, 512, 1024, 2048 or 4096, got {m}"
        ))),
    }
}
