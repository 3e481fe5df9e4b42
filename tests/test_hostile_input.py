"""Hostile input and odd failures never loop: each gets a terminal decision on its first receive, and a job
decided dead never runs its handler again.

Unit tests for the pure parts (envelope parsing, error descriptions, dead-letter attributes, keys, handler
registration, observers), then the real worker on each backend (moto and LocalStack over HTTP): the DLQ record's
attributes, how often the handler ran, and the source queue empty by its counts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.memory import broker_of
from worker import PermanentError
from worker.backends.aws import content_refused
from worker.deadletter import (
    DROP_ORDER,
    SQS_MAX_MESSAGE_BYTES,
    attribute_bytes,
    dead_letter_record,
    message_bytes,
)
from worker.envelope import MAX_NESTING_DEPTH, Envelope, parse_envelope
from worker.errors import ConfigError, InvalidMessage, QueueUnavailable
from worker.idempotency import Ledger, create_table, job_key, payload_hash
from worker.idempotency.ledger import encode_result
from worker.idempotency.memory import MemoryStore
from worker.jobs import JobSpec, Registry
from worker.observability.events import Event, Kind, Observers
from worker.observability.logs import event_fields
from worker.policy import describe_error, safe_text

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

#: What SQS accepts in a String attribute value.
SQS_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]+")
BIG_INT = "7" * 5000  # int() refuses more than 4300 digits


def body(payload: Any, job_type: str = "echo", **extra: Any) -> str:
    return json.dumps({"type": job_type, "payload": payload, **extra})


# ------------------------------------------------------------------------------------------------ envelope


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (body({"n": 0}).replace("0", BIG_INT), "an integer of more than 4300 digits"),
        (body({"deep": {"list": [1, 2, 0]}}).replace("0", BIG_INT), "an integer of more than 4300 digits"),
        (body({"n": 0}).replace("0", "-" + BIG_INT), "an integer of more than 4300 digits"),
        ('{"type": "echo", "payload": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}", "deeper than"),
        ('{"type": "echo", "payload": ' + "[" * MAX_NESTING_DEPTH + "]" * MAX_NESTING_DEPTH + "}", "deeper than"),
        ('{"type": "echo", "payload": {"a": "\\ud800"}}', "not valid Unicode"),
        ('{"type": "echo", "payload": {"a": ["x\\uDFFFy"]}}', "not valid Unicode"),
        ('{"type": "echo", "payload": {"\\udc00": 1}}', "not valid Unicode"),
        ('{"type": "echo", "payload": {}, "idempotency_key": "k\\ud800"}', "not valid Unicode"),
    ],
    ids=["int", "nested-int", "negative-int", "deep", "just-too-deep", "surrogate", "low-surrogate", "key", "env-key"],
)
def test_hostile_bodies_are_invalid_messages(text: str, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason) as caught:
        parse_envelope(text)
    assert caught.value.category == "invalid_message"
    assert BIG_INT not in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "echo", "payload": {"n": NaN, "i": Infinity, "j": -Infinity, "big": 1e999}}',
        body({"n": int("9" * 4300)}),
        '{"type": "echo", "payload": {"a": ' + "[" * (MAX_NESTING_DEPTH - 2) + "]" * (MAX_NESTING_DEPTH - 2) + "}}",
        body({"list": [[] for _ in range(500)]}),  # many brackets, shallow: walked, accepted
        '{"type": "echo", "payload": {"pair": "\\ud83d\\ude00", "escaped": "\\\\ud800"}}',
        body({"n": 0}).replace("0", BIG_INT + ".5"),  # only integers have the digit limit: a float parses
        body({"n": 0}).replace("0", BIG_INT + "e-4990"),
    ],
    ids=["nan-inf", "4300-digits", "depth-100", "many-brackets", "surrogate-pair", "long-float", "long-mantissa"],
)
def test_odd_but_valid_bodies_parse(text: str) -> None:
    envelope = parse_envelope(text)
    payload_hash(envelope.type, envelope.payload)  # hashing never fails on a payload that parsed
    job_key(JobSpec(name="echo", handler=print, idempotent=True), envelope, envelope.payload)


# ------------------------------------------------------------------------------------------------ errors


class Unprintable(PermanentError):
    def __str__(self) -> str:
        raise RuntimeError("no")


class NotAString(ValueError):
    def __str__(self) -> Any:
        return 42


def test_an_exception_whose_str_raises_is_described_safely() -> None:
    assert describe_error(Unprintable("x")) == "Unprintable: <unprintable Unprintable>"
    assert describe_error(NotAString("x")) == "NotAString: <unprintable NotAString>"


def test_descriptions_hold_only_characters_sqs_accepts() -> None:
    text = describe_error(PermanentError("nul\x00 surrogate\ud800 bell\x07 nonchar\ufffe ok\t\U0001f600"))
    assert SQS_TEXT.fullmatch(text)
    assert text == "PermanentError: nul\ufffd surrogate\ufffd bell\ufffd nonchar\ufffd ok\t\U0001f600"
    assert safe_text("plain") == "plain"


def test_content_refusals_are_told_from_transport_failures() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    def client_error(code: str, status: int) -> ClientError:
        response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(response, "SendMessage")

    refused = QueueUnavailable("send failed")
    refused.__cause__ = client_error("InvalidParameterValue", 400)
    assert content_refused(refused)
    assert content_refused(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    down = QueueUnavailable("send failed")
    down.__cause__ = EndpointConnectionError(endpoint_url="http://x")
    assert not content_refused(down)
    throttled = QueueUnavailable("send failed")
    throttled.__cause__ = client_error("ThrottlingException", 400)
    assert not content_refused(throttled)


# ------------------------------------------------------------------------------------------------ dead-letter record

FAILED_AT = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def record(error: str = "PermanentError: no", **fields: Any) -> Any:
    defaults: dict[str, Any] = {
        "category": "permanent",
        "error_message": error,
        "attempts": 1,
        "source_queue": "jobs",
        "original_message_id": "m-1",
        "failed_at": FAILED_AT,
    }
    return dead_letter_record(**{**defaults, **fields})


def test_attribute_values_are_sanitized() -> None:
    attributes = record("PermanentError: a\x00b\ud800c").attributes
    assert attributes["error_message"]["StringValue"] == "PermanentError: a\ufffdb\ufffdc"


def test_attributes_give_way_to_the_body_least_useful_first() -> None:
    originals = {
        "small": {"DataType": "String", "StringValue": "s"},
        "large": {"DataType": "String", "StringValue": "L" * 500},
    }
    full = record("E" * 900, original=originals)
    size = message_bytes("", full.attributes)
    limit = 10_000
    # Room for everything but the large original attribute.
    fitted = record("E" * 900, original=originals, body="b" * (limit - size + 10), max_message_bytes=limit)
    assert "large" not in fitted.attributes and "small" in fitted.attributes
    assert fitted.trimmed == ("original attribute 'large' dropped",)
    # Less room: both originals go, then error_message is shortened.
    fitted = record("E" * 900, original=originals, body="b" * (limit - size + 800), max_message_bytes=limit)
    assert set(fitted.attributes) == {"error_category", "error_message", "attempts", "receive_count", "failed_at",
                                      "source_queue", "original_message_id"}  # fmt: skip
    assert fitted.attributes["error_message"]["StringValue"].endswith("…")
    assert message_bytes("b" * (limit - size + 800), fitted.attributes) <= limit
    # Room for the category alone; none at all.
    category = attribute_bytes("error_category", {"DataType": "String", "StringValue": "permanent"})
    fitted = record("E" * 900, original=originals, body="b" * (limit - category), max_message_bytes=limit)
    assert set(fitted.attributes) == {"error_category"}
    assert fitted.trimmed[-1] == "error_message dropped"
    fitted = record(body="b" * limit, max_message_bytes=limit)
    assert fitted.attributes == {} and fitted.trimmed[-1] == "error_category dropped"


def test_size_counts_bytes_as_sqs_does() -> None:
    value = {"DataType": "String", "StringValue": "é€😀"}  # 2 + 3 + 4 bytes
    assert attribute_bytes("n", value) == 1 + 6 + 9
    assert attribute_bytes("b", {"DataType": "Binary", "BinaryValue": b"\x00\x01"}) == 1 + 6 + 2
    assert message_bytes("é", {"n": value}) == 2 + 16


#: Any character, with those SQS refuses (NUL, controls, lone surrogates, U+FFFE/U+FFFF) drawn often.
any_char = st.one_of(
    st.characters(exclude_categories=()),
    st.sampled_from(["\x00", "\x07", "\x1f", "\ud800", "\udfff", "\ufffe", "\uffff", "é", "\U0001f600"]),
)
originals_strategy = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
    st.builds(lambda text: {"DataType": "String", "StringValue": text or "x"}, st.text(any_char, max_size=300)),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(
    error=st.text(any_char, max_size=3000),
    body_bytes=st.integers(min_value=0, max_value=4_000),
    category=st.sampled_from(["invalid_message", "permanent", "bug", "exhausted"]),
    originals=originals_strategy,
    source_queue=st.text(any_char, min_size=1, max_size=80),
)
def test_dead_letter_attributes_are_always_acceptable_to_sqs(
    error: str, body_bytes: int, category: str, originals: dict[str, Any], source_queue: str
) -> None:
    limit = 4_000
    payload = "b" * body_bytes
    fitted = record(
        error, category=category, original=originals, body=payload, max_message_bytes=limit, source_queue=source_queue
    ).attributes
    assert len(fitted) <= 10
    for value in fitted.values():
        assert value["DataType"] == "String"
        assert SQS_TEXT.fullmatch(value["StringValue"])  # only accepted characters, never empty
    assert message_bytes(payload, fitted) <= limit
    category_bytes = attribute_bytes("error_category", {"DataType": "String", "StringValue": category})
    if limit - body_bytes >= category_bytes:
        assert fitted["error_category"]["StringValue"] == category  # dropped last
    kept_ours = [name for name in DROP_ORDER if name in fitted]
    assert kept_ours == list(DROP_ORDER)[len(DROP_ORDER) - len(kept_ours) :]  # dropped in order


# ------------------------------------------------------------------------------------------------ keys, results


def envelope_of(payload: dict[str, Any], key: str | None = None) -> Envelope:
    return Envelope.model_construct(type="echo", payload=payload, idempotency_key=key)


def test_a_key_function_returning_a_lone_surrogate_is_an_invalid_message() -> None:
    spec = JobSpec(name="echo", handler=print, key=lambda p: p["id"] + "\ud800")
    with pytest.raises(InvalidMessage, match="key function") as caught:
        job_key(spec, envelope_of({"id": "a"}), {"id": "a"})
    assert caught.value.category == "invalid_message"


def test_a_key_function_that_raises_stays_the_jobs_bug() -> None:
    spec = JobSpec(name="echo", handler=print, key=lambda p: p["missing"])
    with pytest.raises(KeyError):
        job_key(spec, envelope_of({}), {})


def test_hashing_a_payload_that_is_not_valid_unicode_is_an_invalid_message() -> None:
    # parse_envelope refuses such payloads; these guard the key code on its own.
    with pytest.raises(InvalidMessage):
        payload_hash("echo", {"a": "\ud800"})
    with pytest.raises(InvalidMessage):
        job_key(JobSpec(name="echo", handler=print, idempotent=True), envelope_of({"a": "\ud800"}), {})


@pytest.mark.parametrize(
    "result",
    [{"a": "\ud800"}, float("nan"), {"deep": None}],
    ids=["surrogate", "nan", "deep"],
)
def test_a_result_the_ledger_cannot_store_becomes_a_note(result: Any) -> None:
    if isinstance(result, dict) and "deep" in result:
        for _ in range(10_000):
            result = [result]
    text, note = encode_result(result, max_bytes=10_000)
    assert text is None and note is not None and note.startswith("result not stored")


# ------------------------------------------------------------------------------------------------ registration


def test_an_unresolvable_payload_annotation_is_refused_at_registration() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match=r"handler .*misspelt.*'Emial'.*'payload'"):

        @registry.job("misspelt")
        async def misspelt(payload: Emial) -> None:  # type: ignore[name-defined]  # noqa: F821
            pass

    with pytest.raises(ConfigError, match="NoSuchModel"):

        @registry.job("quoted")
        def quoted(payload: NoSuchModel, ctx: Any) -> None:  # type: ignore[name-defined]  # noqa: F821
            pass

    assert len(registry) == 0


def test_a_model_defined_beside_the_handler_resolves() -> None:
    registry = Registry()

    class Local(BaseModel):
        n: int

    @registry.job("local")
    async def local(payload: Local) -> Any:  # a string annotation (from __future__ import annotations)
        return "Nothing"  # an unresolvable return annotation would not matter

    spec = registry.get("local")
    assert spec is not None and spec.payload_model is Local


# ------------------------------------------------------------------------------------------------ observers


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    def emit(self, event: Event) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        raise RuntimeError("observer bug")

    def connectivity(self, *, service: str, reachable: bool) -> None:
        raise RuntimeError("observer bug")


class Keeping:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        pass

    def connectivity(self, *, service: str, reachable: bool) -> None:
        pass


def test_a_failing_observer_is_logged_once_and_the_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    failing, second_failing, keeping = Failing(), Failing(), Keeping()
    observers = Observers([failing, second_failing, keeping])
    with caplog.at_level(logging.ERROR, logger="worker"):
        for n in range(5):
            observers.emit(Event(kind=Kind.RECEIVED, queue="q", message_id=str(n)))
            observers.gauge(in_flight=0, free_slots=1)
            observers.connectivity(service="sqs", reachable=False)
    assert failing.calls == 5  # still called
    assert len(keeping.events) == 5
    failures = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(failures) == 2  # once per failing observer, not once per event
    assert all(r.exc_info is not None and "observer bug" in str(r.exc_info[1]) for r in failures)


# ------------------------------------------------------------------------------------------------ the real worker


def queue_is_empty(endpoint_url: str, queue_url: str) -> bool:
    """Gone, not merely invisible: visible + in flight + delayed == 0."""
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    counts = sqs_client(endpoint_url).get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(counts[name]) for name in names) == 0


def dlq_records(backend: Backend, dlq_url: str, expect: int) -> dict[str, dict[str, Any]]:
    """The DLQ's records by original MessageId (the attributes as plain strings, the body under ``body``)."""
    records = drain(backend.endpoint_url, dlq_url, expect=expect, timeout_s=10)
    assert len(records) == expect, records
    found: dict[str, dict[str, Any]] = {}
    for item in records:
        attributes = {k: v["StringValue"] for k, v in item.get("MessageAttributes", {}).items()}
        found[attributes.get("original_message_id", item["MessageId"])] = {**attributes, "body": item["Body"]}
    return found


