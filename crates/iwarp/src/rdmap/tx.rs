//! Transmit path: send queue, Read Responses and Atomic Responses → DDP segments of at most
//! MULPDU octets (RFC 5041 §5, RFC 7306 §5, §6), and the one Terminate (RFC 5040 §5.4).

use softrdma_memory::{Key, TxMark, TxSink};
use softrdma_wire::ddp::{self, DDP_VERSION, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use softrdma_wire::rdmap::{
    ATOMIC_REQUEST_HEADER_LEN, ATOMIC_RESPONSE_HEADER_LEN, AtomicOpcode, AtomicRequestRepr,
    AtomicResponseRepr, Control, IMMEDIATE_DATA_HEADER_LEN, ImmediateDataRepr, Opcode, Queue,
    READ_REQUEST_HEADER_LEN, ReadRequestRepr,
};

use super::term::{self, Fault};
use super::{
    AtomicOp, IMM_SEND_FOLLOWS, OutboundAtomic, OutboundRead, RdmapEngine, Response, SqOp, SqState,
    StreamState, imm_octets,
};
use crate::verbs_types::WcStatus;

/// What one ULPDU of a send-queue request did to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// More ULPDUs of this request follow.
    More,
    /// Its last ULPDU went out: it completes (RDMAP-80).
    Done,
    /// Handed to DDP; it completes when its response arrives.
    Outstanding,
}

/// Grows `out`'s staged octets by `len` zeroes and returns the index of the first there.
fn grow(out: &mut dyn TxSink, len: usize) -> usize {
    let v = out.staged();
    let start = v.len();
    v.resize(start + len, 0);
    start
}

impl RdmapEngine {
    /// The next ULPDU to send, appended to `out`; returns its length, or `None` when there is
    /// nothing to send now (empty queues, ORD reached, a fence waiting, or the stream is dead).
    ///
    /// Order of preference: the Terminate (it replaces whatever would have followed,
    /// RDMAP-73), then the owed responses (Read and Atomic, in request order) and send-queue
    /// messages alternately, ULPDU by ULPDU.
    pub fn poll_ulpdu(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let n = self.poll_ulpdu_into(out);
        // Copied: the sources are free at once.
        self.release_transmitted(self.ulpdus_emitted());
        n
    }

    /// [`poll_ulpdu`](Self::poll_ulpdu) into any sink. A sink that keeps references to
    /// registered memory holds the requests they came from: they complete (RDMAP-80) once
    /// [`release_transmitted`](Self::release_transmitted) says their last ULPDU was written.
    pub fn poll_ulpdu_into(&mut self, out: &mut dyn TxSink) -> Option<usize> {
        let n = match self.state {
            StreamState::Terminating => self.emit_terminate(out),
            StreamState::Rts => {
                let responder = self.responder_ready();
                let sq = self.sq_ready();
                let use_responder = match (responder, sq) {
                    (false, false) => return None,
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => self.prefer_responder,
                };
                self.prefer_responder = !use_responder;
                if use_responder {
                    self.emit_response(out)
                } else {
                    self.emit_sq(out)
                }
            }
            StreamState::Error | StreamState::Closed => None,
        };
        if n.is_some() {
            self.counters.ulpdus_tx += 1;
            self.tx_emitted += 1;
        }
        n
    }

    fn control(&self, opcode: Opcode) -> u8 {
        Control {
            rv: self.cfg.rdmap_version,
            rsv: 0,
            opcode,
        }
        .octet()
        .expect("RV masked to two bits in RdmapEngine::new")
    }

    /// RFC 5041 §4.4: untagged header (RDMAP-02, -14, -15, -21) at `out[start..]`.
    #[allow(clippy::too_many_arguments)]
    fn put_untagged(
        &self,
        out: &mut [u8],
        opcode: Opcode,
        invalidate_stag: u32,
        queue: Queue,
        msn: u32,
        mo: u32,
        last: bool,
    ) {
        let s = invalidate_stag.to_be_bytes();
        ddp::Repr::Untagged {
            last,
            reserved: 0,
            dv: DDP_VERSION,
            rsvd_ulp: [self.control(opcode), s[0], s[1], s[2], s[3]],
            qn: queue.into(),
            msn,
            mo,
        }
        .emit(out)
        .expect("caller reserved UNTAGGED_HEADER_LEN octets");
    }

