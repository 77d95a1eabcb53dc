//! An RPC message body and its DDP-eligible item (RFC 8166 §3.4), and the XDR reduction a
//! chunk makes of it: what leaves the Payload stream and how the receiver puts it back.

use std::ops::Range;
use std::sync::Arc;

use softrdma::Buffer;
use softrdma_wire::xdr::{pad_len, padded_len};

/// XDR octets (call arguments or reply results) and their DDP-eligible items: the data
/// octets of variable-length opaques, `ddp`, which the Upper-Layer Binding names
/// (RFC 8166 §6; for NFSv3 the data of WRITE and READ, RFC 8267 §4). Each item's length
/// word stays before it in `xdr`; its XDR padding follows it.
///
/// The last item may instead stay in memory of its own, [`Shared`]: a result served from
/// memory the program keeps (a cache, registered memory) is then never copied into the
/// stream, and over RDMA it is written into the requester's Write chunk from where it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload {
    /// The XDR stream: whole, or without the data (and padding) of `shared`.
    pub xdr: Vec<u8>,
    /// The DDP-eligible items' data: ranges of `xdr` in stream order, each starting at a
    /// multiple of 4 (a transport moves the first through the first chunk, and so on).
    pub ddp: Vec<Range<usize>>,
    /// A last DDP-eligible item held apart (after every `ddp` item).
    pub shared: Option<Shared>,
}

/// DDP-eligible data that stays where it is: octets `range` of `data`, which belong at
/// offset `at` of the payload's `xdr` (right after their length word; the XDR padding
/// goes with them wherever they are put back).
#[derive(Debug, Clone)]
pub struct Shared {
    /// Where in `xdr` the data belongs.
    pub at: usize,
    /// The memory holding it (read under its lock while being sent).
    pub data: Arc<Buffer>,
    /// The data's octets in `data`.
    pub range: Range<usize>,
}

impl PartialEq for Shared {
    /// The same octets of the same memory.
    fn eq(&self, o: &Shared) -> bool {
        self.at == o.at && self.range == o.range && Arc::ptr_eq(&self.data, &o.data)
    }
}

impl Eq for Shared {}

impl From<Vec<u8>> for Payload {
    fn from(xdr: Vec<u8>) -> Payload {
        Payload {
            xdr,
            ddp: Vec::new(),
            shared: None,
        }
    }
}

impl Payload {
    /// `xdr` with the data of `opaque` appended as a DDP-eligible `opaque<>` (length word,
    /// data, padding) — the usual last argument or result (NFS WRITE, READ).
    pub fn with_opaque(xdr: Vec<u8>, opaque: &[u8]) -> Payload {
        let mut p = Payload::from(xdr);
        p.push_opaque(opaque);
        p
    }

    /// Appends plain XDR octets (a multiple of 4).
    pub fn push_xdr(&mut self, xdr: &[u8]) -> &mut Payload {
        debug_assert!(xdr.len().is_multiple_of(4));
        self.xdr.extend_from_slice(xdr);
        self
    }

    /// `xdr` followed by octets `range` of `data` as a DDP-eligible `opaque<>` left where it
    /// is ([`Shared`]); more XDR may follow it ([`Payload::push_xdr`]), no other item.
    pub fn with_shared(xdr: Vec<u8>, data: Arc<Buffer>, range: Range<usize>) -> Payload {
        let mut p = Payload::from(xdr);
        debug_assert!(p.xdr.len().is_multiple_of(4));
        p.xdr.extend_from_slice(&(range.len() as u32).to_be_bytes());
        p.shared = Some(Shared {
            at: p.xdr.len(),
            data,
            range,
        });
        p
    }

    /// Appends `opaque` as a DDP-eligible `opaque<>` item.
    pub fn push_opaque(&mut self, opaque: &[u8]) -> &mut Payload {
        debug_assert!(self.xdr.len().is_multiple_of(4));
        debug_assert!(self.shared.is_none(), "the shared item comes last");
        self.xdr
            .extend_from_slice(&(opaque.len() as u32).to_be_bytes());
        let start = self.xdr.len();
        self.xdr.extend_from_slice(opaque);
        self.xdr.resize(padded_len(self.xdr.len()), 0);
        self.ddp.push(start..start + opaque.len());
        self
    }

