//! A whole IB transport packet: BTH, the extended headers its OpCode
//! names, payload and pad (IBA §9.2-§9.3; ib-transport.md §6), i.e. the
//! octets between the UDP header and the ICRC of a RoCEv2 packet. The ICRC
//! itself is handled by `crate::rocev2`.

use crate::error::{Error, Layer, Result, need};

use super::aeth::AethRepr;
use super::bth::{BTH_LEN, BthRepr};
use super::eth::*;
use super::opcode::Headers;

/// Pad octets needed after `payload_len` octets to reach a multiple of 4
/// (BTH PadCnt, IBA §9.2.3).
pub const fn pad_count(payload_len: usize) -> u8 {
    ((4 - (payload_len % 4)) % 4) as u8
}

/// The transport packet after UDP, without the ICRC.
///
/// `parse` reads exactly the headers the OpCode requires (IBT-C9-2), then
/// splits the rest into payload and `bth.pad_cnt` pad octets. `emit`
/// writes them back byte-identically, so the header `Option`s must match
/// `bth.opcode.headers()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PacketRepr<'a> {
    pub bth: BthRepr,
    pub rdeth: Option<RdethRepr>,
    pub deth: Option<DethRepr>,
    pub xrceth: Option<XrcEthRepr>,
    /// FLUSH only (IBA 1.5).
    pub feth: Option<FethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
    /// Payload without the pad.
    pub payload: &'a [u8],
    /// Pad octets as received; the first `bth.pad_cnt` are emitted (a
    /// conforming sender uses zeros).
    pub pad: [u8; 3],
}

impl<'a> PacketRepr<'a> {
    /// A packet with no extended header; set the ones `bth.opcode` needs.
    /// PadCnt is set from the payload length.
    pub fn new(mut bth: BthRepr, payload: &'a [u8]) -> Self {
        bth.pad_cnt = pad_count(payload.len());
        PacketRepr {
            bth,
            rdeth: None,
            deth: None,
            xrceth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload,
            pad: [0; 3],
        }
    }

