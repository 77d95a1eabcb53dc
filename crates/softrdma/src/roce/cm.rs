//! The connection manager over RoCE: QP1 (the General Services Interface) carries the
//! InfiniBand CM's MADs, run by the sans-IO [`Cm`] of `softrdma_ib`, with librdmacm's
//! conventions on top, so `rdma_cm` peers (rping, perftest -R, udaddy, NFS over RDMA)
//! and softrdma reach each other.
//!
//! - QP1 is a UD QP of the endpoint: it takes UD Sends of 256 octets with Q_Key
//!   [`GSI_QKEY`] and the default P_Key (IBA 13.5.1; anything else is dropped, C9-50),
//!   and sends them from QP1 with rxe's BTH (AckReq set, its own PSN sequence).
//! - librdmacm (`cma.c`), decided by the sans-IO [`rdma_cm`]: the service ID is the port
//!   space (RDMA_PS_TCP for RC and UC, RDMA_PS_UDP for UD through SIDR) and the port; the
//!   REQ's and SIDR_REQ's private data begin with the CMA header (source address and port,
//!   destination address), the application's follow; the flow label of the path is
//!   `(sport * 31 + dport) & 0xFFFFF`; responder resources, initiator depth, retry and RNR
//!   retry counts and PSNs travel in REQ and REP and are applied to the QPs, which the CM
//!   moves INIT → RTR → RTS. This module holds the driver's half: the locks, who waits for
//!   what, the MADs on QP1, the active side; `listen.rs` the passive side.
//! - Addresses: a GID is the IP address; CM MADs and the connection's packets go to the
//!   peer's address at the UDP port this context uses (4791: the RoCEv2 port; tests that
//!   run several contexts on one host give them one port on different addresses).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use event_listener::Event;
use parking_lot::{Condvar, Mutex};
use softrdma_ib::cm::{
    Cm, CmConfig, CmEvent, CmService, CommId, GSI_QKEY, GSI_QPN, ReqInfo, reason, sidr_status,
};
use softrdma_ib::rdma_cm::{self, Agreed, RdmaCmError, Refusal, RequestKind};
use softrdma_ib::{QpAttr, QpState as IbQpState, QpType, pkey_matches};
use softrdma_wire::ib::mad::MAD_LEN;
use softrdma_wire::ib::{BthRepr, DEFAULT_PKEY, DethRepr, Opcode, Operation, PacketRepr, Service};

use super::{RoceQpShared, RoceShared};
use crate::Error;
use crate::backlog::Backlog;
use crate::connparams::{ConnectParams, ConnectionDetail, ConnectionInfo};
use crate::event::AsyncEvent;

mod listen;

pub(crate) use listen::{RoceListener, RoceRequest};
pub use softrdma_ib::rdma_cm::RDMA_UDP_QKEY;

/// The path MTU code of `pmtu` (IBA 9.7.3), or the API's error.
fn mtu_code(pmtu: u32) -> Result<u8, Error> {
    rdma_cm::mtu_code(pmtu).map_err(|e| invalid(e, ""))
}

/// `e` as the API reports it; `too_long` when the private data do not fit.
fn invalid(e: RdmaCmError, too_long: &'static str) -> Error {
    Error::InvalidArgument(match e {
        RdmaCmError::PrivateDataTooLong { .. } => too_long,
        RdmaCmError::BadMtu(_) => "RoCE path MTU must be 256, 512, 1024, 2048 or 4096",
        RdmaCmError::CmaHeader => "CMA header",
    })
}

/// An unpredictable 32-bit value (PSNs, IDs, ports).
pub(crate) fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u32
}

/// What a thread or task waiting on a connection is told.
#[derive(Default)]
pub(crate) struct Slot {
    ev: Mutex<Option<CmEvent>>,
    cond: Condvar,
    ready: Event,
    /// An acceptor waiting for an RTU is told that other requests wait on its listener.
    nudged: std::sync::atomic::AtomicBool,
}

/// How an acceptor's wait for the RTU ended.
enum Rtu {
    /// The RTU (`Established`) or what came instead.
    Came(CmEvent),
    /// Other requests wait on the listener: the RTU is left to come on its own.
    Others,
    /// Nothing within the caller's timeout.
    Nothing,
}

