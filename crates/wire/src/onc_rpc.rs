//! ONC RPC Version 2 message header (RFC 5531 §9 `rpc_msg`).
//!
//! [`Repr::parse`] decodes the header of a Call (up to and including the
//! verifier) or a Reply (up to and including `accept_stat` and its arm) and
//! returns its length: the procedure arguments (Call) or results (Reply,
//! `SUCCESS`) start there. Credentials and verifiers (`opaque_auth`, at most
//! 400 octets of body) are decoded for `AUTH_NONE` and `AUTH_SYS` and kept as
//! borrowed opaque octets for every other flavor. Nothing is allocated.
//!
//! Strictness, so that `parse` then `emit` is byte-identical: XDR padding must
//! be zero, booleans/enums must hold defined values, an `AUTH_SYS` body must
//! decode exactly (no trailing octets), and `rpcvers` must be 2. A server that
//! gets an error can still answer: [`Header`] reads the `xid` of anything of 8
//! octets or more (`RPC_MISMATCH` for `rpcvers` ≠ 2, `AUTH_ERROR`/`AUTH_BADCRED`
//! for an undecodable credential, RFC 5531 §9).

use crate::error::need;
use crate::field::{be32, set_be32};
use crate::macros::wire_enum;
use crate::xdr::{XdrReader, XdrWriter, opaque_len};
use crate::{Error, Layer, Result};

const LAYER: Layer = Layer::OncRpc;

/// RFC 5531 §9: `rpcvers` of every Call.
pub const RPC_VERSION: u32 = 2;
/// RFC 5531 §8.2: `opaque body<400>` of an `opaque_auth`.
pub const MAX_AUTH_BYTES: usize = 400;
/// RFC 5531 §A.1: `string machinename<255>` of `authsys_parms`.
pub const MAX_MACHINE_NAME: usize = 255;
/// RFC 5531 §A.1: `unsigned int gids<16>` of `authsys_parms`.
pub const MAX_GIDS: usize = 16;

mod field {
    // RFC 5531 §9: `rpc_msg` begins with `xid` then the `msg_type` discriminant.
    pub const XID: usize = 0;
    pub const MSG_TYPE: usize = 4;
    pub const LEN: usize = 8;
}

wire_enum! {
    /// RFC 5531 §9 `enum msg_type`.
    pub enum MsgType: u32 => (LAYER, "msg_type") {
        /// `CALL` (0).
        Call = 0,
        /// `REPLY` (1).
        Reply = 1,
    }
}

wire_enum! {
    /// RFC 5531 §9 `enum reply_stat`.
    pub enum ReplyStat: u32 => (LAYER, "reply_stat") {
        /// `MSG_ACCEPTED` (0).
        Accepted = 0,
        /// `MSG_DENIED` (1).
        Denied = 1,
    }
}

wire_enum! {
    /// RFC 5531 §9 `enum accept_stat`.
    pub enum AcceptStat: u32 => (LAYER, "accept_stat") {
        /// `SUCCESS` (0): results follow.
        Success = 0,
        /// `PROG_UNAVAIL` (1).
        ProgUnavail = 1,
        /// `PROG_MISMATCH` (2): low/high versions follow.
        ProgMismatch = 2,
        /// `PROC_UNAVAIL` (3).
        ProcUnavail = 3,
        /// `GARBAGE_ARGS` (4).
        GarbageArgs = 4,
        /// `SYSTEM_ERR` (5).
        SystemErr = 5,
    }
}

wire_enum! {
    /// RFC 5531 §9 `enum reject_stat`.
    pub enum RejectStat: u32 => (LAYER, "reject_stat") {
        /// `RPC_MISMATCH` (0): low/high RPC versions follow.
        RpcMismatch = 0,
        /// `AUTH_ERROR` (1): an `auth_stat` follows.
        AuthError = 1,
    }
}

wire_enum! {
    /// RFC 5531 §9 `enum auth_stat` (13, 14 from RFC 2203).
    pub enum AuthStat: u32 => (LAYER, "auth_stat") {
        /// `AUTH_OK` (0).
        Ok = 0,
        /// `AUTH_BADCRED` (1): bad credential (seal broken).
        BadCred = 1,
        /// `AUTH_REJECTEDCRED` (2): client must begin a new session.
        RejectedCred = 2,
        /// `AUTH_BADVERF` (3).
        BadVerf = 3,
        /// `AUTH_REJECTEDVERF` (4).
        RejectedVerf = 4,
        /// `AUTH_TOOWEAK` (5).
        TooWeak = 5,
        /// `AUTH_INVALIDRESP` (6).
        InvalidResp = 6,
        /// `AUTH_FAILED` (7).
        Failed = 7,
        /// `AUTH_KERB_GENERIC` (8).
        KerbGeneric = 8,
        /// `AUTH_TIMEEXPIRE` (9).
        TimeExpire = 9,
        /// `AUTH_TKT_FILE` (10).
        TktFile = 10,
        /// `AUTH_DECODE` (11).
        Decode = 11,
        /// `AUTH_NET_ADDR` (12).
        NetAddr = 12,
        /// `RPCSEC_GSS_CREDPROBLEM` (13).
        RpcsecGssCredProblem = 13,
        /// `RPCSEC_GSS_CTXPROBLEM` (14).
        RpcsecGssCtxProblem = 14,
    }
}

wire_enum! {
    /// RFC 5531 §8.2 / §A `auth_flavor` values this crate names. Other values
    /// are legal on the wire ([`OpaqueAuth::Other`]); `try_from` rejects them.
    pub enum AuthFlavor: u32 => (LAYER, "auth_flavor") {
        /// `AUTH_NONE` (0).
        None = 0,
        /// `AUTH_SYS` (1), formerly `AUTH_UNIX`.
        Sys = 1,
        /// `AUTH_SHORT` (2).
        Short = 2,
        /// `AUTH_DH` (3).
        Dh = 3,
        /// `RPCSEC_GSS` (6).
        RpcsecGss = 6,
    }
}

