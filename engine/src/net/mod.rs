//! The guest's network (`--net`): its addresses, what its kernel is told,
//! where its traffic goes on the host (`Routes`, `resolver`), and the
//! user-mode NAT behind its network card (`nat`).
//!
//! The guest is 10.0.2.15/24 with a default route through 10.0.2.2 and a
//! resolver at 10.0.2.3, as under QEMU's user networking; 10.0.2.2 is the
//! host's 127.0.0.1, and 10.0.2.3's port 53 is the host's resolver (or the
//! one `--dns` names). Outbound TCP and UDP go through: the NAT answers the
//! guest's ARP, ends each of its TCP connections in smoltcp and carries
//! the bytes over a host socket (`connection`), and carries each UDP
//! datagram over a host socket too (`udp`). No ICMP.

mod connection;
mod nat;
pub mod resolver;
mod udp;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

pub use nat::Nat;
use provm_vmm::network::Network;
use smoltcp::wire::{EthernetFrame, EthernetProtocol, Ipv4Packet};

/// The guest's address and its network's prefix length.
pub const GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
pub const PREFIX_LEN: u8 = 24;
/// The NAT's address: the guest's gateway, and the host's loopback.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// The gateway's MAC address (QEMU's user networking has this one too):
/// every frame the NAT sends the guest is from it.
const GATEWAY_MAC: [u8; 6] = [0x52, 0x55, 0x0a, 0x00, 0x02, 0x02];
/// The NAT's other address: the guest's resolver.
pub const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);

/// The kernel argument that tells the guest agent to bring its network
/// up: `provm.net=ADDRESS/PREFIX,GATEWAY,RESOLVER`. On the kernel command
/// line, it is recorded with the trace, and the booted guest's snapshot
/// (which has the interface up) is cached apart from the one without a
/// network.
pub fn kernel_arg() -> String {
    format!("provm.net={GUEST}/{PREFIX_LEN},{GATEWAY},{RESOLVER}")
}

/// The NAT a live run's or a recording's guest is connected to, its
/// resolver forwarding to `dns` (by default the host's). Its TCP initial
/// sequence numbers come from the host's clock: what the guest receives is
/// logged, so a replay needs no NAT and no seed.
pub fn nat(dns: Option<SocketAddr>) -> Box<dyn Network> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    let routes = Routes {
        resolver: dns.or_else(resolver::host_resolver),
    };
    Box::new(Nat::new(seed, routes))
}

/// One guest connection or UDP flow by its two ends: the guest's, and the
/// one it dialled.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Ends {
    guest: SocketAddrV4,
    dialled: SocketAddrV4,
}

/// Where the NAT carries what the guest sends to each address.
#[derive(Clone, Copy, Debug)]
pub struct Routes {
    /// Where the resolver's queries go; `None`: the host names none.
    resolver: Option<SocketAddr>,
}

impl Routes {
    /// The host's end for the guest's `dialled` one: the gateway is the
    /// host's loopback, the resolver's port 53 is the upstream resolver,
    /// multicast, broadcast and other addresses of the guest's own network
    /// have no host behind them (the reason, with what would fix it), and
    /// the rest are themselves.
    fn host_end(&self, dialled: SocketAddrV4) -> Result<SocketAddr, String> {
        let network = u32::MAX << (32 - PREFIX_LEN);
        match *dialled.ip() {
            GATEWAY => Ok(SocketAddrV4::new(Ipv4Addr::LOCALHOST, dialled.port()).into()),
            RESOLVER if dialled.port() == resolver::DNS_PORT => self.resolver.ok_or_else(|| {
                "the host's /etc/resolv.conf names no nameserver: give the guest's resolver one with --dns HOST:PORT".to_owned()
            }),
            RESOLVER => Err(format!(
                "{RESOLVER} answers DNS only, on port {}",
                resolver::DNS_PORT
            )),
            address if address.is_multicast() || address.is_broadcast() => {
                Err("multicast and broadcast stay inside the guest".to_owned())
            }
            address if u32::from(address) & network == u32::from(GUEST) & network => Err(format!(
                "of the guest's network only {GATEWAY}, the host, and {RESOLVER}, its resolver, answer"
            )),
            _ => Ok(dialled.into()),
        }
    }

    /// What would fix a failed connection to `dialled`, which was routed.
    fn fix(&self, dialled: SocketAddrV4) -> String {
        match *dialled.ip() {
            GATEWAY => format!(
                "start the server on the host first, listening on 127.0.0.1:{} (the guest's {GATEWAY} is the host's 127.0.0.1)",
                dialled.port()
            ),
            RESOLVER => format!(
                "the guest's resolver {RESOLVER} forwards to {}: that server must answer, or give another with --dns HOST:PORT",
                self.resolver.map_or("nobody".into(), |end| end.to_string())
            ),
            _ => "the host must be able to reach that address itself: provm's NAT connects from the host".to_owned(),
        }
    }
}

/// The IPv4 packet in the Ethernet `frame`, if it holds one.
fn ipv4_packet(frame: &[u8]) -> Option<Ipv4Packet<&[u8]>> {
    let ethernet = EthernetFrame::new_checked(frame).ok()?;
    if ethernet.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let payload = &frame[EthernetFrame::<&[u8]>::header_len()..];
    Ipv4Packet::new_checked(payload).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_is_the_hosts_loopback_the_resolver_its_dns_and_the_rest_of_the_subnet_is_nobody()
    {
        let dns: SocketAddr = "192.0.2.53:5353".parse().unwrap();
        let routes = Routes {
            resolver: Some(dns),
        };
        let end = |address: Ipv4Addr, port| routes.host_end(SocketAddrV4::new(address, port));
        assert_eq!(end(GATEWAY, 8080), Ok("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(end(RESOLVER, 53), Ok(dns));
        assert!(end(RESOLVER, 80).unwrap_err().contains("DNS only"));
        assert!(end(Ipv4Addr::new(10, 0, 2, 9), 80)
            .unwrap_err()
            .contains("only 10.0.2.2"));
        assert!(end(Ipv4Addr::new(224, 0, 0, 251), 5353)
            .unwrap_err()
            .contains("multicast"));
        let outside = Ipv4Addr::new(192, 0, 2, 1);
        assert_eq!(end(outside, 53), Ok("192.0.2.1:53".parse().unwrap()));
        let none = Routes { resolver: None };
        assert!(none
            .host_end(SocketAddrV4::new(RESOLVER, 53))
            .unwrap_err()
            .contains("--dns HOST:PORT"));
        assert_eq!(kernel_arg(), "provm.net=10.0.2.15/24,10.0.2.2,10.0.2.3");
    }
}
