//! What a trace says about its run: the manifest, written first (what ran,
//! where, from which inputs), and the outcome, written last (how it ended).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// The release of provm that recorded the trace.
    pub provm_version: String,
    /// The commit of provm's source it was built from (`git rev-parse
    /// HEAD`, with `-dirty` when its sources differed from it); absent when
    /// built outside git, and from traces of format 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provm_commit: Option<String>,
    /// The machine the guest ran on: everything it could observe of the VMM
    /// (`provm_vmm::machine_version`).
    #[serde(default = "machine_version_of_format_4")]
    pub machine_version: u32,
    /// When the recording started, in seconds since the Unix epoch.
    pub started_unix: u64,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    /// Who the command ran as (a container image's `User`, `USER[:GROUP]`);
    /// absent: root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub root_device: String,
    pub image: ImageIdentity,
    pub kernel_sha256: String,
    /// Of the kernel profile's JSON (see `format::SectionKind::KernelProfile`).
    pub kernel_profile_sha256: String,
    pub initramfs_sha256: String,
    pub snapshot_sha256: String,
    pub kernel_cmdline: String,
    pub memory_mib: u64,
    /// The guest's vCPUs (`--cpus`); absent: one.
    #[serde(default = "one_cpu", skip_serializing_if = "is_one_cpu")]
    pub cpus: u8,
    /// The seed of a `--chaos` recording's schedule; absent: the default
    /// schedule. The replay follows the log whatever it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chaos_seed: Option<u64>,
    pub cpu: CpuModel,
    pub host: HostDescription,
    /// The longest the guest could run without exits while a tick waited.
    pub exitless_limit_seconds: Option<u64>,
    /// The unlogged inputs the recording host left open (ids such as
    /// `user-rdtsc`): a replay cannot check them. Absent from the traces of
    /// older provm versions, which did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holes: Option<Vec<String>>,
    /// Where an interrupt the guest could not take at once was delivered.
    /// Absent from the traces of older provm versions: the doorbell.
    #[serde(default)]
    pub interrupt_delivery: InterruptDelivery,
    /// Set on a what-if fork of a replay (`provm replay --fork-at`): its log
    /// is the recording's up to the fork point, then the fork's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
    /// The host's files and folders the command got (`--input`). What the
    /// guest received of them is in the log, like every input; these are
    /// their digests as sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<InputRecord>,
    /// The image of the file system the inputs went to the guest on, when
    /// they went by disk (format 10 on): embedded in the trace
    /// (`SectionKind::InputDisk`), which a replay checks against this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_disk: Option<DataDigest>,
    /// The command's standard input, when it had one (it is in the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<DataDigest>,
    /// The command's standard input streamed to it as it ran (provm's was
    /// a pipe or a socket): in the log, as the host's input where it came,
    /// with no digest known at the start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_live: bool,
    /// The command ran on a terminal in the guest, this size at the start
    /// (`-t`, a container's `process.terminal`): its standard input was
    /// typed at it, live, and each new size is in the log as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalSize>,
    /// The guest paths whose files came back after the command
    /// (`--output`); their content is in the log, as the guest sent it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
}

/// One `--input`: where it came from and where the guest saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRecord {
    /// As the trace names the host's files (see `--keep-host-paths`).
    pub host: String,
    pub guest: String,
    /// Of the tree as sent: every entry's message, in order.
    pub sha256: String,
    /// Regular files in it, and their bytes.
    pub files: u64,
    pub bytes: u64,
}

/// A terminal's size, in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    pub rows: u16,
    pub columns: u16,
}

/// A byte stream's digest and length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataDigest {
    pub sha256: String,
    pub bytes: u64,
}

fn one_cpu() -> u8 {
    1
}

fn is_one_cpu(cpus: &u8) -> bool {
    *cpus == 1
}

/// Traces of format 4 do not name their machine: every provm that wrote
/// format 4 ran machine version 1 (the corpus in tests/data/corpus/ replays
/// on it).
fn machine_version_of_format_4() -> u32 {
    1
}

/// Where the recording delivered an interrupt that came due while the
/// guest had interrupts disabled; a replay must do the same.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum InterruptDelivery {
    /// At the exit the guest kernel makes when it enables interrupts and
    /// finds its doorbell rung (kernel patch 0007): every host.
    #[default]
    Doorbell,
    /// At KVM's interrupt-window exit: hosts that place it where the guest
    /// enables interrupts (SVM, VMX), not PVM.
    WindowExit,
}

