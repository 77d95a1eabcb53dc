//! A packet tap: what a context's transport sends and receives, handed to the application
//! as it passes the socket (what `tcpdump` would see, without its privileges).
//!
//! The library only reports; writing a capture file is the application's business
//! (`softrdma --pcap` writes pcap). A tap costs one atomic load per socket call when unset.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

/// Which way octets went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Written by this context.
    Sent,
    /// Read by this context.
    Received,
}

/// One thing the tap saw. `local`/`peer` are the connection's or datagram's addresses.
#[derive(Debug)]
pub enum Tapped<'a> {
    /// A TCP connection of an iWARP QP opened (`active`: this side connected).
    TcpOpen {
        /// This end.
        local: SocketAddr,
        /// The other end.
        peer: SocketAddr,
        /// This side connected (else it accepted).
        active: bool,
    },
    /// Stream octets the socket took (sent) or gave (received), in stream order.
    TcpData {
        /// This end.
        local: SocketAddr,
        /// The other end.
        peer: SocketAddr,
        /// Which way.
        dir: Direction,
        /// The octets, in order (a vectored read or write).
        data: &'a [IoSlice<'a>],
    },
    /// One side of a TCP connection closed (`Sent`: this side shut its write side).
    TcpClose {
        /// This end.
        local: SocketAddr,
        /// The other end.
        peer: SocketAddr,
        /// Whose FIN.
        dir: Direction,
    },
    /// A RoCEv2 datagram through the UDP socket: the UDP payload (BTH .. ICRC).
    Udp {
        /// This end's address and port.
        local: SocketAddr,
        /// The other end's.
        peer: SocketAddr,
        /// Which way.
        dir: Direction,
        /// BTH through ICRC.
        payload: &'a [u8],
    },
    /// A whole IPv4 packet sent through the raw socket (the header this context built, over
    /// which its ICRC was computed).
    Ipv4 {
        /// The packet, IP header first.
        packet: &'a [u8],
    },
}

/// Receives what a context's transport sends and receives ([`Context::set_tap`]). Called
/// on whichever thread runs the transport, with its locks held: be quick, never call back
/// into the context.
///
/// [`Context::set_tap`]: crate::Context::set_tap
pub trait Tap: Send + Sync {
    /// One event, in the order the socket calls happened on that connection or socket.
    fn tapped(&self, t: Tapped<'_>);
}

/// The tap of a driver, set at most once.
#[derive(Default)]
pub(crate) struct TapSlot(OnceLock<Arc<dyn Tap>>);

impl TapSlot {
    pub(crate) fn set(&self, tap: Arc<dyn Tap>) -> bool {
        self.0.set(tap).is_ok()
    }

    pub(crate) fn get(&self) -> Option<&Arc<dyn Tap>> {
        self.0.get()
    }
}

/// Reports the first `n` octets of `iov` (what a vectored write took).
pub(crate) fn tcp_written(
    tap: &dyn Tap,
    local: SocketAddr,
    peer: SocketAddr,
    iov: &[IoSlice<'_>],
    n: usize,
) {
    let taken = softrdma_memory::iov_prefix(iov, n);
    tap.tapped(Tapped::TcpData {
        local,
        peer,
        dir: Direction::Sent,
        data: &taken,
    });
}
