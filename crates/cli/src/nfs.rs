//! `softrdma nfs`: an NFSv3 client over RPC-over-RDMA (default) or TCP, with URLs as libnfs
//! writes them: `nfs://HOST[:PORT]/EXPORT/PATH`. The export is the shortest prefix of the path
//! the server's MOUNT accepts.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use softrdma::Device;
use softrdma::roce::RoceConfig;
use softrdma_nfs::{FileType, Nfs3, NfsConfig, Proto};

use crate::pcap_out::{PcapTap, with_pcap_or_fail};
use crate::verbs_util::{TransportArg, local_ip_toward};

/// `softrdma nfs` arguments.
#[derive(clap::Args, Debug)]
pub struct NfsArgs {
    #[command(subcommand)]
    pub op: NfsOp,
    /// RPC transport: rdma (NFS/RDMA, port 20049) or tcp (port 2049 or rpcbind's).
    #[arg(long, value_enum, default_value = "rdma", global = true)]
    pub proto: ProtoArg,
    /// RDMA device: iwarp (TCP) or roce (RoCEv2; connects through the IB CM, as
    /// librdmacm peers such as the kernel's nfsd over rxe expect).
    #[arg(long, value_enum, default_value = "iwarp", global = true)]
    pub transport: TransportArg,
    /// The server's MOUNT port over TCP, instead of asking rpcbind (as mount's
    /// `mountport=`).
    #[arg(long, global = true)]
    pub mount_port: Option<u16>,
    /// AUTH_SYS uid (default: ours).
    #[arg(long, global = true)]
    pub uid: Option<u32>,
    /// AUTH_SYS gid (default: ours).
    #[arg(long, global = true)]
    pub gid: Option<u32>,
    /// No progress bar.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Write the RPC-over-RDMA traffic (connection setup, calls, replies, chunk transfers)
    /// to this pcap file, for `softrdma decode` and tshark (`--proto rdma` only; MOUNT goes
    /// over TCP and is not in it).
    #[arg(long, value_name = "FILE", global = true)]
    pub pcap: Option<std::path::PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoArg {
    /// RPC-over-RDMA.
    Rdma,
    /// RPC over TCP.
    Tcp,
}

#[derive(clap::Subcommand, Debug)]
pub enum NfsOp {
    /// List a directory (name, type, size).
    Ls { url: String },
    /// Copy a file from the server.
    Get { url: String, local: String },
    /// Copy a file to the server (created or truncated).
    Put { local: String, url: String },
    /// Remove a file.
    Rm { url: String },
    /// Show a file's attributes.
    Stat { url: String },
}

/// `nfs://HOST[:PORT]/PATH`: (host, port, path), the path percent-decoded (RFC 2224 URLs
/// follow RFC 3986: `a%20b` names `a b`).
pub fn parse_url(url: &str) -> Result<(IpAddr, Option<u16>, String), String> {
    let rest = url
        .strip_prefix("nfs://")
        .ok_or_else(|| format!("{url}: not an nfs:// URL"))?;
    if rest.contains(['?', '#']) {
        return Err(format!(
            "{url}: a query or fragment (escape ? as %3F and # as %23 in names)"
        ));
    }
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, p) = h.split_once(']').ok_or("unclosed [ in the host")?;
        (h, p.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = port
        .map(|p| p.parse::<u16>().map_err(|_| format!("bad port {p}")))
        .transpose()?;
    let ip = (host, 0)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?
        .ip();
    Ok((ip, port, decode_path(path)?))
}

/// RFC 3986 §2.1 percent-decoding of a URL path, component by component: an escaped `/`
/// (or NUL) cannot be in an NFS name, and the names must be UTF-8.
fn decode_path(path: &str) -> Result<String, String> {
    let mut out = String::with_capacity(path.len());
    for (i, comp) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if !comp
            .split('%')
            .skip(1)
            .all(|h| h.len() >= 2 && h.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit))
        {
            return Err(format!("{path}: a % not followed by two hex digits"));
        }
        let name = percent_encoding::percent_decode_str(comp)
            .decode_utf8()
            .map_err(|_| format!("{path}: a name that is not UTF-8"))?;
        if name.contains(['/', '\0']) {
            return Err(format!("{path}: an escaped / or NUL inside a name"));
        }
        out.push_str(&name);
    }
    Ok(out)
}

/// Octets escaped in a printed URL's path: controls, space and RFC 3986's delimiters and
/// unsafe characters (a path's own `/` stays).
const PATH_ESCAPE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b']')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// The URL of `path` on `host` as it is printed: what [`parse_url`] reads back to the same.
pub fn format_url(host: IpAddr, port: Option<u16>, path: &str) -> String {
    let host = match host {
        IpAddr::V6(a) => format!("[{a}]"),
        IpAddr::V4(a) => a.to_string(),
    };
    let port = port.map(|p| format!(":{p}")).unwrap_or_default();
    let path = percent_encoding::utf8_percent_encode(path, PATH_ESCAPE);
    format!("nfs://{host}{port}{path}")
}

