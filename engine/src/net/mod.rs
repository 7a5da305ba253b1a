//! The guest's network (`--net`): its addresses, what its kernel is told,
//! and the user-mode NAT behind its network card (`nat`).
//!
//! The guest is 10.0.2.15/24 with a default route through 10.0.2.2, as
//! under QEMU's user networking; 10.0.2.2 is the host's 127.0.0.1. Only
//! outbound TCP goes through: the NAT answers the guest's ARP, ends each of
//! its TCP connections in smoltcp and carries the bytes over a host socket.
//! No DNS (names fail at once: use addresses) and no UDP or ICMP.

mod connection;
mod nat;

use std::net::Ipv4Addr;

pub use nat::Nat;
use provm_vmm::network::Network;

/// The guest's address and its network's prefix length.
pub const GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
pub const PREFIX_LEN: u8 = 24;
/// The NAT's address: the guest's gateway, and the host's loopback.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// The kernel argument that tells the guest agent to bring its network
/// up: `provm.net=ADDRESS/PREFIX,GATEWAY`. On the kernel command line, it
/// is recorded with the trace, and the booted guest's snapshot (which has
/// the interface up) is cached apart from the one without a network.
pub fn kernel_arg() -> String {
    format!("provm.net={GUEST}/{PREFIX_LEN},{GATEWAY}")
}

/// The NAT a live run's or a recording's guest is connected to. Its TCP
/// initial sequence numbers come from the host's clock: what the guest
/// receives is logged, so a replay needs no NAT and no seed.
pub fn nat() -> Box<dyn Network> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    Box::new(Nat::new(seed))
}

/// Where the NAT connects for a guest connection to `address`: the
/// gateway is the host's loopback; other addresses of the guest's own
/// network have no host behind them.
fn host_address(address: Ipv4Addr) -> Option<Ipv4Addr> {
    let network = u32::MAX << (32 - PREFIX_LEN);
    if address == GATEWAY {
        Some(Ipv4Addr::LOCALHOST)
    } else if u32::from(address) & network == u32::from(GUEST) & network {
        None
    } else {
        Some(address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_is_the_hosts_loopback_and_the_rest_of_the_subnet_is_nobody() {
        assert_eq!(host_address(GATEWAY), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(host_address(Ipv4Addr::new(10, 0, 2, 9)), None);
        let outside = Ipv4Addr::new(192, 0, 2, 1);
        assert_eq!(host_address(outside), Some(outside));
        assert_eq!(kernel_arg(), "provm.net=10.0.2.15/24,10.0.2.2");
    }
}
