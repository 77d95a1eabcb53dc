//! Two contexts in one process over loopback TCP (issue 3, Done-when 1): Send/Recv, RDMA
//! Write and RDMA Read with 0, 1, 4095, 4096, 1 MiB and 64 MiB messages, unaligned offsets,
//! several SGEs, many requests outstanding, every byte verified, completions in order; CRC
//! and Markers on and off; the reject path; close and flush.
//!
//! Nothing sleeps to synchronise: waits block on completion channels (or the listener, or a
//! connect), with generous timeouts as a safety net only.

mod util;

use std::time::{Duration, Instant};

use softrdma::iwarp::{FpduSize, IwarpDeviceCounters, QpEvent, Rtr};
use softrdma::roce;
use softrdma::*;
use softrdma_testkit::pattern;
use util::{Pair, Setup, Side, TIMEOUT, assert_holds, assert_ok, setup};

const MIB: usize = 1024 * 1024;

/// iWARP sides whose waits block on completion channels.
fn iwarp() -> Setup {
    setup(Transport::Iwarp).channel()
}

fn pair() -> Pair {
    iwarp().pair()
}

/// Splits `len` octets at `off` of `mr` into up to `n` SGEs of uneven lengths.
fn sges(mr: &Mr, off: usize, len: usize, n: usize) -> Vec<Sge> {
    if len == 0 {
        return Vec::new();
    }
    let n = n.clamp(1, len);
    let mut out = Vec::new();
    let mut at = 0;
    for i in 0..n {
        let piece = if i + 1 == n {
            len - at
        } else {
            (len / n) + i % 3
        };
        let piece = piece.min(len - at);
        if piece == 0 {
            continue;
        }
        out.push(mr.sge(off + at, piece as u32));
        at += piece;
    }
    assert_eq!(at, len);
    out
}

const SIZES: [usize; 5] = [0, 1, 4095, 4096, MIB];

/// Each of [`SIZES`] a slice of its own (its length and 64 octets more) in a client's and
/// a server's region of `.0` octets, each client's and server's offset `off(i)` into the
/// slice: (length, client offset, server offset) a size.
fn slices(off: impl Fn(usize) -> (usize, usize)) -> (usize, Vec<(usize, usize, usize)>) {
    let mut at = 0;
    let slots = (SIZES.iter().enumerate())
        .map(|(i, &len)| {
            let (c, s) = off(i);
            let slot = (len, at + c, at + s);
            at += len + 64;
            slot
        })
        .collect();
    (at, slots)
}

/// ISSUE3-DONE-1: Send/Recv at every size, unaligned, several SGEs, every byte checked.
#[test]
fn send_recv_sizes_unaligned_multi_sge() {
    let Pair { client, server, .. } = pair();
    let (total, layout) = slices(|i| (3 + i, 7 + 2 * i));
    let src = client.alloc_mr(total);
    let dst = server.alloc_mr(total);
    // Receives posted first, each at an odd offset of its own slice.
    for (i, &(len, _, doff)) in layout.iter().enumerate() {
        server.post_recv(RecvWr::new(100 + i as u64, sges(&dst, doff, len, 3)));
    }
    for (i, &(len, soff, _)) in layout.iter().enumerate() {
        let data = pattern(len, i as u64 + 1);
        src.copy_in(soff, &data).unwrap();
        let wr = SendWr::send(i as u64, sges(&src, soff, len, 4));
        client.post_send(wr);
    }
    let cw = client.wait(SIZES.len());
    let sw = server.wait(SIZES.len());
    for (i, &(len, _, doff)) in layout.iter().enumerate() {
        assert_ok(&cw[i], i as u64, WcOpcode::Send, len);
        assert_ok(&sw[i], 100 + i as u64, WcOpcode::Recv, len);
        assert_holds(&dst, doff, len, i as u64 + 1, "Send");
    }
    // The octets around each message were not touched.
    let g = dst.to_vec();
    for &(len, _, doff) in &layout {
        assert_eq!(g[doff - 1], 0);
        assert_eq!(g[doff + len], 0);
    }
}

/// ISSUE3-DONE-1: RDMA Write at every size, unaligned, several SGEs.
#[test]
fn write_sizes_unaligned_multi_sge() {
    let Pair { client, server, .. } = pair();
    let (total, layout) = slices(|i| (5 + i, 11 + i));
    let src = client.alloc_mr(total);
    let dst = server.alloc_mr(total);
    for (i, &(len, soff, doff)) in layout.iter().enumerate() {
        src.copy_in(soff, &pattern(len, 50 + i as u64)).unwrap();
        let sg = sges(&src, soff, len, 3);
        client.post_send(SendWr::write(i as u64, sg, dst.rkey(), dst.addr(doff)));
    }
    // A Send after the Writes: its arrival proves every Write was placed (RDMAP ordering).
    server.post_recv(RecvWr::new(9, vec![]));
    client.post_send(SendWr::send(99, vec![]));
    let cw = client.wait(SIZES.len() + 1);
    for (i, &(len, _, _)) in layout.iter().enumerate() {
        assert_ok(&cw[i], i as u64, WcOpcode::RdmaWrite, len);
    }
    assert_ok(&cw[SIZES.len()], 99, WcOpcode::Send, 0);
    assert_ok(&server.wait(1)[0], 9, WcOpcode::Recv, 0);
    for (i, &(len, _, doff)) in layout.iter().enumerate() {
        assert_holds(&dst, doff, len, 50 + i as u64, "Write");
    }
}

