//! The raw UDP baseline of `softrdma perf --transport roce`, same run, same message size,
//! between the two RoCE addresses, sockets with the same 4 MiB buffers as the RoCE driver's.
//! The raw server ([`super::raw`]) sets a test up over a TCP connection: the
//! client names its UDP socket, the server answers with the port of its own (on the address
//! the client reached it at), the test runs, and the client's shutdown of the TCP
//! connection ends it (bandwidth: the server answers with the octets it received).
//!
//! - bandwidth: the client sends each message as `ceil(size / mtu)` datagrams of at most the
//!   path MTU (the payload a RoCE packet carries), never more than [`UDP_WINDOW`] datagrams'
//!   worth beyond what the server acknowledged: what the 4 MiB receive buffer (8 MiB of
//!   accounted memory) holds of 4 KiB datagrams, whose skbs take about 9 KiB each.
//!   The server acknowledges the running octet total in an 8-octet datagram every
//!   [`UDP_ACK_EVERY`] datagrams and whenever it gets an empty datagram, which the client
//!   sends after its last message. The time runs from the first datagram to the
//!   acknowledgement of the last octet, so it covers delivery. A datagram lost shows as an
//!   acknowledgement that stops short: the sender stops, and the figure is over what
//!   arrived, until the last acknowledgement that moved, with the loss reported beside it
//!   ([`Bw::lost_bytes`]) — a baseline's loss never costs the run its RDMA figures.
//! - bandwidth with segmentation offload (GSO): the same, but the client hands the kernel
//!   super-datagrams of up to 64 path-MTU segments (at most 64 KiB) with `UDP_SEGMENT`, which
//!   it cuts into MTU datagrams, and the server's socket coalesces them again (`UDP_GRO`) and
//!   acknowledges every 64 KiB: what UDP moves on this machine when the per-datagram system
//!   call cost is taken away, the figure a RoCE sender with GSO could reach.
//! - latency: a ping-pong of `size`-octet messages (datagrams of at most the MTU), the
//!   server echoing each datagram; half the round trip beside Send and Write, the whole one
//!   beside Read.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::proto::{RawTest, UDP_ENDPOINT_LEN};
use super::stats::Bw;
use super::{Limit, PerfError};

/// Raw UDP bandwidth: datagrams in flight unacknowledged, at most.
pub const UDP_WINDOW: u64 = 512;
/// Raw UDP bandwidth: the server acknowledges every this many datagrams.
pub const UDP_ACK_EVERY: u32 = 16;
/// Socket buffers of the raw UDP sockets (what `RoceConfig::new` asks for).
const UDP_BUFFER: usize = 4 << 20;
/// GSO: segments per super-datagram at most (the kernel's `UDP_MAX_SEGMENTS`) and its
/// payload at most (a UDP datagram's, less room for headers).
const GSO_MAX_SEGMENTS: u32 = 64;
const GSO_MAX_OCTETS: u32 = 65_000;
/// GSO bandwidth: the server acknowledges every this many octets.
const GSO_ACK_EVERY: u64 = 64 << 10;

/// Raw UDP: an acknowledgement or echo this late means a datagram was lost.
const UDP_STALL: Duration = Duration::from_millis(250);
/// How often the server's UDP loop looks whether the test is over.
const POLL: Duration = Duration::from_millis(50);

/// The client's side of the raw UDP tests.
#[derive(Clone, Copy, Debug)]
pub struct UdpBaseline {
    /// The raw server (TCP).
    pub server: SocketAddr,
    /// Our address (the RoCE context's).
    pub local: IpAddr,
    /// Largest datagram payload: the path MTU.
    pub mtu: u32,
}

impl UdpBaseline {
    /// Sets a `test` up with the raw server: the TCP connection and our UDP socket,
    /// connected to the server's.
    fn open(&self, test: RawTest, size: u32) -> Result<(TcpStream, UdpSocket), PerfError> {
        let sock = udp_socket(self.local)?;
        let mut s = super::tcp::connect(self.server, test, size)?;
        let mut e = [0u8; UDP_ENDPOINT_LEN];
        e[0..2].copy_from_slice(&sock.local_addr()?.port().to_be_bytes());
        e[2..].copy_from_slice(&softrdma_wire::rocev2::gid_from_ip(self.local));
        s.write_all(&e)?;
        let mut port = [0u8; 2];
        s.read_exact(&mut port)?;
        sock.connect((self.server.ip(), u16::from_be_bytes(port)))?;
        Ok((s, sock))
    }

