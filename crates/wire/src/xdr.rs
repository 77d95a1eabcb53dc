//! XDR (RFC 4506): a bounded, non-allocating reader and writer.
//!
//! XDR is big-endian in 4-octet units (RFC 4506 §3). Everything RPC-over-RDMA
//! (RFC 8166 §4) and ONC RPC (RFC 5531 §9) put on the wire is built from the
//! primitives here. The reader borrows the input and never copies it; the
//! writer fills a caller buffer. Neither allocates nor panics: every short
//! buffer is `Error::Truncated`, every over-long counted item `Error::TooLarge`.
//!
//! Errors carry a [`Layer`]: `Layer::Xdr` by default, or the layer of the
//! protocol being decoded (`XdrReader::with_layer`), so that a truncated
//! RPC-over-RDMA header reports `Layer::RpcRdma`.

use crate::{Error, Layer, Result};

/// RFC 4506 §3: the basic block size, 4 octets.
pub const XDR_UNIT: usize = 4;

/// Octets of zero padding after `len` octets of opaque data (RFC 4506 §4.9).
#[inline]
pub const fn pad_len(len: usize) -> usize {
    (XDR_UNIT - (len % XDR_UNIT)) % XDR_UNIT
}

/// `len` rounded up to a multiple of 4 (RFC 4506 §4.9 "roundup"), saturating.
#[inline]
pub const fn padded_len(len: usize) -> usize {
    len.saturating_add(pad_len(len))
}

/// Encoded size of a variable-length opaque or string of `len` octets
/// (RFC 4506 §4.10/§4.11): length word + data + padding.
#[inline]
pub const fn opaque_len(len: usize) -> usize {
    XDR_UNIT.saturating_add(padded_len(len))
}

/// A cursor over XDR-encoded octets. Never reads past the slice.
#[derive(Debug, Clone, Copy)]
pub struct XdrReader<'a> {
    buf: &'a [u8],
    pos: usize,
    layer: Layer,
}

