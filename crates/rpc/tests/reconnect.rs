//! Connection loss with calls in flight, on RPC over TCP and on RPC-over-RDMA over both
//! RDMA transports: the client connects again and retransmits its calls with their xids; the
//! server's duplicate request cache answers a retransmitted non-idempotent call from the
//! reply of its first execution instead of executing it again.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use softrdma::{Context, Listener};
use softrdma_rpc::rdma::{RdmaConfig, RdmaServer, RdmaTransport};
use softrdma_rpc::tcp::TcpTransport;
use softrdma_rpc::*;

mod common;

const PROG: u32 = 0x2000_0003;
/// Parks until the gate opens; counts its executions; results: its argument + 1000.
const ADD: u32 = 1;
/// The same procedure, registered as idempotent (not cached).
const ECHO: u32 = 2;
const NULL: u32 = 0;
const LONG: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Gate {
    /// (handlers parked now, gate open, executions per procedure)
    s: Mutex<(usize, bool, [usize; 3])>,
    cv: Condvar,
}

impl Gate {
    fn wait_parked(&self, n: usize) {
        let mut s = self.s.lock();
        while s.0 < n {
            self.cv.wait(&mut s);
        }
    }

    fn open(&self) {
        self.s.lock().1 = true;
        self.cv.notify_all();
    }

    fn executions(&self, proc: u32) -> usize {
        self.s.lock().2[proc as usize]
    }
}

fn program(gate: Arc<Gate>) -> impl Program {
    move |ctx: &CallContext<'_>, args: &[u8]| -> Result<Payload, ProcError> {
        let p = ctx.header.proc;
        if p == NULL {
            return Ok(Payload::default());
        }
        if p != ADD && p != ECHO {
            return Err(ProcError::ProcUnavail);
        }
        let v = u32::from_be_bytes(args.try_into().map_err(|_| ProcError::GarbageArgs)?);
        let mut s = gate.s.lock();
        s.0 += 1;
        gate.cv.notify_all();
        while !s.1 {
            gate.cv.wait(&mut s);
        }
        s.0 -= 1;
        s.2[p as usize] += 1;
        Ok((v + 1000).to_be_bytes().to_vec().into())
    }
}

#[derive(Clone, Copy, Debug)]
enum T {
    Tcp,
    Iwarp,
    Roce,
}

struct Rig {
    gate: Arc<Gate>,
    _server: Arc<Server>,
    _rdma: Option<(RdmaServer, Context, Context)>,
    _tcp: Option<TcpServer>,
    client: Client,
}

fn rig(t: T) -> Rig {
    let r = connected(t);
    // RPC-over-RDMA: one credit until the server's first grant (RFC 8166 §3.3.1).
    r.client.call(PROG, 1, NULL, &[]).unwrap();
    r
}

fn connected(t: T) -> Rig {
    let gate = Arc::new(Gate::default());
    let mut reg = Registry::new();
    reg.register(PROG, 1, program(gate.clone()));
    reg.non_idempotent(PROG, 1, &[ADD]);
    let server = Arc::new(Server::new(
        reg,
        ServerConfig {
            threads: 24,
            ..ServerConfig::default()
        },
    ));
    let reconnect = |connect| Reconnect {
        connect,
        attempts: 5,
        // The replies of the first executions are lost with the connection: the client
        // asks again after this long, on a new connection.
        retransmit_after: Some(Duration::from_millis(300)),
        max_retransmits: 30,
    };
    match t {
        T::Tcp => {
            let srv = server
                .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
                .unwrap();
            let c = Client::with_reconnect(
                reconnect(TcpTransport::connector(srv.local_addr(), 1 << 20)),
                64,
            )
            .unwrap();
            Rig {
                gate,
                _server: server,
                _rdma: None,
                _tcp: Some(srv),
                client: c,
            }
        }
        T::Iwarp | T::Roce => {
            let (sctx, cctx) = common::contexts(if matches!(t, T::Iwarp) {
                common::T::Iwarp
            } else {
                common::T::Roce
            });
            let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
            let cfg = RdmaConfig::default();
            let srv = server.serve_rdma(&sctx, l, cfg).unwrap();
            let c = Client::with_reconnect(
                reconnect(RdmaTransport::connector(&cctx, srv.local_addr(), cfg)),
                32,
            )
            .unwrap();
            Rig {
                gate,
                _server: server,
                _rdma: Some((srv, sctx, cctx)),
                _tcp: None,
                client: c,
            }
        }
    }
}

