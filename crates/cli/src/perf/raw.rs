//! The raw server: the baselines' other end, raw TCP ([`super::tcp`]) and raw UDP
//! ([`super::udp`]). Each test is a TCP connection that starts with a raw test header.

use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};

use super::proto::{RAW_HEADER_LEN, RawTest, parse_raw_header};

/// Serves raw TCP and UDP tests on `listener` until a Bye arrives (with `once`) or forever.
pub fn serve(listener: TcpListener, once: bool) -> io::Result<()> {
    for s in listener.incoming() {
        let Ok(mut s) = s else { continue };
        match serve_conn(&mut s) {
            Ok(true) if once => return Ok(()),
            Ok(_) => {}
            Err(e) => eprintln!("softrdma perf: raw test: {e}"),
        }
    }
    Ok(())
}

/// One raw test; `true` for a Bye.
fn serve_conn(s: &mut TcpStream) -> io::Result<bool> {
    s.set_nodelay(true)?;
    let mut h = [0u8; RAW_HEADER_LEN];
    s.read_exact(&mut h)?;
    let Some((test, size)) = parse_raw_header(&h) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a softrdma perf header",
        ));
    };
    match test {
        RawTest::Bye => return Ok(true),
        RawTest::TcpBw | RawTest::TcpLat => {
            super::tcp::serve_test(s, test == RawTest::TcpBw, size)?
        }
        RawTest::UdpBw | RawTest::UdpLat | RawTest::UdpGsoBw => super::udp::serve_conn(s, test)?,
    }
    Ok(false)
}