class Calls:
    """How often each job ran."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def ran(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


class Picky(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def check(cls, value: int) -> int:
        raise TypeError("a validator bug")  # pydantic wraps only ValueError and AssertionError


def hostile_registry(calls: Calls) -> Registry:
    registry = Registry()

    @registry.job("picky")
    async def picky(payload: Picky) -> None:
        calls.ran("picky")

    @registry.job("echo")
    async def echo(payload: dict[str, Any]) -> dict[str, Any]:
        calls.ran("echo")
        return payload

    @registry.job("charge", idempotent=True)
    async def charge(payload: dict[str, Any]) -> dict[str, Any]:
        calls.ran("charge")
        return payload

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        calls.ran("refuse")
        raise PermanentError(payload["reason"].replace("<lone surrogate>", "\ud800"))

    @registry.job("unprintable")
    def unprintable(payload: dict[str, Any]) -> None:
        calls.ran("unprintable")
        raise Unprintable("x")

    return registry


HOSTILE_BODIES = [
    ("big-int", body({"n": 0}).replace("0", BIG_INT), "invalid_message", "4300 digits"),
    ("deep", body({"a": 0}).replace("0", "[" * 5000 + "]" * 5000), "invalid_message", "deeper than"),
    ("surrogate", '{"type": "echo", "payload": {"a": "\\ud800"}}', "invalid_message", "not valid Unicode"),
    ("surrogate-idempotent", '{"type": "charge", "payload": {"a": "\\ud800"}}', "invalid_message", "Unicode"),
    (
        "surrogate-with-key",
        '{"type": "charge", "payload": {"a": "\\udfff"}, "idempotency_key": "k-1"}',
        "invalid_message",
        "Unicode",
    ),
    ("nul-permanent", body({"reason": "closed\u0000 account"}, "refuse"), "permanent", "closed\ufffd account"),
    ("surrogate-permanent", body({"reason": "bad<lone surrogate> name"}, "refuse"), "permanent", "bad\ufffd name"),
    ("unprintable", body({}, "unprintable"), "permanent", "Unprintable: <unprintable Unprintable>"),
    ("validator-raises", body({"n": 1}, "picky"), "bug", "TypeError: a validator bug"),
]


@pytest.mark.memory
async def test_hostile_bodies_are_decided_on_the_first_receive(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    calls = Calls()
    async with running_worker(backend.endpoint_url, queues, hostile_registry(calls)) as running:
        ids = {send(backend.endpoint_url, queues.queue_url, text): name for name, text, _, _ in HOSTILE_BODIES}
        await running.recorder.wait_count(Kind.DEAD_LETTERED, len(HOSTILE_BODIES), timeout_s=20)
        # NaN, Infinity and 1e999 are odd but parse: the job runs once and succeeds.
        send(backend.endpoint_url, queues.queue_url, '{"type": "charge", "payload": {"n": NaN, "i": 1e999}}')
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
    assert running.recorder.of(Kind.RETRY_SCHEDULED) == []
    assert running.recorder.of(Kind.RELEASED) == []
    assert calls.counts == {"refuse": 2, "unprintable": 1, "charge": 1}  # never the hostile input, each once
    records = dlq_records(backend, queues.dlq_url, len(HOSTILE_BODIES))
    expected = {name: (text, category, fragment) for name, text, category, fragment in HOSTILE_BODIES}
    for message_id, found in records.items():
        text, category, fragment = expected[ids[message_id]]
        assert found["body"] == text
        assert found["error_category"] == category
        assert found["attempts"] == "1"
        assert fragment in found["error_message"]
    assert queue_is_empty(backend.endpoint_url, queues.queue_url)


@pytest_asyncio.fixture(loop_scope="function")
async def table(dynamodb: DynamoDBClient) -> str:
    name = f"hostile-{uuid.uuid4().hex[:12]}"
    await create_table(dynamodb, name)
    return name


@pytest.fixture
def ledger(backend: Backend, request: pytest.FixtureRequest) -> Ledger:
    """A ledger in a fresh table; on the memory backend in a MemoryStore on the backend's clock."""
    owner = f"test:{uuid.uuid4().hex[:8]}"
    if backend.name == "memory":
        return Ledger(store=MemoryStore(), owner=owner, clock=broker_of(backend.endpoint_url).clock.time)
    return Ledger(request.getfixturevalue("dynamodb"), request.getfixturevalue("table"), owner=owner)