fn our_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Uid:"), field("Gid:"))
}

fn split_parent(path: &str) -> Result<(String, String), String> {
    let p = path.trim_end_matches('/');
    let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
    if name.is_empty() {
        return Err(format!("{path}: no file name"));
    }
    Ok((dir.to_string(), name.to_string()))
}

/// Shows progress for transfers larger than a few MiB.
struct Progress {
    total: u64,
    done: u64,
    start: Instant,
    show: bool,
    last: Instant,
}

impl Progress {
    fn new(total: u64, quiet: bool) -> Progress {
        Progress {
            total,
            done: 0,
            start: Instant::now(),
            show: !quiet && total > 4 << 20,
            last: Instant::now(),
        }
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        if self.show && self.last.elapsed().as_millis() > 200 {
            self.last = Instant::now();
            let pct = self.done * 100 / self.total.max(1);
            eprint!(
                "\r[{:<40}] {pct:3}% {} / {} octets",
                "#".repeat(pct as usize * 40 / 100),
                self.done,
                self.total
            );
        }
    }

    fn summary(&self) -> String {
        if self.show {
            eprintln!();
        }
        let s = self.start.elapsed().as_secs_f64();
        format!(
            "{} octets in {s:.3} s, {:.1} MB/s",
            self.done,
            self.done as f64 / s.max(1e-9) / 1e6
        )
    }
}

/// Runs `softrdma nfs`; the exit status.
pub fn run(args: &NfsArgs) -> i32 {
    if args.pcap.is_some() && args.proto == ProtoArg::Tcp {
        eprintln!("softrdma nfs: --pcap writes RDMA traffic: it goes with --proto rdma");
        return 2;
    }
    with_pcap_or_fail(args.pcap.as_deref(), "softrdma nfs", |tap| {
        run_op(args, tap)
    })
}

fn run_op(args: &NfsArgs, tap: Option<&Arc<PcapTap>>) -> Result<(), String> {
    let url = match &args.op {
        NfsOp::Ls { url } | NfsOp::Get { url, .. } | NfsOp::Rm { url } | NfsOp::Stat { url } => url,
        NfsOp::Put { url, .. } => url,
    };
    let (host, port, path) = parse_url(url)?;
    run_at(args, tap, host, port, &path)
        .map_err(|e| format!("{}: {e}", format_url(host, port, &path)))
}

