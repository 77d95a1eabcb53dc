//! `softrdma decode`: iWARP, RoCEv2 and RPC-over-RDMA out of a capture file.
//!
//! Frames are sliced down to TCP or UDP; TCP byte streams are reassembled in
//! order and followed from the MPA Request/Reply on (RFC 5044 §7.1), FPDUs are
//! deframed (markers removed, CRC checked when negotiated) and their ULPDUs
//! decoded as DDP/RDMAP; UDP datagrams to port 4791 are decoded as RoCEv2
//! (ICRC checked) and their IB transport headers. Sends whose payload is an
//! RPC-over-RDMA header are decoded further, with the ONC RPC message inside.
//!
//! Every header parsed is emitted again and compared with the captured octets
//! (the `reemit` check), so a decode is also a round-trip test of the codecs.

pub mod capture;
mod fields;
mod iwarp;
pub mod net;
pub mod nfs4;
pub mod record;
mod roce;
mod rpc;
mod summary;
pub mod tcp;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

pub use capture::CaptureError;
pub use record::{Check, Record, SendSegment};

use net::{L4, NetPacket};

/// Decoder options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Also report frames that carry no RDMA message.
    pub all: bool,
    /// Keep every Send segment's payload ([`Record::send`]), for tools and tests that look
    /// at what the Sends carry beyond the headers decoded.
    pub sends: bool,
    /// UDP ports decoded as RoCEv2 besides 4791 (tshark's "decode as").
    pub roce_ports: Vec<u16>,
    /// Decode only the first this many frames (tshark's `-c`).
    pub max_frames: Option<u64>,
}

/// The result of decoding one capture.
#[derive(Debug, Default)]
pub struct Output {
    pub frames: u64,
    pub records: Vec<Record>,
    /// Problems not tied to one message (e.g. a TCP gap never filled inside an MPA stream,
    /// with where deframing resumed after it).
    pub stream_errors: Vec<String>,
    /// What could not be decoded because the capture did not keep it (frames cut at its
    /// snap length): said, not counted as errors.
    pub notes: Vec<String>,
    /// Where the capture stopped before its end (a file cut short); everything before it was
    /// decoded.
    pub cut: Option<capture::Cut>,
}

/// Decode a pcap or pcapng file.
pub fn decode_file(path: &Path, opts: &Options) -> Result<Output, CaptureError> {
    Ok(decode_capture(capture::read_frames(path)?, opts))
}

/// Decode a pcap or pcapng stream (standard input, a pipe); `name` labels errors.
pub fn decode_reader(
    name: &str,
    r: impl std::io::Read,
    opts: &Options,
) -> Result<Output, CaptureError> {
    Ok(decode_capture(capture::read_frames_from(name, r)?, opts))
}

/// Decode a pcap or pcapng image held in memory (hostile input: never panics).
pub fn decode_bytes(bytes: &[u8], opts: &Options) -> Result<Output, CaptureError> {
    Ok(decode_capture(
        capture::read_frames_from("<memory>", bytes)?,
        opts,
    ))
}

fn decode_capture(mut c: capture::Capture, opts: &Options) -> Output {
    if let Some(n) = opts.max_frames
        && (c.frames.len() as u64) > n
    {
        // Stopped by the count, not cut: what follows is not looked at.
        c.frames.truncate(n as usize);
        c.cut = None;
    }
    Output {
        cut: c.cut,
        ..decode_frames(&c.frames, opts)
    }
}

fn decode_frames(frames: &[capture::Frame], opts: &Options) -> Output {
    let mut d = Decoder::new(opts.clone());
    for f in frames {
        d.frame(f);
    }
    d.finish()
}

/// A TCP connection key with the lower endpoint first, and the direction of a segment.
type Endpoint = (IpAddr, u16);

fn conn_key(a: Endpoint, b: Endpoint) -> ((Endpoint, Endpoint), usize) {
    if a <= b { ((a, b), 0) } else { ((b, a), 1) }
}

pub(crate) fn endpoint(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v) => format!("{v}:{port}"),
        IpAddr::V6(v) => format!("[{v}]:{port}"),
    }
}

/// Per-frame context handed to the protocol decoders.
pub(crate) struct Ctx {
    pub frame: u64,
    pub time: f64,
    pub src: String,
    pub dst: String,
    /// [`Options::sends`].
    pub sends: bool,
}

struct Decoder {
    opts: Options,
    t0: Option<std::time::Duration>,
    frames: u64,
    conns: HashMap<(Endpoint, Endpoint), iwarp::Connection>,
    records: Vec<Record>,
    stream_errors: Vec<String>,
    notes: Vec<String>,
}