/// ISSUE3-DONE-1: RDMA Read at every size, unaligned source and sink.
#[test]
fn read_sizes_unaligned() {
    let Pair { client, server, .. } = pair();
    let (total, layout) = slices(|i| (1 + i, 13 + i));
    let sink = client.alloc_mr(total);
    let source = server.alloc_mr(total);
    for (i, &(len, doff, soff)) in layout.iter().enumerate() {
        source.copy_in(soff, &pattern(len, 70 + i as u64)).unwrap();
        let sge = (len > 0).then(|| sink.sge(doff, len as u32));
        let wr = SendWr::read(i as u64, sge, source.rkey(), source.addr(soff));
        client.post_send(wr);
    }
    let cw = client.wait(SIZES.len());
    for (i, &(len, doff, _)) in layout.iter().enumerate() {
        assert_ok(&cw[i], i as u64, WcOpcode::RdmaRead, len);
        assert_holds(&sink, doff, len, 70 + i as u64, "Read");
    }
}

/// ISSUE3-DONE-1: 64 MiB Write, Read and Send, unaligned, every byte checked.
#[test]
fn sixty_four_mib_write_read_send() {
    let len = 64 * MIB;
    let Pair { client, server, .. } = pair();
    let src = client.alloc_mr(len + 64);
    let back = client.alloc_mr(len + 64);
    let dst = server.alloc_mr(len + 64);
    let rbuf = server.alloc_mr(len + 64);
    let data = pattern(len, 64);
    src.copy_in(3, &data).unwrap();
    server.post_recv(RecvWr::new(1, sges(&rbuf, 9, len, 2)));
    client.post_send(SendWr::write(
        1,
        sges(&src, 3, len, 2),
        dst.rkey(),
        dst.addr(5),
    ));
    // Read back what the Write placed: RDMAP orders a Read Response after the earlier
    // Write's placement at the responder.
    client.post_send(SendWr::read(
        2,
        Some(back.sge(1, len as u32)),
        dst.rkey(),
        dst.addr(5),
    ));
    client.post_send(SendWr::send(3, vec![src.sge(3, len as u32)]));
    let cw = client.wait(3);
    assert_ok(&cw[0], 1, WcOpcode::RdmaWrite, len);
    assert_ok(&cw[1], 2, WcOpcode::RdmaRead, len);
    assert_ok(&cw[2], 3, WcOpcode::Send, len);
    assert_ok(&server.wait(1)[0], 1, WcOpcode::Recv, len);
    assert!(dst.buffer().read()[5..5 + len] == data[..], "64 MiB Write");
    assert!(back.buffer().read()[1..1 + len] == data[..], "64 MiB Read");
    assert!(rbuf.buffer().read()[9..9 + len] == data[..], "64 MiB Send");
}

/// ISSUE3-DONE-1: many requests outstanding at once (Sends, Writes, Reads interleaved, some
/// unsignaled), completions in submission order, every byte checked.
#[test]
fn many_outstanding_in_order() {
    let cap = QpCap {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCap::default()
    };
    let Pair { client, server, .. } = iwarp().cap(cap).pair();
    const N: usize = 300;
    const LEN: usize = 3001;
    let src = client.alloc_mr(N * 4096);
    let sink = client.alloc_mr(N * 4096);
    let dst = server.alloc_mr(N * 4096);
    let rbuf = server.alloc_mr(N * 4096);
    for i in 0..N {
        src.copy_in(i * 4096 + 1, &pattern(LEN, 1000 + i as u64))
            .unwrap();
        dst.copy_in(i * 4096 + 2, &pattern(LEN, 5000 + i as u64))
            .unwrap();
    }
    let sends: Vec<usize> = (0..N).filter(|i| i % 3 == 0).collect();
    for (k, &i) in sends.iter().enumerate() {
        server.post_recv(RecvWr::new(
            k as u64,
            vec![rbuf.sge(i * 4096 + 3, LEN as u32)],
        ));
    }
    let mut signaled = Vec::new();
    for i in 0..N {
        let off = i * 4096;
        let mut wr = match i % 3 {
            0 => SendWr::send(i as u64, sges(&src, off + 1, LEN, 2)),
            // Writes go to the second half of each destination slot.
            1 => SendWr::write(
                i as u64,
                vec![src.sge(off + 1, LEN as u32)],
                dst.rkey(),
                dst.addr(off + 3000 + 7) - 3000,
            ),
            _ => SendWr::read(
                i as u64,
                Some(sink.sge(off + 5, LEN as u32)),
                dst.rkey(),
                dst.addr(off + 2),
            ),
        };
        if i % 7 == 3 {
            wr.flags = SendFlags::empty();
        } else {
            signaled.push(i as u64);
        }
        client.post_send(wr);
    }
    let cw = client.wait(signaled.len());
    let ids: Vec<u64> = cw.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, signaled, "send-queue completions in submission order");
    assert!(cw.iter().all(|w| w.status == WcStatus::Success));
    let sw = server.wait(sends.len());
    for (k, w) in sw.iter().enumerate() {
        assert_ok(w, k as u64, WcOpcode::Recv, LEN);
    }
    for &i in &sends {
        assert_holds(&rbuf, i * 4096 + 3, LEN, 1000 + i as u64, "Send");
    }
    for i in (0..N).filter(|i| i % 3 == 2) {
        assert_holds(&sink, i * 4096 + 5, LEN, 5000 + i as u64, "Read");
    }
    for i in (0..N).filter(|i| i % 3 == 1) {
        assert_holds(&dst, i * 4096 + 7, LEN, 1000 + i as u64, "Write");
    }
    assert_eq!(client.qp().sq_outstanding(), 0);
}

