//! The vocabulary of liveness: what the daemon and its clients say to each other. This crate is the single source of truth for the wire protocol described in
//! `docs/protocol.md`; it depends on serde and nothing of the daemon.
//!
//! - [`action`]: end actions, the facts they are given and their outcomes.
//! - [`activity`]: what a live session is doing: its declared phase, its judged state.
//! - [`identity`]: process fingerprints ([`identity::Identity`]).
//! - [`duration`]: durations on command lines (`500ms`, `30s`, `2m`).
//! - [`exit`]: how a process ended ([`exit::ExitStatus`]) and what noticed it.
//! - [`cause`]: why it died and what it cost ([`cause::Cause`], [`cause::Usage`]).
//! - [`end`]: why a session ended, and the survivors of its tree.
//! - [`fleet`]: the fleet's hosts and sessions, as etcd holds them (`livenessd --etcd`).
//! - [`session`]: sessions and the events of the stream.
//! - [`lock`]: locks held by sessions, with fencing tokens.
//! - [`protocol`]: the request enum, replies, errors and stream messages.
//! - [`request`]: each request, a type of its own.
//! - [`status`]: what the daemon reports about itself.

pub mod action;
pub mod activity;
pub mod cause;
pub mod duration;
pub mod end;
pub mod exit;
pub mod fleet;
pub mod identity;
pub mod lock;
pub mod protocol;
pub mod request;
pub mod session;
pub mod status;
pub mod wire;
