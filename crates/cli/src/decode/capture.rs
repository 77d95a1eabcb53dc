//! Reading pcap and pcapng files into link-layer frames.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};

/// Why a capture file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a pcap or pcapng file (magic {magic:02x?})")]
    NotACapture { path: String, magic: Vec<u8> },
    #[error("{path}: truncated or corrupt after frame {after_frame}: {detail}")]
    Corrupt {
        path: String,
        after_frame: u64,
        detail: String,
    },
    #[error("{path}: frame {frame}: link type {linktype} is not supported")]
    Linktype {
        path: String,
        frame: u64,
        linktype: String,
    },
}

/// The link layers the decoder understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Ethernet,
    LinuxSll,
    LinuxSll2,
    /// Raw IPv4 or IPv6, version from the first nibble.
    RawIp,
    /// BSD loopback: 4-octet address family in host order.
    Null,
    /// OpenBSD loopback: 4-octet address family in network order.
    Loop,
}

impl Link {
    fn from_datalink(dl: DataLink) -> Option<Link> {
        Some(match dl {
            DataLink::ETHERNET => Link::Ethernet,
            DataLink::LINUX_SLL => Link::LinuxSll,
            DataLink::LINUX_SLL2 => Link::LinuxSll2,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => Link::RawIp,
            DataLink::NULL => Link::Null,
            DataLink::LOOP => Link::Loop,
            _ => return None,
        })
    }
}

/// Where a capture stops before its end: the frames before it were read (as tshark reads a
/// file whose writer was killed mid-record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// Frames read whole before it.
    pub after_frame: u64,
    /// Octets of the file read when the next record could not be: the file's length when
    /// it ends inside a record.
    pub at: u64,
    /// The file ends inside a record (cut short); otherwise the record is malformed.
    pub short: bool,
    pub detail: String,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.short {
            write!(
                f,
                "cut short in the middle of the record after frame {} (the file ends at octet {})",
                self.after_frame, self.at
            )
        } else {
            write!(
                f,
                "the record after frame {} is malformed ({}; {} octets read): the rest is not read",
                self.after_frame, self.detail, self.at
            )
        }
    }
}

/// The frames of a capture, and where it stopped if not at its end.
#[derive(Debug, Clone, Default)]
pub struct Capture {
    pub frames: Vec<Frame>,
    pub cut: Option<Cut>,
}

/// Counts the octets read and whether the end of the input was met.
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
    eof: Rc<Cell<bool>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.eof.set(true);
        }
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

/// What a reader of records needs to turn a bad record into a [`Cut`].
struct Tally {
    read: Rc<Cell<u64>>,
    eof: Rc<Cell<bool>>,
}

impl Tally {
    fn wrap<R: Read>(r: R) -> (Tally, Counting<R>) {
        let (read, eof) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(false)));
        let c = Counting {
            inner: r,
            read: read.clone(),
            eof: eof.clone(),
        };
        (Tally { read, eof }, c)
    }

    fn cut(&self, after_frame: u64, e: impl std::fmt::Display) -> Cut {
        Cut {
            after_frame,
            at: self.read.get(),
            short: self.eof.get(),
            detail: e.to_string(),
        }
    }
}

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1-based, as Wireshark numbers frames.
    pub number: u64,
    pub timestamp: Duration,
    pub link: Link,
    pub data: Vec<u8>,
    /// Captured length is shorter than the original (snaplen).
    pub sliced: bool,
}

/// Read every frame of a pcap or pcapng file; a file cut short (or a malformed record) keeps
/// the frames before the cut.
pub fn read_frames(path: &Path) -> Result<Capture, CaptureError> {
    let p = path.display().to_string();
    let file = File::open(path).map_err(|source| CaptureError::Open {
        path: p.clone(),
        source,
    })?;
    read_frames_from(&p, BufReader::new(file))
}

