//! RDMAP-120: once a revoking call returns, the network can no longer touch the buffer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use super::*;
use crate::{AccessError, MwType, Target};

const W: Access = Access::REMOTE_WRITE;

fn write_target(t: &KeyTable, k: Key) -> Target {
    t.check_remote(k, PD, QP, W, IOVA, 8).unwrap()
}

/// Every revoking operation revokes targets issued before it.
#[test]
fn rdmap_120_every_revocation_kills_old_targets() {
    type Revoke = fn(&KeyTable, Key, Key);
    let cases: [(&str, Revoke); 7] = [
        ("dereg", |t, mr, _| t.dereg_mr(mr).unwrap()),
        ("rereg", |t, mr, _| {
            t.rereg_mr(mr, PD, Buffer::new(8), 0, 8, IOVA, all())
                .unwrap();
        }),
        ("invalidate_local", |t, mr, _| {
            t.invalidate_local(mr, PD).unwrap()
        }),
        ("invalidate_remote", |t, mr, _| {
            t.invalidate_remote(mr, PD, QP).unwrap()
        }),
        ("window invalidate_remote", |t, _, mw| {
            t.invalidate_remote(mw, PD, QP).unwrap()
        }),
        ("window dealloc", |t, _, mw| t.dealloc_mw(mw).unwrap()),
        ("window invalidate_local", |t, _, mw| {
            t.invalidate_local(mw, PD).unwrap()
        }),
    ];
    for (name, revoke) in cases {
        let t = KeyTable::with_seed(40);
        let b = Buffer::new(4096);
        let mr = t.reg_fast_mr(PD, b.clone(), 0, 4096, IOVA, all()).unwrap();
        let mw = t.alloc_mw(PD, MwType::Type2A).unwrap();
        let mw = t
            .bind_mw(
                mw,
                mr,
                QP,
                PD,
                IOVA,
                64,
                W | Access::REMOTE_ATOMIC | Access::REMOTE_READ,
            )
            .unwrap();
        let via_mr = write_target(&t, mr);
        let via_mw = write_target(&t, mw);
        let atomic = t
            .check_remote(mw, PD, QP, Access::REMOTE_ATOMIC, IOVA, 8)
            .unwrap();
        let read = t
            .check_remote(mw, PD, QP, Access::REMOTE_READ, IOVA, 8)
            .unwrap();
        via_mr.place(0, b"a").unwrap();
        via_mw.place(1, b"b").unwrap();
        revoke(&t, mr, mw);
        let window_only = name.starts_with("window");
        assert_eq!(via_mr.is_valid(), window_only, "{name}");
        assert!(!via_mw.is_valid(), "{name}");
        assert_eq!(
            via_mw.place(0, b"X").unwrap_err(),
            AccessError::Invalidated,
            "{name}"
        );
        assert_eq!(
            via_mw.write_with(0, 1, |_| ()).unwrap_err(),
            AccessError::Invalidated
        );
        assert_eq!(
            atomic.fetch_add(0, 1).unwrap_err(),
            AccessError::Invalidated
        );
        assert_eq!(
            atomic.compare_swap(0, 0, 1).unwrap_err(),
            AccessError::Invalidated
        );
        let mut out = [0u8; 1];
        assert_eq!(
            read.copy_out(0, &mut out).unwrap_err(),
            AccessError::Invalidated
        );
        if !window_only {
            assert_eq!(via_mr.place(0, b"X").unwrap_err(), AccessError::Invalidated);
        }
        assert_eq!(&b.read()[..3], b"ab\0", "{name}");
    }
}

/// Revoke while a Write is in flight: later segments are rejected and the memory does not
/// change after the revoke call returns.
#[test]
fn rdmap_120_revoke_during_placement() {
    for round in 0..4 {
        let t = KeyTable::with_seed(41 + round);
        let b = Buffer::new(4096);
        let mr = t.reg_mr(PD, b.clone(), 0, 4096, IOVA, all()).unwrap();
        let tg = t.check_remote(mr, PD, QP, W, IOVA, 4096).unwrap();
        let placed = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut i = 1u64;
                let mut refused = 0;
                while !stop.load(Ordering::Acquire) || refused == 0 {
                    let seg = [i as u8; 512];
                    match tg.place(((i % 8) * 512) as usize, &seg) {
                        Ok(()) => {
                            placed.store(i, Ordering::Release);
                        }
                        Err(e) => {
                            assert_eq!(e, AccessError::Invalidated);
                            refused += 1;
                        }
                    }
                    i += 1;
                }
                refused
            });
            while placed.load(Ordering::Acquire) < 50 {
                thread::yield_now();
            }
            t.dereg_mr(mr).unwrap();
            let snapshot = b.read().to_vec();
            thread::sleep(Duration::from_millis(2));
            stop.store(true, Ordering::Release);
            assert!(writer.join().unwrap() > 0);
            assert_eq!(&b.read()[..], &snapshot[..], "memory changed after dereg");
        });
    }
}

/// A user holding a buffer guard may revoke while a placement waits for that buffer: no
/// deadlock (lock order buffer -> table), and the waiting placement is refused.
#[test]
fn rdmap_120_revoke_while_user_holds_guard() {
    let (t, b, mr) = setup(4096);
    let tg = write_target(&t, mr);
    let guard = b.write();
    thread::scope(|s| {
        let h = s.spawn(|| tg.place(0, b"late"));
        thread::sleep(Duration::from_millis(10));
        t.dereg_mr(mr).unwrap();
        drop(guard);
        assert_eq!(h.join().unwrap().unwrap_err(), AccessError::Invalidated);
    });
    assert!(b.read().iter().all(|&x| x == 0));
}

/// A target is limited to its own range, whatever the region allows.
#[test]
fn target_bounds() {
    let (t, _b, mr) = setup(4096);
    let tg = t.check_remote(mr, PD, QP, W, IOVA + 100, 10).unwrap();
    tg.place(0, &[1; 10]).unwrap();
    tg.place(10, &[]).unwrap();
    assert_eq!(tg.place(1, &[1; 10]).unwrap_err(), AccessError::Bounds);
    assert_eq!(tg.place(11, &[]).unwrap_err(), AccessError::Bounds);
    let at = t
        .check_remote(mr, PD, QP, Access::REMOTE_ATOMIC, IOVA + 8, 16)
        .unwrap();
    at.fetch_add(8, 1).unwrap();
    assert_eq!(at.fetch_add(9, 1).unwrap_err(), AccessError::Bounds);
    assert_eq!(at.fetch_add(4, 1).unwrap_err(), AccessError::Alignment);
    assert!(format!("{at:?}").contains("Target"));
}

/// Every checked work request carries its targets by value through the post path: they
/// stay within one cache line.
#[test]
#[cfg(target_pointer_width = "64")]
fn a_target_fits_a_cache_line() {
    assert!(std::mem::size_of::<Target>() <= 64);
}
