//! Sans-IO iWARP engine: MPA startup ([`startup`]), FPDU framing ([`framing`]),
//! the DDP/RDMAP data path of a queue pair ([`rdmap`]) and the connection that
//! ties them together ([`connection`]).

pub mod connection;
pub mod framing;
pub mod rdmap;
pub mod startup;
/// The work request / completion types, shared with the InfiniBand engine.
pub use softrdma_verbs_types as verbs_types;