    /// The DDP-eligible items' data, in order.
    pub fn ddp_data(&self) -> impl Iterator<Item = &[u8]> {
        self.ddp.iter().filter_map(|r| self.xdr.get(r.clone()))
    }

    /// Well-formed items: inside `xdr`, 4-aligned, in order, none inside another's padding;
    /// the shared item after them all, inside its memory.
    pub fn check(&self) -> Result<(), ChunkError> {
        let mut end = 0;
        for r in &self.ddp {
            if !(r.start.is_multiple_of(4)
                && r.start >= end
                && r.start <= r.end
                && padded_len(r.end) <= self.xdr.len())
            {
                return Err(ChunkError::BadItem);
            }
            end = padded_len(r.end);
        }
        if let Some(s) = &self.shared
            && !(s.at.is_multiple_of(4)
                && s.at >= end
                && s.at <= self.xdr.len()
                && s.range.start <= s.range.end
                && s.range.end <= s.data.len()
                && u32::try_from(s.range.len()).is_ok())
        {
            return Err(ChunkError::BadItem);
        }
        Ok(())
    }

    /// Octets of the whole stream (the shared item and its padding in place).
    pub fn len(&self) -> usize {
        self.xdr.len()
            + self
                .shared
                .as_ref()
                .map_or(0, |s| padded_len(s.range.len()))
    }

    /// `true` for an empty stream.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the whole stream in order, as slices: the shared item's memory read in
    /// place (under its lock), nothing copied.
    pub fn with_parts<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        match &self.shared {
            None => f(&[&self.xdr]),
            Some(s) => {
                let g = s.data.read();
                let data = &g[s.range.clone()];
                let pad = &[0u8; 3][..pad_len(data.len())];
                f(&[&self.xdr[..s.at], data, pad, &self.xdr[s.at..]])
            }
        }
    }

    /// The whole stream in one vector (a copy of the shared item).
    pub fn to_whole(&self) -> Vec<u8> {
        self.with_parts(|p| p.concat())
    }

    /// Every item in `xdr`: the shared one copied into its place (for a transport that
    /// sends the stream whole).
    pub fn into_inline(self) -> Payload {
        match &self.shared {
            None => self,
            Some(s) => {
                let xdr = self.to_whole();
                let mut ddp = self.ddp;
                ddp.push(s.at..s.at + s.range.len());
                Payload {
                    xdr,
                    ddp,
                    shared: None,
                }
            }
        }
    }

    /// The reduced stream: `xdr` without the DDP-eligible items' data and padding
    /// (RFC 8166 §3.4.4, RPCRDMA-14, RPCRDMA-18; the shared item is never in it). Without
    /// items, `xdr` itself.
    pub fn reduced(&self) -> Vec<u8> {
        reduce_all(&self.xdr, &self.ddp)
    }
}

/// `xdr` without the octets [`removed`] names for each of `items` (in order, not
/// overlapping).
pub fn reduce_all(xdr: &[u8], items: &[Range<usize>]) -> Vec<u8> {
    let mut v = Vec::with_capacity(xdr.len());
    let mut at = 0;
    for r in items {
        let cut = removed(xdr.len(), r);
        v.extend_from_slice(&xdr[at.min(cut.start)..cut.start]);
        at = at.max(cut.end);
    }
    v.extend_from_slice(&xdr[at.min(xdr.len())..]);
    v
}

/// The octets a reduction takes out of a stream of `len` octets for the DDP-eligible data
/// `ddp`: the data and its XDR padding (RFC 8166 §3.4.4, RPCRDMA-18); the length word stays.
pub fn removed(len: usize, ddp: &Range<usize>) -> Range<usize> {
    ddp.start.min(len)..padded_len(ddp.end).min(len)
}

