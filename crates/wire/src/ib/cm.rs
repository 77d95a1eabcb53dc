//! Communication Management messages (IBA Vol. 1 §12.6): the data of a CM MAD (the 232
//! octets after the [`MadHeaderRepr`](crate::ib::mad::MadHeaderRepr)), by AttributeID.
//!
//! Field positions follow the message tables of §12.6 (Tables 99–120): byte offsets from
//! the start of the message data, bit offsets counted from the most significant bit of the
//! byte, as the tables count them. Fields the tables reserve are written as zero and
//! ignored on receive. Private data is kept as the octets it is (its length is fixed per
//! message; the consumer's own length, if any, travels inside it).

use crate::error::{Error, Layer, Result, need};
use crate::ib::mad::MAD_DATA_LEN;
use crate::macros::wire_enum;

wire_enum! {
    /// AttributeIDs of the CM messages (IBA §12.6, Table 98).
    pub enum CmAttr: u16 => (Layer::Cm, "AttributeID") {
        /// ConnectRequest.
        Req = 0x0010,
        /// MsgRcptAck.
        Mra = 0x0011,
        /// ConnectReject.
        Rej = 0x0012,
        /// ConnectReply.
        Rep = 0x0013,
        /// ReadyToUse.
        Rtu = 0x0014,
        /// DisconnectRequest.
        Dreq = 0x0015,
        /// DisconnectReply.
        Drep = 0x0016,
        /// ServiceIDResReq.
        SidrReq = 0x0017,
        /// ServiceIDResReqResp.
        SidrRep = 0x0018,
        /// LoadAlternatePath.
        Lap = 0x0019,
        /// AlternatePathResponse.
        Apr = 0x001a,
    }
}

/// Private data lengths (IBA §12.6, Tables 99–120).
pub const REQ_PRIVATE_LEN: usize = 92;
/// MRA private data.
pub const MRA_PRIVATE_LEN: usize = 222;
/// REJ private data.
pub const REJ_PRIVATE_LEN: usize = 148;
/// REJ Additional Rejection Information.
pub const REJ_ARI_LEN: usize = 72;
/// REP private data.
pub const REP_PRIVATE_LEN: usize = 196;
/// RTU private data.
pub const RTU_PRIVATE_LEN: usize = 224;
/// DREQ private data.
pub const DREQ_PRIVATE_LEN: usize = 220;
/// DREP private data.
pub const DREP_PRIVATE_LEN: usize = 224;
/// SIDR_REQ private data.
pub const SIDR_REQ_PRIVATE_LEN: usize = 216;
/// SIDR_REP private data.
pub const SIDR_REP_PRIVATE_LEN: usize = 136;
/// SIDR_REP Additional Information.
pub const SIDR_REP_INFO_LEN: usize = 72;

/// Reads fields of a message's data (bounds checked once, at construction).
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn u8(&self, at: usize) -> u8 {
        self.0[at]
    }
    /// `width` bits from bit `bit` (0: the most significant) of byte `at`.
    fn bits(&self, at: usize, bit: u32, width: u32) -> u8 {
        (self.0[at] >> (8 - bit - width)) & ((1u16 << width) - 1) as u8
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }
    /// The upper 24 bits of the 32-bit word at `at` (QPNs, PSNs, EECNs).
    fn u24(&self, at: usize) -> u32 {
        u32::from_be_bytes([0, self.0[at], self.0[at + 1], self.0[at + 2]])
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
    fn u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_be_bytes(b)
    }
    fn gid(&self, at: usize) -> [u8; 16] {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.0[at..at + 16]);
        g
    }
    fn bytes(&self, at: usize, len: usize) -> &'a [u8] {
        &self.0[at..at + len]
    }
}

/// Writes fields into a zeroed message data.
struct Wr<'a>(&'a mut [u8]);

