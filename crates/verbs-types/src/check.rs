//! The work-request core both engines share: post-time validation of send and receive
//! requests and the checked scatter/gather list they carry afterwards.
//!
//! What is checked here holds on every transport: the SGE count against the QP's limit,
//! the message length against the transport's largest message, `INLINE` (never on an
//! operation that returns data, never above the QP's limit), the shape of an atomic (one
//! 8-octet entry, an 8-byte aligned remote address: IBA 9.4.5, RFC 7306 §5) and every
//! entry's L_Key through `KeyTable::check_local` (sinks need `LOCAL_WRITE`). Each engine
//! adds only its transport's rules (which opcodes a QP type may post, UD destinations,
//! the ORD, queue depth).

use smallvec::SmallVec;
use softrdma_memory::{Access, AccessError, KeyTable, PdId, Target, TxSink};

use crate::{PostError, RecvWr, SendFlags, SendWr, UdDest, WrOpcode};

/// A scatter/gather list whose entries passed `KeyTable::check_local`. The memory crate
/// re-validates every grant on each copy, so a key revoked after posting fails the copy
/// instead of being touched. A message offset walks the entries in order (C9-26).
#[derive(Clone, Debug, Default)]
pub struct Sgl {
    /// Most requests name one or two entries: no allocation for them.
    entries: SmallVec<[Target; 2]>,
    len: u64,
}

impl Sgl {
    /// The checked entries, in order.
    pub fn entries(&self) -> &[Target] {
        &self.entries
    }

    /// The first entry (the sink of a Read or an atomic).
    pub fn first(&self) -> Option<&Target> {
        self.entries.first()
    }

    /// Total octets the list covers.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// `true` when the list covers no octet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f(entry, entry offset, octets)` over the pieces of `len` octets from message
    /// offset `off`, in order: `Bounds` if the list ends first.
    fn walk(
        &self,
        mut off: u64,
        len: usize,
        mut f: impl FnMut(&Target, usize, usize) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        let mut left = len;
        for t in &self.entries {
            if left == 0 {
                break;
            }
            let tl = t.len() as u64;
            if off >= tl {
                off -= tl;
                continue;
            }
            let n = ((tl - off) as usize).min(left);
            f(t, off as usize, n)?;
            left -= n;
            off = 0;
        }
        if left == 0 {
            Ok(())
        } else {
            Err(AccessError::Bounds)
        }
    }

    /// Places `data` at message offset `off`: `Bounds` if the list ends first, the memory
    /// crate's error if an entry's key was revoked.
    pub fn scatter(&self, off: u64, data: &[u8]) -> Result<(), AccessError> {
        let mut at = 0;
        self.walk(off, data.len(), |t, o, n| {
            t.place(o, &data[at..at + n])?;
            at += n;
            Ok(())
        })
    }

    /// Appends the pieces (entry, entry offset, octets) of `len` octets from message offset
    /// `off` to `out`, in order: `Bounds` if the list ends first (where a payload is read
    /// into straight from a socket).
    pub fn pieces<A: smallvec::Array<Item = (Target, usize, usize)>>(
        &self,
        off: u64,
        len: usize,
        out: &mut SmallVec<A>,
    ) -> Result<(), AccessError> {
        self.walk(off, len, |t, o, n| {
            out.push((t.clone(), o, n));
            Ok(())
        })
    }

    /// Fills `out` from message offset `off`: `Bounds` if the list ends first.
    pub fn gather(&self, off: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let mut at = 0;
        self.walk(off, out.len(), |t, o, n| {
            t.copy_out(o, &mut out[at..at + n])?;
            at += n;
            Ok(())
        })
    }

    /// Appends `len` octets from message offset `off` to `out`, copied or referenced as the
    /// sink does it; `out` is as it was on error.
    pub fn gather_into<S: TxSink + ?Sized>(
        &self,
        off: u64,
        len: usize,
        out: &mut S,
    ) -> Result<(), AccessError> {
        let m = out.mark();
        let r = self.walk(off, len, |t, o, n| out.gather(t, o, n));
        if r.is_err() {
            out.rewind(m);
        }
        r
    }
}

