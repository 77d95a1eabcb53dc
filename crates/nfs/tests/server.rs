//! The NFSv3 server over loopback RPC-over-RDMA (iWARP and RoCE) against the in-memory
//! backend: every procedure of RFC 1813 and MOUNT v3, their error statuses, and the path
//! escapes a client may try.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use softrdma::roce::RoceConfig;
use softrdma::{Context, Device, Listener};
use softrdma_nfs::proto::{
    FHSIZE3, MOUNT_PROGRAM, MOUNT_V3, NFS_PROGRAM, NFS_V3, Xdr, ddp_result, fattr, post_op_attr,
    post_op_fh, readdirplus_ok, wcc_data,
};
use softrdma_nfs::server::{Backend, MAX_MOUNT_ENTRIES, MemFs, NfsService};
use softrdma_nfs::{Fattr, FileType};
use softrdma_rpc::rdma::{RdmaConfig, RdmaServer, RdmaTransport};
use softrdma_rpc::{
    Auth, AuthSysParams, Client, Payload, Registry, Reply, ReplySpace, ReplyStatus, RpcError,
    Server,
};
use softrdma_testkit::pattern;
use softrdma_wire::xdr::XdrReader;

#[derive(Clone, Copy, Debug)]
enum T {
    Iwarp,
    Roce,
}

fn contexts(t: T) -> (Context, Context) {
    let roce = |cfg: RoceConfig| Device::roce(cfg).open().unwrap();
    match t {
        T::Iwarp => (Device::tcp().open().unwrap(), Device::tcp().open().unwrap()),
        T::Roce => {
            let ips = [1, 2].map(|l| IpAddr::V4(Ipv4Addr::new(127, 0, 0, l)));
            let c = RoceConfig::sharing_a_port(&ips).unwrap();
            (roce(c[0]), roce(c[1]))
        }
    }
}

/// A server exporting a fresh MemFs at `/export` (and a second at `/other`), and a
/// client connected to it as uid `uid`.
struct Rig {
    _srv: RdmaServer,
    _ctxs: (Context, Context),
    nfs: Client,
    svc: NfsService,
    root: Vec<u8>,
}

fn cfg() -> RdmaConfig {
    RdmaConfig {
        credits: 16,
        max_message: (1 << 20) + 8192,
        ..RdmaConfig::default()
    }
}

fn rig(t: T, uid: u32) -> Rig {
    rig_on(t, uid, Arc::new(MemFs::new()))
}

fn rig_on(t: T, uid: u32, fs: Arc<dyn Backend>) -> Rig {
    let other: Arc<dyn Backend> = Arc::new(MemFs::new());
    let svc = NfsService::new(vec![("/export".into(), fs), ("/other/".into(), other)]);
    let mut reg = Registry::new();
    svc.register(&mut reg);
    let server = Arc::new(Server::new(reg, Default::default()));
    let (sctx, cctx) = contexts(t);
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let srv = server.serve_rdma(&sctx, l, cfg()).unwrap();
    let nfs = Client::new(
        Arc::new(RdmaTransport::connect(&cctx, srv.local_addr(), cfg()).unwrap()),
        8,
    );
    nfs.set_cred(Auth::Sys(AuthSysParams {
        stamp: 1,
        machinename: b"test".to_vec(),
        uid,
        gid: uid,
        gids: vec![uid],
    }));
    nfs.bind_results(NFS_PROGRAM, NFS_V3, ddp_result);
    let root = svc.root_handle("/export").unwrap();
    Rig {
        _srv: srv,
        _ctxs: (sctx, cctx),
        nfs,
        svc,
        root,
    }
}

impl Rig {
    fn call(&self, proc: u32, args: Xdr) -> Reply {
        self.nfs
            .call_with(
                NFS_PROGRAM,
                NFS_V3,
                proc,
                &Payload::from(args.into_vec()),
                ReplySpace {
                    max: 64 << 10,
                    ddp: None,
                },
            )
            .unwrap()
    }

    fn mount(&self, proc: u32, args: Xdr) -> Vec<u8> {
        self.nfs
            .call(MOUNT_PROGRAM, MOUNT_V3, proc, &args.into_vec())
            .unwrap()
            .results
    }

    /// (status, reader after it) of `proc`.
    fn status(&self, proc: u32, args: Xdr) -> (u32, Vec<u8>) {
        let r = self.call(proc, args);
        let mut rd = XdrReader::new(&r.results);
        let st = rd.read_u32().unwrap();
        (st, rd.rest().to_vec())
    }

