//! Local Invalidate and Bind Memory Window as send-queue requests (IBA 10.6.7) over the
//! simulated network: in submission order, lossless and lossy, and their errors.

mod sim;

use sim::{Faults, Setup, Sim, summary};
use softrdma_ib::{MwBind, PostError, QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus};
use softrdma_memory::{Access, Key, KeyState, MwType, PdId};
use softrdma_testkit::pattern;

/// The window's index with another key octet (`ibv_inc_rkey`).
fn inc(k: Key) -> Key {
    k.next_consumer(1)
}

/// A region of node 0's buffer that windows may be bound to, and a type 2A window.
fn bindable(s: &Sim) -> (Key, Key) {
    let n = &s.n[0];
    let mr = n
        .keys
        .reg_mr(
            PdId(1),
            n.buf.clone(),
            0,
            1 << 16,
            0x10_0000,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND,
        )
        .unwrap();
    (mr, n.keys.alloc_mw(PdId(1), MwType::Type2A).unwrap())
}

/// A bind behind a Write runs once the Write is acknowledged, a Send after it leaves only
/// then, the peer writes through the new key, and a Local Invalidate ends that: with and
/// without loss.
#[test]
fn bind_and_invalidate_run_in_send_queue_order() {
    for (seed, faults) in [
        (1, Faults::default()),
        (2, Faults::loss(0.1)),
        (3, Faults::loss(0.1)),
    ] {
        let mut s = Sim::new(QpType::Rc, 1 << 17, &Setup::default(), faults, seed);
        let (mr, mw) = bindable(&s);
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        s.n[1]
            .qp
            .post_recv(RecvWr::new(9, vec![Sge::new(k1, 0, 64)]))
            .unwrap();
        s.n[0]
            .qp
            .post_send(SendWr::write(1, vec![Sge::new(k0, 0, 40_000)], k1, 4096))
            .unwrap();
        let new = inc(mw);
        let bind = MwBind {
            mw,
            new_rkey: new,
            mr,
            addr: 0x10_0000 + 8192,
            len: 4096,
            access: Access::REMOTE_WRITE,
        };
        s.n[0].qp.post_send(SendWr::bind_mw(2, bind)).unwrap();
        s.n[0]
            .qp
            .post_send(SendWr::send(3, vec![Sge::new(k0, 0, 8)]))
            .unwrap();
        assert_eq!(s.n[0].keys.state(mw), KeyState::Free, "seed {seed}");
        s.run_until(1_000_000, |s| s.n[0].sends.len() == 3);
        assert_eq!(
            summary(&s.n[0].sends),
            vec![
                (1, WcStatus::Success, WcOpcode::RdmaWrite),
                (2, WcStatus::Success, WcOpcode::BindMw),
                (3, WcStatus::Success, WcOpcode::Send)
            ],
            "seed {seed}"
        );
        assert_eq!(s.n[0].keys.state(new), KeyState::Valid);

        let data = pattern(64, seed);
        s.n[1].fill(1000, &data);
        s.n[1]
            .qp
            .post_send(SendWr::write(
                4,
                vec![Sge::new(k1, 1000, 64)],
                new,
                0x10_0000 + 8192,
            ))
            .unwrap();
        s.run_until(1_000_000, |s| !s.n[1].sends.is_empty());
        assert_eq!(s.n[1].sends[0].status, WcStatus::Success);
        assert_eq!(s.n[0].read(8192, 64), data);

        s.n[0].qp.post_send(SendWr::local_inv(5, new)).unwrap();
        assert_eq!(
            s.n[0].keys.state(new),
            KeyState::Free,
            "an idle queue runs it at once"
        );
        s.n[1]
            .qp
            .post_send(SendWr::write(
                6,
                vec![Sge::new(k1, 1000, 64)],
                new,
                0x10_0000 + 9000,
            ))
            .unwrap();
        s.run_until(1_000_000, |s| {
            s.n[1].sends.len() == 2 && s.n[0].sends.len() == 4
        });
        assert_eq!(s.n[0].sends[3].opcode, WcOpcode::LocalInv);
        assert_eq!(s.n[1].sends[1].status, WcStatus::RemoteAccess);
        assert!(s.n[0].read(9000, 64).iter().all(|&b| b == 0));
    }
}

/// A bind that breaks a rule completes with a bind error and the QP goes to Error (the
/// rest flushed); local requests on UD are refused.
#[test]
fn a_failed_bind_fails_the_queue_and_ud_refuses_local_requests() {
    let mut s = Sim::new(QpType::Rc, 1 << 17, &Setup::default(), Faults::default(), 4);
    let (mr, mw) = bindable(&s);
    let k0 = s.n[0].key;
    let bind = MwBind {
        mw,
        new_rkey: inc(mw),
        mr,
        addr: 0x10_0000,
        len: 1 << 20,
        access: Access::REMOTE_WRITE,
    };
    s.n[0].qp.post_send(SendWr::bind_mw(1, bind)).unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 0, 8)]))
        .unwrap();
    s.run_until(1_000_000, |s| s.n[0].sends.len() == 2);
    assert_eq!(
        summary(&s.n[0].sends),
        vec![
            (1, WcStatus::MwBind, WcOpcode::BindMw),
            (2, WcStatus::WorkRequestFlushed, WcOpcode::Send)
        ]
    );
    assert_eq!(s.n[0].keys.state(mw), KeyState::Free);

    let mut u = Sim::new(QpType::Ud, 1 << 16, &Setup::default(), Faults::default(), 5);
    let key = u.n[0].key;
    assert_eq!(
        u.n[0].qp.post_send(SendWr::local_inv(1, key)),
        Err(PostError::Unsupported)
    );
}
