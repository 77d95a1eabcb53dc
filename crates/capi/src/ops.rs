//! `ibv_open_device`, and the ops table every context carries (rdma-core's `verbs.h` calls
//! posting and polling through it, inline in the program).

use core::ffi::c_int;
use std::ptr;

use crate::sys;
use crate::{context, cq, errno, list, mw, qp, srq};

/// The ops of every context; the ones not built are NULL (rdma-core's inline wrappers then
/// answer `EOPNOTSUPP`/`ENOSYS` themselves, or the program falls back).
fn ops() -> sys::ibv_context_ops {
    sys::ibv_context_ops {
        poll_cq: Some(cq::poll_cq),
        req_notify_cq: Some(cq::req_notify_cq),
        post_send: Some(qp::post_send),
        post_recv: Some(qp::post_recv),
        post_srq_recv: Some(srq::post_srq_recv),
        alloc_mw: Some(mw::alloc_mw),
        dealloc_mw: Some(mw::dealloc_mw),
        bind_mw: Some(qp::bind_mw),
        ..Default::default()
    }
}

/// A context on `d` with this library's ops (`ibv_open_device`, and librdmacm's contexts;
/// `leave_loopback`: see [`context::open`]).
pub(crate) fn open_device(
    d: &'static crate::device::SrDevice,
    leave_loopback: bool,
) -> Result<*mut sys::ibv_context, c_int> {
    context::open(
        d,
        ops(),
        |v| {
            v.create_qp_ex = Some(qp::create_qp_ex);
            v.create_cq_ex = Some(crate::cq::create_cq_ex);
        },
        leave_loopback,
        dispatch,
    )
}

/// A shared context's asynchronous events go to the program's contexts on it.
fn dispatch(inner: softrdma::Context, key: context::SharedKey) -> Box<dyn Send> {
    Box::new(crate::async_events::Dispatcher::start(
        inner,
        move |c: &context::SrContext| c.on(key),
    ))
}

