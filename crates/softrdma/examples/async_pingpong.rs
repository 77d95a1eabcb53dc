//! An async ping-pong on tokio, the same code over iWARP and RoCEv2: a server task and a
//! client task connect through the async connection manager (`accept_async`,
//! `connect_async`), exchange `count` Send/Recv messages of `size` octets (each checked
//! byte by byte, each echoed back transformed and checked again), then the client writes
//! one block into the server's region with an RDMA Write and tells it so; the server checks
//! that too. Completions are awaited with `Cq::next`; nothing blocks a runtime thread, so
//! it runs on a single-threaded runtime.
//!
//! `cargo run -p softrdma --example async_pingpong -- [iwarp|roce] [count] [size]`

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma::roce::RoceConfig;
use softrdma::*;

/// What one run moved and checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    /// Round trips, every byte of both directions checked.
    pub round_trips: usize,
    /// Octets received by the server (and as many by the client).
    pub octets: usize,
    /// Octets the RDMA Write placed in the server's region, checked there.
    pub written: usize,
    /// Mean round trip.
    pub rtt: Duration,
}

const ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Message `i` of the client; the server answers with every octet inverted.
fn ping(i: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|k| (k as u8).wrapping_mul(31) ^ (i as u8).wrapping_mul(7))
        .collect()
}

fn pong(i: usize, size: usize) -> Vec<u8> {
    ping(i, size).iter().map(|b| !b).collect()
}

fn failed(what: &'static str) -> Error {
    Error::InvalidArgument(what)
}

/// Awaits `n` completions, all successful.
async fn completions(cq: &Cq, n: usize) -> Result<Vec<WorkCompletion>, Error> {
    let mut wcs = Vec::with_capacity(n);
    cq.wait_async(n, n, &mut wcs).await;
    match wcs.iter().find(|wc| wc.status != WcStatus::Success) {
        Some(wc) => {
            eprintln!("work request {} completed {:?}", wc.wr_id, wc.status);
            Err(failed("a work request failed"))
        }
        None => Ok(wcs),
    }
}

/// The server: one connection, `count` pings answered, then the Write checked.
async fn serve(listener: Listener, ctx: Context, count: usize, size: usize) -> Result<(), Error> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
    // Receive (first), send (second) and RDMA target (third) areas.
    let mr = pd.alloc_mr(3 * size, ACCESS)?;
    let (rx, tx, target) = (0, size, 2 * size);
    qp.post_recv(RecvWr::new(0, vec![mr.sge(rx, size as u32)]))?;
    let req = listener.accept_async().await?;
    let mut advert = mr.rkey().0.to_be_bytes().to_vec();
    advert.extend_from_slice(&mr.addr(target).to_be_bytes());
    req.accept_async(
        &qp,
        AcceptParams {
            private_data: advert,
            ..AcceptParams::default()
        },
    )
    .await?;
    // A pong's send may complete after the next ping arrived (RoCE: the client's ACK
    // rides with its next ping), so completions are taken as they come.
    let mut pong_out = false;
    for i in 0..=count {
        let recv = loop {
            let wc = completions(&cq, 1).await?[0];
            match wc.opcode {
                WcOpcode::Send => pong_out = false,
                _ => break wc,
            }
        };
        if i == count {
            // "Written": the client's Send behind its Write (ordered on the connection).
            if recv.opcode != WcOpcode::Recv || mr.to_vec()[target..] != ping(count, size) {
                return Err(failed("the Write arrived wrong"));
            }
            break;
        }
        if recv.opcode != WcOpcode::Recv
            || recv.byte_len as usize != size
            || mr.to_vec()[rx..rx + size] != ping(i, size)
        {
            return Err(failed("a ping arrived wrong"));
        }
        // The next ping may follow the pong at once: its buffer goes first.
        qp.post_recv(RecvWr::new(i as u64 + 1, vec![mr.sge(rx, size as u32)]))?;
        // The last pong's buffer is free once its send completed.
        if pong_out && completions(&cq, 1).await?[0].opcode != WcOpcode::Send {
            return Err(failed("a completion the server did not expect"));
        }
        mr.copy_in(tx, &pong(i, size))?;
        qp.post_send(SendWr::send(i as u64, vec![mr.sge(tx, size as u32)]))?;
        pong_out = true;
    }
    Ok(())
}

