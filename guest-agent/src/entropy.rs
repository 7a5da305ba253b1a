//! Host entropy into the guest kernel's random pool.
//!
//! Guests restored from one snapshot start with the same pool, and with the
//! TSC hidden the kernel gathers little entropy of its own; so each job
//! carries fresh bytes from the host (logged with the job when recording),
//! which the agent credits to the pool and then forces a reseed of the
//! generator behind /dev/urandom and getrandom().

use std::fs::File;
use std::os::fd::AsRawFd;

/// `_IOW('R', 0x03, int[2])`: add bytes to the pool and credit their bits.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the generator from the pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// The largest seed taken (the host sends 32 bytes).
const MAX_SEED: usize = 64;

/// `struct rand_pool_info` with room for the seed.
#[repr(C)]
struct PoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; MAX_SEED],
}

pub fn seed(bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    let len = bytes.len().min(MAX_SEED);
    let mut info = PoolInfo {
        entropy_count: (len * 8) as libc::c_int,
        buf_size: len as libc::c_int,
        buf: [0; MAX_SEED],
    };
    info.buf[..len].copy_from_slice(&bytes[..len]);
    let random = File::open("/dev/urandom")
        .map_err(|error| format!("cannot open /dev/urandom to seed it: {error}"))?;
    for (request, what) in [(RNDADDENTROPY, "add entropy"), (RNDRESEEDCRNG, "reseed")] {
        // SAFETY: both requests read at most a rand_pool_info with `len`
        // bytes of buffer, which `info` is and outlives the call.
        if unsafe { libc::ioctl(random.as_raw_fd(), request, &info) } < 0 {
            let error = std::io::Error::last_os_error();
            return Err(format!("cannot {what} in the guest's random pool: {error}"));
        }
    }
    Ok(())
}