    fn getattr(&self, fh: &[u8]) -> Fattr {
        let mut x = Xdr::new();
        x.opaque(fh);
        let (st, rest) = self.status(1, x);
        assert_eq!(st, 0);
        fattr(&mut XdrReader::new(&rest)).unwrap()
    }

    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<Vec<u8>, u32> {
        let mut x = Xdr::new();
        x.opaque(dir).opaque(name);
        let (st, rest) = self.status(3, x);
        if st != 0 {
            return Err(st);
        }
        Ok(XdrReader::new(&rest).read_opaque(FHSIZE3).unwrap().to_vec())
    }

    /// CREATE (UNCHECKED, mode 0644) → handle.
    fn create(&self, dir: &[u8], name: &[u8], how: u32, verf: [u8; 8]) -> Result<Vec<u8>, u32> {
        let mut x = Xdr::new();
        x.opaque(dir).opaque(name).u32(how);
        if how == 2 {
            x.fixed(&verf);
        } else {
            sattr(&mut x, Some(0o644), None);
        }
        new_handle(self.status(8, x))
    }

    fn mkdir(&self, dir: &[u8], name: &[u8]) -> Result<Vec<u8>, u32> {
        let mut x = Xdr::new();
        x.opaque(dir).opaque(name);
        sattr(&mut x, Some(0o755), None);
        new_handle(self.status(9, x))
    }

    fn write(&self, fh: &[u8], off: u64, data: &[u8], stable: u32) -> (u32, u32, [u8; 8]) {
        let mut x = Xdr::new();
        x.opaque(fh).u64(off).u32(data.len() as u32).u32(stable);
        let args = Payload::with_opaque(x.into_vec(), data);
        let r = self
            .nfs
            .call_with(
                NFS_PROGRAM,
                NFS_V3,
                7,
                &args,
                ReplySpace {
                    max: 512,
                    ddp: None,
                },
            )
            .unwrap();
        let mut rd = XdrReader::new(&r.results);
        assert_eq!(rd.read_u32().unwrap(), 0, "WRITE status");
        wcc_data(&mut rd).unwrap();
        let n = rd.read_u32().unwrap();
        let how = rd.read_u32().unwrap();
        let verf = rd.read_opaque_fixed(8).unwrap().try_into().unwrap();
        (n, how, verf)
    }

    /// READ with a Write chunk for the data: (data, eof).
    fn read(&self, fh: &[u8], off: u64, count: u32) -> (Vec<u8>, bool) {
        let mut x = Xdr::new();
        x.opaque(fh).u64(off).u32(count);
        let r = self
            .nfs
            .call_with(
                NFS_PROGRAM,
                NFS_V3,
                6,
                &Payload::from(x.into_vec()),
                ReplySpace {
                    max: 512,
                    ddp: Some(count as usize),
                },
            )
            .unwrap();
        let whole = r.unreduced().expect("the data has a place");
        let mut rd = XdrReader::new(&whole);
        assert_eq!(rd.read_u32().unwrap(), 0, "READ status");
        post_op_attr(&mut rd).unwrap();
        let n = rd.read_u32().unwrap();
        let eof = rd.read_bool().unwrap();
        let data = rd.read_opaque(u32::MAX).unwrap().to_vec();
        assert_eq!(data.len(), n as usize);
        (data, eof)
    }

    fn readdir_names(&self, dir: &[u8], plus: bool, count: u32) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let mut x = Xdr::new();
            x.opaque(dir).u64(cookie).fixed(&[0; 8]).u32(count);
            if plus {
                x.u32(count);
            }
            let (st, rest) = self.status(if plus { 17 } else { 16 }, x);
            assert_eq!(st, 0, "READDIR status");
            let mut rd = XdrReader::new(&rest);
            if plus {
                // readdirplus_ok reads from the post_op_attr on.
                let (_, entries, eof) = readdirplus_ok(&mut rd).unwrap();
                assert!(!entries.is_empty() || eof, "progress");
                for e in &entries {
                    out.push((e.name.clone(), e.fh.clone().unwrap()));
                    cookie = e.cookie;
                }
                if eof {
                    return out;
                }
            } else {
                post_op_attr(&mut rd).unwrap();
                rd.read_opaque_fixed(8).unwrap();
                let mut any = false;
                while rd.read_bool().unwrap() {
                    let _id = rd.read_u64().unwrap();
                    let name = rd.read_string(255).unwrap().to_string();
                    cookie = rd.read_u64().unwrap();
                    out.push((name, Vec::new()));
                    any = true;
                }
                let eof = rd.read_bool().unwrap();
                assert!(any || eof, "progress");
                if eof {
                    return out;
                }
            }
        }
    }
}

