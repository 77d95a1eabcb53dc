#![no_main]
//! The NFSv3 and MOUNT v3 server over the in-memory filesystem, as a hostile client meets
//! it: a sequence of calls whose procedures and arguments the input chooses, each with the
//! handle of a file an earlier call made or looked up (or the input's own bytes). Nothing
//! panics, every answer decodes as a reply to its call, and READ never returns more than
//! was asked.

use libfuzzer_sys::fuzz_target;
use softrdma_nfs::proto::{MOUNT_PROGRAM, MOUNT_V3, NFS_PROGRAM, NFS_V3};
use softrdma_nfs::server::{MemFs, NfsService};
use softrdma_rpc::msg::{decode_reply, encode_call};
use softrdma_rpc::{Auth, AuthSysParams, Buffers, CallHeader, Registry};
use softrdma_wire::xdr::XdrReader;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    // Small limits: a client may not make the server allocate without bound.
    let fs = Arc::new(MemFs::with_limits(1 << 20, 64));
    let svc = NfsService::new(vec![("/export".into(), fs)]);
    let mut reg = Registry::new();
    svc.register(&mut reg);
    let buffers = Buffers::new(4, 1 << 20);
    let mut handles = vec![svc.root_handle("/export").expect("the export")];
    let mut rest = data;
    let mut xid = 1u32;
    while rest.len() >= 3 {
        let (prog, vers) = if rest[0] & 0x80 != 0 {
            (MOUNT_PROGRAM, MOUNT_V3)
        } else {
            (NFS_PROGRAM, NFS_V3)
        };
        let proc = u32::from(rest[0] & 0x1f);
        let pick = usize::from(rest[1]);
        let len = usize::from(rest[2]).min(rest.len() - 3);
        let body = &rest[3..3 + len];
        rest = &rest[3 + len..];
        // Most calls start with a known handle (opaque<64>), then the input's bytes.
        let mut args = Vec::new();
        if pick < 200 {
            let h = &handles[pick % handles.len()];
            args.extend_from_slice(&(h.len() as u32).to_be_bytes());
            args.extend_from_slice(h);
        }
        args.extend_from_slice(body);
        let h = CallHeader {
            xid,
            prog,
            vers,
            proc,
            cred: Auth::Sys(AuthSysParams {
                stamp: 0,
                machinename: b"fuzz".to_vec(),
                uid: u32::from(rest.first().copied().unwrap_or(0) & 1) * 1000,
                gid: 0,
                gids: Vec::new(),
            }),
            verf: Auth::None,
        };
        let mut msg = Vec::new();
        if encode_call(&h, &args, &mut msg).is_err() {
            return;
        }
        let Some(reply) = reg.dispatch(&msg, None, &buffers) else {
            xid += 1;
            continue;
        };
        let whole = reply.to_vec();
        let (rh, off) = decode_reply(&whole).expect("our replies decode");
        assert_eq!(rh.xid, xid);
        let results = &whole[off..];
        let mut r = XdrReader::new(results);
        // Handles the server hands out become the next calls' handles.
        if prog == NFS_PROGRAM && r.read_u32() == Ok(0) {
            let found = match proc {
                3 => r.read_opaque(64).ok().map(<[u8]>::to_vec),
                8..=11 if r.read_bool() == Ok(true) => r.read_opaque(64).ok().map(<[u8]>::to_vec),
                _ => None,
            };
            if let Some(fh) = found
                && handles.len() < 32
            {
                handles.push(fh);
            }
        }
        xid += 1;
    }
});
