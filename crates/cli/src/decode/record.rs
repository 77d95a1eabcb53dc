//! One decoded message, and how it is printed.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Map, Value};

use super::fields;

/// The outcome of one verification (CRC, ICRC, re-emit round trip, ...).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Check {
    pub what: &'static str,
    /// `None` when the check does not apply (e.g. MPA CRC not negotiated).
    pub ok: Option<bool>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// One line of `softrdma decode` output.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// The frame that carried the message's last octet.
    pub frame: u64,
    pub time: f64,
    pub src: String,
    pub dst: String,
    /// Top protocol decoded: "MPA", "iWARP", "RoCEv2", "TCP", "UDP", ...
    pub proto: &'static str,
    pub summary: String,
    /// Every decoded field, one object per layer, in wire order.
    pub layers: Map<String, Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// A Send-family segment's payload, whole, when [`super::Options::sends`] asks for it.
    #[serde(skip)]
    pub send: Option<SendSegment>,
    /// The ONC RPC message carried, to pair replies with calls.
    #[serde(skip)]
    pub rpc: Option<RpcMessage>,
}

/// An ONC RPC call or reply (or an RPC-over-RDMA header whose message is in a chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcMessage {
    pub xid: u32,
    /// A call's program, version and procedure; `None` for a reply (or a message not seen).
    pub call: Option<(u32, u32, u32)>,
    /// An NFSv4 COMPOUND call's operations.
    pub compound: Option<super::nfs4::Compound>,
}

/// One segment of an RDMA Send, Send with Solicited Event or Send with Invalidate message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSegment {
    /// It starts its message (DDP MO 0, RFC 5041 §4.4; IB First or Only).
    pub first: bool,
    /// It ends its message (DDP Last flag; IB Last or Only).
    pub last: bool,
    /// Its payload octets.
    pub payload: Vec<u8>,
}

impl Record {
    pub fn new(frame: u64, time: f64, src: String, dst: String, proto: &'static str) -> Self {
        Record {
            frame,
            time,
            src,
            dst,
            proto,
            summary: String::new(),
            layers: Map::new(),
            checks: Vec::new(),
            errors: Vec::new(),
            send: None,
            rpc: None,
        }
    }

    pub fn layer(&mut self, name: &str, v: impl Serialize) {
        let mut v = serde_json::to_value(v).unwrap_or_else(|e| Value::String(e.to_string()));
        octets_as_hex(&mut v);
        self.layers.insert(name.to_string(), v);
    }

    /// The layer object `name`, to add derived fields to.
    pub fn layer_mut(&mut self, name: &str) -> Option<&mut Map<String, Value>> {
        self.layers.get_mut(name).and_then(Value::as_object_mut)
    }

    pub fn check(&mut self, what: &'static str, ok: Option<bool>, detail: impl Into<String>) {
        self.checks.push(Check {
            what,
            ok,
            detail: detail.into(),
        });
    }

    pub fn error(&mut self, e: impl std::fmt::Display) {
        self.errors.push(e.to_string());
    }

    /// `emit` the parsed header into a fresh buffer of `len` octets and record
    /// whether it reproduces the wire octets (the `reemit` check).
    pub fn reemit(
        &mut self,
        wire: &[u8],
        emit: impl FnOnce(&mut [u8]) -> softrdma_wire::Result<usize>,
        len: usize,
    ) {
        let mut buf = vec![0u8; len];
        let same = match emit(&mut buf) {
            Ok(n) => n == len && wire.get(..n) == Some(&buf[..]),
            Err(_) => false,
        };
        let detail = if same {
            ""
        } else {
            "re-emitted header differs from the wire"
        };
        self.check("reemit", Some(same), detail);
    }

    /// True when every applicable check passed and nothing failed to decode.
    pub fn clean(&self) -> bool {
        self.errors.is_empty() && self.checks.iter().all(|c| c.ok != Some(false))
    }

    /// A tshark-style summary line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:6} {:11.6} {} → {} {:6} {}",
            self.frame, self.time, self.src, self.dst, self.proto, self.summary
        );
        for c in &self.checks {
            match c.ok {
                Some(true) if c.what != "reemit" => {
                    let _ = write!(s, " [{} ok]", c.what);
                }
                Some(false) => {
                    let _ = write!(s, " [{} BAD{}]", c.what, bracket(&c.detail));
                }
                _ => {}
            }
        }
        for e in &self.errors {
            let _ = write!(s, " [error: {e}]");
        }
        s
    }

    /// The summary line followed by every field, indented per layer: layers and fields in
    /// wire order, named and based as tshark names and shows them (see [`super::fields`]).
    pub fn verbose(&self) -> String {
        let mut s = self.line();
        for (name, v) in &self.layers {
            let _ = write!(s, "\n    {}", fields::layer_name(name));
            match struct_variant(v) {
                // A layer that is one enum variant: DDP's buffer model, the IP version.
                Some((k, inner)) => {
                    let _ = write!(s, " ({})", fields::words(k));
                    tree(&mut s, name, inner, 3);
                }
                None => tree(&mut s, name, v, 3),
            }
        }
        for c in &self.checks {
            let verdict = match c.ok {
                Some(true) => "ok",
                Some(false) => "FAILED",
                None => "not applicable",
            };
            let _ = write!(s, "\n    check {}: {verdict}{}", c.what, bracket(&c.detail));
        }
        s
    }
}

