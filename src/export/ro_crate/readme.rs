//! The crate's README: what it holds and how a reader checks it with provm.

use std::fmt::Write;

use super::super::makefile::shell_line;
use super::step::Step;
use provm_engine::disk::chain;
use provm_engine::utc::date_time as utc_date_time;

/// The README of a crate holding one run, `step`.
pub fn readme(step: &Step) -> String {
    let manifest = step.manifest;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = (|| -> std::fmt::Result {
        writeln!(out, "# provm run: `{}`\n", shell_line(&manifest.argv))?;
        writeln!(
            out,
            "This RO-Crate (a Process Run Crate) holds the trace of one run of a command inside a whole Linux virtual machine, recorded by provm {} on {}. `ro-crate-metadata.json` describes the run: the command, the VM's inputs and the guest files it read, the files it left written, its start and end.\n",
            manifest.provm_version,
            utc_date_time(manifest.started_unix)
        )?;
        writeln!(out, "## Check it\n")?;
        checks(&mut out, step)?;
        writeln!(out, "{BUILD_PROVM}")
    })();
    out
}

/// The README of a crate of several runs, `steps` in the order they ran,
/// whose workflow is the script `workflow`.
pub fn workflow_readme(steps: &[Step], workflow: &str) -> String {
    let mut out = String::new();
    let _ = (|| -> std::fmt::Result {
        writeln!(out, "# provm runs: {} steps\n", steps.len())?;
        writeln!(
            out,
            "This RO-Crate (a Provenance Run Crate) holds the traces of {} runs of commands, each inside a whole Linux virtual machine, recorded by provm. `ro-crate-metadata.json` describes each run as a step: its command, the VM's inputs and the guest files it read, the files it left written, by SHA-256, so that a file one step left written and a later one read is one entity. `{workflow}` replays every step in order (`sh {workflow}`).\n",
            steps.len()
        )?;
        for (number, step) in steps.iter().enumerate() {
            let command = shell_line(&step.manifest.argv);
            writeln!(out, "## Check step {}: `{command}`\n", number + 1)?;
            checks(&mut out, step)?;
        }
        writeln!(out, "{BUILD_PROVM}")
    })();
    out
}

const BUILD_PROVM: &str = "provm: build it from its source (`cargo build --release`); `provm kernel build` is not needed to check a trace, which carries its kernel.";

/// How to check one trace: that it is the one deposited, whole, and the
/// run; what it read and wrote.
fn checks(out: &mut String, step: &Step) -> std::fmt::Result {
    let (manifest, trace) = (step.manifest, step.trace);
    let name = &trace.name;
    writeln!(out, "1. The trace is the one deposited:\n")?;
    writeln!(out, "       sha256sum {name}    # {}\n", trace.sha256)?;
    writeln!(
        out,
        "2. It is whole: `provm inspect` verifies every section's SHA-256 and shows what the trace holds (the command, the image's files by name and digest, the kernel, the outcome):\n"
    )?;
    writeln!(out, "       provm inspect {name}\n")?;
    writeln!(
        out,
        "3. It is the run: `provm replay` re-executes the guest from the trace, feeding it every recorded input and checking every output, to the exit status and the SHA-256 of all disk writes. It prints `replay matched: ...` and exits 0 when the run is reproduced exactly, 1 at the first divergence.\n"
    )?;
    if step.embeds_image {
        writeln!(
            out,
            "       provm replay {name}    # the trace embeds the image\n"
        )?;
    } else {
        writeln!(out, "       provm replay --image IMAGE {name}\n")?;
        writeln!(
            out,
            "   IMAGE is the disk image the run read, not in this crate; provm refuses any other, naming the file that differs:\n"
        )?;
        for file in &manifest.image.chain {
            writeln!(
                out,
                "   - {}: {} ({} bytes, sha256 {})",
                chain::describe(file),
                file.path,
                file.size,
                file.sha256
            )?;
        }
        writeln!(out)?;
        if let Some(container) = &manifest.image.container {
            writeln!(
                out,
                "   The disk was made of the container image {} ({} {}), which makes the same disk again: `provm replay --image {} {name}`.\n",
                container.reference, container.digest_of, container.digest, container.reference
            )?;
        }
    }
    writeln!(
        out,
        "   The replay needs a host that can present the CPU the guest saw (`provm inspect` names it: a named baseline such as x86-64-v2 replays on any such host; `host` only on one like the recording host).\n"
    )?;
    writeln!(
        out,
        "4. What the run read and wrote, process by process: `provm graph {name} --format prov-json` (W3C PROV), or `--format svg -o run.svg`.\n"
    )
}
