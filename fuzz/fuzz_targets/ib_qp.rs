#![no_main]
//! The InfiniBand engine on hostile input: the first octet picks RC, UC or UD and the
//! rest is a sequence of length-prefixed packets (BTH .. pad) handed to a QP in RTS with
//! receives posted and requests outstanding, timers fired in between. Nothing may panic,
//! every packet the QP emits must parse, and the octets around the registered region stay
//! untouched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use softrdma_ib::{IbQp, QpAttr, QpCaps, QpState, QpType, RecvWr, SendWr, Sge};
use softrdma_memory::{Access, Buffer, Key, KeyTable, PdId};
use softrdma_wire::ib::PacketRepr;

const GUARD: usize = 256;
const REGION: usize = 8192;
const BASE: u64 = 0x10_0000;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    let ty = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(sel % 3)];
    let keys = Arc::new(KeyTable::with_seed(1));
    let buf = Buffer::from_vec(vec![0x5A; GUARD + REGION + GUARD]);
    let key = keys
        .reg_mr(
            PdId(1),
            buf.clone(),
            GUARD,
            REGION,
            BASE,
            Access::LOCAL_WRITE | Access::REMOTE,
        )
        .unwrap();
    let mut qp = IbQp::new(0x11, ty, PdId(1), QpCaps::default(), keys);
    let conn = ty != QpType::Ud;
    let rc = ty == QpType::Rc;
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        qkey: (!conn).then_some(0),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: conn.then_some(256),
        dest_qp: conn.then_some(0x22),
        rq_psn: conn.then_some(0),
        max_dest_rd_atomic: rc.then_some(2),
        min_rnr_timer: rc.then_some(1),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(0),
        timeout: rc.then_some(1),
        retry_cnt: rc.then_some(2),
        rnr_retry: rc.then_some(2),
        max_rd_atomic: rc.then_some(2),
        ..QpAttr::default()
    })
    .unwrap();
    for i in 0..2u64 {
        let _ = qp.post_recv(RecvWr::new(i, vec![Sge::new(key, BASE + i * 2048, 2048)]));
    }
    if conn {
        let _ = qp.post_send(SendWr::write(1, vec![Sge::new(key, BASE, 600)], Key(7), 0));
    }
    if rc {
        let _ = qp.post_send(SendWr::read(
            2,
            Some(Sge::new(key, BASE + 4096, 700)),
            Key(7),
            0,
        ));
        let _ = qp.post_send(SendWr::fetch_add(
            3,
            Sge::new(key, BASE + 8000, 8),
            Key(7),
            0,
            1,
        ));
    }
    let mut now = Instant::now();
    let mut out = Vec::new();
    while rest.len() >= 2 {
        // The top bit picks whether a lone ACK may wait (a caller's drain in the driver).
        let hold = rest[1] & 0x80 != 0;
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1] & 0x7F])) % 1100;
        rest = &rest[2..];
        let pkt = &rest[..n.min(rest.len())];
        rest = &rest[pkt.len()..];
        if let Ok(p) = PacketRepr::parse(pkt) {
            qp.handle_packet(&p, &[0; 40], now);
        }
        for _ in 0..1000 {
            if qp.poll_transmit_holding(now, &mut out, hold).is_none() {
                break;
            }
            PacketRepr::parse(&out).expect("emitted packet parses");
        }
        // What was held goes out when asked, and only an ACK is ever held.
        if qp.ack_held() {
            qp.poll_transmit(now, &mut out)
                .expect("a held ACK is sent on request");
            let p = PacketRepr::parse(&out).expect("emitted packet parses");
            assert!(p.aeth.is_some_and(|a| a.syndrome.is_ack()), "{p:?}");
        }
        while qp.poll_send_completion().is_some() {}
        while qp.poll_recv_completion().is_some() {}
        now += Duration::from_millis(1);
        qp.handle_timeout(now);
    }
    let g = buf.read();
    assert!(
        g[..GUARD].iter().all(|&b| b == 0x5A),
        "write below the region"
    );
    assert!(
        g[GUARD + REGION..].iter().all(|&b| b == 0x5A),
        "write above the region"
    );
});
