//! Devices, contexts and protection domains (`ibv_device`, `ibv_context`, `ibv_pd`).
//!
//! A device is a transport: the iWARP/TCP device, or a RoCEv2 device on one local address
//! (as `ibv_devices` lists siw and one rxe per netdev). Everything opened on a context —
//! domains, regions, windows, CQs, QPs — is the same type whatever the device.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use softrdma_memory::{KeyTable, PdId};
use softrdma_wire::rocev2::{ROCEV2_UDP_PORT, gid_from_ip};

use crate::Error;
use crate::cq::{BusyPoll, CompletionChannel, Cq};
use crate::event::{AsyncEvent, EventQueue};
use crate::provider::Provider;
use crate::roce::{Ah, RoceConfig, RoceCounters, RoceShared};
use crate::tap::Tap;
use crate::tcp::{IwarpDeviceCounters, TcpShared};

/// Name of the TCP (iWARP) device.
pub const TCP_DEVICE_NAME: &str = "softrdma_tcp0";

/// The transport of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// iWARP (RFC 5040/5041/5044) over TCP.
    Iwarp,
    /// InfiniBand transport over UDP (RoCEv2).
    Roce,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Tcp,
    Roce(RoceConfig),
}

/// What one context may hold at once (`ibv_query_device`'s `max_qp`, `max_mr`,
/// `max_mr_size`, `max_qp_wr`, `max_srq_wr`, `max_cqe`), so that neither a peer nor a
/// runaway application makes it allocate without a limit; reaching one is
/// [`Error::ResourceLimit`] and changes nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Queue pairs.
    pub max_qp: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Octets registered in all regions together (memory the peers may reach).
    pub max_mr_bytes: u64,
    /// Work requests one send or receive queue holds (a QP's `max_send_wr`, `max_recv_wr`).
    pub max_qp_wr: u32,
    /// Work requests one shared receive queue holds.
    pub max_srq_wr: u32,
    /// Entries of one completion queue (completions past them overrun it, see [`Cq`]).
    pub max_cqe: u32,
    /// Octets of one `INLINE` send (a QP's `max_inline_data`).
    pub max_inline_data: u32,
}

impl Default for DeviceLimits {
    /// 16,384 QPs, 65,536 regions, 64 GiB registered, 65,536 requests per queue and per
    /// shared receive queue, 4,194,304 entries per completion queue, 512 octets inline.
    fn default() -> Self {
        DeviceLimits {
            max_qp: 16_384,
            max_mr: 65_536,
            max_mr_bytes: 64 << 30,
            max_qp_wr: 65_536,
            max_srq_wr: 65_536,
            max_cqe: 1 << 22,
            max_inline_data: 512,
        }
    }
}

/// A device (`ibv_device`): a transport driver that contexts are opened on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    name: String,
    kind: Kind,
    limits: DeviceLimits,
    /// The network interface a listed RoCEv2 device's address is on.
    iface: Option<String>,
}

