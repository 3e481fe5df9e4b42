"""Structured logs: JSON (or text) lines with the record's extra fields, secrets redacted wherever they appear.

``configure_logging(settings)`` installs one handler on the root logger. Every line passes through a
:class:`Redactor` built from ``settings.redact_fields``:

- a field whose *name* contains a redacted word (case-insensitive: ``password`` also covers ``db_password``)
  has its value replaced, at any depth of the extra fields (dicts, lists);
- in text (the message, an exception and its traceback, any string field), ``"password": "..."``,
  ``'password': '...'`` (a Python dict's repr) and ``password=...`` / ``password: ...`` have their values
  replaced;
- a value once redacted is remembered (a bounded, in-memory set) and replaced wherever it shows up later,
  unkeyed, for example in ``ValueError(payload["password"])`` logged by the runtime after the handler logged
  its payload.

:class:`LogObserver` turns the worker's events into one log line per state change. It never logs payloads.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from worker.observability.events import Event, Kind
from worker.observability.tracing import add_log_fields
from worker.settings import WorkerSettings

REDACTED = "[REDACTED]"
#: Secret values shorter than this are not searched for in free text (they would match ordinary words).
MIN_REMEMBERED_SECRET_LENGTH = 4
MAX_REMEMBERED_SECRETS = 512
MAX_REMEMBERED_KEYS = 4096
MAX_DEPTH = 8
#: Libraries whose DEBUG output is noise (and may echo request headers); kept at WARNING.
QUIET_LOGGERS = ("botocore", "aiobotocore", "boto3", "urllib3", "s3transfer", "asyncio")

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys() | {"message", "asctime", "taskName"}
)
_HANDLER_MARK = "_sqs_worker_handler"
#: Values ``Redactor.redact`` keeps as they are (exact types; subclasses take the longer way).
_PLAIN = frozenset({int, float, bool, type(None)})


class Redactor:
    """Replaces the values of secret fields in structures and in text."""

    def __init__(self, fields: Iterable[str]) -> None:
        self.fields = tuple(sorted({f.strip().lower().replace("-", "_") for f in fields if f.strip()}))
        self._seen: OrderedDict[str, None] = OrderedDict()
        #: Whether each field name seen so far is a secret one (``is_secret_key``).
        self._verdicts: dict[str, bool] = {}
        self._patterns: list[re.Pattern[str]] = []
        #: Any of the field names, anywhere: every keyed pattern needs one, so text without it skips them all.
        self._any_field: re.Pattern[str] | None = None
        if self.fields:
            words = "|".join(re.escape(f) for f in self.fields)
            self._any_field = re.compile(words, re.IGNORECASE)
            key = rf"[\w.-]*(?:{words})[\w.-]*"
            quoted = r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'"
            scheme = r"(?:(?:Bearer|Basic|Token|Digest)\s+)?"
            # "password": "x" / 'password': 'x' / "password": 123 (JSON, Python reprs)
            self._patterns.append(
                re.compile(
                    rf"(?P<prefix>(?P<q>[\"'])(?P<key>{key})(?P=q)\s*:\s*)(?P<value>{quoted}|[^,}}\]\s]+)",
                    re.IGNORECASE,
                )
            )
            # password=x, password: x, Authorization: Bearer x, password="x y"
            self._patterns.append(
                re.compile(
                    rf"(?P<prefix>(?<![\w\"'])(?P<key>{key})\s*[=:]\s*)(?P<value>{scheme}(?:{quoted}|[^\s,;&\"'}}\]]+))",
                    re.IGNORECASE,
                )
            )

    def is_secret_key(self, key: str) -> bool:
        verdict = self._verdicts.get(key)
        if verdict is None:
            name = key.lower().replace("-", "_")
            verdict = any(field in name for field in self.fields)
            if len(self._verdicts) < MAX_REMEMBERED_KEYS:  # field names: a small set, looked up on every line
                self._verdicts[key] = verdict
        return verdict

    def remember(self, value: object) -> None:
        """Keep a secret value (as text) to scrub it wherever it appears later."""
        if isinstance(value, Mapping | list | tuple) or value is None:
            return
        text = str(value)
        if len(text) < MIN_REMEMBERED_SECRET_LENGTH:
            return
        self._seen[text] = None
        self._seen.move_to_end(text)
        while len(self._seen) > MAX_REMEMBERED_SECRETS:
            self._seen.popitem(last=False)

    def redact_text(self, text: str) -> str:
        """The text with secret values replaced (keyed patterns first, then remembered values)."""
        if not self.fields:
            return text
        if self._any_field is not None and self._any_field.search(text) is not None:
            for pattern in self._patterns:
                text = pattern.sub(self._replace_match, text)
        if not self._seen:
            return text
        for secret in sorted(self._seen, key=len, reverse=True):  # longest first: no partial leftovers
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def _replace_match(self, match: re.Match[str]) -> str:
        value = match.group("value")
        raw = value
        for prefix in ("Bearer ", "Basic ", "Token ", "Digest "):
            if raw.lower().startswith(prefix.lower()):
                raw = raw[len(prefix) :].strip()
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
            quote = raw[0]
            if raw[1:-1] != REDACTED:
                self.remember(raw[1:-1])
            return f"{match.group('prefix')}{quote}{REDACTED}{quote}"
        if raw.startswith(REDACTED[:-1]):
            return match.group(0)
        self.remember(raw)
        return f"{match.group('prefix')}{REDACTED}"

    def redact(self, value: Any, depth: int = 0, *, max_depth: int = MAX_DEPTH, cut: str = "...") -> Any:
        """A JSON-safe copy of ``value`` with secret fields replaced; unknown objects become their ``str``; what
        lies deeper than ``max_depth`` levels is replaced by ``cut``."""
        if depth > max_depth:
            return cut
        kind = type(value)
        if kind is str:
            return self.redact_text(value)
        if kind in _PLAIN:
            return value
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                name = str(key)
                if self.fields and self.is_secret_key(name):
                    self._remember_all(item)
                    out[name] = REDACTED
                else:
                    out[name] = self.redact(item, depth + 1, max_depth=max_depth, cut=cut)
            return out
        if isinstance(value, list | tuple | set | frozenset):
            return [self.redact(item, depth + 1, max_depth=max_depth, cut=cut) for item in value]
        if isinstance(value, bool | int | float) or value is None:
            return value
        return self.redact_text(value if isinstance(value, str) else str(value))

    def _remember_all(self, value: Any, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            return
        if isinstance(value, Mapping):
            for item in value.values():
                self._remember_all(item, depth + 1)
        elif isinstance(value, list | tuple):
            for item in value:
                self._remember_all(item, depth + 1)
        else:
            self.remember(value)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record got from ``extra=`` (and LoggerAdapter extras)."""
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES}


