"""Queue names: the name part of a name, URL or ARN, and the default dead-letter queue's name."""

from __future__ import annotations


def queue_name_of(queue: str) -> str:
    """The name part of a queue name, URL or ARN."""
    return queue.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def default_dlq_name(queue_name: str) -> str:
    """``<queue>-dlq``; for a FIFO queue ``<queue>-dlq.fifo`` (a FIFO queue needs a FIFO DLQ)."""
    if queue_name.endswith(".fifo"):
        return queue_name[: -len(".fifo")] + "-dlq.fifo"
    return queue_name + "-dlq"
