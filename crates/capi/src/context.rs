//! Contexts: `ibv_open_device`, `ibv_close_device`, and what a context is asked about its
//! device, port, GIDs and P_Keys.
//!
//! A context is `[verbs_context … | ibv_context]` (rdma-core's extended context: the ops a
//! program finds at negative offsets from the `ibv_context` it holds), `abi_compat` set to
//! mark it extended, and its own state after it.

use core::ffi::{c_int, c_void};
use std::collections::HashSet;
use std::io::{PipeReader, PipeWriter};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::device::{PORT, SrDevice, device_attr, gid_entry, port_attr};
use crate::errno;
use crate::list::device;
use crate::sys;

/// A context as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrContext {
    vctx: sys::verbs_context,
    pub inner: softrdma::Context,
    pub dev: &'static SrDevice,
    /// `async_fd` reads this pipe; events are written to its other end.
    _async_rx: PipeReader,
    pub async_tx: PipeWriter,
    _cmd: OwnedFd,
}

// SAFETY: the C half is written when the context is made, then read by the program; its
// `mutex` is the program's.
unsafe impl Send for SrContext {}
// SAFETY: as above.
unsafe impl Sync for SrContext {}

/// Live contexts, by the address programs hold.
fn live() -> &'static Mutex<HashSet<usize>> {
    static LIVE: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

const CONTEXT_AT: usize =
    core::mem::offset_of!(SrContext, vctx) + core::mem::offset_of!(sys::verbs_context, context);

/// Ours, if `p` is a context `ibv_open_device` returned and `ibv_close_device` did not end.
pub(crate) fn context<'a>(p: *const sys::ibv_context) -> Option<&'a SrContext> {
    if !live().lock().contains(&(p as usize)) {
        return None;
    }
    // SAFETY: `p` is the `context` field of a live boxed SrContext (checked above).
    Some(unsafe { &*p.byte_sub(CONTEXT_AT).cast::<SrContext>() })
}

/// `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_open_device(dev: *mut sys::ibv_device) -> *mut sys::ibv_context {
    let Some(d) = device(dev) else {
        errno::set(libc::ENODEV);
        return ptr::null_mut();
    };
    match open(d) {
        Ok(p) => p,
        Err(e) => {
            errno::set(e);
            ptr::null_mut()
        }
    }
}

fn open(d: &'static SrDevice) -> Result<*mut sys::ibv_context, c_int> {
    let inner = d.inner.open().map_err(|_| libc::ENODEV)?;
    let (rx, tx) = std::io::pipe().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let cmd = OwnedFd::from(std::fs::File::open("/dev/null").map_err(|_| libc::EMFILE)?);
    let mut vctx = sys::verbs_context {
        sz: core::mem::size_of::<sys::verbs_context>(),
        query_port: Some(query_port_op),
        query_device_ex: Some(query_device_ex_op),
        ..Default::default()
    };
    let c = &mut vctx.context;
    c.device = d.as_ptr();
    c.cmd_fd = cmd.as_raw_fd();
    c.async_fd = rx.as_raw_fd();
    c.num_comp_vectors = 1;
    // __VERBS_ABI_IS_EXTENDED: the verbs ops before the context are there.
    c.abi_compat = usize::MAX as *mut c_void;
    let b = Box::new(SrContext {
        vctx,
        inner,
        dev: d,
        _async_rx: rx,
        async_tx: tx,
        _cmd: cmd,
    });
    let raw = Box::into_raw(b);
    // SAFETY: `raw` is the box just made.
    let p = unsafe { &raw mut (*raw).vctx.context };
    live().lock().insert(p as usize);
    Ok(p)
}

/// `ibv_close_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    if !live().lock().remove(&(ctx as usize)) {
        return libc::EINVAL;
    }
    // SAFETY: it was live, so it is the context field of a boxed SrContext, now ours alone.
    drop(unsafe { Box::from_raw(ctx.byte_sub(CONTEXT_AT).cast::<SrContext>()) });
    0
}

/// `ibv_query_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_device(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program passes room for an ibv_device_attr.
    unsafe { attr.write(device_attr(c.dev)) };
    0
}

