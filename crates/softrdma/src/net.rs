//! The TCP sockets both connection managers open: the first address that connects, or the
//! first that binds and listens.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
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