/// The source octets of a send request: checked entries, or the octets an `INLINE` request
/// had when it was posted.
#[derive(Clone, Debug)]
pub enum Payload {
    /// Gathered from registered memory when sent.
    Sgl(Sgl),
    /// Copied at post time.
    Inline(crate::InlineBuf),
}

impl Payload {
    /// Fills `out` from message offset `off`.
    pub fn gather(&self, off: u64, out: &mut [u8]) -> Result<(), AccessError> {
        match self {
            Payload::Sgl(s) => s.gather(off, out),
            Payload::Inline(v) => {
                out.copy_from_slice(inline_at(v, off, out.len())?);
                Ok(())
            }
        }
    }

    /// Appends `len` octets from message offset `off` to `out`, copied once (no zeroing
    /// first); `out` is as it was on error.
    pub fn gather_extend(
        &self,
        off: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessError> {
        out.reserve(len);
        self.gather_into(off, len, out)
    }

    /// Appends `len` octets from message offset `off` to `out`: registered memory as the
    /// sink takes it (see [`Sgl::gather_into`]), inline octets copied.
    pub fn gather_into<S: TxSink + ?Sized>(
        &self,
        off: u64,
        len: usize,
        out: &mut S,
    ) -> Result<(), AccessError> {
        match self {
            Payload::Sgl(s) => s.gather_into(off, len, out),
            Payload::Inline(v) => {
                out.staged().extend_from_slice(inline_at(v, off, len)?);
                Ok(())
            }
        }
    }

    /// The checked entries (`None` for inline octets).
    pub fn sgl(&self) -> Option<&Sgl> {
        match self {
            Payload::Sgl(s) => Some(s),
            Payload::Inline(_) => None,
        }
    }
}

/// `len` inline octets from message offset `off`: `Bounds` past their end.
fn inline_at(v: &[u8], off: u64, len: usize) -> Result<&[u8], AccessError> {
    usize::try_from(off)
        .ok()
        .and_then(|o| v.get(o..o.checked_add(len)?))
        .ok_or(AccessError::Bounds)
}

/// The send-queue limits a QP checks at post time (`ibv_qp_cap` plus the transport's
/// largest message and Read sink shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// Scatter/gather entries per request.
    pub max_sge: u32,
    /// Entries of an RDMA Read's sink (iWARP names the sink with one STag: 1).
    pub max_read_sge: u32,
    /// Largest `INLINE` payload.
    pub max_inline: u32,
    /// Largest message: 2^32 − 1 on iWARP (RFC 5040 §5), 2^31 on InfiniBand (IBA 9.4).
    pub max_message: u64,
}

/// iWARP's largest message (RFC 5040 §5.1–§5.3: 32-bit lengths).
pub const IWARP_MAX_MESSAGE: u64 = u32::MAX as u64;
/// InfiniBand's largest message (IBA 9.4: DMA Length is 32 bits, verbs cap it at 2^31).
pub const IB_MAX_MESSAGE: u64 = 1 << 31;

/// A send request that passed [`check_send`].
#[derive(Clone, Debug)]
pub struct CheckedSend {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// Signaled, solicited, fence, inline.
    pub flags: SendFlags,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// Message length in octets.
    pub len: u32,
    /// Where the octets come from (Send, Write) or go (Read, atomic: always entries).
    pub payload: Payload,
    /// The first entry as posted (a Read's sink STag and offset name it on iWARP).
    pub first_sge: Option<crate::Sge>,
}

impl CheckedSend {
    /// A flushed completion for this request.
    pub fn flushed(&self) -> crate::WorkCompletion {
        crate::WorkCompletion::new(
            self.wr_id,
            crate::WcStatus::WorkRequestFlushed,
            self.opcode.wc_opcode(),
            0,
        )
    }

    /// The request asked for a completion on success.
    pub fn signaled(&self) -> bool {
        self.flags.contains(SendFlags::SIGNALED)
    }
}

