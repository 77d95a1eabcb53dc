#![no_main]
//! IB transport packet (BTH .. pad, ICRC excluded): `PacketRepr::parse`
//! never panics; whatever parses re-emits byte-identically and parses back
//! to the same repr. The header views and reprs are exercised too.

use libfuzzer_sys::fuzz_target;
use softrdma_wire::ib::{
    AethRepr, Bth, BthRepr, Opcode, PacketRepr, psn_cmp, psn_diff, psn_region,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Bth::new_checked(data) {
        let _ = (h.opcode(), h.pad_cnt(), h.dest_qp(), h.psn(), h.resv7());
        let (a, b) = (h.psn(), h.dest_qp());
        assert_eq!(psn_diff(a, b) == 0, a == b);
        let _ = (psn_cmp(a, b), psn_region(a, b));
    }
    if let Ok(b) = BthRepr::parse(data) {
        let mut out = [0u8; 12];
        b.emit(&mut out).expect("BTH re-emit");
        assert_eq!(&out[..], &data[..12]);
        assert_eq!(Opcode::try_from(data[0]), Ok(b.opcode));
    }
    let _ = AethRepr::parse(data);

    let Ok(p) = PacketRepr::parse(data) else {
        return;
    };
    p.check().expect("parsed packet matches its opcode");
    assert_eq!(p.buffer_len(), data.len());
    let mut out = vec![0u8; p.buffer_len()];
    assert_eq!(p.emit(&mut out), Ok(data.len()));
    assert_eq!(&out[..], data);
    assert_eq!(PacketRepr::parse(&out), Ok(p));
    // A short buffer is an error, never a panic.
    if !out.is_empty() {
        let n = out.len() - 1;
        assert!(p.emit(&mut out[..n]).is_err());
    }
});