    /// Raw UDP bandwidth of `size`-octet messages, one datagram per path MTU.
    pub fn bw(&self, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        self.bw_of(RawTest::UdpBw, size, limit)
    }

    /// Raw UDP bandwidth with GSO and GRO; `None` where the kernel has no `UDP_SEGMENT`.
    pub fn bw_gso(&self, size: u32, limit: Limit) -> Result<Option<Bw>, PerfError> {
        if !gso_works(self.local) {
            return Ok(None);
        }
        self.bw_of(RawTest::UdpGsoBw, size, limit).map(Some)
    }

    fn bw_of(&self, test: RawTest, size: u32, limit: Limit) -> Result<Bw, PerfError> {
        let (mut s, sock) = self.open(test, size)?;
        let mtu = self.mtu.max(1);
        let chunk = if test == RawTest::UdpGsoBw {
            set_gso(&sock, mtu)?;
            // As many whole segments as one UDP datagram (and the kernel's 64) take.
            let segs = (GSO_MAX_OCTETS / mtu).clamp(1, GSO_MAX_SEGMENTS);
            (segs * mtu).min(size.max(1))
        } else {
            mtu.min(size.max(1))
        };
        let r = udp_blast(&sock, size, chunk as usize, mtu as usize, limit);
        s.shutdown(Shutdown::Write)?;
        let mut got = [0u8; 8];
        s.read_exact(&mut got)?;
        let got = u64::from_le_bytes(got);
        let b = r?;
        if got >= b.sent {
            return Ok(Bw::new(b.msgs, size, b.elapsed));
        }
        // Lost datagrams: the figure is over what arrived, in the time it took.
        Ok(Bw {
            lost_bytes: b.sent - got,
            ..Bw::of_octets(got, size, b.last_ack)
        })
    }

    /// Raw UDP ping-pong: nanoseconds per round trip.
    pub fn rtt(&self, size: u32, limit: Limit, warmup: u64) -> Result<Vec<u64>, PerfError> {
        let (mut s, sock) = self.open(RawTest::UdpLat, size)?;
        let r = udp_ping_pong(&sock, size, self.mtu, limit, warmup);
        s.shutdown(Shutdown::Write)?;
        let mut got = [0u8; 8];
        s.read_exact(&mut got)?;
        r
    }
}

