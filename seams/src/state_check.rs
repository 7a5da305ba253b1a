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
    FinalStateCheck {
        memory: hex(digest.memory.whole),
        registers: hex(digest.registers),
        registers_leave_out_tsc_rate: true,
        register_parts: digest
            .register_parts
            .iter()
            .map(|(name, value)| (name.clone(), hex(*value)))
            .collect(),
        devices: digest
            .devices
            .iter()
            .map(|(name, digest)| ((*name).to_owned(), hex(*digest)))
            .collect(),
    }
}

/// A replay's final check, in the form of the `recorded` one. A trace
/// recorded before 2026-12-02 digested what KVM keeps of past events
/// (`StateDigest::registers_with_stale_events`): the replay's registers
/// match it in either form, as they are equal but for those. A trace
/// older than format 11 digested KVM's TSC frequency with the registers,
/// the rate at which its recording host calibrated the TSC: where this
/// host's rate differs (another machine, or another boot of one: seen on
/// the SVM test bed under load), the replay finds the recording host's
/// rate from the recorded digest and compares the rest.
pub fn replayed(digest: &StateDigest, recorded: Option<&FinalStateCheck>) -> FinalStateCheck {
    let mut check = self::recorded(digest);
    let Some(recorded) = recorded else {
        return check;
    };
    if recorded.registers == hex(digest.registers_with_stale_events) {
        check.registers.clone_from(&recorded.registers);
    }
    if recorded.registers_leave_out_tsc_rate {
        return check;
    }
    check.registers_leave_out_tsc_rate = false;
    let older = &digest.registers_at_tsc_rate;
    let Some(own) = older.own() else {
        // This KVM lists no TSC frequency: both forms are one.
        return check;
    };
    let found = u64::from_str_radix(&recorded.registers, 16)
        .ok()
        .filter(|&registers| {
            registers == digest.registers
                || older
                    .find(registers)
                    .inspect(|hz| {
                        tracing::debug!("the recording host's KVM ran the TSC at {hz} Hz")
                    })
                    .is_some()
        });
    check.registers = hex(found.unwrap_or(own));
    check
}

fn hex(digest: u64) -> String {
    format!("{digest:016x}")
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

#[cfg(test)]
mod tests {
    use provm_vmm::state_digest::MemoryDigest;

    use super::*;

    fn state(registers: u64, registers_with_stale_events: u64) -> StateDigest {
        StateDigest {
            memory: MemoryDigest {
                whole: 1,
                pieces: Vec::new(),
            },
            registers,
            register_parts: Vec::new(),
            registers_with_stale_events,
            registers_at_tsc_rate: Default::default(),
            devices: Vec::new(),
        }
    }

    #[test]
    fn registers_match_in_the_form_of_the_trace_recorded_before_stale_events_were_left_out() {
        let replay = state(2, 7);
        for recorded in [state(2, 9), state(7, 7)].map(|state| self::recorded(&state)) {
            assert_eq!(
                replayed(&replay, Some(&recorded)).registers,
                recorded.registers
            );
        }
        let other = self::recorded(&state(8, 8));
        assert_ne!(replayed(&replay, Some(&other)).registers, other.registers);
    }
}