impl Slot {
    fn put(&self, ev: CmEvent) {
        *self.ev.lock() = Some(ev);
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
    }

    /// The event, once there is one (cancel-safe).
    async fn wait_async(&self) -> CmEvent {
        loop {
            if let Some(ev) = self.ev.lock().take() {
                return ev;
            }
            let l = self.ready.listen();
            if let Some(ev) = self.ev.lock().take() {
                return ev;
            }
            l.await;
        }
    }

    /// Wakes a [`wait_rtu`](Self::wait_rtu) with [`Rtu::Others`].
    fn nudge(&self) {
        let _g = self.ev.lock();
        self.nudged.store(true, Ordering::Release);
        self.cond.notify_all();
        self.ready.notify(usize::MAX);
    }

    fn rtu_now(&self, g: &mut Option<CmEvent>) -> Option<Rtu> {
        if let Some(ev) = g.take() {
            return Some(Rtu::Came(ev));
        }
        self.nudged.load(Ordering::Acquire).then_some(Rtu::Others)
    }

    fn wait_rtu(&self, deadline: Instant) -> Rtu {
        let mut g = self.ev.lock();
        loop {
            if let Some(r) = self.rtu_now(&mut g) {
                return r;
            }
            if self.cond.wait_until(&mut g, deadline).timed_out() {
                return g.take().map_or(Rtu::Nothing, Rtu::Came);
            }
        }
    }

    async fn wait_rtu_async(&self) -> Rtu {
        loop {
            if let Some(r) = self.rtu_now(&mut self.ev.lock()) {
                return r;
            }
            let l = self.ready.listen();
            if let Some(r) = self.rtu_now(&mut self.ev.lock()) {
                return r;
            }
            l.await;
        }
    }

    fn wait(&self, deadline: Instant) -> Option<CmEvent> {
        let mut g = self.ev.lock();
        loop {
            if let Some(ev) = g.take() {
                return Some(ev);
            }
            if self.cond.wait_until(&mut g, deadline).timed_out() {
                return g.take();
            }
        }
    }
}

/// A request waiting in a listener's queue.
pub(crate) struct Pending {
    id: CommId,
    kind: PendingKind,
    peer_addr: SocketAddr,
    local_addr: SocketAddr,
    /// The application's private data (after the CMA header).
    private_data: Vec<u8>,
}

enum PendingKind {
    Conn(Box<ReqInfo>),
    Sidr,
}

/// A listener's queue of requests.
pub(crate) struct ListenQueue {
    requests: Backlog<Pending>,
    /// Acceptors waiting for an RTU, nudged when a request arrives.
    rtu_waiters: Mutex<Vec<Arc<Slot>>>,
}

impl ListenQueue {
    /// Drops requests the CM gave up (the requester withdrew it, or nobody answered).
    fn purge(&self, id: CommId) {
        self.requests.retain(|p| p.id != id);
    }
}

/// The CM state of a context: the engine, the listeners and who waits for what.
pub(crate) struct Gsi {
    cm: Cm,
    /// PSN of QP1's next Send.
    psn: u32,
    listeners: HashMap<u16, Arc<ListenQueue>>,
    slots: HashMap<CommId, Arc<Slot>>,
    qp_of: HashMap<CommId, u32>,
    conn_of: HashMap<u32, CommId>,
}

impl Gsi {
    pub(crate) fn cm_counters(&self) -> softrdma_ib::cm::CmCounters {
        self.cm.counters()
    }

    pub(crate) fn new(local: IpAddr, roce: &super::RoceConfig) -> Gsi {
        let cfg = CmConfig {
            max_pending_per_source: roce.cm_pending_per_source,
            rtu_timeout: roce.cm_rtu_timeout,
            ..CmConfig::new(local, rdma_cm::ca_guid(local), random_u32(), random_u32())
        };
        Gsi {
            cm: Cm::new(cfg),
            psn: random_u32() & 0xFF_FFFF,
            listeners: HashMap::new(),
            slots: HashMap::new(),
            qp_of: HashMap::new(),
            conn_of: HashMap::new(),
        }
    }
}

