//! ONC RPC over TCP loopback: every reply status, many calls in flight, fragmented large
//! records, hostile peers, and connection loss.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use softrdma_rpc::msg::{decode_reply, encode_call};
use softrdma_rpc::record::{RecordDecoder, encode_record};
use softrdma_rpc::tcp::TcpTransport;
use softrdma_rpc::*;

const PROG: u32 = 0x2000_0001;
const LONG: Duration = Duration::from_secs(30);

/// Procedures of the test program (version 2; versions 1 and 3 exist too).
mod proc {
    pub const NULL: u32 = 0;
    pub const ECHO: u32 = 1;
    pub const DOUBLE: u32 = 2;
    pub const PANIC: u32 = 3;
    pub const FAIL: u32 = 4;
    pub const UID: u32 = 5;
    pub const GATE: u32 = 6;
    pub const SUM: u32 = 7;
}

/// Calls parked in GATE until the test opens it.
#[derive(Default)]
struct Gate {
    state: Mutex<(usize, usize, bool)>, // (inside now, most inside at once, open)
    cv: Condvar,
}

impl Gate {
    fn enter(&self) {
        let mut s = self.state.lock();
        s.0 += 1;
        s.1 = s.1.max(s.0);
        self.cv.notify_all();
        while !s.2 {
            self.cv.wait(&mut s);
        }
        s.0 -= 1;
    }

    fn wait_inside(&self, n: usize) {
        let mut s = self.state.lock();
        while s.0 < n {
            assert!(
                !self.cv.wait_for(&mut s, LONG).timed_out(),
                "{} inside, want {n}",
                s.0
            );
        }
    }

    fn open(&self) {
        self.state.lock().2 = true;
        self.cv.notify_all();
    }
}

