//! librdmacm's conventions on top of the InfiniBand CM ([`crate::cm`]), sans-IO: what an
//! `rdma_cm` peer (rping, perftest -R, udaddy, NFS over RDMA) puts in and expects from the
//! CM's messages, and the QP transitions it drives with them.
//!
//! Sources: rdma-core's `librdmacm/cma.c` and Linux's `drivers/infiniband/core/cma.c`
//! (service IDs of port spaces, the CMA header, the flow label, the defaults), IBA vol. 1
//! ch. 12 (the CM's messages and their private data) and 9.7.3 (path MTU). The driver
//! supplies addresses, randomness (ports, PSNs) and the QPs; these functions only decide.

use std::net::{IpAddr, SocketAddr};

use softrdma_memory::Access;
use softrdma_wire::ib::cm::{
    REJ_PRIVATE_LEN, REP_PRIVATE_LEN, REQ_PRIVATE_LEN, SIDR_REP_PRIVATE_LEN, SIDR_REQ_PRIVATE_LEN,
};
use softrdma_wire::ib::cma::{CMA_HDR_LEN, CmaHeader, PortSpace, port_of_service, service_id};

use crate::cm::{CmService, RepInfo, RepParams, ReqInfo, ReqParams, reason, sidr_status};
use crate::qp::{QpAttr, QpState};

#[cfg(test)]
mod tests;

/// The Q_Key librdmacm gives UD QPs of RDMA_PS_UDP (`RDMA_UDP_QKEY`, set by `cma.c`'s
/// `cma_set_qkey`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Retry and RNR retry counts librdmacm puts in a REQ and the REP's RNR retry count (7:
/// the most; for RNR, forever).
pub const RETRY_COUNT: u8 = 7;

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RdmaCmError {
    /// Not a path MTU of IBA 9.7.3 (256, 512, 1024, 2048, 4096).
    #[error("path MTU {0} is not 256, 512, 1024, 2048 or 4096")]
    BadMtu(u32),
    /// More application private data than the message leaves room for.
    #[error("private data is at most {max} octets in a {msg:?}")]
    PrivateDataTooLong {
        /// The message.
        msg: Message,
        /// What it takes from the application.
        max: usize,
    },
    /// The CMA header cannot name a source and destination of different IP versions.
    #[error("CMA header addresses of different IP versions")]
    CmaHeader,
}

/// The path MTU code of REQ (IBA 9.7.3, 12.6.5: 1 = 256 .. 5 = 4096).
pub fn mtu_code(pmtu: u32) -> Result<u8, RdmaCmError> {
    match pmtu {
        256 => Ok(1),
        512 => Ok(2),
        1024 => Ok(3),
        2048 => Ok(4),
        4096 => Ok(5),
        _ => Err(RdmaCmError::BadMtu(pmtu)),
    }
}

/// The path MTU of a code; codes out of range (a peer's 0, reserved 6..) are taken as the
/// nearest valid one.
pub fn mtu_of(code: u8) -> u32 {
    128 << code.clamp(1, 5)
}

/// A CA GUID for our address: EUI-64 of a locally administered MAC made from it, as a
/// RoCE NIC's is of its MAC (IPv4: 02:00 and the address; IPv6: 02 and its last five
/// octets).
pub fn ca_guid(ip: IpAddr) -> u64 {
    let o = match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            [0x02, 0x00, a, b, c, d]
        }
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [0x02, o[11], o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes([o[0], o[1], o[2], 0xFF, 0xFE, o[3], o[4], o[5]])
}

/// IRD and ORD travel in 8-bit fields of REQ and REP (IBA 12.6.5, 12.6.8).
pub fn clamp_u8(v: u16) -> u8 {
    v.min(u16::from(u8::MAX)) as u8
}

