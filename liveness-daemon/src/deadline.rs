//! Waiting for a deadline that may not be set, as a `select!` branch.

use tokio::time::Instant;

/// Sleeps until `at`; without one, never returns.
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
