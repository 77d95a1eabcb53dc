//! Scatter/gather over a work request's checked entries (`Target`s): the message offset
//! `off` walks the list in order (C9-26), each entry taking its length.

use softrdma_memory::Target;
use softrdma_verbs_types::WcStatus;

/// Places `data` at message offset `off`; `LocalLength` if the list ends first,
/// `LocalProtection` if an entry's region was revoked.
pub(crate) fn scatter(ts: &[Target], mut off: usize, mut data: &[u8]) -> Result<(), WcStatus> {
    for t in ts {
        if data.is_empty() {
            break;
        }
        if off >= t.len() {
            off -= t.len();
            continue;
        }
        let n = (t.len() - off).min(data.len());
        t.place(off, &data[..n])
            .map_err(|_| WcStatus::LocalProtection)?;
        data = &data[n..];
        off = 0;
    }
    if data.is_empty() {
        Ok(())
    } else {
        Err(WcStatus::LocalLength)
    }
}

/// Fills `out` from message offset `off`; `LocalProtection` if a region was revoked.
pub(crate) fn gather(ts: &[Target], mut off: usize, mut out: &mut [u8]) -> Result<(), WcStatus> {
    for t in ts {
        if out.is_empty() {
            break;
        }
        if off >= t.len() {
            off -= t.len();
            continue;
        }
        let n = (t.len() - off).min(out.len());
        let (head, tail) = out.split_at_mut(n);
        t.copy_out(off, head)
            .map_err(|_| WcStatus::LocalProtection)?;
        out = tail;
        off = 0;
    }
    Ok(())
}
