//! Tests of the Terminate codes (RFC 5040 §4.8 Figures 9 and 10).

use super::*;
use crate::rdmap::{TerminateLayout, TerminateRepr};

/// RDMAP-27: every Layer / EType / Error Code of Figure 9, §13.2 and mpa.md §14.2.
#[test]
fn rdmap_27_every_terminate_code() {
    let all: Vec<TerminateCode> = TerminateCode::all().collect();
    assert_eq!(all.len(), 1 + 7 + 6 + 12 + 7);
    for code in all {
        let (l, e, c) = code.parts();
        assert_eq!(TerminateCode::from_parts(l, e, c), Ok(code));
        assert_eq!(u8::from(code.layer()), l);
        for layout in [TerminateLayout::Rfc5040, TerminateLayout::LinuxSiw] {
            let t = TerminateRepr {
                layout,
                ..TerminateRepr::new(code)
            };
            let mut out = [0u8; 4];
            t.emit(&mut out).unwrap();
            assert_eq!(TerminateRepr::parse_with_layout(&out, layout), Ok(t));
        }
    }
    for c in 0..=255u8 {
        assert_eq!(
            TerminateCode::from_parts(0, 0, c),
            Ok(TerminateCode::RdmaLocalCatastrophic { code: c })
        );
    }
    for (l, e, c) in [
        (3, 0, 0),
        (0, 3, 0),
        (0, 1, 0x05),
        (0, 2, 0x00),
        (1, 3, 0),
        (2, 1, 1),
        (2, 0, 0),
        (2, 0, 8),
    ] {
        assert!(
            matches!(
                TerminateCode::from_parts(l, e, c),
                Err(Error::Unknown { .. })
            ),
            "{l}/{e}/{c}"
        );
    }
}

/// RDMAP-28, RDMAP-34: Figure 10, error class to Terminated headers.
#[test]
fn rdmap_28_34_figure10() {
    let p = |ddp, rdma| HeaderPresence { ddp, rdma };
    let table = [
        (
            TerminateCode::RdmaLocalCatastrophic { code: 0 },
            p(false, false),
        ),
        (
            TerminateCode::RdmaRemoteProtection(RemoteProtectionError::ToWrap),
            p(true, true),
        ),
        (
            TerminateCode::RdmaRemoteOperation(RemoteOperationError::InvalidRdmapVersion),
            p(true, false),
        ),
        (
            TerminateCode::Ddp(DdpError::LocalCatastrophic),
            p(true, false),
        ),
        (
            TerminateCode::Llp(LlpError::TcpConnectionLost),
            p(false, false),
        ),
    ];
    for (code, presence) in table {
        assert_eq!(code.figure10(), presence, "{code:?}");
    }
}
