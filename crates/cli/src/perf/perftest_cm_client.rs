//! The client of perftest's servers over rdma_cm (`ib_write_bw -R`, `ib_read_bw -R`,
//! `ib_send_bw -R`): `softrdma perf --perftest-cm --test write|read|send HOST`, over either
//! transport. The mirror of [`perftest_server`](super::perftest_server), whose docs
//! describe the exchange: two connections to the server's port, the first carrying the
//! out-of-band messages as Sends (each answered by one of the same size), the second the
//! test. The order is what perftest 6.06's client does (seen in the captures of
//! `scripts/interop-rxe.sh`): version (16 octets), cycle buffer and cache line size (4
//! each, big-endian), the MTU (`"3\0"`), a zero record, the data connection, a zero record,
//! the QP records (56 octets, big-endian: lid, out_reads, qpn, psn, rkey, pad, vaddr, GID,
//! srqn, gid_index) three times (four for Send), the traffic, a record, then for RDMA
//! tests the report (size, iterations, BW peak, BW average, Mpps; 8 octets each) and a
//! last record.

use std::net::SocketAddr;
use std::time::Duration;

use softrdma::{
    Access, ConnectParams, Context, Cq, Key, Mr, Pd, Qp, QpCap, QpInitAttr, RecvWr, SendFlags,
    SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::perftest_client::{
    PERFTEST_VERSION, PerftestDest, PerftestResult, PerftestTest, Traffic,
};
use super::{Limit, PerfArgs, PerfError, bind_ip, open, resolve};
use crate::verbs_util::{local_ip_toward, wait_some};

/// A binary `pingpong_dest` record.
const REC_LEN: usize = 56;
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// READs outstanding on the data connection of a Read test.
const OUT_READS: u16 = 16;
const SLOT: usize = 256;
const SLOTS: u32 = 4;

/// perftest's binary record of `d` (and `gid_index`).
fn encode(d: &PerftestDest) -> [u8; REC_LEN] {
    let mut m = [0u8; REC_LEN];
    m[0..4].copy_from_slice(&u32::from(d.lid).to_be_bytes());
    m[4..8].copy_from_slice(&u32::from(d.out_reads).to_be_bytes());
    m[8..12].copy_from_slice(&d.qpn.to_be_bytes());
    m[12..16].copy_from_slice(&d.psn.to_be_bytes());
    m[16..20].copy_from_slice(&d.rkey.to_be_bytes());
    m[24..32].copy_from_slice(&d.vaddr.to_be_bytes());
    m[32..48].copy_from_slice(&d.gid);
    m[48..52].copy_from_slice(&d.srqn.to_be_bytes());
    m[52..56].copy_from_slice(&1u32.to_be_bytes());
    m
}

fn decode(m: &[u8]) -> Option<PerftestDest> {
    if m.len() != REC_LEN {
        return None;
    }
    let be32 = |at: usize| u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
    let mut vaddr = [0u8; 8];
    vaddr.copy_from_slice(&m[24..32]);
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&m[32..48]);
    Some(PerftestDest {
        lid: be32(0) as u16,
        out_reads: be32(4).min(u32::from(u16::MAX)) as u16,
        qpn: be32(8),
        psn: be32(12),
        rkey: be32(16),
        vaddr: u64::from_be_bytes(vaddr),
        gid,
        srqn: be32(48),
    })
}

/// Where one out-of-band exchange stands: our message sent, the answer received.
#[derive(Default)]
struct Exchange {
    sent: bool,
    answered: bool,
    /// A completion in error seen while the exchange was not done.
    failed: Option<String>,
}

impl Exchange {
    fn done(&self) -> bool {
        self.sent && self.answered
    }

    /// Takes a batch of completions: the receives that succeeded (their slot and length,
    /// to be read and posted again), in order. A completion in error fails the exchange
    /// unless the batch completes it: a server that closes right after its last answer
    /// flushes our other posted receives, and those flushes may come in the batch that
    /// carries the answer (seen against siw with loss: its answer retransmitted, then its
    /// FIN, in one read).
    fn take(&mut self, wcs: &[WorkCompletion]) -> Result<Vec<(u64, usize)>, PerfError> {
        let mut slots = Vec::new();
        for wc in wcs {
            if wc.status != WcStatus::Success {
                self.failed
                    .get_or_insert_with(|| format!("out-of-band: {wc:?}"));
                continue;
            }
            match wc.opcode {
                WcOpcode::Recv => {
                    slots.push((wc.wr_id, wc.byte_len as usize));
                    self.answered = true;
                }
                _ => self.sent = true,
            }
        }
        if !self.done()
            && let Some(f) = self.failed.take()
        {
            return Err(PerfError::Completion(f));
        }
        Ok(slots)
    }
}

