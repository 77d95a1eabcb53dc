//! One-line summaries, in the spirit of tshark's Info column.

use softrdma_wire::ib::{PacketRepr, Syndrome};
use softrdma_wire::{ddp, mpa, rdmap};

use super::record::SendSegment;

pub(crate) fn mpa_frame(f: &mpa::FrameRepr<'_>) -> String {
    let kind = match f.kind {
        mpa::FrameKind::Request => "MPA Request",
        mpa::FrameKind::Reply => "MPA Reply",
    };
    let mut s = format!(
        "{kind} rev {} M={} C={} R={} PD_Length {}",
        f.rev,
        u8::from(f.m),
        u8::from(f.c),
        u8::from(f.r),
        f.private_data.len()
    );
    if let Ok(Some(p)) = f.rev2_params() {
        s.push_str(&format!(" IRD {} ORD {}", p.ird, p.ord));
        if p.p2p {
            s.push_str(" P2P");
        }
    }
    s
}

pub(crate) fn segment(seg: &rdmap::Segment<'_>) -> String {
    let op = opcode_name(seg.control.opcode);
    let ddp = match seg.ddp {
        ddp::Repr::Tagged { last, stag, to, .. } => {
            format!("STag {stag:#010x} TO {to:#x}{}", last_flag(last))
        }
        ddp::Repr::Untagged {
            last, qn, msn, mo, ..
        } => format!("QN {qn} MSN {msn} MO {mo}{}", last_flag(last)),
    };
    let body = match &seg.body {
        rdmap::Body::RdmaWrite { payload }
        | rdmap::Body::RdmaReadResponse { payload }
        | rdmap::Body::Send { payload }
        | rdmap::Body::SendWithSe { payload } => format!("len {}", payload.len()),
        rdmap::Body::SendWithInvalidate {
            invalidate_stag,
            payload,
        }
        | rdmap::Body::SendWithSeAndInvalidate {
            invalidate_stag,
            payload,
        } => format!("invalidate {invalidate_stag:#010x} len {}", payload.len()),
        rdmap::Body::RdmaReadRequest(rr) => format!(
            "sink {:#010x}/{:#x} size {} src {:#010x}/{:#x}",
            rr.sink_stag, rr.sink_to, rr.rdmardsz, rr.src_stag, rr.src_to
        ),
        rdmap::Body::Terminate(t) => format!("{} ({} layout)", t.code, t.layout),
        rdmap::Body::ImmediateData(i) | rdmap::Body::ImmediateDataWithSe(i) => {
            let hex: String = i
                .immediate_data
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("immediate 0x{hex}")
        }
        rdmap::Body::AtomicRequest(a) => format!(
            "{} id {} STag {:#010x} TO {:#x} add/swap {:#x} compare {:#x}",
            a.opcode,
            a.request_identifier,
            a.remote_stag,
            a.remote_tagged_offset,
            a.add_or_swap_data,
            a.compare_data
        ),
        rdmap::Body::AtomicResponse(r) => format!(
            "id {} original {:#x}",
            r.original_request_identifier, r.original_remote_data_value
        ),
    };
    format!("{op} {ddp} {body}")
}

fn last_flag(last: bool) -> &'static str {
    if last { " L" } else { "" }
}

pub(crate) fn opcode_name(op: rdmap::Opcode) -> &'static str {
    match op {
        rdmap::Opcode::RdmaWrite => "RDMA Write",
        rdmap::Opcode::RdmaReadRequest => "RDMA Read Request",
        rdmap::Opcode::RdmaReadResponse => "RDMA Read Response",
        rdmap::Opcode::Send => "Send",
        rdmap::Opcode::SendWithInvalidate => "Send with Invalidate",
        rdmap::Opcode::SendWithSe => "Send with SE",
        rdmap::Opcode::SendWithSeAndInvalidate => "Send with SE and Invalidate",
        rdmap::Opcode::Terminate => "Terminate",
        rdmap::Opcode::ImmediateData => "Immediate Data",
        rdmap::Opcode::ImmediateDataWithSe => "Immediate Data with SE",
        rdmap::Opcode::AtomicRequest => "Atomic Request",
        rdmap::Opcode::AtomicResponse => "Atomic Response",
    }
}

/// A segment of a Send-family message (untagged, queue 0: RFC 5040 §5), whole.
pub(crate) fn send_segment(seg: &rdmap::Segment<'_>) -> Option<SendSegment> {
    let ddp::Repr::Untagged { last, mo, .. } = seg.ddp else {
        return None;
    };
    match seg.body {
        rdmap::Body::Send { payload }
        | rdmap::Body::SendWithSe { payload }
        | rdmap::Body::SendWithInvalidate { payload, .. }
        | rdmap::Body::SendWithSeAndInvalidate { payload, .. } => Some(SendSegment {
            first: mo == 0,
            last,
            payload: payload.to_vec(),
        }),
        _ => None,
    }
}

/// The payload of the first segment of a Send (MO 0), where an
/// RPC-over-RDMA header would start.
pub(crate) fn rpc_candidate<'a>(seg: &rdmap::Segment<'a>) -> Option<&'a [u8]> {
    let ddp::Repr::Untagged { mo: 0, .. } = seg.ddp else {
        return None;
    };
    match seg.body {
        rdmap::Body::Send { payload }
        | rdmap::Body::SendWithSe { payload }
        | rdmap::Body::SendWithInvalidate { payload, .. }
        | rdmap::Body::SendWithSeAndInvalidate { payload, .. } => Some(payload),
        _ => None,
    }
}

pub(crate) fn ib_packet(p: &PacketRepr<'_>) -> String {
    let op = p.bth.opcode;
    let mut s = format!(
        "{} {} QP {:#08x} PSN {}",
        op.service().name(),
        op.name(),
        p.bth.dest_qp,
        p.bth.psn
    );
    if p.bth.ack_req {
        s.push_str(" A");
    }
    if p.bth.se {
        s.push_str(" SE");
    }
    if let Some(d) = p.deth {
        s.push_str(&format!(" Q_Key {:#x} SrcQP {:#x}", d.q_key, d.src_qp));
    }
    if let Some(r) = p.reth {
        s.push_str(&format!(
            " VA {:#x} R_Key {:#x} DMALen {}",
            r.va, r.r_key, r.dma_len
        ));
    }
    if let Some(a) = p.atomic_eth {
        s.push_str(&format!(
            " VA {:#x} R_Key {:#x} swap/add {:#x} cmp {:#x}",
            a.va, a.r_key, a.swap_add_data, a.compare_data
        ));
    }
    if let Some(a) = p.aeth {
        let syn = match a.syndrome {
            Syndrome::Ack { credit } => format!("ACK credit {credit}"),
            Syndrome::RnrNak { timer } => format!("RNR NAK timer {timer}"),
            Syndrome::Nak(code) => format!("NAK {code}"),
        };
        s.push_str(&format!(" [{syn} MSN {}]", a.msn));
    }
    if let Some(a) = p.atomic_ack_eth {
        s.push_str(&format!(" orig {:#x}", a.orig_remote_data));
    }
    if let Some(i) = p.immdt {
        s.push_str(&format!(" imm {:#010x}", i.immediate_data));
    }
    if let Some(i) = p.ieth {
        s.push_str(&format!(" invalidate R_Key {:#x}", i.r_key));
    }
    s.push_str(&format!(" len {}", p.payload.len()));
    s
}
