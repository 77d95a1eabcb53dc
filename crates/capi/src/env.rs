//! Where a program finds what rdma-core's programs read beside the library: the sysfs tree
//! of our devices (`ibdev_path`, `ibv_get_sysfs_path`), and the directory of library names
//! `softrdma run` puts first on `LD_LIBRARY_PATH`.
//!
//! The tree is private to the user: `$SOFTRDMA_SYSFS`, else `sys` in [`private_base`]; laid out as the kernel's (`class/infiniband/<device>/…`,
//! `class/infiniband_verbs/uverbs<N>/…`), each file written whole and renamed into place,
//! so that processes starting together never read half a file.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The environment variable that sets how polls of a long-empty CQ back off
/// (`softrdma::PollBackoff`): `off`, or `AFTER_US,WAIT_US`.
pub const POLL_BACKOFF_VAR: &str = "SOFTRDMA_POLL_BACKOFF";

/// The back-off `$SOFTRDMA_POLL_BACKOFF` asks for; `None` when unset or unreadable (the
/// library's default then).
pub(crate) fn poll_backoff() -> Option<Option<softrdma::PollBackoff>> {
    static B: OnceLock<Option<Option<softrdma::PollBackoff>>> = OnceLock::new();
    *B.get_or_init(|| parse_poll_backoff(&std::env::var(POLL_BACKOFF_VAR).ok()?))
}

fn parse_poll_backoff(v: &str) -> Option<Option<softrdma::PollBackoff>> {
    if v.trim() == "off" {
        return Some(None);
    }
    let (a, w) = v.split_once(',')?;
    let us = |x: &str| {
        x.trim()
            .parse::<u64>()
            .ok()
            .map(std::time::Duration::from_micros)
    };
    Some(Some(softrdma::PollBackoff {
        after: us(a)?,
        wait: us(w)?,
    }))
}

/// The environment variable naming the sysfs tree's root.
pub const SYSFS_VAR: &str = "SOFTRDMA_SYSFS";

/// The user's private directory: `$XDG_RUNTIME_DIR/softrdma`, else `/tmp/softrdma-<uid>`,
/// made with mode 0700 if missing; refused unless it is a directory the user owns (another
/// user's, or a link, in a shared `/tmp` would be theirs to fill).
pub fn private_base() -> io::Result<PathBuf> {
    let base = match std::env::var_os("XDG_RUNTIME_DIR").filter(|r| !r.is_empty()) {
        Some(x) => Path::new(&x).join("softrdma"),
        None => {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/softrdma-{uid}"))
        }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(&base)?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory of this user's that only it may write",
                base.display()
            ),
        ));
    }
    Ok(base)
}

pub(crate) fn sysfs_root_path() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        if let Some(r) = std::env::var_os(SYSFS_VAR).filter(|r| !r.is_empty()) {
            return PathBuf::from(r);
        }
        match private_base() {
            Ok(b) => b.join("sys"),
            Err(e) => {
                eprintln!("softrdma: no private directory for the sysfs tree: {e}");
                PathBuf::from("/nonexistent/softrdma/sys")
            }
        }
    })
}

/// The sysfs tree's root.
pub fn sysfs_root() -> String {
    sysfs_root_path().display().to_string()
}

/// The same, as the C string `ibv_get_sysfs_path` returns.
pub fn sysfs_root_c() -> &'static CString {
    static C: OnceLock<CString> = OnceLock::new();
    C.get_or_init(|| CString::new(sysfs_root()).unwrap_or_default())
}

/// The names a program's loader asks for, each a link to the library `lib`: what
/// `softrdma run` puts first on `LD_LIBRARY_PATH`. Debian's perftest, UCX and libfabric
/// are linked against the direct-verbs libraries too; the loader finds the object it has
/// already loaded behind every name (one file), so there is one copy of everything.
pub const SONAMES: [&str; 4] = [
    "libibverbs.so.1",
    "librdmacm.so.1",
    "libmlx5.so.1",
    "libefa.so.1",
];

/// Makes `dir` hold [`SONAMES`] as links to `lib` (replacing older links).
pub fn link_libraries(lib: &Path, dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for name in SONAMES {
        let at = dir.join(name);
        // A name no other process or thread is making now.
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{n}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(lib, &tmp)?;
        std::fs::rename(&tmp, &at)?;
    }
    Ok(())
}

/// The directory of [`SONAMES`] for library `lib` in [`private_base`]: one per library
/// file, so that programs started from two builds at once each load their own.
pub fn lib_dir_for(lib: &Path) -> io::Result<PathBuf> {
    let h = fnv1a(lib.as_os_str().as_encoded_bytes());
    Ok(private_base()?.join(format!("lib-{h:016x}")))
}

/// FNV-1a: a name's stable 64-bit digest (not for anything an adversary chooses to collide).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The variable whose filter (`RUST_LOG`'s syntax: `softrdma=debug,softrdma_iwarp=info`)
/// puts softrdma's own events on the program's standard error.
pub const LOG_VAR: &str = "SOFTRDMA_LOG";

/// With [`LOG_VAR`] set, softrdma's events go to standard error (once per process; a
/// program that installed a `tracing` subscriber of its own keeps it).
pub(crate) fn init_log() {
    let Some(filter) = std::env::var_os(LOG_VAR) else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(filter.to_string_lossy());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn poll_backoff_settings_read_as_written() {
        assert_eq!(parse_poll_backoff("off"), Some(None));
        assert_eq!(
            parse_poll_backoff("2000, 50"),
            Some(Some(softrdma::PollBackoff {
                after: Duration::from_millis(2),
                wait: Duration::from_micros(50),
            }))
        );
        for bad in ["", "on", "1000", "1000,x", "-1,5"] {
            assert_eq!(parse_poll_backoff(bad), None, "{bad:?}");
        }
    }
}
