//! Errors → Terminate contents (RFC 5040 §4.8 Figure 10, §7.1, §7.2) and Terminate → work
//! completion status.

use softrdma_memory::AccessError;
use softrdma_wire::ddp::{self, DdpError, TaggedBufferError, UntaggedBufferError};
use softrdma_wire::rdmap::{
    ReadRequestRepr, RemoteOperationError, RemoteProtectionError, TerminateCode, TerminateRepr,
    TerminatedDdp,
};

use crate::verbs_types::WcStatus;

/// A local error: the Terminate to send and the work requests it fails.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fault {
    pub(super) code: TerminateCode,
    /// The failing segment (RFC 5040 §7.1 cases 2 and 3).
    pub(super) ddp: Option<TerminatedDdp>,
    /// The failing Read Request, advanced by the octets already sent (RDMAP-33).
    pub(super) rdma: Option<ReadRequestRepr>,
    /// The send-queue entry (by sequence) this error belongs to, and its status.
    pub(super) sq: Option<(u64, WcStatus)>,
    /// Status of the receive WQE in use, if this error belongs to it.
    pub(super) rq: Option<WcStatus>,
}

impl Fault {
    pub(super) const fn new(code: TerminateCode) -> Fault {
        Fault {
            code,
            ddp: None,
            rdma: None,
            sq: None,
            rq: None,
        }
    }

    pub(super) const fn ddp(code: DdpError) -> Fault {
        Fault::new(TerminateCode::Ddp(code))
    }

    pub(super) const fn untagged(code: UntaggedBufferError) -> Fault {
        Fault::ddp(DdpError::UntaggedBuffer(code))
    }

    pub(super) const fn tagged(code: TaggedBufferError) -> Fault {
        Fault::ddp(DdpError::TaggedBuffer(code))
    }

    pub(super) const fn operation(code: RemoteOperationError) -> Fault {
        Fault::new(TerminateCode::RdmaRemoteOperation(code))
    }

    pub(super) const fn protection(code: RemoteProtectionError) -> Fault {
        Fault::new(TerminateCode::RdmaRemoteProtection(code))
    }

    /// RDMAP-99: a local error not caused by the peer; Local Catastrophic carries no headers.
    pub(super) const fn local() -> Fault {
        Fault::new(TerminateCode::RdmaLocalCatastrophic { code: 0 })
    }

    /// The segment that failed: its DDP header and the length DDP handed up.
    pub(super) const fn segment(mut self, header: ddp::Repr, segment_length: u16) -> Fault {
        self.ddp = Some(TerminatedDdp {
            segment_length,
            header,
        });
        self
    }

    pub(super) const fn read_request(mut self, r: ReadRequestRepr) -> Fault {
        self.rdma = Some(r);
        self
    }

    pub(super) const fn sq(mut self, seq: u64, status: WcStatus) -> Fault {
        self.sq = Some((seq, status));
        self
    }

    pub(super) const fn rq(mut self, status: WcStatus) -> Fault {
        self.rq = Some(status);
        self
    }

    /// RFC 5040 §4.8 Figure 10 (RDMAP-28, RDMAP-34): which headers the Terminate carries.
    /// M and D go together (the length is always valid when we send it, RDMAP-30); R only
    /// for a Read Request (`docs/spec/rdmap.md` ambiguity 4), and never without D (ambiguity 11).
    pub(super) fn terminate(&self) -> TerminateRepr {
        let presence = self.code.figure10();
        let mut t = TerminateRepr::new(self.code);
        if presence.ddp
            && let Some(d) = self.ddp
        {
            t.m = true;
            t.ddp = Some(d);
            if presence.rdma {
                t.rdma = self.rdma;
            }
        }
        t
    }
}

/// RFC 5041 §7.2 / `docs/spec/rdmap.md` §9.3 (derived rows): a tagged sink (RDMA Write, Read
/// Response) the key table refused. DDP has no code for missing rights: RDMA Remote
/// Protection 0x02 (interpretation in §9.3).
pub(super) fn tagged_sink_fault(e: AccessError) -> Fault {
    match e {
        AccessError::InvalidKey | AccessError::Invalidated => {
            Fault::tagged(TaggedBufferError::InvalidStag)
        }
        AccessError::Bounds => Fault::tagged(TaggedBufferError::BaseOrBoundsViolation),
        AccessError::WrongPd | AccessError::NotBoundToQp => {
            Fault::tagged(TaggedBufferError::StagNotAssociatedWithStream)
        }
        AccessError::Wrap => Fault::tagged(TaggedBufferError::ToWrap),
        AccessError::Rights => Fault::protection(RemoteProtectionError::AccessRightsViolation),
        AccessError::Alignment => Fault::protection(RemoteProtectionError::Unspecified),
    }
}

/// RFC 5040 §7.2 checks 4a-4e (RDMAP-109..113) and the derived rights check (RDMAP-114) of
/// a Read Request's source, and the same checks of an Atomic Request's target (RFC 7306 §8
/// adds no codes; a misaligned target is Unspecified): RDMA Remote Protection codes.
pub(super) fn read_source_fault(e: AccessError) -> Fault {
    Fault::protection(match e {
        AccessError::InvalidKey | AccessError::Invalidated => RemoteProtectionError::InvalidStag,
        AccessError::WrongPd | AccessError::NotBoundToQp => {
            RemoteProtectionError::StagNotAssociatedWithStream
        }
        AccessError::Bounds => RemoteProtectionError::BaseOrBoundsViolation,
        AccessError::Wrap => RemoteProtectionError::ToWrap,
        AccessError::Rights => RemoteProtectionError::AccessRightsViolation,
        AccessError::Alignment => RemoteProtectionError::Unspecified,
    })
}

/// The status a work request gets when the peer's Terminate fails it: protection and tagged
/// buffer errors are `RemoteAccess`; version, opcode, queue, MSN, MO, length and
/// invalidation errors `RemoteInvalidRequest`; catastrophic and unspecified ones
/// `RemoteOperation`; an LLP error at the peer `Fatal`.
pub fn status_for_terminate(code: TerminateCode) -> WcStatus {
    match code {
        TerminateCode::RdmaLocalCatastrophic { .. } => WcStatus::RemoteOperation,
        TerminateCode::RdmaRemoteProtection(RemoteProtectionError::StagCannotBeInvalidated) => {
            WcStatus::RemoteInvalidRequest
        }
        TerminateCode::RdmaRemoteProtection(_) => WcStatus::RemoteAccess,
        TerminateCode::RdmaRemoteOperation(
            RemoteOperationError::InvalidRdmapVersion
            | RemoteOperationError::UnexpectedOpcode
            | RemoteOperationError::StagCannotBeInvalidated,
        ) => WcStatus::RemoteInvalidRequest,
        TerminateCode::RdmaRemoteOperation(_) => WcStatus::RemoteOperation,
        TerminateCode::Ddp(DdpError::LocalCatastrophic) => WcStatus::RemoteOperation,
        TerminateCode::Ddp(DdpError::TaggedBuffer(TaggedBufferError::InvalidDdpVersion)) => {
            WcStatus::RemoteInvalidRequest
        }
        TerminateCode::Ddp(DdpError::TaggedBuffer(_)) => WcStatus::RemoteAccess,
        TerminateCode::Ddp(DdpError::UntaggedBuffer(_)) => WcStatus::RemoteInvalidRequest,
        TerminateCode::Llp(_) => WcStatus::Fatal,
    }
}
