//! In-order reassembly of one direction of a TCP connection.
//!
//! Captures hold retransmissions, out-of-order segments and segments that
//! overlap what was already delivered (lossy links, `siw-lossy-*.pcap`). The
//! reassembler delivers every stream octet exactly once, in order, and
//! remembers which frame completed each delivered range, so a message can be
//! attributed to the frame that carried its last octet (as Wireshark does).
//!
//! A hole the capture never fills (segments it lost) is skipped once the
//! octets held behind it pass a bound, or at the end of the capture: the
//! range after it says how many octets were lost, so a follower can
//! resynchronise (as tshark does at "previous segment not captured").

use std::collections::BTreeMap;

/// Octets and segments held behind a hole before it is given up as never filled: a
/// retransmission fills a hole within one window, and hostile input must not grow this
/// without limit.
const MAX_PENDING_OCTETS: u64 = 4 << 20;
const MAX_PENDING_SEGMENTS: usize = 4096;

/// A range of delivered stream octets and the frame that carried them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivered {
    pub frame: u64,
    /// The capture time of that frame.
    pub time: f64,
    /// Stream offset (from the first octet after the SYN) just past this range.
    pub end: u64,
    /// Octets the capture lost just before this range (a hole skipped); 0 normally.
    pub lost_before: u64,
}

#[derive(Debug, Default)]
pub struct HalfStream {
    /// Sequence number of the next octet to deliver.
    next_seq: Option<u32>,
    /// Segments ahead of `next_seq`, by sequence number: (frame, time, payload).
    pending: BTreeMap<u32, (u64, f64, Vec<u8>)>,
    pending_octets: u64,
    /// Stream offset of `next_seq`: octets delivered plus octets lost in skipped holes.
    delivered: u64,
    /// Octets lost in holes skipped so far.
    pub lost_octets: u64,
    /// A hole just skipped, reported with the next range delivered.
    lost_before: u64,
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
        time: f64,
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
            let e = self.pending.entry(seq).or_insert((frame, time, Vec::new()));
            if payload.len() > e.2.len() {
                self.pending_octets += (payload.len() - e.2.len()) as u64;
                *e = (frame, time, payload.to_vec());
            }
            while self.pending_octets > MAX_PENDING_OCTETS
                || self.pending.len() > MAX_PENDING_SEGMENTS
            {
                out.extend(self.skip_gap());
            }
            return out;
        }
        self.accept(frame, time, (-i64::from(d)) as usize, payload, &mut out);
        self.drain_pending(&mut out);
        out
    }

    fn accept(
        &mut self,
        frame: u64,
        time: f64,
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
                time,
                end: self.delivered,
                lost_before: std::mem::take(&mut self.lost_before),
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
            let Some((frame, time, data)) = self.pending.remove(&s) else {
                return;
            };
            self.pending_octets -= data.len() as u64;
            let skip = next.wrapping_sub(s) as usize;
            self.accept(frame, time, skip, &data, out);
        }
    }

    /// Give up the first hole as never filled: deliver what is held behind it, the first
    /// range saying how many octets were lost. Nothing when there is no hole.
    pub fn skip_gap(&mut self) -> Vec<(Delivered, Vec<u8>)> {
        let mut out = Vec::new();
        let Some(next) = self.next_seq else {
            return out;
        };
        // The nearest held segment, in sequence space (it may have wrapped).
        let Some(s) = self
            .pending
            .keys()
            .copied()
            .min_by_key(|&s| s.wrapping_sub(next))
        else {
            return out;
        };
        let gap = u64::from(s.wrapping_sub(next));
        self.delivered += gap;
        self.lost_octets += gap;
        self.lost_before += gap;
        self.next_seq = Some(s);
        self.drain_pending(&mut out);
        out
    }

    /// A hole is open: segments are held behind it.
    pub fn has_gap(&self) -> bool {
        !self.pending.is_empty()
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
        assert!(h.segment(1, 0.0, 100, true, &[]).is_empty());
        assert_eq!(bytes(h.segment(2, 0.0, 101, false, b"abc")), b"abc");
        // A retransmission of delivered data delivers nothing.
        assert!(bytes(h.segment(3, 0.0, 101, false, b"abc")).is_empty());
        // Overlapping retransmission delivers only the new tail.
        assert_eq!(bytes(h.segment(4, 0.0, 102, false, b"bcde")), b"de");
        assert_eq!(h.duplicate_octets, 5);
    }

    #[test]
    fn gap_filled_later_and_wrap() {
        let mut h = HalfStream::default();
        h.segment(1, 0.0, u32::MAX - 1, true, &[]);
        // next_seq = u32::MAX; segment after the wrap arrives first.
        assert!(h.segment(2, 0.0, 2, false, b"XY").is_empty());
        let got = h.segment(3, 0.0, u32::MAX, false, b"abc");
        assert_eq!(bytes(got.clone()), b"abcXY");
        assert_eq!(got.last().map(|(d, _)| d.frame), Some(2));
        assert!(!h.has_gap());
    }

    #[test]
    fn gap_never_filled_is_skipped_on_request() {
        let mut h = HalfStream::default();
        h.segment(1, 0.0, 0, true, &[]);
        assert_eq!(bytes(h.segment(2, 0.0, 1, false, b"ab")), b"ab");
        // Octets 3..10 never arrive.
        assert!(h.segment(3, 0.0, 10, false, b"late").is_empty());
        assert!(h.segment(4, 0.0, 14, false, b"r").is_empty());
        assert!(h.has_gap());
        let got = h.skip_gap();
        assert_eq!(bytes(got.clone()), b"later");
        let d: Vec<_> = got
            .iter()
            .map(|(d, _)| (d.frame, d.end, d.lost_before))
            .collect();
        // Stream offsets count the lost octets: the markers' positions depend on them.
        assert_eq!(d, [(3, 13, 7), (4, 14, 0)]);
        assert_eq!((h.lost_octets, h.delivered()), (7, 14));
        assert!(!h.has_gap() && h.skip_gap().is_empty());
    }

    #[test]
    fn held_octets_are_bounded() {
        let mut h = HalfStream::default();
        h.segment(1, 0.0, 0, true, &[]);
        // A hole at octet 1, then more held behind it than the bound allows: the hole is
        // given up (a hostile capture cannot make the reassembler hold without limit).
        let seg = vec![7u8; 60_000];
        let mut got = 0;
        for i in 0..100u32 {
            for (d, b) in h.segment(2 + u64::from(i), 0.0, 2 + i * 60_000, false, &seg) {
                assert!(d.lost_before <= 1);
                got += b.len();
            }
            assert!(h.pending_octets <= MAX_PENDING_OCTETS);
        }
        assert_eq!(h.lost_octets, 1);
        assert!(got > 0 && got as u64 + h.pending_octets == 100 * 60_000);
    }
}
