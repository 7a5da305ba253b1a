//! A divergence explained for a person (and, as JSON, for tools): where
//! the replay was (event, vCPU, the process running and its user-space
//! backtrace, the events before it) and, where a state check found memory differing, which pages, who
//! owns them, what they hold, and which of the trace's holes fits.
//!
//! Read from the stopped replay's guest, which nothing changes any more:
//! at the final check the guest has powered off; at a periodic check it
//! has run on to its next exit, so a page's bytes may be a little later
//! than the check's.

use provm_analysis::address_space::{AddressSpace, SpaceOffsets};
use provm_analysis::backtrace::{user_backtrace, Frame};
use provm_analysis::guest::{Guest, Task};
use provm_analysis::page_owner::{KernelSymbols, PageOwner, PageOwners};
use provm_analysis::KernelInfo;
use provm_seams::Divergence;
use provm_trace::page_digests::{PageDifference, PIECE_SIZE};
use provm_vmm::vm::GuestView;
use serde::Serialize;

use crate::holes::Hole;

/// How many events before the divergence a person is shown.
const RECENT: usize = 5;
/// How many differing pages are explained one by one.
const MAX_PAGES: usize = 16;
/// How many bytes of a differing piece are shown.
const SHOWN_BYTES: usize = 32;

/// A divergence, explained.
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub event: u64,
    /// The VM exits before it.
    pub exit: u64,
    /// The vCPU that was running (0 until the log's first switch); the
    /// process and backtrace are its.
    pub vcpu: u32,
    /// The process the guest kernel was running (its current task).
    pub process: Option<Task>,
    /// Its user-space backtrace, innermost first, as far as frame
    /// pointers lead (empty for a kernel thread, or none running).
    pub backtrace: Vec<Frame>,
    pub recent: Vec<RecentEvent>,
    pub memory: MemoryExplanation,
    /// The holes the trace names (`holes`).
    pub holes: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct RecentEvent {
    pub index: u64,
    pub event: String,
}

/// Where memory differed, as far as the trace lets the replay say.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
pub enum MemoryExplanation {
    /// Memory was not what differed (or was never compared).
    NotCompared,
    /// It differed, but the trace kept no page digests (format 7 and
    /// older, or a fork's).
    NoPageDigests,
    /// These pages differ (the first `MAX_PAGES` of `count`).
    Pages {
        count: usize,
        pages: Vec<PageExplanation>,
    },
}

/// One page whose digests differ.
#[derive(Debug, Serialize)]
pub struct PageExplanation {
    /// Guest-physical.
    pub address: u64,
    /// The first 256-byte piece that differs, from the page's start.
    pub first_difference: usize,
    /// The replay's bytes there (the recording's are not kept).
    pub replayed_bytes: String,
    /// `None` where the trace's kernel profile predates page owners.
    pub owner: Option<PageOwner>,
    /// The hole that fits what the page holds, if one does.
    pub hole: Option<String>,
}

/// What the replay knew when it diverged, to explain it.
pub struct Context<'a> {
    pub view: &'a GuestView<'a>,
    pub kernel: &'a KernelInfo,
    pub profile_json: &'a [u8],
    pub vmlinux: &'a [u8],
    /// The trace's holes.
    pub holes: &'a [Hole],
    /// This host's TSC when the replay started, and now: a value between
    /// the two in a differing page was read during the replay.
    pub tsc_during_replay: std::ops::Range<u64>,
}

/// Explains `divergence` from the guest where the replay stopped.
pub fn explain(divergence: &Divergence, context: &Context) -> Explanation {
    let guest = Guest::new(context.view, context.kernel);
    let running = guest
        .current_task()
        .and_then(|address| Ok((address, guest.task(address)?)))
        .ok()
        .filter(|(_, task)| task.pid != 0);
    let backtrace = running
        .as_ref()
        .map(|(address, _)| backtrace(&guest, context.profile_json, *address))
        .unwrap_or_default();
    let recent = divergence.recent[divergence.recent.len().saturating_sub(RECENT)..]
        .iter()
        .map(|(index, event)| RecentEvent {
            index: *index,
            event: event.to_string(),
        })
        .collect();
    let memory = match &divergence.pages {
        None if divergence.actual.contains("memory differs") => MemoryExplanation::NoPageDigests,
        None => MemoryExplanation::NotCompared,
        Some(pages) => MemoryExplanation::Pages {
            count: pages.len(),
            pages: explain_pages(pages, context),
        },
    };
    Explanation {
        event: divergence.event,
        exit: divergence.exit,
        vcpu: u32::from(divergence.vcpu.unwrap_or(0)),
        process: running.map(|(_, task)| task),
        backtrace,
        recent,
        memory,
        holes: context.holes.iter().map(|hole| hole.id()).collect(),
    }
}

/// The user-space backtrace of the running `task`.
fn backtrace(guest: &Guest, profile_json: &[u8], task: u64) -> Vec<Frame> {
    let Ok(offsets) = serde_json::from_slice::<SpaceOffsets>(profile_json) else {
        return Vec::new();
    };
    match AddressSpace::of_task(guest, &offsets, task) {
        Ok(Some(space)) => user_backtrace(guest, &space),
        _ => Vec::new(),
    }
}

