//! `livenessd --metrics-listen ADDR`: the status counters in the Prometheus exposition
//! format (OpenMetrics text), over plain HTTP (`GET /metrics`), for a scraper on this
//! machine. Off unless asked for.
//!
//! Two kinds of values: the ends of sessions (by reason and source, and the death-to-commit
//! latency histogram) are counted as each `session.ended` event is published; everything
//! else is read from the daemon's `status` at each scrape, as `liveness status` shows it.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

use liveness_common::cause::CauseKind;
use liveness_common::protocol::{Request, wire_name};
use liveness_common::request;
use liveness_common::session::{Event, EventKind};
use liveness_common::status::{SourceState, Status};

use crate::engine::{Caller, Command};

/// The end-to-end latency buckets, in seconds: from a death (the kernel's time where the
/// source reads it) to the commit of its session's end. Millisecond resolution.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// A scraper that does not send its request, or read the answer, within this long is
/// dropped (scrapes are served one at a time).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read.
const MAX_REQUEST: usize = 8192;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabels {
    reason: String,
    /// The exit source that saw the death; `none` for ends no source saw (`stopped`,
    /// `timeout`, `pending_expired`).
    source: String,
    /// The kind of the ending's cause: exit, signal, oom, hangup, unknown, none.
    cause: String,
}

/// Counted as ends are published; cheap clones share the counts.
#[derive(Debug, Clone)]
pub struct EndMetrics {
    ended: Family<EndLabels, Counter>,
    latency: Histogram,
}

impl Default for EndMetrics {
    fn default() -> EndMetrics {
        EndMetrics {
            ended: Family::default(),
            latency: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

impl EndMetrics {
    /// Counts a published event if it is a session's end.
    pub fn record(&self, event: &Event) {
        if event.kind != EventKind::Ended {
            return;
        }
        let source = event
            .detected_by
            .map_or_else(|| "none".to_owned(), wire_name);
        self.ended
            .get_or_create(&EndLabels {
                reason: wire_name(event.reason),
                source,
                cause: event
                    .cause
                    .as_ref()
                    .map_or(CauseKind::Unknown, |cause| cause.kind())
                    .name()
                    .to_owned(),
            })
            .inc();
        if let Some(died) = event.died_ms.or(event.observed_ms) {
            self.latency
                .observe((event.at_ms - died).max(0) as f64 / 1000.0);
        }
    }
}

/// Serves scrapes until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    engine: mpsc::Sender<Command>,
    ends: EndMetrics,
    mut stop: watch::Receiver<bool>,
) {
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
        match tokio::time::timeout(SCRAPE_TIMEOUT, answer(stream, &engine, &ends)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "metrics: scrape failed"),
            Err(_) => tracing::debug!("metrics: scrape timed out"),
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    engine: &mpsc::Sender<Command>,
    ends: &EndMetrics,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let (status, content_type, body) = match request_path(&head) {
        Some("/metrics") => match ask_status(engine).await {
            Some(status) => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                render(&status, ends),
            ),
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
async fn ask_status(engine: &mpsc::Sender<Command>) -> Option<Status> {
    let (reply, answer) = oneshot::channel();
    let command = Command::Request {
        caller: Caller { uid: 0, pid: 0 },
        request: Box::new(Request::Status(request::Status {})),
        fds: Vec::new(),
        reply,
    };
    engine.send(command).await.ok()?;
    answer.await.ok()?.status.map(|status| *status)
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
