//! Work requests and work completions of one queue pair, in the shape a verbs user knows
//! (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`), for the sans-IO iWARP engine
//! ([`crate::rdmap::RdmapEngine`]).
//!
//! Scatter/gather entries name registered memory through an L_Key; the engine checks every
//! entry with `KeyTable::check_local` when the request is posted and keeps the resulting
//! grant, which the memory crate re-validates on every copy (a deregistered region fails the
//! next copy instead of being touched).

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use softrdma_memory::{AccessError, Key};

/// One scatter/gather entry: `length` bytes at virtual address `addr` of the region `lkey`
/// (`ibv_sge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Virtual address (the region's iova space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// L_Key of a region in the QP's protection domain.
    pub lkey: Key,
}

impl Sge {
    /// `length` bytes at `addr` of region `lkey`.
    pub const fn new(lkey: Key, addr: u64, length: u32) -> Sge {
        Sge { addr, length, lkey }
    }
}

/// What a send-queue work request does (`ibv_wr_opcode`). The solicited-event variants of
/// RFC 5040 (Send with SE, Send with SE and Invalidate) are [`SendFlags::SOLICITED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    /// RFC 5040 §5.3: Send (or Send with SE).
    Send,
    /// RFC 5040 §5.3: Send with Invalidate (or Send with SE and Invalidate); the peer
    /// invalidates `invalidate_rkey` after placing the message.
    SendWithInvalidate {
        /// The peer's STag to invalidate (RDMAP-66).
        invalidate_rkey: Key,
    },
    /// RFC 5040 §5.1: RDMA Write of the gather list to `[remote_addr, ..)` of `rkey`.
    RdmaWrite {
        /// Data Sink Tagged Offset.
        remote_addr: u64,
        /// Data Sink STag.
        rkey: Key,
    },
    /// RFC 5040 §5.2: RDMA Read of `sg_list[0].length` bytes from `[remote_addr, ..)` of
    /// `rkey` into the one local entry (its L_Key is the Data Sink STag).
    RdmaRead {
        /// Data Source Tagged Offset.
        remote_addr: u64,
        /// Data Source STag.
        rkey: Key,
    },
}

/// Send work request flags (`ibv_send_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(u8);

impl SendFlags {
    /// Report a completion on success (errors are always reported).
    pub const SIGNALED: SendFlags = SendFlags(1 << 0);
    /// Send with Solicited Event (RFC 5040 opcodes 0x5 and 0x6, RDMAP-63).
    pub const SOLICITED: SendFlags = SendFlags(1 << 1);
    /// Do not start before every earlier RDMA Read of this QP completed.
    pub const FENCE: SendFlags = SendFlags(1 << 2);
    /// Copy the gather list's bytes when posting; the buffers may be reused at once.
    pub const INLINE: SendFlags = SendFlags(1 << 3);

    /// No flag.
    pub const fn empty() -> SendFlags {
        SendFlags(0)
    }

    /// Every flag of `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for SendFlags {
    fn bitor_assign(&mut self, rhs: SendFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for SendFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (SendFlags::SIGNALED, "SIGNALED"),
            (SendFlags::SOLICITED, "SOLICITED"),
            (SendFlags::FENCE, "FENCE"),
            (SendFlags::INLINE, "INLINE"),
        ];
        f.write_str("SendFlags(")?;
        let mut first = true;
        for (flag, name) in names {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// A send-queue work request (`ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// Gather list (Send, Write) or the single sink entry (Read; empty for a zero-length Read).
    pub sg_list: Vec<Sge>,
    /// Signaled, solicited, fence, inline.
    pub flags: SendFlags,
}

impl SendWr {
    /// A signaled Send of `sg_list`.
    pub fn send(wr_id: u64, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::Send,
            sg_list,
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signaled Send with Invalidate of `sg_list`, invalidating the peer's `invalidate_rkey`.
    pub fn send_with_invalidate(wr_id: u64, sg_list: Vec<Sge>, invalidate_rkey: Key) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::SendWithInvalidate { invalidate_rkey },
            sg_list,
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signaled RDMA Write of `sg_list` to `remote_addr` of `rkey`.
    pub fn write(wr_id: u64, sg_list: Vec<Sge>, rkey: Key, remote_addr: u64) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::RdmaWrite { remote_addr, rkey },
            sg_list,
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signaled RDMA Read from `remote_addr` of `rkey` into `sink` (`None`: zero-length).
    pub fn read(wr_id: u64, sink: Option<Sge>, rkey: Key, remote_addr: u64) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::RdmaRead { remote_addr, rkey },
            sg_list: sink.into_iter().collect(),
            flags: SendFlags::SIGNALED,
        }
    }

