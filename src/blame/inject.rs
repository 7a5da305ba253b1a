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
    }

    #[test]
    fn delays_name_a_known_device() {
        let delay = parse_exit_delay("virtio-blk:1ms").unwrap();
        assert_eq!(delay.to_string(), "virtio-blk=+1ms");
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
