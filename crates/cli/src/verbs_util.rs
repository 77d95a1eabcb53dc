//! Helpers the verbs tools share: the `--transport` choice and the addresses a RoCE device
//! is opened on, completion waits with a safety-net timeout, blocking on the CQ or
//! busy-polling it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use softrdma::roce::{QpAttr, QpState};
use softrdma::{Cq, Device, Error, Qp, QpType, WorkCompletion};

/// Which transport a tool runs over (`--transport`): the device it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// iWARP over TCP.
    Iwarp,
    /// RoCEv2 (InfiniBand transport over UDP).
    Roce,
}

/// The address a RoCE device listens on when none is given: the first local address that
/// is neither loopback nor link-local (IPv4 first), else 127.0.0.1.
pub fn default_roce_ip() -> IpAddr {
    let ips: Vec<IpAddr> = Device::list()
        .iter()
        .filter_map(|d| d.roce_config().map(|c| c.addr))
        .filter(|ip| !ip.is_loopback())
        .collect();
    ips.iter()
        .find(|ip| ip.is_ipv4())
        .or(ips.first())
        .copied()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The local address the kernel routes from towards `peer` (nothing is sent).
pub fn local_ip_toward(peer: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any)?;
    s.connect(peer)?;
    Ok(s.local_addr()?.ip().to_canonical())
}

/// How a tool waits for completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Block on the CQ until a completion arrives (the thread sleeps).
    Block,
    /// Spin on `poll`, yielding the CPU between polls (what perftest does by default).
    Busy,
}

/// Moves at least one and at most `max` completions to `out`, waiting at most `timeout`
/// (a safety net: [`Error::Timeout`] when nothing arrived).
pub fn wait_some(
    cq: &Cq,
    mode: WaitMode,
    max: usize,
    timeout: Duration,
    out: &mut Vec<WorkCompletion>,
) -> Result<usize, Error> {
    match mode {
        WaitMode::Block => cq.wait(1, max, timeout, out),
        WaitMode::Busy => {
            let n = cq.poll(max, out);
            if n > 0 {
                return Ok(n);
            }
            let deadline = Instant::now() + timeout;
            let mut spins = 0u32;
            loop {
                let n = cq.poll(max, out);
                if n > 0 {
                    return Ok(n);
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout);
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// Spins (yielding) until `cond` holds or `timeout` passes; `false` on timeout.
pub fn spin_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        if cond() {
            return true;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(16) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// What an out-of-band exchange (perftest's, the rdma-core pingpongs') gave for a connected
/// RoCE QP: the peer and what both sides agreed.
#[derive(Clone, Copy, Debug)]
pub struct OobPath {
    /// The peer's RoCE endpoint (its GID's address and UDP port).
    pub peer: SocketAddr,
    /// The peer's QP number.
    pub dest_qp: u32,
    /// The peer's first PSN (our receive PSN).
    pub rq_psn: u32,
    /// Our first PSN.
    pub sq_psn: u32,
    /// Path MTU.
    pub pmtu: u32,
    /// RC: READs and atomics we serve at a time.
    pub max_dest_rd_atomic: u8,
    /// RC: READs and atomics we keep outstanding.
    pub max_rd_atomic: u8,
}

/// Brings a RoCE RC or UC QP in INIT to RTR and RTS facing `p`, with the attributes
/// perftest's `ctx_connect` and the rdma-core pingpongs set (RC: `min_rnr_timer` 12,
/// `timeout` 14, `retry_cnt` 7, `rnr_retry` 7). A refusal says which step failed.
pub fn rtr_rts(qp: &Qp, p: &OobPath) -> Result<(), (QpState, Error)> {
    let rc = qp.qp_type() == QpType::Rc;
    qp.set_remote(p.peer).map_err(|e| (QpState::Rtr, e))?;
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: Some(p.pmtu),
        dest_qp: Some(p.dest_qp & 0xFF_FFFF),
        rq_psn: Some(p.rq_psn & 0xFF_FFFF),
        max_dest_rd_atomic: rc.then_some(p.max_dest_rd_atomic),
        min_rnr_timer: rc.then_some(12),
        ..QpAttr::default()
    })
    .map_err(|e| (QpState::Rtr, e))?;
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(p.sq_psn & 0xFF_FFFF),
        timeout: rc.then_some(14),
        retry_cnt: rc.then_some(7),
        rnr_retry: rc.then_some(7),
        max_rd_atomic: rc.then_some(p.max_rd_atomic),
        ..QpAttr::default()
    })
    .map_err(|e| (QpState::Rts, e))
}
