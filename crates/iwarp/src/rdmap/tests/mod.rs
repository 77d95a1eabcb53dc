//! Two-peer scenarios for the DDP/RDMAP engine. Test names carry the conformance-matrix ids
//! (`docs/spec/conformance-matrix.md`) they cover.

mod data;
mod errors;
mod local;
mod nudge;
mod pair;
mod rfc7306;

use crate::verbs_types::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// A completion with `status`, no flags.
fn wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: usize) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: byte_len as u32,
        flags: WcFlags::default(),
        invalidated_key: None,
        imm: None,
        src_qp: None,
        qp_num: 0,
    }
}

/// A successful completion.
fn ok(wr_id: u64, opcode: WcOpcode, byte_len: usize) -> WorkCompletion {
    wc(wr_id, WcStatus::Success, opcode, byte_len)
}

/// A flushed completion.
fn flushed(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    wc(wr_id, WcStatus::WorkRequestFlushed, opcode, 0)
}

mod props {
    //! Property tests: hostile input never panics the engine; random traffic round-trips.

    use proptest::prelude::*;
    use softrdma_memory::Access;
    use softrdma_wire::rdmap::Segment;

    use super::pair::{Dir, Mr, PD, Pair};
    use crate::rdmap::StreamState;
    use crate::verbs_types::{RecvWr, SendWr, WcStatus};
    use softrdma_testkit::pattern;

    /// ULPDU-shaped bytes: a plausible DDP/RDMAP control pair, then anything.
    fn ulpdu_like() -> impl Strategy<Value = Vec<u8>> {
        (
            proptest::sample::select(vec![0x41u8, 0x01, 0xC1, 0x81, 0x40, 0x43, 0x00]),
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..80),
        )
            .prop_map(|(c0, c1, tail)| {
                let mut v = vec![c0, c1];
                v.extend(tail);
                v
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// RDMAP-103, RDMAP-69, RDMAP-73: any sequence of hostile ULPDUs (RFC 7306 opcodes
        /// and QN 3 included) never panics; the engine answers with at most one Terminate,
        /// which parses, and then nothing.
        #[test]
        fn hostile_ulpdus_never_panic(
            inputs in proptest::collection::vec(
                prop_oneof![ulpdu_like(), proptest::collection::vec(any::<u8>(), 0..60)],
                1..8,
            )
        ) {
            let mut p = Pair::new(128);
            // Every remote right, so that hostile RFC 7306 Atomic Requests reach execution.
            let m = Mr::new(&p.kb, PD, 4096, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE
                | Access::REMOTE_READ | Access::REMOTE_ATOMIC);
            p.b.post_recv(RecvWr::new(1, vec![m.sge(0, 64)])).unwrap();
            for u in &inputs {
                p.inject(Dir::AtoB, u);
                p.step();
            }
            p.drive();
            let terms: Vec<_> = p.sent(Dir::BtoA).into_iter()
                .filter(|u| u.get(1).is_some_and(|c| c & 0x0F == 7))
                .map(|u| u.to_vec())
                .collect();
            prop_assert!(terms.len() <= 1);
            if let Some(t) = terms.first() {
                prop_assert!(Segment::parse(t).is_ok());
                prop_assert_eq!(p.sent(Dir::BtoA).last().map(|u| u.to_vec()), Some(t.clone()));
                prop_assert_ne!(p.b.state(), StreamState::Rts);
            }
            m.assert_guards_intact();
        }

        /// Random mixes of Sends, Writes and Reads at a random MULPDU: every octet arrives
        /// and every completion succeeds, in order.
        #[test]
        fn random_traffic_round_trips(
            mulpdu in 128u16..3000,
            ops in proptest::collection::vec((0u8..3, 0usize..6000), 1..12),
            burst in 1usize..4,
        ) {
            let mut p = Pair::new(mulpdu);
            p.burst = burst;
            p.record = false;
            let n = ops.len();
            let src = Mr::new(&p.ka, PD, n * 6000, 0x1000, Access::empty());
            let sink = Mr::new(&p.ka, PD, n * 6000, 0x10_0000, Access::LOCAL_WRITE);
            let remote = Mr::new(&p.kb, PD, n * 6000, 0x20_0000,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ);
            src.put(0, &pattern(n * 6000, 1));
            remote.put(0, &pattern(n * 6000, 2));
            for (i, &(kind, len)) in ops.iter().enumerate() {
                let off = i * 6000;
                let wr = match kind {
                    0 => {
                        p.b.post_recv(RecvWr::new(i as u64, vec![remote.sge(off, 6000)]))
                            .unwrap();
                        SendWr::send(i as u64, vec![src.sge(off, len)])
                    }
                    1 => SendWr::write(i as u64, vec![src.sge(off, len)], remote.key,
                        remote.iova + off as u64),
                    _ => SendWr::read(i as u64, Some(sink.sge(off, len)), remote.key,
                        remote.iova + off as u64),
                };
                p.a.post_send(wr).unwrap();
            }
            p.drive();
            let cq = p.cq_a();
            prop_assert_eq!(cq.len(), n);
            for (i, wc) in cq.iter().enumerate() {
                prop_assert_eq!(wc.wr_id, i as u64);
                prop_assert_eq!(wc.status, WcStatus::Success);
            }
            let (s, r, k) = (src.bytes(), remote.bytes(), sink.bytes());
            let orig = pattern(n * 6000, 2);
            for (i, &(kind, len)) in ops.iter().enumerate() {
                let range = i * 6000..i * 6000 + len;
                match kind {
                    0 | 1 => prop_assert!(r[range.clone()] == s[range]),
                    _ => prop_assert!(k[range.clone()] == orig[range]),
                }
            }
        }
    }
}
