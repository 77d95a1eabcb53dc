//! The receive-side checks beyond lengths (RFC 5040 §7.2, `docs/spec/rdmap.md` §9.3) and the
//! Terminate each calls for: which errors of this module are protocol violations.

use super::atomic::FIELD_ATOMIC_OPCODE;
use super::control::{FIELD_OPCODE, FIELD_QN};
use super::terminate_code::{RemoteOperationError, TerminateCode};
use crate::ddp::{self, DdpError};
use crate::error::{Error, Layer};

/// A receive-side check [`Segment::parse`](super::Segment::parse) makes beyond lengths, with the
/// Terminate it calls for (`docs/spec/rdmap.md` §9.3; see [`classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Violation {
    /// OpCode 0xC..0xF (RDMAP-17, RDMAP-104): §9.3 row 2, 0/2/0x06.
    ReservedOpcode,
    /// DDP T flag differs from Figure 4 (RDMAP-16, RDMAP-104): §9.3 row 2
    /// and ambiguity 10, 0/2/0x06.
    TaggedFlagMismatch,
    /// QN is an RDMAP queue but not the opcode's (RDMAP-104): §9.3 row 2 and
    /// ambiguity 10, 0/2/0x06.
    QueueMismatch,
    /// QN names no RDMAP queue (EXT-DDP-05): §9.3 row 1, DDP 1/2/0x01 Invalid QN.
    UndefinedQueue,
    /// A message with an RDMAP header (Read Request, Terminate, RFC 7306) is
    /// not one DDP segment at MO 0: 0/2/0xFF Unspecified.
    NotSingleSegment,
    /// Octets after a fixed-size RDMAP header, or non-zero octets after a
    /// Terminate Header (RDMAP-22): 0/2/0xFF Unspecified.
    TrailingOctets,
    /// An Atomic Request whose Atomic Operation code RFC 7306 does not define
    /// (0x3..0xF): an operation the Responder cannot execute. RFC 7306 adds no
    /// Terminate code (the IANA RDMAP error registry has none from it), so the
    /// nearest RFC 5040 one: 0/2/0x06 Unexpected OpCode.
    UndefinedAtomicOpcode,
}

impl Violation {
    /// Every violation.
    pub const ALL: &'static [Violation] = &[
        Violation::ReservedOpcode,
        Violation::TaggedFlagMismatch,
        Violation::QueueMismatch,
        Violation::UndefinedQueue,
        Violation::NotSingleSegment,
        Violation::TrailingOctets,
        Violation::UndefinedAtomicOpcode,
    ];

    /// The `Error::Malformed::reason` of the violations reported as `Malformed`.
    pub const fn reason(self) -> &'static str {
        match self {
            Violation::ReservedOpcode => "reserved RDMAP opcode",
            Violation::TaggedFlagMismatch => "DDP T flag does not match the RDMAP opcode",
            Violation::QueueMismatch => "DDP queue number does not match the RDMAP opcode",
            Violation::UndefinedQueue => "DDP queue number names no RDMAP queue",
            Violation::NotSingleSegment => "RDMAP header message is not one DDP segment at MO 0",
            Violation::TrailingOctets => "unexpected octets after the RDMAP header",
            Violation::UndefinedAtomicOpcode => "undefined RFC 7306 Atomic Operation code",
        }
    }

    /// The Terminate this violation calls for (`docs/spec/rdmap.md` §9.3).
    pub const fn terminate_code(self) -> TerminateCode {
        match self {
            Violation::ReservedOpcode
            | Violation::TaggedFlagMismatch
            | Violation::QueueMismatch
            | Violation::UndefinedAtomicOpcode => {
                TerminateCode::RdmaRemoteOperation(RemoteOperationError::UnexpectedOpcode)
            }
            Violation::UndefinedQueue => TerminateCode::Ddp(DdpError::UntaggedBuffer(
                ddp::UntaggedBufferError::InvalidQn,
            )),
            Violation::NotSingleSegment | Violation::TrailingOctets => {
                TerminateCode::RdmaRemoteOperation(RemoteOperationError::Unspecified)
            }
        }
    }

    // pub(super): terminate.rs and segment.rs raise violations with it.
    pub(super) fn error(self) -> Error {
        Error::Malformed {
            layer: Layer::Rdmap,
            reason: self.reason(),
        }
    }
}

/// Which [`Violation`] an error from this module reports, if any. Truncation
/// and undefined field values other than OpCode and QN are not violations.
pub fn classify(err: &Error) -> Option<Violation> {
    match *err {
        Error::Unknown {
            layer: Layer::Rdmap,
            field,
            ..
        } if field == FIELD_OPCODE => Some(Violation::ReservedOpcode),
        Error::Unknown {
            layer: Layer::Rdmap,
            field,
            ..
        } if field == FIELD_ATOMIC_OPCODE => Some(Violation::UndefinedAtomicOpcode),
        Error::Unknown {
            layer: Layer::Ddp,
            field,
            ..
        } if field == FIELD_QN => Some(Violation::UndefinedQueue),
        Error::Malformed {
            layer: Layer::Rdmap,
            reason,
        } => Violation::ALL
            .iter()
            .copied()
            .find(|v| v.reason() == reason),
        _ => None,
    }
}

/// The Terminate code for an inbound segment [`Segment::parse`](super::Segment::parse) rejected
/// (`docs/spec/rdmap.md` §9.3):
///
/// | check | error | Terminate |
/// |---|---|---|
/// | OpCode 0xC..0xF (row 2) | `Unknown { Rdmap, FIELD_OPCODE }` | 0/2/0x06 Unexpected OpCode |
/// | T flag vs opcode (row 2) | `Malformed { Rdmap, TaggedFlagMismatch }` | 0/2/0x06 |
/// | QN vs opcode (row 2, ambiguity 10) | `Malformed { Rdmap, QueueMismatch }` | 0/2/0x06 |
/// | QN not 0..=3 (row 1) | `Unknown { Ddp, FIELD_QN }` | 1/2/0x01 Invalid QN |
/// | Atomic Operation code 0x3..0xF (RFC 7306) | `Unknown { Rdmap, FIELD_ATOMIC_OPCODE }` | 0/2/0x06 |
/// | header message split | `Malformed { Rdmap, NotSingleSegment }` | 0/2/0xFF |
/// | extra octets (RDMAP-22) | `Malformed { Rdmap, TrailingOctets }` | 0/2/0xFF |
///
/// `None` otherwise (truncation, undefined codes inside a Terminate). RV
/// (row 3, 0/2/0x05) and DV (1/1/0x04, 1/2/0x06) are kept raw by the parser
/// and checked by the engine against the negotiated versions. An invalid
/// inbound Terminate (opcode 7) is a local error: no Terminate is sent back
/// (RDMAP-71), whatever this returns.
pub fn terminate_code_for(err: &Error) -> Option<TerminateCode> {
    classify(err).map(Violation::terminate_code)
}
