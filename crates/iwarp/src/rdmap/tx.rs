//! Transmit path: send queue and Read Responses → DDP segments of at most MULPDU octets
//! (RFC 5041 §5), and the one Terminate (RFC 5040 §5.4).

use softrdma_wire::ddp::{self, DDP_VERSION, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use softrdma_wire::rdmap::{Control, Opcode, Queue, READ_REQUEST_HEADER_LEN, ReadRequestRepr};

use super::term::{self, Fault};
use super::{OutboundRead, QpState, RdmapEngine, SqOp, SqState};
use crate::verbs_types::WcStatus;

/// Grows `out` by `len` zeroed octets and returns the offset of the first.
fn grow(out: &mut Vec<u8>, len: usize) -> usize {
    let start = out.len();
    out.resize(start + len, 0);
    start
}

impl RdmapEngine {
    /// The next ULPDU to send, appended to `out`; returns its length, or `None` when there is
    /// nothing to send now (empty queues, ORD reached, a fence waiting, or the stream is dead).
    ///
    /// Order of preference: the Terminate (it replaces whatever would have followed,
    /// RDMAP-73), then Read Responses and send-queue messages alternately, segment by segment.
    pub fn poll_ulpdu(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let n = match self.state {
            QpState::Terminating => self.emit_terminate(out),
            QpState::Rts => {
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
                    self.emit_read_response(out)
                } else {
                    self.emit_sq(out)
                }
            }
            QpState::Error | QpState::Closed => None,
        };
        if n.is_some() {
            self.counters.ulpdus_tx += 1;
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

    /// A Read Response may go out unless an RDMA Write is half sent (tagged messages are not
    /// interleaved).
    pub(super) fn responder_ready(&self) -> bool {
        if self.inbound_reads.is_empty() {
            return false;
        }
        let write_in_progress = self.sq_tx_off > 0
            && matches!(
                self.sq.get(self.sq_tx).map(|e| &e.op),
                Some(SqOp::Write { .. })
            );
        !write_in_progress
    }

    /// The send queue may emit its next segment: a new message waits for ORD (RDMAP-90) if
    /// it is a Read, for every earlier Read if it is fenced, and for a half-sent Read
    /// Response if it is a Write.
    pub(super) fn sq_ready(&self) -> bool {
        let Some(e) = self.sq.get(self.sq_tx) else {
            return false;
        };
        if self.sq_tx_off > 0 {
            return true;
        }
        if e.fence && !self.outbound_reads.is_empty() {
            return false;
        }
        match e.op {
            SqOp::Read { .. } => self.outbound_reads.len() < usize::from(self.cfg.ord),
            SqOp::Write { .. } => self.inbound_reads.front().is_none_or(|r| r.sent == 0),
            SqOp::Send { .. } => true,
        }
    }

    /// One segment of the send queue's current message (RFC 5040 §5.5 rule 13: in
    /// submission order, RDMAP-38, -45, -65, -79).
    fn emit_sq(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let idx = self.sq_tx;
        let mulpdu = usize::from(self.cfg.mulpdu);
        let e = self.sq.get(idx)?;
        let seq = e.seq;
        let off = self.sq_tx_off;
        let start;
        let last;
        match &e.op {
            SqOp::Read {
                rkey,
                raddr,
                sink_stag,
                sink_to,
                ..
            } => {
                // RFC 5040 §5.2.1 / §4.4: one untagged segment on QN 1 (RDMAP-42, RDMAP-23).
                let req = ReadRequestRepr {
                    sink_stag: sink_stag.0,
                    sink_to: *sink_to,
                    rdmardsz: e.len,
                    src_stag: rkey.0,
                    src_to: *raddr,
                };
                let (sink_stag, len) = (*sink_stag, e.len);
                let msn = self.tx_msn[1];
                start = grow(out, UNTAGGED_HEADER_LEN + READ_REQUEST_HEADER_LEN);
                self.put_untagged(
                    &mut out[start..],
                    Opcode::RdmaReadRequest,
                    0,
                    Queue::ReadRequest,
                    msn,
                    0,
                    true,
                );
                req.emit(&mut out[start + UNTAGGED_HEADER_LEN..])
                    .expect("28 octets reserved");
                self.tx_msn[1] = msn.wrapping_add(1);
                let entry = &mut self.sq[idx];
                let sink = match &mut entry.op {
                    SqOp::Read { sink, .. } => sink.take(),
                    _ => None,
                };
                entry.state = SqState::Outstanding;
                self.outbound_reads.push_back(OutboundRead {
                    seq,
                    msn,
                    sink_stag,
                    sink_to: req.sink_to,
                    len,
                    received: 0,
                    sink,
                });
                self.sq_tx += 1;
                self.sq_tx_off = 0;
                return Some(out.len() - start);
            }
            SqOp::Write { rkey, raddr } => {
                // RFC 5041 §5.2: TO of each segment = message TO + octets already sent.
                let n = (e.len - off).min((mulpdu - TAGGED_HEADER_LEN) as u32);
                last = off + n == e.len;
                start = grow(out, TAGGED_HEADER_LEN + n as usize);
                let to = raddr.wrapping_add(u64::from(off));
                self.put_tagged(&mut out[start..], Opcode::RdmaWrite, rkey.0, to, last);
                let r = e
                    .data
                    .gather(u64::from(off), &mut out[start + TAGGED_HEADER_LEN..]);
                if r.is_err() {
                    return self.fail_tx(out, start, seq);
                }
                self.sq_tx_off = off + n;
                self.counters.payload_tx += u64::from(n);
            }
            SqOp::Send {
                solicited,
                invalidate,
            } => {
                // RFC 5041 §5.3: one MSN per message, MO = octets already sent, L on the
                // last segment only (RDMAP-03); a zero-length Send is one segment.
                let opcode = match (solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (true, false) => Opcode::SendWithSe,
                    (false, true) => Opcode::SendWithInvalidate,
                    (true, true) => Opcode::SendWithSeAndInvalidate,
                };
                let n = (e.len - off).min((mulpdu - UNTAGGED_HEADER_LEN) as u32);
                last = off + n == e.len;
                start = grow(out, UNTAGGED_HEADER_LEN + n as usize);
                let inv = invalidate.map_or(0, |k| k.0);
                let msn = self.tx_msn[0];
                self.put_untagged(&mut out[start..], opcode, inv, Queue::Send, msn, off, last);
                let r = e
                    .data
                    .gather(u64::from(off), &mut out[start + UNTAGGED_HEADER_LEN..]);
                if r.is_err() {
                    return self.fail_tx(out, start, seq);
                }
                if last {
                    self.tx_msn[0] = msn.wrapping_add(1);
                }
                self.sq_tx_off = off + n;
                self.counters.payload_tx += u64::from(n);
            }
        }
        if last {
            // RDMAP-80: complete once the last octet is handed to the LLP.
            self.sq_tx += 1;
            self.sq_tx_off = 0;
            self.sq[idx].state = SqState::Done(WcStatus::Success);
            self.retire();
        }
        Some(out.len() - start)
    }

    /// RFC 5040 §7.1 case 1 (RDMAP-99): a source buffer became unreachable while building
    /// an outbound message: a Terminate goes out instead of it.
    fn fail_tx(&mut self, out: &mut Vec<u8>, start: usize, seq: u64) -> Option<usize> {
        out.truncate(start);
        self.fail(Fault::local().sq(seq, WcStatus::LocalProtection));
        self.emit_terminate(out)
    }

    /// One segment of the oldest Read Response (RFC 5040 §5.2.2: in request order, RDMAP-55,
    /// RDMAP-86; STag and TO copied from the request, RDMAP-24).
    fn emit_read_response(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let mulpdu = usize::from(self.cfg.mulpdu);
        let r = self.inbound_reads.front()?;
        let total = r.req.rdmardsz;
        let sent = r.sent;
        let n = (total - sent).min((mulpdu - TAGGED_HEADER_LEN) as u32);
        let last = sent + n == total;
        let start = grow(out, TAGGED_HEADER_LEN + n as usize);
        let to = r.req.sink_to.wrapping_add(u64::from(sent));
        self.put_tagged(
            &mut out[start..],
            Opcode::RdmaReadResponse,
            r.req.sink_stag,
            to,
            last,
        );
        if let Some(source) = &r.source {
            // The grant is re-validated under the table lock (RDMAP-120): a source
            // invalidated after the request was accepted fails here.
            let dst = &mut out[start + TAGGED_HEADER_LEN..];
            if let Err(e) = source.copy_out(sent as usize, dst) {
                out.truncate(start);
                // RFC 5040 §4.8 (RDMAP-33): the Terminated RDMA Header is advanced by the
                // octets already sent.
                let fault = term::read_source_fault(e)
                    .segment(r.ddp, r.seg_len)
                    .read_request(r.req.advanced(sent));
                self.fail(fault);
                return self.emit_terminate(out);
            }
        }
        self.counters.payload_tx += u64::from(n);
        if last {
            self.inbound_reads.pop_front();
        } else if let Some(r) = self.inbound_reads.front_mut() {
            r.sent = sent + n;
        }
        Some(out.len() - start)
    }

    /// RFC 5040 §4.8 / §5.4: the Terminate, untagged on QN 2 with MSN 1 and MO 0 (RDMAP-68);
    /// afterwards nothing is sent (RDMAP-73).
    pub(super) fn emit_terminate(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        let t = self.term_pending.take()?;
        let start = grow(out, UNTAGGED_HEADER_LEN + t.buffer_len());
        self.put_untagged(
            &mut out[start..],
            Opcode::Terminate,
            0,
            Queue::Terminate,
            1,
            0,
            true,
        );
        t.emit(&mut out[start + UNTAGGED_HEADER_LEN..])
            .expect("Terminate fits its buffer_len");
        self.state = if self.closing {
            QpState::Closed
        } else {
            QpState::Error
        };
        self.counters.terminates_tx += 1;
        Some(out.len() - start)
    }
}
