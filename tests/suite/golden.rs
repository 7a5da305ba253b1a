//! Every saved form provm writes, against a golden sample of its version
//! (tests/data/golden/): the manifest and outcome, the event encoding and
//! the container of each trace format, the snapshot codec, and the VM
//! state (every device's, the vCPU's) of each machine version. A form that
//! changes without its version fails here: bump the version (keeping the
//! old form readable), then bless a sample for the new one with
//! `PROVM_BLESS=1 cargo test --release --test suite golden::`. A sample is never
//! overwritten: a version's form is fixed once traces of it exist.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use provm_trace::events::{Decoder, Encoder, Event, Place};
use provm_trace::format::{SectionKind, SectionWriter, TraceReader, FORMAT_VERSION, OLDEST_FORMAT};
use provm_trace::manifest::{
    CpuModel, CpuidEntry, DataDigest, FinalStateCheck, ForkOrigin, HostDescription, ImageFile,
    ImageIdentity, InterruptDelivery, Manifest, Outcome,
};
use provm_trace::snapshot::{self, SNAPSHOT_VERSION};
use provm_vmm::machine_version::{self, MACHINE_VERSIONS};
use provm_vmm::vm::VmState;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

/// The golden sample `name`, which `written` (the form this provm writes
/// now) must equal, compared by `same`; with PROVM_BLESS=1 a missing
/// sample is written from it.
fn golden_with(
    name: &str,
    bump: &str,
    written: &[u8],
    same: impl Fn(&[u8], &[u8]) -> bool,
) -> Vec<u8> {
    let path = golden_dir().join(name);
    let Ok(golden) = fs::read(&path) else {
        if std::env::var_os("PROVM_BLESS").is_some() {
            fs::write(&path, written).unwrap();
            return written.to_vec();
        }
        panic!(
            "no golden sample {}: write it with PROVM_BLESS=1 cargo test --release --test suite golden::",
            path.display()
        );
    };
    assert!(
        same(&golden, written),
        "the saved form {name} changed, but {bump} did not: bump it (and keep reading the old form, which traces hold), then bless a sample for the new version with PROVM_BLESS=1 cargo test --release --test suite golden::; the sample of this version is {}",
        path.display()
    );
    golden
}

fn golden(name: &str, bump: &str, written: &[u8]) -> Vec<u8> {
    golden_with(name, bump, written, |golden, written| golden == written)
}

const FORMAT: &str = "provm_trace::format::FORMAT_VERSION";

fn place(rip: u64) -> Place {
    Place {
        rip,
        registers: 0x0123_4567_89ab_cdef,
    }
}

/// One event of each kind.
fn sample_events() -> Vec<Event> {
    vec![
        Event::PioRead {
            port: 0x3f8,
            len: 1,
            at: place(0xffff_ffff_8100_0000),
        },
        Event::ReadResult(vec![0x60]),
        Event::PioWrite {
            port: 0x20,
            data: vec![0x20],
            at: place(0xffff_ffff_8100_0010),
        },
        Event::MmioRead {
            address: 0xd000_0070,
            len: 4,
            at: place(0xffff_ffff_8100_0008),
        },
        Event::ReadResult(vec![1, 0, 0, 0]),
        Event::MmioWrite {
            address: 0xd000_0050,
            data: vec![0, 0, 0, 0],
            at: place(0xffff_ffff_8100_0020),
        },
        Event::Halt {
            at: place(0xffff_ffff_8100_0030),
        },
        Event::InterruptWindow {
            at: place(0xffff_ffff_8100_0030),
        },
        Event::MsrRead {
            index: 0x10,
            at: place(0x40_1000),
        },
        Event::ReadResult(vec![0; 8]),
        Event::Clock(1_000_000),
        Event::Clock(1_000_500),
        Event::Wall(946_684_800_000_000_000),
        Event::Inject(0x30),
        Event::AgentInput(b"job".to_vec()),
        Event::AgentOutput(b"out".to_vec()),
        Event::disk_write(4096, b"sector"),
        Event::StateCheck {
            memory: 0xfedc_ba98_7654_3210,
        },
        Event::NetReceived(vec![0x52; 60]),
        Event::net_sent(b"a frame"),
        Event::Switch(1),
        Event::Preempted {
            at: place(0x40_2000),
            pages: vec![(0x1234, 2), (0x2000, 1)],
            instance: 0x0f1e_2d3c_4b5a_6978,
            ran_ns: None,
            user_code: None,
        },
        Event::Preempted {
            at: place(0x40_2010),
            pages: vec![(0x1234, 1)],
            instance: 0x0f1e_2d3c_4b5a_6979,
            ran_ns: Some(7_654_321),
            user_code: None,
        },
        Event::Preempted {
            at: place(0x40_2020),
            pages: vec![(0x1234, 1), (0x2000, 3)],
            instance: 0x0f1e_2d3c_4b5a_697a,
            ran_ns: None,
            user_code: Some(0x0123_4578),
        },
        Event::Preempted {
            at: place(0x40_2030),
            pages: vec![(0x2000, 1)],
            instance: 0x0f1e_2d3c_4b5a_697b,
            ran_ns: Some(1_234_567),
            user_code: Some(0x0345_6010),
        },
    ]
}

