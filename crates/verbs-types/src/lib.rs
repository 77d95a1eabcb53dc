//! Work requests and work completions of one queue pair, in the shape a verbs user knows
//! (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`), shared by the sans-IO iWARP engine
//! (`softrdma_iwarp::rdmap::RdmapEngine`) and the InfiniBand engine (`softrdma_ib`).
//!
//! Scatter/gather entries name registered memory through an L_Key; the engine checks every
//! entry with `KeyTable::check_local` when the request is posted and keeps the resulting
//! grant, which the memory crate re-validates on every copy (a deregistered region fails the
//! next copy instead of being touched).
//!
//! [`SharedRecvQueue`] is the shared receive queue (`ibv_srq`) both engines can draw
//! receive WQEs from.

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use smallvec::SmallVec;
use softrdma_memory::{AccessError, Key};

mod check;
mod inline;
mod srq;

pub use check::{
    CheckedRecv, CheckedSend, IB_MAX_MESSAGE, IWARP_MAX_MESSAGE, Payload, SendLimits, Sgl,
    check_recv, check_send,
};
pub use inline::{InlineBuf, InlinePool};
pub use srq::{SharedRecvQueue, SrqLimitError};

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
    /// IBA §9.4.1: SEND with immediate data (iWARP: RFC 7306 Immediate Data, softrdma peers).
    SendWithImm {
        /// Immediate data, host order (big-endian in the ImmDt header).
        imm: u32,
    },
    /// IBA §9.4.3: RDMA WRITE with immediate data; consumes a receive WQE at the peer
    /// (iWARP: the Write then an RFC 7306 Immediate Data message, softrdma peers).
    RdmaWriteWithImm {
        /// Target virtual address.
        remote_addr: u64,
        /// Target R_Key.
        rkey: Key,
        /// Immediate data, host order.
        imm: u32,
    },
    /// IBA §9.4.5: ATOMIC Compare and Swap of the 8 octets at `remote_addr` (8-byte aligned);
    /// the original value lands in the one local 8-octet entry (RC; iWARP: RFC 7306 §5).
    AtomicCmpSwap {
        /// Target virtual address, 8-byte aligned.
        remote_addr: u64,
        /// Target R_Key.
        rkey: Key,
        /// Value compared with the target.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// IBA §9.4.5: ATOMIC Fetch and Add (RC; iWARP: RFC 7306 §5).
    AtomicFetchAdd {
        /// Target virtual address, 8-byte aligned.
        remote_addr: u64,
        /// Target R_Key.
        rkey: Key,
        /// Added to the target (modulo 2^64).
        add: u64,
    },
    /// IBA 10.6.7.3 / RDMAC verbs 7.2: Local Invalidate of a fast-registered region or a
    /// type 2 window (`IBV_WR_LOCAL_INV`). Sends nothing; it runs once every request posted
    /// before it has completed, and those posted after it wait for it. Entries are ignored.
    LocalInv {
        /// The key to invalidate.
        key: Key,
    },
    /// IBA 10.6.7.2: Bind Memory Window (`IBV_WR_BIND_MW`), run in order as
    /// [`WrOpcode::LocalInv`] is. Entries are ignored.
    BindMw(MwBind),
}

/// What a [`WrOpcode::BindMw`] binds (`ibv_send_wr.bind_mw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// The window's key now.
    pub mw: Key,
    /// The key it has once bound: the window's index with a key octet of the consumer's
    /// (`ibv_inc_rkey`).
    pub new_rkey: Key,
    /// The region the window lies in.
    pub mr: Key,
    /// First octet (the region's address space).
    pub addr: u64,
    /// Octets.
    pub len: u64,
    /// Remote rights only.
    pub access: softrdma_memory::Access,
}

