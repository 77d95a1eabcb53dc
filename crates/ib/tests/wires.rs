//! The simulator over every form the endpoint sends (`sim::Wire`): IPv4 through raw sockets
//! (the default of every other test), IPv4 through UDP sockets (ICRC over Identification 0,
//! recovered on receive) and IPv6 (full ICRC). Mixed RC operations over a lossy, duplicating,
//! reordering, corrupting network complete with every byte right; every corruption is caught
//! by the receiving endpoint's ICRC check; UD receives carry the GRH image of their family.

mod sim;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sim::{Faults, Setup, Sim, Wire};
use softrdma_ib::{EndpointCounters, QpType, RecvWr, SendWr, Sge, UdDest, WcStatus};
use softrdma_testkit::pattern;

const OPS: usize = 1500;
const SLOT: usize = 4096;
const AREA: usize = OPS * SLOT;

fn faults() -> Faults {
    Faults {
        loss: 0.05,
        dup: 0.02,
        reorder: 0.02,
        corrupt: 0.02,
    }
}

/// SEND, WRITE and READ of random lengths; checks completions, bytes and the endpoints'
/// counters against the network's.
fn mixed_rc(wire: Wire, seed: u64) {
    let setup = Setup {
        timeout: 6,
        ..Setup::default()
    };
    let mut s = Sim::new_on(wire, QpType::Rc, 2 * AREA, &setup, faults(), seed);
    let mut rng = StdRng::seed_from_u64(seed);
    s.n[0].fill(0, &pattern(AREA, seed));
    s.n[1].fill(AREA, &pattern(AREA, seed + 1));
    let (k0, k1) = (s.n[0].key, s.n[1].key);
    let mut ops = Vec::new();
    for i in 0..OPS {
        let len = rng.random_range(0..=3000usize);
        let off = (i * SLOT) as u64;
        let kind = rng.random_range(0..3);
        let wr = match kind {
            0 => {
                s.n[1]
                    .qp
                    .post_recv(RecvWr::new(i as u64, vec![Sge::new(k1, off, SLOT as u32)]))
                    .unwrap();
                SendWr::send(i as u64, vec![Sge::new(k0, off, len as u32)])
            }
            1 => SendWr::write(i as u64, vec![Sge::new(k0, off, len as u32)], k1, off),
            _ => {
                let at = AREA as u64 + off;
                SendWr::read(i as u64, Some(Sge::new(k0, at, len as u32)), k1, at)
            }
        };
        s.n[0].qp.post_send(wr).unwrap();
        ops.push((kind, len));
    }
    s.run_until(20_000_000, |s| s.n[0].sends.len() == OPS);
    for (i, wc) in s.n[0].sends.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status),
            (i as u64, WcStatus::Success),
            "{wire:?}"
        );
    }
    for (i, &(kind, len)) in ops.iter().enumerate() {
        let off = i * SLOT + if kind == 2 { AREA } else { 0 };
        assert_eq!(
            s.n[0].read(off, len),
            s.n[1].read(off, len),
            "{wire:?} op {i}"
        );
    }
    s.run_idle(1_000_000);
    let st = s.stats;
    let c: Vec<EndpointCounters> = s.ep.iter().map(|e| e.counters()).collect();
    eprintln!("{wire:?} seed {seed}: {st:?}\n  endpoints {c:?}");
    assert!(st.lost > 0 && st.corrupted > 0 && st.bad_icrc > 0);
    // Every datagram that arrived went through an endpoint; the only drops are bad ICRCs.
    let rx: u64 = c.iter().map(|c| c.rx_datagrams).sum();
    assert_eq!(rx, st.delivered + st.bad_icrc);
    assert_eq!(c.iter().map(|c| c.bad_icrc).sum::<u64>(), st.bad_icrc);
    for c in &c {
        assert_eq!((c.malformed, c.unknown_qp, c.wrong_source), (0, 0, 0));
        assert_eq!((c.tx_no_route, c.tx_invalid), (0, 0));
    }
    assert_eq!(c.iter().map(|c| c.tx_datagrams).sum::<u64>(), st.sent);
    // A corrupted bit escapes the check only in BTH octet 4, which the ICRC masks (C9-6):
    // one octet of the 20 of an ACK, fewer of larger packets.
    assert!(
        st.bad_icrc <= st.corrupted && st.bad_icrc * 10 >= st.corrupted * 9,
        "{st:?}"
    );
}

#[test]
fn mixed_rc_over_ipv4_raw() {
    mixed_rc(Wire::Ipv4Raw, 1);
}

#[test]
fn mixed_rc_over_ipv4_udp() {
    mixed_rc(Wire::Ipv4Udp, 2);
}

#[test]
fn mixed_rc_over_ipv6() {
    mixed_rc(Wire::Ipv6, 3);
}

/// UD over each form: the datagram arrives whole, with the GRH image of the wire's family
/// (IPv4 header in the last 20 octets, or an IPv6 header) naming the sender.
#[test]
fn ud_grh_per_wire() {
    for wire in [Wire::Ipv4Raw, Wire::Ipv4Udp, Wire::Ipv6] {
        let mut s = Sim::new_on(
            wire,
            QpType::Ud,
            1 << 16,
            &Setup::default(),
            Faults::default(),
            9,
        );
        let (k0, k1) = (s.n[0].key, s.n[1].key);
        let data = pattern(700, 5);
        s.n[0].fill(0, &data);
        s.n[1]
            .qp
            .post_recv(RecvWr::new(1, vec![Sge::new(k1, 0, 4096)]))
            .unwrap();
        let to = UdDest {
            ah: 1,
            remote_qpn: 0x22,
            remote_qkey: 0x1111_1111,
        };
        s.n[0]
            .qp
            .post_send(SendWr::send(1, vec![Sge::new(k0, 0, 700)]).to(to))
            .unwrap();
        s.run_idle(1000);
        assert_eq!(s.n[1].recvs.len(), 1, "{wire:?}");
        assert_eq!(s.n[1].recvs[0].byte_len, 740);
        assert_eq!(s.n[1].read(40, 700), data);
        let grh = s.n[1].read(0, 40);
        let (src, dst) = (wire.addr(0).ip(), wire.addr(1).ip());
        match (src, dst) {
            (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) => {
                assert_eq!(grh[..20], [0; 20]);
                assert_eq!(grh[20] >> 4, 4);
                assert_eq!(
                    (&grh[32..36], &grh[36..40]),
                    (&a.octets()[..], &b.octets()[..])
                );
            }
            (std::net::IpAddr::V6(a), std::net::IpAddr::V6(b)) => {
                assert_eq!(grh[0] >> 4, 6);
                assert_eq!(
                    (&grh[8..24], &grh[24..40]),
                    (&a.octets()[..], &b.octets()[..])
                );
            }
            _ => unreachable!(),
        }
    }
}
