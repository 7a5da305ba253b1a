//! Image files as the machine's disk: an image opened read-only, and a
//! qcow2 overlay over it that takes the guest's writes.
//!
//! [`BaseImage`] opens an image (and, for qcow2, its whole backing chain)
//! read-only and lists the files it reads from; [`Overlay`] is a fresh qcow2
//! file whose backing file is that image. Which image, where its overlay
//! goes and whether it is kept are the command's decisions (`provm::disk`),
//! not the machine's.

use std::collections::VecDeque;
use std::fmt;
use std::fs;
use std::future::Future;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use imago::file::File;
use imago::format::gate::ImplicitOpenGate;
use imago::qcow2::Qcow2;
use imago::raw::Raw;
use imago::{
    FormatAccess, FormatCreateBuilder, FormatDriverBuilder, Storage, StorageCreateOptions,
    StorageOpenOptions, SyncFormatAccess,
};

use super::Disk;

/// The smallest image provm accepts: one sector.
const MIN_IMAGE_SIZE: u64 = 512;
const SECTOR_SIZE: u64 = 512;
const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("disk image {0} does not exist; check the path")]
    NotFound(PathBuf),
    #[error("disk image {path} is not readable ({source}); provm only needs read access, check the file's permissions")]
    NotReadable { path: PathBuf, source: io::Error },
    #[error("disk image {0} is not a regular file; pass a qcow2 or raw disk image file")]
    NotAFile(PathBuf),
    #[error("disk image {0} is empty; pass a qcow2 or raw disk image")]
    Empty(PathBuf),
    #[error("disk image {path} is only {size} bytes, too small to be a disk (at least {MIN_IMAGE_SIZE}); pass a qcow2 or raw disk image")]
    TooSmall { path: PathBuf, size: u64 },
    #[error("corrupt qcow2 image {path}: {detail}; check it with `qemu-img check {path}`")]
    CorruptQcow2 { path: PathBuf, detail: String },
    #[error("qcow2 image {path} needs the backing file {backing}, which does not exist; restore it, or point the image at its new place with `qemu-img rebase -u -b NEW_BACKING {path}`")]
    MissingBacking { path: PathBuf, backing: PathBuf },
    #[error("qcow2 image {path} uses {feature}, which provm does not support; convert it with `qemu-img convert -O qcow2 {path} NEW.qcow2`")]
    UnsupportedQcow2 { path: PathBuf, feature: String },
    #[error("cannot create the overlay {path}: {source}; choose a writable directory or path")]
    CreateOverlay { path: PathBuf, source: io::Error },
    #[error("overlay {0} already exists; provm does not overwrite files, remove it or choose another path")]
    OverlayExists(PathBuf),
    #[error("I/O error on disk image {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// The on-disk format of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Raw,
    Qcow2,
}

impl ImageFormat {
    /// The name qcow2 headers (and qemu) use for the format.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One file an image reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainFile {
    /// Where it was opened: absolute, as resolved from the names in the
    /// qcow2 headers (or as relocated).
    pub path: PathBuf,
    /// 0 for the image itself, n for its nth backing image; a data file has
    /// the depth of the image it belongs to.
    pub depth: u32,
    pub role: ChainRole,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainRole {
    /// An image file: the image itself or one of its backing images.
    Image,
    /// A qcow2 image's external data file.
    DataFile,
}

/// An image, opened read-only; also a read-only [`Disk`] (for partition
/// probing).
pub struct BaseImage {
    /// Absolute, symlink-free path: overlays record it as their backing file.
    path: PathBuf,
    format: ImageFormat,
    /// Every file the image reads from, in the order opened: the image first.
    chain: Vec<ChainFile>,
    access: SyncFormatAccess<File>,
}

impl BaseImage {
    /// Opens `path` read-only, detecting qcow2 by its magic and otherwise
    /// treating it as raw. A qcow2 image's backing chain is opened too, also
    /// read-only.
    pub fn open(path: &Path) -> Result<BaseImage, ImageError> {
        Self::open_relocated(path, &[])
    }

