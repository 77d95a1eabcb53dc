//! The names rdma-core gives its enumerations (`ibv_*_str`, `rdma_event_str`): tools print
//! them and scripts parse what the tools print, so they are rdma-core 44's, word for word.

use core::ffi::{CStr, c_char, c_int};

fn name(table: &[&'static CStr], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .unwrap_or(&c"unknown")
        .as_ptr()
}

const NODE_TYPES: [&CStr; 8] = [
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// `ibv_node_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_node_type_str(t: c_int) -> *const c_char {
    // Index 0 (IBV_NODE_UNKNOWN, -1 in C) is below the table's first name.
    if t < 1 {
        return c"unknown".as_ptr();
    }
    name(&NODE_TYPES, t)
}

/// `ibv_port_state_str`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_port_state_str(s: c_int) -> *const c_char {
    name(
        &[
            c"no state change (NOP)",
            c"down",
            c"init",
            c"armed",
            c"active",
            c"active defer",
        ],
        s,
    )
}

/// `ibv_event_type_str` (rdma-core 44: up to `IBV_EVENT_WQ_FATAL`).
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_event_type_str(e: c_int) -> *const c_char {
    name(
        &[
            c"CQ error",
            c"local work queue catastrophic error",
            c"invalid request local work queue error",
            c"local access violation work queue error",
            c"communication established",
            c"send queue drained",
            c"path migrated",
            c"path migration request error",
            c"local catastrophic error",
            c"port active",
            c"port error",
            c"LID change",
            c"P_Key change",
            c"SM change",
            c"SRQ catastrophic error",
            c"SRQ limit reached",
            c"last WQE reached",
            c"client reregistration",
            c"GID table change",
            c"WQ fatal",
        ],
        e,
    )
}

/// `ibv_wc_status_str`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_wc_status_str(s: c_int) -> *const c_char {
    name(
        &[
            c"success",
            c"local length error",
            c"local QP operation error",
            c"local EE context operation error",
            c"local protection error",
            c"Work Request Flushed Error",
            c"memory management operation error",
            c"bad response error",
            c"local access error",
            c"remote invalid request error",
            c"remote access error",
            c"remote operation error",
            c"transport retry counter exceeded",
            c"RNR retry counter exceeded",
            c"local RDD violation error",
            c"remote invalid RD request",
            c"aborted error",
            c"invalid EE context number",
            c"invalid EE context state",
            c"fatal error",
            c"response timeout error",
            c"general error",
            c"TM error",
            c"TM software rendezvous",
        ],
        s,
    )
}

/// `rdma_event_str`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_rdma_event_str(e: c_int) -> *const c_char {
    const EVENTS: [&CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    usize::try_from(e)
        .ok()
        .and_then(|i| EVENTS.get(i))
        .unwrap_or(&c"UNKNOWN EVENT")
        .as_ptr()
}

/// `enum ibv_rate` by value: (multiple of 2.5 Gb/s, or -1 where the rate is none; Mb/s).
/// The rates of 64/66 encoding (14, 25, 56, 100 Gb/s, …) have no multiple.
const RATES: [(c_int, c_int); 25] = [
    (-1, -1),       // 0 IBV_RATE_MAX
    (-1, -1),       // 1 (none)
    (1, 2500),      // 2 IBV_RATE_2_5_GBPS
    (4, 10000),     // 3 IBV_RATE_10_GBPS
    (12, 30000),    // 4 IBV_RATE_30_GBPS
    (2, 5000),      // 5 IBV_RATE_5_GBPS
    (8, 20000),     // 6 IBV_RATE_20_GBPS
    (16, 40000),    // 7 IBV_RATE_40_GBPS
    (24, 60000),    // 8 IBV_RATE_60_GBPS
    (32, 80000),    // 9 IBV_RATE_80_GBPS
    (48, 120000),   // 10 IBV_RATE_120_GBPS
    (-1, 14062),    // 11 IBV_RATE_14_GBPS
    (-1, 56250),    // 12 IBV_RATE_56_GBPS
    (-1, 112500),   // 13 IBV_RATE_112_GBPS
    (-1, 168750),   // 14 IBV_RATE_168_GBPS
    (-1, 25781),    // 15 IBV_RATE_25_GBPS
    (-1, 103125),   // 16 IBV_RATE_100_GBPS
    (-1, 206250),   // 17 IBV_RATE_200_GBPS
    (-1, 309375),   // 18 IBV_RATE_300_GBPS
    (11, 28125),    // 19 IBV_RATE_28_GBPS
    (20, 53125),    // 20 IBV_RATE_50_GBPS
    (160, 425000),  // 21 IBV_RATE_400_GBPS
    (240, 637500),  // 22 IBV_RATE_600_GBPS
    (320, 850000),  // 23 IBV_RATE_800_GBPS
    (480, 1275000), // 24 IBV_RATE_1200_GBPS
];

