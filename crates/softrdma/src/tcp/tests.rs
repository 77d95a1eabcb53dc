use std::time::Duration;

use crate::{
    AcceptParams, Access, BusyPoll, ConnectParams, Context, Cq, Listener, Mr, Pd, Qp, QpInitAttr,
    RecvWr, SendWr, WcStatus,
};

const LONG: Duration = Duration::from_secs(60);

fn side() -> (Context, Pd, Cq, Qp) {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq)).unwrap();
    (ctx, pd, cq, qp)
}

/// A server side `client` is connected to, with a 64-octet receive posted: the side
/// (kept alive), its CQ and the receive's region.
fn serve(client: &Qp) -> ((Context, Pd, Qp), Cq, Mr) {
    let (sctx, spd, scq, sqp) = side();
    let smr = spd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sqp.post_recv(RecvWr::new(1, [smr.sge(0, 64)])).unwrap();
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    std::thread::scope(|s| {
        let c = s.spawn(|| client.connect(addr, ConnectParams::default()).unwrap());
        let req = l.accept_timeout(LONG).unwrap();
        req.accept(&sqp, AcceptParams::default()).unwrap();
        c.join().unwrap();
    });
    ((sctx, spd, sqp), scq, smr)
}

/// What a context wrote to its TCP connections, write by write.
#[derive(Default)]
struct Writes(parking_lot::Mutex<Vec<usize>>);

impl crate::tap::Tap for Writes {
    fn tapped(&self, t: crate::tap::Tapped<'_>) {
        if let crate::tap::Tapped::TcpData {
            dir: crate::tap::Direction::Sent,
            data,
            ..
        } = t
        {
            self.0.lock().push(data.iter().map(|s| s.len()).sum());
        }
    }
}

/// A client whose writes are logged, connected to a server.
#[allow(clippy::type_complexity)]
fn tapped_pair() -> (
    (Context, Pd, Cq, Qp),
    std::sync::Arc<Writes>,
    ((Context, Pd, Qp), Cq, Mr),
) {
    let client = side();
    let writes = std::sync::Arc::new(Writes::default());
    assert!(client.0.set_tap(writes.clone()));
    let server = serve(&client.3);
    (client, writes, server)
}

/// A post in a burst writes whole segments only and keeps the partial one after them
/// for the next post or a poll (issue 43: a 64 KiB message is a segment and a few
/// dozen octets on `lo`); when neither comes, the connection's timer writes it, so the
/// peer gets every octet of a message nobody polls for. (A post that finds the
/// background thread holding the driver is written by that thread, whole: each round
/// checks the delivery, and one of them must have been the poster's own.)
#[test]
fn a_burst_keeps_its_partial_segment_back_and_the_timer_writes_it() {
    let ((cctx, cpd, ccq, cqp), writes, ((_sctx, spd, _sqp), _scq, _smr)) = tapped_pair();
    let emss = cqp.connection().unwrap().iwarp().unwrap().emss as usize;
    let len = emss + emss / 2;
    let target = spd
        .alloc_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let src = cpd.alloc_mr(len, Access::empty()).unwrap();
    let shared = cctx.shared.tcp().unwrap().clone();
    shared
        .always_burst
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut kept_back = 0;
    for round in 0..20u8 {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ round).collect();
        src.copy_in(0, &data).unwrap();
        writes.0.lock().clear();
        cqp.post_send(SendWr::write(
            u64::from(round),
            vec![src.sge(0, len as u32)],
            target.rkey(),
            target.addr(0),
        ))
        .unwrap();
        // Nobody polls or posts: the octets kept back go out all the same.
        let deadline = std::time::Instant::now() + LONG;
        while target.to_vec() != data {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the kept-back octets never left"
            );
            std::thread::yield_now();
        }
        // The tap hears of a write once the system call has returned, which can be
        // after the peer placed it.
        let w = loop {
            let w = writes.0.lock().clone();
            if w.iter().sum::<usize>() > len {
                break w;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "octets missing: {w:?}"
            );
            std::thread::yield_now();
        };
        if w.len() >= 2 && w[0] % emss == 0 {
            kept_back += 1;
        }
        // The Write completes once its last octet is written.
        let mut wcs = Vec::new();
        ccq.wait(1, 1, LONG, &mut wcs).unwrap();
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status),
            (u64::from(round), WcStatus::Success)
        );
    }
    assert!(kept_back > 0, "no post kept its partial segment back");
}

