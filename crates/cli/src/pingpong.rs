//! `softrdma pingpong --rc|--uc|--ud [host]`: a peer of rdma-core's `ibv_rc_pingpong`,
//! `ibv_uc_pingpong` and `ibv_ud_pingpong` (`libibverbs/examples/*_pingpong.c`) over RoCEv2,
//! with the same out-of-band exchange, QP attributes and algorithm, so either side can be
//! the Linux tool (docs/rxe-interop.md).
//!
//! **Out-of-band exchange** (TCP, `-p`, default 18515; the server is the side without a
//! host). The client writes its 52-octet address in one write, `"%04x:%06x:%06x:%s"` of LID
//! (0 on RoCE), QPN, PSN (`lrand48() & 0xffffff`) and the 16 GID octets as 32 lowercase hex
//! digits, plus the NUL; the server moves its QP to RTR and RTS (UD: creates the address
//! handle), answers with its own 52 octets and reads the client's `"done\0"`; the client
//! closes and only then moves its QP to RTR/RTS and posts the first SEND.
//!
//! **QP attributes** as the tools set them: INIT with no remote access (UD: Q_Key
//! 0x11111111); RC RTR `path_mtu` = `-m`, `max_dest_rd_atomic` 1, `min_rnr_timer` 12, RTS
//! `timeout` 14, `retry_cnt` 7, `rnr_retry` 7, `max_rd_atomic` 1; UC RTR `path_mtu`,
//! `dest_qp_num`, `rq_psn`, RTS `sq_psn`; UD RTR with the state only, RTS with `sq_psn`.
//!
//! **The data.** One buffer of `-s` octets (UD: `-s` + 40) filled with 0x7b. Each side posts
//! `-r` receives of the whole buffer and posts them again when at most one is left; the
//! client sends first and the server sends only after a receive completed, so it echoes.
//! Each side makes `-n` sends and `-n` receives, one SEND outstanding at a time, the next
//! posted when both the last SEND and the last receive completed. UD sends `-s` octets from
//! buffer + 40 with Q_Key 0x11111111 to the address handle of the peer's GID; the first 40
//! octets of each receive take the GRH area (an IPv4 header in the last 20, as rxe).
//! `-c`: the client zeroes byte 0 of every 4 KiB page of the message (UD: from buffer + 40)
//! before its first SEND, the server checks those bytes once after the loop and prints
//! `invalid data in page N` for each bad one. Unlike rdma-core (exit status 0 regardless),
//! a bad page makes the exit status 1.
//!
//! **GIDs and `-g`.** A softrdma context has one GID, the IPv4-mapped (`::ffff:a.b.c.d`) or
//! IPv6 address it is bound to (`--bind`, or else the local address of the TCP connection:
//! the interface facing the peer). `-g` is accepted for command-line compatibility and does
//! not change it: on Linux rxe, index 1 of a port is this IPv4-mapped GID (RoCE v2) and
//! index 0 the interface's IPv6 link-local one, so `-g 1` on the rdma-core side is what
//! matches softrdma over IPv4. A peer GID of all zeros (rdma-core without `-g`) is replaced
//! by the address the TCP exchange came from; link-local IPv6 GIDs are not supported (no
//! scope).
//!
//! **After the last completion** the QP keeps answering until no datagram arrived for
//! `--linger` ms (default 200, three retry periods of rxe's `timeout 14`): a lost final ACK
//! otherwise leaves an rxe requester retrying forever (`retry_cnt 7`).
//!
//! Waiting for completions: by default the thread blocks on the CQ (softrdma's transport
//! runs on a thread of this process, which rdma-core's busy poll would starve on a small
//! machine); `-e` sleeps on completion-channel events as rdma-core's `-e`; `--busy` polls.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma::roce::{Ah, QpAttr, QpState, RoceConfig};
use softrdma::{
    Access, CompletionChannel, Context, Cq, Device, MemError, Mr, Pd, Qp, QpCap, QpInitAttr,
    QpType, RecvWr, SendFlags, SendWr, UdDest, WcStatus, WorkCompletion,
};