/// Checks a send request with every rule common to the transports (see the module docs);
/// copies `INLINE` octets now, so the caller may reuse its buffers at once.
pub fn check_send(
    mut wr: SendWr,
    lim: &SendLimits,
    keys: &KeyTable,
    pd: PdId,
) -> Result<CheckedSend, PostError> {
    if wr.opcode.is_local() {
        // Nothing to gather: entries and INLINE mean nothing here (as rdma-core's providers).
        return Ok(CheckedSend {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags.without(SendFlags::INLINE),
            ud: wr.ud,
            len: 0,
            payload: Payload::Inline(Default::default()),
            first_sge: None,
        });
    }
    let sink = wr.opcode.is_read_or_atomic();
    let is_read = matches!(wr.opcode, WrOpcode::RdmaRead { .. });
    let max_sge = if is_read {
        lim.max_read_sge.min(lim.max_sge)
    } else {
        lim.max_sge
    } as usize;
    if wr.sg_list.len() > max_sge {
        return Err(PostError::TooManySge { max: max_sge });
    }
    if wr.inline.is_some() {
        wr.flags |= SendFlags::INLINE;
    }
    let inline = wr.flags.contains(SendFlags::INLINE);
    // Octets given inline, with no entries: the message itself.
    let given = match &wr.inline {
        Some(b) if wr.sg_list.is_empty() => b.len() as u64,
        _ => 0,
    };
    let total: u64 = given + wr.sg_list.iter().map(|s| u64::from(s.length)).sum::<u64>();
    if total > lim.max_message.min(u64::from(u32::MAX)) {
        return Err(PostError::MessageTooLong);
    }
    let len = total as u32;
    if let WrOpcode::AtomicCmpSwap { remote_addr, .. }
    | WrOpcode::AtomicFetchAdd { remote_addr, .. } = wr.opcode
        && (wr.sg_list.len() != 1 || len != 8 || !remote_addr.is_multiple_of(8))
    {
        return Err(PostError::AtomicShape);
    }
    if inline && (sink || len > lim.max_inline) {
        return Err(PostError::Inline {
            max: lim.max_inline,
        });
    }
    let need = if sink {
        Access::LOCAL_WRITE
    } else {
        Access::empty()
    };
    let sgl = check_entries(&wr.sg_list, keys, pd, need)?;
    let payload = if inline {
        let mut bytes = wr.inline.take().unwrap_or_default();
        if !wr.sg_list.is_empty() {
            let v = bytes.as_mut_vec();
            v.clear();
            v.resize(len as usize, 0);
            sgl.gather(0, v)
                .map_err(|error| PostError::LocalProtection { sge: 0, error })?;
        }
        Payload::Inline(bytes)
    } else {
        Payload::Sgl(sgl)
    };
    Ok(CheckedSend {
        wr_id: wr.wr_id,
        opcode: wr.opcode,
        flags: wr.flags,
        ud: wr.ud,
        len,
        payload,
        first_sge: wr.sg_list.first().copied(),
    })
}

/// A receive request that passed [`check_recv`].
#[derive(Clone, Debug)]
pub struct CheckedRecv {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an inbound message is placed.
    pub sgl: Sgl,
}

impl CheckedRecv {
    /// A flushed completion for this request.
    pub fn flushed(&self) -> crate::WorkCompletion {
        crate::WorkCompletion::new(
            self.wr_id,
            crate::WcStatus::WorkRequestFlushed,
            crate::WcOpcode::Recv,
            0,
        )
    }
}

/// Checks a receive request: at most `max_sge` entries, each writable (`LOCAL_WRITE`).
pub fn check_recv(
    wr: RecvWr,
    max_sge: u32,
    keys: &KeyTable,
    pd: PdId,
) -> Result<CheckedRecv, PostError> {
    if wr.sg_list.len() > max_sge as usize {
        return Err(PostError::TooManySge {
            max: max_sge as usize,
        });
    }
    Ok(CheckedRecv {
        wr_id: wr.wr_id,
        sgl: check_entries(&wr.sg_list, keys, pd, Access::LOCAL_WRITE)?,
    })
}

