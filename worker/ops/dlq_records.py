"""Dead-letter records as the dlq commands read them (pure): the record, grouping by category and error,
the listing's text, the attribute rules of redrive (strip ours) and requeue (add an audit trail), and which
messages one redrive may move (its snapshot) and how it follows a move task."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from worker.deadletter import OUR_ATTRIBUTES
from worker.envelope import parse_envelope
from worker.errors import InvalidMessage, WorkerError
from worker.policy import safe_text

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageTypeDef

#: The attributes the worker adds to a dead-lettered message (the public dead-letter record contract).
DEAD_LETTER_ATTRIBUTES = OUR_ATTRIBUTES
#: The audit trail a requeued message carries.
AUDIT_ATTRIBUTES = ("requeued_by", "requeued_at", "requeue_reason", "requeued_from")
MAX_MESSAGE_ATTRIBUTES = 10


@dataclass(frozen=True)
class DeadLetter:
    """One message read from the DLQ."""

    message_id: str
    receipt_handle: str
    body: str
    attributes: dict[str, Any]  # message attributes as SQS returns them (DataType, StringValue, BinaryValue)
    system: dict[str, str]  # SentTimestamp, ApproximateReceiveCount, MessageGroupId, ...

    @classmethod
    def from_message(cls, message: MessageTypeDef | dict[str, Any]) -> DeadLetter:
        return cls(
            message_id=message["MessageId"],
            receipt_handle=message["ReceiptHandle"],
            body=message.get("Body", ""),
            attributes=dict(message.get("MessageAttributes", {})),
            system={str(k): str(v) for k, v in message.get("Attributes", {}).items()},
        )

    def attribute(self, name: str) -> str | None:
        value = self.attributes.get(name)
        if not isinstance(value, dict):
            return None
        text = value.get("StringValue")
        return text if isinstance(text, str) else None

    @property
    def category(self) -> str:
        return self.attribute("error_category") or "(none)"

    @property
    def error_message(self) -> str:
        return self.attribute("error_message") or "(none)"

    @property
    def original_message_id(self) -> str | None:
        return self.attribute("original_message_id")

    @property
    def failed_at(self) -> str | None:
        return self.attribute("failed_at")

    @property
    def job_type(self) -> str | None:
        """The envelope's ``type``, when the body is an envelope the worker accepts (only the type: payloads are
        not shown). Decided by the worker's own parser, so a hostile body (nested 10,000 deep, a huge integer, a
        lone surrogate) is just not an envelope here either."""
        try:
            return parse_envelope(self.body).type
        except InvalidMessage:
            return None

    def matches(self, ident: str) -> bool:
        return ident in (self.message_id, self.original_message_id)

    def describe(self) -> dict[str, Any]:
        """Everything about the message, for ``dlq show``."""
        return {
            "dlq_message_id": self.message_id,
            "original_message_id": self.original_message_id,
            "category": self.attribute("error_category"),
            "error_message": self.attribute("error_message"),
            "attempts": self.attribute("attempts"),
            "failed_at": self.failed_at,
            "source_queue": self.attribute("source_queue"),
            "job_type": self.job_type,
            "message_attributes": {
                name: value.get("StringValue", "<binary>") if isinstance(value, dict) else value
                for name, value in sorted(self.attributes.items())
            },
            "system_attributes": dict(sorted(self.system.items())),
            "body": self.body,
        }


@dataclass
class Group:
    """Dead letters with the same category and error message."""

    category: str
    error_message: str
    count: int = 0
    job_types: Counter[str] = field(default_factory=Counter)
    first_failed_at: str | None = None
    last_failed_at: str | None = None
    message_ids: list[str] = field(default_factory=list)  # a few, to show or requeue

    def as_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "error_message": self.error_message,
            "count": self.count,
            "job_types": dict(self.job_types.most_common()),
            "first_failed_at": self.first_failed_at,
            "last_failed_at": self.last_failed_at,
            "sample_message_ids": self.message_ids,
        }


SAMPLE_IDS_PER_GROUP = 3


def group_dead_letters(letters: Iterable[DeadLetter]) -> list[Group]:
    """Group by (category, error message); biggest group first, then by category and message."""
    groups: dict[tuple[str, str], Group] = {}
    for letter in letters:
        key = (letter.category, letter.error_message)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(category=key[0], error_message=key[1])
        group.count += 1
        group.job_types[letter.job_type or "(not an envelope)"] += 1
        failed_at = letter.failed_at
        if failed_at is not None:
            if group.first_failed_at is None or failed_at < group.first_failed_at:
                group.first_failed_at = failed_at
            if group.last_failed_at is None or failed_at > group.last_failed_at:
                group.last_failed_at = failed_at
        if len(group.message_ids) < SAMPLE_IDS_PER_GROUP:
            group.message_ids.append(letter.original_message_id or letter.message_id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.category, g.error_message))


#: Characters that reorder text: ALM, LRM, RLM, the embeddings and overrides, the isolates ("evil" shown as "live").
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
#: Characters that show nothing where they stand ("send\u200bemail" looks like "sendemail"): soft hyphen, Mongolian
#: vowel separator, zero-width space, word joiner and invisible operators, byte order mark; and the line and
#: paragraph separators, which break a line where no line break shows.
INVISIBLE = "\u00ad\u180e\u200b\u2028\u2029\u2060-\u2064\ufeff"
#: Zero-width (non-)joiners beside ASCII text or at an end: there they join nothing and only hide. Between other
#: letters they shape them (Indic scripts, emoji sequences such as a family) and stay.
_STRAY_JOINER = "(?<![^\x00-\x7f])[\u200c\u200d]|[\u200c\u200d](?![^\x00-\x7f])"
#: What a terminal must not receive raw: C0 and C1 control characters (escape sequences), lone surrogates (not
#: encodable as UTF-8), bidi formatting characters and invisible ones.
_UNPRINTABLE = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff{BIDI_CONTROLS}{INVISIBLE}]|{_STRAY_JOINER}")
#: Inside JSON text json.dumps(ensure_ascii=False) already escapes C0 controls; these it leaves raw.
_UNPRINTABLE_IN_JSON = re.compile(f"[\x7f-\x9f\ud800-\udfff{BIDI_CONTROLS}{INVISIBLE}]|{_STRAY_JOINER}")
_BIDI = re.compile(f"[{BIDI_CONTROLS}{INVISIBLE}]|{_STRAY_JOINER}")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control characters, lone surrogates, bidi formatting and invisible characters escaped
    (``\\x1b``, ``\\udfff``, ``\\u202e``, ``\\u200b``): safe to print, and nothing hidden."""
    return _UNPRINTABLE.sub(_escape, text)