impl Wr<'_> {
    fn u8(&mut self, at: usize, v: u8) {
        self.0[at] = v;
    }
    fn bits(&mut self, at: usize, bit: u32, width: u32, v: u8) {
        let mask = (((1u16 << width) - 1) as u8) << (8 - bit - width);
        self.0[at] = (self.0[at] & !mask) | ((v << (8 - bit - width)) & mask);
    }
    fn u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    fn u24(&mut self, at: usize, v: u32) {
        self.0[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    fn u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
    /// `src` into the field of `len` octets at `at`, zero-padded; `TooLarge` if longer.
    fn bytes(&mut self, at: usize, len: usize, src: &[u8], what: &'static str) -> Result<()> {
        if src.len() > len {
            return Err(Error::TooLarge {
                layer: Layer::Cm,
                what,
                value: src.len() as u64,
                limit: len as u64,
            });
        }
        self.0[at..at + src.len()].copy_from_slice(src);
        self.0[at + src.len()..at + len].fill(0);
        Ok(())
    }
}

/// A path as REQ carries it twice, primary and alternate (IBA §12.6.5, Table 99).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    pub local_lid: u16,
    pub remote_lid: u16,
    /// The requester's GID (RoCE: its IP address, IPv4-mapped for IPv4).
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits.
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs × 2^n.
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// The 44 octets at `at`.
    fn read(r: &Rd<'_>, at: usize) -> CmPath {
        CmPath {
            local_lid: r.u16(at),
            remote_lid: r.u16(at + 2),
            local_gid: r.gid(at + 4),
            remote_gid: r.gid(at + 20),
            flow_label: r.u32(at + 36) >> 12,
            packet_rate: r.bits(at + 39, 2, 6),
            traffic_class: r.u8(at + 40),
            hop_limit: r.u8(at + 41),
            sl: r.bits(at + 42, 0, 4),
            subnet_local: r.bits(at + 42, 4, 1) == 1,
            local_ack_timeout: r.bits(at + 43, 0, 5),
        }
    }

    fn write(&self, w: &mut Wr<'_>, at: usize) {
        w.u16(at, self.local_lid);
        w.u16(at + 2, self.remote_lid);
        w.0[at + 4..at + 20].copy_from_slice(&self.local_gid);
        w.0[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        // Flow label in the upper 20 bits of the word; the packet rate in the last 6.
        w.u32(at + 36, (self.flow_label & 0xF_FFFF) << 12);
        w.bits(at + 39, 2, 6, self.packet_rate);
        w.u8(at + 40, self.traffic_class);
        w.u8(at + 41, self.hop_limit);
        w.bits(at + 42, 0, 4, self.sl);
        w.bits(at + 42, 4, 1, u8::from(self.subnet_local));
        w.bits(at + 43, 0, 5, self.local_ack_timeout);
    }
}

/// REQ (IBA §12.6.5, Table 99).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr<'a> {
    pub local_comm_id: u32,
    /// 24 bits.
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    /// 24 bits.
    pub local_eecn: u32,
    pub initiator_depth: u8,
    /// 24 bits.
    pub remote_eecn: u32,
    /// 5 bits.
    pub remote_cm_response_timeout: u8,
    /// 2 bits: 0 RC, 1 UC, 2 RD, 3 extended (then `extended_transport_type`).
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 5 bits.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub pkey: u16,
    /// 4 bits: 1 = 256 … 5 = 4096.
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits (XRC: 1).
    pub extended_transport_type: u8,
    pub primary: CmPath,
    pub alternate: CmPath,
    pub sap_supported: bool,
    /// At most [`REQ_PRIVATE_LEN`] octets (zero-padded on emit).
    pub private_data: &'a [u8],
}

/// MRA (IBA §12.6.6, Table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MraRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits: 0 REQ, 1 REP, 2 LAP.
    pub message_mraed: u8,
    /// 5 bits.
    pub service_timeout: u8,
    pub private_data: &'a [u8],
}

/// REJ (IBA §12.6.7, Table 107).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits: 0 REQ, 1 REP, 2 other.
    pub message_rejected: u8,
    /// The octets of `ari` that count (7 bits, at most 72).
    pub reject_info_length: u8,
    /// Table 108: e.g. 8 invalid Service ID, 28 consumer reject, 1 no QP.
    pub reason: u16,
    /// Additional Rejection Information (at most [`REJ_ARI_LEN`]).
    pub ari: &'a [u8],
    pub private_data: &'a [u8],
}

/// REP (IBA §12.6.8, Table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    /// 24 bits, carried in three octets between the other fields.
    pub vendor_id: u32,
    pub private_data: &'a [u8],
}

/// RTU, DREP (IBA §12.6.9, §12.6.11): two communication ids and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommIdsRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: &'a [u8],
}