use crate::counters;
use crate::pcap_out::{PcapTap, with_pcap};
use crate::verbs_util::{OobPath, WaitMode, rtr_rts, wait_some};

/// rdma-core's default out-of-band port.
pub const DEFAULT_PORT: u16 = 18515;
/// Length of the address message, NUL included (`sizeof "0000:000000:000000:" + 32 hex`).
pub const MSG_LEN: usize = 52;
/// The client's last message.
pub const DONE: &[u8; 5] = b"done\0";
/// The page size of the `-c` pattern (rdma-core uses `sysconf(_SC_PAGESIZE)`).
pub const PAGE: usize = 4096;
/// The GRH area ahead of every UD receive.
pub const GRH_LEN: usize = 40;
/// ibv_ud_pingpong's Q_Key.
pub const QKEY: u32 = 0x1111_1111;
/// ibv_ud_pingpong's default size (clipped to the port MTU here, see [`PingpongArgs::size`]).
pub const UD_DEFAULT_SIZE: u32 = 2048;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Errors of `softrdma pingpong`.
#[derive(Debug, thiserror::Error)]
pub enum PingpongError {
    /// A verbs call failed.
    #[error("{0}")]
    Verbs(#[from] softrdma::Error),
    /// A registered-memory access failed.
    #[error("memory: {0}")]
    Mem(#[from] MemError),
    /// A socket call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The out-of-band exchange failed (the rdma-core wording where there is one).
    #[error("{0}")]
    Exchange(String),
    /// A work request completed in error.
    #[error("Failed status {status:?} for wr_id {wr_id}")]
    Completion {
        /// The status.
        status: WcStatus,
        /// 1 receive, 2 send.
        wr_id: u64,
    },
    /// No completion within `--timeout`.
    #[error("no completion for {0} s (the peer is gone?)")]
    Timeout(u64),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(m @ (256 | 512 | 1024 | 2048 | 4096)) => Ok(m),
        _ => Err(format!(
            "path MTU must be 256, 512, 1024, 2048 or 4096, got {s}"
        )),
    }
}

/// `softrdma pingpong` options: the rdma-core pingpongs' flags plus softrdma's own.
#[derive(clap::Args, Clone, Debug)]
#[command(group(clap::ArgGroup::new("transport").required(true).args(["rc", "uc", "ud"])))]
pub struct PingpongArgs {
    /// Reliable Connected (ibv_rc_pingpong).
    #[arg(long)]
    pub rc: bool,
    /// Unreliable Connected (ibv_uc_pingpong).
    #[arg(long)]
    pub uc: bool,
    /// Unreliable Datagram (ibv_ud_pingpong).
    #[arg(long)]
    pub ud: bool,
    /// Connect to the server at HOST; without it, be the server.
    pub host: Option<String>,
    /// TCP port of the out-of-band exchange (server: 0 picks a free one).
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Message size (default 4096; UD: 2048 clipped to -m, and at most -m).
    #[arg(short = 's', long)]
    pub size: Option<u32>,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u32,
    /// GID index: accepted, the GID is always the bound address (rxe's index 1 for IPv4).
    #[arg(short = 'g', long = "gid-idx", allow_negative_numbers = true)]
    pub gid_index: Option<i32>,
    /// Path MTU (UD: the port MTU that bounds -s).
    #[arg(short = 'm', long, default_value = "1024", value_parser = parse_mtu)]
    pub mtu: u32,
    /// Receives posted at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub rx_depth: u32,
    /// Validate: the client zeroes byte 0 of every 4 KiB page, the server checks it.
    #[arg(short = 'c', long)]
    pub validate: bool,
    /// Service level (accepted, ignored: RoCE has no SL on the wire).
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Sleep on completion-channel events (as rdma-core's -e).
    #[arg(short = 'e', long, conflicts_with = "busy")]
    pub events: bool,
    /// Busy-poll the CQ instead of blocking on it.
    #[arg(long)]
    pub busy: bool,
    /// IB device (accepted, ignored: the device is the bound address).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// IB port (accepted, ignored).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Local RoCE address (default: the local address of the TCP exchange).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// UDP port of RoCEv2, ours and the peer's.
    #[arg(long, default_value_t = softrdma_wire::rocev2::ROCEV2_UDP_PORT)]
    pub roce_port: u16,
    /// Safety net: give up after this many seconds without a completion (0: never).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Write the RDMA traffic (RoCEv2 datagrams; not the out-of-band exchange) to this pcap
    /// file, for `softrdma decode` and tshark.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// At the end: the QP's counters and the device's.
    #[arg(long)]
    pub counters: bool,
    /// After the last completion, keep the QP answering until no datagram arrived for this
    /// many milliseconds (0: exit at once).
    #[arg(long, default_value_t = 200)]
    pub linger: u64,
}

/// How completions are awaited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Block on the CQ.
    Block,
    /// Busy-poll the CQ.
    Busy,
    /// Completion channel events (`-e`).
    Events,
}

/// The options of one run, independent of the command line.
#[derive(Clone, Debug)]
pub struct Opts {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Message size.
    pub size: u32,
    /// Round trips.
    pub iters: u32,
    /// Path MTU (UD: port MTU).
    pub mtu: u32,
    /// Receives posted at a time.
    pub rx_depth: u32,
    /// `-c`.
    pub validate: bool,
    /// How completions are awaited.
    pub wait: Wait,
    /// Local RoCE address, if given.
    pub bind: Option<IpAddr>,
    /// RoCEv2 UDP port.
    pub roce_port: u16,
    /// Safety net per wait (`None`: forever).
    pub timeout: Option<Duration>,
    /// Quiet period after the last completion.
    pub linger: Duration,
    /// The `--pcap` file the context is tapped into.
    pub tap: Option<Arc<PcapTap>>,
    /// Print the QP's and the device's counters at the end.
    pub counters: bool,
}

impl PingpongArgs {
    /// The options of this command line.
    pub fn opts(&self) -> Result<Opts, PingpongError> {
        let qp_type = if self.rc {
            QpType::Rc
        } else if self.uc {
            QpType::Uc
        } else {
            QpType::Ud
        };
        let ud = qp_type == QpType::Ud;
        let size = match self.size {
            Some(s) => s,
            None if ud => UD_DEFAULT_SIZE.min(self.mtu),
            None => 4096,
        };
        if ud && size > self.mtu {
            return Err(PingpongError::Usage(format!(
                "Requested size larger than port MTU ({})",
                self.mtu
            )));
        }
        if size == 0 || size > 1 << 30 {
            return Err(PingpongError::Usage(format!("bad size {size}")));
        }
        if self.bind.is_some_and(|b| b.is_unspecified()) {
            return Err(PingpongError::Usage(
                "--bind needs a specific address (it is the GID)".into(),
            ));
        }
        Ok(Opts {
            qp_type,
            size,
            iters: self.iters,
            mtu: self.mtu,
            rx_depth: self.rx_depth,
            validate: self.validate,
            wait: if self.events {
                Wait::Events
            } else if self.busy {
                Wait::Busy
            } else {
                Wait::Block
            },
            bind: self.bind,
            roce_port: self.roce_port,
            timeout: (self.timeout > 0).then(|| Duration::from_secs(self.timeout)),
            linger: Duration::from_millis(self.linger),
            tap: None,
            counters: self.counters,
        })
    }
}

/// One side's address as the pingpongs exchange it (`struct pingpong_dest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// GID, wire order.
    pub gid: [u8; 16],
}

