//! `check_remote` / `check_local`: every `AccessError` path, boundaries, order, code mapping.

use super::*;
use crate::{AccessError, IbNak, MemError, MrFlags};

const W: Access = Access::REMOTE_WRITE;
const R: Access = Access::REMOTE_READ;
const A: Access = Access::REMOTE_ATOMIC;

/// RDMAP-109: an unknown STag, a stale consumer key and the reserved key 0 are invalid.
#[test]
fn rdmap_109_invalid_stag() {
    let (t, _b, k) = setup(4096);
    for bad in [stale(k), Key(0), Key(k.0 ^ 0x100), Key(u32::MAX)] {
        if bad == k {
            continue;
        }
        let e = t.check_remote(bad, PD, QP, R, IOVA, 8).unwrap_err();
        assert_eq!(e, AccessError::InvalidKey, "{bad}");
        assert_eq!(e.rdmap_code(), 0x00);
        assert_eq!(e.ddp_tagged_code(), Some(0x00));
        assert_eq!(e.ib_nak(), IbNak::RemoteAccess);
    }
}

/// RDMAP-110 / RDMAP-115: an STag of another protection domain is never usable.
#[test]
fn rdmap_110_115_foreign_pd() {
    let (t, _b, k) = setup(4096);
    for need in [R, W, A, Access::empty()] {
        let e = t.check_remote(k, PD2, QP, need, IOVA, 8).unwrap_err();
        assert_eq!(e, AccessError::WrongPd);
        assert_eq!(e.rdmap_code(), 0x03);
        assert_eq!(e.ddp_tagged_code(), Some(0x02));
    }
    let e = t.check_local(k, PD2, Access::empty(), IOVA, 8).unwrap_err();
    assert_eq!(e, AccessError::WrongPd);
}

/// RDMAP-111, RDMAP-112, RDMAP-117: TO below base, one octet past the end; exact fits pass.
#[test]
fn rdmap_111_112_117_bounds() {
    let (t, _b, k) = setup(4096);
    let ok = |to, len| t.check_remote(k, PD, QP, R | W, to, len);
    // Exactly the whole region, and each end exactly.
    let tg = ok(IOVA, 4096).unwrap();
    assert_eq!((tg.buffer_offset(), tg.len()), (0, 4096));
    let tg = ok(IOVA + 4095, 1).unwrap();
    assert_eq!((tg.buffer_offset(), tg.len()), (4095, 1));
    ok(IOVA + 100, 3996).unwrap();
    for (to, len) in [
        (IOVA - 1, 1),
        (IOVA - 1, 4097),
        (IOVA, 4097),
        (IOVA + 4096, 1),
        (IOVA + 1, 4096),
        (0, 1),
        (IOVA + 4095, 2),
    ] {
        let e = ok(to, len).unwrap_err();
        assert_eq!(e, AccessError::Bounds, "to {to:#x} len {len}");
        assert_eq!(e.rdmap_code(), 0x01);
        assert_eq!(e.ddp_tagged_code(), Some(0x01));
    }
}

/// RDMAP-113: TO + size must not wrap 2^64 (TO = 2^64-1, size 2 -> TO wrap 0x04); a range
/// ending exactly at 2^64 does not wrap.
#[test]
fn rdmap_113_to_wrap() {
    let t = KeyTable::with_seed(9);
    let b = Buffer::new(4096);
    let top = t
        .reg_mr(PD, b.clone(), 0, 4096, u64::MAX - 4095, all())
        .unwrap();
    t.check_remote(top, PD, QP, R, u64::MAX, 1).unwrap();
    t.check_remote(top, PD, QP, R, u64::MAX - 4095, 4096)
        .unwrap();
    for (to, len) in [(u64::MAX, 2), (u64::MAX - 4095, 4097), (2, u64::MAX)] {
        let e = t.check_remote(top, PD, QP, R, to, len).unwrap_err();
        assert_eq!(e, AccessError::Wrap);
        assert_eq!(e.rdmap_code(), 0x04);
        assert_eq!(e.ddp_tagged_code(), Some(0x03));
    }
    // Wrap is reported before bounds, also for a region far from the top.
    let low = t.reg_mr(PD, b, 0, 4096, 0x1000, all()).unwrap();
    assert_eq!(
        t.check_remote(low, PD, QP, R, u64::MAX, 2).unwrap_err(),
        AccessError::Wrap
    );
    assert_eq!(
        t.check_local(low, PD, Access::empty(), u64::MAX, 2)
            .unwrap_err(),
        AccessError::Wrap
    );
}