def iso_timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, message, the extra fields, exception."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        extras = record_fields(record)
        # Redact the structured fields first: that remembers secret values for the free text below.
        fields = self.redactor.redact(extras)
        document: dict[str, Any] = {
            "timestamp": iso_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": self.redactor.redact_text(record.getMessage()),
        }
        for key, value in fields.items():
            document.setdefault(key, value)
        if record.exc_info:
            document["exception"] = self.redactor.redact_text(self.formatException(record.exc_info))
        elif record.exc_text:
            document["exception"] = self.redactor.redact_text(record.exc_text)
        if record.stack_info:
            document["stack"] = self.redactor.redact_text(self.formatStack(record.stack_info))
        return json.dumps(document, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> key=value ...`` with the same redaction."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        fields = self.redactor.redact(record_fields(record))
        parts = [iso_timestamp(record.created), record.levelname, f"{record.name}:", record.getMessage()]
        parts.extend(f"{key}={json.dumps(value, ensure_ascii=False, default=str)}" for key, value in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return self.redactor.redact_text(line)


def build_formatter(settings: WorkerSettings) -> logging.Formatter:
    redactor = Redactor(settings.redact_fields)
    if settings.log_format == "text":
        return TextFormatter(redactor)
    return JsonFormatter(redactor)


def configure_logging(settings: WorkerSettings, *, stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr by default) in the configured format, redacted.

    Idempotent: a second call replaces the handler installed by the first. Metrics (EMF) go to stdout.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
            handler.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(build_formatter(settings))
    add_log_fields(handler)  # trace_id and span_id while a span is current (the otel extra installed)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    logging.getLogger("worker").setLevel(settings.log_level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(settings.log_level)))


_EVENT_LEVELS = {
    Kind.RECEIVED: logging.DEBUG,
    Kind.STARTED: logging.INFO,
    Kind.SUCCEEDED: logging.INFO,
    Kind.RETRY_SCHEDULED: logging.WARNING,
    Kind.DEAD_LETTERED: logging.ERROR,
    Kind.RELEASED: logging.INFO,
    Kind.DUPLICATE_SKIPPED: logging.INFO,
    Kind.HEARTBEAT: logging.DEBUG,
    Kind.CLAIM_LOST: logging.WARNING,
    Kind.BREAKER_CHANGED: logging.WARNING,
}

_EVENT_MESSAGES = {
    Kind.RECEIVED: "job received",
    Kind.STARTED: "job started",
    Kind.SUCCEEDED: "job succeeded",
    Kind.RETRY_SCHEDULED: "job failed; retry scheduled",
    Kind.DEAD_LETTERED: "job dead-lettered",
    Kind.RELEASED: "job released unprocessed",
    Kind.DUPLICATE_SKIPPED: "duplicate job skipped",
    Kind.HEARTBEAT: "visibility extended",
    Kind.CLAIM_LOST: "claim lost: another consumer may run this job",
    Kind.BREAKER_CHANGED: "circuit breaker changed state",
}


def event_fields(event: Event) -> dict[str, Any]:
    """The log fields of an event: everything but payloads, None values left out."""
    fields: dict[str, Any] = {
        "event": event.kind.value,
        "queue": event.queue,
        "message_id": event.message_id,
        "job_type": event.job_type,
        "attempt": event.attempt,
        "duration_s": None if event.duration_s is None else round(event.duration_s, 6),
        "queue_wait_s": None if event.queue_wait_s is None else round(event.queue_wait_s, 6),
        "delay_s": event.delay_s,
        "category": event.category,
        "error": event.error,
        "reason": event.reason,
        "idempotency_key": event.idempotency_key,
    }
    fields.update(event.extra)
    return {key: value for key, value in fields.items() if value is not None}


class LogObserver:
    """An Observer writing one log line per job state change (received at DEBUG, heartbeats at DEBUG)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger if logger is not None else logging.getLogger("worker.events")
        self._reachable: dict[str, bool] = {}

    def emit(self, event: Event) -> None:
        level = _EVENT_LEVELS.get(event.kind, logging.INFO)
        logger = self.logger
        if logger.isEnabledFor(level):
            # The record made directly: ``Logger.log`` would walk the stack for a caller no line prints.
            message = _EVENT_MESSAGES.get(event.kind, event.kind.value)
            logger.handle(logger.makeRecord(logger.name, level, "", 0, message, (), None, extra=event_fields(event)))

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        return None  # once a second: metrics, not logs (a stuck thread is logged once by the runtime)

    def connectivity(self, *, service: str, reachable: bool) -> None:
        was = self._reachable.get(service)
        self._reachable[service] = reachable
        if was == reachable or (was is None and reachable):  # the first call answering is no news
            return
        if reachable:
            self.logger.info("%s reachable", service, extra={"event": "reachable", "service": service})
        else:
            self.logger.warning("%s unreachable", service, extra={"event": "unreachable", "service": service})