/// A message shorter than a segment is written whole by its post, burst or not: there
/// is no whole segment to write before it.
#[test]
fn a_burst_writes_a_message_shorter_than_a_segment_at_once() {
    let ((cctx, cpd, _ccq, cqp), writes, ((_sctx, spd, _sqp), _scq, _smr)) = tapped_pair();
    let target = spd
        .alloc_mr(100, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let src = cpd.alloc_mr(100, Access::empty()).unwrap();
    src.copy_in(0, &[7; 100]).unwrap();
    let shared = cctx.shared.tcp().unwrap().clone();
    shared
        .always_burst
        .store(true, std::sync::atomic::Ordering::Relaxed);
    writes.0.lock().clear();
    cqp.post_send(SendWr::write(
        1,
        vec![src.sge(0, 100)],
        target.rkey(),
        target.addr(0),
    ))
    .unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while target.to_vec() != [7; 100] {
        assert!(
            std::time::Instant::now() < deadline,
            "the Write never arrived"
        );
        std::thread::yield_now();
    }
    let w = writes.0.lock().clone();
    assert_eq!(w.len(), 1, "the FPDU was split: {w:?}");
    assert!(w[0] > 100, "not the whole FPDU: {w:?}");
}

/// Who read what a context received, read by read.
#[derive(Default)]
struct Readers(parking_lot::Mutex<Vec<std::thread::ThreadId>>);

impl crate::tap::Tap for Readers {
    fn tapped(&self, t: crate::tap::Tapped<'_>) {
        if let crate::tap::Tapped::TcpData {
            dir: crate::tap::Direction::Received,
            ..
        } = t
        {
            self.0.lock().push(std::thread::current().id());
        }
    }
}

/// A thread spinning on a quiet CQ while the context's data moves on another QP
/// (perftest's `-R` server on its control queue during a bandwidth test) moves that
/// data itself once its polls back off: the peer's Writes are read in that thread, not
/// left to the background thread beside it.
#[test]
fn a_backed_off_poll_of_a_quiet_queue_moves_the_contexts_data() {
    let (sctx, spd, quiet, control) = side();
    let readers = std::sync::Arc::new(Readers::default());
    assert!(sctx.set_tap(readers.clone()));
    let busy = sctx.create_cq(16, None).unwrap();
    let data = spd.create_qp(QpInitAttr::new(&busy, &busy)).unwrap();
    let target = spd
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let (_cctx, cpd, _ccq, ccontrol) = side();
    let cdata = cpd.create_qp(QpInitAttr::new(&_ccq, &_ccq)).unwrap();
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    for (c, s) in [(&ccontrol, &control), (&cdata, &data)] {
        std::thread::scope(|sc| {
            let j = sc.spawn(|| c.connect(addr, ConnectParams::default()).unwrap());
            l.accept_timeout(LONG)
                .unwrap()
                .accept(s, AcceptParams::default())
                .unwrap();
            j.join().unwrap();
        });
    }
    quiet.set_poll_backoff(Some(crate::PollBackoff {
        after: Duration::from_micros(1),
        wait: Duration::from_micros(100),
    }));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let src = cpd.alloc_mr(64, Access::empty()).unwrap();
    std::thread::scope(|sc| {
        let poller = sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(quiet.poll_one().is_none());
            }
            std::thread::current().id()
        });
        let deadline = std::time::Instant::now() + LONG;
        while quiet.poll_backoffs() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the polls never backed off"
            );
            std::thread::yield_now();
        }
        readers.0.lock().clear();
        for i in 1..=8u8 {
            src.copy_in(0, &[i; 64]).unwrap();
            cdata
                .post_send(SendWr::write(
                    u64::from(i),
                    vec![src.sge(0, 64)],
                    target.rkey(),
                    target.addr(0),
                ))
                .unwrap();
            while target.to_vec() != [i; 64] {
                assert!(
                    std::time::Instant::now() < deadline,
                    "Write {i} never landed"
                );
                std::thread::yield_now();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let id = poller.join().unwrap();
        let r = readers.0.lock().clone();
        assert!(!r.is_empty());
        assert!(
            r.iter().all(|t| *t == id),
            "reads in other threads than the polling one: {} of {}",
            r.iter().filter(|t| **t != id).count(),
            r.len()
        );
    });
}

/// A Send posted while another thread holds the driver is queued (the post returns at
/// once), and goes out when the holder lets the driver go: nobody has to be woken for
/// it.
#[test]
fn a_post_while_the_driver_is_held_runs_when_it_is_let_go() {
    let (cctx, cpd, _ccq, cqp) = side();
    let (_server, scq, smr) = serve(&cqp);
    let cmr = cpd.alloc_mr(64, Access::empty()).unwrap();
    cmr.copy_in(0, b"scheduled").unwrap();
    let shared = cctx.shared.tcp().unwrap().clone();
    let held = shared.lock_driver();
    std::thread::scope(|s| {
        s.spawn(|| cqp.post_send(SendWr::send(7, vec![cmr.sge(0, 9)])).unwrap())
            .join()
            .unwrap();
    });
    assert_eq!(shared.ready.lock().len(), 1, "queued behind the holder");
    // Nothing woke the thread that waits on the sockets: letting go runs the list (in
    // this thread, or in the background thread's turn if it took the driver first).
    drop(held);
    let mut wcs = Vec::new();
    scq.wait(1, 1, LONG, &mut wcs).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!(&smr.to_vec()[..9], b"scheduled");
}

/// A post scheduled while another thread held the driver runs when the waiter's own
/// turn lets the driver go, just before it blocks: the completion its own thread pushed
/// makes that turn poll instead of sleeping until the wait's deadline (30 s stalls in
/// `perf -q 1`).
#[test]
fn a_completion_the_waiter_pushes_itself_before_it_blocks_is_seen_at_once() {
    let (cctx, cpd, ccq, cqp) = side();
    let (_server, scq, smr) = serve(&cqp);
    let cmr = cpd.alloc_mr(64, Access::empty()).unwrap();
    cmr.copy_in(0, b"own turn").unwrap();
    let sge = cmr.sge(0, 8);
    let cqp = std::sync::Arc::new(cqp);
    let q = cqp.clone();
    let shared = cctx.shared.tcp().unwrap().clone();
    ccq.set_busy_poll(BusyPoll::Off);
    *shared.turn_hook.lock() = Some(Box::new(move |ctx| {
        // As if another thread had the driver: the post waits in the ready list.
        let held = ctx.driver.lock();
        q.post_send(SendWr::send(7, [sge])).unwrap();
        assert_eq!(ctx.ready.lock().len(), 1, "queued behind the holder");
        drop(held);
    }));
    let mut wcs = Vec::new();
    ccq.wait(1, 1, LONG, &mut wcs).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::Success));
    assert_eq!(
        *shared.hooked_poll.lock(),
        Some(Some(Duration::ZERO)),
        "the turn that ran the post blocked"
    );
    wcs.clear();
    scq.wait(1, 1, LONG, &mut wcs).unwrap();
    assert_eq!(&smr.to_vec()[..8], b"own turn");
}
