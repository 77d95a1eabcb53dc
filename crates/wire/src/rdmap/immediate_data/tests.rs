//! Tests of the RFC 7306 Immediate Data Header.

use super::*;
use crate::error::Error;
use crate::rdmap::test_util::*;
use crate::rdmap::{Body, Opcode, Segment, Violation, classify};

/// RFC 7306: Immediate Data and Immediate Data with SE (QN 0, 8 octets).
#[test]
fn rfc7306_immediate_data_golden() {
    for (op, octet) in [
        (Opcode::ImmediateData, 0x48),
        (Opcode::ImmediateDataWithSe, 0x49),
    ] {
        let bytes = [
            0x41, octet, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        let imm = ImmediateDataRepr {
            immediate_data: [1, 2, 3, 4, 5, 6, 7, 8],
        };
        let body = if op == Opcode::ImmediateData {
            Body::ImmediateData(imm)
        } else {
            Body::ImmediateDataWithSe(imm)
        };
        golden(&bytes, Segment::new(untagged(op, 0, 4, 0, true), body));
        assert_eq!(
            ImmediateDataHeader::new_checked(&bytes[18..])
                .unwrap()
                .immediate_data(),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        // Exactly 8 octets: one more is refused, one less is truncated.
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(
            classify(&Segment::parse(&long).unwrap_err()),
            Some(Violation::TrailingOctets)
        );
        assert!(matches!(
            Segment::parse(&bytes[..25]),
            Err(Error::Truncated { .. })
        ));
    }
}
