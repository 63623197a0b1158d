//! Requests answered off the engine: their cost is whatever the client chose (a long
//! listing, a big tree), so they read a read-only store connection, `/proc` and the
//! kernel's members map on the blocking pool, at a lower priority (see
//! [`crate::fair::offload`]). Where they need the engine's view (which session a request names,
//! how many wait for a lock) they ask it a question it answers in bounded time.

use std::path::PathBuf;
use std::sync::Arc;

use super::reply::{IntoReply, Processes};
use crate::activity::Activities;
use crate::cgroup::{CgroupError, Enclosure};
use crate::engine::{self, Caller, Handle, Link, Refusal, TreeView, ancestry};
use crate::fair::offload::offload_for;
use crate::source::tree_map::TreeMap;
use crate::store::{EventReader, ListQuery, LockQuery, StoreError};
use liveness_common::identity::Identity;
use liveness_common::protocol::{
    DEFAULT_LIST_PAGE, ErrorBody, ErrorCode, MAX_LIST_PAGE, MemberProcess, Reply,
};
use liveness_common::request;
use liveness_common::session::Session;
use liveness_proc::identity::ProcRoot;

/// What connections read without the engine: the database (read-only connections),
/// `/proc`, and the kernel's members map.
#[derive(Debug, Clone)]
pub struct Readers {
    pub database: PathBuf,
    pub proc: ProcRoot,
    pub members: Option<Arc<TreeMap>>,
    /// Each ACTIVE session's last judged activity.
    pub activities: Activities,
    /// The fleet mirror's state, with `--etcd`.
    pub cluster: Option<crate::fleet::ClusterView>,
    /// Fleet locks, with `--etcd`.
    pub fleet_locks: Option<crate::fleet::FleetLocks>,
    /// The fleet's view, with `--etcd`.
    pub fleet: Option<crate::fleet::FleetReader>,
}

/// How many times at most a new cgroup session's tree is read for members to move in.
const ENCLOSE_PASSES: usize = 3;

/// The warning of a registration whose members could not all be moved.
fn moved_warning(error: CgroupError) -> String {
    format!("some of the session's processes are not in its cgroup: {error}")
}

/// A page's size, checked.
fn page_limit(limit: Option<usize>) -> Result<usize, ErrorBody> {
    let limit = limit.unwrap_or(DEFAULT_LIST_PAGE);
    if (1..=MAX_LIST_PAGE).contains(&limit) {
        Ok(limit)
    } else {
        Err(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("`limit` must be between 1 and {MAX_LIST_PAGE}"),
        ))
    }
}

