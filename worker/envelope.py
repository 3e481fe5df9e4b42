"""The message envelope: the JSON object every SQS body carries, and its parsing.

``{"type": "<job type>", "payload": {...}, "idempotency_key": "<optional string>"}``
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.errors import InvalidMessage

INVALID_MESSAGE = "invalid_message"
UNKNOWN_TYPE = "unknown_type"
INVALID_PAYLOAD = "invalid_payload"


class Envelope(BaseModel):
    """What a producer puts in the SQS message body, as JSON."""

    model_config = ConfigDict(extra="forbid", title="sqs-worker message envelope")

    type: str = Field(min_length=1, max_length=256, description="The job type a handler is registered for.")
    payload: dict[str, Any] = Field(default_factory=dict, description="The job's arguments, a JSON object.")
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Jobs with the same key take effect once (needs the idempotency table).",
    )


def parse_envelope(body: str) -> Envelope:
    """Parse a message body into an Envelope, or raise InvalidMessage(category=invalid_message).

    Error messages name what is wrong, never the values: a body may carry secrets.
    """
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise InvalidMessage(INVALID_MESSAGE, f"body is not JSON: {reason}") from None
    if not isinstance(data, dict):
        raise InvalidMessage(INVALID_MESSAGE, f"body is JSON but not an object (got {type(data).__name__})")
    try:
        return Envelope.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessage(INVALID_MESSAGE, "envelope " + describe_errors(exc)) from None


def describe_errors(exc: ValidationError) -> str:
    """Field locations and messages of a ValidationError, without the input values."""
    parts = []
    for error in exc.errors(include_input=False, include_url=False):
        location = ".".join(str(loc) for loc in error["loc"]) or "(root)"
        parts.append(f"{location}: {error['msg']}")
    return "invalid: " + "; ".join(parts)


def envelope_schema() -> dict[str, Any]:
    """The envelope's JSON Schema, as printed by ``sqs-worker schema``."""
    schema = Envelope.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def dump_envelope(job_type: str, payload: dict[str, Any], idempotency_key: str | None = None) -> str:
    """The body a producer sends: compact JSON of the envelope."""
    envelope = Envelope(type=job_type, payload=payload, idempotency_key=idempotency_key)
    return envelope.model_dump_json(exclude_none=True)
