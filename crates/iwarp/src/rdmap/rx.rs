//! Receive path: validation (RFC 5040 §7.2, RFC 5041 §7.2) and placement of one ULPDU.
//!
//! Check order, first failure wins (`docs/spec/rdmap.md` §9.3): DDP header present → DDP version
//! → queue number → RDMAP version → opcode / T / QN consistency and RDMAP header shape (the
//! codec's [`Violation`](softrdma_wire::rdmap::Violation)s) → queue / buffer (MSN, MO,
//! length, IRD) → STag, range, rights, wrap (the key table's order).

use softrdma_memory::{Access, AccessError, Key, KeyState};
use softrdma_wire::ddp::{self, DDP_VERSION, TaggedBufferError, UntaggedBufferError};
use softrdma_wire::rdmap::{
    AtomicOpcode, AtomicRequestRepr, AtomicResponseRepr, Body, ImmediateDataRepr, MASK_OPCODE,
    MASK_RV, Opcode, Queue, ReadRequestRepr, RemoteOperationError, RemoteProtectionError, Segment,
    TerminateCode, TerminateRepr, terminate_code_for,
};

use smallvec::SmallVec;
use softrdma_memory::Target;

use super::term::{self, Fault};
use super::{
    ActiveRecv, IMM_SEND_FOLLOWS, InboundRead, Placed, Placement, QpEvent, RdmapEngine, Response,
    RxPayload, SqOp, SqState, StreamState, wc,
};
use crate::verbs_types::Sgl;
use crate::verbs_types::{WcOpcode, WcStatus};

/// T = 0 and OpCode 7: handled as a Terminate whatever else is wrong with it (RDMAP-71).
fn looks_like_terminate(ulpdu: &[u8]) -> bool {
    match ulpdu {
        [control, rdmap, ..] => {
            control & ddp::FLAG_TAGGED == 0 && rdmap & MASK_OPCODE == Opcode::Terminate as u8
        }
        _ => false,
    }
}

/// A segment whose payload can be placed straight from the LLP (Write, Read Response,
/// Send family), given only its headers (its body holds no payload octets).
fn header_of_placeable(body: &Body) -> bool {
    matches!(
        body,
        Body::RdmaWrite { payload: [] }
            | Body::RdmaReadResponse { payload: [] }
            | Body::Send { payload: [] }
            | Body::SendWithSe { payload: [] }
            | Body::SendWithInvalidate { payload: [], .. }
            | Body::SendWithSeAndInvalidate { payload: [], .. }
    )
}

/// RFC 5041 §7.2: an untagged segment whose MSN is `d` messages past the expected one, when
/// `available` buffers (counting the expected message's) exist: "no buffer" if it is ahead
/// of every buffer, otherwise "MSN range not valid" (this receiver takes the messages of a
/// queue strictly in order, as DDP over an in-order LLP sends them).
fn msn_fault(d: u32, available: usize) -> Fault {
    if d < 0x8000_0000 && d as usize >= available {
        Fault::untagged(UntaggedBufferError::InvalidMsnNoBuffer)
    } else {
        Fault::untagged(UntaggedBufferError::InvalidMsnRange)
    }
}

impl RdmapEngine {
    /// One ULPDU from MPA (length, PAD, markers and CRC already removed and checked).
    ///
    /// The first invalid segment queues a Terminate and kills the stream (RFC 5040 §7); once
    /// the stream is terminating or dead only a peer's Terminate is still looked at.
    pub fn handle_ulpdu(&mut self, ulpdu: &[u8]) {
        self.handle(ulpdu, None);
    }

    /// A ULPDU whose payload was placed straight from the LLP while it arrived (the
    /// connection's direct placement, at the pieces [`placement`](Self::placement) named):
    /// `head` is its DDP and RDMAP headers, `placed` the payload octets behind them, and `ok`
    /// false if the memory refused them (a key revoked meanwhile). The segment is checked
    /// again exactly as [`handle_ulpdu`](Self::handle_ulpdu) checks it, once its CRC is good;
    /// only the copy is skipped.
    pub fn handle_placed(&mut self, head: &[u8], placed: usize, ok: bool) {
        self.handle(head, Some(Placed { len: placed, ok }));
    }

