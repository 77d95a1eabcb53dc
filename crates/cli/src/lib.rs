//! softrdma command-line tools, as a library so tests can drive them.

pub mod decode;
