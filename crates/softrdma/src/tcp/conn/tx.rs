//! A connection's transmit side: whole frames from the engine into the transmit queue, one
//! vectored write of it (payloads from registered memory, `sendmsg` without `SIGPIPE`), and
//! what a failed write leaves.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::time::Instant;

use softrdma_memory::{TxBuf, TxSink};

use super::{Conn, TX_HIGH, WriteSide};
use crate::tap::{self, Direction, Tapped};
use crate::tcp::{DeviceStats, TcpShared};

impl Conn {
    /// Frames and writes what the engine has to send. An idle transmit queue trades places
    /// with the driver's `spare` for it: the spare's memory is in cache from the last
    /// connection that wrote, this one's, among a thousand connections, is not. It goes
    /// back unless octets stay queued (the socket was full).
    pub(super) fn transmit(&mut self, ctx: &TcpShared, spare: &mut TxBuf) {
        let borrowed = self.tx.is_idle();
        if borrowed {
            std::mem::swap(&mut self.tx, spare);
        }
        loop {
            self.fill_tx();
            let more = !self.tx.is_empty() && self.flush_tx(ctx);
            // Sends whose last octet is written complete (RDMAP-80).
            self.iw.transmitted(&mut self.tx);
            if !more {
                break;
            }
        }
        if self.tx.is_empty() {
            self.held_since = None;
        } else if self.align > 0 && self.held_since.is_none() {
            self.held_since = Some(Instant::now());
        }
        if borrowed && self.tx.is_idle() {
            std::mem::swap(&mut self.tx, spare);
        }
    }

    /// Whole frames from the connection until [`TX_HIGH`] octets wait.
    pub(super) fn fill_tx(&mut self) {
        if self.write_side == WriteSide::Closed {
            return;
        }
        let waiting = self.tx.len();
        if waiting < TX_HIGH {
            self.iw.poll_transmit_into(&mut self.tx, TX_HIGH - waiting);
        }
    }

    /// Writes the transmit queue, payloads straight from registered memory (one vectored
    /// write per [`softrdma_memory::MAX_IOV`] slices); `true` when it is empty afterwards.
    pub(super) fn flush_tx(&mut self, ctx: &TcpShared) -> bool {
        let mut wrote = false;
        loop {
            // Kept back: what follows the last whole segment, once one went out.
            let limit = match self.align {
                0 => usize::MAX,
                a => match self.tx.len() / a * a {
                    0 if wrote => return false,
                    0 => usize::MAX,
                    whole => whole,
                },
            };
            wrote = true;
            let Conn {
                stream,
                tap,
                local,
                peer,
                ..
            } = self;
            let r = self.tx.write_with(|iov| {
                let cut;
                let iov = match limit {
                    usize::MAX => iov,
                    n => {
                        cut = softrdma_memory::iov_prefix(iov, n);
                        &cut[..]
                    }
                };
                let r = send_vectored(stream, iov);
                if let Ok(n) = r {
                    DeviceStats::add(&ctx.stats.octets_tx, n);
                    if let (Some(t), 1..) = (tap, n) {
                        tap::tcp_written(&**t, *local, *peer, iov, n);
                    }
                }
                r
            });
            match r {
                Ok(None) => return true,
                Ok(Some(0)) => {
                    self.lost();
                    return false;
                }
                Ok(Some(_)) => {}
                Err(Ok(e)) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(Ok(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(Ok(_)) => {
                    self.lost();
                    return false;
                }
                Err(Err(_)) => {
                    // A source was revoked under a framed FPDU: the stream cannot go on.
                    self.lost();
                    return false;
                }
            }
        }
    }

    /// Tells the tap this side's FIN left.
    pub(in crate::tcp) fn tap_fin(&self) {
        if let Some(t) = &self.tap {
            t.tapped(Tapped::TcpClose {
                local: self.local,
                peer: self.peer,
                dir: Direction::Sent,
            });
        }
    }

    /// The connection failed under us (write error).
    pub(super) fn lost(&mut self) {
        tracing::info!(local = %self.local, peer = %self.peer, "iWARP connection lost (write failed)");
        // Sends not written never left (RDMAP-80): flushed, not completed.
        self.iw.transmit_failed();
        self.tx.clear();
        self.write_side = WriteSide::Closed;
        self.on_eof();
        self.die();
    }
}

/// Writes `iov` to the connected stream socket `s` with one `sendmsg` and `MSG_NOSIGNAL`: a
/// peer that reset the connection is an `EPIPE` error, not a `SIGPIPE` that ends a process
/// which did not ignore it (`writev`, the default vectored write, has no such flag).
pub(crate) fn send_vectored(s: &impl AsFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    socket2::SockRef::from(s).send_vectored_with_flags(iov, nix::libc::MSG_NOSIGNAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

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
