//! Connection parameters of the connection manager: what every transport takes, and a part
//! per transport (`iwarp`, `roce`), as [`ConnectionDetail`] reports what a connection
//! agreed.

use std::net::SocketAddr;
use std::time::Duration;

use softrdma_iwarp::rdmap::{MAX_MULPDU, MIN_MULPDU};
use softrdma_iwarp::startup::{DEFAULT_TIMEOUT, Negotiated};
use softrdma_wire::mpa::{self, REV_2};

/// The RoCE path MTU asked for by default: what rxe uses on a 1500-octet Ethernet MTU.
pub const DEFAULT_ROCE_PMTU: u32 = 1024;

/// EMSS assumed when `TCP_MAXSEG` cannot be read: an Ethernet MTU less IPv4 and TCP headers.
pub const FALLBACK_EMSS: u32 = 1460;

/// How large the FPDUs this side sends may be (MULPDU, RFC 5044 §4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FpduSize {
    /// No larger than the connection's MSS (`TCP_MAXSEG`): what hardware peers need.
    #[default]
    PathMss,
    /// The largest MULPDU (64768 octets) whatever the MSS: fewer, larger FPDUs for soft
    /// peers.
    Largest,
    /// This MULPDU (clamped to 128..=64768).
    Mulpdu(u16),
}

impl FpduSize {
    /// The MULPDU for a connection with `emss` and Markers on transmit or not.
    pub fn mulpdu(self, emss: u32, markers: bool) -> u16 {
        match self {
            FpduSize::PathMss => mpa::mulpdu(emss, markers),
            FpduSize::Largest => MAX_MULPDU,
            FpduSize::Mulpdu(m) => m.clamp(MIN_MULPDU, MAX_MULPDU),
        }
    }
}

/// How [`Qp::connect`](crate::Qp::connect) negotiates (`rdma_conn_param`): what every
/// transport takes, then a part per transport (the other's is ignored), as
/// [`ConnectionDetail`] reports a part per transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// Private data for the responder (iWARP: at most 508 octets with MPA revision 2, 512
    /// with 1; RoCE: 56).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads (and atomics) we serve at a time (`responder_resources`), at most
    /// 16383.
    pub ird: u16,
    /// Outbound RDMA Reads (and atomics) we keep outstanding (`initiator_depth`), at most
    /// 16383.
    pub ord: u16,
    /// Bound on the whole setup (TCP connect plus MPA negotiation, or the RoCE exchange).
    pub timeout: Duration,
    /// MPA: revision, CRC, Markers, peer-to-peer mode, FPDU size.
    pub iwarp: iwarp::ConnectParams,
    /// The path.
    pub roce: roce::ConnectParams,
}

impl Default for ConnectParams {
    /// No private data, IRD = ORD = 16, 10 s; each transport's defaults.
    fn default() -> ConnectParams {
        ConnectParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            timeout: DEFAULT_TIMEOUT,
            iwarp: iwarp::ConnectParams::default(),
            roce: roce::ConnectParams::default(),
        }
    }
}

/// How [`ConnRequest::accept`](crate::ConnRequest::accept) answers: what every transport
/// takes, then a part per transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// Private data for the initiator (iWARP: as in [`ConnectParams`]; RoCE: 196).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads we serve at a time.
    pub ird: u16,
    /// Outbound RDMA Reads we keep outstanding (capped by the initiator's IRD).
    pub ord: u16,
    /// Bound on the wait for the initiator's ready-to-use message (RoCE).
    pub timeout: Duration,
    /// The FPDU size.
    pub iwarp: iwarp::AcceptParams,
    /// The path.
    pub roce: roce::AcceptParams,
}

impl Default for AcceptParams {
    fn default() -> AcceptParams {
        AcceptParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            timeout: DEFAULT_TIMEOUT,
            iwarp: iwarp::AcceptParams::default(),
            roce: roce::AcceptParams::default(),
        }
    }
}

/// What a [`Listener`](crate::Listener) takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenParams {
    /// Connection requests waiting for `accept`, at most (more are refused: iWARP "busy",
    /// RoCE a REJ "no resources"); iWARP: the TCP listen backlog too.
    pub backlog: u32,
    /// iWARP: the MPA responder and its limits.
    pub iwarp: iwarp::ListenParams,
}

impl Default for ListenParams {
    fn default() -> ListenParams {
        ListenParams {
            backlog: 128,
            iwarp: iwarp::ListenParams::default(),
        }
    }
}

/// The iWARP parts of the connection parameters.
pub mod iwarp {
    use super::*;

