//! RDMA WRITE bandwidth between two RoCE contexts on loopback, with the driver and engine
//! counters: a quick look at the RoCE datapath (`softrdma perf --transport roce` is the
//! measurement tool).
//!
//! `cargo run --release -p softrdma --example roce_write_bw -- [size] [count] [depth]`

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma::roce::RoceConfig;
use softrdma::roce::{QpAttr, QpState};
use softrdma::*;

fn side(ip: Ipv4Addr) -> (Context, Pd, Cq, Qp) {
    let mut cfg = RoceConfig::new(IpAddr::V4(ip));
    cfg.port = 0;
    let ctx = Context::open_roce(cfg).expect("open");
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1 << 16, None).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq, &cq)).expect("qp");
    (ctx, pd, cq, qp)
}

fn up(me: &Qp, peer: &Qp, peer_addr: std::net::SocketAddr) {
    me.set_remote(peer_addr).unwrap();
    me.modify(&QpAttr::state(QpState::Init)).unwrap();
    me.modify(&QpAttr {
        state: Some(QpState::Rtr),
        pmtu: Some(1024),
        dest_qp: Some(peer.qp_num()),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(16),
        min_rnr_timer: Some(12),
        ..QpAttr::default()
    })
    .unwrap();
    me.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(0),
        timeout: Some(10),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(16),
        ..QpAttr::default()
    })
    .unwrap();
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let size = args.first().copied().unwrap_or(65536);
    let count = args.get(1).copied().unwrap_or(5000);
    let depth = args.get(2).copied().unwrap_or(32);
    let (actx, apd, acq, aqp) = side(Ipv4Addr::new(127, 0, 0, 1));
    let (bctx, bpd, _bcq, bqp) = side(Ipv4Addr::new(127, 0, 0, 2));
    up(&aqp, &bqp, bctx.roce_local_addr().unwrap());
    up(&bqp, &aqp, actx.roce_local_addr().unwrap());
    let amr = apd.alloc_mr(size, Access::LOCAL_WRITE).unwrap();
    let bmr = bpd
        .alloc_mr(size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let t0 = Instant::now();
    let (mut posted, mut done) = (0, 0);
    let mut wcs = Vec::new();
    while done < count {
        while posted < count && posted - done < depth {
            aqp.post_send(SendWr::write(
                posted as u64,
                vec![amr.sge(0, size as u32)],
                bmr.rkey(),
                bmr.addr(0),
            ))
            .unwrap();
            posted += 1;
        }
        wcs.clear();
        let n = acq.wait(1, 64, Duration::from_secs(30), &mut wcs).unwrap();
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "{:?}",
            wcs[0]
        );
        done += n;
    }
    let dt = t0.elapsed();
    let gbit = (size * count) as f64 * 8.0 / dt.as_secs_f64() / 1e9;
    println!("WRITE {size} x {count} depth {depth}: {gbit:.2} Gb/s in {dt:?}");
    println!("a: {:?}", actx.roce_counters().unwrap());
    println!("b: {:?}", bctx.roce_counters().unwrap());
    println!("a qp: {:?}", aqp.counters());
    println!("b qp: {:?}", bqp.counters());
}