@pytest.mark.memory
async def test_idempotent_hostile_input_is_decided_once_with_the_ledger(backend: Backend, ledger: Ledger) -> None:
    queues = make_queues(backend.endpoint_url)
    calls = Calls()
    registry = hostile_registry(calls)

    @registry.job("keyed", key=lambda payload: payload["id"] + "\udc00")
    async def keyed(payload: dict[str, Any]) -> None:
        calls.ran("keyed")

    @registry.job("key_bug", key=lambda payload: payload["missing"])
    async def key_bug(payload: dict[str, Any]) -> None:
        calls.ran("key_bug")

    cases = {
        "surrogate-with-key": ('{"type": "charge", "payload": {"a": "\\ud800"}, "idempotency_key": "k"}', "invalid"),
        "surrogate": ('{"type": "charge", "payload": {"a": "\\ud800"}}', "invalid_message"),
        "nan": ('{"type": "charge", "payload": {"n": NaN, "i": -Infinity, "f": 1e999}}', None),
        "key-surrogate": (body({"id": "a"}, "keyed"), "invalid_message"),
        "key-bug": (body({}, "key_bug"), "bug"),
    }
    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        ids = {send(backend.endpoint_url, queues.queue_url, text): name for name, (text, _) in cases.items()}
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 4, timeout_s=20)
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
    assert calls.counts == {"charge": 1}  # the NaN payload, once; its result is noted, not stored
    records = dlq_records(backend, queues.dlq_url, 4)
    for message_id, found in records.items():
        name = ids[message_id]
        expected = cases[name][1]
        assert expected is not None and found["error_category"].startswith(expected), (name, found)
        assert found["attempts"] == "1"
    assert "KeyError" in next(r for m, r in records.items() if ids[m] == "key-bug")["error_message"]
    assert queue_is_empty(backend.endpoint_url, queues.queue_url)


