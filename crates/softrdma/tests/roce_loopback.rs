//! Two RoCEv2 contexts in one process over loopback UDP (issue 4, Done-when 1): every
//! operation of RC, UC (no READ, no atomics) and UD (single-packet messages, Q_Key checked)
//! with 0, 1, PMTU−1, PMTU, PMTU+1, 1 MiB and 64 MiB messages, every byte verified.
//!
//! Nothing sleeps to synchronise: waits block on the CQ with a generous timeout as a safety
//! net only.

mod util;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use softrdma::roce::QpAttr;
use softrdma::roce::{Ah, RawTx, RoceConfig, RoceCounters};
use softrdma::*;
use softrdma_testkit::pattern;
use util::{Bringup, PMTU, Pair, QKEY, Setup, Side, TIMEOUT, assert_ok, setup, until};

const MIB: usize = 1024 * 1024;

/// A pair brought up by `modify` (server a on 127.0.0.1, client b on 127.0.0.2), RoCE
/// configured by `cfg`.
fn rig(ty: QpType, mr_len: usize, cfg: impl Fn(&mut RoceConfig) + 'static) -> (Side, Side) {
    let Pair { server, client, .. } = modify(ty).mr_len(mr_len).roce(cfg).pair();
    (server, client)
}

fn modify(ty: QpType) -> Setup {
    setup(Transport::Roce)
        .bringup(Bringup::Modify)
        .qp_type(ty)
        .cqe(1 << 16)
}

/// IPv4 leaves through the raw socket where the process may open one (the default,
/// `RawTx::Auto`, takes the UDP socket), so both send paths stay covered.
fn pair(ty: QpType, mr_len: usize) -> (Side, Side) {
    let raw = raw_if_permitted();
    rig(ty, mr_len, move |c| c.raw_tx = raw)
}

/// `RawTx::Required` where a raw socket opens (`CAP_NET_RAW`), else the UDP socket.
fn raw_if_permitted() -> RawTx {
    match socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(255)),
    ) {
        Ok(_) => RawTx::Required,
        Err(_) => RawTx::Off,
    }
}

fn sizes() -> Vec<usize> {
    vec![0, 1, PMTU - 1, PMTU, PMTU + 1, MIB]
}

fn send_recv(a: &Side, b: &Side, size: usize, seed: u64) {
    util::send_recv((a, 0), (b, 7), size, size + 9, seed);
}

