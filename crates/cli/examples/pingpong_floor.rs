//! What a TCP ping-pong over loopback can reach on this machine, by how each side waits and
//! where the scheduler puts the two threads: the floor under any latency figure measured
//! against "raw sockets" (issue 42). Half round trips of 64-octet messages, median and
//! minimum of `N` after a warm-up.
//!
//!   cargo run --release -p softrdma-cli --example pingpong_floor [-- ITERS]
//!
//! Waits: `block` (a blocking `recv`, as `perf`'s raw baseline), `spin` (non-blocking `recv`
//! in a loop), `epoll` (`epoll_wait` with a zero timeout in a loop, then `recv`, as a
//! poll-mode progress engine does). Placement: `free` (the scheduler's choice), `same` (both
//! threads on CPU 0: each wake-up is a switch on one core), `cross` (CPU 0 and CPU 1; the
//! only one for the polling waits: two pollers sharing a core take turns by time slice).
//! Needs two CPUs. A benchmark: it asserts nothing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Instant;

use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::unistd::Pid;

#[derive(Clone, Copy, PartialEq)]
enum Wait {
    Block,
    Spin,
    Epoll,
}

const SIZE: usize = 64;

fn pin(cpu: Option<usize>) {
    if let Some(c) = cpu {
        let mut set = CpuSet::new();
        set.set(c).expect("a CPU index");
        sched_setaffinity(Pid::from_raw(0), &set).expect("sched_setaffinity");
    }
}

/// Reads one message of SIZE octets the way `wait` says.
fn read_msg(s: &mut TcpStream, ep: &Epoll, wait: Wait, buf: &mut [u8]) {
    let mut got = 0;
    let mut evs = [EpollEvent::empty()];
    while got < SIZE {
        if wait == Wait::Epoll && ep.wait(&mut evs, EpollTimeout::ZERO).expect("epoll") == 0 {
            continue;
        }
        match s.read(&mut buf[got..SIZE]) {
            Ok(0) => panic!("peer closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
}

fn side(mut s: TcpStream, wait: Wait, cpu: Option<usize>, iters: usize, first: bool) -> Vec<f64> {
    pin(cpu);
    s.set_nodelay(true).expect("nodelay");
    s.set_nonblocking(wait != Wait::Block).expect("nonblocking");
    let ep = Epoll::new(EpollCreateFlags::empty()).expect("epoll");
    ep.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))
        .expect("epoll add");
    let mut buf = [0u8; SIZE];
    let mut half = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        if first {
            s.write_all(&buf).expect("send");
        }
        read_msg(&mut s, &ep, wait, &mut buf);
        if !first {
            s.write_all(&buf).expect("send");
        }
        half.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    half
}

fn run(wait: Wait, cpus: (Option<usize>, Option<usize>), iters: usize) -> (f64, f64) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    let peer = std::thread::spawn(move || side(b, wait, cpus.1, iters, false));
    let mut h = side(a, wait, cpus.0, iters, true);
    peer.join().expect("peer");
    let h = &mut h[iters / 10..];
    h.sort_by(f64::total_cmp);
    (h[h.len() / 2], h[0])
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .map_or(50_000, |a| a.parse().expect("ITERS"));
    println!("wait   placement  half-RTT median µs  min µs");
    for (wn, wait) in [
        ("block", Wait::Block),
        ("spin", Wait::Spin),
        ("epoll", Wait::Epoll),
    ] {
        for (pn, cpus) in [
            ("free", (None, None)),
            ("same", (Some(0), Some(0))),
            ("cross", (Some(0), Some(1))),
        ] {
            if wait != Wait::Block && pn != "cross" {
                // Two spinners on one core take turns by time slice: milliseconds.
                continue;
            }
            let (med, min) = run(wait, cpus, iters);
            println!("{wn:<6} {pn:<10} {med:>18.2} {min:>7.2}");
        }
    }
}
