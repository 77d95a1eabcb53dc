//! Names of the ONC RPC programs around NFS and of their procedures, as Wireshark's
//! dissectors name them (packet-nfs.c, packet-mount.c, packet-portmap.c, packet-nlm.c,
//! packet-stat.c, packet-nfsacl.c), so that `softrdma decode` reads like tshark.

use crate::proto::{MOUNT_PROGRAM, NFS_PROGRAM, PMAP_PROGRAM};

/// NLM, the Network Lock Manager.
pub const NLM_PROGRAM: u32 = 100_021;
/// NSM, the Network Status Monitor (tshark's "STAT").
pub const NSM_PROGRAM: u32 = 100_024;
/// NFS ACL (the Linux/Solaris side protocol of NFSv3).
pub const NFSACL_PROGRAM: u32 = 100_227;

/// The program's name (tshark's protocol column), e.g. `NFS`, `MOUNT`, `Portmap`.
pub fn program_name(prog: u32) -> Option<&'static str> {
    Some(match prog {
        NFS_PROGRAM => "NFS",
        MOUNT_PROGRAM => "MOUNT",
        PMAP_PROGRAM => "Portmap",
        NLM_PROGRAM => "NLM",
        NSM_PROGRAM => "STAT",
        NFSACL_PROGRAM => "NFSACL",
        _ => return None,
    })
}

/// RFC 1094 §2.2.
const NFS2: &[&str] = &[
    "NULL",
    "GETATTR",
    "SETATTR",
    "ROOT",
    "LOOKUP",
    "READLINK",
    "READ",
    "WRITECACHE",
    "WRITE",
    "CREATE",
    "REMOVE",
    "RENAME",
    "LINK",
    "SYMLINK",
    "MKDIR",
    "RMDIR",
    "READDIR",
    "STATFS",
];
/// RFC 1813 §3.
const NFS3: &[&str] = &[
    "NULL",
    "GETATTR",
    "SETATTR",
    "LOOKUP",
    "ACCESS",
    "READLINK",
    "READ",
    "WRITE",
    "CREATE",
    "MKDIR",
    "SYMLINK",
    "MKNOD",
    "REMOVE",
    "RMDIR",
    "RENAME",
    "LINK",
    "READDIR",
    "READDIRPLUS",
    "FSSTAT",
    "FSINFO",
    "PATHCONF",
    "COMMIT",
];
/// RFC 7530 §16, RFC 8881 §16: every minor version.
const NFS4: &[&str] = &["NULL", "COMPOUND"];
/// RFC 1094 App. A and RFC 1813 App. I (v1 and v2 lack v3's names only in meaning).
const MOUNT: &[&str] = &["NULL", "MNT", "DUMP", "UMNT", "UMNTALL", "EXPORT"];
/// Version 2 adds EXPORTALL and PATHCONF.
const MOUNT2: &[&str] = &[
    "NULL",
    "MNT",
    "DUMP",
    "UMNT",
    "UMNTALL",
    "EXPORT",
    "EXPORTALL",
    "PATHCONF",
];
/// RFC 1833 §3.2.
const PMAP2: &[&str] = &["NULL", "SET", "UNSET", "GETPORT", "DUMP", "CALLIT"];
/// RFC 1833 §2.2 (rpcbind 3).
const RPCB3: &[&str] = &[
    "NULL",
    "SET",
    "UNSET",
    "GETADDR",
    "DUMP",
    "CALLIT",
    "GETTIME",
    "UADDR2TADDR",
    "TADDR2UADDR",
];
/// RFC 1833 §2.2 (rpcbind 4).
const RPCB4: &[&str] = &[
    "NULL",
    "SET",
    "UNSET",
    "GETADDR",
    "DUMP",
    "BCAST",
    "GETTIME",
    "UADDR2TADDR",
    "TADDR2UADDR",
    "GETVERSADDR",
    "INDIRECT",
    "GETADDRLIST",
    "GETSTAT",
];
/// NLM versions 1 to 4 (XNFS, ch. 10); 16 to 19 are unused.
const NLM: &[&str] = &[
    "NULL",
    "TEST",
    "LOCK",
    "CANCEL",
    "UNLOCK",
    "GRANTED",
    "TEST_MSG",
    "LOCK_MSG",
    "CANCEL_MSG",
    "UNLOCK_MSG",
    "GRANTED_MSG",
    "TEST_RES",
    "LOCK_RES",
    "CANCEL_RES",
    "UNLOCK_RES",
    "GRANTED_RES",
    "",
    "",
    "",
    "",
    "SHARE",
    "UNSHARE",
    "NM_LOCK",
    "FREE_ALL",
];
/// NSM version 1 (XNFS, ch. 11).
const NSM: &[&str] = &[
    "NULL",
    "STAT",
    "MON",
    "UNMON",
    "UNMON_ALL",
    "SIMU_CRASH",
    "NOTIFY",
];
/// Linux's nfsacl (fs/nfsd/nfs3acl.c).
const NFSACL: &[&str] = &["NULL", "GETACL", "SETACL"];