fn write(a: &Side, b: &Side, size: usize, seed: u64) {
    let data = pattern(size, seed);
    a.mr.copy_in(1, &data).unwrap();
    a.post_send(SendWr::write(
        seed,
        vec![a.mr.sge(1, size as u32)],
        b.mr.rkey(),
        b.mr.addr(3),
    ));
    let s = a.wait(1)[0];
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (seed, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    // UC completes a WRITE when it leaves: a SEND behind it (same path, in order) shows the
    // data arrived. RC completes it on the ACK, after placement.
    send_recv(a, b, 0, seed + 1_000_000);
    assert_eq!(b.bytes(3, size), data, "WRITE of {size}");
}

fn read(a: &Side, b: &Side, size: usize, seed: u64) {
    let data = pattern(size, seed);
    b.mr.copy_in(5, &data).unwrap();
    a.post_send(SendWr::read(
        seed,
        Some(a.mr.sge(11, size as u32)),
        b.mr.rkey(),
        b.mr.addr(5),
    ));
    assert_ok(&a.wait(1)[0], seed, WcOpcode::RdmaRead, size);
    assert_eq!(a.bytes(11, size), data, "READ of {size}");
}

#[test]
fn rc_send_write_read_every_size() {
    let (a, b) = pair(QpType::Rc, 2 * MIB + 64);
    for (i, size) in sizes().into_iter().enumerate() {
        send_recv(&a, &b, size, i as u64 * 10);
        write(&a, &b, size, i as u64 * 10 + 1);
        read(&a, &b, size, i as u64 * 10 + 2);
    }
    assert_eq!(a.ctx.roce_counters().unwrap().bad_icrc, 0);
}

/// Unprivileged path: datagrams through the UDP socket, whose IPv4 Identification the
/// receiver recovers from the ICRC.
#[test]
fn rc_over_the_udp_socket_path() {
    let (a, b) = rig(QpType::Rc, 2 * MIB + 64, |c| c.raw_tx = RawTx::Off);
    for (i, size) in sizes().into_iter().enumerate() {
        send_recv(&a, &b, size, i as u64 * 10);
        write(&a, &b, size, i as u64 * 10 + 1);
        read(&a, &b, size, i as u64 * 10 + 2);
    }
    let (ca, cb) = (
        a.ctx.roce_counters().unwrap(),
        b.ctx.roce_counters().unwrap(),
    );
    assert_eq!(cb.bad_icrc, 0);
    // Multi-packet messages left in GSO runs, and came up as GRO runs (loopback hands a
    // GSO datagram to a GRO socket whole).
    assert!(ca.gso_sends > 0 && cb.gso_sends > 0, "{ca:?} {cb:?}");
    assert!(ca.gro_receives > 0 && cb.gro_receives > 0, "{ca:?} {cb:?}");
}

/// The same without segmentation offload: one datagram per packet each way.
#[test]
fn rc_over_the_udp_socket_path_without_gso() {
    let (a, b) = rig(QpType::Rc, 2 * MIB + 64, |c| {
        c.raw_tx = RawTx::Off;
        c.gso = false;
    });
    for (i, size) in sizes().into_iter().enumerate() {
        write(&a, &b, size, i as u64 * 10 + 1);
        read(&a, &b, size, i as u64 * 10 + 2);
    }
    let c = a.ctx.roce_counters().unwrap();
    assert_eq!((c.gso_sends, c.gro_receives), (0, 0), "{c:?}");
}

#[test]
fn rc_64_mib_write_and_read() {
    let (a, b) = pair(QpType::Rc, 64 * MIB + 64);
    write(&a, &b, 64 * MIB, 1);
    read(&a, &b, 64 * MIB, 2);
    send_recv(&a, &b, 64 * MIB, 3);
}

#[test]
fn rc_immediate_and_atomics() {
    let (a, b) = pair(QpType::Rc, 1 << 16);
    b.mr.copy_in(64, &5u64.to_ne_bytes()).unwrap();
    b.post_recv(RecvWr::new(1, vec![b.mr.sge(4096, 4096)]));
    b.post_recv(RecvWr::new(2, vec![b.mr.sge(8192, 4096)]));
    a.mr.copy_in(0, &pattern(3000, 9)).unwrap();
    a.post_send(SendWr::send_with_imm(
        1,
        vec![a.mr.sge(0, 3000)],
        0xABCD_0001,
    ));
    a.post_send(SendWr::write_with_imm(
        2,
        vec![a.mr.sge(0, 100)],
        b.mr.rkey(),
        b.mr.addr(16384),
        7,
    ));
    a.post_send(SendWr::fetch_add(
        3,
        a.mr.sge(128, 8),
        b.mr.rkey(),
        b.mr.addr(64),
        10,
    ));
    a.post_send(SendWr::cmp_swap(
        4,
        a.mr.sge(136, 8),
        b.mr.rkey(),
        b.mr.addr(64),
        15,
        99,
    ));
    let s = a.wait(4);
    assert!(s.iter().all(|w| w.status == WcStatus::Success), "{s:?}");
    assert_eq!(
        s.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        vec![
            WcOpcode::Send,
            WcOpcode::RdmaWrite,
            WcOpcode::FetchAdd,
            WcOpcode::CompSwap
        ]
    );
    let r = b.wait(2);
    assert_eq!((r[0].imm, r[0].byte_len), (Some(0xABCD_0001), 3000));
    assert_eq!(
        (r[1].opcode, r[1].imm, r[1].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(7), 100)
    );
    let word = |s: &Side, off| u64::from_ne_bytes(s.bytes(off, 8).try_into().unwrap());
    assert_eq!(word(&a, 128), 5);
    assert_eq!(word(&a, 136), 15);
    assert_eq!(word(&b, 64), 99);
    assert_eq!(b.bytes(4096, 3000), pattern(3000, 9));
}

#[test]
fn uc_send_and_write_every_size() {
    let (a, b) = pair(QpType::Uc, 2 * MIB + 64);
    for (i, size) in sizes().into_iter().enumerate() {
        send_recv(&a, &b, size, i as u64 * 10);
        write(&a, &b, size, i as u64 * 10 + 1);
    }
    // UC has no READ and no atomics (IBA Table 38).
    let e = a.qp().post_send(SendWr::read(
        9,
        Some(a.mr.sge(0, 8)),
        b.mr.rkey(),
        b.mr.addr(0),
    ));
    assert!(
        matches!(e, Err(Error::Post(PostError::Unsupported))),
        "{e:?}"
    );
}

/// UC has neither ACKs nor flow control: a 64 MiB message is 65,536 datagrams the receiver
/// must absorb at the sender's pace, so the receiving socket gets a buffer that holds it all
/// (SO_RCVBUFFORCE, CAP_NET_ADMIN). Without the capability the kernel caps the buffer and the
/// test says so and stops (the engine-level 64 MiB UC case runs in crates/ib regardless).
#[test]
fn uc_64_mib_send_and_write() {
    let need = 400 << 20;
    let raw = raw_if_permitted();
    let (a, b) = rig(QpType::Uc, 64 * MIB + 64, move |c| {
        c.raw_tx = raw;
        c.recv_buffer = need;
    });
    if b.ctx.roce_recv_buffer().unwrap() < need {
        eprintln!(
            "uc_64_mib_send_and_write: no CAP_NET_ADMIN for a {need}-octet socket buffer; not run"
        );
        return;
    }
    send_recv(&a, &b, 64 * MIB, 1);
    write(&a, &b, 64 * MIB, 2);
}

#[test]
fn ud_send_every_size_up_to_pmtu() {
    let (a, b) = pair(QpType::Ud, 1 << 16);
    let ah = a.pd.create_ah_port(b.addr()).unwrap();
    let dest = UdDest {
        ah: ah.id(),
        remote_qpn: b.qp().qp_num(),
        remote_qkey: QKEY,
    };
    for (i, size) in [0, 1, PMTU - 1, PMTU].into_iter().enumerate() {
        let data = pattern(size, i as u64);
        a.mr.copy_in(0, &data).unwrap();
        b.post_recv(RecvWr::new(i as u64, vec![b.mr.sge(0, PMTU as u32 + 40)]));
        a.post_send(SendWr::send(i as u64, vec![a.mr.sge(0, size as u32)]).to(dest));
        let s = a.wait(1)[0];
        assert_eq!(s.status, WcStatus::Success);
        let r = b.wait(1)[0];
        assert_eq!(
            (r.status, r.byte_len as usize),
            (WcStatus::Success, size + 40)
        );
        assert_eq!(r.src_qp, Some(a.qp().qp_num()));
        assert!(r.flags.grh);
        assert_eq!(b.bytes(40, size), data);
        // The GRH area holds the IPv4 header in its last 20 octets (rxe's layout).
        let grh = b.bytes(0, 40);
        assert_eq!(grh[20] >> 4, 4);
        assert_eq!(&grh[32..36], &[127, 0, 0, 1]);
    }
    // PMTU + 1 does not fit one packet: refused at post.
    let e = a
        .qp()
        .post_send(SendWr::send(9, vec![a.mr.sge(0, PMTU as u32 + 1)]).to(dest));
    assert!(
        matches!(e, Err(Error::Post(PostError::MessageTooLong))),
        "{e:?}"
    );
    // A wrong Q_Key is dropped by the receiver (C9-50): the receive stays posted.
    b.post_recv(RecvWr::new(77, vec![b.mr.sge(0, 200)]));
    let bad = UdDest {
        remote_qkey: 0x2222,
        ..dest
    };
    a.post_send(SendWr::send(10, vec![a.mr.sge(0, 10)]).to(bad));
    a.post_send(SendWr::send(11, vec![a.mr.sge(0, 20)]).to(dest));
    assert_eq!(a.wait(2).len(), 2);
    let r = b.wait(1)[0];
    assert_eq!(
        (r.wr_id, r.byte_len),
        (77, 60),
        "the good datagram took the receive"
    );
    assert_eq!(b.qp().counters().ib_header().bad_qkey, 1);
}

/// RoCEv2 over IPv6 (GIDs are the addresses themselves): RC SEND, WRITE and READ and a UD
/// datagram between two contexts on ::1; the ICRC is checked in full (no Identification).
#[test]
fn ipv6_rc_and_ud() {
    let v6 = |ty: QpType| {
        let lo = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        let Pair { server, client, .. } = modify(ty).cqe(4096).addrs(lo, lo).mr_len(2 * MIB).pair();
        for s in [&server, &client] {
            assert!(
                !s.ctx.roce_raw_tx().unwrap(),
                "IPv6 always uses the UDP socket"
            );
        }
        (server, client)
    };
    let (a, b) = v6(QpType::Rc);
    send_recv(&a, &b, 5000, 1);
    write(&a, &b, MIB, 2);
    read(&a, &b, PMTU + 1, 3);
    assert_eq!(b.ctx.roce_counters().unwrap().bad_icrc, 0);

    let (a, b) = v6(QpType::Ud);
    let ah = a.pd.create_ah_port(b.addr()).unwrap();
    a.mr.copy_in(0, b"over IPv6").unwrap();
    b.post_recv(RecvWr::new(1, vec![b.mr.sge(0, 200)]));
    a.post_send(SendWr::send(1, vec![a.mr.sge(0, 9)]).to(UdDest {
        ah: ah.id(),
        remote_qpn: b.qp().qp_num(),
        remote_qkey: QKEY,
    }));
    let r = b.wait(1)[0];
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 49));
    assert_eq!(b.bytes(40, 9), b"over IPv6");
    // The GRH area holds the IPv6 header: version 6, source ::1.
    let grh = b.bytes(0, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(grh[8..24], std::net::Ipv6Addr::LOCALHOST.octets());
}