    /// Like [`BaseImage::open`], but the files the image depends on are
    /// opened from `relocated`, in [`BaseImage::chain`]'s order after the
    /// image itself, instead of where its qcow2 headers name them: for a
    /// chain that moved as a whole, such as one extracted from a trace. Past
    /// the end of `relocated` the headers' names are followed.
    pub fn open_relocated(path: &Path, relocated: &[PathBuf]) -> Result<BaseImage, ImageError> {
        let path = fs::canonicalize(path).map_err(|e| open_error(path, e))?;
        let format = detect_format(&path)?;
        let file = open_file(&path, false)?;
        let gate = ReadOnlyGate::relocating(relocated);
        let access = match format {
            ImageFormat::Raw => Raw::builder(file)
                .open_sync(gate.clone())
                .and_then(SyncFormatAccess::new)
                .map_err(|source| ImageError::Io {
                    path: path.clone(),
                    source,
                })?,
            ImageFormat::Qcow2 => open_qcow2(&path, file, false, gate.clone())?,
        };
        let top = ChainFile {
            path: path.clone(),
            depth: 0,
            role: ChainRole::Image,
        };
        let chain = std::iter::once(top).chain(gate.take_opened()).collect();
        Ok(BaseImage {
            path,
            format,
            chain,
            access,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> ImageFormat {
        self.format
    }

    /// The files the image reads from: the image itself first, then its
    /// backing images (each after its external data file, if it has one).
    pub fn chain(&self) -> &[ChainFile] {
        &self.chain
    }
}

impl Disk for BaseImage {
    fn size(&self) -> u64 {
        self.access.size()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.access.read(buf, offset)
    }

    fn write_at(&mut self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the base image is read-only; write to an overlay",
        ))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the guest's flush requests promise about an overlay's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to the file and fsynced: for an overlay that is kept.
    Synced,
    /// Written to the file only: for an overlay discarded after the run,
    /// where durability against a host crash buys nothing.
    Unsynced,
}

/// A qcow2 file backed by the user's image: the guest's read-write disk.
///
/// Its size is the base's size rounded up to whole sectors, so that the guest
/// can reach the partial last sector of an odd-sized raw image (reads past
/// the base's end return zeroes).
///
/// Once created, the open descriptors are all it needs: its file may be
/// unlinked at once. Dropping it flushes imago's metadata, so a kept file is
/// a consistent qcow2 image afterwards.
pub struct Overlay {
    durability: Durability,
    access: SyncFormatAccess<File>,
}

impl Overlay {
    /// Creates the overlay file at `path`, which must not exist yet, over
    /// `base`, and opens it read-write. Its backing chain is opened from the
    /// very files `base` reads from, so that the guest sees the image that
    /// was opened (and checked) even if it was relocated.
    pub fn create(
        base: &BaseImage,
        path: &Path,
        durability: Durability,
    ) -> Result<Overlay, ImageError> {
        let size = base.size().next_multiple_of(SECTOR_SIZE);
        create_qcow2(path, base, size).map_err(|source| match source.kind() {
            io::ErrorKind::AlreadyExists => ImageError::OverlayExists(path.to_path_buf()),
            _ => ImageError::CreateOverlay {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let base_files: Vec<PathBuf> = base.chain.iter().map(|f| f.path.clone()).collect();
        let gate = ReadOnlyGate::relocating(&base_files);
        let access = open_file(path, true).and_then(|file| open_qcow2(path, file, true, gate));
        if access.is_err() {
            // Created here and unusable: ours to remove.
            if let Err(e) = fs::remove_file(path) {
                tracing::warn!("cannot delete overlay {}: {e}", path.display());
            }
        }
        Ok(Overlay {
            durability,
            access: access?,
        })
    }
}

impl Disk for Overlay {
    fn size(&self) -> u64 {
        self.access.size()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.access.read(buf, offset)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.access.write(buf, offset)
    }

    /// Writes imago's cached metadata to the file, and fsyncs it if the
    /// overlay is [`Durability::Synced`].
    fn flush(&mut self) -> io::Result<()> {
        self.access.flush()?;
        if self.durability == Durability::Synced {
            self.access.sync()?;
        }
        Ok(())
    }
}

/// Maps a failure to open the user's image to the error that names it.
fn open_error(path: &Path, e: io::Error) -> ImageError {
    match e.kind() {
        io::ErrorKind::NotFound => ImageError::NotFound(path.to_path_buf()),
        io::ErrorKind::PermissionDenied => ImageError::NotReadable {
            path: path.to_path_buf(),
            source: e,
        },
        _ => ImageError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

/// Checks that `path` is a plausible disk and tells qcow2 from raw.
fn detect_format(path: &Path) -> Result<ImageFormat, ImageError> {
    let mut file = fs::File::open(path).map_err(|e| open_error(path, e))?;
    let meta = file.metadata().map_err(|e| open_error(path, e))?;
    if !meta.is_file() {
        return Err(ImageError::NotAFile(path.to_path_buf()));
    }
    match meta.len() {
        0 => return Err(ImageError::Empty(path.to_path_buf())),
        size if size < MIN_IMAGE_SIZE => {
            return Err(ImageError::TooSmall {
                path: path.to_path_buf(),
                size,
            })
        }
        _ => {}
    }
    // Every accepted image is longer than a qcow2 header.
    let mut header = [0u8; QCOW2_HEADER_LEN];
    file.read_exact(&mut header)
        .map_err(|e| open_error(path, e))?;
    if header[..4] != QCOW2_MAGIC {
        return Ok(ImageFormat::Raw);
    }
    check_qcow2_features(&header).map_err(|feature| ImageError::UnsupportedQcow2 {
        path: path.to_path_buf(),
        feature,
    })?;
    check_qcow2_tables(&header, meta.len()).map_err(|detail| ImageError::CorruptQcow2 {
        path: path.to_path_buf(),
        detail,
    })?;
    Ok(ImageFormat::Qcow2)
}

/// Bytes of the qcow2 header checked before imago opens the image: up to and
/// including the v3 incompatible-features field.
const QCOW2_HEADER_LEN: usize = 80;

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn be64(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Rejects what imago cannot read, naming the feature. imago rejects unknown
/// versions and incompatible features too, but only as an opaque message, and
/// it does not check for encryption at all (it would read ciphertext).
fn check_qcow2_features(header: &[u8; QCOW2_HEADER_LEN]) -> Result<(), String> {
    let version = be32(header, 4);
    if version != 2 && version != 3 {
        return Err(format!("qcow2 version {version}"));
    }
    let crypt_method = be32(header, 32);
    if crypt_method != 0 {
        return Err(format!("encryption (method {crypt_method})"));
    }
    if version == 2 {
        return Ok(());
    }
    let incompatible = be64(header, 72);
    // Bit 2, an external data file, is the only incompatible feature imago implements.
    let mut found: Vec<String> = [
        (0, "the dirty bit (the image was not closed cleanly)"),
        (1, "the corrupt bit (qemu found the image corrupt)"),
        (3, "a compression type other than zlib"),
        (4, "extended L2 entries (subclusters)"),
    ]
    .into_iter()
    .filter(|&(bit, _)| incompatible & (1 << bit) != 0)
    .map(|(_, name)| name.to_string())
    .collect();
    let unknown = incompatible & !0b1_1111;
    if unknown != 0 {
        found.push(format!("unknown incompatible features {unknown:#x}"));
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(found.join(" and "))
    }
}

/// Checks that the L1 and refcount tables lie inside the file: imago reads
/// past the end of a file as zeroes, so it would open a truncated image as
/// an empty disk.
fn check_qcow2_tables(header: &[u8; QCOW2_HEADER_LEN], file_len: u64) -> Result<(), String> {
    let cluster_bits = be32(header, 20);
    if !(9..=21).contains(&cluster_bits) {
        return Err(format!("invalid cluster size 2^{cluster_bits}"));
    }
    let tables = [
        (
            "L1 table",
            be64(header, 40),
            u64::from(be32(header, 36)) * 8,
        ),
        (
            "refcount table",
            be64(header, 48),
            u64::from(be32(header, 56)) << cluster_bits,
        ),
    ];
    for (name, offset, len) in tables {
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(format!(
                "its {name} lies beyond the end of the file ({file_len} bytes); was the file truncated?"
            ));
        }
    }
    Ok(())
}

/// Opens `path` as imago storage; the name lets qcow2 resolve relative
/// backing file names.
fn open_file(path: &Path, writable: bool) -> Result<File, ImageError> {
    let options = StorageOpenOptions::new().filename(path).write(writable);
    File::open_sync(options).map_err(|e| open_error(path, e))
}

/// Opens a qcow2 image over `file`, its backing chain read-only through
/// `gate`.
fn open_qcow2(
    path: &Path,
    file: File,
    writable: bool,
    gate: ReadOnlyGate,
) -> Result<SyncFormatAccess<File>, ImageError> {
    let opened = Qcow2::<File>::builder(file)
        .write(writable)
        .open_sync(gate.clone())
        .and_then(SyncFormatAccess::new);
    opened.map_err(|e| match gate.take_failure() {
        Some((backing, io::ErrorKind::NotFound)) => ImageError::MissingBacking {
            path: path.to_path_buf(),
            backing,
        },
        Some((backing, _)) => open_error(&backing, e),
        None => ImageError::CorruptQcow2 {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
    })
}

/// Opens what a qcow2 header references (backing images, external data
/// files) read-only, optionally from relocated paths, and logs what it opened
/// and the first file it could not open, so that errors can name it. imago
/// would open an external data file writable.
#[derive(Clone, Default)]
struct ReadOnlyGate {
    log: Arc<Mutex<GateLog>>,
}

#[derive(Default)]
struct GateLog {
    /// Paths to open instead of the headers' names, in order.
    relocated: VecDeque<PathBuf>,
    opened: Vec<ChainFile>,
    /// Backing images opened so far: the depth of the image being opened.
    depth: u32,
    failure: Option<(PathBuf, io::ErrorKind)>,
}

impl ReadOnlyGate {
    fn relocating(relocated: &[PathBuf]) -> ReadOnlyGate {
        let log = GateLog {
            relocated: relocated.iter().cloned().collect(),
            ..GateLog::default()
        };
        ReadOnlyGate {
            log: Arc::new(Mutex::new(log)),
        }
    }

    fn take_failure(&self) -> Option<(PathBuf, io::ErrorKind)> {
        self.log.lock().unwrap().failure.take()
    }

    fn take_opened(&self) -> Vec<ChainFile> {
        std::mem::take(&mut self.log.lock().unwrap().opened)
    }
}

impl ImplicitOpenGate<File> for ReadOnlyGate {
    /// Called for backing images only, after their file was opened (which
    /// [`Self::open_storage`] logged as a data file until now).
    async fn open_format<F: FormatDriverBuilder<File>>(
        &mut self,
        builder: F,
    ) -> io::Result<FormatAccess<File>> {
        {
            let mut log = self.log.lock().unwrap();
            log.depth += 1;
            let depth = log.depth;
            if let Some(file) = log.opened.last_mut() {
                file.depth = depth;
                file.role = ChainRole::Image;
            }
        }
        // Boxed: a backing image's own backing chain recurses through here.
        let format = Box::pin(builder.write(false).open(self.clone())).await?;
        Ok(FormatAccess::new(format))
    }

    async fn open_storage(&mut self, options: StorageOpenOptions) -> io::Result<File> {
        let relocated = self.log.lock().unwrap().relocated.pop_front();
        let path = relocated.or_else(|| options.get_filename().map(Path::to_path_buf));
        let options = match &path {
            Some(path) => options.filename(path.clone()),
            None => options,
        };
        let opened = File::open(options.write(false)).await;
        let mut log = self.log.lock().unwrap();
        match (&opened, path) {
            (Ok(_), Some(path)) => {
                let depth = log.depth;
                log.opened.push(ChainFile {
                    path,
                    depth,
                    role: ChainRole::DataFile,
                });
            }
            (Err(e), Some(path)) if log.failure.is_none() => {
                log.failure = Some((path, e.kind()));
            }
            _ => {}
        }
        opened
    }
}

/// Formats a new qcow2 file at `path` (which must not exist) of `size` bytes,
/// backed by `base` under its absolute path, with its format recorded so that
/// nothing ever probes it.
fn create_qcow2(path: &Path, base: &BaseImage, size: u64) -> io::Result<()> {
    let backing = base.path().to_str().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("base image path {} is not UTF-8", base.path().display()),
        )
    })?;
    block_on(async {
        let file = File::create_open(StorageCreateOptions::new().filename(path)).await?;
        Qcow2::<File>::create_builder(file)
            .backing(backing.to_string(), base.format().name().to_string())
            .size(size)
            .create()
            .await
    })
}

/// Runs one of imago's async operations to completion on this thread.
///
/// imago has synchronous wrappers for opening and I/O but not for creating an
/// image. Its `async fn`s do their file I/O synchronously and only ever wait
/// on `tokio::sync` locks, which wake through the standard `Waker`, so parking
/// the thread until woken is enough: no tokio runtime is needed.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const MIB: u64 = 1 << 20;

    /// Deterministic, position-dependent contents, so that a misplaced read
    /// shows.
    fn pattern(offset: u64, len: usize) -> Vec<u8> {
        (offset..offset + len as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    fn write_raw(dir: &Path, name: &str, len: u64) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, pattern(0, len as usize)).unwrap();
        path
    }

    /// A standalone qcow2 image holding `pattern` in its first `len` bytes.
    fn write_qcow2(dir: &Path, name: &str, len: u64) -> PathBuf {
        let path = dir.join(name);
        block_on(async {
            let file = File::create_open(StorageCreateOptions::new().filename(&path)).await?;
            Qcow2::<File>::create_builder(file).size(len).create().await
        })
        .unwrap();
        let file = open_file(&path, true).unwrap();
        let access = open_qcow2(&path, file, true, ReadOnlyGate::default()).unwrap();
        access.write(&pattern(0, len as usize)[..], 0).unwrap();
        path
    }

    fn read(disk: &mut dyn Disk, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        disk.read_at(offset, &mut buf).unwrap();
        buf
    }

    /// Writes through a kept overlay over `base_path`, reopens it and checks
    /// that the writes, and the base's data around them, read back.
    fn check_overlay_roundtrip(base_path: &Path, size: u64) {
        let before = fs::read(base_path).unwrap();
        let kept = base_path.with_extension("overlay.qcow2");
        let base = BaseImage::open(base_path).unwrap();
        let mut overlay = Overlay::create(&base, &kept, Durability::Synced).unwrap();
        assert_eq!(overlay.size(), size);
        let page = vec![0xA5; 4096];
        overlay.write_at(MIB, &page).unwrap();
        overlay.write_at(3 * MIB + 7, b"unaligned").unwrap();
        overlay.flush().unwrap();
        assert_eq!(read(&mut overlay, MIB, 4096), page);
        drop(overlay);

        let mut reopened = BaseImage::open(&kept).unwrap();
        assert_eq!(reopened.format(), ImageFormat::Qcow2);
        assert_eq!(read(&mut reopened, MIB, 4096), page);
        assert_eq!(read(&mut reopened, 3 * MIB + 7, 9), b"unaligned");
        assert_eq!(read(&mut reopened, 0, 8192), pattern(0, 8192));
        assert_eq!(read(&mut reopened, 3 * MIB, 7), pattern(3 * MIB, 7));
        assert_eq!(fs::read(base_path).unwrap(), before, "base image changed");
    }

    #[test]
    fn overlay_over_raw_base_roundtrips() {
        let dir = tempfile::tempdir().unwrap();
        let base = write_raw(dir.path(), "base.img", 4 * MIB);
        check_overlay_roundtrip(&base, 4 * MIB);
    }

    #[test]
    fn overlay_over_qcow2_base_roundtrips() {
        let dir = tempfile::tempdir().unwrap();
        let base = write_qcow2(dir.path(), "base.qcow2", 4 * MIB);
        assert_eq!(BaseImage::open(&base).unwrap().format(), ImageFormat::Qcow2);
        check_overlay_roundtrip(&base, 4 * MIB);
    }

    #[test]
    fn odd_sized_raw_base_is_padded_to_a_sector() {
        let dir = tempfile::tempdir().unwrap();
        let len = MIB + 1000;
        let base_path = write_raw(dir.path(), "odd.img", len);
        let before = fs::read(&base_path).unwrap();
        let mut base = BaseImage::open(&base_path).unwrap();
        assert_eq!(base.size(), len);
        assert_eq!(read(&mut base, MIB, 1000), pattern(MIB, 1000));

        let overlay_path = dir.path().join("overlay.qcow2");
        let mut overlay = Overlay::create(&base, &overlay_path, Durability::Unsynced).unwrap();
        assert_eq!(overlay.size(), MIB + 1024);
        let last_sector = read(&mut overlay, MIB + 512, 512);
        assert_eq!(last_sector[..488], pattern(MIB + 512, 488)[..]);
        assert_eq!(last_sector[488..], [0; 24]);
        overlay.write_at(MIB + 512, &[7; 512]).unwrap();
        overlay.flush().unwrap();
        assert_eq!(read(&mut overlay, MIB + 512, 512), [7; 512]);
        assert_eq!(fs::read(&base_path).unwrap(), before);
    }

    /// Access mode of every descriptor this process holds on `path`.
    fn open_modes(path: &Path) -> Vec<i32> {
        let mut modes = Vec::new();
        for fd in fs::read_dir("/proc/self/fd").unwrap().flatten() {
            if fs::read_link(fd.path()).ok().as_deref() != Some(path) {
                continue;
            }
            let info = fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                fd.file_name().to_str().unwrap()
            ));
            let Ok(info) = info else { continue };
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap();
            let flags = i32::from_str_radix(flags.trim(), 8).unwrap();
            modes.push(flags & libc::O_ACCMODE);
        }
        modes
    }

    #[test]
    fn base_chain_is_only_ever_opened_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let lower = write_raw(dir.path(), "lower.img", MIB);
        let lower_base = BaseImage::open(&lower).unwrap();
        let middle = dir.path().join("middle.qcow2");
        drop(Overlay::create(&lower_base, &middle, Durability::Synced).unwrap());
        drop(lower_base);

        let base = BaseImage::open(&middle).unwrap();
        let top = dir.path().join("top.qcow2");
        let _overlay = Overlay::create(&base, &top, Durability::Synced).unwrap();
        for path in [&lower, &middle] {
            let modes = open_modes(path);
            assert!(!modes.is_empty(), "{} is not open", path.display());
            assert!(
                modes.iter().all(|&m| m == libc::O_RDONLY),
                "{path:?}: {modes:?}"
            );
        }
        assert_eq!(open_modes(&top), [libc::O_RDWR]);
    }

    #[test]
    fn chain_lists_every_file_top_first() {
        let dir = tempfile::tempdir().unwrap();
        let dir = fs::canonicalize(dir.path()).unwrap();
        let lower = write_raw(&dir, "lower.img", MIB);
        let middle = dir.join("middle.qcow2");
        let lower_base = BaseImage::open(&lower).unwrap();
        assert_eq!(lower_base.chain().len(), 1);
        drop(Overlay::create(&lower_base, &middle, Durability::Synced).unwrap());

        let base = BaseImage::open(&middle).unwrap();
        let files: Vec<(&Path, u32, ChainRole)> = base
            .chain()
            .iter()
            .map(|f| (f.path.as_path(), f.depth, f.role))
            .collect();
        assert_eq!(
            files,
            [
                (middle.as_path(), 0, ChainRole::Image),
                (lower.as_path(), 1, ChainRole::Image)
            ]
        );
    }

    #[test]
    fn relocated_chain_reads_the_moved_files() {
        let dir = tempfile::tempdir().unwrap();
        let lower = write_raw(dir.path(), "lower.img", MIB);
        let middle = dir.path().join("middle.qcow2");
        let lower_base = BaseImage::open(&lower).unwrap();
        drop(Overlay::create(&lower_base, &middle, Durability::Synced).unwrap());
        let moved = dir.path().join("moved.img");
        fs::write(&moved, vec![7; MIB as usize]).unwrap();

        let mut base = BaseImage::open_relocated(&middle, std::slice::from_ref(&moved)).unwrap();
        assert_eq!(base.chain()[1].path, moved);
        assert_eq!(read(&mut base, 0, 512), [7; 512]);
        let overlay_path = dir.path().join("overlay.qcow2");
        let mut overlay = Overlay::create(&base, &overlay_path, Durability::Unsynced).unwrap();
        assert_eq!(read(&mut overlay, MIB - 512, 512), [7; 512]);
    }

    #[test]
    fn base_is_not_writable_through_its_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut base = BaseImage::open(&write_raw(dir.path(), "base.img", MIB)).unwrap();
        let err = base.write_at(0, &[0; 512]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn missing_image() {
        let dir = tempfile::tempdir().unwrap();
        let err = BaseImage::open(&dir.path().join("nope.img")).err().unwrap();
        assert!(matches!(err, ImageError::NotFound(_)), "{err}");
    }

    #[test]
    fn directory_is_not_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let err = BaseImage::open(dir.path()).err().unwrap();
        assert!(matches!(err, ImageError::NotAFile(_)), "{err}");
    }

    /// Checked on the mapping, since root (as tests often run) reads any
    /// file whatever its permissions.
    #[test]
    fn unreadable_image() {
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let err = open_error(Path::new("secret.img"), denied);
        assert!(matches!(err, ImageError::NotReadable { .. }), "{err}");
        assert!(err.to_string().contains("permissions"), "{err}");
    }

    #[test]
    fn empty_and_tiny_images() {
        let dir = tempfile::tempdir().unwrap();
        let err = BaseImage::open(&write_raw(dir.path(), "empty.img", 0))
            .err()
            .unwrap();
        assert!(matches!(err, ImageError::Empty(_)), "{err}");
        let err = BaseImage::open(&write_raw(dir.path(), "tiny.img", 100))
            .err()
            .unwrap();
        assert!(
            matches!(err, ImageError::TooSmall { size: 100, .. }),
            "{err}"
        );
    }

    /// A qcow2 image with `bytes` written at `offset` into its header.
    fn scribbled_qcow2(dir: &Path, name: &str, offset: usize, bytes: &[u8]) -> PathBuf {
        let path = write_qcow2(dir, name, MIB);
        let mut image = fs::read(&path).unwrap();
        image[offset..offset + bytes.len()].copy_from_slice(bytes);
        fs::write(&path, image).unwrap();
        path
    }

    #[test]
    fn corrupt_qcow2_headers() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("cluster bits 63", 20, 63u32.to_be_bytes().to_vec()),
            ("unaligned L1 table", 40, 12345u64.to_be_bytes().to_vec()),
            (
                "unaligned refcount table",
                48,
                777u64.to_be_bytes().to_vec(),
            ),
        ];
        for (what, offset, bytes) in cases {
            let path = scribbled_qcow2(dir.path(), what, offset, &bytes);
            let err = BaseImage::open(&path).err().unwrap();
            assert!(
                matches!(err, ImageError::CorruptQcow2 { .. }),
                "{what}: {err}"
            );
            assert!(err.to_string().starts_with("corrupt qcow2 image"), "{err}");
        }
    }

