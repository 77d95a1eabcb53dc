//! librdmacm's programs (Debian's `rdmacm-utils`) on softrdma through the drop-in library,
//! a pair of processes over loopback, on both transports (issue 43): `rping -V` checks
//! every octet of every round.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{finish, free_port, start, wait_for_server, wait_listening};

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `rping` as server and client, `count` rounds of `size` octets; both outputs. iWARP's
/// client starts once the server's TCP listener is there; RoCE's listener is a service of
/// the server's UDP socket, so a client that came too early is rejected and runs again.
fn rping_pair(transport: &str, count: u32, size: u32) -> (String, String) {
    let _roce = roce_server(transport);
    let port = free_port();
    let p = port.to_string();
    let (c, s) = (count.to_string(), size.to_string());
    let server = start(
        "rping",
        &strs(&["-s", "-a", "127.0.0.1", "-p", &p, "-C", &c, "-S", &s, "-V"]),
        &[(softrdma_capi::cm::TRANSPORT_VAR, transport)],
    );
    let client_args = strs(&[
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &p,
        "-C",
        &c,
        "-S",
        &s,
        "-v",
        "-V",
    ]);
    if transport == "iwarp" {
        wait_listening(port, Duration::from_secs(30));
    }
    let co = client_until_ok("rping", &client_args, transport);
    let so = finish(server, "server");
    (so, co)
}

