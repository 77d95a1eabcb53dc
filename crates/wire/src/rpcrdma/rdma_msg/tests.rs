//! Tests of whole headers (RFC 8166 §4.1.2, §4.2.4, §4.5): captured NFS messages, golden
//! `RDMA_MSG` and `RDMA_ERROR` bytes, receive-side errors and round trips.

use super::*;
use crate::error::Layer;
use crate::onc_rpc::{AcceptedReplyData, OpaqueAuth};
use crate::rpcrdma::test_util::*;
use crate::rpcrdma::{
    ERR_CHUNK_LEN, ERR_VERS_LEN, MIN_HEADER_LEN, PrivateDataRepr, ReadList, ReadSegment, Segment,
    WriteChunk, WriteList,
};
use crate::vectors::rpcrdma_messages::*;
use proptest::prelude::*;

// Real RPC-over-RDMA messages: the payload of one RDMA Send, cut with
// tshark/python from the NFS captures in `shared/captures/`. RoCE: after
// the 12-octet BTH (and the 4-octet IETH of a Send with Invalidate);
// iWARP: after the 18-octet untagged DDP header. Linux 6.12 xprtrdma
// (client, credits 128) and svcrdma (server, credits 64).
/// nfs3-rdma-rxe.pcap frame 26: NFSv3 NULL Call, RDMA_MSG (RC SEND Only)
#[rustfmt::skip]
const RXE_NULL_CALL: [u8; 68] = [
    0x26, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x26, 0x05, 0xb9, 0x83,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x86, 0xa3, 0x00, 0x00, 0x00, 0x03,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
];
/// nfs3-rdma-rxe.pcap frame 28: NFSv3 NULL Reply, RDMA_MSG
#[rustfmt::skip]
const RXE_NULL_REPLY: [u8; 52] = [
    0x26, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x26, 0x05, 0xb9, 0x83,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
];

/// nfs3-rdma-rxe.pcap frame 40: NFSv3 GETATTR Reply, RDMA_MSG, no chunks
#[rustfmt::skip]
const RXE_GETATTR_REPLY: [u8; 140] = [
    0x29, 0x05, 0xb9, 0x83, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x29, 0x05, 0xb9, 0x83,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x03, 0xff,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x01, 0x6b, 0x02, 0x60, 0x75, 0x1b, 0x39, 0xd6, 0xc2, 0x6b, 0x02, 0x60, 0x75,
    0x1b, 0x39, 0xd6, 0xc2, 0x6b, 0x02, 0x60, 0x75, 0x1b, 0x76, 0xdf, 0xc3,
];

/// nfs42-rdma-rxe.pcap frame 11: NFSv4.2 EXCHANGE_ID Reply, RDMA_NOMSG with a
/// one-segment Reply chunk (RC SEND Only with Invalidate: after the IETH)
#[rustfmt::skip]
const V42_EXCHANGE_ID_REPLY: [u8; 48] = [
    0x44, 0xaf, 0xd9, 0x70, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x18, 0x4f, 0x00, 0x00, 0x00, 0x64, 0x44, 0xaf, 0xd9, 0x70, 0x45, 0x03, 0x20, 0x00,
];

fn fixed(msg: &[u8]) -> (u32, u32, u32, u32) {
    let h = Header::new_checked(msg).unwrap();
    (h.rdma_xid(), h.rdma_vers(), h.rdma_credit(), h.rdma_proc())
}