/// A chunk list that does not fit the stream it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A Read chunk's Position lies past the end of the stream, before the previous chunk's
    /// end, or off a 4-octet boundary.
    #[error("a chunk's position does not fit the payload stream")]
    BadPosition,
    /// The reconstructed message would exceed the limit.
    #[error("the message with its chunks exceeds the limit")]
    TooLarge,
    /// A DDP-eligible range that is not an XDR item.
    #[error("the DDP-eligible item is not 4-aligned inside the stream")]
    BadItem,
}

/// The receiver's reconstruction (RFC 8166 §3.4.5, RPCRDMA-22): the unreduced stream from the
/// reduced one and the chunks' data, each re-inserted at its Position in the unreduced
/// stream (in order of Position) followed by its XDR padding unless the chunk carried it.
/// At most `max` octets.
pub fn splice(reduced: &[u8], chunks: &[(u32, &[u8])], max: usize) -> Result<Vec<u8>, ChunkError> {
    splice_with(reduced, chunks, max, Vec::with_capacity)
}

/// [`splice`] into the empty vector `room` gives for the stream's length: a server builds
/// its calls in kept memory.
pub fn splice_with(
    reduced: &[u8],
    chunks: &[(u32, &[u8])],
    max: usize,
    room: impl FnOnce(usize) -> Vec<u8>,
) -> Result<Vec<u8>, ChunkError> {
    let total = chunks.iter().fold(reduced.len(), |n, (_, d)| {
        n.saturating_add(padded_len(d.len()))
    });
    if total > max {
        return Err(ChunkError::TooLarge);
    }
    let mut out = room(total);
    debug_assert!(out.is_empty());
    let mut src = 0;
    for &(pos, data) in chunks {
        let pos = pos as usize;
        if !pos.is_multiple_of(4) || pos < out.len() {
            return Err(ChunkError::BadPosition);
        }
        let take = pos - out.len();
        let piece = reduced
            .get(src..src + take)
            .ok_or(ChunkError::BadPosition)?;
        out.extend_from_slice(piece);
        src += take;
        out.extend_from_slice(data);
        out.resize(out.len() + pad_len(data.len()), 0);
    }
    out.extend_from_slice(&reduced[src..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 8166 §3.4.4's worked example: a 7-octet opaque at offset 0x80; the reduced stream
    /// keeps the length word, the chunk starts at 0x84.
    #[test]
    fn the_rfc_example_reduces_and_splices_back() {
        let head = vec![0xAB; 0x80];
        let mut p = Payload::with_opaque(head, b"1234567");
        p.xdr.extend_from_slice(&[9, 9, 9, 9]);
        assert_eq!(p.ddp, vec![0x84..0x8B]);
        assert_eq!(p.xdr.len(), 0x80 + 4 + 8 + 4);
        let r = p.reduced();
        assert_eq!(r.len(), 0x80 + 4 + 4);
        assert_eq!(&r[0x80..0x84], &[0, 0, 0, 7]);
        assert_eq!(&r[0x84..], &[9, 9, 9, 9]);
        let back = splice(&r, &[(0x84, b"1234567")], 1 << 20).unwrap();
        assert_eq!(back, p.xdr);
        // A chunk that carried its padding (RPCRDMA-25) splices the same way.
        let back = splice(&r, &[(0x84, b"1234567\0")], 1 << 20).unwrap();
        assert_eq!(back, p.xdr);
    }

    #[test]
    fn positions_that_do_not_fit_are_refused() {
        let r = vec![0u8; 16];
        assert_eq!(splice(&r, &[(2, b"x")], 100), Err(ChunkError::BadPosition));
        assert_eq!(splice(&r, &[(20, b"x")], 100), Err(ChunkError::BadPosition));
        assert_eq!(
            splice(&r, &[(8, b"abcd"), (4, b"x")], 100),
            Err(ChunkError::BadPosition)
        );
        assert_eq!(
            splice(&r, &[(8, &[0; 100])], 100),
            Err(ChunkError::TooLarge)
        );
        assert_eq!(splice(&r, &[(16, b"z")], 100).unwrap().len(), 20);
        let bad = Payload {
            xdr: vec![0; 8],
            ddp: std::iter::once(2..4).collect(),
            shared: None,
        };
        assert_eq!(bad.check(), Err(ChunkError::BadItem));
        // Out of order, or inside the previous item's padding.
        let bad = Payload {
            xdr: vec![0; 16],
            ddp: vec![8..9, 0..4],
            shared: None,
        };
        assert_eq!(bad.check(), Err(ChunkError::BadItem));
        let bad = Payload {
            xdr: vec![0; 16],
            ddp: vec![0..1, 0..4],
            shared: None,
        };
        assert_eq!(bad.check(), Err(ChunkError::BadItem));
    }

    /// A shared item: the whole stream has it (and its padding) in place, read where it
    /// is; inline, it becomes the last ordinary item; it must come after every other one.
    #[test]
    fn a_shared_item_is_whole_in_place_and_checked() {
        let mem = Buffer::adopt((0u8..20).collect());
        let mut p = Payload::with_opaque(vec![1; 4], b"ab");
        p.push_xdr(&[2; 4]);
        let mut q = Payload::with_shared(std::mem::take(&mut p.xdr), mem.clone(), 5..10);
        q.ddp = p.ddp.clone();
        q.push_xdr(&[3; 4]);
        assert_eq!(q.check(), Ok(()));
        let mut want = vec![
            1, 1, 1, 1, 0, 0, 0, 2, b'a', b'b', 0, 0, 2, 2, 2, 2, 0, 0, 0, 5,
        ];
        want.extend_from_slice(&[5, 6, 7, 8, 9, 0, 0, 0, 3, 3, 3, 3]);
        assert_eq!(q.to_whole(), want);
        assert_eq!(q.len(), want.len());
        assert_eq!(q.with_parts(|p| p.len()), 4);
        // The reduced stream never holds it; inline, it is the second item.
        assert_eq!(
            q.reduced(),
            [&want[..8], &want[12..20], &want[28..]].concat()
        );
        let inl = q.clone().into_inline();
        assert_eq!(inl.xdr, want);
        assert_eq!(inl.ddp, vec![8..10, 20..25]);
        assert_eq!(inl.shared, None);
        assert_eq!(inl.check(), Ok(()));
        // Before an ordinary item, off a word, or past its memory: refused.
        for bad in [
            Shared {
                at: 4,
                ..q.shared.clone().unwrap()
            },
            Shared {
                at: 18,
                ..q.shared.clone().unwrap()
            },
            Shared {
                range: 15..21,
                ..q.shared.clone().unwrap()
            },
        ] {
            let b = Payload {
                shared: Some(bad),
                ..q.clone()
            };
            assert_eq!(b.check(), Err(ChunkError::BadItem));
        }
    }

    proptest! {
        /// Reducing any item and splicing its data back gives the stream again.
        #[test]
        fn reduce_then_splice_is_identity(
            head in 0usize..40,
            data in prop::collection::vec(any::<u8>(), 0..50),
            tail in 0usize..10,
        ) {
            let mut p = Payload::with_opaque(vec![1; head * 4], &data);
            p.xdr.extend(std::iter::repeat_n(2, tail * 4));
            prop_assert!(p.check().is_ok());
            let pos = p.ddp[0].start as u32;
            let back = splice(&p.reduced(), &[(pos, &data)], 1 << 20).unwrap();
            prop_assert_eq!(back, p.xdr);
        }

        /// Several items: reduced together, spliced back together (each at its Position in
        /// the unreduced stream).
        #[test]
        fn several_items_reduce_and_splice_back(
            items in prop::collection::vec(
                (0usize..5, prop::collection::vec(any::<u8>(), 0..30)), 0..4),
            tail in 0usize..3,
        ) {
            let mut p = Payload::default();
            for (words, data) in &items {
                p.push_xdr(&vec![3; words * 4]).push_opaque(data);
            }
            p.push_xdr(&vec![4; tail * 4]);
            prop_assert!(p.check().is_ok());
            let parts: Vec<(u32, &[u8])> = p
                .ddp
                .iter()
                .map(|r| (r.start as u32, &p.xdr[r.clone()]))
                .collect();
            let back = splice(&p.reduced(), &parts, 1 << 20).unwrap();
            prop_assert_eq!(back, p.xdr.clone());
        }
    }
}
