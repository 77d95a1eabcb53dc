//! The connection manager over RoCE: QP1 (the General Services Interface) carries the
//! InfiniBand CM's MADs, run by the sans-IO [`Cm`] of `softrdma_ib`, with librdmacm's
//! conventions on top, so `rdma_cm` peers (rping, perftest -R, udaddy, NFS over RDMA)
//! and softrdma reach each other.
//!
//! - QP1 is a UD QP of the endpoint: it takes UD Sends of 256 octets with Q_Key
//!   [`GSI_QKEY`] and the default P_Key (IBA 13.5.1; anything else is dropped, C9-50),
//!   and sends them from QP1 with rxe's BTH (AckReq set, its own PSN sequence).
//! - librdmacm (`cma.c`): the service ID is the port space (RDMA_PS_TCP for RC and UC,
//!   RDMA_PS_UDP for UD through SIDR) and the port; the REQ's and SIDR_REQ's private data
//!   begin with the CMA header (source address and port, destination address), the
//!   application's follow; the flow label of the path is `(sport * 31 + dport) & 0xFFFFF`;
//!   responder resources, initiator depth, retry and RNR retry counts and PSNs travel in
//!   REQ and REP and are applied to the QPs, which the CM moves INIT → RTR → RTS.
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
    Cm, CmConfig, CmEvent, CmService, CommId, GSI_QKEY, GSI_QPN, RepParams, ReqInfo, ReqParams,
    reason, sidr_status,
};
use softrdma_ib::{QpAttr, QpState as IbQpState, QpType, pkey_matches};
use softrdma_memory::Access;
use softrdma_wire::ib::cm::{
    REJ_PRIVATE_LEN, REP_PRIVATE_LEN, REQ_PRIVATE_LEN, SIDR_REP_PRIVATE_LEN, SIDR_REQ_PRIVATE_LEN,
};
use softrdma_wire::ib::cma::{CMA_HDR_LEN, CmaHeader, PortSpace, port_of_service, service_id};
use softrdma_wire::ib::mad::MAD_LEN;
use softrdma_wire::ib::{BthRepr, DEFAULT_PKEY, DethRepr, Opcode, Operation, PacketRepr, Service};

use super::{RoceQpShared, RoceShared};
use crate::Error;
use crate::backlog::Backlog;
use crate::connparams::{AcceptParams, ConnectParams, ConnectionDetail, ConnectionInfo};
use crate::event::AsyncEvent;

/// The Q_Key librdmacm gives UD QPs of RDMA_PS_UDP (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Path MTUs (IBA 9.7.3) and their codes in REQ (1 = 256 .. 5 = 4096).
fn mtu_code(pmtu: u32) -> Result<u8, Error> {
    match pmtu {
        256 => Ok(1),
        512 => Ok(2),
        1024 => Ok(3),
        2048 => Ok(4),
        4096 => Ok(5),
        _ => Err(Error::InvalidArgument(
            "RoCE path MTU must be 256, 512, 1024, 2048 or 4096",
        )),
    }
}

