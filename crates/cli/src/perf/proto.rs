//! What a `softrdma perf` client and server tell each other, the same over iWARP and RoCE.
//! There is no session socket for the RDMA tests: each test is one connection of the
//! connection manager, the test's parameters in the request's private data, the server's
//! buffer (address, R_Key, length) and the test's id in the accept's. The client ends a
//! test with an `End` request naming the id, which the server rejects once it tore the test
//! down, with an [`EndReport`] (what it received and whether every octet was right) as the
//! rejection's private data. `Bye` ends the session.
//!
//! `-b` against a server: the client serves on its own side too and asks the server with a
//! [`Reverse`] request (rejected at once with the test's id) to run one measurement toward
//! it — an RDMA test or a raw baseline — while it runs its own; its `End` is answered when
//! the server's measurement finished, with the figures in the [`EndReport`].
//!
//! `-q N` against a server: N connections of `ScaleQp` requests, the first opening a
//! session (one region of N slots at the server), the others naming it by id; `End` checks
//! every slot.
//!
//! The raw baselines open a plain TCP connection to the raw server and start with a
//! 16-octet header; a raw UDP test then names the client's UDP socket, and the server
//! answers with the port of its own.
//!
//! Test ids are random 64-bit numbers, and the server ends a test (or reads its report) only
//! for an `End` from the address that opened it: a client cannot end another's test.
//! A request the server refuses (too large, past its memory budget, busy) is rejected with a
//! [`Refusal`].
//!
//! All integers little-endian unless said otherwise.

use std::fmt;
use std::time::Duration;

use super::Limit;
use super::stats::Bw;

/// First octets of every request and reply ("softrdma perf").
pub const MAGIC: [u8; 4] = *b"SRPF";
/// Layout version of these messages.
pub const VERSION: u8 = 4;

/// One test of the RDMA side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Test {
    /// RDMA Write bandwidth.
    WriteBw,
    /// RDMA Read bandwidth.
    ReadBw,
    /// Send bandwidth (the server returns receive credits).
    SendBw,
    /// RDMA Write latency (both sides poll memory, as ib_write_lat).
    WriteLat,
    /// RDMA Read latency.
    ReadLat,
    /// Send latency (ping-pong).
    SendLat,
    /// `-b`: run a measurement toward the client ([`Reverse`]).
    Reverse,
    /// `-q`: one QP of a scale session (`count`: the session's QPs; `id`: 0 opens one).
    ScaleQp,
    /// End of the test `id` (the server rejects it with its [`EndReport`]).
    End,
    /// End of the client's session (the server rejects it and may exit).
    Bye,
}

impl Test {
    fn code(self) -> u8 {
        match self {
            Test::WriteBw => 1,
            Test::ReadBw => 2,
            Test::SendBw => 3,
            Test::WriteLat => 4,
            Test::ReadLat => 5,
            Test::SendLat => 6,
            Test::Reverse => 7,
            Test::ScaleQp => 8,
            Test::End => 0xfe,
            Test::Bye => 0xff,
        }
    }

    fn from_code(c: u8) -> Option<Test> {
        Some(match c {
            1 => Test::WriteBw,
            2 => Test::ReadBw,
            3 => Test::SendBw,
            4 => Test::WriteLat,
            5 => Test::ReadLat,
            6 => Test::SendLat,
            7 => Test::Reverse,
            8 => Test::ScaleQp,
            0xfe => Test::End,
            0xff => Test::Bye,
            _ => return None,
        })
    }

    /// perftest's name for the test.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW",
            Test::ReadBw => "RDMA_Read BW",
            Test::SendBw => "Send BW",
            Test::WriteLat => "RDMA_Write Lat",
            Test::ReadLat => "RDMA_Read Lat",
            Test::SendLat => "Send Lat",
            Test::Reverse => "reverse",
            Test::ScaleQp => "scale",
            Test::End => "end",
            Test::Bye => "bye",
        }
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A remote buffer: where the peer may write or read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Address (Tagged Offset) of the buffer's first octet.
    pub addr: u64,
    /// R_Key (STag).
    pub rkey: u32,
    /// Length in octets.
    pub len: u32,
}

impl RemoteBuf {
    /// The first `len` octets of `mr`.
    pub fn of(mr: &softrdma::Mr, len: u32) -> RemoteBuf {
        RemoteBuf {
            addr: mr.addr(0),
            rkey: mr.rkey().0,
            len,
        }
    }

    fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.rkey.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    fn parse(b: &[u8]) -> RemoteBuf {
        RemoteBuf {
            addr: le64(&b[0..8]),
            rkey: le32(&b[8..12]),
            len: le32(&b[12..16]),
        }
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().unwrap_or_default())
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap_or_default())
}

fn header(out: &mut Vec<u8>, code: u8) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[VERSION, code, 0, 0]);
}

fn ours(b: &[u8], len: usize) -> bool {
    b.len() >= len && b[0..4] == MAGIC && b[4] == VERSION
}

/// The connection request's private data: which test, how large, and the client's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The test.
    pub test: Test,
    /// Message size.
    pub size: u32,
    /// Send bandwidth: receives the server keeps posted (the client's credit window).
    pub rx_depth: u32,
    /// `End`: the test it ends (the id of the server's [`Reply`]).
    pub id: u64,
    /// `End`: messages the client sent (Send tests: what the server should have received).
    pub count: u64,
    /// The client's buffer (Write latency: where the server writes back).
    pub buf: RemoteBuf,
}

/// Octets of an encoded [`Request`].
pub const REQUEST_LEN: usize = 48;
/// Octets of an encoded [`Reply`].
pub const REPLY_LEN: usize = 32;
/// Octets of an [`EndReport`] before its figures and message.
pub const END_LEN: usize = 24;
/// Longest private data of a rejection (RoCE's REJ carries 148 octets): an [`EndReport`]
/// with its message cut to fit.
pub const REJECT_MAX: usize = 148;

impl Request {
    /// A request of `test` with every other field zero.
    pub fn new(test: Test) -> Request {
        Request {
            test,
            size: 0,
            rx_depth: 0,
            id: 0,
            count: 0,
            buf: RemoteBuf::default(),
        }
    }

    /// The private data.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REQUEST_LEN);
        header(&mut v, self.test.code());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.rx_depth.to_le_bytes());
        v.extend_from_slice(&self.id.to_le_bytes());
        v.extend_from_slice(&self.count.to_le_bytes());
        self.buf.emit(&mut v);
        v
    }

    /// Parses private data; `None` if it is not a `softrdma perf` request of this version.
    pub fn parse(b: &[u8]) -> Option<Request> {
        if !ours(b, REQUEST_LEN) {
            return None;
        }
        Some(Request {
            test: Test::from_code(b[5])?,
            size: le32(&b[8..12]),
            rx_depth: le32(&b[12..16]),
            id: le64(&b[16..24]),
            count: le64(&b[24..32]),
            buf: RemoteBuf::parse(&b[32..48]),
        })
    }
}

/// The accept's private data: the test's id and the server's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// What the client's `End` names (random: not guessed by another client).
    pub id: u64,
    /// Where the client writes (Write), reads (Read) or nothing (Send).
    pub buf: RemoteBuf,
}

impl Reply {
    /// The private data.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REPLY_LEN);
        header(&mut v, 0);
        v.extend_from_slice(&self.id.to_le_bytes());
        self.buf.emit(&mut v);
        v
    }

    /// Accepts `req` onto `qp` with this reply as the private data, as `rdma_accept` with the
    /// request's parameters does: our IRD is the initiator's ORD, our ORD its IRD
    /// (`default`: what the request did not say).
    pub fn accept(
        &self,
        req: softrdma::ConnRequest,
        qp: &softrdma::Qp,
        default: (u16, u16),
        (pmtu, fpdu): (u32, softrdma::iwarp::FpduSize),
    ) -> Result<softrdma::ConnectionInfo, softrdma::Error> {
        let (peer_ird, peer_ord) = req.peer_ird_ord().unwrap_or(default);
        req.accept(
            qp,
            softrdma::AcceptParams {
                private_data: self.emit(),
                ird: peer_ord.max(1),
                ord: peer_ird,
                iwarp: softrdma::iwarp::AcceptParams { fpdu },
                roce: softrdma::roce::AcceptParams { pmtu },
                ..softrdma::AcceptParams::default()
            },
        )
    }

    /// Parses private data.
    pub fn parse(b: &[u8]) -> Option<Reply> {
        if !ours(b, REPLY_LEN) {
            return None;
        }
        Some(Reply {
            id: le64(&b[8..16]),
            buf: RemoteBuf::parse(&b[16..32]),
        })
    }
}

