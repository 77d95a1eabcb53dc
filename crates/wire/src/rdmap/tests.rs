//! Tests that cross the header families: every view's setters, every emitter into
//! short buffers, and every parser on arbitrary bytes.

use super::test_util::*;
use super::*;
use crate::ddp::{self, DdpError};
use crate::error::Error;
use crate::vectors::rdmap_ulpdus::*;
use proptest::prelude::*;

/// Construct the RFC 7306 headers and a Terminate with the views' setters.
#[test]
fn views_build_headers_with_setters() {
    let mut buf = [0u8; 52];
    let mut a = AtomicRequestHeader::new_checked(&mut buf[..]).unwrap();
    a.set_reserved_and_opcode(0, AtomicOpcode::Swap.into());
    a.set_request_identifier(1);
    a.set_remote_stag(2);
    a.set_remote_tagged_offset(3);
    a.set_add_or_swap_data(4);
    a.set_add_or_swap_mask(5);
    a.set_compare_data(6);
    a.set_compare_mask(7);
    let r = AtomicRequestRepr::parse(&buf).unwrap();
    assert_eq!(
        (
            r.opcode,
            r.request_identifier,
            r.remote_stag,
            r.compare_mask
        ),
        (AtomicOpcode::Swap, 1, 2, 7)
    );

    let mut buf = [0u8; 12];
    let mut a = AtomicResponseHeader::new_checked(&mut buf[..]).unwrap();
    a.set_original_request_identifier(9);
    a.set_original_remote_data_value(10);
    assert_eq!(
        AtomicResponseRepr::parse(&buf),
        Ok(AtomicResponseRepr {
            original_request_identifier: 9,
            original_remote_data_value: 10
        })
    );

    let mut buf = [0u8; 8];
    ImmediateDataHeader::new_checked(&mut buf[..])
        .unwrap()
        .set_immediate_data(*b"imm-data");
    assert_eq!(
        ImmediateDataRepr::parse(&buf).unwrap().immediate_data,
        *b"imm-data"
    );

    let mut buf = [0u8; 24];
    buf[6] = 0x41;
    for layout in [TerminateLayout::Rfc5040, TerminateLayout::LinuxSiw] {
        let mut t = TerminateHeader::new_unchecked_with_layout(&mut buf[..], layout);
        assert!(t.set_ddp_segment_length(1).is_err());
        t.set_layer(1);
        t.set_etype(2);
        t.set_error_code(4);
        t.set_m(true);
        t.set_d(true);
        t.set_r(false);
        t.set_reserved(0);
        t.set_ddp_segment_length(0x12).unwrap();
        assert!(t.check_len().is_ok());
        let repr = TerminateRepr::parse_with_layout(&buf, layout).unwrap();
        assert_eq!(
            repr.code,
            TerminateCode::Ddp(DdpError::UntaggedBuffer(
                ddp::UntaggedBufferError::InvalidMo
            ))
        );
        assert_eq!(repr.ddp.unwrap().segment_length, 0x12);
    }

    let mut buf = [0u8; 28];
    let mut rr = ReadRequestHeader::new_checked(&mut buf[..]).unwrap();
    rr.set_sink_stag(0x1122_3344);
    rr.set_sink_to(0x7f00_0000_1000);
    rr.set_rdmardsz(4096);
    rr.set_src_stag(0x5566_7788);
    rr.set_src_to(0x7f00_0000_8000);
    assert_eq!(buf, READ_REQUEST_1_BYTES);
}

/// Emit into a short buffer is `Truncated`, never a panic.
#[test]
fn emit_into_short_buffers() {
    let seg = Segment::parse(&SIW_BAD_READ_TERMINATE).unwrap();
    for len in 0..SIW_BAD_READ_TERMINATE.len() {
        let mut out = vec![0u8; len];
        assert!(matches!(seg.emit(&mut out), Err(Error::Truncated { .. })));
    }
    let Body::Terminate(t) = seg.body else {
        panic!()
    };
    assert!(t.emit(&mut [0; 51]).is_err());
    assert!(read_request_1().emit(&mut [0; 27]).is_err());
    assert!(atomic_request_1().emit(&mut [0; 51]).is_err());
    assert!(AtomicResponseRepr::default().emit(&mut [0; 11]).is_err());
    assert!(ImmediateDataRepr::default().emit(&mut [0; 7]).is_err());
    assert!(Control::new(Opcode::Send).emit(&mut []).is_err());
}

