//! The features that watch a run or a recording as the engine drives it:
//! exit timing (`blame`) and, when asked, provenance capture.

use std::path::PathBuf;

use provm_engine::observer::Observer;
use provm_engine::start::RunOptions;
use provm_engine::timing::TimingObserver;

use crate::blame::{BlameError, TimingOptions};
use crate::provenance::{Provenance, ProvenanceCapture};

pub struct RunObservers {
    timing_options: TimingOptions,
    pub timing: TimingObserver,
    pub provenance: Option<ProvenanceCapture>,
}

impl RunObservers {
    /// Timing as `timing` asks, for a run of kind `mode`; provenance saved
    /// to `provenance` if given.
    pub fn new(
        options: &RunOptions,
        mode: &str,
        timing: &TimingOptions,
        provenance: Option<PathBuf>,
    ) -> Self {
        RunObservers {
            timing_options: timing.clone(),
            timing: timing.observer(mode),
            provenance: provenance.map(|path| {
                ProvenanceCapture::new(Some(path), options.pinned.clone(), options.host_paths)
            }),
        }
    }

    /// Each, for the engine to call.
    pub fn all(&mut self) -> Vec<&mut dyn Observer> {
        let mut all: Vec<&mut dyn Observer> = vec![&mut self.timing];
        if let Some(provenance) = &mut self.provenance {
            all.push(provenance);
        }
        all
    }

    /// Once the run is over: the timing written where `--timing` asked, and
    /// the provenance captured, if any.
    pub fn finish(self) -> Result<Option<Provenance>, BlameError> {
        self.timing_options.save_requested(&self.timing)?;
        Ok(self.provenance.and_then(ProvenanceCapture::into_document))
    }
}
