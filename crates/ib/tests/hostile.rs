//! Every byte from the network is hostile: arbitrary and near-valid packets thrown at RC, UC
//! and UD QPs never panic the engine and never touch memory outside the registered region;
//! over a shared receive queue, every WQE is still accounted for exactly once.

use std::sync::Arc;
use std::time::Instant;

use proptest::prelude::*;
use softrdma_ib::{
    IbQp, QpAttr, QpCaps, QpState, QpType, RecvWr, SendWr, Sge, SharedRecvQueue, WcStatus,
};
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId};
use softrdma_wire::ib::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, Opcode,
    PacketRepr, RethRepr, Syndrome,
};

const GUARD: usize = 4096;
const REGION: usize = 16384;
const FILL: u8 = 0xA5;

struct Target {
    qp: IbQp,
    buf: Arc<Buffer>,
    key: Key,
    /// The SRQ the QP takes its receives from, if any.
    srq: Option<Arc<SharedRecvQueue>>,
    /// Receive completions seen: (wr_id, status).
    recvs: Vec<(u64, WcStatus)>,
}

fn target(ty: QpType) -> Target {
    target_on(ty, false)
}

/// A QP of `ty` in RTS with four receive WQEs (its own, or in an SRQ when `srq`).
fn target_on(ty: QpType, srq: bool) -> Target {
    let keys = Arc::new(KeyTable::with_seed(3));
    // The region is the middle of a larger buffer: the guards on both sides must stay intact.
    let buf = Buffer::from_vec(vec![FILL; GUARD + REGION + GUARD]);
    let key = keys
        .reg_mr(
            PdId(1),
            buf.clone(),
            GUARD,
            REGION,
            0x10_0000,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    let srq = srq.then(|| Arc::new(SharedRecvQueue::new(PdId(1), 8, 2)));
    let mut qp = match &srq {
        Some(q) => IbQp::new_with_srq(
            0x11,
            ty,
            PdId(1),
            QpCaps::default(),
            keys.clone(),
            q.clone(),
        )
        .unwrap(),
        None => IbQp::new(0x11, ty, PdId(1), QpCaps::default(), keys.clone()),
    };
    let conn = ty != QpType::Ud;
    let rc = ty == QpType::Rc;
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        qkey: (!conn).then_some(7),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: conn.then_some(256),
        dest_qp: conn.then_some(0x22),
        rq_psn: conn.then_some(100),
        max_dest_rd_atomic: rc.then_some(4),
        min_rnr_timer: rc.then_some(1),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(500),
        timeout: rc.then_some(3),
        retry_cnt: rc.then_some(7),
        rnr_retry: rc.then_some(7),
        max_rd_atomic: rc.then_some(4),
        ..QpAttr::default()
    })
    .unwrap();
    for i in 0..4 {
        let wr = RecvWr::new(i, vec![Sge::new(key, 0x10_0000 + i * 1024, 1024)]);
        match &srq {
            Some(q) => q.post_recv(wr, &keys).unwrap(),
            None => qp.post_recv(wr).unwrap(),
        }
    }
    // Some requests outstanding so responses have something to hit.
    if conn {
        qp.post_send(SendWr::write(
            1,
            vec![Sge::new(key, 0x10_0000, 600)],
            Key(9),
            0,
        ))
        .unwrap();
    }
    if rc {
        qp.post_send(SendWr::read(
            2,
            Some(Sge::new(key, 0x10_2000, 700)),
            Key(9),
            0,
        ))
        .unwrap();
        qp.post_send(SendWr::fetch_add(
            3,
            Sge::new(key, 0x10_3000, 8),
            Key(9),
            0,
            1,
        ))
        .unwrap();
    }
    Target {
        qp,
        buf,
        key,
        srq,
        recvs: Vec::new(),
    }
}

fn guards_intact(t: &Target) -> bool {
    let g = t.buf.read();
    g[..GUARD].iter().all(|&b| b == FILL) && g[GUARD + REGION..].iter().all(|&b| b == FILL)
}

fn drive(t: &mut Target, pkt: &PacketRepr<'_>) {
    let now = Instant::now();
    t.qp.handle_packet(pkt, &[0; 40], now);
    let mut out = Vec::new();
    for _ in 0..10_000 {
        if t.qp.poll_transmit(now, &mut out).is_none() {
            break;
        }
        // What the engine emits must itself parse.
        PacketRepr::parse(&out).expect("emitted packet parses");
    }
    while t.qp.poll_send_completion().is_some() {}
    while let Some(w) = t.qp.poll_recv_completion() {
        t.recvs.push((w.wr_id, w.status));
    }
    t.qp.handle_timeout(now + std::time::Duration::from_secs(1));
}

fn qp_type() -> impl Strategy<Value = QpType> {
    prop_oneof![Just(QpType::Rc), Just(QpType::Uc), Just(QpType::Ud)]
}

/// A packet whose headers match its opcode (so it passes parsing) with hostile values.
fn near_valid() -> impl Strategy<Value = NearValid> {
    (
        any::<u8>(),
        prop_oneof![90u32..110, 495u32..510, any::<u32>()],
        prop_oneof![Just(0u32), any::<u32>()],
        prop_oneof![
            0x10_0000u64 - 64..0x10_0000 + REGION as u64 + 64,
            any::<u64>()
        ],
        prop_oneof![0u32..600, any::<u32>()],
        any::<u32>(),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..600),
        prop_oneof![Just(0xFFFFu16), any::<u16>()],
    )
}

