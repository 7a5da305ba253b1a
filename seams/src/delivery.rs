//! Where interrupts were delivered, in the trace's words and the VMM's: a
//! replay delivers them where its recording did.

use provm_trace::manifest::InterruptDelivery;
use provm_vmm::seam::Delivery;

/// Set to `window`, a recording delivers at KVM's interrupt-window exits,
/// as provm did on SVM and VMX hosts before it rang the doorbell
/// everywhere: for tests of how such traces replay, not a user's option.
const SWITCH: &str = "PROVM_RECORD_DELIVERY";

/// How a recording delivers the interrupts the guest cannot take at once:
/// at the guest kernel's doorbell, an exit the guest's own execution
/// places on every host. KVM's interrupt-window exit is not used: where it
/// lands differs between kernels (a window recorded on Linux 6.12 came six
/// bytes later than 6.1 placed it), so a probe cannot promise that another
/// host finds it again, and the doorbell costs the same one exit.
pub fn for_recording() -> Delivery {
    match std::env::var(SWITCH) {
        Ok(value) if value == "window" => Delivery::WindowExit,
        _ => Delivery::Doorbell,
    }
}

/// What a manifest says of a recording that delivers as `delivery`, which
/// is at exits (`Delivery::Anywhere` is a live run's, never recorded).
pub fn recorded(delivery: Delivery) -> InterruptDelivery {
    match delivery {
        Delivery::WindowExit | Delivery::LoggedWindow => InterruptDelivery::WindowExit,
        Delivery::Doorbell | Delivery::Anywhere => InterruptDelivery::Doorbell,
    }
}

/// How the replay of a recording that delivered as `recorded` delivers.
pub fn replayed(recorded: InterruptDelivery) -> Delivery {
    match recorded {
        InterruptDelivery::Doorbell => Delivery::Doorbell,
        InterruptDelivery::WindowExit => Delivery::LoggedWindow,
    }
}

/// How a recording that goes on from a replay (a fork) delivers: as the
/// replay did, with KVM's window where the replay followed logged ones.
pub fn going_on_from(replayed: Delivery) -> Delivery {
    match replayed {
        Delivery::LoggedWindow => Delivery::WindowExit,
        other => other,
    }
}
