//! Known answers: values worked out by hand from librdmacm's and Linux's definitions, and
//! the REQ and SIDR_REQ of `rxe-rping.pcap` and `rxe-udaddy.pcap`.

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use softrdma_wire::ib::cm::CmMessage;
use softrdma_wire::ib::cm_vectors::{RPING_REQ, UDADDY_SIDR_REQ};
use softrdma_wire::ib::mad::MAD_HEADER_LEN;

use super::*;

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("a socket address")
}

fn connect(app: &[u8]) -> Connect<'_> {
    Connect {
        src: sa("10.0.0.1:40000"),
        dst: sa("10.0.0.2:7174"),
        qpn: 0x11,
        service: CmService::Rc,
        rq_psn: 0xAB_CDEF,
        ird: 300,
        ord: 16,
        path_mtu: 3,
        srq: true,
        private_data: app,
    }
}

/// `struct cma_hdr` as `cma.c` fills it for IPv4, octet by octet: version 0, IP version
/// 4 in the high nibble, source port, then each address in the last 4 of 16 octets.
fn cma_hdr_v4(sport: u16, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut h = vec![0x00, 0x40];
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&[0; 12]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&[0; 12]);
    h.extend_from_slice(&dst);
    h
}

#[test]
fn req_to_port_7174_is_librdmacm_s() {
    let r = req(&connect(b"hello")).expect("a REQ");
    // RDMA_PS_TCP is 0x0106; librdmacm's service ID is 0x0000_0000_0106_PPPP.
    assert_eq!(r.service_id, 0x0000_0000_0106_0000 | 7174);
    assert_eq!(r.service_id, service_id(PortSpace::Tcp, 7174));
    // 40000 * 31 + 7174 = 1_247_174 = 0x1307C6, in 20 bits 0x307C6.
    assert_eq!(r.flow_label, 0x307C6);
    let mut pd = cma_hdr_v4(40000, [10, 0, 0, 1], [10, 0, 0, 2]);
    assert_eq!(pd.len(), 36);
    pd.extend_from_slice(b"hello");
    assert_eq!(r.private_data, pd);
    assert_eq!(r.peer, v4(10, 0, 0, 2));
    assert_eq!((r.qpn, r.starting_psn), (0x11, 0xAB_CDEF));
    assert_eq!(r.service, CmService::Rc);
    // IRD 300 does not fit the REQ's 8 bits.
    assert_eq!((r.responder_resources, r.initiator_depth), (255, 16));
    assert_eq!((r.retry_count, r.rnr_retry_count), (7, 7));
    assert_eq!((r.path_mtu, r.srq), (3, true));
}

#[test]
fn uc_req_is_in_rdma_ps_tcp_too() {
    let c = Connect {
        service: CmService::Uc,
        ..connect(&[])
    };
    let r = req(&c).expect("a REQ");
    assert_eq!(r.service, CmService::Uc);
    assert_eq!(r.service_id, 0x0106_1C06);
    assert_eq!(r.private_data.len(), 36);
}

#[test]
fn flow_label_wraps_at_20_bits() {
    assert_eq!(flow_label(0, 0), 0);
    // 65535 * 31 + 65535 = 2_097_120 = 0x1FFFE0.
    assert_eq!(flow_label(u16::MAX, u16::MAX), 0xFFFE0);
    // 33825 * 31 + 1 = 1_048_576 = 0x100000: exactly wraps to 0.
    assert_eq!(flow_label(33825, 1), 0);
}

/// rping over rxe: the REQ we would build from the capture's ports and addresses has
/// its service ID, flow label, CMA header and retry counts.
#[test]
fn req_agrees_with_rxe_rping_capture() {
    let Ok(CmMessage::Req(cap)) = CmMessage::parse(0x10, &RPING_REQ[MAD_HEADER_LEN..]) else {
        panic!("the capture's REQ")
    };
    // The header's addresses (10.77.0.3:57619 → 10.77.0.2), port from the service ID.
    let c = Connect {
        src: sa("10.77.0.3:57619"),
        dst: sa("10.77.0.2:7174"),
        qpn: cap.local_qpn,
        service: CmService::Rc,
        rq_psn: cap.starting_psn,
        ird: u16::from(cap.responder_resources),
        ord: u16::from(cap.initiator_depth),
        path_mtu: cap.path_mtu,
        srq: cap.srq,
        private_data: &[],
    };
    let r = req(&c).expect("a REQ");
    assert_eq!(r.service_id, cap.service_id);
    assert_eq!(r.flow_label, cap.primary.flow_label);
    assert_eq!(r.private_data[..], cap.private_data[..36]);
    assert_eq!(
        (r.retry_count, r.rnr_retry_count),
        (cap.retry_count, cap.rnr_retry_count)
    );
}