fn check_entries(
    sges: &[crate::Sge],
    keys: &KeyTable,
    pd: PdId,
    need: Access,
) -> Result<Sgl, PostError> {
    let mut entries = SmallVec::with_capacity(sges.len());
    let mut len = 0u64;
    for (i, s) in sges.iter().enumerate() {
        let t = keys
            .check_local(s.lkey, pd, need, s.addr, u64::from(s.length))
            .map_err(|error| PostError::LocalProtection { sge: i, error })?;
        len += t.len() as u64;
        entries.push(t);
    }
    Ok(Sgl { entries, len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sge;
    use softrdma_memory::{Buffer, Key};

    fn setup() -> (KeyTable, Key, Key) {
        let keys = KeyTable::new();
        let a = keys
            .reg_mr(
                PdId(1),
                Buffer::from_vec((0..64u8).collect()),
                0,
                64,
                0,
                Access::LOCAL_WRITE,
            )
            .unwrap();
        let ro = keys
            .reg_mr(
                PdId(1),
                Buffer::from_vec(vec![7; 16]),
                0,
                16,
                0x1000,
                Access::empty(),
            )
            .unwrap();
        (keys, a, ro)
    }

    const LIM: SendLimits = SendLimits {
        max_sge: 4,
        max_read_sge: 1,
        max_inline: 8,
        max_message: IWARP_MAX_MESSAGE,
    };

    #[test]
    fn gather_and_scatter_walk_entries_in_order() {
        let (keys, a, _) = setup();
        let wr = SendWr::send(
            1,
            vec![Sge::new(a, 10, 3), Sge::new(a, 0, 0), Sge::new(a, 40, 4)],
        );
        let c = check_send(wr, &LIM, &keys, PdId(1)).unwrap();
        assert_eq!(c.len, 7);
        let mut out = [0u8; 5];
        c.payload.gather(1, &mut out).unwrap();
        assert_eq!(out, [11, 12, 40, 41, 42]);
        let mut too_far = [0u8; 2];
        assert_eq!(c.payload.gather(6, &mut too_far), Err(AccessError::Bounds));
        // A send's entries are read-only grants; a receive's are writable.
        assert_eq!(
            c.payload.sgl().unwrap().scatter(0, &[1]),
            Err(AccessError::Rights)
        );
        let r = RecvWr::new(
            2,
            vec![Sge::new(a, 10, 3), Sge::new(a, 0, 0), Sge::new(a, 40, 4)],
        );
        let sgl = check_recv(r, 4, &keys, PdId(1)).unwrap().sgl;
        sgl.scatter(2, &[0xAA, 0xBB]).unwrap();
        let mut back = [0u8; 7];
        sgl.gather(0, &mut back).unwrap();
        assert_eq!(back, [10, 11, 0xAA, 0xBB, 41, 42, 43]);
        assert_eq!(sgl.scatter(6, &[1, 2]), Err(AccessError::Bounds));
    }

    #[test]
    fn inline_is_copied_at_post_and_limited() {
        let (keys, a, _) = setup();
        let wr = SendWr::send(1, vec![Sge::new(a, 0, 8)]).with_flags(SendFlags::INLINE);
        let c = check_send(wr, &LIM, &keys, PdId(1)).unwrap();
        keys.dereg_mr(a).unwrap();
        let mut out = [0u8; 8];
        c.payload.gather(0, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 7]);
        let (keys, a, _) = setup();
        let big = SendWr::send(1, vec![Sge::new(a, 0, 9)]).with_flags(SendFlags::INLINE);
        assert_eq!(
            check_send(big, &LIM, &keys, PdId(1)).unwrap_err(),
            PostError::Inline { max: 8 }
        );
        let read =
            SendWr::read(1, Some(Sge::new(a, 0, 4)), Key(1), 0).with_flags(SendFlags::INLINE);
        assert!(matches!(
            check_send(read, &LIM, &keys, PdId(1)),
            Err(PostError::Inline { .. })
        ));
    }

    #[test]
    fn sge_count_length_atomic_shape_and_access() {
        let (keys, a, ro) = setup();
        let five = SendWr::send(1, vec![Sge::new(a, 0, 1); 5]);
        assert_eq!(
            check_send(five, &LIM, &keys, PdId(1)).unwrap_err(),
            PostError::TooManySge { max: 4 }
        );
        let two_sink = SendWr {
            sg_list: [Sge::new(a, 0, 1); 2].into_iter().collect(),
            ..SendWr::read(1, None, Key(1), 0)
        };
        assert_eq!(
            check_send(two_sink, &LIM, &keys, PdId(1)).unwrap_err(),
            PostError::TooManySge { max: 1 }
        );
        let huge = SendWr::send(1, vec![Sge::new(a, 0, u32::MAX), Sge::new(a, 0, 1)]);
        assert_eq!(
            check_send(huge, &LIM, &keys, PdId(1)).unwrap_err(),
            PostError::MessageTooLong
        );
        let ib = SendLimits {
            max_message: IB_MAX_MESSAGE,
            ..LIM
        };
        let over = SendWr::send(1, vec![Sge::new(a, 0, (1 << 31) + 1)]);
        assert_eq!(
            check_send(over, &ib, &keys, PdId(1)).unwrap_err(),
            PostError::MessageTooLong
        );
        for wr in [
            SendWr::fetch_add(1, Sge::new(a, 0, 4), Key(1), 0, 1),
            SendWr::fetch_add(1, Sge::new(a, 0, 8), Key(1), 4, 1),
            SendWr::cmp_swap(1, Sge::new(a, 0, 8), Key(1), 12, 0, 1),
        ] {
            assert_eq!(
                check_send(wr, &LIM, &keys, PdId(1)).unwrap_err(),
                PostError::AtomicShape
            );
        }
        let ok = SendWr::fetch_add(1, Sge::new(a, 0, 8), Key(1), 16, 1);
        assert!(check_send(ok, &LIM, &keys, PdId(1)).is_ok());
        // A sink must be writable; a source need not be.
        let into_ro = SendWr::read(1, Some(Sge::new(ro, 0x1000, 4)), Key(1), 0);
        assert!(matches!(
            check_send(into_ro, &LIM, &keys, PdId(1)),
            Err(PostError::LocalProtection {
                sge: 0,
                error: AccessError::Rights
            })
        ));
        let from_ro = SendWr::send(1, vec![Sge::new(a, 0, 1), Sge::new(ro, 0x1000, 16)]);
        assert!(check_send(from_ro, &LIM, &keys, PdId(1)).is_ok());
        let wrong_pd = SendWr::send(1, vec![Sge::new(a, 0, 1)]);
        assert!(matches!(
            check_send(wrong_pd, &LIM, &keys, PdId(2)),
            Err(PostError::LocalProtection { sge: 0, .. })
        ));
    }

    #[test]
    fn receives_need_writable_entries() {
        let (keys, a, ro) = setup();
        let r = check_recv(RecvWr::new(3, vec![Sge::new(a, 0, 64)]), 2, &keys, PdId(1)).unwrap();
        assert_eq!(r.sgl.len(), 64);
        assert_eq!(r.flushed().wr_id, 3);
        assert!(matches!(
            check_recv(
                RecvWr::new(3, vec![Sge::new(ro, 0x1000, 1)]),
                2,
                &keys,
                PdId(1)
            ),
            Err(PostError::LocalProtection {
                sge: 0,
                error: AccessError::Rights
            })
        ));
        assert_eq!(
            check_recv(
                RecvWr::new(3, vec![Sge::new(a, 0, 1); 3]),
                2,
                &keys,
                PdId(1)
            )
            .unwrap_err(),
            PostError::TooManySge { max: 2 }
        );
    }
}
