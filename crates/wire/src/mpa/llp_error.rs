//! The MPA (LLP) error codes an RDMAP Terminate reports with Layer 2 / EType 0
//! (RFC 5044 §8, RFC 6581), EXT-MPA-01.

use crate::error::Layer;
use crate::macros::wire_enum;

wire_enum! {
/// MPA (LLP) error codes, reported in an RDMAP Terminate with Layer = LLP (0x2),
/// EType = MPA (0x0) (RFC 5044 §8, codes 5..7 from RFC 6581). EXT-MPA-01.
pub enum LlpError: u8 => (Layer::Mpa, "LLP error code") {
    /// 1: TCP connection closed, terminated or lost (MPA-85).
    TcpConnectionLost = 0x01,
    /// 2: received MPA CRC does not match the computed value (MPA-86).
    CrcError = 0x02,
    /// 3: Marker and ULPDU_Length disagree on the FPDU start (MPA-87).
    MarkerMismatch = 0x03,
    /// 4: invalid MPA Request or Reply frame (MPA-88).
    InvalidRequestReply = 0x04,
    /// 5: local catastrophic error (RFC 6581).
    LocalCatastrophic = 0x05,
    /// 6: insufficient IRD resources (RFC 6581).
    InsufficientIrd = 0x06,
    /// 7: no matching RTR option (RFC 6581).
    NoMatchingRtr = 0x07,
}
}

impl LlpError {
    /// Terminate Layer value for the LLP (RFC 5040 §4.8 / RFC 6580).
    pub const LAYER: u8 = 0x2;
    /// Terminate EType value for MPA within the LLP layer.
    pub const ETYPE_MPA: u8 = 0x0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn ext_mpa_01_llp_error_codes() {
        let all = [
            (1u8, LlpError::TcpConnectionLost),
            (2, LlpError::CrcError),
            (3, LlpError::MarkerMismatch),
            (4, LlpError::InvalidRequestReply),
            (5, LlpError::LocalCatastrophic),
            (6, LlpError::InsufficientIrd),
            (7, LlpError::NoMatchingRtr),
        ];
        for (v, e) in all {
            assert_eq!(LlpError::try_from(v).unwrap(), e);
            assert_eq!(u8::from(e), v);
        }
        for v in [0u8, 8, 0x10, 0xff] {
            assert!(matches!(
                LlpError::try_from(v),
                Err(Error::Unknown {
                    layer: Layer::Mpa,
                    ..
                })
            ));
        }
        assert_eq!(LlpError::LAYER, 2);
        assert_eq!(LlpError::ETYPE_MPA, 0);
    }
}
