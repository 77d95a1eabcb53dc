//! Property test: random operation sequences against a simple reference model of the table
//! (a map from full key to object; "incarnation" numbers stand in for revocation).
//! Covers RDMAP-115..-121 and IBT-o9-5.2.2 in combination.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::{AccessError, InvalidateError, KeyState, MemError, MrFlags, MwType, Target};

const BUF: usize = 256;
const IOVAS: [u64; 3] = [0, 0x1000, u64::MAX - 127];
const PDS: [PdId; 2] = [PD, PD2];
const QPS: [QpId; 2] = [QP, QP2];
const TYPES: [MwType; 3] = [MwType::Type1, MwType::Type2A, MwType::Type2B];

#[derive(Clone, Debug)]
enum Op {
    Reg {
        pd: usize,
        flags: u32,
        access: u32,
        off: usize,
        len: usize,
        iova: usize,
    },
    Rereg {
        k: usize,
        pd: usize,
        access: u32,
        off: usize,
        len: usize,
        iova: usize,
    },
    Dereg {
        k: usize,
    },
    Alloc {
        pd: usize,
        ty: usize,
    },
    Bind {
        mw: usize,
        mr: usize,
        qp: usize,
        pd: usize,
        at: u64,
        len: u64,
        access: u32,
    },
    Dealloc {
        k: usize,
    },
    InvLocal {
        k: usize,
        pd: usize,
    },
    InvRemote {
        k: usize,
        pd: usize,
        qp: usize,
    },
    Check {
        k: usize,
        pd: usize,
        qp: usize,
        need: u32,
        iova: usize,
        delta: i64,
        len: u64,
    },
    Use {
        t: usize,
    },
}

/// Region rights: mostly everything, sometimes any combination (including invalid ones).
fn mr_access() -> impl Strategy<Value = u32> {
    prop_oneof![2 => Just(Access::all().bits()), 1 => 0..32u32]
}

/// Window rights: mostly remote subsets, sometimes anything.
fn mw_access() -> impl Strategy<Value = u32> {
    prop_oneof![3 => (0..8u32).prop_map(|b| b << 1), 1 => 0..32u32]
}

/// Index into `PDS` / `QPS`: mostly the first.
fn which() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(1usize)]
}

/// A length or offset: mostly small, sometimes up to `max`.
fn small(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0..24u64, 1 => 0..max]
}

/// Offset of `to` from a base address: mostly near the start of a small range.
fn delta() -> impl Strategy<Value = i64> {
    prop_oneof![3 => -2i64..40, 1 => -8i64..160]
}

fn op() -> impl Strategy<Value = Op> {
    let ix = 0usize..64;
    prop_oneof![
        4 => (which(), 0..4u32, mr_access(), 0..BUF / 2 + 8, 0..BUF / 2, 0..3usize).prop_map(
            |(pd, flags, access, off, len, iova)| Op::Reg { pd, flags, access, off, len, iova }
        ),
        1 => (ix.clone(), which(), mr_access(), 0..BUF / 2, 0..BUF / 2, 0..3usize).prop_map(
            |(k, pd, access, off, len, iova)| Op::Rereg { k, pd, access, off, len, iova }
        ),
        1 => ix.clone().prop_map(|k| Op::Dereg { k }),
        2 => (which(), 0..3usize).prop_map(|(pd, ty)| Op::Alloc { pd, ty }),
        8 => (ix.clone(), ix.clone(), which(), which(), small(140), small(140), mw_access())
            .prop_map(|(mw, mr, qp, pd, at, len, access)| Op::Bind { mw, mr, qp, pd, at, len, access }),
        1 => ix.clone().prop_map(|k| Op::Dealloc { k }),
        1 => (ix.clone(), which()).prop_map(|(k, pd)| Op::InvLocal { k, pd }),
        2 => (ix.clone(), which(), which()).prop_map(|(k, pd, qp)| Op::InvRemote { k, pd, qp }),
        10 => (ix.clone(), which(), which(), 0..8u32, 0..6usize, delta(), small(140))
            .prop_map(|(k, pd, qp, need, iova, delta, len)| Op::Check { k, pd, qp, need, iova, delta, len }),
        4 => ix.prop_map(|t| Op::Use { t }),
    ]
}

struct MMr {
    pd: PdId,
    flags: MrFlags,
    access: Access,
    off: usize,
    iova: u64,
    len: u64,
    valid: bool,
    inc: u64,
}

struct MBind {
    mr: Key,
    mr_inc: u64,
    qp: QpId,
    iova: u64,
    len: u64,
    access: Access,
    /// Buffer offset of `iova`.
    base: usize,
}

