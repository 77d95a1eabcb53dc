//! What any RoCE over a UDP socket with GSO and GRO could move on this machine, against the
//! raw UDP GSO baseline of `softrdma perf --transport roce` (issue 12, Done-when 2).
//!
//! Both run here, interleaved, over loopback between two threads, with the baseline's 4 MiB
//! socket buffers, 2 MiB in flight and an 8-octet acknowledgement every 64 KiB. The streams
//! carry 64 KiB RDMA Writes at PMTU 4096 in the shapes the InfiniBand transport gives them: a
//! WRITE_FIRST of 4128 octets (BTH, RETH, 4096 of payload, ICRC) sent alone, because a GSO run's
//! segments must be equal, then the 15 packets of 4112 octets as one run. Nothing is done per
//! packet beyond what is named; no engine, no PSN, no completion. The modes add, one at a time:
//! - `shape`: the packets prebuilt;
//! - `icrc`: the ICRC computed on send and checked on receive, over as many octets as RoCEv2's
//!   (its 48-octet masked prefix, then the packet);
//! - `copy`: the payload copied out of a 64 KiB region into the datagram, and on receive into
//!   another region;
//! - `gather`: the payload gathered from the region by `sendmsg` (an iovec per header, payload
//!   and ICRC), received as in `copy`;
//! - `scatter`: gathered, and received straight into the region by an iovec laid out for the
//!   packets expected next (the layout a receiver must guess before it reads a GRO batch).
//!
//! `cargo run --release -p softrdma-cli --example roce_bound -- [ROUNDS] [SECONDS] [ACK_KIB]`
//! (defaults 5, 2, 64; ACK_KIB is how often the RoCE modes acknowledge, the baseline always
//! every 64 KiB). Prints each round and the median of the per-round ratios.
use std::io::{IoSlice, IoSliceMut};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, sendmsg, setsockopt,
    sockopt,
};

/// Path MTU: payload per packet.
const P: usize = 4096;
/// One RDMA Write.
const MSG: usize = 65536;
/// In flight at most, as the baseline's 512 datagrams of 4 KiB.
const WINDOW: u64 = 512 * 4096;
/// WRITE_FIRST: BTH, RETH, payload, ICRC.
const FIRST: usize = 28 + P + 4;
/// WRITE_MIDDLE and WRITE_LAST: BTH, payload, ICRC.
const SEG: usize = 12 + P + 4;
/// Packets after the first.
const RUN: usize = MSG / P - 1;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Gso,
    Shape,
    Icrc,
    Copy,
    Gather,
    Scatter,
}

const MODES: [Mode; 6] = [
    Mode::Gso,
    Mode::Shape,
    Mode::Icrc,
    Mode::Copy,
    Mode::Gather,
    Mode::Scatter,
];

fn pair() -> (UdpSocket, UdpSocket) {
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for s in [&a, &b] {
        setsockopt(s, sockopt::RcvBuf, &(4 << 20)).expect("SO_RCVBUF");
        setsockopt(s, sockopt::SndBuf, &(4 << 20)).expect("SO_SNDBUF");
    }
    a.connect(b.local_addr().expect("addr")).expect("connect");
    b.connect(a.local_addr().expect("addr")).expect("connect");
    (a, b)
}

/// A CRC32 over as many octets as a RoCEv2 ICRC: the masked prefix (LRH stand-in, IPv4 and
/// UDP headers) and then the packet.
fn icrc(parts: &[&[u8]]) -> [u8; 4] {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8 + 20 + 8]);
    for p in parts {
        h.update(p);
    }
    h.finalize().to_le_bytes()
}

fn send(s: &UdpSocket, iov: &[IoSlice], gso: Option<u16>) {
    let g = gso.unwrap_or(0);
    let with = [ControlMessage::UdpGsoSegments(&g)];
    let c: &[ControlMessage] = if gso.is_some() { &with } else { &[] };
    loop {
        match sendmsg::<()>(s.as_raw_fd(), iov, c, MsgFlags::empty(), None) {
            Ok(_) => return,
            Err(nix::errno::Errno::EAGAIN) => std::thread::yield_now(),
            Err(e) => panic!("sendmsg: {e}"),
        }
    }
}

