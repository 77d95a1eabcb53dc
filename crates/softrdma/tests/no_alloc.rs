//! Posting work requests allocates nothing (issue 13): a request built from an array of
//! SGEs keeps them inline, and the post path of each transport takes no heap memory in the
//! steady state. Counted by a global allocator, on the posting thread only (the progress
//! threads' work is not the caller's).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use softrdma::*;
use util::{Pair, setup};

mod util;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// Every thread's allocations (the progress threads' too): counted while the other tests
/// of this file wait ([`SERIAL`]).
static ALL_ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls on this thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        ALL_ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        ALL_ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The safety net of every wait here.
const T: Duration = Duration::from_secs(30);

/// One test at a time: [`ALL_ALLOCS`] counts every thread's.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn building_a_request_from_an_array_allocates_nothing() {
    let _one = serial();
    let side = setup(Transport::Iwarp).mr_len(4096).side();
    let mr = &side.mr;
    let before = allocs();
    let w = SendWr::write(1, [mr.sge(0, 64), mr.sge(64, 64)], Key(7), 0);
    let r = RecvWr::new(2, [mr.sge(0, 4096)]);
    let s = SendWr::send(3, Some(mr.sge(0, 8)));
    assert_eq!(allocs() - before, 0);
    assert_eq!(
        (w.sg_list.len(), r.sg_list.len(), s.sg_list.len()),
        (2, 1, 1)
    );
    // Five entries spill to the heap, and still keep them all.
    let many = SendWr::send(4, (0..5).map(|i| mr.sge(i * 8, 8)));
    assert_eq!(many.sg_list.len(), 5);
}

/// A server and a client QP connected over loopback on `t` (RoCE: `gso` as given), CQs of
/// `cq` entries, regions of `mr` octets.
fn connected(t: Transport, gso: bool, cq: usize, mr: usize) -> Pair {
    setup(t)
        .roce(move |c| c.gso = gso)
        .cqe(cq)
        .mr_len(mr)
        .pair()
}

/// The pair's (server QP, client QP, server region, client region, server CQ, client CQ).
fn parts(p: &Pair) -> (&Qp, &Qp, &Mr, &Mr, &Cq, &Cq) {
    let (s, c) = (&p.server, &p.client);
    (s.qp(), c.qp(), &s.mr, &c.mr, &s.cq, &c.cq)
}

/// Posting RDMA Writes, Sends (with their octets in memory and `INLINE`) and receives and
/// polling their completions, once the queues have grown to their working size: no
/// allocation on the posting thread, either transport (an inline request's octets go into
/// a buffer of the QP's, given back when it completes).
#[test]
fn steady_state_posting_allocates_nothing() {
    let _one = serial();
    for t in [Transport::Iwarp, Transport::Roce] {
        let pair = connected(t, true, 256, 1 << 16);
        let (sqp, cqp, smr, cmr, scq, ccq) = parts(&pair);
        let mut wcs = Vec::with_capacity(64);
        // Allocations while building and posting requests (the waits run the transport on
        // this thread too: what arrives is not the post's cost).
        let in_posts = Cell::new(0);
        let mut round = |n: u64| {
            for i in 0..n {
                let a = allocs();
                sqp.post_recv(RecvWr::new(i, [smr.sge(0, 64)])).unwrap();
                sqp.post_recv(RecvWr::new(i, [smr.sge(64, 200)])).unwrap();
                let wr = SendWr::write(i, [cmr.sge(0, 4096)], smr.rkey(), smr.addr(4096));
                cqp.post_send(wr).unwrap();
                cqp.post_send(SendWr::send(i, [cmr.sge(0, 64)])).unwrap();
                let mut inline = SendWr::send(i, [cmr.sge(64, 100), cmr.sge(300, 100)]);
                inline.flags |= SendFlags::INLINE;
                cqp.post_send(inline).unwrap();
                in_posts.set(in_posts.get() + allocs() - a);
            }
            for (cq, want) in [(&ccq, 3 * n as usize), (&scq, 2 * n as usize)] {
                wait_successes(cq, want, &mut wcs);
            }
        };
        // Warm-up: queues, buffers and the first connection's state grow to size.
        for _ in 0..20 {
            round(16);
        }
        in_posts.set(0);
        for _ in 0..200 {
            round(16);
        }
        // Queues may still grow now and then (amortised, to the depth the peer's pace
        // needs); a per-post allocation would be one or more per post.
        let posts = 200 * 16 * 5;
        assert!(
            in_posts.get() * 100 < posts,
            "{t:?}: {} allocations in {posts} posts",
            in_posts.get()
        );
    }
}

/// Takes `want` completions from `cq`, each a success, through `wcs` (its capacity: at most
/// that many a wait, no allocation).
fn wait_successes(cq: &Cq, want: usize, wcs: &mut Vec<WorkCompletion>) {
    let mut got = 0;
    while got < want {
        wcs.clear();
        got += cq.wait(1, wcs.capacity(), T, wcs).unwrap();
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    }
}

/// A RoCE Send/Receive ping-pong in its steady state allocates nothing per message on any
/// thread — the receive thread's socket reads and timer passes included (they collected
/// their I/O vectors and QP lists into fresh vectors each time: issue 43, measured through
/// the C ABI as 15 allocations per `ib_send_lat` round), with GRO and without (a GRO
/// receive made its headers anew each time: nix's cannot give the kernel back its room for
/// the segment size).
#[test]
fn a_roce_ping_pong_allocates_nothing_per_message_on_any_thread() {
    let _one = serial();
    for gso in [false, true] {
        roce_ping_pong(gso);
    }
}

fn roce_ping_pong(gso: bool) {
    use std::sync::atomic::Ordering;
    let pair = connected(Transport::Roce, gso, 64, 4096);
    let (sqp, cqp, smr, cmr, scq, ccq) = parts(&pair);
    let mut wcs = Vec::with_capacity(8);
    let mut wait = |cq: &Cq, want: usize| wait_successes(cq, want, &mut wcs);
    // One round: the client sends 64 octets, the server answers with 64.
    let mut rounds = |n: u64| {
        for i in 0..n {
            sqp.post_recv(RecvWr::new(i, [smr.sge(0, 64)])).unwrap();
            cqp.post_recv(RecvWr::new(i, [cmr.sge(64, 64)])).unwrap();
            cqp.post_send(SendWr::send(i, [cmr.sge(0, 64)])).unwrap();
            wait(scq, 1);
            sqp.post_send(SendWr::send(i, [smr.sge(64, 64)])).unwrap();
            wait(scq, 1);
            wait(ccq, 2);
        }
    };
    rounds(200);
    let before = ALL_ALLOCS.load(Ordering::Relaxed);
    rounds(1000);
    let n = ALL_ALLOCS.load(Ordering::Relaxed) - before;
    // Four messages and their acknowledgements a round; anything per message would be
    // thousands. Queues growing now and then stay far below.
    assert!(n < 100, "GRO {gso}: {n} allocations in 1000 rounds");
}
