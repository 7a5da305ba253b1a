//! The flattened image as an ext4 file system, the same bytes whenever
//! the image is the same, on any host: built by e2fsprogs (`mkfs.ext4 -d`
//! copies the staging directory, then a `debugfs` script gives each inode
//! its owner, mode and times and makes the device nodes and extended
//! attributes), with everything that would vary fixed: the UUID and the
//! directory hash seed, the superblock's and every inode's times (mkfs
//! takes its clock from E2FSPROGS_FAKE_TIME, which e2fsprogs 1.47.0
//! honours; SOURCE_DATE_EPOCH it does not), the features and geometry
//! (provm's own mke2fs.conf, not the host's), and the order files are
//! created in (mkfs -d reads directories sorted, debugfs runs the tree's
//! sorted order). The ctime mkfs copies from the staging files, which no
//! tool can set, is overwritten by the script.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::flatten::{Kind, Node, Tree};
use super::ContainerError;

/// The file system's UUID and directory hash seed: provm's, for every image.
const UUID: &str = "70726f76-6d00-4f43-8900-696d61676573";
/// Every time e2fsprogs stamps of its own (the superblock's, each inode's
/// creation time): 2000-01-01T00:00:00Z, provm's pinned epoch.
pub const FIXED_TIME: u64 = 946_684_800;
const BLOCK: u64 = 4096;
/// Free room for the command's writes on a container image's disk, which
/// go to the run's overlay: the disk file is sparse, but every run
/// digests all of it, so it is kept moderate.
pub const FREE_BYTES: u64 = 256 << 20;
/// ext4 without a journal (the guest's disk is a throwaway overlay, and a
/// journal is writes the guest need not make), with the features the
/// guest kernel reads, whatever the host's /etc/mke2fs.conf says.
const MKE2FS_CONF: &str = "[defaults]
	base_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
	default_mntopts = acl,user_xattr
	blocksize = 4096
	inode_size = 256
[fs_types]
	ext4 = {
		features = extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
	}
";

/// Builds the file system of `tree` into `output`, a file not there yet,
/// with `free_bytes` of room; `scratch` holds the tools' inputs.
pub fn build(
    tree: &Tree,
    scratch: &Path,
    output: &Path,
    free_bytes: u64,
) -> Result<(), ContainerError> {
    let (bytes, inodes) = size(tree, free_bytes);
    let config = scratch.join("mke2fs.conf");
    fs::write(&config, MKE2FS_CONF).map_err(write_error(&config))?;
    // `-T ext4`: the usage type too is ours (by size, mkfs would look up a
    // "small" or "floppy" type in the configuration, and warn).
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.env("MKE2FS_CONFIG", &config)
        .env("E2FSPROGS_FAKE_TIME", FIXED_TIME.to_string())
        .args([
            "-q", "-t", "ext4", "-T", "ext4", "-m", "0", "-U", UUID, "-N",
        ])
        .arg(inodes.to_string())
        .arg("-E")
        .arg(format!(
            "hash_seed={UUID},root_owner=0:0,lazy_itable_init=0"
        ))
        .arg("-d")
        .arg(tree.staging())
        .arg(output)
        .arg(format!("{}k", bytes / 1024));
    run("mkfs.ext4", &mut mkfs)?;
    let script = scratch.join("inodes.debugfs");
    fs::write(&script, debugfs_script(tree, scratch)?).map_err(write_error(&script))?;
    let mut debugfs = Command::new("debugfs");
    debugfs
        .env("E2FSPROGS_FAKE_TIME", FIXED_TIME.to_string())
        .arg("-w")
        .arg("-f")
        .arg(&script)
        .arg(output);
    run("debugfs", &mut debugfs)
}

/// The file system's size in bytes and its inode count: the tree's
/// content with room for metadata, plus `free_bytes`.
fn size(tree: &Tree, free_bytes: u64) -> (u64, u64) {
    let mut blocks = 0;
    for (path, node) in &tree.nodes {
        blocks += 1;
        if node.kind == Kind::File {
            let len = fs::symlink_metadata(tree.staging().join(path)).map_or(0, |m| m.len());
            blocks += len.div_ceil(BLOCK);
        }
    }
    let inodes = tree.nodes.len() as u64 * 5 / 4 + 16_384;
    let used = blocks * BLOCK + inodes * 256;
    let bytes = used + used / 4 + free_bytes;
    (bytes.div_ceil(1 << 20) << 20, inodes)
}

