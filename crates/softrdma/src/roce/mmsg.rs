//! `recvmmsg(2)` into a thread's receive buffers with headers whose in-out lengths are set
//! again before every call. nix's `MultiHeaders` leaves each header's control and address
//! lengths as the last receive wrote them (nix-rust/nix#2813): a datagram without a GRO
//! control message zeroes its slot's control room, so reusing them loses the segment size
//! of the next run, and making them anew costs three allocations per receive.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

use nix::libc;

use super::RECV_BATCH;

/// Control room of one datagram: a `UDP_GRO` message (an `int`), 8-octet aligned.
type Control = [u64; 4];

/// The sender and control buffers of a batch of receives.
pub(super) struct RecvHeaders {
    names: Vec<libc::sockaddr_storage>,
    control: Option<Vec<Control>>,
}

/// What one receive got: octets, sender, GRO segment size (0: one datagram).
pub(super) type Got = (usize, Option<SocketAddr>, usize);

impl RecvHeaders {
    /// Headers for up to `n` datagrams a call; `gro`: with room for the segment size.
    pub(super) fn new(n: usize, gro: bool) -> RecvHeaders {
        let n = n.min(RECV_BATCH);
        RecvHeaders {
            // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
            names: vec![unsafe { zeroed() }; n],
            control: gro.then(|| vec![[0; 4]; n]),
        }
    }

    /// Receives without blocking into `bufs` (as many as there are headers), appending
    /// one [`Got`] per datagram to `out`; the count.
    pub(super) fn recv(
        &mut self,
        fd: RawFd,
        bufs: &mut [Vec<u8>],
        out: &mut Vec<Got>,
    ) -> io::Result<usize> {
        let n = bufs.len().min(self.names.len());
        // SAFETY: iovec and mmsghdr are plain data; all zeroes (null pointers, zero
        // lengths) is a valid value, and only the first `n` are handed to the kernel.
        let mut iov: [libc::iovec; RECV_BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; RECV_BATCH] = unsafe { zeroed() };
        for i in 0..n {
            iov[i] = libc::iovec {
                iov_base: bufs[i].as_mut_ptr().cast(),
                iov_len: bufs[i].len(),
            };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&raw mut self.names[i]).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &raw mut iov[i];
            h.msg_iovlen = 1;
            if let Some(c) = &mut self.control {
                h.msg_control = c[i].as_mut_ptr().cast();
                h.msg_controllen = size_of::<Control>() as _;
            }
        }
        // SAFETY: `n` headers, each naming a live buffer of `bufs`, its own address slot
        // and control room, with their lengths; all outlive the call.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let r = r as usize;
        for (i, h) in hdrs.iter().enumerate().take(r) {
            let from = sender(&self.names[i], h.msg_hdr.msg_namelen);
            out.push((h.msg_len as usize, from, gro_segment(&h.msg_hdr)));
        }
        Ok(r)
    }
}

/// The address the kernel wrote (IPv4 or IPv6), if it wrote a whole one.
fn sender(s: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the kernel wrote a sockaddr_in here (family and length say so); the
            // storage is larger and aligned for any address.
            let a = unsafe { &*(&raw const *s).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, a sockaddr_in6.
            let a = unsafe { &*(&raw const *s).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The `UDP_GRO` segment size a receive's control messages carry (0: none, one datagram).
fn gro_segment(h: &libc::msghdr) -> usize {
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return 0;
    }
    // SAFETY: the kernel laid out `msg_controllen` octets of control messages in our
    // aligned room; the CMSG_* macros walk them within that length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP
                && (*c).cmsg_type == libc::UDP_GRO
                && (*c).cmsg_len as usize
                    >= libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize
            {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(size).unwrap_or(0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// Headers used again and again give every receive its sender and, with GRO, the
    /// segment size of each coalesced run, however the receives before it went (a single
    /// datagram, which has no segment size, used to leave its slot no control room).
    #[test]
    fn reused_headers_keep_their_room_for_senders_and_segment_sizes() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::UdpGroSegment, &true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let from = tx.local_addr().unwrap();
        let mut h = RecvHeaders::new(4, true);
        let mut bufs = vec![vec![0u8; 65536]; 4];
        let mut got = Vec::with_capacity(4);
        let fd = rx.as_raw_fd();
        let recv_all = |h: &mut RecvHeaders, bufs: &mut [Vec<u8>], got: &mut Vec<Got>| {
            got.clear();
            // The datagrams were sent before: the socket has them (loopback delivers
            // within the send call).
            while got.is_empty() {
                match h.recv(fd, bufs, got) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
        };
        for round in 0..3 {
            // One datagram alone: no segment size.
            tx.send_to(&[round; 100], to).unwrap();
            recv_all(&mut h, &mut bufs, &mut got);
            assert_eq!(got[0], (100, Some(from), 0), "round {round}");
            assert_eq!(bufs[0][..100], [round; 100]);
            // A GSO run of 3 × 1000: one receive, segment size 1000.
            let seg = nix::sys::socket::ControlMessage::UdpGsoSegments(&1000u16);
            let iov = [std::io::IoSlice::new(&[7; 3000])];
            let addr = nix::sys::socket::SockaddrIn::from(match to {
                SocketAddr::V4(a) => a,
                SocketAddr::V6(_) => unreachable!(),
            });
            nix::sys::socket::sendmsg(
                tx.as_raw_fd(),
                &iov,
                &[seg],
                nix::sys::socket::MsgFlags::empty(),
                Some(&addr),
            )
            .unwrap();
            recv_all(&mut h, &mut bufs, &mut got);
            assert_eq!(got[0], (3000, Some(from), 1000), "round {round}");
        }
    }
}
