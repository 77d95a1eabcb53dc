//! BTH OpCode: transport service, operation, and the headers each one carries.
//!
//! IBA Vol. 1 §9.2.1 Table 38 (ib-transport.md §13.1, checked against Linux
//! `include/rdma/ib_pack.h`): `OpCode[7:5]` is the service, `OpCode[4:0]` the
//! operation. The headers after the BTH follow from the opcode alone
//! (IBT-C9-2; ib-transport.md §6).

use crate::error::{Error, Layer, Result};

/// Transport service, `OpCode[7:5]` (IBA §9.2.1; ib-transport.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[repr(u8)]
pub enum Service {
    /// Reliable Connected, `000`.
    Rc = 0,
    /// Unreliable Connected, `001`.
    Uc = 1,
    /// Reliable Datagram, `010`.
    Rd = 2,
    /// Unreliable Datagram, `011`.
    Ud = 3,
    /// Congestion notification, `100` (RoCEv2 CNP, IBA Annex A17).
    Cnp = 4,
    /// Extended Reliable Connected, `101`.
    Xrc = 5,
}

impl Service {
    /// The opcode block of this service (`0x00`, `0x20`, ... `0xA0`).
    pub const fn base(self) -> u8 {
        (self as u8) << 5
    }

    /// Short name as tshark prints it ("RC", "UD", ...).
    pub const fn name(self) -> &'static str {
        match self {
            Service::Rc => "RC",
            Service::Uc => "UC",
            Service::Rd => "RD",
            Service::Ud => "UD",
            Service::Cnp => "CNP",
            Service::Xrc => "XRC",
        }
    }

    /// RC, RD and XRC acknowledge requests (IBA §9.7).
    pub const fn is_reliable(self) -> bool {
        matches!(self, Service::Rc | Service::Rd | Service::Xrc)
    }
}

/// From the 3-bit value `OpCode[7:5]`; `110`/`111` (reserved, vendor) are errors.
impl TryFrom<u8> for Service {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        Ok(match v {
            0 => Service::Rc,
            1 => Service::Uc,
            2 => Service::Rd,
            3 => Service::Ud,
            4 => Service::Cnp,
            5 => Service::Xrc,
            _ => {
                return Err(Error::Unknown {
                    layer: Layer::Bth,
                    field: "OpCode service",
                    value: v as u64,
                });
            }
        })
    }
}

/// The 3-bit `OpCode[7:5]` value.
impl From<Service> for u8 {
    fn from(s: Service) -> u8 {
        s as u8
    }
}

impl core::fmt::Display for Service {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Operation, `OpCode[4:0]` (IBA Table 38). `Cnp` is the one operation of the
/// CNP service (OpCode 0x81).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Operation {
    SendFirst,
    SendMiddle,
    SendLast,
    SendLastWithImmediate,
    SendOnly,
    SendOnlyWithImmediate,
    RdmaWriteFirst,
    RdmaWriteMiddle,
    RdmaWriteLast,
    RdmaWriteLastWithImmediate,
    RdmaWriteOnly,
    RdmaWriteOnlyWithImmediate,
    RdmaReadRequest,
    RdmaReadResponseFirst,
    RdmaReadResponseMiddle,
    RdmaReadResponseLast,
    RdmaReadResponseOnly,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    /// RD only.
    Resync,
    SendLastWithInvalidate,
    SendOnlyWithInvalidate,
    /// IBA 1.5 (FLUSH, FETH + RETH).
    Flush,
    /// IBA 1.5 (ATOMIC WRITE, RETH + 8-octet payload).
    AtomicWrite,
    /// RoCEv2 congestion notification (IBA Annex A17.9; OpCode 0x81).
    Cnp,
}

