//! Record marking (RFC 5531 §11): how RPC messages are delimited on a byte stream.
//!
//! A record is one or more fragments, each behind a 4-octet mark: the high bit says "last
//! fragment", the low 31 bits give the fragment's length. [`RecordDecoder`] is sans-IO: it
//! takes octets as they come and hands out whole records, refusing (before allocating) any
//! record that would grow past its limit — a peer cannot make it buffer more than that.

use std::sync::Arc;

use thiserror::Error;

use crate::buffers::{Buffers, MIN_KEPT};

/// RFC 5531 §11: the "last fragment" bit of a record mark.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;

/// The largest fragment a mark can describe (31 bits).
pub const MAX_FRAGMENT: usize = 0x7FFF_FFFF;

/// Octets of a record mark.
pub const MARK_LEN: usize = 4;

/// A record the decoder refuses; the stream cannot be resynchronised after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RecordError {
    /// The record would be longer than the decoder's limit.
    #[error("RPC record of at least {len} octets exceeds the limit of {max}")]
    TooLarge {
        /// Octets of the record so far plus the announced fragment.
        len: usize,
        /// The limit.
        max: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Reading a mark: `n` of its 4 octets so far.
    Mark { mark: [u8; MARK_LEN], n: usize },
    /// Reading a fragment's body.
    Body { remaining: usize, last: bool },
}

/// Reassembles records from a stream (sans-IO).
#[derive(Debug)]
pub struct RecordDecoder {
    max_record: usize,
    state: State,
    record: Vec<u8>,
    /// Where a large record's memory comes from (a server's kept buffers; its records go
    /// back there once answered), if anywhere.
    buffers: Option<Arc<Buffers>>,
}

impl RecordDecoder {
    /// A decoder that refuses records longer than `max_record` octets.
    pub fn new(max_record: usize) -> RecordDecoder {
        RecordDecoder {
            max_record,
            state: State::Mark {
                mark: [0; MARK_LEN],
                n: 0,
            },
            record: Vec::new(),
            buffers: None,
        }
    }

    /// A decoder whose records of [`MIN_KEPT`] octets or more start in a vector `buffers`
    /// keeps, when it has one large enough for the first fragment (else they grow as they
    /// arrive); the server gives them back once answered.
    pub fn with_buffers(max_record: usize, buffers: Arc<Buffers>) -> RecordDecoder {
        RecordDecoder {
            buffers: Some(buffers),
            ..RecordDecoder::new(max_record)
        }
    }

    /// The record limit.
    pub fn max_record(&self) -> usize {
        self.max_record
    }

    /// Between records: an end of stream here is clean.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Mark { n: 0, .. }) && self.record.is_empty()
    }

    /// Octets of the record assembled so far, and what is left of the fragment being read
    /// (`None` between fragments, its mark not yet whole): what a reader of a capture that
    /// lost octets needs to know whether it is still in step.
    pub fn progress(&self) -> (usize, Option<usize>) {
        let left = match self.state {
            State::Body { remaining, .. } => Some(remaining),
            State::Mark { .. } => None,
        };
        (self.record.len(), left)
    }

    /// Consumes octets from the front of `input` until a record is complete (returned) or
    /// `input` is empty (`None`). Call again with the rest of `input` for the next record.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Vec<u8>>, RecordError> {
        loop {
            match &mut self.state {
                State::Mark { mark, n } => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let take = (MARK_LEN - *n).min(input.len());
                    mark[*n..*n + take].copy_from_slice(&input[..take]);
                    *n += take;
                    *input = &input[take..];
                    if *n < MARK_LEN {
                        return Ok(None);
                    }
                    let m = u32::from_be_bytes(*mark);
                    let len = (m & !LAST_FRAGMENT) as usize;
                    let total = self.record.len().saturating_add(len);
                    if total > self.max_record {
                        return Err(RecordError::TooLarge {
                            len: total,
                            max: self.max_record,
                        });
                    }
                    self.state = State::Body {
                        remaining: len,
                        last: m & LAST_FRAGMENT != 0,
                    };
                }
                State::Body { remaining, last } => {
                    // Only memory already kept: a mark's length is the peer's claim, and
                    // reserving it afresh would let one octet pin megabytes.
                    if self.record.capacity() == 0
                        && *remaining >= MIN_KEPT
                        && let Some(v) = self.buffers.as_ref().and_then(|b| b.reuse(*remaining))
                    {
                        self.record = v;
                    }
                    let take = (*remaining).min(input.len());
                    self.record.extend_from_slice(&input[..take]);
                    *input = &input[take..];
                    *remaining -= take;
                    if *remaining > 0 {
                        return Ok(None);
                    }
                    let last = *last;
                    self.state = State::Mark {
                        mark: [0; MARK_LEN],
                        n: 0,
                    };
                    if last {
                        return Ok(Some(std::mem::take(&mut self.record)));
                    }
                }
            }
        }
    }
}

