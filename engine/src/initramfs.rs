//! The guest's initial root: an uncompressed cpio ("newc") archive holding the
//! guest agent as /init. Uncompressed because gunzip in emulated guest ring 0
//! costs far more than copying the bytes.

/// The static guest agent, built for the guest by build.rs.
pub const GUEST_AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/provm-guest-agent"));

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// Writes a cpio newc archive, entry by entry.
#[derive(Default)]
pub struct CpioWriter {
    out: Vec<u8>,
    next_inode: u32,
}

impl CpioWriter {
    pub fn directory(&mut self, path: &str) {
        self.entry(path, S_IFDIR | 0o755, 0, &[]);
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.entry(path, S_IFREG | mode, 0, data);
    }

    pub fn char_device(&mut self, path: &str, mode: u32, major: u32, minor: u32) {
        self.entry(path, S_IFCHR | mode, (major << 8) | minor, &[]);
    }

    /// Ends the archive with the trailer entry and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 0, &[]);
        self.out
    }

    /// One entry: a 110-byte header of hex fields, the NUL-terminated name and
    /// the data, each padded to a multiple of four bytes.
    fn entry(&mut self, path: &str, mode: u32, rdev: u32, data: &[u8]) {
        self.next_inode += 1;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed, so the archive is the same every time
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev >> 8,
            rdev & 0xff,
            path.len() as u32 + 1,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for field in fields {
            self.out
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.out.extend_from_slice(path.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
}

/// The initramfs every guest boots: mount points, a console node for the
/// kernel to hand /init its stdio, and the agent as /init.
pub fn agent_initramfs() -> Vec<u8> {
    let mut cpio = CpioWriter::default();
    for dir in ["dev", "proc", "sys", "mnt", "mnt/root"] {
        cpio.directory(dir);
    }
    cpio.char_device("dev/console", 0o600, 5, 1);
    cpio.file("init", 0o755, GUEST_AGENT);
    cpio.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    #[test]
    fn header_layout_matches_newc() {
        let mut cpio = CpioWriter::default();
        cpio.file("a", 0o644, b"xyz");
        let bytes = cpio.finish();
        assert_eq!(&bytes[..6], b"070701");
        // mode field (second), then name "a\0" right after the 110-byte header.
        assert_eq!(&bytes[14..22], b"000081a4");
        assert_eq!(&bytes[110..112], b"a\0");
        // header + name (112) is already aligned; data follows, padded to 116.
        assert_eq!(&bytes[112..115], b"xyz");
        assert!(bytes.len().is_multiple_of(4));
    }

    /// The archive must be readable by the reference implementation.
    #[test]
    fn gnu_cpio_lists_the_agent_initramfs() {
        let Ok(mut child) = Command::new("cpio")
            .args(["-t", "-v", "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        else {
            panic!("cpio is needed for this test: apt-get install cpio");
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&agent_initramfs())
            .unwrap();
        let listing = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
        assert!(listing.contains("dev/console"), "{listing}");
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with("crw-------") && l.contains("5,")),
            "{listing}"
        );
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with(" init")),
            "{listing}"
        );
        assert!(listing.contains("mnt/root"), "{listing}");
    }

    #[test]
    fn the_agent_is_a_static_elf() {
        let elf = GUEST_AGENT;
        assert_eq!(&elf[..4], b"\x7fELF");
        let field = |at: usize, len: usize| -> usize {
            elf[at..at + len]
                .iter()
                .rev()
                .fold(0, |value, byte| value << 8 | *byte as usize)
        };
        let (phoff, phentsize, phnum) = (field(0x20, 8), field(0x36, 2), field(0x38, 2));
        const PT_INTERP: usize = 3;
        // A dynamic binary would need a loader the initramfs lacks.
        assert!((0..phnum).all(|i| field(phoff + i * phentsize, 4) != PT_INTERP));
    }
}
