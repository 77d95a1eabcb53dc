//! `softrdma nfsd --export DIR`: an NFSv3 server in user space, over RPC-over-RDMA (port
//! 20049) and TCP (2049), that the Linux client mounts with `proto=rdma` — MOUNT v3 on the
//! TCP port, registered with rpcbind when one runs, a portmapper of its own when none does.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use softrdma::roce::RoceConfig;
use softrdma::{Device, Listener};
use softrdma_nfs::proto::{MOUNT_PROGRAM, MOUNT_V3, NFS_PROGRAM, NFS_V3};
use softrdma_nfs::server::portmap::TCP;
use softrdma_nfs::server::{
    Backend, LocalFs, MAX_IO, Mapping, NfsService, PortMap, register_with_rpcbind,
};
use softrdma_rpc::rdma::RdmaConfig;
use softrdma_rpc::{Registry, Server, ServerConfig};

use crate::pcap_out::{PcapTap, with_pcap_or_fail};
use crate::verbs_util::TransportArg;

/// `softrdma nfsd` arguments.
#[derive(clap::Args, Debug)]
pub struct NfsdArgs {
    /// A directory to export (repeatable); clients mount it by its absolute path.
    #[arg(long = "export", short = 'e', required = true)]
    pub exports: Vec<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// NFS/RDMA port (RFC 8267; 0: any free port).
    #[arg(long, default_value_t = 20049)]
    pub rdma_port: u16,
    /// Serve no RDMA (TCP only).
    #[arg(long)]
    pub no_rdma: bool,
    /// NFS and MOUNT over TCP (0: any free port).
    #[arg(long, default_value_t = 2049)]
    pub tcp_port: u16,
    /// RDMA device: iwarp (TCP) or roce (RoCEv2).
    #[arg(long, value_enum, default_value = "iwarp")]
    pub transport: TransportArg,
    /// Threads running NFS procedures.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// RPC-over-RDMA credits granted per connection.
    #[arg(long, default_value_t = 64)]
    pub credits: u32,
    /// Connections served at once, per transport (TCP, RDMA); a new one past it closes
    /// the least recently active. 0: (threads + 3) × 20, as Linux's nfsd.
    #[arg(long, default_value_t = 0)]
    pub max_connections: usize,
    /// Connections from one address at once, per transport; past it that address's least
    /// recently active connection is closed for the new one.
    #[arg(long, default_value_t = 64)]
    pub max_connections_per_addr: usize,
    /// Seconds a connection may sit with nothing to do before it is closed (the client
    /// reconnects when it needs to).
    #[arg(long, value_name = "SECS", default_value_t = 360)]
    pub idle_timeout: u64,
    /// Seconds a TCP client may leave its replies unread before it is disconnected.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub send_timeout: u64,
    /// Seconds a client may leave the server's RDMA Reads of its Read chunks unanswered
    /// before the connection is ended.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub read_chunk_timeout: u64,
    /// Neither register with rpcbind nor answer portmap (clients then need `port=` and
    /// `mountport=`).
    #[arg(long)]
    pub no_portmap: bool,
    /// Print the counters (calls per procedure, octets, errors, memory kept for reuse, the
    /// allocator and, on glibc, the octets held from it) every SECS seconds.
    #[arg(long, value_name = "SECS")]
    pub stats: Option<u64>,
    /// The process's allocator and what it holds, for the counters (set by `main`, not an
    /// option).
    #[arg(skip)]
    pub memory: Option<fn() -> String>,
    /// Write the NFS/RDMA traffic to this pcap file, for `softrdma decode` and tshark
    /// (written out every second, and whole when SIGINT or SIGTERM ends the server).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

/// Runs `softrdma nfsd` until SIGINT or SIGTERM (exit status 0) or a failure (1).
pub fn run(a: &NfsdArgs) -> i32 {
    if a.pcap.is_some() && a.no_rdma {
        eprintln!("softrdma nfsd: --pcap writes RDMA traffic: drop --no-rdma");
        return 2;
    }
    with_pcap_or_fail(a.pcap.as_deref(), "softrdma nfsd", |tap| serve(a, tap))
}

fn serve(a: &NfsdArgs, tap: Option<&Arc<PcapTap>>) -> Result<(), String> {
    // Registered before anything serves: the first SIGINT or SIGTERM ends the server
    // cleanly (the capture written whole), a second one at once.
    let signals = Signals::new([SIGINT, SIGTERM]).map_err(|e| format!("signals: {e}"))?;
    let mut exports: Vec<(String, Arc<dyn Backend>)> = Vec::new();
    for dir in &a.exports {
        let path = dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let fs = LocalFs::new(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        exports.push((path.to_string_lossy().into_owned(), Arc::new(fs)));
    }
    let names: Vec<String> = exports.iter().map(|(p, _)| p.clone()).collect();
    let svc = NfsService::new(exports);
    let mut reg = Registry::new();
    svc.register(&mut reg);
    // A record holds a 1 MiB WRITE with its header.
    let max_message = MAX_IO as usize + (64 << 10);
    let server = Arc::new(Server::new(
        reg,
        ServerConfig {
            threads: a.threads.max(1),
            max_record: max_message,
            max_connections: a.max_connections,
            max_connections_per_addr: a.max_connections_per_addr.max(1),
            idle_timeout: Duration::from_secs(a.idle_timeout.max(1)),
            send_timeout: Duration::from_secs(a.send_timeout.max(1)),
            read_chunk_timeout: Duration::from_secs(a.read_chunk_timeout.max(1)),
            ..ServerConfig::default()
        },
    ));
    let tcp_addr = SocketAddr::new(a.bind, a.tcp_port);
    let tcp = server
        .serve_tcp(TcpListener::bind(tcp_addr).map_err(|e| format!("TCP {tcp_addr}: {e}"))?)
        .map_err(|e| format!("TCP {tcp_addr}: {e}"))?;
    let tcp_port = tcp.local_addr().port();
    let _rdma = if !a.no_rdma {
        let dev = match a.transport {
            TransportArg::Iwarp => Device::tcp(),
            TransportArg::Roce => Device::roce(RoceConfig::new(if a.bind.is_unspecified() {
                crate::verbs_util::default_roce_ip()
            } else {
                a.bind
            })),
        };
        let ctx = dev.open().map_err(|e| format!("{}: {e}", dev.name()))?;
        if let Some(t) = tap {
            t.attach(&ctx)?;
        }
        let addr = SocketAddr::new(a.bind, a.rdma_port);
        let l = Listener::bind(&ctx, addr).map_err(|e| format!("RDMA {addr}: {e}"))?;
        let cfg = RdmaConfig {
            credits: a.credits.max(1),
            max_message,
            ..RdmaConfig::default()
        };
        let s = server
            .serve_rdma(&ctx, l, cfg)
            .map_err(|e| format!("RDMA {addr}: {e}"))?;
        println!(
            "softrdma nfsd: NFS/RDMA on {} ({})",
            s.local_addr(),
            dev.name()
        );
        Some((ctx, s))
    } else {
        None
    };
    println!(
        "softrdma nfsd: NFS and MOUNT over TCP on {}",
        tcp.local_addr()
    );
    // rpcbind knows TCP and UDP ports; NFS/RDMA's is the well-known 20049 (RFC 8267).
    let mappings = [
        Mapping {
            prog: NFS_PROGRAM,
            vers: NFS_V3,
            prot: TCP,
            port: u32::from(tcp_port),
        },
        Mapping {
            prog: MOUNT_PROGRAM,
            vers: MOUNT_V3,
            prot: TCP,
            port: u32::from(tcp_port),
        },
    ];
    let rpcbind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 111);
    let registered = if a.no_portmap {
        Ok(false)
    } else {
        register_with_rpcbind(rpcbind, &mappings)
    };
    let _portmap = match registered {
        Ok(true) => {
            println!("softrdma nfsd: registered with rpcbind");
            None
        }
        Ok(false) if !a.no_portmap => {
            let pm = PortMap::new(&mappings);
            let mut reg = Registry::new();
            pm.register(&mut reg);
            let pms = Arc::new(Server::new(
                reg,
                ServerConfig {
                    threads: 1,
                    max_record: 1 << 16,
                    ..ServerConfig::default()
                },
            ));
            let at = SocketAddr::new(a.bind, 111);
            let t = pms
                .serve_tcp(TcpListener::bind(at).map_err(|e| format!("portmap TCP {at}: {e}"))?)
                .map_err(|e| e.to_string())?;
            let u = pms
                .serve_udp(UdpSocket::bind(at).map_err(|e| format!("portmap UDP {at}: {e}"))?)
                .map_err(|e| e.to_string())?;
            println!("softrdma nfsd: no rpcbind here; answering portmap on {at} (TCP, UDP)");
            Some((pms, t, u))
        }
        Ok(false) => {
            println!("softrdma nfsd: no portmap; clients need port= and mountport={tcp_port}");
            None
        }
        // Serving goes on: clients can still be told port= and mountport=.
        Err(e) => {
            eprintln!(
                "softrdma nfsd: rpcbind did not take our ports ({e}); clients need port= and mountport={tcp_port}"
            );
            None
        }
    };
    for n in &names {
        println!("softrdma nfsd: exporting {n}");
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // Counters and the capture go out on a timer; the main thread waits for the signal.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let timer = {
        let (done, svc, tap, srv) = (done.clone(), svc.clone(), tap.cloned(), server.clone());
        let (every, memory) = (a.stats, a.memory);
        std::thread::spawn(move || {
            let mut secs = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::park_timeout(std::time::Duration::from_secs(1));
                secs += 1;
                if let Some(t) = &tap {
                    t.flush();
                }
                if every.is_some_and(|n| secs.is_multiple_of(n.max(1))) {
                    println!(
                        "{}, {} octets kept for reuse{}",
                        counters(svc.stats()),
                        srv.buffers().kept_octets(),
                        memory.map(|m| format!(", {}", m())).unwrap_or_default()
                    );
                }
            }
        })
    };
    let mut signals = signals;
    let sig = signals.forever().next();
    // A second signal ends the process at once.
    for s in [SIGINT, SIGTERM] {
        let _ = signal_hook::flag::register_conditional_shutdown(s, 1, Arc::new(true.into()));
    }
    eprintln!("softrdma nfsd: signal {}: stopping", sig.unwrap_or(0));
    done.store(true, std::sync::atomic::Ordering::Release);
    timer.thread().unpark();
    let _ = timer.join();
    Ok(())
}

/// One line of counters: calls per NFSv3 procedure that was called, octets, errors.
fn counters(s: &softrdma_nfs::server::NfsStats) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let calls: Vec<String> = s
        .calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.load(Relaxed) > 0)
        .map(|(p, c)| {
            let name = u32::try_from(p)
                .ok()
                .and_then(|p| softrdma_nfs::names::procedure_name(NFS_PROGRAM, NFS_V3, p))
                .unwrap_or_default();
            format!("{name} {}", c.load(Relaxed))
        })
        .collect();
    format!(
        "softrdma nfsd: calls [{}], MOUNT {}, read {} octets, written {} octets, errors {}",
        calls.join(", "),
        s.mount_calls.load(Relaxed),
        s.bytes_read.load(Relaxed),
        s.bytes_written.load(Relaxed),
        s.errors.load(Relaxed)
    )
}
