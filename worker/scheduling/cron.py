"""Schedule expressions as EventBridge Scheduler reads them: ``cron(...)``, ``rate(...)`` and ``at(...)``.

Pure functions of values (no clock): parse an expression once, then ask for the fire times after or at/before
an instant, in a given IANA time zone.

``cron(minutes hours day-of-month month day-of-week year)``:

====================  ===============  ==================
field                 values           wildcards
====================  ===============  ==================
minutes               0-59             , - * /
hours                 0-23             , - * /
day-of-month          1-31             , - * ? / L W
month                 1-12, JAN-DEC    , - * /
day-of-week           1-7, SUN-SAT     , - * ? L #
year                  1970-2199        , - * /
====================  ===============  ==================

Exactly one of day-of-month and day-of-week is ``?``. ``L`` is the last day of the month (day-of-month) or
Saturday (day-of-week); ``5L`` the month's last Thursday; ``3W`` the weekday nearest the 3rd (within the month);
``3#2`` the month's second Tuesday. Wall-clock times that do not exist on a daylight-saving change are skipped
and repeated ones fire once (the first), as Scheduler does.

``rate(value unit)`` with unit minute(s), hour(s) or day(s) (singular exactly when value is 1) fires every
interval from its anchor: the schedule's start date, else (a local choice; Scheduler starts at creation) the
Unix epoch, so that the times are the same in every process. ``at(yyyy-mm-ddThh:mm:ss)`` fires once, in the
schedule's time zone.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

MIN_YEAR = 1970
MAX_YEAR = 2199
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_MONTH_NAMES = {
    name: index
    for index, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), 1
    )
}
_DAY_NAMES = {"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
_RATE_UNITS = {"minute": 60, "hour": 3_600, "day": 86_400}


class ExpressionError(ValueError):
    """A schedule expression Scheduler would reject; the message says which part and why."""


@dataclass(frozen=True)
class DayOfMonth:
    """The day-of-month field: a set of days, ``L`` (last day) or ``nW`` (weekday nearest day n)."""

    days: frozenset[int] = frozenset()
    last: bool = False
    nearest_weekday: int | None = None

    def matches(self, day: date) -> bool:
        month_days = calendar.monthrange(day.year, day.month)[1]
        if self.last:
            return day.day == month_days
        if self.nearest_weekday is not None:
            return _nearest_weekday(day.year, day.month, self.nearest_weekday) == day.day
        return day.day in self.days


@dataclass(frozen=True)
class DayOfWeek:
    """The day-of-week field (1 = SUN .. 7 = SAT): a set, ``nL`` (last n of the month) or ``n#k`` (k-th n)."""

    days: frozenset[int] = frozenset()
    last_of_month: int | None = None
    nth: tuple[int, int] | None = None

    def matches(self, day: date) -> bool:
        weekday = aws_weekday(day)
        if self.last_of_month is not None:
            month_days = calendar.monthrange(day.year, day.month)[1]
            return weekday == self.last_of_month and day.day + 7 > month_days
        if self.nth is not None:
            wanted, occurrence = self.nth
            return weekday == wanted and (day.day - 1) // 7 + 1 == occurrence
        return weekday in self.days


@dataclass(frozen=True)
class CronExpression:
    """A parsed ``cron(...)`` expression."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    years: frozenset[int]
    day_of_month: DayOfMonth | None  # None: "?"
    day_of_week: DayOfWeek | None  # None: "?"

    def matches_date(self, day: date) -> bool:
        if day.year not in self.years or day.month not in self.months:
            return False
        if self.day_of_month is not None:
            return self.day_of_month.matches(day)
        assert self.day_of_week is not None  # parse() guarantees exactly one of them
        return self.day_of_week.matches(day)

    def local_times(self, start: date, *, reverse: bool = False) -> Iterator[datetime]:
        """Matching naive wall-clock times from ``start`` onwards (or backwards), in order, within 1970-2199."""
        step = timedelta(days=-1 if reverse else 1)
        hours = sorted(self.hours, reverse=reverse)
        minutes = sorted(self.minutes, reverse=reverse)
        first, last = date(MIN_YEAR, 1, 1), date(MAX_YEAR, 12, 31)
        day = min(max(start, first), last)
        while first <= day <= last:
            if self.matches_date(day):
                for hour in hours:
                    for minute in minutes:
                        yield datetime.combine(day, time(hour, minute))
            if day == (first if reverse else last):
                return
            day += step


@dataclass(frozen=True)
class RateExpression:
    """A parsed ``rate(...)`` expression."""

    text: str
    interval_s: int


@dataclass(frozen=True)
class AtExpression:
    """A parsed ``at(...)`` expression: one naive wall-clock time."""

    text: str
    local_time: datetime


Expression = CronExpression | RateExpression | AtExpression


def aws_weekday(day: date) -> int:
    """Scheduler's day-of-week number: 1 = Sunday .. 7 = Saturday."""
    return (day.weekday() + 1) % 7 + 1


