//! Helpers shared by the RPC-over-RDMA tests: the round trip every capture goes through,
//! the RPC messages behind the headers, word-built headers and segment strategies.

use super::*;
use crate::onc_rpc::{self, MsgBody, OpaqueAuth, ReplyBody};
use proptest::prelude::*;

/// Parse, check `buffer_len`, re-emit byte-identically, and check every
/// shorter prefix of the header errors (never panics).
pub(super) fn round_trip(msg: &[u8]) -> (Repr<'_>, usize) {
    let (repr, len) = Repr::parse(msg).unwrap();
    assert_eq!(repr.buffer_len(), len);
    let mut out = [0u8; 512];
    assert_eq!(repr.emit(&mut out).unwrap(), len);
    assert_eq!(&out[..len], &msg[..len]);
    // Every truncation (so every word boundary) below the header length.
    for n in 0..len {
        assert!(Repr::parse(&msg[..n]).is_err(), "prefix {n} parsed");
        assert!(matches!(
            repr.emit(&mut out[..n]),
            Err(Error::Truncated {
                layer: Layer::RpcRdma,
                ..
            })
        ));
    }
    (repr, len)
}

pub(super) fn rpc_call(payload: &[u8]) -> (onc_rpc::CallBody<'_>, usize, u32) {
    let (rpc, len) = onc_rpc::Repr::parse(payload).unwrap();
    let mut out = [0u8; 512];
    assert_eq!(rpc.emit(&mut out).unwrap(), len);
    assert_eq!(&out[..len], &payload[..len]);
    match rpc.body {
        MsgBody::Call(c) => (c, len, rpc.xid),
        other => panic!("not a call: {other:?}"),
    }
}

pub(super) fn rpc_reply(payload: &[u8]) -> (onc_rpc::AcceptedReply<'_>, usize, u32) {
    let (rpc, len) = onc_rpc::Repr::parse(payload).unwrap();
    let mut out = [0u8; 512];
    assert_eq!(rpc.emit(&mut out).unwrap(), len);
    assert_eq!(&out[..len], &payload[..len]);
    match rpc.body {
        MsgBody::Reply(ReplyBody::Accepted(a)) => (a, len, rpc.xid),
        other => panic!("not an accepted reply: {other:?}"),
    }
}

/// The kernel client's AUTH_SYS credential: stamp 0, "(none)", uid 0,
/// gid 0, no groups (tshark: "Flavor: AUTH_UNIX (1) Length: 28").
pub(super) fn assert_kernel_auth_sys(cred: &OpaqueAuth<'_>) {
    match cred {
        OpaqueAuth::Sys(s) => {
            assert_eq!(s.stamp, 0);
            assert_eq!(s.machinename_str(), Some("(none)"));
            assert_eq!((s.uid, s.gid), (0, 0));
            assert!(s.gids.is_empty());
            assert_eq!(s.buffer_len(), 28);
        }
        other => panic!("not AUTH_SYS: {other:?}"),
    }
}

pub(super) const NFS_PROGRAM: u32 = 100_003;

pub(super) fn words(w: &[u32]) -> ([u8; 512], usize) {
    let mut b = [0u8; 512];
    for (i, v) in w.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    (b, 4 * w.len())
}

pub(super) const fn seg(i: u32) -> Segment {
    Segment {
        handle: 0x100 + i,
        length: 0x1000 * i + 1,
        offset: 0x0000_0001_0000_0000 * i as u64 + 0x40,
    }
}

pub(super) fn any_segment() -> impl Strategy<Value = Segment> {
    (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(handle, length, offset)| Segment {
        handle,
        length,
        offset,
    })
}

pub(super) fn any_read_segment() -> impl Strategy<Value = ReadSegment> {
    (0u32..0x4000_0000, any_segment()).prop_map(|(p, s)| ReadSegment::new(p * 4, s))
}