/// Sends Writes for `dur`, then waits until all are acknowledged; returns octets and time.
fn sender(s: &UdpSocket, mode: Mode, dur: Duration) -> (u64, Duration) {
    let mr: Vec<u8> = (0..MSG).map(|i| i as u8).collect();
    let base = vec![0xa5u8; RUN * P];
    let mut first = vec![1u8; FIRST];
    let mut run = vec![2u8; RUN * SEG];
    let mut hdrs = vec![3u8; 28 + RUN * 12];
    let mut trl = [0u8; 4 * (RUN + 1)];
    s.set_nonblocking(true).expect("nonblocking");
    let (mut sent, mut acked) = (0u64, 0u64);
    let mut ack = [0u8; 8];
    let start = Instant::now();
    let mut stopping = false;
    loop {
        while let Ok(8) = s.recv(&mut ack) {
            acked = acked.max(u64::from_le_bytes(ack));
        }
        if stopping && acked >= sent {
            break;
        }
        if !stopping && start.elapsed() >= dur {
            stopping = true;
            send(s, &[IoSlice::new(&[])], None);
            continue;
        }
        if stopping || sent - acked >= WINDOW {
            s.set_nonblocking(false).expect("blocking");
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .expect("timeout");
            match s.recv(&mut ack) {
                Ok(8) => acked = acked.max(u64::from_le_bytes(ack)),
                _ if stopping => send(s, &[IoSlice::new(&[])], None),
                _ => {}
            }
            s.set_nonblocking(true).expect("nonblocking");
            continue;
        }
        match mode {
            // The baseline: 64 KiB as 15 segments of 4096 and one more datagram.
            Mode::Gso => {
                send(s, &[IoSlice::new(&base)], Some(P as u16));
                send(s, &[IoSlice::new(&base[..P])], Some(P as u16));
            }
            Mode::Shape | Mode::Icrc | Mode::Copy => {
                if mode == Mode::Copy {
                    first[28..28 + P].copy_from_slice(&mr[..P]);
                    for (i, p) in run.chunks_mut(SEG).enumerate() {
                        p[12..12 + P].copy_from_slice(&mr[(i + 1) * P..(i + 2) * P]);
                    }
                }
                if mode != Mode::Shape {
                    let c = icrc(&[&first[..FIRST - 4]]);
                    first[FIRST - 4..].copy_from_slice(&c);
                    for p in run.chunks_mut(SEG) {
                        let c = icrc(&[&p[..SEG - 4]]);
                        p[SEG - 4..].copy_from_slice(&c);
                    }
                }
                send(s, &[IoSlice::new(&first)], None);
                send(s, &[IoSlice::new(&run)], Some(SEG as u16));
            }
            Mode::Gather | Mode::Scatter => {
                hdrs[0] = hdrs[0].wrapping_add(1);
                let c = icrc(&[&hdrs[..28], &mr[..P]]);
                trl[..4].copy_from_slice(&c);
                for i in 0..RUN {
                    let h = &hdrs[28 + i * 12..40 + i * 12];
                    let c = icrc(&[h, &mr[(i + 1) * P..(i + 2) * P]]);
                    trl[4 + i * 4..8 + i * 4].copy_from_slice(&c);
                }
                let iov = [
                    IoSlice::new(&hdrs[..28]),
                    IoSlice::new(&mr[..P]),
                    IoSlice::new(&trl[..4]),
                ];
                send(s, &iov, None);
                let mut iov = Vec::with_capacity(RUN * 3);
                for i in 0..RUN {
                    iov.push(IoSlice::new(&hdrs[28 + i * 12..40 + i * 12]));
                    iov.push(IoSlice::new(&mr[(i + 1) * P..(i + 2) * P]));
                    iov.push(IoSlice::new(&trl[4 + i * 4..8 + i * 4]));
                }
                send(s, &iov, Some(SEG as u16));
            }
        }
        sent += MSG as u64;
    }
    (sent, start.elapsed())
}

/// What one receive brought: octets and GRO segment size.
fn recv_into(s: &UdpSocket, iov: &mut [IoSliceMut]) -> Option<(usize, Option<usize>)> {
    let mut cmsg = nix::cmsg_space!(i32);
    let r =
        recvmsg::<SockaddrStorage>(s.as_raw_fd(), iov, Some(&mut cmsg), MsgFlags::empty()).ok()?;
    let mut gso = None;
    for c in r.cmsgs().ok()? {
        if let ControlMessageOwned::UdpGroSegments(g) = c {
            gso = Some(g as usize);
        }
    }
    Some((r.bytes, gso))
}

