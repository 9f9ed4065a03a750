//! Scheduled minimums (not in ARC): time windows, recurring in an IANA time zone, inside which `minRunners` is
//! replaced by another value; and the one pure function that says which minimum applies at an instant
//! ([`evaluate`]). The listener applies it at every scaling step and at every window boundary; the
//! AutoscalingRunnerSet controller shows its result in the set's status. docs/configuration.md has examples.
//!
//! Rules, in one place:
//! - An occurrence starts on each day the recurrence selects (local date in `timeZone`) at `start`, and lasts
//!   `duration`, or until the next `end` (the same day when `end` is later than `start`, else the next day, so a
//!   window may cross midnight).
//! - Local times that do not exist (skipped by a DST change) move forward by the length of the gap; local times
//!   that exist twice (repeated by a DST change) mean the first of the two. A `duration` is elapsed time, so a
//!   window of `8h` lasts 8 hours even across a DST change; an `end` is wall-clock time.
//! - `startDate`/`endDate` bound the day an occurrence starts on (both inclusive); an occurrence that started on
//!   `endDate` runs to its end.
//! - Inside one or more windows the minimum is the highest of their `minRunners` (it replaces the base
//!   `minRunners`, so a window may also lower it); outside all windows it is the base `minRunners`.

use std::collections::BTreeSet;
use std::fmt;

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most schedules one set may carry (the CRD's `maxItems`).
pub const MAX_SCHEDULES: usize = 32;
/// Longest `duration` of a window: the evaluation looks this far back for occurrences still running.
pub const MAX_WINDOW: SignedDuration = SignedDuration::from_hours(7 * 24);
/// How far ahead [`evaluate`] looks for the next boundary (a monthly window on the 31st may be two months away).
const LOOKAHEAD_DAYS: i32 = 63;
/// Days looked back for occurrences still running: [`MAX_WINDOW`] plus one for a local date behind UTC.
const LOOKBACK_DAYS: i32 = 8;

/// Recurrence values of [`MinRunnersSchedule::recurrence`].
pub const RECURRENCES: [&str; 4] = ["daily", "weekdays", "weekly", "monthly"];
/// Day names of [`MinRunnersSchedule::days`].
pub const DAY_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

// Strings rather than enums, so an object the schema let through (or an older CRD) still deserializes and the
// problem is reported by `MinRunnersSchedule::parse` instead of hiding the whole set from the controller.
/// One scheduled minimum: a recurring time window in which `minRunners` is replaced.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MinRunnersSchedule {
    /// Name shown in the set's status and in logs; defaults to `schedule-<position, from 1>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63))]
    pub name: String,
    /// The minimum number of idle runners inside the window (replaces `minRunners`).
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub min_runners: i64,
    /// Local start time, `HH:MM` or `HH:MM:SS` (24-hour clock).
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$"))]
    pub start: String,
    /// Local end time, `HH:MM` or `HH:MM:SS`; at or before `start` means the next day. Exactly one of `end`
    /// and `duration`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$"))]
    pub end: String,
    /// Length of the window, e.g. `8h`, `90m`, `1h30m` (at most 168h). Exactly one of `end` and `duration`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub duration: String,
    /// `daily` (the default), `weekdays` (Monday to Friday), `weekly` (on `days`) or `monthly` (on
    /// `daysOfMonth`; a month without that day has no window).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("enum" = ["daily", "weekdays", "weekly", "monthly"]))]
    pub recurrence: String,
    /// Days of a `weekly` recurrence: `monday` ... `sunday`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("items" = {"type": "string", "enum": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]}))]
    pub days: Vec<String>,
    /// Days of a `monthly` recurrence, 1 to 31.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("items" = {"type": "integer", "minimum": 1, "maximum": 31}))]
    pub days_of_month: Vec<i64>,
    /// IANA time zone of `start`, `end` and the dates, e.g. `Europe/Berlin`; default `UTC`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub time_zone: String,
    /// First day (`YYYY-MM-DD`, local) a window may start on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"))]
    pub start_date: String,
    /// Last day (`YYYY-MM-DD`, local) a window may start on; that window still runs to its end.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"))]
    pub end_date: String,
}

