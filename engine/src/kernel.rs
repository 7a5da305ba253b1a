//! The guest kernel: built from Debian's linux-source-6.1 with provm's config
//! fragment and patches (kernels/), cached by a digest of all of them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::notice;

include!(concat!(env!("OUT_DIR"), "/kernel_inputs.rs"));

pub const SOURCE_PACKAGE: &str = "linux-source-6.1";
pub const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";
const BUILD_TOOLS: &[&str] = &["make", "gcc", "bison", "flex", "bc", "patch"];
const BUILD_PACKAGES: &str = "linux-source-6.1 build-essential bc bison flex libelf-dev";

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("the kernel source is not installed ({SOURCE_TARBALL} is missing); install it with: apt-get install {BUILD_PACKAGES}")]
    SourceMissing,
    #[error("`{0}` is needed to build the kernel; install the build tools with: apt-get install {BUILD_PACKAGES}")]
    ToolMissing(&'static str),
    #[error("the guest kernel{} has not been built yet; build it (a few minutes, once) with: provm kernel build{}", .0.described(), .0.build_flag())]
    NotBuilt(Variant),
    #[error("the kernel build failed (exit status {0}); its output is above")]
    BuildFailed(std::process::ExitStatus),
    #[error("kernel build: {0}")]
    Io(#[from] std::io::Error),
}

/// Where provm keeps what it builds: $PROVM_CACHE, else $XDG_CACHE_HOME/provm,
/// else ~/.cache/provm.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PROVM_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("provm")
}

/// The installed source package's version, the source half of the cache key.
fn source_version() -> Result<String, KernelError> {
    if !Path::new(SOURCE_TARBALL).exists() {
        return Err(KernelError::SourceMissing);
    }
    let output = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", SOURCE_PACKAGE])
        .output()?;
    if !output.status.success() {
        return Err(KernelError::SourceMissing);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Which kernel: the single-CPU one, or the SMP variant that guests with
/// more than one vCPU boot (kernels/smp: a config fragment and patches
/// over the single-CPU kernel's inputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Up,
    Smp,
}

/// The SMP variant's inputs, which the single-CPU kernel does not depend on.
const SMP_INPUTS: &str = "smp/";

impl Variant {
    pub fn for_cpus(cpus: u8) -> Self {
        if cpus > 1 {
            Variant::Smp
        } else {
            Variant::Up
        }
    }

    /// How `NotBuilt` names it: the SMP one, for a guest of more than one
    /// vCPU, is a kernel of its own.
    fn described(self) -> &'static str {
        match self {
            Variant::Up => "",
            Variant::Smp => " for more than one vCPU (--cpus N)",
        }
    }

    /// The `provm kernel build` flag that builds it.
    fn build_flag(self) -> &'static str {
        match self {
            Variant::Up => "",
            Variant::Smp => " --smp",
        }
    }

    /// The inputs this variant's build reads.
    fn inputs(self) -> impl Iterator<Item = &'static (&'static str, &'static [u8])> {
        KERNEL_INPUTS
            .iter()
            .filter(move |(name, _)| self == Variant::Smp || !name.starts_with(SMP_INPUTS))
    }

    /// Its build script, among the staged inputs.
    fn script(self) -> &'static str {
        match self {
            Variant::Up => "build.sh",
            Variant::Smp => "smp/build.sh",
        }
    }
}

/// The cache key: source version, then every input file's name and bytes.
fn digest(source_version: &str, variant: Variant) -> String {
    let mut hasher = Sha256::new();
    hasher.update(source_version.as_bytes());
    for (name, bytes) in variant.inputs() {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    provm_trace::hex(&hasher.finalize()[..8])
}

fn build_dir(variant: Variant) -> Result<PathBuf, KernelError> {
    Ok(cache_dir()
        .join("kernels")
        .join(digest(&source_version()?, variant)))
}

/// The kernel profile built with `vmlinux`: the offsets of the structures
/// an observer reads (kernels/profile/provm_profile.c), as JSON.
pub fn profile_path(vmlinux: &Path) -> PathBuf {
    vmlinux.with_file_name("profile.json")
}

/// The built vmlinux of `variant` for the current inputs.
pub fn find(variant: Variant) -> Result<PathBuf, KernelError> {
    let vmlinux = build_dir(variant)?.join("vmlinux");
    if vmlinux.exists() {
        Ok(vmlinux)
    } else {
        Err(KernelError::NotBuilt(variant))
    }
}

/// Builds the kernel `variant` unless the cache has it; returns the
/// vmlinux path.
pub fn build(variant: Variant) -> Result<PathBuf, KernelError> {
    let out_dir = build_dir(variant)?;
    let vmlinux = out_dir.join("vmlinux");
    if vmlinux.exists() {
        notice!("kernel up to date ({})", vmlinux.display());
        return Ok(vmlinux);
    }
    for tool in BUILD_TOOLS {
        if Command::new("which")
            .arg(tool)
            .output()
            .map_or(true, |o| !o.status.success())
        {
            return Err(KernelError::ToolMissing(tool));
        }
    }
    let parent = out_dir.parent().unwrap();
    std::fs::create_dir_all(parent)?;
    // Removed when dropped, even if the build fails.
    let staging = tempfile::Builder::new()
        .prefix(".inputs-")
        .tempdir_in(parent)?;
    for (name, bytes) in variant.inputs() {
        let path = staging.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::File::create(&path)?.write_all(bytes)?;
    }
    notice!("building the kernel into {}", out_dir.display());
    let status = Command::new("bash")
        .arg(staging.path().join(variant.script()))
        .arg(SOURCE_TARBALL)
        .arg(&out_dir)
        .status()?;
    if !status.success() {
        return Err(KernelError::BuildFailed(status));
    }
    Ok(vmlinux)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_include_the_script_config_and_patches() {
        let names: Vec<&str> = KERNEL_INPUTS.iter().map(|(name, _)| *name).collect();
        assert!(names.contains(&"build.sh"), "{names:?}");
        assert!(names.contains(&"provm.config"), "{names:?}");
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("patches/") && n.ends_with(".patch")),
            "{names:?}"
        );
    }

    #[test]
    fn digest_depends_on_the_source_version() {
        assert_eq!(digest("6.1.1", Variant::Up), digest("6.1.1", Variant::Up));
        assert_ne!(digest("6.1.1", Variant::Up), digest("6.1.2", Variant::Up));
        assert_eq!(digest("x", Variant::Up).len(), 16);
    }

    #[test]
    fn the_single_cpu_kernel_does_not_depend_on_the_smp_inputs() {
        let up: Vec<&str> = Variant::Up.inputs().map(|(name, _)| *name).collect();
        assert!(
            up.iter().all(|name| !name.starts_with(SMP_INPUTS)),
            "{up:?}"
        );
        let smp: Vec<&str> = Variant::Smp.inputs().map(|(name, _)| *name).collect();
        assert!(smp.contains(&"smp/build.sh") && smp.contains(&"smp/smp.config"));
        assert_ne!(digest("x", Variant::Up), digest("x", Variant::Smp));
    }
}
