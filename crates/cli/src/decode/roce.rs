//! RoCEv2 datagrams: IP/UDP, ICRC, BTH and extended headers, and what Sends carry.

use softrdma_wire::ib::cm::CmMessage;
use softrdma_wire::ib::cma::{CmaHeader, port_of_service};
use softrdma_wire::ib::mad::MAD_HEADER_LEN;
use softrdma_wire::ib::{Operation, PacketRepr, Service};
use softrdma_wire::rocev2::{self, RoceV2Packet, RoceV2Repr, UdpChecksum};

use super::record::{Record, SendSegment};
use super::{Ctx, rpc, summary};

pub(crate) const ROCEV2_PORT: u16 = rocev2::ROCEV2_UDP_PORT;

/// Decode one RoCEv2 packet; `ip` is the whole IP packet.
/// `port`: the UDP destination port, 4791 or one decoded as RoCEv2 (`--roce-port`).
pub(crate) fn decode(ctx: &Ctx, ip: &[u8], port: u16) -> Record {
    let mut r = record(ctx);
    let pkt = match RoceV2Packet::parse_on_port(ip, port) {
        Ok(p) => p,
        Err(e) => {
            r.summary = "undecodable RoCEv2 packet".into();
            r.error(e);
            return r;
        }
    };
    r.check(
        "icrc",
        Some(pkt.icrc_ok()),
        if pkt.icrc_ok() {
            String::new()
        } else {
            format!(
                "field {:#010x}, computed {:#010x}",
                pkt.icrc, pkt.computed_icrc
            )
        },
    );
    r.layer("ip", pkt.ip);
    r.layer("udp", pkt.udp);
    let ib = match PacketRepr::parse(pkt.transport) {
        Ok(p) => p,
        Err(e) => {
            r.summary = "undecodable IB transport headers".into();
            r.error(e);
            return r;
        }
    };
    ib_layer(&mut r, &ib);
    // Whole-packet re-emit: IP + UDP + transport + ICRC, byte for byte. A UDP checksum
    // that is not the right one was left to the sender's NIC (a capture on the sending
    // host holds the partial sum, as tcpdump's "bad udp cksum" on locally sent datagrams):
    // re-emitted as it is, and said so, not counted as an error (RoCEv2 relies on the ICRC).
    let csum = if pkt.udp.checksum == 0 {
        UdpChecksum::Zero
    } else if pkt.udp_checksum_ok() {
        UdpChecksum::Compute
    } else {
        r.check(
            "udp checksum",
            None,
            "not the final one (offloaded by the sender)",
        );
        UdpChecksum::Given(pkt.udp.checksum)
    };
    let repr = RoceV2Repr {
        ip: pkt.ip,
        udp: pkt.udp,
        packet: ib,
    };
    r.reemit(ip, |b| repr.emit(b, csum), repr.buffer_len());

    let op = ib.bth.opcode;
    if ib.bth.dest_qp == 1 && op.service() == Service::Ud {
        // QP1: General Services Interface — Communication Management MADs.
        if let Some((s, mad)) = mad(ib.payload) {
            r.summary.push_str(&format!(" | {s}"));
            r.layer("mad", mad);
        }
    } else {
        if ctx.sends {
            r.send = send_segment(op.operation(), ib.payload);
        }
        if matches!(
            op.operation(),
            Operation::SendFirst
                | Operation::SendOnly
                | Operation::SendOnlyWithImmediate
                | Operation::SendOnlyWithInvalidate
        ) {
            rpc::decode_into(&mut r, ib.payload);
        }
    }
    // Last, as on the wire: the ICRC trails the packet.
    r.layer(
        "icrc",
        serde_json::json!({ "field": pkt.icrc, "computed": pkt.computed_icrc }),
    );
    r
}

/// A RoCEv2 packet the capture cut short (its snap length): `transport` is what it kept of
/// the UDP payload, `captured` of the `wire` octets of the IP packet. The headers it kept are
/// decoded; the payload and the ICRC, which it did not keep, cannot be verified: a note on
/// the record, not an error (the capture's choice, not the sender's fault).
pub(crate) fn decode_cut(ctx: &Ctx, transport: &[u8], captured: usize, wire: usize) -> Record {
    let mut r = record(ctx);
    match PacketRepr::parse_headers(transport) {
        Ok((ib, _)) => ib_layer(&mut r, &ib),
        Err(e) => r.summary = format!("RoCEv2 packet cut inside its headers ({e})"),
    }
    r.check(
        "captured",
        None,
        format!("{captured} of {wire} octets of the IP packet: payload and ICRC not verified"),
    );
    r
}

