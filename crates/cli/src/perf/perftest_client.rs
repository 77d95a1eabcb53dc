//! The client of perftest's `ib_write_bw` / `ib_read_bw` / `ib_atomic_bw` servers (without
//! `-R`) over RoCEv2: `softrdma perf --transport roce --perftest --test write|read|atomic
//! HOST`. The TCP exchange is perftest 6.06's (docs/rxe-interop.md): version, cycle buffer
//! and cache line size (each the larger of both), MTU (the smaller), the 108-octet QP
//! records before and after connecting and once more after RTR, the traffic, a record when
//! the run is over (the server blocks on it), the bandwidth report field by field
//! (big-endian), a last record and `"done"`. The QP is RC with perftest's attributes
//! (`max_dest_rd_atomic` = own `out_reads`, `max_rd_atomic` = the peer's, `timeout 14`,
//! `retry_cnt 7`, `rnr_retry 7`); addresses cycle as perftest's `ctx_set_send_wqes` makes
//! them.
//!
//! This is the one RoCE-only piece of `softrdma perf`: perftest's servers exchange QP
//! numbers over their own TCP protocol, not a connection manager, so the QP is brought up
//! with [`Qp::modify`] as perftest's `ctx_connect` does.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use softrdma::roce::RoceConfig;
use softrdma::roce::{QpAttr, QpState};
use softrdma::{Access, Cq, Device, Key, Pd, Qp, QpCap, QpInitAttr, SendFlags, SendWr};

use super::client::{INLINE_MAX, SAFETY, check};
use super::{Limit, PerfArgs, PerfError, bind_ip, resolve, valid_mtu};
use crate::verbs_util::{OobPath, rtr_rts, wait_some};

/// READs / atomics outstanding each way.
const RD_ATOMIC: u8 = 16;
/// Every remote right.
const REMOTE: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn random_psn() -> u32 {
    crate::pingpong::random_psn()
}

/// An RC QP in INIT with `access`.
fn create_rc(pd: &Pd, cq: &Cq, send: u32, recv: u32, access: Access) -> Result<Qp, PerfError> {
    let qp = pd.create_qp(QpInitAttr {
        cap: QpCap {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: INLINE_MAX,
        },
        ..QpInitAttr::new(cq, cq)
    })?;
    qp.modify(&QpAttr {
        state: Some(QpState::Init),
        access: Some(access),
        ..QpAttr::default()
    })?;
    Ok(qp)
}

/// A RoCE context on `ip`, UDP `port`.
fn open_ctx(ip: IpAddr, port: u16) -> Result<softrdma::Context, PerfError> {
    let mut cfg = RoceConfig::new(ip);
    cfg.port = port;
    Device::roce(cfg).open().map_err(|e| {
        PerfError::Usage(format!(
            "cannot open a RoCE context on {ip} port {port}: {e}"
        ))
    })
}

/// Which perftest server `--perftest` talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PerftestTest {
    /// `ib_write_bw`.
    Write,
    /// `ib_read_bw`.
    Read,
    /// `ib_atomic_bw` (FETCH_AND_ADD, 8 octets).
    Atomic,
    /// `ib_send_bw` (rdma_cm servers only, `--perftest-cm`).
    Send,
}

impl PerftestTest {
    /// The name perftest prints.
    pub fn title(self) -> &'static str {
        match self {
            PerftestTest::Write => "RDMA_Write",
            PerftestTest::Read => "RDMA_Read",
            PerftestTest::Atomic => "Atomic FETCH_AND_ADD",
            PerftestTest::Send => "Send",
        }
    }
}

/// perftest's version string as the Debian 4.5+0.17 / 6.06 tools send it.
pub const PERFTEST_VERSION: &str = "6.06";
/// Octets of perftest's `KEY_PRINT_FMT_GID` record, NUL included.
pub const DEST_LEN: usize = 108;
/// perftest's `cycle_buffer` (the page size) and `cache_line_size`.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;