/// RDMAP-114 / RDMAP-119: the STag must grant the right asked for (write-only STag read ->
/// access rights 0x02); rights are granted and revoked per STag.
#[test]
fn rdmap_114_119_rights() {
    let t = KeyTable::with_seed(4);
    let b = Buffer::new(4096);
    let wo = t
        .reg_mr(PD, b.clone(), 0, 4096, IOVA, Access::LOCAL_WRITE | W)
        .unwrap();
    let ro = t.reg_mr(PD, b.clone(), 0, 4096, IOVA, R).unwrap();
    let none = t
        .reg_mr(
            PD,
            b.clone(),
            0,
            4096,
            IOVA,
            Access::LOCAL_WRITE | Access::MW_BIND,
        )
        .unwrap();
    let e = t.check_remote(wo, PD, QP, R, IOVA, 8).unwrap_err();
    assert_eq!(e, AccessError::Rights);
    assert_eq!(e.rdmap_code(), 0x02);
    assert_eq!(e.ddp_tagged_code(), None);
    assert_eq!(e.ib_nak(), IbNak::RemoteAccess);
    t.check_remote(wo, PD, QP, W, IOVA, 8).unwrap();
    assert_eq!(
        t.check_remote(ro, PD, QP, W, IOVA, 8).unwrap_err(),
        AccessError::Rights
    );
    assert_eq!(
        t.check_remote(ro, PD, QP, A, IOVA, 8).unwrap_err(),
        AccessError::Rights
    );
    assert_eq!(
        t.check_remote(ro, PD, QP, R | W, IOVA, 8).unwrap_err(),
        AccessError::Rights
    );
    t.check_remote(ro, PD, QP, R, IOVA, 8).unwrap();
    for need in [R, W, A] {
        assert_eq!(
            t.check_remote(none, PD, QP, need, IOVA, 8).unwrap_err(),
            AccessError::Rights
        );
    }
    // Local rights are not remote rights.
    for need in [Access::LOCAL_WRITE, Access::MW_BIND] {
        let (t2, _b2, k) = setup(64);
        assert_eq!(
            t2.check_remote(k, PD, QP, need, IOVA, 8).unwrap_err(),
            AccessError::Rights
        );
    }
    // Revoke write by reregistering read-only: the old key dies, the new one reads only.
    let k = t.reg_mr(PD, b.clone(), 0, 4096, IOVA, remote_rw()).unwrap();
    let k2 = t.rereg_mr(k, PD, b, 0, 4096, IOVA, R).unwrap();
    assert_ne!(k, k2);
    assert_eq!(k.index(), k2.index());
    assert_eq!(
        t.check_remote(k, PD, QP, R, IOVA, 8).unwrap_err(),
        AccessError::InvalidKey
    );
    assert_eq!(
        t.check_remote(k2, PD, QP, W, IOVA, 8).unwrap_err(),
        AccessError::Rights
    );
    t.check_remote(k2, PD, QP, R, IOVA, 8).unwrap();
}

/// Zero-length access still validates the STag (RFC 5040 zero-length Write) and needs `to`
/// in `[iova, iova + len]`.
#[test]
fn zero_length() {
    let (t, _b, k) = setup(4096);
    let tg = t.check_remote(k, PD, QP, W, IOVA, 0).unwrap();
    assert!(tg.is_empty());
    tg.place(0, &[]).unwrap();
    t.check_remote(k, PD, QP, W, IOVA + 4096, 0).unwrap();
    assert_eq!(
        t.check_remote(k, PD, QP, W, IOVA + 4097, 0).unwrap_err(),
        AccessError::Bounds
    );
    assert_eq!(
        t.check_remote(k, PD, QP, W, IOVA - 1, 0).unwrap_err(),
        AccessError::Bounds
    );
    assert_eq!(
        t.check_remote(stale(k), PD, QP, W, IOVA, 0).unwrap_err(),
        AccessError::InvalidKey
    );
    assert_eq!(
        t.check_remote(k, PD2, QP, W, IOVA, 0).unwrap_err(),
        AccessError::WrongPd
    );
    t.check_remote(k, PD, QP, W, u64::MAX, 0).unwrap_err();
    // An empty region.
    let e = t.reg_mr(PD, Buffer::new(0), 0, 0, 5, all()).unwrap();
    t.check_remote(e, PD, QP, R, 5, 0).unwrap();
    assert_eq!(
        t.check_remote(e, PD, QP, R, 5, 1).unwrap_err(),
        AccessError::Bounds
    );
}