fn rate(r: c_int) -> (c_int, c_int) {
    usize::try_from(r)
        .ok()
        .and_then(|i| RATES.get(i))
        .copied()
        .unwrap_or((-1, -1))
}

/// The rate whose `f` is `v`, else `IBV_RATE_MAX` (0).
fn rate_from(f: impl Fn((c_int, c_int)) -> c_int, v: c_int) -> c_int {
    if v <= 0 {
        return 0;
    }
    RATES
        .iter()
        .position(|&x| f(x) == v)
        .map_or(0, |i| i as c_int)
}

/// `ibv_rate_to_mult`: -1 for a rate that is no multiple of 2.5 Gb/s.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_rate_to_mult(r: c_int) -> c_int {
    rate(r).0
}

/// `mult_to_ibv_rate`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_mult_to_ibv_rate(m: c_int) -> c_int {
    rate_from(|x| x.0, m)
}

/// `ibv_rate_to_mbps`: -1 for an unknown rate.
#[unsafe(no_mangle)]
pub extern "C" fn sr_ibv_rate_to_mbps(r: c_int) -> c_int {
    rate(r).1
}

/// `mbps_to_ibv_rate`.
#[unsafe(no_mangle)]
pub extern "C" fn sr_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    rate_from(|x| x.1, mbps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: every name is a static C string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn names_and_their_ends() {
        assert_eq!(s(sr_ibv_node_type_str(4)), "iWARP NIC");
        assert_eq!(s(sr_ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(s(sr_ibv_node_type_str(-1)), "unknown");
        assert_eq!(s(sr_ibv_node_type_str(8)), "unknown");
        assert_eq!(s(sr_ibv_port_state_str(4)), "active");
        assert_eq!(s(sr_ibv_port_state_str(6)), "unknown");
        assert_eq!(s(sr_ibv_event_type_str(19)), "WQ fatal");
        assert_eq!(s(sr_ibv_event_type_str(20)), "unknown");
        assert_eq!(s(sr_ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(s(sr_ibv_wc_status_str(-3)), "unknown");
        assert_eq!(s(sr_rdma_event_str(9)), "RDMA_CM_EVENT_ESTABLISHED");
        assert_eq!(s(sr_rdma_event_str(99)), "UNKNOWN EVENT");
    }

    #[test]
    fn rates_both_ways() {
        assert_eq!(sr_ibv_rate_to_mult(3), 4);
        assert_eq!(sr_mult_to_ibv_rate(4), 3);
        assert_eq!(sr_ibv_rate_to_mbps(16), 103125);
        assert_eq!(sr_mbps_to_ibv_rate(103125), 16);
        assert_eq!(
            sr_ibv_rate_to_mult(16),
            -1,
            "100 Gb/s is no multiple of 2.5"
        );
        assert_eq!(sr_ibv_rate_to_mult(19), 11);
        assert_eq!(sr_ibv_rate_to_mult(24), 480);
        assert_eq!(sr_ibv_rate_to_mult(0), -1);
        assert_eq!(sr_ibv_rate_to_mult(1), -1);
        assert_eq!(sr_ibv_rate_to_mult(99), -1);
        assert_eq!(sr_ibv_rate_to_mbps(25), -1);
        assert_eq!(sr_mult_to_ibv_rate(7), 0);
        assert_eq!(sr_mult_to_ibv_rate(-1), 0);
        assert_eq!(sr_mbps_to_ibv_rate(-1), 0);
        for r in 2..25 {
            let m = sr_ibv_rate_to_mult(r);
            if m > 0 {
                assert_eq!(sr_mult_to_ibv_rate(m), r);
            }
            assert_eq!(sr_mbps_to_ibv_rate(sr_ibv_rate_to_mbps(r)), r);
        }
    }
}