/// A forged datagram from a plain UDP socket: a SEND Only to `qpn` at `psn`, with an ICRC
/// computed for the socket's own addresses (so it verifies) unless `corrupt`.
fn forge(from: &std::net::UdpSocket, to: SocketAddr, qpn: u32, psn: u32, corrupt: bool) {
    use softrdma_wire::ib::{BthRepr, Opcode, PacketRepr};
    use softrdma_wire::icrc::{Endpoints, icrc_for};
    let payload = b"forged";
    let p = PacketRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, qpn, psn), payload);
    let mut buf = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut buf).unwrap();
    buf.truncate(n);
    let ep = Endpoints::from_socket_addrs(from.local_addr().unwrap(), to);
    let icrc = icrc_for(&ep, 0, &buf);
    buf.extend_from_slice(&icrc.to_le_bytes());
    if corrupt {
        buf[n - 1] ^= 0x10;
    }
    from.send_to(&buf, to).unwrap();
}

/// What the driver drops before the engine, each counted: a bad ICRC (IBT-X-20), a packet for
/// a QP that does not exist (IBT-C9-39), and a well-formed packet to an RC QP from an address
/// other than its path's (IBT-C9-47.1.1: on RoCEv2 the source IP stands for the SGID). None
/// consumes a receive or moves the expected PSN: the real SEND that follows lands normally.
#[test]
fn ibt_x_20_c9_39_c9_47_1_1_driver_drops() {
    let (a, b) = pair(QpType::Rc, 1 << 16);
    b.post_recv(RecvWr::new(1, vec![b.mr.sge(0, 100)]));
    let rogue = std::net::UdpSocket::bind("127.0.0.3:0").unwrap();
    let to = b.addr();
    let qpn = b.qp().qp_num();
    let before = b.ctx.roce_counters().unwrap();
    // The expected PSN of b's QP is a's sq_psn (0x12_3456).
    forge(&rogue, to, qpn, 0x12_3456, true);
    forge(&rogue, to, qpn ^ 0x40, 0x12_3456, false);
    forge(&rogue, to, qpn, 0x12_3456, false);
    // The genuine SEND behind them, on the same path as the forgeries (datagrams from
    // different sockets may be read in any order, so wait on the counters first).
    // The receive thread counts a drop once it has decided it (rx_packets counts arrival).
    let dropped = |c: &RoceCounters| c.bad_icrc + c.unknown_qp + c.wrong_source;
    until("forged datagrams never dropped", || {
        dropped(&b.ctx.roce_counters().unwrap()) >= dropped(&before) + 3
    });
    let c = b.ctx.roce_counters().unwrap();
    assert_eq!(c.bad_icrc - before.bad_icrc, 1, "{c:?}");
    assert_eq!(c.unknown_qp - before.unknown_qp, 1, "{c:?}");
    assert_eq!(c.wrong_source - before.wrong_source, 1, "{c:?}");
    a.mr.copy_in(0, b"genuine").unwrap();
    a.post_send(SendWr::send(9, vec![a.mr.sge(0, 7)]));
    let r = b.wait(1)[0];
    assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::Success, 7));
    assert_eq!(b.bytes(0, 7), b"genuine");
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
}

