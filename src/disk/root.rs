//! Finding the root file system on the image: a bare ext2/3/4 file system,
//! or a partition of an MBR or GPT partition table. Which device the agent
//! mounts as `/` is the command's choice (`--root` overrides it), so it is
//! made here, over the VMM's read-only [`Disk`], not inside the VMM.
//!
//! Sectors are 512 bytes, as virtio-blk presents them. Only the four MBR
//! primary partitions are considered, not logical ones inside an extended
//! partition.

use std::fmt;
use std::io;

use provm_vmm::disk::Disk;

const SECTOR: u64 = 512;
/// Offset of the ext2/3/4 superblock magic from the filesystem's start.
const EXT_MAGIC_OFFSET: u64 = 1080;
const EXT_MAGIC: u16 = 0xEF53;
const MBR_PROTECTIVE: u8 = 0xEE;
const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
/// Caps the entry array a (corrupt) GPT header can make us read; real
/// tables are 16 KiB.
const GPT_MAX_ENTRIES_BYTES: u64 = 1 << 20;
/// "Linux root (x86-64)", 4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709, as stored on
/// disk: the first three fields are little-endian.
const GPT_LINUX_ROOT_X86_64: [u8; 16] = [
    0xE3, 0xBC, 0x68, 0x4F, 0xCD, 0xE8, 0xB1, 0x4D, 0x96, 0xE7, 0xFB, 0xCA, 0xF9, 0x84, 0xB7, 0x09,
];

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("the disk has neither a partition table nor an ext2/3/4 filesystem; pass an image that holds a Linux root filesystem")]
    NoFilesystem,
    #[error("no partition holds an ext2/3/4 filesystem (found {found}); pass --root /dev/vdaN to choose the root partition")]
    NoRootPartition { found: String },
    #[error("corrupt GPT: {0}; repair the partition table (e.g. with `gdisk`)")]
    CorruptGpt(String),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartitionType {
    Mbr(u8),
    Gpt([u8; 16]),
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
        self.kind == PartitionType::Gpt(GPT_LINUX_ROOT_X86_64)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vda{} ", self.number)?;
        match self.kind {
            PartitionType::Mbr(t) => write!(f, "MBR type {t:#04x}")?,
            PartitionType::Gpt(guid) => write!(f, "GPT type {}", GuidDisplay(guid))?,
        }
        write!(f, ", {} MiB", self.size >> 20)
    }
}

/// A GPT GUID in its usual text form.
struct GuidDisplay([u8; 16]);

impl fmt::Display for GuidDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.0;
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02X}")).collect::<String>();
        let le = |bytes: &[u8]| hex(&bytes.iter().rev().copied().collect::<Vec<u8>>());
        write!(
            f,
            "{}-{}-{}-{}-{}",
            le(&g[0..4]),
            le(&g[4..6]),
            le(&g[6..8]),
            hex(&g[8..10]),
            hex(&g[10..16])
        )
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
    let mut mbr = [0u8; SECTOR as usize];
    disk.read_at(0, &mut mbr)?;
    if mbr[510..512] != [0x55, 0xAA] {
        return Ok(None);
    }
    let entries = mbr_entries(&mbr);
    if entries
        .iter()
        .any(|p| p.kind == PartitionType::Mbr(MBR_PROTECTIVE))
    {
        return read_gpt(disk).map(Some);
    }
    Ok(Some(entries))
}

/// The used primary entries; entry i is partition i + 1 even when an
/// earlier entry is unused, as Linux numbers them.
fn mbr_entries(mbr: &[u8; SECTOR as usize]) -> Vec<Partition> {
    (0..4)
        .filter_map(|i| {
            let entry = &mbr[446 + 16 * i..446 + 16 * (i + 1)];
            let kind = entry[4];
            let first_lba = le32(entry, 8);
            let sectors = le32(entry, 12);
            (kind != 0 && sectors != 0).then(|| Partition {
                number: i as u32 + 1,
                start: u64::from(first_lba) * SECTOR,
                size: u64::from(sectors) * SECTOR,
                kind: PartitionType::Mbr(kind),
            })
        })
        .collect()
}