/// Where a fork came from, and the fault it injected.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ForkOrigin {
    /// The trace forked, by file name.
    pub trace: String,
    /// That trace's event log digest, if it has one.
    pub events_sha256: Option<String>,
    /// The fork point, as `--fork-at` takes it (the outcome has the event).
    pub at: String,
    /// The fault, as `--inject` takes it.
    pub fault: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageIdentity {
    /// The image's file name; with `provm record --keep-host-paths`, the
    /// path it was recorded from, as given. Replay looks for it there and
    /// beside the trace, and checks the digests.
    pub path: String,
    /// Every file the image reads from: the image itself first, then its
    /// qcow2 backing chain. Replay checks each one.
    pub chain: Vec<ImageFile>,
    /// The container image the disk was made of (`provm record
    /// oci:DIR:TAG`, `oci-archive:`, `docker-archive:`), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerImage>,
}

/// A container image, as the recording named it: the disk provm made of it
/// is the chain's one file, the same bytes whenever the image is the same.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerImage {
    /// As given, its path named as `ImageIdentity::path` is.
    pub reference: String,
    /// `sha256:...`: the digest of its manifest, or of a docker archive's
    /// configuration (its image ID), as `digest_of` says.
    pub digest: String,
    /// `manifest` or `image ID`.
    pub digest_of: String,
}

/// One file of an image's backing chain.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageFile {
    /// Its file name; with `--keep-host-paths`, where it was read at record
    /// time: absolute, as the qcow2 headers named it.
    pub path: String,
    /// 0 for the image itself, n for its nth backing image; a data file has
    /// the depth of the image it belongs to.
    pub depth: u32,
    /// `image` (the image or a backing image) or `data file` (a qcow2
    /// external data file).
    pub role: String,
    pub size: u64,
    /// SHA-256 of the file's bytes.
    pub sha256: String,
}

/// The CPU the guest saw (its CPUID table, the features its kernel was told
/// to ignore, the baseline asked for, PVM's user-space view), and one CPUID
/// leaf of it: the CPU model's own types (`provm-cpu-model`), which own
/// their manifest form.
pub use provm_cpu_model::{CpuModel, CpuidEntry};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostDescription {
    pub kernel: String,
    pub cpu: String,
    pub hypervisor: String,
}

/// How the recording ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// False when the run was cut short (interrupted, timed out, crashed).
    pub complete: bool,
    /// What ended the run, in words.
    pub ended: String,
    /// The command's exit status as a shell reports it, if it finished.
    pub exit_status: Option<i32>,
    pub events: u64,
    pub exits: u64,
    pub event_chunks: u32,
    /// Virtual time from the snapshot to the end, in nanoseconds.
    pub guest_ns: u64,
    pub disk_writes: u64,
    /// SHA-256 over every disk write in order: offset, length, bytes.
    pub disk_writes_sha256: String,
    /// Host time the recording took, in seconds.
    pub host_seconds: f64,
    /// The longest the guest ran between two VM exits, in host seconds.
    /// Absent from older traces and from forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_exitless_seconds: Option<f64>,
    /// The last lines of the guest's serial console.
    pub console_tail: String,
    /// The kinds of the sections written after the outcome, in order
    /// (provenance, image), so that a trace cut short after its outcome is
    /// noticed. Absent from traces of older provm versions.
    #[serde(default)]
    pub sections_after: Option<Vec<String>>,
    /// SHA-256 over the encoded event log (`LogTotals::events_sha256`): a
    /// pinned run's is the same every time. Absent from older traces.
    #[serde(default)]
    pub events_sha256: Option<String>,
    /// A fork's (see `Manifest::fork`): the index of its first own event,
    /// the ones before are the forked trace's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_event: Option<u64>,
    /// A fork's injected disk error: the disk access (a read or a write of
    /// up to 64 KiB of a request, counted from 1 over the whole run) that
    /// failed. Replay fails it again: the device's status goes to guest
    /// memory, which is not logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_error_access: Option<u64>,
    /// The state check at the guest's power-off, if the recording took
    /// one. Absent from older traces, from recordings cut short and from
    /// forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_check: Option<FinalStateCheck>,
}

/// The machine's state when the guest powered off, as digests (xxh3-64,
/// 16 hex digits): all guest memory, the vCPU's registers (general,
/// special, debug, FPU and XSAVE state, XCRs, MSRs, pending events) and
/// each device's saved state. A replay takes the same at its power-off and
/// compares: an input the log missed whose effect stayed inside the guest
/// shows here.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FinalStateCheck {
    pub memory: String,
    pub registers: String,
    /// Whether `registers` leaves out KVM's TSC frequency (Hyper-V's TSC
    /// frequency MSR), the rate at which the recording host calibrated its
    /// TSC. Older traces digested it: a replay finds their host's rate
    /// (`provm_vmm::state_digest::RegistersAtTscRate`).
    #[serde(default)]
    pub registers_leave_out_tsc_rate: bool,
    /// The registers by part, so that a difference is named: the digest
    /// of each group KVM saves ("general", "special", "debug", "vector
    /// (XSAVE)", "events", "XCRs", "MP state", "CPUID") and each compared
    /// MSR's value, by a name starting "MSR " ("MSR 0x1d9"). Absent from
    /// traces before format 11.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub register_parts: BTreeMap<String, String>,
    /// By device name.
    pub devices: BTreeMap<String, String>,
}

