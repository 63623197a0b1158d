//! livenessd: learn from the kernel when the process that owns a session dies, finalize the
//! session durably, and tell every interested tool.
//!
//! The binary `livenessd` is thin: it calls [`main`]. The modules are the daemon's own
//! (docs/architecture.md maps them); what other crates use is re-exported here: the exit
//! monitor (the benchmark measures its floor, the integration tests its sources), the
//! store (a test opens a fresh database with it) and the journal with what builds its
//! entries (the benchmark leaves a killed daemon's journal behind, to time its replay). The vocabulary the modules speak is
//! `liveness_common`'s, the process facts they read `liveness_proc`'s.

mod action;
mod activity;
mod cgroup;
mod daemon;
mod deadline;
mod engine;
mod fair;
mod faults;
mod fd;
mod fleet;
mod metrics;
mod reap;
mod server;
mod source;
mod store;
mod systemd;
mod trust;

pub use daemon::main;
pub use source::ExitObservation;
pub use source::ebpf::EbpfConfig;
pub use source::monitor::{Monitor, MonitorConfig, Selection};
pub use store::{Active, NewSession, OwnerDeath, Store, journal, journal_deaths};
