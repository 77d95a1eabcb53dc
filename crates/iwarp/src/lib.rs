//! Sans-IO iWARP engine: MPA startup ([`startup`]), FPDU framing ([`framing`]),
//! the DDP/RDMAP data path of a queue pair ([`rdmap`]) and the connection that
//! ties them together ([`connection`]).

pub mod connection;
pub mod framing;
pub mod rdmap;
pub mod startup;
pub mod verbs_types;