/// `ibv_destroy_ah` is dropping the handle (its last clone): its id goes back to the
/// context and is reused, so creating and dropping handles forever keeps the table bounded; a
/// reused id addresses the new handle's peer, never the old one's.
#[test]
fn address_handles_are_freed_and_their_ids_reused() {
    let (a, b) = pair(QpType::Ud, 1 << 16);
    let nowhere: SocketAddr = "127.0.0.9:9".parse().unwrap();
    let held: Vec<Ah> = (0..100)
        .map(|_| a.pd.create_ah_port(nowhere).unwrap())
        .collect();
    let mut ids: Vec<u32> = held.iter().map(Ah::id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids, (0..100).collect::<Vec<u32>>());
    drop(held);
    for _ in 0..10_000 {
        let ah = a.pd.create_ah_port(nowhere).unwrap();
        assert!(ah.id() < 100, "id {} after 100 handles were freed", ah.id());
    }
    // A clone keeps the handle (and its id) alive.
    let again: Vec<Ah> = (0..100)
        .map(|_| a.pd.create_ah_port(nowhere).unwrap())
        .collect();
    assert!(again.iter().all(|h| h.id() < 100));
    let kept = again[0].clone();
    assert_eq!(kept, again[0]);
    drop(again);
    let others: Vec<Ah> = (0..99)
        .map(|_| a.pd.create_ah_port(nowhere).unwrap())
        .collect();
    assert!(others.iter().all(|h| h.id() != kept.id() && h.id() < 100));
    // The freed id, reused for b, sends to b.
    let id = kept.id();
    drop(kept);
    let ah = a.pd.create_ah_port(b.addr()).unwrap();
    assert_eq!(ah.id(), id);
    a.mr.copy_in(0, b"reused").unwrap();
    b.post_recv(RecvWr::new(1, vec![b.mr.sge(0, 100)]));
    a.post_send(SendWr::send(1, vec![a.mr.sge(0, 6)]).to(UdDest {
        ah: ah.id(),
        remote_qpn: b.qp().qp_num(),
        remote_qkey: QKEY,
    }));
    let r = b.wait(1)[0];
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 40 + 6));
    assert_eq!(b.bytes(40, 6), b"reused");
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(a.ctx.roce_counters().unwrap().tx_errors, 0);
}

