//! Helpers shared by the RDMAP tests: segment builders, golden-vector checks and the
//! proptest strategies of the fixed-size headers and the Terminate.

use super::*;
use crate::ddp::{self, tests::arb_repr as arb_ddp_repr};
use proptest::prelude::*;

pub(super) fn emit_vec(seg: &Segment<'_>) -> Vec<u8> {
    let mut out = vec![0u8; seg.buffer_len()];
    assert_eq!(seg.emit(&mut out), Ok(out.len()));
    out
}

/// Parse, check the length, re-emit byte-identically.
pub(super) fn round_trip(ulpdu: &[u8]) -> Segment<'_> {
    let seg = Segment::parse(ulpdu).unwrap();
    assert_eq!(seg.buffer_len(), ulpdu.len());
    assert_eq!(emit_vec(&seg), ulpdu);
    seg
}

pub(super) fn untagged(opcode: Opcode, qn: u32, msn: u32, mo: u32, last: bool) -> ddp::Repr {
    ddp::Repr::Untagged {
        last,
        reserved: 0,
        dv: ddp::DDP_VERSION,
        rsvd_ulp: [Control::new(opcode).octet().unwrap(), 0, 0, 0, 0],
        qn,
        msn,
        mo,
    }
}

pub(super) fn tagged(opcode: Opcode, stag: u32, to: u64, last: bool) -> ddp::Repr {
    ddp::Repr::Tagged {
        last,
        reserved: 0,
        dv: ddp::DDP_VERSION,
        rsvd_ulp: Control::new(opcode).octet().unwrap(),
        stag,
        to,
    }
}

/// `bytes` parses to `seg` and `seg` emits `bytes`.
pub(super) fn golden(bytes: &[u8], seg: Segment<'_>) {
    assert_eq!(Segment::parse(bytes), Ok(seg));
    assert_eq!(emit_vec(&seg), bytes);
}

pub(super) fn read_request_1() -> ReadRequestRepr {
    ReadRequestRepr {
        sink_stag: 0x1122_3344,
        sink_to: 0x0000_7f00_0000_1000,
        rdmardsz: 4096,
        src_stag: 0x5566_7788,
        src_to: 0x0000_7f00_0000_8000,
    }
}

pub(super) fn atomic_request_1() -> AtomicRequestRepr {
    AtomicRequestRepr {
        reserved: 0,
        opcode: AtomicOpcode::CompareSwap,
        request_identifier: 0x0000_0007,
        remote_stag: 0xabcd_ef01,
        remote_tagged_offset: 0x1000_2000_3000_4000,
        add_or_swap_data: 0x1111_1111_1111_1111,
        add_or_swap_mask: u64::MAX,
        compare_data: 0x2222_2222_2222_2222,
        compare_mask: u64::MAX,
    }
}

pub(super) fn arb_read_request() -> impl Strategy<Value = ReadRequestRepr> {
    (
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(
            |(sink_stag, sink_to, rdmardsz, src_stag, src_to)| ReadRequestRepr {
                sink_stag,
                sink_to,
                rdmardsz,
                src_stag,
                src_to,
            },
        )
}

fn arb_terminate_code() -> impl Strategy<Value = TerminateCode> {
    let listed: Vec<TerminateCode> = TerminateCode::all().collect();
    prop_oneof![
        any::<u8>().prop_map(|code| TerminateCode::RdmaLocalCatastrophic { code }),
        proptest::sample::select(listed),
    ]
}

pub(super) fn arb_terminate() -> impl Strategy<Value = TerminateRepr> {
    (
        prop_oneof![
            Just(TerminateLayout::Rfc5040),
            Just(TerminateLayout::LinuxSiw)
        ],
        arb_terminate_code(),
        any::<bool>(),
        0u16..0x2000,
        proptest::option::of((any::<u16>(), arb_ddp_repr())),
        proptest::option::of(arb_read_request()),
        0u16..40,
    )
        .prop_map(
            |(layout, code, m, reserved, ddp, rdma, trailing_zeros)| TerminateRepr {
                layout,
                code,
                m,
                reserved,
                ddp: ddp.map(|(segment_length, header)| TerminatedDdp {
                    segment_length,
                    header,
                }),
                rdma,
                trailing_zeros,
            },
        )
}

pub(super) fn arb_atomic_request() -> impl Strategy<Value = AtomicRequestRepr> {
    (
        0u32..0x1000_0000,
        proptest::sample::select(AtomicOpcode::ALL),
        any::<u32>(),
        any::<u32>(),
        any::<[u64; 5]>(),
    )
        .prop_map(|(reserved, opcode, id, stag, v)| AtomicRequestRepr {
            reserved,
            opcode,
            request_identifier: id,
            remote_stag: stag,
            remote_tagged_offset: v[0],
            add_or_swap_data: v[1],
            add_or_swap_mask: v[2],
            compare_data: v[3],
            compare_mask: v[4],
        })
}

pub(super) fn arb_atomic_response() -> impl Strategy<Value = AtomicResponseRepr> {
    (any::<u32>(), any::<u64>()).prop_map(|(id, v)| AtomicResponseRepr {
        original_request_identifier: id,
        original_remote_data_value: v,
    })
}

pub(super) fn arb_immediate() -> impl Strategy<Value = ImmediateDataRepr> {
    any::<[u8; 8]>().prop_map(|immediate_data| ImmediateDataRepr { immediate_data })
}
