//! RPC-over-RDMA (RFC 8166) over loopback, on both transports through the one verbs API:
//! every call and reply form, thresholds at ±1 octet, credits, and RDMA_ERROR.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use softrdma::{
    Access, ConnectParams, Context, Listener, Mr, QpCap, QpInitAttr, RecvWr, SendFlags, SendWr,
    WcStatus,
};
use softrdma_rpc::msg::decode_reply;
use softrdma_rpc::rdma::{RdmaConfig, RdmaServer, RdmaTransport};
use softrdma_rpc::*;
use softrdma_wire::rpcrdma::{
    Body, Chunks, ErrorBody, PrivateDataRepr, ReadList, ReadSegment, Repr, WriteList,
};

mod common;

use common::{T, both, contexts};
use softrdma_testkit::pattern;

fn call_msg(xid: u32, proc: u32, args: &[u8]) -> Vec<u8> {
    common::call_msg(PROG, xid, proc, args)
}

const PROG: u32 = 0x2000_0002;
const LONG: Duration = Duration::from_secs(60);

mod proc {
    pub const NULL: u32 = 0;
    /// Echoes its arguments.
    pub const ECHO: u32 = 1;
    /// Arguments: an opaque (DDP-eligible); results: its length and a checksum.
    pub const SUM: u32 = 2;
    /// Arguments: a length n and a seed; results: an opaque of n octets (DDP-eligible).
    pub const MAKE: u32 = 3;
    /// Parks until the gate opens, then NULL.
    pub const GATE: u32 = 4;
    /// Arguments: a length n; results: n octets inline (not DDP-eligible).
    pub const BIG: u32 = 5;
    /// MAKE's results with the opaque not marked: a server that ignores the binding.
    pub const MAKE_UNMARKED: u32 = 6;
    /// Arguments: lengths a and b; results: word 1, opaque of a, word 2, opaque of b (both
    /// DDP-eligible).
    pub const TWO: u32 = 7;
    /// Arguments: a length c; results: a union's arm without an eligible item (its
    /// discriminant 0), then an eligible opaque of c.
    pub const ARM: u32 = 8;
    /// Arguments: a length n; results: the word 7, an opaque of n octets the program keeps
    /// in memory of its own ([`Payload::with_shared`]), the word 9.
    pub const SHARED: u32 = 9;
}

/// What SHARED serves from: octets 3.. of this pattern.
const SHARED_LEN: usize = 300_000;

fn shared_data() -> Vec<u8> {
    pattern(SHARED_LEN, 9)
}

fn sum(d: &[u8]) -> u64 {
    d.iter().enumerate().fold(0u64, |a, (i, &b)| {
        a.wrapping_add((i as u64 + 1) * u64::from(b))
    })
}

fn opaque_at(args: &[u8], at: usize) -> &[u8] {
    let n = u32::from_be_bytes(args[at..at + 4].try_into().unwrap()) as usize;
    &args[at + 4..at + 4 + n]
}

#[derive(Default)]
struct Gate {
    s: Mutex<(usize, usize, bool)>,
    cv: Condvar,
}