fn mtu_of(code: u8) -> u32 {
    128 << code.clamp(1, 5)
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

/// A CA GUID for our address: EUI-64 of a locally administered MAC made from it, as a
/// RoCE NIC's is of its MAC.
fn ca_guid(ip: IpAddr) -> u64 {
    let o = match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            [0x02, 0x00, a, b, c, d]
        }
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [0x02, o[11], o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes([o[0], o[1], o[2], 0xFF, 0xFE, o[3], o[4], o[5]])
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

/// Why a request is refused, as a REJ reason and a SIDR_REP status.
const NO_LISTENER: (u16, u8) = (reason::INVALID_SERVICE_ID, sidr_status::UNSUPPORTED);
const BAD_HEADER: (u16, u8) = (reason::CONSUMER_DEFINED, sidr_status::REJECT);
const BACKLOG_FULL: (u16, u8) = (reason::NO_RESOURCES, sidr_status::REJECT);
const CONSUMER: (u16, u8) = (reason::CONSUMER_DEFINED, sidr_status::REJECT);

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
            ..CmConfig::new(local, ca_guid(local), random_u32(), random_u32())
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

    /// Answers a request no listener takes: a REJ with `why.0` (REQ) or a SIDR_REP with
    /// status `why.1` (SIDR_REQ), and `private_data`. The requester may have given up.
    fn refuse(&self, id: CommId, kind: &PendingKind, why: (u16, u8), private_data: &[u8]) {
        let mut g = self.gsi.lock();
        let _ = match kind {
            PendingKind::Conn(_) => g.cm.reject(id, why.0, private_data),
            PendingKind::Sidr => {
                g.cm.sidr_reply(Instant::now(), id, why.1, 0, 0, private_data)
            }
        };
    }

    /// A REQ (RDMA_PS_TCP) or SIDR_REQ (RDMA_PS_UDP) with librdmacm's header goes to the
    /// listener on its port, if it has room.
    fn take_request(&self, id: CommId, service_id: u64, private_data: &[u8], kind: PendingKind) {
        let space = match kind {
            PendingKind::Conn(_) => PortSpace::Tcp,
            PendingKind::Sidr => PortSpace::Udp,
        };
        let port = match port_of_service(service_id) {
            Some((ps, port)) if ps == space => port,
            _ => return self.refuse(id, &kind, NO_LISTENER, &[]),
        };
        let Ok((hdr, rest)) = CmaHeader::parse(private_data) else {
            // librdmacm's listener refuses a request without its header.
            return self.refuse(id, &kind, BAD_HEADER, &[]);
        };
        let l = self.gsi.lock().listeners.get(&port).cloned();
        let Some(l) = l else {
            return self.refuse(id, &kind, NO_LISTENER, &[]);
        };
        let pending = Pending {
            id,
            peer_addr: hdr.src,
            local_addr: SocketAddr::new(hdr.dst, port),
            private_data: rest.to_vec(),
            kind,
        };
        if let Err(p) = l.requests.push(pending) {
            return self.refuse(id, &p.kind, BACKLOG_FULL, &[]);
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

/// What both sides agreed, applied to an RC or UC QP: INIT → RTR → RTS as librdmacm
/// drives it.
struct Agreed {
    peer: SocketAddr,
    peer_qpn: u32,
    /// The first PSN we expect (we named it in our REQ or REP).
    rq_psn: u32,
    /// The first PSN we send (the peer named it).
    sq_psn: u32,
    pmtu: u32,
    ird: u16,
    ord: u16,
    retry: u8,
    rnr_retry: u8,
}

fn bring_up(drv: &RoceShared, q: &RoceQpShared, a: &Agreed) -> Result<(), Error> {
    let rc = q.qp_type() == QpType::Rc;
    drv.set_remote(q, a.peer);
    // Reset → Init, or Init → Init: remote access as rdma_cm grants it.
    drv.modify(
        q,
        &QpAttr {
            state: Some(IbQpState::Init),
            access: Some(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC),
            ..QpAttr::default()
        },
    )?;
    drv.modify(
        q,
        &QpAttr {
            state: Some(IbQpState::Rtr),
            pmtu: Some(a.pmtu),
            dest_qp: Some(a.peer_qpn),
            rq_psn: Some(a.rq_psn),
            max_dest_rd_atomic: rc.then_some(clamp_u8(a.ird)),
            min_rnr_timer: rc.then_some(12),
            ..QpAttr::default()
        },
    )?;
    drv.modify(
        q,
        &QpAttr {
            state: Some(IbQpState::Rts),
            sq_psn: Some(a.sq_psn),
            // Our own retransmission timer (67 ms): loopback and LAN paths, not the
            // path's packet life time Linux puts in the REQ.
            timeout: rc.then_some(14),
            retry_cnt: rc.then_some(a.retry.min(7)),
            rnr_retry: rc.then_some(a.rnr_retry.min(7)),
            max_rd_atomic: rc.then_some(clamp_u8(a.ord)),
            ..QpAttr::default()
        },
    )?;
    Ok(())
}

/// A UD QP up to RTS with `qkey` if it is not there yet (librdmacm does it for UD ids).
fn bring_up_ud(drv: &RoceShared, q: &RoceQpShared, qkey: u32) -> Result<(), Error> {
    if q.state() == IbQpState::Reset {
        drv.modify(
            q,
            &QpAttr {
                state: Some(IbQpState::Init),
                qkey: Some(qkey),
                ..QpAttr::default()
            },
        )?;
    }
    if q.state() == IbQpState::Init {
        drv.modify(q, &QpAttr::state(IbQpState::Rtr))?;
    }
    if q.state() == IbQpState::Rtr {
        drv.modify(
            q,
            &QpAttr {
                state: Some(IbQpState::Rts),
                sq_psn: Some(random_u32() & 0xFF_FFFF),
                ..QpAttr::default()
            },
        )?;
    }
    Ok(())
}

fn clamp_u8(v: u16) -> u8 {
    v.min(u16::from(u8::MAX)) as u8
}

fn check_len(p: &[u8], max: usize, what: &'static str) -> Result<(), Error> {
    if p.len() > max {
        return Err(Error::InvalidArgument(what));
    }
    Ok(())
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
    let pmtu = mtu_code(params.roce_pmtu)?;
    // An ephemeral source port for the CMA header (and the flow label).
    let sport = 32768 + (random_u32() % 28232) as u16;
    let hdr = CmaHeader {
        src: SocketAddr::new(drv.local.ip(), sport),
        dst: dst.ip(),
    };
    let qp_type = q.qp_type();
    let max_pd = if qp_type == QpType::Ud {
        SIDR_REQ_PRIVATE_LEN
    } else {
        REQ_PRIVATE_LEN
    } - CMA_HDR_LEN;
    check_len(
        &params.private_data,
        max_pd,
        "RoCE private data is at most 56 octets in a connection request (180 for UD)",
    )?;
    let mut pd = vec![0u8; CMA_HDR_LEN];
    hdr.emit(&mut pd)
        .map_err(|_| Error::InvalidArgument("CMA header"))?;
    pd.extend_from_slice(&params.private_data);
    let peer = SocketAddr::new(dst.ip(), drv.local.port());
    if qp_type == QpType::Ud {
        bring_up_ud(drv, q, RDMA_UDP_QKEY)?;
        let sid = service_id(PortSpace::Udp, dst.port());
        let (id, (), slot) = drv.cm_call(|g| {
            let id = g.cm.sidr_request(Instant::now(), dst.ip(), sid, &pd)?;
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
    if !matches!(q.state(), IbQpState::Reset | IbQpState::Init) {
        return Err(Error::InvalidState(crate::state::QpState::from(q.state())));
    }
    // Each side names the PSN it expects; the other sends from it.
    let rq_psn = random_u32() & 0xFF_FFFF;
    let req = ReqParams {
        peer: dst.ip(),
        service_id: service_id(PortSpace::Tcp, dst.port()),
        qpn: q.qpn,
        service: if qp_type == QpType::Rc {
            CmService::Rc
        } else {
            CmService::Uc
        },
        starting_psn: rq_psn,
        responder_resources: clamp_u8(params.ird),
        initiator_depth: clamp_u8(params.ord),
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: pmtu,
        srq: q.has_srq(),
        flow_label: (u32::from(sport) * 31 + u32::from(dst.port())) & 0xF_FFFF,
        private_data: pd,
    };
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
                (qpn, 128 << pmtu, qkey),
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
    let a = Agreed {
        peer,
        peer_qpn: rep.qpn,
        rq_psn,
        sq_psn: rep.starting_psn,
        pmtu: mtu_of(pmtu),
        ird: params.ird,
        // Keep outstanding no more than the responder serves.
        ord: params.ord.min(u16::from(rep.responder_resources)),
        retry: 7,
        rnr_retry: rep.rnr_retry_count,
    };
    if let Err(e) = bring_up(drv, q, &a) {
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

/// A listener's registration: the port in both port spaces.
pub(crate) struct RoceListener {
    drv: Arc<RoceShared>,
    queue: Arc<ListenQueue>,
    port: u16,
    pub(crate) local_addr: SocketAddr,
}

impl RoceListener {
    /// `rdma_listen` on `addr` (our address or the wildcard; port 0: any free port).
    pub(crate) fn bind(
        drv: &Arc<RoceShared>,
        addr: impl ToSocketAddrs,
        backlog: u32,
    ) -> Result<RoceListener, Error> {
        let a = addr
            .to_socket_addrs()?
            .next()
            .ok_or(Error::InvalidArgument("no address to listen on"))?;
        if !a.ip().is_unspecified() && a.ip() != drv.local.ip() {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::AddrNotAvailable,
                format!(
                    "{} is not this RoCE device's address {}",
                    a.ip(),
                    drv.local.ip()
                ),
            )));
        }
        let queue = Arc::new(ListenQueue {
            requests: Backlog::new(backlog),
            rtu_waiters: Mutex::new(Vec::new()),
        });
        let mut g = drv.gsi.lock();
        let free = |g: &Gsi, p: u16| p != 0 && !g.listeners.contains_key(&p);
        let port = if a.port() != 0 {
            if !free(&g, a.port()) {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("RoCE port {} is listened on already", a.port()),
                )));
            }
            a.port()
        } else {
            let start = random_u32();
            (0..28232u32)
                .map(|i| 32768 + ((start + i) % 28232) as u16)
                .find(|&p| free(&g, p))
                .ok_or(Error::Io(std::io::ErrorKind::AddrInUse.into()))?
        };
        for ps in [PortSpace::Tcp, PortSpace::Udp] {
            g.cm.listen(service_id(ps, port)).map_err(cm_error)?;
        }
        g.listeners.insert(port, queue.clone());
        Ok(RoceListener {
            drv: drv.clone(),
            queue,
            port,
            local_addr: SocketAddr::new(drv.local.ip(), port),
        })
    }

    fn request(&self, p: Pending) -> RoceRequest {
        RoceRequest {
            drv: self.drv.clone(),
            queue: self.queue.clone(),
            p,
            answered: false,
        }
    }

    /// The next request, if one is queued.
    pub(crate) fn try_accept(&self) -> Option<RoceRequest> {
        self.queue.requests.try_pop().map(|p| self.request(p))
    }

    /// The next request, once there is one (cancel-safe).
    pub(crate) async fn accept_async(&self) -> Result<RoceRequest, Error> {
        let p = self.queue.requests.wait_async().await?;
        Ok(self.request(p))
    }

    /// The next request; `None` deadline: wait forever.
    pub(crate) fn accept(&self, deadline: Option<Instant>) -> Result<RoceRequest, Error> {
        let p = self.queue.requests.wait(deadline)?;
        Ok(self.request(p))
    }
}

impl Drop for RoceListener {
    fn drop(&mut self) {
        let pending = self.queue.requests.drain();
        {
            let mut g = self.drv.gsi.lock();
            g.listeners.remove(&self.port);
            for ps in [PortSpace::Tcp, PortSpace::Udp] {
                g.cm.unlisten(service_id(ps, self.port));
            }
        }
        for p in pending {
            self.request(p).refuse();
        }
    }
}

/// What [`RoceRequest::accept_start`] did.
enum Answer {
    /// UD: answered.
    Done(ConnectionInfo),
    /// RC, UC: the REP is out; the RTU is awaited.
    Wait(AcceptWait),
}

struct AcceptWait {
    id: CommId,
    slot: Arc<Slot>,
    peer_qpn: u32,
    pmtu: u32,
    ird: u16,
    ord: u16,
}

/// An acceptor's place among its listener's RTU waiters, left when dropped.
struct WaitingRtu<'a>(&'a ListenQueue, Arc<Slot>);

impl WaitingRtu<'_> {
    fn start(&self) {
        self.0.rtu_waiters.lock().push(self.1.clone());
        if !self.0.requests.is_empty() {
            self.1.nudge();
        }
    }
}

impl Drop for WaitingRtu<'_> {
    fn drop(&mut self) {
        self.0
            .rtu_waiters
            .lock()
            .retain(|s| !Arc::ptr_eq(s, &self.1));
    }
}

