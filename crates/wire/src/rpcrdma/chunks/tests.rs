//! Tests of the three chunk lists together (RFC 8166 §4.1.2, §4.3): golden encodings, the
//! `RDMA_NOMSG` rule and the bounds against hostile input.

use super::*;
use crate::rpcrdma::test_util::*;
use crate::rpcrdma::{
    MAX_CHUNK_SEGMENTS, MAX_READ_SEGMENTS, MAX_WRITE_CHUNKS, ReadSegment, Repr, Segment,
};

/// RPCRDMA-01, -13, -19, -20, -36: rpc-rdma.md §4.2 chunk-list encodings:
/// Read list `1 PHLOO 1 PHLOO 0`, Write list `1 3 HLOO HLOO HLOO 1 2 HLOO
/// HLOO 0`, Reply chunk `1 2 HLOO HLOO`; emitted from the caller's arrays,
/// parsed back into wire lists that compare equal, byte-identical.
#[test]
fn rpcrdma_01_13_20_golden_chunk_lists() {
    let s: [Segment; 7] = [seg(1), seg(2), seg(3), seg(4), seg(5), seg(6), seg(7)];
    let reads = [ReadSegment::new(8, s[0]), ReadSegment::new(8, s[1])];
    let c1 = [s[2], s[3], s[4]];
    let c2 = [s[5], s[6]];
    let chunks = [WriteChunk::Slice(&c1), WriteChunk::Slice(&c2)];
    let reply = [s[0], s[1]];
    let repr = Repr::msg(
        7,
        1,
        Chunks {
            read_list: ReadList::Slice(&reads),
            write_list: WriteList::Slice(&chunks),
            reply_chunk: Some(WriteChunk::Slice(&reply)),
        },
    );
    let hloo = |x: Segment| [x.handle, x.length, (x.offset >> 32) as u32, x.offset as u32];
    let mut w: [u32; 128] = [0; 128];
    let mut n = 0;
    let mut push = |v: &[u32]| {
        w[n..n + v.len()].copy_from_slice(v);
        n += v.len();
    };
    push(&[7, 1, 1, 0]);
    // 1 PHLOO 1 PHLOO 0
    for r in &reads {
        push(&[1, r.position]);
        push(&hloo(r.target()));
    }
    push(&[0]);
    // 1 3 HLOO HLOO HLOO 1 2 HLOO HLOO 0
    push(&[1, 3]);
    c1.iter().for_each(|x| push(&hloo(*x)));
    push(&[1, 2]);
    c2.iter().for_each(|x| push(&hloo(*x)));
    push(&[0]);
    // 1 2 HLOO HLOO
    push(&[1, 2]);
    reply.iter().for_each(|x| push(&hloo(*x)));
    let (golden, len) = words(&w[..n]);
    assert_eq!(repr.buffer_len(), len);
    let mut out = [0u8; 512];
    assert_eq!(repr.emit(&mut out).unwrap(), len);
    assert_eq!(&out[..len], &golden[..len]);
    let (parsed, plen) = round_trip(&golden[..len]);
    assert_eq!(plen, len);
    assert_eq!(parsed, repr);
    let pc = parsed.chunks().unwrap();
    assert!(pc.read_list.iter().eq(reads.iter().copied()));
    let mut it = pc.write_list.iter();
    assert_eq!(it.len(), 2);
    assert!(it.next().unwrap().iter().eq(c1.iter().copied()));
    assert!(it.next().unwrap().iter().eq(c2.iter().copied()));
    assert!(it.next().is_none());
    assert_eq!(pc.reply_chunk.unwrap().total_len(), 0x1001 + 0x2001);
    // RPCRDMA-20: the two segments share Position 8: one Read chunk.
    assert!(pc.read_list.iter().all(|r| r.position == 8));
}

/// RPCRDMA-41, -63: RDMA_NOMSG with no Read list and no Reply chunk is an
/// XDR error (ERR_CHUNK), on parse and on emit.
#[test]
fn rpcrdma_41_63_nomsg_without_chunks() {
    let (b, n) = words(&[1, 1, 1, 1, 0, 0, 0]);
    assert!(matches!(Repr::parse(&b[..n]), Err(Error::Malformed { .. })));
    assert!(
        Repr::nomsg(1, 1, Chunks::NONE)
            .emit(&mut [0u8; 28])
            .is_err()
    );
    // A Write list alone cannot carry a Payload stream either.
    let c = [WriteChunk::Slice(&[])];
    let wl = Chunks {
        write_list: WriteList::Slice(&c),
        ..Chunks::NONE
    };
    assert!(Repr::nomsg(1, 1, wl).emit(&mut [0u8; 64]).is_err());
}