/// perftest's `pingpong_dest` as its 108-octet text record carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerftestDest {
    /// LID.
    pub lid: u16,
    /// READs/atomics the side accepts.
    pub out_reads: u16,
    /// QPN.
    pub qpn: u32,
    /// PSN.
    pub psn: u32,
    /// R_Key of the buffer.
    pub rkey: u32,
    /// Address of the buffer.
    pub vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// SRQ number.
    pub srqn: u32,
}

impl PerftestDest {
    /// `"%04x:%04x:%06x:%06x:%08x:%016Lx:"`, 16 × `"%02x:"`, `"%08x:"`, NUL.
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; DEST_LEN];
        let n = s.len().min(DEST_LEN - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    /// Parses a record (`sscanf` of the same format).
    pub fn parse(b: &[u8]) -> Option<PerftestDest> {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let s = std::str::from_utf8(&b[..end]).ok()?;
        let f: Vec<&str> = s.split(':').collect();
        if f.len() < 23 {
            return None;
        }
        let h = |i: usize| u64::from_str_radix(f[i], 16).ok();
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[6 + i], 16).ok()?;
        }
        Some(PerftestDest {
            lid: h(0)? as u16,
            out_reads: h(1)? as u16,
            qpn: h(2)? as u32,
            psn: h(3)? as u32,
            rkey: h(4)? as u32,
            vaddr: h(5)?,
            gid,
            srqn: h(22)? as u32,
        })
    }
}

