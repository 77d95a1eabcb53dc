//! Shared receive queues (`ibv_srq`): receive buffers for several QPs of one domain, on
//! either transport. The queue itself is the engines' [`SharedRecvQueue`]: the iWARP
//! driver takes a buffer when a Send starts arriving on one of its QPs, the InfiniBand
//! responder when a message needs one.

use std::sync::Arc;

use softrdma_memory::{KeyTable, PdId};
use softrdma_verbs_types::{CheckedRecv, RecvWr, SharedRecvQueue};

use crate::Error;

/// What [`Pd::create_srq`](crate::Pd::create_srq) needs (`ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receive requests the queue holds.
    pub max_wr: u32,
    /// SGEs per receive request.
    pub max_sge: u32,
}

impl Default for SrqAttr {
    fn default() -> SrqAttr {
        SrqAttr {
            max_wr: 1024,
            max_sge: 16,
        }
    }
}

pub(crate) struct SrqShared {
    pub(crate) pd: PdId,
    pub(crate) attr: SrqAttr,
    keys: Arc<KeyTable>,
    pub(crate) queue: Arc<SharedRecvQueue>,
}

impl SrqShared {
    /// The next buffer, taken the moment a message starts arriving on one of the QPs.
    pub(crate) fn take(&self) -> Option<CheckedRecv> {
        self.queue.take()
    }
}

/// A shared receive queue (`ibv_srq`): receive buffers for several QPs of one domain. A
/// buffer is taken at the moment a message starts arriving on one of them and completes on
/// that QP's receive CQ. Cheap to clone.
#[derive(Clone)]
pub struct Srq {
    pub(crate) shared: Arc<SrqShared>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("attr", &self.shared.attr)
            .field("len", &self.len())
            .finish()
    }
}

impl Srq {
    pub(crate) fn new(pd: PdId, attr: SrqAttr, keys: Arc<KeyTable>) -> Result<Srq, Error> {
        if attr.max_wr == 0 {
            return Err(Error::InvalidArgument("SRQ depth must be at least 1"));
        }
        Ok(Srq {
            shared: Arc::new(SrqShared {
                pd,
                attr,
                keys,
                queue: Arc::new(SharedRecvQueue::new(pd, attr.max_wr, attr.max_sge)),
            }),
        })
    }

    /// The domain the queue belongs to.
    pub fn pd_id(&self) -> PdId {
        self.shared.pd
    }

    /// Posts a receive buffer (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), Error> {
        let s = &self.shared;
        Ok(s.queue.post_recv(wr, &s.keys)?)
    }

    /// Arms the limit (`ibv_modify_srq` with `srq_limit`): when fewer than `limit` buffers
    /// remain, [`Srq::take_limit_event`] reports it once and the limit disarms; 0 disarms.
    pub fn arm_limit(&self, limit: u32) -> Result<(), Error> {
        self.shared
            .queue
            .arm_limit(limit)
            .map_err(|_| Error::InvalidArgument("SRQ limit above the queue's depth"))
    }

    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: `true` once after the armed limit was crossed.
    pub fn take_limit_event(&self) -> bool {
        self.shared.queue.take_limit_event()
    }

    /// Buffers waiting.
    pub fn len(&self) -> usize {
        self.shared.queue.len()
    }

    /// `true` when no buffer waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue's attributes.
    pub fn attr(&self) -> SrqAttr {
        self.shared.attr
    }
}