// --- Bounds against hostile input --------------------------------------

fn hostile(reads: usize, chunks: usize, segs: usize) -> ([u8; 8192], usize) {
    let mut b = [0u8; 8192];
    let mut w = XdrWriter::new(&mut b);
    for v in [1, 1, 1, 0] {
        w.write_u32(v).unwrap();
    }
    for _ in 0..reads {
        w.write_u32(1).unwrap();
        ReadSegment::new(0, seg(1)).write(&mut w).unwrap();
    }
    w.write_u32(0).unwrap();
    for _ in 0..chunks {
        w.write_u32(1).unwrap();
        w.write_u32(segs as u32).unwrap();
        for _ in 0..segs {
            seg(2).write(&mut w).unwrap();
        }
    }
    w.write_u32(0).unwrap();
    w.write_u32(0).unwrap();
    let n = w.finish();
    (b, n)
}

/// The bounds: 64 read segments, 64 write chunks, 64 segments per chunk.
#[test]
fn bounds_too_large() {
    let (b, n) = hostile(MAX_READ_SEGMENTS, 0, 0);
    assert_eq!(
        Repr::parse(&b[..n])
            .unwrap()
            .0
            .chunks()
            .unwrap()
            .read_list
            .len(),
        64
    );
    let (b, n) = hostile(MAX_READ_SEGMENTS + 1, 0, 0);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::TooLarge {
            what: "read segments",
            limit: 64,
            ..
        })
    ));
    let (b, n) = hostile(0, MAX_WRITE_CHUNKS, 1);
    assert_eq!(
        Repr::parse(&b[..n])
            .unwrap()
            .0
            .chunks()
            .unwrap()
            .write_list
            .len(),
        64
    );
    let (b, n) = hostile(0, MAX_WRITE_CHUNKS + 1, 0);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::TooLarge {
            what: "write chunks",
            ..
        })
    ));
    let (b, n) = hostile(0, 1, MAX_CHUNK_SEGMENTS);
    let (r, _) = Repr::parse(&b[..n]).unwrap();
    assert_eq!(
        r.chunks().unwrap().write_list.iter().next().unwrap().len(),
        64
    );
    let (b, n) = hostile(0, 1, MAX_CHUNK_SEGMENTS + 1);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::TooLarge {
            what: "chunk segments",
            ..
        })
    ));
    // A forged count is refused before any segment is looked for.
    let (b, n) = words(&[1, 1, 1, 0, 0, 0, 1, 0xffff_ffff]);
    assert!(matches!(
        Repr::parse(&b[..n]),
        Err(Error::TooLarge {
            value: 0xffff_ffff,
            ..
        })
    ));
    // Emit enforces the same bounds on the caller's arrays.
    let many = [seg(1); MAX_CHUNK_SEGMENTS + 1];
    let repr = Repr::nomsg(
        1,
        1,
        Chunks {
            reply_chunk: Some(WriteChunk::Slice(&many)),
            ..Chunks::NONE
        },
    );
    assert!(matches!(
        repr.emit(&mut [0u8; 2048]),
        Err(Error::TooLarge { .. })
    ));
    let reads = [ReadSegment::default(); MAX_READ_SEGMENTS + 1];
    let repr = Repr::msg(
        1,
        1,
        Chunks {
            read_list: ReadList::Slice(&reads),
            ..Chunks::NONE
        },
    );
    assert!(matches!(
        repr.emit(&mut [0u8; 2048]),
        Err(Error::TooLarge { .. })
    ));
    let chunks = [WriteChunk::EMPTY; MAX_WRITE_CHUNKS + 1];
    let repr = Repr::msg(
        1,
        1,
        Chunks {
            write_list: WriteList::Slice(&chunks),
            ..Chunks::NONE
        },
    );
    assert!(matches!(
        repr.emit(&mut [0u8; 2048]),
        Err(Error::TooLarge { .. })
    ));
}