fn program(gate: Arc<Gate>, kept: Arc<softrdma::Buffer>) -> impl Program {
    move |ctx: &CallContext<'_>, args: &[u8]| -> Result<Payload, ProcError> {
        match ctx.header.proc {
            proc::SHARED => {
                let n = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
                let mut p = Payload::with_shared(vec![0, 0, 0, 7], kept.clone(), 3..3 + n);
                p.push_xdr(&[0, 0, 0, 9]);
                Ok(p)
            }
            proc::NULL => Ok(Payload::default()),
            proc::ECHO => Ok(args.to_vec().into()),
            proc::SUM => {
                let d = opaque_at(args, 4);
                let mut r = (d.len() as u64).to_be_bytes().to_vec();
                r.extend_from_slice(&sum(d).to_be_bytes());
                // The word before the opaque comes back too: the stream around the chunk
                // was put back in place.
                r.extend_from_slice(&args[..4]);
                Ok(r.into())
            }
            proc::MAKE => {
                let n = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
                Ok(Payload::with_opaque(
                    vec![0, 0, 0, 7],
                    &pattern(n, u64::from(args[7])),
                ))
            }
            proc::GATE => {
                let mut s = gate.s.lock();
                s.0 += 1;
                s.1 = s.1.max(s.0);
                gate.cv.notify_all();
                while !s.2 {
                    gate.cv.wait(&mut s);
                }
                s.0 -= 1;
                Ok(Payload::default())
            }
            proc::MAKE_UNMARKED => {
                let n = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
                Ok(
                    Payload::with_opaque(vec![0, 0, 0, 7], &pattern(n, u64::from(args[7])))
                        .xdr
                        .into(),
                )
            }
            proc::TWO => {
                let a = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
                let b = u32::from_be_bytes(args[4..8].try_into().unwrap()) as usize;
                let mut p = Payload::default();
                p.push_xdr(&1u32.to_be_bytes())
                    .push_opaque(&pattern(a, 1))
                    .push_xdr(&2u32.to_be_bytes())
                    .push_opaque(&pattern(b, 2));
                Ok(p)
            }
            proc::ARM => {
                let c = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
                Ok(Payload::with_opaque(vec![0; 4], &pattern(c, 3)))
            }
            proc::BIG => {
                let n = u32::from_be_bytes(args[..4].try_into().unwrap()) as usize;
                Ok(pattern(n, 3).into())
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

struct Rig {
    t: T,
    _server: Arc<Server>,
    rdma: RdmaServer,
    client_ctx: Context,
    _server_ctx: Context,
    gate: Arc<Gate>,
    /// SHARED's memory.
    kept: Arc<softrdma::Buffer>,
}

fn rig(t: T, scfg: RdmaConfig) -> Rig {
    rig_with(t, scfg, true)
}

fn rig_with(t: T, scfg: RdmaConfig, bind: bool) -> Rig {
    let (sctx, cctx) = contexts(t);
    let gate = Arc::new(Gate::default());
    let kept = softrdma::Buffer::adopt(shared_data());
    let mut reg = Registry::new();
    reg.register(PROG, 1, program(gate.clone(), kept.clone()));
    // The binding: SUM's opaque (after one word and its length word) is the only
    // DDP-eligible argument.
    if bind {
        reg.bind_arguments(PROG, 1, |p, _| (p == proc::SUM).then_some(8));
    }
    let server = Arc::new(Server::new(
        reg,
        ServerConfig {
            threads: 16,
            ..ServerConfig::default()
        },
    ));
    let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
    let rdma = server.serve_rdma(&sctx, l, scfg).unwrap();
    Rig {
        t,
        _server: server,
        rdma,
        client_ctx: cctx,
        _server_ctx: sctx,
        gate,
        kept,
    }
}

impl Rig {
    fn client(&self, cfg: RdmaConfig) -> (Client, Arc<RdmaTransport>) {
        let tr = Arc::new(
            RdmaTransport::connect(&self.client_ctx, self.rdma.local_addr(), cfg).unwrap(),
        );
        (Client::new(tr.clone(), 128), tr)
    }
}

/// The smallest call that leaves the connection's call threshold (4096 by default) with an
/// ECHO of `n` octets of arguments: header 28 + RPC call header 40 + n.
const CALL_OVERHEAD: usize = 28 + 40;

/// RPCRDMA-43, RPCRDMA-31, RPCRDMA-33: a call that fits the threshold goes in the Send; one
/// octet more becomes a Long Call (nothing DDP-eligible), echoed back intact either way.
#[test]
fn rpcrdma_31_43_call_threshold_edges() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        assert_eq!(tr.thresholds().call, 4096);
        // NULL first: the grant arrives (RPCRDMA-08).
        c.call(PROG, 1, proc::NULL, &[]).unwrap();
        let fit = 4096 - CALL_OVERHEAD;
        for (n, long) in [
            (fit - 4, false),
            (fit, false),
            (fit + 4, true),
            (20000, true),
        ] {
            let before = tr.stats();
            let args = pattern(n, u64::from(n as u8));
            // The echo of a call that fits comes back inline too (the reply header is
            // shorter): no Reply chunk, which would lengthen the call's header.
            let space = ReplySpace {
                max: if long { n + 64 } else { 1024 },
                ddp: None,
            };
            let got = c
                .call_with(PROG, 1, proc::ECHO, &args.clone().into(), space)
                .unwrap();
            assert_eq!(got.results, args, "{t:?} {n}");
            let after = tr.stats();
            assert_eq!(
                (
                    after.calls_long - before.calls_long,
                    after.calls_short - before.calls_short
                ),
                if long { (1, 0) } else { (0, 1) },
                "{t:?} {n}"
            );
        }
    });
}

/// RPCRDMA-22, RPCRDMA-24, RPCRDMA-19: the DDP-eligible argument moves in a Read chunk;
/// the responder puts it back at its Position (the words around it arrive unchanged).
#[test]
fn rpcrdma_19_22_read_chunks() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        for n in [1usize, 4095, 4096, 4097, 100_001, 1 << 20] {
            let data = pattern(n, 9);
            let args = Payload::with_opaque(0xC0FF_EE00u32.to_be_bytes().to_vec(), &data);
            let before = tr.stats();
            let got = c
                .call_with(PROG, 1, proc::SUM, &args, ReplySpace::default())
                .unwrap();
            assert_eq!(&got.results[..8], &(n as u64).to_be_bytes(), "{t:?} {n}");
            assert_eq!(&got.results[8..16], &sum(&data).to_be_bytes());
            assert_eq!(&got.results[16..20], &0xC0FF_EE00u32.to_be_bytes());
            let chunked = tr.stats().calls_chunked - before.calls_chunked;
            assert_eq!(
                chunked,
                u64::from(n + CALL_OVERHEAD + 12 > 4096),
                "{t:?} {n}"
            );
        }
    });
}

