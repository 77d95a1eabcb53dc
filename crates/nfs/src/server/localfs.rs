//! A local directory as the export.
//!
//! No path leaves the export: every file is reached from the export's directory with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)` for the directory
//! that holds it, then the `*at` calls on its name without following it — a symbolic link
//! is served as a link (the client resolves it, RFC 1813 §3.3.5) and never followed here,
//! whether it points at `/etc` or at `..`.
//!
//! A file's id is its inode number, so handles survive a server restart: the path of an id
//! is remembered when a lookup, a READDIR or a create shows it, and after a restart found
//! again by walking the export once.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, UtimensatFlags, fstatat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchownat, linkat, symlinkat, unlinkat};
use parking_lot::Mutex;

use super::backend::{
    Attr, Backend, CreateHow, DirEntry, FileId, FileKind, FsStat, Nfs3Error, NfsTime, Result,
    SetAttr, SetTime, Stable,
};

/// Files looked at at most when finding an id again after a restart.
const WALK_LIMIT: usize = 1_000_000;
/// A walk of the export at most this often: a handle with an id nobody has seen (after a
/// restart, or forged) costs one walk, not one per call (every path a walk sees is kept).
const WALK_EVERY: Duration = Duration::from_secs(30);

/// A directory on this machine, exported.
pub struct LocalFs {
    root: OwnedFd,
    root_ino: u64,
    dev: u64,
    /// Where each id was last seen (relative to the export; the root is "").
    paths: Mutex<HashMap<FileId, PathBuf>>,
    /// When the export was last walked for an unknown id.
    walked: Mutex<Option<Instant>>,
    /// Directories listed lately, sorted by cookie, newest first: READDIR resumes at its
    /// cookie in them instead of reading and sorting the whole directory each call.
    listings: Mutex<Vec<Listing>>,
    /// Directories read whole (getdents to the end), ever.
    dir_reads: AtomicU64,
    /// A listing is kept only once the directory has been unchanged this long ([`RACY`]).
    racy: Duration,
}

/// A directory's entries as listed, valid while its change stamp is the same.
struct Listing {
    dir: FileId,
    stamp: DirStamp,
    entries: Arc<Vec<DirEntry>>,
}

/// What changes when a directory's entries do: mtime, ctime, size and inode.
type DirStamp = (i64, i64, i64, i64, i64, u64);

fn dir_stamp(st: &FileStat) -> DirStamp {
    (
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
        st.st_size,
        st.st_ino,
    )
}

/// Directories whose listings are kept.
const LISTINGS: usize = 8;
/// A larger directory is listed afresh each time (its listing is not kept).
const LISTING_MAX_ENTRIES: usize = 1 << 14;
/// A directory changed this recently may change again within the same timestamp tick
/// (coarse-grained clocks): its listing is not kept, as git treats "racy" index entries.
const RACY: Duration = Duration::from_secs(2);

fn err(e: Errno) -> Nfs3Error {
    Nfs3Error::from_io(&io::Error::from(e))
}

fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

fn kind_of(st: &FileStat) -> FileKind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => FileKind::Directory,
        SFlag::S_IFLNK => FileKind::Symlink,
        SFlag::S_IFBLK => FileKind::Block,
        SFlag::S_IFCHR => FileKind::Char,
        SFlag::S_IFSOCK => FileKind::Socket,
        SFlag::S_IFIFO => FileKind::Fifo,
        _ => FileKind::Regular,
    }
}

fn time(sec: i64, nsec: i64) -> NfsTime {
    NfsTime {
        seconds: sec as u32,
        nseconds: nsec as u32,
    }
}

fn attr_of(st: &FileStat) -> Attr {
    let rdev = st.st_rdev;
    Attr {
        kind: kind_of(st),
        mode: st.st_mode & 0o7777,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        used: (st.st_blocks as u64).saturating_mul(512),
        rdev: (
            nix::sys::stat::major(rdev) as u32,
            nix::sys::stat::minor(rdev) as u32,
        ),
        fileid: st.st_ino,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
    }
}

