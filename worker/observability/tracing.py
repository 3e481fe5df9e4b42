"""OpenTelemetry tracing, on when the ``otel`` extra is installed (``pip install 'sqs-worker[otel]'``).

- Producer side: :func:`trace_attributes` gives the W3C ``traceparent`` (and ``tracestate``) of the current
  span as SQS message attributes; ``worker.producer`` puts them on each job it sends.
- Worker side: :func:`attempt_span` runs each attempt in a CONSUMER span continuing the producer's trace (a new
  trace when the message carries none), current while middleware and handler run (in a plain ``def`` handler's
  thread too); it records job type, attempt, queue and outcome, with status ERROR when the attempt failed.
- Logs: :class:`TraceFields` adds ``trace_id`` and ``span_id`` to every log line written while a span is current.

Spans go to the global tracer provider: configure the SDK (a ``TracerProvider`` with an exporter) in your
process, for example in a lifespan. Without the extra, nothing here imports OpenTelemetry and all of it is a
no-op.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from worker.observability.events import Event, Kind

#: The W3C Trace Context fields, carried as String message attributes of the same names.
TRACE_FIELDS = ("traceparent", "tracestate")
TRACER_NAME = "sqs-worker"

#: The span's ``sqs_worker.outcome`` by the attempt's last event.
OUTCOMES = {
    Kind.SUCCEEDED: "succeeded",
    Kind.RETRY_SCHEDULED: "retried",
    Kind.DEAD_LETTERED: "dead_lettered",
    Kind.RELEASED: "released",
    Kind.CLAIM_LOST: "claim_lost",
}
FAILED = frozenset({Kind.RETRY_SCHEDULED, Kind.DEAD_LETTERED})


@dataclass(frozen=True)
class _Otel:
    trace: Any
    context: Any
    propagator: Any
    status: Any
    status_code: Any
    consumer: Any
    #: Tracer providers that record nothing: the API's own until the process sets one (``set_tracer_provider``).
    silent: tuple[type, ...]


@functools.cache
def _otel() -> _Otel | None:
    """The OpenTelemetry API, or None when the ``otel`` extra is not installed (imported once, on first use)."""
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return _Otel(
        trace,
        context,
        TraceContextTextMapPropagator(),
        Status,
        StatusCode,
        SpanKind.CONSUMER,
        (ProxyTracerProvider, NoOpTracerProvider),
    )


def _recording() -> _Otel | None:
    """The OpenTelemetry API while a tracer provider that records is set; None without the extra or before the
    process sets one (the API's own provider records nothing)."""
    otel = _otel()
    if otel is None or isinstance(otel.trace.get_tracer_provider(), otel.silent):
        return None
    return otel


@functools.cache
def _tracer(otel: _Otel) -> Any:
    """The worker's tracer: a proxy until the process sets its tracer provider, then that provider's."""
    return otel.trace.get_tracer(TRACER_NAME)


def enabled() -> bool:
    """Whether tracing is available (the ``otel`` extra is installed)."""
    return _otel() is not None


def trace_attributes() -> dict[str, dict[str, str]]:
    """The current span's W3C trace context as SQS message attributes; empty when no span is current."""
    otel = _otel()
    if otel is None or not otel.trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    otel.propagator.inject(carrier)
    return {name: {"DataType": "String", "StringValue": carrier[name]} for name in TRACE_FIELDS if carrier.get(name)}


def _carrier(message_attributes: dict[str, Any]) -> dict[str, str]:
    carrier: dict[str, str] = {}
    for name in TRACE_FIELDS:
        value = message_attributes.get(name)
        if isinstance(value, dict) and isinstance(value.get("StringValue"), str):
            carrier[name] = value["StringValue"]
    return carrier


class _Received(Protocol):
    @property
    def message_id(self) -> str: ...
    @property
    def message_attributes(self) -> dict[str, Any]: ...


class Attempt(Protocol):
    """What a span reads of one attempt (``worker.runtime.held.Held``): its message, its number, and once it ended,
    the event that says how."""

    @property
    def message(self) -> _Received: ...
    @property
    def attempt(self) -> int: ...
    @property
    def last_event(self) -> Event | None: ...


@contextlib.contextmanager
def attempt_span(held: Attempt, *, job_type: str, queue: str) -> Iterator[None]:
    """One attempt of ``held`` in a span, current inside the block; ended with the attempt's outcome, read from
    ``held.last_event`` when the block exits. No span while no tracer provider is set: it would record nothing,
    and making it costs about a tenth of a no-op job's CPU."""
    otel = _recording()
    if otel is None:
        yield
        return
    message = held.message
    parent = otel.propagator.extract(_carrier(message.message_attributes))
    span = _tracer(otel).start_span(
        f"run {job_type}",
        context=parent,
        kind=otel.consumer,
        attributes={
            "messaging.system": "aws_sqs",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": message.message_id,
            "sqs_worker.job_type": job_type,
            "sqs_worker.attempt": held.attempt,
        },
    )
    token = otel.context.attach(otel.trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel.context.detach(token)
        event = held.last_event
        kind = event.kind if event is not None else None
        span.set_attribute("sqs_worker.outcome", OUTCOMES.get(kind, "unfinished") if kind is not None else "unfinished")
        if event is not None and kind in FAILED:
            if event.category:
                span.set_attribute("sqs_worker.category", event.category)
            span.set_status(otel.status(otel.status_code.ERROR, event.error or kind.value))
        span.end()


class TraceFields(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex) to each record written while a recording span is current."""

    def filter(self, record: logging.LogRecord) -> bool:
        otel = _recording()
        if otel is not None:
            context = otel.trace.get_current_span().get_span_context()
            if context.is_valid:
                record.trace_id = format(context.trace_id, "032x")
                record.span_id = format(context.span_id, "016x")
        return True


def add_log_fields(handler: logging.Handler) -> None:
    """Give ``handler``'s lines the current trace and span ids, when tracing is available."""
    if enabled() and not any(isinstance(f, TraceFields) for f in handler.filters):
        handler.addFilter(TraceFields())