/// IBT-C9-39 after `ibv_destroy_qp`: a destroyed QP's number is no longer routed; datagrams
/// to it are dropped as for a QP that never existed, and a new QP does not take it at once.
#[test]
fn destroyed_qp_is_no_longer_routed() {
    let b = setup(Transport::Roce).mr_len(4096).side();
    let to = b.addr();
    let rogue = std::net::UdpSocket::bind("127.0.0.3:0").unwrap();
    let extra =
        b.pd.create_qp(QpInitAttr::typed(QpType::Rc, &b.cq, &b.cq))
            .unwrap();
    let qpn = extra.qp_num();
    let before = b.ctx.roce_counters().unwrap();
    let wait_for = |what: &str, done: &dyn Fn(&RoceCounters) -> bool| {
        until(what, || done(&b.ctx.roce_counters().unwrap()));
    };
    // Routed to the QP (which, in Reset, drops it).
    forge(&rogue, to, qpn, 0, false);
    wait_for("datagram never received", &|c| {
        c.rx_packets > before.rx_packets
    });
    drop(extra);
    // Unknown now.
    forge(&rogue, to, qpn, 0, false);
    wait_for("datagram to a destroyed QP never dropped", &|c| {
        c.unknown_qp > before.unknown_qp
    });
    let c = b.ctx.roce_counters().unwrap();
    // Both came from one socket, in order: the first was decided before the second.
    assert_eq!(c.rx_packets - before.rx_packets, 2, "{c:?}");
    assert_eq!(c.unknown_qp - before.unknown_qp, 1, "{c:?}");
    let next =
        b.pd.create_qp(QpInitAttr::typed(QpType::Rc, &b.cq, &b.cq))
            .unwrap();
    assert_ne!(next.qp_num(), qpn);
}

