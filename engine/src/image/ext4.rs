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
pub const BLOCK: u64 = 4096;
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
    make(tree, scratch, output, bytes, inodes)?;
    let script = scratch.join("inodes.debugfs");
    fs::write(&script, debugfs_script(tree, scratch, &[])?).map_err(write_error(&script))?;
    debugfs_write(&script, output)
}

/// Where a placed file's blocks are on the disk: `blocks` blocks from
/// `logical` in the file are at `physical` on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub blocks: u64,
}

impl Extent {
    /// The disk offset of byte `offset` of the file, and how many bytes
    /// from there this extent holds; None if the extent does not hold it.
    pub fn locate(&self, offset: u64) -> Option<(u64, u64)> {
        let start = self.logical * BLOCK;
        let end = (self.logical + self.blocks) * BLOCK;
        (start..end)
            .contains(&offset)
            .then(|| (self.physical * BLOCK + offset - start, end - offset))
    }
}

/// Builds the file system of `tree` as `build` does, except for the
/// `placed` files (paths in the tree, each with its length), which are
/// empty in the staging directory: each gets its blocks allocated, as
/// initialised extents, and its size, and the caller writes its bytes at
/// the extents returned (one list per placed file, in logical order).
///
/// Why: `mkfs.ext4 -d` copies a file block by block, allocating each in
/// turn (under QEMU's TCG, 64 MiB took 5.3 s, 1 GiB about 85 s), and the
/// caller must then read the files a second time to check what was
/// copied. Allocated here in one `fallocate` per file (e2fsprogs'
/// allocator, so the layout is as reproducible as the rest), the bytes go
/// in with large writes in the pass that digests them. debugfs's
/// fallocate makes uninitialised extents (read as zeros): each is turned
/// into an initialised one with debugfs's extent editor (`replace_node`),
/// which no e2fsprogs tool does for a whole file.
pub fn build_placed(
    tree: &Tree,
    scratch: &Path,
    output: &Path,
    placed: &[(PathBuf, u64)],
) -> Result<Vec<Vec<Extent>>, ContainerError> {
    let (bytes, inodes) = size(tree, 0);
    let data_blocks: u64 = placed.iter().map(|(_, len)| len.div_ceil(BLOCK)).sum();
    // The placed files' blocks, an extent block per 340 extents (of at
    // most 32768 blocks each) and the block groups' own metadata (about 1%:
    // backup superblocks, descriptors and the blocks reserved for growth),
    // with room to spare.
    let data = data_blocks * BLOCK;
    let bytes = (bytes + data + data / 32 + (4 << 20)).div_ceil(1 << 20) << 20;
    make(tree, scratch, output, bytes, inodes)?;
    let script = scratch.join("inodes.debugfs");
    fs::write(&script, debugfs_script(tree, scratch, placed)?).map_err(write_error(&script))?;
    debugfs_write(&script, output)?;
    // Where fallocate put each file's blocks.
    let mut dump = String::new();
    for (path, len) in placed {
        if *len > 0 {
            writeln!(dump, "ex -l {}", quoted(&Path::new("/").join(path))?).expect("to a String");
        }
    }
    let script = scratch.join("extents.debugfs");
    fs::write(&script, &dump).map_err(write_error(&script))?;
    let mut debugfs = Command::new("debugfs");
    debugfs.arg("-f").arg(&script).arg(output);
    let listing = run("debugfs", &mut debugfs)?;
    let mut extents = parse_extents(&listing, placed)?;
    // Every extent initialised.
    let mut edit = String::new();
    for ((path, _), file) in placed.iter().zip(&extents) {
        if file.iter().all(|extent| !extent.uninit) {
            continue;
        }
        writeln!(edit, "extent_open {}", quoted(&Path::new("/").join(path))?).expect("to a String");
        for extent in file.iter().filter(|extent| extent.uninit) {
            let Extent {
                logical,
                physical,
                blocks,
            } = extent.extent;
            writeln!(
                edit,
                "goto_block {logical}\nreplace_node {logical} {blocks} {physical}"
            )
            .expect("to a String");
        }
        edit += "extent_close\n";
    }
    let script = scratch.join("initialise.debugfs");
    fs::write(&script, &edit).map_err(write_error(&script))?;
    debugfs_write(&script, output)?;
    Ok(extents
        .iter_mut()
        .map(|file| file.iter().map(|extent| extent.extent).collect())
        .collect())
}