/// RPCRDMA-36, -38, -39, -40, -43: RDMA_MSG with no chunks, NFSv3 GETATTR
/// Call and Reply (nfs3-rdma-rxe.pcap frames 38, 40).
#[test]
fn rpcrdma_36_38_39_40_capture_getattr_no_chunks() {
    assert_eq!(fixed(&RXE_GETATTR_CALL), (0x2905_b983, 1, 128, 0));
    let (call, len) = round_trip(&RXE_GETATTR_CALL);
    assert_eq!(len, MIN_HEADER_LEN);
    assert_eq!(call.proc(), Proc::Msg);
    assert_eq!(call.body, Body::Msg(Chunks::NONE));
    assert!(call.chunks().unwrap().is_empty());
    let payload = &RXE_GETATTR_CALL[len..];
    call.check_payload_xid(payload).unwrap();
    let (c, rpc_len, xid) = rpc_call(payload);
    assert_eq!(xid, call.rdma_xid);
    assert_eq!((c.prog, c.vers, c.proc), (NFS_PROGRAM, 3, 1));
    assert_kernel_auth_sys(&c.cred);
    assert_eq!(c.verf, OpaqueAuth::None);
    // GETATTR3args: a 8-octet file handle follows the RPC header.
    assert_eq!(&payload[rpc_len..rpc_len + 4], &[0, 0, 0, 8]);
    assert_eq!(payload.len() - rpc_len, 12);

    assert_eq!(fixed(&RXE_GETATTR_REPLY), (0x2905_b983, 1, 64, 0));
    let (reply, len) = round_trip(&RXE_GETATTR_REPLY);
    assert_eq!(reply.body, Body::Msg(Chunks::NONE));
    let payload = &RXE_GETATTR_REPLY[len..];
    reply.check_payload_xid(payload).unwrap();
    let (a, rpc_len, _) = rpc_reply(payload);
    assert_eq!(a.verf, OpaqueAuth::None);
    assert_eq!(a.reply_data, AcceptedReplyData::Success);
    assert_eq!(rpc_len, 24);
    // RPCRDMA-43: within the 4096-octet thresholds both peers advertised.
    assert!(RXE_GETATTR_CALL.len() <= 4096 && RXE_GETATTR_REPLY.len() <= 4096);
}

/// NFS NULL Call and Reply: AUTH_NONE credential (frames 26, 28).
#[test]
fn capture_null_call_auth_none() {
    let (call, len) = round_trip(&RXE_NULL_CALL);
    assert_eq!(call.body, Body::Msg(Chunks::NONE));
    let (c, rpc_len, _) = rpc_call(&RXE_NULL_CALL[len..]);
    assert_eq!((c.prog, c.vers, c.proc), (NFS_PROGRAM, 3, 0));
    assert_eq!((c.cred, c.verf), (OpaqueAuth::None, OpaqueAuth::None));
    assert_eq!(len + rpc_len, RXE_NULL_CALL.len());
    let (reply, len) = round_trip(&RXE_NULL_REPLY);
    let (a, rpc_len, xid) = rpc_reply(&RXE_NULL_REPLY[len..]);
    assert_eq!(xid, reply.rdma_xid);
    assert_eq!(a.reply_data, AcceptedReplyData::Success);
    assert_eq!(len + rpc_len, RXE_NULL_REPLY.len());
}

/// RPCRDMA-41: RDMA_NOMSG Reply with a one-segment Reply chunk (NFSv4.2
/// EXCHANGE_ID, nfs42-rdma-rxe.pcap frame 11, Send with Invalidate).
#[test]
fn rpcrdma_41_capture_v42_nomsg() {
    let (r, len) = round_trip(&V42_EXCHANGE_ID_REPLY);
    assert_eq!(len, 48);
    let c = r.chunks().unwrap();
    let seg = c.reply_chunk.unwrap().iter().next().unwrap();
    assert_eq!(
        seg,
        Segment {
            handle: 0x184f,
            length: 100,
            offset: 0x44af_d970_4503_2000
        }
    );
}

// --- RFC 8166 §4.3 / rpc-rdma.md §4.3 golden bytes --------------------