impl<'a> XdrReader<'a> {
    /// A reader whose errors are tagged `Layer::Xdr`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self::with_layer(buf, Layer::Xdr)
    }

    /// A reader whose errors are tagged with `layer`.
    pub fn with_layer(buf: &'a [u8], layer: Layer) -> Self {
        XdrReader { buf, pos: 0, layer }
    }

    /// Octets consumed so far (offset of the next item).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Octets left.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// True when every octet was consumed.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The octets not yet consumed.
    pub fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// The layer errors are tagged with.
    pub fn layer(&self) -> Layer {
        self.layer
    }

    /// Take `n` raw octets (no padding logic).
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(Error::Truncated {
            layer: self.layer,
            need: usize::MAX,
            have: self.buf.len(),
        })?;
        match self.buf.get(self.pos..end) {
            Some(s) => {
                self.pos = end;
                Ok(s)
            }
            None => Err(Error::Truncated {
                layer: self.layer,
                need: end,
                have: self.buf.len(),
            }),
        }
    }

    /// Skip `n` octets (`n` is not rounded).
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.take(n).map(|_| ())
    }

    /// RFC 4506 §4.2: unsigned integer.
    pub fn read_u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// RFC 4506 §4.1: (signed) integer, two's complement.
    pub fn read_i32(&mut self) -> Result<i32> {
        self.read_u32().map(|v| v as i32)
    }

    /// RFC 4506 §4.5: unsigned hyper integer, most significant word first.
    pub fn read_u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// RFC 4506 §4.5: hyper integer.
    pub fn read_i64(&mut self) -> Result<i64> {
        self.read_u64().map(|v| v as i64)
    }

    /// RFC 4506 §4.4: boolean, `enum { FALSE = 0, TRUE = 1 }`. Any other value
    /// is `Error::Unknown`. Also the "is present" word of optional-data (§4.19).
    pub fn read_bool(&mut self) -> Result<bool> {
        match self.read_u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::Unknown {
                layer: self.layer,
                field: "bool",
                value: v.into(),
            }),
        }
    }

    /// RFC 4506 §4.3: enumeration, decoded into `E` (its `TryFrom<u32>` says
    /// which values are defined).
    pub fn read_enum<E: TryFrom<u32, Error = Error>>(&mut self) -> Result<E> {
        E::try_from(self.read_u32()?)
    }

    /// RFC 4506 §4.9: fixed-length opaque of `len` octets, then its zero
    /// padding. Non-zero padding is `Error::Malformed`.
    pub fn read_opaque_fixed(&mut self, len: usize) -> Result<&'a [u8]> {
        // Check the whole padded extent first so a truncation reports it.
        let total = len.checked_add(pad_len(len)).ok_or(Error::TooLarge {
            layer: self.layer,
            what: "opaque length",
            value: len as u64,
            limit: u32::MAX.into(),
        })?;
        let all = self.take(total)?;
        let (data, pad) = all.split_at(len);
        if pad.iter().any(|&b| b != 0) {
            return Err(Error::Malformed {
                layer: self.layer,
                reason: "non-zero XDR padding",
            });
        }
        Ok(data)
    }

    /// RFC 4506 §4.10: variable-length opaque `opaque<max>`: length word, data,
    /// zero padding. A length above `max` is `Error::TooLarge`.
    pub fn read_opaque(&mut self, max: u32) -> Result<&'a [u8]> {
        let len = self.read_u32()?;
        if len > max {
            return Err(Error::TooLarge {
                layer: self.layer,
                what: "opaque length",
                value: len.into(),
                limit: max.into(),
            });
        }
        self.read_opaque_fixed(len as usize)
    }

    /// RFC 4506 §4.11: `string<max>`, returned as `&str`. Non-UTF-8 content is
    /// `Error::Malformed` (XDR says ASCII; use [`read_opaque`](Self::read_opaque)
    /// to accept any octets).
    pub fn read_string(&mut self, max: u32) -> Result<&'a str> {
        let b = self.read_opaque(max)?;
        core::str::from_utf8(b).map_err(|_| Error::Malformed {
            layer: self.layer,
            reason: "XDR string is not UTF-8",
        })
    }

    /// RFC 4506 §4.13: the element count of a variable-length array `T<max>`.
    /// A count above `max` is `Error::TooLarge`; the elements are the caller's.
    pub fn read_count(&mut self, max: u32) -> Result<u32> {
        let n = self.read_u32()?;
        if n > max {
            return Err(Error::TooLarge {
                layer: self.layer,
                what: "array count",
                value: n.into(),
                limit: max.into(),
            });
        }
        Ok(n)
    }
}

/// A cursor that writes XDR into a caller buffer. Never writes past it.
#[derive(Debug)]
pub struct XdrWriter<'a> {
    buf: &'a mut [u8],
    pos: usize,
    layer: Layer,
}