/// Why a schedule is unusable. The text names the schedule and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleProblem {
    /// The schedule's display name.
    pub schedule: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ScheduleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "minRunnersSchedules {:?}: {}",
            self.schedule, self.problem
        )
    }
}

impl std::error::Error for ScheduleProblem {}

/// How a window's end is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// Elapsed time from the start.
    Duration(SignedDuration),
    /// Wall-clock time, the same day if later than the start, else the next day.
    Until(Time),
}

/// Which local days a window starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recurrence {
    /// Every day.
    Daily,
    /// Monday to Friday.
    Weekdays,
    /// The given days of the week.
    Weekly(BTreeSet<i8>),
    /// The given days of the month.
    Monthly(BTreeSet<i8>),
}

impl Recurrence {
    fn matches(&self, date: Date) -> bool {
        match self {
            Self::Daily => true,
            Self::Weekdays => !matches!(date.weekday(), Weekday::Saturday | Weekday::Sunday),
            Self::Weekly(days) => days.contains(&date.weekday().to_monday_one_offset()),
            Self::Monthly(days) => days.contains(&date.day()),
        }
    }
}

/// A validated schedule, ready for [`evaluate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Display name.
    pub name: String,
    /// Minimum inside the window.
    pub min_runners: i64,
    /// Local start time.
    pub start: Time,
    /// How the end is found.
    pub length: Length,
    /// Which days.
    pub recurrence: Recurrence,
    /// Time zone of the local times and dates.
    pub time_zone: TimeZone,
    /// First local day an occurrence may start on.
    pub start_date: Option<Date>,
    /// Last local day an occurrence may start on.
    pub end_date: Option<Date>,
}

/// The display name of the schedule at `index` (0-based).
pub fn display_name(schedule: &MinRunnersSchedule, index: usize) -> String {
    if schedule.name.is_empty() {
        format!("schedule-{}", index + 1)
    } else {
        schedule.name.clone()
    }
}

/// `HH:MM` or `HH:MM:SS`.
fn parse_time(text: &str) -> Option<Time> {
    let parts: Vec<&str> = text.split(':').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.len() != 2) {
        return None;
    }
    let number = |part: &str| -> Option<i8> {
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let seconds = match parts.get(2) {
        Some(part) => number(part)?,
        None => 0,
    };
    Time::new(number(parts[0])?, number(parts[1])?, seconds, 0).ok()
}

fn parse_date(text: &str) -> Option<Date> {
    if text.len() != 10 {
        return None;
    }
    text.parse().ok()
}

