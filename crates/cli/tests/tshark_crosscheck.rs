//! Done-when #6 of issue 2: `softrdma decode --json` against tshark's decoding of
//! the same captures, on the fields both decode.
//!
//! Known tshark 4.0 behaviour on this real Linux traffic, checked rather than skipped:
//! * MPA rev 2 Request/Reply frames get "Res/Rev field is NOT set" warnings
//!   (tshark knows only RFC 5044); the fields still decode and must agree.
//! * tshark's RPC-over-RDMA heuristic claims perftest's Send payloads and then
//!   reports them malformed or as illegal fragments; our decoder requires a
//!   matching ONC RPC XID and does not. `rpcordma_heuristic_false_positives` pins that.
//! * tshark reads siw's Terminate control word per RFC 5040; siw writes it with
//!   little-endian bitfields, so the Terminate fields themselves are not compared
//!   (the DDP/RDMAP fields of that segment are).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use softrdma_cli::decode::{Options, Record, decode_file};

use common::{TsharkFields, num, tshark_fields};

/// Our decode, through the JSON the CLI prints.
fn ours(path: &Path) -> Vec<Value> {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let out = Command::new(bin)
        .arg("decode")
        .arg("--json")
        .arg(path)
        .output()
        .expect("run softrdma");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

fn u(v: &Value, ptr: &str) -> Option<u64> {
    let x = v.pointer(ptr)?;
    x.as_u64().or_else(|| x.as_bool().map(u64::from))
}

type Extract = fn(&Value) -> Vec<u64>;

/// A tshark field, how to read ours, and whether to compare as a set
/// (tshark repeats some byte fields) or as a multiset.
struct Field {
    tshark: &'static str,
    ours: Extract,
    set: bool,
}

const fn f(tshark: &'static str, ours: Extract) -> Field {
    Field {
        tshark,
        ours,
        set: false,
    }
}

fn opt(v: Option<u64>) -> Vec<u64> {
    v.into_iter().collect()
}

fn iwarp_fields() -> Vec<Field> {
    vec![
        f("iwarp_rdma.opcode", |r| {
            opt(u(r, "/layers/rdmap/control/opcode_code"))
        }),
        f("iwarp_ddp.last_flag", |r| {
            opt(u(r, "/layers/ddp/Tagged/last").or(u(r, "/layers/ddp/Untagged/last")))
        }),
        f("iwarp_ddp.stag", |r| opt(u(r, "/layers/ddp/Tagged/stag"))),
        f("iwarp_ddp.tagged_offset", |r| {
            opt(u(r, "/layers/ddp/Tagged/to"))
        }),
        f("iwarp_ddp.qn", |r| opt(u(r, "/layers/ddp/Untagged/qn"))),
        f("iwarp_ddp.msn", |r| opt(u(r, "/layers/ddp/Untagged/msn"))),
        f("iwarp_ddp.mo", |r| opt(u(r, "/layers/ddp/Untagged/mo"))),
        f("iwarp_rdma.sinkstag", |r| {
            opt(u(r, "/layers/rdmap/body/RdmaReadRequest/sink_stag"))
        }),
        f("iwarp_rdma.sinkto", |r| {
            opt(u(r, "/layers/rdmap/body/RdmaReadRequest/sink_to"))
        }),
        f("iwarp_rdma.rdmardsz", |r| {
            opt(u(r, "/layers/rdmap/body/RdmaReadRequest/rdmardsz"))
        }),
        f("iwarp_rdma.srcstag", |r| {
            opt(u(r, "/layers/rdmap/body/RdmaReadRequest/src_stag"))
        }),
        f("iwarp_rdma.srcto", |r| {
            opt(u(r, "/layers/rdmap/body/RdmaReadRequest/src_to"))
        }),
        f("iwarp_rdma.inval_stag", |r| {
            opt(
                u(r, "/layers/rdmap/body/SendWithInvalidate/invalidate_stag").or(u(
                    r,
                    "/layers/rdmap/body/SendWithSeAndInvalidate/invalidate_stag",
                )),
            )
        }),
        f("iwarp_mpa.ulpdulength", |r| {
            opt(u(r, "/layers/mpa/ulpdu_len"))
        }),
        // MPA Request/Reply frames.
        f("iwarp_mpa.rev", |r| opt(u(r, "/layers/mpa/rev"))),
        f("iwarp_mpa.marker_flag", |r| opt(u(r, "/layers/mpa/m"))),
        f("iwarp_mpa.crc_flag", |r| opt(u(r, "/layers/mpa/c"))),
        f("iwarp_mpa.rej_flag", |r| opt(u(r, "/layers/mpa/r"))),
        f("iwarp_mpa.pdlength", |r| {
            opt(r
                .pointer("/layers/mpa/private_data")
                .and_then(Value::as_str)
                .map(|h| h.len() as u64 / 2))
        }),
    ]
}

fn ib_fields() -> Vec<Field> {
    let mut v = vec![
        f("infiniband.bth.opcode", |r| {
            opt(u(r, "/layers/ib/bth/opcode"))
        }),
        f("infiniband.bth.se", |r| opt(u(r, "/layers/ib/bth/se"))),
        f("infiniband.bth.m", |r| opt(u(r, "/layers/ib/bth/migreq"))),
        f("infiniband.bth.padcnt", |r| {
            opt(u(r, "/layers/ib/bth/pad_cnt"))
        }),
        f("infiniband.bth.tver", |r| opt(u(r, "/layers/ib/bth/tver"))),
        f("infiniband.bth.p_key", |r| opt(u(r, "/layers/ib/bth/pkey"))),
        f("infiniband.bth.destqp", |r| {
            opt(u(r, "/layers/ib/bth/dest_qp"))
        }),
        f("infiniband.bth.a", |r| opt(u(r, "/layers/ib/bth/ack_req"))),
        f("infiniband.bth.psn", |r| opt(u(r, "/layers/ib/bth/psn"))),
        // tshark shows an AtomicETH's VA and R_Key in the RETH fields.
        f("infiniband.reth.va", |r| {
            opt(u(r, "/layers/ib/reth/va").or(u(r, "/layers/ib/atomic_eth/va")))
        }),
        f("infiniband.reth.r_key", |r| {
            opt(u(r, "/layers/ib/reth/r_key").or(u(r, "/layers/ib/atomic_eth/r_key")))
        }),
        f("infiniband.reth.dmalen", |r| {
            opt(u(r, "/layers/ib/reth/dma_len"))
        }),
        f("infiniband.atomiceth.swapdt", |r| {
            opt(u(r, "/layers/ib/atomic_eth/swap_add_data"))
        }),
        f("infiniband.atomiceth.cmpdt", |r| {
            opt(u(r, "/layers/ib/atomic_eth/compare_data"))
        }),
        f("infiniband.aeth.syndrome", |r| {
            opt(u(r, "/layers/ib/aeth/syndrome_code"))
        }),
        f("infiniband.aeth.msn", |r| opt(u(r, "/layers/ib/aeth/msn"))),
        f("infiniband.atomicacketh.origremdt", |r| {
            opt(u(r, "/layers/ib/atomic_ack_eth/orig_remote_data"))
        }),
        f("infiniband.deth.q_key", |r| {
            opt(u(r, "/layers/ib/deth/q_key"))
        }),
        f("infiniband.deth.srcqp", |r| {
            opt(u(r, "/layers/ib/deth/src_qp"))
        }),
        // tshark reads the ICRC octets big-endian; the value is stored LSB first.
        f("infiniband.invariant.crc", |r| {
            opt(u(r, "/layers/icrc/field").map(|x| u64::from((x as u32).swap_bytes())))
        }),
        f("infiniband.mad.mgmtclass", |r| {
            opt(u(r, "/layers/mad/mgmt_class"))
        }),
        f("infiniband.mad.method", |r| opt(u(r, "/layers/mad/method"))),
        f("infiniband.mad.attributeid", |r| {
            opt(u(r, "/layers/mad/attribute_id"))
        }),
        f("infiniband.mad.transactionid", |r| {
            opt(u(r, "/layers/mad/transaction_id"))
        }),
    ];
    // Byte fields tshark prints (twice) as hex without 0x.
    v.push(Field {
        tshark: "infiniband.immdt",
        ours: |r| opt(u(r, "/layers/ib/immdt/immediate_data")),
        set: true,
    });
    v.push(Field {
        tshark: "infiniband.ieth",
        ours: |r| opt(u(r, "/layers/ib/ieth/r_key")),
        set: true,
    });
    v
}

fn segments(r: &Value) -> Vec<&Value> {
    let mut v = Vec::new();
    let Some(body) = r.pointer("/layers/rpcrdma/body").and_then(Value::as_object) else {
        return v;
    };
    for c in body.values() {
        if let Some(rl) = c.get("read_list").and_then(Value::as_array) {
            v.extend(rl.iter());
        }
        if let Some(wl) = c.get("write_list").and_then(Value::as_array) {
            for chunk in wl {
                v.extend(chunk.as_array().into_iter().flatten());
            }
        }
        if let Some(rc) = c.get("reply_chunk").and_then(Value::as_array) {
            v.extend(rc.iter());
        }
    }
    v
}

fn rpc_fields() -> Vec<Field> {
    vec![
        f("rpcordma.xid", |r| opt(u(r, "/layers/rpcrdma/rdma_xid"))),
        f("rpcordma.version", |r| {
            opt(u(r, "/layers/rpcrdma/rdma_vers"))
        }),
        f("rpcordma.flow_control", |r| {
            opt(u(r, "/layers/rpcrdma/rdma_credit"))
        }),
        f("rpcordma.msg_type", |r| {
            let body = r.pointer("/layers/rpcrdma/body").and_then(Value::as_object);
            opt(body
                .and_then(|b| b.keys().next())
                .map(|k| match k.as_str() {
                    "Msg" => 0,
                    "NoMsg" => 1,
                    "MsgP" => 2,
                    "Done" => 3,
                    _ => 4,
                }))
        }),
        f("rpcordma.rdma_handle", |r| {
            segments(r).iter().filter_map(|s| u(s, "/handle")).collect()
        }),
        f("rpcordma.rdma_length", |r| {
            segments(r).iter().filter_map(|s| u(s, "/length")).collect()
        }),
        f("rpcordma.rdma_offset", |r| {
            segments(r).iter().filter_map(|s| u(s, "/offset")).collect()
        }),
        f("rpcordma.position", |r| {
            segments(r)
                .iter()
                .filter_map(|s| u(s, "/position"))
                .collect()
        }),
    ]
}

fn tshark_values(field: &Field, raw: &[String]) -> Vec<u64> {
    raw.iter()
        .map(|s| {
            if field.set {
                u64::from_str_radix(s, 16).expect("hex")
            } else {
                num(s)
            }
        })
        .collect()
}

/// Compare per frame; returns how many field values agreed.
/// Frames that tshark itself flags malformed stop being dissected at the
/// exception, so their later fields are missing: compare only what tshark
/// reported there, and return those frames so the caller can account for them.
fn compare(
    name: &str,
    ts: &TsharkFields,
    ours: &[Value],
    fields: &[Field],
    skip: &BTreeSet<u64>,
) -> (usize, BTreeSet<u64>) {
    let malformed: BTreeSet<u64> = ts
        .iter()
        .filter(|(_, m)| m.get("_ws.malformed").is_some_and(|v| !v.is_empty()))
        .map(|(f, _)| *f)
        .collect();
    let mut by_frame: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for r in ours {
        by_frame
            .entry(r["frame"].as_u64().unwrap())
            .or_default()
            .push(r);
    }
    let frames: BTreeSet<u64> = ts.keys().chain(by_frame.keys()).copied().collect();
    let mut agreed = 0;
    for fr in frames.difference(skip) {
        for field in fields {
            let theirs_raw = ts
                .get(fr)
                .and_then(|m| m.get(field.tshark))
                .cloned()
                .unwrap_or_default();
            if malformed.contains(fr) && theirs_raw.is_empty() {
                continue;
            }
            let mut theirs = tshark_values(field, &theirs_raw);
            let mut mine: Vec<u64> = by_frame
                .get(fr)
                .into_iter()
                .flatten()
                .flat_map(|r| (field.ours)(r))
                .collect();
            theirs.sort_unstable();
            mine.sort_unstable();
            if field.set {
                theirs.dedup();
                mine.dedup();
            }
            assert_eq!(mine, theirs, "{name}: frame {fr}: field {}", field.tshark);
            agreed += mine.len();
        }
    }
    (agreed, malformed)
}

fn names(fields: &[Field]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = fields.iter().map(|f| f.tshark).collect();
    v.push("_ws.malformed");
    v
}

/// Every capture, every field both decoders decode.
#[test]
fn decode_json_agrees_with_tshark() {
    let mut total = 0;
    for path in common::captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let ours = ours(&path);
        let is_nfs = name.starts_with("nfs");
        // perftest/rping payloads trip tshark's RPC-over-RDMA heuristic (see the
        // module docs); decode those captures with that dissector off.
        let extra: &[&str] = if is_nfs {
            &[]
        } else {
            &["--disable-protocol", "rpcordma"]
        };
        let iwarp = iwarp_fields();
        let mut fields = names(&iwarp);
        fields.extend(["tcp.analysis.retransmission", "tcp.analysis.out_of_order"]);
        let filter = "iwarp_mpa || tcp.analysis.retransmission || tcp.analysis.out_of_order";
        let ts = tshark_fields(&path, filter, &fields, extra);
        // tshark does not dissect the payload of segments it calls
        // retransmissions or out-of-order (lossy captures: the original was
        // dropped before the capture point); our reassembly decodes them.
        let redelivered: BTreeSet<u64> = ts
            .iter()
            .filter(|(_, m)| {
                let flagged = |k: &str| m.get(k).is_some_and(|v| !v.is_empty());
                (flagged("tcp.analysis.retransmission") || flagged("tcp.analysis.out_of_order"))
                    && m.get("iwarp_mpa.ulpdulength").is_none_or(|v| v.is_empty())
            })
            .map(|(f, _)| *f)
            .collect();
        let mine: Vec<Value> = ours
            .iter()
            .filter(|r| r["proto"] == "iWARP" || r["proto"] == "MPA")
            .cloned()
            .collect();
        let (n, bad) = compare(&name, &ts, &mine, &iwarp, &redelivered);
        total += n;
        let mut malformed = bad;
        if name.contains("lossy") && name.starts_with("siw") {
            let extra_fpdus = mine
                .iter()
                .filter(|r| redelivered.contains(&r["frame"].as_u64().unwrap()))
                .count();
            assert!(
                extra_fpdus > 0,
                "{name}: expected FPDUs in retransmitted segments"
            );
        }

        let ib = ib_fields();
        let ts = tshark_fields(&path, "infiniband", &names(&ib), extra);
        let mine: Vec<Value> = ours
            .iter()
            .filter(|r| r["proto"] == "RoCEv2")
            .cloned()
            .collect();
        let (n, bad) = compare(&name, &ts, &mine, &ib, &BTreeSet::new());
        total += n;
        malformed.extend(bad);

        if is_nfs {
            let rpc = rpc_fields();
            let ts = tshark_fields(&path, "rpcordma", &names(&rpc), &[]);
            // tshark also reports rpcordma fields on frames of reassembled
            // fragments (RDMA Writes and Read Responses carrying chunk data);
            // compare the frames that carry a transport header: ours.
            let mine: Vec<Value> = ours
                .iter()
                .filter(|r| r["layers"].get("rpcrdma").is_some())
                .cloned()
                .collect();
            let ours_frames: BTreeSet<u64> =
                mine.iter().map(|r| r["frame"].as_u64().unwrap()).collect();
            let skip: BTreeSet<u64> = ts
                .keys()
                .copied()
                .filter(|f| !ours_frames.contains(f))
                .collect();
            for fr in &skip {
                // Those extra frames carry no xid of their own.
                assert!(
                    ts[fr]["rpcordma.xid"].is_empty(),
                    "{name}: frame {fr}: tshark sees an RPC-over-RDMA header we miss"
                );
            }
            let (n, bad) = compare(&name, &ts, &mine, &rpc, &skip);
            total += n;
            malformed.extend(bad);
        }
        // The only frames tshark 4.0 flags malformed here are, per INDEX.md, the
        // two NFS READ replies of each NFS capture whose data travelled in a
        // write chunk (tshark does not splice it back). We decode those fine.
        let expected = if is_nfs { 2 } else { 0 };
        assert_eq!(
            malformed.len(),
            expected,
            "{name}: tshark-malformed frames {malformed:?}"
        );
        for fr in &malformed {
            let r = ours
                .iter()
                .find(|r| r["frame"] == *fr)
                .expect("we decode the frame tshark calls malformed");
            assert!(
                r["summary"].as_str().unwrap().contains(" Reply (Call In "),
                "{name}: frame {fr}"
            );
        }
    }
    eprintln!("tshark cross-check: {total} field values agree");
    assert!(total > 10_000, "only {total} field values compared");
}

