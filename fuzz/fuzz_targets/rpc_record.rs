#![no_main]
//! RPC over TCP as a server meets it (RFC 5531 §9, §11): a hostile byte stream, cut at
//! hostile places, through the record decoder; every record through the server's dispatch.
//! Nothing panics, no record exceeds the limit, and every answer is a reply that decodes,
//! to the xid of the record it answers.

use libfuzzer_sys::fuzz_target;
use softrdma_rpc::msg::{decode_reply, peek};
use softrdma_rpc::record::RecordDecoder;
use softrdma_rpc::{Buffers, CallContext, ProcError, Registry};

const LIMIT: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let mut reg = Registry::new();
    reg.register(100_003, 3, |ctx: &CallContext<'_>, args: &[u8]| {
        match ctx.header.proc {
            0 => Ok(Vec::new()),
            1 => Ok(args.to_vec()),
            2 => Err(ProcError::GarbageArgs),
            _ => Err(ProcError::ProcUnavail),
        }
    });
    reg.register(100_003, 4, |_: &CallContext<'_>, _: &[u8]| {
        Err::<Vec<u8>, _>(ProcError::SystemErr)
    });
    let buffers = Buffers::new(4, 1 << 20);
    let mut d = RecordDecoder::new(LIMIT);
    let step = usize::from(cut).max(1);
    for chunk in stream.chunks(step) {
        let mut input = chunk;
        loop {
            match d.decode(&mut input) {
                Ok(Some(rec)) => {
                    assert!(rec.len() <= LIMIT);
                    if let Some(reply) = reg.dispatch(&rec, None, &buffers) {
                        let (h, _) = decode_reply(&reply.to_vec()).expect("our replies decode");
                        assert_eq!(Some((h.xid, false)), peek(&rec));
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