/// Copies `v` into the program's `len` octets at `out`, zeroing what its struct has beyond
/// ours (a newer program's fields we do not know).
///
/// # Safety
/// `out` points at `len` writable octets.
unsafe fn write_sized<T>(v: &T, out: *mut c_void, len: usize) {
    let n = len.min(core::mem::size_of::<T>());
    // SAFETY: `v` is `size_of::<T>()` octets; `out` has `len` (the caller's promise).
    unsafe {
        ptr::copy_nonoverlapping(ptr::from_ref(v).cast::<u8>(), out.cast::<u8>(), n);
        ptr::write_bytes(out.cast::<u8>().add(n), 0, len - n);
    }
}

/// The verbs op behind `ibv_query_device_ex`.
unsafe extern "C" fn query_device_ex_op(
    ctx: *mut sys::ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    // SAFETY: NULL or the program's input struct.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    let base = core::mem::offset_of!(sys::ibv_device_attr_ex, comp_mask) + 4;
    if attr.is_null() || attr_size < base {
        return libc::EINVAL;
    }
    let orig_attr = device_attr(c.dev);
    let a = sys::ibv_device_attr_ex {
        device_cap_flags_ex: u64::from(orig_attr.device_cap_flags),
        phys_port_cnt_ex: u32::from(PORT),
        orig_attr,
        ..Default::default()
    };
    // SAFETY: the program gave `attr_size` octets at `attr`.
    unsafe { write_sized(&a, attr.cast(), attr_size) };
    0
}

/// The verbs op behind `ibv_query_port` (rdma-core 44's macro calls it with its size).
unsafe extern "C" fn query_port_op(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut sys::ibv_port_attr,
    len: usize,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if port != PORT || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program gave `len` octets at `attr`.
    unsafe { write_sized(&port_attr(c.dev), attr.cast(), len) };
    0
}

/// `ibv_query_port` as exported: programs built without the verbs op path pass the old,
/// 48-octet `struct _compat_ibv_port_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_port(
    ctx: *mut sys::ibv_context,
    port: u8,
    attr: *mut c_void,
) -> c_int {
    // SAFETY: the compat struct is the first 48 octets of ibv_port_attr.
    unsafe { query_port_op(ctx, port, attr.cast(), 48) }
}

/// `ibv_query_gid`: 0, or -1 for a port or index that has none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_gid(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut sys::ibv_gid,
) -> c_int {
    let Some(c) = context(ctx) else {
        return errno::fail(libc::EINVAL);
    };
    if port != PORT || index != 0 || gid.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program passes room for a GID.
    unsafe { (*gid).raw = c.dev.gid() };
    0
}

/// `_ibv_query_gid_ex` (`ibv_query_gid_ex`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr__ibv_query_gid_ex(
    ctx: *mut sys::ibv_context,
    port: u32,
    index: u32,
    entry: *mut sys::ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if flags != 0 || entry.is_null() || entry_size < core::mem::size_of::<sys::ibv_gid_entry>() {
        return libc::EINVAL;
    }
    if port != u32::from(PORT) {
        return libc::EINVAL;
    }
    if index != 0 {
        return libc::ENODATA;
    }
    // SAFETY: the program gave `entry_size` octets at `entry`.
    unsafe { write_sized(&gid_entry(c.dev), entry.cast(), entry_size) };
    0
}

/// `_ibv_query_gid_table` (`ibv_query_gid_table`): entries written, or a negative errno.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr__ibv_query_gid_table(
    ctx: *mut sys::ibv_context,
    entries: *mut sys::ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let Some(c) = context(ctx) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0 || entry_size < core::mem::size_of::<sys::ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    if max_entries < 1 || entries.is_null() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: the program gave `max_entries` entries of `entry_size` octets.
    unsafe { write_sized(&gid_entry(c.dev), entries.cast(), entry_size) };
    1
}

/// `ibv_query_gid_type` (rdma-core's private ABI, which `ibv_devinfo` calls): the sysfs
/// kind, 0 for IB/RoCE v1 and 1 for RoCE v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_gid_type(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    let Some(c) = context(ctx) else {
        return errno::fail(libc::EINVAL);
    };
    if port != PORT || index != 0 || ty.is_null() {
        return errno::fail(libc::EINVAL);
    }
    let v = u32::from(c.dev.gid_type() == sys::IBV_GID_TYPE_ROCE_V2);
    // SAFETY: the program passes room for the enum.
    unsafe { *ty = v };
    0
}

