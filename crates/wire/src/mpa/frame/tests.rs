//! Tests of the startup frames (RFC 5044 §7.1.1): keys, golden bytes, real frames, the
//! view's setters, bounds and truncations.

use super::*;
use crate::vectors::mpa_frames::*;
use proptest::prelude::*;

/// MPA-52, MPA-54: the key octets.
#[test]
fn mpa_52_mpa_54_keys() {
    assert_eq!(
        REQUEST_KEY,
        [
            0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61,
            0x6D, 0x65
        ]
    );
    assert_eq!(
        REPLY_KEY,
        [
            0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61,
            0x6D, 0x65
        ]
    );
    assert_eq!(
        FrameKind::try_from(REQUEST_KEY).unwrap(),
        FrameKind::Request
    );
    assert_eq!(<[u8; 16]>::from(FrameKind::Reply), REPLY_KEY);
}

/// MPA-52, MPA-50: golden bytes of an encoded rev-1 Request (no CRC/Marker octets).
#[test]
fn mpa_52_request_golden_bytes() {
    let r = FrameRepr {
        kind: FrameKind::Request,
        m: true,
        c: true,
        r: false,
        res: 0,
        rev: REV_1,
        private_data: b"hi",
    };
    let mut buf = [0u8; 22];
    assert_eq!(r.emit(&mut buf).unwrap(), 22);
    let mut want = REQUEST_KEY.to_vec();
    want.extend_from_slice(&[0xc0, 0x01, 0x00, 0x02, b'h', b'i']);
    assert_eq!(&buf[..], &want[..]);
}

/// MPA-54, MPA-59: golden Reply with R=1 (reject) and Private Data.
#[test]
fn mpa_54_reply_golden_bytes_reject() {
    let r = FrameRepr {
        kind: FrameKind::Reply,
        m: false,
        c: true,
        r: true,
        res: 0,
        rev: REV_1,
        private_data: &[],
    };
    let mut buf = [0u8; 20];
    r.emit(&mut buf).unwrap();
    let mut want = REPLY_KEY.to_vec();
    want.extend_from_slice(&[0x60, 0x01, 0x00, 0x00]);
    assert_eq!(&buf[..], &want[..]);
    assert_eq!(FrameRepr::parse(&buf).unwrap(), r);
}

/// Real startup frames: deconstruct with the view, parse, re-emit
/// byte-identically (rev 2 with Res 0x10, C=1, rev 1, long PD).
#[test]
fn capture_frames_parse_and_reemit() {
    struct Case<'a> {
        bytes: &'a [u8],
        kind: FrameKind,
        c: bool,
        res: u8,
        rev: u8,
        pd: &'a [u8],
    }
    let cases = [
        Case {
            bytes: &SIW_RPING_REQUEST,
            kind: FrameKind::Request,
            c: false,
            res: 0x10,
            rev: 2,
            pd: &[0, 1, 0, 1],
        },
        Case {
            bytes: &SIW_RPING_REPLY,
            kind: FrameKind::Reply,
            c: false,
            res: 0x10,
            rev: 2,
            pd: &[0, 1, 0, 1],
        },
        Case {
            bytes: &SIW_CRC_RPING_REQUEST,
            kind: FrameKind::Request,
            c: true,
            res: 0x10,
            rev: 2,
            pd: &[0, 1, 0, 1],
        },
        Case {
            bytes: &SIW_CRC_RPING_REPLY,
            kind: FrameKind::Reply,
            c: true,
            res: 0x10,
            rev: 2,
            pd: &[0, 1, 0, 1],
        },
        Case {
            bytes: &SIW_MPA1_REQUEST,
            kind: FrameKind::Request,
            c: false,
            res: 0,
            rev: 1,
            pd: &[],
        },
        Case {
            bytes: &SIW_MPA1_REPLY,
            kind: FrameKind::Reply,
            c: false,
            res: 0,
            rev: 1,
            pd: &[],
        },
        Case {
            bytes: &NFS3_REQUEST,
            kind: FrameKind::Request,
            c: false,
            res: 0x10,
            rev: 2,
            pd: &NFS3_REQUEST[20..],
        },
        Case {
            bytes: &NFS3_REPLY,
            kind: FrameKind::Reply,
            c: false,
            res: 0x10,
            rev: 2,
            pd: &NFS3_REPLY[20..],
        },
        Case {
            bytes: &SEND_INV_REPLY,
            kind: FrameKind::Reply,
            c: false,
            res: 0x10,
            rev: 2,
            pd: &SEND_INV_REPLY[20..],
        },
    ];
    for c in cases {
        let f = Frame::new_checked(c.bytes).unwrap();
        assert_eq!(f.kind().unwrap(), c.kind);
        assert!(!f.m());
        assert_eq!(f.c(), c.c);
        assert!(!f.r());
        assert_eq!(f.res(), c.res);
        assert_eq!(f.rev(), c.rev);
        assert_eq!(usize::from(f.pd_length()), c.pd.len());
        assert_eq!(f.private_data(), c.pd);
        assert_eq!(f.total_len(), c.bytes.len());
        assert_eq!(FrameRepr::frame_len(c.bytes).unwrap(), Some(c.bytes.len()));

        let r = FrameRepr::parse(c.bytes).unwrap();
        assert_eq!(
            (r.kind, r.m, r.c, r.r, r.res, r.rev),
            (c.kind, false, c.c, false, c.res, c.rev)
        );
        assert_eq!(r.private_data, c.pd);
        assert_eq!(r.buffer_len(), c.bytes.len());
        let mut out = [0u8; 64];
        let n = r.emit(&mut out).unwrap();
        assert_eq!(&out[..n], c.bytes);
    }
}

