//! Connection setup for RoCE QPs over a TCP side channel: the exchange `perftest` and the
//! rdma-core pingpongs use (QP number, PSN, GID and limits each way, then INIT → RTR → RTS),
//! shaped as the IB CM's REQ / REP or REJ / RTU so the connection manager API behaves as it
//! will over the real CM: the passive side moves its QP to RTS before it replies, the active
//! side after the reply, and `accept` returns once the RTU arrived.
//!
//! It stands in until the InfiniBand CM on QP1 exists, and only softrdma speaks it. Every
//! octet a peer sends is checked: a bad magic, version, kind or length is an
//! [`Error::Protocol`], private data is capped, every read has a deadline.

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use softrdma_ib::{QpAttr, QpState as IbQpState, QpType};
use softrdma_memory::Access;
use softrdma_wire::rocev2::{gid_from_ip, gid_to_ip};

use super::{RoceQpShared, RoceShared};
use crate::Error;
use crate::connparams::{AcceptParams, ConnectParams, ConnectionDetail, ConnectionInfo};

const MAGIC: &[u8; 4] = b"sRCM";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 42;
/// The IB CM's REP carries 196 octets of private data (IBA 12.6.8); REQ 92. One cap for all.
pub const MAX_PRIVATE_DATA: usize = 196;
/// Path MTUs the exchange accepts (IBA 9.7.3: 256..4096, powers of two).
const PMTUS: [u16; 5] = [256, 512, 1024, 2048, 4096];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Req = 1,
    Rep = 2,
    Rej = 3,
    Rtu = 4,
}

/// One message of the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Msg {
    kind: Kind,
    qpn: u32,
    psn: u32,
    /// The sender's RoCE endpoint (GID and UDP port).
    addr: SocketAddr,
    ird: u16,
    ord: u16,
    pmtu: u16,
    private_data: Vec<u8>,
}

impl Msg {
    fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN + self.private_data.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[VERSION, self.kind as u8, 0, 0]);
        b.extend_from_slice(&(self.qpn & 0xFF_FFFF).to_be_bytes());
        b.extend_from_slice(&(self.psn & 0xFF_FFFF).to_be_bytes());
        b.extend_from_slice(&gid_from_ip(self.addr.ip()));
        b.extend_from_slice(&self.addr.port().to_be_bytes());
        b.extend_from_slice(&self.ird.to_be_bytes());
        b.extend_from_slice(&self.ord.to_be_bytes());
        b.extend_from_slice(&self.pmtu.to_be_bytes());
        b.extend_from_slice(&(self.private_data.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.private_data);
        b
    }

    /// Parses the fixed header; returns the message (without private data) and the private
    /// data length to read next.
    fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(Msg, usize), Error> {
        if &h[0..4] != MAGIC {
            return Err(Error::Protocol("not a softrdma RoCE connection message"));
        }
        if h[4] != VERSION {
            return Err(Error::Protocol("unknown connection message version"));
        }
        let kind = match h[5] {
            1 => Kind::Req,
            2 => Kind::Rep,
            3 => Kind::Rej,
            4 => Kind::Rtu,
            _ => return Err(Error::Protocol("unknown connection message kind")),
        };
        let be32 = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&h[16..32]);
        let pmtu = be16(38);
        if kind != Kind::Rej && kind != Kind::Rtu && !PMTUS.contains(&pmtu) {
            return Err(Error::Protocol("path MTU not one of 256..4096"));
        }
        let len = usize::from(be16(40));
        if len > MAX_PRIVATE_DATA {
            return Err(Error::Protocol("private data longer than 196 octets"));
        }
        let msg = Msg {
            kind,
            qpn: be32(8) & 0xFF_FFFF,
            psn: be32(12) & 0xFF_FFFF,
            addr: SocketAddr::new(gid_to_ip(&gid), be16(32)),
            ird: be16(34),
            ord: be16(36),
            pmtu,
            private_data: Vec::new(),
        };
        Ok((msg, len))
    }
}

fn send(stream: &mut TcpStream, m: &Msg, deadline: Instant) -> Result<(), Error> {
    stream.set_write_timeout(Some(remaining(deadline)?))?;
    stream.write_all(&m.emit())?;
    Ok(())
}

