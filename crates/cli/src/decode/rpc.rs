//! RPC-over-RDMA (RFC 8166) and the ONC RPC message (RFC 5531) inside a Send, and ONC RPC
//! records on TCP (RFC 5531 §11: portmap and MOUNT beside NFS over RDMA).
//!
//! A Send payload is taken for RPC-over-RDMA only when the transport header
//! parses completely and, for `RDMA_MSG`, the ONC RPC message behind it parses
//! and carries the same XID (RFC 8166 §4.2.1). perftest's Send payloads fool
//! Wireshark's looser heuristic; they do not pass this one.
//!
//! Calls and replies are named as tshark names them: `NFS V3 GETATTR Call`,
//! `MOUNT V3 MNT Reply (Call In 18)`, `Portmap V2 GETPORT Call`.

use softrdma_nfs::names::{procedure_name, program_name};
use softrdma_rpc::record::{LAST_FRAGMENT, MARK_LEN};
use softrdma_wire::{onc_rpc, rpcrdma};

use super::nfs4;
use super::record::{Record, RpcMessage};

/// The largest ONC RPC record taken from a TCP stream: an NFS READ or WRITE of 1 MiB (Linux's
/// largest) and its headers.
pub(crate) const MAX_RECORD: usize = (1 << 20) + 64 * 1024;

/// What a reply's summary says before [`name_replies`] names it after its call.
const UNNAMED_REPLY: &str = "RPC Reply";

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
    // RDMA_NOMSG: the message is in a chunk; the xid still pairs a reply with its call.
    r.rpc = Some(RpcMessage {
        xid: hdr.rdma_xid,
        call: None,
        compound: None,
    });
    if let Some((m, mlen)) = rpc {
        // Where reduced data items were (RFC 8166 §3.4.5): offsets in the RPC message.
        let reduced: Vec<u32> = hdr
            .body
            .chunks()
            .map(|c| c.read_list.iter().map(|s| s.position).collect())
            .unwrap_or_default();
        message_layer(r, &m, &payload[hlen..], mlen, &reduced);
        r.summary.push_str(" | ");
        r.summary.push_str(&rpc_summary(&m, r.rpc.as_ref()));
    }
}

/// One ONC RPC record from a TCP stream (its record marks removed); `kept`: only its first
/// octets were captured, the rest being zeros that stand for what a hole lost.
pub(crate) fn decode_record(r: &mut Record, rec: &[u8], kept: Option<usize>) {
    if let Some(k) = kept {
        return decode_cut_record(r, &rec[..k.min(rec.len())], rec.len());
    }
    match onc_rpc::Repr::parse(rec) {
        Ok((m, mlen)) => {
            message_layer(r, &m, rec, mlen, &[]);
            r.summary = rpc_summary(&m, r.rpc.as_ref());
        }
        Err(e) => {
            r.summary = "undecodable ONC RPC record".into();
            r.error(e);
        }
    }
}