fn timespec(t: SetTime) -> TimeSpec {
    match t {
        SetTime::DontChange => TimeSpec::UTIME_OMIT,
        SetTime::ServerTime => TimeSpec::UTIME_NOW,
        SetTime::Client(t) => TimeSpec::new(i64::from(t.seconds), i64::from(t.nseconds)),
    }
}

/// READDIR cookie of a name: its place in an order that inserts and removals do not
/// disturb (FNV-1a; 1 and 2 are `.` and `..`).
fn cookie_of(name: &[u8]) -> u64 {
    let h = name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    h.max(3)
}

impl LocalFs {
    /// Exports the directory at `path`.
    pub fn new(path: impl AsRef<Path>) -> io::Result<LocalFs> {
        let root: OwnedFd = File::open(path.as_ref())?.into();
        let st = nix::sys::stat::fstat(&root).map_err(io::Error::from)?;
        if kind_of(&st) != FileKind::Directory {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a directory", path.as_ref().display()),
            ));
        }
        let mut paths = HashMap::new();
        paths.insert(st.st_ino, PathBuf::new());
        Ok(LocalFs {
            root,
            root_ino: st.st_ino,
            dev: st.st_dev,
            paths: Mutex::new(paths),
            walked: Mutex::new(None),
            listings: Mutex::new(Vec::new()),
            dir_reads: AtomicU64::new(0),
            racy: RACY,
        })
    }

    /// Directories read whole so far (a READDIR that resumes in a kept listing reads none).
    #[cfg(test)]
    fn dir_reads(&self) -> u64 {
        self.dir_reads.load(Ordering::Relaxed)
    }

    /// `dir`'s entries sorted by cookie, `.` and `..` first: the kept listing while the
    /// directory is unchanged, else read afresh (and kept unless it changed just now or is
    /// very large).
    fn listing(&self, dir: FileId) -> Result<Arc<Vec<DirEntry>>> {
        let rel = self.path(dir)?;
        let st = self.stat_rel(&rel)?;
        let stamp = dir_stamp(&st);
        {
            let mut l = self.listings.lock();
            if let Some(i) = l.iter().position(|x| x.dir == dir && x.stamp == stamp) {
                let x = l.remove(i);
                let entries = x.entries.clone();
                l.insert(0, x);
                return Ok(entries);
            }
        }
        let parent = match rel.parent() {
            Some(p) => self.stat_rel(p)?.st_ino,
            None => self.root_ino,
        };
        let mut all: Vec<DirEntry> = vec![
            DirEntry {
                fileid: dir,
                name: b".".to_vec(),
                cookie: 1,
            },
            DirEntry {
                fileid: parent,
                name: b"..".to_vec(),
                cookie: 2,
            },
        ];
        self.dir_reads.fetch_add(1, Ordering::Relaxed);
        for (name, ino, _) in self.list(&rel)? {
            all.push(DirEntry {
                fileid: ino,
                cookie: cookie_of(&name),
                name,
            });
        }
        {
            let mut paths = self.paths.lock();
            for e in &all[2..] {
                paths
                    .entry(e.fileid)
                    .or_insert_with(|| rel.join(OsStr::from_bytes(&e.name)));
            }
        }
        all.sort_by_key(|e| e.cookie);
        let all = Arc::new(all);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let changed = Duration::new(st.st_mtime.max(st.st_ctime).max(0) as u64, 0);
        if all.len() <= LISTING_MAX_ENTRIES && now.saturating_sub(changed) >= self.racy {
            let mut l = self.listings.lock();
            l.retain(|x| x.dir != dir);
            l.insert(
                0,
                Listing {
                    dir,
                    stamp,
                    entries: all.clone(),
                },
            );
            l.truncate(LISTINGS);
        }
        Ok(all)
    }

    /// Opens `rel` (a directory or file below the root, no links on the way).
    fn open(&self, rel: &Path, flags: OFlag) -> Result<OwnedFd> {
        let p: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        openat2(
            self.root.as_fd(),
            p,
            OpenHow::new()
                .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
                .resolve(beneath()),
        )
        .map_err(|e| match e {
            // A link or a mount point on the way: as if it were not there.
            Errno::ELOOP | Errno::EXDEV => Nfs3Error::Acces,
            e => err(e),
        })
    }

    fn dir_fd(&self, rel: &Path) -> Result<OwnedFd> {
        self.open(rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| {
                if e == Nfs3Error::Inval {
                    Nfs3Error::NotDir
                } else {
                    e
                }
            })
    }

    /// A name of `ino` was removed: its remembered path goes if it was that one (another
    /// link is found again when asked for), so that files created and removed do not grow
    /// the map.
    fn forget(&self, ino: u64, removed: &Path) {
        let mut paths = self.paths.lock();
        if paths.get(&ino).is_some_and(|p| p == removed) {
            paths.remove(&ino);
        }
    }

    /// Ids whose path is remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.paths.lock().len()
    }

    /// The path of `id` (finding it again if it moved or after a restart).
    fn path(&self, id: FileId) -> Result<PathBuf> {
        if let Some(p) = self.paths.lock().get(&id).cloned()
            && self.stat_rel(&p).is_ok_and(|st| st.st_ino == id)
        {
            return Ok(p);
        }
        self.walk(id)
    }

    /// lstat of `rel`.
    fn stat_rel(&self, rel: &Path) -> Result<FileStat> {
        match (rel.parent(), rel.file_name()) {
            (Some(parent), Some(name)) => {
                let d = self.dir_fd(parent)?;
                fstatat(d.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)
            }
            _ => nix::sys::stat::fstat(&self.root).map_err(err),
        }
    }

    /// (directory fd, name) of `id`'s path, where the `*at` calls act on it, and what
    /// lstat says of it there.
    fn at(&self, id: FileId) -> Result<(OwnedFd, OsString, FileStat)> {
        let p = self.path(id)?;
        let (d, name) = match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => (self.dir_fd(parent)?, name.to_owned()),
            // The root itself: reached through "." of itself.
            _ => (self.dir_fd(Path::new(""))?, OsString::from(".")),
        };
        let st = fstatat(d.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)?;
        Ok((d, name, st))
    }

    /// Breadth-first through the export until `id` turns up; every path seen is kept. At
    /// most once per [`WALK_EVERY`]: in between an id not in the map is stale.
    fn walk(&self, id: FileId) -> Result<PathBuf> {
        {
            let mut w = self.walked.lock();
            if w.is_some_and(|t| t.elapsed() < WALK_EVERY) {
                return Err(Nfs3Error::Stale);
            }
            *w = Some(Instant::now());
        }
        let mut queue = vec![PathBuf::new()];
        let mut seen = 0usize;
        while let Some(dir) = queue.pop() {
            let Ok(list) = self.list(&dir) else { continue };
            for (name, ino, is_dir) in list {
                seen += 1;
                let p = dir.join(OsStr::from_bytes(&name));
                self.paths.lock().insert(ino, p.clone());
                if ino == id {
                    return Ok(p);
                }
                if is_dir {
                    queue.push(p);
                }
                if seen > WALK_LIMIT {
                    return Err(Nfs3Error::Stale);
                }
            }
        }
        Err(Nfs3Error::Stale)
    }

    /// The entries of directory `rel` (without `.` and `..`): name, inode, is a directory.
    fn list(&self, rel: &Path) -> Result<Vec<(Vec<u8>, u64, bool)>> {
        let fd = self.open(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        let mut d = nix::dir::Dir::from_fd(fd).map_err(err)?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e.map_err(err)?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let is_dir = e.file_type() == Some(nix::dir::Type::Directory);
            out.push((name.to_vec(), e.ino(), is_dir));
        }
        Ok(out)
    }

    /// lstat of `name` in the directory at `dir`; refuses what lies on another filesystem.
    fn stat_in(&self, dir: &OwnedFd, name: &[u8]) -> Result<FileStat> {
        let st = fstatat(
            dir.as_fd(),
            OsStr::from_bytes(name),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(err)?;
        if st.st_dev != self.dev {
            return Err(Nfs3Error::Acces);
        }
        Ok(st)
    }

    fn remember(&self, dir: &Path, name: &[u8], ino: u64) {
        self.paths
            .lock()
            .insert(ino, dir.join(OsStr::from_bytes(name)));
    }

    /// Opens the regular file `id`.
    fn file(&self, id: FileId, flags: OFlag) -> Result<File> {
        let p = self.path(id)?;
        Ok(File::from(self.open(&p, flags)?))
    }

    /// Applies the parts of `set` other than size to `name` in `dir`.
    fn apply(&self, dir: &OwnedFd, name: &OsStr, set: &SetAttr) -> Result<()> {
        if let Some(m) = set.mode {
            // Links have no mode of their own; everything else was checked not to be one.
            nix::sys::stat::fchmodat(
                dir.as_fd(),
                name,
                Mode::from_bits_truncate(m & 0o7777),
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            )
            .map_err(err)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            match fchownat(
                dir.as_fd(),
                name,
                set.uid.map(Uid::from_raw),
                set.gid.map(Gid::from_raw),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                // Not root: new files stay ours (as with root squashing).
                Ok(()) | Err(Errno::EPERM) => {}
                Err(e) => return Err(err(e)),
            }
        }
        if set.atime != SetTime::DontChange || set.mtime != SetTime::DontChange {
            utimensat(
                dir.as_fd(),
                name,
                &timespec(set.atime),
                &timespec(set.mtime),
                UtimensatFlags::NoFollowSymlink,
            )
            .map_err(err)?;
        }
        Ok(())
    }

    /// A new entry `name` in `dir` made by `make`, owned and moded as `set` says.
    fn make(
        &self,
        dir: FileId,
        name: &[u8],
        set: &SetAttr,
        make: impl FnOnce(&OwnedFd, &OsStr) -> std::result::Result<(), Errno>,
    ) -> Result<FileId> {
        let rel = self.path(dir)?;
        let d = self.dir_fd(&rel)?;
        let n = OsStr::from_bytes(name);
        make(&d, n).map_err(err)?;
        let st = self.stat_in(&d, name)?;
        let owner = SetAttr {
            uid: set.uid,
            gid: set.gid,
            ..SetAttr::default()
        };
        if kind_of(&st) != FileKind::Symlink {
            self.apply(&d, n, &owner)?;
        }
        self.remember(&rel, name, st.st_ino);
        Ok(st.st_ino)
    }
}