impl Dest {
    /// The 52 octets: `"%04x:%06x:%06x:"`, 32 hex digits of the GID, NUL.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut s = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for b in self.gid {
            s.push_str(&format!("{b:02x}"));
        }
        let mut m = [0u8; MSG_LEN];
        let n = s.len().min(MSG_LEN - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    /// Parses a message as `sscanf("%x:%x:%x:%s")` and `wire_gid_to_gid` do.
    pub fn parse(b: &[u8]) -> Option<Dest> {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let s = std::str::from_utf8(&b[..end]).ok()?;
        let mut it = s.splitn(4, ':');
        let lid = u16::from_str_radix(it.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
        let psn = u32::from_str_radix(it.next()?, 16).ok()?;
        let g = it.next()?;
        if g.len() != 32 || !g.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, x) in gid.iter_mut().enumerate() {
            *x = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Dest { lid, qpn, psn, gid })
    }

    /// The GID as `inet_ntop(AF_INET6)` prints it.
    pub fn gid_text(&self) -> String {
        std::net::Ipv6Addr::from(self.gid).to_string()
    }
}

/// `lrand48() & 0xffffff` without a C library: a fresh randomly keyed hash.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    (h.finish() & 0xFF_FFFF) as u32
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Sends completed.
    pub sends: u32,
    /// Receives completed.
    pub recvs: u32,
    /// Seconds from the first post (client) or the end of the exchange (server).
    pub seconds: f64,
    /// `-c` on the server: pages whose first octet was wrong.
    pub invalid_pages: Vec<usize>,
    /// The peer as exchanged.
    pub remote: Option<Dest>,
}

