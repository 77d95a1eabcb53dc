//! RFC 8166 rows checked on the wire, on both transports: a hand-driven peer sits on the
//! other end of our requester (a "tap" responder) or of our responder (a raw requester),
//! sees every octet of every Send, pulls the chunks it is offered and offers its own.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use softrdma::iwarp::QpEvent;
use softrdma::{
    AcceptParams, Access, AsyncEvent, ConnectParams, Context, Cq, Key, Listener, Mr, Qp, QpCap,
    QpInitAttr, RecvWr, SendFlags, SendWr, WcStatus,
};
use softrdma_rpc::msg::{decode_reply, encode_reply};
use softrdma_rpc::payload::{reduce_all, splice};
use softrdma_rpc::rdma::{RdmaConfig, RdmaServer, RdmaTransport};
use softrdma_rpc::*;
use softrdma_wire::ddp::{DdpError, TaggedBufferError};
use softrdma_wire::rdmap::{RemoteProtectionError, TerminateCode};
use softrdma_wire::rpcrdma::{
    Body, Chunks, PrivateDataRepr, ReadList, ReadSegment, Repr, Segment, WriteChunk, WriteList,
};
use softrdma_wire::xdr::XdrReader;

mod common;

use common::{T, both, contexts};
use softrdma_testkit::pattern;

fn call_msg(xid: u32, proc: u32, args: &[u8]) -> Vec<u8> {
    common::call_msg(PROG, xid, proc, args)
}

const PROG: u32 = 0x2000_0003;
const LONG: Duration = Duration::from_secs(60);

mod proc {
    pub const NULL: u32 = 0;
    /// Arguments: exactly one `opaque<>` (strict XDR); results: its length.
    pub const STRICT: u32 = 1;
    /// Arguments: a length n and a seed; results: the word 7, then an opaque of n octets,
    /// DDP-eligible.
    pub const MAKE: u32 = 2;
    /// Arguments: a length n; results: an opaque of n octets, not DDP-eligible.
    pub const PLAIN: u32 = 3;
    /// Echoes its arguments (not DDP-eligible).
    pub const ECHO: u32 = 4;
}

/// XDR `opaque<>`: length word, data, zero padding (RFC 4506 §4.10).
fn opaque(d: &[u8]) -> Vec<u8> {
    let mut v = (d.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(d);
    v.resize(v.len().next_multiple_of(4), 0);
    v
}

fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|w| w.to_be_bytes()).collect()
}

fn emit(h: &Repr<'_>) -> Vec<u8> {
    let mut b = vec![0u8; h.buffer_len()];
    h.emit(&mut b).unwrap();
    b
}

fn private_data(send: u32, recv: u32) -> Vec<u8> {
    let mut b = vec![0u8; 8];
    PrivateDataRepr::new(send, recv, false)
        .emit(&mut b)
        .unwrap();
    b
}

fn reply_msg(xid: u32, results: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    encode_reply(xid, ReplyStatus::Success, &Auth::None, results, &mut m).unwrap();
    m
}

