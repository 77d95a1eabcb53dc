//! NFSv3 (RFC 1813), MOUNT v3 (RFC 1813 App. I) and portmap v2 GETPORT (RFC 1833) in XDR:
//! the arguments this client sends and the results it reads.

use softrdma_rpc::Payload;
use softrdma_wire::xdr::{XdrReader, padded_len};

/// NFS program (RFC 1813 §2.2).
pub const NFS_PROGRAM: u32 = 100_003;
/// NFS version 3.
pub const NFS_V3: u32 = 3;
/// MOUNT program.
pub const MOUNT_PROGRAM: u32 = 100_005;
/// MOUNT version 3.
pub const MOUNT_V3: u32 = 3;
/// Portmapper / rpcbind program (RFC 1833).
pub const PMAP_PROGRAM: u32 = 100_000;
/// Portmap version 2 (GETPORT).
pub const PMAP_V2: u32 = 2;
/// RFC 1833: `IPPROTO_TCP` in a mapping.
pub const IPPROTO_TCP: u32 = 6;
/// NFS over TCP's port (RFC 1813).
pub const NFS_TCP_PORT: u16 = 2049;

/// NFSv3 procedures (RFC 1813 §3.3).
pub mod proc3 {
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const LOOKUP: u32 = 3;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const SYMLINK: u32 = 10;
    pub const REMOVE: u32 = 12;
    pub const FSINFO: u32 = 19;
    pub const READDIRPLUS: u32 = 17;
    pub const COMMIT: u32 = 21;
}

/// WRITE3args (RFC 1813 §3.3.7) with `data` as the DDP-eligible argument (RFC 8267 §4).
pub fn write_args(fh: &[u8], offset: u64, data: &[u8], stable: u32) -> Payload {
    let mut x = Xdr::new();
    x.opaque(fh).u64(offset).u32(data.len() as u32).u32(stable);
    Payload::with_opaque(x.into_vec(), data)
}

/// The NFSv3 Upper-Layer Binding for arguments (RFC 8267 §4.1): the data of WRITE and the
/// pathname of SYMLINK are DDP-eligible, nothing else. Given a procedure and its (reduced)
/// arguments, the offset where the eligible item's data begins; `None` for every other
/// procedure and for arguments that do not decode that far.
pub fn ddp_argument(proc: u32, args: &[u8]) -> Option<usize> {
    let mut r = XdrReader::new(args);
    match proc {
        proc3::WRITE => {
            r.read_opaque(FHSIZE3).ok()?;
            r.read_u64().ok()?; // offset
            r.read_u32().ok()?; // count
            r.read_u32().ok()?; // stable
        }
        proc3::SYMLINK => {
            r.read_opaque(FHSIZE3).ok()?; // where
            r.read_opaque(MAX_NAME).ok()?;
            skip_sattr3(&mut r)?;
        }
        _ => return None,
    }
    r.read_u32().ok()?; // the eligible item's length word
    Some(r.position())
}

/// The NFSv3 Upper-Layer Binding for results (RFC 8267 §4.1): the data of a successful
/// READ and the pathname of a successful READLINK. The offset in the (reduced) results
/// where the eligible item's data begins; `None` for other procedures and error replies.
pub fn ddp_result(proc: u32, results: &[u8]) -> Option<usize> {
    let mut r = XdrReader::new(results);
    if proc != proc3::READ && proc != proc3::READLINK {
        return None;
    }
    if r.read_u32().ok()? != 0 {
        return None; // resfail: attributes only
    }
    post_op_attr(&mut r).ok()?;
    if proc == proc3::READ {
        r.read_u32().ok()?; // count
        r.read_u32().ok()?; // eof
    }
    r.read_u32().ok()?; // the item's length word
    Some(r.position())
}

/// sattr3 (RFC 1813 §2.6): mode, uid, gid, size (each a `set_*` union), atime and mtime.
fn skip_sattr3(r: &mut XdrReader<'_>) -> Option<()> {
    for len in [4, 4, 4, 8] {
        if r.read_u32().ok()? == 1 {
            r.skip(len).ok()?;
        }
    }
    for _ in 0..2 {
        // SET_TO_CLIENT_TIME carries an nfstime3.
        if r.read_u32().ok()? == 2 {
            r.skip(8).ok()?;
        }
    }
    Some(())
}