/// An invalidated (Free) fast-registered region answers `Invalidated` (Invalid STag 0x00).
#[test]
fn invalidated_key() {
    let t = KeyTable::with_seed(5);
    let k = t
        .reg_fast_mr(PD, Buffer::new(64), 0, 64, IOVA, all())
        .unwrap();
    t.check_remote(k, PD, QP, W, IOVA, 64).unwrap();
    t.invalidate_local(k, PD).unwrap();
    let e = t.check_remote(k, PD, QP, W, IOVA, 64).unwrap_err();
    assert_eq!(e, AccessError::Invalidated);
    assert_eq!(e.rdmap_code(), 0x00);
    assert_eq!(e.ddp_tagged_code(), Some(0x00));
    assert_eq!(
        t.check_local(k, PD, Access::empty(), IOVA, 1).unwrap_err(),
        AccessError::Invalidated
    );
    // Deregistering it works from the Free state.
    t.dereg_mr(k).unwrap();
}

/// IBT-X-12: atomics need an 8-aligned VA (else NAK Invalid Request); the buffer offset must
/// be aligned too.
#[test]
fn ibt_x_12_atomic_alignment() {
    let (t, _b, k) = setup(4096);
    for off in 1..8 {
        let e = t.check_remote(k, PD, QP, A, IOVA + off, 8).unwrap_err();
        assert_eq!(e, AccessError::Alignment);
        assert_eq!(e.ib_nak(), IbNak::InvalidRequest);
        assert_eq!(e.ddp_tagged_code(), None);
    }
    t.check_remote(k, PD, QP, A, IOVA + 8, 8).unwrap();
    // Aligned VA, but the region starts 4 bytes into the buffer: buffer offset misaligned.
    let odd = t.reg_mr(PD, Buffer::new(64), 4, 32, 0x1000, all()).unwrap();
    assert_eq!(
        t.check_remote(odd, PD, QP, A, 0x1000, 8).unwrap_err(),
        AccessError::Alignment
    );
    // Plain reads/writes do not care.
    t.check_remote(odd, PD, QP, R | W, 0x1001, 3).unwrap();
}

/// IBT-X-03: out-of-range WRITE / READ / ATOMIC -> NAK Remote Access Error.
#[test]
fn ibt_x_03_out_of_range_is_remote_access_nak() {
    let (t, _b, k) = setup(4096);
    for need in [R, W, A] {
        let e = t.check_remote(k, PD, QP, need, IOVA + 4096, 8).unwrap_err();
        assert_eq!(e.ib_nak(), IbNak::RemoteAccess);
    }
}

/// IBT-X-16: an ATOMIC outside the R_Key's range fails (nothing changes), and after a fixed
/// registration the same request succeeds.
#[test]
fn ibt_x_16_atomic_bounds_then_fixed_registration() {
    let t = KeyTable::with_seed(6);
    let b = Buffer::new(4096);
    let k = t.reg_mr(PD, b.clone(), 0, 8, IOVA, all()).unwrap();
    assert_eq!(
        t.check_remote(k, PD, QP, A, IOVA + 8, 8).unwrap_err(),
        AccessError::Bounds
    );
    assert!(b.read().iter().all(|&x| x == 0));
    let k = t.rereg_mr(k, PD, b.clone(), 0, 16, IOVA, all()).unwrap();
    let tg = t.check_remote(k, PD, QP, A, IOVA + 8, 8).unwrap();
    assert_eq!(tg.fetch_add(0, 5), Ok(0));
    assert_eq!(tg.compare_swap(0, 5, 7), Ok(5));
    assert_eq!(tg.compare_swap(0, 5, 9), Ok(7));
    let mut w = [0u8; 8];
    b.copy_out(8, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 7);
}

