"""Dead-letter records: the attributes a dead-lettered message carries (pure), kept apart from sending.

Every record is one SQS accepts: string values hold only the characters SQS allows (others become U+FFFD),
and body plus attributes fit the DLQ's maximum message size, measured as SQS measures it (body bytes, plus for
each attribute its name, data type and value bytes). When they do not fit, the body stays byte for byte and
the attributes give way, least useful first: the original message's own attributes (largest first), then
``error_message`` is shortened, then ``workflow_id`` (the body's ``workflow`` field still names it),
``receive_count``, ``failed_at``, ``source_queue``, ``attempts``, ``original_message_id``, ``error_message``
are dropped; ``error_category`` goes last.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from worker.policy import safe_text, truncate, truncate_utf8

#: Categories, in the order a message meets them.
CATEGORIES = ("invalid_message", "unknown_type", "invalid_payload", "permanent", "bug", "exhausted")

ERROR_MESSAGE_LIMIT = 1000
#: SQS allows at most 10 message attributes per message; ours take 7 (8 for a workflow step).
MAX_MESSAGE_ATTRIBUTES = 10
#: SQS's maximum message size (body and attributes) since August 2025; a queue may set a lower one.
SQS_MAX_MESSAGE_BYTES = 1_048_576
OUR_ATTRIBUTES = (
    "error_category",
    "error_message",
    "attempts",
    "receive_count",
    "failed_at",
    "source_queue",
    "original_message_id",
    "workflow_id",
)
#: ``error_message`` is shortened down to this many bytes before other attributes are dropped.
MIN_ERROR_MESSAGE_BYTES = 64
#: The order our attributes are dropped in when even a short ``error_message`` does not fit.
DROP_ORDER = (
    "workflow_id",
    "receive_count",
    "failed_at",
    "source_queue",
    "attempts",
    "original_message_id",
    "error_message",
    "error_category",
)


@dataclass(frozen=True)
class DeadLetterRecord:
    """The attributes of a dead-letter record and what had to give way for it to fit (empty: nothing)."""

    attributes: dict[str, dict[str, Any]]
    trimmed: tuple[str, ...] = ()


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and a Z: 2026-11-29T10:04:14.123Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def attribute_bytes(name: str, value: dict[str, Any]) -> int:
    """An attribute's size as SQS counts it: name, data type and value, in bytes."""
    size = _utf8_len(name) + _utf8_len(str(value.get("DataType", "")))
    if "StringValue" in value:
        size += _utf8_len(str(value["StringValue"]))
    if "BinaryValue" in value:
        binary = value["BinaryValue"]
        size += len(binary) if isinstance(binary, bytes | bytearray) else _utf8_len(str(binary))
    return size


def message_bytes(body: str, attributes: dict[str, dict[str, Any]]) -> int:
    """A message's size as SQS counts it against MaximumMessageSize."""
    return _utf8_len(body) + sum(attribute_bytes(name, value) for name, value in attributes.items())


def dead_letter_record(
    *,
    category: str,
    error_message: str,
    attempts: int,
    source_queue: str,
    receive_count: int | None = None,
    original_message_id: str,
    failed_at: datetime,
    original: dict[str, Any] | None = None,
    body: str = "",
    max_message_bytes: int = SQS_MAX_MESSAGE_BYTES,
    workflow_id: str | None = None,
) -> DeadLetterRecord:
    """The attributes of a dead-letter record for ``body``, sanitized and trimmed to fit ``max_message_bytes``.

    The original message's own attributes are kept where they fit beside ours (SQS allows 10); ours win.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown dead-letter category {category!r}")
    ours = {
        "error_category": category,
        "error_message": truncate(safe_text(error_message) or "(no message)", ERROR_MESSAGE_LIMIT),
        "attempts": str(attempts),
        "receive_count": str(receive_count if receive_count is not None else attempts),
        "failed_at": iso_utc(failed_at),
        "source_queue": safe_text(source_queue),
        "original_message_id": safe_text(original_message_id),
    }
    if workflow_id:
        ours["workflow_id"] = safe_text(workflow_id)
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (original or {}).items():
        if name in ours or len(attributes) >= MAX_MESSAGE_ATTRIBUTES - len(ours):
            continue
        kept = {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}
        if isinstance(kept.get("StringValue"), str):
            kept["StringValue"] = safe_text(kept["StringValue"])
        attributes[name] = kept
    for name, text in ours.items():
        if text:  # SQS refuses an empty String value
            attributes[name] = {"DataType": "String", "StringValue": text}
    budget = max_message_bytes - _utf8_len(body)
    return _fit(attributes, budget=budget, originals=[name for name in attributes if name not in ours])


def dead_letter_attributes(**fields: Any) -> dict[str, dict[str, Any]]:
    """The message attributes of a dead-letter record (see ``dead_letter_record`` for the arguments)."""
    return dead_letter_record(**fields).attributes


def _fit(attributes: dict[str, dict[str, Any]], *, budget: int, originals: list[str]) -> DeadLetterRecord:
    """Drop or shorten attributes until their size is within ``budget`` bytes, noting each change."""
    trimmed: list[str] = []

    def excess() -> int:
        return sum(attribute_bytes(name, value) for name, value in attributes.items()) - budget

    for name in sorted(originals, key=lambda n: attribute_bytes(n, attributes[n]), reverse=True):
        if excess() <= 0:
            break
        del attributes[name]
        trimmed.append(f"original attribute {name!r} dropped")
    over = excess()
    if over > 0 and "error_message" in attributes:
        text = attributes["error_message"]["StringValue"]
        size = _utf8_len(text)
        target = max(MIN_ERROR_MESSAGE_BYTES, size - over)
        if target < size:
            attributes["error_message"]["StringValue"] = truncate_utf8(text, target)
            trimmed.append(f"error_message shortened to {target} bytes")
    for name in DROP_ORDER:
        if excess() <= 0:
            break
        if attributes.pop(name, None) is not None:
            trimmed.append(f"{name} dropped")
    return DeadLetterRecord(attributes=attributes, trimmed=tuple(trimmed))


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
