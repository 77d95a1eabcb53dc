//! The key table: memory regions and windows, access checks, revocable [`Target`]s.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::buffer::{compare_swap_in, fetch_add_in, range};
use crate::{
    Access, AccessError, Buffer, InvalidateError, Key, KeyState, MemError, MrFlags, MwType, PdId,
    QpId, Result,
};

/// Slots are added in chunks; a new object takes a random free slot (RDMAP-122).
const GROW_CHUNK: u32 = 64;
const INDEX_MASK: u32 = Key::MAX_INDEX;

struct Mr {
    pd: PdId,
    buf: Arc<Buffer>,
    offset: usize,
    len: u64,
    iova: u64,
    access: Access,
    flags: MrFlags,
    /// `Valid`, or `Free` after invalidation.
    valid: bool,
}

struct Binding {
    mr_pos: u32,
    mr_epoch: u64,
    qp: QpId,
    iova: u64,
    len: u64,
    access: Access,
    buf: Arc<Buffer>,
    /// Buffer offset of `iova`.
    base: usize,
}

struct Mw {
    pd: PdId,
    ty: MwType,
    /// `None`: Free.
    binding: Option<Binding>,
}

enum Obj {
    Vacant,
    /// The slot whose index is 0: never handed out (key 0 is reserved, IBA o9-5.2.2 rule 2).
    Reserved,
    Mr(Mr),
    Mw(Mw),
}

struct Slot {
    /// Bumped by every change that revokes access through this slot; never reset.
    epoch: u64,
    consumer: u8,
    obj: Obj,
}

pub(crate) struct Slots {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    limit: u32,
    rng: StdRng,
    /// index = (pos * mul + add) mod 2^24, a random bijection (mul odd).
    mul: u32,
    inv: u32,
    add: u32,
}

impl Slots {
    fn new(mut rng: StdRng, limit: u32) -> Slots {
        // A multiplier near 0 mod 2^24 would put the indices of neighbouring slots next to
        // each other (predictable STags, RDMAP-122): at least 2^16 away from it, either way.
        let mul = loop {
            let m = rng.random::<u32>() | 1;
            let low = m & INDEX_MASK;
            if (1 << 16..=INDEX_MASK - (1 << 16)).contains(&low) {
                break m;
            }
        };
        // Newton iteration for the inverse of an odd number mod 2^32.
        let mut inv = mul;
        for _ in 0..5 {
            inv = inv.wrapping_mul(2u32.wrapping_sub(mul.wrapping_mul(inv)));
        }
        let add = rng.random::<u32>() & INDEX_MASK;
        Slots {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            limit: limit.min(Key::MAX_INDEX + 1),
            rng,
            mul,
            inv,
            add,
        }
    }

    fn index_of(&self, pos: u32) -> u32 {
        pos.wrapping_mul(self.mul).wrapping_add(self.add) & INDEX_MASK
    }

    fn pos_of(&self, index: u32) -> u32 {
        index.wrapping_sub(self.add).wrapping_mul(self.inv) & INDEX_MASK
    }

    fn key_of(&self, pos: u32) -> Key {
        Key::new(self.index_of(pos), self.slots[pos as usize].consumer)
    }

    /// The slot `key` names, if it holds an object with that consumer key.
    fn lookup(&self, key: Key) -> Option<(u32, &Slot)> {
        let pos = self.pos_of(key.index());
        let slot = self.slots.get(pos as usize)?;
        match slot.obj {
            Obj::Mr(_) | Obj::Mw(_) if slot.consumer == key.consumer() => Some((pos, slot)),
            _ => None,
        }
    }

    fn lookup_mut(&mut self, key: Key) -> Option<(u32, &mut Slot)> {
        let (pos, _) = self.lookup(key)?;
        Some((pos, &mut self.slots[pos as usize]))
    }

    /// A consumer key different from `old`, otherwise uniformly random.
    fn next_consumer(&mut self, old: u8) -> u8 {
        old.wrapping_add(self.rng.random_range(1..=255u8))
    }

