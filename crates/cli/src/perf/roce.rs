//! `softrdma perf --transport roce`: RDMA Write, RDMA Read and Send over RoCEv2 (RC QPs of
//! [`softrdma::Qp`]), beside raw UDP measured in the same run.
//!
//! **Session.** The client opens one TCP connection to the server (`-p`, 18515) and runs
//! every test over it; `--loopback` runs the server on a thread of this process with RoCE
//! on 127.0.0.1 (server) and 127.0.0.2 (client), UDP ports chosen by the kernel. Each
//! message is [`MSG_LEN`] octets, little-endian ([`Msg`]): the client's request names the
//! test, the size, its QPN, PSN, GID, RoCE UDP port and buffer; the server creates a QP
//! (RC, path MTU `-m`, `timeout 14`, `retry_cnt 7`, `rnr_retry 7`, 16 READs/atomics each
//! way), brings it to RTS and answers with the same fields for its side; the client moves
//! its QP to RTR/RTS and runs the test, then sends `End` and waits for the server's `End`
//! (the server keeps the QP and its echo or repost loop alive until then). `Bye` or EOF
//! ends the session. The RoCE server opens its context per session on the address the
//! client reached it at (or `-B`).
//!
//! **RDMA tests** as the iWARP perf runs them ([`super::rdma`]): bandwidth with `-t`
//! requests outstanding, every `-t / 4`-th signalled, timed from the first post to the
//! completion of a final one-octet RDMA Read (its response follows every earlier message);
//! Send bandwidth against `-r` receives the server posts again as they complete (RoCE has
//! RNR NAKs, so no credits: an empty receive queue costs an RNR wait, not the connection).
//! Latency: Send ping-pong and Write with both sides polling the last octet (half round
//! trips), Read (a round trip).
//!
//! **Raw UDP baseline**, same run, same message size, the same two addresses, sockets with
//! the same 4 MiB buffers as the RoCE driver's:
//!
//! - bandwidth: the client sends each message as `ceil(size / mtu)` datagrams of at most the
//!   path MTU (the payload a RoCE packet carries), never more than [`UDP_WINDOW`] datagrams'
//!   worth beyond what the server acknowledged: what the 4 MiB receive buffer (8 MiB of
//!   accounted memory) holds of 4 KiB datagrams, whose skbs take about 9 KiB each.
//!   The server acknowledges the running octet total in an 8-octet datagram every
//!   [`UDP_ACK_EVERY`] datagrams and whenever it gets an empty datagram, which the client
//!   sends after its last message. The time runs from the first datagram to the
//!   acknowledgement of the last octet, so it covers delivery. A datagram lost shows as an
//!   acknowledgement that stops short; the test then fails rather than report a figure
//!   for less data.
//! - latency: a ping-pong of `size`-octet messages (datagrams of at most the MTU), the
//!   server echoing each datagram; half the round trip beside Send and Write, the whole one
//!   beside Read.
//!
//! **perftest client** (`--perftest --test write|read|atomic HOST`): speaks the TCP
//! out-of-band exchange of perftest's `ib_write_bw` / `ib_read_bw` / `ib_atomic_bw` (no
//! `-R`; docs/rxe-interop.md) to a perftest server and runs the test against its buffer:
//! version (`"6.06"`), cycle buffer and cache line size, MTU, the 108-octet QP records,
//! the bandwidth report, `"done"`. See [`perftest_client`].

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrdma::ib::{QpAttr, QpState};
use softrdma::{
    Access, Context, Cq, Key, Mr, Qp, QpCap, QpInitAttr, RecvWr, RoceConfig, SendFlags, SendWr,
    WcOpcode,
};

pub mod perftest;

pub use self::perftest::{PerftestResult, PerftestTest, perftest_client};
use super::lat::{LatLoop, SAFETY, check};
use super::proto::Test;
use super::stats::Bw;
use super::{Limit, PerfArgs, PerfError, Report};
use crate::verbs_util::{WaitMode, spin_until, wait_some};