/// Why a request is refused: a REJ reason (IBA 12.6.7.2) for a REQ, a SIDR_REP status
/// (12.11.2) for a SIDR_REQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Nobody listens on the service ID (or it is not of the request's port space).
    NoListener,
    /// The private data do not begin with a CMA header: librdmacm's listener refuses it.
    BadHeader,
    /// The listener's backlog is full.
    BacklogFull,
    /// The application rejected.
    Consumer,
}

impl Refusal {
    /// The REJ reason.
    pub fn rej_reason(self) -> u16 {
        match self {
            Refusal::NoListener => reason::INVALID_SERVICE_ID,
            Refusal::BadHeader | Refusal::Consumer => reason::CONSUMER_DEFINED,
            Refusal::BacklogFull => reason::NO_RESOURCES,
        }
    }

    /// The SIDR_REP status.
    pub fn sidr_status(self) -> u8 {
        match self {
            Refusal::NoListener => sidr_status::UNSUPPORTED,
            _ => sidr_status::REJECT,
        }
    }
}

/// A CM message that carries the application's private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// REQ (RC, UC), after the CMA header.
    Req,
    /// SIDR_REQ (UD), after the CMA header.
    SidrReq,
    /// REP.
    Rep,
    /// REJ.
    Rej,
    /// SIDR_REP.
    SidrRep,
}

impl Message {
    /// Octets of private data the application may give (IBA 12.6: the message's private
    /// data; REQ and SIDR_REQ less librdmacm's header): 56, 180, 196, 148, 136.
    pub const fn max_private_data(self) -> usize {
        match self {
            Message::Req => REQ_PRIVATE_LEN - CMA_HDR_LEN,
            Message::SidrReq => SIDR_REQ_PRIVATE_LEN - CMA_HDR_LEN,
            Message::Rep => REP_PRIVATE_LEN,
            Message::Rej => REJ_PRIVATE_LEN,
            Message::SidrRep => SIDR_REP_PRIVATE_LEN,
        }
    }

    /// Refuses private data longer than the message takes.
    pub fn check(self, private_data: &[u8]) -> Result<(), RdmaCmError> {
        let max = self.max_private_data();
        if private_data.len() > max {
            return Err(RdmaCmError::PrivateDataTooLong { msg: self, max });
        }
        Ok(())
    }
}

/// The REQ's or SIDR_REQ's private data: the CMA header from `src` (our address and
/// ephemeral port) to `dst`, then the application's, checked against `msg`'s limit.
fn with_header(
    msg: Message,
    src: SocketAddr,
    dst: IpAddr,
    app: &[u8],
) -> Result<Vec<u8>, RdmaCmError> {
    msg.check(app)?;
    let mut pd = vec![0u8; CMA_HDR_LEN];
    CmaHeader { src, dst }
        .emit(&mut pd)
        .map_err(|_| RdmaCmError::CmaHeader)?;
    pd.extend_from_slice(app);
    Ok(pd)
}

/// The flow label of a RoCE path: Linux `cma.c`'s `cma_get_roce_udp_flow_label`, a hash
/// of the ports that spreads connections over ECMP paths.
pub fn flow_label(sport: u16, dport: u16) -> u32 {
    (u32::from(sport) * 31 + u32::from(dport)) & 0xF_FFFF
}

/// What the active side connects (`rdma_connect` on an RC or UC id).
#[derive(Clone, Debug)]
pub struct Connect<'a> {
    /// Our address and the ephemeral port the CMA header names.
    pub src: SocketAddr,
    /// The listener.
    pub dst: SocketAddr,
    /// Our QP.
    pub qpn: u32,
    /// Its type.
    pub service: CmService,
    /// The first PSN our QP expects.
    pub rq_psn: u32,
    /// RDMA Reads and atomics we serve at a time.
    pub ird: u16,
    /// RDMA Reads and atomics we keep outstanding.
    pub ord: u16,
    /// Path MTU code ([`mtu_code`]).
    pub path_mtu: u8,
    /// Our QP takes receives from an SRQ.
    pub srq: bool,
    /// The application's private data (at most 56 octets).
    pub private_data: &'a [u8],
}