/// The out-of-band connection: one message out, the answer of the same size back.
struct Oob {
    qp: Qp,
    cq: Cq,
    rx: Mr,
    tx: Mr,
}

impl Oob {
    fn new(pd: &Pd, ctx: &Context) -> Result<Oob, PerfError> {
        let cq = ctx.create_cq(64, None)?;
        let qp = pd.create_qp(QpInitAttr {
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: SLOTS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInitAttr::new(&cq, &cq)
        })?;
        let rx = pd.alloc_mr(SLOTS as usize * SLOT, Access::LOCAL_WRITE)?;
        let tx = pd.alloc_mr(SLOT, Access::LOCAL_WRITE)?;
        for i in 0..SLOTS {
            qp.post_recv(RecvWr::new(
                u64::from(i),
                vec![rx.sge(i as usize * SLOT, SLOT as u32)],
            ))?;
        }
        Ok(Oob { qp, cq, rx, tx })
    }

    fn xchg(&self, mine: &[u8]) -> Result<Vec<u8>, PerfError> {
        self.tx.copy_in(0, mine)?;
        self.qp.post_send(
            SendWr::send(1 << 40, vec![self.tx.sge(0, mine.len() as u32)])
                .with_flags(SendFlags::SIGNALED),
        )?;
        let mut x = Exchange::default();
        let mut got = None;
        let mut wcs = Vec::new();
        while !x.done() {
            wcs.clear();
            wait_some(
                &self.cq,
                crate::verbs_util::WaitMode::Block,
                4,
                Duration::from_secs(30),
                &mut wcs,
            )?;
            for slot in x.take(&wcs)? {
                let mut b = vec![0u8; slot.1];
                self.rx.copy_out(slot.0 as usize * SLOT, &mut b)?;
                got.get_or_insert(b);
                self.qp.post_recv(RecvWr::new(
                    slot.0,
                    vec![self.rx.sge(slot.0 as usize * SLOT, SLOT as u32)],
                ))?;
            }
        }
        let b = got.unwrap_or_default();
        if b.len() != mine.len() {
            return Err(PerfError::Protocol(format!(
                "the server answered {} octets to {}",
                b.len(),
                mine.len()
            )));
        }
        Ok(b)
    }

    fn xchg_dest(&self, me: &PerftestDest) -> Result<PerftestDest, PerfError> {
        let b = self.xchg(&encode(me))?;
        decode(&b).ok_or_else(|| PerfError::Protocol("not a perftest record".into()))
    }
}

