//! UTC calendar time from Unix time: for trace names, reports, and PROV's
//! xsd:dateTime.

/// A moment as a UTC calendar date and time of day.
#[derive(Debug, PartialEq, Eq)]
pub struct Utc {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u64,
    pub minute: u64,
    pub second: u64,
    pub nanosecond: u64,
}

impl Utc {
    pub fn from_unix_ns(ns: u64) -> Utc {
        let seconds = ns / 1_000_000_000;
        let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
        let second_of_day = seconds % 86_400;
        Utc {
            year,
            month,
            day,
            hour: second_of_day / 3600,
            minute: second_of_day / 60 % 60,
            second: second_of_day % 60,
            nanosecond: ns % 1_000_000_000,
        }
    }

    pub fn from_unix_seconds(seconds: u64) -> Utc {
        Self::from_unix_ns(seconds.saturating_mul(1_000_000_000))
    }

    /// ISO 8601 to the second with the offset spelled out, as schema.org's
    /// DateTime and the RO-Crate validator want it: `2026-11-22T07:23:00+00:00`.
    pub fn iso_8601(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}+00:00",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date (H. Hinnant's
/// days_from_civil), the inverse of `civil_from_days`.
/// `YYYYmmdd-HHMMSS` in UTC, from seconds since the epoch: for file names.
pub fn timestamp(seconds: u64) -> String {
    let t = Utc::from_unix_seconds(seconds);
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// `YYYY-mm-dd HH:MM:SS UTC`, from seconds since the epoch: for people.
pub fn date_time(seconds: u64) -> String {
    let t = Utc::from_unix_seconds(seconds);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `days` after 1970-01-01 (H. Hinnant's
/// civil_from_days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_from_civil_inverts_civil_from_days() {
        for days in [-800_000, -1, 0, 59, 10_956, 11_016, 20_779, 2_932_896] {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
        assert_eq!(days_from_civil(2000, 1, 1), 10_957);
    }

    #[test]
    fn calendar_dates_in_utc() {
        let leap_day = Utc::from_unix_ns(951_782_400_000_000_007);
        assert_eq!((leap_day.year, leap_day.month, leap_day.day), (2000, 2, 29));
        assert_eq!(leap_day.nanosecond, 7);
        let moment = Utc::from_unix_seconds(1_795_332_180);
        assert_eq!(
            (
                moment.year,
                moment.month,
                moment.day,
                moment.hour,
                moment.minute
            ),
            (2026, 11, 22, 7, 23)
        );
        assert_eq!(moment.iso_8601(), "2026-11-22T07:23:00+00:00");
    }

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(timestamp(0), "19700101-000000");
        assert_eq!(timestamp(951_782_400), "20000229-000000");
        assert_eq!(timestamp(1_795_332_180), "20261122-072300");
        assert_eq!(date_time(1_795_332_180), "2026-11-22 07:23:00 UTC");
    }
}
