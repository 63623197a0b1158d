//! What connections (and the metrics listener) ask of the engine: one type per operation,
//! each with one [`Op::apply`], in a file of its own.
//!
//! An operation travels to the engine's thread as an [`Ask`]: who asks, the operation, and
//! where its answer goes. [`Command`] holds one of each kind, so the engine's queue carries
//! only what the engine does: what a connection serves itself (a subscription's replay, a
//! listing, the reading of a tree) has no variant here. Inside the daemon an answer is
//! `Result<Answer, Refusal>`; the server turns it into the wire's reply.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::Refusal;
use super::actor::Context;
use super::auth::Caller;
use super::tree::Parked;
use crate::fair::pacing::Pacing;
use crate::store::{Store, StoreError};
use liveness_common::request;
use liveness_common::session::Session;

mod actions_done;
mod activity;
mod end;
mod fleet_lock;
mod get;
mod lock_acquire;
mod lock_release;
mod moved;
mod register;
mod rename;
mod scope_failed;
mod status;
mod subscribe;
mod synced;
mod touch;
mod tree;
mod waiting;
mod whose;

pub use activity::{Judged, Sampling, Target};
pub use end::End;
pub use fleet_lock::{FleetGranted, FleetHeld, FleetReleased};
pub use moved::Moved;
pub use register::{Register, Registered};
pub use scope_failed::ScopeFailed;
pub use subscribe::Subscribe;
pub use synced::Synced;
pub use tree::Tree;
pub use waiting::Waiting;
pub use whose::{Found, Whose, ancestry};

/// One thing the engine does, in bounded time, on its own thread.
pub trait Op: fmt::Debug + Send + 'static {
    type Answer: fmt::Debug + Send + 'static;

    /// Whether it only reads, adding to the database's rows the published endings it
    /// lacks: then it is answered while those cannot be written (a full disk), so that
    /// an operator sees why.
    const READS: bool = false;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Self::Answer, Refusal>;

    /// The session an answer is about: while the tree of its owner is being walked, the
    /// answer waits for the walk (see [`super::tree`]), so that what the owner forks once
    /// its client has heard back is in the tree.
    fn about(_answer: &Self::Answer) -> Option<&Session> {
        None
    }
}

/// An operation on its way to the engine: who asks, and where the answer goes.
#[derive(Debug)]
pub struct Ask<O: Op> {
    pub caller: Caller,
    pub op: O,
    pub reply: oneshot::Sender<Result<O::Answer, Refusal>>,
    /// Charged with the engine's time on it, for a user other than root.
    pub pacing: Option<Arc<Pacing>>,
}

impl<O: Op> Ask<O> {
    fn run(self, cx: &mut Context<'_>) {
        // Published deaths that SQLite does not have yet would be missing from what an
        // operation reads (and `end` would end such a session again): none that writes
        // runs until they are written.
        let answer = if cx.caught_up() || O::READS {
            let started = std::time::Instant::now();
            let answer = self.op.apply(cx, self.caller);
            if let Some(pacing) = &self.pacing {
                pacing.charge(self.caller.uid, started.elapsed());
            }
            answer
        } else {
            Err(Refusal::Behind)
        };
        let root = answer
            .as_ref()
            .ok()
            .and_then(O::about)
            .map(|s| s.owner.key());
        let reply = self.reply;
        // The client may have gone; its answer has nowhere to go.
        let send = Parked(Box::new(move || drop(reply.send(answer))));
        cx.answer(root, send);
    }
}

/// The engine's queue of operations: one variant per [`Op`], with the `From` that wraps
/// an [`Ask`] and the dispatch that runs it.
macro_rules! commands {
    ($($name:ident($op:ty),)*) => {
        /// What the engine is asked to do.
        #[derive(Debug)]
        pub enum Command {
            $($name(Ask<$op>),)*
        }

        $(impl From<Ask<$op>> for Command {
            fn from(ask: Ask<$op>) -> Command {
                Command::$name(ask)
            }
        })*

        impl Command {
            pub(super) fn run(self, cx: &mut Context<'_>) {
                match self {
                    $(Command::$name(ask) => ask.run(cx),)*
                }
            }
        }
    };
}

commands! {
    Register(Register),
    ScopeFailed(ScopeFailed),
    Rename(request::Rename),
    Touch(request::Touch),
    Get(request::Get),
    Status(request::Status),
    End(End),
    LockAcquire(request::LockAcquire),
    LockRelease(request::LockRelease),
    FleetGranted(FleetGranted),
    FleetReleased(FleetReleased),
    FleetHeld(FleetHeld),
    Tree(Tree),
    Whose(Whose),
    Waiting(Waiting),
    Subscribe(Subscribe),
    Synced(Synced),
    ActionsDone(request::ActionsDone),
    Sampling(Sampling),
    Judged(Judged),
    Moved(Moved),
}

/// Where operations go to the engine, from any thread.
#[derive(Debug, Clone)]
pub struct Handle {
    commands: mpsc::Sender<Command>,
    pacing: Arc<Pacing>,
}

impl Handle {
    pub(crate) fn new(commands: mpsc::Sender<Command>) -> Handle {
        Handle {
            commands,
            pacing: Arc::default(),
        }
    }

    /// Asks the engine `op` for `caller`, and waits for the answer; `shutting_down` once
    /// the engine has stopped. A user other than root waits while past its share of the
    /// engine's time, and is charged the time its operation takes (see [`Pacing`]).
    pub async fn ask<O: Op>(&self, caller: Caller, op: O) -> Result<O::Answer, Refusal>
    where
        Command: From<Ask<O>>,
    {
        let pacing = (!caller.is_root()).then(|| Arc::clone(&self.pacing));
        if let Some(pacing) = &pacing {
            pacing.wait(caller.uid).await;
        }
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            caller,
            op,
            reply,
            pacing,
        };
        if self.commands.send(ask.into()).await.is_err() {
            return Err(Refusal::Stopping);
        }
        answer.await.unwrap_or(Err(Refusal::Stopping))
    }
}

/// The session a request names (see [`Caller::namespace`]): a user's own of that id;
/// for root, user `uid`'s, or without `uid` the one user's that has it (`ambiguous`
/// when several have). Another user's id is simply not in a user's namespace, so
/// nothing tells a user whether it exists.
fn addressed(
    store: &Store,
    caller: Caller,
    id: &str,
    uid: Option<u32>,
) -> Result<Session, Refusal> {
    let not_found = || StoreError::NotFound(id.to_owned()).into();
    if let Some(uid) = caller.namespace(uid)? {
        return store.get(uid, id)?.ok_or_else(not_found);
    }
    let mut found = store.find_any_user(id)?;
    match found.len() {
        0 => Err(not_found()),
        1 => Ok(found.remove(0)),
        _ => {
            let uids = found.iter().map(|s| s.creator_uid).collect();
            Err(Refusal::Ambiguous {
                id: id.to_owned(),
                uids,
            })
        }
    }
}

/// User `uid`'s session `id` as stored now.
fn stored(store: &Store, uid: u32, id: &str) -> Result<Session, Refusal> {
    match store.get(uid, id) {
        Ok(Some(session)) => Ok(session),
        Ok(None) => Err(StoreError::NotFound(id.to_owned()).into()),
        Err(e) => Err(e.into()),
    }
}
