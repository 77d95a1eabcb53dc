//! Memory windows: allocation, bind rules, consumer key bumps, QP binding (RDMAP-116).

use super::*;
use crate::{AccessError, KeyState, MemError, MwType};

const R: Access = Access::REMOTE_READ;
const W: Access = Access::REMOTE_WRITE;

#[test]
fn alloc_is_free_and_unusable() {
    let (t, _b, _mr) = setup(4096);
    for ty in [MwType::Type1, MwType::Type2A, MwType::Type2B] {
        let mw = t.alloc_mw(PD, ty).unwrap();
        assert_eq!(t.state(mw), KeyState::Free);
        assert_eq!(
            t.check_remote(mw, PD, QP, R, IOVA, 1).unwrap_err(),
            AccessError::Invalidated
        );
    }
}

#[test]
fn bind_rules() {
    let t = KeyTable::with_seed(20);
    let b = Buffer::new(4096);
    let mr = t.reg_mr(PD, b.clone(), 0, 4096, IOVA, all()).unwrap();
    let no_bind = t.reg_mr(PD, b.clone(), 0, 4096, IOVA, remote_rw()).unwrap();
    let no_lw = t
        .reg_mr(PD, b.clone(), 0, 4096, IOVA, R | Access::MW_BIND)
        .unwrap();
    let mr_pd2 = t.reg_mr(PD2, b.clone(), 0, 4096, IOVA, all()).unwrap();
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    let bind = |mw, mr, pd, iova, len, acc| t.bind_mw(mw, mr, QP, pd, iova, len, acc);
    assert_eq!(bind(mw, no_bind, PD, IOVA, 8, R), Err(MemError::Rights));
    assert_eq!(bind(mw, no_lw, PD, IOVA, 8, W), Err(MemError::Rights));
    assert_eq!(
        bind(mw, no_lw, PD, IOVA, 8, Access::REMOTE_ATOMIC),
        Err(MemError::Rights)
    );
    // An MR without remote rights of its own may still expose a window (IBA rule).
    let wk = bind(mw, no_lw, PD, IOVA, 8, R).unwrap();
    assert_eq!(
        t.check_remote(no_lw, PD, QP, W, IOVA, 8).unwrap_err(),
        AccessError::Rights
    );
    let mw = wk;
    assert_eq!(bind(mw, mr_pd2, PD, IOVA, 8, R), Err(MemError::WrongPd));
    assert_eq!(bind(mw, mr_pd2, PD2, IOVA, 8, R), Err(MemError::WrongPd));
    assert_eq!(bind(mw, mr, PD2, IOVA, 8, R), Err(MemError::WrongPd));
    assert_eq!(bind(mw, mr, PD, IOVA - 1, 8, R), Err(MemError::OutOfRange));
    assert_eq!(
        bind(mw, mr, PD, IOVA + 4089, 8, R),
        Err(MemError::OutOfRange)
    );
    assert_eq!(bind(mw, mr, PD, u64::MAX, 2, R), Err(MemError::Wrap));
    assert_eq!(
        bind(mw, mr, PD, IOVA, 8, Access::LOCAL_WRITE),
        Err(MemError::InvalidAccess)
    );
    assert_eq!(
        bind(mw, mr, PD, IOVA, 8, Access::MW_BIND),
        Err(MemError::InvalidAccess)
    );
    assert_eq!(
        bind(stale(mw), mr, PD, IOVA, 8, R),
        Err(MemError::InvalidKey)
    );
    assert_eq!(
        bind(mw, stale(mr), PD, IOVA, 8, R),
        Err(MemError::InvalidKey)
    );
    // The whole MR exactly.
    let k = bind(mw, mr, PD, IOVA, 4096, R | W).unwrap();
    t.check_remote(k, PD, QP, W, IOVA, 4096).unwrap();
    // Binding to an invalidated fast MR fails.
    let fast = t.reg_fast_mr(PD, b, 0, 64, 0, all()).unwrap();
    t.invalidate_local(fast, PD).unwrap();
    assert_eq!(bind(k, fast, PD, 0, 8, R), Err(MemError::WrongState));
}