/// The documented check order: key -> state -> PD -> QP -> rights -> wrap -> bounds ->
/// alignment (the first failure is reported, RDMAP-102).
#[test]
fn check_order() {
    let t = KeyTable::with_seed(8);
    let b = Buffer::new(4096);
    let ro = t
        .reg_fast_mr(
            PD,
            b.clone(),
            0,
            4096,
            IOVA,
            R | Access::LOCAL_WRITE | Access::MW_BIND,
        )
        .unwrap();
    // PD before rights, wrap and bounds.
    assert_eq!(
        t.check_remote(ro, PD2, QP, W, u64::MAX, 2).unwrap_err(),
        AccessError::WrongPd
    );
    // Rights before wrap and bounds.
    assert_eq!(
        t.check_remote(ro, PD, QP, W, u64::MAX, 2).unwrap_err(),
        AccessError::Rights
    );
    assert_eq!(
        t.check_remote(ro, PD, QP, W, 0, 1).unwrap_err(),
        AccessError::Rights
    );
    // Wrap before bounds.
    assert_eq!(
        t.check_remote(ro, PD, QP, R, u64::MAX, 2).unwrap_err(),
        AccessError::Wrap
    );
    // Bounds before alignment.
    let (t2, _b2, k2) = setup(64);
    assert_eq!(
        t2.check_remote(k2, PD, QP, A, IOVA + 61, 8).unwrap_err(),
        AccessError::Bounds
    );
    // QP before rights: a type 2 window bound to another QP.
    let mw = t.alloc_mw(PD, crate::MwType::Type2A).unwrap();
    let mw = t.bind_mw(mw, ro, QP, PD, IOVA, 64, R).unwrap();
    assert_eq!(
        t.check_remote(mw, PD, QP2, W, u64::MAX, 2).unwrap_err(),
        AccessError::NotBoundToQp
    );
    // PD before QP.
    assert_eq!(
        t.check_remote(mw, PD2, QP2, R, IOVA, 1).unwrap_err(),
        AccessError::WrongPd
    );
    // State before PD.
    t.invalidate_local(ro, PD).unwrap();
    assert_eq!(
        t.check_remote(ro, PD2, QP, R, IOVA, 1).unwrap_err(),
        AccessError::Invalidated
    );
    assert_eq!(
        t.check_remote(mw, PD2, QP2, R, IOVA, 1).unwrap_err(),
        AccessError::Invalidated
    );
}

#[test]
fn check_local_paths() {
    let t = KeyTable::with_seed(10);
    let b = Buffer::new(4096);
    let rw = t
        .reg_mr(PD, b.clone(), 0, 4096, IOVA, Access::LOCAL_WRITE)
        .unwrap();
    let ro = t
        .reg_mr(PD, b.clone(), 0, 4096, IOVA, Access::empty())
        .unwrap();
    let tg = t
        .check_local(rw, PD, Access::LOCAL_WRITE, IOVA + 8, 8)
        .unwrap();
    tg.place(0, b"12345678").unwrap();
    assert_eq!(&b.read()[8..16], b"12345678");
    let tg = t.check_local(ro, PD, Access::empty(), IOVA + 8, 8).unwrap();
    let mut out = [0u8; 8];
    tg.copy_out(0, &mut out).unwrap();
    assert_eq!(&out, b"12345678");
    assert_eq!(tg.place(0, b"x").unwrap_err(), AccessError::Rights);
    assert_eq!(tg.fetch_add(0, 1).unwrap_err(), AccessError::Rights);
    assert_eq!(
        t.check_local(ro, PD, Access::LOCAL_WRITE, IOVA, 8)
            .unwrap_err(),
        AccessError::Rights
    );
    assert_eq!(
        t.check_local(rw, PD, Access::REMOTE_READ, IOVA, 8)
            .unwrap_err(),
        AccessError::Rights
    );
    assert_eq!(
        t.check_local(rw, PD, Access::empty(), IOVA + 4090, 8)
            .unwrap_err(),
        AccessError::Bounds
    );
    assert_eq!(
        t.check_local(stale(rw), PD, Access::empty(), IOVA, 8)
            .unwrap_err(),
        AccessError::InvalidKey
    );
    // A window is not an L_Key.
    let mw = t.alloc_mw(PD, crate::MwType::Type1).unwrap();
    assert_eq!(
        t.check_local(mw, PD, Access::empty(), IOVA, 8).unwrap_err(),
        AccessError::InvalidKey
    );
}

