//! Exit timing: the VMM times every exit (`provm_vmm::exit_timing`),
//! `capture` attributes each to the guest process running at it, and
//! `report` aggregates them into what a trace's timing section holds and
//! hypervisor blame reads. An observer of its own (`TimingObserver`), so
//! that every driver of a recording keeps it: `provm record`'s and the
//! container runtime's alike.

pub mod capture;
pub mod report;

use provm_trace::format::SectionKind;
use provm_vmm::exit_timing::{ExitDelay, ExitObserver, ExitTiming};
use provm_vmm::memory::GuestMemory;
use provm_vmm::vm::Vm;

use crate::observer::{GuestKernel, Observer, ObserverError};

pub use capture::Capture;
pub use report::TimingReport;

/// Times the exits of the VM it is attached to; a recording keeps the
/// report as its timing section. Waits longer after a device's exits if
/// given a delay, capturing or not.
pub struct TimingObserver {
    mode: String,
    capture: bool,
    delay: Option<ExitDelay>,
    captured: Option<Capture>,
}

impl TimingObserver {
    /// For a run of kind `mode` (said in the report), capturing if
    /// `capture`.
    pub fn new(mode: &str, capture: bool, delay: Option<ExitDelay>) -> Self {
        TimingObserver {
            mode: mode.to_owned(),
            capture,
            delay,
            captured: None,
        }
    }

    /// What was captured, if capturing.
    pub fn report(&self) -> Option<TimingReport> {
        self.captured.as_ref().map(Capture::report)
    }
}

impl Observer for TimingObserver {
    fn attach(&mut self, vm: &mut Vm, kernel: &GuestKernel<'_>) -> Result<(), ObserverError> {
        if !self.capture {
            if let Some(delay) = &self.delay {
                vm.time_exits(Box::new(Ignore), Some(delay.clone()));
            }
            return Ok(());
        }
        self.captured = Some(Capture::attach(
            vm,
            kernel.info()?,
            &self.mode,
            self.delay.clone(),
        ));
        Ok(())
    }

    fn section(&mut self) -> Result<Option<(SectionKind, Vec<u8>)>, ObserverError> {
        Ok(self
            .report()
            .map(|report| (SectionKind::Timing, report.to_json())))
    }
}

/// An observer that keeps nothing: for a delay without timing.
struct Ignore;

impl ExitObserver for Ignore {
    fn exit(&mut self, _: &ExitTiming, _: &GuestMemory) {}
}