    /// RFC 5041 §4.3: tagged header (RDMAP-18, -35, -51).
    fn put_tagged(&self, out: &mut [u8], opcode: Opcode, stag: u32, to: u64, last: bool) {
        ddp::Repr::Tagged {
            last,
            reserved: 0,
            dv: DDP_VERSION,
            rsvd_ulp: self.control(opcode),
            stag,
            to,
        }
        .emit(out)
        .expect("caller reserved TAGGED_HEADER_LEN octets");
    }

    /// A tagged RDMA Write (plain or with immediate) is half sent: no Read Response may
    /// start (two tagged messages are never interleaved).
    fn write_in_progress(&self) -> bool {
        self.sq_tx_off > 0
            && matches!(
                self.sq.get(self.sq_tx).map(|e| &e.op),
                Some(SqOp::Write { .. } | SqOp::WriteImm { .. })
            )
    }

    /// The current send-queue request has put part of itself on the wire.
    pub(super) fn sq_started(&self) -> bool {
        self.sq_tx_off > 0 || self.sq.get(self.sq_tx).is_some_and(|e| e.op.partly_sent())
    }

    /// The oldest owed response may go out: an Atomic Response (untagged) always, a Read
    /// Response unless an RDMA Write is half sent.
    pub(super) fn responder_ready(&self) -> bool {
        match self.responses.front() {
            None => false,
            Some(Response::Atomic(_)) => true,
            Some(Response::Read(_)) => !self.write_in_progress(),
        }
    }

    /// The send queue may emit its next segment: a new message waits for ORD (RDMAP-90) if
    /// it is a Read or an atomic (they share ORD, RFC 7306 §5), for every earlier Read and
    /// atomic if it is fenced (IBT-C9-31), and for a half-sent Read Response if it is a
    /// Write.
    pub(super) fn sq_ready(&self) -> bool {
        let Some(e) = self.sq.get(self.sq_tx) else {
            return false;
        };
        if self.sq_started() {
            return true;
        }
        let outstanding = self.outbound_reads.len() + self.outbound_atomics.len();
        if e.fence && outstanding > 0 {
            return false;
        }
        match e.op {
            SqOp::Read { .. } | SqOp::Atomic { .. } => outstanding < usize::from(self.cfg.ord),
            SqOp::Write { .. } | SqOp::WriteImm { .. } => match self.responses.front() {
                Some(Response::Read(r)) => r.sent == 0,
                _ => true,
            },
            SqOp::Send { .. } | SqOp::SendImm { .. } => true,
            // It runs when it is the oldest request, and holds back those after it.
            SqOp::Local(_) => false,
        }
    }

    /// One ULPDU of the send queue's current request (RFC 5040 §5.5 rule 13: in submission
    /// order, RDMAP-38, -45, -65, -79).
    fn emit_sq(&mut self, out: &mut dyn TxSink) -> Option<usize> {
        let idx = self.sq_tx;
        let e = self.sq.get(idx)?;
        let seq = e.seq;
        let start = out.mark();
        let step = match e.op {
            SqOp::Local(_) => return None,
            SqOp::Read { .. } => {
                self.put_read_request(out, idx);
                Ok(Step::Outstanding)
            }
            SqOp::Atomic { .. } => {
                self.put_atomic_request(out, idx);
                Ok(Step::Outstanding)
            }
            SqOp::Write { rkey, raddr } => self
                .put_write_segment(out, idx, rkey, raddr)
                .map(|last| if last { Step::Done } else { Step::More }),
            SqOp::Send {
                solicited,
                invalidate,
            } => {
                let opcode = match (solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (true, false) => Opcode::SendWithSe,
                    (false, true) => Opcode::SendWithInvalidate,
                    (true, true) => Opcode::SendWithSeAndInvalidate,
                };
                let inv = invalidate.map_or(0, |k| k.0);
                self.put_send_segment(out, idx, opcode, inv)
                    .map(|last| if last { Step::Done } else { Step::More })
            }
            // RFC 7306 §6: the Write first, then the Immediate Data telling its length. A
            // zero-length Write with immediate sends no Write segment: nothing to place, and
            // like InfiniBand the R_Key of an empty Write is not checked.
            SqOp::WriteImm {
                rkey,
                raddr,
                imm,
                solicited,
                data_done,
            } => {
                if data_done || e.len == 0 {
                    self.put_immediate(out, solicited, imm_octets(imm, e.len));
                    Ok(Step::Done)
                } else {
                    let r = self.put_write_segment(out, idx, rkey, raddr);
                    if r == Ok(true) {
                        self.sq_tx_off = 0;
                        if let SqOp::WriteImm { data_done, .. } = &mut self.sq[idx].op {
                            *data_done = true;
                        }
                    }
                    r.map(|_| Step::More)
                }
            }
            // RFC 7306 §6: the Immediate Data takes the peer's receive WQE and announces the
            // Send, which follows on QN 0 into that same WQE (the SE travels on the
            // Immediate Data).
            SqOp::SendImm {
                imm,
                solicited,
                imm_done,
            } => {
                if imm_done {
                    self.put_send_segment(out, idx, Opcode::Send, 0)
                        .map(|last| if last { Step::Done } else { Step::More })
                } else {
                    self.put_immediate(out, solicited, imm_octets(imm, IMM_SEND_FOLLOWS));
                    if let SqOp::SendImm { imm_done, .. } = &mut self.sq[idx].op {
                        *imm_done = true;
                    }
                    Ok(Step::More)
                }
            }
        };
        match step {
            Err(()) => return self.fail_tx(out, start, seq),
            Ok(Step::More) => {}
            Ok(Step::Outstanding) => {
                self.sq_tx += 1;
                self.sq_tx_off = 0;
            }
            Ok(Step::Done) => {
                // RDMAP-80: complete once the last octet is handed to the LLP, which is
                // when this ULPDU is released.
                self.sq_tx += 1;
                self.sq_tx_off = 0;
                self.sq[idx].state = SqState::Done(WcStatus::Success);
                // The ordinal of the ULPDU being emitted.
                self.sq[idx].tx_ord = self.tx_emitted + 1;
                self.retire();
            }
        }
        Some(out.len() - start.len())
    }