/// One side's verbs resources (rdma-core's `pingpong_context`).
struct Pp {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    channel: Option<CompletionChannel>,
    qp: Qp,
    mr: Mr,
    ah: Option<Ah>,
    /// Offset of the message in the buffer (UD: after the GRH area).
    off: usize,
    inline: bool,
    o: Opts,
    me: Dest,
}

impl Pp {
    /// `--counters`: the QP's and the device's, after the run.
    fn show_counters(&self, role: &str, out: &mut dyn Write) -> std::io::Result<()> {
        if self.o.counters {
            let q = counters::qp(role, self.qp.qp_num(), &self.qp.counters());
            write!(out, "{q}{}", counters::device(&self.ctx))?;
        }
        Ok(())
    }

    fn new(o: &Opts, local: IpAddr) -> Result<Pp, PingpongError> {
        let mut cfg = RoceConfig::new(local);
        cfg.port = o.roce_port;
        let ctx = Device::roce(cfg).open().map_err(|e| {
            PingpongError::Exchange(format!(
                "Couldn't open a RoCE context on {local} port {}: {e}",
                o.roce_port
            ))
        })?;
        if let Some(t) = &o.tap {
            t.attach(&ctx).map_err(PingpongError::Exchange)?;
        }
        let pd = ctx.alloc_pd();
        let channel = match o.wait {
            Wait::Events => Some(ctx.create_comp_channel()?),
            _ => None,
        };
        let cq = ctx.create_cq(o.rx_depth as usize + 1, channel.as_ref())?;
        let ud = o.qp_type == QpType::Ud;
        let cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: o.rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpCap::default()
        };
        let inline = o.size <= cap.max_inline_data;
        let qp = pd.create_qp(QpInitAttr {
            cap,
            ..QpInitAttr::typed(o.qp_type, &cq, &cq)
        })?;
        let off = if ud { GRH_LEN } else { 0 };
        let mr = pd.alloc_mr(o.size as usize + off, Access::LOCAL_WRITE)?;
        mr.write()[..o.size as usize + off].fill(0x7b);
        qp.modify(&QpAttr {
            state: Some(QpState::Init),
            qkey: ud.then_some(QKEY),
            access: (!ud).then_some(Access::empty()),
            ..QpAttr::default()
        })
        .map_err(|_| PingpongError::Exchange("Failed to modify QP to INIT".into()))?;
        let me = Dest {
            lid: 0,
            qpn: qp.qp_num(),
            psn: random_psn(),
            gid: ctx.roce_gid()?,
        };
        let pp = Pp {
            ctx,
            pd,
            cq,
            channel,
            qp,
            mr,
            ah: None,
            off,
            inline,
            o: o.clone(),
            me,
        };
        let posted = pp.post_recv(o.rx_depth)?;
        if posted < o.rx_depth {
            return Err(PingpongError::Exchange(format!(
                "Couldn't post receive ({posted})"
            )));
        }
        if pp.channel.is_some() {
            pp.cq.req_notify(false);
        }
        Ok(pp)
    }

    fn post_recv(&self, n: u32) -> Result<u32, PingpongError> {
        let len = self.o.size + self.off as u32;
        for i in 0..n {
            if self
                .qp
                .post_recv(RecvWr::new(RECV_WRID, vec![self.mr.sge(0, len)]))
                .is_err()
            {
                return Ok(i);
            }
        }
        Ok(n)
    }

    fn post_send(&self, remote_qpn: u32) -> Result<(), PingpongError> {
        let mut wr = SendWr::send(SEND_WRID, vec![self.mr.sge(self.off, self.o.size)]);
        if self.inline {
            wr = wr.with_flags(SendFlags::SIGNALED | SendFlags::INLINE);
        }
        if let Some(ah) = &self.ah {
            wr = wr.to(UdDest {
                ah: ah.id(),
                remote_qpn,
                remote_qkey: QKEY,
            });
        }
        Ok(self.qp.post_send(wr)?)
    }

    fn print_local(&self, out: &mut dyn Write) -> std::io::Result<()> {
        print_dest(out, "local address: ", &self.me, self.o.qp_type)
    }

    /// `pp_connect_ctx`: RTR and RTS with the peer's attributes (UD: and the AH).
    fn connect(&mut self, rem: &Dest, tcp_peer: IpAddr) -> Result<(), PingpongError> {
        let ip = peer_ip(rem, tcp_peer)?;
        let addr = SocketAddr::new(ip, self.o.roce_port);
        let rtr_err =
            |_: softrdma::Error| PingpongError::Exchange("Failed to modify QP to RTR".into());
        let rts_err =
            |_: softrdma::Error| PingpongError::Exchange("Failed to modify QP to RTS".into());
        match self.o.qp_type {
            QpType::Rc | QpType::Uc => {
                let path = OobPath {
                    peer: addr,
                    dest_qp: rem.qpn,
                    rq_psn: rem.psn,
                    sq_psn: self.me.psn,
                    pmtu: self.o.mtu,
                    max_dest_rd_atomic: 1,
                    max_rd_atomic: 1,
                };
                rtr_rts(&self.qp, &path).map_err(|(step, e)| match step {
                    QpState::Rtr => rtr_err(e),
                    _ => rts_err(e),
                })?;
            }
            QpType::Ud => {
                // The UD QP's PMTU is the port MTU: the largest message (-s is checked
                // against it as ibv_ud_pingpong checks the port's active MTU).
                self.qp
                    .modify(&QpAttr {
                        state: Some(QpState::Rtr),
                        pmtu: Some(self.o.mtu),
                        ..QpAttr::default()
                    })
                    .map_err(rtr_err)?;
                self.qp
                    .modify(&QpAttr {
                        state: Some(QpState::Rts),
                        sq_psn: Some(self.me.psn),
                        ..QpAttr::default()
                    })
                    .map_err(rts_err)?;
                self.ah = Some(
                    self.pd
                        .create_ah_port(addr)
                        .map_err(|_| PingpongError::Exchange("Failed to create AH".into()))?,
                );
            }
        }
        Ok(())
    }

    /// Moves completions to `out` (rdma-core polls at most two at a time).
    fn wait(&self, out: &mut Vec<WorkCompletion>) -> Result<(), PingpongError> {
        let t = self.o.timeout.unwrap_or(Duration::from_secs(3600));
        loop {
            let r = match (&self.channel, self.o.wait) {
                (Some(ch), _) => match ch.get_cq_event(Some(t)) {
                    Some(_) => {
                        self.cq.req_notify(false);
                        self.cq.poll(2, out);
                        Ok(0)
                    }
                    None => Err(softrdma::Error::Timeout),
                },
                (None, Wait::Busy) => wait_some(&self.cq, WaitMode::Busy, 2, t, out),
                (None, _) => wait_some(&self.cq, WaitMode::Block, 2, t, out),
            };
            match r {
                Ok(_) => return Ok(()),
                Err(softrdma::Error::Timeout) if self.o.timeout.is_none() => {}
                Err(softrdma::Error::Timeout) => {
                    return Err(PingpongError::Timeout(t.as_secs()));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The ping-pong loop (`parse_single_wc`); the client posts the first SEND.
    fn run(&self, rem: &Dest, client: bool) -> Result<Outcome, PingpongError> {
        let iters = self.o.iters;
        let mut routs = self.o.rx_depth;
        let (mut rcnt, mut scnt) = (0u32, 0u32);
        let mut pending = RECV_WRID;
        if client {
            if self.o.validate {
                // rdma-core: buf[i] = i / page_size % sizeof(char), which is always 0.
                let mut b = self.mr.write();
                for i in (0..self.o.size as usize).step_by(PAGE) {
                    b[self.off + i] = 0;
                }
            }
            self.post_send(rem.qpn)?;
            pending |= SEND_WRID;
        }
        let start = Instant::now();
        let mut wcs = Vec::with_capacity(2);
        while rcnt < iters || scnt < iters {
            wcs.clear();
            self.wait(&mut wcs)?;
            for wc in &wcs {
                if wc.status != WcStatus::Success {
                    return Err(PingpongError::Completion {
                        status: wc.status,
                        wr_id: wc.wr_id,
                    });
                }
                match wc.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        routs -= 1;
                        if routs <= 1 {
                            routs += self.post_recv(self.o.rx_depth - routs)?;
                            if routs < self.o.rx_depth {
                                return Err(PingpongError::Exchange(format!(
                                    "Couldn't post receive ({routs})"
                                )));
                            }
                        }
                        rcnt += 1;
                    }
                    other => {
                        return Err(PingpongError::Exchange(format!(
                            "Completion for unknown wr_id {other}"
                        )));
                    }
                }
                pending &= !wc.wr_id;
                if scnt < iters && pending == 0 {
                    self.post_send(rem.qpn)?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let mut invalid_pages = Vec::new();
        if !client && self.o.validate {
            let b = self.mr.read();
            for i in (0..self.o.size as usize).step_by(PAGE) {
                if b[self.off + i] != 0 {
                    invalid_pages.push(i / PAGE);
                }
            }
        }
        Ok(Outcome {
            sends: scnt,
            recvs: rcnt,
            seconds,
            invalid_pages,
            remote: Some(*rem),
        })
    }

    /// Keeps the QP answering until no datagram arrived for `linger` (at most 25 times
    /// that, and 5 s).
    fn linger(&self) {
        let quiet = self.o.linger;
        if quiet.is_zero() {
            return;
        }
        let rx = || self.ctx.roce_counters().map_or(0, |c| c.rx_packets);
        let cap = Instant::now() + (quiet * 25).min(Duration::from_secs(5)).max(quiet);
        let step = (quiet / 4).clamp(Duration::from_millis(1), Duration::from_millis(20));
        let mut last = rx();
        let mut since = Instant::now();
        loop {
            // Not synchronisation: a quiet period on the wire, measured.
            std::thread::sleep(step);
            let now = Instant::now();
            let c = rx();
            if c != last {
                last = c;
                since = now;
            } else if now - since >= quiet || now >= cap {
                return;
            }
        }
    }
}

fn print_dest(out: &mut dyn Write, what: &str, d: &Dest, ty: QpType) -> std::io::Result<()> {
    // ibv_ud_pingpong prints a colon before the GID where the others print a comma.
    let sep = if ty == QpType::Ud { ":" } else { "," };
    writeln!(
        out,
        "  {what} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        d.lid,
        d.qpn,
        d.psn,
        d.gid_text()
    )
}

/// The IP address behind a peer's GID; an all-zero GID (rdma-core without `-g`) falls back
/// to the address the exchange came from.
fn peer_ip(rem: &Dest, tcp_peer: IpAddr) -> Result<IpAddr, PingpongError> {
    if rem.gid == [0; 16] {
        eprintln!(
            "softrdma pingpong: the peer sent an all-zero GID (no -g?); using {tcp_peer} from the exchange"
        );
        return Ok(tcp_peer.to_canonical());
    }
    let ip = softrdma::roce::gid_to_ip(&rem.gid);
    if let IpAddr::V6(v6) = ip
        && v6.is_unicast_link_local()
    {
        return Err(PingpongError::Exchange(format!(
            "the peer's GID {ip} is link-local (rxe GID index 0); use the IPv4-mapped one (-g 1)"
        )));
    }
    Ok(ip)
}

fn print_result(out: &mut dyn Write, o: &Opts, r: &Outcome) -> std::io::Result<()> {
    let usec = r.seconds * 1e6;
    let bytes = u64::from(o.size) * u64::from(o.iters) * 2;
    writeln!(
        out,
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / f64::from(o.iters.max(1))
    )?;
    for p in &r.invalid_pages {
        writeln!(out, "invalid data in page {p}")?;
    }
    Ok(())
}

/// Reads exactly `n` octets (the rdma-core tools expect each message in one read; we take
/// it in as many as it comes).
fn read_msg(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Runs the client against the server at `host:port`.
pub fn client(
    host: &str,
    port: u16,
    o: &Opts,
    out: &mut dyn Write,
) -> Result<Outcome, PingpongError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| PingpongError::Exchange(format!("{e} for {host}:{port}")))?
        .collect();
    let mut sock = None;
    let mut why = String::from("no address");
    for a in &addrs {
        // --timeout covers the out-of-band connect too (the kernel's SYN retries take
        // minutes against a host that does not answer).
        let r = match o.timeout {
            Some(t) => TcpStream::connect_timeout(a, t),
            None => TcpStream::connect(a),
        };
        match r {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => why = e.to_string(),
        }
    }
    let Some(mut sock) = sock else {
        return Err(PingpongError::Exchange(format!(
            "Couldn't connect to {host}:{port} (the exchange port, -p): {why}"
        )));
    };
    let _ = sock.set_nodelay(true);
    // And the exchange itself: a server that answers half never holds us.
    let _ = sock.set_read_timeout(o.timeout);
    let _ = sock.set_write_timeout(o.timeout);
    let local = match o.bind {
        Some(b) => b,
        None => sock.local_addr()?.ip().to_canonical(),
    };
    let tcp_peer = sock.peer_addr()?.ip();
    let mut pp = Pp::new(o, local)?;
    pp.print_local(out)?;
    sock.write_all(&pp.me.encode())
        .map_err(|_| PingpongError::Exchange("Couldn't send local address".into()))?;
    let msg = read_msg(&mut sock, MSG_LEN).and_then(|m| sock.write_all(DONE).map(|()| m));
    let msg = msg
        .map_err(|e| PingpongError::Exchange(format!("Couldn't read/write remote address: {e}")))?;
    drop(sock);
    let rem = Dest::parse(&msg)
        .ok_or_else(|| PingpongError::Exchange("Couldn't parse the remote address".into()))?;
    print_dest(out, "remote address:", &rem, o.qp_type)?;
    pp.connect(&rem, tcp_peer)?;
    let r = pp.run(&rem, true)?;
    print_result(out, o, &r)?;
    out.flush()?;
    pp.linger();
    pp.show_counters("client", out)?;
    Ok(r)
}

/// Binds the server's TCP listener: dual-stack `[::]` (IPv4 clients appear IPv4-mapped), or
/// `0.0.0.0` where IPv6 is off.
pub fn listen(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))
}

/// Serves one client from `listener`.
pub fn serve(
    listener: &TcpListener,
    o: &Opts,
    out: &mut dyn Write,
) -> Result<Outcome, PingpongError> {
    let (mut sock, peer) = listener
        .accept()
        .map_err(|e| PingpongError::Exchange(format!("accept() failed: {e}")))?;
    let _ = sock.set_nodelay(true);
    // A client that sends half its message and waits must not hold the server forever.
    let _ = sock.set_read_timeout(o.timeout);
    let _ = sock.set_write_timeout(o.timeout);
    let local = match o.bind {
        Some(b) => b,
        None => sock.local_addr()?.ip().to_canonical(),
    };
    let mut pp = Pp::new(o, local)?;
    pp.print_local(out)?;
    let msg = read_msg(&mut sock, MSG_LEN)
        .map_err(|e| PingpongError::Exchange(format!("{e}: Couldn't read remote address")))?;
    let rem = Dest::parse(&msg)
        .ok_or_else(|| PingpongError::Exchange("Couldn't parse the remote address".into()))?;
    pp.connect(&rem, peer.ip())
        .map_err(|e| PingpongError::Exchange(format!("Couldn't connect to remote QP: {e}")))?;
    sock.write_all(&pp.me.encode())
        .map_err(|_| PingpongError::Exchange("Couldn't send/recv local address".into()))?;
    // The client's "done": its QP starts after it, ours is ready already, so a short or
    // missing one is only worth a note.
    let mut done = [0u8; MSG_LEN];
    let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
    match sock.read(&mut done) {
        Ok(n) if done[..n] == DONE[..] => {}
        Ok(n) => eprintln!(
            "softrdma pingpong: expected \"done\" from the client, got {:?}",
            String::from_utf8_lossy(&done[..n])
        ),
        Err(e) => eprintln!("softrdma pingpong: reading the client's \"done\": {e}"),
    }
    drop(sock);
    print_dest(out, "remote address:", &rem, o.qp_type)?;
    let r = pp.run(&rem, false)?;
    print_result(out, o, &r)?;
    out.flush()?;
    pp.linger();
    pp.show_counters("server", out)?;
    Ok(r)
}

/// Entry point of `softrdma pingpong`; the exit status (1 on errors and on invalid data).
pub fn run(args: &PingpongArgs) -> i32 {
    let mut o = match args.opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("softrdma pingpong: {e}");
            return 1;
        }
    };
    with_pcap(args.pcap.as_deref(), "softrdma pingpong", |tap| {
        o.tap = tap.cloned();
        run_with(args, &o)
    })
}

