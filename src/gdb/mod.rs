//! `provm replay --gdb ADDRESS`: the replay served to gdb over the GDB
//! remote protocol (gdbstub), with time travel.
//!
//! - `debuggee`: the replay driven forward and back (snapshots, restore,
//!   re-execution), with no protocol in it;
//! - `target`: gdbstub's view of it (registers, memory, breakpoints);
//! - `monitor`: the `monitor` commands;
//! - `snapshots`, `disk_journal`: what time travel keeps.

mod debuggee;
mod disk_journal;
mod monitor;
mod snapshots;
mod target;

use std::io;
use std::net::{TcpListener, TcpStream};

use gdbstub::common::Signal;
use gdbstub::conn::ConnectionExt;
use gdbstub::stub::run_blocking::{self, BlockingEventLoop, WaitForStopReasonError};
use gdbstub::stub::{DisconnectReason, GdbStub, MultiThreadStopReason};

pub use debuggee::DebugError;
use debuggee::Debuggee;
use target::{ReplayTarget, Resume};

use provm_engine::replay::{ReplayOptions, ReplayReport};

/// A time-travel snapshot every this many log events at first, unless
/// `provm replay --snapshot-every` says otherwise. Measured
/// on the development hosts (tests/suite/gdb.rs, `cargo bench --bench gdb`): a
/// snapshot of the test guest (128 MiB) is about 3.4 MiB and takes about
/// 0.12 to 0.16 s to capture and compress, and a replay there runs about 1,000
/// events a second, so this costs about 6% of the replay's time while
/// going back re-executes at most one interval (about 2 s here; on VMX
/// hosts the guest kernel's work, and so the replay, is far faster).
pub const SNAPSHOT_EVERY: u64 = 2000;
/// At most this many snapshots are kept (then every other one goes and the
/// interval doubles): about 110 MiB for the test guest.
pub const SNAPSHOT_LIMIT: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    #[error("cannot listen for gdb on {address}: {source}; choose another address or port (--gdb 127.0.0.1:PORT)")]
    Listen { address: String, source: io::Error },
    #[error("waiting for gdb on {address}: {source}")]
    Accept { address: String, source: io::Error },
    #[error(transparent)]
    Debug(#[from] DebugError),
}

/// Serves the replay of `options.trace` to one gdb on `address`, with a
/// time-travel snapshot every `snapshot_every` events at first; when gdb
/// goes, replays on to the end and returns the verdict.
pub fn serve(
    options: ReplayOptions,
    address: &str,
    snapshot_every: u64,
) -> Result<ReplayReport, GdbError> {
    let listen_error = |source| GdbError::Listen {
        address: address.to_owned(),
        source,
    };
    // First, so that a port in use is refused before any work.
    let listener = TcpListener::bind(address).map_err(listen_error)?;
    let debuggee = Debuggee::new(options, snapshot_every, SNAPSHOT_LIMIT)?;
    eprintln!(
        "provm: waiting for gdb on {address}: gdb -ex 'target remote {address}' vmlinux \
         (vmlinux from `provm replay --extract-kernel`)"
    );
    let (stream, _) = listener.accept().map_err(|source| GdbError::Accept {
        address: address.to_owned(),
        source,
    })?;
    let mut target = ReplayTarget {
        debuggee,
        resume: Resume::Continue,
    };
    match GdbStub::new(stream).run_blocking::<EventLoop>(&mut target) {
        Ok(DisconnectReason::Kill) => {
            eprintln!("provm: gdb killed the replay; replaying on to the end")
        }
        Ok(_) => eprintln!("provm: gdb disconnected; replaying on to the end"),
        Err(error) if error.is_target_error() => {
            return Err(error.into_target_error().expect("a target error").into())
        }
        Err(error) => {
            eprintln!("provm: the connection to gdb failed ({error}); replaying on to the end")
        }
    }
    let report = target.debuggee.finish()?;
    report_snapshots(&target.debuggee);
    Ok(report)
}

/// Says on stderr what time travel cost this session.
fn report_snapshots(debuggee: &Debuggee) {
    let taken = &debuggee.cost.taken;
    if taken.is_empty() {
        return;
    }
    let (bytes, seconds) = debuggee.cost.totals();
    eprintln!(
        "provm: time travel: {} snapshots taken ({:.1} MiB, {seconds:.2} s in all)",
        taken.len(),
        bytes as f64 / (1 << 20) as f64
    );
}

enum EventLoop {}

impl BlockingEventLoop for EventLoop {
    type Target = ReplayTarget;
    type Connection = TcpStream;
    type StopReason = MultiThreadStopReason<u64>;

    #[allow(clippy::type_complexity)]
    fn wait_for_stop_reason(
        target: &mut ReplayTarget,
        conn: &mut TcpStream,
    ) -> Result<
        run_blocking::Event<MultiThreadStopReason<u64>>,
        WaitForStopReasonError<DebugError, io::Error>,
    > {
        let stopped = {
            // Whatever gdb sends while the replay runs (Ctrl-C) stops it.
            let mut interrupted = || conn.peek().map_or(true, |byte| byte.is_some());
            target
                .run(&mut interrupted)
                .map_err(WaitForStopReasonError::Target)?
        };
        match stopped {
            Some(reason) => Ok(run_blocking::Event::TargetStopped(reason)),
            None => {
                let byte = conn.read().map_err(WaitForStopReasonError::Connection)?;
                Ok(run_blocking::Event::IncomingData(byte))
            }
        }
    }

    fn on_interrupt(
        target: &mut ReplayTarget,
    ) -> Result<Option<MultiThreadStopReason<u64>>, DebugError> {
        Ok(Some(target.stopped(Signal::SIGINT)))
    }
}