    fn insert(&mut self, obj: Obj) -> Result<Key> {
        if self.free.is_empty() {
            self.grow()?;
        }
        let i = self.rng.random_range(0..self.free.len());
        let pos = self.free.swap_remove(i);
        let consumer = self.next_consumer(self.slots[pos as usize].consumer);
        let slot = &mut self.slots[pos as usize];
        slot.epoch += 1;
        slot.consumer = consumer;
        slot.obj = obj;
        self.live += 1;
        Ok(self.key_of(pos))
    }

    fn grow(&mut self) -> Result<()> {
        let have = self.slots.len() as u32;
        let n = GROW_CHUNK.min(self.limit.saturating_sub(have));
        for pos in have..have + n {
            let reserved = self.index_of(pos) == 0;
            let consumer = self.rng.random();
            self.slots.push(Slot {
                epoch: 0,
                consumer,
                obj: if reserved { Obj::Reserved } else { Obj::Vacant },
            });
            if !reserved {
                self.free.push(pos);
            }
        }
        if self.free.is_empty() {
            return Err(MemError::TableFull);
        }
        Ok(())
    }

    fn remove(&mut self, pos: u32) {
        let slot = &mut self.slots[pos as usize];
        slot.epoch += 1;
        slot.obj = Obj::Vacant;
        self.free.push(pos);
        self.live -= 1;
    }

    fn epoch(&self, pos: u32) -> u64 {
        self.slots[pos as usize].epoch
    }
}

/// `[to, to + len)` against `[base, base + size)`: wrap first (RDMAP-113), then bounds
/// (RDMAP-111, RDMAP-112, RDMAP-117), in 128-bit arithmetic so nothing overflows. A zero-length
/// access must still start inside `[base, base + size]`.
fn check_range(to: u64, len: u64, base: u64, size: u64) -> std::result::Result<(), AccessError> {
    let end = to as u128 + len as u128;
    if end > 1u128 << 64 {
        return Err(AccessError::Wrap);
    }
    if to < base || end > base as u128 + size as u128 {
        return Err(AccessError::Bounds);
    }
    Ok(())
}

fn check_mr_access(access: Access) -> Result<()> {
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err(MemError::InvalidAccess);
    }
    Ok(())
}

/// What a [`Target`] is good for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// From `check_remote` with these rights.
    Remote(Access),
    /// From `check_local` with these rights (local read is implied).
    Local(Access),
}

impl Mode {
    fn may_read(self) -> bool {
        match self {
            Mode::Remote(a) => a.contains(Access::REMOTE_READ),
            Mode::Local(_) => true,
        }
    }

    fn may_write(self) -> bool {
        match self {
            Mode::Remote(a) => a.contains(Access::REMOTE_WRITE),
            Mode::Local(a) => a.contains(Access::LOCAL_WRITE),
        }
    }

    fn may_atomic(self) -> bool {
        matches!(self, Mode::Remote(a) if a.contains(Access::REMOTE_ATOMIC))
    }
}

/// Identifies the slot generations a [`Target`] was issued under: its key's, and the
/// region's under a window (a region's own target names its slot twice). No `Option`:
/// 24 octets instead of 40, moved with every checked work request.
#[derive(Clone, Copy, Debug)]
struct Grant {
    epoch: u64,
    mr_epoch: u64,
    pos: u32,
    mr_pos: u32,
}

impl Grant {
    /// The grant of the key at `pos` in `epoch`, and of the region `mr` under it (a window).
    fn new(pos: u32, epoch: u64, mr: Option<(u32, u64)>) -> Grant {
        let (mr_pos, mr_epoch) = mr.unwrap_or((pos, epoch));
        Grant {
            epoch,
            mr_epoch,
            pos,
            mr_pos,
        }
    }

    fn holds(&self, t: &Slots) -> bool {
        t.epoch(self.pos) == self.epoch && t.epoch(self.mr_pos) == self.mr_epoch
    }
}

