//! A run's machine, checked and assembled from its options: the image's
//! root, the kernel and its command line, the agent's initramfs.

use provm_cpu_model::Platform;
use provm_vmm::disk::image::BaseImage;
use provm_vmm::vm::BootSource;

use super::{RunError, RunOptions};
use crate::disk::root;
use crate::holes;
use crate::initramfs;
use crate::kernel;
use crate::machine::Prepared;
use crate::net;

/// The guest kernel's command line (the VM adds its devices).
/// - console=ttyS0: boot messages and panics on the serial port.
/// - nolapic noapic: interrupts come from the VMM's 8259 PIC.
/// - lpj: skips the delay-loop calibration, a busy wait on timer ticks
///   whose result depends on timing.
/// - rodata=off: skips remapping the kernel image page by page (seconds of
///   emulated ring 0 here); the kernel text stays writable.
/// - io_delay=none: no dummy writes to port 0x80 (each one an exit).
/// - 8250.nr_uarts=1: probe only the one serial port there is.
/// - panic=-1: a panicking guest resets at once, ending the run.
/// - rdinit=/init: the guest agent.
/// - quiet: only warnings and errors reach the console (every console byte
///   is a port write), also under `-v`, which shows the console: the
///   booted snapshot is keyed by the command line, and the log level is
///   not the machine (`provm run -v` once booted a snapshot of its own).
pub const KERNEL_ARGS: &str = "console=ttyS0 nolapic noapic lpj=5000 rodata=off io_delay=none 8250.nr_uarts=1 panic=-1 rdinit=/init quiet";

/// Checks the inputs and assembles the VM: the image's root, the overlay, the
/// kernel and the agent's initramfs.
pub fn prepare(options: &RunOptions) -> Result<Prepared, RunError> {
    if options.net && options.pinned.is_some() {
        return Err(RunError::NetPinned);
    }
    provm_vmm::vm::check_kvm()?;
    let mut base = BaseImage::open(&options.image)?;
    let root = match &options.root {
        Some(value) => root::root_override(&mut base, value),
        None => root::find_root(&mut base),
    }
    .map_err(|source| RunError::Root {
        image: options.image.clone(),
        source,
    })?;
    tracing::debug!(
        device = root.device(),
        reason = root.reason,
        "root file system"
    );
    let kernel = match &options.kernel {
        Some(path) if !path.exists() => return Err(RunError::KernelPath { path: path.clone() }),
        Some(path) => path.clone(),
        None => kernel::find(kernel::Variant::for_cpus(options.cpus))?,
    };
    Ok(Prepared {
        base,
        boot: BootSource {
            kernel,
            initramfs: initramfs::agent_initramfs(),
            cmdline: machine_args(options, &root.device()),
            cpu: options.cpu,
        },
        memory_mib: options.memory_mib,
        root_device: root.device(),
        echo_console: options.echo_console,
        net: options.net,
        cpus: options.cpus,
        // Set from the job's data (`JobData::input_disk`).
        input_disk: None,
    })
}

/// The kernel command line of this run's machine: provm's arguments, the
/// image's root file system, which the agent mounts read-only before the
/// booted snapshot (a job then only makes it writable), and the network
/// card's configuration with `--net`.
fn machine_args(options: &RunOptions, root_device: &str) -> String {
    let base = match options.cpus {
        1 => KERNEL_ARGS.to_owned(),
        // The local APICs without their timers: the PIT's tick reaches
        // the other vCPUs as IPIs (the kernel's tick broadcast), so the
        // VMM has no APIC timer to emulate on the logged clock.
        _ => KERNEL_ARGS.replace("nolapic", "nolapic_timer"),
    };
    let mut args = format!(
        "{base} {} provm.root={root_device}",
        holes::kernel_args(Platform::detect()),
    );
    if options.net {
        args = format!("{args} {}", net::kernel_arg());
    }
    args
}