/// Appends `record` (the concatenation of `parts`) to `out` as fragments of at most
/// `max_fragment` octets (at least 1; capped at [`MAX_FRAGMENT`]), each behind its mark. An
/// empty record is one empty last fragment.
pub fn encode_record(parts: &[&[u8]], max_fragment: usize, out: &mut Vec<u8>) {
    let frag = max_fragment.clamp(1, MAX_FRAGMENT);
    let total: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(total + MARK_LEN * (total / frag + 1));
    let mut left = total;
    let mut part = 0;
    let mut off = 0;
    loop {
        let n = left.min(frag);
        left -= n;
        let mark = n as u32 | if left == 0 { LAST_FRAGMENT } else { 0 };
        out.extend_from_slice(&mark.to_be_bytes());
        let mut need = n;
        while need > 0 {
            let p = parts[part];
            let take = (p.len() - off).min(need);
            out.extend_from_slice(&p[off..off + take]);
            off += take;
            need -= take;
            if off == p.len() {
                part += 1;
                off = 0;
            }
        }
        if left == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(d: &mut RecordDecoder, mut input: &[u8]) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut out = Vec::new();
        while let Some(r) = d.decode(&mut input)? {
            out.push(r);
        }
        assert!(input.is_empty());
        Ok(out)
    }

    /// A server's decoder assembles large records in its kept buffers (no allocation per
    /// call); small ones stay out of them.
    #[test]
    fn large_records_start_in_kept_memory() {
        let pool = Buffers::new(4, 1 << 20);
        let kept = Vec::with_capacity(64 << 10);
        let at = kept.as_ptr();
        pool.give(kept);
        let mut d = RecordDecoder::with_buffers(1 << 20, pool.clone());
        let mut wire = Vec::new();
        encode_record(&[&[7; 100]], 64, &mut wire);
        encode_record(&[&[9; 20_000]], 8192, &mut wire);
        let recs = decode_all(&mut d, &wire).unwrap();
        assert_eq!(recs[0], vec![7; 100]);
        assert_eq!(recs[1], vec![9; 20_000]);
        assert_eq!(
            recs[1].as_ptr(),
            at,
            "the 20,000-octet record is in the kept vector"
        );
        assert_eq!(pool.kept(), 0);
        // A mark claiming a megabyte, one octet behind it, the pool empty: nothing is
        // reserved on the claim's word.
        let mut claim = ((1u32 << 20) | LAST_FRAGMENT).to_be_bytes().to_vec();
        claim.push(1);
        assert_eq!(d.decode(&mut &claim[..]), Ok(None));
        assert!(d.record.capacity() < 4096, "{}", d.record.capacity());
        // Without buffers (a client), the same records, in memory of their own.
        let recs = decode_all(&mut RecordDecoder::new(1 << 20), &wire).unwrap();
        assert_eq!(recs[1], vec![9; 20_000]);
    }

    /// nfs3-rdma-rxe.pcap frame 18: the MOUNT MNT call's mark, one last fragment of 0x50.
    #[test]
    fn the_mark_of_a_captured_mount_call() {
        let mut out = Vec::new();
        encode_record(&[&[7u8; 0x50]], MAX_FRAGMENT, &mut out);
        assert_eq!(&out[..4], &[0x80, 0x00, 0x00, 0x50]);
        assert_eq!(out.len(), 4 + 0x50);
    }

    #[test]
    fn fragments_reassemble_and_records_follow_each_other() {
        let rec: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        encode_record(&[&rec[..10], &rec[10..]], 300, &mut wire);
        // 300 + 300 + 300 + 100: four marks, only the last with the bit.
        assert_eq!(wire.len(), 1000 + 16);
        assert_eq!(&wire[..4], &300u32.to_be_bytes());
        encode_record(&[], 300, &mut wire);
        encode_record(&[b"abc"], 300, &mut wire);
        let mut d = RecordDecoder::new(4096);
        let got = decode_all(&mut d, &wire).unwrap();
        assert_eq!(got, vec![rec, vec![], b"abc".to_vec()]);
        assert!(d.is_idle());
    }

    #[test]
    fn progress_says_where_in_a_fragment_the_decoder_is() {
        let mut wire = Vec::new();
        encode_record(&[&[9; 250]], 100, &mut wire);
        let mut d = RecordDecoder::new(4096);
        assert_eq!(d.progress(), (0, None));
        // The first mark and 30 octets of its fragment; then half of the next mark.
        let mut input = &wire[..34];
        assert_eq!(d.decode(&mut input), Ok(None));
        assert_eq!(d.progress(), (30, Some(70)));
        let mut input = &wire[34..106];
        assert_eq!(d.decode(&mut input), Ok(None));
        assert_eq!(d.progress(), (100, None));
        let mut input = &wire[106..];
        assert_eq!(d.decode(&mut input), Ok(Some(vec![9; 250])));
        assert_eq!(d.progress(), (0, None));
    }

    #[test]
    fn a_record_over_the_limit_is_refused_at_its_mark() {
        let mut d = RecordDecoder::new(100);
        let mut wire = Vec::new();
        encode_record(&[&[1; 60]], 50, &mut wire);
        encode_record(&[&[1; 101]], 1000, &mut wire);
        let mut input = &wire[..];
        assert_eq!(d.decode(&mut input), Ok(Some(vec![1; 60])));
        assert_eq!(
            d.decode(&mut input),
            Err(RecordError::TooLarge { len: 101, max: 100 })
        );
        // Fragments add up: 60 + 60 > 100 is refused at the second mark.
        let mut d = RecordDecoder::new(100);
        let mut input: &[u8] = &[0, 0, 0, 60];
        assert_eq!(d.decode(&mut input), Ok(None));
        let body = [0u8; 60];
        let mut input = &body[..];
        assert_eq!(d.decode(&mut input), Ok(None));
        let mut input: &[u8] = &[0x80, 0, 0, 60];
        assert!(d.decode(&mut input).is_err());
        // A mark claiming 2 GiB allocates nothing.
        let mut d = RecordDecoder::new(1 << 20);
        let mut input: &[u8] = &[0xFF, 0xFF, 0xFF, 0xFF];
        assert!(d.decode(&mut input).is_err());
        assert_eq!(d.record.capacity(), 0);
    }

    proptest! {
        /// Any records, any fragment size, fed in any split: the same records come out.
        #[test]
        fn records_survive_any_fragmentation_and_split(
            recs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..700), 0..6),
            frag in 1usize..400,
            cuts in prop::collection::vec(0usize..5000, 0..8),
        ) {
            let mut wire = Vec::new();
            for r in &recs {
                encode_record(&[r], frag, &mut wire);
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.push(wire.len());
            cuts.sort_unstable();
            let mut d = RecordDecoder::new(700);
            let mut got = Vec::new();
            let mut at = 0;
            for c in cuts {
                let mut input = &wire[at..c];
                while let Some(r) = d.decode(&mut input).unwrap() {
                    got.push(r);
                }
                prop_assert!(input.is_empty());
                at = c;
            }
            prop_assert_eq!(got, recs);
            prop_assert!(d.is_idle());
        }

        /// Arbitrary octets never panic and never grow a record past the limit.
        #[test]
        fn hostile_streams_stay_within_the_limit(wire in prop::collection::vec(any::<u8>(), 0..2000)) {
            let mut d = RecordDecoder::new(256);
            let mut input = &wire[..];
            loop {
                match d.decode(&mut input) {
                    Ok(Some(r)) => prop_assert!(r.len() <= 256),
                    Ok(None) => break,
                    Err(_) => break,
                }
                prop_assert!(d.record.len() <= 256);
            }
        }
    }
}
