//! The single vCPU: its CPU model, its PVH entry state, interrupt injection
//! and the kick that forces it out of KVM_RUN when a timer tick is due.

use std::sync::Once;
use std::time::Duration;

use kvm_bindings::{kvm_fpu, kvm_interrupt, kvm_regs, kvm_segment, KVMIO, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

use crate::boot::{EntryPoint, GDT, GDT_START};
use crate::cpuid::{self, guest_cpuid, HiddenFeature};

// kvm-ioctls has no wrapper for KVM_INTERRUPT, the injection ioctl for VMs
// without an in-kernel irqchip.
ioctl_iow_nr!(KVM_INTERRUPT, KVMIO, 0x86, kvm_interrupt);

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("cannot create the vCPU: {0}")]
    Create(kvm_ioctls::Error),
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(kvm_ioctls::Error),
    #[error("KVM_SET_CPUID2 failed: {0}")]
    SetCpuid(kvm_ioctls::Error),
    #[error("cannot set the vCPU's initial state ({what}): {source}")]
    InitialState {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("KVM_INTERRUPT of vector {vector:#x} failed: {source}")]
    Inject { vector: u8, source: std::io::Error },
    #[error("cannot set up the vCPU kick timer: {0}")]
    Kicker(std::io::Error),
}

pub struct Vcpu {
    pub fd: VcpuFd,
}

impl Vcpu {
    /// Creates vCPU 0 with the guest CPU model. Also returns the hidden
    /// features KVM did not take away (see `cpuid::unenforced`).
    pub fn new(kvm: &Kvm, vm: &VmFd) -> Result<(Self, Vec<&'static HiddenFeature>), VcpuError> {
        let fd = vm.create_vcpu(0).map_err(VcpuError::Create)?;
        let supported = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VcpuError::SupportedCpuid)?;
        fd.set_cpuid2(&guest_cpuid(&supported))
            .map_err(VcpuError::SetCpuid)?;
        let effective = fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(VcpuError::SetCpuid)?;
        Ok((Vcpu { fd }, cpuid::unenforced(&effective)))
    }

    /// The PVH entry state: 32-bit protected mode, paging off, flat segments,
    /// EBX pointing at the start info.
    pub fn enter_pvh(&self, entry: EntryPoint) -> Result<(), VcpuError> {
        let state_error = |what| move |source| VcpuError::InitialState { what, source };
        let mut sregs = self.fd.get_sregs().map_err(state_error("sregs"))?;
        let code = segment(1, 0xb);
        let data = segment(2, 0x3);
        sregs.cs = code;
        (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
        sregs.tr = kvm_segment {
            s: 0,
            db: 0,
            g: 0,
            limit: 0x67,
            ..segment(3, 0xb)
        };
        sregs.gdt.base = GDT_START.0;
        sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
        sregs.idt.base = 0;
        sregs.idt.limit = 0;
        sregs.cr0 = 0x11; // PE | ET
        sregs.cr4 = 0;
        sregs.efer = 0;
        self.fd.set_sregs(&sregs).map_err(state_error("sregs"))?;

        let regs = kvm_regs {
            rip: entry.entry.0,
            rbx: entry.start_info.0,
            rflags: 0x2,
            ..Default::default()
        };
        self.fd.set_regs(&regs).map_err(state_error("regs"))?;

        // The power-on values of the x87 control word and MXCSR.
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        self.fd.set_fpu(&fpu).map_err(state_error("fpu"))
    }

    /// Delivers an external interrupt on the next KVM_RUN. Only valid when the
    /// last exit reported the guest ready for injection.
    pub fn inject(&self, vector: u8) -> Result<(), VcpuError> {
        let request = kvm_interrupt { irq: vector.into() };
        // SAFETY: KVM_INTERRUPT reads one kvm_interrupt, which lives across the call.
        let ret = unsafe { ioctl_with_ref(&self.fd, KVM_INTERRUPT(), &request) };
        if ret < 0 {
            return Err(VcpuError::Inject {
                vector,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Whether the guest can take an interrupt now (IF set, no interrupt shadow).
    pub fn ready_for_interrupt(&mut self) -> bool {
        let run = self.fd.get_kvm_run();
        run.ready_for_interrupt_injection != 0 && run.if_flag != 0
    }

    /// Whether the guest had interrupts enabled at the last exit.
    pub fn interrupts_enabled(&mut self) -> bool {
        self.fd.get_kvm_run().if_flag != 0
    }

    /// Asks KVM to exit as soon as the guest can take an interrupt.
    pub fn request_interrupt_window(&mut self, request: bool) {
        self.fd.get_kvm_run().request_interrupt_window = request.into();
    }
}

fn segment(gdt_index: u16, type_: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: gdt_index * 8,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// A POSIX timer that sends the vCPU thread a signal, so that KVM_RUN returns
/// (EINTR) when a timer interrupt is due even if the guest never exits on its
/// own, e.g. a user-space loop. It repeats every `RETRY` so that a signal that
/// lands just before KVM_RUN is entered only delays the kick.
pub struct Kicker {
    timer: libc::timer_t,
}

const RETRY: Duration = Duration::from_millis(10);

fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

impl Kicker {
    /// Creates the timer for the calling thread, which must be the one that
    /// runs the vCPU.
    pub fn for_current_thread() -> Result<Self, VcpuError> {
        static HANDLER: Once = Once::new();
        let mut registered = Ok(());
        HANDLER.call_once(|| {
            registered = vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick)
                .map_err(|e| VcpuError::Kicker(std::io::Error::from_raw_os_error(e.errno())));
        });
        registered?;
        // SAFETY: sigevent is plain data; zero is a valid starting value.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = kick_signal();
        // SAFETY: gettid has no preconditions.
        event.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the duration of the call.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) } != 0 {
            return Err(VcpuError::Kicker(std::io::Error::last_os_error()));
        }
        Ok(Kicker { timer })
    }

    /// Kicks the vCPU `after` from now (at most `RETRY`), then every `RETRY`.
    pub fn arm(&mut self, after: Duration) {
        let after = after.clamp(Duration::from_micros(50), RETRY);
        let spec = libc::itimerspec {
            it_interval: timespec(RETRY),
            it_value: timespec(after),
        };
        // SAFETY: the timer is ours and alive; spec is a valid itimerspec.
        unsafe { libc::timer_settime(self.timer, 0, &spec, std::ptr::null_mut()) };
    }
}

impl Drop for Kicker {
    fn drop(&mut self) {
        // SAFETY: the timer was created by timer_create and is deleted once.
        unsafe { libc::timer_delete(self.timer) };
    }
}

fn timespec(duration: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: duration.as_secs() as libc::time_t,
        tv_nsec: duration.subsec_nanos() as libc::c_long,
    }
}