/// The client: connects to `to`, pings `count` times, writes, says so.
async fn client(
    ctx: Context,
    to: std::net::SocketAddr,
    count: usize,
    size: usize,
) -> Result<Duration, Error> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
    let mr = pd.alloc_mr(2 * size, ACCESS)?;
    let (rx, tx) = (0, size);
    let conn = qp.connect_async(to, ConnectParams::default()).await?;
    let p = &conn.peer_private_data;
    let (Some(rkey), Some(raddr)) = (p.get(..4), p.get(4..12)) else {
        return Err(failed("no advert from the server"));
    };
    let rkey = Key(u32::from_be_bytes(rkey.try_into().expect("4 octets")));
    let raddr = u64::from_be_bytes(raddr.try_into().expect("8 octets"));
    let start = Instant::now();
    for i in 0..count {
        qp.post_recv(RecvWr::new(i as u64, vec![mr.sge(rx, size as u32)]))?;
        mr.copy_in(tx, &ping(i, size))?;
        qp.post_send(SendWr::send(i as u64, vec![mr.sge(tx, size as u32)]))?;
        // The send's completion and the pong, in either order.
        let wcs = completions(&cq, 2).await?;
        let recv = wcs.iter().find(|wc| wc.opcode == WcOpcode::Recv);
        if recv.is_none_or(|wc| wc.byte_len as usize != size)
            || mr.to_vec()[rx..rx + size] != pong(i, size)
        {
            return Err(failed("a pong arrived wrong"));
        }
    }
    let rtt = start.elapsed() / count.max(1) as u32;
    mr.copy_in(tx, &ping(count, size))?;
    qp.post_send(SendWr::write(
        count as u64,
        vec![mr.sge(tx, size as u32)],
        rkey,
        raddr,
    ))?;
    qp.post_send(SendWr::send(count as u64 + 1, vec![mr.sge(tx, 1)]))?;
    completions(&cq, 2).await?;
    Ok(rtt)
}

/// Runs the server in a task of its own and the client in the caller's.
pub async fn run(
    server: &Device,
    client_dev: &Device,
    count: usize,
    size: usize,
) -> Result<Report, Error> {
    let size = size.max(1);
    let sctx = server.open()?;
    // The server's address: RoCE devices listen on their own (127.0.0.1 here).
    let listener = Listener::bind(&sctx, "127.0.0.1:0")?;
    let to = listener.local_addr();
    let srv = tokio::spawn(serve(listener, sctx, count, size));
    let cli = client(client_dev.open()?, to, count, size).await;
    let served = srv.await.unwrap_or(Err(Error::ContextClosed));
    let rtt = served.and(cli)?;
    Ok(Report {
        round_trips: count,
        octets: count * size,
        written: size,
        rtt,
    })
}

/// Two devices on this host: iWARP needs one TCP device; RoCE one address each (127.0.0.1
/// and 127.0.0.2 are both loopback) on one UDP port.
pub fn loopback_devices(transport: Transport) -> (Device, Device) {
    match transport {
        Transport::Iwarp => (Device::tcp(), Device::tcp()),
        Transport::Roce => {
            let ips = [1, 2].map(|l| IpAddr::V4(Ipv4Addr::new(127, 0, 0, l)));
            let cfg = RoceConfig::sharing_a_port(&ips).expect("a free UDP port");
            (Device::roce(cfg[0]), Device::roce(cfg[1]))
        }
    }
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let transport = match args.get(1).map(String::as_str) {
        Some("roce") => Transport::Roce,
        _ => Transport::Iwarp,
    };
    let count = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let size = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let (server, client) = loopback_devices(transport);
    match run(&server, &client, count, size).await {
        Ok(r) => println!(
            "{transport:?}: {} round trips of {size} octets, every byte checked, {} octets written; \
             mean round trip {:.1} µs",
            r.round_trips,
            r.written,
            r.rtt.as_secs_f64() * 1e6
        ),
        Err(e) => {
            eprintln!("{transport:?}: {e}");
            std::process::exit(1);
        }
    }
}
