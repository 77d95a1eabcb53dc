//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`): on RoCE a destination is its GID,
//! an IP address, where its RoCEv2 port receives.

use core::ffi::c_int;
use std::ptr;

use crate::device::PORT;
use crate::errno;
use crate::live::Live;
use crate::pd::pd;
use crate::sys;

/// An address handle as rdma-core lays it out, with softrdma's behind it.
#[repr(C)]
pub struct SrAh {
    ah: sys::ibv_ah,
    pub inner: softrdma::roce::Ah,
}

static AHS: Live = Live::new();

/// `ibv_create_ah`: RoCE needs the GRH (`is_global`); there is no LID routing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_ah(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    let Some(p) = self::pd(pd) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    if attr.is_null() {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the program's attributes (checked non-NULL).
    let a = unsafe { &*attr };
    if a.is_global == 0 || (a.port_num != PORT && a.port_num != 0) {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: a GID is 16 octets whichever way the union is read.
    let dgid = unsafe { a.grh.dgid.raw };
    let inner = match p.inner.create_ah(softrdma::roce::gid_to_ip(&dgid)) {
        Ok(ah) => ah,
        Err(softrdma::Error::Unsupported(_)) => {
            errno::set(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        Err(_) => {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
    };
    let b = Box::new(SrAh {
        ah: sys::ibv_ah {
            context: p.ctx_ptr(),
            pd,
            handle: inner.id(),
        },
        inner,
    });
    let h = Box::into_raw(b).cast::<sys::ibv_ah>();
    AHS.insert(h);
    h
}

/// `ibv_destroy_ah`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
    if !AHS.remove(ah) {
        return libc::EINVAL;
    }
    // SAFETY: it was live: a boxed SrAh, now ours alone.
    drop(unsafe { Box::from_raw(ah.cast::<SrAh>()) });
    0
}

/// softrdma's handle behind `ah` (posting: the program's promise that it is one of ours,
/// as rdma-core's providers take it).
///
/// # Safety
/// `ah` is a live address handle of this library.
pub(crate) unsafe fn ah_id(ah: *mut sys::ibv_ah) -> u32 {
    // SAFETY: the caller's promise: the first field of a boxed SrAh.
    unsafe { (*ah.cast::<SrAh>()).inner.id() }
}

/// The sender of a UD message, from the 40-octet GRH area its receive began with: for
/// RoCEv2 over IPv4, rxe's layout (20 zero octets, then the IPv4 header); over IPv6, the
/// IPv6 header.
fn sender_of(grh: &[u8; 40]) -> Option<std::net::IpAddr> {
    if grh[20] >> 4 == 4 {
        let a: [u8; 4] = grh[32..36].try_into().ok()?;
        return Some(std::net::Ipv4Addr::from(a).into());
    }
    if grh[0] >> 4 == 6 {
        let a: [u8; 16] = grh[8..24].try_into().ok()?;
        return Some(std::net::Ipv6Addr::from(a).into());
    }
    None
}

/// `ibv_init_ah_from_wc`: the address of the sender of the UD message `wc` completed, to
/// answer it; RoCE needs the GRH (`IBV_WC_GRH`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_init_ah_from_wc(
    _ctx: *mut sys::ibv_context,
    port_num: u8,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    attr: *mut sys::ibv_ah_attr,
) -> c_int {
    if wc.is_null() || grh.is_null() || attr.is_null() {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program's completion.
    if unsafe { (*wc).wc_flags } & sys::IBV_WC_GRH == 0 {
        return errno::fail(libc::EINVAL);
    }
    // SAFETY: the program's 40-octet GRH area (`struct ibv_grh`).
    let area = unsafe { &*grh.cast::<[u8; 40]>() };
    let Some(ip) = sender_of(area) else {
        return errno::fail(libc::EINVAL);
    };
    // SAFETY: the program passes room for the attributes.
    unsafe { attr.write(ah_attr_to(ip, port_num, 0xff)) };
    0
}

/// The address of the RoCEv2 peer at `ip` (its GID, the GRH mandatory on RoCE).
pub(crate) fn ah_attr_to(ip: std::net::IpAddr, port_num: u8, hop_limit: u8) -> sys::ibv_ah_attr {
    sys::ibv_ah_attr {
        grh: sys::ibv_global_route {
            dgid: sys::ibv_gid {
                raw: softrdma::roce::gid_from_ip(ip),
            },
            hop_limit,
            ..Default::default()
        },
        is_global: 1,
        port_num,
        ..Default::default()
    }
}

/// `ibv_create_ah_from_wc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_create_ah_from_wc(
    pd: *mut sys::ibv_pd,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    port_num: u8,
) -> *mut sys::ibv_ah {
    let mut attr = sys::ibv_ah_attr::default();
    // SAFETY: the program's arguments, passed on.
    if unsafe { sr_ibv_init_ah_from_wc(ptr::null_mut(), port_num, wc, grh, &mut attr) } != 0 {
        return ptr::null_mut();
    }
    // SAFETY: our own attributes.
    unsafe { sr_ibv_create_ah(pd, &mut attr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_from_both_kinds_of_grh() {
        // rxe's IPv4 layout: 20 zero octets, then the header (version 4, IHL 5).
        let mut g = [0u8; 40];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&[127, 1, 2, 3]);
        g[36..40].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(
            sender_of(&g),
            Some(std::net::Ipv4Addr::new(127, 1, 2, 3).into())
        );
        let mut g6 = [0u8; 40];
        g6[0] = 0x60;
        let s6: std::net::Ipv6Addr = "fd00::5".parse().unwrap();
        g6[8..24].copy_from_slice(&s6.octets());
        assert_eq!(sender_of(&g6), Some(s6.into()));
        assert_eq!(sender_of(&[0u8; 40]), None);
    }
}
