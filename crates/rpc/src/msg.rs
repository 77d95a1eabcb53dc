//! ONC RPC v2 messages (RFC 5531 §9) as owned values, on the codecs of
//! `softrdma_wire::onc_rpc`: a call's header and its argument octets, a reply's status and its
//! result octets.

use softrdma_wire::onc_rpc::{
    AcceptedReply, AcceptedReplyData, AuthStat, AuthSys, CallBody, Gids, Header, MsgBody, MsgType,
    OpaqueAuth, RPC_VERSION, RejectedReply, ReplyBody, Repr,
};

pub use softrdma_wire::onc_rpc::AuthStat as AuthStatus;

/// A credential or verifier (RFC 5531 §8.2), owned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Auth {
    /// `AUTH_NONE`.
    #[default]
    None,
    /// `AUTH_SYS` (RFC 5531 §A.1).
    Sys(AuthSysParams),
    /// Any other flavor, opaque (at most 400 octets of body).
    Other {
        /// The flavor word.
        flavor: u32,
        /// The body.
        body: Vec<u8>,
    },
}

/// `authsys_parms` (RFC 5531 §A.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthSysParams {
    /// Arbitrary stamp the caller chooses.
    pub stamp: u32,
    /// The caller's host name (at most 255 octets).
    pub machinename: Vec<u8>,
    /// Effective user.
    pub uid: u32,
    /// Effective group.
    pub gid: u32,
    /// Supplementary groups (at most 16).
    pub gids: Vec<u32>,
}

impl Auth {
    fn of(a: &OpaqueAuth<'_>) -> Auth {
        match a {
            OpaqueAuth::None => Auth::None,
            OpaqueAuth::Sys(s) => Auth::Sys(AuthSysParams {
                stamp: s.stamp,
                machinename: s.machinename.to_vec(),
                uid: s.uid,
                gid: s.gid,
                gids: s.gids.to_vec(),
            }),
            OpaqueAuth::Other { flavor, body } => Auth::Other {
                flavor: *flavor,
                body: body.to_vec(),
            },
        }
    }

    /// The wire form, borrowing `self`.
    fn wire(&self) -> Result<OpaqueAuth<'_>, softrdma_wire::Error> {
        Ok(match self {
            Auth::None => OpaqueAuth::None,
            Auth::Sys(s) => OpaqueAuth::Sys(AuthSys {
                stamp: s.stamp,
                machinename: &s.machinename,
                uid: s.uid,
                gid: s.gid,
                gids: Gids::new(&s.gids)?,
            }),
            Auth::Other { flavor, body } => OpaqueAuth::Other {
                flavor: *flavor,
                body,
            },
        })
    }
}

/// A call's header (RFC 5531 §9 `call_body`, `rpcvers` 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallHeader {
    /// Transaction id.
    pub xid: u32,
    /// Program.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure.
    pub proc: u32,
    /// Credential.
    pub cred: Auth,
    /// Verifier.
    pub verf: Auth,
}

