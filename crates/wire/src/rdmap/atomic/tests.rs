//! Tests of the RFC 7306 §5 Atomic Request and Atomic Response Headers.

use super::*;
use crate::rdmap::test_util::*;
use crate::rdmap::{
    Body, Opcode, RemoteOperationError, Segment, TerminateCode, Violation, classify,
    terminate_code_for,
};

/// RFC 7306: Atomic Request (QN 1, 52 octets) and Atomic Response (QN 3, 12 octets).
#[test]
fn rfc7306_atomic_golden() {
    let mut req = vec![0x41, 0x4a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0];
    req.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 7, 0xab, 0xcd, 0xef, 0x01]);
    req.extend_from_slice(&0x1000_2000_3000_4000u64.to_be_bytes());
    req.extend_from_slice(&[0x11; 8]);
    req.extend_from_slice(&[0xff; 8]);
    req.extend_from_slice(&[0x22; 8]);
    req.extend_from_slice(&[0xff; 8]);
    assert_eq!(req.len(), 18 + ATOMIC_REQUEST_HEADER_LEN);
    golden(
        &req,
        Segment::new(
            untagged(Opcode::AtomicRequest, 1, 5, 0, true),
            Body::AtomicRequest(atomic_request_1()),
        ),
    );
    let h = AtomicRequestHeader::new_checked(&req[18..]).unwrap();
    assert_eq!(h.reserved(), 0);
    assert_eq!(h.atomic_opcode(), 2);
    assert_eq!(h.request_identifier(), 7);
    assert_eq!(h.remote_stag(), 0xabcd_ef01);
    assert_eq!(h.remote_tagged_offset(), 0x1000_2000_3000_4000);
    assert_eq!(h.add_or_swap_data(), 0x1111_1111_1111_1111);
    assert_eq!(h.add_or_swap_mask(), u64::MAX);
    assert_eq!(h.compare_data(), 0x2222_2222_2222_2222);
    assert_eq!(h.compare_mask(), u64::MAX);

    let mut resp = vec![0x41, 0x4b, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 0];
    resp.extend_from_slice(&[0, 0, 0, 7, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1]);
    let ar = AtomicResponseRepr {
        original_request_identifier: 7,
        original_remote_data_value: 0xdead_beef_0000_0001,
    };
    golden(
        &resp,
        Segment::new(
            untagged(Opcode::AtomicResponse, 3, 5, 0, true),
            Body::AtomicResponse(ar),
        ),
    );
    let h = AtomicResponseHeader::new_checked(&resp[18..]).unwrap();
    assert_eq!(h.original_request_identifier(), 7);
    assert_eq!(h.original_remote_data_value(), 0xdead_beef_0000_0001);

    // Atomic Operation codes 0..2 are defined; 3..15 are not.
    let ops: Vec<u8> = AtomicOpcode::ALL.iter().map(|&o| o.into()).collect();
    assert_eq!(ops, [0, 1, 2]);
    for code in 0x03..=0x0F {
        req[18 + 3] = code;
        let err = Segment::parse(&req).unwrap_err();
        assert_eq!(
            err,
            Error::Unknown {
                layer: Layer::Rdmap,
                field: FIELD_ATOMIC_OPCODE,
                value: code.into(),
            }
        );
        assert_eq!(classify(&err), Some(Violation::UndefinedAtomicOpcode));
        assert_eq!(
            terminate_code_for(&err),
            Some(TerminateCode::RdmaRemoteOperation(
                RemoteOperationError::UnexpectedOpcode
            ))
        );
    }
    // The code is checked only once the header is whole: a truncated request is
    // Truncated, not an undefined operation.
    assert!(matches!(
        Segment::parse(&req[..18 + ATOMIC_REQUEST_HEADER_LEN - 1]),
        Err(Error::Truncated { .. })
    ));
    // The 28 reserved bits are kept.
    req[18..22].copy_from_slice(&[0xab, 0xcd, 0xef, 0x11]);
    let seg = round_trip(&req);
    let Body::AtomicRequest(a) = seg.body else {
        panic!()
    };
    assert_eq!((a.reserved, a.opcode), (0x0abc_def1, AtomicOpcode::Swap));
    let too_wide = AtomicRequestRepr {
        reserved: 0x1000_0000,
        ..a
    };
    assert!(matches!(
        too_wide.emit(&mut [0; 52]),
        Err(Error::TooLarge { .. })
    ));
}
