//! `fleet` and `fleet_watch` on a connection: answered from etcd by a daemon with
//! `--etcd` (see [`crate::fleet::FleetReader`]); a watch keeps the connection, as a
//! subscription does, until the client or the daemon leaves.

use tokio::io::AsyncWrite;
use tokio::sync::watch;

use super::framing::{ConnectionError, Requests, write_json, write_lines};
use super::{goodbye, stopping};
use crate::engine::Caller;
use crate::fleet::FleetReader;
use liveness_common::fleet::FleetView;
use liveness_common::protocol::{ErrorBody, ErrorCode, Reply, StreamMessage};
use liveness_common::request;

/// The fleet's reader, or why there is none.
pub(super) fn in_fleet(fleet: Option<&FleetReader>) -> Result<&FleetReader, ErrorBody> {
    fleet.ok_or_else(|| {
        ErrorBody::new(
            ErrorCode::InvalidRequest,
            "the fleet's view needs a daemon in a fleet: this livenessd runs without --etcd",
        )
    })
}

/// `fleet`.
pub(super) async fn view(
    fleet: Option<&FleetReader>,
    caller: Caller,
    request: request::Fleet,
) -> Result<FleetView, ErrorBody> {
    in_fleet(fleet)?.view(caller, &request).await
}

/// `fleet_watch`: the reply (the view, without `since`), then a `fleet_change` line per
/// change until the client closes, etcd ends the watch, or the daemon stops.
pub(super) async fn follow<W: AsyncWrite + Unpin>(
    fleet: Option<&FleetReader>,
    caller: Caller,
    id: Option<serde_json::Value>,
    request: request::FleetWatch,
    requests: Requests,
    mut write: W,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let started = async {
        let fleet = in_fleet(fleet)?;
        let (view, since) = match request.since {
            Some(since) if since < 0 => {
                return Err(ErrorBody::new(
                    ErrorCode::InvalidRequest,
                    "`since` is a revision etcd sent: 0 or more",
                ));
            }
            Some(since) => (None, since),
            None => {
                let labels = request.labels.clone();
                let view = fleet.view(caller, &request::Fleet { labels }).await?;
                let since = view.revision;
                (Some(view), since)
            }
        };
        let watch = fleet.watch(caller, since, request.labels).await?;
        Ok::<_, ErrorBody>((view, watch))
    };
    let (view, mut changes) = match started.await {
        Ok(started) => started,
        Err(error) => {
            let reply = Reply {
                id,
                ..Reply::from(error)
            };
            return write_json(&mut write, &reply).await;
        }
    };
    let reply = Reply {
        id,
        fleet: view,
        ..Reply::ok()
    };
    write_json(&mut write, &reply).await?;
    loop {
        let next = tokio::select! {
            next = changes.next() => next,
            () = requests.closed() => return Ok(()),
            () = stopping(shutdown) => return write_json(&mut write, &goodbye()).await,
        };
        let lines = match next {
            Ok(Some(changes)) => changes
                .into_iter()
                .map(|change| serde_json::to_string(&StreamMessage::FleetChange(Box::new(change))))
                .collect::<Result<Vec<_>, _>>()
                .map_err(std::io::Error::other)?,
            Ok(None) | Err(_) => {
                let reason = match next {
                    Err(error) => format!("etcd ended the watch: {error}"),
                    _ => "etcd ended the watch".to_owned(),
                };
                return write_json(&mut write, &StreamMessage::Goodbye { reason }).await;
            }
        };
        write_lines(&mut write, &lines).await?;
    }
}
