#![no_main]
//! The RPC-over-RDMA requester's check of hostile replies (RFC 8166 §3.4.6.1, §4.3.3, §4.5):
//! dropped, refused or accepted, never a panic; what it accepts never reads past what the
//! call offered: the Write chunk's and Reply chunk's returned lengths are within them, and
//! an inline reply starts inside the message.

use libfuzzer_sys::fuzz_target;
use softrdma_rpc::rdma::plan::{Lent, ReplyForm, plan_reply};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (conf, buf) = data.split_at(8);
    let lent = |b: &[u8], on: bool| {
        on.then(|| Lent {
            handle: u32::from(b[0]) << 8 | 0x11,
            offset: u64::from(b[1]) << 12,
            len: usize::from(u16::from_le_bytes([b[2], b[3]])),
        })
    };
    let write = lent(&conf[..4], conf[6] & 1 != 0);
    let reply = lent(&conf[4..8], conf[6] & 2 != 0);
    let Some((_, _, form)) = plan_reply(buf, |_| Some((write, reply))) else {
        return;
    };
    let within = |w: Option<usize>| match (w, write) {
        (None, _) => true,
        (Some(n), Some(l)) => n > 0 && n <= l.len,
        (Some(_), None) => false,
    };
    match form {
        Ok(ReplyForm::Inline { at, write: w }) => assert!(at <= buf.len() && within(w)),
        Ok(ReplyForm::Long { len, write: w }) => {
            assert!(reply.is_some_and(|r| len <= r.len) && within(w))
        }
        Ok(ReplyForm::Refused(_)) | Err(_) => {}
    }
});
