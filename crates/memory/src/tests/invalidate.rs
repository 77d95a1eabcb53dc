//! Remote invalidation: IBA o9-5.2.2 rules 1–9 (IBT-o9-5.2.2), RFC 5040 §6 (RDMAP-106, -107,
//! -121).

use super::*;
use crate::{AccessError, InvalidateError, KeyState, MrFlags, MwType};

const R: Access = Access::REMOTE_READ;

fn fast(t: &KeyTable, pd: PdId, flags: MrFlags) -> Key {
    t.reg_mr_with(pd, Buffer::new(64), 0, 64, IOVA, all(), flags)
        .unwrap()
}

/// A fast-registered region of this PD is invalidated: Free, unusable, codes 0x09 on error.
#[test]
fn ibt_o9_5_2_2_success_fast_mr() {
    let t = KeyTable::with_seed(30);
    let k = fast(&t, PD, MrFlags::FAST_REG);
    let tg = t.check_remote(k, PD, QP, R, IOVA, 8).unwrap();
    t.invalidate_remote(k, PD, QP).unwrap();
    assert_eq!(t.state(k), KeyState::Free);
    assert_eq!(
        t.check_remote(k, PD, QP, R, IOVA, 8).unwrap_err(),
        AccessError::Invalidated
    );
    assert!(!tg.is_valid());
    // Already free: no state change, no error (IBA); the key stays Free.
    t.invalidate_remote(k, PD, QP).unwrap();
    assert_eq!(t.state(k), KeyState::Free);
}

/// Rule 1 (the key is not invalid) and rule 2 (not the reserved key): unknown, stale and
/// deregistered keys are refused.
#[test]
fn ibt_o9_5_2_2_rules_1_2_invalid_key() {
    let t = KeyTable::with_seed(31);
    let k = fast(&t, PD, MrFlags::FAST_REG);
    for bad in [stale(k), Key(0), Key::new(0, 0xff)] {
        let e = t.invalidate_remote(bad, PD, QP).unwrap_err();
        assert_eq!(e, InvalidateError::InvalidKey);
        assert_eq!(e.rdmap_code(), 0x09);
    }
    assert_eq!(t.state(k), KeyState::Valid);
    t.dereg_mr(k).unwrap();
    assert_eq!(
        t.invalidate_remote(k, PD, QP),
        Err(InvalidateError::InvalidKey)
    );
}

/// Rule 3: a region made by Register / Reregister Memory Region is not remotely invalidatable.
#[test]
fn ibt_o9_5_2_2_rule_3_plain_region() {
    let (t, _b, plain) = setup(64);
    let e = t.invalidate_remote(plain, PD, QP).unwrap_err();
    assert_eq!(e, InvalidateError::NotInvalidatable);
    assert_eq!(e.rdmap_code(), 0x09);
    assert_eq!(t.state(plain), KeyState::Valid);
    let f = fast(&t, PD, MrFlags::FAST_REG);
    let f = t.rereg_mr(f, PD, Buffer::new(8), 0, 8, 0, all()).unwrap();
    assert_eq!(
        t.invalidate_remote(f, PD, QP),
        Err(InvalidateError::NotInvalidatable)
    );
    assert_eq!(t.state(f), KeyState::Valid);
}

/// Rule 4 / RDMAP-121: a shared region can not be invalidated by a peer; it stays valid.
#[test]
fn ibt_o9_5_2_2_rule_4_rdmap_121_shared_region() {
    let t = KeyTable::with_seed(32);
    let k = fast(&t, PD, MrFlags::FAST_REG | MrFlags::SHARED);
    assert_eq!(
        t.invalidate_remote(k, PD, QP),
        Err(InvalidateError::NotInvalidatable)
    );
    assert_eq!(t.state(k), KeyState::Valid);
    t.check_remote(k, PD, QP, R, IOVA, 8).unwrap();
    // The owner may still invalidate it locally.
    t.invalidate_local(k, PD).unwrap();
}

/// Rule 5 / RDMAP-115: a region of another PD.
#[test]
fn ibt_o9_5_2_2_rule_5_region_other_pd() {
    let t = KeyTable::with_seed(33);
    let k = fast(&t, PD2, MrFlags::FAST_REG);
    assert_eq!(
        t.invalidate_remote(k, PD, QP),
        Err(InvalidateError::WrongPd)
    );
    assert_eq!(t.state(k), KeyState::Valid);
}

