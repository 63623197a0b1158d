//! `livenessd --metrics-listen ADDR`: the status counters in the Prometheus exposition
//! format (OpenMetrics text), over plain HTTP (`GET /metrics`), for a scraper on this
//! machine. Off unless asked for.
//!
//! Whoever reaches the address can connect, so connections are served side by side, a
//! bounded number at once, and one that sends no request is dropped after a short while,
//! or at once when another connection needs its place: silent connections, however many,
//! never hold up a scrape.
//!
//! Two kinds of values: the ends of sessions (by reason, source and cause, and the
//! death-to-commit latency histogram) are counted by the engine as each `session.ended`
//! event is published ([`EndMetrics`]); everything else is read from the daemon's `status`
//! at each scrape, as `liveness status` shows it. This module only renders them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

use liveness_common::request;
use liveness_common::status::{SourceState, Status};
use liveness_common::wire::wire_name;

use crate::activity::Activities;
use crate::engine::{Caller, EndMetrics, Handle};

/// Connections served at once. When all are taken, the oldest that has not sent its
/// request head yet is dropped for the new one, so that silent connections, however many,
/// never keep a scraper waiting.
const MAX_CONNECTIONS: usize = 16;
/// A connection that has not sent its request head within this long is dropped (a
/// scraper sends it as soon as it connects).
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// A scrape whose answer is not written within this long is dropped.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read.
const MAX_REQUEST: usize = 8192;

/// A connection being served.
#[derive(Debug)]
struct Open {
    task: AbortHandle,
    /// Whether it has sent its request head (then it is answered within [`ANSWER_TIMEOUT`]).
    headed: Arc<AtomicBool>,
}

/// Serves scrapes, each connection in a task of its own (at most [`MAX_CONNECTIONS`]),
/// until `stop` turns true.
/// What a scrape reads: the engine's status, the ends it counted, the sessions' activity.
#[derive(Debug, Clone)]
pub struct Scraped {
    pub engine: Handle,
    pub ends: EndMetrics,
    pub activities: Activities,
}

pub async fn serve(listener: TcpListener, scraped: Scraped, mut stop: watch::Receiver<bool>) {
    let mut tasks = JoinSet::new();
    // Oldest first.
    let mut open: VecDeque<Open> = VecDeque::new();
    loop {
        let stream = tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: cannot accept a connection");
                    continue;
                }
            },
        };
        while tasks.try_join_next().is_some() {}
        open.retain(|conn| !conn.task.is_finished());
        if open.len() >= MAX_CONNECTIONS {
            match open
                .iter()
                .position(|conn| !conn.headed.load(Ordering::Relaxed))
            {
                Some(silent) => {
                    if let Some(conn) = open.remove(silent) {
                        conn.task.abort();
                    }
                    tracing::debug!(
                        "metrics: dropped the oldest connection that sent no request, for a new one"
                    );
                }
                // Every one is being answered, which takes at most ANSWER_TIMEOUT.
                None => {
                    tokio::select! {
                        _ = stop.wait_for(|stop| *stop) => return,
                        _ = tasks.join_next() => {}
                    }
                    open.retain(|conn| !conn.task.is_finished());
                }
            }
        }
        let headed = Arc::new(AtomicBool::new(false));
        let task = tasks.spawn(answer(stream, scraped.clone(), Arc::clone(&headed)));
        open.push_back(Open { task, headed });
    }
}

/// Reads a request head within [`HEAD_TIMEOUT`] and answers it within [`ANSWER_TIMEOUT`].
async fn answer(mut stream: TcpStream, scraped: Scraped, headed: Arc<AtomicBool>) {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => head,
        Ok(Err(e)) => return tracing::debug!(error = %e, "metrics: cannot read a request"),
        Err(_) => return tracing::debug!("metrics: no request within {HEAD_TIMEOUT:?}"),
    };
    headed.store(true, Ordering::Relaxed);
    match tokio::time::timeout(ANSWER_TIMEOUT, respond(stream, &head, &scraped)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "metrics: scrape failed"),
        Err(_) => tracing::debug!("metrics: scrape timed out"),
    }
}

/// The request head, up to its blank line (or [`MAX_REQUEST`] bytes, or the end).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    Ok(head)
}

