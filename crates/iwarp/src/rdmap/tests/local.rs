//! Local Invalidate and Bind Memory Window as send-queue requests: they run on this side's
//! key table in submission order and send nothing.

use softrdma_memory::{Access, Key, KeyState, MwType};
use softrdma_wire::rdmap::Opcode;

use super::pair::{Dir, Mr, PD, Pair, QP_A, opcode_of};
use super::{flushed, ok, wc};
use crate::rdmap::QpEvent;
use crate::verbs_types::{MwBind, RecvWr, SendWr, WcOpcode, WcStatus};
use softrdma_testkit::pattern;

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// The window's index with another key octet (`ibv_inc_rkey`).
fn inc(k: Key) -> Key {
    k.next_consumer(1)
}

/// A bind of window `mw` to `len` octets at `off` in `mr`, remote write, with the next key.
fn write_window(mw: Key, mr: &Mr, off: u64, len: u64) -> MwBind {
    MwBind {
        mw,
        new_rkey: inc(mw),
        mr: mr.key,
        addr: mr.iova + off,
        len,
        access: Access::REMOTE_WRITE,
    }
}

/// RDMAP-118: a bind posted behind a Read waits for it; the Send posted after the bind
/// leaves only once the bind ran, and the peer can write through the new key (not the old
/// one).
#[test]
fn rdmap_118_a_bind_runs_after_earlier_requests_and_before_later_ones() {
    let mut p = Pair::new(512);
    let mr = Mr::new(&p.ka, PD, 8192, 0x10_0000, RW | Access::MW_BIND);
    let mw = p.ka.alloc_mw(PD, MwType::Type2A).unwrap();
    let rsrc = Mr::new(&p.kb, PD, 4096, 0x1000, Access::REMOTE_READ);
    let sink = Mr::new(&p.ka, PD, 4096, 0x2000, Access::LOCAL_WRITE);
    let msg = Mr::new(&p.ka, PD, 16, 0x3000, Access::empty());
    let rbuf = Mr::new(&p.kb, PD, 16, 0x4000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(0, vec![rbuf.sge(0, 16)]))
        .unwrap();
    p.a.post_send(SendWr::read(
        1,
        Some(sink.sge(0, 4096)),
        rsrc.key,
        rsrc.iova,
    ))
    .unwrap();
    let new = inc(mw);
    let bind = write_window(mw, &mr, 4096, 4096);
    p.a.post_send(SendWr::bind_mw(2, bind)).unwrap();
    p.a.post_send(SendWr::send(3, vec![msg.sge(0, 16)]))
        .unwrap();
    assert_eq!(
        p.ka.state(mw),
        KeyState::Free,
        "not before the Read completed"
    );
    p.burst = 1;
    p.drive();
    let pos = |op: Opcode| p.wire.iter().position(|(_, u)| opcode_of(u) == Some(op));
    assert!(pos(Opcode::Send).unwrap() > pos(Opcode::RdmaReadResponse).unwrap());
    assert_eq!(
        p.cq_a(),
        vec![
            ok(1, WcOpcode::RdmaRead, 4096),
            ok(2, WcOpcode::BindMw, 0),
            ok(3, WcOpcode::Send, 16)
        ]
    );
    assert_eq!(p.ka.state(new), KeyState::Valid);
    assert_eq!(
        p.ka.state(mw),
        KeyState::Invalid,
        "the old key names nothing now"
    );

    let src = Mr::new(&p.kb, PD, 64, 0x5000, Access::empty());
    src.put(0, &pattern(64, 2));
    p.b.post_send(SendWr::write(4, vec![src.sge(0, 64)], new, mr.iova + 4096))
        .unwrap();
    p.drive();
    assert_eq!(
        p.cq_b(),
        vec![ok(0, WcOpcode::Recv, 16), ok(4, WcOpcode::RdmaWrite, 64)]
    );
    assert!(mr.bytes()[4096..4096 + 64] == pattern(64, 2)[..]);
    assert!(mr.bytes()[..4096].iter().all(|&b| b == 0));
    mr.assert_guards_intact();
}

/// RDMAP-120: a Local Invalidate posted behind a Write waits until the Write completed,
/// then revokes the window: the peer's Write through it is refused (DDP tagged 0x00) and
/// places nothing.
#[test]
fn rdmap_120_a_local_invalidate_revokes_in_order() {
    let mut p = Pair::new(256);
    let mr = Mr::new(&p.ka, PD, 4096, 0x10_0000, RW | Access::MW_BIND);
    let mw = p.ka.alloc_mw(PD, MwType::Type2A).unwrap();
    let key =
        p.ka.bind_mw(mw, mr.key, QP_A, PD, mr.iova, 4096, Access::REMOTE_WRITE)
            .unwrap();
    let src = Mr::new(&p.ka, PD, 4000, 0x2000, Access::empty());
    let dst = Mr::new(&p.kb, PD, 4000, 0x3000, RW);
    p.a.post_send(SendWr::write(1, vec![src.sge(0, 4000)], dst.key, dst.iova))
        .unwrap();
    p.a.post_send(SendWr::local_inv(2, key)).unwrap();
    assert_eq!(
        p.ka.state(key),
        KeyState::Valid,
        "not before the Write completed"
    );
    p.drive();
    assert_eq!(
        p.cq_a(),
        vec![
            ok(1, WcOpcode::RdmaWrite, 4000),
            ok(2, WcOpcode::LocalInv, 0)
        ]
    );
    assert_eq!(p.ka.state(key), KeyState::Free);

    let from = Mr::new(&p.kb, PD, 8, 0x4000, Access::empty());
    p.b.post_send(SendWr::write(3, vec![from.sge(0, 8)], key, mr.iova))
        .unwrap();
    p.drive();
    let t = p.a.terminate_sent().expect("Terminate");
    assert_eq!(t.code.parts(), (1, 1, 0x00));
    assert!(mr.bytes().iter().all(|&b| b == 0));
    mr.assert_guards_intact();
}