    /// The same request with `flags` instead.
    pub fn with_flags(mut self, flags: SendFlags) -> SendWr {
        self.flags = flags;
        self
    }
}

/// A receive-queue work request (`ibv_recv_wr`): one untagged buffer for one Send (RDMAP-59).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list; the message may be shorter than its total (RDMAP-60).
    pub sg_list: Vec<Sge>,
}

impl RecvWr {
    /// A receive request over `sg_list`.
    pub fn new(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
        RecvWr { wr_id, sg_list }
    }
}

/// Completion status (`ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// The operation completed.
    Success,
    /// An inbound Send did not fit the receive buffer (DDP "message too long", RDMAP-61).
    LocalLength,
    /// A local buffer was no longer accessible through its L_Key (deregistered after post).
    LocalProtection,
    /// A local QP error not caused by a buffer (internal inconsistency).
    LocalQpOperation,
    /// The peer refused an access: bad STag, bounds, rights (a Terminate with a protection
    /// or tagged-buffer code).
    RemoteAccess,
    /// The peer could not complete the operation (catastrophic or unspecified Terminate).
    RemoteOperation,
    /// The peer considers the request invalid (opcode, version, queue, length, invalidation).
    RemoteInvalidRequest,
    /// The QP went to the Error state before this request completed (RDMAP-72, RDMAP-93).
    WorkRequestFlushed,
    /// The connection below failed (an LLP error Terminate from the peer).
    Fatal,
}

/// What a completion reports on (`ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// Send of any kind.
    Send,
    /// RDMA Write.
    RdmaWrite,
    /// RDMA Read.
    RdmaRead,
    /// An inbound Send consumed this receive request.
    Recv,
    /// An inbound RDMA Write with immediate consumed this receive request
    /// (`IBV_WC_RECV_RDMA_WITH_IMM`; InfiniBand only, iWARP has no immediate data).
    RecvRdmaWithImm,
}

/// Completion flags (`ibv_wc_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct WcFlags {
    /// The Send carried an Invalidate STag that was invalidated (`IBV_WC_WITH_INV`, RDMAP-09).
    pub with_invalidate: bool,
    /// Send with Solicited Event (RDMAP-63).
    pub solicited: bool,
}

/// A work completion (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// Octets received (Recv), read (Read) or sent (Send, Write).
    pub byte_len: u32,
    /// Invalidate / solicited.
    pub flags: WcFlags,
    /// The local STag the peer invalidated (Recv with `flags.with_invalidate`).
    pub invalidated_key: Option<Key>,
    /// Immediate data, host order (`IBV_WC_WITH_IMM`; InfiniBand SEND / RDMA WRITE with
    /// immediate; always `None` on iWARP).
    pub imm: Option<u32>,
}

/// Why a work request was refused at post time; nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum PostError {
    /// The queue already holds its configured depth of uncompleted requests.
    #[error("work queue full")]
    QueueFull,
    /// More scatter/gather entries than the QP allows (a Read takes at most one).
    #[error("too many scatter/gather entries (at most {max})")]
    TooManySge {
        /// The limit for this request.
        max: usize,
    },
    /// The entries add up to more than 2^32 - 1 octets (RFC 5040 §5: the largest message).
    #[error("message longer than 2^32 - 1 octets")]
    MessageTooLong,
    /// `INLINE` data longer than the QP's inline limit, or `INLINE` on a Read.
    #[error("inline data not allowed here or longer than {max} octets")]
    Inline {
        /// The QP's inline limit.
        max: u32,
    },
    /// An RDMA Read on a QP whose ORD is 0.
    #[error("RDMA Read posted with ORD 0")]
    ReadsDisabled,
    /// Entry `sge` failed its L_Key check (`KeyTable::check_local`).
    #[error("scatter/gather entry {sge}: {error}")]
    LocalProtection {
        /// Index of the failing entry.
        sge: usize,
        /// What the key table said.
        error: AccessError,
    },
}
