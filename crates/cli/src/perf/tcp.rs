//! The raw TCP baseline: one blocking TCP stream for bandwidth and a TCP ping-pong for
//! latency, with the same message size as the RDMA test, page-aligned buffers and
//! `TCP_NODELAY` (as the iWARP connections have). The raw server is [`super::raw`]. The
//! scale test's baseline ([`rounds`]) is N loopback connections of this process.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
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

/// The scale test's raw baseline: `n` loopback TCP connections (`TCP_NODELAY`), one
/// `size`-octet blocking write to each per round until `limit`, read by one thread that
/// waits on all of them with epoll (as the iWARP driver's background thread does). The time
/// runs until every octet was read. What the kernel itself does with `n` connections: how
/// much of softrdma's fall from one QP to many is the kernel's own.
///
/// Each connection writes from its own `size`-octet slot and is read into its own slot, as
/// each QP of the RDMA rows Writes from and into its own: with many connections the memory
/// touched per round is as large (and as cold) on both sides of the comparison.
pub fn rounds(n: u32, size: u32, limit: Limit) -> Result<Bw, PerfError> {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    let mut writers = Vec::with_capacity(n as usize);
    let mut readers = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let w = TcpStream::connect(addr)?;
        w.set_nodelay(true)?;
        let (r, _) = listener.accept()?;
        r.set_nonblocking(true)?;
        writers.push(w);
        readers.push(r);
    }
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
    for (i, r) in readers.iter().enumerate() {
        let ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, i as u64);
        epoll.add(r.as_fd(), ev).map_err(io::Error::from)?;
    }
    let slot = size.max(1) as usize;
    let mut src = PageBuf::zeroed(slot * n as usize);
    for (i, s) in src.as_mut_slice().chunks_mut(slot).enumerate() {
        s.fill(slot_octet(i));
    }
    let mut dst = PageBuf::zeroed(slot * n as usize);
    let start = Instant::now();
    let (rounds, read) = std::thread::scope(|s| -> Result<(u64, u64), PerfError> {
        let dst = &mut dst;
        let reader = s.spawn(move || -> io::Result<u64> {
            let mut events = vec![EpollEvent::empty(); 256];
            let (mut total, mut open) = (0u64, readers.len());
            // An ended socket may be reported again (its hang-up after its last read).
            let mut ended = vec![false; readers.len()];
            // Where the next octets of each connection land in its slot.
            let mut at = vec![0usize; readers.len()];
            while open > 0 {
                let k = match epoll.wait(&mut events, EpollTimeout::from(1000u16)) {
                    Ok(k) => k,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                };
                for ev in &events[..k] {
                    let i = ev.data() as usize;
                    if ended[i] {
                        continue;
                    }
                    let mut r = &readers[i];
                    // Edge-triggered: read until the socket is empty or ended.
                    loop {
                        let into = &mut dst.as_mut_slice()[i * slot..][at[i]..slot];
                        match r.read(into) {
                            Ok(0) => {
                                ended[i] = true;
                                open -= 1;
                                break;
                            }
                            Ok(m) => {
                                total += m as u64;
                                at[i] = (at[i] + m) % slot;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            Ok(total)
        });
        let mut done = 0u64;
        let wrote = (|| -> io::Result<()> {
            while !limit.reached(done, start) {
                for (mut w, from) in writers.iter().zip(src.as_slice().chunks(slot)) {
                    w.write_all(from)?;
                }
                done += 1;
            }
            Ok(())
        })();
        // Every stream ends, whatever happened: the reader waits for all of them (the
        // first error is kept, the other streams still shut down).
        let ended = writers
            .iter()
            .map(|w| w.shutdown(Shutdown::Write))
            .fold(Ok(()), io::Result::and);
        let read = reader
            .join()
            .map_err(|_| PerfError::Protocol("the raw TCP reader panicked".into()))??;
        wrote?;
        ended?;
        Ok((done, read))
    })?;
    let elapsed = start.elapsed();
    let want = rounds * u64::from(n) * u64::from(size);
    if read != want {
        return Err(PerfError::Protocol(format!(
            "raw TCP scale baseline: read {read} octets of {want}"
        )));
    }
    if rounds > 0 && dst.as_slice() != src.as_slice() {
        return Err(PerfError::Protocol(
            "raw TCP scale baseline: a connection's slot does not hold what it wrote".into(),
        ));
    }
    Ok(Bw::new(rounds * u64::from(n), size, elapsed))
}

/// The octet connection `i` of [`rounds`] writes (neighbours differ).
fn slot_octet(i: usize) -> u8 {
    (i % 251) as u8 ^ 0x5a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scale baseline moves every octet it writes, one write per connection per round,
    /// for one connection and for many, by count and by time, each connection's octets into
    /// its own slot (`rounds` fails when a slot differs from what its connection wrote).
    #[test]
    fn raw_scale_rounds_read_every_octet() {
        for (n, size) in [(1u32, 4096u32), (16, 4096), (64, 1000)] {
            let b = rounds(n, size, Limit::Iters(50)).unwrap();
            assert_eq!(b.iters, 50 * u64::from(n), "{n} connections");
            assert_eq!(b.bytes, 50 * u64::from(n) * u64::from(size));
            let b = rounds(n, size, Limit::Duration(Duration::from_millis(50))).unwrap();
            assert!(
                b.iters > 0 && b.iters.is_multiple_of(u64::from(n)),
                "{n}: {}",
                b.iters
            );
            assert_eq!(b.bytes, b.iters * u64::from(size));
        }
    }
}