#[test]
fn req_private_data_is_at_most_56_octets() {
    let app = [0x5A; 57];
    assert_eq!(
        req(&connect(&app)).map(|_| ()),
        Err(RdmaCmError::PrivateDataTooLong {
            msg: Message::Req,
            max: 56
        })
    );
    let r = req(&connect(&app[..56])).expect("56 octets fit");
    // 36 of header and 56 fill the REQ's 92.
    assert_eq!(r.private_data.len(), 92);
    assert_eq!(r.private_data[36..], app[..56]);
}

#[test]
fn private_data_limits_per_message() {
    // IBA 12.6: REQ 92, SIDR_REQ 216 (less the 36-octet CMA header), REP 196, REJ 148,
    // SIDR_REP 136.
    for (m, max) in [
        (Message::Req, 56),
        (Message::SidrReq, 180),
        (Message::Rep, 196),
        (Message::Rej, 148),
        (Message::SidrRep, 136),
    ] {
        assert_eq!(m.max_private_data(), max);
        assert_eq!(m.check(&vec![0; max]), Ok(()));
        assert_eq!(
            m.check(&vec![0; max + 1]),
            Err(RdmaCmError::PrivateDataTooLong { msg: m, max })
        );
        assert_eq!(m.check(&[]), Ok(()));
    }
}

#[test]
fn sidr_req_is_in_rdma_ps_udp() {
    let s = sidr_req(sa("10.0.0.1:40000"), sa("10.0.0.2:7174"), b"ud").expect("a SIDR_REQ");
    // RDMA_PS_UDP is 0x0111.
    assert_eq!(s.service_id, 0x0000_0000_0111_0000 | 7174);
    assert_eq!(s.service_id, service_id(PortSpace::Udp, 7174));
    assert_eq!(s.peer, v4(10, 0, 0, 2));
    let mut pd = cma_hdr_v4(40000, [10, 0, 0, 1], [10, 0, 0, 2]);
    pd.extend_from_slice(b"ud");
    assert_eq!(s.private_data, pd);
    let app = [0; 181];
    assert_eq!(
        sidr_req(sa("10.0.0.1:1"), sa("10.0.0.2:2"), &app),
        Err(RdmaCmError::PrivateDataTooLong {
            msg: Message::SidrReq,
            max: 180
        })
    );
    let s = sidr_req(sa("10.0.0.1:1"), sa("10.0.0.2:2"), &app[..180]).expect("180 fit");
    assert_eq!(s.private_data.len(), 216);
}

#[test]
fn mixed_ip_versions_make_no_header() {
    let c = Connect {
        dst: sa("[fd00::2]:7174"),
        ..connect(&[])
    };
    assert_eq!(req(&c), Err(RdmaCmError::CmaHeader));
    assert_eq!(
        sidr_req(sa("10.0.0.1:1"), sa("[fd00::2]:2"), &[]),
        Err(RdmaCmError::CmaHeader)
    );
}