struct MMw {
    pd: PdId,
    ty: MwType,
    bind: Option<MBind>,
    inc: u64,
}

enum MObj {
    Mr(MMr),
    Mw(MMw),
}

#[derive(Default)]
struct Model {
    objs: HashMap<Key, MObj>,
    next_inc: u64,
}

impl Model {
    fn inc(&mut self) -> u64 {
        self.next_inc += 1;
        self.next_inc
    }

    fn live_inc(&self, inc: u64) -> bool {
        self.objs.values().any(|o| match o {
            MObj::Mr(m) => m.inc == inc,
            MObj::Mw(w) => w.inc == inc,
        })
    }

    fn mr_alive(&self, key: Key, inc: u64) -> bool {
        matches!(self.objs.get(&key), Some(MObj::Mr(m)) if m.inc == inc)
    }

    fn state(&self, k: Key) -> KeyState {
        match self.objs.get(&k) {
            None => KeyState::Invalid,
            Some(MObj::Mr(m)) if m.valid => KeyState::Valid,
            Some(MObj::Mw(w)) if w.bind.is_some() => KeyState::Valid,
            Some(_) => KeyState::Free,
        }
    }

    fn make_mr(
        pd: PdId,
        flags: MrFlags,
        access: Access,
        off: usize,
        len: usize,
        iova: u64,
    ) -> Result<MMr, MemError> {
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(MemError::InvalidAccess);
        }
        if off + len > BUF {
            return Err(MemError::OutOfRange);
        }
        if iova as u128 + len as u128 > 1 << 64 {
            return Err(MemError::Wrap);
        }
        Ok(MMr {
            pd,
            flags,
            access,
            off,
            iova,
            len: len as u64,
            valid: true,
            inc: 0,
        })
    }

    /// Expected outcome of `check_remote`: (buffer offset, incarnations) or the error.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        k: Key,
        pd: PdId,
        qp: QpId,
        need: Access,
        to: u64,
        len: u64,
    ) -> Result<(usize, u64, Option<u64>), AccessError> {
        let (base, iova, size, rights, opd, bqp, incs) = match self.objs.get(&k) {
            None => return Err(AccessError::InvalidKey),
            Some(MObj::Mr(m)) => {
                if !m.valid {
                    return Err(AccessError::Invalidated);
                }
                (m.off, m.iova, m.len, m.access, m.pd, None, (m.inc, None))
            }
            Some(MObj::Mw(w)) => {
                let Some(b) = &w.bind else {
                    return Err(AccessError::Invalidated);
                };
                if !self.mr_alive(b.mr, b.mr_inc) {
                    return Err(AccessError::Invalidated);
                }
                let bqp = (w.ty != MwType::Type1).then_some(b.qp);
                (
                    b.base,
                    b.iova,
                    b.len,
                    b.access,
                    w.pd,
                    bqp,
                    (w.inc, Some(b.mr_inc)),
                )
            }
        };
        if opd != pd {
            return Err(AccessError::WrongPd);
        }
        if bqp.is_some_and(|q| q != qp) {
            return Err(AccessError::NotBoundToQp);
        }
        if !(rights & Access::REMOTE).contains(need) {
            return Err(AccessError::Rights);
        }
        if to as u128 + len as u128 > 1 << 64 {
            return Err(AccessError::Wrap);
        }
        if to < iova || to as u128 + len as u128 > iova as u128 + size as u128 {
            return Err(AccessError::Bounds);
        }
        let off = base + (to - iova) as usize;
        if need.contains(Access::REMOTE_ATOMIC) && (!to.is_multiple_of(8) || !off.is_multiple_of(8))
        {
            return Err(AccessError::Alignment);
        }
        Ok((off, incs.0, incs.1))
    }
}

fn access(bits: u32) -> Access {
    Access::from_bits_truncate(bits)
}

