//! The client's latency loop, shared by the iWARP and RoCE perf clients: Send ping-pong (the
//! server echoes), Write ping-pong (both sides watch the last octet of their buffer, as
//! ib_write_lat) and Read round trips (as ib_read_lat).

use std::time::{Duration, Instant};

use softrdma::{Cq, Key, Mr, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion};

use super::proto::Test;
use super::{Limit, PerfError};
use crate::verbs_util::{WaitMode, spin_until, wait_some};

/// Safety net of every wait: a test that stalls this long has failed.
pub(crate) const SAFETY: Duration = Duration::from_secs(30);

/// A completion in error ends the test.
pub(crate) fn check(wc: &WorkCompletion) -> Result<(), PerfError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(PerfError::Completion(format!(
            "{:?} of wr_id {:#x} completed with {:?}",
            wc.opcode, wc.wr_id, wc.status
        )))
    }
}

/// What the loop needs of a QP, iWARP or RoCE.
pub(crate) trait LatQp {
    fn post_send(&self, wr: SendWr) -> Result<(), softrdma::Error>;
    fn post_recv(&self, wr: RecvWr) -> Result<(), softrdma::Error>;
    /// The QP can no longer complete anything (Error, closed).
    fn dead(&self) -> bool;
    /// Its state, for messages.
    fn describe(&self) -> String;
}

impl LatQp for softrdma::Qp {
    fn post_send(&self, wr: SendWr) -> Result<(), softrdma::Error> {
        softrdma::Qp::post_send(self, wr)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<(), softrdma::Error> {
        softrdma::Qp::post_recv(self, wr)
    }
    fn dead(&self) -> bool {
        self.state().is_dead()
    }
    fn describe(&self) -> String {
        format!("{:?}", self.state())
    }
}

/// One latency test on a connected QP whose peer serves `test`.
pub(crate) struct LatLoop<'a, Q: LatQp> {
    pub qp: &'a Q,
    pub cq: &'a Cq,
    /// What this side sends from (Send, Write) or reads into (Read).
    pub local: &'a Mr,
    /// Where the peer's Sends and Writes land.
    pub sink: &'a Mr,
    /// The peer's buffer.
    pub rkey: Key,
    pub raddr: u64,
    /// Flags of Sends and Writes (inline when small; signaled or not).
    pub flags: SendFlags,
    pub wait: WaitMode,
}

impl<Q: LatQp> LatLoop<'_, Q> {
    /// Round-trip samples (ns) after `warmup` untimed iterations. A Send ping-pong needs one
    /// receive posted on `sink` before the first iteration.
    pub(crate) fn run(
        &self,
        test: Test,
        size: u32,
        limit: Limit,
        warmup: u64,
    ) -> Result<Vec<u64>, PerfError> {
        let n = size as usize;
        let mut samples = Vec::new();
        let mut wcs = Vec::with_capacity(16);
        let start = Instant::now();
        let mut i = 0u64;
        loop {
            match limit {
                Limit::Iters(k) if i >= k + warmup => break,
                Limit::Duration(d) if i >= warmup && start.elapsed() >= d => break,
                _ => {}
            }
            let t0 = match test {
                Test::SendLat => {
                    let t0 = Instant::now();
                    self.qp.post_send(
                        SendWr::send(i, vec![self.local.sge(0, size)]).with_flags(self.flags),
                    )?;
                    self.wait_for(WcOpcode::Recv, &mut wcs)?;
                    self.qp
                        .post_recv(RecvWr::new(1, vec![self.sink.sge(0, size)]))?;
                    t0
                }
                Test::WriteLat => {
                    let tag = (i % 255) as u8 + 1;
                    self.local.copy_in(n - 1, &[tag])?;
                    let t0 = Instant::now();
                    self.qp.post_send(
                        SendWr::write(i, vec![self.local.sge(0, size)], self.rkey, self.raddr)
                            .with_flags(self.flags),
                    )?;
                    let mut b = [0u8; 1];
                    // Polling the CQ while spinning on memory runs the transport in this
                    // thread (the Write lands without a hand-off); its completions are
                    // checked below.
                    wcs.clear();
                    let arrived = spin_until(SAFETY, || {
                        self.cq.poll(16, &mut wcs);
                        self.sink.copy_out(n - 1, &mut b).is_ok() && b[0] == tag || self.qp.dead()
                    });
                    if !arrived || b[0] != tag {
                        return Err(PerfError::Protocol(format!(
                            "the server's RDMA Write {i} did not arrive (QP {})",
                            self.qp.describe()
                        )));
                    }
                    // Signaled Writes: take their completions as they come.
                    self.cq.poll(16, &mut wcs);
                    wcs.iter().try_for_each(check)?;
                    t0
                }
                _ => {
                    let t0 = Instant::now();
                    self.qp.post_send(SendWr::read(
                        i,
                        Some(self.local.sge(0, size)),
                        self.rkey,
                        self.raddr,
                    ))?;
                    self.wait_for(WcOpcode::RdmaRead, &mut wcs)?;
                    t0
                }
            };
            if i >= warmup {
                samples.push(t0.elapsed().as_nanos() as u64);
            }
            i += 1;
        }
        Ok(samples)
    }

    fn wait_for(&self, op: WcOpcode, wcs: &mut Vec<WorkCompletion>) -> Result<(), PerfError> {
        loop {
            wcs.clear();
            wait_some(self.cq, self.wait, 8, SAFETY, wcs)?;
            let mut got = false;
            for wc in wcs.iter() {
                check(wc)?;
                got |= wc.opcode == op;
            }
            if got {
                return Ok(());
            }
        }
    }
}
