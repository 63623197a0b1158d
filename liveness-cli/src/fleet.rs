//! `liveness fleet` and `liveness fleet watch`: the fleet's view, which the local daemon
//! reads from etcd (the CLI links no etcd client).

use std::process::ExitCode;

use liveness_client::liveness_common::fleet::{FleetChange, FleetChangeKind, FleetView};
use liveness_client::liveness_common::protocol::StreamMessage;
use liveness_client::liveness_common::session::Session;
use liveness_client::liveness_common::wire::wire_name;

use crate::args::{FleetArgs, FleetCommand, FleetWatchArgs};
use crate::clock;
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::render::{describe_labels, print_table};

impl FleetArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        if let Some(FleetCommand::Watch(args)) = &self.command {
            return args.execute(context);
        }
        let view = context.connect()?.fleet(self.labels.to_map())?;
        if context.json {
            output::json(&view);
        } else {
            print_fleet(&view, !self.labels.labels.is_empty());
        }
        Ok(Exit::Ok.into())
    }
}

impl FleetWatchArgs {
    /// The view first (without `--since`), then one line per change until the daemon
    /// stops or etcd ends the watch.
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let mut watch = context
            .connect()?
            .fleet_watch(self.since, self.labels.to_map())?;
        if let Some(view) = &watch.view {
            if context.json {
                output::json(view);
            } else {
                print_fleet(view, !self.labels.labels.is_empty());
            }
        }
        loop {
            match watch.next_message()? {
                StreamMessage::FleetChange(change) if context.json => output::json(&change),
                StreamMessage::FleetChange(change) => outln!("{}", describe_change(&change)),
                StreamMessage::Goodbye { reason } => {
                    let message = format!("the daemon ended the watch: {reason}");
                    return Err(Failure::new(Exit::Unavailable, message));
                }
                _ => {}
            }
        }
    }
}

/// One row per session, and one for a host without any.
fn print_fleet(view: &FleetView, filtered: bool) {
    if view.hosts.is_empty() {
        outln!(
            "No hosts{}. Each daemon started with --etcd joins the fleet.",
            if filtered {
                " have matching sessions"
            } else {
                ""
            }
        );
        return;
    }
    let now = clock::now_ms();
    let mut rows: Vec<[String; 7]> = Vec::new();
    for host in &view.hosts {
        let state = match (host.online, host.since_ms) {
            (true, Some(since)) => {
                format!(
                    "online for {}",
                    clock::span(now.saturating_sub(since).max(0) as u64)
                )
            }
            (true, None) => "online".to_owned(),
            (false, Some(seen)) => format!("offline, seen {}", clock::age(seen, now)),
            (false, None) => "offline".to_owned(),
        };
        let name = match &host.hostname {
            Some(hostname) if *hostname != host.host_id => format!("{} ({hostname})", host.host_id),
            _ => host.host_id.clone(),
        };
        if host.sessions.is_empty() {
            let none = || String::new();
            rows.push([
                name.clone(),
                state.clone(),
                "-".into(),
                none(),
                none(),
                none(),
                none(),
            ]);
        }
        for session in &host.sessions {
            let [id, uid, owner, activity, labels] = session_cells(session);
            rows.push([
                name.clone(),
                state.clone(),
                id,
                uid,
                owner,
                activity,
                labels,
            ]);
        }
    }
    print_table(
        [
            "HOST", "STATE", "SESSION", "UID", "OWNER", "ACTIVITY", "LABELS",
        ],
        &rows,
    );
}

fn session_cells(session: &Session) -> [String; 5] {
    let activity = match &session.activity {
        Some(activity) => wire_name(activity.state),
        None => "-".to_owned(),
    };
    [
        session.id.clone(),
        session.creator_uid.to_string(),
        format!("{} {}", session.owner.pid, session.owner.comm),
        activity,
        describe_labels(&session.labels),
    ]
}

/// `REV KIND HOST …`, one line.
fn describe_change(change: &FleetChange) -> String {
    let what = match change.change {
        FleetChangeKind::Online => match &change.hostname {
            Some(hostname) => format!("online ({hostname})"),
            None => "online".to_owned(),
        },
        FleetChangeKind::Offline => "offline".to_owned(),
        FleetChangeKind::Session | FleetChangeKind::Ended | FleetChangeKind::Gone => {
            let session = match &change.session {
                Some(session) => {
                    let [id, uid, owner, activity, labels] = session_cells(session);
                    format!("{id} uid {uid} owner {owner} activity {activity} labels {labels}")
                }
                None => String::new(),
            };
            let reason = change.event.as_ref().and_then(|end| end.reason);
            match reason {
                Some(reason) => format!(
                    "{} {session} ({})",
                    wire_name(change.change),
                    wire_name(reason)
                ),
                None => format!("{} {session}", wire_name(change.change)),
            }
        }
    };
    format!("{} {} {what}", change.revision, change.host_id)
}