impl Decoder {
    fn new(opts: Options) -> Self {
        Decoder {
            opts,
            t0: None,
            frames: 0,
            conns: HashMap::new(),
            records: Vec::new(),
            stream_errors: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn frame(&mut self, f: &capture::Frame) {
        self.frames += 1;
        let t0 = *self.t0.get_or_insert(f.timestamp);
        let time = f.timestamp.saturating_sub(t0).as_secs_f64();
        let pkt = match net::slice(f.link, &f.data, f.sliced) {
            Ok(p) => p,
            Err(e) => {
                let mut r = Record::new(f.number, time, "?".into(), "?".into(), "frame");
                if f.sliced {
                    // The capture's snap length cut it inside its headers: a note.
                    r.summary = "frame cut inside its headers".into();
                    r.check("captured", None, e.to_string());
                } else {
                    r.summary = "undecodable frame".into();
                    r.error(e);
                }
                self.records.push(r);
                return;
            }
        };
        let NetPacket::Ip {
            src,
            dst,
            ip,
            cut,
            l4,
        } = pkt
        else {
            if self.opts.all {
                let mut r = Record::new(f.number, time, "-".into(), "-".into(), "link");
                r.summary = "not IP".into();
                self.records.push(r);
            }
            return;
        };
        match l4 {
            L4::Udp {
                src_port,
                dst_port,
                payload,
                ..
            } => {
                let ctx = Ctx {
                    frame: f.number,
                    time,
                    src: endpoint(src, src_port),
                    dst: endpoint(dst, dst_port),
                    sends: self.opts.sends,
                };
                if dst_port == roce::ROCEV2_PORT || self.opts.roce_ports.contains(&dst_port) {
                    self.records.push(match cut {
                        None => roce::decode(&ctx, ip, dst_port),
                        Some(wire) => roce::decode_cut(&ctx, payload, ip.len(), wire),
                    });
                } else if self.opts.all {
                    let mut r = Record::new(ctx.frame, time, ctx.src, ctx.dst, "UDP");
                    r.summary = format!("{} octets", payload.len());
                    self.records.push(r);
                }
            }
            L4::Tcp {
                src_port,
                dst_port,
                seq,
                syn,
                fin,
                rst,
                payload,
                len,
            } => {
                let a = (src, src_port);
                let b = (dst, dst_port);
                let (key, dir) = conn_key(a, b);
                let ctx = Ctx {
                    frame: f.number,
                    time,
                    src: endpoint(src, src_port),
                    dst: endpoint(dst, dst_port),
                    sends: self.opts.sends,
                };
                let conn = self.conns.entry(key).or_default();
                let before = self.records.len();
                conn.segment(
                    &ctx,
                    dir,
                    tcp::Segment {
                        seq,
                        syn,
                        payload,
                        len,
                    },
                    &mut self.records,
                );
                if self.opts.all && self.records.len() == before {
                    let mut r = Record::new(ctx.frame, time, ctx.src, ctx.dst, "TCP");
                    let flags = [(syn, "SYN"), (fin, "FIN"), (rst, "RST")]
                        .iter()
                        .filter(|(on, _)| *on)
                        .map(|(_, n)| *n)
                        .collect::<Vec<_>>()
                        .join(",");
                    r.summary = format!("seq {seq} len {len} {flags}");
                    self.records.push(r);
                }
            }
            L4::Other { protocol } => {
                if self.opts.all {
                    let mut r = Record::new(f.number, time, src.to_string(), dst.to_string(), "IP");
                    r.summary = format!("protocol {protocol}");
                    self.records.push(r);
                }
            }
            L4::Fragment => {
                if self.opts.all {
                    let mut r = Record::new(f.number, time, src.to_string(), dst.to_string(), "IP");
                    r.summary = "fragment".into();
                    self.records.push(r);
                }
            }
        }
    }

    fn finish(mut self) -> Output {
        let mut keys: Vec<_> = self.conns.keys().copied().collect();
        keys.sort();
        for k in keys {
            if let Some(c) = self.conns.get_mut(&k) {
                c.finish(self.opts.sends, &mut self.records);
                // Each names its direction.
                self.stream_errors.extend(c.finish_errors());
                self.notes.extend(c.finish_notes());
            }
        }
        self.records.sort_by_key(|r| r.frame);
        rpc::name_replies(&mut self.records);
        Output {
            frames: self.frames,
            records: self.records,
            stream_errors: self.stream_errors,
            notes: self.notes,
            cut: None,
        }
    }
}
