//! gdb's `monitor` commands on a replay: where it stands, the running
//! process and its user registers, going to a log event, and what time
//! travel costs.

use provm_analysis::guest::{SavedRegs, PT_REGS};

use super::debuggee::{Debuggee, Halt};

const HELP: &str = "\
monitor where       the log event, VM exits so far, guest time, the running process and its user registers
monitor user-regs   the running process's user registers, as its kernel entry saved them
monitor event N     run (forward, or back through a snapshot) to log event N
monitor snapshots   the time-travel snapshots and what they cost";

/// Runs `command`; returns what to show (an error too, as text: gdb shows
/// monitor output as it is). A command that runs the replay calls
/// `progress` with the log event reached, now and then.
pub fn run(debuggee: &mut Debuggee, command: &str, progress: &mut dyn FnMut(u64)) -> String {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["where"] => where_text(debuggee),
        ["user-regs"] => user_regs_text(debuggee),
        ["event", number] => match number.parse::<u64>() {
            Ok(event) => match debuggee.go_to_event(event, progress) {
                Ok(Halt::Ended) => format!(
                    "the replay ended before event {event}\n{}",
                    where_text(debuggee)
                ),
                Ok(_) => where_text(debuggee),
                Err(error) => format!("error: {error}"),
            },
            Err(_) => format!("error: `{number}` is not an event number (monitor event N)"),
        },
        ["snapshots"] => snapshots_text(debuggee),
        _ => format!("error: unknown monitor command `{command}`\n{HELP}"),
    }
}

fn where_text(debuggee: &Debuggee) -> String {
    let whereabouts = match debuggee.whereabouts() {
        Ok(whereabouts) => whereabouts,
        Err(error) => return format!("error: {error}"),
    };
    let at = whereabouts.position;
    let guest_seconds = at.guest_ns.saturating_sub(whereabouts.start_ns) as f64 / 1e9;
    let mut text = format!(
        "event {} of {}, {} VM exits, guest time {guest_seconds:.6} s\n",
        at.events, debuggee.log_events, at.exits
    );
    let on = match debuggee.vcpus() {
        (_, 1) => String::new(),
        (vcpu, _) => format!(", on vCPU {vcpu} (gdb thread {})", vcpu + 1),
    };
    text += &match whereabouts.task {
        Ok(task) => format!(
            "running: pid {} tid {} ({}), parent {}{on}\n",
            task.pid, task.tid, task.comm, task.ppid
        ),
        Err(error) => format!("running: unknown ({error}){on}\n"),
    };
    text += &match whereabouts.user_regs {
        Ok(regs) if regs.from_user_mode() => format!(
            "user mode (saved at kernel entry): rip {:#x} rsp {:#x} rax {:#x} orig_rax {}\n",
            named(&regs, "rip"),
            named(&regs, "rsp"),
            named(&regs, "rax"),
            named(&regs, "orig_rax") as i64
        ),
        Ok(_) => "user mode: none (a kernel thread)\n".to_owned(),
        Err(error) => format!("user mode: unreadable ({error})\n"),
    };
    text
}

fn named(regs: &SavedRegs, name: &str) -> u64 {
    let index = PT_REGS
        .iter()
        .position(|&n| n == name)
        .expect("a pt_regs field");
    regs.values[index]
}

fn user_regs_text(debuggee: &Debuggee) -> String {
    let regs = match debuggee.whereabouts().map(|w| w.user_regs) {
        Ok(Ok(regs)) => regs,
        Ok(Err(error)) => return format!("error: the saved registers are unreadable: {error}"),
        Err(error) => return format!("error: {error}"),
    };
    if !regs.from_user_mode() {
        return "the running task is a kernel thread: it has no user registers".to_owned();
    }
    PT_REGS
        .iter()
        .zip(regs.values)
        .map(|(name, value)| format!("{name:<9}{value:#018x}\n"))
        .collect()
}

fn snapshots_text(debuggee: &Debuggee) -> String {
    let (every, kept) = debuggee.snapshot_interval();
    let taken = &debuggee.cost.taken;
    let (bytes, seconds) = debuggee.cost.totals();
    let mut text = format!(
        "{kept} snapshots kept, one every {every} events; {} taken this session, {bytes} bytes, {seconds:.3} s\n",
        taken.len()
    );
    for (bytes, seconds) in taken {
        text += &format!("snapshot {bytes} bytes {seconds:.6} s\n");
    }
    text
}
