#![no_main]
//! One ULPDU (DDP header + RDMAP header or payload): `rdmap::Segment::parse`
//! never panics; whatever parses re-emits byte-identically and parses back to
//! the same segment. The DDP and Terminate views and the stand-alone RDMAP
//! header reprs are exercised on the same bytes.

use libfuzzer_sys::fuzz_target;
use softrdma_wire::{ddp, rdmap};

fuzz_target!(|data: &[u8]| {
    // DDP header view and repr.
    let h = ddp::Header::new_unchecked(data);
    let _ = (
        h.control(),
        h.rsvd_ulp(),
        h.stag(),
        h.to(),
        h.qn(),
        h.msn(),
        h.mo(),
    );
    if let Ok(d) = ddp::Repr::parse(data) {
        let mut out = [0u8; ddp::UNTAGGED_HEADER_LEN];
        let n = d.emit(&mut out).expect("DDP re-emit");
        assert_eq!(&out[..n], &data[..n]);
    }

    // The stand-alone RDMAP headers, on the octets after an untagged DDP header.
    let rest = data.get(ddp::UNTAGGED_HEADER_LEN..).unwrap_or(&[]);
    for layout in [
        rdmap::TerminateLayout::Rfc5040,
        rdmap::TerminateLayout::LinuxSiw,
    ] {
        let v = rdmap::TerminateHeader::new_unchecked_with_layout(rest, layout);
        let _ = (
            v.layer(),
            v.etype(),
            v.error_code(),
            v.m(),
            v.d(),
            v.r(),
            v.reserved(),
        );
        let _ = (
            v.ddp_segment_length(),
            v.terminated_ddp_header(),
            v.terminated_rdma_header(),
        );
        if let Ok(t) = rdmap::TerminateRepr::parse_with_layout(rest, layout) {
            let mut out = vec![0u8; t.buffer_len()];
            assert_eq!(t.emit(&mut out), Ok(rest.len()));
            assert_eq!(&out[..], rest);
        }
    }
    let _ = rdmap::ReadRequestRepr::parse(rest);
    let _ = rdmap::AtomicRequestRepr::parse(rest);
    let _ = rdmap::AtomicResponseRepr::parse(rest);
    let _ = rdmap::ImmediateDataRepr::parse(rest);

    // The whole segment.
    let seg = match rdmap::Segment::parse(data) {
        Ok(seg) => seg,
        Err(e) => {
            let _ = rdmap::terminate_code_for(&e);
            return;
        }
    };
    assert_eq!(seg.buffer_len(), data.len());
    let mut out = vec![0u8; seg.buffer_len()];
    assert_eq!(seg.emit(&mut out), Ok(data.len()));
    assert_eq!(&out[..], data);
    assert_eq!(rdmap::Segment::parse(&out), Ok(seg));
    // A short buffer is an error, never a panic.
    if let Some(n) = out.len().checked_sub(1) {
        assert!(seg.emit(&mut out[..n]).is_err());
    }
});
