//! What an exported filesystem provides: the NFSv3 operations (RFC 1813 §3.3) on file ids,
//! in plain Rust types. The protocol side (handles, XDR, weak cache consistency, the RFC 8267
//! binding) is the server's; a backend only answers for files.
//!
//! Synchronous on purpose: calls run on the RPC server's thread pool, so a backend needs no
//! async runtime (nfsserve's `NFSFileSystem` is async; an adapter can sit on top of this).

use std::time::{SystemTime, UNIX_EPOCH};

/// A file's identity inside one export: stable for the file's life, and across restarts
/// for backends whose files outlive the process (the handle is built from it).
pub type FileId = u64;

/// `nfsstat3` values other than `NFS3_OK` (RFC 1813 §2.6) a backend may answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(u32)]
pub enum Nfs3Error {
    #[error("not owner")]
    Perm = 1,
    #[error("no such file or directory")]
    NoEnt = 2,
    #[error("I/O error")]
    Io = 5,
    #[error("no such device or address")]
    Nxio = 6,
    #[error("permission denied")]
    Acces = 13,
    #[error("file exists")]
    Exist = 17,
    #[error("cross-device link")]
    Xdev = 18,
    #[error("not a directory")]
    NotDir = 20,
    #[error("is a directory")]
    IsDir = 21,
    #[error("invalid argument")]
    Inval = 22,
    #[error("file too large")]
    FBig = 27,
    #[error("no space left")]
    NoSpc = 28,
    #[error("read-only filesystem")]
    RoFs = 30,
    #[error("too many links")]
    MLink = 31,
    #[error("name too long")]
    NameTooLong = 63,
    #[error("directory not empty")]
    NotEmpty = 66,
    #[error("quota exceeded")]
    DQuot = 69,
    #[error("stale file handle")]
    Stale = 70,
    #[error("illegal file handle")]
    BadHandle = 10001,
    #[error("READDIR cookie is stale")]
    BadCookie = 10003,
    #[error("operation not supported")]
    NotSupp = 10004,
    #[error("buffer or request too small")]
    TooSmall = 10005,
    #[error("server fault")]
    ServerFault = 10006,
    #[error("type not supported by the server")]
    BadType = 10007,
}

impl Nfs3Error {
    /// The `nfsstat3` code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The status an OS error maps to (what Linux's nfsd answers for the same errno).
    pub fn from_io(e: &std::io::Error) -> Nfs3Error {
        use std::io::ErrorKind as K;
        match e.raw_os_error() {
            Some(1) => Nfs3Error::Perm,
            Some(2) => Nfs3Error::NoEnt,
            Some(6) => Nfs3Error::Nxio,
            Some(13) => Nfs3Error::Acces,
            Some(17) => Nfs3Error::Exist,
            Some(18) => Nfs3Error::Xdev,
            Some(20) => Nfs3Error::NotDir,
            Some(21) => Nfs3Error::IsDir,
            Some(22) => Nfs3Error::Inval,
            Some(27) => Nfs3Error::FBig,
            Some(28) => Nfs3Error::NoSpc,
            Some(30) => Nfs3Error::RoFs,
            Some(31) => Nfs3Error::MLink,
            Some(36) => Nfs3Error::NameTooLong,
            Some(39) => Nfs3Error::NotEmpty,
            Some(122) => Nfs3Error::DQuot,
            Some(95) => Nfs3Error::NotSupp,
            Some(116) => Nfs3Error::Stale,
            _ => match e.kind() {
                K::NotFound => Nfs3Error::NoEnt,
                K::PermissionDenied => Nfs3Error::Acces,
                K::AlreadyExists => Nfs3Error::Exist,
                K::InvalidInput => Nfs3Error::Inval,
                _ => Nfs3Error::Io,
            },
        }
    }
}

/// A backend's answer.
pub type Result<T> = std::result::Result<T, Nfs3Error>;

/// `ftype3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Regular = 1,
    Directory = 2,
    Block = 3,
    Char = 4,
    Symlink = 5,
    Socket = 6,
    Fifo = 7,
}

/// `nfstime3`: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct NfsTime {
    pub seconds: u32,
    pub nseconds: u32,
}

impl NfsTime {
    /// Now, by the system clock.
    pub fn now() -> NfsTime {
        NfsTime::from(SystemTime::now())
    }
}

impl From<SystemTime> for NfsTime {
    fn from(t: SystemTime) -> NfsTime {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        NfsTime {
            seconds: d.as_secs() as u32,
            nseconds: d.subsec_nanos(),
        }
    }
}

/// `fattr3` (RFC 1813 §2.6) without `fsid`, which the server fills in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub kind: FileKind,
    /// Permission bits (and set-id, sticky): `mode & 0o7777`.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Octets of storage used.
    pub used: u64,
    /// Device numbers (major, minor) of a device file.
    pub rdev: (u32, u32),
    pub fileid: FileId,
    pub atime: NfsTime,
    pub mtime: NfsTime,
    pub ctime: NfsTime,
}