/// Regions at an offset inside their buffer translate TO to the right buffer bytes.
#[test]
fn translation_with_offset() {
    let t = KeyTable::with_seed(11);
    let b = Buffer::new(8192);
    let k = t
        .reg_mr(PD, b.clone(), 4000, 100, 0xabc0, remote_rw())
        .unwrap();
    let tg = t.check_remote(k, PD, QP, W, 0xabc0 + 10, 5).unwrap();
    assert_eq!(tg.buffer_offset(), 4010);
    tg.place(0, b"hello").unwrap();
    assert_eq!(&b.read()[4010..4015], b"hello");
    assert_eq!(tg.place(1, b"hello").unwrap_err(), AccessError::Bounds);
    assert_eq!(tg.place(usize::MAX, b"h").unwrap_err(), AccessError::Bounds);
    // A write-only target does not read.
    let mut out = [0u8; 5];
    assert_eq!(tg.copy_out(0, &mut out).unwrap_err(), AccessError::Rights);
    let rt = t.check_remote(k, PD, QP, R, 0xabc0 + 10, 5).unwrap();
    rt.copy_out(0, &mut out).unwrap();
    assert_eq!(&out, b"hello");
    assert_eq!(rt.place(0, b"x").unwrap_err(), AccessError::Rights);
    assert_eq!(rt.fetch_add(0, 1).unwrap_err(), AccessError::Rights);
    assert_eq!(rt.read_with(2, 3, |s| s.to_vec()).unwrap(), b"llo");
    let n = tg.write_with(0, 2, |s| {
        s.copy_from_slice(b"HE");
        2
    });
    assert_eq!(n, Ok(2));
    assert_eq!(&b.read()[4010..4015], b"HEllo");
}

#[test]
fn shared_flag_does_not_bypass_pd() {
    let t = KeyTable::with_seed(12);
    let k = t
        .reg_mr_with(PD, Buffer::new(64), 0, 64, 0, all(), MrFlags::SHARED)
        .unwrap();
    t.check_remote(k, PD, QP, R, 0, 64).unwrap();
    t.check_remote(k, PD, QP2, R, 0, 64).unwrap();
    assert_eq!(
        t.check_remote(k, PD2, QP, R, 0, 64).unwrap_err(),
        AccessError::WrongPd
    );
    assert_eq!(t.invalidate_local(k, PD), Err(MemError::NotInvalidatable));
}

#[test]
fn error_mapping_table() {
    use AccessError::*;
    let rows = [
        (InvalidKey, 0x00, Some(0x00), IbNak::RemoteAccess),
        (Invalidated, 0x00, Some(0x00), IbNak::RemoteAccess),
        (WrongPd, 0x03, Some(0x02), IbNak::RemoteAccess),
        (NotBoundToQp, 0x03, Some(0x02), IbNak::RemoteAccess),
        (Rights, 0x02, None, IbNak::RemoteAccess),
        (Bounds, 0x01, Some(0x01), IbNak::RemoteAccess),
        (Wrap, 0x04, Some(0x03), IbNak::RemoteAccess),
        (Alignment, 0xff, None, IbNak::InvalidRequest),
    ];
    for (e, rdmap, ddp, nak) in rows {
        assert_eq!(e.rdmap_code(), rdmap, "{e:?}");
        assert_eq!(e.ddp_tagged_code(), ddp, "{e:?}");
        assert_eq!(e.ib_nak(), nak, "{e:?}");
        assert!(!e.to_string().is_empty());
    }
    assert_eq!(IbNak::RemoteAccess.syndrome(), 0x62);
    assert_eq!(IbNak::InvalidRequest.syndrome(), 0x61);
}

proptest::proptest! {
    /// RDMAP-117 (bounds fuzzing): `check_remote` accepts exactly the ranges inside the
    /// region, computed in 128-bit arithmetic, and reports wrap before bounds.
    #[test]
    fn rdmap_117_bounds_fuzz(
        iova in proptest::prop_oneof![0..64u64, (u64::MAX - 64)..=u64::MAX, proptest::num::u64::ANY],
        size in 0..64usize,
        to_delta in -70i64..70,
        len in proptest::prop_oneof![0..70u64, proptest::num::u64::ANY],
    ) {
        let t = KeyTable::with_seed(13);
        let b = Buffer::new(64);
        let Ok(k) = t.reg_mr(PD, b, 0, size, iova, all()) else {
            proptest::prop_assert!(iova as u128 + size as u128 > 1 << 64);
            return Ok(());
        };
        let to = iova.wrapping_add(to_delta as u64);
        let end = to as u128 + len as u128;
        let want = if end > 1 << 64 {
            Err(AccessError::Wrap)
        } else if to < iova || end > iova as u128 + size as u128 {
            Err(AccessError::Bounds)
        } else {
            Ok((to - iova) as usize)
        };
        for need in [R, W] {
            let got = t.check_remote(k, PD, QP, need, to, len).map(|tg| tg.buffer_offset());
            proptest::prop_assert_eq!(got, want);
        }
    }
}
