//! `livenessd`: the daemon. All logic lives in `liveness_daemon::daemon`.
fn main() -> std::process::ExitCode {
    liveness_daemon::daemon::main()
}