/// A validated range of registered memory, returned by [`KeyTable::check_remote`] and
/// [`KeyTable::check_local`]. Offsets given to its methods are relative to the start of the
/// checked range (`to` / `addr`).
///
/// Every method re-validates the grant under the key table's lock before it touches memory and
/// fails with [`AccessError::Invalidated`] once the key was deregistered, invalidated, rebound
/// or deallocated (RDMAP-120). It also refuses operations the checked rights did not cover
/// ([`AccessError::Rights`]) and offsets outside the range ([`AccessError::Bounds`]).
#[derive(Clone)]
pub struct Target {
    buffer: Arc<Buffer>,
    offset: usize,
    len: usize,
    mode: Mode,
    grant: Grant,
    table: Arc<RwLock<Slots>>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Length of the checked range in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-length range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the checked range's first byte within its [`Buffer`].
    pub fn buffer_offset(&self) -> usize {
        self.offset
    }

    /// `true` while the key this target was checked against is unchanged.
    pub fn is_valid(&self) -> bool {
        self.grant.holds(&self.table.read())
    }

    fn sub(
        &self,
        at: usize,
        len: usize,
    ) -> std::result::Result<std::ops::Range<usize>, AccessError> {
        let r = range(at, len, self.len).map_err(|_| AccessError::Bounds)?;
        Ok(self.offset + r.start..self.offset + r.end)
    }

    pub(crate) fn buffer_arc(&self) -> &Arc<Buffer> {
        &self.buffer
    }

    pub(crate) fn table_arc(&self) -> &Arc<RwLock<Slots>> {
        &self.table
    }

    /// What [`read_with`](Self::read_with) checks, without reading: the right to read, the
    /// range and the grant.
    pub fn check_read(&self, at: usize, len: usize) -> std::result::Result<(), AccessError> {
        self.checked_read(&self.table.read(), at, len).map(|_| ())
    }

    /// The buffer range of `len` bytes at `at` if this target may be read there, the grant
    /// checked against `table` (its table, locked by the caller).
    pub(crate) fn checked_read(
        &self,
        table: &Slots,
        at: usize,
        len: usize,
    ) -> std::result::Result<std::ops::Range<usize>, AccessError> {
        if !self.mode.may_read() {
            return Err(AccessError::Rights);
        }
        let r = self.sub(at, len)?;
        if !self.grant.holds(table) {
            return Err(AccessError::Invalidated);
        }
        Ok(r)
    }