def parse_expression(text: str) -> Expression:
    """Parse ``cron(...)``, ``rate(...)`` or ``at(...)``; raise ExpressionError naming the problem."""
    match = re.fullmatch(r"\s*(cron|rate|at)\((.*)\)\s*", text)
    if match is None:
        raise ExpressionError(f"{text!r} is not cron(...), rate(...) or at(...)")
    kind, body = match.group(1), match.group(2).strip()
    if kind == "cron":
        return _parse_cron(text.strip(), body)
    if kind == "rate":
        return _parse_rate(text.strip(), body)
    try:
        local = datetime.strptime(body, "%Y-%m-%dT%H:%M:%S")  # a wall time in the schedule's zone
    except ValueError:
        raise ExpressionError(f"at({body}): expected at(yyyy-mm-ddThh:mm:ss)") from None
    return AtExpression(text.strip(), local)


def next_fire_times(
    expression: Expression,
    zone: ZoneInfo,
    after: datetime,
    count: int,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[datetime]:
    """Up to ``count`` fire times (aware, UTC) strictly after ``after``, within [start, end] when given."""
    _require_aware(after)
    lower = after if start is None or start <= after else start - timedelta(microseconds=1)
    times: list[datetime] = []
    for fire in _forward(expression, zone, lower, anchor=start):
        if end is not None and fire > end:
            break
        times.append(fire)
        if len(times) >= count:
            break
    return times


def previous_fire_time(
    expression: Expression,
    zone: ZoneInfo,
    at_or_before: datetime,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> datetime | None:
    """The latest fire time (aware, UTC) at or before ``at_or_before`` within [start, end], or None."""
    _require_aware(at_or_before)
    upper = at_or_before if end is None or end >= at_or_before else end
    fire = _backward(expression, zone, upper, anchor=start)
    if fire is None or (start is not None and fire < start):
        return None
    return fire


def _forward(expression: Expression, zone: ZoneInfo, after: datetime, anchor: datetime | None) -> Iterator[datetime]:
    if isinstance(expression, AtExpression):
        fire = _to_utc(expression.local_time, zone)
        if fire is not None and fire > after:
            yield fire
        return
    if isinstance(expression, RateExpression):
        origin = anchor or EPOCH
        interval = timedelta(seconds=expression.interval_s)
        steps = 0 if after < origin else (after - origin) // interval + 1
        fire = origin + steps * interval
        while fire.year <= MAX_YEAR:
            yield fire
            fire += interval
        return
    first_day = after.astimezone(zone).date() - timedelta(days=1)
    for local in expression.local_times(first_day):
        fire = _to_utc(local, zone)
        if fire is not None and fire > after:
            yield fire


def _backward(expression: Expression, zone: ZoneInfo, upper: datetime, anchor: datetime | None) -> datetime | None:
    if isinstance(expression, AtExpression):
        fire = _to_utc(expression.local_time, zone)
        return fire if fire is not None and fire <= upper else None
    if isinstance(expression, RateExpression):
        origin = anchor or EPOCH
        if upper < origin:
            return None
        interval = timedelta(seconds=expression.interval_s)
        return origin + ((upper - origin) // interval) * interval
    last_day = upper.astimezone(zone).date() + timedelta(days=1)
    for local in expression.local_times(last_day, reverse=True):
        fire = _to_utc(local, zone)
        if fire is not None and fire <= upper:
            return fire
    return None


def _to_utc(local: datetime, zone: ZoneInfo) -> datetime | None:
    """The UTC instant of a wall-clock time; None when the time does not exist (a daylight-saving gap).

    A repeated wall-clock time maps to its first occurrence (fold=0), so it fires once.
    """
    aware = local.replace(tzinfo=zone, fold=0)
    instant = aware.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != local:
        return None
    return instant


def _require_aware(moment: datetime) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("fire-time queries need an aware datetime (for example datetime.now(UTC))")


def _nearest_weekday(year: int, month: int, day: int) -> int | None:
    month_days = calendar.monthrange(year, month)[1]
    if day > month_days:
        return None
    weekday = date(year, month, day).weekday()  # Monday = 0
    if weekday == 5:  # Saturday: Friday before, or Monday after when the 1st
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday: Monday after, or Friday before when the month's last day
        return day + 1 if day < month_days else day - 2
    return day


def _parse_rate(text: str, body: str) -> RateExpression:
    match = re.fullmatch(r"(\d+)\s+(minute|minutes|hour|hours|day|days)", body)
    if match is None:
        raise ExpressionError(f"{text}: expected rate(value unit) with unit minute(s), hour(s) or day(s)")
    value, unit = int(match.group(1)), match.group(2)
    if value < 1:
        raise ExpressionError(f"{text}: the value must be a positive integer")
    if (value == 1) != (not unit.endswith("s")):
        raise ExpressionError(f"{text}: use a singular unit for 1 and a plural unit otherwise")
    return RateExpression(text, value * _RATE_UNITS[unit.rstrip("s")])


def _parse_cron(text: str, body: str) -> CronExpression:
    fields = body.split()
    if len(fields) != 6:
        raise ExpressionError(f"{text}: cron needs 6 fields (minutes hours day-of-month month day-of-week year)")
    minute_f, hour_f, dom_f, month_f, dow_f, year_f = fields
    if (dom_f == "?") == (dow_f == "?"):
        raise ExpressionError(f"{text}: exactly one of day-of-month and day-of-week must be '?'")
    try:
        return CronExpression(
            text=text,
            minutes=tuple(sorted(_parse_set(minute_f, 0, 59, {}, "minutes"))),
            hours=tuple(sorted(_parse_set(hour_f, 0, 23, {}, "hours"))),
            months=frozenset(_parse_set(month_f, 1, 12, _MONTH_NAMES, "month")),
            years=frozenset(_parse_set(year_f, MIN_YEAR, MAX_YEAR, {}, "year")),
            day_of_month=None if dom_f == "?" else _parse_day_of_month(dom_f),
            day_of_week=None if dow_f == "?" else _parse_day_of_week(dow_f),
        )
    except ExpressionError as exc:
        raise ExpressionError(f"{text}: {exc}") from None


def _parse_day_of_month(field: str) -> DayOfMonth:
    if field == "L":
        return DayOfMonth(last=True)
    match = re.fullmatch(r"(\d{1,2})W", field)
    if match is not None:
        day = int(match.group(1))
        if not 1 <= day <= 31:
            raise ExpressionError(f"day-of-month {field!r}: W needs a day 1-31")
        return DayOfMonth(nearest_weekday=day)
    if "L" in field or "W" in field:
        raise ExpressionError(f"day-of-month {field!r}: L and W stand alone (L, or nW such as 15W)")
    return DayOfMonth(days=frozenset(_parse_set(field, 1, 31, {}, "day-of-month")))


def _parse_day_of_week(field: str) -> DayOfWeek:
    if field == "L":
        return DayOfWeek(days=frozenset({7}))
    match = re.fullmatch(r"([A-Za-z]{3}|\d)L", field)
    if match is not None:
        return DayOfWeek(last_of_month=_value(match.group(1), 1, 7, _DAY_NAMES, "day-of-week"))
    match = re.fullmatch(r"([A-Za-z]{3}|\d)#(\d)", field)
    if match is not None:
        occurrence = int(match.group(2))
        if not 1 <= occurrence <= 5:
            raise ExpressionError(f"day-of-week {field!r}: the occurrence after # is 1-5")
        return DayOfWeek(nth=(_value(match.group(1), 1, 7, _DAY_NAMES, "day-of-week"), occurrence))
    if "L" in field.upper().replace("SAT", "").replace("SUN", "") or "#" in field:
        raise ExpressionError(f"day-of-week {field!r}: L and # stand alone (L, nL or n#k)")
    return DayOfWeek(days=frozenset(_parse_set(field, 1, 7, _DAY_NAMES, "day-of-week")))


def _parse_set(field: str, low: int, high: int, names: dict[str, int], label: str) -> set[int]:
    """A field of values, ranges, steps and names (``*``, ``5``, ``1-5``, ``MON-FRI``, ``0/15``, ``1,3``)."""
    values: set[int] = set()
    for part in field.split(","):
        if not part:
            raise ExpressionError(f"{label} {field!r}: empty list item")
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ExpressionError(f"{label} {field!r}: the step after / must be a positive integer")
            step = int(step_text)
        if base == "*":
            start, stop = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, stop = _value(first, low, high, names, label), _value(last, low, high, names, label)
            if start > stop:
                raise ExpressionError(f"{label} {field!r}: range {base} runs backwards")
        else:
            start = _value(base, low, high, names, label)
            stop = high if step_text else start
        values.update(range(start, stop + 1, step))
    return values


def _value(text: str, low: int, high: int, names: dict[str, int], label: str) -> int:
    upper = text.upper()
    if upper in names:
        return names[upper]
    if not text.isdigit():
        raise ExpressionError(f"{label}: {text!r} is not a number" + (" or a name" if names else ""))
    value = int(text)
    if not low <= value <= high:
        raise ExpressionError(f"{label}: {value} is outside {low}-{high}")
    return value
