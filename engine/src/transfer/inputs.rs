//! The inputs' plan, which the job's data carries: every surveyed input
//! (`survey`) with the digest its route read it for, and the command's
//! standard input, made once and not changed after. From it come the manifest's records, the
//! job's description, and the messages that follow the job on the channel:
//! the inputs that do not go by disk, each checked against its digest as
//! it is read again to be sent, then standard input.

use provm_guest_agent::tree::DATA_CHUNK;
use provm_guest_agent::HostMessage;
use provm_trace::manifest::{DataDigest, InputRecord};

use super::survey::{Survey, Surveyed};
use super::tree_messages::{self, TreeMessages};
use super::DataError;
use crate::host_paths::HostPaths;

/// A surveyed input and the digest of its messages.
struct Digested {
    tree: Surveyed,
    digest: DataDigest,
}

/// Every input, surveyed and digested, and the command's standard input:
/// what follows the job on the channel.
pub struct InputPlan {
    trees: Vec<Digested>,
    stdin: Option<Vec<u8>>,
    /// The trees go on the input disk, not on the channel.
    by_disk: bool,
}

impl InputPlan {
    /// `survey`'s inputs with their `digests` (one per input, in order),
    /// as their route read them.
    pub(super) fn new(survey: Survey, digests: Vec<DataDigest>) -> InputPlan {
        assert_eq!(survey.trees.len(), digests.len(), "a digest per input");
        let trees = survey.trees.into_iter().zip(digests);
        let trees = trees.map(|(tree, digest)| Digested { tree, digest });
        InputPlan {
            trees: trees.collect(),
            stdin: survey.stdin,
            by_disk: survey.by_disk,
        }
    }

    /// `survey`'s inputs, that go on the channel: read once here, for
    /// their digests, and again as they are sent (`messages`).
    pub(super) fn on_channel(survey: Survey) -> Result<InputPlan, DataError> {
        let digests = survey
            .trees
            .iter()
            .map(|tree| tree_messages::digest(&tree.entries))
            .collect::<Result<_, _>>()?;
        Ok(InputPlan::new(survey, digests))
    }

    /// Whether the job sends nothing after itself.
    pub fn is_empty(&self) -> bool {
        (self.trees.is_empty() || self.by_disk) && self.stdin.is_none()
    }

    /// Whether the inputs go on the input disk.
    pub fn by_disk(&self) -> bool {
        self.by_disk
    }

    /// The job's input paths, in the guest.
    pub fn guest_paths(&self) -> Vec<Vec<u8>> {
        let guest = |digested: &Digested| digested.tree.input.guest.clone().into_bytes();
        self.trees.iter().map(guest).collect()
    }

    pub fn has_stdin(&self) -> bool {
        self.stdin.is_some()
    }

    /// The inputs as the manifest records them.
    pub fn records(&self, host_paths: HostPaths) -> Vec<InputRecord> {
        let record = |Digested { tree, digest }: &Digested| InputRecord {
            host: host_paths.name(&tree.input.host),
            guest: tree.input.guest.clone(),
            sha256: digest.sha256.clone(),
            files: tree.files,
            bytes: digest.bytes,
        };
        self.trees.iter().map(record).collect()
    }

    /// The standard input's digest, if the command has one.
    pub fn stdin_digest(&self) -> Option<DataDigest> {
        self.stdin.as_ref().map(|stdin| DataDigest {
            sha256: crate::digest::bytes_sha256(stdin),
            bytes: stdin.len() as u64,
        })
    }

    /// The messages that follow the job: every input's entries (unless
    /// they go by disk), each input checked against its digest once sent,
    /// then standard input.
    pub fn messages(&self) -> impl Iterator<Item = Result<HostMessage, DataError>> + '_ {
        let on_channel = if self.by_disk { &[][..] } else { &self.trees };
        let trees = on_channel
            .iter()
            .enumerate()
            .flat_map(|(index, digested)| Checked {
                messages: Some(TreeMessages::new(&digested.tree.entries)),
                index: index as u32,
                digested,
            });
        let stdin = self.stdin.iter().flat_map(|stdin| {
            stdin
                .chunks(DATA_CHUNK)
                .map(|chunk| Ok(HostMessage::Stdin(chunk.to_vec())))
        });
        trees.chain(stdin)
    }
}

/// A tree's messages as sent, their digest (as tree 0, as its route's
/// read took it) compared with the plan's at the end: a file that changed
/// in between fails the run.
struct Checked<'a> {
    /// None once they ended, or failed.
    messages: Option<TreeMessages<'a>>,
    /// The tree's index among the job's inputs.
    index: u32,
    digested: &'a Digested,
}

