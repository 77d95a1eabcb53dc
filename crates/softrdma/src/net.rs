//! The TCP sockets both connection managers open: the first address that connects, or the
//! first that binds and listens.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use crate::Error;

/// The first of `run` consecutive ports, other than RoCEv2's 4791, that TCP and UDP both
/// have free on each of `addrs` now: for servers and RoCE contexts started later, perhaps in
/// other processes. Drawn at random below the kernel's ephemeral range, so a socket bound
/// to port 0 meanwhile (the kernel's choice) cannot take it, and two choosers rarely meet.
pub fn spare_ports(addrs: &[IpAddr], run: u16) -> Result<u16, Error> {
    use std::hash::{BuildHasher, Hasher};
    if addrs.is_empty() || run == 0 {
        return Err(Error::InvalidArgument("no address or no port asked for"));
    }
    let below = ephemeral_low().max(2048);
    let span = u64::from(below.saturating_sub(1024 + run)).max(1);
    let mut random = std::hash::RandomState::new().build_hasher();
    for attempt in 0..256u16 {
        random.write_u16(attempt);
        let first = 1024 + (random.finish() % span) as u16;
        let ports = first..first + run;
        if ports.contains(&softrdma_wire::rocev2::ROCEV2_UDP_PORT) {
            continue;
        }
        let free = ports.clone().all(|p| {
            addrs.iter().all(|&a| {
                let at = SocketAddr::new(a, p);
                TcpListener::bind(at).is_ok() && UdpSocket::bind(at).is_ok()
            })
        });
        if free {
            return Ok(first);
        }
    }
    Err(Error::Io(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no port free on every address",
    )))
}

/// The lowest port the kernel hands out to sockets bound to port 0
/// (`net.ipv4.ip_local_port_range`, 32768 unless changed).
pub(crate) fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Connects to the first address `addr` resolves to that accepts within `timeout` each.
pub(crate) fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpStream, Error> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => e.into(),
        None => Error::InvalidArgument("address resolved to nothing"),
    })
}

/// Binds (`SO_REUSEADDR`) and listens on the first address `addr` resolves to that allows it.
pub(crate) fn listen(addr: impl ToSocketAddrs, backlog: u32) -> Result<TcpListener, Error> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(a),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        sock.set_reuse_address(true)?;
        match sock
            .bind(&a.into())
            .and_then(|()| sock.listen(backlog.min(i32::MAX as u32) as i32))
        {
            Ok(()) => return Ok(sock.into()),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => e.into(),
        None => Error::InvalidArgument("address resolved to nothing"),
    })
}