fn run_at(
    args: &NfsArgs,
    tap: Option<&Arc<PcapTap>>,
    host: IpAddr,
    port: Option<u16>,
    path: &str,
) -> Result<(), String> {
    let ctx = match args.proto {
        ProtoArg::Tcp => None,
        ProtoArg::Rdma => {
            let dev = match args.transport {
                TransportArg::Iwarp => Device::tcp(),
                TransportArg::Roce => {
                    let ip =
                        local_ip_toward(SocketAddr::new(host, 4791)).map_err(|e| e.to_string())?;
                    Device::roce(RoceConfig::new(ip))
                }
            };
            let ctx = dev.open().map_err(|e| format!("{}: {e}", dev.name()))?;
            if let Some(t) = tap {
                t.attach(&ctx)?;
            }
            Some(ctx)
        }
    };
    let mut cfg = NfsConfig::new(
        match args.proto {
            ProtoArg::Rdma => Proto::Rdma,
            ProtoArg::Tcp => Proto::Tcp,
        },
        ctx,
    );
    let (uid, gid) = our_ids();
    cfg.uid = args.uid.unwrap_or(uid);
    cfg.gid = args.gid.unwrap_or(gid);
    cfg.port = port;
    cfg.mount_port = args.mount_port;
    let e = |e: softrdma_nfs::Error| e.to_string();
    let (m, rest) = Nfs3::mount(host, path, &cfg).map_err(e)?;
    let out = match &args.op {
        NfsOp::Stat { .. } => {
            let (_, a) = m.resolve(&rest).map_err(e)?;
            println!(
                "type {:?} mode {:o} links {} uid {} gid {} size {} fileid {} mtime {}",
                a.ftype, a.mode, a.nlink, a.uid, a.gid, a.size, a.fileid, a.mtime
            );
            Ok(())
        }
        NfsOp::Ls { .. } => {
            let (fh, a) = m.resolve(&rest).map_err(e)?;
            if a.ftype != FileType::Directory {
                println!("{:>12} {}", a.size, rest);
                return Ok(());
            }
            let mut entries = m.readdir(&fh).map_err(e)?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for en in entries
                .iter()
                .filter(|en| en.name != "." && en.name != "..")
            {
                let (t, size) = match en.attr {
                    Some(a) => (
                        match a.ftype {
                            FileType::Directory => 'd',
                            FileType::Regular => '-',
                            FileType::Symlink => 'l',
                            FileType::Other(_) => '?',
                        },
                        a.size,
                    ),
                    None => ('?', 0),
                };
                println!("{t} {size:>12} {}", en.name);
            }
            Ok(())
        }
        NfsOp::Get { local, .. } => {
            let (fh, a) = m.resolve(&rest).map_err(e)?;
            let mut f = File::create(local).map_err(|x| format!("{local}: {x}"))?;
            let mut p = Progress::new(a.size, args.quiet);
            let mut off = 0u64;
            loop {
                let (data, eof) = m.read(&fh, off, m.rsize).map_err(e)?;
                f.write_all(&data).map_err(|x| format!("{local}: {x}"))?;
                off += data.len() as u64;
                p.add(data.len() as u64);
                if eof || data.is_empty() {
                    break;
                }
            }
            println!("{}", p.summary());
            Ok(())
        }
        NfsOp::Put { local, .. } => {
            let (dir, name) = split_parent(&rest)?;
            let (dfh, _) = m.resolve(&dir).map_err(e)?;
            let fh = m.create(&dfh, &name, 0o644).map_err(e)?;
            let mut f = File::open(local).map_err(|x| format!("{local}: {x}"))?;
            let total = f.metadata().map(|md| md.len()).unwrap_or(0);
            let mut p = Progress::new(total, args.quiet);
            let mut buf = vec![0u8; m.wsize as usize];
            let mut off = 0u64;
            loop {
                let n = read_full(&mut f, &mut buf).map_err(|x| format!("{local}: {x}"))?;
                if n == 0 {
                    break;
                }
                let mut at = 0;
                while at < n {
                    let w = m.write(&fh, off, &buf[at..n], 0).map_err(e)? as usize;
                    if w == 0 {
                        return Err("the server wrote nothing".into());
                    }
                    at += w;
                    off += w as u64;
                    p.add(w as u64);
                }
            }
            m.commit(&fh).map_err(e)?;
            println!("{}", p.summary());
            Ok(())
        }
        NfsOp::Rm { .. } => {
            let (dir, name) = split_parent(&rest)?;
            let (dfh, _) = m.resolve(&dir).map_err(e)?;
            m.remove(&dfh, &name).map_err(e)
        }
    };
    m.unmount();
    out
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_as_libnfs_writes_them() {
        let (ip, port, path) = parse_url("nfs://10.77.1.2/export/dir/f").unwrap();
        assert_eq!(
            (ip.to_string(), port, path.as_str()),
            ("10.77.1.2".into(), None, "/export/dir/f")
        );
        let (_, port, path) = parse_url("nfs://127.0.0.1:20050/x").unwrap();
        assert_eq!((port, path.as_str()), (Some(20050), "/x"));
        let (ip, _, path) = parse_url("nfs://[::1]:2049").unwrap();
        assert_eq!((ip.to_string(), path.as_str()), ("::1".into(), "/"));
        assert!(parse_url("http://x/y").is_err());
    }

    /// RFC 2224 / RFC 3986: escapes decode on input and encode on output, round trip.
    #[test]
    fn url_paths_are_percent_escaped() {
        let (_, _, path) = parse_url("nfs://127.0.0.1/export/a%20b/%E2%82%ACx%25").unwrap();
        assert_eq!(path, "/export/a b/\u{20ac}x%");
        for bad in [
            "nfs://127.0.0.1/export/a%2Fb",
            "nfs://127.0.0.1/export/a%00b",
            "nfs://127.0.0.1/export/%ff",
            "nfs://127.0.0.1/export/50%",
            "nfs://127.0.0.1/export/%zz",
            "nfs://127.0.0.1/export/a?b",
            "nfs://127.0.0.1/export/a#b",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        for path in [
            "/export/a b",
            "/e/100% #1?",
            "/e/[x]{y}\\z",
            "/e/\u{20ac}",
            "/plain/x.y-z_",
        ] {
            for host in ["127.0.0.1", "::1"] {
                let ip: IpAddr = host.parse().unwrap();
                let url = format_url(ip, Some(2049), path);
                assert!(!url[6..].contains([' ', '?', '#']), "{url}");
                assert_eq!(parse_url(&url).unwrap(), (ip, Some(2049), path.to_string()));
            }
        }
        assert_eq!(
            format_url("10.0.0.1".parse().unwrap(), None, "/export/a b"),
            "nfs://10.0.0.1/export/a%20b"
        );
        assert_eq!(split_parent("/d/f").unwrap(), ("/d".into(), "f".into()));
        assert_eq!(split_parent("f").unwrap(), ("".into(), "f".into()));
        assert!(split_parent("/").is_err());
    }
}