fn program(gate: Arc<Gate>) -> impl Program {
    move |ctx: &CallContext<'_>, args: &[u8]| -> Result<Vec<u8>, ProcError> {
        match ctx.header.proc {
            proc::NULL => Ok(vec![]),
            proc::ECHO => Ok(args.to_vec()),
            proc::DOUBLE => {
                let b: [u8; 4] = args.try_into().map_err(|_| ProcError::GarbageArgs)?;
                Ok((u32::from_be_bytes(b) * 2).to_be_bytes().to_vec())
            }
            proc::PANIC => panic!("a handler bug"),
            proc::FAIL => Err(ProcError::SystemErr),
            proc::UID => match &ctx.header.cred {
                Auth::Sys(s) => Ok(s.uid.to_be_bytes().to_vec()),
                _ => Err(ProcError::Auth(AuthStat::TooWeak)),
            },
            proc::GATE => {
                gate.enter();
                Ok(args.to_vec())
            }
            proc::SUM => {
                // Length and a position-weighted sum: a large record arrived intact.
                let s = args.iter().enumerate().fold(0u64, |a, (i, &b)| {
                    a.wrapping_add((i as u64 + 1) * u64::from(b))
                });
                let mut r = (args.len() as u64).to_be_bytes().to_vec();
                r.extend_from_slice(&s.to_be_bytes());
                r.extend(std::iter::repeat_n(0xA5, 2 << 20));
                Ok(r)
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

struct Rig {
    _server: Arc<Server>,
    tcp: TcpServer,
    gate: Arc<Gate>,
}

fn rig(cfg: ServerConfig) -> Rig {
    let gate = Arc::new(Gate::default());
    let mut reg = Registry::new();
    for v in 1..=3 {
        reg.register(PROG, v, program(gate.clone()));
    }
    let server = Arc::new(Server::new(reg, cfg));
    let tcp = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    Rig {
        _server: server,
        tcp,
        gate,
    }
}

fn status(r: Result<Reply, RpcError>) -> ReplyStatus {
    match r {
        Ok(_) => ReplyStatus::Success,
        Err(RpcError::Status(s)) => s,
        Err(e) => panic!("{e}"),
    }
}

/// RPC-ONC: every accepted and denied status of RFC 5531 §9 reaches the caller.
#[test]
fn every_reply_status() {
    let r = rig(ServerConfig::default());
    let c = Client::connect_tcp(r.tcp.local_addr()).unwrap();
    let x = 21u32.to_be_bytes();
    let got = c.call(PROG, 2, proc::DOUBLE, &x).unwrap();
    assert_eq!(got.results, 42u32.to_be_bytes());
    assert_eq!(got.header.status, ReplyStatus::Success);
    assert_eq!(
        status(c.call(PROG + 1, 2, 0, &[])),
        ReplyStatus::ProgUnavail
    );
    assert_eq!(
        status(c.call(PROG, 9, 0, &[])),
        ReplyStatus::ProgMismatch { low: 1, high: 3 }
    );
    assert_eq!(status(c.call(PROG, 2, 99, &[])), ReplyStatus::ProcUnavail);
    assert_eq!(
        status(c.call(PROG, 2, proc::DOUBLE, &[1, 2])),
        ReplyStatus::GarbageArgs
    );
    assert_eq!(
        status(c.call(PROG, 2, proc::FAIL, &[])),
        ReplyStatus::SystemErr
    );
    // A panicking handler answers SYSTEM_ERR and the server goes on.
    assert_eq!(
        status(c.call(PROG, 2, proc::PANIC, &[])),
        ReplyStatus::SystemErr
    );
    assert_eq!(c.call(PROG, 2, proc::NULL, &[]).unwrap().results, b"");
    // AUTH_NONE is too weak for UID; AUTH_SYS passes its uid; an unknown flavor is refused.
    assert_eq!(
        status(c.call(PROG, 2, proc::UID, &[])),
        ReplyStatus::AuthError(AuthStat::TooWeak)
    );
    c.set_cred(Auth::Sys(AuthSysParams {
        stamp: 1,
        machinename: b"test".to_vec(),
        uid: 4242,
        gid: 100,
        gids: vec![100, 27],
    }));
    assert_eq!(
        c.call(PROG, 2, proc::UID, &[]).unwrap().results,
        4242u32.to_be_bytes()
    );
    c.set_cred(Auth::Other {
        flavor: 6,
        body: vec![0; 8],
    });
    assert_eq!(
        status(c.call(PROG, 2, proc::NULL, &[])),
        ReplyStatus::AuthError(AuthStat::BadCred)
    );
    // RPC_MISMATCH needs a call of another RPC version: written by hand.
    let mut s = TcpStream::connect(r.tcp.local_addr()).unwrap();
    let mut call = Vec::new();
    encode_call(
        &CallHeader {
            xid: 77,
            prog: PROG,
            vers: 2,
            proc: 0,
            cred: Auth::None,
            verf: Auth::None,
        },
        &[],
        &mut call,
    )
    .unwrap();
    call[11] = 3;
    let mut rec = Vec::new();
    encode_record(&[&call], usize::MAX, &mut rec);
    s.write_all(&rec).unwrap();
    let reply = read_record(&mut s);
    let (h, _) = decode_reply(&reply).unwrap();
    assert_eq!(
        (h.xid, h.status),
        (77, ReplyStatus::RpcMismatch { low: 2, high: 2 })
    );
}

fn read_record(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut d = RecordDecoder::new(1 << 20);
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed");
        let mut input = &buf[..n];
        if let Some(r) = d.decode(&mut input).unwrap() {
            return r;
        }
    }
}

/// Many calls in flight on one connection, answered out of order, each matched by its xid;
/// the server runs as many at once as it has threads.
#[test]
fn many_calls_in_flight_on_one_connection() {
    let r = rig(ServerConfig {
        threads: 4,
        max_in_flight: 64,
        ..ServerConfig::default()
    });
    let c = Client::connect_tcp(r.tcp.local_addr()).unwrap();
    // Four calls parked in the handler at once (they cannot finish before the gate opens).
    let parked: Vec<Pending> = (0..4u32)
        .map(|i| c.start(PROG, 2, proc::GATE, &i.to_be_bytes()).unwrap())
        .collect();
    r.gate.wait_inside(4);
    assert_eq!(c.in_flight(), 4);
    // 300 more from 3 threads, in flight together, behind the parked ones.
    let others: Vec<_> = (0..3u32)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let p: Vec<(u32, Pending)> = (0..100u32)
                    .map(|i| {
                        let v = t * 1000 + i;
                        (v, c.start(PROG, 2, proc::DOUBLE, &v.to_be_bytes()).unwrap())
                    })
                    .collect();
                for (v, p) in p {
                    assert_eq!(p.wait().unwrap().results, (v * 2).to_be_bytes());
                }
            })
        })
        .collect();
    r.gate.open();
    for (i, p) in parked.into_iter().enumerate() {
        assert_eq!(p.wait().unwrap().results, (i as u32).to_be_bytes());
    }
    for t in others {
        t.join().unwrap();
    }
    assert_eq!(c.in_flight(), 0);
}