/// A view of the two words every `rpc_msg` starts with (RFC 5531 §9).
#[derive(Debug, Clone)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wrap without checking; accessors may panic on fewer than 8 octets.
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wrap, checking that `xid` and `msg_type` are present.
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` below 8 octets.
    pub fn check_len(&self) -> Result<()> {
        need(LAYER, self.buffer.as_ref(), field::LEN)
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// `xid`.
    pub fn xid(&self) -> u32 {
        be32(self.buffer.as_ref(), field::XID)
    }

    /// `msg_type`, raw.
    pub fn msg_type(&self) -> u32 {
        be32(self.buffer.as_ref(), field::MSG_TYPE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Set `xid`.
    pub fn set_xid(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::XID, v)
    }
    /// Set `msg_type`.
    pub fn set_msg_type(&mut self, v: u32) {
        set_be32(self.buffer.as_mut(), field::MSG_TYPE, v)
    }
}

/// The supplementary groups of `authsys_parms` (`gids<16>`), stored inline.
#[derive(Clone, Copy)]
pub struct Gids {
    len: u8,
    gids: [u32; MAX_GIDS],
}

impl Gids {
    /// No supplementary groups.
    pub const EMPTY: Gids = Gids {
        len: 0,
        gids: [0; MAX_GIDS],
    };

    /// Up to 16 groups; more is `Error::TooLarge`.
    pub fn new(gids: &[u32]) -> Result<Gids> {
        if gids.len() > MAX_GIDS {
            return Err(Error::TooLarge {
                layer: LAYER,
                what: "AUTH_SYS gids",
                value: gids.len() as u64,
                limit: MAX_GIDS as u64,
            });
        }
        let mut g = Gids::EMPTY;
        g.gids[..gids.len()].copy_from_slice(gids);
        g.len = gids.len() as u8;
        Ok(g)
    }

    /// The groups.
    pub fn as_slice(&self) -> &[u32] {
        self.gids.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl core::ops::Deref for Gids {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        self.as_slice()
    }
}

impl Default for Gids {
    fn default() -> Self {
        Gids::EMPTY
    }
}

impl PartialEq for Gids {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}
impl Eq for Gids {}

impl core::fmt::Debug for Gids {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Gids {
    fn serialize<S: serde::Serializer>(&self, s: S) -> core::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.as_slice())
    }
}

/// RFC 5531 §A.1 `authsys_parms`, the body of an `AUTH_SYS` credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AuthSys<'a> {
    /// `stamp`: arbitrary ID the caller may generate.
    pub stamp: u32,
    /// `machinename<255>`: the caller's host name (octets as sent; XDR says ASCII).
    pub machinename: &'a [u8],
    /// `uid`: effective user ID.
    pub uid: u32,
    /// `gid`: effective group ID.
    pub gid: u32,
    /// `gids<16>`: supplementary groups.
    pub gids: Gids,
}

impl<'a> AuthSys<'a> {
    /// `machinename` as text, when it is UTF-8.
    pub fn machinename_str(&self) -> Option<&'a str> {
        core::str::from_utf8(self.machinename).ok()
    }

    /// Encoded size of the body.
    pub fn buffer_len(&self) -> usize {
        // stamp, machinename, uid, gid, gids count + entries.
        4 + opaque_len(self.machinename.len()) + 4 + 4 + 4 + 4 * self.gids.len()
    }

    /// Decode a whole `AUTH_SYS` body; trailing octets are `Malformed`.
    pub fn parse(body: &'a [u8]) -> Result<AuthSys<'a>> {
        let mut r = XdrReader::with_layer(body, LAYER);
        let stamp = r.read_u32()?;
        let machinename = r.read_opaque(MAX_MACHINE_NAME as u32)?;
        let uid = r.read_u32()?;
        let gid = r.read_u32()?;
        let n = r.read_count(MAX_GIDS as u32)? as usize;
        let mut gids = Gids::EMPTY;
        for g in gids.gids.iter_mut().take(n) {
            *g = r.read_u32()?;
        }
        gids.len = n as u8;
        if !r.is_empty() {
            return Err(Error::Malformed {
                layer: LAYER,
                reason: "AUTH_SYS body longer than its authsys_parms",
            });
        }
        Ok(AuthSys {
            stamp,
            machinename,
            uid,
            gid,
            gids,
        })
    }

    /// Write the body (`buffer_len()` octets); nothing is written on error.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        OpaqueAuth::Sys(*self).check()?;
        need(LAYER, buf, self.buffer_len())?;
        let mut w = XdrWriter::with_layer(buf, LAYER);
        self.write(&mut w)?;
        Ok(w.finish())
    }

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        w.write_u32(self.stamp)?;
        w.write_opaque(self.machinename, MAX_MACHINE_NAME as u32)?;
        w.write_u32(self.uid)?;
        w.write_u32(self.gid)?;
        w.write_count(self.gids.len(), MAX_GIDS as u32)?;
        self.gids.iter().try_for_each(|&g| w.write_u32(g))
    }
}

/// RFC 5531 §8.2 `opaque_auth`: a flavor and at most 400 octets of body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum OpaqueAuth<'a> {
    /// `AUTH_NONE` with an empty body (RFC 5531 §10.1 recommends zero length).
    None,
    /// `AUTH_SYS`, decoded (RFC 5531 §A.1).
    Sys(AuthSys<'a>),
    /// Any other flavor (or `AUTH_NONE` with a non-empty body), kept opaque.
    Other { flavor: u32, body: &'a [u8] },
}

impl<'a> OpaqueAuth<'a> {
    /// The `flavor` word.
    pub fn flavor(&self) -> u32 {
        match self {
            OpaqueAuth::None => AuthFlavor::None.into(),
            OpaqueAuth::Sys(_) => AuthFlavor::Sys.into(),
            OpaqueAuth::Other { flavor, .. } => *flavor,
        }
    }

    /// Length of the body in octets.
    pub fn body_len(&self) -> usize {
        match self {
            OpaqueAuth::None => 0,
            OpaqueAuth::Sys(s) => s.buffer_len(),
            OpaqueAuth::Other { body, .. } => body.len(),
        }
    }

    /// Encoded size: flavor, length word, body and padding.
    pub fn buffer_len(&self) -> usize {
        4 + opaque_len(self.body_len())
    }

    /// Decode one `opaque_auth` from the front of `buf`; returns it and its length.
    pub fn parse(buf: &'a [u8]) -> Result<(OpaqueAuth<'a>, usize)> {
        let mut r = XdrReader::with_layer(buf, LAYER);
        let a = Self::read(&mut r)?;
        Ok((a, r.position()))
    }

    /// Write `buffer_len()` octets.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        need(LAYER, buf, self.buffer_len())?;
        let mut w = XdrWriter::with_layer(buf, LAYER);
        self.write(&mut w)?;
        Ok(w.finish())
    }

    /// What `emit` requires: body ≤ 400 octets, machinename ≤ 255, and the
    /// canonical variant (`Sys` for `AUTH_SYS`, `None` for an empty `AUTH_NONE`)
    /// so that `parse` gives the same value back.
    pub fn check(&self) -> Result<()> {
        match self {
            OpaqueAuth::None => Ok(()),
            OpaqueAuth::Sys(s) => {
                if s.machinename.len() > MAX_MACHINE_NAME {
                    return Err(Error::TooLarge {
                        layer: LAYER,
                        what: "AUTH_SYS machinename length",
                        value: s.machinename.len() as u64,
                        limit: MAX_MACHINE_NAME as u64,
                    });
                }
                // At most 4 + 260 + 12 + 64 = 340 octets: always under 400.
                Ok(())
            }
            OpaqueAuth::Other { flavor, body } => {
                if body.len() > MAX_AUTH_BYTES {
                    return Err(Error::TooLarge {
                        layer: LAYER,
                        what: "opaque_auth body length",
                        value: body.len() as u64,
                        limit: MAX_AUTH_BYTES as u64,
                    });
                }
                if *flavor == u32::from(AuthFlavor::Sys)
                    || (*flavor == u32::from(AuthFlavor::None) && body.is_empty())
                {
                    return Err(Error::Malformed {
                        layer: LAYER,
                        reason: "AUTH_SYS / empty AUTH_NONE are emitted from their own variants",
                    });
                }
                Ok(())
            }
        }
    }

    fn read(r: &mut XdrReader<'a>) -> Result<OpaqueAuth<'a>> {
        let flavor = r.read_u32()?;
        let body = r.read_opaque(MAX_AUTH_BYTES as u32)?;
        Ok(match AuthFlavor::try_from(flavor) {
            Ok(AuthFlavor::None) if body.is_empty() => OpaqueAuth::None,
            Ok(AuthFlavor::Sys) => OpaqueAuth::Sys(AuthSys::parse(body)?),
            _ => OpaqueAuth::Other { flavor, body },
        })
    }

    fn write(&self, w: &mut XdrWriter<'_>) -> Result<()> {
        w.write_u32(self.flavor())?;
        match self {
            OpaqueAuth::None => w.write_u32(0),
            OpaqueAuth::Sys(s) => {
                w.write_u32(s.buffer_len() as u32)?;
                s.write(w)
            }
            OpaqueAuth::Other { body, .. } => w.write_opaque(body, MAX_AUTH_BYTES as u32),
        }
    }
}

/// RFC 5531 §9 `call_body` (after `rpcvers`, which is always 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CallBody<'a> {
    /// `prog`: remote program number.
    pub prog: u32,
    /// `vers`: remote program version.
    pub vers: u32,
    /// `proc`: procedure number.
    pub proc: u32,
    /// `cred`: authentication credential.
    pub cred: OpaqueAuth<'a>,
    /// `verf`: authentication verifier.
    pub verf: OpaqueAuth<'a>,
}

/// RFC 5531 §9 `accepted_reply.reply_data`, by `accept_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum AcceptedReplyData {
    /// `SUCCESS`: the procedure results follow the header.
    Success,
    /// `PROG_UNAVAIL`.
    ProgUnavail,
    /// `PROG_MISMATCH`: lowest and highest version supported.
    ProgMismatch { low: u32, high: u32 },
    /// `PROC_UNAVAIL`.
    ProcUnavail,
    /// `GARBAGE_ARGS`.
    GarbageArgs,
    /// `SYSTEM_ERR`.
    SystemErr,
}

