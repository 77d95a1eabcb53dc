//! Error types: management errors, remote/local access errors and remote invalidation errors.

/// Errors of the management operations (registration, windows, buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum MemError {
    /// The key names nothing (unknown index, stale consumer key, reserved index 0).
    #[error("invalid key")]
    InvalidKey,
    /// The key names a region where a window was expected, or the reverse.
    #[error("key names the wrong kind of object")]
    WrongType,
    /// Protection domains of the objects involved differ.
    #[error("protection domain mismatch")]
    WrongPd,
    /// The object is not in a state that allows the operation (e.g. binding a Valid type 2
    /// window, invalidating a Free key).
    #[error("operation not allowed in the key's current state")]
    WrongState,
    /// A range lies outside its buffer / region.
    #[error("range outside the buffer or region")]
    OutOfRange,
    /// `iova + len` exceeds 2^64.
    #[error("address range wraps 2^64")]
    Wrap,
    /// An inconsistent set of access flags (remote write or atomic without local write; a
    /// window with local rights).
    #[error("invalid combination of access flags")]
    InvalidAccess,
    /// The region lacks a right the operation needs (`MW_BIND`; `LOCAL_WRITE` for a writable
    /// window).
    #[error("access rights violation")]
    Rights,
    /// The key can not be invalidated (plain region, type 1 window).
    #[error("key cannot be invalidated")]
    NotInvalidatable,
    /// An atomic's offset is not 8-byte aligned.
    #[error("atomic operand not 8-byte aligned")]
    Misaligned,
    /// All 2^24 - 1 indices (or the configured limit) are in use.
    #[error("key table full")]
    TableFull,
}

/// IBA NAK codes an [`AccessError`] turns into (AETH syndrome, IBA 9.7.5.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IbNak {
    /// NAK "Remote Access Error" (syndrome `0x62`).
    RemoteAccess,
    /// NAK "Invalid Request" (syndrome `0x61`).
    InvalidRequest,
}

impl IbNak {
    /// The AETH syndrome octet.
    pub const fn syndrome(self) -> u8 {
        match self {
            IbNak::InvalidRequest => 0x61,
            IbNak::RemoteAccess => 0x62,
        }
    }
}

/// Why a remote (or local) access was refused. Variants map 1:1 to the wire's error codes:
///
/// | variant | DDP tagged (Layer 1, EType 1) | RDMAP (Layer 0, EType 1 Remote Protection) | IBA NAK |
/// |---|---|---|---|
/// | `InvalidKey` | 0x00 Invalid STag | 0x00 Invalid STag | Remote Access |
/// | `Invalidated` | 0x00 Invalid STag | 0x00 Invalid STag | Remote Access |
/// | `WrongPd` | 0x02 STag not associated with DDP Stream | 0x03 STag not associated with RDMAP Stream | Remote Access |
/// | `NotBoundToQp` | 0x02 | 0x03 | Remote Access |
/// | `Rights` | — (none; use RDMAP) | 0x02 Access rights violation | Remote Access |
/// | `Bounds` | 0x01 Base or bounds violation | 0x01 Base or bounds violation | Remote Access |
/// | `Wrap` | 0x03 TO wrap | 0x04 TO wrap | Remote Access |
/// | `Alignment` | — | 0xFF Unspecified | Invalid Request |
///
/// The check order of [`KeyTable::check_remote`](crate::KeyTable::check_remote) decides which
/// one is reported when several apply (RDMAP-102: report the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AccessError {
    /// No object with this index and consumer key (RDMAP-109).
    #[error("invalid STag")]
    InvalidKey,
    /// The key names an object that is not Valid: an invalidated region, an unbound window,
    /// a window whose region went away, or a revoked [`Target`](crate::Target) (RDMAP-120).
    #[error("STag invalidated")]
    Invalidated,
    /// The key belongs to another protection domain (RDMAP-110, RDMAP-115).
    #[error("STag not associated with this stream (protection domain)")]
    WrongPd,
    /// The key is a type 2 window bound to another QP / stream (RDMAP-116).
    #[error("STag not associated with this stream (QP)")]
    NotBoundToQp,
    /// The key does not grant the requested access (RDMAP-114, RDMAP-119).
    #[error("access rights violation")]
    Rights,
    /// `[to, to + len)` is not inside the key's range (RDMAP-111, RDMAP-112, RDMAP-117).
    #[error("base or bounds violation")]
    Bounds,
    /// `to + len` exceeds 2^64 (RDMAP-113).
    #[error("tagged offset wraps 2^64")]
    Wrap,
    /// An atomic's address is not 8-byte aligned (IBT-X-12).
    #[error("atomic operand not 8-byte aligned")]
    Alignment,
}

impl AccessError {
    /// RFC 5040 Terminate code for Layer 0 (RDMA), EType 1 (Remote Protection Error).
    pub const fn rdmap_code(self) -> u8 {
        match self {
            AccessError::InvalidKey | AccessError::Invalidated => 0x00,
            AccessError::Bounds => 0x01,
            AccessError::Rights => 0x02,
            AccessError::WrongPd | AccessError::NotBoundToQp => 0x03,
            AccessError::Wrap => 0x04,
            AccessError::Alignment => 0xFF,
        }
    }

    /// RFC 5041 Terminate code for Layer 1 (DDP), EType 1 (Tagged Buffer Error); `None` where
    /// DDP has no code (rights, alignment: report at the RDMAP layer instead).
    pub const fn ddp_tagged_code(self) -> Option<u8> {
        match self {
            AccessError::InvalidKey | AccessError::Invalidated => Some(0x00),
            AccessError::Bounds => Some(0x01),
            AccessError::WrongPd | AccessError::NotBoundToQp => Some(0x02),
            AccessError::Wrap => Some(0x03),
            AccessError::Rights | AccessError::Alignment => None,
        }
    }

    /// The IBA NAK a responder sends (IBT-X-03, IBT-X-12, IBT-X-16).
    pub const fn ib_nak(self) -> IbNak {
        match self {
            AccessError::Alignment => IbNak::InvalidRequest,
            _ => IbNak::RemoteAccess,
        }
    }
}

/// Why a remote invalidation (Send with Invalidate; IBA IETH) was refused (IBA o9-5.2.2
/// rules 1–9, RFC 5040 §6). Every variant maps to RDMAP Terminate Layer 0, EType 1, code 0x09
/// "STag cannot be Invalidated" ([`rdmap_code`](InvalidateError::rdmap_code)) and, on IBA, to
/// the "remote invalidate error" behaviour (NAK Invalid Request). The key's state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum InvalidateError {
    /// Rules 1–2: the key names nothing (unknown, stale consumer key, reserved index 0).
    #[error("invalid STag")]
    InvalidKey,
    /// Rules 3, 4, 6: plain (registered / reregistered) region, shared region, type 1 window.
    #[error("STag cannot be invalidated")]
    NotInvalidatable,
    /// Rules 5, 8, 9: the key belongs to another protection domain.
    #[error("STag belongs to another protection domain")]
    WrongPd,
    /// Rules 7, 8: a type 2 window bound to another QP.
    #[error("window bound to another QP")]
    WrongQp,
}

impl InvalidateError {
    /// RFC 5040 Terminate code (Layer 0, EType 1): 0x09 "STag cannot be Invalidated".
    pub const fn rdmap_code(self) -> u8 {
        0x09
    }
}
