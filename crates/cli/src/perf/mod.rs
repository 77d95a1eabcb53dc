//! `softrdma perf`: bandwidth and latency of RDMA Write, RDMA Read and Send between two
//! softrdma endpoints, beside the raw socket the transport runs over (TCP for iWARP, UDP
//! for RoCEv2) measured in the same run with the same message size, reported the way
//! perftest reports them.
//!
//! The tests are written once against the verbs surface ([`client`], [`server`]): one
//! connection of the connection manager per test, on either transport; `--transport` only
//! picks the device and the raw baseline ([`tcp`], [`udp`]). `--loopback` runs a server and
//! a client in one process over 127.0.0.1 (RoCE: the server on 127.0.0.1, the client on
//! 127.0.0.2); `--server` and `HOST` run them on two machines.
//!
//! perftest interop: `--server --perftest` serves perftest's own clients over rdma_cm
//! (`ib_write_bw -R` and friends, iWARP), see [`perftest_server`]; `--transport roce
//! --perftest HOST` is the client of perftest's `ib_write_bw`-style servers over their own
//! TCP exchange, see [`perftest_client`].

mod client;
pub mod perftest_client;
pub mod perftest_cm_client;
pub mod perftest_server;
pub mod plot;
pub mod proto;
pub mod raw;
pub mod scale;
mod server;
pub mod stats;
pub mod tcp;
pub mod udp;

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrdma::{
    BusyPoll, Context, DEFAULT_BACKGROUND_POLL, DEFAULT_BUSY_POLL, Device, FpduSize, ListenParams,
    Listener, MemError, RoceConfig,
};

pub use self::client::{Client, ClientOpts};
pub use self::perftest_client::{PerftestResult, PerftestTest, perftest_client};
use self::proto::{Measure, Reverse, Test};
pub use self::server::{ServerOpts, serve};
use self::stats::{Bw, Lat};
use self::udp::UdpBaseline;
use crate::pcap_out::PcapTap;
pub use crate::verbs_util::TransportArg as Transport;
use crate::verbs_util::{WaitMode, default_roce_ip, local_ip_toward};

/// Errors of `softrdma perf`.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// A verbs call failed.
    #[error("{0}")]
    Verbs(#[from] softrdma::Error),
    /// A registered-memory access failed.
    #[error("memory: {0}")]
    Mem(#[from] MemError),
    /// A socket call failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer did not follow the protocol.
    #[error("{0}")]
    Protocol(String),
    /// A work request completed in error.
    #[error("{0}")]
    Completion(String),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
    /// What was being done when `source` happened (an address, a port, a file).
    #[error("{what}: {source}")]
    At {
        what: String,
        source: Box<PerfError>,
    },
    /// The server refused the test (too large, past its memory budget, busy).
    #[error("rejected by the server: {0}")]
    Refused(proto::Refusal),
    /// A server's test whose client sent nothing for this long: given up.
    #[error("no traffic from the client for {0:?}: the server reclaimed the test")]
    Idle(Duration),
    /// Interrupted (SIGINT) after the rows reported.
    #[error("interrupted")]
    Interrupted,
    /// A file the run writes.
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
}

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

/// `--raw-tx`: [`softrdma::RawTx`] on the command line.
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

impl From<RawTxArg> for softrdma::RawTx {
    fn from(a: RawTxArg) -> softrdma::RawTx {
        match a {
            RawTxArg::Auto => softrdma::RawTx::Auto,
            RawTxArg::Off => softrdma::RawTx::Off,
            RawTxArg::Required => softrdma::RawTx::Required,
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

/// The connection's MPA parameters, as the first test negotiated them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MpaInfo {
    /// MPA revision.
    pub rev: u8,
    /// CRC32c in use.
    pub crc: bool,
    /// Markers in either direction.
    pub markers: bool,
    /// Largest ULPDU we send.
    pub mulpdu: u16,
    /// The connection's effective MSS.
    pub emss: u32,
}

/// One bandwidth row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BwRow {
    /// perftest's test name.
    pub test: Test,
    /// Message size.
    pub bytes: u32,
    /// softrdma.
    pub rdma: Bw,
    /// Raw TCP, same size, same run.
    pub raw_tcp: Bw,
    /// softrdma / raw TCP bandwidth.
    pub ratio: f64,
    /// RoCE: raw UDP with segmentation offload (`UDP_SEGMENT` super-datagrams of path-MTU
    /// segments, `UDP_GRO` on receive), same size, same run; absent where the kernel has no
    /// GSO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_udp_gso: Option<Bw>,
    /// softrdma / raw UDP with GSO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_gso: Option<f64>,
}

/// One latency row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LatRow {
    /// perftest's test name.
    pub test: Test,
    /// Message size.
    pub bytes: u32,
    /// softrdma (half round trips for Send and Write, round trips for Read).
    pub rdma: Lat,
    /// Raw TCP ping-pong, same size, same run, on the same basis.
    pub raw_tcp: Lat,
    /// `half_round_trip` or `round_trip`.
    pub basis: &'static str,
    /// softrdma / raw TCP typical (median) latency.
    pub ratio: f64,
}

/// Everything one client run measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// `iwarp` or `roce`.
    pub transport: &'static str,
    /// `loopback` or `client`.
    pub mode: &'static str,
    /// The server's RDMA address.
    pub server: String,
    /// The device.
    pub device: String,
    /// MPA parameters.
    pub mpa: Option<MpaInfo>,
    /// RoCE: path MTU and counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roce: Option<RoceInfo>,
    /// iWARP: the client QPs' RDMAP counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iwarp: Option<IwarpCounters>,
    /// Requests outstanding in bandwidth tests.
    pub tx_depth: u32,
    /// `block` or `busy`.
    pub completion_wait: &'static str,
    /// Bandwidth rows.
    pub bw: Vec<BwRow>,
    /// Latency rows.
    pub lat: Vec<LatRow>,
    /// Scale rows (`-q`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scale: Vec<scale::ScaleRow>,
    /// `--counters`: the client's QPs and device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<CountersReport>,
    /// `-b`: bandwidth rows are both directions at once, summed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bidirectional: bool,
}

