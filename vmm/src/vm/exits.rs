//! The exits that carry the guest's device accesses: each is reported to
//! the seam with where the guest was, then handed to its device (or to
//! the running vCPU's APIC).

use crate::msr;
use crate::probes::port_exit::OutExitRip;
use crate::seam::Exit;
use crate::vcpu::{MmioExit, PioExit};

use super::{Vm, VmError};

impl Vm {
    /// Reports an exit that carries no data, with where the guest was.
    pub(super) fn report(&self, exit: Exit<'_>) -> Result<(), VmError> {
        self.seam.exit(exit, self.vcpu.place()?);
        Ok(())
    }

    /// A port read: each access of a string instruction reads its own
    /// element from the device, in order.
    pub(super) fn port_read(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let PioExit { port, size, data } = self.vcpu.pio_exit();
        let len = u16::try_from(data.len())
            .map_err(|_| VmError::UnexpectedExit(format!("port read of {} bytes", data.len())))?;
        self.seam.exit(Exit::PioRead { port, len }, at);
        if !self.devices.pio.read_elements(port.into(), size, data) {
            // Nothing there: an ISA bus floats high.
            data.fill(0xff);
        }
        self.seam.read_result(data);
        Ok(())
    }

    /// A port write: each access of a string instruction writes its own
    /// element to the device, in order; then what the guest kernel asked
    /// of the vCPU's vector state, if that was the port.
    pub(super) fn port_write(&mut self) -> Result<(), VmError> {
        let at = match self.out_exit_rip {
            OutExitRip::PastInstruction => self.vcpu.place()?,
            OutExitRip::AtInstruction => self.vcpu.place_past_out(&self.memory)?,
        };
        let PioExit { port, size, data } = self.vcpu.pio_exit();
        self.seam.exit(Exit::PioWrite { port, data }, at);
        self.devices.pio.write_elements(port.into(), size, data);
        self.keep_vector_state()
    }

    /// An RDMSR of an MSR the VMM answers (see `msr`): from its model.
    pub(super) fn msr_read(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let read = self.vcpu.msr_read_exit();
        self.seam.exit(Exit::MsrRead { index: read.index }, at);
        let value = msr::read(read.index, || self.seam.monotonic_ns());
        *read.data = value;
        self.seam.read_result(&value.to_le_bytes());
        Ok(())
    }

    pub(super) fn mmio_read(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let MmioExit { address, data } = self.vcpu.mmio_exit();
        let len = data.len() as u8;
        self.seam.exit(Exit::MmioRead { address, len }, at);
        let apic = self
            .cpus
            .as_ref()
            .is_some_and(|cpus| cpus.mmio_read(address, data));
        if !apic && !self.devices.mmio.read(address, data) {
            data.fill(0xff);
        }
        self.seam.read_result(data);
        Ok(())
    }

    pub(super) fn mmio_write(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let MmioExit { address, data } = self.vcpu.mmio_exit();
        self.seam.exit(Exit::MmioWrite { address, data }, at);
        let apic = self
            .cpus
            .as_mut()
            .is_some_and(|cpus| cpus.mmio_write(address, data));
        if !apic {
            self.devices.mmio.write(address, data);
        }
        Ok(())
    }
}
