//! Transmit sinks: where a transmit path puts the octets it sends. A `Vec<u8>` copies
//! everything; a [`TxBuf`] copies headers and small payloads and keeps large payloads as
//! references to registered memory, written to the socket with one vectored write
//! (`writev`/`sendmsg`) straight from the region: no user-space copy of the payload.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::AccessError;
use crate::buffer::BufferReadGuard;
use crate::table::Target;

/// A position in a [`TxSink`], to measure from or rewind to; good until the sink is next
/// written out ([`TxBuf::write_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxMark {
    /// Logical length (octets) at the mark.
    len: usize,
    /// Length of the staged octets.
    staged: usize,
    /// Pieces recorded since the sink was made (a [`TxBuf`]; 0 for a `Vec`).
    pieces: usize,
    /// Staged octets already closed into pieces (a [`TxBuf`]).
    sealed: usize,
}

impl TxMark {
    /// Octets the sink held at the mark.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a mark at an empty sink.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index in [`TxSink::staged`] the mark was taken at.
    pub fn staged(&self) -> usize {
        self.staged
    }
}

/// Where a transmit path writes: headers go into [`staged`](Self::staged) octets, payload
/// from registered memory through [`gather`](Self::gather), which copies or keeps a
/// reference.
pub trait TxSink {
    /// The octets written in place (headers, trailers, small payloads). What is appended
    /// here follows everything gathered before, in order.
    fn staged(&mut self) -> &mut Vec<u8>;
    /// Appends `len` octets at `at` of `src` (copied, or referenced until written).
    fn gather(&mut self, src: &Target, at: usize, len: usize) -> Result<(), AccessError>;
    /// Octets held, staged and gathered.
    fn len(&self) -> usize;
    /// `true` when nothing is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The current position.
    fn mark(&self) -> TxMark;
    /// Drops everything appended after `m`.
    fn rewind(&mut self, m: TxMark);
    /// Runs `f` over the octets appended since `m`, in order (a CRC over them).
    fn for_each_since(&self, m: TxMark, f: &mut dyn FnMut(&[u8])) -> Result<(), AccessError>;
}

impl TxSink for Vec<u8> {
    fn staged(&mut self) -> &mut Vec<u8> {
        self
    }

    fn gather(&mut self, src: &Target, at: usize, len: usize) -> Result<(), AccessError> {
        src.read_with(at, len, |s| self.extend_from_slice(s))
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn mark(&self) -> TxMark {
        TxMark {
            len: Vec::len(self),
            staged: Vec::len(self),
            pieces: 0,
            sealed: 0,
        }
    }

    fn rewind(&mut self, m: TxMark) {
        self.truncate(m.staged);
    }

    fn for_each_since(&self, m: TxMark, f: &mut dyn FnMut(&[u8])) -> Result<(), AccessError> {
        f(self.get(m.staged..).unwrap_or_default());
        Ok(())
    }
}

/// Largest number of slices one [`TxBuf::write_with`] hands over (Linux `IOV_MAX`).
pub const MAX_IOV: usize = 1024;

/// Payloads shorter than this are copied by default: a reference costs an iovec, a lock and
/// a re-validation at write time, more than copying a few hundred octets.
pub const DEFAULT_MIN_REFERENCE: usize = 512;

#[derive(Clone, Debug)]
enum Piece {
    /// `staged[start..end]`.
    Staged { start: usize, end: usize },
    /// Octets of registered memory, read when written.
    Mem { src: Target, at: usize, len: usize },
    /// A tag passed once every octet before it is written.
    Tag(u64),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Staged { start, end } => end - start,
            Piece::Mem { len, .. } => *len,
            Piece::Tag(_) => 0,
        }
    }
}

/// A transmit queue of octets and references to registered memory, drained by vectored
/// writes ([`write_with`](Self::write_with)).
///
/// A reference is checked like every access to registered memory: when it is gathered (the
/// range, the rights) and again under the table lock when it is written
/// ([`AccessError::Invalidated`] once its key was revoked — the octets before it are then
/// out, the stream is cut short, and the caller must fail the connection). The memory is
/// read when the kernel takes it, so whoever posted it must leave it alone until then: a
/// send completes once its last octet is written (RFC 5040 §5.5, RDMAP-80), which is what
/// the [tags](Self::push_tag) are for.
#[derive(Debug, Default)]
pub struct TxBuf {
    staged: Vec<u8>,
    /// Staged octets already recorded in `pieces`; `staged[sealed..]` is an implicit last
    /// piece.
    sealed: usize,
    pieces: VecDeque<Piece>,
    /// Octets of the front piece already written.
    head: usize,
    /// Octets in `pieces` not yet written (the implicit tail not counted).
    piece_len: usize,
    /// Pieces written and dropped since the queue was made: marks count pieces from there.
    popped: usize,
    /// References among `pieces`.
    refs: usize,
    min_reference: usize,
    /// The last tag written past.
    passed: Option<u64>,
}