impl Backend for LocalFs {
    fn root(&self) -> FileId {
        self.root_ino
    }

    fn getattr(&self, id: FileId) -> Result<Attr> {
        let p = self.path(id)?;
        Ok(attr_of(&self.stat_rel(&p)?))
    }

    fn setattr(&self, id: FileId, set: &SetAttr) -> Result<Attr> {
        let (d, name, st) = self.at(id)?;
        let kind = kind_of(&st);
        if let Some(size) = set.size {
            match kind {
                FileKind::Regular => {
                    self.file(id, OFlag::O_WRONLY)?
                        .set_len(size)
                        .map_err(|e| Nfs3Error::from_io(&e))?;
                }
                FileKind::Directory => return Err(Nfs3Error::IsDir),
                _ => return Err(Nfs3Error::Inval),
            }
        }
        if kind == FileKind::Symlink && set.mode.is_some() {
            return Err(Nfs3Error::Inval);
        }
        self.apply(&d, &name, set)?;
        self.getattr(id)
    }

    fn lookup(&self, dir: FileId, name: &[u8]) -> Result<FileId> {
        let rel = self.path(dir)?;
        let d = self.dir_fd(&rel)?;
        let st = self.stat_in(&d, name)?;
        self.remember(&rel, name, st.st_ino);
        Ok(st.st_ino)
    }

