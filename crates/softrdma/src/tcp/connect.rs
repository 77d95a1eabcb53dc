//! Connecting an iWARP QP: the TCP connect (here, or by the progress thread for a task),
//! the initiator's MPA settings, and waiting for the thread's answer.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_iwarp::startup::{Rtr, RtrSet, Startup, StartupConfig};

use super::{Cmd, TcpQp, TcpShared, prepare_stream};
use crate::Error;
use crate::connparams::{ConnectParams, ConnectionInfo};

/// Extra time a blocking call waits beyond the MPA timeout before giving up on the
/// progress thread (a safety net, not a protocol timer).
const REPLY_GRACE: Duration = Duration::from_secs(5);

impl TcpShared {
    /// TCP connect, then MPA negotiation as initiator run by the progress thread
    /// (`rdma_connect`); the QP is `Connecting`.
    pub(crate) fn connect(
        &self,
        qp: &Arc<TcpQp>,
        addr: impl ToSocketAddrs,
        params: &ConnectParams,
    ) -> Result<ConnectionInfo, Error> {
        let start = Instant::now();
        let cfg = startup_config(params)?;
        let stream = crate::net::connect(addr, params.timeout)?;
        let emss = prepare_stream(&stream)?;
        let remaining = params.timeout.saturating_sub(start.elapsed());
        let (reply, rx) = oneshot::channel();
        self.command(Cmd::Connect {
            qp: qp.clone(),
            stream: mio::net::TcpStream::from_std(stream),
            startup: StartupConfig {
                timeout: remaining,
                ..cfg
            },
            started: Instant::now(),
            emss,
            fpdu: params.iwarp.fpdu,
            reply,
        })?;
        wait_reply(rx, params.timeout)
    }

    /// [`connect`](Self::connect) for a task: the progress thread makes the TCP connection
    /// too; the answer comes on the returned channel.
    pub(crate) fn dial(
        &self,
        qp: &Arc<TcpQp>,
        addr: SocketAddr,
        params: &ConnectParams,
    ) -> Result<oneshot::Receiver<Result<ConnectionInfo, Error>>, Error> {
        let (reply, rx) = oneshot::channel();
        self.command(Cmd::Dial {
            qp: qp.clone(),
            addr,
            startup: startup_config(params)?,
            started: Instant::now(),
            fpdu: params.iwarp.fpdu,
            reply,
        })?;
        Ok(rx)
    }
}

/// The initiator's MPA settings, checked before anything touches the network.
fn startup_config(params: &ConnectParams) -> Result<StartupConfig, Error> {
    let cfg = StartupConfig {
        rev: params.iwarp.rev,
        crc: params.iwarp.crc,
        markers: params.iwarp.markers,
        ird: params.ird,
        ord: params.ord,
        p2p: params
            .iwarp
            .p2p
            .then_some(RtrSet::only(Rtr::ZeroLengthWrite)),
        private_data: params.private_data.clone(),
        timeout: params.timeout,
        allow_early_fpdus: true,
    };
    Startup::initiator(cfg.clone(), Instant::now())?;
    Ok(cfg)
}

/// Closes the connection of an iWARP `connect` or `accept` whose task stopped waiting
/// (`None` once the answer was seen).
pub(crate) struct Abandon<'a>(pub(crate) &'a TcpShared, pub(crate) Option<Arc<TcpQp>>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.1.take() {
            let _ = self.0.command(Cmd::Disconnect(q));
        }
    }
}

/// Waits for the progress thread's answer to a blocking command.
pub(crate) fn wait_reply<T>(
    rx: oneshot::Receiver<Result<T, Error>>,
    timeout: Duration,
) -> Result<T, Error> {
    match rx.recv_timeout(timeout + REPLY_GRACE) {
        Ok(r) => r,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::ContextClosed),
    }
}

/// The progress thread's answer, awaited by a task.
pub(crate) async fn reply_async<T>(rx: oneshot::Receiver<Result<T, Error>>) -> Result<T, Error> {
    rx.await.unwrap_or(Err(Error::ContextClosed))
}