/// A local request posted to an empty queue runs before `post_send` returns, unsignaled
/// ones complete silently, and one posted to a dead stream is flushed.
#[test]
fn local_requests_on_an_idle_queue_run_at_once() {
    let mut p = Pair::new(256);
    let mr = Mr::new(&p.ka, PD, 4096, 0x10_0000, RW | Access::MW_BIND);
    let mw = p.ka.alloc_mw(PD, MwType::Type2B).unwrap();
    let bind = write_window(mw, &mr, 0, 4096);
    let quiet = crate::verbs_types::SendFlags::empty();
    p.a.post_send(SendWr::bind_mw(1, bind).with_flags(quiet))
        .unwrap();
    assert_eq!(p.ka.state(inc(mw)), KeyState::Valid);
    p.a.post_send(SendWr::local_inv(2, inc(mw))).unwrap();
    assert_eq!(p.ka.state(inc(mw)), KeyState::Free);
    assert_eq!(p.cq_a(), vec![ok(2, WcOpcode::LocalInv, 0)]);
    assert!(p.sent(Dir::AtoB).is_empty(), "nothing on the wire");
    p.a.close();
    p.a.post_send(SendWr::local_inv(3, inc(mw))).unwrap();
    assert_eq!(p.cq_a(), vec![flushed(3, WcOpcode::LocalInv)]);
}

/// A bind that breaks a rule (the region lacks MW_BIND) completes with a bind error, the
/// requests after it are flushed, and the stream ends with a Local Catastrophic Terminate;
/// an invalidation of a plain region's key completes with a local protection error.
#[test]
fn failed_local_requests_complete_in_error_and_end_the_stream() {
    for bad_bind in [true, false] {
        let mut p = Pair::new(256);
        let mr = Mr::new(&p.ka, PD, 4096, 0x10_0000, RW);
        let mw = p.ka.alloc_mw(PD, MwType::Type2A).unwrap();
        let msg = Mr::new(&p.ka, PD, 16, 0x3000, Access::empty());
        let (req, status, op) = if bad_bind {
            let bind = write_window(mw, &mr, 0, 64);
            (SendWr::bind_mw(1, bind), WcStatus::MwBind, WcOpcode::BindMw)
        } else {
            (
                SendWr::local_inv(1, mr.key),
                WcStatus::LocalProtection,
                WcOpcode::LocalInv,
            )
        };
        p.a.post_send(SendWr::send(0, vec![msg.sge(0, 16)]))
            .unwrap();
        p.a.post_send(req).unwrap();
        p.a.post_send(SendWr::send(2, vec![msg.sge(0, 16)]))
            .unwrap();
        p.drive();
        assert_eq!(
            p.cq_a(),
            vec![
                ok(0, WcOpcode::Send, 16),
                wc(1, status, op, 0),
                flushed(2, WcOpcode::Send)
            ]
        );
        let t = *p.a.terminate_sent().expect("Terminate");
        assert_eq!(t.code.parts().0, 0, "RDMAP layer, local catastrophic");
        let ev = p.events_a();
        assert!(matches!(ev[..], [QpEvent::LocalError(_), ..]), "{ev:?}");
        assert_eq!(p.ka.state(mw), KeyState::Free);
        assert_eq!(p.sent_op(Dir::AtoB, Opcode::Send).len(), 1);
    }
}

/// A Send posted right after a bind that ran at once goes out.
#[test]
fn a_send_after_a_bind_that_ran_at_once_goes_out() {
    let mut p = Pair::new(256);
    let mr = Mr::new(&p.ka, PD, 4096, 0x10_0000, RW | Access::MW_BIND);
    let mw = p.ka.alloc_mw(PD, MwType::Type2A).unwrap();
    let msg = Mr::new(&p.ka, PD, 16, 0x3000, Access::empty());
    let rbuf = Mr::new(&p.kb, PD, 16, 0x4000, Access::LOCAL_WRITE);
    p.b.post_recv(RecvWr::new(0, vec![rbuf.sge(0, 16)]))
        .unwrap();
    let bind = write_window(mw, &mr, 0, 64);
    p.a.post_send(SendWr::bind_mw(1, bind)).unwrap();
    p.a.post_send(SendWr::send(2, vec![msg.sge(0, 16)]))
        .unwrap();
    p.drive();
    assert_eq!(
        p.cq_a(),
        vec![ok(1, WcOpcode::BindMw, 0), ok(2, WcOpcode::Send, 16)]
    );
    assert_eq!(p.cq_b(), vec![ok(0, WcOpcode::Recv, 16)]);
}
