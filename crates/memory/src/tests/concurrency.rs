//! Concurrent placement, atomics and user access (no torn data, exact atomic totals).

use std::thread;

use super::*;

const THREADS: u64 = 6;
const ROUNDS: u64 = 400;

/// Many threads fetch_add through remote targets and the user's own atomics: the total is
/// exact (IBT-X-12, atomics under the write lock).
#[test]
fn concurrent_fetch_add_is_exact() {
    let (t, b, mr) = setup(4096);
    thread::scope(|s| {
        for i in 0..THREADS {
            let t = &t;
            let b = &b;
            s.spawn(move || {
                let tg = t
                    .check_remote(mr, PD, QP, Access::REMOTE_ATOMIC, IOVA + 64, 8)
                    .unwrap();
                for _ in 0..ROUNDS {
                    if i % 2 == 0 {
                        tg.fetch_add(0, 3).unwrap();
                    } else {
                        b.fetch_add(64, 3).unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(b.fetch_add(64, 0), Ok(THREADS * ROUNDS * 3));
}

/// Compare-and-swap loops from several threads never lose an update.
#[test]
fn concurrent_compare_swap_counter() {
    let (t, b, mr) = setup(64);
    thread::scope(|s| {
        for _ in 0..THREADS {
            let t = &t;
            s.spawn(move || {
                let tg = t
                    .check_remote(mr, PD, QP, Access::REMOTE_ATOMIC, IOVA, 8)
                    .unwrap();
                for _ in 0..ROUNDS / 4 {
                    let mut cur = tg.compare_swap(0, 0, 0).unwrap();
                    loop {
                        let old = tg.compare_swap(0, cur, cur + 1).unwrap();
                        if old == cur {
                            break;
                        }
                        cur = old;
                    }
                }
            });
        }
    });
    assert_eq!(b.fetch_add(0, 0), Ok(THREADS * (ROUNDS / 4)));
}

/// Placement vs user reads: a reader never sees a half-placed segment, and 8-byte words
/// under concurrent atomics are never torn.
#[test]
fn placement_vs_user_read_no_tearing() {
    let (t, b, mr) = setup(8192);
    let k = 0x0101_0101_0101_0101u64;
    thread::scope(|s| {
        let t = &t;
        s.spawn(move || {
            let tg = t
                .check_remote(mr, PD, QP, Access::REMOTE_WRITE, IOVA, 4096)
                .unwrap();
            for i in 0..ROUNDS {
                tg.place(0, &[i as u8; 4096]).unwrap();
            }
        });
        s.spawn(move || {
            let tg = t
                .check_remote(mr, PD, QP, Access::REMOTE_ATOMIC, IOVA + 4096, 8)
                .unwrap();
            for _ in 0..200 {
                tg.fetch_add(0, k).unwrap();
            }
        });
        for _ in 0..ROUNDS {
            let g = b.read();
            let first = g[0];
            assert!(g[..4096].iter().all(|&x| x == first), "torn segment");
            let w = u64::from_ne_bytes(g[4096..4104].try_into().unwrap());
            assert_eq!(w % k, 0, "torn atomic {w:#x}");
            drop(g);
            let mut word = [0u8; 8];
            b.copy_out(4096, &mut word).unwrap();
            assert_eq!(u64::from_ne_bytes(word) % k, 0);
        }
    });
    assert_eq!(b.fetch_add(4096, 0), Ok(200 * k));
}

/// Registration churn on other keys while placing: lookups stay correct.
#[test]
fn registration_churn_during_placement() {
    let (t, b, mr) = setup(4096);
    thread::scope(|s| {
        let t = &t;
        s.spawn(move || {
            let other = Buffer::new(64);
            for _ in 0..ROUNDS {
                let k = t.reg_fast_mr(PD, other.clone(), 0, 64, 0, all()).unwrap();
                let w = t.alloc_mw(PD, crate::MwType::Type2A).unwrap();
                t.invalidate_remote(k, PD, QP).unwrap();
                t.dealloc_mw(w).unwrap();
                t.dereg_mr(k).unwrap();
            }
        });
        for i in 0..ROUNDS {
            let tg = t
                .check_remote(mr, PD, QP, Access::REMOTE_WRITE, IOVA + (i % 4096), 1)
                .unwrap();
            tg.place(0, &[1]).unwrap();
        }
    });
    assert!(b.read()[..ROUNDS as usize].iter().all(|&x| x == 1));
    assert_eq!(t.len(), 1);
}
