//! Registers a process as the owner of a session, waits for the session to end (a daemon
//! restart in between is survived), and prints how the owner exited.
//!
//! Usage: `wait_for_exit SESSION PID [SOCKET]`

use std::path::PathBuf;

use liveness_client::{Client, ClientError, Owner, Registration, default_socket};

fn main() -> Result<(), ClientError> {
    let mut args = std::env::args().skip(1);
    let (Some(session), Some(pid)) = (args.next(), args.next()) else {
        eprintln!("usage: wait_for_exit SESSION PID [SOCKET]");
        std::process::exit(64);
    };
    let pid: u32 = pid.parse().expect("PID is a number");
    let socket = args.next().map_or_else(default_socket, PathBuf::from);

    let mut client = Client::connect(&socket)?;
    client.register(&Registration::new(&session, Owner::Pid(pid)))?;
    let ended = client.wait_for_end(&session, None)?;
    match ended.exit {
        Some(status) => println!("{session}: {status}"),
        None => println!("{session}: ended ({:?}), exit status unknown", ended.reason),
    }
    Ok(())
}