/// What the server saw of a test, in the rejection of the client's `End`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndReport {
    /// Messages received (Send tests).
    pub recvs: u64,
    /// Octets received (Send tests).
    pub recv_bytes: u64,
    /// A [`Reverse`] test: what the server measured toward the client (`None` for a raw
    /// UDP baseline with GSO where the server's kernel has none).
    pub bw: Option<Bw>,
    /// Why the test failed at the server (a completion in error, an octet that is not what
    /// the client sent); `None`: every octet the server holds is right.
    pub error: Option<String>,
}

/// Octets of the figures an [`EndReport`] with `bw` carries after [`END_LEN`].
const END_BW_LEN: usize = 40;

impl EndReport {
    /// The private data: at most [`REJECT_MAX`] octets (the message is cut to fit).
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REJECT_MAX);
        header(&mut v, u8::from(self.error.is_some()));
        v[6] = u8::from(self.bw.is_some());
        v.extend_from_slice(&self.recvs.to_le_bytes());
        v.extend_from_slice(&self.recv_bytes.to_le_bytes());
        if let Some(b) = &self.bw {
            let nanos = (b.seconds * 1e9).round() as u64;
            for x in [b.iters, b.bytes, nanos, b.lost_bytes] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            let peak = b.peak_gbit_s.map_or(0, f64::to_bits);
            v.extend_from_slice(&peak.to_le_bytes());
        }
        if let Some(e) = &self.error {
            let mut n = e.len().min(REJECT_MAX - v.len());
            while !e.is_char_boundary(n) {
                n -= 1;
            }
            v.extend_from_slice(&e.as_bytes()[..n]);
        }
        v
    }

    /// Parses private data.
    pub fn parse(b: &[u8]) -> Option<EndReport> {
        if !ours(b, END_LEN) {
            return None;
        }
        let mut at = END_LEN;
        let bw = if b[6] & 1 != 0 {
            let f = b.get(END_LEN..END_LEN + END_BW_LEN)?;
            at += END_BW_LEN;
            let peak = le64(&f[32..40]);
            let bw = Bw::from_parts(
                le64(&f[0..8]),
                le64(&f[8..16]),
                le64(&f[16..24]) as f64 / 1e9,
                le64(&f[24..32]),
                (peak != 0).then(|| f64::from_bits(peak)),
            );
            Some(bw)
        } else {
            None
        };
        Some(EndReport {
            recvs: le64(&b[8..16]),
            recv_bytes: le64(&b[16..24]),
            bw,
            // RoCE's REJ pads its private data with zeros.
            error: (b[5] != 0).then(|| {
                String::from_utf8_lossy(&b[at..])
                    .trim_end_matches('\0')
                    .to_owned()
            }),
        })
    }
}

/// Why the server refused a test request: the rejection's private data, which the client
/// reports as such.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The buffer asked for is above the server's per-test cap (`--max-buffer`).
    TooLarge {
        /// Octets asked for.
        asked: u64,
        /// The cap.
        cap: u64,
    },
    /// The test's memory would take the server past its budget for all tests at once
    /// (`--mem-budget`); it may fit once other tests end.
    OverBudget {
        /// Octets the test would take.
        asked: u64,
        /// Octets of the budget the running tests hold.
        used: u64,
        /// The budget.
        budget: u64,
    },
    /// Too many tests at once, of this client's address or in all.
    Busy {
        /// Tests of the client's address running.
        mine: u64,
        /// Tests running in all.
        all: u64,
    },
}

/// Code of a [`Refusal`] (a request's code would be the test's).
const REFUSAL: u8 = 0xfd;
/// Octets of a [`Refusal`] before its text.
const REFUSAL_LEN: usize = 32;

impl Refusal {
    /// The private data: the figures, then the text for a reader of the octets.
    pub fn emit(&self) -> Vec<u8> {
        let (kind, figures) = match *self {
            Refusal::TooLarge { asked, cap } => (1, [asked, cap, 0]),
            Refusal::OverBudget {
                asked,
                used,
                budget,
            } => (2, [asked, used, budget]),
            Refusal::Busy { mine, all } => (3, [mine, all, 0]),
        };
        let mut v = Vec::with_capacity(REJECT_MAX);
        header(&mut v, REFUSAL);
        v[6] = kind;
        for x in figures {
            v.extend_from_slice(&x.to_le_bytes());
        }
        let text = format!("softrdma perf: {self}");
        let n = text.len().min(REJECT_MAX - v.len());
        v.extend_from_slice(&text.as_bytes()[..n]);
        v
    }

