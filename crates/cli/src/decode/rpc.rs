//! RPC-over-RDMA (RFC 8166) and the ONC RPC message (RFC 5531) inside a Send.
//!
//! A Send payload is taken for RPC-over-RDMA only when the transport header
//! parses completely and, for `RDMA_MSG`, the ONC RPC message behind it parses
//! and carries the same XID (RFC 8166 §4.2.1). perftest's Send payloads fool
//! Wireshark's looser heuristic; they do not pass this one.

use softrdma_wire::{onc_rpc, rpcrdma};

use super::record::Record;

/// Decode `payload` (the first segment of a Send message) if it is RPC-over-RDMA.
pub(crate) fn decode_into(r: &mut Record, payload: &[u8]) {
    let Ok((hdr, hlen)) = rpcrdma::Repr::parse(payload) else {
        return;
    };
    let rpc = match hdr.body {
        rpcrdma::Body::Msg(_) => match onc_rpc::Repr::parse(&payload[hlen..]) {
            Ok((m, mlen)) if m.xid == hdr.rdma_xid => Some((m, mlen)),
            _ => return, // not RPC-over-RDMA after all
        },
        rpcrdma::Body::NoMsg(_) | rpcrdma::Body::Error(_) => None,
        // Obsolete procedures are never sent; their presence means this is not RPC-over-RDMA.
        rpcrdma::Body::MsgP { .. } | rpcrdma::Body::Done => return,
    };
    r.summary.push_str(&format!(" | {}", summary(&hdr)));
    r.layer("rpcrdma", hdr);
    r.reemit(payload, |b| hdr.emit(b), hlen);
    if let Some((m, mlen)) = rpc {
        r.summary.push_str(&format!(" | {}", rpc_summary(&m)));
        r.layer("rpc", m);
        r.reemit(&payload[hlen..], |b| m.emit(b), mlen);
    }
}

fn summary(h: &rpcrdma::Repr<'_>) -> String {
    let mut s = format!(
        "RPC-over-RDMA {} xid {:#010x} credits {}",
        proc_name(h.body.proc()),
        h.rdma_xid,
        h.rdma_credit
    );
    if let Some(c) = h.body.chunks() {
        if !c.read_list.is_empty() {
            s.push_str(&format!(" read list {}", c.read_list.len()));
        }
        if !c.write_list.is_empty() {
            s.push_str(&format!(" write list {}", c.write_list.len()));
        }
        if let Some(rc) = &c.reply_chunk {
            s.push_str(&format!(" reply chunk {}", rc.len()));
        }
    }
    if let rpcrdma::Body::Error(e) = &h.body {
        s.push_str(&format!(" {e}"));
    }
    s
}

fn proc_name(p: rpcrdma::Proc) -> &'static str {
    match p {
        rpcrdma::Proc::Msg => "RDMA_MSG",
        rpcrdma::Proc::NoMsg => "RDMA_NOMSG",
        rpcrdma::Proc::MsgP => "RDMA_MSGP",
        rpcrdma::Proc::Done => "RDMA_DONE",
        rpcrdma::Proc::Error => "RDMA_ERROR",
    }
}

fn rpc_summary(m: &onc_rpc::Repr<'_>) -> String {
    match &m.body {
        onc_rpc::MsgBody::Call(c) => {
            let mut s = format!(
                "RPC CALL xid {:#010x} prog {} vers {} proc {}",
                m.xid, c.prog, c.vers, c.proc
            );
            if let Some(n) = softrdma_nfs::proto::procedure_name(c.prog, c.vers, c.proc) {
                s.push_str(&format!(" ({n})"));
            }
            s
        }
        onc_rpc::MsgBody::Reply(onc_rpc::ReplyBody::Accepted(a)) => {
            format!(
                "RPC REPLY xid {:#010x} {}",
                m.xid,
                a.reply_data.accept_stat()
            )
        }
        onc_rpc::MsgBody::Reply(onc_rpc::ReplyBody::Denied(d)) => {
            format!("RPC REPLY xid {:#010x} denied {}", m.xid, d.reject_stat())
        }
    }
}

/// Names replies after their calls, as tshark does: an RPC-over-RDMA message whose xid
/// answers a call seen earlier between the same hosts (the other way) gets the call's
/// procedure and frame. RFC 5531 §9: the xid is the only link. Hosts, not ports: a RoCEv2
/// datagram's UDP source port is its sender QP's, not the connection's. `records` in frame
/// order.
pub(crate) fn name_replies(records: &mut [Record]) {
    use std::collections::HashMap;
    fn host(a: &str) -> String {
        a.rsplit_once(':').map_or(a, |(h, _)| h).to_string()
    }
    // (xid, from, to) of each call -> (name, frame).
    let mut calls: HashMap<(u64, String, String), (String, u64)> = HashMap::new();
    for r in records.iter_mut() {
        let Some(xid) = r
            .layers
            .get("rpcrdma")
            .and_then(|l| l.get("rdma_xid"))
            .and_then(|x| x.as_u64())
        else {
            continue;
        };
        let call = r
            .layers
            .get("rpc")
            .and_then(|l| l.get("body"))
            .and_then(|b| b.get("Call"));
        if let Some(c) = call {
            let num = |k: &str| c.get(k).and_then(|v| v.as_u64()).unwrap_or(u64::MAX);
            let (prog, vers, proc) = (num("prog"), num("vers"), num("proc"));
            let name = u32::try_from(prog)
                .ok()
                .zip(u32::try_from(vers).ok())
                .zip(u32::try_from(proc).ok())
                .and_then(|((p, v), c)| softrdma_nfs::proto::procedure_name(p, v, c))
                .unwrap_or_else(|| format!("prog {prog} vers {vers} proc {proc}"));
            calls.insert((xid, host(&r.src), host(&r.dst)), (name, r.frame));
        } else if let Some((name, frame)) = calls.get(&(xid, host(&r.dst), host(&r.src))) {
            r.summary
                .push_str(&format!(" ({name} reply, call in {frame})"));
        }
    }
}
