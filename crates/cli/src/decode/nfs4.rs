//! The operations of an NFSv4 COMPOUND call (RFC 8881 §16.2), so that it is named as tshark
//! names it (`SEQUENCE PUTFH GETATTR` rather than `COMPOUND`).
//!
//! Finding an operation means stepping over the arguments of every one before it; the walk
//! stops at the first operation whose arguments it does not know, and says so.

use softrdma_nfs::names::nfs4_op_name;
use softrdma_wire::xdr::XdrReader;

/// Operations listed at most (Linux sends fewer than 20).
const MAX_OPS: u32 = 64;

/// The operations of a COMPOUND call, as far as they could be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compound {
    pub ops: Vec<u32>,
    /// Every operation was found (otherwise the list stops early).
    pub complete: bool,
}

impl std::fmt::Display for Compound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .ops
            .iter()
            .map(|&op| nfs4_op_name(op).map_or_else(|| format!("op-{op}"), str::to_string))
            .collect();
        write!(f, "({}", names.join(" "))?;
        if !self.complete {
            write!(f, " …")?;
        }
        write!(f, ")")
    }
}

/// The operations of the COMPOUND call whose arguments are `args`. `reduced(at)`: the data
/// of the opaque whose length word ends at offset `at` travels in a read chunk (RFC 8166
/// §3.4.5: the length word stays inline). `None` when the COMPOUND header does not parse.
pub(crate) fn compound_ops(args: &[u8], reduced: impl Fn(usize) -> bool) -> Option<Compound> {
    let mut r = XdrReader::new(args);
    r.read_opaque(u32::MAX).ok()?; // tag
    r.read_u32().ok()?; // minorversion
    let n = r.read_u32().ok()?;
    let mut c = Compound {
        ops: Vec::new(),
        complete: false,
    };
    for _ in 0..n.min(MAX_OPS) {
        let Ok(op) = r.read_u32() else {
            return Some(c);
        };
        c.ops.push(op);
        if skip_args(&mut r, op, &reduced).is_none() {
            return Some(c);
        }
    }
    c.complete = n <= MAX_OPS;
    Some(c)
}

fn opaque(r: &mut XdrReader<'_>) -> Option<()> {
    r.read_opaque(u32::MAX).ok().map(drop)
}

fn skip(r: &mut XdrReader<'_>, n: usize) -> Option<()> {
    r.skip(n).ok()
}

/// bitmap4: a counted array of words.
fn bitmap(r: &mut XdrReader<'_>) -> Option<()> {
    let n = r.read_u32().ok()? as usize;
    skip(r, n.checked_mul(4)?)
}

/// fattr4: a bitmap and the attribute values as one opaque.
fn fattr(r: &mut XdrReader<'_>) -> Option<()> {
    bitmap(r)?;
    opaque(r)
}

const STATEID: usize = 16;

