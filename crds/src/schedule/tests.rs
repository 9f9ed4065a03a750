use jiff::ToSpan;
use jiff::civil::{DateTime, date};
use proptest::prelude::*;

use super::*;

fn schedule(start: &str, end: &str, min: i64) -> MinRunnersSchedule {
    MinRunnersSchedule {
        min_runners: min,
        start: start.to_owned(),
        end: end.to_owned(),
        ..MinRunnersSchedule::default()
    }
}

fn parsed(spec: &MinRunnersSchedule) -> Schedule {
    spec.parse(0).expect("valid schedule")
}

fn at(zone: &str, text: &str) -> Timestamp {
    let dt: DateTime = text.parse().unwrap();
    TimeZone::get(zone).unwrap().to_timestamp(dt).unwrap()
}

fn utc(text: &str) -> Timestamp {
    at("UTC", text)
}

#[test]
fn outside_every_window_the_base_applies() {
    let s = parsed(&schedule("09:00", "17:00", 5));
    let e = evaluate(&[s], 1, utc("2026-03-02T08:59:59"));
    assert_eq!(e.min_runners, 1);
    assert_eq!(e.active, None);
    assert_eq!(e.next_boundary, Some(utc("2026-03-02T09:00")));
}

#[test]
fn inside_a_window_its_minimum_replaces_the_base_even_when_lower() {
    let high = parsed(&schedule("09:00", "17:00", 5));
    let e = evaluate(std::slice::from_ref(&high), 1, utc("2026-03-02T09:00"));
    assert_eq!(
        (e.min_runners, e.active.as_deref()),
        (5, Some("schedule-1"))
    );
    assert_eq!(e.next_boundary, Some(utc("2026-03-02T17:00")));
    // The end is exclusive.
    assert_eq!(evaluate(&[high], 1, utc("2026-03-02T17:00")).min_runners, 1);
    let night = parsed(&schedule("22:00", "06:00", 0));
    assert_eq!(
        evaluate(&[night], 3, utc("2026-03-02T23:00")).min_runners,
        0
    );
}

#[test]
fn a_window_crossing_midnight_ends_the_next_day() {
    let s = parsed(&schedule("22:00", "02:00", 4));
    for (time, inside) in [
        ("2026-03-02T21:59", false),
        ("2026-03-02T22:00", true),
        ("2026-03-03T00:30", true),
        ("2026-03-03T01:59", true),
        ("2026-03-03T02:00", false),
    ] {
        let e = evaluate(std::slice::from_ref(&s), 0, utc(time));
        assert_eq!(e.active.is_some(), inside, "{time}");
    }
    // end == start: a full day.
    let whole = parsed(&schedule("06:00", "06:00", 2));
    let occ = whole.occurrence_on(date(2026, 3, 2)).unwrap();
    assert_eq!(
        occ.end.duration_since(occ.start),
        SignedDuration::from_hours(24)
    );
}

#[test]
fn overlapping_windows_the_highest_minimum_wins() {
    let mut a = schedule("08:00", "18:00", 2);
    a.name = "office".into();
    let mut b = schedule("12:00", "13:00", 6);
    b.name = "lunch-rush".into();
    let mut c = schedule("12:00", "13:00", 6);
    c.name = "same-as-rush".into();
    let all: Vec<Schedule> = [a, b, c]
        .iter()
        .enumerate()
        .map(|(i, s)| s.parse(i).unwrap())
        .collect();
    let e = evaluate(&all, 0, utc("2026-03-02T12:30"));
    // Equal minimums: the first listed names the window.
    assert_eq!(
        (e.min_runners, e.active.as_deref()),
        (6, Some("lunch-rush"))
    );
    assert_eq!(e.next_boundary, Some(utc("2026-03-02T13:00")));
    let e = evaluate(&all, 0, utc("2026-03-02T13:00"));
    assert_eq!((e.min_runners, e.active.as_deref()), (2, Some("office")));
}