impl RoceShared {
    /// A UD Send that arrived for QP1 from `peer` (IBA 13.5.1: UD, Q_Key 0x80010000, a
    /// MAD of 256 octets); anything else is dropped.
    pub(crate) fn gsi_input(&self, now: Instant, peer: IpAddr, p: &PacketRepr<'_>) {
        let ud_send = Opcode::new(Service::Ud, Operation::SendOnly).ok();
        let ok = Some(p.bth.opcode) == ud_send
            && p.deth.is_some_and(|d| d.q_key == GSI_QKEY)
            && pkey_matches(p.bth.pkey, DEFAULT_PKEY)
            && p.payload.len() == MAD_LEN;
        if !ok {
            self.counters.qp1_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "QP1: not a MAD, dropped");
            return;
        }
        self.gsi.lock().cm.handle_mad(now, peer, p.payload);
    }

    /// When the CM's next timer is due.
    pub(crate) fn gsi_timeout(&self) -> Option<Instant> {
        self.gsi.lock().cm.poll_timeout()
    }

    /// Runs the CM's timers, sends its MADs and acts on its events until it is quiet.
    pub(crate) fn gsi_pump(&self, now: Instant) {
        loop {
            let (mads, events, psn) = {
                let mut g = self.gsi.lock();
                g.cm.handle_timeout(now);
                let mads: Vec<_> = std::iter::from_fn(|| g.cm.poll_transmit()).collect();
                let events: Vec<_> = std::iter::from_fn(|| g.cm.poll_event()).collect();
                let psn = g.psn;
                g.psn = (g.psn + mads.len() as u32) & 0xFF_FFFF;
                (mads, events, psn)
            };
            if mads.is_empty() && events.is_empty() {
                return;
            }
            self.send_mads(&mads, psn);
            let any = !events.is_empty();
            for ev in events {
                self.on_cm_event(now, ev);
            }
            if any {
                self.gsi_changed.notify_all();
            }
        }
    }

    fn send_mads(&self, mads: &[(IpAddr, Box<[u8; MAD_LEN]>)], first_psn: u32) {
        let Ok(op) = Opcode::new(Service::Ud, Operation::SendOnly) else {
            return;
        };
        let mut dgram = Vec::with_capacity(mads.len() * 400);
        let mut batch = Vec::with_capacity(mads.len());
        let mut pkt = [0u8; 512];
        let ep = self.endpoint.read();
        for (i, (to, mad)) in mads.iter().enumerate() {
            let mut bth = BthRepr::new(op, GSI_QPN, (first_psn + i as u32) & 0xFF_FFFF);
            bth.pkey = DEFAULT_PKEY;
            bth.ack_req = true; // as rxe's GSI sends them
            let mut p = PacketRepr::new(bth, &mad[..]);
            p.deth = Some(DethRepr {
                q_key: GSI_QKEY,
                reserved: 0,
                src_qp: GSI_QPN,
            });
            let Ok(n) = p.emit(&mut pkt) else { continue };
            let dest = SocketAddr::new(*to, self.local.port());
            if let Ok(t) = ep.encapsulate_to(GSI_QPN, dest, &pkt[..n], &mut dgram) {
                batch.push(t);
            }
        }
        drop(ep);
        self.send_batch(&mut dgram, &batch);
    }

    fn on_cm_event(&self, now: Instant, ev: CmEvent) {
        match ev {
            CmEvent::Request { id, mut req } => {
                let (service_id, private_data) =
                    (req.service_id, std::mem::take(&mut req.private_data));
                self.take_request(
                    id,
                    service_id,
                    &private_data,
                    PendingKind::Conn(Box::new(req)),
                );
            }
            CmEvent::SidrRequest {
                id,
                service_id,
                private_data,
                ..
            } => self.take_request(id, service_id, &private_data, PendingKind::Sidr),
            CmEvent::Reply { id, .. } | CmEvent::SidrReply { id, .. } => {
                let slot = self.gsi.lock().slots.remove(&id);
                match slot {
                    Some(s) => s.put(ev),
                    // Nobody waits any more: give the connection up.
                    None => self.gsi.lock().cm.destroy(now, id),
                }
            }
            CmEvent::Established { id } => {
                let (slot, qpn) = {
                    let mut g = self.gsi.lock();
                    (g.slots.remove(&id), g.qp_of.get(&id).copied())
                };
                if let Some(s) = slot {
                    s.put(ev);
                }
                if let Some(qp_num) = qpn {
                    tracing::info!(qp = %format_args!("{qp_num:#08x}"), "RoCE connection established");
                    self.events.post(AsyncEvent::Established { qp_num });
                }
            }
            CmEvent::Rejected { id, .. }
            | CmEvent::TimedOut { id }
            | CmEvent::Disconnected { id, .. } => {
                let ev_kind = match &ev {
                    CmEvent::Rejected { .. } => "rejected",
                    CmEvent::TimedOut { .. } => "timed out",
                    _ => "disconnected",
                };
                let (slot, qpn) = {
                    let mut g = self.gsi.lock();
                    let qpn = g.qp_of.remove(&id);
                    if let Some(q) = qpn {
                        g.conn_of.remove(&q);
                    }
                    (g.slots.remove(&id), qpn)
                };
                let waited = slot.is_some();
                if let Some(s) = slot {
                    s.put(ev);
                } else if qpn.is_none() {
                    // Maybe a request still queued for `accept`: it must not be handed out.
                    let queues: Vec<_> = self.gsi.lock().listeners.values().cloned().collect();
                    for l in queues {
                        l.purge(id);
                    }
                }
                if let Some(qp_num) = qpn {
                    tracing::info!(qp = %format_args!("{qp_num:#08x}"), how = ev_kind, "RoCE connection ended");
                    // The connection is gone: its QP stops (IBA 12.9.7), outstanding
                    // requests flush.
                    let q = self.qps.read().get(&qp_num).cloned();
                    if let Some(q) = q {
                        let _ = self.modify(&q, &QpAttr::state(IbQpState::Error));
                    }
                    if !waited {
                        self.events.post(AsyncEvent::Disconnected { qp_num });
                    }
                }
            }
        }
    }

    fn cm_reject(&self, id: CommId, why: u16) {
        let _ = self.gsi.lock().cm.reject(id, why, &[]);
    }

    /// Answers a request no listener takes: a REJ (REQ) or a SIDR_REP (SIDR_REQ) saying
    /// `why`, with `private_data`. The requester may have given up.
    fn refuse(&self, id: CommId, kind: &PendingKind, why: Refusal, private_data: &[u8]) {
        let mut g = self.gsi.lock();
        let _ = match kind {
            PendingKind::Conn(_) => g.cm.reject(id, why.rej_reason(), private_data),
            PendingKind::Sidr => {
                let status = why.sidr_status();
                g.cm.sidr_reply(Instant::now(), id, status, 0, 0, private_data)
            }
        };
    }

    /// A REQ (RDMA_PS_TCP) or SIDR_REQ (RDMA_PS_UDP) with librdmacm's header goes to the
    /// listener on its port, if it has room.
    fn take_request(&self, id: CommId, service_id: u64, private_data: &[u8], kind: PendingKind) {
        let rk = match kind {
            PendingKind::Conn(_) => RequestKind::Conn,
            PendingKind::Sidr => RequestKind::Sidr,
        };
        let to = match rdma_cm::route(rk, service_id, private_data) {
            Ok(to) => to,
            Err(why) => return self.refuse(id, &kind, why, &[]),
        };
        let l = self.gsi.lock().listeners.get(&to.port).cloned();
        let Some(l) = l else {
            return self.refuse(id, &kind, Refusal::NoListener, &[]);
        };
        let pending = Pending {
            id,
            peer_addr: to.peer_addr,
            local_addr: to.local_addr,
            private_data: to.private_data.to_vec(),
            kind,
        };
        if let Err(p) = l.requests.push(pending) {
            return self.refuse(id, &p.kind, Refusal::BacklogFull, &[]);
        }
        for s in l.rtu_waiters.lock().iter() {
            s.nudge();
        }
    }

    /// Registers a waiter for `id` and what the CM did, then sends it.
    fn cm_call<T>(
        &self,
        f: impl FnOnce(&mut Gsi) -> Result<(CommId, T), softrdma_ib::cm::CmError>,
    ) -> Result<(CommId, T, Arc<Slot>), Error> {
        let slot = Arc::new(Slot::default());
        let r = {
            let mut g = self.gsi.lock();
            let r = f(&mut g);
            if let Ok((id, _)) = &r {
                g.slots.insert(*id, slot.clone());
            }
            r
        };
        self.gsi_pump(Instant::now());
        let (id, t) = r.map_err(cm_error)?;
        Ok((id, t, slot))
    }

    fn forget(&self, id: CommId) {
        let mut g = self.gsi.lock();
        g.slots.remove(&id);
        if let Some(q) = g.qp_of.remove(&id) {
            g.conn_of.remove(&q);
        }
        g.cm.destroy(Instant::now(), id);
    }

    /// Ties a connection to its QP (for disconnects and events).
    fn bind_qp(&self, id: CommId, qpn: u32) {
        let mut g = self.gsi.lock();
        g.qp_of.insert(id, qpn);
        g.conn_of.insert(qpn, id);
    }

    /// `rdma_disconnect`: the QP to Error, the DREQ to the peer.
    pub(crate) fn cm_disconnect(&self, q: &RoceQpShared) -> Result<(), Error> {
        let now = Instant::now();
        self.modify(q, &QpAttr::state(IbQpState::Error))?;
        {
            let mut g = self.gsi.lock();
            if let Some(id) = g.conn_of.remove(&q.qpn) {
                g.qp_of.remove(&id);
                // Not yet connected: the REQ or REP is withdrawn instead.
                if g.cm.disconnect(now, id).is_err() {
                    g.cm.destroy(now, id);
                }
            }
        }
        self.gsi_pump(now);
        Ok(())
    }

    /// The context closes: its DREQs are repeated until answered, for at most [`LINGER`]
    /// (the receive thread takes the DREPs meanwhile).
    ///
    /// [`LINGER`]: super::LINGER
    pub(crate) fn linger(&self) {
        let end = Instant::now() + super::LINGER;
        let mut g = self.gsi.lock();
        while g.cm.disconnecting() > 0 {
            let now = Instant::now();
            if now >= end {
                return;
            }
            let wait = super::LINGER_REPEAT.min(end - now);
            if self.gsi_changed.wait_for(&mut g, wait).timed_out() && g.cm.disconnecting() > 0 {
                g.cm.hurry_disconnects();
                drop(g);
                self.gsi_pump(Instant::now());
                g = self.gsi.lock();
            }
        }
    }

    /// A packet arrived on a QP whose RTU was not seen yet: the connection is established
    /// (IBA 12.9.6; Linux's `ib_cm_notify(IB_EVENT_COMM_EST)`).
    pub(crate) fn comm_established(&self, qpn: u32, now: Instant) {
        {
            let mut g = self.gsi.lock();
            let Some(&id) = g.conn_of.get(&qpn) else {
                return;
            };
            g.cm.established(id);
        }
        self.gsi_pump(now);
    }

    /// A QP is destroyed: its connection ends.
    pub(crate) fn cm_forget_qp(&self, qpn: u32) {
        let now = Instant::now();
        {
            let mut g = self.gsi.lock();
            if let Some(id) = g.conn_of.remove(&qpn) {
                g.qp_of.remove(&id);
                g.cm.destroy(now, id);
            }
        }
        self.gsi_pump(now);
    }
}

