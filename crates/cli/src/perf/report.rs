//! What `softrdma perf` reports: the rows, and their perftest-style text and JSON.

use super::proto::Test;
use super::scale;
use super::stats::{Bw, Lat};

/// The connection's MPA parameters, as the first test negotiated them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MpaInfo {
    /// MPA revision.
    pub rev: u8,
    /// CRC32c in use.
    pub crc: bool,
    /// Markers in either direction.
    pub markers: bool,
    /// Largest ULPDU we send.
    pub mulpdu: u16,
    /// The connection's effective MSS.
    pub emss: u32,
}

/// One bandwidth row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BwRow {
    /// perftest's test name.
    pub test: Test,
    /// Message size.
    pub bytes: u32,
    /// softrdma.
    pub rdma: Bw,
    /// Raw TCP, same size, same run.
    pub raw_tcp: Bw,
    /// softrdma / raw TCP bandwidth.
    pub ratio: f64,
    /// RoCE: raw UDP with segmentation offload (`UDP_SEGMENT` super-datagrams of path-MTU
    /// segments, `UDP_GRO` on receive), same size, same run; absent where the kernel has no
    /// GSO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_udp_gso: Option<Bw>,
    /// softrdma / raw UDP with GSO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_gso: Option<f64>,
}

/// One latency row.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LatRow {
    /// perftest's test name.
    pub test: Test,
    /// Message size.
    pub bytes: u32,
    /// softrdma (half round trips for Send and Write, round trips for Read).
    pub rdma: Lat,
    /// Raw TCP ping-pong, same size, same run, on the same basis.
    pub raw_tcp: Lat,
    /// `half_round_trip` or `round_trip`.
    pub basis: &'static str,
    /// softrdma / raw TCP typical (median) latency.
    pub ratio: f64,
}

/// Everything one client run measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// `iwarp` or `roce`.
    pub transport: &'static str,
    /// `loopback` or `client`.
    pub mode: &'static str,
    /// The server's RDMA address.
    pub server: String,
    /// The device.
    pub device: String,
    /// MPA parameters.
    pub mpa: Option<MpaInfo>,
    /// RoCE: path MTU and counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roce: Option<RoceInfo>,
    /// iWARP: the client QPs' RDMAP counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iwarp: Option<IwarpCounters>,
    /// Requests outstanding in bandwidth tests.
    pub tx_depth: u32,
    /// `block` or `busy`.
    pub completion_wait: &'static str,
    /// Bandwidth rows.
    pub bw: Vec<BwRow>,
    /// Latency rows.
    pub lat: Vec<LatRow>,
    /// Scale rows (`-q`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scale: Vec<scale::ScaleRow>,
    /// `--counters`: the client's QPs and device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<CountersReport>,
    /// `-b`: bandwidth rows are both directions at once, summed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bidirectional: bool,
}

/// `--counters`: what the client counted.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CountersReport {
    /// Each test's QP.
    pub qps: Vec<QpCountersRow>,
    /// The client's device (context).
    pub device: softrdma::DeviceCounters,
}

/// One test QP's counters.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct QpCountersRow {
    pub test: &'static str,
    pub qp_num: u32,
    pub counters: softrdma::QpCounters,
}

/// iWARP: what the client's QPs of a run counted, summed over its tests.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct IwarpCounters {
    /// ULPDUs sent and received.
    pub ulpdus_tx: u64,
    pub ulpdus_rx: u64,
    /// Payload octets placed (RDMA Read Responses, Sends received).
    pub payload_rx: u64,
    /// Of those, read from the socket straight into their memory.
    pub payload_rx_direct: u64,
    /// Terminates sent and received.
    pub terminates_tx: u64,
    pub terminates_rx: u64,
}

/// RoCE details of a run.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RoceInfo {
    /// Path MTU of the QPs (and the raw UDP datagram size).
    pub pmtu: u32,
    /// The client's RoCE address.
    pub client: String,
    /// Client requester, every test: request packets sent (retransmissions included).
    pub packets: u64,
    /// ... sent again after going back.
    pub retransmitted: u64,
    /// ... local ACK timeouts.
    pub timeouts: u64,
    /// ... PSN sequence error NAKs received.
    pub seq_naks: u64,
    /// ... RNR NAKs received.
    pub rnr_naks: u64,
    /// Client context: datagrams sent.
    pub tx_datagrams: u64,
    /// Client context: datagrams received.
    pub rx_datagrams: u64,
    /// Client context: datagrams dropped for a bad ICRC.
    pub bad_icrc: u64,
    /// Client context: sends the socket refused.
    pub tx_errors: u64,
}

