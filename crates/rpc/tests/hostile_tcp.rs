//! A hostile client of the RPC/TCP server stalls, exhausts or locks out no one: clients
//! that never read their replies, thousands of connections, records that never end, idle
//! connections, a pipeline of slow calls. Beside each attack a legitimate client is served.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use softrdma_rpc::record::encode_record;
use softrdma_rpc::*;

const PROG: u32 = 0x2000_0002;
/// What a legitimate call may take before the test fails; served calls take milliseconds
/// (the figures are printed), a stalled server never answers.
const LEGIT: Duration = Duration::from_secs(10);
const LONG: Duration = Duration::from_secs(30);

mod proc {
    pub const NULL: u32 = 0;
    /// 1 MiB of results, as an NFS READ.
    pub const BIG: u32 = 1;
    /// Waits at the gate, then records its turn.
    pub const SLOW: u32 = 2;
    /// Records its turn.
    pub const MARK: u32 = 3;
}

#[derive(Default)]
struct Turns {
    /// (gate open, calls of SLOW inside)
    gate: Mutex<(bool, usize)>,
    cv: Condvar,
    /// Procedures in the order they ran after the gate opened.
    log: Mutex<Vec<u32>>,
}

fn program(t: Arc<Turns>) -> impl Program {
    move |ctx: &CallContext<'_>, _: &[u8]| -> Result<Vec<u8>, ProcError> {
        match ctx.header.proc {
            proc::NULL => Ok(vec![]),
            proc::BIG => Ok(vec![0x5A; 1 << 20]),
            proc::SLOW => {
                let mut g = t.gate.lock();
                g.1 += 1;
                t.cv.notify_all();
                while !g.0 {
                    t.cv.wait(&mut g);
                }
                drop(g);
                t.log.lock().push(proc::SLOW);
                Ok(vec![])
            }
            proc::MARK => {
                t.log.lock().push(proc::MARK);
                Ok(vec![])
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

struct Rig {
    server: Arc<Server>,
    tcp: TcpServer,
    turns: Arc<Turns>,
}

fn rig(cfg: ServerConfig) -> Rig {
    let turns = Arc::new(Turns::default());
    let mut reg = Registry::new();
    reg.register(PROG, 1, program(turns.clone()));
    let server = Arc::new(Server::new(reg, cfg));
    let tcp = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    Rig { server, tcp, turns }
}

/// A call record of `proc`.
fn call(xid: u32, proc: u32) -> Vec<u8> {
    let msg = common::call_msg(PROG, xid, proc, &[]);
    let mut rec = Vec::new();
    encode_record(&[&msg], usize::MAX, &mut rec);
    rec
}

/// A legitimate client's calls are answered, each within [`LEGIT`]: the slowest is returned.
fn legit(addr: SocketAddr, calls: usize) -> Duration {
    let c = Client::connect_tcp(addr).unwrap();
    let mut worst = Duration::ZERO;
    for i in 0..calls {
        let p = if i % 4 == 3 { proc::BIG } else { proc::NULL };
        let t = Instant::now();
        let r = c.call_timeout(PROG, 1, p, &[], LEGIT);
        assert!(r.is_ok(), "legitimate call {i} ({p}): {r:?}");
        worst = worst.max(t.elapsed());
    }
    worst
}

/// Waits (up to [`LONG`]) for `f` to hold.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + LONG;
    while !f() {
        assert!(Instant::now() < end, "never: {what}");
        std::thread::yield_now();
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The tests read process-wide figures (descriptors, threads, RSS): one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether the peer has closed `s` (an end or a reset), without waiting.
fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    s.set_nonblocking(false).unwrap();
    match r {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// F1: a client that sends many 1 MiB calls and never reads its socket holds no worker:
/// others are served meanwhile, and it is disconnected once it has taken nothing for
/// `send_timeout`.
#[test]
fn a_client_that_reads_no_replies_stalls_no_one() {
    let _one = SERIAL.lock();
    let r = rig(ServerConfig {
        send_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let addr = r.tcp.local_addr();
    let mut attackers = Vec::new();
    for c in 0..3u32 {
        let mut s = TcpStream::connect(addr).unwrap();
        let wire: Vec<u8> = (0..32).flat_map(|i| call(c << 16 | i, proc::BIG)).collect();
        s.write_all(&wire).unwrap();
        attackers.push(s);
    }
    // Every one of their calls has been run, its reply queued or in a socket buffer.
    until("the attackers' calls answered", || {
        r.tcp.stats().in_flight.load(Ordering::Relaxed) == 0 && r.tcp.queued() > 0
    });
    let worst = legit(addr, 40);
    println!("slowest legitimate call beside 3 non-reading clients: {worst:?}");
    // Disconnected, their replies dropped.
    until("the non-reading clients disconnected", || {
        r.tcp.stats().stalled_closed.load(Ordering::Relaxed) == 3 && r.tcp.queued() == 0
    });
    // Their connections are ended: what is left in the socket buffers, then the end.
    for mut s in attackers {
        s.set_read_timeout(Some(LONG)).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    legit(addr, 8);
}

/// F2: 2,000 connections come and go, and the server's descriptors go with them.
#[test]
fn descriptors_do_not_outlive_their_connections() {
    let _one = SERIAL.lock();
    let r = rig(ServerConfig::default());
    let addr = r.tcp.local_addr();
    legit(addr, 1);
    let before = open_fds();
    for i in 0..2000u32 {
        let mut s = TcpStream::connect(addr).unwrap();
        if i % 10 == 0 {
            // Some make a call, some just leave.
            s.write_all(&call(i, proc::NULL)).unwrap();
            let mut b = [0u8; 64];
            s.set_read_timeout(Some(LONG)).unwrap();
            assert!(s.read(&mut b).unwrap() > 0);
        }
    }
    until("every connection accepted and closed", || {
        r.tcp.stats().accepted.load(Ordering::Relaxed) == 2001
            && r.tcp.stats().open.load(Ordering::Relaxed) == 0
    });
    until("the server's descriptors back to where they were", || {
        open_fds() <= before + 4
    });
    legit(addr, 4);
}

/// F3: a thousand connections each holding most of a 1 MiB record that never ends: the
/// server holds no thread per connection and at most `max_assembling` octets of them, the
/// connections holding the oldest records closed; a legitimate client is served.
#[test]
fn a_thousand_unfinished_records_are_bounded() {
    let _one = SERIAL.lock();
    const BUDGET: usize = 64 << 20;
    let r = rig(ServerConfig {
        max_assembling: BUDGET,
        max_connections_per_addr: 2000,
        max_connections: 2000,
        ..ServerConfig::default()
    });
    let addr = r.tcp.local_addr();
    let threads = common::proc_status("Threads:");
    let rss = common::proc_status("VmRSS:") << 10;
    let chunk = vec![0xEEu8; 512 << 10];
    let mut held = Vec::new();
    for _ in 0..1000 {
        let mut s = TcpStream::connect(addr).unwrap();
        // A 1 MiB record: its mark and half of it. The server may close an older
        // connection while this one writes, never this one.
        s.write_all(&(0x8000_0000u32 | 1 << 20).to_be_bytes())
            .unwrap();
        s.write_all(&chunk).unwrap();
        held.push(s);
    }
    let keep = BUDGET / chunk.len();
    until("every partial record read", || {
        r.tcp.stats().assembling_closed.load(Ordering::Relaxed) >= 1000 - keep
    });
    let st = r.tcp.stats();
    assert!(st.assembling.load(Ordering::Relaxed) <= BUDGET);
    // The newest records are the ones kept.
    assert!(!is_closed(&held[999]));
    assert!(is_closed(&held[0]));
    let worst = legit(addr, 20);
    println!("slowest legitimate call beside 1,000 unfinished records: {worst:?}");
    let grown = common::proc_status("Threads:").saturating_sub(threads);
    assert!(grown <= 4, "{grown} threads more with 1,000 connections");
    let rss_grown = (common::proc_status("VmRSS:") << 10).saturating_sub(rss);
    // The budget, the kernel's socket buffers are not ours; allocator slack beside it.
    assert!(rss_grown < 4 * BUDGET, "RSS grew {} MiB", rss_grown >> 20);
    drop(held);
    until("the closed connections gone", || {
        r.tcp.stats().open.load(Ordering::Relaxed) == 0
    });
    assert_eq!(r.tcp.stats().assembling.load(Ordering::Relaxed), 0);
}

/// Connections per address and in all are bounded: a new one closes the least recently
/// active one, so a flood of idle connections locks no one out; idle ones are closed after
/// `idle_timeout`.
#[test]
fn connection_limits_close_the_least_active() {
    let _one = SERIAL.lock();
    for (per_addr, all) in [(100, 4), (4, 100)] {
        let r = rig(ServerConfig {
            max_connections_per_addr: per_addr,
            max_connections: all,
            idle_timeout: Duration::from_secs(3600),
            ..ServerConfig::default()
        });
        let addr = r.tcp.local_addr();
        let idle: Vec<TcpStream> = (0..30).map(|_| TcpStream::connect(addr).unwrap()).collect();
        until("30 accepted", || {
            r.tcp.stats().accepted.load(Ordering::Relaxed) == 30
        });
        assert_eq!(r.tcp.stats().open.load(Ordering::Relaxed), 4);
        assert_eq!(r.tcp.stats().evicted.load(Ordering::Relaxed), 26);
        // The oldest were closed, the newest kept.
        until("the oldest closed", || {
            is_closed(&idle[0]) && is_closed(&idle[25])
        });
        assert!(idle[26..].iter().all(|s| !is_closed(s)));
        // A new client gets in (and closes the least active of the idle ones).
        legit(addr, 4);
        assert!(is_closed(&idle[26]) || r.tcp.stats().evicted.load(Ordering::Relaxed) == 27);
    }

    let r = rig(ServerConfig {
        idle_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    });
    let mut s = TcpStream::connect(r.tcp.local_addr()).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut b = [0u8; 1];
    let t = Instant::now();
    assert_eq!(s.read(&mut b).unwrap_or(0), 0, "closed idle");
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert_eq!(r.tcp.stats().idle_closed.load(Ordering::Relaxed), 1);
}

/// F11: two connections pipeline 64 slow calls each; a third client's call runs in its
/// turn, not behind all 128 (the pool takes one call of each connection in turn).
#[test]
fn connections_take_turns_on_the_pool() {
    let _one = SERIAL.lock();
    let r = rig(ServerConfig {
        threads: 1,
        ..ServerConfig::default()
    });
    let addr = r.tcp.local_addr();
    let mut attackers = Vec::new();
    for c in 0..2u32 {
        let mut s = TcpStream::connect(addr).unwrap();
        let wire: Vec<u8> = (0..64)
            .flat_map(|i| call(c << 16 | i, proc::SLOW))
            .collect();
        s.write_all(&wire).unwrap();
        attackers.push(s);
    }
    // One call inside the handler, every other one read and waiting for the pool.
    {
        let mut g = r.turns.gate.lock();
        while g.1 < 1 {
            assert!(!r.turns.cv.wait_for(&mut g, LONG).timed_out());
        }
    }
    until("128 calls read", || {
        r.tcp.stats().in_flight.load(Ordering::Relaxed) == 128
    });
    let c = Client::connect_tcp(addr).unwrap();
    let p = c.start(PROG, 1, proc::MARK, &[]).unwrap();
    until("the third client's call read", || {
        r.tcp.stats().in_flight.load(Ordering::Relaxed) == 129
    });
    r.turns.gate.lock().0 = true;
    r.turns.cv.notify_all();
    p.wait_timeout(LEGIT).unwrap();
    let log = r.turns.log.lock().clone();
    let at = log.iter().position(|&p| p == proc::MARK).unwrap();
    // The call inside, then at most one of each attacker's.
    assert!(at <= 3, "ran after {at} slow calls");
    drop(attackers);
    let _ = &r.server;
}

/// Replies the server cannot deliver do not grow without bound: a reply past `max_queued`
/// closes its connection.
#[test]
fn queued_replies_have_a_budget() {
    let _one = SERIAL.lock();
    let r = rig(ServerConfig {
        max_queued: 8 << 20,
        send_timeout: Duration::from_secs(3600),
        ..ServerConfig::default()
    });
    let addr = r.tcp.local_addr();
    let mut attackers = Vec::new();
    for c in 0..4u32 {
        let mut s = TcpStream::connect(addr).unwrap();
        let wire: Vec<u8> = (0..64).flat_map(|i| call(c << 16 | i, proc::BIG)).collect();
        s.write_all(&wire).unwrap();
        attackers.push(s);
    }
    until("the overflowing connections closed", || {
        r.tcp.stats().stalled_closed.load(Ordering::Relaxed) >= 1
    });
    assert!(r.tcp.queued() <= 8 << 20);
    legit(addr, 8);
    drop(attackers);
}