/// Send, Write and Read of a few sizes over one connection with the given MPA options.
fn exercise(cp: ConnectParams, lp: ListenParams, fpdu: FpduSize) -> (ConnectionInfo, Side, Side) {
    let ap = AcceptParams {
        iwarp: softrdma::iwarp::AcceptParams { fpdu },
        ..AcceptParams::default()
    };
    let Pair { client, server, .. } = iwarp().connect(cp).listen(lp).accept(ap).pair();
    let conn = client.qp().connection().unwrap();
    let sizes = [1usize, 511, 512, 513, 4096, 100_003];
    let total: usize = sizes.iter().map(|s| s + 16).sum();
    let a = client.alloc_mr(total);
    let b = server.alloc_mr(total);
    let c = server.alloc_mr(total);
    let mut at = 0;
    let mut n = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(len, 300 + i as u64);
        a.copy_in(at + 1, &data).unwrap();
        b.copy_in(at + 2, &data).unwrap();
        server.post_recv(RecvWr::new(i as u64, vec![c.sge(at + 3, len as u32)]));
        client.post_send(SendWr::send(n, vec![a.sge(at + 1, len as u32)]));
        client.post_send(SendWr::write(
            n + 1,
            vec![a.sge(at + 1, len as u32)],
            b.rkey(),
            b.addr(at + 5) - 3,
        ));
        client.post_send(SendWr::read(
            n + 2,
            Some(a.sge(at + 9, len as u32)),
            b.rkey(),
            b.addr(at + 2),
        ));
        n += 3;
        at += len + 16;
    }
    let cw = client.wait(n as usize);
    assert!(
        cw.iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == i as u64 && w.status == WcStatus::Success)
    );
    let sw = server.wait(sizes.len());
    let mut at = 0;
    for (i, &len) in sizes.iter().enumerate() {
        assert_ok(&sw[i], i as u64, WcOpcode::Recv, len);
        let data = pattern(len, 300 + i as u64);
        let mut got = vec![0u8; len];
        c.copy_out(at + 3, &mut got).unwrap();
        assert!(got == data, "Send {len}");
        at += len + 16;
    }
    (conn, client, server)
}

/// MPA-30, MPA-56: CRC and Markers, each on and off, end to end (either side asking turns
/// CRC on; Markers per direction).
#[test]
fn crc_and_markers_matrix() {
    for (crc_c, crc_s, mk_c, mk_s) in [
        (false, false, false, false),
        (true, false, false, false),
        (false, true, false, false),
        (false, false, true, false),
        (false, false, false, true),
        (true, true, true, true),
    ] {
        let cp = ConnectParams {
            iwarp: softrdma::iwarp::ConnectParams {
                crc: crc_c,
                markers: mk_c,
                ..Default::default()
            },
            ..ConnectParams::default()
        };
        let lp = ListenParams {
            iwarp: softrdma::iwarp::ListenParams {
                crc: crc_s,
                markers: mk_s,
                ..Default::default()
            },
            ..ListenParams::default()
        };
        let (conn, client, server) = exercise(cp, lp, FpduSize::PathMss);
        let n = &conn.iwarp().unwrap().negotiated;
        assert_eq!(n.crc, crc_c || crc_s);
        assert_eq!(n.markers_rx, mk_c);
        assert_eq!(n.markers_tx, mk_s);
        assert_eq!(client.qp().state(), QpState::Rts);
        assert_eq!(server.qp().state(), QpState::Rts);
    }
}

/// MPA-61: a revision 1 initiator gets a revision 1 answer (no IRD/ORD word); data moves.
#[test]
fn mpa_revision_1() {
    let cp = ConnectParams {
        iwarp: softrdma::iwarp::ConnectParams {
            rev: 1,
            crc: true,
            ..Default::default()
        },
        ..ConnectParams::default()
    };
    let (conn, _c, _s) = exercise(cp, ListenParams::default(), FpduSize::PathMss);
    assert_eq!(conn.iwarp().unwrap().negotiated.rev, 1);
}

/// FENCE: a Send of the buffer an earlier RDMA Read fills waits for the Read Response, so
/// it carries the data read, not the buffer's old contents.
#[test]
fn fenced_send_after_read() {
    let Pair { client, server, .. } = pair();
    let len = 256 * 1024;
    let remote = server.alloc_mr(len);
    remote.copy_in(0, &pattern(len, 77)).unwrap();
    let rbuf = server.alloc_mr(len);
    let local = client.alloc_mr(len);
    server.post_recv(RecvWr::new(1, vec![rbuf.sge(0, len as u32)]));
    client.post_send(SendWr::read(
        1,
        Some(local.sge(0, len as u32)),
        remote.rkey(),
        remote.addr(0),
    ));
    client.post_send(
        SendWr::send(2, vec![local.sge(0, len as u32)])
            .with_flags(SendFlags::SIGNALED | SendFlags::FENCE),
    );
    let cw = client.wait(2);
    assert_ok(&cw[0], 1, WcOpcode::RdmaRead, len);
    assert_ok(&cw[1], 2, WcOpcode::Send, len);
    assert_ok(&server.wait(1)[0], 1, WcOpcode::Recv, len);
    assert!(rbuf.to_vec() == pattern(len, 77));
}

/// MPA-04: FPDUs fit the MSS by default; a small fixed MULPDU and the largest one work too.
#[test]
fn fpdu_sizes() {
    for fpdu in [
        FpduSize::Mulpdu(128),
        FpduSize::Mulpdu(1000),
        FpduSize::Largest,
    ] {
        let cp = ConnectParams {
            iwarp: softrdma::iwarp::ConnectParams {
                fpdu,
                crc: true,
                ..Default::default()
            },
            ..ConnectParams::default()
        };
        let (conn, _c, _s) = exercise(cp, ListenParams::default(), fpdu);
        assert_eq!(
            conn.iwarp().unwrap().mulpdu,
            fpdu.mulpdu(conn.iwarp().unwrap().emss, false)
        );
    }
    let Pair { client, .. } = pair();
    let conn = client.qp().connection().unwrap();
    assert!(
        conn.iwarp().unwrap().mulpdu as u32 + 6 <= conn.iwarp().unwrap().emss,
        "{conn:?}"
    );
    // Over loopback the EMSS is the MTU's (an IPv4 datagram's at most 65,535 octets, less
    // IPv4, TCP and timestamps), not the half window the kernel first bounds its MSS by
    // (32 KiB on a 64 KiB `lo`).
    let lo_mtu: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .ok()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    if lo_mtu > 0 {
        assert!(
            conn.iwarp().unwrap().emss >= lo_mtu.min(65535).saturating_sub(52),
            "lo MTU {lo_mtu}: {conn:?}"
        );
    }
}

