//! The RoCE driver's transmit side: a QP's datagrams built into a per-thread batch and
//! written with `sendmmsg` (UDP GSO where the kernel has it), each in the IPv4
//! Identification its ICRC assumes.

use std::cell::RefCell;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6, SockaddrLike, sendmmsg};
use parking_lot::MutexGuard;
use smallvec::SmallVec;
use softrdma_ib::{SocketKind, Transmit};
use softrdma_wire::icrc::Ipv4IdSyndromes;

use crate::cq::Pushed;
use crate::tap::{Direction, Tapped};

use super::*;

/// The sender's role of a QP: datagrams of one transmit batch, back to back, and where
/// each lies and goes.
#[derive(Default)]
struct TxBuf {
    dgram: Vec<u8>,
    batch: Vec<Transmit>,
}

thread_local! {
    /// The datagrams a thread builds and sends for a QP ([`RoceShared::transmit`]): one per
    /// sending thread, not one per QP (a batch is 270 KB; a thousand idle QPs held one each).
    static TX_SCRATCH: std::cell::RefCell<TxBuf> = std::cell::RefCell::new(TxBuf {
        dgram: Vec::with_capacity(SEND_BATCH * MAX_DATAGRAM),
        batch: Vec::with_capacity(SEND_BATCH),
    });
}

/// `f` with this thread's [`TX_SCRATCH`]; a fresh buffer while it is in use further up the
/// stack (a send for another QP).
fn with_tx_scratch<R>(f: impl FnOnce(&mut TxBuf) -> R) -> R {
    TX_SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut tx) => f(&mut tx),
        Err(_) => f(&mut TxBuf::default()),
    })
}

/// Moves the QP's completions, if it has any, to its CQs. A queue that overran puts the QP
/// in Error (IBA 11.4.2.1): its outstanding requests are flushed, into the other queue if
/// that one is healthy.
pub(super) fn deliver(q: &RoceQpShared, e: &mut Engine) {
    let Engine { qp, wcs, .. } = e;
    if !qp.has_completion() {
        return;
    }
    if hand_out(q, qp, wcs) && !matches!(qp.state(), IbQpState::Error | IbQpState::Reset) {
        let _ = qp.modify(&QpAttr::state(IbQpState::Error));
        let _ = hand_out(q, qp, wcs);
    }
}

/// The QP's completions into its CQs; `true` when one of them is overrun.
fn hand_out(q: &RoceQpShared, qp: &mut IbQp, wcs: &mut Vec<WorkCompletion>) -> bool {
    while let Some(wc) = qp.poll_send_completion() {
        wcs.push(wc);
    }
    let a = q.send_cq.push(q.qpn, wcs);
    while let Some(wc) = qp.poll_recv_completion() {
        wcs.push(wc);
    }
    let b = q.recv_cq.push(q.qpn, wcs);
    a == Pushed::Overrun || b == Pushed::Overrun
}

impl RoceShared {
    /// Moves the QP's completions to the CQs (a waiter on another thread starts on them
    /// while the datagrams go out), then sends what the QP has to send — or, when another
    /// thread is sending this QP's datagrams right now, leaves them to it.
    pub(super) fn flush(
        &self,
        q: &RoceQpShared,
        e: &mut EngineGuard<'_>,
        now: Instant,
        hold: Hold,
    ) {
        self.flush_some(q, e, now, hold, usize::MAX);
    }

    /// [`flush`](Self::flush) that sends before it returns, waiting for the QP's sender if
    /// there is one: what must be out before the engine changes state (a held ACK before
    /// Error drops it).
    pub(super) fn flush_now(&self, q: &RoceQpShared, e: &mut EngineGuard<'_>, now: Instant) {
        deliver(q, e);
        let _sender = MutexGuard::unlocked(e, || q.tx.lock());
        with_tx_scratch(|tx| self.transmit(q, e, tx, now, Hold::Nothing, usize::MAX));
    }

