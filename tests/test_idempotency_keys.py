"""Key derivation and canonical payload hashing (pure)."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from worker.envelope import Envelope
from worker.idempotency import canonical_json, job_key, payload_hash, storage_key
from worker.idempotency.keys import MAX_KEY_BYTES
from worker.jobs import JobSpec

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
payloads = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


async def handler(payload: Any) -> None:
    return None


def spec(**options: Any) -> JobSpec:
    return JobSpec(name="charge", handler=handler, **options)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


@given(payloads, st.randoms(use_true_random=False))
def test_payload_hash_ignores_key_order(payload: dict[str, Any], rng: random.Random) -> None:
    assert payload_hash("t", payload) == payload_hash("t", shuffled(payload, rng))


@given(payloads)
def test_canonical_json_is_compact_sorted_and_round_trips(payload: dict[str, Any]) -> None:
    text = canonical_json(payload)
    assert json.loads(text) == payload
    assert text == json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_payload_hash_known_value() -> None:
    expected = hashlib.sha256(b'{"payload":{"amount":5,"currency":"EUR"},"type":"charge"}').hexdigest()
    assert payload_hash("charge", {"currency": "EUR", "amount": 5}) == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("charge", {"amount": 5}), ("refund", {"amount": 5})),
        (("charge", {"amount": 5}), ("charge", {"amount": 6})),
        (("charge", {"amount": 5}), ("charge", {"amount": "5"})),
        (("charge", {"a": [1, 2]}), ("charge", {"a": [2, 1]})),
        (("charge", {}), ("charge", {"": None})),
    ],
)
def test_payload_hash_distinguishes_type_and_values(
    a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]
) -> None:
    assert payload_hash(*a) != payload_hash(*b)


def test_non_finite_numbers_hash_without_error() -> None:
    """Python's JSON parser accepts NaN and Infinity in a body; deriving a key from such a payload must not fail."""
    assert payload_hash("t", {"x": float("nan")}) == payload_hash("t", {"x": float("nan")})
    assert payload_hash("t", {"x": float("inf")}) != payload_hash("t", {"x": float("-inf")})


class Order(BaseModel):
    order_id: str
    amount: int = 0


@pytest.mark.parametrize(
    ("options", "envelope_key", "expected"),
    [
        # The envelope's key wins over everything, and makes any job idempotent.
        ({}, "client-key-1", "client-key-1"),
        ({"idempotent": True}, "client-key-1", "client-key-1"),
        ({"key": lambda p: p.order_id}, "client-key-1", "client-key-1"),
        # A key function: namespaced by job type.
        ({"key": lambda p: p.order_id}, None, "charge:o-7"),
        ({"key": lambda p: p.order_id, "idempotent": True}, None, "charge:o-7"),
        # idempotent=True: type and the hash of the payload as sent.
        ({"idempotent": True}, None, "charge:" + hashlib.sha256(b'{"order_id":"o-7"}').hexdigest()),
        # Neither: not guarded.
        ({}, None, None),
    ],
)
def test_job_key_precedence(options: dict[str, Any], envelope_key: str | None, expected: str | None) -> None:
    envelope = Envelope(type="charge", payload={"order_id": "o-7"}, idempotency_key=envelope_key)
    payload = Order.model_validate(envelope.payload)  # the handler's view: a model with a default filled in
    assert job_key(spec(**options), envelope, payload) == expected


@pytest.mark.parametrize("bad", ["", None, 7])
def test_a_key_function_returning_no_string_is_a_bug(bad: object) -> None:
    envelope = Envelope(type="charge", payload={})
    with pytest.raises(TypeError, match="non-empty str"):
        job_key(spec(key=lambda p: bad), envelope, {})


def test_long_keys_are_stored_as_a_digest() -> None:
    short = "k" * MAX_KEY_BYTES
    assert storage_key(short) == short
    long = "é" * MAX_KEY_BYTES  # 2 bytes each in UTF-8
    stored = storage_key(long)
    assert stored == "sha256:" + hashlib.sha256(long.encode()).hexdigest()
    envelope = Envelope(type="charge", payload={}, idempotency_key=long)
    assert job_key(spec(), envelope, {}) == stored


@given(st.text(min_size=1, max_size=1500))
def test_storage_keys_fit_dynamodb(key: str) -> None:
    stored = storage_key(key)
    assert 0 < len(stored.encode("utf-8")) <= MAX_KEY_BYTES
    assert storage_key(key) == stored
