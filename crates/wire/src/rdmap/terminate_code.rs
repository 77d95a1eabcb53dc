//! What a Terminate reports (RFC 5040 §4.8): the Layer / EType / Error Code triple of
//! Figure 9 and the Terminated headers each error class carries (Figure 10).

use crate::ddp::DdpError;
use crate::error::{Error, Layer, Result};
use crate::macros::wire_enum;
use crate::mpa::LlpError;

wire_enum! {
    /// RFC 5040 §4.8: Terminate Layer.
    pub enum TerminateLayer: u8 => (Layer::Rdmap, "Terminate Layer") {
        Rdma = 0x0,
        Ddp = 0x1,
        /// The LLP, i.e. MPA.
        Llp = 0x2,
    }
}

wire_enum! {
    /// RFC 5040 §4.8 Figure 9: error types of Layer 0 (RDMA).
    pub enum RdmaErrorType: u8 => (Layer::Rdmap, "Terminate RDMA error type") {
        LocalCatastrophic = 0x0,
        RemoteProtection = 0x1,
        RemoteOperation = 0x2,
    }
}

wire_enum! {
    /// RFC 5040 Figure 9: codes of Layer 0 / EType 0x1, Remote Protection Error.
    pub enum RemoteProtectionError: u8 => (Layer::Rdmap, "Terminate Remote Protection error code") {
        InvalidStag = 0x00,
        BaseOrBoundsViolation = 0x01,
        AccessRightsViolation = 0x02,
        StagNotAssociatedWithStream = 0x03,
        ToWrap = 0x04,
        StagCannotBeInvalidated = 0x09,
        Unspecified = 0xFF,
    }
}

wire_enum! {
    /// RFC 5040 Figure 9: codes of Layer 0 / EType 0x2, Remote Operation Error.
    pub enum RemoteOperationError: u8 => (Layer::Rdmap, "Terminate Remote Operation error code") {
        InvalidRdmapVersion = 0x05,
        UnexpectedOpcode = 0x06,
        CatastrophicLocalizedToStream = 0x07,
        CatastrophicGlobal = 0x08,
        StagCannotBeInvalidated = 0x09,
        Unspecified = 0xFF,
    }
}

/// The only LLP error type (MPA).
pub const LLP_ETYPE_MPA: u8 = LlpError::ETYPE_MPA;

/// A Terminate's Layer / EType / Error Code triple (RFC 5040 Figure 9,
/// `docs/spec/rdmap.md` §13.2, `docs/spec/mpa.md` §14.2; RDMAP-27).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TerminateCode {
    /// 0/0/any: the code field carries any value.
    RdmaLocalCatastrophic { code: u8 },
    /// 0/1/code.
    RdmaRemoteProtection(RemoteProtectionError),
    /// 0/2/code.
    RdmaRemoteOperation(RemoteOperationError),
    /// 1/EType/code.
    Ddp(DdpError),
    /// 2/0/code.
    Llp(LlpError),
}

impl core::fmt::Display for TerminateCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TerminateCode::RdmaLocalCatastrophic { code } => {
                write!(f, "RDMAP local catastrophic (code {code:#04x})")
            }
            TerminateCode::RdmaRemoteProtection(e) => write!(f, "RDMAP remote protection: {e}"),
            TerminateCode::RdmaRemoteOperation(e) => write!(f, "RDMAP remote operation: {e}"),
            TerminateCode::Ddp(e) => write!(f, "DDP {e}"),
            TerminateCode::Llp(e) => write!(f, "LLP: {e}"),
        }
    }
}

/// RFC 5040 §4.8 Figure 10: which Terminated headers an error class carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeaderPresence {
    /// DDP Segment Length and Terminated DDP Header (M and D), "if possible".
    pub ddp: bool,
    /// Terminated RDMA Header (R); only a Read Request has one (ambiguity 4).
    pub rdma: bool,
}

impl TerminateCode {
    /// Decodes the triple; `Err(Unknown)` for values no spec defines.
    pub fn from_parts(layer: u8, etype: u8, code: u8) -> Result<Self> {
        Ok(match TerminateLayer::try_from(layer)? {
            TerminateLayer::Rdma => match RdmaErrorType::try_from(etype)? {
                RdmaErrorType::LocalCatastrophic => TerminateCode::RdmaLocalCatastrophic { code },
                RdmaErrorType::RemoteProtection => {
                    TerminateCode::RdmaRemoteProtection(code.try_into()?)
                }
                RdmaErrorType::RemoteOperation => {
                    TerminateCode::RdmaRemoteOperation(code.try_into()?)
                }
            },
            TerminateLayer::Ddp => TerminateCode::Ddp(DdpError::from_parts(etype, code)?),
            TerminateLayer::Llp => {
                if etype != LLP_ETYPE_MPA {
                    return Err(Error::Unknown {
                        layer: Layer::Rdmap,
                        field: "Terminate LLP error type",
                        value: etype.into(),
                    });
                }
                TerminateCode::Llp(code.try_into()?)
            }
        })
    }

    /// The Layer.
    pub const fn layer(&self) -> TerminateLayer {
        match self {
            TerminateCode::RdmaLocalCatastrophic { .. }
            | TerminateCode::RdmaRemoteProtection(_)
            | TerminateCode::RdmaRemoteOperation(_) => TerminateLayer::Rdma,
            TerminateCode::Ddp(_) => TerminateLayer::Ddp,
            TerminateCode::Llp(_) => TerminateLayer::Llp,
        }
    }

    /// `(Layer, EType, Error Code)` as numbers.
    pub const fn parts(&self) -> (u8, u8, u8) {
        match *self {
            TerminateCode::RdmaLocalCatastrophic { code } => (0, 0, code),
            TerminateCode::RdmaRemoteProtection(c) => (0, 1, c as u8),
            TerminateCode::RdmaRemoteOperation(c) => (0, 2, c as u8),
            TerminateCode::Ddp(e) => (1, e.error_type() as u8, e.code()),
            TerminateCode::Llp(c) => (2, LLP_ETYPE_MPA, c as u8),
        }
    }

    /// Every defined triple (Local Catastrophic listed once, with code 0).
    pub fn all() -> impl Iterator<Item = TerminateCode> {
        core::iter::once(TerminateCode::RdmaLocalCatastrophic { code: 0 })
            .chain(
                RemoteProtectionError::ALL
                    .iter()
                    .map(|&c| TerminateCode::RdmaRemoteProtection(c)),
            )
            .chain(
                RemoteOperationError::ALL
                    .iter()
                    .map(|&c| TerminateCode::RdmaRemoteOperation(c)),
            )
            .chain(DdpError::all().map(TerminateCode::Ddp))
            .chain(LlpError::ALL.iter().map(|&c| TerminateCode::Llp(c)))
    }

    /// RFC 5040 Figure 10 (RDMAP-28, RDMAP-34): the headers a Terminate for
    /// this error should carry. Callers clear `rdma` when the failing message
    /// was not a Read Request (ambiguity 4) and `ddp` when no segment is tied
    /// to the error (RDMAP-99).
    pub const fn figure10(&self) -> HeaderPresence {
        let (ddp, rdma) = match self {
            TerminateCode::RdmaLocalCatastrophic { .. } | TerminateCode::Llp(_) => (false, false),
            TerminateCode::RdmaRemoteProtection(_) => (true, true),
            TerminateCode::RdmaRemoteOperation(_) | TerminateCode::Ddp(_) => (true, false),
        };
        HeaderPresence { ddp, rdma }
    }
}

#[cfg(test)]
mod tests;