#[test]
fn weekdays_weekly_and_monthly_recurrences() {
    let mut weekdays = schedule("09:00", "17:00", 3);
    weekdays.recurrence = "weekdays".into();
    let weekdays = parsed(&weekdays);
    // 2026-03-06 is a Friday, 03-07 a Saturday.
    assert!(weekdays.occurrence_on(date(2026, 3, 6)).is_some());
    assert!(weekdays.occurrence_on(date(2026, 3, 7)).is_none());
    assert!(weekdays.occurrence_on(date(2026, 3, 8)).is_none());
    // Friday evening: the next boundary is Monday morning.
    let e = evaluate(&[weekdays], 0, utc("2026-03-06T18:00"));
    assert_eq!(e.next_boundary, Some(utc("2026-03-09T09:00")));

    let mut weekly = schedule("10:00", "11:00", 1);
    weekly.recurrence = "weekly".into();
    weekly.days = vec!["tuesday".into(), "Saturday".into()];
    let weekly = parsed(&weekly);
    assert!(weekly.occurrence_on(date(2026, 3, 3)).is_some());
    assert!(weekly.occurrence_on(date(2026, 3, 7)).is_some());
    assert!(weekly.occurrence_on(date(2026, 3, 4)).is_none());

    let mut monthly = schedule("00:00", "00:00", 8);
    monthly.recurrence = "monthly".into();
    monthly.days_of_month = vec![31];
    let monthly = parsed(&monthly);
    // No 31st in April: from April 1st the next window is May 31st, two months ahead.
    let e = evaluate(std::slice::from_ref(&monthly), 0, utc("2026-04-01T00:00"));
    assert_eq!(e.next_boundary, Some(utc("2026-05-31T00:00")));
    assert!(monthly.occurrence_on(date(2026, 4, 30)).is_none());
}

#[test]
fn end_date_is_the_last_day_a_window_starts_and_it_runs_to_its_end() {
    let mut s = schedule("22:00", "02:00", 4);
    s.start_date = "2026-03-02".into();
    s.end_date = "2026-03-03".into();
    let s = parsed(&s);
    assert_eq!(
        evaluate(std::slice::from_ref(&s), 0, utc("2026-03-01T23:00")).min_runners,
        0
    );
    assert_eq!(
        evaluate(std::slice::from_ref(&s), 0, utc("2026-03-02T23:00")).min_runners,
        4
    );
    // Started on the end date, still running after midnight.
    assert_eq!(
        evaluate(std::slice::from_ref(&s), 0, utc("2026-03-04T01:00")).min_runners,
        4
    );
    let after = evaluate(std::slice::from_ref(&s), 0, utc("2026-03-04T02:00"));
    assert_eq!(after.min_runners, 0);
    assert_eq!(after.next_boundary, None, "no window after the end date");
}

#[test]
fn dst_spring_forward_moves_a_start_in_the_gap_forward_and_keeps_durations_elapsed() {
    // Europe/Berlin skips 02:00-03:00 on 2026-03-29.
    let mut gap = schedule("02:30", "", 2);
    gap.duration = "1h".into();
    gap.time_zone = "Europe/Berlin".into();
    let gap = parsed(&gap);
    let occ = gap.occurrence_on(date(2026, 3, 29)).unwrap();
    assert_eq!(occ.start, at("Europe/Berlin", "2026-03-29T03:30"));
    assert_eq!(
        occ.end.duration_since(occ.start),
        SignedDuration::from_hours(1)
    );

    // Wall-clock ends: 22:00 to 06:00 across the change lasts 7 real hours that night, 8 the night before.
    let mut night = schedule("22:00", "06:00", 1);
    night.time_zone = "Europe/Berlin".into();
    let night = parsed(&night);
    let short = night.occurrence_on(date(2026, 3, 28)).unwrap();
    assert_eq!(
        short.end.duration_since(short.start),
        SignedDuration::from_hours(7)
    );
    let normal = night.occurrence_on(date(2026, 3, 27)).unwrap();
    assert_eq!(
        normal.end.duration_since(normal.start),
        SignedDuration::from_hours(8)
    );
}

#[test]
fn dst_fall_back_uses_the_first_of_a_repeated_time() {
    // America/New_York repeats 01:00-02:00 on 2026-11-01.
    let mut s = schedule("01:30", "03:00", 2);
    s.time_zone = "America/New_York".into();
    let s = parsed(&s);
    let occ = s.occurrence_on(date(2026, 11, 1)).unwrap();
    assert_eq!(occ.start, utc("2026-11-01T05:30")); // 01:30 EDT
    assert_eq!(occ.end, utc("2026-11-01T08:00")); // 03:00 EST
    assert_eq!(
        occ.end.duration_since(occ.start),
        SignedDuration::from_mins(150)
    );
}

