//! A peer that ends the TCP connection right behind an FPDU, as Linux siw did in
//! scripts/interop-siw.sh (reset-rping-guest-server: its last Write segments and the RST
//! for our ACK came back to back): the octets and the end of the stream are both in the
//! socket when its readiness is collected, one edge for both. The QP must still learn that
//! the stream ended and flush what is posted, rather than wait for an edge that never comes.
//!
//! The peer is a plain TCP socket speaking siw's wire bytes. No timing decides the outcome:
//! a tap holds the thread that runs the connection inside its read of one FPDU until the
//! peer's next FPDU and FIN (one segment: TCP_CORK) are in our socket, so every wake-up they
//! cause comes before the next epoll harvest; and the test polls its CQ only when it holds
//! completions (on an empty queue `Cq::poll` reads the sockets itself).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softrdma::*;
use util::setup;

mod util;

/// siw-rping.pcap frame 9 (as softrdma_wire's `SIW_RPING_REPLY`): MPA Reply, rev 2,
/// IRD 1 / ORD 1, no markers, no CRC.
const SIW_REPLY: [u8; 24] = [
    0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65,
    0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
];

/// siw-rping.pcap frame 11's FPDU: a Send (QN 0, MSN at octets 12..16, MO 0) of 16 octets
/// (rping's `rping_rdma_info`), CRC field zero.
fn send_fpdu(msn: u8) -> [u8; 40] {
    let mut f = [
        0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x39, 0x90, 0xb5, 0x03, 0x70, 0x51, 0xa1,
        0x6c, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    ];
    f[15] = msn;
    f
}

/// How long anything may take: it all follows at once; this only bounds a failure.
const DEADLINE: Duration = Duration::from_secs(10);

/// `/proc/net/tcp` shows the socket bound to `local` (IPv4) in CLOSE_WAIT: the peer's FIN,
/// and every octet before it, is in the socket.
fn in_close_wait(local: SocketAddr) -> bool {
    let SocketAddr::V4(a) = local else {
        return false;
    };
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(a.ip().octets()),
        a.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1] == want && f[3] == "08"
    })
}

/// The tap: once armed, the next read of received octets holds its thread (the one running
/// the connection) until the peer's last FPDU and FIN are in our socket.
#[derive(Default)]
struct HoldInRead {
    armed: AtomicBool,
    /// Tells the peer to send its last FPDU and FIN.
    go: Mutex<Option<mpsc::Sender<()>>>,
    /// The hold happened and ended with both in our socket.
    held: AtomicBool,
}

impl Tap for HoldInRead {
    fn tapped(&self, t: Tapped<'_>) {
        let Tapped::TcpData {
            local,
            dir: Direction::Received,
            ..
        } = t
        else {
            return;
        };
        if !self.armed.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Some(go) = self.go.lock().unwrap().take() {
            let _ = go.send(());
        }
        let deadline = Instant::now() + DEADLINE;
        while !in_close_wait(local) {
            if Instant::now() >= deadline {
                return;
            }
            std::thread::yield_now();
        }
        self.held.store(true, Ordering::Release);
    }
}

/// Waits for `n` completions, polling only a queue that holds some (not [`util::Side::wait`],
/// whose poll of an empty queue would read the sockets and hide the fault).
fn completions(cq: &Cq, ch: &CompletionChannel, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::with_capacity(n);
    loop {
        // Armed before looking: a completion after the look raises an event.
        cq.req_notify(false);
        let k = cq.len();
        if k > 0 {
            cq.poll(k, &mut out);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if out.len() >= n || ch.get_cq_event(Some(left)).is_none() {
            return out;
        }
    }
}

/// The peer's FPDU and its FIN arrive while the connection is still busy with the FPDU
/// before: both Sends complete, and the receive posted behind them is flushed (the stream
/// ended).
#[test]
fn end_of_stream_in_the_edge_of_the_last_fpdu_flushes() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // One side only: the peer is the plain socket above.
    let side = setup(Transport::Iwarp).channel().cqe(16).mr_len(96).side();
    let tap = Arc::new(HoldInRead::default());
    assert!(side.ctx.set_tap(tap.clone()));
    let (ch, cq, qp, mr) = (side.ch.as_ref().unwrap(), &side.cq, side.qp(), &side.mr);
    for i in 0..3u64 {
        qp.post_recv(RecvWr::new(i + 1, vec![mr.sge(32 * i as usize, 32)]))
            .unwrap();
    }

    let (connected, first) = mpsc::channel::<()>();
    let (go, last) = mpsc::channel::<()>();
    *tap.go.lock().unwrap() = Some(go);
    let (finished, done) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            // Our MPA Request: 20 octets, then PD_Length octets of private data.
            let mut head = [0u8; 20];
            sock.read_exact(&mut head).unwrap();
            let mut pd = vec![0u8; usize::from(u16::from_be_bytes([head[18], head[19]]))];
            sock.read_exact(&mut pd).unwrap();
            sock.write_all(&SIW_REPLY).unwrap();
            // Established on our side first: these FPDUs are data-path input.
            first.recv_timeout(DEADLINE).unwrap();
            sock.write_all(&send_fpdu(1)).unwrap();
            last.recv_timeout(DEADLINE).unwrap();
            socket2::SockRef::from(&sock).set_tcp_cork(true).unwrap();
            sock.write_all(&send_fpdu(2)).unwrap();
            // The FIN joins the corked FPDU's segment.
            sock.shutdown(Shutdown::Write).unwrap();
            // Open until the test has looked: a later RST would be a new edge and hide
            // the fault.
            let _ = done.recv_timeout(DEADLINE * 2);
        });
        let conn = qp.connect(
            addr,
            ConnectParams {
                ird: 1,
                ord: 1,
                ..ConnectParams::default()
            },
        );
        assert!(conn.is_ok(), "{conn:?}");
        tap.armed.store(true, Ordering::Release);
        connected.send(()).unwrap();
        let wcs = completions(cq, ch, 3);
        finished.send(()).unwrap();
        assert!(
            tap.held.load(Ordering::Acquire),
            "the FPDU and FIN were not in our socket while the read before them was held"
        );
        let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            got[..],
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::WorkRequestFlushed),
            ],
            "{wcs:?}"
        );
        for w in &wcs[..2] {
            assert_eq!((w.opcode, w.byte_len), (WcOpcode::Recv, 16), "{w:?}");
        }
    });
    assert_eq!(qp.state(), QpState::Error);
}
