//! Tests of the fixed header part (RFC 8166 §4.2): the shortest messages, the view at any
//! version, the `rdma_proc` and `rdma_err` values.

use super::*;
use crate::error::Error;
use crate::rpcrdma::Repr;
use crate::rpcrdma::test_util::*;
use crate::vectors::rpcrdma_messages::*;

/// RPCRDMA-56: fewer than 28 octets is discarded unparsed (Truncated),
/// except a 20-octet ERR_CHUNK.
#[test]
fn rpcrdma_56_short_messages() {
    for n in 0..MIN_HEADER_LEN {
        assert!(matches!(
            Repr::parse(&RXE_GETATTR_CALL[..n]),
            Err(Error::Truncated { .. })
        ));
    }
    // A 16-octet RDMA_DONE is discarded too.
    let (done, n) = words(&[1, 1, 1, 3]);
    assert!(matches!(
        Repr::parse(&done[..n]),
        Err(Error::Truncated { need: 28, .. })
    ));
    // RDMA_ERROR with 16..19 octets: not even rdma_err.
    let (e, _) = words(&[1, 1, 1, 4, 2]);
    for n in 16..20 {
        assert!(matches!(
            Repr::parse(&e[..n]),
            Err(Error::Truncated { need: 20, .. })
        ));
    }
    assert!(Header::new_checked(&e[..15]).is_err());
    assert!(
        Header::new_checked(&e[..16])
            .unwrap()
            .check_message_len()
            .is_err()
    );
}

/// RPCRDMA-42: an RDMA_ERROR parses at either end and says so (a
/// Responder then drops it); RPCRDMA-77: the pre-parse reads only the
/// four fixed words, whatever the version.
#[test]
fn rpcrdma_42_77_header_view() {
    let (e, n) = words(&[1, 1, 64, 4, 2]);
    let (repr, len) = Repr::parse(&e[..n]).unwrap();
    assert_eq!((repr.proc(), len), (Proc::Error, 20));
    assert!(repr.chunks().is_none());
    let mut b = [0u8; 16];
    let mut h = Header::new_unchecked(&mut b[..]);
    h.set_rdma_xid(0x0102_0304);
    h.set_rdma_vers(7);
    h.set_rdma_credit(0xffff_ffff);
    h.set_rdma_proc(0x8000_0000);
    let h = Header::new_checked(&b[..]).unwrap();
    assert_eq!(
        (h.rdma_xid(), h.rdma_vers(), h.rdma_credit(), h.rdma_proc()),
        (0x0102_0304, 7, 0xffff_ffff, 0x8000_0000)
    );
    assert!(h.body().is_empty());
    assert_eq!(h.min_message_len(), MIN_HEADER_LEN);
    assert_eq!(h.into_inner().len(), 16);
    for n in 0..16 {
        assert!(Header::new_checked(&b[..n]).is_err());
    }
}

#[test]
fn enums_round_trip() {
    for p in Proc::ALL {
        assert_eq!(Proc::try_from(u32::from(*p)).unwrap(), *p);
    }
    for e in ErrCode::ALL {
        assert_eq!(ErrCode::try_from(u32::from(*e)).unwrap(), *e);
    }
    assert!(Proc::try_from(5).is_err());
    assert!(ErrCode::try_from(0).is_err());
}
