//! The device list: `ibv_get_device_list` and the calls on a listed device.

use core::ffi::{c_char, c_int};
use std::ptr;
use std::sync::OnceLock;

use softrdma::Device;

use crate::device::SrDevice;
use crate::errno;
use crate::sys;
use crate::sysfs;

/// Every device, made once (as rdma-core keeps its device objects for the process's life).
pub fn devices() -> &'static [SrDevice] {
    static DEVICES: OnceLock<Vec<SrDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        crate::env::init_log();
        let list: Vec<SrDevice> = Device::list()
            .into_iter()
            .enumerate()
            .map(|(i, d)| SrDevice::new(d, i as c_int))
            .collect();
        sysfs::write(&list);
        list
    })
}

/// Ours, if `p` is one of the device pointers handed out.
pub fn device(p: *const sys::ibv_device) -> Option<&'static SrDevice> {
    devices().iter().find(|d| ptr::eq(ptr::from_ref(&d.dev), p))
}

/// `ibv_get_device_list`: a NULL-terminated array the program frees with
/// `ibv_free_device_list`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_device_list(num: *mut c_int) -> *mut *mut sys::ibv_device {
    let devs = devices();
    let mut v: Vec<*mut sys::ibv_device> = devs.iter().map(SrDevice::as_ptr).collect();
    v.push(ptr::null_mut());
    if !num.is_null() {
        // SAFETY: the program passes room for an int (or NULL, handled above).
        unsafe { *num = devs.len() as c_int };
    }
    Box::into_raw(v.into_boxed_slice()).cast()
}

/// `ibv_free_device_list`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_free_device_list(list: *mut *mut sys::ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: `list` is an array from `ibv_get_device_list`, NULL-terminated.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: it was a boxed slice of n + 1 pointers.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `ibv_get_device_name`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_device_name(dev: *mut sys::ibv_device) -> *const c_char {
    match device(dev) {
        Some(d) => d.dev.name.as_ptr(),
        None => {
            errno::set(libc::EINVAL);
            ptr::null()
        }
    }
}

/// `ibv_get_device_guid`: the node GUID in network order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_device_guid(dev: *mut sys::ibv_device) -> u64 {
    device(dev).map_or(0, |d| d.guid().to_be())
}

/// `ibv_get_device_index`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sr_ibv_get_device_index(dev: *mut sys::ibv_device) -> c_int {
    device(dev).map_or(-1, |d| d.index())
}
