//! The responder's decisions, sans-IO: what a received message asks for (RFC 8166 §4.5 for
//! everything wrong with it), and how a result fills the segments a requester offered. The
//! connection code only carries them out; fuzz targets and property tests drive these.

use softrdma_wire::rpcrdma::{Body, Chunks, ErrorBody, Header, ReadSegment, Repr, Segment};

use crate::msg::peek;

/// The chunks a call offered for its reply, owned (they outlive the receive buffer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offered {
    /// The Write list: chunks of plain segments.
    pub writes: Vec<Vec<Segment>>,
    /// The Reply chunk.
    pub reply: Option<Vec<Segment>>,
    /// The one handle every segment of the call's chunks (Read, Write, Reply) shares, if
    /// there is exactly one: what a reply may invalidate with Send With Invalidate when
    /// the requester takes it (RFC 8797 §4.2; Linux `svc_rdma_get_inv_rkey`). Several
    /// handles, or none: nothing is invalidated remotely.
    pub invalidate: Option<u32>,
}

/// A call to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPlan {
    /// The call's xid (header and RPC message agree, RPCRDMA-38).
    pub xid: u32,
    /// A Long Call: the message is the Position-Zero Read chunk.
    pub long: bool,
    /// The inline (reduced) Payload stream; empty for a Long Call.
    pub payload: Vec<u8>,
    /// Read chunks to pull: Position and the segments, in list order.
    pub reads: Vec<(u32, Vec<ReadSegment>)>,
    /// Octets all Read chunks hold.
    pub read_len: usize,
    /// What the reply may use.
    pub offered: Offered,
}

/// What a message gets instead of being carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Nothing (RPCRDMA-56, -42, -61, -70).
    Discard,
    /// RDMA_ERROR / ERR_VERS (RPCRDMA-62).
    ErrVers,
    /// RDMA_ERROR / ERR_CHUNK (RPCRDMA-63, -69, -81).
    ErrChunk,
}

impl Refusal {
    /// The RDMA_ERROR answering `msg` (whose first 16 octets are readable), if any.
    pub fn answer(self, msg: &[u8], credits: u32) -> Option<Repr<'static>> {
        let h = Header::new_checked(msg).ok()?;
        match self {
            Refusal::Discard => None,
            Refusal::ErrVers => Some(Repr::err_vers(&h, credits)),
            Refusal::ErrChunk => Some(Repr::err_chunk(&h, credits)),
        }
    }
}

/// What the message `msg` from a requester asks for; no call message may exceed
/// `max_message` octets once its chunks are in.
pub fn plan_call(msg: &[u8], max_message: usize) -> Result<CallPlan, Refusal> {
    let h = Header::new_checked(msg).map_err(|_| Refusal::Discard)?; // RPCRDMA-56
    let (repr, hlen) = match Repr::parse(msg) {
        Ok(r) => r,
        Err(softrdma_wire::Error::Unknown {
            field: "rdma_vers", ..
        }) => return Err(Refusal::ErrVers),
        Err(_) if h.check_message_len().is_err() => return Err(Refusal::Discard),
        Err(_) => return Err(Refusal::ErrChunk),
    };
    let xid = repr.rdma_xid;
    let (chunks, long) = match &repr.body {
        Body::Msg(c) => (c, false),
        Body::NoMsg(c) => (c, true),
        Body::MsgP { .. } => return Err(Refusal::ErrChunk), // RPCRDMA-69
        _ => return Err(Refusal::Discard),                  // RPCRDMA-42, -70
    };
    let segs: Vec<ReadSegment> = chunks.read_list.iter().collect();
    let payload = if long {
        Vec::new()
    } else {
        msg.get(hlen..).unwrap_or(&[]).to_vec()
    };
    // A Long Call is a Position-Zero Read chunk and nothing else (RPCRDMA-32, -41); an
    // RDMA_MSG's payload carries the call's xid (RPCRDMA-38) and no Position-Zero chunk.
    if long && (segs.is_empty() || segs.iter().any(|s| s.position != 0)) {
        return Err(Refusal::ErrChunk);
    }
    if !long && (peek(&payload) != Some((xid, false)) || segs.iter().any(|s| s.position == 0)) {
        return Err(Refusal::ErrChunk);
    }
    let read_len = segs
        .iter()
        .fold(0usize, |n, s| n.saturating_add(s.length as usize));
    if read_len > max_message || payload.len().saturating_add(read_len) > max_message {
        return Err(Refusal::ErrChunk); // RPCRDMA-81
    }
    // One chunk per Position, segments in list order (RPCRDMA-20, -22); Positions rise.
    let mut reads: Vec<(u32, Vec<ReadSegment>)> = Vec::new();
    for s in segs {
        match reads.last_mut() {
            Some((p, v)) if *p == s.position => v.push(s),
            Some((p, _)) if *p > s.position => return Err(Refusal::ErrChunk),
            _ => reads.push((s.position, vec![s])),
        }
    }
    let mut offered = Offered {
        writes: chunks
            .write_list
            .iter()
            .map(|c| c.iter().collect())
            .collect(),
        reply: chunks.reply_chunk.as_ref().map(|c| c.iter().collect()),
        invalidate: None,
    };
    offered.invalidate = one_handle(
        reads
            .iter()
            .flat_map(|(_, v)| v.iter().map(|s| s.handle))
            .chain(offered.writes.iter().flatten().map(|s| s.handle))
            .chain(offered.reply.iter().flatten().map(|s| s.handle)),
    );
    Ok(CallPlan {
        xid,
        long,
        payload,
        reads,
        read_len,
        offered,
    })
}