#[test]
fn ipv6_req_header() {
    let c = Connect {
        src: sa("[fd00::1]:40000"),
        dst: sa("[fd00::2]:7174"),
        ..connect(&[])
    };
    let r = req(&c).expect("a REQ");
    let mut h = vec![0x00, 0x60, 0x9C, 0x40];
    h.extend_from_slice(&[0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    h.extend_from_slice(&[0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(r.private_data, h);
}

#[test]
fn route_reads_what_req_wrote() {
    let r = req(&connect(b"app")).expect("a REQ");
    let to = route(RequestKind::Conn, r.service_id, &r.private_data).expect("routed");
    assert_eq!(
        to,
        Route {
            port: 7174,
            peer_addr: sa("10.0.0.1:40000"),
            local_addr: sa("10.0.0.2:7174"),
            private_data: b"app",
        }
    );
}

#[test]
fn route_of_rxe_captures() {
    let Ok(CmMessage::Req(q)) = CmMessage::parse(0x10, &RPING_REQ[MAD_HEADER_LEN..]) else {
        panic!("the capture's REQ")
    };
    let to = route(RequestKind::Conn, q.service_id, q.private_data).expect("routed");
    // rping's default port 7174 (0x1C06), from 10.77.0.3:57619 to 10.77.0.2.
    assert_eq!(to.port, 7174);
    assert_eq!(to.peer_addr, sa("10.77.0.3:57619"));
    assert_eq!(to.local_addr, sa("10.77.0.2:7174"));
    assert_eq!(to.private_data.len(), 92 - 36);
    // A REQ's service ID is not in RDMA_PS_UDP.
    assert_eq!(
        route(RequestKind::Sidr, q.service_id, q.private_data),
        Err(Refusal::NoListener)
    );

    let Ok(CmMessage::SidrReq(s)) = CmMessage::parse(0x17, &UDADDY_SIDR_REQ[MAD_HEADER_LEN..])
    else {
        panic!("the capture's SIDR_REQ")
    };
    let to = route(RequestKind::Sidr, s.service_id, s.private_data).expect("routed");
    assert_eq!(to.port, (s.service_id & 0xFFFF) as u16);
    assert_eq!(to.local_addr.port(), to.port);
    assert_eq!(
        route(RequestKind::Conn, s.service_id, s.private_data),
        Err(Refusal::NoListener)
    );
}

#[test]
fn route_refusals() {
    let tcp = 0x0106_1C06;
    let hdr = cma_hdr_v4(1, [10, 0, 0, 1], [10, 0, 0, 2]);
    assert!(route(RequestKind::Conn, tcp, &hdr).is_ok());
    // Too short for a header.
    assert_eq!(
        route(RequestKind::Conn, tcp, &hdr[..35]),
        Err(Refusal::BadHeader)
    );
    assert_eq!(route(RequestKind::Conn, tcp, &[]), Err(Refusal::BadHeader));
    // Another CMA version.
    let mut bad = hdr.clone();
    bad[0] = 1;
    assert_eq!(route(RequestKind::Conn, tcp, &bad), Err(Refusal::BadHeader));
    // RDMA_PS_UDP for a REQ; RDMA_PS_IB; upper bits set; an unknown port space.
    for sid in [0x0111_1C06, 0x013F_1C06, 0x1_0106_1C06, 0x0107_1C06] {
        assert_eq!(
            route(RequestKind::Conn, sid, &hdr),
            Err(Refusal::NoListener),
            "{sid:#x}"
        );
    }
    // The service ID is judged before the header.
    assert_eq!(route(RequestKind::Sidr, tcp, &[]), Err(Refusal::NoListener));
}

#[test]
fn refusal_reasons_and_statuses() {
    // IBA table 112: 8 invalid service ID, 3 no resources, 28 consumer reject; SIDR_REP
    // status 1 service ID not supported, 2 rejected.
    assert_eq!(Refusal::NoListener.rej_reason(), 8);
    assert_eq!(Refusal::NoListener.sidr_status(), 1);
    assert_eq!(Refusal::BadHeader.rej_reason(), 28);
    assert_eq!(Refusal::BadHeader.sidr_status(), 2);
    assert_eq!(Refusal::BacklogFull.rej_reason(), 3);
    assert_eq!(Refusal::BacklogFull.sidr_status(), 2);
    assert_eq!(Refusal::Consumer.rej_reason(), 28);
    assert_eq!(Refusal::Consumer.sidr_status(), 2);
}

#[test]
fn mtu_codes() {
    for (mtu, code) in [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
        assert_eq!(mtu_code(mtu), Ok(code));
        assert_eq!(mtu_of(code), mtu);
    }
    for bad in [0, 1500, 9000, 128, 8192] {
        assert_eq!(mtu_code(bad), Err(RdmaCmError::BadMtu(bad)));
    }
    // A peer's out-of-range code: the nearest valid MTU.
    assert_eq!(mtu_of(0), 256);
    assert_eq!(mtu_of(6), 4096);
    assert_eq!(mtu_of(u8::MAX), 4096);
}

#[test]
fn ca_guid_is_eui64_of_a_local_mac() {
    // MAC 02:00:c0:a8:01:02 → EUI-64 02:00:c0:ff:fe:a8:01:02.
    assert_eq!(ca_guid(v4(192, 168, 1, 2)), 0x0200_c0ff_fea8_0102);
    // IPv6: 02 and the last five octets; ::ffff:10.11.12.13 → MAC 02:ff:0a:0b:0c:0d.
    assert_eq!(
        ca_guid("::ffff:10.11.12.13".parse().expect("v6")),
        0x02ff_0aff_fe0b_0c0d
    );
}

#[test]
fn clamp_to_8_bits() {
    assert_eq!(clamp_u8(0), 0);
    assert_eq!(clamp_u8(255), 255);
    assert_eq!(clamp_u8(256), 255);
    assert_eq!(clamp_u8(u16::MAX), 255);
}

fn rep_info(responder_resources: u8) -> RepInfo {
    RepInfo {
        qpn: 0x22,
        starting_psn: 0x12_3456,
        responder_resources,
        initiator_depth: 4,
        rnr_retry_count: 6,
        srq: false,
        private_data: Vec::new(),
    }
}

#[test]
fn initiator_rc_transitions() {
    let a = Agreed::initiator(CmService::Rc, &rep_info(8), 0x65_4321, 4, 300, 16);
    assert_eq!(a.ord, 8, "no more outstanding than the responder serves");
    let [init, rtr, rts] = a.qp_attrs();
    assert_eq!(
        init,
        QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC),
            ..QpAttr::default()
        }
    );
    assert_eq!(
        rtr,
        QpAttr {
            state: Some(QpState::Rtr),
            pmtu: Some(2048),
            dest_qp: Some(0x22),
            rq_psn: Some(0x65_4321),
            max_dest_rd_atomic: Some(255),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        }
    );
    assert_eq!(
        rts,
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0x12_3456),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(6),
            max_rd_atomic: Some(8),
            ..QpAttr::default()
        }
    );
}

