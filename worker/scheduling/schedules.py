"""Cron jobs defined once: the schedule file that both the worker and the Terraform module read.

The file (YAML)::

    schedules:
      - name: weekday-report                # 1-64 of [0-9A-Za-z-_.]; unique
        expression: cron(0 9 ? * MON-FRI *) # cron(...), rate(...) or at(...), see worker.scheduling.cron
        timezone: Europe/Berlin             # IANA zone; default UTC
        type: send_report                   # the job type a handler is registered for
        payload: {report: daily}            # the job's arguments (JSON values)
        flexible_window_minutes: 15         # optional, 0 (default) = fire on time, up to 1440
        enabled: true                       # optional, default true
        start_date: 2026-01-01T00:00:00Z    # optional, also the anchor of rate(...)
        end_date: 2027-01-01T00:00:00Z      # optional
        description: Daily report           # optional

What EventBridge Scheduler sends to the queue is the worker's envelope, with an idempotency key made of the
schedule's name and its scheduled time, so a double fire runs once::

    {"idempotency_key":"schedule:<name>:<aws.scheduler.scheduled-time>","payload":{...},"type":"<type>"}

Scheduler replaces ``<aws.scheduler.scheduled-time>`` with the time (``2026-11-30T08:00:00Z``). The body is
built byte for byte as Terraform's ``jsonencode`` builds it (keys sorted, compact, ``<>&`` escaped), so
``sqs-worker schedules fire`` and ``sqs-worker dev`` send exactly what Scheduler sends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from worker.envelope import describe_errors
from worker.errors import ConfigError
from worker.scheduling.cron import Expression, ExpressionError, next_fire_times, parse_expression, previous_fire_time

SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"
IDEMPOTENCY_PREFIX = "schedule"

log = logging.getLogger(__name__)


class Schedule(BaseModel):
    """One cron job: when it fires and the job it enqueues."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z_.\-]+$")
    expression: str = Field(description="cron(...), rate(...) or at(...) as EventBridge Scheduler reads them.")
    timezone: str = Field(default="UTC", description="IANA time zone the expression is evaluated in.")
    type: str = Field(min_length=1, max_length=256, description="The job type of the enqueued envelope.")
    payload: dict[str, JsonValue] = Field(default_factory=dict)
    flexible_window_minutes: int = Field(default=0, ge=0, le=1440, description="0: fire on time (window OFF).")
    enabled: bool = True
    start_date: AwareDatetime | None = None
    end_date: AwareDatetime | None = None
    description: str | None = Field(default=None, max_length=512)

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, value: str) -> str:
        try:
            parse_expression(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
        return value.strip()

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (for example Europe/Berlin)") from None
        return value

    @cached_property
    def parsed(self) -> Expression:
        return parse_expression(self.expression)

    @cached_property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_fire_times(self, after: datetime, count: int) -> list[datetime]:
        """Up to ``count`` fire times (UTC) strictly after ``after``."""
        return next_fire_times(self.parsed, self.zone, after, count, start=self.start_date, end=self.end_date)

    def latest_fire_time(self, at_or_before: datetime) -> datetime | None:
        """The latest fire time (UTC) at or before ``at_or_before``, or None if it never fired by then."""
        return previous_fire_time(self.parsed, self.zone, at_or_before, start=self.start_date, end=self.end_date)

    def body_template(self) -> str:
        """The target input Terraform gives Scheduler: the envelope with the scheduled-time placeholder."""
        return (
            '{"idempotency_key":"' + f"{IDEMPOTENCY_PREFIX}:{self.name}:{SCHEDULED_TIME}" + '",'
            f'"payload":{terraform_json(self.payload)},"type":{terraform_json(self.type)}}}'
        )

    def idempotency_key(self, scheduled_time: datetime) -> str:
        """The key of the fire at ``scheduled_time``, as its message body carries it."""
        return f"{IDEMPOTENCY_PREFIX}:{self.name}:{format_scheduled_time(scheduled_time)}"

    def message_body(self, scheduled_time: datetime) -> str:
        """The exact SQS message body Scheduler sends for the fire at ``scheduled_time``."""
        return self.body_template().replace(SCHEDULED_TIME, format_scheduled_time(scheduled_time))


class ScheduleFile(BaseModel):
    """The whole schedule file."""

    model_config = ConfigDict(extra="forbid")

    schedules: list[Schedule] = Field(default_factory=list)

    @field_validator("schedules")
    @classmethod
    def _unique_names(cls, value: list[Schedule]) -> list[Schedule]:
        seen: set[str] = set()
        for schedule in value:
            if schedule.name in seen:
                raise ValueError(f"schedule name {schedule.name!r} appears twice")
            seen.add(schedule.name)
        return value


def format_scheduled_time(moment: datetime) -> str:
    """Scheduler's ``<aws.scheduler.scheduled-time>`` format: ISO 8601 UTC, whole seconds, ``Z``; milliseconds
    only for a moment that has them (``schedules fire --now``: never a slot of Scheduler's)."""
    if moment.tzinfo is None:
        raise ValueError("scheduled times must be aware datetimes")
    utc = moment.astimezone(UTC)
    milliseconds = utc.microsecond // 1000
    if milliseconds:
        return utc.strftime("%Y-%m-%dT%H:%M:%S") + f".{milliseconds:03d}Z"
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def terraform_json(value: Any) -> str:
    """JSON as Terraform's ``jsonencode`` writes it: compact, keys sorted, ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped, other text as UTF-8, and whole numbers without a fraction (Terraform numbers are not typed)."""
    text = json.dumps(_whole_floats_as_ints(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text


def _whole_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_floats_as_ints(item) for item in value]
    return value


def load_schedules(path: str | Path) -> list[Schedule]:
    """Read and validate a schedule file; a ConfigError names the file and each problem."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the schedule file {file}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"the schedule file {file} is not valid YAML: {exc}") from exc
    return parse_schedules(data if data is not None else {}, source=str(file))


def parse_schedules(data: object, *, source: str = "schedules") -> list[Schedule]:
    """Validate already-decoded schedule data (the YAML document)."""
    try:
        return ScheduleFile.model_validate(data).schedules
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_errors(exc)}") from exc


def find_schedule(schedules: Sequence[Schedule], name: str) -> Schedule:
    for schedule in schedules:
        if schedule.name == name:
            return schedule
    known = ", ".join(schedule.name for schedule in schedules) or "none"
    raise ConfigError(f"no schedule named {name!r} (known: {known})")


def utc_now() -> datetime:
    return datetime.now(UTC)


async def wait_for_stop(stop: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``stop`` is set or ``timeout_s`` passes; True when stopped."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(timeout_s, 0.0))
    except TimeoutError:
        return stop.is_set()
    return True


SendBody = Callable[[str, Schedule], Awaitable[None]]


async def run_local_scheduler(
    schedules: Sequence[Schedule],
    send_body: SendBody,
    stop: asyncio.Event,
    *,
    now: Callable[[], datetime] = utc_now,
    wait: Callable[[asyncio.Event, float], Awaitable[bool]] = wait_for_stop,
    max_wait_s: float = 60.0,
) -> None:
    """Fire the enabled schedules on time until ``stop`` is set (``sqs-worker dev``: emulators never fire them).

    Each fire calls ``send_body(body, schedule)`` with exactly what Scheduler would send. Times that passed
    before the start are not fired; after a stall (a suspended laptop), only the latest missed time of each
    schedule fires. Waits are capped at ``max_wait_s`` so that a jump of the wall clock is noticed. A failing
    send is logged and does not stop the other schedules.
    """
    active = [schedule for schedule in schedules if schedule.enabled]
    started = now()
    due: dict[str, datetime] = {}
    for schedule in active:
        upcoming = schedule.next_fire_times(started, 1)
        if upcoming:
            due[schedule.name] = upcoming[0]
    by_name = {schedule.name: schedule for schedule in active}
    while not stop.is_set():
        if not due:
            await stop.wait()
            return
        current = now()
        soonest = min(due.values())
        if soonest > current:
            if await wait(stop, min((soonest - current).total_seconds(), max_wait_s)):
                return
            continue
        for name, fire_time in sorted(due.items(), key=lambda item: item[1]):
            if stop.is_set():
                return
            if fire_time > current:
                continue
            schedule = by_name[name]
            scheduled = schedule.latest_fire_time(current) or fire_time
            await _fire(schedule, scheduled, send_body)
            upcoming = schedule.next_fire_times(max(current, scheduled), 1)
            if upcoming:
                due[name] = upcoming[0]
            else:
                del due[name]


async def _fire(schedule: Schedule, scheduled: datetime, send_body: SendBody) -> None:
    body = schedule.message_body(scheduled)
    try:
        await send_body(body, schedule)
    except Exception:  # one failing schedule must not stop the others; the next fire tries again
        log.exception("schedule %s: sending the job for %s failed", schedule.name, format_scheduled_time(scheduled))
    else:
        log.info("schedule %s fired for %s", schedule.name, format_scheduled_time(scheduled))