/// The handle all of `handles` are, if they are one (and there is at least one).
fn one_handle(mut handles: impl Iterator<Item = u32>) -> Option<u32> {
    let first = handles.next()?;
    handles.all(|h| h == first).then_some(first)
}

/// How `len` octets fill `segs` in order (RPCRDMA-27): each segment with the octets it gets
/// (never more than it offered, RPCRDMA-28), or `None` if they hold less than `len`.
pub fn fill(len: usize, segs: &[Segment]) -> Option<Vec<Segment>> {
    let room = segs
        .iter()
        .fold(0usize, |n, s| n.saturating_add(s.length as usize));
    if room < len {
        return None;
    }
    let mut left = len;
    Some(
        segs.iter()
            .map(|s| {
                let n = (s.length as usize).min(left);
                left -= n;
                Segment {
                    length: n as u32,
                    ..*s
                }
            })
            .collect(),
    )
}

/// Memory a call offered the responder: the one segment of a Write or Reply chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lent {
    /// Its handle (R_Key / STag).
    pub handle: u32,
    /// Its offset (address).
    pub offset: u64,
    /// Octets offered.
    pub len: usize,
}

/// How a reply came (RFC 8166 §3.5), checked against what its call offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyForm {
    /// The RPC reply is the message from octet `at` on; `write`: octets of the DDP-eligible
    /// result in our Write chunk.
    Inline {
        /// Where the RPC reply starts.
        at: usize,
        /// Octets written into our Write chunk.
        write: Option<usize>,
    },
    /// A Long Reply: the first `len` octets of our Reply chunk (RDMA_NOMSG).
    Long {
        /// Octets of the RPC reply.
        len: usize,
        /// Octets written into our Write chunk.
        write: Option<usize>,
    },
    /// RDMA_ERROR (RPCRDMA-60).
    Refused(String),
}

/// A reply for call `xid`: what `lookup(xid)` says the call offered (its Write chunk and
/// Reply chunk), or `None` when there is no such call (dropped). `None` for whatever must
/// be dropped silently (RPCRDMA-56, -58, -61, -69, -70); `Err` for a reply that breaks the
/// chunk rules (a permanent error for that call, RPCRDMA-74, -75); `(xid, credit, form)`.
#[allow(clippy::type_complexity)]
pub fn plan_reply(
    buf: &[u8],
    lookup: impl FnOnce(u32) -> Option<(Option<Lent>, Option<Lent>)>,
) -> Option<(u32, u32, Result<ReplyForm, String>)> {
    let (h, hlen) = Repr::parse(buf).ok()?;
    let xid = h.rdma_xid;
    let (write, reply) = lookup(xid)?;
    let form = match &h.body {
        Body::Error(e) => Ok(ReplyForm::Refused(match e {
            ErrorBody::Vers {
                rdma_vers_low: low,
                rdma_vers_high: high,
            } => format!("ERR_VERS: the server speaks RPC-over-RDMA {low}..={high}"),
            ErrorBody::Chunk => "ERR_CHUNK".to_string(),
        })),
        Body::Msg(c) => {
            // RPCRDMA-38: the header's xid is the message's.
            if peek(buf.get(hlen..)?).map(|(x, _)| x) != Some(xid) {
                return None;
            }
            written(c, write).map(|w| ReplyForm::Inline { at: hlen, write: w })
        }
        Body::NoMsg(c) => long_reply(c, reply)
            .and_then(|len| written(c, write).map(|w| ReplyForm::Long { len, write: w })),
        _ => return None,
    };
    Some((xid, h.rdma_credit, form))
}

/// The octets of the DDP-eligible result in our Write chunk (RFC 8166 §3.4.6.1), checked
/// against what was offered; `None` when it came inline (an unused or empty chunk).
fn written(c: &Chunks<'_>, offered: Option<Lent>) -> Result<Option<usize>, String> {
    let mut chunks = c.write_list.iter();
    let first = chunks.next();
    if chunks.next().is_some() {
        return Err("more Write chunks returned than offered".into());
    }
    let (Some(ch), Some(lent)) = (first, offered) else {
        return match first {
            Some(ch) if ch.total_len() > 0 => Err("a Write chunk we did not offer".into()),
            _ => Ok(None),
        };
    };
    let mut segs = ch.iter();
    let Some(seg) = segs.next() else {
        return Ok(None);
    };
    if segs.next().is_some() || seg.handle != lent.handle || seg.offset != lent.offset {
        return Err("a Write chunk unlike the one offered".into());
    }
    let len = seg.length as usize;
    if len > lent.len {
        return Err("a Write chunk longer than offered".into());
    }
    // Unused (RPCRDMA-49): the result is inline.
    Ok((len > 0).then_some(len))
}

