//! RPC-over-RDMA Version One (RFC 8166) on the softrdma verbs API, with the RFC 8797
//! connection private data: [`RdmaTransport`] for clients, [`crate::Server::serve_rdma`] for
//! servers. One code path for iWARP and RoCE: the device the context was opened on decides.

mod client;
pub mod plan;
mod pool;
mod server;

pub use client::{RdmaStats, RdmaTransport};
pub use server::RdmaServer;

use std::io;

use softrdma::{
    Access, BusyPoll, Context, Cq, Mr, Pd, Qp, QpCap, QpInitAttr, RecvWr, SendFlags, SendWr,
    WcStatus, WorkCompletion,
};
use softrdma_wire::rpcrdma::Repr;
use softrdma_wire::rpcrdma::{
    DEFAULT_INLINE_THRESHOLD, PRIVATE_DATA_FLAG_REMOTE_INVALIDATE, PRIVATE_DATA_LEN,
    PrivateDataRepr,
};

/// The NFS/RDMA port (RFC 8166 §9, RFC 8267).
pub const NFS_RDMA_PORT: u16 = 20049;
/// rpcbind netid of RPC-over-RDMA on IPv4 (RFC 8166 §9, RPCRDMA-86).
pub const NETID_RDMA: &str = "rdma";
/// rpcbind netid of RPC-over-RDMA on IPv6.
pub const NETID_RDMA6: &str = "rdma6";

/// Smallest inline threshold a receiver supports (RFC 8166 §3.3.3, RPCRDMA-09).
pub const MIN_INLINE: usize = 1024;
/// Largest buffer size RFC 8797 private data can state.
pub const MAX_INLINE: usize = 256 * 1024;

/// How an RPC-over-RDMA connection is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Client: credits asked for (calls in flight); server: credits granted (never 0,
    /// RPCRDMA-03), each backed by a posted Receive (RPCRDMA-05).
    pub credits: u32,
    /// Largest Send we post (advertised as the RFC 8797 Send Size).
    pub inline_send: usize,
    /// Size of each Receive buffer (advertised as the Receive Size).
    pub inline_recv: usize,
    /// Largest RPC message put together from chunks (a larger Read chunk is refused,
    /// RPCRDMA-81; a larger reply needs a larger Reply chunk than the client offers).
    pub max_message: usize,
    /// Advertise that we take Send With Invalidate (the RFC 8797 flag, as Linux does): a
    /// client registers its chunks remotely invalidatable, a server that sees the flag
    /// invalidates the one handle of a call's chunks with its reply.
    pub remote_invalidate: bool,
    /// RoCE: the largest path MTU asked for or accepted (the smaller of both ends' is
    /// used). 1024 by default, what `rdma_cm` picks on a 1500-octet Ethernet link; a link
    /// with a larger MTU (loopback, jumbo frames) carries 4096.
    pub roce_pmtu: u32,
    /// How the connection's waits poll their CQ before they sleep. Off by default: the
    /// waits sleep at once, as RPC over TCP sleeps in its reads. With calls in flight a
    /// poll only takes the CPU the other end's threads need (on this project's two-core
    /// loopback benchmark: 15 % fewer NULL calls with the verbs default, adaptive up to
    /// 50 µs); a client with a core of its own gains latency from one.
    pub busy_poll: BusyPoll,
}

impl Default for RdmaConfig {
    /// 32 credits and 4 KiB inline both ways (what Linux advertises), 4 MiB messages,
    /// RoCE path MTU 1024.
    fn default() -> RdmaConfig {
        RdmaConfig {
            credits: 32,
            inline_send: 4096,
            inline_recv: 4096,
            max_message: 4 << 20,
            remote_invalidate: true,
            roce_pmtu: softrdma::roce::DEFAULT_ROCE_PMTU,
            busy_poll: BusyPoll::Off,
        }
    }
}

impl RdmaConfig {
    /// The configuration as it is used: Send and Receive buffers of 1 KiB to 256 KiB in
    /// whole KiB (RPCRDMA-09; what RFC 8797 can state), at least one credit.
    pub fn normalized(self) -> RdmaConfig {
        let size = |n: usize| (n.clamp(MIN_INLINE, MAX_INLINE) / 1024) * 1024;
        RdmaConfig {
            credits: self.credits.max(1),
            inline_send: size(self.inline_send),
            inline_recv: size(self.inline_recv),
            ..self
        }
    }

    /// Our RFC 8797 private data.
    fn private_data(&self) -> Vec<u8> {
        let mut b = vec![0u8; PRIVATE_DATA_LEN];
        let repr = PrivateDataRepr::new(
            self.inline_send as u32,
            self.inline_recv as u32,
            self.remote_invalidate,
        );
        let _ = repr.emit(&mut b);
        b
    }
}