/// Largest file handle (RFC 1813 §2.4 `NFS3_FHSIZE`).
pub const FHSIZE3: u32 = 64;
/// Longest name we send or accept.
pub const MAX_NAME: u32 = 255;
/// Longest MOUNT dirpath (RFC 1813 `MNTPATHLEN`).
pub const MNTPATHLEN: u32 = 1024;

/// An XDR encoder into a growing buffer.
#[derive(Debug, Default, Clone)]
pub struct Xdr(pub Vec<u8>);

impl Xdr {
    /// An empty stream.
    pub fn new() -> Xdr {
        Xdr(Vec::with_capacity(128))
    }

    /// `unsigned int`.
    pub fn u32(&mut self, v: u32) -> &mut Xdr {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// `unsigned hyper`.
    pub fn u64(&mut self, v: u64) -> &mut Xdr {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// `bool`.
    pub fn bool(&mut self, v: bool) -> &mut Xdr {
        self.u32(u32::from(v))
    }

    /// `opaque<>` / `string<>`: length, octets, zero padding.
    pub fn opaque(&mut self, d: &[u8]) -> &mut Xdr {
        self.u32(d.len() as u32);
        self.fixed(d)
    }

    /// `opaque[n]`: octets and zero padding.
    pub fn fixed(&mut self, d: &[u8]) -> &mut Xdr {
        self.0.extend_from_slice(d);
        self.0.resize(padded_len(self.0.len()), 0);
        self
    }

    /// The octets.
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

/// An NFSv3 status other than `NFS3_OK` (RFC 1813 §2.6), or a reply that did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NfsError {
    /// `nfsstat3`.
    #[error("NFS3ERR_{name} ({code})", code = .0, name = stat_name(*.0))]
    Status(u32),
    /// The results do not decode.
    #[error("undecodable NFS results")]
    Garbage,
}

impl From<softrdma_wire::Error> for NfsError {
    fn from(_: softrdma_wire::Error) -> NfsError {
        NfsError::Garbage
    }
}

/// The name of an `nfsstat3` value.
pub fn stat_name(s: u32) -> &'static str {
    match s {
        1 => "PERM",
        2 => "NOENT",
        5 => "IO",
        6 => "NXIO",
        13 => "ACCES",
        17 => "EXIST",
        18 => "XDEV",
        19 => "NODEV",
        20 => "NOTDIR",
        21 => "ISDIR",
        22 => "INVAL",
        27 => "FBIG",
        28 => "NOSPC",
        30 => "ROFS",
        63 => "NAMETOOLONG",
        66 => "NOTEMPTY",
        69 => "DQUOT",
        70 => "STALE",
        10001 => "BADHANDLE",
        10004 => "NOTSUPP",
        10006 => "SERVERFAULT",
        10008 => "JUKEBOX",
        _ => "?",
    }
}

/// `ftype3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// NF3REG.
    Regular,
    /// NF3DIR.
    Directory,
    /// NF3LNK.
    Symlink,
    /// Block, character, socket, FIFO.
    Other(u32),
}

/// `fattr3` (RFC 1813 §2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fattr {
    /// Type.
    pub ftype: FileType,
    /// Mode bits.
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in octets.
    pub size: u64,
    /// File id.
    pub fileid: u64,
    /// Modification time (seconds).
    pub mtime: u32,
}

/// Reads an `nfsstat3`; `Err` unless OK.
pub fn status(r: &mut XdrReader<'_>) -> Result<(), NfsError> {
    match r.read_u32()? {
        0 => Ok(()),
        s => Err(NfsError::Status(s)),
    }
}