fn sattr(x: &mut Xdr, mode: Option<u32>, size: Option<u64>) {
    match mode {
        Some(m) => x.bool(true).u32(m),
        None => x.bool(false),
    };
    x.bool(false).bool(false); // uid, gid
    match size {
        Some(s) => x.bool(true).u64(s),
        None => x.bool(false),
    };
    x.u32(0).u32(0); // atime, mtime: don't change
}

/// CREATE/MKDIR/SYMLINK results → the new handle.
fn new_handle((st, rest): (u32, Vec<u8>)) -> Result<Vec<u8>, u32> {
    if st != 0 {
        return Err(st);
    }
    Ok(post_op_fh(&mut XdrReader::new(&rest))
        .unwrap()
        .expect("a handle"))
}

const NOENT: u32 = 2;
const ACCES: u32 = 13;
const EXIST: u32 = 17;
const NOTDIR: u32 = 20;
const ISDIR: u32 = 21;
const INVAL: u32 = 22;
const NOTEMPTY: u32 = 66;
const STALE: u32 = 70;
const BADHANDLE: u32 = 10001;
const NOT_SYNC: u32 = 10002;
const NOTSUPP: u32 = 10004;
const BADTYPE: u32 = 10007;

#[test]
fn mount_v3_mnt_export_dump_umnt() {
    for t in [T::Iwarp, T::Roce] {
        let r = rig(t, 0);
        let mnt = |path: &str| {
            let mut x = Xdr::new();
            x.opaque(path.as_bytes());
            r.mount(1, x)
        };
        let ok = mnt("/export/");
        let mut rd = XdrReader::new(&ok);
        assert_eq!(rd.read_u32().unwrap(), 0, "{t:?}");
        assert_eq!(rd.read_opaque(FHSIZE3).unwrap(), &r.root[..]);
        let flavors: Vec<u32> = (0..rd.read_u32().unwrap())
            .map(|_| rd.read_u32().unwrap())
            .collect();
        assert!(flavors.contains(&1), "AUTH_SYS offered: {flavors:?}");
        assert_eq!(XdrReader::new(&mnt("/nope")).read_u32().unwrap(), NOENT);
        // A path that climbs is refused, whatever it would resolve to.
        assert_ne!(
            XdrReader::new(&mnt("/export/../other")).read_u32().unwrap(),
            0
        );
        // A directory below an export mounts; a file does not.
        r.mkdir(&r.root, b"sub").unwrap();
        r.create(&r.root, b"f", 0, [0; 8]).unwrap();
        assert_eq!(XdrReader::new(&mnt("/export/sub")).read_u32().unwrap(), 0);
        assert_eq!(
            XdrReader::new(&mnt("/export/f")).read_u32().unwrap(),
            NOTDIR
        );
        // EXPORT lists both; DUMP shows our mounts until UMNT.
        let ex = r.mount(5, Xdr::new());
        let mut rd = XdrReader::new(&ex);
        let mut dirs = Vec::new();
        while rd.read_bool().unwrap() {
            dirs.push(rd.read_string(1024).unwrap().to_string());
            assert!(!rd.read_bool().unwrap(), "no groups");
        }
        assert_eq!(dirs, ["/export", "/other"]);
        let dump = r.mount(2, Xdr::new());
        let mut rd = XdrReader::new(&dump);
        assert!(rd.read_bool().unwrap());
        let host: IpAddr = rd.read_string(255).unwrap().parse().unwrap();
        assert!(host.is_loopback(), "{t:?} {host}");
        assert_eq!(rd.read_string(1024).unwrap(), "/export");
        let mut x = Xdr::new();
        x.opaque(b"/export");
        r.mount(3, x);
        let mut x = Xdr::new();
        x.opaque(b"/export/sub");
        r.mount(3, x);
        assert!(!XdrReader::new(&r.mount(2, Xdr::new())).read_bool().unwrap());
        assert!(
            r.svc
                .stats()
                .mount_calls
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 9
        );
    }
}