/// One line of `ex -l`: a leaf extent, and whether it is uninitialised.
struct Listed {
    extent: Extent,
    uninit: bool,
}

/// The leaf extents of each placed file, from debugfs's `ex -l` listing
/// of them in order: a heading line per file, then one line per extent,
/// "LEVEL/ DEPTH  N/ M  FIRST - LAST  PFIRST - PLAST  LEN [Uninit]", or
/// "LEVEL/ DEPTH  N/ M  FIRST  PFIRST  1 [Uninit]" for a single block.
fn parse_extents(
    listing: &str,
    placed: &[(PathBuf, u64)],
) -> Result<Vec<Vec<Listed>>, ContainerError> {
    let unexpected = |line: &str| ContainerError::Tool {
        tool: "debugfs".to_owned(),
        message: format!("an extent listing provm does not read: {line:?}"),
    };
    let mut files: Vec<Vec<Listed>> = Vec::new();
    for line in listing.lines() {
        let line = line.trim();
        if line.starts_with("Level") {
            files.push(Vec::new());
            continue;
        }
        if line.is_empty() || line.starts_with("debugfs") {
            continue;
        }
        // "1/ 1" and "2/ 10": one token each.
        let joined = line.replace("/ ", "/").replace("/ ", "/");
        let tokens: Vec<&str> = joined.split_whitespace().collect();
        let number = |index: usize| -> Result<u64, ContainerError> {
            tokens
                .get(index)
                .and_then(|token| token.parse().ok())
                .ok_or_else(|| unexpected(line))
        };
        let (extent, rest) = if tokens.get(3) == Some(&"-") {
            let extent = Extent {
                logical: number(2)?,
                physical: number(5)?,
                blocks: number(8)?,
            };
            (extent, 9)
        } else {
            let extent = Extent {
                logical: number(2)?,
                physical: number(3)?,
                blocks: number(4)?,
            };
            (extent, 5)
        };
        let uninit = tokens[rest..].contains(&"Uninit");
        files
            .last_mut()
            .ok_or_else(|| unexpected(line))?
            .push(Listed { extent, uninit });
    }
    // Files of no bytes have no listing.
    let mut listed = files.into_iter();
    let mut all = Vec::new();
    for (path, len) in placed {
        let file = if *len > 0 {
            listed.next().unwrap_or_default()
        } else {
            Vec::new()
        };
        let blocks: u64 = file.iter().map(|listed| listed.extent.blocks).sum();
        if blocks != len.div_ceil(BLOCK) {
            return Err(ContainerError::Tool {
                tool: "debugfs".to_owned(),
                message: format!(
                    "{} has {blocks} blocks allocated for {len} bytes",
                    path.display()
                ),
            });
        }
        all.push(file);
    }
    Ok(all)
}

/// mkfs.ext4 of the staging directory, `bytes` large with `inodes` inodes.
fn make(
    tree: &Tree,
    scratch: &Path,
    output: &Path,
    bytes: u64,
    inodes: u64,
) -> Result<(), ContainerError> {
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
    run("mkfs.ext4", &mut mkfs).map(drop)
}

