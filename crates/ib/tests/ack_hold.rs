//! A responder's lone positive ACK may wait for the next packet its QP sends
//! (`IbQp::poll_transmit_holding`): the reply leaves first, the ACK right after it; an ACK
//! answering a duplicate, a NAK, or anything queued behind never waits.

mod sim;

use std::time::Instant;

use sim::{Node, Setup, connect};
use softrdma_ib::{QpAttr, QpState, QpType, RecvWr, SendWr, Sge, WcStatus};
use softrdma_wire::ib::{Operation, PacketRepr};

const GRH: [u8; 40] = [0; 40];

fn pair() -> [Node; 2] {
    let setup = Setup::default();
    let mut a = Node::new(QpType::Rc, 0x11, 1 << 16, 1);
    let mut b = Node::new(QpType::Rc, 0x22, 1 << 16, 2);
    connect(&mut a, 0, 0x22, &setup);
    connect(&mut b, 1, 0x11, &setup);
    [a, b]
}

/// Everything `from` sends with `hold`, as (operation, PSN, bytes).
fn drain(n: &mut Node, hold: bool) -> Vec<(Operation, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Some(tx) = n.qp.poll_transmit_holding(Instant::now(), &mut buf, hold) {
        let bytes = buf[..tx.len].to_vec();
        let p = PacketRepr::parse(&bytes).expect("our packets parse");
        out.push((p.bth.opcode.operation(), p.bth.psn, bytes));
    }
    out
}

fn deliver(to: &mut Node, pkts: &[(Operation, u32, Vec<u8>)]) {
    for (_, _, bytes) in pkts {
        let p = PacketRepr::parse(bytes).unwrap();
        to.qp.handle_packet(&p, &GRH, Instant::now());
    }
}

fn ops(pkts: &[(Operation, u32, Vec<u8>)]) -> Vec<Operation> {
    pkts.iter().map(|p| p.0).collect()
}

#[test]
fn a_lone_ack_waits_for_the_reply_and_follows_it() {
    let [mut a, mut b] = pair();
    let (ka, kb) = (a.key, b.key);
    b.qp.post_recv(RecvWr::new(1, vec![Sge::new(kb, 0, 64)]))
        .unwrap();
    a.qp.post_recv(RecvWr::new(2, vec![Sge::new(ka, 4096, 64)]))
        .unwrap();
    a.qp.post_send(SendWr::send(10, vec![Sge::new(ka, 0, 64)]))
        .unwrap();
    let ping = drain(&mut a, false);
    assert_eq!(ops(&ping), [Operation::SendOnly]);
    deliver(&mut b, &ping);
    let recv = b.qp.poll_recv_completion().expect("the Send completed");
    assert_eq!((recv.wr_id, recv.status), (1, WcStatus::Success));
    // Held: nothing leaves, and the QP says so.
    assert!(drain(&mut b, true).is_empty());
    assert!(b.qp.ack_held());
    // The reply goes first, then the ACK, in one flush without holding.
    b.qp.post_send(SendWr::send(20, vec![Sge::new(kb, 0, 64)]))
        .unwrap();
    let pong = drain(&mut b, false);
    assert_eq!(ops(&pong), [Operation::SendOnly, Operation::Acknowledge]);
    assert!(!b.qp.ack_held());
    deliver(&mut a, &pong);
    let s =
        a.qp.poll_send_completion()
            .expect("the ACK completes the Send");
    assert_eq!((s.wr_id, s.status), (10, WcStatus::Success));
    let r = a.qp.poll_recv_completion().expect("the reply arrived");
    assert_eq!((r.wr_id, r.status), (2, WcStatus::Success));
}

#[test]
fn a_held_ack_is_sent_by_the_next_flush_and_later_acks_replace_it() {
    let [mut a, mut b] = pair();
    let (ka, kb) = (a.key, b.key);
    for i in 0..3 {
        b.qp.post_recv(RecvWr::new(i, vec![Sge::new(kb, 0, 64)]))
            .unwrap();
    }
    for i in 0..3 {
        a.qp.post_send(SendWr::send(i, vec![Sge::new(ka, 0, 8)]))
            .unwrap();
        let p = drain(&mut a, false);
        deliver(&mut b, &p);
        assert!(drain(&mut b, true).is_empty(), "message {i}");
    }
    // One ACK for the three, of the last PSN.
    let acks = drain(&mut b, false);
    assert_eq!(ops(&acks), [Operation::Acknowledge]);
    assert!(!b.qp.ack_held());
    deliver(&mut a, &acks);
    let ids: Vec<u64> = std::iter::from_fn(|| a.qp.poll_send_completion())
        .map(|w| w.wr_id)
        .collect();
    assert_eq!(ids, [0, 1, 2]);
}