/// A MNT flood: the same mount again and again is listed once, and mounts of more
/// directories than DUMP keeps leave it at its bound with the newest listed.
#[test]
fn mnt_floods_keep_dump_bounded() {
    let r = rig(T::Iwarp, 0);
    let mnt = |path: &str| {
        let mut x = Xdr::new();
        x.opaque(path.as_bytes());
        XdrReader::new(&r.mount(1, x)).read_u32().unwrap()
    };
    let dump = || {
        let d = r.mount(2, Xdr::new());
        let mut rd = XdrReader::new(&d);
        let mut dirs = Vec::new();
        while rd.read_bool().unwrap() {
            rd.read_string(255).unwrap();
            dirs.push(rd.read_string(1024).unwrap().to_string());
        }
        dirs
    };
    for _ in 0..3000 {
        assert_eq!(mnt("/export"), 0);
    }
    assert_eq!(dump(), ["/export"]);
    let n = MAX_MOUNT_ENTRIES + 40;
    for i in 0..n {
        let name = format!("d{i}");
        r.mkdir(&r.root, name.as_bytes()).unwrap();
        assert_eq!(mnt(&format!("/export/{name}")), 0);
    }
    let dirs = dump();
    assert_eq!(dirs.len(), MAX_MOUNT_ENTRIES);
    assert_eq!(dirs.last().unwrap(), &format!("/export/d{}", n - 1));
    assert!(!dirs.contains(&"/export".to_string()), "the oldest went");
}

/// RFC 5531 §9: a procedure NFSv3 does not have is PROC_UNAVAIL, not GARBAGE_ARGS, with
/// arguments or without.
#[test]
fn unknown_nfs3_procedures_are_proc_unavail() {
    let r = rig(T::Iwarp, 0);
    for proc in [22, 23, 100, u32::MAX] {
        for args in [Vec::new(), r.root.clone(), vec![0xFF; 64]] {
            let got = r.nfs.call(NFS_PROGRAM, NFS_V3, proc, &args);
            assert!(
                matches!(got, Err(RpcError::Status(ReplyStatus::ProcUnavail))),
                "{proc}: {got:?}"
            );
        }
        let got = r.nfs.call(MOUNT_PROGRAM, MOUNT_V3, proc, &[]);
        assert!(
            matches!(got, Err(RpcError::Status(ReplyStatus::ProcUnavail))),
            "MOUNT {proc}: {got:?}"
        );
    }
}

#[test]
fn files_are_written_read_and_committed() {
    for t in [T::Iwarp, T::Roce] {
        let r = rig(t, 0);
        let fh = r.create(&r.root, b"data", 0, [0; 8]).unwrap();
        for (size, stable) in [(0usize, 2u32), (1, 0), (4095, 1), (4097, 0), (1 << 20, 2)] {
            let data = pattern(size, u64::from(size as u8));
            let (n, how, verf) = r.write(&fh, 0, &data, stable);
            assert_eq!(n as usize, size, "{t:?}");
            assert!(how >= stable, "committed at least as asked");
            let (got, eof) = r.read(&fh, 0, size.max(1) as u32);
            assert_eq!(got, data, "{t:?} {size}");
            assert!(eof || size == 0);
            // COMMIT answers the same verifier as WRITE (no restart in between).
            let mut x = Xdr::new();
            x.opaque(&fh).u64(0).u32(0);
            let (st, rest) = r.status(21, x);
            assert_eq!(st, 0);
            let mut rd = XdrReader::new(&rest);
            wcc_data(&mut rd).unwrap();
            assert_eq!(rd.read_opaque_fixed(8).unwrap(), &verf);
            // Shrink for the next size.
            let mut x = Xdr::new();
            x.opaque(&fh);
            sattr(&mut x, None, Some(0));
            x.bool(false);
            assert_eq!(r.status(2, x).0, 0);
        }
        // A read past the end: nothing, eof.
        r.write(&fh, 0, b"abc", 2);
        assert_eq!(r.read(&fh, 10, 100), (Vec::new(), true));
        assert_eq!(r.read(&fh, 1, 100), (b"bc".to_vec(), true));
        assert_eq!(r.read(&fh, 0, 2), (b"ab".to_vec(), false));
        // A write beyond the end leaves a hole of zeros.
        r.write(&fh, 8, b"z", 2);
        assert_eq!(r.read(&fh, 0, 100).0, b"abc\0\0\0\0\0z");
        assert_eq!(r.getattr(&fh).size, 9);
        let s = r.svc.stats();
        assert!(s.bytes_read.load(std::sync::atomic::Ordering::Relaxed) > 1 << 20);
        assert!(s.bytes_written.load(std::sync::atomic::Ordering::Relaxed) > 1 << 20);
    }
}

#[test]
fn every_namespace_procedure_and_its_errors() {
    namespace_procedures(&rig(T::Iwarp, 0));
}

