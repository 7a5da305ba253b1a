//! `--pinned`: the inputs a run takes from the host, fixed. Guest time is
//! logical (a fixed epoch, advanced by the guest's own progress: see
//! `provm_vmm::clock::PinnedClock`) and the guest's entropy derives from a
//! seed, so that two pinned runs of a command on an image are the same run.

use sha2::{Digest, Sha256};

use crate::utc::days_from_civil;

/// The default epoch, 2000-01-01T00:00:00Z.
pub const DEFAULT_EPOCH_NS: u64 = 946_684_800 * NS_PER_SECOND;
const NS_PER_SECOND: u64 = 1_000_000_000;
/// A seed is a number of up to 256 bits.
const SEED_BYTES: usize = 32;
/// Keeps the entropy of a seed apart from any other use of its hash.
const ENTROPY_DOMAIN: &[u8] = b"provm pinned entropy v1\0";

/// The fixed inputs of a pinned run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinning {
    /// Big-endian, zero-padded: `0`, `00` and `0x0` are one seed.
    pub seed: [u8; SEED_BYTES],
    /// The guest's wall-clock time when the command starts.
    pub epoch_ns: u64,
    /// How far each VM exit advances guest time.
    pub exit_step_ns: u64,
}

impl Default for Pinning {
    fn default() -> Self {
        Pinning {
            seed: [0; SEED_BYTES],
            epoch_ns: DEFAULT_EPOCH_NS,
            exit_step_ns: provm_vmm::clock::PINNED_EXIT_STEP_NS,
        }
    }
}

impl Pinning {
    /// The 32 bytes of entropy the guest gets: SHA-256 of the seed.
    pub fn entropy(&self) -> Vec<u8> {
        let mut hash = Sha256::new();
        hash.update(ENTROPY_DOMAIN);
        hash.update(self.seed);
        hash.finalize().to_vec()
    }

    /// This pinning with its exit step drawn from chaos seed `seed` (`record
    /// --chaos`, `repro --chaos-runs`): from a quarter of the step to twice
    /// it, in eighths. The VMM's vCPU schedule alone cannot move where the
    /// guest's own scheduler switches threads: that follows the guest's
    /// ticks, which a pinned clock places by exits counted, so with some
    /// booted snapshots every seed ran the threads in the same order. A
    /// seed's step moves the ticks and so the timeslices, counted in
    /// exits, as rr's chaos mode varies its timeslices. The seed times the
    /// golden ratio picks the step, so that consecutive seeds, as `repro`
    /// runs them, spread over the range rather than repeat a step.
    pub fn with_chaos_step(mut self, seed: u64) -> Pinning {
        const GOLDEN_RATIO_FRACTION: u64 = 0x9e37_79b9_7f4a_7c15;
        let fraction = seed.wrapping_mul(GOLDEN_RATIO_FRACTION);
        let eighths = 2 + ((u128::from(fraction) * 15) >> 64) as u64;
        self.exit_step_ns = self.exit_step_ns * eighths / 8;
        self
    }

    /// The seed as `--seed` takes it (shortest hex).
    pub fn seed_hex(&self) -> String {
        let hex = provm_trace::hex(&self.seed);
        let digits = hex.trim_start_matches('0');
        if digits.is_empty() { "0" } else { digits }.to_owned()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PinningError {
    #[error(
        "{0:?} is not a hex seed ({1}); give up to 64 hex digits, e.g. --seed 0 or --seed 5eed"
    )]
    Seed(String, String),
    #[error("{0:?} is not a time ({1}); give RFC 3339 UTC or with an offset (2000-01-01T00:00:00Z, 2024-05-01T12:00:00+02:00) or seconds since the Unix epoch (946684800)")]
    Epoch(String, String),
}

