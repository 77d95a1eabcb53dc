//! Unit, conformance and property tests. Conformance ids from
//! `shared/spec/conformance-matrix.md` appear in test names and doc comments.

use std::sync::Arc;

use crate::{Access, Buffer, Key, KeyTable, PdId, QpId};

mod access;
mod buffer;
mod concurrency;
mod gather;
mod invalidate;
mod keys;
mod model;
mod revoke;
mod windows;

const PD: PdId = PdId(1);
const PD2: PdId = PdId(2);
const QP: QpId = QpId(10);
const QP2: QpId = QpId(11);
const IOVA: u64 = 0x7f00_0000_1000;

fn all() -> Access {
    Access::all()
}

fn remote_rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

/// A table with one plain MR covering a whole `len`-byte buffer at `IOVA` with all rights.
fn setup(len: usize) -> (KeyTable, Arc<Buffer>, Key) {
    let t = KeyTable::with_seed(0x5eed);
    let buf = Buffer::new(len);
    let k = t.reg_mr(PD, buf.clone(), 0, len, IOVA, all()).unwrap();
    (t, buf, k)
}

/// A key that names nothing in `t`: same index as `k`, different consumer key.
fn stale(k: Key) -> Key {
    Key::new(k.index(), k.consumer().wrapping_add(1))
}

#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<KeyTable>();
    check::<Buffer>();
    check::<crate::Target>();
    check::<crate::AccessError>();
}
