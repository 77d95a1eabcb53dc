//! Tests of the control field and the OpCode table (RFC 5040 §4.1, §4.2 Figure 4).

use super::*;
use crate::rdmap::test_util::*;
use crate::rdmap::{
    RemoteOperationError, Segment, TerminateCode, Violation, classify, terminate_code_for,
};
use crate::vectors::rdmap_ulpdus::*;

/// RDMAP-17, RDMAP-104: opcode numbers of Figure 4 and RFC 7306; 0xC..0xF
/// are reserved and map to Terminate 0/2/0x06.
#[test]
fn rdmap_17_opcode_values_and_reserved() {
    let values: Vec<u8> = Opcode::ALL.iter().map(|&o| o.into()).collect();
    assert_eq!(values, (0x0..=0xB).collect::<Vec<u8>>());
    assert_eq!(u8::from(Opcode::Terminate), 7);
    assert_eq!(u8::from(Opcode::ImmediateData), 8);
    assert_eq!(u8::from(Opcode::ImmediateDataWithSe), 9);
    assert_eq!(u8::from(Opcode::AtomicRequest), 0xA);
    assert_eq!(u8::from(Opcode::AtomicResponse), 0xB);
    for v in 0xC..=0xF_u8 {
        let err = Opcode::try_from(v).unwrap_err();
        assert_eq!(
            err,
            Error::Unknown {
                layer: Layer::Rdmap,
                field: FIELD_OPCODE,
                value: v.into()
            }
        );
        let mut ulpdu = SEED_FIG5_ULPDU;
        ulpdu[1] = 0x40 | v;
        let err = Segment::parse(&ulpdu).unwrap_err();
        assert_eq!(classify(&err), Some(Violation::ReservedOpcode));
        assert_eq!(
            terminate_code_for(&err),
            Some(TerminateCode::RdmaRemoteOperation(
                RemoteOperationError::UnexpectedOpcode
            ))
        );
    }
    assert!(
        Opcode::ALL
            .iter()
            .all(|o| o.is_rfc7306() == (u8::from(*o) >= 8))
    );
}

/// RDMAP-02, RDMAP-16, RDMAP-18, RDMAP-42, RDMAP-58, RDMAP-68: Figure 4
/// (and RFC 7306) T flag, queue and Invalidate STag per opcode.
#[test]
fn rdmap_02_16_18_figure4_table() {
    use Opcode::*;
    let table = [
        (RdmaWrite, true, None, false),
        (RdmaReadRequest, false, Some(Queue::ReadRequest), false),
        (RdmaReadResponse, true, None, false),
        (Send, false, Some(Queue::Send), false),
        (SendWithInvalidate, false, Some(Queue::Send), true),
        (SendWithSe, false, Some(Queue::Send), false),
        (SendWithSeAndInvalidate, false, Some(Queue::Send), true),
        (Terminate, false, Some(Queue::Terminate), false),
        (ImmediateData, false, Some(Queue::Send), false),
        (ImmediateDataWithSe, false, Some(Queue::Send), false),
        (AtomicRequest, false, Some(Queue::ReadRequest), false),
        (AtomicResponse, false, Some(Queue::AtomicResponse), false),
    ];
    assert_eq!(table.len(), Opcode::ALL.len());
    for (op, t, q, inv) in table {
        assert_eq!(op.tagged(), t, "{op:?}");
        assert_eq!(op.queue(), q, "{op:?}");
        assert_eq!(op.carries_invalidate_stag(), inv, "{op:?}");
    }
    let qns: Vec<u32> = Queue::ALL.iter().map(|&q| q.into()).collect();
    assert_eq!(qns, [0, 1, 2, 3]);
    assert!(Queue::try_from(4u32).is_err());
}

/// RDMAP-19, RDMAP-20: RV and Rsv are kept raw (the engine checks RV).
#[test]
fn rdmap_19_20_rv_and_rsv_kept() {
    for octet in [0x03, 0x43, 0x73, 0x83, 0xf3] {
        let mut ulpdu = SEED_FIG5_ULPDU;
        ulpdu[1] = octet;
        let seg = round_trip(&ulpdu);
        assert_eq!(seg.control.rv, octet >> 6);
        assert_eq!(seg.control.rsv, (octet >> 4) & 3);
        assert_eq!(Control::parse(&[octet]).unwrap().octet(), Ok(octet));
    }
    let bad = Control {
        rv: 4,
        ..Control::new(Opcode::Send)
    };
    assert!(matches!(bad.emit(&mut [0]), Err(Error::TooLarge { .. })));
    assert!(Control::parse(&[]).is_err());
}
