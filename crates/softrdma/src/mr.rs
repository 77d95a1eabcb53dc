//! Memory regions and memory windows (`ibv_mr`, `ibv_mw`).
//!
//! Registered memory is a [`Buffer`] of the memory crate: the network places data under the
//! buffer's write lock, the user reads and writes through its guards
//! ([`Mr::read`], [`Mr::write`]) or the copy helpers. Do not hold a guard while blocking on
//! this QP's progress (a completion wait): placement into that buffer waits for the guard.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma_memory::{
    Access, Buffer, BufferReadGuard, BufferWriteGuard, Key, KeyState, MemError, MrFlags, MwType,
    PdId, QpId,
};
use softrdma_verbs_types::Sge;

use crate::Error;
use crate::device::{Claim, CtxShared, Pd, Resource};
use crate::qp::Qp;

/// How to register a region: the part of the buffer, its virtual address and flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MrAttr {
    /// Octets of the buffer the region covers.
    pub range: Range<usize>,
    /// The region's virtual address (the first octet of `range`): SGEs and remote
    /// accesses address the region from here.
    pub iova: u64,
    /// Rights.
    pub access: Access,
    /// Fast-registered (remotely invalidatable) or shared.
    pub flags: MrFlags,
}

impl MrAttr {
    /// The whole buffer at iova 0, plain registration.
    pub fn new(len: usize, access: Access) -> MrAttr {
        MrAttr {
            range: 0..len,
            iova: 0,
            access,
            flags: MrFlags::empty(),
        }
    }
}

/// A registered memory region (`ibv_mr`). Deregistered on drop; every access through its
/// keys then fails (RDMAP-120).
pub struct Mr {
    ctx: Arc<CtxShared>,
    /// Its place under the device's region and octet limits.
    _claim: Claim,
    pd: PdId,
    key: Key,
    buf: Arc<Buffer>,
    offset: usize,
    len: usize,
    iova: u64,
    access: Access,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("key", &self.key)
            .field("len", &self.len)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("access", &self.access)
            .finish()
    }
}

impl Pd {
    /// Registers all of `buf` at iova 0 (`ibv_reg_mr`).
    pub fn reg_mr(&self, buf: Arc<Buffer>, access: Access) -> Result<Mr, Error> {
        let attr = MrAttr::new(buf.len(), access);
        self.reg_mr_with(buf, attr)
    }

    /// Allocates a zeroed, page-aligned buffer of `len` octets and registers it.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr, Error> {
        self.reg_mr(Buffer::new(len), access)
    }

    /// Registers part of `buf` with an explicit address and flags.
    pub fn reg_mr_with(&self, buf: Arc<Buffer>, attr: MrAttr) -> Result<Mr, Error> {
        let Range { start, end } = attr.range;
        let len = end
            .checked_sub(start)
            .ok_or(Error::InvalidArgument("MR range ends before it starts"))?;
        let claim = self.ctx.claim(Resource::Mr, len as u64)?;
        let key = self.ctx.keys.reg_mr_with(
            self.id,
            buf.clone(),
            start,
            len,
            attr.iova,
            attr.access,
            attr.flags,
        )?;
        Ok(Mr {
            _claim: claim,
            ctx: self.ctx.clone(),
            pd: self.id,
            key,
            buf,
            offset: start,
            len,
            iova: attr.iova,
            access: attr.access,
        })
    }

    /// Allocates a memory window of type `ty` (`ibv_alloc_mw`), unbound.
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw, Error> {
        let key = self.ctx.keys.alloc_mw(self.id, ty)?;
        Ok(Mw {
            ctx: self.ctx.clone(),
            pd: self.id,
            ty,
            key: AtomicU32::new(key.0),
        })
    }
}

impl Mr {
    /// The region's key (STag).
    pub fn key(&self) -> Key {
        self.key
    }

    /// L_Key: names the region in local SGEs.
    pub fn lkey(&self) -> Key {
        self.key
    }

    /// R_Key: the STag a peer uses for RDMA Write / Read to this region.
    pub fn rkey(&self) -> Key {
        self.key
    }

