//! What the integration tests share: this build's artifacts, made current first. `cargo
//! test` links the tests against the crate's rlib and does not make its cdylib (nor the
//! CLI's binary), so each test asks cargo for them (a no-op when they are up to date) in
//! the profile it was itself built in.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The profile's output directory (`target/debug`, …), from the test binary's place.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// Builds `package` (its library target, or all of it) and returns `file` in the profile's
/// directory.
fn built(package: &str, lib_only: bool, file: &str) -> PathBuf {
    let dir = profile_dir();
    let profile = dir.file_name().and_then(|p| p.to_str()).expect("profile");
    let profile = if profile == "debug" { "dev" } else { profile };
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "--profile", profile, "-p", package]);
    if lib_only {
        cmd.arg("--lib");
    }
    let st = cmd.status().expect("cargo");
    assert!(st.success(), "cargo build -p {package} failed");
    let path = dir.join(file);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// The drop-in library of this build.
pub fn our_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| built("softrdma-capi", true, "libsoftrdma_capi.so"))
        .clone()
}

/// The `softrdma` binary of this build.
pub fn softrdma_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("softrdma-cli", false, "softrdma"))
        .clone()
}

/// A directory of links under the names programs load, to this build's library.
pub fn lib_dir() -> PathBuf {
    let lib = our_lib();
    let dir = softrdma_capi::env::lib_dir_for(&lib).expect("private dir");
    softrdma_capi::env::link_libraries(&lib, &dir).expect("links");
    dir
}

/// A port nothing uses now, outside the range the kernel picks from for others.
pub fn free_port() -> u16 {
    softrdma::spare_ports(&[std::net::Ipv4Addr::LOCALHOST.into()], 1).expect("a port")
}

/// Waits until `server` listens on TCP `port`; what it said if it exits first; panics if
/// `limit` passes.
pub fn wait_server(
    server: &mut std::process::Child,
    port: u16,
    limit: std::time::Duration,
) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    loop {
        if listening(port) {
            return Ok(());
        }
        if let Ok(Some(st)) = server.try_wait() {
            let mut err = String::new();
            if let Some(e) = server.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(e, &mut err);
            }
            return Err(format!(
                "the server exited ({st}) before listening on {port}: {err}"
            ));
        }
        assert!(t0.elapsed() < limit, "nothing listens on port {port}");
        std::thread::yield_now();
    }
}

/// Starts the server `args(port)` gives, on a free port, and waits until it listens there;
/// a port taken between the choice and the server's bind (another process's connection)
/// means another port. The server and its port.
pub fn listening_server(
    prog: &str,
    args: impl Fn(u16) -> Vec<String>,
    env: &[(&str, &str)],
) -> (std::process::Child, u16) {
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port();
        let mut server = start(prog, &args(port), env);
        match wait_server(&mut server, port, std::time::Duration::from_secs(30)) {
            Ok(()) => return (server, port),
            Err(e) => last = e,
        }
    }
    panic!("{prog}: no server listened: {last}");
}

fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1].ends_with(&want) && c[3] == "0A"
            })
        })
    })
}

/// Waits until something listens on TCP `port` (as `/proc/net/tcp` says), or panics after
/// `limit` — so a client starts only when its server can take it.
pub fn wait_listening(port: u16, limit: std::time::Duration) {
    let t0 = std::time::Instant::now();
    loop {
        if listening(port) {
            return;
        }
        assert!(t0.elapsed() < limit, "nothing listens on port {port}");
        std::thread::yield_now();
    }
}

/// iWARP: the TCP listener; RoCE: the server's UDP socket on 127.0.0.1:4791 (its listener
/// follows at once).
pub fn wait_for_server(transport: &str, port: u16) {
    if transport == "iwarp" {
        wait_listening(port, std::time::Duration::from_secs(30));
        return;
    }
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string("/proc/net/udp")
        .is_ok_and(|t| t.lines().any(|l| l.contains("0100007F:12B7")))
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "no RoCE server"
        );
        std::thread::yield_now();
    }
}

/// The RoCE device on 127.0.0.1.
pub fn loopback_device() -> String {
    softrdma_capi::list::devices()
        .iter()
        .find(|d| d.inner.interface() == Some("lo") && d.gid()[10] == 0xff)
        .expect("a RoCE device on 127.0.0.1")
        .inner
        .name()
        .to_owned()
}

/// A command whose process is killed when the test thread that started it ends: a test
/// that fails leaves no server behind holding its ports (and 127.0.0.1's RoCE port) for the
/// tests after it.
pub fn command(prog: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(prog);
    // SAFETY: prctl is async-signal-safe, as pre_exec requires; it touches no memory of ours.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

/// Starts `prog` on this build's library (with `env` besides), its output captured.
pub fn start(prog: &str, args: &[String], env: &[(&str, &str)]) -> std::process::Child {
    command(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{prog}: {e}"))
}

/// Waits for `c`, which must succeed; its standard output.
pub fn finish(c: std::process::Child, who: &str) -> String {
    let out = c.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{who}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
