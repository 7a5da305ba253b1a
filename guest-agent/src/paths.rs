//! Paths as both sides name them: absolute and lexically normal, so that
//! the agent's tracer and the host's replay analyses key files alike.

/// `name` joined to the absolute directory `base`, without `.`, `..` or
/// repeated slashes (lexically, as the kernel does without symbolic links).
pub fn normalize(base: &[u8], name: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in base.split(|&b| b == b'/').chain(name.split(|&b| b == b'/')) {
        match part {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    let mut path = Vec::new();
    for part in parts {
        path.push(b'/');
        path.extend_from_slice(part);
    }
    if path.is_empty() {
        path.push(b'/');
    }
    path
}

/// Kernel file systems: their files have no content worth a digest (the
/// tracer reading /proc/self would read its own), and writing them makes no
/// version.
const KERNEL_FILESYSTEMS: &[&[u8]] = &[b"/proc/", b"/sys/", b"/dev/"];

pub fn is_kernel_file(path: &[u8]) -> bool {
    KERNEL_FILESYSTEMS
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_and_normal() {
        assert_eq!(normalize(b"/data", b"in.txt"), b"/data/in.txt");
        assert_eq!(normalize(b"/", b"/a//b/./c"), b"/a/b/c");
        assert_eq!(normalize(b"/a/b", b"../c"), b"/a/c");
        assert_eq!(normalize(b"/", b"../.."), b"/");
        assert_eq!(normalize(b"/tmp", b""), b"/tmp");
    }
}
