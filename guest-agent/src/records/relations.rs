//! A job's provenance records as they are found: the relations in the order
//! they happened, and the assembled list. The agent's tracer and the host's
//! replay analysis (provm's provenance::DerivedProvenance) both build them
//! so, which keeps the two graphs comparable.

use std::collections::HashSet;

use super::{FileVersion, Process, ProvRecord};

/// Relations between processes and file versions, in order.
#[derive(Clone, Default)]
pub struct Relations {
    records: Vec<ProvRecord>,
    /// (process, file) pairs already used: a use is recorded once.
    used: HashSet<(u32, u32)>,
    seq: u64,
}

impl Relations {
    pub fn started(&mut self, process: u32, starter: u32, exec: bool) {
        self.records.push(ProvRecord::Started {
            process,
            starter,
            exec,
        });
    }

    /// `process` read (or, with `execute`, ran) `file`, if not already.
    pub fn used(&mut self, process: u32, file: u32, execute: bool) {
        if self.used.insert((process, file)) {
            let seq = self.next_seq();
            self.records.push(ProvRecord::Used {
                process,
                file,
                execute,
                seq,
            });
        }
    }

    pub fn generated(&mut self, file: u32, process: u32) {
        let seq = self.next_seq();
        self.records
            .push(ProvRecord::Generated { file, process, seq });
    }

    /// `process` made `file` with the content of `from` (a rename or link).
    pub fn derived(&mut self, file: u32, from: u32, process: u32) {
        self.records.push(ProvRecord::Derived {
            file,
            from,
            process,
        });
        self.generated(file, process);
    }

    pub fn invalidated(&mut self, file: u32, process: u32) {
        let seq = self.next_seq();
        self.records
            .push(ProvRecord::Invalidated { file, process, seq });
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

/// Every record of a job, each after those it refers to: environments (by
/// id), file versions, processes, then the relations.
pub fn assemble(
    environments: impl IntoIterator<Item = (Vec<Vec<u8>>, u32)>,
    versions: Vec<FileVersion>,
    processes: Vec<Process>,
    relations: Relations,
) -> Vec<ProvRecord> {
    let mut environments: Vec<(Vec<Vec<u8>>, u32)> = environments.into_iter().collect();
    environments.sort_by_key(|(_, id)| *id);
    let mut records: Vec<ProvRecord> = environments
        .into_iter()
        .map(|(entries, id)| ProvRecord::Environment { id, entries })
        .collect();
    records.extend(versions.into_iter().map(ProvRecord::File));
    records.extend(processes.into_iter().map(ProvRecord::Process));
    records.extend(relations.records);
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_use_is_recorded_once_and_relations_keep_their_order() {
        let mut relations = Relations::default();
        relations.used(1, 0, false);
        relations.used(1, 0, false);
        relations.derived(2, 0, 1);
        let records = assemble(
            [(vec![b"B=2".to_vec()], 1), (vec![b"A=1".to_vec()], 0)],
            Vec::new(),
            Vec::new(),
            relations,
        );
        assert!(matches!(records[0], ProvRecord::Environment { id: 0, .. }));
        assert_eq!(
            records[2..],
            [
                ProvRecord::Used {
                    process: 1,
                    file: 0,
                    execute: false,
                    seq: 1
                },
                ProvRecord::Derived {
                    file: 2,
                    from: 0,
                    process: 1
                },
                ProvRecord::Generated {
                    file: 2,
                    process: 1,
                    seq: 2
                },
            ]
        );
    }
}
