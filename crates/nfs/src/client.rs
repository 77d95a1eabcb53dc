//! An NFSv3 client (RFC 1813) over RPC-over-RDMA (RFC 8166, with the NFS binding of
//! RFC 8267) or TCP: MOUNT over TCP (as `mountproto=tcp`), then the file operations.
//!
//! RFC 8267 §4 makes the data of READ results and WRITE arguments DDP-eligible: READ data
//! comes through a Write chunk, WRITE data leaves through a Read chunk, and READDIRPLUS
//! results come through the Reply chunk — as the Linux client does.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use softrdma::Context;
use softrdma_rpc::client::DEFAULT_MAX_IN_FLIGHT;
use softrdma_rpc::rdma::{NFS_RDMA_PORT, RdmaConfig, RdmaTransport};
use softrdma_rpc::tcp::{DEFAULT_MAX_RECORD, TcpTransport};
use softrdma_rpc::{Auth, AuthSysParams, Bulk, Client, Payload, Reconnect, ReplySpace, RpcError};
use softrdma_wire::xdr::XdrReader;

use crate::proto::*;

/// How the NFS connection travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// RPC-over-RDMA (NFS/RDMA, port 20049).
    Rdma,
    /// RPC over TCP (port 2049).
    Tcp,
}

/// Why an NFS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The RPC layer.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The server's NFS status.
    #[error(transparent)]
    Nfs(#[from] NfsError),
    /// MOUNT refused the export (`mountstat3`).
    #[error("MOUNT refused {path}: status {status}")]
    Mount {
        /// The path asked for.
        path: String,
        /// `mountstat3`.
        status: u32,
    },
    /// Connecting.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A path component that is not a directory, or a malformed path.
    #[error("{0}")]
    Path(String),
}

/// How to reach the server.
#[derive(Clone)]
pub struct NfsConfig {
    /// RDMA or TCP.
    pub proto: Proto,
    /// The NFS port (default 20049 for RDMA, 2049 for TCP).
    pub port: Option<u16>,
    /// The MOUNT port over TCP (default: what rpcbind says), as mount's `mountport=`.
    pub mount_port: Option<u16>,
    /// The RDMA device's context (RDMA only).
    pub ctx: Option<Context>,
    /// RPC-over-RDMA settings.
    pub rdma: RdmaConfig,
    /// AUTH_SYS identity.
    pub uid: u32,
    /// AUTH_SYS group.
    pub gid: u32,
    /// How long one call may take.
    pub timeout: Duration,
}

impl NfsConfig {
    /// Defaults for `proto` (identity: uid/gid 0).
    pub fn new(proto: Proto, ctx: Option<Context>) -> NfsConfig {
        NfsConfig {
            proto,
            port: None,
            mount_port: None,
            ctx,
            rdma: RdmaConfig {
                credits: 32,
                ..RdmaConfig::default()
            },
            uid: 0,
            gid: 0,
            timeout: Duration::from_secs(60),
        }
    }

    /// The NFS server's port: `port` if set; else for RDMA the NFS/RDMA port 20049 (RFC
    /// 8166 §9, RFC 8267 — no rpcbind lookup: rpcbind answers for TCP here), for TCP what
    /// `rpcbind` says, or 2049 when it has nothing.
    pub fn nfs_port(&self, rpcbind: impl FnOnce() -> Result<u16, Error>) -> Result<u16, Error> {
        Ok(match (self.port, self.proto) {
            (Some(p), _) => p,
            (None, Proto::Rdma) => NFS_RDMA_PORT,
            (None, Proto::Tcp) => match rpcbind()? {
                0 => NFS_TCP_PORT,
                p => p,
            },
        })
    }

    fn cred(&self) -> Auth {
        Auth::Sys(AuthSysParams {
            stamp: std::process::id(),
            machinename: b"softrdma".to_vec(),
            uid: self.uid,
            gid: self.gid,
            gids: vec![self.gid],
        })
    }
}

/// A mounted export.
pub struct Nfs3 {
    nfs: Client,
    mount: Client,
    export: String,
    root: Vec<u8>,
    timeout: Duration,
    /// Largest READ and WRITE (FSINFO's rtmax/wtmax, at most 1 MiB).
    pub rsize: u32,
    /// Largest WRITE.
    pub wsize: u32,
}