/// The same over a local directory: the protocol answers the same for a real filesystem.
#[test]
fn every_namespace_procedure_on_a_local_directory() {
    let dir = std::env::temp_dir().join(format!("softrdma-nfsd-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    namespace_procedures(&rig_on(
        T::Roce,
        0,
        Arc::new(softrdma_nfs::server::LocalFs::new(&dir).unwrap()),
    ));
    // Nothing was made outside the export through the link to /etc/passwd.
    assert!(dir.join("ln").symlink_metadata().is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn namespace_procedures(r: &Rig) {
    let root = r.root.clone();
    // NULL answers with nothing.
    assert!(r.call(0, Xdr::new()).results.is_empty());
    // GETATTR, LOOKUP . and ..
    assert_eq!(r.getattr(&root).ftype, FileType::Directory);
    assert_eq!(r.lookup(&root, b".").unwrap(), root);
    assert_eq!(
        r.lookup(&root, b"..").unwrap(),
        root,
        "the root is its own parent"
    );
    assert_eq!(r.lookup(&root, b"missing"), Err(NOENT));
    assert_eq!(r.lookup(&root, b"a/b"), Err(INVAL));
    // CREATE: unchecked twice is fine, guarded on a taken name is EXIST, exclusive is
    // idempotent for its verifier only.
    let f = r.create(&root, b"f", 0, [0; 8]).unwrap();
    assert_eq!(r.create(&root, b"f", 0, [0; 8]).unwrap(), f);
    assert_eq!(r.create(&root, b"f", 1, [0; 8]), Err(EXIST));
    let e1 = r.create(&root, b"x", 2, [7; 8]).unwrap();
    assert_eq!(
        r.create(&root, b"x", 2, [7; 8]).unwrap(),
        e1,
        "a retransmission"
    );
    assert_eq!(r.create(&root, b"x", 2, [8; 8]), Err(EXIST));
    assert_eq!(r.lookup(&f, b"y"), Err(NOTDIR));
    // MKDIR, and the new directory's `..`.
    let d = r.mkdir(&root, b"d").unwrap();
    assert_eq!(r.mkdir(&root, b"d"), Err(EXIST));
    assert_eq!(r.lookup(&d, b"..").unwrap(), root);
    let inner = r.create(&d, b"inner", 0, [0; 8]).unwrap();
    // SYMLINK and READLINK; the server never follows a link.
    let mut x = Xdr::new();
    x.opaque(&root).opaque(b"ln");
    sattr(&mut x, None, None);
    x.opaque(b"/etc/passwd");
    let ln = new_handle(r.status(10, x)).unwrap();
    assert_eq!(r.getattr(&ln).ftype, FileType::Symlink);
    // Never a directory to look through, wherever it points.
    assert_eq!(r.lookup(&ln, b"passwd"), Err(NOTDIR));
    let mut x = Xdr::new();
    x.opaque(&ln);
    let rl = r.call(5, x);
    let whole = rl.unreduced().unwrap();
    let mut rd = XdrReader::new(&whole);
    assert_eq!(rd.read_u32().unwrap(), 0);
    post_op_attr(&mut rd).unwrap();
    assert_eq!(rd.read_opaque(1024).unwrap(), b"/etc/passwd");
    let mut x = Xdr::new();
    x.opaque(&ln).u64(0).u32(10);
    assert_eq!(r.status(6, x).0, INVAL, "READ of a link");
    let mut x = Xdr::new();
    x.opaque(&f);
    assert_eq!(r.status(5, x).0, INVAL, "READLINK of a file");
    // MKNOD: a FIFO is not supported here; a regular file is the wrong procedure.
    for (ty, want) in [(7u32, NOTSUPP), (1, BADTYPE)] {
        let mut x = Xdr::new();
        x.opaque(&root).opaque(b"node").u32(ty);
        if ty == 7 {
            sattr(&mut x, None, None);
        }
        assert_eq!(r.status(11, x).0, want);
    }
    // LINK: a second name, two links.
    let mut x = Xdr::new();
    x.opaque(&f).opaque(&d).opaque(b"f2");
    assert_eq!(r.status(15, x).0, 0);
    assert_eq!(r.getattr(&f).nlink, 2);
    assert_eq!(r.lookup(&d, b"f2").unwrap(), f);
    // RENAME across directories, and over an existing file.
    let mut x = Xdr::new();
    x.opaque(&d).opaque(b"inner").opaque(&root).opaque(b"moved");
    assert_eq!(r.status(14, x).0, 0);
    assert_eq!(r.lookup(&root, b"moved").unwrap(), inner);
    assert_eq!(r.lookup(&d, b"inner"), Err(NOENT));
    let mut x = Xdr::new();
    x.opaque(&root)
        .opaque(b"missing")
        .opaque(&root)
        .opaque(b"z");
    assert_eq!(r.status(14, x).0, NOENT);
    let mut x = Xdr::new();
    x.opaque(&root).opaque(b"d").opaque(&d).opaque(b"loop");
    assert_eq!(r.status(14, x).0, INVAL, "a directory into itself");
    // REMOVE and RMDIR.
    let rm = |dir: &[u8], name: &[u8], proc| {
        let mut x = Xdr::new();
        x.opaque(dir).opaque(name);
        r.status(proc, x).0
    };
    assert_eq!(rm(&root, b"d", 12), ISDIR);
    assert_eq!(rm(&root, b"d", 13), NOTEMPTY);
    assert_eq!(rm(&root, b"f", 13), NOTDIR);
    assert_eq!(rm(&root, b"nothing", 12), NOENT);
    assert_eq!(rm(&d, b"f2", 12), 0);
    assert_eq!(r.getattr(&f).nlink, 1);
    assert_eq!(rm(&root, b"d", 13), 0);
    assert_eq!(rm(&root, b"moved", 12), 0);
    // A removed file's handle is stale.
    let mut x = Xdr::new();
    x.opaque(&inner);
    assert_eq!(r.status(1, x).0, STALE);
    // SETATTR with a ctime guard that does not match.
    let a = r.getattr(&f);
    let mut x = Xdr::new();
    x.opaque(&f);
    sattr(&mut x, Some(0o600), None);
    x.bool(true).u32(1).u32(2);
    assert_eq!(r.status(2, x).0, NOT_SYNC);
    assert_eq!(r.getattr(&f).mode, a.mode, "unchanged");
    let mut x = Xdr::new();
    x.opaque(&f);
    sattr(&mut x, Some(0o600), None);
    x.bool(false);
    assert_eq!(r.status(2, x).0, 0);
    assert_eq!(r.getattr(&f).mode, 0o600);
    // FSSTAT, FSINFO (1 MiB transfers for RDMA), PATHCONF.
    let mut x = Xdr::new();
    x.opaque(&root);
    let (st, rest) = r.status(19, x);
    assert_eq!(st, 0);
    let mut rd = XdrReader::new(&rest);
    post_op_attr(&mut rd).unwrap();
    assert_eq!(rd.read_u32().unwrap(), 1 << 20, "rtmax");
    for proc in [18, 20] {
        let mut x = Xdr::new();
        x.opaque(&root);
        assert_eq!(r.status(proc, x).0, 0);
    }
    let counted = r.svc.stats().calls[14].load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(counted, 3, "RENAME calls counted");
}

#[test]
fn access_follows_mode_and_credential() {
    let root_rig = rig(T::Iwarp, 0);
    let f = root_rig
        .create(&root_rig.root, b"secret", 0, [0; 8])
        .unwrap();
    let mut x = Xdr::new();
    x.opaque(&f);
    sattr(&mut x, Some(0o600), None);
    x.bool(false);
    assert_eq!(root_rig.status(2, x).0, 0);
    let access = |r: &Rig, fh: &[u8]| {
        let mut x = Xdr::new();
        x.opaque(fh).u32(0x3f);
        let (st, rest) = r.status(4, x);
        assert_eq!(st, 0);
        let mut rd = XdrReader::new(&rest);
        post_op_attr(&mut rd).unwrap();
        rd.read_u32().unwrap()
    };
    assert_eq!(access(&root_rig, &f) & 0x5, 0x5, "root reads and modifies");
    assert_eq!(access(&root_rig, &f) & 0x20, 0, "nobody may execute it");
    assert_eq!(
        access(&root_rig, &root_rig.root) & 0x2,
        0x2,
        "lookup in a dir"
    );
    // Another user sees it through the same server as mode 0600 of uid 0: nothing.
    let user = Client::new(
        Arc::new(
            RdmaTransport::connect(
                &Device::tcp().open().unwrap(),
                root_rig._srv.local_addr(),
                cfg(),
            )
            .unwrap(),
        ),
        4,
    );
    user.set_cred(Auth::Sys(AuthSysParams {
        stamp: 2,
        machinename: b"u".to_vec(),
        uid: 1000,
        gid: 1000,
        gids: vec![1000],
    }));
    let mut x = Xdr::new();
    x.opaque(&f).u32(0x3f);
    let res = user
        .call(NFS_PROGRAM, NFS_V3, 4, &x.into_vec())
        .unwrap()
        .results;
    let mut rd = XdrReader::new(&res);
    assert_eq!(rd.read_u32().unwrap(), 0);
    post_op_attr(&mut rd).unwrap();
    assert_eq!(
        rd.read_u32().unwrap(),
        0,
        "uid 1000: no access to 0600 of uid 0"
    );
    let as_user = |proc: u32, x: Xdr| {
        let res = user
            .call(NFS_PROGRAM, NFS_V3, proc, &x.into_vec())
            .unwrap()
            .results;
        XdrReader::new(&res).read_u32().unwrap()
    };
    // What ACCESS says is what the procedures do: no READ, no WRITE, no SETATTR of
    // another's file, no new name in another's 0755 directory.
    let mut x = Xdr::new();
    x.opaque(&f).u64(0).u32(10);
    assert_eq!(as_user(6, x), ACCES, "READ");
    let mut x = Xdr::new();
    x.opaque(&f).u64(0).u32(1).u32(2).opaque(b"x");
    assert_eq!(as_user(7, x), ACCES, "WRITE");
    let mut x = Xdr::new();
    x.opaque(&f);
    sattr(&mut x, Some(0o777), None);
    x.bool(false);
    assert_eq!(as_user(2, x), 1, "SETATTR of another's file: PERM");
    let mut x = Xdr::new();
    x.opaque(&root_rig.root).opaque(b"mine").u32(0);
    sattr(&mut x, Some(0o644), None);
    assert_eq!(as_user(8, x), ACCES, "CREATE in root's 0755 directory");
    let mut x = Xdr::new();
    x.opaque(&root_rig.root).opaque(b"secret");
    assert_eq!(as_user(12, x), ACCES, "REMOVE from it");
    // Root opens the directory to everyone.
    let mut x = Xdr::new();
    x.opaque(&root_rig.root);
    sattr(&mut x, Some(0o777), None);
    x.bool(false);
    assert_eq!(root_rig.status(2, x).0, 0);
    // Files a user creates are theirs.
    let mut x = Xdr::new();
    x.opaque(&root_rig.root).opaque(b"mine").u32(0);
    sattr(&mut x, Some(0o644), None);
    let res = user
        .call(NFS_PROGRAM, NFS_V3, 8, &x.into_vec())
        .unwrap()
        .results;
    let mut rd = XdrReader::new(&res);
    assert_eq!(rd.read_u32().unwrap(), 0);
    let fh = post_op_fh(&mut rd).unwrap().unwrap();
    let a = root_rig.getattr(&fh);
    assert_eq!((a.uid, a.mode), (1000, 0o644));
    // Its owner writes it even at mode 0444 (the owner override of Linux's nfsd).
    let mut x = Xdr::new();
    x.opaque(&fh);
    sattr(&mut x, Some(0o444), None);
    x.bool(false);
    assert_eq!(as_user(2, x), 0);
    let mut x = Xdr::new();
    x.opaque(&fh).u64(0).u32(1).u32(2).opaque(b"x");
    assert_eq!(as_user(7, x), 0, "WRITE by the owner");
}

#[test]
fn readdir_pages_through_many_entries() {
    let r = rig(T::Iwarp, 0);
    let d = r.mkdir(&r.root, b"many").unwrap();
    let mut want: Vec<String> = (0..200).map(|i| format!("file-{i:03}")).collect();
    for n in &want {
        r.create(&d, n.as_bytes(), 0, [0; 8]).unwrap();
    }
    want.push(".".into());
    want.push("..".into());
    want.sort();
    for (plus, count) in [(false, 512), (false, 8192), (true, 1024), (true, 32768)] {
        let got = r.readdir_names(&d, plus, count);
        let mut names: Vec<String> = got.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        assert_eq!(names, want, "plus {plus} count {count}");
        if plus {
            // Each handle READDIRPLUS gives is the one LOOKUP gives.
            for (n, fh) in got.iter().filter(|(n, _)| n.starts_with("file-")).take(5) {
                assert_eq!(&r.lookup(&d, n.as_bytes()).unwrap(), fh);
            }
        }
    }
    // Too small for a single entry.
    let mut x = Xdr::new();
    x.opaque(&d).u64(0).fixed(&[0; 8]).u32(64);
    assert_eq!(r.status(16, x).0, 10005, "TOOSMALL");
}

#[test]
fn handles_from_elsewhere_are_refused() {
    let r = rig(T::Iwarp, 0);
    // Malformed: wrong length, wrong magic.
    for bad in [vec![], vec![1; 8], vec![0; 20], r.root[..19].to_vec()] {
        let mut x = Xdr::new();
        x.opaque(&bad);
        assert_eq!(r.status(1, x).0, BADHANDLE, "{bad:?}");
    }
    // Well formed but of an export this server does not have.
    let mut other = r.root.clone();
    other[4] ^= 0xFF;
    let mut x = Xdr::new();
    x.opaque(&other);
    assert_eq!(r.status(1, x).0, STALE);
    // Of the other export: valid there, but no link or rename crosses exports.
    let oroot = r.svc.root_handle("/other").unwrap();
    assert_ne!(oroot, r.root);
    let f = r.create(&r.root, b"f", 0, [0; 8]).unwrap();
    let mut x = Xdr::new();
    x.opaque(&f).opaque(&oroot).opaque(b"f");
    assert_eq!(r.status(15, x).0, 18, "XDEV");
    let mut x = Xdr::new();
    x.opaque(&r.root).opaque(b"f").opaque(&oroot).opaque(b"g");
    assert_eq!(r.status(14, x).0, 18, "XDEV");
    // `..` never leaves the export.
    let sub = r.mkdir(&r.root, b"s").unwrap();
    let up = r.lookup(&sub, b"..").unwrap();
    assert_eq!(r.lookup(&up, b"..").unwrap(), r.root);
    // Names that are not components.
    for bad in [&b"."[..], b"..", b"", b"a/b"] {
        assert_eq!(r.create(&r.root, bad, 0, [0; 8]), Err(INVAL), "{bad:?}");
    }
    assert_eq!(
        r.create(&r.root, &[b'n'; 256], 0, [0; 8]),
        Err(63),
        "NAMETOOLONG"
    );
}

/// portmap v2 as `softrdma nfsd` runs it when no rpcbind does: SET and UNSET from this host
/// (what `register_with_rpcbind` sends), GETPORT over TCP and over UDP, and the version
/// mismatch that makes rpcbind clients fall back to v2.
#[test]
fn portmap_answers_and_takes_registrations() {
    use softrdma_nfs::proto::{PMAP_PROGRAM, PMAP_V2};
    use softrdma_nfs::server::portmap::{TCP, UDP};
    use softrdma_nfs::server::{Mapping, PortMap, register_with_rpcbind};
    use softrdma_rpc::msg::{decode_reply, encode_call};
    use softrdma_rpc::{CallHeader, ReplyStatus};

    let pm = PortMap::new(&[]);
    let mut reg = Registry::new();
    pm.register(&mut reg);
    let server = Arc::new(Server::new(reg, Default::default()));
    let tcp = server
        .serve_tcp(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let udp = server
        .serve_udp(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let mount = |prot| Mapping {
        prog: MOUNT_PROGRAM,
        vers: MOUNT_V3,
        prot,
        port: 2049,
    };
    let nfs = Mapping {
        prog: NFS_PROGRAM,
        vers: NFS_V3,
        prot: TCP,
        port: 2049,
    };
    assert!(register_with_rpcbind(tcp.local_addr(), &[nfs, mount(TCP), mount(UDP)]).unwrap());
    // Again: UNSET first, so a restarted server registers over its old entries.
    assert!(register_with_rpcbind(tcp.local_addr(), &[nfs, mount(TCP), mount(UDP)]).unwrap());
    assert_eq!(pm.getport(MOUNT_PROGRAM, MOUNT_V3, TCP), 2049);
    assert_eq!(pm.getport(MOUNT_PROGRAM, MOUNT_V3, UDP), 2049);
    assert_eq!(pm.getport(NFS_PROGRAM, 4, TCP), 0, "not registered");
    // GETPORT over UDP: one call per datagram.
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let ask = |vers: u32, xid: u32| {
        let mut args = Xdr::new();
        args.u32(NFS_PROGRAM).u32(3).u32(TCP).u32(0);
        let mut msg = Vec::new();
        let h = CallHeader {
            xid,
            prog: PMAP_PROGRAM,
            vers,
            proc: 3,
            cred: Auth::None,
            verf: Auth::None,
        };
        encode_call(&h, &args.0, &mut msg).unwrap();
        s.send_to(&msg, udp.local_addr()).unwrap();
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf).unwrap();
        let (rh, off) = decode_reply(&buf[..n]).unwrap();
        assert_eq!(rh.xid, xid);
        (rh.status, buf[off..n].to_vec())
    };
    let (st, res) = ask(PMAP_V2, 7);
    assert_eq!(st, ReplyStatus::Success);
    assert_eq!(XdrReader::new(&res).read_u32().unwrap(), 2049);
    // rpcbind v3/v4 is not spoken: PROG_MISMATCH 2..2.
    let (st, _) = ask(4, 8);
    assert_eq!(st, ReplyStatus::ProgMismatch { low: 2, high: 2 });
    // No registration after the server is gone.
    let gone = tcp.local_addr();
    drop((tcp, udp, server));
    assert!(!register_with_rpcbind(gone, &[nfs]).unwrap());
}
