//! Requests answered off the engine: their cost is whatever the client chose (a long
//! listing, a big tree), so they read a read-only store connection, `/proc` and the
//! kernel's members map on the blocking pool, at a lower priority (see
//! [`crate::offload`]). Where they need the engine's view (which session a request names,
//! how many wait for a lock) they ask it a question it answers in bounded time.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::engine::{Caller, Command};
use crate::offload::offload;
use crate::source::members_map::MembersMap;
use crate::store::{EventReader, ListQuery, LockQuery, StoreError};
use liveness_common::protocol::{DEFAULT_LIST_PAGE, ErrorBody, ErrorCode, MAX_LIST_PAGE, Reply};
use liveness_common::session::Phase;
use liveness_proc::identity::ProcRoot;

/// What connections read without the engine: the database (read-only connections),
/// `/proc`, and the kernel's members map.
#[derive(Debug, Clone)]
pub struct Readers {
    pub database: PathBuf,
    pub proc: ProcRoot,
    pub members: Option<Arc<MembersMap>>,
}

fn stopping() -> Reply {
    Reply::error(ErrorCode::ShuttingDown, "the daemon is stopping")
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

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Answer {
        Answer::Reply(Box::new(reply))
    }
}

/// A reply built and serialized on the blocking pool, with the request's `id`.
async fn offload_reply(
    id: Option<serde_json::Value>,
    what: &'static str,
    build: impl FnOnce() -> Reply + Send + 'static,
) -> Answer {
    let line = offload(move || serde_json::to_string(&Reply { id, ..build() })).await;
    match line {
        Some(Ok(line)) => Answer::Line(line),
        Some(Err(e)) => {
            Reply::error(ErrorCode::Internal, format!("cannot serialize {what}: {e}")).into()
        }
        None => Reply::error(ErrorCode::Internal, format!("reading {what} failed")).into(),
    }
}

/// The reply to a read from the store.
fn read_reply<T>(what: &str, read: Result<T, StoreError>, reply: impl FnOnce(T) -> Reply) -> Reply {
    match read {
        Ok(page) => reply(page),
        Err(e) => {
            tracing::error!(error = %e, "cannot read {what}");
            Reply::error(ErrorCode::Internal, format!("cannot read {what}: {e}"))
        }
    }
}

/// Asks the engine a question whose answer comes on a oneshot.
async fn ask_engine<T>(
    engine: &mpsc::Sender<Command>,
    command: impl FnOnce(oneshot::Sender<T>) -> Command,
) -> Option<T> {
    let (reply_tx, reply_rx) = oneshot::channel();
    engine.send(command(reply_tx)).await.ok()?;
    reply_rx.await.ok()
}

impl Readers {
    /// One page of `list`, with the caller's view.
    pub async fn list(
        &self,
        id: Option<serde_json::Value>,
        caller: Caller,
        phase: Option<Phase>,
        limit: Option<usize>,
        after: Option<String>,
    ) -> Answer {
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
        let database = self.database.clone();
        offload_reply(id, "sessions", move || {
            let page = EventReader::open(&database).and_then(|reader| reader.list(&query));
            read_reply("sessions", page, |page| Reply {
                sessions: Some(page.sessions),
                next: page.next.map(|next| next.to_string()),
                ..Reply::ok()
            })
        })
        .await
    }

    /// One page of `lock_list`, by uid and name, with the caller's view; the engine adds
    /// how many wait for each lock of the page.
    pub async fn lock_list(
        &self,
        id: Option<serde_json::Value>,
        engine: &mpsc::Sender<Command>,
        caller: Caller,
        uid: Option<u32>,
        limit: Option<usize>,
        after: Option<String>,
    ) -> Answer {
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
        let Some(waiting) = ask_engine(engine, |reply| Command::Waiting { reply }).await else {
            return stopping().into();
        };
        let database = self.database.clone();
        offload_reply(id, "locks", move || {
            let page = EventReader::open(&database).and_then(|reader| reader.locks(&query));
            read_reply("locks", page, |page| Reply {
                locks: Some(
                    page.locks
                        .into_iter()
                        .map(|lock| {
                            let key = (lock.uid, lock.name.clone());
                            let waiters = waiting.get(&key).copied().unwrap_or(0);
                            liveness_common::lock::Lock { waiters, ..lock }
                        })
                        .collect(),
                ),
                next: page.next,
                ..Reply::ok()
            })
        })
        .await
    }

    /// `processes`: the engine names the session and hands over its tree; reading what is
    /// alive of it, however big, happens here.
    pub async fn processes(
        &self,
        id: Option<serde_json::Value>,
        engine: &mpsc::Sender<Command>,
        caller: Caller,
        session: String,
        uid: Option<u32>,
    ) -> Answer {
        let tree = ask_engine(engine, |reply| Command::Tree {
            caller,
            session,
            uid,
            reply,
        });
        let (session, tree) = match tree.await {
            Some(Ok(found)) => found,
            Some(Err(error)) => return Reply::from(error).into(),
            None => return stopping().into(),
        };
        let Readers { proc, members, .. } = self.clone();
        offload_reply(id, "the tree", move || {
            crate::engine::processes_of(session, tree, members.as_deref(), &proc)
        })
        .await
    }

    /// `whose`: the ancestry of the process is read here, then the engine looks it up.
    pub async fn whose(&self, engine: &mpsc::Sender<Command>, caller: Caller, pid: u32) -> Reply {
        let Readers { proc, members, .. } = self.clone();
        let read =
            offload(move || crate::engine::ancestry(&proc, members.as_deref(), caller.pid, pid));
        let ancestry = match read.await {
            Some(Ok(ancestry)) => ancestry,
            Some(Err(error)) => return error.into(),
            None => return Reply::error(ErrorCode::Internal, "reading the ancestry failed"),
        };
        ask_engine(engine, |reply| Command::Whose {
            caller,
            pid,
            ancestry,
            reply,
        })
        .await
        .unwrap_or_else(stopping)
    }

    /// `end`: the survivors of the owner's tree are read here, then the engine ends the
    /// session with them.
    pub async fn end(
        &self,
        engine: &mpsc::Sender<Command>,
        caller: Caller,
        session: String,
        uid: Option<u32>,
        terminate: bool,
    ) -> Reply {
        let tree = ask_engine(engine, |reply| Command::Tree {
            caller,
            session: session.clone(),
            uid,
            reply,
        });
        let tree = match tree.await {
            Some(Ok((_, tree))) => tree,
            Some(Err(error)) => return error.into(),
            None => return stopping(),
        };
        let survivors = match tree {
            Some(tree) => {
                let Readers { proc, members, .. } = self.clone();
                offload(move || (tree.root(), tree.survivors(members.as_deref(), &proc))).await
            }
            None => None,
        };
        ask_engine(engine, |reply| Command::End {
            caller,
            session,
            uid,
            terminate,
            survivors,
            reply,
        })
        .await
        .unwrap_or_else(stopping)
    }
}