impl AcceptedReplyData {
    /// The `accept_stat` value.
    pub fn accept_stat(&self) -> AcceptStat {
        match self {
            AcceptedReplyData::Success => AcceptStat::Success,
            AcceptedReplyData::ProgUnavail => AcceptStat::ProgUnavail,
            AcceptedReplyData::ProgMismatch { .. } => AcceptStat::ProgMismatch,
            AcceptedReplyData::ProcUnavail => AcceptStat::ProcUnavail,
            AcceptedReplyData::GarbageArgs => AcceptStat::GarbageArgs,
            AcceptedReplyData::SystemErr => AcceptStat::SystemErr,
        }
    }
}

/// RFC 5531 §9 `accepted_reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AcceptedReply<'a> {
    /// `verf`: the server's verifier.
    pub verf: OpaqueAuth<'a>,
    /// `reply_data`.
    pub reply_data: AcceptedReplyData,
}

/// RFC 5531 §9 `rejected_reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum RejectedReply {
    /// `RPC_MISMATCH`: lowest and highest RPC version supported.
    RpcMismatch { low: u32, high: u32 },
    /// `AUTH_ERROR`.
    AuthError(AuthStat),
}

impl RejectedReply {
    /// The `reject_stat` value.
    pub fn reject_stat(&self) -> RejectStat {
        match self {
            RejectedReply::RpcMismatch { .. } => RejectStat::RpcMismatch,
            RejectedReply::AuthError(_) => RejectStat::AuthError,
        }
    }
}