#[test]
fn acks_of_duplicates_and_naks_never_wait() {
    let [mut a, mut b] = pair();
    let (ka, kb) = (a.key, b.key);
    b.qp.post_recv(RecvWr::new(1, vec![Sge::new(kb, 0, 64)]))
        .unwrap();
    a.qp.post_send(SendWr::send(1, vec![Sge::new(ka, 0, 8)]))
        .unwrap();
    let p = drain(&mut a, false);
    deliver(&mut b, &p);
    assert!(drain(&mut b, true).is_empty());
    // The requester retries (its ACK timed out): the duplicate is answered at once.
    deliver(&mut b, &p);
    assert_eq!(ops(&drain(&mut b, true)), [Operation::Acknowledge]);
    assert!(!b.qp.ack_held());
    // A Write to a bad R_Key: the NAK leaves at once.
    a.qp.post_send(SendWr::write(
        2,
        vec![Sge::new(ka, 0, 8)],
        softrdma_memory::Key(0xdead_beef),
        0,
    ))
    .unwrap();
    let w = drain(&mut a, false);
    deliver(&mut b, &w);
    let naks = drain(&mut b, true);
    assert_eq!(ops(&naks), [Operation::Acknowledge]);
    let p = PacketRepr::parse(&naks[0].2).unwrap();
    assert!(!p.aeth.unwrap().syndrome.is_ack(), "{p:?}");
}

#[test]
fn a_read_response_is_never_held_and_error_state_holds_nothing() {
    let [mut a, mut b] = pair();
    let (ka, kb) = (a.key, b.key);
    a.qp.post_send(SendWr::read(1, Some(Sge::new(ka, 0, 32)), kb, 0))
        .unwrap();
    let r = drain(&mut a, false);
    deliver(&mut b, &r);
    assert_eq!(ops(&drain(&mut b, true)), [Operation::RdmaReadResponseOnly]);
    // A held ACK, then Error: ack_held turns false with the flush.
    b.qp.post_recv(RecvWr::new(1, vec![Sge::new(kb, 0, 64)]))
        .unwrap();
    a.qp.post_send(SendWr::send(2, vec![Sge::new(ka, 0, 8)]))
        .unwrap();
    let p = drain(&mut a, false);
    deliver(&mut b, &p);
    assert!(drain(&mut b, true).is_empty());
    assert!(b.qp.ack_held());
    b.qp.modify(&QpAttr {
        state: Some(QpState::Error),
        ..QpAttr::default()
    })
    .unwrap();
    assert!(!b.qp.ack_held());
}

/// A lone ACK waits behind the requests of its flush, but a stream of requests that never
/// pauses does not keep it back for longer than `ACK_WAITS_PACKETS` packets, held or not:
/// otherwise the peer's Sends would stay unretired while its replies keep coming, until its
/// send queue is full.
#[test]
fn a_lone_ack_lets_at_most_ack_waits_packets_requests_go_first() {
    use softrdma_ib::ACK_WAITS_PACKETS;
    for hold in [false, true] {
        let [mut a, mut b] = pair();
        let (ka, kb) = (a.key, b.key);
        b.qp.post_recv(RecvWr::new(1, vec![Sge::new(kb, 0, 64)]))
            .unwrap();
        a.qp.post_send(SendWr::send(10, vec![Sge::new(ka, 0, 64)]))
            .unwrap();
        let ping = drain(&mut a, false);
        deliver(&mut b, &ping);
        assert!(b.qp.ack_held());
        // A Write of many packets (PMTU 1024) queued behind the waiting ACK.
        let len = 1024 * (2 * ACK_WAITS_PACKETS + 8);
        b.qp.post_send(SendWr::write(20, vec![Sge::new(kb, 0, len)], ka, 0))
            .unwrap();
        let out = drain(&mut b, hold);
        let at = out
            .iter()
            .position(|p| p.0 == Operation::Acknowledge)
            .unwrap_or_else(|| panic!("hold {hold}: no ACK in {:?}", ops(&out)));
        assert_eq!(at as u32, ACK_WAITS_PACKETS, "hold {hold}: {:?}", ops(&out));
        assert_eq!(
            out.iter().filter(|p| p.0 == Operation::Acknowledge).count(),
            1
        );
        deliver(&mut a, &out);
        let s =
            a.qp.poll_send_completion()
                .expect("the ACK retired the Send");
        assert_eq!((s.wr_id, s.status), (10, WcStatus::Success));
    }
}