/// The report as JSON; RoCE's baseline under `raw_udp`.
pub fn json(r: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if r.transport != "roce" {
        return v;
    }
    for rows in ["bw", "lat"] {
        if let Some(serde_json::Value::Array(a)) = v.get_mut(rows) {
            for row in a {
                if let Some(o) = row.as_object_mut()
                    && let Some(x) = o.remove("raw_tcp")
                {
                    o.insert("raw_udp".into(), x);
                }
            }
        }
    }
    v
}

const RULE: &str = "---------------------------------------------------------------------------------------------------------";

/// The report as a table a perftest user reads.
pub fn render(r: &Report) -> String {
    let mut s = render_body(r);
    s.push_str(&render_tail(r));
    s
}

/// What the connections negotiated and counted, known once the run is over: the table's
/// last lines.
pub fn render_tail(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if let Some(x) = &r.roce {
        let _ = writeln!(
            s,
            " path MTU {}, tx depth {}, completions: {}; client requester: {} packets, {} retransmitted ({} timeouts, {} sequence NAKs, {} RNR NAKs); {} bad ICRC",
            x.pmtu,
            r.tx_depth,
            r.completion_wait,
            x.packets,
            x.retransmitted,
            x.timeouts,
            x.seq_naks,
            x.rnr_naks,
            x.bad_icrc
        );
    }
    if let Some(m) = &r.mpa {
        let _ = writeln!(
            s,
            " MPA rev {}, CRC {}, markers {}, MULPDU {} (EMSS {}), tx depth {}, completions: {}",
            m.rev,
            if m.crc { "on" } else { "off" },
            if m.markers { "on" } else { "off" },
            m.mulpdu,
            m.emss,
            r.tx_depth,
            r.completion_wait
        );
    }
    if let Some(c) = &r.iwarp {
        let _ = writeln!(
            s,
            " client QPs: {} ULPDUs sent, {} received; {} payload octets placed, {} of them straight from the socket; Terminates {} sent, {} received",
            c.ulpdus_tx,
            c.ulpdus_rx,
            c.payload_rx,
            c.payload_rx_direct,
            c.terminates_tx,
            c.terminates_rx
        );
    }
    if r.roce.is_some() || r.mpa.is_some() {
        let _ = writeln!(s, "{RULE}");
    }
    // A raw UDP baseline that lost datagrams: its figure is over what arrived.
    for b in &r.bw {
        for (what, raw) in [
            ("raw UDP", Some(&b.raw_tcp)),
            ("raw UDP with GSO", b.raw_udp_gso.as_ref()),
        ] {
            if let Some(raw) = raw.filter(|x| x.lost_bytes > 0) {
                let _ = writeln!(
                    s,
                    " {what}, {} octets ({}): {} of {} octets lost; its figure is over what arrived",
                    b.bytes,
                    b.test,
                    raw.lost_bytes,
                    raw.lost_bytes + raw.bytes
                );
            }
        }
    }
    if let Some(c) = &r.counters {
        for q in &c.qps {
            s.push_str(&crate::counters::qp(q.test, q.qp_num, &q.counters));
        }
        s.push_str(&crate::counters::render(
            &format!("device {} counters:", r.device),
            &crate::counters::flatten(&c.device),
        ));
        let _ = writeln!(s, "{RULE}");
    }
    s
}