    /// The region's virtual address.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The region's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The region's protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// The key's state (Valid; Free after a fast-registered region was invalidated).
    pub fn state(&self) -> KeyState {
        self.ctx.keys.state(self.key)
    }

    /// The registered buffer.
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.buf
    }

    /// Offset of the region's first octet in [`buffer`](Mr::buffer).
    pub fn buffer_offset(&self) -> usize {
        self.offset
    }

    /// The virtual address of region offset `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.iova + off as u64
    }

    /// An SGE for `len` octets at region offset `off`.
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge::new(self.key, self.addr(off), len)
    }

    /// An SGE covering the whole region (lengths above 2^32 - 1 are cut).
    pub fn sge_all(&self) -> Sge {
        Sge::new(
            self.key,
            self.iova,
            u32::try_from(self.len).unwrap_or(u32::MAX),
        )
    }

    /// Shared access to the whole buffer (index with
    /// [`buffer_offset`](Mr::buffer_offset) + region offset).
    pub fn read(&self) -> BufferReadGuard<'_> {
        self.buf.read()
    }

    /// Exclusive access to the whole buffer; placement waits while it is held.
    pub fn write(&self) -> BufferWriteGuard<'_> {
        self.buf.write()
    }

    /// Copies `dst.len()` octets at region offset `off` out.
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(off, dst.len())?;
        self.buf.copy_out(self.offset + off, dst)
    }

    /// Copies `src` into the region at offset `off`.
    pub fn copy_in(&self, off: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(off, src.len())?;
        self.buf.copy_in(self.offset + off, src)
    }

    /// The region's octets as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let g = self.buf.read();
        g[self.offset..self.offset + self.len].to_vec()
    }

    fn check(&self, off: usize, len: usize) -> Result<(), MemError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::OutOfRange),
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _ = self.ctx.keys.dereg_mr(self.key);
    }
}

/// A memory window (`ibv_mw`): a remote-only view of part of a region, bound and unbound
/// without re-registering. Type 1 windows are bound with a verb and can be rebound; type 2
/// windows are bound for one QP, must be Free to be bound again, and are invalidated
/// locally (a [`SendWr::local_inv`](softrdma_verbs_types::SendWr::local_inv) request) or by the peer (Send with Invalidate). Deallocated on drop.
pub struct Mw {
    ctx: Arc<CtxShared>,
    pd: PdId,
    ty: MwType,
    key: AtomicU32,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("type", &self.ty)
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl Mw {
    /// The window's current R_Key (changes with every bind, also one a Bind work request
    /// made, [`SendWr::bind_mw`](softrdma_verbs_types::SendWr::bind_mw)).
    pub fn rkey(&self) -> Key {
        let k = Key(self.key.load(Ordering::Acquire));
        self.ctx.keys.mw_key(k).unwrap_or(k)
    }

    /// Type 1, 2A or 2B.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// The key's state: Valid while bound, Free when unbound or invalidated.
    pub fn state(&self) -> KeyState {
        self.ctx.keys.state(self.rkey())
    }

    /// Binds the window to `[addr, addr + len)` of `mr` with remote rights `access`
    /// (`ibv_bind_mw`, IBA 10.6.7.2) on behalf of `qp` (a type 2 window becomes usable on
    /// that QP's stream only). Returns the new R_Key, also [`rkey`](Mw::rkey). The bind
    /// takes effect before this returns, so a request posted afterwards may carry the key.
    pub fn bind(
        &self,
        qp: &Qp,
        mr: &Mr,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Key, Error> {
        if qp.pd_id() != self.pd {
            return Err(Error::Mem(MemError::WrongPd));
        }
        let key = self.ctx.keys.bind_mw(
            self.rkey(),
            mr.key,
            QpId(qp.qp_num()),
            self.pd,
            addr,
            len,
            access,
        )?;
        self.key.store(key.0, Ordering::Release);
        Ok(key)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.ctx.keys.dealloc_mw(self.rkey());
    }
}
