//! The harness of the integration tests (as quinn's tests/util.rs `Pair`): two [`Side`]s —
//! context, protection domain, completion queue(s) and channel, QPs and a region — opened
//! by a [`Setup`] on either transport and connected over loopback ([`Pair`]); waiting for
//! completions, events and conditions; and the checks the tests repeat. Each test binary
//! compiles this module and uses part of it.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::LazyLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma::iwarp::QpEvent;
use softrdma::roce;
use softrdma::roce::QpAttr;
use softrdma::roce::RoceConfig;
use softrdma::*;
use softrdma_testkit::pattern;

/// Safety net for every blocking wait, never a synchronisation: 60 s, or
/// `SOFTRDMA_TEST_TIMEOUT` seconds (runs under valgrind are ~50 times slower).
pub static TIMEOUT: LazyLock<Duration> = LazyLock::new(|| {
    let secs = std::env::var("SOFTRDMA_TEST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
});

/// Both transports, for tests that run the same steps over each.
pub const BOTH: [Transport; 2] = [Transport::Iwarp, Transport::Roce];

/// Every access a test's region may need.
pub const ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC)
    .union(Access::MW_BIND);

/// RoCE path MTU of a pair brought up by [`Bringup::Modify`].
pub const PMTU: usize = 1024;
/// The Q_Key of UD QPs brought up by [`Bringup::Modify`].
pub const QKEY: u32 = 0x1111_1111;
/// The send PSNs [`Bringup::Modify`] starts the server's and the client's QPs at.
pub const PSNS: [u32; 2] = [0x12_3456, 0xFF_FFF0];

/// A server's and a client's device over loopback: two iWARP devices, or RoCEv2 on
/// 127.0.0.1 and 127.0.0.2 sharing one ephemeral UDP port (RoCE peers are sent to at the
/// sender's own port).
pub fn devices(t: Transport) -> (Device, Device) {
    match t {
        Transport::Iwarp => (Device::tcp(), Device::tcp()),
        Transport::Roce => {
            let c = RoceConfig::sharing_a_port(&LOOPBACK).unwrap();
            (Device::roce(c[0]), Device::roce(c[1]))
        }
    }
}

/// The server's and the client's RoCE address.
const LOOPBACK: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
];

/// How a pair's QPs reach RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bringup {
    /// The connection manager: the server listens, each client QP connects and the server
    /// accepts it on its QP of the same index (iWARP: MPA over TCP; RoCE: the IB CM).
    Cm,
    /// RoCE only, each context on a port of its own: `set_remote` and `modify` through
    /// Init, RTR and RTS facing each other (RC, UC or UD), as ibv_rc_pingpong does after
    /// its exchange.
    Modify,
}

/// Setters of [`Setup`]'s fields: `name: field: Type`.
macro_rules! knobs {
    ($($(#[$doc:meta])* $name:ident: $field:ident: $ty:ty,)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, v: $ty) -> Self {
                self.$field = v;
                self
            }
        )*
    };
}

/// What a [`Pair`] (or a lone [`Side`]) is made of; every knob has the common default.
pub struct Setup {
    pub t: Transport,
    addrs: [IpAddr; 2],
    roce: Box<dyn Fn(&mut RoceConfig)>,
    client_limits: Option<DeviceLimits>,
    qp_type: QpType,
    cap: QpCap,
    qps: usize,
    srq: Option<SrqAttr>,
    channel: bool,
    split_cqs: bool,
    cqe: usize,
    mr_len: usize,
    bringup: Bringup,
    cp: ConnectParams,
    lp: ListenParams,
    ap: AcceptParams,
}

/// A [`Setup`] on `t`.
pub fn setup(t: Transport) -> Setup {
    Setup::new(t)
}

