#![no_main]
//! ONC RPC `rpc_msg` headers (RFC 5531 §9) with AUTH_NONE / AUTH_SYS / opaque
//! credentials: parsing never panics and whatever parses re-emits
//! byte-identically.

use libfuzzer_sys::fuzz_target;
use softrdma_wire::onc_rpc::{AuthSys, Header, OpaqueAuth, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::new_checked(data) {
        let _ = (h.xid(), h.msg_type());
    }
    if let Ok((repr, len)) = Repr::parse(data) {
        assert!(len <= data.len());
        assert_eq!(repr.buffer_len(), len);
        let mut out = vec![0u8; len];
        assert_eq!(repr.emit(&mut out), Ok(len));
        assert_eq!(&out[..], &data[..len]);
        assert_eq!(Repr::parse(&out), Ok((repr, len)));
        assert!(repr.emit(&mut out[..len - 1]).is_err());
    }
    if let Ok((auth, len)) = OpaqueAuth::parse(data) {
        let mut out = vec![0u8; len];
        assert_eq!(auth.emit(&mut out), Ok(len));
        assert_eq!(&out[..], &data[..len]);
    }
    if let Ok(sys) = AuthSys::parse(data) {
        let mut out = vec![0u8; data.len()];
        assert_eq!(sys.emit(&mut out), Ok(data.len()));
        assert_eq!(&out[..], data);
    }
});
