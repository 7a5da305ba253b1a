//! The unlogged inputs a recording host left open, named for each run: a
//! replay cannot check what was never logged, so its verdict says which
//! of these the recording could have taken (README, "Known holes").

use provm_cpu_model::vector_state;
use provm_cpu_model::Platform;

/// One input the guest could take without the VMM seeing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hole {
    /// PVM does not honour CR4.TSD: user-mode RDTSC reads the host's TSC.
    UserRdtsc,
    /// PVM runs user-mode CPUID natively: the host's own answers.
    UserCpuid,
    /// RDRAND/RDSEED, which user space sees in CPUID on PVM.
    RdrandVisible,
    /// RDRAND/RDSEED, hidden from CPUID but not trapped: only a program
    /// that runs them without asking CPUID takes unlogged randomness.
    RdrandHidden,
    /// AVX state a signal handler changes reaches the interrupted code:
    /// the guest kernel cannot save it (PVM, no XSAVE in ring 0).
    AvxSignalFrames,
}

const ALL: [Hole; 5] = [
    Hole::UserRdtsc,
    Hole::UserCpuid,
    Hole::RdrandVisible,
    Hole::RdrandHidden,
    Hole::AvxSignalFrames,
];

impl Hole {
    /// Its name in a trace's manifest.
    pub fn id(self) -> &'static str {
        match self {
            Hole::UserRdtsc => "user-rdtsc",
            Hole::UserCpuid => "user-cpuid",
            Hole::RdrandVisible => "rdrand",
            Hole::RdrandHidden => "rdrand-despite-cpuid",
            Hole::AvxSignalFrames => "avx-signal-frames",
        }
    }

    /// The hole a manifest's id names, if this provm knows it.
    pub fn from_id(id: &str) -> Option<Hole> {
        ALL.into_iter().find(|hole| hole.id() == id)
    }

    fn description(self) -> &'static str {
        match self {
            Hole::UserRdtsc => "user-mode RDTSC read the host's clock (PVM ignores CR4.TSD)",
            Hole::UserCpuid => "user-mode CPUID answered with the recording host's own CPU",
            Hole::RdrandVisible => "RDRAND/RDSEED in user space, which sees them in CPUID here",
            Hole::RdrandHidden => {
                "RDRAND/RDSEED run by a program that ignores CPUID (hidden there, not trapped)"
            }
            Hole::AvxSignalFrames => {
                "AVX registers a signal handler changes reach the code it interrupted (no XSAVE in the guest kernel)"
            }
        }
    }
}

/// The holes a recording on this host leaves open: `platform`, the kernel
/// arguments this host's KVM makes necessary (`CpuProbe::kernel_args`,
/// which carry the vector-state mitigation where it is needed) and whether
/// this CPU has RDRAND or RDSEED.
pub fn open_here(platform: Platform, kernel_args: &str, host_rdrand: bool) -> Vec<Hole> {
    let pvm = platform == Platform::Pvm;
    let vector_hazard = vector_state::kept_outside_the_kernel(kernel_args);
    [
        (Hole::UserRdtsc, pvm),
        (Hole::UserCpuid, pvm),
        (Hole::RdrandVisible, pvm && host_rdrand),
        (Hole::RdrandHidden, !pvm && host_rdrand),
        (Hole::AvxSignalFrames, vector_hazard),
    ]
    .into_iter()
    .filter_map(|(hole, open)| open.then_some(hole))
    .collect()
}

/// Zeroes every page and slab object the guest kernel frees.
pub const ZERO_FREED_MEMORY: &str = "init_on_free=1";

/// The kernel arguments that keep this host's holes from reaching the
/// state checks where they can: on PVM, where user-mode RDTSC reads the
/// host's clock unlogged, [`ZERO_FREED_MEMORY`]. Every dynamically linked
/// program reads it there: glibc's ld.so times its own start (rtld's
/// `start_time`, `load_time` and `relocate_time`, kept for
/// LD_DEBUG=statistics) into its data pages. Those die with the process,
/// but freed memory keeps its bytes until reused, so the final state check
/// of a Debian image's run found two such pages that differed (the
/// demo's "memory differs"). Zeroed when freed, a finished process leaves
/// nothing of what it read unlogged; a live one's pages still differ at a
/// periodic check, and the replay names them.
pub fn kernel_args(platform: Platform) -> &'static str {
    match platform {
        Platform::Pvm => ZERO_FREED_MEMORY,
        Platform::Hardware => "",
    }
}

/// Whether this CPU has RDRAND or RDSEED (the guest runs on it).
pub fn host_has_rdrand() -> bool {
    std::arch::is_x86_feature_detected!("rdrand") || std::arch::is_x86_feature_detected!("rdseed")
}

/// What a trace's recorded hole ids mean, one line each; an id this
/// provm does not know (a later one's) is shown as it is.
pub fn describe(ids: &[String]) -> Vec<String> {
    ids.iter()
        .map(|id| match ALL.iter().find(|hole| hole.id() == id) {
            Some(hole) => format!("{id}: {}", hole.description()),
            None => id.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvm_leaves_more_open_than_vmx_and_svm() {
        let ids = |holes: Vec<Hole>| holes.into_iter().map(Hole::id).collect::<Vec<_>>();
        let pvm = open_here(Platform::Pvm, "console=ttyS0 provm.user_preempt=0", true);
        assert_eq!(
            ids(pvm),
            ["user-rdtsc", "user-cpuid", "rdrand", "avx-signal-frames"]
        );
        let svm = open_here(Platform::Hardware, "console=ttyS0", true);
        assert_eq!(ids(svm), ["rdrand-despite-cpuid"]);
        assert!(open_here(Platform::Hardware, "", false).is_empty());
    }

    #[test]
    fn pvm_guests_zero_the_memory_they_free() {
        assert_eq!(kernel_args(Platform::Pvm), ZERO_FREED_MEMORY);
        assert_eq!(kernel_args(Platform::Hardware), "");
    }

    #[test]
    fn every_id_reads_back_and_unknown_ones_are_kept() {
        let ids: Vec<String> = ALL.iter().map(|hole| hole.id().to_owned()).collect();
        for (line, hole) in describe(&ids).iter().zip(ALL) {
            assert!(line.starts_with(hole.id()) && line.len() > hole.id().len() + 2);
        }
        assert_eq!(describe(&["from-the-future".into()]), ["from-the-future"]);
        assert_eq!(Hole::from_id("user-rdtsc"), Some(Hole::UserRdtsc));
        assert_eq!(Hole::from_id("from-the-future"), None);
    }
}