impl Setup {
    /// One RC QP a side on one CQ of 4096 entries, no channel, a 64 KiB region, connected
    /// through the connection manager with default parameters.
    pub fn new(t: Transport) -> Setup {
        Setup {
            t,
            addrs: LOOPBACK,
            roce: Box::new(|_| {}),
            client_limits: None,
            qp_type: QpType::Rc,
            cap: QpCap::default(),
            qps: 1,
            srq: None,
            channel: false,
            split_cqs: false,
            cqe: 4096,
            mr_len: 64 << 10,
            bringup: Bringup::Cm,
            cp: ConnectParams::default(),
            lp: ListenParams::default(),
            ap: AcceptParams::default(),
        }
    }

    knobs! {
        /// The client's parameters (each QP's).
        connect: cp: ConnectParams,
        /// The server's listener's parameters.
        listen: lp: ListenParams,
        /// The server's accept's parameters.
        accept: ap: AcceptParams,
        cap: cap: QpCap,
        qp_type: qp_type: QpType,
        /// `n` QPs a side.
        qps: qps: usize,
        /// Entries of each CQ.
        cqe: cqe: usize,
        /// Octets of each side's region ([`Side::mr`]).
        mr_len: mr_len: usize,
        bringup: bringup: Bringup,
    }

    /// The server's QPs take their receives from a shared receive queue ([`Pair::srq`]).
    pub fn srq(mut self, attr: SrqAttr) -> Self {
        self.srq = Some(attr);
        self
    }

    /// Each side's CQs report to a completion channel, and [`Side::wait`] blocks on it.
    pub fn channel(mut self) -> Self {
        self.channel = true;
        self
    }

    /// Receive completions go to a CQ of their own ([`Side::rcq`]).
    pub fn split_cqs(mut self) -> Self {
        self.split_cqs = true;
        self
    }

    /// RoCE: the server's and the client's address (default 127.0.0.1 and 127.0.0.2).
    pub fn addrs(mut self, server: IpAddr, client: IpAddr) -> Self {
        self.addrs = [server, client];
        self
    }

    /// RoCE: adjusts both contexts' configuration (its address and port are the harness's).
    pub fn roce(mut self, f: impl Fn(&mut RoceConfig) + 'static) -> Self {
        self.roce = Box::new(f);
        self
    }

    /// The client's device holds its contexts to `limits`.
    pub fn client_limits(mut self, limits: DeviceLimits) -> Self {
        self.client_limits = Some(limits);
        self
    }

    fn roce_config(&self, addr: IpAddr) -> RoceConfig {
        let mut c = RoceConfig::new(addr);
        (self.roce)(&mut c);
        c
    }

    /// The server's and the client's context. RoCE: one UDP port for both under the
    /// connection manager (peers are sent to at the sender's own port), an ephemeral port
    /// each for [`Bringup::Modify`] (whose QPs are told their peer's).
    pub fn contexts(&self) -> (Context, Context) {
        let limit = |d: Device| match self.client_limits {
            Some(l) => d.with_limits(l),
            None => d,
        };
        match (self.t, self.bringup) {
            (Transport::Iwarp, _) => (
                Device::tcp().open().unwrap(),
                limit(Device::tcp()).open().unwrap(),
            ),
            (Transport::Roce, Bringup::Cm) if self.client_limits.is_none() => {
                let cfgs = self.addrs.map(|a| self.roce_config(a));
                let mut c = Device::open_sharing_a_port(&cfgs).unwrap();
                let client = c.pop().unwrap();
                (c.pop().unwrap(), client)
            }
            (Transport::Roce, Bringup::Cm) => {
                let ports = RoceConfig::sharing_a_port(&self.addrs).unwrap();
                let [s, c] = [0, 1].map(|i| {
                    Device::roce(RoceConfig {
                        port: ports[i].port,
                        ..self.roce_config(self.addrs[i])
                    })
                });
                (s.open().unwrap(), limit(c).open().unwrap())
            }
            (Transport::Roce, Bringup::Modify) => {
                let [s, c] = self.addrs.map(|a| {
                    Device::roce(RoceConfig {
                        port: 0, // an ephemeral port: tests run in parallel on one host
                        ..self.roce_config(a)
                    })
                });
                (s.open().unwrap(), limit(c).open().unwrap())
            }
        }
    }