impl Device {
    /// Every device this machine offers (`ibv_get_device_list`): the TCP (iWARP) device,
    /// then a RoCEv2 device per usable local address (every IPv4 address and every IPv6
    /// address that is not link-local), named `softrdma_roce_<interface>` (with `_<n>` for an
    /// interface's further addresses).
    pub fn list() -> Vec<Device> {
        let mut out = vec![Device::tcp()];
        let mut seen: Vec<(String, IpAddr)> = Vec::new();
        if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
            for ifa in addrs {
                let Some(ip) = ifa.address.as_ref().and_then(ip_of) else {
                    continue;
                };
                if let IpAddr::V6(v6) = ip
                    && v6.is_unicast_link_local()
                {
                    continue; // needs a scope id, which a GID cannot carry
                }
                if seen
                    .iter()
                    .any(|(n, a)| *n == ifa.interface_name && *a == ip)
                {
                    continue;
                }
                let n = seen
                    .iter()
                    .filter(|(name, _)| *name == ifa.interface_name)
                    .count();
                let name = match n {
                    0 => format!("softrdma_roce_{}", ifa.interface_name),
                    n => format!("softrdma_roce_{}_{n}", ifa.interface_name),
                };
                seen.push((ifa.interface_name.clone(), ip));
                out.push(Device {
                    name,
                    kind: Kind::Roce(RoceConfig::new(ip)),
                    limits: DeviceLimits::default(),
                    iface: Some(ifa.interface_name.clone()),
                });
            }
        }
        out
    }

    /// The TCP (iWARP) device.
    pub fn tcp() -> Device {
        Device {
            name: TCP_DEVICE_NAME.to_owned(),
            kind: Kind::Tcp,
            limits: DeviceLimits::default(),
            iface: None,
        }
    }

    /// A RoCEv2 device with explicit settings (address, UDP port, buffers).
    pub fn roce(cfg: RoceConfig) -> Device {
        Device {
            name: format!("softrdma_roce_{}", cfg.addr),
            kind: Kind::Roce(cfg),
            limits: DeviceLimits::default(),
            iface: None,
        }
    }

    /// Opens a RoCEv2 context for each of `cfgs` (their ports ignored), all on one UDP port
    /// free on every address: contexts on several addresses of one host that reach each
    /// other (peers are sent to at the context's own port). The port is chosen and bound in
    /// one step, again if another process takes it between the choice and the bind (a port
    /// found free and then opened is a race that parallel tests lose).
    pub fn open_sharing_a_port(cfgs: &[RoceConfig]) -> Result<Vec<Context>, Error> {
        let addrs: Vec<IpAddr> = cfgs.iter().map(|c| c.addr).collect();
        for _ in 0..64 {
            let port = crate::net::spare_ports(&addrs, 1)?;
            let opened: Result<Vec<Context>, Error> = cfgs
                .iter()
                .map(|c| Device::roce(RoceConfig { port, ..*c }).open())
                .collect();
            match opened {
                Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                r => return r,
            }
        }
        Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "no UDP port stayed free on every address",
        )))
    }

    /// The same device, its contexts held to `limits`.
    pub fn with_limits(mut self, limits: DeviceLimits) -> Device {
        self.limits = limits;
        self
    }

    /// What its contexts may hold.
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// The first listed RoCEv2 device on `ip`, or one made for it.
    pub fn roce_on(ip: IpAddr) -> Device {
        Device::list()
            .into_iter()
            .find(|d| d.roce_config().is_some_and(|c| c.addr == ip))
            .unwrap_or_else(|| Device::roce(RoceConfig::new(ip)))
    }

    /// The device's name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network interface of a RoCEv2 device from [`Device::list`] (`None` for the
    /// iWARP device, which any address reaches, and for one made with [`Device::roce`]).
    pub fn interface(&self) -> Option<&str> {
        self.iface.as_deref()
    }

    /// The device's transport.
    pub fn transport(&self) -> Transport {
        match self.kind {
            Kind::Tcp => Transport::Iwarp,
            Kind::Roce(_) => Transport::Roce,
        }
    }

    /// A RoCEv2 device's settings.
    pub fn roce_config(&self) -> Option<&RoceConfig> {
        match &self.kind {
            Kind::Roce(c) => Some(c),
            Kind::Tcp => None,
        }
    }

    /// Opens a context (`ibv_open_device`): a key table and the transport's driver.
    pub fn open(&self) -> Result<Context, Error> {
        let keys = Arc::new(KeyTable::new());
        let events = Arc::new(EventQueue::default());
        let driver = match &self.kind {
            Kind::Tcp => Driver::Tcp(TcpShared::start(keys.clone(), events.clone())?),
            Kind::Roce(cfg) => Driver::Roce(RoceShared::open(cfg, events.clone())?),
        };
        Ok(Context {
            shared: Arc::new(CtxShared {
                device: self.clone(),
                keys,
                events,
                next_pd: AtomicU32::new(1),
                held: Held::default(),
                driver,
            }),
        })
    }
}

fn ip_of(a: &nix::sys::socket::SockaddrStorage) -> Option<IpAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        Some(IpAddr::V4(v4.ip()))
    } else {
        a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
    }
}

/// A device's counters ([`Context::counters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum DeviceCounters {
    /// The iWARP (TCP) device's.
    Iwarp(IwarpDeviceCounters),
    /// A RoCEv2 device's.
    Roce(RoceCounters),
}

/// The transport driver of a context: the one place a provider is chosen.
pub(crate) enum Driver {
    Tcp(Arc<TcpShared>),
    Roce(Arc<RoceShared>),
}

pub(crate) struct CtxShared {
    pub(crate) device: Device,
    pub(crate) keys: Arc<KeyTable>,
    pub(crate) events: Arc<EventQueue>,
    next_pd: AtomicU32,
    /// What the context holds, against the device's limits.
    pub(crate) held: Held,
    pub(crate) driver: Driver,
}

/// Counts of what a context holds ([`DeviceLimits`]).
#[derive(Default)]
pub(crate) struct Held {
    qps: AtomicU64,
    mrs: AtomicU64,
    mr_bytes: AtomicU64,
}

/// One unit of a limited resource, given back when dropped.
pub(crate) struct Claim {
    ctx: Arc<CtxShared>,
    what: Resource,
    n: u64,
}

#[derive(Clone, Copy)]
pub(crate) enum Resource {
    Qp,
    Mr,
}

/// `n` within the limit `max` of `what`.
fn within(n: u32, max: u32, what: &'static str) -> Result<(), Error> {
    match n > max {
        true => Err(Error::ResourceLimit {
            what,
            limit: u64::from(max),
        }),
        false => Ok(()),
    }
}

