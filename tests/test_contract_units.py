"""Envelope parsing, handler registration, settings and dead-letter attributes: the public contract's pure parts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

import worker
from worker import ConfigError, InvalidMessage, JobContext, Registry
from worker.deadletter import dead_letter_attributes
from worker.envelope import dump_envelope, envelope_schema, nests_deeper_than, parse_envelope
from worker.runtime.execution import prepare
from worker.settings import WorkerSettings, load_settings


def test_public_names_are_sorted_and_importable() -> None:
    assert worker.__all__ == sorted(worker.__all__)
    for name in worker.__all__:
        assert hasattr(worker, name)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("null", "not an object (got NoneType)"),
        ('"text"', "not an object (got str)"),
        ("[]", "not an object (got list)"),
        ('{"payload": {}}', "type: Field required"),
        ('{"type": ""}', "type: String should have at least 1 character"),
        ('{"type": "a", "payload": []}', "payload: Input should be a valid dictionary"),
        ('{"type": "a", "extra": 1}', "extra: Extra inputs are not permitted"),
        ('{"type": "a", "idempotency_key": 5}', "idempotency_key: Input should be a valid string"),
        ('{"type": "a", "type": "b"}', "field 'type' more than once"),
        ('{"type": "a", "typ\\u0065": "b"}', "field 'type' more than once"),  # an escape spells the same name
        ('{"payload": {}, "type": "a", "payload": {"x": 1}}', "field 'payload' more than once"),
        ('{"type": "a", "payload": {"s": "\udcff"}}', "not valid UTF-8"),  # bytes decoded with surrogateescape
        (
            '{"type": "a", "workflow": {"id": "w", "kind": "chain", "index": 0, "index": 1, "total": 2}}',
            "envelope's workflow has field 'index' more than once",
        ),
        (
            '{"type": "a", "workflow": {"id": "w", "kind": "chain", "index": 0, "total": 2, "id": "v"}}',
            "envelope's workflow has field 'id' more than once",
        ),
    ],
)
def test_bad_envelopes_name_the_problem(body: str, fragment: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        parse_envelope(body)
    assert info.value.category == "invalid_message"
    assert fragment in str(info.value)


def test_envelope_round_trip() -> None:
    body = dump_envelope("send_email", {"to": "a@b.c"}, "k1")
    assert json.loads(body) == {"type": "send_email", "payload": {"to": "a@b.c"}, "idempotency_key": "k1"}
    envelope = parse_envelope(body)
    assert envelope.type == "send_email"
    assert parse_envelope('{"type": "x"}').payload == {}
    # A field name that recurs inside the payload, or an escape, is no repeat of an envelope field.
    assert parse_envelope('{"type": "a", "payload": {"type": "b"}}').payload == {"type": "b"}
    assert parse_envelope('{"type": "caf\\u00e9"}').type == "café"
    nested = '{"type": "a", "workflow": {"id": "w", "kind": "chain", "index": 0, "total": 2, "input": [{"id": 1}]}}'
    workflow = parse_envelope(nested).workflow
    assert workflow is not None and workflow.id == "w" and workflow.input == [{"id": 1}]


def test_non_finite_numbers_arrive_as_sent_not_as_null() -> None:
    """The worker reads NaN and +-Infinity (as Python's json does): a producer sends them so, never as null."""
    body = dump_envelope("x", {"big": float("inf"), "low": -float("inf"), "nan": float("nan")})
    payload = parse_envelope(body).payload
    assert payload["big"] == float("inf") and payload["low"] == -float("inf") and payload["nan"] != payload["nan"]


def test_schema_is_json_schema_2020_12() -> None:
    schema = envelope_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["properties"]["payload"]["type"] == "object"


class Order(BaseModel):
    order_id: int


def test_handler_signatures() -> None:
    registry = Registry()

    @registry.job("a")
    async def a(payload: Order, ctx: JobContext) -> None: ...

    @registry.job("b")
    def b(payload: dict[str, Any]) -> None: ...

    @registry.job("c", max_attempts=1, permanent=[ValueError])
    async def c(data: dict[str, Any], context: Any) -> None: ...

    spec_a, spec_b, spec_c = registry.get("a"), registry.get("b"), registry.get("c")
    assert spec_a is not None and spec_a.payload_model is Order and spec_a.wants_context and spec_a.is_async
    assert spec_b is not None and spec_b.payload_model is None and not spec_b.wants_context and not spec_b.is_async
    assert spec_c is not None and spec_c.wants_context and spec_c.permanent == (ValueError,)
    assert registry.names() == ["a", "b", "c"]


def test_bad_registrations_are_config_errors() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match="first parameter"):
        registry.job("x")(lambda: None)
    with pytest.raises(ConfigError, match="max_attempts"):

        @registry.job("y", max_attempts=0)
        async def y(payload: dict[str, Any]) -> None: ...

    @registry.job("z")
    async def z(payload: dict[str, Any]) -> None: ...

    with pytest.raises(ConfigError, match="registered twice"):

        @registry.job("z")
        async def other(payload: dict[str, Any]) -> None: ...