/// Step over the arguments of operation `op` (RFC 8881 §18, RFC 7862 §15, RFC 8276 §8).
fn skip_args(r: &mut XdrReader<'_>, op: u32, reduced: &impl Fn(usize) -> bool) -> Option<()> {
    match op {
        // No arguments: GETFH, LOOKUPP, PUTPUBFH, PUTROOTFH, READLINK, RESTOREFH, SAVEFH.
        10 | 16 | 23 | 24 | 27 | 31 | 32 => Some(()),
        // One word: ACCESS, OPENATTR, SECINFO_NO_NAME, RECLAIM_COMPLETE.
        3 | 19 | 52 | 58 => skip(r, 4),
        // clientid: DELEGPURGE, RENEW, DESTROY_CLIENTID.
        7 | 30 | 57 => skip(r, 8),
        // A stateid: DELEGRETURN, FREE_STATEID, OFFLOAD_CANCEL, OFFLOAD_STATUS.
        8 | 45 | 66 | 67 => skip(r, STATEID),
        // seqid and stateid: CLOSE, OPEN_CONFIRM.
        4 | 20 => skip(r, 4 + STATEID),
        // COMMIT: offset, count.
        5 => skip(r, 12),
        // CREATE: the type (a link's target, a device's numbers), name, attributes.
        6 => {
            match r.read_u32().ok()? {
                5 => opaque(r)?,
                3 | 4 => skip(r, 8)?,
                _ => {}
            }
            opaque(r)?;
            fattr(r)
        }
        // GETATTR.
        9 => bitmap(r),
        // A component name: LINK, LOOKUP, REMOVE, SECINFO, GETXATTR, REMOVEXATTR.
        11 | 15 | 28 | 33 | 72 | 75 => opaque(r),
        // LOCK: type, reclaim, offset, length, then a new or an existing lock owner.
        12 => {
            skip(r, 4 + 4 + 8 + 8)?;
            if r.read_bool().ok()? {
                skip(r, 4 + STATEID + 4 + 8)?;
                opaque(r)
            } else {
                skip(r, STATEID + 4)
            }
        }
        // LOCKT: type, offset, length, owner.
        13 => {
            skip(r, 4 + 8 + 8 + 8)?;
            opaque(r)
        }
        // LOCKU: type, seqid, stateid, offset, length.
        14 => skip(r, 4 + 4 + STATEID + 8 + 8),
        // NVERIFY, VERIFY.
        17 | 37 => fattr(r),
        18 => open(r),
        // OPEN_DOWNGRADE: stateid, seqid, share_access, share_deny.
        21 => skip(r, STATEID + 12),
        // PUTFH.
        22 => opaque(r),
        // READ, READ_PLUS: stateid, offset, count.
        25 | 68 => skip(r, STATEID + 8 + 4),
        // READDIR: cookie, verifier, dircount, maxcount, attributes.
        26 => {
            skip(r, 8 + 8 + 4 + 4)?;
            bitmap(r)
        }
        // RENAME.
        29 => {
            opaque(r)?;
            opaque(r)
        }
        // SETATTR.
        34 => {
            skip(r, STATEID)?;
            fattr(r)
        }
        // SETCLIENTID: verifier, id, callback program, netid, address, callback_ident.
        35 => {
            skip(r, 8)?;
            opaque(r)?;
            skip(r, 4)?;
            opaque(r)?;
            opaque(r)?;
            skip(r, 4)
        }
        // SETCLIENTID_CONFIRM.
        36 => skip(r, 8 + 8),
        // WRITE: stateid, offset, stable, data (in a read chunk, or inline).
        38 => {
            skip(r, STATEID + 8 + 4)?;
            let len = r.read_u32().ok()? as usize;
            if reduced(r.position()) {
                Some(())
            } else {
                r.read_opaque_fixed(len).ok().map(drop)
            }
        }
        // RELEASE_LOCKOWNER.
        39 => {
            skip(r, 8)?;
            opaque(r)
        }
        // BIND_CONN_TO_SESSION: session, direction, use_rdma.
        41 => skip(r, 16 + 4 + 4),
        42 => exchange_id(r),
        43 => create_session(r),
        // DESTROY_SESSION.
        44 => skip(r, 16),
        // GETDEVICEINFO: device, layout type, maxcount, notifications.
        47 => {
            skip(r, 16 + 4 + 4)?;
            bitmap(r)
        }
        // LAYOUTGET.
        50 => skip(r, 4 + 4 + 4 + 8 + 8 + 8 + STATEID + 4),
        // SEQUENCE: session, sequence, slot, highest slot, cachethis.
        53 => skip(r, 16 + 4 + 4 + 4 + 4),
        // TEST_STATEID.
        55 => {
            let n = r.read_u32().ok()? as usize;
            skip(r, n.checked_mul(STATEID)?)
        }
        // ALLOCATE, DEALLOCATE: stateid, offset, length.
        59 | 62 => skip(r, STATEID + 8 + 8),
        // IO_ADVISE: stateid, offset, count, hints.
        63 => {
            skip(r, STATEID + 8 + 8)?;
            bitmap(r)
        }
        // SEEK: stateid, offset, what.
        69 => skip(r, STATEID + 8 + 4),
        // CLONE: two stateids, two offsets, count.
        71 => skip(r, 2 * STATEID + 8 + 8 + 8),
        // SETXATTR: option, name, value.
        73 => {
            skip(r, 4)?;
            opaque(r)?;
            opaque(r)
        }
        // LISTXATTRS: cookie, maxcount.
        74 => skip(r, 8 + 4),
        _ => None,
    }
}

/// OPEN (RFC 8881 §18.16.1): seqid, share access and deny, owner, how, claim.
fn open(r: &mut XdrReader<'_>) -> Option<()> {
    skip(r, 4 + 4 + 4 + 8)?;
    opaque(r)?; // owner
    if r.read_u32().ok()? == 1 {
        // OPEN4_CREATE: createhow4.
        match r.read_u32().ok()? {
            0 | 1 => fattr(r)?, // UNCHECKED4, GUARDED4
            2 => skip(r, 8)?,   // EXCLUSIVE4
            3 => {
                skip(r, 8)?; // EXCLUSIVE4_1
                fattr(r)?;
            }
            _ => return None,
        }
    }
    match r.read_u32().ok()? {
        0 | 3 => opaque(r), // CLAIM_NULL, CLAIM_DELEGATE_PREV: a name
        1 => skip(r, 4),    // CLAIM_PREVIOUS: delegation type
        2 => {
            skip(r, STATEID)?; // CLAIM_DELEGATE_CUR
            opaque(r)
        }
        4 | 6 => Some(()),     // CLAIM_FH, CLAIM_DELEG_PREV_FH
        5 => skip(r, STATEID), // CLAIM_DELEG_CUR_FH
        _ => None,
    }
}