impl WrOpcode {
    /// RDMA READ or an ATOMIC: the request waits for a response carrying data and takes a
    /// slot of the initiator depth (ORD / `max_rd_atomic`).
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpSwap { .. }
                | WrOpcode::AtomicFetchAdd { .. }
        )
    }

    /// The completion opcode of this request (`ibv_wc_opcode`).
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithInvalidate { .. } | WrOpcode::SendWithImm { .. } => {
                WcOpcode::Send
            }
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            WrOpcode::LocalInv { .. } => WcOpcode::LocalInv,
            WrOpcode::BindMw(_) => WcOpcode::BindMw,
        }
    }

    /// Local Invalidate or Bind Memory Window: runs on this side's key table in send-queue
    /// order and sends nothing.
    pub const fn is_local(&self) -> bool {
        matches!(self, WrOpcode::LocalInv { .. } | WrOpcode::BindMw(_))
    }

    /// Runs a local operation on `keys` for `qp` in `pd`: the status its completion carries
    /// on failure (IBA 10.6.7: a bind that breaks a rule is a memory window bind error, an
    /// invalidation of a key that cannot be, a local protection error).
    pub fn run_local(
        &self,
        keys: &softrdma_memory::KeyTable,
        qp: softrdma_memory::QpId,
        pd: softrdma_memory::PdId,
    ) -> Result<(), WcStatus> {
        match *self {
            WrOpcode::LocalInv { key } => keys
                .invalidate_local(key, pd)
                .map_err(|_| WcStatus::LocalProtection),
            WrOpcode::BindMw(b) => keys
                .bind_mw_with(
                    b.mw,
                    Some(b.new_rkey),
                    b.mr,
                    qp,
                    pd,
                    b.addr,
                    b.len,
                    b.access,
                )
                .map(|_| ())
                .map_err(|_| WcStatus::MwBind),
            _ => Ok(()),
        }
    }
}

/// Where a datagram (UD) send goes (`ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Address handle: an index the driver resolves to a network address (`ibv_ah`).
    pub ah: u32,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key (DETH; a value with the high bit set means "use the QP's own").
    pub remote_qkey: u32,
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

    /// These flags without those of `other`.
    pub const fn without(self, other: SendFlags) -> SendFlags {
        SendFlags(self.0 & !other.0)
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

/// A work request's scatter/gather list: up to four entries in the request itself (no
/// allocation per post; every test and tool of this project posts at most four), more on
/// the heap. Built from anything that yields [`Sge`]s: an array (`[mr.sge(0, 64)]`), an
/// `Option`, a `Vec`.
pub type SgList = SmallVec<[Sge; 4]>;

/// A send-queue work request (`ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// Gather list (Send, Write) or the single sink entry (Read; empty for a zero-length Read).
    pub sg_list: SgList,
    /// Signaled, solicited, fence, inline.
    pub flags: SendFlags,
    /// Destination of a UD send; `None` on connected QPs.
    pub ud: Option<UdDest>,
    /// `INLINE` octets: with `sg_list` empty, the message itself; otherwise where the
    /// entries' octets are copied at post time (emptied first). A buffer from the QP's
    /// [`InlinePool`] makes the post cost no allocation; `None` takes one there.
    pub inline: Option<InlineBuf>,
}

impl SendWr {
    /// A signaled Send of `sg_list`.
    pub fn send(wr_id: u64, sg_list: impl IntoIterator<Item = Sge>) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::Send,
            sg_list: sg_list.into_iter().collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled Send with Invalidate of `sg_list`, invalidating the peer's `invalidate_rkey`.
    pub fn send_with_invalidate(
        wr_id: u64,
        sg_list: impl IntoIterator<Item = Sge>,
        invalidate_rkey: Key,
    ) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::SendWithInvalidate { invalidate_rkey },
            sg_list: sg_list.into_iter().collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled RDMA Write of `sg_list` to `remote_addr` of `rkey`.
    pub fn write(
        wr_id: u64,
        sg_list: impl IntoIterator<Item = Sge>,
        rkey: Key,
        remote_addr: u64,
    ) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::RdmaWrite { remote_addr, rkey },
            sg_list: sg_list.into_iter().collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled RDMA Read from `remote_addr` of `rkey` into `sink` (`None`: zero-length).
    pub fn read(wr_id: u64, sink: Option<Sge>, rkey: Key, remote_addr: u64) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::RdmaRead { remote_addr, rkey },
            sg_list: sink.into_iter().collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled SEND with immediate data of `sg_list`.
    pub fn send_with_imm(wr_id: u64, sg_list: impl IntoIterator<Item = Sge>, imm: u32) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::SendWithImm { imm },
            sg_list: sg_list.into_iter().collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled RDMA WRITE with immediate data of `sg_list` to `remote_addr` of `rkey`.
    pub fn write_with_imm(
        wr_id: u64,
        sg_list: impl IntoIterator<Item = Sge>,
        rkey: Key,
        remote_addr: u64,
        imm: u32,
    ) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            sg_list: sg_list.into_iter().collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled ATOMIC Compare and Swap; the original value lands in `result` (8 octets).
    pub fn cmp_swap(
        wr_id: u64,
        result: Sge,
        rkey: Key,
        remote_addr: u64,
        compare: u64,
        swap: u64,
    ) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
            sg_list: std::iter::once(result).collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled ATOMIC Fetch and Add; the original value lands in `result` (8 octets).
    pub fn fetch_add(wr_id: u64, result: Sge, rkey: Key, remote_addr: u64, add: u64) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
            sg_list: std::iter::once(result).collect(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// The same request sent as a datagram to `dest` (UD QPs).
    pub fn to(mut self, dest: UdDest) -> SendWr {
        self.ud = Some(dest);
        self
    }

    /// A signaled Local Invalidate of `key` (`IBV_WR_LOCAL_INV`).
    pub fn local_inv(wr_id: u64, key: Key) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::LocalInv { key },
            sg_list: SgList::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
        }
    }

    /// A signaled Bind Memory Window (`IBV_WR_BIND_MW`).
    pub fn bind_mw(wr_id: u64, bind: MwBind) -> SendWr {
        SendWr {
            wr_id,
            opcode: WrOpcode::BindMw(bind),
            sg_list: SgList::new(),
            flags: SendFlags::SIGNALED,
            ud: None,
            inline: None,
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
    pub sg_list: SgList,
}

impl RecvWr {
    /// A receive request over `sg_list`.
    pub fn new(wr_id: u64, sg_list: impl IntoIterator<Item = Sge>) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: sg_list.into_iter().collect(),
        }
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
    /// InfiniBand: the local ACK timeout or PSN Sequence Error NAKs exhausted `retry_cnt`
    /// (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// InfiniBand: RNR NAKs exhausted `rnr_retry` (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
    /// InfiniBand: a response of an unexpected kind or length (`IBV_WC_BAD_RESP_ERR`).
    BadResponse,
    /// A Bind Memory Window request broke a binding rule (`IBV_WC_MW_BIND_ERR`).
    MwBind,
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
    /// (`IBV_WC_RECV_RDMA_WITH_IMM`).
    RecvRdmaWithImm,
    /// ATOMIC Compare and Swap.
    CompSwap,
    /// ATOMIC Fetch and Add.
    FetchAdd,
    /// Local Invalidate (`IBV_WC_LOCAL_INV`).
    LocalInv,
    /// Bind Memory Window (`IBV_WC_BIND_MW`).
    BindMw,
}