/// `set_atime` / `set_mtime` (RFC 1813 §2.6 `sattr3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetTime {
    #[default]
    DontChange,
    /// The server's current time.
    ServerTime,
    /// The time the client gives.
    Client(NfsTime),
}

/// `sattr3`: what SETATTR, CREATE, MKDIR, SYMLINK set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate or extend to this size.
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
}

/// `createmode3` (RFC 1813 §3.3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateHow {
    /// Create, or open an existing file (attributes applied either way).
    Unchecked(SetAttr),
    /// Create; `Exist` if the name is taken.
    Guarded(SetAttr),
    /// Create once per verifier: a retransmission with the same verifier finds the file it
    /// made and succeeds; another verifier gets `Exist`.
    Exclusive([u8; 8]),
}

/// `stable_how` (RFC 1813 §3.3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stable {
    Unstable = 0,
    DataSync = 1,
    FileSync = 2,
}

/// One directory entry as READDIR shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub fileid: FileId,
    pub name: Vec<u8>,
    /// Where a READDIR continues after this entry (never 0, which means "from the start").
    pub cookie: u64,
}

/// `FSSTAT3resok` sizes (RFC 1813 §3.3.18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStat {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub total_files: u64,
    pub free_files: u64,
    pub avail_files: u64,
}

/// An exported filesystem. Names are single path components (never empty, `.` or `..`, and
/// without `/`: the server refuses those before a backend sees them). Every method may be
/// called from many threads at once.
pub trait Backend: Send + Sync {
    /// The export's root directory.
    fn root(&self) -> FileId;

    /// Whether `id` still names a file (`Stale` otherwise, also from every other method).
    fn getattr(&self, id: FileId) -> Result<Attr>;

    /// SETATTR: the new attributes. A size change on a directory is `IsDir`.
    fn setattr(&self, id: FileId, set: &SetAttr) -> Result<Attr>;

    /// LOOKUP of `name` in directory `dir`.
    fn lookup(&self, dir: FileId, name: &[u8]) -> Result<FileId>;

    /// READ: appends at most `count` octets from `offset` to `out` (where the server sends
    /// them from: the file's one copy); `true` when the read reached the end of the file.
    fn read(&self, id: FileId, offset: u64, count: u32, out: &mut Vec<u8>) -> Result<bool>;

    /// WRITE of `data` at `offset`: octets written and how stable they now are (at least
    /// `stable`).
    fn write(&self, id: FileId, offset: u64, data: &[u8], stable: Stable) -> Result<(u32, Stable)>;

    /// CREATE of a regular file.
    fn create(&self, dir: FileId, name: &[u8], how: CreateHow) -> Result<FileId>;

    /// MKDIR.
    fn mkdir(&self, dir: FileId, name: &[u8], set: &SetAttr) -> Result<FileId>;

    /// SYMLINK `name` → `target`.
    fn symlink(&self, dir: FileId, name: &[u8], target: &[u8], set: &SetAttr) -> Result<FileId>;

    /// MKNOD: `NotSupp` unless the backend makes special files.
    fn mknod(&self, dir: FileId, name: &[u8], kind: FileKind, set: &SetAttr) -> Result<FileId> {
        let _ = (dir, name, kind, set);
        Err(Nfs3Error::NotSupp)
    }

    /// READLINK.
    fn readlink(&self, id: FileId) -> Result<Vec<u8>>;

    /// REMOVE of a non-directory.
    fn remove(&self, dir: FileId, name: &[u8]) -> Result<()>;

    /// RMDIR of an empty directory.
    fn rmdir(&self, dir: FileId, name: &[u8]) -> Result<()>;

    /// RENAME, replacing a target of a compatible type (POSIX `rename`).
    fn rename(&self, from: FileId, from_name: &[u8], to: FileId, to_name: &[u8]) -> Result<()>;

    /// LINK: a new name for `id` (not a directory).
    fn link(&self, id: FileId, dir: FileId, name: &[u8]) -> Result<()>;

    /// READDIR from `cookie` (0: the start): at most `max` entries, `.` and `..` included
    /// (`..` of the root is the root), and whether the directory ends there. A cookie the
    /// directory no longer has is `BadCookie`.
    fn readdir(&self, dir: FileId, cookie: u64, max: usize) -> Result<(Vec<DirEntry>, bool)>;

    /// FSSTAT.
    fn fsstat(&self) -> Result<FsStat>;

    /// COMMIT: what was written UNSTABLE to `id` reaches stable storage.
    fn commit(&self, id: FileId) -> Result<()>;
}