impl TxBuf {
    /// An empty queue that references payloads of [`DEFAULT_MIN_REFERENCE`] octets or more.
    pub fn new() -> TxBuf {
        TxBuf {
            min_reference: DEFAULT_MIN_REFERENCE,
            ..TxBuf::default()
        }
    }

    /// Payloads shorter than `n` octets are copied (`usize::MAX`: copy everything).
    pub fn with_min_reference(mut self, n: usize) -> TxBuf {
        self.min_reference = n.max(1);
        self
    }

    /// References to registered memory not yet written.
    pub fn references(&self) -> usize {
        self.refs
    }

    /// Records `tag` here: [`take_passed`](Self::take_passed) returns it once everything
    /// appended before it is written.
    pub fn push_tag(&mut self, tag: u64) {
        if self.len() == 0 {
            self.passed = Some(tag);
            return;
        }
        self.close_tail();
        self.pieces.push_back(Piece::Tag(tag));
    }

    /// Nothing queued and no tag to hand over: one idle queue is as good as another of the
    /// same settings.
    pub fn is_idle(&self) -> bool {
        self.pieces.is_empty() && self.staged.is_empty() && self.passed.is_none()
    }

    /// The last tag written past since the previous call.
    pub fn take_passed(&mut self) -> Option<u64> {
        self.passed.take()
    }

    /// Drops everything (the connection is gone). Tags are not passed.
    pub fn clear(&mut self) {
        self.staged.clear();
        self.sealed = 0;
        self.popped += self.pieces.len();
        self.pieces.clear();
        self.head = 0;
        self.piece_len = 0;
        self.refs = 0;
    }

    fn close_tail(&mut self) {
        if self.staged.len() > self.sealed {
            self.pieces.push_back(Piece::Staged {
                start: self.sealed,
                end: self.staged.len(),
            });
            self.piece_len += self.staged.len() - self.sealed;
            self.sealed = self.staged.len();
        }
    }