/// Build a frame with the view setters.
#[test]
fn frame_view_setters() {
    let mut buf = [0xffu8; 26];
    let mut f = Frame::new_unchecked(&mut buf[..]);
    f.set_key(FrameKind::Reply);
    f.set_m(false);
    f.set_c(true);
    f.set_r(false);
    f.set_res(0x10);
    f.set_rev(2);
    f.set_pd_length(4);
    f.private_data_mut().copy_from_slice(&[0, 1, 0, 1]);
    let f = Frame::new_checked(&buf[..]).unwrap();
    assert_eq!(f.kind().unwrap(), FrameKind::Reply);
    assert!(f.c() && !f.m() && !f.r());
    assert_eq!(f.res(), 0x10);
    assert_eq!(&buf[..24], &SIW_CRC_RPING_REPLY[..]);
    let mut g = Frame::new_unchecked([0u8; 20]);
    g.set_m(true);
    g.set_m(false);
    g.set_res(0xff);
    assert_eq!(g.res(), 0x1f);
    assert!(!g.m() && !g.c() && !g.r());
    assert_eq!(g.into_inner()[16], 0x1f);
}

/// MPA-53, MPA-55, MPA-74, MPA-77: any changed key octet is refused; a
/// Request key is still recognised as a Request (Initiator/Initiator).
#[test]
fn mpa_53_mpa_55_bad_key_rejected() {
    for i in 0..KEY_LEN {
        for flip in [0x01u8, 0x20, 0x80] {
            let mut b = SIW_RPING_REQUEST;
            b[i] ^= flip;
            if b[..16] == REPLY_KEY {
                // 'q' ^ 0x01 == 'p': that is the other valid key.
                assert_eq!(FrameRepr::parse(&b).unwrap().kind, FrameKind::Reply);
                continue;
            }
            let e = FrameRepr::parse(&b).unwrap_err();
            assert!(
                matches!(e, Error::Malformed { reason, .. } if reason == REASON_BAD_KEY),
                "{i}"
            );
            assert!(FrameRepr::frame_len(&b).is_err());
            // frame_len refuses as soon as the bad octet is visible.
            assert!(FrameRepr::frame_len(&b[..=i]).is_err());
            assert_eq!(FrameRepr::frame_len(&b[..i]).unwrap(), None);
        }
    }
    assert_eq!(
        FrameRepr::parse(&SIW_RPING_REQUEST).unwrap().kind,
        FrameKind::Request
    );
}

/// MPA-62, MPA-63, MPA-79: PD_Length 513 refused on parse and in
/// frame_len; 512 accepted; emit refuses 513 octets.
#[test]
fn mpa_62_mpa_63_pd_length_bound() {
    let mut b = vec![0u8; 20 + 513];
    b[..16].copy_from_slice(&REQUEST_KEY);
    b[17] = 1;
    b[18..20].copy_from_slice(&513u16.to_be_bytes());
    assert!(matches!(
        FrameRepr::parse(&b),
        Err(Error::TooLarge {
            value: 513,
            limit: 512,
            ..
        })
    ));
    assert!(matches!(
        FrameRepr::frame_len(&b[..20]),
        Err(Error::TooLarge { .. })
    ));
    b[18..20].copy_from_slice(&0xffffu16.to_be_bytes());
    assert!(matches!(FrameRepr::parse(&b), Err(Error::TooLarge { .. })));
    b[18..20].copy_from_slice(&512u16.to_be_bytes());
    let r = FrameRepr::parse(&b).unwrap();
    assert_eq!(r.private_data.len(), 512);
    assert_eq!(FrameRepr::frame_len(&b[..20]).unwrap(), Some(532));
    // Body shorter than PD_Length: truncated, not a panic.
    assert!(matches!(
        FrameRepr::parse(&b[..531]),
        Err(Error::Truncated { need: 532, .. })
    ));
    assert!(Frame::new_checked(&b[..531]).is_err());

    let pd = [0u8; 513];
    let r = FrameRepr {
        kind: FrameKind::Reply,
        m: false,
        c: false,
        r: false,
        res: 0,
        rev: 1,
        private_data: &pd,
    };
    assert!(matches!(
        r.emit(&mut [0u8; 600]),
        Err(Error::TooLarge { .. })
    ));
    let r = FrameRepr {
        private_data: &pd[..512],
        ..r
    };
    assert_eq!(r.emit(&mut [0u8; 600]).unwrap(), 532);
}

