//! An in-memory filesystem: the [`Backend`] the server's tests export.
//!
//! One mutex guards a map from file id to node, so every operation is atomic with respect to
//! every other (RFC 1813 asks no more, and tests get deterministic results). Sizes are bounded
//! by the limits given at construction: nothing a client sends allocates beyond them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::backend::{
    Attr, Backend, CreateHow, DirEntry, FileId, FileKind, FsStat, Nfs3Error, NfsTime, Result,
    SetAttr, SetTime, Stable,
};

/// The root's id; ids count up from here and are never reused.
const ROOT: FileId = 1;
/// Allocation unit for `used` (and for a directory's size).
const BLOCK: u64 = 4096;
/// `NFS3_MAXNAMLEN`-style limit on one component (Linux `NAME_MAX`).
const MAX_NAME: usize = 255;
/// Longest symlink target (Linux `PATH_MAX`, which nfsd uses as `NFS3_MAXPATHLEN`).
const MAX_PATH: usize = 4096;
/// Largest file size, also reported by FSINFO's `maxfilesize` on the server side.
const MAX_FILE_SIZE: u64 = 1 << 40;
/// Hard links per file (ext4's limit): past it `MLink`.
const MAX_LINKS: u32 = 65_000;
/// READDIR cookies: 1 is ".", 2 is "..", a child's is this plus its insertion sequence.
const COOKIE_BASE: u64 = 3;
/// Bytes of the "." and ".." entries (as ext2 lays them out).
const DIR_BASE_BYTES: u64 = 24;
const DEFAULT_MAX_BYTES: u64 = 1 << 30;
const DEFAULT_MAX_FILES: u64 = 1_000_000;

fn round_block(n: u64) -> u64 {
    n.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// What one entry costs in a directory (ext2 layout: 8-byte header, name padded to 4), so
/// names, including extra hard links, count against the byte limit.
fn dirent_bytes(name: &[u8]) -> u64 {
    8 + (name.len() as u64).div_ceil(4) * 4
}

/// A directory's size (and `used`) for `bytes` of entries: at least one block.
fn dir_size(bytes: u64) -> u64 {
    round_block(bytes).max(BLOCK)
}

/// Names as the backend contract defines them; the server checks too, this is defence.
fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Nfs3Error::Inval);
    }
    if name.len() > MAX_NAME {
        return Err(Nfs3Error::NameTooLong);
    }
    Ok(())
}

#[derive(Debug)]
struct Dir {
    /// The ".." entry; the root's is the root.
    parent: FileId,
    /// Name → (id, insertion sequence).
    names: BTreeMap<Vec<u8>, (FileId, u64)>,
    /// Insertion sequence → name: READDIR's order, so cookies survive inserts and removes.
    order: BTreeMap<u64, Vec<u8>>,
    /// Next sequence to hand out; every sequence below it was a cookie at some point.
    next_seq: u64,
    /// Sum of `dirent_bytes`, plus "." and "..".
    bytes: u64,
}

impl Dir {
    fn new(parent: FileId) -> Dir {
        Dir {
            parent,
            names: BTreeMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: DIR_BASE_BYTES,
        }
    }

    fn get(&self, name: &[u8]) -> Option<FileId> {
        self.names.get(name).map(|&(id, _)| id)
    }

    /// Whether another entry gets a sequence whose cookie still fits in 64 bits.
    fn check_seq(&self) -> Result<()> {
        match self.next_seq.checked_add(COOKIE_BASE + 1) {
            Some(_) => Ok(()),
            None => Err(Nfs3Error::NoSpc),
        }
    }

    /// Adds `name` (absent: the caller checked, with `check_seq`).
    fn insert(&mut self, name: &[u8], id: FileId) {
        let seq = self.next_seq;
        self.next_seq = seq.saturating_add(1);
        self.bytes = self.bytes.saturating_add(dirent_bytes(name));
        self.names.insert(name.to_vec(), (id, seq));
        self.order.insert(seq, name.to_vec());
    }

    fn remove(&mut self, name: &[u8]) -> Option<FileId> {
        let (id, seq) = self.names.remove(name)?;
        self.order.remove(&seq);
        self.bytes = self.bytes.saturating_sub(dirent_bytes(name));
        Some(id)
    }
}

#[derive(Debug)]
enum Kind {
    Regular(Vec<u8>),
    Directory(Dir),
    Symlink(Vec<u8>),
}

#[derive(Debug)]
struct Node {
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
    /// Regular files and symlinks: their names; directories: 2 + subdirectories.
    nlink: u32,
    atime: NfsTime,
    mtime: NfsTime,
    ctime: NfsTime,
    /// The EXCLUSIVE create verifier (RFC 1813 §3.3.8). Kept apart from the times, where
    /// the RFC suggests it may go, so GETATTR shows real times and the SETATTR that follows
    /// an exclusive create does not lose it.
    verf: Option<[u8; 8]>,
}

impl Node {
    fn new(kind: Kind, mode: u32, nlink: u32, now: NfsTime) -> Node {
        Node {
            kind,
            mode: mode & 0o7777,
            uid: 0,
            gid: 0,
            nlink,
            atime: now,
            mtime: now,
            ctime: now,
            verf: None,
        }
    }

    fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Directory(_))
    }

    fn size(&self) -> u64 {
        match &self.kind {
            Kind::Regular(d) | Kind::Symlink(d) => d.len() as u64,
            Kind::Directory(d) => dir_size(d.bytes),
        }
    }

    fn used(&self) -> u64 {
        match &self.kind {
            Kind::Regular(d) | Kind::Symlink(d) => round_block(d.len() as u64),
            Kind::Directory(d) => dir_size(d.bytes),
        }
    }

    fn attr(&self, id: FileId) -> Attr {
        Attr {
            kind: match self.kind {
                Kind::Regular(_) => FileKind::Regular,
                Kind::Directory(_) => FileKind::Directory,
                Kind::Symlink(_) => FileKind::Symlink,
            },
            mode: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: self.size(),
            used: self.used(),
            rdev: (0, 0),
            fileid: id,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }

    /// The owner and times of a `sattr3` (a new node's; mode is the caller's).
    fn apply_owner_times(&mut self, set: &SetAttr, now: NfsTime) {
        if let Some(uid) = set.uid {
            self.uid = uid;
        }
        if let Some(gid) = set.gid {
            self.gid = gid;
        }
        apply_time(&mut self.atime, set.atime, now);
        apply_time(&mut self.mtime, set.mtime, now);
    }
}

fn apply_time(t: &mut NfsTime, set: SetTime, now: NfsTime) {
    match set {
        SetTime::DontChange => {}
        SetTime::ServerTime => *t = now,
        SetTime::Client(c) => *t = c,
    }
}

/// Resizes file data, failing (before any change) if memory cannot be had.
fn resize_data(data: &mut Vec<u8>, len: usize) -> Result<()> {
    if len > data.len() {
        data.try_reserve_exact(len - data.len())
            .map_err(|_| Nfs3Error::NoSpc)?;
        data.resize(len, 0);
    } else {
        data.truncate(len);
        // Give memory back after a big truncation, as the limit counts sizes, not capacity.
        if data.capacity() / 2 > len.saturating_add(BLOCK as usize) {
            data.shrink_to_fit();
        }
    }
    Ok(())
}

struct Inner {
    nodes: HashMap<FileId, Node>,
    next_id: FileId,
    /// Sum of every node's `used`.
    used_bytes: u64,
    max_bytes: u64,
    max_files: u64,
}

impl Inner {
    fn node(&self, id: FileId) -> Result<&Node> {
        self.nodes.get(&id).ok_or(Nfs3Error::Stale)
    }

    fn dir(&self, id: FileId) -> Result<&Dir> {
        match &self.node(id)?.kind {
            Kind::Directory(d) => Ok(d),
            _ => Err(Nfs3Error::NotDir),
        }
    }

    /// Changes a node, keeping `used_bytes` in step with its `used`.
    fn update<R>(&mut self, id: FileId, f: impl FnOnce(&mut Node) -> R) -> Result<R> {
        let node = self.nodes.get_mut(&id).ok_or(Nfs3Error::Stale)?;
        let before = node.used();
        let r = f(node);
        let after = node.used();
        self.used_bytes = self.used_bytes.saturating_sub(before).saturating_add(after);
        Ok(r)
    }

    /// Applies `f` to directory `id`'s entries.
    fn update_dir<R>(&mut self, id: FileId, f: impl FnOnce(&mut Dir) -> R) -> Result<R> {
        self.update(id, |n| match &mut n.kind {
            Kind::Directory(d) => Ok(f(d)),
            _ => Err(Nfs3Error::NotDir),
        })?
    }

    fn touch(&mut self, id: FileId, now: NfsTime) -> Result<()> {
        self.update(id, |n| {
            n.mtime = now;
            n.ctime = now;
        })
    }

    fn ensure_space(&self, extra: u64) -> Result<()> {
        match self.used_bytes.checked_add(extra) {
            Some(total) if total <= self.max_bytes => Ok(()),
            _ => Err(Nfs3Error::NoSpc),
        }
    }

    /// What adding `name` to `dir` grows the directory by.
    fn dir_growth(dir: &Dir, name: &[u8]) -> u64 {
        dir_size(dir.bytes.saturating_add(dirent_bytes(name))) - dir_size(dir.bytes)
    }

