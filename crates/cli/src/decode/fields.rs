//! How `decode -v` names, orders and shows a layer's fields: as tshark where the two overlap
//! (its field names, `tshark -G fields`, and its base: hex where it shows hex), in wire order.
//!
//! A field's path is its layer and keys from there, with enum variants left out
//! (`ddp.stag` for both DDP buffer models, `rdmap.body.sink_stag`).

/// How a number is shown (tshark's `BASE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Base {
    Dec,
    Hex,
    /// `0x1c (28)`.
    HexDec,
    /// `28 (0x1c)`.
    DecHex,
    /// An octet string: hex digits, no `0x` (tshark's `FT_BYTES`).
    Bytes,
}

use Base::*;

/// (path, tshark field name or "" for none, base), each layer's fields in wire order.
const FIELDS: &[(&str, &str, Base)] = &[
    // RFC 5044 §7.1 startup frame: key, flags, revision, PD_Length, private data.
    ("mpa.kind", "", Dec),
    ("mpa.m", "iwarp_mpa.marker_flag", Dec),
    ("mpa.c", "iwarp_mpa.crc_flag", Dec),
    ("mpa.r", "iwarp_mpa.rej_flag", Dec),
    ("mpa.res", "iwarp_mpa.res", Hex),
    ("mpa.rev", "iwarp_mpa.rev", Dec),
    ("mpa.private_data", "iwarp_mpa.privatedata", Bytes),
    // RFC 5044 §4: ULPDU_Length, (ULPDU), PAD, CRC.
    ("mpa.ulpdu_len", "iwarp_mpa.ulpdulength", Dec),
    ("mpa.markers", "", Dec),
    ("mpa.pad_len", "", Dec),
    ("mpa.crc_field", "iwarp_mpa.crc", Hex),
    ("mpa.crc_computed", "iwarp_mpa.crc_check", Hex),
    ("mpa.consumed", "", Dec),
    // RFC 5041 §4: control octet, RsvdULP, then STag and TO, or QN, MSN and MO.
    ("ddp.last", "iwarp_ddp.last_flag", Dec),
    ("ddp.reserved", "iwarp_ddp.rsvd", Hex),
    ("ddp.dv", "iwarp_ddp.dv", Dec),
    ("ddp.rsvd_ulp", "iwarp_ddp.rsvdulp", Bytes),
    ("ddp.stag", "iwarp_ddp.stag", Hex),
    ("ddp.to", "iwarp_ddp.tagged_offset", Hex),
    ("ddp.qn", "iwarp_ddp.qn", Dec),
    ("ddp.msn", "iwarp_ddp.msn", Dec),
    ("ddp.mo", "iwarp_ddp.mo", Dec),
    // RFC 5040 §4: the control field (in DDP's RsvdULP), then the opcode's header.
    ("rdmap.control.rv", "iwarp_rdma.version", Dec),
    ("rdmap.control.rsv", "iwarp_rdma.rsv", Hex),
    ("rdmap.control.opcode_code", "iwarp_rdma.opcode", Hex),
    ("rdmap.control.opcode", "", Dec),
    ("rdmap.body.invalidate_stag", "iwarp_rdma.inval_stag", Dec),
    ("rdmap.body.sink_stag", "iwarp_rdma.sinkstag", Hex),
    ("rdmap.body.sink_to", "iwarp_rdma.sinkto", Hex),
    ("rdmap.body.rdmardsz", "iwarp_rdma.rdmardsz", Dec),
    ("rdmap.body.src_stag", "iwarp_rdma.srcstag", Hex),
    ("rdmap.body.src_to", "iwarp_rdma.srcto", Hex),
    ("rdmap.body.opcode", "iwarp_rdma.atomic.opcode", Dec),
    (
        "rdmap.body.request_identifier",
        "iwarp_rdma.atomic.request_identifier",
        Dec,
    ),
    (
        "rdmap.body.remote_stag",
        "iwarp_rdma.atomic.remote_stag",
        Dec,
    ),
    (
        "rdmap.body.remote_tagged_offset",
        "iwarp_rdma.atomic.remote_tagged_offset",
        Dec,
    ),
    (
        "rdmap.body.original_request_identifier",
        "iwarp_rdma.atomic.original_request_identifier",
        Dec,
    ),
    (
        "rdmap.body.original_remote_data_value",
        "iwarp_rdma.atomic.original_remote_data_value",
        Dec,
    ),
    // RFC 791.
    ("ip.dscp", "ip.dsfield.dscp", Dec),
    ("ip.ecn", "ip.dsfield.ecn", Dec),
    ("ip.total_len", "ip.len", Dec),
    ("ip.ident", "ip.id", HexDec),
    ("ip.flags", "ip.flags", Hex),
    ("ip.frag_offset", "ip.frag_offset", Dec),
    ("ip.ttl", "ip.ttl", Dec),
    ("ip.protocol", "ip.proto", Dec),
    ("ip.src_addr", "ip.src", Dec),
    ("ip.dst_addr", "ip.dst", Dec),
    // RFC 768.
    ("udp.src_port", "udp.srcport", Dec),
    ("udp.dst_port", "udp.dstport", Dec),
    ("udp.length", "udp.length", Dec),
    ("udp.checksum", "udp.checksum", Hex),
    // IBA 9.2 BTH, then the extended headers in IBA order (9.3).
    ("ib.bth.opcode", "infiniband.bth.opcode", Dec),
    ("ib.bth.se", "infiniband.bth.se", Dec),
    ("ib.bth.migreq", "infiniband.bth.m", Dec),
    ("ib.bth.pad_cnt", "infiniband.bth.padcnt", Dec),
    ("ib.bth.tver", "infiniband.bth.tver", Dec),
    ("ib.bth.pkey", "infiniband.bth.p_key", Dec),
    ("ib.bth.fecn", "", Dec),
    ("ib.bth.becn", "", Dec),
    ("ib.bth.resv6", "", Dec),
    ("ib.bth.dest_qp", "infiniband.bth.destqp", Hex),
    ("ib.bth.ack_req", "infiniband.bth.a", Dec),
    ("ib.bth.resv7", "infiniband.bth.reserved7", Dec),
    ("ib.bth.psn", "infiniband.bth.psn", Dec),
    ("ib.deth.q_key", "infiniband.deth.q_key", Hex),
    ("ib.deth.reserved", "", Dec),
    ("ib.deth.src_qp", "infiniband.deth.srcqp", Hex),
    ("ib.reth.va", "infiniband.reth.va", Hex),
    ("ib.reth.r_key", "infiniband.reth.r_key", Hex),
    ("ib.reth.dma_len", "infiniband.reth.dmalen", DecHex),
    // tshark shows an AtomicETH's VA and R_Key in the RETH fields.
    ("ib.atomic_eth.va", "infiniband.reth.va", Hex),
    ("ib.atomic_eth.r_key", "infiniband.reth.r_key", Hex),
    (
        "ib.atomic_eth.swap_add_data",
        "infiniband.atomiceth.swapdt",
        Dec,
    ),
    (
        "ib.atomic_eth.compare_data",
        "infiniband.atomiceth.cmpdt",
        Dec,
    ),
    ("ib.aeth.reserved", "", Dec),
    ("ib.aeth.syndrome_code", "infiniband.aeth.syndrome", Dec),
    ("ib.aeth.syndrome", "", Dec),
    ("ib.aeth.msn", "infiniband.aeth.msn", Dec),
    (
        "ib.atomic_ack_eth.orig_remote_data",
        "infiniband.atomicacketh.origremdt",
        Dec,
    ),
    ("ib.immdt.immediate_data", "infiniband.immdt", Bytes),
    ("ib.ieth.r_key", "infiniband.ieth", Bytes),
    ("icrc.field", "", Hex),
    ("icrc.computed", "", Hex),
    // IBA 13.4.3 MAD common header.
    ("mad.base_version", "infiniband.mad.baseversion", Hex),
    ("mad.mgmt_class", "infiniband.mad.mgmtclass", Hex),
    ("mad.class_version", "infiniband.mad.classversion", Hex),
    ("mad.method", "infiniband.mad.method", Hex),
    ("mad.status", "infiniband.mad.status", Hex),
    ("mad.transaction_id", "infiniband.mad.transactionid", Hex),
    ("mad.attribute_id", "infiniband.mad.attributeid", Hex),
    (
        "mad.attribute_modifier",
        "infiniband.mad.attributemodifier",
        Hex,
    ),
    // RFC 8166 §4.2: xid, version, credits, procedure, then the chunk lists.
    ("rpcrdma.rdma_xid", "rpcordma.xid", Hex),
    ("rpcrdma.rdma_vers", "rpcordma.version", Dec),
    ("rpcrdma.rdma_credit", "rpcordma.flow_control", Dec),
    ("rpcrdma.body.read_list.position", "rpcordma.position", Dec),
    ("rpcrdma.body.read_list.handle", "rpcordma.rdma_handle", Hex),
    ("rpcrdma.body.read_list.length", "rpcordma.rdma_length", Dec),
    ("rpcrdma.body.read_list.offset", "rpcordma.rdma_offset", Hex),
    (
        "rpcrdma.body.write_list.handle",
        "rpcordma.rdma_handle",
        Hex,
    ),
    (
        "rpcrdma.body.write_list.length",
        "rpcordma.rdma_length",
        Dec,
    ),
    (
        "rpcrdma.body.write_list.offset",
        "rpcordma.rdma_offset",
        Hex,
    ),
    (
        "rpcrdma.body.reply_chunk.handle",
        "rpcordma.rdma_handle",
        Hex,
    ),
    (
        "rpcrdma.body.reply_chunk.length",
        "rpcordma.rdma_length",
        Dec,
    ),
    (
        "rpcrdma.body.reply_chunk.offset",
        "rpcordma.rdma_offset",
        Hex,
    ),
    // RFC 5531 §9: xid, message type, then the call's program, version, procedure and
    // credentials.
    ("rpc.xid", "rpc.xid", HexDec),
    ("rpc.body.prog", "rpc.program", Dec),
    ("rpc.body.vers", "rpc.programversion", Dec),
    ("rpc.body.proc", "rpc.procedure", Dec),
    ("rpc.body.cred.stamp", "rpc.auth.stamp", Hex),
    ("rpc.body.cred.machinename", "rpc.auth.machinename", Dec),
    ("rpc.body.cred.uid", "rpc.auth.uid", Dec),
    ("rpc.body.cred.gid", "rpc.auth.gid", Dec),
];

