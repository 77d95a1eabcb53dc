//! `--pcap FILE`: what a tool's contexts sent and received, written as a pcap file
//! (link type RAW: IP packets) that `softrdma decode` and tshark read.
//!
//! The library's tap ([`softrdma::Tap`]) reports stream octets and datagrams as they pass
//! the sockets; the IP, TCP and UDP headers the kernel put around them are not visible to a
//! user-space program, so they are made here: a TCP connection gets a three-way handshake,
//! sequence numbers counted from it and FINs; a RoCEv2 datagram gets the IPv4 header its
//! ICRC was computed over (DF, the Identification recovered from the ICRC, as the receive
//! path does), so the capture checks as it did on the wire. Datagrams sent through the raw
//! socket are written as they left.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etherparse::{IpHeaders, IpNumber, Ipv4Extensions, Ipv4Header, Ipv6Extensions, Ipv6Header};
use etherparse::{PacketBuilder, PacketBuilderStep};
use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use softrdma::{Direction, Tap, Tapped};
use softrdma_wire::icrc::{Endpoints, IcrcCheck, IcrcVerifier};
use std::sync::Mutex;

/// TCP payload per synthesised segment: what an IPv4 or IPv6 packet of at most 65,535
/// octets carries with room for the headers.
const MAX_SEGMENT: usize = 65_000;
/// RoCEv2 senders' TTL (rxe's and ours).
const TTL: u8 = 64;
/// Receive window advertised in the synthesised segments (nothing reads it).
const WINDOW: u16 = 65_535;

/// A pcap file fed by the taps of one or more contexts.
pub struct PcapTap {
    path: PathBuf,
    inner: Mutex<Inner>,
}

/// The file under the pcap writer, shared so that it can be flushed while the writer
/// (which does not give its writer back but by value) goes on.
#[derive(Clone)]
struct Spool(Arc<Mutex<BufWriter<File>>>);

impl io::Write for Spool {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.0).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        lock(&self.0).flush()
    }
}

/// Locks, whether or not a holder panicked (a capture is best kept).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    out: Option<PcapWriter<Spool>>,
    spool: Spool,
    /// Next sequence numbers of each connection, by (local, peer).
    flows: HashMap<(SocketAddr, SocketAddr), Flow>,
    icrc: IcrcVerifier,
    frames: u64,
    /// UDP destination ports of RoCEv2 datagrams other than 4791 (tests, loopback runs):
    /// a decoder must be told them.
    other_ports: std::collections::BTreeSet<u16>,
    /// The first write error; nothing is written after it.
    error: Option<String>,
    buf: Vec<u8>,
}

/// A TCP connection's next sequence number each way.
#[derive(Clone, Copy)]
struct Flow {
    local_seq: u32,
    peer_seq: u32,
}

impl PcapTap {
    /// Creates (truncates) `path` and writes the pcap header.
    pub fn create(path: &Path) -> Result<Arc<PcapTap>, String> {
        let file = File::create(path).map_err(|e| format!("--pcap {}: {e}", path.display()))?;
        let header = PcapHeader {
            datalink: DataLink::RAW,
            ts_resolution: pcap_file::TsResolution::NanoSecond,
            ..PcapHeader::default()
        };
        let spool = Spool(Arc::new(Mutex::new(BufWriter::new(file))));
        let out = PcapWriter::with_header(spool.clone(), header)
            .map_err(|e| format!("--pcap {}: {e}", path.display()))?;
        Ok(Arc::new(PcapTap {
            path: path.to_owned(),
            inner: Mutex::new(Inner {
                out: Some(out),
                spool,
                flows: HashMap::new(),
                icrc: IcrcVerifier::new(),
                frames: 0,
                other_ports: Default::default(),
                error: None,
                buf: Vec::new(),
            }),
        }))
    }

    /// Taps `ctx` into this file.
    pub fn attach(self: &Arc<Self>, ctx: &softrdma::Context) -> Result<(), String> {
        if ctx.set_tap(self.clone()) {
            Ok(())
        } else {
            Err(format!(
                "--pcap {}: {} already has a tap",
                self.path.display(),
                ctx.device().name()
            ))
        }
    }

