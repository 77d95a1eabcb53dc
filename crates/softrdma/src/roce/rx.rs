//! The RoCE driver's receive side and its turns: datagrams drained from the socket
//! (GRO batches where the kernel has them) into the endpoint and the QPs' engines, the
//! background thread's loop, polling turns and the retransmission timers.

use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use smallvec::SmallVec;
use softrdma_ib::Incoming;
use softrdma_wire::icrc::IcrcVerifier;

use crate::cq::{CqShared, Driven};
use crate::leader::{Leader, Turn};
use crate::tap::{Direction, Tapped};

use super::*;

/// Receive buffers of one thread (the receive thread's own, or a polling caller's).
struct RxBufs {
    bufs: Vec<Vec<u8>>,
    hdrs: mmsg::RecvHeaders,
    /// Per receive: octets, sender, and the GRO segment size (0: one datagram).
    got: Vec<mmsg::Got>,
    touched: Vec<Arc<RoceQpShared>>,
    verifier: IcrcVerifier,
    /// Buffers large enough for GRO runs, with room for the segment size.
    gro: bool,
}

impl RxBufs {
    fn new(gro: bool) -> RxBufs {
        let (n, len) = if gro {
            (GRO_BATCH, GRO_BUFFER)
        } else {
            (RECV_BATCH, MAX_DATAGRAM)
        };
        RxBufs {
            bufs: (0..n).map(|_| vec![0u8; len]).collect(),
            hdrs: mmsg::RecvHeaders::new(n, gro),
            got: Vec::with_capacity(n),
            touched: Vec::new(),
            verifier: IcrcVerifier::default(),
            gro,
        }
    }
}

thread_local! {
    /// Receive buffers of each thread that drives a RoCE context (its receive thread, a CQ
    /// waiter or poller).
    static CALLER_RX: std::cell::RefCell<Option<RxBufs>> = const { std::cell::RefCell::new(None) };
}

