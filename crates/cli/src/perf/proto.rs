//! What a `softrdma perf` client and server tell each other. There is no out-of-band socket
//! for the RDMA tests: each test is one connection, and the test's parameters ride in the
//! MPA Request's private data, the server's buffer (address, STag, length) in the Reply's.
//! The raw TCP tests open a plain TCP connection and start with a 16-octet header.
//!
//! All integers little-endian.

use std::fmt;

/// First octets of every request and reply ("softrdma perf").
pub const MAGIC: [u8; 4] = *b"SRPF";
/// Layout version of these messages.
pub const VERSION: u8 = 1;

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
    /// Tagged Offset of the buffer's first octet.
    pub addr: u64,
    /// STag (R_Key).
    pub rkey: u32,
    /// Length in octets.
    pub len: u32,
}

impl RemoteBuf {
    fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.rkey.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    fn parse(b: &[u8]) -> RemoteBuf {
        RemoteBuf {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            rkey: u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
            len: u32::from_le_bytes(b[12..16].try_into().unwrap_or_default()),
        }
    }
}

/// The MPA Request's private data: which test, how large, and the client's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The test.
    pub test: Test,
    /// Message size.
    pub size: u32,
    /// Send bandwidth: receives the server keeps posted (the client's credit window).
    pub rx_depth: u32,
    /// The client's buffer (Write latency: where the server writes back).
    pub buf: RemoteBuf,
}

/// Octets of an encoded [`Request`].
pub const REQUEST_LEN: usize = 32;
/// Octets of an encoded [`Reply`].
pub const REPLY_LEN: usize = 24;

impl Request {
    /// The private data.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REQUEST_LEN);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&[VERSION, self.test.code(), 0, 0]);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.rx_depth.to_le_bytes());
        self.buf.emit(&mut v);
        v
    }

    /// Parses private data; `None` if it is not a `softrdma perf` request of this version.
    pub fn parse(b: &[u8]) -> Option<Request> {
        if b.len() < REQUEST_LEN || b[0..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        Some(Request {
            test: Test::from_code(b[5])?,
            size: u32::from_le_bytes(b[8..12].try_into().ok()?),
            rx_depth: u32::from_le_bytes(b[12..16].try_into().ok()?),
            buf: RemoteBuf::parse(&b[16..32]),
        })
    }
}

/// The MPA Reply's private data: the server's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Where the client writes (Write), reads (Read) or nothing (Send).
    pub buf: RemoteBuf,
}

impl Reply {
    /// The private data.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REPLY_LEN);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&[VERSION, 0, 0, 0]);
        self.buf.emit(&mut v);
        v
    }

    /// Parses private data.
    pub fn parse(b: &[u8]) -> Option<Reply> {
        if b.len() < REPLY_LEN || b[0..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        Some(Reply {
            buf: RemoteBuf::parse(&b[8..24]),
        })
    }
}

/// Raw TCP test kinds (first octets of a raw TCP connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpTest {
    /// Stream `size`-octet writes until the client shuts its side down; the server answers
    /// with the octet count it read (8 octets).
    Bw,
    /// Echo `size`-octet messages until the client closes.
    Lat,
    /// End of the client's session.
    Bye,
}

/// Octets of a raw TCP test header.
pub const TCP_HEADER_LEN: usize = 16;

/// Encodes a raw TCP test header.
pub fn tcp_header(test: TcpTest, size: u32) -> [u8; TCP_HEADER_LEN] {
    let mut h = [0u8; TCP_HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = match test {
        TcpTest::Bw => 1,
        TcpTest::Lat => 2,
        TcpTest::Bye => 0xff,
    };
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

/// Parses a raw TCP test header.
pub fn parse_tcp_header(h: &[u8; TCP_HEADER_LEN]) -> Option<(TcpTest, u32)> {
    if h[0..4] != MAGIC || h[4] != VERSION {
        return None;
    }
    let t = match h[5] {
        1 => TcpTest::Bw,
        2 => TcpTest::Lat,
        0xff => TcpTest::Bye,
        _ => return None,
    };
    Some((t, u32::from_le_bytes(h[8..12].try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_reply_round_trip() {
        let r = Request {
            test: Test::SendBw,
            size: 65536,
            rx_depth: 512,
            buf: RemoteBuf {
                addr: 0x1234_5678_9abc,
                rkey: 0xdead_beef,
                len: 4096,
            },
        };
        let b = r.emit();
        assert_eq!(b.len(), REQUEST_LEN);
        assert_eq!(Request::parse(&b), Some(r));
        assert_eq!(Request::parse(&b[..31]), None);
        let p = Reply { buf: r.buf };
        let b = p.emit();
        assert_eq!(b.len(), REPLY_LEN);
        assert_eq!(Reply::parse(&b), Some(p));
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(Reply::parse(&bad), None);
        let h = tcp_header(TcpTest::Lat, 64);
        assert_eq!(parse_tcp_header(&h), Some((TcpTest::Lat, 64)));
    }
}