    /// Flushes the file: how many frames it holds, or the first write error.
    pub fn finish(&self) -> Result<u64, String> {
        let mut g = lock(&self.inner);
        if g.out.take().is_some()
            && let Err(e) = io::Write::flush(&mut g.spool)
            && g.error.is_none()
        {
            g.error = Some(e.to_string());
        }
        match &g.error {
            Some(e) => Err(format!("--pcap {}: {e}", self.path.display())),
            None => Ok(g.frames),
        }
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes what is buffered (a server between clients: what a kill then loses is only
    /// the current client's).
    pub fn flush(&self) {
        let mut g = lock(&self.inner);
        if g.out.is_none() {
            return;
        }
        if let Err(e) = io::Write::flush(&mut g.spool) {
            g.error = Some(e.to_string());
            g.out = None;
        }
    }

    /// UDP ports RoCEv2 went to other than 4791.
    pub fn other_roce_ports(&self) -> Vec<u16> {
        lock(&self.inner).other_ports.iter().copied().collect()
    }

    /// [`finish`](Self::finish), told on standard error as `tool: N frames written to FILE`
    /// (with how to decode RoCEv2 on another port); `false` if the file could not be written.
    pub fn finish_and_tell(&self, tool: &str) -> bool {
        match self.finish() {
            Ok(n) => {
                eprintln!("{tool}: {n} frames written to {}", self.path.display());
                for p in self.other_roce_ports() {
                    eprintln!(
                        "{tool}: RoCEv2 on UDP port {p}: decode with `softrdma decode --roce-port {p}` \
                         or `tshark -d udp.port=={p},infiniband`"
                    );
                }
                true
            }
            Err(e) => {
                eprintln!("{tool}: {e}");
                false
            }
        }
    }
}

/// Runs a tool's body `f` with the `--pcap` file `path` names open (`None` without one),
/// then writes the file out whatever the outcome and says so; the exit status, at least 1
/// when the file could not be created or written.
pub fn with_pcap(
    path: Option<&Path>,
    tool: &str,
    f: impl FnOnce(Option<&Arc<PcapTap>>) -> i32,
) -> i32 {
    let tap = match path.map(PcapTap::create).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{tool}: {e}");
            return 1;
        }
    };
    let rc = f(tap.as_ref());
    match tap {
        Some(t) if !t.finish_and_tell(tool) => rc.max(1),
        _ => rc,
    }
}

/// [`with_pcap`] for a body that fails with a message: printed after `tool`, exit status 1.
pub fn with_pcap_or_fail(
    path: Option<&Path>,
    tool: &str,
    f: impl FnOnce(Option<&Arc<PcapTap>>) -> Result<(), String>,
) -> i32 {
    with_pcap(path, tool, |tap| match f(tap) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{tool}: {e}");
            1
        }
    })
}

impl std::fmt::Debug for PcapTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapTap").field("path", &self.path).finish()
    }
}

impl Tap for PcapTap {
    fn tapped(&self, t: Tapped<'_>) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let mut g = lock(&self.inner);
        if g.out.is_none() {
            return;
        }
        g.event(ts, t);
    }
}

/// TCP flags of a synthesised segment.
#[derive(Clone, Copy, Default)]
struct Flags {
    syn: bool,
    ack: bool,
    fin: bool,
    psh: bool,
}

