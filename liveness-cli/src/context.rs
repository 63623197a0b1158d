//! What every command is given besides its own arguments: where the daemon is, and
//! whether to answer in JSON.

use std::path::PathBuf;

use liveness_client::Client;

use crate::exit::Failure;

pub(crate) struct Context {
    /// The daemon's socket, resolved.
    pub(crate) socket: PathBuf,
    /// `--socket`, when it was given: what installed hooks name too.
    pub(crate) named_socket: Option<PathBuf>,
    /// `--json`: answers and failures as JSON.
    pub(crate) json: bool,
}

impl Context {
    /// A connection to the daemon.
    pub(crate) fn connect(&self) -> Result<Client, Failure> {
        Ok(Client::connect(&self.socket)?)
    }
}
