//! Linux siw's accept race (6.12, `siw_accept`), played by a hand-made responder: it sends
//! its MPA Reply, then leaves what arrives in its socket unread until more octets come, as
//! siw does when our first FPDU lands before it has moved the socket's receive upcall to
//! the QP. Our initiator's QP notices the silence and sends its zero-length Write to STag 0
//! (`RdmapEngine::nudge`); the responder then reads everything and answers. Without the
//! nudge the exchange never ends (the responder's read times out and the test fails).

mod util;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use softrdma::*;
use softrdma_iwarp::connection::{ConnEvent, Connection, ConnectionConfig};
use softrdma_iwarp::rdmap::QpConfig;
use softrdma_iwarp::startup::{Role, StartupConfig};
use softrdma_memory::KeyTable;
use softrdma_wire::rdmap::{MASK_OPCODE, Opcode};
use util::{TIMEOUT, setup};

/// Safety net for every blocking wait.
const PD: PdId = PdId(1);
const IOVA: u64 = 0x10_0000;

/// Octets of the FPDU at the head of `b` (length, ULPDU, PAD, CRC), once its length is in.
fn fpdu_len(b: &[u8]) -> Option<usize> {
    let ulpdu = usize::from(u16::from_be_bytes([*b.first()?, *b.get(1)?]));
    Some((2 + ulpdu).next_multiple_of(4) + 4)
}

fn read_more(s: &mut TcpStream, into: &mut Vec<u8>) {
    let mut b = [0u8; 4096];
    let n = s.read(&mut b).expect("the responder's read timed out");
    assert!(n > 0, "the initiator closed early");
    into.extend_from_slice(&b[..n]);
}

/// Writes everything the connection has to send.
fn flush(conn: &mut Connection, s: &mut TcpStream) {
    let mut out = Vec::new();
    conn.poll_transmit(&mut out);
    s.write_all(&out).unwrap();
}

/// The responder: MPA startup, then the race, then one Send answered with "pong".
/// Returns the opcode of the first ULPDU after the initiator's first FPDU.
fn stuck_responder(l: TcpListener, done: std::sync::mpsc::Receiver<()>) -> Option<Opcode> {
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(*TIMEOUT)).unwrap();
    let keys = Arc::new(KeyTable::with_seed(7));
    let buf = Buffer::new(4096);
    let key = keys
        .reg_mr(PD, buf.clone(), 0, 4096, IOVA, Access::LOCAL_WRITE)
        .unwrap();
    let now = Instant::now();
    let cfg = ConnectionConfig::new(
        Role::Responder,
        StartupConfig::default(),
        QpConfig::new(PD, QpId(1)),
        1460,
    );
    let mut conn = Connection::new(cfg, keys, now).unwrap();
    conn.engine_mut()
        .post_recv(RecvWr::new(1, vec![Sge::new(key, IOVA, 64)]))
        .unwrap();
    // The MPA Request, and our Reply.
    let mut b = Vec::new();
    while !conn.has_event() {
        b.clear();
        read_more(&mut s, &mut b);
        conn.handle_input(now, &b);
    }
    assert!(matches!(
        conn.poll_event(),
        Some(ConnEvent::ConnectRequest { .. })
    ));
    conn.accept(&[], 16, 16).unwrap();
    flush(&mut conn, &mut s);
    // The race: the initiator's first FPDU sits in the socket, unread, until more comes.
    let mut held = Vec::new();
    while fpdu_len(&held).is_none_or(|n| held.len() < n) {
        read_more(&mut s, &mut held);
    }
    let first = fpdu_len(&held).unwrap();
    while held.len() <= first + 3 {
        read_more(&mut s, &mut held);
    }
    // The octets that woke us: an FPDU's length, then its ULPDU's DDP and RDMAP control.
    let next = Opcode::try_from(held[first + 3] & MASK_OPCODE).ok();
    // Now we read: the Send (and the Write behind it) go to the QP.
    conn.handle_input(now, &held);
    let wc = loop {
        flush(&mut conn, &mut s);
        if let Some(wc) = conn.engine_mut().poll_completion() {
            break wc;
        }
        b.clear();
        read_more(&mut s, &mut b);
        conn.handle_input(now, &b);
    };
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 4)
    );
    let mut ping = [0u8; 4];
    buf.copy_out(0, &mut ping).unwrap();
    assert_eq!(ping, *b"ping");
    buf.copy_in(100, b"pong").unwrap();
    conn.engine_mut()
        .post_send(SendWr::send(2, vec![Sge::new(key, IOVA + 100, 4)]))
        .unwrap();
    flush(&mut conn, &mut s);
    // Until the initiator has its answer.
    let _ = done.recv_timeout(*TIMEOUT);
    next
}

/// With Reads allowed or not (ORD 0, as perftest's handshake connection asks) the nudge is a
/// zero-length Write to STag 0: never a zero-length Read, which Linux siw can answer with
/// the length of its own Read crossing it.
#[test]
fn a_responder_that_leaves_our_first_fpdu_unread_is_nudged() {
    for (ord, nudge) in [(16, Opcode::RdmaWrite), (0, Opcode::RdmaWrite)] {
        nudged(ord, nudge);
    }
}

fn nudged(ord: u16, nudge: Opcode) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let responder = std::thread::spawn(move || stuck_responder(l, done_rx));

    // One side only: the responder is the hand-made one above.
    let side = setup(Transport::Iwarp).cqe(64).mr_len(64).side();
    let (cq, qp, mr) = (&side.cq, side.qp(), &side.mr);
    mr.copy_in(0, b"ping").unwrap();
    qp.connect(
        addr,
        ConnectParams {
            ord,
            ..ConnectParams::default()
        },
    )
    .unwrap();
    qp.post_recv(RecvWr::new(10, vec![mr.sge(32, 32)])).unwrap();
    qp.post_send(SendWr::send(11, vec![mr.sge(0, 4)]).with_flags(SendFlags::SIGNALED))
        .unwrap();
    let mut wcs = Vec::new();
    let deadline = Instant::now() + *TIMEOUT;
    while wcs.len() < 2 && Instant::now() < deadline {
        cq.wait(2 - wcs.len(), 2, *TIMEOUT, &mut wcs).unwrap();
    }
    let mut ids: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    ids.sort_by_key(|&(id, _)| id);
    assert_eq!(
        ids,
        [(10, WcStatus::Success), (11, WcStatus::Success)],
        "the Send and the answer, and nothing of the nudge"
    );
    assert_eq!(mr.to_vec()[32..36], *b"pong");
    done_tx.send(()).unwrap();
    assert_eq!(responder.join().unwrap(), Some(nudge), "ORD {ord}");
    // The nudge completes to no one: nothing more completes.
    wcs.clear();
    cq.poll(4, &mut wcs);
    assert!(wcs.is_empty(), "{wcs:?}");
}
