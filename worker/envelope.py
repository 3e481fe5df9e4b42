"""The message envelope: the JSON object every SQS body carries, and its parsing.

``{"type": "<job type>", "payload": {...}, "idempotency_key": "<optional string>"}``
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.errors import InvalidMessage

INVALID_MESSAGE = "invalid_message"
UNKNOWN_TYPE = "unknown_type"
INVALID_PAYLOAD = "invalid_payload"


#: The longest job type the envelope takes (and ``@job`` registers).
MAX_TYPE_LENGTH = 256


class WorkflowRef(BaseModel):
    """Where a message stands in a workflow (``worker.workflows``): set by ``chain``/``group``, not by hand."""

    model_config = ConfigDict(extra="forbid", title="workflow step")

    id: str = Field(min_length=1, max_length=128, description="The workflow's id.")
    kind: Literal["chain", "group", "callback"] = Field(description="A chain step, a group member or its callback.")
    index: int = Field(ge=0, le=100_000, description="The step's or member's position (0-based).")
    total: int = Field(ge=1, le=100_000, description="How many steps or members the workflow has.")
    input: Any = Field(default=None, description="The previous step's result; for a callback, the members'.")


class Envelope(BaseModel):
    """What a producer puts in the SQS message body, as JSON."""

    # NaN and +-Infinity go out as Python's json writes them (the worker reads them back), not as null.
    model_config = ConfigDict(extra="forbid", title="sqs-worker message envelope", ser_json_inf_nan="constants")

    type: str = Field(min_length=1, max_length=MAX_TYPE_LENGTH, description="The job type a handler is registered for.")
    payload: dict[str, Any] = Field(default_factory=dict, description="The job's arguments, a JSON object.")
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Jobs with the same key take effect once (needs the idempotency table).",
    )
    workflow: WorkflowRef | None = Field(default=None, description="Set on the steps of a chain or group.")


#: Deepest nesting of objects and arrays a body may have: deeper input is refused before any code walks it
#: (hashing, validation, logging), so none of them can hit Python's recursion limit later.
MAX_NESTING_DEPTH = 100
_SURROGATE = re.compile("[\ud800-\udfff]")
#: A raw surrogate (text decoded from bytes that were not UTF-8) or the JSON escape of one (``\ud800``: alone, it
#: decodes to text that is not valid Unicode).
_SURROGATE_OR_ESCAPE = re.compile("[\ud800-\udfff]|\\\\u[dD][89a-fA-F]")


def parse_envelope(body: str) -> Envelope:
    """Parse a message body into an Envelope, or raise InvalidMessage(category=invalid_message).

    Error messages name what is wrong, never the values: a body may carry secrets. Besides malformed JSON,
    refused as ``invalid_message`` on the first receive: integers of more digits than Python converts
    (4300), nesting deeper than MAX_NESTING_DEPTH, and strings that are not valid Unicode (lone surrogate
    escapes), which UTF-8, DynamoDB and SQS attributes all refuse.
    """
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidMessage(INVALID_MESSAGE, f"body is not JSON: {exc.msg}") from None
    except RecursionError:
        raise InvalidMessage(INVALID_MESSAGE, f"body nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except ValueError:  # int() refuses more than sys.get_int_max_str_digits() digits; UnicodeDecodeError
        raise InvalidMessage(
            INVALID_MESSAGE, f"body holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from None
    if not isinstance(data, dict):
        raise InvalidMessage(INVALID_MESSAGE, f"body is JSON but not an object (got {type(data).__name__})")
    problem = _repeated_field(body) or _hostile_structure(data, body)
    if problem is not None:
        raise InvalidMessage(INVALID_MESSAGE, problem)
    try:
        return Envelope.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessage(INVALID_MESSAGE, "envelope " + describe_errors(exc)) from None


def _repeated_field(body: str) -> str | None:
    """An envelope field given twice, at the top or inside ``workflow`` (JSON keeps the last; a gateway or a log
    reader may take the first), or None.

    Parsed again, keeping every key, only when the text allows a repeat: a field name seen twice, or an escape
    (``"typ\\u0065"`` spells ``"type"``)."""
    if not _may_repeat(body):
        return None
    pairs_of: dict[int, list[tuple[str, Any]]] = {}
    top: list[dict[str, Any]] = []

    def keep_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        decoded = dict(pairs)
        pairs_of[id(decoded)] = pairs
        top[:] = [decoded]  # the outermost object is decoded last
        return decoded

    json.loads(body, object_pairs_hook=keep_pairs)
    if not top:
        return None
    outer = pairs_of[id(top[0])]
    problem = _repeats("envelope", outer)
    workflows = [value for name, value in outer if name == "workflow" and isinstance(value, dict)]
    if problem is None and workflows:
        problem = _repeats("envelope's workflow", pairs_of[id(workflows[0])])
    return problem


def _may_repeat(body: str) -> bool:
    """Whether the text leaves room for a repeated envelope or workflow field (else no second parse)."""
    if "\\u" in body or any(body.count(f'"{name}"') > 1 for name in Envelope.model_fields):
        return True
    return '"workflow"' in body and any(body.count(f'"{name}"') > 1 for name in WorkflowRef.model_fields)


def _repeats(what: str, pairs: list[tuple[str, Any]]) -> str | None:
    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        return f"{what} has field " + ", ".join(repr(name) for name in repeated) + " more than once"
    return None


def _hostile_structure(data: dict[str, Any], body: str) -> str | None:
    """What makes parsed JSON unsafe to handle (too deep, not valid Unicode), or None.

    The walk is skipped when the text alone rules both out: few brackets and no surrogate escape.
    """
    found = _SURROGATE_OR_ESCAPE.search(body)  # one scan of the text for both
    if found is not None and len(found.group()) == 1:  # bytes that were not UTF-8, decoded with surrogateescape
        return "body is not valid UTF-8"
    surrogates = found is not None  # an escape first: the walk finds a raw surrogate after it too
    if not surrogates and body.count("{") + body.count("[") <= MAX_NESTING_DEPTH:
        return None
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(data, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            return f"body nests deeper than {MAX_NESTING_DEPTH} levels"
        items = container.values() if isinstance(container, dict) else container
        if surrogates and isinstance(container, dict) and any(_SURROGATE.search(key) for key in container):
            return "body holds a field name that is not valid Unicode (a lone surrogate escape)"
        for item in items:
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
            elif surrogates and isinstance(item, str) and _SURROGATE.search(item):
                return "body holds text that is not valid Unicode (a lone surrogate escape)"
    return None


def nests_deeper_than(value: object, levels: int) -> bool:
    """Whether parsed JSON ``value`` has objects or arrays nested more than ``levels`` deep (without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > levels:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


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


def dump_envelope(
    job_type: str,
    payload: dict[str, Any],
    idempotency_key: str | None = None,
    workflow: WorkflowRef | None = None,
) -> str:
    """The body a producer sends: compact JSON of the envelope."""
    envelope = Envelope(type=job_type, payload=payload, idempotency_key=idempotency_key, workflow=workflow)
    return envelope.model_dump_json(exclude_none=True)