    /// Removes a node that has no name left.
    fn drop_node(&mut self, id: FileId) {
        if let Some(n) = self.nodes.remove(&id) {
            self.used_bytes = self.used_bytes.saturating_sub(n.used());
        }
    }

    /// Links a new node as `name` in `dir` (checked: a directory without `name`), with
    /// regular file data of `size` octets. Every check comes before any change.
    fn add_node(
        &mut self,
        dir: FileId,
        name: &[u8],
        mut node: Node,
        size: u64,
        now: NfsTime,
    ) -> Result<FileId> {
        if self.nodes.len() as u64 >= self.max_files {
            return Err(Nfs3Error::NoSpc);
        }
        let parent = self.node(dir)?;
        let d = match &parent.kind {
            Kind::Directory(d) => d,
            _ => return Err(Nfs3Error::NotDir),
        };
        d.check_seq()?;
        let is_dir = node.is_dir();
        if is_dir && parent.nlink.checked_add(1).is_none() {
            return Err(Nfs3Error::MLink);
        }
        if size > MAX_FILE_SIZE {
            return Err(Nfs3Error::FBig);
        }
        let data_used = match node.kind {
            Kind::Regular(_) => round_block(size),
            _ => 0,
        };
        self.ensure_space(
            node.used()
                .saturating_add(data_used)
                .saturating_add(Self::dir_growth(d, name)),
        )?;
        let id = self.next_id;
        let next = id.checked_add(1).ok_or(Nfs3Error::NoSpc)?;
        if let Kind::Regular(data) = &mut node.kind {
            let len = usize::try_from(size).map_err(|_| Nfs3Error::FBig)?;
            resize_data(data, len)?;
        }
        // Nothing fails from here on.
        self.update(dir, |p| {
            if let Kind::Directory(d) = &mut p.kind {
                d.insert(name, id);
            }
            if is_dir {
                p.nlink = p.nlink.saturating_add(1);
            }
            p.mtime = now;
            p.ctime = now;
        })?;
        self.used_bytes = self.used_bytes.saturating_add(node.used());
        self.nodes.insert(id, node);
        self.next_id = next;
        Ok(id)
    }

    /// SETATTR's changes, all checked before any is made.
    fn setattr(&mut self, id: FileId, set: &SetAttr, now: NfsTime) -> Result<()> {
        let node = self.node(id)?;
        let mut new_len = None;
        if let Some(size) = set.size {
            match &node.kind {
                Kind::Directory(_) => return Err(Nfs3Error::IsDir),
                Kind::Symlink(_) => return Err(Nfs3Error::Inval),
                Kind::Regular(data) => {
                    if size > MAX_FILE_SIZE {
                        return Err(Nfs3Error::FBig);
                    }
                    let grow = round_block(size).saturating_sub(round_block(data.len() as u64));
                    self.ensure_space(grow)?;
                    new_len = Some(usize::try_from(size).map_err(|_| Nfs3Error::FBig)?);
                }
            }
        }
        if *set == SetAttr::default() {
            // nfsd changes nothing, not even ctime, for an empty sattr3.
            return Ok(());
        }
        self.update(id, |n| {
            if let (Some(len), Kind::Regular(data)) = (new_len, &mut n.kind) {
                resize_data(data, len)?;
                // truncate(2) sets both, even when the size stays.
                n.mtime = now;
            }
            // nfsd ignores mode changes on symlinks: their mode is always 0777.
            if let Some(mode) = set.mode
                && !matches!(n.kind, Kind::Symlink(_))
            {
                n.mode = mode & 0o7777;
            }
            n.apply_owner_times(set, now);
            n.ctime = now;
            Ok(())
        })?
    }

    /// Whether `ancestor` is `id` or above it (walking ".." pointers to the root).
    fn is_ancestor(&self, ancestor: FileId, mut id: FileId) -> bool {
        // Bounded by the node count, in case the tree were ever inconsistent.
        for _ in 0..=self.nodes.len() {
            if id == ancestor {
                return true;
            }
            match self.dir(id) {
                Ok(d) if d.parent != id => id = d.parent,
                _ => return false,
            }
        }
        false
    }
}

/// An in-memory [`Backend`] with byte and file-count limits.
pub struct MemFs {
    inner: Mutex<Inner>,
}

impl MemFs {
    /// An empty filesystem (a root directory, mode 0755, owned by 0:0) with generous limits:
    /// 1 GiB and a million files.
    pub fn new() -> MemFs {
        MemFs::with_limits(DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES)
    }

