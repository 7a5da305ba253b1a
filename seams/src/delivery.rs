//! Where interrupts were delivered, in the trace's words and the VMM's: a
//! replay delivers them where its recording did.

use provm_trace::manifest::InterruptDelivery;
use provm_vmm::seam::Delivery;

/// What a manifest says of a recording that delivers as `delivery`, which
/// is at exits (`Delivery::Anywhere` is a live run's, never recorded).
pub fn recorded(delivery: Delivery) -> InterruptDelivery {
    match delivery {
        Delivery::WindowExit => InterruptDelivery::WindowExit,
        Delivery::Doorbell | Delivery::Anywhere => InterruptDelivery::Doorbell,
    }
}

/// How the replay of a recording that delivered as `recorded` delivers.
pub fn replayed(recorded: InterruptDelivery) -> Delivery {
    match recorded {
        InterruptDelivery::Doorbell => Delivery::Doorbell,
        InterruptDelivery::WindowExit => Delivery::WindowExit,
    }
}