/// MPA-71, MPA-67: the responder rejects with private data; the initiator sees it and its
/// QP is back in Init, ready for a second attempt, which is accepted.
#[test]
fn reject_then_accept() {
    let Pair { client, server, .. } = iwarp().open();
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let c = s.spawn(|| {
            client.qp().connect(
                addr,
                ConnectParams {
                    private_data: b"let me in".to_vec(),
                    ..ConnectParams::default()
                },
            )
        });
        let req = listener.accept_timeout(*TIMEOUT).unwrap();
        assert_eq!(req.private_data(), b"let me in");
        assert_eq!(req.peer_ird_ord(), Some((16, 16)));
        req.reject(b"go away").unwrap();
        match c.join().unwrap() {
            Err(Error::Rejected { private_data, .. }) => assert_eq!(private_data, b"go away"),
            other => panic!("expected a rejection, got {other:?}"),
        }
    });
    assert_eq!(client.qp().state(), QpState::Init);
    std::thread::scope(|s| {
        let c = s.spawn(|| {
            client.qp().connect(
                addr,
                ConnectParams {
                    private_data: b"again".to_vec(),
                    ird: 3,
                    ord: 5,
                    ..ConnectParams::default()
                },
            )
        });
        let req = listener.accept_timeout(*TIMEOUT).unwrap();
        assert_eq!(req.private_data(), b"again");
        assert_eq!(req.peer_ird_ord(), Some((3, 5)));
        let sc = req
            .accept(
                server.qp(),
                AcceptParams {
                    private_data: b"welcome".to_vec(),
                    ird: 7,
                    ord: 9,
                    ..AcceptParams::default()
                },
            )
            .unwrap();
        let cc = c.join().unwrap().unwrap();
        assert_eq!(cc.iwarp().unwrap().negotiated.peer_private_data, b"welcome");
        assert_eq!(sc.iwarp().unwrap().negotiated.peer_private_data, b"again");
        // RFC 6581: the responder's ORD is capped by the initiator's IRD.
        assert_eq!(
            (
                sc.iwarp().unwrap().negotiated.ird,
                sc.iwarp().unwrap().negotiated.ord
            ),
            (7, 3)
        );
        assert_eq!(cc.iwarp().unwrap().negotiated.ird, 3);
    });
    assert_eq!(client.qp().state(), QpState::Rts);
    assert_eq!(server.qp().state(), QpState::Rts);
}

/// A connect to a port nobody listens on fails with an I/O error and leaves the QP in Init.
#[test]
fn connect_refused() {
    let client = iwarp().side();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r = client.qp().connect(port, ConnectParams::default());
    assert!(matches!(r, Err(Error::Io(_))), "{r:?}");
    assert_eq!(client.qp().state(), QpState::Init);
}

/// RFC 6581 peer-to-peer mode: after the RTR the responder may send first.
#[test]
fn peer_to_peer_responder_sends_first() {
    let cp = ConnectParams {
        iwarp: softrdma::iwarp::ConnectParams {
            p2p: true,
            ..Default::default()
        },
        ..ConnectParams::default()
    };
    let Pair { client, server, .. } = iwarp().connect(cp).pair();
    assert_eq!(
        client
            .qp()
            .connection()
            .unwrap()
            .iwarp()
            .unwrap()
            .negotiated
            .rtr,
        Some(Rtr::ZeroLengthWrite)
    );
    util::send_recv((&server, 0), (&client, 0), 19, 64, 2);
}

/// MPA-73 (RFC 5044 §7.1.2 r4): by default the responder sends nothing before the
/// initiator's first FPDU. The server posts a Send at once; it leaves only after the
/// client's Send arrived, so the server's CQ shows the Recv before the Send.
#[test]
fn responder_waits_for_first_fpdu() {
    let Pair { client, server, .. } = pair();
    let sm = server.alloc_mr(64);
    let cm = client.alloc_mr(64);
    sm.copy_in(0, b"after you").unwrap();
    server.post_recv(RecvWr::new(1, vec![sm.sge(32, 32)]));
    client.post_recv(RecvWr::new(2, vec![cm.sge(0, 32)]));
    server.post_send(SendWr::send(3, vec![sm.sge(0, 9)]));
    client.post_send(SendWr::send(4, vec![cm.sge(40, 3)]));
    let sw = server.wait(2);
    assert_ok(&sw[0], 1, WcOpcode::Recv, 3);
    assert_ok(&sw[1], 3, WcOpcode::Send, 9);
    let cw = client.wait(2);
    let mut ids: Vec<u64> = cw.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, [2, 4]);
    assert_eq!(&cm.to_vec()[..9], b"after you");
}

/// With `early_fpdus` (Linux siw's behaviour) the responder sends right after its Reply,
/// before the initiator has sent anything; our initiator takes those FPDUs.
#[test]
fn early_fpdus_responder_sends_first() {
    let lp = ListenParams {
        iwarp: softrdma::iwarp::ListenParams {
            early_fpdus: true,
            ..Default::default()
        },
        ..ListenParams::default()
    };
    let mut p = iwarp().listen(lp).open();
    // Posted before the connection exists.
    util::post_recv_at(&p.client, 0, 64, 1);
    p.connect();
    util::sent_to_posted((&p.server, 0), (&p.client, 0), 8, 1);
}