@pytest.mark.parametrize(
    ("name", "options", "fragment"),
    [
        ("", {}, "must be 1-256 characters"),
        ("t" * 257, {}, "must be 1-256 characters"),
        ("nan", {"timeout_s": float("nan")}, "timeout_s must be a finite number > 0"),
        ("inf", {"timeout_s": float("inf")}, "timeout_s must be a finite number > 0"),
        ("zero", {"timeout_s": 0}, "timeout_s must be a finite number > 0"),
        ("base", {"backoff_base_s": float("nan")}, "must be finite numbers >= 0"),
        ("cap", {"backoff_max_s": -1}, "must be finite numbers >= 0"),
        ("text", {"timeout_s": "5"}, "timeout_s must be a number, not str"),
        ("half", {"max_attempts": 2.5}, "max_attempts must be a whole number"),
    ],
)
def test_a_job_the_envelope_could_not_name_or_time_is_refused(name: str, options: Any, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):

        @Registry().job(name, **options)
        async def handler(payload: dict[str, Any]) -> None: ...


def test_prepare_categories() -> None:
    registry = Registry()

    @registry.job("order")
    async def order(payload: Order) -> None: ...

    assert prepare('{"type": "order", "payload": {"order_id": "7"}}', registry).payload == Order(order_id=7)
    with pytest.raises(InvalidMessage) as unknown:
        prepare('{"type": "nope"}', registry)
    assert unknown.value.category == "unknown_type"
    with pytest.raises(InvalidMessage) as invalid:
        prepare('{"type": "order", "payload": {"order_id": "secret-value"}}', registry)
    assert invalid.value.category == "invalid_payload"
    assert "secret-value" not in str(invalid.value)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_QUEUE", " jobs ")
    monkeypatch.setenv("WORKER_HANDLERS", "app.jobs, app.more ,")
    monkeypatch.setenv("WORKER_CONCURRENCY", "25")
    settings = load_settings()
    assert settings.queue == "jobs"
    assert settings.handlers == ["app.jobs", "app.more"]
    assert settings.concurrency == 25
    assert settings.visibility_timeout_s == 30


def test_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKER_QUEUE", raising=False)
    monkeypatch.setenv("WORKER_VISIBILITY_TIMEOUT_S", "1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "WORKER_QUEUE is not set" in message
    assert "WORKER_VISIBILITY_TIMEOUT_S" in message
    assert "\n" not in message


def test_settings_read_dotenv(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKER_QUEUE", raising=False)
    (tmp_path / ".env").write_text("WORKER_QUEUE=from-dotenv\nWORKER_CONCURRENCY=3\n")
    settings = WorkerSettings()
    assert (settings.queue, settings.concurrency) == ("from-dotenv", 3)


def test_dead_letter_attributes() -> None:
    attributes = dead_letter_attributes(
        category="exhausted",
        error_message="E" * 5000,
        attempts=5,
        source_queue="jobs",
        original_message_id="m-1",
        failed_at=datetime(2026, 11, 29, 10, 0, 1, 234000, tzinfo=UTC),
        original={f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(8)},
    )
    values = {k: v["StringValue"] for k, v in attributes.items()}
    assert values["error_category"] == "exhausted"
    assert values["attempts"] == "5"
    assert values["failed_at"] == "2026-11-29T10:00:01.234Z"
    assert len(values["error_message"]) == 1000
    assert len(attributes) == 10  # SQS's limit: ours and as many original ones as fit
    with pytest.raises(ValueError, match="category"):
        dead_letter_attributes(
            category="oops",
            error_message="",
            attempts=1,
            source_queue="q",
            original_message_id="m",
            failed_at=datetime.now(UTC),
        )


def test_a_fifo_queue_with_flow_controlled_jobs_gets_a_generous_receive_count() -> None:
    """On FIFO a rate limit's holds are receives: the default max_attempts + 2 sent good jobs to the DLQ unrun."""
    registry = Registry()

    @registry.job("plain", max_attempts=5)
    async def plain(payload: dict[str, Any]) -> None: ...

    assert (registry.max_receive_count(), registry.max_receive_count(fifo=True)) == (7, 7)

    @registry.job("limited", rate_limit="2/s")
    async def limited(payload: dict[str, Any]) -> None: ...

    assert (registry.max_receive_count(), registry.max_receive_count(fifo=True)) == (7, 100)


def test_nesting_depth_counts_objects_and_arrays_not_scalars() -> None:
    value: object = "leaf"
    for _ in range(3):
        value = {"a": [1, value]}  # 6 levels: object, array, object, array, object, array
    assert not nests_deeper_than(value, 6)
    assert nests_deeper_than(value, 5)
    assert not nests_deeper_than("text", 0) and nests_deeper_than([], 0)
    assert not nests_deeper_than({"a": 1, "b": [2, 3]}, 2)
