//! The rest of rdma-core 44's symbols, until each is built: present, because every Debian
//! program is linked `-z now` (a missing name stops it at load time even if never called),
//! and answering "not supported" the way each function reports failure.

use core::ffi::{c_int, c_void};
use std::ptr;

use crate::errno;

/// Functions returning a pointer: NULL, `errno = EOPNOTSUPP`.
macro_rules! null {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> *mut c_void {
            errno::set(libc::EOPNOTSUPP);
            ptr::null_mut()
        }
    )*};
}

/// Functions returning an errno (rdma-core's `ibv_*` convention): `EOPNOTSUPP`.
macro_rules! errno_value {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> c_int {
            errno::set(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

/// Functions returning -1 with `errno` (librdmacm's and the socket calls' convention).
macro_rules! minus_one {
    ($err:expr; $($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> isize {
            errno::set($err);
            -1
        }
    )*};
}

/// Functions without a result: nothing to undo, as nothing of theirs can exist yet.
macro_rules! nothing {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() {}
    )*};
}

null!(
    sr_ibv_reg_dmabuf_mr,
    sr_ibv_import_device,
    sr_ibv_import_mr,
    sr_ibv_import_pd,
    sr_ibv_import_dm,
    sr_rdma_get_devices,
);

errno_value!(
    sr_ibv_rereg_mr,
    sr_ibv_resize_cq,
    sr_ibv_query_qp_data_in_order,
    sr_ibv_attach_mcast,
    sr_ibv_detach_mcast,
    sr_ibv_query_ece,
    sr_ibv_set_ece,
    sr_ibv_resolve_eth_l2_from_gid,
);

minus_one!(libc::EOPNOTSUPP;
    sr_rdma_create_srq,
    sr_rdma_create_srq_ex,
    sr_rdma_reject_ece,
    sr_rdma_notify,
    sr_rdma_join_multicast,
    sr_rdma_join_multicast_ex,
    sr_rdma_leave_multicast,
    sr_rdma_init_qp_attr,
    sr_rdma_get_remote_ece,
    sr_rdma_set_local_ece,
);

// The rsocket family: not built (programs that call them learn it from errno).
minus_one!(libc::ENOSYS;
    sr_rsocket,
    sr_rbind,
    sr_rlisten,
    sr_raccept,
    sr_rconnect,
    sr_rshutdown,
    sr_rclose,
    sr_rrecv,
    sr_rrecvfrom,
    sr_rrecvmsg,
    sr_rsend,
    sr_rsendto,
    sr_rsendmsg,
    sr_rread,
    sr_rreadv,
    sr_rwrite,
    sr_rwritev,
    sr_rselect,
    sr_rgetpeername,
    sr_rgetsockname,
    sr_rsetsockopt,
    sr_rgetsockopt,
    sr_rfcntl,
    sr_riomap,
    sr_riounmap,
    sr_riowrite,
);

nothing!(
    sr_ibv_unimport_mr,
    sr_ibv_unimport_pd,
    sr_ibv_unimport_dm,
    sr_ibv_copy_qp_attr_from_kern,
    sr_ibv_copy_ah_attr_from_kern,
    sr_ibv_copy_path_rec_from_kern,
    sr_ibv_copy_path_rec_to_kern,
    sr_rdma_destroy_srq,
    sr_rdma_free_devices,
);

/// `rpoll`: rsockets are never made here, so every fd is an ordinary one: `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the program's array of `nfds` pollfds, handed to the kernel as it is.
    unsafe { libc::poll(fds, nfds, timeout) }
}

/// The direct-verbs functions of `libmlx5.so.1` and `libefa.so.1` (`build.rs` makes them
/// from `abi/libmlx5.syms` and `abi/libefa.syms`): no device of ours is theirs, so
/// `mlx5dv_is_supported` says false and the rest fail.
mod dv {
    include!(concat!(env!("OUT_DIR"), "/dv_stubs.rs"));
}
