//! The machine's devices as one part: the port and MMIO buses and the
//! devices on them, wired to the PIC's lines as `layout` places them. The
//! VM builds them once, boots or restores them, and its run loop and exit
//! handlers reach each through here.

use std::sync::{Arc, Mutex};

use vm_memory::{Address, GuestMemoryBackend};

use crate::bus::Bus;
use crate::devices::cmos::{Cmos, CMOS_PORT, CMOS_PORT_LEN};
use crate::devices::i8042::{self, I8042};
use crate::devices::paravirt::{
    Doorbell, ParavirtClock, SmpPorts, DOORBELL_PORT, DOORBELL_PORT_LEN, SMP_PORT, SMP_PORT_LEN,
};
use crate::devices::persist::Persist;
use crate::devices::pic::{self, Pic, PicIrqLine};
use crate::devices::pit::{Pit, PIT_PORT, PIT_PORT_LEN};
use crate::devices::serial::{ConsoleTail, SerialPort, COM1_BASE, COM1_IRQ, UART_REGISTERS};
use crate::devices::vector_state::{VectorStatePorts, VECTOR_STATE_PORT, VECTOR_STATE_PORT_LEN};
use crate::devices::virtio::block::VirtioBlock;
use crate::devices::virtio::console::VirtioConsole;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::VirtioNet;
use crate::devices::SharedIrqLine;
use crate::disk::{Disk, InputMedium};
use crate::memory::{GuestMemory, MMIO_DEVICE_SIZE};
use crate::seam::{ObservedDisk, Seam};

use super::layout::{
    BLOCK_IRQ, BLOCK_MMIO, CLOCK_MMIO, CONSOLE_IRQ, CONSOLE_MMIO, INPUT_DISK_IRQ, INPUT_DISK_MMIO,
    NET_IRQ, NET_MMIO, PIT_IRQ,
};
use super::{VmError, VmState};

/// Every device of the machine, each shared between its bus and the VM,
/// which reaches it directly to save, restore, tick and drain it.
pub(super) struct Devices {
    pub(super) pio: Bus,
    pub(super) mmio: Bus,
    pub(super) pic: Arc<Mutex<Pic>>,
    pub(super) pit: Arc<Mutex<Pit>>,
    /// The PIC line the PIT's ticks raise.
    pub(super) timer_line: SharedIrqLine,
    pub(super) i8042: Arc<Mutex<I8042>>,
    pub(super) doorbell: Arc<Mutex<Doorbell>>,
    pub(super) cmos: Arc<Mutex<Cmos>>,
    pub(super) serial: Arc<Mutex<SerialPort>>,
    pub(super) block: Arc<Mutex<MmioTransport<VirtioBlock>>>,
    pub(super) console: Arc<Mutex<MmioTransport<VirtioConsole>>>,
    pub(super) net: Option<Arc<Mutex<MmioTransport<VirtioNet>>>>,
    pub(super) input_disk: Option<Arc<Mutex<MmioTransport<VirtioBlock>>>>,
    /// The last lines the guest wrote to its serial console.
    pub(super) console_tail: ConsoleTail,
    /// The SMP kernel's requests (kernels/smp).
    pub(super) smp_ports: Arc<Mutex<SmpPorts>>,
    /// The guest kernel's requests to save and load vector state (patch 0011).
    pub(super) vector_state_ports: Arc<Mutex<VectorStatePorts>>,
}