impl Operation {
    /// Every operation, in `OpCode[4:0]` order.
    pub const ALL: [Operation; 27] = [
        Operation::SendFirst,
        Operation::SendMiddle,
        Operation::SendLast,
        Operation::SendLastWithImmediate,
        Operation::SendOnly,
        Operation::SendOnlyWithImmediate,
        Operation::RdmaWriteFirst,
        Operation::RdmaWriteMiddle,
        Operation::RdmaWriteLast,
        Operation::RdmaWriteLastWithImmediate,
        Operation::RdmaWriteOnly,
        Operation::RdmaWriteOnlyWithImmediate,
        Operation::RdmaReadRequest,
        Operation::RdmaReadResponseFirst,
        Operation::RdmaReadResponseMiddle,
        Operation::RdmaReadResponseLast,
        Operation::RdmaReadResponseOnly,
        Operation::Acknowledge,
        Operation::AtomicAcknowledge,
        Operation::CompareSwap,
        Operation::FetchAdd,
        Operation::Resync,
        Operation::SendLastWithInvalidate,
        Operation::SendOnlyWithInvalidate,
        Operation::Flush,
        Operation::AtomicWrite,
        Operation::Cnp,
    ];

    /// `OpCode[4:0]` of this operation.
    pub const fn code(self) -> u8 {
        match self {
            Operation::SendFirst => 0x00,
            Operation::SendMiddle => 0x01,
            Operation::SendLast => 0x02,
            Operation::SendLastWithImmediate => 0x03,
            Operation::SendOnly => 0x04,
            Operation::SendOnlyWithImmediate => 0x05,
            Operation::RdmaWriteFirst => 0x06,
            Operation::RdmaWriteMiddle => 0x07,
            Operation::RdmaWriteLast => 0x08,
            Operation::RdmaWriteLastWithImmediate => 0x09,
            Operation::RdmaWriteOnly => 0x0A,
            Operation::RdmaWriteOnlyWithImmediate => 0x0B,
            Operation::RdmaReadRequest => 0x0C,
            Operation::RdmaReadResponseFirst => 0x0D,
            Operation::RdmaReadResponseMiddle => 0x0E,
            Operation::RdmaReadResponseLast => 0x0F,
            Operation::RdmaReadResponseOnly => 0x10,
            Operation::Acknowledge => 0x11,
            Operation::AtomicAcknowledge => 0x12,
            Operation::CompareSwap => 0x13,
            Operation::FetchAdd => 0x14,
            Operation::Resync => 0x15,
            Operation::SendLastWithInvalidate => 0x16,
            Operation::SendOnlyWithInvalidate => 0x17,
            Operation::Flush => 0x1C,
            Operation::AtomicWrite => 0x1D,
            Operation::Cnp => 0x01,
        }
    }