/// The debugfs commands that give every inode its metadata, in the
/// tree's order.
fn debugfs_script(tree: &Tree, scratch: &Path) -> Result<String, ContainerError> {
    let mut script = String::new();
    if !tree.nodes.contains_key(Path::new("lost+found")) {
        script += "rmdir /lost+found\n";
    }
    for (index, (path, node)) in tree.nodes.iter().enumerate() {
        let absolute = quoted(&Path::new("/").join(path))?;
        let device = match node.kind {
            Kind::CharDevice { major, minor } => Some(format!("c {major} {minor}")),
            Kind::BlockDevice { major, minor } => Some(format!("b {major} {minor}")),
            Kind::Fifo => Some("p".to_owned()),
            _ => None,
        };
        if let Some(device) = device {
            // mknod names its node in the current directory.
            let parent = quoted(&Path::new("/").join(path.parent().unwrap_or(Path::new(""))))?;
            let name = quoted(Path::new(path.file_name().unwrap_or_default()))?;
            writeln!(script, "cd {parent}\nmknod {name} {device}\ncd /").expect("to a String");
        }
        set_fields(&mut script, &absolute, node);
        for (number, (name, value)) in node.xattrs.iter().enumerate() {
            let file = scratch.join(format!("xattr-{index}-{number}"));
            fs::write(&file, value).map_err(write_error(&file))?;
            let name = quoted(Path::new(name))?;
            writeln!(script, "ea_set -f {} {absolute} {name}", quoted(&file)?)
                .expect("to a String");
        }
    }
    Ok(script)
}

fn set_fields(script: &mut String, path: &str, node: &Node) {
    let file_type = match node.kind {
        Kind::Directory => 0o040000,
        Kind::File => 0o100000,
        Kind::Symlink => 0o120000,
        Kind::CharDevice { .. } => 0o020000,
        Kind::BlockDevice { .. } => 0o060000,
        Kind::Fifo => 0o010000,
    };
    let fields = [
        ("mode", format!("0{:o}", file_type | node.mode)),
        ("uid", node.uid.to_string()),
        ("gid", node.gid.to_string()),
        ("mtime", format!("@{}", node.mtime)),
        ("atime", format!("@{}", node.mtime)),
        ("ctime", format!("@{}", node.mtime)),
    ];
    for (field, value) in fields {
        writeln!(script, "set_inode_field {path} {field} {value}").expect("to a String");
    }
}

/// `path` as one debugfs argument: in double quotes, a quote doubled (its
/// parser's rule). A newline would end the command, and the script is
/// text: such names are refused.
fn quoted(path: &Path) -> Result<String, ContainerError> {
    match path.to_str() {
        Some(text) if !text.contains('\n') => Ok(format!("\"{}\"", text.replace('"', "\"\""))),
        _ => Err(ContainerError::Unsupported(format!(
            "the name {path:?} is not UTF-8 or has a newline, which provm cannot put on the disk"
        ))),
    }
}

/// Runs an e2fsprogs tool; a message on its standard error is a failure
/// (debugfs reports a failed command there and still exits 0), except for
/// the version banner it prints first.
fn run(tool: &str, command: &mut Command) -> Result<(), ContainerError> {
    let output = command.output().map_err(|source| ContainerError::Tool {
        tool: tool.to_owned(),
        message: format!("{source}; install e2fsprogs (scripts/install-deps)"),
    })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with("debugfs 1."))
        .collect();
    if !output.status.success() || !complaints.is_empty() {
        return Err(ContainerError::Tool {
            tool: tool.to_owned(),
            message: complaints.join("; "),
        });
    }
    Ok(())
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> ContainerError {
    let path: PathBuf = path.to_owned();
    move |source| ContainerError::Write { path, source }
}