/// The requester's retransmissions so far.
fn retransmitted(s: &Side) -> u64 {
    s.qp().counters().retransmitted
}

/// A receiver that got its completion in its own thread holds the ACK back for the reply it
/// may post (docs/progress.md); when it posts nothing and never calls again, its background
/// thread still sends the ACK — the sender completes without retrying. A long local ACK
/// timeout (timeout 20: 4.3 s) makes a lost ACK show as a retransmission.
#[test]
fn held_acks_leave_without_a_reply_and_at_destruction() {
    let (a, b) = pair(QpType::Rc, 1 << 16);
    a.qp()
        .modify(&QpAttr {
            timeout: Some(20),
            ..QpAttr::default()
        })
        .unwrap();
    for (i, poll) in [false, true, false, true].into_iter().enumerate() {
        let i = i as u64;
        b.post_recv(RecvWr::new(i, vec![b.mr.sge(0, 64)]));
        a.post_send(SendWr::send(i, vec![a.mr.sge(0, 64)]).with_flags(SendFlags::SIGNALED));
        // The receiver drives its own receive: blocking, or busy polling.
        let r = if poll {
            let mut out = Vec::new();
            while b.cq.poll(1, &mut out) == 0 {
                std::hint::spin_loop();
            }
            out[0]
        } else {
            b.wait(1)[0]
        };
        assert_eq!((r.wr_id, r.status), (i, WcStatus::Success));
        // ... and goes away: the sender's completion needs the ACK.
        let s = a.wait(1)[0];
        assert_eq!((s.wr_id, s.status), (i, WcStatus::Success));
    }
    assert_eq!(retransmitted(&a), 0);
    // The receiver's QP is destroyed right after its completion: the ACK leaves first.
    b.post_recv(RecvWr::new(9, vec![b.mr.sge(0, 64)]));
    a.post_send(SendWr::send(9, vec![a.mr.sge(0, 64)]).with_flags(SendFlags::SIGNALED));
    assert_eq!(b.wait(1)[0].status, WcStatus::Success);
    let Side { qps, ctx, .. } = b;
    drop(qps);
    let s = a.wait(1)[0];
    assert_eq!((s.wr_id, s.status), (9, WcStatus::Success));
    assert_eq!(retransmitted(&a), 0);
    drop(ctx);
}

/// Threads posting on one QP at once: while one of them is in its `sendmmsg` (the engine
/// let go), another's post leaves its datagrams to that sender and returns. Rounds go on
/// until that happened; every message of every round arrives, each thread's in the order it
/// posted them, and every Send completes. Over UC nothing else would send datagrams left
/// behind (no ACK comes back to flush the QP again): the sender must look again.
#[test]
fn posts_during_another_threads_send_leave_their_datagrams_to_it() {
    for ty in [QpType::Uc, QpType::Rc] {
        concurrent_posts(ty);
    }
}