/// Fields that hold octet strings: shown as hex (payloads cut to 64 octets,
/// with their full length beside them) instead of arrays of numbers.
const OCTET_FIELDS: &[&str] = &[
    "payload",
    "private_data",
    "pad",
    "options",
    "rsvd_ulp",
    "body",
];
const PAYLOAD_SHOWN: usize = 64;

fn octets(v: &Value) -> Option<Vec<u8>> {
    let a = v.as_array()?;
    a.iter()
        .map(|x| x.as_u64().and_then(|n| u8::try_from(n).ok()))
        .collect()
}

fn octets_as_hex(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let Some(x) = m.get_mut(&k) else { continue };
                let bytes = if k == "machinename" || OCTET_FIELDS.contains(&k.as_str()) {
                    octets(x)
                } else {
                    None
                };
                let Some(b) = bytes else {
                    octets_as_hex(x);
                    continue;
                };
                if k == "machinename" {
                    *x = Value::String(String::from_utf8_lossy(&b).into_owned());
                    continue;
                }
                let shown = if k == "payload" {
                    b.len().min(PAYLOAD_SHOWN)
                } else {
                    b.len()
                };
                let mut h: String = b[..shown].iter().map(|o| format!("{o:02x}")).collect();
                if shown < b.len() {
                    h.push('…');
                }
                *x = Value::String(h);
                if k == "payload" {
                    m.insert("payload_len".into(), Value::from(b.len()));
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(octets_as_hex),
        _ => {}
    }
}

fn bracket(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" ({d})")
    }
}

/// `{"Variant": {fields}}`: serde's form of an enum's struct variant.
fn struct_variant(v: &Value) -> Option<(&str, &Value)> {
    let m = v.as_object()?;
    let (k, inner) = m.iter().next()?;
    (m.len() == 1 && fields::is_variant(k) && inner.is_object()).then_some((k.as_str(), inner))
}

/// A unit variant or a chain of newtype variants ending in one (`{"Ddp": {"TaggedBuffer":
/// "InvalidStag"}}`), as words.
fn variant_words(v: &Value) -> Option<String> {
    match v {
        Value::String(x) if fields::is_variant(x) => Some(fields::words(x)),
        Value::Object(m) if m.len() == 1 => {
            let (k, inner) = m.iter().next()?;
            if !fields::is_variant(k) {
                return None;
            }
            let rest = variant_words(inner).or_else(|| match inner {
                Value::Number(_) | Value::String(_) => Some(inner.to_string()),
                _ => None,
            })?;
            Some(format!("{} {}", fields::words(k), rest.trim_matches('"')))
        }
        _ => None,
    }
}

/// The fields of object `v` at `path`, one a line, at `depth`.
fn tree(s: &mut String, path: &str, v: &Value, depth: usize) {
    let pad = "  ".repeat(depth);
    let Some(m) = v.as_object() else {
        let _ = write!(s, "\n{pad}{}", scalar(v, fields::Base::Dec));
        return;
    };
    let mut keys: Vec<(&String, &Value)> = m.iter().collect();
    keys.sort_by_key(|(k, _)| fields::rank(&format!("{path}.{k}")));
    for (k, x) in keys {
        let p = format!("{path}.{k}");
        let (name, base) = fields::field(&p, k);
        match x {
            // An absent optional header or field: nothing on the wire.
            Value::Null => {}
            Value::Object(_) => {
                if let Some(w) = variant_words(x) {
                    let _ = write!(s, "\n{pad}{name}: {w}");
                } else if let Some((variant, inner)) = struct_variant(x) {
                    let _ = write!(s, "\n{pad}{name}: {}", fields::words(variant));
                    tree(s, &p, inner, depth + 1);
                } else {
                    let _ = write!(s, "\n{pad}{name}");
                    tree(s, &p, x, depth + 1);
                }
            }
            Value::Array(a) => list(s, &p, &name, base, a, depth),
            _ => {
                let _ = write!(s, "\n{pad}{name}: {}", scalar(x, base));
            }
        }
    }
}

/// A list: its scalars on one line, or one entry (object or list) after another.
fn list(s: &mut String, path: &str, name: &str, base: fields::Base, a: &[Value], depth: usize) {
    let pad = "  ".repeat(depth);
    if a.is_empty() {
        let _ = write!(s, "\n{pad}{name}: (none)");
    } else if a.iter().all(|x| !x.is_object() && !x.is_array()) {
        let items: Vec<String> = a.iter().map(|x| scalar(x, base)).collect();
        let _ = write!(s, "\n{pad}{name}: {}", items.join(", "));
    } else {
        let _ = write!(s, "\n{pad}{name} [{}]", a.len());
        for (i, x) in a.iter().enumerate() {
            match x {
                Value::Array(inner) => list(s, path, &format!("[{i}]"), base, inner, depth + 1),
                _ => {
                    let _ = write!(s, "\n{pad}  [{i}]");
                    tree(s, path, x, depth + 2);
                }
            }
        }
    }
}

fn scalar(v: &Value, base: fields::Base) -> String {
    match v {
        Value::Number(n) => n
            .as_u64()
            .map_or_else(|| n.to_string(), |n| fields::number(n, base)),
        Value::String(x) if fields::is_variant(x) => fields::words(x),
        Value::String(x) if x.is_empty() => "(none)".into(),
        Value::String(x) => x.clone(),
        other => other.to_string(),
    }
}
