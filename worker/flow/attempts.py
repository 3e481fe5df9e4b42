"""Attempts that count handler runs, not receives (pure).

SQS's ApproximateReceiveCount counts every receive, including those where the worker held the job back without
running it (a FIFO release, a live lease elsewhere, a shutdown, a not-yet-due long delay, ...). On a standard
queue the worker holds a message back by sending a copy (delayed) and deleting the one it received; the copy
carries two message attributes:

- ``sqs_worker_runs``: handler runs before this copy was sent;
- ``sqs_worker_receives``: receives before this copy was sent.

So on the copy, every receive is a run (or a crash during one), and ``attempt = runs + ApproximateReceiveCount``.
Where a copy cannot be sent (FIFO queues, which would lose their order; a message with no room for two more
attributes; the send failing), the message is released in place and the hold is remembered in this worker's
memory (``HoldMemory``) by message id: those holds are subtracted while this process lives.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

RUNS_ATTRIBUTE = "sqs_worker_runs"
RECEIVES_ATTRIBUTE = "sqs_worker_receives"
COUNT_ATTRIBUTES = (RUNS_ATTRIBUTE, RECEIVES_ATTRIBUTE)
#: SQS allows at most 10 message attributes per message.
MAX_MESSAGE_ATTRIBUTES = 10
#: The largest ``sqs_worker_runs`` read; a larger value (or any text but plain digits) counts as none.
MAX_RUNS = 10_000
#: The largest ``sqs_worker_receives`` read (a year of 15-minute hops is 35,136 receives).
MAX_RECEIVES = 1_000_000
#: Holds remembered in memory (message ids; the oldest are forgotten first).
MAX_REMEMBERED_HOLDS = 10_000


@dataclass(frozen=True)
class Counts:
    """A received message's attempt (handler runs, this one included) and receive count (this one included)."""

    attempt: int
    receive_count: int


def _count(message_attributes: dict[str, Any], name: str, bound: int) -> int:
    """The count an attribute carries: plain ASCII digits up to ``bound``; anything else (unreadable, negative,
    too large: not written by a worker) counts as none, so never fewer attempts than SQS's receives allow."""
    value = message_attributes.get(name)
    text = value.get("StringValue") if isinstance(value, dict) else None
    if not isinstance(text, str) or not 0 < len(text) <= len(str(bound)) or not text.isascii() or not text.isdigit():
        return 0
    number = int(text)
    return number if number <= bound else 0


def counts_of(*, message_attributes: dict[str, Any], approximate_receive_count: int, holds_here: int = 0) -> Counts:
    """The counts of a message received ``approximate_receive_count`` times (SQS's count of this copy), carrying
    the counts of its earlier copies, held ``holds_here`` times in place by this worker process."""
    runs_before = _count(message_attributes, RUNS_ATTRIBUTE, MAX_RUNS)
    receives_before = _count(message_attributes, RECEIVES_ATTRIBUTE, MAX_RECEIVES)
    attempt = max(1, runs_before + approximate_receive_count - holds_here)
    return Counts(attempt=attempt, receive_count=receives_before + approximate_receive_count)


def held_copy_attributes(
    message_attributes: dict[str, Any], *, attempt: int, receive_count: int
) -> dict[str, dict[str, Any]]:
    """The attributes of the copy sent when a message received as ``attempt`` (``receive_count``) is held back
    (this receive was no run): its own attributes, with the counts updated."""
    kept = {name: _plain(value) for name, value in message_attributes.items() if isinstance(value, dict)}
    kept[RUNS_ATTRIBUTE] = {"DataType": "Number", "StringValue": str(attempt - 1)}
    kept[RECEIVES_ATTRIBUTE] = {"DataType": "Number", "StringValue": str(receive_count)}
    return kept


def without_counts(message_attributes: dict[str, Any]) -> dict[str, Any]:
    """A message's attributes without the counts (a dead-letter record states them; a redrive starts afresh)."""
    return {name: value for name, value in message_attributes.items() if name not in COUNT_ATTRIBUTES}


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}


class HoldMemory:
    """Holds applied in place (visibility) by this process, by message id; bounded, oldest forgotten first."""

    def __init__(self, capacity: int = MAX_REMEMBERED_HOLDS) -> None:
        self._holds: OrderedDict[str, int] = OrderedDict()
        self._capacity = capacity

    def count(self, message_id: str) -> int:
        return self._holds.get(message_id, 0)

    def note(self, message_id: str) -> None:
        self._holds[message_id] = self._holds.pop(message_id, 0) + 1
        while len(self._holds) > self._capacity:
            self._holds.popitem(last=False)

    def forget(self, message_id: str) -> None:
        self._holds.pop(message_id, None)
