//! Connection management over TCP (the iWARP side of `rdma_cm`): [`Qp::connect`],
//! [`Listener`] and [`ConnRequest`], with MPA negotiation (RFC 5044 §7.1, RFC 6581) run by
//! the progress thread.
//!
//! Defaults follow Linux rdma_cm over siw: MPA revision 2 with the IRD/ORD word, CRC only
//! when asked (either side asking turns it on), no Markers, client-server mode. Our
//! responder sends no FPDU before the initiator's first one (RFC 5044 §7.1.2 r4, MPA-73),
//! unless [`ListenParams::early_fpdus`] asks for siw's behaviour (FPDUs right after the
//! Reply; our initiator takes them, as siw's does). Peer-to-peer mode (RFC 6581) with a
//! zero-length RDMA Write as the RTR is available on both sides: use it when the
//! responder's application may send first.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use softrdma_iwarp::rdmap::{MAX_MULPDU, MIN_MULPDU};
use softrdma_iwarp::startup::{
    DEFAULT_TIMEOUT, MAX_IRD_ORD, Negotiated, PeerParams, Rtr, RtrSet, Startup, StartupConfig,
    StartupError,
};
use softrdma_wire::mpa::{self, MAX_PRIVATE_DATA, REV_2};

use crate::Error;
use crate::device::{Context, CtxShared};
use crate::driver::Cmd;
use crate::qp::{Qp, QpState};

/// EMSS assumed when `TCP_MAXSEG` cannot be read: an Ethernet MTU less IPv4 and TCP headers.
pub const FALLBACK_EMSS: u32 = 1460;

/// Extra time a blocking call waits beyond the MPA timeout before giving up on the
/// progress thread (a safety net, not a protocol timer).
const REPLY_GRACE: Duration = Duration::from_secs(5);

/// How large the FPDUs this side sends may be (MULPDU, RFC 5044 §4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FpduSize {
    /// No larger than the connection's MSS (`TCP_MAXSEG`): what hardware peers need.
    #[default]
    PathMss,
    /// The largest MULPDU (64768 octets) whatever the MSS: fewer, larger FPDUs for soft
    /// peers.
    Largest,
    /// This MULPDU (clamped to 128..=64768).
    Mulpdu(u16),
}

impl FpduSize {
    /// The MULPDU for a connection with `emss` and Markers on transmit or not.
    pub fn mulpdu(self, emss: u32, markers: bool) -> u16 {
        match self {
            FpduSize::PathMss => mpa::mulpdu(emss, markers),
            FpduSize::Largest => MAX_MULPDU,
            FpduSize::Mulpdu(m) => m.clamp(MIN_MULPDU, MAX_MULPDU),
        }
    }
}

/// How [`Qp::connect`] negotiates (`rdma_conn_param` plus the MPA knobs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// Private data for the responder (at most 508 octets with revision 2, 512 with 1).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads we serve at a time (`responder_resources`), at most 16383.
    pub ird: u16,
    /// Outbound RDMA Reads we keep outstanding (`initiator_depth`), at most 16383.
    pub ord: u16,
    /// MPA revision, 1 or 2.
    pub rev: u8,
    /// Ask for CRC32c (on if either side asks).
    pub crc: bool,
    /// Ask for Markers in the stream we receive.
    pub markers: bool,
    /// RFC 6581 peer-to-peer mode: our first FPDU is a zero-length RDMA Write (RTR), after
    /// which the responder may send.
    pub p2p: bool,
    /// FPDU size policy.
    pub fpdu: FpduSize,
    /// Bound on TCP connect plus MPA negotiation.
    pub timeout: Duration,
}

