//! What `--inject` and `--fork-at` take: the fault a fork injects at the
//! VM boundary, and the point of the replay where it starts.

use std::fmt;
use std::str::FromStr;

use provm_engine::pinning::{self, PinningError};

const NS_PER_SECOND: i64 = 1_000_000_000;

/// A fault injected into a fork's live part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: the fork goes on as the recording did (a check of the fork
    /// itself, and of how deterministic the rest of the run is).
    None,
    /// The next virtio-blk read or write completes with an I/O error.
    DiskError,
    /// The guest's clock reads this much later (or earlier) from the fork on.
    Clock { shift_ns: i64 },
    /// The guest's entropy derives from this seed (as `--seed` takes it).
    Entropy { seed: String },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FaultError {
    #[error("unknown fault {0:?}: give none, disk-error, clock=+3600s or entropy=SEED (hex)")]
    Unknown(String),
    #[error("{0:?} is not a clock shift: give a signed number of seconds, minutes or hours, e.g. clock=+3600s, clock=-90m, clock=+2h")]
    Clock(String),
    #[error("entropy={0}")]
    Seed(PinningError),
    #[error("{0:?} is not a fork point: give an event number (see `provm query`), disk-write:N or disk-read:N (the Nth, from 1)")]
    Point(String),
}

impl FromStr for Fault {
    type Err = FaultError;

    fn from_str(text: &str) -> Result<Self, FaultError> {
        match text.split_once('=') {
            None if text == "none" => Ok(Fault::None),
            None if text == "disk-error" => Ok(Fault::DiskError),
            Some(("clock", shift)) => parse_shift(shift)
                .map(|shift_ns| Fault::Clock { shift_ns })
                .ok_or_else(|| FaultError::Clock(text.to_owned())),
            Some(("entropy", seed)) => {
                pinning::parse_seed(seed).map_err(FaultError::Seed)?;
                Ok(Fault::Entropy {
                    seed: seed.to_owned(),
                })
            }
            _ => Err(FaultError::Unknown(text.to_owned())),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::None => f.write_str("none"),
            Fault::DiskError => f.write_str("disk-error"),
            Fault::Clock { shift_ns } => write!(f, "clock={:+}s", shift_ns / NS_PER_SECOND),
            Fault::Entropy { seed } => write!(f, "entropy={seed}"),
        }
    }
}

/// `+3600s`, `-90m`, `2h`: a whole number of seconds, minutes or hours,
/// in nanoseconds.
fn parse_shift(text: &str) -> Option<i64> {
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => (1, text),
    };
    let unit = match rest.chars().last()? {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        _ => return None,
    };
    let digits = &rest[..rest.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let count: i64 = digits.parse().ok()?;
    count.checked_mul(unit * NS_PER_SECOND).map(|ns| sign * ns)
}

/// Where a fork leaves the replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkPoint {
    /// Before the log's event with this index (from 0).
    Event(u64),
    /// At the VM exit that submits the Nth disk write of the log (from 1).
    DiskWrite(u64),
    /// At the Nth disk read (from 1): reads are not logged, so the fork
    /// counts them as the replay makes them.
    DiskRead(u64),
}

impl FromStr for ForkPoint {
    type Err = FaultError;

    fn from_str(text: &str) -> Result<Self, FaultError> {
        let error = || FaultError::Point(text.to_owned());
        let number = |digits: &str| digits.parse::<u64>().map_err(|_| error());
        let nth =
            |digits: &str| number(digits).and_then(|n| (n > 0).then_some(n).ok_or_else(error));
        match text.split_once(':') {
            None => number(text).map(ForkPoint::Event),
            Some(("disk-write", n)) => nth(n).map(ForkPoint::DiskWrite),
            Some(("disk-read", n)) => nth(n).map(ForkPoint::DiskRead),
            _ => Err(error()),
        }
    }
}

impl fmt::Display for ForkPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForkPoint::Event(n) => write!(f, "event {n}"),
            ForkPoint::DiskWrite(n) => write!(f, "disk-write:{n}"),
            ForkPoint::DiskRead(n) => write!(f, "disk-read:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_print_as_given() {
        for text in [
            "none",
            "disk-error",
            "clock=+3600s",
            "clock=-60s",
            "entropy=5eed",
        ] {
            assert_eq!(text.parse::<Fault>().unwrap().to_string(), text);
        }
        assert_eq!(
            "clock=2h".parse::<Fault>(),
            Ok(Fault::Clock {
                shift_ns: 7200 * NS_PER_SECOND
            })
        );
    }

    #[test]
    fn bad_faults_are_named() {
        assert!(matches!(
            "disk-eror".parse::<Fault>(),
            Err(FaultError::Unknown(_))
        ));
        assert!(matches!(
            "clock".parse::<Fault>(),
            Err(FaultError::Unknown(_))
        ));
        for shift in [
            "clock=",
            "clock=+",
            "clock=3600",
            "clock=+1.5h",
            "clock=+s",
            "clock=++3s",
        ] {
            assert!(
                matches!(shift.parse::<Fault>(), Err(FaultError::Clock(_))),
                "{shift}"
            );
        }
        assert!(matches!(
            "entropy=xyz".parse::<Fault>(),
            Err(FaultError::Seed(_))
        ));
    }

    #[test]
    fn fork_points_parse() {
        assert_eq!("0".parse(), Ok(ForkPoint::Event(0)));
        assert_eq!("disk-write:3".parse(), Ok(ForkPoint::DiskWrite(3)));
        assert_eq!("disk-read:1".parse(), Ok(ForkPoint::DiskRead(1)));
        for bad in ["", "-1", "disk-write:0", "disk-write:", "disk:3", "12x"] {
            assert!(bad.parse::<ForkPoint>().is_err(), "{bad}");
        }
    }
}