/// portmap GETPORT (RFC 1833) over TCP: the port of `prog`/`vers` on TCP, 0 if none.
pub fn getport(host: IpAddr, prog: u32, vers: u32) -> Result<u16, Error> {
    let pm = Client::connect_tcp(SocketAddr::new(host, 111))?;
    let mut x = Xdr::new();
    x.u32(prog).u32(vers).u32(IPPROTO_TCP).u32(0);
    let r = pm.call(PMAP_PROGRAM, PMAP_V2, 3, &x.0)?;
    let port = XdrReader::new(&r.results)
        .read_u32()
        .map_err(NfsError::from)?;
    Ok(port as u16)
}

impl Nfs3 {
    /// Mounts the shortest prefix of `path` the server exports; returns the mount and the
    /// rest of the path below it.
    pub fn mount(host: IpAddr, path: &str, cfg: &NfsConfig) -> Result<(Nfs3, String), Error> {
        let mport = match cfg.mount_port {
            Some(p) => p,
            None => getport(host, MOUNT_PROGRAM, MOUNT_V3)?,
        };
        if mport == 0 {
            return Err(Error::Path("the server has no MOUNT v3 over TCP".into()));
        }
        let mount = Client::connect_tcp(SocketAddr::new(host, mport))?;
        mount.set_cred(cfg.cred());
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let mut found = None;
        let mut last = 0;
        // Shortest prefix first: the export is a directory near the top, and MOUNT must not
        // be asked for a file below it (Linux's mountd hands out a file's handle as a root).
        for n in 1..=parts.len().max(1) {
            let n = n.min(parts.len());
            let export = format!("/{}", parts[..n].join("/"));
            let mut x = Xdr::new();
            x.opaque(export.as_bytes());
            let r = mount.call_timeout(MOUNT_PROGRAM, MOUNT_V3, 1, &x.0, cfg.timeout)?;
            let mut rd = XdrReader::new(&r.results);
            last = rd.read_u32().map_err(NfsError::from)?;
            if last == 0 {
                let fh = rd.read_opaque(FHSIZE3).map_err(NfsError::from)?.to_vec();
                found = Some((export, fh, parts[n..].join("/")));
                break;
            }
        }
        let Some((export, root, rest)) = found else {
            return Err(Error::Mount {
                path: path.to_string(),
                status: last,
            });
        };
        let nfs = match cfg.proto {
            Proto::Rdma => {
                let ctx = cfg
                    .ctx
                    .as_ref()
                    .ok_or_else(|| Error::Path("RDMA needs a device".into()))?;
                // rpcbind (portmap v2 here) knows TCP and UDP ports only: never asked.
                let port = cfg.nfs_port(|| Ok(0))?;
                // A lost connection is made again and the calls in flight retransmitted
                // (same xids: the server's reply cache knows them).
                let connect = RdmaTransport::connector(ctx, SocketAddr::new(host, port), cfg.rdma);
                Client::with_reconnect(
                    Reconnect::new(connect),
                    DEFAULT_MAX_IN_FLIGHT.min(cfg.rdma.credits.max(1) as usize),
                )?
            }
            Proto::Tcp => {
                let port = cfg.nfs_port(|| getport(host, NFS_PROGRAM, NFS_V3))?;
                let connect =
                    TcpTransport::connector(SocketAddr::new(host, port), DEFAULT_MAX_RECORD);
                Client::with_reconnect(Reconnect::new(connect), DEFAULT_MAX_IN_FLIGHT)?
            }
        };
        nfs.set_cred(cfg.cred());
        // RFC 8267: where READ's and READLINK's data belong, and a check that they came
        // through the Write chunk offered for them (RPCRDMA-75).
        nfs.bind_results(NFS_PROGRAM, NFS_V3, ddp_result);
        let mut m = Nfs3 {
            nfs,
            mount,
            export,
            root,
            timeout: cfg.timeout,
            rsize: 1 << 20,
            wsize: 1 << 20,
        };
        let root = m.root.clone();
        let (rt, wt) = m.fsinfo(&root)?;
        m.rsize = rt.clamp(4096, 1 << 20);
        m.wsize = wt.clamp(4096, 1 << 20);
        Ok((m, rest))
    }