/// Reads an `fattr3`.
pub fn fattr(r: &mut XdrReader<'_>) -> Result<Fattr, NfsError> {
    let ftype = match r.read_u32()? {
        1 => FileType::Regular,
        2 => FileType::Directory,
        5 => FileType::Symlink,
        t => FileType::Other(t),
    };
    let mode = r.read_u32()?;
    let nlink = r.read_u32()?;
    let uid = r.read_u32()?;
    let gid = r.read_u32()?;
    let size = r.read_u64()?;
    let _used = r.read_u64()?;
    r.skip(8)?; // rdev
    let _fsid = r.read_u64()?;
    let fileid = r.read_u64()?;
    r.skip(8)?; // atime
    let mtime = r.read_u32()?;
    r.skip(4 + 8)?; // mtime nseconds, ctime
    Ok(Fattr {
        ftype,
        mode,
        nlink,
        uid,
        gid,
        size,
        fileid,
        mtime,
    })
}

/// Reads a `post_op_attr`.
pub fn post_op_attr(r: &mut XdrReader<'_>) -> Result<Option<Fattr>, NfsError> {
    if r.read_bool()? {
        Ok(Some(fattr(r)?))
    } else {
        Ok(None)
    }
}

/// Skips a `wcc_data` (pre_op_attr, post_op_attr).
pub fn wcc_data(r: &mut XdrReader<'_>) -> Result<(), NfsError> {
    if r.read_bool()? {
        r.skip(8 + 8 + 8)?; // size, mtime, ctime
    }
    post_op_attr(r)?;
    Ok(())
}

/// Reads a `post_op_fh3`.
pub fn post_op_fh(r: &mut XdrReader<'_>) -> Result<Option<Vec<u8>>, NfsError> {
    if r.read_bool()? {
        Ok(Some(r.read_opaque(FHSIZE3)?.to_vec()))
    } else {
        Ok(None)
    }
}

/// `diropargs3`: a directory and a name.
pub fn diropargs(x: &mut Xdr, dir: &[u8], name: &str) {
    x.opaque(dir).opaque(name.as_bytes());
}

/// An entry of READDIRPLUS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: String,
    /// Cookie to continue after it.
    pub cookie: u64,
    /// Attributes, when the server sent them.
    pub attr: Option<Fattr>,
    /// Handle, when the server sent it.
    pub fh: Option<Vec<u8>>,
}