/// `sample_events()` as a format without `newer` kinds wrote them.
fn sample_events_of_an_older_format(newer: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut events = sample_events();
    events.retain(|event| !newer(event));
    events
}

/// A golden event log of an older format, which must still decode.
fn older_event_log(version: u16) -> Vec<u8> {
    let path = golden_dir().join(format!("events.format-{version}.bin"));
    fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_event_encoding_is_its_formats() {
    let events = sample_events();
    let mut encoder = Encoder::default();
    let mut written = Vec::new();
    for event in &events {
        encoder.encode(event, &mut written);
    }
    let golden = golden(
        &format!("events.format-{FORMAT_VERSION}.bin"),
        FORMAT,
        &written,
    );
    assert_eq!(Decoder::default().decode_all(&golden).unwrap(), events);
}

/// The event logs of format 5 still decode, as today's events without
/// state checks, network frames, vCPU switches and preemptions, which that
/// format did not have.
#[test]
fn the_event_logs_of_format_5_still_decode() {
    let events = sample_events_of_an_older_format(|event| {
        matches!(
            event,
            Event::StateCheck { .. }
                | Event::NetReceived(_)
                | Event::NetSent { .. }
                | Event::Switch(_)
                | Event::Preempted { .. }
        )
    });
    assert_eq!(
        Decoder::default().decode_all(&older_event_log(5)).unwrap(),
        events
    );
}

/// The event logs of format 6 still decode, as today's events without
/// network frames, vCPU switches and preemptions.
#[test]
fn the_event_logs_of_format_6_still_decode() {
    let events = sample_events_of_an_older_format(|event| {
        matches!(
            event,
            Event::NetReceived(_)
                | Event::NetSent { .. }
                | Event::Switch(_)
                | Event::Preempted { .. }
        )
    });
    assert_eq!(
        Decoder::default().decode_all(&older_event_log(6)).unwrap(),
        events
    );
}

/// The event logs of formats 7 to 14 still decode, as today's events
/// without the kinds each lacked: vCPU switches (to 8), preemptions (to
/// 11), timed preemptions (to 12) and preemptions in user mode (to 13).
#[test]
fn the_event_logs_of_formats_7_to_14_still_decode() {
    for version in 7..=14 {
        let events = sample_events_of_an_older_format(|event| match event {
            Event::Switch(_) => version <= 8,
            Event::Preempted {
                user_code: Some(_), ..
            } => version <= 13,
            Event::Preempted { ran_ns: None, .. } => version <= 11,
            Event::Preempted {
                ran_ns: Some(_), ..
            } => version <= 12,
            _ => false,
        });
        assert_eq!(
            Decoder::default()
                .decode_all(&older_event_log(version))
                .unwrap(),
            events,
            "format {version}"
        );
    }
}

fn cpuid(function: u32) -> CpuidEntry {
    CpuidEntry {
        function,
        index: 0,
        flags: 0,
        eax: 0xd,
        ebx: 0x6874_7541,
        ecx: 0x444d_4163,
        edx: 0x6974_6e65,
    }
}

fn sample_manifest() -> Manifest {
    Manifest {
        provm_version: "0.1.0".into(),
        provm_commit: Some("0123456789abcdef0123456789abcdef01234567-dirty".into()),
        machine_version: 1,
        started_unix: 1_795_332_180,
        argv: vec!["/bin/sh".into(), "-c".into(), "true".into()],
        env: vec!["PATH=/bin".into()],
        cwd: "/".into(),
        user: None,
        root_device: "/dev/vda".into(),
        image: ImageIdentity {
            path: "image.qcow2".into(),
            chain: vec![ImageFile {
                path: "/images/image.qcow2".into(),
                depth: 0,
                role: "image".into(),
                size: 65536,
                sha256: "a".repeat(64),
            }],
            container: None,
        },
        kernel_sha256: "b".repeat(64),
        kernel_profile_sha256: "c".repeat(64),
        initramfs_sha256: "d".repeat(64),
        snapshot_sha256: "e".repeat(64),
        kernel_cmdline: "console=ttyS0".into(),
        memory_mib: 128,
        cpus: 2,
        chaos_seed: Some(7),
        cpu: CpuModel {
            cpuid: vec![cpuid(0)],
            ignored_by_kernel: vec!["avx".into()],
            baseline: Some("host".into()),
            user_space_cpuid: Some(vec![cpuid(0)]),
        },
        host: HostDescription {
            kernel: "6.1.0".into(),
            cpu: "AMD EPYC".into(),
            hypervisor: "KVM".into(),
        },
        exitless_limit_seconds: Some(60),
        holes: Some(vec!["user-rdtsc".into()]),
        interrupt_delivery: InterruptDelivery::WindowExit,
        fork: Some(ForkOrigin {
            trace: "run.provm".into(),
            events_sha256: Some("f".repeat(64)),
            at: "event:10".into(),
            fault: "disk-error".into(),
        }),
        // Left out when empty, as in the format-6 sample written before
        // they were added.
        inputs: Vec::new(),
        input_disk: Some(DataDigest {
            sha256: "e".repeat(64),
            bytes: 4 << 20,
        }),
        stdin: None,
        stdin_live: false,
        terminal: None,
        outputs: Vec::new(),
    }
}

fn sample_outcome() -> Outcome {
    Outcome {
        complete: true,
        ended: "the command ended: Exited(0)".into(),
        exit_status: Some(0),
        events: 17,
        exits: 8,
        event_chunks: 1,
        guest_ns: 1_000_000,
        disk_writes: 1,
        disk_writes_sha256: "a".repeat(64),
        host_seconds: 1.5,
        longest_exitless_seconds: Some(0.25),
        console_tail: "done\n".into(),
        sections_after: Some(vec!["image".into()]),
        events_sha256: Some("b".repeat(64)),
        fork_event: Some(3),
        disk_error_access: Some(2),
        state_check: Some(FinalStateCheck {
            memory: "0123456789abcdef".into(),
            registers: "fedcba9876543210".into(),
            registers_leave_out_tsc_rate: true,
            register_parts: [
                ("general", "0000000000000003"),
                ("MSR 0x1d9", "0000000000000000"),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .into(),
            devices: [("pic", "0000000000000001"), ("pit", "0000000000000002")]
                .map(|(name, digest)| (name.to_owned(), digest.to_owned()))
                .into(),
        }),
    }
}

/// As `record` writes them.
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(value).unwrap()
}

/// Reads back as itself: a field the form lost, or gained, fails.
fn round_trips<T: serde::Serialize + serde::de::DeserializeOwned>(bytes: &[u8]) {
    let read: T = serde_json::from_slice(bytes).unwrap();
    assert_eq!(json(&read), bytes);
}

#[test]
fn the_manifest_and_outcome_are_their_formats() {
    let manifest = golden(
        &format!("manifest.format-{FORMAT_VERSION}.json"),
        FORMAT,
        &json(&sample_manifest()),
    );
    round_trips::<Manifest>(&manifest);
    let outcome = golden(
        &format!("outcome.format-{FORMAT_VERSION}.json"),
        FORMAT,
        &json(&sample_outcome()),
    );
    round_trips::<Outcome>(&outcome);
}

/// The manifests of the older formats this provm reads still read.
#[test]
fn the_manifests_of_older_formats_still_read() {
    for version in OLDEST_FORMAT..FORMAT_VERSION {
        let path = golden_dir().join(format!("manifest.format-{version}.json"));
        let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let manifest: Manifest = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "the manifest of format {version}, which this provm must read, no longer reads: {}: {e}",
                path.display()
            )
        });
        assert!(machine_version::supported(manifest.machine_version).is_ok());
    }
}