/// The REQ of `c`: service ID RDMA_PS_TCP and the port (RC and UC alike), librdmacm's
/// retry counts, IRD and ORD clamped to their fields, the CMA header first in the private
/// data.
pub fn req(c: &Connect<'_>) -> Result<ReqParams, RdmaCmError> {
    let private_data = with_header(Message::Req, c.src, c.dst.ip(), c.private_data)?;
    Ok(ReqParams {
        peer: c.dst.ip(),
        service_id: service_id(PortSpace::Tcp, c.dst.port()),
        qpn: c.qpn,
        service: c.service,
        starting_psn: c.rq_psn,
        responder_resources: clamp_u8(c.ird),
        initiator_depth: clamp_u8(c.ord),
        retry_count: RETRY_COUNT,
        rnr_retry_count: RETRY_COUNT,
        path_mtu: c.path_mtu,
        srq: c.srq,
        flow_label: flow_label(c.src.port(), c.dst.port()),
        private_data,
    })
}

/// What a SIDR_REQ asks (`rdma_connect` on a UD id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// Where to.
    pub peer: IpAddr,
    /// RDMA_PS_UDP and the port.
    pub service_id: u64,
    /// The CMA header, then the application's.
    pub private_data: Vec<u8>,
}

/// The SIDR_REQ from `src` (our address, ephemeral port) to `dst` with the application's
/// private data (at most 180 octets).
pub fn sidr_req(src: SocketAddr, dst: SocketAddr, app: &[u8]) -> Result<SidrReq, RdmaCmError> {
    Ok(SidrReq {
        peer: dst.ip(),
        service_id: service_id(PortSpace::Udp, dst.port()),
        private_data: with_header(Message::SidrReq, src, dst.ip(), app)?,
    })
}

/// Which kind of request came: a REQ or a SIDR_REQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// REQ: RDMA_PS_TCP.
    Conn,
    /// SIDR_REQ: RDMA_PS_UDP.
    Sidr,
}

/// Where an incoming request goes, read from its service ID and CMA header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route<'a> {
    /// The listener's port.
    pub port: u16,
    /// The requester's address and port (the header's source).
    pub peer_addr: SocketAddr,
    /// The address asked for (the header's destination) and the port.
    pub local_addr: SocketAddr,
    /// The application's private data, after the header.
    pub private_data: &'a [u8],
}

/// Routes a REQ or SIDR_REQ: its service ID must be of the kind's port space (else
/// [`Refusal::NoListener`]) and its private data begin with a CMA header (else
/// [`Refusal::BadHeader`]). Whether a listener takes it is the caller's to know.
pub fn route(
    kind: RequestKind,
    service_id: u64,
    private_data: &[u8],
) -> Result<Route<'_>, Refusal> {
    let space = match kind {
        RequestKind::Conn => PortSpace::Tcp,
        RequestKind::Sidr => PortSpace::Udp,
    };
    let port = match port_of_service(service_id) {
        Some((ps, port)) if ps == space => port,
        _ => return Err(Refusal::NoListener),
    };
    let (hdr, rest) = CmaHeader::parse(private_data).map_err(|_| Refusal::BadHeader)?;
    Ok(Route {
        port,
        peer_addr: hdr.src,
        local_addr: SocketAddr::new(hdr.dst, port),
        private_data: rest,
    })
}

/// What both sides of an RC or UC connection agreed, for the QP's INIT → RTR → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// RC or UC.
    pub service: CmService,
    /// The peer's QP.
    pub peer_qpn: u32,
    /// The first PSN we expect (we named it in our REQ or REP).
    pub rq_psn: u32,
    /// The first PSN we send (the peer named it).
    pub sq_psn: u32,
    /// Path MTU in octets.
    pub pmtu: u32,
    /// RDMA Reads and atomics we serve.
    pub ird: u16,
    /// RDMA Reads and atomics we keep outstanding.
    pub ord: u16,
    /// Transport retries.
    pub retry: u8,
    /// RNR retries.
    pub rnr_retry: u8,
}

