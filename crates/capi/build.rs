//! The drop-in's linker inputs, from `abi/*.syms` (each line: version node, symbol, and for
//! the direct-verbs libraries the kind of result; as rdma-core 44's libraries export them,
//! `objdump -T`):
//! - a version script that defines every node, chained as rdma-core chains them, and puts
//!   each public name at its default node (everything else local);
//! - a linker script of assignments `name = sr_name;`: the public names alias the Rust
//!   functions. rustc hands the linker its own anonymous version script, which would bind
//!   every `#[no_mangle]` name to the base version (so `dlvsym(…, "IBVERBS_1.1")` would
//!   fail); names that only our script lists escape it. Needs rust-lld (the toolchain's
//!   default linker on x86_64 Linux); GNU ld refuses two kinds of version script.
//! - the direct-verbs functions (`libmlx5.so.1`, `libefa.so.1`, which Debian's perftest, UCX
//!   and libfabric are linked against): one "not supported" function each, by result kind.
//!   The one object answers to all four names.
use std::fmt::Write as _;
use std::path::PathBuf;

const LIBS: [&str; 4] = ["libibverbs", "librdmacm", "libmlx5", "libefa"];

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("out dir"));
    let mut map = String::new();
    let mut aliases = String::new();
    let mut stubs = String::new();
    for lib in LIBS {
        let path = dir.join("abi").join(format!("{lib}.syms"));
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).expect("abi/*.syms");
        // Nodes in file order; each public one inherits the one before it.
        let mut nodes: Vec<(String, Vec<String>)> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut f = line.split_whitespace();
            let (Some(node), Some(sym)) = (f.next(), f.next()) else {
                panic!("{lib}.syms: `{line}` is not `NODE symbol [kind]`");
            };
            match nodes.iter_mut().find(|(n, _)| n == node) {
                Some((_, syms)) => syms.push(sym.to_owned()),
                None => nodes.push((node.to_owned(), vec![sym.to_owned()])),
            }
            writeln!(aliases, "{sym} = sr_{sym};").expect("string");
            if let Some(kind) = f.next() {
                stubs.push_str(&stub(sym, kind));
            }
        }
        let mut parent: Option<String> = None;
        for (node, syms) in &nodes {
            writeln!(map, "{node} {{\n  global:").expect("string");
            for s in syms {
                writeln!(map, "    {s};").expect("string");
            }
            if map.matches('{').count() == 1 {
                // Everything not listed stays inside the object.
                map.push_str("  local:\n    *;\n");
            }
            let private = node.contains("PRIVATE");
            match (&parent, private) {
                (Some(p), false) => writeln!(map, "}} {p};").expect("string"),
                _ => writeln!(map, "}};").expect("string"),
            }
            if !private {
                parent = Some(node.clone());
            }
        }
    }
    std::fs::write(out.join("softrdma.map"), map).expect("write map");
    std::fs::write(out.join("aliases.ld"), aliases).expect("write aliases");
    std::fs::write(out.join("dv_stubs.rs"), stubs).expect("write stubs");
    let o = out.display();
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={o}/softrdma.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg={o}/aliases.ld");
}

/// A direct-verbs function that is not supported, by its result: NULL or an errno
/// (`errno = EOPNOTSUPP`), false, or nothing.
fn stub(sym: &str, kind: &str) -> String {
    let (ret, body) = match kind {
        "ptr" => (
            " -> *mut core::ffi::c_void",
            "crate::errno::set(libc::EOPNOTSUPP); core::ptr::null_mut()",
        ),
        "int" => (
            " -> core::ffi::c_int",
            "crate::errno::set(libc::EOPNOTSUPP); libc::EOPNOTSUPP",
        ),
        "ssize" => (" -> isize", "crate::errno::set(libc::EOPNOTSUPP); -1"),
        "bool" => (" -> bool", "false"),
        "void" => ("", ""),
        k => panic!("{sym}: unknown kind {k}"),
    };
    format!("#[unsafe(no_mangle)]\npub extern \"C\" fn sr_{sym}(){ret} {{ {body} }}\n")
}
