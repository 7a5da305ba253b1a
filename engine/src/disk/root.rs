//! Finding the root file system on the image: a bare ext2/3/4 file system,
//! or a partition of an MBR or GPT partition table. Which device the agent
//! mounts as `/` is the command's choice (`--root` overrides it), so it is
//! made here, over the VMM's read-only [`Disk`], not inside the VMM.
//!
//! The `mbrman` and `gpt` crates read the tables (MBR primary and logical
//! partitions, numbered as Linux numbers them; the primary GPT, its header
//! and entry array checksums verified) through [`DiskReader`]; telling an
//! ext2/3/4 file system by its superblock magic is provm's own. Sectors are
//! 512 bytes, as virtio-blk presents them.

use std::fmt;
use std::io;

use gpt::disk::LogicalBlockSize;
use gpt::header::{Header, HeaderError};
use gpt::partition_types::{self, Type as GptType};
use mbrman::MBR;
use provm_vmm::disk::Disk;

use super::reader::DiskReader;

const SECTOR: u64 = 512;
/// Offset of the ext2/3/4 superblock magic from the file system's start.
const EXT_MAGIC_OFFSET: u64 = 1080;
const EXT_MAGIC: u16 = 0xEF53;
const MBR_PROTECTIVE: u8 = 0xEE;
/// The only GPT entry size the `gpt` crate reads: it asserts (panics) on any
/// other, although the specification allows larger ones.
const GPT_ENTRY_SIZE: u32 = 128;
/// Caps the entry array a (corrupt) GPT header can make `gpt` read: it
/// sizes its reads by the header's entry count. Real tables are 16 KiB.
const GPT_MAX_ENTRIES_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("the disk has neither a partition table nor an ext2/3/4 filesystem; pass an image that holds a Linux root filesystem")]
    NoFilesystem,
    #[error("no partition holds an ext2/3/4 filesystem (found {found}); pass --root /dev/vdaN to choose the root partition")]
    NoRootPartition { found: String },
    #[error("corrupt GPT: {0}; repair the partition table (e.g. with `gdisk`)")]
    CorruptGpt(String),
    #[error("corrupt MBR partition table: {0}; repair it (e.g. with `fdisk`)")]
    CorruptMbr(String),
    #[error("--root {0:?} names no partition; use /dev/vdaN, vdaN or N, with N from 1")]
    BadRootSyntax(String),
    #[error("--root {requested:?}: the disk has no such partition (found {found})")]
    NoSuchPartition { requested: String, found: String },
    #[error("cannot read the disk: {0}")]
    Io(#[from] io::Error),
}

/// The root filesystem's device: the whole disk or one of its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootChoice {
    /// 1-based, as Linux numbers /dev/vdaN; `None` for the whole disk.
    pub partition: Option<u32>,
    /// Why this device was chosen, for the log.
    pub reason: String,
}

impl RootChoice {
    /// The guest's name for the device, e.g. `/dev/vda2`.
    pub fn device(&self) -> String {
        match self.partition {
            Some(n) => format!("/dev/vda{n}"),
            None => "/dev/vda".to_string(),
        }
    }
}

/// Chooses the root filesystem: a bare filesystem is the whole disk; in a
/// partition table, the first GPT "Linux root (x86-64)" partition, else the
/// largest partition holding an ext2/3/4 filesystem.
pub fn find_root(disk: &mut dyn Disk) -> Result<RootChoice, RootError> {
    let Some(partitions) = read_table(disk)? else {
        if !has_ext_magic(disk, 0)? {
            return Err(RootError::NoFilesystem);
        }
        return Ok(RootChoice {
            partition: None,
            reason: "the disk is a bare ext2/3/4 filesystem".to_string(),
        });
    };
    if let Some(p) = partitions.iter().find(|p| p.is_gpt_linux_root()) {
        return Ok(RootChoice {
            partition: Some(p.number),
            reason: format!(
                "partition {} has the GPT type Linux root (x86-64)",
                p.number
            ),
        });
    }
    let mut largest_ext: Option<&Partition> = None;
    for p in &partitions {
        let bigger = largest_ext.is_none_or(|best| p.size > best.size);
        if bigger && has_ext_magic(disk, p.start)? {
            largest_ext = Some(p);
        }
    }
    match largest_ext {
        Some(p) => Ok(RootChoice {
            partition: Some(p.number),
            reason: format!(
                "partition {} is the largest with an ext2/3/4 filesystem ({} MiB)",
                p.number,
                p.size >> 20
            ),
        }),
        None => Err(RootError::NoRootPartition {
            found: describe(&partitions),
        }),
    }
}