/// tshark's RPC-over-RDMA heuristic fires on perftest Send payloads (INDEX.md,
/// "RPC-over-RDMA heuristic misfires"); every such frame is one tshark itself
/// flags as malformed or as an illegal fragment, and our decoder (which needs a
/// matching ONC RPC XID) reports no RPC-over-RDMA there.
#[test]
fn rpcordma_heuristic_false_positives() {
    let mut seen = 0;
    for path in common::captures() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("nfs") {
            continue;
        }
        let ts = tshark_fields(
            &path,
            "frame.protocols contains \"rpcordma\"",
            &["_ws.malformed", "rpcordma.xid"],
            &[],
        );
        for (fr, m) in &ts {
            assert!(
                !m["_ws.malformed"].is_empty(),
                "{name}: frame {fr}: tshark decodes RPC-over-RDMA cleanly where we see none"
            );
        }
        let ours = decode_file(&path, &Options::default()).unwrap();
        let with_rpc: BTreeSet<u64> = ours
            .records
            .iter()
            .filter(|r: &&Record| r.layers.contains_key("rpcrdma"))
            .map(|r| r.frame)
            .collect();
        assert!(
            with_rpc.is_empty(),
            "{name}: we decoded RPC-over-RDMA in a non-NFS capture: {with_rpc:?}"
        );
        seen += ts.len();
    }
    // The INDEX counts such frames in every siw perftest capture and more.
    assert!(
        seen > 50,
        "expected tshark's heuristic to misfire on perftest traffic; saw {seen} frames"
    );
}

