//! The Unix socket server: one task per connection, all owned by a `JoinSet`.
//!
//! - [`listener`]: accepts connections and admits each under its uid's limits.
//! - [`framing`]: request lines within bounds, with the descriptors sent with them; lines
//!   written within a timeout.
//! - [`connection`]: the request loop, and the one route of each request: to what the
//!   connection serves itself, or to the engine in one of its uid's turns.
//! - [`reads`]: what is read off the engine (listings, trees, ancestries), whose size a
//!   client chooses.
//! - [`locks`]: a `lock_acquire`, and the wait of one that waits.
//! - [`stream`]: a subscription, its replay and its live events.
//! - [`reply`]: the wire's reply to each answer.

use tokio::sync::watch;

use liveness_common::protocol::StreamMessage;

mod connection;
mod fleet;
mod framing;
mod listener;
mod locks;
mod reads;
mod reply;
mod stream;

pub use listener::serve;
pub use reads::Readers;

/// What every connection is told when the daemon stops.
fn goodbye() -> StreamMessage {
    StreamMessage::Goodbye {
        reason: "shutdown".into(),
    }
}

/// Resolves once shutdown is requested (without holding the watch guard across awaits).
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = shutdown.wait_for(|stop| *stop).await;
}
