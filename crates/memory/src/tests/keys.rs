//! Key layout, allocation, reuse, unpredictability.

use std::collections::HashSet;

use super::*;
use crate::{AccessError, KeyState, MemError};

#[test]
fn key_layout() {
    let k = Key::new(0x12_3456, 0xab);
    assert_eq!(k.0, 0x1234_56ab);
    assert_eq!(k.index(), 0x12_3456);
    assert_eq!(k.consumer(), 0xab);
    assert_eq!(Key::new(0xff12_3456, 1).index(), 0x12_3456);
    assert_eq!(format!("{k}"), "0x123456ab");
    assert_eq!(format!("{k:?}"), "Key(0x123456ab)");
}

/// RDMAP-118: create and revoke the binding of a buffer to an STag and TO range.
#[test]
fn rdmap_118_register_deregister() {
    let (t, _buf, k) = setup(4096);
    assert_eq!(t.state(k), KeyState::Valid);
    assert_eq!(t.len(), 1);
    assert!(
        t.check_remote(k, PD, QP, Access::REMOTE_WRITE, IOVA, 4096)
            .is_ok()
    );
    t.dereg_mr(k).unwrap();
    assert_eq!(t.state(k), KeyState::Invalid);
    assert!(t.is_empty());
    assert_eq!(
        t.check_remote(k, PD, QP, Access::REMOTE_WRITE, IOVA, 1)
            .unwrap_err(),
        AccessError::InvalidKey
    );
    assert_eq!(t.dereg_mr(k), Err(MemError::InvalidKey));
}

#[test]
fn registration_validation() {
    let t = KeyTable::with_seed(1);
    let b = Buffer::new(100);
    assert_eq!(
        t.reg_mr(PD, b.clone(), 50, 51, 0, Access::empty()),
        Err(MemError::OutOfRange)
    );
    assert_eq!(
        t.reg_mr(PD, b.clone(), usize::MAX, 2, 0, Access::empty()),
        Err(MemError::OutOfRange)
    );
    assert_eq!(
        t.reg_mr(PD, b.clone(), 0, 100, u64::MAX - 98, Access::empty()),
        Err(MemError::Wrap)
    );
    // Ending exactly at 2^64 is fine.
    t.reg_mr(PD, b.clone(), 0, 100, u64::MAX - 99, Access::empty())
        .unwrap();
    // Remote write / atomic need local write (IBA verbs rule).
    for a in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC] {
        assert_eq!(
            t.reg_mr(PD, b.clone(), 0, 1, 0, a),
            Err(MemError::InvalidAccess)
        );
    }
    t.reg_mr(PD, b.clone(), 0, 0, 0, Access::REMOTE_READ)
        .unwrap();
    t.reg_mr(PD, b, 100, 0, 0, Access::REMOTE_READ).unwrap();
}

/// A freed index is reused only with a different consumer key; the stale key stays dead.
#[test]
fn freed_index_reused_with_different_consumer_key() {
    // Limit 2: at most two slots, one of which may be the reserved index 0.
    for seed in 0..50 {
        let t = KeyTable::with_seed_and_limit(seed, 2);
        let b = Buffer::new(64);
        let mut last = t.reg_mr(PD, b.clone(), 0, 64, 0, all()).unwrap();
        let mut seen = HashSet::new();
        for _ in 0..20 {
            t.dereg_mr(last).unwrap();
            let k = t.reg_mr(PD, b.clone(), 0, 64, 0, all()).unwrap();
            if k.index() == last.index() {
                assert_ne!(k.consumer(), last.consumer());
            }
            assert_eq!(t.state(last), KeyState::Invalid);
            assert_eq!(
                t.check_remote(last, PD, QP, Access::REMOTE_READ, 0, 1)
                    .unwrap_err(),
                AccessError::InvalidKey
            );
            seen.insert(k.consumer());
            last = k;
        }
        assert!(seen.len() > 5, "consumer keys vary on reuse");
    }
}

#[test]
fn table_full() {
    let t = KeyTable::with_seed_and_limit(7, 5);
    let mut n = 0;
    while t.alloc_mw(PD, crate::MwType::Type1).is_ok() {
        n += 1;
        assert!(n <= 5);
    }
    assert!(n >= 4);
    assert_eq!(
        t.alloc_mw(PD, crate::MwType::Type1),
        Err(MemError::TableFull)
    );
}

/// RDMAP-122: STag values are hard to predict: random consumer key byte, scattered indices,
/// different tables give different keys; index 0 (reserved) is never handed out.
#[test]
fn rdmap_122_keys_unpredictable() {
    let n = 512;
    let t = KeyTable::new();
    let keys: Vec<Key> = (0..n)
        .map(|_| t.alloc_mw(PD, crate::MwType::Type1).unwrap())
        .collect();
    let distinct: HashSet<u32> = keys.iter().map(|k| k.0).collect();
    assert_eq!(distinct.len(), n);
    assert!(keys.iter().all(|k| k.index() != 0));
    let consumers: HashSet<u8> = keys.iter().map(|k| k.consumer()).collect();
    assert!(consumers.len() > 150, "consumer bytes: {}", consumers.len());
    let sequential = keys
        .windows(2)
        .filter(|w| w[1].index().abs_diff(w[0].index()) <= 1)
        .count();
    assert!(sequential < n / 20, "{sequential} sequential indices");
    // Indices use the high bits of the 24-bit space, not just the bottom.
    assert!(keys.iter().any(|k| k.index() > 0x80_0000));
    let t2 = KeyTable::new();
    let keys2: Vec<Key> = (0..16)
        .map(|_| t2.alloc_mw(PD, crate::MwType::Type1).unwrap())
        .collect();
    assert_ne!(&keys[..16], &keys2[..]);
    // Seeded tables are reproducible (for tests only).
    let a = KeyTable::with_seed(3).alloc_mw(PD, crate::MwType::Type1);
    let b = KeyTable::with_seed(3).alloc_mw(PD, crate::MwType::Type1);
    assert_eq!(a, b);
}

#[test]
fn reserved_index_zero_is_invalid() {
    let (t, _b, _k) = setup(64);
    for c in 0..=255u8 {
        assert_eq!(t.state(Key::new(0, c)), KeyState::Invalid);
    }
}

#[test]
fn wrong_type_errors() {
    let (t, _b, mr) = setup(64);
    let mw = t.alloc_mw(PD, crate::MwType::Type1).unwrap();
    assert_eq!(t.dereg_mr(mw), Err(MemError::WrongType));
    assert_eq!(t.dealloc_mw(mr), Err(MemError::WrongType));
    assert_eq!(
        t.bind_mw(mr, mr, QP, PD, IOVA, 1, Access::REMOTE_READ),
        Err(MemError::WrongType)
    );
    assert_eq!(
        t.bind_mw(mw, mw, QP, PD, IOVA, 1, Access::REMOTE_READ),
        Err(MemError::WrongType)
    );
    assert_eq!(
        t.rereg_mr(mw, PD, Buffer::new(1), 0, 1, 0, Access::empty()),
        Err(MemError::WrongType)
    );
    t.dealloc_mw(mw).unwrap();
    assert_eq!(t.dealloc_mw(mw), Err(MemError::InvalidKey));
    assert_eq!(t.len(), 1);
}
