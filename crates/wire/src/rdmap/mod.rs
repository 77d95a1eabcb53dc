//! RDMAP — Remote Direct Memory Access Protocol (RFC 5040 §4) with the
//! RFC 7306 extensions (Immediate Data, Atomic Operations).
//!
//! The input of [`Segment::parse`] is one ULPDU as MPA hands it up: the DDP
//! header (whose RsvdULP carries the RDMAP control field and, for the
//! Invalidate opcodes, the Invalidate STag), then the RDMAP header or the
//! ULP payload. Every bit is kept, reserved ones included, so that
//! `emit(parse(x)) == x` for any accepted ULPDU.
//!
//! Linux siw writes the Terminate control word through little-endian
//! bitfields (`struct iwarp_terminate`, `drivers/infiniband/sw/siw/iwarp.h`):
//! see [`TerminateLayout`].
//!
//! RFC 7306 values (opcodes 0x8..0xB, queue 3, header layouts) were checked
//! against Wireshark's `packet-iwarp-ddp-rdmap.c` (opcodes 0xA/0xB, Atomic
//! header fields) and urdma's `proto.h` (opcodes 0x8..0xB, Atomic Request on
//! QN 1, Atomic Response on QN 3); `docs/spec/rdmap.md` §13.4 marks them medium
//! confidence. Atomic Operation codes: FetchAdd 0, Swap 1, CmpSwap 2 as RFC 7306
//! §5 lists them; Wireshark names 0 and 2 the same way, urdma numbers its
//! CmpSwap 1 (so the two do not interoperate on CmpSwap).

/// Basic constructors of a fixed-length checked view.
// Here, ahead of the `mod` lines, so that read_request, atomic and immediate_data see it.
macro_rules! fixed_view {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps `buffer` without any check (accessors may then panic).
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps `buffer` after [`check_len`](Self::check_len); no accessor panics afterwards.
            pub fn new_checked(buffer: T) -> Result<Self> {
                let v = Self::new_unchecked(buffer);
                v.check_len()?;
                Ok(v)
            }

            /// `Err(Truncated)` unless the whole header is present.
            pub fn check_len(&self) -> Result<()> {
                need(Layer::Rdmap, self.buffer.as_ref(), $len)
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

mod atomic;
mod control;
mod immediate_data;
mod read_request;
mod segment;
mod terminate;
mod terminate_code;
mod violation;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;

pub use atomic::{
    ATOMIC_REQUEST_HEADER_LEN, ATOMIC_RESPONSE_HEADER_LEN, AtomicOpcode, AtomicRequestHeader,
    AtomicRequestRepr, AtomicResponseHeader, AtomicResponseRepr, FIELD_ATOMIC_OPCODE,
};
pub use control::{
    Control, FIELD_OPCODE, FIELD_QN, MASK_OPCODE, MASK_RSV, MASK_RV, Opcode, Queue, RDMAP_VERSION,
};
pub use immediate_data::{IMMEDIATE_DATA_HEADER_LEN, ImmediateDataHeader, ImmediateDataRepr};
pub use read_request::{READ_REQUEST_HEADER_LEN, ReadRequestHeader, ReadRequestRepr};
pub use segment::{Body, Segment};
pub use terminate::{
    DDP_SEGMENT_LENGTH_LEN, MAX_TERMINATE_HEADER_LEN, TERMINATE_CONTROL_LEN, TerminateHeader,
    TerminateLayout, TerminateRepr, TerminatedDdp,
};
pub use terminate_code::{
    HeaderPresence, LLP_ETYPE_MPA, RdmaErrorType, RemoteOperationError, RemoteProtectionError,
    TerminateCode, TerminateLayer,
};
pub use violation::{Violation, classify, terminate_code_for};

/// RFC 5044 §8 / RFC 6581: the codes of Layer 2 / EType 0x0 (MPA) live with MPA.
pub use crate::mpa::LlpError;
