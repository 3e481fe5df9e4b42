"""Tracing (the ``otel`` extra): the producer's traceparent, a span per attempt continuing it, trace ids in logs."""

from __future__ import annotations

import functools
import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.process import ROOT, bootstrapped_queue, lines
from tests.support.queues import assert_queue_empty
from worker import JobContext, PermanentError
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.observability.logs import LogObserver
from worker.producer import Job, enqueue_many


@functools.cache
def exporter() -> InMemorySpanExporter:
    """The process's tracer provider (set once: OpenTelemetry refuses to replace it) with an in-memory exporter."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    return memory


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    memory = exporter()
    memory.clear()
    yield memory
    memory.clear()


def registry_of_three() -> Registry:
    registry = Registry()

    @registry.job("greet")
    async def greet(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.logger.info("greeting %s", payload["name"])

    @registry.job("count")
    def count(payload: dict[str, Any], ctx: JobContext) -> int:  # a plain def: runs in a thread
        ctx.logger.info("counting")
        return 3

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        raise PermanentError("the account is closed")

    return registry


def attribute(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(f"sqs_worker.{name}")


def attempt_spans(memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in memory.get_finished_spans() if span.name.startswith("run ")}


@pytest.mark.memory
async def test_the_worker_continues_the_producers_trace_in_a_span_per_attempt(
    backend: Backend, spans: InMemorySpanExporter, log_stream: io.StringIO
) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    async with running_worker(backend.endpoint_url, queues, registry_of_three()) as running:
        running.worker.observers.add(LogObserver())  # the worker's event lines, as `sqs-worker run` writes them
        with trace.get_tracer("shop").start_as_current_span("checkout") as checkout:
            enqueue_many(client, queues.queue_url, [Job("greet", {"name": "Ada"}), Job("count"), Job("refuse")])
        producer = checkout.get_span_context()
        await running.recorder.wait_for(lambda r: len(r.of(Kind.SUCCEEDED)) == 2 and len(r.of(Kind.DEAD_LETTERED)) == 1)
    by_name = attempt_spans(spans)
    assert sorted(by_name) == ["run count", "run greet", "run refuse"]
    for job_type, span in by_name.items():
        assert span.parent is not None and span.parent.span_id == producer.span_id, job_type
        assert span.context.trace_id == producer.trace_id
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes is not None
        assert span.attributes["sqs_worker.job_type"] == job_type.removeprefix("run ")
        assert span.attributes["sqs_worker.attempt"] == 1
        assert span.attributes["messaging.destination.name"] == queues.queue_url.rsplit("/", 1)[-1]
    assert by_name["run greet"].attributes["sqs_worker.outcome"] == "succeeded"  # type: ignore[index]
    assert by_name["run greet"].status.status_code is StatusCode.UNSET
    refused = by_name["run refuse"]
    assert refused.attributes["sqs_worker.outcome"] == "dead_lettered"  # type: ignore[index]
    assert refused.attributes["sqs_worker.category"] == "permanent"  # type: ignore[index]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description == "PermanentError: the account is closed"

    # The traceparent went with the message (the dead-lettered copy keeps it).
    (dead,) = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    traceparent = dead["MessageAttributes"]["traceparent"]["StringValue"]
    assert traceparent == f"00-{producer.trace_id:032x}-{producer.span_id:016x}-{int(producer.trace_flags):02x}"

    # Log lines written during an attempt carry its trace and span ids: the handler's own (async and in a
    # thread) and the worker's event lines.
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    for message, span_name in (
        ("greeting Ada", "run greet"),
        ("counting", "run count"),
        ("job succeeded", None),
        ("job dead-lettered", "run refuse"),
    ):
        matching = [r for r in records if r["message"] == message]
        assert matching, message
        for record in matching:
            span = by_name[span_name or f"run {record['job_type']}"]
            assert record["trace_id"] == f"{span.context.trace_id:032x}", message
            assert record["span_id"] == f"{span.context.span_id:016x}", message
    assert all("trace_id" not in r for r in records if r["message"].startswith("worker started"))
    assert_queue_empty(client, queues.queue_url)


@pytest.mark.memory
async def test_a_message_without_traceparent_starts_a_trace_and_a_retry_is_an_error(
    backend: Backend, spans: InMemorySpanExporter
) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()

    @registry.job("flaky", backoff_base_s=0, backoff_max_s=0)
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("upstream reset")

    send(backend.endpoint_url, queues.queue_url, {"type": "flaky"})  # plain boto3: no trace context
    async with running_worker(backend.endpoint_url, queues, registry) as running:
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
    attempts = sorted(
        (s for s in spans.get_finished_spans() if s.name == "run flaky"), key=lambda s: str(attribute(s, "attempt"))
    )
    assert [(attribute(s, "attempt"), attribute(s, "outcome")) for s in attempts] == [(1, "retried"), (2, "succeeded")]
    assert attempts[0].parent is None  # a trace of its own
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[0].status.description == "ConnectionError: upstream reset"
    assert attempts[1].status.status_code is StatusCode.UNSET


def test_without_the_extra_nothing_changes(backend: Backend, tmp_path: Path) -> None:
    """OpenTelemetry made unimportable (as when the extra is not installed): a burst runs its jobs, the producer
    sends no trace attribute, and no log line carries trace ids."""
    env, url = bootstrapped_queue(
        backend.endpoint_url, tmp_path, handlers="tests.support.burst_handlers", prefix="notrace"
    )
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # what `import opentelemetry` finds when the extra is not installed
        from worker.commands.__main__ import main
        from worker.observability import tracing
        from worker.producer import Job, _entry
        assert not tracing.enabled() and tracing.trace_attributes() == {}
        assert "MessageAttributes" not in _entry(Job("ok", {"n": 1}), fifo=False)
        assert main(["enqueue", "ok", "--payload", '{"n": 1}']) == 0
        sys.exit(main(["run", "--burst"]))
        """
    )
    result = cli_python(script, env=env)
    assert result.returncode == 0, result.stderr
    assert "burst done: 1 succeeded, 0 retried, 0 dead-lettered; queue empty" in result.stdout
    assert lines(tmp_path / "effects.txt") == ["ok 1"]
    assert "trace_id" not in result.stderr
    assert_queue_empty(sqs_client(backend.endpoint_url), url)


def cli_python(script: str, *, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def test_trace_fields_leave_lines_outside_a_span_alone() -> None:
    from worker.observability.tracing import TraceFields

    record = logging.LogRecord("worker", logging.INFO, __file__, 1, "idle", None, None)
    assert TraceFields().filter(record)
    assert not hasattr(record, "trace_id")


def test_a_long_delay_keeps_the_traceparent_beside_its_due_time(spans: InMemorySpanExporter) -> None:
    from worker.flow.delays import DUE_AT_ATTRIBUTE
    from worker.producer import message_entry

    with trace.get_tracer("test").start_as_current_span("produce"):
        entry = message_entry(Job("greet", {"name": "a"}, delay_s=3600), fifo=False)
    assert set(entry["MessageAttributes"]) >= {"traceparent", DUE_AT_ATTRIBUTE}