/// RFC 5531 §9 `reply_body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum ReplyBody<'a> {
    /// `MSG_ACCEPTED`.
    Accepted(AcceptedReply<'a>),
    /// `MSG_DENIED`.
    Denied(RejectedReply),
}

impl ReplyBody<'_> {
    /// The `reply_stat` value.
    pub fn reply_stat(&self) -> ReplyStat {
        match self {
            ReplyBody::Accepted(_) => ReplyStat::Accepted,
            ReplyBody::Denied(_) => ReplyStat::Denied,
        }
    }
}

/// RFC 5531 §9 the `body` union of `rpc_msg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum MsgBody<'a> {
    /// `CALL`.
    Call(CallBody<'a>),
    /// `REPLY`.
    Reply(ReplyBody<'a>),
}

/// RFC 5531 §9 `rpc_msg` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Repr<'a> {
    /// `xid`: transaction identifier.
    pub xid: u32,
    /// `body`.
    pub body: MsgBody<'a>,
}

impl<'a> Repr<'a> {
    /// Parse the header at the front of `buf`; returns it and its length (the
    /// offset of the call arguments or reply results).
    pub fn parse(buf: &'a [u8]) -> Result<(Repr<'a>, usize)> {
        Header::new_checked(buf)?;
        let mut r = XdrReader::with_layer(buf, LAYER);
        let xid = r.read_u32()?;
        let body = match r.read_enum::<MsgType>()? {
            MsgType::Call => {
                let rpcvers = r.read_u32()?;
                if rpcvers != RPC_VERSION {
                    return Err(Error::Unknown {
                        layer: LAYER,
                        field: "rpcvers",
                        value: rpcvers.into(),
                    });
                }
                MsgBody::Call(CallBody {
                    prog: r.read_u32()?,
                    vers: r.read_u32()?,
                    proc: r.read_u32()?,
                    cred: OpaqueAuth::read(&mut r)?,
                    verf: OpaqueAuth::read(&mut r)?,
                })
            }
            MsgType::Reply => MsgBody::Reply(match r.read_enum::<ReplyStat>()? {
                ReplyStat::Accepted => {
                    let verf = OpaqueAuth::read(&mut r)?;
                    let reply_data = match r.read_enum::<AcceptStat>()? {
                        AcceptStat::Success => AcceptedReplyData::Success,
                        AcceptStat::ProgUnavail => AcceptedReplyData::ProgUnavail,
                        AcceptStat::ProgMismatch => AcceptedReplyData::ProgMismatch {
                            low: r.read_u32()?,
                            high: r.read_u32()?,
                        },
                        AcceptStat::ProcUnavail => AcceptedReplyData::ProcUnavail,
                        AcceptStat::GarbageArgs => AcceptedReplyData::GarbageArgs,
                        AcceptStat::SystemErr => AcceptedReplyData::SystemErr,
                    };
                    ReplyBody::Accepted(AcceptedReply { verf, reply_data })
                }
                ReplyStat::Denied => ReplyBody::Denied(match r.read_enum::<RejectStat>()? {
                    RejectStat::RpcMismatch => RejectedReply::RpcMismatch {
                        low: r.read_u32()?,
                        high: r.read_u32()?,
                    },
                    RejectStat::AuthError => RejectedReply::AuthError(r.read_enum()?),
                }),
            }),
        };
        Ok((Repr { xid, body }, r.position()))
    }

    /// Header length in octets.
    pub fn buffer_len(&self) -> usize {
        8 + match &self.body {
            // rpcvers, prog, vers, proc, cred, verf.
            MsgBody::Call(c) => 16 + c.cred.buffer_len() + c.verf.buffer_len(),
            MsgBody::Reply(ReplyBody::Accepted(a)) => {
                4 + a.verf.buffer_len()
                    + match a.reply_data {
                        AcceptedReplyData::ProgMismatch { .. } => 12,
                        _ => 4,
                    }
            }
            // reply_stat, reject_stat, then low/high or auth_stat.
            MsgBody::Reply(ReplyBody::Denied(RejectedReply::RpcMismatch { .. })) => 16,
            MsgBody::Reply(ReplyBody::Denied(RejectedReply::AuthError(_))) => 12,
        }
    }

    /// What `emit` requires beyond buffer room (see [`OpaqueAuth::check`]).
    pub fn check(&self) -> Result<()> {
        match &self.body {
            MsgBody::Call(c) => {
                c.cred.check()?;
                c.verf.check()
            }
            MsgBody::Reply(ReplyBody::Accepted(a)) => a.verf.check(),
            MsgBody::Reply(ReplyBody::Denied(_)) => Ok(()),
        }
    }