fn recv(stream: &mut TcpStream, deadline: Instant) -> Result<Msg, Error> {
    let mut h = [0u8; HEADER_LEN];
    read_exact(stream, &mut h, deadline)?;
    let (mut m, len) = Msg::parse_header(&h)?;
    m.private_data = vec![0u8; len];
    read_exact(stream, &mut m.private_data, deadline)?;
    Ok(m)
}

fn read_exact(stream: &mut TcpStream, mut buf: &mut [u8], deadline: Instant) -> Result<(), Error> {
    while !buf.is_empty() {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(buf) {
            Ok(0) => return Err(Error::Protocol("the peer closed the connection exchange")),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Timeout);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Result<Duration, Error> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(Error::Timeout)
    } else {
        Ok(d)
    }
}

/// A random 24-bit starting PSN (IBA 9.7.1 recommends an unpredictable one).
fn initial_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() as u32) & 0xFF_FFFF
}

fn clamp_u8(v: u16) -> u8 {
    v.min(u16::from(u8::MAX)) as u8
}

/// What both sides agreed, applied to the QP: INIT → RTR → RTS (as librdmacm drives it).
struct Agreed {
    peer: SocketAddr,
    peer_qpn: u32,
    peer_psn: u32,
    my_psn: u32,
    pmtu: u32,
    ird: u16,
    ord: u16,
}

fn bring_up(drv: &RoceShared, q: &RoceQpShared, a: &Agreed) -> Result<(), Error> {
    let rc = q.qp_type() == QpType::Rc;
    drv.set_remote(q, a.peer);
    drv.modify(
        q,
        &QpAttr {
            state: Some(IbQpState::Init),
            access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC),
            ..QpAttr::default()
        },
    )?;
    drv.modify(
        q,
        &QpAttr {
            state: Some(IbQpState::Rtr),
            pmtu: Some(a.pmtu),
            dest_qp: Some(a.peer_qpn),
            rq_psn: Some(a.peer_psn),
            max_dest_rd_atomic: rc.then_some(clamp_u8(a.ird)),
            min_rnr_timer: rc.then_some(12),
            ..QpAttr::default()
        },
    )?;
    drv.modify(
        q,
        &QpAttr {
            state: Some(IbQpState::Rts),
            sq_psn: Some(a.my_psn),
            timeout: rc.then_some(14),
            retry_cnt: rc.then_some(7),
            rnr_retry: rc.then_some(7),
            max_rd_atomic: rc.then_some(clamp_u8(a.ord)),
            ..QpAttr::default()
        },
    )?;
    Ok(())
}

fn check_qp(q: &RoceQpShared) -> Result<(), Error> {
    match q.qp_type() {
        QpType::Ud => Err(Error::Unsupported(
            "connection management of UD QPs (SIDR) on RoCE",
        )),
        _ if !matches!(q.state(), IbQpState::Reset | IbQpState::Init) => {
            Err(Error::InvalidState(crate::state::QpState::from(q.state())))
        }
        _ => Ok(()),
    }
}

fn check_private_data(p: &[u8]) -> Result<(), Error> {
    if p.len() > MAX_PRIVATE_DATA {
        return Err(Error::InvalidArgument(
            "RoCE private data is at most 196 octets",
        ));
    }
    Ok(())
}

fn check_pmtu(pmtu: u32) -> Result<u16, Error> {
    PMTUS
        .iter()
        .copied()
        .find(|&p| u32::from(p) == pmtu)
        .ok_or(Error::InvalidArgument(
            "RoCE path MTU must be 256, 512, 1024, 2048 or 4096",
        ))
}

fn info(drv: &RoceShared, a: &Agreed, private_data: Vec<u8>) -> ConnectionInfo {
    ConnectionInfo {
        local_addr: drv.local,
        peer_addr: a.peer,
        peer_private_data: private_data,
        ird: a.ird,
        ord: a.ord,
        detail: ConnectionDetail::Roce {
            remote_qpn: a.peer_qpn,
            pmtu: a.pmtu,
        },
    }
}

