//! The user-mode NAT: smoltcp is the guest's peer on its Ethernet (the
//! gateway's and the resolver's ARP, IPv4, TCP), each guest TCP connection
//! is carried over a host socket (`connection`), and so is each UDP flow
//! (`udp`), past smoltcp.
//!
//! smoltcp has no NAT: it accepts a connection only on a socket listening
//! for it. So the NAT looks at each frame the guest sends, and holds a SYN
//! for a new connection until the host's connect has succeeded, then opens
//! a socket listening on exactly the address and port the guest dialled
//! and lets smoltcp take the SYN; if the connect failed, smoltcp takes it
//! with no socket listening and answers with a reset, which the guest's
//! program reports as "connection refused".
//!
//! It runs on the vCPU thread, as the seam asks: `send` and `receive` at
//! VM exits, `wait_for_frame` while the guest is halted.

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use provm_vmm::devices::virtio::net::MAX_FRAME;
use provm_vmm::network::Network;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as NetInstant;
use smoltcp::wire::{
    EthernetAddress, HardwareAddress, IpCidr, IpListenEndpoint, IpProtocol, TcpPacket,
};

use super::connection::{Connecting, Connection, Interest};
use super::udp::{self, Udp};
use super::{ipv4_packet, Ends, Routes, GATEWAY, GATEWAY_MAC, PREFIX_LEN, RESOLVER};
use crate::notice;
/// Each connection's buffers in the NAT: the guest's unread bytes, and the
/// host's bytes not yet acknowledged by the guest.
const GUEST_TO_HOST_BUFFER: usize = 256 * 1024;
const HOST_TO_GUEST_BUFFER: usize = 1024 * 1024;
/// While the guest runs, the NAT does its host-side work at most this
/// often (the seam asks at every VM exit), and at once after the guest sent.
const PUMP_INTERVAL: Duration = Duration::from_micros(200);
/// How often a halted guest's wait looks at connects under way.
const CONNECT_POLL: Duration = Duration::from_millis(1);

/// A guest SYN held while the host connects.
struct Held {
    ends: Ends,
    syn: Vec<u8>,
    connecting: Connecting,
}

pub struct Nat {
    iface: Interface,
    frames: Frames,
    sockets: SocketSet<'static>,
    connections: Vec<(Ends, Connection)>,
    held: Vec<Held>,
    udp: Udp,
    routes: Routes,
    epoch: Instant,
    last_pump: Instant,
}