/// READDIRPLUS3resok: (cookieverf, entries, eof).
pub fn readdirplus_ok(r: &mut XdrReader<'_>) -> Result<([u8; 8], Vec<DirEntry>, bool), NfsError> {
    post_op_attr(r)?;
    let mut verf = [0u8; 8];
    verf.copy_from_slice(r.read_opaque_fixed(8)?);
    let mut out = Vec::new();
    while r.read_bool()? {
        let _fileid = r.read_u64()?;
        let name = String::from_utf8_lossy(r.read_opaque(MAX_NAME.max(1024))?).into_owned();
        let cookie = r.read_u64()?;
        let attr = post_op_attr(r)?;
        let fh = post_op_fh(r)?;
        out.push(DirEntry {
            name,
            cookie,
            attr,
            fh,
        });
    }
    let eof = r.read_bool()?;
    Ok((verf, out, eof))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8267 §4.1 and RPCRDMA-12/-72/-73: the binding a responder applies finds WRITE's
    /// data exactly where the client's reduction took it from, for any handle and data
    /// length; SYMLINK's pathname past a sattr3 of every shape; nothing for other procedures.
    #[test]
    fn rpcrdma_12_73_the_nfsv3_binding_matches_what_the_client_reduces() {
        for fh_len in [0usize, 1, 8, 28, 63, 64] {
            for n in [0usize, 1, 3, 4, 4097] {
                let fh: Vec<u8> = (0..fh_len as u8).collect();
                let data = vec![0xAB; n];
                let p = write_args(&fh, 1 << 40, &data, 2);
                let at = p.ddp[0].start;
                assert_eq!(ddp_argument(proc3::WRITE, &p.reduced()), Some(at));
                assert_eq!(ddp_argument(proc3::WRITE, &p.xdr), Some(at));
                // READ's arguments carry nothing eligible.
                let mut x = Xdr::new();
                x.opaque(&fh).u64(0).u32(4096);
                assert_eq!(ddp_argument(proc3::READ, &x.into_vec()), None);
            }
        }
        for (mode, time) in [(0u32, 0u32), (1, 1), (1, 2), (0, 2)] {
            let mut x = Xdr::new();
            x.opaque(&[9; 16]).opaque(b"link");
            for len in [4, 4, 4, 8] {
                x.u32(mode);
                if mode == 1 {
                    x.fixed(&vec![0; len]);
                }
            }
            for _ in 0..2 {
                x.u32(time);
                if time == 2 {
                    x.u64(0);
                }
            }
            let p = Payload::with_opaque(x.into_vec(), b"/target/path");
            assert_eq!(
                ddp_argument(proc3::SYMLINK, &p.reduced()),
                Some(p.ddp[0].start),
                "{mode} {time}"
            );
        }
        // READ results: after status, post_op_attr (with and without), count and eof.
        for attrs in [false, true] {
            let mut x = Xdr::new();
            x.u32(0).bool(attrs);
            if attrs {
                x.fixed(&[0; 84]);
            }
            x.u32(5).bool(true);
            let p = Payload::with_opaque(x.into_vec(), b"hello");
            let at = p.ddp[0].start;
            assert_eq!(ddp_result(proc3::READ, &p.reduced()), Some(at));
            // An error status carries no data.
            let mut e = p.reduced();
            e[..4].copy_from_slice(&70u32.to_be_bytes());
            assert_eq!(ddp_result(proc3::READ, &e), None);
            assert_eq!(ddp_result(proc3::GETATTR, &p.reduced()), None);
        }
        // Truncated arguments: no eligible item, no panic.
        let p = write_args(&[1; 8], 0, b"data", 0);
        for cut in 0..p.xdr.len() - 4 - 4 {
            assert_eq!(ddp_argument(proc3::WRITE, &p.xdr[..cut]), None, "{cut}");
        }
    }

    #[test]
    fn xdr_builder_pads_and_counts() {
        let mut x = Xdr::new();
        x.u32(1).opaque(b"abcde").u64(7).bool(true);
        let v = x.into_vec();
        assert_eq!(v.len(), 4 + 4 + 8 + 8 + 4);
        assert_eq!(&v[4..8], &5u32.to_be_bytes());
        assert_eq!(&v[13..16], &[0, 0, 0]);
    }

    #[test]
    fn fattr_and_readdirplus_decode() {
        let mut x = Xdr::new();
        // fattr3 of a 10-octet regular file, mode 0644.
        let fa = |x: &mut Xdr, t: u32, size: u64, id: u64| {
            x.u32(t).u32(0o644).u32(1).u32(0).u32(0).u64(size).u64(4096);
            x.u32(0)
                .u32(0)
                .u64(1)
                .u64(id)
                .u32(0)
                .u32(0)
                .u32(99)
                .u32(0)
                .u32(0)
                .u32(0);
        };
        x.bool(true);
        fa(&mut x, 2, 4096, 1);
        x.fixed(&[9; 8]);
        for (i, n) in ["a", "file"].iter().enumerate() {
            x.bool(true)
                .u64(10 + i as u64)
                .opaque(n.as_bytes())
                .u64(i as u64 + 1);
            x.bool(true);
            fa(&mut x, 1, 10, 10 + i as u64);
            x.bool(true).opaque(&[i as u8; 12]);
        }
        x.bool(false).bool(true);
        let v = x.into_vec();
        let (verf, entries, eof) = readdirplus_ok(&mut XdrReader::new(&v)).unwrap();
        assert_eq!((verf, eof, entries.len()), ([9; 8], true, 2));
        assert_eq!(entries[1].name, "file");
        let a = entries[1].attr.unwrap();
        assert_eq!(
            (a.ftype, a.size, a.mode, a.mtime),
            (FileType::Regular, 10, 0o644, 99)
        );
        assert_eq!(entries[1].fh.as_deref(), Some(&[1u8; 12][..]));
    }
}