/// Unsignaled requests complete silently; INLINE data is copied at post time.
#[test]
fn unsignaled_and_inline() {
    let Pair { client, server, .. } = pair();
    let src = client.alloc_mr(4096);
    let dst = server.alloc_mr(4096);
    src.copy_in(0, b"inline payload!").unwrap();
    server.post_recv(RecvWr::new(7, vec![dst.sge(100, 200)]));
    client.post_send(
        SendWr::write(1, vec![src.sge(0, 15)], dst.rkey(), dst.addr(0))
            .with_flags(SendFlags::empty()),
    );
    client.post_send(
        SendWr::send(2, vec![src.sge(0, 6), src.sge(6, 9)])
            .with_flags(SendFlags::SIGNALED | SendFlags::INLINE | SendFlags::SOLICITED),
    );
    // Overwrite at once: the inline Send already holds its copy.
    src.copy_in(0, b"XXXXXXXXXXXXXXX").unwrap();
    let cw = client.wait(1);
    assert_ok(&cw[0], 2, WcOpcode::Send, 15);
    let sw = server.wait(1);
    assert_ok(&sw[0], 7, WcOpcode::Recv, 15);
    assert!(sw[0].flags.solicited);
    assert_eq!(&dst.to_vec()[100..115], b"inline payload!");
    assert!(client.cq.is_empty());
    // Inline beyond the limit is refused at post time.
    let big = client
        .qp()
        .post_send(SendWr::send(3, vec![src.sge(0, 4000)]).with_flags(SendFlags::INLINE));
    assert!(
        matches!(big, Err(Error::Post(PostError::Inline { .. }))),
        "{big:?}"
    );
}

/// Post-time checks: SGE limits, bad L_Keys, queue depth.
#[test]
fn post_time_errors() {
    let cap = QpCap {
        max_send_wr: 4,
        max_send_sge: 2,
        ..QpCap::default()
    };
    let client = iwarp().cap(cap).side();
    let mr = client.alloc_mr(64);
    let r = client.qp().post_send(SendWr::send(
        1,
        vec![mr.sge(0, 1), mr.sge(1, 1), mr.sge(2, 1)],
    ));
    assert!(
        matches!(r, Err(Error::Post(PostError::TooManySge { max: 2 }))),
        "{r:?}"
    );
    let r = client.qp().post_send(SendWr::send(1, vec![mr.sge(60, 8)]));
    assert!(
        matches!(
            r,
            Err(Error::Post(PostError::LocalProtection {
                sge: 0,
                error: AccessError::Bounds
            }))
        ),
        "{r:?}"
    );
    let bad = Sge::new(Key(mr.lkey().0 ^ 1), 0, 4);
    let r = client.qp().post_send(SendWr::send(1, vec![bad]));
    assert!(
        matches!(r, Err(Error::Post(PostError::LocalProtection { .. }))),
        "{r:?}"
    );
    // Before the connection, sends queue up to the depth.
    for i in 0..4 {
        client.post_send(SendWr::send(i, vec![]));
    }
    let r = client.qp().post_send(SendWr::send(9, vec![]));
    assert!(matches!(r, Err(Error::Post(PostError::QueueFull))), "{r:?}");
}

/// Orderly close: outstanding receives are flushed on both sides, in order, and the QPs
/// end in Closed (ours) and Error (the peer's).
#[test]
fn disconnect_flushes() {
    let Pair { client, server, .. } = pair();
    let m = server.alloc_mr(4096);
    let c = client.alloc_mr(4096);
    for i in 0..5 {
        server.post_recv(RecvWr::new(i, vec![m.sge(0, 64)]));
        client.post_recv(RecvWr::new(10 + i, vec![c.sge(0, 64)]));
    }
    client.post_send(SendWr::send(1, vec![c.sge(0, 10)]));
    assert_ok(&client.wait(1)[0], 1, WcOpcode::Send, 10);
    assert_ok(&server.wait(1)[0], 0, WcOpcode::Recv, 10);
    let (sent, got) = (client.qp().counters(), server.qp().counters());
    assert!(sent.tx_units >= 1 && got.rx_units >= 1, "{sent:?} {got:?}");
    client.qp().disconnect().unwrap();
    let cw = client.wait(5);
    let sw = server.wait(4);
    for (i, w) in cw.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status),
            (10 + i as u64, WcStatus::WorkRequestFlushed)
        );
    }
    for (i, w) in sw.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status),
            (1 + i as u64, WcStatus::WorkRequestFlushed)
        );
    }
    assert_eq!(client.qp().state(), QpState::Closed);
    server.wait_disconnected(server.qp().qp_num());
    assert_eq!(server.qp().state(), QpState::Error);
    // The connection is gone; the QP kept its counters.
    let kept = server.qp().counters();
    assert!(kept.rx_units >= got.rx_units, "{kept:?} {got:?}");
    // Posting on a dead QP completes at once, flushed.
    server.post_recv(RecvWr::new(77, vec![]));
    let w = server.wait(1);
    assert_eq!(
        (w[0].wr_id, w[0].status),
        (77, WcStatus::WorkRequestFlushed)
    );
}

