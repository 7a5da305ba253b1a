//! The guest's UDP datagrams, carried over host sockets: one connected
//! host socket per pair of guest and dialled ends (a flow), whose answers
//! come back to the guest as from the end it dialled. smoltcp sees none of
//! them: it would answer datagrams to its own addresses with ICMP "port
//! unreachable".

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use provm_vmm::devices::virtio::net::MTU;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpProtocol, Ipv4Packet,
    Ipv4Repr, UdpPacket, UdpRepr,
};

use super::connection::Interest;
use super::{ipv4_packet, Ends, Routes, GATEWAY_MAC};
use crate::notice;

/// A flow the guest has not used for this long is closed (as a NAT's
/// mapping times out); DNS's last about one round trip.
const IDLE: Duration = Duration::from_secs(60);
/// The largest datagram the host may send: what fits the guest's MTU.
const MAX_PAYLOAD: usize = MTU as usize - 20 - 8;

/// A datagram the guest sent.
pub struct Datagram<'a> {
    ends: Ends,
    guest_mac: EthernetAddress,
    payload: &'a [u8],
}

/// The UDP datagram in `frame`, if it holds a whole one (fragments are not
/// reassembled: the guest's MTU is 64 KiB).
pub fn datagram(frame: &[u8]) -> Option<Datagram<'_>> {
    let ip = ipv4_packet(frame)?;
    if ip.next_header() != IpProtocol::Udp || ip.more_frags() || ip.frag_offset() != 0 {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let offset = EthernetFrame::<&[u8]>::header_len() + usize::from(ip.header_len());
    let end = EthernetFrame::<&[u8]>::header_len() + usize::from(ip.total_len());
    let udp = UdpPacket::new_checked(frame.get(offset..end)?).ok()?;
    let payload_range = offset + 8..offset + usize::from(udp.len());
    Some(Datagram {
        ends: Ends {
            guest: SocketAddrV4::new(src, udp.src_port()),
            dialled: SocketAddrV4::new(dst, udp.dst_port()),
        },
        guest_mac: EthernetFrame::new_unchecked(frame).src_addr(),
        payload: frame.get(payload_range)?,
    })
}

struct Flow {
    ends: Ends,
    guest_mac: EthernetAddress,
    host: UdpSocket,
    last_used: Instant,
}

/// The guest's UDP flows.
#[derive(Default)]
pub struct Udp {
    flows: Vec<Flow>,
    /// Dialled ends said to be unreachable, each said once.
    refused: Vec<SocketAddrV4>,
}

impl Udp {
    /// Sends the guest's `datagram` on to the host's end of its flow, which
    /// is opened first if it is new.
    pub fn send(&mut self, datagram: Datagram<'_>, routes: &Routes) {
        let index = match self
            .flows
            .iter()
            .position(|flow| flow.ends == datagram.ends)
        {
            Some(index) => index,
            None => match open(datagram.ends.dialled, routes) {
                Ok(host) => {
                    self.flows.push(Flow {
                        ends: datagram.ends,
                        guest_mac: datagram.guest_mac,
                        host,
                        last_used: Instant::now(),
                    });
                    self.flows.len() - 1
                }
                Err(reason) => {
                    let dialled = datagram.ends.dialled;
                    if !self.refused.contains(&dialled) {
                        self.refused.push(dialled);
                        notice!("network: the guest's datagrams to {dialled} go nowhere: {reason}");
                    }
                    return;
                }
            },
        };
        let flow = &mut self.flows[index];
        flow.last_used = Instant::now();
        if let Err(error) = flow.host.send(datagram.payload) {
            tracing::debug!("a datagram to {} was not sent: {error}", flow.ends.dialled);
        }
    }

    /// Moves every datagram the host has for the guest into `to_guest`,
    /// and closes the flows gone idle.
    pub fn pump(&mut self, to_guest: &mut VecDeque<Vec<u8>>) {
        let mut buffer = vec![0u8; 64 * 1024];
        for flow in &mut self.flows {
            loop {
                match flow.host.recv(&mut buffer) {
                    Ok(len) if len <= MAX_PAYLOAD => {
                        flow.last_used = Instant::now();
                        to_guest.push_back(frame(flow, &buffer[..len]));
                    }
                    Ok(len) => tracing::debug!("a {len}-byte datagram exceeds the guest's MTU"),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    // An ICMP error for an earlier datagram (nobody listening).
                    Err(error) => tracing::debug!("{}: {error}", flow.ends.dialled),
                }
            }
        }
        self.flows.retain(|flow| flow.last_used.elapsed() < IDLE);
    }

    /// What the halted guest's wait polls: each flow's datagrams.
    pub fn interests(&self) -> impl Iterator<Item = Interest> + '_ {
        self.flows.iter().map(|flow| Interest {
            fd: flow.host.as_raw_fd(),
            readable: true,
            writable: false,
        })
    }
}

