//! The library half of the `liveness` command: what its commands do that is worth testing
//! on its own, starting with the agent adapters of `liveness hooks` ([`hooks`]).

pub mod hooks;
