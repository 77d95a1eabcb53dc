//! rdma-core's `ibv_*_pingpong` (Debian's `ibverbs-utils`) on softrdma, a pair of
//! processes over loopback RoCE through the drop-in library (issue 43): the second process
//! to open the loopback device takes another 127/8 address and both reach each other by
//! the GIDs they exchange. `-c` has each side check every octet it receives.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{finish, free_port, loopback_device, start, wait_listening};

/// `prog` as server and as client with `extra` options; both outputs.
fn pair(prog: &str, extra: &[&str]) -> (String, String) {
    let dev = loopback_device();
    let with_port = |port: u16| -> Vec<String> {
        let mut a: Vec<String> = ["-d", &dev, "-g", "0", "-p", &port.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let (server, port) = common::listening_server(prog, with_port, &[]);
    let mut args = with_port(port);
    args.push("127.0.0.1".into());
    let client = start(prog, &args, &[]);
    let c = finish(client, "client");
    let s = finish(server, "server");
    (s, c)
}

fn iters_done(out: &str, n: u32) {
    assert!(out.contains(&format!("{n} iters in")), "{out}");
}

#[test]
fn ibv_rc_pingpong_checks_every_octet() {
    let (s, c) = pair("ibv_rc_pingpong", &["-n", "200", "-c"]);
    iters_done(&s, 200);
    iters_done(&c, 200);
    // Each side printed the other's GID: both on the loopback, one of them not 127.0.0.1.
    assert!(s.contains("GID ::ffff:127."), "{s}");
}

#[test]
fn ibv_rc_pingpong_sleeping_on_events() {
    let (s, c) = pair("ibv_rc_pingpong", &["-n", "300", "-e", "-c"]);
    iters_done(&s, 300);
    iters_done(&c, 300);
}

/// `-N`: rdma-core's new posting API (`ibv_qp_to_qp_ex`, `ibv_wr_start` … `ibv_wr_complete`).
#[test]
fn ibv_rc_pingpong_new_post_api() {
    let (s, c) = pair("ibv_rc_pingpong", &["-n", "200", "-N", "-c"]);
    iters_done(&s, 200);
    iters_done(&c, 200);
}

#[test]
fn ibv_rc_pingpong_sizes_and_mtus() {
    for (size, mtu) in [("1", "256"), ("4097", "1024"), ("65536", "4096")] {
        let (s, c) = pair(
            "ibv_rc_pingpong",
            &["-n", "50", "-s", size, "-m", mtu, "-c"],
        );
        iters_done(&s, 50);
        iters_done(&c, 50);
    }
}

#[test]
fn ibv_ud_pingpong_over_address_handles() {
    let (s, c) = pair("ibv_ud_pingpong", &["-n", "200", "-c"]);
    iters_done(&s, 200);
    iters_done(&c, 200);
}

/// 16 QPs sharing one receive queue and one CQ: each completion names its QP.
#[test]
fn ibv_srq_pingpong_sixteen_qps_one_srq() {
    let (s, c) = pair("ibv_srq_pingpong", &["-n", "100", "-c"]);
    iters_done(&s, 100);
    iters_done(&c, 100);
    let (s, c) = pair("ibv_srq_pingpong", &["-n", "50", "-q", "4", "-e"]);
    iters_done(&s, 50);
    iters_done(&c, 50);
}

#[test]
fn ibv_uc_pingpong_checks_every_octet() {
    let (s, c) = pair("ibv_uc_pingpong", &["-n", "200", "-c"]);
    iters_done(&s, 200);
    iters_done(&c, 200);
}

/// The native tool (`softrdma pingpong`, which the native API drives) in one role and
/// Debian's program on the library in the other, both ways: a bug cannot hide behind its
/// twin (issue 43, Done-when 2).
#[test]
fn ibv_rc_uc_ud_pingpong_against_softrdma_pingpong_both_ways() {
    let bin = common::softrdma_bin();
    for (prog, kind) in [
        ("ibv_rc_pingpong", "--rc"),
        ("ibv_uc_pingpong", "--uc"),
        ("ibv_ud_pingpong", "--ud"),
    ] {
        for debian_serves in [true, false] {
            let dev = loopback_device();
            let debian = |port: u16| -> Vec<String> {
                [
                    "-d",
                    &dev,
                    "-g",
                    "0",
                    "-p",
                    &port.to_string(),
                    "-n",
                    "100",
                    "-c",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            };
            // The native side binds an address of its own, so whichever starts first, the
            // library's process may keep 127.0.0.1.
            let native = |port: u16| -> Vec<String> {
                ["pingpong", kind, "-p", &port.to_string(), "-n", "100"]
                    .iter()
                    .chain(&["--bind", "127.0.0.9"])
                    .map(|s| s.to_string())
                    .collect()
            };
            let bin = bin.to_str().expect("a UTF-8 path");
            let (server, client) = if debian_serves {
                let (s, port) = common::listening_server(prog, debian, &[]);
                let mut a = native(port);
                a.push("127.0.0.1".into());
                (s, start(bin, &a, &[]))
            } else {
                let (s, port) = common::listening_server(bin, native, &[]);
                let mut a = debian(port);
                a.push("127.0.0.1".into());
                (s, start(prog, &a, &[]))
            };
            let c = finish(client, "client");
            let s = finish(server, "server");
            iters_done(&c, 100);
            iters_done(&s, 100);
        }
    }
}

/// The pair as an unprivileged user through `softrdma run` (as `nobody` when the tests run
/// as root): no capability, no kernel module, nothing of root's.
#[test]
fn an_unprivileged_pair_through_softrdma_run() {
    let bin = common::softrdma_bin();
    let lib = common::our_lib();
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    let port = free_port();
    let run = |client: bool| {
        let mut c = if root {
            let mut c = common::command("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
            c.arg(&bin);
            c
        } else {
            common::command(&bin)
        };
        c.args(["run", "--lib"]).arg(&lib).arg("--");
        c.args(["ibv_rc_pingpong", "-d", &loopback_device(), "-g", "0"]);
        c.args(["-p", &port.to_string(), "-n", "100", "-c"]);
        if client {
            c.arg("127.0.0.1");
        }
        // Not root's private directory: the user's own.
        c.env_remove("XDG_RUNTIME_DIR").env_remove("SOFTRDMA_SYSFS");
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("softrdma run")
    };
    let server = run(false);
    wait_listening(port, Duration::from_secs(30));
    let client = run(true);
    iters_done(&finish(client, "client"), 100);
    iters_done(&finish(server, "server"), 100);
}