/// The octets of a Long Reply in our Reply chunk, checked against what was offered.
fn long_reply(c: &Chunks<'_>, offered: Option<Lent>) -> Result<usize, String> {
    let (Some(ch), Some(lent)) = (c.reply_chunk.as_ref(), offered) else {
        return Err("RDMA_NOMSG without the Reply chunk we offered".into());
    };
    let mut segs = ch.iter();
    let seg = segs.next().ok_or("an empty Reply chunk")?;
    if segs.next().is_some() || seg.handle != lent.handle || seg.offset != lent.offset {
        return Err("a Reply chunk unlike the one offered".into());
    }
    let len = seg.length as usize;
    if len > lent.len {
        return Err("a Reply chunk longer than offered".into());
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seg() -> impl Strategy<Value = Segment> {
        (any::<u32>(), 0u32..5000, any::<u64>()).prop_map(|(handle, length, offset)| Segment {
            handle,
            length,
            offset,
        })
    }

    proptest! {
        /// Whatever a requester offers, a reply never writes past a segment, through a
        /// handle or at an offset it did not offer, and writes exactly the result.
        #[test]
        fn rpcrdma_27_28_fill_stays_inside_the_offered_segments(
            segs in prop::collection::vec(seg(), 0..6),
            len in 0usize..20000,
        ) {
            match fill(len, &segs) {
                Some(out) => {
                    prop_assert_eq!(out.len(), segs.len());
                    let mut total = 0usize;
                    for (o, s) in out.iter().zip(&segs) {
                        prop_assert!(o.length <= s.length);
                        prop_assert_eq!((o.handle, o.offset), (s.handle, s.offset));
                        total += o.length as usize;
                    }
                    prop_assert_eq!(total, len);
                }
                None => {
                    let room: usize = segs.iter().map(|s| s.length as usize).sum();
                    prop_assert!(room < len);
                }
            }
        }

        /// Arbitrary octets never panic the planner; what it accepts is consistent.
        #[test]
        fn rpcrdma_57_any_message_gets_a_plan_or_a_refusal(msg in prop::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(p) = plan_call(&msg, 1 << 20) {
                prop_assert!(p.read_len <= 1 << 20);
                prop_assert!(p.reads.iter().all(|(pos, _)| pos % 4 == 0));
                prop_assert_eq!(p.long, p.payload.is_empty() && !p.reads.is_empty());
            }
        }
    }

    #[test]
    fn positions_must_rise() {
        // RDMA_MSG with Read chunks at 8 then 4: refused.
        let mut m: Vec<u8> = [7u32, 1, 1, 0]
            .iter()
            .chain(&[1, 8, 1, 10, 0, 0, 1, 4, 1, 10, 0, 0, 0, 0, 0])
            .flat_map(|w: &u32| w.to_be_bytes())
            .collect();
        m.extend_from_slice(&7u32.to_be_bytes());
        m.extend_from_slice(&[0; 12]);
        assert_eq!(plan_call(&m, 1 << 20), Err(Refusal::ErrChunk));
    }

    /// The handle a reply may invalidate remotely: the one every chunk segment of the call
    /// shares (Linux `svc_rdma_get_inv_rkey`), none when they differ or there are none.
    #[test]
    fn one_handle_for_send_with_invalidate() {
        // An RDMA_MSG carrying a call (xid 7): Read list, Write list, Reply chunk as given.
        let call = |words: &[u32]| -> Vec<u8> {
            let mut m: Vec<u8> = [7u32, 1, 1, 0]
                .iter()
                .chain(words)
                .flat_map(|w| w.to_be_bytes())
                .collect();
            m.extend_from_slice(&7u32.to_be_bytes());
            m.extend_from_slice(&[0; 12]);
            m
        };
        let write = |h: u32| [1, 1, h, 100, 0, 0, 0];
        let inv = |m: &[u8]| plan_call(m, 1 << 20).unwrap().offered.invalidate;
        // Nothing offered.
        assert_eq!(inv(&call(&[0, 0, 0])), None);
        // One Write chunk: its handle.
        let mut w = vec![0];
        w.extend(write(0x55));
        w.push(0);
        assert_eq!(inv(&call(&w)), Some(0x55));
        // A Read chunk and a Write chunk of the same handle; of two handles.
        for (h2, want) in [(0x55, Some(0x55)), (0x66, None)] {
            let mut w = vec![1, 16, 0x55, 4, 0, 0, 0];
            w.extend(write(h2));
            w.push(0);
            assert_eq!(inv(&call(&w)), want);
        }
        // A Write chunk and a Reply chunk of different handles.
        let mut w = vec![0];
        w.extend(write(0x55));
        w.extend([1, 1, 0x77, 64, 0, 0]);
        assert_eq!(inv(&call(&w)), None);
    }
}