/// Resolves a `--root` value (`/dev/vdaN`, `vdaN` or `N`) to a partition
/// that exists in the disk's partition table.
pub fn root_override(disk: &mut dyn Disk, value: &str) -> Result<RootChoice, RootError> {
    let digits = value
        .strip_prefix("/dev/vda")
        .or_else(|| value.strip_prefix("vda"))
        .unwrap_or(value);
    let number = match digits.parse::<u32>() {
        Ok(n) if n >= 1 && digits.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => return Err(RootError::BadRootSyntax(value.to_string())),
    };
    let partitions = read_table(disk)?;
    if !partitions.iter().flatten().any(|p| p.number == number) {
        return Err(RootError::NoSuchPartition {
            requested: value.to_string(),
            found: partitions
                .as_deref()
                .map_or("no partition table".to_string(), describe),
        });
    }
    Ok(RootChoice {
        partition: Some(number),
        reason: format!("--root {value}"),
    })
}

/// Where the root file system the guest mounted as `device` (`/dev/vda`
/// or `/dev/vdaN`) lies on the disk: its byte offset and length.
pub fn extent(disk: &mut dyn Disk, device: &str) -> Result<(u64, u64), RootError> {
    if device == "/dev/vda" {
        return Ok((0, disk.size()));
    }
    let number = root_override(disk, device)?.partition;
    let partitions = read_table(disk)?.unwrap_or_default();
    let partition = partitions
        .iter()
        .find(|p| Some(p.number) == number)
        .expect("root_override found the partition");
    Ok((partition.start, partition.size))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PartitionType {
    Mbr(u8),
    Gpt(GptType),
}

#[derive(Debug)]
struct Partition {
    number: u32,
    /// Byte offset on the disk.
    start: u64,
    /// Length in bytes.
    size: u64,
    kind: PartitionType,
}

impl Partition {
    fn is_gpt_linux_root(&self) -> bool {
        matches!(&self.kind, PartitionType::Gpt(t) if t.guid == partition_types::LINUX_ROOT_X64.guid)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vda{} ", self.number)?;
        match &self.kind {
            PartitionType::Mbr(t) => write!(f, "MBR type {t:#04x}")?,
            PartitionType::Gpt(t) => write!(f, "GPT type {:X}", t.guid)?,
        }
        write!(f, ", {} MiB", self.size >> 20)
    }
}

fn describe(partitions: &[Partition]) -> String {
    if partitions.is_empty() {
        return "an empty partition table".to_string();
    }
    let list: Vec<String> = partitions.iter().map(Partition::to_string).collect();
    list.join("; ")
}

/// The disk's partitions, or `None` when there is no partition table.
fn read_table(disk: &mut dyn Disk) -> Result<Option<Vec<Partition>>, RootError> {
    if disk.size() < SECTOR {
        return Ok(None);
    }
    let mut reader = DiskReader::new(disk);
    let mbr = match MBR::read_from(&mut reader, SECTOR as u32) {
        Ok(mbr) => mbr,
        Err(mbrman::Error::InvalidSignature) => return Ok(None),
        Err(mbrman::Error::Io(e)) => return Err(e.into()),
        Err(e) => return Err(RootError::CorruptMbr(e.to_string())),
    };
    let entries: Vec<Partition> = mbr
        .iter()
        .filter(|(_, entry)| entry.is_used() && entry.sectors != 0)
        .map(|(number, entry)| Partition {
            number: number as u32,
            start: u64::from(entry.starting_lba) * SECTOR,
            size: u64::from(entry.sectors) * SECTOR,
            kind: PartitionType::Mbr(entry.sys),
        })
        .collect();
    if entries
        .iter()
        .any(|p| p.kind == PartitionType::Mbr(MBR_PROTECTIVE))
    {
        return read_gpt(&mut reader).map(Some);
    }
    Ok(Some(entries))
}

/// Reads the primary GPT at LBA 1, verifying the header's and the entry
/// array's CRC32. Entry i is partition i + 1; unused entries are skipped.
fn read_gpt(reader: &mut DiskReader) -> Result<Vec<Partition>, RootError> {
    let corrupt = |detail: &str| RootError::CorruptGpt(detail.to_string());
    let header =
        match gpt::header::read_header_from_arbitrary_device(reader, LogicalBlockSize::Lb512) {
            Ok(header) => header,
            Err(HeaderError::InvalidGptSignature) => {
                return Err(corrupt("the MBR is protective but LBA 1 has no GPT header"))
            }
            Err(HeaderError::InvalidCRC32Checksum) => {
                return Err(corrupt("the header CRC32 does not match"))
            }
            Err(HeaderError::Io(e)) => return Err(e.into()),
            Err(e) => return Err(RootError::CorruptGpt(e.to_string())),
        };
    check_entry_array(&header, reader.size())?;
    let entries = gpt::partition::file_read_partitions(reader, &header, LogicalBlockSize::Lb512)
        .map_err(|e| match e.kind() {
            // The only error of its own: the entry array's checksum.
            io::ErrorKind::Other => corrupt("the partition entry array CRC32 does not match"),
            _ => RootError::Io(e),
        })?;
    Ok(entries
        .into_iter()
        .filter(|(_, entry)| entry.is_used() && entry.last_lba >= entry.first_lba)
        .filter_map(|(number, entry)| {
            Some(Partition {
                number,
                start: entry.first_lba.checked_mul(SECTOR)?,
                size: (entry.last_lba - entry.first_lba + 1).checked_mul(SECTOR)?,
                kind: PartitionType::Gpt(entry.part_type_guid),
            })
        })
        .collect())
}

/// Checks what `gpt` takes on trust: the entries' size and how many there
/// are, and that they lie on the disk.
fn check_entry_array(header: &Header, disk_size: u64) -> Result<(), RootError> {
    let total = u64::from(header.num_parts) * u64::from(header.part_size);
    if header.part_size != GPT_ENTRY_SIZE || total > GPT_MAX_ENTRIES_BYTES {
        return Err(RootError::CorruptGpt(format!(
            "{} entries of {} bytes is not an entry array provm reads (entries of {GPT_ENTRY_SIZE} bytes, at most {GPT_MAX_ENTRIES_BYTES} bytes in all)",
            header.num_parts, header.part_size
        )));
    }
    let offset = header.part_start.saturating_mul(SECTOR);
    if offset.saturating_add(total) > disk_size {
        return Err(RootError::CorruptGpt(format!(
            "the entry array at LBA {} lies beyond the end of the disk",
            header.part_start
        )));
    }
    Ok(())
}

/// Whether an ext2/3/4 superblock starts at the filesystem offset `start`.
fn has_ext_magic(disk: &mut dyn Disk, start: u64) -> io::Result<bool> {
    let at = start.saturating_add(EXT_MAGIC_OFFSET);
    if at.saturating_add(2) > disk.size() {
        return Ok(false);
    }
    let mut magic = [0u8; 2];
    disk.read_at(at, &mut magic)?;
    Ok(u16::from_le_bytes(magic) == EXT_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpt::partition_types::{EFI, LINUX_FS, LINUX_ROOT_X64};
    use provm_vmm::disk::image::BaseImage;
    use std::process::Command;

    const MIB: u64 = 1 << 20;

    struct MemDisk(Vec<u8>);

    impl Disk for MemDisk {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }

        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let start = offset as usize;
            let src = self.0.get(start..start + buf.len());
            buf.copy_from_slice(src.ok_or(io::ErrorKind::UnexpectedEof)?);
            Ok(())
        }

        fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
            self.0[offset as usize..][..buf.len()].copy_from_slice(buf);
            Ok(())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn disk(size: u64) -> MemDisk {
        MemDisk(vec![0; size as usize])
    }

    fn put_ext_magic(disk: &mut MemDisk, start: u64) {
        disk.write_at(start + EXT_MAGIC_OFFSET, &EXT_MAGIC.to_le_bytes())
            .unwrap();
    }

    /// Writes an MBR with these (type, first LBA, sectors) primary entries.
    fn put_mbr(disk: &mut MemDisk, entries: &[(u8, u32, u32)]) {
        for (i, &(kind, first, sectors)) in entries.iter().enumerate() {
            let mut entry = [0u8; 16];
            entry[4] = kind;
            entry[8..12].copy_from_slice(&first.to_le_bytes());
            entry[12..16].copy_from_slice(&sectors.to_le_bytes());
            disk.write_at(446 + 16 * i as u64, &entry).unwrap();
        }
        disk.write_at(510, &[0x55, 0xAA]).unwrap();
    }

    /// Writes a protective MBR and a GPT (by the `gpt` crate: entries at
    /// LBA 2, a backup at the end) holding these (type, first LBA, last LBA)
    /// partitions, numbered from 1. (The crate packs entries, so unused
    /// slots before a partition come from sfdisk, in `real_gpt_from_sfdisk`.)
    fn put_gpt(disk: &mut MemDisk, parts: &[(GptType, u64, u64)]) {
        let sectors = disk.size() / SECTOR;
        put_mbr(disk, &[(MBR_PROTECTIVE, 1, (sectors - 1) as u32)]);
        let mut table = gpt::GptConfig::new()
            .writable(true)
            .create_from_device(io::Cursor::new(&mut disk.0), None)
            .unwrap();
        for (i, (kind, first, last)) in parts.iter().enumerate() {
            let number = i as u32 + 1;
            table
                .add_partition_at("", number, *first, last - first + 1, kind.clone(), 0)
                .unwrap();
        }
        table.write().unwrap();
    }

    fn partition(choice: Result<RootChoice, RootError>) -> Option<u32> {
        choice.unwrap().partition
    }

    #[test]
    fn bare_filesystem_is_the_whole_disk() {
        let mut d = disk(4 * MIB);
        put_ext_magic(&mut d, 0);
        let root = find_root(&mut d).unwrap();
        assert_eq!(root.partition, None);
        assert_eq!(root.device(), "/dev/vda");
    }

    #[test]
    fn blank_disk_has_no_filesystem() {
        let err = find_root(&mut disk(4 * MIB)).unwrap_err();
        assert!(matches!(err, RootError::NoFilesystem), "{err}");
        let err = find_root(&mut disk(100)).unwrap_err();
        assert!(matches!(err, RootError::NoFilesystem), "{err}");
    }

    #[test]
    fn mbr_picks_the_largest_ext_partition() {
        let mut d = disk(64 * MIB);
        // 1: swap-sized ext, 2: FAT, 3 unused, 4: the largest ext.
        put_mbr(
            &mut d,
            &[
                (0x83, 2048, 8192),
                (0x0c, 10240, 40960),
                (0, 0, 0),
                (0x83, 51200, 20480),
            ],
        );
        put_ext_magic(&mut d, 2048 * SECTOR);
        put_ext_magic(&mut d, 51200 * SECTOR);
        let root = find_root(&mut d).unwrap();
        assert_eq!(root.device(), "/dev/vda4");
        assert!(root.reason.contains("largest"), "{}", root.reason);
    }

    #[test]
    fn mbr_without_ext_partition_lists_what_it_found() {
        let mut d = disk(16 * MIB);
        put_mbr(&mut d, &[(0x0c, 2048, 4096), (0x82, 8192, 8192)]);
        let err = find_root(&mut d).unwrap_err();
        let RootError::NoRootPartition { found } = &err else {
            panic!("wrong error: {err}");
        };
        assert_eq!(
            found,
            "vda1 MBR type 0x0c, 2 MiB; vda2 MBR type 0x82, 4 MiB"
        );
    }

    #[test]
    fn gpt_prefers_the_linux_root_type() {
        let mut d = disk(64 * MIB);
        put_gpt(
            &mut d,
            &[
                (EFI, 2048, 4095),
                (LINUX_FS, 4096, 69631),
                (LINUX_ROOT_X64, 69632, 100000),
            ],
        );
        put_ext_magic(&mut d, 4096 * SECTOR);
        let root = find_root(&mut d).unwrap();
        assert_eq!(root.partition, Some(3));
        assert!(
            root.reason.contains("Linux root (x86-64)"),
            "{}",
            root.reason
        );
    }

    #[test]
    fn gpt_without_root_type_picks_the_largest_ext_partition() {
        let mut d = disk(64 * MIB);
        put_gpt(
            &mut d,
            &[
                (LINUX_FS, 2048, 10239),
                (LINUX_FS, 10240, 90000),
                (LINUX_FS, 90001, 110000),
            ],
        );
        put_ext_magic(&mut d, 2048 * SECTOR);
        put_ext_magic(&mut d, 90001 * SECTOR);
        // Partition 2 is the largest but holds no ext file system.
        assert_eq!(partition(find_root(&mut d)), Some(3));
    }

    #[test]
    fn gpt_without_ext_partition_lists_what_it_found() {
        let mut d = disk(8 * MIB);
        put_gpt(&mut d, &[(EFI, 2048, 4095)]);
        let err = find_root(&mut d).unwrap_err();
        assert!(
            err.to_string()
                .contains("vda1 GPT type C12A7328-F81F-11D2-BA4B-00A0C93EC93B, 1 MiB"),
            "{err}"
        );
    }

    #[test]
    fn gpt_checksums_are_verified() {
        let mut d = disk(8 * MIB);
        put_gpt(&mut d, &[(LINUX_ROOT_X64, 2048, 4095)]);
        // A flipped bit in the header...
        d.0[SECTOR as usize + 40] ^= 1;
        let err = find_root(&mut d).unwrap_err();
        assert!(matches!(err, RootError::CorruptGpt(_)), "{err}");
        assert!(err.to_string().contains("header CRC32"), "{err}");

        // ...or in the entry array.
        put_gpt(&mut d, &[(LINUX_ROOT_X64, 2048, 4095)]);
        d.0[2 * SECTOR as usize + 40] ^= 1;
        let err = find_root(&mut d).unwrap_err();
        assert!(err.to_string().contains("entry array CRC32"), "{err}");
        assert!(matches!(err, RootError::CorruptGpt(_)), "{err}");
    }

    #[test]
    fn gpt_entry_array_past_the_end_is_corrupt() {
        let mut d = disk(8 * MIB);
        put_gpt(&mut d, &[(LINUX_ROOT_X64, 2048, 4095)]);
        d.0.truncate(3 * SECTOR as usize);
        let err = find_root(&mut d).unwrap_err();
        assert!(err.to_string().contains("beyond the end"), "{err}");
    }

    /// Entries of 256 bytes are valid GPT, but the `gpt` crate panics on
    /// them: refused with an error instead.
    #[test]
    fn gpt_with_other_entry_size_is_refused() {
        let mut d = disk(8 * MIB);
        put_gpt(&mut d, &[(LINUX_ROOT_X64, 2048, 4095)]);
        let mut cursor = io::Cursor::new(&mut d.0);
        let mut header =
            gpt::header::read_header_from_arbitrary_device(&mut cursor, LogicalBlockSize::Lb512)
                .unwrap();
        header.part_size = 256;
        header.num_parts = 64;
        header
            .write_primary(&mut cursor, LogicalBlockSize::Lb512)
            .unwrap();
        let err = find_root(&mut d).unwrap_err();
        assert!(matches!(err, RootError::CorruptGpt(_)), "{err}");
        assert!(err.to_string().contains("of 256 bytes"), "{err}");
    }

    #[test]
    fn protective_mbr_without_gpt_is_corrupt() {
        let mut d = disk(8 * MIB);
        put_mbr(&mut d, &[(MBR_PROTECTIVE, 1, 16383)]);
        let err = find_root(&mut d).unwrap_err();
        assert!(matches!(err, RootError::CorruptGpt(_)), "{err}");
    }

    #[test]
    fn root_override_forms() {
        let mut d = disk(16 * MIB);
        put_mbr(&mut d, &[(0x83, 2048, 4096), (0x83, 8192, 8192)]);
        for value in ["/dev/vda2", "vda2", "2"] {
            let root = root_override(&mut d, value).unwrap();
            assert_eq!(root.device(), "/dev/vda2", "{value}");
        }
        for value in [
            "",
            "0",
            "vda",
            "/dev/vda",
            "sda1",
            "/dev/vdb1",
            "vda+1",
            "+1",
            "-1",
            "x",
        ] {
            let err = root_override(&mut d, value).unwrap_err();
            assert!(matches!(err, RootError::BadRootSyntax(_)), "{value}: {err}");
        }
        let err = root_override(&mut d, "3").unwrap_err();
        assert!(matches!(err, RootError::NoSuchPartition { .. }), "{err}");
        assert!(err.to_string().contains("vda1 MBR type 0x83"), "{err}");
    }

    #[test]
    fn root_override_needs_a_partition_table() {
        let mut d = disk(4 * MIB);
        put_ext_magic(&mut d, 0);
        let err = root_override(&mut d, "1").unwrap_err();
        assert!(err.to_string().contains("no partition table"), "{err}");
    }

    /// Runs a tool, which the test needs: `package` names where it comes from.
    fn run(program: &str, package: &str, args: &[&str], stdin: &str) {
        use std::io::Write;
        use std::process::Stdio;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let mut child =
            child.unwrap_or_else(|e| panic!("this test needs {program} ({e}): install {package}"));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{program}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A GPT written by sfdisk (util-linux) and a filesystem by mkfs.ext4
    /// (e2fsprogs), read through a BaseImage as provm does, to check the
    /// parser against real tools' output.
    #[test]
    fn real_gpt_from_sfdisk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(64 * MIB).unwrap();
        let image = path.to_str().unwrap();
        // Slot 3 stays unused: partition 4 keeps its number.
        let table = format!(
            "label: gpt\n\
             {image}1 : size=4MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\n\
             {image}2 : size=40MiB, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n\
             {image}4 : type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n"
        );
        run("sfdisk", "util-linux", &["--quiet", image], &table);
        let mut base = BaseImage::open(&path).unwrap();
        let err = find_root(&mut base).unwrap_err();
        assert!(matches!(err, RootError::NoRootPartition { .. }), "{err}");
        assert!(err.to_string().contains("; vda4 GPT type"), "{err}");

        // Partition 2 starts at 5 MiB (sfdisk aligns the first to 1 MiB).
        let offset = format!("offset={}", 5 * MIB);
        let args = ["-q", "-F", "-E", &offset, image, "40M"];
        run("mkfs.ext4", "e2fsprogs", &args, "");
        let mut base = BaseImage::open(&path).unwrap();
        assert_eq!(partition(find_root(&mut base)), Some(2));
    }

    /// Logical partitions inside an extended one (sfdisk's `dos` label)
    /// are numbered from 5, as Linux numbers them.
    #[test]
    fn real_mbr_logical_partition_from_sfdisk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(64 * MIB).unwrap();
        let table = "label: dos\n\
                     size=4MiB, type=c\n\
                     type=5\n\
                     size=8MiB, type=83\n\
                     size=40MiB, type=83\n";
        let image = path.to_str().unwrap();
        run("sfdisk", "util-linux", &["--quiet", image], table);
        let mut base = BaseImage::open(&path).unwrap();
        let err = find_root(&mut base).unwrap_err();
        assert!(
            err.to_string().contains("vda6 MBR type 0x83, 40 MiB"),
            "{err}"
        );
        assert!(root_override(&mut base, "/dev/vda6").is_ok());

        let start = logical_start(image, 6);
        let offset = format!("offset={start}");
        let args = ["-q", "-F", "-E", &offset, image, "40M"];
        run("mkfs.ext4", "e2fsprogs", &args, "");
        let mut base = BaseImage::open(&path).unwrap();
        assert_eq!(partition(find_root(&mut base)), Some(6));
    }

    /// Where sfdisk placed partition `n` of `image`, in bytes.
    fn logical_start(image: &str, n: u32) -> u64 {
        let output = Command::new("sfdisk")
            .args(["--dump", image])
            .output()
            .unwrap();
        let dump = String::from_utf8(output.stdout).unwrap();
        let line = dump
            .lines()
            .find(|l| l.starts_with(&format!("{image}{n} ")))
            .unwrap_or_else(|| panic!("no partition {n} in:\n{dump}"));
        let start = line.split("start=").nth(1).unwrap();
        let sectors: u64 = start.split(',').next().unwrap().trim().parse().unwrap();
        sectors * SECTOR
    }
}