/// `--seed HEX`: up to 64 hex digits, `0x` allowed.
pub fn parse_seed(text: &str) -> Result<[u8; SEED_BYTES], PinningError> {
    let error = |why: &str| PinningError::Seed(text.to_owned(), why.to_owned());
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if digits.is_empty() {
        return Err(error("no digits"));
    }
    if digits.len() > 2 * SEED_BYTES {
        return Err(error("more than 64 digits"));
    }
    let mut seed = [0u8; SEED_BYTES];
    for (index, digit) in digits.chars().rev().enumerate() {
        let value = digit
            .to_digit(16)
            .ok_or_else(|| error(&format!("{digit:?} is not a hex digit")))?
            as u8;
        seed[SEED_BYTES - 1 - index / 2] |= value << (4 * (index % 2));
    }
    Ok(seed)
}

/// `--epoch TIME`: RFC 3339 (`2000-01-01T00:00:00Z`, fractions and
/// offsets allowed) or whole seconds since the Unix epoch; in nanoseconds
/// since the Unix epoch, which it may not precede.
pub fn parse_epoch(text: &str) -> Result<u64, PinningError> {
    let error = |why: &str| PinningError::Epoch(text.to_owned(), why.to_owned());
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .ok()
            .and_then(|seconds| seconds.checked_mul(NS_PER_SECOND))
            .ok_or_else(|| error("too far in the future"));
    }
    let ns = rfc3339_ns(text).map_err(|why| error(&why))?;
    u64::try_from(ns).map_err(|_| error("before 1970-01-01T00:00:00Z"))
}

/// Nanoseconds since the Unix epoch of an RFC 3339 date-time.
fn rfc3339_ns(text: &str) -> Result<i128, String> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>, what: &str| -> Result<u32, String> {
        text.get(range)
            .filter(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse().ok())
            .ok_or_else(|| format!("no {what} where expected"))
    };
    let separator = |at: usize, allowed: &[u8], what: &str| -> Result<(), String> {
        match bytes.get(at) {
            Some(b) if allowed.contains(b) => Ok(()),
            _ => Err(format!("expected {what} at character {}", at + 1)),
        }
    };
    let year = number(0..4, "four-digit year")?;
    separator(4, b"-", "'-'")?;
    let month = number(5..7, "two-digit month")?;
    separator(7, b"-", "'-'")?;
    let day = number(8..10, "two-digit day")?;
    separator(10, b"Tt ", "'T'")?;
    let hour = number(11..13, "two-digit hour")?;
    separator(13, b":", "':'")?;
    let minute = number(14..16, "two-digit minute")?;
    separator(16, b":", "':'")?;
    let second = number(17..19, "two-digit second")?;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => return Err(format!("month {month} is out of range")),
    };
    if day == 0 || day > days_in_month {
        return Err(format!("day {day} is out of range for the month"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!(
            "{hour:02}:{minute:02}:{second:02} is not a time of day"
        ));
    }
    let mut rest = &text[19..];
    let mut fraction_ns = 0i128;
    if let Some(after_dot) = rest.strip_prefix('.') {
        let digits = after_dot.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return Err("a fraction of a second needs 1 to 9 digits".into());
        }
        fraction_ns = after_dot[..digits].parse::<i128>().unwrap() * 10i128.pow(9 - digits as u32);
        rest = &after_dot[digits..];
    }
    let offset_seconds = match rest {
        "Z" | "z" => 0,
        "" => {
            return Err("no time zone: end it with Z for UTC, or an offset such as +02:00".into())
        }
        _ => utc_offset_seconds(rest)?,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let seconds = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_seconds;
    Ok(i128::from(seconds) * i128::from(NS_PER_SECOND) + fraction_ns)
}