impl Nat {
    /// A NAT whose TCP initial sequence numbers come from `seed`, taking
    /// what the guest sends where `routes` say.
    pub fn new(seed: u64, routes: Routes) -> Nat {
        let mut frames = Frames::default();
        let epoch = Instant::now();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(GATEWAY_MAC)));
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut frames, NetInstant::from_micros(0));
        iface.update_ip_addrs(|addresses| {
            for address in [GATEWAY, RESOLVER] {
                addresses
                    .push(IpCidr::new(address.into(), PREFIX_LEN))
                    .expect("room for two addresses");
            }
        });
        // Every address the guest dials is the NAT's (each connection gets
        // a socket listening on exactly its own).
        iface.set_any_ip(true);
        Nat {
            iface,
            frames,
            sockets: SocketSet::new(Vec::new()),
            connections: Vec::new(),
            held: Vec::new(),
            udp: Udp::default(),
            routes,
            epoch,
            last_pump: epoch,
        }
    }

    fn now(&self) -> NetInstant {
        NetInstant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// Everything the NAT does on the host's side: connects that finished,
    /// the guest's frames, the bytes of every connection, what smoltcp
    /// sends the guest in return, and the datagrams the host has for it.
    fn pump(&mut self) {
        self.last_pump = Instant::now();
        self.finish_connects();
        self.udp.pump(&mut self.frames.to_guest);
        let now = self.now();
        self.iface.poll(now, &mut self.frames, &mut self.sockets);
        for (_, connection) in &mut self.connections {
            connection.pump(self.sockets.get_mut::<tcp::Socket>(connection.socket));
        }
        let now = self.now();
        self.iface.poll(now, &mut self.frames, &mut self.sockets);
        let sockets = &mut self.sockets;
        self.connections.retain(|(_, connection)| {
            let done = connection.finished(sockets.get::<tcp::Socket>(connection.socket));
            if done {
                sockets.remove(connection.socket);
            }
            !done
        });
    }

    /// Opens the guest's side of each connection whose host side is
    /// connected, and lets its SYN through; a failed connect's SYN goes
    /// through with nothing listening, so smoltcp resets it.
    fn finish_connects(&mut self) {
        let mut index = 0;
        while index < self.held.len() {
            let Some(result) = self.held[index].connecting.finished() else {
                index += 1;
                continue;
            };
            let held = self.held.swap_remove(index);
            let connected = result.and_then(|host| {
                let socket = self.listen(held.ends.dialled);
                let connection = Connection::new(socket, host);
                if connection.is_err() {
                    self.sockets.remove(socket);
                }
                connection
            });
            match connected {
                Ok(connection) => self.connections.push((held.ends, connection)),
                Err(error) => {
                    let dialled = held.ends.dialled;
                    notice!(
                        "network: the guest's connection to {dialled} failed ({error}): {}",
                        self.routes.fix(dialled)
                    );
                }
            }
            self.frames.from_guest.push_back(held.syn);
        }
    }

    /// A socket listening on `dialled`, for one connection.
    fn listen(&mut self, dialled: SocketAddrV4) -> smoltcp::iface::SocketHandle {
        let mut socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; GUEST_TO_HOST_BUFFER]),
            tcp::SocketBuffer::new(vec![0; HOST_TO_GUEST_BUFFER]),
        );
        // The host's stack already gathered the bytes: no waiting for more.
        socket.set_nagle_enabled(false);
        socket
            .listen(IpListenEndpoint {
                addr: Some((*dialled.ip()).into()),
                port: dialled.port(),
            })
            .expect("a fresh socket listens on a non-zero port");
        self.sockets.add(socket)
    }

    /// A SYN opening a connection the NAT does not have: held while the
    /// host connects. Its retransmissions meanwhile are dropped.
    fn hold_syn(&mut self, ends: Ends, frame: &[u8]) {
        if self.held.iter().any(|held| held.ends == ends) {
            return;
        }
        let host = match self.routes.host_end(ends.dialled) {
            Ok(host) => host,
            Err(reason) => {
                // Nobody there: smoltcp resets it.
                notice!(
                    "network: the guest's connection to {} failed: {reason}",
                    ends.dialled
                );
                self.frames.from_guest.push_back(frame.to_vec());
                return;
            }
        };
        self.held.push(Held {
            ends,
            syn: frame.to_vec(),
            connecting: Connecting::start(host),
        });
    }

    /// What the halted guest's wait polls on the host.
    fn interests(&self) -> Vec<Interest> {
        self.connections
            .iter()
            .map(|(_, connection)| {
                connection.interest(self.sockets.get::<tcp::Socket>(connection.socket))
            })
            .chain(self.udp.interests())
            .collect()
    }
}

impl Network for Nat {
    fn send(&mut self, frame: &[u8]) {
        if let Some(datagram) = udp::datagram(frame) {
            return self.udp.send(datagram, &self.routes);
        }
        match new_connection(frame) {
            Some(ends) if !self.connections.iter().any(|(known, _)| *known == ends) => {
                self.hold_syn(ends, frame)
            }
            _ => self.frames.from_guest.push_back(frame.to_vec()),
        }
    }

    fn receive(&mut self) -> Option<Vec<u8>> {
        if !self.frames.from_guest.is_empty() || self.last_pump.elapsed() >= PUMP_INTERVAL {
            self.pump();
        }
        self.frames.to_guest.pop_front()
    }

