//! NFSv3 (RFC 1813 §3) and MOUNT v3 (RFC 1813 App. I) over a [`Backend`]: argument
//! decoding, file handles, weak cache consistency data, and the results in XDR — READ's
//! data and READLINK's path marked DDP-eligible (RFC 8267 §4), built in the transport's
//! reused memory so the file's one copy is the only one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use softrdma_rpc::{Auth, CallContext, Payload, ProcError, Registry};
use softrdma_wire::xdr::XdrReader;

use super::backend::{
    Attr, Backend, CreateHow, FileId, FileKind, Nfs3Error, NfsTime, SetAttr, SetTime, Stable,
};
use crate::proto::{FHSIZE3, MAX_NAME, MNTPATHLEN, MOUNT_PROGRAM, MOUNT_V3, NFS_PROGRAM, NFS_V3};
use crate::proto::{Xdr, ddp_argument};

/// Largest READ and WRITE (FSINFO `rtmax`, `wtmax`): one RPC-over-RDMA chunk's worth.
pub const MAX_IO: u32 = 1 << 20;
/// `NFS3ERR_NOT_SYNC`: SETATTR's guard did not match (RFC 1813 §3.3.2).
const NOT_SYNC: u32 = 10002;
/// Handle layout: magic, version, export id, file id.
const FH_MAGIC: [u8; 3] = *b"SRF";
const FH_VERSION: u8 = 1;
const FH_LEN: usize = 4 + 8 + 8;
/// READDIR(PLUS) fetches entries from the backend this many at a time.
const DIR_BATCH: usize = 64;

/// One exported filesystem.
struct Export {
    /// The path clients mount (`/` separated, no trailing `/`).
    path: String,
    /// Goes into every handle: the same path gives the same id on every start.
    id: u64,
    fs: Arc<dyn Backend>,
}

/// Calls, octets and errors served.
#[derive(Debug, Default)]
pub struct NfsStats {
    /// NFSv3 calls per procedure (0..=21).
    pub calls: [AtomicU64; 22],
    /// MOUNT calls.
    pub mount_calls: AtomicU64,
    /// Octets READ returned.
    pub bytes_read: AtomicU64,
    /// Octets WRITE took.
    pub bytes_written: AtomicU64,
    /// Calls answered with an NFS error status.
    pub errors: AtomicU64,
}

/// NFSv3 and MOUNT v3 for a set of exports: [`register`](NfsService::register) them with an
/// RPC [`Registry`], then serve that over TCP and RPC-over-RDMA.
#[derive(Clone)]
pub struct NfsService {
    inner: Arc<Inner>,
}

struct Inner {
    exports: Vec<Export>,
    /// WRITE and COMMIT verifier: new on every start, so clients resend unstable data a
    /// restart may have lost (RFC 1813 §3.3.7).
    verifier: [u8; 8],
    /// Who mounted what (MOUNT DUMP), oldest first: each (host, path) once, at most
    /// [`MAX_MOUNT_ENTRIES`].
    mounts: Mutex<Vec<(String, String)>>,
    stats: NfsStats,
}

impl Default for NfsService {
    fn default() -> NfsService {
        NfsService::new(Vec::new())
    }
}

impl NfsService {
    /// Serves `exports`: (the path clients mount, the filesystem).
    pub fn new(exports: Vec<(String, Arc<dyn Backend>)>) -> NfsService {
        let boot = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        NfsService {
            inner: Arc::new(Inner {
                exports: exports
                    .into_iter()
                    .map(|(path, fs)| {
                        let path = normalize(&path);
                        Export {
                            id: export_id(&path),
                            path,
                            fs,
                        }
                    })
                    .collect(),
                verifier: boot.to_be_bytes(),
                mounts: Mutex::new(Vec::new()),
                stats: NfsStats::default(),
            }),
        }
    }

    /// Registers NFS v3 and MOUNT v3 (with the RFC 8267 argument binding, and the
    /// non-idempotent procedures for the duplicate request cache).
    pub fn register(&self, reg: &mut Registry) {
        let s = self.inner.clone();
        reg.register(
            NFS_PROGRAM,
            NFS_V3,
            move |ctx: &CallContext<'_>, args: &[u8]| s.nfs(ctx, args),
        );
        let s = self.inner.clone();
        reg.register(
            MOUNT_PROGRAM,
            MOUNT_V3,
            move |ctx: &CallContext<'_>, args: &[u8]| s.mount(ctx, args),
        );
        reg.bind_arguments(NFS_PROGRAM, NFS_V3, ddp_argument);
        // RFC 1813 §4.1 / Linux's nfsd: these change state; a retransmission must get the
        // first answer, not run again.
        reg.non_idempotent(
            NFS_PROGRAM,
            NFS_V3,
            &[2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 21],
        );
        reg.non_idempotent(MOUNT_PROGRAM, MOUNT_V3, &[1, 3, 4]);
    }

    /// What was served so far.
    pub fn stats(&self) -> &NfsStats {
        &self.inner.stats
    }

