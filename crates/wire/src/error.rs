//! The one error type of the wire layer.
//!
//! Every parser in this crate returns [`Error`] for input it cannot accept; no
//! parser panics on any input (each has a fuzz target in `fuzz/`).

/// Which protocol layer an error was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Layer {
    Mpa,
    Ddp,
    Rdmap,
    Bth,
    IbExt,
    Ip,
    Udp,
    RoceV2,
    RpcRdma,
    OncRpc,
    Xdr,
    Mad,
    Cm,
}

impl core::fmt::Display for Layer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            Layer::Mpa => "MPA",
            Layer::Ddp => "DDP",
            Layer::Rdmap => "RDMAP",
            Layer::Bth => "BTH",
            Layer::IbExt => "IB extended header",
            Layer::Ip => "IP",
            Layer::Udp => "UDP",
            Layer::RoceV2 => "RoCEv2",
            Layer::RpcRdma => "RPC-over-RDMA",
            Layer::OncRpc => "ONC RPC",
            Layer::Xdr => "XDR",
            Layer::Mad => "MAD",
            Layer::Cm => "CM",
        };
        f.write_str(s)
    }
}

/// A wire-format error: always typed, never a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Fewer octets than the header (or the emit) needs.
    #[error("{layer}: truncated: need {need} octets, have {have}")]
    Truncated {
        layer: Layer,
        need: usize,
        have: usize,
    },
    /// A field holds a value the spec does not define (or reserves).
    #[error("{layer}: unknown {field} value {value:#x}")]
    Unknown {
        layer: Layer,
        field: &'static str,
        value: u64,
    },
    /// The octets are structurally wrong (inconsistent lengths, bad key, ...).
    #[error("{layer}: malformed: {reason}")]
    Malformed { layer: Layer, reason: &'static str },
    /// A bound the codec enforces against hostile input was exceeded.
    #[error("{layer}: {what} {value} exceeds the limit {limit}")]
    TooLarge {
        layer: Layer,
        what: &'static str,
        value: u64,
        limit: u64,
    },
}

pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    /// The layer that raised the error.
    pub fn layer(&self) -> Layer {
        match *self {
            Error::Truncated { layer, .. }
            | Error::Unknown { layer, .. }
            | Error::Malformed { layer, .. }
            | Error::TooLarge { layer, .. } => layer,
        }
    }
}

/// `Ok(())` when `buf` holds at least `need` octets.
#[inline]
pub(crate) fn need(layer: Layer, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            layer,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