@pytest.mark.memory
async def test_a_handler_raising_cancelled_error_is_retried_not_released(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    runs: list[str] = []

    @registry.job("cancel_async", max_attempts=2, backoff_base_s=1)
    async def cancel_async(payload: dict[str, Any]) -> None:
        runs.append("async")
        raise asyncio.CancelledError()

    @registry.job("cancel_sync", max_attempts=2, backoff_base_s=1)
    def cancel_sync(payload: dict[str, Any]) -> None:
        runs.append("sync")
        raise asyncio.CancelledError("from a thread")

    async with running_worker(backend.endpoint_url, queues, registry) as running:
        send(backend.endpoint_url, queues.queue_url, body({}, "cancel_async"))
        send(backend.endpoint_url, queues.queue_url, body({}, "cancel_sync"))
        dead = await running.recorder.wait_count(Kind.DEAD_LETTERED, 2, timeout_s=20)
    assert sorted(runs) == ["async", "async", "sync", "sync"]  # max_attempts, not a run per receive
    assert running.recorder.of(Kind.RELEASED) == []  # not a shutdown
    retries = running.recorder.of(Kind.RETRY_SCHEDULED)
    assert sorted(e.job_type or "" for e in retries) == ["cancel_async", "cancel_sync"]
    assert all(e.delay_s == 1 and e.error and e.error.startswith("CancelledError") for e in retries)
    assert {e.category for e in dead} == {"exhausted"}
    records = dlq_records(backend, queues.dlq_url, 2)
    assert all(r["attempts"] == "2" and "CancelledError" in r["error_message"] for r in records.values())
    assert queue_is_empty(backend.endpoint_url, queues.queue_url)


@pytest.mark.memory
async def test_a_failed_dead_letter_send_is_retried_as_a_send(backend: Backend) -> None:
    """The send fails twice: it is tried again while the message is kept invisible. A short visibility timeout, so
    a send failure that left the message to reappear would run the handler again within the test."""
    queues = make_queues(backend.endpoint_url)
    calls = Calls()
    async with running_worker(backend.endpoint_url, queues, hostile_registry(calls), visibility_timeout_s=2) as running:
        dlq = running.worker.outcomes.dlq
        real_send = dlq.send
        failures: list[int] = []

        async def flaky_send(*args: Any, **kwargs: Any) -> str:
            if len(failures) < 2:
                failures.append(1)
                raise QueueUnavailable("SendMessage failed: endpoint unwell")
            return await real_send(*args, **kwargs)

        dlq.send = flaky_send  # type: ignore[method-assign]
        message_id = send(backend.endpoint_url, queues.queue_url, body({"reason": "no"}, "refuse"))
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=15)
    assert len(failures) == 2
    assert calls.counts == {"refuse": 1}  # sent again, never run again
    records = dlq_records(backend, queues.dlq_url, 1)
    assert records[message_id]["error_category"] == "permanent"
    assert queue_is_empty(backend.endpoint_url, queues.queue_url)


