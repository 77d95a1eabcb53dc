//! `perf --server` against hostile clients (loopback, RoCE: each context has an address of
//! its own): a client that ends another's test (F7), idle tests that hold every slot (F8),
//! requests that together ask for more memory than the server has (F9). Each time a
//! legitimate client is served during the attack.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma::roce::RoceConfig;
use softrdma::{
    Access, ConnectParams, Context, Cq, Device, Error, Mr, Pd, Qp, QpCap, QpInitAttr, SendFlags,
    SendWr, WcStatus,
};
use softrdma_cli::perf::proto::{
    CLIENT_SEED, EndReport, Refusal, RemoteBuf, Reply, Request, Test, fill,
};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
/// Safety net: a hung server fails the test instead of hanging it.
const SAFETY: Duration = Duration::from_secs(90);

/// A `perf --server --transport roce` on free ports, killed when dropped.
struct Server {
    child: Child,
    port: String,
    roce_port: u16,
    dog: mpsc::Sender<()>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let roce_port = udp.local_addr().unwrap().port();
        drop(udp);
        let port = common::free_ports().to_string();
        let mut child = Command::new(BIN)
            .args(["perf", "--server", "-B", "127.0.0.1", "-p", &port])
            .args(["--transport", "roce", "--roce-port", &roce_port.to_string()])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("serving on") {
            line.clear();
            assert!(err.read_line(&mut line).unwrap() > 0, "the server exited");
        }
        std::thread::spawn(move || for _ in err.lines() {});
        let (dog, rx) = mpsc::channel::<()>();
        let pid = child.id();
        std::thread::spawn(move || {
            if rx.recv_timeout(SAFETY).is_err() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        });
        Server {
            child,
            port,
            roce_port,
            dog,
        }
    }

    /// A client context at `ip` (127.0.0.x), on the server's RoCE port.
    fn peer(&self, ip: &str) -> Peer {
        let mut cfg = RoceConfig::new(ip.parse().unwrap());
        cfg.port = self.roce_port;
        let ctx = Device::roce(cfg).open().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256, None).unwrap();
        let mr = pd
            .alloc_mr(
                1 << 16,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        fill(&mut mr.write()[..], CLIENT_SEED);
        Peer {
            target: format!("127.0.0.1:{}", self.port),
            _ctx: ctx,
            pd,
            cq,
            mr,
        }
    }

    /// Still running (not crashed).
    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.dog.send(());
    }
}

/// One client address: its context, a CQ for all its QPs, a buffer of the client pattern.
struct Peer {
    target: String,
    _ctx: Context,
    pd: Pd,
    cq: Cq,
    mr: Mr,
}

impl Peer {
    fn qp(&self) -> Qp {
        self.pd
            .create_qp(QpInitAttr {
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 1,
                    ..QpCap::default()
                },
                ..QpInitAttr::new(&self.cq, &self.cq)
            })
            .unwrap()
    }

    /// Connects a test of `req`: its QP and the server's reply, or the error (a refusal).
    fn open(&self, req: Request) -> Result<(Qp, Reply), Error> {
        let qp = self.qp();
        let conn = qp.connect(
            self.target.as_str(),
            ConnectParams {
                private_data: req.emit(),
                ..ConnectParams::default()
            },
        )?;
        Ok((
            qp,
            Reply::parse(&conn.peer_private_data).expect("a perf reply"),
        ))
    }

    /// A Write bandwidth test of `size` octets, accepted.
    fn write_test(&self, size: u32) -> (Qp, Reply) {
        self.open(write_bw(size)).expect("a Write test")
    }

    /// A request the server rejects: the rejection's private data.
    fn ask(&self, req: Request) -> Vec<u8> {
        match self.qp().connect(
            self.target.as_str(),
            ConnectParams {
                private_data: req.emit(),
                ..ConnectParams::default()
            },
        ) {
            Err(Error::Rejected { private_data, .. }) => private_data,
            other => panic!("{:?}: {other:?}", req.test),
        }
    }

    /// `End` of test `id`: the server's answer as a report.
    fn end(&self, id: u64) -> EndReport {
        let req = Request {
            id,
            ..Request::new(Test::End)
        };
        EndReport::parse(&self.ask(req)).expect("an End report")
    }

    /// One signaled Write of `len` octets of the pattern into `to`; its completion status.
    fn write(&self, qp: &Qp, to: RemoteBuf, len: u32) -> WcStatus {
        qp.post_send(
            SendWr::write(7, [self.mr.sge(0, len)], softrdma::Key(to.rkey), to.addr)
                .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
        let mut wcs = Vec::new();
        self.cq
            .wait(1, 1, Duration::from_secs(30), &mut wcs)
            .unwrap();
        wcs[0].status
    }

    /// A whole legitimate Write test: connected, one Write, ended with a clean report.
    fn served(&self, size: u32) -> Result<(), Error> {
        let (qp, reply) = self.open(write_bw(size))?;
        assert_eq!(self.write(&qp, reply.buf, size), WcStatus::Success);
        let report = self.end(reply.id);
        assert_eq!(report.error, None, "the legitimate client's report");
        let _ = qp.disconnect();
        Ok(())
    }
}

