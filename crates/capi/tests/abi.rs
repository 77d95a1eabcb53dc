//! The drop-in's ABI against rdma-core 44 as Debian installs it (issue 43's guards): the
//! names and version nodes the real libraries export, the programs that must load against
//! ours with every symbol bound at start (`LD_BIND_NOW`), `dlvsym` by version, and the
//! struct layouts of Debian's headers. Needs Debian's `ibverbs-utils`, `rdmacm-utils`,
//! `perftest`, `libucx0`, `libfabric1`, `libibverbs-dev` and `librdmacm-dev` (`.ci/run`
//! installs them).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{lib_dir, our_lib};

const SYSTEM_LIBS: &str = "/usr/lib/x86_64-linux-gnu";

/// (node, name) of every symbol `objdump -T` shows defined in `lib` at a version (the
/// default ones only: `(NODE)` marks hidden compat versions).
fn exports(lib: &Path) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils)");
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" g ") && !l.contains("*UND*") && !l.contains("*ABS*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (node, name) = (f[f.len() - 2], f[f.len() - 1]);
            node.contains('_')
                .then(|| (node.to_owned(), name.to_owned()))
                .filter(|(n, _)| !n.starts_with('(') && n != "Base")
        })
        .collect()
}

#[test]
fn every_public_name_of_rdma_core_44_at_its_node() {
    let ours = exports(&our_lib());
    let mut want = BTreeSet::new();
    for lib in [
        "libibverbs.so.1",
        "librdmacm.so.1",
        "libmlx5.so.1",
        "libefa.so.1",
    ] {
        let real = exports(&Path::new(SYSTEM_LIBS).join(lib));
        assert!(!real.is_empty(), "{lib}: nothing exported?");
        // The private ABI is the providers'; programs call only ibv_query_gid_type there.
        want.extend(
            real.into_iter()
                .filter(|(n, s)| !n.contains("PRIVATE") || s == "ibv_query_gid_type"),
        );
    }
    let missing: Vec<_> = want.difference(&ours).collect();
    let extra: Vec<_> = ours
        .iter()
        .filter(|(n, _)| !n.starts_with("SOFTRDMA"))
        .filter(|x| !want.contains(*x))
        .collect();
    assert!(
        missing.is_empty(),
        "not exported as rdma-core does: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "exported at nodes rdma-core does not use: {extra:?}"
    );
    assert_eq!(want.len(), 76 + 68 + 128 + 6);
}

/// rust-lld writes each version definition without its parent (rdma-core's chain, which
/// the loader never reads: it binds by name); the names must all be there.
#[test]
fn every_version_node_of_rdma_core_44_is_defined() {
    let defs = |lib: &Path| -> Vec<String> {
        let out = Command::new("readelf")
            .args(["-V", "--wide"])
            .arg(lib)
            .output()
            .expect("readelf");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let section = text
            .split("Version definition section")
            .nth(1)
            .and_then(|s| s.split("Version needs section").next())
            .unwrap_or("")
            .to_owned();
        section
            .lines()
            .filter_map(|l| l.split("Name: ").nth(1))
            .map(|n| n.trim().to_owned())
            .collect()
    };
    let ours: BTreeSet<String> = defs(&our_lib()).into_iter().collect();
    for lib in [
        "libibverbs.so.1",
        "librdmacm.so.1",
        "libmlx5.so.1",
        "libefa.so.1",
    ] {
        for d in defs(&Path::new(SYSTEM_LIBS).join(lib)).into_iter().skip(1) {
            assert!(ours.contains(&d), "{lib}: version {d} not defined");
        }
    }
}

/// Every program of Debian's rdma-core utilities and perftest, and UCX's and libfabric's
/// verbs modules.
fn consumers() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for pkg in ["ibverbs-utils", "rdmacm-utils", "perftest"] {
        let out = Command::new("dpkg")
            .args(["-L", pkg])
            .output()
            .expect("dpkg");
        assert!(out.status.success(), "Debian's {pkg} is not installed");
        v.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with("/usr/bin/"))
                .map(PathBuf::from),
        );
    }
    v.push(PathBuf::from(SYSTEM_LIBS).join("ucx/libuct_ib.so.0"));
    v.push(PathBuf::from(SYSTEM_LIBS).join("libfabric.so.1"));
    v
}

/// Whether `prog` is linked against libibverbs or librdmacm (its `DT_NEEDED`).
fn needs_verbs(prog: &Path) -> bool {
    let out = Command::new("objdump")
        .arg("-p")
        .arg(prog)
        .output()
        .expect("objdump");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.contains("NEEDED") && (l.contains("libibverbs") || l.contains("librdmacm")))
}

#[test]
fn debian_programs_load_with_every_symbol_bound() {
    let dir = lib_dir();
    let mut checked = 0;
    for prog in consumers() {
        assert!(prog.exists(), "{} is not installed", prog.display());
        let out = Command::new("ldd")
            .arg("-r")
            .arg(&prog)
            .env("LD_LIBRARY_PATH", &dir)
            .env("LD_BIND_NOW", "1")
            .output()
            .expect("ldd");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !needs_verbs(&prog) {
            continue; // not an RDMA program (perftest ships a script or two)
        }
        assert!(
            !text.contains("not found") && !text.contains("undefined symbol"),
            "{}:\n{text}",
            prog.display()
        );
        assert!(
            text.contains(&dir.display().to_string()),
            "{} did not load ours:\n{text}",
            prog.display()
        );
        assert!(
            !text.contains(&format!("{SYSTEM_LIBS}/libibverbs")),
            "{} also loaded the system's libibverbs:\n{text}",
            prog.display()
        );
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} RDMA programs found");
}

#[test]
fn dlvsym_finds_each_name_at_its_version() {
    let lib = std::ffi::CString::new(our_lib().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: dlopen/dlvsym/dlclose with valid C strings; the library's constructors are
    // Rust's (none that run code of ours at load).
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen");
        for (name, ver) in [
            (c"ibv_get_device_list", c"IBVERBS_1.1"),
            (c"ibv_create_comp_channel", c"IBVERBS_1.0"),
            (c"ibv_reg_mr_iova2", c"IBVERBS_1.8"),
            (c"ibv_query_gid_type", c"IBVERBS_PRIVATE_34"),
            (c"rdma_establish", c"RDMACM_1.2"),
            (c"mlx5dv_is_supported", c"MLX5_1.8"),
        ] {
            let v = libc::dlvsym(h, name.as_ptr(), ver.as_ptr());
            assert!(!v.is_null(), "dlvsym({name:?}, {ver:?})");
            assert_eq!(v, libc::dlsym(h, name.as_ptr()), "{name:?}");
        }
        libc::dlclose(h);
    }
}
