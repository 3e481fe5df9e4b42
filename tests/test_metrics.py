"""Metrics: aggregation, EMF documents checked against the EMF specification, flushing, PutMetricData."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.support.backends import Backend
from worker.observability.events import Event, Kind
from worker.observability.metrics import (
    MAX_VALUES_PER_METRIC,
    OTHER_JOB_TYPE,
    CloudWatchObserver,
    EmfObserver,
    MetricBuffer,
    build_metrics_observer,
    emf_documents,
    metric_data,
)
from worker.settings import WorkerSettings

# The EMF document structure, written from the CloudWatch "Specification: Embedded metric format" page:
# root object with an "_aws" metadata object (Timestamp: ms since the epoch; CloudWatchMetrics: array of
# MetricDirective); a MetricDirective has Namespace (string), Dimensions (array of DimensionSets: arrays of
# at most 30 dimension keys) and Metrics (at most 100 MetricDefinitions: Name, optional Unit from the
# CloudWatch units, optional StorageResolution 1 or 60). Members of objects defined by the spec are closed.
UNITS = (
    "Seconds|Microseconds|Milliseconds|Bytes|Kilobytes|Megabytes|Gigabytes|Terabytes|Bits|Kilobits|Megabits|"
    "Gigabits|Terabits|Percent|Count|Bytes/Second|Kilobytes/Second|Megabytes/Second|Gigabytes/Second|"
    "Terabytes/Second|Bits/Second|Kilobits/Second|Megabits/Second|Gigabits/Second|Terabits/Second|"
    "Count/Second|None"
)
EMF_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["_aws"],
    "properties": {
        "_aws": {
            "type": "object",
            "required": ["Timestamp", "CloudWatchMetrics"],
            "properties": {
                "Timestamp": {"type": "integer", "minimum": 0},
                "CloudWatchMetrics": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["Namespace", "Dimensions", "Metrics"],
                        "additionalProperties": False,
                        "properties": {
                            "Namespace": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^:].*$"},
                            "Dimensions": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "array",
                                    "minItems": 0,
                                    "maxItems": 30,
                                    "items": {"type": "string", "minLength": 1, "maxLength": 255},
                                },
                            },
                            "Metrics": {
                                "type": "array",
                                "maxItems": 100,
                                "items": {
                                    "type": "object",
                                    "required": ["Name"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "Name": {"type": "string", "minLength": 1, "maxLength": 255},
                                        "Unit": {"type": "string", "pattern": f"^({UNITS})$"},
                                        "StorageResolution": {"enum": [1, 60]},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        }
    },
}
MAX_EVENT_BYTES = 256 * 1024  # the older, stricter CloudWatch Logs event limit (1 MB today)


def check_emf(line: str) -> dict[str, Any]:
    """Validate one stdout line as an EMF document: the schema plus the rules on target members."""
    assert len(line.encode()) < MAX_EVENT_BYTES
    document = json.loads(line)  # exactly one JSON object, nothing before or after
    assert isinstance(document, dict)
    jsonschema.validate(document, EMF_SCHEMA)
    for directive in document["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            for key in dimension_set:
                assert isinstance(document.get(key), str), f"dimension target {key} must be a string member"
                assert document[key].strip(), f"dimension {key} is blank"
        for definition in directive["Metrics"]:
            value = document.get(definition["Name"])
            if isinstance(value, list):
                assert 1 <= len(value) <= 100, f"{definition['Name']} has {len(value)} values"
                assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            else:
                assert isinstance(value, int | float), definition["Name"]
                assert not isinstance(value, bool), definition["Name"]
    return document


def event(kind: Kind, job_type: str | None = "send_email", **kwargs: Any) -> Event:
    return Event(kind=kind, queue="jobs", message_id=uuid.uuid4().hex, job_type=job_type, **kwargs)


def some_events() -> list[Event]:
    return [
        event(Kind.RECEIVED),
        event(Kind.STARTED, queue_wait_s=1.5, attempt=1),
        event(Kind.SUCCEEDED, duration_s=0.2, attempt=1),
        event(Kind.STARTED, queue_wait_s=0.25, attempt=1),
        event(Kind.HEARTBEAT),
        event(Kind.RETRY_SCHEDULED, duration_s=0.1, attempt=1, delay_s=2.0),
        event(Kind.DEAD_LETTERED, job_type="resize", duration_s=3.0, attempt=5, category="exhausted"),
        event(Kind.DEAD_LETTERED, job_type=None, attempt=1, category="invalid_message"),
        event(Kind.DUPLICATE_SKIPPED, job_type="resize"),
        event(Kind.RELEASED),
    ]


def test_buffer_counts_each_outcome() -> None:
    buffer = MetricBuffer()
    for item in some_events():
        buffer.record(item)
    buffer.gauge(in_flight=2, free_slots=8, stuck_threads=1)
    snapshot = buffer.drain()
    email = snapshot.jobs["send_email"]
    assert dict(email.counters) == {
        "JobsProcessed": 2,
        "JobsSucceeded": 1,
        "JobsRetried": 1,
        "HeartbeatExtensions": 1,
    }
    assert email.values["QueueWait"] == [1500.0, 250.0]
    assert email.values["JobDuration"] == [200.0, 100.0]
    assert email.values["Attempts"] == [1.0]  # final outcomes only
    assert snapshot.jobs["resize"].counters["JobsDeadLettered"] == 1
    assert snapshot.jobs["resize"].counters["DuplicatesSkipped"] == 1
    assert snapshot.jobs["_none"].counters["JobsDeadLettered"] == 1
    assert dict(snapshot.dead_letters_by_category) == {"exhausted": 1, "invalid_message": 1}
    assert snapshot.gauges == {"InFlight": [2.0], "FreeSlots": [8.0], "StuckThreads": [1.0]}
    assert buffer.drain().is_empty()


def test_job_types_beyond_the_cap_are_counted_as_other() -> None:
    buffer = MetricBuffer(max_job_types=2)
    for name in ("a", "b", "c", "d", "a"):
        buffer.record(event(Kind.SUCCEEDED, job_type=name))
    assert sorted(buffer.drain().jobs) == sorted(["a", "b", OTHER_JOB_TYPE])


def test_emf_documents_follow_the_spec_and_the_metric_contract() -> None:
    buffer = MetricBuffer()
    for item in some_events():
        buffer.record(item)
    buffer.gauge(in_flight=1, free_slots=9)
    documents = emf_documents(buffer.drain(), namespace="SqsWorker", queue="jobs", timestamp_ms=1_700_000_000_123)
    parsed = [check_emf(json.dumps(doc)) for doc in documents]
    seen: set[tuple[str, tuple[tuple[str, ...], ...]]] = set()
    for doc in parsed:
        assert doc["_aws"]["Timestamp"] == 1_700_000_000_123
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "SqsWorker"
            dims = tuple(tuple(d) for d in directive["Dimensions"])
            for definition in directive["Metrics"]:
                seen.add((definition["Name"], dims))
                if definition["Name"] in ("JobDuration", "QueueWait"):
                    assert definition["Unit"] == "Milliseconds"
                else:
                    assert definition["Unit"] == "Count"
    job: tuple[tuple[str, ...], ...] = (("Queue",), ("Queue", "JobType"))
    expected: set[tuple[str, tuple[tuple[str, ...], ...]]] = {
        (name, job)
        for name in (
            "JobsProcessed",
            "JobsSucceeded",
            "JobsRetried",
            "JobsDeadLettered",
            "JobDuration",
            "QueueWait",
            "Attempts",
            "HeartbeatExtensions",
            "DuplicatesSkipped",
        )
    }
    expected |= {
        ("JobsDeadLettered", (("Queue", "Category"),)),
        ("InFlight", (("Queue",),)),
        ("FreeSlots", (("Queue",),)),
        ("StuckThreads", (("Queue",),)),
    }
    assert seen == expected
    by_category = {d["Category"]: d["JobsDeadLettered"] for d in parsed if "Category" in d}
    assert by_category == {"exhausted": 1, "invalid_message": 1}
    email = next(d for d in parsed if d.get("JobType") == "send_email")
    assert email["Queue"] == "jobs"
    assert email["JobsProcessed"] == 2
    assert email["QueueWait"] == [1500, 250]


def test_long_value_lists_are_split_at_100_per_document() -> None:
    buffer = MetricBuffer()
    for i in range(250):
        buffer.record(event(Kind.SUCCEEDED, duration_s=i / 1000, attempt=1))
    for i in range(130):
        buffer.gauge(in_flight=i % 5, free_slots=10 - i % 5)
    documents = [
        check_emf(json.dumps(d)) for d in emf_documents(buffer.drain(), namespace="N", queue="q", timestamp_ms=1)
    ]
    durations = [v for d in documents for v in d.get("JobDuration", [])]
    assert len(durations) == 250
    assert sorted(durations) == sorted(round(i / 1000 * 1000, 3) for i in range(250))
    assert sum(d.get("JobsSucceeded", 0) for d in documents) == 250  # counters once, not per chunk
    assert len([v for d in documents for v in d.get("InFlight", [])]) == 130


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_emf_observer_flushes_by_interval_by_size_and_at_close() -> None:
    clock = FakeClock()
    stream = io.StringIO()
    observer = EmfObserver(namespace="SqsWorker", queue="jobs", stream=stream, flush_interval_s=60, monotonic=clock)
    observer.emit(event(Kind.SUCCEEDED, duration_s=0.01, attempt=1))
    observer.gauge(in_flight=1, free_slots=1)
    assert stream.getvalue() == ""  # buffered, not a line per job
    clock.now += 61
    observer.gauge(in_flight=0, free_slots=2)
    first = stream.getvalue().splitlines()
    assert first
    for line in first:
        check_emf(line)
    # Size threshold: 100 durations flush at once, before the interval.
    for _ in range(MAX_VALUES_PER_METRIC):
        observer.emit(event(Kind.SUCCEEDED, duration_s=0.01, attempt=1))
    after_size = stream.getvalue().splitlines()
    assert len(after_size) > len(first)
    observer.emit(event(Kind.RETRY_SCHEDULED, duration_s=0.5, attempt=1))
    observer.close()
    lines = stream.getvalue().splitlines()
    total_retried = sum(check_emf(line).get("JobsRetried", 0) for line in lines)
    assert total_retried == 1
    assert sum(check_emf(line).get("JobsSucceeded", 0) for line in lines) == 101
    observer.close()  # twice is harmless
    assert stream.getvalue().splitlines() == lines


def test_build_metrics_observer_follows_settings() -> None:
    assert build_metrics_observer(WorkerSettings(queue="q", metrics="off"), "q") is None
    emf = build_metrics_observer(WorkerSettings(queue="q", metrics_namespace="Custom"), "q", stream=io.StringIO())
    assert isinstance(emf, EmfObserver)
    assert emf.namespace == "Custom"


def test_metric_data_limits() -> None:
    buffer = MetricBuffer()
    for i in range(400):
        buffer.record(event(Kind.SUCCEEDED, duration_s=i / 100, attempt=1 + i % 3))
    data = metric_data(buffer.drain(), queue="jobs", timestamp=datetime.now(UTC).timestamp())
    for datum in data:
        assert len(datum.get("Values", [])) <= 150
        assert len(datum.get("Values", [])) == len(datum.get("Counts", []))
    durations = [d for d in data if d["MetricName"] == "JobDuration" and len(d["Dimensions"]) == 1]
    assert sum(sum(d["Counts"]) for d in durations) == 400


def test_cloudwatch_observer_puts_metrics_that_can_be_read_back(backend: Backend) -> None:
    client = boto3.client("cloudwatch", endpoint_url=backend.endpoint_url, region_name="us-east-1")
    namespace = f"SqsWorkerTest{uuid.uuid4().hex[:8]}"
    observer = CloudWatchObserver(namespace=namespace, queue="jobs", client=client, flush_interval_s=3600)
    try:
        for item in some_events():
            observer.emit(item)
        observer.gauge(in_flight=3, free_slots=7)
    finally:
        observer.close()
    metrics = client.list_metrics(Namespace=namespace)["Metrics"]
    names = {(m["MetricName"], tuple(sorted(d["Name"] for d in m["Dimensions"]))) for m in metrics}
    assert ("JobsDeadLettered", ("Category", "Queue")) in names
    assert ("JobsSucceeded", ("JobType", "Queue")) in names
    assert ("InFlight", ("Queue",)) in names
    now = datetime.now(UTC)
    # The full dimension set of one datum (moto also matches supersets of a partial set; CloudWatch does not).
    for category in ("exhausted", "invalid_message"):
        stats = client.get_metric_statistics(
            Namespace=namespace,
            MetricName="JobsDeadLettered",
            Dimensions=[{"Name": "Queue", "Value": "jobs"}, {"Name": "Category", "Value": category}],
            StartTime=now - timedelta(minutes=10),
            EndTime=now + timedelta(minutes=1),
            Period=60,
            Statistics=["Sum"],
        )
        assert sum(p["Sum"] for p in stats["Datapoints"]) == 1


def test_cloudwatch_observer_survives_a_failing_endpoint() -> None:
    class Broken:
        calls = 0

        def put_metric_data(self, **kwargs: Any) -> Any:
            Broken.calls += 1
            raise ConnectionError("no route")

    observer = CloudWatchObserver(namespace="N", queue="q", client=Broken(), flush_interval_s=3600)
    observer.emit(event(Kind.SUCCEEDED, attempt=1))
    observer.close()
    assert Broken.calls == 1


@pytest.mark.parametrize("kind", list(Kind))
def test_every_event_kind_is_accepted(kind: Kind) -> None:
    stream = io.StringIO()
    observer = EmfObserver(namespace="N", queue="q", stream=stream)
    observer.emit(event(kind, attempt=1, duration_s=0.1, queue_wait_s=0.1, category="bug"))
    observer.close()
    for line in stream.getvalue().splitlines():
        check_emf(line)
