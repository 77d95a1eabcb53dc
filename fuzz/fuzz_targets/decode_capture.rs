#![no_main]
//! `softrdma decode` on hostile capture files: pcap/pcapng parsing, link and IP
//! slicing, TCP reassembly, MPA stream following, RoCEv2 and RPC-over-RDMA
//! decoding, and `-v`'s rendering of what was decoded, must never panic, whatever the bytes.
//!
//! Input: a pcap image. To reach the protocol decoders quickly the first
//! octet chooses between the input as-is and the input appended as one
//! Ethernet frame to a minimal pcap header; its bit 3 also decodes UDP port
//! 4792 as RoCEv2, bits 4-7 stop after that many frames (0: all).

use libfuzzer_sys::fuzz_target;
use softrdma_cli::decode::{Options, Output, decode_bytes};

fn render(out: Result<Output, softrdma_cli::decode::CaptureError>) {
    for r in out.iter().flat_map(|o| &o.records) {
        let _ = r.verbose();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let opts = Options {
        all: mode & 2 != 0,
        sends: mode & 4 != 0,
        roce_ports: if mode & 8 != 0 { vec![4792] } else { Vec::new() },
        max_frames: Some(u64::from(mode >> 4)).filter(|&n| n > 0),
    };
    if mode & 1 == 0 {
        render(decode_bytes(rest, &opts));
        return;
    }
    // pcap header (LE, v2.4, snaplen 65535, Ethernet) + frames cut from `rest`
    // at length prefixes, so several frames (and TCP streams) are exercised.
    let mut img = Vec::with_capacity(rest.len() + 64);
    img.extend_from_slice(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0]);
    img.extend_from_slice(&[0; 8]);
    img.extend_from_slice(&65535u32.to_le_bytes());
    img.extend_from_slice(&1u32.to_le_bytes());
    let mut r = rest;
    let mut ts = 0u32;
    while let Some((&len, tail)) = r.split_first() {
        let n = (len as usize * 4).min(tail.len());
        let (frame, next) = tail.split_at(n);
        ts += 1;
        img.extend_from_slice(&ts.to_le_bytes());
        img.extend_from_slice(&0u32.to_le_bytes());
        img.extend_from_slice(&(n as u32).to_le_bytes());
        img.extend_from_slice(&(n as u32).to_le_bytes());
        img.extend_from_slice(frame);
        r = next;
    }
    render(decode_bytes(&img, &opts));
});