impl<'a> XdrWriter<'a> {
    /// A writer whose errors are tagged `Layer::Xdr`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self::with_layer(buf, Layer::Xdr)
    }

    /// A writer whose errors are tagged with `layer`.
    pub fn with_layer(buf: &'a mut [u8], layer: Layer) -> Self {
        XdrWriter { buf, pos: 0, layer }
    }

    /// Octets written so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Room left.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Consume the writer, returning the number of octets written.
    pub fn finish(self) -> usize {
        self.pos
    }

    /// Reserve `n` octets and return them.
    fn room(&mut self, n: usize) -> Result<&mut [u8]> {
        let have = self.buf.len();
        let end = self.pos.checked_add(n).ok_or(Error::Truncated {
            layer: self.layer,
            need: usize::MAX,
            have,
        })?;
        if end > have {
            return Err(Error::Truncated {
                layer: self.layer,
                need: end,
                have,
            });
        }
        let start = self.pos;
        self.pos = end;
        Ok(&mut self.buf[start..end])
    }

    /// RFC 4506 §4.2: unsigned integer.
    pub fn write_u32(&mut self, v: u32) -> Result<()> {
        self.room(4)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    /// RFC 4506 §4.1: integer.
    pub fn write_i32(&mut self, v: i32) -> Result<()> {
        self.write_u32(v as u32)
    }

    /// RFC 4506 §4.5: unsigned hyper.
    pub fn write_u64(&mut self, v: u64) -> Result<()> {
        self.room(8)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    /// RFC 4506 §4.5: hyper.
    pub fn write_i64(&mut self, v: i64) -> Result<()> {
        self.write_u64(v as u64)
    }

    /// RFC 4506 §4.4: boolean (also optional-data's "is present", §4.19).
    pub fn write_bool(&mut self, v: bool) -> Result<()> {
        self.write_u32(v.into())
    }

    /// RFC 4506 §4.3: enumeration.
    pub fn write_enum<E: Into<u32>>(&mut self, v: E) -> Result<()> {
        self.write_u32(v.into())
    }

    /// RFC 4506 §4.9: fixed-length opaque plus zero padding.
    pub fn write_opaque_fixed(&mut self, data: &[u8]) -> Result<()> {
        let len = data.len();
        let room = self.room(len.saturating_add(pad_len(len)))?;
        let (d, pad) = room.split_at_mut(len);
        d.copy_from_slice(data);
        pad.fill(0);
        Ok(())
    }

    /// RFC 4506 §4.10: `opaque<max>`. Data longer than `max` is
    /// `Error::TooLarge` (so the peer's reader with the same bound accepts it).
    pub fn write_opaque(&mut self, data: &[u8], max: u32) -> Result<()> {
        let len = u32::try_from(data.len())
            .ok()
            .filter(|&l| l <= max)
            .ok_or(Error::TooLarge {
                layer: self.layer,
                what: "opaque length",
                value: data.len() as u64,
                limit: max.into(),
            })?;
        // Check the room for the whole item before writing any of it.
        if opaque_len(data.len()) > self.remaining() {
            return Err(Error::Truncated {
                layer: self.layer,
                need: self.pos.saturating_add(opaque_len(data.len())),
                have: self.buf.len(),
            });
        }
        self.write_u32(len)?;
        self.write_opaque_fixed(data)
    }

    /// RFC 4506 §4.11: `string<max>`.
    pub fn write_string(&mut self, s: &str, max: u32) -> Result<()> {
        self.write_opaque(s.as_bytes(), max)
    }

    /// RFC 4506 §4.13: the count word of a variable-length array `T<max>`.
    pub fn write_count(&mut self, n: usize, max: u32) -> Result<()> {
        let v = u32::try_from(n)
            .ok()
            .filter(|&v| v <= max)
            .ok_or(Error::TooLarge {
                layer: self.layer,
                what: "array count",
                value: n as u64,
                limit: max.into(),
            })?;
        self.write_u32(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RPCRDMA-36: XDR is big-endian in 32-bit units (RFC 4506 §3, §4.1-§4.5).
    #[test]
    fn rpcrdma_36_integers_big_endian() {
        let b = [
            0x00, 0x00, 0x00, 0x2a, 0xff, 0xff, 0xff, 0xfe, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
            0x07, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        ];
        let mut r = XdrReader::new(&b);
        assert_eq!(r.read_u32().unwrap(), 42);
        assert_eq!(r.read_i32().unwrap(), -2);
        assert_eq!(r.read_u64().unwrap(), 0x0102_0304_0506_0708);
        assert!(r.read_bool().unwrap());
        assert!(!r.read_bool().unwrap());
        assert!(r.is_empty());

        let mut out = [0u8; 24];
        let mut w = XdrWriter::new(&mut out);
        w.write_u32(42).unwrap();
        w.write_i32(-2).unwrap();
        w.write_u64(0x0102_0304_0506_0708).unwrap();
        w.write_bool(true).unwrap();
        w.write_bool(false).unwrap();
        assert_eq!(w.finish(), 24);
        assert_eq!(out, b);
    }

    #[test]
    fn hyper_signed() {
        let mut out = [0u8; 8];
        let mut w = XdrWriter::new(&mut out);
        w.write_i64(-1).unwrap();
        assert_eq!(out, [0xff; 8]);
        assert_eq!(XdrReader::new(&out).read_i64().unwrap(), -1);
    }

    #[test]
    fn bool_rejects_other_values() {
        let b = [0, 0, 0, 2];
        assert!(matches!(
            XdrReader::new(&b).read_bool(),
            Err(Error::Unknown {
                layer: Layer::Xdr,
                field: "bool",
                value: 2
            })
        ));
    }

    #[test]
    fn opaque_variable_and_padding() {
        // RFC 4506 §4.10: "(none)" = 6 octets + 2 pad.
        let b = [0, 0, 0, 6, b'(', b'n', b'o', b'n', b'e', b')', 0, 0];
        let mut r = XdrReader::new(&b);
        assert_eq!(r.read_string(255).unwrap(), "(none)");
        assert!(r.is_empty());
        let mut out = [0xaau8; 12];
        let mut w = XdrWriter::new(&mut out);
        w.write_string("(none)", 255).unwrap();
        assert_eq!(w.finish(), 12);
        assert_eq!(out, b);

        // Non-zero padding is rejected.
        let bad = [0, 0, 0, 6, b'(', b'n', b'o', b'n', b'e', b')', 0, 1];
        assert!(matches!(
            XdrReader::new(&bad).read_opaque(255),
            Err(Error::Malformed { .. })
        ));
        // Longer than the bound.
        assert!(matches!(
            XdrReader::new(&b).read_opaque(5),
            Err(Error::TooLarge {
                value: 6,
                limit: 5,
                ..
            })
        ));
        let mut out = [0u8; 12];
        assert!(matches!(
            XdrWriter::new(&mut out).write_opaque(b"(none)", 5),
            Err(Error::TooLarge { .. })
        ));
        // Truncated in the padding.
        assert!(matches!(
            XdrReader::new(&b[..11]).read_opaque(255),
            Err(Error::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
    }

    #[test]
    fn opaque_fixed_and_zero_length() {
        let b = [1, 2, 3, 0, 0, 0, 0, 0];
        let mut r = XdrReader::new(&b);
        assert_eq!(r.read_opaque_fixed(3).unwrap(), &[1, 2, 3]);
        assert_eq!(r.read_opaque(0).unwrap(), &[] as &[u8]);
        assert_eq!(r.position(), 8);
        let mut out = [0xffu8; 8];
        let mut w = XdrWriter::new(&mut out);
        w.write_opaque_fixed(&[1, 2, 3]).unwrap();
        w.write_opaque(&[], 0).unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn string_rejects_non_utf8() {
        let b = [0, 0, 0, 1, 0xff, 0, 0, 0];
        assert!(matches!(
            XdrReader::new(&b).read_string(8),
            Err(Error::Malformed { .. })
        ));
        assert_eq!(XdrReader::new(&b).read_opaque(8).unwrap(), &[0xff]);
    }

    #[test]
    fn count_bound() {
        let b = [0, 0, 0, 17];
        assert!(matches!(
            XdrReader::new(&b).read_count(16),
            Err(Error::TooLarge {
                what: "array count",
                ..
            })
        ));
        assert_eq!(XdrReader::new(&b).read_count(17).unwrap(), 17);
        let mut out = [0u8; 4];
        assert!(XdrWriter::new(&mut out).write_count(17, 16).is_err());
    }

    #[test]
    fn enum_via_try_from() {
        #[derive(Debug, PartialEq)]
        struct Even(u32);
        impl TryFrom<u32> for Even {
            type Error = Error;
            fn try_from(v: u32) -> Result<Self> {
                if v.is_multiple_of(2) {
                    Ok(Even(v))
                } else {
                    Err(Error::Unknown {
                        layer: Layer::Xdr,
                        field: "even",
                        value: v.into(),
                    })
                }
            }
        }
        let b = [0, 0, 0, 4, 0, 0, 0, 5];
        let mut r = XdrReader::new(&b);
        assert_eq!(r.read_enum::<Even>().unwrap(), Even(4));
        assert!(r.read_enum::<Even>().is_err());
        let mut out = [0u8; 4];
        let mut w = XdrWriter::new(&mut out);
        w.write_enum(7u32).unwrap();
        assert_eq!(out, [0, 0, 0, 7]);
    }

    #[test]
    fn layer_tagging() {
        let mut r = XdrReader::with_layer(&[0, 0], Layer::RpcRdma);
        assert_eq!(r.read_u32().unwrap_err().layer(), Layer::RpcRdma);
        let mut out = [0u8; 2];
        let mut w = XdrWriter::with_layer(&mut out, Layer::OncRpc);
        assert_eq!(w.write_u32(1).unwrap_err().layer(), Layer::OncRpc);
    }

    #[test]
    fn writer_truncation_never_partially_writes_opaque() {
        let mut out = [0xeeu8; 7];
        let mut w = XdrWriter::new(&mut out);
        assert!(matches!(
            w.write_opaque(b"abc", 8),
            Err(Error::Truncated {
                need: 8,
                have: 7,
                ..
            })
        ));
        assert_eq!(w.position(), 0);
        assert_eq!(out, [0xee; 7]);
    }

    #[test]
    fn every_truncation_errors() {
        let b = [0, 0, 0, 5, 1, 2, 3, 4, 5, 0, 0, 0];
        for n in 0..b.len() {
            assert!(
                matches!(
                    XdrReader::new(&b[..n]).read_opaque(64),
                    Err(Error::Truncated { .. })
                ),
                "{n}"
            );
        }
        let mut r = XdrReader::new(&b[..7]);
        assert!(r.read_u64().is_err());
        assert!(r.skip(8).is_err());
        assert_eq!(r.rest().len(), 7);
    }

    #[test]
    fn pad_helpers() {
        assert_eq!([0, 1, 2, 3, 4, 5].map(pad_len), [0, 3, 2, 1, 0, 3]);
        assert_eq!(padded_len(7), 8);
        assert_eq!(opaque_len(7), 12);
        assert_eq!(padded_len(usize::MAX), usize::MAX);
    }

    proptest! {
        #[test]
        fn opaque_round_trip(data in proptest::collection::vec(any::<u8>(), 0..64), a in any::<u32>(), h in any::<u64>()) {
            let mut out = [0u8; 96];
            let mut w = XdrWriter::new(&mut out);
            w.write_u32(a).unwrap();
            w.write_opaque(&data, 64).unwrap();
            w.write_u64(h).unwrap();
            let n = w.finish();
            prop_assert_eq!(n, 4 + opaque_len(data.len()) + 8);
            let mut r = XdrReader::new(&out[..n]);
            prop_assert_eq!(r.read_u32().unwrap(), a);
            prop_assert_eq!(r.read_opaque(64).unwrap(), &data[..]);
            prop_assert_eq!(r.read_u64().unwrap(), h);
            prop_assert!(r.is_empty());
        }

        #[test]
        fn reader_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in any::<u32>()) {
            let mut r = XdrReader::new(&bytes);
            let _ = r.read_opaque(max);
            let _ = r.read_string(max);
            let _ = r.read_bool();
            let _ = r.read_u64();
            let _ = r.read_opaque_fixed(max as usize);
            let _ = r.read_count(max);
            let _ = r.skip(max as usize);
        }
    }
}
