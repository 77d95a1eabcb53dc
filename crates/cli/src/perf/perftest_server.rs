//! A server for perftest clients over rdma_cm: `ib_write_bw -R`, `ib_read_bw -R` and
//! `ib_send_bw -R` (perftest 4.5 and 6.x) can run against `softrdma perf --server
//! --perftest`.
//!
//! perftest with `-R` makes two rdma_cm connections to the same port. The first carries its
//! out-of-band exchange as Sends: the client sends a message, the server answers with one of
//! the same size (version string, cycle buffer, cache line size, MTU, `pingpong_dest`
//! records, and at the end the client's bandwidth report, eight octets at a time). The
//! second is the test's data connection. A `pingpong_dest` record is 56 octets in network
//! order: lid, out_reads, qpn, psn, rkey (u32 each), 4 octets of padding, vaddr (u64), GID
//! (16), srqn, gid_index (u32 each); perftest also exchanges all-zero records as barriers.
//! This server is purely reactive: it echoes what it cannot interpret (which makes the
//! version and system checks pass), answers zero records with zero records and any other
//! record with its own (the data buffer's STag and address).
//!
//! Send bandwidth over iWARP needs credits (no RNR; over RoCE perftest uses none): perftest's client sends at most
//! `rx_depth` messages beyond the count the server RDMA-Writes (u32, host order) into the
//! client's credit word, the rkey/vaddr of the client's record. perftest's server writes it
//! every `rx_depth / 3` receives; this one after every receive, which fits any `rx_depth`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use softrdma::iwarp::FpduSize;
use softrdma::{
    AcceptParams, Access, ConnRequest, Context, Cq, Error, Key, Listener, Pd, PostError, Qp, QpCap,
    QpInitAttr, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus,
};

use super::PerfError;
use crate::verbs_util::{WaitMode, spin_until, wait_some};

/// wr_id bit of the out-of-band connection's receives.
const COMM: u64 = 1 << 62;
/// Receive slots of the out-of-band connection and their size.
const COMM_SLOTS: u32 = 16;
const COMM_SLOT_LEN: usize = 256;
/// Receives kept posted on the data connection (more than any perftest `rx_depth`).
const DATA_RECVS: u32 = 4096;
/// Size of a `pingpong_dest` record.
const DEST_LEN: usize = 56;

/// What a session showed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Messages on the out-of-band connection (each way).
    pub oob_messages: u64,
    /// Sends received on the data connection.
    pub data_recvs: u64,
    /// The client's report: size, iterations, BW peak and average (MB/s), Mpps.
    pub report: Option<(u64, u64, f64, f64, f64)>,
}

fn accept(req: ConnRequest, qp: &Qp, fpdu: FpduSize) -> Result<(), Error> {
    // Mirror what rdma_accept with the request's parameters gives: our IRD is the
    // initiator's ORD, our ORD its IRD.
    let (ird, ord) = req.peer_ird_ord().unwrap_or((16, 16));
    req.accept(
        qp,
        AcceptParams {
            private_data: Vec::new(),
            ird: ord,
            ord: ird,
            iwarp: softrdma::iwarp::AcceptParams { fpdu },
            ..AcceptParams::default()
        },
    )?;
    Ok(())
}

fn qp(pd: &Pd, cq: &Cq, send: u32, recv: u32) -> Result<Qp, Error> {
    pd.create_qp(QpInitAttr {
        cap: QpCap {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 256,
        },
        ..QpInitAttr::new(cq, cq)
    })
}

/// What the server answers to one out-of-band message of the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The reply (same size as the message).
    pub reply: Vec<u8>,
    /// The client's `pingpong_dest` named this buffer (its credit word for Send bandwidth).
    pub client_buf: Option<(u32, u64)>,
}

/// The answer to `msg`: a non-zero `pingpong_dest` gets ours (`qpn`, the data buffer's
/// `rkey` and `addr`, the client's out_reads), anything else is echoed.
pub fn answer(msg: &[u8], qpn: u32, rkey: u32, addr: u64) -> Answer {
    if msg.len() != DEST_LEN || msg.iter().all(|&b| b == 0) {
        return Answer {
            reply: msg.to_vec(),
            client_buf: None,
        };
    }
    let be32 = |at: usize| u32::from_be_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]]);
    let mut vaddr = [0u8; 8];
    vaddr.copy_from_slice(&msg[24..32]);
    let mut d = vec![0u8; DEST_LEN];
    d[4..8].copy_from_slice(&msg[4..8]); // out_reads: what the client can use
    d[8..12].copy_from_slice(&qpn.to_be_bytes());
    d[16..20].copy_from_slice(&rkey.to_be_bytes());
    d[24..32].copy_from_slice(&addr.to_be_bytes());
    Answer {
        reply: d,
        client_buf: Some((be32(16), u64::from_be_bytes(vaddr))),
    }
}

