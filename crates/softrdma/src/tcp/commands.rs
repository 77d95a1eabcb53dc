//! The connection manager's side of the iWARP driver: the commands of the API (listen,
//! dial, accept, reject, disconnect, ...), connects that finish and accepts.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Interest, Token};
use softrdma_iwarp::connection::{
    Connection as IwConn, ConnectionConfig, DEFAULT_RX_DIRECT_MIN, FpduSizing, NUDGE_AFTER,
};
use softrdma_iwarp::rdmap::{MAX_MULPDU, QpConfig};
use softrdma_iwarp::startup::Role;
use softrdma_memory::{PdId, QpId};

use super::conn::{Conn, WriteSide, touch};
use super::progress::{Dialing, Driver, Listening};

use super::{Cmd, DeviceStats, HalfOpen, TcpQp, TcpShared, emss, prepare_stream};
use crate::Error;
use crate::connparams::FpduSize;
use crate::state::QpState;

/// An IPv4 peer seen through an IPv6 socket counts as its IPv4 address.
fn canonical_ip(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, Into::into),
        v4 => v4,
    }
}

/// Silent connections read again, at most, before one gives its place to a newcomer: a
/// bound on the work one accept can cause.
const HALF_OPEN_RECHECKS: usize = 8;

impl Driver {
    pub(super) fn commands(&mut self, ctx: &TcpShared, now: Instant) {
        let cmds = std::mem::take(&mut *ctx.cmds.lock());
        for cmd in cmds {
            self.command(ctx, cmd, now);
        }
    }

    fn command(&mut self, ctx: &TcpShared, cmd: Cmd, now: Instant) {
        match cmd {
            Cmd::Listen {
                token,
                mut listener,
                shared,
            } => {
                if self
                    .registry
                    .register(&mut listener, token, Interest::READABLE)
                    .is_ok()
                {
                    self.listeners.insert(token, Listening { listener, shared });
                    // Connections may have queued before the registration.
                    self.accept_all(ctx, token, now);
                } else {
                    shared.requests.close();
                }
            }
            Cmd::Unlisten(token, done) => {
                if let Some(mut l) = self.listeners.remove(&token) {
                    let _ = self.registry.deregister(&mut l.listener);
                    l.shared.requests.close();
                    // Requests nobody will take are rejected.
                    for req in l.shared.requests.drain() {
                        self.command(
                            ctx,
                            Cmd::Reject {
                                token: req.token,
                                private_data: Vec::new(),
                            },
                            now,
                        );
                    }
                    drop(l);
                }
                if let Some(d) = done {
                    let _ = d.try_send(());
                }
            }
            Cmd::Connect {
                qp,
                stream,
                startup,
                started,
                emss,
                fpdu,
                reply,
            } => {
                let d = Dialing {
                    stream,
                    qp,
                    startup,
                    started,
                    fpdu,
                    reply,
                };
                self.start_initiator(ctx, ctx.token(), d, emss);
            }
            Cmd::Dial {
                qp,
                addr,
                startup,
                started,
                fpdu,
                reply,
            } => {
                let token = ctx.token();
                let dialed = TcpStream::connect(addr).and_then(|mut stream| {
                    self.registry
                        .register(&mut stream, token, Interest::WRITABLE)?;
                    Ok(stream)
                });
                match dialed {
                    Ok(stream) => {
                        let d = Dialing {
                            stream,
                            qp,
                            startup,
                            started,
                            fpdu,
                            reply,
                        };
                        self.dialing.insert(token, d);
                    }
                    Err(e) => {
                        qp.transition(QpState::Connecting, QpState::Init);
                        let _ = reply.send(Err(e.into()));
                    }
                }
            }
            Cmd::Accept {
                token,
                qp,
                private_data,
                ird,
                ord,
                fpdu,
                early_fpdus,
                reply,
            } => {
                let Some(c) = touch(&mut self.conns, &mut self.touched, token) else {
                    qp.transition(QpState::Connecting, QpState::Init);
                    let _ = reply.send(Err(Error::Io(io::ErrorKind::ConnectionAborted.into())));
                    return;
                };
                // The ULP names the QP only now (rdma_accept).
                let srq = qp.srq.is_some();
                let r =
                    c.iw.set_data_path(qp_config(&qp), fpdu_sizing(fpdu), srq, early_fpdus)
                        .and_then(|()| c.iw.accept(&private_data, ird, ord));
                if let Err(e) = r {
                    c.die();
                    qp.transition(QpState::Connecting, QpState::Init);
                    let _ = reply.send(Err(e.into()));
                    return;
                }
                c.listener = None;
                self.qp_conn.insert(qp.qpn, token);
                c.qp = Some(qp);
                c.reply = Some(reply);
                // `Established`: the QP goes to RTS and the reply goes out.
                c.events(ctx);
                if let Some(reply) = c.reply.take() {
                    c.die();
                    let _ = reply.send(Err(Error::InvalidArgument("MPA accept without outcome")));
                    return;
                }
                c.service(ctx, &mut self.bufs);
            }
            Cmd::Reject {
                token,
                private_data,
            } => {
                if let Some(c) = touch(&mut self.conns, &mut self.touched, token) {
                    c.listener = None;
                    if c.iw.reject(&private_data).is_ok() {
                        c.write_side = WriteSide::CloseWhenFlushed;
                        c.discard_rx();
                        c.service(ctx, &mut self.bufs);
                    } else {
                        c.die();
                    }
                }
            }
            Cmd::Disconnect(qp) => {
                if self.abort_dial(&qp) {
                    return;
                }
                if let Some(c) = self
                    .qp_conn
                    .get(&qp.qpn)
                    .and_then(|t| touch(&mut self.conns, &mut self.touched, *t))
                {
                    c.disconnect(ctx, &mut self.bufs);
                } else if !qp.state().is_dead() {
                    qp.set_state(QpState::Closed);
                    qp.flush_orphan();
                }
            }
            Cmd::Destroy(qp) => {
                self.abort_dial(&qp);
                if let Some(c) = self
                    .qp_conn
                    .remove(&qp.qpn)
                    .and_then(|t| touch(&mut self.conns, &mut self.touched, t))
                {
                    c.disconnect(ctx, &mut self.bufs);
                    // Abortive: no waiting for the peer's FIN; but what completed sends put
                    // in the transmit buffer is still written (as a kernel socket would).
                    if c.write_side == WriteSide::CloseWhenFlushed {
                        c.abandon();
                    } else {
                        c.die();
                    }
                    c.detach_qp();
                }
                let mut sub = qp.sub.lock();
                sub.sq.clear();
                sub.rq.clear();
            }
        }
    }