    /// Runs `f` on `len` bytes at `at`, under the buffer's read lock and the table lock
    /// (source of an RDMA Read Response, gather for a Send). `f` must not call the `KeyTable`.
    pub fn read_with<R>(
        &self,
        at: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> std::result::Result<R, AccessError> {
        if !self.mode.may_read() {
            return Err(AccessError::Rights);
        }
        let r = self.sub(at, len)?;
        let mem = self.buffer.read(); // buffer lock first, then the table lock
        let table = self.table.read();
        if !self.grant.holds(&table) {
            return Err(AccessError::Invalidated);
        }
        Ok(f(&mem[r]))
    }

    /// Runs `f` on `len` writable bytes at `at`, under the buffer's write lock, the grant
    /// validated first (placement straight from a socket). `f` must not call the `KeyTable`.
    pub fn write_with<R>(
        &self,
        at: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, AccessError> {
        if !self.mode.may_write() {
            return Err(AccessError::Rights);
        }
        let r = self.sub(at, len)?;
        let mut mem = self.buffer.write();
        if !self.grant.holds(&self.table.read()) {
            return Err(AccessError::Invalidated);
        }
        // Validated: the table goes before `f`, which may be a socket read of a whole
        // FPDU. Holding it would make every registration in the context wait for the
        // socket, and (the lock preferring writers) every other placement behind that,
        // as on transmit (`TxBuf::write_with`). The buffer stays write-locked: nobody sees
        // it half placed, and a region revoked meanwhile is the peer's Write racing its
        // own invalidation, whose octets the verbs leave undefined.
        Ok(f(&mut mem[r]))
    }

    /// Copies `src` into the range at `at` (DDP tagged placement).
    pub fn place(&self, at: usize, src: &[u8]) -> std::result::Result<(), AccessError> {
        self.write_with(at, src.len(), |dst| dst.copy_from_slice(src))
    }

    /// Copies `dst.len()` bytes at `at` out of the range.
    pub fn copy_out(&self, at: usize, dst: &mut [u8]) -> std::result::Result<(), AccessError> {
        self.read_with(at, dst.len(), |src| dst.copy_from_slice(src))
    }

    fn atomic<R>(
        &self,
        at: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, AccessError> {
        if !self.mode.may_atomic() {
            return Err(AccessError::Rights);
        }
        let r = self.sub(at, 8)?;
        if !r.start.is_multiple_of(8) {
            return Err(AccessError::Alignment);
        }
        let mut mem = self.buffer.write();
        let table = self.table.read();
        if !self.grant.holds(&table) {
            return Err(AccessError::Invalidated);
        }
        Ok(f(&mut mem[r]))
    }

    /// Atomic fetch-and-add on the native-order `u64` at `at` (needs `REMOTE_ATOMIC`); returns
    /// the old value. The caller converts from the wire's big-endian operands.
    pub fn fetch_add(&self, at: usize, add: u64) -> std::result::Result<u64, AccessError> {
        self.atomic(at, |w| fetch_add_in(w, add))
    }

    /// Atomic compare-and-swap on the native-order `u64` at `at` (needs `REMOTE_ATOMIC`);
    /// returns the old value.
    pub fn compare_swap(
        &self,
        at: usize,
        compare: u64,
        swap: u64,
    ) -> std::result::Result<u64, AccessError> {
        self.atomic(at, |w| compare_swap_in(w, compare, swap))
    }
}

/// Memory regions and windows of one device/context. `Send + Sync`, internally locked;
/// cloning gives another handle to the same table. Lookup by key index is O(1).
#[derive(Clone)]
pub struct KeyTable {
    inner: Arc<RwLock<Slots>>,
}

impl Default for KeyTable {
    fn default() -> Self {
        KeyTable::new()
    }
}

impl fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyTable")
            .field("live", &self.len())
            .finish()
    }
}

impl KeyTable {
    /// An empty table with keys drawn from OS randomness.
    pub fn new() -> KeyTable {
        Self::build(StdRng::from_os_rng(), u32::MAX)
    }

    /// An empty table whose key values follow from `seed` (reproducible tests only: keys must
    /// be unpredictable in production, RDMAP-122).
    pub fn with_seed(seed: u64) -> KeyTable {
        Self::build(StdRng::seed_from_u64(seed), u32::MAX)
    }

    /// As [`with_seed`](KeyTable::with_seed), holding at most `limit` slots (one of which may
    /// be the reserved index 0).
    pub fn with_seed_and_limit(seed: u64, limit: u32) -> KeyTable {
        Self::build(StdRng::seed_from_u64(seed), limit)
    }

    fn build(rng: StdRng, limit: u32) -> KeyTable {
        KeyTable {
            inner: Arc::new(RwLock::new(Slots::new(rng, limit))),
        }
    }

    /// Number of live regions and windows.
    pub fn len(&self) -> usize {
        self.inner.read().live
    }

    /// `true` if no region or window exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state of `key` (Invalid if it names nothing). A bound window reports Valid until it
    /// is rebound, invalidated or deallocated, even if its region went away meanwhile
    /// ([`check_remote`](KeyTable::check_remote) refuses it with `Invalidated`).
    pub fn state(&self, key: Key) -> KeyState {
        let t = self.inner.read();
        match t.lookup(key).map(|(_, s)| &s.obj) {
            Some(Obj::Mr(mr)) if mr.valid => KeyState::Valid,
            Some(Obj::Mw(mw)) if mw.binding.is_some() => KeyState::Valid,
            Some(_) => KeyState::Free,
            None => KeyState::Invalid,
        }
    }

