//! `events`: the event log, one row per event; `exits`: the VM exits
//! among them (a view, so the log is read once).

use provm_trace::events::Event;
use provm_vmm::vm::{mmio_device, port_device};
use rusqlite::ToSql;

use super::Kind::{Boolean, Integer, Text};
use super::{column, Rows, Table, View};
use crate::query::{QueryError, Run};

/// Data columns hold at most this many bytes, in hex (`len` has the whole
/// length).
const DATA_SHOWN: usize = 32;

pub const EVENTS: Table = Table {
    name: "events",
    doc: "one row per event of the log, in order",
    columns: &[
        column("idx", Integer, "the event's position in the log, from 0"),
        column("exit", Integer, "the VM exit it is or follows, from 0 (NULL before the first)"),
        column("kind", Text, "port read, port write, MMIO read, MMIO write, HLT, RDMSR, interrupt window, read result, clock, wall clock, interrupt injection, agent input, agent output, disk write"),
        column("is_exit", Boolean, "1 for a VM exit"),
        column("device", Text, "the device a port or MMIO exit addressed: pic, pit, cmos, serial, doorbell, i8042, virtio-blk, virtio-console, clock (none: no device there)"),
        column("port", Integer, "the I/O port of a port exit"),
        column("address", Integer, "the guest-physical address of an MMIO exit; the byte offset of a disk write"),
        column("value", Integer, "a clock reading (ns), an injected vector, an RDMSR's MSR"),
        column("len", Integer, "bytes: of the access, the data or the disk write"),
        column("data", Text, "the bytes written or returned, in hex (the first 32; a disk write's digest)"),
        column("rip", Text, "where the guest was at an exit, in hex"),
        column("guest_ns", Integer, "the guest's monotonic clock: its last reading at or before the event"),
        column("cpu", Integer, "the vCPU running at the event, from 0 (a vCPU switch's: the one it switches from; value is the one it switches to)"),
    ],
    indexes: &["exit", "kind"],
    fill,
    from_replay: false,
};

pub const EXITS: View = View {
    name: "exits",
    doc: "one row per VM exit (the exits among the events)",
    select:
        "SELECT run, exit, idx AS event, kind, device, port, address, len, data, rip, guest_ns, cpu \
             FROM events WHERE is_exit",
    columns: &[
        column("exit", Integer, "the exit's number, from 0"),
        column(
            "event",
            Integer,
            "its position in the event log (events.idx)",
        ),
        column("kind", Text, "as in events"),
        column("device", Text, "as in events"),
        column("port", Integer, "as in events"),
        column("address", Integer, "as in events"),
        column("len", Integer, "as in events"),
        column("data", Text, "as in events"),
        column("rip", Text, "as in events"),
        column("guest_ns", Integer, "as in events"),
        column("cpu", Integer, "the vCPU that exited"),
    ],
};

fn fill(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let mut log = run.trace.events()?;
    let mut idx = 0i64;
    let mut exit: Option<i64> = None;
    let mut guest_ns: Option<i64> = None;
    // The snapshot's vCPU runs until the log's first switch.
    let mut cpu = run.first_vcpu()?;
    while let Some(event) = log.next_event()? {
        if event.is_exit() {
            exit = Some(exit.map_or(0, |n| n + 1));
        }
        if let Event::Clock(ns) = event {
            guest_ns = Some(ns as i64);
        }
        let fields = Fields::of(&event);
        let kind = event.kind();
        let rip = event.place().map(|at| format!("{:#x}", at.rip));
        let values: [&dyn ToSql; 13] = [
            &idx,
            &exit,
            &kind.name(),
            &kind.is_exit(),
            &fields.device,
            &fields.port,
            &fields.address,
            &fields.value,
            &fields.len,
            &fields.data,
            &rip,
            &guest_ns,
            &cpu,
        ];
        rows.insert(&values)?;
        if let Event::Switch(to) = event {
            cpu = to;
        }
        idx += 1;
    }
    Ok(())
}

