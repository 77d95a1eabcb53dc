//! A server answering a stream of large calls allocates no large block per call: the TCP
//! records it assembles, the Read chunks it pulls, the calls it rebuilds from them and the TCP
//! reply records it writes come from its kept buffers and go back there. Freed and refaulted a
//! megabyte at a time, they cost a page fault per 4 KiB and keep a long-running server's RSS
//! moving with whatever its allocator holds on to (issue 41).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use softrdma::Listener;
use softrdma_rpc::rdma::{RdmaConfig, RdmaTransport};
use softrdma_rpc::tcp::TcpTransport;
use softrdma_rpc::*;

mod common;

use common::{T, both, contexts};
use softrdma_testkit::pattern;

/// What counts as a large block: a quarter of the calls' megabyte.
const LARGE: usize = 256 << 10;

/// Large calls in the measured stretch (half of them 1 MiB arguments, half 1 MiB results),
/// and the large blocks allowed in it: not one per call, but a few once-only ones (a worker
/// thread's first send scratch; the pool growing by one when a call arrives before the
/// previous reply's buffer came back, which depends on timing).
const PAIRS: usize = 24;
const ALLOWED: usize = 4;

/// Large blocks allocated by threads other than the test's own (the server's, and the
/// clients' helpers, which receive only small replies here).
static LARGE_ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The test's thread, whose arguments are allocated per call by design.
    static CLIENT: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if size >= LARGE && !CLIENT.try_with(Cell::get).unwrap_or(false) {
        LARGE_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

struct Counting;

// SAFETY: System's contract, passed on; counting touches no allocated memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            count(new_size);
        }
        // SAFETY: `ptr` came from System with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const PROG: u32 = 0x2000_0041;
const SUM: u32 = 1;
const FETCH: u32 = 2;
const MIB: usize = 1 << 20;

/// SUM: a position-weighted sum of the arguments (they arrived whole); FETCH: `n` octets
/// of a pattern, built in the server's kept memory as a real service would.
fn program() -> impl Program {
    move |ctx: &CallContext<'_>, args: &[u8]| -> Result<Payload, ProcError> {
        let word = |at: usize| -> Result<usize, ProcError> {
            let b = args.get(at..at + 4).ok_or(ProcError::GarbageArgs)?;
            Ok(u32::from_be_bytes(b.try_into().unwrap()) as usize)
        };
        match ctx.header.proc {
            SUM => {
                let n = word(0)?;
                let data = args.get(4..4 + n).ok_or(ProcError::GarbageArgs)?;
                Ok(Payload::from(sum(data).to_be_bytes().to_vec()))
            }
            FETCH => {
                let n = word(0)?.min(MIB) & !3;
                let mut xdr = ctx.buffer(4 + n);
                xdr.extend_from_slice(&(n as u32).to_be_bytes());
                xdr.extend((0..n).map(|i| (i as u8).wrapping_mul(7)));
                Ok(Payload {
                    xdr,
                    ddp: std::iter::once(4..4 + n).collect(),
                    shared: None,
                })
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

fn sum(d: &[u8]) -> u64 {
    d.iter().enumerate().fold(0u64, |a, (i, &b)| {
        a.wrapping_add((i as u64 + 1) * u64::from(b))
    })
}

/// Runs `calls` SUMs of 1 MiB and FETCHes of 1 MiB on `c`, checking each reply.
fn large_calls(c: &Client, calls: usize, data: &[u8]) {
    let want = sum(data);
    let args = Payload::with_opaque(Vec::new(), data);
    for i in 0..calls {
        let got = c
            .call_with(PROG, 1, SUM, &args, ReplySpace::default())
            .unwrap();
        assert_eq!(got.results, want.to_be_bytes(), "SUM {i}");
        let space = ReplySpace {
            max: 256,
            ddp: Some(MIB),
        };
        let got = c
            .call_with(
                PROG,
                1,
                FETCH,
                &Payload::from((MIB as u32).to_be_bytes().to_vec()),
                space,
            )
            .unwrap();
        let results = got.unreduced().unwrap();
        assert_eq!(&results[..4], &(MIB as u32).to_be_bytes(), "FETCH {i}");
        assert_eq!(results.len(), 4 + MIB);
        assert!(
            results[4..]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i as u8).wrapping_mul(7))
        );
    }
}

/// Large blocks the other threads allocate while `f` runs, after a warm-up of the same.
fn steady_state_large_allocs(warm: impl Fn(), f: impl Fn()) -> usize {
    CLIENT.with(|c| c.set(true));
    warm();
    let before = LARGE_ALLOCS.load(Ordering::Relaxed);
    f();
    LARGE_ALLOCS.load(Ordering::Relaxed) - before
}

/// One test at a time: the count is the process's.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn server() -> Arc<Server> {
    let mut reg = Registry::new();
    reg.register(PROG, 1, program());
    // SUM's opaque is DDP-eligible: over RDMA it moves in a Read chunk.
    reg.bind_arguments(PROG, 1, |p, _| (p == SUM).then_some(4));
    Arc::new(Server::new(
        reg,
        ServerConfig {
            max_record: MIB + 4096,
            ..ServerConfig::default()
        },
    ))
}

#[test]
fn large_calls_over_tcp_allocate_nothing_large_per_call() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let server = server();
    let tcp = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let stream = std::net::TcpStream::connect(tcp.local_addr()).unwrap();
    let c = Client::new(
        Arc::new(TcpTransport::from_stream(stream, 2 * MIB + 4096).unwrap()),
        4,
    );
    c.bind_results(PROG, 1, |p, _| (p == FETCH).then_some(4));
    let data = pattern(MIB, 3);
    let n = steady_state_large_allocs(
        || large_calls(&c, 8, &data),
        || large_calls(&c, PAIRS, &data),
    );
    assert!(
        n <= ALLOWED,
        "{n} large blocks in {} large calls over TCP",
        2 * PAIRS
    );
}

#[test]
fn large_calls_over_rdma_allocate_nothing_large_per_call() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    both(|t: T| {
        let server = server();
        let (sctx, cctx) = contexts(t);
        let cfg = RdmaConfig {
            max_message: MIB + 4096,
            ..RdmaConfig::default()
        };
        let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
        let rdma = server.serve_rdma(&sctx, l, cfg).unwrap();
        let tr = Arc::new(RdmaTransport::connect(&cctx, rdma.local_addr(), cfg).unwrap());
        let c = Client::new(tr.clone(), 4);
        c.bind_results(PROG, 1, |p, _| (p == FETCH).then_some(4));
        let data = pattern(MIB, 5);
        let n = steady_state_large_allocs(
            || large_calls(&c, 8, &data),
            || large_calls(&c, PAIRS, &data),
        );
        let s = tr.stats();
        assert!(
            s.calls_chunked >= PAIRS as u64,
            "{t:?}: the arguments moved in Read chunks"
        );
        assert!(
            n <= ALLOWED,
            "{t:?}: {n} large blocks in {} large calls over RDMA",
            2 * PAIRS
        );
    });
}