    /// The root handle of the export at `path` (what MNT answers).
    pub fn root_handle(&self, path: &str) -> Option<Vec<u8>> {
        let p = normalize(path);
        self.inner
            .exports
            .iter()
            .find(|e| e.path == p)
            .map(|e| handle(e.id, e.fs.root()))
    }
}

/// `/a//b/` → `/a/b`.
fn normalize(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// FNV-1a of the export path: the same export keeps its handles across restarts.
fn export_id(path: &str) -> u64 {
    path.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn handle(export: u64, id: FileId) -> Vec<u8> {
    let mut h = Vec::with_capacity(FH_LEN);
    h.extend_from_slice(&FH_MAGIC);
    h.push(FH_VERSION);
    h.extend_from_slice(&export.to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h
}

/// A status or the XDR of a failed call's results after it.
type Res<T> = Result<T, Nfs3Error>;

fn garbage<E>(_: E) -> ProcError {
    ProcError::GarbageArgs
}

/// A valid single path component (RFC 1813 §3.3: names are components; `.` and `..` are
/// the server's to interpret, never a backend's).
fn check_name(name: &[u8]) -> Res<()> {
    if name.len() > MAX_NAME as usize {
        return Err(Nfs3Error::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Nfs3Error::Inval);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// XDR pieces (RFC 1813 §2.6)
// ---------------------------------------------------------------------------

fn time(x: &mut Xdr, t: NfsTime) {
    x.u32(t.seconds).u32(t.nseconds);
}

fn fattr3(x: &mut Xdr, fsid: u64, a: &Attr) {
    x.u32(a.kind as u32)
        .u32(a.mode & 0o7777)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u64(a.size)
        .u64(a.used)
        .u32(a.rdev.0)
        .u32(a.rdev.1)
        .u64(fsid)
        .u64(a.fileid);
    time(x, a.atime);
    time(x, a.mtime);
    time(x, a.ctime);
}

fn post_op_attr(x: &mut Xdr, fsid: u64, a: Option<&Attr>) {
    match a {
        Some(a) => {
            x.bool(true);
            fattr3(x, fsid, a);
        }
        None => {
            x.bool(false);
        }
    }
}

/// `wcc_data`: the directory or file before (size, mtime, ctime) and after.
fn wcc(x: &mut Xdr, fsid: u64, before: Option<&Attr>, after: Option<&Attr>) {
    match before {
        Some(b) => {
            x.bool(true).u64(b.size);
            time(x, b.mtime);
            time(x, b.ctime);
        }
        None => {
            x.bool(false);
        }
    }
    post_op_attr(x, fsid, after);
}

fn read_time(r: &mut XdrReader<'_>) -> Result<NfsTime, ProcError> {
    Ok(NfsTime {
        seconds: r.read_u32().map_err(garbage)?,
        nseconds: r.read_u32().map_err(garbage)?,
    })
}

/// `sattr3`.
fn read_sattr(r: &mut XdrReader<'_>) -> Result<SetAttr, ProcError> {
    let opt32 = |r: &mut XdrReader<'_>| -> Result<Option<u32>, ProcError> {
        Ok(match r.read_bool().map_err(garbage)? {
            true => Some(r.read_u32().map_err(garbage)?),
            false => None,
        })
    };
    let mode = opt32(r)?;
    let uid = opt32(r)?;
    let gid = opt32(r)?;
    let size = match r.read_bool().map_err(garbage)? {
        true => Some(r.read_u64().map_err(garbage)?),
        false => None,
    };
    let how = |r: &mut XdrReader<'_>| -> Result<SetTime, ProcError> {
        Ok(match r.read_u32().map_err(garbage)? {
            0 => SetTime::DontChange,
            1 => SetTime::ServerTime,
            2 => SetTime::Client(read_time(r)?),
            _ => return Err(ProcError::GarbageArgs),
        })
    };
    let atime = how(r)?;
    let mtime = how(r)?;
    Ok(SetAttr {
        mode,
        uid,
        gid,
        size,
        atime,
        mtime,
    })
}

// ---------------------------------------------------------------------------
// The NFS program
// ---------------------------------------------------------------------------

/// The caller's AUTH_SYS identity (AUTH_NONE is nobody).
fn caller(ctx: &CallContext<'_>) -> (u32, u32, Vec<u32>) {
    match &ctx.header.cred {
        Auth::Sys(p) => (p.uid, p.gid, p.gids.clone()),
        _ => (65534, 65534, Vec::new()),
    }
}

impl Inner {
    fn export_of(&self, fh: &[u8]) -> Res<(&Export, FileId)> {
        if fh.len() != FH_LEN || fh[..3] != FH_MAGIC || fh[3] != FH_VERSION {
            return Err(Nfs3Error::BadHandle);
        }
        let id = u64::from_be_bytes(fh[4..12].try_into().map_err(|_| Nfs3Error::BadHandle)?);
        let file = u64::from_be_bytes(fh[12..20].try_into().map_err(|_| Nfs3Error::BadHandle)?);
        // A handle of an export we do not serve (or no longer serve) is stale.
        let e = self
            .exports
            .iter()
            .find(|e| e.id == id)
            .ok_or(Nfs3Error::Stale)?;
        Ok((e, file))
    }

    /// The file of handle `fh`, which must be of export `e`: RENAME and LINK between
    /// exports are cross-device (`XDEV`).
    fn in_export(&self, e: &Export, fh: &[u8]) -> Res<FileId> {
        match self.export_of(fh)? {
            (other, id) if other.id == e.id => Ok(id),
            _ => Err(Nfs3Error::Xdev),
        }
    }

    fn nfs(&self, ctx: &CallContext<'_>, args: &[u8]) -> Result<Payload, ProcError> {
        let proc = ctx.header.proc;
        if let Some(c) = self.stats.calls.get(proc as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let mut r = XdrReader::new(args);
        let mut x = Xdr::new();
        if proc == 0 {
            return Ok(Payload::default());
        }
        // RFC 5531 §9: a procedure this version does not have is PROC_UNAVAIL, whatever
        // its arguments (RFC 1813 numbers 0..=21).
        if proc > 21 {
            return Err(ProcError::ProcUnavail);
        }
        // READ builds its results in the transport's memory, data included.
        if proc == 6 {
            return self.read(ctx, &mut r);
        }
        if proc == 5 {
            return self.readlink(&mut r);
        }
        let fh = r.read_opaque(FHSIZE3).map_err(garbage)?;
        let status = match self.export_of(fh) {
            Err(e) => {
                // Nothing to report attributes of: every result's failure arm starts
                // with the status, then empty attributes.
                x.u32(e.code());
                fail_tail(&mut x, proc);
                Err(e)
            }
            Ok((e, id)) => self.dispatch(ctx, proc, e, id, &mut r, &mut x)?,
        };
        tracing::debug!(proc, status = ?status.err(), "NFS3 call");
        if status.is_err() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Payload::from(x.into_vec()))
    }

    /// Runs procedure `proc` on file `id` of export `e`; results (success or failure) are
    /// in `x`; `Err(ProcError)` only for arguments that do not decode.
    fn dispatch(
        &self,
        ctx: &CallContext<'_>,
        proc: u32,
        e: &Export,
        id: FileId,
        r: &mut XdrReader<'_>,
        x: &mut Xdr,
    ) -> Result<Res<()>, ProcError> {
        let fs = &*e.fs;
        let fsid = e.id;
        let out = match proc {
            // GETATTR
            1 => match fs.getattr(id) {
                Ok(a) => {
                    x.u32(0);
                    fattr3(x, fsid, &a);
                    Ok(())
                }
                Err(err) => {
                    x.u32(err.code());
                    Err(err)
                }
            },
            // SETATTR (guarded by ctime, §3.3.2)
            2 => {
                let set = read_sattr(r)?;
                let guard = match r.read_bool().map_err(garbage)? {
                    true => Some(read_time(r)?),
                    false => None,
                };
                let before = fs.getattr(id).ok();
                let res = match (guard, before) {
                    (_, None) => Err(Nfs3Error::Stale),
                    (Some(g), Some(b)) if b.ctime != g => {
                        x.u32(NOT_SYNC);
                        wcc(x, fsid, Some(&b), Some(&b));
                        return Ok(Err(Nfs3Error::Inval));
                    }
                    (_, Some(b)) => may_setattr(ctx, &b, &set).and_then(|()| fs.setattr(id, &set)),
                };
                let after = fs.getattr(id).ok();
                status(x, &res);
                wcc(x, fsid, before.as_ref(), after.as_ref());
                res.map(drop)
            }
            // LOOKUP
            3 => {
                let name = r.read_opaque(MAX_NAME + 1).map_err(garbage)?;
                let dir = fs.getattr(id);
                let res = self.lookup(ctx, fs, id, dir, name);
                let dir = dir.ok();
                let obj = res.as_ref().ok().and_then(|&f| fs.getattr(f).ok());
                status(x, &res);
                if let Ok(f) = res {
                    x.opaque(&handle(fsid, f));
                    post_op_attr(x, fsid, obj.as_ref());
                }
                post_op_attr(x, fsid, dir.as_ref());
                res.map(drop)
            }
            // ACCESS
            4 => {
                let want = r.read_u32().map_err(garbage)?;
                let a = fs.getattr(id);
                status(x, &a);
                post_op_attr(x, fsid, a.as_ref().ok());
                if let Ok(a) = &a {
                    x.u32(want & access(ctx, a));
                }
                a.map(drop)
            }
            // WRITE
            7 => {
                let offset = r.read_u64().map_err(garbage)?;
                let count = r.read_u32().map_err(garbage)?;
                let stable = match r.read_u32().map_err(garbage)? {
                    0 => Stable::Unstable,
                    1 => Stable::DataSync,
                    2 => Stable::FileSync,
                    _ => return Err(ProcError::GarbageArgs),
                };
                let data = r.read_opaque(MAX_IO).map_err(garbage)?;
                // §3.3.7: count and the data's length agree, or the call is bad.
                if data.len() != count as usize {
                    return Err(ProcError::GarbageArgs);
                }
                let before = fs.getattr(id).ok();
                let res = match before {
                    Some(b) if b.kind == FileKind::Directory => Err(Nfs3Error::IsDir),
                    Some(b) if b.kind != FileKind::Regular => Err(Nfs3Error::Inval),
                    Some(b) => permit(ctx, &b, MAY_MODIFY, true)
                        .and_then(|()| fs.write(id, offset, data, stable)),
                    None => fs.write(id, offset, data, stable),
                };
                let after = fs.getattr(id).ok();
                status(x, &res);
                wcc(x, fsid, before.as_ref(), after.as_ref());
                if let Ok((n, how)) = res {
                    self.stats
                        .bytes_written
                        .fetch_add(u64::from(n), Ordering::Relaxed);
                    x.u32(n).u32(how as u32).fixed(&self.verifier);
                }
                res.map(drop)
            }
            // CREATE, MKDIR, SYMLINK, MKNOD: a new name in directory `id`
            8..=11 => {
                let name = r.read_opaque(MAX_NAME + 1).map_err(garbage)?;
                let (uid, gid, _) = caller(ctx);
                let owned = |mut s: SetAttr| {
                    s.uid = s.uid.or(Some(uid));
                    s.gid = s.gid.or(Some(gid));
                    s
                };
                let op: Box<dyn FnOnce() -> Res<FileId> + '_> = match proc {
                    8 => {
                        let how = match r.read_u32().map_err(garbage)? {
                            0 => CreateHow::Unchecked(owned(read_sattr(r)?)),
                            1 => CreateHow::Guarded(owned(read_sattr(r)?)),
                            2 => {
                                let v = r.read_opaque_fixed(8).map_err(garbage)?;
                                CreateHow::Exclusive(v.try_into().map_err(garbage)?)
                            }
                            _ => return Err(ProcError::GarbageArgs),
                        };
                        Box::new(move || fs.create(id, name, how))
                    }
                    9 => {
                        let set = owned(read_sattr(r)?);
                        Box::new(move || fs.mkdir(id, name, &set))
                    }
                    10 => {
                        let set = owned(read_sattr(r)?);
                        let target = r.read_opaque(MNTPATHLEN * 4).map_err(garbage)?;
                        Box::new(move || {
                            if target.is_empty() {
                                return Err(Nfs3Error::Inval);
                            }
                            fs.symlink(id, name, target, &set)
                        })
                    }
                    _ => {
                        let kind = match r.read_u32().map_err(garbage)? {
                            3 => FileKind::Block,
                            4 => FileKind::Char,
                            6 => FileKind::Socket,
                            7 => FileKind::Fifo,
                            // §3.3.11: regular files, directories and links are made by
                            // their own procedures.
                            1 | 2 | 5 => {
                                let before = fs.getattr(id).ok();
                                x.u32(Nfs3Error::BadType.code());
                                wcc(x, fsid, before.as_ref(), before.as_ref());
                                return Ok(Err(Nfs3Error::BadType));
                            }
                            _ => return Err(ProcError::GarbageArgs),
                        };
                        let set = owned(read_sattr(r)?);
                        if matches!(kind, FileKind::Block | FileKind::Char) {
                            r.read_u64().map_err(garbage)?; // specdata3
                        }
                        Box::new(move || fs.mknod(id, name, kind, &set))
                    }
                };
                let before = fs.getattr(id).ok();
                let res = check_name(name)
                    .and_then(|()| may_change_dir(ctx, before.as_ref()))
                    .and_then(|()| op());
                let after = fs.getattr(id).ok();
                status(x, &res);
                if let Ok(f) = res {
                    let a = fs.getattr(f).ok();
                    x.bool(true).opaque(&handle(fsid, f));
                    post_op_attr(x, fsid, a.as_ref());
                }
                wcc(x, fsid, before.as_ref(), after.as_ref());
                res.map(drop)
            }
            // REMOVE, RMDIR
            12 | 13 => {
                let name = r.read_opaque(MAX_NAME + 1).map_err(garbage)?;
                let before = fs.getattr(id).ok();
                let res = check_name(name)
                    .and_then(|()| may_change_dir(ctx, before.as_ref()))
                    .and_then(|()| {
                        if proc == 12 {
                            fs.remove(id, name)
                        } else {
                            fs.rmdir(id, name)
                        }
                    });
                let after = fs.getattr(id).ok();
                status(x, &res);
                wcc(x, fsid, before.as_ref(), after.as_ref());
                res
            }
            // RENAME
            14 => {
                let from_name = r.read_opaque(MAX_NAME + 1).map_err(garbage)?;
                let to_fh = r.read_opaque(FHSIZE3).map_err(garbage)?;
                let to_name = r.read_opaque(MAX_NAME + 1).map_err(garbage)?;
                let from_before = fs.getattr(id).ok();
                let to = self.in_export(e, to_fh);
                let to_before = to.as_ref().ok().and_then(|&t| fs.getattr(t).ok());
                let res = check_name(from_name)
                    .and_then(|()| check_name(to_name))
                    .and_then(|()| may_change_dir(ctx, from_before.as_ref()))
                    .and_then(|()| may_change_dir(ctx, to_before.as_ref()))
                    .and(to)
                    .and_then(|t| fs.rename(id, from_name, t, to_name));
                let from_after = fs.getattr(id).ok();
                let to_after = to.as_ref().ok().and_then(|&t| fs.getattr(t).ok());
                status(x, &res);
                wcc(x, fsid, from_before.as_ref(), from_after.as_ref());
                wcc(x, fsid, to_before.as_ref(), to_after.as_ref());
                res
            }
            // LINK
            15 => {
                let dir_fh = r.read_opaque(FHSIZE3).map_err(garbage)?;
                let name = r.read_opaque(MAX_NAME + 1).map_err(garbage)?;
                let dir = self.in_export(e, dir_fh);
                let dir_before = dir.as_ref().ok().and_then(|&d| fs.getattr(d).ok());
                let res = check_name(name)
                    .and_then(|()| may_change_dir(ctx, dir_before.as_ref()))
                    .and(dir)
                    .and_then(|d| fs.link(id, d, name));
                let file = fs.getattr(id).ok();
                let dir_after = dir.as_ref().ok().and_then(|&d| fs.getattr(d).ok());
                status(x, &res);
                post_op_attr(x, fsid, file.as_ref());
                wcc(x, fsid, dir_before.as_ref(), dir_after.as_ref());
                res
            }
            // READDIR, READDIRPLUS
            16 | 17 => {
                let cookie = r.read_u64().map_err(garbage)?;
                let _verf = r.read_opaque_fixed(8).map_err(garbage)?;
                let count = r.read_u32().map_err(garbage)?;
                let max = if proc == 17 {
                    r.read_u32().map_err(garbage)?
                } else {
                    count
                };
                // Never a reply larger than a READ's: the client's count is only a wish.
                let max = max.min(MAX_IO);
                self.readdir(ctx, e, id, cookie, max, proc == 17, x)
            }
            // FSSTAT
            18 => {
                let a = fs.getattr(id);
                let st = a.and_then(|_| fs.fsstat());
                status(x, &st);
                post_op_attr(x, fsid, a.as_ref().ok());
                if let Ok(s) = st {
                    x.u64(s.total_bytes)
                        .u64(s.free_bytes)
                        .u64(s.avail_bytes)
                        .u64(s.total_files)
                        .u64(s.free_files)
                        .u64(s.avail_files)
                        .u32(0); // invarsec
                }
                st.map(drop)
            }
            // FSINFO (§3.3.19): sizes for RDMA, 1 MiB transfers.
            19 => {
                let a = fs.getattr(id);
                status(x, &a);
                post_op_attr(x, fsid, a.as_ref().ok());
                if a.is_ok() {
                    x.u32(MAX_IO)
                        .u32(MAX_IO)
                        .u32(4096)
                        .u32(MAX_IO)
                        .u32(MAX_IO)
                        .u32(4096)
                        .u32(64 << 10)
                        .u64(i64::MAX as u64)
                        .u32(0)
                        .u32(1) // time_delta: 1 ns
                        // FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME
                        .u32(0x1 | 0x2 | 0x8 | 0x10);
                }
                a.map(drop)
            }
            // PATHCONF
            20 => {
                let a = fs.getattr(id);
                status(x, &a);
                post_op_attr(x, fsid, a.as_ref().ok());
                if a.is_ok() {
                    x.u32(32_000) // linkmax
                        .u32(MAX_NAME)
                        .bool(true) // no_trunc
                        .bool(true) // chown_restricted
                        .bool(false) // case_insensitive
                        .bool(true); // case_preserving
                }
                a.map(drop)
            }
            // COMMIT
            21 => {
                let _offset = r.read_u64().map_err(garbage)?;
                let _count = r.read_u32().map_err(garbage)?;
                let before = fs.getattr(id).ok();
                let res = fs.commit(id);
                let after = fs.getattr(id).ok();
                status(x, &res);
                wcc(x, fsid, before.as_ref(), after.as_ref());
                if res.is_ok() {
                    x.fixed(&self.verifier);
                }
                res
            }
            _ => return Err(ProcError::ProcUnavail),
        };
        Ok(out)
    }

    /// LOOKUP in `dir` (attributes `attr`), with `.` and `..` answered here (a backend
    /// only sees components).
    fn lookup(
        &self,
        ctx: &CallContext<'_>,
        fs: &dyn Backend,
        dir: FileId,
        attr: Res<Attr>,
        name: &[u8],
    ) -> Res<FileId> {
        let a = attr?;
        if a.kind != FileKind::Directory {
            return Err(Nfs3Error::NotDir);
        }
        permit(ctx, &a, MAY_LOOKUP, false)?;
        match name {
            b"." => Ok(dir),
            // `..` as the directory lists it; the export's root is its own parent, so a
            // client never climbs out of the export.
            b".." => {
                if dir == fs.root() {
                    return Ok(dir);
                }
                let (entries, _) = fs.readdir(dir, 0, 2)?;
                entries
                    .iter()
                    .find(|en| en.name == b"..")
                    .map(|en| en.fileid)
                    .ok_or(Nfs3Error::ServerFault)
            }
            _ => {
                check_name(name)?;
                fs.lookup(dir, name)
            }
        }
    }

    /// READDIR3 / READDIRPLUS3 results: entries while they fit `max` octets of reply.
    #[allow(clippy::too_many_arguments)]
    fn readdir(
        &self,
        ctx: &CallContext<'_>,
        e: &Export,
        dir: FileId,
        cookie: u64,
        max: u32,
        plus: bool,
        x: &mut Xdr,
    ) -> Res<()> {
        let fs = &*e.fs;
        let a = match fs.getattr(dir) {
            Ok(a) if a.kind != FileKind::Directory => Err(Nfs3Error::NotDir),
            Ok(a) => permit(ctx, &a, MAY_READ, false).map(|()| a),
            r => r,
        };
        let a = match a {
            Ok(a) => a,
            Err(err) => {
                x.u32(err.code());
                post_op_attr(x, e.id, None);
                return Err(err);
            }
        };
        // Status, post_op_attr, cookieverf, the list's end marker and eof.
        let fixed = 4 + 4 + 84 + 8 + 4 + 4;
        let mut body = Xdr::new();
        let mut used = fixed;
        let mut at = cookie;
        let mut eof = false;
        let mut n = 0usize;
        'fill: loop {
            let (batch, end) = match fs.readdir(dir, at, DIR_BATCH) {
                Ok(b) => b,
                Err(err) => {
                    x.u32(err.code());
                    post_op_attr(x, e.id, Some(&a));
                    return Err(err);
                }
            };
            for en in &batch {
                let fh = handle(e.id, en.fileid);
                let attr = if plus {
                    fs.getattr(en.fileid).ok()
                } else {
                    None
                };
                let mut one = Xdr::new();
                one.bool(true)
                    .u64(en.fileid)
                    .opaque(&en.name)
                    .u64(en.cookie);
                if plus {
                    post_op_attr(&mut one, e.id, attr.as_ref());
                    one.bool(true).opaque(&fh);
                }
                if used + one.0.len() > max as usize {
                    break 'fill;
                }
                used += one.0.len();
                body.0.extend_from_slice(&one.0);
                at = en.cookie;
                n += 1;
            }
            if end || batch.is_empty() {
                eof = true;
                break;
            }
        }
        if n == 0 && !eof {
            // Not even one entry fits what the client allows (§3.3.16).
            x.u32(Nfs3Error::TooSmall.code());
            post_op_attr(x, e.id, Some(&a));
            return Err(Nfs3Error::TooSmall);
        }
        x.u32(0);
        post_op_attr(x, e.id, Some(&a));
        x.fixed(&[0; 8]); // cookieverf: cookies stay valid
        x.0.extend_from_slice(&body.0);
        x.bool(false).bool(eof);
        Ok(())
    }

    /// READLINK (§3.3.5): the path DDP-eligible (RFC 8267 §4.1).
    fn readlink(&self, r: &mut XdrReader<'_>) -> Result<Payload, ProcError> {
        let fh = r.read_opaque(FHSIZE3).map_err(garbage)?;
        let mut x = Xdr::new();
        let res = self
            .export_of(fh)
            .map(|(e, id)| (e.id, e.fs.getattr(id).ok(), e.fs.readlink(id)));
        let (fsid, a, path) = match res {
            Ok((fsid, a, p)) => (fsid, a, p),
            Err(err) => (0, None, Err(err)),
        };
        status(&mut x, &path);
        post_op_attr(&mut x, fsid, a.as_ref());
        let mut p = Payload::from(x.into_vec());
        match path {
            Ok(path) => {
                p.push_opaque(&path);
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(p)
    }

    /// READ (§3.3.6): results built in the transport's memory, the data marked
    /// DDP-eligible and read by the backend straight into place.
    fn read(&self, ctx: &CallContext<'_>, r: &mut XdrReader<'_>) -> Result<Payload, ProcError> {
        let fh = r.read_opaque(FHSIZE3).map_err(garbage)?;
        let offset = r.read_u64().map_err(garbage)?;
        let count = r.read_u32().map_err(garbage)?.min(MAX_IO);
        let fail = |err: Nfs3Error, fsid: u64, a: Option<&Attr>| {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            let mut x = Xdr::new();
            x.u32(err.code());
            post_op_attr(&mut x, fsid, a);
            Ok(Payload::from(x.into_vec()))
        };
        let (e, id) = match self.export_of(fh) {
            Ok(v) => v,
            Err(err) => return fail(err, 0, None),
        };
        let a = match e.fs.getattr(id) {
            Ok(a) if a.kind == FileKind::Directory => {
                return fail(Nfs3Error::IsDir, e.id, Some(&a));
            }
            Ok(a) if a.kind != FileKind::Regular => return fail(Nfs3Error::Inval, e.id, Some(&a)),
            Ok(a) => match permit(ctx, &a, MAY_READ, true) {
                Ok(()) => a,
                Err(err) => return fail(err, e.id, Some(&a)),
            },
            Err(err) => return fail(err, e.id, None),
        };
        // status, post_op_attr, count, eof, the opaque's length word: then the data.
        let head = 4 + 4 + 84 + 4 + 4 + 4;
        let mut v = ctx.buffer(head + count as usize + 3);
        v.resize(head, 0);
        let eof = match e.fs.read(id, offset, count, &mut v) {
            Ok(eof) => eof,
            Err(err) => return fail(err, e.id, Some(&a)),
        };
        let n = v.len() - head;
        if n > count as usize {
            return fail(Nfs3Error::ServerFault, e.id, Some(&a));
        }
        let mut x = Xdr::new();
        x.u32(0);
        post_op_attr(&mut x, e.id, Some(&a));
        x.u32(n as u32).bool(eof).u32(n as u32);
        debug_assert_eq!(x.0.len(), head);
        v[..head].copy_from_slice(&x.0);
        v.resize(softrdma_wire::xdr::padded_len(v.len()), 0);
        self.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        tracing::debug!(offset, count, n, eof, "NFS3 READ");
        Ok(Payload {
            xdr: v,
            ddp: std::iter::once(head..head + n).collect(),
            shared: None,
        })
    }

    // -----------------------------------------------------------------------
    // MOUNT v3 (RFC 1813 App. I)
    // -----------------------------------------------------------------------

    fn mount(&self, ctx: &CallContext<'_>, args: &[u8]) -> Result<Payload, ProcError> {
        self.stats.mount_calls.fetch_add(1, Ordering::Relaxed);
        let mut r = XdrReader::new(args);
        let mut x = Xdr::new();
        let who = ctx
            .peer
            .map(|p: SocketAddr| p.ip().to_string())
            .unwrap_or_default();
        match ctx.header.proc {
            0 => {}
            // MNT
            1 => {
                let path = r.read_string(MNTPATHLEN).map_err(garbage)?;
                match self.mnt(path) {
                    Ok(fh) => {
                        remember_mount(&mut self.mounts.lock(), who, normalize(path));
                        // AUTH_SYS (and AUTH_NONE) accepted.
                        x.u32(0).opaque(&fh).u32(2).u32(1).u32(0);
                    }
                    Err(err) => {
                        x.u32(err.code());
                    }
                }
            }
            // DUMP
            2 => {
                for (host, dir) in self.mounts.lock().iter() {
                    x.bool(true).opaque(host.as_bytes()).opaque(dir.as_bytes());
                }
                x.bool(false);
            }
            // UMNT
            3 => {
                let path = normalize(r.read_string(MNTPATHLEN).map_err(garbage)?);
                self.mounts
                    .lock()
                    .retain(|(h, d)| !(*h == who && *d == path));
            }
            // UMNTALL
            4 => self.mounts.lock().retain(|(h, _)| *h != who),
            // EXPORT: every export, open to every host (no groups).
            5 => {
                for e in &self.exports {
                    x.bool(true).opaque(e.path.as_bytes()).bool(false);
                }
                x.bool(false);
            }
            _ => return Err(ProcError::ProcUnavail),
        }
        Ok(Payload::from(x.into_vec()))
    }

    /// The handle of `path`: an export, or a directory below one (components looked up,
    /// never `..`).
    fn mnt(&self, path: &str) -> Res<Vec<u8>> {
        let p = normalize(path);
        let e = self
            .exports
            .iter()
            .filter(|e| p == e.path || p.starts_with(&format!("{}/", e.path)) || e.path == "/")
            .max_by_key(|e| e.path.len())
            .ok_or(Nfs3Error::NoEnt)?;
        let mut id = e.fs.root();
        let rest = if e.path == "/" {
            &p[1..]
        } else {
            p[e.path.len()..].trim_start_matches('/')
        };
        for c in rest.split('/').filter(|c| !c.is_empty()) {
            check_name(c.as_bytes()).map_err(|_| Nfs3Error::Acces)?;
            id = e.fs.lookup(id, c.as_bytes())?;
        }
        if e.fs.getattr(id)?.kind != FileKind::Directory {
            return Err(Nfs3Error::NotDir);
        }
        Ok(handle(e.id, id))
    }
}

/// Entries MOUNT DUMP keeps: a client mounting in a loop (or from many addresses) cannot
/// grow the list, or a DUMP reply, past this.
pub const MAX_MOUNT_ENTRIES: usize = 1024;

/// Records a MNT: a (host, path) already listed moves to the newest place rather than
/// listed twice; past [`MAX_MOUNT_ENTRIES`] the oldest entry goes (DUMP is advisory,
/// RFC 1813 App. I 5.2.3).
fn remember_mount(mounts: &mut Vec<(String, String)>, host: String, path: String) {
    if let Some(i) = mounts.iter().position(|(h, d)| *h == host && *d == path) {
        mounts.remove(i);
    } else if mounts.len() >= MAX_MOUNT_ENTRIES {
        mounts.remove(0);
    }
    mounts.push((host, path));
}

/// The status word of `res`.
fn status<T>(x: &mut Xdr, res: &Res<T>) {
    x.u32(res.as_ref().err().map_or(0, |e| e.code()));
}

/// The rest of a failure's results when not even the handle was good: empty attributes in
/// the shape each procedure's `resfail` has (RFC 1813 §3.3).
fn fail_tail(x: &mut Xdr, proc: u32) {
    let empty_wcc = |x: &mut Xdr| {
        x.bool(false).bool(false);
    };
    match proc {
        // post_op_attr
        1 => {}
        3..=6 | 16..=20 => {
            x.bool(false);
        }
        // wcc_data
        2 | 7..=13 | 21 => empty_wcc(x),
        14 => {
            empty_wcc(x);
            empty_wcc(x);
        }
        15 => {
            x.bool(false);
            empty_wcc(x);
        }
        _ => {}
    }
}

/// The caller may do `want` (ACCESS3 bits) to a file with attributes `a` (a user-space
/// server checks what the kernel would check for the caller: we run with our own rights).
/// With `owner`, the file's owner may read and write it whatever its mode, as Linux's
/// nfsd allows (a file created 0444 is still written by its creator).
fn permit(ctx: &CallContext<'_>, a: &Attr, want: u32, owner: bool) -> Res<()> {
    if owner && caller(ctx).0 == a.uid {
        return Ok(());
    }
    if access(ctx, a) & want == want {
        Ok(())
    } else {
        Err(Nfs3Error::Acces)
    }
}

/// A name may be added to or taken from the directory with attributes `dir` (write and
/// search permission on it; a missing directory is the backend's to report).
fn may_change_dir(ctx: &CallContext<'_>, dir: Option<&Attr>) -> Res<()> {
    match dir {
        Some(d) if d.kind == FileKind::Directory => permit(ctx, d, MAY_MODIFY | MAY_LOOKUP, false),
        _ => Ok(()),
    }
}

/// ACCESS3 `READ`, `LOOKUP`, `MODIFY`: what the procedures need.
const MAY_READ: u32 = 0x1;
const MAY_LOOKUP: u32 = 0x2;
const MAY_MODIFY: u32 = 0x4;

/// SETATTR's rule: only the owner (or root) changes mode, owner, group and times; only
/// root gives a file away, and the owner may change its group to one of theirs; a size
/// needs write access.
fn may_setattr(ctx: &CallContext<'_>, a: &Attr, set: &SetAttr) -> Res<()> {
    let (uid, gid, gids) = caller(ctx);
    if uid == 0 {
        return Ok(());
    }
    let meta = set.mode.is_some()
        || set.uid.is_some()
        || set.gid.is_some()
        || set.atime != SetTime::DontChange
        || set.mtime != SetTime::DontChange;
    if meta && uid != a.uid {
        return Err(Nfs3Error::Perm);
    }
    if set.uid.is_some_and(|u| u != a.uid) {
        return Err(Nfs3Error::Perm);
    }
    if set
        .gid
        .is_some_and(|g| g != a.gid && g != gid && !gids.contains(&g))
    {
        return Err(Nfs3Error::Perm);
    }
    if set.size.is_some() {
        permit(ctx, a, MAY_MODIFY, true)?;
    }
    Ok(())
}

/// ACCESS3 bits the caller has on a file with attributes `a` (RFC 1813 §3.3.4), by its
/// mode and the AUTH_SYS credential, as a local check would (root may do all but execute
/// a file nobody may execute).
fn access(ctx: &CallContext<'_>, a: &Attr) -> u32 {
    const READ: u32 = 0x1;
    const LOOKUP: u32 = 0x2;
    const MODIFY: u32 = 0x4;
    const EXTEND: u32 = 0x8;
    const DELETE: u32 = 0x10;
    const EXECUTE: u32 = 0x20;
    let (uid, gid, gids) = caller(ctx);
    let bits = if uid == 0 {
        let x = if a.mode & 0o111 != 0 || a.kind == FileKind::Directory {
            1
        } else {
            0
        };
        0o6 | x
    } else if uid == a.uid {
        (a.mode >> 6) & 7
    } else if gid == a.gid || gids.contains(&a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    let mut out = 0;
    if bits & 4 != 0 {
        out |= READ;
    }
    if bits & 2 != 0 {
        out |= MODIFY | EXTEND;
        if a.kind == FileKind::Directory {
            out |= DELETE;
        }
    }
    if bits & 1 != 0 {
        out |= if a.kind == FileKind::Directory {
            LOOKUP
        } else {
            EXECUTE
        };
    }
    out
}