/// Reads the primary GPT at LBA 1, verifying the header's and the entry
/// array's CRC32. Entry i is partition i + 1; unused entries are skipped.
fn read_gpt(disk: &mut dyn Disk) -> Result<Vec<Partition>, RootError> {
    let mut header = [0u8; SECTOR as usize];
    disk.read_at(SECTOR, &mut header)?;
    if &header[0..8] != GPT_SIGNATURE {
        return Err(RootError::CorruptGpt(
            "the MBR is protective but LBA 1 has no GPT header".into(),
        ));
    }
    let header_size = le32(&header, 12) as usize;
    if !(92..=header.len()).contains(&header_size) {
        return Err(RootError::CorruptGpt(format!(
            "header size {header_size} is invalid"
        )));
    }
    let stored_crc = le32(&header, 16);
    let mut zeroed = header;
    zeroed[16..20].fill(0);
    if crc32(&zeroed[..header_size]) != stored_crc {
        return Err(RootError::CorruptGpt(
            "the header CRC32 does not match".into(),
        ));
    }
    let entries_lba = le64(&header, 72);
    let count = u64::from(le32(&header, 80));
    let entry_size = u64::from(le32(&header, 84));
    let total = count * entry_size;
    if entry_size < 128 || total > GPT_MAX_ENTRIES_BYTES {
        return Err(RootError::CorruptGpt(format!(
            "{count} entries of {entry_size} bytes is not a valid entry array"
        )));
    }
    let offset = entries_lba.saturating_mul(SECTOR);
    if offset.saturating_add(total) > disk.size() {
        return Err(RootError::CorruptGpt(format!(
            "the entry array at LBA {entries_lba} lies beyond the end of the disk"
        )));
    }
    let mut entries = vec![0u8; total as usize];
    disk.read_at(offset, &mut entries)?;
    if crc32(&entries) != le32(&header, 88) {
        return Err(RootError::CorruptGpt(
            "the partition entry array CRC32 does not match".into(),
        ));
    }
    Ok(entries
        .chunks_exact(entry_size as usize)
        .enumerate()
        .filter_map(|(i, entry)| gpt_entry(i as u32 + 1, entry))
        .collect())
}