/// RPCRDMA-73, RPCRDMA-12: a call that reduced an argument its program's binding does not
/// name (another item of SUM, or anything of ECHO) is not executed: ERR_CHUNK, which the
/// client reports as the transport's refusal; the eligible one goes through.
#[test]
fn rpcrdma_73_a_chunk_where_the_binding_has_none_gets_err_chunk() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        let data = pattern(9000, 4);
        let good = Payload::with_opaque(7u32.to_be_bytes().to_vec(), &data);
        let ok = c
            .call_with(PROG, 1, proc::SUM, &good, ReplySpace::default())
            .unwrap();
        assert_eq!(&ok.results[8..16], &sum(&data).to_be_bytes(), "{t:?}");
        // One word more before the opaque: the chunk's Position is 12, not 8.
        let shifted = Payload::with_opaque(vec![0; 8], &data);
        let echo = Payload::with_opaque(Vec::new(), &data);
        for (p, args) in [(proc::SUM, &shifted), (proc::ECHO, &echo)] {
            let before = tr.stats();
            let e = c.call_with(PROG, 1, p, args, ReplySpace::default());
            assert!(matches!(e, Err(RpcError::Transport(_))), "{t:?} {p}: {e:?}");
            assert_eq!(tr.stats().errors, before.errors + 1, "{t:?}");
            assert_eq!(tr.stats().calls_chunked, before.calls_chunked + 1, "{t:?}");
        }
        // The connection goes on.
        assert!(c.call(PROG, 1, proc::NULL, &[]).is_ok());
    });
}

/// RPCRDMA-29: with the program's result binding the client puts the Write chunk's data
/// back where it came from: the reassembled results equal the server's unreduced ones.
/// RPCRDMA-75: a reply that leaves the offered Write chunk unused and carries the eligible
/// result inline fails for good.
#[test]
fn rpcrdma_29_75_result_binding_reassembles_and_polices() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, _tr) = r.client(RdmaConfig::default());
        c.bind_results(PROG, 1, |p, _| {
            (p == proc::MAKE || p == proc::MAKE_UNMARKED).then_some(8)
        });
        for n in [1usize, 3, 4, 4097, 65_537] {
            let mut args = (n as u32).to_be_bytes().to_vec();
            args.extend_from_slice(&[0, 0, 0, 5]);
            let space = ReplySpace {
                max: 256,
                ddp: Some(n),
            };
            let got = c
                .call_with(PROG, 1, proc::MAKE, &Payload::from(args.clone()), space)
                .unwrap();
            assert!(got.bulk.is_some(), "{t:?} {n}");
            assert_eq!(got.bulk_at, Some(8));
            let whole = Payload::with_opaque(vec![0, 0, 0, 7], &pattern(n, 5)).xdr;
            assert_eq!(got.unreduced().unwrap(), whole, "{t:?} {n}");
            let e = c.call_with(PROG, 1, proc::MAKE_UNMARKED, &Payload::from(args), space);
            assert!(matches!(e, Err(RpcError::Transport(_))), "{t:?} {n}: {e:?}");
        }
        // Without the binding's complaint (no chunk offered) the same reply is fine.
        let mut args = 5u32.to_be_bytes().to_vec();
        args.extend_from_slice(&[0, 0, 0, 5]);
        let ok = c
            .call_with(
                PROG,
                1,
                proc::MAKE_UNMARKED,
                &Payload::from(args),
                ReplySpace::default(),
            )
            .unwrap();
        assert_eq!(ok.unreduced().unwrap(), ok.results);
    });
}

/// RPCRDMA-85: under RPCSEC_GSS with integrity or privacy the client reduces nothing: the
/// call that would have had a Read chunk goes as a Long Call (the server here refuses the
/// credential, which it answers all the same); with the authentication-only service the
/// argument is reduced as usual.
#[test]
fn rpcrdma_85_gss_integrity_disables_reduction() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        let data = pattern(9000, 1);
        let args = Payload::with_opaque(7u32.to_be_bytes().to_vec(), &data);
        for (service, chunked, long) in [(2u32, 0u64, 1u64), (3, 0, 1), (1, 1, 0)] {
            let mut body = Vec::new();
            for w in [1u32, 0, 1, service, 4] {
                body.extend_from_slice(&w.to_be_bytes());
            }
            body.extend_from_slice(b"hndl");
            c.set_cred(Auth::Other { flavor: 6, body });
            let before = tr.stats();
            let e = c.call_with(PROG, 1, proc::SUM, &args, ReplySpace::default());
            assert!(
                matches!(e, Err(RpcError::Status(ReplyStatus::AuthError(_)))),
                "{t:?} {service}: {e:?}"
            );
            let after = tr.stats();
            assert_eq!(
                after.calls_chunked - before.calls_chunked,
                chunked,
                "{t:?} {service}"
            );
            assert_eq!(
                after.calls_long - before.calls_long,
                long,
                "{t:?} {service}"
            );
        }
    });
}