/// RDMAP-109: a Write to an unknown STag. The Write completed when it was sent
/// (RDMAP-80); the responder's Terminate (Remote Protection, Invalid STag) fails the Read
/// behind it, both QPs go to Error, the requester sees exactly the Terminate the responder
/// sent, and no byte lands anywhere.
#[test]
fn remote_access_error_terminates() {
    let Pair { client, server, .. } = pair();
    let src = client.alloc_mr(4096);
    let sink = client.alloc_mr(4096);
    let dst = server.alloc_mr(4096);
    dst.copy_in(0, b"readable").unwrap();
    let bad = Key(dst.rkey().0.wrapping_add(0x100));
    client.post_send(SendWr::write(1, vec![src.sge(0, 100)], bad, 0));
    client.post_send(SendWr::read(
        2,
        Some(sink.sge(0, 8)),
        dst.rkey(),
        dst.addr(0),
    ));
    let cw = client.wait(2);
    assert_ok(&cw[0], 1, WcOpcode::RdmaWrite, 100);
    assert_eq!(cw[1].wr_id, 2);
    assert!(
        matches!(
            cw[1].status,
            WcStatus::RemoteAccess | WcStatus::WorkRequestFlushed
        ),
        "{cw:?}"
    );
    let sent = server.qp_event(|e| match e {
        QpEvent::LocalError(t) => Some(t),
        _ => None,
    });
    let got = client.qp_event(|e| match e {
        QpEvent::TerminateReceived(t) => Some(t),
        _ => None,
    });
    assert_eq!(sent, got);
    let code = format!("{:?}", sent);
    assert!(code.contains("InvalidStag"), "{code}");
    wait_state(&client, QpState::Error);
    wait_state(&server, QpState::Error);
    assert_eq!(&dst.to_vec()[..8], b"readable");
    assert!(dst.to_vec()[8..].iter().all(|&b| b == 0));
    assert!(sink.to_vec().iter().all(|&b| b == 0));
}

/// Waits for `qp` to reach `want`, blocking on the context's async events (every state
/// change of a dying stream is followed by one: Terminate, LLP error or Disconnected).
fn wait_state(side: &Side, want: QpState) {
    let deadline = Instant::now() + *TIMEOUT;
    while side.qp().state() != want {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            side.ctx.get_async_event(left).is_some(),
            "QP stuck in {:?}",
            side.qp().state()
        );
    }
}

/// Memory windows: a type 2 window bound on the server, written through by the client,
/// invalidated by the client's Send with Invalidate, then refused.
#[test]
fn memory_window_type2_bind_write_remote_invalidate() {
    let Pair { client, server, .. } = pair();
    let region = server.alloc_mr(8192);
    let mw = server.pd.alloc_mw(MwType::Type2B).unwrap();
    let rkey = mw
        .bind(
            server.qp(),
            &region,
            region.addr(4096),
            1024,
            Access::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!(mw.state(), KeyState::Valid);
    let src = client.alloc_mr(4096);
    src.copy_in(0, &pattern(1024, 9)).unwrap();
    server.post_recv(RecvWr::new(1, vec![]));
    client.post_send(SendWr::write(
        1,
        vec![src.sge(0, 1024)],
        rkey,
        region.addr(4096),
    ));
    client.post_send(SendWr::send_with_invalidate(2, vec![], rkey));
    let cw = client.wait(2);
    assert_ok(&cw[0], 1, WcOpcode::RdmaWrite, 1024);
    assert_ok(&cw[1], 2, WcOpcode::Send, 0);
    let sw = server.wait(1);
    assert_ok(&sw[0], 1, WcOpcode::Recv, 0);
    assert!(sw[0].flags.with_invalidate);
    assert_eq!(sw[0].invalidated_key, Some(rkey));
    assert_eq!(mw.state(), KeyState::Free);
    assert!(region.to_vec()[4096..5120] == pattern(1024, 9)[..]);
    // Free again: it can be rebound (new key), and invalidated locally in SQ order.
    let rkey2 = mw
        .bind(
            server.qp(),
            &region,
            region.addr(0),
            16,
            Access::REMOTE_READ,
        )
        .unwrap();
    assert_ne!(rkey, rkey2);
    server.post_send(SendWr::local_inv(3, rkey2));
    assert_ok(&server.wait(1)[0], 3, WcOpcode::LocalInv, 0);
    assert_eq!(mw.state(), KeyState::Free);
}

/// A type 1 window bound by the verb and read by the peer; rebinding changes the key.
#[test]
fn memory_window_type1_read() {
    let Pair { client, server, .. } = pair();
    let region = server.alloc_mr(4096);
    region.copy_in(100, b"window contents").unwrap();
    let mw = server.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = mw
        .bind(
            server.qp(),
            &region,
            region.addr(100),
            15,
            Access::REMOTE_READ,
        )
        .unwrap();
    let sink = client.alloc_mr(64);
    client.post_send(SendWr::read(
        1,
        Some(sink.sge(0, 15)),
        rkey,
        region.addr(100),
    ));
    assert_ok(&client.wait(1)[0], 1, WcOpcode::RdmaRead, 15);
    assert_eq!(&sink.to_vec()[..15], b"window contents");
    let again = mw
        .bind(server.qp(), &region, region.addr(0), 8, Access::REMOTE_READ)
        .unwrap();
    assert_ne!(again, rkey);
    assert_eq!(server.ctx.key_table().state(rkey), KeyState::Invalid);
}

/// A shared receive queue feeds two QPs: each Send takes the next buffer, whichever QP it
/// arrives on, and completes on that QP's receive CQ.
#[test]
fn shared_receive_queue_two_qps() {
    let srq_attr = SrqAttr::default();
    let mut p = iwarp()
        .srq(srq_attr)
        .split_cqs()
        .qps(2)
        .mr_len(16 * 256)
        .open();
    let (srq, buf) = (p.srq.clone().unwrap(), &p.server.mr);
    for i in 0..16u64 {
        srq.post_recv(RecvWr::new(i, vec![buf.sge(i as usize * 256, 256)]))
            .unwrap();
    }
    assert!(matches!(
        p.server.qps[0].post_recv(RecvWr::new(0, vec![])),
        Err(Error::SrqAttached)
    ));
    p.connect();
    let Pair { client, server, .. } = p;
    let mut sent = 0;
    for (k, qp) in client.qps.iter().enumerate() {
        let m = client.alloc_mr(256);
        m.copy_in(0, &pattern(100 + k, k as u64)).unwrap();
        for j in 0..3u64 {
            qp.post_send(SendWr::send(j, vec![m.sge(0, 100 + k as u32)]))
                .unwrap();
            sent += 1;
        }
        let w = client.wait(3);
        assert!(w.iter().all(|w| w.status == WcStatus::Success));
    }
    let rw = server.wait_recv(sent);
    let mut ids: Vec<u64> = rw.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (0..6).collect::<Vec<_>>());
    assert_eq!(srq.len(), 10);
    for w in &rw {
        assert_eq!(w.status, WcStatus::Success);
        let k = w.byte_len as usize - 100;
        assert!(server.bytes(w.wr_id as usize * 256, 100 + k) == pattern(100 + k, k as u64));
    }
    assert!(server.cq.is_empty());
}