    /// The TCP connection of `d` (made without blocking, or by the caller): MPA as
    /// initiator.
    fn start_initiator(&mut self, ctx: &TcpShared, token: Token, d: Dialing, emss: u32) {
        let Dialing {
            stream,
            qp,
            startup,
            started,
            fpdu,
            reply,
        } = d;
        let cfg = ConnectionConfig {
            rx_direct_min: rx_direct_min(),
            nudge_after: nudge_after(),
            fpdu: fpdu_sizing(fpdu),
            srq: qp.srq.is_some(),
            ..ConnectionConfig::new(Role::Initiator, startup, qp_config(&qp), emss)
        };
        let conn = IwConn::new(cfg, ctx.keys.clone(), started)
            .map_err(Error::from)
            .and_then(|iw| {
                Ok(Conn::new(
                    ctx,
                    &self.registry,
                    token,
                    stream,
                    iw,
                    emss,
                    true,
                )?)
            });
        match conn {
            Ok(mut c) => {
                c.reply = Some(reply);
                self.qp_conn.insert(qp.qpn, token);
                c.qp = Some(qp);
                c.service(ctx, &mut self.bufs);
                self.conns.insert(token, c);
                self.touched.push(token);
            }
            Err(e) => {
                qp.transition(QpState::Connecting, QpState::Init);
                let _ = reply.send(Err(e));
            }
        }
    }

    /// An event on a socket being connected: on to MPA once connected, or the error.
    pub(super) fn dialed(&mut self, ctx: &TcpShared, token: Token, now: Instant) {
        let Some(d) = self.dialing.get(&token) else {
            return;
        };
        // Connected: a peer address and no pending error (as after `connect(2)` polls
        // writable).
        let outcome = match d.stream.take_error() {
            Ok(Some(e)) | Err(e) => Err(e),
            Ok(None) => match d.stream.peer_addr() {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => Err(e),
            },
        };
        let Some(mut d) = self.dialing.remove(&token) else {
            return;
        };
        let _ = self.registry.deregister(&mut d.stream);
        match outcome.and_then(|()| d.stream.set_nodelay(true)) {
            Ok(()) => {
                let emss = emss(socket2::SockRef::from(&d.stream));
                d.startup.timeout = d.deadline().saturating_duration_since(now);
                d.started = now;
                self.start_initiator(ctx, token, d, emss);
            }
            Err(e) => d.fail(e.into()),
        }
    }

    /// Ends the TCP connect of `qp` if one is under way (disconnect or destroy); `true` if
    /// there was one.
    fn abort_dial(&mut self, qp: &Arc<TcpQp>) -> bool {
        let Some(t) = self
            .dialing
            .iter()
            .find_map(|(t, d)| Arc::ptr_eq(&d.qp, qp).then_some(*t))
        else {
            return false;
        };
        if let Some(mut d) = self.dialing.remove(&t) {
            let _ = self.registry.deregister(&mut d.stream);
            d.fail(Error::InvalidState(QpState::Closed));
        }
        true
    }

