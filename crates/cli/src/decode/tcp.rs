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
    /// Of `lost_before`, the octets a segment carried beyond what the capture kept of it
    /// (its snap length), not segments it missed.
    pub cut_before: u64,
}

/// One TCP segment of a connection as the capture holds it.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    pub seq: u32,
    pub syn: bool,
    /// The payload as captured.
    pub payload: &'a [u8],
    /// The payload's length on the wire (more than `payload` when the frame was cut).
    pub len: usize,
}

#[derive(Debug, Default)]
pub struct HalfStream {
    /// Sequence number of the next octet to deliver.
    next_seq: Option<u32>,
    /// Segments ahead of `next_seq`, by sequence number: (frame, time, the payload as
    /// captured, its length on the wire).
    pending: BTreeMap<u32, (u64, f64, Vec<u8>, usize)>,
    pending_octets: u64,
    /// Stream offset of `next_seq`: octets delivered plus octets lost in skipped holes.
    delivered: u64,
    /// Octets lost in holes skipped so far.
    pub lost_octets: u64,
    /// A hole just skipped, reported with the next range delivered.
    lost_before: u64,
    /// Of `lost_before`, octets cut off segments by the capture's snap length.
    cut_before: u64,
    /// Octets cut off segments by the capture's snap length, and the segments, all told.
    pub cut_octets: u64,
    pub cut_segments: u64,
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
        let len = payload.len();
        self.segment_cut(
            frame,
            time,
            Segment {
                seq,
                syn,
                payload,
                len,
            },
        )
    }

    /// [`HalfStream::segment`] of a segment of `seg.len` octets of which the capture kept
    /// `seg.payload`, the first ones (its snap length). Once the kept octets are in order,
    /// the rest is skipped as a hole the range after it reports ([`Delivered::cut_before`]).
    pub fn segment_cut(
        &mut self,
        frame: u64,
        time: f64,
        seg: Segment<'_>,
    ) -> Vec<(Delivered, Vec<u8>)> {
        let Segment {
            seq,
            syn,
            payload,
            len,
        } = seg;
        if syn {
            // The SYN takes one sequence number; data (if any) follows it.
            if self.next_seq.is_none() {
                self.next_seq = Some(seq.wrapping_add(1));
            }
        }
        let seq = if syn { seq.wrapping_add(1) } else { seq };
        let len = len.max(payload.len());
        if len == 0 {
            return Vec::new();
        }
        if len > payload.len() {
            self.cut_segments += 1;
            self.cut_octets += (len - payload.len()) as u64;
        }
        let next = *self.next_seq.get_or_insert(seq);
        let mut out = Vec::new();
        let d = seq.wrapping_sub(next) as i32;
        if d > 0 {
            // Ahead of a gap: hold it (keep the longer copy if seen twice).
            let e = self
                .pending
                .entry(seq)
                .or_insert((frame, time, Vec::new(), 0));
            if payload.len() > e.2.len() || (payload.len() == e.2.len() && len > e.3) {
                self.pending_octets += payload.len() as u64;
                self.pending_octets -= e.2.len() as u64;
                *e = (frame, time, payload.to_vec(), len);
            }
            while self.pending_octets > MAX_PENDING_OCTETS
                || self.pending.len() > MAX_PENDING_SEGMENTS
            {
                out.extend(self.skip_gap());
            }
            return out;
        }
        self.accept(
            frame,
            time,
            (-i64::from(d)) as usize,
            payload,
            len,
            &mut out,
        );
        self.drain_pending(&mut out);
        out
    }

    /// Delivers what `payload` (the kept octets of a segment of `len` on the wire, starting
    /// `skip` octets before the next one due) adds to the stream; octets the capture did
    /// not keep past it are skipped as a cut.
    fn accept(
        &mut self,
        frame: u64,
        time: f64,
        skip: usize,
        payload: &[u8],
        len: usize,
        out: &mut Vec<(Delivered, Vec<u8>)>,
    ) {
        if skip >= len {
            self.duplicate_octets += payload.len() as u64;
            return;
        }
        self.duplicate_octets += skip.min(payload.len()) as u64;
        if let Some(fresh) = payload.get(skip..).filter(|f| !f.is_empty()) {
            self.delivered += fresh.len() as u64;
            let next = self.next_seq.unwrap_or(0);
            self.next_seq = Some(next.wrapping_add(fresh.len() as u32));
            out.push((
                Delivered {
                    frame,
                    time,
                    end: self.delivered,
                    lost_before: std::mem::take(&mut self.lost_before),
                    cut_before: std::mem::take(&mut self.cut_before),
                },
                fresh.to_vec(),
            ));
        }
        // The rest of the segment on the wire, which the capture did not keep.
        let missing = (len - skip.max(payload.len())) as u64;
        if missing > 0 {
            let next = self.next_seq.unwrap_or(0);
            self.next_seq = Some(next.wrapping_add(missing as u32));
            self.delivered += missing;
            self.lost_before += missing;
            self.cut_before += missing;
        }
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
            let Some((frame, time, data, len)) = self.pending.remove(&s) else {
                return;
            };
            self.pending_octets -= data.len() as u64;
            let skip = next.wrapping_sub(s) as usize;
            self.accept(frame, time, skip, &data, len, out);
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

    /// Octets cut off the last segment delivered (its snap length) that no later range
    /// reported: the stream ended there. Taken once.
    pub fn take_trailing_cut(&mut self) -> Option<(u64, u64)> {
        if self.cut_before == 0 || self.cut_before != self.lost_before || self.has_gap() {
            return None;
        }
        self.lost_before = 0;
        Some((self.delivered, std::mem::take(&mut self.cut_before)))
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

    /// A segment of `len` octets on the wire, of which `payload` was captured.
    fn cut(seq: u32, payload: &[u8], len: usize) -> Segment<'_> {
        Segment {
            seq,
            syn: false,
            payload,
            len,
        }
    }

    fn bytes(chunks: Vec<(Delivered, Vec<u8>)>) -> Vec<u8> {
        chunks.into_iter().flat_map(|(_, b)| b).collect()
    }

    /// A segment cut by the capture's snap length: its kept octets are delivered, the rest
    /// is a hole the next range reports as cut, in order or held out of order; a cut at the
    /// end of the stream is taken once at the end.
    #[test]
    fn cut_segments_leave_holes_said_to_be_cut() {
        let mut h = HalfStream::default();
        h.segment(1, 0.0, 99, true, &[]);
        // 10 octets on the wire, 4 kept.
        assert_eq!(bytes(h.segment_cut(2, 0.0, cut(100, b"abcd", 10))), b"abcd");
        let next = h.segment_cut(3, 0.0, cut(110, b"xy", 2));
        assert_eq!(next.len(), 1);
        assert_eq!((next[0].0.lost_before, next[0].0.cut_before), (6, 6));
        assert_eq!(next[0].0.end, 12);
        // Out of order: a cut segment held behind a lost one, then the lost one again.
        let held = h.segment_cut(5, 0.0, cut(120, b"ef", 8));
        assert!(held.is_empty());
        let got = h.segment_cut(4, 0.0, cut(112, b"12345678", 8));
        assert_eq!(bytes(got), b"12345678ef");
        let tail = h.segment_cut(6, 0.0, cut(128, b"z", 1));
        assert_eq!((tail[0].0.lost_before, tail[0].0.cut_before), (6, 6));
        assert_eq!((h.cut_segments, h.cut_octets), (2, 12));
        // A real loss and a cut before the same range: not a cut.
        let mut h = HalfStream::default();
        h.segment_cut(1, 0.0, cut(0, b"ab", 5));
        h.segment_cut(3, 0.0, cut(9, b"c", 1));
        let after = h.skip_gap();
        assert_eq!((after[0].0.lost_before, after[0].0.cut_before), (7, 3));
        // Cut at the end.
        let mut h = HalfStream::default();
        h.segment_cut(1, 0.0, cut(0, b"ab", 5));
        assert_eq!(h.take_trailing_cut(), Some((5, 3)));
        assert_eq!(h.take_trailing_cut(), None);
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