type NearValid = (u8, u32, u32, u64, u32, u32, u8, Vec<u8>, u16);

/// SEND and RDMA WRITE packets of every service around the expected PSN, mostly with valid
/// keys and PMTU-sized payloads: the ones that take (or should not take) receive WQEs.
fn send_like() -> impl Strategy<Value = NearValid> {
    (
        prop::sample::select(vec![0x00u8, 0x20, 0x60]),
        prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x16, 0x17]),
        98u32..106,
        0x10_0000u64..0x10_0000 + REGION as u64,
        0u32..600,
        any::<u32>(),
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 256),
            proptest::collection::vec(any::<u8>(), 0..300),
        ],
    )
        .prop_map(|(base, op, psn, va, len, data, payload)| {
            // Even data: the UD Q_Key is the QP's.
            (base | op, psn, 0, va, len, data & !1, 0, payload, 0xFFFF)
        })
}

/// The emitted bytes of the packet `v` describes, aimed at `t` (`None`: not buildable).
fn near_valid_packet(t: &Target, v: NearValid) -> Option<Vec<u8>> {
    let (op, psn, keysel, va, len, data, synd, payload, pkey) = v;
    let opcode = Opcode::try_from(op).ok()?;
    let mut bth = BthRepr::new(opcode, 0x11, psn & 0xFF_FFFF);
    bth.pkey = pkey;
    let mut p = PacketRepr::new(bth, &payload);
    if !opcode.has_payload() {
        p = PacketRepr::new(bth, &[]);
    }
    let h = opcode.headers();
    let r_key = if keysel == 0 { t.key.0 } else { keysel };
    if h.deth {
        p.deth = Some(DethRepr {
            q_key: if data & 1 == 0 { 7 } else { data },
            reserved: 0,
            src_qp: data >> 8,
        });
    }
    if h.reth {
        p.reth = Some(RethRepr {
            va,
            r_key,
            dma_len: len,
        });
    }
    if h.atomic_eth {
        p.atomic_eth = Some(AtomicEthRepr {
            va,
            r_key,
            swap_add_data: u64::from(data),
            compare_data: 0,
        });
    }
    if h.aeth {
        let syndrome = Syndrome::try_from(synd & 0x7F).unwrap_or(Syndrome::ACK);
        p.aeth = Some(AethRepr {
            reserved: false,
            syndrome,
            msn: data & 0xFF_FFFF,
        });
    }
    if h.atomic_ack_eth {
        p.atomic_ack_eth = Some(AtomicAckEthRepr {
            orig_remote_data: u64::from(data),
        });
    }
    if h.immdt {
        p.immdt = Some(ImmDtRepr {
            immediate_data: data,
        });
    }
    if h.ieth {
        p.ieth = Some(IethRepr {
            r_key: if keysel == 0 { t.key.0 } else { data },
        });
    }
    if h.rdeth || h.xrceth || h.feth {
        return None;
    }
    // Round-trip through the wire so the engine sees exactly what a driver would.
    let mut buf = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut buf).ok()?;
    buf.truncate(n);
    PacketRepr::parse(&buf).ok()?;
    Some(buf)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(ty in qp_type(), bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        let mut t = target(ty);
        if let Ok(p) = PacketRepr::parse(&bytes) {
            drive(&mut t, &p);
        }
        prop_assert!(guards_intact(&t));
    }

    #[test]
    fn near_valid_packets_never_panic_or_escape_the_region(
        ty in qp_type(),
        seq in proptest::collection::vec(near_valid(), 1..12),
    ) {
        let mut t = target(ty);
        for v in seq {
            if let Some(b) = near_valid_packet(&t, v) {
                drive(&mut t, &PacketRepr::parse(&b).unwrap());
            }
        }
        prop_assert!(guards_intact(&t));
    }

    /// Over an SRQ: hostile packets never panic, never escape the region, and every WQE is
    /// accounted for exactly once (completed on the QP or still in the SRQ) once the QP's
    /// Error state flushed the one it may hold.
    #[test]
    fn srq_near_valid_packets_account_for_every_wqe(
        ty in qp_type(),
        seq in proptest::collection::vec(prop_oneof![near_valid(), send_like()], 1..16),
    ) {
        let mut t = target_on(ty, true);
        for v in seq {
            if let Some(b) = near_valid_packet(&t, v) {
                drive(&mut t, &PacketRepr::parse(&b).unwrap());
            }
        }
        prop_assert!(guards_intact(&t));
        t.qp.modify(&QpAttr::state(QpState::Error)).unwrap();
        while let Some(w) = t.qp.poll_recv_completion() {
            t.recvs.push((w.wr_id, w.status));
        }
        prop_assert!(t.qp.take_last_wqe_reached());
        let srq = t.srq.as_ref().unwrap();
        let mut ids: Vec<u64> = t.recvs.iter().map(|r| r.0).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), t.recvs.len(), "a WQE completed twice: {:?}", t.recvs);
        prop_assert_eq!(ids.len() + srq.len(), 4);
        // The SRQ hands WQEs out in order.
        prop_assert_eq!(ids, (0..t.recvs.len() as u64).collect::<Vec<_>>());
    }
}
