"""The schedule file, AWS schedule expressions with time zones, Scheduler's exact body, and the local scheduler."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.envelope import parse_envelope
from worker.errors import ConfigError
from worker.scheduling.cron import ExpressionError, aws_weekday, next_fire_times, parse_expression, previous_fire_time
from worker.scheduling.schedules import (
    Schedule,
    format_scheduled_time,
    load_schedules,
    parse_schedules,
    run_local_scheduler,
    terraform_json,
)

ROOT = Path(__file__).resolve().parents[1]
UTC_ZONE = ZoneInfo("UTC")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(expression: str, after: datetime, count: int = 5, zone: str = "UTC") -> list[datetime]:
    return next_fire_times(parse_expression(expression), ZoneInfo(zone), after, count)


# --- Parsing -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("cron(0 9 * * *)", "6 fields"),
        ("cron(0 9 * * MON *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 9 ? * ? *)", "exactly one of day-of-month and day-of-week"),
        ("cron(60 9 * * ? *)", "60 is outside 0-59"),
        ("cron(0 24 * * ? *)", "24 is outside 0-23"),
        ("cron(0 9 0 * ? *)", "0 is outside 1-31"),
        ("cron(0 9 ? * 8 *)", "8 is outside 1-7"),
        ("cron(0 9 ? FOO * *)", "not a number or a name"),
        ("cron(0 9 * * ? 1969)", "outside 1970-2199"),
        ("cron(0 17-9 * * ? *)", "runs backwards"),
        ("cron(0/0 9 * * ? *)", "positive integer"),
        ("cron(0,,5 9 * * ? *)", "empty list item"),
        ("cron(0 9 L,5 * ? *)", "stand alone"),
        ("cron(0 9 ? * 2#6 *)", "1-5"),
        ("cron(0 9 ? * 2#1,3 *)", "stand alone"),
        ("cron(0 9 32W * ? *)", "W needs a day 1-31"),
        ("rate(1 minutes)", "singular"),
        ("rate(5 minute)", "singular"),
        ("rate(0 minutes)", "positive"),
        ("rate(5 weeks)", "minute(s), hour(s) or day(s)"),
        ("at(2026-13-01T00:00:00)", "yyyy-mm-ddThh:mm:ss"),
        ("at(2026-01-01 00:00)", "yyyy-mm-ddThh:mm:ss"),
        ("every day at nine", "not cron(...), rate(...) or at(...)"),
    ],
)
def test_invalid_expressions_are_rejected_with_the_reason(expression: str, problem: str) -> None:
    with pytest.raises(ExpressionError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_expression(expression)


def test_aws_weekday_numbers_sunday_as_one() -> None:
    assert [aws_weekday(utc(2026, 11, 29 + offset).date()) for offset in range(2)] == [1, 2]  # Sun, Mon
    assert aws_weekday(utc(2026, 11, 28).date()) == 7  # Saturday


# --- Cron fire times ---------------------------------------------------------------------------------------


def test_weekdays_at_nine_in_berlin_in_winter_and_summer() -> None:
    # Friday 2026-11-27 noon UTC: next is Monday 09:00 CET = 08:00 UTC.
    assert fires("cron(0 9 ? * MON-FRI *)", utc(2026, 11, 27, 12), 3, "Europe/Berlin") == [
        utc(2026, 11, 30, 8),
        utc(2026, 12, 1, 8),
        utc(2026, 12, 2, 8),
    ]
    assert fires("cron(0 9 ? * MON-FRI *)", utc(2026, 7, 3, 12), 1, "Europe/Berlin") == [utc(2026, 7, 6, 7)]  # CEST


def test_fire_times_are_strictly_after_the_given_instant() -> None:
    assert fires("cron(0 9 * * ? *)", utc(2026, 1, 1, 9), 1) == [utc(2026, 1, 2, 9)]
    assert fires("cron(0 9 * * ? *)", utc(2026, 1, 1, 8, 59, 59), 1) == [utc(2026, 1, 1, 9)]


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("cron(0/15 * * * ? *)", utc(2026, 1, 1, 10, 1), [utc(2026, 1, 1, 10, m) for m in (15, 30, 45)]),
        ("cron(5/20 10 * * ? *)", utc(2026, 1, 1, 10), [utc(2026, 1, 1, 10, m) for m in (5, 25, 45)]),
        ("cron(0 9-17/4 * * ? *)", utc(2026, 1, 1), [utc(2026, 1, 1, h) for h in (9, 13, 17)]),
        ("cron(0 8,20 * * ? *)", utc(2026, 1, 1), [utc(2026, 1, 1, 8), utc(2026, 1, 1, 20), utc(2026, 1, 2, 8)]),
        ("cron(0 0 1 JAN,jul ? *)", utc(2026, 1, 2), [utc(2026, 7, 1), utc(2027, 1, 1), utc(2027, 7, 1)]),
        ("cron(0 0 29 2 ? *)", utc(2026, 1, 1), [utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)]),
        ("cron(0 0 1 1 ? 2027-2028)", utc(2026, 6, 1), [utc(2027, 1, 1), utc(2028, 1, 1)]),
        ("cron(0 0 1 1 ? 2030/10)", utc(2026, 6, 1), [utc(2030, 1, 1), utc(2040, 1, 1), utc(2050, 1, 1)]),
        (
            "cron(0 12 ? * SAT,SUN *)",
            utc(2026, 11, 26),
            [utc(2026, 11, 28, 12), utc(2026, 11, 29, 12), utc(2026, 12, 5, 12)],
        ),
    ],
)
def test_lists_ranges_steps_names_and_years(expression: str, after: datetime, expected: list[datetime]) -> None:
    assert fires(expression, after, 3) == expected


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        # L: last day of the month (leap years included).
        ("cron(0 12 L * ? *)", utc(2028, 1, 31, 13), [utc(2028, 2, 29, 12), utc(2028, 3, 31, 12)]),
        # 15W: the 15th of Aug 2026 is a Saturday -> Friday 14th; of Nov 2026 a Sunday -> Monday 16th.
        ("cron(0 12 15W * ? *)", utc(2026, 8, 1), [utc(2026, 8, 14, 12), utc(2026, 9, 15, 12)]),
        ("cron(0 12 15W * ? *)", utc(2026, 11, 1), [utc(2026, 11, 16, 12), utc(2026, 12, 15, 12)]),
        # 1W: May 1st 2027 is a Saturday -> Monday 3rd (never into April).
        ("cron(0 12 1W * ? *)", utc(2027, 4, 2), [utc(2027, 5, 3, 12), utc(2027, 6, 1, 12)]),
        # 31W: Jan 31st 2027 is a Sunday -> Friday 29th; months without a 31st do not fire.
        ("cron(0 12 31W * ? *)", utc(2027, 1, 1), [utc(2027, 1, 29, 12), utc(2027, 3, 31, 12)]),
        # 3#2: the second Tuesday (Dec 2026 starts on a Tuesday).
        ("cron(0 10 ? * 3#2 *)", utc(2026, 12, 1), [utc(2026, 12, 8, 10), utc(2027, 1, 12, 10)]),
        ("cron(0 10 ? * TUE#1 *)", utc(2026, 11, 30), [utc(2026, 12, 1, 10), utc(2027, 1, 5, 10)]),
        # 6L: the last Friday of the month.
        ("cron(0 10 ? * 6L *)", utc(2026, 12, 1), [utc(2026, 12, 25, 10), utc(2027, 1, 29, 10)]),
        # L alone in day-of-week: Saturday.
        ("cron(0 10 ? * L *)", utc(2026, 11, 29), [utc(2026, 12, 5, 10), utc(2026, 12, 12, 10)]),
    ],
)
def test_last_nearest_weekday_and_nth_weekday(expression: str, after: datetime, expected: list[datetime]) -> None:
    assert fires(expression, after, 2) == expected


def test_a_wall_time_skipped_by_daylight_saving_does_not_fire() -> None:
    # Berlin: 2026-03-29 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    times = fires("cron(30 2 * * ? *)", utc(2026, 3, 27, 12), 3, "Europe/Berlin")
    assert times == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30), utc(2026, 3, 31, 0, 30)]


def test_a_wall_time_repeated_by_daylight_saving_fires_once() -> None:
    # Berlin: 2026-10-25 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice; it fires at the first.
    times = fires("cron(30 2 * * ? *)", utc(2026, 10, 24, 12), 3, "Europe/Berlin")
    assert times == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]


def test_an_impossible_date_never_fires() -> None:
    assert fires("cron(0 0 31 2 ? *)", utc(2026, 1, 1), 1) == []
    assert previous_fire_time(parse_expression("cron(0 0 31 2 ? *)"), UTC_ZONE, utc(2026, 1, 1)) is None


def test_no_fire_after_the_last_year() -> None:
    assert fires("cron(0 0 1 1 ? *)", utc(2199, 6, 1), 2) == []


# --- rate(...) and at(...) ---------------------------------------------------------------------------------


def test_rate_is_anchored_at_the_epoch_without_a_start_date() -> None:
    assert fires("rate(15 minutes)", utc(2026, 11, 29, 10, 7), 3) == [
        utc(2026, 11, 29, 10, 15),
        utc(2026, 11, 29, 10, 30),
        utc(2026, 11, 29, 10, 45),
    ]
    assert fires("rate(1 day)", utc(2026, 11, 29, 10), 1) == [utc(2026, 11, 30)]


def test_rate_is_anchored_at_the_start_date_and_stops_at_the_end_date() -> None:
    expression = parse_expression("rate(2 hours)")
    start, end = utc(2026, 1, 1, 9, 30), utc(2026, 1, 1, 14)
    times = next_fire_times(expression, UTC_ZONE, utc(2025, 1, 1), 10, start=start, end=end)
    assert times == [utc(2026, 1, 1, 9, 30), utc(2026, 1, 1, 11, 30), utc(2026, 1, 1, 13, 30)]
    assert previous_fire_time(expression, UTC_ZONE, utc(2026, 1, 1, 9), start=start) is None
    assert previous_fire_time(expression, UTC_ZONE, utc(2026, 1, 1, 12), start=start) == utc(2026, 1, 1, 11, 30)
    assert previous_fire_time(expression, UTC_ZONE, utc(2027, 1, 1), start=start, end=end) == utc(2026, 1, 1, 13, 30)


def test_at_fires_once_in_the_schedules_zone() -> None:
    expression = parse_expression("at(2026-12-24T18:00:00)")
    zone = ZoneInfo("America/New_York")
    assert next_fire_times(expression, zone, utc(2026, 1, 1), 5) == [utc(2026, 12, 24, 23)]
    assert next_fire_times(expression, zone, utc(2026, 12, 24, 23), 5) == []
    assert previous_fire_time(expression, zone, utc(2026, 12, 25)) == utc(2026, 12, 24, 23)
    assert previous_fire_time(expression, zone, utc(2026, 12, 24, 22)) is None


def test_queries_need_aware_datetimes() -> None:
    with pytest.raises(ValueError, match="aware"):
        next_fire_times(parse_expression("rate(1 hour)"), UTC_ZONE, datetime(2026, 1, 1), 1)


EXPRESSIONS = [
    "cron(0 9 ? * MON-FRI *)",
    "cron(*/7 1-5 * * ? *)",
    "cron(30 2 * * ? *)",
    "cron(15 23 L * ? *)",
    "cron(0 12 15W * ? *)",
    "cron(0 6 ? * 2#3 *)",
    "cron(45 0 ? * 1L *)",
    "rate(7 minutes)",
    "rate(3 hours)",
]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]


@settings(max_examples=60, deadline=None)
@given(
    expression=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(ZONES),
    after=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2150, 1, 1), timezones=st.just(UTC)),
)
def test_fire_times_ascend_and_each_is_its_own_latest(expression: str, zone: str, after: datetime) -> None:
    parsed, tz = parse_expression(expression), ZoneInfo(zone)
    times = next_fire_times(parsed, tz, after, 4)
    assert len(times) == 4
    assert times == sorted(set(times)) and times[0] > after
    for moment in times:
        assert moment.second == 0 and moment.microsecond == 0
        assert previous_fire_time(parsed, tz, moment) == moment
        assert next_fire_times(parsed, tz, moment - timedelta(seconds=1), 1) == [moment]
    assert previous_fire_time(parsed, tz, times[1] - timedelta(seconds=1)) == times[0]
    assert previous_fire_time(parsed, tz, after) is not None and previous_fire_time(parsed, tz, after) <= after  # type: ignore[operator]


# --- Scheduler's body --------------------------------------------------------------------------------------


def report(**overrides: object) -> Schedule:
    fields: dict[str, object] = {
        "name": "weekday-report",
        "expression": "cron(0 9 ? * MON-FRI *)",
        "timezone": "Europe/Berlin",
        "type": "send_report",
        "payload": {"report": "daily", "limit": 10},
    }
    fields.update(overrides)
    return Schedule.model_validate(fields)


def test_body_template_is_the_envelope_with_the_scheduled_time_placeholder() -> None:
    assert report().body_template() == (
        '{"idempotency_key":"schedule:weekday-report:<aws.scheduler.scheduled-time>",'
        '"payload":{"limit":10,"report":"daily"},"type":"send_report"}'
    )


def test_message_body_fills_in_the_time_as_scheduler_formats_it() -> None:
    berlin = datetime(2026, 11, 30, 9, 0, 12, 345, tzinfo=ZoneInfo("Europe/Berlin"))
    body = report().message_body(berlin)
    envelope = parse_envelope(body)
    assert envelope.type == "send_report"
    assert envelope.payload == {"report": "daily", "limit": 10}
    assert envelope.idempotency_key == "schedule:weekday-report:2026-11-30T08:00:12Z"
    assert format_scheduled_time(utc(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"
    moment = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)  # `fire --now`'s: never one of Scheduler's
    assert format_scheduled_time(moment) == "2026-01-02T03:04:05.678Z"


def test_the_same_fire_gives_the_same_body_and_another_fire_another() -> None:
    schedule = report()
    assert schedule.message_body(utc(2026, 11, 30, 8)) == schedule.message_body(utc(2026, 11, 30, 8))
    assert schedule.message_body(utc(2026, 11, 30, 8)) != schedule.message_body(utc(2026, 12, 1, 8))


def test_terraform_json_matches_jsonencode() -> None:
    value = {"b": [1, 2.5, 3.0, True, None], "a": {"z": "<tag> & \u2028 café"}}
    assert terraform_json(value) == ('{"a":{"z":"\\u003ctag\\u003e \\u0026 \\u2028 café"},"b":[1,2.5,3,true,null]}')
    assert json.loads(terraform_json(value))["a"]["z"] == "<tag> & \u2028 café"


# --- The schedule file -------------------------------------------------------------------------------------


def test_the_example_file_is_valid() -> None:
    schedules = load_schedules(ROOT / "schedules.example.yaml")
    assert [schedule.name for schedule in schedules] == ["weekday-report", "month-end-close", "cache-refresh"]
    assert all(schedule.next_fire_times(utc(2026, 1, 1), 1) for schedule in schedules)


def test_defaults() -> None:
    schedule = parse_schedules({"schedules": [{"name": "a", "expression": "rate(1 hour)", "type": "t"}]})[0]
    assert (schedule.timezone, schedule.payload, schedule.enabled, schedule.flexible_window_minutes) == (
        "UTC",
        {},
        True,
        0,
    )


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"name": "bad name!", "expression": "rate(1 hour)", "type": "t"}, "schedules.0.name"),
        ({"name": "a", "expression": "cron(0 9 * * * *)", "type": "t"}, "exactly one of day-of-month"),
        ({"name": "a", "expression": "rate(1 hour)", "type": "t", "timezone": "Mars/Olympus"}, "IANA time zone"),
        ({"name": "a", "expression": "rate(1 hour)", "type": "t", "flexible_window_minutes": 2000}, "1440"),
        ({"name": "a", "expression": "rate(1 hour)", "type": "t", "colour": "red"}, "colour"),
        ({"name": "a", "expression": "rate(1 hour)"}, "schedules.0.type"),
        ({"name": "a", "expression": "rate(1 hour)", "type": "t", "payload": [1]}, "payload"),
    ],
)
def test_invalid_entries_name_the_problem(entry: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(")):
        parse_schedules({"schedules": [entry]})


def test_names_are_unique() -> None:
    entry = {"name": "a", "expression": "rate(1 hour)", "type": "t"}
    with pytest.raises(ConfigError, match="appears twice"):
        parse_schedules({"schedules": [entry, entry]})


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the schedule file"):
        load_schedules(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("schedules: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_schedules(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert load_schedules(empty) == []


# --- The local scheduler (fake clock) ----------------------------------------------------------------------


class FakeClock:
    """``now`` and ``wait`` for run_local_scheduler: waiting advances the clock instead of sleeping."""

    def __init__(self, start: datetime) -> None:
        self.current = start
        self.waits: list[float] = []

    def now(self) -> datetime:
        return self.current

    async def wait(self, stop: asyncio.Event, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        if stop.is_set():
            return True
        self.current += timedelta(seconds=timeout_s)
        await asyncio.sleep(0)
        return stop.is_set()


async def run_until(
    schedules: list[Schedule], clock: FakeClock, sends: int, fail: set[str] | None = None
) -> list[tuple[datetime, str, str]]:
    stop = asyncio.Event()
    sent: list[tuple[datetime, str, str]] = []

    async def send_body(body: str, schedule: Schedule) -> None:
        sent.append((clock.now(), schedule.name, body))
        if len(sent) >= sends:
            stop.set()
        if fail and schedule.name in fail:
            raise RuntimeError("queue unavailable")

    await asyncio.wait_for(run_local_scheduler(schedules, send_body, stop, now=clock.now, wait=clock.wait), 5)
    return sent


async def test_local_scheduler_fires_each_schedule_on_time_with_the_exact_body() -> None:
    every_five = Schedule(name="five", expression="rate(5 minutes)", type="tick")
    hourly = report(name="hourly", expression="cron(0 * * * ? *)", timezone="UTC")
    clock = FakeClock(utc(2026, 11, 29, 10, 58, 30))
    sent = await run_until([every_five, hourly], clock, sends=4)
    assert [(when, name) for when, name, _ in sent] == [
        (utc(2026, 11, 29, 11, 0), "five"),
        (utc(2026, 11, 29, 11, 0), "hourly"),
        (utc(2026, 11, 29, 11, 5), "five"),
        (utc(2026, 11, 29, 11, 10), "five"),
    ]
    assert sent[1][2] == hourly.message_body(utc(2026, 11, 29, 11))
    assert parse_envelope(sent[0][2]).idempotency_key == "schedule:five:2026-11-29T11:00:00Z"
    assert max(clock.waits) <= 60.0, "waits are capped so a wall-clock jump is noticed"


async def test_local_scheduler_skips_disabled_schedules_and_survives_a_failing_send() -> None:
    disabled = Schedule(name="off", expression="rate(1 minute)", type="tick", enabled=False)
    failing = Schedule(name="failing", expression="rate(5 minutes)", type="tick")
    working = Schedule(name="working", expression="rate(10 minutes)", type="tick")
    clock = FakeClock(utc(2026, 1, 1, 0, 0, 1))
    sent = await run_until([disabled, failing, working], clock, sends=5, fail={"failing"})
    assert [(when.minute, name) for when, name, _ in sent] == [
        (5, "failing"),
        (10, "failing"),
        (10, "working"),
        (15, "failing"),
        (20, "failing"),
    ]


async def test_local_scheduler_fires_only_the_latest_missed_time_after_a_stall() -> None:
    schedule = Schedule(name="minutely", expression="rate(1 minute)", type="tick")
    clock = FakeClock(utc(2026, 1, 1, 0, 0, 30))
    stop = asyncio.Event()
    sent: list[str] = []

    async def stall_then_wait(event: asyncio.Event, timeout_s: float) -> bool:
        clock.current += timedelta(hours=3)  # the laptop slept
        return await clock.wait(event, 0)

    async def send_body(body: str, schedule: Schedule) -> None:
        sent.append(body)
        stop.set()

    await asyncio.wait_for(run_local_scheduler([schedule], send_body, stop, now=clock.now, wait=stall_then_wait), 5)
    assert sent == [schedule.message_body(utc(2026, 1, 1, 3, 0))]


async def test_local_scheduler_without_schedules_waits_for_stop_and_returns_promptly() -> None:
    stop = asyncio.Event()

    async def send_body(body: str, schedule: Schedule) -> None:
        raise AssertionError("nothing to send")

    task = asyncio.create_task(run_local_scheduler([], send_body, stop))
    await asyncio.sleep(0)
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_local_scheduler_stops_during_a_real_wait() -> None:
    schedule = Schedule(name="yearly", expression="cron(0 0 1 1 ? *)", type="tick")

    async def send_body(body: str, schedule: Schedule) -> None:
        raise AssertionError("must not fire")

    stop = asyncio.Event()
    task = asyncio.create_task(run_local_scheduler([schedule], send_body, stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 1)  # the wait awaits the stop event; no sleep to sit out
