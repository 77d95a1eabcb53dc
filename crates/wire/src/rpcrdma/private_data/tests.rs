//! Tests of the RFC 8797 private data (EXT-RPC-01): the captures' values, setters, size
//! codes, errors and round trips.

use super::*;
use proptest::prelude::*;

/// EXT-RPC-01: RFC 8797 private data from the captures (CM REQ/REP of
/// nfs3-rdma-rxe.pcap, MPA Request of nfs3-rdma-siw.pcap after MPA's
/// 4-octet IRD/ORD words): magic 0xF6AB0E18, version 1, flags, sizes 4 KiB.
#[test]
fn ext_rpc_01_private_data() {
    let req: [u8; 32] = [
        0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let rep: [u8; 8] = [0xf6, 0xab, 0x0e, 0x18, 0x01, 0x00, 0x03, 0x03];
    let mpa_req: [u8; 12] = [
        0x00, 0x80, 0x00, 0x00, 0xf6, 0xab, 0x0e, 0x18, 0x01, 0x01, 0x03, 0x03,
    ];
    let v = PrivateData::new_checked(&req[..]).unwrap();
    assert_eq!(v.format_identifier(), PRIVATE_DATA_MAGIC);
    assert_eq!(
        (v.version(), v.flags(), v.send_size(), v.receive_size()),
        (1, 1, 3, 3)
    );
    let p = PrivateDataRepr::parse(&req).unwrap();
    assert_eq!(p, PrivateDataRepr::new(4096, 4096, true));
    assert!(p.remote_invalidate());
    assert_eq!((p.max_send_size, p.max_receive_size), (4096, 4096));
    let mut out = [0u8; 8];
    assert_eq!(p.emit(&mut out).unwrap(), 8);
    assert_eq!(out, req[..8]);
    let q = PrivateDataRepr::parse(&rep).unwrap();
    assert!(!q.remote_invalidate());
    q.emit(&mut out).unwrap();
    assert_eq!(out, rep);
    assert_eq!(PrivateDataRepr::parse(&mpa_req[4..]).unwrap(), p);
    // Setters.
    let mut b = [0u8; 8];
    let mut w = PrivateData::new_unchecked(&mut b[..]);
    w.set_format_identifier(PRIVATE_DATA_MAGIC);
    w.set_version(1);
    w.set_flags(1);
    w.set_send_size(3);
    w.set_receive_size(3);
    assert_eq!(b, req[..8]);
    // Size codes: (code + 1) * 1024.
    assert_eq!(decode_buffer_size(0), 1024);
    assert_eq!(decode_buffer_size(255), 262_144);
    assert_eq!(encode_buffer_size(4096), 3);
    assert_eq!(encode_buffer_size(5000), 3);
    assert_eq!(encode_buffer_size(0), 0);
    assert_eq!(encode_buffer_size(u32::MAX), 255);
    // Errors.
    for n in 0..8 {
        assert!(matches!(
            PrivateDataRepr::parse(&rep[..n]),
            Err(Error::Truncated { .. })
        ));
        assert!(p.emit(&mut out[..n]).is_err());
    }
    let mut bad = rep;
    bad[0] = 0;
    assert!(matches!(
        PrivateDataRepr::parse(&bad),
        Err(Error::Unknown {
            field: "private data format identifier",
            ..
        })
    ));
    let mut bad = rep;
    bad[4] = 2;
    assert!(matches!(
        PrivateDataRepr::parse(&bad),
        Err(Error::Unknown {
            field: "private data version",
            value: 2,
            ..
        })
    ));
    let odd = PrivateDataRepr {
        flags: 0,
        max_send_size: 1500,
        max_receive_size: 4096,
    };
    assert!(matches!(odd.emit(&mut out), Err(Error::Malformed { .. })));
    // Reserved flag bits are kept.
    let mut res = rep;
    res[5] = 0x81;
    let r = PrivateDataRepr::parse(&res).unwrap();
    r.emit(&mut out).unwrap();
    assert_eq!(out, res);
}

proptest! {
    #[test]
    fn prop_round_trip_private_data(flags in any::<u8>(), s in any::<u8>(), r in any::<u8>()) {
        let p = PrivateDataRepr { flags, max_send_size: decode_buffer_size(s), max_receive_size: decode_buffer_size(r) };
        let mut b = [0u8; 8];
        p.emit(&mut b).unwrap();
        prop_assert_eq!(PrivateDataRepr::parse(&b).unwrap(), p);
    }
}