fn explain_pages(pages: &[PageDifference], context: &Context) -> Vec<PageExplanation> {
    let symbols = KernelSymbols::from_vmlinux(context.vmlinux).ok();
    let owners = symbols.as_ref().and_then(|symbols| {
        let guest = Guest::new(context.view, context.kernel);
        PageOwners::new(guest, context.profile_json, symbols)
            .ok()
            .flatten()
    });
    pages
        .iter()
        .take(MAX_PAGES)
        .map(|page| {
            let piece = page.address + page.first_piece as u64;
            let bytes = owners
                .as_ref()
                .and_then(|owners| owners.physical(piece, PIECE_SIZE).ok())
                .unwrap_or_default();
            PageExplanation {
                address: page.address,
                first_difference: page.first_piece,
                replayed_bytes: hex(&bytes[..bytes.len().min(SHOWN_BYTES)]),
                owner: owners.as_ref().map(|owners| owners.owner(page.address)),
                hole: fitting_hole(&bytes, context.holes, &context.tsc_during_replay),
            }
        })
        .collect()
}

/// The hole that explains a differing piece holding `bytes`: user-mode
/// RDTSC where it holds a reading of this host's TSC taken during the
/// replay (as a 64-bit value or in decimal digits, as a program prints
/// it). Other holes leave no mark a page shows.
fn fitting_hole(bytes: &[u8], holes: &[Hole], during: &std::ops::Range<u64>) -> Option<String> {
    if !holes.contains(&Hole::UserRdtsc) {
        return None;
    }
    let binary = (0..bytes.len().saturating_sub(7))
        .find(|&at| during.contains(&u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())));
    let decimal = bytes
        .split(|b| !b.is_ascii_digit())
        .scan(0, |at, digits| {
            let start = *at;
            *at += digits.len() + 1;
            Some((start, digits))
        })
        .find(|(_, digits)| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|text| text.parse::<u64>().ok())
                .is_some_and(|value| during.contains(&value))
        })
        .map(|(at, _)| at);
    let (at, how) = match (binary, decimal) {
        (Some(at), _) => (at, "as a 64-bit value"),
        (None, Some(at)) => (at, "in decimal"),
        (None, None) => return None,
    };
    Some(format!(
        "{}: the page holds this host's time-stamp counter as the replay read it ({how}, at +{at:#x} into the piece): a user-mode RDTSC the recording could not log",
        Hole::UserRdtsc.id()
    ))
}

/// This host's time-stamp counter now.
pub fn host_tsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64.
    unsafe { std::arch::x86_64::_rdtsc() }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Explanation {
    /// The explanation in words, after the verdict.
    pub fn text(&self) -> String {
        let holes = &self.holes;
        let mut out = format!(
            "explanation: event {} (after {} VM exits), vCPU {}",
            self.event, self.exit, self.vcpu
        );
        match &self.process {
            Some(task) => {
                out += &format!(
                    ", process {} ({}, parent {})",
                    task.pid, task.comm, task.ppid
                )
            }
            None => out += ", in the kernel (no process)",
        }
        if !self.backtrace.is_empty() {
            out += "\n  its user-space backtrace (by frame pointers):";
            for (depth, frame) in self.backtrace.iter().enumerate() {
                out += &format!("\n    #{depth} {:#x} in {}", frame.address, frame.region);
            }
        }
        out += "\n  the last events before it:";
        for recent in &self.recent {
            out += &format!("\n    {:>10}  {}", recent.index, recent.event);
        }
        match &self.memory {
            MemoryExplanation::NotCompared => {}
            MemoryExplanation::NoPageDigests => out += "\n  memory differs, but the trace keeps no page digests (recorded by an older provm, or a fork): the pages cannot be named",
            MemoryExplanation::Pages { count, pages } => {
                out += &format!("\n  memory differs in {count} page{}:", if *count == 1 { "" } else { "s" });
                for page in pages {
                    out += &format!(
                        "\n    page {:#x}, first difference in bytes +{:#x}..+{:#x}",
                        page.address,
                        page.first_difference,
                        page.first_difference + PIECE_SIZE
                    );
                    match &page.owner {
                        Some(owner) => out += &format!("\n      owner: {owner}"),
                        None => out += "\n      owner: unknown (the trace's kernel profile predates page owners)",
                    }
                    out += &format!("\n      replayed bytes there: {}", page.replayed_bytes);
                    match &page.hole {
                        Some(hole) => out += &format!("\n      hole: {hole}"),
                        None if holes.is_empty() => out += "\n      hole: none: the trace names no hole, so an input provm missed (or a provm bug) changed it",
                        None => out += &format!(
                            "\n      hole: none fits what the page holds; the trace's open holes: {}",
                            holes.join(", ")
                        ),
                    }
                }
                if *count > pages.len() {
                    out += &format!("\n    and {} more", count - pages.len());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DURING: std::ops::Range<u64> = 1_000_000..2_000_000;

    #[test]
    fn a_tsc_reading_in_a_page_fits_the_user_rdtsc_hole() {
        let rdtsc = [Hole::UserRdtsc];
        let mut binary = vec![0xaa; 40];
        binary[8..16].copy_from_slice(&1_500_000u64.to_le_bytes());
        let fits = fitting_hole(&binary, &rdtsc, &DURING).unwrap();
        assert!(
            fits.starts_with("user-rdtsc: ") && fits.contains("64-bit value, at +0x8"),
            "{fits}"
        );
        let decimal = fitting_hole(b"t=1234567\n", &rdtsc, &DURING).unwrap();
        assert!(decimal.contains("in decimal, at +0x2"), "{decimal}");
    }

    #[test]
    fn no_hole_fits_other_bytes_or_a_trace_without_it() {
        assert_eq!(
            fitting_hole(b"t=7654321\n", &[Hole::UserRdtsc], &DURING),
            None
        );
        assert_eq!(
            fitting_hole(b"t=1234567\n", &[Hole::UserCpuid], &DURING),
            None
        );
    }
}
