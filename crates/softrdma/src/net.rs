//! The TCP sockets both connection managers open: the first address that connects, or the
//! first that binds and listens; and the vectored write of the iWARP data path.

use std::io::{self, IoSlice};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::Duration;

use crate::Error;

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