/// One message of `softrdma decode -v`: its frame and its `(layer, field, value)` lines.
type Verbose = (u64, Vec<(String, String, String)>);

/// `softrdma decode -v`, message by message.
fn verbose(path: &Path) -> Vec<Verbose> {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["decode", "-v"])
        .arg(path)
        .output()
        .expect("run softrdma");
    assert!(out.status.success());
    let mut v: Vec<Verbose> = Vec::new();
    let mut layer = String::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim_start();
        if indent < 4 || (indent == 6 && text.starts_with(|c: char| c.is_ascii_digit())) {
            // A summary line: "{frame:6} {time} ...".
            if let Some(f) = text.split_whitespace().next().and_then(|f| f.parse().ok()) {
                v.push((f, Vec::new()));
            }
        } else if indent == 4 {
            layer = text
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        } else if let (Some((name, value)), Some(m)) = (text.split_once(": "), v.last_mut()) {
            m.1.push((layer.clone(), name.to_string(), value.to_string()));
        }
    }
    v
}

/// Every field `-v` names after tshark is one of tshark's (`tshark -G fields`), and its value
/// is written in tshark's base for it: STag and TO in hex, PSN and MSN in decimal, the RPC
/// xid as `0x… (…)`.
#[test]
fn verbose_field_names_and_bases_are_tsharks() {
    let out = Command::new("tshark")
        .args(["-G", "fields"])
        .output()
        .expect("tshark is needed for this test");
    let mut types: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let c: Vec<&str> = line.split('\t').collect();
        if c.len() > 5 && c[0] == "F" {
            types.insert(c[2].into(), (c[3].into(), c[5].into()));
        }
    }
    let hex = |s: &str| {
        s.strip_prefix("0x")
            .is_some_and(|h| u64::from_str_radix(h, 16).is_ok())
    };
    let dec = |s: &str| s.parse::<u64>().is_ok();
    let (mut checked, mut names) = (0, BTreeSet::new());
    for path in common::captures() {
        for (frame, fields) in verbose(&path) {
            for (_, name, value) in fields {
                if !name.contains('.') {
                    continue; // a field tshark does not have
                }
                let (ty, base) = types
                    .get(&name)
                    .unwrap_or_else(|| panic!("{path:?}: frame {frame}: {name} is not tshark's"));
                let (a, b) = value.split_once(" (").unwrap_or((&value, ""));
                let b = b.strip_suffix(')').unwrap_or(b);
                let ok = match (ty.as_str(), base.as_str()) {
                    ("FT_BOOLEAN", _) => value == "true" || value == "false",
                    ("FT_BYTES", _) => value
                        .trim_end_matches('…')
                        .bytes()
                        .all(|c| c.is_ascii_hexdigit()),
                    ("FT_IPv4", _) => value.parse::<std::net::Ipv4Addr>().is_ok(),
                    ("FT_STRING", _) => true,
                    (_, "BASE_HEX") => hex(&value),
                    (_, "BASE_DEC" | "BASE_PT_UDP") => dec(&value),
                    (_, "BASE_HEX_DEC") => hex(a) && dec(b),
                    (_, "BASE_DEC_HEX") => dec(a) && hex(b),
                    other => panic!("{name}: {other:?} not expected"),
                };
                assert!(
                    ok,
                    "{path:?}: frame {frame}: {name}: {value} is not {ty} {base}"
                );
                checked += 1;
                names.insert(name);
            }
        }
    }
    eprintln!(
        "{checked} -v values of {} tshark fields in tshark's base",
        names.len()
    );
    for n in [
        "iwarp_ddp.stag",
        "iwarp_ddp.tagged_offset",
        "infiniband.bth.psn",
        "rpc.xid",
    ] {
        assert!(names.contains(n), "{n} never shown");
    }
}

