//! The files of a container image: those of an OCI layout's directory, or
//! the members of an archive (an OCI layout or a docker archive in a tar),
//! read in place through an index of where each member's bytes lie, so a
//! multi-gigabyte archive is never copied. Nothing outside the layout is
//! read: a name that climbs out of it, or a symbolic link that leads out,
//! is refused.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::ContainerError;

/// JSON documents (indexes, manifests, configurations) are small; a bigger
/// one is not what it claims to be.
const MAX_JSON: u64 = 16 << 20;
/// Symbolic links followed to reach one member (as ELOOP).
const MAX_LINKS: usize = 40;

pub struct Blobs {
    /// The image, as the user named it: for messages.
    image: String,
    store: Store,
}

enum Store {
    /// A directory (canonical).
    Dir(PathBuf),
    /// A tar file and where its members are.
    Archive {
        file: PathBuf,
        members: HashMap<String, Member>,
    },
}

enum Member {
    Data {
        offset: u64,
        size: u64,
    },
    /// A symbolic or hard link to this member name, or `None`: to a place
    /// outside the archive.
    Link(Option<String>),
}

impl Blobs {
    /// The files of the directory `dir`.
    pub fn dir(image: &str, dir: &Path) -> Result<Blobs, ContainerError> {
        let root = dir.canonicalize().map_err(read_error(dir))?;
        if !root.is_dir() {
            return Err(ContainerError::NotADirectory {
                image: image.to_owned(),
            });
        }
        Ok(Blobs {
            image: image.to_owned(),
            store: Store::Dir(root),
        })
    }

    /// The members of the tar file `file`, indexed.
    pub fn archive(image: &str, file: &Path) -> Result<Blobs, ContainerError> {
        let malformed = |error: io::Error| ContainerError::Malformed {
            image: image.to_owned(),
            what: format!("it is not a readable tar archive ({error})"),
        };
        let mut archive = tar::Archive::new(File::open(file).map_err(read_error(file))?);
        let mut members = HashMap::new();
        for entry in archive.entries().map_err(malformed)? {
            let entry = entry.map_err(malformed)?;
            // A member named outside the archive's root is never looked up.
            let Some(name) = clean(&String::from_utf8_lossy(&entry.path_bytes())) else {
                continue;
            };
            let target =
                String::from_utf8_lossy(&entry.link_name_bytes().unwrap_or_default()).into_owned();
            let member = match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => Member::Data {
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                },
                // Relative to the link's directory; an absolute one leads out.
                tar::EntryType::Symlink if target.starts_with('/') => Member::Link(None),
                tar::EntryType::Symlink => Member::Link(clean(&format!("{name}/../{target}"))),
                // Relative to the archive's root.
                tar::EntryType::Link => Member::Link(clean(&target)),
                _ => continue,
            };
            members.insert(name, member);
        }
        Ok(Blobs {
            image: image.to_owned(),
            store: Store::Archive {
                file: file.to_owned(),
                members,
            },
        })
    }

    /// Whether the layout has `name`.
    pub fn has(&self, name: &str) -> bool {
        match &self.store {
            Store::Dir(root) => root.join(name).exists(),
            Store::Archive { members, .. } => members.contains_key(name),
        }
    }

    /// Reads `name`, a path relative to the layout's root.
    pub fn open(&self, name: &str) -> Result<Box<dyn Read>, ContainerError> {
        let outside = || ContainerError::Outside {
            image: self.image.clone(),
            name: name.to_owned(),
        };
        let missing = || ContainerError::Missing {
            image: self.image.clone(),
            name: name.to_owned(),
        };
        let cleaned = clean(name).ok_or_else(outside)?;
        match &self.store {
            Store::Dir(root) => {
                let path = root.join(&cleaned);
                let real = match path.canonicalize() {
                    Ok(real) => real,
                    Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(missing()),
                    Err(error) => return Err(read_error(&path)(error)),
                };
                if !real.starts_with(root) {
                    return Err(outside());
                }
                Ok(Box::new(File::open(&real).map_err(read_error(&real))?))
            }
            Store::Archive { file, members } => {
                let mut current = cleaned;
                for _ in 0..MAX_LINKS {
                    match members.get(&current).ok_or_else(missing)? {
                        Member::Link(Some(target)) => current = target.clone(),
                        Member::Link(None) => return Err(outside()),
                        &Member::Data { offset, size } => {
                            let mut reader = File::open(file).map_err(read_error(file))?;
                            reader
                                .seek(SeekFrom::Start(offset))
                                .map_err(read_error(file))?;
                            return Ok(Box::new(reader.take(size)));
                        }
                    }
                }
                Err(outside())
            }
        }
    }

    /// Reads `name` whole: a JSON document.
    pub fn read_small(&self, name: &str) -> Result<Vec<u8>, ContainerError> {
        let mut bytes = Vec::new();
        self.open(name)?
            .take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| ContainerError::Malformed {
                image: self.image.clone(),
                what: format!("cannot read {name}: {error}"),
            })?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(ContainerError::Malformed {
                image: self.image.clone(),
                what: format!("{name} is larger than {} MiB", MAX_JSON >> 20),
            });
        }
        Ok(bytes)
    }
}

/// `name` relative to the root, `.` and `..` resolved, or `None` if it
/// climbs out of the root.
pub fn clean(name: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

fn read_error(path: &Path) -> impl FnOnce(io::Error) -> ContainerError + '_ {
    move |source| ContainerError::Read {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_climbing_out_are_caught() {
        assert_eq!(
            clean("./blobs/sha256/ab").as_deref(),
            Some("blobs/sha256/ab")
        );
        assert_eq!(clean("a/../b").as_deref(), Some("b"));
        assert_eq!(clean("a/../../etc/passwd"), None);
        assert_eq!(clean("/etc/passwd").as_deref(), Some("etc/passwd"));
    }

    #[test]
    fn an_archive_link_leading_out_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("image.tar");
        let mut tar = tar::Builder::new(File::create(&file).unwrap());
        let mut header = tar::Header::new_ustar();
        header.set_size(5);
        tar.append_data(&mut header, "inside", &b"hello"[..])
            .unwrap();
        let mut link = tar::Header::new_ustar();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        tar.append_link(&mut link, "alias", "inside").unwrap();
        tar.append_link(&mut link, "escape", "../../etc/passwd")
            .unwrap();
        tar.append_link(&mut link, "absolute", "/etc/passwd")
            .unwrap();
        tar.finish().unwrap();
        drop(tar);

        let blobs = Blobs::archive("oci-archive:image.tar", &file).unwrap();
        let mut read = String::new();
        blobs
            .open("alias")
            .unwrap()
            .read_to_string(&mut read)
            .unwrap();
        assert_eq!(read, "hello");
        for name in ["escape", "absolute", "../image.tar"] {
            let error = blobs.open(name).err().unwrap();
            assert!(
                matches!(error, ContainerError::Outside { .. }),
                "{name}: {error}"
            );
        }
    }

    #[test]
    fn a_directory_link_leading_out_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        std::fs::create_dir(&layout).unwrap();
        std::fs::write(dir.path().join("secret"), "no").unwrap();
        std::os::unix::fs::symlink("../secret", layout.join("escape")).unwrap();
        let blobs = Blobs::dir("oci:layout", &layout).unwrap();
        let error = blobs.open("escape").err().unwrap();
        assert!(matches!(error, ContainerError::Outside { .. }), "{error}");
        assert!(error.to_string().contains("escape"), "{error}");
    }
}
