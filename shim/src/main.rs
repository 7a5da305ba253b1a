//! containerd-shim-provm-v1: containerd's shim v2 for provm-runtime, so
//! that containerd starts containers as the runtime
//! `io.containerd.provm.v1` (`ctr run --runtime io.containerd.provm.v1`,
//! or a Kubernetes RuntimeClass). As containerd's runc shim calls runc's
//! command line, this one calls provm-runtime's for each step of a
//! container's life, which so stays in the runtime. See docs/runtime.md.

#![deny(clippy::undocumented_unsafe_blocks)]

mod console;
mod container;
mod events;
mod exit;
mod rootfs;
mod runtime;
mod service;
mod stdio;
mod task;

const RUNTIME_ID: &str = "io.containerd.provm.v1";

fn main() {
    let config = containerd_shim::Config {
        // The library's reaper waits for any child, and so would take the
        // statuses of the provm-runtime commands the shim waits for itself;
        // the container's process is waited for by `exit`.
        no_reaper: true,
        ..Default::default()
    };
    containerd_shim::run::<service::Service>(RUNTIME_ID, Some(config));
}