impl RoceShared {
    /// This thread's receive buffers, made (again) for this context's GRO setting: a thread
    /// may drive contexts of both kinds, and a GRO run must never meet a small buffer (it
    /// would be cut short).
    fn rx_bufs<'a>(&self, c: &'a mut Option<RxBufs>) -> &'a mut RxBufs {
        if c.as_ref().is_some_and(|r| self.gro && !r.gro) {
            *c = None;
        }
        c.get_or_insert_with(|| RxBufs::new(self.gro))
    }

    /// Reads what is queued on the socket (without blocking), up to a few batches, and
    /// processes it. The caller holds `rx_lock`: datagrams are handled in arrival order.
    fn drain_socket(&self, rx: &mut RxBufs, hold: Hold) -> usize {
        let fd = self.socket.as_raw_fd();
        let mut total = 0;
        // QPs with more to send than one turn's budget (a large READ's responses): the
        // socket is read between their budgets, so what the peer sends meanwhile (a READ
        // re-issued after a loss, which replaces the queued responses) is not left waiting
        // behind the whole burst.
        let mut backlog: SmallVec<[Arc<RoceQpShared>; 4]> = SmallVec::new();
        let mut rounds = 0;
        while rounds < 4 || !backlog.is_empty() {
            rounds += 1;
            rx.got.clear();
            // A receive allocates nothing: the headers are the thread's, used again.
            let _ = rx.hdrs.recv(fd, &mut rx.bufs, &mut rx.got);
            if rx.got.is_empty() {
                if !self.send_backlog(&mut backlog, hold) {
                    break;
                }
                continue;
            }
            let runs = rx.got.iter().filter(|g| g.2 != 0).count() as u64;
            if runs > 0 {
                self.counters
                    .gro_receives
                    .fetch_add(runs, Ordering::Relaxed);
            }
            let now = Instant::now();
            // The endpoint checks and routes the whole batch under one read lock; the QPs'
            // engines are locked only after it is released (lock order: engine, endpoint).
            // Each accepted datagram is kept with the index of its QP in `touched`.
            let mut routed: SmallVec<[(usize, Incoming<'_>); ROUTED_INLINE]> = SmallVec::new();
            let mut mads: Vec<(IpAddr, Incoming<'_>)> = Vec::new();
            {
                let ep = self.endpoint.read();
                let qps = self.qps.read();
                // A GRO receive is a run of datagrams of `seg` octets (the last may be
                // shorter): each is handled as if it came alone.
                let datagrams = rx
                    .bufs
                    .iter()
                    .zip(&rx.got)
                    .flat_map(|(buf, &(n, peer, seg))| {
                        let all = buf.get(..n).unwrap_or(&[]);
                        let step = if seg == 0 { n.max(1) } else { seg };
                        all.chunks(step).map(move |d| (peer, d))
                    });
                let tap = self.tap.get();
                for (peer, dgram) in datagrams {
                    let Some(peer) = peer else {
                        continue;
                    };
                    if let Some(t) = tap {
                        t.tapped(Tapped::Udp {
                            local: self.local,
                            peer,
                            dir: Direction::Received,
                            payload: dgram,
                        });
                    }
                    // A drop is counted by the endpoint.
                    let Ok(inc) = ep.handle(peer, dgram, &mut rx.verifier) else {
                        continue;
                    };
                    if inc.qpn == softrdma_ib::cm::GSI_QPN {
                        mads.push((peer.ip(), inc));
                        continue;
                    }
                    // Registered with the endpoint, so in `qps` (both change under its write
                    // lock).
                    let Some(q) = qps.get(&inc.qpn) else { continue };
                    let i = match rx.touched.iter().position(|t| Arc::ptr_eq(t, q)) {
                        Some(i) => i,
                        None => {
                            q.send_cq.arrived();
                            if !Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
                                q.recv_cq.arrived();
                            }
                            rx.touched.push(q.clone());
                            rx.touched.len() - 1
                        }
                    };
                    routed.push((i, inc));
                }
            }
            for (i, inc) in &routed {
                if let Some(q) = rx.touched.get(*i) {
                    q.engine.lock().qp.handle_packet(&inc.packet, &inc.grh, now);
                    if q.awaiting_rtu.load(Ordering::Relaxed)
                        && q.awaiting_rtu.swap(false, Ordering::AcqRel)
                    {
                        self.comm_established(q.qpn, now);
                    }
                }
            }
            drop(routed);
            if !mads.is_empty() {
                for (peer, inc) in &mads {
                    self.gsi_input(now, *peer, &inc.packet);
                }
                drop(mads);
                self.gsi_pump(now);
            }
            for q in rx.touched.drain(..) {
                if !backlog.iter().any(|b| Arc::ptr_eq(b, &q)) {
                    backlog.push(q);
                }
            }
            total += rx.got.len();
            if !self.send_backlog(&mut backlog, hold) && rx.got.len() < rx.bufs.len() {
                break;
            }
        }
        total
    }

    /// One budget of sending for each QP in `backlog`; those with nothing more to send
    /// leave it. Whether any is left.
    fn send_backlog(&self, backlog: &mut SmallVec<[Arc<RoceQpShared>; 4]>, hold: Hold) -> bool {
        let now = Instant::now();
        backlog.retain(|q| {
            let mut e = q.engine.lock();
            self.flush_some(q, &mut e, now, hold, BACKLOG_BATCHES)
        });
        !backlog.is_empty()
    }
}

impl Driven for RoceShared {
    type Slot = Instant;

    fn leader(&self) -> &Leader<Instant> {
        &self.leader
    }

    fn interrupt(&self) {
        self.wake_pipe.signal();
    }

    fn caller_turn(&self, timers: &mut Instant, until: Option<Instant>) -> Turn {
        self.turn(timers, until, Hold::Ack)
    }

    fn after_block(&self) {
        // What a post left to this thread after its last turn (see `defer`).
        std::sync::atomic::fence(Ordering::SeqCst);
        self.send_ready(Instant::now());
    }

    fn poll_once(&self, _cq: &CqShared) {
        self.release_acks(Instant::now());
        // The receive thread is handling datagrams right now: nothing to add.
        let Some(_g) = self.rx_lock.try_lock() else {
            return;
        };
        CALLER_RX.with(|c| {
            let mut c = c.borrow_mut();
            let rx = self.rx_bufs(&mut c);
            self.drain_socket(rx, Hold::Ack);
        });
    }
}

/// One round of the receive thread ([`Leader::start_background`]): it waits on the socket
/// while no caller does (see [`crate::leader`]), and runs the retransmission timers.
pub(super) fn round(d: &RoceShared) -> bool {
    d.leader.background(
        |timers, until| {
            let until = until.unwrap_or_else(|| Instant::now() + IDLE_WAIT);
            d.turn(timers, Some(until), Hold::Nothing)
        },
        || {
            d.run_timers(Instant::now());
            true
        },
    );
    // Ends only when the driver stops or goes.
    true
}

impl RoceShared {
    /// One turn with the slot: fire due timers, wait on the socket (and the wake pipe) until
    /// the next timer or `until`, read and process what arrived (`hold`: a caller's turn).
    ///
    /// A poll (`until` now, while data flows) walks the QPs' timers only once `timers` is
    /// reached, at most every [`POLL_TIMERS`]: polls come back to back, and the walk locks
    /// every QP.
    fn turn(&self, timers: &mut Instant, until: Option<Instant>, hold: Hold) -> Turn {
        let now = Instant::now();
        let mut wait = if until.is_some_and(|u| u <= now) && now < *timers {
            // What `run_timers` does first, without the walk of every QP.
            self.send_ready(now);
            self.release_acks(now);
            Duration::ZERO
        } else {
            let w = self.run_timers(now);
            *timers = now + w.min(POLL_TIMERS);
            w
        };
        if let Some(u) = until {
            wait = wait.min(u.saturating_duration_since(now));
        }
        // The timers may have completed what this thread waits for.
        if self.leader.take_self_wake() {
            wait = Duration::ZERO;
        }
        if wait.is_zero() {
            // A turn that may not wait reads the socket at once: a poll first would be a
            // system call that says only what `recvmmsg` finds out anyway. A wake-up left in
            // the pipe meanwhile ends the next wait that may block.
            return self.drain_now(hold);
        }
        let ms = wait.as_micros().div_ceil(1000).min(1000) as u16;
        let mut fds = [
            PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.wake_pipe.fd(), PollFlags::POLLIN),
        ];
        let ready = poll(&mut fds, PollTimeout::from(ms)).unwrap_or(0);
        if ready == 0 {
            return Turn::Idle;
        }
        if fds[1].any().unwrap_or(false) {
            self.wake_pipe.clear();
            self.send_ready(Instant::now());
        }
        if fds[0].any().unwrap_or(false) {
            return self.drain_now(hold);
        }
        Turn::Idle
    }

    /// Reads and processes what the socket holds, without waiting.
    fn drain_now(&self, hold: Hold) -> Turn {
        let _g = self.rx_lock.lock();
        let n = CALLER_RX.with(|c| {
            let mut c = c.borrow_mut();
            let rx = self.rx_bufs(&mut c);
            self.drain_socket(rx, hold)
        });
        if n > 0 { Turn::Worked } else { Turn::Idle }
    }
}

impl RoceShared {
    /// Sends held ACKs and fires due timers; returns how long until the next one.
    fn run_timers(&self, now: Instant) -> Duration {
        self.send_ready(now);
        self.release_acks(now);
        let mut next = now + IDLE_WAIT;
        if let Some(t) = self.gsi_timeout() {
            if t <= now {
                self.gsi_pump(now);
            }
            if let Some(t) = self.gsi_timeout() {
                next = next.min(t);
            }
        }
        // On the stack for the usual few QPs: a timer pass allocates nothing.
        let qps: SmallVec<[Arc<RoceQpShared>; 16]> = self.qps.read().values().cloned().collect();
        for q in qps {
            let mut e = q.engine.lock();
            if let Some(t) = e.qp.poll_timeout() {
                if t <= now {
                    e.qp.handle_timeout(now);
                    self.flush(&q, &mut e, now, Hold::Nothing);
                }
                if let Some(t) = e.qp.poll_timeout() {
                    next = next.min(t);
                }
            }
        }
        next.saturating_duration_since(now)
    }
}
