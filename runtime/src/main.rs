//! provm-runtime: an OCI runtime with runc's command line, so that
//! Podman (and, later, containerd and Slurm) start containers in provm's
//! VM, each recorded into a trace that `provm replay` re-executes with no
//! container engine present. See docs/runtime.md.

#![deny(clippy::undocumented_unsafe_blocks)]

mod bundle;
mod cli;
mod commands;
mod config;
mod console;
mod container;
mod fds;
mod fifo;
mod image;
mod log;
mod rootfs;
mod signals;
mod state;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use commands::Globals;
use state::Containers;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = log::Log::new(cli.log.clone(), cli.log_format, cli.debug);
    if cli.debug {
        log::engine_debug_into(log.clone());
    }
    match execute(&cli, &log) {
        Ok(status) => ExitCode::from(status.clamp(0, 255) as u8),
        Err(message) => {
            log.error(&message);
            ExitCode::from(1)
        }
    }
}

fn execute(cli: &Cli, log: &log::Log) -> Result<i32, String> {
    let containers = Containers::new(&cli.root);
    let globals = Globals {
        root: &cli.root,
        log: cli.log.as_deref(),
        log_format: cli.log_format,
        debug: cli.debug,
    };
    match &cli.command {
        Command::Create { create } => {
            commands::create(&globals, create, log, &containers)?;
            Ok(0)
        }
        Command::Start { id } => commands::start(&containers, id).map(|()| 0),
        Command::State { id } => {
            let shown = containers.shown(id)?;
            println!("{}", serde_json::to_string_pretty(&shown).expect("plain data"));
            Ok(0)
        }
        Command::Kill { id, signal, .. } => commands::kill(&containers, id, signal).map(|()| 0),
        Command::Delete { id, force } => commands::delete(&containers, id, *force, log).map(|()| 0),
        Command::Run { create, detach } => {
            commands::run(&globals, create, *detach, log, &containers)
        }
        Command::Features => {
            let features = commands::features();
            println!("{}", serde_json::to_string_pretty(&features).expect("plain data"));
            Ok(0)
        }
        Command::Exec { .. } => Err("exec is not supported: a container's VM runs its one command, and a second process cannot join it; run another container instead".into()),
        Command::Init { id } => container::run(&containers, id).or_else(|message| {
            log.error(&message);
            Ok(container::FAILED)
        }),
    }
}