fn run_with(args: &PingpongArgs, o: &Opts) -> i32 {
    let o = o.clone();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let r = match &args.host {
        Some(h) => client(h, args.port, &o, &mut out),
        None => match listen(args.port) {
            Ok(l) => {
                let a = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                let _ = writeln!(out, "listening on {a}");
                let _ = out.flush();
                serve(&l, &o, &mut out)
            }
            Err(e) => Err(PingpongError::Exchange(format!(
                "Couldn't listen to port {}: {e}",
                args.port
            ))),
        },
    };
    match r {
        Ok(r) if r.invalid_pages.is_empty() => 0,
        Ok(r) => {
            eprintln!(
                "softrdma pingpong: invalid data in {} page(s)",
                r.invalid_pages.len()
            );
            1
        }
        Err(e) => {
            eprintln!("softrdma pingpong: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames 4/6 of fixtures/captures/rxe-interop/rc_pingpong-s100-n5-c.pcap.
    #[test]
    fn dest_matches_the_capture() {
        let client = b"0000:000011:bc3061:00000000000000000000ffff0a4d0003\0";
        let d = Dest::parse(client).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x11, 0xbc3061));
        assert_eq!(d.gid_text(), "::ffff:10.77.0.3");
        assert_eq!(&d.encode(), client);
        assert_eq!(
            softrdma::roce::gid_to_ip(&d.gid),
            "10.77.0.3".parse::<IpAddr>().unwrap()
        );
        let zero = Dest {
            lid: 0,
            qpn: 0xabcdef,
            psn: 1,
            gid: [0; 16],
        };
        assert_eq!(Dest::parse(&zero.encode()), Some(zero));
        assert_eq!(zero.gid_text(), "::");
        assert!(Dest::parse(b"0000:000011:bc3061:00ff\0").is_none());
    }

    #[test]
    fn psn_is_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0xFF_FFFF);
        }
    }
}
