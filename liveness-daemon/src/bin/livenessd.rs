//! `livenessd`: the daemon. All logic lives in `liveness::daemon`.
fn main() -> std::process::ExitCode {
    liveness::daemon::main()
}