impl Default for ConnectParams {
    /// No private data, IRD = ORD = 16, revision 2, no CRC, no Markers, client-server,
    /// MSS-sized FPDUs, 10 s.
    fn default() -> ConnectParams {
        ConnectParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            rev: REV_2,
            crc: false,
            markers: false,
            p2p: false,
            fpdu: FpduSize::PathMss,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// What a listener's MPA responder takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenParams {
    /// Highest MPA revision taken (2 also answers revision 1 requests with revision 1).
    pub rev: u8,
    /// Ask for CRC32c (on if either side asks).
    pub crc: bool,
    /// Ask for Markers in the stream we receive.
    pub markers: bool,
    /// Take RFC 6581 peer-to-peer requests (RTR: zero-length Write or Read).
    pub p2p: bool,
    /// Client-server mode: send FPDUs right after the Reply instead of waiting for the
    /// initiator's first FPDU, as Linux siw does. Breaks RFC 5044 §7.1.2 r4 (MPA-73),
    /// which hardware initiators may rely on; off by default.
    pub early_fpdus: bool,
    /// Bound on the wait for an MPA Request after the TCP accept.
    pub timeout: Duration,
    /// TCP listen backlog.
    pub backlog: u32,
}

impl Default for ListenParams {
    fn default() -> ListenParams {
        ListenParams {
            rev: REV_2,
            crc: false,
            markers: false,
            p2p: true,
            early_fpdus: false,
            timeout: DEFAULT_TIMEOUT,
            backlog: 128,
        }
    }
}

impl ListenParams {
    pub(crate) fn startup_config(&self) -> StartupConfig {
        StartupConfig {
            rev: self.rev,
            crc: self.crc,
            markers: self.markers,
            p2p: self.p2p.then_some(RtrSet::WRITE_OR_READ),
            timeout: self.timeout,
            ..StartupConfig::default()
        }
    }
}

/// How [`ConnRequest::accept`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// Private data for the initiator.
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads we serve at a time.
    pub ird: u16,
    /// Outbound RDMA Reads we keep outstanding (capped by the initiator's IRD).
    pub ord: u16,
    /// FPDU size policy.
    pub fpdu: FpduSize,
}

impl Default for AcceptParams {
    fn default() -> AcceptParams {
        AcceptParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            fpdu: FpduSize::PathMss,
        }
    }
}

/// An established connection's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Our address.
    pub local_addr: SocketAddr,
    /// The peer's address.
    pub peer_addr: SocketAddr,
    /// What MPA negotiated (revision, CRC, Markers per direction, IRD, ORD, RTR, the
    /// peer's private data).
    pub negotiated: Negotiated,
    /// The connection's effective MSS.
    pub emss: u32,
    /// The largest ULPDU we send.
    pub mulpdu: u16,
}

fn check_private_data(rev: u8, len: usize) -> Result<(), Error> {
    let limit = if rev == REV_2 {
        MAX_PRIVATE_DATA - 4
    } else {
        MAX_PRIVATE_DATA
    };
    if len > limit {
        return Err(Error::Startup(StartupError::PrivateDataTooLong {
            len,
            limit,
        }));
    }
    Ok(())
}

/// TCP settings of every connection: no Nagle delay; the EMSS for the MULPDU.
pub(crate) fn prepare_stream(stream: &TcpStream) -> Result<u32, Error> {
    stream.set_nodelay(true)?;
    let emss = socket2::SockRef::from(stream)
        .tcp_mss()
        .ok()
        .filter(|&m| m > 0)
        .unwrap_or(FALLBACK_EMSS);
    stream.set_nonblocking(true)?;
    Ok(emss)
}

fn wait_reply<T>(
    rx: std::sync::mpsc::Receiver<Result<T, Error>>,
    timeout: Duration,
) -> Result<T, Error> {
    match rx.recv_timeout(timeout + REPLY_GRACE) {
        Ok(r) => r,
        Err(RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(RecvTimeoutError::Disconnected) => Err(Error::ContextClosed),
    }
}

impl Qp {
    /// Connects to `addr` (`rdma_connect`): TCP connect, then MPA negotiation as initiator.
    /// Blocks until the QP is in [`QpState::Rts`] or the attempt failed; a rejection
    /// ([`Error::Rejected`]) or failure leaves the QP in `Init`, ready for another try.
    pub fn connect(
        &self,
        addr: impl ToSocketAddrs,
        params: ConnectParams,
    ) -> Result<Connection, Error> {
        if !self.shared.transition(QpState::Init, QpState::Connecting) {
            return Err(Error::InvalidState(self.state()));
        }
        let r = self.connect_inner(addr, &params);
        if r.is_err() {
            // The thread already moved it back unless the failure was local.
            self.shared.transition(QpState::Connecting, QpState::Init);
        }
        r
    }

    fn connect_inner(
        &self,
        addr: impl ToSocketAddrs,
        params: &ConnectParams,
    ) -> Result<Connection, Error> {
        let start = Instant::now();
        let cfg = StartupConfig {
            rev: params.rev,
            crc: params.crc,
            markers: params.markers,
            ird: params.ird,
            ord: params.ord,
            p2p: params.p2p.then_some(RtrSet::only(Rtr::ZeroLengthWrite)),
            private_data: params.private_data.clone(),
            timeout: params.timeout,
            allow_early_fpdus: true,
        };
        // Refuse a bad configuration before touching the network.
        Startup::initiator(cfg.clone(), start)?;
        let mut last = None;
        let mut stream = None;
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, params.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => return Err(Error::InvalidArgument("address resolved to nothing")),
        };
        let emss = prepare_stream(&stream)?;
        let remaining = params.timeout.saturating_sub(start.elapsed());
        let (reply, rx) = sync_channel(1);
        self.ctx.command(Cmd::Connect {
            qp: self.shared.clone(),
            stream: mio::net::TcpStream::from_std(stream),
            startup: StartupConfig {
                timeout: remaining,
                ..cfg
            },
            started: Instant::now(),
            emss,
            fpdu: params.fpdu,
            reply,
        })?;
        wait_reply(rx, params.timeout)
    }
}

