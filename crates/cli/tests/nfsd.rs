//! `softrdma nfsd` served to `softrdma nfs`, binary to binary over loopback: files of
//! several sizes put and got back over RPC-over-RDMA and over TCP, listed and removed,
//! each checked on the exported directory itself.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const SAFETY: Duration = Duration::from_secs(240);

#[test]
fn nfs_client_against_nfsd_over_rdma_and_tcp() {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let root = std::env::temp_dir().join(format!("softrdma-nfsd-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let export = root.join("export");
    std::fs::create_dir_all(&export).unwrap();
    let export = export.canonicalize().unwrap();
    let mut server = Command::new(bin)
        .args(["nfsd", "--export"])
        .arg(&export)
        .args(["--bind", "127.0.0.1", "--rdma-port", "0", "--tcp-port", "0"])
        .args(["--no-portmap", "--stats", "1"])
        .env_remove("SOFTRDMA_MALLOC")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = server.id();
    let (done, watch) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watch.recv_timeout(SAFETY).is_err() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    });
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let (rdma, tcp) = common::nfsd_ports(&mut lines);
    // The NFS port in the URL, MOUNT's given (no rpcbind in a test).
    let url_of = |proto: &str| {
        let port = if proto == "rdma" { &rdma } else { &tcp };
        format!("nfs://127.0.0.1:{port}{}", export.display())
    };
    let nfs = |proto: &str, args: &[&str]| {
        let out = Command::new(bin)
            .args(["nfs", "-q", "--proto", proto, "--mount-port", &tcp])
            .args(["--uid", "0", "--gid", "0"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nfs {proto} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for proto in ["rdma", "tcp"] {
        let url = url_of(proto);
        for size in [0usize, 1, 4095, 4097, (1 << 20) + 1, 3 << 20] {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
            let src = root.join(format!("src-{proto}-{size}"));
            let back = root.join(format!("back-{proto}-{size}"));
            std::fs::write(&src, &data).unwrap();
            let name = format!("f-{proto}-{size}");
            nfs(
                proto,
                &["put", src.to_str().unwrap(), &format!("{url}/{name}")],
            );
            assert_eq!(
                std::fs::read(export.join(&name)).unwrap(),
                data,
                "{proto} {size} on disk"
            );
            nfs(
                proto,
                &["get", &format!("{url}/{name}"), back.to_str().unwrap()],
            );
            assert_eq!(
                std::fs::read(&back).unwrap(),
                data,
                "{proto} {size} read back"
            );
        }
        let ls = nfs(proto, &["ls", &url]);
        assert!(
            ls.contains(&format!("{} f-{proto}-3145728", 3 << 20)),
            "{ls}"
        );
        for size in [0usize, 1, 4095, 4097, (1 << 20) + 1, 3 << 20] {
            nfs(proto, &["rm", &format!("{url}/f-{proto}-{size}")]);
            assert!(!export.join(format!("f-{proto}-{size}")).exists());
        }
    }
    // The counters it prints saw both ways.
    let stats = loop {
        let l = lines.next().expect("nfsd output ended").unwrap();
        if l.contains("calls [") && l.contains("REMOVE 12") {
            break l;
        }
    };
    assert!(stats.contains("WRITE") && stats.contains("READ"), "{stats}");
    // A long-running server runs on glibc's malloc, whose RSS follows its live heap (issue 41).
    let in_use = stats
        .split("memory from glibc, ")
        .nth(1)
        .and_then(|t| t.strip_suffix(" octets in use"))
        .and_then(|n| n.parse::<usize>().ok());
    assert!(in_use.is_some_and(|n| n > 0), "{stats}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = done.send(());
    watchdog.join().unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
