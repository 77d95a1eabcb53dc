//! `--counters`: a QP's and a device's counters as `name value` lines, as `ethtool -S` and
//! `rdma statistic` show them — every counter the library keeps, zeros included, named
//! by its field (`requester.retransmitted`), so a new counter shows up without a change here.

use serde::Serialize;
use serde_json::Value;
use softrdma::{Context, DeviceCounters, QpCounters, TransportCounters};

/// Every counter of `v` (a counters struct), as (dotted name, value), in declaration order.
pub fn flatten(v: &impl Serialize) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    if let Ok(v) = serde_json::to_value(v) {
        walk("", &v, &mut out);
    }
    out
}

fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, u64)>) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Number(n) => out.push((prefix.to_owned(), n.as_u64().unwrap_or(0))),
        Value::Object(m) => {
            for (k, v) in m {
                // An enum's variant (`{"Iwarp": {...}}`, `{"Ib": {...}}`) names the
                // transport, which the heading already says: not a level of names.
                let variant = k.chars().next().is_some_and(char::is_uppercase);
                if variant {
                    walk(prefix, v, out);
                } else {
                    walk(&join(k), v, out);
                }
            }
        }
        // A unit variant (`None`: nothing counted yet), booleans, strings: not counters.
        _ => {}
    }
}

/// The lines of one block: a heading, then the counters, aligned.
pub fn render(heading: &str, rows: &[(String, u64)]) -> String {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = format!("{heading}\n");
    if rows.is_empty() {
        s.push_str("  (nothing counted yet)\n");
    }
    for (k, v) in rows {
        s.push_str(&format!("  {k:<w$}  {v}\n"));
    }
    s
}

/// A QP's counters: the transport-independent ones, then the engine's (`requester.*`,
/// `responder.*`, `header.*` on RoCE; the RDMAP stream's on iWARP).
pub fn qp_rows(c: &QpCounters) -> Vec<(String, u64)> {
    let common = QpCounters {
        detail: TransportCounters::None,
        ..*c
    };
    let mut rows = flatten(&common);
    rows.extend(flatten(&c.detail));
    rows
}

/// A QP's block.
pub fn qp(label: &str, qpn: u32, c: &QpCounters) -> String {
    render(&format!("QP {qpn:#x} ({label}) counters:"), &qp_rows(c))
}

/// A context's device block.
pub fn device(ctx: &Context) -> String {
    let c = ctx.counters();
    let kind = match c {
        DeviceCounters::Iwarp(_) => "iWARP",
        DeviceCounters::Roce(_) => "RoCEv2",
    };
    render(
        &format!("device {} ({kind}) counters:", ctx.device().name()),
        &flatten(&c),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_named_and_variants_are_not() {
        let c = QpCounters {
            tx_units: 3,
            retransmitted: 7,
            detail: TransportCounters::Ib {
                header: Default::default(),
                requester: softrdma::roce::RequesterCounters {
                    timeouts: 2,
                    ..Default::default()
                },
                responder: Default::default(),
            },
            ..Default::default()
        };
        let rows = qp_rows(&c);
        let get = |k: &str| rows.iter().find(|(n, _)| n == k).map(|r| r.1);
        assert_eq!(get("tx_units"), Some(3));
        assert_eq!(get("retransmitted"), Some(7));
        assert_eq!(get("requester.timeouts"), Some(2));
        assert_eq!(get("header.accepted"), Some(0));
        assert!(rows.iter().all(|(k, _)| !k.contains("Ib")), "{rows:?}");
        // Declaration order: the QP's own first, the engine's after.
        assert_eq!(rows[0].0, "tx_units");
        assert_eq!(rows[6].0, "header.bad_tver");
        // Nothing counted yet: the QP fields only.
        let none = qp_rows(&QpCounters::default());
        assert_eq!(none.len(), 6, "{none:?}");
        let text = render("h", &rows);
        assert!(
            text.lines()
                .all(|l| !l.contains('{') && !l.contains("Some("))
        );
    }
}