/// The server serves at most `max_in_flight` calls of a connection at once.
#[test]
fn a_connection_gets_at_most_max_in_flight_handlers() {
    let r = rig(ServerConfig {
        threads: 8,
        max_in_flight: 2,
        ..ServerConfig::default()
    });
    let c = Client::connect_tcp(r.tcp.local_addr()).unwrap();
    let p: Vec<Pending> = (0..6u32)
        .map(|i| c.start(PROG, 2, proc::GATE, &i.to_be_bytes()).unwrap())
        .collect();
    r.gate.wait_inside(2);
    // A second connection is not held up by the first one's limit.
    let c2 = Client::connect_tcp(r.tcp.local_addr()).unwrap();
    assert_eq!(c2.call(PROG, 2, proc::NULL, &[]).unwrap().results, b"");
    r.gate.open();
    for (i, p) in p.into_iter().enumerate() {
        assert_eq!(p.wait().unwrap().results, (i as u32).to_be_bytes());
    }
    assert_eq!(r.gate.state.lock().1, 2);
}

/// RFC 5531 §11: a 3 MiB call in 1000-octet fragments and a 2 MiB reply arrive intact.
#[test]
fn large_fragmented_records() {
    let r = rig(ServerConfig::default());
    let t = TcpTransport::connect(r.tcp.local_addr())
        .unwrap()
        .with_max_fragment(1000);
    let c = Client::new(Arc::new(t), 8);
    let args: Vec<u8> = (0..3 << 20)
        .map(|i: u32| (i.wrapping_mul(31) >> 3) as u8)
        .collect();
    let want = args.iter().enumerate().fold(0u64, |a, (i, &b)| {
        a.wrapping_add((i as u64 + 1) * u64::from(b))
    });
    let res = c.call(PROG, 2, proc::SUM, &args).unwrap().results;
    assert_eq!(&res[..8], &(args.len() as u64).to_be_bytes());
    assert_eq!(&res[8..16], &want.to_be_bytes());
    assert_eq!(res.len(), 16 + (2 << 20));
    assert!(res[16..].iter().all(|&b| b == 0xA5));
}

/// Hostile peers: a record over the limit ends that connection only; records that are not
/// calls get no answer and the connection goes on.
#[test]
fn hostile_records() {
    let r = rig(ServerConfig {
        max_record: 1 << 16,
        ..ServerConfig::default()
    });
    let addr = r.tcp.local_addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0x80, 0x10, 0, 0]).unwrap(); // a 1 MiB record
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(s.read(&mut b).unwrap_or(0), 0, "closed without an answer");
    // Garbage, a short record and a reply: no answer; then a real call on the same stream.
    let mut s = TcpStream::connect(addr).unwrap();
    let mut wire = Vec::new();
    encode_record(&[b"junk"], usize::MAX, &mut wire);
    encode_record(
        &[&[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]],
        usize::MAX,
        &mut wire,
    );
    let mut call = Vec::new();
    encode_call(
        &CallHeader {
            xid: 5,
            prog: PROG,
            vers: 2,
            proc: proc::ECHO,
            cred: Auth::None,
            verf: Auth::None,
        },
        b"ok!!",
        &mut call,
    )
    .unwrap();
    encode_record(&[&call], 3, &mut wire);
    s.write_all(&wire).unwrap();
    let (h, off) = {
        let m = read_record(&mut s);
        let (h, off) = decode_reply(&m).unwrap();
        assert_eq!(&m[off..], b"ok!!");
        (h, off)
    };
    assert_eq!((h.xid, h.status, off > 0), (5, ReplyStatus::Success, true));
    // Others are served throughout.
    let c = Client::connect_tcp(addr).unwrap();
    assert_eq!(
        c.call(PROG, 1, proc::ECHO, b"abcd").unwrap().results,
        b"abcd"
    );
}