impl Iterator for Checked<'_> {
    type Item = Result<HostMessage, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.messages.as_mut()?.next() {
            Some(Ok(mut message)) => {
                if let HostMessage::Entry(entry) = &mut message {
                    entry.tree = self.index;
                }
                Some(Ok(message))
            }
            Some(Err(error)) => {
                self.messages = None;
                Some(Err(error))
            }
            None => {
                let sent = self.messages.take()?.digest();
                let Digested { tree, digest } = self.digested;
                (sent.sha256 != digest.sha256)
                    .then(|| Err(DataError::InputChanged(tree.input.host.clone())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use provm_guest_agent::EntryContent;

    use super::super::{Input, JobData, OutputSink};
    use super::*;

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/b.csv"), "x,y\n1,2\n").unwrap();
        fs::write(dir.path().join("a.csv"), vec![7u8; DATA_CHUNK + 10]).unwrap();
        std::os::unix::fs::symlink("a.csv", dir.path().join("link")).unwrap();
        dir
    }

    /// `inputs` and `stdin` on the channel, whatever their size.
    fn on_channel(inputs: &[Input], stdin: Option<Vec<u8>>) -> InputPlan {
        InputPlan::on_channel(Survey::of(inputs, stdin, 128, u64::MAX).unwrap()).unwrap()
    }

    fn sent(plan: &InputPlan) -> Vec<HostMessage> {
        plan.messages().collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn a_folder_is_sent_in_byte_order_with_its_content_chunked() {
        let dir = folder();
        let input = Input {
            host: dir.path().into(),
            guest: "/data".into(),
        };
        let plan = on_channel(&[input], Some(b"stdin".to_vec()));
        let paths: Vec<(String, &str)> = sent(&plan)
            .iter()
            .map(|message| match message {
                HostMessage::Entry(entry) => (
                    String::from_utf8_lossy(&entry.path).into_owned(),
                    match entry.content {
                        EntryContent::Dir { .. } => "dir",
                        EntryContent::File { .. } => "file",
                        EntryContent::Data(_) => "data",
                        EntryContent::Symlink(_) => "link",
                        EntryContent::Missing => "missing",
                    },
                ),
                HostMessage::Stdin(_) => ("".into(), "stdin"),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected = [
            ("", "dir"),
            ("a.csv", "file"),
            ("a.csv", "data"),
            ("a.csv", "data"),
            ("link", "link"),
            ("sub", "dir"),
            ("sub/b.csv", "file"),
            ("sub/b.csv", "data"),
            ("", "stdin"),
        ];
        let expected: Vec<(String, &str)> =
            expected.iter().map(|(p, k)| (p.to_string(), *k)).collect();
        assert_eq!(paths, expected);
        let record = &plan.records(HostPaths::default())[0];
        assert_eq!((record.files, record.bytes), (2, DATA_CHUNK as u64 + 18));
        assert_eq!(plan.stdin_digest().unwrap().bytes, 5);
    }

    #[test]
    fn each_input_is_sent_as_its_own_tree_with_the_digest_of_its_survey() {
        let (one, two) = (folder(), folder());
        let inputs = [one.path(), two.path()].map(|host| Input {
            host: host.into(),
            guest: "/data".into(),
        });
        let plan = on_channel(&inputs, None);
        let trees: Vec<u32> = sent(&plan)
            .iter()
            .map(|message| match message {
                HostMessage::Entry(entry) => entry.tree,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(trees, [[0; 8], [1; 8]].concat());
        // The same content, wherever it is sent: the same digest.
        let records = plan.records(HostPaths::default());
        assert_eq!(records[0].sha256, records[1].sha256);
    }

    #[test]
    fn an_input_changed_after_its_survey_fails() {
        let dir = folder();
        let input = Input {
            host: dir.path().into(),
            guest: "/data".into(),
        };
        let plan = on_channel(&[input], None);
        fs::write(dir.path().join("sub/b.csv"), "x,y\n1,3\n").unwrap();
        let result: Result<Vec<_>, _> = plan.messages().collect();
        assert!(matches!(result, Err(DataError::InputChanged(_))));
    }

    #[test]
    fn inputs_from_the_threshold_on_go_by_disk_and_only_stdin_by_channel() {
        let dir = folder();
        let input = Input {
            host: dir.path().into(),
            guest: "/data".into(),
        };
        let bytes = DATA_CHUNK as u64 + 18;
        let below = Survey::of(std::slice::from_ref(&input), None, 128, bytes + 1).unwrap();
        let below = InputPlan::on_channel(below).unwrap();
        assert!(!below.by_disk() && !below.is_empty());
        let survey = Survey::of(&[input], Some(b"in".to_vec()), 128, bytes).unwrap();
        assert!(survey.by_disk);
        // The digest the disk's making would give: not needed to send.
        let unread = DataDigest {
            sha256: String::new(),
            bytes,
        };
        let plan = InputPlan::new(survey, vec![unread]);
        assert!(plan.by_disk());
        assert!(matches!(sent(&plan)[..], [HostMessage::Stdin(_)]));
        let mut job = provm_guest_agent::Job::default();
        JobData {
            inputs: plan,
            input_disk: None,
            live_stdin: None,
            outputs: OutputSink::new(&[], false).unwrap(),
        }
        .describe(&mut job);
        assert!(job.input_disk && job.stdin);
        assert_eq!(job.inputs, [b"/data".to_vec()]);
    }
}
