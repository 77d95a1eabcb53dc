//! Sans-IO iWARP engine (in progress).

pub mod rdmap;
pub mod verbs_types;
pub mod framing;
pub mod startup;