/// perftest's `ibv_mtu` enum value of an MTU in octets.
fn mtu_enum(m: u32) -> u32 {
    match m {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

fn mtu_of_enum(e: u32) -> Option<u32> {
    (1..=5).contains(&e).then(|| 128u32 << e)
}

/// What a perftest client run did.
#[derive(Clone, Debug, PartialEq)]
pub struct PerftestResult {
    /// The test.
    pub test: PerftestTest,
    /// Octets per operation.
    pub size: u32,
    /// Operations.
    pub iters: u64,
    /// Seconds from the first post to the last completion.
    pub seconds: f64,
    /// BW average, MB/s (2^20).
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
    /// Path MTU in use (the smaller of both sides').
    pub mtu: u32,
    /// Our record.
    pub local: PerftestDest,
    /// The server's record.
    pub remote: PerftestDest,
}

impl PerftestResult {
    /// The report a perftest client gives its server, one `exchange` per field: size,
    /// iterations (perftest 5.33 and later), BW peak and average (MB/s), Mpps; the peak is
    /// the average (no per-operation timestamps).
    pub(super) fn report(
        &self,
        with_iters: bool,
        mut exchange: impl FnMut(&[u8]) -> Result<Vec<u8>, PerfError>,
    ) -> Result<(), PerfError> {
        exchange(&u64::from(self.size).to_be_bytes())?;
        if with_iters {
            exchange(&self.iters.to_be_bytes())?;
        }
        for f in [self.bw_avg, self.bw_avg, self.msg_rate] {
            exchange(&f.to_bits().to_be_bytes())?;
        }
        Ok(())
    }

    /// perftest's result table.
    pub fn render(&self) -> String {
        let name = self.test.title();
        let rule = "---------------------------------------------------------------------------------------";
        let d = |w: &str, x: &PerftestDest| {
            format!(
                " {w} address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}\n GID: {}\n",
                x.lid,
                x.qpn,
                x.psn,
                x.rkey,
                x.vaddr,
                x.gid
                    .iter()
                    .map(|b| format!("{b:02}"))
                    .collect::<Vec<_>>()
                    .join(":")
            )
        };
        format!(
            "{rule}\n                    {name} BW Test (softrdma perf, RoCEv2, perftest {PERFTEST_VERSION} exchange)\n Mtu : {}\n{}{}{rule}\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n {:<10} {:<14} {:<18.2} {:<20.2} {:.6}\n{rule}\n",
            self.mtu,
            d("local", &self.local),
            d("remote", &self.remote),
            self.size,
            self.iters,
            self.bw_avg,
            self.bw_avg,
            self.msg_rate
        )
    }
}

/// Client-first exchange of `mine` for the peer's message of the same size (perftest's
/// `ctx_xchg_data` on the client).
fn xchg(s: &mut TcpStream, mine: &[u8]) -> Result<Vec<u8>, PerfError> {
    s.write_all(mine)?;
    let mut b = vec![0u8; mine.len()];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn xchg_dest(s: &mut TcpStream, me: &PerftestDest) -> Result<PerftestDest, PerfError> {
    let b = xchg(s, &me.encode())?;
    PerftestDest::parse(&b).ok_or_else(|| {
        PerfError::Protocol(format!(
            "not a perftest QP record: {:?}",
            String::from_utf8_lossy(&b)
        ))
    })
}

/// Runs `ib_{write,read,atomic}_bw`'s client against the perftest server at `host` (no
/// `-R`): the out-of-band exchange of perftest 6.06 on TCP (`-p`), the RC QP on RoCE (our
/// address `-B` or the TCP connection's, UDP `--roce-port`), `-n` operations of `-s` octets
/// (atomics: 8) with `-t` outstanding. BW peak is reported as the average (no per-operation
/// timestamps).
pub fn perftest_client(args: &PerfArgs, host: &str) -> Result<PerftestResult, PerfError> {
    let test = args.test;
    let atomic = test == PerftestTest::Atomic;
    let size = if atomic {
        8
    } else {
        args.size.unwrap_or(65536)
    };
    let iters = match args.limit(5000) {
        Limit::Iters(n) => n,
        Limit::Duration(_) => {
            return Err(PerfError::Usage(
                "--perftest runs -n iterations, not -D".into(),
            ));
        }
    };
    let roce_port = args
        .roce_port
        .unwrap_or(softrdma_wire::rocev2::ROCEV2_UDP_PORT);
    let my_mtu = valid_mtu(args.mtu.unwrap_or(1024))?;
    let addr = resolve(host, args.port)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_nodelay(true)?;
    let local_ip = match bind_ip(args)? {
        Some(ip) => ip,
        None => s.local_addr()?.ip().to_canonical(),
    };
    let ctx = open_ctx(local_ip, roce_port)?;
    super::tap(args, &ctx)?;

    // 1. Versions.
    let mut v = [0u8; 16];
    v[..PERFTEST_VERSION.len()].copy_from_slice(PERFTEST_VERSION.as_bytes());
    let peer_v = xchg(&mut s, &v)?;
    let peer_v =
        String::from_utf8_lossy(&peer_v[..peer_v.iter().position(|&c| c == 0).unwrap_or(16)])
            .into_owned();
    let ver = |t: &str| {
        let mut it = t.split('.');
        let major = it
            .next()
            .and_then(|x| x.trim().parse::<u32>().ok())
            .unwrap_or(0);
        let minor = it
            .next()
            .and_then(|x| x.trim().parse::<u32>().ok())
            .unwrap_or(0);
        (major, minor)
    };
    let modern = ver(&peer_v) >= (5, 33);
    // 2. System data: cycle buffer and cache line size, each the larger of both.
    let (mut cycle, mut line) = (CYCLE_BUFFER, CACHE_LINE);
    if modern {
        let be = |b: Vec<u8>| u32::from_be_bytes(b[..4].try_into().unwrap_or_default());
        cycle = cycle.max(be(xchg(&mut s, &CYCLE_BUFFER.to_be_bytes())?));
        line = line
            .max(be(xchg(&mut s, &CACHE_LINE.to_be_bytes())?))
            .max(8);
    }
    // 3. MTU: the ibv_mtu enum as "%d" + NUL; the smaller wins.
    let me = format!("{}\0", mtu_enum(my_mtu));
    let peer_mtu = xchg(&mut s, me.as_bytes())?;
    let peer_mtu = String::from_utf8_lossy(&peer_mtu)
        .trim_end_matches('\0')
        .parse::<u32>()
        .ok()
        .and_then(mtu_of_enum)
        .unwrap_or(my_mtu);
    let mtu = my_mtu.min(peer_mtu);

    // Resources: 2 x max(size, cycle buffer), rounded to the cache line.
    let buf_len = (2 * size.max(cycle)).div_ceil(line) * line;
    let pd = ctx.alloc_pd();
    let mr = pd.alloc_mr(buf_len as usize, REMOTE)?;
    {
        // perftest fills its buffers with random octets.
        let mut w = mr.write();
        let mut x = u64::from(random_psn()) | 1;
        for b in w.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    let tx_depth = u64::from(args.tx_depth.max(1)).min(iters.max(1));
    let cq = ctx.create_cq(tx_depth as usize + 16, None)?;
    let access = match test {
        PerftestTest::Write => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        PerftestTest::Read => Access::LOCAL_WRITE | Access::REMOTE_READ,
        PerftestTest::Atomic => Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        PerftestTest::Send => {
            return Err(PerfError::Usage(
                "--test send: ib_send_bw servers are reached over rdma_cm (--perftest-cm)".into(),
            ));
        }
    };
    let qp = create_rc(&pd, &cq, tx_depth as u32 + 1, 1, access)?;
    let out_reads: u16 = if test == PerftestTest::Write {
        1
    } else {
        u16::from(RD_ATOMIC)
    };
    let local = PerftestDest {
        lid: 0,
        out_reads,
        qpn: qp.qp_num(),
        psn: random_psn(),
        rkey: mr.rkey().0,
        vaddr: mr.addr(0),
        gid: ctx.roce_gid()?,
        srqn: 0,
    };
    // 4. The QP records, before connecting.
    let remote = xchg_dest(&mut s, &local)?;
    let peer_ip = softrdma::roce::gid_to_ip(&remote.gid);
    let path = OobPath {
        peer: SocketAddr::new(peer_ip, roce_port),
        dest_qp: remote.qpn,
        rq_psn: remote.psn,
        sq_psn: local.psn,
        pmtu: mtu,
        max_dest_rd_atomic: out_reads.min(255) as u8,
        max_rd_atomic: remote.out_reads.clamp(1, 255) as u8,
    };
    rtr_rts(&qp, &path).map_err(|(_, e)| e)?;
    // 5. Again after connecting; 6. the additional handshake after RTR.
    xchg_dest(&mut s, &local)?;
    xchg_dest(&mut s, &local)?;

    let t = Traffic {
        test,
        qp: &qp,
        cq: &cq,
        mr: &mr,
        size,
        iters,
        tx_depth,
        cycle,
        line,
        rkey: Key(remote.rkey),
        vaddr: remote.vaddr,
    };
    let r = t.run(args.wait())?.result(mtu, local, remote);

    // 7. The run is over (the server learns it here); 8. the report, field by field.
    xchg_dest(&mut s, &local)?;
    r.report(modern, |b| xchg(&mut s, b))?;
    // 9. The last handshake; 10. "done", without reading.
    xchg_dest(&mut s, &local)?;
    s.write_all(b"done\0")?;
    drop(s);
    Ok(r)
}

/// perftest's measured loop, the same whichever exchange set it up.
pub(super) struct Traffic<'a> {
    pub test: PerftestTest,
    pub qp: &'a Qp,
    pub cq: &'a Cq,
    pub mr: &'a softrdma::Mr,
    pub size: u32,
    pub iters: u64,
    pub tx_depth: u64,
    pub cycle: u32,
    pub line: u32,
    pub rkey: Key,
    pub vaddr: u64,
}

impl Traffic<'_> {
    /// `iters` operations of `size` with `tx_depth` outstanding; the seconds from the first
    /// post to the last completion. Addresses advance by the size rounded to the cache
    /// line, within the cycle buffer, when the size is at most half of it (perftest's
    /// `ctx_set_send_wqes`).
    pub(super) fn run(&self, wait: crate::verbs_util::WaitMode) -> Result<Measured, PerfError> {
        let Traffic {
            test,
            qp,
            cq,
            mr,
            size,
            iters,
            tx_depth,
            cycle,
            line,
            rkey,
            vaddr,
        } = *self;
        let step = if size <= cycle / 2 {
            u64::from(size.div_ceil(line) * line)
        } else {
            0
        };
        let cq_mod = (tx_depth / 2).clamp(1, 100);
        let wr = |i: u64| {
            let off = if step == 0 {
                0
            } else {
                (i * step) % u64::from(cycle)
            };
            let signaled = (i + 1).is_multiple_of(cq_mod) || i + 1 == iters;
            let sge = mr.sge(off as usize, size);
            let w = match test {
                PerftestTest::Write => SendWr::write(i, vec![sge], rkey, vaddr + off),
                PerftestTest::Read => SendWr::read(i, Some(sge), rkey, vaddr + off),
                PerftestTest::Atomic => SendWr::fetch_add(i, sge, rkey, vaddr + off, 1),
                PerftestTest::Send => SendWr::send(i, vec![sge]),
            };
            w.with_flags(if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            })
        };
        let (mut posted, mut retired) = (0u64, 0u64);
        let mut wcs = Vec::with_capacity(64);
        let start = Instant::now();
        while retired < iters {
            let mut batch = Vec::new();
            while posted < iters && posted - retired < tx_depth {
                batch.push(wr(posted));
                posted += 1;
            }
            if !batch.is_empty() {
                qp.post_send_list(batch).map_err(|(_, e)| e)?;
            }
            wcs.clear();
            wait_some(cq, wait, 64, SAFETY, &mut wcs)?;
            for wc in &wcs {
                check(wc)?;
                retired = retired.max(wc.wr_id + 1);
            }
        }
        let seconds = start.elapsed().as_secs_f64().max(1e-9);
        Ok(Measured {
            test,
            size,
            iters,
            seconds,
        })
    }
}

/// What [`Traffic::run`] measured.
pub(super) struct Measured {
    test: PerftestTest,
    size: u32,
    iters: u64,
    seconds: f64,
}

impl Measured {
    /// The run's figures with the records of both sides.
    pub(super) fn result(
        &self,
        mtu: u32,
        local: PerftestDest,
        remote: PerftestDest,
    ) -> PerftestResult {
        PerftestResult {
            test: self.test,
            size: self.size,
            iters: self.iters,
            seconds: self.seconds,
            bw_avg: (u64::from(self.size) * self.iters) as f64
                / self.seconds
                / crate::perf::stats::MB,
            msg_rate: self.iters as f64 / self.seconds / 1e6,
            mtu,
            local,
            remote,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    /// Frames 15/16 of fixtures/captures/rxe-interop/ib_write_bw-n5.pcap.
    #[test]
    fn perftest_dest_matches_the_capture() {
        let client = b"0000:0001:000018:5b60d0:0000096d:00007f0479e2f000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\0";
        assert_eq!(client.len(), DEST_LEN);
        let d = PerftestDest::parse(client).unwrap();
        assert_eq!(
            (d.lid, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr, d.srqn),
            (0, 1, 0x18, 0x5b60d0, 0x96d, 0x7f04_79e2_f000, 0)
        );
        assert_eq!(
            softrdma::roce::gid_to_ip(&d.gid),
            "10.77.0.3".parse::<IpAddr>().unwrap()
        );
        assert_eq!(&d.encode(), client);
        assert_eq!((mtu_enum(1024), mtu_of_enum(3)), (3, Some(1024)));
        assert_eq!(mtu_of_enum(5), Some(4096));
    }
}
