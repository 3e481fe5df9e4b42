"""``sqs-worker schedules list|fire``: the cron jobs of the schedule file, locally.

Emulators never fire EventBridge Scheduler schedules, so ``fire NAME`` enqueues exactly what Scheduler would
send for the schedule's latest due time (or ``--at``), and ``list`` prints the next fire times. With
WORKER_IDEMPOTENCY_TABLE set, ``fire`` says when that time's key ``schedule:NAME:<time>`` is already COMPLETED
(the worker skips the message as a duplicate); ``--now`` fires for the current time instead, a fresh key.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from worker.commands import NOT_FOUND_EXIT
from worker.errors import ConfigError

if TYPE_CHECKING:
    from worker.scheduling.schedules import Schedule


def add_parser(subparsers: Any) -> None:
    schedules = subparsers.add_parser(
        "schedules",
        help="list the cron jobs' next fire times, or fire one now",
        description="The cron jobs of the schedule file (WORKER_SCHEDULES_FILE or --file).",
    )
    actions = schedules.add_subparsers(dest="schedules_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="print each schedule's next fire times (UTC and its time zone)")
    listing.add_argument("--count", type=int, default=5, help="fire times per schedule (default: 5, at most 100)")
    listing.add_argument("--file", default=None, help="the schedule file (default: WORKER_SCHEDULES_FILE)")
    listing.set_defaults(func=cmd_list)

    fire = actions.add_parser("fire", help="enqueue exactly what EventBridge Scheduler would send for a schedule, now")
    fire.add_argument("name", help="the schedule's name")
    fire.add_argument(
        "--at",
        default=None,
        help="the scheduled time to fire for, ISO 8601 (default: the schedule's latest due time)",
    )
    fire.add_argument(
        "--now",
        action="store_true",
        help="fire for the current time (a fresh idempotency key), not one of the schedule's fire times",
    )
    fire.add_argument("--file", default=None, help="the schedule file (default: WORKER_SCHEDULES_FILE)")
    fire.set_defaults(func=cmd_fire)


def _schedules(file: str | None) -> list[Schedule]:
    from worker.scheduling.schedules import load_schedules
    from worker.settings import load_settings

    path = file or load_settings().schedules_file
    if not path:
        raise ConfigError("no schedule file: set WORKER_SCHEDULES_FILE or pass --file")
    return load_schedules(path)


def cmd_list(args: argparse.Namespace) -> int:
    if not 1 <= args.count <= 100:
        raise ConfigError("--count must be 1..100")
    now = datetime.now(UTC)
    for schedule in _schedules(args.file):
        print(render_schedule(schedule, now, args.count))
    return 0


def render_schedule(schedule: Schedule, now: datetime, count: int) -> str:
    """A schedule's block in ``schedules list``: its definition and next fire times."""
    from worker.scheduling.schedules import format_scheduled_time

    state = "" if schedule.enabled else " (disabled)"
    window = f", flexible window {schedule.flexible_window_minutes} min" if schedule.flexible_window_minutes else ""
    lines = [f"{schedule.name}{state}: {schedule.expression} in {schedule.timezone}{window} -> job {schedule.type}"]
    times = schedule.next_fire_times(now, count)
    if not times:
        lines.append("  (no fire time left)")
    for moment in times:
        local = moment.astimezone(schedule.zone).strftime("%a %Y-%m-%d %H:%M %Z")
        lines.append(f"  {format_scheduled_time(moment)}  ({local})")
    return "\n".join(lines)


def cmd_fire(args: argparse.Namespace) -> int:
    from worker.backends.aws import sync_client
    from worker.ops.fire import send_scheduled
    from worker.scheduling.schedules import find_schedule, format_scheduled_time
    from worker.settings import load_settings

    schedules = _schedules(args.file)
    try:
        schedule = find_schedule(schedules, args.name)
    except ConfigError as exc:  # nothing by that name: exit 3, as the other commands say it
        print(f"sqs-worker: error: {exc}", file=sys.stderr)
        return NOT_FOUND_EXIT
    if args.now and args.at is not None:
        raise ConfigError("pass --at or --now, not both")
    scheduled = _now_ms() if args.now else _scheduled_time(schedule, args.at)
    settings = load_settings()
    client = sync_client("sqs")
    note = None  # read before the send: after it, a running worker may have completed this very message
    if settings.idempotency_table:
        note = _ledger_note(settings.idempotency_table, schedule.idempotency_key(scheduled), schedule.name)
    message_id = send_scheduled(client, settings.queue, schedule, scheduled)
    print(f"{schedule.name} fired for {format_scheduled_time(scheduled)}: message {message_id}")
    if note:
        print(note)
    return 0


def _now_ms() -> datetime:
    """Now, to the millisecond: two `--now` fires in one second still get keys of their own."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _ledger_note(table: str, key: str, name: str) -> str | None:
    """What the worker will do with this key, when the ledger already holds it as done or running."""
    import asyncio
    import time

    from botocore.exceptions import BotoCoreError, ClientError

    from worker.commands.status import fetch
    from worker.errors import WorkerError
    from worker.ops.fire import skip_note

    try:
        record = asyncio.run(fetch(table, key))
    except (WorkerError, BotoCoreError, ClientError) as exc:  # say what is unknown, not fail
        return f"note: could not read key {key} in table {table} ({exc}): whether the worker runs it is unknown"
    return skip_note(key, record, name=name, table=table, now_ms=int(time.time() * 1000))


def _scheduled_time(schedule: Schedule, at: str | None) -> datetime:
    if at is None:
        latest = schedule.latest_fire_time(datetime.now(UTC))
        if latest is None:
            raise ConfigError(f"schedule {schedule.name!r} has no due fire time yet: pass --at")
        return latest
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        raise ConfigError(f"--at {at!r} is not an ISO 8601 time such as 2026-11-30T09:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=schedule.zone)  # a wall time in the schedule's zone
    try:
        moment = moment.astimezone(UTC).replace(microsecond=0)
    except OverflowError:  # 0001-01-01T00:00:00+01:00: no UTC time
        raise ConfigError(f"--at {at!r} has no UTC time (out of range)") from None
    if schedule.latest_fire_time(moment) != moment:
        from worker.scheduling.schedules import format_scheduled_time

        upcoming = schedule.next_fire_times(moment, 1)
        hint = f"; the next one is {format_scheduled_time(upcoming[0])}" if upcoming else ""
        raise ConfigError(f"--at {at!r} is not a fire time of schedule {schedule.name!r} ({schedule.expression}){hint}")
    return moment