/// Notification: "solicited only" ignores a plain Send and fires for a solicited one; the
/// channel's fd polls readable exactly while an event waits.
#[test]
fn solicited_notification_and_pollable_fd() {
    use std::os::fd::AsRawFd;
    // A server whose receive CQ is a queue of its own.
    let Pair { client, server, .. } = iwarp().split_cqs().pair();
    let (ch, rcq, sqp) = (server.ch.as_ref().unwrap(), &server.rcq, server.qp());
    let mut poll = mio::Poll::new().unwrap();
    let fd = ch.as_raw_fd();
    poll.registry()
        .register(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(1),
            mio::Interest::READABLE,
        )
        .unwrap();
    let mut events = mio::Events::with_capacity(4);
    let m = server.alloc_mr(64);
    sqp.post_recv(RecvWr::new(1, vec![m.sge(0, 8)])).unwrap();
    sqp.post_recv(RecvWr::new(2, vec![m.sge(8, 8)])).unwrap();
    rcq.req_notify(true);
    let cm = client.alloc_mr(16);
    client.post_send(SendWr::send(1, vec![cm.sge(0, 4)]));
    client.post_send(
        SendWr::send(2, vec![cm.sge(0, 4)]).with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED),
    );
    client.wait(2);
    // The event arrives for the solicited Send, and only one.
    let cq = ch.get_cq_event(Some(*TIMEOUT)).expect("solicited event");
    assert_eq!(cq, *rcq);
    let mut w = Vec::new();
    rcq.poll(8, &mut w);
    assert_eq!(w.len(), 2);
    assert!(!w[0].flags.solicited && w[1].flags.solicited);
    assert!(ch.try_get_cq_event().is_none());
    poll.poll(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(events.is_empty(), "fd readable without an event");
    // Arm for anything: the next completion makes the fd readable.
    rcq.req_notify(false);
    sqp.post_recv(RecvWr::new(3, vec![m.sge(16, 8)])).unwrap();
    client.post_send(SendWr::send(3, vec![cm.sge(0, 4)]));
    poll.poll(&mut events, Some(*TIMEOUT)).unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.token() == mio::Token(1) && e.is_readable())
    );
    assert_eq!(ch.try_get_cq_event(), Some(rcq.clone()));
    assert!(ch.try_get_cq_event().is_none());
}

/// An iWARP QP takes one `modify`: to Error, which flushes what it holds (as siw, and as
/// C programs flushing a QP before destroying it expect); any other move is refused.
#[test]
fn an_iwarp_qp_modified_to_error_flushes_its_receives() {
    let side = iwarp().side();
    let mr = side.alloc_mr(64);
    for id in [1, 2] {
        side.post_recv(RecvWr::new(id, [mr.sge(0, 64)]));
    }
    assert!(matches!(
        side.qp().modify(&roce::QpAttr::state(roce::QpState::Rtr)),
        Err(Error::Unsupported(_))
    ));
    side.qp()
        .modify(&roce::QpAttr::state(roce::QpState::Error))
        .unwrap();
    let wcs = side.wait(2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::WorkRequestFlushed),
            (2, WcStatus::WorkRequestFlushed)
        ]
    );
}

/// Issue 14, half-open connections: a listener holds at most `max_half_open` accepted TCP
/// connections whose MPA Request has not arrived; a further one closes the oldest silent
/// one (counted) instead of being refused, and a real client then connects and moves data.
#[test]
fn half_open_connections_are_capped() {
    let server = iwarp().side();
    let lp = ListenParams {
        iwarp: softrdma::iwarp::ListenParams {
            max_half_open: 3,
            ..Default::default()
        },
        ..ListenParams::default()
    };
    let listener = Listener::bind_with(&server.ctx, "127.0.0.1:0", lp).unwrap();
    let addr = listener.local_addr();
    let stats = || iwarp_stats(&server.ctx);
    // Three peers that connect and say nothing take the three places.
    let mut idle: Vec<std::net::TcpStream> = (0..3)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    until("three accepted", &|| stats().accepts == 3);
    // A fourth pushes the oldest out: its read sees the end of the stream (or a reset).
    let fourth = std::net::TcpStream::connect(addr).unwrap();
    assert_closed_by_peer(&mut idle[0], "the oldest silent connection");
    let c = stats();
    assert_eq!((c.accepts, c.half_open_evicted), (4, 1), "{c:?}");
    idle.push(fourth);
    connect_and_move_data(&server, &listener, addr, None, *TIMEOUT);
    drop(idle);
}