    /// Parses a rejection's private data; `None` if it is not a refusal.
    pub fn parse(b: &[u8]) -> Option<Refusal> {
        if !ours(b, REFUSAL_LEN) || b[5] != REFUSAL {
            return None;
        }
        let (x, y, z) = (le64(&b[8..16]), le64(&b[16..24]), le64(&b[24..32]));
        Some(match b[6] {
            1 => Refusal::TooLarge { asked: x, cap: y },
            2 => Refusal::OverBudget {
                asked: x,
                used: y,
                budget: z,
            },
            3 => Refusal::Busy { mine: x, all: y },
            _ => return None,
        })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::TooLarge { asked, cap } => {
                write!(f, "{asked} octets is above the server's --max-buffer {cap}")
            }
            Refusal::OverBudget {
                asked,
                used,
                budget,
            } => write!(
                f,
                "{asked} octets past the memory budget (--mem-budget {budget}, {used} in use): try later"
            ),
            Refusal::Busy { mine, all } => write!(
                f,
                "busy ({mine} tests of this address running, {all} in all)"
            ),
        }
    }
}

/// What a [`Reverse`] request asks the server to measure toward the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// An RDMA bandwidth test (Write, Read or Send).
    Rdma(Test),
    /// The raw baseline's bandwidth (TCP for iWARP, UDP for RoCE).
    Raw,
    /// RoCE: the raw UDP baseline with GSO.
    RawGso,
}

/// `-b` against a server: run `what` toward the client (at the request's source address)
/// for `limit`, with the client's window; the client serves its RDMA tests at `rdma_port`
/// and its raw baselines at `raw_port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reverse {
    /// The measurement.
    pub what: Measure,
    /// Message size.
    pub size: u32,
    /// How long.
    pub limit: Limit,
    /// Requests the server keeps outstanding.
    pub tx_depth: u32,
    /// Send bandwidth: receives the client keeps posted.
    pub rx_depth: u32,
    /// The client's connection manager port.
    pub rdma_port: u16,
    /// The client's raw baseline server port.
    pub raw_port: u16,
    /// Different in every request of a client: a request the network repeats is known by
    /// it (and gets the answer the first one got), two that ask the same are not confused.
    pub nonce: u64,
}

/// The longest test a [`Reverse`] request may ask for: a server does not run one forever
/// for a client that left.
pub const REVERSE_MAX: Duration = Duration::from_secs(3600);

impl Reverse {
    /// The private data ([`REQUEST_LEN`] octets, as every request's).
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REQUEST_LEN);
        header(&mut v, Test::Reverse.code());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.rx_depth.to_le_bytes());
        v.extend_from_slice(&self.tx_depth.to_le_bytes());
        v.push(match self.what {
            Measure::Rdma(t) => t.code(),
            Measure::Raw => 0x10,
            Measure::RawGso => 0x12,
        });
        let (kind, n) = match self.limit {
            Limit::Iters(n) => (0, n),
            Limit::Duration(d) => (1, u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        };
        v.push(kind);
        v.extend_from_slice(&self.rdma_port.to_le_bytes());
        v.extend_from_slice(&n.to_le_bytes());
        v.extend_from_slice(&self.raw_port.to_le_bytes());
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.resize(REQUEST_LEN, 0);
        v
    }

    /// Parses private data; `None` if it is not a valid `Reverse` request (a bandwidth test
    /// or a raw baseline, at least one iteration, at most [`REVERSE_MAX`]).
    pub fn parse(b: &[u8]) -> Option<Reverse> {
        if !ours(b, REQUEST_LEN) || Test::from_code(b[5])? != Test::Reverse {
            return None;
        }
        let what = match b[20] {
            0x10 => Measure::Raw,
            0x12 => Measure::RawGso,
            c => match Test::from_code(c)? {
                t @ (Test::WriteBw | Test::ReadBw | Test::SendBw) => Measure::Rdma(t),
                _ => return None,
            },
        };
        let n = le64(&b[24..32]);
        let limit = match b[21] {
            0 if n > 0 => Limit::Iters(n),
            1 if n > 0 && n <= REVERSE_MAX.as_micros() as u64 => {
                Limit::Duration(Duration::from_micros(n))
            }
            _ => return None,
        };
        Some(Reverse {
            what,
            size: le32(&b[8..12]),
            rx_depth: le32(&b[12..16]),
            tx_depth: le32(&b[16..20]),
            limit,
            rdma_port: u16::from_le_bytes([b[22], b[23]]),
            raw_port: u16::from_le_bytes([b[32], b[33]]),
            nonce: le64(&b[34..42]),
        })
    }
}