/// Active side (`rdma_connect`): REQ, then REP (QP to RTS, RTU) or REJ.
pub(crate) fn connect(
    drv: &RoceShared,
    q: &RoceQpShared,
    addr: impl ToSocketAddrs,
    params: &ConnectParams,
) -> Result<ConnectionInfo, Error> {
    check_qp(q)?;
    check_private_data(&params.private_data)?;
    let pmtu = check_pmtu(params.roce_pmtu)?;
    let deadline = Instant::now() + params.timeout;
    let mut stream = crate::net::connect(addr, remaining(deadline)?)?;
    stream.set_nodelay(true)?;
    let my_psn = initial_psn();
    let req = Msg {
        kind: Kind::Req,
        qpn: q.qpn(),
        psn: my_psn,
        addr: drv.local,
        ird: params.ird,
        ord: params.ord,
        pmtu,
        private_data: params.private_data.clone(),
    };
    send(&mut stream, &req, deadline)?;
    let rep = recv(&mut stream, deadline)?;
    match rep.kind {
        Kind::Rep => {}
        Kind::Rej => {
            return Err(Error::Rejected {
                private_data: rep.private_data,
            });
        }
        _ => {
            return Err(Error::Protocol(
                "expected a reply to the connection request",
            ));
        }
    }
    let a = Agreed {
        peer: rep.addr,
        peer_qpn: rep.qpn,
        peer_psn: rep.psn,
        my_psn,
        pmtu: u32::from(pmtu.min(rep.pmtu)),
        // Serve what we offered; keep outstanding no more than the peer serves.
        ird: params.ird,
        ord: params.ord.min(rep.ird),
    };
    bring_up(drv, q, &a)?;
    let rtu = Msg {
        kind: Kind::Rtu,
        private_data: Vec::new(),
        ..req
    };
    send(&mut stream, &rtu, deadline)?;
    Ok(info(drv, &a, rep.private_data))
}

/// A TCP listener for RoCE connection requests.
pub(crate) struct RoceListener {
    listener: TcpListener,
    pub(crate) local_addr: SocketAddr,
    /// Bound on reading a request once a TCP connection was accepted.
    request_timeout: Duration,
}

impl RoceListener {
    pub(crate) fn bind(
        addr: impl ToSocketAddrs,
        backlog: u32,
        request_timeout: Duration,
    ) -> Result<RoceListener, Error> {
        let listener = crate::net::listen(addr, backlog)?;
        let local_addr = listener.local_addr()?;
        Ok(RoceListener {
            listener,
            local_addr,
            request_timeout,
        })
    }

    /// The next connection request; `None` deadline: wait forever. A connection whose
    /// request is malformed or late is closed and the wait goes on.
    pub(crate) fn accept(&self, deadline: Option<Instant>) -> Result<RoceRequest, Error> {
        loop {
            let wait = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let ms = remaining(d)?.as_millis().clamp(1, i32::MAX as u128);
                    PollTimeout::try_from(ms as i32).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, wait) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
            let (mut stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            let _ = stream.set_nodelay(true);
            let until = Instant::now() + self.request_timeout;
            match recv(&mut stream, until) {
                Ok(req) if req.kind == Kind::Req => {
                    return Ok(RoceRequest {
                        stream: Some(stream),
                        req,
                        tcp_peer: peer,
                        local_addr: self.local_addr,
                    });
                }
                // Not a request, or nothing in time: this connection is dropped.
                _ => continue,
            }
        }
    }
}

/// A connection request received by a [`RoceListener`].
pub(crate) struct RoceRequest {
    stream: Option<TcpStream>,
    req: Msg,
    tcp_peer: SocketAddr,
    local_addr: SocketAddr,
}