    /// [`flush`](Self::flush) of at most `batches` batches of datagrams; `true` when the QP
    /// has more to send.
    pub(super) fn flush_some(
        &self,
        q: &RoceQpShared,
        e: &mut EngineGuard<'_>,
        now: Instant,
        hold: Hold,
        batches: usize,
    ) -> bool {
        deliver(q, e);
        match q.tx.try_lock() {
            Some(_sender) => with_tx_scratch(|tx| self.transmit(q, e, tx, now, hold, batches)),
            None => {
                // The sender is in a system call, the engine let go: it looks again when
                // it comes back, under this lock.
                let flag = match hold {
                    Hold::Nothing => TX_PENDING_ALL,
                    Hold::Ack => TX_PENDING,
                };
                q.tx_pending.fetch_max(flag, Ordering::Relaxed);
                self.counters.tx_handed_over.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The sender's part of a flush (the caller holds `q.tx`; `tx` is scratch): batches of
    /// datagrams built under the engine lock and sent without it, until the engine has
    /// nothing more (or `batches` are out: then `true`).
    fn transmit(
        &self,
        q: &RoceQpShared,
        e: &mut EngineGuard<'_>,
        tx: &mut TxBuf,
        now: Instant,
        mut hold: Hold,
        batches: usize,
    ) -> bool {
        let mut more = false;
        let mut n = 0;
        loop {
            if q.tx_pending.swap(0, Ordering::Relaxed) == TX_PENDING_ALL {
                hold = Hold::Nothing;
            }
            tx.dgram.clear();
            tx.batch.clear();
            {
                // Not held across the system call: it would keep writers waiting.
                let ep = self.endpoint.read();
                while tx.batch.len() < SEND_BATCH {
                    let Some(t) =
                        ep.poll_transmit_holding(&mut e.qp, now, &mut tx.dgram, hold == Hold::Ack)
                    else {
                        break;
                    };
                    tx.batch.push(t);
                }
            }
            if tx.batch.is_empty() {
                break;
            }
            MutexGuard::unlocked(e, || self.send_batch(&mut tx.dgram, &tx.batch));
            // UD and UC sends complete as they leave.
            deliver(q, e);
            n += 1;
            let full = tx.batch.len() == SEND_BATCH;
            if full && n >= batches {
                more = true;
                break;
            }
            // A flush left its datagrams to this one while the engine was let go.
            if !full && q.tx_pending.load(Ordering::Relaxed) == 0 {
                break;
            }
        }
        let held = hold == Hold::Ack && e.qp.ack_held();
        if held != q.ack_held.load(Ordering::Relaxed) {
            q.ack_held.store(held, Ordering::Release);
            if held {
                self.acks_held.store(true, Ordering::Release);
            }
        }
        more
    }

    /// Leaves `q`'s transmission to the caller holding the slot, and wakes it; sends at once
    /// if that caller has let the slot go meanwhile.
    pub(super) fn defer(&self, q: &Arc<RoceQpShared>) {
        if !q.tx_queued.swap(true, Ordering::AcqRel) {
            self.tx_ready.lock().push(q.clone());
            self.tx_ready_any.store(true, Ordering::Relaxed);
        }
        self.counters.tx_deferred.fetch_add(1, Ordering::Relaxed);
        self.wake_pipe.signal();
        // Either the holder, letting go, finds `q` on the list (`block` looks after
        // `drive`), or this thread sees that it let go (the fence pairs with `block`'s).
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.leader.caller_holds() {
            self.send_ready(Instant::now());
        }
    }

    /// Sends for the QPs [`defer`](Self::defer) left to this thread.
    pub(super) fn send_ready(&self, now: Instant) {
        if !self.tx_ready_any.load(Ordering::Relaxed) {
            return;
        }
        let ready = {
            let mut r = self.tx_ready.lock();
            self.tx_ready_any.store(false, Ordering::Relaxed);
            std::mem::take(&mut *r)
        };
        for q in ready {
            q.tx_queued.store(false, Ordering::Release);
            let mut e = q.engine.lock();
            self.flush(&q, &mut e, now, Hold::Nothing);
        }
    }

    /// Sends the ACKs callers held back ([`Hold::Ack`]).
    pub(super) fn release_acks(&self, now: Instant) {
        if !self.acks_held.load(Ordering::Acquire) || !self.acks_held.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let held: SmallVec<[Arc<RoceQpShared>; 4]> = self
            .qps
            .read()
            .values()
            .filter(|q| q.ack_held.load(Ordering::Acquire))
            .cloned()
            .collect();
        for q in held {
            let mut e = q.engine.lock();
            self.flush(&q, &mut e, now, Hold::Nothing);
        }
    }

    /// Sends the datagrams `batch` describes in `buf` with as few `sendmmsg` calls as the
    /// socket changes allow, each through the socket its [`Transmit::kind`] names. A datagram
    /// the kernel refuses (a full buffer) is counted and left to the transport's
    /// retransmission.
    pub(super) fn send_batch(&self, buf: &mut [u8], batch: &[Transmit]) {
        let mut rest = batch;
        while let Some(first) = rest.first() {
            let kind = first.kind;
            let n = rest.iter().take_while(|t| t.kind == kind).count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let fd = match (kind, &self.raw) {
                (SocketKind::RawIpv4, Some(r)) => r.as_raw_fd(),
                _ => self.socket.as_raw_fd(),
            };
            if kind == SocketKind::Udp && self.gso {
                self.send_segmented(fd, buf, group);
                continue;
            }
            self.send_each(fd, buf, group);
        }
    }

    /// Sends `group` (one socket's datagrams, back to back in `buf`): runs of equal-size
    /// datagrams to one peer (the last may be shorter) as GSO super-datagrams, the rest with
    /// `sendmmsg`.
    fn send_segmented(&self, fd: std::os::fd::RawFd, buf: &mut [u8], group: &[Transmit]) {
        let mut i = 0;
        let mut singles = 0;
        while i < group.len() {
            let first = &group[i];
            let seg = first.range().len();
            let (mut j, mut end) = (i + 1, first.end);
            while j < group.len() && j - i < GSO_SEGMENTS {
                let t = &group[j];
                let l = t.range().len();
                if t.start != end
                    || t.socket_addr() != first.socket_addr()
                    || l > seg
                    || end + l - first.start > GSO_OCTETS
                {
                    break;
                }
                end = t.end;
                j += 1;
                if l < seg {
                    break;
                }
            }
            if j - i < 2 || seg > usize::from(u16::MAX) {
                singles += 1;
                i += 1;
                continue;
            }
            // What came before goes first, in order.
            if singles > 0 {
                self.send_each(fd, buf, &group[i - singles..i]);
                singles = 0;
            }
            // Segment k leaves with Identification k, which the ICRC covers: computed for 0,
            // it changes by that ID's syndrome (exact for peers that check the whole ICRC).
            if self.ipv4_id_known && first.socket_addr().is_ipv4() {
                for (k, t) in group[i..j].iter().enumerate().skip(1) {
                    let d = buf.get_mut(t.range()).unwrap_or(&mut []);
                    id_syndromes(d.len().saturating_sub(softrdma_wire::rocev2::ICRC_LEN))
                        .set(d, k as u16);
                }
            }
            let data = buf.get(first.start..end).unwrap_or(&[]);
            let sent = match self.local {
                SocketAddr::V4(_) => {
                    send_gso::<SockaddrIn>(fd, data, seg as u16, first.socket_addr())
                }
                SocketAddr::V6(_) => {
                    send_gso::<SockaddrIn6>(fd, data, seg as u16, first.socket_addr())
                }
            };
            match sent {
                Ok(_) => {
                    self.tap_sent(buf, &group[i..j]);
                    self.counters.gso_sends.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .tx_packets
                        .fetch_add((j - i) as u64, Ordering::Relaxed)
                }
                // Refused (a full buffer): lost, the transport recovers.
                Err(_) => self
                    .counters
                    .tx_refused
                    .fetch_add((j - i) as u64, Ordering::Relaxed),
            };
            i = j;
        }
        if singles > 0 {
            self.send_each(fd, buf, &group[group.len() - singles..]);
        }
    }

    /// Tells the tap, if any, that the datagrams `sent` describes in `buf` left.
    fn tap_sent(&self, buf: &[u8], sent: &[Transmit]) {
        let Some(tap) = self.tap.get() else { return };
        for t in sent {
            let d = buf.get(t.range()).unwrap_or(&[]);
            tap.tapped(match t.kind {
                SocketKind::RawIpv4 => Tapped::Ipv4 { packet: d },
                SocketKind::Udp => Tapped::Udp {
                    local: self.local,
                    peer: t.dest,
                    dir: Direction::Sent,
                    payload: d,
                },
            });
        }
    }

    /// Sends each datagram of `group` on its own, with as few `sendmmsg` calls as it takes.
    fn send_each(&self, fd: std::os::fd::RawFd, buf: &[u8], group: &[Transmit]) {
        // Filled in place: a collected array this size would be copied on return.
        let mut slices: SmallVec<[[IoSlice<'_>; 1]; SEND_BATCH]> = SmallVec::new();
        slices.extend(
            group
                .iter()
                .map(|t| [IoSlice::new(buf.get(t.range()).unwrap_or(&[]))]),
        );
        let mut done = 0;
        while done < group.len() {
            let sent = match self.local {
                SocketAddr::V4(_) => send_group::<SockaddrIn>(fd, &slices[done..], &group[done..]),
                SocketAddr::V6(_) => send_group::<SockaddrIn6>(fd, &slices[done..], &group[done..]),
            };
            match sent {
                Ok(k) if k > 0 => {
                    self.tap_sent(buf, group.get(done..done + k).unwrap_or(&[]));
                    self.counters
                        .tx_packets
                        .fetch_add(k as u64, Ordering::Relaxed);
                    done += k;
                }
                _ => {
                    // The first unsent datagram failed: count it and go on with the rest.
                    self.counters.tx_refused.fetch_add(1, Ordering::Relaxed);
                    done += 1;
                }
            }
        }
    }
}

/// A socket address of one family, as `sendmmsg` takes it.
trait FamilyAddr: SockaddrLike + Copy + Sized {
    fn of(a: SocketAddr) -> Self;
    /// This thread's `sendmmsg` headers for this family, for at least `n` messages.
    fn with_headers<R>(n: usize, f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R;
    /// This thread's header for one message with a `UDP_SEGMENT` control message.
    fn with_gso_header<R>(f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R;
}

impl FamilyAddr for SockaddrIn {
    fn with_headers<R>(n: usize, f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&HDRS_V4, n, false, f)
    }

    fn with_gso_header<R>(f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&GSO_HDR_V4, 1, true, f)
    }

    fn of(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V4(v4) => v4.into(),
            // An IPv4-mapped address on an IPv4 socket; anything else cannot be sent there
            // (the unspecified address makes the kernel refuse it, and it is counted).
            SocketAddr::V6(v6) => {
                let ip = v6
                    .ip()
                    .to_ipv4_mapped()
                    .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
                std::net::SocketAddrV4::new(ip, v6.port()).into()
            }
        }
    }
}

impl FamilyAddr for SockaddrIn6 {
    fn with_headers<R>(n: usize, f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&HDRS_V6, n, false, f)
    }

    fn with_gso_header<R>(f: impl FnOnce(&mut MultiHeaders<Self>) -> R) -> R {
        with_cached_headers(&GSO_HDR_V6, 1, true, f)
    }

    fn of(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V6(v6) => v6.into(),
            SocketAddr::V4(v4) => {
                std::net::SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0).into()
            }
        }
    }
}

/// One `sendmsg` of a GSO super-datagram: `data`, cut by the kernel into `seg`-octet
/// datagrams to `to` (`UDP_SEGMENT`).
fn send_gso<S: FamilyAddr>(
    fd: std::os::fd::RawFd,
    data: &[u8],
    seg: u16,
    to: SocketAddr,
) -> nix::Result<usize> {
    // Through `sendmmsg` and a kept header: `sendmsg` with a control message allocates
    // its buffer on every call.
    let iov = [[IoSlice::new(data)]];
    let cmsg = [nix::sys::socket::ControlMessage::UdpGsoSegments(&seg)];
    let to = [Some(S::of(to))];
    S::with_gso_header(|hdr| {
        let mut sent = sendmmsg(fd, hdr, iov.iter(), to, cmsg, MsgFlags::empty())?;
        Ok(sent.next().map_or(0, |r| r.bytes))
    })
}

/// One `sendmmsg` of datagrams to addresses of the socket's family; returns how many left.
/// The address type is the family's own, not `SockaddrStorage`: counting the results then
/// reads nothing uninitialised (nix parses a storage's family to size it).
fn send_group<S: FamilyAddr>(
    fd: std::os::fd::RawFd,
    slices: &[[IoSlice<'_>; 1]],
    group: &[Transmit],
) -> nix::Result<usize> {
    let mut addrs: SmallVec<[Option<S>; SEND_BATCH]> = SmallVec::new();
    addrs.extend(group.iter().map(|t| Some(S::of(t.socket_addr()))));
    S::with_headers(slices.len(), |hdrs| {
        sendmmsg(fd, hdrs, slices.iter(), &addrs, [], MsgFlags::empty()).map(|r| r.count())
    })
}

/// Cached `sendmmsg` headers and how many messages they hold.
type HdrCache<S> = RefCell<Option<(MultiHeaders<S>, usize)>>;

thread_local! {
    /// `sendmmsg` headers of this thread, kept between calls (a send allocates nothing).
    static HDRS_V4: HdrCache<SockaddrIn> = const { RefCell::new(None) };
    static HDRS_V6: HdrCache<SockaddrIn6> = const { RefCell::new(None) };
    /// One message with room for a `UDP_SEGMENT` control message each.
    static GSO_HDR_V4: HdrCache<SockaddrIn> = const { RefCell::new(None) };
    static GSO_HDR_V6: HdrCache<SockaddrIn6> = const { RefCell::new(None) };
}

/// This thread's headers for at least `n` messages (at least a batch), each with room for
/// a `UDP_SEGMENT` control message if `gso`, to `f`.
fn with_cached_headers<S: SockaddrLike + Copy, R>(
    cache: &'static std::thread::LocalKey<HdrCache<S>>,
    n: usize,
    gso: bool,
    f: impl FnOnce(&mut MultiHeaders<S>) -> R,
) -> R {
    let make = |cap| MultiHeaders::<S>::preallocate(cap, gso.then(|| nix::cmsg_space!(u16)));
    cache.with(|c| match c.try_borrow_mut() {
        Ok(mut slot) => {
            let (hdrs, cap) = match slot.take() {
                Some((h, cap)) if cap >= n => (h, cap),
                _ => {
                    let cap = n.max(SEND_BATCH);
                    (make(cap), cap)
                }
            };
            let mut hdrs = hdrs;
            let r = f(&mut hdrs);
            *slot = Some((hdrs, cap));
            r
        }
        // Re-entered (cannot happen: `f` only sends): headers of its own.
        Err(_) => f(&mut make(n)),
    })
}

/// Segment lengths whose Identification syndromes a thread keeps: a Write stream's runs
/// have a few (the first packet's with its RETH, the middle ones', a shorter last one).
const ID_SYNDROME_LENGTHS: usize = 4;

thread_local! {
    /// The Identification syndromes of this thread's latest GSO segment lengths, the most
    /// recent first.
    static ID_SYNDROMES: RefCell<[Option<Ipv4IdSyndromes>; ID_SYNDROME_LENGTHS]> =
        const { RefCell::new([None; ID_SYNDROME_LENGTHS]) };
}

/// The Identification syndromes of segments of `payload_len` octets, from the thread's
/// few latest lengths when there (computing them costs O(log n) products).
fn id_syndromes(payload_len: usize) -> Ipv4IdSyndromes {
    ID_SYNDROMES.with_borrow_mut(|kept| {
        let at = kept
            .iter()
            .position(|s| s.is_some_and(|s| s.payload_len() == payload_len));
        let s = at
            .and_then(|i| kept[i].take())
            .unwrap_or_else(|| Ipv4IdSyndromes::new(payload_len));
        // Most recent first: the one found (or made) moves to the front.
        let end = at.unwrap_or(ID_SYNDROME_LENGTHS - 1);
        kept[..=end].rotate_right(1);
        kept[0] = Some(s);
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_syndromes_are_those_of_the_length_asked() {
        // More lengths than are kept, revisited in several orders.
        let lens = [4124, 4108, 1000, 4124, 12, 4108, 4124, 33, 77, 4124, 1000];
        for _ in 0..3 {
            for &len in &lens {
                let s = id_syndromes(len);
                assert_eq!(s, Ipv4IdSyndromes::new(len), "len {len}");
            }
        }
    }
}