    fn read(&self, id: FileId, offset: u64, count: u32, out: &mut Vec<u8>) -> Result<bool> {
        let f = self.file(id, OFlag::O_RDONLY)?;
        let size = f.metadata().map_err(|e| Nfs3Error::from_io(&e))?.len();
        let want = size.saturating_sub(offset).min(u64::from(count)) as usize;
        let at = out.len();
        out.resize(at + want, 0);
        let mut got = 0;
        while got < want {
            match f.read_at(&mut out[at + got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    out.truncate(at);
                    return Err(Nfs3Error::from_io(&e));
                }
            }
        }
        out.truncate(at + got);
        Ok(offset.saturating_add(got as u64) >= size)
    }

    fn write(&self, id: FileId, offset: u64, data: &[u8], stable: Stable) -> Result<(u32, Stable)> {
        let f = self.file(id, OFlag::O_WRONLY)?;
        f.write_all_at(data, offset)
            .map_err(|e| Nfs3Error::from_io(&e))?;
        let io = |e: io::Error| Nfs3Error::from_io(&e);
        match stable {
            Stable::Unstable => {}
            Stable::DataSync => f.sync_data().map_err(io)?,
            Stable::FileSync => f.sync_all().map_err(io)?,
        }
        Ok((data.len() as u32, stable))
    }

