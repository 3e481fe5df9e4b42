"""Queue names: the name part of a name, URL or ARN, the default dead-letter queue's name, and what a redrive
policy names (pure; no I/O)."""

from __future__ import annotations

import json


def queue_name_of(queue: str) -> str:
    """The name part of a queue name, URL or ARN."""
    return queue.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def default_dlq_name(queue_name: str) -> str:
    """``<queue>-dlq``; for a FIFO queue ``<queue>-dlq.fifo`` (a FIFO queue needs a FIFO DLQ)."""
    if queue_name.endswith(".fifo"):
        return queue_name[: -len(".fifo")] + "-dlq.fifo"
    return queue_name + "-dlq"


def parse_redrive_policy(text: str | None) -> tuple[str | None, int | None]:
    """The dead-letter queue's name and the maxReceiveCount a queue's ``RedrivePolicy`` attribute names; None for
    what it lacks (no policy, or one that does not parse)."""
    try:
        policy = json.loads(text) if text else {}
    except ValueError:
        policy = {}
    if not isinstance(policy, dict):
        policy = {}
    target = queue_name_of(str(policy.get("deadLetterTargetArn", ""))) or None
    try:
        count: int | None = int(policy["maxReceiveCount"])
    except (KeyError, TypeError, ValueError):
        count = None
    return target, count