impl Devices {
    /// The devices of a machine with `memory`, in their power-on state,
    /// their inputs and outputs crossing `seam`: the disk `disk`, the
    /// console echoed to stderr with `echo_console`, the network card
    /// with `net`, and the input disk on `input_disk` if any.
    pub(super) fn new(
        memory: &GuestMemory,
        seam: &Arc<dyn Seam>,
        disk: Box<dyn Disk>,
        echo_console: bool,
        net: bool,
        input_disk: Option<InputMedium>,
    ) -> Result<Self, VmError> {
        let clock = || seam.clone() as Arc<dyn crate::clock::Clock>;
        let pic = Arc::new(Mutex::new(Pic::new()));
        let line = |irq: u8| -> SharedIrqLine { Arc::new(PicIrqLine::new(pic.clone(), irq)) };
        let pit = Arc::new(Mutex::new(Pit::new(clock())));
        let i8042 = Arc::new(Mutex::new(I8042::new()));
        let ram_bytes = memory.last_addr().raw_value() + 1;
        let doorbell = Arc::new(Mutex::new(Doorbell::new(ram_bytes)));
        let cmos = Arc::new(Mutex::new(Cmos::new(clock())));
        let console_tail = ConsoleTail::default();
        let serial = Arc::new(Mutex::new(SerialPort::new(
            line(COM1_IRQ),
            console_tail.clone(),
            echo_console,
        )));

        let mut pio = Bus::default();
        for (base, len, device) in pic::pio_devices(&pic)
            .into_iter()
            .chain(i8042::pio_devices(&i8042))
        {
            pio.insert(base, len, device)?;
        }
        pio.insert(PIT_PORT, PIT_PORT_LEN, pit.clone())?;
        pio.insert(CMOS_PORT, CMOS_PORT_LEN, cmos.clone())?;
        pio.insert(COM1_BASE, UART_REGISTERS, serial.clone())?;
        pio.insert(DOORBELL_PORT.into(), DOORBELL_PORT_LEN, doorbell.clone())?;
        let smp_ports = Arc::new(Mutex::new(SmpPorts::default()));
        pio.insert(SMP_PORT.into(), SMP_PORT_LEN, smp_ports.clone())?;
        let vector_state_ports = Arc::new(Mutex::new(VectorStatePorts::default()));
        pio.insert(
            VECTOR_STATE_PORT.into(),
            VECTOR_STATE_PORT_LEN,
            vector_state_ports.clone(),
        )?;

        let disk = ObservedDisk {
            disk,
            seam: seam.clone(),
        };
        let block = Arc::new(Mutex::new(MmioTransport::new(
            VirtioBlock::new(Box::new(disk), false),
            memory.clone(),
            line(BLOCK_IRQ),
        )?));
        let console = Arc::new(Mutex::new(MmioTransport::new(
            VirtioConsole::new(),
            memory.clone(),
            line(CONSOLE_IRQ),
        )?));
        let mut mmio = Bus::default();
        mmio.insert(BLOCK_MMIO, MMIO_DEVICE_SIZE, block.clone())?;
        mmio.insert(CONSOLE_MMIO, MMIO_DEVICE_SIZE, console.clone())?;
        let paravirt_clock = Arc::new(Mutex::new(ParavirtClock::new(clock())));
        mmio.insert(CLOCK_MMIO, MMIO_DEVICE_SIZE, paravirt_clock)?;
        let net = match net {
            true => {
                let net = Arc::new(Mutex::new(MmioTransport::new(
                    VirtioNet::new(seam.clone()),
                    memory.clone(),
                    line(NET_IRQ),
                )?));
                mmio.insert(NET_MMIO, MMIO_DEVICE_SIZE, net.clone())?;
                Some(net)
            }
            false => None,
        };
        let input_disk = match input_disk {
            Some(medium) => {
                let disk = Arc::new(Mutex::new(MmioTransport::new(
                    VirtioBlock::new(Box::new(medium), true),
                    memory.clone(),
                    line(INPUT_DISK_IRQ),
                )?));
                mmio.insert(INPUT_DISK_MMIO, MMIO_DEVICE_SIZE, disk.clone())?;
                Some(disk)
            }
            None => None,
        };

        let timer_line = line(PIT_IRQ);
        Ok(Devices {
            pio,
            mmio,
            pic,
            pit,
            timer_line,
            i8042,
            doorbell,
            cmos,
            serial,
            block,
            console,
            net,
            input_disk,
            console_tail,
            smp_ports,
            vector_state_ports,
        })
    }

    /// When the PIT's next tick is due (guest time), if one is scheduled.
    pub(super) fn next_tick_ns(&self) -> Option<u64> {
        self.pit.lock().unwrap().next_deadline_ns()
    }

    /// Puts every device in the state `state` saved.
    pub(super) fn restore(&self, state: &VmState) -> Result<(), VmError> {
        self.pic.lock().unwrap().restore(&state.pic)?;
        self.pit.lock().unwrap().restore(&state.pit)?;
        self.cmos.lock().unwrap().restore(&state.cmos)?;
        self.serial.lock().unwrap().restore(&state.serial)?;
        self.i8042.lock().unwrap().restore(&state.i8042)?;
        self.doorbell.lock().unwrap().restore(&state.doorbell)?;
        self.block.lock().unwrap().restore(&state.block)?;
        self.console.lock().unwrap().restore(&state.console)?;
        if let (Some(net), Some(saved)) = (&self.net, &state.net) {
            net.lock().unwrap().restore(saved)?;
        }
        if let (Some(disk), Some(saved)) = (&self.input_disk, &state.input_disk) {
            disk.lock().unwrap().restore(saved)?;
        }
        Ok(())
    }
}