/// A RoCE server of these tests holds the loopback's 127.0.0.1, where its clients look for
/// it: one at a time (the next one would take another address, which its client does not
/// know).
fn roce_server(transport: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    (transport == "roce").then(|| ONE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Runs the client until it succeeds: over iWARP once (its server's TCP listener is there
/// first), over RoCE again while it is refused (the listener is a service of the server's UDP
/// socket, which may be bound before it listens), for up to 30 s. Its standard output.
fn client_until_ok(prog: &str, args: &[String], transport: &str) -> String {
    let t0 = std::time::Instant::now();
    loop {
        let out = start(prog, args, &[(softrdma_capi::cm::TRANSPORT_VAR, transport)])
            .wait_with_output()
            .expect("wait");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            transport != "iwarp" && t0.elapsed() < Duration::from_secs(30),
            "{prog} client: {out:?}"
        );
    }
}

fn rounds_done(out: &str, count: u32) {
    assert!(
        out.contains(&format!("ping data: rdma-ping-{}:", count - 1)),
        "{out}"
    );
}

#[test]
fn rping_over_iwarp_checks_every_round() {
    for (count, size) in [(50, 64), (5, 60000), (10, 1000)] {
        let (_, c) = rping_pair("iwarp", count, size);
        rounds_done(&c, count);
    }
}

#[test]
fn rping_over_roce_checks_every_round() {
    for (count, size) in [(50, 64), (5, 60000)] {
        let (_, c) = rping_pair("roce", count, size);
        rounds_done(&c, count);
    }
}

/// Debian's rping against softrdma's own (`softrdma rping`, the native API) in each role,
/// on both transports: a bug cannot hide behind its twin (issue 43, Done-when 2).
#[test]
fn rping_against_softrdma_rping_both_ways() {
    let bin = common::softrdma_bin();
    for transport in ["iwarp", "roce"] {
        for debian_serves in [true, false] {
            let _roce = roce_server(transport);
            let port = free_port();
            let p = port.to_string();
            let native = |server: bool| {
                let mut c = common::command(&bin);
                c.args(["rping", if server { "-s" } else { "-c" }, "-a", "127.0.0.1"]);
                c.args(["-p", &p, "-C", "20", "-V", "--transport", transport]);
                if !server {
                    // Its own loopback address: the Debian server keeps 127.0.0.1.
                    c.args(["-I", "127.0.0.9"]);
                }
                c.stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("softrdma rping")
            };
            let debian = |server: bool| {
                let role = if server { "-s" } else { "-c" };
                start(
                    "rping",
                    &strs(&[role, "-a", "127.0.0.1", "-p", &p, "-C", "20", "-v", "-V"]),
                    &[(softrdma_capi::cm::TRANSPORT_VAR, transport)],
                )
            };
            let server = match debian_serves {
                true => debian(true),
                false => native(true),
            };
            wait_for_server(transport, port);
            // RoCE: a request that comes between the server's socket and its listener is
            // rejected; the client then runs again.
            let t0 = std::time::Instant::now();
            let c = loop {
                let out = match debian_serves {
                    true => native(false),
                    false => debian(false),
                }
                .wait_with_output()
                .expect("wait");
                if out.status.success() {
                    break String::from_utf8_lossy(&out.stdout).into_owned();
                }
                assert!(
                    transport == "roce" && t0.elapsed() < Duration::from_secs(30),
                    "{transport} client: {out:?}"
                );
            };
            finish(server, &format!("{transport} server"));
            if !debian_serves {
                rounds_done(&c, 20);
            }
        }
    }
}

/// `udaddy`: UD through rdma_cm on RoCE (SIDR finds the server's QP and Q_Key; the server
/// answers each message through an address handle made from its GRH).
#[test]
fn udaddy_over_roce() {
    let _roce = roce_server("roce");
    let server = start("udaddy", &[], &[(softrdma_capi::cm::TRANSPORT_VAR, "roce")]);
    wait_for_server("roce", 0);
    let c = client_until_ok("udaddy", &strs(&["-s", "127.0.0.1"]), "roce");
    assert!(c.contains("data transfers complete"), "{c}");
    let s = finish(server, "udaddy server");
    assert!(
        s.contains("sending replies") && s.contains("return status 0"),
        "{s}"
    );
}

/// `ucmatose` over iWARP: its passive side sends first, right after its MPA Reply (as
/// Linux siw's responder does in client-server mode), which our active side takes.
#[test]
fn ucmatose_over_iwarp_passive_side_sends_first() {
    let (server, port) = common::listening_server(
        "ucmatose",
        |p| strs(&["-p", &p.to_string(), "-C", "20"]),
        &[(softrdma_capi::cm::TRANSPORT_VAR, "iwarp")],
    );
    let c = client_until_ok(
        "ucmatose",
        &strs(&["-s", "127.0.0.1", "-p", &port.to_string(), "-C", "20"]),
        "iwarp",
    );
    assert!(
        c.contains("data transfers complete") && c.contains("return status 0"),
        "{c}"
    );
    let s = finish(server, "ucmatose server");
    assert!(s.contains("return status 0"), "{s}");
}

/// librdmacm's active side asks for MPA's client-server mode, as Linux siw's does: an RTR
/// (peer-to-peer mode) raced siw 6.12's accept, which left it unread (and crashed).
#[test]
fn iwarp_connect_asks_for_client_server_mode_as_siw() {
    let ctx = softrdma::Device::tcp().open().unwrap();
    let l = softrdma::Listener::bind(&ctx, "127.0.0.1:0").unwrap();
    let port = l.local_addr().port().to_string();
    let client = start(
        "rping",
        &strs(&["-c", "-a", "127.0.0.1", "-p", &port, "-C", "1"]),
        &[(softrdma_capi::cm::TRANSPORT_VAR, "iwarp")],
    );
    let req = l.accept_timeout(Duration::from_secs(30)).unwrap();
    let peer = req.peer_params().expect("an MPA Request");
    let rev2 = peer.rev2.expect("MPA revision 2 with IRD/ORD");
    assert!(
        !rev2.p2p && !rev2.write_rtr && !rev2.read_rtr && !rev2.zero_len_rtr,
        "{peer:?}"
    );
    req.reject(b"").unwrap();
    let out = client.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "rping connected to a rejecting listener"
    );
}

/// A port nobody listens on: REJECTED with -ECONNREFUSED, as the kernel's iWARP CM says a
/// TCP reset (after the few tries that let a server's `rdma_listen` come just late).
#[test]
fn iwarp_connect_to_a_port_nobody_listens_is_rejected() {
    let port = free_port().to_string();
    let out = start(
        "rping",
        &strs(&["-c", "-a", "127.0.0.1", "-p", &port, "-C", "1"]),
        &[(softrdma_capi::cm::TRANSPORT_VAR, "iwarp")],
    )
    .wait_with_output()
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("RDMA_CM_EVENT_REJECTED, error -111"),
        "{said}"
    );
}

