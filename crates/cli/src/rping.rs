//! `softrdma rping`: a peer of librdmacm's `rping` (rdma-core `librdmacm/examples/rping.c`),
//! with its flags where they overlap, so a link can be checked against Linux in one command.
//!
//! The exchange, per ping, exactly as rping runs it:
//!
//! ```text
//! client                                             server
//!   fill the source buffer: "rdma-ping-N: " + ASCII 65..122 from 65 + N % 58, NUL last
//!   Send  rping_rdma_info{source buf, rkey, size} ─►
//!                                                     RDMA Read the source into its buffer
//!                                                 ◄─  Send (go ahead)
//!   Send  rping_rdma_info{sink buf, rkey, size}   ─►
//!                                                     RDMA Write strlen + 1 octets to the sink
//!                                                 ◄─  Send (go ahead)
//!   -V: the sink equals the source
//! ```
//!
//! `struct rping_rdma_info` is 16 octets: be64 buf, be32 rkey, be32 size. The connection is
//! made as rping's `rdma_connect` makes it over iWARP: MPA revision 2 with IRD = ORD = 1 and
//! no other private data; the server accepts with the initiator's values mirrored (what
//! `rdma_accept(id, NULL)` gives). rping's server ignores `-C` and runs until the client
//! disconnects; so does this one. Unlike rping, `-V` on the server checks the data it read
//! against the pattern the client must have sent.
//!
//! `--transport roce` runs the same exchange over RoCEv2 with the InfiniBand CM on QP1, as
//! librdmacm's rping over rxe does (either side may be Linux's): `-a` is also the
//! server's RoCE address and `-I` the client's; the disconnect is the CM's DREQ, which
//! flushes the peer's posted receive as a TCP close does over iWARP.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use softrdma::roce::RoceConfig;
use softrdma::{
    AcceptParams, Access, Buffer, ConnectParams, ConnectionDetail, ConnectionInfo, Context, Cq,
    Device, Key, ListenParams, Listener, MemError, Mr, MrAttr, Pd, Qp, QpCap, QpInitAttr, RecvWr,
    SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::counters;
use crate::pcap_out::{PcapTap, with_pcap};
use crate::verbs_util::{TransportArg, WaitMode, default_roce_ip, local_ip_toward, wait_some};

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's smallest size, as the Linux rping takes it (`valid range is 23 to ...`): its
/// RPING_MIN_BUFSIZE is sizeof of the stringified `INT_MAX` (left unexpanded: "INT_MAX", 8)
/// plus sizeof "rdma-ping-%d: " (15), which is room for "rdma-ping-2147483647: " and a NUL.
pub const MIN_SIZE: u32 = 23;
/// rping's largest size (RPING_BUFSIZE - 1).
pub const MAX_SIZE: u32 = 64 * 1024 - 1;
/// Size of `struct rping_rdma_info`.
pub const INFO_LEN: usize = 16;
/// rping's send queue depth.
const SQ_DEPTH: u32 = 16;

/// Errors of `softrdma rping`.
#[derive(Debug, thiserror::Error)]
pub enum RpingError {
    /// A verbs call failed.
    #[error("{0}")]
    Verbs(#[from] softrdma::Error),
    /// A registered-memory access failed.
    #[error("memory: {0}")]
    Mem(#[from] MemError),
    /// Writing the output failed.
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the exchange.
    #[error("{0}")]
    Protocol(String),
    /// A work request completed in error.
    #[error("cq completion failed status {0:?}")]
    Completion(WcStatus),
    /// `-V`: the data differs from what was sent.
    #[error("data mismatch! (ping {0})")]
    Mismatch(u64),
    /// The peer disconnected in the middle of a ping.
    #[error("the peer disconnected")]
    Disconnected,
    /// No completion within the safety-net timeout.
    #[error("timed out waiting for the peer")]
    Timeout,
}

/// `softrdma rping` options: rping's flags.
#[derive(clap::Args, Clone, Debug)]
#[command(group(clap::ArgGroup::new("role").required(true).args(["server", "client"])))]
pub struct RpingArgs {
    /// Server side.
    #[arg(short = 's', conflicts_with = "client")]
    pub server: bool,
    /// Client side.
    #[arg(short = 'c')]
    pub client: bool,
    /// Address: the server's (client), the one to listen on (server; default any). RoCE:
    /// also the server's RoCE address (default: its first address that is not loopback).
    #[arg(short = 'a')]
    pub addr: Option<String>,
    /// Client, RoCE: our RoCE address (default: the one facing the server; iWARP: not
    /// used).
    #[arg(short = 'I')]
    pub source: Option<IpAddr>,
    /// Transport: iwarp (TCP) or roce (RoCEv2 over UDP, the IB CM as librdmacm speaks it).
    #[arg(long, value_enum, default_value = "iwarp")]
    pub transport: TransportArg,
    /// RoCE: our UDP port (default 4791; 0: any free one).
    #[arg(long, default_value_t = softrdma_wire::rocev2::ROCEV2_UDP_PORT)]
    pub roce_port: u16,
    /// Port.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Ping count (client; 0 or absent: forever). The server runs until the client leaves.
    #[arg(short = 'C', default_value_t = 0)]
    pub count: u64,
    /// Ping data size, 26 to 65535 octets.
    #[arg(short = 'S', default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_SIZE)..=i64::from(MAX_SIZE)))]
    pub size: u32,
    /// Display ping data.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Validate ping data.
    #[arg(short = 'V', action = clap::ArgAction::Count)]
    pub validate: u8,
    /// Debug output.
    #[arg(short = 'd', action = clap::ArgAction::Count)]
    pub debug: u8,
    /// Persistent server: serve clients one after another.
    #[arg(short = 'P', requires = "server")]
    pub persistent: bool,
    /// Ask for MPA CRC32c (a softrdma extension; rping leaves it to the device).
    #[arg(long)]
    pub crc: bool,
    /// Safety net: give up after this many seconds without progress (0: never).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Write the RDMA traffic (connection setup and pings) to this pcap file, for
    /// `softrdma decode` and tshark.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// After each connection: the QP's counters and the device's.
    #[arg(long)]
    pub counters: bool,
}

/// Options of one run, independent of the command line.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Pings (client; 0: forever).
    pub count: u64,
    /// Ping data size.
    pub size: u32,
    /// Print ping data.
    pub verbose: bool,
    /// Check ping data.
    pub validate: bool,
    /// Debug output (to the output writer).
    pub debug: bool,
    /// Ask for MPA CRC.
    pub crc: bool,
    /// Safety-net timeout per wait (`None`: wait forever).
    pub timeout: Option<Duration>,
    /// Print the QP's and the device's counters after each connection.
    pub counters: bool,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            count: 0,
            size: 64,
            verbose: false,
            validate: false,
            debug: false,
            crc: false,
            timeout: Some(Duration::from_secs(60)),
            counters: false,
        }
    }
}