/// The columns that depend on the kind of event.
#[derive(Debug, Default, PartialEq, Eq)]
struct Fields {
    device: Option<&'static str>,
    port: Option<u16>,
    address: Option<i64>,
    value: Option<i64>,
    len: Option<i64>,
    data: Option<String>,
}

impl Fields {
    fn of(event: &Event) -> Fields {
        let bytes = |data: &[u8]| Fields {
            len: Some(data.len() as i64),
            data: Some(shown(data)),
            ..Fields::default()
        };
        match event {
            Event::PioRead { port, len, .. } => Fields {
                device: Some(port_device(*port)),
                port: Some(*port),
                len: Some(i64::from(*len)),
                ..Fields::default()
            },
            Event::PioWrite { port, data, .. } => Fields {
                device: Some(port_device(*port)),
                port: Some(*port),
                ..bytes(data)
            },
            Event::MmioRead { address, len, .. } => Fields {
                device: Some(mmio_device(*address)),
                address: Some(*address as i64),
                len: Some(i64::from(*len)),
                ..Fields::default()
            },
            Event::MmioWrite { address, data, .. } => Fields {
                device: Some(mmio_device(*address)),
                address: Some(*address as i64),
                ..bytes(data)
            },
            Event::MsrRead { index, .. } => Fields {
                value: Some(i64::from(*index)),
                ..Fields::default()
            },
            Event::Halt { .. } | Event::InterruptWindow { .. } => Fields::default(),
            Event::ReadResult(data)
            | Event::AgentInput(data)
            | Event::AgentOutput(data)
            | Event::NetReceived(data) => bytes(data),
            Event::Clock(ns) | Event::Wall(ns) => Fields {
                value: Some(*ns as i64),
                ..Fields::default()
            },
            Event::Inject(vector) | Event::Switch(vector) => Fields {
                value: Some(i64::from(*vector)),
                ..Fields::default()
            },
            Event::DiskWrite {
                offset,
                len,
                digest,
            } => Fields {
                address: Some(*offset as i64),
                len: Some(i64::from(*len)),
                data: Some(format!("{digest:016x}")),
                ..Fields::default()
            },
            Event::StateCheck { memory } => Fields {
                data: Some(format!("{memory:016x}")),
                ..Fields::default()
            },
            // How many pages the instance covers, and its digest.
            Event::Preempted {
                pages, instance, ..
            } => Fields {
                len: Some(pages.iter().map(|(_, count)| *count as i64).sum()),
                data: Some(format!("{instance:016x}")),
                ..Fields::default()
            },
            Event::NetSent { len, digest } => Fields {
                len: Some(i64::from(*len)),
                data: Some(format!("{digest:016x}")),
                ..Fields::default()
            },
        }
    }
}

/// The first bytes of `data` in hex, `...` marking a cut.
fn shown(data: &[u8]) -> String {
    let mut text = provm_trace::hex(&data[..data.len().min(DATA_SHOWN)]);
    if data.len() > DATA_SHOWN {
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_trace::events::Place;

    const AT: Place = Place {
        rip: 0xffff_ffff_8100_0000,
        registers: 7,
    };

    #[test]
    fn exits_are_named_by_their_device() {
        let serial = Fields::of(&Event::PioWrite {
            port: 0x3f8,
            data: vec![b'A'],
            at: AT,
        });
        assert_eq!(
            serial,
            Fields {
                device: Some("serial"),
                port: Some(0x3f8),
                len: Some(1),
                data: Some("41".into()),
                ..Fields::default()
            }
        );
        let clock = Fields::of(&Event::MmioRead {
            address: 0xd000_2000,
            len: 8,
            at: AT,
        });
        assert_eq!(clock.device, Some("clock"));
        assert_eq!(clock.address, Some(0xd000_2000));
    }

    #[test]
    fn long_data_is_cut_and_its_length_kept() {
        let output = Fields::of(&Event::AgentOutput(vec![0xab; 100]));
        assert_eq!(output.len, Some(100));
        let data = output.data.unwrap();
        assert_eq!(data.len(), 2 * DATA_SHOWN + 3);
        assert!(data.ends_with("ab..."));
        assert_eq!(Fields::of(&Event::Clock(5)).value, Some(5));
    }
}