/// An RFC 3339 offset from UTC, `+HH:MM` or `-HH:MM`, in seconds.
fn utc_offset_seconds(text: &str) -> Result<i64, String> {
    let not_a_zone = || format!("{text:?} is not a time zone (Z, or an offset such as +02:00)");
    let (sign, hours_minutes) = match text.split_at_checked(1) {
        Some(("+", rest)) => (1, rest),
        Some(("-", rest)) => (-1, rest),
        _ => return Err(not_a_zone()),
    };
    let two_digits = |digits: &str| {
        (digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse::<i64>().ok())
            .flatten()
    };
    match hours_minutes
        .split_once(':')
        .map(|(h, m)| (two_digits(h), two_digits(m)))
    {
        Some((Some(hours), Some(minutes))) if hours <= 23 && minutes <= 59 => {
            Ok(sign * (hours * 3600 + minutes * 60))
        }
        _ => Err(not_a_zone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_numbers_in_hex() {
        assert_eq!(parse_seed("0").unwrap(), [0; 32]);
        assert_eq!(parse_seed("0x00").unwrap(), [0; 32]);
        let seed = parse_seed("1F2").unwrap();
        assert_eq!(&seed[30..], &[0x01, 0xf2]);
        let pinning = Pinning {
            seed,
            ..Pinning::default()
        };
        assert_eq!(pinning.seed_hex(), "1f2");
        assert_eq!(Pinning::default().seed_hex(), "0");
        assert_ne!(pinning.entropy(), Pinning::default().entropy());
        assert_eq!(parse_seed(&"f".repeat(64)).unwrap(), [0xff; 32]);
    }

    #[test]
    fn chaos_seeds_draw_exit_steps_from_a_quarter_to_twice_the_pinned_one() {
        let step = |seed| Pinning::default().with_chaos_step(seed).exit_step_ns;
        let steps: Vec<u64> = (1..=3).map(step).collect();
        assert_eq!(steps, [13_750, 6_250, 17_500]);
        let all: Vec<u64> = (0..1000).map(step).collect();
        assert_eq!(all.iter().min(), Some(&2_500));
        assert_eq!(all.iter().max(), Some(&20_000));
    }

    #[test]
    fn a_seed_that_is_not_hex_is_refused_naming_the_fix() {
        assert!(parse_seed("12g4")
            .unwrap_err()
            .to_string()
            .contains("'g' is not a hex digit"));
        for bad in ["", "0x", "xyz", "12g4", &"1".repeat(65)] {
            let message = parse_seed(bad).unwrap_err().to_string();
            assert!(message.contains("--seed 0"), "{bad}: {message}");
        }
    }

    #[test]
    fn epochs_are_rfc3339_or_unix_seconds() {
        assert_eq!(parse_epoch("946684800").unwrap(), DEFAULT_EPOCH_NS);
        assert_eq!(
            parse_epoch("2000-01-01T00:00:00Z").unwrap(),
            DEFAULT_EPOCH_NS
        );
        assert_eq!(
            parse_epoch("2000-01-01t01:00:00.5+01:00").unwrap(),
            DEFAULT_EPOCH_NS + 500_000_000
        );
        assert_eq!(
            parse_epoch("1999-12-31 23:30:00-00:30").unwrap(),
            DEFAULT_EPOCH_NS
        );
        assert_eq!(
            parse_epoch("2024-02-29T12:00:00Z").unwrap(),
            1_709_208_000 * NS_PER_SECOND
        );
        assert_eq!(parse_epoch("0").unwrap(), 0);
    }

    #[test]
    fn a_malformed_epoch_is_refused_naming_the_fix() {
        for (bad, why) in [
            ("yesterday", "four-digit year"),
            ("2000-13-01T00:00:00Z", "month 13"),
            ("2023-02-29T00:00:00Z", "day 29"),
            ("2000-01-01T24:00:00Z", "not a time of day"),
            ("2000-01-01T00:00:00", "no time zone"),
            ("2000-01-01T00:00:00+2", "not a time zone"),
            ("1969-12-31T23:59:59Z", "before 1970"),
            ("99999999999999999999", "too far"),
        ] {
            let message = parse_epoch(bad).unwrap_err().to_string();
            assert!(message.contains(why), "{bad}: {message}");
            assert!(message.contains("946684800"), "{bad}: {message}");
        }
    }
}
