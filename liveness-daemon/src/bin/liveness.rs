//! `liveness`: the command-line client. All logic lives in `liveness::cli`.
fn main() -> std::process::ExitCode {
    liveness::cli::main()
}