/// The one P_Key: the default, full membership.
const PKEY: u16 = 0xffff;

/// `ibv_query_pkey`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_query_pkey(
    ctx: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if context(ctx).is_none() || port != PORT || index != 0 || pkey.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program passes room for a __be16.
    unsafe { *pkey = PKEY.to_be() };
    0
}

/// `ibv_get_pkey_index`: the index of a P_Key (network order), or -1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_pkey_index(
    ctx: *mut sys::ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    if context(ctx).is_none() || port != PORT {
        return errno::fail(libc::EINVAL);
    }
    if u16::from_be(pkey) == PKEY {
        0
    } else {
        errno::fail(libc::ENOENT)
    }
}

/// `ibv_fork_init`: nothing to do; registered memory is not pinned.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_is_fork_initialized() -> sys::ibv_fork_status {
    sys::IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: as `ibv_fork_init`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_dontfork_range(_base: *mut c_void, _len: usize) -> c_int {
    0
}

/// `ibv_dofork_range`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_dofork_range(_base: *mut c_void, _len: usize) -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::guid_of;
    use crate::list::*;
    use crate::sysfs::*;
    use core::ffi::{CStr, c_char};
    use softrdma::Device;

    fn open_named(name: &str) -> *mut sys::ibv_context {
        let d = devices()
            .iter()
            .find(|d| d.inner.name() == name)
            .expect("device listed");
        // SAFETY: a device pointer from the list.
        let c = unsafe { sr_ibv_open_device(d.as_ptr()) };
        assert!(!c.is_null());
        c
    }

    #[test]
    fn the_list_is_the_devices_and_frees() {
        let mut n = -1;
        // SAFETY: room for the count.
        let list = unsafe { sr_ibv_get_device_list(&mut n) };
        let want = Device::list();
        assert_eq!(n as usize, want.len());
        for (i, w) in want.iter().enumerate() {
            // SAFETY: the list holds n pointers, then NULL.
            let d = unsafe { *list.add(i) };
            // SAFETY: a listed device; its name is a C string.
            let name = unsafe { CStr::from_ptr(sr_ibv_get_device_name(d)) };
            assert_eq!(name.to_str().unwrap(), w.name());
            // SAFETY: as above.
            assert_eq!(unsafe { sr_ibv_get_device_index(d) }, i as c_int);
            // SAFETY: as above.
            let guid = u64::from_be(unsafe { sr_ibv_get_device_guid(d) });
            assert_eq!(guid, guid_of(w.name()));
            assert_eq!(guid >> 56, 0x02, "locally administered");
        }
        // SAFETY: the terminator.
        assert!(unsafe { *list.add(n as usize) }.is_null());
        // SAFETY: the list from ibv_get_device_list.
        unsafe { sr_ibv_free_device_list(list) };
        // SAFETY: NULL is refused, not dereferenced.
        unsafe { sr_ibv_free_device_list(ptr::null_mut()) };
    }

    #[test]
    fn foreign_device_and_context_pointers_are_refused() {
        let mut fake = sys::ibv_device::default();
        // SAFETY: none of these is dereferenced: they are not ours.
        unsafe {
            assert!(sr_ibv_open_device(&mut fake).is_null());
            assert_eq!(*libc::__errno_location(), libc::ENODEV);
            assert!(sr_ibv_get_device_name(&mut fake).is_null());
            assert_eq!(sr_ibv_get_device_index(&mut fake), -1);
            assert_eq!(sr_ibv_get_device_guid(ptr::null_mut()), 0);
            let mut ctx = sys::ibv_context::default();
            let mut attr = sys::ibv_device_attr::default();
            assert_eq!(sr_ibv_query_device(&mut ctx, &mut attr), libc::EINVAL);
            assert_eq!(sr_ibv_close_device(&mut ctx), libc::EINVAL);
            assert_eq!(sr_ibv_close_device(ptr::null_mut()), libc::EINVAL);
        }
    }

    #[test]
    fn an_iwarp_context_is_extended_and_answers_queries() {
        let c = open_named(softrdma::TCP_DEVICE_NAME);
        // SAFETY: a live context, read as a program reads it.
        unsafe {
            assert_eq!((*c).abi_compat as usize, usize::MAX);
            assert!((*c).async_fd >= 0 && (*c).cmd_fd >= 0);
            assert_eq!((*c).num_comp_vectors, 1);
            let dev = (*c).device;
            assert_eq!((*dev).node_type, sys::IBV_NODE_RNIC);
            assert_eq!((*dev).transport_type, sys::IBV_TRANSPORT_IWARP);
            // verbs_get_ctx_op: the ops before the context, and a size that covers them.
            let v = &*c
                .byte_sub(core::mem::offset_of!(sys::verbs_context, context))
                .cast::<sys::verbs_context>();
            assert_eq!(v.sz, core::mem::size_of::<sys::verbs_context>());
            let mut attr = sys::ibv_device_attr::default();
            assert_eq!(sr_ibv_query_device(c, &mut attr), 0);
            assert_eq!(attr.phys_port_cnt, 1);
            assert_eq!(
                u64::from_be(attr.node_guid),
                u64::from_be(sr_ibv_get_device_guid(dev))
            );
            assert_eq!(attr.max_qp as u32, softrdma::DeviceLimits::default().max_qp);
            assert_eq!(sr_ibv_query_device(c, ptr::null_mut()), libc::EINVAL);
            // The extended query: a newer program's longer struct gets zeros past ours.
            #[repr(C, align(8))]
            struct Longer([u8; core::mem::size_of::<sys::ibv_device_attr_ex>() + 16]);
            let mut longer = Longer([0xAA; core::mem::size_of::<sys::ibv_device_attr_ex>() + 16]);
            let ex = &mut longer.0;
            let op = v.query_device_ex.expect("query_device_ex");
            assert_eq!(op(c, ptr::null(), ex.as_mut_ptr().cast(), ex.len()), 0);
            let got = &*ex.as_ptr().cast::<sys::ibv_device_attr_ex>();
            assert_eq!(got.orig_attr.max_qp, attr.max_qp);
            assert_eq!(got.phys_port_cnt_ex, 1);
            assert!(ex[ex.len() - 16..].iter().all(|&b| b == 0));
            assert_eq!(op(c, ptr::null(), ex.as_mut_ptr().cast(), 8), libc::EINVAL);
            let input = sys::ibv_query_device_ex_input { comp_mask: 1 };
            assert_eq!(
                op(c, &input, ex.as_mut_ptr().cast(), ex.len()),
                libc::EINVAL
            );
            assert_eq!(sr_ibv_close_device(c), 0);
            assert_eq!(sr_ibv_close_device(c), libc::EINVAL, "closed once only");
        }
    }

    #[test]
    fn ports_gids_and_pkeys_of_a_roce_device() {
        let Some(d) = devices()
            .iter()
            .find(|d| d.inner.interface() == Some("lo") && d.gid()[10] == 0xff)
        else {
            panic!("no RoCE device on 127.0.0.1 in {:?}", Device::list());
        };
        let c = open_named(d.inner.name());
        // SAFETY: a live context; every out-pointer has room for its type.
        unsafe {
            let v = &*c
                .byte_sub(core::mem::offset_of!(sys::verbs_context, context))
                .cast::<sys::verbs_context>();
            let op = v.query_port.expect("query_port");
            let mut p = sys::ibv_port_attr::default();
            assert_eq!(op(c, 1, &mut p, core::mem::size_of_val(&p)), 0);
            assert_eq!(p.state, sys::IBV_PORT_ACTIVE);
            assert_eq!(p.link_layer, sys::IBV_LINK_LAYER_ETHERNET as u8);
            assert_eq!(p.active_mtu, sys::IBV_MTU_4096, "lo's MTU is 64 KiB");
            assert_eq!(op(c, 2, &mut p, core::mem::size_of_val(&p)), libc::EINVAL);
            // The exported compat call writes 48 octets, not the 52 of today's struct.
            let mut compat = [0xAAu8; 52];
            assert_eq!(sr_ibv_query_port(c, 1, compat.as_mut_ptr().cast()), 0);
            assert_eq!(compat[48..], [0xAA; 4]);
            assert_eq!(compat[0], sys::IBV_PORT_ACTIVE as u8);
            let mut gid = sys::ibv_gid::default();
            assert_eq!(sr_ibv_query_gid(c, 1, 0, &mut gid), 0);
            assert_eq!(
                gid.raw,
                [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]
            );
            assert_eq!(sr_ibv_query_gid(c, 1, 1, &mut gid), -1);
            let mut e = sys::ibv_gid_entry::default();
            let sz = core::mem::size_of_val(&e);
            assert_eq!(sr__ibv_query_gid_ex(c, 1, 0, &mut e, 0, sz), 0);
            assert_eq!(e.gid_type, sys::IBV_GID_TYPE_ROCE_V2);
            assert!(e.ndev_ifindex > 0);
            assert_eq!(sr__ibv_query_gid_ex(c, 1, 1, &mut e, 0, sz), libc::ENODATA);
            assert_eq!(
                sr__ibv_query_gid_ex(c, 1, 0, &mut e, 0, sz - 1),
                libc::EINVAL
            );
            let mut table = [sys::ibv_gid_entry::default(); 4];
            assert_eq!(sr__ibv_query_gid_table(c, table.as_mut_ptr(), 4, 0, sz), 1);
            assert_eq!(table[0].gid.raw, gid.raw);
            let mut ty = 9u32;
            assert_eq!(sr_ibv_query_gid_type(c, 1, 0, &mut ty), 0);
            assert_eq!(ty, 1, "RoCE v2 in sysfs terms");
            let mut pkey = 0u16;
            assert_eq!(sr_ibv_query_pkey(c, 1, 0, &mut pkey), 0);
            assert_eq!(u16::from_be(pkey), 0xffff);
            assert_eq!(sr_ibv_query_pkey(c, 1, 1, &mut pkey), -1);
            assert_eq!(sr_ibv_get_pkey_index(c, 1, 0xffffu16.to_be()), 0);
            assert_eq!(sr_ibv_get_pkey_index(c, 1, 0x8001u16.to_be()), -1);
            assert_eq!(sr_ibv_close_device(c), 0);
        }
    }

    #[test]
    fn sysfs_files_read_as_rdma_core_reads_them() {
        let d = &devices()[0];
        let dir = CString::new(
            std::ffi::CStr::from_bytes_until_nul(&d.dev.ibdev_path.map(|c| c as u8))
                .unwrap()
                .to_bytes(),
        )
        .unwrap();
        let mut buf = [0 as c_char; 64];
        // SAFETY: C strings and a buffer of the size given.
        unsafe {
            let n =
                sr_ibv_read_sysfs_file(dir.as_ptr(), c"node_guid".as_ptr(), buf.as_mut_ptr(), 64);
            assert_eq!(n, 19);
            let s = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
            assert_eq!(s.replace(':', ""), format!("{:016x}", d.guid()));
            // Truncated to the buffer, NUL-terminated.
            assert_eq!(
                sr_ibv_read_sysfs_file(dir.as_ptr(), c"node_guid".as_ptr(), buf.as_mut_ptr(), 5),
                4
            );
            assert_eq!(CStr::from_ptr(buf.as_ptr()).to_bytes().len(), 4);
            assert_eq!(
                sr_ibv_read_sysfs_file(dir.as_ptr(), c"nope".as_ptr(), buf.as_mut_ptr(), 64),
                -1
            );
            assert_eq!(*libc::__errno_location(), libc::ENOENT);
            assert_eq!(
                sr_ibv_read_sysfs_file(ptr::null(), c"x".as_ptr(), buf.as_mut_ptr(), 64),
                -1
            );
        }
        let root = CStr::from_ptr_safe(sr_ibv_get_sysfs_path());
        assert!(dir.to_str().unwrap().starts_with(root));
    }

    trait FromPtrSafe {
        fn from_ptr_safe(p: *const c_char) -> &'static str;
    }
    impl FromPtrSafe for CStr {
        fn from_ptr_safe(p: *const c_char) -> &'static str {
            // SAFETY: a static C string of ours.
            unsafe { CStr::from_ptr(p) }.to_str().unwrap()
        }
    }

    use std::ffi::CString;
}
