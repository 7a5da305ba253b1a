//! What a run produced that `provm repro` compares: its exit status, its
//! stdout and stderr, and the last content of every file it wrote.
//!
//! Files come from the run's provenance (the guest agent hashes a file its
//! writer wrote when the writer is done with it), which also names the
//! writer; diffing the disk overlay would need an ext4 reader and could
//! not say who wrote a file.

use std::collections::BTreeMap;

use provm_guest_agent::Outcome;

use crate::provenance::{self, Provenance};

pub struct Observed {
    /// As a shell reports it; `None` if the command did not finish (a
    /// recording cut short, that `provm diff` compares).
    pub exit_status: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// By path: the files the command left written.
    pub files: BTreeMap<String, Written>,
}

/// A file's last version, and who wrote it.
pub struct Written {
    pub sha256: Option<String>,
    /// The writing program and its process id, e.g. `tar, pid 41`.
    pub writer: String,
}

impl Observed {
    pub fn new(outcome: Outcome, stdout: Vec<u8>, stderr: Vec<u8>, run: &Provenance) -> Self {
        Observed {
            exit_status: Some(outcome.shell_status()),
            stdout,
            stderr,
            files: files_written(run),
        }
    }

    /// A digest of everything `differences` compares: two runs with the same
    /// digest produced the same (`repro --chaos-runs` groups runs by it).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        // Each field with its length, so that no two outputs run together.
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field(
            &self
                .exit_status
                .map_or(Vec::new(), |status| status.to_le_bytes().to_vec()),
        );
        field(&self.stdout);
        field(&self.stderr);
        for (path, written) in &self.files {
            field(path.as_bytes());
            field(written.sha256.as_deref().unwrap_or_default().as_bytes());
        }
        provm_trace::hex(&hasher.finalize())
    }

    /// What differs between `self` and `other`, for people, in the order
    /// exit status, stdout, stderr, files by path.
    pub fn differences(&self, other: &Observed) -> Vec<String> {
        let mut differences = Vec::new();
        if self.exit_status != other.exit_status {
            let status = |status: Option<i32>| {
                status.map_or("none: it did not finish".to_owned(), |s| s.to_string())
            };
            differences.push(format!(
                "the exit status differs ({} against {})",
                status(self.exit_status),
                status(other.exit_status)
            ));
        }
        for (name, mine, theirs) in [
            ("stdout", &self.stdout, &other.stdout),
            ("stderr", &self.stderr, &other.stderr),
        ] {
            if mine != theirs {
                differences.push(format!("{name} differs"));
            }
        }
        let paths: std::collections::BTreeSet<&String> =
            self.files.keys().chain(other.files.keys()).collect();
        for path in paths {
            match (self.files.get(path), other.files.get(path)) {
                (Some(mine), Some(theirs)) if mine.sha256 == theirs.sha256 => {}
                (Some(mine), Some(_)) => {
                    differences.push(format!("{path} differs (written by {})", mine.writer))
                }
                (Some(mine), None) | (None, Some(mine)) => differences.push(format!(
                    "{path} is written in one run only (by {})",
                    mine.writer
                )),
                // The path came from one of the two.
                (None, None) => {}
            }
        }
        differences
    }
}

/// Every file the run left written (its last version; not the ones it
/// deleted again, nor /proc, /sys or /dev), by path.
pub fn files_written(run: &Provenance) -> BTreeMap<String, Written> {
    provenance::output_files(run)
        .into_iter()
        .map(|(path, output)| {
            let writer = run.activity(output.writer).map_or_else(
                || "an unknown process".to_owned(),
                |process| {
                    let label = process.label();
                    let program = label.split(' ').next().unwrap_or_default();
                    format!("{program}, pid {}", process.pid)
                },
            );
            let written = Written {
                sha256: output.version.sha256.clone(),
                writer,
            };
            (path.to_owned(), written)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provenance::{Activity, Entity, Relation};

    fn file(id: &str, path: &str, sha256: &str) -> Entity {
        Entity::test_file(id, path, sha256)
    }

    fn generated(entity: &str) -> Relation {
        Relation::WasGeneratedBy {
            entity: entity.into(),
            activity: "p41".into(),
        }
    }

    /// A run whose tar (pid 41) wrote result.tar twice (`tar_sha256` last),
    /// a scratch file it deleted, and /dev/null.
    fn run(tar_sha256: &str) -> Provenance {
        Provenance {
            activities: vec![Activity {
                id: "p41".into(),
                pid: 41,
                exe: "/bin/busybox".into(),
                argv: vec!["tar".into(), "-cf".into(), "result.tar".into()],
                ..Activity::default()
            }],
            entities: vec![
                file("f1", "/out/result.tar", "old"),
                file("f2", "/out/result.tar", tar_sha256),
                file("f3", "/tmp/scratch", "s"),
                file("f4", "/dev/null", ""),
            ],
            relations: vec![
                generated("f1"),
                generated("f2"),
                generated("f3"),
                Relation::WasInvalidatedBy {
                    entity: "f3".into(),
                    activity: "p41".into(),
                },
                generated("f4"),
            ],
        }
    }

    fn observed(status: i32, stdout: &str, tar_sha256: &str) -> Observed {
        Observed::new(
            Outcome::Exited(status),
            stdout.into(),
            Vec::new(),
            &run(tar_sha256),
        )
    }

    #[test]
    fn the_files_left_written_are_the_last_versions_of_real_files() {
        let files = files_written(&run("new"));
        assert_eq!(files.keys().collect::<Vec<_>>(), ["/out/result.tar"]);
        let tar = &files["/out/result.tar"];
        assert_eq!(tar.sha256.as_deref(), Some("new"));
        assert_eq!(tar.writer, "tar, pid 41");
    }

    #[test]
    fn the_digest_changes_with_each_thing_compared() {
        let digest = observed(0, "a", "x").digest();
        assert_eq!(digest, observed(0, "a", "x").digest());
        for other in [
            observed(1, "a", "x"),
            observed(0, "b", "x"),
            observed(0, "a", "y"),
        ] {
            assert_ne!(digest, other.digest());
        }
    }

    #[test]
    fn differences_name_the_status_the_streams_and_each_file() {
        let first = observed(0, "a", "x");
        assert!(first.differences(&observed(0, "a", "x")).is_empty());
        assert_eq!(
            first.differences(&observed(1, "b", "y")),
            [
                "the exit status differs (0 against 1)",
                "stdout differs",
                "/out/result.tar differs (written by tar, pid 41)",
            ]
        );
        let mut without = observed(0, "a", "x");
        without.files.clear();
        assert_eq!(
            first.differences(&without),
            ["/out/result.tar is written in one run only (by tar, pid 41)"]
        );
    }
}
