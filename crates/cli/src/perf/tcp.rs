//! The raw TCP baseline: one blocking TCP stream for bandwidth and a TCP ping-pong for
//! latency, with the same message size as the RDMA test, page-aligned buffers and
//! `TCP_NODELAY` (as the iWARP connections have). The raw server is [`super::raw`].

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::proto::{RawTest, raw_header};
use super::stats::{Bw, Lat};
use super::{Limit, PerfError};
use softrdma::PageBuf;

/// The raw server's side of a TCP test on `s` (its header read): bandwidth (`bw`) or
/// ping-pong of `size`-octet messages.
pub fn serve_test(s: &mut TcpStream, bw: bool, size: u32) -> io::Result<()> {
    let mut buf = PageBuf::zeroed(size.max(1) as usize);
    if bw {
        let mut total = 0u64;
        loop {
            match s.read(buf.as_mut_slice()) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        s.write_all(&total.to_le_bytes())
    } else {
        let b = &mut buf.as_mut_slice()[..size as usize];
        loop {
            match s.read_exact(b) {
                Ok(()) => s.write_all(b)?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

/// A connection to the raw server at `addr` for `test`.
pub fn connect(addr: SocketAddr, test: RawTest, size: u32) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("raw TCP baseline at {addr} (--tcp-port): {e}"),
        )
    })?;
    s.set_nodelay(true)?;
    s.write_all(&raw_header(test, size))?;
    Ok(s)
}

/// Bandwidth of one TCP stream of `size`-octet writes; the time runs until the server
/// confirmed it read every octet.
pub fn bw(addr: SocketAddr, size: u32, limit: Limit) -> Result<Bw, PerfError> {
    let mut s = connect(addr, RawTest::TcpBw, size)?;
    let mut buf = PageBuf::zeroed(size as usize);
    buf.as_mut_slice().fill(0xa5);
    let start = Instant::now();
    let mut iters = 0u64;
    match limit {
        Limit::Iters(n) => {
            for _ in 0..n {
                s.write_all(buf.as_slice())?;
            }
            iters = n;
        }
        Limit::Duration(d) => {
            while start.elapsed() < d {
                for _ in 0..16 {
                    s.write_all(buf.as_slice())?;
                }
                iters += 16;
            }
        }
    }
    s.shutdown(Shutdown::Write)?;
    let mut got = [0u8; 8];
    s.read_exact(&mut got)?;
    let elapsed = start.elapsed();
    let got = u64::from_le_bytes(got);
    if got != iters * u64::from(size) {
        return Err(PerfError::Protocol(format!(
            "raw TCP server read {got} octets of {}",
            iters * u64::from(size)
        )));
    }
    Ok(Bw::new(iters, size, elapsed))
}

/// Round trips of `size`-octet messages (the server echoes); nanoseconds per round trip.
pub fn ping_pong(
    addr: SocketAddr,
    size: u32,
    limit: Limit,
    warmup: u64,
) -> Result<Vec<u64>, PerfError> {
    let mut s = connect(addr, RawTest::TcpLat, size)?;
    let mut out = PageBuf::zeroed(size.max(1) as usize);
    let mut inb = PageBuf::zeroed(size.max(1) as usize);
    let n = size as usize;
    limit.sample(warmup, |i| {
        out.as_mut_slice()[0] = i as u8;
        let t0 = Instant::now();
        s.write_all(&out.as_slice()[..n])?;
        s.read_exact(&mut inb.as_mut_slice()[..n])?;
        Ok(t0.elapsed())
    })
}

/// Latency from round-trip samples; `half` reports half round trips.
pub fn lat(samples: &mut [u64], half: bool) -> Option<Lat> {
    Lat::from_nanos(samples, if half { 2.0 } else { 1.0 })
}

/// Tells the server the session is over.
pub fn bye(addr: SocketAddr) -> io::Result<()> {
    let s = connect(addr, RawTest::Bye, 0)?;
    drop(s);
    Ok(())
}
