//! The commands that read recorded runs: `graph`, `blame`, `query` and
//! `diff`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use provm::output::refuse_existing;
use provm::provenance::{self, Direction};
use provm_engine::host_paths;

use super::args::{BlameArgs, GraphArgs, QueryArgs};

pub fn graph(args: GraphArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    refuse_existing(args.force, [args.output.as_deref()])?;
    let mut runs = Vec::new();
    for replay in args.runs.replay_options()? {
        let graph = provenance::load_or_derive(&replay, args.from_replay)?;
        if !graph.has_processes() {
            let empty = provenance::ProvenanceError::Empty;
            return Err(format!("{}: {empty}", replay.trace.display()).into());
        }
        let name = host_paths::file_name(&replay.trace);
        runs.push(provenance::NamedRun { name, graph });
    }
    let mut document = provenance::combine(runs);
    let query = match (args.inputs_of, args.outputs_of) {
        (Some(path), _) => Some((path, Direction::Inputs)),
        (None, Some(path)) => Some((path, Direction::Outputs)),
        (None, None) => None,
    };
    if let Some((path, direction)) = query {
        document = provenance::lineage(&document, &path, direction)?;
    }
    let bytes = provenance::render(&document, args.format)?;
    match &args.output {
        Some(path) => std::fs::write(path, bytes)
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?,
        None => std::io::Write::write_all(&mut std::io::stdout(), &bytes)?,
    }
    Ok(ExitCode::SUCCESS)
}

pub fn blame(args: BlameArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let request = args.request();
    provm::blame::blame(&request, &mut std::io::stdout().lock())?;
    if let Some(path) = &request.svg {
        eprintln!("provm: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn query(args: QueryArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.schema {
        print!("{}", provm::query::schema(true));
        return Ok(ExitCode::SUCCESS);
    }
    let (sql, runs) = args
        .runs_then_sql
        .split_last()
        .expect("clap requires a run and a query");
    let runs = open_runs(runs.iter().map(PathBuf::from))?;
    let db = provm::query::for_query(&runs, sql)?;
    provm::query::print(&db, sql, args.format, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

pub fn open_runs(
    paths: impl IntoIterator<Item = PathBuf>,
) -> Result<Vec<provm::query::Run>, provm::query::QueryError> {
    paths
        .into_iter()
        .map(|path| provm::query::Run::open(&path))
        .collect()
}

/// `provm diff`: 0 when the runs are the same, 1 when they differ, as
/// diff(1) exits.
pub fn diff(
    first: &Path,
    second: &Path,
    json: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let diff = provm::diff::diff(first, second)?;
    if json {
        println!("{:#}", diff.to_json());
    } else {
        print!("{diff}");
    }
    Ok(ExitCode::from(u8::from(!diff.is_same())))
}
