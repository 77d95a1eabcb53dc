//! UD over the simulated network: single-packet SEND / SEND with immediate, the 40-octet GRH
//! area ahead of the payload, the sender's QP in the completion, Q_Key and size checks, and
//! datagrams dropped (and counted) when no receive is posted.

mod sim;

use sim::{ADDR, Faults, Setup, Sim, summary};
use softrdma_ib::{PostError, QpType, RecvWr, SendWr, Sge, UdDest, WcOpcode, WcStatus};
use softrdma_testkit::pattern;
use softrdma_wire::ib::{BthRepr, DethRepr, Opcode, Operation, PacketRepr};

const PMTU: usize = 1024;
const QKEY: u32 = 0x1111_1111;

fn ud(seed: u64) -> Sim {
    let mut s = Sim::new(
        QpType::Ud,
        1 << 20,
        &Setup::default(),
        Faults::default(),
        seed,
    );
    s.capture = true;
    s
}

fn to_b(qkey: u32) -> UdDest {
    UdDest {
        ah: 1,
        remote_qpn: 0x22,
        remote_qkey: qkey,
    }
}

/// A UD SEND Only to side 1 as another node would send it.
fn datagram(payload: &[u8], qkey: u32, src_qp: u32) -> PacketRepr<'_> {
    let mut p = PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 0x22, 5), payload);
    p.deth = Some(DethRepr {
        q_key: qkey,
        reserved: 0,
        src_qp,
    });
    p
}

/// UD SEND and SEND with immediate at 0, 1, PMTU-1 and PMTU octets: one SEND Only packet each
/// with a DETH naming the sender; the receive gets the GRH area (the sender's IPv4 header in
/// its last 20 octets) then the payload, `byte_len` = 40 + length, the GRH flag, the source
/// QP and the immediate data.
#[test]
fn send_and_send_with_imm_every_size() {
    for (i, size) in [0, 1, PMTU - 1, PMTU].into_iter().enumerate() {
        for imm in [None, Some(0xFEED_F00D)] {
            let mut s = ud(i as u64);
            let (k0, k1) = (s.n[0].key, s.n[1].key);
            let data = pattern(size, i as u64);
            s.n[0].fill(0, &data);
            s.n[1]
                .qp
                .post_recv(RecvWr::new(5, vec![Sge::new(k1, 4096, 40 + size as u32)]))
                .unwrap();
            let sge = vec![Sge::new(k0, 0, size as u32)];
            let wr = match imm {
                None => SendWr::send(1, sge),
                Some(v) => SendWr::send_with_imm(1, sge, v),
            };
            s.n[0].qp.post_send(wr.to(to_b(QKEY))).unwrap();
            s.run_idle(10_000);
            let what = format!("size {size} imm {imm:?}");
            assert_eq!(
                summary(&s.n[0].sends),
                vec![(1, WcStatus::Success, WcOpcode::Send)],
                "{what}"
            );
            let pkts: Vec<_> = s.log.iter().filter(|r| r.tx).collect();
            assert_eq!(pkts.len(), 1, "{what}");
            let op = if imm.is_some() {
                Operation::SendOnlyWithImmediate
            } else {
                Operation::SendOnly
            };
            assert_eq!(pkts[0].opcode.operation(), op);
            assert_eq!(pkts[0].payload, data);
            let r = s.n[1].recvs[0];
            assert_eq!(
                (r.wr_id, r.status, r.opcode, r.byte_len as usize),
                (5, WcStatus::Success, WcOpcode::Recv, 40 + size),
                "{what}"
            );
            assert!(r.flags.grh);
            assert_eq!((r.src_qp, r.imm), (Some(0x11), imm));
            assert_eq!(s.n[1].read(4096 + 40, size), data, "{what}");
            let grh = s.n[1].read(4096, 40);
            assert_eq!(grh[..20], [0; 20]);
            assert_eq!(grh[20] >> 4, 4, "IPv4 header");
            assert_eq!(grh[32..36], ADDR[0].octets(), "source address");
            assert_eq!(grh[36..40], ADDR[1].octets(), "destination address");
        }
    }
}

/// IBT-C9-12: UD messages are one packet of at most the PMTU: a larger one is refused at
/// post; an inbound datagram longer than the PMTU is dropped without using a receive.
#[test]
fn ibt_c9_12_ud_larger_than_pmtu() {
    let mut s = ud(10);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    assert_eq!(
        s.n[0]
            .qp
            .post_send(SendWr::send(1, vec![Sge::new(k0, 0, PMTU as u32 + 1)]).to(to_b(QKEY))),
        Err(PostError::MessageTooLong)
    );
    assert_eq!(s.n[0].qp.sq_outstanding(), 0);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(5, vec![Sge::new(k1, 0, 4096)]))
        .unwrap();
    let big = pattern(PMTU + 1, 10);
    s.inject(1, &datagram(&big, QKEY, 0x11));
    assert!(s.n[1].recvs.is_empty());
    let small = pattern(PMTU, 11);
    s.inject(1, &datagram(&small, QKEY, 0x11));
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(5, WcStatus::Success, WcOpcode::Recv)]
    );
    assert_eq!(s.n[1].read(40, PMTU), small);
}

