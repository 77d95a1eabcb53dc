//! `softrdma run`: an unmodified program on softrdma through the drop-in C ABI. The
//! library (`libsoftrdma_capi.so`, which a workspace build leaves beside this binary) is
//! linked under the names the program's loader asks for, in the user's private directory,
//! and that directory goes first on `LD_LIBRARY_PATH`; then the program replaces this
//! process (its exit status and signals are its own).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The library's file name in a build's target directory.
pub const LIB_FILE: &str = "libsoftrdma_capi.so";

/// `softrdma run` arguments.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The library to run on (default: `$SOFTRDMA_LIB`, a file or the directory holding
    /// it, else the one beside this binary).
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// The transport of librdmacm's connections (`rdma_connect`, `rdma_listen`): iwarp (any
    /// address, MPA over TCP) or roce (the RoCEv2 device of the local address, the IB CM).
    /// Programs that bring their QPs up themselves (`ibv_modify_qp`) pick the device by name.
    #[arg(long, value_enum, default_value = "iwarp")]
    pub transport: CmTransport,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<OsString>,
}

/// `softrdma run --transport`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmTransport {
    /// iWARP over TCP.
    Iwarp,
    /// RoCEv2 (InfiniBand transport over UDP).
    Roce,
}

/// Where the library is: `explicit`, else `$SOFTRDMA_LIB`, else beside this binary.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let given = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("SOFTRDMA_LIB").map(PathBuf::from));
    let candidate = match given {
        Some(p) if p.is_dir() => p.join(LIB_FILE),
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| format!("cannot tell where this binary is: {e}"))?
            .with_file_name(LIB_FILE),
    };
    candidate.canonicalize().map_err(|e| {
        format!(
            "no softrdma library at {} ({e}); `cargo build --release` builds it beside \
             the softrdma binary, or give --lib or SOFTRDMA_LIB",
            candidate.display()
        )
    })
}

/// Runs `softrdma run`; returns only if the program could not be started (its exit status).
pub fn run(a: &RunArgs) -> i32 {
    let lib = match find_library(a.lib.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softrdma run: {e}");
            return 1;
        }
    };
    let dir = match softrdma_capi::env::lib_dir_for(&lib)
        .and_then(|d| softrdma_capi::env::link_libraries(&lib, &d).map(|()| d))
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softrdma run: cannot link the library's names: {e}");
            return 1;
        }
    };
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let (prog, args) = a.program.split_first().expect("clap requires the program");
    let transport = match a.transport {
        CmTransport::Iwarp => "iwarp",
        CmTransport::Roce => "roce",
    };
    let err = std::process::Command::new(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", path)
        .env(softrdma_capi::cm::TRANSPORT_VAR, transport)
        .exec();
    eprintln!("softrdma run: cannot run {}: {err}", prog.to_string_lossy());
    // As a shell: 127 for a program not found, 126 for one that cannot be run.
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}
