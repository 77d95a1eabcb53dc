//! The QP attributes every transport shares: its state and its counters.

use softrdma_ib::{RequesterCounters, ResponderCounters};

/// A QP's state (`ibv_qp_state`), one type for every transport.
///
/// InfiniBand QPs move through `Reset → Init → Rtr → Rts` (with `Sqd`, `Sqe`, `Error`) by
/// [`Qp::modify`](crate::Qp::modify) or by the connection manager. An iWARP QP is `Init` until
/// connected, `Connecting` during TCP and MPA, `Rts` in full operation, `Terminate` while the
/// Terminate describing an error goes out, then `Error`, or `Closed` after
/// [`Qp::disconnect`](crate::Qp::disconnect) (siw's IDLE, RTS, TERMINATE, ERROR, CLOSING).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// InfiniBand: created, nothing configured; requests are refused.
    Reset = 0,
    /// Not connected. Receives may be posted; sends wait (iWARP) or are refused (IB).
    Init = 1,
    /// iWARP: TCP connection and MPA negotiation in progress.
    Connecting = 2,
    /// InfiniBand: ready to receive.
    Rtr = 3,
    /// Ready to send: full operation.
    Rts = 4,
    /// InfiniBand: send queue drained (no new message starts).
    Sqd = 5,
    /// InfiniBand UC/UD: a send-queue error; receives go on.
    Sqe = 6,
    /// iWARP: an error was detected; the Terminate describing it is being sent.
    Terminate = 7,
    /// Every request completes flushed (`WorkRequestFlushed`).
    Error = 8,
    /// iWARP: closed by [`Qp::disconnect`](crate::Qp::disconnect); requests are flushed as in
    /// `Error`.
    Closed = 9,
}

impl QpState {
    pub(crate) fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Connecting,
            3 => QpState::Rtr,
            4 => QpState::Rts,
            5 => QpState::Sqd,
            6 => QpState::Sqe,
            7 => QpState::Terminate,
            8 => QpState::Error,
            _ => QpState::Closed,
        }
    }

    /// Error or Closed: requests are flushed.
    pub fn is_dead(self) -> bool {
        matches!(self, QpState::Error | QpState::Closed)
    }
}

impl From<softrdma_ib::QpState> for QpState {
    fn from(s: softrdma_ib::QpState) -> QpState {
        use softrdma_ib::QpState as S;
        match s {
            S::Reset => QpState::Reset,
            S::Init => QpState::Init,
            S::Rtr => QpState::Rtr,
            S::Rts => QpState::Rts,
            S::Sqd => QpState::Sqd,
            S::Sqe => QpState::Sqe,
            S::Error => QpState::Error,
        }
    }
}

impl PartialEq<softrdma_ib::QpState> for QpState {
    fn eq(&self, other: &softrdma_ib::QpState) -> bool {
        *self == QpState::from(*other)
    }
}

/// A QP's counters, one type for every transport: the totals a user compares across
/// transports, and the engine's own detail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QpCounters {
    /// Units handed to the network: IB packets of the send queue, or iWARP ULPDUs.
    pub tx_units: u64,
    /// Units taken from the network: iWARP ULPDUs, or IB packets that passed the header
    /// checks.
    pub rx_units: u64,
    /// IB request packets sent again (iWARP: TCP retransmits, not seen here: 0).
    pub retransmitted: u64,
    /// Inbound units dropped (IB header-pipeline drops, iWARP ULPDUs after the stream died).
    pub dropped: u64,
    /// Error reports sent: IB NAKs (RNR included) or iWARP Terminates.
    pub errors_tx: u64,
    /// Error reports received: IB NAKs (sequence and RNR) or iWARP Terminates.
    pub errors_rx: u64,
    /// The engine's own counters.
    pub detail: TransportCounters,
}

/// The engine counters behind [`QpCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum TransportCounters {
    /// Nothing counted yet (an iWARP QP before its connection).
    #[default]
    None,
    /// The RDMAP engine's counters.
    Iwarp(softrdma_iwarp::rdmap::StreamCounters),
    /// The InfiniBand engine's: header pipeline, requester, responder.
    Ib {
        /// Drops of the receive header pipeline, by reason.
        header: softrdma_ib::HeaderCounters,
        /// Requester and completer.
        requester: RequesterCounters,
        /// Responder.
        responder: ResponderCounters,
    },
}

impl QpCounters {
    pub(crate) fn from_iwarp(c: softrdma_iwarp::rdmap::StreamCounters) -> QpCounters {
        QpCounters {
            tx_units: c.ulpdus_tx,
            rx_units: c.ulpdus_rx,
            retransmitted: 0,
            dropped: c.dropped_rx,
            errors_tx: c.terminates_tx,
            errors_rx: c.terminates_rx,
            detail: TransportCounters::Iwarp(c),
        }
    }

    pub(crate) fn from_ib(
        header: softrdma_ib::HeaderCounters,
        requester: RequesterCounters,
        responder: ResponderCounters,
    ) -> QpCounters {
        let h = header;
        QpCounters {
            tx_units: requester.packets,
            rx_units: h.accepted,
            retransmitted: requester.retransmitted,
            dropped: h.bad_tver
                + h.bad_state
                + h.bad_service
                + h.bad_pkey
                + h.bad_qkey
                + h.malformed,
            errors_tx: responder.naks + responder.rnr_naks,
            errors_rx: requester.seq_naks + requester.rnr_naks,
            detail: TransportCounters::Ib {
                header,
                requester,
                responder,
            },
        }
    }

    /// The InfiniBand header-pipeline drops (zero on iWARP).
    pub fn ib_header(&self) -> softrdma_ib::HeaderCounters {
        match self.detail {
            TransportCounters::Ib { header, .. } => header,
            _ => softrdma_ib::HeaderCounters::default(),
        }
    }

    /// The InfiniBand requester's counters (zero on iWARP).
    pub fn ib_requester(&self) -> RequesterCounters {
        match self.detail {
            TransportCounters::Ib { requester, .. } => requester,
            _ => RequesterCounters::default(),
        }
    }

    /// The RDMAP engine's counters (zero on InfiniBand).
    pub fn iwarp(&self) -> softrdma_iwarp::rdmap::StreamCounters {
        match self.detail {
            TransportCounters::Iwarp(c) => c,
            _ => Default::default(),
        }
    }
}