/// RPCRDMA-45, RPCRDMA-28, RPCRDMA-30: a DDP-eligible result goes through the Write chunk
/// (its data out of the inline results, its length word left); RPCRDMA-51/-49: a result
/// that does not come through a chunk stays inline.
#[test]
fn rpcrdma_28_45_write_chunks() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        for n in [0usize, 1, 1000, 4097, 300_000] {
            let mut args = (n as u32).to_be_bytes().to_vec();
            args.extend_from_slice(&[0, 0, 0, 5]);
            let space = ReplySpace {
                max: 1024,
                ddp: Some(1 << 20),
            };
            let before = tr.stats();
            let got = c
                .call_with(PROG, 1, proc::MAKE, &args.into(), space)
                .unwrap();
            // Results: the word 7, the length word; the data through the chunk.
            assert_eq!(
                &got.results[..8],
                &[0, 0, 0, 7, 0, 0, 0, 0][..4]
                    .iter()
                    .chain(&(n as u32).to_be_bytes())
                    .copied()
                    .collect::<Vec<u8>>()[..]
            );
            let after = tr.stats();
            if n == 0 {
                // Nothing written: the chunk comes back unused and the (empty) data is inline.
                assert_eq!(got.bulk, None);
                assert_eq!(got.results.len(), 8);
            } else {
                assert_eq!(got.bulk.as_deref(), Some(&pattern(n, 5)[..]), "{t:?} {n}");
                assert_eq!(got.results.len(), 8, "data and padding left the stream");
                assert_eq!(after.replies_write_chunk - before.replies_write_chunk, 1);
            }
        }
        // Without a Write chunk the same result comes inline, or through the Reply chunk.
        for n in [100usize, 200_000] {
            let mut args = (n as u32).to_be_bytes().to_vec();
            args.extend_from_slice(&[0, 0, 0, 5]);
            let got = c
                .call_with(
                    PROG,
                    1,
                    proc::MAKE,
                    &args.into(),
                    ReplySpace {
                        max: n + 64,
                        ddp: None,
                    },
                )
                .unwrap();
            assert_eq!(got.bulk, None);
            assert_eq!(&got.results[8..8 + n], &pattern(n, 5)[..], "{t:?} {n}");
        }
    });
}

/// A result the program keeps in memory of its own goes through the Write chunk from where
/// it is, or back inline (or through the Reply chunk) with its padding when no chunk takes
/// it; the program's memory is untouched either way (not given to the server's pool).
#[test]
fn shared_results_through_write_chunks_and_inline() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        let whole = shared_data();
        for n in [0usize, 1, 5, 1000, 4095, 4097, SHARED_LEN - 3] {
            let data = &whole[3..3 + n];
            let len = (n as u32).to_be_bytes();
            for ddp in [Some(SHARED_LEN), None] {
                let space = ReplySpace {
                    max: if ddp.is_some() { 1024 } else { n + 64 },
                    ddp,
                };
                let before = tr.stats();
                let got = c
                    .call_with(PROG, 1, proc::SHARED, &len.to_vec().into(), space)
                    .unwrap();
                let through_chunk = ddp.is_some() && n > 0;
                let mut want = vec![0, 0, 0, 7];
                want.extend_from_slice(&len);
                if through_chunk {
                    assert_eq!(got.bulk.as_deref(), Some(data), "{t:?} {n}");
                    let after = tr.stats();
                    assert_eq!(after.replies_write_chunk - before.replies_write_chunk, 1);
                } else {
                    assert_eq!(got.bulk, None, "{t:?} {n}");
                    want.extend_from_slice(data);
                    want.resize(want.len().next_multiple_of(4), 0);
                }
                want.extend_from_slice(&[0, 0, 0, 9]);
                assert_eq!(got.results, want, "{t:?} {n} {ddp:?}");
            }
        }
        assert_eq!(
            r.kept.read()[..],
            whole[..],
            "the program's memory is as it was"
        );
    });
}

