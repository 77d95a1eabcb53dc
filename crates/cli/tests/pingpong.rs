//! `softrdma pingpong`: the binary as server and client over loopback RoCEv2 for RC, UC and
//! UD with `-c`, and each role against a peer written here from rdma-core's
//! `*_pingpong.c`: its own out-of-band code (one `read` per message, exact lengths, the
//! `%04x:%06x:%06x:%s` format checked field by field) and its own verbs loop on a softrdma
//! RoCE context.
//!
//! Every pair gets its own loopback addresses (127.0.N.1 / 127.0.N.2) on UDP 4791, so tests
//! run in parallel. No sleeps: the client starts once the server printed its `listening on`
//! line; a watchdog kills (by pid) a process still running after the safety net.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use softrdma::QpType;
use softrdma::roce::{Ah, RoceConfig, gid_to_ip};
use softrdma::roce::{QpAttr, QpState};
use softrdma::*;

const SAFETY: Duration = Duration::from_secs(60);
const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

fn ip(net: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, net, host)
}

/// Kills `pid` unless told to stand down within the safety net.
fn watchdog(pid: u32) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx.recv_timeout(SAFETY).is_err() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    });
    tx
}

/// A `softrdma pingpong` server: its port, once it printed `listening on`.
struct Server {
    child: Child,
    port: u16,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    dog: mpsc::Sender<()>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .arg("pingpong")
            .args(args)
            .args(["-p", "0", "--linger", "20", "--timeout", "30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let dog = watchdog(child.id());
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines.next().expect("server output ended").unwrap();
            if let Some(a) = line.strip_prefix("listening on ") {
                break a.rsplit(':').next().unwrap().parse::<u16>().unwrap();
            }
        };
        Server {
            child,
            port,
            lines,
            dog,
        }
    }

    /// Exit status and the rest of stdout and stderr.
    fn finish(mut self) -> (bool, String, String) {
        let out: Vec<String> = self.lines.by_ref().map(|l| l.unwrap()).collect();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let status = self.child.wait().unwrap();
        let _ = self.dog.send(());
        (status.success(), out.join("\n"), err)
    }
}