fn cm_error(e: softrdma_ib::cm::CmError) -> Error {
    use softrdma_ib::cm::CmError as E;
    match e {
        E::NoResources => Error::Io(std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            "too many connections",
        )),
        E::Invalid(w) => Error::InvalidArgument(w),
        E::ServiceIdInUse(_) => Error::Io(std::io::ErrorKind::AddrInUse.into()),
        E::UnknownId(_) | E::InvalidState { .. } => {
            Error::Protocol("the connection was given up (the peer timed out or went away)")
        }
    }
}

/// The QP to RTS with what both sides agreed, as librdmacm drives it; `peer` is where
/// its packets go.
fn bring_up(drv: &RoceShared, q: &RoceQpShared, peer: SocketAddr, a: &Agreed) -> Result<(), Error> {
    drv.set_remote(q, peer);
    for attr in a.qp_attrs() {
        drv.modify(q, &attr)?;
    }
    Ok(())
}

/// A UD QP up to RTS with `qkey` if it is not there yet (librdmacm does it for UD ids).
fn bring_up_ud(drv: &RoceShared, q: &RoceQpShared, qkey: u32) -> Result<(), Error> {
    for attr in rdma_cm::ud_bring_up(q.state(), qkey, random_u32() & 0xFF_FFFF) {
        drv.modify(q, &attr)?;
    }
    Ok(())
}