/// The table up to its last row: the head, known before the run, then each section's
/// rows; each completed row only appends lines ([`run`] prints them as they come).
pub fn render_body(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let roce = r.transport == "roce";
    let base = if roce { "raw UDP" } else { "raw TCP" };
    let _ = writeln!(s, "{RULE}");
    let _ = writeln!(
        s,
        " softrdma perf: {}, device {}, {} {}",
        if roce {
            "RoCEv2 (InfiniBand RC over UDP)"
        } else {
            "iWARP over TCP"
        },
        r.device,
        r.mode,
        r.server
    );
    let _ = if roce {
        writeln!(
            s,
            " raw UDP: path-MTU datagrams, 512 unacknowledged at most (bandwidth), the same as 64 KiB GSO super-datagrams received with GRO (UDP GSO), and a UDP ping-pong (latency) of the same message size, same run"
        )
    } else {
        writeln!(
            s,
            " raw TCP: one blocking TCP stream (bandwidth) and a TCP ping-pong (latency) of the same message size, same run"
        )
    };
    let _ = writeln!(
        s,
        " MB = 2^20 octets, Gb = 10^9 bits, ratio = softrdma / {base}"
    );
    if r.bidirectional {
        let _ = writeln!(
            s,
            " bidirectional (-b): each side runs the test toward the other at once, figures summed; {base} likewise"
        );
    }
    if !r.bw.is_empty() {
        let gso = r.bw.iter().any(|b| b.raw_udp_gso.is_some());
        let _ = writeln!(s, "{RULE}");
        let _ = write!(
            s,
            " {:<14} {:>8} {:>12} {:>13} {:>16} {:>18} {:>14} | {:>14} {:>7}",
            "test",
            "#bytes",
            "#iterations",
            "BW peak[Gb/s]",
            "BW average[Gb/s]",
            "BW average[MB/sec]",
            "MsgRate[Mpps]",
            format!("{base}[Gb/s]"),
            "ratio"
        );
        let _ = if gso {
            writeln!(s, " | {:>14} {:>7}", "UDP GSO[Gb/s]", "ratio")
        } else {
            writeln!(s)
        };
        for b in &r.bw {
            let _ = write!(
                s,
                " {:<14} {:>8} {:>12} {:>13} {:>16.2} {:>18.2} {:>14.6} | {:>14.2} {:>7.2}",
                b.test.name(),
                b.bytes,
                b.rdma.iters,
                b.rdma
                    .peak_gbit_s
                    .map_or_else(|| "-".to_owned(), |p| format!("{p:.2}")),
                b.rdma.gbit_s,
                b.rdma.mbyte_s,
                b.rdma.mpps,
                b.raw_tcp.gbit_s,
                b.ratio
            );
            let _ = match (b.raw_udp_gso, b.ratio_gso) {
                (Some(g), Some(x)) => writeln!(s, " | {:>14.2} {:>7.2}", g.gbit_s, x),
                _ if gso => writeln!(s, " | {:>14} {:>7}", "-", "-"),
                _ => writeln!(s),
            };
        }
    }
    if !r.scale.is_empty() {
        let _ = writeln!(s, "{RULE}");
        let _ = writeln!(
            s,
            " scale: N connected RC QPs, one RDMA Write per QP per round; memory: RSS added per connection (both QPs, both contexts), KiB; raw TCP: the same rounds over N loopback TCP connections"
        );
        let raw = r.scale.iter().any(|x| x.raw_tcp.is_some());
        let _ = write!(
            s,
            " {:>6} {:>8} {:>8} {:>11} {:>10} {:>14} {:>10} {:>11} {:>11}",
            "#QPs",
            "#bytes",
            "rounds",
            "connect[s]",
            "BW[Gb/s]",
            "ops[Mops/s]",
            "vs 1st",
            "idle[KiB]",
            "active[KiB]",
        );
        let _ = if raw {
            writeln!(s, " | {:>13} {:>10}", "raw TCP[Gb/s]", "vs 1st")
        } else {
            writeln!(s)
        };
        for x in &r.scale {
            let _ = write!(
                s,
                " {:>6} {:>8} {:>8} {:>11.3} {:>10.2} {:>14.4} {:>10.2} {:>11.1} {:>11.1}",
                x.qps,
                x.bytes,
                x.rounds,
                x.connect_seconds,
                x.bw.gbit_s,
                x.bw.mpps,
                x.vs_first,
                x.idle_bytes_per_connection as f64 / 1024.0,
                x.active_bytes_per_connection as f64 / 1024.0,
            );
            let _ = match (x.raw_tcp, x.raw_vs_first) {
                (Some(b), Some(v)) => writeln!(s, " | {:>13.2} {:>10.2}", b.gbit_s, v),
                _ if raw => writeln!(s, " | {:>13} {:>10}", "-", "-"),
                _ => writeln!(s),
            };
        }
    }
    if !r.lat.is_empty() {
        let _ = writeln!(s, "{RULE}");
        let _ = writeln!(
            s,
            " latency in usec, perftest's columns; Send and Write: half round trip (as ib_send_lat, ib_write_lat), Read: round trip (as ib_read_lat)"
        );
        let _ = writeln!(
            s,
            " {:<14} {:>7} {:>11} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} | {:>13} {:>9} {:>7}",
            "test",
            "#bytes",
            "#iterations",
            "t_min",
            "t_max",
            "t_typical",
            "t_avg",
            "t_stdev",
            "99%",
            "99.9%",
            "raw t_typical",
            "raw t_avg",
            "ratio"
        );
        for l in &r.lat {
            let _ = writeln!(
                s,
                " {:<14} {:>7} {:>11} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} | {:>13.2} {:>9.2} {:>7.2}",
                l.test.name(),
                l.bytes,
                l.rdma.iters,
                l.rdma.t_min,
                l.rdma.t_max,
                l.rdma.t_typical,
                l.rdma.t_avg,
                l.rdma.t_stdev,
                l.rdma.t_p99,
                l.rdma.t_p999,
                l.raw_tcp.t_typical,
                l.raw_tcp.t_avg,
                l.ratio
            );
        }
    }
    let _ = writeln!(s, "{RULE}");
    s
}