/// MPA-59, MPA-60, MPA-61: R=1 in a Request, Res=0x1f and unusual Revs
/// are parsed and reported as they are (policy lives above the codec).
#[test]
fn mpa_59_60_61_fields_reported_raw() {
    let mut b = SIW_MPA1_REQUEST;
    b[16] = 0x20 | 0x1f;
    for rev in [0u8, 2, 255] {
        b[17] = rev;
        let r = FrameRepr::parse(&b).unwrap();
        assert!(r.r);
        assert_eq!(r.res, 0x1f);
        assert_eq!(r.rev, rev);
        let mut out = [0u8; 20];
        r.emit(&mut out).unwrap();
        assert_eq!(out, b);
    }
    let r = FrameRepr::parse(&b).unwrap();
    let bad = FrameRepr { res: 0x20, ..r };
    assert!(matches!(
        bad.emit(&mut [0u8; 20]),
        Err(Error::TooLarge { .. })
    ));
}

/// MPA-66, MPA-79: every truncation of a frame is an error (never a panic),
/// frame_len says "need more" until the whole header is there.
#[test]
fn mpa_66_frame_truncations() {
    for f in [&SIW_RPING_REQUEST[..], &NFS3_REPLY, &SIW_MPA1_REPLY] {
        for n in 0..f.len() {
            assert!(
                matches!(FrameRepr::parse(&f[..n]), Err(Error::Truncated { .. })),
                "{n}"
            );
            assert!(Frame::new_checked(&f[..n]).is_err());
            let fl = FrameRepr::frame_len(&f[..n]).unwrap();
            assert_eq!(fl, if n < 20 { None } else { Some(f.len()) });
        }
        let r = FrameRepr::parse(f).unwrap();
        for n in 0..f.len() {
            let mut out = vec![0u8; n];
            assert!(matches!(r.emit(&mut out), Err(Error::Truncated { .. })));
        }
    }
}

fn arb_frame() -> impl Strategy<Value = (FrameKind, bool, bool, bool, u8, u8, Vec<u8>)> {
    (
        prop_oneof![Just(FrameKind::Request), Just(FrameKind::Reply)],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u8..32,
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..=512),
    )
}

proptest! {
    /// MPA-52/54/62: emit -> parse -> emit for arbitrary frames.
    #[test]
    fn prop_frame_roundtrip((kind, m, c, r, res, rev, pd) in arb_frame()) {
        let f = FrameRepr { kind, m, c, r, res, rev, private_data: &pd };
        let mut buf = vec![0u8; f.buffer_len()];
        prop_assert_eq!(f.emit(&mut buf).unwrap(), buf.len());
        prop_assert_eq!(FrameRepr::frame_len(&buf).unwrap(), Some(buf.len()));
        let p = FrameRepr::parse(&buf).unwrap();
        prop_assert_eq!(p, f);
        let mut again = vec![0u8; p.buffer_len()];
        p.emit(&mut again).unwrap();
        prop_assert_eq!(again, buf);
    }

    /// MPA-79: arbitrary bytes never panic any frame parser.
    #[test]
    fn prop_frame_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..600), keyed in any::<bool>(), req in any::<bool>()) {
        let mut data = data;
        if keyed && data.len() >= 16 {
            data[..16].copy_from_slice(if req { &REQUEST_KEY } else { &REPLY_KEY });
        }
        let _ = FrameRepr::frame_len(&data);
        if let Ok(r) = FrameRepr::parse(&data) {
            prop_assert_eq!(FrameRepr::frame_len(&data).unwrap(), Some(r.buffer_len()));
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out).unwrap();
            prop_assert_eq!(&out[..], &data[..r.buffer_len()]);
            let _ = r.rev2_params();
        }
        if let Ok(f) = Frame::new_checked(&data[..]) {
            let _ = (f.kind(), f.m(), f.c(), f.r(), f.res(), f.rev(), f.private_data(), f.total_len());
        }
        let _ = Rev2Params::parse(&data);
    }
}
