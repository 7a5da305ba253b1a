//! The provm command line: parses the arguments (`cli::args`), sets up the
//! log, runs the command (`cli::dispatch`) and exits with its status.

#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::args::Cli::parse();
    cli::logging::init(cli.verbose);
    cli::dispatch(cli.command, cli.verbose > 0).unwrap_or_else(|error| {
        eprintln!("provm: {error}");
        ExitCode::from(cli::status::failure_status(error.as_ref()))
    })
}