@pytest.mark.memory
@pytest.mark.parametrize("dlq_limit", [None, 262_144], ids=["default-limit", "dlq-256KiB"])
@pytest.mark.parametrize("room", [0, 40], ids=["at-limit", "room-for-category"])
async def test_a_body_at_the_size_limit_is_dead_lettered_byte_for_byte(
    backend: Backend, dlq_limit: int | None, room: int, caplog: pytest.LogCaptureFixture
) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    if dlq_limit is not None:
        client.set_queue_attributes(QueueUrl=queues.dlq_url, Attributes={"MaximumMessageSize": str(dlq_limit)})
    limit = int(
        client.get_queue_attributes(QueueUrl=queues.dlq_url, AttributeNames=["MaximumMessageSize"])["Attributes"][
            "MaximumMessageSize"
        ]
    )
    assert limit == (dlq_limit or SQS_MAX_MESSAGE_BYTES)  # what each emulator enforces by default: 1 MiB
    frame = body({"reason": "too big", "pad": ""}, "refuse")
    text = frame.replace('"pad": ""', '"pad": "' + "p" * (limit - room - len(frame)) + '"')
    assert len(text.encode()) == limit - room
    calls = Calls()
    with caplog.at_level(logging.WARNING, logger="worker"):
        async with running_worker(backend.endpoint_url, queues, hostile_registry(calls)) as running:
            message_id = send(backend.endpoint_url, queues.queue_url, text)
            await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=20)
    assert calls.counts == {"refuse": 1}
    found = dlq_records(backend, queues.dlq_url, 1)
    # No room for original_message_id: the ERROR line `job dead-lettered` names the record's DLQ message id.
    fields = event_fields(running.recorder.of(Kind.DEAD_LETTERED)[0])
    assert list(found) == [fields["dlq_message_id"]]
    assert fields["message_id"] == message_id
    record_ = found[fields["dlq_message_id"]]
    assert record_["body"] == text
    kept = {name for name in record_ if name != "body"}
    assert kept == ({"error_category"} if room else set())
    if room:
        assert record_["error_category"] == "permanent"
    assert any("trimmed" in r.getMessage() for r in caplog.records)
    assert queue_is_empty(backend.endpoint_url, queues.queue_url)


