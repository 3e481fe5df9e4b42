"""Dead-letter records: the attributes a dead-lettered message carries (pure), kept apart from sending."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from worker.policy import truncate

#: Categories, in the order a message meets them.
CATEGORIES = ("invalid_message", "unknown_type", "invalid_payload", "permanent", "bug", "exhausted")

ERROR_MESSAGE_LIMIT = 1000
#: SQS allows at most 10 message attributes per message; ours take 6.
MAX_MESSAGE_ATTRIBUTES = 10
OUR_ATTRIBUTES = (
    "error_category",
    "error_message",
    "attempts",
    "failed_at",
    "source_queue",
    "original_message_id",
)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and a Z: 2026-11-29T10:04:14.123Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dead_letter_attributes(
    *,
    category: str,
    error_message: str,
    attempts: int,
    source_queue: str,
    original_message_id: str,
    failed_at: datetime,
    original: dict[str, Any] | None = None,
) -> dict[str, dict[str, str]]:
    """The message attributes of a dead-letter record.

    The original message's own attributes are kept where they fit beside ours (SQS allows 10); ours win.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown dead-letter category {category!r}")
    ours = {
        "error_category": category,
        "error_message": truncate(error_message or "(no message)", ERROR_MESSAGE_LIMIT),
        "attempts": str(attempts),
        "failed_at": iso_utc(failed_at),
        "source_queue": source_queue,
        "original_message_id": original_message_id,
    }
    attributes: dict[str, dict[str, str]] = {}
    for name, value in (original or {}).items():
        if name in ours or len(attributes) >= MAX_MESSAGE_ATTRIBUTES - len(ours):
            continue
        attributes[name] = {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}
    for name, text in ours.items():
        attributes[name] = {"DataType": "String", "StringValue": text}
    return attributes