    /// A lone side on a context of its own (the server's address, an ephemeral port).
    pub fn side(&self) -> Side {
        let ctx = match self.t {
            Transport::Iwarp => Context::open().unwrap(),
            Transport::Roce => Context::open_roce(RoceConfig {
                port: 0,
                ..self.roce_config(self.addrs[0])
            })
            .unwrap(),
        };
        Side::open(ctx, self, None)
    }

    /// Both sides, not connected yet: what a test posts now is posted before the
    /// connection exists; [`Pair::connect`] connects them.
    pub fn open(&self) -> Pair {
        let (sctx, cctx) = self.contexts();
        let spd = sctx.alloc_pd();
        let srq = self.srq.map(|a| spd.create_srq(a).unwrap());
        let server = Side::with_pd(sctx, spd, self, srq.as_ref());
        let client = Side::open(cctx, self, None);
        Pair {
            client,
            server,
            srq,
            conns: Vec::new(),
            bringup: self.bringup,
            cp: self.cp.clone(),
            lp: self.lp.clone(),
            ap: self.ap.clone(),
        }
    }

    /// Both sides, connected.
    pub fn pair(&self) -> Pair {
        let mut p = self.open();
        p.connect();
        p
    }
}

/// One end: its context, protection domain, CQs (and channel), QPs and a region, fields
/// dropped in order (QPs before what they use).
pub struct Side {
    pub qps: Vec<Qp>,
    /// A region of [`Setup::mr_len`] octets with [`ACCESS`].
    pub mr: Mr,
    /// Send completions, and receive completions unless [`Setup::split_cqs`].
    pub cq: Cq,
    /// Receive completions (the same queue as `cq` unless [`Setup::split_cqs`]).
    pub rcq: Cq,
    pub ch: Option<CompletionChannel>,
    pub pd: Pd,
    pub ctx: Context,
}

impl Side {
    /// A side on `ctx` as `s` describes it, its QPs on `srq` if given.
    pub fn open(ctx: Context, s: &Setup, srq: Option<&Srq>) -> Side {
        let pd = ctx.alloc_pd();
        Side::with_pd(ctx, pd, s, srq)
    }

    fn with_pd(ctx: Context, pd: Pd, s: &Setup, srq: Option<&Srq>) -> Side {
        let ch = s.channel.then(|| ctx.create_comp_channel().unwrap());
        let cq = ctx.create_cq(s.cqe, ch.as_ref()).unwrap();
        let rcq = if s.split_cqs {
            ctx.create_cq(s.cqe, ch.as_ref()).unwrap()
        } else {
            cq.clone()
        };
        let qps = (0..s.qps)
            .map(|_| {
                pd.create_qp(QpInitAttr {
                    srq: srq.cloned(),
                    cap: s.cap,
                    ..QpInitAttr::typed(s.qp_type, &cq, &rcq)
                })
                .unwrap()
            })
            .collect();
        let mr = pd.alloc_mr(s.mr_len, ACCESS).unwrap();
        Side {
            qps,
            mr,
            cq,
            rcq,
            ch,
            pd,
            ctx,
        }
    }

    /// The first QP.
    pub fn qp(&self) -> &Qp {
        &self.qps[0]
    }

    /// Posts `wr` on the first QP's send queue, which takes it.
    pub fn post_send(&self, wr: SendWr) {
        self.qp().post_send(wr).unwrap();
    }

    /// Posts `wr` on the first QP's receive queue, which takes it.
    pub fn post_recv(&self, wr: RecvWr) {
        self.qp().post_recv(wr).unwrap();
    }

    /// A new region of `len` octets with [`ACCESS`].
    pub fn alloc_mr(&self, len: usize) -> Mr {
        self.pd.alloc_mr(len, ACCESS).unwrap()
    }

