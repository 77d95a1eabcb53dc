//! Debian's rdma-core programs on the drop-in library (issue 43): what they print about
//! our devices is what the library says of them.

mod common;

use common::lib_dir;
use softrdma_capi::list::devices;

/// `prog`'s standard output; it must succeed.
fn run(prog: &str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    common::finish(common::start(prog, &args, &[]), prog)
}

#[test]
fn ibv_devices_lists_every_device_with_its_guid() {
    let out = run("ibv_devices", &[]);
    let rows: Vec<(String, String)> = out
        .lines()
        .skip(2)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_owned(), f[1].to_owned())
        })
        .collect();
    let want: Vec<(String, String)> = devices()
        .iter()
        .map(|d| (d.inner.name().to_owned(), format!("{:016x}", d.guid())))
        .collect();
    assert_eq!(rows, want);
}

#[test]
fn ibv_devinfo_describes_the_iwarp_and_the_loopback_roce_device() {
    let iw = run("ibv_devinfo", &["-v", "-d", softrdma::TCP_DEVICE_NAME]);
    for want in [
        "transport:\t\t\tiWARP (1)",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "phys_port_cnt:\t\t\t1",
        "max_qp:\t\t\t\t16384",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
    ] {
        assert!(iw.contains(want), "no `{want}` in:\n{iw}");
    }
    let lo = devices()
        .iter()
        .find(|d| d.inner.interface() == Some("lo") && d.gid()[10] == 0xff)
        .expect("a RoCE device on 127.0.0.1");
    let ro = run("ibv_devinfo", &["-v", "-d", lo.inner.name()]);
    for want in [
        "transport:\t\t\tInfiniBand (0)",
        "active_mtu:\t\t4096 (5)",
        "GID[  0]:\t\t::ffff:127.",
        ", RoCE v2",
        "max_ah:\t\t\t\t16384",
    ] {
        assert!(ro.contains(want), "no `{want}` in:\n{ro}");
    }
    let g = lo.guid().to_be_bytes();
    let guid = format!(
        "node_guid:\t\t\t{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    );
    assert!(ro.contains(&guid), "no `{guid}` in:\n{ro}");
}

#[test]
fn a_device_that_is_not_there() {
    let out = common::command("ibv_devinfo")
        .args(["-d", "softrdma_nonexistent"])
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .expect("ibv_devinfo");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("softrdma_nonexistent"), "{err}");
}

#[test]
fn softrdma_run_puts_the_library_under_the_program() {
    let bin = common::softrdma_bin();
    let lib = common::our_lib();
    let out = common::command(&bin)
        .args(["run", "--lib"])
        .arg(&lib)
        .args(["--", "ibv_devices"])
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("softrdma run");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(softrdma::TCP_DEVICE_NAME), "{text}");
    // The library's directory holds it; without --lib the binary's neighbour is used.
    let out = common::command(&bin)
        .args(["run", "--", "sh", "-c", "echo $LD_LIBRARY_PATH"])
        .env("LD_LIBRARY_PATH", "/keep/this")
        .env("SOFTRDMA_LIB", lib.parent().unwrap())
        .output()
        .expect("softrdma run");
    let path = String::from_utf8_lossy(&out.stdout);
    let dir = softrdma_capi::env::lib_dir_for(&lib).unwrap();
    assert_eq!(path.trim(), format!("{}:/keep/this", dir.display()));
    // Exit statuses pass through; no program, no library: a shell's and ours.
    let st = common::command(&bin)
        .args(["run", "--lib"])
        .arg(&lib)
        .args(["--", "sh", "-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(7));
    let st = common::command(&bin)
        .args(["run", "--lib"])
        .arg(&lib)
        .args(["--", "/nonexistent/program"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(127));
    let st = common::command(&bin)
        .args(["run", "--lib", "/nonexistent/lib.so", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1));
}