/// An ONC RPC record of `total` octets of which the capture kept only the first (`kept`),
/// the rest cut by its snap length or lost: its header as far as it was kept — the whole
/// message header, else the XID and a call's program, version and procedure, which is what
/// pairs a reply with its call and names both.
fn decode_cut_record(r: &mut Record, kept: &[u8], total: usize) {
    r.check(
        "captured",
        None,
        format!(
            "{} of {total} octets of this record: the rest not decoded",
            kept.len()
        ),
    );
    if let Ok((m, mlen)) = onc_rpc::Repr::parse(kept) {
        message_layer(r, &m, kept, mlen, &[]);
        r.summary = format!("{} [cut]", rpc_summary(&m, r.rpc.as_ref()));
        return;
    }
    let word = |i: usize| {
        kept.get(4 * i..4 * i + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    // RFC 5531 §9: xid, msg_type; a call's rpcvers, prog, vers, proc.
    match (word(0), word(1)) {
        (Some(xid), Some(0)) => {
            let call = match (word(3), word(4), word(5)) {
                (Some(prog), Some(vers), Some(proc)) => Some((prog, vers, proc)),
                _ => None,
            };
            r.layer(
                "rpc",
                serde_json::json!({ "xid": xid, "msg_type": "call", "call": call }),
            );
            r.summary = match call {
                Some((prog, vers, proc)) => {
                    r.rpc = Some(RpcMessage {
                        xid,
                        call,
                        compound: None,
                    });
                    format!("{} Call xid {xid:#010x} [cut]", label(prog, vers, proc))
                }
                None => format!("RPC Call xid {xid:#010x} [cut inside its header]"),
            };
        }
        (Some(xid), Some(1)) => {
            r.layer(
                "rpc",
                serde_json::json!({ "xid": xid, "msg_type": "reply" }),
            );
            r.rpc = Some(RpcMessage {
                xid,
                call: None,
                compound: None,
            });
            r.summary = format!("{UNNAMED_REPLY} xid {xid:#010x} [cut]");
        }
        _ => r.summary = "ONC RPC record [cut before its header]".into(),
    }
}

/// The message's layer and what pairs it; `reduced`: offsets in `wire` of data items that
/// travel in read chunks.
fn message_layer(r: &mut Record, m: &onc_rpc::Repr<'_>, wire: &[u8], len: usize, reduced: &[u32]) {
    let call = match &m.body {
        onc_rpc::MsgBody::Call(c) => Some((c.prog, c.vers, c.proc)),
        onc_rpc::MsgBody::Reply(_) => None,
    };
    let compound = match call {
        Some((softrdma_nfs::proto::NFS_PROGRAM, 4, 1)) => wire.get(len..).and_then(|args| {
            nfs4::compound_ops(args, |at| {
                u32::try_from(len + at).is_ok_and(|p| reduced.contains(&p))
            })
        }),
        _ => None,
    };
    r.rpc = Some(RpcMessage {
        xid: m.xid,
        call,
        compound,
    });
    r.layer("rpc", m);
    r.reemit(wire, |b| m.emit(b), len);
}

/// Does a TCP stream starting with `b` carry ONC RPC records? `None` until 16 octets are in.
/// As tshark's heuristic: one fragment of a plausible size holding a call of RPC version 2,
/// or a reply whose reply_stat is valid (RFC 5531 §9).
pub(crate) fn is_record_stream(b: &[u8]) -> Option<bool> {
    let be32 = |o: usize| {
        b.get(o..o + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    };
    let (mark, msg_type, next) = (be32(0)?, be32(MARK_LEN + 4)?, be32(MARK_LEN + 8)?);
    let len = (mark & !LAST_FRAGMENT) as usize;
    Some(
        (24..=MAX_RECORD).contains(&len)
            && match msg_type {
                0 => next == onc_rpc::RPC_VERSION,
                1 => next <= 1,
                _ => false,
            },
    )
}

/// Where, after the first octet and before `limit`, `b` holds the start of an ONC RPC call
/// record: for a stream whose records do not begin at segment starts (a capture taken on a
/// host whose TCP segments leave coalesced, joined inside a record). Stricter than
/// [`is_record_stream`], since payload octets are scanned: the last-fragment bit, a call of
/// RPC version 2 to a program we know, and, where the capture holds it, a plausible record
/// after this one. Candidates whose 28 octets of call header are not all in `b` are passed.
pub(crate) fn record_within(b: &[u8], limit: usize) -> Option<usize> {
    let be32 = |o: usize| {
        b.get(o..o + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    };
    (1..limit.min(b.len().saturating_sub(MARK_LEN + 24))).find(|&k| {
        // Cheapest test first: msg_type CALL (0) and RPC version 2.
        if be32(k + MARK_LEN + 4) != Some(0) || be32(k + MARK_LEN + 8) != Some(onc_rpc::RPC_VERSION)
        {
            return false;
        }
        let (Some(mark), Some(prog), Some(vers)) =
            (be32(k), be32(k + MARK_LEN + 12), be32(k + MARK_LEN + 16))
        else {
            return false;
        };
        let len = (mark & !LAST_FRAGMENT) as usize;
        mark & LAST_FRAGMENT != 0
            && (24..=MAX_RECORD).contains(&len)
            && program_name(prog).is_some()
            && vers < 16
            && b.get(k + MARK_LEN + len..)
                .is_none_or(|next| is_record_stream(next) != Some(false))
    })
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

/// "NFS V3 GETATTR", as tshark's protocol column and Info begin; numbers for what it does
/// not know ("RPC prog 100099 V1 proc-3").
fn label(prog: u32, vers: u32, proc: u32) -> String {
    let prog_name = program_name(prog).map_or_else(|| format!("RPC prog {prog}"), str::to_string);
    let proc_name =
        procedure_name(prog, vers, proc).map_or_else(|| format!("proc-{proc}"), str::to_string);
    format!("{prog_name} V{vers} {proc_name}")
}

fn rpc_summary(m: &onc_rpc::Repr<'_>, msg: Option<&RpcMessage>) -> String {
    match &m.body {
        onc_rpc::MsgBody::Call(c) => {
            let mut s = format!("{} Call xid {:#010x}", label(c.prog, c.vers, c.proc), m.xid);
            if let Some(ops) = msg.and_then(|m| m.compound.as_ref()) {
                s.push_str(&format!(" {ops}"));
            }
            s
        }
        onc_rpc::MsgBody::Reply(onc_rpc::ReplyBody::Accepted(a)) => {
            format!(
                "{UNNAMED_REPLY} xid {:#010x} {}",
                m.xid,
                a.reply_data.accept_stat()
            )
        }
        onc_rpc::MsgBody::Reply(onc_rpc::ReplyBody::Denied(d)) => {
            format!(
                "{UNNAMED_REPLY} xid {:#010x} denied {}",
                m.xid,
                d.reject_stat()
            )
        }
    }
}

/// Names replies after their calls, as tshark does: a reply whose xid answers a call seen
/// earlier between the same hosts (the other way) gets the call's procedure and frame
/// (`NFS V3 READ Reply (Call In 33)`). RFC 5531 §9: the xid is the only link. Hosts, not
/// ports: a RoCEv2 datagram's UDP source port is its sender QP's, not the connection's.
/// `records` in frame order.
pub(crate) fn name_replies(records: &mut [Record]) {
    use std::collections::HashMap;
    fn host(a: &str) -> &str {
        a.rsplit_once(':').map_or(a, |(h, _)| h)
    }
    // (xid, from, to) of each call -> (label, frame, its COMPOUND's operations).
    let mut calls: HashMap<(u32, String, String), (String, u64, String)> = HashMap::new();
    for r in records.iter_mut() {
        let Some(m) = &r.rpc else { continue };
        if let Some((prog, vers, proc)) = m.call {
            let k = (m.xid, host(&r.src).to_string(), host(&r.dst).to_string());
            let ops = m
                .compound
                .as_ref()
                .map(|c| format!(" {c}"))
                .unwrap_or_default();
            calls.insert(k, (label(prog, vers, proc), r.frame, ops));
            continue;
        }
        let k = (m.xid, host(&r.dst).to_string(), host(&r.src).to_string());
        if let Some((name, frame, ops)) = calls.get(&k) {
            let named = format!("{name} Reply (Call In {frame})");
            r.summary = if r.summary.contains(UNNAMED_REPLY) {
                // The reply's own part ends the summary: its operations follow it.
                format!("{}{ops}", r.summary.replacen(UNNAMED_REPLY, &named, 1))
            } else {
                // RDMA_NOMSG: the reply itself travelled in a chunk.
                format!("{} | {named}{ops}", r.summary)
            };
        }
    }
}