fn client(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .arg("pingpong")
        .args(args)
        .args(["--linger", "20", "--timeout", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let dog = watchdog(child.id());
    let out = child.wait_with_output().unwrap();
    let _ = dog.send(());
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The lines every finished side prints, with the figures sane.
fn check_result(out: &str, size: u32, iters: u32) {
    let bytes = u64::from(size) * u64::from(iters) * 2;
    let l = out
        .lines()
        .find(|l| l.starts_with(&format!("{bytes} bytes in ")))
        .unwrap_or_else(|| panic!("no bytes line in {out}"));
    assert!(l.ends_with(" Mbit/sec"), "{l}");
    let l = out
        .lines()
        .find(|l| l.starts_with(&format!("{iters} iters in ")))
        .unwrap_or_else(|| panic!("no iters line in {out}"));
    let usec: f64 = l
        .strip_suffix(" usec/iter")
        .and_then(|x| x.rsplit(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{l}"));
    assert!(usec > 0.0, "{l}");
    assert!(!out.contains("invalid data"), "{out}");
}

/// Our server (RoCE address derived from where the client reached it) against our client
/// (`--bind`), `-c` on both.
fn binary_pair(ty: &str, net: u8, sizes: &[u32]) {
    let (sip, cip) = (ip(net, 1), ip(net, 2));
    for &size in sizes {
        let s = size.to_string();
        let srv = Server::start(&[ty, "-c", "-n", "5", "-s", &s, "-g", "1"]);
        let port = srv.port.to_string();
        let bind = cip.to_string();
        let host = sip.to_string();
        let c = client(&[
            ty, "-c", "-n", "5", "-s", &s, "-g", "1", "-p", &port, "--bind", &bind, &host,
        ]);
        let (sok, sout, serr) = srv.finish();
        let cout = text(&c.stdout);
        assert!(
            c.status.success(),
            "{ty} -s {size} client: {cout}\n{}",
            text(&c.stderr)
        );
        assert!(sok, "{ty} -s {size} server: {sout}\n{serr}");
        check_result(&cout, size, 5);
        check_result(&sout, size, 5);
        let sep = if ty == "--ud" { ':' } else { ',' };
        assert!(
            cout.contains(&format!("{sep} GID ::ffff:{sip}")),
            "the client saw the server's GID: {cout}"
        );
        assert!(
            sout.contains(&format!("{sep} GID ::ffff:{cip}")),
            "the server saw the client's GID: {sout}"
        );
    }
}

#[test]
fn rc_binary_server_and_client() {
    binary_pair("--rc", 31, &[1, 100, 4096]);
}

#[test]
fn uc_binary_server_and_client() {
    binary_pair("--uc", 32, &[1, 100, 4096]);
}

#[test]
fn ud_binary_server_and_client() {
    binary_pair("--ud", 33, &[1, 100, 1024]);
}

/// Server `-c`, client without: the client's pages start with 0x7b, the server reports
/// each page (as rdma-core) and, unlike rdma-core, exits 1.
#[test]
fn server_validation_failure_is_reported() {
    let srv = Server::start(&["--rc", "-c", "-n", "3", "-s", "8192"]);
    let port = srv.port.to_string();
    let host = ip(34, 1).to_string();
    let bind = ip(34, 2).to_string();
    let c = client(&[
        "--rc", "-n", "3", "-s", "8192", "-p", &port, "--bind", &bind, &host,
    ]);
    assert!(c.status.success(), "{}", text(&c.stderr));
    let (ok, out, err) = srv.finish();
    assert!(!ok, "the server exited 0: {out}");
    assert!(out.contains("invalid data in page 0"), "{out}");
    assert!(out.contains("invalid data in page 1"), "{out}");
    assert!(err.contains("invalid data"), "{err}");
    check_result(&text(&c.stdout), 8192, 3);
}

#[test]
fn ud_size_above_the_port_mtu_is_refused() {
    let out = Command::new(BIN)
        .args(["pingpong", "--ud", "-s", "1025", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("Requested size larger than port MTU (1024)"),
        "{}",
        text(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["pingpong", "-s", "1", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a transport is required");
}

// ---- a peer written from rdma-core's pingpong.c ------------------------------------------

const RX_DEPTH: u32 = 500;

/// rdma-core's `pingpong_dest`, parsed strictly from the 52-octet message.
#[derive(Debug, Clone, Copy)]
struct RdmaCoreDest {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

/// What `sprintf("%04x:%06x:%06x:%s")` + `gid_to_wire_gid` + NUL must look like, exactly.
fn parse_strict(m: &[u8]) -> RdmaCoreDest {
    assert_eq!(m.len(), 52, "message length");
    assert_eq!(m[51], 0, "NUL-terminated");
    let s = std::str::from_utf8(&m[..51]).expect("ASCII");
    let f: Vec<&str> = s.split(':').collect();
    assert_eq!(f.len(), 4, "{s}");
    for (field, len) in f.iter().zip([4, 6, 6, 32]) {
        assert_eq!(field.len(), len, "{s}");
        assert!(
            field
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
            "lowercase hex: {s}"
        );
    }
    assert_eq!(f[0], "0000", "LID 0 on RoCE");
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).unwrap();
    }
    RdmaCoreDest {
        qpn: u32::from_str_radix(f[1], 16).unwrap(),
        psn: u32::from_str_radix(f[2], 16).unwrap(),
        gid,
    }
}

fn rdma_core_msg(qpn: u32, psn: u32, gid: &[u8; 16]) -> [u8; 52] {
    let mut s = format!("{:04x}:{:06x}:{:06x}:", 0, qpn, psn);
    for c in gid.chunks(4) {
        s.push_str(&format!(
            "{:08x}",
            u32::from_be_bytes([c[0], c[1], c[2], c[3]])
        ));
    }
    let mut m = [0u8; 52];
    m[..51].copy_from_slice(s.as_bytes());
    m
}

/// One `read()` that must return exactly `n` octets (what the rdma-core tools require).
fn read_once(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let got = s.read(&mut b).unwrap();
    assert_eq!(got, n, "one read of {n} octets, got {:?}", &b[..got]);
    b.truncate(n);
    b
}

/// rdma-core's pingpong side: context, QP in INIT with `rx_depth` receives posted.
struct Peer {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    ty: QpType,
    size: u32,
    off: usize,
    psn: u32,
    ah: Option<Ah>,
}

impl Peer {
    fn new(ty: QpType, me: Ipv4Addr, size: u32) -> Peer {
        let ctx = Context::open_roce(RoceConfig::new(IpAddr::V4(me))).unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(RX_DEPTH as usize + 1, None).unwrap();
        let qp = pd
            .create_qp(QpInitAttr {
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: RX_DEPTH,
                    ..QpCap::default()
                },
                ..QpInitAttr::typed(ty, &cq, &cq)
            })
            .unwrap();
        let off = if ty == QpType::Ud { 40 } else { 0 };
        let mr = pd
            .alloc_mr(size as usize + off, Access::LOCAL_WRITE)
            .unwrap();
        mr.write()[..size as usize + off].fill(0x7b);
        let ud = ty == QpType::Ud;
        qp.modify(&QpAttr {
            state: Some(QpState::Init),
            qkey: ud.then_some(0x1111_1111),
            access: (!ud).then_some(Access::empty()),
            ..QpAttr::default()
        })
        .unwrap();
        let p = Peer {
            ctx,
            pd,
            cq,
            qp,
            mr,
            ty,
            size,
            off,
            psn: 0x5a5a5a,
            ah: None,
        };
        for _ in 0..RX_DEPTH {
            p.post_recv();
        }
        p
    }

    fn post_recv(&self) {
        let len = self.size + self.off as u32;
        self.qp
            .post_recv(RecvWr::new(1, vec![self.mr.sge(0, len)]))
            .unwrap();
    }

    fn msg(&self) -> [u8; 52] {
        rdma_core_msg(self.qp.qp_num(), self.psn, &self.ctx.roce_gid().unwrap())
    }

    /// `pp_connect_ctx`.
    fn connect(&mut self, rem: &RdmaCoreDest) {
        let addr = SocketAddr::new(gid_to_ip(&rem.gid), 4791);
        let rc = self.ty == QpType::Rc;
        if self.ty == QpType::Ud {
            self.qp.modify(&QpAttr::state(QpState::Rtr)).unwrap();
            self.qp
                .modify(&QpAttr {
                    state: Some(QpState::Rts),
                    sq_psn: Some(self.psn),
                    ..QpAttr::default()
                })
                .unwrap();
            self.ah = Some(self.pd.create_ah(addr.ip()).unwrap());
            return;
        }
        self.qp.set_remote(addr).unwrap();
        self.qp
            .modify(&QpAttr {
                state: Some(QpState::Rtr),
                pmtu: Some(1024),
                dest_qp: Some(rem.qpn),
                rq_psn: Some(rem.psn),
                max_dest_rd_atomic: rc.then_some(1),
                min_rnr_timer: rc.then_some(12),
                ..QpAttr::default()
            })
            .unwrap();
        self.qp
            .modify(&QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(self.psn),
                timeout: rc.then_some(14),
                retry_cnt: rc.then_some(7),
                rnr_retry: rc.then_some(7),
                max_rd_atomic: rc.then_some(1),
                ..QpAttr::default()
            })
            .unwrap();
    }

    fn post_send(&self, rem: &RdmaCoreDest) {
        let mut wr = SendWr::send(2, vec![self.mr.sge(self.off, self.size)]);
        if let Some(ah) = &self.ah {
            wr = wr.to(UdDest {
                ah: ah.id(),
                remote_qpn: rem.qpn,
                remote_qkey: 0x1111_1111,
            });
        }
        self.qp.post_send(wr).unwrap();
    }

    /// The loop of `main()` / `parse_single_wc`; returns the pages `-c` found bad (server).
    fn run(&self, rem: &RdmaCoreDest, client: bool, iters: u32, validate: bool) -> Vec<usize> {
        let (mut rcnt, mut scnt, mut routs) = (0, 0, RX_DEPTH);
        let mut pending = 1u64;
        if client {
            if validate {
                let mut b = self.mr.write();
                for i in (0..self.size as usize).step_by(4096) {
                    // i / page_size % sizeof(char): always 0.
                    b[self.off + i] = 0;
                }
            }
            self.post_send(rem);
            pending |= 2;
        }
        let mut wcs = Vec::new();
        while rcnt < iters || scnt < iters {
            wcs.clear();
            self.cq.wait(1, 2, SAFETY, &mut wcs).unwrap();
            for wc in &wcs {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.wr_id == 2 {
                    scnt += 1;
                } else {
                    if self.ty == QpType::Ud {
                        assert_eq!(wc.byte_len, self.size + 40, "UD: size + 40 (GRH)");
                    } else {
                        assert_eq!(wc.byte_len, self.size);
                    }
                    routs -= 1;
                    if routs <= 1 {
                        while routs < RX_DEPTH {
                            self.post_recv();
                            routs += 1;
                        }
                    }
                    rcnt += 1;
                }
                pending &= !wc.wr_id;
                if scnt < iters && pending == 0 {
                    self.post_send(rem);
                    pending = 3;
                }
            }
        }
        let mut bad = Vec::new();
        if !client && validate {
            let b = self.mr.read();
            for i in (0..self.size as usize).step_by(4096) {
                if b[self.off + i] != 0 {
                    bad.push(i / 4096);
                }
            }
        }
        bad
    }
}

/// Our server against rdma-core's client exchange and loop.
fn rdma_core_client_vs_our_server(ty: QpType, flag: &str, net: u8, size: u32) {
    let srv = Server::start(&[flag, "-c", "-n", "20", "-s", &size.to_string()]);
    let sip = ip(net, 1);
    let mut peer = Peer::new(ty, ip(net, 2), size);
    let mut s = TcpStream::connect((sip, srv.port)).unwrap();
    let msg = peer.msg();
    assert_eq!(s.write(&msg).unwrap(), 52);
    let reply = read_once(&mut s, 52);
    assert_eq!(s.write(b"done\0").unwrap(), 5);
    drop(s);
    let rem = parse_strict(&reply);
    assert_eq!(gid_to_ip(&rem.gid), IpAddr::V4(sip), "GID ::ffff:{sip}");
    assert!(rem.psn <= 0xFF_FFFF && rem.qpn <= 0xFF_FFFF);
    peer.connect(&rem);
    let bad = peer.run(&rem, true, 20, true);
    assert!(bad.is_empty());
    let (ok, out, err) = srv.finish();
    assert!(ok, "server: {out}\n{err}");
    check_result(&out, size, 20);
    let sep = if ty == QpType::Ud { ':' } else { ',' };
    let want = format!(
        "  remote address: LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID ::ffff:{}",
        peer.qp.qp_num(),
        peer.psn,
        ip(net, 2)
    );
    assert!(out.lines().any(|l| l == want), "{want:?} in {out}");
}

/// rdma-core's server exchange and loop against our client.
fn our_client_vs_rdma_core_server(ty: QpType, flag: &str, net: u8, size: u32) {
    let sip = ip(net, 1);
    let listener = TcpListener::bind((sip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut peer = Peer::new(ty, sip, size);
    std::thread::scope(|sc| {
        let cl = sc.spawn(|| {
            client(&[
                flag,
                "-c",
                "-n",
                "20",
                "-s",
                &size.to_string(),
                "-p",
                &port.to_string(),
                "--bind",
                &ip(net, 2).to_string(),
                &sip.to_string(),
            ])
        });
        let (mut s, _) = listener.accept().unwrap();
        let m = read_once(&mut s, 52);
        let rem = parse_strict(&m);
        assert_eq!(gid_to_ip(&rem.gid), IpAddr::V4(ip(net, 2)));
        peer.connect(&rem);
        assert_eq!(s.write(&peer.msg()).unwrap(), 52);
        let done = read_once(&mut s, 5);
        assert_eq!(&done, b"done\0");
        drop(s);
        let bad = peer.run(&rem, false, 20, true);
        assert!(bad.is_empty(), "invalid data in pages {bad:?}");
        let c = cl.join().unwrap();
        let out = text(&c.stdout);
        assert!(c.status.success(), "client: {out}\n{}", text(&c.stderr));
        check_result(&out, size, 20);
    });
}

#[test]
fn rc_against_rdma_core_exchange() {
    rdma_core_client_vs_our_server(QpType::Rc, "--rc", 35, 4096);
    our_client_vs_rdma_core_server(QpType::Rc, "--rc", 36, 8192);
}

#[test]
fn uc_against_rdma_core_exchange() {
    rdma_core_client_vs_our_server(QpType::Uc, "--uc", 37, 100);
    our_client_vs_rdma_core_server(QpType::Uc, "--uc", 38, 4096);
}

#[test]
fn ud_against_rdma_core_exchange() {
    rdma_core_client_vs_our_server(QpType::Ud, "--ud", 39, 1024);
    our_client_vs_rdma_core_server(QpType::Ud, "--ud", 40, 1);
}

/// `--timeout` covers the out-of-band connect: against a port that never completes the
/// handshake (a listener whose accept queue is full drops SYNs) the client gives up when
/// its timeout says, naming the port, instead of waiting out the kernel's SYN retries.
#[test]
fn timeout_covers_the_exchange_connect() {
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    // Fill the accept queue: nothing is ever accepted.
    let mut fill = Vec::new();
    for _ in 0..4 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fill.push(s);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args([
            "pingpong",
            "--rc",
            "--timeout",
            "1",
            "-p",
            &addr.port().to_string(),
        ])
        .arg("127.0.0.1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{}", addr.port()))
            && err.contains("-p")
            && err.contains("timed out"),
        "{err}"
    );
    drop(fill);
}