async fn respond(mut stream: TcpStream, head: &[u8], scraped: &Scraped) -> std::io::Result<()> {
    let (status, content_type, body) = match request_path(head) {
        Some("/metrics") => match ask_status(&scraped.engine).await {
            Some(mut status) => {
                status.activity = scraped.activities.counts();
                (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    render(&status, &scraped.ends),
                )
            }
            None => (
                "503 Service Unavailable",
                "text/plain",
                "livenessd is stopping\n".to_owned(),
            ),
        },
        _ => (
            "404 Not Found",
            "text/plain",
            "livenessd serves GET /metrics only\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The path of a `GET` request head.
fn request_path(head: &[u8]) -> Option<&str> {
    let line = std::str::from_utf8(head).ok()?.lines().next()?;
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["GET", path, version] if version.starts_with("HTTP/") => Some(path),
        _ => None,
    }
}

/// The daemon's status, asked as root would ask it.
async fn ask_status(engine: &Handle) -> Option<Status> {
    engine.ask(Caller::DAEMON, request::Status {}).await.ok()
}

/// The exposition of one scrape.
fn render(status: &Status, ends: &EndMetrics) -> String {
    let mut registry = Registry::with_prefix("liveness");
    let sessions = Family::<Vec<(String, String)>, Gauge>::default();
    for (phase, count) in [
        ("active", status.active_sessions),
        ("ended", status.ended_sessions),
    ] {
        sessions
            .get_or_create(&vec![("phase".to_owned(), phase.to_owned())])
            .set(count as i64);
    }
    registry.register(
        "sessions",
        "Sessions by phase (ended ones as long as retention keeps them)",
        sessions,
    );
    let activity = Family::<Vec<(String, String)>, Gauge>::default();
    for (state, count) in &status.activity {
        activity
            .get_or_create(&vec![("state".to_owned(), wire_name(state))])
            .set(i64::from(*count));
    }
    registry.register(
        "sessions_activity",
        "Live sessions by activity state, as last judged (docs/activity.md)",
        activity,
    );
    registry.register(
        "sessions_ended",
        "Sessions ended since the daemon started, by reason, by the exit source that saw the death and by the kind of its cause",
        ends.ended.clone(),
    );
    registry.register(
        "end_latency_seconds",
        "From an owner's death to the commit of its session's end (millisecond resolution)",
        ends.latency.clone(),
    );
    let counter = |value: u64| {
        let counter = Counter::<u64>::default();
        counter.inc_by(value);
        counter
    };
    let gauge = |value: u64| {
        let gauge = Gauge::<i64>::default();
        gauge.set(value as i64);
        gauge
    };
    let lost: u64 = status
        .monitor
        .sources
        .iter()
        .filter_map(|s| s.stats.as_ref())
        .map(|s| s.lost)
        .sum();
    registry.register(
        "ringbuf_lost",
        "Exits the kernel could not report (eBPF ring buffer full); each loss triggers a re-check",
        counter(lost),
    );
    registry.register(
        "loss_reconciles",
        "Re-checks of every tracked process after a kernel-side loss",
        counter(status.monitor.loss_reconciles),
    );
    registry.register(
        "subscribers",
        "Event stream subscribers connected",
        gauge(status.subscribers),
    );
    registry.register(
        "subscribers_lagged",
        "Subscribers disconnected because they fell behind",
        counter(status.counters.lagged_subscribers),
    );
    registry.register(
        "commits_failed",
        "Commits of finalizations that failed and were retried",
        counter(status.counters.failed_commits),
    );
    registry.register(
        "uncommitted_deaths",
        "Deaths observed whose commit is being retried",
        gauge(status.uncommitted_deaths),
    );
    registry.register(
        "actions_running",
        "End actions marked running",
        gauge(status.actions.running),
    );
    registry.register(
        "actions_waiting",
        "End actions waiting to start, for a slot of their user",
        gauge(status.actions.waiting),
    );
    registry.register(
        "action_outcomes_uncommitted",
        "End action outcomes whose commit is being retried",
        gauge(status.actions.uncommitted_outcomes),
    );
    registry.register(
        "tracked_processes",
        "Owner processes watched",
        gauge(status.monitor.tracked),
    );
    registry.register(
        "event_head_seq",
        "The seq of the last committed event",
        gauge(status.head_seq),
    );
    let sources = Family::<Vec<(String, String)>, Gauge>::default();
    for source in &status.monitor.sources {
        let up = matches!(source.state, SourceState::Active | SourceState::Degraded);
        sources
            .get_or_create(&vec![("source".to_owned(), source.name.to_string())])
            .set(i64::from(up));
    }
    registry.register(
        "source_up",
        "1 for each exit source that is running (active or degraded), 0 otherwise",
        sources,
    );
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        tracing::error!(error = %e, "metrics: cannot encode");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_requests_have_a_path() {
        assert_eq!(
            request_path(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/metrics")
        );
        assert_eq!(request_path(b"POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_path(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(request_path(b"\xff\xfe"), None);
    }
}
