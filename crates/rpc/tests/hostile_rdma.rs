//! A hostile RPC-over-RDMA requester (a raw iWARP peer over TCP, MPA rev 1) that offers
//! Read chunks and never answers the RDMA Reads: the server ends the connection after
//! `read_chunk_timeout` and gives the chunk buffers back; a legitimate client is served
//! throughout. Idle RDMA connections end after `idle_timeout`, and connections per address
//! are bounded.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use softrdma::{Device, Listener};
use softrdma_rpc::rdma::{RdmaConfig, RdmaServer, RdmaTransport};
use softrdma_rpc::*;
use softrdma_wire::mpa::{FpduRepr, REQUEST_KEY};

const PROG: u32 = 0x2000_0003;
const LONG: Duration = Duration::from_secs(30);

/// A raw iWARP requester: MPA rev 1 without Markers, RDMAP Sends, nothing else.
struct RawPeer {
    s: TcpStream,
    crc: bool,
    msn: u32,
}

impl RawPeer {
    fn connect(addr: SocketAddr) -> RawPeer {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        // RFC 5044 §7.1: key, M C R Res, Rev 1, PD_Length 0.
        let mut req = REQUEST_KEY.to_vec();
        req.extend_from_slice(&[0, 1, 0, 0]);
        s.write_all(&req).unwrap();
        let mut reply = [0u8; 20];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[..16], b"MPA ID Rep Frame");
        let pd = u16::from_be_bytes([reply[18], reply[19]]) as usize;
        let mut skip = vec![0u8; pd];
        s.read_exact(&mut skip).unwrap();
        RawPeer {
            s,
            crc: reply[16] & 0x40 != 0,
            msn: 1,
        }
    }

    /// An untagged RDMAP Send on queue 0 (RFC 5041 §4.4, RFC 5040 §4.3) carrying `msg`.
    fn send(&mut self, msg: &[u8]) {
        let mut ulpdu = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
        ulpdu.extend_from_slice(&self.msn.to_be_bytes());
        ulpdu.extend_from_slice(&0u32.to_be_bytes());
        ulpdu.extend_from_slice(msg);
        self.msn += 1;
        let f = FpduRepr::new(&ulpdu, self.crc);
        let mut buf = vec![0u8; f.buffer_len()];
        f.emit(&mut buf).unwrap();
        self.s.write_all(&buf).unwrap();
    }

    /// Reads (and ignores: no Read Response ever) until the server ends the connection.
    fn wait_end(&mut self) {
        let mut b = vec![0u8; 64 << 10];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    panic!("the server kept the connection for {LONG:?}")
                }
                Err(_) => return,
            }
        }
    }
}

/// An RDMA_MSG carrying a call of `proc` whose argument (`len` octets) is a Read chunk.
fn call_with_read_chunk(xid: u32, proc: u32, len: u32) -> Vec<u8> {
    let call = common::call_msg(PROG, xid, proc, &[]);
    let mut m = Vec::new();
    for w in [xid, 1, 32, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    // One Read segment at the end of the call: position, handle, length, offset.
    for w in [1, call.len() as u32, 0x1234_5678, len] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m.extend_from_slice(&0u64.to_be_bytes());
    // End of the Read list, no Write list, no Reply chunk.
    for w in [0u32, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m.extend_from_slice(&call);
    m
}

struct Rig {
    server: Arc<Server>,
    srv: RdmaServer,
    _sctx: softrdma::Context,
}

fn rig(scfg: ServerConfig) -> Rig {
    let mut reg = Registry::new();
    reg.register(PROG, 1, |_: &CallContext<'_>, args: &[u8]| {
        Ok::<_, ProcError>((args.len() as u32).to_be_bytes().to_vec())
    });
    let server = Arc::new(Server::new(reg, scfg));
    let sctx = Device::tcp().open().unwrap();
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let srv = server
        .serve_rdma(
            &sctx,
            l,
            RdmaConfig {
                max_message: 2 << 20,
                ..RdmaConfig::default()
            },
        )
        .unwrap();
    Rig {
        server,
        srv,
        _sctx: sctx,
    }
}

/// A legitimate client's call with a 256 KiB argument (a Read chunk) is answered.
fn legit(addr: SocketAddr) {
    let ctx = Device::tcp().open().unwrap();
    let c = Client::new(
        Arc::new(RdmaTransport::connect(&ctx, addr, RdmaConfig::default()).unwrap()),
        4,
    );
    let arg = vec![7u8; 256 << 10];
    let r = c
        .call_timeout(PROG, 1, 1, &arg, Duration::from_secs(10))
        .unwrap();
    assert_eq!(r.results, (arg.len() as u32).to_be_bytes());
}

/// One test at a time: one reads the process's RSS.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// F4: eight requesters each offer 32 calls of 1 MiB Read chunks and answer no Read. Their
/// connections end after `read_chunk_timeout`, the leased buffers go back, and a
/// legitimate client is served meanwhile.
#[test]
fn unanswered_read_chunks_end_their_connection() {
    let _one = SERIAL.lock();
    let r = rig(ServerConfig {
        read_chunk_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let addr = r.srv.local_addr();
    legit(addr);
    let rss = common::proc_status("VmRSS:");
    let mut peers: Vec<RawPeer> = (0..8).map(|_| RawPeer::connect(addr)).collect();
    for p in &mut peers {
        for i in 0..32 {
            p.send(&call_with_read_chunk(0x100 + i, 1, 1 << 20));
        }
    }
    legit(addr);
    let t = Instant::now();
    for p in &mut peers {
        p.wait_end();
    }
    println!("connections ended {:?} after the attack", t.elapsed());
    assert_eq!(
        r.server.rdma_stats().read_timeouts.load(Ordering::Relaxed),
        8
    );
    legit(addr);
    // 256 MiB were leased: what is left is what the pool keeps for the next calls.
    let kept = ServerConfig::default().kept_octets >> 10;
    let grown = common::proc_status("VmRSS:").saturating_sub(rss);
    assert!(grown < kept + (64 << 10), "RSS grew {} MiB", grown >> 10);
}

/// An RDMA connection with nothing to do ends after `idle_timeout`; connections from one
/// address past `max_connections_per_addr` close the least recently active.
#[test]
fn idle_and_surplus_rdma_connections_end() {
    let _one = SERIAL.lock();
    let r = rig(ServerConfig {
        idle_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let mut p = RawPeer::connect(r.srv.local_addr());
    p.wait_end();
    assert_eq!(r.server.rdma_stats().idle_closed.load(Ordering::Relaxed), 1);

    let r = rig(ServerConfig {
        max_connections_per_addr: 3,
        ..ServerConfig::default()
    });
    let addr = r.srv.local_addr();
    let mut peers: Vec<RawPeer> = (0..6).map(|_| RawPeer::connect(addr)).collect();
    // Each new one past three closed the oldest of the address.
    for p in &mut peers[..3] {
        p.wait_end();
    }
    legit(addr);
}