/// Bind returns a new consumer key; the old one is dead (consumer-key mismatch after rebind).
#[test]
fn rebind_bumps_consumer_key() {
    let (t, b, mr) = setup(4096);
    let mw0 = t.alloc_mw(PD, MwType::Type1).unwrap();
    let mw1 = t.bind_mw(mw0, mr, QP, PD, IOVA, 64, R | W).unwrap();
    assert_eq!(mw1.index(), mw0.index());
    assert_ne!(mw1.consumer(), mw0.consumer());
    assert_eq!(t.state(mw0), KeyState::Invalid);
    let tg1 = t.check_remote(mw1, PD, QP, W, IOVA, 8).unwrap();
    let mw2 = t.bind_mw(mw1, mr, QP, PD, IOVA + 64, 64, R).unwrap();
    assert_ne!(mw2.consumer(), mw1.consumer());
    assert_eq!(
        t.check_remote(mw1, PD, QP, R, IOVA, 8).unwrap_err(),
        AccessError::InvalidKey
    );
    // A target checked through the old binding is revoked.
    assert_eq!(tg1.place(0, b"x").unwrap_err(), AccessError::Invalidated);
    assert_eq!(b.read()[0], 0);
    // The new binding covers only its own range and rights.
    t.check_remote(mw2, PD, QP, R, IOVA + 64, 64).unwrap();
    assert_eq!(
        t.check_remote(mw2, PD, QP, R, IOVA, 8).unwrap_err(),
        AccessError::Bounds
    );
    assert_eq!(
        t.check_remote(mw2, PD, QP, W, IOVA + 64, 8).unwrap_err(),
        AccessError::Rights
    );
    // Zero-length bind of a type 1 window.
    let mw3 = t.bind_mw(mw2, mr, QP, PD, IOVA, 0, R).unwrap();
    t.check_remote(mw3, PD, QP, R, IOVA, 0).unwrap();
    assert_eq!(
        t.check_remote(mw3, PD, QP, R, IOVA, 1).unwrap_err(),
        AccessError::Bounds
    );
}

/// Window placement lands at the right buffer offset (MR at an offset inside its buffer).
#[test]
fn window_translation() {
    let t = KeyTable::with_seed(21);
    let b = Buffer::new(8192);
    let mr = t
        .reg_mr(PD, b.clone(), 1000, 5000, 0x10_0000, all())
        .unwrap();
    let mw = t.alloc_mw(PD, MwType::Type2B).unwrap();
    let mw = t.bind_mw(mw, mr, QP, PD, 0x10_0000 + 300, 100, W).unwrap();
    let tg = t.check_remote(mw, PD, QP, W, 0x10_0000 + 350, 4).unwrap();
    assert_eq!(tg.buffer_offset(), 1350);
    tg.place(0, b"abcd").unwrap();
    assert_eq!(&b.read()[1350..1354], b"abcd");
}

/// RDMAP-116: a QP-bound (type 2) STag is unusable from any other stream; type 1 is not
/// QP-bound.
#[test]
fn rdmap_116_qp_bound_windows() {
    let (t, _b, mr) = setup(4096);
    for ty in [MwType::Type2A, MwType::Type2B] {
        let mw = t.alloc_mw(PD, ty).unwrap();
        let mw = t.bind_mw(mw, mr, QP, PD, IOVA, 64, R | W).unwrap();
        t.check_remote(mw, PD, QP, W, IOVA, 64).unwrap();
        let e = t.check_remote(mw, PD, QP2, W, IOVA, 64).unwrap_err();
        assert_eq!(e, AccessError::NotBoundToQp);
        assert_eq!(e.rdmap_code(), 0x03);
        assert_eq!(e.ddp_tagged_code(), Some(0x02));
        assert_eq!(
            t.check_remote(mw, PD2, QP, W, IOVA, 64).unwrap_err(),
            AccessError::WrongPd
        );
    }
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    let mw = t.bind_mw(mw, mr, QP, PD, IOVA, 64, R).unwrap();
    t.check_remote(mw, PD, QP2, R, IOVA, 64).unwrap();
}