/// The connection ends with calls in flight: each fails with `Disconnected`, and so does
/// the next call.
#[test]
fn connection_loss_fails_the_calls_in_flight() {
    let mut r = rig(ServerConfig::default());
    let c = Client::connect_tcp(r.tcp.local_addr()).unwrap();
    let p: Vec<Pending> = (0..3u32)
        .map(|i| c.start(PROG, 2, proc::GATE, &i.to_be_bytes()).unwrap())
        .collect();
    r.gate.wait_inside(3);
    r.tcp.shutdown();
    for p in p {
        assert!(matches!(p.wait(), Err(RpcError::Disconnected)));
    }
    assert!(c.call(PROG, 2, proc::NULL, &[]).is_err());
    r.gate.open();
}

/// A call abandoned after its timeout frees its slot; its late reply is dropped.
#[test]
fn a_timed_out_call_frees_its_slot() {
    let r = rig(ServerConfig::default());
    let c = Client::new(
        Arc::new(TcpTransport::connect(r.tcp.local_addr()).unwrap()),
        1,
    );
    let e = c.call_timeout(PROG, 2, proc::GATE, &[0; 4], Duration::from_millis(10));
    assert!(matches!(e, Err(RpcError::Timeout)), "{e:?}");
    assert_eq!(c.in_flight(), 0);
    r.gate.open();
    let n = AtomicUsize::new(0);
    for i in 0..10u32 {
        let got = c.call(PROG, 2, proc::DOUBLE, &i.to_be_bytes()).unwrap();
        assert_eq!(got.results, (2 * i).to_be_bytes());
        n.fetch_add(1, Ordering::Relaxed);
    }
    assert_eq!(n.load(Ordering::Relaxed), 10);
}

/// A result binding over TCP: the eligible result always comes inline there, and that is
/// no breach of the binding (the check of RPCRDMA-75 is for transports that place results
/// apart); `Reply::unreduced` is the results themselves.
#[test]
fn result_bindings_hold_over_tcp() {
    let r = rig(ServerConfig::default());
    let c = Client::connect_tcp(r.tcp.local_addr()).unwrap();
    c.bind_results(PROG, 1, |p, _| (p == proc::ECHO).then_some(4));
    let args = Payload::with_opaque(Vec::new(), b"inline data");
    let got = c
        .call_with(
            PROG,
            1,
            proc::ECHO,
            &args,
            ReplySpace {
                max: 1024,
                ddp: Some(64),
            },
        )
        .unwrap();
    assert_eq!(got.bulk, None);
    assert_eq!(got.bulk_at, Some(4));
    assert_eq!(got.results, args.xdr);
    assert_eq!(got.unreduced().unwrap(), args.xdr);
}