    /// Blocks until `n` completions came to `cq` (on the channel if the side has one).
    pub fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        self.wait_on(&self.cq, n)
    }

    /// Blocks until `n` completions came to `rcq`.
    pub fn wait_recv(&self, n: usize) -> Vec<WorkCompletion> {
        self.wait_on(&self.rcq, n)
    }

    fn wait_on(&self, cq: &Cq, n: usize) -> Vec<WorkCompletion> {
        match &self.ch {
            Some(ch) => wait_channel(cq, ch, n),
            None => wait(cq, n),
        }
    }

    /// `len` octets of the region at `off`.
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mr.copy_out(off, &mut v).unwrap();
        v
    }

    /// The native-endian word at `off` of the region.
    pub fn word(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.bytes(off, 8).try_into().unwrap())
    }

    /// RoCE: the context's UDP endpoint.
    pub fn addr(&self) -> SocketAddr {
        self.ctx.roce_local_addr().unwrap()
    }

    /// The first QP event `f` picks, from the context's async events.
    pub fn qp_event<T>(&self, f: impl Fn(QpEvent) -> Option<T>) -> T {
        let deadline = Instant::now() + *TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.ctx.get_async_event(left) {
                Some(AsyncEvent::Qp { event, .. }) => {
                    if let Some(t) = f(event) {
                        return t;
                    }
                }
                Some(_) => {}
                None => panic!("no such QP event"),
            }
        }
    }

    /// The context's next asynchronous event other than a connection's establishment.
    pub fn next_event(&self) -> Option<AsyncEvent> {
        loop {
            match self.ctx.get_async_event(*TIMEOUT) {
                Some(AsyncEvent::Established { .. }) => continue,
                other => return other,
            }
        }
    }

    /// Waits for the context's next `Disconnected` event, passing over others: it is
    /// `qp_num`'s.
    pub fn wait_disconnected(&self, qp_num: u32) {
        let deadline = Instant::now() + *TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.ctx.get_async_event(left) {
                Some(AsyncEvent::Disconnected { qp_num: n }) => return assert_eq!(n, qp_num),
                Some(_) => {}
                None => panic!("no Disconnected event for QP {qp_num}"),
            }
        }
    }

    /// Writes `pattern(len, seed)` from the region at `at` to `to` (a remote key, the
    /// region it opens and an offset there), on `qp`, then reads the same octets back
    /// behind it into the region at `back` (the Read's response comes after the Write is
    /// placed: an iWARP Write's own completion only says it left). Both complete
    /// successfully; the octets are in both places.
    pub fn write_read_back(
        &self,
        qp: &Qp,
        to: (Key, &Mr, usize),
        at: usize,
        back: usize,
        len: usize,
        seed: u64,
    ) {
        let (rkey, dst, off) = to;
        let data = pattern(len, seed);
        self.mr.copy_in(at, &data).unwrap();
        qp.post_send(SendWr::write(
            1,
            [self.mr.sge(at, len as u32)],
            rkey,
            dst.addr(off),
        ))
        .unwrap();
        qp.post_send(SendWr::read(
            2,
            Some(self.mr.sge(back, len as u32)),
            rkey,
            dst.addr(off),
        ))
        .unwrap();
        let wcs = self.wait(2);
        assert_ok(&wcs[0], 1, WcOpcode::RdmaWrite, len);
        assert_ok(&wcs[1], 2, WcOpcode::RdmaRead, len);
        let mut got = vec![0; len];
        dst.copy_out(off, &mut got).unwrap();
        assert!(got == data, "the {len} octets written");
        assert!(self.bytes(back, len) == data, "the {len} octets read back");
    }
}

/// Two sides, server and client, and what connecting them returned.
pub struct Pair {
    pub client: Side,
    pub server: Side,
    /// The server's shared receive queue ([`Setup::srq`]).
    pub srq: Option<Srq>,
    /// Each QP's connection, as (client's `connect`, server's `accept`) returned it.
    pub conns: Vec<(ConnectionInfo, ConnectionInfo)>,
    bringup: Bringup,
    cp: ConnectParams,
    lp: ListenParams,
    ap: AcceptParams,
}