/// IBT-C9-50: a datagram with another Q_Key is silently dropped (counted, receive not used);
/// the right Q_Key then goes through.
#[test]
fn ibt_c9_50_wrong_qkey_dropped() {
    let mut s = ud(20);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, b"right key");
    s.n[1]
        .qp
        .post_recv(RecvWr::new(5, vec![Sge::new(k1, 0, 4096)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 9)]).to(to_b(0x2222_2222)))
        .unwrap();
    s.run_idle(1000);
    assert_eq!(s.n[1].qp.counters().bad_qkey, 1);
    assert!(s.n[1].recvs.is_empty());
    // The sender does not learn about it: UD completes at transmission.
    assert_eq!(s.n[0].sends[0].status, WcStatus::Success);
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![Sge::new(k0, 0, 9)]).to(to_b(QKEY)))
        .unwrap();
    s.run_idle(1000);
    assert_eq!(s.n[1].recvs.len(), 1);
    assert_eq!(s.n[1].read(40, 9), b"right key");
}

/// No receive posted: the datagram is dropped and counted (no RNR on UD), nothing is sent
/// back; the next one, with a receive posted, arrives.
#[test]
fn no_receive_dropped_and_counted() {
    let mut s = ud(30);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[0].fill(0, b"0123456789");
    for id in 1..=2 {
        s.n[0]
            .qp
            .post_send(SendWr::send(id, vec![Sge::new(k0, 0, 10)]).to(to_b(QKEY)))
            .unwrap();
    }
    s.run_idle(1000);
    assert_eq!(s.n[1].qp.responder_counters().no_wqe, 2);
    assert!(s.log.iter().all(|r| r.from == 0));
    s.n[1]
        .qp
        .post_recv(RecvWr::new(5, vec![Sge::new(k1, 0, 100)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(3, vec![Sge::new(k0, 0, 10)]).to(to_b(QKEY)))
        .unwrap();
    s.run_idle(1000);
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![(5, WcStatus::Success, WcOpcode::Recv)]
    );
    assert_eq!(s.n[1].read(40, 10), b"0123456789");
    let ids: Vec<u64> = s.n[0].sends.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
}

/// IBT-C9-46, IBT-C9-8: a UD QP accepts datagrams from any source (GID / address not
/// checked) and ignores the DETH reserved octet; the GRH image is placed verbatim and the
/// DETH source QP reported.
#[test]
fn ibt_c9_46_any_source_accepted() {
    let mut s = ud(40);
    let k1 = s.n[1].key;
    for id in 0..2u64 {
        s.n[1]
            .qp
            .post_recv(RecvWr::new(id, vec![Sge::new(k1, 4096 * id, 4096)]))
            .unwrap();
    }
    for (i, src_qp) in [0x777u32, 0xAB_CDEF].into_iter().enumerate() {
        let mut grh = [0u8; 40];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[192, 168, 7, i as u8]);
        grh[36..40].copy_from_slice(&ADDR[1].octets());
        let payload = pattern(100, 40 + i as u64);
        let mut p = datagram(&payload, QKEY, src_qp);
        p.deth.as_mut().unwrap().reserved = 0xA5;
        let now = s.now;
        s.n[1].qp.handle_packet(&p, &grh, now);
        s.n[1].drain();
        let r = s.n[1].recvs[i];
        assert_eq!(
            (r.wr_id, r.status, r.src_qp, r.byte_len),
            (i as u64, WcStatus::Success, Some(src_qp), 140)
        );
        assert_eq!(s.n[1].read(4096 * i, 40), grh);
        assert_eq!(s.n[1].read(4096 * i + 40, 100), payload);
    }
}

/// A datagram longer than the receive buffer (GRH area included) completes that receive
/// with `LocalLength`; a zero-length datagram still needs the 40-octet GRH area.
#[test]
fn receive_too_small_is_local_length() {
    let mut s = ud(50);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    s.n[1]
        .qp
        .post_recv(RecvWr::new(5, vec![Sge::new(k1, 0, 40 + 9)]))
        .unwrap();
    s.n[1]
        .qp
        .post_recv(RecvWr::new(6, vec![Sge::new(k1, 4096, 40)]))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 10)]).to(to_b(QKEY)))
        .unwrap();
    s.n[0]
        .qp
        .post_send(SendWr::send(2, vec![]).to(to_b(QKEY)))
        .unwrap();
    s.run_idle(1000);
    assert_eq!(
        summary(&s.n[1].recvs),
        vec![
            (5, WcStatus::LocalLength, WcOpcode::Recv),
            (6, WcStatus::Success, WcOpcode::Recv)
        ]
    );
    assert_eq!(s.n[1].recvs[1].byte_len, 40);
}

/// UD takes SEND (with immediate) only, and only with a destination; connected QPs refuse a
/// destination.
#[test]
fn ud_post_rules() {
    let mut s = ud(60);
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let qp = &mut s.n[0].qp;
    let sge = || vec![Sge::new(k0, 0, 8)];
    for wr in [
        SendWr::write(1, sge(), k1, 0),
        SendWr::write_with_imm(1, sge(), k1, 0, 1),
        SendWr::read(1, Some(Sge::new(k0, 0, 8)), k1, 0),
        SendWr::fetch_add(1, Sge::new(k0, 0, 8), k1, 0, 1),
        SendWr::send_with_invalidate(1, sge(), k1),
    ] {
        assert_eq!(
            qp.post_send(wr.clone().to(to_b(QKEY))),
            Err(PostError::Unsupported),
            "{wr:?}"
        );
    }
    assert_eq!(
        qp.post_send(SendWr::send(1, sge())),
        Err(PostError::Destination)
    );
    let mut rc = Sim::new(QpType::Rc, 4096, &Setup::default(), Faults::default(), 61);
    let k = rc.n[0].key;
    assert_eq!(
        rc.n[0]
            .qp
            .post_send(SendWr::send(1, vec![Sge::new(k, 0, 8)]).to(to_b(QKEY))),
        Err(PostError::Destination)
    );
}
