#![no_main]
//! The RPC-over-RDMA responder's decisions on hostile messages (RFC 8166 §4.5): a plan or a
//! refusal, never a panic; an accepted call's Read chunks stay within the message limit at
//! 4-aligned, rising Positions; a refusal's RDMA_ERROR echoes the message's xid; and a reply
//! of any length fills the offered Write and Reply chunks without exceeding a segment.

use libfuzzer_sys::fuzz_target;
use softrdma_rpc::rdma::plan::{fill, plan_call};
use softrdma_wire::rpcrdma::Repr;

const MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&k, msg)) = data.split_first() else {
        return;
    };
    match plan_call(msg, MAX) {
        Ok(p) => {
            assert!(p.read_len <= MAX);
            let mut last = None;
            for (pos, segs) in &p.reads {
                assert!(pos % 4 == 0 && !segs.is_empty());
                assert!(last.is_none_or(|l| l < *pos));
                last = Some(*pos);
            }
            let len = usize::from(k) * 97;
            for c in p.offered.writes.iter().chain(p.offered.reply.iter()) {
                if let Some(out) = fill(len, c) {
                    assert_eq!(out.iter().map(|s| s.length as usize).sum::<usize>(), len);
                    assert!(out.iter().zip(c).all(|(o, s)| o.length <= s.length
                        && o.handle == s.handle
                        && o.offset == s.offset));
                }
            }
        }
        Err(r) => {
            if let Some(e) = r.answer(msg, 8) {
                let mut b = vec![0u8; e.buffer_len()];
                assert_eq!(e.emit(&mut b), Ok(b.len()));
                assert_eq!(&b[..4], &msg[..4]);
                let (back, _) = Repr::parse(&b).expect("our RDMA_ERROR parses");
                assert_eq!(
                    back.rdma_xid,
                    u32::from_be_bytes([msg[0], msg[1], msg[2], msg[3]])
                );
            }
        }
    }
});