/// `rdma_server` and `rdma_client`: librdmacm's synchronous mode (ids without a channel,
/// `rdma_create_ep`, `rdma_get_request`, the CQs and completion channels librdmacm makes
/// for a QP given none, `rdma_reg_msgs` in the id's PD), a Send each way, on both
/// transports.
#[test]
fn rdma_server_and_client_synchronous_mode_both_transports() {
    for transport in ["iwarp", "roce"] {
        let _roce = roce_server(transport);
        let port = free_port();
        let p = port.to_string();
        let env = [(softrdma_capi::cm::TRANSPORT_VAR, transport)];
        let server = start("rdma_server", &strs(&["-p", &p]), &env);
        wait_for_server(transport, port);
        let c = client_until_ok(
            "rdma_client",
            &strs(&["-s", "127.0.0.1", "-p", &p]),
            transport,
        );
        assert!(c.contains("rdma_client: end 0"), "{transport}: {c}");
        let s = finish(server, &format!("{transport} rdma_server"));
        assert!(s.contains("rdma_server: end 0"), "{transport}: {s}");
    }
}

/// `cmtime`: many connections at once through every step of librdmacm (ids, resolution,
/// `rdma_create_qp` with neither PD nor CQs, connect, disconnect, destroy), on both
/// transports; every connection must be accepted (a refused one prints its event).
#[test]
fn cmtime_connects_every_id_both_transports() {
    for transport in ["iwarp", "roce"] {
        let _roce = roce_server(transport);
        let port = free_port();
        let p = port.to_string();
        let env = [(softrdma_capi::cm::TRANSPORT_VAR, transport)];
        let mut server = start(
            "cmtime",
            &strs(&["-b", "127.0.0.1", "-p", &p, "-c", "50"]),
            &env,
        );
        wait_for_server(transport, port);
        let c = client_until_ok(
            "cmtime",
            &strs(&["-s", "127.0.0.1", "-p", &p, "-c", "50"]),
            transport,
        );
        // The server serves until stopped.
        let _ = server.kill();
        let s = finish_killed(server);
        assert!(
            !c.contains("event:") && !c.contains("failure") && c.contains("disconnect   :"),
            "{transport} client: {c}"
        );
        assert!(!s.contains("failure"), "{transport} server: {s}");
    }
}

/// The output of a server that was killed.
fn finish_killed(c: std::process::Child) -> String {
    let out = c.wait_with_output().expect("wait");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Debian's `udaddy` against `softrdma udaddy` (the native API) in both roles (issue 43,
/// Done-when 2).
#[test]
fn udaddy_against_softrdma_udaddy_both_ways() {
    let bin = common::softrdma_bin();
    let env = [(softrdma_capi::cm::TRANSPORT_VAR, "roce")];
    for debian_serves in [true, false] {
        let _roce = roce_server("roce");
        let native = |args: &[&str]| {
            common::command(&bin)
                .arg("udaddy")
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("softrdma udaddy")
        };
        if debian_serves {
            let server = start("udaddy", &[], &env);
            wait_for_server("roce", 0);
            // Its own loopback address: the Debian server holds 127.0.0.1.
            let out = native(&["-s", "127.0.0.1", "-b", "127.0.0.9"])
                .wait_with_output()
                .expect("wait");
            assert!(out.status.success(), "softrdma udaddy client: {out:?}");
            let s = finish(server, "udaddy server");
            assert!(
                s.contains("sending replies") && s.contains("return status 0"),
                "{s}"
            );
        } else {
            let server = native(&["-b", "127.0.0.1"]);
            wait_for_server("roce", 0);
            let c = client_until_ok("udaddy", &strs(&["-s", "127.0.0.1"]), "roce");
            assert!(
                c.contains("data transfers complete") && c.contains("return status 0"),
                "{c}"
            );
            finish(server, "softrdma udaddy server");
        }
    }
}
