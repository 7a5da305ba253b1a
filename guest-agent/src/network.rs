//! The guest's network: the loopback interface always, and with `--net`
//! the network card, eth0, as the kernel command line's `provm.net=`
//! describes it. Without `--net` the VMM gives the guest no network card,
//! so programs that talk to themselves over 127.0.0.1 or ::1 work and
//! nothing leaves the VM. The kernel gives `lo` its addresses itself when
//! the interface comes up.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The network card's interface.
const CARD: &str = "eth0";

/// eth0's configuration: `provm.net=ADDRESS/PREFIX,GATEWAY[,RESOLVER]`.
#[derive(Debug, PartialEq, Eq)]
pub struct CardConfig {
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Ipv4Addr,
    /// The name server (traces recorded before it was given have none).
    pub resolver: Option<Ipv4Addr>,
}

impl CardConfig {
    /// The configuration on the kernel command line `cmdline`, if it has
    /// one; an argument that does not parse is an error naming it.
    pub fn from_cmdline(cmdline: &str) -> Result<Option<CardConfig>, String> {
        let Some(value) = cmdline
            .split_whitespace()
            .find_map(|arg| arg.strip_prefix("provm.net="))
        else {
            return Ok(None);
        };
        let parse = || -> Option<CardConfig> {
            let mut fields = value.split(',');
            let (address, prefix_len) = fields.next()?.split_once('/')?;
            let prefix_len = prefix_len.parse().ok().filter(|len| *len <= 32)?;
            let gateway = fields.next()?.parse().ok()?;
            let resolver = match fields.next() {
                Some(resolver) => Some(resolver.parse().ok()?),
                None => None,
            };
            fields.next().is_none().then_some(())?;
            Some(CardConfig {
                address: address.parse().ok()?,
                prefix_len,
                gateway,
                resolver,
            })
        };
        parse()
            .map(Some)
            .ok_or_else(|| format!("provm.net={value} is not ADDRESS/PREFIX,GATEWAY[,RESOLVER]"))
    }

    fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(
            u32::MAX
                .checked_shl(32 - u32::from(self.prefix_len))
                .unwrap_or(0),
        )
    }
}

/// Brings `lo` up (SIOCSIFFLAGS with IFF_UP, as `ip link set lo up` does).
pub fn bring_up_loopback() -> io::Result<()> {
    set_up(&control_socket()?, "lo")
}

/// Brings eth0 up as `config` says: its address and netmask, IPv4 only
/// (no IPv6 addresses, router solicitations or duplicate address checks
/// sending frames of their own), and a default route via the gateway; as
/// `ip addr add`, `ip link set up` and `ip route add default` do.
pub fn bring_up_card(config: &CardConfig) -> io::Result<()> {
    std::fs::write(format!("/proc/sys/net/ipv6/conf/{CARD}/disable_ipv6"), "1")?;
    let socket = control_socket()?;
    let mut request = interface_request(CARD);
    request.ifr_ifru.ifru_addr = socket_address(config.address);
    ioctl(&socket, libc::SIOCSIFADDR, &mut request)?;
    request.ifr_ifru.ifru_netmask = socket_address(config.netmask());
    ioctl(&socket, libc::SIOCSIFNETMASK, &mut request)?;
    set_up(&socket, CARD)?;
    // SAFETY: rtentry is plain data; zero is a valid starting value.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = socket_address(Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = socket_address(Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = socket_address(config.gateway);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    ioctl(&socket, libc::SIOCADDRT, &mut route)
}

/// A socket to configure interfaces through.
fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn interface_request(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; zero is a valid starting value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.as_bytes()) {
        *slot = *byte as libc::c_char;
    }
    request
}

/// Sets IFF_UP on interface `name`.
fn set_up(socket: &OwnedFd, name: &str) -> io::Result<()> {
    let mut request = interface_request(name);
    ioctl(socket, libc::SIOCGIFFLAGS, &mut request)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    ioctl(socket, libc::SIOCSIFFLAGS, &mut request)
}

/// An IPv4 address as the interface ioctls take it (port 0).
fn socket_address(address: Ipv4Addr) -> libc::sockaddr {
    let inet = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(address).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes of plain data, and
    // a sockaddr_in is what AF_INET ioctls read from a sockaddr.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(inet) }
}

/// An interface or route ioctl whose argument is `argument`.
fn ioctl<T>(socket: &OwnedFd, request: libc::c_ulong, argument: &mut T) -> io::Result<()> {
    // SAFETY: each caller passes the structure `request` reads and writes
    // (ifreq for SIOC*IF*, rtentry for SIOCADDRT), alive for the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), request, argument as *mut T) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_is_configured_from_the_command_line_or_not_at_all() {
        let config =
            CardConfig::from_cmdline("quiet provm.net=10.0.2.15/24,10.0.2.2,10.0.2.3 panic=-1")
                .unwrap()
                .unwrap();
        assert_eq!(
            config,
            CardConfig {
                address: Ipv4Addr::new(10, 0, 2, 15),
                prefix_len: 24,
                gateway: Ipv4Addr::new(10, 0, 2, 2),
                resolver: Some(Ipv4Addr::new(10, 0, 2, 3)),
            }
        );
        let without_resolver = CardConfig::from_cmdline("provm.net=10.0.2.15/24,10.0.2.2");
        assert_eq!(without_resolver.unwrap().unwrap().resolver, None);
        assert!(CardConfig::from_cmdline("provm.net=10.0.2.15/24,10.0.2.2,10.0.2.3,x").is_err());
        assert_eq!(config.netmask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(CardConfig::from_cmdline("quiet panic=-1"), Ok(None));
        assert!(CardConfig::from_cmdline("provm.net=10.0.2.15")
            .unwrap_err()
            .contains("provm.net=10.0.2.15"));
    }
}