    /// Registers `buf[offset..offset + len]` at virtual address `iova` (IBA Register Memory
    /// Region; RDMAP-118). Not remotely invalidatable.
    pub fn reg_mr(
        &self,
        pd: PdId,
        buf: Arc<Buffer>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Key> {
        self.reg_mr_with(pd, buf, offset, len, iova, access, MrFlags::empty())
    }

    /// As [`reg_mr`](KeyTable::reg_mr), fast-registered: invalidatable locally and remotely.
    pub fn reg_fast_mr(
        &self,
        pd: PdId,
        buf: Arc<Buffer>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Key> {
        self.reg_mr_with(pd, buf, offset, len, iova, access, MrFlags::FAST_REG)
    }

    /// Registers a region with explicit [`MrFlags`] (`FAST_REG`, `SHARED`).
    #[allow(clippy::too_many_arguments)]
    pub fn reg_mr_with(
        &self,
        pd: PdId,
        buf: Arc<Buffer>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
        flags: MrFlags,
    ) -> Result<Key> {
        let mr = Self::make_mr(pd, buf, offset, len, iova, access, flags)?;
        self.inner.write().insert(Obj::Mr(mr))
    }

    fn make_mr(
        pd: PdId,
        buf: Arc<Buffer>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
        flags: MrFlags,
    ) -> Result<Mr> {
        check_mr_access(access)?;
        range(offset, len, buf.len())?;
        if iova as u128 + len as u128 > 1u128 << 64 {
            return Err(MemError::Wrap);
        }
        Ok(Mr {
            pd,
            buf,
            offset,
            len: len as u64,
            iova,
            access,
            flags,
            valid: true,
        })
    }

    /// Reregisters region `key` (IBA Reregister Memory Region): new buffer range, address,
    /// rights and PD. Returns the region's new key (fresh consumer key); the old key and every
    /// [`Target`] and window obtained through it stop working. The result is a plain region.
    #[allow(clippy::too_many_arguments)]
    pub fn rereg_mr(
        &self,
        key: Key,
        pd: PdId,
        buf: Arc<Buffer>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Key> {
        let mr = Self::make_mr(pd, buf, offset, len, iova, access, MrFlags::empty())?;
        let mut t = self.inner.write();
        let (pos, slot) = t.lookup(key).ok_or(MemError::InvalidKey)?;
        if !matches!(slot.obj, Obj::Mr(_)) {
            return Err(MemError::WrongType);
        }
        let old = slot.consumer;
        let consumer = t.next_consumer(old);
        let slot = &mut t.slots[pos as usize];
        slot.epoch += 1;
        slot.consumer = consumer;
        slot.obj = Obj::Mr(mr);
        Ok(t.key_of(pos))
    }

    /// Deregisters region `key` (RDMAP-118). Windows bound to it become unusable; targets
    /// obtained through it are revoked before this returns (RDMAP-120). The index is reused
    /// only with a different consumer key.
    pub fn dereg_mr(&self, key: Key) -> Result<()> {
        let mut t = self.inner.write();
        let (pos, slot) = t.lookup(key).ok_or(MemError::InvalidKey)?;
        if !matches!(slot.obj, Obj::Mr(_)) {
            return Err(MemError::WrongType);
        }
        t.remove(pos);
        Ok(())
    }

    /// Allocates a memory window in the Free state.
    pub fn alloc_mw(&self, pd: PdId, ty: MwType) -> Result<Key> {
        self.inner.write().insert(Obj::Mw(Mw {
            pd,
            ty,
            binding: None,
        }))
    }

    /// Binds window `mw` to `[iova, iova + len)` of region `mr` with remote rights `access`,
    /// on behalf of `qp` in `pd` (type 2 windows become associated with `qp`). Returns the
    /// window's new key (a fresh consumer key); the previous key stops working.
    ///
    /// Rules (IBA 10.6.7.2): window, region and `pd` agree; the region is Valid and has
    /// `MW_BIND`; `access` holds only remote rights, and remote write or atomic need the
    /// region's `LOCAL_WRITE`; the range lies inside the region; a type 2 window must be Free
    /// (a type 1 window may be rebound).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        mw: Key,
        mr: Key,
        qp: QpId,
        pd: PdId,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Key> {
        self.bind_mw_with(mw, None, mr, qp, pd, iova, len, access)
    }

    /// [`bind_mw`](KeyTable::bind_mw) with the new key the consumer chose (a Bind work
    /// request's `rkey`, IBA 10.6.7.2.2: the window's index with a key octet of the
    /// consumer's), or a fresh one. A new key naming another index is `InvalidKey`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw_with(
        &self,
        mw: Key,
        new_key: Option<Key>,
        mr: Key,
        qp: QpId,
        pd: PdId,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Key> {
        if new_key.is_some_and(|k| k.index() != mw.index()) {
            return Err(MemError::InvalidKey);
        }
        let mut t = self.inner.write();
        let (mr_pos, mr_slot) = t.lookup(mr).ok_or(MemError::InvalidKey)?;
        let Obj::Mr(region) = &mr_slot.obj else {
            return Err(MemError::WrongType);
        };
        let (mw_pos, mw_slot) = t.lookup(mw).ok_or(MemError::InvalidKey)?;
        let Obj::Mw(window) = &mw_slot.obj else {
            return Err(MemError::WrongType);
        };
        if window.pd != pd || region.pd != pd {
            return Err(MemError::WrongPd);
        }
        if window.ty != MwType::Type1 && window.binding.is_some() {
            return Err(MemError::WrongState);
        }
        if !region.valid {
            return Err(MemError::WrongState);
        }
        if !region.access.contains(Access::MW_BIND) {
            return Err(MemError::Rights);
        }
        if !Access::REMOTE.contains(access) {
            return Err(MemError::InvalidAccess);
        }
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !region.access.contains(Access::LOCAL_WRITE)
        {
            return Err(MemError::Rights);
        }
        let end = iova as u128 + len as u128;
        if end > 1u128 << 64 {
            return Err(MemError::Wrap);
        }
        if iova < region.iova || end > region.iova as u128 + region.len as u128 {
            return Err(MemError::OutOfRange);
        }
        let binding = Binding {
            mr_pos,
            mr_epoch: mr_slot.epoch,
            qp,
            iova,
            len,
            access,
            buf: region.buf.clone(),
            base: region.offset + (iova - region.iova) as usize,
        };
        let old = mw_slot.consumer;
        let consumer = match new_key {
            Some(k) => k.consumer(),
            None => t.next_consumer(old),
        };
        let slot = &mut t.slots[mw_pos as usize];
        slot.epoch += 1;
        slot.consumer = consumer;
        if let Obj::Mw(w) = &mut slot.obj {
            w.binding = Some(binding);
        }
        Ok(t.key_of(mw_pos))
    }

    /// The current key of the window whose index `key` names (a bind may have changed its
    /// consumer key since `key` was handed out); `None` if no window lives there.
    pub fn mw_key(&self, key: Key) -> Option<Key> {
        let t = self.inner.read();
        let pos = t.pos_of(key.index());
        match t.slots.get(pos as usize)?.obj {
            Obj::Mw(_) => Some(t.key_of(pos)),
            _ => None,
        }
    }

    /// Deallocates window `key` (any state); access through it is revoked before this returns.
    pub fn dealloc_mw(&self, key: Key) -> Result<()> {
        let mut t = self.inner.write();
        let (pos, slot) = t.lookup(key).ok_or(MemError::InvalidKey)?;
        if !matches!(slot.obj, Obj::Mw(_)) {
            return Err(MemError::WrongType);
        }
        t.remove(pos);
        Ok(())
    }

    /// Local Invalidate: a Valid fast-registered region or type 2 window of `pd` becomes Free;
    /// access through it is revoked before this returns (RDMAP-120).
    pub fn invalidate_local(&self, key: Key, pd: PdId) -> Result<()> {
        let mut t = self.inner.write();
        let (_, slot) = t.lookup_mut(key).ok_or(MemError::InvalidKey)?;
        match &mut slot.obj {
            Obj::Mr(mr) => {
                if !mr.flags.contains(MrFlags::FAST_REG) {
                    return Err(MemError::NotInvalidatable);
                }
                if mr.pd != pd {
                    return Err(MemError::WrongPd);
                }
                if !mr.valid {
                    return Err(MemError::WrongState);
                }
                mr.valid = false;
            }
            Obj::Mw(mw) => {
                if mw.ty == MwType::Type1 {
                    return Err(MemError::NotInvalidatable);
                }
                if mw.pd != pd {
                    return Err(MemError::WrongPd);
                }
                if mw.binding.take().is_none() {
                    return Err(MemError::WrongState);
                }
            }
            Obj::Vacant | Obj::Reserved => unreachable!("lookup returns objects only"),
        }
        slot.epoch += 1;
        Ok(())
    }

    /// Remote invalidation (Send with Invalidate, IBA IETH) of `key` arriving on `qp` in `pd`:
    /// IBA o9-5.2.2 rules 1–9 and RFC 5040 §6 (RDMAP-106, -107, -121).
    ///
    /// 1–2. the key names an object (else `InvalidKey`);
    /// 3. not a plain region, 4. not a shared region (`NotInvalidatable`);
    /// 5. a region's PD is `pd` (`WrongPd`); 6. not a type 1 window (`NotInvalidatable`);
    /// 7. a Valid type 2A window is bound to `qp` (`WrongQp`);
    /// 8. a Valid type 2B window has PD `pd` (`WrongPd`) and is bound to `qp` (`WrongQp`);
    /// 9. a Free type 2 window has PD `pd` (`WrongPd`).
    ///
    /// A key that passes and is already Free stays Free (`Ok`, no state change): callers that
    /// want RFC 5040's stricter "STag valid" (RDMAP-106) check [`state`](KeyTable::state)
    /// first. On success the key is Free and access through it was revoked (RDMAP-120); on
    /// error nothing changed.
    pub fn invalidate_remote(
        &self,
        key: Key,
        pd: PdId,
        qp: QpId,
    ) -> std::result::Result<(), InvalidateError> {
        let mut t = self.inner.write();
        let (_, slot) = t.lookup_mut(key).ok_or(InvalidateError::InvalidKey)?;
        let changed = match &mut slot.obj {
            Obj::Mr(mr) => {
                if !mr.flags.contains(MrFlags::FAST_REG) || mr.flags.contains(MrFlags::SHARED) {
                    return Err(InvalidateError::NotInvalidatable);
                }
                if mr.pd != pd {
                    return Err(InvalidateError::WrongPd);
                }
                std::mem::replace(&mut mr.valid, false)
            }
            Obj::Mw(mw) => {
                match (mw.ty, &mw.binding) {
                    (MwType::Type1, _) => return Err(InvalidateError::NotInvalidatable),
                    (_, None) if mw.pd != pd => return Err(InvalidateError::WrongPd),
                    (_, None) => {}
                    (MwType::Type2A, Some(b)) if b.qp != qp => {
                        return Err(InvalidateError::WrongQp);
                    }
                    (MwType::Type2B, Some(_)) if mw.pd != pd => {
                        return Err(InvalidateError::WrongPd);
                    }
                    (MwType::Type2B, Some(b)) if b.qp != qp => {
                        return Err(InvalidateError::WrongQp);
                    }
                    (_, Some(_)) => {}
                }
                mw.binding.take().is_some()
            }
            Obj::Vacant | Obj::Reserved => unreachable!("lookup returns objects only"),
        };
        if changed {
            slot.epoch += 1;
        }
        Ok(())
    }

    /// THE door for every remote access (RDMA Write / Read Response sink, Read Request source,
    /// atomic target): may `qp` in `pd` access `[to, to + len)` through `key` with the rights
    /// `need` (a subset of [`Access::REMOTE`])?
    ///
    /// Check order (RFC 5040 §7.2; IBA 9.7.5.1.3 responder R_Key checks, IBT-X-03), first failure wins:
    /// key names an object with this consumer key (`InvalidKey`) → Valid, and a window's
    /// region unchanged since the bind (`Invalidated`) → PD (`WrongPd`) → QP of a type 2
    /// window (`NotBoundToQp`) → rights (`Rights`) → `to + len` does not exceed 2^64 (`Wrap`)
    /// → `[to, to + len)` inside the key's range (`Bounds`) → for `REMOTE_ATOMIC`, `to` and the
    /// buffer offset 8-aligned (`Alignment`).
    ///
    /// `len == 0` still validates the key and requires `iova <= to <= iova + size`; a
    /// zero-length RDMA Read Request is not checked at all (the caller skips the call).
    pub fn check_remote(
        &self,
        key: Key,
        pd: PdId,
        qp: QpId,
        need: Access,
        to: u64,
        len: u64,
    ) -> std::result::Result<Target, AccessError> {
        let t = self.inner.read();
        let (pos, slot) = t.lookup(key).ok_or(AccessError::InvalidKey)?;
        let (buf, base, iova, size, rights, obj_pd, bound_qp, mr) = match &slot.obj {
            Obj::Mr(r) => {
                if !r.valid {
                    return Err(AccessError::Invalidated);
                }
                (&r.buf, r.offset, r.iova, r.len, r.access, r.pd, None, None)
            }
            Obj::Mw(w) => {
                let b = w.binding.as_ref().ok_or(AccessError::Invalidated)?;
                if t.epoch(b.mr_pos) != b.mr_epoch {
                    return Err(AccessError::Invalidated);
                }
                let bound_qp = (w.ty != MwType::Type1).then_some(b.qp);
                let mr = Some((b.mr_pos, b.mr_epoch));
                (&b.buf, b.base, b.iova, b.len, b.access, w.pd, bound_qp, mr)
            }
            Obj::Vacant | Obj::Reserved => unreachable!("lookup returns objects only"),
        };
        if obj_pd != pd {
            return Err(AccessError::WrongPd);
        }
        if bound_qp.is_some_and(|b| b != qp) {
            return Err(AccessError::NotBoundToQp);
        }
        if !Access::REMOTE.contains(need) || !(rights & Access::REMOTE).contains(need) {
            return Err(AccessError::Rights);
        }
        check_range(to, len, iova, size)?;
        let offset = base + (to - iova) as usize;
        if need.contains(Access::REMOTE_ATOMIC)
            && (!to.is_multiple_of(8) || !offset.is_multiple_of(8))
        {
            return Err(AccessError::Alignment);
        }
        Ok(Target {
            buffer: buf.clone(),
            offset,
            len: len as usize,
            mode: Mode::Remote(need),
            grant: Grant::new(pos, slot.epoch, mr),
            table: self.inner.clone(),
        })
    }

    /// Local access check (send gather, receive scatter, Read sink) of `[addr, addr + len)`
    /// through L_Key `lkey` of a region in `pd`. `need` is empty (read) or `LOCAL_WRITE`.
    /// Windows are not L_Keys (`InvalidKey`). Same order as
    /// [`check_remote`](KeyTable::check_remote) without the QP step; local read is implied.
    pub fn check_local(
        &self,
        lkey: Key,
        pd: PdId,
        need: Access,
        addr: u64,
        len: u64,
    ) -> std::result::Result<Target, AccessError> {
        let t = self.inner.read();
        let (pos, slot) = t.lookup(lkey).ok_or(AccessError::InvalidKey)?;
        let Obj::Mr(r) = &slot.obj else {
            return Err(AccessError::InvalidKey);
        };
        if !r.valid {
            return Err(AccessError::Invalidated);
        }
        if r.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !Access::LOCAL_WRITE.contains(need) || !r.access.contains(need) {
            return Err(AccessError::Rights);
        }
        check_range(addr, len, r.iova, r.len)?;
        Ok(Target {
            buffer: r.buf.clone(),
            offset: r.offset + (addr - r.iova) as usize,
            len: len as usize,
            mode: Mode::Local(need),
            grant: Grant::new(pos, slot.epoch, None),
            table: self.inner.clone(),
        })
    }
}