/// Type 2 windows bind only from Free; local invalidation returns them to Free.
#[test]
fn type2_bind_needs_free_state() {
    let (t, _b, mr) = setup(4096);
    let mw = t.alloc_mw(PD, MwType::Type2A).unwrap();
    let k = t.bind_mw(mw, mr, QP, PD, IOVA, 64, R).unwrap();
    assert_eq!(t.state(k), KeyState::Valid);
    assert_eq!(
        t.bind_mw(k, mr, QP, PD, IOVA, 64, R),
        Err(MemError::WrongState)
    );
    assert_eq!(t.invalidate_local(k, PD2), Err(MemError::WrongPd));
    t.invalidate_local(k, PD).unwrap();
    assert_eq!(t.state(k), KeyState::Free);
    assert_eq!(t.invalidate_local(k, PD), Err(MemError::WrongState));
    assert_eq!(
        t.check_remote(k, PD, QP, R, IOVA, 1).unwrap_err(),
        AccessError::Invalidated
    );
    let k2 = t.bind_mw(k, mr, QP2, PD, IOVA, 8, R).unwrap();
    assert_ne!(k2, k);
    t.check_remote(k2, PD, QP2, R, IOVA, 8).unwrap();
    t.dealloc_mw(k2).unwrap();
    assert_eq!(t.state(k2), KeyState::Invalid);
    assert_eq!(
        t.check_remote(k2, PD, QP2, R, IOVA, 8).unwrap_err(),
        AccessError::InvalidKey
    );
}

#[test]
fn invalidate_local_rules() {
    let (t, _b, plain) = setup(4096);
    let t1 = t.alloc_mw(PD, MwType::Type1).unwrap();
    assert_eq!(
        t.invalidate_local(plain, PD),
        Err(MemError::NotInvalidatable)
    );
    assert_eq!(t.invalidate_local(t1, PD), Err(MemError::NotInvalidatable));
    assert_eq!(
        t.invalidate_local(stale(plain), PD),
        Err(MemError::InvalidKey)
    );
    let fast = t.reg_fast_mr(PD, Buffer::new(64), 0, 64, 0, all()).unwrap();
    assert_eq!(t.invalidate_local(fast, PD2), Err(MemError::WrongPd));
    t.invalidate_local(fast, PD).unwrap();
    assert_eq!(t.state(fast), KeyState::Free);
    assert_eq!(t.invalidate_local(fast, PD), Err(MemError::WrongState));
}

/// Windows die with their region: dereg, rereg and invalidation of the MR revoke them.
#[test]
fn windows_follow_their_region() {
    let t = KeyTable::with_seed(22);
    let b = Buffer::new(4096);
    for action in 0..3 {
        let mr = t.reg_fast_mr(PD, b.clone(), 0, 4096, IOVA, all()).unwrap();
        let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
        let mw = t.bind_mw(mw, mr, QP, PD, IOVA, 64, W).unwrap();
        let tg = t.check_remote(mw, PD, QP, W, IOVA, 8).unwrap();
        match action {
            0 => t.dereg_mr(mr).unwrap(),
            1 => {
                t.rereg_mr(mr, PD, b.clone(), 0, 4096, IOVA, all()).unwrap();
            }
            _ => t.invalidate_local(mr, PD).unwrap(),
        }
        assert_eq!(
            t.check_remote(mw, PD, QP, W, IOVA, 8).unwrap_err(),
            AccessError::Invalidated,
            "action {action}"
        );
        assert_eq!(tg.place(0, b"x").unwrap_err(), AccessError::Invalidated);
        assert!(!tg.is_valid());
        t.dealloc_mw(mw).unwrap();
    }
    assert!(b.read().iter().all(|&x| x == 0));
}