#[test]
fn invalid_schedules_are_explained() {
    let cases: Vec<(MinRunnersSchedule, &str)> = vec![
        (
            schedule("9:00", "17:00", 1),
            "start \"9:00\" is not a time HH:MM",
        ),
        (
            schedule("09:00", "24:00", 1),
            "end \"24:00\" is not a time HH:MM",
        ),
        (schedule("09:00", "", 1), "set end or duration"),
        (
            MinRunnersSchedule {
                duration: "1h".into(),
                ..schedule("09:00", "10:00", 1)
            },
            "not both",
        ),
        (
            MinRunnersSchedule {
                duration: "200h".into(),
                ..schedule("09:00", "", 1)
            },
            "at most 168h",
        ),
        (
            MinRunnersSchedule {
                duration: "soon".into(),
                ..schedule("09:00", "", 1)
            },
            "not a duration",
        ),
        (
            MinRunnersSchedule {
                time_zone: "Mars/Olympus".into(),
                ..schedule("09:00", "10:00", 1)
            },
            "not an IANA time zone",
        ),
        (
            MinRunnersSchedule {
                recurrence: "hourly".into(),
                ..schedule("09:00", "10:00", 1)
            },
            "recurrence \"hourly\"",
        ),
        (
            MinRunnersSchedule {
                recurrence: "weekly".into(),
                ..schedule("09:00", "10:00", 1)
            },
            "needs days",
        ),
        (
            MinRunnersSchedule {
                recurrence: "weekly".into(),
                days: vec!["funday".into()],
                ..schedule("09:00", "10:00", 1)
            },
            "day \"funday\"",
        ),
        (
            MinRunnersSchedule {
                recurrence: "monthly".into(),
                days_of_month: vec![32],
                ..schedule("09:00", "10:00", 1)
            },
            "daysOfMonth 32",
        ),
        (
            MinRunnersSchedule {
                days: vec!["monday".into()],
                ..schedule("09:00", "10:00", 1)
            },
            "only apply to a weekly",
        ),
        (
            MinRunnersSchedule {
                start_date: "2026-05-01".into(),
                end_date: "2026-04-01".into(),
                ..schedule("09:00", "10:00", 1)
            },
            "endDate is before startDate",
        ),
        (
            MinRunnersSchedule {
                end_date: "tomorrow".into(),
                ..schedule("09:00", "10:00", 1)
            },
            "endDate \"tomorrow\"",
        ),
        (schedule("09:00", "10:00", -1), "must not be negative"),
    ];
    for (spec, expected) in cases {
        let error = spec.parse(2).expect_err(expected).to_string();
        assert!(
            error.contains(expected),
            "{error:?} should contain {expected:?}"
        );
        assert!(error.contains("schedule-3"), "{error:?} names the schedule");
    }
    let high = schedule("09:00", "10:00", 5);
    assert_eq!(
        check(std::slice::from_ref(&high), 4)
            .unwrap_err()
            .to_string(),
        "minRunnersSchedules \"schedule-1\": minRunners (5) is greater than maxRunners (4)"
    );
    assert!(check(&[high], 5).is_ok());
    let many = vec![schedule("09:00", "10:00", 1); MAX_SCHEDULES + 1];
    assert!(parse_all(&many).is_err());
    assert!(parse_all(&many[..MAX_SCHEDULES]).is_ok());
}

#[test]
fn times_may_have_seconds() {
    let s = parsed(&schedule("09:00:30", "09:01:15", 1));
    let e = evaluate(std::slice::from_ref(&s), 0, utc("2026-03-02T09:00:29"));
    assert_eq!(e.next_boundary, Some(utc("2026-03-02T09:00:30")));
    let e = evaluate(&[s], 0, utc("2026-03-02T09:00:30"));
    assert_eq!(
        (e.min_runners, e.next_boundary),
        (1, Some(utc("2026-03-02T09:01:15")))
    );
}

#[test]
fn durations_accept_the_usual_spellings() {
    for (text, minutes) in [
        ("8h", 480),
        ("90m", 90),
        ("1h30m", 90),
        ("1h 30m", 90),
        ("PT2H", 120),
    ] {
        let s = parsed(&MinRunnersSchedule {
            duration: text.into(),
            ..schedule("09:00", "", 1)
        });
        assert_eq!(
            s.length,
            Length::Duration(SignedDuration::from_mins(minutes)),
            "{text}"
        );
    }
}

const ZONES: [&str; 5] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe", // half-hour DST shift
    "Asia/Kolkata",
];

fn arb_schedule() -> impl Strategy<Value = MinRunnersSchedule> {
    (
        0..24i8,
        0..60i8,
        prop_oneof![
            (0..24i8, 0..60i8).prop_map(|(h, m)| (format!("{h:02}:{m:02}"), String::new())),
            (1..(7 * 24 * 60i64)).prop_map(|mins| (String::new(), format!("{mins}m"))),
        ],
        0..4usize,
        0..5usize,
        0..10i64,
        proptest::option::of(0..400i64),
    )
        .prop_map(|(h, m, (end, duration), rec, zone, min, end_day)| {
            let mut s = MinRunnersSchedule {
                min_runners: min,
                start: format!("{h:02}:{m:02}"),
                end,
                duration,
                recurrence: RECURRENCES[rec].to_owned(),
                time_zone: ZONES[zone].to_owned(),
                ..MinRunnersSchedule::default()
            };
            match rec {
                2 => s.days = vec![DAY_NAMES[usize::from(h.unsigned_abs()) % 7].to_owned()],
                3 => s.days_of_month = vec![i64::from(m % 31) + 1, 29],
                _ => {}
            }
            if let Some(days) = end_day {
                let last = date(2026, 1, 1).checked_add(days.days()).unwrap();
                s.end_date = last.to_string();
            }
            s
        })
}