struct Issued {
    target: Target,
    incs: (u64, Option<u64>),
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let t = KeyTable::with_seed(ops.len() as u64);
    let buf = Buffer::new(BUF);
    let mut m = Model::default();
    // Every key ever seen, plus two that never name anything.
    let mut keys = vec![Key(0), Key(0xdead_beef)];
    let mut targets: Vec<Issued> = Vec::new();
    // Mostly one of the newest keys (likely live), sometimes any key ever seen (likely stale).
    let pick = |keys: &Vec<Key>, i: usize| {
        if i < 32 {
            keys[keys.len() - 1 - i % keys.len().min(6)]
        } else {
            keys[i % keys.len()]
        }
    };
    // Mostly a live object that `want` accepts, else as `pick`.
    let pick_live = |m: &Model, keys: &Vec<Key>, want: fn(&MObj) -> bool, i: usize| {
        let mut live: Vec<Key> = m
            .objs
            .iter()
            .filter(|(_, o)| want(o))
            .map(|(k, _)| *k)
            .collect();
        live.sort();
        if i < 56 && !live.is_empty() {
            live[i % live.len()]
        } else {
            pick(keys, i)
        }
    };
    let is_mr: fn(&MObj) -> bool = |o| matches!(o, MObj::Mr(_));
    let is_mw: fn(&MObj) -> bool = |o| matches!(o, MObj::Mw(_));
    let is_bound: fn(&MObj) -> bool = |o| matches!(o, MObj::Mw(MMw { bind: Some(_), .. }));
    let any_kind = |k: usize| [is_mr, is_mw, is_bound][k % 3];