/// A RoCEv2 record of the frame `ctx` names.
fn record(ctx: &Ctx) -> Record {
    Record::new(
        ctx.frame,
        ctx.time,
        ctx.src.clone(),
        ctx.dst.clone(),
        "RoCEv2",
    )
}

/// The record's summary and "ib" layer from the IB transport headers.
fn ib_layer(r: &mut Record, ib: &PacketRepr<'_>) {
    r.summary = summary::ib_packet(ib);
    r.layer("ib", *ib);
    if let Some(a) = ib.aeth {
        // The raw syndrome octet beside the decoded one (what tshark shows).
        if let Some(m) = r
            .layer_mut("ib")
            .and_then(|m| m.get_mut("aeth"))
            .and_then(|a| a.as_object_mut())
        {
            m.insert("syndrome_code".into(), u8::from(a.syndrome).into());
        }
    }
}

/// A packet of a Send message (IBA 9.4.1: First, Middle, Last or Only), whole.
fn send_segment(op: Operation, payload: &[u8]) -> Option<SendSegment> {
    use Operation::*;
    let (first, last) = match op {
        SendFirst => (true, false),
        SendMiddle => (false, false),
        SendLast | SendLastWithImmediate | SendLastWithInvalidate => (false, true),
        SendOnly | SendOnlyWithImmediate | SendOnlyWithInvalidate => (true, true),
        _ => return None,
    };
    Some(SendSegment {
        first,
        last,
        payload: payload.to_vec(),
    })
}

/// IBA ch. 13.4 MAD common header; CM (class 0x07) attribute names as tshark prints them.
fn mad(p: &[u8]) -> Option<(String, serde_json::Value)> {
    if p.len() < 24 {
        return None;
    }
    let class = p[1];
    let method = p[3];
    let attr = u16::from_be_bytes([p[16], p[17]]);
    let tid = u64::from_be_bytes(p[8..16].try_into().ok()?);
    let name = match (class, attr) {
        (0x07, 0x0010) => "ConnectRequest",
        (0x07, 0x0011) => "MsgRcptAck",
        (0x07, 0x0012) => "ConnectReject",
        (0x07, 0x0013) => "ConnectReply",
        (0x07, 0x0014) => "ReadyToUse",
        (0x07, 0x0015) => "DisconnectRequest",
        (0x07, 0x0016) => "DisconnectReply",
        (0x07, 0x0017) => "ServiceIDResReq",
        (0x07, 0x0018) => "ServiceIDResReqResp",
        (0x07, 0x0019) => "LoadAlternatePath",
        (0x07, 0x001a) => "AlternatePathResponse",
        _ => "",
    };
    let mut fields = serde_json::json!({
        "base_version": p[0], "mgmt_class": class, "class_version": p[2], "method": method,
        "status": u16::from_be_bytes([p[4], p[5]]), "transaction_id": tid,
        "attribute_id": attr, "attribute_modifier": u32::from_be_bytes([p[20], p[21], p[22], p[23]]),
    });
    let s = if class == 0x07 {
        let mut s = format!("CM {name} (attr {attr:#06x}, method {method:#04x}, TID {tid:#x})");
        // IBA §12.6: what the message says, as the fields a reader looks for.
        if let Some(d) = p.get(MAD_HEADER_LEN..)
            && let Ok(m) = CmMessage::parse(attr, d)
        {
            let (line, cm) = cm_summary(&m);
            s.push_str(&line);
            fields["cm"] = cm;
        }
        s
    } else {
        format!("MAD class {class:#04x} method {method:#04x} attr {attr:#06x}")
    };
    Some((s, fields))
}

/// A service ID, with librdmacm's port space and port when it is one of those.
fn service(id: u64) -> String {
    use softrdma_wire::ib::cma::PortSpace;
    match port_of_service(id) {
        Some((ps, port)) => {
            let name = match ps {
                PortSpace::Ipoib => "IPOIB",
                PortSpace::Tcp => "TCP",
                PortSpace::Udp => "UDP",
                PortSpace::Ib => "IB",
            };
            format!("service {id:#x} (RDMA_PS_{name} port {port})")
        }
        None => format!("service {id:#x}"),
    }
}

