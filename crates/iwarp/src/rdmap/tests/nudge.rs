//! The engine's own zero-length Write ([`RdmapEngine::nudge`](crate::rdmap::RdmapEngine::nudge)):
//! octets on the stream that every peer takes, invisible to the ULP.

use softrdma_memory::Access;
use softrdma_wire::rdmap::Opcode;

use super::pair::{Dir, Mr, PD, Pair, QP_A, QP_B, cfg, ddp_of};
use super::{flushed, ok};
use crate::rdmap::StreamState;
use crate::verbs_types::{PostError, RecvWr, SendWr, WcOpcode};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// RDMAP-40: the nudge is a zero-length RDMA Write to STag 0, TO 0, with Reads allowed or not
/// (ORD 0): the peer takes it without looking at the STag, the requests around it complete
/// as always and it completes to no one, on either side. No zero-length Read: Linux siw can
/// answer one with the octets of its own previous Read (see `RdmapEngine::nudge`).
#[test]
fn rdmap_40_a_nudge_is_a_zero_length_write_to_stag_0_that_completes_to_no_one() {
    for ord in [0, cfg(QP_A, 512).ord] {
        let mut a = cfg(QP_A, 512);
        a.ord = ord;
        let mut p = Pair::with(a, cfg(QP_B, 512));
        let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
        let dst = Mr::new(&p.kb, PD, 64, 0x2000, RW);
        let rbuf = Mr::new(&p.kb, PD, 64, 0x3000, Access::LOCAL_WRITE);
        p.b.post_recv(RecvWr::new(7, vec![rbuf.sge(0, 64)]))
            .unwrap();
        p.b.post_recv(RecvWr::new(8, vec![rbuf.sge(0, 64)]))
            .unwrap();
        p.a.post_send(SendWr::send(1, vec![src.sge(0, 8)])).unwrap();
        assert!(p.a.nudge());
        p.a.post_send(SendWr::write(2, vec![src.sge(0, 16)], dst.key, dst.iova))
            .unwrap();
        p.a.post_send(SendWr::send(3, vec![src.sge(8, 4)])).unwrap();
        assert_eq!(p.a.sq_len(), 3, "the nudge is not the ULP's");
        p.drive();
        assert!(p.sent_op(Dir::AtoB, Opcode::RdmaReadRequest).is_empty());
        let writes = p.sent_op(Dir::AtoB, Opcode::RdmaWrite);
        let empty: Vec<_> = writes.iter().filter(|w| w.len() == 14).collect();
        assert_eq!(empty.len(), 1, "ORD {ord}: one zero-length Write");
        let softrdma_wire::ddp::Repr::Tagged { stag, to, last, .. } = ddp_of(empty[0]) else {
            panic!("tagged")
        };
        assert_eq!((stag, to, last), (0, 0, true));
        assert_eq!(
            p.cq_a(),
            vec![
                ok(1, WcOpcode::Send, 8),
                ok(2, WcOpcode::RdmaWrite, 16),
                ok(3, WcOpcode::Send, 4),
            ]
        );
        assert_eq!(
            p.cq_b(),
            vec![ok(7, WcOpcode::Recv, 8), ok(8, WcOpcode::Recv, 4)]
        );
        assert!(p.events_b().is_empty());
        assert_eq!(p.a.sq_len(), 0);
        assert_eq!(
            (p.a.state(), p.b.state()),
            (StreamState::Rts, StreamState::Rts)
        );
    }
}

/// The nudge takes no place of the ULP's: a full queue is full with the ULP's requests.
#[test]
fn a_nudge_takes_no_place_in_the_send_queue() {
    let mut a = cfg(QP_A, 512);
    a.sq_depth = 2;
    let mut p = Pair::with(a, cfg(QP_B, 512));
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    assert!(p.a.nudge());
    let dst = Mr::new(&p.kb, PD, 64, 0x2000, RW);
    for id in 1..=2 {
        p.a.post_send(SendWr::write(id, vec![src.sge(0, 8)], dst.key, dst.iova))
            .unwrap();
    }
    assert_eq!(
        p.a.post_send(SendWr::write(3, vec![src.sge(0, 8)], dst.key, dst.iova)),
        Err(PostError::QueueFull)
    );
    p.drive();
    assert_eq!(
        p.cq_a(),
        vec![ok(1, WcOpcode::RdmaWrite, 8), ok(2, WcOpcode::RdmaWrite, 8)]
    );
}

/// A nudge caught by the end of the stream is flushed with the rest, and still completes
/// to no one.
#[test]
fn a_flushed_nudge_completes_to_no_one() {
    let mut p = Pair::new(512);
    let src = Mr::new(&p.ka, PD, 64, 0x1000, Access::empty());
    assert!(p.a.nudge());
    p.a.post_send(SendWr::send(1, vec![src.sge(0, 8)])).unwrap();
    p.a.local_catastrophic();
    assert_eq!(p.cq_a(), vec![flushed(1, WcOpcode::Send)]);
    assert_eq!(p.a.sq_len(), 0);
    assert!(!p.a.nudge(), "no nudge once the stream stopped");
}