/// RC or UC: the service of a connected QP.
fn service_of(q: &RoceQpShared) -> CmService {
    if q.qp_type() == QpType::Rc {
        CmService::Rc
    } else {
        CmService::Uc
    }
}

fn info(
    drv: &RoceShared,
    peer: SocketAddr,
    a: (u32, u32, u32),
    ird: u16,
    ord: u16,
    pd: Vec<u8>,
) -> ConnectionInfo {
    let (remote_qpn, pmtu, remote_qkey) = a;
    ConnectionInfo {
        local_addr: drv.local,
        peer_addr: peer,
        peer_private_data: pd,
        ird,
        ord,
        detail: ConnectionDetail::Roce {
            remote_qpn,
            pmtu,
            remote_qkey,
        },
    }
}

/// A connection request sent, waiting for its answer.
pub(crate) struct Dial {
    id: CommId,
    slot: Arc<Slot>,
    peer: SocketAddr,
    pmtu: u8,
    /// RC, UC: the PSN we expect; UD: `None`.
    rq_psn: Option<u32>,
}

/// Active side (`rdma_connect`): REQ (RC, UC) or SIDR_REQ (UD) to the listener at `addr`.
pub(crate) fn connect(
    drv: &RoceShared,
    q: &RoceQpShared,
    addr: impl ToSocketAddrs,
    params: &ConnectParams,
) -> Result<ConnectionInfo, Error> {
    let deadline = Instant::now() + params.timeout;
    let d = connect_start(drv, q, addr, params)?;
    let ev = d.slot.wait(deadline);
    connect_finish(drv, q, &d, params, ev)
}