    // Start from a populated table: two regions, three bound windows.
    let all_bits = Access::all().bits();
    let mut prelude = vec![
        Op::Reg {
            pd: 0,
            flags: 1,
            access: all_bits,
            off: 0,
            len: 128,
            iova: 1,
        },
        Op::Reg {
            pd: 0,
            flags: 0,
            access: all_bits,
            off: 64,
            len: 64,
            iova: 0,
        },
    ];
    for ty in 0..3 {
        prelude.push(Op::Alloc { pd: 0, ty });
        // Key list: [Key(0), 0xdeadbeef, mr1, mr2, ...]; the newest key is the window.
        prelude.push(Op::Bind {
            mw: 0,
            mr: 2,
            qp: 0,
            pd: 0,
            at: 8 * ty as u64,
            len: 64,
            access: 0b1110,
        });
    }
    for op in prelude.into_iter().chain(ops) {
        match op {
            Op::Reg {
                pd,
                flags,
                access: a,
                off,
                len,
                iova,
            } => {
                let (pd, flags, a) = (PDS[pd], MrFlags::from_bits_truncate(flags), access(a));
                let want = Model::make_mr(pd, flags, a, off, len, IOVAS[iova]);
                let got = t.reg_mr_with(pd, buf.clone(), off, len, IOVAS[iova], a, flags);
                match (want, got) {
                    (Ok(mut mr), Ok(k)) => {
                        prop_assert!(!m.objs.contains_key(&k) && k.index() != 0);
                        mr.inc = m.inc();
                        m.objs.insert(k, MObj::Mr(mr));
                        keys.push(k);
                    }
                    (Err(w), Err(g)) => prop_assert_eq!(w, g),
                    (w, g) => prop_assert!(false, "reg: model {:?} table {:?}", w.err(), g),
                }
            }
            Op::Rereg {
                k,
                pd,
                access: a,
                off,
                len,
                iova,
            } => {
                let k = pick(&keys, k);
                let (pd, a) = (PDS[pd], access(a));
                let made = Model::make_mr(pd, MrFlags::empty(), a, off, len, IOVAS[iova]);
                let want = match (&made, m.objs.get(&k)) {
                    (Err(e), _) => Err(*e),
                    (_, None) => Err(MemError::InvalidKey),
                    (_, Some(MObj::Mw(_))) => Err(MemError::WrongType),
                    (Ok(_), Some(MObj::Mr(_))) => Ok(()),
                };
                let got = t.rereg_mr(k, pd, buf.clone(), off, len, IOVAS[iova], a);
                match (want, got) {
                    (Ok(()), Ok(k2)) => {
                        prop_assert_eq!(k2.index(), k.index());
                        prop_assert_ne!(k2.consumer(), k.consumer());
                        m.objs.remove(&k);
                        let mut mr = made.unwrap();
                        mr.inc = m.inc();
                        m.objs.insert(k2, MObj::Mr(mr));
                        keys.push(k2);
                    }
                    (Err(w), Err(g)) => prop_assert_eq!(w, g),
                    (w, g) => prop_assert!(false, "rereg: model {:?} table {:?}", w, g),
                }
            }
            Op::Dereg { k } => {
                let k = pick(&keys, k);
                let want = match m.objs.get(&k) {
                    None => Err(MemError::InvalidKey),
                    Some(MObj::Mw(_)) => Err(MemError::WrongType),
                    Some(MObj::Mr(_)) => Ok(()),
                };
                prop_assert_eq!(t.dereg_mr(k), want);
                if want.is_ok() {
                    m.objs.remove(&k);
                }
            }
            Op::Alloc { pd, ty } => {
                let k = t.alloc_mw(PDS[pd], TYPES[ty]).unwrap();
                prop_assert!(!m.objs.contains_key(&k) && k.index() != 0);
                let inc = m.inc();
                m.objs.insert(
                    k,
                    MObj::Mw(MMw {
                        pd: PDS[pd],
                        ty: TYPES[ty],
                        bind: None,
                        inc,
                    }),
                );
                keys.push(k);
            }
            Op::Bind {
                mw,
                mr,
                qp,
                pd,
                at,
                len,
                access: a,
            } => {
                let (mw, mr, qp, pd, a) = (
                    pick_live(&m, &keys, is_mw, mw),
                    pick_live(&m, &keys, is_mr, mr),
                    QPS[qp],
                    PDS[pd],
                    access(a),
                );
                let want = (|| {
                    let Some(MObj::Mr(r)) = m.objs.get(&mr) else {
                        return Err(if m.objs.contains_key(&mr) {
                            MemError::WrongType
                        } else {
                            MemError::InvalidKey
                        });
                    };
                    let Some(MObj::Mw(w)) = m.objs.get(&mw) else {
                        return Err(if m.objs.contains_key(&mw) {
                            MemError::WrongType
                        } else {
                            MemError::InvalidKey
                        });
                    };
                    if w.pd != pd || r.pd != pd {
                        return Err(MemError::WrongPd);
                    }
                    if w.ty != MwType::Type1 && w.bind.is_some() || !r.valid {
                        return Err(MemError::WrongState);
                    }
                    if !r.access.contains(Access::MW_BIND) {
                        return Err(MemError::Rights);
                    }
                    if !Access::REMOTE.contains(a) {
                        return Err(MemError::InvalidAccess);
                    }
                    if a.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
                        && !r.access.contains(Access::LOCAL_WRITE)
                    {
                        return Err(MemError::Rights);
                    }
                    let iova = r.iova.wrapping_add(at);
                    if iova as u128 + len as u128 > 1 << 64 {
                        return Err(MemError::Wrap);
                    }
                    if iova < r.iova || iova as u128 + len as u128 > r.iova as u128 + r.len as u128
                    {
                        return Err(MemError::OutOfRange);
                    }
                    Ok(MBind {
                        mr,
                        mr_inc: r.inc,
                        qp,
                        iova,
                        len,
                        access: a,
                        base: r.off + at as usize,
                    })
                })();
                let iova = match m.objs.get(&mr) {
                    Some(MObj::Mr(r)) => r.iova.wrapping_add(at),
                    _ => at,
                };
                let got = t.bind_mw(mw, mr, qp, pd, iova, len, a);
                match (want, got) {
                    (Ok(b), Ok(k2)) => {
                        prop_assert_eq!(k2.index(), mw.index());
                        prop_assert_ne!(k2.consumer(), mw.consumer());
                        let Some(MObj::Mw(mut w)) = m.objs.remove(&mw) else {
                            unreachable!()
                        };
                        w.bind = Some(b);
                        w.inc = m.inc();
                        m.objs.insert(k2, MObj::Mw(w));
                        keys.push(k2);
                    }
                    (Err(w), Err(g)) => prop_assert_eq!(w, g),
                    (w, g) => prop_assert!(false, "bind: model {:?} table {:?}", w.err(), g),
                }
            }
            Op::Dealloc { k } => {
                let k = pick(&keys, k);
                let want = match m.objs.get(&k) {
                    None => Err(MemError::InvalidKey),
                    Some(MObj::Mr(_)) => Err(MemError::WrongType),
                    Some(MObj::Mw(_)) => Ok(()),
                };
                prop_assert_eq!(t.dealloc_mw(k), want);
                if want.is_ok() {
                    m.objs.remove(&k);
                }
            }
            Op::InvLocal { k, pd } => {
                let (k, pd) = (pick(&keys, k), PDS[pd]);
                let fresh = m.next_inc + 1;
                let want = match m.objs.get_mut(&k) {
                    None => Err(MemError::InvalidKey),
                    Some(MObj::Mr(r)) if !r.flags.contains(MrFlags::FAST_REG) => {
                        Err(MemError::NotInvalidatable)
                    }
                    Some(MObj::Mr(r)) if r.pd != pd => Err(MemError::WrongPd),
                    Some(MObj::Mr(r)) if !r.valid => Err(MemError::WrongState),
                    Some(MObj::Mr(r)) => {
                        r.valid = false;
                        r.inc = fresh;
                        Ok(())
                    }
                    Some(MObj::Mw(w)) if w.ty == MwType::Type1 => Err(MemError::NotInvalidatable),
                    Some(MObj::Mw(w)) if w.pd != pd => Err(MemError::WrongPd),
                    Some(MObj::Mw(w)) if w.bind.is_none() => Err(MemError::WrongState),
                    Some(MObj::Mw(w)) => {
                        w.bind = None;
                        w.inc = fresh;
                        Ok(())
                    }
                };
                if want.is_ok() {
                    m.next_inc = fresh;
                }
                prop_assert_eq!(t.invalidate_local(k, pd), want);
            }
            Op::InvRemote { k, pd, qp } => {
                let (k, pd, qp) = (pick_live(&m, &keys, any_kind(k), k), PDS[pd], QPS[qp]);
                let fresh = m.next_inc + 1;
                let mut bumped = false;
                let want = match m.objs.get_mut(&k) {
                    None => Err(InvalidateError::InvalidKey),
                    Some(MObj::Mr(r)) => {
                        if !r.flags.contains(MrFlags::FAST_REG) || r.flags.contains(MrFlags::SHARED)
                        {
                            Err(InvalidateError::NotInvalidatable)
                        } else if r.pd != pd {
                            Err(InvalidateError::WrongPd)
                        } else {
                            if r.valid {
                                r.valid = false;
                                r.inc = fresh;
                                bumped = true;
                            }
                            Ok(())
                        }
                    }
                    Some(MObj::Mw(w)) => {
                        let res = match (w.ty, &w.bind) {
                            (MwType::Type1, _) => Err(InvalidateError::NotInvalidatable),
                            (_, None) if w.pd != pd => Err(InvalidateError::WrongPd),
                            (_, None) => Ok(()),
                            (MwType::Type2A, Some(b)) if b.qp != qp => {
                                Err(InvalidateError::WrongQp)
                            }
                            (MwType::Type2B, Some(_)) if w.pd != pd => {
                                Err(InvalidateError::WrongPd)
                            }
                            (MwType::Type2B, Some(b)) if b.qp != qp => {
                                Err(InvalidateError::WrongQp)
                            }
                            (_, Some(_)) => Ok(()),
                        };
                        if res.is_ok() && w.bind.take().is_some() {
                            w.inc = fresh;
                            bumped = true;
                        }
                        res
                    }
                };
                if bumped {
                    m.next_inc = fresh;
                }
                prop_assert_eq!(t.invalidate_remote(k, pd, qp), want);
            }
            Op::Check {
                k,
                pd,
                qp,
                need,
                iova,
                delta,
                len,
            } => {
                let k = pick_live(&m, &keys, any_kind(k), k);
                let (pd, qp, need) = (PDS[pd], QPS[qp], access(need << 1));
                let base = match (iova, m.objs.get(&k)) {
                    (3.., Some(MObj::Mr(r))) => r.iova,
                    (3.., Some(MObj::Mw(MMw { bind: Some(b), .. }))) => b.iova,
                    (i, _) => IOVAS[i % 3],
                };
                let to = base.wrapping_add(delta as u64);
                let want = m.check(k, pd, qp, need, to, len);
                let got = t.check_remote(k, pd, qp, need, to, len);
                match (want, got) {
                    (Ok((off, inc, mr_inc)), Ok(tg)) => {
                        prop_assert_eq!(tg.buffer_offset(), off);
                        prop_assert_eq!(tg.len() as u64, len);
                        targets.push(Issued {
                            target: tg,
                            incs: (inc, mr_inc),
                        });
                    }
                    (Err(w), Err(g)) => prop_assert_eq!(w, g),
                    (w, g) => prop_assert!(false, "check: model {:?} table {:?}", w, g),
                }
            }
            Op::Use { t: i } => {
                if targets.is_empty() {
                    continue;
                }
                let is = &targets[i % targets.len()];
                let live = m.live_inc(is.incs.0) && is.incs.1.is_none_or(|mi| m.live_inc(mi));
                prop_assert_eq!(is.target.is_valid(), live);
                let res = is.target.read_with(0, 0, |_| ()).or_else(|e| match e {
                    AccessError::Rights => is.target.write_with(0, 0, |_| ()),
                    e => Err(e),
                });
                match res {
                    Ok(()) => prop_assert!(live),
                    Err(AccessError::Invalidated) => prop_assert!(!live),
                    Err(AccessError::Rights) => {}
                    Err(e) => prop_assert!(false, "use: {:?}", e),
                }
            }
        }
        prop_assert_eq!(t.len(), m.objs.len());
        for &k in keys.iter().rev().take(4) {
            prop_assert_eq!(t.state(k), m.state(k), "state of {}", k);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// RDMAP-115..-121, IBT-o9-5.2.2: the table behaves like the reference model.
    #[test]
    fn table_matches_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