/// Seed of what the client sends and writes.
pub const CLIENT_SEED: u8 = 0x35;
/// Seed of what the server's buffers hold for the client to read, and what it writes back.
pub const SERVER_SEED: u8 = 0xc7;

/// Octet `i` of a payload with `seed`: a pattern whose octets differ from their neighbours',
/// so data placed at the wrong offset shows.
pub fn pattern_at(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8)
}

/// Fills `buf` with the pattern of `seed`.
pub fn fill(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_at(i, seed);
    }
}

/// The first octet of `buf` that is not the pattern of `seed`.
pub fn first_mismatch(buf: &[u8], seed: u8) -> Option<usize> {
    buf.iter()
        .enumerate()
        .position(|(i, &b)| b != pattern_at(i, seed))
}

/// Raw baseline test kinds (first octets of a connection to the raw server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawTest {
    /// TCP: stream `size`-octet writes until the client shuts its side down; the server
    /// answers with the octet count it read (8 octets).
    TcpBw,
    /// TCP: echo `size`-octet messages until the client closes.
    TcpLat,
    /// UDP bandwidth: count and acknowledge datagrams until the client shuts the TCP
    /// connection down, then answer with the octet count.
    UdpBw,
    /// UDP ping-pong: echo datagrams until the client shuts the TCP connection down.
    UdpLat,
    /// UDP bandwidth with segmentation offload: as [`RawTest::UdpBw`], the client sending
    /// super-datagrams of path-MTU segments (`UDP_SEGMENT`), the server receiving with
    /// `UDP_GRO`.
    UdpGsoBw,
    /// End of the client's session.
    Bye,
}

/// Octets of a raw test header.
pub const RAW_HEADER_LEN: usize = 16;
/// Octets that follow the header of a UDP test: the client's UDP port (big-endian) and GID.
pub const UDP_ENDPOINT_LEN: usize = 18;

