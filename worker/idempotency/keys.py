"""Idempotency keys and payload hashes: pure functions, no I/O.

A job's key is, in order of precedence:

1. the envelope's ``idempotency_key`` (chosen by the producer; used as is, so it names one operation across
   job types, like an HTTP ``Idempotency-Key``);
2. the job's key function, ``@job(..., key=fn)``: ``f"{type}:{fn(payload)}"`` (namespaced by job type, so two
   job types keyed on the same order id never collide);
3. for ``@job(..., idempotent=True)``: ``f"{type}:{sha256 of the canonical JSON payload}"``.

Never the SQS MessageId: a redrive from the dead-letter queue gives a message a new id.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from worker.envelope import INVALID_MESSAGE, Envelope
from worker.errors import InvalidMessage
from worker.jobs import JobSpec

#: DynamoDB allows 2048 bytes in a partition key; longer keys are stored as a digest (see ``storage_key``).
MAX_KEY_BYTES = 1024
DIGEST_PREFIX = "sha256:"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal text, whatever their key order.

    NaN and Infinity (which Python's JSON parser accepts in a body) are written as Python writes them, so
    hashing never fails on a payload that parsed.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def payload_hash(job_type: str, payload: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of ``{"type": job_type, "payload": payload}``.

    Raises InvalidMessage(invalid_message) for a payload holding text that is not valid Unicode.
    """
    text = canonical_json({"type": job_type, "payload": payload})
    try:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:
        raise InvalidMessage(INVALID_MESSAGE, "payload holds text that is not valid Unicode") from None


#: The worker keeps its own items in the table beside job records (rate-limit slots, breakers, worker presence,
#: the dashboard's audit trail); their keys begin so, and no job's may.
WORKER_ITEM_PREFIXES = ("sqs-worker:", "sqs-worker#")


def is_worker_item(key: str) -> bool:
    """Whether ``key`` names one of the worker's own items, not a job record."""
    return key.startswith(WORKER_ITEM_PREFIXES)


def storage_key(key: str) -> str:
    """The key as stored: unchanged up to MAX_KEY_BYTES of UTF-8, else ``sha256:<hex of the key>``.

    ``sqs-worker status KEY`` applies the same mapping, so a long key can still be looked up as given.
    """
    encoded = key.encode("utf-8")
    if len(encoded) <= MAX_KEY_BYTES:
        return key
    return DIGEST_PREFIX + hashlib.sha256(encoded).hexdigest()


def job_key(spec: JobSpec, envelope: Envelope, payload: Any) -> str | None:
    """The idempotency key of one message, or None when the job is not guarded by the ledger.

    ``payload`` is what the handler receives (a validated model or the dict); the key function gets it. The
    derived hash is over the envelope's payload as sent, so a new default field in a payload model does not
    change the keys of messages already in flight across a deploy.

    A key function that raises, or returns anything but a non-empty string, is a bug in the job (its exception,
    or TypeError). Input no key can be made of (text that is not valid Unicode: a lone surrogate, which UTF-8
    and DynamoDB refuse) raises InvalidMessage(invalid_message): the message is dead-lettered once, not retried.
    """
    if envelope.idempotency_key is not None:
        return storage_key(_valid_key(envelope.idempotency_key, "the envelope's idempotency_key"))
    if spec.key is not None:
        value = spec.key(payload)
        if not isinstance(value, str) or not value:
            raise TypeError(
                f"key function of job {spec.name!r} must return a non-empty str, got {type(value).__name__}"
            )
        return storage_key(f"{spec.name}:{_valid_key(value, f'the key function of job {spec.name!r}')}")
    if spec.idempotent:
        try:
            encoded = canonical_json(envelope.payload).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessage(INVALID_MESSAGE, "payload holds text that is not valid Unicode") from None
        return storage_key(f"{spec.name}:{hashlib.sha256(encoded).hexdigest()}")
    return None


def _valid_key(key: str, source: str) -> str:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage(INVALID_MESSAGE, f"idempotency key from {source} is not valid Unicode") from None
    return key