    /// The exported path mounted.
    pub fn export(&self) -> &str {
        &self.export
    }

    /// The export's root handle.
    pub fn root(&self) -> &[u8] {
        &self.root
    }

    fn call(&self, proc: u32, args: &Payload, reply: ReplySpace) -> Result<Vec<u8>, Error> {
        Ok(self
            .nfs
            .start_with(NFS_PROGRAM, NFS_V3, proc, args, reply)?
            .wait_timeout(self.timeout)?
            .results)
    }

    fn small(&self, proc: u32, args: Xdr) -> Result<Vec<u8>, Error> {
        self.call(
            proc,
            &Payload::from(args.into_vec()),
            ReplySpace {
                max: 1024,
                ddp: None,
            },
        )
    }

    /// NULL.
    pub fn null(&self) -> Result<(), Error> {
        self.small(proc3::NULL, Xdr::new()).map(|_| ())
    }

    /// FSINFO: (rtmax, wtmax).
    pub fn fsinfo(&self, fh: &[u8]) -> Result<(u32, u32), Error> {
        let mut x = Xdr::new();
        x.opaque(fh);
        let r = self.small(proc3::FSINFO, x)?;
        let mut rd = XdrReader::new(&r);
        status(&mut rd)?;
        post_op_attr(&mut rd)?;
        let rtmax = rd.read_u32().map_err(NfsError::from)?;
        rd.skip(8).map_err(NfsError::from)?;
        let wtmax = rd.read_u32().map_err(NfsError::from)?;
        Ok((rtmax, wtmax))
    }

    /// GETATTR.
    pub fn getattr(&self, fh: &[u8]) -> Result<Fattr, Error> {
        let mut x = Xdr::new();
        x.opaque(fh);
        let r = self.small(proc3::GETATTR, x)?;
        let mut rd = XdrReader::new(&r);
        status(&mut rd)?;
        Ok(fattr(&mut rd)?)
    }

    /// LOOKUP of `name` in `dir`.
    pub fn lookup(&self, dir: &[u8], name: &str) -> Result<(Vec<u8>, Option<Fattr>), Error> {
        let mut x = Xdr::new();
        diropargs(&mut x, dir, name);
        let r = self.small(proc3::LOOKUP, x)?;
        let mut rd = XdrReader::new(&r);
        status(&mut rd)?;
        let fh = rd.read_opaque(FHSIZE3).map_err(NfsError::from)?.to_vec();
        Ok((fh, post_op_attr(&mut rd)?))
    }