/// Completion flags (`ibv_wc_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct WcFlags {
    /// The Send carried an Invalidate STag that was invalidated (`IBV_WC_WITH_INV`, RDMAP-09).
    pub with_invalidate: bool,
    /// Send with Solicited Event (RDMAP-63).
    pub solicited: bool,
    /// UD receive: the first 40 octets of the buffer hold the GRH / IP header
    /// (`IBV_WC_GRH`).
    pub grh: bool,
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
    /// immediate, or their RFC 7306 mapping on iWARP).
    pub imm: Option<u32>,
    /// UD receive: the sender's QP number (`ibv_wc.src_qp`).
    pub src_qp: Option<u32>,
    /// The local QP whose request this is (`ibv_wc.qp_num`): set as the completion enters
    /// its CQ, which may serve many QPs.
    pub qp_num: u32,
}

impl WorkCompletion {
    /// A completion with no flags, key, immediate data or source QP.
    pub const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            flags: WcFlags {
                with_invalidate: false,
                solicited: false,
                grh: false,
            },
            invalidated_key: None,
            imm: None,
            src_qp: None,
            qp_num: 0,
        }
    }
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
    /// The operation does not exist on this transport or QP type (READ or atomics on UC,
    /// anything but SEND on UD).
    #[error("operation not supported by this transport or QP type")]
    Unsupported,
    /// A UD send without a destination, or a connected-QP send with one.
    #[error("UD destination missing or not allowed")]
    Destination,
    /// An atomic whose result entry is not 8 octets or whose remote address is not 8-byte
    /// aligned.
    #[error("atomic needs one 8-octet local entry and an 8-byte aligned remote address")]
    AtomicShape,
    /// The QP's state does not accept this queue's requests (send before RTS, anything in
    /// Reset).
    #[error("QP state does not accept this request")]
    State,
    /// An RDMA Read on a QP whose ORD is 0.
    #[error("RDMA Read posted with ORD 0")]
    ReadsDisabled,
    /// A receive posted to a QP that takes its receive WQEs from a shared receive queue:
    /// post to the SRQ instead (`ibv_post_recv` on such a QP fails; the verbs layer's
    /// `Error::SrqAttached`).
    #[error("the QP takes its receives from a shared receive queue")]
    SrqAttached,
    /// Entry `sge` failed its L_Key check (`KeyTable::check_local`).
    #[error("scatter/gather entry {sge}: {error}")]
    LocalProtection {
        /// Index of the failing entry.
        sge: usize,
        /// What the key table said.
        error: AccessError,
    },
}