    fn handle(&mut self, ulpdu: &[u8], placed: Option<Placed>) {
        self.counters.ulpdus_rx += 1;
        if self.state != StreamState::Closed && looks_like_terminate(ulpdu) {
            self.receive_terminate(ulpdu);
            return;
        }
        if self.state != StreamState::Rts {
            self.counters.dropped_rx += 1;
            return;
        }
        match self.receive(ulpdu, placed) {
            Err(fault) => self.fail(fault),
            Ok(()) => {
                if let Some(p) = placed {
                    self.counters.payload_rx_direct += p.len as u64;
                }
            }
        }
    }

    /// RFC 5041 §5 with the payload not yet here: where the payload of the segment whose
    /// headers are `head` (nothing after them) and whose ULPDU is `ulpdu_len` octets long
    /// goes, if it is an RDMA Write, Read Response or Send segment that passes every check
    /// [`handle_ulpdu`](Self::handle_ulpdu) makes now; the pieces of registered memory, in
    /// order. Nothing changes here: the segment is handed over later, whole or with
    /// [`handle_placed`](Self::handle_placed), and checked again then.
    pub fn placement(&self, head: &[u8], ulpdu_len: usize) -> Option<Placement> {
        if self.state != StreamState::Rts || looks_like_terminate(head) {
            return None;
        }
        let len = ulpdu_len.checked_sub(head.len())?;
        let (hdr, seg_len, seg) = self.classify(head, len).ok()?;
        if !header_of_placeable(&seg.body) {
            return None;
        }
        let mut pieces = SmallVec::new();
        match seg.body {
            Body::RdmaWrite { .. } => {
                pieces.push((self.write_dest(&hdr, seg_len, len).ok()?, 0, len));
            }
            Body::RdmaReadResponse { .. } => {
                let (_, at) = self.read_response_dest(&hdr, seg_len, len).ok()?;
                let sink = self.outbound_reads.front()?.sink.clone()?;
                pieces.push((sink, at, len));
            }
            body => {
                let invalidate = matches!(
                    body,
                    Body::SendWithInvalidate { .. } | Body::SendWithSeAndInvalidate { .. }
                );
                let mo = self.send_dest(&hdr, len, invalidate).ok()?;
                self.recv_sgl()?.pieces(mo, len, &mut pieces).ok()?;
            }
        }
        Some(Placement { pieces })
    }

