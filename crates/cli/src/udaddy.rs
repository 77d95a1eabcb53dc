//! `softrdma udaddy`: a peer of librdmacm's `udaddy` over RoCEv2: UD QPs found through the
//! CM's service ID resolution (SIDR), in port space RDMA_PS_UDP, port 7174.
//!
//! As udaddy: the client (`-s server`) resolves the server's UD QP and Q_Key with a SIDR_REQ,
//! sends `-C` messages of `-S` octets (Send with Immediate, the immediate its QPN) and waits
//! for as many back; the server accepts (SIDR_REP with its QPN and Q_Key), receives the
//! messages, answers each sender at the QPN of the immediate, and sends as many back. Unlike
//! udaddy, which sends whatever its buffer holds, ours send a pattern and check what a
//! softrdma peer sends; from any peer the length and the immediate (the sender's QPN, the
//! one SIDR gave) are checked.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use softrdma::roce::{QpAttr, QpState};
use softrdma::roce::{RDMA_UDP_QKEY, RoceConfig};
use softrdma::{
    AcceptParams, Access, ConnectParams, Context, Device, Listener, Mr, Pd, Qp, QpInitAttr, QpType,
    RecvWr, SendFlags, SendWr, UdDest, WcOpcode, WcStatus,
};

use crate::verbs_util::{WaitMode, default_roce_ip, local_ip_toward, wait_some};

/// The GRH a UD receive starts with.
const GRH: usize = 40;

/// `softrdma udaddy` arguments (udaddy's letters).
#[derive(clap::Args, Debug, Clone)]
pub struct UdaddyArgs {
    /// Client: the server's address.
    #[arg(short = 's')]
    pub server: Option<String>,
    /// The address to bind (server: to listen on; client: our RoCE address).
    #[arg(short = 'b')]
    pub bind: Option<IpAddr>,
    /// Messages each way.
    #[arg(short = 'C', default_value_t = 10)]
    pub count: u32,
    /// Message size (at most the path MTU, 1024 by default).
    #[arg(short = 'S', default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub size: u32,
    /// The port (udaddy's is fixed: 7174).
    #[arg(long, default_value_t = 7174)]
    pub port: u16,
    /// Our RoCE UDP port (4791; another only for peers on one host).
    #[arg(long, default_value_t = 4791)]
    pub roce_port: u16,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Check the messages' contents too (the peer is softrdma, which sends a pattern).
    #[arg(short = 'V', long)]
    pub verify: bool,
}

/// The byte `i` of message `n` from the sender of QPN `qpn`.
fn pattern(qpn: u32, n: u32, i: usize) -> u8 {
    (qpn as u8) ^ (n as u8).wrapping_mul(7) ^ (i as u8).wrapping_mul(31)
}

struct Node {
    pd: Pd,
    /// Send and receive completions apart: a peer's first messages may complete before
    /// this side has taken all of its own send completions.
    send_cq: softrdma::Cq,
    recv_cq: softrdma::Cq,
    qp: Qp,
    mr: Mr,
    size: usize,
    count: u32,
}