impl Pair {
    /// Connects the sides' QPs, each client QP to the server's of the same index; they are
    /// in RTS after.
    pub fn connect(&mut self) {
        match self.bringup {
            Bringup::Cm => {
                let (s, c) = (&self.server.qps, &self.client.qps);
                let listener =
                    Listener::bind_with(&self.server.ctx, "127.0.0.1:0", self.lp.clone());
                self.conns = connect_qps(
                    &listener.unwrap(),
                    &s.iter().collect::<Vec<_>>(),
                    &c.iter().collect::<Vec<_>>(),
                    &self.cp,
                    &self.ap,
                );
            }
            Bringup::Modify => {
                for (me, peer, psn, peer_psn) in [
                    (&self.server, &self.client, PSNS[0], PSNS[1]),
                    (&self.client, &self.server, PSNS[1], PSNS[0]),
                ] {
                    for (qp, pqp) in me.qps.iter().zip(&peer.qps) {
                        modify_to_rts(qp, Some((peer.addr(), pqp.qp_num())), psn, peer_psn);
                    }
                }
            }
        }
        for qp in self.server.qps.iter().chain(&self.client.qps) {
            assert_eq!(qp.state(), QpState::Rts, "QP {}", qp.qp_num());
        }
    }
}

/// `qp` to RTS through Init and RTR: a connected QP (RC, UC) facing `peer` (its address
/// and QP number) with our send PSN `psn` and its `peer_psn`; a UD QP with [`QKEY`].
pub fn modify_to_rts(qp: &Qp, peer: Option<(SocketAddr, u32)>, psn: u32, peer_psn: u32) {
    let ty = qp.qp_type();
    let conn = ty != QpType::Ud;
    let rc = ty == QpType::Rc;
    if conn {
        qp.set_remote(peer.unwrap().0).unwrap();
    }
    qp.modify(&QpAttr {
        state: Some(roce::QpState::Init),
        qkey: (!conn).then_some(QKEY),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(roce::QpState::Rtr),
        pmtu: conn.then_some(PMTU as u32),
        dest_qp: peer.filter(|_| conn).map(|p| p.1),
        rq_psn: conn.then_some(peer_psn),
        max_dest_rd_atomic: rc.then_some(16),
        min_rnr_timer: rc.then_some(12),
        ..QpAttr::default()
    })
    .unwrap();
    qp.modify(&QpAttr {
        state: Some(roce::QpState::Rts),
        sq_psn: Some(psn),
        timeout: rc.then_some(14),
        retry_cnt: rc.then_some(7),
        rnr_retry: rc.then_some(7),
        max_rd_atomic: rc.then_some(16),
        ..QpAttr::default()
    })
    .unwrap();
}

/// Connects `client[i]` to `listener` and accepts it on `server[i]`, one after the other
/// (the next connect once the accept returned), with `cp` and `ap`. iWARP: both ends
/// agree on CRC and on Markers each way.
pub fn connect_qps(
    listener: &Listener,
    server: &[&Qp],
    client: &[&Qp],
    cp: &ConnectParams,
    ap: &AcceptParams,
) -> Vec<(ConnectionInfo, ConnectionInfo)> {
    let addr = listener.local_addr();
    let (tx, rx) = mpsc::channel();
    let conns = std::thread::scope(|s| {
        s.spawn(move || {
            for qp in server {
                let req = listener.accept_timeout(*TIMEOUT).unwrap();
                tx.send(req.accept(qp, ap.clone()).unwrap()).unwrap();
            }
        });
        client
            .iter()
            .map(|qp| {
                let cc = qp.connect(addr, cp.clone()).unwrap();
                (cc, rx.recv_timeout(*TIMEOUT).unwrap())
            })
            .collect::<Vec<_>>()
    });
    for (cc, sc) in &conns {
        if let (Some(c), Some(s)) = (cc.iwarp(), sc.iwarp()) {
            let (c, s) = (&c.negotiated, &s.negotiated);
            assert_eq!(c.crc, s.crc);
            assert_eq!((c.markers_tx, c.markers_rx), (s.markers_rx, s.markers_tx));
        }
    }
    conns
}

