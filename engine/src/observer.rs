//! What watches a run, a recording or a replay from above the engine:
//! blame's exit timing and the provenance capture are features, and the
//! engine calls them at fixed points instead of importing them. What an
//! observer returns from `section` is kept in a recording's trace.

use std::cell::OnceCell;

use provm_analysis::KernelInfo;
use provm_guest_agent::Job;
use provm_trace::format::SectionKind;
use provm_vmm::vm::Vm;

use crate::digest::Digested;
use crate::machine::Prepared;
use crate::session::GuestSession;

/// An observer's own failure, whatever its kind: the engine only passes it
/// on (`RunError::Observer`, `ReplayError::Observer`).
pub type ObserverError = Box<dyn std::error::Error + Send + Sync>;

/// Hooks into one run, recording or replay; each defaults to nothing.
pub trait Observer {
    /// The VM is assembled and the guest has not run yet.
    fn attach(&mut self, _vm: &mut Vm, _kernel: &GuestKernel<'_>) -> Result<(), ObserverError> {
        Ok(())
    }

    /// The job is about to be sent to the guest on `prepared` (not at a
    /// replay, which sends what the trace logged).
    fn job_starting(&mut self, _job: &mut Job, _prepared: &Prepared) -> Result<(), ObserverError> {
        Ok(())
    }

    /// The command ended, having written `output`; its guest is still up.
    fn job_ended(
        &mut self,
        _session: &mut GuestSession,
        _output: &JobOutput,
    ) -> Result<(), ObserverError> {
        Ok(())
    }

    /// What a recording keeps of it, as a trace section, once the guest is
    /// off.
    fn section(&mut self) -> Result<Option<(SectionKind, Vec<u8>)>, ObserverError> {
        Ok(None)
    }
}

/// The guest's kernel, described (symbols and profile) for observers and
/// analyses that read its structures: loaded on first use, once, as parsing
/// a kernel takes a fraction of a second.
pub struct GuestKernel<'a> {
    load: Box<dyn Fn() -> Result<KernelInfo, ObserverError> + 'a>,
    loaded: OnceCell<KernelInfo>,
}

impl<'a> GuestKernel<'a> {
    pub fn new(load: impl Fn() -> Result<KernelInfo, ObserverError> + 'a) -> Self {
        GuestKernel {
            load: Box::new(load),
            loaded: OnceCell::new(),
        }
    }

    pub fn info(&self) -> Result<&KernelInfo, ObserverError> {
        if let Some(info) = self.loaded.get() {
            return Ok(info);
        }
        let info = (self.load)()?;
        Ok(self.loaded.get_or_init(|| info))
    }
}

/// Calls `hook` on every observer, stopping at the first error.
pub(crate) fn each(
    observers: &mut [&mut dyn Observer],
    mut hook: impl FnMut(&mut dyn Observer) -> Result<(), ObserverError>,
) -> Result<(), ObserverError> {
    observers
        .iter_mut()
        .try_for_each(|observer| hook(&mut **observer))
}

/// What the command wrote, digested.
pub struct JobOutput {
    pub stdout: Digested,
    pub stderr: Digested,
}