/// `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_open_device(dev: *mut sys::ibv_device) -> *mut sys::ibv_context {
    let Some(d) = list::device(dev) else {
        errno::set(libc::ENODEV);
        return ptr::null_mut();
    };
    match open_device(d, false) {
        Ok(p) => p,
        Err(e) => {
            errno::set(e as c_int);
            ptr::null_mut()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::async_events::sr_ibv_get_async_event;
    use crate::context::*;
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

    /// No asynchronous event is reported: a program that made `async_fd` non-blocking (as
    /// UCX and SPDK do) hears `EAGAIN`, and the fd is not readable.
    #[test]
    fn the_async_fd_stays_quiet() {
        let c = open_named(softrdma::TCP_DEVICE_NAME);
        // SAFETY: a live context and its own fd; an event struct of ours.
        unsafe {
            let fd = (*c).async_fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
            let mut ev = sys::ibv_async_event::default();
            assert_eq!(sr_ibv_get_async_event(c, &mut ev), -1);
            assert_eq!(*libc::__errno_location(), libc::EAGAIN);
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            assert_eq!(libc::poll(&mut p, 1, 0), 0);
            assert_eq!(sr_ibv_get_async_event(ptr::null_mut(), &mut ev), -1);
            assert_eq!(sr_ibv_close_device(c), 0);
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
            // IPv4-mapped 127.0.0.1, or the address of 127.0.0.0/8 a context takes while
            // another (a test beside this one) holds 127.0.0.1's port (context.rs).
            assert_eq!(
                gid.raw[..13],
                [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127]
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

#[cfg(test)]
mod cq_tests {
    use super::*;
    use crate::async_events::{sr_ibv_ack_async_event, sr_ibv_get_async_event};
    use crate::cq::{WC_FLAGS, create_cq_ex, poll_cq, sr_ibv_destroy_cq};
    use crate::errno;

    /// A context on the iWARP device (no socket of its own to bind).
    fn iwarp_context() -> *mut sys::ibv_context {
        let d = list::devices()
            .iter()
            .find(|d| d.inner.transport() == softrdma::Transport::Iwarp)
            .expect("the iWARP device");
        // SAFETY: a listed device.
        let c = unsafe { sr_ibv_open_device(d.as_ptr()) };
        assert!(!c.is_null());
        c
    }

    fn attr(wc_flags: u64) -> sys::ibv_cq_init_attr_ex {
        sys::ibv_cq_init_attr_ex {
            cqe: 16,
            wc_flags,
            ..Default::default()
        }
    }

    /// A region of `pd` over `buf`, local write access.
    ///
    /// # Safety
    /// `pd` is a live PD of this library; `buf` outlives the region.
    unsafe fn local_mr(pd: *mut sys::ibv_pd, buf: &mut [u8]) -> *mut sys::ibv_mr {
        let access = sys::IBV_ACCESS_LOCAL_WRITE as c_int;
        // SAFETY: the caller's live PD; the caller keeps `buf` while the region lives.
        let mr =
            unsafe { crate::pd::sr_ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), access) };
        assert!(!mr.is_null());
        mr
    }

    /// Posts a receive `id` of 64 octets at `addr` of `mr` to `qp`.
    ///
    /// # Safety
    /// `qp` and `mr` are live objects of this library; `addr..addr + 64` lies in `mr`.
    unsafe fn post_recv_64(qp: *mut sys::ibv_qp, mr: *mut sys::ibv_mr, addr: u64, id: u64) {
        // SAFETY: the caller's live region.
        let lkey = unsafe { (*mr).lkey };
        let mut sge = sys::ibv_sge {
            addr,
            length: 64,
            lkey,
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: id,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the caller's live QP; the request and its entry outlive the call.
        assert_eq!(unsafe { qp::post_recv(qp, &mut wr, &mut bad) }, 0);
    }

    /// An RC QP of `pd` completing into `cq`, with `cap`.
    ///
    /// # Safety
    /// `pd` and `cq` are live objects of this library, of one context.
    unsafe fn rc_qp(
        pd: *mut sys::ibv_pd,
        cq: *mut sys::ibv_cq,
        cap: sys::ibv_qp_cap,
    ) -> *mut sys::ibv_qp {
        let mut init = sys::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap,
            qp_type: sys::IBV_QPT_RC,
            ..Default::default()
        };
        // SAFETY: the caller's live PD and CQ; attributes as rdma-core's callers pass them.
        let qp = unsafe { qp::sr_ibv_create_qp(pd, &mut init) };
        assert!(!qp.is_null(), "errno {}", errno::get());
        qp
    }

    /// An RC QP completing into `cq`, with a receive posted for each of `ids` and then
    /// moved to Error: each receive completes flushed.
    struct Flushed {
        pd: *mut sys::ibv_pd,
        qp: *mut sys::ibv_qp,
        mr: *mut sys::ibv_mr,
        _buf: Vec<u8>,
    }

    impl Flushed {
        /// # Safety
        /// `ctx` and `cq` are live objects of this library.
        unsafe fn new(ctx: *mut sys::ibv_context, cq: *mut sys::ibv_cq, ids: &[u64]) -> Flushed {
            // SAFETY: the C calls of this library on objects it made, with arguments as
            // rdma-core's callers pass them.
            unsafe {
                let pd = crate::pd::sr_ibv_alloc_pd(ctx);
                let cap = sys::ibv_qp_cap {
                    max_send_wr: 4,
                    max_recv_wr: ids.len() as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                };
                let qp = rc_qp(pd, cq, cap);
                let mut buf = vec![0u8; 64];
                let mr = local_mr(pd, &mut buf);
                for &id in ids {
                    post_recv_64(qp, mr, buf.as_ptr() as u64, id);
                }
                let mut a = sys::ibv_qp_attr {
                    qp_state: sys::IBV_QPS_ERR,
                    ..Default::default()
                };
                assert_eq!(
                    qp::sr_ibv_modify_qp(qp, &mut a, sys::IBV_QP_STATE as c_int),
                    0
                );
                Flushed {
                    pd,
                    qp,
                    mr,
                    _buf: buf,
                }
            }
        }
    }

    impl Drop for Flushed {
        fn drop(&mut self) {
            // SAFETY: the objects `new` made, ended once.
            unsafe {
                assert_eq!(qp::sr_ibv_destroy_qp(self.qp), 0);
                assert_eq!(crate::pd::sr_ibv_dereg_mr(self.mr), 0);
                assert_eq!(crate::pd::sr_ibv_dealloc_pd(self.pd), 0);
            }
        }
    }

    #[test]
    fn an_extended_cq_refuses_what_it_cannot_give() {
        let ctx = iwarp_context();
        // SAFETY: our own op, our context, attributes of ours.
        unsafe {
            let ts = u64::from(sys::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
            assert!(create_cq_ex(ctx, &mut attr(ts)).is_null());
            assert_eq!(errno::get(), libc::EOPNOTSUPP);
            let mut a = attr(WC_FLAGS);
            a.comp_mask = 1 << 7;
            assert!(create_cq_ex(ctx, &mut a).is_null());
            assert_eq!(errno::get(), libc::EINVAL);
            let mut a = attr(WC_FLAGS);
            a.cqe = 0;
            assert!(create_cq_ex(ctx, &mut a).is_null());
            assert_eq!(errno::get(), libc::EINVAL);
            assert!(create_cq_ex(ctx, ptr::null_mut()).is_null());
        }
    }

    /// Flushed receives, read with `start_poll`, `next_poll` and the `read_*` calls: each
    /// once, in order, with its QP; `ENOENT` when none is left (and no `end_poll` owed).
    #[test]
    fn an_extended_cq_polls_each_completion_once() {
        let ctx = iwarp_context();
        // SAFETY: the C calls of this library on objects it made; sizes and pointers as
        // rdma-core's callers pass them.
        unsafe {
            let cqx = create_cq_ex(ctx, &mut attr(WC_FLAGS));
            assert!(!cqx.is_null());
            let cq = cqx.cast::<sys::ibv_cq>();
            let f = Flushed::new(ctx, cq, &[7, 8]);
            let x = &mut *cqx;
            let mut pa = sys::ibv_poll_cq_attr::default();
            // The flush may still be on its way: poll until the first comes.
            let mut r = libc::ENOENT;
            for _ in 0..1_000_000 {
                r = (x.start_poll.unwrap())(cqx, &mut pa);
                if r == 0 {
                    break;
                }
                std::thread::yield_now();
            }
            assert_eq!(r, 0);
            let mut seen = vec![(x.wr_id, x.status)];
            assert_eq!((x.read_opcode.unwrap())(cqx), sys::IBV_WC_RECV);
            assert_eq!((x.read_qp_num.unwrap())(cqx), (*f.qp).qp_num);
            while (x.next_poll.unwrap())(cqx) == 0 {
                seen.push((x.wr_id, x.status));
            }
            (x.end_poll.unwrap())(cqx);
            assert_eq!(
                seen,
                [7, 8].map(|id| (id, sys::IBV_WC_WR_FLUSH_ERR)),
                "each once, in order"
            );
            // Nothing left: ENOENT, and the CQ is not left locked.
            assert_eq!((x.start_poll.unwrap())(cqx, &mut pa), libc::ENOENT);
            assert_eq!((x.start_poll.unwrap())(cqx, ptr::null_mut()), libc::ENOENT);
            pa.comp_mask = 1;
            assert_eq!((x.start_poll.unwrap())(cqx, &mut pa), libc::EINVAL);
            // The same queue as an ordinary CQ.
            let mut wc = sys::ibv_wc::default();
            assert_eq!(poll_cq(cq, 1, &mut wc), 0);
            drop(f);
            assert_eq!(sr_ibv_destroy_cq(cq), 0);
        }
    }

    /// A CQ that overruns is reported on its context's async fd (`IBV_EVENT_CQ_ERR`, naming
    /// the CQ): the fd turns readable, the event is taken once, acknowledged where rdma-core
    /// counts it, and the fd is quiet again.
    #[test]
    fn a_cq_overrun_is_an_async_event_of_its_context() {
        let ctx = iwarp_context();
        // SAFETY: the C calls of this library on objects it made, with arguments as
        // rdma-core's callers pass them.
        unsafe {
            let fd = (*ctx).async_fd;
            let cq = cq::sr_ibv_create_cq(ctx, 1, ptr::null_mut(), ptr::null_mut(), 0);
            assert!(!cq.is_null());
            // Flushing more receives than the CQ holds overruns it.
            let ids: Vec<u64> = (0..=(*cq).cqe as u64 + 1).collect();
            let f = Flushed::new(ctx, cq, &ids);
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // A safety net, not a wait for a time: the event comes as the flush does.
            assert_eq!(
                libc::poll(&mut p, 1, 30_000),
                1,
                "the async fd turns readable"
            );
            let mut ev = std::mem::zeroed::<sys::ibv_async_event>();
            assert_eq!(sr_ibv_get_async_event(ctx, &mut ev), 0);
            assert_eq!(ev.event_type, sys::IBV_EVENT_CQ_ERR);
            assert_eq!(ev.element.cq, cq);
            sr_ibv_ack_async_event(&mut ev);
            assert_eq!((*cq).async_events_completed, 1);
            // Taken: nothing more, and the fd is quiet.
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            assert_eq!(sr_ibv_get_async_event(ctx, &mut ev), -1);
            assert_eq!(errno::get(), libc::EAGAIN);
            assert_eq!(libc::poll(&mut p, 1, 0), 0);
            drop(f);
            assert_eq!(cq::sr_ibv_destroy_cq(cq), 0);
            assert_eq!(context::sr_ibv_close_device(ctx), 0);
        }
    }

    /// Counts the allocations of each thread (the other tests run beside this one).
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static N: Cell<u64> = const { Cell::new(0) };
        }

        struct Counting;

        fn count() {
            let _ = N.try_with(|n| n.set(n.get() + 1));
        }

        // SAFETY: every call is System's, with the caller's arguments.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, l: Layout) -> *mut u8 {
                count();
                // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
                unsafe { System.alloc(l) }
            }
            unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
                count();
                // SAFETY: as above.
                unsafe { System.alloc_zeroed(l) }
            }
            unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
                // SAFETY: a block System gave with this layout.
                unsafe { System.dealloc(p, l) }
            }
            unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
                count();
                // SAFETY: as above.
                unsafe { System.realloc(p, l, n) }
            }
        }

        #[global_allocator]
        static A: Counting = Counting;

        /// Allocations this thread has made.
        pub(super) fn allocs() -> u64 {
            N.with(|n| n.get())
        }
    }

    /// A context on the RoCE device of 127.0.0.1, a CQ of 64 entries, a PD, and
    /// [`looped_pair`]'s two QPs on them.
    ///
    /// # Safety
    /// The caller ends what it returns.
    unsafe fn looped_setup() -> (
        *mut sys::ibv_context,
        *mut sys::ibv_cq,
        *mut sys::ibv_pd,
        [*mut sys::ibv_qp; 2],
    ) {
        let d = list::devices()
            .iter()
            .find(|d| d.inner.interface() == Some("lo") && d.gid()[10] == 0xff)
            .expect("a RoCE device on 127.0.0.1");
        // SAFETY: the C calls of this library on objects it made, with arguments as
        // rdma-core's callers pass them.
        unsafe {
            let ctx = sr_ibv_open_device(d.as_ptr());
            assert!(!ctx.is_null());
            let cq = cq::sr_ibv_create_cq(ctx, 64, ptr::null_mut(), ptr::null_mut(), 0);
            assert!(!cq.is_null());
            let pd = crate::pd::sr_ibv_alloc_pd(ctx);
            let qps = looped_pair(ctx, cq, pd);
            (ctx, cq, pd, qps)
        }
    }

    /// Two RC QPs of one RoCE context on 127.0.0.1 connected to each other as
    /// `ibv_rc_pingpong` connects its pair (`ibv_modify_qp` to RTR and RTS), completing
    /// into one CQ; `max_inline_data` 64; remote writes allowed.
    ///
    /// # Safety
    /// `ctx` is a live RoCE context of this library.
    unsafe fn looped_pair(
        ctx: *mut sys::ibv_context,
        cq: *mut sys::ibv_cq,
        pd: *mut sys::ibv_pd,
    ) -> [*mut sys::ibv_qp; 2] {
        // SAFETY: the C calls of this library on objects it made, with arguments as
        // rdma-core's callers pass them.
        unsafe {
            let cap = sys::ibv_qp_cap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 64,
            };
            let qps = [0; 2].map(|_| rc_qp(pd, cq, cap));
            let mut gid = sys::ibv_gid::default();
            assert_eq!(context::sr_ibv_query_gid(ctx, 1, 0, &mut gid), 0);
            for (i, &qp) in qps.iter().enumerate() {
                let peer = (*qps[1 - i]).qp_num;
                let mut a = sys::ibv_qp_attr {
                    qp_state: sys::IBV_QPS_INIT,
                    port_num: 1,
                    qp_access_flags: sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE,
                    ..Default::default()
                };
                let m = sys::IBV_QP_STATE
                    | sys::IBV_QP_PKEY_INDEX
                    | sys::IBV_QP_PORT
                    | sys::IBV_QP_ACCESS_FLAGS;
                assert_eq!(qp::sr_ibv_modify_qp(qp, &mut a, m as c_int), 0);
                let mut a = sys::ibv_qp_attr {
                    qp_state: sys::IBV_QPS_RTR,
                    path_mtu: sys::IBV_MTU_1024,
                    dest_qp_num: peer,
                    max_dest_rd_atomic: 1,
                    min_rnr_timer: 12,
                    ..Default::default()
                };
                a.ah_attr.is_global = 1;
                a.ah_attr.port_num = 1;
                a.ah_attr.grh.dgid = gid;
                a.ah_attr.grh.hop_limit = 1;
                let m = sys::IBV_QP_STATE
                    | sys::IBV_QP_AV
                    | sys::IBV_QP_PATH_MTU
                    | sys::IBV_QP_DEST_QPN
                    | sys::IBV_QP_RQ_PSN
                    | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                    | sys::IBV_QP_MIN_RNR_TIMER;
                assert_eq!(qp::sr_ibv_modify_qp(qp, &mut a, m as c_int), 0);
            }
            for &qp in &qps {
                let mut a = sys::ibv_qp_attr {
                    qp_state: sys::IBV_QPS_RTS,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    max_rd_atomic: 1,
                    ..Default::default()
                };
                let m = sys::IBV_QP_STATE
                    | sys::IBV_QP_TIMEOUT
                    | sys::IBV_QP_RETRY_CNT
                    | sys::IBV_QP_RNR_RETRY
                    | sys::IBV_QP_SQ_PSN
                    | sys::IBV_QP_MAX_QP_RD_ATOMIC;
                assert_eq!(qp::sr_ibv_modify_qp(qp, &mut a, m as c_int), 0);
            }
            qps
        }
    }

    /// A ping-pong of Sends over a connected RoCE pair through both post APIs —
    /// `ibv_post_send` and the `ibv_wr_*` calls, with `INLINE` octets from memory no region
    /// covers — and `ibv_poll_cq`: the posting and polling thread allocates nothing per
    /// request once the queues have their working size (the inline octets had a region
    /// registered over a fresh copy per post, and each `ibv_wr_*` batch a fresh vector).
    #[test]
    fn posting_inline_and_polling_allocate_nothing_per_request() {
        // SAFETY: the C calls of this library on objects it made, with arguments as
        // rdma-core's callers pass them; the octets are this test's.
        unsafe {
            let (ctx, cq, pd, [a, b]) = looped_setup();
            let mut rx = vec![0u8; 4096];
            let mr = local_mr(pd, &mut rx);
            let data: [u8; 48] = std::array::from_fn(|i| i as u8);
            let mut wcs = [sys::ibv_wc::default(); 4];
            let post_recv = |qp: *mut sys::ibv_qp, id: u64| {
                post_recv_64(qp, mr, rx.as_ptr() as u64 + (id % 64) * 64, id);
            };
            let mut reap = |want: usize| {
                let mut got = 0;
                while got < want {
                    let n = poll_cq(cq, 4, wcs.as_mut_ptr());
                    assert!(n >= 0);
                    for w in &wcs[..n as usize] {
                        assert_eq!(w.status, sys::IBV_WC_SUCCESS, "wr {}", w.wr_id);
                        if w.opcode == sys::IBV_WC_RECV {
                            assert_eq!(w.byte_len, 48);
                        }
                    }
                    got += n as usize;
                }
            };
            let x = qp::sr_ibv_qp_to_qp_ex(b);
            // One round: a sends to b with ibv_post_send (two pieces inline), b answers
            // with the ibv_wr_* calls (inline); a Send and a Receive complete on each side.
            let mut round = |id: u64| {
                post_recv(b, id);
                post_recv(a, id + 1);
                let mut sges = [0, 24].map(|o| sys::ibv_sge {
                    addr: data[o..].as_ptr() as u64,
                    length: 24,
                    lkey: 0,
                });
                let mut wr = sys::ibv_send_wr {
                    wr_id: id,
                    sg_list: sges.as_mut_ptr(),
                    num_sge: 2,
                    opcode: sys::IBV_WR_SEND,
                    send_flags: sys::IBV_SEND_INLINE | sys::IBV_SEND_SIGNALED,
                    ..Default::default()
                };
                let mut bad = ptr::null_mut();
                assert_eq!(qp::post_send(a, &mut wr, &mut bad), 0);
                reap(2);
                ((*x).wr_start.unwrap())(x);
                (*x).wr_id = id + 1;
                (*x).wr_flags = sys::IBV_SEND_SIGNALED;
                ((*x).wr_send.unwrap())(x);
                ((*x).wr_set_inline_data.unwrap())(x, data.as_ptr() as *mut _, data.len());
                assert_eq!(((*x).wr_complete.unwrap())(x), 0);
                reap(2);
            };
            for i in 0..100 {
                round(2 * i);
            }
            let before = counting::allocs();
            for i in 0..1000 {
                round(2 * i);
            }
            let n = counting::allocs() - before;
            // 4,000 requests posted and completed: one allocation each would be 4,000.
            assert!(n < 40, "{n} allocations for 4,000 requests");
            assert_eq!(rx[..48], data, "what b received last");
            // Past the QP's inline limit: refused, not copied.
            let big = [0u8; 65];
            let mut sge = sys::ibv_sge {
                addr: big.as_ptr() as u64,
                length: 65,
                lkey: 0,
            };
            let mut wr = sys::ibv_send_wr {
                sg_list: &mut sge,
                num_sge: 1,
                opcode: sys::IBV_WR_SEND,
                send_flags: sys::IBV_SEND_INLINE,
                ..Default::default()
            };
            let mut bad = ptr::null_mut();
            assert_eq!(qp::post_send(a, &mut wr, &mut bad), libc::EINVAL);
            assert_eq!(bad, &mut wr as *mut _);
            for qp in [a, b] {
                assert_eq!(qp::sr_ibv_destroy_qp(qp), 0);
            }
            assert_eq!(crate::pd::sr_ibv_dereg_mr(mr), 0);
            assert_eq!(crate::pd::sr_ibv_dealloc_pd(pd), 0);
            assert_eq!(cq::sr_ibv_destroy_cq(cq), 0);
            assert_eq!(context::sr_ibv_close_device(ctx), 0);
        }
    }

    /// Memory windows as C programs use them: `ibv_alloc_mw` (through the context's ops),
    /// a type 2 window bound by an `IBV_WR_BIND_MW` request with the key the program chose,
    /// written through by the peer and revoked by `IBV_WR_LOCAL_INV`; a type 1 window
    /// bound by `ibv_bind_mw`, which advances `mw->rkey`; and the errors rdma-core gives
    /// for what is not a window of ours.
    #[test]
    fn memory_windows_bound_and_invalidated_by_c_requests() {
        // SAFETY: the C calls of this library on objects it made, with arguments as
        // rdma-core's callers pass them; the octets are this test's.
        unsafe {
            let (ctx, cq, pd, [a, b]) = looped_setup();
            let mut mem = vec![0u8; 8192];
            let access = sys::IBV_ACCESS_LOCAL_WRITE
                | sys::IBV_ACCESS_REMOTE_WRITE
                | sys::IBV_ACCESS_MW_BIND;
            let mr = crate::pd::sr_ibv_reg_mr(pd, mem.as_mut_ptr().cast(), 8192, access as c_int);
            assert!(!mr.is_null());
            let mut src = vec![0u8; 64];
            let smr = local_mr(pd, &mut src);
            let sp = src.as_mut_ptr();
            let reap = |want: usize| {
                let mut wcs = [sys::ibv_wc::default(); 4];
                let mut got = Vec::new();
                while got.len() < want {
                    let n = poll_cq(cq, 4, wcs.as_mut_ptr());
                    assert!(n >= 0);
                    got.extend(
                        wcs[..n as usize]
                            .iter()
                            .map(|w| (w.wr_id, w.status, w.opcode)),
                    );
                }
                got
            };
            let post = |qp, wr: &mut sys::ibv_send_wr| {
                let mut bad = ptr::null_mut();
                qp::post_send(qp, wr, &mut bad)
            };
            let write = |id: u64, rkey: u32, at: usize| {
                let mut sge = sys::ibv_sge {
                    addr: sp as u64,
                    length: 64,
                    lkey: (*smr).lkey,
                };
                let mut wr = sys::ibv_send_wr {
                    wr_id: id,
                    sg_list: &mut sge,
                    num_sge: 1,
                    opcode: sys::IBV_WR_RDMA_WRITE,
                    send_flags: sys::IBV_SEND_SIGNALED,
                    ..Default::default()
                };
                wr.wr.rdma.remote_addr = mem.as_ptr() as u64 + at as u64;
                wr.wr.rdma.rkey = rkey;
                assert_eq!(post(b, &mut wr), 0);
            };
            let ops = &(*ctx).ops;
            let mw2 = (ops.alloc_mw.unwrap())(pd, sys::IBV_MW_TYPE_2);
            assert!(!mw2.is_null());
            assert_eq!((*mw2).type_, sys::IBV_MW_TYPE_2);
            let old = (*mw2).rkey;
            let new = softrdma::Key(old).next_consumer(1).0;
            let info = |addr: usize| sys::ibv_mw_bind_info {
                mr,
                addr: mem.as_ptr() as u64 + addr as u64,
                length: 4096,
                mw_access_flags: sys::IBV_ACCESS_REMOTE_WRITE,
            };
            let mut wr = sys::ibv_send_wr {
                wr_id: 1,
                opcode: sys::IBV_WR_BIND_MW,
                send_flags: sys::IBV_SEND_SIGNALED,
                ..Default::default()
            };
            wr.__bindgen_anon_2.bind_mw.mw = mw2;
            wr.__bindgen_anon_2.bind_mw.rkey = new;
            wr.__bindgen_anon_2.bind_mw.bind_info = info(4096);
            assert_eq!(post(a, &mut wr), 0);
            assert_eq!(reap(1), [(1, sys::IBV_WC_SUCCESS, sys::IBV_WC_BIND_MW)]);
            ptr::write_bytes(sp, 0x5a, 64);
            write(2, new, 4096 + 100);
            assert_eq!(reap(1), [(2, sys::IBV_WC_SUCCESS, sys::IBV_WC_RDMA_WRITE)]);
            assert!(mem[4096 + 100..4096 + 164].iter().all(|&x| x == 0x5a));

            // Type 1, by ibv_bind_mw: the window's next key, in mw->rkey once posted.
            let mw1 = (ops.alloc_mw.unwrap())(pd, sys::IBV_MW_TYPE_1);
            let before = (*mw1).rkey;
            let mut bind = sys::ibv_mw_bind {
                wr_id: 3,
                send_flags: sys::IBV_SEND_SIGNALED,
                bind_info: info(0),
            };
            assert_eq!((ops.bind_mw.unwrap())(a, mw1, &mut bind), 0);
            assert_eq!((*mw1).rkey >> 8, before >> 8);
            assert_ne!((*mw1).rkey, before);
            assert_eq!(reap(1), [(3, sys::IBV_WC_SUCCESS, sys::IBV_WC_BIND_MW)]);
            ptr::write_bytes(sp, 0x33, 64);
            write(4, (*mw1).rkey, 10);
            assert_eq!(reap(1), [(4, sys::IBV_WC_SUCCESS, sys::IBV_WC_RDMA_WRITE)]);
            assert!(mem[10..74].iter().all(|&x| x == 0x33));
            // A type 2 window is bound by the program's own requests only.
            assert_eq!((ops.bind_mw.unwrap())(a, mw2, &mut bind), libc::EINVAL);
            assert_eq!(
                (ops.bind_mw.unwrap())(a, mw1, ptr::null_mut()),
                libc::EINVAL
            );

            // The same through the ibv_wr_* calls: bind a second type 2 window, invalidate
            // it; a window not of ours fails the batch at ibv_wr_complete.
            let x = qp::sr_ibv_qp_to_qp_ex(a);
            let mw3 = (ops.alloc_mw.unwrap())(pd, sys::IBV_MW_TYPE_2);
            let k3 = softrdma::Key((*mw3).rkey).next_consumer(9).0;
            let i3 = info(2048);
            ((*x).wr_start.unwrap())(x);
            (*x).wr_id = 8;
            (*x).wr_flags = sys::IBV_SEND_SIGNALED;
            ((*x).wr_bind_mw.unwrap())(x, mw3, k3, &i3);
            (*x).wr_id = 9;
            ((*x).wr_local_inv.unwrap())(x, k3);
            assert_eq!(((*x).wr_complete.unwrap())(x), 0);
            assert_eq!(
                reap(2),
                [
                    (8, sys::IBV_WC_SUCCESS, sys::IBV_WC_BIND_MW),
                    (9, sys::IBV_WC_SUCCESS, sys::IBV_WC_LOCAL_INV)
                ]
            );
            let mut other = *mw3;
            ((*x).wr_start.unwrap())(x);
            ((*x).wr_bind_mw.unwrap())(x, &mut other, k3, &i3);
            assert_eq!(((*x).wr_complete.unwrap())(x), libc::EINVAL);
            assert_eq!((ops.dealloc_mw.unwrap())(mw3), 0);

            // What is not a window of ours: EINVAL, `bad` names the request.
            let mut fake = *mw2;
            let mut wr = sys::ibv_send_wr {
                wr_id: 5,
                opcode: sys::IBV_WR_BIND_MW,
                ..Default::default()
            };
            wr.__bindgen_anon_2.bind_mw.mw = &mut fake;
            wr.__bindgen_anon_2.bind_mw.bind_info = info(0);
            let mut bad = ptr::null_mut();
            assert_eq!(qp::post_send(a, &mut wr, &mut bad), libc::EINVAL);
            assert_eq!(bad, &mut wr as *mut _);
            assert_eq!((ops.dealloc_mw.unwrap())(&mut fake), libc::EINVAL);

            // Local Invalidate: the peer's Write through the key fails, nothing placed.
            let mut wr = sys::ibv_send_wr {
                wr_id: 6,
                opcode: sys::IBV_WR_LOCAL_INV,
                send_flags: sys::IBV_SEND_SIGNALED,
                ..Default::default()
            };
            wr.__bindgen_anon_1.invalidate_rkey = new;
            assert_eq!(post(a, &mut wr), 0);
            assert_eq!(reap(1), [(6, sys::IBV_WC_SUCCESS, sys::IBV_WC_LOCAL_INV)]);
            ptr::write_bytes(sp, 0x77, 64);
            write(7, new, 4096 + 200);
            assert_eq!(
                reap(1),
                [(7, sys::IBV_WC_REM_ACCESS_ERR, sys::IBV_WC_RDMA_WRITE)]
            );
            assert!(mem[4096 + 200..4096 + 264].iter().all(|&x| x == 0));

            for mw in [mw1, mw2] {
                assert_eq!((ops.dealloc_mw.unwrap())(mw), 0);
            }
            for qp in [a, b] {
                assert_eq!(qp::sr_ibv_destroy_qp(qp), 0);
            }
            for m in [mr, smr] {
                assert_eq!(crate::pd::sr_ibv_dereg_mr(m), 0);
            }
            assert_eq!(crate::pd::sr_ibv_dealloc_pd(pd), 0);
            assert_eq!(cq::sr_ibv_destroy_cq(cq), 0);
            assert_eq!(context::sr_ibv_close_device(ctx), 0);
        }
    }
}