/// First octets of every message of the RoCE perf session.
pub const MAGIC: [u8; 4] = *b"SRRP";
/// Layout version.
pub const VERSION: u8 = 1;
/// Octets of a [`Msg`].
pub const MSG_LEN: usize = 68;
/// Raw UDP bandwidth: datagrams in flight unacknowledged, at most.
pub const UDP_WINDOW: u64 = 512;
/// Raw UDP bandwidth: the server acknowledges every this many datagrams.
pub const UDP_ACK_EVERY: u32 = 16;
/// Socket buffers of the raw UDP sockets (what `RoceConfig::new` asks for).
const UDP_BUFFER: usize = 4 << 20;
/// Raw UDP: an acknowledgement or echo this late means a datagram was lost.
const UDP_STALL: Duration = Duration::from_millis(250);
/// READs / atomics outstanding each way on the perf QPs.
const RD_ATOMIC: u8 = 16;
/// Largest message sent INLINE.
const INLINE_MAX: u32 = 256;
/// wr_id of the final, delivery-confirming Read.
const SYNC: u64 = 1 << 62;
/// How often server loops look at the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Every remote right.
const REMOTE: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// What a message asks or answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An RDMA test.
    Rdma(Test),
    /// Raw UDP bandwidth.
    UdpBw,
    /// Raw UDP ping-pong.
    UdpLat,
    /// The test is over (client), torn down (server).
    End,
    /// The session is over.
    Bye,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Rdma(Test::WriteBw) => 1,
            Kind::Rdma(Test::ReadBw) => 2,
            Kind::Rdma(Test::SendBw) => 3,
            Kind::Rdma(Test::WriteLat) => 4,
            Kind::Rdma(Test::ReadLat) => 5,
            Kind::Rdma(Test::SendLat) => 6,
            Kind::UdpBw => 0x10,
            Kind::UdpLat => 0x11,
            Kind::End => 0x20,
            Kind::Rdma(Test::Bye) | Kind::Bye => 0xff,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Rdma(Test::WriteBw),
            2 => Kind::Rdma(Test::ReadBw),
            3 => Kind::Rdma(Test::SendBw),
            4 => Kind::Rdma(Test::WriteLat),
            5 => Kind::Rdma(Test::ReadLat),
            6 => Kind::Rdma(Test::SendLat),
            0x10 => Kind::UdpBw,
            0x11 => Kind::UdpLat,
            0x20 => Kind::End,
            0xff => Kind::Bye,
            _ => return None,
        })
    }
}

/// One message of the session: a side's QP and buffer, or a UDP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg {
    /// What it is.
    pub kind: Kind,
    /// UDP port: of the RoCE context (RDMA tests) or of the raw UDP socket.
    pub port: u16,
    /// Message size.
    pub size: u32,
    /// Send bandwidth: receives the server keeps posted.
    pub depth: u32,
    /// Path MTU (raw UDP: the datagram size).
    pub mtu: u32,
    /// QP number.
    pub qpn: u32,
    /// First PSN of the sender's send queue.
    pub psn: u32,
    /// R_Key of the buffer.
    pub rkey: u32,
    /// Length of the buffer.
    pub len: u32,
    /// Virtual address of the buffer.
    pub addr: u64,
    /// `End` from the server after raw UDP bandwidth: octets it received.
    pub count: u64,
    /// GID (the IPv4-mapped or IPv6 address of the sender).
    pub gid: [u8; 16],
}

impl Msg {
    /// A message of `kind` with every field zero.
    pub fn new(kind: Kind) -> Msg {
        Msg {
            kind,
            port: 0,
            size: 0,
            depth: 0,
            mtu: 0,
            qpn: 0,
            psn: 0,
            rkey: 0,
            len: 0,
            addr: 0,
            count: 0,
            gid: [0; 16],
        }
    }

    /// The [`MSG_LEN`] octets.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.kind.code();
        b[6..8].copy_from_slice(&self.port.to_le_bytes());
        for (i, v) in [
            self.size, self.depth, self.mtu, self.qpn, self.psn, self.rkey, self.len,
        ]
        .into_iter()
        .enumerate()
        {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b[36..44].copy_from_slice(&self.addr.to_le_bytes());
        b[44..52].copy_from_slice(&self.count.to_le_bytes());
        b[52..68].copy_from_slice(&self.gid);
        b
    }

    /// Parses a message; `None` if it is not one of this version.
    pub fn parse(b: &[u8; MSG_LEN]) -> Option<Msg> {
        if b[0..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[52..68]);
        Some(Msg {
            kind: Kind::from_code(b[5])?,
            port: u16::from_le_bytes([b[6], b[7]]),
            size: u32_at(8),
            depth: u32_at(12),
            mtu: u32_at(16),
            qpn: u32_at(20),
            psn: u32_at(24),
            rkey: u32_at(28),
            len: u32_at(32),
            addr: u64_at(36),
            count: u64_at(44),
            gid,
        })
    }

    /// The sender's address for `port`.
    fn sock(&self) -> SocketAddr {
        SocketAddr::new(softrdma::gid_to_ip(&self.gid), self.port)
    }
}

fn send_msg(s: &mut TcpStream, m: &Msg) -> Result<(), PerfError> {
    s.write_all(&m.encode())?;
    Ok(())
}

/// The next message; `None` at end of stream.
fn recv_msg(s: &mut TcpStream) -> Result<Option<Msg>, PerfError> {
    let mut b = [0u8; MSG_LEN];
    match s.read_exact(&mut b) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    Msg::parse(&b)
        .map(Some)
        .ok_or_else(|| PerfError::Protocol("not a softrdma RoCE perf message".into()))
}

