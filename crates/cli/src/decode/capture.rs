//! Reading pcap and pcapng files into link-layer frames.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};

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
    // Raw records: pcap-file's checked ones refuse an original length above the file's
    // snap length, which is what every frame of a `tcpdump -s N` capture has.
    let frac_nanos = |frac: u32| match header.ts_resolution {
        TsResolution::MicroSecond => u64::from(frac) * 1_000,
        TsResolution::NanoSecond => u64::from(frac),
    };
    while let Some(pkt) = rd.next_raw_packet() {
        let number = frames.len() as u64 + 1;
        let pkt = match pkt.map_err(|e| e.to_string()).and_then(|p| {
            if frac_nanos(p.ts_frac) < 1_000_000_000 {
                Ok(p)
            } else {
                Err("a timestamp's fraction is a second or more".to_string())
            }
        }) {
            Ok(p) => p,
            Err(e) => {
                let cut = Some(tally.cut(number - 1, e));
                return Ok(Capture { frames, cut });
            }
        };
        let timestamp = Duration::new(u64::from(pkt.ts_sec), frac_nanos(pkt.ts_frac) as u32);
        let link = Link::from_datalink(header.datalink).ok_or_else(|| CaptureError::Linktype {
            path: path.to_string(),
            frame: number,
            linktype: format!("{:?}", header.datalink),
        })?;
        frames.push(Frame {
            number,
            timestamp,
            link,
            sliced: (pkt.data.len() as u64) < u64::from(pkt.orig_len),
            data: pkt.data.into_owned(),
        });
    }
    Ok(Capture { frames, cut: None })
}

/// Timestamp ticks per second of a pcapng interface: its if_tsresol option (a power of 10,
/// or of 2 with the high bit set), 10^6 without one (pcapng §4.2).
fn tsresol(options: &[InterfaceDescriptionOption<'_>]) -> u128 {
    let r = options.iter().find_map(|o| match o {
        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
        _ => None,
    });
    match r {
        None => 1_000_000,
        Some(r) if r & 0x80 != 0 => 1u128.checked_shl(u32::from(r & 0x7F)).unwrap_or(0),
        Some(r) => 10u128.checked_pow(u32::from(r)).unwrap_or(0),
    }
}

/// `ticks` at `per_second` as a duration (a resolution beyond u128 as zero).
fn ticks_to_duration(ticks: u64, per_second: u128) -> Duration {
    if per_second == 0 {
        return Duration::ZERO;
    }
    let t = u128::from(ticks);
    let secs = u64::try_from(t / per_second).unwrap_or(u64::MAX);
    let nanos = (t % per_second) * 1_000_000_000 / per_second;
    Duration::new(secs, nanos as u32)
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
        // Timestamps in units of the interface's if_tsresol (pcap-file hands the raw count
        // over as nanoseconds).
        let (iface, ticks, orig_len, data): (u32, u64, u32, Vec<u8>) = match block {
            Block::EnhancedPacket(b) => (
                b.interface_id,
                u64::try_from(b.timestamp.as_nanos()).unwrap_or(u64::MAX),
                b.original_len,
                b.data.into_owned(),
            ),
            Block::SimplePacket(b) => (0, 0, b.original_len, b.data.into_owned()),
            Block::Packet(b) => (
                u32::from(b.interface_id),
                b.timestamp,
                b.original_len,
                b.data.into_owned(),
            ),
            _ => continue,
        };
        let idb = rd
            .interfaces()
            .get(iface as usize)
            .ok_or_else(|| corrupt(path, number - 1, "packet names an undeclared interface"))?;
        let linktype = idb.linktype;
        let timestamp = ticks_to_duration(ticks, tsresol(&idb.options));
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

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;

    /// A pcapng image of one Ethernet frame stamped `ticks` on an interface with `resol`.
    fn one_frame(resol: Option<u8>, ticks: u64) -> Vec<u8> {
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            options: resol
                .map(InterfaceDescriptionOption::IfTsResol)
                .into_iter()
                .collect(),
        })
        .unwrap();
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            // Written as the raw count, as it is read.
            timestamp: Duration::from_nanos(ticks),
            original_len: 60,
            data: std::borrow::Cow::Owned(vec![0u8; 60]),
            options: Vec::new(),
        })
        .unwrap();
        w.into_inner()
    }

    /// pcapng timestamps count in the interface's if_tsresol: microseconds by default
    /// (what dumpcap and editcap write), a power of ten or of two when said.
    #[test]
    fn pcapng_timestamps_follow_if_tsresol() {
        let t = 1_795_900_000_123_456u64;
        for (resol, ticks, want) in [
            (None, t, Duration::new(1_795_900_000, 123_456_000)),
            (Some(6), t, Duration::new(1_795_900_000, 123_456_000)),
            (Some(9), t, Duration::new(1_795_900, 123_456)),
            (Some(3), 5_250, Duration::new(5, 250_000_000)),
            (
                Some(0x80 | 10),
                3 * 1024 + 512,
                Duration::new(3, 500_000_000),
            ),
        ] {
            let img = one_frame(resol, ticks);
            let c = read_frames_from("<test>", &img[..]).unwrap();
            assert_eq!(c.frames.len(), 1);
            assert_eq!(c.frames[0].timestamp, want, "if_tsresol {resol:?}");
        }
    }
}
