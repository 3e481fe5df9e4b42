"""The ledger's pure parts: claim decisions, derived states, record parsing, result capping, progress timing,
condition composition and attribute encoding."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import worker.idempotency as idempotency
from worker.idempotency import Record, State, Status, decide_claim, parse_record
from worker.idempotency.dynamodb import (
    CONDITIONS,
    Update,
    _placeholders,
    all_of,
    any_of,
    cond,
    decode_item,
    decode_value,
    encode_value,
)
from worker.idempotency.ledger import (
    CLAIM_CONDITION,
    OWNED_CONDITION,
    encode_result,
    progress_delay_s,
    truncate,
)

NOW_MS = 1_800_000_000_500
NOW_S = NOW_MS // 1000
HASH = "a" * 64


def record(**changes: Any) -> Record:
    values: dict[str, Any] = {
        "key": "k",
        "status": Status.IN_PROGRESS,
        "expiration": NOW_S + 3600,
        "lease_expires_at_ms": NOW_MS + 1,
        "owner": "w1",
        "token": 3,
        "payload_hash": HASH,
        "attempts": 2,
    }
    values.update(changes)
    return Record(**values)


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (None, "run"),
        (record(), "busy"),  # live lease, 1 ms left
        (record(lease_expires_at_ms=NOW_MS), "run"),  # lapsed exactly now: takeover
        (record(lease_expires_at_ms=0, owner=None), "run"),  # released after a retryable failure
        (record(status=Status.COMPLETED, lease_expires_at_ms=0), "completed"),
        (record(status=Status.FAILED, lease_expires_at_ms=0), "run"),  # permanent failures may be redriven
        (record(payload_hash="b" * 64), "conflict"),
        (record(payload_hash="b" * 64, status=Status.COMPLETED), "conflict"),
        (record(payload_hash=None), "conflict"),
        (record(status=Status.COMPLETED, expiration=NOW_S), "replace"),  # expired exactly now
        (record(expiration=NOW_S - 1, payload_hash="b" * 64), "replace"),  # an expired key may be reused
        (record(status=Status.COMPLETED, expiration=NOW_S + 1), "completed"),
    ],
)
def test_decide_claim(stored: Record | None, expected: str) -> None:
    assert decide_claim(stored, payload_hash=HASH, now_ms=NOW_MS) == expected


@pytest.mark.parametrize(
    ("stored", "state"),
    [
        (record(), State.RUNNING),
        (record(lease_expires_at_ms=NOW_MS), State.LEASE_LAPSED),
        (record(lease_expires_at_ms=0, owner=None), State.RETRY_PENDING),
        (record(status=Status.COMPLETED), State.COMPLETED),
        (record(status=Status.FAILED), State.FAILED),
        (record(status=Status.COMPLETED, expiration=NOW_S), State.EXPIRED),
        (record(expiration=NOW_S - 10), State.EXPIRED),
    ],
)
def test_derived_state(stored: Record, state: State) -> None:
    assert stored.state(NOW_MS) is state


@given(
    status=st.sampled_from(Status),
    lease_ms=st.integers(0, 2 * NOW_MS),
    expiration=st.integers(0, 2 * NOW_S),
    same=st.booleans(),
)
def test_decide_claim_and_state_agree(status: Status, lease_ms: int, expiration: int, same: bool) -> None:
    stored = record(
        status=status, lease_expires_at_ms=lease_ms, expiration=expiration, payload_hash=HASH if same else "x"
    )
    decision = decide_claim(stored, payload_hash=HASH, now_ms=NOW_MS)
    state = stored.state(NOW_MS)
    if state is State.EXPIRED:
        assert decision == "replace"
    elif not same:
        assert decision == "conflict"
    else:
        assert (
            decision
            == {
                State.RUNNING: "busy",
                State.COMPLETED: "completed",
                State.FAILED: "run",
                State.LEASE_LAPSED: "run",
                State.RETRY_PENDING: "run",
            }[state]
        )
    if decision == "busy":
        assert 0 < stored.lease_remaining_s(NOW_MS) <= (lease_ms - NOW_MS) / 1000


def test_parse_record_reads_every_attribute() -> None:
    item = {
        "key": "k",
        "status": "COMPLETED",
        "expiration": NOW_S,
        "lease_expires_at_ms": 0,
        "owner": "host:1:abcd",
        "token": 2,
        "payload_hash": HASH,
        "job_type": "charge",
        "attempts": 2,
        "last_error": "RetryableError: x",
        "result": '{"id":1}',
        "progress": 50,
        "progress_note": "half",
        "created_at": NOW_MS - 10,
        "updated_at": NOW_MS,
        "unknown_future_attribute": "ignored",
    }
    parsed = parse_record(item)
    assert parsed == Record(
        key="k",
        status=Status.COMPLETED,
        expiration=NOW_S,
        owner="host:1:abcd",
        token=2,
        payload_hash=HASH,
        job_type="charge",
        attempts=2,
        last_error="RetryableError: x",
        result={"id": 1},
        progress=50.0,
        progress_note="half",
        created_at=NOW_MS - 10,
        updated_at=NOW_MS,
    )
    view = parsed.to_json(NOW_MS)
    assert view["state"] == "EXPIRED"
    json.dumps(view)


@pytest.mark.parametrize(
    ("item", "message"), [({}, "without a string 'key'"), ({"key": "k", "status": "DONE"}, "unknown status")]
)
def test_parse_record_rejects_malformed_items(item: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_record(item)


@pytest.mark.parametrize(
    ("result", "max_bytes", "text", "note"),
    [
        (None, 10, None, None),
        ({"b": 1, "a": "é"}, 100, '{"b":1,"a":"é"}', None),
        ("é" * 5, 12, '"ééééé"', None),  # 12 bytes: fits exactly
        ("é" * 6, 12, None, "result not stored: 14 bytes of JSON exceed the 12-byte limit"),
        (float("inf"), 100, None, "result not stored: not JSON-serialisable"),
        ({1, 2}, 100, None, "result not stored: not JSON-serialisable"),
    ],
)
def test_encode_result(result: Any, max_bytes: int, text: str | None, note: str | None) -> None:
    stored, stored_note = encode_result(result, max_bytes=max_bytes)
    assert stored == text
    if note is None:
        assert stored_note is None
    else:
        assert stored_note is not None
        assert stored_note.startswith(note)


@pytest.mark.parametrize(
    ("now_s", "last_write_s", "interval_s", "delay_s"),
    [
        (100.0, None, 5.0, 0.0),
        (100.0, 100.0, 5.0, 5.0),
        (103.0, 100.0, 5.0, 2.0),
        (105.0, 100.0, 5.0, 0.0),
        (200.0, 100.0, 5.0, 0.0),
        (100.0, 100.0, 0.0, 0.0),
    ],
)
def test_progress_delay(now_s: float, last_write_s: float | None, interval_s: float, delay_s: float) -> None:
    assert progress_delay_s(now_s=now_s, last_write_s=last_write_s, min_interval_s=interval_s) == pytest.approx(delay_s)


@given(st.text(max_size=50), st.integers(1, 40))
def test_truncate(text: str, max_chars: int) -> None:
    cut = truncate(text, max_chars)
    assert len(cut) <= max_chars
    assert cut == text or (cut.endswith("…") and text.startswith(cut[:-1]))


def test_conditions_are_composed_from_named_fragments() -> None:
    assert CLAIM_CONDITION.render() == (
        "((attribute_not_exists(#key)) OR ((#expiration > :now_s) AND (#payload_hash = :payload_hash) AND "
        "(((#status = :in_progress) AND (#lease_expires_at_ms <= :now_ms)) OR (#status = :failed))))"
    )
    assert all_of("in_progress", "owner_is_me", "token_is_mine") == OWNED_CONDITION
    assert (
        any_of("absent", cond("failed")).render() == f"(({CONDITIONS['absent'].text}) OR ({CONDITIONS['failed'].text}))"
    )


def test_placeholders_name_every_attribute_and_only_used_values() -> None:
    update = Update(assign={"status": "X"}, increment=("token",), keep_if_present={"created_at": 1}, remove=("owner",))
    text, values = update.expression()
    assert text == (
        "SET #status = :set_status, #token = if_not_exists(#token, :zero) + :one, "
        "#created_at = if_not_exists(#created_at, :keep_created_at) REMOVE #owner"
    )
    arguments = _placeholders([text, cond("owner_is_me").render()], {**values, "owner": "w", "unused": 1})
    assert arguments["ExpressionAttributeNames"] == {
        "#status": "status",
        "#token": "token",
        "#created_at": "created_at",
        "#owner": "owner",
    }
    assert set(arguments["ExpressionAttributeValues"]) == {":set_status", ":zero", ":one", ":keep_created_at", ":owner"}
    with pytest.raises(KeyError, match="token"):
        _placeholders([cond("token_is_mine").render()], {})


@given(
    st.none()
    | st.booleans()
    | st.text()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
)
def test_attribute_values_round_trip(value: object) -> None:
    decoded = decode_value(encode_value(value))
    assert decoded == value
    assert type(decoded) is type(value) or (isinstance(value, float) and value.is_integer())


def test_attribute_decoding_edges() -> None:
    assert decode_item(None) is None
    assert decode_item({}) is None
    assert decode_item({"n": {"N": "12.50"}, "s": {"S": "x"}}) == {"n": 12.5, "s": "x"}
    with pytest.raises(ValueError, match="unsupported"):
        decode_value({"SS": ["a"]})
    with pytest.raises(TypeError, match="cannot store"):
        encode_value([1])


def test_public_names_are_exported_once() -> None:
    """``__all__`` (kept sorted by ruff's RUF022) names exactly the package's public attributes."""
    # ("@py_builtins"/"@pytest_ar": pytest rewrites the asserts of the package its plugin entry point comes from)
    public = {name for name in vars(idempotency) if not name.startswith(("_", "@"))} - {
        "dynamodb",
        "expressions",
        "keys",
        "ledger",
        "memory",
    }
    assert len(set(idempotency.__all__)) == len(idempotency.__all__)
    assert set(idempotency.__all__) == public
    assert all(re.fullmatch(r"\w+", name) for name in CONDITIONS)