    /// An empty filesystem holding at most `max_bytes` (of `used`, the root's block
    /// included) and `max_files` files (the root included); beyond them writes and creates
    /// fail with `NoSpc`.
    pub fn with_limits(max_bytes: u64, max_files: u64) -> MemFs {
        let root = Node::new(Kind::Directory(Dir::new(ROOT)), 0o755, 2, NfsTime::now());
        let used_bytes = root.used();
        MemFs {
            inner: Mutex::new(Inner {
                nodes: HashMap::from([(ROOT, root)]),
                next_id: ROOT + 1,
                used_bytes,
                max_bytes,
                max_files,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No operation panics while holding the lock; if one ever did, carry on regardless.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for MemFs {
    fn default() -> MemFs {
        MemFs::new()
    }
}

impl fmt::Debug for MemFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemFs")
            .field("files", &inner.nodes.len())
            .field("used_bytes", &inner.used_bytes)
            .field("max_bytes", &inner.max_bytes)
            .field("max_files", &inner.max_files)
            .finish()
    }
}

impl Backend for MemFs {
    fn root(&self) -> FileId {
        ROOT
    }

    fn getattr(&self, id: FileId) -> Result<Attr> {
        Ok(self.lock().node(id)?.attr(id))
    }

    fn setattr(&self, id: FileId, set: &SetAttr) -> Result<Attr> {
        let mut inner = self.lock();
        inner.setattr(id, set, NfsTime::now())?;
        Ok(inner.node(id)?.attr(id))
    }

    fn lookup(&self, dir: FileId, name: &[u8]) -> Result<FileId> {
        let inner = self.lock();
        let d = inner.dir(dir)?;
        check_name(name)?;
        d.get(name).ok_or(Nfs3Error::NoEnt)
    }

    fn read(&self, id: FileId, offset: u64, count: u32, out: &mut Vec<u8>) -> Result<bool> {
        let inner = self.lock();
        let data = match &inner.node(id)?.kind {
            Kind::Regular(d) => d,
            Kind::Directory(_) => return Err(Nfs3Error::IsDir),
            Kind::Symlink(_) => return Err(Nfs3Error::Inval),
        };
        let size = data.len() as u64;
        if offset >= size {
            return Ok(true);
        }
        let n = u64::from(count).min(size - offset);
        // Both below `size`, which is a usize.
        let (start, end) = (offset as usize, (offset + n) as usize);
        out.extend_from_slice(data.get(start..end).ok_or(Nfs3Error::ServerFault)?);
        Ok(offset + n >= size)
    }

    fn write(
        &self,
        id: FileId,
        offset: u64,
        data: &[u8],
        _stable: Stable,
    ) -> Result<(u32, Stable)> {
        let mut inner = self.lock();
        let cur = match &inner.node(id)?.kind {
            Kind::Regular(d) => d.len() as u64,
            Kind::Directory(_) => return Err(Nfs3Error::IsDir),
            Kind::Symlink(_) => return Err(Nfs3Error::Inval),
        };
        let len = u32::try_from(data.len()).map_err(|_| Nfs3Error::Inval)?;
        if len == 0 {
            // write(2) of nothing changes nothing, not even at an offset past the end.
            return Ok((0, Stable::FileSync));
        }
        let end = offset
            .checked_add(u64::from(len))
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Nfs3Error::FBig)?;
        inner.ensure_space(round_block(end.max(cur)) - round_block(cur))?;
        let start = usize::try_from(offset).map_err(|_| Nfs3Error::FBig)?;
        let end = usize::try_from(end).map_err(|_| Nfs3Error::FBig)?;
        let now = NfsTime::now();
        inner.update(id, |n| {
            if let Kind::Regular(d) = &mut n.kind {
                if end > d.len() {
                    resize_data(d, end)?;
                }
                d.get_mut(start..end)
                    .ok_or(Nfs3Error::ServerFault)?
                    .copy_from_slice(data);
            }
            n.mtime = now;
            n.ctime = now;
            Ok(())
        })??;
        // Memory is as stable as this filesystem gets: COMMIT has nothing left to do.
        Ok((len, Stable::FileSync))
    }

    fn create(&self, dir: FileId, name: &[u8], how: CreateHow) -> Result<FileId> {
        let mut inner = self.lock();
        let existing = inner.dir(dir)?.get(name);
        check_name(name)?;
        let now = NfsTime::now();
        if let Some(id) = existing {
            let node = inner.node(id)?;
            let regular = matches!(node.kind, Kind::Regular(_));
            // RFC 1813 §3.3.8: UNCHECKED opens an existing file, GUARDED refuses it,
            // EXCLUSIVE succeeds only for the retransmission with the same verifier.
            return match how {
                CreateHow::Unchecked(set) if regular => {
                    inner.setattr(id, &set, now)?;
                    Ok(id)
                }
                CreateHow::Exclusive(verf) if regular && node.verf == Some(verf) => Ok(id),
                _ => Err(Nfs3Error::Exist),
            };
        }
        let (set, verf) = match how {
            CreateHow::Unchecked(set) | CreateHow::Guarded(set) => (set, None),
            CreateHow::Exclusive(verf) => (SetAttr::default(), Some(verf)),
        };
        let mut node = Node::new(Kind::Regular(Vec::new()), set.mode.unwrap_or(0o644), 1, now);
        node.apply_owner_times(&set, now);
        node.verf = verf;
        inner.add_node(dir, name, node, set.size.unwrap_or(0), now)
    }

    fn mkdir(&self, dir: FileId, name: &[u8], set: &SetAttr) -> Result<FileId> {
        let mut inner = self.lock();
        let existing = inner.dir(dir)?.get(name);
        check_name(name)?;
        if existing.is_some() {
            return Err(Nfs3Error::Exist);
        }
        let now = NfsTime::now();
        let mut node = Node::new(
            Kind::Directory(Dir::new(dir)),
            set.mode.unwrap_or(0o755),
            2,
            now,
        );
        // A size means nothing for a directory: ignored, as nfsd does.
        node.apply_owner_times(set, now);
        inner.add_node(dir, name, node, 0, now)
    }

    fn symlink(&self, dir: FileId, name: &[u8], target: &[u8], set: &SetAttr) -> Result<FileId> {
        let mut inner = self.lock();
        let existing = inner.dir(dir)?.get(name);
        check_name(name)?;
        // nfsd3_proc_symlink: an empty target is Inval, a long one NameTooLong.
        if target.is_empty() {
            return Err(Nfs3Error::Inval);
        }
        if target.len() > MAX_PATH {
            return Err(Nfs3Error::NameTooLong);
        }
        if existing.is_some() {
            return Err(Nfs3Error::Exist);
        }
        let now = NfsTime::now();
        let mut node = Node::new(Kind::Symlink(target.to_vec()), 0o777, 1, now);
        node.apply_owner_times(set, now);
        inner.add_node(dir, name, node, 0, now)
    }

    fn readlink(&self, id: FileId) -> Result<Vec<u8>> {
        match &self.lock().node(id)?.kind {
            Kind::Symlink(t) => Ok(t.clone()),
            _ => Err(Nfs3Error::Inval),
        }
    }

    fn remove(&self, dir: FileId, name: &[u8]) -> Result<()> {
        let mut inner = self.lock();
        let existing = inner.dir(dir)?.get(name);
        check_name(name)?;
        let id = existing.ok_or(Nfs3Error::NoEnt)?;
        if inner.node(id)?.is_dir() {
            // What Linux nfsd answers for REMOVE of a directory.
            return Err(Nfs3Error::IsDir);
        }
        let now = NfsTime::now();
        inner.update_dir(dir, |d| d.remove(name))?;
        inner.touch(dir, now)?;
        let nlink = inner.update(id, |n| {
            n.nlink = n.nlink.saturating_sub(1);
            n.ctime = now;
            n.nlink
        })?;
        if nlink == 0 {
            inner.drop_node(id);
        }
        Ok(())
    }

    fn rmdir(&self, dir: FileId, name: &[u8]) -> Result<()> {
        let mut inner = self.lock();
        let existing = inner.dir(dir)?.get(name);
        check_name(name)?;
        let id = existing.ok_or(Nfs3Error::NoEnt)?;
        match &inner.node(id)?.kind {
            Kind::Directory(d) if !d.names.is_empty() => return Err(Nfs3Error::NotEmpty),
            Kind::Directory(_) => {}
            _ => return Err(Nfs3Error::NotDir),
        }
        let now = NfsTime::now();
        inner.update_dir(dir, |d| d.remove(name))?;
        inner.update(dir, |n| {
            n.nlink = n.nlink.saturating_sub(1);
            n.mtime = now;
            n.ctime = now;
        })?;
        inner.drop_node(id);
        Ok(())
    }

    fn rename(&self, from: FileId, from_name: &[u8], to: FileId, to_name: &[u8]) -> Result<()> {
        let mut inner = self.lock();
        let src = inner.dir(from)?.get(from_name);
        let to_dir = inner.dir(to)?;
        let target = to_dir.get(to_name);
        check_name(from_name)?;
        check_name(to_name)?;
        let src = src.ok_or(Nfs3Error::NoEnt)?;
        // POSIX: renaming a file onto itself (same entry, or another link to the same file)
        // does nothing and succeeds.
        if (from == to && from_name == to_name) || target == Some(src) {
            return Ok(());
        }
        let src_is_dir = inner.node(src)?.is_dir();
        if src_is_dir && inner.is_ancestor(src, to) {
            return Err(Nfs3Error::Inval);
        }
        let mut target_is_dir = false;
        if let Some(t) = target {
            match (&inner.node(t)?.kind, src_is_dir) {
                (Kind::Directory(td), true) if !td.names.is_empty() => {
                    return Err(Nfs3Error::NotEmpty);
                }
                (Kind::Directory(_), true) => target_is_dir = true,
                (Kind::Directory(_), false) => return Err(Nfs3Error::IsDir),
                (_, true) => return Err(Nfs3Error::NotDir),
                (_, false) => {}
            }
        }
        to_dir.check_seq()?;
        // A dir moving to another parent adds a link there, unless it replaces a dir.
        if src_is_dir && from != to && !target_is_dir {
            let to_nlink = inner.node(to)?.nlink;
            if to_nlink.checked_add(1).is_none() {
                return Err(Nfs3Error::MLink);
            }
        }
        // Only a new name can grow a directory (a replaced entry had the same name).
        if target.is_none() {
            let from_dir = inner.dir(from)?;
            let old = dirent_bytes(from_name);
            let new = dirent_bytes(to_name);
            let (grow, shrink) = if from == to {
                let after = from_dir.bytes.saturating_sub(old).saturating_add(new);
                (dir_size(after).saturating_sub(dir_size(from_dir.bytes)), 0)
            } else {
                let after = from_dir.bytes.saturating_sub(old);
                (
                    Inner::dir_growth(to_dir, to_name),
                    dir_size(from_dir.bytes) - dir_size(after),
                )
            };
            inner.ensure_space(grow.saturating_sub(shrink))?;
        }

        // Every check is done: the changes below cannot fail.
        let now = NfsTime::now();
        if let Some(t) = target {
            inner.update_dir(to, |d| d.remove(to_name))?;
            if target_is_dir {
                inner.update(to, |n| n.nlink = n.nlink.saturating_sub(1))?;
                inner.drop_node(t);
            } else {
                let nlink = inner.update(t, |n| {
                    n.nlink = n.nlink.saturating_sub(1);
                    n.ctime = now;
                    n.nlink
                })?;
                if nlink == 0 {
                    inner.drop_node(t);
                }
            }
        }
        inner.update_dir(from, |d| d.remove(from_name))?;
        inner.update_dir(to, |d| d.insert(to_name, src))?;
        if src_is_dir && from != to {
            inner.update(from, |n| n.nlink = n.nlink.saturating_sub(1))?;
            inner.update(to, |n| n.nlink = n.nlink.saturating_add(1))?;
            inner.update_dir(src, |d| d.parent = to)?;
        }
        inner.touch(from, now)?;
        inner.touch(to, now)?;
        inner.update(src, |n| n.ctime = now)?;
        Ok(())
    }

    fn link(&self, id: FileId, dir: FileId, name: &[u8]) -> Result<()> {
        let mut inner = self.lock();
        let d = inner.dir(dir)?;
        let node = inner.node(id)?;
        check_name(name)?;
        if node.is_dir() {
            // link(2) of a directory is EPERM on Linux.
            return Err(Nfs3Error::Perm);
        }
        if d.get(name).is_some() {
            return Err(Nfs3Error::Exist);
        }
        if node.nlink >= MAX_LINKS {
            return Err(Nfs3Error::MLink);
        }
        d.check_seq()?;
        inner.ensure_space(Inner::dir_growth(d, name))?;
        let now = NfsTime::now();
        inner.update_dir(dir, |d| d.insert(name, id))?;
        inner.touch(dir, now)?;
        inner.update(id, |n| {
            n.nlink = n.nlink.saturating_add(1);
            n.ctime = now;
        })?;
        Ok(())
    }

    fn readdir(&self, dir: FileId, cookie: u64, max: usize) -> Result<(Vec<DirEntry>, bool)> {
        let inner = self.lock();
        let d = inner.dir(dir)?;
        // Cookies 1 and 2 follow "." and ".."; 3 + s follows the child inserted s-th, which
        // stays meaningful after that child goes (RFC 1813 §3.3.16 wants cookies stable).
        let (skip_dots, first_seq) = match cookie {
            0 => (0, 0),
            1 => (1, 0),
            2 => (2, 0),
            c => {
                let seq = c - COOKIE_BASE;
                if seq >= d.next_seq {
                    return Err(Nfs3Error::BadCookie);
                }
                (2, seq + 1)
            }
        };
        let dots = [(b".".as_slice(), dir, 1), (b"..".as_slice(), d.parent, 2)];
        let dots = dots
            .into_iter()
            .skip(skip_dots)
            .map(|(name, fileid, cookie)| DirEntry {
                fileid,
                name: name.to_vec(),
                cookie,
            });
        let children = d.order.range(first_seq..).filter_map(|(&seq, name)| {
            let &(fileid, _) = d.names.get(name)?;
            Some(DirEntry {
                fileid,
                name: name.clone(),
                cookie: COOKIE_BASE.saturating_add(seq),
            })
        });
        let mut all = dots.chain(children).peekable();
        let entries: Vec<DirEntry> = all.by_ref().take(max).collect();
        let eof = all.peek().is_none();
        Ok((entries, eof))
    }

    fn fsstat(&self) -> Result<FsStat> {
        let inner = self.lock();
        let free_bytes = inner.max_bytes.saturating_sub(inner.used_bytes);
        let free_files = inner.max_files.saturating_sub(inner.nodes.len() as u64);
        Ok(FsStat {
            total_bytes: inner.max_bytes,
            free_bytes,
            avail_bytes: free_bytes,
            total_files: inner.max_files,
            free_files,
            avail_files: free_files,
        })
    }

    fn commit(&self, id: FileId) -> Result<()> {
        // Writes are already FILE_SYNC; only the handle needs checking.
        self.lock().node(id).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: NfsTime = NfsTime {
        seconds: 1,
        nseconds: 0,
    };

    fn guarded() -> CreateHow {
        CreateHow::Guarded(SetAttr::default())
    }

    fn mkfile(fs: &MemFs, dir: FileId, name: &str) -> FileId {
        fs.create(dir, name.as_bytes(), guarded()).unwrap()
    }

    fn mkdir(fs: &MemFs, dir: FileId, name: &str) -> FileId {
        fs.mkdir(dir, name.as_bytes(), &SetAttr::default()).unwrap()
    }

    fn read_all(fs: &MemFs, id: FileId) -> Vec<u8> {
        let mut out = Vec::new();
        assert!(fs.read(id, 0, u32::MAX, &mut out).unwrap());
        out
    }

    fn names(fs: &MemFs, dir: FileId) -> Vec<Vec<u8>> {
        let (entries, eof) = fs.readdir(dir, 0, usize::MAX).unwrap();
        assert!(eof);
        entries.into_iter().map(|e| e.name).collect()
    }

    /// Sets a node's mtime and ctime to `T0` so a later change shows.
    fn age(fs: &MemFs, id: FileId) {
        fs.lock()
            .update(id, |n| {
                n.mtime = T0;
                n.ctime = T0;
                n.atime = T0;
            })
            .unwrap();
    }

    fn assert_touched(fs: &MemFs, id: FileId) {
        let a = fs.getattr(id).unwrap();
        assert_ne!(a.mtime, T0, "mtime of {id}");
        assert_ne!(a.ctime, T0, "ctime of {id}");
    }

    /// Every internal invariant: names point at live nodes, link counts match the tree,
    /// ".." pointers match, sequences agree, and `used_bytes` is the sum of `used`.
    fn check(fs: &MemFs) {
        let inner = fs.lock();
        let mut names_of: HashMap<FileId, u32> = HashMap::new();
        let mut used = 0;
        for (&id, node) in &inner.nodes {
            used += node.used();
            assert!(id < inner.next_id);
            if let Kind::Directory(d) = &node.kind {
                assert_eq!(d.names.len(), d.order.len());
                let mut bytes = DIR_BASE_BYTES;
                let mut subdirs = 0;
                for (name, &(child, seq)) in &d.names {
                    assert_eq!(d.order.get(&seq), Some(name));
                    assert!(seq < d.next_seq);
                    bytes += dirent_bytes(name);
                    let c = inner.nodes.get(&child).expect("entry of a live node");
                    if let Kind::Directory(cd) = &c.kind {
                        subdirs += 1;
                        assert_eq!(cd.parent, id, "parent of {child}");
                    }
                    *names_of.entry(child).or_default() += 1;
                }
                assert_eq!(d.bytes, bytes);
                assert_eq!(node.nlink, 2 + subdirs, "nlink of dir {id}");
            }
        }
        for (&id, node) in &inner.nodes {
            let n = names_of.get(&id).copied().unwrap_or(0);
            if id == ROOT {
                assert_eq!(n, 0);
            } else if node.is_dir() {
                assert_eq!(n, 1, "names of dir {id}");
            } else {
                assert_eq!(node.nlink, n, "nlink of {id}");
            }
        }
        assert_eq!(inner.used_bytes, used);
    }

    #[test]
    fn root_attributes() {
        let fs = MemFs::new();
        assert_eq!(fs.root(), 1);
        let a = fs.getattr(fs.root()).unwrap();
        assert_eq!(a.kind, FileKind::Directory);
        assert_eq!(a.mode, 0o755);
        assert_eq!((a.uid, a.gid, a.nlink), (0, 0, 2));
        assert_eq!((a.size, a.used, a.fileid), (4096, 4096, 1));
        assert_eq!(fs.getattr(0), Err(Nfs3Error::Stale));
        assert_eq!(fs.getattr(2), Err(Nfs3Error::Stale));
        assert_eq!(fs.getattr(u64::MAX), Err(Nfs3Error::Stale));
        assert!(format!("{fs:?}").contains("files: 1"));
        check(&fs);
    }

    #[test]
    fn lookup_and_names() {
        let fs = MemFs::new();
        let root = fs.root();
        let f = mkfile(&fs, root, "f");
        assert_eq!(fs.lookup(root, b"f"), Ok(f));
        assert_eq!(fs.lookup(root, b"g"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.lookup(f, b"x"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.lookup(99, b"x"), Err(Nfs3Error::Stale));
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert_eq!(fs.lookup(root, bad), Err(Nfs3Error::Inval), "{bad:?}");
            assert_eq!(fs.create(root, bad, guarded()), Err(Nfs3Error::Inval));
            assert_eq!(
                fs.mkdir(root, bad, &SetAttr::default()),
                Err(Nfs3Error::Inval)
            );
            assert_eq!(
                fs.symlink(root, bad, b"t", &SetAttr::default()),
                Err(Nfs3Error::Inval)
            );
            assert_eq!(fs.link(f, root, bad), Err(Nfs3Error::Inval));
            assert_eq!(fs.remove(root, bad), Err(Nfs3Error::Inval));
            assert_eq!(fs.rmdir(root, bad), Err(Nfs3Error::Inval));
            assert_eq!(fs.rename(root, b"f", root, bad), Err(Nfs3Error::Inval));
            assert_eq!(fs.rename(root, bad, root, b"g"), Err(Nfs3Error::Inval));
        }
        let long = vec![b'a'; 256];
        assert_eq!(fs.lookup(root, &long), Err(Nfs3Error::NameTooLong));
        assert_eq!(
            fs.create(root, &long, guarded()),
            Err(Nfs3Error::NameTooLong)
        );
        let max = vec![b'a'; 255];
        let id = fs.create(root, &max, guarded()).unwrap();
        assert_eq!(fs.lookup(root, &max), Ok(id));
        check(&fs);
    }

    #[test]
    fn create_modes() {
        let fs = MemFs::new();
        let root = fs.root();
        age(&fs, root);
        let f = mkfile(&fs, root, "f");
        assert_touched(&fs, root);
        let a = fs.getattr(f).unwrap();
        assert_eq!(a.kind, FileKind::Regular);
        assert_eq!((a.mode, a.uid, a.gid, a.nlink), (0o644, 0, 0, 1));
        assert_eq!((a.size, a.used), (0, 0));
        assert_eq!(fs.create(root, b"f", guarded()), Err(Nfs3Error::Exist));

        let set = SetAttr {
            mode: Some(0o100_4600),
            uid: Some(7),
            gid: Some(8),
            size: Some(10),
            atime: SetTime::Client(T0),
            mtime: SetTime::Client(T0),
        };
        let g = fs.create(root, b"g", CreateHow::Unchecked(set)).unwrap();
        let a = fs.getattr(g).unwrap();
        assert_eq!(
            (a.mode, a.uid, a.gid, a.size, a.used),
            (0o4600, 7, 8, 10, 4096)
        );
        assert_eq!((a.atime, a.mtime), (T0, T0));
        assert_eq!(read_all(&fs, g), vec![0; 10]);

        // UNCHECKED on an existing file opens it, applying the attributes.
        fs.write(g, 0, b"0123456789abc", Stable::Unstable).unwrap();
        let trunc = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        assert_eq!(fs.create(root, b"g", CreateHow::Unchecked(trunc)), Ok(g));
        assert_eq!(fs.getattr(g).unwrap().size, 0);
        let same = fs.create(root, b"g", CreateHow::Unchecked(SetAttr::default()));
        assert_eq!(same, Ok(g));

        let d = mkdir(&fs, root, "d");
        let s = fs.symlink(root, b"s", b"g", &SetAttr::default()).unwrap();
        for name in [&b"d"[..], b"s"] {
            let how = CreateHow::Unchecked(SetAttr::default());
            assert_eq!(fs.create(root, name, how), Err(Nfs3Error::Exist));
            assert_eq!(fs.create(root, name, guarded()), Err(Nfs3Error::Exist));
            let how = CreateHow::Exclusive([0; 8]);
            assert_eq!(fs.create(root, name, how), Err(Nfs3Error::Exist));
        }
        assert_eq!(fs.create(g, b"x", guarded()), Err(Nfs3Error::NotDir));
        assert_eq!(fs.create(s, b"x", guarded()), Err(Nfs3Error::NotDir));
        assert_eq!(fs.create(99, b"x", guarded()), Err(Nfs3Error::Stale));
        let big = SetAttr {
            size: Some(MAX_FILE_SIZE + 1),
            ..SetAttr::default()
        };
        assert_eq!(
            fs.create(d, b"big", CreateHow::Guarded(big)),
            Err(Nfs3Error::FBig)
        );
        assert_eq!(fs.lookup(d, b"big"), Err(Nfs3Error::NoEnt));
        check(&fs);
    }

    #[test]
    fn exclusive_create_retransmission() {
        let fs = MemFs::new();
        let root = fs.root();
        let v1 = *b"verifier";
        let v2 = *b"another!";
        let id = fs.create(root, b"x", CreateHow::Exclusive(v1)).unwrap();
        let a = fs.getattr(id).unwrap();
        assert_eq!((a.mode, a.size, a.nlink), (0o644, 0, 1));
        // The retransmission finds the file it made, even after the SETATTR that follows.
        assert_eq!(fs.create(root, b"x", CreateHow::Exclusive(v1)), Ok(id));
        let set = SetAttr {
            mode: Some(0o600),
            mtime: SetTime::ServerTime,
            ..SetAttr::default()
        };
        fs.setattr(id, &set).unwrap();
        assert_eq!(fs.create(root, b"x", CreateHow::Exclusive(v1)), Ok(id));
        assert_eq!(fs.getattr(id).unwrap().mode, 0o600);
        assert_eq!(
            fs.create(root, b"x", CreateHow::Exclusive(v2)),
            Err(Nfs3Error::Exist)
        );
        assert_eq!(fs.create(root, b"x", guarded()), Err(Nfs3Error::Exist));
        // A file not made by EXCLUSIVE never matches a verifier.
        mkfile(&fs, root, "plain");
        assert_eq!(
            fs.create(root, b"plain", CreateHow::Exclusive([0; 8])),
            Err(Nfs3Error::Exist)
        );
        // Same verifier, other name: another file.
        let other = fs.create(root, b"y", CreateHow::Exclusive(v1)).unwrap();
        assert_ne!(other, id);
        check(&fs);
    }

    #[test]
    fn read_write() {
        let fs = MemFs::new();
        let root = fs.root();
        let f = mkfile(&fs, root, "f");
        age(&fs, f);
        assert_eq!(
            fs.write(f, 0, b"hello", Stable::Unstable),
            Ok((5, Stable::FileSync))
        );
        assert_touched(&fs, f);
        let mut out = b"prefix:".to_vec();
        assert_eq!(fs.read(f, 0, 100, &mut out), Ok(true));
        assert_eq!(out, b"prefix:hello");
        let mut out = Vec::new();
        assert_eq!(fs.read(f, 1, 2, &mut out), Ok(false));
        assert_eq!(out, b"el");
        out.clear();
        assert_eq!(fs.read(f, 3, 2, &mut out), Ok(true));
        assert_eq!(out, b"lo");
        out.clear();
        assert_eq!(fs.read(f, 5, 10, &mut out), Ok(true));
        assert_eq!(fs.read(f, u64::MAX, u32::MAX, &mut out), Ok(true));
        assert!(out.is_empty());
        assert_eq!(fs.read(f, 0, 0, &mut out), Ok(false));
        assert!(out.is_empty());

        // A write past the end leaves zeros between.
        fs.write(f, 8, b"xy", Stable::FileSync).unwrap();
        assert_eq!(read_all(&fs, f), b"hello\0\0\0xy");
        fs.write(f, 1, b"EL", Stable::DataSync).unwrap();
        assert_eq!(read_all(&fs, f), b"hELlo\0\0\0xy");
        let a = fs.getattr(f).unwrap();
        assert_eq!((a.size, a.used), (10, 4096));
        fs.write(f, 4096, b"z", Stable::Unstable).unwrap();
        assert_eq!(fs.getattr(f).unwrap().used, 8192);

        // A zero-length write changes nothing, even past the end.
        age(&fs, f);
        assert_eq!(
            fs.write(f, 1 << 30, b"", Stable::Unstable),
            Ok((0, Stable::FileSync))
        );
        let a = fs.getattr(f).unwrap();
        assert_eq!((a.size, a.mtime), (4097, T0));

        assert_eq!(
            fs.write(f, u64::MAX, b"a", Stable::Unstable),
            Err(Nfs3Error::FBig)
        );
        assert_eq!(
            fs.write(f, MAX_FILE_SIZE, b"a", Stable::Unstable),
            Err(Nfs3Error::FBig)
        );
        assert_eq!(
            fs.write(f, MAX_FILE_SIZE - 1, b"ab", Stable::Unstable),
            Err(Nfs3Error::FBig)
        );
        // Within the size limit, but beyond the space.
        assert_eq!(
            fs.write(f, MAX_FILE_SIZE - 1, b"a", Stable::Unstable),
            Err(Nfs3Error::NoSpc)
        );
        assert_eq!(fs.getattr(f).unwrap().size, 4097);

        let d = mkdir(&fs, root, "d");
        let s = fs.symlink(root, b"s", b"f", &SetAttr::default()).unwrap();
        assert_eq!(fs.read(d, 0, 1, &mut out), Err(Nfs3Error::IsDir));
        assert_eq!(
            fs.write(d, 0, b"a", Stable::Unstable),
            Err(Nfs3Error::IsDir)
        );
        assert_eq!(fs.read(s, 0, 1, &mut out), Err(Nfs3Error::Inval));
        assert_eq!(
            fs.write(s, 0, b"a", Stable::Unstable),
            Err(Nfs3Error::Inval)
        );
        assert_eq!(fs.read(99, 0, 1, &mut out), Err(Nfs3Error::Stale));
        assert_eq!(
            fs.write(99, 0, b"a", Stable::Unstable),
            Err(Nfs3Error::Stale)
        );
        check(&fs);
    }

    #[test]
    fn setattr() {
        let fs = MemFs::new();
        let root = fs.root();
        let f = mkfile(&fs, root, "f");
        fs.write(f, 0, b"0123456789", Stable::FileSync).unwrap();

        age(&fs, f);
        let a = fs.setattr(f, &SetAttr::default()).unwrap();
        assert_eq!(
            (a.mtime, a.ctime),
            (T0, T0),
            "an empty sattr3 changes nothing"
        );

        let set = SetAttr {
            mode: Some(0o170_777),
            uid: Some(1000),
            gid: Some(100),
            ..SetAttr::default()
        };
        let a = fs.setattr(f, &set).unwrap();
        assert_eq!((a.mode, a.uid, a.gid), (0o7777 & 0o170_777, 1000, 100));
        assert_eq!(a.mtime, T0);
        assert_ne!(a.ctime, T0);

        age(&fs, f);
        let shrink = SetAttr {
            size: Some(4),
            ..SetAttr::default()
        };
        let a = fs.setattr(f, &shrink).unwrap();
        assert_eq!(a.size, 4);
        assert_touched(&fs, f);
        assert_eq!(read_all(&fs, f), b"0123");
        let grow = SetAttr {
            size: Some(6000),
            ..SetAttr::default()
        };
        let a = fs.setattr(f, &grow).unwrap();
        assert_eq!((a.size, a.used), (6000, 8192));
        let data = read_all(&fs, f);
        assert_eq!(&data[..4], b"0123");
        assert!(data[4..].iter().all(|&b| b == 0));

        let t1 = NfsTime {
            seconds: 12345,
            nseconds: 678,
        };
        let times = SetAttr {
            atime: SetTime::Client(t1),
            mtime: SetTime::Client(T0),
            ..SetAttr::default()
        };
        let a = fs.setattr(f, &times).unwrap();
        assert_eq!((a.atime, a.mtime), (t1, T0));
        let now = SetAttr {
            atime: SetTime::ServerTime,
            mtime: SetTime::ServerTime,
            ..SetAttr::default()
        };
        let a = fs.setattr(f, &now).unwrap();
        assert!(a.atime > t1 && a.mtime > t1);
        // A client mtime wins over the one a size change sets.
        let both = SetAttr {
            size: Some(1),
            mtime: SetTime::Client(T0),
            ..SetAttr::default()
        };
        assert_eq!(fs.setattr(f, &both).unwrap().mtime, T0);

        let big = SetAttr {
            size: Some(MAX_FILE_SIZE + 1),
            mode: Some(0),
            ..SetAttr::default()
        };
        assert_eq!(fs.setattr(f, &big), Err(Nfs3Error::FBig));
        assert_ne!(
            fs.getattr(f).unwrap().mode,
            0,
            "a failed SETATTR changes nothing"
        );
        let huge = SetAttr {
            size: Some(MAX_FILE_SIZE),
            ..SetAttr::default()
        };
        assert_eq!(fs.setattr(f, &huge), Err(Nfs3Error::NoSpc));

        let d = mkdir(&fs, root, "d");
        let s = fs.symlink(root, b"s", b"f", &SetAttr::default()).unwrap();
        assert_eq!(fs.setattr(d, &shrink), Err(Nfs3Error::IsDir));
        assert_eq!(fs.setattr(s, &shrink), Err(Nfs3Error::Inval));
        let a = fs.setattr(d, &set).unwrap();
        assert_eq!((a.mode, a.uid), (0o7777 & 0o170_777, 1000));
        // Symlinks keep 0777, as with nfsd; owner changes still apply.
        let a = fs.setattr(s, &set).unwrap();
        assert_eq!((a.mode, a.uid), (0o777, 1000));
        assert_eq!(fs.setattr(99, &set), Err(Nfs3Error::Stale));
        check(&fs);
    }

    #[test]
    fn mkdir_and_symlink() {
        let fs = MemFs::new();
        let root = fs.root();
        age(&fs, root);
        let d = mkdir(&fs, root, "d");
        assert_touched(&fs, root);
        assert_eq!(fs.getattr(root).unwrap().nlink, 3);
        let a = fs.getattr(d).unwrap();
        assert_eq!(a.kind, FileKind::Directory);
        assert_eq!((a.mode, a.nlink, a.size, a.used), (0o755, 2, 4096, 4096));
        let set = SetAttr {
            mode: Some(0o700),
            uid: Some(5),
            gid: Some(6),
            size: Some(12345),
            ..SetAttr::default()
        };
        let e = fs.mkdir(d, b"e", &set).unwrap();
        let a = fs.getattr(e).unwrap();
        assert_eq!((a.mode, a.uid, a.gid, a.size), (0o700, 5, 6, 4096));
        assert_eq!(fs.getattr(d).unwrap().nlink, 3);
        assert_eq!(fs.getattr(root).unwrap().nlink, 3);
        assert_eq!(
            fs.mkdir(root, b"d", &SetAttr::default()),
            Err(Nfs3Error::Exist)
        );
        let f = mkfile(&fs, root, "f");
        assert_eq!(
            fs.mkdir(root, b"f", &SetAttr::default()),
            Err(Nfs3Error::Exist)
        );
        assert_eq!(
            fs.mkdir(f, b"x", &SetAttr::default()),
            Err(Nfs3Error::NotDir)
        );
        assert_eq!(
            fs.mkdir(99, b"x", &SetAttr::default()),
            Err(Nfs3Error::Stale)
        );

        let s = fs.symlink(d, b"s", b"../f", &set).unwrap();
        let a = fs.getattr(s).unwrap();
        assert_eq!(a.kind, FileKind::Symlink);
        assert_eq!((a.mode, a.uid, a.gid, a.size, a.nlink), (0o777, 5, 6, 4, 1));
        assert_eq!(fs.readlink(s), Ok(b"../f".to_vec()));
        assert_eq!(fs.readlink(f), Err(Nfs3Error::Inval));
        assert_eq!(fs.readlink(d), Err(Nfs3Error::Inval));
        assert_eq!(fs.readlink(99), Err(Nfs3Error::Stale));
        let none = SetAttr::default();
        assert_eq!(fs.symlink(d, b"s", b"x", &none), Err(Nfs3Error::Exist));
        assert_eq!(fs.symlink(d, b"t", b"", &none), Err(Nfs3Error::Inval));
        let long = vec![b'a'; MAX_PATH + 1];
        assert_eq!(
            fs.symlink(d, b"t", &long, &none),
            Err(Nfs3Error::NameTooLong)
        );
        assert_eq!(fs.symlink(f, b"t", b"x", &none), Err(Nfs3Error::NotDir));
        assert_eq!(
            fs.mknod(d, b"n", FileKind::Fifo, &none),
            Err(Nfs3Error::NotSupp)
        );
        check(&fs);
    }

    #[test]
    fn remove_and_stale() {
        let fs = MemFs::new();
        let root = fs.root();
        let f = mkfile(&fs, root, "f");
        fs.write(f, 0, b"data", Stable::Unstable).unwrap();
        let g = mkfile(&fs, root, "g");
        fs.link(g, root, b"g2").unwrap();
        let s = fs.symlink(root, b"s", b"f", &SetAttr::default()).unwrap();
        let d = mkdir(&fs, root, "d");

        age(&fs, root);
        fs.remove(root, b"f").unwrap();
        assert_touched(&fs, root);
        assert_eq!(fs.lookup(root, b"f"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.getattr(f), Err(Nfs3Error::Stale));
        let mut out = Vec::new();
        assert_eq!(fs.read(f, 0, 1, &mut out), Err(Nfs3Error::Stale));
        assert_eq!(
            fs.write(f, 0, b"a", Stable::Unstable),
            Err(Nfs3Error::Stale)
        );
        assert_eq!(fs.commit(f), Err(Nfs3Error::Stale));
        assert_eq!(fs.setattr(f, &SetAttr::default()), Err(Nfs3Error::Stale));
        assert_eq!(fs.link(f, root, b"again"), Err(Nfs3Error::Stale));
        assert_eq!(fs.remove(root, b"f"), Err(Nfs3Error::NoEnt));

        // One of two names: the file lives on.
        age(&fs, g);
        fs.remove(root, b"g").unwrap();
        let a = fs.getattr(g).unwrap();
        assert_eq!(a.nlink, 1);
        assert_ne!(a.ctime, T0);
        assert_eq!(fs.lookup(root, b"g2"), Ok(g));
        fs.remove(root, b"g2").unwrap();
        assert_eq!(fs.getattr(g), Err(Nfs3Error::Stale));

        fs.remove(root, b"s").unwrap();
        assert_eq!(fs.getattr(s), Err(Nfs3Error::Stale));
        assert_eq!(fs.remove(root, b"d"), Err(Nfs3Error::IsDir));
        assert_eq!(fs.lookup(root, b"d"), Ok(d));
        let h = mkfile(&fs, root, "h");
        assert_eq!(fs.remove(h, b"x"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.remove(99, b"x"), Err(Nfs3Error::Stale));

        // Ids are never reused.
        let again = mkfile(&fs, root, "f");
        assert!(again > h && again != f);
        assert_eq!(names(&fs, root), [&b"."[..], b"..", b"d", b"h", b"f"]);
        check(&fs);
    }

    #[test]
    fn rmdir() {
        let fs = MemFs::new();
        let root = fs.root();
        let d = mkdir(&fs, root, "d");
        let e = mkdir(&fs, d, "e");
        mkfile(&fs, d, "f");
        assert_eq!(fs.rmdir(root, b"d"), Err(Nfs3Error::NotEmpty));
        assert_eq!(fs.rmdir(d, b"f"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.rmdir(d, b"."), Err(Nfs3Error::Inval));
        assert_eq!(fs.rmdir(d, b".."), Err(Nfs3Error::Inval));
        assert_eq!(fs.rmdir(d, b"x"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.rmdir(e, b"x"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.getattr(d).unwrap().nlink, 3);
        age(&fs, d);
        fs.rmdir(d, b"e").unwrap();
        assert_touched(&fs, d);
        assert_eq!(fs.getattr(d).unwrap().nlink, 2);
        assert_eq!(fs.getattr(e), Err(Nfs3Error::Stale));
        assert_eq!(fs.readdir(e, 0, 10), Err(Nfs3Error::Stale));
        assert_eq!(fs.create(e, b"x", guarded()), Err(Nfs3Error::Stale));
        fs.remove(d, b"f").unwrap();
        fs.rmdir(root, b"d").unwrap();
        assert_eq!(fs.getattr(root).unwrap().nlink, 2);
        assert_eq!(fs.getattr(d), Err(Nfs3Error::Stale));
        assert_eq!(fs.rmdir(d, b"x"), Err(Nfs3Error::Stale));
        check(&fs);
    }

    #[test]
    fn rename_files() {
        let fs = MemFs::new();
        let root = fs.root();
        let d = mkdir(&fs, root, "d");
        let a = mkfile(&fs, root, "a");
        age(&fs, root);
        age(&fs, d);
        age(&fs, a);
        fs.rename(root, b"a", d, b"b").unwrap();
        assert_touched(&fs, root);
        assert_touched(&fs, d);
        assert_ne!(fs.getattr(a).unwrap().ctime, T0);
        assert_eq!(fs.lookup(root, b"a"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.lookup(d, b"b"), Ok(a));
        assert_eq!(fs.getattr(a).unwrap().nlink, 1);

        // Same name, same directory: nothing happens.
        age(&fs, d);
        fs.rename(d, b"b", d, b"b").unwrap();
        assert_eq!(fs.getattr(d).unwrap().mtime, T0);
        assert_eq!(fs.rename(d, b"zz", d, b"zz"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.rename(d, b"missing", root, b"x"), Err(Nfs3Error::NoEnt));

        // File over file: the target loses a name and, with none left, goes.
        let c = mkfile(&fs, d, "c");
        fs.write(a, 0, b"from a", Stable::Unstable).unwrap();
        fs.rename(d, b"b", d, b"c").unwrap();
        assert_eq!(fs.lookup(d, b"c"), Ok(a));
        assert_eq!(fs.lookup(d, b"b"), Err(Nfs3Error::NoEnt));
        assert_eq!(fs.getattr(c), Err(Nfs3Error::Stale));
        assert_eq!(read_all(&fs, a), b"from a");

        // Over a file with another name: it lives on with one link fewer.
        let t = mkfile(&fs, root, "t");
        fs.link(t, root, b"t2").unwrap();
        fs.rename(d, b"c", root, b"t").unwrap();
        assert_eq!(fs.lookup(root, b"t"), Ok(a));
        assert_eq!(fs.getattr(t).unwrap().nlink, 1);
        assert_eq!(fs.lookup(root, b"t2"), Ok(t));

        // Two names of one file: POSIX says do nothing.
        fs.link(a, root, b"a2").unwrap();
        fs.rename(root, b"t", root, b"a2").unwrap();
        assert_eq!(fs.lookup(root, b"t"), Ok(a));
        assert_eq!(fs.lookup(root, b"a2"), Ok(a));
        assert_eq!(fs.getattr(a).unwrap().nlink, 2);

        // File over directory, symlink over directory.
        let e = mkdir(&fs, root, "e");
        assert_eq!(fs.rename(root, b"t", root, b"e"), Err(Nfs3Error::IsDir));
        fs.symlink(root, b"s", b"t", &SetAttr::default()).unwrap();
        assert_eq!(fs.rename(root, b"s", root, b"e"), Err(Nfs3Error::IsDir));
        assert_eq!(fs.lookup(root, b"e"), Ok(e));
        fs.rename(root, b"s", root, b"t2").unwrap();
        assert_eq!(fs.getattr(t), Err(Nfs3Error::Stale));

        assert_eq!(fs.rename(a, b"x", root, b"y"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.rename(root, b"t", a, b"y"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.rename(99, b"x", root, b"y"), Err(Nfs3Error::Stale));
        assert_eq!(fs.rename(root, b"t", 99, b"y"), Err(Nfs3Error::Stale));
        check(&fs);
    }

    #[test]
    fn rename_directories() {
        let fs = MemFs::new();
        let root = fs.root();
        let a = mkdir(&fs, root, "a");
        let b = mkdir(&fs, root, "b");
        let sub = mkdir(&fs, a, "sub");
        let deep = mkdir(&fs, sub, "deep");
        assert_eq!(fs.getattr(root).unwrap().nlink, 4);

        // Into itself or its own subtree.
        assert_eq!(fs.rename(root, b"a", a, b"x"), Err(Nfs3Error::Inval));
        assert_eq!(fs.rename(root, b"a", sub, b"x"), Err(Nfs3Error::Inval));
        assert_eq!(fs.rename(root, b"a", deep, b"x"), Err(Nfs3Error::Inval));
        assert_eq!(fs.rename(a, b"sub", deep, b"x"), Err(Nfs3Error::Inval));
        // Over an ancestor: not empty.
        assert_eq!(
            fs.rename(sub, b"deep", root, b"a"),
            Err(Nfs3Error::NotEmpty)
        );
        check(&fs);

        // Across directories: both parents' link counts and "..".
        fs.rename(a, b"sub", b, b"moved").unwrap();
        assert_eq!(fs.getattr(a).unwrap().nlink, 2);
        assert_eq!(fs.getattr(b).unwrap().nlink, 3);
        assert_eq!(fs.getattr(root).unwrap().nlink, 4);
        let (entries, _) = fs.readdir(sub, 0, 2).unwrap();
        assert_eq!(entries[1].name, b"..");
        assert_eq!(entries[1].fileid, b);
        check(&fs);

        // Dir over empty dir: the target goes.
        let empty = mkdir(&fs, root, "empty");
        fs.rename(root, b"a", root, b"empty").unwrap();
        assert_eq!(fs.lookup(root, b"empty"), Ok(a));
        assert_eq!(fs.getattr(empty), Err(Nfs3Error::Stale));
        assert_eq!(fs.getattr(root).unwrap().nlink, 4);
        check(&fs);

        // Dir over an empty dir elsewhere.
        let e2 = mkdir(&fs, b, "e2");
        fs.rename(root, b"empty", b, b"e2").unwrap();
        assert_eq!(fs.getattr(e2), Err(Nfs3Error::Stale));
        assert_eq!(fs.getattr(root).unwrap().nlink, 3);
        assert_eq!(fs.getattr(b).unwrap().nlink, 4);
        check(&fs);

        // Dir over non-empty dir, dir over file.
        assert_eq!(fs.rename(b, b"e2", b, b"moved"), Err(Nfs3Error::NotEmpty));
        let f = mkfile(&fs, root, "f");
        assert_eq!(fs.rename(b, b"e2", root, b"f"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.lookup(root, b"f"), Ok(f));

        // Up the tree: into the root.
        fs.rename(sub, b"deep", root, b"deep").unwrap();
        assert_eq!(fs.readdir(deep, 1, 1).unwrap().0[0].fileid, root);
        assert_eq!(fs.getattr(sub).unwrap().nlink, 2);
        assert_eq!(fs.getattr(root).unwrap().nlink, 4);
        // And a rename of a directory within its parent keeps the counts.
        fs.rename(root, b"deep", root, b"deeper").unwrap();
        assert_eq!(fs.getattr(root).unwrap().nlink, 4);
        check(&fs);
    }

    #[test]
    fn link() {
        let fs = MemFs::new();
        let root = fs.root();
        let d = mkdir(&fs, root, "d");
        let f = mkfile(&fs, root, "f");
        age(&fs, f);
        age(&fs, d);
        fs.link(f, d, b"g").unwrap();
        let a = fs.getattr(f).unwrap();
        assert_eq!(a.nlink, 2);
        assert_ne!(a.ctime, T0);
        assert_eq!(a.mtime, T0);
        assert_touched(&fs, d);
        assert_eq!(fs.lookup(d, b"g"), Ok(f));
        fs.write(f, 0, b"shared", Stable::Unstable).unwrap();
        assert_eq!(read_all(&fs, fs.lookup(d, b"g").unwrap()), b"shared");

        assert_eq!(fs.link(f, d, b"g"), Err(Nfs3Error::Exist));
        assert_eq!(fs.link(f, root, b"d"), Err(Nfs3Error::Exist));
        assert_eq!(fs.link(d, root, b"d2"), Err(Nfs3Error::Perm));
        assert_eq!(fs.link(f, f, b"x"), Err(Nfs3Error::NotDir));
        assert_eq!(fs.link(99, d, b"x"), Err(Nfs3Error::Stale));
        assert_eq!(fs.link(f, 99, b"x"), Err(Nfs3Error::Stale));
        let s = fs.symlink(root, b"s", b"f", &SetAttr::default()).unwrap();
        fs.link(s, d, b"s2").unwrap();
        assert_eq!(fs.getattr(s).unwrap().nlink, 2);

        fs.lock().update(f, |n| n.nlink = MAX_LINKS).unwrap();
        assert_eq!(fs.link(f, d, b"too-many"), Err(Nfs3Error::MLink));
        fs.lock().update(f, |n| n.nlink = 2).unwrap();
        check(&fs);
    }

    #[test]
    fn readdir_basics() {
        let fs = MemFs::new();
        let root = fs.root();
        let (entries, eof) = fs.readdir(root, 0, 10).unwrap();
        assert!(eof);
        assert_eq!(
            entries,
            [
                DirEntry {
                    fileid: root,
                    name: b".".to_vec(),
                    cookie: 1
                },
                DirEntry {
                    fileid: root,
                    name: b"..".to_vec(),
                    cookie: 2
                },
            ]
        );
        let d = mkdir(&fs, root, "d");
        let z = mkfile(&fs, d, "z");
        let a = mkfile(&fs, d, "a");
        let (entries, eof) = fs.readdir(d, 0, 10).unwrap();
        assert!(eof);
        let got: Vec<_> = entries
            .iter()
            .map(|e| (e.name.as_slice(), e.fileid))
            .collect();
        // Insertion order, not name order.
        assert_eq!(got, [(&b"."[..], d), (b"..", root), (b"z", z), (b"a", a)]);
        assert!(entries.iter().all(|e| e.cookie != 0));

        assert_eq!(fs.readdir(d, 0, 0), Ok((vec![], false)));
        let (e, eof) = fs.readdir(d, 2, 2).unwrap();
        assert_eq!((e.len(), eof), (2, true));
        let last = entries.last().unwrap().cookie;
        assert_eq!(fs.readdir(d, last, 10), Ok((vec![], true)));
        assert_eq!(fs.readdir(d, 0, 0), Ok((vec![], false)));
        assert_eq!(fs.readdir(d, last + 1, 10), Err(Nfs3Error::BadCookie));
        assert_eq!(fs.readdir(d, u64::MAX, 10), Err(Nfs3Error::BadCookie));
        // An empty directory's last cookie is "..".
        let e = mkdir(&fs, d, "e");
        assert_eq!(fs.readdir(e, 2, 10), Ok((vec![], true)));
        assert_eq!(fs.readdir(e, 3, 10), Err(Nfs3Error::BadCookie));
        assert_eq!(fs.readdir(z, 0, 10), Err(Nfs3Error::NotDir));
        assert_eq!(fs.readdir(99, 0, 10), Err(Nfs3Error::Stale));
    }

    #[test]
    fn readdir_paging() {
        let fs = MemFs::new();
        let root = fs.root();
        let d = mkdir(&fs, root, "d");
        for i in 0..7 {
            mkfile(&fs, d, &format!("f{i}"));
        }
        let (full, _) = fs.readdir(d, 0, usize::MAX).unwrap();
        assert_eq!(full.len(), 9);
        for max in 1..=3 {
            let mut got = Vec::new();
            let mut cookie = 0;
            loop {
                let (page, eof) = fs.readdir(d, cookie, max).unwrap();
                assert!(page.len() <= max);
                assert!(!page.is_empty() || eof);
                got.extend(page.iter().cloned());
                if eof {
                    break;
                }
                cookie = page.last().unwrap().cookie;
            }
            assert_eq!(got, full, "max {max}");
        }
    }

    #[test]
    fn readdir_cookies_survive_changes() {
        let fs = MemFs::new();
        let root = fs.root();
        let d = mkdir(&fs, root, "d");
        for name in ["a", "b", "c", "d", "e"] {
            mkfile(&fs, d, name);
        }
        let (page, eof) = fs.readdir(d, 0, 4).unwrap();
        assert!(!eof);
        let names_of = |v: &[DirEntry]| v.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names_of(&page), [&b"."[..], b"..", b"a", b"b"]);
        let cookie = page[3].cookie;

        // Remove the entry the cookie names and one already seen, insert two, rename one.
        fs.remove(d, b"b").unwrap();
        fs.remove(d, b"a").unwrap();
        mkfile(&fs, d, "new1");
        fs.rename(d, b"c", d, b"c2").unwrap();
        mkfile(&fs, d, "new2");
        let (rest, eof) = fs.readdir(d, cookie, 10).unwrap();
        assert!(eof);
        assert_eq!(names_of(&rest), [&b"d"[..], b"e", b"new1", b"c2", b"new2"]);

        // Page by page while the directory changes under the reader.
        let (p1, _) = fs.readdir(d, 2, 2).unwrap();
        assert_eq!(names_of(&p1), [&b"d"[..], b"e"]);
        fs.remove(d, b"e").unwrap();
        mkfile(&fs, d, "new3");
        let (p2, eof) = fs.readdir(d, p1[1].cookie, 2).unwrap();
        assert!(!eof);
        assert_eq!(names_of(&p2), [&b"new1"[..], b"c2"]);
        fs.remove(d, b"new1").unwrap();
        fs.remove(d, b"c2").unwrap();
        let (p3, eof) = fs.readdir(d, p2[1].cookie, 2).unwrap();
        assert!(eof);
        assert_eq!(names_of(&p3), [&b"new2"[..], b"new3"]);
        assert_eq!(fs.readdir(d, p3[1].cookie, 2), Ok((vec![], true)));
        // A cookie of an entry removed long ago still works.
        let (p, _) = fs.readdir(d, cookie, 10).unwrap();
        assert_eq!(names_of(&p), [&b"d"[..], b"new2", b"new3"]);
        check(&fs);
    }

    #[test]
    fn fsstat_and_commit() {
        let fs = MemFs::with_limits(1 << 20, 100);
        let root = fs.root();
        let s = fs.fsstat().unwrap();
        assert_eq!(
            (s.total_bytes, s.free_bytes, s.avail_bytes),
            (1 << 20, (1 << 20) - 4096, (1 << 20) - 4096)
        );
        assert_eq!((s.total_files, s.free_files, s.avail_files), (100, 99, 99));
        let f = mkfile(&fs, root, "f");
        fs.write(f, 0, &[1; 5000], Stable::Unstable).unwrap();
        let s = fs.fsstat().unwrap();
        assert_eq!((s.free_bytes, s.free_files), ((1 << 20) - 4096 - 8192, 98));
        assert_eq!(fs.commit(f), Ok(()));
        assert_eq!(fs.commit(root), Ok(()));
        fs.remove(root, b"f").unwrap();
        let s = fs.fsstat().unwrap();
        assert_eq!((s.free_bytes, s.free_files), ((1 << 20) - 4096, 99));
        assert_eq!(fs.commit(f), Err(Nfs3Error::Stale));
        let d = MemFs::new().fsstat().unwrap();
        assert_eq!(
            (d.total_bytes, d.total_files),
            (DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES)
        );
    }

    #[test]
    fn limits() {
        // The root's block and three more.
        let fs = MemFs::with_limits(4 * 4096, 4);
        let root = fs.root();
        let f = mkfile(&fs, root, "f");
        fs.write(f, 0, &[7; 8192], Stable::Unstable).unwrap();
        let d = mkdir(&fs, root, "d");
        assert_eq!(fs.fsstat().unwrap().free_bytes, 0);
        assert_eq!(
            fs.write(f, 8192, b"x", Stable::Unstable),
            Err(Nfs3Error::NoSpc)
        );
        assert_eq!(
            fs.write(f, 1 << 30, b"x", Stable::Unstable),
            Err(Nfs3Error::NoSpc)
        );
        // Within allocated blocks, no new space is needed.
        fs.write(f, 8191, b"y", Stable::Unstable).unwrap();
        assert_eq!(fs.getattr(f).unwrap().size, 8192);
        let grow = SetAttr {
            size: Some(8193),
            ..SetAttr::default()
        };
        assert_eq!(fs.setattr(f, &grow), Err(Nfs3Error::NoSpc));
        assert_eq!(fs.getattr(f).unwrap().size, 8192);
        // Space is full: no new directory, but empty files fit, until the file limit.
        assert_eq!(
            fs.mkdir(root, b"d2", &SetAttr::default()),
            Err(Nfs3Error::NoSpc)
        );
        let g = mkfile(&fs, d, "g");
        assert_eq!(fs.create(d, b"h", guarded()), Err(Nfs3Error::NoSpc));
        assert_eq!(
            fs.symlink(d, b"h", b"t", &SetAttr::default()),
            Err(Nfs3Error::NoSpc)
        );
        assert_eq!(fs.lookup(d, b"h"), Err(Nfs3Error::NoEnt));
        let sized = SetAttr {
            size: Some(1),
            ..SetAttr::default()
        };
        fs.remove(d, b"g").unwrap();
        assert_eq!(fs.getattr(g), Err(Nfs3Error::Stale));
        assert_eq!(
            fs.create(d, b"h", CreateHow::Unchecked(sized)),
            Err(Nfs3Error::NoSpc)
        );
        // The file slot g freed is there again.
        let h = mkfile(&fs, d, "h");
        assert!(h > g);
        check(&fs);

        // Hard links cost directory space too: they cannot grow without bound.
        let fs = MemFs::with_limits(3 * 4096, 10);
        let f = mkfile(&fs, fs.root(), "f");
        let d = mkdir(&fs, fs.root(), "d");
        let mut made = 0;
        let err = loop {
            match fs.link(f, d, format!("{made:0>200}").as_bytes()) {
                Ok(()) => made += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err, Nfs3Error::NoSpc);
        // 24 + 39 * 208 octets of entries fill two blocks, all the space there is.
        assert_eq!(made, 39);
        assert_eq!(fs.getattr(d).unwrap().size, 8192);
        assert_eq!(fs.fsstat().unwrap().free_bytes, 0);
        assert_eq!(fs.getattr(f).unwrap().nlink, made + 1);
        // Renames that would grow it are refused too; ones that keep its size are not.
        let long = vec![b'x'; 255];
        assert_eq!(fs.rename(fs.root(), b"f", d, &long), Err(Nfs3Error::NoSpc));
        fs.rename(d, format!("{:0>200}", 0).as_bytes(), d, b"short")
            .unwrap();
        check(&fs);
    }

    #[test]
    fn big_directory_grows() {
        let fs = MemFs::new();
        let root = fs.root();
        let f = mkfile(&fs, root, "f");
        for i in 0..100 {
            fs.link(f, root, format!("{i:0>60}").as_bytes()).unwrap();
        }
        let a = fs.getattr(root).unwrap();
        assert_eq!((a.size, a.used), (8192, 8192));
        for i in 0..100 {
            fs.remove(root, format!("{i:0>60}").as_bytes()).unwrap();
        }
        assert_eq!(fs.getattr(root).unwrap().size, 4096);
        assert_eq!(fs.getattr(f).unwrap().nlink, 1);
        check(&fs);
    }

    #[test]
    fn concurrent_use() {
        let fs = std::sync::Arc::new(MemFs::new());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let root = fs.root();
                    let d = fs
                        .mkdir(root, format!("t{t}").as_bytes(), &SetAttr::default())
                        .unwrap();
                    for i in 0..50 {
                        let name = format!("f{i}");
                        let f = fs.create(d, name.as_bytes(), guarded()).unwrap();
                        fs.write(f, 0, name.as_bytes(), Stable::Unstable).unwrap();
                        if i % 3 == 0 {
                            fs.rename(d, name.as_bytes(), root, format!("{t}-{i}").as_bytes())
                                .unwrap();
                        }
                        if i % 5 == 0 {
                            let _ = fs.readdir(root, 0, 10).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        check(&fs);
        assert_eq!(fs.getattr(fs.root()).unwrap().nlink, 10);
        assert_eq!(names(&fs, fs.root()).len(), 2 + 8 + 8 * 17);
    }
}
