//! The sysfs tree of our devices, laid out as the kernel's (`class/infiniband/<device>/…`,
//! `class/infiniband_verbs/uverbs<N>/…`) under [`env::sysfs_root`]: what `ibdev_path`,
//! `ibv_get_sysfs_path` and `ibv_read_sysfs_file` lead programs to. Each file is written
//! whole and renamed into place, so that processes starting together never read half a file.

use core::ffi::{CStr, c_char, c_int};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::ptr;

use crate::device::{PORT, SrDevice, port_attr};
use crate::env;
use crate::errno;

fn put(dir: &Path, name: &str, text: &str) -> io::Result<()> {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}.{n}", std::process::id()));
    std::fs::write(&tmp, format!("{text}\n"))?;
    std::fs::rename(&tmp, &path)
}

fn guid_text(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn gid_text(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn write_device(root: &Path, d: &SrDevice) -> io::Result<()> {
    let dir = root.join("class/infiniband").join(d.inner.name());
    let roce = d.inner.roce_config().is_some();
    let node_type = if roce { "1: CA" } else { "4: RNIC" };
    put(&dir, "node_type", node_type)?;
    put(&dir, "node_guid", &guid_text(d.guid()))?;
    put(&dir, "sys_image_guid", &guid_text(d.guid()))?;
    put(&dir, "fw_ver", env!("CARGO_PKG_VERSION"))?;
    put(&dir, "hca_type", "softrdma")?;
    put(&dir, "hw_rev", "0")?;
    put(&dir, "board_id", "softrdma")?;
    put(&dir, "node_desc", &format!("softrdma {}", d.inner.name()))?;
    let p = port_attr(d);
    let port = dir.join(format!("ports/{PORT}"));
    put(&port, "state", "4: ACTIVE")?;
    put(&port, "phys_state", "5: LinkUp")?;
    put(&port, "link_layer", "Ethernet")?;
    put(&port, "rate", "56 Gb/sec (4X FDR)")?;
    put(&port, "lid", "0x0")?;
    put(&port, "sm_lid", "0x0")?;
    put(&port, "lid_mask_count", "0")?;
    put(&port, "cap_mask", &format!("0x{:08x}", p.port_cap_flags))?;
    put(&port, "gids/0", &gid_text(&d.gid()))?;
    let ty = if roce { "RoCE v2" } else { "IB/RoCE v1" };
    put(&port, "gid_attrs/types/0", ty)?;
    put(
        &port,
        "gid_attrs/ndevs/0",
        d.inner.interface().unwrap_or(""),
    )?;
    put(&port, "pkeys/0", "0xffff")?;
    let uverbs = root
        .join("class/infiniband_verbs")
        .join(format!("uverbs{}", d.index()));
    put(&uverbs, "ibdev", d.inner.name())?;
    put(&uverbs, "abi_version", "1")?;
    put(&root.join("class/infiniband_verbs"), "abi_version", "6")
}

/// Writes the tree for `devs` (once per process, when the device list is first made). A
/// tree that cannot be written leaves the sysfs reads failing, not the verbs.
pub fn write(devs: &[SrDevice]) {
    let root = env::sysfs_root_path();
    for d in devs {
        if let Err(e) = write_device(root, d) {
            eprintln!(
                "softrdma: cannot write the sysfs tree at {}: {e}",
                root.display()
            );
            return;
        }
    }
}

/// `ibv_get_sysfs_path`: the root of the tree the library writes (see [`env`]).
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_get_sysfs_path() -> *const c_char {
    env::sysfs_root_c().as_ptr()
}

/// `ibv_read_sysfs_file`: the file `dir/file` into `buf` (NUL-terminated, its trailing
/// newline dropped); its length, or -1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program passes NUL-terminated strings.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(d.to_bytes()))
        .join(std::ffi::OsStr::from_bytes(f.to_bytes()));
    let mut data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) => return errno::fail(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    data.truncate(size - 1);
    if data.last() == Some(&b'\n') {
        data.pop();
    }
    // SAFETY: `buf` has `size` octets; at most `size - 1` are copied, then the NUL.
    unsafe {
        ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len());
        *buf.add(data.len()) = 0;
    }
    data.len() as c_int
}