impl Agreed {
    /// The active side, on the REP to the REQ it sent with `rq_psn` and `path_mtu`: the
    /// responder's PSN and RNR retry count, no more outstanding than the responder serves.
    pub fn initiator(
        service: CmService,
        rep: &RepInfo,
        rq_psn: u32,
        path_mtu: u8,
        ird: u16,
        ord: u16,
    ) -> Agreed {
        Agreed {
            service,
            peer_qpn: rep.qpn,
            rq_psn,
            sq_psn: rep.starting_psn,
            pmtu: mtu_of(path_mtu),
            ird,
            ord: ord.min(u16::from(rep.responder_resources)),
            retry: RETRY_COUNT,
            rnr_retry: rep.rnr_retry_count,
        }
    }

    /// The passive side, accepting `req` with our `rq_psn` and path MTU code `path_mtu`:
    /// the smaller MTU, no more outstanding than the requester serves, its retry counts.
    pub fn responder(req: &ReqInfo, rq_psn: u32, path_mtu: u8, ird: u16, ord: u16) -> Agreed {
        Agreed {
            service: req.service,
            peer_qpn: req.qpn,
            rq_psn,
            sq_psn: req.starting_psn,
            pmtu: mtu_of(req.path_mtu.min(path_mtu)),
            ird,
            ord: ord.min(u16::from(req.responder_resources)),
            retry: req.retry_count,
            rnr_retry: req.rnr_retry_count,
        }
    }

    /// The REP the passive side answers with for its QP `qpn`.
    pub fn rep(&self, qpn: u32, srq: bool, private_data: Vec<u8>) -> RepParams {
        RepParams {
            qpn,
            starting_psn: self.rq_psn,
            responder_resources: clamp_u8(self.ird),
            initiator_depth: clamp_u8(self.ord),
            rnr_retry_count: RETRY_COUNT,
            srq,
            private_data,
        }
    }

    /// The QP's transitions, in order, as librdmacm drives them: to Init (from Reset or
    /// Init) with the remote access rdma_cm grants, to RTR, to RTS. UC QPs take no
    /// READ/ATOMIC, timeout or retry attributes: UC has no ACKs, Reads or atomics.
    pub fn qp_attrs(&self) -> [QpAttr; 3] {
        let rc = self.service == CmService::Rc;
        [
            QpAttr {
                state: Some(QpState::Init),
                access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                pmtu: Some(self.pmtu),
                dest_qp: Some(self.peer_qpn),
                rq_psn: Some(self.rq_psn),
                max_dest_rd_atomic: rc.then_some(clamp_u8(self.ird)),
                min_rnr_timer: rc.then_some(12),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(self.sq_psn),
                // Our own retransmission timer (67 ms): loopback and LAN paths, not the
                // path's packet life time Linux puts in the REQ.
                timeout: rc.then_some(14),
                retry_cnt: rc.then_some(self.retry.min(7)),
                rnr_retry: rc.then_some(self.rnr_retry.min(7)),
                max_rd_atomic: rc.then_some(clamp_u8(self.ord)),
                ..QpAttr::default()
            },
        ]
    }
}

/// The transitions that bring a UD QP in `state` to RTS, in order (librdmacm does it for
/// UD ids): Reset → Init with `qkey`, Init → RTR, RTR → RTS from `sq_psn`. None from RTS
/// or from a state no transition leaves towards RTS.
pub fn ud_bring_up(state: QpState, qkey: u32, sq_psn: u32) -> Vec<QpAttr> {
    let init = QpAttr {
        state: Some(QpState::Init),
        qkey: Some(qkey),
        ..QpAttr::default()
    };
    let rtr = QpAttr::state(QpState::Rtr);
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(sq_psn),
        ..QpAttr::default()
    };
    match state {
        QpState::Reset => vec![init, rtr, rts],
        QpState::Init => vec![rtr, rts],
        QpState::Rtr => vec![rts],
        _ => Vec::new(),
    }
}
