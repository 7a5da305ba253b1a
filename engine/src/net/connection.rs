//! One guest TCP connection carried over a host socket: the bytes between
//! the guest's end (a smoltcp socket) and the host's (a nonblocking
//! `TcpStream`), and the connect that comes first.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;

/// How long the host may take to answer a connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes moved from the host socket at once.
const CHUNK: usize = 64 * 1024;

/// A host connect under way: std's connect blocks, so it runs on a thread
/// of its own while the guest runs on.
pub struct Connecting {
    result: Receiver<io::Result<TcpStream>>,
}

impl Connecting {
    pub fn start(to: SocketAddr) -> Connecting {
        let (sender, result) = mpsc::channel();
        std::thread::spawn(move || {
            let connected = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT);
            let _ = sender.send(connected);
        });
        Connecting { result }
    }

    /// The connect's result, once it has one.
    pub fn finished(&self) -> Option<io::Result<TcpStream>> {
        match self.result.try_recv() {
            Ok(result) => Some(result),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                Some(Err(io::Error::other("the connect thread died")))
            }
        }
    }
}

/// A connection whose host side is connected.
pub struct Connection {
    pub socket: SocketHandle,
    host: TcpStream,
    /// The host closed its side: the guest's gets a FIN once its bytes are sent.
    host_closed: bool,
    /// The guest closed its side, and the host's write side was shut.
    guest_closed: bool,
    /// The guest's side has left Listen: smoltcp puts a socket reset while
    /// opening back there, which for a connection of its own is its end.
    opened: bool,
}

/// What the poll of the host socket should wait for.
pub struct Interest {
    pub fd: i32,
    pub readable: bool,
    pub writable: bool,
}

impl Connection {
    pub fn new(socket: SocketHandle, host: TcpStream) -> io::Result<Connection> {
        host.set_nonblocking(true)?;
        // The guest's stack already gathers its writes.
        host.set_nodelay(true)?;
        Ok(Connection {
            socket,
            host,
            host_closed: false,
            guest_closed: false,
            opened: false,
        })
    }

    /// Moves what can be moved both ways without blocking. A host error
    /// resets the guest's connection.
    pub fn pump(&mut self, socket: &mut tcp::Socket<'_>) {
        self.opened |= socket.state() != tcp::State::Listen;
        if let Err(error) = self
            .carry_to_host(socket)
            .and_then(|()| self.carry_to_guest(socket))
        {
            tracing::debug!("a proxied connection failed: {error}");
            socket.abort();
        }
    }

    fn carry_to_host(&mut self, socket: &mut tcp::Socket<'_>) -> io::Result<()> {
        while socket.can_recv() {
            let written = socket
                .recv(|data| match self.host.write(data) {
                    Ok(len) => (len, Ok(len)),
                    Err(error) => (0, Err(error)),
                })
                .map_err(io::Error::other)?;
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
        // The guest sent its FIN (not: the connection is still opening).
        let fin_received = matches!(
            socket.state(),
            tcp::State::CloseWait
                | tcp::State::LastAck
                | tcp::State::Closing
                | tcp::State::TimeWait
        );
        if !self.guest_closed && fin_received && socket.recv_queue() == 0 {
            self.guest_closed = true;
            self.host.shutdown(Shutdown::Write)?;
        }
        Ok(())
    }

    fn carry_to_guest(&mut self, socket: &mut tcp::Socket<'_>) -> io::Result<()> {
        let mut buffer = [0u8; CHUNK];
        while !self.host_closed && socket.may_send() {
            let room = socket.send_capacity() - socket.send_queue();
            if room == 0 {
                break;
            }
            match self.host.read(&mut buffer[..room.min(CHUNK)]) {
                Ok(0) => {
                    self.host_closed = true;
                    socket.close();
                }
                Ok(len) => {
                    socket
                        .send_slice(&buffer[..len])
                        .map_err(io::Error::other)?;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// What to wait for on the host socket: bytes to read while the guest's
    /// side has room, room to write while the guest's bytes wait.
    pub fn interest(&self, socket: &tcp::Socket<'_>) -> Interest {
        Interest {
            fd: self.host.as_raw_fd(),
            readable: !self.host_closed
                && socket.may_send()
                && socket.send_queue() < socket.send_capacity(),
            writable: socket.recv_queue() > 0,
        }
    }

    /// Whether the guest's side is over, and the host socket can go.
    pub fn finished(&self, socket: &tcp::Socket<'_>) -> bool {
        match socket.state() {
            tcp::State::Closed | tcp::State::TimeWait => true,
            tcp::State::Listen => self.opened,
            _ => false,
        }
    }
}