#[test]
fn initiator_ord_below_the_responders_stays() {
    let a = Agreed::initiator(CmService::Rc, &rep_info(8), 0, 1, 0, 2);
    assert_eq!((a.ird, a.ord), (0, 2));
    let a = Agreed::initiator(CmService::Rc, &rep_info(0), 0, 1, 0, 2);
    assert_eq!(a.ord, 0);
}

#[test]
fn uc_transitions_have_no_rd_atomic_timeout_or_retry() {
    let a = Agreed::initiator(CmService::Uc, &rep_info(8), 0x65_4321, 1, 4, 4);
    let [init, rtr, rts] = a.qp_attrs();
    assert_eq!(
        init.access,
        Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC)
    );
    assert_eq!(
        rtr,
        QpAttr {
            state: Some(QpState::Rtr),
            pmtu: Some(256),
            dest_qp: Some(0x22),
            rq_psn: Some(0x65_4321),
            ..QpAttr::default()
        }
    );
    assert_eq!(
        rts,
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0x12_3456),
            ..QpAttr::default()
        }
    );
}

fn req_info(path_mtu: u8, responder_resources: u8) -> ReqInfo {
    let Ok(CmMessage::Req(cap)) = CmMessage::parse(0x10, &RPING_REQ[MAD_HEADER_LEN..]) else {
        panic!("the capture's REQ")
    };
    ReqInfo {
        peer: v4(10, 77, 0, 3),
        service_id: 0x0106_1C06,
        qpn: 0x33,
        service: CmService::Rc,
        starting_psn: 0xAA_AAAA,
        responder_resources,
        initiator_depth: 1,
        retry_count: 5,
        rnr_retry_count: 3,
        path_mtu,
        local_ack_timeout: 18,
        srq: false,
        path: cap.primary,
        private_data: Vec::new(),
    }
}

