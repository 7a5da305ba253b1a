//! One vCPU's local APIC (xAPIC, through MMIO at 0xfee00000), emulated by
//! the VMM, for guests with more than one vCPU.
//!
//! Why in user space: provm has no in-kernel irqchip, so that every
//! interrupt passes through its seam and is injected at an exit it logs.
//! MMIO exits reach user space on every KVM kind (PVM included), so the
//! APIC is xAPIC, not x2APIC. The guest runs with `noapic` (no I/O APIC:
//! the 8259 PIC stays wired to CPU 0, as in virtual-wire mode) and
//! `nolapic_timer` (the PIT's tick reaches the other CPUs as IPIs, the
//! kernel's tick broadcast): what is left is the registers Linux touches,
//! the IRR/ISR priority logic for injection and EOI, and the ICR, whose
//! writes become IPIs the VM routes to the other APICs.

use serde::{Deserialize, Serialize};

use super::persist::{require, InvalidState, Persist};

/// The APIC page's guest-physical address (the architectural default,
/// which the MP table repeats).
pub const APIC_BASE: u64 = 0xfee0_0000;
pub const APIC_SIZE: u64 = 0x1000;
/// An integrated APIC (0x1x) with six LVT entries (max LVT index 5).
const VERSION: u32 = 0x0005_0014;

const ID: u64 = 0x20;
const VERSION_REG: u64 = 0x30;
const TPR: u64 = 0x80;
const PPR: u64 = 0xa0;
const EOI: u64 = 0xb0;
const LDR: u64 = 0xd0;
const DFR: u64 = 0xe0;
const SVR: u64 = 0xf0;
const ISR: u64 = 0x100;
const TMR: u64 = 0x180;
const IRR: u64 = 0x200;
const ESR: u64 = 0x280;
const ICR_LOW: u64 = 0x300;
const ICR_HIGH: u64 = 0x310;
const LVT_FIRST: u64 = 0x320;
const LVT_LAST: u64 = 0x370;
const TIMER_INITIAL: u64 = 0x380;
const TIMER_CURRENT: u64 = 0x390;
const TIMER_DIVIDE: u64 = 0x3e0;
const LVT_MASKED: u32 = 1 << 16;

