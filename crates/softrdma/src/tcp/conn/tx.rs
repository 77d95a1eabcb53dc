//! A connection's transmit side: the QP's submission queues into the engine, whole frames
//! from the engine into the transmit queue, one vectored write of it (payloads from
//! registered memory), and what a failed write leaves.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use softrdma_memory::{TxBuf, TxSink};
use softrdma_verbs_types::{CheckedRecv, CheckedSend, WcOpcode};

use super::{Conn, TX_HIGH, WriteSide, error_wc, post_error_status};
use crate::cq::Pushed;
use crate::tap::{self, Direction, Tapped};
use crate::tcp::{DeviceStats, TcpQp, TcpShared};

impl Conn {
    /// Submission queues → engine. Before the connection is up only receives go in (sends
    /// wait for it, and stay queued if it fails). Whether anything but accepted receives
    /// came of it (sends or an invalidation handed over, a request refused).
    pub(super) fn submit_to_engine(&mut self) -> bool {
        let Some(qp) = self.qp.clone() else {
            return false;
        };
        let established = self.established;
        // Scratch queues kept across calls (no allocation per message); the submission
        // queue gets the empty one back with its capacity.
        let mut sends = std::mem::take(&mut self.sends);
        let mut recvs = std::mem::take(&mut self.recvs);
        {
            let mut sub = qp.sub.lock();
            if established {
                std::mem::swap(&mut sub.sq, &mut sends);
            }
            std::mem::swap(&mut sub.rq, &mut recvs);
        }
        // Posting happens without the submission lock: an INLINE copy or a key check must
        // never wait while a poster waits for that lock.
        let mut handed = !sends.is_empty();
        for wr in recvs.drain(..) {
            handed |= self.hand_recv(&qp, wr);
        }
        for wr in sends.drain(..) {
            self.hand_send(&qp, wr);
        }
        self.sends = sends;
        self.recvs = recvs;
        handed
    }

    /// One receive request to the engine (before the connection is up, a copy is kept in
    /// `early_rq`); refused, it completes in error at once (then `true`).
    pub(in crate::tcp) fn hand_recv(&mut self, qp: &TcpQp, wr: CheckedRecv) -> bool {
        let wr_id = wr.wr_id;
        let copy = (!self.established).then(|| wr.clone());
        match self.iw.engine_mut().post_checked_recv(wr) {
            Ok(()) => {
                self.rq_in_engine += 1;
                self.early_rq.extend(copy);
                false
            }
            Err(e) => {
                qp.rq_retired.fetch_add(1, Ordering::AcqRel);
                let mut v = vec![error_wc(wr_id, post_error_status(&e), WcOpcode::Recv)];
                self.cq_overrun |= qp.recv_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
                true
            }
        }
    }

    /// One send request to the engine; refused, it completes in error at once.
    pub(in crate::tcp) fn hand_send(&mut self, qp: &TcpQp, wr: CheckedSend) {
        let wr_id = wr.wr_id;
        let opcode = wr.opcode.wc_opcode();
        match self.iw.engine_mut().post_checked(wr) {
            Ok(()) => self.sq_in_engine += 1,
            Err(e) => {
                qp.sq_retired.fetch_add(1, Ordering::AcqRel);
                let mut v = vec![error_wc(wr_id, post_error_status(&e), opcode)];
                self.cq_overrun |= qp.send_cq.push(qp.qpn, &mut v) == Pushed::Overrun;
            }
        }
    }

    /// Frames and writes what the engine has to send. An idle transmit queue trades places
    /// with the driver's `spare` for it: the spare's memory is in cache from the last
    /// connection that wrote, this one's, among a thousand connections, is not. It goes
    /// back unless octets stay queued (the socket was full).
    pub(super) fn transmit(&mut self, ctx: &TcpShared, spare: &mut TxBuf) {
        let borrowed = self.tx.is_idle();
        if borrowed {
            std::mem::swap(&mut self.tx, spare);
        }
        loop {
            self.fill_tx();
            let more = !self.tx.is_empty() && self.flush_tx(ctx);
            // Sends whose last octet is written complete (RDMAP-80).
            self.iw.transmitted(&mut self.tx);
            if !more {
                break;
            }
        }
        if self.tx.is_empty() {
            self.held_since = None;
        } else if self.align > 0 && self.held_since.is_none() {
            self.held_since = Some(Instant::now());
        }
        if borrowed && self.tx.is_idle() {
            std::mem::swap(&mut self.tx, spare);
        }
    }

    /// Whole frames from the connection until [`TX_HIGH`] octets wait.
    pub(super) fn fill_tx(&mut self) {
        if self.write_side == WriteSide::Closed {
            return;
        }
        let waiting = self.tx.len();
        if waiting < TX_HIGH {
            self.iw.poll_transmit_into(&mut self.tx, TX_HIGH - waiting);
        }
    }

    /// Writes the transmit queue, payloads straight from registered memory (one vectored
    /// write per [`softrdma_memory::MAX_IOV`] slices); `true` when it is empty afterwards.
    pub(super) fn flush_tx(&mut self, ctx: &TcpShared) -> bool {
        let mut wrote = false;
        loop {
            // Kept back: what follows the last whole segment, once one went out.
            let limit = match self.align {
                0 => usize::MAX,
                a => match self.tx.len() / a * a {
                    0 if wrote => return false,
                    0 => usize::MAX,
                    whole => whole,
                },
            };
            wrote = true;
            let Conn {
                stream,
                tap,
                local,
                peer,
                ..
            } = self;
            let r = self.tx.write_with(|iov| {
                let cut;
                let iov = match limit {
                    usize::MAX => iov,
                    n => {
                        cut = crate::net::iov_prefix(iov, n);
                        &cut[..]
                    }
                };
                let r = crate::net::send_vectored(stream, iov);
                if let Ok(n) = r {
                    DeviceStats::add(&ctx.stats.octets_tx, n);
                    if let (Some(t), 1..) = (tap, n) {
                        tap::tcp_written(&**t, *local, *peer, iov, n);
                    }
                }
                r
            });
            match r {
                Ok(None) => return true,
                Ok(Some(0)) => {
                    self.lost();
                    return false;
                }
                Ok(Some(_)) => {}
                Err(Ok(e)) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(Ok(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(Ok(_)) => {
                    self.lost();
                    return false;
                }
                Err(Err(_)) => {
                    // A source was revoked under a framed FPDU: the stream cannot go on.
                    self.lost();
                    return false;
                }
            }
        }
    }

    /// Tells the tap this side's FIN left.
    pub(in crate::tcp) fn tap_fin(&self) {
        if let Some(t) = &self.tap {
            t.tapped(Tapped::TcpClose {
                local: self.local,
                peer: self.peer,
                dir: Direction::Sent,
            });
        }
    }

    /// The connection failed under us (write error).
    pub(super) fn lost(&mut self) {
        tracing::info!(local = %self.local, peer = %self.peer, "iWARP connection lost (write failed)");
        // Sends not written never left (RDMAP-80): flushed, not completed.
        self.iw.transmit_failed();
        self.tx.clear();
        self.write_side = WriteSide::Closed;
        self.on_eof();
        self.dead = true;
    }
}