impl Node {
    fn new(ctx: &Context, size: usize, count: u32) -> Result<Node, String> {
        let pd = ctx.alloc_pd();
        let cq = || {
            ctx.create_cq(count as usize + 1, None)
                .map_err(|e| format!("create_cq: {e}"))
        };
        let (send_cq, recv_cq) = (cq()?, cq()?);
        let qp = pd
            .create_qp(QpInitAttr::typed(QpType::Ud, &send_cq, &recv_cq))
            .map_err(|e| format!("create_qp: {e}"))?;
        // librdmacm brings UD QPs to RTS with RDMA_UDP_QKEY when it creates them, before
        // receives are posted.
        for attr in [
            QpAttr {
                state: Some(QpState::Init),
                qkey: Some(RDMA_UDP_QKEY),
                ..QpAttr::default()
            },
            QpAttr::state(QpState::Rtr),
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                ..QpAttr::default()
            },
        ] {
            qp.modify(&attr).map_err(|e| format!("modify_qp: {e}"))?;
        }
        // One slot per message each way: receives (GRH + message) then sends.
        let slot = GRH + size;
        let mr = pd
            .alloc_mr(2 * count as usize * slot, Access::LOCAL_WRITE)
            .map_err(|e| format!("reg_mr: {e}"))?;
        let n = Node {
            pd,
            send_cq,
            recv_cq,
            qp,
            mr,
            size,
            count,
        };
        for i in 0..count {
            let sge = n.mr.sge(i as usize * slot, slot as u32);
            n.qp.post_recv(RecvWr::new(u64::from(i), vec![sge]))
                .map_err(|e| format!("post_recv: {e}"))?;
        }
        Ok(n)
    }

    fn send_all(&self, to: SocketAddr, remote_qpn: u32, remote_qkey: u32) -> Result<(), String> {
        self.post_all(to, remote_qpn, remote_qkey)?;
        self.reap_sends()
    }

    /// Posts the `count` messages.
    fn post_all(&self, to: SocketAddr, remote_qpn: u32, remote_qkey: u32) -> Result<(), String> {
        let ah = self
            .pd
            .create_ah_port(to)
            .map_err(|e| format!("create_ah: {e}"))?;
        let slot = GRH + self.size;
        let me = self.qp.qp_num();
        for n in 0..self.count {
            let off = (self.count + n) as usize * slot;
            let msg: Vec<u8> = (0..self.size).map(|i| pattern(me, n, i)).collect();
            self.mr.copy_in(off, &msg).map_err(|e| e.to_string())?;
            let wr = SendWr::send_with_imm(
                1000 + u64::from(n),
                vec![self.mr.sge(off, self.size as u32)],
                me,
            )
            .to(UdDest {
                ah: ah.id(),
                remote_qpn,
                remote_qkey,
            })
            .with_flags(SendFlags::SIGNALED);
            self.qp
                .post_send(wr)
                .map_err(|e| format!("post_send: {e}"))?;
        }
        Ok(())
    }

    /// Waits for the completions of the `count` messages posted.
    fn reap_sends(&self) -> Result<(), String> {
        let mut sent = 0;
        let mut wcs = Vec::new();
        while sent < self.count {
            wcs.clear();
            wait_some(
                &self.send_cq,
                WaitMode::Block,
                16,
                Duration::from_secs(10),
                &mut wcs,
            )
            .map_err(|e| format!("waiting for send completions: {e}"))?;
            for wc in &wcs {
                if wc.status != WcStatus::Success {
                    return Err(format!("send completed {:?}", wc.status));
                }
                sent += 1;
            }
        }
        Ok(())
    }

    /// Waits for `count` messages: each `size` octets with the immediate `from_qpn` (if
    /// known); the pattern is checked when `check` (a softrdma peer). Returns the first
    /// sender's QPN (the immediate).
    fn receive_all(
        &self,
        from_qpn: Option<u32>,
        check: bool,
        timeout: Duration,
    ) -> Result<u32, String> {
        let slot = GRH + self.size;
        let mut got = 0;
        let mut first = from_qpn;
        let mut wcs = Vec::new();
        while got < self.count {
            wcs.clear();
            wait_some(&self.recv_cq, WaitMode::Block, 16, timeout, &mut wcs)
                .map_err(|e| format!("received {got} of {} messages: {e}", self.count))?;
            for wc in &wcs {
                if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                    return Err(format!(
                        "unexpected completion {:?} {:?}",
                        wc.opcode, wc.status
                    ));
                }
                if wc.byte_len as usize != GRH + self.size {
                    return Err(format!(
                        "a message of {} octets, not {}",
                        wc.byte_len as usize - GRH,
                        self.size
                    ));
                }
                let imm = wc.imm.ok_or("a message without the immediate")?;
                let want = *first.get_or_insert(imm);
                if imm != want {
                    return Err(format!("immediate {imm:#x}, not the peer's QPN {want:#x}"));
                }
                // A receive queue is worked in the order it was posted: message n lands in slot n.
                if wc.wr_id != u64::from(got) {
                    return Err(format!("message {got} completed receive {}", wc.wr_id));
                }
                if check {
                    let mut b = vec![0u8; self.size];
                    self.mr
                        .copy_out(wc.wr_id as usize * slot + GRH, &mut b)
                        .map_err(|e| e.to_string())?;
                    if let Some(i) = (0..self.size).find(|&i| b[i] != pattern(imm, got, i)) {
                        return Err(format!("message {got}: octet {i} wrong"));
                    }
                }
                got += 1;
            }
        }
        first.ok_or_else(|| "no message".to_string())
    }
}

fn open(ip: IpAddr, roce_port: u16) -> Result<Context, String> {
    let mut cfg = RoceConfig::new(ip);
    cfg.port = roce_port;
    let dev = Device::roce(cfg);
    dev.open().map_err(|e| format!("{}: {e}", dev.name()))
}