/// `--counters`: what the client counted.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CountersReport {
    /// Each test's QP.
    pub qps: Vec<QpCountersRow>,
    /// The client's device (context).
    pub device: softrdma::DeviceCounters,
}

/// One test QP's counters.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct QpCountersRow {
    pub test: &'static str,
    pub qp_num: u32,
    pub counters: softrdma::QpCounters,
}

/// iWARP: what the client's QPs of a run counted, summed over its tests.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct IwarpCounters {
    /// ULPDUs sent and received.
    pub ulpdus_tx: u64,
    pub ulpdus_rx: u64,
    /// Payload octets placed (RDMA Read Responses, Sends received).
    pub payload_rx: u64,
    /// Of those, read from the socket straight into their memory.
    pub payload_rx_direct: u64,
    /// Terminates sent and received.
    pub terminates_tx: u64,
    pub terminates_rx: u64,
}

/// RoCE details of a run.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RoceInfo {
    /// Path MTU of the QPs (and the raw UDP datagram size).
    pub pmtu: u32,
    /// The client's RoCE address.
    pub client: String,
    /// Client requester, every test: request packets sent (retransmissions included).
    pub packets: u64,
    /// ... sent again after going back.
    pub retransmitted: u64,
    /// ... local ACK timeouts.
    pub timeouts: u64,
    /// ... PSN sequence error NAKs received.
    pub seq_naks: u64,
    /// ... RNR NAKs received.
    pub rnr_naks: u64,
    /// Client context: datagrams sent.
    pub tx_datagrams: u64,
    /// Client context: datagrams received.
    pub rx_datagrams: u64,
    /// Client context: datagrams dropped for a bad ICRC.
    pub bad_icrc: u64,
    /// Client context: sends the socket refused.
    pub tx_errors: u64,
}

impl PerfArgs {
    fn wait(&self) -> WaitMode {
        if self.busy {
            WaitMode::Busy
        } else {
            WaitMode::Block
        }
    }