impl RpingArgs {
    /// The options of this command line.
    pub fn opts(&self) -> Opts {
        Opts {
            count: self.count,
            size: self.size,
            verbose: self.verbose > 0,
            validate: self.validate > 0,
            debug: self.debug > 0,
            crc: self.crc,
            timeout: (self.timeout > 0).then(|| Duration::from_secs(self.timeout)),
            counters: self.counters,
        }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Pings completed.
    pub pings: u64,
    /// Pings whose data was checked (`-V`).
    pub verified: u64,
}

/// The buffer rping's client fills for ping `ping`: `snprintf("rdma-ping-%d: ")`, then ASCII
/// 65..=122 cycling from `65 + ping % 58`, the last octet NUL.
pub fn pattern(ping: u64, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    if size == 0 {
        return b;
    }
    // rping's ping counter is a C int.
    let msg = format!("rdma-ping-{}: ", ping as i32);
    let cc = msg.len();
    let n = cc.min(size - 1);
    b[..n].copy_from_slice(&msg.as_bytes()[..n]);
    let mut c = 65 + (ping % 58) as u8;
    for x in b.iter_mut().skip(cc) {
        *x = c;
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    b[size - 1] = 0;
    b
}

/// `struct rping_rdma_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// Buffer address (the Tagged Offset).
    pub buf: u64,
    /// STag.
    pub rkey: u32,
    /// Octets.
    pub size: u32,
}

impl Info {
    /// The 16 octets on the wire (network order).
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[0..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Parses the 16 octets.
    pub fn decode(b: &[u8; INFO_LEN]) -> Info {
        Info {
            buf: u64::from_be_bytes(b[0..8].try_into().unwrap_or_default()),
            rkey: u32::from_be_bytes(b[8..12].try_into().unwrap_or_default()),
            size: u32::from_be_bytes(b[12..16].try_into().unwrap_or_default()),
        }
    }

    fn of(mr: &Mr, size: u32) -> Info {
        Info {
            buf: mr.addr(0),
            rkey: mr.rkey().0,
            size,
        }
    }
}

/// The text of a NUL-terminated buffer (as printf's `%s`).
fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

const RDMA_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_WRITE);

/// Registers a fresh page-aligned buffer at a user-space-looking address (rping advertises
/// virtual addresses, so the Tagged Offsets on the wire use all 64 bits as Linux's do).
fn alloc_mr(pd: &Pd, len: usize, access: Access, slot: u64) -> Result<Mr, softrdma::Error> {
    let iova = 0x5555_0000_0000 + (slot << 24);
    pd.reg_mr_with(
        Buffer::new(len),
        MrAttr {
            iova,
            ..MrAttr::new(len, access)
        },
    )
}

/// One side's resources: rping's control block.
struct Cb {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    recv_mr: Mr,
    send_mr: Mr,
    rdma_mr: Mr,
    timeout: Option<Duration>,
    wcs: Vec<WorkCompletion>,
    /// No receive is left posted: it came back flushed (the connection is gone).
    flushed: bool,
}

impl Cb {
    fn new(ctx: &Context, rdma_len: usize, timeout: Option<Duration>) -> Result<Cb, RpingError> {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(SQ_DEPTH as usize * 2, None)?;
        let qp = pd.create_qp(QpInitAttr {
            cap: QpCap {
                max_send_wr: SQ_DEPTH,
                max_recv_wr: 2,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInitAttr::new(&cq, &cq)
        })?;
        let cb = Cb {
            recv_mr: alloc_mr(&pd, INFO_LEN, Access::LOCAL_WRITE, 1)?,
            // Two slots, so a new message never overwrites one still being sent.
            send_mr: alloc_mr(&pd, 2 * INFO_LEN, Access::empty(), 2)?,
            rdma_mr: alloc_mr(&pd, rdma_len, RDMA_ACCESS, 3)?,
            pd,
            cq,
            qp,
            timeout,
            wcs: Vec::new(),
            flushed: false,
        };
        cb.post_recv()?;
        Ok(cb)
    }

    fn post_recv(&self) -> Result<(), RpingError> {
        Ok(self
            .qp
            .post_recv(RecvWr::new(0, vec![self.recv_mr.sge(0, INFO_LEN as u32)]))?)
    }

    fn send(&self, slot: usize, info: &[u8; INFO_LEN]) -> Result<(), RpingError> {
        let off = slot * INFO_LEN;
        self.send_mr.copy_in(off, info)?;
        Ok(self.qp.post_send(SendWr::send(
            1,
            vec![self.send_mr.sge(off, INFO_LEN as u32)],
        ))?)
    }

    /// The next completion of `want` (Send completions pass by). A flushed request means
    /// the peer disconnected.
    fn wait(&mut self, want: WcOpcode) -> Result<WorkCompletion, RpingError> {
        loop {
            if self.wcs.is_empty() {
                let t = self.timeout.unwrap_or(Duration::from_secs(3600));
                match wait_some(&self.cq, WaitMode::Block, 16, t, &mut self.wcs) {
                    Ok(_) => {}
                    Err(softrdma::Error::Timeout) if self.timeout.is_none() => continue,
                    Err(softrdma::Error::Timeout) => return Err(RpingError::Timeout),
                    Err(e) => return Err(e.into()),
                }
                self.wcs.reverse();
            }
            let Some(wc) = self.wcs.pop() else { continue };
            match wc.status {
                WcStatus::Success => {}
                WcStatus::WorkRequestFlushed => {
                    self.flushed |= wc.opcode == WcOpcode::Recv;
                    return Err(RpingError::Disconnected);
                }
                s => return Err(RpingError::Completion(s)),
            }
            if wc.opcode == want {
                return Ok(wc);
            }
            if wc.opcode != WcOpcode::Send {
                return Err(RpingError::Protocol(format!(
                    "unexpected {:?} completion while waiting for {want:?}",
                    wc.opcode
                )));
            }
        }
    }

    /// The next received `rping_rdma_info` (the receive is posted again).
    fn recv_info(&mut self) -> Result<Info, RpingError> {
        let wc = self.wait(WcOpcode::Recv)?;
        if wc.byte_len as usize != INFO_LEN {
            return Err(RpingError::Protocol(format!(
                "Received bogus data, size {}",
                wc.byte_len
            )));
        }
        let mut b = [0u8; INFO_LEN];
        self.recv_mr.copy_out(0, &mut b)?;
        self.post_recv()?;
        Ok(Info::decode(&b))
    }

    /// Orderly close; waits (briefly) until the posted receive was flushed, so the close
    /// has been carried out before the caller tears the context down.
    fn disconnect(&mut self) {
        if self.qp.disconnect().is_err() {
            return;
        }
        let t = Duration::from_secs(5);
        while !self.flushed {
            self.flushed = self
                .wcs
                .iter()
                .any(|w| w.opcode == WcOpcode::Recv && w.status == WcStatus::WorkRequestFlushed);
            self.wcs.clear();
            if !self.flushed && wait_some(&self.cq, WaitMode::Block, 16, t, &mut self.wcs).is_err()
            {
                break;
            }
        }
    }
}

/// Runs rping's client against `addr`.
pub fn client(
    ctx: &Context,
    addr: SocketAddr,
    o: &Opts,
    out: &mut dyn Write,
) -> Result<Stats, RpingError> {
    let size = o.size as usize;
    let mut cb = Cb::new(ctx, size, o.timeout)?;
    let start_mr = alloc_mr(&cb.pd, size, RDMA_ACCESS, 4)?;
    let conn = cb.qp.connect(
        addr,
        ConnectParams {
            ird: 1,
            ord: 1,
            timeout: o.timeout.unwrap_or(Duration::from_secs(10)),
            iwarp: softrdma::iwarp::ConnectParams {
                crc: o.crc,
                ..Default::default()
            },
            ..ConnectParams::default()
        },
    )?;
    if o.debug {
        writeln!(
            out,
            "connected {} -> {}: {}",
            conn.local_addr,
            conn.peer_addr,
            describe(&conn)
        )?;
    }
    let mut stats = Stats::default();
    let r = (|| {
        let mut ping = 0u64;
        while o.count == 0 || ping < o.count {
            let data = pattern(ping, size);
            start_mr.copy_in(0, &data)?;
            let src = Info::of(&start_mr, o.size);
            if o.debug {
                writeln!(
                    out,
                    "RDMA addr {:x} rkey {:x} len {}",
                    src.buf, src.rkey, src.size
                )?;
            }
            cb.send(0, &src.encode())?;
            // The server read the source and says go ahead.
            cb.recv_info()?;
            cb.send(1, &Info::of(&cb.rdma_mr, o.size).encode())?;
            // The server wrote the sink.
            cb.recv_info()?;
            let got = cb.rdma_mr.to_vec();
            if o.validate {
                if got != data {
                    return Err(RpingError::Mismatch(ping));
                }
                stats.verified += 1;
            }
            if o.verbose {
                writeln!(out, "ping data: {}", cstr(&got))?;
            }
            stats.pings += 1;
            ping += 1;
        }
        Ok(())
    })();
    cb.disconnect();
    show_counters(ctx, &cb, "client", o, out);
    r.map(|()| stats)
}

/// `--counters`: the connection's QP and the device, once it ended.
fn show_counters(ctx: &Context, cb: &Cb, role: &str, o: &Opts, out: &mut dyn Write) {
    if o.counters {
        let q = counters::qp(role, cb.qp.qp_num(), &cb.qp.counters());
        let _ = write!(out, "{q}{}", counters::device(ctx));
    }
}

/// Serves one rping client from `listener`, until it disconnects.
pub fn serve_one(
    ctx: &Context,
    listener: &Listener,
    o: &Opts,
    out: &mut dyn Write,
) -> Result<Stats, RpingError> {
    let req = listener.accept()?;
    let peer = req.peer_addr();
    // What rdma_accept(id, NULL) answers: the initiator's ORD as our IRD and its IRD as our
    // ORD (rping's client asks for 1 and 1).
    let (ird, ord) = req.peer_ird_ord().map_or((1, 1), |(i, o)| (o, i));
    if o.debug {
        writeln!(
            out,
            "connect request from {peer}: {} IRD/ORD {:?}",
            req.peer_params().map_or(String::new(), |p| format!(
                "MPA rev {} CRC {}",
                p.rev, p.crc
            )),
            req.peer_ird_ord()
        )?;
    }
    // rping's server buffer is its -S; this one also takes any client size up to rping's
    // largest.
    let len = (o.size.max(MAX_SIZE)) as usize;
    let mut cb = Cb::new(ctx, len, o.timeout)?;
    let conn = req.accept(
        &cb.qp,
        AcceptParams {
            ird,
            ord,
            ..AcceptParams::default()
        },
    )?;
    if o.debug {
        writeln!(out, "accepted {peer}: {}", describe(&conn))?;
    }
    let go_ahead = [0u8; INFO_LEN];
    let mut stats = Stats::default();
    let r = (|| {
        loop {
            // The client's source: end of the run when it disconnected instead.
            let src = match cb.recv_info() {
                Ok(i) => i,
                Err(RpingError::Disconnected) => return Ok(()),
                Err(e) => return Err(e),
            };
            if o.debug {
                writeln!(
                    out,
                    "Received rkey {:x} addr {:x} len {} from peer",
                    src.rkey, src.buf, src.size
                )?;
            }
            let n = src.size as usize;
            if n > len {
                return Err(RpingError::Protocol(format!(
                    "the client's buffer ({n} octets) is larger than ours ({len})"
                )));
            }
            cb.qp.post_send(SendWr::read(
                2,
                Some(cb.rdma_mr.sge(0, src.size)),
                Key(src.rkey),
                src.buf,
            ))?;
            cb.wait(WcOpcode::RdmaRead)?;
            let mut got = vec![0u8; n];
            cb.rdma_mr.copy_out(0, &mut got)?;
            if o.verbose {
                writeln!(out, "server ping data: {}", cstr(&got))?;
            }
            if o.validate {
                if got != pattern(stats.pings, n) {
                    return Err(RpingError::Mismatch(stats.pings));
                }
                stats.verified += 1;
            }
            cb.send(0, &go_ahead)?;
            let sink = cb.recv_info()?;
            // rping writes strlen(rdma_buf) + 1 octets.
            let wlen = got.iter().position(|&b| b == 0).map_or(n, |p| p + 1);
            if (sink.size as usize) < wlen {
                return Err(RpingError::Protocol(format!(
                    "the client's sink ({} octets) is smaller than the ping ({wlen})",
                    sink.size
                )));
            }
            cb.qp.post_send(SendWr::write(
                3,
                vec![cb.rdma_mr.sge(0, wlen as u32)],
                Key(sink.rkey),
                sink.buf,
            ))?;
            cb.wait(WcOpcode::RdmaWrite)?;
            cb.send(1, &go_ahead)?;
            stats.pings += 1;
        }
    })();
    cb.disconnect();
    show_counters(ctx, &cb, "server", o, out);
    r.map(|()| stats)
}

/// Binds rping's listener (`-a` or any address, `-p`).
pub fn listen(
    ctx: &Context,
    addr: Option<&str>,
    port: u16,
    crc: bool,
) -> Result<Listener, RpingError> {
    let host = addr.unwrap_or("0.0.0.0");
    Ok(Listener::bind_with(
        ctx,
        (host, port),
        ListenParams {
            iwarp: softrdma::iwarp::ListenParams {
                crc,
                ..Default::default()
            },
            ..ListenParams::default()
        },
    )?)
}

/// Opens the device `args` name: the TCP device, or a RoCE device on `ip` (the server's
/// `-a`, the client's `-I` or the address facing `server`).
fn open(
    args: &RpingArgs,
    server: Option<SocketAddr>,
    tap: Option<&Arc<PcapTap>>,
) -> Result<Context, String> {
    let dev = match args.transport {
        TransportArg::Iwarp => Device::tcp(),
        TransportArg::Roce => {
            let ip = match (args.source, server) {
                (Some(ip), _) if args.client => ip,
                (_, Some(s)) if args.client => local_ip_toward(s).map_err(|e| e.to_string())?,
                (_, Some(s)) if !s.ip().is_unspecified() => s.ip(),
                _ => default_roce_ip(),
            };
            let mut cfg = RoceConfig::new(ip);
            cfg.port = args.roce_port;
            Device::roce(cfg)
        }
    };
    let ctx = dev.open().map_err(|e| format!("{}: {e}", dev.name()))?;
    if let Some(t) = tap {
        t.attach(&ctx)?;
    }
    Ok(ctx)
}

/// Entry point of `softrdma rping`; the exit status rping would give.
pub fn run(args: &RpingArgs) -> i32 {
    with_pcap(args.pcap.as_deref(), "softrdma rping", |tap| {
        run_tapped(args, tap)
    })
}

fn run_tapped(args: &RpingArgs, tap: Option<&Arc<PcapTap>>) -> i32 {
    let o = args.opts();
    let host = args.addr.as_deref();
    let addr = match host.map(|h| (h, args.port).to_socket_addrs().map(|mut a| a.next())) {
        Some(Ok(Some(a))) => Some(a),
        None => None,
        Some(_) => {
            eprintln!(
                "getaddrinfo failed - invalid hostname or IP address: {}",
                host.unwrap_or_default()
            );
            return 1;
        }
    };
    let ctx = match open(args, addr, tap) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softrdma rping: {e}");
            return 1;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.server {
        let listener = match listen(&ctx, host, args.port, args.crc) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("softrdma rping: rdma_listen: {e}");
                return 1;
            }
        };
        if o.debug {
            if let Ok(a) = ctx.roce_local_addr() {
                // Clients on this host reach us at this UDP port (their --roce-port).
                let _ = writeln!(out, "RoCE device on {a}");
            }
            let _ = writeln!(out, "rdma_listen on {}", listener.local_addr());
        }
        loop {
            let served = serve_one(&ctx, &listener, &o, &mut out);
            if let Some(t) = tap {
                t.flush();
            }
            match served {
                Ok(s) => {
                    eprintln!("server DISCONNECT EVENT...");
                    if o.debug {
                        let _ = writeln!(out, "server: {} pings, {} verified", s.pings, s.verified);
                    }
                }
                Err(e) => {
                    eprintln!("rping server failed: {e}");
                    if !args.persistent {
                        return 1;
                    }
                }
            }
            if !args.persistent {
                return 0;
            }
        }
    }
    let Some(addr) = addr else {
        eprintln!("softrdma rping: the client needs -a addr");
        return 1;
    };
    match client(&ctx, addr, &o, &mut out) {
        Ok(s) => {
            eprintln!("client DISCONNECT EVENT...");
            if o.debug {
                let _ = writeln!(out, "client: {} pings, {} verified", s.pings, s.verified);
            }
            0
        }
        Err(e) => {
            eprintln!("rping client failed: {e}");
            1
        }
    }
}