/// A connection request a listener received: the TCP connection is up and a valid MPA
/// Request arrived. Answer with [`accept`](ConnRequest::accept) or
/// [`reject`](ConnRequest::reject); dropping it rejects without private data.
pub struct ConnRequest {
    ctx: Arc<CtxShared>,
    req: PendingRequest,
    answered: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer_addr", &self.req.peer_addr)
            .field("params", &self.req.params)
            .finish()
    }
}

pub(crate) struct PendingRequest {
    pub(crate) token: mio::Token,
    pub(crate) local_addr: SocketAddr,
    pub(crate) peer_addr: SocketAddr,
    pub(crate) private_data: Vec<u8>,
    pub(crate) params: PeerParams,
    pub(crate) early_fpdus: bool,
}

impl ConnRequest {
    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.req.peer_addr
    }

    /// Our address.
    pub fn local_addr(&self) -> SocketAddr {
        self.req.local_addr
    }

    /// The Request's private data (revision 2's IRD/ORD word removed).
    pub fn private_data(&self) -> &[u8] {
        &self.req.private_data
    }

    /// Revision, M, C and the revision 2 IRD/ORD word of the Request.
    pub fn peer_params(&self) -> PeerParams {
        self.req.params
    }

    /// The initiator's IRD and ORD (revision 2 only).
    pub fn peer_ird_ord(&self) -> Option<(u16, u16)> {
        self.req.params.rev2.map(|w| (w.ird, w.ord))
    }

    /// Accepts (`rdma_accept`) on `qp`, which must be in `Init`: the Reply goes out and the
    /// QP is in [`QpState::Rts`] when this returns.
    pub fn accept(mut self, qp: &Qp, params: AcceptParams) -> Result<Connection, Error> {
        self.answered = true;
        check_private_data(self.req.params.rev, params.private_data.len())?;
        if params.ird > MAX_IRD_ORD || params.ord > MAX_IRD_ORD {
            return Err(Error::InvalidArgument("IRD and ORD are 14-bit values"));
        }
        if !Arc::ptr_eq(&qp.ctx, &self.ctx) {
            return Err(Error::InvalidArgument("QP of another context"));
        }
        if !qp.shared.transition(QpState::Init, QpState::Connecting) {
            let _ = self.ctx.command(Cmd::Reject {
                token: self.req.token,
                private_data: Vec::new(),
            });
            return Err(Error::InvalidState(qp.state()));
        }
        let (reply, rx) = sync_channel(1);
        let r = self
            .ctx
            .command(Cmd::Accept {
                token: self.req.token,
                qp: qp.shared.clone(),
                private_data: params.private_data,
                ird: params.ird,
                ord: params.ord,
                fpdu: params.fpdu,
                early_fpdus: self.req.early_fpdus,
                reply,
            })
            .and_then(|()| wait_reply(rx, Duration::ZERO));
        if r.is_err() {
            qp.shared.transition(QpState::Connecting, QpState::Init);
        }
        r
    }

    /// Rejects (`rdma_reject`): a Reply with R=1 and `private_data` goes out, then the TCP
    /// connection is closed.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), Error> {
        self.answered = true;
        check_private_data(self.req.params.rev, private_data.len())?;
        self.ctx.command(Cmd::Reject {
            token: self.req.token,
            private_data: private_data.to_vec(),
        })
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.ctx.command(Cmd::Reject {
                token: self.req.token,
                private_data: Vec::new(),
            });
        }
    }
}