    fn client_opts(&self) -> Result<ClientOpts, PerfError> {
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

    fn background_poll(&self) -> BusyPoll {
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

    fn server_opts(&self, log: bool) -> Result<ServerOpts, PerfError> {
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

    fn listen_params(&self) -> ListenParams {
        ListenParams {
            crc: self.crc,
            ..ListenParams::default()
        }
    }

    fn raw_port(&self) -> u16 {
        self.tcp_port.unwrap_or(self.port.wrapping_add(1))
    }

    fn roce_port(&self) -> u16 {
        self.roce_port
            .unwrap_or(softrdma_wire::rocev2::ROCEV2_UDP_PORT)
    }

    fn ops(&self) -> Vec<(Test, Test)> {
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
    fn expected_rows(&self) -> u64 {
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

    fn sizes(&self, default: u32) -> Vec<u32> {
        if self.all {
            (1..=23).map(|i| 1u32 << i).collect()
        } else {
            vec![self.size.unwrap_or(default)]
        }
    }

    fn limit(&self, default_iters: u64) -> Limit {
        match self.duration {
            Some(d) => Limit::Duration(Duration::from_secs_f64(d.max(0.001))),
            None => Limit::Iters(self.iters.unwrap_or(default_iters).max(1)),
        }
    }

    fn check(&self) -> Result<(), PerfError> {
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

impl PerfError {
    /// A failed connect: a rejection whose private data is the server's reason in words
    /// (a softrdma perf server's: busy, a size above its cap) says it.
    pub fn connecting(e: softrdma::Error) -> PerfError {
        if let softrdma::Error::Rejected { private_data, .. } = &e
            && let Some(why) = proto::Refusal::parse(private_data)
        {
            return PerfError::Refused(why);
        }
        // RoCE's REJ pads its private data with zeros to 148 octets.
        if let softrdma::Error::Rejected { private_data, .. } = &e
            && let Ok(text) = std::str::from_utf8(private_data)
            && let text = text.trim_end_matches('\0')
            && !text.is_empty()
            && !text.contains(|c: char| c.is_control())
        {
            let text = text.strip_prefix("softrdma perf: ").unwrap_or(text);
            return PerfError::Protocol(format!("rejected by the server: {text}"));
        }
        PerfError::Verbs(e)
    }

    /// This error, said to have happened while doing `what`.
    pub fn at(self, what: impl Into<String>) -> PerfError {
        PerfError::At {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

fn valid_mtu(m: u32) -> Result<u32, PerfError> {
    match m {
        256 | 512 | 1024 | 2048 | 4096 => Ok(m),
        _ => Err(PerfError::Usage(format!(
            "--mtu must be 256, 512, 1024, 2048 or 4096, got {m}"
        ))),
    }
}

/// The RoCE address `-B` names, if it names one.
fn bind_ip(args: &PerfArgs) -> Result<Option<IpAddr>, PerfError> {
    let ip: IpAddr = args
        .bind
        .parse()
        .map_err(|_| PerfError::Usage(format!("-B wants an IP address, got {}", args.bind)))?;
    Ok((!ip.is_unspecified()).then_some(ip))
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, PerfError> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| PerfError::Usage(format!("{host} resolves to nothing")))
}

/// Opens the device of `transport`; RoCE on `ip` and UDP `port`.
fn open(args: &PerfArgs, ip: IpAddr, port: u16) -> Result<Context, PerfError> {
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
fn tap(args: &PerfArgs, ctx: &Context) -> Result<(), PerfError> {
    match &args.tap {
        Some(t) => t.attach(ctx).map_err(PerfError::Usage),
        None => Ok(()),
    }
}

/// Latency warm-up round trips (not counted).
const WARMUP: u64 = 16;

/// The raw socket baseline of a run.
enum Baseline {
    /// Raw TCP, served at this address.
    Tcp(SocketAddr),
    /// Raw UDP.
    Udp(UdpBaseline),
}

impl Baseline {
    fn bw(&self, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        match self {
            Baseline::Tcp(a) => tcp::bw(*a, size, limit),
            Baseline::Udp(u) => u.bw(size, limit),
        }
    }

    /// RoCE: the raw UDP baseline with GSO (none for TCP, or without kernel support).
    fn bw_gso(&self, size: u32, limit: Limit) -> Result<Option<Bw>, PerfError> {
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
fn baseline(ctx: &Context, raw: SocketAddr, mtu: u32) -> Baseline {
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
fn loopback_contexts(args: &PerfArgs) -> Result<(Context, Context), PerfError> {
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

/// The report as JSON; RoCE's baseline under `raw_udp`.
pub fn json(r: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if r.transport != "roce" {
        return v;
    }
    for rows in ["bw", "lat"] {
        if let Some(serde_json::Value::Array(a)) = v.get_mut(rows) {
            for row in a {
                if let Some(o) = row.as_object_mut()
                    && let Some(x) = o.remove("raw_tcp")
                {
                    o.insert("raw_udp".into(), x);
                }
            }
        }
    }
    v
}

const RULE: &str = "---------------------------------------------------------------------------------------------------------";

/// The report as a table a perftest user reads.
pub fn render(r: &Report) -> String {
    let mut s = render_body(r);
    s.push_str(&render_tail(r));
    s
}

/// What the connections negotiated and counted, known once the run is over: the table's
/// last lines.
pub fn render_tail(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if let Some(x) = &r.roce {
        let _ = writeln!(
            s,
            " path MTU {}, tx depth {}, completions: {}; client requester: {} packets, {} retransmitted ({} timeouts, {} sequence NAKs, {} RNR NAKs); {} bad ICRC",
            x.pmtu,
            r.tx_depth,
            r.completion_wait,
            x.packets,
            x.retransmitted,
            x.timeouts,
            x.seq_naks,
            x.rnr_naks,
            x.bad_icrc
        );
    }
    if let Some(m) = &r.mpa {
        let _ = writeln!(
            s,
            " MPA rev {}, CRC {}, markers {}, MULPDU {} (EMSS {}), tx depth {}, completions: {}",
            m.rev,
            if m.crc { "on" } else { "off" },
            if m.markers { "on" } else { "off" },
            m.mulpdu,
            m.emss,
            r.tx_depth,
            r.completion_wait
        );
    }
    if let Some(c) = &r.iwarp {
        let _ = writeln!(
            s,
            " client QPs: {} ULPDUs sent, {} received; {} payload octets placed, {} of them straight from the socket; Terminates {} sent, {} received",
            c.ulpdus_tx,
            c.ulpdus_rx,
            c.payload_rx,
            c.payload_rx_direct,
            c.terminates_tx,
            c.terminates_rx
        );
    }
    if r.roce.is_some() || r.mpa.is_some() {
        let _ = writeln!(s, "{RULE}");
    }
    // A raw UDP baseline that lost datagrams: its figure is over what arrived.
    for b in &r.bw {
        for (what, raw) in [
            ("raw UDP", Some(&b.raw_tcp)),
            ("raw UDP with GSO", b.raw_udp_gso.as_ref()),
        ] {
            if let Some(raw) = raw.filter(|x| x.lost_bytes > 0) {
                let _ = writeln!(
                    s,
                    " {what}, {} octets ({}): {} of {} octets lost; its figure is over what arrived",
                    b.bytes,
                    b.test,
                    raw.lost_bytes,
                    raw.lost_bytes + raw.bytes
                );
            }
        }
    }
    if let Some(c) = &r.counters {
        for q in &c.qps {
            s.push_str(&crate::counters::qp(q.test, q.qp_num, &q.counters));
        }
        s.push_str(&crate::counters::render(
            &format!("device {} counters:", r.device),
            &crate::counters::flatten(&c.device),
        ));
        let _ = writeln!(s, "{RULE}");
    }
    s
}

/// The table up to its last row: the head, known before the run, then each section's
/// rows; each completed row only appends lines ([`run`] prints them as they come).
pub fn render_body(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let roce = r.transport == "roce";
    let base = if roce { "raw UDP" } else { "raw TCP" };
    let _ = writeln!(s, "{RULE}");
    let _ = writeln!(
        s,
        " softrdma perf: {}, device {}, {} {}",
        if roce {
            "RoCEv2 (InfiniBand RC over UDP)"
        } else {
            "iWARP over TCP"
        },
        r.device,
        r.mode,
        r.server
    );
    let _ = if roce {
        writeln!(
            s,
            " raw UDP: path-MTU datagrams, 512 unacknowledged at most (bandwidth), the same as 64 KiB GSO super-datagrams received with GRO (UDP GSO), and a UDP ping-pong (latency) of the same message size, same run"
        )
    } else {
        writeln!(
            s,
            " raw TCP: one blocking TCP stream (bandwidth) and a TCP ping-pong (latency) of the same message size, same run"
        )
    };
    let _ = writeln!(
        s,
        " MB = 2^20 octets, Gb = 10^9 bits, ratio = softrdma / {base}"
    );
    if r.bidirectional {
        let _ = writeln!(
            s,
            " bidirectional (-b): each side runs the test toward the other at once, figures summed; {base} likewise"
        );
    }
    if !r.bw.is_empty() {
        let gso = r.bw.iter().any(|b| b.raw_udp_gso.is_some());
        let _ = writeln!(s, "{RULE}");
        let _ = write!(
            s,
            " {:<14} {:>8} {:>12} {:>13} {:>16} {:>18} {:>14} | {:>14} {:>7}",
            "test",
            "#bytes",
            "#iterations",
            "BW peak[Gb/s]",
            "BW average[Gb/s]",
            "BW average[MB/sec]",
            "MsgRate[Mpps]",
            format!("{base}[Gb/s]"),
            "ratio"
        );
        let _ = if gso {
            writeln!(s, " | {:>14} {:>7}", "UDP GSO[Gb/s]", "ratio")
        } else {
            writeln!(s)
        };
        for b in &r.bw {
            let _ = write!(
                s,
                " {:<14} {:>8} {:>12} {:>13} {:>16.2} {:>18.2} {:>14.6} | {:>14.2} {:>7.2}",
                b.test.name(),
                b.bytes,
                b.rdma.iters,
                b.rdma
                    .peak_gbit_s
                    .map_or_else(|| "-".to_owned(), |p| format!("{p:.2}")),
                b.rdma.gbit_s,
                b.rdma.mbyte_s,
                b.rdma.mpps,
                b.raw_tcp.gbit_s,
                b.ratio
            );
            let _ = match (b.raw_udp_gso, b.ratio_gso) {
                (Some(g), Some(x)) => writeln!(s, " | {:>14.2} {:>7.2}", g.gbit_s, x),
                _ if gso => writeln!(s, " | {:>14} {:>7}", "-", "-"),
                _ => writeln!(s),
            };
        }
    }
    if !r.scale.is_empty() {
        let _ = writeln!(s, "{RULE}");
        let _ = writeln!(
            s,
            " scale: N connected RC QPs, one RDMA Write per QP per round; memory: RSS added per connection (both QPs, both contexts), KiB; raw TCP: the same rounds over N loopback TCP connections"
        );
        let raw = r.scale.iter().any(|x| x.raw_tcp.is_some());
        let _ = write!(
            s,
            " {:>6} {:>8} {:>8} {:>11} {:>10} {:>14} {:>10} {:>11} {:>11}",
            "#QPs",
            "#bytes",
            "rounds",
            "connect[s]",
            "BW[Gb/s]",
            "ops[Mops/s]",
            "vs 1st",
            "idle[KiB]",
            "active[KiB]",
        );
        let _ = if raw {
            writeln!(s, " | {:>13} {:>10}", "raw TCP[Gb/s]", "vs 1st")
        } else {
            writeln!(s)
        };
        for x in &r.scale {
            let _ = write!(
                s,
                " {:>6} {:>8} {:>8} {:>11.3} {:>10.2} {:>14.4} {:>10.2} {:>11.1} {:>11.1}",
                x.qps,
                x.bytes,
                x.rounds,
                x.connect_seconds,
                x.bw.gbit_s,
                x.bw.mpps,
                x.vs_first,
                x.idle_bytes_per_connection as f64 / 1024.0,
                x.active_bytes_per_connection as f64 / 1024.0,
            );
            let _ = match (x.raw_tcp, x.raw_vs_first) {
                (Some(b), Some(v)) => writeln!(s, " | {:>13.2} {:>10.2}", b.gbit_s, v),
                _ if raw => writeln!(s, " | {:>13} {:>10}", "-", "-"),
                _ => writeln!(s),
            };
        }
    }
    if !r.lat.is_empty() {
        let _ = writeln!(s, "{RULE}");
        let _ = writeln!(
            s,
            " latency in usec, perftest's columns; Send and Write: half round trip (as ib_send_lat, ib_write_lat), Read: round trip (as ib_read_lat)"
        );
        let _ = writeln!(
            s,
            " {:<14} {:>7} {:>11} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} | {:>13} {:>9} {:>7}",
            "test",
            "#bytes",
            "#iterations",
            "t_min",
            "t_max",
            "t_typical",
            "t_avg",
            "t_stdev",
            "99%",
            "99.9%",
            "raw t_typical",
            "raw t_avg",
            "ratio"
        );
        for l in &r.lat {
            let _ = writeln!(
                s,
                " {:<14} {:>7} {:>11} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} | {:>13.2} {:>9.2} {:>7.2}",
                l.test.name(),
                l.bytes,
                l.rdma.iters,
                l.rdma.t_min,
                l.rdma.t_max,
                l.rdma.t_typical,
                l.rdma.t_avg,
                l.rdma.t_stdev,
                l.rdma.t_p99,
                l.rdma.t_p999,
                l.raw_tcp.t_typical,
                l.raw_tcp.t_avg,
                l.ratio
            );
        }
    }
    let _ = writeln!(s, "{RULE}");
    s
}