    /// Write exactly `buffer_len()` octets; nothing is written on error.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        need(LAYER, buf, self.buffer_len())?;
        let mut w = XdrWriter::with_layer(buf, LAYER);
        w.write_u32(self.xid)?;
        w.write_enum(self.msg_type())?;
        match &self.body {
            MsgBody::Call(c) => {
                w.write_u32(RPC_VERSION)?;
                w.write_u32(c.prog)?;
                w.write_u32(c.vers)?;
                w.write_u32(c.proc)?;
                c.cred.write(&mut w)?;
                c.verf.write(&mut w)?;
            }
            MsgBody::Reply(rb) => {
                w.write_enum(rb.reply_stat())?;
                match rb {
                    ReplyBody::Accepted(a) => {
                        a.verf.write(&mut w)?;
                        w.write_enum(a.reply_data.accept_stat())?;
                        if let AcceptedReplyData::ProgMismatch { low, high } = a.reply_data {
                            w.write_u32(low)?;
                            w.write_u32(high)?;
                        }
                    }
                    ReplyBody::Denied(d) => {
                        w.write_enum(d.reject_stat())?;
                        match *d {
                            RejectedReply::RpcMismatch { low, high } => {
                                w.write_u32(low)?;
                                w.write_u32(high)?;
                            }
                            RejectedReply::AuthError(s) => w.write_enum(s)?,
                        }
                    }
                }
            }
        }
        Ok(w.finish())
    }

    /// The `msg_type`.
    pub fn msg_type(&self) -> MsgType {
        match self.body {
            MsgBody::Call(_) => MsgType::Call,
            MsgBody::Reply(_) => MsgType::Reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// nfs3-rdma-rxe.pcap frame 18: MOUNT3 MNT Call over TCP, after the record mark 0x80000050
    #[rustfmt::skip]
    const TCP_MNT_CALL: [u8; 80] = [
        0x24, 0x17, 0xf0, 0x8b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x86, 0xa5,
        0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x1c,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e, 0x65, 0x29, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x2f, 0x65, 0x78, 0x70, 0x6f, 0x72, 0x74, 0x00,
    ];
    /// nfs3-rdma-rxe.pcap frame 19: MOUNT3 MNT Reply over TCP, after the record mark 0x80000030
    #[rustfmt::skip]
    const TCP_MNT_REPLY: [u8; 48] = [
        0x24, 0x17, 0xf0, 0x8b, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08,
        0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
    ];
    /// nfs42-rdma-rxe.pcap frame 20: the Payload stream after the 28-octet RDMA_MSG header
    #[rustfmt::skip]
    const V42_CREATE_SESSION_CALL: [u8; 196] = [
        0x46, 0xaf, 0xd9, 0x70, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x86, 0xa3,
        0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x1c,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x28, 0x6e, 0x6f, 0x6e, 0x65, 0x29, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x2b, 0x76, 0x60, 0x02, 0x6b, 0x67, 0x90, 0xac, 0x55, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x04, 0x14, 0x00, 0x10, 0x03, 0x88,
        0x00, 0x00, 0x1d, 0xa0, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0xe4, 0x00, 0x00, 0x0f, 0xe4, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0xbd, 0xb3, 0xe3, 0x3f, 0x00, 0x00, 0x00, 0x06,
        0x28, 0x6e, 0x6f, 0x6e, 0x65, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    /// nfs42-rdma-rxe.pcap frame 22: the Payload stream after the 28-octet RDMA_MSG header
    #[rustfmt::skip]
    const V42_CREATE_SESSION_REPLY: [u8; 124] = [
        0x46, 0xaf, 0xd9, 0x70, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x2b, 0x00, 0x00, 0x00, 0x00, 0x76, 0x60, 0x02, 0x6b,
        0x67, 0x90, 0xac, 0x55, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x10, 0x00, 0x00, 0x02, 0x10, 0x00,
        0x00, 0x00, 0x08, 0x50, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x1e, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0xe4, 0x00, 0x00, 0x0f, 0xe4, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00,
    ];

    fn round_trip(msg: &[u8]) -> (Repr<'_>, usize) {
        let (repr, len) = Repr::parse(msg).unwrap();
        assert_eq!(repr.buffer_len(), len);
        let mut out = [0u8; 512];
        assert_eq!(repr.emit(&mut out).unwrap(), len);
        assert_eq!(&out[..len], &msg[..len]);
        for n in 0..len {
            assert!(Repr::parse(&msg[..n]).is_err(), "prefix {n} parsed");
            assert!(matches!(
                repr.emit(&mut out[..n]),
                Err(Error::Truncated {
                    layer: Layer::OncRpc,
                    ..
                })
            ));
        }
        (repr, len)
    }

    fn kernel_auth_sys(stamp: u32) -> OpaqueAuth<'static> {
        OpaqueAuth::Sys(AuthSys {
            stamp,
            machinename: b"(none)",
            uid: 0,
            gid: 0,
            gids: Gids::EMPTY,
        })
    }

    /// MOUNT3 MNT Call/Reply from the kernel's mount.nfs over TCP: AUTH_SYS
    /// (tshark: "AUTH_UNIX, Length 28, Machine Name (none), UID 0, GID 0,
    /// Auxiliary GIDs (0)"), verifier AUTH_NONE; the Reply is accepted, SUCCESS.
    #[test]
    fn capture_mount_call_reply() {
        let h = Header::new_checked(&TCP_MNT_CALL[..]).unwrap();
        assert_eq!((h.xid(), h.msg_type()), (0x2417_f08b, 0));
        let (call, len) = round_trip(&TCP_MNT_CALL);
        assert_eq!(call.msg_type(), MsgType::Call);
        assert_eq!(
            call.body,
            MsgBody::Call(CallBody {
                prog: 100_005,
                vers: 3,
                proc: 1,
                cred: kernel_auth_sys(0),
                verf: OpaqueAuth::None,
            })
        );
        assert_eq!(len, 68);
        // dirpath "/export" follows the header.
        let mut args = XdrReader::new(&TCP_MNT_CALL[len..]);
        assert_eq!(args.read_string(1024).unwrap(), "/export");
        assert!(args.is_empty());

        let (reply, len) = round_trip(&TCP_MNT_REPLY);
        assert_eq!(reply.xid, call.xid);
        assert_eq!(
            reply.body,
            MsgBody::Reply(ReplyBody::Accepted(AcceptedReply {
                verf: OpaqueAuth::None,
                reply_data: AcceptedReplyData::Success,
            }))
        );
        assert_eq!(len, 24);
        // mountstat3 MNT3_OK follows.
        assert_eq!(&TCP_MNT_REPLY[len..len + 4], &[0, 0, 0, 0]);
    }

    /// NFSv4.2 CREATE_SESSION Call/Reply from RPC-over-RDMA: the header length
    /// locates the COMPOUND; the callback AUTH_SYS parameters inside it (stamp
    /// 0xbdb3e33f) decode with `AuthSys::parse`.
    #[test]
    fn capture_v42_create_session() {
        let (call, len) = round_trip(&V42_CREATE_SESSION_CALL);
        let MsgBody::Call(c) = call.body else {
            panic!("{call:?}")
        };
        assert_eq!((c.prog, c.vers, c.proc), (100_003, 4, 1));
        assert_eq!(c.cred, kernel_auth_sys(0));
        // COMPOUND4args: tag<> (empty), minorversion 2, 1 operation.
        let mut args = XdrReader::new(&V42_CREATE_SESSION_CALL[len..]);
        assert_eq!(args.read_opaque(64).unwrap(), b"");
        assert_eq!(args.read_u32().unwrap(), 2);
        assert_eq!(args.read_u32().unwrap(), 1);
        let cb = AuthSys::parse(&V42_CREATE_SESSION_CALL[168..]).unwrap();
        assert_eq!(OpaqueAuth::Sys(cb), kernel_auth_sys(0xbdb3_e33f));
        let mut out = [0u8; 28];
        assert_eq!(cb.emit(&mut out).unwrap(), 28);
        assert_eq!(out, V42_CREATE_SESSION_CALL[168..]);

        let (reply, len) = round_trip(&V42_CREATE_SESSION_REPLY);
        assert_eq!(reply.xid, call.xid);
        assert_eq!(len, 24);
        assert!(matches!(
            reply.body,
            MsgBody::Reply(ReplyBody::Accepted(AcceptedReply {
                reply_data: AcceptedReplyData::Success,
                ..
            }))
        ));
    }

    fn words(w: &[u32]) -> ([u8; 512], usize) {
        let mut b = [0u8; 512];
        for (i, v) in w.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
        }
        (b, 4 * w.len())
    }

    /// Every `accept_stat` arm, RFC 5531 §9 (PROG_MISMATCH carries low/high).
    #[test]
    fn accepted_reply_arms() {
        for (stat, data, extra) in [
            (0, AcceptedReplyData::Success, &[][..]),
            (1, AcceptedReplyData::ProgUnavail, &[]),
            (
                2,
                AcceptedReplyData::ProgMismatch { low: 2, high: 4 },
                &[2, 4],
            ),
            (3, AcceptedReplyData::ProcUnavail, &[]),
            (4, AcceptedReplyData::GarbageArgs, &[]),
            (5, AcceptedReplyData::SystemErr, &[]),
        ] {
            let mut w = [0u32; 8];
            w[..6].copy_from_slice(&[0x55, 1, 0, 0, 0, stat]);
            w[6..6 + extra.len()].copy_from_slice(extra);
            let (b, n) = words(&w[..6 + extra.len()]);
            let (r, len) = round_trip(&b[..n]);
            assert_eq!(len, n);
            let want = Repr {
                xid: 0x55,
                body: MsgBody::Reply(ReplyBody::Accepted(AcceptedReply {
                    verf: OpaqueAuth::None,
                    reply_data: data,
                })),
            };
            assert_eq!(r, want);
            assert_eq!(u32::from(data.accept_stat()), stat);
        }
        let (b, n) = words(&[1, 1, 0, 0, 0, 6]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "accept_stat",
                value: 6,
                ..
            })
        ));
    }

    /// MSG_DENIED: RPC_MISMATCH low/high, AUTH_ERROR with each auth_stat.
    #[test]
    fn rejected_reply_arms() {
        let (b, n) = words(&[9, 1, 1, 0, 2, 2]);
        let (r, _) = round_trip(&b[..n]);
        assert_eq!(
            r.body,
            MsgBody::Reply(ReplyBody::Denied(RejectedReply::RpcMismatch {
                low: 2,
                high: 2
            }))
        );
        for s in AuthStat::ALL {
            let (b, n) = words(&[9, 1, 1, 1, u32::from(*s)]);
            let (r, len) = round_trip(&b[..n]);
            assert_eq!(len, 20);
            assert_eq!(
                r.body,
                MsgBody::Reply(ReplyBody::Denied(RejectedReply::AuthError(*s)))
            );
        }
        let (b, n) = words(&[9, 1, 1, 1, 15]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "auth_stat",
                ..
            })
        ));
        let (b, n) = words(&[9, 1, 1, 2]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "reject_stat",
                ..
            })
        ));
        let (b, n) = words(&[9, 1, 2]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "reply_stat",
                ..
            })
        ));
        let (b, n) = words(&[9, 2]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "msg_type",
                ..
            })
        ));
    }

    /// rpcvers other than 2 is refused; the xid is still readable to answer
    /// RPC_MISMATCH (RFC 5531 §9).
    #[test]
    fn rpcvers_must_be_2() {
        let (b, n) = words(&[0x77, 0, 3, 1, 1, 1, 0, 0, 0, 0]);
        assert!(matches!(
            Repr::parse(&b[..n]),
            Err(Error::Unknown {
                field: "rpcvers",
                value: 3,
                ..
            })
        ));
        assert_eq!(Header::new_checked(&b[..n]).unwrap().xid(), 0x77);
        let answer = Repr {
            xid: 0x77,
            body: MsgBody::Reply(ReplyBody::Denied(RejectedReply::RpcMismatch {
                low: RPC_VERSION,
                high: RPC_VERSION,
            })),
        };
        let mut out = [0u8; 24];
        assert_eq!(answer.emit(&mut out).unwrap(), 24);
        assert_eq!(words(&[0x77, 1, 1, 0, 2, 2]).0[..24], out);
    }

    /// AUTH_SYS with 16 groups and a 255-octet name (the maxima), kept
    /// exactly; one more of either is `TooLarge`.
    #[test]
    fn auth_sys_bounds() {
        let name = [b'h'; MAX_MACHINE_NAME];
        let gids: [u32; MAX_GIDS] = core::array::from_fn(|i| 1000 + i as u32);
        let cred = OpaqueAuth::Sys(AuthSys {
            stamp: 0x1234,
            machinename: &name,
            uid: 1000,
            gid: 100,
            gids: Gids::new(&gids).unwrap(),
        });
        let repr = Repr {
            xid: 1,
            body: MsgBody::Call(CallBody {
                prog: 100_003,
                vers: 3,
                proc: 0,
                cred,
                verf: OpaqueAuth::None,
            }),
        };
        let mut out = [0u8; 512];
        let n = repr.emit(&mut out).unwrap();
        assert_eq!(cred.body_len(), 4 + 4 + 256 + 4 + 4 + 4 + 64);
        let (p, _) = round_trip(&out[..n]);
        assert_eq!(p, repr);
        let MsgBody::Call(c) = p.body else { panic!() };
        let OpaqueAuth::Sys(s) = c.cred else { panic!() };
        assert_eq!(&*s.gids, &gids[..]);

        assert!(matches!(Gids::new(&[0; 17]), Err(Error::TooLarge { .. })));
        let long = [b'h'; MAX_MACHINE_NAME + 1];
        let bad = OpaqueAuth::Sys(AuthSys {
            stamp: 0,
            machinename: &long,
            uid: 0,
            gid: 0,
            gids: Gids::EMPTY,
        });
        assert!(matches!(bad.emit(&mut out), Err(Error::TooLarge { .. })));

        // On the wire: 17 groups, a 256-octet name.
        let (b, n) = words(&[0, 0, 0, 0, 17]);
        assert!(matches!(
            AuthSys::parse(&b[..n]),
            Err(Error::TooLarge {
                what: "array count",
                ..
            })
        ));
        let (b, n) = words(&[0, 256]);
        assert!(matches!(
            AuthSys::parse(&b[..n]),
            Err(Error::TooLarge { .. })
        ));
        // Trailing octets inside the credential body.
        let (b, n) = words(&[0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            AuthSys::parse(&b[..n]),
            Err(Error::Malformed { .. })
        ));
        assert!(AuthSys::parse(&b[..n - 4]).is_ok());
        // A credential body of 20 octets whose gids count says 1 more word.
        let (b, n) = words(&[1, 0, 2, 0, 1, 1, 1, 20, 0, 0, 0, 0, 1, 7, 0, 0]);
        assert!(matches!(Repr::parse(&b[..n]), Err(Error::Truncated { .. })));
    }

    /// opaque_auth bodies are at most 400 octets; unknown flavors and a
    /// non-empty AUTH_NONE are kept as opaque octets.
    #[test]
    fn opaque_auth_other_flavors() {
        let body = [0xabu8; 400];
        let gss = OpaqueAuth::Other {
            flavor: AuthFlavor::RpcsecGss.into(),
            body: &body,
        };
        let mut out = [0u8; 512];
        let n = gss.emit(&mut out).unwrap();
        assert_eq!(n, 408);
        assert_eq!(OpaqueAuth::parse(&out[..n]).unwrap(), (gss, 408));
        let big = [0u8; 401];
        let bad = OpaqueAuth::Other {
            flavor: 6,
            body: &big,
        };
        assert!(matches!(bad.emit(&mut out), Err(Error::TooLarge { .. })));
        let (b, _) = words(&[6, 401]);
        assert!(matches!(
            OpaqueAuth::parse(&b),
            Err(Error::TooLarge { limit: 400, .. })
        ));
        // AUTH_NONE with a body: kept.
        let (b, n) = words(&[0, 4, 0xdead_beef]);
        let (a, len) = OpaqueAuth::parse(&b[..n]).unwrap();
        assert_eq!(len, 12);
        assert_eq!(
            a,
            OpaqueAuth::Other {
                flavor: 0,
                body: &[0xde, 0xad, 0xbe, 0xef]
            }
        );
        assert_eq!(a.emit(&mut out).unwrap(), 12);
        // Non-canonical values are refused by emit.
        for bad in [
            OpaqueAuth::Other {
                flavor: 0,
                body: &[],
            },
            OpaqueAuth::Other {
                flavor: 1,
                body: &[0; 20],
            },
        ] {
            assert!(matches!(bad.emit(&mut out), Err(Error::Malformed { .. })));
        }
        // Non-zero padding.
        let mut b = [0u8; 12];
        b[3] = 9;
        b[7] = 1;
        b[9] = 1;
        assert!(matches!(
            OpaqueAuth::parse(&b),
            Err(Error::Malformed { .. })
        ));
        assert_eq!(AuthFlavor::try_from(9).unwrap_err().layer(), Layer::OncRpc);
    }

    #[test]
    fn enums_round_trip() {
        for v in MsgType::ALL {
            assert_eq!(MsgType::try_from(u32::from(*v)).unwrap(), *v);
        }
        for v in ReplyStat::ALL {
            assert_eq!(ReplyStat::try_from(u32::from(*v)).unwrap(), *v);
        }
        for v in AcceptStat::ALL {
            assert_eq!(AcceptStat::try_from(u32::from(*v)).unwrap(), *v);
        }
        for v in RejectStat::ALL {
            assert_eq!(RejectStat::try_from(u32::from(*v)).unwrap(), *v);
        }
        for v in AuthStat::ALL {
            assert_eq!(AuthStat::try_from(u32::from(*v)).unwrap(), *v);
        }
        for v in AuthFlavor::ALL {
            assert_eq!(AuthFlavor::try_from(u32::from(*v)).unwrap(), *v);
        }
        assert_eq!(u32::from(AuthFlavor::RpcsecGss), 6);
        assert_eq!(u32::from(AuthStat::RpcsecGssCtxProblem), 14);
    }

    #[test]
    fn header_view_setters() {
        let mut b = [0u8; 8];
        let mut h = Header::new_unchecked(&mut b[..]);
        h.set_xid(0xcafe_f00d);
        h.set_msg_type(1);
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!((h.xid(), h.msg_type()), (0xcafe_f00d, 1));
        assert_eq!(h.into_inner().len(), 8);
        for n in 0..8 {
            assert!(Header::new_checked(&b[..n]).is_err());
        }
    }

    // --- Property tests ----------------------------------------------------

    fn any_auth() -> impl Strategy<Value = (u32, Vec<u8>, u32, u32, u32, Vec<u32>, u8)> {
        (
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..=MAX_MACHINE_NAME),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            proptest::collection::vec(any::<u32>(), 0..=MAX_GIDS),
            0u8..3,
        )
    }

    fn make_auth<'a>(
        (stamp, name, uid, gid, flavor, gids, kind): &'a (
            u32,
            Vec<u8>,
            u32,
            u32,
            u32,
            Vec<u32>,
            u8,
        ),
    ) -> OpaqueAuth<'a> {
        match kind {
            0 => OpaqueAuth::None,
            1 => OpaqueAuth::Sys(AuthSys {
                stamp: *stamp,
                machinename: name,
                uid: *uid,
                gid: *gid,
                gids: Gids::new(gids).unwrap(),
            }),
            _ => {
                // Any flavor but AUTH_SYS; AUTH_NONE only with a body.
                let flavor = if *flavor == 1 || (*flavor == 0 && name.is_empty()) {
                    6
                } else {
                    *flavor
                };
                OpaqueAuth::Other { flavor, body: name }
            }
        }
    }

    fn check(repr: &Repr<'_>) -> std::result::Result<(), TestCaseError> {
        let mut a = [0u8; 2048];
        let n = repr.emit(&mut a).unwrap();
        prop_assert_eq!(n, repr.buffer_len());
        let (p, len) = Repr::parse(&a[..n]).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(&p, repr);
        let mut b = [0u8; 2048];
        prop_assert_eq!(p.emit(&mut b).unwrap(), n);
        prop_assert_eq!(&a[..n], &b[..n]);
        Ok(())
    }

    proptest! {
        /// emit -> parse -> emit for a Call with arbitrary credentials.
        #[test]
        fn prop_round_trip_call(xid in any::<u32>(), prog in any::<u32>(), vers in any::<u32>(), proc_ in any::<u32>(), c in any_auth(), v in any_auth()) {
            let repr = Repr { xid, body: MsgBody::Call(CallBody { prog, vers, proc: proc_, cred: make_auth(&c), verf: make_auth(&v) }) };
            check(&repr)?;
        }

        /// emit -> parse -> emit for every kind of Reply.
        #[test]
        fn prop_round_trip_reply(xid in any::<u32>(), v in any_auth(), arm in 0u8..8, low in any::<u32>(), high in any::<u32>(), st in 0usize..15) {
            let data = [
                AcceptedReplyData::Success, AcceptedReplyData::ProgUnavail,
                AcceptedReplyData::ProgMismatch { low, high }, AcceptedReplyData::ProcUnavail,
                AcceptedReplyData::GarbageArgs, AcceptedReplyData::SystemErr,
            ];
            let body = match arm {
                0..=5 => ReplyBody::Accepted(AcceptedReply { verf: make_auth(&v), reply_data: data[arm as usize] }),
                6 => ReplyBody::Denied(RejectedReply::RpcMismatch { low, high }),
                _ => ReplyBody::Denied(RejectedReply::AuthError(AuthStat::ALL[st])),
            };
            check(&Repr { xid, body: MsgBody::Reply(body) })?;
        }

        /// Arbitrary octets never panic; whatever parses re-emits identically.
        #[test]
        fn prop_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            parse_emit_compare(&bytes)?;
        }

        /// Small words after a Call/Reply prefix reach the deep arms.
        #[test]
        fn prop_arbitrary_words(reply in any::<bool>(), ws in proptest::collection::vec(0u32..40, 0..48)) {
            let mut b = vec![0u8, 0, 0, 1, 0, 0, 0, u8::from(reply)];
            if !reply {
                b.extend_from_slice(&RPC_VERSION.to_be_bytes());
            }
            for w in ws {
                b.extend_from_slice(&w.to_be_bytes());
            }
            parse_emit_compare(&b)?;
        }
    }

    fn parse_emit_compare(bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
        if let Ok((repr, len)) = Repr::parse(bytes) {
            prop_assert!(len <= bytes.len());
            prop_assert_eq!(repr.buffer_len(), len);
            let mut out = vec![0u8; len];
            prop_assert_eq!(repr.emit(&mut out).unwrap(), len);
            prop_assert_eq!(&out[..], &bytes[..len]);
        }
        let _ = AuthSys::parse(bytes);
        Ok(())
    }
}