impl Inner {
    fn event(&mut self, ts: Duration, t: Tapped<'_>) {
        match t {
            Tapped::TcpOpen {
                local,
                peer,
                active,
            } => {
                // Initial sequence numbers from the ports: distinct per connection, and the
                // same run gives the same file.
                let isn = |a: SocketAddr, b: SocketAddr| {
                    (u32::from(a.port()) << 16 | u32::from(b.port())).wrapping_mul(2_654_435_761)
                };
                let f = Flow {
                    local_seq: isn(local, peer),
                    peer_seq: isn(peer, local),
                };
                let (a, b, a_seq, b_seq) = if active {
                    (local, peer, f.local_seq, f.peer_seq)
                } else {
                    (peer, local, f.peer_seq, f.local_seq)
                };
                let syn = Flags {
                    syn: true,
                    ..Flags::default()
                };
                self.tcp(ts, a, b, a_seq, 0, syn, &[]);
                let syn_ack = Flags {
                    syn: true,
                    ack: true,
                    ..Flags::default()
                };
                self.tcp(ts, b, a, b_seq, a_seq.wrapping_add(1), syn_ack, &[]);
                let ack = Flags {
                    ack: true,
                    ..Flags::default()
                };
                self.tcp(
                    ts,
                    a,
                    b,
                    a_seq.wrapping_add(1),
                    b_seq.wrapping_add(1),
                    ack,
                    &[],
                );
                // The SYNs count one each.
                let next = Flow {
                    local_seq: f.local_seq.wrapping_add(1),
                    peer_seq: f.peer_seq.wrapping_add(1),
                };
                self.flows.insert((local, peer), next);
            }
            Tapped::TcpData {
                local,
                peer,
                dir,
                data,
            } => self.tcp_data(ts, local, peer, dir, data),
            Tapped::TcpClose { local, peer, dir } => {
                let f = self.flow(local, peer);
                let (src, dst, seq, ack) = oriented(local, peer, dir, f);
                let fin = Flags {
                    fin: true,
                    ack: true,
                    ..Flags::default()
                };
                self.tcp(ts, src, dst, seq, ack, fin, &[]);
                self.advance(local, peer, dir, 1);
            }
            Tapped::Udp {
                local,
                peer,
                dir,
                payload,
            } => {
                let (src, dst) = match dir {
                    Direction::Sent => (local, peer),
                    Direction::Received => (peer, local),
                };
                if dst.port() != softrdma_wire::rocev2::ROCEV2_UDP_PORT {
                    self.other_ports.insert(dst.port());
                }
                self.udp(ts, src, dst, payload);
            }
            Tapped::Ipv4 { packet } => self.raw_ipv4(ts, packet),
        }
    }

    /// A connection tapped before it was seen opening (none today) starts at 1 each way.
    fn flow(&mut self, local: SocketAddr, peer: SocketAddr) -> Flow {
        *self.flows.entry((local, peer)).or_insert(Flow {
            local_seq: 1,
            peer_seq: 1,
        })
    }

    fn advance(&mut self, local: SocketAddr, peer: SocketAddr, dir: Direction, n: usize) {
        if let Some(f) = self.flows.get_mut(&(local, peer)) {
            match dir {
                Direction::Sent => f.local_seq = f.local_seq.wrapping_add(n as u32),
                Direction::Received => f.peer_seq = f.peer_seq.wrapping_add(n as u32),
            }
        }
    }