/// Posts a small INLINE request, waiting (briefly) for room in a full send queue.
fn post_inline(qp: &Qp, wr: SendWr) -> Result<(), PerfError> {
    let wr = wr.with_flags(SendFlags::INLINE);
    loop {
        match qp.post_send(wr.clone()) {
            Err(Error::Post(PostError::QueueFull)) => {
                let cap = u64::from(qp.cap().max_send_wr);
                if !spin_until(Duration::from_secs(10), || qp.sq_outstanding() < cap) {
                    return Err(PerfError::Protocol("send queue stuck".into()));
                }
            }
            r => return Ok(r?),
        }
    }
}

/// Serves one perftest session (both connections) from `listener`; the data buffer is
/// `buf_len` octets (perftest clients use up to 2 x max(size, cycle buffer)).
pub fn serve(
    ctx: &Context,
    listener: &Listener,
    buf_len: usize,
    fpdu: FpduSize,
    wait: WaitMode,
    log: bool,
) -> Result<Summary, PerfError> {
    let comm_req = listener.accept()?;
    let peer = comm_req.peer_addr();
    if log {
        eprintln!(
            "softrdma perf --perftest: {peer}: out-of-band connection (IRD/ORD {:?})",
            comm_req.peer_ird_ord()
        );
    }
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq((DATA_RECVS + 1024) as usize, None)?;
    let comm = qp(&pd, &cq, 64, COMM_SLOTS)?;
    let comm_rx = pd.alloc_mr(COMM_SLOTS as usize * COMM_SLOT_LEN, Access::LOCAL_WRITE)?;
    let comm_tx = pd.alloc_mr(COMM_SLOT_LEN, Access::LOCAL_WRITE)?;
    let slot = |i: u64| comm_rx.sge(i as usize * COMM_SLOT_LEN, COMM_SLOT_LEN as u32);
    for i in 0..u64::from(COMM_SLOTS) {
        comm.post_recv(RecvWr::new(COMM | i, vec![slot(i)]))?;
    }
    let data_mr = pd.alloc_mr(
        buf_len,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    data_mr.write()[..buf_len].fill(0x5a);
    let credit = pd.alloc_mr(8, Access::LOCAL_WRITE)?;
    accept(comm_req, &comm, fpdu)?;

    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // The data connection arrives while the out-of-band exchange waits for it.
        let (tx, rx) = mpsc::channel::<Result<Qp, Error>>();
        let (pd2, cq2, data_mr2) = (&pd, &cq, &data_mr);
        let stop2 = &stop;
        s.spawn(move || {
            let r = (|| {
                // The timeout only bounds how long a finished session waits for this thread.
                let req = loop {
                    match listener.accept_timeout(Duration::from_millis(200)) {
                        Err(Error::Timeout) if !stop2.load(Ordering::Acquire) => {}
                        r => break r?,
                    }
                };
                if log {
                    eprintln!(
                        "softrdma perf --perftest: {}: data connection (IRD/ORD {:?})",
                        req.peer_addr(),
                        req.peer_ird_ord()
                    );
                }
                let q = qp(pd2, cq2, 512, DATA_RECVS)?;
                for i in 0..u64::from(DATA_RECVS) {
                    q.post_recv(RecvWr::new(i, vec![data_mr2.sge_all()]))?;
                }
                accept(req, &q, fpdu)?;
                Ok(q)
            })();
            let _ = tx.send(r);
        });
        let mut data: Option<Qp> = None;
        let mut credit_to: Option<(Key, u64)> = None;
        let iwarp = ctx.transport() == softrdma::Transport::Iwarp;
        let mut sum = Summary::default();
        let mut reports = Vec::new();
        let mut wcs = Vec::with_capacity(256);
        let (mut comm_closed, mut data_closed) = (false, false);
        let result = 'session: loop {
            if comm_closed && data.is_none() {
                // The data connection may be up with its QP not yet handed over.
                match rx.recv_timeout(Duration::from_secs(2)) {
                    Ok(Ok(q)) => data = Some(q),
                    Ok(Err(e)) => break Err(e.into()),
                    Err(_) => break Ok(()),
                }
            }
            if comm_closed && data_closed {
                break Ok(());
            }
            wcs.clear();
            if let Err(e) = wait_some(&cq, wait, 256, Duration::from_secs(1), &mut wcs) {
                if comm.state().is_dead() {
                    break Ok(());
                }
                if !matches!(e, Error::Timeout) {
                    break Err(e.into());
                }
            }
            if data.is_none() {
                match rx.try_recv() {
                    Ok(Ok(q)) => data = Some(q),
                    Ok(Err(e)) => break Err(e.into()),
                    Err(_) => {}
                }
            }
            for wc in &wcs {
                if wc.status == WcStatus::WorkRequestFlushed {
                    // The session ends when both connections are closed: the data
                    // connection's last Sends may still come after the out-of-band
                    // connection's end (two connections, no order between them).
                    if wc.wr_id & COMM != 0 {
                        comm_closed = true;
                    } else {
                        data_closed = true;
                    }
                    continue;
                }
                if wc.status != WcStatus::Success {
                    break 'session Err(PerfError::Completion(format!("{wc:?}")));
                }
                if wc.opcode != WcOpcode::Recv {
                    continue;
                }
                if wc.wr_id & COMM != 0 {
                    let i = wc.wr_id & !COMM;
                    let mut msg = vec![0u8; wc.byte_len as usize];
                    if let Err(e) = comm_rx.copy_out(i as usize * COMM_SLOT_LEN, &mut msg) {
                        break 'session Err(e.into());
                    }
                    sum.oob_messages += 1;
                    let qpn = data.as_ref().map_or(0, |q| q.qp_num());
                    let a = answer(&msg, qpn, data_mr.rkey().0, data_mr.addr(0));
                    if let Some((rkey, vaddr)) = a.client_buf {
                        // Credits are perftest's for iWARP only; over RoCE its Send test
                        // relies on RNR retries (and the buffer is not writable).
                        if iwarp {
                            credit_to = Some((Key(rkey), vaddr));
                        }
                    } else if msg.len() == 8 {
                        reports.push(msg.clone());
                    }
                    let answer = a.reply;
                    let r = comm_tx
                        .copy_in(0, &answer)
                        .map_err(PerfError::from)
                        .and_then(|()| {
                            post_inline(
                                &comm,
                                SendWr::send(i, vec![comm_tx.sge(0, answer.len() as u32)]),
                            )
                        })
                        .and_then(|()| Ok(comm.post_recv(RecvWr::new(wc.wr_id, vec![slot(i)]))?));
                    if let Err(e) = r {
                        break 'session Err(e);
                    }
                } else {
                    if data.is_none() {
                        // Its completion can beat the accepting thread's hand-over.
                        match rx.recv() {
                            Ok(Ok(q)) => data = Some(q),
                            Ok(Err(e)) => break 'session Err(e.into()),
                            Err(_) => {
                                break 'session Err(PerfError::Protocol("lost the data QP".into()));
                            }
                        }
                    }
                    if data.is_none() {
                        // A Send on the data connection came before the accepting thread
                        // handed its QP over: it is on its way.
                        match rx.recv() {
                            Ok(Ok(q)) => data = Some(q),
                            Ok(Err(e)) => break 'session Err(e.into()),
                            Err(_) => {}
                        }
                    }
                    let Some(q) = &data else { continue };
                    sum.data_recvs += 1;
                    let r = q
                        .post_recv(RecvWr::new(wc.wr_id, vec![data_mr.sge_all()]))
                        .map_err(PerfError::from)
                        .and_then(|()| {
                            let Some((rkey, addr)) = credit_to else {
                                return Ok(());
                            };
                            let c = (sum.data_recvs as u32).to_le_bytes();
                            credit.copy_in(0, &c)?;
                            post_inline(
                                q,
                                SendWr::write(sum.data_recvs, vec![credit.sge(0, 4)], rkey, addr),
                            )
                        });
                    if let Err(e) = r {
                        break 'session Err(e);
                    }
                }
            }
        };
        stop.store(true, Ordering::Release);
        let _ = comm.disconnect();
        if let Some(q) = &data {
            let _ = q.disconnect();
        }
        result?;
        // The report: size and iterations (u64), BW peak, BW average (MB/s), Mpps (f64),
        // all in network order, as the last five 8-octet messages.
        if reports.len() >= 5 {
            let r = &reports[reports.len() - 5..];
            let u = |b: &Vec<u8>| u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
            let f = |b: &Vec<u8>| f64::from_bits(u(b));
            sum.report = Some((u(&r[0]), u(&r[1]), f(&r[2]), f(&r[3]), f(&r[4])));
        }
        Ok(sum)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The client's record from ../shared/captures/siw-ib_write_bw.pcap (frame 34): our
    /// answer carries its out_reads, our QPN, STag and address in network order, and its
    /// rkey and vaddr are taken as the client's buffer.
    #[test]
    fn answers_a_captured_pingpong_dest() {
        let msg = hex(concat!(
            "00000000000000010000000200b03a041c453d00b77f0000000055be717bd000",
            "525400770103000000000000000000000000000000000000"
        ));
        assert_eq!(msg.len(), DEST_LEN);
        let a = answer(&msg, 7, 0x0a78_6c00, 0x55b3_17ba_a000);
        assert_eq!(a.client_buf, Some((0x1c45_3d00, 0x55be_717b_d000)));
        let want = hex(concat!(
            "00000000000000010000000700000000",
            "0a786c00000000000000",
            "55b317baa000",
            "000000000000000000000000000000000000000000000000"
        ));
        assert_eq!(a.reply, want);
    }

    #[test]
    fn echoes_everything_else() {
        for msg in [
            hex("362e3036000000000000000000000000"),
            hex("00001000"),
            hex("3300"),
            vec![0; 56],
        ] {
            let a = answer(&msg, 1, 2, 3);
            assert_eq!((a.reply, a.client_buf), (msg, None));
        }
    }
}
