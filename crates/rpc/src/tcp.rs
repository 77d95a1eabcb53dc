//! RPC over TCP with record marking (RFC 5531 §11).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use parking_lot::Mutex;

use crate::client::{Client, ClientTransport, DEFAULT_MAX_IN_FLIGHT, Incoming, OutCall};
use crate::record::{MAX_FRAGMENT, RecordDecoder, encode_record};

/// The largest record accepted by default: a 1 MiB NFS READ or WRITE plus headers, with room.
pub const DEFAULT_MAX_RECORD: usize = 4 << 20;

/// Reads whole records from a stream.
pub struct RecordReader<R> {
    inner: R,
    decoder: RecordDecoder,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: Read> RecordReader<R> {
    /// Records of at most `max_record` octets from `inner`.
    pub fn new(inner: R, max_record: usize) -> RecordReader<R> {
        RecordReader {
            inner,
            decoder: RecordDecoder::new(max_record),
            buf: vec![0; 64 * 1024].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The next record; `Ok(None)` at an end of stream between records. A record over the
    /// limit, or an end inside one, is an `InvalidData` / `UnexpectedEof` error.
    pub fn read_record(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.read_record_when(|| Ok(()))
    }

    /// As [`RecordReader::read_record`], asking `ready` before each read whether to read
    /// now: its error is returned (e.g. `TimedOut`), what was decoded so far kept for the
    /// next call.
    pub fn read_record_when(
        &mut self,
        mut ready: impl FnMut() -> io::Result<()>,
    ) -> io::Result<Option<Vec<u8>>> {
        loop {
            if self.start < self.end {
                let mut input = &self.buf[self.start..self.end];
                let before = input.len();
                let r = self
                    .decoder
                    .decode(&mut input)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                self.start += before - input.len();
                if let Some(rec) = r {
                    return Ok(Some(rec));
                }
            }
            // Everything buffered is decoded: the buffer starts over (also if the read
            // fails, so that a retry does not decode the same octets again).
            self.start = 0;
            self.end = 0;
            ready()?;
            self.end = match self.inner.read(&mut self.buf) {
                Ok(0) if self.decoder.is_idle() => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => return Err(e),
            };
        }
    }
}

/// Writes `msg` as one record (fragments of at most `max_fragment`) with one `write_all`.
pub fn write_record(w: &mut impl Write, msg: &[u8], max_fragment: usize) -> io::Result<()> {
    write_record_parts(w, &[msg], max_fragment)
}

/// [`write_record`] of a message given in parts, in order.
pub fn write_record_parts(
    w: &mut impl Write,
    parts: &[&[u8]],
    max_fragment: usize,
) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(total + 8);
    encode_record(parts, max_fragment, &mut out);
    w.write_all(&out)
}

/// A client's TCP connection.
pub struct TcpTransport {
    writer: Mutex<TcpStream>,
    reader: Mutex<RecordReader<TcpStream>>,
    stream: TcpStream,
    max_fragment: usize,
}

impl TcpTransport {
    /// Connects to `addr` (`TCP_NODELAY`: calls are not held back).
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<TcpTransport> {
        let s = TcpStream::connect(addr)?;
        TcpTransport::from_stream(s, DEFAULT_MAX_RECORD)
    }

    /// Connections to `addr` (records up to `max_record` octets), for
    /// [`Client::with_reconnect`](crate::Client::with_reconnect).
    pub fn connector(addr: std::net::SocketAddr, max_record: usize) -> crate::client::Connector {
        Box::new(move || {
            let s = TcpStream::connect(addr)?;
            Ok(Arc::new(TcpTransport::from_stream(s, max_record)?)
                as Arc<dyn crate::ClientTransport>)
        })
    }

    /// Over an established stream.
    pub fn from_stream(s: TcpStream, max_record: usize) -> io::Result<TcpTransport> {
        s.set_nodelay(true)?;
        Ok(TcpTransport {
            writer: Mutex::new(s.try_clone()?),
            reader: Mutex::new(RecordReader::new(s.try_clone()?, max_record)),
            stream: s,
            max_fragment: MAX_FRAGMENT,
        })
    }

    /// Sends calls as fragments of at most `n` octets (one fragment by default, as Linux).
    pub fn with_max_fragment(mut self, n: usize) -> TcpTransport {
        self.max_fragment = n;
        self
    }

    /// The server's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }
}

impl ClientTransport for TcpTransport {
    fn send(&self, call: &OutCall) -> io::Result<()> {
        // A byte stream carries the DDP-eligible data in place.
        write_record(&mut *self.writer.lock(), &call.msg, self.max_fragment)
    }

    fn recv(&self) -> io::Result<Option<Incoming>> {
        Ok(self
            .reader
            .lock()
            .read_record()?
            .map(|msg| Incoming::Reply { msg, bulk: None }))
    }

    fn recv_timeout(&self, timeout: Duration) -> io::Result<Option<Incoming>> {
        let deadline = Instant::now() + timeout;
        let ready = || {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
            match nix::poll::poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(0) => Err(io::ErrorKind::TimedOut.into()),
                Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
                Err(e) => Err(e.into()),
            }
        };
        Ok(self
            .reader
            .lock()
            .read_record_when(ready)?
            .map(|msg| Incoming::Reply { msg, bulk: None }))
    }

    fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Client {
    /// A client of the RPC server at `addr` over TCP.
    pub fn connect_tcp(addr: impl ToSocketAddrs) -> io::Result<Client> {
        Ok(Client::new(
            Arc::new(TcpTransport::connect(addr)?),
            DEFAULT_MAX_IN_FLIGHT,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_read_in_pieces_survives_a_timed_out_wait() {
        let mut wire = Vec::new();
        encode_record(&[b"first record"], 5, &mut wire);
        encode_record(&[b"second"], MAX_FRAGMENT, &mut wire);
        // The stream gives 7 octets per read: the first record spans several reads.
        struct Trickle(Vec<u8>, usize);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(7).min(self.0.len() - self.1);
                buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        let mut r = RecordReader::new(Trickle(wire, 0), 1 << 20);
        // Every other wait times out, mid-record included: nothing read is lost or read
        // twice.
        let mut turn = 0;
        let mut ready = || {
            turn += 1;
            if turn % 2 == 0 {
                Err(io::Error::from(io::ErrorKind::TimedOut))
            } else {
                Ok(())
            }
        };
        let mut got = Vec::new();
        let mut timeouts = 0;
        while got.len() < 2 {
            match r.read_record_when(&mut ready) {
                Ok(Some(rec)) => got.push(rec),
                Ok(None) => panic!("the stream ended early"),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => timeouts += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(timeouts > 2);
        assert_eq!(got, [b"first record".to_vec(), b"second".to_vec()]);
        assert_eq!(r.read_record().unwrap(), None);
    }
}