@pytest.mark.memory
async def test_a_copy_of_a_dead_lettered_message_never_runs_again(backend: Backend) -> None:
    """The delete after the dead-letter send fails: the message reappears, and is deleted without running."""
    queues = make_queues(backend.endpoint_url)
    calls = Calls()
    async with running_worker(backend.endpoint_url, queues, hostile_registry(calls), visibility_timeout_s=2) as running:
        queue = running.worker.outcomes.queue
        real_delete = queue.delete
        failed: list[str] = []

        async def delete_failing_once(receipt_handle: str) -> None:
            if not failed:
                failed.append(receipt_handle)
                raise QueueUnavailable("DeleteMessageBatch failed: endpoint unwell")
            await real_delete(receipt_handle)

        queue.delete = delete_failing_once  # type: ignore[method-assign]
        message_id = send(backend.endpoint_url, queues.queue_url, body({"reason": "no"}, "refuse"))
        await running.recorder.wait_for(lambda r: len(r.of(Kind.RECEIVED)) >= 2, timeout_s=15)
        await running.recorder.wait_for(lambda r: queue_is_empty(backend.endpoint_url, queues.queue_url))
    assert failed
    assert calls.counts == {"refuse": 1}
    assert list(dlq_records(backend, queues.dlq_url, 1)) == [message_id]  # one record, not one per receive