    /// Name as in IBA Table 38, spelled like tshark ("RDMA Write First").
    pub const fn name(self) -> &'static str {
        match self {
            Operation::SendFirst => "Send First",
            Operation::SendMiddle => "Send Middle",
            Operation::SendLast => "Send Last",
            Operation::SendLastWithImmediate => "Send Last with Immediate",
            Operation::SendOnly => "Send Only",
            Operation::SendOnlyWithImmediate => "Send Only with Immediate",
            Operation::RdmaWriteFirst => "RDMA Write First",
            Operation::RdmaWriteMiddle => "RDMA Write Middle",
            Operation::RdmaWriteLast => "RDMA Write Last",
            Operation::RdmaWriteLastWithImmediate => "RDMA Write Last with Immediate",
            Operation::RdmaWriteOnly => "RDMA Write Only",
            Operation::RdmaWriteOnlyWithImmediate => "RDMA Write Only with Immediate",
            Operation::RdmaReadRequest => "RDMA Read Request",
            Operation::RdmaReadResponseFirst => "RDMA Read Response First",
            Operation::RdmaReadResponseMiddle => "RDMA Read Response Middle",
            Operation::RdmaReadResponseLast => "RDMA Read Response Last",
            Operation::RdmaReadResponseOnly => "RDMA Read Response Only",
            Operation::Acknowledge => "Acknowledge",
            Operation::AtomicAcknowledge => "Atomic Acknowledge",
            Operation::CompareSwap => "CmpSwap",
            Operation::FetchAdd => "FetchAdd",
            Operation::Resync => "Resync",
            Operation::SendLastWithInvalidate => "Send Last with Invalidate",
            Operation::SendOnlyWithInvalidate => "Send Only with Invalidate",
            Operation::Flush => "Flush",
            Operation::AtomicWrite => "Atomic Write",
            Operation::Cnp => "CNP",
        }
    }

    /// Responses travel responder -> requester: READ responses and ACKs.
    pub const fn is_response(self) -> bool {
        matches!(
            self,
            Operation::RdmaReadResponseFirst
                | Operation::RdmaReadResponseMiddle
                | Operation::RdmaReadResponseLast
                | Operation::RdmaReadResponseOnly
                | Operation::Acknowledge
                | Operation::AtomicAcknowledge
        )
    }

    /// First packet of a multi-packet message (carries RETH for WRITE).
    pub const fn is_first(self) -> bool {
        matches!(
            self,
            Operation::SendFirst | Operation::RdmaWriteFirst | Operation::RdmaReadResponseFirst
        )
    }

    /// Middle packet of a multi-packet message.
    pub const fn is_middle(self) -> bool {
        matches!(
            self,
            Operation::SendMiddle | Operation::RdmaWriteMiddle | Operation::RdmaReadResponseMiddle
        )
    }

    /// Last packet of a multi-packet message.
    pub const fn is_last(self) -> bool {
        matches!(
            self,
            Operation::SendLast
                | Operation::SendLastWithImmediate
                | Operation::SendLastWithInvalidate
                | Operation::RdmaWriteLast
                | Operation::RdmaWriteLastWithImmediate
                | Operation::RdmaReadResponseLast
        )
    }

    /// Single-packet message ("Only").
    pub const fn is_only(self) -> bool {
        matches!(
            self,
            Operation::SendOnly
                | Operation::SendOnlyWithImmediate
                | Operation::SendOnlyWithInvalidate
                | Operation::RdmaWriteOnly
                | Operation::RdmaWriteOnlyWithImmediate
                | Operation::RdmaReadResponseOnly
        )
    }

    /// The headers this operation carries, before the service adds
    /// RDETH/DETH/XRCETH (ib-transport.md §6; Linux `rxe_opcode.c`).
    const fn base_headers(self) -> Headers {
        let mut h = Headers::NONE;
        match self {
            Operation::SendFirst
            | Operation::SendMiddle
            | Operation::SendLast
            | Operation::SendOnly
            | Operation::RdmaWriteMiddle
            | Operation::RdmaWriteLast
            | Operation::RdmaReadResponseMiddle
            | Operation::Cnp => h.payload = true,
            Operation::SendLastWithImmediate
            | Operation::SendOnlyWithImmediate
            | Operation::RdmaWriteLastWithImmediate => {
                h.immdt = true;
                h.payload = true;
            }
            Operation::RdmaWriteFirst | Operation::RdmaWriteOnly | Operation::AtomicWrite => {
                h.reth = true;
                h.payload = true;
            }
            Operation::RdmaWriteOnlyWithImmediate => {
                h.reth = true;
                h.immdt = true;
                h.payload = true;
            }
            Operation::RdmaReadRequest => h.reth = true,
            Operation::RdmaReadResponseFirst
            | Operation::RdmaReadResponseLast
            | Operation::RdmaReadResponseOnly => {
                h.aeth = true;
                h.payload = true;
            }
            Operation::Acknowledge => h.aeth = true,
            Operation::AtomicAcknowledge => {
                h.aeth = true;
                h.atomic_ack_eth = true;
            }
            Operation::CompareSwap | Operation::FetchAdd => h.atomic_eth = true,
            Operation::Resync => {}
            Operation::SendLastWithInvalidate | Operation::SendOnlyWithInvalidate => {
                h.ieth = true;
                h.payload = true;
            }
            Operation::Flush => {
                h.feth = true;
                h.reth = true;
            }
        }
        h
    }
}

impl core::fmt::Display for Operation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which headers follow the BTH, and whether a payload may follow them.
///
/// Wire order (ib-transport.md §6): BTH, RDETH, DETH, XRCETH, FETH,
/// RETH | AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, payload, pad, ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Headers {
    pub rdeth: bool,
    pub deth: bool,
    pub xrceth: bool,
    pub feth: bool,
    pub reth: bool,
    pub atomic_eth: bool,
    pub aeth: bool,
    pub atomic_ack_eth: bool,
    pub immdt: bool,
    pub ieth: bool,
    /// A payload may follow (it may still be empty, e.g. zero-length SEND Only).
    pub payload: bool,
}

