//! Times as the console's filters take them.

use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, PrimitiveDateTime};

/// A time filter: RFC 3339, a date and time as a browser's
/// `datetime-local` field sends it (UTC), a date, or an age (`15m`, `2h`,
/// `3d`) counted back from now.
pub fn parse_when(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    let text = text.trim();
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t);
    }
    let local = [
        "[year]-[month]-[day]T[hour]:[minute]",
        "[year]-[month]-[day]T[hour]:[minute]:[second]",
        "[year]-[month]-[day] [hour]:[minute]",
        "[year]-[month]-[day] [hour]:[minute]:[second]",
    ];
    for format in local {
        let format = time::format_description::parse_borrowed::<2>(format)
            .expect("a valid format description");
        if let Ok(t) = PrimitiveDateTime::parse(text, &format) {
            return Ok(t.assume_utc());
        }
    }
    let date = time::format_description::parse_borrowed::<2>("[year]-[month]-[day]")
        .expect("a valid format description");
    if let Ok(d) = time::Date::parse(text, &date) {
        return Ok(d.midnight().assume_utc());
    }
    let unit = text.chars().last().unwrap_or(' ');
    let secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    let number = text[..text.len() - unit.len_utf8().min(text.len())]
        .parse::<i64>()
        .ok();
    match number {
        Some(n) if secs > 0 && (0..=36_500 * 86_400 / secs).contains(&n) => Ok(now - time::Duration::seconds(n * secs)),
        _ => Err(format!(
            "`{text}` is not a time: use RFC 3339 (2026-01-31T12:00:00Z), a date and time in UTC (2026-01-31T12:00), a date, or an age (15m, 2h, 3d)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_rfc_3339_browser_fields_dates_or_ages() {
        let now = OffsetDateTime::parse("2026-01-31T12:00:00Z", &Rfc3339).unwrap();
        let at = |t: &str| {
            let t = parse_when(t, now).unwrap().to_offset(time::UtcOffset::UTC);
            t.format(&Rfc3339).unwrap()
        };
        assert_eq!(at("2026-01-30T10:00:00+01:00"), "2026-01-30T09:00:00Z");
        assert_eq!(at("2026-01-30T10:15"), "2026-01-30T10:15:00Z");
        assert_eq!(at("2026-01-30"), "2026-01-30T00:00:00Z");
        assert_eq!(at("15m"), "2026-01-31T11:45:00Z");
        assert_eq!(at("2d"), "2026-01-29T12:00:00Z");
        for bad in ["yesterday", "5x", "-3h", "", "99999999999d"] {
            assert!(parse_when(bad, now).is_err(), "{bad}");
        }
    }
}