impl FinalStateCheck {
    /// What differs in `replayed` from this recorded check, in words
    /// ("memory differs", "registers differ", "device pit differs"), the
    /// first in that order.
    pub fn first_difference(&self, replayed: &FinalStateCheck) -> Option<String> {
        if self.memory != replayed.memory {
            return Some("memory differs".into());
        }
        if self.registers != replayed.registers {
            return Some(match self.register_differences(replayed) {
                parts if parts.is_empty() => "registers differ".into(),
                parts => format!("registers differ: {parts}"),
            });
        }
        let names = self.devices.keys().chain(replayed.devices.keys());
        names
            .into_iter()
            .find(|name| self.devices.get(*name) != replayed.devices.get(*name))
            .map(|name| format!("device {name} differs"))
    }

    /// The register parts that differ in `replayed`, in words: a group by
    /// its name, an MSR with both values; the first few, then how many
    /// more. Empty where either check has no parts.
    fn register_differences(&self, replayed: &FinalStateCheck) -> String {
        const NAMED: usize = 4;
        let (recorded, replayed) = (&self.register_parts, &replayed.register_parts);
        if recorded.is_empty() || replayed.is_empty() {
            return String::new();
        }
        let names: std::collections::BTreeSet<&String> =
            recorded.keys().chain(replayed.keys()).collect();
        let differing: Vec<String> = names
            .into_iter()
            .filter(|name| recorded.get(*name) != replayed.get(*name))
            .map(|name| {
                if !name.starts_with("MSR ") {
                    return name.clone();
                }
                let value = |part: Option<&String>| {
                    part.map_or("none".to_owned(), |hex| {
                        format!("{:#x}", u64::from_str_radix(hex, 16).unwrap_or_default())
                    })
                };
                format!(
                    "{name} (recorded {}, replayed {})",
                    value(recorded.get(name)),
                    value(replayed.get(name))
                )
            })
            .collect();
        match differing.len() {
            n if n > NAMED => format!("{} and {} more", differing[..NAMED].join(", "), n - NAMED),
            _ => differing.join(", "),
        }
    }
}

#[cfg(test)]
mod final_check_tests {
    use super::FinalStateCheck;

    fn check(memory: &str, registers: &str, pit: &str) -> FinalStateCheck {
        FinalStateCheck {
            memory: memory.into(),
            registers: registers.into(),
            registers_leave_out_tsc_rate: true,
            register_parts: Default::default(),
            devices: [("pit".to_owned(), pit.to_owned())].into(),
        }
    }

    #[test]
    fn a_register_difference_alone_is_named() {
        let recorded = check("m", "r", "p");
        assert_eq!(recorded.first_difference(&check("m", "r", "p")), None);
        assert_eq!(
            recorded.first_difference(&check("m", "R", "p")).as_deref(),
            Some("registers differ")
        );
        assert_eq!(
            recorded.first_difference(&check("M", "R", "p")).as_deref(),
            Some("memory differs")
        );
        assert_eq!(
            recorded.first_difference(&check("m", "r", "P")).as_deref(),
            Some("device pit differs")
        );
    }

    #[test]
    fn the_register_parts_that_differ_are_named() {
        let with_parts = |registers: &str, parts: &[(&str, &str)]| FinalStateCheck {
            register_parts: parts
                .iter()
                .map(|(name, hex)| ((*name).to_owned(), (*hex).to_owned()))
                .collect(),
            ..check("m", registers, "p")
        };
        let recorded = with_parts(
            "r",
            &[
                ("debug", "0000000000000001"),
                ("MSR 0x40000022", "000000009af8da00"),
                ("MSR 0x1d9", "0000000000000000"),
            ],
        );
        let replayed = with_parts(
            "R",
            &[
                ("debug", "0000000000000002"),
                ("MSR 0x40000022", "000000009af8dde8"),
            ],
        );
        assert_eq!(
            recorded.first_difference(&replayed).as_deref(),
            Some(
                "registers differ: MSR 0x1d9 (recorded 0x0, replayed none), \
                 MSR 0x40000022 (recorded 0x9af8da00, replayed 0x9af8dde8), debug"
            )
        );
        // An older trace has no parts: only that they differ.
        assert_eq!(
            check("m", "r", "p").first_difference(&replayed).as_deref(),
            Some("registers differ")
        );
        let many: Vec<(String, String)> = (0..6)
            .map(|i| (format!("MSR {i:#x}"), format!("{i:016x}")))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert!(with_parts("r", &many)
            .first_difference(&with_parts("R", &[("debug", "0")]))
            .unwrap()
            .ends_with("and 3 more"));
    }
}
