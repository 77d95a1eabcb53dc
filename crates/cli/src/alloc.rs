//! The process's allocator, chosen once before `main` by the command.
//!
//! mimalloc is fastest where threads hand small messages to each other (RPC: the connection
//! thread allocates, a worker frees; glibc's arenas cost a quarter of user time there). But it
//! keeps freed memory for reuse, so a long-running server's RSS moves by tens of megabytes from
//! one burst to the next though its live heap does not. `softrdma nfsd` therefore runs on
//! glibc's malloc with two arenas and large blocks mapped on their own, whose RSS follows the
//! live heap (docs/performance.md, issue 41). `SOFTRDMA_MALLOC=glibc|mimalloc` overrides.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{CStr, c_char, c_int};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use mimalloc::MiMalloc;

/// Commands that run on glibc's malloc unless `SOFTRDMA_MALLOC` says otherwise.
const GLIBC_COMMANDS: &[&[u8]] = &[b"nfsd"];

/// glibc: at most two arenas (one per core here; a server's threads share them instead of
/// each keeping its own), and blocks from 128 KiB up mapped whole so that freeing them
/// returns them at once (the threshold otherwise grows with the largest block freed).
const GLIBC_ARENA_MAX: c_int = 2;
const GLIBC_MMAP_THRESHOLD: c_int = 128 * 1024;

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const GLIBC: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The global allocator: mimalloc or glibc, whichever `choose` settled on.
pub struct Allocator;

/// The allocator in force. The first allocation settles it: if it came before `choose`
/// ran, the process stays on mimalloc (a block is always freed by the allocator that made it).
#[inline]
fn choice() -> u8 {
    match CHOICE.load(Relaxed) {
        UNDECIDED => match CHOICE.compare_exchange(UNDECIDED, MIMALLOC, Relaxed, Relaxed) {
            Ok(_) => MIMALLOC,
            Err(settled) => settled,
        },
        settled => settled,
    }
}

/// Which allocator a command line asks for: `SOFTRDMA_MALLOC` if it names one, else the
/// command's own.
fn wanted(command: Option<&[u8]>, env: Option<&[u8]>) -> u8 {
    match env {
        Some(b"glibc") => GLIBC,
        Some(b"mimalloc") => MIMALLOC,
        _ if command.is_some_and(|c| GLIBC_COMMANDS.contains(&c)) => GLIBC,
        _ => MIMALLOC,
    }
}

/// Run by the loader before `main` (glibc passes `argc`, `argv` and `envp` to `.init_array`
/// functions, as Rust's own runtime relies on): reads the command without allocating.
extern "C" fn choose(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    let command = (argc >= 2 && !argv.is_null()).then(|| {
        // SAFETY: the loader passes the process's argv: argc valid NUL-terminated strings.
        unsafe { CStr::from_ptr(*argv.add(1)) }.to_bytes()
    });
    // SAFETY: before main, one thread; getenv returns null or a NUL-terminated string.
    let env = unsafe {
        let v = libc::getenv(c"SOFTRDMA_MALLOC".as_ptr());
        (!v.is_null()).then(|| CStr::from_ptr(v).to_bytes())
    };
    if wanted(command, env) == GLIBC
        && CHOICE
            .compare_exchange(UNDECIDED, GLIBC, Relaxed, Relaxed)
            .is_ok()
    {
        // SAFETY: mallopt only sets glibc's tunables; nothing has been allocated through us.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, GLIBC_ARENA_MAX);
            libc::mallopt(libc::M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD);
        }
    }
}

#[used]
// SAFETY: an `.init_array` entry is a function pointer with the signature glibc calls.
#[unsafe(link_section = ".init_array")]
static CHOOSE: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = choose;

/// The allocator in force and, on glibc, the octets the program holds from it now (blocks
/// in use in its arenas and mapped on their own): `nfsd --stats` prints it beside RSS.
pub fn describe() -> String {
    if choice() == GLIBC {
        // SAFETY: mallinfo2 only reads glibc's statistics, under its arenas' locks.
        let m = unsafe { libc::mallinfo2() };
        format!("memory from glibc, {} octets in use", m.uordblks + m.hblkhd)
    } else {
        "memory from mimalloc".to_string()
    }
}

// SAFETY: every call goes to one allocator for the whole process (`choice` never changes once
// settled), so each block is freed and resized by the allocator that made it.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if choice() == GLIBC {
                System.alloc(layout)
            } else {
                MiMalloc.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if choice() == GLIBC {
                System.alloc_zeroed(layout)
            } else {
                MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on; the same allocator made `ptr`.
        unsafe {
            if choice() == GLIBC {
                System.dealloc(ptr, layout)
            } else {
                MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on; the same allocator made `ptr`.
        unsafe {
            if choice() == GLIBC {
                System.realloc(ptr, layout, new_size)
            } else {
                MiMalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfsd_runs_on_glibc_and_the_environment_overrides() {
        assert_eq!(wanted(Some(b"nfsd"), None), GLIBC);
        assert_eq!(wanted(Some(b"rpc"), None), MIMALLOC);
        assert_eq!(wanted(Some(b"perf"), None), MIMALLOC);
        assert_eq!(wanted(None, None), MIMALLOC);
        assert_eq!(wanted(Some(b"nfsd"), Some(b"mimalloc")), MIMALLOC);
        assert_eq!(wanted(Some(b"perf"), Some(b"glibc")), GLIBC);
        // An unknown name leaves the command's choice.
        assert_eq!(wanted(Some(b"nfsd"), Some(b"jemalloc")), GLIBC);
        assert_eq!(wanted(Some(b"nfsd-x"), None), MIMALLOC);
    }
}
