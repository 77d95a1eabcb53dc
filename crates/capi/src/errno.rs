//! `errno`, as rdma-core's functions set it.

use core::ffi::c_int;

/// Sets the calling thread's `errno`.
pub(crate) fn set(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// `errno = e`, and the `-1` most calls return with it.
pub(crate) fn fail(e: c_int) -> c_int {
    set(e);
    -1
}

/// The calling thread's `errno`.
pub(crate) fn get() -> c_int {
    // SAFETY: as in `set`.
    unsafe { *libc::__errno_location() }
}

/// The calling thread's `errno`, or `default` where the failing call left none.
pub(crate) fn or(default: c_int) -> c_int {
    match get() {
        0 => default,
        e => e,
    }
}