fn concurrent_posts(ty: QpType) {
    const THREADS: u64 = 4;
    const EACH: u64 = 32;
    const N: u64 = THREADS * EACH;
    let (a, b) = pair(ty, 1 << 16);
    let end = std::time::Instant::now() + *TIMEOUT;
    let msg = |round: u64, t: u64, i: u64| {
        let mut m = [0u8; 24];
        m[..8].copy_from_slice(&round.to_be_bytes());
        m[8..16].copy_from_slice(&t.to_be_bytes());
        m[16..].copy_from_slice(&i.to_be_bytes());
        m
    };
    for round in 0.. {
        for k in 0..N {
            b.post_recv(RecvWr::new(k, vec![b.mr.sge(k as usize * 64, 64)]));
        }
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (a, msg) = (&a, &msg);
                s.spawn(move || {
                    for i in 0..EACH {
                        let off = 32768 + ((t * EACH + i) * 32) as usize;
                        a.mr.copy_in(off, &msg(round, t, i)).unwrap();
                        a.post_send(
                            SendWr::send(t << 32 | i, vec![a.mr.sge(off, 24)])
                                .with_flags(SendFlags::SIGNALED),
                        );
                    }
                });
            }
        });
        // Receives complete in arrival order; each thread's messages keep its order.
        let mut next = [0u64; THREADS as usize];
        for r in b.wait(N as usize) {
            assert_eq!((r.status, r.byte_len), (WcStatus::Success, 24), "{r:?}");
            let m = b.bytes(r.wr_id as usize * 64, 24);
            let field = |k: usize| u64::from_be_bytes(m[k * 8..k * 8 + 8].try_into().unwrap());
            let (t, i) = (field(1), field(2));
            assert_eq!(field(0), round);
            assert_eq!(
                i, next[t as usize],
                "{ty:?}: thread {t}'s messages out of order"
            );
            next[t as usize] += 1;
        }
        assert_eq!(next, [EACH; THREADS as usize]);
        let sent = a.wait(N as usize);
        assert!(
            sent.iter().all(|w| w.status == WcStatus::Success),
            "{sent:?}"
        );
        if a.ctx.roce_counters().unwrap().tx_handed_over > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "{ty:?}: no post found another thread sending in {round} rounds"
        );
    }
}

/// A post of 64 KiB or more, made while another thread waits on the CQ (and so on the
/// socket), is sent by that thread: it takes the QP's ACKs, so one thread sends the QP's
/// datagrams. A small post leaves from the thread that posts it. Either way every octet
/// arrives and every request completes.
#[test]
fn large_posts_while_another_thread_waits_are_sent_by_the_waiter() {
    // (size, count): the small ones many, so that the waiter waits during most of them.
    const LARGE: (usize, usize) = (96 * 1024, 16);
    const SMALL: (usize, usize) = (1024, 128);
    let (a, b) = pair(QpType::Rc, LARGE.0 * LARGE.1);
    let deferred = || a.ctx.roce_counters().unwrap().tx_deferred;
    let end = std::time::Instant::now() + *TIMEOUT;
    for round in 0u64.. {
        for (size, n) in [LARGE, SMALL] {
            let before = deferred();
            let data: Vec<Vec<u8>> = (0..n)
                .map(|i| pattern(size, round << 32 | (size as u64) << 12 | i as u64))
                .collect();
            for (i, d) in data.iter().enumerate() {
                a.mr.copy_in(i * size, d).unwrap();
            }
            std::thread::scope(|s| {
                let waiter = s.spawn(|| a.wait(n));
                for i in 0..n {
                    a.post_send(
                        SendWr::write(
                            i as u64,
                            vec![a.mr.sge(i * size, size as u32)],
                            b.mr.rkey(),
                            b.mr.addr(i * size),
                        )
                        .with_flags(SendFlags::SIGNALED),
                    );
                }
                let wcs = waiter.join().unwrap();
                assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
            });
            for (i, d) in data.iter().enumerate() {
                assert!(
                    b.bytes(i * size, size) == *d,
                    "{size}-octet Write {i} differs"
                );
            }
            if size == SMALL.0 {
                assert_eq!(deferred(), before, "a {size}-octet post was deferred");
            }
        }
        if deferred() > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "no large post was left to the waiting thread in {round} rounds"
        );
    }
}