impl Headers {
    /// No extended header, no payload.
    pub const NONE: Headers = Headers {
        rdeth: false,
        deth: false,
        xrceth: false,
        feth: false,
        reth: false,
        atomic_eth: false,
        aeth: false,
        atomic_ack_eth: false,
        immdt: false,
        ieth: false,
        payload: false,
    };

    /// Total length of the extended headers (the BTH not included).
    pub const fn len(&self) -> usize {
        use super::eth::*;
        let mut n = 0;
        if self.rdeth {
            n += RDETH_LEN;
        }
        if self.deth {
            n += DETH_LEN;
        }
        if self.xrceth {
            n += XRCETH_LEN;
        }
        if self.feth {
            n += FETH_LEN;
        }
        if self.reth {
            n += RETH_LEN;
        }
        if self.atomic_eth {
            n += ATOMIC_ETH_LEN;
        }
        if self.aeth {
            n += AETH_LEN;
        }
        if self.atomic_ack_eth {
            n += ATOMIC_ACK_ETH_LEN;
        }
        if self.immdt {
            n += IMMDT_LEN;
        }
        if self.ieth {
            n += IETH_LEN;
        }
        n
    }

    /// True when no extended header follows the BTH.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A defined BTH OpCode (IBA Table 38). Construction validates: reserved and
/// manufacturer-specific values are `Error::Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Opcode(u8);

/// `OpCode[4:0]` to its operation; codes Table 38 leaves undefined map to `Cnp` (never
/// reached for a validated opcode, and total without panicking).
const OPERATIONS: [Operation; 32] = {
    let mut t = [Operation::Cnp; 32];
    let mut i = 0;
    while i < Operation::ALL.len() {
        let op = Operation::ALL[i];
        // The first operation of a code, as a search of `ALL` would find.
        if !matches!(op, Operation::Cnp) && matches!(t[op.code() as usize], Operation::Cnp) {
            t[op.code() as usize] = op;
        }
        i += 1;
    }
    t
};

/// [`Opcode::headers`] of every octet.
const HEADERS: [Headers; 256] = {
    let mut t = [Headers::NONE; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = Opcode(i as u8).derive_headers();
        i += 1;
    }
    t
};

macro_rules! opcodes {
    ($($name:ident = $val:expr;)*) => {
        impl Opcode {
            $(
                #[doc = concat!("OpCode `", stringify!($val), "`.")]
                pub const $name: Opcode = Opcode($val);
            )*
        }
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00;
    RC_SEND_MIDDLE = 0x01;
    RC_SEND_LAST = 0x02;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03;
    RC_SEND_ONLY = 0x04;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05;
    RC_RDMA_WRITE_FIRST = 0x06;
    RC_RDMA_WRITE_MIDDLE = 0x07;
    RC_RDMA_WRITE_LAST = 0x08;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09;
    RC_RDMA_WRITE_ONLY = 0x0A;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B;
    RC_RDMA_READ_REQUEST = 0x0C;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E;
    RC_RDMA_READ_RESPONSE_LAST = 0x0F;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10;
    RC_ACKNOWLEDGE = 0x11;
    RC_ATOMIC_ACKNOWLEDGE = 0x12;
    RC_COMPARE_SWAP = 0x13;
    RC_FETCH_ADD = 0x14;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17;
    RC_FLUSH = 0x1C;
    RC_ATOMIC_WRITE = 0x1D;
    UC_SEND_FIRST = 0x20;
    UC_SEND_MIDDLE = 0x21;
    UC_SEND_LAST = 0x22;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23;
    UC_SEND_ONLY = 0x24;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25;
    UC_RDMA_WRITE_FIRST = 0x26;
    UC_RDMA_WRITE_MIDDLE = 0x27;
    UC_RDMA_WRITE_LAST = 0x28;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29;
    UC_RDMA_WRITE_ONLY = 0x2A;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B;
    UD_SEND_ONLY = 0x64;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65;
    CNP = 0x81;
}

impl Opcode {
    /// Combines a service and an operation; `Unknown` if Table 38 has no
    /// such opcode (e.g. UC READ, UD WRITE, RC RESYNC).
    pub const fn new(service: Service, op: Operation) -> Result<Opcode> {
        let v = service.base() | op.code();
        let ok = match (service, op) {
            (Service::Cnp, Operation::Cnp) => true,
            (_, Operation::Cnp) | (Service::Cnp, _) => false,
            (Service::Rc, Operation::Resync) => false,
            (Service::Rc, _) => true,
            (Service::Uc, op) => (op.code() as u32) <= 0x0B && !matches!(op, Operation::Cnp),
            (Service::Rd, Operation::SendLastWithInvalidate)
            | (Service::Rd, Operation::SendOnlyWithInvalidate)
            | (Service::Rd, Operation::AtomicWrite) => false,
            (Service::Rd, _) => true,
            (Service::Ud, Operation::SendOnly)
            | (Service::Ud, Operation::SendOnlyWithImmediate) => true,
            (Service::Ud, _) => false,
            (Service::Xrc, Operation::Resync)
            | (Service::Xrc, Operation::Flush)
            | (Service::Xrc, Operation::AtomicWrite) => false,
            (Service::Xrc, _) => true,
        };
        if ok {
            Ok(Opcode(v))
        } else {
            Err(Error::Unknown {
                layer: Layer::Bth,
                field: "OpCode",
                value: v as u64,
            })
        }
    }

    /// The raw OpCode octet.
    pub const fn value(self) -> u8 {
        self.0
    }

    /// `OpCode[7:5]`.
    pub const fn service(self) -> Service {
        match self.0 >> 5 {
            0 => Service::Rc,
            1 => Service::Uc,
            2 => Service::Rd,
            3 => Service::Ud,
            4 => Service::Cnp,
            _ => Service::Xrc,
        }
    }

    /// `OpCode[4:0]` as an operation (a table lookup: asked several times per packet).
    pub const fn operation(self) -> Operation {
        if self.0 == Opcode::CNP.0 {
            return Operation::Cnp;
        }
        OPERATIONS[(self.0 & 0x1F) as usize]
    }

    /// The headers following the BTH (IBT-C9-2): the operation's headers
    /// plus RDETH (+ DETH on requests) for RD, DETH for UD and XRCETH on
    /// XRC requests.
    pub const fn headers(self) -> Headers {
        HEADERS[self.0 as usize]
    }

    /// [`Opcode::headers`] worked out (the table's source).
    const fn derive_headers(self) -> Headers {
        let op = self.operation();
        let mut h = op.base_headers();
        match self.service() {
            Service::Rd => {
                h.rdeth = true;
                if !op.is_response() {
                    h.deth = true;
                }
            }
            Service::Ud => h.deth = true,
            Service::Xrc if !op.is_response() => h.xrceth = true,
            _ => {}
        }
        h
    }

    /// Whether a sender may set BTH:SE on this opcode: only the last/only
    /// packet of SEND, SEND with Immediate, RDMA WRITE with Immediate and
    /// SEND with Invalidate (IBT-X-01). Receivers do not check it (C9-4).
    pub const fn se_allowed(self) -> bool {
        matches!(
            self.operation(),
            Operation::SendLast
                | Operation::SendOnly
                | Operation::SendLastWithImmediate
                | Operation::SendOnlyWithImmediate
                | Operation::RdmaWriteLastWithImmediate
                | Operation::RdmaWriteOnlyWithImmediate
                | Operation::SendLastWithInvalidate
                | Operation::SendOnlyWithInvalidate
        )
    }

    /// Whether a payload may follow the headers.
    pub const fn has_payload(self) -> bool {
        self.headers().payload
    }

    /// Length of the extended headers this opcode carries.
    pub const fn header_len(self) -> usize {
        self.headers().len()
    }

    /// Requests flow requester -> responder (everything but READ responses
    /// and ACKs; CNP counts as neither and reports `false`).
    pub const fn is_request(self) -> bool {
        !self.operation().is_response() && !matches!(self.service(), Service::Cnp)
    }

    /// Operation name ("Send Only with Immediate").
    pub const fn name(self) -> &'static str {
        self.operation().name()
    }

    /// Every defined opcode in ascending order (iterate with `.filter`).
    pub fn all() -> impl Iterator<Item = Opcode> {
        (0u8..=255).filter_map(|v| Opcode::try_from(v).ok())
    }
}

impl TryFrom<u8> for Opcode {
    type Error = Error;
    fn try_from(v: u8) -> Result<Self> {
        let service = Service::try_from(v >> 5)?;
        if service == Service::Cnp {
            return if v == Opcode::CNP.0 {
                Ok(Opcode::CNP)
            } else {
                Err(Error::Unknown {
                    layer: Layer::Bth,
                    field: "OpCode",
                    value: v as u64,
                })
            };
        }
        let code = v & 0x1F;
        let mut i = 0;
        while i < Operation::ALL.len() {
            let op = Operation::ALL[i];
            if op.code() == code && op != Operation::Cnp {
                return Opcode::new(service, op);
            }
            i += 1;
        }
        Err(Error::Unknown {
            layer: Layer::Bth,
            field: "OpCode",
            value: v as u64,
        })
    }
}

impl From<Opcode> for u8 {
    fn from(o: Opcode) -> u8 {
        o.0
    }
}

/// "RC Send Only", "UD Send Only with Immediate", "CNP".
impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.service() == Service::Cnp {
            f.write_str("CNP")
        } else {
            write!(f, "{} {}", self.service(), self.name())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 38 as in ib-transport.md §13.1, with the headers of §6.
    /// Columns: opcode, name, rdeth, deth, xrceth, feth, reth, atomic_eth,
    /// aeth, atomic_ack_eth, immdt, ieth, payload.
    #[allow(clippy::type_complexity)]
    const TABLE: &[(u8, &str, [u8; 11])] = &[
        (0x00, "RC Send First", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0x01, "RC Send Middle", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0x02, "RC Send Last", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x03,
            "RC Send Last with Immediate",
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (0x04, "RC Send Only", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x05,
            "RC Send Only with Immediate",
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x06,
            "RC RDMA Write First",
            [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x07,
            "RC RDMA Write Middle",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x08,
            "RC RDMA Write Last",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x09,
            "RC RDMA Write Last with Immediate",
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x0A,
            "RC RDMA Write Only",
            [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x0B,
            "RC RDMA Write Only with Immediate",
            [0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x0C,
            "RC RDMA Read Request",
            [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        ),
        (
            0x0D,
            "RC RDMA Read Response First",
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (
            0x0E,
            "RC RDMA Read Response Middle",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x0F,
            "RC RDMA Read Response Last",
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (
            0x10,
            "RC RDMA Read Response Only",
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (0x11, "RC Acknowledge", [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
        (
            0x12,
            "RC Atomic Acknowledge",
            [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
        ),
        (0x13, "RC CmpSwap", [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]),
        (0x14, "RC FetchAdd", [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]),
        (
            0x16,
            "RC Send Last with Invalidate",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        ),
        (
            0x17,
            "RC Send Only with Invalidate",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        ),
        (0x1C, "RC Flush", [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]),
        (0x1D, "RC Atomic Write", [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]),
        (0x20, "UC Send First", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0x21, "UC Send Middle", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0x22, "UC Send Last", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x23,
            "UC Send Last with Immediate",
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (0x24, "UC Send Only", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x25,
            "UC Send Only with Immediate",
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x26,
            "UC RDMA Write First",
            [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x27,
            "UC RDMA Write Middle",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x28,
            "UC RDMA Write Last",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x29,
            "UC RDMA Write Last with Immediate",
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x2A,
            "UC RDMA Write Only",
            [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x2B,
            "UC RDMA Write Only with Immediate",
            [0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1],
        ),
        (0x40, "RD Send First", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0x41, "RD Send Middle", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0x42, "RD Send Last", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x43,
            "RD Send Last with Immediate",
            [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (0x44, "RD Send Only", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x45,
            "RD Send Only with Immediate",
            [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x46,
            "RD RDMA Write First",
            [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x47,
            "RD RDMA Write Middle",
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x48,
            "RD RDMA Write Last",
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x49,
            "RD RDMA Write Last with Immediate",
            [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x4A,
            "RD RDMA Write Only",
            [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x4B,
            "RD RDMA Write Only with Immediate",
            [1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 1],
        ),
        (
            0x4C,
            "RD RDMA Read Request",
            [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        ),
        (
            0x4D,
            "RD RDMA Read Response First",
            [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (
            0x4E,
            "RD RDMA Read Response Middle",
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0x4F,
            "RD RDMA Read Response Last",
            [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (
            0x50,
            "RD RDMA Read Response Only",
            [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (0x51, "RD Acknowledge", [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
        (
            0x52,
            "RD Atomic Acknowledge",
            [1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
        ),
        (0x53, "RD CmpSwap", [1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0]),
        (0x54, "RD FetchAdd", [1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0]),
        (0x55, "RD Resync", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        (0x5C, "RD Flush", [1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0]),
        (0x64, "UD Send Only", [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0x65,
            "UD Send Only with Immediate",
            [0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (0x81, "CNP", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0xA0, "XRC Send First", [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0xA1, "XRC Send Middle", [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]),
        (0xA2, "XRC Send Last", [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0xA3,
            "XRC Send Last with Immediate",
            [0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (0xA4, "XRC Send Only", [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            0xA5,
            "XRC Send Only with Immediate",
            [0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0xA6,
            "XRC RDMA Write First",
            [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0xA7,
            "XRC RDMA Write Middle",
            [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0xA8,
            "XRC RDMA Write Last",
            [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0xA9,
            "XRC RDMA Write Last with Immediate",
            [0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1],
        ),
        (
            0xAA,
            "XRC RDMA Write Only",
            [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1],
        ),
        (
            0xAB,
            "XRC RDMA Write Only with Immediate",
            [0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1],
        ),
        (
            0xAC,
            "XRC RDMA Read Request",
            [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0],
        ),
        (
            0xAD,
            "XRC RDMA Read Response First",
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (
            0xAE,
            "XRC RDMA Read Response Middle",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        (
            0xAF,
            "XRC RDMA Read Response Last",
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (
            0xB0,
            "XRC RDMA Read Response Only",
            [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        ),
        (0xB1, "XRC Acknowledge", [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
        (
            0xB2,
            "XRC Atomic Acknowledge",
            [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
        ),
        (0xB3, "XRC CmpSwap", [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0]),
        (0xB4, "XRC FetchAdd", [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0]),
        (
            0xB6,
            "XRC Send Last with Invalidate",
            [0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1],
        ),
        (
            0xB7,
            "XRC Send Only with Invalidate",
            [0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1],
        ),
    ];

    fn flags(h: Headers) -> [u8; 11] {
        [
            h.rdeth,
            h.deth,
            h.xrceth,
            h.feth,
            h.reth,
            h.atomic_eth,
            h.aeth,
            h.atomic_ack_eth,
            h.immdt,
            h.ieth,
            h.payload,
        ]
        .map(u8::from)
    }

    /// IBT-C9-2, IBT-C9-14, IBT-C9-15, IBT-C9-19, IBT-C9-20, IBT-C9-23,
    /// IBT-C9-24, IBT-o9-15, IBT-o9-16, IBT-X-05, IBT-X-06, IBT-X-08,
    /// IBT-o9-3.a1, EXT-ROCE-04: table-driven header presence for every
    /// opcode, and every other octet value is an error.
    #[test]
    fn ibt_c9_2_header_table_every_opcode() {
        for v in 0u8..=255 {
            let row = TABLE.iter().find(|r| r.0 == v);
            match (Opcode::try_from(v), row) {
                (Ok(op), Some(&(_, name, hdrs))) => {
                    assert_eq!(op.to_string(), name, "{v:#x}");
                    assert_eq!(flags(op.headers()), hdrs, "{name}");
                    assert_eq!(u8::from(op), v);
                    assert_eq!(Opcode::new(op.service(), op.operation()), Ok(op));
                    assert_eq!(op.has_payload(), hdrs[10] == 1);
                }
                (Err(e), None) => assert!(matches!(e, Error::Unknown { .. }), "{v:#x}"),
                (got, want) => panic!("{v:#x}: {got:?} vs {want:?}"),
            }
        }
        assert_eq!(Opcode::all().count(), TABLE.len());
    }

    #[test]
    fn header_lengths() {
        assert_eq!(Opcode::RC_SEND_ONLY.header_len(), 0);
        assert_eq!(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.header_len(), 20);
        assert_eq!(Opcode::RC_ATOMIC_ACKNOWLEDGE.header_len(), 12);
        assert_eq!(Opcode::RC_COMPARE_SWAP.header_len(), 28);
        assert_eq!(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.header_len(), 12);
        assert_eq!(Opcode::try_from(0x4C).unwrap().header_len(), 28);
        assert_eq!(Opcode::RC_FLUSH.header_len(), 20);
        assert!(Opcode::RC_ACKNOWLEDGE.headers().aeth);
        assert!(Headers::NONE.is_empty());
    }

    #[test]
    fn invalid_combinations() {
        assert!(Opcode::new(Service::Uc, Operation::RdmaReadRequest).is_err());
        assert!(Opcode::new(Service::Ud, Operation::RdmaWriteOnly).is_err());
        assert!(Opcode::new(Service::Rc, Operation::Resync).is_err());
        assert!(Opcode::new(Service::Rc, Operation::Cnp).is_err());
        assert!(Opcode::new(Service::Cnp, Operation::SendOnly).is_err());
        assert_eq!(Opcode::new(Service::Cnp, Operation::Cnp), Ok(Opcode::CNP));
        // 0x80 is IB's native CNP (Annex A10), not a RoCEv2 opcode.
        assert!(Opcode::try_from(0x80).is_err());
        for v in [
            0x15u8, 0x18, 0x1B, 0x1E, 0x1F, 0x2C, 0x56, 0x60, 0x66, 0xB5, 0xC0, 0xE0, 0xFF,
        ] {
            assert!(Opcode::try_from(v).is_err(), "{v:#x}");
        }
        assert!(Service::try_from(6).is_err());
        assert_eq!(u8::from(Service::Xrc), 5);
    }

    /// IBT-X-01: SE only on the last/only packet of SEND, SEND w/ Imm,
    /// WRITE w/ Imm and SEND w/ Inv.
    #[test]
    fn ibt_x_01_se_allowed() {
        let allowed: Vec<u8> = Opcode::all()
            .filter(|o| o.se_allowed())
            .map(u8::from)
            .collect();
        assert_eq!(
            allowed,
            [
                0x02, 0x03, 0x04, 0x05, 0x09, 0x0B, 0x16, 0x17, 0x22, 0x23, 0x24, 0x25, 0x29, 0x2B,
                0x42, 0x43, 0x44, 0x45, 0x49, 0x4B, 0x64, 0x65, 0xA2, 0xA3, 0xA4, 0xA5, 0xA9, 0xAB,
                0xB6, 0xB7
            ]
        );
        assert!(!Opcode::RC_SEND_FIRST.se_allowed());
        assert!(!Opcode::RC_RDMA_WRITE_LAST.se_allowed());
    }

    #[test]
    fn positions_and_direction() {
        assert!(Opcode::RC_SEND_FIRST.operation().is_first());
        assert!(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.operation().is_middle());
        assert!(Opcode::RC_SEND_LAST_WITH_INVALIDATE.operation().is_last());
        assert!(Opcode::UD_SEND_ONLY.operation().is_only());
        assert!(Opcode::RC_COMPARE_SWAP.is_request());
        assert!(!Opcode::RC_ACKNOWLEDGE.is_request());
        assert!(!Opcode::CNP.is_request());
        assert!(Service::Xrc.is_reliable() && !Service::Ud.is_reliable());
    }
}