impl RoceRequest {
    pub(crate) fn peer_addr(&self) -> SocketAddr {
        self.tcp_peer
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub(crate) fn private_data(&self) -> &[u8] {
        &self.req.private_data
    }

    pub(crate) fn peer_ird_ord(&self) -> (u16, u16) {
        (self.req.ird, self.req.ord)
    }

    /// Passive side (`rdma_accept`): QP to RTS, REP, then wait for the RTU.
    pub(crate) fn accept(
        &mut self,
        drv: &RoceShared,
        q: &RoceQpShared,
        params: &AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        check_qp(q)?;
        check_private_data(&params.private_data)?;
        let pmtu = check_pmtu(params.roce_pmtu)?;
        let Some(mut stream) = self.stream.take() else {
            return Err(Error::InvalidArgument("request already answered"));
        };
        let deadline = Instant::now() + params.timeout;
        let my_psn = initial_psn();
        let a = Agreed {
            peer: self.req.addr,
            peer_qpn: self.req.qpn,
            peer_psn: self.req.psn,
            my_psn,
            pmtu: u32::from(pmtu.min(self.req.pmtu)),
            ird: params.ird,
            ord: params.ord.min(self.req.ird),
        };
        bring_up(drv, q, &a)?;
        let rep = Msg {
            kind: Kind::Rep,
            qpn: q.qpn(),
            psn: my_psn,
            addr: drv.local,
            ird: params.ird,
            ord: a.ord,
            pmtu,
            private_data: params.private_data.clone(),
        };
        let r = send(&mut stream, &rep, deadline).and_then(|()| recv(&mut stream, deadline));
        match r {
            Ok(m) if m.kind == Kind::Rtu => Ok(info(drv, &a, self.req.private_data.clone())),
            other => {
                // No RTU: the connection never became established (IBA 12.9.x: the
                // passive side times out and the QP leaves RTS).
                let _ = drv.modify(q, &QpAttr::state(IbQpState::Error));
                Err(match other {
                    Ok(_) => Error::Protocol("expected the ready-to-use message"),
                    Err(e) => e,
                })
            }
        }
    }

    /// `rdma_reject`: a REJ with `private_data`.
    pub(crate) fn reject(&mut self, private_data: &[u8]) -> Result<(), Error> {
        check_private_data(private_data)?;
        let Some(mut stream) = self.stream.take() else {
            return Ok(());
        };
        let rej = Msg {
            kind: Kind::Rej,
            qpn: 0,
            psn: 0,
            addr: SocketAddr::new(IpAddr::from([0u8; 16]), 0),
            ird: 0,
            ord: 0,
            pmtu: 0,
            private_data: private_data.to_vec(),
        };
        send(&mut stream, &rej, Instant::now() + Duration::from_secs(1))
    }
}

impl Drop for RoceRequest {
    fn drop(&mut self) {
        let _ = self.reject(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Msg {
        Msg {
            kind: Kind::Rep,
            qpn: 0x12_3456,
            psn: 0xAB_CDEF,
            addr: "127.0.0.2:4791".parse().unwrap(),
            ird: 16,
            ord: 8,
            pmtu: 4096,
            private_data: b"hello".to_vec(),
        }
    }

    #[test]
    fn message_round_trips() {
        let m = sample();
        let b = m.emit();
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&b[..HEADER_LEN]);
        let (mut p, len) = Msg::parse_header(&h).unwrap();
        p.private_data = b[HEADER_LEN..HEADER_LEN + len].to_vec();
        assert_eq!(p, m);
    }

    #[test]
    fn hostile_headers_are_typed_errors() {
        let good = sample().emit();
        let mut h = [0u8; HEADER_LEN];
        for (at, v, why) in [
            (0, b'x', "magic"),
            (4, 2, "version"),
            (5, 9, "kind"),
            (38, 0x7F, "pmtu"),
            (40, 0xFF, "private data length"),
        ] {
            h.copy_from_slice(&good[..HEADER_LEN]);
            h[at] = v;
            assert!(
                matches!(Msg::parse_header(&h), Err(Error::Protocol(_))),
                "{why}"
            );
        }
        // Every byte value in every position: an error or a message, never a panic.
        for at in 0..HEADER_LEN {
            for v in 0..=255u8 {
                h.copy_from_slice(&good[..HEADER_LEN]);
                h[at] = v;
                if let Ok((_, len)) = Msg::parse_header(&h) {
                    assert!(len <= MAX_PRIVATE_DATA);
                }
            }
        }
    }
}
