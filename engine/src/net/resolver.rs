//! Where the guest's resolver forwards its queries: the host's own (the
//! first nameserver of the host's /etc/resolv.conf), or the server that
//! `--dns HOST:PORT` names.

use std::net::{IpAddr, SocketAddr};

/// The port DNS servers answer on.
pub const DNS_PORT: u16 = 53;
/// Where the host's resolver is configured.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

/// `--dns`'s value: an IP address and a port, as 127.0.0.1:5353 or
/// [::1]:53.
pub fn parse_dns(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| {
        format!("{value:?} is not HOST:PORT with HOST an IP address, as 127.0.0.1:5353 or [::1]:53")
    })
}

/// The resolver the host uses itself, if its /etc/resolv.conf names one.
pub fn host_resolver() -> Option<SocketAddr> {
    first_nameserver(&std::fs::read_to_string(HOST_RESOLV_CONF).ok()?)
}

/// The first `nameserver` of resolv.conf text that is an address the host
/// can reach as it is (a link-local IPv6 one with its %interface is not).
fn first_nameserver(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.parse::<IpAddr>().ok())
            .flatten()
            .map(|address| SocketAddr::new(address, DNS_PORT))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_usable_nameserver_is_the_hosts_resolver() {
        let text = "# generated\nsearch example.org\nnameserver fe80::1%eth0\n\
                    nameserver 127.0.0.53\nnameserver 192.0.2.1\n";
        assert_eq!(
            first_nameserver(text),
            Some("127.0.0.53:53".parse().unwrap())
        );
        assert_eq!(
            first_nameserver("nameserver ::1"),
            Some("[::1]:53".parse().unwrap())
        );
        assert_eq!(first_nameserver("search example.org\n"), None);
    }

    #[test]
    fn dns_takes_an_address_and_a_port() {
        assert_eq!(
            parse_dns("127.0.0.1:5353"),
            Ok("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(parse_dns("[::1]:53"), Ok("[::1]:53".parse().unwrap()));
        for bad in ["127.0.0.1", "localhost:53", "127.0.0.1:port", ""] {
            assert!(
                parse_dns(bad).unwrap_err().contains("is not HOST:PORT"),
                "{bad}"
            );
        }
    }
}
