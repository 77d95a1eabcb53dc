#![no_main]
//! MPA startup frames (RFC 5044 §7.1.1, RFC 6581): parsing never panics, and
//! whatever parses re-emits byte-identically (Res and Rev are kept raw).

use libfuzzer_sys::fuzz_target;
use softrdma_wire::mpa::{FRAME_HEADER_LEN, Frame, FrameRepr, MAX_PRIVATE_DATA, Rev2Params};

fuzz_target!(|data: &[u8]| {
    let len = FrameRepr::frame_len(data);
    if let Ok(repr) = FrameRepr::parse(data) {
        // frame_len agrees with what parse consumed.
        assert_eq!(len, Ok(Some(repr.buffer_len())));
        let mut out = [0u8; FRAME_HEADER_LEN + MAX_PRIVATE_DATA];
        let n = repr.emit(&mut out).expect("emit of a parsed frame");
        assert_eq!(n, repr.buffer_len());
        assert_eq!(&out[..n], &data[..n]);
        assert_eq!(FrameRepr::parse(&out[..n]), Ok(repr));
        // A shorter buffer is an error, never a panic.
        assert!(repr.emit(&mut out[..n - 1]).is_err());
        if let Ok(Some(p)) = repr.rev2_params() {
            // P|Z|IRD(14) W|R|ORD(14) covers all 32 bits: exact re-emit.
            let mut w = [0u8; Rev2Params::LEN];
            p.emit(&mut w).expect("emit of parsed IRD/ORD");
            assert_eq!(&w[..], &repr.private_data[..Rev2Params::LEN]);
        }
    }
    if let Ok(f) = Frame::new_checked(data) {
        let _ = (f.kind(), f.m(), f.c(), f.r(), f.res(), f.rev());
        assert_eq!(f.private_data().len(), usize::from(f.pd_length()));
    }
    let _ = Rev2Params::parse(data);
});
