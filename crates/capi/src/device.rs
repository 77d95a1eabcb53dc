//! Devices as rdma-core lays them out (`ibv_device`), and what is reported of each: its
//! attributes, its one port, its GID.

use core::ffi::{c_char, c_int};
use std::ptr;

use softrdma::{Device, Transport};

use crate::env;
use crate::sys;

/// The one port of every device.
pub const PORT: u8 = 1;
/// Scatter/gather entries a work request may carry.
pub const MAX_SGE: u32 = 32;
/// RDMA Reads and atomics outstanding per QP, either way (ORD and IRD).
pub const MAX_RD_ATOM: u32 = 128;
/// The IB MTU the ports offer.
const MAX_MTU: sys::ibv_mtu = sys::IBV_MTU_4096;

/// A device as rdma-core lays it out (`ibv_device` first), with softrdma's behind it.
#[repr(C)]
pub struct SrDevice {
    pub(crate) dev: sys::ibv_device,
    pub inner: Device,
    /// Node GUID (host order).
    guid: u64,
    index: c_int,
}

// SAFETY: the C half is plain data written once before the device is shared, then only read.
unsafe impl Sync for SrDevice {}
// SAFETY: as above.
unsafe impl Send for SrDevice {}

fn copy_name(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// A locally administered EUI-64 from the device's name: stable across processes, so both
/// ends of a program see the same GUID for the same device.
pub(crate) fn guid_of(name: &str) -> u64 {
    (env::fnv1a(name.as_bytes()) & 0x00ff_ffff_ffff_ffff) | 0x0200_0000_0000_0000
}

impl SrDevice {
    pub(crate) fn new(inner: Device, index: c_int) -> SrDevice {
        let mut dev = sys::ibv_device::default();
        let (node, transport) = match inner.transport() {
            Transport::Iwarp => (sys::IBV_NODE_RNIC, sys::IBV_TRANSPORT_IWARP),
            Transport::Roce => (sys::IBV_NODE_CA, sys::IBV_TRANSPORT_IB),
        };
        dev.node_type = node;
        dev.transport_type = transport;
        copy_name(&mut dev.name, inner.name());
        copy_name(&mut dev.dev_name, &format!("uverbs{index}"));
        let root = env::sysfs_root();
        copy_name(
            &mut dev.dev_path,
            &format!("{root}/class/infiniband_verbs/uverbs{index}"),
        );
        copy_name(
            &mut dev.ibdev_path,
            &format!("{root}/class/infiniband/{}", inner.name()),
        );
        SrDevice {
            dev,
            guid: guid_of(inner.name()),
            inner,
            index,
        }
    }

    /// The pointer programs hold.
    pub fn as_ptr(&'static self) -> *mut sys::ibv_device {
        ptr::from_ref(&self.dev).cast_mut()
    }

    pub fn guid(&self) -> u64 {
        self.guid
    }

    pub fn index(&self) -> c_int {
        self.index
    }

    /// The port's IB MTU: the largest that fits the interface's MTU with RoCEv2's headers
    /// (IPv6 40, UDP 8, BTH 12, the largest extended header 28, ICRC 4); the iWARP device
    /// is on no interface (TCP segments its stream itself).
    pub fn active_mtu(&self) -> sys::ibv_mtu {
        let Some(mtu) = self
            .inner
            .interface()
            .and_then(|i| std::fs::read_to_string(format!("/sys/class/net/{i}/mtu")).ok())
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            return MAX_MTU;
        };
        let room = mtu.saturating_sub(40 + 8 + 12 + 28 + 4);
        (sys::IBV_MTU_256..=MAX_MTU)
            .rev()
            .find(|&m| 128u32 << m <= room)
            .unwrap_or(sys::IBV_MTU_256)
    }

    /// GID index 0 of the port: the RoCEv2 device's address, IPv4-mapped; the iWARP
    /// device's is its GUID (as siw's is its MAC address).
    pub fn gid(&self) -> [u8; 16] {
        match self.inner.roce_config() {
            Some(c) => softrdma::roce::gid_from_ip(c.addr),
            None => {
                let mut g = [0u8; 16];
                g[..8].copy_from_slice(&self.guid.to_be_bytes());
                g
            }
        }
    }

    /// The GID's type (`ibv_gid_type`).
    pub fn gid_type(&self) -> u32 {
        match self.inner.transport() {
            Transport::Roce => sys::IBV_GID_TYPE_ROCE_V2,
            Transport::Iwarp => sys::IBV_GID_TYPE_IB,
        }
    }

    /// The interface index behind the GID (0 for none).
    pub fn ifindex(&self) -> u32 {
        self.inner
            .interface()
            .and_then(|i| std::fs::read_to_string(format!("/sys/class/net/{i}/ifindex")).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// What `ibv_query_device` reports (limits from the device's `DeviceLimits`).
pub fn device_attr(d: &SrDevice) -> sys::ibv_device_attr {
    let l = d.inner.limits();
    let roce = d.inner.transport() == Transport::Roce;
    let to_int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    let mut a = sys::ibv_device_attr::default();
    copy_name(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = d.guid.to_be();
    a.sys_image_guid = d.guid.to_be();
    a.max_mr_size = l.max_mr_bytes;
    a.page_size_cap = !0xfff;
    a.max_qp = to_int(l.max_qp);
    a.max_qp_wr = to_int(l.max_qp_wr);
    a.device_cap_flags = sys::IBV_DEVICE_SYS_IMAGE_GUID
        | sys::IBV_DEVICE_MEM_WINDOW
        | sys::IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    if roce {
        a.device_cap_flags |= sys::IBV_DEVICE_RC_RNR_NAK_GEN;
    }
    a.max_sge = to_int(MAX_SGE);
    a.max_sge_rd = to_int(MAX_SGE);
    a.max_cq = to_int(l.max_qp.saturating_mul(2));
    a.max_cqe = to_int(l.max_cqe);
    a.max_mr = to_int(l.max_mr);
    a.max_pd = to_int(l.max_qp);
    a.max_qp_rd_atom = to_int(MAX_RD_ATOM);
    a.max_qp_init_rd_atom = to_int(MAX_RD_ATOM);
    a.max_res_rd_atom = to_int(MAX_RD_ATOM.saturating_mul(l.max_qp));
    a.atomic_cap = sys::IBV_ATOMIC_HCA;
    a.max_mw = to_int(l.max_mr);
    a.max_ah = if roce { to_int(l.max_qp) } else { 0 };
    a.max_srq = to_int(l.max_qp);
    a.max_srq_wr = to_int(l.max_srq_wr);
    a.max_srq_sge = to_int(MAX_SGE);
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = PORT;
    a
}

/// What `ibv_query_port` reports of port 1.
pub fn port_attr(d: &SrDevice) -> sys::ibv_port_attr {
    sys::ibv_port_attr {
        state: sys::IBV_PORT_ACTIVE,
        max_mtu: MAX_MTU,
        active_mtu: d.active_mtu(),
        gid_tbl_len: 1,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 2,  // 4X
        active_speed: 16, // FDR
        phys_state: 5,    // LinkUp
        link_layer: sys::IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// GID table entry 0 of `d`'s port, holding `gid` (a context's own).
pub fn gid_entry(d: &SrDevice, gid: [u8; 16]) -> sys::ibv_gid_entry {
    sys::ibv_gid_entry {
        gid: sys::ibv_gid { raw: gid },
        gid_index: 0,
        port_num: u32::from(PORT),
        gid_type: d.gid_type(),
        ndev_ifindex: d.ifindex(),
    }
}
