//! The commands that run a guest: `run`, `record` and `repro`.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use provm::observers::RunObservers;
use provm::output::refuse_existing;
use provm::repro::{ChaosOptions, ReproOptions, Verdict};
use provm_engine::host_paths::HostPaths;
use provm_engine::image;
use provm_engine::record::RecordOptions;
use provm_engine::start::RunOptions;
use provm_engine::transfer::terminal::RawStdin;

use super::args::{exitless_limit, GuestArgs, RecordArgs, ReproArgs, RunArgs};

pub fn run(args: RunArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    refuse_existing(
        args.force,
        [
            args.provenance.as_deref(),
            args.keep_overlay.as_deref(),
            args.timing.output.as_deref(),
        ],
    )?;
    let timing = args.timing.options(false);
    let provenance = args.provenance.clone();
    let (serial, tty) = (args.serial, args.tty);
    let mut options = RunOptions {
        parallel: !serial,
        ..run_options(args, verbose)?
    };
    let terminal = on_the_terminal(&mut options, tty)?;
    let mut observers = RunObservers::new(&options, "run", &timing, provenance);
    let ran = provm_engine::run::run(
        &options,
        &mut observers.all(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    drop(terminal);
    let ran = ran?;
    observers.finish()?;
    if let Some(digest) = &ran.events_sha256 {
        eprintln!("provm: event log sha256 {digest}");
    }
    Ok(ExitCode::from(ran.outcome.shell_status() as u8))
}

pub fn record(args: RecordArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    // `record` shares run's options; this one is run's alone.
    if args.run.serial {
        return Err("--serial is for `provm run`: a recording always runs its vCPUs one at a time, switched at VM exits, and logs the schedule; drop --serial".into());
    }
    let output = args
        .output
        .unwrap_or_else(|| provm_engine::record::default_output(args.run.guest.image.path()));
    let run = &args.run;
    refuse_existing(
        run.force,
        [
            Some(output.as_path()),
            run.provenance.as_deref(),
            run.keep_overlay.as_deref(),
            run.timing.output.as_deref(),
        ],
    )?;
    let timing = args.run.timing.options(!args.no_timing);
    let provenance = args.run.provenance.clone();
    let tty = args.run.tty;
    let mut run = run_options(args.run, verbose)?;
    run.cpu = args.cpu;
    if let Some(seed) = args.chaos {
        run.pinned = run.pinned.map(|pinning| pinning.with_chaos_step(seed));
    }
    if args.keep_host_paths {
        run.host_paths = HostPaths::Kept;
    }
    let mut options = RecordOptions {
        run,
        output,
        embed_image: args.embed_image,
        exitless_limit: exitless_limit(args.exitless_limit),
        chaos: args.chaos,
        preempt: args.preempt.map(Duration::from_millis),
        preempt_computations: args.preempt_computations,
    };
    let terminal = on_the_terminal(&mut options.run, tty)?;
    let mut observers = RunObservers::new(&options.run, "record", &timing, provenance);
    let recorded = provm_engine::record::record(
        &options,
        &mut observers.all(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    drop(terminal);
    // A recording cut short still has its timing.
    observers.finish()?;
    let recorded = recorded?;
    eprintln!("provm: recorded {}", recorded.trace.display());
    eprintln!("provm: event log sha256 {}", recorded.events_sha256);
    Ok(ExitCode::from(recorded.outcome.shell_status() as u8))
}

fn run_options(args: RunArgs, verbose: bool) -> Result<RunOptions, Box<dyn std::error::Error>> {
    Ok(RunOptions {
        keep_overlay: args.keep_overlay,
        outputs: args.outputs,
        force_outputs: args.force,
        net: args.net,
        dns: args.dns,
        ..guest_options(args.guest, verbose, true)?
    })
}

/// With `--tty`: the command runs on a terminal in the guest, typed at
/// from provm's own, made raw (until the returned guard is dropped, before
/// provm says anything more) and followed in its size.
fn on_the_terminal(
    options: &mut RunOptions,
    tty: bool,
) -> Result<Option<RawStdin>, Box<dyn std::error::Error>> {
    use std::io::IsTerminal;
    if !tty {
        return Ok(None);
    }
    if !std::io::stdin().is_terminal() {
        return Err("--tty types at the command from the terminal provm runs in, and provm's standard input is not one: run provm from a terminal, or drop --tty".into());
    }
    let (raw, size) = RawStdin::enter()
        .map_err(|error| format!("cannot hand this terminal to the command: {error}"))?;
    options.terminal = Some(size);
    options.live_stdin = true;
    Ok(Some(raw))
}

/// The run's options; a container image is resolved to its disk here, and
/// its configuration gives the command's defaults. Standard input that is a
/// pipe or a socket streams to the command if `may_stream` (one run of
/// it), and is read whole otherwise (runs that each need all of it).
fn guest_options(
    args: GuestArgs,
    verbose: bool,
    may_stream: bool,
) -> Result<RunOptions, Box<dyn std::error::Error>> {
    let resolved = image::resolve(&args.image)?;
    let defaults = resolved
        .container
        .as_ref()
        .map(|container| container.config.clone())
        .unwrap_or_default();
    let command = match args.command.is_empty() {
        true => defaults.command.iter().map(OsString::from).collect(),
        false => args.command,
    };
    if command.is_empty() {
        return Err(format!(
            "no command: give it after `--` (provm run {} -- CMD ARGS...){}",
            args.image,
            match resolved.container {
                Some(_) => "; the image names none (no Entrypoint or Cmd)",
                None => "",
            }
        )
        .into());
    }
    let live_stdin = may_stream && provm_engine::transfer::live_stdin::streams();
    Ok(RunOptions {
        pinned: args.pinning.pinning(),
        env: defaults.env.into_iter().chain(args.env).collect(),
        cwd: args
            .cwd
            .or(defaults.working_dir)
            .unwrap_or_else(|| "/".into()),
        user: defaults.user,
        root: args.root,
        memory_mib: args.memory,
        cpus: args.cpus,
        timeout: Duration::from_secs(args.timeout),
        kernel: args.kernel,
        echo_console: verbose,
        inputs: args.inputs,
        stdin: host_stdin(live_stdin)?,
        live_stdin,
        container: resolved.container,
        ..RunOptions::new(resolved.disk, command)
    })
}

/// provm's standard input, for the command, read to its end (its digest
/// in a trace's manifest), unless it streams (`live`) or is a terminal,
/// which would wait for a user who meant no input. `None` for those, or
/// nothing.
fn host_stdin(live: bool) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{IsTerminal, Read};
    let stdin = std::io::stdin();
    if live || stdin.is_terminal() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    stdin.lock().read_to_end(&mut bytes)?;
    Ok((!bytes.is_empty()).then_some(bytes))
}

pub fn repro(args: ReproArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Some(runs) = args.chaos_runs {
        return chaos_runs(args, runs, verbose);
    }
    let options = ReproOptions {
        run: guest_options(args.guest, verbose, false)?,
        runs: args.runs,
    };
    let verdict = provm::repro::repro(&options, &mut std::io::stderr())?;
    println!("{verdict}");
    Ok(match verdict {
        Verdict::Reproducible { .. } => ExitCode::SUCCESS,
        Verdict::Irreproducible { .. } => ExitCode::from(1),
    })
}

/// `repro --chaos-runs`: the schedules' verdict, the seeds by output.
fn chaos_runs(
    args: ReproArgs,
    runs: usize,
    verbose: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.guest.cpus < 2 {
        return Err(
            "--chaos-runs varies the vCPU schedule, and one vCPU has none: add --cpus 2 (or more)"
                .into(),
        );
    }
    let traces = args
        .traces
        .unwrap_or_else(|| provm::repro::default_traces(args.guest.image.path()));
    let options = ChaosOptions {
        run: guest_options(args.guest, verbose, false)?,
        runs: runs as u64,
        traces,
        exitless_limit: exitless_limit(args.exitless_limit),
    };
    let schedules = provm::repro::chaos_runs(&options, &mut std::io::stderr())?;
    println!("{schedules}");
    Ok(match schedules.reproducible() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
    })
}
