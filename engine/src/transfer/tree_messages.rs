//! A surveyed input read as the agent channel carries it: its entries as
//! tree entries (`HostMessage::Entry`, as tree 0), its files' content in
//! chunks read as they go, digested as they are given. An input's digest
//! is of these messages whatever its route, so the manifest's digest of
//! the same content is the same by channel or by disk. Each route reads
//! through here, pulling: `InputPlan` digests a channel input before the
//! run, then reads it again as it sends it and checks it against that
//! digest; `disk_fill` reads a disk input once, writing its files and
//! taking its digest on the way.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use provm_guest_agent::tree::DATA_CHUNK;
use provm_guest_agent::{Entry, EntryContent, HostMessage};
use provm_trace::format::read_full;
use provm_trace::manifest::DataDigest;
use sha2::{Digest, Sha256};

use super::survey::Planned;
use super::DataError;

/// Input files are read up to this much at a time, then cut into messages:
/// each read costs more than the copy under emulation (the SVM test bed
/// verified a trace in 34 s in reads of 64 KiB, 13 s in reads of 1 MiB).
const READ_SIZE: usize = 4 << 20;

/// One tree's messages, as tree 0 (the channel gives them their index), its
/// files read as they go, and digested as they are given.
pub(super) struct TreeMessages<'a> {
    entries: std::slice::Iter<'a, Planned>,
    /// The file being sent, its entry path and its location.
    open: Option<(BufReader<File>, &'a [u8], &'a Path)>,
    /// The messages given so far, as encoded.
    hasher: Sha256,
    /// The content bytes they carried.
    bytes: u64,
}

impl<'a> TreeMessages<'a> {
    pub(super) fn new(entries: &'a [Planned]) -> Self {
        TreeMessages {
            entries: entries.iter(),
            open: None,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The digest of the messages given: once all were, the tree's.
    pub(super) fn digest(self) -> DataDigest {
        DataDigest {
            sha256: provm_trace::hex(&self.hasher.finalize()),
            bytes: self.bytes,
        }
    }

    /// The next message: a chunk of the open file, else the next entry.
    fn read(&mut self) -> Option<Result<HostMessage, DataError>> {
        if let Some(chunk) = self.next_chunk() {
            return Some(chunk);
        }
        Some(Ok(match self.entries.next()? {
            Planned::Dir { path, mode } => self.entry(path, EntryContent::Dir { mode: *mode }),
            Planned::Symlink { path, target } => {
                self.entry(path, EntryContent::Symlink(target.clone()))
            }
            Planned::File {
                path,
                mode,
                source,
                len,
            } => {
                match File::open(source) {
                    Ok(file) => {
                        // No larger than the file: a folder of small files
                        // allocates no 4 MiB per file.
                        let capacity = (*len as usize).clamp(DATA_CHUNK, READ_SIZE);
                        let file = BufReader::with_capacity(capacity, file);
                        self.open = Some((file, path, source))
                    }
                    Err(error) => {
                        return Some(Err(DataError::InputUnreadable {
                            path: source.clone(),
                            source: error,
                        }))
                    }
                }
                self.entry(path, EntryContent::File { mode: *mode })
            }
        }))
    }

    fn entry(&self, path: &[u8], content: EntryContent) -> HostMessage {
        HostMessage::Entry(Entry {
            tree: 0,
            path: path.to_vec(),
            content,
        })
    }

    /// The next chunk of the open file, if any is left.
    fn next_chunk(&mut self) -> Option<Result<HostMessage, DataError>> {
        let (file, path, source) = self.open.as_mut()?;
        let mut chunk = vec![0; DATA_CHUNK];
        // Filled whole: chunks fall at the same places whatever sizes the
        // reads return.
        let read = read_full(file, &mut chunk).map_err(|source_error| DataError::InputUnreadable {
            path: source.to_path_buf(),
            source: source_error,
        });
        let path: &[u8] = path;
        match read {
            Ok(0) => {
                self.open = None;
                None
            }
            Ok(len) => {
                chunk.truncate(len);
                Some(Ok(self.entry(path, EntryContent::Data(chunk))))
            }
            Err(error) => {
                self.open = None;
                Some(Err(error))
            }
        }
    }
}

impl Iterator for TreeMessages<'_> {
    type Item = Result<HostMessage, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let message = self.read();
        if let Some(Ok(message)) = &message {
            // Its data not copied to digest it.
            let (head, data) = message.encoded_parts();
            self.hasher.update(head);
            self.hasher.update(data);
            if let HostMessage::Entry(Entry {
                content: EntryContent::Data(data),
                ..
            }) = message
            {
                self.bytes += data.len() as u64;
            }
        }
        message
    }
}

/// The digest of the tree of `entries`, read whole.
pub(super) fn digest(entries: &[Planned]) -> Result<DataDigest, DataError> {
    let mut messages = TreeMessages::new(entries);
    for message in &mut messages {
        message?;
    }
    Ok(messages.digest())
}
