//! Identifiers, keys and access rights.

use std::fmt;

bitflags::bitflags! {
    /// Access rights of a memory region or window (IBA 10.6.3, RFC 5040 §3.2 / RDMAP-119).
    ///
    /// Local read is always allowed. `REMOTE_WRITE` and `REMOTE_ATOMIC` on a region require
    /// `LOCAL_WRITE` (the IBA verbs rule Linux enforces in `ib_check_mr_access`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The local consumer may write (receive buffers, RDMA Read sinks).
        const LOCAL_WRITE = 1 << 0;
        /// The peer may read (RDMA Read source).
        const REMOTE_READ = 1 << 1;
        /// The peer may write (RDMA Write / Read Response sink).
        const REMOTE_WRITE = 1 << 2;
        /// The peer may run atomics (IBA FetchAdd / CmpSwap).
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the region.
        const MW_BIND = 1 << 4;
    }
}

impl Access {
    /// The rights a remote peer can exercise.
    pub const REMOTE: Access = Access::REMOTE_READ
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_ATOMIC);
}

bitflags::bitflags! {
    /// How a memory region was registered (IBA o9-5.2.2 rules 3 and 4).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MrFlags: u32 {
        /// Fast-registered: may be invalidated locally and remotely (Send with Invalidate).
        const FAST_REG = 1 << 0;
        /// Shared by several streams / protection domains: never remotely invalidatable
        /// (RDMAP-121, IBA o9-5.2.2 rule 4).
        const SHARED = 1 << 1;
    }
}

/// Protection domain id (the verbs layer allocates them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// Queue pair / RDMAP stream id (the verbs layer allocates them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpId(pub u32);

/// An STag / L_Key / R_Key: `index (24 bits) << 8 | consumer key (8 bits)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u32);

impl Key {
    /// Largest index a key can carry.
    pub const MAX_INDEX: u32 = 0x00ff_ffff;

    /// Builds a key; bits of `index` above 24 are dropped.
    pub const fn new(index: u32, consumer: u8) -> Key {
        Key((index & Self::MAX_INDEX) << 8 | consumer as u32)
    }

    /// The 24-bit index part (owned by the key table).
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }

    /// The 8-bit consumer key part (the "key" byte of an STag).
    pub const fn consumer(self) -> u8 {
        self.0 as u8
    }

    /// The same index with the consumer key advanced by `n` (`ibv_inc_rkey` for 1): the key
    /// a Bind request gives a window.
    pub const fn next_consumer(self, n: u8) -> Key {
        Key::new(self.index(), self.consumer().wrapping_add(n))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:#010x})", self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// Memory window types (IBA 10.6.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound by a verb, not associated with a QP; not invalidatable (rebind instead).
    Type1,
    /// Bound by a work request; associated with the QP number that bound it.
    Type2A,
    /// Bound by a work request; associated with the QP and its protection domain.
    Type2B,
}

/// State of a key (IBA 10.6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyState {
    /// Usable.
    Valid,
    /// Names nothing: never allocated, deregistered / deallocated, or wrong consumer key.
    Invalid,
    /// Allocated but not usable: an unbound or invalidated window, an invalidated
    /// fast-registered region.
    Free,
}
