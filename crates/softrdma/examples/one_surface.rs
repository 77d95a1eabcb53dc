//! One application, written once against the verbs API, over either transport: the device
//! it opens is the only difference. A server and a client (two contexts, two threads)
//! connect through the connection manager, then the client sends a message, writes into the
//! server's region and reads it back; every byte is checked on both sides.
//!
//! `cargo run -p softrdma --example one_surface -- [iwarp|roce] [size]`

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

use softrdma::roce::RoceConfig;
use softrdma::*;
use softrdma_testkit::pattern;

const TIMEOUT: Duration = Duration::from_secs(30);

/// What the server tells the client in its accept's private data: where to Write and Read.
fn advert(mr: &Mr) -> Vec<u8> {
    let mut v = mr.rkey().0.to_be_bytes().to_vec();
    v.extend_from_slice(&mr.iova().to_be_bytes());
    v
}

fn parse_advert(p: &[u8]) -> Option<(Key, u64)> {
    let rkey = u32::from_be_bytes(p.get(..4)?.try_into().ok()?);
    let addr = u64::from_be_bytes(p.get(4..12)?.try_into().ok()?);
    Some((Key(rkey), addr))
}

fn wait_one(cq: &Cq) -> Result<WorkCompletion, Error> {
    let mut wcs = Vec::new();
    cq.wait(1, 1, TIMEOUT, &mut wcs)?;
    let wc = wcs[0];
    if wc.status != WcStatus::Success {
        eprintln!("work request {} completed {:?}", wc.wr_id, wc.status);
        return Err(Error::InvalidArgument("a work request failed"));
    }
    Ok(wc)
}

/// What one run moved and checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    /// Octets the server received by Send, checked.
    pub sent: usize,
    /// Octets written into the server's region, checked there.
    pub written: usize,
    /// Octets read back from the server's region, checked at the client.
    pub read: usize,
}

/// Runs the server on `server` and the client on `client`; `bind` is where the server
/// listens.
pub fn run(
    server: &Device,
    client: &Device,
    bind: SocketAddr,
    size: usize,
) -> Result<Report, Error> {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (addr_tx, addr_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let srv = s.spawn(move || -> Result<(), Error> {
            let ctx = server.open()?;
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
            // Receive buffer (first half) and RDMA target (second half).
            let mr = pd.alloc_mr(2 * size, access)?;
            qp.post_recv(RecvWr::new(1, vec![mr.sge(0, size as u32)]))?;
            qp.post_recv(RecvWr::new(2, vec![mr.sge(0, 1)]))?;
            let listener = Listener::bind(&ctx, bind)?;
            let _ = addr_tx.send(listener.local_addr());
            let req = listener.accept_timeout(TIMEOUT)?;
            let target = pd.reg_mr_with(
                mr.buffer().clone(),
                MrAttr {
                    range: size..2 * size,
                    iova: 0x10_0000,
                    ..MrAttr::new(0, access)
                },
            )?;
            req.accept(
                &qp,
                AcceptParams {
                    private_data: advert(&target),
                    ..AcceptParams::default()
                },
            )?;
            let wc = wait_one(&cq)?;
            if wc.byte_len as usize != size || mr.to_vec()[..size] != pattern(size, 1) {
                return Err(Error::InvalidArgument("the Send arrived wrong"));
            }
            // The client's "done" follows its Write (and Read) in the same ordered stream.
            wait_one(&cq)?;
            if target.to_vec() != pattern(size, 2) {
                return Err(Error::InvalidArgument("the Write arrived wrong"));
            }
            Ok(())
        });
        let cli = (|| -> Result<Report, Error> {
            let ctx = client.open()?;
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = pd.create_qp(QpInitAttr::new(&cq, &cq))?;
            let mr = pd.alloc_mr(3 * size, access)?;
            let to = addr_rx.recv_timeout(TIMEOUT).map_err(|_| Error::Timeout)?;
            let conn = qp.connect(to, ConnectParams::default())?;
            let (rkey, raddr) = parse_advert(&conn.peer_private_data)
                .ok_or(Error::InvalidArgument("no advert from the server"))?;
            mr.copy_in(0, &pattern(size, 1))?;
            qp.post_send(SendWr::send(1, vec![mr.sge(0, size as u32)]))?;
            wait_one(&cq)?;
            mr.copy_in(size, &pattern(size, 2))?;
            qp.post_send(SendWr::write(
                2,
                vec![mr.sge(size, size as u32)],
                rkey,
                raddr,
            ))?;
            wait_one(&cq)?;
            qp.post_send(SendWr::read(
                3,
                Some(mr.sge(2 * size, size as u32)),
                rkey,
                raddr,
            ))?;
            wait_one(&cq)?;
            if mr.to_vec()[2 * size..] != pattern(size, 2) {
                return Err(Error::InvalidArgument("the Read came back wrong"));
            }
            qp.post_send(SendWr::send(4, vec![mr.sge(0, 1)]))?;
            wait_one(&cq)?;
            Ok(Report {
                sent: size,
                written: size,
                read: size,
            })
        })();
        let served = srv.join().unwrap_or(Err(Error::ContextClosed));
        served.and(cli)
    })
}

/// The two devices of a run on this host: iWARP needs one TCP device; RoCE one address each
/// (127.0.0.1 and 127.0.0.2 are both loopback), on ephemeral UDP ports.
pub fn loopback_devices(transport: Transport) -> (Device, Device) {
    match transport {
        Transport::Iwarp => (Device::tcp(), Device::tcp()),
        Transport::Roce => {
            // Two addresses of one host, one UDP port: RoCE peers are sent to at our port.
            let ips = [[127, 0, 0, 1], [127, 0, 0, 2]].map(|ip| IpAddr::V4(Ipv4Addr::from(ip)));
            let cfg = RoceConfig::sharing_a_port(&ips).expect("a free UDP port");
            (Device::roce(cfg[0]), Device::roce(cfg[1]))
        }
    }
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let transport = match args.get(1).map(String::as_str) {
        Some("roce") => Transport::Roce,
        _ => Transport::Iwarp,
    };
    let size = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(64 * 1024);
    let (server, client) = loopback_devices(transport);
    let bind: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    match run(&server, &client, bind, size) {
        Ok(r) => println!(
            "{:?}: {} octets sent, {} written, {} read back, every byte checked",
            transport, r.sent, r.written, r.read
        ),
        Err(e) => {
            eprintln!("{transport:?}: {e}");
            std::process::exit(1);
        }
    }
}
