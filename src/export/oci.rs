//! `provm export oci`: the files a run's processes read and executed, read
//! out of the recorded image, as an OCI image archive (an image layout in a
//! tar, what `skopeo` calls `oci-archive:`) whose entrypoint, environment
//! and working directory are the recorded command's: PROBE's
//! `export docker-image`, for a whole VM run.
//!
//! What goes in: every file version a process used (read or ran) that no
//! process of the run generated (the run's inputs: programs, libraries,
//! data), every program a process was started as (its argv[0] looked up in
//! PATH, as a shell does), each program's ELF interpreter (the kernel maps
//! it, so no process opens it), the working directory, and every symbolic
//! link and directory on the way to them. Contents come from the image as
//! it was recorded (ext4-view, without mounting); kernel file systems
//! (/proc, /sys, /dev) are left to the container runtime. Timestamps and
//! owners are zero, so the same run always gives the same image.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ext4_view::Ext4;
use oci_spec::image::{Arch, ConfigBuilder};
use provm_guest_agent::paths::normalize;
use provm_trace::manifest::Manifest;
use provm_vmm::disk::image::BaseImage;

use provm_engine::disk::{chain, file_system};
use provm_engine::image::layout::{LayerWriter, Layout};
use provm_engine::replay::{self, ReplayOptions};
use provm_trace::reader::Trace;

use super::ExportError;
use crate::output::AtomicFile;
use crate::provenance::{self, Provenance};

/// The tag the archive's one image carries (`oci-archive:image.tar:run`).
pub const TAG: &str = "run";
/// Symbolic links followed on one path before giving up (as ELOOP).
const MAX_LINKS: usize = 40;

/// A file system entry of the layer.
enum Entry {
    Directory { mode: u32 },
    File { mode: u32, content: Vec<u8> },
    Symlink { target: String },
}

/// Writes the OCI archive of the run `run` names to `output` (replacing it
/// only with `force`); returns its size. The trace is read and verified
/// once (and replayed if its provenance must be derived).
pub fn oci_archive(run: &ReplayOptions, output: &Path, force: bool) -> Result<usize, ExportError> {
    let trace = Trace::open(&run.trace)?;
    let graph = provenance::of_trace(&trace, run, false)?;
    let (base, _extracted) = replay::open_image(run, &trace)?;
    chain::check(&base, &trace.manifest.image)?;
    let archive = oci(&trace.manifest, &graph, base)?;
    AtomicFile::write(output, force, &archive)?;
    Ok(archive.len())
}

/// The OCI archive of the run `manifest` describes, whose provenance is
/// `graph`, with files read from `image`.
fn oci(manifest: &Manifest, graph: &Provenance, image: BaseImage) -> Result<Vec<u8>, ExportError> {
    let fs = file_system::open(image, &manifest.root_device)
        .map_err(|error| ExportError::Oci(error.to_string()))?;
    let mut layer = Layer {
        fs: &fs,
        entries: BTreeMap::new(),
    };
    let cwd = String::from_utf8_lossy(&normalize(b"/", manifest.cwd.as_bytes())).into_owned();
    layer.add(&cwd)?;
    let inputs: BTreeSet<&str> = provenance::input_files(graph)
        .into_iter()
        .map(|file| file.name.as_str())
        .collect();
    for path in inputs {
        layer.add(path)?;
    }
    let search_path = search_path(&manifest.env);
    let programs: BTreeSet<&str> = graph
        .activities
        .iter()
        .filter_map(|activity| activity.argv.first())
        .chain(manifest.argv.first())
        .map(String::as_str)
        .collect();
    for program in programs {
        layer.add_program(program, &cwd, &search_path)?;
    }
    let tar = layer.into_tar()?;
    archive(manifest, &cwd, tar)
}