    fn wait_for_frame(&mut self, until: Instant) -> bool {
        loop {
            self.pump();
            if !self.frames.to_guest.is_empty() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let mut timeout = until - now;
            if let Some(delay) = self.iface.poll_delay(self.now(), &self.sockets) {
                timeout = timeout.min(delay.into());
            }
            if !self.held.is_empty() {
                timeout = timeout.min(CONNECT_POLL);
            }
            wait_for_host(&self.interests(), timeout);
        }
    }
}

/// The two ends of the TCP connection that `frame` opens, if it is a SYN.
fn new_connection(frame: &[u8]) -> Option<Ends> {
    let ip = ipv4_packet(frame)?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    (tcp.syn() && !tcp.ack()).then(|| Ends {
        guest: SocketAddrV4::new(ip.src_addr(), tcp.src_port()),
        dialled: SocketAddrV4::new(ip.dst_addr(), tcp.dst_port()),
    })
}

/// Waits up to `timeout` for one of the host sockets to be ready.
fn wait_for_host(interests: &[Interest], timeout: Duration) {
    let mut fds: Vec<libc::pollfd> = interests
        .iter()
        .filter(|interest| interest.readable || interest.writable)
        .map(|interest| libc::pollfd {
            fd: interest.fd,
            events: if interest.readable { libc::POLLIN } else { 0 }
                | if interest.writable { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    // Rounded up: a wait of 0 ms would spin until the deadline.
    let millis = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a live array of `fds.len()` pollfd structures that
    // poll(2) only reads and writes within.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
}

/// smoltcp's device: the frames between it and the guest's network card.
#[derive(Default)]
struct Frames {
    from_guest: VecDeque<Vec<u8>>,
    to_guest: VecDeque<Vec<u8>>,
}

impl Device for Frames {
    type RxToken<'a> = Received;
    type TxToken<'a> = Sent<'a>;

    fn receive(&mut self, _: NetInstant) -> Option<(Received, Sent<'_>)> {
        let frame = self.from_guest.pop_front()?;
        Some((Received(frame), Sent(&mut self.to_guest)))
    }

    fn transmit(&mut self, _: NetInstant) -> Option<Sent<'_>> {
        Some(Sent(&mut self.to_guest))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut capabilities = DeviceCapabilities::default();
        capabilities.medium = Medium::Ethernet;
        capabilities.max_transmission_unit = MAX_FRAME;
        capabilities
    }
}

struct Received(Vec<u8>);

impl phy::RxToken for Received {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

struct Sent<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::TxToken for Sent<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0; len];
        let result = f(&mut frame);
        self.0.push_back(frame);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_vmm::devices::virtio::net::GUEST_MAC;
    use smoltcp::wire::Ipv4Packet;

    /// The guest MAC the NAT answers is the card's.
    #[test]
    fn a_syn_is_recognised_by_its_ends() {
        let syn: [u8; 54] = {
            let mut frame = [0u8; 54];
            frame[..6].copy_from_slice(&GATEWAY_MAC);
            frame[6..12].copy_from_slice(&GUEST_MAC);
            frame[12..14].copy_from_slice(&[0x08, 0x00]);
            let ip = &mut frame[14..34];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&40u16.to_be_bytes());
            ip[8] = 64;
            ip[9] = 6;
            ip[12..16].copy_from_slice(&[10, 0, 2, 15]);
            ip[16..20].copy_from_slice(&[10, 0, 2, 2]);
            let mut packet = Ipv4Packet::new_unchecked(&mut frame[14..34]);
            packet.fill_checksum();
            let tcp = &mut frame[34..54];
            tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
            tcp[2..4].copy_from_slice(&8080u16.to_be_bytes());
            tcp[12] = 5 << 4;
            tcp[13] = 0x02;
            frame
        };
        let ends = new_connection(&syn).unwrap();
        assert_eq!(ends.guest, "10.0.2.15:40000".parse().unwrap());
        assert_eq!(ends.dialled, "10.0.2.2:8080".parse().unwrap());
        let mut ack = syn;
        ack[34 + 13] = 0x12;
        assert!(new_connection(&ack).is_none());
    }
}
