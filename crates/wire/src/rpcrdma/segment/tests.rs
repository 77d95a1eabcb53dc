//! Tests of the plain and read segments (RFC 8166 §4.1.2, RPCRDMA-01).

use super::*;
use crate::rpcrdma::test_util::*;
use proptest::prelude::*;

/// RPCRDMA-01: a plain segment is `H L OO`, 32-bit handle, 64-bit offset
/// (high word first); a read segment prefixes the Position.
#[test]
fn rpcrdma_01_segment_codec() {
    let s = Segment {
        handle: 0xffff_fffe,
        length: 0x1234,
        offset: 0x0102_0304_0506_0708,
    };
    let mut b = [0u8; 20];
    assert_eq!(s.emit(&mut b).unwrap(), 16);
    assert_eq!(
        b[..16],
        [
            0xff, 0xff, 0xff, 0xfe, 0, 0, 0x12, 0x34, 1, 2, 3, 4, 5, 6, 7, 8
        ]
    );
    assert_eq!(Segment::parse(&b).unwrap(), s);
    let r = ReadSegment::new(0x84, s);
    assert_eq!(r.emit(&mut b).unwrap(), 20);
    assert_eq!(b[..4], [0, 0, 0, 0x84]);
    assert_eq!(ReadSegment::parse(&b).unwrap(), r);
    assert_eq!(r.target(), s);
    for n in 0..16 {
        assert!(Segment::parse(&b[..n]).is_err());
        assert!(s.emit(&mut [0u8; 16][..n]).is_err());
    }
}

proptest! {
    #[test]
    fn prop_round_trip_segments(s in any_segment(), r in any_read_segment()) {
        let mut b = [0u8; 20];
        s.emit(&mut b).unwrap();
        prop_assert_eq!(Segment::parse(&b).unwrap(), s);
        r.emit(&mut b).unwrap();
        prop_assert_eq!(ReadSegment::parse(&b).unwrap(), r);
    }
}