fn write_bw(size: u32) -> Request {
    Request {
        size,
        ..Request::new(Test::WriteBw)
    }
}

/// The private data of a rejection as the refusal it is.
fn refusal(e: Result<(Qp, Reply), Error>) -> Refusal {
    match e {
        Err(Error::Rejected { private_data, .. }) => {
            Refusal::parse(&private_data).unwrap_or_else(|| {
                panic!(
                    "not a refusal: {:?}",
                    String::from_utf8_lossy(&private_data)
                )
            })
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("accepted"),
    }
}

/// F7: an `End` names a test by its id; only the address that opened the test may end it
/// or read its report. Another address that knows the id, and a second connection from
/// the victim's own address that guesses ids, get "no test" and the victim's test and scale
/// session run on to their own clean `End`. Ids are not small sequential numbers.
#[test]
fn only_its_own_client_ends_a_test() {
    let mut server = Server::start(&[]);
    let victim = server.peer("127.0.0.3");
    let attacker = server.peer("127.0.0.4");
    let (qp, reply) = victim.write_test(4096);
    let scale = Request {
        size: 4096,
        count: 1,
        ..Request::new(Test::ScaleQp)
    };
    let (sqp, sreply) = victim.open(scale).expect("a scale session");
    assert_ne!(reply.id, sreply.id);
    // Another address that learned the ids.
    for id in [reply.id, sreply.id] {
        let r = attacker.end(id);
        assert!(
            r.error.as_deref().is_some_and(|e| e.contains("no test")),
            "another address ended test {id}: {r:?}"
        );
    }
    // The victim's address, guessing: what sequential ids would have been.
    for id in 1..=8 {
        let r = victim.end(id);
        assert!(
            r.error.as_deref().is_some_and(|e| e.contains("no test")),
            "a guessed id {id} ended a test: {r:?}"
        );
    }
    assert!(
        [reply.id, sreply.id]
            .iter()
            .any(|&id| id > u64::from(u32::MAX)),
        "small ids: {} and {}",
        reply.id,
        sreply.id
    );
    // The victim's test and session are alive: their Writes land, their Ends are clean.
    assert_eq!(victim.write(&qp, reply.buf, 4096), WcStatus::Success);
    let mut slot = vec![0u8; 4096];
    fill(&mut slot, 0);
    victim.mr.copy_in(0, &slot).unwrap();
    assert_eq!(victim.write(&sqp, sreply.buf, 4096), WcStatus::Success);
    assert_eq!(victim.end(reply.id).error, None);
    assert_eq!(victim.end(sreply.id).error, None);
    // A legitimate client meanwhile.
    server.peer("127.0.0.5").served(4096).unwrap();
    assert!(server.alive());
}

/// F7, `Bye`: a `--once` server ends with its client's `Bye`, not with another address's
/// (which would have ended the client's tests with the server). The raw baseline's server
/// is not covered: its `Bye` is a TCP connection's header.
#[test]
fn only_its_own_client_ends_a_once_server() {
    let mut server = Server::start(&["--once"]);
    let client = server.peer("127.0.0.3");
    let attacker = server.peer("127.0.0.4");
    let (qp, reply) = client.write_test(4096);
    let _ = attacker.ask(Request::new(Test::Bye));
    assert_eq!(client.write(&qp, reply.buf, 4096), WcStatus::Success);
    assert_eq!(client.end(reply.id).error, None);
    let _ = client.ask(Request::new(Test::Bye));
    // The raw baseline's server ends with its own Bye.
    let raw: u16 = server.port.parse::<u16>().unwrap() + 1;
    softrdma_cli::perf::tcp::bye(([127, 0, 0, 1], raw).into()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.alive() {
        assert!(Instant::now() < deadline, "the client's Bye did not end it");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// F8: four addresses of idle tests (16 each, 64: every slot of the server) and an idle
/// scale session. A test whose client sends nothing for the idle timeout is reclaimed:
/// a legitimate client is served while the attackers still hold their connections, and
/// an attacker's `End` says why its test went.
#[test]
fn idle_tests_are_reclaimed_for_others() {
    let idle = Duration::from_secs(2);
    let mut server = Server::start(&["--idle-timeout", "2"]);
    let attackers: Vec<Peer> = (4..8)
        .map(|i| server.peer(&format!("127.0.0.{i}")))
        .collect();
    let t0 = Instant::now();
    let mut held = Vec::new();
    for a in &attackers {
        for _ in 0..16 {
            held.push(a.write_test(4096));
        }
    }
    let legit = server.peer("127.0.0.3");
    // Every slot is taken (if the attack was set up within the timeout, as it should be).
    let first = legit.open(write_bw(4096));
    if t0.elapsed() < idle {
        assert!(
            matches!(refusal(first), Refusal::Busy { all: 64, .. }),
            "the 65th test"
        );
    }
    // The legitimate client is served within a deadline, the attack still connected.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match legit.served(4096) {
            Ok(()) => break,
            Err(Error::Rejected { private_data, .. })
                if matches!(Refusal::parse(&private_data), Some(Refusal::Busy { .. })) =>
            {
                assert!(
                    Instant::now() < deadline,
                    "still busy 30 s after the attack: idle tests are never reclaimed"
                );
                std::thread::park_timeout(Duration::from_millis(100));
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    // The attacker's first test is reclaimed (the server disconnects it), and its End
    // says why.
    let (qp, reply) = &held[0];
    until_dead(qp);
    let r = attackers[0].end(reply.id);
    assert!(
        r.error.as_deref().is_some_and(|e| e.contains("reclaimed")),
        "{r:?}"
    );
    // An idle scale session (2 QPs asked, 1 joined) goes the same way.
    let scale = Request {
        size: 4096,
        count: 2,
        ..Request::new(Test::ScaleQp)
    };
    let other = server.peer("127.0.0.8");
    let (sqp, sreply) = other.open(scale).expect("a scale session");
    until_dead(&sqp);
    let r = other.end(sreply.id);
    assert!(
        r.error.as_deref().is_some_and(|e| e.contains("reclaimed")),
        "{r:?}"
    );
    drop(held);
    assert!(server.alive());
}

/// Waits (30 s at most) for the server to disconnect `qp`.
fn until_dead(qp: &Qp) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !qp.state().is_dead() {
        assert!(Instant::now() < deadline, "not reclaimed: {:?}", qp.state());
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// F9: a global memory budget across all tests. With an 8 MiB budget, one client's 3 MiB
/// test (6 MiB: buffer and source) leaves too little for another address's 3 MiB test,
/// which is refused with a typed reason (the CLI client says it and exits with an error);
/// a small test of a third address is served meanwhile; once the first test ends its
/// memory is back and the 3 MiB test runs.
#[test]
fn a_global_memory_budget_refuses_past_it_and_frees_on_end() {
    let mut server = Server::start(&["--mem-budget", "8388608"]);
    let big = 3 << 20;
    let first = server.peer("127.0.0.4");
    let second = server.peer("127.0.0.5");
    let (qp, reply) = first.write_test(big);
    match refusal(second.open(write_bw(big))) {
        Refusal::OverBudget {
            asked,
            used,
            budget,
        } => {
            assert_eq!((asked, used, budget), (6 << 20, 6 << 20, 8 << 20));
        }
        other => panic!("{other:?}"),
    }
    // The CLI client reports the refusal (no crash on either side).
    let out = Command::new(BIN)
        .args([
            "perf",
            "127.0.0.1",
            "-p",
            &server.port,
            "--transport",
            "roce",
        ])
        .args([
            "-B",
            "127.0.0.6",
            "--roce-port",
            &server.roce_port.to_string(),
        ])
        .args(["-n", "2", "-s", &big.to_string(), "--op", "write", "--bw"])
        .args(["--connect-timeout", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("rejected by the server") && err.contains("memory budget"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // A small test fits beside the big one.
    server.peer("127.0.0.3").served(4096).unwrap();
    // The first test ends: its memory is the budget's again.
    assert_eq!(first.write(&qp, reply.buf, 4096), WcStatus::Success);
    let _ = first.end(reply.id);
    let (qp2, reply2) = second.write_test(big);
    assert_eq!(second.write(&qp2, reply2.buf, 4096), WcStatus::Success);
    let _ = second.end(reply2.id);
    assert!(server.alive());
}