/// DREQ (IBA §12.6.10, Table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DreqRepr<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the QP the receiver should disconnect.
    pub remote_qpn_eecn: u32,
    pub private_data: &'a [u8],
}

/// SIDR_REQ (IBA §12.11.1, Table 119).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqRepr<'a> {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: &'a [u8],
}

/// SIDR_REP (IBA §12.11.2, Table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepRepr<'a> {
    pub request_id: u32,
    /// 0 valid, 1 service ID unknown, 2 rejected, 3 no QP, 4 redirect, 5 version.
    pub status: u8,
    pub additional_info_length: u8,
    /// 24 bits, in two pieces.
    pub vendor_id: u32,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub additional_info: &'a [u8],
    pub private_data: &'a [u8],
}

/// One CM message (LAP and APR, alternate path migration, are not spoken).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage<'a> {
    Req(ReqRepr<'a>),
    Mra(MraRepr<'a>),
    Rej(RejRepr<'a>),
    Rep(RepRepr<'a>),
    Rtu(CommIdsRepr<'a>),
    Dreq(DreqRepr<'a>),
    Drep(CommIdsRepr<'a>),
    SidrReq(SidrReqRepr<'a>),
    SidrRep(SidrRepRepr<'a>),
}

impl<'a> CmMessage<'a> {
    /// The AttributeID the message goes under.
    pub fn attr(&self) -> CmAttr {
        match self {
            CmMessage::Req(_) => CmAttr::Req,
            CmMessage::Mra(_) => CmAttr::Mra,
            CmMessage::Rej(_) => CmAttr::Rej,
            CmMessage::Rep(_) => CmAttr::Rep,
            CmMessage::Rtu(_) => CmAttr::Rtu,
            CmMessage::Dreq(_) => CmAttr::Dreq,
            CmMessage::Drep(_) => CmAttr::Drep,
            CmMessage::SidrReq(_) => CmAttr::SidrReq,
            CmMessage::SidrRep(_) => CmAttr::SidrRep,
        }
    }

    /// The message of AttributeID `attr` in `data`, the [`MAD_DATA_LEN`] octets after the
    /// MAD header. Never panics; LAP and APR are `Unknown`.
    pub fn parse(attr: u16, data: &'a [u8]) -> Result<CmMessage<'a>> {
        need(Layer::Cm, data, MAD_DATA_LEN)?;
        let r = Rd(&data[..MAD_DATA_LEN]);
        let ids = |r: &Rd<'a>, priv_at: usize, len: usize| CommIdsRepr {
            local_comm_id: r.u32(0),
            remote_comm_id: r.u32(4),
            private_data: r.bytes(priv_at, len),
        };
        Ok(match CmAttr::try_from(attr)? {
            CmAttr::Req => CmMessage::Req(ReqRepr {
                local_comm_id: r.u32(0),
                vendor_id: r.u24(5),
                service_id: r.u64(8),
                local_ca_guid: r.u64(16),
                local_qkey: r.u32(28),
                local_qpn: r.u24(32),
                responder_resources: r.u8(35),
                local_eecn: r.u24(36),
                initiator_depth: r.u8(39),
                remote_eecn: r.u24(40),
                remote_cm_response_timeout: r.bits(43, 0, 5),
                transport_service_type: r.bits(43, 5, 2),
                end_to_end_flow_control: r.bits(43, 7, 1) == 1,
                starting_psn: r.u24(44),
                local_cm_response_timeout: r.bits(47, 0, 5),
                retry_count: r.bits(47, 5, 3),
                pkey: r.u16(48),
                path_mtu: r.bits(50, 0, 4),
                rdc_exists: r.bits(50, 4, 1) == 1,
                rnr_retry_count: r.bits(50, 5, 3),
                max_cm_retries: r.bits(51, 0, 4),
                srq: r.bits(51, 4, 1) == 1,
                extended_transport_type: r.bits(51, 5, 3),
                primary: CmPath::read(&r, 52),
                alternate: CmPath::read(&r, 96),
                sap_supported: r.bits(139, 5, 1) == 1,
                private_data: r.bytes(140, REQ_PRIVATE_LEN),
            }),
            CmAttr::Mra => CmMessage::Mra(MraRepr {
                local_comm_id: r.u32(0),
                remote_comm_id: r.u32(4),
                message_mraed: r.bits(8, 0, 2),
                service_timeout: r.bits(9, 0, 5),
                private_data: r.bytes(10, MRA_PRIVATE_LEN),
            }),
            CmAttr::Rej => CmMessage::Rej(RejRepr {
                local_comm_id: r.u32(0),
                remote_comm_id: r.u32(4),
                message_rejected: r.bits(8, 0, 2),
                reject_info_length: r.bits(9, 0, 7),
                reason: r.u16(10),
                ari: r.bytes(12, REJ_ARI_LEN),
                private_data: r.bytes(84, REJ_PRIVATE_LEN),
            }),
            CmAttr::Rep => CmMessage::Rep(RepRepr {
                local_comm_id: r.u32(0),
                remote_comm_id: r.u32(4),
                local_qkey: r.u32(8),
                local_qpn: r.u24(12),
                local_eecn: r.u24(16),
                starting_psn: r.u24(20),
                responder_resources: r.u8(24),
                initiator_depth: r.u8(25),
                target_ack_delay: r.bits(26, 0, 5),
                failover_accepted: r.bits(26, 5, 2),
                end_to_end_flow_control: r.bits(26, 7, 1) == 1,
                rnr_retry_count: r.bits(27, 0, 3),
                srq: r.bits(27, 3, 1) == 1,
                local_ca_guid: r.u64(28),
                vendor_id: u32::from_be_bytes([0, r.u8(15), r.u8(19), r.u8(23)]),
                private_data: r.bytes(36, REP_PRIVATE_LEN),
            }),
            CmAttr::Rtu => CmMessage::Rtu(ids(&r, 8, RTU_PRIVATE_LEN)),
            CmAttr::Dreq => CmMessage::Dreq(DreqRepr {
                local_comm_id: r.u32(0),
                remote_comm_id: r.u32(4),
                remote_qpn_eecn: r.u24(8),
                private_data: r.bytes(12, DREQ_PRIVATE_LEN),
            }),
            CmAttr::Drep => CmMessage::Drep(ids(&r, 8, DREP_PRIVATE_LEN)),
            CmAttr::SidrReq => CmMessage::SidrReq(SidrReqRepr {
                request_id: r.u32(0),
                pkey: r.u16(4),
                service_id: r.u64(8),
                private_data: r.bytes(16, SIDR_REQ_PRIVATE_LEN),
            }),
            CmAttr::SidrRep => CmMessage::SidrRep(SidrRepRepr {
                request_id: r.u32(0),
                status: r.u8(4),
                additional_info_length: r.u8(5),
                vendor_id: (u32::from(r.u16(6)) << 8) | u32::from(r.u8(11)),
                qpn: r.u24(8),
                service_id: r.u64(12),
                qkey: r.u32(20),
                additional_info: r.bytes(24, SIDR_REP_INFO_LEN),
                private_data: r.bytes(96, SIDR_REP_PRIVATE_LEN),
            }),
            CmAttr::Lap | CmAttr::Apr => {
                return Err(Error::Unknown {
                    layer: Layer::Cm,
                    field: "AttributeID (alternate paths are not supported)",
                    value: u64::from(attr),
                });
            }
        })
    }

    /// Writes the message into the first [`MAD_DATA_LEN`] octets of `data` (reserved
    /// fields and padding zero); `TooLarge` for private data longer than its field.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        need(Layer::Cm, data, MAD_DATA_LEN)?;
        let data = &mut data[..MAD_DATA_LEN];
        data.fill(0);
        let mut w = Wr(data);
        match self {
            CmMessage::Req(m) => {
                w.u32(0, m.local_comm_id);
                w.u24(5, m.vendor_id & 0xFF_FFFF);
                w.u64(8, m.service_id);
                w.u64(16, m.local_ca_guid);
                w.u32(28, m.local_qkey);
                w.u24(32, m.local_qpn);
                w.u8(35, m.responder_resources);
                w.u24(36, m.local_eecn);
                w.u8(39, m.initiator_depth);
                w.u24(40, m.remote_eecn);
                w.bits(43, 0, 5, m.remote_cm_response_timeout);
                w.bits(43, 5, 2, m.transport_service_type);
                w.bits(43, 7, 1, u8::from(m.end_to_end_flow_control));
                w.u24(44, m.starting_psn);
                w.bits(47, 0, 5, m.local_cm_response_timeout);
                w.bits(47, 5, 3, m.retry_count);
                w.u16(48, m.pkey);
                w.bits(50, 0, 4, m.path_mtu);
                w.bits(50, 4, 1, u8::from(m.rdc_exists));
                w.bits(50, 5, 3, m.rnr_retry_count);
                w.bits(51, 0, 4, m.max_cm_retries);
                w.bits(51, 4, 1, u8::from(m.srq));
                w.bits(51, 5, 3, m.extended_transport_type);
                m.primary.write(&mut w, 52);
                m.alternate.write(&mut w, 96);
                w.bits(139, 5, 1, u8::from(m.sap_supported));
                w.bytes(140, REQ_PRIVATE_LEN, m.private_data, "REQ private data")?;
            }
            CmMessage::Mra(m) => {
                w.u32(0, m.local_comm_id);
                w.u32(4, m.remote_comm_id);
                w.bits(8, 0, 2, m.message_mraed);
                w.bits(9, 0, 5, m.service_timeout);
                w.bytes(10, MRA_PRIVATE_LEN, m.private_data, "MRA private data")?;
            }
            CmMessage::Rej(m) => {
                w.u32(0, m.local_comm_id);
                w.u32(4, m.remote_comm_id);
                w.bits(8, 0, 2, m.message_rejected);
                w.bits(9, 0, 7, m.reject_info_length);
                w.u16(10, m.reason);
                w.bytes(12, REJ_ARI_LEN, m.ari, "REJ additional information")?;
                w.bytes(84, REJ_PRIVATE_LEN, m.private_data, "REJ private data")?;
            }
            CmMessage::Rep(m) => {
                w.u32(0, m.local_comm_id);
                w.u32(4, m.remote_comm_id);
                w.u32(8, m.local_qkey);
                w.u24(12, m.local_qpn);
                let v = m.vendor_id.to_be_bytes();
                w.u8(15, v[1]);
                w.u24(16, m.local_eecn);
                w.u8(19, v[2]);
                w.u24(20, m.starting_psn);
                w.u8(23, v[3]);
                w.u8(24, m.responder_resources);
                w.u8(25, m.initiator_depth);
                w.bits(26, 0, 5, m.target_ack_delay);
                w.bits(26, 5, 2, m.failover_accepted);
                w.bits(26, 7, 1, u8::from(m.end_to_end_flow_control));
                w.bits(27, 0, 3, m.rnr_retry_count);
                w.bits(27, 3, 1, u8::from(m.srq));
                w.u64(28, m.local_ca_guid);
                w.bytes(36, REP_PRIVATE_LEN, m.private_data, "REP private data")?;
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => {
                w.u32(0, m.local_comm_id);
                w.u32(4, m.remote_comm_id);
                w.bytes(8, RTU_PRIVATE_LEN, m.private_data, "private data")?;
            }
            CmMessage::Dreq(m) => {
                w.u32(0, m.local_comm_id);
                w.u32(4, m.remote_comm_id);
                w.u24(8, m.remote_qpn_eecn);
                w.bytes(12, DREQ_PRIVATE_LEN, m.private_data, "DREQ private data")?;
            }
            CmMessage::SidrReq(m) => {
                w.u32(0, m.request_id);
                w.u16(4, m.pkey);
                w.u64(8, m.service_id);
                w.bytes(
                    16,
                    SIDR_REQ_PRIVATE_LEN,
                    m.private_data,
                    "SIDR_REQ private data",
                )?;
            }
            CmMessage::SidrRep(m) => {
                w.u32(0, m.request_id);
                w.u8(4, m.status);
                w.u8(5, m.additional_info_length);
                w.u16(6, (m.vendor_id >> 8) as u16);
                w.u24(8, m.qpn);
                w.u8(11, m.vendor_id as u8);
                w.u64(12, m.service_id);
                w.u32(20, m.qkey);
                w.bytes(
                    24,
                    SIDR_REP_INFO_LEN,
                    m.additional_info,
                    "SIDR_REP information",
                )?;
                w.bytes(
                    96,
                    SIDR_REP_PRIVATE_LEN,
                    m.private_data,
                    "SIDR_REP private data",
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::cm_vectors::*;
    use crate::ib::mad::{MAD_HEADER_LEN, MadHeaderRepr};
    use proptest::prelude::*;

    fn parse(mad: &[u8; 256]) -> CmMessage<'_> {
        let h = MadHeaderRepr::parse(mad).unwrap();
        CmMessage::parse(h.attribute_id, &mad[MAD_HEADER_LEN..]).unwrap()
    }

    /// Every message Linux sent re-emits to the same octets.
    #[test]
    fn linux_cm_mads_reencode_identically() {
        for mad in [
            &RPING_REQ,
            &RPING_REP,
            &RPING_RTU,
            &RPING_DREQ,
            &RPING_DREP,
            &UDADDY_SIDR_REQ,
            &UDADDY_SIDR_REP,
        ] {
            let m = parse(mad);
            let mut out = [0xAAu8; MAD_DATA_LEN];
            m.emit(&mut out).unwrap();
            assert_eq!(out[..], mad[MAD_HEADER_LEN..], "{:?}", m.attr());
        }
    }

    #[test]
    fn an_rping_req_as_librdmacm_sends_it() {
        let CmMessage::Req(r) = parse(&RPING_REQ) else {
            panic!("not a REQ")
        };
        // RDMA_PS_TCP (0x0106) in the service ID's port-space octets, the port after it.
        assert_eq!(r.service_id >> 16, 0x0000_0000_0106);
        assert_eq!(r.transport_service_type, 0, "RC");
        assert_eq!(r.pkey, 0xFFFF);
        assert!(r.local_qpn > 1 && r.local_qpn < 1 << 24);
        // RoCE GIDs of IPv4 addresses are IPv4-mapped.
        assert_eq!(
            &r.primary.local_gid[..12],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF]
        );
        assert_eq!(&r.primary.local_gid[12..], &[10, 77, 0, 3]);
        assert_eq!(&r.primary.remote_gid[12..], &[10, 77, 0, 2]);
        // The CMA header leads the private data: version 0, IP version 4 in the upper nibble.
        assert_eq!(r.private_data[0], 0);
        assert_eq!(r.private_data[1] >> 4, 4);
        let CmMessage::Rep(p) = parse(&RPING_REP) else {
            panic!("not a REP")
        };
        assert_eq!(p.remote_comm_id, r.local_comm_id);
        let CmMessage::Rtu(u) = parse(&RPING_RTU) else {
            panic!("not an RTU")
        };
        assert_eq!(
            (u.local_comm_id, u.remote_comm_id),
            (r.local_comm_id, p.local_comm_id)
        );
        let CmMessage::SidrRep(s) = parse(&UDADDY_SIDR_REP) else {
            panic!("not a SIDR_REP")
        };
        let CmMessage::SidrReq(q) = parse(&UDADDY_SIDR_REQ) else {
            panic!("not a SIDR_REQ")
        };
        assert_eq!(
            (s.request_id, s.service_id, s.status),
            (q.request_id, q.service_id, 0)
        );
    }

    #[test]
    fn short_data_unknown_attributes_and_long_private_data_are_errors() {
        assert!(CmMessage::parse(0x10, &[0u8; MAD_DATA_LEN - 1]).is_err());
        for attr in [0x0000, 0x0019, 0x001a, 0x00ff, 0xffff] {
            assert!(
                CmMessage::parse(attr, &[0u8; MAD_DATA_LEN]).is_err(),
                "{attr:#x}"
            );
        }
        let m = CmMessage::Rtu(CommIdsRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: &[1; RTU_PRIVATE_LEN + 1],
        });
        assert!(m.emit(&mut [0u8; MAD_DATA_LEN]).is_err());
        assert!(m.emit(&mut [0u8; MAD_DATA_LEN - 1]).is_err());
    }

    proptest! {
        /// Arbitrary octets under any attribute never panic, and what parses re-emits to
        /// octets that parse to the same message (reserved bits are dropped).
        #[test]
        fn prop_parse_emit_parse(attr in 0x10u16..0x1b, data in proptest::collection::vec(any::<u8>(), MAD_DATA_LEN)) {
            if let Ok(m) = CmMessage::parse(attr, &data) {
                let mut out = vec![0u8; MAD_DATA_LEN];
                m.emit(&mut out).unwrap();
                prop_assert_eq!(CmMessage::parse(attr, &out).unwrap(), m);
            }
        }
    }
}