impl MinRunnersSchedule {
    /// Validates the schedule at `index` and resolves its time zone.
    pub fn parse(&self, index: usize) -> Result<Schedule, ScheduleProblem> {
        let name = display_name(self, index);
        let fail = |problem: String| ScheduleProblem {
            schedule: name.clone(),
            problem,
        };
        if self.min_runners < 0 {
            return Err(fail(format!(
                "minRunners ({}) must not be negative",
                self.min_runners
            )));
        }
        let start = parse_time(&self.start).ok_or_else(|| {
            fail(format!(
                "start {:?} is not a time HH:MM or HH:MM:SS",
                self.start
            ))
        })?;
        let length = match (self.end.is_empty(), self.duration.is_empty()) {
            (false, true) => Length::Until(parse_time(&self.end).ok_or_else(|| {
                fail(format!(
                    "end {:?} is not a time HH:MM or HH:MM:SS",
                    self.end
                ))
            })?),
            (true, false) => {
                let duration: SignedDuration = self.duration.parse().map_err(|_| {
                    fail(format!(
                        "duration {:?} is not a duration like 8h, 90m or 1h30m",
                        self.duration
                    ))
                })?;
                if duration <= SignedDuration::ZERO || duration > MAX_WINDOW {
                    return Err(fail(format!(
                        "duration {:?} must be more than 0 and at most 168h",
                        self.duration
                    )));
                }
                Length::Duration(duration)
            }
            (false, false) => return Err(fail("set either end or duration, not both".to_owned())),
            (true, true) => return Err(fail("set end or duration".to_owned())),
        };
        let recurrence = match self.recurrence.as_str() {
            "" | "daily" => Recurrence::Daily,
            "weekdays" => Recurrence::Weekdays,
            "weekly" => {
                if self.days.is_empty() {
                    return Err(fail("a weekly recurrence needs days".to_owned()));
                }
                let mut days = BTreeSet::new();
                for day in &self.days {
                    let position = DAY_NAMES
                        .iter()
                        .position(|known| known.eq_ignore_ascii_case(day))
                        .ok_or_else(|| {
                            fail(format!(
                                "day {day:?} is not one of {}",
                                DAY_NAMES.join(", ")
                            ))
                        })?;
                    // 0..7 fits an i8.
                    days.insert(i8::try_from(position + 1).unwrap_or(i8::MAX));
                }
                Recurrence::Weekly(days)
            }
            "monthly" => {
                if self.days_of_month.is_empty() {
                    return Err(fail("a monthly recurrence needs daysOfMonth".to_owned()));
                }
                let mut days = BTreeSet::new();
                for day in &self.days_of_month {
                    let day = i8::try_from(*day)
                        .ok()
                        .filter(|d| (1..=31).contains(d))
                        .ok_or_else(|| fail(format!("daysOfMonth {day} is not in 1..31")))?;
                    days.insert(day);
                }
                Recurrence::Monthly(days)
            }
            other => {
                return Err(fail(format!(
                    "recurrence {other:?} is not one of {}",
                    RECURRENCES.join(", ")
                )));
            }
        };
        if !self.days.is_empty() && !matches!(recurrence, Recurrence::Weekly(_)) {
            return Err(fail("days only apply to a weekly recurrence".to_owned()));
        }
        if !self.days_of_month.is_empty() && !matches!(recurrence, Recurrence::Monthly(_)) {
            return Err(fail(
                "daysOfMonth only apply to a monthly recurrence".to_owned(),
            ));
        }
        let time_zone = if self.time_zone.is_empty() {
            TimeZone::UTC
        } else {
            TimeZone::get(&self.time_zone).map_err(|_| {
                fail(format!(
                    "timeZone {:?} is not an IANA time zone known here (e.g. Europe/Berlin)",
                    self.time_zone
                ))
            })?
        };
        let date = |field: &str, text: &str| -> Result<Option<Date>, ScheduleProblem> {
            if text.is_empty() {
                return Ok(None);
            }
            parse_date(text)
                .map(Some)
                .ok_or_else(|| fail(format!("{field} {text:?} is not a date YYYY-MM-DD")))
        };
        let start_date = date("startDate", &self.start_date)?;
        let end_date = date("endDate", &self.end_date)?;
        if let (Some(first), Some(last)) = (start_date, end_date)
            && last < first
        {
            return Err(fail("endDate is before startDate".to_owned()));
        }
        Ok(Schedule {
            name,
            min_runners: self.min_runners,
            start,
            length,
            recurrence,
            time_zone,
            start_date,
            end_date,
        })
    }
}

/// Validates every schedule (and their number).
pub fn parse_all(schedules: &[MinRunnersSchedule]) -> Result<Vec<Schedule>, ScheduleProblem> {
    if schedules.len() > MAX_SCHEDULES {
        return Err(ScheduleProblem {
            schedule: String::new(),
            problem: format!(
                "{} schedules; at most {MAX_SCHEDULES} are allowed",
                schedules.len()
            ),
        });
    }
    schedules
        .iter()
        .enumerate()
        .map(|(index, schedule)| schedule.parse(index))
        .collect()
}