/// The default send path (`RawTx::Auto`: the UDP socket with `IP_PMTUDISC_DO`) puts ICRCs
/// on the wire that a strict receiver (rxe, a NIC) accepts: computed over the IPv4 header the
/// kernel wrote, Identification included — 0 on a lone datagram, 0, 1, 2, ... on the segments
/// of a GSO run. A raw `IPPROTO_UDP` socket sees every datagram as it arrives, headers and all
/// (a GSO run unsegmented, over loopback); each must verify exactly. Needs `CAP_NET_RAW`:
/// without it the test says so and stops (rxe checks the same in scripts/interop-rxe.sh).
#[test]
fn default_udp_path_icrcs_verify_exactly_on_the_wire() {
    use softrdma_wire::icrc::{Endpoints, verify_exact};
    let Ok(sniff) = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::UDP),
    ) else {
        eprintln!("default_udp_path_icrcs_verify_exactly_on_the_wire: no CAP_NET_RAW; not run");
        return;
    };
    // recv(2) on the raw socket through std's safe wrapper.
    let sniff: std::net::UdpSocket = sniff.into();
    sniff
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let (a, b) = rig(QpType::Rc, 1 << 20, |c| c.raw_tx = RawTx::Auto);
    // Lone datagrams (Sends, ACKs) and runs of equal-size packets (a Write's middles).
    for (i, size) in [1, 100, 8 * PMTU, 64 * 1024].into_iter().enumerate() {
        send_recv(&a, &b, size, i as u64 + 1);
        write(&a, &b, size, i as u64 + 100);
    }
    assert!(
        a.ctx.roce_counters().unwrap().gso_sends > 0,
        "no GSO run sent"
    );
    let ports = [a.addr(), b.addr()];
    let (mut datagrams, mut segments, mut runs) = (0, 0, 0);
    let mut buf = vec![0u8; 1 << 17];
    while let Ok(n) = sniff.recv(&mut buf) {
        let pkt = &buf[..n];
        let ihl = usize::from(pkt[0] & 0x0F) * 4;
        let (ip, udp) = pkt.split_at(ihl);
        let src = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15])),
            u16::from_be_bytes([udp[0], udp[1]]),
        );
        let dst = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19])),
            u16::from_be_bytes([udp[2], udp[3]]),
        );
        if !ports.contains(&src) || !ports.contains(&dst) {
            continue;
        }
        assert_eq!(ip[6] & 0x40, 0x40, "DF not set");
        let first_id = u16::from_be_bytes([ip[4], ip[5]]);
        datagrams += 1;
        let ep = Endpoints::from_socket_addrs(src, dst);
        // A GSO run arrives whole: its segments are equal in size (the last may be
        // shorter); the first segment's length is the one whose ICRC verifies.
        let mut rest = &udp[8..];
        let mut k = 0u16;
        let seg = (16..=rest.len())
            .step_by(4)
            .find(|&l| verify_exact(&ep, first_id, &rest[..l]))
            .unwrap_or_else(|| panic!("no exact ICRC in a datagram of {}", rest.len()));
        while !rest.is_empty() {
            let l = seg.min(rest.len());
            assert!(
                verify_exact(&ep, first_id.wrapping_add(k), &rest[..l]),
                "segment {k} of a {}-octet datagram",
                udp.len() - 8
            );
            rest = &rest[l..];
            k += 1;
            segments += 1;
        }
        if k > 1 {
            runs += 1;
        }
    }
    assert!(
        datagrams > 0 && runs > 0,
        "{datagrams} datagrams, {runs} GSO runs seen"
    );
    eprintln!("{datagrams} datagrams, {segments} packets, {runs} GSO runs: every ICRC exact");
}