/// librdmacm's CMA header at the start of REQ / SIDR_REQ private data, when there is one.
fn cma(private: &[u8]) -> String {
    match CmaHeader::parse(private) {
        Ok((h, _)) => format!(" {} → {}", h.src, h.dst),
        Err(_) => String::new(),
    }
}

/// The line and the JSON fields of a CM message.
fn cm_summary(m: &CmMessage<'_>) -> (String, serde_json::Value) {
    use serde_json::json;
    match m {
        CmMessage::Req(r) => (
            format!(
                " comm {:#x} {}{} QPN {:#x} PSN {} {} resp_res {} init_depth {} retry {} rnr_retry {}",
                r.local_comm_id,
                service(r.service_id),
                cma(r.private_data),
                r.local_qpn,
                r.starting_psn,
                ["RC", "UC", "RD", "XRC"][usize::from(r.transport_service_type & 3)],
                r.responder_resources,
                r.initiator_depth,
                r.retry_count,
                r.rnr_retry_count
            ),
            json!({"local_comm_id": r.local_comm_id, "service_id": r.service_id,
                   "local_qpn": r.local_qpn, "starting_psn": r.starting_psn,
                   "transport_service_type": r.transport_service_type,
                   "responder_resources": r.responder_resources,
                   "initiator_depth": r.initiator_depth, "retry_count": r.retry_count,
                   "rnr_retry_count": r.rnr_retry_count, "path_mtu": r.path_mtu,
                   "pkey": r.pkey, "local_cm_response_timeout": r.local_cm_response_timeout,
                   "max_cm_retries": r.max_cm_retries}),
        ),
        CmMessage::Rep(r) => (
            format!(
                " comm {:#x} → {:#x} QPN {:#x} PSN {} resp_res {} init_depth {} rnr_retry {}",
                r.local_comm_id,
                r.remote_comm_id,
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count
            ),
            json!({"local_comm_id": r.local_comm_id, "remote_comm_id": r.remote_comm_id,
                   "local_qpn": r.local_qpn, "starting_psn": r.starting_psn,
                   "responder_resources": r.responder_resources,
                   "initiator_depth": r.initiator_depth, "rnr_retry_count": r.rnr_retry_count}),
        ),
        CmMessage::Rej(r) => (
            format!(
                " comm {:#x} → {:#x} reason {}",
                r.local_comm_id, r.remote_comm_id, r.reason
            ),
            json!({"local_comm_id": r.local_comm_id, "remote_comm_id": r.remote_comm_id,
                   "reason": r.reason, "message_rejected": r.message_rejected}),
        ),
        CmMessage::Mra(r) => (
            format!(
                " comm {:#x} → {:#x} service_timeout {}",
                r.local_comm_id, r.remote_comm_id, r.service_timeout
            ),
            json!({"local_comm_id": r.local_comm_id, "remote_comm_id": r.remote_comm_id,
                   "message_mraed": r.message_mraed, "service_timeout": r.service_timeout}),
        ),
        CmMessage::Rtu(r) | CmMessage::Drep(r) => (
            format!(" comm {:#x} → {:#x}", r.local_comm_id, r.remote_comm_id),
            json!({"local_comm_id": r.local_comm_id, "remote_comm_id": r.remote_comm_id}),
        ),
        CmMessage::Dreq(r) => (
            format!(
                " comm {:#x} → {:#x} QPN {:#x}",
                r.local_comm_id, r.remote_comm_id, r.remote_qpn_eecn
            ),
            json!({"local_comm_id": r.local_comm_id, "remote_comm_id": r.remote_comm_id,
                   "remote_qpn": r.remote_qpn_eecn}),
        ),
        CmMessage::SidrReq(r) => (
            format!(
                " request {:#x} {}{}",
                r.request_id,
                service(r.service_id),
                cma(r.private_data)
            ),
            json!({"request_id": r.request_id, "service_id": r.service_id, "pkey": r.pkey}),
        ),
        CmMessage::SidrRep(r) => (
            format!(
                " request {:#x} status {} QPN {:#x} Q_Key {:#x}",
                r.request_id, r.status, r.qpn, r.qkey
            ),
            json!({"request_id": r.request_id, "status": r.status, "qpn": r.qpn,
                   "qkey": r.qkey, "service_id": r.service_id}),
        ),
    }
}