/// RPCRDMA-34, RPCRDMA-54, RPCRDMA-52: a reply over the reply threshold comes through the
/// Reply chunk (RDMA_NOMSG); RPCRDMA-53: at the threshold it comes inline although a Reply
/// chunk was offered; with no Reply chunk offered for a reply that does not fit, the server
/// answers ERR_CHUNK and RPCRDMA-60: the call fails with a permanent error.
#[test]
fn rpcrdma_34_52_54_reply_chunk_and_reply_threshold() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, tr) = r.client(RdmaConfig::default());
        // Reply: RDMA header 28, RPC reply header 24, then n octets.
        let fit = 4096 - 28 - 24;
        for (n, long) in [(fit, false), (fit + 4, true), (1 << 20, true)] {
            let before = tr.stats();
            let got = c
                .call_with(
                    PROG,
                    1,
                    proc::BIG,
                    &(n as u32).to_be_bytes().to_vec().into(),
                    ReplySpace {
                        max: n + 64,
                        ddp: None,
                    },
                )
                .unwrap();
            assert_eq!(got.results, pattern(n, 3), "{t:?} {n}");
            let after = tr.stats();
            assert_eq!(
                after.replies_reply_chunk - before.replies_reply_chunk,
                u64::from(long),
                "{t:?} {n}"
            );
        }
        // The client said the reply stays small: no Reply chunk; the server cannot answer.
        let e = c.call_with(
            PROG,
            1,
            proc::BIG,
            &5000u32.to_be_bytes().to_vec().into(),
            ReplySpace {
                max: 100,
                ddp: None,
            },
        );
        assert!(
            matches!(e, Err(RpcError::Transport(ref w)) if w == "ERR_CHUNK"),
            "{e:?}"
        );
        // The connection goes on.
        c.call(PROG, 1, proc::NULL, &[]).unwrap();
        assert_eq!(tr.stats().errors, 1);
    });
}

/// RPCRDMA-02, -04, -08: never more calls in flight than granted; the smaller of what the
/// client asks and the server grants.
#[test]
fn rpcrdma_02_04_credits_bound_the_calls_in_flight() {
    both(|t| {
        let r = rig(
            t,
            RdmaConfig {
                credits: 4,
                ..RdmaConfig::default()
            },
        );
        let (c, tr) = r.client(RdmaConfig {
            credits: 8,
            ..RdmaConfig::default()
        });
        c.call(PROG, 1, proc::NULL, &[]).unwrap();
        assert_eq!(tr.granted(), 4);
        // Twelve callers; the ones past the credit wait for it inside `start`.
        let callers: Vec<_> = (0..12)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.call(PROG, 1, proc::GATE, &[]).map(|_| ()))
            })
            .collect();
        {
            // Four calls reach the handler; the rest wait for credits at the client.
            let mut s = r.gate.s.lock();
            while s.0 < 4 {
                assert!(!r.gate.cv.wait_for(&mut s, LONG).timed_out());
            }
            s.2 = true;
            r.gate.cv.notify_all();
        }
        for h in callers {
            h.join().unwrap().unwrap();
        }
        assert_eq!(r.gate.s.lock().1, 4, "{t:?}");
        assert_eq!(tr.stats().max_in_flight, 4);
    });
}

/// RPCRDMA-05: with one credit each way, every call's reply and the next call find a posted
/// Receive (each consumed Receive buffer is posted again before its message is looked at).
#[test]
fn rpcrdma_05_one_credit_many_calls_in_a_row() {
    both(|t| {
        let one = RdmaConfig {
            credits: 1,
            ..RdmaConfig::default()
        };
        let r = rig(t, one);
        let (c, tr) = r.client(one);
        for i in 0..40usize {
            c.call(PROG, 1, proc::NULL, &[]).unwrap();
            let data = pattern(100 + i, u64::from(i as u8));
            let args = Payload::with_opaque(vec![0, 0, 0, 1], &data);
            let got = c
                .call_with(PROG, 1, proc::SUM, &args, ReplySpace::default())
                .unwrap();
            assert_eq!(&got.results[8..16], &sum(&data).to_be_bytes(), "{t:?} {i}");
        }
        assert_eq!(tr.granted(), 1);
        assert_eq!(tr.stats().errors, 0, "{t:?}");
    });
}

/// Many calls in flight from several threads, every form mixed, every result checked.
#[test]
fn mixed_calls_in_flight() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let (c, _tr) = r.client(RdmaConfig::default());
        let threads: Vec<_> = (0..4u8)
            .map(|k| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..40usize {
                        let n = (i * 7919 + usize::from(k) * 104_729) % 70_000;
                        let data = pattern(n, u64::from(k));
                        let args = Payload::with_opaque(vec![0, 0, 0, k], &data);
                        let got = c
                            .call_with(PROG, 1, proc::SUM, &args, ReplySpace::default())
                            .unwrap();
                        assert_eq!(&got.results[8..16], &sum(&data).to_be_bytes());
                        let mut a = (n as u32).to_be_bytes().to_vec();
                        a.extend_from_slice(&[0, 0, 0, k]);
                        let got = c
                            .call_with(
                                PROG,
                                1,
                                proc::MAKE,
                                &a.into(),
                                ReplySpace {
                                    max: 256,
                                    ddp: Some(70_000),
                                },
                            )
                            .unwrap();
                        let bulk = got.bulk.unwrap_or_default();
                        assert_eq!(bulk, pattern(n, u64::from(k)));
                    }
                })
            })
            .collect();
        for h in threads {
            h.join().unwrap();
        }
        let _ = r.t;
    });
}

/// A raw requester: one QP with Receives, for hand-made RPC-over-RDMA messages.
struct Raw {
    qp: softrdma::Qp,
    cq: softrdma::Cq,
    mr: Mr,
}