/// Checks the schedules of a set whose maximum is `max_runners`: each must parse, and no window may ask for more
/// than the maximum.
pub fn check(schedules: &[MinRunnersSchedule], max_runners: i64) -> Result<(), ScheduleProblem> {
    for schedule in parse_all(schedules)? {
        if schedule.min_runners > max_runners {
            return Err(ScheduleProblem {
                problem: format!(
                    "minRunners ({}) is greater than maxRunners ({max_runners})",
                    schedule.min_runners
                ),
                schedule: schedule.name,
            });
        }
    }
    Ok(())
}

/// One occurrence of a schedule: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrence {
    /// First instant inside.
    pub start: Timestamp,
    /// First instant outside.
    pub end: Timestamp,
}

impl Schedule {
    /// The occurrence starting on local `date`, if the recurrence and the date bounds select that day and the
    /// window is not empty (an `end` that a DST change moved onto the start).
    pub fn occurrence_on(&self, date: Date) -> Option<Occurrence> {
        if self.start_date.is_some_and(|first| date < first)
            || self.end_date.is_some_and(|last| date > last)
            || !self.recurrence.matches(date)
        {
            return None;
        }
        // `to_timestamp` resolves gaps forward and folds to the earlier instant ("compatible").
        let start = self
            .time_zone
            .to_timestamp(date.to_datetime(self.start))
            .ok()?;
        let end = match self.length {
            Length::Duration(duration) => start.checked_add(duration).ok()?,
            Length::Until(end) => {
                let day = if end > self.start {
                    date
                } else {
                    date.tomorrow().ok()?
                };
                self.time_zone.to_timestamp(day.to_datetime(end)).ok()?
            }
        };
        (end > start).then_some(Occurrence { start, end })
    }

    /// Occurrences starting on local days from `LOOKBACK_DAYS` before `at`'s local date to `ahead` days after.
    fn occurrences_around(
        &self,
        at: Timestamp,
        ahead: i32,
    ) -> impl Iterator<Item = Occurrence> + '_ {
        let today = self.time_zone.to_datetime(at).date();
        (-LOOKBACK_DAYS..=ahead).filter_map(move |offset| {
            let date = today.checked_add(jiff::Span::new().days(offset)).ok()?;
            self.occurrence_on(date)
        })
    }
}

/// The minimum in effect at an instant, and until when it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// The minimum number of idle runners.
    pub min_runners: i64,
    /// The winning window's schedule name, when inside a window.
    pub active: Option<String>,
    /// The next instant after `at` at which a window starts or ends (the evaluation can only change there);
    /// `None` when no window starts or ends in the next two months.
    pub next_boundary: Option<Timestamp>,
}

/// The minimum at `at`: the highest `minRunners` of the windows `at` is inside (the first such schedule names
/// it), else `base`.
pub fn evaluate(schedules: &[Schedule], base: i64, at: Timestamp) -> Evaluation {
    let mut best: Option<(i64, &str)> = None;
    let mut next_boundary: Option<Timestamp> = None;
    for schedule in schedules {
        for occurrence in schedule.occurrences_around(at, LOOKAHEAD_DAYS) {
            if occurrence.start <= at
                && at < occurrence.end
                && best.is_none_or(|(min, _)| schedule.min_runners > min)
            {
                best = Some((schedule.min_runners, &schedule.name));
            }
            for edge in [occurrence.start, occurrence.end] {
                if edge > at && next_boundary.is_none_or(|next| edge < next) {
                    next_boundary = Some(edge);
                }
            }
        }
    }
    Evaluation {
        min_runners: best.map_or(base, |(min, _)| min),
        active: best.map(|(_, name)| name.to_owned()),
        next_boundary,
    }
}

#[cfg(test)]
mod tests;