pub(crate) struct ListenerShared {
    pub(crate) params: ListenParams,
    queue: Mutex<VecDeque<PendingRequest>>,
    cond: Condvar,
    closed: AtomicBool,
}

impl ListenerShared {
    pub(crate) fn push(&self, req: PendingRequest) {
        self.queue.lock().push_back(req);
        self.cond.notify_all();
    }

    pub(crate) fn drain(&self) -> Vec<PendingRequest> {
        self.queue.lock().drain(..).collect()
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.cond.notify_all();
    }
}

/// A TCP listener for iWARP connections (`rdma_listen`). The progress thread accepts TCP
/// connections and runs MPA as responder; requests surface through
/// [`accept`](Listener::accept). Closed on drop.
pub struct Listener {
    ctx: Arc<CtxShared>,
    shared: Arc<ListenerShared>,
    token: mio::Token,
    local_addr: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` with [`ListenParams::default`].
    pub fn bind(ctx: &Context, addr: impl ToSocketAddrs) -> Result<Listener, Error> {
        Listener::bind_with(ctx, addr, ListenParams::default())
    }

    /// Listens on `addr` with `params`.
    pub fn bind_with(
        ctx: &Context,
        addr: impl ToSocketAddrs,
        params: ListenParams,
    ) -> Result<Listener, Error> {
        // Refuse a bad configuration now rather than at each request.
        Startup::responder(params.startup_config(), Instant::now())?;
        let mut last = None;
        let mut bound = None;
        for a in addr.to_socket_addrs()? {
            let domain = socket2::Domain::for_address(a);
            let sock =
                socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
            sock.set_reuse_address(true)?;
            match sock
                .bind(&a.into())
                .and_then(|()| sock.listen(params.backlog.min(i32::MAX as u32) as i32))
            {
                Ok(()) => {
                    bound = Some(sock);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let sock = match (bound, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => return Err(Error::InvalidArgument("address resolved to nothing")),
        };
        sock.set_nonblocking(true)?;
        let std_listener: std::net::TcpListener = sock.into();
        let local_addr = std_listener.local_addr()?;
        let shared = Arc::new(ListenerShared {
            params,
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        let token = ctx.shared.token();
        ctx.shared.command(Cmd::Listen {
            token,
            listener: mio::net::TcpListener::from_std(std_listener),
            shared: shared.clone(),
        })?;
        Ok(Listener {
            ctx: ctx.shared.clone(),
            shared,
            token,
            local_addr,
        })
    }

    /// The bound address (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next connection request, without blocking.
    pub fn try_accept(&self) -> Option<ConnRequest> {
        let req = self.shared.queue.lock().pop_front()?;
        Some(self.wrap(req))
    }

    /// Blocks for the next connection request (`rdma_get_request`).
    pub fn accept(&self) -> Result<ConnRequest, Error> {
        self.accept_until(None)
    }

    /// Blocks at most `timeout` for the next connection request.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<ConnRequest, Error> {
        self.accept_until(Some(Instant::now() + timeout))
    }

    fn accept_until(&self, deadline: Option<Instant>) -> Result<ConnRequest, Error> {
        let mut q = self.shared.queue.lock();
        loop {
            if let Some(req) = q.pop_front() {
                drop(q);
                return Ok(self.wrap(req));
            }
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(Error::ContextClosed);
            }
            match deadline {
                None => self.shared.cond.wait(&mut q),
                Some(d) => {
                    if self.shared.cond.wait_until(&mut q, d).timed_out() && q.is_empty() {
                        return Err(Error::Timeout);
                    }
                }
            }
        }
    }

    fn wrap(&self, req: PendingRequest) -> ConnRequest {
        ConnRequest {
            ctx: self.ctx.clone(),
            req,
            answered: false,
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.close();
        let _ = self.ctx.command(Cmd::Unlisten(self.token));
    }
}