/// How a call ended, as its reply says (RFC 5531 §9 `reply_body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStatus {
    /// `MSG_ACCEPTED` / `SUCCESS`: results follow.
    Success,
    /// `PROG_UNAVAIL`: the program is not served.
    ProgUnavail,
    /// `PROG_MISMATCH`: the versions of the program that are served.
    ProgMismatch {
        /// Lowest.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// `PROC_UNAVAIL`: no such procedure.
    ProcUnavail,
    /// `GARBAGE_ARGS`: the arguments did not decode.
    GarbageArgs,
    /// `SYSTEM_ERR`: the server failed (e.g. out of memory).
    SystemErr,
    /// `MSG_DENIED` / `RPC_MISMATCH`: the RPC versions served.
    RpcMismatch {
        /// Lowest.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// `MSG_DENIED` / `AUTH_ERROR`.
    AuthError(AuthStat),
}

impl ReplyStatus {
    fn body<'a>(&self, verf: OpaqueAuth<'a>) -> ReplyBody<'a> {
        let accepted = |reply_data| ReplyBody::Accepted(AcceptedReply { verf, reply_data });
        match *self {
            ReplyStatus::Success => accepted(AcceptedReplyData::Success),
            ReplyStatus::ProgUnavail => accepted(AcceptedReplyData::ProgUnavail),
            ReplyStatus::ProgMismatch { low, high } => {
                accepted(AcceptedReplyData::ProgMismatch { low, high })
            }
            ReplyStatus::ProcUnavail => accepted(AcceptedReplyData::ProcUnavail),
            ReplyStatus::GarbageArgs => accepted(AcceptedReplyData::GarbageArgs),
            ReplyStatus::SystemErr => accepted(AcceptedReplyData::SystemErr),
            ReplyStatus::RpcMismatch { low, high } => {
                ReplyBody::Denied(RejectedReply::RpcMismatch { low, high })
            }
            ReplyStatus::AuthError(s) => ReplyBody::Denied(RejectedReply::AuthError(s)),
        }
    }

    fn of(b: &ReplyBody<'_>) -> ReplyStatus {
        match b {
            ReplyBody::Accepted(a) => match a.reply_data {
                AcceptedReplyData::Success => ReplyStatus::Success,
                AcceptedReplyData::ProgUnavail => ReplyStatus::ProgUnavail,
                AcceptedReplyData::ProgMismatch { low, high } => {
                    ReplyStatus::ProgMismatch { low, high }
                }
                AcceptedReplyData::ProcUnavail => ReplyStatus::ProcUnavail,
                AcceptedReplyData::GarbageArgs => ReplyStatus::GarbageArgs,
                AcceptedReplyData::SystemErr => ReplyStatus::SystemErr,
            },
            ReplyBody::Denied(RejectedReply::RpcMismatch { low, high }) => {
                ReplyStatus::RpcMismatch {
                    low: *low,
                    high: *high,
                }
            }
            ReplyBody::Denied(RejectedReply::AuthError(s)) => ReplyStatus::AuthError(*s),
        }
    }
}

/// A reply's header, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyHeader {
    /// The call's transaction id.
    pub xid: u32,
    /// The outcome.
    pub status: ReplyStatus,
    /// The server's verifier (accepted replies; `Auth::None` for denied ones).
    pub verf: Auth,
}

/// Appends a call message (header, then `args`) to `out`.
pub fn encode_call(
    h: &CallHeader,
    args: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), softrdma_wire::Error> {
    let repr = Repr {
        xid: h.xid,
        body: MsgBody::Call(CallBody {
            prog: h.prog,
            vers: h.vers,
            proc: h.proc,
            cred: h.cred.wire()?,
            verf: h.verf.wire()?,
        }),
    };
    emit(&repr, out)?;
    out.extend_from_slice(args);
    Ok(())
}

/// Appends a reply message (header, then `results`, which only a `Success` carries) to `out`.
pub fn encode_reply(
    xid: u32,
    status: ReplyStatus,
    verf: &Auth,
    results: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), softrdma_wire::Error> {
    let repr = Repr {
        xid,
        body: MsgBody::Reply(status.body(verf.wire()?)),
    };
    emit(&repr, out)?;
    if status == ReplyStatus::Success {
        out.extend_from_slice(results);
    }
    Ok(())
}

fn emit(repr: &Repr<'_>, out: &mut Vec<u8>) -> Result<(), softrdma_wire::Error> {
    repr.check()?;
    let at = out.len();
    out.resize(at + repr.buffer_len(), 0);
    repr.emit(&mut out[at..])?;
    Ok(())
}