    fn tcp_data(
        &mut self,
        ts: Duration,
        local: SocketAddr,
        peer: SocketAddr,
        dir: Direction,
        data: &[IoSlice<'_>],
    ) {
        let total: usize = data.iter().map(|s| s.len()).sum();
        let mut seg = Vec::with_capacity(total.min(MAX_SEGMENT));
        let mut left = total;
        for s in data {
            let mut s: &[u8] = s;
            while !s.is_empty() {
                let k = s.len().min(MAX_SEGMENT - seg.len());
                seg.extend_from_slice(&s[..k]);
                s = &s[k..];
                if seg.len() == MAX_SEGMENT {
                    left -= seg.len();
                    self.tcp_segment(ts, local, peer, dir, &seg, left == 0);
                    seg.clear();
                }
            }
        }
        if !seg.is_empty() {
            self.tcp_segment(ts, local, peer, dir, &seg, true);
        }
    }

    fn tcp_segment(
        &mut self,
        ts: Duration,
        local: SocketAddr,
        peer: SocketAddr,
        dir: Direction,
        seg: &[u8],
        last: bool,
    ) {
        let f = self.flow(local, peer);
        let (src, dst, seq, ack) = oriented(local, peer, dir, f);
        let flags = Flags {
            ack: true,
            psh: last,
            ..Flags::default()
        };
        self.tcp(ts, src, dst, seq, ack, flags, seg);
        self.advance(local, peer, dir, seg.len());
    }

    #[allow(clippy::too_many_arguments)]
    fn tcp(
        &mut self,
        ts: Duration,
        src: SocketAddr,
        dst: SocketAddr,
        seq: u32,
        ack: u32,
        flags: Flags,
        payload: &[u8],
    ) {
        let Some(ip) = ip_headers(src.ip(), dst.ip(), IpNumber::TCP, 0) else {
            return;
        };
        let mut b = PacketBuilder::ip(ip).tcp(src.port(), dst.port(), seq, WINDOW);
        if flags.syn {
            b = b.syn();
        }
        if flags.ack {
            b = b.ack(ack);
        }
        if flags.fin {
            b = b.fin();
        }
        if flags.psh {
            b = b.psh();
        }
        self.build(ts, b, payload);
    }

    fn udp(&mut self, ts: Duration, src: SocketAddr, dst: SocketAddr, payload: &[u8]) {
        // The Identification the ICRC was computed over (module docs); 0 if the datagram
        // does not check (it is written as it was, for the decoder to flag).
        let ep = Endpoints::from_socket_addrs(src, dst);
        let id = match self.icrc.verify(&ep, payload) {
            IcrcCheck::Valid { ipv4_id } => ipv4_id.unwrap_or(0),
            IcrcCheck::Invalid => 0,
        };
        let Some(ip) = ip_headers(src.ip(), dst.ip(), IpNumber::UDP, id) else {
            return;
        };
        let b = PacketBuilder::ip(ip).udp(src.port(), dst.port());
        self.build(ts, b, payload);
    }

    fn build<T>(&mut self, ts: Duration, b: PacketBuilderStep<T>, payload: &[u8])
    where
        PacketBuilderStep<T>: Build,
    {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        if b.build_into(&mut buf, payload) {
            self.write(ts, &buf);
        }
        self.buf = buf;
    }

    fn raw_ipv4(&mut self, ts: Duration, packet: &[u8]) {
        // The raw socket's kernel fills in the header checksum: so does the capture.
        let Ok((mut h, rest)) = Ipv4Header::from_slice(packet) else {
            return;
        };
        h.header_checksum = h.calc_header_checksum();
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.extend_from_slice(&h.to_bytes());
        buf.extend_from_slice(rest);
        self.write(ts, &buf);
        self.buf = buf;
    }

    fn write(&mut self, ts: Duration, frame: &[u8]) {
        let Some(out) = self.out.as_mut() else { return };
        let len = frame.len() as u32;
        match out.write_packet(&PcapPacket::new(ts, len, frame)) {
            Ok(_) => self.frames += 1,
            Err(e) => {
                self.error = Some(e.to_string());
                self.out = None;
            }
        }
    }
}

/// Source, destination, sequence and acknowledgment numbers of a segment going `dir`.
fn oriented(
    local: SocketAddr,
    peer: SocketAddr,
    dir: Direction,
    f: Flow,
) -> (SocketAddr, SocketAddr, u32, u32) {
    match dir {
        Direction::Sent => (local, peer, f.local_seq, f.peer_seq),
        Direction::Received => (peer, local, f.peer_seq, f.local_seq),
    }
}

/// The IP header between two addresses: IPv4 (DF, `id`, TTL 64) when both are IPv4 or
/// IPv4-mapped, else IPv6. Lengths and checksums are filled in by the builder.
fn ip_headers(src: IpAddr, dst: IpAddr, proto: IpNumber, id: u16) -> Option<IpHeaders> {
    match (src.to_canonical(), dst.to_canonical()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = Ipv4Header::new(0, TTL, proto, s.octets(), d.octets()).ok()?;
            h.identification = id;
            h.dont_fragment = true;
            Some(IpHeaders::Ipv4(h, Ipv4Extensions::default()))
        }
        _ => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            let h = Ipv6Header {
                traffic_class: 0,
                flow_label: Default::default(),
                payload_length: 0,
                next_header: proto,
                hop_limit: TTL,
                source: v6(src).octets(),
                destination: v6(dst).octets(),
            };
            Some(IpHeaders::Ipv6(h, Ipv6Extensions::default()))
        }
    }
}

/// The last step of an `etherparse` packet builder, whatever its transport header.
trait Build {
    fn build_into(self, out: &mut Vec<u8>, payload: &[u8]) -> bool;
}

impl Build for PacketBuilderStep<etherparse::TcpHeader> {
    fn build_into(self, out: &mut Vec<u8>, payload: &[u8]) -> bool {
        self.write(out, payload).is_ok()
    }
}

impl Build for PacketBuilderStep<etherparse::UdpHeader> {
    fn build_into(self, out: &mut Vec<u8>, payload: &[u8]) -> bool {
        self.write(out, payload).is_ok()
    }
}