/// RPCRDMA-36, -38: rpc-rdma.md §4.3, RDMA_MSG with no chunks.
#[test]
fn rpcrdma_36_golden_msg_no_chunks() {
    let golden: [u8; 32] = [
        0x8f, 0x3e, 0x1a, 0x02, 0, 0, 0, 1, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0x8f, 0x3e, 0x1a, 0x02,
    ];
    let repr = Repr::msg(0x8f3e_1a02, 32, Chunks::NONE);
    let mut out = [0xffu8; 28];
    assert_eq!(repr.emit(&mut out).unwrap(), 28);
    assert_eq!(out, golden[..28]);
    let (parsed, len) = Repr::parse(&golden).unwrap();
    assert_eq!((parsed, len), (repr, 28));
    parsed.check_payload_xid(&golden[len..]).unwrap();
}

/// RPCRDMA-59, -62, -77: an unsupported version is answered with
/// ERR_VERS echoing its rdma_xid and rdma_vers, supported range 1..=1
/// (`xid | 2 | credit | 4 | 1 | 1 | 1`). The pre-parse reads only the four
/// fixed words, so the unknown body does not matter.
#[test]
fn rpcrdma_59_62_77_golden_err_vers() {
    let failing: [u8; 32] = [
        0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0, 9, 0xff, 0xff, 0xff, 0xff, 0xaa,
        0xaa, 0xaa, 0xaa, 0x55, 0x55, 0x55, 0x55, 1, 2, 3, 4,
    ];
    assert!(matches!(
        Repr::parse(&failing),
        Err(Error::Unknown {
            layer: Layer::RpcRdma,
            field: "rdma_vers",
            value: 2
        })
    ));
    let h = Header::new_checked(&failing[..]).unwrap();
    assert_eq!(
        (h.rdma_xid(), h.rdma_vers(), h.rdma_proc()),
        (0xdead_beef, 2, 9)
    );
    let answer = Repr::err_vers(&h, 64);
    let golden: [u8; 28] = [
        0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 2, 0, 0, 0, 64, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0,
        0, 1,
    ];
    let mut out = [0u8; 28];
    assert_eq!(answer.emit(&mut out).unwrap(), ERR_VERS_LEN);
    assert_eq!(out, golden);
    // The requester parses it whatever rdma_vers it echoes.
    let (parsed, len) = round_trip(&golden);
    assert_eq!((parsed, len), (answer, 28));
    assert_eq!(
        parsed.body,
        Body::Error(ErrorBody::Vers {
            rdma_vers_low: 1,
            rdma_vers_high: 1
        })
    );
    // 20..27 octets: an ERR_VERS needs 28 (rpc-rdma.md §11).
    for n in 20..28 {
        assert!(matches!(
            Repr::parse(&golden[..n]),
            Err(Error::Truncated { need: 28, .. })
        ));
    }
}

/// RPCRDMA-59, -63, -56: ERR_CHUNK is 20 octets (`xid | 1 | credit | 4 |
/// 2`) and is accepted although below 28 (rpc-rdma.md §11 decision).
#[test]
fn rpcrdma_59_63_golden_err_chunk() {
    let golden: [u8; 20] = [
        0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1, 0, 0, 0, 64, 0, 0, 0, 4, 0, 0, 0, 2,
    ];
    let h = Header::new_checked(&golden[..]).unwrap();
    assert_eq!(h.min_message_len(), ERR_CHUNK_LEN);
    let answer = Repr::err_chunk(&h, 64);
    let mut out = [0u8; 20];
    assert_eq!(answer.emit(&mut out).unwrap(), ERR_CHUNK_LEN);
    assert_eq!(out, golden);
    let (parsed, len) = round_trip(&golden);
    assert_eq!((parsed.body, len), (Body::Error(ErrorBody::Chunk), 20));
}