/// Encodes a raw test header.
pub fn raw_header(test: RawTest, size: u32) -> [u8; RAW_HEADER_LEN] {
    let mut h = [0u8; RAW_HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = match test {
        RawTest::TcpBw => 1,
        RawTest::TcpLat => 2,
        RawTest::UdpBw => 0x10,
        RawTest::UdpLat => 0x11,
        RawTest::UdpGsoBw => 0x12,
        RawTest::Bye => 0xff,
    };
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

/// Parses a raw test header.
pub fn parse_raw_header(h: &[u8; RAW_HEADER_LEN]) -> Option<(RawTest, u32)> {
    if !ours(h, RAW_HEADER_LEN) {
        return None;
    }
    let t = match h[5] {
        1 => RawTest::TcpBw,
        2 => RawTest::TcpLat,
        0x10 => RawTest::UdpBw,
        0x11 => RawTest::UdpLat,
        0x12 => RawTest::UdpGsoBw,
        0xff => RawTest::Bye,
        _ => return None,
    };
    Some((t, le32(&h[8..12])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_reply_end_round_trip() {
        let r = Request {
            test: Test::SendBw,
            size: 65536,
            rx_depth: 512,
            id: 0xfedc_ba98_7654_3210,
            count: 1 << 40,
            buf: RemoteBuf {
                addr: 0x1234_5678_9abc,
                rkey: 0xdead_beef,
                len: 4096,
            },
        };
        let b = r.emit();
        assert_eq!(b.len(), REQUEST_LEN);
        assert_eq!(Request::parse(&b), Some(r));
        assert_eq!(Request::parse(&b[..REQUEST_LEN - 1]), None);
        let p = Reply {
            id: u64::MAX - 1,
            buf: r.buf,
        };
        let b = p.emit();
        assert_eq!(b.len(), REPLY_LEN);
        assert_eq!(Reply::parse(&b), Some(p));
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(Reply::parse(&bad), None);
        let e = EndReport {
            recvs: 3,
            recv_bytes: 300,
            bw: None,
            error: None,
        };
        assert_eq!(EndReport::parse(&e.emit()), Some(e));
        let long = EndReport {
            error: Some("é".repeat(200)),
            ..EndReport::default()
        };
        let b = long.emit();
        assert!(b.len() <= REJECT_MAX);
        assert_eq!(
            EndReport::parse(&b).unwrap().error.unwrap(),
            "é".repeat((REJECT_MAX - END_LEN) / 2)
        );
        // A reverse test's figures, and an error beside them, still within a REJ.
        let bw = Bw::from_parts(1000, 65_536_000, 0.5, 4096, Some(2.5));
        let both = EndReport {
            bw: Some(bw),
            error: Some("x".repeat(300)),
            ..EndReport::default()
        };
        let b = both.emit();
        assert_eq!(b.len(), REJECT_MAX);
        let back = EndReport::parse(&b).unwrap();
        assert_eq!(back.bw, Some(bw));
        assert_eq!(back.error.unwrap().len(), REJECT_MAX - END_LEN - END_BW_LEN);
        // Cut inside the figures: not a report.
        assert_eq!(EndReport::parse(&b[..END_LEN + 8]), None);
        for t in [
            RawTest::TcpBw,
            RawTest::TcpLat,
            RawTest::UdpBw,
            RawTest::UdpLat,
            RawTest::UdpGsoBw,
            RawTest::Bye,
        ] {
            let h = raw_header(t, 64);
            assert_eq!(parse_raw_header(&h), Some((t, 64)));
        }
    }

    #[test]
    fn reverse_round_trip_and_refusals() {
        let r = Reverse {
            what: Measure::Rdma(Test::ReadBw),
            size: 65536,
            limit: Limit::Duration(Duration::from_millis(1500)),
            tx_depth: 128,
            rx_depth: 512,
            rdma_port: 40001,
            raw_port: 40002,
            nonce: 0x0123_4567_89ab_cdef,
        };
        let b = r.emit();
        assert_eq!(b.len(), REQUEST_LEN);
        assert_eq!(Reverse::parse(&b), Some(r));
        assert_eq!(Request::parse(&b).map(|q| q.test), Some(Test::Reverse));
        for what in [Measure::Raw, Measure::RawGso] {
            let r = Reverse {
                what,
                limit: Limit::Iters(7),
                ..r
            };
            assert_eq!(Reverse::parse(&r.emit()), Some(r));
        }
        // A latency test, no iterations, a duration past the cap, another request: refused.
        let lat = Reverse {
            what: Measure::Rdma(Test::WriteLat),
            ..r
        };
        assert_eq!(Reverse::parse(&lat.emit()), None);
        let none = Reverse {
            limit: Limit::Iters(0),
            ..r
        };
        assert_eq!(Reverse::parse(&none.emit()), None);
        let long = Reverse {
            limit: Limit::Duration(REVERSE_MAX + Duration::from_secs(1)),
            ..r
        };
        assert_eq!(Reverse::parse(&long.emit()), None);
        assert_eq!(Reverse::parse(&Request::new(Test::WriteBw).emit()), None);
        assert_eq!(Reverse::parse(&b[..REQUEST_LEN - 1]), None);
    }

    #[test]
    fn refusals_round_trip_and_say_why() {
        for r in [
            Refusal::TooLarge {
                asked: u64::MAX,
                cap: 1 << 30,
            },
            Refusal::OverBudget {
                asked: 3 << 20,
                used: 6 << 20,
                budget: 8 << 20,
            },
            Refusal::Busy { mine: 16, all: 64 },
        ] {
            let b = r.emit();
            assert!(b.len() <= REJECT_MAX);
            assert_eq!(Refusal::parse(&b), Some(r));
            // RoCE's REJ pads with zeros.
            let mut padded = b.clone();
            padded.resize(REJECT_MAX, 0);
            assert_eq!(Refusal::parse(&padded), Some(r));
            assert!(String::from_utf8_lossy(&b).contains(&r.to_string()));
        }
        assert_eq!(Refusal::parse(b"softrdma perf: busy"), None);
        assert_eq!(Refusal::parse(&Request::new(Test::End).emit()), None);
        let mut bad = Refusal::Busy { mine: 1, all: 1 }.emit();
        bad[6] = 9;
        assert_eq!(Refusal::parse(&bad), None);
    }

    #[test]
    fn patterns_show_misplaced_data() {
        let mut b = vec![0u8; 70000];
        fill(&mut b, CLIENT_SEED);
        assert_eq!(first_mismatch(&b, CLIENT_SEED), None);
        assert_eq!(first_mismatch(&b, SERVER_SEED), Some(0));
        // Shifted by one octet, or by a whole 256-octet period: wrong from the start.
        assert_eq!(first_mismatch(&b[1..], CLIENT_SEED), Some(0));
        assert!(first_mismatch(&b[256..], CLIENT_SEED).is_some_and(|i| i < 256));
        b[65536] ^= 1;
        assert_eq!(first_mismatch(&b, CLIENT_SEED), Some(65536));
    }
}
