//! The `planned-stop` binary: the command line over the library (see `docs/cli.md`).
//!
//! Everything here is the binary's own; the library knows nothing of argument parsing, terminal
//! output or exit codes, so an application that depends on the library compiles none of it.

#![warn(clippy::undocumented_unsafe_blocks)]

mod cli;

fn main() -> std::process::ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    cli::main()
}
