//! Tests of the RDMA Read Request Header (RFC 5040 §4.4): golden bytes, exact length,
//! an siw capture and the Terminated RDMA Header of a partial Read.

use super::*;
use crate::ddp;
use crate::error::Error;
use crate::rdmap::test_util::*;
use crate::rdmap::{
    Body, Opcode, RemoteOperationError, Segment, TerminateCode, Violation, classify,
    terminate_code_for,
};
use crate::vectors::rdmap_ulpdus::*;

/// RDMAP-42, RDMAP-23: Read Request golden bytes (QN 1, 28-octet header).
#[test]
fn rdmap_42_23_read_request_golden() {
    let mut bytes = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
    bytes.extend_from_slice(&READ_REQUEST_1_BYTES);
    golden(
        &bytes,
        Segment::new(
            untagged(Opcode::RdmaReadRequest, 1, 1, 0, true),
            Body::RdmaReadRequest(read_request_1()),
        ),
    );
    let h = ReadRequestHeader::new_checked(&READ_REQUEST_1_BYTES[..]).unwrap();
    assert_eq!(h.sink_stag(), 0x1122_3344);
    assert_eq!(h.sink_to(), 0x7f00_0000_1000);
    assert_eq!(h.rdmardsz(), 4096);
    assert_eq!(h.src_stag(), 0x5566_7788);
    assert_eq!(h.src_to(), 0x7f00_0000_8000);
}

/// RDMAP-22, RDMAP-23: a Read Request carries exactly 28 octets; 27 is
/// truncated, 29 is refused (Terminate 0/2/0xFF).
#[test]
fn rdmap_22_23_read_request_exact_length() {
    let short = &SIW_READ_BW_READ_REQUEST[..45];
    assert_eq!(
        Segment::parse(short),
        Err(Error::Truncated {
            layer: Layer::Rdmap,
            need: 46,
            have: 45
        })
    );
    assert!(ReadRequestRepr::parse(&SIW_READ_BW_READ_REQUEST[18..45]).is_err());
    let mut long = SIW_READ_BW_READ_REQUEST.to_vec();
    long.push(0);
    let err = Segment::parse(&long).unwrap_err();
    assert_eq!(classify(&err), Some(Violation::TrailingOctets));
    assert_eq!(
        terminate_code_for(&err),
        Some(TerminateCode::RdmaRemoteOperation(
            RemoteOperationError::Unspecified
        ))
    );
}

/// siw-ib_read_bw.pcap frame 39 (RDMAP-23, RDMAP-42): Read Request for 4096 octets.
#[test]
fn siw_ib_read_bw_read_request_capture() {
    let h = ddp::Header::new_checked(&SIW_READ_BW_READ_REQUEST[..]).unwrap();
    assert_eq!((h.qn(), h.msn(), h.mo()), (Some(1), Some(1), Some(0)));
    let rr = ReadRequestHeader::new_checked(h.payload()).unwrap();
    assert_eq!(rr.sink_stag(), 0x1e44_5300);
    assert_eq!(rr.sink_to(), 0x0000_55ac_bf91_1000);
    assert_eq!(rr.rdmardsz(), 0x1000);
    assert_eq!(rr.src_stag(), 0x96cb_0000);
    assert_eq!(rr.src_to(), 0x0000_55b2_d1e5_1000);
    let seg = round_trip(&SIW_READ_BW_READ_REQUEST);
    assert_eq!(
        seg.body,
        Body::RdmaReadRequest(ReadRequestRepr::parse(h.payload()).unwrap())
    );
}

/// RDMAP-33: a 4096-octet Read aborted after 2048 octets.
#[test]
fn rdmap_33_terminated_rdma_header_after_partial_read() {
    let rr = read_request_1();
    let left = rr.advanced(2048);
    assert_eq!(left.sink_stag, rr.sink_stag);
    assert_eq!(left.src_stag, rr.src_stag);
    assert_eq!(left.sink_to, rr.sink_to + 2048);
    assert_eq!(left.src_to, rr.src_to + 2048);
    assert_eq!(left.rdmardsz, 2048);
    assert_eq!(rr.advanced(0), rr);
}
