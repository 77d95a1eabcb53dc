//! Which port an NFS client connects to.

use std::cell::Cell;

use softrdma_nfs::{Error, NfsConfig, Proto};
use softrdma_rpc::rdma::NFS_RDMA_PORT;

/// RPCRDMA-71 (RFC 8166 §5, §9): NFS/RDMA is at port 20049, the port an `nfs://` URL without
/// one reaches over RDMA, with no rpcbind lookup; over TCP it is what rpcbind says, or 2049.
/// A port in the URL (`NfsConfig::port`) wins on both.
#[test]
fn rpcrdma_71_nfs_rdma_uses_port_20049() {
    assert_eq!(NFS_RDMA_PORT, 20049);
    let asked = Cell::new(0);
    let rpcbind = |answer: u16| {
        let asked = &asked;
        move || -> Result<u16, Error> {
            asked.set(asked.get() + 1);
            Ok(answer)
        }
    };
    let mut rdma = NfsConfig::new(Proto::Rdma, None);
    assert_eq!(rdma.port, None);
    assert_eq!(rdma.nfs_port(rpcbind(2050)).unwrap(), 20049);
    assert_eq!(asked.get(), 0, "rpcbind asked for RDMA");
    let mut tcp = NfsConfig::new(Proto::Tcp, None);
    assert_eq!(tcp.nfs_port(rpcbind(0)).unwrap(), 2049);
    assert_eq!(tcp.nfs_port(rpcbind(2050)).unwrap(), 2050);
    assert_eq!(asked.get(), 2);
    rdma.port = Some(20050);
    tcp.port = Some(20051);
    assert_eq!(rdma.nfs_port(rpcbind(1)).unwrap(), 20050);
    assert_eq!(tcp.nfs_port(rpcbind(1)).unwrap(), 20051);
    assert_eq!(asked.get(), 2, "rpcbind asked though the port was given");
}
