//! The command line's parts, one job each: its grammar (`args`), a module
//! per family of commands that turns their arguments into the engine's and
//! the features' options and prints the result, the exit status
//! (`status`) and where the log goes (`logging`).

pub mod args;
mod export;
mod guest;
pub mod logging;
mod replay;
mod reports;
pub mod status;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use args::{Command, KernelAction};

/// Runs `command`: its exit code, or what failed.
pub fn dispatch(command: Command, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match command {
        Command::Run(args) => guest::run(args, verbose),
        Command::Record(args) => guest::record(args, verbose),
        Command::Replay(args) => replay::replay(args, verbose),
        Command::Repro(args) => guest::repro(args, verbose),
        Command::Inspect { trace, state } => if state {
            provm::inspect::state_checks(&trace)
        } else {
            provm::inspect::inspect(&trace)
        }
        .map(|text| {
            print!("{text}");
            ExitCode::SUCCESS
        })
        .map_err(Into::into),
        Command::Diff {
            first,
            second,
            json,
        } => reports::diff(&first, &second, json),
        Command::Graph(args) => reports::graph(args),
        Command::Query(args) => reports::query(args),
        Command::Export { what } => export::export(what),
        Command::Blame(args) => reports::blame(args),
        Command::Recover {
            partial,
            output,
            force,
        } => recover(&partial, output, force),
        Command::Kernel { action } => kernel(action),
    }
}

fn recover(
    partial: &Path,
    output: Option<PathBuf>,
    force: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let output = match output {
        Some(output) => output,
        None => provm_engine::recover::default_output(partial).ok_or_else(|| {
            format!(
                "{}: not named as a recording's unfinished file (.NAME.XXXXXX.partial); give the trace to write with -o",
                partial.display()
            )
        })?,
    };
    provm::output::refuse_existing(force, [Some(output.as_path())])?;
    let recovered = provm_engine::recover::recover(partial, &output)?;
    let how = match recovered.finished {
        true => "the run had finished; its trace was being completed",
        false => "cut short where the recording was killed",
    };
    eprintln!(
        "provm: recovered {}: {} events, {how}",
        recovered.trace.display(),
        recovered.events
    );
    if let Some(torn) = recovered.torn {
        eprintln!("provm: what followed them was torn and is left out: {torn}");
    }
    Ok(ExitCode::SUCCESS)
}

fn kernel(action: KernelAction) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let path = match action {
        KernelAction::Build { smp } => provm_engine::kernel::build(variant(smp))?,
        KernelAction::Path { smp } => provm_engine::kernel::find(variant(smp))?,
    };
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

fn variant(smp: bool) -> provm_engine::kernel::Variant {
    match smp {
        true => provm_engine::kernel::Variant::Smp,
        false => provm_engine::kernel::Variant::Up,
    }
}