/// The negotiated parameters of a connection, for `-d`.
fn describe(conn: &ConnectionInfo) -> String {
    match conn.iwarp() {
        Some(c) => format!(
            "MPA rev {} CRC {} IRD {} ORD {} MULPDU {}",
            c.negotiated.rev, c.negotiated.crc, conn.ird, conn.ord, c.mulpdu
        ),
        None => match conn.detail {
            ConnectionDetail::Roce {
                remote_qpn, pmtu, ..
            } => format!(
                "RoCE QPN {remote_qpn:#x} PMTU {pmtu} IRD {} ORD {}",
                conn.ird, conn.ord
            ),
            ConnectionDetail::Iwarp(_) => format!("IRD {} ORD {}", conn.ird, conn.ord),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_rpings() {
        let p = pattern(0, 26);
        assert_eq!(&p[..13], b"rdma-ping-0: ");
        assert_eq!(&p[13..25], b"ABCDEFGHIJKL");
        assert_eq!(p[25], 0);
        // The smallest size holds the longest count and its NUL.
        let p = pattern(i32::MAX as u64, MIN_SIZE as usize);
        assert_eq!(&p[..22], b"rdma-ping-2147483647: ");
        assert_eq!(p[22], 0);
        let p = pattern(1, 64);
        assert_eq!(&p[..16], b"rdma-ping-1: BCD");
        let p = pattern(57, 200);
        assert_eq!(&p[..15], b"rdma-ping-57: z");
        // Wraps from 'z' (122) to 'A' (65).
        assert_eq!(p[15], b'A');
        let p = pattern(58, 100);
        assert_eq!(&p[..15], b"rdma-ping-58: A");
        assert_eq!(p.iter().filter(|&&b| b == 0).count(), 1);
    }

    #[test]
    fn info_layout() {
        let i = Info {
            buf: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            size: 64,
        };
        let b = i.encode();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 0, 0, 0, 64]);
        assert_eq!(Info::decode(&b), i);
    }
}
