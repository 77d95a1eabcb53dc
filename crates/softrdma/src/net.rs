//! The TCP sockets both connection managers open: the first address that connects, or the
//! first that binds and listens; and the vectored write of the iWARP data path.

use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

use smallvec::SmallVec;

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

/// Writes `iov` to the connected stream socket `s` with one `sendmsg` and `MSG_NOSIGNAL`: a
/// peer that reset the connection is an `EPIPE` error, not a `SIGPIPE` that ends a process
/// which did not ignore it (`writev`, the default vectored write, has no such flag).
pub(crate) fn send_vectored(s: &impl AsFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    socket2::SockRef::from(s).send_vectored_with_flags(iov, nix::libc::MSG_NOSIGNAL)
}

/// The first `n` octets of `iov` (all of it if shorter).
pub(crate) fn iov_prefix<'a>(iov: &'a [IoSlice<'_>], mut n: usize) -> SmallVec<[IoSlice<'a>; 8]> {
    let mut taken = SmallVec::new();
    for s in iov {
        if n == 0 {
            break;
        }
        let k = s.len().min(n);
        taken.push(IoSlice::new(&s[..k]));
        n -= k;
    }
    taken
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};

    /// `SIGPIPE` pending on this thread (`/proc/thread-self/status`, `SigPnd`).
    fn sigpipe_pending() -> bool {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigPnd:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        mask & (1 << (Signal::SIGPIPE as i32 - 1)) != 0
    }

    #[test]
    fn a_write_to_a_reset_connection_fails_without_sigpipe() {
        // Blocked here, a SIGPIPE the write raised stays pending where it can be seen.
        let mut pipe = SigSet::empty();
        pipe.add(Signal::SIGPIPE);
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&pipe), None).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        // Linger 0: the close resets the connection.
        socket2::SockRef::from(&peer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(peer);
        let data = [7u8; 100];
        let iov = [IoSlice::new(&data[..60]), IoSlice::new(&data[60..])];
        let mut epipe = false;
        for _ in 0..10 {
            match send_vectored(&ours, &iov) {
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => {
                    epipe = true;
                    break;
                }
                _ => {}
            }
        }
        assert!(epipe, "the reset connection refuses writes with EPIPE");
        assert!(!sigpipe_pending(), "no SIGPIPE raised");
    }
}
