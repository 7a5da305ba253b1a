//! One CPUID leaf and subleaf, the unit of every table of the model: what
//! KVM reports and is given (`provm-vmm` converts at its edge), what a
//! snapshot and a trace's manifest record.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Register {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// One CPUID leaf (`function`) and subleaf (`index`) as KVM_GET_CPUID2
/// reports it (`kvm_cpuid_entry2` without its padding): KVM's flags and
/// the four output registers. The snapshot's vCPU state and the trace's
/// manifest both store it in this form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidEntry {
    pub function: u32,
    pub index: u32,
    pub flags: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

impl CpuidEntry {
    pub fn register(&self, register: Register) -> u32 {
        match register {
            Register::Eax => self.eax,
            Register::Ebx => self.ebx,
            Register::Ecx => self.ecx,
            Register::Edx => self.edx,
        }
    }

    pub fn register_mut(&mut self, register: Register) -> &mut u32 {
        match register {
            Register::Eax => &mut self.eax,
            Register::Ebx => &mut self.ebx,
            Register::Ecx => &mut self.ecx,
            Register::Edx => &mut self.edx,
        }
    }
}

#[cfg(test)]
impl CpuidEntry {
    /// Leaf `function`.`index` with every bit of its four registers set.
    pub(crate) fn all_ones(function: u32, index: u32) -> Self {
        CpuidEntry {
            function,
            index,
            eax: u32::MAX,
            ebx: u32::MAX,
            ecx: u32::MAX,
            edx: u32::MAX,
            ..Default::default()
        }
    }
}