/// A connection request a RoCE listener received.
pub(crate) struct RoceRequest {
    drv: Arc<RoceShared>,
    /// The listener's queue: while other requests wait there, the RTU is not waited for.
    queue: Arc<ListenQueue>,
    p: Pending,
    answered: bool,
}

impl RoceRequest {
    pub(crate) fn driver(&self) -> &Arc<RoceShared> {
        &self.drv
    }

    pub(crate) fn peer_addr(&self) -> SocketAddr {
        self.p.peer_addr
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.p.local_addr
    }

    pub(crate) fn private_data(&self) -> &[u8] {
        &self.p.private_data
    }

    pub(crate) fn peer_ird_ord(&self) -> (u16, u16) {
        match &self.p.kind {
            PendingKind::Conn(r) => (
                u16::from(r.responder_resources),
                u16::from(r.initiator_depth),
            ),
            PendingKind::Sidr => (0, 0),
        }
    }

    /// Passive side (`rdma_accept`): the QP to RTS, then REP and wait for the RTU (RC,
    /// UC), or SIDR_REP with the QP's number and Q_Key (UD). While other requests wait on
    /// the listener, the RTU is not waited for (as `rdma_accept` does not): a requester
    /// whose RTU never comes must not hold the acceptor from the others. Its connection
    /// then completes on its own: [`AsyncEvent::Established`] on the RTU, or the QP to
    /// Error and [`AsyncEvent::Disconnected`] when the CM gives it up.
    pub(crate) fn accept(
        &mut self,
        q: &RoceQpShared,
        params: &AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        let deadline = Instant::now() + params.timeout;
        match self.accept_start(q, params)? {
            Answer::Done(info) => Ok(info),
            Answer::Wait(w) => {
                let waiting = WaitingRtu(&self.queue, w.slot.clone());
                waiting.start();
                let rtu = w.slot.wait_rtu(deadline);
                drop(waiting);
                self.accept_finish(q, &w, rtu)
            }
        }
    }

