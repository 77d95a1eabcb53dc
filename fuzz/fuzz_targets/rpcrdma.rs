#![no_main]
//! RPC-over-RDMA Version One headers (RFC 8166 §4) and RFC 8797 private data:
//! parsing never panics, the lazily decoded chunk lists iterate without
//! panicking, and whatever parses re-emits byte-identically (RDMA_MSGP and
//! RDMA_DONE parse for reporting only and are refused by emit).

use libfuzzer_sys::fuzz_target;
use softrdma_wire::rpcrdma::{Body, Header, PrivateData, PrivateDataRepr, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::new_checked(data) {
        let _ = (h.rdma_xid(), h.rdma_vers(), h.rdma_credit(), h.rdma_proc());
        let _ = h.check_message_len();
    }
    if let Ok((repr, len)) = Repr::parse(data) {
        assert!(len <= data.len());
        assert_eq!(repr.buffer_len(), len);
        if let Some(c) = repr.chunks() {
            assert_eq!(c.read_list.iter().count(), c.read_list.len());
            assert_eq!(c.write_list.iter().count(), c.write_list.len());
            for chunk in c.write_list.iter().chain(c.reply_chunk) {
                assert_eq!(chunk.iter().count(), chunk.len());
                let _ = chunk.total_len();
            }
        }
        let mut out = vec![0u8; len];
        match repr.body {
            Body::MsgP { .. } | Body::Done => assert!(repr.emit(&mut out).is_err()),
            _ => {
                assert_eq!(repr.emit(&mut out), Ok(len));
                assert_eq!(&out[..], &data[..len]);
                // Re-parse what was emitted: the same header.
                assert_eq!(Repr::parse(&out), Ok((repr, len)));
                // A shorter buffer is an error, never a panic.
                assert!(repr.emit(&mut out[..len - 1]).is_err());
                if len < data.len() {
                    let _ = repr.check_payload_xid(&data[len..]);
                }
            }
        }
    }
    if let Ok(p) = PrivateData::new_checked(data) {
        let _ = (
            p.format_identifier(),
            p.version(),
            p.flags(),
            p.send_size(),
            p.receive_size(),
        );
    }
    if let Ok(p) = PrivateDataRepr::parse(data) {
        let mut out = [0u8; 8];
        assert_eq!(p.emit(&mut out), Ok(8));
        assert_eq!(&out[..], &data[..8]);
    }
});