/// `tshark -T pdml`: per frame, each field's name and offset, in tshark's order (fields it
/// computes rather than reads, of size 0, left out).
fn pdml_positions(path: &Path, extra: &[&str]) -> BTreeMap<u64, Vec<(String, u64)>> {
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(path)
        .args(["-T", "pdml"])
        .args(extra)
        .output()
        .expect("tshark is needed for this test");
    assert!(out.status.success());
    let attr = |line: &str, a: &str| -> Option<String> {
        let i = line.find(&format!(" {a}=\""))? + a.len() + 3;
        line[i..].split('"').next().map(str::to_string)
    };
    let mut m: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    let mut frame = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = attr(line, "name") else {
            continue;
        };
        if name == "frame.number" {
            frame = attr(line, "show").unwrap().parse().unwrap();
            continue;
        }
        let size: u64 = attr(line, "size").and_then(|s| s.parse().ok()).unwrap_or(0);
        let pos: Option<u64> = attr(line, "pos").and_then(|s| s.parse().ok());
        if let (true, Some(pos)) = (size > 0, pos) {
            m.entry(frame).or_default().push((name, pos));
        }
    }
    m
}

/// `-v` shows each layer's fields in wire order: within a layer, the fields tshark also
/// shows come in the order of their offsets in tshark's dissection of the same frame.
#[test]
fn verbose_fields_in_wire_order() {
    let mut compared = 0;
    for name in [
        "siw-rping.pcap",
        "siw-crc-rping.pcap",
        "siw-ib_read_bw.pcap",
        "siw-mpa1-ucmatose.pcap",
        "rxe-rping.pcap",
        "rxe-ib_atomic_bw-cmp_swap.pcap",
        "rxe-write_imm.pcap",
        "rxe-rnr_nak.pcap",
        "rxe-send_inv.pcap",
        "nfs3-rdma-siw.pcap",
        "nfs42-rdma-rxe.pcap",
    ] {
        let path = common::captures_dir().join(name);
        let extra: &[&str] = if name.starts_with("nfs") {
            &[]
        } else {
            &["--disable-protocol", "rpcordma"]
        };
        let pos = pdml_positions(&path, extra);
        let ours = verbose(&path);
        let mut per_frame: BTreeMap<u64, usize> = BTreeMap::new();
        for (f, _) in &ours {
            *per_frame.entry(*f).or_default() += 1;
        }
        for (frame, fields) in &ours {
            // Where a frame holds one message, tshark's offsets are that message's.
            let (Some(1), Some(theirs)) = (per_frame.get(frame), pos.get(frame)) else {
                continue;
            };
            let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
            let mut last: Option<(&str, &str, u64)> = None;
            for (layer, field, _) in fields {
                // The k-th occurrence of a name is tshark's k-th (chunk lists repeat them).
                let k = seen.entry(field).or_default();
                let at = theirs
                    .iter()
                    .filter(|(n, _)| n == field)
                    .nth(*k)
                    .map(|(_, p)| *p);
                *k += 1;
                let Some(at) = at else { continue };
                if let Some((l, prev, p)) = last
                    && l == layer
                {
                    assert!(
                        p <= at,
                        "{name}: frame {frame}: {prev} (offset {p}) shown before {field} (offset {at})"
                    );
                    compared += 1;
                }
                last = Some((layer, field, at));
            }
        }
    }
    eprintln!("{compared} pairs of -v fields in tshark's wire order");
    assert!(compared > 2000, "{compared}");
}