/// A result the program keeps in memory of its own ([`Payload::with_shared`]) goes out
/// over TCP in place, padded, with the XDR after it; a shared argument goes out whole
/// (the program reads its length word).
#[test]
fn shared_items_go_whole_over_tcp() {
    let mem = softrdma::Buffer::adopt((0..=255u8).cycle().take(100_000).collect());
    let mut reg = Registry::new();
    let kept = mem.clone();
    reg.register(PROG, 1, move |_: &CallContext<'_>, args: &[u8]| {
        let n = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
        let mut p = Payload::with_shared(vec![0, 0, 0, 7], kept.clone(), 1..1 + n);
        p.push_xdr(&[0, 0, 0, 9]);
        Ok::<_, ProcError>(p)
    });
    let server = Arc::new(Server::new(reg, ServerConfig::default()));
    let tcp = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let c = Client::connect_tcp(tcp.local_addr()).unwrap();
    for n in [0usize, 3, 4, 65_537, 99_999] {
        let got = c.call(PROG, 1, 0, &(n as u32).to_be_bytes()).unwrap();
        let mut want = vec![0, 0, 0, 7];
        want.extend_from_slice(&(n as u32).to_be_bytes());
        want.extend_from_slice(&mem.read()[1..1 + n]);
        want.resize(want.len().next_multiple_of(4), 0);
        want.extend_from_slice(&[0, 0, 0, 9]);
        assert_eq!(got.results, want, "{n}");
    }
    // Arguments: the call carries the shared octets in place (the program reads the length
    // word only).
    let args = Payload::with_shared(Vec::new(), mem.clone(), 0..5);
    let got = c
        .call_with(PROG, 1, 0, &args, ReplySpace::default())
        .unwrap();
    assert_eq!(&got.results[4..8], &5u32.to_be_bytes());
    assert_eq!(&got.results[8..13], &mem.read()[1..6]);
}

/// Over TCP too, a procedure marked inline runs in the connection's reading thread.
#[test]
fn inline_procedures_run_in_the_connection_thread() {
    let mut reg = Registry::new();
    reg.register(PROG, 1, |_: &CallContext<'_>, _: &[u8]| {
        let mut r = std::thread::current()
            .name()
            .unwrap_or("")
            .as_bytes()
            .to_vec();
        r.resize(r.len().next_multiple_of(4), 0);
        Ok::<_, ProcError>(r)
    });
    reg.inline(PROG, 1, &[1]);
    let server = Arc::new(Server::new(reg, ServerConfig::default()));
    let tcp = server
        .serve_tcp(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let c = Client::connect_tcp(tcp.local_addr()).unwrap();
    for (p, want) in [(1, "rpc-tcp"), (2, "rpc-worker-")] {
        let r = c.call(PROG, 1, p, &[]).unwrap();
        let name = String::from_utf8_lossy(&r.results);
        assert!(name.trim_end_matches('\0').starts_with(want), "{p}: {name}");
    }
}

/// Thousands of calls pipelined on one connection past a limit of one in flight: reading
/// pauses and resumes for each, and every call is answered (a lost resume would hang).
#[test]
fn pipelined_calls_past_the_in_flight_limit_all_answered() {
    let r = rig(ServerConfig {
        threads: 2,
        max_in_flight: 1,
        ..ServerConfig::default()
    });
    let mut s = TcpStream::connect(r.tcp.local_addr()).unwrap();
    let mut wire = Vec::new();
    for xid in 0..5000u32 {
        let mut call = Vec::new();
        encode_call(
            &CallHeader {
                xid,
                prog: PROG,
                vers: 2,
                proc: proc::DOUBLE,
                cred: Auth::None,
                verf: Auth::None,
            },
            &xid.to_be_bytes(),
            &mut call,
        )
        .unwrap();
        encode_record(&[&call], usize::MAX, &mut wire);
    }
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&wire).unwrap());
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut d = RecordDecoder::new(1 << 20);
    let mut replies = std::collections::VecDeque::new();
    let mut buf = vec![0u8; 64 << 10];
    for xid in 0..5000u32 {
        while replies.is_empty() {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed after {xid} replies");
            let mut input = &buf[..n];
            while !input.is_empty() {
                if let Some(r) = d.decode(&mut input).unwrap() {
                    replies.push_back(r);
                }
            }
        }
        let m = replies.pop_front().unwrap();
        let (h, off) = decode_reply(&m).unwrap();
        assert_eq!((h.xid, h.status), (xid, ReplyStatus::Success));
        assert_eq!(&m[off..], (2 * xid).to_be_bytes());
    }
    sender.join().unwrap();
}
