//! Embeds what provm carries inside its binary.
//!
//! Builds the guest agent as a static x86-64 binary and leaves it in OUT_DIR,
//! where engine/src/initramfs.rs embeds it: provm carries the exact agent it speaks
//! to. The agent has its own target directory, so this nested cargo never
//! waits on the outer build's lock.
//!
//! Names the commit it is built from (`PROVM_COMMIT`), which every trace
//! records.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    build_guest_agent();
    embed_kernel_inputs();
    name_commit();
}

/// The sources provm is built from: a change to them makes the build
/// "-dirty".
/// Relative to this crate's folder, as cargo runs this script there.
const SOURCES: &[&str] = &[
    "../src",
    "../engine",
    "../vmm",
    "../trace",
    "../seams",
    "../analysis",
    "../guest-agent",
    "../kernels",
    "../Cargo.toml",
    "../Cargo.lock",
];

/// Sets `PROVM_COMMIT` to `git rev-parse HEAD`, with `-dirty` when the
/// sources differ from it; left unset outside git, unless the builder sets
/// it (a build from a source archive can name its commit so).
fn name_commit() {
    println!("cargo:rerun-if-env-changed=PROVM_COMMIT");
    if let Ok(commit) = env::var("PROVM_COMMIT") {
        println!("cargo:rustc-env=PROVM_COMMIT={commit}");
        return;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    // A commit, a checkout or a `git add` changes these; an edit changes
    // the sources. Only those that exist: cargo takes a missing file as
    // changed at every build (a repository need not have packed-refs, nor
    // a branch its own file), and would build the engine and provm again
    // each time. A commit that creates one also rewrites the index.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for file in ["HEAD", "index", "packed-refs"]
        .into_iter()
        .chain(branch.as_deref())
    {
        if let Some(path) = git(&["rev-parse", "--git-path", file])
            .filter(|path| std::path::Path::new(path).exists())
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }
    // Without optional locks, `git status` does not refresh the index:
    // writing it would change a file this script watches, and every later
    // cargo run would build the engine and provm again.
    let mut status = vec!["--no-optional-locks", "status", "--porcelain", "--"];
    status.extend_from_slice(SOURCES);
    let dirty = git(&status).is_none_or(|changes| !changes.is_empty());
    let mark = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=PROVM_COMMIT={head}{mark}");
}

fn build_guest_agent() {
    println!("cargo:rerun-if-changed=../guest-agent/src");
    println!("cargo:rerun-if-changed=../guest-agent/Cargo.toml");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target_dir = out_dir.join("guest-agent-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "provm-guest-agent",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // Small beats fast here: the guest kernel copies the binary into
        // memory at every boot, and guest ring 0 may be emulated.
        .args(["--config", "profile.release.opt-level=\"z\""])
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        .args(["--config", "profile.release.panic=\"abort\""])
        .args(["--config", "profile.release.strip=true"])
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            format!(
                "-C target-feature=+crt-static --remap-path-prefix={}=/cargo",
                cargo_home().display()
            ),
        )
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .status()
        .expect("cannot run cargo to build the guest agent");
    assert!(status.success(), "building the guest agent failed");
    let built = target_dir
        .join(TARGET)
        .join("release")
        .join("provm-guest-agent");
    std::fs::copy(&built, out_dir.join("provm-guest-agent")).expect("copying the guest agent");
}

/// Where cargo keeps the crates it downloaded. Their source paths end up
/// in the agent's panic messages, and the agent in every trace: remapped,
/// a trace does not carry its builder's home directory.
fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env::var_os("HOME").unwrap_or_default()).join(".cargo"))
}

/// Lists every file under kernels/ (build script, config fragment, patches)
/// for engine/src/kernel.rs to embed: they are the kernel build's inputs and its
/// cache key, so provm needs no source tree at run time.
fn embed_kernel_inputs() {
    println!("cargo:rerun-if-changed=../kernels");
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../kernels");
    let mut files = Vec::new();
    collect_files(&root, &mut files);
    // What the build reads, and nothing else: a documentation change must
    // not mean a new kernel.
    files.retain(|file| file.extension().is_none_or(|extension| extension != "md"));
    files.sort();
    let mut table = String::from("pub const KERNEL_INPUTS: &[(&str, &[u8])] = &[\n");
    for file in files {
        let relative = file
            .strip_prefix(&root)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        table += &format!(
            "    ({relative:?}, include_bytes!({:?})),\n",
            file.to_str().unwrap()
        );
    }
    table += "];\n";
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("kernel_inputs.rs");
    std::fs::write(out, table).unwrap();
}

fn collect_files(dir: &std::path::Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, files);
        } else {
            files.push(path);
        }
    }
}
