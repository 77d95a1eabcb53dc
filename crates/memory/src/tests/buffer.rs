//! `Buffer`: alignment, zeroing, copies, atomics.

use crate::{Buffer, MAP_MIN, MemError, PAGE_SIZE};

#[test]
fn buffer_is_page_aligned_and_zeroed() {
    for len in [0, 1, 8, 4095, 4096, 4097, 3 * 4096 + 5] {
        let b = Buffer::new(len);
        assert_eq!(b.len(), len);
        assert_eq!(b.is_empty(), len == 0);
        let g = b.read();
        assert_eq!(g.len(), len);
        if len > 0 {
            assert_eq!(g.as_ptr() as usize % PAGE_SIZE, 0, "len {len}");
        }
        assert!(g.iter().all(|&x| x == 0));
    }
}

#[test]
fn from_vec_keeps_contents_and_aligns() {
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let b = Buffer::from_vec(data.clone());
    assert_eq!(&b.read()[..], &data[..]);
    assert_eq!(b.read().as_ptr() as usize % PAGE_SIZE, 0);
    assert!(Buffer::from_vec(Vec::new()).is_empty());
}

#[test]
fn copy_in_out_bounds() {
    let b = Buffer::new(16);
    b.copy_in(8, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let mut out = [0u8; 8];
    b.copy_out(8, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(b.copy_in(9, &[0; 8]), Err(MemError::OutOfRange));
    assert_eq!(b.copy_out(usize::MAX, &mut out), Err(MemError::OutOfRange));
    b.copy_in(16, &[]).unwrap();
    assert_eq!(b.copy_in(17, &[]), Err(MemError::OutOfRange));
    b.write()[0] = 9;
    assert_eq!(b.read()[0], 9);
}

/// IBT-X-12: FetchAdd adds unsigned with the carry discarded and returns the old value;
/// CmpSwap writes only on a match and always returns the old value; 8-byte alignment.
#[test]
fn ibt_x_12_buffer_atomics() {
    let b = Buffer::new(32);
    b.copy_in(8, &u64::MAX.to_ne_bytes()).unwrap();
    assert_eq!(b.fetch_add(8, 2), Ok(u64::MAX));
    assert_eq!(b.fetch_add(8, 0), Ok(1));
    assert_eq!(b.compare_swap(8, 7, 99), Ok(1));
    assert_eq!(
        b.fetch_add(8, 0),
        Ok(1),
        "compare miss leaves memory unchanged"
    );
    assert_eq!(b.compare_swap(8, 1, 99), Ok(1));
    assert_eq!(b.fetch_add(8, 0), Ok(99));
    assert_eq!(b.fetch_add(4, 1), Err(MemError::Misaligned));
    assert_eq!(b.compare_swap(12, 0, 1), Err(MemError::Misaligned));
    assert_eq!(b.fetch_add(32, 1), Err(MemError::OutOfRange));
    assert_eq!(b.fetch_add(24, 1), Ok(0));
}

#[test]
fn adopted_vectors_come_back_without_a_copy() {
    let data = vec![9u8; 10_000];
    let at = data.as_ptr();
    let b = Buffer::adopt(data);
    b.copy_in(100, &[1, 2, 3]).unwrap();
    let shared = b.clone();
    let b = Buffer::into_vec(b).expect_err("still shared");
    drop(shared);
    let v = Buffer::into_vec(b).unwrap();
    assert_eq!(v.as_ptr(), at, "the same block");
    assert_eq!(v.len(), 10_000);
    assert_eq!(&v[99..104], &[9, 1, 2, 3, 9]);
    // An aligned buffer comes back as its contents.
    let z = Buffer::from_vec(vec![5u8; 3000]);
    assert_eq!(Buffer::into_vec(z).unwrap(), vec![5u8; 3000]);
}

/// A large buffer is an anonymous mapping of its own (dropping it hands the memory back to the
/// kernel) and behaves as any other buffer.
#[test]
fn large_buffers_are_mapped_from_the_kernel() {
    for len in [MAP_MIN, (1 << 20) + 5] {
        let b = Buffer::new(len);
        let at = b.read().as_ptr() as usize;
        assert_eq!(at % PAGE_SIZE, 0);
        assert!(b.is_mapped(), "{len} octets");
        assert!(b.read().iter().all(|&x| x == 0));
        b.copy_in(len - 3, &[1, 2, 3]).unwrap();
        assert_eq!(b.fetch_add(8, 5), Ok(0));
        let v = Buffer::into_vec(b).unwrap();
        assert_eq!(v.len(), len);
        assert_eq!(&v[len - 3..], &[1, 2, 3]);
        assert_eq!(v[8], 5);
    }
    // A small one stays on the heap.
    assert!(!Buffer::new(MAP_MIN - 1).is_mapped());
    // A large unaligned vector is copied into a mapping.
    let data: Vec<u8> = (0..MAP_MIN + 7).map(|i| (i % 251) as u8).collect();
    let b = Buffer::from_vec(data.clone());
    assert!(b.is_mapped());
    assert_eq!(b.read().as_ptr() as usize % PAGE_SIZE, 0);
    assert_eq!(&b.read()[..], &data[..]);
}

/// A program's own memory, registered in place: placements land in it, reads come from it,
/// and none reaches it once the region is deregistered (the program may then free it).
#[test]
#[allow(unsafe_code)]
fn foreign_memory_is_placed_in_place_and_left_after_dereg() {
    use super::{IOVA, PD, QP, remote_rw};
    use crate::{Access, KeyTable};
    let mut mine = vec![0u8; 64];
    mine[40..44].copy_from_slice(b"ping");
    let ptr = std::ptr::NonNull::new(mine.as_mut_ptr()).unwrap();
    // SAFETY: `mine` outlives the buffer's use: the region is deregistered below, before
    // `mine` is read or dropped, and nothing else holds a reference to it meanwhile.
    let buf = unsafe { Buffer::foreign(ptr, mine.len()) };
    let t = KeyTable::new();
    let k = t.reg_mr(PD, buf.clone(), 0, 64, IOVA, remote_rw()).unwrap();
    let w = t
        .check_remote(k, PD, QP, Access::REMOTE_WRITE, IOVA + 8, 4)
        .unwrap();
    w.place(0, b"pong").unwrap();
    let r = t
        .check_remote(k, PD, QP, Access::REMOTE_READ, IOVA + 40, 4)
        .unwrap();
    let mut out = [0u8; 4];
    r.copy_out(0, &mut out).unwrap();
    assert_eq!(&out, b"ping");
    t.dereg_mr(k).unwrap();
    assert!(w.place(0, b"late").is_err());
    drop((w, r, t, buf));
    assert_eq!(&mine[8..12], b"pong");
    assert_eq!(&mine[..8], &[0; 8]);
}