/// Runs the debugfs `script` on `output`, writable.
fn debugfs_write(script: &Path, output: &Path) -> Result<(), ContainerError> {
    let mut debugfs = Command::new("debugfs");
    debugfs
        .env("E2FSPROGS_FAKE_TIME", FIXED_TIME.to_string())
        .arg("-w")
        .arg("-f")
        .arg(script)
        .arg(output);
    run("debugfs", &mut debugfs).map(drop)
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
/// tree's order; each `placed` file (empty in the staging directory) first
/// gets its blocks and its size.
fn debugfs_script(
    tree: &Tree,
    scratch: &Path,
    placed: &[(PathBuf, u64)],
) -> Result<String, ContainerError> {
    let mut script = String::new();
    if !tree.nodes.contains_key(Path::new("lost+found")) {
        script += "rmdir /lost+found\n";
    }
    for (path, len) in placed {
        let absolute = quoted(&Path::new("/").join(path))?;
        if *len > 0 {
            writeln!(script, "fallocate {absolute} 0 {}", len.div_ceil(BLOCK) - 1)
                .expect("to a String");
        }
        writeln!(script, "set_inode_field {absolute} size {len}").expect("to a String");
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
fn run(tool: &str, command: &mut Command) -> Result<String, ContainerError> {
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
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> ContainerError {
    let path: PathBuf = path.to_owned();
    move |source| ContainerError::Write { path, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::flatten::{Kind, Node};

    #[test]
    fn extent_listings_are_read_whatever_their_shape() {
        let listing = "debugfs: ex -l \"/0/a\"
Level Entries         Logical        Physical Length Flags
 1/ 1   1/  9      0 -  31352   1415 -  32767  31353 Uninit
 1/ 1   2/  9  31353 -  64119  32907 -  65673  32767 
debugfs: ex -l \"/0/b\"
Level Entries       Logical      Physical Length Flags
 0/ 0   1/  1     0            12             1 Uninit
";
        let placed = [
            (PathBuf::from("0/a"), 64120 * BLOCK),
            (PathBuf::from("0/empty"), 0),
            (PathBuf::from("0/b"), 5),
        ];
        let files = parse_extents(listing, &placed).unwrap();
        let extents: Vec<Vec<(Extent, bool)>> = files
            .iter()
            .map(|file| file.iter().map(|l| (l.extent, l.uninit)).collect())
            .collect();
        let extent = |logical, physical, blocks| Extent {
            logical,
            physical,
            blocks,
        };
        assert_eq!(
            extents,
            [
                vec![
                    (extent(0, 1415, 31353), true),
                    (extent(31353, 32907, 32767), false)
                ],
                vec![],
                vec![(extent(0, 12, 1), true)],
            ]
        );
        // A listing that does not cover a file's length is an error.
        let short = [(PathBuf::from("0/a"), 70000 * BLOCK)];
        assert!(parse_extents(listing, &short).is_err());
        assert_eq!(
            extent(2, 100, 3).locate(2 * BLOCK + 7),
            Some((100 * BLOCK + 7, 3 * BLOCK - 7))
        );
        assert_eq!(extent(2, 100, 3).locate(5 * BLOCK), None);
    }

    /// A placed file's blocks are allocated as initialised extents that
    /// cover it, and the file system is whole (e2fsck finds nothing).
    #[test]
    fn placed_files_get_initialised_extents_that_hold_what_is_written_there() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("root");
        fs::create_dir_all(staging.join("0")).unwrap();
        let mut tree = Tree::new(&staging);
        let node = |kind| Node {
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: FIXED_TIME,
            xattrs: Default::default(),
        };
        tree.nodes.insert("0".into(), node(Kind::Directory));
        let sizes = [3 * (1 << 20) + 5, 0, 1, BLOCK];
        let mut placed = Vec::new();
        for (number, len) in sizes.iter().enumerate() {
            let path = PathBuf::from(format!("0/f{number}"));
            fs::write(staging.join(&path), b"").unwrap();
            tree.nodes.insert(path.clone(), node(Kind::File));
            placed.push((path, *len));
        }
        let disk = dir.path().join("disk.ext4");
        let extents = build_placed(&tree, dir.path(), &disk, &placed).unwrap();
        let file = fs::OpenOptions::new().write(true).open(&disk).unwrap();
        for ((_, len), extents) in placed.iter().zip(&extents) {
            let content: Vec<u8> = (0..*len).map(|i| (i % 251) as u8).collect();
            for extent in extents {
                let start = (extent.logical * BLOCK) as usize;
                let end = (start + (extent.blocks * BLOCK) as usize).min(content.len());
                std::os::unix::fs::FileExt::write_all_at(
                    &file,
                    &content[start..end],
                    extent.physical * BLOCK,
                )
                .unwrap();
            }
        }
        drop(file);
        let fsck = Command::new("e2fsck")
            .arg("-fn")
            .arg(&disk)
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "{}",
            String::from_utf8_lossy(&fsck.stdout)
        );
        for ((path, len), _) in placed.iter().zip(&extents) {
            let out = dir.path().join("out");
            let dumped = Command::new("debugfs")
                .arg("-R")
                .arg(format!("dump /{} {}", path.display(), out.display()))
                .arg(&disk)
                .output()
                .unwrap();
            assert!(dumped.status.success());
            let expected: Vec<u8> = (0..*len).map(|i| (i % 251) as u8).collect();
            assert_eq!(fs::read(&out).unwrap(), expected, "{}", path.display());
        }
    }
}