def escape_bidi(text: str) -> str:
    """``text`` with only its bidi formatting and invisible characters escaped (``\\u202e``, ``\\u200b``), line
    breaks and all else kept."""
    return _BIDI.sub(_escape, text)


def printable_json(value: Any) -> str:
    """Indented JSON that keeps readable non-ASCII text but escapes what a terminal or UTF-8 cannot take (the
    same JSON value: a JSON string may spell any character as ``\\uXXXX``)."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return _UNPRINTABLE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _clip(text: str, width: int) -> str:
    text = printable(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def format_groups(
    groups: Sequence[Group], *, read: int, approximate_total: int | None, in_flight: int | None = None
) -> str:
    """A table of the groups for a terminal (pure). ``approximate_total``: the letters visible when it started;
    ``in_flight``: those someone else had received and not released yet (not readable now)."""
    total = "unknown" if approximate_total is None else str(approximate_total)
    if in_flight is None:
        lines = [f"dead letters read: {read} (queue holds about {total})"]
    else:
        lines = [f"dead letters read: {read} (queue holds about {total} visible, {in_flight} in flight)"]
    if not groups:
        if in_flight:
            return "\n".join(
                [
                    *lines,
                    f"none visible now: {in_flight} in flight, received by another reader (a worker, the dashboard, "
                    "another dlq command); they are readable again when its visibility timeout ends",
                ]
            )
        return "\n".join([*lines, "the dead-letter queue is empty"])
    lines.append(f"{'COUNT':>6}  {'CATEGORY':<16}  {'JOB TYPES':<24}  {'LAST FAILED':<24}  ERROR")
    for group in groups:
        types = ",".join(name for name, _ in group.job_types.most_common(3))
        lines.append(
            f"{group.count:>6}  {_clip(group.category, 16):<16}  {_clip(types, 24):<24}  "
            f"{group.last_failed_at or '-':<24}  {_clip(group.error_message, 100)}"
        )
        more = f" (+{group.count - len(group.message_ids)} more)" if group.count > len(group.message_ids) else ""
        lines.append(f"{'':>6}  ids: {' '.join(printable(i) for i in group.message_ids)}{more}")
    if approximate_total is not None and read < approximate_total:
        lines.append(f"(read {read} of about {approximate_total}; raise --limit to read more)")
    return "\n".join(lines)


def _copy_attribute(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}


def redrive_attributes(letter: DeadLetter) -> dict[str, Any]:
    """The attributes a redriven message carries: the original ones, without the dead-letter record."""
    return {
        name: _copy_attribute(value)
        for name, value in letter.attributes.items()
        if name not in DEAD_LETTER_ATTRIBUTES and isinstance(value, dict)
    }


def requeue_attributes(letter: DeadLetter, *, by: str, at: datetime, reason: str) -> dict[str, Any]:
    """A requeued message's attributes: the original ones plus the audit (who, when, why, from which message).

    Raises WorkerError when the audit does not fit beside the original attributes (SQS allows 10). The audit's
    values hold only characters SQS accepts (others become U+FFFD), as the dead-letter record's do; the log line
    of each requeue keeps them exact.
    """
    attributes = {name: value for name, value in redrive_attributes(letter).items() if name not in AUDIT_ATTRIBUTES}
    audit = {
        "requeued_by": by,
        "requeued_at": at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "requeue_reason": reason,
        "requeued_from": letter.original_message_id or letter.message_id,
    }
    if len(attributes) + len(audit) > MAX_MESSAGE_ATTRIBUTES:
        raise WorkerError(
            f"message {letter.message_id} has {len(attributes)} attributes of its own: "
            f"the {len(audit)} audit attributes do not fit (SQS allows {MAX_MESSAGE_ATTRIBUTES})"
        )
    for name, text in audit.items():  # characters SQS refuses (an ESC pasted from a terminal) become U+FFFD
        attributes[name] = {"DataType": "String", "StringValue": safe_text(text)}
    return attributes


@dataclass(frozen=True)
class Snapshot:
    """What one redrive may move: the messages that were in the DLQ when it started.

    ``count`` is the DLQ's ApproximateNumberOfMessages at the start: a run moves (or fails) at most that many.
    ``sent_until_ms`` is the start on the endpoint's clock (the end of the second its ``Date`` header names): a
    message sent to the DLQ later was dead-lettered during the run and stays.
    """

    count: int
    sent_until_ms: int

    def admits(self, letter: DeadLetter, *, moved: Collection[str]) -> bool:
        """True when ``letter`` was in the DLQ at the start and is not a message this run moved already.

        ``moved`` holds the DLQ MessageIds this run moved and the MessageIds their copies got in the source: a
        copy dead-lettered again comes back with a new DLQ MessageId but names its source message as
        ``original_message_id`` (the worker's record) or keeps that MessageId (SQS's redrive policy).
        """
        if {letter.message_id, letter.original_message_id} & set(moved):
            return False
        sent = letter.system.get("SentTimestamp", "")
        return not sent.isdigit() or int(sent) <= self.sent_until_ms


def move_task_poll_s(*, remaining: int, rate_per_s: int, max_poll_s: float = 1.0, min_poll_s: float = 0.02) -> float:
    """How long to wait before looking at a move task again: half the time its ``remaining`` messages take at
    ``rate_per_s``, within [min_poll_s, max_poll_s], so the command can cancel it as it reaches its snapshot."""
    if rate_per_s < 1:
        raise ValueError("rate_per_s must be >= 1")
    return max(min_poll_s, min(max_poll_s, max(0, remaining) / rate_per_s / 2))