fn expect_msg(s: &mut TcpStream, kind: Kind) -> Result<Msg, PerfError> {
    match recv_msg(s)? {
        Some(m) if m.kind == kind => Ok(m),
        Some(m) => Err(PerfError::Protocol(format!(
            "expected {kind:?} from the peer, got {:?}",
            m.kind
        ))),
        None => Err(PerfError::Protocol(format!(
            "the peer closed the session while we waited for {kind:?}"
        ))),
    }
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

fn open_ctx(ip: IpAddr, port: u16) -> Result<Context, PerfError> {
    let mut cfg = RoceConfig::new(ip);
    cfg.port = port;
    Context::open_roce(cfg).map_err(|e| {
        PerfError::Usage(format!(
            "cannot open a RoCE context on {ip} port {port}: {e}"
        ))
    })
}

fn random_psn() -> u32 {
    crate::pingpong::random_psn()
}

/// An RC QP in INIT with `access` (the driver sizes its window at RTR).
fn create_rc(
    pd: &softrdma::Pd,
    cq: &Cq,
    send: u32,
    recv: u32,
    access: Access,
    pmtu: u32,
) -> Result<Qp, PerfError> {
    let _ = pmtu;
    let qp = pd.create_qp(QpInitAttr {
        cap: QpCap {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        },
        ..QpInitAttr::new(cq, cq)
    })?;
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        access: Some(access),
        ..QpAttr::default()
    })?;
    Ok(qp)
}

/// RTR and RTS facing `peer` (as perftest's `ctx_connect`).
#[allow(clippy::too_many_arguments)]
fn connect_rc(
    qp: &Qp,
    peer: SocketAddr,
    peer_qpn: u32,
    peer_psn: u32,
    my_psn: u32,
    pmtu: u32,
    dest_rd_atomic: u8,
    rd_atomic: u8,
) -> Result<(), PerfError> {
    qp.set_remote(peer)?;
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: Some(pmtu),
        dest_qp: Some(peer_qpn & 0xFF_FFFF),
        rq_psn: Some(peer_psn & 0xFF_FFFF),
        max_dest_rd_atomic: Some(dest_rd_atomic),
        min_rnr_timer: Some(12),
        ..QpAttr::default()
    })?;
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(my_psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(rd_atomic),
        ..QpAttr::default()
    })?;
    Ok(())
}

fn valid_mtu(m: u32) -> Result<u32, PerfError> {
    match m {
        256 | 512 | 1024 | 2048 | 4096 => Ok(m),
        _ => Err(PerfError::Usage(format!(
            "--mtu must be 256, 512, 1024, 2048 or 4096, got {m}"
        ))),
    }
}