    /// RFC 5040 §5.2.1 / §4.4: one untagged segment on QN 1 (RDMAP-42, RDMAP-23); the Read
    /// becomes outstanding.
    fn put_read_request(&mut self, out: &mut dyn TxSink, idx: usize) {
        let e = &mut self.sq[idx];
        let SqOp::Read {
            rkey,
            raddr,
            sink_stag,
            sink_to,
            sink,
        } = &mut e.op
        else {
            return;
        };
        let req = ReadRequestRepr {
            sink_stag: sink_stag.0,
            sink_to: *sink_to,
            rdmardsz: e.len,
            src_stag: rkey.0,
            src_to: *raddr,
        };
        let read = OutboundRead {
            seq: e.seq,
            msn: self.tx_msn[1],
            sink_stag: *sink_stag,
            sink_to: *sink_to,
            len: e.len,
            received: 0,
            sink: sink.take(),
        };
        e.state = SqState::Outstanding;
        let start = grow(out, UNTAGGED_HEADER_LEN + READ_REQUEST_HEADER_LEN);
        self.put_untagged(
            &mut out.staged()[start..],
            Opcode::RdmaReadRequest,
            0,
            Queue::ReadRequest,
            read.msn,
            0,
            true,
        );
        req.emit(&mut out.staged()[start + UNTAGGED_HEADER_LEN..])
            .expect("28 octets reserved");
        self.tx_msn[1] = read.msn.wrapping_add(1);
        self.outbound_reads.push_back(read);
    }

    /// RFC 7306 §5: one Atomic Request, untagged on QN 1 in the Read Requests' MSN sequence;
    /// its Request Identifier is that MSN. The verbs forms: FetchAdd with Add Mask 0 (one
    /// 64-bit field), CmpSwap with every bit compared and swapped.
    fn put_atomic_request(&mut self, out: &mut dyn TxSink, idx: usize) {
        let e = &mut self.sq[idx];
        let SqOp::Atomic {
            rkey,
            raddr,
            op,
            sink,
        } = &mut e.op
        else {
            return;
        };
        let msn = self.tx_msn[1];
        let (opcode, data, mask, compare, compare_mask) = match *op {
            AtomicOp::FetchAdd { add } => (AtomicOpcode::FetchAdd, add, 0, 0, 0),
            AtomicOp::CmpSwap { compare, swap } => {
                (AtomicOpcode::CompareSwap, swap, u64::MAX, compare, u64::MAX)
            }
        };
        let req = AtomicRequestRepr {
            reserved: 0,
            opcode,
            request_identifier: msn,
            remote_stag: rkey.0,
            remote_tagged_offset: *raddr,
            add_or_swap_data: data,
            add_or_swap_mask: mask,
            compare_data: compare,
            compare_mask,
        };
        let atomic = OutboundAtomic {
            seq: e.seq,
            msn,
            sink: sink.take(),
        };
        e.state = SqState::Outstanding;
        let start = grow(out, UNTAGGED_HEADER_LEN + ATOMIC_REQUEST_HEADER_LEN);
        self.put_untagged(
            &mut out.staged()[start..],
            Opcode::AtomicRequest,
            0,
            Queue::ReadRequest,
            msn,
            0,
            true,
        );
        req.emit(&mut out.staged()[start + UNTAGGED_HEADER_LEN..])
            .expect("52 octets reserved, reserved bits 0");
        self.tx_msn[1] = msn.wrapping_add(1);
        self.outbound_atomics.push_back(atomic);
    }