    pub(super) fn accept_all(&mut self, ctx: &TcpShared, token: Token, now: Instant) {
        loop {
            let Some(l) = self.listeners.get(&token) else {
                return;
            };
            let (stream, _) = match l.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ECONNABORTED and friends concern one connection; EMFILE would spin, so
                // stop until the next event.
                Err(_) => return,
            };
            let shared = l.shared.clone();
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            let std_stream: std::net::TcpStream = stream.into();
            let Ok(emss) = prepare_stream(&std_stream) else {
                continue;
            };
            // The QP and the data path's settings come with the accept.
            let cfg = ConnectionConfig {
                rx_direct_min: rx_direct_min(),
                ..ConnectionConfig::new(
                    Role::Responder,
                    shared.params.iwarp.startup_config(),
                    QpConfig::new(PdId(0), QpId(0)),
                    emss,
                )
            };
            let Ok(iw) = IwConn::new(cfg, ctx.keys.clone(), now) else {
                continue;
            };
            let t = ctx.token();
            if let Ok(mut c) = Conn::new(
                ctx,
                &self.registry,
                t,
                TcpStream::from_std(std_stream),
                iw,
                emss,
                false,
            ) {
                // Silent connections are bounded by `max_half_open` (and per source): the
                // oldest silent one makes room rather than the newcomer being refused. One
                // due to go may have sent its Request since it was accepted (a client's
                // burst of connections, all accepted before any was read: Debian's
                // cmtime opens 100 at once): read it first, and a few after it.
                let ip = canonical_ip(peer.ip());
                for _ in 0..HALF_OPEN_RECHECKS {
                    let Some(v) = HalfOpen::victim(&shared, ip, now)
                        .and_then(|old| touch(&mut self.conns, &mut self.touched, old))
                    else {
                        break;
                    };
                    v.read(ctx, &mut self.bufs, now);
                    v.service(ctx, &mut self.bufs);
                    if v.half_open.is_some() {
                        break;
                    }
                }
                let (half_open, evicted) = HalfOpen::take(&shared, t, ip, now);
                if let Some(old) = evicted
                    && let Some(v) = touch(&mut self.conns, &mut self.touched, old)
                {
                    DeviceStats::add(&ctx.stats.half_open_evicted, 1);
                    tracing::info!(peer = %v.peer, new = %peer, "TCP connection closed before its MPA Request: its place goes to a newer one");
                    v.half_open = None;
                    v.listener = None;
                    v.die();
                }
                c.listener = Some(shared);
                c.half_open = Some(half_open);
                // The Request may already be in.
                c.read(ctx, &mut self.bufs, now);
                c.service(ctx, &mut self.bufs);
                self.conns.insert(t, c);
                self.touched.push(t);
            }
        }
    }
}

/// The engine's queue sizes from the QP's capabilities; MULPDU, IRD, ORD and the RDMAP
/// version come from the MPA negotiation.
pub(super) fn qp_config(qp: &TcpQp) -> QpConfig {
    let mut cfg = QpConfig::new(qp.pd, QpId(qp.qpn));
    cfg.sq_depth = qp.cap.max_send_wr;
    let srq_attr = qp.srq.as_ref().map(|s| s.attr);
    cfg.rq_depth = srq_attr.map_or(qp.cap.max_recv_wr, |a| a.max_wr);
    cfg.max_sge = qp
        .cap
        .max_send_sge
        .max(qp.cap.max_recv_sge)
        .max(srq_attr.map_or(0, |a| a.max_sge))
        .max(1);
    cfg.max_inline = qp.cap.max_inline_data;
    cfg
}

/// The payload size from which a receive reads straight into registered memory
/// (`ConnectionConfig::rx_direct_min`): `SOFTRDMA_RX_DIRECT_MIN` (octets, or `off`) where set,
/// for tuning and for interop runs whose FPDUs are small.
pub(super) fn rx_direct_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| match std::env::var("SOFTRDMA_RX_DIRECT_MIN") {
        Ok(v) if v == "off" => usize::MAX,
        Ok(v) => v.parse().unwrap_or(DEFAULT_RX_DIRECT_MIN),
        Err(_) => DEFAULT_RX_DIRECT_MIN,
    })
}

/// How long an initiator waits for its silent peer before the nudge
/// (`ConnectionConfig::nudge_after`): `SOFTRDMA_NUDGE_AFTER_MS` (milliseconds, or `off`) where
/// set, for interop runs that want the nudge on every connection (0).
pub(super) fn nudge_after() -> Option<std::time::Duration> {
    static AFTER: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| match std::env::var("SOFTRDMA_NUDGE_AFTER_MS") {
        Ok(v) if v == "off" => None,
        Ok(v) => Some(
            v.parse()
                .map_or(NUDGE_AFTER, std::time::Duration::from_millis),
        ),
        Err(_) => Some(NUDGE_AFTER),
    })
}

pub(super) fn fpdu_sizing(f: FpduSize) -> FpduSizing {
    match f {
        FpduSize::PathMss => FpduSizing::PathMss,
        FpduSize::Largest => FpduSizing::Fixed(MAX_MULPDU),
        FpduSize::Mulpdu(m) => FpduSizing::Fixed(m),
    }
}