/// [`connect`] for a task: the CM's own timers bound the wait; dropped early, the attempt
/// is abandoned (a reply that comes later is refused).
pub(crate) async fn connect_async(
    drv: &RoceShared,
    q: &RoceQpShared,
    addr: SocketAddr,
    params: &ConnectParams,
) -> Result<ConnectionInfo, Error> {
    let d = connect_start(drv, q, addr, params)?;
    let mut forget = Forget(drv, Some(d.id), None);
    let ev = d.slot.wait_async().await;
    forget.1 = None;
    connect_finish(drv, q, &d, params, Some(ev))
}

/// Forgets a connection attempt whose waiter is dropped (and stops the QP brought up for
/// it, if any).
struct Forget<'a>(&'a RoceShared, Option<CommId>, Option<&'a RoceQpShared>);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.1 {
            self.0.forget(id);
            if let Some(q) = self.2 {
                let _ = self.0.modify(q, &QpAttr::state(IbQpState::Error));
            }
        }
    }
}

/// Sends the REQ or SIDR_REQ.
fn connect_start(
    drv: &RoceShared,
    q: &RoceQpShared,
    addr: impl ToSocketAddrs,
    params: &ConnectParams,
) -> Result<Dial, Error> {
    let dst = addr
        .to_socket_addrs()?
        .find(|a| a.is_ipv4() == drv.local.is_ipv4())
        .ok_or(Error::InvalidArgument("no address of the context's family"))?;
    let pmtu = mtu_code(params.roce.pmtu)?;
    // An ephemeral source port for the CMA header (and the flow label).
    let src = SocketAddr::new(drv.local.ip(), 32768 + (random_u32() % 28232) as u16);
    let too_long = |e| {
        invalid(
            e,
            "RoCE private data is at most 56 octets in a connection request (180 for UD)",
        )
    };
    let peer = SocketAddr::new(dst.ip(), drv.local.port());
    if q.qp_type() == QpType::Ud {
        let s = rdma_cm::sidr_req(src, dst, &params.private_data).map_err(too_long)?;
        bring_up_ud(drv, q, RDMA_UDP_QKEY)?;
        let (id, (), slot) = drv.cm_call(|g| {
            let id =
                g.cm.sidr_request(Instant::now(), s.peer, s.service_id, &s.private_data)?;
            Ok((id, ()))
        })?;
        return Ok(Dial {
            id,
            slot,
            peer,
            pmtu,
            rq_psn: None,
        });
    }
    // Each side names the PSN it expects; the other sends from it.
    let rq_psn = random_u32() & 0xFF_FFFF;
    let req = rdma_cm::req(&rdma_cm::Connect {
        src,
        dst,
        qpn: q.qpn,
        service: service_of(q),
        rq_psn,
        ird: params.ird,
        ord: params.ord,
        path_mtu: pmtu,
        srq: q.has_srq(),
        private_data: &params.private_data,
    })
    .map_err(too_long)?;
    if !matches!(q.state(), IbQpState::Reset | IbQpState::Init) {
        return Err(Error::InvalidState(crate::state::QpState::from(q.state())));
    }
    let (id, (), slot) = drv.cm_call(|g| Ok((g.cm.connect(Instant::now(), &req)?, ())))?;
    Ok(Dial {
        id,
        slot,
        peer,
        pmtu,
        rq_psn: Some(rq_psn),
    })
}