/// Fields tshark does not have, shown in hex as the summaries show them: handles, keys,
/// offsets, identifiers.
const HEX_KEYS: &[&str] = &[
    "stag",
    "to",
    "sink_stag",
    "sink_to",
    "src_stag",
    "src_to",
    "local_comm_id",
    "remote_comm_id",
    "service_id",
    "request_id",
    "local_qpn",
    "remote_qpn",
    "qpn",
    "qkey",
];

/// The header line of a layer: tshark's protocol name where it has one.
pub(crate) fn layer_name(layer: &str) -> &str {
    match layer {
        "mpa" => "iwarp_mpa",
        "ddp" => "iwarp_ddp",
        "rdmap" => "iwarp_rdma",
        "ib" => "infiniband",
        "rpcrdma" => "rpcordma",
        other => other,
    }
}

/// Where `path` sits in wire order, for sorting a layer's keys (unknown fields last).
pub(crate) fn rank(path: &str) -> usize {
    FIELDS
        .iter()
        .position(|(p, _, _)| *p == path)
        .unwrap_or(usize::MAX)
}

/// The name a field is shown under, and its base.
pub(crate) fn field(path: &str, key: &str) -> (String, Base) {
    match FIELDS.iter().find(|(p, _, _)| *p == path) {
        Some((_, n, b)) if !n.is_empty() => (n.to_string(), *b),
        Some((_, _, b)) => (key.to_string(), *b),
        None if HEX_KEYS.contains(&key) => (key.to_string(), Hex),
        None => (key.to_string(), Dec),
    }
}

