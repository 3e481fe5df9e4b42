"""Turning a message into a handler call: envelope, job lookup, payload validation, the call with its timeout."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import random
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from worker.context import JobContext, ProgressSink
from worker.envelope import INVALID_PAYLOAD, UNKNOWN_TYPE, Envelope, describe_errors, parse_envelope
from worker.errors import FailsTheJob, HandlerExit, InvalidMessage, JobTimeout
from worker.jobs import JobSpec, Registry
from worker.lifecycle import Resources
from worker.policy import Decision, classify_failure, describe_error
from worker.runtime.threads import JobThreads


@dataclass(frozen=True)
class PreparedJob:
    """A message that parsed into a known job type with a valid payload."""

    envelope: Envelope
    spec: JobSpec
    payload: Any  # the payload model instance, or the dict


def prepare(body: str, registry: Registry) -> PreparedJob:
    """Parse and validate a message body; raises InvalidMessage with its dead-letter category."""
    envelope = parse_envelope(body)
    spec = registry.get(envelope.type)
    if spec is None:
        raise InvalidMessage(UNKNOWN_TYPE, f"no handler is registered for job type {envelope.type!r}")
    payload: Any = envelope.payload
    if spec.payload_model is not None:
        try:
            payload = spec.payload_model.model_validate(envelope.payload)
        except ValidationError as exc:
            error = f"payload for {spec.name!r} " + describe_errors(exc)
            raise InvalidMessage(INVALID_PAYLOAD, error, job_type=spec.name) from None
    return PreparedJob(envelope=envelope, spec=spec, payload=payload)


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """A handler's logger: its job fields merged with the ``extra=`` of each call (the caller's win)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def job_logger(spec: JobSpec, message_id: str, attempt: int) -> logging.LoggerAdapter[logging.Logger]:
    return JobLogger(
        logging.getLogger("worker.job"), {"job_type": spec.name, "message_id": message_id, "attempt": attempt}
    )


def build_context(
    job: PreparedJob,
    *,
    message_id: str,
    attempt: int,
    progress: ProgressSink | None = None,
    receive_count: int | None = None,
    resources: Resources | None = None,
) -> JobContext:
    context = JobContext(
        job_type=job.spec.name,
        message_id=message_id,
        attempt=attempt,
        max_attempts=job.spec.max_attempts,
        idempotency_key=job.envelope.idempotency_key,
        deadline_monotonic=time.monotonic() + job.spec.timeout_s,
        logger=job_logger(job.spec, message_id, attempt),
        receive_count=receive_count if receive_count is not None else attempt,
    )
    if job.envelope.workflow is not None:
        context.workflow_id = job.envelope.workflow.id
        context.previous_result = job.envelope.workflow.input
    if progress is not None:
        context._progress = progress
    if resources is not None:
        context.resources = resources
    return context


async def call_handler(job: PreparedJob, context: JobContext, threads: JobThreads, *, owner: object = None) -> Any:
    """Call the handler with its payload (and context), bounded by the job's timeout (JobTimeout when it runs out).

    Its timeout (and ``ctx.time_left_s()``) counts from the handler's start, after the middleware before it; a
    plain ``def`` handler's from the moment its thread starts it. On timeout its thread cannot be stopped: it
    runs on as a stuck thread while the job is treated as timed out. ``owner`` names the call for
    ``threads.is_running(owner)``. A handler that raises a BaseException that is no Exception (SystemExit,
    ``pytest.fail``'s) fails its job (HandlerExit): it cannot stop the worker nor skip the retry rules. Only
    ``asyncio.CancelledError`` passes as it is (the worker's own cancellation, or the handler's, told apart by
    the caller).
    """
    with FailsTheJob("handler"):
        return await _call_handler(job, context, threads, owner=owner)


async def _call_handler(job: PreparedJob, context: JobContext, threads: JobThreads, *, owner: object) -> Any:
    args: tuple[Any, ...] = (job.payload, context) if job.spec.wants_context else (job.payload,)
    timeout_s = job.spec.timeout_s
    if job.spec.is_async:
        context.deadline_monotonic = time.monotonic() + timeout_s
        scope = asyncio.timeout(timeout_s)  # in this task: wait_for would start another one per job
        try:
            async with scope:
                return await job.spec.handler(*args)
        except TimeoutError:
            if scope.expired():
                raise JobTimeout(timeout_s) from None
            raise  # the handler's own (a downstream call timed out)
    handler = job.spec.handler

    def call() -> Any:
        context.deadline_monotonic = time.monotonic() + timeout_s
        return handler(*args)

    return await threads.run(
        functools.partial(contextvars.copy_context().run, call),
        timeout_s=timeout_s,
        owner=owner,
        log_fields={**context.extra(), "timeout_s": timeout_s},
    )


def judge_failure(
    job: PreparedJob, error: BaseException, *, attempt: int, max_attempts: int, rng: random.Random
) -> tuple[Decision, str]:
    """What a failed attempt means (``classify_failure`` with the job's options) and the error's text as events,
    the ledger and dead-letter records carry it. Shared by every backend's runtime."""
    spec = job.spec
    decision = classify_failure(
        error,
        attempt=attempt,
        max_attempts=max_attempts,
        permanent=spec.permanent,
        bugs=spec.bugs,
        backoff_base_s=spec.backoff_base_s,
        backoff_max_s=spec.backoff_max_s,
        rng=rng,
    )
    if isinstance(error, JobTimeout):
        text = f"TimeoutError: {error}"
    elif isinstance(error, HandlerExit):
        text = f"{describe_error(error.error)} (raised by the {error.source}; the worker does not exit)"
    elif isinstance(error, asyncio.CancelledError):
        text = describe_error(error) + " (raised by the handler itself)"
    else:
        text = describe_error(error)
    return decision, text


def result_for_ledger(result: Any) -> Any:
    """A handler's return value in a JSON-friendly form (pydantic models dumped)."""
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return result