/// Read every frame of a pcap or pcapng stream; `name` labels errors.
pub fn read_frames_from(name: &str, mut rd: impl Read) -> Result<Capture, CaptureError> {
    let p = name.to_string();
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match rd.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(source) => {
                return Err(CaptureError::Open {
                    path: p.clone(),
                    source,
                });
            }
        }
    }
    let head = magic[..got].to_vec();
    let (tally, stream) = Tally::wrap(head.as_slice().chain(rd));
    match magic {
        [0xd4, 0xc3, 0xb2, 0xa1]
        | [0xa1, 0xb2, 0xc3, 0xd4]
        | [0x4d, 0x3c, 0xb2, 0xa1]
        | [0xa1, 0xb2, 0x3c, 0x4d] => read_pcap(&p, stream, &tally),
        [0x0a, 0x0d, 0x0d, 0x0a] => read_pcapng(&p, stream, &tally),
        _ => Err(CaptureError::NotACapture {
            path: p,
            magic: head,
        }),
    }
}

fn corrupt(path: &str, after_frame: u64, e: impl std::fmt::Display) -> CaptureError {
    CaptureError::Corrupt {
        path: path.to_string(),
        after_frame,
        detail: e.to_string(),
    }
}

fn read_pcap(path: &str, r: impl Read, tally: &Tally) -> Result<Capture, CaptureError> {
    let mut rd = PcapReader::new(r).map_err(|e| corrupt(path, 0, e))?;
    let header = rd.header();
    let mut frames = Vec::new();
    while let Some(pkt) = rd.next_packet() {
        let number = frames.len() as u64 + 1;
        let pkt = match pkt {
            Ok(p) => p,
            Err(e) => {
                let cut = Some(tally.cut(number - 1, e));
                return Ok(Capture { frames, cut });
            }
        };
        let link = Link::from_datalink(header.datalink).ok_or_else(|| CaptureError::Linktype {
            path: path.to_string(),
            frame: number,
            linktype: format!("{:?}", header.datalink),
        })?;
        frames.push(Frame {
            number,
            timestamp: pkt.timestamp,
            link,
            sliced: (pkt.data.len() as u64) < u64::from(pkt.orig_len),
            data: pkt.data.into_owned(),
        });
    }
    Ok(Capture { frames, cut: None })
}

fn read_pcapng(path: &str, r: impl Read, tally: &Tally) -> Result<Capture, CaptureError> {
    let mut rd = PcapNgReader::new(r).map_err(|e| corrupt(path, 0, e))?;
    let mut frames = Vec::new();
    while let Some(block) = rd.next_block() {
        let number = frames.len() as u64 + 1;
        let block = match block {
            Ok(b) => b,
            Err(e) => {
                let cut = Some(tally.cut(number - 1, e));
                return Ok(Capture { frames, cut });
            }
        };
        let (iface, timestamp, orig_len, data): (u32, Duration, u32, Vec<u8>) = match block {
            Block::EnhancedPacket(b) => (
                b.interface_id,
                b.timestamp,
                b.original_len,
                b.data.into_owned(),
            ),
            Block::SimplePacket(b) => (0, Duration::ZERO, b.original_len, b.data.into_owned()),
            Block::Packet(b) => (
                u32::from(b.interface_id),
                Duration::from_micros(b.timestamp),
                b.original_len,
                b.data.into_owned(),
            ),
            _ => continue,
        };
        let linktype = rd
            .interfaces()
            .get(iface as usize)
            .map(|i| i.linktype)
            .ok_or_else(|| corrupt(path, number - 1, "packet names an undeclared interface"))?;
        let link = Link::from_datalink(linktype).ok_or_else(|| CaptureError::Linktype {
            path: path.to_string(),
            frame: number,
            linktype: format!("{linktype:?}"),
        })?;
        frames.push(Frame {
            number,
            timestamp,
            link,
            sliced: (data.len() as u64) < u64::from(orig_len),
            data,
        });
    }
    Ok(Capture { frames, cut: None })
}