    /// [`accept`](Self::accept) for a task: the CM's timers bound the wait for the RTU;
    /// dropped early, the connection is abandoned and the QP goes to Error.
    pub(crate) async fn accept_async(
        &mut self,
        q: &RoceQpShared,
        params: &AcceptParams,
    ) -> Result<ConnectionInfo, Error> {
        match self.accept_start(q, params)? {
            Answer::Done(info) => Ok(info),
            Answer::Wait(w) => {
                let mut forget = Forget(&self.drv, Some(w.id), Some(q));
                let waiting = WaitingRtu(&self.queue, w.slot.clone());
                waiting.start();
                let rtu = w.slot.wait_rtu_async().await;
                drop(waiting);
                forget.1 = None;
                drop(forget);
                self.accept_finish(q, &w, rtu)
            }
        }
    }

    /// The RTU (or what came instead, or nothing in time, or other requests waiting) for
    /// the REP sent.
    fn accept_finish(
        &self,
        q: &RoceQpShared,
        w: &AcceptWait,
        rtu: Rtu,
    ) -> Result<ConnectionInfo, Error> {
        let drv = &self.drv;
        let ev = match rtu {
            Rtu::Came(ev) => Some(ev),
            Rtu::Nothing => None,
            Rtu::Others => {
                // Nobody waits for this connection's events any more (they go to the
                // context's async events); one that came meanwhile is taken here.
                if drv.gsi.lock().slots.remove(&w.id).is_some() {
                    w.slot
                        .ev
                        .lock()
                        .take()
                        .or(Some(CmEvent::Established { id: w.id }))
                } else {
                    // The CM took the slot to answer it: the event is being put there.
                    w.slot
                        .wait(Instant::now() + std::time::Duration::from_secs(1))
                }
            }
        };
        match ev {
            Some(CmEvent::Established { .. }) => Ok(info(
                drv,
                self.p.peer_addr,
                (w.peer_qpn, w.pmtu, 0),
                w.ird,
                w.ord,
                self.p.private_data.clone(),
            )),
            other => {
                if other.is_none() {
                    drv.forget(w.id);
                }
                let _ = drv.modify(q, &QpAttr::state(IbQpState::Error));
                Err(match other {
                    Some(CmEvent::Rejected {
                        reason,
                        private_data,
                        ..
                    }) => Error::Rejected {
                        reason: Some(reason),
                        private_data,
                    },
                    _ => Error::Timeout,
                })
            }
        }
    }