/// The raw server's side of a UDP test on `s` (its header read): bandwidth (`bw`) or
/// ping-pong, until the client shuts `s` down.
pub fn serve_conn(s: &mut TcpStream, test: RawTest) -> io::Result<()> {
    let mut e = [0u8; UDP_ENDPOINT_LEN];
    s.read_exact(&mut e)?;
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&e[2..]);
    let client = SocketAddr::new(
        softrdma::roce::gid_to_ip(&gid),
        u16::from_be_bytes([e[0], e[1]]),
    );
    let sock = udp_socket(s.local_addr()?.ip().to_canonical())?;
    sock.connect(client)?;
    if test == RawTest::UdpGsoBw {
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::UdpGroSegment, &true)
            .map_err(io::Error::from)?;
    }
    sock.set_read_timeout(Some(POLL))?;
    s.write_all(&sock.local_addr()?.port().to_be_bytes())?;
    let stop = AtomicBool::new(false);
    let (end, r) = std::thread::scope(|sc| {
        let h = sc.spawn(|| udp_serve(&sock, test, &stop));
        let mut rest = [0u8; 64];
        let end = loop {
            match s.read(&mut rest) {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        stop.store(true, Ordering::Release);
        (end, h.join())
    });
    end?;
    let got = r
        .map_err(|_| io::Error::other("the UDP server thread panicked"))?
        .map_err(|e| io::Error::other(e.to_string()))?;
    s.write_all(&got.to_le_bytes())
}

fn udp_socket(ip: IpAddr) -> io::Result<UdpSocket> {
    let addr = SocketAddr::new(ip, 0);
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    let _ = s.set_recv_buffer_size(UDP_BUFFER);
    let _ = s.set_send_buffer_size(UDP_BUFFER);
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// Turns `UDP_SEGMENT` on: every send larger than `mtu` leaves as `mtu`-octet datagrams.
fn set_gso(sock: &UdpSocket, mtu: u32) -> Result<(), PerfError> {
    nix::sys::socket::setsockopt(
        sock,
        nix::sys::socket::sockopt::UdpGsoSegment,
        &(mtu as i32),
    )
    .map_err(|e| PerfError::Protocol(format!("UDP_SEGMENT: {e}")))
}

/// Whether this kernel segments UDP for us (Linux 4.18 and later).
fn gso_works(ip: IpAddr) -> bool {
    udp_socket(ip).is_ok_and(|s| {
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::UdpGsoSegment, &1024).is_ok()
    })
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Raw UDP on the server: counts and acknowledges (bandwidth) or echoes (latency) until
/// `stop`; returns the octets received.
fn udp_serve(sock: &UdpSocket, test: RawTest, stop: &AtomicBool) -> Result<u64, PerfError> {
    let mut buf = vec![0u8; 65536];
    let mut total = 0u64;
    let mut unacked = 0u32;
    let mut acked_at = 0u64;
    let bw = test != RawTest::UdpLat;
    loop {
        match sock.recv(&mut buf) {
            // GRO: one receive holds many datagrams; acknowledge by octets.
            Ok(n) if test == RawTest::UdpGsoBw => {
                total += n as u64;
                if n == 0 || total - acked_at >= GSO_ACK_EVERY {
                    sock.send(&total.to_le_bytes())?;
                    acked_at = total;
                }
            }
            Ok(n) if bw => {
                total += n as u64;
                unacked += 1;
                if n == 0 || unacked >= UDP_ACK_EVERY {
                    sock.send(&total.to_le_bytes())?;
                    unacked = 0;
                }
            }
            Ok(n) => {
                total += n as u64;
                sock.send(&buf[..n])?;
            }
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::ConnectionRefused => {
                if stop.load(Ordering::Acquire) {
                    return Ok(total);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// What the sending side of raw UDP bandwidth did.
struct Blast {
    /// Messages sent.
    msgs: u64,
    /// Octets sent.
    sent: u64,
    /// From the first datagram to the acknowledgement of the last octet (or, datagrams
    /// lost, to when the sender gave up waiting).
    elapsed: Duration,
    /// From the first datagram to the last acknowledgement that moved.
    last_ack: Duration,
}

/// The sending side of raw UDP bandwidth. A loss (no acknowledgement moves for
/// `4 × UDP_STALL`) ends it early.
fn udp_blast(
    sock: &UdpSocket,
    size: u32,
    chunk: usize,
    mtu: usize,
    limit: Limit,
) -> Result<Blast, PerfError> {
    let size = size as usize;
    // In flight: UDP_WINDOW path-MTU datagrams' worth (what the receiver's buffer holds).
    let window = (UDP_WINDOW * mtu.min(size.max(1)) as u64).max(chunk as u64);
    let buf = vec![0xa5u8; chunk];
    let total = match limit {
        Limit::Iters(n) => n,
        Limit::Duration(_) => u64::MAX,
    };
    let mut ack = [0u8; 16];
    let (mut msgs, mut sent, mut acked, mut in_msg) = (0u64, 0u64, 0u64, 0usize);
    let mut done_sending = total == 0;
    let mut stalls = 0;
    sock.set_nonblocking(true)?;
    let start = Instant::now();
    let mut last_ack = start;
    let deadline = match limit {
        Limit::Duration(d) => Some(start + d),
        Limit::Iters(_) => None,
    };
    if done_sending {
        sock.send(&[])?;
    }
    loop {
        loop {
            match sock.recv(&mut ack) {
                Ok(8) => {
                    let a = u64::from_le_bytes(ack[..8].try_into().unwrap_or_default());
                    if a > acked {
                        acked = a;
                        last_ack = Instant::now();
                    }
                }
                Ok(_) => {}
                Err(e) if is_timeout(&e) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if done_sending && acked >= sent {
            break;
        }
        let mut progressed = false;
        let mut burst = 0;
        while !done_sending && sent - acked < window && burst < 32 {
            let n = chunk.min(size - in_msg);
            match sock.send(&buf[..n]) {
                Ok(_) => {}
                Err(e) if is_timeout(&e) => break,
                Err(e) => return Err(e.into()),
            }
            progressed = true;
            burst += 1;
            sent += n as u64;
            in_msg += n;
            if in_msg == size {
                in_msg = 0;
                msgs += 1;
                if msgs >= total
                    || (msgs.is_multiple_of(16) && deadline.is_some_and(|d| Instant::now() >= d))
                {
                    done_sending = true;
                    // Asks for an acknowledgement of everything now.
                    sock.send(&[])?;
                }
            }
        }
        if progressed {
            stalls = 0;
            continue;
        }
        // The window is full or everything is sent: wait for an acknowledgement.
        sock.set_nonblocking(false)?;
        sock.set_read_timeout(Some(UDP_STALL))?;
        let r = sock.recv(&mut ack);
        sock.set_nonblocking(true)?;
        match r {
            Ok(8) => {
                let a = u64::from_le_bytes(ack[..8].try_into().unwrap_or_default());
                if a > acked {
                    acked = a;
                    last_ack = Instant::now();
                    stalls = 0;
                }
            }
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {
                stalls += 1;
                if stalls >= 4 {
                    // Datagrams lost: nothing more will be acknowledged.
                    break;
                }
                // The acknowledgement may be what was lost: ask again.
                sock.send(&[])?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Blast {
        msgs,
        sent,
        elapsed: start.elapsed(),
        last_ack: last_ack - start,
    })
}

/// Tries of one ping-pong round trip (an echo later than `UDP_STALL` × 4 is taken as lost
/// and the round trip done again); one lost every time is left out of the samples, so
/// that a lossy path costs the baseline samples, never the run.
const LOST_TRIES: u32 = 4;
/// What the sampling loop is given for a round trip left out.
const LEFT_OUT: Duration = Duration::MAX;

/// The client side of the raw UDP ping-pong. Each datagram starts with its round trip's
/// number (as many low octets of it as fit), so an echo that comes after its round trip
/// was given up for lost is told apart and ignored; a lost round trip is done again, not
/// counted, and the losses are reported on standard error.
fn udp_ping_pong(
    sock: &UdpSocket,
    size: u32,
    mtu: u32,
    limit: Limit,
    warmup: u64,
) -> Result<Vec<u64>, PerfError> {
    let chunk = mtu.min(size).max(1) as usize;
    let n = size.max(1) as usize;
    let mut out = vec![0x5au8; n];
    let mut inb = vec![0u8; 65536];
    let (mut lost, mut left_out) = (0u64, 0u64);
    sock.set_read_timeout(Some(UDP_STALL * 4))?;
    let r = limit.sample(warmup, |i| {
        let tag = i.to_le_bytes();
        let k = tag.len().min(chunk);
        for c in out.chunks_mut(chunk) {
            let l = k.min(c.len());
            c[..l].copy_from_slice(&tag[..l]);
        }
        'attempt: for _ in 0..LOST_TRIES {
            let t0 = Instant::now();
            for c in out.chunks(chunk) {
                sock.send(c)?;
            }
            let mut got = 0;
            while got < n {
                match sock.recv(&mut inb) {
                    Ok(m) if inb[..k.min(m)] == tag[..k.min(m)] => got += m,
                    // An echo of a round trip given up for lost.
                    Ok(_) => {}
                    Err(e) if is_timeout(&e) => {
                        lost += 1;
                        continue 'attempt;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(t0.elapsed());
        }
        left_out += 1;
        Ok(LEFT_OUT)
    });
    if lost > 0 {
        eprintln!(
            "softrdma perf: raw UDP ping-pong, {size} octets: {lost} round trips lost and done again, {left_out} of them left out (lost {LOST_TRIES} times)"
        );
    }
    let left = LEFT_OUT.as_nanos() as u64;
    let samples: Vec<u64> = r?.into_iter().filter(|&s| s != left).collect();
    if samples.is_empty() {
        return Err(PerfError::Protocol(format!(
            "raw UDP ping-pong, {size} octets: every round trip was lost {LOST_TRIES} times"
        )));
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        (a, b)
    }

    /// A server that acknowledges as `udp_serve` does but loses the datagrams `lose` picks
    /// (as a lossy network would): the sender ends with what was acknowledged, no error.
    #[test]
    fn a_lossy_bandwidth_baseline_ends_with_its_loss() {
        let (client, server) = pair();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let srv = std::thread::spawn(move || {
            server.set_read_timeout(Some(POLL)).unwrap();
            let (mut buf, mut total, mut unacked, mut i) = (vec![0u8; 65536], 0u64, 0, 0u64);
            loop {
                match server.recv(&mut buf) {
                    Ok(n) => {
                        i += 1;
                        // Every 97th datagram is lost, empty ones (the "acknowledge now")
                        // excepted.
                        if n > 0 && i.is_multiple_of(97) {
                            continue;
                        }
                        total += n as u64;
                        unacked += 1;
                        if n == 0 || unacked >= UDP_ACK_EVERY {
                            let _ = server.send(&total.to_le_bytes());
                            unacked = 0;
                        }
                    }
                    Err(_) if s2.load(Ordering::Acquire) => return total,
                    Err(_) => {}
                }
            }
        });
        let b = udp_blast(&client, 4096, 1024, 1024, Limit::Iters(200)).unwrap();
        stop.store(true, Ordering::Release);
        let got = srv.join().unwrap();
        assert!(got < b.sent, "{got} of {}", b.sent);
        assert!(b.last_ack <= b.elapsed);
        let bw = Bw {
            lost_bytes: b.sent - got,
            ..Bw::of_octets(got, 4096, b.last_ack)
        };
        assert_eq!(bw.bytes + bw.lost_bytes, b.sent);
        assert_eq!(bw.iters, got / 4096);
    }

    /// An echo server that loses the first echo of round trip 5 and sends it late instead,
    /// during round trip 6: every round trip is still measured, the late echo ignored.
    #[test]
    fn a_lost_round_trip_is_done_again() {
        let (client, server) = pair();
        let srv = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            let mut held: Option<Vec<u8>> = None;
            let mut seen5 = false;
            server
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            while let Ok(n) = server.recv(&mut buf) {
                let tag = buf[0];
                if tag == 5 && !seen5 {
                    seen5 = true;
                    held = Some(buf[..n].to_vec());
                    continue;
                }
                if tag == 6
                    && let Some(h) = held.take()
                {
                    server.send(&h).unwrap();
                }
                server.send(&buf[..n]).unwrap();
                if tag == 9 {
                    return;
                }
            }
        });
        let samples = udp_ping_pong(&client, 100, 1024, Limit::Iters(10), 0).unwrap();
        srv.join().unwrap();
        assert_eq!(samples.len(), 10);
    }

    /// An echo server that never echoes round trip 3 (a path that loses it every time):
    /// the round trip is left out of the samples after its tries, the run goes on.
    #[test]
    fn a_round_trip_lost_every_time_is_left_out() {
        let (client, server) = pair();
        let srv = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            server
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            while let Ok(n) = server.recv(&mut buf) {
                if buf[0] != 3 {
                    server.send(&buf[..n]).unwrap();
                }
                if buf[0] == 5 {
                    return;
                }
            }
        });
        let samples = udp_ping_pong(&client, 100, 1024, Limit::Iters(6), 0).unwrap();
        srv.join().unwrap();
        assert_eq!(samples.len(), 5, "{samples:?}");
        assert!(samples.iter().all(|&s| s < 1_000_000_000), "{samples:?}");
    }
}