#[test]
fn the_container_is_its_formats() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let mut writer = SectionWriter::create(&path).unwrap();
    let sections = [
        (SectionKind::Manifest, &b"{}"[..]),
        (SectionKind::KernelProfile, b"{\"offsets\": 1}"),
        (SectionKind::Outcome, b"{}"),
    ];
    for (kind, payload) in sections {
        writer.section(kind, payload).unwrap();
    }
    writer.finish().unwrap();
    let golden = golden(
        &format!("container.format-{FORMAT_VERSION}.bin"),
        FORMAT,
        &fs::read(&path).unwrap(),
    );
    let mut reader = TraceReader::new(&golden[..], &path).unwrap();
    for (kind, payload) in sections {
        let section = reader.next_section().unwrap().unwrap();
        assert_eq!((section.kind, &section.payload[..]), (kind, payload));
    }
}

/// A snapshot's header and state exactly; its memory runs compared
/// decompressed, since zstd may compress the same bytes differently from
/// one release to the next.
fn same_snapshot(golden: &[u8], written: &[u8]) -> bool {
    let split = |bytes: &[u8]| {
        let state_len = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
        let (head, memory) = bytes.split_at(14 + state_len);
        let mut runs = Vec::new();
        zstd::Decoder::new(memory)
            .unwrap()
            .read_to_end(&mut runs)
            .unwrap();
        (head.to_vec(), runs)
    };
    split(golden) == split(written)
}