fn gpt_entry(number: u32, entry: &[u8]) -> Option<Partition> {
    let kind: [u8; 16] = entry[0..16].try_into().unwrap();
    let first = le64(entry, 32);
    let last = le64(entry, 40);
    if kind == [0; 16] || last < first {
        return None;
    }
    Some(Partition {
        number,
        start: first.checked_mul(SECTOR)?,
        size: (last - first + 1).checked_mul(SECTOR)?,
        kind: PartitionType::Gpt(kind),
    })
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

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn le64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// CRC-32 (IEEE 802.3, reflected), as GPT uses; bitwise, since tables are
/// a few KiB and read once.
fn crc32(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |crc, &byte| {
        (0..8).fold(crc ^ u32::from(byte), |c, _| {
            (c >> 1) ^ (0xEDB8_8320 & (c & 1).wrapping_neg())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_vmm::disk::image::BaseImage;
    use std::process::Command;

    const MIB: u64 = 1 << 20;
    const LINUX_FS: [u8; 16] = guid_bytes(0x0FC6_3DAF, 0x8483, 0x4772, 0x8E79_3D69_D847_7DE4);
    const EFI_SYSTEM: [u8; 16] = guid_bytes(0xC12A_7328, 0xF81F, 0x11D2, 0xBA4B_00A0_C93E_C93B);

    /// A GUID's on-disk bytes from its text fields.
    const fn guid_bytes(a: u32, b: u16, c: u16, d: u64) -> [u8; 16] {
        let (a, b, c, d) = (
            a.to_le_bytes(),
            b.to_le_bytes(),
            c.to_le_bytes(),
            d.to_be_bytes(),
        );
        [
            a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5],
            d[6], d[7],
        ]
    }

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

    /// Writes a protective MBR and a GPT with 128 entries at LBA 2 holding
    /// these (type, first LBA, last LBA) partitions; `None` leaves a slot
    /// unused.
    fn put_gpt(disk: &mut MemDisk, parts: &[Option<([u8; 16], u64, u64)>]) {
        let sectors = disk.size() / SECTOR;
        put_mbr(disk, &[(MBR_PROTECTIVE, 1, (sectors - 1) as u32)]);
        let mut entries = vec![0u8; 128 * 128];
        for (i, part) in parts.iter().enumerate() {
            if let Some((kind, first, last)) = part {
                let entry = &mut entries[128 * i..128 * (i + 1)];
                entry[0..16].copy_from_slice(kind);
                entry[16] = i as u8 + 1; // unique GUID
                entry[32..40].copy_from_slice(&first.to_le_bytes());
                entry[40..48].copy_from_slice(&last.to_le_bytes());
            }
        }
        let mut header = [0u8; 92];
        header[0..8].copy_from_slice(GPT_SIGNATURE);
        header[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        header[12..16].copy_from_slice(&92u32.to_le_bytes());
        header[24..32].copy_from_slice(&1u64.to_le_bytes());
        header[32..40].copy_from_slice(&(sectors - 1).to_le_bytes());
        header[40..48].copy_from_slice(&34u64.to_le_bytes());
        header[48..56].copy_from_slice(&(sectors - 34).to_le_bytes());
        header[72..80].copy_from_slice(&2u64.to_le_bytes());
        header[80..84].copy_from_slice(&128u32.to_le_bytes());
        header[84..88].copy_from_slice(&128u32.to_le_bytes());
        header[88..92].copy_from_slice(&crc32(&entries).to_le_bytes());
        let header_crc = crc32(&header);
        header[16..20].copy_from_slice(&header_crc.to_le_bytes());
        disk.write_at(SECTOR, &header).unwrap();
        disk.write_at(2 * SECTOR, &entries).unwrap();
    }

    fn partition(choice: Result<RootChoice, RootError>) -> Option<u32> {
        choice.unwrap().partition
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn root_guid_constant_matches_its_text_form() {
        let root = guid_bytes(0x4F68_BCE3, 0xE8CD, 0x4DB1, 0x96E7_FBCA_F984_B709);
        assert_eq!(root, GPT_LINUX_ROOT_X86_64);
        assert_eq!(
            GuidDisplay(GPT_LINUX_ROOT_X86_64).to_string(),
            "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
        );
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
                Some((EFI_SYSTEM, 2048, 4095)),
                Some((LINUX_FS, 4096, 69631)),
                None,
                Some((GPT_LINUX_ROOT_X86_64, 69632, 100000)),
            ],
        );
        put_ext_magic(&mut d, 4096 * SECTOR);
        let root = find_root(&mut d).unwrap();
        assert_eq!(root.partition, Some(4));
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
                Some((LINUX_FS, 2048, 10239)),
                Some((LINUX_FS, 10240, 90000)),
                Some((LINUX_FS, 90001, 110000)),
            ],
        );
        put_ext_magic(&mut d, 2048 * SECTOR);
        put_ext_magic(&mut d, 90001 * SECTOR);
        // Partition 2 is the largest but holds no ext filesystem.
        assert_eq!(partition(find_root(&mut d)), Some(3));
    }

    #[test]
    fn gpt_without_ext_partition_lists_what_it_found() {
        let mut d = disk(8 * MIB);
        put_gpt(&mut d, &[Some((EFI_SYSTEM, 2048, 4095))]);
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
        put_gpt(&mut d, &[Some((GPT_LINUX_ROOT_X86_64, 2048, 4095))]);
        // A flipped bit in the header...
        d.0[SECTOR as usize + 40] ^= 1;
        let err = find_root(&mut d).unwrap_err();
        assert!(matches!(err, RootError::CorruptGpt(_)), "{err}");
        assert!(err.to_string().contains("header CRC32"), "{err}");

        // ...or in the entry array.
        put_gpt(&mut d, &[Some((GPT_LINUX_ROOT_X86_64, 2048, 4095))]);
        d.0[2 * SECTOR as usize + 40] ^= 1;
        let err = find_root(&mut d).unwrap_err();
        assert!(err.to_string().contains("entry array CRC32"), "{err}");
    }

    #[test]
    fn gpt_entry_array_past_the_end_is_corrupt() {
        let mut d = disk(8 * MIB);
        put_gpt(&mut d, &[Some((GPT_LINUX_ROOT_X86_64, 2048, 4095))]);
        d.0.truncate(3 * SECTOR as usize);
        let err = find_root(&mut d).unwrap_err();
        assert!(err.to_string().contains("beyond the end"), "{err}");
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

    /// Runs a tool, or returns false when it is not installed.
    fn run(program: &str, args: &[&str], stdin: &str) -> bool {
        use std::io::Write;
        use std::process::Stdio;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            return false;
        };
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
        true
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
        let table = "label: gpt\n\
                     size=4MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\n\
                     size=40MiB, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n\
                     type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n";
        let image = path.to_str().unwrap();
        if !run("sfdisk", &["--quiet", image], table) {
            eprintln!("skipped: sfdisk is not installed");
            return;
        }
        let mut base = BaseImage::open(&path).unwrap();
        let err = find_root(&mut base).unwrap_err();
        assert!(matches!(err, RootError::NoRootPartition { .. }), "{err}");

        // Partition 2 starts at 5 MiB (sfdisk aligns the first to 1 MiB).
        let offset = format!("offset={}", 5 * MIB);
        if !run("mkfs.ext4", &["-q", "-F", "-E", &offset, image, "40M"], "") {
            eprintln!("skipped: mkfs.ext4 is not installed");
            return;
        }
        let mut base = BaseImage::open(&path).unwrap();
        assert_eq!(partition(find_root(&mut base)), Some(2));
    }
}