@pytest.mark.memory
async def test_a_refused_dead_letter_send_falls_back_to_the_category(backend: Backend) -> None:
    """The DLQ's size cannot be read, so 1 MiB is assumed while the DLQ takes 256 KiB: SQS (LocalStack) refuses
    body plus attributes, and the record goes with its category alone, the body untouched, the handler run once."""
    queues = make_queues(backend.endpoint_url)
    sqs_client(backend.endpoint_url).set_queue_attributes(
        QueueUrl=queues.dlq_url, Attributes={"MaximumMessageSize": "262144"}
    )
    frame = body({"reason": "too big", "pad": ""}, "refuse")
    text = frame.replace('"pad": ""', '"pad": "' + "p" * (262_144 - 200 - len(frame)) + '"')
    calls = Calls()
    async with running_worker(backend.endpoint_url, queues, hostile_registry(calls)) as running:

        async def unreadable() -> int | None:
            return None

        running.worker.outcomes.dlq.maximum_message_bytes = unreadable  # type: ignore[method-assign]
        message_id = send(backend.endpoint_url, queues.queue_url, text)
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=20)
    assert calls.counts == {"refuse": 1}
    found = dlq_records(backend, queues.dlq_url, 1)
    record_ = found.get(message_id) or next(iter(found.values()))
    assert record_["body"] == text
    assert record_["error_category"] == "permanent"
    if backend.name in ("localstack", "memory"):  # moto counts only the body against the limit
        attributes = {k: {"DataType": "String", "StringValue": v} for k, v in record_.items() if k != "body"}
        assert 0 < message_bytes(text, attributes) - len(text) <= 200  # refitted to 256 KiB, not all dropped
    assert queue_is_empty(backend.endpoint_url, queues.queue_url)


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_due_time_with_no_utc_time_is_a_value_error(text: str) -> None:
    """Valid ISO 8601 whose UTC time is out of range raised OverflowError: an internal error on every receive."""
    from worker.flow.delays import parse_due_at

    with pytest.raises(ValueError, match="out of range"):
        parse_due_at(text)


def test_a_run_at_with_no_utc_time_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from worker.commands.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["enqueue", "x", "--payload", "{}", "--run-at", "0001-01-01T00:00:00+01:00"])
    assert exited.value.code == 2
    assert "has no UTC time (out of range)" in capsys.readouterr().err