    /// RFC 5041 §5.2: the next tagged segment of the current Write; TO = message TO + octets
    /// already sent. `Ok(true)` for the last segment, `Err` when the source is gone.
    fn put_write_segment(
        &mut self,
        out: &mut dyn TxSink,
        idx: usize,
        rkey: Key,
        raddr: u64,
    ) -> Result<bool, ()> {
        let mulpdu = usize::from(self.cfg.mulpdu);
        let off = self.sq_tx_off;
        let e = &self.sq[idx];
        let n = (e.len - off).min((mulpdu - TAGGED_HEADER_LEN) as u32);
        let last = off + n == e.len;
        let m = out.mark();
        let start = grow(out, TAGGED_HEADER_LEN);
        let to = raddr.wrapping_add(u64::from(off));
        self.put_tagged(
            &mut out.staged()[start..],
            Opcode::RdmaWrite,
            rkey.0,
            to,
            last,
        );
        // The payload is copied once, straight after the header.
        if self.sq[idx]
            .data
            .gather_into(u64::from(off), n as usize, out)
            .is_err()
        {
            out.rewind(m);
            return Err(());
        }
        self.sq_tx_off = off + n;
        self.counters.payload_tx += u64::from(n);
        Ok(last)
    }

    /// RFC 5041 §5.3: the next segment of the current Send: one MSN per message, MO = octets
    /// already sent, L on the last segment only (RDMAP-03); a zero-length Send is one
    /// segment. `Ok(true)` for the last segment, `Err` when the source is gone.
    fn put_send_segment(
        &mut self,
        out: &mut dyn TxSink,
        idx: usize,
        opcode: Opcode,
        invalidate: u32,
    ) -> Result<bool, ()> {
        let mulpdu = usize::from(self.cfg.mulpdu);
        let off = self.sq_tx_off;
        let e = &self.sq[idx];
        let n = (e.len - off).min((mulpdu - UNTAGGED_HEADER_LEN) as u32);
        let last = off + n == e.len;
        let m = out.mark();
        let start = grow(out, UNTAGGED_HEADER_LEN);
        let msn = self.tx_msn[0];
        self.put_untagged(
            &mut out.staged()[start..],
            opcode,
            invalidate,
            Queue::Send,
            msn,
            off,
            last,
        );
        if self.sq[idx]
            .data
            .gather_into(u64::from(off), n as usize, out)
            .is_err()
        {
            out.rewind(m);
            return Err(());
        }
        if last {
            self.tx_msn[0] = msn.wrapping_add(1);
        }
        self.sq_tx_off = off + n;
        self.counters.payload_tx += u64::from(n);
        Ok(last)
    }

    /// RFC 7306 §6: one Immediate Data message (0x8, or 0x9 with SE), untagged on QN 0 with
    /// its own MSN.
    fn put_immediate(&mut self, out: &mut dyn TxSink, solicited: bool, data: [u8; 8]) {
        let opcode = if solicited {
            Opcode::ImmediateDataWithSe
        } else {
            Opcode::ImmediateData
        };
        let msn = self.tx_msn[0];
        let start = grow(out, UNTAGGED_HEADER_LEN + IMMEDIATE_DATA_HEADER_LEN);
        self.put_untagged(
            &mut out.staged()[start..],
            opcode,
            0,
            Queue::Send,
            msn,
            0,
            true,
        );
        ImmediateDataRepr {
            immediate_data: data,
        }
        .emit(&mut out.staged()[start + UNTAGGED_HEADER_LEN..])
        .expect("8 octets reserved");
        self.tx_msn[0] = msn.wrapping_add(1);
    }