/// The inline thresholds of a connection (RFC 8166 §3.3.2): what fits in one Send each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Requester → Responder.
    pub call: usize,
    /// Responder → Requester.
    pub reply: usize,
    /// The peer takes Send With Invalidate (its RFC 8797 flag).
    pub remote_invalidate: bool,
}

/// The thresholds from our sizes and the peer's private data; without valid private data,
/// 1024 each way (RPCRDMA-10). `client`: we are the requester.
fn thresholds(cfg: &RdmaConfig, peer: &[u8], client: bool) -> Thresholds {
    let (send, recv) = (cfg.inline_send, cfg.inline_recv);
    match PrivateDataRepr::parse(peer) {
        Ok(p) => {
            let ps = p.max_send_size as usize;
            let pr = p.max_receive_size as usize;
            let out = send.min(pr);
            let inn = recv.min(ps);
            Thresholds {
                call: if client { out } else { inn },
                reply: if client { inn } else { out },
                remote_invalidate: p.flags & PRIVATE_DATA_FLAG_REMOTE_INVALIDATE != 0,
            }
        }
        Err(_) => Thresholds {
            call: DEFAULT_INLINE_THRESHOLD as usize,
            reply: DEFAULT_INLINE_THRESHOLD as usize,
            remote_invalidate: false,
        },
    }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// One end's verbs objects: a QP on one CQ, `credits` Receive buffers (all posted) and
/// `credits` Send buffers.
struct Endpoint {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    recv_mr: Mr,
    send_mr: Mr,
}

impl Endpoint {
    /// Room for `extra_sends` RDMA Reads and Writes besides the Sends. Every Receive is
    /// posted before the connection exists (RPCRDMA-05, -06).
    fn new(ctx: &Context, cfg: &RdmaConfig, extra_sends: u32) -> io::Result<Endpoint> {
        let credits = cfg.credits.max(1);
        let pd = ctx.alloc_pd();
        let cq = ctx
            .create_cq((2 * credits + extra_sends) as usize + 64, None)
            .map_err(io_err)?;
        cq.set_busy_poll(cfg.busy_poll);
        let mut attr = QpInitAttr::new(&cq, &cq);
        attr.cap = QpCap {
            max_send_wr: credits + extra_sends + 16,
            max_recv_wr: credits,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(attr).map_err(io_err)?;
        let recv_mr = pd
            .alloc_mr(credits as usize * cfg.inline_recv, Access::LOCAL_WRITE)
            .map_err(io_err)?;
        let send_mr = pd
            .alloc_mr(credits as usize * cfg.inline_send, Access::empty())
            .map_err(io_err)?;
        let e = Endpoint {
            pd,
            cq,
            qp,
            recv_mr,
            send_mr,
        };
        for i in 0..credits as usize {
            e.post_recv(cfg.inline_recv, i)?;
        }
        Ok(e)
    }

    /// Writes `hdr` and the payload `parts` (in order) straight into Send buffer `slot` (of
    /// `size` octets) and posts the Send as `wr_id`, signaled if asked.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        slot: usize,
        size: usize,
        hdr: &Repr<'_>,
        parts: &[&[u8]],
        wr_id: u64,
        invalidate: Option<u32>,
        signaled: bool,
    ) -> io::Result<()> {
        let wr = self.send_wr(slot, size, hdr, parts, wr_id, invalidate)?;
        let wr = if signaled {
            wr
        } else {
            wr.with_flags(SendFlags::empty())
        };
        self.qp.post_send(wr).map_err(io_err)
    }

    /// [`Endpoint::send`] without the posting: the Send work request, signaled, its buffer
    /// filled (Send With Invalidate of `invalidate` if given).
    fn send_wr(
        &self,
        slot: usize,
        size: usize,
        hdr: &Repr<'_>,
        parts: &[&[u8]],
        wr_id: u64,
        invalidate: Option<u32>,
    ) -> io::Result<SendWr> {
        let hlen = hdr.buffer_len();
        let len = hlen + parts.iter().map(|p| p.len()).sum::<usize>();
        if len > size {
            return Err(io_err("an RPC-over-RDMA message larger than a Send buffer"));
        }
        let off = slot * size;
        {
            let mut g = self.send_mr.write();
            let at = self.send_mr.buffer_offset() + off;
            let buf = g
                .get_mut(at..at + len)
                .ok_or_else(|| io_err("no such Send buffer"))?;
            hdr.emit(&mut buf[..hlen]).map_err(io_err)?;
            let mut at = hlen;
            for p in parts {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        }
        let sge = [self.send_mr.sge(off, len as u32)];
        let wr = match invalidate {
            Some(k) => SendWr::send_with_invalidate(wr_id, sge, softrdma::Key(k)),
            None => SendWr::send(wr_id, sge),
        };
        Ok(wr.with_flags(SendFlags::SIGNALED))
    }

    /// The messages that the successful Receive completions among `wcs` delivered (into
    /// buffers of `size` octets), copied out, each at its completion's index in `wcs`; their
    /// buffers are posted again, all at once, before any of them is looked at (a credit a
    /// reply grants, or a reply frees, is backed by a posted Receive, RPCRDMA-05).
    fn take_received(
        &self,
        size: usize,
        wcs: &[WorkCompletion],
    ) -> io::Result<Vec<(usize, Vec<u8>)>> {
        let mut out = Vec::with_capacity(wcs.len());
        let mut repost = Vec::with_capacity(wcs.len());
        for (k, wc) in wcs.iter().enumerate() {
            if wrid::kind(wc.wr_id) != wrid::RECV || wc.status != WcStatus::Success {
                continue;
            }
            let i = wrid::index(wc.wr_id) as usize;
            let mut msg = vec![0u8; (wc.byte_len as usize).min(size)];
            self.recv_mr.copy_out(i * size, &mut msg).map_err(io_err)?;
            out.push((k, msg));
            repost.push(self.recv_wr(size, i));
        }
        if !repost.is_empty() {
            self.qp.post_recv_list(repost).map_err(|(_, e)| io_err(e))?;
        }
        Ok(out)
    }

    /// (Re)posts Receive buffer `i` of `size` octets.
    fn post_recv(&self, size: usize, i: usize) -> io::Result<()> {
        self.qp.post_recv(self.recv_wr(size, i)).map_err(io_err)
    }

    fn recv_wr(&self, size: usize, i: usize) -> RecvWr {
        RecvWr::new(
            wrid::RECV | i as u64,
            [self.recv_mr.sge(i * size, size as u32)],
        )
    }
}

/// What a completion's `wr_id` stands for: kind in the top octet, a number below.
mod wrid {
    pub const RECV: u64 = 1 << 56;
    pub const SEND: u64 = 2 << 56;
    pub const READ: u64 = 3 << 56;
    pub const WRITE: u64 = 4 << 56;
    pub const KIND: u64 = 0xFF << 56;

    pub fn kind(id: u64) -> u64 {
        id & KIND
    }

    pub fn index(id: u64) -> u64 {
        id & !KIND
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RPCRDMA-09, RPCRDMA-86.
    #[test]
    fn rpcrdma_09_86_buffers_of_at_least_1024_and_the_netids() {
        let c = RdmaConfig {
            credits: 0,
            inline_send: 100,
            inline_recv: 5000,
            ..RdmaConfig::default()
        }
        .normalized();
        assert_eq!((c.credits, c.inline_send, c.inline_recv), (1, 1024, 4096));
        let big = RdmaConfig {
            inline_send: 1 << 20,
            ..RdmaConfig::default()
        };
        assert_eq!(big.normalized().inline_send, MAX_INLINE);
        assert_eq!(
            (NETID_RDMA, NETID_RDMA6, NFS_RDMA_PORT),
            ("rdma", "rdma6", 20049)
        );
    }

    #[test]
    fn thresholds_are_the_smaller_of_each_pair_or_1024() {
        let ours = RdmaConfig {
            inline_send: 8192,
            inline_recv: 2048,
            ..RdmaConfig::default()
        };
        let mut peer = vec![0u8; 8];
        PrivateDataRepr::new(4096, 4096, true)
            .emit(&mut peer)
            .unwrap();
        let t = thresholds(&ours, &peer, true);
        assert_eq!((t.call, t.reply, t.remote_invalidate), (4096, 2048, true));
        let t = thresholds(&ours, &peer, false);
        assert_eq!((t.call, t.reply), (2048, 4096));
        let t = thresholds(&ours, b"junk", true);
        assert_eq!((t.call, t.reply), (1024, 1024));
        assert_eq!(ours.private_data().len(), 8);
        let back = PrivateDataRepr::parse(&ours.private_data()).unwrap();
        assert_eq!(
            (back.max_send_size, back.max_receive_size, back.flags),
            (8192, 2048, PRIVATE_DATA_FLAG_REMOTE_INVALIDATE)
        );
        let off = RdmaConfig {
            remote_invalidate: false,
            ..ours
        };
        assert_eq!(
            PrivateDataRepr::parse(&off.private_data()).unwrap().flags,
            0
        );
    }
}
