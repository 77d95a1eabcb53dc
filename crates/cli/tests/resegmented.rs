//! Receivers must not depend on how TCP cut the stream (MPA-44, MPA-95): the
//! same siw traffic re-cut into 1..7-octet segments decodes to the same
//! messages. Regression: an MPA Request whose Private Data arrived in a later
//! segment than its 20-octet header panicked the decoder (found by the
//! `decode_capture` fuzz target).

mod common;

use std::io::Cursor;

use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use pcap_file::pcap::{PcapPacket, PcapReader, PcapWriter};
use softrdma_cli::decode::{Options, decode_bytes, decode_file};

/// Rewrite `name` so every TCP payload is re-sent in segments of `cut(i)` octets.
fn resegment(name: &str, cut: impl Fn(usize) -> usize) -> Vec<u8> {
    let raw = std::fs::read(common::captures_dir().join(name)).unwrap();
    let mut rd = PcapReader::new(Cursor::new(raw)).unwrap();
    let header = rd.header();
    let mut out = Vec::new();
    let mut w = PcapWriter::with_header(&mut out, header).unwrap();
    let mut n = 0usize;
    while let Some(p) = rd.next_packet() {
        let p = p.unwrap();
        let s = SlicedPacket::from_ethernet(&p.data).unwrap();
        let (Some(etherparse::NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(tcp))) =
            (&s.net, &s.transport)
        else {
            w.write_packet(&p).unwrap();
            continue;
        };
        let payload = tcp.payload();
        if payload.is_empty() {
            w.write_packet(&p).unwrap();
            continue;
        }
        let mut off = 0;
        while off < payload.len() {
            let len = cut(n).clamp(1, payload.len() - off);
            n += 1;
            let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                .ipv4(ip.header().source(), ip.header().destination(), 64)
                .tcp(
                    tcp.source_port(),
                    tcp.destination_port(),
                    tcp.sequence_number().wrapping_add(off as u32),
                    tcp.window_size(),
                )
                .ack(tcp.acknowledgment_number());
            let mut frame = Vec::new();
            b.write(&mut frame, &payload[off..off + len]).unwrap();
            w.write_packet(&PcapPacket::new(p.timestamp, frame.len() as u32, &frame))
                .unwrap();
            off += len;
        }
    }
    w.into_writer();
    out
}

fn summaries(out: &softrdma_cli::decode::Output) -> Vec<String> {
    out.records.iter().map(|r| r.summary.clone()).collect()
}

/// MPA-44 / MPA-95 / MPA-25: identical message sequence whatever the segmentation.
#[test]
fn mpa_44_any_segmentation_decodes_the_same() {
    for name in [
        "siw-rping.pcap",
        "siw-crc-rping.pcap",
        "siw-send_inv.pcap",
        "siw-terminate-bad_read.pcap",
    ] {
        let whole = decode_file(&common::captures_dir().join(name), &Options::default()).unwrap();
        for (label, cut) in [
            (
                "1-octet",
                Box::new(|_: usize| 1usize) as Box<dyn Fn(usize) -> usize>,
            ),
            ("1..7-octet", Box::new(|i| 1 + i % 7)),
            ("21-octet", Box::new(|_| 21)),
        ] {
            let img = resegment(name, cut);
            let out = decode_bytes(&img, &Options::default()).unwrap();
            assert_eq!(
                summaries(&out),
                summaries(&whole),
                "{name}, {label} segments"
            );
            assert!(
                out.records.iter().all(|r| r.clean()),
                "{name}, {label} segments"
            );
            assert!(out.stream_errors.is_empty(), "{name}, {label}");
        }
    }
}