fn program() -> impl Program {
    |ctx: &CallContext<'_>, args: &[u8]| -> Result<Payload, ProcError> {
        let word = |i: usize| {
            args.get(4 * i..4 * i + 4)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
                .ok_or(ProcError::GarbageArgs)
        };
        match ctx.header.proc {
            proc::NULL => Ok(Payload::default()),
            proc::STRICT => {
                let mut r = XdrReader::new(args);
                match r.read_opaque(1 << 20) {
                    Ok(d) if r.is_empty() => Ok((d.len() as u32).to_be_bytes().to_vec().into()),
                    _ => Err(ProcError::GarbageArgs),
                }
            }
            proc::MAKE => Ok(Payload::with_opaque(
                vec![0, 0, 0, 7],
                &pattern(word(0)?, u64::from(word(1)? as u8)),
            )),
            proc::PLAIN => Ok(opaque(&pattern(word(0)?, 3)).into()),
            proc::ECHO => Ok(args.to_vec().into()),
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

/// Our responder, serving [`program`].
struct Rig {
    rdma: RdmaServer,
    client_ctx: Context,
    _server_ctx: Context,
    _server: Arc<Server>,
}

fn rig(t: T) -> Rig {
    let (sctx, cctx) = contexts(t);
    let mut reg = Registry::new();
    reg.register(PROG, 1, program());
    let server = Arc::new(Server::new(reg, ServerConfig::default()));
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let rdma = server.serve_rdma(&sctx, l, RdmaConfig::default()).unwrap();
    Rig {
        rdma,
        client_ctx: cctx,
        _server_ctx: sctx,
        _server: server,
    }
}

// The raw end's memory: Receive buffers, one Send buffer, a sink for RDMA Reads, and the
// memory it offers the peer as chunks.
const BUF: usize = 4096;
const RECVS: usize = 16;
const SEND_AT: usize = RECVS * BUF;
const SINK_AT: usize = SEND_AT + BUF;
const LENT_AT: usize = 256 * 1024;
const MR_LEN: usize = 1 << 20;
const SEND_ID: u64 = 1000;
const READ_ID: u64 = 1001;
const WRITE_ID: u64 = 1002;
const PROBE_ID: u64 = 1003;

/// Why a peer refuses an RDMA Read or Write through a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// No such handle (any more).
    NoSuchKey,
    /// The handle belongs to another connection's Protection Domain.
    OtherPd,
}

/// One end of an RPC-over-RDMA connection driven by hand.
struct End {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    /// Messages received and not yet taken.
    got: VecDeque<Vec<u8>>,
    /// Post the Receive again once its message is in.
    repost: bool,
}

impl End {
    fn new(ctx: &Context, recvs: usize) -> End {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(128, None).unwrap();
        let mut attr = QpInitAttr::new(&cq, &cq);
        attr.cap = QpCap {
            max_send_wr: 32,
            max_recv_wr: RECVS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(attr).unwrap();
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mr = pd.alloc_mr(MR_LEN, access).unwrap();
        let e = End {
            qp,
            cq,
            mr,
            got: VecDeque::new(),
            repost: true,
        };
        for i in 0..recvs {
            e.post_recv(i);
        }
        e
    }

    /// A requester connected to `addr` with `recvs` Receives posted (4 KiB inline).
    fn connect(ctx: &Context, addr: SocketAddr, recvs: usize) -> End {
        let e = End::new(ctx, recvs);
        let params = ConnectParams {
            private_data: private_data(4096, 4096),
            ..ConnectParams::default()
        };
        e.qp.connect(addr, params).unwrap();
        e
    }

    /// A responder accepting one connection on `l`, advertising `private`.
    fn accept(ctx: &Context, l: &Listener, private: Vec<u8>) -> End {
        let req = l.accept().unwrap();
        let e = End::new(ctx, RECVS);
        let params = AcceptParams {
            private_data: private,
            ..AcceptParams::default()
        };
        req.accept(&e.qp, params).unwrap();
        e
    }

    fn post_recv(&self, i: usize) {
        self.qp
            .post_recv(RecvWr::new(
                i as u64,
                vec![self.mr.sge(i * BUF, BUF as u32)],
            ))
            .unwrap();
    }

    /// Waits for work request `id` to complete, keeping the messages received meanwhile.
    fn wait_for(&mut self, id: u64) {
        let mut wcs = Vec::new();
        loop {
            wcs.clear();
            self.cq
                .wait(1, 16, LONG, &mut wcs)
                .expect("a completion in time");
            let mut done = false;
            for wc in &wcs {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.wr_id < RECVS as u64 {
                    let i = wc.wr_id as usize;
                    let mut b = vec![0u8; wc.byte_len as usize];
                    self.mr.copy_out(i * BUF, &mut b).unwrap();
                    if self.repost {
                        self.post_recv(i);
                    }
                    self.got.push_back(b);
                }
                done |= wc.wr_id == id;
            }
            if done || (id == u64::MAX && !self.got.is_empty()) {
                return;
            }
        }
    }

    /// The next message received.
    fn recv(&mut self) -> Vec<u8> {
        if self.got.is_empty() {
            self.wait_for(u64::MAX);
        }
        self.got.pop_front().unwrap()
    }

    /// Sends `bytes` and waits until the Send is done with its buffer.
    fn send(&mut self, bytes: &[u8]) {
        self.mr.copy_in(SEND_AT, bytes).unwrap();
        let wr = SendWr::send(SEND_ID, vec![self.mr.sge(SEND_AT, bytes.len() as u32)]);
        self.qp
            .post_send(wr.with_flags(SendFlags::SIGNALED))
            .unwrap();
        self.wait_for(SEND_ID);
    }

    /// RDMA-Reads the segments of a Read chunk, in list order.
    fn pull(&mut self, segs: &[ReadSegment]) -> Vec<u8> {
        let mut out = Vec::new();
        for s in segs.iter().filter(|s| s.length > 0) {
            let sink = Some(self.mr.sge(SINK_AT, s.length));
            let wr = SendWr::read(READ_ID, sink, Key(s.handle), s.offset);
            self.qp
                .post_send(wr.with_flags(SendFlags::SIGNALED))
                .unwrap();
            self.wait_for(READ_ID);
            let mut b = vec![0u8; s.length as usize];
            self.mr.copy_out(SINK_AT, &mut b).unwrap();
            out.extend_from_slice(&b);
        }
        out
    }

    /// RDMA-Writes `data` through `s`, a segment the peer offered.
    fn put(&mut self, s: &Segment, data: &[u8]) {
        self.mr.copy_in(SINK_AT, data).unwrap();
        let src = vec![self.mr.sge(SINK_AT, data.len() as u32)];
        let wr = SendWr::write(WRITE_ID, src, Key(s.handle), s.offset);
        self.qp
            .post_send(wr.with_flags(SendFlags::SIGNALED))
            .unwrap();
        self.wait_for(WRITE_ID);
    }

    /// How work request `id` completed; messages received meanwhile are kept, other
    /// failed completions (Receives flushed by the error) ignored.
    fn outcome(&mut self, id: u64) -> WcStatus {
        let mut wcs = Vec::new();
        loop {
            wcs.clear();
            self.cq
                .wait(1, 16, LONG, &mut wcs)
                .expect("a completion in time");
            for wc in &wcs {
                if wc.wr_id == id {
                    return wc.status;
                }
                if wc.wr_id < RECVS as u64 && wc.status == WcStatus::Success {
                    let mut b = vec![0u8; wc.byte_len as usize];
                    self.mr.copy_out(wc.wr_id as usize * BUF, &mut b).unwrap();
                    self.got.push_back(b);
                }
            }
        }
    }

    /// Waits until the QP fails (a completion in error: its Receives flushed); messages
    /// received before are kept.
    fn wait_dead(&mut self) {
        let mut wcs = Vec::new();
        loop {
            wcs.clear();
            self.cq
                .wait(1, 16, LONG, &mut wcs)
                .expect("the connection to fail in time");
            for wc in &wcs {
                if wc.status != WcStatus::Success {
                    return;
                }
                if wc.wr_id < RECVS as u64 {
                    let mut b = vec![0u8; wc.byte_len as usize];
                    self.mr.copy_out(wc.wr_id as usize * BUF, &mut b).unwrap();
                    self.got.push_back(b);
                }
            }
        }
    }

    /// An RDMA Read (`write` false) or Write of 64 octets through `s`, a handle of the
    /// peer's, that the peer must refuse with a remote access error for `why`. RoCE: its
    /// NAK completes the request so (IBA 9.7.5.2.4). iWARP: its Terminate does (a Read), or
    /// follows (a Write completes once sent, RFC 5040 §5.1); the Terminate's code says why
    /// (RFC 5040 §4.8, RFC 5041 §7.2). The connection is dead afterwards.
    fn refused(&mut self, ctx: &Context, t: T, write: bool, s: &Segment, why: Why) {
        let wr = if write {
            self.mr.copy_in(SINK_AT, &[0x5A; 64]).unwrap();
            let src = vec![self.mr.sge(SINK_AT, 64)];
            SendWr::write(PROBE_ID, src, Key(s.handle), s.offset)
        } else {
            SendWr::read(
                PROBE_ID,
                Some(self.mr.sge(SINK_AT, 64)),
                Key(s.handle),
                s.offset,
            )
        };
        self.qp
            .post_send(wr.with_flags(SendFlags::SIGNALED))
            .unwrap();
        let st = self.outcome(PROBE_ID);
        if t == T::Roce {
            assert_eq!(st, WcStatus::RemoteAccess, "{t:?} write {write}");
            return;
        }
        let want = if write {
            WcStatus::Success
        } else {
            WcStatus::RemoteAccess
        };
        assert_eq!(st, want, "{t:?} write {write}");
        let code = loop {
            match ctx.get_async_event(LONG) {
                Some(AsyncEvent::Qp {
                    qp_num,
                    event: QpEvent::TerminateReceived(tr),
                }) if qp_num == self.qp.qp_num() => break tr.code,
                Some(_) => continue,
                None => panic!("{t:?}: no Terminate after a refused RDMA operation"),
            }
        };
        assert!(refusal(code, why), "{t:?} write {write}: {code:?}");
    }

    /// `len` octets of our memory at `off` for the peer, filled with `fill`.
    fn lend(&self, off: usize, len: usize, fill: u8) -> Segment {
        self.mr.copy_in(LENT_AT + off, &vec![fill; len]).unwrap();
        Segment {
            handle: self.mr.rkey().0,
            length: len as u32,
            offset: self.mr.addr(LENT_AT + off),
        }
    }

    /// What is in the memory of `s` (one we lent) now, its first `len` octets.
    fn lent(&self, s: &Segment, len: usize) -> Vec<u8> {
        let off = (s.offset - self.mr.addr(0)) as usize;
        let mut b = vec![0u8; len];
        self.mr.copy_out(off, &mut b).unwrap();
        b
    }
}

/// Whether Terminate `code` is the remote access error for `why`: the RDMAP code (an RDMA
/// Read Request's source, RFC 5040 §4.8) or the DDP tagged buffer code (an RDMA Write's
/// sink, RFC 5041 §7.2).
fn refusal(code: TerminateCode, why: Why) -> bool {
    let (rdmap, ddp) = match why {
        Why::NoSuchKey => (
            RemoteProtectionError::InvalidStag,
            TaggedBufferError::InvalidStag,
        ),
        Why::OtherPd => (
            RemoteProtectionError::StagNotAssociatedWithStream,
            TaggedBufferError::StagNotAssociatedWithStream,
        ),
    };
    code == TerminateCode::RdmaRemoteProtection(rdmap)
        || code == TerminateCode::Ddp(DdpError::TaggedBuffer(ddp))
}

/// Our requester connected to a hand-driven responder.
struct Tap {
    end: End,
    client: Client,
    tr: Arc<RdmaTransport>,
    /// (the stand-in's, our requester's).
    ctx: (Context, Context),
}

fn tap(t: T, private: Vec<u8>) -> Tap {
    tap_with(t, private, RdmaConfig::default())
}

fn tap_with(t: T, private: Vec<u8>, cfg: RdmaConfig) -> Tap {
    let (sctx, cctx) = contexts(t);
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let ctx = sctx.clone();
    let accept = std::thread::spawn(move || End::accept(&ctx, &l, private));
    let tr = Arc::new(RdmaTransport::connect(&cctx, addr, cfg).unwrap());
    Tap {
        end: accept.join().unwrap(),
        client: Client::new(tr.clone(), 16),
        tr,
        ctx: (sctx, cctx),
    }
}

impl Tap {
    /// The next call.
    fn call(&mut self) -> Vec<u8> {
        self.end.recv()
    }

    /// A short reply with no chunks and `results`.
    fn answer(&mut self, xid: u32, credit: u32, results: &[u8]) {
        let mut m = emit(&Repr::msg(xid, credit, Chunks::NONE));
        m.extend_from_slice(&reply_msg(xid, results));
        self.end.send(&m);
    }
}

/// A parsed call as the tap saw it: its header's parts, owned.
struct Seen {
    xid: u32,
    nomsg: bool,
    reads: Vec<ReadSegment>,
    /// The Write list's chunks.
    writes: Vec<Vec<Segment>>,
    reply: Option<Vec<Segment>>,
    /// The octets after the transport header.
    inline: Vec<u8>,
}

fn seen(m: &[u8]) -> Seen {
    let (h, hl) = Repr::parse(m).unwrap();
    let (c, nomsg) = match h.body {
        Body::Msg(c) => (c, false),
        Body::NoMsg(c) => (c, true),
        b => panic!("a requester sent {b:?}"),
    };
    Seen {
        xid: h.rdma_xid,
        nomsg,
        reads: c.read_list.iter().collect(),
        writes: c.write_list.iter().map(|w| w.iter().collect()).collect(),
        reply: c.reply_chunk.as_ref().map(|r| r.iter().collect()),
        inline: m[hl..].to_vec(),
    }
}

/// RPCRDMA-07 (RFC 8166 §3.3.1): a responder sends nothing but answers. The requester here
/// keeps no Receive posted while no call is pending; an unsolicited Send would find no
/// buffer (fatal on iWARP, RNR on RoCE) or be what fills the Receive posted for the next
/// call — instead each Receive gets that call's reply.
#[test]
fn rpcrdma_07_a_responder_only_answers() {
    both(|t| {
        let r = rig(t);
        let mut raw = End::connect(&r.client_ctx, r.rdma.local_addr(), 0);
        raw.repost = false;
        // Messages nothing answers: too short (RPCRDMA-56), RDMA_ERROR and RDMA_DONE from
        // a requester (RPCRDMA-42, -70).
        raw.send(&words(&[1, 1, 8, 0, 0]));
        raw.send(&words(&[2, 1, 8, 4, 2]));
        raw.send(&words(&[3, 1, 8, 3, 0, 0, 0]));
        for xid in [10, 11, 12] {
            raw.post_recv(0);
            let mut m = emit(&Repr::msg(xid, 8, Chunks::NONE));
            m.extend_from_slice(&call_msg(xid, proc::NULL, &[]));
            raw.send(&m);
            let got = raw.recv();
            let (h, hl) = Repr::parse(&got).unwrap();
            assert_eq!(h.rdma_xid, xid, "{t:?}");
            let (rh, _) = decode_reply(&got[hl..]).unwrap();
            assert_eq!((rh.xid, rh.status), (xid, ReplyStatus::Success), "{t:?}");
        }
    });
}

/// RPCRDMA-58: replies with header errors are dropped without a word (with RPCRDMA-61,
/// RPCRDMA-69, RPCRDMA-70 at the requester and RPCRDMA-38's xid check): the call completes
/// with the good reply after them, nothing counts as an RDMA_ERROR, and the connection
/// goes on.
#[test]
fn rpcrdma_58_a_requester_drops_replies_with_header_errors() {
    both(|t| {
        let mut tap = tap(t, private_data(4096, 4096));
        let p = tap.client.start(PROG, 1, proc::NULL, &[]).unwrap();
        let xid = seen(&tap.call()).xid;
        let bad = reply_msg(xid, b"bad!");
        let with = |w: &[u32], tail: &[u8]| {
            let mut m = words(w);
            m.extend_from_slice(tail);
            m
        };
        let other_xid = {
            let mut m = emit(&Repr::msg(xid, 8, Chunks::NONE));
            m.extend_from_slice(&reply_msg(xid ^ 1, b"bad!"));
            m
        };
        let no_call = {
            let mut m = emit(&Repr::msg(xid ^ 1, 8, Chunks::NONE));
            m.extend_from_slice(&reply_msg(xid ^ 1, b"bad!"));
            m
        };
        for m in [
            // Under 28 octets (RPCRDMA-56).
            with(&[xid, 1, 8, 0, 0], &[]),
            // Version 2.
            with(&[xid, 2, 8, 0, 0, 0, 0], &bad),
            // No such procedure.
            with(&[xid, 1, 8, 9, 0, 0, 0], &bad),
            // RDMA_NOMSG without a chunk to carry the message (RPCRDMA-41).
            with(&[xid, 1, 8, 1, 0, 0, 0], &[]),
            // A Read list entry cut off by the end of the message.
            with(&[xid, 1, 8, 0, 1, 0, 5], &[]),
            // A list discriminator that is not an XDR boolean.
            with(&[xid, 1, 8, 0, 2, 0, 0], &bad),
            // A Write chunk of more segments than the message holds.
            with(&[xid, 1, 8, 0, 0, 1, 1000, 0, 0], &bad),
            // RDMA_MSGP (RPCRDMA-69) and RDMA_DONE (RPCRDMA-70).
            with(&[xid, 1, 8, 2, 0, 0, 0, 0, 0], &bad),
            with(&[xid, 1, 8, 3, 0, 0, 0], &[]),
            // RDMA_ERROR with an unknown code, and a cut ERR_VERS (RPCRDMA-61).
            with(&[xid, 1, 8, 4, 9, 0, 0], &[]),
            with(&[xid, 1, 8, 4, 1, 1], &[]),
            // The RPC message's xid is not the header's (RPCRDMA-38).
            other_xid,
            // A reply to no call.
            no_call,
        ] {
            tap.end.send(&m);
        }
        tap.answer(xid, 8, b"good");
        let got = p.wait_timeout(LONG).unwrap();
        assert_eq!(got.results, b"good", "{t:?}");
        let s = tap.tr.stats();
        assert_eq!((s.errors, s.replies_inline), (0, 1), "{t:?}");
        // The connection goes on.
        let p = tap.client.start(PROG, 1, proc::NULL, &[]).unwrap();
        let xid = seen(&tap.call()).xid;
        tap.answer(xid, 8, b"next");
        assert_eq!(p.wait_timeout(LONG).unwrap().results, b"next", "{t:?}");
    });
}

/// RPCRDMA-64: a valid transport header whose RPC arguments do not decode — here a Read
/// chunk whose length disagrees with the length word in the Payload stream before its
/// Position, or arguments cut short — gets the RPC reply GARBAGE_ARGS in an RDMA_MSG, not
/// an RDMA_ERROR; the consistent call is served.
#[test]
fn rpcrdma_64_undecodable_arguments_get_garbage_args_in_rdma_msg() {
    both(|t| {
        let r = rig(t);
        let mut raw = End::connect(&r.client_ctx, r.rdma.local_addr(), RECVS);
        let data = pattern(60, 1);
        raw.mr.copy_in(LENT_AT, &data).unwrap();
        let chunk = Segment {
            handle: raw.mr.rkey().0,
            length: 60,
            offset: raw.mr.addr(LENT_AT),
        };
        let seg = |pos: usize| ReadSegment::new(pos as u32, chunk);
        let mut ask = |xid: u32, reads: &[ReadSegment], stream: &[u8]| {
            let chunks = Chunks {
                read_list: ReadList::from(reads),
                ..Chunks::NONE
            };
            let mut m = emit(&Repr::msg(xid, 8, chunks));
            m.extend_from_slice(stream);
            raw.send(&m);
            let got = raw.recv();
            let (h, hl) = Repr::parse(&got).unwrap();
            assert_eq!(h.rdma_xid, xid, "{t:?}");
            assert!(
                matches!(h.body, Body::Msg(c) if c.is_empty()),
                "{t:?}: {:?}",
                h.body
            );
            let (rh, off) = decode_reply(&got[hl..]).unwrap();
            assert_eq!(rh.xid, xid);
            (rh.status, got[hl + off..].to_vec())
        };
        // The chunk (60 octets) after a length word of 100, then of 10.
        for (xid, word) in [(1u32, 100u32), (2, 10)] {
            let stream = call_msg(xid, proc::STRICT, &word.to_be_bytes());
            let read = [seg(stream.len())];
            let (st, _) = ask(xid, &read, &stream);
            assert_eq!(st, ReplyStatus::GarbageArgs, "{t:?} {word}");
        }
        // Inline arguments cut short.
        let mut args = 100u32.to_be_bytes().to_vec();
        args.extend_from_slice(&[7; 12]);
        let (st, _) = ask(3, &[], &call_msg(3, proc::STRICT, &args));
        assert_eq!(st, ReplyStatus::GarbageArgs, "{t:?}");
        // The chunk after a length word that agrees with it: served.
        let stream = call_msg(4, proc::STRICT, &60u32.to_be_bytes());
        let read = [seg(stream.len())];
        let (st, res) = ask(4, &read, &stream);
        assert_eq!(
            (st, res),
            (ReplyStatus::Success, 60u32.to_be_bytes().to_vec())
        );
    });
}

/// RPCRDMA-11: the inline thresholds come from the connection's private data alone and
/// stay. The responder here receives 2048 octets, so the call threshold is 2048: a call
/// that fills it goes in the Send, one word more is a Long Call — before and after an
/// RDMA_MSGP whose rdma_thresh says 1024 (the one in-band threshold RPC-over-RDMA ever
/// had, obsolete: dropped, RPCRDMA-69), after replies granting other credits, and after
/// Long Calls. Our requester never sends RDMA_MSGP itself.
#[test]
fn rpcrdma_11_thresholds_are_fixed_when_the_connection_is() {
    both(|t| {
        let mut tap = tap(t, private_data(4096, 2048));
        let th = tap.tr.thresholds();
        assert_eq!((th.call, th.reply), (2048, 4096), "{t:?}");
        // Transport header 28 (no chunks: the reply is small), call header 40.
        let fit = 2048 - 28 - 40;
        for round in 0..3u32 {
            for (n, long) in [(fit, false), (fit + 4, true)] {
                let args: Payload = pattern(n, u64::from(round as u8)).into();
                let space = ReplySpace {
                    max: 1024,
                    ddp: None,
                };
                let p = tap
                    .client
                    .start_with(PROG, 1, proc::ECHO, &args, space)
                    .unwrap();
                let m = tap.call();
                let s = seen(&m);
                assert_eq!(s.nomsg, long, "{t:?} round {round} n {n}");
                if long {
                    assert!(s.inline.is_empty() && s.reads.iter().all(|r| r.position == 0));
                } else {
                    assert_eq!(m.len(), 2048, "{t:?}");
                }
                if round == 0 && !long {
                    let mut msgp = words(&[s.xid, 1, 8, 2, 1024, 1024, 0, 0, 0]);
                    msgp.extend_from_slice(&reply_msg(s.xid, b"msgp"));
                    tap.end.send(&msgp);
                }
                tap.answer(s.xid, 1 + round, b"done");
                assert_eq!(p.wait_timeout(LONG).unwrap().results, b"done", "{t:?}");
                assert_eq!(tap.tr.thresholds(), th, "{t:?}");
            }
        }
    });
}

/// RPCRDMA-12, RPCRDMA-14, RPCRDMA-17, RPCRDMA-19, RPCRDMA-72: our requester reduces the
/// one item the caller marks DDP-eligible and nothing else, into one Read chunk at the
/// item's Position; the stream keeps the length word and every other item, and splices
/// back to the call.
/// RPCRDMA-15: marked optional-data leaves its "is present" word in the stream.
#[test]
fn rpcrdma_12_15_17_72_the_requester_reduces_only_the_marked_item() {
    both(|t| {
        let mut tap = tap(t, private_data(4096, 4096));
        // A counted array (opaque<>) of 4999 octets between two plain items.
        let mut counted = Payload::with_opaque(vec![0xA1; 8], &pattern(4999, 1));
        counted.xdr.extend_from_slice(&[0xB2; 4]);
        // Optional-data: "is present", then 6000 octets of data (a fixed-size opaque).
        let mut xdr = vec![0xC3; 16];
        xdr.extend_from_slice(&[0, 0, 0, 1]);
        let start = xdr.len();
        xdr.extend_from_slice(&pattern(6000, 2));
        xdr.extend_from_slice(&[0xD4; 4]);
        let optional = Payload {
            xdr,
            ddp: std::iter::once(start..start + 6000).collect(),
            shared: None,
        };
        for (what, args, word) in [
            ("counted", counted, 4999u32.to_be_bytes()),
            ("optional", optional, 1u32.to_be_bytes()),
        ] {
            let p = tap
                .client
                .start_with(PROG, 1, proc::ECHO, &args, ReplySpace::default())
                .unwrap();
            let s = seen(&tap.call());
            let whole = call_msg(s.xid, proc::ECHO, &args.xdr);
            let item = args.ddp[0].clone();
            // Call header 40: Positions count from the start of the RPC message.
            let pos = 40 + item.start;
            assert!(!s.nomsg, "{t:?} {what}");
            // One chunk: every segment at the item's Position (RPCRDMA-17, -19) ...
            assert!(!s.reads.is_empty(), "{t:?} {what}");
            assert!(s.reads.iter().all(|r| r.position as usize == pos));
            // ... holding the item's data and no more (RPCRDMA-24).
            assert_eq!(tap.end.pull(&s.reads), &args.xdr[item.clone()], "{t:?}");
            // The word before it stays in the stream (RPCRDMA-14, -15); so does every
            // item not marked (RPCRDMA-12, -72).
            assert_eq!(
                s.inline,
                reduce_all(&whole, std::slice::from_ref(&(pos..pos + item.len())))
            );
            assert_eq!(&s.inline[pos - 4..pos], &word, "{t:?} {what}");
            let back = splice(&s.inline, &[(pos as u32, &args.xdr[item])], 1 << 20).unwrap();
            assert_eq!(back, whole, "{t:?} {what}");
            tap.answer(s.xid, 8, &[]);
            p.wait_timeout(LONG).unwrap();
        }
    });
}

/// RPCRDMA-35, RPCRDMA-72, RPCRDMA-17: a call too big for the Send with nothing marked, or
/// whose reduced stream is still too big, goes whole in a Position-Zero Read chunk — its
/// XDR padding included, a multiple of 4 octets, the eligible item inside unreduced — and
/// in no other chunk.
#[test]
fn rpcrdma_35_a_long_call_carries_the_whole_stream_with_its_padding() {
    both(|t| {
        let mut tap = tap(t, private_data(4096, 4096));
        // Not eligible: an opaque of 5999 octets (one octet of padding).
        let plain: Payload = opaque(&pattern(5999, 3)).into();
        // Eligible but 5000 plain octets before it: reduced, still too big.
        let still_big = Payload::with_opaque(vec![0xE5; 5000], &pattern(7, 4));
        for (what, args) in [("plain", plain), ("eligible", still_big)] {
            let p = tap
                .client
                .start_with(PROG, 1, proc::ECHO, &args, ReplySpace::default())
                .unwrap();
            let s = seen(&tap.call());
            assert!(s.nomsg && s.inline.is_empty(), "{t:?} {what}");
            assert!(s.reads.iter().all(|r| r.position == 0), "{t:?} {what}");
            let whole = call_msg(s.xid, proc::ECHO, &args.xdr);
            let pulled = tap.end.pull(&s.reads);
            assert_eq!(pulled.len() % 4, 0, "{t:?} {what}");
            assert_eq!(pulled, whole, "{t:?} {what}");
            tap.answer(s.xid, 8, &[]);
            p.wait_timeout(LONG).unwrap();
        }
    });
}

/// RPCRDMA-12, RPCRDMA-17, RPCRDMA-72 at our responder: the one result marked DDP-eligible
/// fills one Write chunk (the second comes back unused and untouched); a result not marked
/// never goes into a Write chunk, however large. RPCRDMA-35: a Long Reply's Reply chunk
/// holds the whole reply with its XDR padding, a multiple of 4 octets.
#[test]
fn rpcrdma_12_17_35_72_the_responder_reduces_only_the_marked_result() {
    both(|t| {
        let r = rig(t);
        let mut raw = End::connect(&r.client_ctx, r.rdma.local_addr(), RECVS);
        let mut xid = 100;
        // (procedure, n, Reply chunk offered).
        for (proc, n, reply) in [
            (proc::MAKE, 3001usize, false),
            (proc::PLAIN, 101, false),
            (proc::PLAIN, 5999, true),
        ] {
            xid += 1;
            let first = [raw.lend(0, 2000, 0xEE), raw.lend(2000, 2000, 0xEE)];
            let second = [raw.lend(8192, 4000, 0xEE)];
            let rc = [raw.lend(16384, 16384, 0xEE)];
            let writes = [WriteChunk::from(&first[..]), WriteChunk::from(&second[..])];
            let chunks = Chunks {
                read_list: ReadList::EMPTY,
                write_list: WriteList::from(&writes[..]),
                reply_chunk: reply.then(|| WriteChunk::from(&rc[..])),
            };
            let mut m = emit(&Repr::msg(xid, 8, chunks));
            let mut args = (n as u32).to_be_bytes().to_vec();
            args.extend_from_slice(&[0, 0, 0, 9]);
            m.extend_from_slice(&call_msg(xid, proc, &args));
            raw.send(&m);
            let got = raw.recv();
            let (h, hl) = Repr::parse(&got).unwrap();
            assert_eq!(h.rdma_xid, xid);
            let c = *h.chunks().unwrap();
            let returned: Vec<Vec<Segment>> =
                c.write_list.iter().map(|w| w.iter().collect()).collect();
            assert_eq!(returned.len(), 2, "{t:?}: the Write list comes back whole");
            // The second chunk: unused, as offered, its memory as we left it.
            assert!(returned[1].iter().all(|s| s.length == 0), "{t:?}");
            assert_eq!(raw.lent(&second[0], 4000), vec![0xEE; 4000]);
            let msg = match h.body {
                Body::Msg(_) => got[hl..].to_vec(),
                Body::NoMsg(_) => {
                    let rc_back: Vec<Segment> = c.reply_chunk.unwrap().iter().collect();
                    let len: usize = rc_back.iter().map(|s| s.length as usize).sum();
                    assert_eq!(len % 4, 0, "{t:?}: RPCRDMA-35");
                    raw.lent(&rc[0], len)
                }
                b => panic!("{b:?}"),
            };
            assert_eq!(matches!(h.body, Body::NoMsg(_)), reply, "{t:?} {n}");
            let (rh, off) = decode_reply(&msg).unwrap();
            assert_eq!((rh.xid, rh.status), (xid, ReplyStatus::Success));
            let results = &msg[off..];
            if proc == proc::MAKE {
                // The data, in the first chunk only, filled in order; its length word
                // stays, its data and padding leave the stream.
                let lens: Vec<u32> = returned[0].iter().map(|s| s.length).collect();
                assert_eq!(lens, [2000, 1001], "{t:?}");
                let mut data = raw.lent(&first[0], 2000);
                data.extend(raw.lent(&first[1], 1001));
                assert_eq!(data, pattern(n, 9), "{t:?}");
                assert_eq!(results, [0, 0, 0, 7, 0, 0, 0x0b, 0xb9], "{t:?}");
            } else {
                // Not eligible: inline or in the Reply chunk, padding and all; the Write
                // chunk comes back unused and untouched.
                assert!(returned[0].iter().all(|s| s.length == 0), "{t:?} {n}");
                assert_eq!(raw.lent(&first[0], 2000), vec![0xEE; 2000]);
                assert_eq!(results, opaque(&pattern(n, 3)), "{t:?} {n}");
            }
        }
    });
}

/// RPCRDMA-15, unit vector: reducing optional-data takes the data (and its padding) and
/// leaves the "is present" word; splicing puts it back.
#[test]
fn rpcrdma_15_optional_data_keeps_its_is_present_word() {
    let mut xdr = vec![0u8, 0, 0, 1];
    let data = pattern(7, 5);
    xdr.extend_from_slice(&data);
    xdr.push(0); // padding to 8
    xdr.extend_from_slice(&[0xF6; 4]);
    let p = Payload {
        xdr: xdr.clone(),
        ddp: std::iter::once(4..11).collect(),
        shared: None,
    };
    assert!(p.check().is_ok());
    assert_eq!(p.reduced(), [0, 0, 0, 1, 0xF6, 0xF6, 0xF6, 0xF6]);
    assert_eq!(splice(&p.reduced(), &[(4, &data)], 64).unwrap(), xdr);
}

/// Which of a call's chunks a probe goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Read,
    Write,
    Reply,
}

/// A call lending all three kinds of chunk: its argument data (6000 octets, DDP-eligible,
/// past the 4096 threshold) in a Read chunk, a Write chunk of 4096 for the result, and a
/// Reply chunk (the reply may reach 16 KiB).
fn lending_call(tap: &Tap, data: &[u8]) -> Pending {
    let args = Payload::with_opaque(vec![0xA1; 8], data);
    let space = ReplySpace {
        max: 16384,
        ddp: Some(4096),
    };
    tap.client
        .start_with(PROG, 1, proc::ECHO, &args, space)
        .unwrap()
}

/// The plain segment under a Read chunk segment.
fn plain(r: &ReadSegment) -> Segment {
    Segment {
        handle: r.handle,
        length: r.length,
        offset: r.offset,
    }
}

/// RPCRDMA-23: the Read chunk our requester lends stays readable until the reply is sent.
/// RPCRDMA-55, RPCRDMA-80 (RFC 8166 §4.4.1, §8.1.2-8.1.3): once the reply is in and taken,
/// every handle the call lent (Read, Write and Reply chunk) is dead — an RDMA Read or Write
/// through it is a remote access error, and nothing reaches what the caller holds — and the
/// next call lends under new handles. One probe per connection: the error kills it.
#[test]
fn rpcrdma_23_55_80_lent_handles_live_until_the_reply_and_not_after() {
    both(|t| {
        for which in [Chunk::Read, Chunk::Write, Chunk::Reply] {
            let mut tap = tap(t, private_data(4096, 4096));
            let data = pattern(6000, 1);
            let p = lending_call(&tap, &data);
            let first = seen(&tap.call());
            assert_eq!(first.reads.len(), 1, "{t:?}");
            let (w, rc) = (first.writes[0][0], first.reply.as_ref().unwrap()[0]);
            // The responder fills the Write and Reply chunks, then reads the Read chunk,
            // last thing before its reply.
            let bulk = pattern(4096, 2);
            tap.end.put(&w, &bulk);
            let results = words(&[7, 4096]);
            let msg = reply_msg(first.xid, &results);
            tap.end.put(&rc, &msg);
            assert_eq!(tap.end.pull(&first.reads), data, "{t:?}");
            let used_w = [Segment { length: 4096, ..w }];
            let used_rc = [Segment {
                length: msg.len() as u32,
                ..rc
            }];
            let wl = [WriteChunk::from(&used_w[..])];
            let chunks = Chunks {
                read_list: ReadList::EMPTY,
                write_list: WriteList::from(&wl[..]),
                reply_chunk: Some(WriteChunk::from(&used_rc[..])),
            };
            tap.end.send(&emit(&Repr::nomsg(first.xid, 8, chunks)));
            let got = p.wait_timeout(LONG).unwrap();
            assert_eq!(got.results, results, "{t:?}");
            assert_eq!(got.bulk.as_deref(), Some(&bulk[..]), "{t:?}");
            // The next call: fresh registrations (RFC 8166 §8.1.2).
            let _next = lending_call(&tap, &data);
            let next = seen(&tap.call());
            assert_ne!(next.reads[0].handle, first.reads[0].handle, "{t:?}");
            assert_ne!(next.writes[0][0].handle, w.handle, "{t:?}");
            assert_ne!(next.reply.as_ref().unwrap()[0].handle, rc.handle, "{t:?}");
            // The first call's handles are gone, though its memory may be lent again.
            let (old, write) = match which {
                Chunk::Read => (plain(&first.reads[0]), false),
                Chunk::Write => (w, true),
                Chunk::Reply => (rc, true),
            };
            tap.end.refused(&tap.ctx.0, t, write, &old, Why::NoSuchKey);
            assert_eq!(got.bulk.as_deref(), Some(&bulk[..]), "{t:?} {which:?}");
        }
    });
}

/// RPCRDMA-55 (RFC 8166 §4.4.1), a cancelled RPC: the caller gives up on a call before its
/// reply; the responder may still be reading and writing its chunks, so they stay lent (the
/// memory is not reused meanwhile) — and die once the reply comes.
#[test]
fn rpcrdma_55_an_abandoned_call_keeps_its_chunks_until_its_reply() {
    both(|t| {
        for which in [Chunk::Read, Chunk::Write] {
            let mut tap = tap(t, private_data(4096, 4096));
            let data = pattern(6000, 3);
            let p = lending_call(&tap, &data);
            assert!(
                matches!(p.wait_timeout(Duration::ZERO), Err(RpcError::Timeout)),
                "{t:?}"
            );
            let s = seen(&tap.call());
            let w = s.writes[0][0];
            assert_eq!(tap.end.pull(&s.reads), data, "{t:?}");
            tap.end.put(&w, &pattern(4096, 4));
            let used = [Segment { length: 4096, ..w }];
            let wl = [WriteChunk::from(&used[..])];
            let chunks = Chunks {
                write_list: WriteList::from(&wl[..]),
                ..Chunks::NONE
            };
            let mut m = emit(&Repr::msg(s.xid, 8, chunks));
            m.extend_from_slice(&reply_msg(s.xid, &words(&[7, 4096])));
            tap.end.send(&m);
            // Replies are taken in order: once the next call's is in, the first is over.
            let p = tap.client.start(PROG, 1, proc::NULL, &[]).unwrap();
            let xid = seen(&tap.call()).xid;
            tap.answer(xid, 8, b"next");
            assert_eq!(p.wait_timeout(LONG).unwrap().results, b"next", "{t:?}");
            let (old, write) = match which {
                Chunk::Read => (plain(&s.reads[0]), false),
                _ => (w, true),
            };
            tap.end.refused(&tap.ctx.0, t, write, &old, Why::NoSuchKey);
        }
    });
}

/// RPCRDMA-50 (RFC 8166 §4.3.2.2): the requester takes from its Write chunk only what the
/// responder says it wrote. The stand-in fills the chunk with garbage, then returns it
/// unused with the result inline — the caller gets the inline result and no bulk data — or
/// says it wrote 1000 octets — the caller gets those 1000 and none of the garbage after.
#[test]
fn rpcrdma_50_write_chunk_memory_is_not_assumed_untouched() {
    both(|t| {
        let mut tap = tap(t, private_data(4096, 4096));
        let space = ReplySpace {
            max: 1024,
            ddp: Some(4096),
        };
        for used in [0usize, 1000] {
            let args: Payload = words(&[4096, 1]).into();
            let p = tap
                .client
                .start_with(PROG, 1, proc::MAKE, &args, space)
                .unwrap();
            let s = seen(&tap.call());
            let w = s.writes[0][0];
            assert_eq!(w.length, 4096, "{t:?}");
            tap.end.put(&w, &[0xBD; 4096]);
            let real = pattern(used, 5);
            let results = if used == 0 {
                let mut r = words(&[7]);
                r.extend_from_slice(&opaque(&pattern(100, 6)));
                r
            } else {
                tap.end.put(&w, &real);
                words(&[7, used as u32])
            };
            let back = [Segment {
                length: used as u32,
                ..w
            }];
            let wl = [WriteChunk::from(&back[..])];
            let chunks = Chunks {
                write_list: WriteList::from(&wl[..]),
                ..Chunks::NONE
            };
            let mut m = emit(&Repr::msg(s.xid, 8, chunks));
            m.extend_from_slice(&reply_msg(s.xid, &results));
            tap.end.send(&m);
            let got = p.wait_timeout(LONG).unwrap();
            assert_eq!(got.results, results, "{t:?} {used}");
            assert_eq!(
                got.bulk.as_deref(),
                (used > 0).then_some(&real[..]),
                "{t:?} {used}"
            );
        }
        let s = tap.tr.stats();
        assert_eq!((s.replies_inline, s.replies_write_chunk), (1, 1), "{t:?}");
    });
}

/// RPCRDMA-79 (RFC 8166 §8.1.1): a raw requester with two connections to our responder,
/// each with its own Protection Domain. On B it offers a Write chunk whose handle is of A's
/// memory: B's end refuses our responder's RDMA Write (remote access error, nothing
/// placed), connection B fails and no reply comes on it; A goes on, its handle good on A.
#[test]
fn rpcrdma_79_a_handle_used_on_another_connection_fails_that_connection() {
    both(|t| {
        let r = rig(t);
        let mut a = End::connect(&r.client_ctx, r.rdma.local_addr(), RECVS);
        let mut b = End::connect(&r.client_ctx, r.rdma.local_addr(), RECVS);
        let theirs = a.lend(0, 4096, 0x11);
        let make = |xid: u32| {
            let seg = [theirs];
            let wl = [WriteChunk::from(&seg[..])];
            let chunks = Chunks {
                write_list: WriteList::from(&wl[..]),
                ..Chunks::NONE
            };
            let mut m = emit(&Repr::msg(xid, 8, chunks));
            m.extend_from_slice(&call_msg(xid, proc::MAKE, &words(&[3000, 9])));
            m
        };
        b.send(&make(1));
        match t {
            T::Iwarp => {
                // B's end refuses the Write with a Terminate saying why (RFC 5041 §7.2),
                // and B is dead: the reply behind the Write never arrives.
                b.wait_dead();
                let code = loop {
                    match r.client_ctx.get_async_event(LONG) {
                        Some(AsyncEvent::Qp {
                            qp_num,
                            event: QpEvent::LocalError(tr),
                        }) if qp_num == b.qp.qp_num() => break tr.code,
                        Some(_) => continue,
                        None => panic!("no Terminate from B"),
                    }
                };
                assert!(refusal(code, Why::OtherPd), "{code:?}");
            }
            T::Roce => {
                // B's end NAKs the Write (Remote Access Error, IBA 9.7.5.2.4), which fails
                // our responder's QP; the server ends that connection with the CM's DREQ,
                // and B's QP is flushed: the reply behind the Write never arrives.
                b.wait_dead();
                assert!(b.qp.counters().errors_tx >= 1, "B sent no NAK");
                loop {
                    match r.client_ctx.get_async_event(LONG) {
                        Some(AsyncEvent::Disconnected { qp_num }) if qp_num == b.qp.qp_num() => {
                            break;
                        }
                        Some(_) => continue,
                        None => panic!("no disconnect of B"),
                    }
                }
            }
        }
        assert!(b.got.is_empty(), "{t:?}: a reply on B");
        assert!(b.qp.state().is_dead(), "{t:?}");
        assert_eq!(a.lent(&theirs, 4096), vec![0x11; 4096], "{t:?}");
        // A is unharmed: the same handle, on its own connection, takes the result.
        a.send(&make(2));
        let got = a.recv();
        let (h, hl) = Repr::parse(&got).unwrap();
        assert_eq!(h.rdma_xid, 2, "{t:?}");
        let c = *h.chunks().unwrap();
        let lens: Vec<u32> = c
            .write_list
            .iter()
            .flat_map(|w| w.iter())
            .map(|s| s.length)
            .collect();
        assert_eq!(lens, [3000], "{t:?}");
        let (rh, _) = decode_reply(&got[hl..]).unwrap();
        assert_eq!((rh.xid, rh.status), (2, ReplyStatus::Success), "{t:?}");
        assert_eq!(a.lent(&theirs, 3000), pattern(3000, 9), "{t:?}");
    });
}

/// RPCRDMA-66 (RFC 8166 §4.5.4): a call the requester cannot build fails at once, from
/// `start`: here one larger than the connection's largest message. Nothing goes out and no
/// credit is kept (the connection has one until the first reply): the next call is the
/// first thing the responder sees, and a call of exactly the largest size goes (Long Call).
#[test]
fn rpcrdma_66_a_call_that_cannot_be_built_fails_at_once() {
    both(|t| {
        let cfg = RdmaConfig {
            max_message: 65536,
            ..RdmaConfig::default()
        };
        let mut tap = tap_with(t, private_data(4096, 4096), cfg);
        // Call header 40, the opaque's length word 4: a message of 65540 octets.
        let over = opaque(&pattern(65496, 7));
        match tap.client.start(PROG, 1, proc::ECHO, &over) {
            Err(RpcError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput),
            Err(e) => panic!("{t:?}: {e}"),
            Ok(_) => panic!("{t:?}: a call over max_message started"),
        }
        let fits = opaque(&pattern(65492, 7));
        let p = tap.client.start(PROG, 1, proc::ECHO, &fits).unwrap();
        let s = seen(&tap.call());
        assert_eq!(s.xid, p.xid(), "{t:?}");
        assert!(s.nomsg, "{t:?}");
        let whole = tap.end.pull(&s.reads);
        assert_eq!(whole, call_msg(s.xid, proc::ECHO, &fits), "{t:?}");
        tap.answer(s.xid, 8, b"fits");
        assert_eq!(p.wait_timeout(LONG).unwrap().results, b"fits", "{t:?}");
        assert_eq!(tap.tr.stats().calls_long, 1, "{t:?}");
    });
}