    /// The handle and attributes of `path` below the export root.
    pub fn resolve(&self, path: &str) -> Result<(Vec<u8>, Fattr), Error> {
        let mut fh = self.root.clone();
        let mut attr = None;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let (f, a) = self.lookup(&fh, part)?;
            fh = f;
            attr = a;
        }
        let attr = match attr {
            Some(a) => a,
            None => self.getattr(&fh)?,
        };
        Ok((fh, attr))
    }

    /// READ `count` octets at `offset`: (data, eof). The data comes through a Write chunk
    /// over RDMA (RFC 8267 §4.2), into memory the transport takes back once `data` is
    /// dropped.
    pub fn read(&self, fh: &[u8], offset: u64, count: u32) -> Result<(Bulk, bool), Error> {
        let mut x = Xdr::new();
        x.opaque(fh).u64(offset).u32(count);
        let reply = self
            .nfs
            .start_with(
                NFS_PROGRAM,
                NFS_V3,
                proc3::READ,
                &Payload::from(x.into_vec()),
                ReplySpace {
                    max: 512,
                    ddp: Some(count as usize),
                },
            )?
            .wait_timeout(self.timeout)?;
        let mut rd = XdrReader::new(&reply.results);
        status(&mut rd)?;
        post_op_attr(&mut rd)?;
        let n = rd.read_u32().map_err(NfsError::from)? as usize;
        let eof = rd.read_bool().map_err(NfsError::from)?;
        let data = match reply.bulk {
            // The length word stays inline; the data came apart (RFC 8166 §3.4.4).
            Some(b) => {
                let len = rd.read_u32().map_err(NfsError::from)? as usize;
                if len != b.len() || n != len {
                    return Err(NfsError::Garbage.into());
                }
                b
            }
            None => Bulk::from(
                rd.read_opaque(count.max(1))
                    .map_err(NfsError::from)?
                    .to_vec(),
            ),
        };
        if data.len() != n {
            return Err(NfsError::Garbage.into());
        }
        Ok((data, eof))
    }

    /// WRITE `data` at `offset` (`stable`: 0 UNSTABLE, 2 FILE_SYNC); octets written. The data
    /// leaves through a Read chunk over RDMA when it does not fit inline (RFC 8267 §4.2).
    pub fn write(&self, fh: &[u8], offset: u64, data: &[u8], stable: u32) -> Result<u32, Error> {
        let args = write_args(fh, offset, data, stable);
        let r = self.call(
            proc3::WRITE,
            &args,
            ReplySpace {
                max: 512,
                ddp: None,
            },
        )?;
        let mut rd = XdrReader::new(&r);
        status(&mut rd)?;
        wcc_data(&mut rd)?;
        Ok(rd.read_u32().map_err(NfsError::from)?)
    }

    /// COMMIT everything written to `fh`.
    pub fn commit(&self, fh: &[u8]) -> Result<(), Error> {
        let mut x = Xdr::new();
        x.opaque(fh).u64(0).u32(0);
        let r = self.small(proc3::COMMIT, x)?;
        status(&mut XdrReader::new(&r))?;
        Ok(())
    }

    /// CREATE `name` in `dir` (UNCHECKED, `mode`, size 0): its handle.
    pub fn create(&self, dir: &[u8], name: &str, mode: u32) -> Result<Vec<u8>, Error> {
        let mut x = Xdr::new();
        diropargs(&mut x, dir, name);
        // createhow3 UNCHECKED; sattr3: mode, no uid/gid, size 0, times unchanged.
        x.u32(0).bool(true).u32(mode).bool(false).bool(false);
        x.bool(true).u64(0).u32(0).u32(0);
        let r = self.small(proc3::CREATE, x)?;
        let mut rd = XdrReader::new(&r);
        status(&mut rd)?;
        match post_op_fh(&mut rd)? {
            Some(fh) => Ok(fh),
            None => Ok(self.lookup(dir, name)?.0),
        }
    }

    /// REMOVE `name` from `dir`.
    pub fn remove(&self, dir: &[u8], name: &str) -> Result<(), Error> {
        let mut x = Xdr::new();
        diropargs(&mut x, dir, name);
        let r = self.small(proc3::REMOVE, x)?;
        status(&mut XdrReader::new(&r))?;
        Ok(())
    }

    /// Every entry of `dir` (READDIRPLUS; the results come through the Reply chunk over
    /// RDMA when they exceed the inline threshold).
    pub fn readdir(&self, dir: &[u8]) -> Result<Vec<DirEntry>, Error> {
        const MAXCOUNT: u32 = 32 * 1024;
        let mut out = Vec::new();
        let (mut cookie, mut verf) = (0u64, [0u8; 8]);
        loop {
            let mut x = Xdr::new();
            x.opaque(dir)
                .u64(cookie)
                .fixed(&verf)
                .u32(MAXCOUNT / 4)
                .u32(MAXCOUNT);
            let r = self.call(
                proc3::READDIRPLUS,
                &Payload::from(x.into_vec()),
                ReplySpace {
                    max: MAXCOUNT as usize + 512,
                    ddp: None,
                },
            )?;
            let mut rd = XdrReader::new(&r);
            status(&mut rd)?;
            let (v, entries, eof) = readdirplus_ok(&mut rd)?;
            verf = v;
            if let Some(e) = entries.last() {
                cookie = e.cookie;
            }
            let empty = entries.is_empty();
            out.extend(entries);
            if eof || empty {
                return Ok(out);
            }
        }
    }

    /// UMNT (best effort).
    pub fn unmount(&self) {
        let mut x = Xdr::new();
        x.opaque(self.export.as_bytes());
        let _ = self
            .mount
            .call_timeout(MOUNT_PROGRAM, MOUNT_V3, 3, &x.0, Duration::from_secs(5));
    }
}
