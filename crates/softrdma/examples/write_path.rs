//! One signalled RDMA Write over loopback, for `scripts/write-path.sh`: this process is the
//! client; the server is a second process (this program with `serve`), so that a profile of
//! this one holds only the client's side. The client connects through the connection
//! manager, a few Writes warm the path up (the first of each kind allocates and takes cold
//! paths), then `write_path_probe` posts one Write and waits for its completion.
//!
//! With `--gate DIR` the client prints `ready` before the probe and waits for `DIR/go`, then
//! prints `done` and waits for `DIR/stop` before it tears down: the script turns callgrind's
//! instrumentation on and off between them (`callgrind_control -i`), so every thread of the
//! client is measured over the probe only, whichever of them reads the ACK.
//!
//! `cargo run -p softrdma --example write_path -- [iwarp|roce] [size] [--gate DIR]`

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use softrdma::roce::RoceConfig;
use softrdma::*;

const TIMEOUT: Duration = Duration::from_secs(300);
const SERVER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const CLIENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// The measured Write: the probe's frame marks it in a profile.
#[inline(never)]
fn write_path_probe(qp: &Qp, cq: &Cq, wr: SendWr) -> Result<WorkCompletion, Error> {
    write_once(qp, cq, wr)
}

/// Posts one signalled Write and waits for its completion.
fn write_once(qp: &Qp, cq: &Cq, wr: SendWr) -> Result<WorkCompletion, Error> {
    qp.post_send(wr)?;
    let mut wcs = Vec::with_capacity(1);
    cq.wait(1, 1, TIMEOUT, &mut wcs)?;
    Ok(wcs[0])
}

fn device(transport: &str, ip: IpAddr, port: u16) -> Device {
    match transport {
        "roce" => Device::roce(RoceConfig {
            port,
            ..RoceConfig::new(ip)
        }),
        _ => Device::tcp(),
    }
}

/// The server: accepts one connection, tells the client where to write, and lives until
/// its standard input closes.
fn serve(transport: &str, port: u16, size: usize) -> Result<(), Error> {
    let ctx = device(transport, SERVER_IP, port).open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
    let mr = pd.alloc_mr(size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let listener = Listener::bind(&ctx, SocketAddr::new(SERVER_IP, 0))?;
    println!("{} {} {}", listener.local_addr(), mr.rkey().0, mr.addr(0));
    std::io::stdout().flush()?;
    let req = listener.accept_timeout(TIMEOUT)?;
    req.accept(&qp, AcceptParams::default())?;
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}

/// Waits for `file` to appear (the script's signal; polled, this is a measuring tool).
fn gate(dir: &Path, file: &str) {
    while !dir.join(file).exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let port = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
        let size = args.get(3).and_then(|p| p.parse().ok()).unwrap_or(4096);
        return serve(&args[1], port, size);
    }
    let transport = match args.first().map(String::as_str) {
        Some("roce") => "roce",
        _ => "iwarp",
    };
    let size: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let gate_dir = args
        .iter()
        .position(|a| a == "--gate")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    // RoCE peers are sent to at the sender's own port: one port, two loopback addresses.
    let port = match transport {
        "roce" => RoceConfig::sharing_a_port(&[SERVER_IP, CLIENT_IP])?[0].port,
        _ => 0,
    };
    let mut server = Command::new(std::env::current_exe()?)
        .args(["serve", transport, &port.to_string(), &size.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("piped")).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (Some(to), Some(rkey), Some(raddr)) = (
        words.next().and_then(|w| w.parse::<SocketAddr>().ok()),
        words.next().and_then(|w| w.parse::<u32>().ok()),
        words.next().and_then(|w| w.parse::<u64>().ok()),
    ) else {
        let _ = server.kill();
        return Err(Error::InvalidArgument("the server did not start"));
    };
    let ctx = device(transport, CLIENT_IP, port).open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
    let mr = pd.alloc_mr(size, Access::LOCAL_WRITE)?;
    qp.connect(to, ConnectParams::default())?;
    let write = |id| SendWr::write(id, vec![mr.sge(0, size as u32)], Key(rkey), raddr);
    for id in 0..3 {
        write_once(&qp, &cq, write(id))?;
    }
    if let Some(d) = &gate_dir {
        println!("ready");
        std::io::stdout().flush()?;
        gate(d, "go");
    }
    let wc = write_path_probe(&qp, &cq, write(3))?;
    if let Some(d) = &gate_dir {
        println!("done");
        std::io::stdout().flush()?;
        gate(d, "stop");
    }
    drop(server.stdin.take());
    let _ = server.wait();
    if wc.status != WcStatus::Success {
        return Err(Error::InvalidArgument("the Write failed"));
    }
    println!("{transport}: one {size}-octet Write completed");
    Ok(())
}