/// A burst of connections from one address past its `max_half_open_per_source` quota is
/// accepted while they are young and the listener has room: a client that opens many at
/// once (Debian's cmtime opens 100 through rdma_cm) may have them all accepted before it
/// sent its first MPA Request, and evicting them then refused a legitimate client.
#[test]
fn a_burst_from_one_address_past_its_quota_is_not_evicted_while_young() {
    let server = iwarp().side();
    let lp = ListenParams {
        iwarp: softrdma::iwarp::ListenParams {
            max_half_open_per_source: 2,
            ..Default::default()
        },
        ..ListenParams::default()
    };
    let listener = Listener::bind_with(&server.ctx, "127.0.0.1:0", lp).unwrap();
    let addr = listener.local_addr();
    let start = Instant::now();
    let burst: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    until("the burst accepted", &|| {
        iwarp_stats(&server.ctx).accepts == 8
    });
    let c = iwarp_stats(&server.ctx);
    // Within the grace (one second) none goes; a machine too slow for that proves nothing.
    if start.elapsed() < Duration::from_millis(900) {
        assert_eq!(c.half_open_evicted, 0, "{c:?}");
    }
    connect_and_move_data(&server, &listener, addr, None, *TIMEOUT);
    drop(burst);
}

fn iwarp_stats(ctx: &Context) -> IwarpDeviceCounters {
    match ctx.counters() {
        DeviceCounters::Iwarp(c) => c,
        other => panic!("{other:?}"),
    }
}

/// Waits (yielding) until `f` holds, failing after the safety net.
fn until(what: &str, f: &dyn Fn() -> bool) {
    let end = Instant::now() + *TIMEOUT;
    while !f() {
        assert!(Instant::now() < end, "{what}");
        std::thread::yield_now();
    }
}

fn assert_closed_by_peer(s: &mut std::net::TcpStream, what: &str) {
    use std::io::{ErrorKind, Read as _};
    s.set_read_timeout(Some(*TIMEOUT)).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("{what} stays open: {other:?}"),
    }
}

/// A silent TCP connection to `addr` from `src` (any port).
fn silent_from(src: std::net::IpAddr, addr: std::net::SocketAddr) -> std::net::TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&std::net::SocketAddr::new(src, 0).into()).unwrap();
    s.connect(&addr.into()).unwrap();
    s.into()
}

/// A client connects to `listener` (from 127.0.0.1), the server accepts, the client writes
/// and reads back 64 octets; all of it within `within` of the connect.
fn connect_and_move_data(
    server: &Side,
    listener: &Listener,
    addr: std::net::SocketAddr,
    accepted_from: Option<std::net::IpAddr>,
    within: Duration,
) {
    let client = iwarp().side();
    let start = Instant::now();
    std::thread::scope(|s| {
        let sqp = server.qp();
        let l = listener;
        s.spawn(move || {
            let req = l.accept_timeout(within).unwrap();
            if let Some(ip) = accepted_from {
                assert_eq!(req.peer_addr().ip(), ip);
            }
            req.accept(sqp, AcceptParams::default()).unwrap();
        });
        let cp = ConnectParams {
            timeout: within,
            ..ConnectParams::default()
        };
        client.qp().connect(addr, cp).unwrap();
    });
    let remote = server.alloc_mr(64);
    client.write_read_back(client.qp(), (remote.rkey(), &remote, 0), 0, 64, 64, 5);
    let took = start.elapsed();
    println!("the legitimate client connected and moved data in {took:?}");
    assert!(took < within, "the client took {took:?}");
}

/// Review F5: 300 silent TCP connections (from ten addresses, past the default
/// `max_half_open` of 256), and another address opening silent ones all along, do not
/// lock a listener with default parameters: a client that sends its MPA Request promptly
/// connects and moves data at once (the test allows 10 s). The listener evicts the oldest silent connections
/// (globally, and per source once an address holds its quota).
#[test]
fn silent_connection_flood_does_not_lock_out_a_prompt_client() {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::{AtomicBool, Ordering};
    let server = iwarp().side();
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let flood: Vec<std::net::TcpStream> = (0..300u32)
        .map(|i| {
            silent_from(
                IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + (i % 10) as u8)),
                addr,
            )
        })
        .collect();
    until("the flood accepted", &|| {
        iwarp_stats(&server.ctx).accepts >= 256
    });
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // One more address keeps opening silent connections meanwhile, each once the
        // listener took the one before (as fast as it takes them, without filling the
        // kernel's accept queue, where the client's SYN would wait a second).
        s.spawn(|| {
            let mut held = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                let before = iwarp_stats(&server.ctx).accepts;
                held.push_back(silent_from(IpAddr::V4(Ipv4Addr::new(127, 0, 2, 1)), addr));
                if held.len() > 64 {
                    held.pop_front();
                }
                while iwarp_stats(&server.ctx).accepts == before && !stop.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                }
            }
        });
        // The flood stops however the client fares.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        connect_and_move_data(
            &server,
            &listener,
            addr,
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            // A bound a loaded CI machine keeps (milliseconds here); before the fix the
            // client was refused at once.
            Duration::from_secs(10),
        );
    });
    let c = iwarp_stats(&server.ctx);
    assert!(c.half_open_evicted >= 44, "{c:?}");
    drop(flood);
}

/// A listener's port is free again once it is dropped: a server listens on it again at
/// once (librdmacm's servers do, and perftest's clients connect the moment they may).
#[test]
fn a_dropped_listener_frees_its_port_at_once() {
    let ctx = Context::open().unwrap();
    let mut l = Listener::bind(&ctx, "127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    assert!(Listener::bind(&ctx, addr).is_err(), "one listener per port");
    for _ in 0..50 {
        drop(l);
        l = Listener::bind(&ctx, addr).expect("the port is free once its listener is dropped");
    }
}
