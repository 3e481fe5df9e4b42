"""Delays past SQS's 15 minutes: the due time a message carries and the hops that bring it there (pure).

A job due later than SQS's ``DelaySeconds`` limit (900 s) carries its due time in the message attribute
``sqs_worker_due_at`` (ISO 8601 UTC, milliseconds). A worker that receives it before that time does not run it:
it sends a copy back delayed by ``min(remaining, 900 s)`` (a *hop*) and deletes the one it got. When less than
``SHORT_WAIT_S`` is left, the worker waits it out holding the message, so the job starts at its due time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from worker.errors import ConfigError

#: SQS caps DelaySeconds (and so one hop) at 15 minutes.
MAX_HOP_S = 900
#: The longest delay a producer may ask for.
MAX_DELAY_S = 366 * 24 * 3600
#: A received due time further ahead than this (a year and a day: the producer's limit plus clock skew) is refused
#: as ``invalid_message``: it would otherwise hop every 15 minutes for ever.
MAX_DUE_AHEAD_S = MAX_DELAY_S + 24 * 3600
#: A job due within this many seconds is held and waited for instead of sent on another hop.
SHORT_WAIT_S = 1.0
#: The message attribute holding the due time.
DUE_AT_ATTRIBUTE = "sqs_worker_due_at"


def format_due_at(moment: datetime) -> str:
    """``2026-11-29T10:04:14.123Z``: the attribute's text."""
    if moment.tzinfo is None:
        raise ValueError("a due time needs a timezone")
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_due_at(text: str) -> datetime:
    """The due time of an attribute's text; raises ValueError for text that is not a datetime with a timezone."""
    moment = datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        raise ValueError(f"{DUE_AT_ATTRIBUTE} has no timezone (end it with Z or an offset)")
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00: valid ISO 8601, no UTC time
        raise ValueError(f"{DUE_AT_ATTRIBUTE} {text.strip()!r} has no UTC time (out of range)") from None


def due_at_of(message_attributes: dict[str, Any]) -> datetime | None:
    """The due time a received message carries, or None. Raises ValueError when the attribute is malformed."""
    value = message_attributes.get(DUE_AT_ATTRIBUTE)
    if value is None:
        return None
    text = value.get("StringValue") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise ValueError(f"{DUE_AT_ATTRIBUTE} is not a String attribute")
    return parse_due_at(text)


def too_far_ahead(due_at: datetime, *, now: datetime) -> str | None:
    """Why a received due time is refused (more than MAX_DUE_AHEAD_S ahead of ``now``), or None."""
    if (due_at - now).total_seconds() > MAX_DUE_AHEAD_S:
        return f"{DUE_AT_ATTRIBUTE} is more than a year ahead (a producer sends at most {MAX_DELAY_S} s)"
    return None


@dataclass(frozen=True)
class Schedule:
    """How a producer sends a job: the DelaySeconds of the send, and the due time to attach (None: none)."""

    delay_s: int
    due_at: datetime | None


def schedule(*, delay_s: float, run_at: datetime | None, now: datetime, max_hop_s: int = MAX_HOP_S) -> Schedule:
    """The send of a job delayed by ``delay_s`` or due at ``run_at`` (not both), seen at ``now``.

    Up to ``max_hop_s`` a plain ``delay_s`` is SQS's DelaySeconds alone (the envelope as before); longer delays
    and every ``run_at`` carry the due time. A ``run_at`` in the past is due at once. Raises ConfigError.
    """
    if run_at is not None and delay_s:
        raise ConfigError("give delay_s or run_at, not both")
    if run_at is None:
        if not 0 <= delay_s <= MAX_DELAY_S:
            raise ConfigError(f"delay_s must be between 0 and {MAX_DELAY_S} (a year)")
        if delay_s <= max_hop_s and delay_s == int(delay_s):
            return Schedule(delay_s=int(delay_s), due_at=None)
        due_at = now + timedelta(seconds=delay_s)
    else:
        due_at = run_at_utc(run_at)
        if (due_at - now).total_seconds() > MAX_DELAY_S:
            raise ConfigError(f"run_at must be at most {MAX_DELAY_S} s (a year) ahead")
    return Schedule(delay_s=hop_s(due_at=due_at, now=now, max_hop_s=max_hop_s), due_at=due_at)


def run_at_utc(run_at: datetime) -> datetime:
    """A producer's ``run_at`` in UTC. Raises ConfigError when it has no timezone, or no UTC time
    (``datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))``)."""
    if run_at.tzinfo is None:
        raise ConfigError("run_at needs a timezone (for example datetime.now(UTC) + timedelta(hours=2))")
    try:
        return run_at.astimezone(UTC)
    except OverflowError:
        raise ConfigError(f"run_at {run_at.isoformat()} has no UTC time (out of range)") from None


def hop_s(*, due_at: datetime, now: datetime, max_hop_s: int = MAX_HOP_S) -> int:
    """The DelaySeconds of the next hop towards ``due_at``: the time left rounded up, at most ``max_hop_s``."""
    remaining_s = (due_at - now).total_seconds()
    return max(0, min(max_hop_s, math.ceil(remaining_s)))


@dataclass(frozen=True)
class DueAction:
    """What to do with a received message: ``run`` it, ``wait`` ``seconds`` then run it, or ``hop`` (send it on,
    delayed by ``seconds``)."""

    action: Literal["run", "wait", "hop"]
    seconds: float = 0.0


def due_action(
    *, due_at: datetime | None, now: datetime, max_hop_s: int = MAX_HOP_S, short_wait_s: float = SHORT_WAIT_S
) -> DueAction:
    """Run, wait or hop, for a message due at ``due_at`` (None: no due time) received at ``now``."""
    if due_at is None:
        return DueAction("run")
    remaining_s = (due_at - now).total_seconds()
    if remaining_s <= 0:
        return DueAction("run")
    if remaining_s <= short_wait_s:
        return DueAction("wait", remaining_s)
    return DueAction("hop", float(hop_s(due_at=due_at, now=now, max_hop_s=max_hop_s)))


def hops_needed(delay_s: float, *, max_hop_s: int = MAX_HOP_S) -> int:
    """Receives before a job delayed ``delay_s`` runs, its first send's delay included (for the cost)."""
    return max(0, math.ceil(delay_s / max_hop_s) - 1)
