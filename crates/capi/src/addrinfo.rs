//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`: names and services through the system's
//! `getaddrinfo`, as librdmacm's do when no route service answers; one result, the first
//! address found.

use core::ffi::{c_char, c_int};
use std::ptr;

use crate::errno;
use crate::sys;

/// `RAI_PASSIVE` (`rdma_cma.h`): the address is one to listen on.
pub(crate) const RAI_PASSIVE: c_int = 1;

/// One result with room for its two addresses.
#[repr(C)]
struct AddrInfo {
    ai: sys::rdma_addrinfo,
    src: sys::sockaddr_storage,
    dst: sys::sockaddr_storage,
}

/// `rdma_getaddrinfo`: 0, or the `getaddrinfo` error (`EAI_*`) that `gai_strerror` names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const sys::rdma_addrinfo,
    res: *mut *mut sys::rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: NULL or the program's hints.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    // SAFETY: a zeroed addrinfo is the "no hints" of getaddrinfo.
    let mut gh: libc::addrinfo = unsafe { std::mem::zeroed() };
    gh.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    gh.ai_socktype = libc::SOCK_STREAM;
    gh.ai_flags = if passive { libc::AI_PASSIVE } else { 0 };
    let mut out: *mut libc::addrinfo = ptr::null_mut();
    // SAFETY: C strings (or NULL) from the program, our hints and out-pointer.
    let rc = unsafe { libc::getaddrinfo(node, service, &gh, &mut out) };
    if rc != 0 {
        return rc;
    }
    // SAFETY: getaddrinfo succeeded: at least one result.
    let first = unsafe { &*out };
    let mut b = Box::new(AddrInfo {
        ai: sys::rdma_addrinfo {
            ai_flags: flags,
            ai_family: first.ai_family,
            ai_qp_type: h.map_or(0, |h| h.ai_qp_type).max(0),
            ai_port_space: h
                .map(|h| h.ai_port_space)
                .filter(|&p| p != 0)
                .unwrap_or(sys::RDMA_PS_TCP as c_int),
            ..Default::default()
        },
        src: sys::sockaddr_storage::default(),
        dst: sys::sockaddr_storage::default(),
    });
    if b.ai.ai_qp_type == 0 {
        b.ai.ai_qp_type = if b.ai.ai_port_space == sys::RDMA_PS_UDP as c_int {
            sys::IBV_QPT_UD as c_int
        } else {
            sys::IBV_QPT_RC as c_int
        };
    }
    let len = (first.ai_addrlen as usize).min(size_of::<sys::sockaddr_storage>());
    let target = if passive { &mut b.src } else { &mut b.dst };
    // SAFETY: `len` octets of the result's address into our storage.
    unsafe {
        ptr::copy_nonoverlapping(
            first.ai_addr.cast::<u8>(),
            ptr::from_mut(target).cast::<u8>(),
            len,
        )
    };
    // SAFETY: the list getaddrinfo returned.
    unsafe { libc::freeaddrinfo(out) };
    let raw = Box::into_raw(b);
    // SAFETY: the box just made; its addresses point into itself.
    unsafe {
        let a = &mut *raw;
        if passive {
            a.ai.ai_src_addr = ptr::from_mut(&mut a.src).cast();
            a.ai.ai_src_len = len as sys::socklen_t;
        } else {
            a.ai.ai_dst_addr = ptr::from_mut(&mut a.dst).cast();
            a.ai.ai_dst_len = len as sys::socklen_t;
            // The source the hints name, if any.
            if let Some(h) = h
                && !h.ai_src_addr.is_null()
                && h.ai_src_len > 0
            {
                let n = (h.ai_src_len as usize).min(size_of::<sys::sockaddr_storage>());
                ptr::copy_nonoverlapping(
                    h.ai_src_addr.cast::<u8>(),
                    ptr::from_mut(&mut a.src).cast::<u8>(),
                    n,
                );
                a.ai.ai_src_addr = ptr::from_mut(&mut a.src).cast();
                a.ai.ai_src_len = n as sys::socklen_t;
            }
        }
        *res = raw.cast();
    }
    0
}

/// `rdma_freeaddrinfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rdma_freeaddrinfo(res: *mut sys::rdma_addrinfo) {
    if !res.is_null() {
        // SAFETY: a result of sr_rdma_getaddrinfo (the program's promise).
        drop(unsafe { Box::from_raw(res.cast::<AddrInfo>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_names_both_ways_and_errors() {
        let mut r = ptr::null_mut();
        // SAFETY: C strings and an out-pointer.
        unsafe {
            assert_eq!(
                sr_rdma_getaddrinfo(c"127.0.0.1".as_ptr(), c"7471".as_ptr(), ptr::null(), &mut r),
                0
            );
            let a = &*r;
            assert!(a.ai_src_addr.is_null());
            let sin = &*a.ai_dst_addr.cast::<libc::sockaddr_in>();
            assert_eq!(
                (
                    u16::from_be(sin.sin_port),
                    u32::from_be(sin.sin_addr.s_addr)
                ),
                (7471, 0x7f00_0001)
            );
            assert_eq!(a.ai_port_space, sys::RDMA_PS_TCP as c_int);
            assert_eq!(a.ai_qp_type, sys::IBV_QPT_RC as c_int);
            sr_rdma_freeaddrinfo(r);
            let hints = sys::rdma_addrinfo {
                ai_flags: RAI_PASSIVE,
                ai_port_space: sys::RDMA_PS_UDP as c_int,
                ..Default::default()
            };
            assert_eq!(
                sr_rdma_getaddrinfo(ptr::null(), c"9".as_ptr(), &hints, &mut r),
                0
            );
            let a = &*r;
            assert!(a.ai_dst_addr.is_null() && !a.ai_src_addr.is_null());
            assert_eq!(a.ai_qp_type, sys::IBV_QPT_UD as c_int);
            sr_rdma_freeaddrinfo(r);
            assert_ne!(
                sr_rdma_getaddrinfo(
                    c"no.such.host.invalid".as_ptr(),
                    ptr::null(),
                    ptr::null(),
                    &mut r
                ),
                0
            );
            assert_eq!(
                sr_rdma_getaddrinfo(ptr::null(), ptr::null(), ptr::null(), &mut r),
                -1
            );
        }
    }
}