fn all(f: impl Fn(T)) {
    for t in [T::Tcp, T::Iwarp, T::Roce] {
        f(t);
    }
}

/// Non-idempotent calls in flight when the connection goes: every one is answered, from
/// the duplicate request cache, and none is executed twice.
#[test]
fn retransmitted_non_idempotent_calls_execute_once() {
    all(|t| {
        let r = rig(t);
        let n = 6;
        let pending: Vec<_> = (0..n)
            .map(|i| {
                r.client
                    .start(PROG, 1, ADD, &(i as u32).to_be_bytes())
                    .unwrap()
            })
            .collect();
        // Every call is executing: its reply can only come after the connection is gone.
        r.gate.wait_parked(n);
        r.client.reconnect();
        r.gate.open();
        for (i, p) in pending.into_iter().enumerate() {
            let reply = p
                .wait_timeout(LONG)
                .unwrap_or_else(|e| panic!("{t:?}: {e}"));
            assert_eq!(reply.results, (i as u32 + 1000).to_be_bytes(), "{t:?}");
        }
        assert_eq!(r.gate.executions(ADD), n, "{t:?}: executed once each");
        assert!(r.client.reconnects() >= 1, "{t:?}");
        // The client goes on as usual on its new connection.
        let more = r.client.call(PROG, 1, ADD, &77u32.to_be_bytes()).unwrap();
        assert_eq!(more.results, 1077u32.to_be_bytes());
        assert_eq!(r.gate.executions(ADD), n + 1, "{t:?}");
    });
}

/// Idempotent calls in flight over a lost connection are retransmitted (same xids) and
/// answered on the new one; a call started just after the loss goes there too.
#[test]
fn calls_in_flight_go_again_on_a_new_connection() {
    all(|t| {
        let r = rig(t);
        let n = 8;
        let pending: Vec<_> = (0..n)
            .map(|i| {
                r.client
                    .start(PROG, 1, ECHO, &(i as u32).to_be_bytes())
                    .unwrap()
            })
            .collect();
        let xids: Vec<u32> = pending.iter().map(Pending::xid).collect();
        r.gate.wait_parked(n);
        r.client.reconnect();
        r.gate.open();
        let late = r.client.start(PROG, 1, ECHO, &99u32.to_be_bytes()).unwrap();
        for (i, p) in pending.into_iter().enumerate() {
            assert_eq!(p.xid(), xids[i]);
            let reply = p
                .wait_timeout(LONG)
                .unwrap_or_else(|e| panic!("{t:?}: {e}"));
            assert_eq!(reply.results, (i as u32 + 1000).to_be_bytes(), "{t:?}");
        }
        assert_eq!(
            late.wait_timeout(LONG).unwrap().results,
            1099u32.to_be_bytes()
        );
        // Executed again where the first reply was lost: idempotent, not cached.
        assert!(r.gate.executions(ECHO) > n, "{t:?}");
    });
}

/// Without a connection to be had, the calls in flight fail once the attempts are spent.
#[test]
fn calls_fail_when_no_connection_comes_back() {
    let gate = Arc::new(Gate::default());
    let mut reg = Registry::new();
    reg.register(PROG, 1, program(gate.clone()));
    let server = Arc::new(Server::new(reg, ServerConfig::default()));
    let srv = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let addr = srv.local_addr();
    let first = Mutex::new(true);
    let connect: Connector = Box::new(move || {
        let mut f = first.lock();
        if std::mem::replace(&mut *f, false) {
            TcpTransport::connector(addr, 1 << 20)()
        } else {
            Err(std::io::ErrorKind::ConnectionRefused.into())
        }
    });
    let c = Client::with_reconnect(
        Reconnect {
            connect,
            attempts: 2,
            retransmit_after: None,
            max_retransmits: 3,
        },
        8,
    )
    .unwrap();
    let p = c.start(PROG, 1, ECHO, &1u32.to_be_bytes()).unwrap();
    gate.wait_parked(1);
    c.reconnect();
    assert!(matches!(p.wait_timeout(LONG), Err(RpcError::Disconnected)));
    gate.open();
}