/// Rule 6: a type 1 window (bound or not).
#[test]
fn ibt_o9_5_2_2_rule_6_type1_window() {
    let (t, _b, mr) = setup(64);
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    assert_eq!(
        t.invalidate_remote(mw, PD, QP),
        Err(InvalidateError::NotInvalidatable)
    );
    let mw = t.bind_mw(mw, mr, QP, PD, IOVA, 8, R).unwrap();
    assert_eq!(
        t.invalidate_remote(mw, PD, QP),
        Err(InvalidateError::NotInvalidatable)
    );
    assert_eq!(t.state(mw), KeyState::Valid);
}

/// Rule 7: a valid type 2A window must be bound to the receiving QP.
#[test]
fn ibt_o9_5_2_2_rule_7_type2a_qp() {
    let (t, _b, mr) = setup(64);
    let mw = t.alloc_mw(PD, MwType::Type2A).unwrap();
    let mw = t.bind_mw(mw, mr, QP, PD, IOVA, 8, R).unwrap();
    let e = t.invalidate_remote(mw, PD, QP2).unwrap_err();
    assert_eq!(e, InvalidateError::WrongQp);
    assert_eq!(e.rdmap_code(), 0x09);
    assert_eq!(t.state(mw), KeyState::Valid);
    t.invalidate_remote(mw, PD, QP).unwrap();
    assert_eq!(t.state(mw), KeyState::Free);
    assert_eq!(
        t.check_remote(mw, PD, QP, R, IOVA, 8).unwrap_err(),
        AccessError::Invalidated
    );
}

/// Rule 8: a valid type 2B window must have the receiving QP's PD and QP.
#[test]
fn ibt_o9_5_2_2_rule_8_type2b_pd_and_qp() {
    let (t, _b, mr) = setup(64);
    let mw = t.alloc_mw(PD, MwType::Type2B).unwrap();
    let mw = t.bind_mw(mw, mr, QP, PD, IOVA, 8, R).unwrap();
    assert_eq!(
        t.invalidate_remote(mw, PD2, QP),
        Err(InvalidateError::WrongPd)
    );
    assert_eq!(
        t.invalidate_remote(mw, PD, QP2),
        Err(InvalidateError::WrongQp)
    );
    assert_eq!(
        t.invalidate_remote(mw, PD2, QP2),
        Err(InvalidateError::WrongPd)
    );
    assert_eq!(t.state(mw), KeyState::Valid);
    t.invalidate_remote(mw, PD, QP).unwrap();
    assert_eq!(t.state(mw), KeyState::Free);
}

/// Rule 9: a free type 2 window must have the receiving QP's PD; then nothing changes.
#[test]
fn ibt_o9_5_2_2_rule_9_free_type2_window() {
    let (t, _b, mr) = setup(64);
    for ty in [MwType::Type2A, MwType::Type2B] {
        let mw = t.alloc_mw(PD, ty).unwrap();
        assert_eq!(
            t.invalidate_remote(mw, PD2, QP),
            Err(InvalidateError::WrongPd)
        );
        t.invalidate_remote(mw, PD, QP2).unwrap();
        assert_eq!(t.state(mw), KeyState::Free);
        // Still bindable with the same key afterwards.
        t.bind_mw(mw, mr, QP, PD, IOVA, 8, R).unwrap();
    }
}

/// A refused invalidation never changes state: targets stay usable.
#[test]
fn failed_invalidation_changes_nothing() {
    let (t, b, mr) = setup(64);
    let mw = t.alloc_mw(PD, MwType::Type2B).unwrap();
    let mw = t
        .bind_mw(mw, mr, QP, PD, IOVA, 8, Access::REMOTE_WRITE)
        .unwrap();
    let tg = t
        .check_remote(mw, PD, QP, Access::REMOTE_WRITE, IOVA, 8)
        .unwrap();
    for (pd, qp) in [(PD2, QP), (PD, QP2)] {
        t.invalidate_remote(mw, pd, qp).unwrap_err();
    }
    t.invalidate_remote(mr, PD, QP).unwrap_err();
    tg.place(0, b"ok").unwrap();
    assert_eq!(&b.read()[..2], b"ok");
}