impl Raw {
    fn connect(ctx: &Context, addr: SocketAddr) -> Raw {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(64, None).unwrap();
        let mut attr = QpInitAttr::new(&cq, &cq);
        attr.cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(attr).unwrap();
        let mr = pd
            .alloc_mr(
                64 * 1024,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap();
        for i in 0..8 {
            qp.post_recv(RecvWr::new(i, vec![mr.sge(i as usize * 4096, 4096)]))
                .unwrap();
        }
        let mut pd8 = vec![0u8; 8];
        PrivateDataRepr::new(4096, 4096, false)
            .emit(&mut pd8)
            .unwrap();
        qp.connect(
            addr,
            ConnectParams {
                private_data: pd8,
                ..ConnectParams::default()
            },
        )
        .unwrap();
        Raw { qp, cq, mr }
    }

    fn send(&self, bytes: &[u8]) {
        self.mr.copy_in(40 * 1024, bytes).unwrap();
        self.qp
            .post_send(
                SendWr::send(100, vec![self.mr.sge(40 * 1024, bytes.len() as u32)])
                    .with_flags(SendFlags::SIGNALED),
            )
            .unwrap();
    }

    /// The next message received, or `None` within `wait`.
    fn recv(&self, wait: Duration) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            out.clear();
            if self.cq.wait(1, 1, wait, &mut out).is_err() {
                return None;
            }
            let wc = out[0];
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.wr_id < 8 {
                let mut b = vec![0u8; wc.byte_len as usize];
                self.mr.copy_out(wc.wr_id as usize * 4096, &mut b).unwrap();
                self.qp
                    .post_recv(RecvWr::new(
                        wc.wr_id,
                        vec![self.mr.sge(wc.wr_id as usize * 4096, 4096)],
                    ))
                    .unwrap();
                return Some(b);
            }
        }
    }
}

/// RPCRDMA-17, RPCRDMA-19: a call with two DDP-eligible arguments sends two Read chunks,
/// one per item at its own Position; the server (no binding) splices both back.
#[test]
fn rpcrdma_17_two_eligible_arguments_two_read_chunks() {
    both(|t| {
        let r = rig_with(t, RdmaConfig::default(), false);
        let (c, tr) = r.client(RdmaConfig::default());
        for (a, b) in [(5000usize, 3usize), (1, 9000), (4096, 4097)] {
            let mut args = Payload::default();
            args.push_xdr(&[0, 0, 0, 1])
                .push_opaque(&pattern(a, 1))
                .push_xdr(&[0, 0, 0, 2])
                .push_opaque(&pattern(b, 2));
            let before = tr.stats();
            let got = c
                .call_with(
                    PROG,
                    1,
                    proc::ECHO,
                    &args,
                    ReplySpace {
                        max: 32 * 1024,
                        ddp: None,
                    },
                )
                .unwrap();
            assert_eq!(got.results, args.xdr, "{t:?} {a} {b}");
            assert_eq!(tr.stats().calls_chunked, before.calls_chunked + 1, "{t:?}");
        }
    });
}

/// RFC 8797 remote invalidation, as Linux does it: both ends advertise it; a call whose
/// chunks share one handle (one Write chunk) gets its reply by Send With Invalidate of
/// that handle, a call with two handles (a Read and a Write chunk) a plain Send. The
/// client's chunk regions are remotely invalidatable; the call's data is intact either
/// way. A client that does not advertise it never gets one.
#[test]
fn remote_invalidation_of_the_one_chunk_handle() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        for ri in [true, false] {
            let cfg = RdmaConfig {
                remote_invalidate: ri,
                ..RdmaConfig::default()
            };
            let (c, tr) = r.client(cfg);
            assert!(
                tr.thresholds().remote_invalidate,
                "{t:?}: the server takes it"
            );
            let make = |n: u32| {
                let mut a = n.to_be_bytes().to_vec();
                a.extend_from_slice(&[0, 0, 0, 4]);
                Payload::from(a)
            };
            let space = ReplySpace {
                max: 256,
                ddp: Some(70_000),
            };
            let before = tr.stats();
            let got = c
                .call_with(PROG, 1, proc::MAKE, &make(70_000), space)
                .unwrap();
            assert_eq!(got.bulk.unwrap(), pattern(70_000, 4), "{t:?}");
            assert_eq!(
                tr.stats().remotely_invalidated - before.remotely_invalidated,
                u64::from(ri),
                "{t:?} {ri}"
            );
            // A Read chunk and a Write chunk: two handles, nothing invalidated remotely.
            let data = pattern(9000, 6);
            let args = Payload::with_opaque(7u32.to_be_bytes().to_vec(), &data);
            let before = tr.stats();
            let got = c
                .call_with(
                    PROG,
                    1,
                    proc::SUM,
                    &args,
                    ReplySpace {
                        max: 256,
                        ddp: Some(16),
                    },
                )
                .unwrap();
            assert_eq!(&got.results[8..16], &sum(&data).to_be_bytes(), "{t:?}");
            assert_eq!(tr.stats().calls_chunked - before.calls_chunked, 1);
            assert_eq!(tr.stats().remotely_invalidated, before.remotely_invalidated);
            // Calls go on after either.
            assert!(c.call(PROG, 1, proc::NULL, &[]).is_ok());
        }
    });
}

