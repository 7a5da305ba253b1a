//! The guest's only network: the loopback interface. The kernel has IPv4
//! and IPv6 but no network device drivers, so programs that talk to
//! themselves over 127.0.0.1 or ::1 work and nothing leaves the VM. The
//! kernel gives `lo` its addresses itself when the interface comes up.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Brings `lo` up (SIOCSIFFLAGS with IFF_UP, as `ip link set lo up` does).
pub fn bring_up_loopback() -> io::Result<()> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zero is a valid starting value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: the request names an interface and has room for its flags.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above, with the flags to set.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