#[test]
fn the_snapshot_codec_is_its_versions() {
    let state = serde_json::json!({"clock_ns": 5, "devices": [1, 2]});
    let runs = vec![(0, vec![1; 4096]), (8192, vec![2; 100])];
    let golden = golden_with(
        &format!("snapshot.v{SNAPSHOT_VERSION}.bin"),
        "provm_trace::snapshot::SNAPSHOT_VERSION",
        &snapshot::encode(&state, &runs),
        same_snapshot,
    );
    let decoded = snapshot::decode::<serde_json::Value>(&golden, 1).unwrap();
    assert_eq!((decoded.state, decoded.runs), (state, runs));
}

/// Each machine version's VM state, as a recording saved it (the sample
/// of version 1 is the state in tests/data/corpus/writes-file.provm): it
/// reads, refusing no field, and saves again to the same bytes.
#[test]
fn the_vm_state_is_its_machine_versions() {
    for version in MACHINE_VERSIONS {
        let name = format!("vm-state.machine-{}.json", version.number);
        let path = golden_dir().join(&name);
        let golden = fs::read(&path).unwrap_or_else(|_| {
            panic!(
                "no golden sample {}: save the VM state of a trace recorded on machine version {} there",
                path.display(),
                version.number
            )
        });
        let changed = "the VM state's saved form changed, but provm_vmm::machine_version::CURRENT did not: bump it (and keep restoring the old form, which traces hold), then save a state of the new version as its golden sample";
        let state: VmState = serde_json::from_slice(&golden)
            .unwrap_or_else(|e| panic!("{changed}: {name} no longer reads: {e}"));
        assert!(
            serde_json::to_vec(&state).unwrap() == golden,
            "{changed}: {name} saves differently"
        );
    }
}