/// RPCRDMA-46: a requester offering two Write chunks gets two eligible results, the first
/// through the first chunk, the second through the second, their data gone from the inline
/// results (length words kept). RPCRDMA-47: a union arm without its eligible item leaves
/// the first chunk to the eligible result after it; the second comes back unused.
#[test]
fn rpcrdma_46_47_eligible_results_fill_the_write_chunks_in_order() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let raw = Raw::connect(&r.client_ctx, r.rdma.local_addr());
        let rkey = raw.mr.rkey().0;
        let at = |off: usize| raw.mr.addr(off);
        let seg = |off: usize| -> Vec<u32> {
            let a = at(off);
            vec![rkey, 4096, (a >> 32) as u32, a as u32]
        };
        // Read list: none; Write list: two chunks of one 4 KiB segment; no Reply chunk.
        let mut words = vec![0, 1, 1];
        words.extend(seg(48 * 1024));
        words.extend([1, 1]);
        words.extend(seg(56 * 1024));
        words.extend([0, 0]);
        let written = |m: &[u8]| -> (Vec<u32>, Vec<u8>) {
            let (h, hl) = Repr::parse(m).unwrap();
            let Body::Msg(c) = h.body else {
                panic!("{:?}", h.body)
            };
            let lens = c
                .write_list
                .iter()
                .map(|w| w.iter().map(|s| s.length).sum())
                .collect();
            let (rh, off) = decode_reply(&m[hl..]).unwrap();
            assert_eq!(rh.status, ReplyStatus::Success);
            (lens, m[hl + off..].to_vec())
        };
        let chunk = |off: usize, n: usize| {
            let mut b = vec![0u8; n];
            raw.mr.copy_out(off, &mut b).unwrap();
            b
        };
        for (a, b) in [(100usize, 7usize), (4096, 1), (0, 3)] {
            let mut m = header(20, 1, 0, &words);
            let mut args = (a as u32).to_be_bytes().to_vec();
            args.extend_from_slice(&(b as u32).to_be_bytes());
            m.extend_from_slice(&call_msg(20, proc::TWO, &args));
            raw.send(&m);
            let (lens, results) = written(&raw.recv(LONG).unwrap());
            assert_eq!(lens, vec![a as u32, b as u32], "{t:?}");
            assert_eq!(chunk(48 * 1024, a), pattern(a, 1), "{t:?}");
            assert_eq!(chunk(56 * 1024, b), pattern(b, 2), "{t:?}");
            let inline: Vec<u8> = [1, a as u32, 2, b as u32]
                .iter()
                .flat_map(|w| w.to_be_bytes())
                .collect();
            assert_eq!(results, inline, "{t:?}");
        }
        let mut m = header(21, 1, 0, &words);
        m.extend_from_slice(&call_msg(21, proc::ARM, &9u32.to_be_bytes()));
        raw.send(&m);
        let (lens, results) = written(&raw.recv(LONG).unwrap());
        assert_eq!(lens, vec![9, 0], "{t:?}");
        assert_eq!(chunk(48 * 1024, 9), pattern(9, 3), "{t:?}");
        assert_eq!(results, [0, 0, 0, 0, 0, 0, 0, 9], "{t:?}");
    });
}

fn header(xid: u32, vers: u32, proc: u32, rest: &[u32]) -> Vec<u8> {
    [xid, vers, 8, proc]
        .iter()
        .chain(rest)
        .flat_map(|w| w.to_be_bytes())
        .collect()
}

