//! The ends of sessions counted as they are published, by reason, source and cause, with
//! their death-to-commit latency: what `--metrics-listen` serves beside the status counters.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use liveness_common::cause::CauseKind;
use liveness_common::session::{Event, EventKind};
use liveness_common::wire::wire_name;

use super::eventlog::end_latency_ms;

/// The end-to-end latency buckets, in seconds: from a death (the kernel's time where the
/// source reads it) to the commit of its session's end. Millisecond resolution.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndLabels {
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
    pub ended: Family<EndLabels, Counter>,
    pub latency: Histogram,
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
    pub(super) fn record(&self, event: &Event) {
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
        if let Some(latency_ms) = end_latency_ms(event) {
            self.latency.observe(latency_ms as f64 / 1000.0);
        }
    }
}