/// A nonblocking host socket connected to the host's end for `dialled`.
fn open(dialled: SocketAddrV4, routes: &Routes) -> Result<UdpSocket, String> {
    let host_end = routes.host_end(dialled)?;
    let any: SocketAddr = match host_end {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any)
        .and_then(|socket| socket.connect(host_end).map(|()| socket))
        .and_then(|socket| socket.set_nonblocking(true).map(|()| socket))
        .map_err(|error| format!("cannot open a socket to {host_end}: {error}"))?;
    Ok(socket)
}

/// The Ethernet frame that brings `payload` to the guest's end of `flow`
/// from the end it dialled.
fn frame(flow: &Flow, payload: &[u8]) -> Vec<u8> {
    let checksums = ChecksumCapabilities::default();
    let udp = UdpRepr {
        src_port: flow.ends.dialled.port(),
        dst_port: flow.ends.guest.port(),
    };
    let ip = Ipv4Repr {
        src_addr: *flow.ends.dialled.ip(),
        dst_addr: *flow.ends.guest.ip(),
        next_header: IpProtocol::Udp,
        payload_len: udp.header_len() + payload.len(),
        hop_limit: 64,
    };
    let ethernet = EthernetRepr {
        src_addr: EthernetAddress(GATEWAY_MAC),
        dst_addr: flow.guest_mac,
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut bytes = vec![0u8; ethernet.buffer_len() + ip.buffer_len() + ip.payload_len];
    let mut frame = EthernetFrame::new_unchecked(&mut bytes[..]);
    ethernet.emit(&mut frame);
    let mut packet = Ipv4Packet::new_unchecked(frame.payload_mut());
    ip.emit(&mut packet, &checksums);
    udp.emit(
        &mut UdpPacket::new_unchecked(packet.payload_mut()),
        &ip.src_addr.into(),
        &ip.dst_addr.into(),
        payload.len(),
        |room| room.copy_from_slice(payload),
        &checksums,
    );
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_vmm::devices::virtio::net::GUEST_MAC;

    /// A datagram made into a frame for the guest reads back as the same
    /// datagram with its ends swapped: what the guest's answer looks like.
    #[test]
    fn a_frame_to_the_guest_reads_back_as_the_datagram() {
        let host = UdpSocket::bind("127.0.0.1:0").unwrap();
        let flow = Flow {
            ends: Ends {
                guest: "10.0.2.15:40000".parse().unwrap(),
                dialled: "10.0.2.3:53".parse().unwrap(),
            },
            guest_mac: EthernetAddress(GUEST_MAC),
            host,
            last_used: Instant::now(),
        };
        let bytes = frame(&flow, b"answer");
        let read = datagram(&bytes).unwrap();
        assert_eq!(read.ends.guest, flow.ends.dialled);
        assert_eq!(read.ends.dialled, flow.ends.guest);
        assert_eq!(read.guest_mac, EthernetAddress(GATEWAY_MAC));
        assert_eq!(read.payload, b"answer");
        let ip = ipv4_packet(&bytes).unwrap();
        assert!(ip.verify_checksum());
        let udp = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(udp.verify_checksum(&ip.src_addr().into(), &ip.dst_addr().into()));
    }

    /// A datagram to the resolver goes to the upstream server, and its
    /// answer comes back to the guest as from the resolver.
    #[test]
    fn a_query_to_the_resolver_is_answered_as_from_it() {
        let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
        let routes = Routes {
            resolver: Some(upstream.local_addr().unwrap()),
        };
        let query = Flow {
            ends: Ends {
                guest: "10.0.2.3:53".parse().unwrap(),
                dialled: "10.0.2.15:40000".parse().unwrap(),
            },
            guest_mac: EthernetAddress(GATEWAY_MAC),
            host: UdpSocket::bind("127.0.0.1:0").unwrap(),
            last_used: Instant::now(),
        };
        // The frame the guest sends: from its port 40000 to 10.0.2.3:53.
        let sent = frame(&query, b"query");
        let mut udp = Udp::default();
        udp.send(datagram(&sent).unwrap(), &routes);
        let mut buffer = [0u8; 16];
        let (len, from) = upstream.recv_from(&mut buffer).unwrap();
        assert_eq!(&buffer[..len], b"query");
        upstream.send_to(b"answer", from).unwrap();
        let mut to_guest = VecDeque::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while to_guest.is_empty() && Instant::now() < deadline {
            udp.pump(&mut to_guest);
        }
        let answer = datagram(&to_guest[0]).unwrap();
        assert_eq!(answer.ends.guest, "10.0.2.3:53".parse().unwrap());
        assert_eq!(answer.ends.dialled, "10.0.2.15:40000".parse().unwrap());
        assert_eq!(answer.payload, b"answer");
    }
}