/// The answer to [`connect_start`] (`None`: none in time): the QP up and the RTU sent.
fn connect_finish(
    drv: &RoceShared,
    q: &RoceQpShared,
    d: &Dial,
    params: &ConnectParams,
    ev: Option<CmEvent>,
) -> Result<ConnectionInfo, Error> {
    let (id, peer, pmtu) = (d.id, d.peer, d.pmtu);
    let Some(rq_psn) = d.rq_psn else {
        return match ev {
            Some(CmEvent::SidrReply {
                status: sidr_status::OK,
                qpn,
                qkey,
                private_data,
                ..
            }) => Ok(info(
                drv,
                peer,
                (qpn, rdma_cm::mtu_of(pmtu), qkey),
                0,
                0,
                private_data,
            )),
            Some(CmEvent::SidrReply {
                status,
                private_data,
                ..
            }) => Err(Error::Rejected {
                reason: Some(u16::from(status)),
                private_data,
            }),
            Some(CmEvent::TimedOut { .. }) => Err(Error::Timeout),
            _ => {
                drv.forget(id);
                Err(Error::Timeout)
            }
        };
    };
    let rep = match ev {
        Some(CmEvent::Reply { rep, .. }) => rep,
        Some(CmEvent::Rejected {
            reason,
            private_data,
            ..
        }) => {
            return Err(Error::Rejected {
                reason: Some(reason),
                private_data,
            });
        }
        Some(CmEvent::TimedOut { .. }) => return Err(Error::Timeout),
        _ => {
            drv.forget(id);
            return Err(Error::Timeout);
        }
    };
    let a = Agreed::initiator(service_of(q), &rep, rq_psn, pmtu, params.ird, params.ord);
    if let Err(e) = bring_up(drv, q, peer, &a) {
        let _ = drv.gsi.lock().cm.reject(id, reason::NO_QP, &[]);
        drv.gsi_pump(Instant::now());
        return Err(e);
    }
    drv.bind_qp(id, q.qpn);
    let r = drv.gsi.lock().cm.rtu(id, &[]);
    drv.gsi_pump(Instant::now());
    r.map_err(cm_error)?;
    Ok(info(
        drv,
        peer,
        (rep.qpn, a.pmtu, 0),
        a.ird,
        a.ord,
        rep.private_data,
    ))
}