    /// MPA negotiation as initiator, and framing.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct ConnectParams {
        /// MPA revision, 1 or 2.
        pub rev: u8,
        /// Ask for CRC32c (on if either side asks).
        pub crc: bool,
        /// Ask for Markers in the stream we receive.
        pub markers: bool,
        /// RFC 6581 peer-to-peer mode: our first FPDU is a zero-length RDMA Write (RTR),
        /// after which the responder may send.
        pub p2p: bool,
        /// FPDU size policy.
        pub fpdu: FpduSize,
    }

    impl Default for ConnectParams {
        /// Revision 2, no CRC, no Markers, client-server, MSS-sized FPDUs.
        fn default() -> ConnectParams {
            ConnectParams {
                rev: REV_2,
                crc: false,
                markers: false,
                p2p: false,
                fpdu: FpduSize::PathMss,
            }
        }
    }

    /// Framing of an accepted connection.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AcceptParams {
        /// FPDU size policy.
        pub fpdu: FpduSize,
    }

    /// What a listener's MPA responder takes.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct ListenParams {
        /// Highest MPA revision taken (2 also answers revision 1 requests with revision 1).
        pub rev: u8,
        /// Ask for CRC32c (on if either side asks).
        pub crc: bool,
        /// Ask for Markers in the stream we receive.
        pub markers: bool,
        /// Take RFC 6581 peer-to-peer requests (RTR: zero-length Write or Read).
        pub p2p: bool,
        /// Client-server mode: send FPDUs right after the Reply instead of waiting for the
        /// initiator's first FPDU, as Linux siw does. Breaks RFC 5044 §7.1.2 r4 (MPA-73),
        /// which hardware initiators may rely on; off by default.
        pub early_fpdus: bool,
        /// Bound on the wait for an MPA Request after the TCP accept.
        pub timeout: Duration,
        /// TCP connections accepted whose MPA Request has not arrived yet, at most (each
        /// startup is bounded by `timeout` too). A new connection past it closes the oldest
        /// such one rather than being refused, so peers opening connections and sending
        /// nothing hold no more than this and never lock a prompt client out.
        pub max_half_open: u32,
        /// Of those, at most this many from one source IP address; a new one from an
        /// address at its quota closes that address's oldest, so one flooding address
        /// cannot push out the connections of others.
        pub max_half_open_per_source: u32,
    }

    impl Default for ListenParams {
        fn default() -> ListenParams {
            ListenParams {
                rev: REV_2,
                crc: false,
                markers: false,
                p2p: true,
                early_fpdus: false,
                timeout: DEFAULT_TIMEOUT,
                max_half_open: 256,
                max_half_open_per_source: 32,
            }
        }
    }
}

/// The RoCE parts of the connection parameters.
pub mod roce {
    use super::*;

    /// The path asked for.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct ConnectParams {
        /// Largest path MTU asked for (256..4096; the smaller of both sides' is used).
        pub pmtu: u32,
    }

    impl Default for ConnectParams {
        fn default() -> ConnectParams {
            ConnectParams {
                pmtu: DEFAULT_ROCE_PMTU,
            }
        }
    }

    /// The path accepted.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct AcceptParams {
        /// Largest path MTU accepted.
        pub pmtu: u32,
    }

    impl Default for AcceptParams {
        fn default() -> AcceptParams {
            AcceptParams {
                pmtu: DEFAULT_ROCE_PMTU,
            }
        }
    }
}

/// An established connection's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Our address (iWARP: the TCP connection's; RoCE: our UDP endpoint).
    pub local_addr: SocketAddr,
    /// The peer's address.
    pub peer_addr: SocketAddr,
    /// The private data the peer sent with its request or reply.
    pub peer_private_data: Vec<u8>,
    /// Inbound RDMA Reads (and atomics) served at a time, as agreed.
    pub ird: u16,
    /// Outbound RDMA Reads (and atomics) outstanding at a time, as agreed.
    pub ord: u16,
    /// What only one transport has.
    pub detail: ConnectionDetail,
}

/// The transport-specific part of [`ConnectionInfo`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectionDetail {
    /// An iWARP connection.
    Iwarp(IwarpConnection),
    /// A RoCE connection.
    Roce {
        /// The peer's QP number.
        remote_qpn: u32,
        /// The path MTU in use.
        pmtu: u32,
        /// The peer's Q_Key (a UD peer found through SIDR; 0 for RC and UC).
        remote_qkey: u32,
    },
}

/// What an iWARP connection negotiated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IwarpConnection {
    /// What MPA negotiated (revision, CRC, Markers per direction, IRD, ORD, RTR, the
    /// peer's private data).
    pub negotiated: Negotiated,
    /// The connection's effective MSS.
    pub emss: u32,
    /// The largest ULPDU we send.
    pub mulpdu: u16,
}

impl ConnectionInfo {
    /// The iWARP part (`None` on RoCE).
    pub fn iwarp(&self) -> Option<&IwarpConnection> {
        match &self.detail {
            ConnectionDetail::Iwarp(c) => Some(c),
            ConnectionDetail::Roce { .. } => None,
        }
    }
}

/// Queue sizes of a QP (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Send requests posted and not yet completed.
    pub max_send_wr: u32,
    /// Receive requests posted and not yet consumed.
    pub max_recv_wr: u32,
    /// SGEs per send request.
    pub max_send_sge: u32,
    /// SGEs per receive request.
    pub max_recv_sge: u32,
    /// Largest `INLINE` send.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    /// 256 requests each way, 16 SGEs, 256 octets inline.
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
        }
    }
}