    /// The checks of RFC 5040 §7.2 and RFC 5041 §7.2 that come before the queue and buffer:
    /// the DDP header, the segment's length as DDP hands it up (`payload` octets after the
    /// headers, in `ulpdu` or placed), and the parsed segment.
    fn classify<'u>(
        &self,
        ulpdu: &'u [u8],
        placed: usize,
    ) -> Result<(ddp::Repr, u16, Segment<'u>), Fault> {
        // A ULPDU shorter than its DDP header leaves no header to quote.
        let hdr = ddp::Repr::parse(ulpdu)
            .map_err(|_| Fault::operation(RemoteOperationError::Unspecified))?;
        // RFC 5040 §4.8: the length DDP handed up (the octets after the DDP header).
        let seg_len = u16::try_from(ulpdu.len() - hdr.header_len() + placed).unwrap_or(u16::MAX);
        let at = |f: Fault| f.segment(hdr, seg_len);

        // RFC 5041 §7.2 (RDMAP-103): DDP version, then queue number.
        if hdr.dv() != DDP_VERSION {
            return Err(at(if hdr.is_tagged() {
                Fault::tagged(TaggedBufferError::InvalidDdpVersion)
            } else {
                Fault::untagged(UntaggedBufferError::InvalidDdpVersion)
            }));
        }
        if hdr
            .qn()
            .is_some_and(|qn| qn > u32::from(Queue::AtomicResponse))
        {
            return Err(at(Fault::untagged(UntaggedBufferError::InvalidQn)));
        }
        // RFC 5040 §7.2 (RDMAP-105): the negotiated RDMAP version.
        if (hdr.rsvd_ulp()[0] & MASK_RV) >> 6 != self.cfg.rdmap_version {
            return Err(at(Fault::operation(
                RemoteOperationError::InvalidRdmapVersion,
            )));
        }
        // RFC 5040 §7.2 (RDMAP-104, RDMAP-108): a defined opcode (0xC..0xF are reserved;
        // RFC 7306 §4 defines 0x8..0xB), consistent with T and QN (Figure 4, RFC 7306 §4),
        // RDMAP header of the right size, Atomic Operation code defined.
        let seg = Segment::parse(ulpdu).map_err(|e| {
            let code = terminate_code_for(&e).unwrap_or(TerminateCode::RdmaRemoteOperation(
                RemoteOperationError::Unspecified,
            ));
            at(Fault::new(code))
        })?;
        Ok((hdr, seg_len, seg))
    }

    fn receive(&mut self, ulpdu: &[u8], placed: Option<Placed>) -> Result<(), Fault> {
        let (hdr, seg_len, seg) = self.classify(ulpdu, placed.map_or(0, |p| p.len))?;
        let at = |f: Fault| f.segment(hdr, seg_len);
        // A placed payload lies behind the headers, which are all `ulpdu` holds then.
        let data = |payload| RxPayload::of(payload, placed);
        if placed.is_some() && !header_of_placeable(&seg.body) {
            // `placement` names no pieces for anything else.
            return Err(Fault::local());
        }
        match seg.body {
            Body::RdmaWrite { payload } => self.rx_write(&hdr, seg_len, data(payload)),
            Body::RdmaReadResponse { payload } => {
                self.rx_read_response(&hdr, seg_len, data(payload))
            }
            Body::Send { payload } => self.rx_send(&hdr, seg_len, data(payload), false, None),
            Body::SendWithSe { payload } => self.rx_send(&hdr, seg_len, data(payload), true, None),
            Body::SendWithInvalidate {
                invalidate_stag,
                payload,
            } => self.rx_send(&hdr, seg_len, data(payload), false, Some(invalidate_stag)),
            Body::SendWithSeAndInvalidate {
                invalidate_stag,
                payload,
            } => self.rx_send(&hdr, seg_len, data(payload), true, Some(invalidate_stag)),
            Body::RdmaReadRequest(req) => self.rx_read_request(&hdr, seg_len, req),
            Body::ImmediateData(i) => self.rx_immediate(&hdr, seg_len, i, false),
            Body::ImmediateDataWithSe(i) => self.rx_immediate(&hdr, seg_len, i, true),
            Body::AtomicRequest(req) => self.rx_atomic_request(&hdr, seg_len, req),
            Body::AtomicResponse(resp) => self.rx_atomic_response(&hdr, seg_len, resp),
            // A Terminate was handled before.
            Body::Terminate(_) => Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode))),
        }
    }

    /// RFC 5040 §5.1, RFC 5041 §5.2: RDMA Write segment, placed at its own STag and TO
    /// through `check_remote` (RDMAP-35, -36, -37, -40, -115..-117). No completion at the
    /// sink (RDMAP-11).
    fn rx_write(&mut self, hdr: &ddp::Repr, seg_len: u16, payload: RxPayload) -> Result<(), Fault> {
        // RDMAP-40: a zero-length Write is accepted and places nothing, its STag unlooked-at
        // as a zero-length Read's (RDMAP-50) and as Linux siw does: RFC 6581's RTR and a
        // peer's nudge (`RdmapEngine::nudge`) name STag 0.
        if payload.len() == 0 {
            return Ok(());
        }
        let target = self.write_dest(hdr, seg_len, payload.len())?;
        payload
            .place(|p| target.place(0, p))
            .map_err(|e| term::tagged_sink_fault(e).segment(*hdr, seg_len))?;
        self.counters.payload_rx += payload.len() as u64;
        Ok(())
    }

    /// Where an RDMA Write segment of `len` payload octets is placed.
    fn write_dest(&self, hdr: &ddp::Repr, seg_len: u16, len: usize) -> Result<Target, Fault> {
        let ddp::Repr::Tagged { stag, to, .. } = *hdr else {
            return Err(Fault::operation(RemoteOperationError::UnexpectedOpcode));
        };
        self.keys
            .check_remote(
                Key(stag),
                self.cfg.pd,
                self.cfg.qp,
                Access::REMOTE_WRITE,
                to,
                len as u64,
            )
            .map_err(|e| term::tagged_sink_fault(e).segment(*hdr, seg_len))
    }

    /// RFC 5040 §5.2.2: Read Response segment for the oldest outstanding Read (RDMAP-77),
    /// checked against it (RDMAP-56: STag, TO, length) and placed through the sink's L_Key
    /// grant. The last segment completes the Read (RDMAP-53, RDMAP-85, RDMAP-87).
    fn rx_read_response(
        &mut self,
        hdr: &ddp::Repr,
        seg_len: u16,
        payload: RxPayload,
    ) -> Result<(), Fault> {
        let (seq, at) = self.read_response_dest(hdr, seg_len, payload.len())?;
        let Some(read) = self.outbound_reads.front_mut() else {
            return Err(Fault::local());
        };
        let placed = payload.place(|p| match &read.sink {
            Some(sink) => sink.place(at, p),
            None => Err(AccessError::Bounds),
        });
        // Our own buffer went away after the post: a local error (RDMAP-99).
        placed.map_err(|_| Fault::local().sq(seq, WcStatus::LocalProtection))?;
        self.counters.payload_rx += payload.len() as u64;
        if hdr.last() {
            self.outbound_reads.pop_front();
            self.complete_sq(seq, WcStatus::Success);
        } else {
            read.received = (at + payload.len()) as u32;
        }
        Ok(())
    }

    /// The Read a Read Response segment of `len` payload octets answers and the offset in
    /// its sink where they go.
    fn read_response_dest(
        &self,
        hdr: &ddp::Repr,
        seg_len: u16,
        len: usize,
    ) -> Result<(u64, usize), Fault> {
        let at = |f: Fault| f.segment(*hdr, seg_len);
        let ddp::Repr::Tagged { stag, to, last, .. } = *hdr else {
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        };
        let Some(read) = self.outbound_reads.front() else {
            // A response that answers no request.
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        };
        let seq = read.seq;
        let bad = |f: Fault| at(f).sq(seq, WcStatus::RemoteOperation);
        if stag != read.sink_stag.0 {
            return Err(bad(Fault::tagged(TaggedBufferError::InvalidStag)));
        }
        let end = u64::from(read.received) + len as u64;
        let total = u64::from(read.len);
        if to != read.sink_to.wrapping_add(u64::from(read.received))
            || end > total
            || (last && end != total)
        {
            return Err(bad(Fault::tagged(TaggedBufferError::BaseOrBoundsViolation)));
        }
        Ok((seq, read.received as usize))
    }

    /// RFC 5040 §5.3, RFC 5041 §5.3: Send-family segment on QN 0. The first segment of a
    /// message consumes the next receive WQE (RDMAP-59); the message is delivered when its
    /// last segment is placed (RDMAP-76, RDMAP-82), after the Invalidate STag, if any, was
    /// invalidated (RDMAP-67).
    fn rx_send(
        &mut self,
        hdr: &ddp::Repr,
        seg_len: u16,
        payload: RxPayload,
        solicited: bool,
        invalidate: Option<u32>,
    ) -> Result<(), Fault> {
        let at = |f: Fault| f.segment(*hdr, seg_len);
        let dest = self.send_dest(hdr, payload.len(), invalidate.is_some());
        // The first segment takes its WQE even when it then fails: the abort completes the
        // WQE with the fault's status.
        if self.rx_send.is_none()
            && dest.as_ref().map_or_else(|f| f.rq.is_some(), |_| true)
            && let Some(entry) = self.rq.pop_front()
        {
            self.rx_send = Some(ActiveRecv {
                entry,
                received: 0,
                imm: None,
            });
        }
        let mo = dest.map_err(at)?;
        let Some(active) = self.rx_send.as_mut() else {
            return Err(Fault::local());
        };
        payload
            .place(|p| active.entry.sgl.scatter(mo, p))
            .map_err(|_| Fault::local().rq(WcStatus::LocalProtection))?;
        active.received = (mo + payload.len() as u64) as u32;
        self.counters.payload_rx += payload.len() as u64;
        let ddp::Repr::Untagged { msn, .. } = *hdr else {
            return Err(Fault::local());
        };
        if !hdr.last() {
            return Ok(());
        }
        let mut done = wc(
            active.entry.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            active.received,
        );
        done.flags.solicited = solicited;
        if let Some((imm, se)) = active.imm {
            done.imm = Some(imm);
            done.flags.solicited |= se;
        }
        if let Some(stag) = invalidate {
            // RFC 5040 §6 / §7.2 rows 4-5 (RDMAP-106, -107, -121): the STag must be valid and
            // invalidatable by this stream; the key table applies IBA o9-5.2.2 rules 1-9.
            let key = Key(stag);
            let invalidated = self.keys.state(key) == KeyState::Valid
                && self
                    .keys
                    .invalidate_remote(key, self.cfg.pd, self.cfg.qp)
                    .is_ok();
            if !invalidated {
                // The WQE stays in use; the abort completes it with this status.
                return Err(at(Fault::protection(
                    RemoteProtectionError::StagCannotBeInvalidated,
                ))
                .rq(WcStatus::RemoteInvalidRequest));
            }
            done.flags.with_invalidate = true;
            done.invalidated_key = Some(key);
        }
        self.rx_send = None;
        self.rx_msn[0] = msn.wrapping_add(1);
        self.completions.push_back(done);
        Ok(())
    }

    /// The message offset where a Send-family segment of `len` payload octets goes, in the
    /// receive WQE in use or (first segment) the next one posted, after the checks of RFC
    /// 5041 §7.2 (MSN, MO, buffer) and RDMAP-61 (length). A fault with an `rq` status is
    /// one the first segment meets after taking its WQE.
    fn send_dest(&self, hdr: &ddp::Repr, len: usize, invalidate: bool) -> Result<u64, Fault> {
        let ddp::Repr::Untagged { msn, mo, .. } = *hdr else {
            return Err(Fault::operation(RemoteOperationError::UnexpectedOpcode));
        };
        let d = msn.wrapping_sub(self.rx_msn[0]);
        if d != 0 {
            let available = self.rq.len() + usize::from(self.rx_send.is_some());
            return Err(msn_fault(d, available));
        }
        let (received, imm) = match &self.rx_send {
            Some(active) => (active.received, active.imm.is_some()),
            None if mo != 0 => return Err(Fault::untagged(UntaggedBufferError::InvalidMo)),
            None if self.rq.is_empty() => {
                return Err(Fault::untagged(UntaggedBufferError::InvalidMsnNoBuffer));
            }
            None => (0, false),
        };
        // The Send an Immediate Data announced (Send with immediate) is a plain Send or
        // Send with SE: nothing else may take its WQE.
        if imm && invalidate {
            return Err(Fault::operation(RemoteOperationError::UnexpectedOpcode));
        }
        if mo != received {
            return Err(Fault::untagged(UntaggedBufferError::InvalidMo));
        }
        // RDMAP-61: longer than the receive buffer.
        let end = u64::from(mo) + len as u64;
        let Some(sgl) = self.recv_sgl() else {
            return Err(Fault::local());
        };
        if end > sgl.len() || end > u64::from(u32::MAX) {
            return Err(
                Fault::untagged(UntaggedBufferError::MessageTooLong).rq(WcStatus::LocalLength)
            );
        }
        Ok(u64::from(mo))
    }

    /// The buffer the next Send segment lands in: the WQE in use, else the next posted.
    fn recv_sgl(&self) -> Option<&Sgl> {
        match &self.rx_send {
            Some(active) => Some(&active.entry.sgl),
            None => self.rq.front().map(|e| &e.sgl),
        }
    }

    /// RFC 5040 §6.1: the IRD slots are QN 1's buffers, shared by Read and Atomic Requests
    /// (RFC 7306 §5): the request must carry the next MSN and find a slot.
    fn qn1_admits(&self, msn: u32) -> Result<(), Fault> {
        let available = usize::from(self.cfg.ird).saturating_sub(self.responses.len());
        let d = msn.wrapping_sub(self.rx_msn[1]);
        if d != 0 {
            return Err(msn_fault(d, available));
        }
        if available == 0 {
            return Err(Fault::untagged(UntaggedBufferError::InvalidMsnNoBuffer));
        }
        Ok(())
    }

    /// RFC 5040 §5.2.1: Read Request on QN 1, processed only after everything before it was
    /// placed (RDMAP-78, RDMAP-83: ULPDUs are handled in order), at most IRD at a time
    /// (RDMAP-91), source validated unless zero-length (RDMAP-49, RDMAP-50). No completion at
    /// the source (RDMAP-12, RDMAP-43).
    fn rx_read_request(
        &mut self,
        hdr: &ddp::Repr,
        seg_len: u16,
        req: ReadRequestRepr,
    ) -> Result<(), Fault> {
        let at = |f: Fault| f.segment(*hdr, seg_len);
        let ddp::Repr::Untagged { msn, .. } = *hdr else {
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        };
        self.qn1_admits(msn).map_err(at)?;
        self.rx_msn[1] = msn.wrapping_add(1);
        let source = if req.rdmardsz == 0 {
            None
        } else {
            // RFC 5040 §7.2 checks 4a-4e and rights (RDMAP-109..114), in the key table's
            // order; the Terminate quotes the request (RDMAP-101).
            let checked = self.keys.check_remote(
                Key(req.src_stag),
                self.cfg.pd,
                self.cfg.qp,
                Access::REMOTE_READ,
                req.src_to,
                u64::from(req.rdmardsz),
            );
            Some(checked.map_err(|e| at(term::read_source_fault(e)).read_request(req))?)
        };
        self.responses.push_back(Response::Read(InboundRead {
            req,
            ddp: *hdr,
            seg_len,
            source,
            sent: 0,
        }));
        Ok(())
    }

    /// RFC 7306 §6: Immediate Data on QN 0, in the MSN sequence of the Sends; it takes the
    /// next receive WQE (none: DDP "no buffer", as for a Send). Octets 0..4 are the
    /// immediate, octets 4..8 our word ([`IMM_SEND_FOLLOWS`]): with the bit, the WQE waits for
    /// the announced Send; without it, the Immediate Data completes a Write with immediate
    /// (`RecvRdmaWithImm`, `byte_len` = the Write's length, nothing placed).
    fn rx_immediate(
        &mut self,
        hdr: &ddp::Repr,
        seg_len: u16,
        imm: ImmediateDataRepr,
        solicited: bool,
    ) -> Result<(), Fault> {
        let at = |f: Fault| f.segment(*hdr, seg_len);
        let ddp::Repr::Untagged { msn, .. } = *hdr else {
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        };
        let d = msn.wrapping_sub(self.rx_msn[0]);
        if d != 0 {
            return Err(at(msn_fault(d, self.rq_len())));
        }
        if self.rx_send.is_some() {
            // The WQE in use waits for the Send an Immediate Data announced.
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        }
        let Some(entry) = self.rq.pop_front() else {
            return Err(at(Fault::untagged(UntaggedBufferError::InvalidMsnNoBuffer)));
        };
        self.rx_msn[0] = msn.wrapping_add(1);
        let [i0, i1, i2, i3, w0, w1, w2, w3] = imm.immediate_data;
        let value = u32::from_be_bytes([i0, i1, i2, i3]);
        let word = u32::from_be_bytes([w0, w1, w2, w3]);
        if word & IMM_SEND_FOLLOWS != 0 {
            self.rx_send = Some(ActiveRecv {
                entry,
                received: 0,
                imm: Some((value, solicited)),
            });
            return Ok(());
        }
        let mut done = wc(
            entry.wr_id,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            word,
        );
        done.imm = Some(value);
        done.flags.solicited = solicited;
        self.completions.push_back(done);
        Ok(())
    }

    /// RFC 7306 §5: Atomic Request on QN 1, in the Read Requests' MSN sequence and IRD slots.
    /// Checked in RFC 5040 §7.2's order (operation, queue and buffer, then the target through
    /// `check_remote` with `REMOTE_ATOMIC`: STag, PD, rights, wrap, bounds, alignment), then
    /// executed exactly once, now, in order with every earlier message of the stream
    /// (IBT-C9-28, IBT-X-15): a repeated or skipped MSN or a Request Identifier still
    /// awaiting its response is refused before anything is touched, and any error kills the
    /// stream. The Atomic Response waits behind earlier Read Responses.
    fn rx_atomic_request(
        &mut self,
        hdr: &ddp::Repr,
        seg_len: u16,
        req: AtomicRequestRepr,
    ) -> Result<(), Fault> {
        let at = |f: Fault| f.segment(*hdr, seg_len);
        let ddp::Repr::Untagged { msn, .. } = *hdr else {
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        };
        // The operations the verbs define: FetchAdd on the whole word (Add Mask 0) and
        // CmpSwap comparing and swapping every bit. Swap and masked forms are refused like
        // an undefined code (the wire crate's `Violation::UndefinedAtomicOpcode`).
        let op = match req.opcode {
            AtomicOpcode::FetchAdd if req.add_or_swap_mask == 0 => Exec::Add(req.add_or_swap_data),
            AtomicOpcode::CompareSwap
                if req.add_or_swap_mask == u64::MAX && req.compare_mask == u64::MAX =>
            {
                Exec::CmpSwap(req.compare_data, req.add_or_swap_data)
            }
            _ => return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode))),
        };
        self.qn1_admits(msn).map_err(at)?;
        let id = req.request_identifier;
        if self
            .responses
            .iter()
            .any(|r| matches!(r, Response::Atomic(a) if a.original_request_identifier == id))
        {
            // Two responses with one identifier could not be told apart.
            return Err(at(Fault::operation(RemoteOperationError::Unspecified)));
        }
        self.rx_msn[1] = msn.wrapping_add(1);
        // RFC 7306 §8: the target's checks and codes are the Read source's (Remote
        // Protection); a misaligned one is Remote Protection / Unspecified.
        let fault = |e: AccessError| at(term::read_source_fault(e));
        let target = self
            .keys
            .check_remote(
                Key(req.remote_stag),
                self.cfg.pd,
                self.cfg.qp,
                Access::REMOTE_ATOMIC,
                req.remote_tagged_offset,
                8,
            )
            .map_err(fault)?;
        // The memory crate runs the read-modify-write under the buffer's lock: atomic with
        // respect to every other QP sharing the region (IBT-o9-17). Host order.
        let original = match op {
            Exec::Add(add) => target.fetch_add(0, add),
            Exec::CmpSwap(compare, swap) => target.compare_swap(0, compare, swap),
        }
        .map_err(fault)?;
        self.responses
            .push_back(Response::Atomic(AtomicResponseRepr {
                original_request_identifier: id,
                original_remote_data_value: original,
            }));
        Ok(())
    }

    /// RFC 7306 §5: Atomic Response on QN 3 (its own MSN sequence; the outstanding atomics
    /// are its buffers: none left is DDP "no buffer"). It answers the oldest outstanding
    /// atomic, whose Request Identifier it must carry; the original value lands, host order,
    /// in that request's 8-octet entry and the request completes (in submission order,
    /// RDMAP-81).
    fn rx_atomic_response(
        &mut self,
        hdr: &ddp::Repr,
        seg_len: u16,
        resp: AtomicResponseRepr,
    ) -> Result<(), Fault> {
        let at = |f: Fault| f.segment(*hdr, seg_len);
        let ddp::Repr::Untagged { msn, .. } = *hdr else {
            return Err(at(Fault::operation(RemoteOperationError::UnexpectedOpcode)));
        };
        let d = msn.wrapping_sub(self.rx_msn[3]);
        if d != 0 {
            return Err(at(msn_fault(d, self.outbound_atomics.len())));
        }
        let Some(atomic) = self.outbound_atomics.front() else {
            return Err(at(Fault::untagged(UntaggedBufferError::InvalidMsnNoBuffer)));
        };
        let seq = atomic.seq;
        if resp.original_request_identifier != atomic.msn {
            return Err(at(Fault::operation(RemoteOperationError::Unspecified))
                .sq(seq, WcStatus::RemoteOperation));
        }
        let value = resp.original_remote_data_value.to_ne_bytes();
        let placed = match &atomic.sink {
            Some(sink) => sink.place(0, &value),
            None => Err(AccessError::Bounds),
        };
        // Our own entry went away after the post: a local error (RDMAP-99).
        placed.map_err(|_| Fault::local().sq(seq, WcStatus::LocalProtection))?;
        self.outbound_atomics.pop_front();
        self.rx_msn[3] = msn.wrapping_add(1);
        self.complete_sq(seq, WcStatus::Success);
        Ok(())
    }

    /// RFC 5040 §5.4: the peer's Terminate is handed to the ULP (RDMAP-70) and kills the
    /// stream; nothing is sent back, even when it is malformed (RDMAP-71, RDMAP-74).
    fn receive_terminate(&mut self, ulpdu: &[u8]) {
        self.counters.terminates_rx += 1;
        if self.term_rx_seen {
            // Only one Terminate per stream (RDMAP-69); later ones are noise.
            self.counters.dropped_rx += 1;
            return;
        }
        self.term_rx_seen = true;
        let parsed = self.parse_terminate(ulpdu);
        match parsed {
            Some(t) => {
                tracing::warn!(qp = self.cfg.qp.0, code = %t.code, "peer's Terminate received");
                self.rx_msn[2] = self.rx_msn[2].wrapping_add(1);
                self.term_received = Some(t);
                self.events.push_back(QpEvent::TerminateReceived(t));
            }
            None => self.events.push_back(QpEvent::InvalidTerminate),
        }
        if self.state == StreamState::Rts {
            let culprit = parsed.and_then(|t| self.terminated_request(&t));
            self.state = StreamState::Error;
            self.abort(culprit, None);
        }
    }

    /// The Terminate Header of a valid Terminate: DDP and RDMAP versions, QN 2, the expected
    /// MSN, one segment at MO 0 (RFC 5040 §7.2: Terminates are validated too); either
    /// control-word layout (`TerminateLayout::detect`).
    fn parse_terminate(&self, ulpdu: &[u8]) -> Option<TerminateRepr> {
        let ddp::Repr::Untagged {
            dv,
            rsvd_ulp,
            qn,
            msn,
            mo,
            last,
            ..
        } = ddp::Repr::parse(ulpdu).ok()?
        else {
            return None;
        };
        let rv = (rsvd_ulp[0] & MASK_RV) >> 6;
        if dv != DDP_VERSION
            || rv != self.cfg.rdmap_version
            || qn != u32::from(Queue::Terminate)
            || msn != self.rx_msn[2]
            || mo != 0
            || !last
        {
            return None;
        }
        match Segment::parse(ulpdu).ok()?.body {
            Body::Terminate(t) => Some(t),
            _ => None,
        }
    }

    /// The request a received Terminate fails, if the Terminate names one this side still
    /// tracks: a Read by its Terminated RDMA Header or its Read Request's DDP header (quoted
    /// opcode and MSN), or the message being segmented by its DDP header (Send MSN, or Write
    /// STag). A
    /// DDP header naming a message that already completed (a Send or Write handed to the LLP,
    /// a Read Response) fails no request. Without a DDP header (LLP or local catastrophic
    /// errors at the peer) the oldest request handed to DDP and not complete takes the error.
    /// Everything else is flushed (RDMAP-72, RDMAP-93).
    fn terminated_request(&self, t: &TerminateRepr) -> Option<(u64, WcStatus)> {
        let status = term::status_for_terminate(t.code);
        if let Some(r) = t.rdma
            && let Some(read) = self.outbound_reads.iter().find(|rd| {
                rd.sink_stag.0 == r.sink_stag
                    && r.sink_to.wrapping_sub(rd.sink_to) <= u64::from(rd.len)
            })
        {
            return Some((read.seq, status));
        }
        let started = self.sq_started();
        let current = started.then(|| self.sq.get(self.sq_tx)).flatten();
        // The QN 0 MSNs the current request used: a Send's (while its segments go out), a
        // Send with immediate's Immediate Data and Send.
        let send_msn = |e: &super::SqEntry, msn: u32| match e.op {
            SqOp::Send { .. } => msn == self.tx_msn[0],
            SqOp::SendImm { .. } => msn == self.tx_msn[0] || msn == self.tx_msn[0].wrapping_sub(1),
            _ => false,
        };
        match t.ddp.map(|d| d.header) {
            // The quoted opcode says which of our sequences the MSN belongs to.
            Some(ddp::Repr::Untagged { rsvd_ulp, msn, .. }) => {
                match Opcode::try_from(rsvd_ulp[0] & MASK_OPCODE) {
                    Ok(Opcode::RdmaReadRequest) => self
                        .outbound_reads
                        .iter()
                        .find(|rd| rd.msn == msn)
                        .map(|rd| (rd.seq, status)),
                    Ok(Opcode::AtomicRequest) => self
                        .outbound_atomics
                        .iter()
                        .find(|a| a.msn == msn)
                        .map(|a| (a.seq, status)),
                    Ok(op) if op.queue() == Some(Queue::Send) => current
                        .filter(|e| send_msn(e, msn))
                        .map(|e| (e.seq, status)),
                    _ => None,
                }
            }
            Some(ddp::Repr::Tagged { stag, .. }) => current
                .filter(|e| {
                    matches!(e.op, SqOp::Write { rkey, .. } | SqOp::WriteImm { rkey, .. }
                        if rkey.0 == stag)
                })
                .map(|e| (e.seq, status)),
            None => {
                let handed = self.sq_tx + usize::from(started);
                self.sq
                    .iter()
                    .take(handed)
                    .find(|e| !matches!(e.state, SqState::Done(_)))
                    .map(|e| (e.seq, status))
            }
        }
    }
}

/// An atomic the responder executes.
#[derive(Clone, Copy, Debug)]
enum Exec {
    Add(u64),
    /// (compare, swap)
    CmpSwap(u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 5041 §7.2 MSN classification, including wrap of the 32-bit MSN space.
    #[test]
    fn msn_fault_classification_wraps() {
        let code = |f: Fault| f.code;
        let no_buffer = TerminateCode::Ddp(ddp::DdpError::UntaggedBuffer(
            UntaggedBufferError::InvalidMsnNoBuffer,
        ));
        let range = TerminateCode::Ddp(ddp::DdpError::UntaggedBuffer(
            UntaggedBufferError::InvalidMsnRange,
        ));
        // Expected u32::MAX, got 0 (one ahead across the wrap), one buffer: none for it.
        assert_eq!(code(msn_fault(0u32.wrapping_sub(u32::MAX), 1)), no_buffer);
        // One ahead with two buffers: a buffer exists but the message is out of sequence.
        assert_eq!(code(msn_fault(1, 2)), range);
        // Behind (an old MSN): never "no buffer".
        assert_eq!(code(msn_fault(5u32.wrapping_sub(7), 0)), range);
        assert_eq!(code(msn_fault(0x8000_0000, 0)), range);
    }
}