    fn create(&self, dir: FileId, name: &[u8], how: CreateHow) -> Result<FileId> {
        let rel = self.path(dir)?;
        let d = self.dir_fd(&rel)?;
        let n = OsStr::from_bytes(name);
        let (set, excl) = match how {
            CreateHow::Unchecked(s) => (s, false),
            CreateHow::Guarded(s) => (s, true),
            CreateHow::Exclusive(_) => (SetAttr::default(), true),
        };
        let mode = Mode::from_bits_truncate(set.mode.unwrap_or(0o644) & 0o7777);
        let mut flags = OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if excl {
            flags |= OFlag::O_EXCL;
        }
        let opened = nix::fcntl::openat(d.as_fd(), n, flags, mode);
        match (opened, how) {
            (Ok(_), CreateHow::Exclusive(v)) => {
                // RFC 1813 §3.3.8: the verifier kept in the times, until the client's
                // SETATTR sets them.
                let t = |b: &[u8]| {
                    TimeSpec::new(i64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])), 0)
                };
                utimensat(
                    d.as_fd(),
                    n,
                    &t(&v[..4]),
                    &t(&v[4..]),
                    UtimensatFlags::NoFollowSymlink,
                )
                .map_err(err)?;
            }
            (Ok(_), _) => {}
            (Err(Errno::EEXIST), CreateHow::Exclusive(v)) => {
                let st = self.stat_in(&d, name)?;
                let same = st.st_atime as u32 == u32::from_be_bytes([v[0], v[1], v[2], v[3]])
                    && st.st_mtime as u32 == u32::from_be_bytes([v[4], v[5], v[6], v[7]]);
                if !same || kind_of(&st) != FileKind::Regular {
                    return Err(Nfs3Error::Exist);
                }
            }
            (Err(e), _) => return Err(err(e)),
        }
        let st = self.stat_in(&d, name)?;
        if kind_of(&st) != FileKind::Regular {
            return Err(Nfs3Error::Exist);
        }
        self.remember(&rel, name, st.st_ino);
        if !matches!(how, CreateHow::Exclusive(_)) {
            let rest = SetAttr { mode: None, ..set };
            if rest != SetAttr::default() {
                self.setattr(st.st_ino, &rest)?;
            }
        }
        Ok(st.st_ino)
    }

    fn mkdir(&self, dir: FileId, name: &[u8], set: &SetAttr) -> Result<FileId> {
        let mode = Mode::from_bits_truncate(set.mode.unwrap_or(0o755) & 0o7777);
        self.make(dir, name, set, |d, n| mkdirat(d.as_fd(), n, mode))
    }

    fn symlink(&self, dir: FileId, name: &[u8], target: &[u8], set: &SetAttr) -> Result<FileId> {
        let t = OsStr::from_bytes(target);
        self.make(dir, name, set, |d, n| symlinkat(t, d.as_fd(), n))
    }

    fn readlink(&self, id: FileId) -> Result<Vec<u8>> {
        let (d, name, st) = self.at(id)?;
        if kind_of(&st) != FileKind::Symlink {
            return Err(Nfs3Error::Inval);
        }
        Ok(readlinkat(d.as_fd(), name.as_os_str())
            .map_err(err)?
            .into_vec())
    }

    fn remove(&self, dir: FileId, name: &[u8]) -> Result<()> {
        let rel = self.path(dir)?;
        let d = self.dir_fd(&rel)?;
        if kind_of(&self.stat_in(&d, name)?) == FileKind::Directory {
            return Err(Nfs3Error::IsDir);
        }
        let ino = self.stat_in(&d, name)?.st_ino;
        unlinkat(
            d.as_fd(),
            OsStr::from_bytes(name),
            UnlinkatFlags::NoRemoveDir,
        )
        .map_err(err)?;
        self.forget(ino, &rel.join(OsStr::from_bytes(name)));
        Ok(())
    }

    fn rmdir(&self, dir: FileId, name: &[u8]) -> Result<()> {
        let rel = self.path(dir)?;
        let d = self.dir_fd(&rel)?;
        if kind_of(&self.stat_in(&d, name)?) != FileKind::Directory {
            return Err(Nfs3Error::NotDir);
        }
        let ino = self.stat_in(&d, name)?.st_ino;
        unlinkat(d.as_fd(), OsStr::from_bytes(name), UnlinkatFlags::RemoveDir).map_err(
            |e| match e {
                Errno::EEXIST => Nfs3Error::NotEmpty,
                e => err(e),
            },
        )?;
        self.forget(ino, &rel.join(OsStr::from_bytes(name)));
        Ok(())
    }

    fn rename(&self, from: FileId, from_name: &[u8], to: FileId, to_name: &[u8]) -> Result<()> {
        let (fr, tr) = (self.path(from)?, self.path(to)?);
        let (fd, td) = (self.dir_fd(&fr)?, self.dir_fd(&tr)?);
        let moved = self.stat_in(&fd, from_name)?;
        renameat(
            fd.as_fd(),
            OsStr::from_bytes(from_name),
            td.as_fd(),
            OsStr::from_bytes(to_name),
        )
        .map_err(|e| match e {
            Errno::EEXIST => Nfs3Error::NotEmpty,
            e => err(e),
        })?;
        // Every remembered path under the old name now lies under the new one.
        let old = fr.join(OsStr::from_bytes(from_name));
        let new = tr.join(OsStr::from_bytes(to_name));
        let mut paths = self.paths.lock();
        for p in paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(&old) {
                *p = new.join(rest);
            }
        }
        paths.insert(moved.st_ino, new);
        Ok(())
    }

    fn link(&self, id: FileId, dir: FileId, name: &[u8]) -> Result<()> {
        let (sd, sname, st) = self.at(id)?;
        if kind_of(&st) == FileKind::Directory {
            return Err(Nfs3Error::Perm);
        }
        let rel = self.path(dir)?;
        let d = self.dir_fd(&rel)?;
        linkat(
            sd.as_fd(),
            sname.as_os_str(),
            d.as_fd(),
            OsStr::from_bytes(name),
            AtFlags::empty(),
        )
        .map_err(err)
    }

    fn readdir(&self, dir: FileId, cookie: u64, max: usize) -> Result<(Vec<DirEntry>, bool)> {
        let all = self.listing(dir)?;
        let from = all.partition_point(|e| e.cookie <= cookie);
        let rest = &all[from..];
        let eof = rest.len() <= max;
        Ok((rest.iter().take(max).cloned().collect(), eof))
    }

    fn fsstat(&self) -> Result<FsStat> {
        let s = nix::sys::statvfs::fstatvfs(&self.root).map_err(err)?;
        let f = s.fragment_size();
        Ok(FsStat {
            total_bytes: s.blocks().saturating_mul(f),
            free_bytes: s.blocks_free().saturating_mul(f),
            avail_bytes: s.blocks_available().saturating_mul(f),
            total_files: s.files(),
            free_files: s.files_free(),
            avail_files: s.files_available(),
        })
    }

    fn commit(&self, id: FileId) -> Result<()> {
        let f = self.file(id, OFlag::O_RDONLY)?;
        f.sync_all().map_err(|e| Nfs3Error::from_io(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("softrdma-localfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn files_round_trip_and_ids_survive_a_restart() {
        let dir = tmp("restart");
        let fs = LocalFs::new(&dir).unwrap();
        let root = fs.root();
        let d = fs.mkdir(root, b"a", &SetAttr::default()).unwrap();
        let f = fs
            .create(d, b"f", CreateHow::Guarded(SetAttr::default()))
            .unwrap();
        assert_eq!(
            fs.write(f, 3, b"xyz", Stable::FileSync).unwrap(),
            (3, Stable::FileSync)
        );
        let mut out = Vec::new();
        assert!(fs.read(f, 0, 100, &mut out).unwrap());
        assert_eq!(out, b"\0\0\0xyz");
        assert_eq!(
            fs.create(d, b"f", CreateHow::Guarded(SetAttr::default())),
            Err(Nfs3Error::Exist)
        );
        drop(fs);
        // A new server finds the same file under the same id.
        let fs = LocalFs::new(&dir).unwrap();
        assert_eq!(fs.getattr(f).unwrap().size, 6);
        assert_eq!(fs.lookup(fs.root(), b"a").unwrap(), d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn links_are_served_never_followed() {
        let dir = tmp("links");
        let outside = tmp("outside");
        std::fs::write(outside.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("abs")).unwrap();
        std::os::unix::fs::symlink("..", dir.join("up")).unwrap();
        let fs = LocalFs::new(&dir).unwrap();
        let root = fs.root();
        for l in [&b"abs"[..], b"up"] {
            let id = fs.lookup(root, l).unwrap();
            assert_eq!(fs.getattr(id).unwrap().kind, FileKind::Symlink);
            // Nothing through the link: not as a directory, not as a file.
            let refused = |e| matches!(e, Nfs3Error::NotDir | Nfs3Error::Acces);
            assert!(fs.lookup(id, b"secret").is_err_and(refused));
            assert!(fs.readdir(id, 0, 10).is_err_and(refused));
            assert!(fs.read(id, 0, 10, &mut Vec::new()).is_err());
            assert!(
                fs.create(id, b"x", CreateHow::Unchecked(SetAttr::default()))
                    .is_err()
            );
        }
        assert_eq!(
            fs.readlink(fs.lookup(root, b"abs").unwrap()).unwrap(),
            outside.as_os_str().as_bytes()
        );
        assert!(!outside.join("x").exists());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn readdir_resumes_in_a_kept_listing() {
        let dir = tmp("readdir-kept");
        let mut fs = LocalFs::new(&dir).unwrap();
        let root = fs.root();
        let mk = |fs: &LocalFs, name: &str| {
            fs.create(
                root,
                name.as_bytes(),
                CreateHow::Unchecked(SetAttr::default()),
            )
            .unwrap();
        };
        for i in 0..3000 {
            mk(&fs, &format!("f{i}"));
        }
        let page = |fs: &LocalFs| {
            let mut names = Vec::new();
            let mut cookie = 0;
            loop {
                let (batch, eof) = fs.readdir(root, cookie, 100).unwrap();
                names.extend(batch.iter().map(|e| e.name.clone()));
                cookie = batch.last().map_or(cookie, |e| e.cookie);
                if eof {
                    return names;
                }
            }
        };
        // A directory changed just now is listed afresh for each of the 31 pages.
        let before = fs.dir_reads();
        let names = page(&fs);
        assert_eq!(names.len(), 3002);
        assert!(fs.dir_reads() - before >= 31);
        // Unchanged (no racy window in this test): the pages resume in one listing.
        fs.racy = Duration::ZERO;
        let stamp = |secs| SetAttr {
            mtime: SetTime::Client(NfsTime {
                seconds: secs,
                nseconds: 0,
            }),
            ..SetAttr::default()
        };
        fs.setattr(root, &stamp(1_000_000_000)).unwrap();
        let before = fs.dir_reads();
        assert_eq!(page(&fs), names);
        assert_eq!(page(&fs), names);
        assert_eq!(fs.dir_reads() - before, 1);
        // A change (its mtime set apart from the kept one) is seen at once.
        mk(&fs, "new");
        fs.setattr(root, &stamp(1_000_000_001)).unwrap();
        let again = page(&fs);
        assert_eq!(again.len(), 3003);
        assert!(again.contains(&b"new".to_vec()));
        assert_eq!(fs.dir_reads() - before, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn removed_files_are_forgotten() {
        let dir = tmp("forget");
        let fs = LocalFs::new(&dir).unwrap();
        let root = fs.root();
        let before = fs.remembered();
        for round in 0..3 {
            let sub = fs.mkdir(root, b"d", &SetAttr::default()).unwrap();
            for i in 0..200 {
                let name = format!("f{round}-{i}");
                let f = fs
                    .create(
                        sub,
                        name.as_bytes(),
                        CreateHow::Unchecked(SetAttr::default()),
                    )
                    .unwrap();
                assert_eq!(fs.getattr(f).unwrap().kind, FileKind::Regular);
                fs.remove(sub, name.as_bytes()).unwrap();
            }
            fs.rmdir(root, b"d").unwrap();
        }
        assert_eq!(fs.remembered(), before);
        // A file with two names keeps being found through the other.
        let f = fs
            .create(root, b"a", CreateHow::Unchecked(SetAttr::default()))
            .unwrap();
        fs.link(f, root, b"b").unwrap();
        fs.remove(root, b"a").unwrap();
        assert_eq!(fs.getattr(f).unwrap().nlink, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn readdir_cookies_and_namespace_changes() {
        let dir = tmp("readdir");
        let fs = LocalFs::new(&dir).unwrap();
        let root = fs.root();
        for i in 0..50 {
            fs.create(
                root,
                format!("f{i}").as_bytes(),
                CreateHow::Unchecked(SetAttr::default()),
            )
            .unwrap();
        }
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let (batch, eof) = fs.readdir(root, cookie, 7).unwrap();
            for e in &batch {
                names.push(String::from_utf8(e.name.clone()).unwrap());
                cookie = e.cookie;
            }
            if eof {
                break;
            }
        }
        assert_eq!(names.len(), 52);
        let sub = fs.mkdir(root, b"sub", &SetAttr::default()).unwrap();
        let f = fs.lookup(root, b"f1").unwrap();
        fs.rename(root, b"f1", sub, b"g").unwrap();
        assert_eq!(fs.lookup(sub, b"g").unwrap(), f);
        assert_eq!(fs.getattr(f).unwrap().kind, FileKind::Regular);
        assert_eq!(fs.remove(root, b"sub"), Err(Nfs3Error::IsDir));
        assert_eq!(fs.rmdir(root, b"sub"), Err(Nfs3Error::NotEmpty));
        fs.link(f, root, b"again").unwrap();
        assert_eq!(fs.getattr(f).unwrap().nlink, 2);
        fs.remove(sub, b"g").unwrap();
        fs.rmdir(root, b"sub").unwrap();
        assert_eq!(fs.getattr(sub), Err(Nfs3Error::Stale));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
