//! What the guest agent said over a run, read from the messages it sent:
//! the command's stdout and stderr, how it ended, and the files it copied
//! back (`--output`), by digest. A fork reads a recording's and its own;
//! `provm diff` two recordings'.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use provm_guest_agent::{EntryContent, FrameReader, GuestMessage, Outcome};

/// What the agent said over a run: the command's output and how it ended.
#[derive(Default)]
pub struct AgentOutputs {
    frames: FrameReader,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub finished: Option<Outcome>,
    /// The agent could not run the command, or spoke out of turn.
    pub failed: Option<String>,
    /// The files copied back, by the job's output (its index) and the path
    /// under it: their content hashed as it arrives, since outputs may be
    /// larger than is worth keeping in memory.
    files: BTreeMap<(u32, String), Sha256>,
}

impl AgentOutputs {
    /// Takes in bytes the agent sent. After a bad frame nothing more can
    /// be read: the stream is failed, once.
    pub fn push(&mut self, bytes: &[u8]) {
        self.frames.push(bytes);
        loop {
            let message = match self.frames.next_frame() {
                Ok(Some((kind, payload))) => GuestMessage::decode(kind, &payload),
                Ok(None) => return,
                Err(error) => {
                    self.failed
                        .get_or_insert_with(|| format!("a malformed frame: {error}"));
                    return;
                }
            };
            match message {
                Ok(GuestMessage::Stdout(bytes)) => self.stdout.extend(bytes),
                Ok(GuestMessage::Stderr(bytes)) => self.stderr.extend(bytes),
                Ok(GuestMessage::Finished(outcome)) => self.finished = Some(outcome),
                Ok(GuestMessage::Entry(entry)) => {
                    let path = String::from_utf8_lossy(&entry.path).into_owned();
                    let file = (entry.tree, path);
                    match entry.content {
                        EntryContent::File { .. } => {
                            self.files.insert(file, Sha256::new());
                        }
                        EntryContent::Data(bytes) => {
                            self.files.entry(file).or_default().update(bytes);
                        }
                        // A link is told apart from a file that holds its target.
                        EntryContent::Symlink(target) => {
                            let hash = self.files.entry(file).or_default();
                            hash.update(b"symlink to ");
                            hash.update(target);
                        }
                        EntryContent::Dir { .. } | EntryContent::Missing => {}
                    }
                }
                Ok(GuestMessage::Provenance(_) | GuestMessage::Ready | GuestMessage::Received) => {}
                Ok(GuestMessage::Failed(reason)) => {
                    self.failed = Some(String::from_utf8_lossy(&reason).into_owned())
                }
                Err(error) => self.failed = Some(format!("a malformed message: {error}")),
            }
        }
    }

    /// The SHA-256 of each file (or symbolic link) copied back, by the
    /// job's output (its index) and the path under it ("" for the output
    /// itself, when it is a file).
    pub fn file_digests(&self) -> BTreeMap<(u32, String), String> {
        self.files
            .iter()
            .map(|(file, hash)| (file.clone(), provm_trace::hex(&hash.clone().finalize())))
            .collect()
    }
}

/// Up to 10 lines of a command's output, indented, for people.
pub struct Quoted<'a>(pub &'a [u8]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = String::from_utf8_lossy(self.0);
        let lines: Vec<&str> = text.lines().collect();
        for line in lines.iter().take(10) {
            writeln!(f, "  | {line}")?;
        }
        if lines.len() > 10 {
            writeln!(f, "  | ... ({} more lines)", lines.len() - 10)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_guest_agent::Entry;

    /// A bad frame fails the agent's outputs and returns (it used to read
    /// the same error for ever); what came before it is kept.
    #[test]
    fn a_bad_frame_fails_the_agents_outputs() {
        let mut outputs = AgentOutputs::default();
        outputs.push(&GuestMessage::Stdout(b"before".to_vec()).encode());
        // A header whose length is past any frame's.
        let mut bad = GuestMessage::Stdout(Vec::new()).encode();
        bad[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        outputs.push(&bad);
        outputs.push(&GuestMessage::Stdout(b"after".to_vec()).encode());
        assert_eq!(outputs.stdout, b"before");
        let failed = outputs.failed.expect("failed");
        assert!(failed.contains("malformed frame"), "{failed}");
    }

    #[test]
    fn files_copied_back_are_digested_whole() {
        let entry = |path: &str, content| {
            GuestMessage::Entry(Entry {
                tree: 1,
                path: path.into(),
                content,
            })
            .encode()
        };
        let mut outputs = AgentOutputs::default();
        outputs.push(&entry("", EntryContent::Dir { mode: 0o755 }));
        outputs.push(&entry("a", EntryContent::File { mode: 0o644 }));
        outputs.push(&entry("a", EntryContent::Data(b"hello ".to_vec())));
        outputs.push(&entry("a", EntryContent::Data(b"world".to_vec())));
        let digests = outputs.file_digests();
        assert_eq!(digests.len(), 1, "{digests:?}");
        assert_eq!(
            digests[&(1, "a".to_owned())],
            provm_trace::hex(&Sha256::digest(b"hello world"))
        );
    }

    #[test]
    fn quotes_are_cut_at_ten_lines() {
        let many: String = (1..=12).map(|n| format!("{n}\n")).collect();
        let quoted = Quoted(many.as_bytes()).to_string();
        assert!(quoted.starts_with("  | 1\n"), "{quoted}");
        assert!(
            quoted.ends_with("  | 10\n  | ... (2 more lines)\n"),
            "{quoted}"
        );
    }
}