/// A message a server cannot take as a call, and what it answers (RFC 5531 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadCall {
    /// Shorter than `xid` and `msg_type`, or a reply: nothing to answer.
    #[error("not an RPC call")]
    NotACall,
    /// `rpcvers` is not 2: answer `RPC_MISMATCH` (2, 2).
    #[error("RPC version {vers} (xid {xid:#x})")]
    RpcVersion {
        /// The call's xid.
        xid: u32,
        /// What it said.
        vers: u32,
    },
    /// The credential or verifier does not decode: answer `AUTH_ERROR` / `AUTH_BADCRED`.
    #[error("undecodable credential (xid {xid:#x})")]
    BadCred {
        /// The call's xid.
        xid: u32,
    },
}

impl BadCall {
    /// The reply it deserves, if any: (xid, status).
    pub fn answer(&self) -> Option<(u32, ReplyStatus)> {
        match *self {
            BadCall::NotACall => None,
            BadCall::RpcVersion { xid, .. } => Some((
                xid,
                ReplyStatus::RpcMismatch {
                    low: RPC_VERSION,
                    high: RPC_VERSION,
                },
            )),
            BadCall::BadCred { xid } => Some((xid, ReplyStatus::AuthError(AuthStat::BadCred))),
        }
    }
}

/// Decodes a call; returns its header and the offset of its arguments.
pub fn decode_call(msg: &[u8]) -> Result<(CallHeader, usize), BadCall> {
    let h = Header::new_checked(msg).map_err(|_| BadCall::NotACall)?;
    let xid = h.xid();
    if h.msg_type() != u32::from(MsgType::Call) {
        return Err(BadCall::NotACall);
    }
    match Repr::parse(msg) {
        Ok((
            Repr {
                body: MsgBody::Call(c),
                ..
            },
            off,
        )) => Ok((
            CallHeader {
                xid,
                prog: c.prog,
                vers: c.vers,
                proc: c.proc,
                cred: Auth::of(&c.cred),
                verf: Auth::of(&c.verf),
            },
            off,
        )),
        Ok(_) => Err(BadCall::NotACall),
        Err(_) => {
            // rpcvers is the word after msg_type.
            let vers = msg
                .get(8..12)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            match vers {
                Some(v) if v != RPC_VERSION => Err(BadCall::RpcVersion { xid, vers: v }),
                _ => Err(BadCall::BadCred { xid }),
            }
        }
    }
}

/// Decodes a reply; returns its header and the offset of its results.
pub fn decode_reply(msg: &[u8]) -> Result<(ReplyHeader, usize), softrdma_wire::Error> {
    match Repr::parse(msg)? {
        (
            Repr {
                xid,
                body: MsgBody::Reply(b),
            },
            off,
        ) => Ok((
            ReplyHeader {
                xid,
                status: ReplyStatus::of(&b),
                verf: match &b {
                    ReplyBody::Accepted(a) => Auth::of(&a.verf),
                    ReplyBody::Denied(_) => Auth::None,
                },
            },
            off,
        )),
        _ => Err(softrdma_wire::Error::Malformed {
            layer: softrdma_wire::Layer::OncRpc,
            reason: "a call where a reply was expected",
        }),
    }
}

/// The xid of any message of at least 8 octets and whether it is a reply.
pub fn peek(msg: &[u8]) -> Option<(u32, bool)> {
    let h = Header::new_checked(msg).ok()?;
    Some((h.xid(), h.msg_type() == u32::from(MsgType::Reply)))
}

