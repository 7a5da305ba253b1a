//! State checks as the trace stores them (see `provm_vmm::state_digest`):
//! when a recorder checks guest memory, and the final check's form.

use provm_trace::manifest::FinalStateCheck;
use provm_vmm::state_digest::StateDigest;

/// A recorder checks guest memory once this many events have been logged
/// since its last check. A check digests all guest RAM (xxh3, bound by
/// memory bandwidth; `benches/state_check.rs` measures it and what checks
/// cost a recording and a replay); at this interval even a guest logging
/// 100,000 events a second is checked only every two seconds. A count of
/// events, not a timer: the replay finds each check at the same event.
pub const MEMORY_CHECK_EVENTS: u64 = 200_000;

/// Set to `off`, recordings take no state checks; set to a number, they
/// check memory every that many events. For measuring what checks cost
/// (`benches/state_check.rs`) and for tests, not a user's option.
const SWITCH: &str = "PROVM_STATE_CHECKS";

/// How many events a recording logs between two memory checks; `None`: it
/// takes no state checks.
pub(crate) fn interval() -> Option<u64> {
    match std::env::var(SWITCH) {
        Ok(value) if value == "off" => None,
        Ok(value) => Some(value.parse().unwrap_or(MEMORY_CHECK_EVENTS).max(1)),
        Err(_) => Some(MEMORY_CHECK_EVENTS),
    }
}

/// The final check as the trace's outcome holds it.
pub fn recorded(digest: &StateDigest) -> FinalStateCheck {
    let hex = |digest: u64| format!("{digest:016x}");
    FinalStateCheck {
        memory: hex(digest.memory.whole),
        registers: hex(digest.registers),
        devices: digest
            .devices
            .iter()
            .map(|(name, digest)| ((*name).to_owned(), hex(*digest)))
            .collect(),
    }
}

/// What a trace's state checks are, in words: `periodic` memory checks in
/// its log, and its final check if it has one.
pub fn described(periodic: u64, final_check: Option<&FinalStateCheck>) -> String {
    let total = periodic + u64::from(final_check.is_some());
    if total == 0 {
        return "not checked (no state checks: a trace of an older provm, or cut short early)"
            .into();
    }
    let during = (periodic > 0).then(|| format!("memory at {periodic} points of the run"));
    let at_end = final_check.map(|check| {
        format!(
            "memory, registers and {} devices at the guest's power-off",
            check.devices.len()
        )
    });
    let checked: Vec<String> = during.into_iter().chain(at_end).collect();
    format!("{}: {}", counted(total), checked.join(", and "))
}

/// "1 state check", "2 state checks".
pub fn counted(checks: u64) -> String {
    match checks {
        1 => "1 state check".into(),
        n => format!("{n} state checks"),
    }
}