/// The name of procedure `proc` of `prog` version `vers`, e.g. `GETATTR`, `MNT`, `GETPORT`.
pub fn procedure_name(prog: u32, vers: u32, proc: u32) -> Option<&'static str> {
    let names = match (prog, vers) {
        (NFS_PROGRAM, 2) => NFS2,
        (NFS_PROGRAM, 3) => NFS3,
        (NFS_PROGRAM, 4) => NFS4,
        (MOUNT_PROGRAM, 1 | 3) => MOUNT,
        (MOUNT_PROGRAM, 2) => MOUNT2,
        (PMAP_PROGRAM, 2) => PMAP2,
        (PMAP_PROGRAM, 3) => RPCB3,
        (PMAP_PROGRAM, 4) => RPCB4,
        (NLM_PROGRAM, 1..=4) => NLM,
        (NSM_PROGRAM, 1) => NSM,
        (NFSACL_PROGRAM, 3) => NFSACL,
        _ => return None,
    };
    names
        .get(usize::try_from(proc).ok()?)
        .copied()
        .filter(|n| !n.is_empty())
}

/// NFSv4 operations, from 3 (RFC 7530 §16, RFC 8881 §18, RFC 7862 §15, RFC 8276 §8).
const NFS4_OPS: &[&str] = &[
    "ACCESS",
    "CLOSE",
    "COMMIT",
    "CREATE",
    "DELEGPURGE",
    "DELEGRETURN",
    "GETATTR",
    "GETFH",
    "LINK",
    "LOCK",
    "LOCKT",
    "LOCKU",
    "LOOKUP",
    "LOOKUPP",
    "NVERIFY",
    "OPEN",
    "OPENATTR",
    "OPEN_CONFIRM",
    "OPEN_DOWNGRADE",
    "PUTFH",
    "PUTPUBFH",
    "PUTROOTFH",
    "READ",
    "READDIR",
    "READLINK",
    "REMOVE",
    "RENAME",
    "RENEW",
    "RESTOREFH",
    "SAVEFH",
    "SECINFO",
    "SETATTR",
    "SETCLIENTID",
    "SETCLIENTID_CONFIRM",
    "VERIFY",
    "WRITE",
    "RELEASE_LOCKOWNER",
    "BACKCHANNEL_CTL",
    "BIND_CONN_TO_SESSION",
    "EXCHANGE_ID",
    "CREATE_SESSION",
    "DESTROY_SESSION",
    "FREE_STATEID",
    "GET_DIR_DELEGATION",
    "GETDEVICEINFO",
    "GETDEVICELIST",
    "LAYOUTCOMMIT",
    "LAYOUTGET",
    "LAYOUTRETURN",
    "SECINFO_NO_NAME",
    "SEQUENCE",
    "SET_SSV",
    "TEST_STATEID",
    "WANT_DELEGATION",
    "DESTROY_CLIENTID",
    "RECLAIM_COMPLETE",
    "ALLOCATE",
    "COPY",
    "COPY_NOTIFY",
    "DEALLOCATE",
    "IO_ADVISE",
    "LAYOUTERROR",
    "LAYOUTSTATS",
    "OFFLOAD_CANCEL",
    "OFFLOAD_STATUS",
    "READ_PLUS",
    "SEEK",
    "WRITE_SAME",
    "CLONE",
    "GETXATTR",
    "SETXATTR",
    "LISTXATTRS",
    "REMOVEXATTR",
];

/// The name of NFSv4 operation `op` in a COMPOUND, e.g. `SEQUENCE`, `PUTFH`, `GETATTR`.
pub fn nfs4_op_name(op: u32) -> Option<&'static str> {
    if op == 10_044 {
        return Some("ILLEGAL");
    }
    NFS4_OPS
        .get(usize::try_from(op.checked_sub(3)?).ok()?)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procedures_are_named_as_tshark_names_them() {
        let name = |p, v, c| procedure_name(p, v, c);
        assert_eq!(name(NFS_PROGRAM, 3, 6), Some("READ"));
        assert_eq!(name(NFS_PROGRAM, 3, 17), Some("READDIRPLUS"));
        assert_eq!(name(NFS_PROGRAM, 3, 21), Some("COMMIT"));
        assert_eq!(name(NFS_PROGRAM, 3, 22), None);
        assert_eq!(name(NFS_PROGRAM, 4, 1), Some("COMPOUND"));
        assert_eq!(name(NFS_PROGRAM, 2, 17), Some("STATFS"));
        assert_eq!(name(MOUNT_PROGRAM, 3, 1), Some("MNT"));
        assert_eq!(name(PMAP_PROGRAM, 2, 3), Some("GETPORT"));
        assert_eq!(name(PMAP_PROGRAM, 4, 3), Some("GETADDR"));
        assert_eq!(name(NLM_PROGRAM, 4, 2), Some("LOCK"));
        assert_eq!(name(NLM_PROGRAM, 4, 17), None);
        assert_eq!(name(NLM_PROGRAM, 4, 23), Some("FREE_ALL"));
        assert_eq!(name(NSM_PROGRAM, 1, 6), Some("NOTIFY"));
        assert_eq!(name(1, 1, 0), None);
        assert_eq!(program_name(PMAP_PROGRAM), Some("Portmap"));
        assert_eq!(program_name(1), None);
        assert_eq!(nfs4_op_name(3), Some("ACCESS"));
        assert_eq!(nfs4_op_name(53), Some("SEQUENCE"));
        assert_eq!(nfs4_op_name(58), Some("RECLAIM_COMPLETE"));
        assert_eq!(nfs4_op_name(75), Some("REMOVEXATTR"));
        assert_eq!((nfs4_op_name(2), nfs4_op_name(76)), (None, None));
    }
}