/// ULPDU-shaped bytes: a plausible DDP/RDMAP header, then anything.
fn arb_ulpdu_like() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(vec![0x41u8, 0xc1, 0x01, 0x81, 0x43, 0x00]),
        any::<u8>(),
        any::<[u8; 4]>(),
        0u32..5,
        any::<u32>(),
        prop_oneof![Just(0u32), any::<u32>()],
        proptest::collection::vec(any::<u8>(), 0..80),
    )
        .prop_map(|(c0, c1, inv, qn, msn, mo, tail)| {
            let mut v = vec![c0, c1];
            v.extend_from_slice(&inv);
            v.extend_from_slice(&qn.to_be_bytes());
            v.extend_from_slice(&msn.to_be_bytes());
            v.extend_from_slice(&mo.to_be_bytes());
            v.extend_from_slice(&tail);
            v
        })
}

proptest! {
    /// Fixed-size headers: emit -> parse -> emit.
    #[test]
    fn prop_fixed_headers_round_trip(
        rr in arb_read_request(),
        aq in arb_atomic_request(),
        ap in arb_atomic_response(),
        im in arb_immediate(),
        octet in any::<u8>(),
    ) {
        let mut b = [0u8; 52];
        rr.emit(&mut b).unwrap();
        prop_assert_eq!(ReadRequestRepr::parse(&b), Ok(rr));
        aq.emit(&mut b).unwrap();
        prop_assert_eq!(AtomicRequestRepr::parse(&b), Ok(aq));
        ap.emit(&mut b).unwrap();
        prop_assert_eq!(AtomicResponseRepr::parse(&b), Ok(ap));
        im.emit(&mut b).unwrap();
        prop_assert_eq!(ImmediateDataRepr::parse(&b), Ok(im));
        if let Ok(c) = Control::from_octet(octet) {
            prop_assert_eq!(c.octet(), Ok(octet));
        }
    }

    /// Arbitrary bytes never panic any parser; an accepted ULPDU re-emits exactly.
    #[test]
    fn prop_arbitrary_bytes_never_panic(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..120),
            arb_ulpdu_like(),
        ]
    ) {
        match Segment::parse(&bytes) {
            Ok(seg) => prop_assert_eq!(emit_vec(&seg), bytes.clone()),
            Err(e) => {
                let _ = terminate_code_for(&e);
            }
        }
        let tail = bytes.get(18..).unwrap_or(&[]);
        for b in [&bytes[..], tail] {
            if let Ok(t) = TerminateRepr::parse(b) {
                let mut out = vec![0u8; t.buffer_len()];
                t.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..], b);
            }
            for layout in [TerminateLayout::Rfc5040, TerminateLayout::LinuxSiw] {
                let v = TerminateHeader::new_unchecked_with_layout(b, layout);
                let _ = (v.layer(), v.etype(), v.error_code(), v.m(), v.d(), v.r());
                let _ = (v.reserved(), v.header_len(), v.ddp_segment_length());
                let _ = (v.terminated_ddp_header(), v.terminated_rdma_header());
            }
            if let Ok(v) = TerminateHeader::new_checked(b) {
                prop_assert!(v.header_len().unwrap() <= b.len());
            }
            let _ = ReadRequestRepr::parse(b);
            let _ = AtomicRequestRepr::parse(b);
            let _ = AtomicResponseRepr::parse(b);
            let _ = ImmediateDataRepr::parse(b);
            let _ = Control::parse(b);
        }
        if bytes.len() >= 3 {
            let _ = TerminateCode::from_parts(bytes[0], bytes[1], bytes[2]);
        }
    }
}