    /// Parses BTH .. pad (the ICRC already removed). Errors: `Truncated`
    /// when a header is cut; `Unknown` for a reserved OpCode or AETH
    /// syndrome; `Malformed` when PadCnt exceeds what follows the headers
    /// or an opcode without payload carries one.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let (mut p, off) = Self::parse_headers(buf)?;
        let rest = &buf[off..];
        let pad_len = p.bth.pad_cnt as usize;
        if rest.len() < pad_len {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                reason: "PadCnt exceeds the octets after the headers",
            });
        }
        let (payload, pad_octets) = rest.split_at(rest.len() - pad_len);
        if !p.bth.opcode.headers().payload && !payload.is_empty() {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                reason: "payload on an opcode that carries none",
            });
        }
        p.payload = payload;
        p.pad[..pad_len].copy_from_slice(pad_octets);
        Ok(p)
    }

    /// Parses BTH and the extended headers its OpCode names, and returns them (with an
    /// empty payload) and their length: what a capture cut short of the payload still
    /// tells. Errors as [`PacketRepr::parse`] for the headers.
    pub fn parse_headers(buf: &'a [u8]) -> Result<(Self, usize)> {
        let bth = BthRepr::parse(buf)?;
        let h = bth.opcode.headers();
        need(Layer::IbExt, buf, BTH_LEN + h.len())?;
        let mut off = BTH_LEN;
        macro_rules! take {
            ($flag:expr, $repr:ident, $len:expr) => {
                if $flag {
                    let r = $repr::parse(&buf[off..])?;
                    off += $len;
                    Some(r)
                } else {
                    None
                }
            };
        }
        let rdeth = take!(h.rdeth, RdethRepr, RDETH_LEN);
        let deth = take!(h.deth, DethRepr, DETH_LEN);
        let xrceth = take!(h.xrceth, XrcEthRepr, XRCETH_LEN);
        let feth = take!(h.feth, FethRepr, FETH_LEN);
        let reth = take!(h.reth, RethRepr, RETH_LEN);
        let atomic_eth = take!(h.atomic_eth, AtomicEthRepr, ATOMIC_ETH_LEN);
        let aeth = take!(h.aeth, AethRepr, AETH_LEN);
        let atomic_ack_eth = take!(h.atomic_ack_eth, AtomicAckEthRepr, ATOMIC_ACK_ETH_LEN);
        let immdt = take!(h.immdt, ImmDtRepr, IMMDT_LEN);
        let ieth = take!(h.ieth, IethRepr, IETH_LEN);
        Ok((
            PacketRepr {
                bth,
                rdeth,
                deth,
                xrceth,
                feth,
                reth,
                atomic_eth,
                aeth,
                atomic_ack_eth,
                immdt,
                ieth,
                payload: &[],
                pad: [0; 3],
            },
            off,
        ))
    }

    /// The headers present in this repr.
    pub fn present(&self) -> Headers {
        Headers {
            rdeth: self.rdeth.is_some(),
            deth: self.deth.is_some(),
            xrceth: self.xrceth.is_some(),
            feth: self.feth.is_some(),
            reth: self.reth.is_some(),
            atomic_eth: self.atomic_eth.is_some(),
            aeth: self.aeth.is_some(),
            atomic_ack_eth: self.atomic_ack_eth.is_some(),
            immdt: self.immdt.is_some(),
            ieth: self.ieth.is_some(),
            payload: self.bth.opcode.has_payload(),
        }
    }

    /// `Malformed` unless the headers present are exactly those the OpCode
    /// requires (and no payload on an opcode without one).
    pub fn check(&self) -> Result<()> {
        if self.present() != self.bth.opcode.headers() {
            return Err(Error::Malformed {
                layer: Layer::IbExt,
                reason: "extended headers do not match the OpCode",
            });
        }
        if !self.bth.opcode.has_payload() && !self.payload.is_empty() {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                reason: "payload on an opcode that carries none",
            });
        }
        Ok(())
    }

    /// Length of the extended headers present.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.present().len()
    }

    /// Octets `emit` writes: BTH, headers, payload, pad.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + (self.bth.pad_cnt as usize & 3)
    }

    /// Writes the packet; `Malformed` if the headers do not match the
    /// OpCode, `Truncated` if `buf` is short, `TooLarge` for a field wider
    /// than its slot.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        need(Layer::Bth, buf, self.buffer_len())?;
        let mut off = self.emit_header_part(buf)?;
        buf[off..off + self.payload.len()].copy_from_slice(self.payload);
        off += self.payload.len();
        let pad_len = self.bth.pad_cnt as usize;
        buf[off..off + pad_len].copy_from_slice(&self.pad[..pad_len]);
        Ok(off + pad_len)
    }

    /// Appends BTH and the extended headers of a packet whose `payload_len` payload octets
    /// the caller appends next (gathered straight from their memory, with no copy in
    /// between), followed by [`pad_count`]`(payload_len)` zero octets. PadCnt is set from
    /// `payload_len`; `self.payload` must be empty. Errors as [`PacketRepr::emit`]; `out` is
    /// unchanged on error.
    pub fn emit_headers(&mut self, payload_len: usize, out: &mut Vec<u8>) -> Result<usize> {
        self.bth.pad_cnt = pad_count(payload_len);
        self.check()?;
        if !self.payload.is_empty() || (payload_len > 0 && !self.bth.opcode.has_payload()) {
            return Err(Error::Malformed {
                layer: Layer::Bth,
                reason: "payload on an opcode that carries none",
            });
        }
        let start = out.len();
        out.resize(start + self.header_len(), 0);
        match self.emit_header_part(&mut out[start..]) {
            Ok(n) => Ok(n),
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// BTH and the extended headers present, in wire order; their length.
    fn emit_header_part(&self, buf: &mut [u8]) -> Result<usize> {
        let mut off = self.bth.emit(buf)?;
        macro_rules! put {
            ($opt:expr) => {
                if let Some(r) = &$opt {
                    off += r.emit(&mut buf[off..])?;
                }
            };
        }
        put!(self.rdeth);
        put!(self.deth);
        put!(self.xrceth);
        put!(self.feth);
        put!(self.reth);
        put!(self.atomic_eth);
        put!(self.aeth);
        put!(self.atomic_ack_eth);
        put!(self.immdt);
        put!(self.ieth);
        Ok(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::aeth::{CreditCode, NakCode, RnrTimer, Syndrome};
    use crate::ib::opcode::{Opcode, Operation, Service};
    use crate::ib::testdata::{self, ALL};
    use proptest::prelude::*;

    /// Offset of the BTH in the test vectors (IPv4 without options + UDP).
    const T: usize = 28;

    fn transport(pkt: &[u8]) -> &[u8] {
        &pkt[T..pkt.len() - 4]
    }

    /// A capture cut anywhere after the headers still gives them; cut inside them, the
    /// error names the truncation.
    #[test]
    fn headers_of_a_cut_packet() {
        for pkt in ALL.iter().map(|(_, p)| *p) {
            let t = transport(pkt);
            let whole = PacketRepr::parse(t).unwrap();
            let n = whole.header_len();
            for cut in n..=t.len() {
                let (h, off) = PacketRepr::parse_headers(&t[..cut]).unwrap();
                assert_eq!(off, n);
                assert_eq!(
                    PacketRepr {
                        payload: whole.payload,
                        pad: whole.pad,
                        ..h
                    },
                    whole
                );
            }
            for cut in 0..n {
                assert!(matches!(
                    PacketRepr::parse_headers(&t[..cut]),
                    Err(Error::Truncated { .. })
                ));
            }
        }
    }

    fn roundtrip(pkt: &[u8]) -> PacketRepr<'_> {
        let t = transport(pkt);
        let p = PacketRepr::parse(t).unwrap();
        assert_eq!(p.buffer_len(), t.len());
        let mut out = vec![0u8; t.len()];
        assert_eq!(p.emit(&mut out), Ok(t.len()));
        assert_eq!(out, t);
        // The same packet with its payload appended apart (the gathering transmit path).
        let mut h = PacketRepr { payload: &[], ..p };
        let mut apart = vec![0xEE];
        assert_eq!(
            h.emit_headers(p.payload.len(), &mut apart),
            Ok(p.header_len())
        );
        apart.extend_from_slice(p.payload);
        apart.resize(apart.len() + pad_count(p.payload.len()) as usize, 0);
        if p.pad == [0; 3] {
            assert_eq!(&apart[1..], t);
        }
        assert_eq!(apart.len(), 1 + t.len());
        p
    }

    #[test]
    fn headers_apart_refuse_what_emit_refuses() {
        let ack = BthRepr::new(Opcode::RC_ACKNOWLEDGE, 7, 1);
        let mut out = vec![1, 2, 3];
        // An ACK without its AETH, and an ACK with payload.
        assert!(PacketRepr::new(ack, &[]).emit_headers(0, &mut out).is_err());
        let mut p = PacketRepr::new(ack, &[]);
        p.aeth = Some(crate::ib::aeth::AethRepr {
            syndrome: Syndrome::ACK,
            msn: 0,
            reserved: false,
        });
        assert!(p.emit_headers(4, &mut out).is_err());
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(p.emit_headers(0, &mut out), Ok(16));
        assert_eq!(out.len(), 3 + 16);
    }

    /// Every capture vector: parse, re-emit identically, and each shorter
    /// prefix errors or parses as something shorter (never panics).
    #[test]
    fn real_packets_roundtrip() {
        for (name, pkt) in ALL {
            let p = roundtrip(pkt);
            assert_eq!(p.present(), p.bth.opcode.headers(), "{name}");
            let t = transport(pkt);
            for n in 0..p.header_len() {
                assert!(PacketRepr::parse(&t[..n]).is_err(), "{name} cut at {n}");
            }
        }
    }

    /// Field values as tshark 4.0 decodes the same frames (independent
    /// dissector), and the ICRC it prints (octets in wire order).
    #[test]
    fn real_packets_match_tshark() {
        let w = roundtrip(&testdata::RC_WRITE_FIRST);
        assert_eq!((w.bth.dest_qp, w.bth.psn), (0x13, 3_141_970));
        assert_eq!(
            w.reth,
            Some(RethRepr {
                va: 0x0000_563b_a23a_0000,
                r_key: 0x4a6,
                dma_len: 4096
            })
        );
        let c = roundtrip(&testdata::RC_CMP_SWAP);
        assert_eq!((c.bth.dest_qp, c.bth.psn), (0x19, 7_981_368));
        assert_eq!(
            c.atomic_eth,
            Some(AtomicEthRepr {
                va: 0x0000_55a3_f712_9000,
                r_key: 0xa71,
                swap_add_data: 0,
                compare_data: 0
            })
        );
        let k = roundtrip(&testdata::RC_ATOMIC_ACK);
        assert_eq!(k.aeth.unwrap().msn, 1);
        assert_eq!(
            k.atomic_ack_eth.unwrap().orig_remote_data,
            17_376_904_514_340_698_787
        );
        assert_eq!(
            roundtrip(&testdata::RC_SEND_ONLY_INV).ieth.unwrap().r_key,
            0x152b
        );
        assert_eq!(
            roundtrip(&testdata::RC_SEND_ONLY_IMM)
                .immdt
                .unwrap()
                .immediate_data,
            0x1000
        );
        let u = roundtrip(&testdata::UD_SEND_ONLY);
        assert_eq!((u.bth.dest_qp, u.bth.psn), (0x1a, 15_386_517));
        let d = u.deth.unwrap();
        assert_eq!((d.q_key, d.reserved, d.src_qp), (0x1111_1111, 0, 0x1a));
        let r = roundtrip(&testdata::RC_RNR_NAK);
        assert_eq!((r.bth.psn, r.aeth.unwrap().msn), (11_656_413, 0));
        let q = roundtrip(&testdata::RC_READ_REQUEST);
        assert_eq!(
            q.reth,
            Some(RethRepr {
                va: 0x0000_55c8_ec2e_5370,
                r_key: 0x1060,
                dma_len: 64
            })
        );
        let icrc = |p: &[u8]| p[p.len() - 4..].to_vec();
        assert_eq!(icrc(&testdata::RC_WRITE_FIRST), [0xc3, 0x43, 0xa4, 0x6d]);
        assert_eq!(icrc(&testdata::RC_RNR_NAK), [0xb9, 0x0b, 0x80, 0x15]);
    }

    /// Every real packet deconstructed with the header views agrees with
    /// the parsed reprs.
    #[test]
    fn real_packets_views_agree() {
        use crate::ib::aeth::Aeth;
        use crate::ib::bth::Bth;
        for (name, pkt) in ALL {
            let t = transport(pkt);
            let p = PacketRepr::parse(t).unwrap();
            let b = Bth::new_checked(t).unwrap();
            assert_eq!(b.opcode(), Ok(p.bth.opcode));
            assert_eq!(
                (b.se(), b.migreq(), b.pad_cnt(), b.tver(), b.pkey()),
                (
                    p.bth.se,
                    p.bth.migreq,
                    p.bth.pad_cnt,
                    p.bth.tver,
                    p.bth.pkey
                )
            );
            assert_eq!(
                (b.fecn(), b.becn(), b.resv6()),
                (false, false, 0),
                "{name}: C9-6"
            );
            assert_eq!((b.tver(), b.resv7()), (0, 0), "{name}: C9-5, C9-7");
            assert_eq!(
                (b.dest_qp(), b.ack_req(), b.psn()),
                (p.bth.dest_qp, p.bth.ack_req, p.bth.psn)
            );
            let mut off = BTH_LEN;
            let h = p.bth.opcode.headers();
            if h.deth {
                let v = Deth::new_checked(&t[off..]).unwrap();
                let r = p.deth.unwrap();
                assert_eq!(
                    (v.q_key(), v.reserved(), v.src_qp()),
                    (r.q_key, r.reserved, r.src_qp)
                );
                off += DETH_LEN;
            }
            if h.reth {
                let v = Reth::new_checked(&t[off..]).unwrap();
                let r = p.reth.unwrap();
                assert_eq!((v.va(), v.r_key(), v.dma_len()), (r.va, r.r_key, r.dma_len));
                off += RETH_LEN;
            }
            if h.atomic_eth {
                let v = AtomicEth::new_checked(&t[off..]).unwrap();
                let r = p.atomic_eth.unwrap();
                assert_eq!(
                    (v.va(), v.r_key(), v.swap_add_data(), v.compare_data()),
                    (r.va, r.r_key, r.swap_add_data, r.compare_data)
                );
                off += ATOMIC_ETH_LEN;
            }
            if h.aeth {
                let v = Aeth::new_checked(&t[off..]).unwrap();
                let r = p.aeth.unwrap();
                assert_eq!((v.syndrome(), v.msn()), (Ok(r.syndrome), r.msn));
                off += AETH_LEN;
            }
            if h.atomic_ack_eth {
                let v = AtomicAckEth::new_checked(&t[off..]).unwrap();
                assert_eq!(
                    v.orig_remote_data(),
                    p.atomic_ack_eth.unwrap().orig_remote_data
                );
                off += ATOMIC_ACK_ETH_LEN;
            }
            if h.immdt {
                let v = ImmDt::new_checked(&t[off..]).unwrap();
                assert_eq!(v.immediate_data(), p.immdt.unwrap().immediate_data);
                off += IMMDT_LEN;
            }
            if h.ieth {
                let v = Ieth::new_checked(&t[off..]).unwrap();
                assert_eq!(v.r_key(), p.ieth.unwrap().r_key);
                off += IETH_LEN;
            }
            assert_eq!(off, p.header_len(), "{name}");
            assert_eq!(&t[off..off + p.payload.len()], p.payload);
        }
    }

    /// IBT-C9-14, IBT-X-05: SEND Only, 64-octet payload (rxe-rc_pingpong).
    #[test]
    fn real_rc_send_only() {
        let p = roundtrip(&testdata::RC_SEND_ONLY);
        assert_eq!(p.bth.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!(p.bth.opcode.to_string(), "RC Send Only");
        assert_eq!(
            (p.bth.dest_qp, p.bth.psn, p.bth.ack_req),
            (0x11, 0x8caeba, true)
        );
        assert_eq!(p.payload.len(), 64);
        assert_eq!(
            p.present(),
            Headers {
                payload: true,
                ..Headers::NONE
            }
        );
    }

    /// PadCnt 2: 2-octet payload then 2 pad octets (rxe-ib_send_lat-rdma_cm).
    #[test]
    fn real_send_only_with_pad() {
        let p = roundtrip(&testdata::RC_SEND_ONLY_PAD2);
        assert_eq!(p.bth.pad_cnt, 2);
        assert_eq!(p.payload.len(), 2);
        assert_eq!(pad_count(p.payload.len()), 2);
        assert_eq!(p.buffer_len(), 16);
    }

    /// IBT-C9-11, IBT-X-04: SEND First/Middle/Last carry PMTU octets.
    #[test]
    fn real_send_first_middle_last() {
        for (pkt, op) in [
            (&testdata::RC_SEND_FIRST[..], Opcode::RC_SEND_FIRST),
            (&testdata::RC_SEND_MIDDLE[..], Opcode::RC_SEND_MIDDLE),
            (&testdata::RC_SEND_LAST[..], Opcode::RC_SEND_LAST),
        ] {
            let p = roundtrip(pkt);
            assert_eq!(p.bth.opcode, op);
            assert_eq!(p.payload.len(), 1024);
            assert_eq!(p.present().len(), 0);
        }
        let f = roundtrip(&testdata::RC_SEND_FIRST);
        let m = roundtrip(&testdata::RC_SEND_MIDDLE);
        assert_eq!(m.bth.psn, f.bth.psn + 1);
        assert!(!f.bth.ack_req && roundtrip(&testdata::RC_SEND_LAST).bth.ack_req);
    }

    /// IBT-X-08 (ImmDt only in last/only): SEND Only / Last with Immediate.
    #[test]
    fn real_send_with_immediate() {
        let p = roundtrip(&testdata::RC_SEND_ONLY_IMM);
        assert_eq!(p.bth.opcode, Opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
        assert!(p.immdt.is_some());
        assert_eq!(p.payload.len(), 100);
        let l = roundtrip(&testdata::RC_SEND_LAST_IMM);
        assert_eq!(l.bth.opcode.name(), "Send Last with Immediate");
        assert_eq!(l.payload.len(), 3000 - 2048);
        assert!(l.immdt.is_some());
        assert_eq!(l.bth.psn, psn_of(&testdata::RC_SEND_ONLY_IMM) + 3);
    }

    fn psn_of(pkt: &[u8]) -> u32 {
        PacketRepr::parse(transport(pkt)).unwrap().bth.psn
    }

    /// IBT-X-06: SEND Only with Invalidate carries the R_Key in an IETH.
    #[test]
    fn real_send_only_with_invalidate() {
        let p = roundtrip(&testdata::RC_SEND_ONLY_INV);
        assert_eq!(p.bth.opcode, Opcode::RC_SEND_ONLY_WITH_INVALIDATE);
        let ieth = p.ieth.unwrap();
        assert_ne!(ieth.r_key, 0);
        assert_eq!(p.payload.len(), 64);
    }

    /// IBT-C9-19, IBT-X-08: RETH only on WRITE First/Only.
    #[test]
    fn real_rdma_write() {
        let f = roundtrip(&testdata::RC_WRITE_FIRST);
        let reth = f.reth.unwrap();
        assert_eq!(reth.dma_len, 4096);
        assert_eq!(f.payload.len(), 1024);
        for pkt in [&testdata::RC_WRITE_MIDDLE[..], &testdata::RC_WRITE_LAST[..]] {
            let p = roundtrip(pkt);
            assert!(p.reth.is_none() && p.immdt.is_none());
            assert_eq!(p.payload.len(), 1024);
        }
        let o = roundtrip(&testdata::RC_WRITE_ONLY);
        assert_eq!(o.bth.opcode, Opcode::RC_RDMA_WRITE_ONLY);
        assert_eq!(o.reth.unwrap().dma_len as usize, o.payload.len());
        let oi = roundtrip(&testdata::RC_WRITE_ONLY_IMM);
        assert_eq!(oi.bth.opcode, Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
        assert!(oi.reth.is_some() && oi.immdt.is_some());
        assert_eq!(oi.reth.unwrap().dma_len, 100);
        let li = roundtrip(&testdata::RC_WRITE_LAST_IMM);
        assert!(li.reth.is_none() && li.immdt.is_some());
    }

    /// IBT-C9-23 (READ Request = BTH + RETH), IBT-C9-24 (AETH on response
    /// First/Last/Only, not Middle).
    #[test]
    fn real_rdma_read() {
        let r = roundtrip(&testdata::RC_READ_REQUEST);
        assert_eq!(r.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
        assert!(r.payload.is_empty());
        let reth = r.reth.unwrap();
        let o = roundtrip(&testdata::RC_READ_RESP_ONLY);
        assert_eq!(o.aeth.unwrap().syndrome, Syndrome::ACK);
        assert_eq!(o.payload.len(), reth.dma_len as usize);
        assert_eq!(o.bth.psn, r.bth.psn);
        let f = roundtrip(&testdata::RC_READ_RESP_FIRST);
        let m = roundtrip(&testdata::RC_READ_RESP_MIDDLE);
        let l = roundtrip(&testdata::RC_READ_RESP_LAST);
        assert!(f.aeth.is_some() && m.aeth.is_none() && l.aeth.is_some());
        assert_eq!(
            [f.payload.len(), m.payload.len(), l.payload.len()],
            [1024; 3]
        );
        assert_eq!(l.bth.psn, f.bth.psn + 3);
    }

    /// IBT-o9-15 / IBT-o9-16: CmpSwap request and Atomic Acknowledge.
    #[test]
    fn real_atomics() {
        let c = roundtrip(&testdata::RC_CMP_SWAP);
        assert_eq!(c.bth.opcode, Opcode::RC_COMPARE_SWAP);
        let a = c.atomic_eth.unwrap();
        assert_eq!(a.va % 8, 0);
        let k = roundtrip(&testdata::RC_ATOMIC_ACK);
        assert_eq!(k.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(k.aeth.unwrap().syndrome, Syndrome::ACK);
        assert!(k.atomic_ack_eth.is_some());
        assert_eq!(k.bth.psn, c.bth.psn);
    }

    /// IBT-C9-15, IBT-C9-20, EXT-PSN-04: ACK, NAKs and RNR NAK from rxe.
    #[test]
    fn real_acks_and_naks() {
        let a = roundtrip(&testdata::RC_ACK);
        assert_eq!(a.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!(
            a.aeth.unwrap().syndrome,
            Syndrome::Ack {
                credit: CreditCode::UNLIMITED
            }
        );
        let n = roundtrip(&testdata::RC_NAK_PSN_SEQ);
        assert_eq!(
            n.aeth.unwrap().syndrome,
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        let n = roundtrip(&testdata::RC_NAK_REMOTE_ACCESS);
        assert_eq!(
            n.aeth.unwrap().syndrome,
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        let r = roundtrip(&testdata::RC_RNR_NAK);
        let Syndrome::RnrNak { timer } = r.aeth.unwrap().syndrome else {
            panic!("not an RNR NAK");
        };
        assert_eq!(timer, RnrTimer::try_from(0).unwrap());
        assert_eq!(timer.micros(), 655_360);
    }

    /// UD SEND Only with DETH; CM MAD to QP1 with the GSI Q_Key (C9-49).
    #[test]
    fn real_ud() {
        let u = roundtrip(&testdata::UD_SEND_ONLY);
        assert_eq!(u.bth.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!(u.payload.len(), 256);
        assert!(u.deth.is_some());
        let m = roundtrip(&testdata::UD_CM_MAD);
        assert_eq!(m.bth.dest_qp, 1);
        let d = m.deth.unwrap();
        assert_eq!((d.q_key, d.src_qp), (GSI_QKEY, 1));
        assert_eq!(m.payload.len(), 256);
        assert_eq!(m.payload[..4], [0x01, 0x07, 0x02, 0x03]); // MAD: CM class, Send
        let ui = roundtrip(&testdata::UD_SEND_ONLY_IMM);
        assert!(ui.deth.is_some() && ui.immdt.is_some());
        let uc = roundtrip(&testdata::UC_SEND_FIRST);
        assert_eq!(uc.bth.opcode.service(), Service::Uc);
    }

    fn sample_headers(p: &mut PacketRepr<'_>) {
        let h = p.bth.opcode.headers();
        fn v<R>(on: bool, r: R) -> Option<R> {
            if on { Some(r) } else { None }
        }
        p.rdeth = v(
            h.rdeth,
            RdethRepr {
                reserved: 0,
                ee_context: 0x0A0B0C,
            },
        );
        p.deth = v(
            h.deth,
            DethRepr {
                q_key: 0x1111_2222,
                reserved: 0,
                src_qp: 0x33,
            },
        );
        p.xrceth = v(
            h.xrceth,
            XrcEthRepr {
                reserved: 0,
                xrc_srq: 0x44,
            },
        );
        p.feth = v(
            h.feth,
            FethRepr {
                reserved: 0,
                selectivity_level: 1,
                placement_type: 2,
            },
        );
        p.reth = v(
            h.reth,
            RethRepr {
                va: 0x1000,
                r_key: 0x55,
                dma_len: 700,
            },
        );
        p.atomic_eth = v(
            h.atomic_eth,
            AtomicEthRepr {
                va: 0x2000,
                r_key: 0x66,
                swap_add_data: 7,
                compare_data: 8,
            },
        );
        p.aeth = v(
            h.aeth,
            AethRepr {
                reserved: false,
                syndrome: Syndrome::ACK,
                msn: 9,
            },
        );
        p.atomic_ack_eth = v(
            h.atomic_ack_eth,
            AtomicAckEthRepr {
                orig_remote_data: 10,
            },
        );
        p.immdt = v(
            h.immdt,
            ImmDtRepr {
                immediate_data: 0xCAFE_F00D,
            },
        );
        p.ieth = v(h.ieth, IethRepr { r_key: 0x77 });
    }

    /// IBT-C9-1, IBT-C9-2 (+ C9-14, C9-15, C9-19, C9-20, C9-23, C9-24, o9-15, o9-16,
    /// o9-3.a1): hand-built packet per opcode, each starting with
    /// its 12-octet BTH; header order on
    /// the wire is RDETH, DETH, XRCETH, FETH, RETH|AtomicETH, AETH,
    /// AtomicAckETH, ImmDt, IETH, payload, pad.
    #[test]
    fn ibt_c9_2_hand_built_every_opcode() {
        let payload = [0xA5u8; 5];
        for op in Opcode::all() {
            let pl: &[u8] = if op.has_payload() { &payload } else { &[] };
            let mut p = PacketRepr::new(BthRepr::new(op, 0x12, 0x34), pl);
            sample_headers(&mut p);
            let mut buf = [0u8; 128];
            let n = p.emit(&mut buf).unwrap();
            assert_eq!(
                n,
                12 + op.header_len() + pl.len() + pad_count(pl.len()) as usize
            );
            assert_eq!(n % 4, 0, "{op}");
            // IBT-C9-1: every packet starts with the BTH.
            assert_eq!(BthRepr::parse(&buf[..12]).unwrap(), p.bth, "{op}");
            // Header order: check a few fixed offsets.
            let mut off = 12;
            let h = op.headers();
            if h.rdeth {
                assert_eq!(buf[off..off + 4], [0, 0x0A, 0x0B, 0x0C]);
                off += 4;
            }
            if h.deth {
                assert_eq!(buf[off..off + 4], [0x11, 0x11, 0x22, 0x22]);
                off += 8;
            }
            if h.xrceth {
                assert_eq!(buf[off..off + 4], [0, 0, 0, 0x44]);
                off += 4;
            }
            if h.feth {
                assert_eq!(buf[off..off + 4], [0, 0, 0, 0x12]);
                off += 4;
            }
            if h.reth {
                assert_eq!(buf[off + 12..off + 16], 700u32.to_be_bytes());
                off += 16;
            }
            if h.atomic_eth {
                assert_eq!(buf[off + 20..off + 28], 8u64.to_be_bytes());
                off += 28;
            }
            if h.aeth {
                assert_eq!(buf[off..off + 4], [0x1F, 0, 0, 9]);
                off += 4;
            }
            if h.atomic_ack_eth {
                assert_eq!(buf[off..off + 8], 10u64.to_be_bytes());
                off += 8;
            }
            if h.immdt {
                assert_eq!(buf[off..off + 4], [0xCA, 0xFE, 0xF0, 0x0D]);
                off += 4;
            }
            if h.ieth {
                assert_eq!(buf[off..off + 4], [0, 0, 0, 0x77]);
                off += 4;
            }
            assert_eq!(&buf[off..off + pl.len()], pl);
            assert!(buf[off + pl.len()..n].iter().all(|&b| b == 0));
            let back = PacketRepr::parse(&buf[..n]).unwrap();
            assert_eq!(back, p, "{op}");
        }
    }

    /// IBT-X-05 / IBT-C9-17: a 700-octet SEND at PMTU 256 is First(256),
    /// Middle(256), Last(188), consecutive PSNs, no pad needed.
    #[test]
    fn ibt_c9_11_700_at_256() {
        let data = [7u8; 700];
        let ops = [
            Opcode::RC_SEND_FIRST,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_LAST,
        ];
        let mut got = Vec::new();
        for (i, (op, chunk)) in ops.iter().zip(data.chunks(256)).enumerate() {
            let p = PacketRepr::new(BthRepr::new(*op, 1, 100 + i as u32), chunk);
            let mut buf = [0u8; 300];
            let n = p.emit(&mut buf).unwrap();
            let back = PacketRepr::parse(&buf[..n]).unwrap();
            got.push((
                back.bth.opcode.operation(),
                back.payload.len(),
                back.bth.psn,
            ));
        }
        assert_eq!(
            got,
            [
                (Operation::SendFirst, 256, 100),
                (Operation::SendMiddle, 256, 101),
                (Operation::SendLast, 188, 102)
            ]
        );
    }

    /// IBT-X-05: messages of 0, PMTU, PMTU+1 and 2*PMTU+1 octets take 1,
    /// 1, 2 and 3 packets ("Only" for the first two).
    #[test]
    fn ibt_x_05_packet_counts() {
        use crate::ib::psn::read_psn_count;
        let pmtu = 1024;
        for (len, n) in [(0, 1), (pmtu, 1), (pmtu + 1, 2), (2 * pmtu + 1, 3)] {
            assert_eq!(read_psn_count(len, pmtu), n, "{len}");
        }
        // A zero-length SEND Only / WRITE Only is a valid packet.
        let p = PacketRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, 1, 1), &[]);
        let mut buf = [0u8; 12];
        assert_eq!(p.emit(&mut buf), Ok(12));
        assert!(PacketRepr::parse(&buf).unwrap().payload.is_empty());
    }

    #[test]
    fn malformed_inputs() {
        // ACK (no payload) with trailing octets.
        let mut ack = [0u8; 20];
        ack[0] = 0x11;
        ack[12] = 0x1F;
        assert!(PacketRepr::parse(&ack[..16]).is_ok());
        assert!(matches!(
            PacketRepr::parse(&ack),
            Err(Error::Malformed { .. })
        ));
        // PadCnt larger than what follows the headers.
        let mut s = [0u8; 14];
        s[0] = 0x04;
        s[1] = 0x30;
        assert!(matches!(
            PacketRepr::parse(&s),
            Err(Error::Malformed { .. })
        ));
        s[1] = 0x20;
        let p = PacketRepr::parse(&s).unwrap();
        assert!(p.payload.is_empty());
        // Reserved AETH syndrome.
        ack[12] = 0x40;
        assert!(matches!(
            PacketRepr::parse(&ack[..16]),
            Err(Error::Unknown { .. })
        ));
        // Reserved opcode.
        ack[0] = 0xC0;
        assert!(matches!(
            PacketRepr::parse(&ack[..16]),
            Err(Error::Unknown { .. })
        ));
        assert!(PacketRepr::parse(&[]).is_err());
    }

    #[test]
    fn emit_checks_headers_and_length() {
        let mut p = PacketRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_FIRST, 1, 2), b"abcd");
        let mut buf = [0u8; 64];
        assert!(matches!(p.emit(&mut buf), Err(Error::Malformed { .. })));
        p.reth = Some(RethRepr::default());
        assert_eq!(p.emit(&mut buf), Ok(32));
        p.ieth = Some(IethRepr::default());
        assert!(p.emit(&mut buf).is_err());
        p.ieth = None;
        for n in 0..32 {
            assert!(matches!(
                p.emit(&mut buf[..n]),
                Err(Error::Truncated { .. })
            ));
        }
        let a = PacketRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, 1, 2), b"x");
        assert!(a.emit(&mut buf).is_err());
    }

    fn packet_strategy() -> impl Strategy<Value = (BthRepr, Vec<u8>, [u8; 3], u64)> {
        (
            crate::ib::bth::tests::bth_strategy(),
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<[u8; 3]>(),
            any::<u64>(),
        )
    }

    proptest! {
        #[test]
        fn prop_packet_roundtrip((bth, payload, pad, seed) in packet_strategy()) {
            let pl: &[u8] = if bth.opcode.has_payload() { &payload } else { &[] };
            let mut p = PacketRepr::new(bth, pl);
            p.bth.pad_cnt = bth.pad_cnt;
            let n = p.bth.pad_cnt as usize;
            p.pad[..n].copy_from_slice(&pad[..n]);
            sample_headers(&mut p);
            if let Some(r) = &mut p.reth { r.va = seed; }
            if let Some(a) = &mut p.aeth { a.msn = (seed & 0xFF_FFFF) as u32; a.reserved = seed & 1 == 1; }
            let mut a = vec![0u8; p.buffer_len()];
            prop_assert_eq!(p.emit(&mut a), Ok(a.len()));
            let q = PacketRepr::parse(&a).unwrap();
            prop_assert_eq!(q, p);
            let mut b = vec![0u8; q.buffer_len()];
            q.emit(&mut b).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn prop_packet_never_panics(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(p) = PacketRepr::parse(&b) {
                let mut out = vec![0u8; p.buffer_len()];
                prop_assert_eq!(p.emit(&mut out), Ok(b.len()));
                prop_assert_eq!(out, b);
            }
        }

        #[test]
        fn prop_packet_valid_opcode_never_panics(op in proptest::sample::select(Opcode::all().collect::<Vec<_>>()),
                                                 mut b in proptest::collection::vec(any::<u8>(), 12..96)) {
            b[0] = op.value();
            if let Ok(p) = PacketRepr::parse(&b) {
                let mut out = vec![0u8; p.buffer_len()];
                prop_assert_eq!(p.emit(&mut out), Ok(b.len()));
                prop_assert_eq!(out, b);
            }
        }
    }
}
