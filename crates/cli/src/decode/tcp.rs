//! In-order reassembly of one direction of a TCP connection.
//!
//! Captures hold retransmissions, out-of-order segments and segments that
//! overlap what was already delivered (lossy links, `siw-lossy-*.pcap`). The
//! reassembler delivers every stream octet exactly once, in order, and
//! remembers which frame completed each delivered range, so a message can be
//! attributed to the frame that carried its last octet (as Wireshark does).

use std::collections::BTreeMap;

/// A range of delivered stream octets and the frame that carried them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub frame: u64,
    /// Stream offset (from the first delivered octet) just past this range.
    pub end: u64,
}

#[derive(Debug, Default)]
pub struct HalfStream {
    /// Sequence number of the next octet to deliver.
    next_seq: Option<u32>,
    /// Segments ahead of `next_seq`, by sequence number.
    pending: BTreeMap<u32, (u64, Vec<u8>)>,
    /// Octets delivered so far.
    delivered: u64,
    /// Octets that arrived again after delivery (retransmissions).
    pub duplicate_octets: u64,
    pub fin: bool,
}

impl HalfStream {
    /// Feed one segment; returns the newly in-order octets (possibly several
    /// chunks, each tagged with the frame that carried it).
    pub fn segment(
        &mut self,
        frame: u64,
        seq: u32,
        syn: bool,
        payload: &[u8],
    ) -> Vec<(Delivered, Vec<u8>)> {
        if syn {
            // The SYN takes one sequence number; data (if any) follows it.
            if self.next_seq.is_none() {
                self.next_seq = Some(seq.wrapping_add(1));
            }
            if payload.is_empty() {
                return Vec::new();
            }
        }
        let seq = if syn { seq.wrapping_add(1) } else { seq };
        if payload.is_empty() {
            return Vec::new();
        }
        let next = *self.next_seq.get_or_insert(seq);
        let mut out = Vec::new();
        let d = seq.wrapping_sub(next) as i32;
        if d > 0 {
            // Ahead of a gap: hold it (keep the longer copy if seen twice).
            let e = self.pending.entry(seq).or_insert((frame, Vec::new()));
            if payload.len() > e.1.len() {
                *e = (frame, payload.to_vec());
            }
            return out;
        }
        self.accept(frame, (-i64::from(d)) as usize, payload, &mut out);
        self.drain_pending(&mut out);
        out
    }

    fn accept(
        &mut self,
        frame: u64,
        skip: usize,
        payload: &[u8],
        out: &mut Vec<(Delivered, Vec<u8>)>,
    ) {
        if skip >= payload.len() {
            self.duplicate_octets += payload.len() as u64;
            return;
        }
        self.duplicate_octets += skip as u64;
        let fresh = &payload[skip..];
        self.delivered += fresh.len() as u64;
        let next = self.next_seq.unwrap_or(0);
        self.next_seq = Some(next.wrapping_add(fresh.len() as u32));
        out.push((
            Delivered {
                frame,
                end: self.delivered,
            },
            fresh.to_vec(),
        ));
    }

    fn drain_pending(&mut self, out: &mut Vec<(Delivered, Vec<u8>)>) {
        loop {
            let Some(next) = self.next_seq else { return };
            // Any held segment that starts at or before `next` can go now.
            let ready = self
                .pending
                .keys()
                .copied()
                .find(|&s| (s.wrapping_sub(next) as i32) <= 0);
            let Some(s) = ready else { return };
            let (frame, data) = self.pending.remove(&s).unwrap_or_default();
            let skip = next.wrapping_sub(s) as usize;
            self.accept(frame, skip, &data, out);
        }
    }

    /// Octets held behind a gap that never closed.
    pub fn stranded_octets(&self) -> u64 {
        self.pending.values().map(|(_, d)| d.len() as u64).sum()
    }

    pub fn delivered(&self) -> u64 {
        self.delivered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(chunks: Vec<(Delivered, Vec<u8>)>) -> Vec<u8> {
        chunks.into_iter().flat_map(|(_, b)| b).collect()
    }

    #[test]
    fn in_order_and_retransmission() {
        let mut h = HalfStream::default();
        assert!(h.segment(1, 100, true, &[]).is_empty());
        assert_eq!(bytes(h.segment(2, 101, false, b"abc")), b"abc");
        // A retransmission of delivered data delivers nothing.
        assert!(bytes(h.segment(3, 101, false, b"abc")).is_empty());
        // Overlapping retransmission delivers only the new tail.
        assert_eq!(bytes(h.segment(4, 102, false, b"bcde")), b"de");
        assert_eq!(h.duplicate_octets, 5);
    }

    #[test]
    fn gap_filled_later_and_wrap() {
        let mut h = HalfStream::default();
        h.segment(1, u32::MAX - 1, true, &[]);
        // next_seq = u32::MAX; segment after the wrap arrives first.
        assert!(h.segment(2, 2, false, b"XY").is_empty());
        let got = h.segment(3, u32::MAX, false, b"abc");
        assert_eq!(bytes(got.clone()), b"abcXY");
        assert_eq!(got.last().map(|(d, _)| d.frame), Some(2));
        assert_eq!(h.stranded_octets(), 0);
    }

    #[test]
    fn gap_never_filled_is_reported() {
        let mut h = HalfStream::default();
        h.segment(1, 0, true, &[]);
        h.segment(2, 10, false, b"late");
        assert_eq!(h.stranded_octets(), 4);
        assert_eq!(h.delivered(), 0);
    }
}
