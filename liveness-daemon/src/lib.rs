//! livenessd: learn from the kernel when the process that owns a session dies, finalize the
//! session durably, and tell every interested tool.
//!
//! The binary `livenessd` is thin; the logic lives in these modules. The vocabulary they
//! speak is `liveness_common`'s, the process facts they read `liveness_proc`'s.

pub mod action;
pub mod closer;
pub mod daemon;
pub mod engine;
pub mod faults;
pub mod fdpass;
pub mod limits;
pub mod metrics;
pub mod offload;
pub mod reap;
pub mod server;
pub mod source;
pub mod store;
pub mod systemd;
pub mod trust;