fn arb_instant() -> impl Strategy<Value = Timestamp> {
    // 2026 and 2027: every DST change of the zones above, both directions.
    (0..(2 * 365 * 24 * 3600i64)).prop_map(|secs| {
        utc("2026-01-01T00:00")
            .checked_add(SignedDuration::from_secs(secs))
            .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The evaluation is constant from `at` up to (not including) the next boundary, and the minimum is the
    /// base or the highest minimum of a window that contains the instant.
    #[test]
    fn the_minimum_only_changes_at_a_boundary(
        specs in proptest::collection::vec(arb_schedule(), 1..4),
        base in 0..5i64,
        at in arb_instant(),
        probes in proptest::collection::vec(0.0..1.0f64, 1..6),
    ) {
        let schedules: Vec<Schedule> = specs.iter().enumerate().map(|(i, s)| s.parse(i).unwrap()).collect();
        let here = evaluate(&schedules, base, at);
        let containing: Vec<i64> = schedules
            .iter()
            .filter(|s| {
                (-10..=1).any(|d| {
                    let day = s.time_zone.to_datetime(at).date().checked_add(d.days()).unwrap();
                    s.occurrence_on(day).is_some_and(|o| o.start <= at && at < o.end)
                })
            })
            .map(|s| s.min_runners)
            .collect();
        prop_assert_eq!(here.min_runners, containing.iter().copied().max().unwrap_or(base));
        prop_assert_eq!(here.active.is_some(), !containing.is_empty());
        let horizon = at.checked_add(SignedDuration::from_hours(24 * 60)).unwrap();
        let until = here.next_boundary.unwrap_or(horizon).min(horizon);
        prop_assert!(until > at);
        let span = until.duration_since(at);
        for p in probes {
            let probe = at.checked_add(span.mul_f64(p)).unwrap();
            if probe >= until { continue; }
            let there = evaluate(&schedules, base, probe);
            prop_assert_eq!((there.min_runners, &there.active), (here.min_runners, &here.active), "at {} vs {}", at, probe);
        }
    }

    /// In UTC, a daily window with an end time contains exactly the local times from start (inclusive) to end
    /// (exclusive), wrapping past midnight when end <= start.
    #[test]
    fn daily_windows_cover_their_wall_clock_span(
        sh in 0..24i8, sm in 0..60i8, eh in 0..24i8, em in 0..60i8, at in arb_instant(),
    ) {
        let s = parsed(&schedule(&format!("{sh:02}:{sm:02}"), &format!("{eh:02}:{em:02}"), 7));
        let minute_of_day = |h: i8, m: i8| i32::from(h) * 60 + i32::from(m);
        let now = at.to_zoned(TimeZone::UTC);
        let t = minute_of_day(now.hour(), now.minute());
        let (start, end) = (minute_of_day(sh, sm), minute_of_day(eh, em));
        let inside = if end > start { start <= t && t < end } else { t >= start || t < end };
        prop_assert_eq!(evaluate(&[s], 0, at).active.is_some(), inside);
    }

    /// A window with a duration lasts exactly that long in elapsed time, whatever the zone's DST changes.
    #[test]
    fn duration_windows_last_their_duration(spec in arb_schedule(), at in arb_instant()) {
        let s = spec.parse(0).unwrap();
        let day = s.time_zone.to_datetime(at).date();
        if let (Length::Duration(d), Some(o)) = (s.length, s.occurrence_on(day)) {
            prop_assert_eq!(o.end.duration_since(o.start), d);
        }
    }

    /// Past its end date (plus the longest window), a schedule is never active and has no boundary left; before
    /// that, every boundary it reports is the start of a window on or before the end date or the end of one.
    #[test]
    fn nothing_happens_after_the_end_date(spec in arb_schedule(), at in arb_instant()) {
        let s = spec.parse(0).unwrap();
        if let Some(last) = s.end_date {
            let limit = s.time_zone.to_timestamp(last.tomorrow().unwrap().to_datetime(Time::midnight())).unwrap();
            let e = evaluate(std::slice::from_ref(&s), 0, at);
            if at >= limit.checked_add(MAX_WINDOW).unwrap() {
                prop_assert_eq!(e.active, None);
                prop_assert_eq!(e.next_boundary, None);
            } else if let Some(next) = e.next_boundary && next >= limit {
                // Only the end of a window that started by the end date can lie past it.
                let ends_one = (-8..=0).any(|d| {
                    let day = last.checked_add(d.days()).unwrap();
                    s.occurrence_on(day).is_some_and(|o| o.end == next)
                });
                prop_assert!(ends_one, "boundary {} after the end date {}", next, last);
            }
        }
    }
}