impl CtxShared {
    /// Refuses queue depths past the device's `max_qp_wr` (`srq`: `max_srq_wr`).
    pub(crate) fn check_depths(&self, depths: &[u32], srq: bool) -> Result<(), Error> {
        let l = self.device.limits;
        let (max, what) = match srq {
            true => (l.max_srq_wr, "work requests per shared receive queue"),
            false => (l.max_qp_wr, "work requests per queue"),
        };
        within(depths.iter().copied().max().unwrap_or(0), max, what)
    }

    /// Refuses a QP's inline octets past the device's `max_inline_data`.
    pub(crate) fn check_inline(&self, len: u32) -> Result<(), Error> {
        within(len, self.device.limits.max_inline_data, "octets inline")
    }

    /// Takes a QP or an MR of `bytes` octets from the limits, or says which one is reached.
    pub(crate) fn claim(self: &Arc<Self>, what: Resource, bytes: u64) -> Result<Claim, Error> {
        let l = self.device.limits;
        let take = |c: &AtomicU64, n: u64, max: u64, name: &'static str| {
            c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                v.checked_add(n).filter(|&t| t <= max)
            })
            .map(|_| ())
            .map_err(|_| Error::ResourceLimit {
                what: name,
                limit: max,
            })
        };
        match what {
            Resource::Qp => take(&self.held.qps, 1, u64::from(l.max_qp), "QPs")?,
            Resource::Mr => {
                take(&self.held.mrs, 1, u64::from(l.max_mr), "memory regions")?;
                if let Err(e) = take(
                    &self.held.mr_bytes,
                    bytes,
                    l.max_mr_bytes,
                    "registered octets",
                ) {
                    self.held.mrs.fetch_sub(1, Ordering::AcqRel);
                    return Err(e);
                }
            }
        }
        Ok(Claim {
            ctx: self.clone(),
            what,
            n: bytes,
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let h = &self.ctx.held;
        match self.what {
            Resource::Qp => {
                h.qps.fetch_sub(1, Ordering::AcqRel);
            }
            Resource::Mr => {
                h.mrs.fetch_sub(1, Ordering::AcqRel);
                h.mr_bytes.fetch_sub(self.n, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for CtxShared {
    fn drop(&mut self) {
        self.provider().close();
    }
}

impl CtxShared {
    /// What the API asks of the transport.
    pub(crate) fn provider(&self) -> &dyn Provider {
        match &self.driver {
            Driver::Tcp(p) => p,
            Driver::Roce(p) => p,
        }
    }

    #[cfg(test)]
    pub(crate) fn tcp(&self) -> Result<&Arc<TcpShared>, Error> {
        match &self.driver {
            Driver::Tcp(t) => Ok(t),
            Driver::Roce(_) => Err(Error::Unsupported("an iWARP (TCP) operation")),
        }
    }

    pub(crate) fn roce(&self) -> Result<&Arc<RoceShared>, Error> {
        match &self.driver {
            Driver::Roce(r) => Ok(r),
            Driver::Tcp(_) => Err(Error::Unsupported("a RoCE operation")),
        }
    }
}

/// An open device (`ibv_context`): owns the key table (keys of every region and window
/// registered through it) and the transport's driver — the iWARP progress thread and its
/// connections, or the RoCEv2 UDP socket and its receive thread. Cheap to clone; the driver
/// stops when the last handle to the context or to anything created from it is gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<CtxShared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.shared.device.name)
            .finish()
    }
}

impl Context {
    /// Opens the TCP (iWARP) device.
    pub fn open() -> Result<Context, Error> {
        Device::tcp().open()
    }

    /// Opens a RoCEv2 device with `cfg` (`ibv_open_device` on an rxe device).
    pub fn open_roce(cfg: RoceConfig) -> Result<Context, Error> {
        Device::roce(cfg).open()
    }

    /// Hands everything this context's transport sends and receives to `tap` from now on
    /// (TCP connections opened later, every RoCEv2 datagram): what the `--pcap` options of
    /// the tools write. Set once, before connecting; `false` if a tap was already set.
    pub fn set_tap(&self, tap: Arc<dyn Tap>) -> bool {
        self.shared.provider().settings().tap.set(tap)
    }

    /// How the background thread polls after what arrives for it (a peer's Writes, Sends,
    /// requests) before it sleeps: by default adaptive up to 50 µs, learnt from the gaps
    /// between arrivals, so a stream or a ping-pong costs no wake-up per piece
    /// (`docs/progress.md`, flow polls). On a host with more busy threads than cores a poll
    /// takes its core from the thread that would send the next piece: `BusyPoll::Off`
    /// there, as for a CQ ([`Cq::set_busy_poll`](crate::Cq::set_busy_poll)).
    pub fn set_background_poll(&self, mode: BusyPoll) {
        self.shared.provider().settings().background_poll.set(mode)
    }

    /// The background thread's poll ([`Context::set_background_poll`]).
    pub fn background_poll(&self) -> BusyPoll {
        self.shared.provider().settings().background_poll.get()
    }

    /// The device's counters (`rdma statistic`): the iWARP driver's connections and
    /// octets, or the RoCE socket's datagrams and its connection manager. Per QP:
    /// [`Qp::counters`](crate::Qp::counters).
    pub fn counters(&self) -> DeviceCounters {
        match &self.shared.driver {
            Driver::Tcp(t) => DeviceCounters::Iwarp(t.stats.snapshot()),
            Driver::Roce(r) => DeviceCounters::Roce(r.counters()),
        }
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// The context's transport.
    pub fn transport(&self) -> Transport {
        self.shared.device.transport()
    }

    /// The context's key table (every STag of its regions and windows).
    pub fn key_table(&self) -> &KeyTable {
        &self.shared.keys
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Pd {
        Pd {
            ctx: self.shared.clone(),
            id: PdId(self.shared.next_pd.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel, Error> {
        CompletionChannel::new()
    }

    /// Creates a completion queue of `cqe` entries reporting to `channel`
    /// (`ibv_create_cq`); more entries than the device's `max_cqe` is
    /// [`Error::ResourceLimit`]. Entries are not allocated up front.
    pub fn create_cq(&self, cqe: usize, channel: Option<&CompletionChannel>) -> Result<Cq, Error> {
        let max = self.shared.device.limits.max_cqe;
        if cqe > max as usize {
            return Err(Error::ResourceLimit {
                what: "completion queue entries",
                limit: u64::from(max),
            });
        }
        Ok(Cq::new(cqe, channel, Some(self.shared.events.clone())))
    }

    /// The next asynchronous event, without blocking.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.try_pop()
    }

    /// Blocks for the next asynchronous event (`ibv_get_async_event`); `None` after
    /// `timeout`.
    pub fn get_async_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.shared.events.pop_timeout(timeout)
    }

    /// The next asynchronous event, once there is one (async
    /// [`get_async_event`](Self::get_async_event); cancel-safe): connections established and
    /// disconnected, Terminates, errors.
    pub async fn next_async_event(&self) -> AsyncEvent {
        self.shared.events.pop_async().await
    }

    /// The GID of a RoCE context (`ibv_query_gid`): the IPv4-mapped or IPv6 address it
    /// listens on.
    pub fn roce_gid(&self) -> Result<[u8; 16], Error> {
        Ok(gid_from_ip(self.shared.roce()?.local.ip()))
    }

    /// The socket address RoCE datagrams arrive at.
    pub fn roce_local_addr(&self) -> Result<SocketAddr, Error> {
        Ok(self.shared.roce()?.local)
    }

    /// The receive buffer the kernel granted a RoCE context's socket (octets of kernel
    /// memory, `SO_RCVBUF` as read back).
    pub fn roce_recv_buffer(&self) -> Result<usize, Error> {
        Ok(self.shared.roce()?.rcvbuf)
    }

    /// Whether IPv4 datagrams leave through the raw socket (exact ICRC for strict peers) or
    /// the UDP socket (see [`RawTx`](crate::roce::RawTx)).
    pub fn roce_raw_tx(&self) -> Result<bool, Error> {
        Ok(self.shared.roce()?.raw.is_some())
    }

    /// Driver counters of a RoCE context.
    pub fn roce_counters(&self) -> Result<RoceCounters, Error> {
        Ok(self.shared.roce()?.counters())
    }
}

/// A protection domain (`ibv_pd`): regions, windows, QPs and SRQs of one domain may be used
/// together. Cheap to clone.
#[derive(Clone)]
pub struct Pd {
    pub(crate) ctx: Arc<CtxShared>,
    pub(crate) id: PdId,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pd").field(&self.id.0).finish()
    }
}

impl Pd {
    /// The domain's id in the key table.
    pub fn id(&self) -> PdId {
        self.id
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> Context {
        Context {
            shared: self.ctx.clone(),
        }
    }

    /// Creates an address handle for UD sends to `ip` on port 4791 (`ibv_create_ah`); RoCE
    /// only. Dropping the handle (its last clone) destroys it (`ibv_destroy_ah`).
    pub fn create_ah(&self, ip: IpAddr) -> Result<Ah, Error> {
        self.create_ah_port(SocketAddr::new(ip, ROCEV2_UDP_PORT))
    }

    /// As [`Pd::create_ah`] with a UDP port other than 4791 (tests on one host).
    pub fn create_ah_port(&self, addr: SocketAddr) -> Result<Ah, Error> {
        self.ctx.roce()?.create_ah(addr)
    }
}
