//! The changed exit costs users ask for: `--inject-exit-delay DEVICE:DURATION`
//! and `--what-if DEVICE=+DURATION` or `DEVICE=xFACTOR`.

use std::time::Duration;

use provm_vmm::exit_timing::{ExitDelay, ExtraCost};
use provm_vmm::vm::EXIT_DEVICES;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CostError {
    #[error("{0:?} is not of the form {1}")]
    Form(String, &'static str),
    #[error("unknown device {0:?}: exits are timed by {devices}", devices = EXIT_DEVICES.join(", "))]
    UnknownDevice(String),
    #[error(
        "{0:?} is not a duration: write a number and a unit, ns, us, ms or s (e.g. 200us, 2ms)"
    )]
    Duration(String),
    #[error("{0:?} is not a factor: write x and a number of at least 1 (e.g. x2)")]
    Factor(String),
}

/// `DEVICE:DURATION`, for `--inject-exit-delay`.
pub fn parse_exit_delay(text: &str) -> Result<ExitDelay, CostError> {
    let (device, duration) = text
        .split_once(':')
        .ok_or_else(|| CostError::Form(text.into(), "DEVICE:DURATION (e.g. virtio-blk:200us)"))?;
    Ok(ExitDelay {
        device: known_device(device)?,
        cost: ExtraCost::Fixed(parse_duration(duration)?),
    })
}

/// `DEVICE=+DURATION` or `DEVICE=xFACTOR`, for `--what-if`.
pub fn parse_what_if(text: &str) -> Result<ExitDelay, CostError> {
    let form = "DEVICE=+DURATION or DEVICE=xFACTOR (e.g. virtio-blk=+2ms, virtio-blk=x2)";
    let (device, change) = text
        .split_once('=')
        .ok_or_else(|| CostError::Form(text.into(), form))?;
    let device = known_device(device)?;
    let cost = if let Some(duration) = change.strip_prefix('+') {
        ExtraCost::Fixed(parse_duration(duration)?)
    } else if let Some(factor) = change.strip_prefix('x') {
        match factor.parse::<f64>() {
            Ok(factor) if factor.is_finite() && factor >= 1.0 => ExtraCost::Scaled(factor),
            _ => return Err(CostError::Factor(change.into())),
        }
    } else {
        return Err(CostError::Form(text.into(), form));
    };
    Ok(ExitDelay { device, cost })
}

/// How a delay is written on the command line of `--what-if`.
pub fn describe(delay: &ExitDelay) -> String {
    match delay.cost {
        ExtraCost::Fixed(extra) => format!("{}=+{}", delay.device, format_duration(extra)),
        ExtraCost::Scaled(factor) => format!("{}=x{factor}", delay.device),
    }
}

fn known_device(name: &str) -> Result<String, CostError> {
    if EXIT_DEVICES.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(CostError::UnknownDevice(name.into()))
    }
}

/// `200us`, `2ms`, `1.5s`, `500ns`.
pub fn parse_duration(text: &str) -> Result<Duration, CostError> {
    let bad = || CostError::Duration(text.into());
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(bad()),
    };
    if !number.is_finite() || number < 0.0 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(number * scale).map_err(|_| bad())
}

/// A duration in the largest unit that keeps it whole (else in µs).
pub fn format_duration(duration: Duration) -> String {
    let ns = duration.as_nanos();
    match ns {
        0 => "0s".into(),
        _ if ns.is_multiple_of(1_000_000_000) => format!("{}s", ns / 1_000_000_000),
        _ if ns.is_multiple_of(1_000_000) => format!("{}ms", ns / 1_000_000),
        _ if ns.is_multiple_of(1_000) => format!("{}us", ns / 1_000),
        _ => format!("{ns}ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("200us"), Ok(Duration::from_micros(200)));
        assert_eq!(parse_duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["2", "ms", "2 ms", "-1ms", "2m", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration(Duration::from_micros(200)), "200us");
        assert_eq!(format_duration(Duration::from_millis(2)), "2ms");
    }

    #[test]
    fn delays_name_a_known_device() {
        let delay = parse_exit_delay("virtio-blk:1ms").unwrap();
        assert_eq!(describe(&delay), "virtio-blk=+1ms");
        assert_eq!(
            parse_exit_delay("disk:1ms"),
            Err(CostError::UnknownDevice("disk".into()))
        );
        assert!(matches!(
            parse_exit_delay("virtio-blk"),
            Err(CostError::Form(..))
        ));
        let what_if = parse_what_if("virtio-blk=x2").unwrap();
        assert_eq!(what_if.cost, ExtraCost::Scaled(2.0));
        assert!(matches!(
            parse_what_if("virtio-blk=x0.5"),
            Err(CostError::Factor(_))
        ));
        assert!(matches!(
            parse_what_if("virtio-blk=2ms"),
            Err(CostError::Form(..))
        ));
    }
}