/// Runs `ib_{write,read,send}_bw -R`'s client against the perftest server at `host`:port.
pub fn perftest_cm_client(args: &PerfArgs, host: &str) -> Result<PerftestResult, PerfError> {
    let test = args.test;
    if test == PerftestTest::Atomic {
        return Err(PerfError::Usage(
            "--perftest-cm: write, read or send (perftest has no ib_atomic_bw -R here)".into(),
        ));
    }
    let size = args.size.unwrap_or(65536);
    let iters = match args.limit(5000) {
        Limit::Iters(n) => n,
        Limit::Duration(_) => {
            return Err(PerfError::Usage(
                "--perftest-cm runs -n iterations, not -D".into(),
            ));
        }
    };
    let addr: SocketAddr = resolve(host, args.port)?;
    let ip = match bind_ip(args)? {
        Some(ip) => ip,
        None => local_ip_toward(addr)?,
    };
    let ctx = open(args, ip, args.roce_port())?;
    let pd = ctx.alloc_pd();
    let oob = Oob::new(&pd, &ctx)?;
    oob.qp.connect(
        addr,
        ConnectParams {
            ird: 0,
            ord: 0,
            ..ConnectParams::default()
        },
    )?;

    let mut v = [0u8; 16];
    v[..PERFTEST_VERSION.len()].copy_from_slice(PERFTEST_VERSION.as_bytes());
    oob.xchg(&v)?;
    let be = |b: Vec<u8>| u32::from_be_bytes(b[..4].try_into().unwrap_or_default());
    let cycle = CYCLE_BUFFER.max(be(oob.xchg(&CYCLE_BUFFER.to_be_bytes())?));
    let line = CACHE_LINE
        .max(be(oob.xchg(&CACHE_LINE.to_be_bytes())?))
        .max(8);
    let mtu = oob.xchg(b"3\0")?;
    let mtu = String::from_utf8_lossy(&mtu)
        .trim_end_matches('\0')
        .parse::<u32>()
        .ok()
        .filter(|e| (1..=5).contains(e))
        .map_or(1024, |e| 128 << e);
    let zero = [0u8; REC_LEN];
    oob.xchg(&zero)?;

    // The data connection.
    let buf_len = (2 * size.max(cycle)).div_ceil(line) * line;
    let access = match test {
        PerftestTest::Read => Access::LOCAL_WRITE | Access::REMOTE_READ,
        _ => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    };
    let mr = pd.alloc_mr(buf_len as usize, access)?;
    let tx_depth = u64::from(args.tx_depth.max(1)).min(iters.max(1));
    let cq = ctx.create_cq(tx_depth as usize + 16, None)?;
    let qp = pd.create_qp(QpInitAttr {
        cap: QpCap {
            max_send_wr: tx_depth as u32 + 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..QpInitAttr::new(&cq, &cq)
    })?;
    let out_reads = if test == PerftestTest::Read {
        OUT_READS
    } else {
        0
    };
    // perftest's server listens for the data connection only once it has answered the zero
    // record: a connection that comes first is refused (RoCE: REJ "invalid service ID";
    // iWARP: the TCP connect is refused); try again, as perftest's client does.
    let mut tries = 0;
    loop {
        let r = qp.connect(
            addr,
            ConnectParams {
                ird: out_reads,
                ord: out_reads,
                ..ConnectParams::default()
            },
        );
        let refused = match &r {
            Err(softrdma::Error::Rejected {
                reason: Some(8), ..
            }) => true,
            Err(softrdma::Error::Io(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
            _ => false,
        };
        if !refused || tries >= 100 {
            r?;
            break;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    oob.xchg(&zero)?;
    let local = PerftestDest {
        lid: 0,
        out_reads: out_reads.max(1),
        qpn: qp.qp_num(),
        psn: 0,
        rkey: mr.rkey().0,
        vaddr: mr.addr(0),
        gid: ctx.roce_gid().unwrap_or_default(),
        srqn: 0,
    };
    let remote = oob.xchg_dest(&local)?;
    let rounds = if test == PerftestTest::Send { 3 } else { 2 };
    for _ in 0..rounds {
        oob.xchg_dest(&local)?;
    }
    let t = Traffic {
        test,
        qp: &qp,
        cq: &cq,
        mr: &mr,
        size,
        iters,
        tx_depth,
        cycle,
        line,
        rkey: Key(remote.rkey),
        vaddr: remote.vaddr,
    };
    let r = t.run(args.wait())?.result(mtu, local, remote);
    oob.xchg_dest(&local)?;
    if test != PerftestTest::Send {
        // The report the server prints, field by field; then the last handshake.
        r.report(true, |b| oob.xchg(b))?;
        oob.xchg_dest(&local)?;
    }
    let _ = (qp.disconnect(), oob.qp.disconnect());
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64, opcode: WcOpcode, status: WcStatus, byte_len: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, status, opcode, byte_len)
    }

    /// The server's last answer and the flush of our other receives (it closed at once)
    /// in one batch: the exchange is done. A flush before the answer fails it, as does a
    /// flushed Send.
    #[test]
    fn flushes_after_the_answer_end_nothing() {
        use WcStatus::{Success, WorkRequestFlushed as Flushed};
        let mut x = Exchange::default();
        assert_eq!(
            x.take(&[wc(1 << 40, WcOpcode::Send, Success, 56)]).unwrap(),
            []
        );
        assert!(!x.done());
        let batch = [
            wc(3, WcOpcode::Recv, Success, 56),
            wc(0, WcOpcode::Recv, Flushed, 0),
            wc(1, WcOpcode::Recv, Flushed, 0),
        ];
        assert_eq!(x.take(&batch).unwrap(), [(3, 56)]);
        assert!(x.done());

        let mut x = Exchange::default();
        x.take(&[wc(1 << 40, WcOpcode::Send, Success, 8)]).unwrap();
        assert!(x.take(&[wc(0, WcOpcode::Recv, Flushed, 0)]).is_err());

        let mut x = Exchange::default();
        let batch = [
            wc(2, WcOpcode::Recv, Success, 8),
            wc(1 << 40, WcOpcode::Send, Flushed, 0),
        ];
        assert!(x.take(&batch).is_err(), "our message never left");
    }

    /// The record perftest's ib_write_bw -R client sent (`scripts/interop-rxe.sh` capture).
    #[test]
    fn binary_record_round_trips() {
        let hex = "00000000000000010000001800ef8263000013ed157f000000007f1543f3c00000000000000000000000ffff0a4d00020000000000000001";
        let b: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let d = decode(&b).unwrap();
        assert_eq!(
            (d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr),
            (1, 0x18, 0xef8263, 0x13ed, 0x7f15_43f3_c000)
        );
        let mut again = encode(&d).to_vec();
        again[20..24].copy_from_slice(&b[20..24]); // perftest's padding is whatever
        assert_eq!(again, b);
    }
}