    /// RFC 5040 §7.1 case 1 (RDMAP-99): a source buffer became unreachable while building
    /// an outbound message: a Terminate goes out instead of it.
    fn fail_tx(&mut self, out: &mut dyn TxSink, start: TxMark, seq: u64) -> Option<usize> {
        out.rewind(start);
        self.fail(Fault::local().sq(seq, WcStatus::LocalProtection));
        self.emit_terminate(out)
    }

    /// One ULPDU of the oldest owed response: all of an Atomic Response, or one segment of a
    /// Read Response.
    fn emit_response(&mut self, out: &mut dyn TxSink) -> Option<usize> {
        match self.responses.front()? {
            Response::Atomic(resp) => {
                let resp = *resp;
                self.responses.pop_front();
                Some(self.put_atomic_response(out, resp))
            }
            Response::Read(_) => self.emit_read_response(out),
        }
    }

    /// RFC 7306 §5: the Atomic Response, untagged on QN 3 with its own MSN sequence; its
    /// IRD slot is free again.
    fn put_atomic_response(&mut self, out: &mut dyn TxSink, resp: AtomicResponseRepr) -> usize {
        let msn = self.tx_msn[3];
        let m = out.mark();
        let start = grow(out, UNTAGGED_HEADER_LEN + ATOMIC_RESPONSE_HEADER_LEN);
        self.put_untagged(
            &mut out.staged()[start..],
            Opcode::AtomicResponse,
            0,
            Queue::AtomicResponse,
            msn,
            0,
            true,
        );
        resp.emit(&mut out.staged()[start + UNTAGGED_HEADER_LEN..])
            .expect("12 octets reserved");
        self.tx_msn[3] = msn.wrapping_add(1);
        out.len() - m.len()
    }

    /// One segment of the oldest Read Response (RFC 5040 §5.2.2: in request order, RDMAP-55,
    /// RDMAP-86; STag and TO copied from the request, RDMAP-24).
    fn emit_read_response(&mut self, out: &mut dyn TxSink) -> Option<usize> {
        let mulpdu = usize::from(self.cfg.mulpdu);
        let Some(Response::Read(r)) = self.responses.front() else {
            return None;
        };
        let total = r.req.rdmardsz;
        let sent = r.sent;
        let n = (total - sent).min((mulpdu - TAGGED_HEADER_LEN) as u32);
        let last = sent + n == total;
        let m = out.mark();
        let start = grow(out, TAGGED_HEADER_LEN);
        let to = r.req.sink_to.wrapping_add(u64::from(sent));
        self.put_tagged(
            &mut out.staged()[start..],
            Opcode::RdmaReadResponse,
            r.req.sink_stag,
            to,
            last,
        );
        if let Some(source) = &r.source {
            // The grant is re-validated under the table lock (RDMAP-120): a source
            // invalidated after the request was accepted fails here (and, for a sink that
            // references it, again when it is written). The payload is copied at most once,
            // straight after the header.
            if let Err(e) = out.gather(source, sent as usize, n as usize) {
                out.rewind(m);
                // RFC 5040 §4.8 (RDMAP-33): the Terminated RDMA Header is advanced by the
                // octets already sent.
                let fault = term::read_source_fault(e)
                    .segment(r.ddp, r.seg_len)
                    .read_request(r.req.advanced(sent));
                self.fail(fault);
                return self.emit_terminate(out);
            }
        } else {
            let v = out.staged();
            v.resize(v.len() + n as usize, 0);
        }
        self.counters.payload_tx += u64::from(n);
        if last {
            self.responses.pop_front();
        } else if let Some(Response::Read(r)) = self.responses.front_mut() {
            r.sent = sent + n;
        }
        Some(out.len() - m.len())
    }

    /// RFC 5040 §4.8 / §5.4: the Terminate, untagged on QN 2 with MSN 1 and MO 0 (RDMAP-68);
    /// afterwards nothing is sent (RDMAP-73).
    pub(super) fn emit_terminate(&mut self, out: &mut dyn TxSink) -> Option<usize> {
        let t = self.term_pending.take()?;
        let m = out.mark();
        let start = grow(out, UNTAGGED_HEADER_LEN + t.buffer_len());
        self.put_untagged(
            &mut out.staged()[start..],
            Opcode::Terminate,
            0,
            Queue::Terminate,
            1,
            0,
            true,
        );
        t.emit(&mut out.staged()[start + UNTAGGED_HEADER_LEN..])
            .expect("Terminate fits its buffer_len");
        self.state = if self.closing {
            StreamState::Closed
        } else {
            StreamState::Error
        };
        self.counters.terminates_tx += 1;
        Some(out.len() - m.len())
    }
}