    /// Hands the front of the queue to `write` as at most [`MAX_IOV`] slices, the
    /// referenced memory re-validated, then read-locked meanwhile; consumes what `write`
    /// reports written. `Ok(None)` when the queue is empty (`write` not called);
    /// `Err(Ok(e))` for `write`'s error, `Err(Err(e))` when a reference at the front is no
    /// longer valid (nothing is written then).
    pub fn write_with<E>(
        &mut self,
        write: impl FnOnce(&[IoSlice<'_>]) -> Result<usize, E>,
    ) -> Result<Option<usize>, Result<E, AccessError>> {
        if self.len() == 0 {
            return Ok(None);
        }
        self.close_tail();
        let n = {
            // Pieces handed over: up to MAX_IOV non-empty ones.
            let mut take = 0;
            let mut iovs = 0;
            for p in &self.pieces {
                if iovs == MAX_IOV {
                    break;
                }
                take += 1;
                if p.len() > 0 {
                    iovs += 1;
                }
            }
            let front = self.pieces.range(..take);
            // Buffers, each locked once, in address order (placement locks one buffer at a
            // time and never a buffer under the table lock), then their tables.
            // On the stack for the usual few buffers and slices: a post allocates nothing.
            let mut buffers: SmallVec<[&Arc<crate::Buffer>; 4]> = SmallVec::new();
            let mut tables: SmallVec<[_; 4]> = SmallVec::new();
            for p in front.clone() {
                if let Piece::Mem { src, .. } = p {
                    buffers.push(src.buffer_arc());
                    tables.push(src.table_arc());
                }
            }
            buffers.sort_by_key(|b| Arc::as_ptr(b));
            buffers.dedup_by_key(|b| Arc::as_ptr(b));
            tables.sort_by_key(|t| Arc::as_ptr(t));
            tables.dedup_by_key(|t| Arc::as_ptr(t));
            let guards: SmallVec<[BufferReadGuard<'_>; 4]> =
                buffers.iter().map(|b| b.read()).collect();
            let table_guards: SmallVec<[_; 4]> = tables.iter().map(|t| t.read()).collect();
            let mut slices: SmallVec<[IoSlice<'_>; 32]> = SmallVec::with_capacity(iovs);
            for (i, p) in front.enumerate() {
                let skip = if i == 0 { self.head } else { 0 };
                let s: &[u8] = match p {
                    Piece::Staged { start, end } => &self.staged[start + skip..*end],
                    Piece::Mem { src, at, len } => {
                        let t = tables
                            .iter()
                            .position(|t| Arc::ptr_eq(t, src.table_arc()))
                            .expect("every table locked");
                        let r = src.checked_read(&table_guards[t], *at, *len).map_err(Err)?;
                        let b = buffers
                            .binary_search_by_key(&Arc::as_ptr(src.buffer_arc()), |b| {
                                Arc::as_ptr(b)
                            })
                            .expect("every buffer locked");
                        &guards[b][r.start + skip..r.end]
                    }
                    Piece::Tag(_) => continue,
                };
                if !s.is_empty() {
                    slices.push(IoSlice::new(s));
                }
            }
            // Validated: the tables go before the syscall. A write of a few hundred KiB
            // takes as long as a copy that size, and holding a context's key table
            // meanwhile made every registration in it wait for the socket (and, the lock
            // preferring writers, every other QP's access behind that). The buffers stay
            // read-locked, so what leaves is the memory as it was when validated; a region
            // revoked during the write is the work request racing its own deregistration,
            // which the verbs leave undefined (the octets already validated go out).
            drop(table_guards);
            write(&slices).map_err(Ok)?
        };
        self.consume(n);
        Ok(Some(n))
    }

    /// Drops `n` written octets from the front, passing tags on the way.
    fn consume(&mut self, mut n: usize) {
        while let Some(p) = self.pieces.front() {
            match p {
                Piece::Tag(t) => self.passed = Some(*t),
                _ => {
                    let left = p.len() - self.head;
                    if n < left {
                        self.head += n;
                        self.piece_len -= n;
                        break;
                    }
                    n -= left;
                    self.piece_len -= left;
                    if matches!(p, Piece::Mem { .. }) {
                        self.refs -= 1;
                    }
                }
            }
            self.head = 0;
            self.popped += 1;
            self.pieces.pop_front();
        }
        if self.pieces.is_empty() && self.sealed == self.staged.len() {
            self.staged.clear();
            self.sealed = 0;
        } else {
            self.compact();
        }
    }

    /// Moves the live staged octets to the front once 64 KiB have been written out of it.
    fn compact(&mut self) {
        let first = self
            .pieces
            .iter()
            .find_map(|p| match p {
                Piece::Staged { start, .. } => Some(*start),
                _ => None,
            })
            .unwrap_or(self.sealed);
        if first < 64 * 1024 {
            return;
        }
        self.staged.drain(..first);
        self.sealed -= first;
        for p in &mut self.pieces {
            if let Piece::Staged { start, end } = p {
                *start -= first;
                *end -= first;
            }
        }
    }
}

impl TxSink for TxBuf {
    fn staged(&mut self) -> &mut Vec<u8> {
        &mut self.staged
    }

    fn gather(&mut self, src: &Target, at: usize, len: usize) -> Result<(), AccessError> {
        if len < self.min_reference {
            return src.read_with(at, len, |s| self.staged.extend_from_slice(s));
        }
        src.check_read(at, len)?;
        self.close_tail();
        self.pieces.push_back(Piece::Mem {
            src: src.clone(),
            at,
            len,
        });
        self.piece_len += len;
        self.refs += 1;
        Ok(())
    }

    fn len(&self) -> usize {
        self.piece_len + (self.staged.len() - self.sealed)
    }

    fn mark(&self) -> TxMark {
        TxMark {
            len: self.len(),
            staged: self.staged.len(),
            pieces: self.popped + self.pieces.len(),
            sealed: self.sealed,
        }
    }

    fn rewind(&mut self, m: TxMark) {
        while self.popped + self.pieces.len() > m.pieces {
            match self.pieces.pop_back() {
                Some(p @ Piece::Mem { .. }) => {
                    self.refs -= 1;
                    self.piece_len -= p.len();
                }
                Some(p) => self.piece_len -= p.len(),
                None => break,
            }
        }
        self.staged.truncate(m.staged);
        self.sealed = m.sealed.min(self.staged.len());
    }

    fn for_each_since(&self, m: TxMark, f: &mut dyn FnMut(&[u8])) -> Result<(), AccessError> {
        // Pieces recorded after the mark, then the implicit tail; the implicit tail at the
        // mark was closed into the first piece after it, from `m.sealed` on.
        let first = m.pieces.saturating_sub(self.popped);
        for p in self.pieces.iter().skip(first) {
            match p {
                Piece::Staged { start, end } => {
                    let s = (*start).max(m.staged.min(*end));
                    f(&self.staged[s..*end]);
                }
                Piece::Mem { src, at, len } => src.read_with(*at, *len, |s| f(s))?,
                Piece::Tag(_) => {}
            }
        }
        f(&self.staged[self.sealed.max(m.staged)..]);
        Ok(())
    }
}

/// The first `n` octets of `iov` (all of it if shorter).
pub fn iov_prefix<'a>(iov: &'a [IoSlice<'_>], mut n: usize) -> SmallVec<[IoSlice<'a>; 8]> {
    let mut taken = SmallVec::new();
    for s in iov {
        if n == 0 {
            break;
        }
        let k = s.len().min(n);
        taken.push(IoSlice::new(&s[..k]));
        n -= k;
    }
    taken
}
