//! No user starves another, nor root: what each uid may hold and how much of the daemon's
//! time it gets, in one place.
//!
//! - [`limits`]: connections, requests in flight, half-sent lines, sessions and label bytes
//!   per uid.
//! - [`turns`]: at most a few works of each user at once (client-sized reads, end actions).
//! - [`offload`]: who gets the CPU first, and each user's turns on the blocking pool.
//! - [`pacing`]: each user's share of the engine's time.
//! - [`closer`]: what clients hand the daemon is closed on their own uid's thread, where no
//!   one else waits for it.

pub mod closer;
pub mod limits;
pub mod offload;
pub mod pacing;
pub mod turns;