    /// Checks, brings the QP up and answers: SIDR_REP (done) or REP (then the RTU).
    fn accept_start(&mut self, q: &RoceQpShared, params: &AcceptParams) -> Result<Answer, Error> {
        let drv = self.drv.clone();
        let id = self.p.id;
        let req = match &self.p.kind {
            PendingKind::Sidr => {
                if q.qp_type() != QpType::Ud {
                    return Err(Error::InvalidArgument("a UD request needs a UD QP"));
                }
                check_len(
                    &params.private_data,
                    SIDR_REP_PRIVATE_LEN,
                    "SIDR_REP private data is at most 136 octets",
                )?;
                bring_up_ud(&drv, q, RDMA_UDP_QKEY)?;
                let qkey = q.engine.lock().qp.qkey();
                self.answered = true;
                let now = Instant::now();
                let r = drv.gsi.lock().cm.sidr_reply(
                    now,
                    id,
                    sidr_status::OK,
                    q.qpn,
                    qkey,
                    &params.private_data,
                );
                drv.gsi_pump(now);
                r.map_err(cm_error)?;
                return Ok(Answer::Done(info(
                    &drv,
                    self.p.peer_addr,
                    (0, 0, 0),
                    0,
                    0,
                    self.p.private_data.clone(),
                )));
            }
            PendingKind::Conn(r) => r.clone(),
        };
        let want = if req.service == CmService::Rc {
            QpType::Rc
        } else {
            QpType::Uc
        };
        if q.qp_type() != want {
            return Err(Error::InvalidArgument("the QP's type is not the request's"));
        }
        if !matches!(q.state(), IbQpState::Reset | IbQpState::Init) {
            return Err(Error::InvalidState(crate::state::QpState::from(q.state())));
        }
        check_len(
            &params.private_data,
            REP_PRIVATE_LEN,
            "RoCE private data is at most 196 octets in a reply",
        )?;
        let rq_psn = random_u32() & 0xFF_FFFF;
        let a = Agreed {
            peer: SocketAddr::new(req.peer, drv.local.port()),
            peer_qpn: req.qpn,
            rq_psn,
            sq_psn: req.starting_psn,
            pmtu: mtu_of(req.path_mtu.min(mtu_code(params.roce_pmtu)?)),
            ird: params.ird,
            ord: params.ord.min(u16::from(req.responder_resources)),
            retry: req.retry_count,
            rnr_retry: req.rnr_retry_count,
        };
        self.answered = true;
        if let Err(e) = bring_up(&drv, q, &a) {
            drv.cm_reject(id, reason::NO_QP);
            drv.gsi_pump(Instant::now());
            return Err(e);
        }
        let rep = RepParams {
            qpn: q.qpn,
            starting_psn: rq_psn,
            responder_resources: clamp_u8(a.ird),
            initiator_depth: clamp_u8(a.ord),
            rnr_retry_count: 7,
            srq: q.has_srq(),
            private_data: params.private_data.clone(),
        };
        drv.bind_qp(id, q.qpn);
        q.awaiting_rtu
            .store(true, std::sync::atomic::Ordering::Release);
        let (_, (), slot) = drv.cm_call(|g| {
            g.cm.accept(Instant::now(), id, &rep)?;
            Ok((id, ()))
        })?;
        Ok(Answer::Wait(AcceptWait {
            id,
            slot,
            peer_qpn: req.qpn,
            pmtu: a.pmtu,
            ird: a.ird,
            ord: a.ord,
        }))
    }

    /// `rdma_reject`: REJ (consumer reject) or SIDR_REP (reject) with `private_data`.
    pub(crate) fn reject(&mut self, private_data: &[u8]) -> Result<(), Error> {
        if self.answered {
            return Ok(());
        }
        let max = match self.p.kind {
            PendingKind::Conn(_) => REJ_PRIVATE_LEN,
            PendingKind::Sidr => SIDR_REP_PRIVATE_LEN,
        };
        check_len(
            private_data,
            max,
            "RoCE private data is at most 148 octets in a reject",
        )?;
        self.answered = true;
        self.drv
            .refuse(self.p.id, &self.p.kind, CONSUMER, private_data);
        self.drv.gsi_pump(Instant::now());
        Ok(())
    }

    fn refuse(mut self) {
        let _ = self.reject(&[]);
    }
}

impl Drop for RoceRequest {
    fn drop(&mut self) {
        let _ = self.reject(&[]);
    }
}
