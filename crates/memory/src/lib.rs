//! Registered memory for softrdma: keys (STag / L_Key / R_Key), memory regions, memory windows
//! and the access checks every remote access goes through (RFC 5040 §7.2, §8.1.1; IBA ch. 9/10).
//!
//! * [`Buffer`] — page-aligned (4096), zeroed, fixed-length memory behind a
//!   [`parking_lot::RwLock`]. The network side places data under the write lock; the user reads
//!   and writes through guards. No `&mut [u8]` to registered memory exists outside a guard. A
//!   buffer may also be memory a C program owns ([`Buffer::foreign`]): module `foreign` is the
//!   crate's one `unsafe`.
//! * [`KeyTable`] — one per device/context: a slab of memory regions and windows addressed by
//!   [`Key`] (24-bit index, 8-bit consumer key) with O(1) lookup.
//! * [`KeyTable::check_remote`] — the one door for every remote access. It returns a [`Target`];
//!   every byte the network moves goes through a `Target` method, which re-validates the grant.
//!
//! # Revocation (RDMAP-120)
//!
//! A [`Target`] does not expose its buffer. Each data operation on it (`place`, `copy_out`,
//! `write_with`, `fetch_add`, ...) takes the buffer lock, then the key table's read lock, checks
//! that the key's slot (and, for a window, the underlying region's slot) still has the
//! generation it had when the `Target` was issued, and only then touches memory, still holding
//! the table lock. Every revoking operation (`dereg_mr`, `rereg_mr`, `invalidate_local`,
//! `invalidate_remote`, `bind_mw` of a bound window, `dealloc_mw`) bumps the generation under the
//! table's write lock, so it waits for placements already in progress and, once it has
//! returned, no placement through an earlier `Target` can start.
//!
//! Lock order is always *buffer, then table*; the table lock is never held while a buffer lock
//! is being acquired. So a user may call any `KeyTable` method while holding a buffer guard.
//! The closures given to [`Target::read_with`] / [`Target::write_with`] run under both locks and
//! must not call back into the `KeyTable` or lock the same buffer.
//!
//! # Valgrind
//!
//! The crate's unit tests run clean under memcheck:
//!
//! ```text
//! BIN=$(cargo test -p softrdma-memory --no-run 2>&1 \
//!     | grep -o 'target/debug/deps/softrdma_memory-[0-9a-f]*')
//! valgrind --tool=memcheck --error-exitcode=1 "$BIN" --test-threads=1
//! ```
//!
//! (about 40 s under valgrind; well under a second natively).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod buffer;
mod error;
mod foreign;
mod gather;
mod key;
mod table;

#[cfg(test)]
mod tests;

pub use buffer::{Buffer, BufferReadGuard, BufferWriteGuard, MAP_MIN, PAGE_SIZE, PageBuf};
pub use error::{AccessError, IbNak, InvalidateError, MemError};
pub use gather::{DEFAULT_MIN_REFERENCE, MAX_IOV, TxBuf, TxMark, TxSink, iov_prefix};
pub use key::{Access, Key, KeyState, MrFlags, MwType, PdId, QpId};
pub use table::{KeyTable, Target};

/// Result type of the management operations of this crate.
pub type Result<T, E = MemError> = std::result::Result<T, E>;
