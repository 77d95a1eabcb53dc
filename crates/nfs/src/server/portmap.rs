//! portmap v2 (RFC 1833 §3): where a client looks up the MOUNT and NFS ports before it
//! mounts. A server registers with the host's rpcbind when one runs
//! ([`register_with_rpcbind`]) and otherwise answers itself ([`PortMap`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use softrdma_rpc::tcp::TcpTransport;
use softrdma_rpc::{CallContext, Client, Payload, ProcError, Registry};
use softrdma_wire::xdr::XdrReader;

use crate::proto::{PMAP_PROGRAM, PMAP_V2, Xdr};

/// `IPPROTO_TCP` and `IPPROTO_UDP` in a mapping.
pub const TCP: u32 = 6;
/// `IPPROTO_UDP`.
pub const UDP: u32 = 17;

/// One `mapping` (RFC 1833 §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub prog: u32,
    pub vers: u32,
    /// [`TCP`] or [`UDP`].
    pub prot: u32,
    pub port: u32,
}

impl Mapping {
    fn encode(&self, x: &mut Xdr) {
        x.u32(self.prog)
            .u32(self.vers)
            .u32(self.prot)
            .u32(self.port);
    }

    fn decode(r: &mut XdrReader<'_>) -> Result<Mapping, ProcError> {
        let mut f = || r.read_u32().map_err(|_| ProcError::GarbageArgs);
        Ok(Mapping {
            prog: f()?,
            vers: f()?,
            prot: f()?,
            port: f()?,
        })
    }
}

/// A portmapper's table: SET and UNSET from this host only, GETPORT and DUMP for anyone.
#[derive(Debug, Default)]
pub struct PortMap {
    table: Mutex<Vec<Mapping>>,
}

/// Mappings a portmapper keeps at most (SET from the local host only, but still bounded).
const MAX_MAPPINGS: usize = 1024;

impl PortMap {
    /// A portmapper knowing `mappings` (and itself on port 111).
    pub fn new(mappings: &[Mapping]) -> Arc<PortMap> {
        let mut table = vec![
            Mapping {
                prog: PMAP_PROGRAM,
                vers: PMAP_V2,
                prot: TCP,
                port: 111,
            },
            Mapping {
                prog: PMAP_PROGRAM,
                vers: PMAP_V2,
                prot: UDP,
                port: 111,
            },
        ];
        table.extend_from_slice(mappings);
        Arc::new(PortMap {
            table: Mutex::new(table),
        })
    }

    /// Registers portmap v2 with `reg` (other versions get PROG_MISMATCH 2–2, on which
    /// rpcbind clients fall back to v2).
    pub fn register(self: &Arc<Self>, reg: &mut Registry) {
        let me = self.clone();
        reg.register(
            PMAP_PROGRAM,
            PMAP_V2,
            move |ctx: &CallContext<'_>, a: &[u8]| me.call(ctx, a),
        );
    }

    /// The port of `prog`/`vers` over `prot`, 0 if unknown (GETPORT).
    pub fn getport(&self, prog: u32, vers: u32, prot: u32) -> u32 {
        self.table
            .lock()
            .iter()
            .find(|m| m.prog == prog && m.vers == vers && m.prot == prot)
            .map_or(0, |m| m.port)
    }

    fn call(&self, ctx: &CallContext<'_>, args: &[u8]) -> Result<Payload, ProcError> {
        let mut r = XdrReader::new(args);
        let mut x = Xdr::new();
        let local = ctx.peer.is_some_and(|p| p.ip().is_loopback());
        match ctx.header.proc {
            0 => {}
            // SET: a new mapping, refused if the program/version/protocol has one.
            1 => {
                let m = Mapping::decode(&mut r)?;
                let mut t = self.table.lock();
                let taken = t
                    .iter()
                    .any(|o| o.prog == m.prog && o.vers == m.vers && o.prot == m.prot);
                let ok = local && !taken && t.len() < MAX_MAPPINGS;
                if ok {
                    t.push(m);
                }
                x.bool(ok);
            }
            // UNSET: every protocol of prog/vers.
            2 => {
                let m = Mapping::decode(&mut r)?;
                let mut t = self.table.lock();
                let before = t.len();
                if local {
                    t.retain(|o| !(o.prog == m.prog && o.vers == m.vers));
                }
                x.bool(t.len() != before);
            }
            3 => {
                let m = Mapping::decode(&mut r)?;
                x.u32(self.getport(m.prog, m.vers, m.prot));
            }
            4 => {
                for m in self.table.lock().iter() {
                    x.bool(true);
                    m.encode(&mut x);
                }
                x.bool(false);
            }
            _ => return Err(ProcError::ProcUnavail),
        }
        Ok(Payload::from(x.into_vec()))
    }
}

/// A TCP connection to `at` from a reserved port when we may bind one: rpcbind takes SET
/// and UNSET only from privileged ports (as `pmap_set` sends them); otherwise any port.
fn connect_reserved(at: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    for port in (600..1024).rev() {
        let s = Socket::new(Domain::for_address(at), Type::STREAM, None)?;
        let local = SocketAddr::new(
            match at {
                SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
            },
            port,
        );
        match s.bind(&local.into()) {
            Ok(()) => {
                s.connect_timeout(&at.into(), Duration::from_secs(2))?;
                return Ok(s.into());
            }
            // Not root: no reserved port for us.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => break,
            Err(_) => continue,
        }
    }
    TcpStream::connect_timeout(&at, Duration::from_secs(2))
}

/// Tells the rpcbind at `at` about `mappings` (portmap v2 SET over TCP, each first UNSET);
/// `Ok(false)` when nothing listens there.
pub fn register_with_rpcbind(at: SocketAddr, mappings: &[Mapping]) -> io::Result<bool> {
    let s = match connect_reserved(at) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(false),
        Err(e) => return Err(e),
    };
    let c = Client::new(Arc::new(TcpTransport::from_stream(s, 1 << 16)?), 1);
    let call = |proc, m: &Mapping| {
        let mut x = Xdr::new();
        m.encode(&mut x);
        c.call(PMAP_PROGRAM, PMAP_V2, proc, &x.0)
            .map(|r| XdrReader::new(&r.results).read_bool().unwrap_or(false))
            .map_err(|e| io::Error::other(e.to_string()))
    };
    // UNSET drops every protocol of a program version: all of them first, then the SETs.
    for m in mappings {
        call(2, m)?;
    }
    for m in mappings {
        if !call(1, m)? {
            return Err(io::Error::other(format!(
                "rpcbind at {at} refused the mapping of program {} version {}",
                m.prog, m.vers
            )));
        }
    }
    Ok(true)
}