/// Receives until `stop`, acknowledging the payload total every `every` octets; counts bad
/// ICRCs into `bad` and GRO batches that held fewer packets than the layout guessed into
/// `short`.
fn receiver(s: &UdpSocket, mode: Mode, every: u64, stop: &AtomicBool, bad: &AtomicU64) -> u64 {
    setsockopt(s, sockopt::UdpGroSegment, &true).expect("UDP_GRO");
    s.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let mut buf = vec![0u8; 65536];
    let mut mr = vec![0u8; MSG];
    let mut hdr = vec![0u8; 28 + RUN * 12];
    let mut trl = [0u8; 4 * (RUN + 1)];
    let (mut total, mut acked_at) = (0u64, 0u64);
    // Scatter: the packet of the Write expected next (0: its WRITE_FIRST).
    let mut next = 0usize;
    let mut short = 0u64;
    let check = |c: [u8; 4], t: &[u8]| {
        if c != t {
            bad.fetch_add(1, Ordering::Relaxed);
        }
    };
    loop {
        let got = if mode == Mode::Scatter {
            let (h0, hs) = hdr.split_at_mut(28);
            let (m0, ms) = mr.split_at_mut(P);
            let (t0, ts) = trl.split_at_mut(4);
            let mut iov: Vec<IoSliceMut> = Vec::with_capacity(3 * RUN);
            if next == 0 {
                iov.extend([h0, m0, t0].map(IoSliceMut::new));
            } else {
                let k = next - 1;
                for ((h, m), t) in hs
                    .chunks_mut(12)
                    .skip(k)
                    .zip(ms.chunks_mut(P).skip(k))
                    .zip(ts.chunks_mut(4).skip(k))
                {
                    iov.extend([h, m, t].map(IoSliceMut::new));
                }
            }
            recv_into(s, &mut iov)
        } else {
            recv_into(s, &mut [IoSliceMut::new(&mut buf)])
        };
        let Some((n, gso)) = got else {
            if stop.load(Ordering::Acquire) {
                return short;
            }
            continue;
        };
        if n == 0 {
            s.send(&total.to_le_bytes()).ok();
            continue;
        }
        let seg = gso.unwrap_or(n);
        match mode {
            Mode::Gso => total += n as u64,
            Mode::Scatter => {
                if next == 0 && n == FIRST {
                    check(icrc(&[&hdr[..28], &mr[..P]]), &trl[..4]);
                    total += P as u64;
                    next = 1;
                } else if next > 0 && seg == SEG && n % SEG == 0 && n / SEG <= RUN + 1 - next {
                    let k = n / SEG;
                    for i in next - 1..next - 1 + k {
                        let h = &hdr[28 + i * 12..40 + i * 12];
                        check(
                            icrc(&[h, &mr[(i + 1) * P..(i + 2) * P]]),
                            &trl[4 + i * 4..8 + i * 4],
                        );
                    }
                    if k < RUN {
                        short += 1;
                    }
                    total += (k * P) as u64;
                    next = (next + k) % (RUN + 1);
                } else {
                    // The stream is one sender's, in order: a layout this far off is a bug.
                    panic!("scatter: {n} octets in segments of {seg}, packet {next} expected");
                }
            }
            _ => {
                for p in buf[..n].chunks(seg) {
                    let l = p.len();
                    let h = if l == FIRST { 28 } else { 12 };
                    if mode != Mode::Shape {
                        check(icrc(&[&p[..l - 4]]), &p[l - 4..]);
                    }
                    if mode == Mode::Copy || mode == Mode::Gather {
                        let at = (total as usize) % MSG;
                        mr[at..at + l - h - 4].copy_from_slice(&p[h..l - 4]);
                    }
                    total += (l - h - 4) as u64;
                }
            }
        }
        let every = if mode == Mode::Gso { MSG as u64 } else { every };
        if total - acked_at >= every {
            s.send(&total.to_le_bytes()).ok();
            acked_at = total;
        }
    }
}

/// One mode for `dur`: Gb/s of payload.
fn run(mode: Mode, dur: Duration, every: u64) -> f64 {
    let (a, b) = pair();
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicU64::new(0));
    let (st, bd) = (stop.clone(), bad.clone());
    let h = std::thread::spawn(move || receiver(&b, mode, every, &st, &bd));
    let (sent, elapsed) = sender(&a, mode, dur);
    stop.store(true, Ordering::Release);
    let short = h.join().expect("receiver");
    assert_eq!(bad.load(Ordering::Relaxed), 0, "{mode:?}: bad ICRC");
    if short > 0 {
        eprintln!("{mode:?}: {short} GRO batches shorter than guessed");
    }
    sent as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let arg = |i: usize| std::env::args().nth(i).and_then(|s| s.parse::<f64>().ok());
    let rounds = arg(1).unwrap_or(5.0).max(1.0) as usize;
    let dur = Duration::from_secs_f64(arg(2).unwrap_or(2.0));
    let every = (arg(3).unwrap_or(64.0) * 1024.0) as u64;
    let mut gbps = vec![Vec::new(); MODES.len()];
    for r in 0..rounds {
        let mut line = format!("round {}:", r + 1);
        for (i, m) in MODES.iter().enumerate() {
            let g = run(*m, dur, every);
            gbps[i].push(g);
            line += &format!(" {m:?} {g:.1}");
        }
        println!("{line}");
    }
    println!("mode      Gb/s (median)   / UDP GSO, median of rounds [range]");
    for (i, m) in MODES.iter().enumerate() {
        let ratios: Vec<f64> = (0..rounds).map(|k| gbps[i][k] / gbps[0][k]).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<9} {:>8.1}        {:.2} [{lo:.2}-{hi:.2}]",
            format!("{m:?}").to_lowercase(),
            median(gbps[i].clone()),
            median(ratios),
        );
    }
}
