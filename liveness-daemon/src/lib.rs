//! liveness: learn from the kernel when the process that owns a session dies, finalize the
//! session durably, and tell every interested tool.
//!
//! The binaries `livenessd` and `liveness` are thin; the logic lives in these modules.

pub mod cli;
pub mod client;
pub mod daemon;
pub mod engine;
pub mod fdpass;
pub mod identity;
pub mod limits;
pub mod namespace;
pub mod paths;
pub mod protocol;
pub mod server;
pub mod source;
pub mod store;