/// RPCRDMA-63: other XDR errors on a known version: unknown proc,
/// discriminators other than 0/1, rdma_xid not the RPC XID.
#[test]
fn rpcrdma_63_xdr_errors() {
    let (b, n) = words(&[1, 1, 1, 5, 0, 0, 0]);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::Unknown {
            field: "rdma_proc",
            value: 5,
            ..
        })
    ));
    for (i, field) in [
        (4, "read list discriminator"),
        (5, "write list discriminator"),
        (6, "reply chunk discriminator"),
    ] {
        let mut w = [1, 1, 1, 0, 0, 0, 0];
        w[i] = 2;
        let (b, n) = words(&w);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown { field: f, value: 2, .. }) if f == field
        ));
    }
    let (repr, len) = Repr::parse(&RXE_GETATTR_CALL).unwrap();
    let mut other = RXE_GETATTR_CALL;
    other[len] ^= 1;
    assert!(repr.check_payload_xid(&other[len..]).is_err());
    assert!(repr.check_payload_xid(&other[len..len + 3]).is_err());
    // A version-1 ERR_CHUNK from a version-2 peer is not accepted.
    let (b, n) = words(&[1, 2, 1, 4, 2]);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::Unknown {
            field: "rdma_vers",
            ..
        })
    ));
}

/// RPCRDMA-61: an RDMA_ERROR that cannot be decoded is an error (the
/// receiver drops it).
#[test]
fn rpcrdma_61_undecodable_error() {
    let (b, n) = words(&[1, 1, 1, 4, 3, 0, 0]);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::Unknown {
            field: "rdma_err",
            value: 3,
            ..
        })
    ));
    let (b, _) = words(&[1, 1, 1, 4, 1, 1, 1]);
    assert!(Repr::parse(&b[..24]).is_err());
}

/// RPCRDMA-69: RDMA_MSGP parses (for reporting), is never emitted.
#[test]
fn rpcrdma_69_msgp_parse_only() {
    let (b, n) = words(&[5, 1, 1, 2, 1024, 4096, 0, 0, 0, 0x55]);
    let (repr, len) = Repr::parse(&b[..n]).unwrap();
    assert_eq!(len, 36);
    assert_eq!(repr.buffer_len(), 36);
    assert_eq!(
        repr.body,
        Body::MsgP {
            rdma_align: 1024,
            rdma_thresh: 4096,
            chunks: Chunks::NONE
        }
    );
    assert_eq!(repr.proc(), Proc::MsgP);
    assert!(repr.chunks().is_some());
    assert!(matches!(
        repr.emit(&mut [0u8; 64]),
        Err(Error::Malformed { .. })
    ));
    for k in 28..36 {
        assert!(Repr::parse(&b[..k]).is_err());
    }
}

/// RPCRDMA-70: RDMA_DONE parses (void body), is never emitted.
#[test]
fn rpcrdma_70_done_parse_only() {
    let (b, _) = words(&[5, 1, 1, 3]);
    let (repr, len) = Repr::parse(&b[..28]).unwrap();
    assert_eq!((repr.body, len), (Body::Done, 16));
    assert!(repr.chunks().is_none());
    assert!(repr.emit(&mut [0u8; 64]).is_err());
}

/// Emit writes nothing unless the whole header fits.
#[test]
fn emit_short_buffer_untouched() {
    let (repr, len) = Repr::parse(&RXE_READDIRPLUS_CALL).unwrap();
    let mut out = [0xeeu8; 79];
    assert!(matches!(
        repr.emit(&mut out),
        Err(Error::Truncated {
            need: 80,
            have: 79,
            ..
        })
    ));
    assert!(out.iter().all(|&b| b == 0xee));
    assert_eq!(len, 80);
}

#[derive(Debug, Clone)]
struct Lists {
    reads: Vec<ReadSegment>,
    writes: Vec<Vec<Segment>>,
    reply: Option<Vec<Segment>>,
}

fn any_lists() -> impl Strategy<Value = Lists> {
    (
        proptest::collection::vec(any_read_segment(), 0..5),
        proptest::collection::vec(proptest::collection::vec(any_segment(), 0..4), 0..4),
        proptest::option::of(proptest::collection::vec(any_segment(), 0..4)),
    )
        .prop_map(|(reads, writes, reply)| Lists {
            reads,
            writes,
            reply,
        })
}

