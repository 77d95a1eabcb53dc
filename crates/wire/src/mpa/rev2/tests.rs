//! Tests of the RFC 6581 IRD/ORD word: real rev-2 frames and the flag layout Linux siw
//! uses (EXT-6581-01).

use super::*;
use crate::error::Error;
use crate::mpa::{FrameKind, FrameRepr, RES_ENHANCED};
use crate::vectors::mpa_frames::*;
use proptest::prelude::*;

/// EXT-6581-01: IRD/ORD words of real rev-2 frames.
#[test]
fn ext_6581_01_rev2_params_from_captures() {
    let p = FrameRepr::parse(&SIW_RPING_REQUEST)
        .unwrap()
        .rev2_params()
        .unwrap()
        .unwrap();
    assert_eq!(
        p,
        Rev2Params {
            ird: 1,
            ord: 1,
            ..Default::default()
        }
    );
    let p = FrameRepr::parse(&NFS3_REQUEST)
        .unwrap()
        .rev2_params()
        .unwrap()
        .unwrap();
    assert_eq!(
        p,
        Rev2Params {
            ird: 128,
            ord: 0,
            ..Default::default()
        }
    );
    let p = FrameRepr::parse(&NFS3_REPLY)
        .unwrap()
        .rev2_params()
        .unwrap()
        .unwrap();
    assert_eq!(
        p,
        Rev2Params {
            ird: 0,
            ord: 128,
            ..Default::default()
        }
    );
    // Rev 1 has no IRD/ORD word.
    assert_eq!(
        FrameRepr::parse(&SIW_MPA1_REQUEST)
            .unwrap()
            .rev2_params()
            .unwrap(),
        None
    );
    // Re-emit the words byte-identically.
    for f in [
        &SIW_RPING_REQUEST[..],
        &NFS3_REQUEST,
        &NFS3_REPLY,
        &SEND_INV_REPLY,
    ] {
        let r = FrameRepr::parse(f).unwrap();
        let p = r.rev2_params().unwrap().unwrap();
        let mut w = [0u8; 4];
        assert_eq!(p.emit(&mut w).unwrap(), 4);
        assert_eq!(&w, &r.private_data[..4]);
    }
}

/// EXT-6581-01: flag bits where Linux siw puts them (MPA_V2_* constants on
/// two big-endian u16s).
#[test]
fn ext_6581_01_rev2_flag_layout() {
    assert_eq!(Rev2Params::PEER_TO_PEER, 0x8000);
    assert_eq!(Rev2Params::ZERO_LENGTH_RTR, 0x4000);
    assert_eq!(Rev2Params::RDMA_WRITE_RTR, 0x8000);
    assert_eq!(Rev2Params::RDMA_READ_RTR, 0x4000);
    assert_eq!(Rev2Params::IRD_ORD_MASK, 0x3fff);
    let cases = [
        (
            Rev2Params {
                p2p: true,
                ..Default::default()
            },
            [0x80, 0, 0, 0],
        ),
        (
            Rev2Params {
                zero_len_rtr: true,
                ..Default::default()
            },
            [0x40, 0, 0, 0],
        ),
        (
            Rev2Params {
                write_rtr: true,
                ..Default::default()
            },
            [0, 0, 0x80, 0],
        ),
        (
            Rev2Params {
                read_rtr: true,
                ..Default::default()
            },
            [0, 0, 0x40, 0],
        ),
        (
            Rev2Params {
                ird: 0x3fff,
                ord: 0x2001,
                ..Default::default()
            },
            [0x3f, 0xff, 0x20, 0x01],
        ),
        (
            Rev2Params {
                p2p: true,
                zero_len_rtr: false,
                write_rtr: true,
                read_rtr: true,
                ird: 16,
                ord: 4,
            },
            [0x80, 0x10, 0xc0, 0x04],
        ),
    ];
    for (p, wire) in cases {
        let mut w = [0u8; 4];
        p.emit(&mut w).unwrap();
        assert_eq!(w, wire, "{p:?}");
        assert_eq!(Rev2Params::parse(&wire).unwrap(), p);
    }
    let bad = Rev2Params {
        ird: 0x4000,
        ..Default::default()
    };
    assert!(matches!(
        bad.emit(&mut [0u8; 4]),
        Err(Error::TooLarge { .. })
    ));
    let bad = Rev2Params {
        ord: 0xffff,
        ..Default::default()
    };
    assert!(matches!(
        bad.emit(&mut [0u8; 4]),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        Rev2Params::default().emit(&mut [0u8; 3]),
        Err(Error::Truncated { .. })
    ));
    assert!(matches!(
        Rev2Params::parse(&[0, 1, 0]),
        Err(Error::Truncated { .. })
    ));
    // A rev-2 frame too short for the word.
    let r = FrameRepr {
        kind: FrameKind::Request,
        m: false,
        c: false,
        r: false,
        res: RES_ENHANCED,
        rev: 2,
        private_data: &[1],
    };
    assert!(matches!(r.rev2_params(), Err(Error::Truncated { .. })));
}

proptest! {
    /// EXT-6581-01 round trip.
    #[test]
    fn prop_rev2_roundtrip(p2p: bool, z: bool, w: bool, r: bool, ird in 0u16..0x4000, ord in 0u16..0x4000) {
        let p = Rev2Params { p2p, zero_len_rtr: z, write_rtr: w, read_rtr: r, ird, ord };
        let mut b = [0u8; 4];
        p.emit(&mut b).unwrap();
        prop_assert_eq!(Rev2Params::parse(&b).unwrap(), p);
    }
}