/// PATH's directories in the recorded environment.
fn search_path(env: &[String]) -> Vec<String> {
    env.iter()
        .find_map(|entry| entry.strip_prefix("PATH="))
        .map(|path| path.split(':').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The layer's entries by absolute path, sorted so that a directory
/// precedes what it holds.
struct Layer<'a> {
    fs: &'a Ext4,
    entries: BTreeMap<String, Entry>,
}

impl Layer<'_> {
    /// `path` and everything on the way to it (directories, symbolic links
    /// and their targets); a path the image does not have is left out.
    fn add(&mut self, path: &str) -> Result<(), ExportError> {
        self.add_within(path, 0).map(|_| ())
    }

    /// Whether `path` exists in the image (having added it).
    fn add_within(&mut self, path: &str, links: usize) -> Result<bool, ExportError> {
        if links > MAX_LINKS {
            return Ok(false);
        }
        let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let mut current = String::new();
        for (index, component) in components.iter().enumerate() {
            let parent = if current.is_empty() { "/" } else { &current };
            let candidate = format!("{current}/{component}");
            let Ok(metadata) = self.fs.symlink_metadata(candidate.as_str()) else {
                return Ok(false);
            };
            let mode = u32::from(metadata.mode() & 0o7777);
            if metadata.is_symlink() {
                let target = self.fs.read_link(candidate.as_str()).map_err(ext4_error)?;
                let target = target
                    .to_str()
                    .map_err(|_| {
                        ExportError::Oci(format!("{candidate}: a link target that is not UTF-8"))
                    })?
                    .to_owned();
                let rest = components[index + 1..].join("/");
                let resolved = resolve(parent, &format!("{target}/{rest}"));
                self.entries.insert(candidate, Entry::Symlink { target });
                return self.add_within(&String::from_utf8_lossy(&resolved), links + 1);
            }
            if metadata.is_dir() {
                self.entries
                    .insert(candidate.clone(), Entry::Directory { mode });
            } else if index + 1 == components.len() && metadata.file_type().is_regular_file() {
                let content = self.fs.read(candidate.as_str()).map_err(ext4_error)?;
                self.add_interpreter(&content)?;
                self.entries
                    .insert(candidate.clone(), Entry::File { mode, content });
            } else {
                // A device or socket node, or a path through a file.
                return Ok(false);
            }
            current = candidate;
        }
        Ok(true)
    }

    /// The program a process was started as: a path, or a name looked up in
    /// the search path.
    fn add_program(
        &mut self,
        program: &str,
        cwd: &str,
        search: &[String],
    ) -> Result<(), ExportError> {
        if program.contains('/') {
            return self.add(&String::from_utf8_lossy(&resolve(cwd, program)));
        }
        for directory in search {
            if self.add_within(&format!("{directory}/{program}"), 0)? {
                break;
            }
        }
        Ok(())
    }

    /// The ELF interpreter of `content`, if it is a dynamically linked
    /// program.
    fn add_interpreter(&mut self, content: &[u8]) -> Result<(), ExportError> {
        if let Some(interpreter) = elf_interpreter(content) {
            self.add_within(&interpreter, 0)?;
        }
        Ok(())
    }

    /// The layer as an uncompressed tar.
    fn into_tar(self) -> Result<Vec<u8>, ExportError> {
        let mut tar = LayerWriter::new(0);
        for (path, entry) in &self.entries {
            let name = path.trim_start_matches('/');
            match entry {
                Entry::Directory { mode } => tar.directory(name, *mode),
                Entry::File { mode, content } => tar.file(name, *mode, content),
                Entry::Symlink { target } => tar.symlink(name, target),
            }
            .map_err(tar_error)?;
        }
        tar.finish().map_err(tar_error)
    }
}

/// `name` as a path lookup from the directory `base` finds it: an absolute
/// name (a link to `/lib/...`, a program run as `/bin/sh`) starts at the
/// root, not at `base`, which `normalize` would join it to.
fn resolve(base: &str, name: &str) -> Vec<u8> {
    let base = if name.starts_with('/') { "/" } else { base };
    normalize(base.as_bytes(), name.as_bytes())
}

/// PT_INTERP of an ELF program: the dynamic linker the kernel maps.
fn elf_interpreter(content: &[u8]) -> Option<String> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let elf = ElfFile64::<object::Endianness>::parse(content).ok()?;
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .find(|header| header.p_type(endian) == object::elf::PT_INTERP)
        .and_then(|header| header.data(endian, content).ok())
        .map(|path| {
            String::from_utf8_lossy(path.split(|&b| b == 0).next().unwrap_or(path)).into_owned()
        })
}

/// The image layout, in a tar: `oci-layout`, `index.json` and the blobs
/// (the layer, the configuration and the manifest).
fn archive(manifest: &Manifest, cwd: &str, layer: Vec<u8>) -> Result<Vec<u8>, ExportError> {
    let config = ConfigBuilder::default()
        .entrypoint(manifest.argv.clone())
        .env(manifest.env.clone())
        .working_dir(cwd.to_owned())
        .build()
        .map_err(oci_error)?;
    Layout::new(Arch::Amd64, config, vec![layer], TAG)
        .map_err(oci_error)?
        .tar()
        .map_err(tar_error)
}

fn ext4_error(error: ext4_view::Ext4Error) -> ExportError {
    ExportError::Oci(format!("reading the recorded image: {error}"))
}

fn tar_error(error: std::io::Error) -> ExportError {
    ExportError::Oci(format!("writing the archive: {error}"))
}

fn oci_error(error: oci_spec::OciSpecError) -> ExportError {
    ExportError::Oci(format!("making the OCI image: {error}"))
}