fn check_round_trip(repr: &Repr<'_>) -> std::result::Result<(), TestCaseError> {
    let mut a = [0u8; 1024];
    let n = repr.emit(&mut a).unwrap();
    prop_assert_eq!(n, repr.buffer_len());
    let (p, len) = Repr::parse(&a[..n]).unwrap();
    prop_assert_eq!(len, n);
    prop_assert_eq!(&p, repr);
    let mut b = [0u8; 1024];
    prop_assert_eq!(p.emit(&mut b).unwrap(), n);
    prop_assert_eq!(&a[..n], &b[..n]);
    Ok(())
}

proptest! {
    /// emit -> parse -> emit for RDMA_MSG and RDMA_NOMSG with arbitrary lists.
    #[test]
    fn prop_round_trip_msg(xid in any::<u32>(), credit in any::<u32>(), l in any_lists(), nomsg in any::<bool>()) {
        let chunks: Vec<WriteChunk<'_>> = l.writes.iter().map(|c| WriteChunk::Slice(c)).collect();
        let c = Chunks {
            read_list: ReadList::Slice(&l.reads),
            write_list: WriteList::Slice(&chunks),
            reply_chunk: l.reply.as_deref().map(WriteChunk::Slice),
        };
        let repr = if nomsg { Repr::nomsg(xid, credit, c) } else { Repr::msg(xid, credit, c) };
        if nomsg && l.reads.is_empty() && l.reply.is_none() {
            prop_assert!(repr.emit(&mut [0u8; 1024]).is_err());
        } else {
            check_round_trip(&repr)?;
        }
    }

    /// emit -> parse -> emit for RDMA_ERROR (ERR_VERS with any version).
    #[test]
    fn prop_round_trip_error(xid in any::<u32>(), vers in any::<u32>(), credit in any::<u32>(), low in any::<u32>(), high in any::<u32>(), chunk in any::<bool>()) {
        let repr = if chunk {
            Repr { rdma_xid: xid, rdma_vers: 1, rdma_credit: credit, body: Body::Error(ErrorBody::Chunk) }
        } else {
            Repr { rdma_xid: xid, rdma_vers: vers, rdma_credit: credit,
                   body: Body::Error(ErrorBody::Vers { rdma_vers_low: low, rdma_vers_high: high }) }
        };
        check_round_trip(&repr)?;
    }

    /// Arbitrary octets never panic; whatever parses re-emits identically.
    #[test]
    fn prop_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        parse_emit_compare(&bytes)?;
        let _ = PrivateDataRepr::parse(&bytes);
    }

    /// Arbitrary small words after a valid fixed part reach the list
    /// parsers (discriminators and counts of 0..=3).
    #[test]
    fn prop_arbitrary_words(proc in 0u32..6, ws in proptest::collection::vec(0u32..4, 0..64), cut in 0usize..8) {
        let mut b = vec![0u8, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1];
        b.extend_from_slice(&proc.to_be_bytes());
        for w in ws {
            b.extend_from_slice(&w.to_be_bytes());
        }
        let n = b.len().saturating_sub(cut);
        parse_emit_compare(&b[..n])?;
    }
}

fn parse_emit_compare(bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
    if let Ok((repr, len)) = Repr::parse(bytes) {
        prop_assert!(len <= bytes.len());
        prop_assert_eq!(repr.buffer_len(), len);
        // Walk every lazy list.
        if let Some(c) = repr.chunks() {
            let _ = c.read_list.iter().count();
            for ch in c.write_list.iter() {
                let _ = ch.total_len();
            }
            let _ = c.reply_chunk.map(|c| c.iter().count());
        }
        let mut out = vec![0u8; len];
        match repr.body {
            Body::MsgP { .. } | Body::Done => prop_assert!(repr.emit(&mut out).is_err()),
            _ => {
                prop_assert_eq!(repr.emit(&mut out).unwrap(), len);
                prop_assert_eq!(&out[..], &bytes[..len]);
            }
        }
    }
    Ok(())
}