/// Blocks until `n` completions came to `cq`; panics with those that did at the timeout.
pub fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    cq.wait(n, n, *TIMEOUT, &mut out)
        .unwrap_or_else(|e| panic!("waiting for {n} completions, got {out:?}: {e}"));
    out
}

/// Blocks on the completion channel `ch` until `n` completions were polled from `cq`.
pub fn wait_channel(cq: &Cq, ch: &CompletionChannel, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + *TIMEOUT;
    let mut out = Vec::with_capacity(n);
    loop {
        cq.poll(n - out.len(), &mut out);
        if out.len() == n {
            return out;
        }
        // Arm, then poll again: a completion that raced the arming is not lost.
        cq.req_notify(false);
        cq.poll(n - out.len(), &mut out);
        if out.len() == n {
            return out;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = ch.get_cq_event(Some(left));
        assert!(
            ev.is_some(),
            "timed out with {} of {n} completions: {out:?}",
            out.len()
        );
    }
}

/// Waits (yielding) until `f` holds, failing after the safety net.
pub fn until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + *TIMEOUT;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {:?}", *TIMEOUT);
        std::thread::yield_now();
    }
}

/// `wc` completed `wr_id` successfully, as `opcode`, with `len` octets.
pub fn assert_ok(wc: &WorkCompletion, wr_id: u64, opcode: WcOpcode, len: usize) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
        (wr_id, WcStatus::Success, opcode, len),
        "{wc:?}"
    );
}

/// `mr` holds `pattern(len, seed)` at `off`.
pub fn assert_holds(mr: &Mr, off: usize, len: usize, seed: u64, what: impl std::fmt::Display) {
    let mut got = vec![0u8; len];
    mr.copy_out(off, &mut got).unwrap();
    assert!(
        got == pattern(len, seed),
        "{what}: {len} octets at {off} differ"
    );
}

/// Every completion of `wcs` a success.
pub fn assert_all_ok(wcs: &[WorkCompletion], what: impl std::fmt::Debug) {
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::Success),
        "{what:?}: {wcs:?}"
    );
}

/// Completions as (id, status, opcode), for comparing.
pub fn summary(w: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode)> {
    w.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}

/// `to` posts a receive `wr_id` for `room` octets at `dst` of its region.
pub fn post_recv_at(to: &Side, dst: usize, room: usize, wr_id: u64) {
    to.qp()
        .post_recv(RecvWr::new(wr_id, [to.mr.sge(dst, room as u32)]))
        .unwrap();
}

/// `from` sends `len` octets of its region at `at` (`pattern(len, seed)`, written there
/// first) to a receive `to` posts at `dst` of its region (room for `room` octets): see
/// [`sent_to_posted`].
pub fn send_recv(
    from: (&Side, usize),
    to: (&Side, usize),
    len: usize,
    room: usize,
    seed: u64,
) -> WorkCompletion {
    post_recv_at(to.0, to.1, room, seed);
    sent_to_posted(from, to, len, seed)
}

/// `from` sends `pattern(len, seed)` from its region at `at`, as request `seed`, to the
/// receive `seed` that `to` posted at `dst`: both complete successfully, each with `len`
/// octets, and the octets arrived. Returns the receive's completion.
pub fn sent_to_posted(
    from: (&Side, usize),
    to: (&Side, usize),
    len: usize,
    seed: u64,
) -> WorkCompletion {
    let ((a, at), (b, dst)) = (from, to);
    let data = pattern(len, seed);
    a.mr.copy_in(at, &data).unwrap();
    a.qp()
        .post_send(SendWr::send(seed, [a.mr.sge(at, len as u32)]))
        .unwrap();
    let r = b.wait_recv(1)[0];
    assert_ok(&r, seed, WcOpcode::Recv, len);
    assert!(b.bytes(dst, len) == data, "Send of {len} octets");
    assert_ok(&a.wait(1)[0], seed, WcOpcode::Send, len);
    r
}
