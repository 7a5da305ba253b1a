//! The machine version: everything the guest can observe of this VMM, under
//! one number that every trace names, as QEMU names its machine types
//! (`pc-q35-8.2`). A newer provm keeps the behaviour of every machine
//! version in `MACHINE_VERSIONS`, so the traces of each still replay.
//!
//! Bump `CURRENT` (and describe the new version below) with any change the
//! guest could tell apart: the device set or a device's register
//! behaviour, a saved state's schema (`devices::persist::Persist::State`,
//! `VcpuState`, `VmState`), the memory layout, the kernel arguments the VMM
//! appends, or the rules that make the guest's CPU model. The old version's
//! behaviour then stays, chosen by the number a trace carries; when keeping
//! it costs too much, it moves to `RETIRED` with the last release that
//! replays it.

/// The machine new recordings run on, of any vCPUs, with or without an
/// input disk.
pub const CURRENT: u32 = 6;

/// One machine version this provm records or replays.
#[derive(Debug, PartialEq, Eq)]
pub struct MachineVersion {
    pub number: u32,
    /// What the guest sees, in one line.
    pub description: &'static str,
}

/// Every machine version this provm replays, oldest first; the last is
/// `CURRENT`.
pub const MACHINE_VERSIONS: &[MachineVersion] = &[
    MachineVersion {
        number: 1,
        description: "1 vCPU, PVH boot; 8259 PIC, 8254 PIT, CMOS RTC, one 16550 UART, \
            i8042, provm's doorbell, virtio-mmio block and console at 0xd0000000; \
            VM state of provm 0.1.0 from 242a0b3 on; CPUID as the trace records it",
    },
    MachineVersion {
        number: 2,
        description: "version 1, and with --net a virtio-net card (virtio-mmio at \
            0xd0003000, IRQ 3; MAC 52:54:00:12:34:56, MTU 65520, receive checksums \
            offloaded) whose state is the VM state's `net`; without --net the same \
            machine as version 1",
    },
    MachineVersion {
        number: 3,
        description: "version 2, and on PVM hosts the guest kernel zeroes the memory it \
            frees (init_on_free=1 on its command line, engine's `holes::kernel_args`); \
            the same VM state",
    },
    MachineVersion {
        number: 4,
        description: "version 3 with N > 1 vCPUs (--cpus): an xAPIC per vCPU at \
            0xfee00000 emulated by the VMM, an MP table at 0xf0000, the SMP ports \
            0x448-0x44f (relax, 64-bit AP start), the SMP kernel (kernels/smp) with \
            noapic nolapic_timer; one vCPU runs at a time, switched at exits \
            (`switch` events); the VM state's `cpus`",
    },
    MachineVersion {
        number: 5,
        description: "version 3 (one vCPU) or 4 (more), and an input disk: a read-only \
            virtio-blk (virtio-mmio at 0xd0004000, IRQ 7) of 1 TiB, zeros at boot, its \
            medium the inputs' file system from the restore on; its state is the VM \
            state's `input_disk`; recordings without inputs by disk stay on 3 or 4",
    },
    MachineVersion {
        number: 6,
        description: "versions 3 to 5 made one, for every new recording, of any vCPUs, \
            with or without the input disk; a task's vector state saved into guest RAM \
            (PVM's provm.vector_state=vmm) in one form whatever the host CPU tracked: the \
            FXSAVE area's software bytes zeroed, XSTATE_BV naming x87, SSE and each later \
            component whose bytes are not zeros (the VM state's `canonical_vector_areas`)",
    },
];

/// A machine version that provm no longer replays, and the last release
/// that does.
#[derive(Debug, PartialEq, Eq)]
pub struct Retired {
    pub number: u32,
    pub last_release: &'static str,
}

/// None yet: every machine version provm ever had still replays.
pub const RETIRED: &[Retired] = &[];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MachineVersionError {
    #[error("the trace's guest ran on machine version {number}, which this provm no longer emulates: replay it with provm {release}")]
    Retired { number: u32, release: &'static str },
    #[error("the trace's guest ran on machine version {number}; this provm emulates machine versions {oldest} to {newest}: use a newer provm")]
    Newer {
        number: u32,
        oldest: u32,
        newest: u32,
    },
    #[error(
        "the trace names machine version {number}, which no provm ever had: the trace is corrupt"
    )]
    Unknown { number: u32 },
}

/// The machine version `number`, if this provm replays it; else why not,
/// naming the provm that does.
pub fn supported(number: u32) -> Result<&'static MachineVersion, MachineVersionError> {
    look_up(number, MACHINE_VERSIONS, RETIRED)
}

fn look_up<'a>(
    number: u32,
    versions: &'a [MachineVersion],
    retired: &[Retired],
) -> Result<&'a MachineVersion, MachineVersionError> {
    if let Some(version) = versions.iter().find(|version| version.number == number) {
        return Ok(version);
    }
    if let Some(retired) = retired.iter().find(|retired| retired.number == number) {
        return Err(MachineVersionError::Retired {
            number,
            release: retired.last_release,
        });
    }
    let (oldest, newest) = (versions[0].number, versions[versions.len() - 1].number);
    if number > newest {
        return Err(MachineVersionError::Newer {
            number,
            oldest,
            newest,
        });
    }
    Err(MachineVersionError::Unknown { number })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_new_recordings_use_is_the_newest() {
        assert_eq!(MACHINE_VERSIONS.last().unwrap().number, CURRENT);
        assert_eq!(supported(CURRENT).unwrap().number, CURRENT);
        for pair in MACHINE_VERSIONS.windows(2) {
            assert!(pair[0].number < pair[1].number);
        }
        for retired in RETIRED {
            assert!(retired.number < MACHINE_VERSIONS[0].number);
        }
    }

    #[test]
    fn a_newer_version_asks_for_a_newer_provm() {
        let refused = supported(CURRENT + 1).unwrap_err();
        assert!(
            refused.to_string().contains("use a newer provm"),
            "{refused}"
        );
    }

    /// With a retired version (none is yet): refused, naming the release
    /// that replays it.
    #[test]
    fn a_retired_version_names_the_release_that_replays_it() {
        let versions = [MachineVersion {
            number: 3,
            description: "today's",
        }];
        let retired = [
            Retired {
                number: 1,
                last_release: "0.1.0 (commit 0123abc)",
            },
            Retired {
                number: 2,
                last_release: "0.2.0",
            },
        ];
        let refused = look_up(1, &versions, &retired).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the trace's guest ran on machine version 1, which this provm no longer emulates: replay it with provm 0.1.0 (commit 0123abc)"
        );
        assert_eq!(look_up(3, &versions, &retired), Ok(&versions[0]));
        assert!(matches!(
            look_up(4, &versions, &retired),
            Err(MachineVersionError::Newer { newest: 3, .. })
        ));
        assert_eq!(
            look_up(0, &versions, &retired),
            Err(MachineVersionError::Unknown { number: 0 })
        );
    }
}