/// EXCHANGE_ID (RFC 8881 §18.35.1): owner, flags, state protection, implementation id.
fn exchange_id(r: &mut XdrReader<'_>) -> Option<()> {
    skip(r, 8)?;
    opaque(r)?;
    skip(r, 4)?;
    match r.read_u32().ok()? {
        0 => {} // SP4_NONE
        1 => {
            bitmap(r)?; // SP4_MACH_CRED
            bitmap(r)?;
        }
        _ => return None, // SP4_SSV: not stepped over
    }
    // nfs_impl_id4<1>: domain, name, date.
    match r.read_u32().ok()? {
        0 => Some(()),
        1 => {
            opaque(r)?;
            opaque(r)?;
            skip(r, 12)
        }
        _ => None,
    }
}

/// CREATE_SESSION (RFC 8881 §18.36.1): client, sequence, flags, two channels' attributes,
/// callback program and its security.
fn create_session(r: &mut XdrReader<'_>) -> Option<()> {
    skip(r, 8 + 4 + 4)?;
    for _ in 0..2 {
        skip(r, 6 * 4)?;
        let ird = r.read_u32().ok()? as usize;
        skip(r, ird.checked_mul(4)?)?;
    }
    skip(r, 4)?;
    let n = r.read_u32().ok()?;
    for _ in 0..n.min(MAX_OPS) {
        match r.read_u32().ok()? {
            0 => {} // AUTH_NONE
            1 => {
                // AUTH_SYS: stamp, machine name, uid, gid, gids.
                skip(r, 4)?;
                opaque(r)?;
                skip(r, 8)?;
                let g = r.read_u32().ok()? as usize;
                skip(r, g.checked_mul(4)?)?;
            }
            6 => {
                // RPCSEC_GSS: service, two handles.
                skip(r, 4)?;
                opaque(r)?;
                opaque(r)?;
            }
            _ => return None,
        }
    }
    (n <= MAX_OPS).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    #[test]
    fn ops_are_found_behind_their_arguments() {
        // tag "", minorversion 2, 4 ops: SEQUENCE, PUTFH (4-octet handle), WRITE (2 octets
        // inline), GETATTR (one bitmap word).
        let mut a = words(&[0, 2, 4, 53]);
        a.extend([0; 32]);
        a.extend(words(&[22, 4, 0xaabbccdd, 38]));
        a.extend([0; 16 + 8 + 4]);
        a.extend(words(&[2]));
        a.extend([7, 7, 0, 0]);
        a.extend(words(&[9, 1, 0x10]));
        let c = compound_ops(&a, |_| false).unwrap();
        assert_eq!((c.ops.clone(), c.complete), (vec![53, 22, 38, 9], true));
        assert_eq!(c.to_string(), "(SEQUENCE PUTFH WRITE GETATTR)");
        // The same WRITE with its data in a read chunk: nothing inline after the length.
        let mut b = a.clone();
        let at = b.len() - 16;
        b.drain(at..at + 4);
        let c = compound_ops(&b, |p| p == at).unwrap();
        assert_eq!(c.ops, [53, 22, 38, 9]);
        // Truncated, or an operation not known: the list stops there.
        let c = compound_ops(&a[..40], |_| false).unwrap();
        assert_eq!((c.ops, c.complete), (vec![53], false));
        let c = compound_ops(&words(&[0, 2, 2, 9999, 9]), |_| false).unwrap();
        assert_eq!((c.to_string(), c.complete), ("(op-9999 …)".into(), false));
        // A hostile count lists at most MAX_OPS.
        let mut h = words(&[0, 2, u32::MAX]);
        h.extend((0..1000).flat_map(|_| 10u32.to_be_bytes()));
        let c = compound_ops(&h, |_| false).unwrap();
        assert_eq!((c.ops.len(), c.complete), (MAX_OPS as usize, false));
        assert!(compound_ops(&[0, 0], |_| false).is_none());
    }
}
