//! `provm export`: a run written out for other tools.

use std::process::ExitCode;

use provm::export::parquet::{self, Dataset};
use provm::export::ro_crate::License;
use provm::output::refuse_existing;

use super::args::ExportCommand;
use super::reports::open_runs;

pub fn export(what: ExportCommand) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match what {
        ExportCommand::Sqlite {
            runs,
            with_replay,
            output,
        } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let runs = open_runs(runs)?;
            provm::export::sqlite(&runs, &output.output, output.force, with_replay)?;
        }
        ExportCommand::Parquet {
            runs,
            with_replay,
            tables,
            output,
            force,
        } => {
            let dataset = Dataset::open(&output, &tables, with_replay, force)?;
            // Every trace is there before the first is written.
            runs.iter().try_for_each(|run| parquet::check_trace(run))?;
            for (n, run) in runs.iter().enumerate() {
                let added = dataset.add(run)?;
                let rows: u64 = added.rows.iter().map(|(_, rows)| rows).sum();
                eprintln!(
                    "provm: [{}/{}] {}: run={}, {rows} rows in {} tables{}",
                    n + 1,
                    runs.len(),
                    run.display(),
                    added.run,
                    added.rows.len(),
                    if added.replaced { ", replaced" } else { "" }
                );
            }
            eprintln!(
                "provm: wrote {}: read it with read_parquet('{}/TABLE/*/*.parquet', hive_partitioning = true)",
                output.display(),
                output.display()
            );
        }
        ExportCommand::Timeline {
            run,
            with_replay,
            output,
        } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let run = provm::query::Run::open(&run)?;
            if !provm::export::timeline(&run, &output.output, output.force, with_replay)? {
                eprintln!("provm: {} has no provenance, so the timeline has no process tracks; record with --prov, or export with --with-replay, to have them", run.name);
            }
        }
        ExportCommand::Oci { run, output } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let written = provm::export::oci_archive(
                &run.replay_options(false)?,
                &output.output,
                output.force,
            )?;
            eprintln!(
                "provm: wrote {} (oci-archive, tag {}): {} bytes",
                output.output.display(),
                provm::export::OCI_TAG,
                written
            );
        }
        ExportCommand::Files {
            run,
            guest_path,
            output,
        } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let delivered = provm::export::files(&run, &guest_path, &output.output, output.force)?;
            eprintln!(
                "provm: wrote {} ({} files, {} bytes)",
                output.output.display(),
                delivered.files,
                delivered.bytes
            );
        }
        ExportCommand::RoCrate {
            runs,
            output,
            license,
            force,
        } => {
            let license = license.map_or_else(
                || {
                    eprintln!("provm: no --license: the crate says that none was chosen; choose one before depositing it");
                    License::Unchosen
                },
                License::Chosen,
            );
            provm::export::ro_crate::ro_crate(&runs.replay_options()?, &output, force, &license)?;
            eprintln!(
                "provm: wrote the RO-Crate {}; scripts/check-ro-crate validates it",
                output.display()
            );
        }
        ExportCommand::Makefile { run, output, force } => {
            refuse_existing(force, [output.as_deref()])?;
            let makefile = provm::export::makefile(&run.replay_options(false)?)?;
            match output {
                Some(path) => {
                    let mut file = provm::output::AtomicFile::create(&path, force)?;
                    std::io::Write::write_all(file.file(), makefile.as_bytes())?;
                    file.commit()?;
                }
                None => print!("{makefile}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