#[test]
fn responder_takes_the_smaller_mtu_and_the_requesters_counts() {
    // The requester asks 1024 (3), we offer 4096 (5): 1024.
    let a = Agreed::responder(&req_info(3, 2), 0x10_0000, 5, 16, 16);
    assert_eq!(a.pmtu, 1024);
    assert_eq!((a.ird, a.ord), (16, 2));
    assert_eq!(
        (a.peer_qpn, a.rq_psn, a.sq_psn),
        (0x33, 0x10_0000, 0xAA_AAAA)
    );
    assert_eq!((a.retry, a.rnr_retry), (5, 3));
    assert_eq!(a.service, CmService::Rc);
    // We offer less than asked: ours.
    assert_eq!(Agreed::responder(&req_info(5, 2), 0, 2, 1, 1).pmtu, 512);
    // A requester's code 0 (invalid): 256.
    assert_eq!(Agreed::responder(&req_info(0, 2), 0, 5, 1, 1).pmtu, 256);
    let [_, rtr, rts] = a.qp_attrs();
    assert_eq!(rtr.max_dest_rd_atomic, Some(16));
    assert_eq!(
        (rts.retry_cnt, rts.rnr_retry, rts.max_rd_atomic),
        (Some(5), Some(3), Some(2))
    );
}

#[test]
fn retry_counts_beyond_3_bits_are_cut_to_7() {
    let mut r = req_info(3, 2);
    r.retry_count = 9;
    r.rnr_retry_count = 200;
    let [_, _, rts] = Agreed::responder(&r, 0, 3, 1, 1).qp_attrs();
    assert_eq!((rts.retry_cnt, rts.rnr_retry), (Some(7), Some(7)));
}

#[test]
fn responders_rep() {
    let a = Agreed::responder(&req_info(3, 255), 0x10_0000, 3, 1000, 300);
    let rep = a.rep(0x44, true, b"ok".to_vec());
    assert_eq!(
        rep,
        RepParams {
            qpn: 0x44,
            starting_psn: 0x10_0000,
            responder_resources: 255,
            initiator_depth: 255,
            rnr_retry_count: 7,
            srq: true,
            private_data: b"ok".to_vec(),
        }
    );
}

#[test]
fn ud_bring_up_from_each_state() {
    let init = QpAttr {
        state: Some(QpState::Init),
        qkey: Some(0x0123_4567),
        ..QpAttr::default()
    };
    let rtr = QpAttr {
        state: Some(QpState::Rtr),
        ..QpAttr::default()
    };
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(0x42),
        ..QpAttr::default()
    };
    let up = |s| ud_bring_up(s, RDMA_UDP_QKEY, 0x42);
    assert_eq!(up(QpState::Reset), vec![init, rtr, rts]);
    assert_eq!(up(QpState::Init), vec![rtr, rts]);
    assert_eq!(up(QpState::Rtr), vec![rts]);
    for s in [QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Error] {
        assert_eq!(up(s), Vec::new(), "{s:?}");
    }
}

proptest! {
    /// Whatever a peer sends, routing answers without panicking, and a route's private
    /// data are what follows the 36-octet header.
    #[test]
    fn route_takes_any_input(
        sid in any::<u64>(),
        sidr in any::<bool>(),
        pd in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let kind = if sidr { RequestKind::Sidr } else { RequestKind::Conn };
        if let Ok(r) = route(kind, sid, &pd) {
            prop_assert_eq!(r.private_data, &pd[36..]);
            prop_assert_eq!(u64::from(r.port), sid & 0xFFFF);
        }
    }

    /// Any private data: the REQ carries it after the header, or it is refused as too long.
    #[test]
    fn req_takes_any_private_data(
        app in proptest::collection::vec(any::<u8>(), 0..100),
        sport in any::<u16>(),
        dport in any::<u16>(),
    ) {
        let c = Connect {
            src: SocketAddr::new(v4(10, 0, 0, 1), sport),
            dst: SocketAddr::new(v4(10, 0, 0, 2), dport),
            ..connect(&app)
        };
        match req(&c) {
            Ok(r) => {
                prop_assert!(app.len() <= 56);
                prop_assert_eq!(&r.private_data[36..], &app[..]);
                prop_assert!(r.flow_label < 1 << 20);
                let back = route(RequestKind::Conn, r.service_id, &r.private_data);
                prop_assert_eq!(back.map(|t| (t.port, t.peer_addr)), Ok((dport, c.src)));
            }
            Err(e) => {
                prop_assert!(app.len() > 56);
                prop_assert_eq!(e, RdmaCmError::PrivateDataTooLong { msg: Message::Req, max: 56 });
            }
        }
    }
}
