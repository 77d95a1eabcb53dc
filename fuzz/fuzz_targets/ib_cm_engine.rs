#![no_main]
//! Two CM engines (IBA ch. 12) on a network the input controls: it orders, drops and
//! delays their MADs, injects MADs of its own (hostile headers, or well-formed CM messages
//! naming the connections that exist), advances the clock and makes the consumers' calls
//! (connect, accept, reject, RTU, disconnect, SIDR, destroy) in any order. Nothing may
//! panic, no engine may hold more than its limit of connections, and every MAD an engine
//! sends must parse as a CM MAD.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use softrdma_ib::cm::{
    Cm, CmConfig, CmEvent, CmService, CommId, RepParams, ReqParams, reason, sidr_status,
};
use softrdma_wire::ib::cm::CmMessage;
use softrdma_wire::ib::mad::{MAD_HEADER_LEN, MAD_LEN, MadHeaderRepr};

const SERVICE: u64 = 0x0106_1c06;
const MAX_IDS: usize = 16;

fn addr(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + i as u8))
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> u32 {
        let mut v = 0u32;
        for _ in 0..4 {
            v = (v << 8) | u32::from(self.byte().unwrap_or(0));
        }
        v
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
}

fn check_out(cm: &mut Cm, wire: &mut VecDeque<Box<[u8; MAD_LEN]>>) {
    while let Some((_, mad)) = cm.poll_transmit() {
        let h = MadHeaderRepr::parse(&mad[..]).expect("our MAD header parses");
        CmMessage::parse(h.attribute_id, &mad[MAD_HEADER_LEN..]).expect("our CM message parses");
        if wire.len() < 64 {
            wire.push_back(mad);
        }
    }
    assert!(cm.len() <= MAX_IDS, "more connections than the limit");
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mut now = Instant::now();
    let mut cms = [0, 1].map(|i| {
        let mut c = CmConfig::new(addr(i), 0x1000 + i as u64, i as u32, 77 * i as u32 + 1);
        c.max_ids = MAX_IDS;
        Cm::new(c)
    });
    cms[1].listen(SERVICE).unwrap();
    // MADs on the way to side 0 and side 1.
    let mut wire: [VecDeque<Box<[u8; MAD_LEN]>>; 2] = [VecDeque::new(), VecDeque::new()];
    // IDs each side has heard of (events), for the consumer's calls and for injections.
    let mut ids: [Vec<CommId>; 2] = [Vec::new(), Vec::new()];
    let mut steps = 0;
    while let Some(op) = inp.byte() {
        steps += 1;
        if steps > 2000 {
            break;
        }
        let side = usize::from(op & 1);
        let pick = |ids: &[CommId], b: u8| ids.get(usize::from(b) % ids.len().max(1)).copied();
        match op >> 1 {
            0 => {
                let svc = if inp.byte().unwrap_or(0) & 1 == 0 {
                    SERVICE
                } else {
                    0x0106_0001
                };
                let pd_len = usize::from(inp.byte().unwrap_or(0) % 100);
                let p = ReqParams {
                    peer: addr(1 - side),
                    service_id: svc,
                    qpn: inp.u32() & 0xFF_FFFF,
                    service: CmService::Rc,
                    starting_psn: inp.u32(),
                    responder_resources: 1,
                    initiator_depth: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    path_mtu: 1 + inp.byte().unwrap_or(0) % 6,
                    srq: false,
                    flow_label: 0,
                    private_data: inp.bytes(pd_len),
                };
                if let Ok(id) = cms[side].connect(now, &p) {
                    ids[side].push(id);
                }
            }
            1..=3 => {
                // Deliver (or drop, or repeat) the next MAD to `side`.
                let how = inp.byte().unwrap_or(0);
                if let Some(m) = wire[side].pop_front() {
                    if how % 4 != 0 {
                        cms[side].handle_mad(now, addr(1 - side), &m[..]);
                    }
                    if how % 4 == 3 {
                        wire[side].push_back(m);
                    }
                }
            }
            4 | 5 => {
                // A MAD of the input's: raw, or with a valid CM header and known IDs.
                let mut m = inp.bytes(MAD_LEN);
                m.resize(MAD_LEN, 0);
                if op >> 1 == 5 {
                    let attr = 0x10 + u16::from(m[0] % 9);
                    MadHeaderRepr::cm(attr, u64::from(inp.u32()))
                        .emit(&mut m)
                        .unwrap();
                    if let Some(id) = pick(&ids[side], m[30]) {
                        m[28..32].copy_from_slice(&id.to_be_bytes()); // remote comm id
                    }
                    if let Some(id) = pick(&ids[1 - side], m[26]) {
                        m[24..28].copy_from_slice(&id.to_be_bytes()); // local comm id
                    }
                }
                let from = if m[2] & 0x80 != 0 {
                    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9))
                } else {
                    addr(1 - side)
                };
                let len = if m[3] & 0x40 != 0 {
                    usize::from(m[4])
                } else {
                    MAD_LEN
                };
                cms[side].handle_mad(now, from, &m[..len.min(MAD_LEN)]);
            }
            6 => {
                now += Duration::from_millis(u64::from(inp.byte().unwrap_or(0)) * 250);
                for c in &mut cms {
                    c.handle_timeout(now);
                }
            }
            7 => {
                if let Some(id) = pick(&ids[side], inp.byte().unwrap_or(0)) {
                    let _ = match inp.byte().unwrap_or(0) % 6 {
                        0 => cms[side].accept(
                            now,
                            id,
                            &RepParams {
                                qpn: 0x22,
                                starting_psn: 5,
                                responder_resources: 1,
                                initiator_depth: 1,
                                rnr_retry_count: 7,
                                srq: false,
                                private_data: vec![1; 10],
                            },
                        ),
                        1 => cms[side].reject(id, reason::CONSUMER_DEFINED, b"no"),
                        2 => cms[side].rtu(id, &[]),
                        3 => cms[side].disconnect(now, id),
                        4 => cms[side].sidr_reply(now, id, sidr_status::OK, 0x23, 0x0123_4567, &[]),
                        _ => {
                            cms[side].destroy(now, id);
                            Ok(())
                        }
                    };
                }
            }
            _ => {
                if let Ok(id) = cms[side].sidr_request(now, addr(1 - side), SERVICE, &[]) {
                    ids[side].push(id);
                }
            }
        }
        for i in 0..2 {
            let (a, b) = wire.split_at_mut(1);
            check_out(&mut cms[i], if i == 0 { &mut b[0] } else { &mut a[0] });
            while let Some(ev) = cms[i].poll_event() {
                let id = match ev {
                    CmEvent::Request { id, .. }
                    | CmEvent::Reply { id, .. }
                    | CmEvent::Established { id }
                    | CmEvent::Rejected { id, .. }
                    | CmEvent::TimedOut { id }
                    | CmEvent::Disconnected { id, .. }
                    | CmEvent::SidrRequest { id, .. }
                    | CmEvent::SidrReply { id, .. } => id,
                };
                if ids[i].len() < 64 && !ids[i].contains(&id) {
                    ids[i].push(id);
                }
            }
        }
    }
});