/// RPCRDMA-56, -59, -62, -63, -69, -70, -42: every header error gets the answer RFC 8166
/// §4.5 prescribes, and the connection keeps serving.
#[test]
fn rpcrdma_56_59_62_63_69_70_header_errors() {
    both(|t| {
        let r = rig(t, RdmaConfig::default());
        let raw = Raw::connect(&r.client_ctx, r.rdma.local_addr());
        let quiet = Duration::from_millis(300);
        let expect_err = |xid: u32, vers: u32, body: ErrorBody| {
            let m = raw.recv(LONG).expect("an RDMA_ERROR");
            let (h, _) = Repr::parse(&m).unwrap();
            assert_eq!((h.rdma_xid, h.rdma_vers), (xid, vers), "{t:?}");
            assert_eq!(h.body, Body::Error(body), "{t:?}");
            assert!(h.rdma_credit >= 1);
        };
        // Too short (RPCRDMA-56): nothing.
        raw.send(&header(1, 1, 0, &[0])[..20]);
        // Version 2 (RPCRDMA-62): ERR_VERS 1..1, the version echoed.
        raw.send(&header(2, 2, 0, &[0, 0, 0]));
        expect_err(
            2,
            2,
            ErrorBody::Vers {
                rdma_vers_low: 1,
                rdma_vers_high: 1,
            },
        );
        // An unknown procedure, RDMA_NOMSG without chunks, RDMA_MSGP, a payload whose xid
        // is not the header's, a Read chunk at an unaligned Position: ERR_CHUNK.
        raw.send(&header(3, 1, 9, &[0, 0, 0]));
        expect_err(3, 1, ErrorBody::Chunk);
        raw.send(&header(4, 1, 1, &[0, 0, 0]));
        expect_err(4, 1, ErrorBody::Chunk);
        raw.send(&header(5, 1, 2, &[0, 0, 0, 0, 0]));
        expect_err(5, 1, ErrorBody::Chunk);
        let mut m = header(6, 1, 0, &[0, 0, 0]);
        m.extend_from_slice(&call_msg(7, proc::NULL, &[]));
        raw.send(&m);
        expect_err(6, 1, ErrorBody::Chunk);
        let mut m = header(8, 1, 0, &[1, 6, 1, 4, 0, 0, 0, 0, 0, 0]);
        m.extend_from_slice(&call_msg(8, proc::NULL, &[]));
        raw.send(&m);
        expect_err(8, 1, ErrorBody::Chunk);
        // A Read chunk bigger than the server takes (RPCRDMA-81).
        let mut m = header(9, 1, 0, &[1, 4, 1, 0x4000_0000, 0, 0, 0, 0, 0]);
        m.extend_from_slice(&call_msg(9, proc::ECHO, &[0, 0, 0, 0]));
        raw.send(&m);
        expect_err(9, 1, ErrorBody::Chunk);
        // RDMA_DONE and RDMA_ERROR from a requester (RPCRDMA-70, -42): nothing.
        raw.send(&header(10, 1, 3, &[]));
        raw.send(&header(11, 1, 4, &[2]));
        assert!(raw.recv(quiet).is_none(), "{t:?}");
        // A good call afterwards is answered (its reply carries an empty Read list,
        // RPCRDMA-44).
        let mut m = header(12, 1, 0, &[0, 0, 0]);
        m.extend_from_slice(&call_msg(12, proc::ECHO, b"ok!!"));
        raw.send(&m);
        let reply = raw.recv(LONG).unwrap();
        let (h, hl) = Repr::parse(&reply).unwrap();
        assert_eq!(h.rdma_xid, 12);
        match h.body {
            Body::Msg(Chunks {
                read_list,
                write_list,
                reply_chunk,
            }) => {
                assert!(read_list.is_empty() && write_list.is_empty() && reply_chunk.is_none());
            }
            b => panic!("{b:?}"),
        }
        let (rh, off) = decode_reply(&reply[hl..]).unwrap();
        assert_eq!((rh.xid, &reply[hl + off..]), (12, &b"ok!!"[..]));
        let _ = (ReadList::EMPTY, WriteList::EMPTY, ReadSegment::LEN);
    });
}

/// A procedure marked inline runs in the connection's thread (no hand-off to the pool);
/// the others still go to the pool. Many calls in flight, on both transports.
#[test]
fn inline_procedures_run_where_the_call_is_read() {
    both(|t| {
        let (sctx, cctx) = contexts(t);
        let mut reg = Registry::new();
        reg.register(PROG, 1, |_: &CallContext<'_>, args: &[u8]| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            let mut r = args.to_vec();
            r.extend_from_slice(name.as_bytes());
            r.resize(r.len().next_multiple_of(4), 0);
            Ok::<_, ProcError>(r)
        });
        reg.inline(PROG, 1, &[proc::NULL]);
        let server = Arc::new(Server::new(reg, ServerConfig::default()));
        let l = Listener::bind(&sctx, "127.0.0.1:0").unwrap();
        let srv = server.serve_rdma(&sctx, l, RdmaConfig::default()).unwrap();
        let tr = RdmaTransport::connect(&cctx, srv.local_addr(), RdmaConfig::default()).unwrap();
        let c = Client::new(Arc::new(tr), 64);
        let pending: Vec<(u32, Pending)> = (0..200u32)
            .map(|i| {
                let p = i % 2; // NULL (inline) or ECHO (pool)
                (i, c.start(PROG, 1, p, &i.to_be_bytes()).unwrap())
            })
            .collect();
        for (i, p) in pending {
            let r = p.wait().unwrap();
            assert_eq!(&r.results[..4], &i.to_be_bytes(), "{t:?}");
            let name = String::from_utf8_lossy(&r.results[4..]);
            let name = name.trim_end_matches('\0');
            if i % 2 == 0 {
                assert_eq!(name, "rpc-rdma-conn", "{t:?} {i}");
            } else {
                assert!(name.starts_with("rpc-worker-"), "{t:?} {i}: {name}");
            }
        }
    });
}