/// The `after` of a request that pages, as `parse` reads a `next` cursor.
fn cursor<T>(
    after: Option<&str>,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, ErrorBody> {
    match after {
        None => Ok(None),
        Some(text) => parse(text).map(Some).ok_or_else(|| {
            ErrorBody::new(
                ErrorCode::InvalidRequest,
                format!("`after` must be the `next` of the previous reply, not {text:?}"),
            )
        }),
    }
}

/// A reply to write. One whose size a client chose comes serialized from the blocking
/// pool, so that not even its serialization holds a runtime worker.
#[derive(Debug)]
pub enum Answer {
    Reply(Box<Reply>),
    /// The whole line, with the request's id, without the newline.
    Line(String),
}

impl<A: IntoReply> From<A> for Answer {
    fn from(answer: A) -> Answer {
        Answer::Reply(Box::new(answer.into_reply()))
    }
}

/// A reply built and serialized on the blocking pool, with the request's `id`.
async fn offload_reply<A: IntoReply>(
    caller: Caller,
    id: Option<serde_json::Value>,
    what: &'static str,
    build: impl FnOnce() -> Result<A, ErrorBody> + Send + 'static,
) -> Answer {
    let line = offload_for(caller.uid, move || {
        serde_json::to_string(&Reply {
            id,
            ..build().into_reply()
        })
    })
    .await;
    match line {
        Some(Ok(line)) => Answer::Line(line),
        Some(Err(e)) => {
            Reply::error(ErrorCode::Internal, format!("cannot serialize {what}: {e}")).into()
        }
        None => Reply::error(ErrorCode::Internal, format!("reading {what} failed")).into(),
    }
}

/// A read from the store, its failure logged.
fn read<T>(what: &str, read: Result<T, StoreError>) -> Result<T, ErrorBody> {
    read.map_err(|e| {
        tracing::error!(error = %e, "cannot read {what}");
        ErrorBody::new(ErrorCode::Internal, format!("cannot read {what}: {e}"))
    })
}

impl Readers {
    /// One page of `list`, with the caller's view.
    pub async fn list(
        &self,
        id: Option<serde_json::Value>,
        engine: &Handle,
        caller: Caller,
        request: request::List,
    ) -> Answer {
        let request::List {
            phase,
            limit,
            after,
        } = request;
        let query = match (
            page_limit(limit),
            cursor(after.as_deref(), |t| {
                t.parse::<i64>().ok().filter(|a| *a >= 0)
            }),
        ) {
            (Ok(limit), Ok(after)) => ListQuery {
                phase,
                creator_uid: caller.creator_filter(),
                after: after.unwrap_or(0),
                limit,
            },
            (Err(refused), _) | (_, Err(refused)) => return Reply::from(refused).into(),
        };
        // What was published is in SQLite before it is read, or in what the engine answers:
        // a client that saw an event never lists its session as it was before.
        let waiting = match engine.ask(caller, engine::Synced).await {
            Ok(waiting) => waiting,
            Err(error) => return Reply::from(error).into(),
        };
        let database = self.database.clone();
        let activities = self.activities.clone();
        offload_reply(caller, id, "sessions", move || {
            let page = EventReader::open(&database).and_then(|reader| reader.list(&query));
            let mut page = read("sessions", page)?;
            for session in &mut page.sessions {
                activities.fill(session);
            }
            if !waiting.is_empty() {
                for session in &mut page.sessions {
                    if let Some(ending) = waiting
                        .iter()
                        .find(|ending| ending.ends(session.creator_uid, &session.id))
                    {
                        ending.end(session);
                    }
                }
                // An ending the database lacks takes its session out of a listing of the
                // active ones (a listing of the ended ones shows it once it is written).
                page.sessions
                    .retain(|session| query.phase.is_none_or(|phase| session.phase == phase));
            }
            Ok(page)
        })
        .await
    }

    /// One page of `lock_list`, by uid and name, with the caller's view; the engine adds
    /// how many wait for each lock of the page.
    pub async fn lock_list(
        &self,
        id: Option<serde_json::Value>,
        engine: &Handle,
        caller: Caller,
        request: request::LockList,
    ) -> Answer {
        let request::LockList { uid, limit, after } = request;
        let namespace = match caller.namespace(uid) {
            Ok(namespace) => namespace,
            Err(error) => return Reply::from(error).into(),
        };
        let query = match (
            page_limit(limit),
            cursor(after.as_deref(), LockQuery::parse_cursor),
        ) {
            (Ok(limit), Ok(after)) => LockQuery {
                uid: namespace,
                after,
                limit,
            },
            (Err(refused), _) | (_, Err(refused)) => return Reply::from(refused).into(),
        };
        // The few locks that have waiters, from the engine first: a page read after
        // cannot miss a lock granted meanwhile, only show a count a moment old.
        let waiting = match engine.ask(caller, engine::Waiting).await {
            Ok(waiting) => waiting,
            Err(error) => return Reply::from(error).into(),
        };
        let database = self.database.clone();
        offload_reply(caller, id, "locks", move || {
            let page = EventReader::open(&database).and_then(|reader| reader.locks(&query));
            let mut page = read("locks", page)?;
            for lock in page.locks.iter_mut().filter(|lock| !lock.cluster) {
                let key = (lock.uid, lock.name.clone());
                lock.waiters = waiting.get(&key).copied().unwrap_or(0);
            }
            Ok(page)
        })
        .await
    }

    /// `processes`: the engine names the session and hands over its tree; reading what is
    /// alive of it, however big, happens here.
    pub async fn processes(
        &self,
        id: Option<serde_json::Value>,
        engine: &Handle,
        caller: Caller,
        request: request::Processes,
    ) -> Answer {
        let request::Processes {
            session,
            uid,
            limit,
            after,
        } = request;
        let page = match (
            page_limit(limit),
            cursor(after.as_deref(), |t| t.parse::<u32>().ok()),
        ) {
            (Ok(limit), Ok(after)) => (after.unwrap_or(0), limit),
            (Err(refused), _) | (_, Err(refused)) => return Reply::from(refused).into(),
        };
        let (session, tree) = match engine.ask(caller, engine::Tree { session, uid }).await {
            Ok(found) => found,
            Err(error) => return Reply::from(error).into(),
        };
        let Readers { proc, members, .. } = self.clone();
        offload_reply(caller, id, "the tree", move || {
            let (processes, next) = processes_of(&session, tree, members.as_deref(), &proc, page);
            Ok(Processes {
                session,
                processes,
                next,
            })
        })
        .await
    }

    /// Moves into a new cgroup session's cgroup the members its tree has (found by the
    /// tree's first walk, which the registration's answer waited for: descendants, lineage
    /// orphans), those the registering user may have moved (see [`Enclosure::strays`]).
    /// Reading the tree and each move cost what the tree's owner chose, so they happen
    /// here, never on the engine. A member forks while it is moved: the tree is read again
    /// until it has no member left outside, [`ENCLOSE_PASSES`] times at most. What went
    /// wrong, as the registration's warning.
    pub async fn enclose(
        &self,
        engine: &Handle,
        caller: Caller,
        session: &Session,
        enclosure: Enclosure,
    ) -> Option<String> {
        let tree = engine::Tree {
            session: session.id.clone(),
            uid: Some(session.creator_uid),
        };
        // An owner dead already has no tree to move.
        let Ok((_, Some(tree))) = engine.ask(caller, tree).await else {
            return None;
        };
        let unit = enclosure.path.file_name()?.to_str()?.to_owned();
        let shared = Arc::new((self.clone(), tree, enclosure));
        for _ in 0..ENCLOSE_PASSES {
            let read = Arc::clone(&shared);
            let strays = offload_for(caller.uid, move || {
                let (readers, tree, enclosure) = &*read;
                let live = tree.live_members(readers.members.as_deref(), &readers.proc);
                enclosure.strays(live, &readers.proc)
            });
            let strays = match strays.await? {
                Ok(strays) if strays.is_empty() => return None,
                Ok(strays) => strays,
                // A scope that did not start has no cgroup: its warning is given already.
                Err(_) if !shared.2.path.exists() => return None,
                Err(e) => return Some(moved_warning(e)),
            };
            let moved = match &shared.2.systemd {
                Some(systemd) => {
                    (systemd.attach(&unit, &strays, &self.proc).await).map_err(|source| {
                        CgroupError::Systemd {
                            unit: unit.clone(),
                            source,
                        }
                    })
                }
                None => {
                    let write = Arc::clone(&shared);
                    let moved =
                        offload_for(caller.uid, move || write.2.take_in(&strays, &write.0.proc));
                    moved.await?
                }
            };
            if let Err(e) = moved {
                return Some(moved_warning(e));
            }
        }
        None
    }

    /// `whose`: the ancestry of the process is read here, then the engine looks it up.
    pub async fn whose(
        &self,
        engine: &Handle,
        caller: Caller,
        request: request::Whose,
    ) -> Result<engine::Found, ErrorBody> {
        let request::Whose { pid } = request;
        let Readers { proc, members, .. } = self.clone();
        let read = offload_for(caller.uid, move || {
            ancestry(&proc, members.as_deref(), caller.pid, pid)
        });
        let ancestry = read
            .await
            .unwrap_or(Err(Refusal::Internal("reading the ancestry failed")))?;
        let links = ancestry.clone();
        match engine.ask(caller, engine::Whose { pid, ancestry }).await {
            Err(refusal @ Refusal::NotFound(_)) => {
                Ok(self.survivor_of(caller, links).await?.ok_or(refusal)?)
            }
            answer => Ok(answer?),
        }
    }

    /// The ended session (still retained) that the nearest process of `ancestry` survived:
    /// which session left it running.
    async fn survivor_of(
        &self,
        caller: Caller,
        ancestry: Vec<Link>,
    ) -> Result<Option<engine::Found>, ErrorBody> {
        let Readers { database, proc, .. } = self.clone();
        let found = offload_for(caller.uid, move || {
            let boot_id = proc.boot_id().unwrap_or_default();
            let reader = read("sessions", EventReader::open(&database))?;
            for link in ancestry {
                let survivor = Identity {
                    pid: link.key.pid,
                    start_ticks: link.key.start_ticks,
                    boot_id: boot_id.clone(),
                    host: String::new(),
                    pidfs_ino: link.pidfs_ino,
                    comm: String::new(),
                };
                let sessions = reader.ended_with_survivor(&survivor, caller.creator_filter());
                if let Some(session) = read("sessions", sessions)?.into_iter().next() {
                    // The owner has exited: it has no pid in any namespace now.
                    return Ok(Some(engine::Found {
                        session,
                        owner_pid: 0,
                    }));
                }
            }
            Ok(None)
        });
        found.await.unwrap_or_else(|| {
            Err(ErrorBody::new(
                ErrorCode::Internal,
                "reading the ended sessions failed",
            ))
        })
    }

    /// `end`: the survivors of the owner's tree are read here (the caller and its ancestors
    /// in the tree set apart), then the engine ends the session with them.
    pub async fn end(
        &self,
        engine: &Handle,
        caller: Caller,
        request: request::End,
    ) -> Result<Session, ErrorBody> {
        let tree = engine::Tree {
            session: request.session.clone(),
            uid: request.uid,
        };
        let (_, tree) = engine.ask(caller, tree).await?;
        let survivors = match tree {
            Some(tree) => {
                let Readers { proc, members, .. } = self.clone();
                offload_for(caller.uid, move || {
                    let survivors = tree.survivors(members.as_deref(), &proc, caller.pid);
                    (tree.root(), survivors)
                })
                .await
            }
            None => None,
        };
        let end = engine::End { request, survivors };
        Ok(engine.ask(caller, end).await?)
    }
}

/// One page, `(after, limit)`, of the live members of `tree`, which `session` owns, read
/// in `/proc` and through `kernel` (a handle of the members map), with the cursor of the
/// next page. Its cost is the tree's, so it never runs on the engine.
fn processes_of(
    session: &Session,
    tree: Option<TreeView>,
    kernel: Option<&TreeMap>,
    proc: &ProcRoot,
    (after, limit): (u32, usize),
) -> (Vec<MemberProcess>, Option<String>) {
    let mut members: Vec<Identity> = tree.map_or_else(Vec::new, |tree| {
        tree.live_after(kernel, proc, after)
            .take(limit + 1)
            .collect()
    });
    let next = (members.len() > limit).then(|| {
        members.truncate(limit);
        members.last().map_or(after, |last| last.pid).to_string()
    });
    let now_ticks = proc.uptime_ticks();
    let processes = members
        .into_iter()
        .filter_map(|identity| {
            let stat = proc.stat(identity.pid).ok()?;
            Some(MemberProcess {
                owner: identity.same_process(&session.owner),
                ppid: stat.ppid,
                cmdline: proc.cmdline(identity.pid).unwrap_or_default(),
                age_ms: now_ticks.saturating_sub(identity.start_ticks) * 10,
                identity,
            })
        })
        .collect();
    (processes, next)
}
