#![no_main]
//! A MAD on QP1 as the CM receives it (IBA §13.4, §12.6): the header and every CM message
//! parse without a panic, and what parses re-emits to octets that parse the same.

use libfuzzer_sys::fuzz_target;
use softrdma_wire::ib::cm::CmMessage;
use softrdma_wire::ib::mad::{MAD_DATA_LEN, MAD_HEADER_LEN, MadHeaderRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = MadHeaderRepr::parse(data) else {
        return;
    };
    let mut hb = [0u8; MAD_HEADER_LEN];
    h.emit(&mut hb).expect("a header fits its length");
    assert_eq!(MadHeaderRepr::parse(&hb).expect("ours parse"), h);
    let body = &data[MAD_HEADER_LEN..];
    if let Ok(m) = CmMessage::parse(h.attribute_id, body) {
        let mut out = [0u8; MAD_DATA_LEN];
        m.emit(&mut out).expect("a parsed message fits");
        assert_eq!(
            CmMessage::parse(h.attribute_id, &out).expect("ours parse"),
            m
        );
    }
});