/// Program, version and procedure of call message `msg`, read from the fixed words before
/// the credential (RFC 5531 §9: xid, CALL, rpcvers 2, prog, vers, proc); `None` for
/// anything else. A look for routing only: [`decode_call`] checks the rest.
pub fn peek_call(msg: &[u8]) -> Option<(u32, u32, u32)> {
    let w = |i: usize| -> Option<u32> {
        let b = msg.get(4 * i..4 * i + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let h = Header::new_checked(msg).ok()?;
    (h.msg_type() == u32::from(MsgType::Call) && w(2)? == RPC_VERSION).then_some((
        w(3)?,
        w(4)?,
        w(5)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_call_reads_what_decode_call_decodes() {
        let h = CallHeader {
            xid: 9,
            prog: 100_003,
            vers: 3,
            proc: 6,
            cred: sys(),
            verf: Auth::None,
        };
        let mut m = Vec::new();
        encode_call(&h, b"args", &mut m).unwrap();
        assert_eq!(peek_call(&m), Some((100_003, 3, 6)));
        assert_eq!(peek_call(&m[..23]), None, "cut short");
        let mut reply = Vec::new();
        encode_reply(9, ReplyStatus::Success, &Auth::None, b"", &mut reply).unwrap();
        assert_eq!(peek_call(&reply), None, "a reply");
        m[11] = 3;
        assert_eq!(peek_call(&m), None, "RPC version 3");
    }

    fn sys() -> Auth {
        Auth::Sys(AuthSysParams {
            stamp: 7,
            machinename: b"client".to_vec(),
            uid: 1000,
            gid: 100,
            gids: vec![4, 24, 27],
        })
    }

    #[test]
    fn calls_round_trip_with_every_credential() {
        for cred in [
            Auth::None,
            sys(),
            Auth::Other {
                flavor: 6,
                body: vec![1, 2, 3],
            },
        ] {
            let h = CallHeader {
                xid: 0xdead_beef,
                prog: 100003,
                vers: 3,
                proc: 6,
                cred,
                verf: Auth::None,
            };
            let mut m = Vec::new();
            encode_call(&h, b"args", &mut m).unwrap();
            let (g, off) = decode_call(&m).unwrap();
            assert_eq!(g, h);
            assert_eq!(&m[off..], b"args");
        }
    }

    #[test]
    fn every_reply_status_round_trips_and_only_success_carries_results() {
        use ReplyStatus::*;
        for st in [
            Success,
            ProgUnavail,
            ProgMismatch { low: 2, high: 4 },
            ProcUnavail,
            GarbageArgs,
            SystemErr,
            RpcMismatch { low: 2, high: 2 },
            AuthError(AuthStat::TooWeak),
        ] {
            let mut m = Vec::new();
            encode_reply(9, st, &Auth::None, b"res!", &mut m).unwrap();
            let (h, off) = decode_reply(&m).unwrap();
            assert_eq!((h.xid, h.status), (9, st));
            assert_eq!(&m[off..], if st == Success { &b"res!"[..] } else { &[] });
        }
    }

    #[test]
    fn bad_calls_get_the_answer_rfc_5531_prescribes() {
        let h = CallHeader {
            xid: 5,
            prog: 1,
            vers: 1,
            proc: 0,
            cred: sys(),
            verf: Auth::None,
        };
        let mut m = Vec::new();
        encode_call(&h, &[], &mut m).unwrap();
        let mut v3 = m.clone();
        v3[11] = 3;
        assert_eq!(
            decode_call(&v3).unwrap_err().answer(),
            Some((5, ReplyStatus::RpcMismatch { low: 2, high: 2 }))
        );
        // The AUTH_SYS body claims more gids than fit.
        let mut bad = m.clone();
        // Header 24, flavor and length 8, stamp 4, "client" 4 + 8, uid 4, gid 4.
        let gids_count = 56;
        assert_eq!(bad[gids_count + 3], 3);
        bad[gids_count + 3] = 17;
        assert_eq!(
            decode_call(&bad).unwrap_err().answer(),
            Some((5, ReplyStatus::AuthError(AuthStat::BadCred)))
        );
        assert_eq!(decode_call(&m[..7]), Err(BadCall::NotACall));
        let mut reply = Vec::new();
        encode_reply(5, ReplyStatus::Success, &Auth::None, &[], &mut reply).unwrap();
        assert_eq!(decode_call(&reply), Err(BadCall::NotACall));
        assert_eq!(peek(&reply), Some((5, true)));
    }
}
