//! `livenessd`: the daemon. All logic lives in the `liveness_daemon` library.
fn main() -> std::process::ExitCode {
    liveness_daemon::main()
}