    #[test]
    fn truncated_qcow2() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_qcow2(dir.path(), "cut.qcow2", MIB);
        let mut image = fs::read(&path).unwrap();
        image.truncate(1000);
        fs::write(&path, image).unwrap();
        let err = BaseImage::open(&path).err().unwrap();
        assert!(matches!(err, ImageError::CorruptQcow2 { .. }), "{err}");
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn unsupported_qcow2_features() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("version 4", 4, 4u32.to_be_bytes().to_vec()),
            ("AES encryption", 32, 1u32.to_be_bytes().to_vec()),
            ("extended L2", 72, (1u64 << 4).to_be_bytes().to_vec()),
            ("dirty", 72, 1u64.to_be_bytes().to_vec()),
            ("unknown feature", 72, (1u64 << 40).to_be_bytes().to_vec()),
        ];
        for (what, offset, bytes) in cases {
            let path = scribbled_qcow2(dir.path(), what, offset, &bytes);
            let err = BaseImage::open(&path).err().unwrap();
            assert!(
                matches!(err, ImageError::UnsupportedQcow2 { .. }),
                "{what}: {err}"
            );
        }
    }

    #[test]
    fn qcow2_with_missing_backing_file() {
        let dir = tempfile::tempdir().unwrap();
        let lower = write_raw(dir.path(), "lower.img", MIB);
        let top = dir.path().join("top.qcow2");
        let base = BaseImage::open(&lower).unwrap();
        drop(Overlay::create(&base, &top, Durability::Synced).unwrap());
        let lower = base.path().to_path_buf();
        drop(base);
        fs::remove_file(&lower).unwrap();

        match BaseImage::open(&top) {
            Err(ImageError::MissingBacking { backing, .. }) => assert_eq!(backing, lower),
            Err(err) => panic!("wrong error: {err}"),
            Ok(_) => panic!("opened a qcow2 without its backing file"),
        }
    }

    #[test]
    fn overlay_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let base = BaseImage::open(&write_raw(dir.path(), "base.img", MIB)).unwrap();
        let taken = write_raw(dir.path(), "taken", 10);
        let err = Overlay::create(&base, &taken, Durability::Synced)
            .err()
            .unwrap();
        assert!(matches!(err, ImageError::OverlayExists(_)), "{err}");
        assert_eq!(fs::read(&taken).unwrap(), pattern(0, 10));

        let err = Overlay::create(&base, base.path(), Durability::Synced)
            .err()
            .unwrap();
        assert!(matches!(err, ImageError::OverlayExists(_)), "{err}");
    }

    #[test]
    fn overlay_in_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = BaseImage::open(&write_raw(dir.path(), "base.img", MIB)).unwrap();
        let path = dir.path().join("nope").join("overlay.qcow2");
        let err = Overlay::create(&base, &path, Durability::Unsynced)
            .err()
            .unwrap();
        assert!(matches!(err, ImageError::CreateOverlay { .. }), "{err}");
    }

    /// The overlay is an ordinary qcow2 file to qemu, so a kept one can be
    /// inspected or committed with qemu's tools.
    #[test]
    fn qemu_img_accepts_the_overlay() {
        let status = Command::new("qemu-img")
            .arg("--version")
            .output()
            .expect("this test needs qemu-img: install qemu-utils");
        assert!(status.status.success());
        let dir = tempfile::tempdir().unwrap();
        let base = BaseImage::open(&write_raw(dir.path(), "base.img", 4 * MIB)).unwrap();
        let kept = dir.path().join("kept.qcow2");
        let mut overlay = Overlay::create(&base, &kept, Durability::Synced).unwrap();
        overlay.write_at(2 * MIB, &[9; 65536]).unwrap();
        drop(overlay);

        let check = Command::new("qemu-img")
            .arg("check")
            .arg(&kept)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stdout)
        );
        let info = Command::new("qemu-img")
            .args(["info", "--output=json"])
            .arg(&kept)
            .output()
            .unwrap();
        let info = String::from_utf8(info.stdout).unwrap();
        assert!(
            info.contains(&format!(
                "\"backing-filename\": \"{}\"",
                base.path().display()
            )),
            "{info}"
        );
        assert!(
            info.contains("\"backing-filename-format\": \"raw\""),
            "{info}"
        );
    }
}
