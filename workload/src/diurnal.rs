//! The shape of a tenant's day: how its arrival intensity varies with the
//! local hour, and the price book's off-peak window.
//!
//! Intensities are relative (a weekday business hour of an interactive
//! tenant is 1.0); the generator scales them so that each tenant still gets
//! its share of the sample. Between two hours the intensity is interpolated
//! linearly by the minute, so a day has no steps.

use chrono::{DateTime, Datelike, DurationRound, TimeDelta, Timelike, Utc, Weekday};
use chrono_tz::Tz;

use crate::tenants::{Load, Tenant};

/// The price book's zone (`config/price-book.yaml`, `timeZone`): the
/// off-peak window is in its local time.
pub const OFF_PEAK_ZONE: Tz = chrono_tz::America::New_York;
/// The off-peak window's first local hour (`offPeak.start`, 22:00).
pub const OFF_PEAK_START_HOUR: u32 = 22;
/// The hour the off-peak window ends (`offPeak.end`, 06:00), exclusive.
pub const OFF_PEAK_END_HOUR: u32 = 6;

/// An interactive tenant's weekday, per local hour 00..23: a night floor
/// of ~12%, a morning ramp, business hours 09–16 at the top, an evening tail.
const INTERACTIVE: [f64; 24] = [
    0.18, 0.14, 0.12, 0.12, 0.14, 0.20, 0.32, 0.55, 0.85, 1.00, 1.00, 1.00, //
    0.92, 0.98, 1.00, 1.00, 0.95, 0.85, 0.70, 0.55, 0.42, 0.33, 0.26, 0.21,
];

/// A batch tenant's day, per hour of [`OFF_PEAK_ZONE`]: full in the
/// off-peak window, shoulders at 21:00 and 06:00, a trickle otherwise.
const BATCH: [f64; 24] = [
    1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 0.30, 0.08, 0.08, 0.08, 0.08, 0.08, //
    0.08, 0.08, 0.08, 0.08, 0.08, 0.08, 0.08, 0.08, 0.08, 0.30, 1.00, 1.00,
];

/// When a tenant's day is measured: its zone and its kind of load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    zone: Tz,
    load: Load,
}

impl Shape {
    pub(crate) fn of(tenant: &Tenant) -> Self {
        Self {
            zone: match tenant.load {
                Load::Interactive { .. } => tenant.zone,
                Load::Batch => OFF_PEAK_ZONE,
            },
            load: tenant.load,
        }
    }

    /// The tenant's relative arrival intensity at `at` (always > 0).
    pub(crate) fn intensity(&self, at: DateTime<Utc>) -> f64 {
        let local = at.with_timezone(&self.zone);
        let (hour, minute) = (local.hour() as usize % 24, f64::from(local.minute()));
        let table = match self.load {
            Load::Interactive { .. } => &INTERACTIVE,
            Load::Batch => &BATCH,
        };
        let (here, next) = (table[hour], table[(hour + 1) % 24]);
        let day = here + (next - here) * minute / 60.0;
        let weekend = matches!(local.weekday(), Weekday::Sat | Weekday::Sun);
        match self.load {
            Load::Interactive { weekend_percent } if weekend => {
                day * f64::from(weekend_percent.max(1)) / 100.0
            }
            _ => day,
        }
    }
}

/// Whether usage started at `at` is rated off-peak: billing asks it of the
/// UTC hour the usage is counted in, by that hour's start in
/// [`OFF_PEAK_ZONE`].
pub fn is_off_peak(at: DateTime<Utc>) -> bool {
    let hour = at.duration_trunc(TimeDelta::hours(1)).unwrap_or(at);
    let local = hour.with_timezone(&OFF_PEAK_ZONE).hour();
    !(OFF_PEAK_END_HOUR..OFF_PEAK_START_HOUR).contains(&local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tenant;
    use serde_norway::Value;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn tenant(name: &str) -> Tenant {
        Tenant::reference()
            .into_iter()
            .find(|t| t.name == name)
            .unwrap()
    }

    #[test]
    fn interactive_tenants_peak_in_their_own_business_hours() {
        let acme = Shape::of(&tenant("acme-corp"));
        let medai = Shape::of(&tenant("medai-labs"));
        // Tuesday 2026-11-10, 15:00Z: 10:00 in New York, 16:00 in Berlin.
        let t = at("2026-11-10T15:00:00Z");
        assert!(acme.intensity(t) > 0.9 && medai.intensity(t) > 0.9);
        // 05:00Z: midnight in New York, 06:00 in Berlin.
        let night = at("2026-11-10T05:00:00Z");
        assert!(acme.intensity(night) < 0.2);
        assert!(medai.intensity(night) < 0.4);
        // Saturday: the weekend share.
        let saturday = at("2026-11-14T15:00:00Z");
        assert!((acme.intensity(saturday) - 0.7).abs() < 1e-9);
    }

    #[test]
    fn batch_fills_the_off_peak_window_of_the_price_book() {
        let codegen = Shape::of(&tenant("codegen-platform"));
        // 03:00Z is 22:00 in New York (EST): off-peak, batch at full.
        assert!(is_off_peak(at("2026-11-10T03:30:00Z")));
        assert_eq!(codegen.intensity(at("2026-11-10T03:30:00Z")), 1.0);
        assert!(!is_off_peak(at("2026-11-10T15:00:00Z")));
        assert!(codegen.intensity(at("2026-11-10T15:00:00Z")) < 0.1);
        // 11:00Z is 06:00 in New York: the window has ended.
        assert!(!is_off_peak(at("2026-11-10T11:00:00Z")));
        assert!(is_off_peak(at("2026-11-10T10:59:59Z")));
    }

    #[test]
    fn the_off_peak_window_is_the_price_books() {
        let path = format!("{}/../config/price-book.yaml", env!("CARGO_MANIFEST_DIR"));
        let book: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(book["timeZone"].as_str(), Some(OFF_PEAK_ZONE.name()));
        let hour = |key: &str| book["offPeak"][key].as_str().unwrap().to_owned();
        assert_eq!(hour("start"), format!("{OFF_PEAK_START_HOUR:02}:00"));
        assert_eq!(hour("end"), format!("{OFF_PEAK_END_HOUR:02}:00"));
    }
}