/// `n` in base `b`.
pub(crate) fn number(n: u64, b: Base) -> String {
    match b {
        Dec => n.to_string(),
        Hex => format!("{n:#x}"),
        HexDec => format!("{n:#x} ({n})"),
        DecHex => format!("{n} ({n:#x})"),
        Bytes => format!("{n:02x}"),
    }
}

/// A Rust variant name as words: `RdmaReadRequest` -> `rdma read request`.
pub(crate) fn words(variant: &str) -> String {
    let mut s = String::new();
    for (i, c) in variant.char_indices() {
        if c.is_ascii_uppercase() && i > 0 {
            s.push(' ');
        }
        s.push(c.to_ascii_lowercase());
    }
    s
}

/// Is `s` a Rust variant name (`Send`, `RdmaReadRequest`, `None`)?
pub(crate) fn is_variant(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
        && s.chars().any(|c| c.is_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_bases_and_words() {
        assert_eq!(field("ddp.stag", "stag"), ("iwarp_ddp.stag".into(), Hex));
        assert_eq!(field("mpa.kind", "kind"), ("kind".into(), Dec));
        assert_eq!(
            field("rdmap.body.ddp.header.stag", "stag"),
            ("stag".into(), Hex)
        );
        assert_eq!(field("udp.whatever", "whatever"), ("whatever".into(), Dec));
        assert!(rank("ddp.stag") < rank("ddp.to") && rank("ddp.to") < rank("zzz"));
        assert_eq!(number(28, HexDec), "0x1c (28)");
        assert_eq!(number(28, DecHex), "28 (0x1c)");
        assert_eq!(number(10, Bytes), "0a");
        assert_eq!(words("RdmaReadRequest"), "rdma read request");
        assert!(is_variant("None") && is_variant("Ipv4") && !is_variant("ACK") && !is_variant("x"));
        // One entry per path.
        for (i, (p, _, _)) in FIELDS.iter().enumerate() {
            assert_eq!(rank(p), i, "{p} twice");
        }
    }
}
