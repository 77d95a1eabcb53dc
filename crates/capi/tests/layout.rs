//! The Rust mirrors (`src/sys.rs`) against Debian's headers, compiled now: a C program
//! prints the size of each struct and the offset of each field a program or the library
//! reaches through, and Rust's `size_of`/`offset_of!` must agree (issue 43's probe). Needs
//! a C compiler and `libibverbs-dev`, `librdmacm-dev`.

use std::fmt::Write as _;
use std::process::Command;

use softrdma_capi::sys::*;

/// (struct, field or "" for the size, Rust's value); the same list drives the C probe.
macro_rules! layout {
    ($($t:ident { $($f:tt)* })*) => {{
        let mut v: Vec<(&str, String, usize)> = Vec::new();
        $(
            v.push((stringify!($t), String::new(), core::mem::size_of::<$t>()));
            layout!(@fields v, $t, $($f)*);
        )*
        v
    }};
    (@fields $v:ident, $t:ident, $($($f:ident).+),* $(,)?) => {
        $( $v.push((
            stringify!($t),
            stringify!($($f).+).replace(' ', ""),
            core::mem::offset_of!($t, $($f).+),
        )); )*
    };
}

#[test]
fn rust_mirrors_match_debians_headers() {
    let rows = layout! {
        ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context { device, ops, ops.alloc_mw, ops.bind_mw, ops.dealloc_mw, ops.poll_cq,
            ops.req_notify_cq, ops.post_srq_recv, ops.post_send, ops.post_recv, cmd_fd,
            async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context { query_port, advise_mr, alloc_null_mr, alloc_dm, alloc_parent_domain,
            alloc_td, modify_cq, post_srq_ops, create_wq, query_rt_values, create_cq_ex,
            query_device_ex, open_qp, create_qp_ex, get_srq_num, create_srq_ex, open_xrcd,
            close_xrcd, sz, context }
        ibv_device_attr { fw_ver, node_guid, max_mr_size, max_qp, device_cap_flags, max_sge,
            max_cqe, max_qp_rd_atom, atomic_cap, max_ah, max_srq_sge, max_pkeys,
            local_ca_ack_delay, phys_port_cnt }
        ibv_device_attr_ex { orig_attr, comp_mask, odp_caps, completion_timestamp_mask,
            device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, raw_packet_caps, tm_caps,
            cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps, phys_port_cnt_ex }
        ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
            pkey_tbl_len, lid, lmc, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2 }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond,
            comp_events_completed, async_events_completed }
        ibv_comp_channel { context, fd, refcnt }
        ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state,
            qp_type, mutex, cond, events_completed }
        ibv_qp_ex { qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp,
            wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write,
            wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr,
            wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
            wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write }
        ibv_cq_ex { context, channel, cq_context, handle, cqe, comp_mask, status, wr_id,
            start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len,
            read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl,
            read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns }
        ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        ibv_ah { context, pd, handle }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags,
            pkey_index, slid, sl, dlid_path_bits }
        ibv_sge { addr, length, lkey }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, wr, qp_type }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
            comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf,
            source_qpn, send_ops_flags }
        ibv_qp_attr { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_async_event { element, event_type }
        rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event,
            send_cq_channel, send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_conn_param { private_data, private_data_len, responder_resources,
            initiator_depth, flow_control, retry_count, rnr_retry_count, srq, qp_num }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_event_channel { fd }
        rdma_addrinfo { ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len,
            ai_dst_len, ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname,
            ai_route_len, ai_route, ai_connect_len, ai_connect, ai_next }
    };
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
         #include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (t, f, _) in &rows {
        let expr = if f.is_empty() {
            format!("sizeof(struct {t})")
        } else {
            format!("offsetof(struct {t}, {f})")
        };
        writeln!(c, "  printf(\"%zu\\n\", (size_t){expr});").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("softrdma-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("probe.c"), c).unwrap();
    let st = Command::new("cc")
        .arg("-o")
        .arg(dir.join("probe"))
        .arg(dir.join("probe.c"))
        .status()
        .expect("a C compiler");
    assert!(
        st.success(),
        "the probe does not compile against the installed headers"
    );
    let out = Command::new(dir.join("probe")).output().unwrap();
    let c_values: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(c_values.len(), rows.len());
    let wrong: Vec<String> = rows
        .iter()
        .zip(&c_values)
        .filter(|((_, _, r), c)| r != *c)
        .map(|((t, f, r), c)| format!("{t}.{f}: Rust {r}, C {c}"))
        .collect();
    assert!(wrong.is_empty(), "layouts differ: {wrong:#?}");
    assert!(rows.len() > 300, "{} rows", rows.len());
}