/// An IPI written to the ICR, for the VM to route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipi {
    pub vector: u8,
    pub kind: IpiKind,
    pub to: Destination,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpiKind {
    Fixed,
    Nmi,
    /// INIT, SIPI and the rest: the guest kernel starts CPUs through
    /// provm's port instead (kernels/smp), so these are ignored.
    Other(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// APIC ID (0xff: all).
    Physical(u8),
    /// A flat logical mask, matched against each LDR.
    Logical(u8),
    SelfOnly,
    All,
    AllButSelf,
}

/// 256 interrupt bits, as the IRR, ISR and TMR hold them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Vectors([u32; 8]);

impl Vectors {
    fn set(&mut self, vector: u8, on: bool) {
        let (word, bit) = (usize::from(vector / 32), vector % 32);
        if on {
            self.0[word] |= 1 << bit;
        } else {
            self.0[word] &= !(1 << bit);
        }
    }

    fn highest(&self) -> Option<u8> {
        (0..8).rev().find_map(|word| {
            let bits = self.0[word];
            (bits != 0).then(|| (word * 32 + 31 - bits.leading_zeros() as usize) as u8)
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalApic {
    id: u8,
    tpr: u32,
    ldr: u32,
    dfr: u32,
    svr: u32,
    esr: u32,
    icr_high: u32,
    lvt: [u32; 6],
    timer_initial: u32,
    timer_divide: u32,
    irr: Vectors,
    isr: Vectors,
    /// An NMI IPI waits for the vCPU's next entry (NMIs bypass the IRR).
    nmi_pending: bool,
}

impl LocalApic {
    /// The APIC at reset, with APIC ID `id`.
    pub fn new(id: u8) -> Self {
        LocalApic {
            id,
            tpr: 0,
            ldr: 0,
            dfr: 0xffff_ffff,
            svr: 0xff,
            esr: 0,
            icr_high: 0,
            lvt: [LVT_MASKED; 6],
            timer_initial: 0,
            timer_divide: 0,
            irr: Vectors::default(),
            isr: Vectors::default(),
            nmi_pending: false,
        }
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    /// A 32-bit register read; other sizes and reserved registers read 0.
    pub fn read(&self, offset: u64) -> u32 {
        let vectors = |set: &Vectors, base: u64| set.0[((offset - base) / 0x10) as usize];
        match offset {
            ID => u32::from(self.id) << 24,
            VERSION_REG => VERSION,
            TPR => self.tpr,
            PPR => self.processor_priority(),
            LDR => self.ldr,
            DFR => self.dfr,
            SVR => self.svr,
            ISR..=0x170 if offset.is_multiple_of(0x10) => vectors(&self.isr, ISR),
            IRR..=0x270 if offset.is_multiple_of(0x10) => vectors(&self.irr, IRR),
            TMR..=0x1f0 => 0,
            ESR => self.esr,
            // Delivery is immediate: the send-pending bit is never set.
            ICR_LOW => 0,
            ICR_HIGH => self.icr_high,
            LVT_FIRST..=LVT_LAST if offset.is_multiple_of(0x10) => {
                self.lvt[((offset - LVT_FIRST) / 0x10) as usize]
            }
            TIMER_INITIAL => self.timer_initial,
            // The timer never runs (the guest boots with nolapic_timer).
            TIMER_CURRENT => 0,
            TIMER_DIVIDE => self.timer_divide,
            _ => 0,
        }
    }

    /// A 32-bit register write; an ICR write returns the IPI it sends.
    pub fn write(&mut self, offset: u64, value: u32) -> Option<Ipi> {
        match offset {
            // Linux writes the ID only to restore it; keep ours.
            TPR => self.tpr = value & 0xff,
            EOI => {
                if let Some(vector) = self.isr.highest() {
                    self.isr.set(vector, false);
                }
            }
            LDR => self.ldr = value & 0xff00_0000,
            DFR => self.dfr = value | 0x0fff_ffff,
            SVR => self.svr = value & 0x13ff,
            // Writing ESR latches the errors; there are none.
            ESR => self.esr = 0,
            ICR_HIGH => self.icr_high = value & 0xff00_0000,
            ICR_LOW => return Some(self.ipi(value)),
            LVT_FIRST..=LVT_LAST if offset.is_multiple_of(0x10) => {
                self.lvt[((offset - LVT_FIRST) / 0x10) as usize] = value;
            }
            TIMER_INITIAL => self.timer_initial = value,
            TIMER_DIVIDE => self.timer_divide = value & 0xb,
            _ => {}
        }
        None
    }

    fn ipi(&self, low: u32) -> Ipi {
        let vector = low as u8;
        let kind = match (low >> 8) & 7 {
            0 | 1 => IpiKind::Fixed,
            4 => IpiKind::Nmi,
            other => IpiKind::Other(other as u8),
        };
        let target = (self.icr_high >> 24) as u8;
        let to = match (low >> 18) & 3 {
            1 => Destination::SelfOnly,
            2 => Destination::All,
            3 => Destination::AllButSelf,
            _ if low & (1 << 11) != 0 => Destination::Logical(target),
            _ => Destination::Physical(target),
        };
        Ipi { vector, kind, to }
    }

    /// Whether an IPI from the APIC with ID `from` is for this one.
    pub fn is_destination(&self, to: Destination, from: u8) -> bool {
        match to {
            Destination::Physical(id) => id == 0xff || id == self.id,
            // Flat model only: Linux's apic_flat (up to 8 CPUs) and
            // physflat (more, physical) are what a 64-bit guest uses.
            Destination::Logical(mask) => (self.ldr >> 24) as u8 & mask != 0,
            Destination::SelfOnly => from == self.id,
            Destination::All => true,
            Destination::AllButSelf => from != self.id,
        }
    }

    /// Latches a fixed interrupt (an IPI) in the IRR.
    pub fn accept(&mut self, vector: u8) {
        self.irr.set(vector, true);
    }

    /// Latches an NMI (an IPI of delivery mode NMI), whatever the SVR and
    /// priorities say, as the hardware does.
    pub fn accept_nmi(&mut self) {
        self.nmi_pending = true;
    }

    /// Whether an NMI waits (which wakes even a CPU halted with interrupts off).
    pub fn nmi_pending(&self) -> bool {
        self.nmi_pending
    }

    /// Takes the waiting NMI, if any, to inject it.
    pub fn take_nmi(&mut self) -> bool {
        std::mem::take(&mut self.nmi_pending)
    }

    /// Software-enabled (SVR bit 8): a disabled APIC takes no interrupts.
    fn enabled(&self) -> bool {
        self.svr & 0x100 != 0
    }

    fn processor_priority(&self) -> u32 {
        let isr = self
            .isr
            .highest()
            .map_or(0, |vector| u32::from(vector) & 0xf0);
        (self.tpr & 0xf0).max(isr)
    }

    /// The vector to inject next, if one outranks the processor priority.
    fn deliverable(&self) -> Option<u8> {
        let vector = self.irr.highest()?;
        (self.enabled() && u32::from(vector) & 0xf0 > self.processor_priority()).then_some(vector)
    }

    /// Whether an interrupt waits that the vCPU could take (an NMI, or a
    /// vector above the processor priority).
    pub fn has_pending_interrupt(&self) -> bool {
        self.nmi_pending || self.deliverable().is_some()
    }

    /// Moves the next deliverable vector from the IRR to the ISR (the
    /// vCPU is taking it).
    pub fn acknowledge(&mut self) -> Option<u8> {
        let vector = self.deliverable()?;
        self.irr.set(vector, false);
        self.isr.set(vector, true);
        Some(vector)
    }
}

impl Persist for LocalApic {
    type State = LocalApic;

    fn save(&self) -> LocalApic {
        self.clone()
    }

    fn restore(&mut self, state: &LocalApic) -> Result<(), InvalidState> {
        require(
            state.id == self.id,
            "apic",
            "id",
            state.id,
            "another vCPU's APIC",
        )?;
        *self = state.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled(id: u8) -> LocalApic {
        let mut apic = LocalApic::new(id);
        apic.write(SVR, 0x1ff);
        apic
    }

    #[test]
    fn the_highest_vector_is_taken_first_and_eoi_retires_it() {
        let mut apic = enabled(0);
        apic.accept(0x31);
        apic.accept(0xfb);
        assert_eq!(apic.acknowledge(), Some(0xfb));
        // 0x31 is below the in-service 0xfb's priority class.
        assert_eq!(apic.acknowledge(), None);
        apic.write(EOI, 0);
        assert_eq!(apic.acknowledge(), Some(0x31));
        assert_eq!(apic.read(ISR + 0x10), 1 << 0x11);
    }

    #[test]
    fn a_disabled_apic_or_a_high_tpr_holds_interrupts() {
        let mut apic = LocalApic::new(0);
        apic.accept(0x40);
        assert!(!apic.has_pending_interrupt());
        apic.write(SVR, 0x1ff);
        apic.write(TPR, 0x40);
        assert!(!apic.has_pending_interrupt());
        apic.write(TPR, 0x30);
        assert!(apic.has_pending_interrupt());
    }

    #[test]
    fn an_nmi_waits_whatever_the_priority_until_taken() {
        let mut apic = LocalApic::new(0);
        apic.write(TPR, 0xf0);
        apic.accept_nmi();
        assert!(apic.has_pending_interrupt());
        assert_eq!(apic.acknowledge(), None, "an NMI is not a vector");
        assert!(apic.take_nmi());
        assert!(!apic.take_nmi());
        assert!(!apic.has_pending_interrupt());
    }

    #[test]
    fn icr_writes_name_the_destination() {
        let mut apic = enabled(1);
        apic.write(ICR_HIGH, 0x0200_0000);
        let logical = apic.write(ICR_LOW, 0x0800 | 0xfd).unwrap();
        assert_eq!(logical.to, Destination::Logical(2));
        assert_eq!(logical.kind, IpiKind::Fixed);
        let all_but_self = apic.write(ICR_LOW, 0xc_0000 | 0xfc).unwrap();
        assert_eq!(all_but_self.to, Destination::AllButSelf);
        let nmi = apic.write(ICR_LOW, 0x400).unwrap();
        assert_eq!(nmi.kind, IpiKind::Nmi);

        let mut other = enabled(2);
        other.write(LDR, 0x0200_0000);
        assert!(other.is_destination(logical.to, 1));
        assert!(other.is_destination(all_but_self.to, 1));
        assert!(!apic.is_destination(all_but_self.to, 1));
        assert!(other.is_destination(Destination::Physical(2), 1));
        assert!(!other.is_destination(Destination::Physical(3), 1));
    }
}