fn server(a: &UdaddyArgs) -> Result<(), String> {
    println!("udaddy: starting server");
    let ip = a.bind.unwrap_or_else(default_roce_ip);
    let ctx = open(ip, a.roce_port)?;
    let listener = Listener::bind(&ctx, (ip, a.port))
        .map_err(|e| format!("rdma_listen on {ip} port {}: {e}", a.port))?;
    println!("udaddy: listening on {}", listener.local_addr());
    let timeout = Duration::from_secs(a.timeout);
    let req = listener
        .accept_timeout(timeout)
        .map_err(|e| format!("waiting for a request: {e}"))?;
    let peer = req.peer_addr();
    let node = Node::new(&ctx, a.size as usize, a.count)?;
    req.accept(&node.qp, AcceptParams::default())
        .map_err(|e| format!("rdma_accept: {e}"))?;
    println!("udaddy: accepted {peer}");
    println!("receiving data transfers");
    // A softrdma peer's messages carry the pattern of its QPN; Linux's carry whatever.
    let qpn = node.receive_all(None, a.verify, timeout)?;
    println!("sending replies");
    let to = SocketAddr::new(
        peer.ip(),
        ctx.roce_local_addr().map_err(|e| e.to_string())?.port(),
    );
    node.send_all(to, qpn, RDMA_UDP_QKEY)?;
    println!("data transfers complete");
    Ok(())
}

fn client(a: &UdaddyArgs, host: &str) -> Result<(), String> {
    println!("udaddy: starting client");
    let dst = (host, a.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut i| i.next())
        .ok_or_else(|| format!("cannot resolve {host}"))?;
    let ip = match a.bind {
        Some(ip) => ip,
        None => local_ip_toward(dst).map_err(|e| e.to_string())?,
    };
    let ctx = open(ip, a.roce_port)?;
    let node = Node::new(&ctx, a.size as usize, a.count)?;
    println!("udaddy: connecting");
    let info = node
        .qp
        .connect(
            dst,
            ConnectParams {
                timeout: Duration::from_secs(a.timeout),
                ..ConnectParams::default()
            },
        )
        .map_err(|e| format!("udaddy: event: RDMA_CM_EVENT_REJECTED or UNREACHABLE: {e}"))?;
    let softrdma::ConnectionDetail::Roce {
        remote_qpn,
        remote_qkey,
        ..
    } = info.detail
    else {
        return Err("not a RoCE connection".into());
    };
    println!("udaddy: resolved QPN {remote_qpn:#x} Q_Key {remote_qkey:#x}");
    println!("initiating data transfers");
    let to = SocketAddr::new(dst.ip(), a.roce_port);
    node.send_all(to, remote_qpn, remote_qkey)?;
    println!("receiving data transfers");
    node.receive_all(Some(remote_qpn), a.verify, Duration::from_secs(a.timeout))?;
    println!("data transfers complete");
    Ok(())
}

/// Runs `softrdma udaddy`; the exit status.
pub fn run(a: &UdaddyArgs) -> i32 {
    let r = match &a.server {
        Some(h) => client(a, h),
        None => server(a),
    };
    println!("test complete");
    match r {
        Ok(()) => {
            println!("return status 0");
            0
        }
        Err(e) => {
            eprintln!("udaddy: {e}");
            println!("return status 1");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer's answers arrive before this side has taken its own send completions (a
    /// thread descheduled between its waits): each kind is still counted as what it is.
    #[test]
    fn answers_that_complete_before_the_sends_are_reaped_are_received() {
        let ips = [1, 2].map(|l| IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, l)));
        let ctxs = Device::open_sharing_a_port(&ips.map(RoceConfig::new)).unwrap();
        let (a, b) = (&ctxs[0], &ctxs[1]);
        let port = a.roce_local_addr().unwrap().port();
        let (count, size) = (20, 1000);
        let client = Node::new(a, size, count).unwrap();
        let server = Node::new(b, size, count).unwrap();
        let (c_qpn, s_qpn) = (client.qp.qp_num(), server.qp.qp_num());
        client
            .post_all(SocketAddr::new(ips[1], port), s_qpn, RDMA_UDP_QKEY)
            .unwrap();
        assert_eq!(
            server.receive_all(None, true, Duration::from_secs(10)),
            Ok(c_qpn)
        );
        server
            .send_all(SocketAddr::new(ips[0], port), c_qpn, RDMA_UDP_QKEY)
            .unwrap();
        // Every answer has completed on the client before it looks at its sends.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while client.recv_cq.len() < count as usize {
            assert!(std::time::Instant::now() < deadline, "answers missing");
            let mut none = Vec::new();
            client.recv_cq.poll(0, &mut none);
            std::thread::yield_now();
        }
        client.reap_sends().unwrap();
        assert_eq!(
            client.receive_all(Some(s_qpn), true, Duration::from_secs(10)),
            Ok(s_qpn)
        );
    }
}
