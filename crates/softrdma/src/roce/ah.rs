//! Address handles (`ibv_create_ah`): a UD destination by id, freed with its last clone.

use std::net::SocketAddr;
use std::sync::Arc;

use super::*;

/// An address handle (`ibv_ah`) for UD sends: put [`Ah::id`] in `UdDest::ah`.
///
/// Clones share the handle; dropping the last one destroys it (`ibv_destroy_ah`) and its id
/// goes to the next handle created on the context, so, as in verbs, no send request still
/// queued may name it.
#[derive(Clone)]
pub struct Ah {
    pub(super) slot: Arc<AhSlot>,
}

pub(super) struct AhSlot {
    pub(super) id: u32,
    pub(super) addr: SocketAddr,
    pub(super) driver: Arc<RoceShared>,
}

impl Drop for AhSlot {
    fn drop(&mut self) {
        self.driver.endpoint.write().destroy_ah(self.id);
    }
}

impl Ah {
    /// The handle's index (`UdDest::ah`).
    pub fn id(&self) -> u32 {
        self.slot.id
    }

    /// Where it points.
    pub fn addr(&self) -> SocketAddr {
        self.slot.addr
    }
}

impl PartialEq for Ah {
    /// The same handle (ids are unique among a context's live handles).
    fn eq(&self, other: &Ah) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }
}

impl Eq for Ah {}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah")
            .field("id", &self.slot.id)
            .field("addr", &self.slot.addr)
            .finish()
    }
}