fn udp_socket(ip: IpAddr) -> io::Result<UdpSocket> {
    let addr = SocketAddr::new(ip, 0);
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    let _ = s.set_recv_buffer_size(UDP_BUFFER);
    let _ = s.set_send_buffer_size(UDP_BUFFER);
    s.bind(&addr.into())?;
    Ok(s.into())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

// ---- server --------------------------------------------------------------------------------

/// What the server does.
#[derive(Clone, Copy, Debug)]
pub struct ServerCfg {
    /// RoCE address (default: where the client reached us).
    pub bind: Option<IpAddr>,
    /// RoCE UDP port (0: any).
    pub roce_port: u16,
    /// Blocking or busy-polling waits.
    pub wait: WaitMode,
    /// A line per test on stderr.
    pub log: bool,
}

/// Serves sessions from `listener`: one with `once`, else forever.
pub fn serve(listener: &TcpListener, cfg: ServerCfg, once: bool) -> Result<(), PerfError> {
    loop {
        let (s, peer) = listener.accept()?;
        let r = serve_session(s, cfg);
        if let Err(e) = &r {
            eprintln!("softrdma perf: {peer}: {e}");
        } else if cfg.log {
            eprintln!("softrdma perf: {peer}: session done");
        }
        if once {
            return r;
        }
    }
}

/// One client session: tests until `Bye` or EOF.
pub fn serve_session(mut s: TcpStream, cfg: ServerCfg) -> Result<(), PerfError> {
    s.set_nodelay(true)?;
    let ip = match cfg.bind {
        Some(ip) => ip,
        None => s.local_addr()?.ip().to_canonical(),
    };
    let ctx = open_ctx(ip, cfg.roce_port)?;
    loop {
        let Some(req) = recv_msg(&mut s)? else {
            return Ok(());
        };
        if cfg.log && !matches!(req.kind, Kind::Bye | Kind::End) {
            eprintln!(
                "softrdma perf: {}: {:?} {} octets",
                req.sock(),
                req.kind,
                req.size
            );
        }
        let stop = AtomicBool::new(false);
        match req.kind {
            Kind::Bye => return Ok(()),
            Kind::End => return Err(PerfError::Protocol("End outside a test".into())),
            Kind::Rdma(test) => {
                let t = ServerTest::new(&ctx, &req, test)?;
                send_msg(&mut s, &t.reply)?;
                let (end, r) = std::thread::scope(|sc| {
                    let h = sc.spawn(|| t.run(&stop, cfg.wait));
                    let end = expect_msg(&mut s, Kind::End);
                    stop.store(true, Ordering::Release);
                    (end, h.join())
                });
                let r = r.map_err(|_| PerfError::Protocol("a server test thread panicked".into()));
                end?;
                r??;
                drop(t);
                send_msg(&mut s, &Msg::new(Kind::End))?;
            }
            Kind::UdpBw | Kind::UdpLat => {
                let sock = udp_socket(ip)?;
                sock.connect(req.sock())?;
                sock.set_read_timeout(Some(POLL))?;
                let mut reply = Msg::new(req.kind);
                reply.port = sock.local_addr()?.port();
                reply.gid = ctx.roce_gid()?;
                send_msg(&mut s, &reply)?;
                let bw = req.kind == Kind::UdpBw;
                let (end, r) = std::thread::scope(|sc| {
                    let h = sc.spawn(|| udp_serve(&sock, bw, &stop));
                    let end = expect_msg(&mut s, Kind::End);
                    stop.store(true, Ordering::Release);
                    (end, h.join())
                });
                end?;
                let got =
                    r.map_err(|_| PerfError::Protocol("the UDP server thread panicked".into()))??;
                let mut m = Msg::new(Kind::End);
                m.count = got;
                send_msg(&mut s, &m)?;
            }
        }
    }
}

/// Raw UDP on the server: counts and acknowledges (bandwidth) or echoes (latency) until
/// `stop`; returns the octets received.
fn udp_serve(sock: &UdpSocket, bw: bool, stop: &AtomicBool) -> Result<u64, PerfError> {
    let mut buf = vec![0u8; 65536];
    let mut total = 0u64;
    let mut unacked = 0u32;
    loop {
        match sock.recv(&mut buf) {
            Ok(n) if bw => {
                total += n as u64;
                unacked += 1;
                if n == 0 || unacked >= UDP_ACK_EVERY {
                    sock.send(&total.to_le_bytes())?;
                    unacked = 0;
                }
            }
            Ok(n) => {
                total += n as u64;
                sock.send(&buf[..n])?;
            }
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::ConnectionRefused => {
                if stop.load(Ordering::Acquire) {
                    return Ok(total);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The server's end of one RDMA test.
struct ServerTest {
    test: Test,
    cq: Cq,
    qp: Qp,
    buf: Mr,
    src: Mr,
    size: u32,
    rx_depth: u32,
    /// The client's buffer (Write latency writes back into it).
    client: Msg,
    reply: Msg,
}

impl ServerTest {
    fn new(ctx: &Context, req: &Msg, test: Test) -> Result<ServerTest, PerfError> {
        let size = req.size.max(1);
        let n = size as usize;
        let pd = ctx.alloc_pd();
        let rx_depth = match test {
            Test::SendBw => req.depth.clamp(1, 1 << 16),
            Test::SendLat => 4,
            _ => 1,
        };
        let cq = ctx.create_cq(rx_depth as usize + 256, None);
        let mtu = valid_mtu(req.mtu)?;
        let qp = create_rc(&pd, &cq, 256, rx_depth, REMOTE, mtu)?;
        let buf = pd.alloc_mr(n, REMOTE)?;
        let src = pd.alloc_mr(n.max(8), REMOTE)?;
        if matches!(test, Test::SendBw | Test::SendLat) {
            for i in 0..rx_depth {
                qp.post_recv(RecvWr::new(u64::from(i), vec![buf.sge(0, size)]))?;
            }
        }
        let psn = random_psn();
        connect_rc(
            &qp,
            req.sock(),
            req.qpn,
            req.psn,
            psn,
            mtu,
            RD_ATOMIC,
            RD_ATOMIC,
        )?;
        let reply = Msg {
            kind: req.kind,
            port: ctx.roce_local_addr()?.port(),
            size,
            depth: rx_depth,
            mtu,
            qpn: qp.qp_num(),
            psn,
            rkey: buf.rkey().0,
            len: size,
            addr: buf.addr(0),
            count: 0,
            gid: ctx.roce_gid()?,
        };
        Ok(ServerTest {
            test,
            cq,
            qp,
            buf,
            src,
            size,
            rx_depth,
            client: *req,
            reply,
        })
    }

    fn run(&self, stop: &AtomicBool, wait: WaitMode) -> Result<(), PerfError> {
        match self.test {
            Test::SendBw | Test::SendLat => self.serve_recvs(stop, wait),
            Test::WriteLat => self.serve_write_lat(stop),
            _ => {
                // Write/Read: the work is the responder's; wait for the client's End, but
                // report a QP that failed.
                while !stop.load(Ordering::Acquire) {
                    let mut wcs = Vec::new();
                    let _ = self.cq.wait(1, 16, POLL, &mut wcs);
                    for wc in &wcs {
                        check(wc)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Send bandwidth: posts every receive again; Send latency: echoes each message from
    /// its receive buffer (the next ping cannot arrive before the client has the pong).
    fn serve_recvs(&self, stop: &AtomicBool, wait: WaitMode) -> Result<(), PerfError> {
        let echo = self.test == Test::SendLat;
        let inline = if self.size <= INLINE_MAX {
            SendFlags::SIGNALED | SendFlags::INLINE
        } else {
            SendFlags::SIGNALED
        };
        let mut wcs = Vec::with_capacity(128);
        while !stop.load(Ordering::Acquire) {
            wcs.clear();
            match wait_some(&self.cq, wait, 128, POLL, &mut wcs) {
                Ok(_) | Err(softrdma::Error::Timeout) => {}
                Err(e) => return Err(e.into()),
            }
            for wc in &wcs {
                check(wc)?;
                if wc.opcode != WcOpcode::Recv {
                    continue;
                }
                if echo {
                    self.qp.post_send(
                        SendWr::send(wc.wr_id, vec![self.buf.sge(0, wc.byte_len)])
                            .with_flags(inline),
                    )?;
                }
                self.qp
                    .post_recv(RecvWr::new(wc.wr_id, vec![self.buf.sge(0, self.size)]))?;
            }
        }
        let _ = self.rx_depth;
        Ok(())
    }

    /// Write latency: waits for the client's write (its last octet), writes back.
    fn serve_write_lat(&self, stop: &AtomicBool) -> Result<(), PerfError> {
        let n = self.size as usize;
        if self.client.len < self.size {
            return Err(PerfError::Protocol(
                "the client's buffer is too small".into(),
            ));
        }
        let inline = if self.size <= INLINE_MAX {
            SendFlags::SIGNALED | SendFlags::INLINE
        } else {
            SendFlags::SIGNALED
        };
        let mut i = 0u64;
        let mut wcs = Vec::new();
        loop {
            let tag = (i % 255) as u8 + 1;
            let mut b = [0u8; 1];
            while !(self.buf.copy_out(n - 1, &mut b).is_ok() && b[0] == tag) {
                if stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                spin_until(POLL, || {
                    self.buf.copy_out(n - 1, &mut b).is_ok() && b[0] == tag
                        || stop.load(Ordering::Acquire)
                });
            }
            self.src.copy_in(n - 1, &[tag])?;
            self.qp.post_send(
                SendWr::write(
                    i,
                    vec![self.src.sge(0, self.size)],
                    Key(self.client.rkey),
                    self.client.addr,
                )
                .with_flags(inline),
            )?;
            wcs.clear();
            self.cq.poll(16, &mut wcs);
            for wc in &wcs {
                check(wc)?;
            }
            i += 1;
        }
    }
}

// ---- client --------------------------------------------------------------------------------

/// How the client runs its tests.
#[derive(Clone, Copy, Debug)]
pub struct ClientOpts {
    /// Requests outstanding (bandwidth).
    pub tx_depth: u32,
    /// Receives the server keeps posted (Send bandwidth).
    pub rx_depth: u32,
    /// Path MTU.
    pub mtu: u32,
    /// Blocking or busy-polling waits.
    pub wait: WaitMode,
}

/// The client's end of a session.
pub struct Client {
    ctx: Context,
    s: TcpStream,
    o: ClientOpts,
    local: IpAddr,
    /// What the runs showed.
    pub info: RoceInfo,
}

/// A connected test QP.
struct TestQp {
    qp: Qp,
    cq: Cq,
    server: Msg,
}

impl Client {
    /// Opens a session with the server at `addr`; RoCE on `bind` (default: the local
    /// address of the session's TCP connection) and `roce_port`.
    pub fn connect(
        addr: SocketAddr,
        bind: Option<IpAddr>,
        roce_port: u16,
        o: ClientOpts,
    ) -> Result<Client, PerfError> {
        valid_mtu(o.mtu)?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        s.set_nodelay(true)?;
        let local = match bind {
            Some(ip) => ip,
            None => s.local_addr()?.ip().to_canonical(),
        };
        let ctx = open_ctx(local, roce_port)?;
        let info = RoceInfo {
            pmtu: o.mtu,
            client: ctx.roce_local_addr()?.to_string(),
            ..RoceInfo::default()
        };
        Ok(Client {
            ctx,
            s,
            o,
            local,
            info,
        })
    }

    fn my_msg(&self, kind: Kind) -> Result<Msg, PerfError> {
        let mut m = Msg::new(kind);
        m.port = self.ctx.roce_local_addr()?.port();
        m.gid = self.ctx.roce_gid()?;
        m.mtu = self.o.mtu;
        Ok(m)
    }

    /// Sends the request for `test` (with our QP and `buf`), connects our QP to the
    /// server's.
    fn open(
        &mut self,
        test: Test,
        size: u32,
        qp: Qp,
        cq: Cq,
        buf: Option<&Mr>,
    ) -> Result<TestQp, PerfError> {
        let psn = random_psn();
        let mut m = self.my_msg(Kind::Rdma(test))?;
        m.size = size;
        m.depth = self.o.rx_depth;
        m.qpn = qp.qp_num();
        m.psn = psn;
        if let Some(b) = buf {
            m.addr = b.addr(0);
            m.rkey = b.rkey().0;
            m.len = b.len() as u32;
        }
        send_msg(&mut self.s, &m)?;
        let server = expect_msg(&mut self.s, Kind::Rdma(test))?;
        if server.len < size.max(1) {
            return Err(PerfError::Protocol(
                "the server's buffer is too small".into(),
            ));
        }
        connect_rc(
            &qp,
            server.sock(),
            server.qpn,
            server.psn,
            psn,
            server.mtu,
            RD_ATOMIC,
            RD_ATOMIC,
        )?;
        Ok(TestQp { qp, cq, server })
    }

    /// Ends a test: `End`, and the server's `End` once it tore its side down.
    fn end(&mut self, t: Option<&TestQp>) -> Result<Msg, PerfError> {
        if let Some(t) = t {
            let r = t.qp.counters().ib_requester();
            self.info.packets += r.packets;
            self.info.retransmitted += r.retransmitted;
            self.info.timeouts += r.timeouts;
            self.info.seq_naks += r.seq_naks;
            self.info.rnr_naks += r.rnr_naks;
        }
        send_msg(&mut self.s, &Msg::new(Kind::End))?;
        expect_msg(&mut self.s, Kind::End)
    }

    /// Bandwidth of `test` (Write, Read or Send) with `size`-octet messages.
    pub fn bw(&mut self, test: Test, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        let tx_depth = u64::from(self.o.tx_depth.max(1));
        let cq_mod = (tx_depth / 4).clamp(1, 100);
        let pd = self.ctx.alloc_pd();
        let local = pd.alloc_mr(size as usize, REMOTE)?;
        local.write()[..size as usize].fill(0x5a);
        let cq = self.ctx.create_cq(tx_depth as usize + 16, None);
        let qp = create_rc(&pd, &cq, tx_depth as u32 + 2, 4, REMOTE, self.o.mtu)?;
        let t = self.open(test, size, qp, cq, None)?;
        let rkey = Key(t.server.rkey);
        let raddr = t.server.addr;
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
                let mut batch = Vec::new();
                while posted < total && posted - retired < tx_depth {
                    batch.push(wr(posted, (posted + 1) % cq_mod == 0));
                    posted += 1;
                }
                if !batch.is_empty() {
                    t.qp.post_send_list(batch).map_err(|(_, e)| e)?;
                }
                if posted >= total || deadline.is_some_and(|d| Instant::now() >= d) {
                    stopping = true;
                    // One octet read back: its response follows every earlier message.
                    t.qp.post_send(SendWr::read(SYNC, Some(local.sge(0, 1)), rkey, raddr))?;
                }
            }
            wcs.clear();
            wait_some(&t.cq, self.o.wait, 128, SAFETY, &mut wcs)?;
            let mut done = false;
            for wc in &wcs {
                check(wc)?;
                if wc.wr_id == SYNC {
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
        self.end(Some(&t))?;
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
        let n = size as usize;
        let pd = self.ctx.alloc_pd();
        let local = pd.alloc_mr(n, REMOTE)?;
        local.write()[..n].fill(0x5a);
        let sink = pd.alloc_mr(n, REMOTE)?;
        let cq = self.ctx.create_cq(256, None);
        let qp = create_rc(&pd, &cq, 64, 4, REMOTE, self.o.mtu)?;
        if test == Test::SendLat {
            qp.post_recv(RecvWr::new(1, vec![sink.sge(0, size)]))?;
        }
        let t = self.open(test, size, qp, cq, Some(&sink))?;
        let rkey = Key(t.server.rkey);
        let inline = if size <= INLINE_MAX {
            SendFlags::SIGNALED | SendFlags::INLINE
        } else {
            SendFlags::SIGNALED
        };
        let samples = LatLoop {
            qp: &t.qp,
            cq: &t.cq,
            local: &local,
            sink: &sink,
            rkey,
            raddr: t.server.addr,
            flags: inline,
            wait: self.o.wait,
        }
        .run(test, size, limit, warmup);
        self.end(Some(&t))?;
        samples
    }

    /// Opens the server's raw UDP socket for `kind`; ours, connected to it.
    fn udp_open(&mut self, kind: Kind, size: u32) -> Result<UdpSocket, PerfError> {
        let sock = udp_socket(self.local)?;
        let mut m = Msg::new(kind);
        m.size = size;
        m.mtu = self.o.mtu;
        m.port = sock.local_addr()?.port();
        m.gid = softrdma_wire::rocev2::gid_from_ip(self.local);
        send_msg(&mut self.s, &m)?;
        let r = expect_msg(&mut self.s, kind)?;
        sock.connect(r.sock())?;
        Ok(sock)
    }

    /// Raw UDP bandwidth of `size`-octet messages (see the module documentation).
    pub fn udp_bw(&mut self, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        let sock = self.udp_open(Kind::UdpBw, size)?;
        let r = udp_blast(&sock, size, self.o.mtu, limit);
        let end = self.end(None)?;
        let (msgs, sent, elapsed) = r?;
        if end.count != sent {
            return Err(PerfError::Protocol(format!(
                "raw UDP: the server received {} of {sent} octets",
                end.count
            )));
        }
        Ok(Bw::new(msgs, size, elapsed))
    }

    /// Raw UDP ping-pong: nanoseconds per round trip.
    pub fn udp_lat(&mut self, size: u32, limit: Limit, warmup: u64) -> Result<Vec<u64>, PerfError> {
        let sock = self.udp_open(Kind::UdpLat, size)?;
        let r = udp_ping_pong(&sock, size, self.o.mtu, limit, warmup);
        self.end(None)?;
        r
    }

    /// Ends the session.
    pub fn bye(mut self) -> RoceInfo {
        let _ = send_msg(&mut self.s, &Msg::new(Kind::Bye));
        if let Ok(c) = self.ctx.roce_counters() {
            self.info.tx_datagrams = c.tx_packets;
            self.info.rx_datagrams = c.rx_packets;
            self.info.bad_icrc = c.bad_icrc;
            self.info.tx_errors = c.tx_errors;
        }
        self.info
    }
}

/// The sending side of raw UDP bandwidth: (messages, octets, time to the last
/// acknowledgement).
fn udp_blast(
    sock: &UdpSocket,
    size: u32,
    mtu: u32,
    limit: Limit,
) -> Result<(u64, u64, Duration), PerfError> {
    let chunk = mtu.min(size).max(1) as usize;
    let size = size as usize;
    let window = UDP_WINDOW * chunk as u64;
    let buf = vec![0xa5u8; chunk];
    let total = match limit {
        Limit::Iters(n) => n,
        Limit::Duration(_) => u64::MAX,
    };
    let mut ack = [0u8; 16];
    let (mut msgs, mut sent, mut acked, mut in_msg) = (0u64, 0u64, 0u64, 0usize);
    let mut done_sending = total == 0;
    let mut stalls = 0;
    sock.set_nonblocking(true)?;
    let start = Instant::now();
    let deadline = match limit {
        Limit::Duration(d) => Some(start + d),
        Limit::Iters(_) => None,
    };
    if done_sending {
        sock.send(&[])?;
    }
    loop {
        loop {
            match sock.recv(&mut ack) {
                Ok(8) => {
                    acked = acked.max(u64::from_le_bytes(ack[..8].try_into().unwrap_or_default()))
                }
                Ok(_) => {}
                Err(e) if is_timeout(&e) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if done_sending && acked >= sent {
            break;
        }
        let mut progressed = false;
        let mut burst = 0;
        while !done_sending && sent - acked < window && burst < 32 {
            let n = chunk.min(size - in_msg);
            match sock.send(&buf[..n]) {
                Ok(_) => {}
                Err(e) if is_timeout(&e) => break,
                Err(e) => return Err(e.into()),
            }
            progressed = true;
            burst += 1;
            sent += n as u64;
            in_msg += n;
            if in_msg == size {
                in_msg = 0;
                msgs += 1;
                if msgs >= total
                    || (msgs.is_multiple_of(16) && deadline.is_some_and(|d| Instant::now() >= d))
                {
                    done_sending = true;
                    // Asks for an acknowledgement of everything now.
                    sock.send(&[])?;
                }
            }
        }
        if progressed {
            stalls = 0;
            continue;
        }
        // The window is full or everything is sent: wait for an acknowledgement.
        sock.set_nonblocking(false)?;
        sock.set_read_timeout(Some(UDP_STALL))?;
        let r = sock.recv(&mut ack);
        sock.set_nonblocking(true)?;
        match r {
            Ok(8) => {
                let a = u64::from_le_bytes(ack[..8].try_into().unwrap_or_default());
                if a > acked {
                    acked = a;
                    stalls = 0;
                }
            }
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {
                stalls += 1;
                if stalls >= 4 {
                    return Err(PerfError::Protocol(format!(
                        "raw UDP: acknowledged {acked} of {sent} octets, nothing more for {:?}: datagrams lost",
                        UDP_STALL * 4
                    )));
                }
                // The acknowledgement may be what was lost: ask again.
                sock.send(&[])?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((msgs, sent, start.elapsed()))
}

/// The client side of the raw UDP ping-pong.
fn udp_ping_pong(
    sock: &UdpSocket,
    size: u32,
    mtu: u32,
    limit: Limit,
    warmup: u64,
) -> Result<Vec<u64>, PerfError> {
    let chunk = mtu.min(size).max(1) as usize;
    let n = size.max(1) as usize;
    let out = vec![0x5au8; n];
    let mut inb = vec![0u8; 65536];
    sock.set_read_timeout(Some(UDP_STALL * 4))?;
    let mut samples = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    loop {
        match limit {
            Limit::Iters(k) if i >= k + warmup => break,
            Limit::Duration(d) if i >= warmup && start.elapsed() >= d => break,
            _ => {}
        }
        let t0 = Instant::now();
        for c in out.chunks(chunk) {
            sock.send(c)?;
        }
        let mut got = 0;
        while got < n {
            match sock.recv(&mut inb) {
                Ok(k) => got += k,
                Err(e) if is_timeout(&e) => {
                    return Err(PerfError::Protocol(format!(
                        "raw UDP ping-pong: round trip {i} lost"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let dt = t0.elapsed();
        if i >= warmup {
            samples.push(dt.as_nanos() as u64);
        }
        i += 1;
    }
    Ok(samples)
}

// ---- the runs ------------------------------------------------------------------------------

fn client_opts(args: &PerfArgs) -> Result<ClientOpts, PerfError> {
    Ok(ClientOpts {
        tx_depth: args.tx_depth.clamp(1, 16383),
        rx_depth: args.rx_depth.clamp(1, 1 << 16),
        mtu: valid_mtu(args.mtu.unwrap_or(4096))?,
        wait: args.wait(),
    })
}

fn measure(args: &PerfArgs, c: &mut Client, mode: &'static str) -> Result<Report, PerfError> {
    let mut report = Report {
        transport: "roce",
        mode,
        server: String::new(),
        device: format!("roce {}", c.info.client),
        mpa: None,
        roce: None,
        tx_depth: args.tx_depth,
        completion_wait: if args.busy { "busy" } else { "block" },
        bw: Vec::new(),
        lat: Vec::new(),
    };
    super::measure_into(args, c, &mut report)?;
    Ok(report)
}

impl super::Measure for Client {
    fn bw(&mut self, test: Test, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        Client::bw(self, test, size, limit)
    }
    fn lat(
        &mut self,
        test: Test,
        size: u32,
        limit: Limit,
        warmup: u64,
    ) -> Result<Vec<u64>, PerfError> {
        Client::lat(self, test, size, limit, warmup)
    }
    fn raw_bw(&mut self, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        self.udp_bw(size, limit)
    }
    fn raw_rtt(&mut self, size: u32, limit: Limit, warmup: u64) -> Result<Vec<u64>, PerfError> {
        self.udp_lat(size, limit, warmup)
    }
}

/// Runs the client against the RoCE perf server at `addr`.
pub fn run_client(
    args: &PerfArgs,
    addr: SocketAddr,
    bind: Option<IpAddr>,
    roce_port: u16,
    mode: &'static str,
) -> Result<Report, PerfError> {
    let mut c = Client::connect(addr, bind, roce_port, client_opts(args)?)?;
    let r = measure(args, &mut c, mode);
    let info = c.bye();
    let mut report = r?;
    report.server = addr.to_string();
    report.roce = Some(info);
    Ok(report)
}

/// `--loopback`: the server on a thread (RoCE on 127.0.0.1), the client here (127.0.0.2).
pub fn run_loopback(args: &PerfArgs) -> Result<Report, PerfError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let port = args.roce_port.unwrap_or(0);
    let cfg = ServerCfg {
        bind: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1))),
        roce_port: port,
        wait: args.wait(),
        log: false,
    };
    std::thread::scope(|s| {
        let server = s.spawn(|| serve(&listener, cfg, true));
        let report = run_client(
            args,
            addr,
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
            port,
            "loopback",
        );
        if report.is_err() {
            // A client that failed before its session began leaves the server in accept.
            let _ = TcpStream::connect(addr);
        }
        let r = server.join();
        let report = report?;
        match r {
            Ok(r) => r?,
            Err(_) => return Err(PerfError::Protocol("the server thread panicked".into())),
        }
        Ok(report)
    })
}

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

/// Entry point of `softrdma perf --transport roce`.
pub fn run(args: &PerfArgs) -> Result<(), PerfError> {
    let roce_port = args
        .roce_port
        .unwrap_or(softrdma_wire::rocev2::ROCEV2_UDP_PORT);
    if args.server {
        if args.perftest {
            return Err(PerfError::Usage(
                "over RoCE --perftest is a client of a perftest server: give its HOST".into(),
            ));
        }
        let listener = TcpListener::bind((args.bind.as_str(), args.port))?;
        eprintln!(
            "softrdma perf: serving RoCE tests, session on {} (TCP), RoCE on UDP port {roce_port}",
            listener.local_addr()?
        );
        let cfg = ServerCfg {
            bind: bind_ip(args)?,
            roce_port,
            wait: args.wait(),
            log: true,
        };
        return serve(&listener, cfg, args.once);
    }
    let report = if args.loopback {
        run_loopback(args)?
    } else {
        let host = args.host.as_deref().unwrap_or_default();
        if args.perftest {
            let r = perftest_client(args, host)?;
            print!("{}", r.render());
            return Ok(());
        }
        run_client(
            args,
            resolve(host, args.port)?,
            bind_ip(args)?,
            roce_port,
            "client",
        )?
    };
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    if args.json {
        let _ = serde_json::to_writer_pretty(&mut w, &json(&report));
        let _ = writeln!(w);
    } else {
        let _ = write!(w, "{}", super::render(&report));
    }
    Ok(())
}

/// The report as JSON, with the baseline under `raw_udp`.
pub fn json(r: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_round_trip() {
        let m = Msg {
            kind: Kind::Rdma(Test::SendLat),
            port: 4791,
            size: 65536,
            depth: 512,
            mtu: 4096,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            len: 99,
            addr: 0x7f00_0000_1000,
            count: 7,
            gid: softrdma_wire::rocev2::gid_from_ip("127.0.0.2".parse().unwrap()),
        };
        let b = m.encode();
        assert_eq!(Msg::parse(&b), Some(m));
        assert_eq!(m.sock(), "127.0.0.2:4791".parse().unwrap());
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(Msg::parse(&bad), None);
    }
}
