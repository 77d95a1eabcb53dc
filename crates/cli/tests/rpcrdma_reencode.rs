//! The RPC-over-RDMA messages of the Linux NFS captures, re-encoded from our own structures:
//! every Send on the NFS/RDMA connection is parsed, its transport header rebuilt from owned
//! segment lists (the way our requester and responder build theirs, not the parsed view,
//! which re-emits the captured list octets as they were) and emitted again; the ONC RPC
//! call or reply header after an RDMA_MSG goes through `softrdma_rpc::msg` and back. Every
//! octet of every header must come out as Linux sent it.

mod common;

use softrdma_cli::decode::{Options, Record, decode_file};
use softrdma_rpc::msg::{decode_call, decode_reply, encode_call, encode_reply, peek};
use softrdma_rpc::rdma::plan::plan_call;
use softrdma_wire::rpcrdma::{
    Body, Chunks, ReadList, ReadSegment, Repr, Segment, WriteChunk, WriteList,
};

/// A transport header held the way a sender holds it before emitting.
struct Owned {
    xid: u32,
    credit: u32,
    nomsg: bool,
    reads: Vec<ReadSegment>,
    writes: Vec<Vec<Segment>>,
    reply: Option<Vec<Segment>>,
}

impl Owned {
    fn of(h: &Repr<'_>) -> Owned {
        let (c, nomsg) = match &h.body {
            Body::Msg(c) => (c, false),
            Body::NoMsg(c) => (c, true),
            // RDMA_ERROR, RDMA_MSGP and RDMA_DONE are never in these captures (the counts
            // below would catch one anyway).
            b => panic!("unexpected RPC-over-RDMA body {b:?}"),
        };
        Owned {
            xid: h.rdma_xid,
            credit: h.rdma_credit,
            nomsg,
            reads: c.read_list.iter().collect(),
            writes: c.write_list.iter().map(|w| w.iter().collect()).collect(),
            reply: c.reply_chunk.as_ref().map(|w| w.iter().collect()),
        }
    }

    /// Emits the header from the owned lists (the `Slice` forms of the codec).
    fn emit(&self) -> Vec<u8> {
        let writes: Vec<WriteChunk<'_>> = self
            .writes
            .iter()
            .map(|w| WriteChunk::from(&w[..]))
            .collect();
        let chunks = Chunks {
            read_list: ReadList::from(&self.reads[..]),
            write_list: WriteList::from(&writes[..]),
            reply_chunk: self.reply.as_ref().map(|w| WriteChunk::from(&w[..])),
        };
        let repr = if self.nomsg {
            Repr::nomsg(self.xid, self.credit, chunks)
        } else {
            Repr::msg(self.xid, self.credit, chunks)
        };
        let mut b = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut b).expect("our header emits");
        assert_eq!(n, b.len());
        b
    }
}

/// What one capture's Sends held.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    calls: usize,
    replies: usize,
    nomsg_replies: usize,
}

/// Every Send message of a capture: one segment each, or the test says why not.
fn sends(name: &str) -> Vec<(u64, Vec<u8>)> {
    let opts = Options {
        sends: true,
        ..Options::default()
    };
    let out = decode_file(&common::captures_dir().join(name), &opts).expect("capture reads");
    out.records
        .iter()
        .filter_map(|r: &Record| {
            let s = r.send.as_ref()?;
            // The decoder keeps segments, not messages; Linux sent every RPC-over-RDMA
            // message of these captures in one (inline threshold 4 KiB, MTU/MSS above it).
            assert!(
                s.first && s.last,
                "{name}: frame {}: a multi-segment Send (reassemble it here)",
                r.frame
            );
            Some((r.frame, s.payload.clone()))
        })
        .collect()
}

fn reencode(name: &str) -> Tally {
    let mut t = Tally::default();
    let mut call_xids = Vec::new();
    for (frame, p) in sends(name) {
        let (h, hlen) = rpcrdma_parse(name, frame, &p);
        assert_eq!(h.rdma_vers, 1);
        let ours = Owned::of(&h).emit();
        assert_eq!(
            ours,
            &p[..hlen],
            "{name}: frame {frame}: transport header re-encodes differently"
        );
        let rpc = &p[hlen..];
        match (&h.body, peek(rpc)) {
            (Body::Msg(_), Some((xid, false))) => {
                assert_eq!(xid, h.rdma_xid, "{name}: frame {frame}: RPCRDMA-38");
                let (c, off) = decode_call(rpc).expect("Linux's call decodes");
                let mut again = Vec::new();
                encode_call(&c, &[], &mut again).unwrap();
                assert_eq!(
                    again,
                    &rpc[..off],
                    "{name}: frame {frame}: call header re-encodes differently"
                );
                // Our responder takes every call Linux made.
                let plan = plan_call(&p, 4 << 20).expect("our responder plans the call");
                assert_eq!((plan.xid, plan.long), (xid, false));
                t.calls += 1;
                call_xids.push(xid);
            }
            (Body::Msg(_), Some((xid, true))) => {
                assert_eq!(xid, h.rdma_xid, "{name}: frame {frame}: RPCRDMA-38");
                let (r, off) = decode_reply(rpc).expect("Linux's reply decodes");
                let mut again = Vec::new();
                encode_reply(r.xid, r.status, &r.verf, &[], &mut again).unwrap();
                assert_eq!(
                    again,
                    &rpc[..off],
                    "{name}: frame {frame}: reply header re-encodes differently"
                );
                t.replies += 1;
                assert!(call_xids.contains(&xid), "{name}: a reply to no call");
            }
            // A Long Reply: the RPC message went through the Reply chunk; nothing follows.
            (Body::NoMsg(c), _) if c.reply_chunk.is_some() && c.read_list.is_empty() => {
                assert_eq!(hlen, p.len(), "{name}: frame {frame}");
                assert!(
                    call_xids.contains(&h.rdma_xid),
                    "{name}: a reply to no call"
                );
                t.replies += 1;
                t.nomsg_replies += 1;
            }
            (b, m) => panic!("{name}: frame {frame}: {b:?} followed by {m:?}"),
        }
    }
    t
}

fn rpcrdma_parse<'a>(name: &str, frame: u64, p: &'a [u8]) -> (Repr<'a>, usize) {
    Repr::parse(p).unwrap_or_else(|e| panic!("{name}: frame {frame}: not RPC-over-RDMA: {e}"))
}

/// RPCRDMA-36: every header Linux sent, byte for byte from our structures; the calls and
/// replies counted as the capture index and the decoder count them, none skipped.
#[test]
fn rpcrdma_36_linux_nfs_messages_reencode_identically() {
    for (name, calls, replies, nomsgs) in [
        ("nfs3-rdma-siw.pcap", 20, 20, 2),
        ("nfs3-rdma-rxe.pcap", 20, 20, 2),
        ("nfs42-rdma-rxe.pcap", 37, 37, 5),
    ] {
        let t = reencode(name);
        assert_eq!(
            t,
            Tally {
                calls,
                replies,
                nomsg_replies: nomsgs
            },
            "{name}"
        );
        // The decoder's own count of RPC-over-RDMA messages agrees.
        let out = decode_file(&common::captures_dir().join(name), &Options::default()).unwrap();
        let decoded = out
            .records
            .iter()
            .filter(|r| r.layers.contains_key("rpcrdma"))
            .count();
        assert_eq!(decoded, t.calls + t.replies, "{name}");
    }
}
