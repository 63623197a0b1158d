//! What a subscriber is sent of the event log: the filter it asked for, and the replay of
//! stored events as the stream's lines.

use std::sync::LazyLock;

use super::reader::EventReader;
use super::{EventPage, StoreError, StoredEvent};
use liveness_common::protocol::StreamMessage;
use rusqlite::{Connection, Row, named_params};

/// Which events a subscriber gets: one test, applied in SQL to a replay (where the index
/// of events by session serves it) and in memory to live events ([`EventFilter::admits`]).
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only events written under this session id.
    pub session: Option<String>,
    /// Only events of sessions registered by this uid.
    pub creator_uid: Option<u32>,
}

impl EventFilter {
    /// The filter over the `events` table, with its values bound as `:session` and
    /// `:creator_uid`.
    const SQL: &'static str = "(:session IS NULL OR session = :session) \
         AND (:creator_uid IS NULL OR creator_uid = :creator_uid)";

    /// Whether the filter admits an event of `session`, registered by `creator_uid`.
    pub fn admits(&self, session: &str, creator_uid: u32) -> bool {
        self.session
            .as_deref()
            .is_none_or(|wanted| wanted == session)
            && self.creator_uid.is_none_or(|uid| uid == creator_uid)
    }
}

/// The stored events after `:since` that the filter admits, oldest first, at most `:limit`.
pub(super) static EVENTS_AFTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT seq, body FROM events WHERE seq > :since AND {} ORDER BY seq LIMIT :limit",
        EventFilter::SQL
    )
});

/// One page of a replay (see [`EventReader::replay`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayPage {
    /// Stream lines, without their newlines: an `{"event": ...}` for each event, or one
    /// `gap` where retention deleted events the subscriber asked for.
    pub lines: Vec<String>,
    /// Where the next page starts, `None` once the replay is done.
    pub next: Option<u64>,
}

impl EventReader {
    /// The stream lines of at most `limit` events after `after` and up to `through` that
    /// `filter` admits.
    pub fn replay(
        &self,
        after: u64,
        through: u64,
        filter: &EventFilter,
        limit: usize,
    ) -> Result<ReplayPage, StoreError> {
        Ok(match events_after(&self.conn, after, limit, filter)? {
            EventPage::Gap {
                requested_since,
                pruned_through,
            } => {
                let gap = StreamMessage::Gap {
                    since: requested_since,
                    pruned_through,
                };
                ReplayPage {
                    lines: vec![serde_json::to_string(&gap)?],
                    next: (pruned_through < through).then_some(pruned_through),
                }
            }
            EventPage::Events(page) => {
                let newest = page.last().map_or(through, |e| e.seq);
                let lines = page
                    .into_iter()
                    .take_while(|e| e.seq <= through)
                    .map(|StoredEvent { body, .. }| format!("{{\"event\":{body}}}"))
                    .collect();
                ReplayPage {
                    lines,
                    next: (newest < through).then_some(newest),
                }
            }
        })
    }
}

pub(super) fn events_after(
    conn: &Connection,
    since: u64,
    limit: usize,
    filter: &EventFilter,
) -> Result<EventPage, StoreError> {
    // One read transaction: the gap check and the rows come from the same snapshot, so a
    // prune committed in between cannot delete events unnoticed.
    let tx = conn.unchecked_transaction()?;
    let pruned_through: i64 = tx
        .prepare_cached("SELECT value FROM meta WHERE key = 'pruned_through'")?
        .query_row([], |r| r.get(0))?;
    let pruned_through = pruned_through as u64;
    if since < pruned_through {
        return Ok(EventPage::Gap {
            requested_since: since,
            pruned_through,
        });
    }
    let since = i64::try_from(since).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let row = |r: &Row<'_>| {
        Ok(StoredEvent {
            seq: r.get::<_, i64>(0)? as u64,
            body: r.get(1)?,
        })
    };
    let events = tx
        .prepare_cached(&EVENTS_AFTER)?
        .query_map(
            named_params! {
                ":since": since,
                ":limit": limit,
                ":session": filter.session,
                ":creator_uid": filter.creator_uid,
            },
            row,
        )?
        .collect::<Result<_, _>>()?;
    Ok(EventPage::Events(events))
}
