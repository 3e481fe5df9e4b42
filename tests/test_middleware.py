"""Middleware around every job: order, the outcome it sees, short-circuits classified like a handler's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.queues import assert_queue_empty
from worker import CallNext, ConfigError, JobContext, PermanentError
from worker.jobs import Registry
from worker.middleware import call_through, check_middleware
from worker.observability.events import Kind


def traced_registry(steps: list[str]) -> Registry:
    registry = Registry()

    @registry.middleware
    async def outer(ctx: JobContext, call_next: CallNext) -> Any:
        steps.append(f"outer in {ctx.job_type}")
        try:
            result = await call_next()
        except Exception as exc:
            steps.append(f"outer saw {type(exc).__name__}")
            raise
        steps.append(f"outer saw {result!r}")
        return result

    @registry.middleware
    async def inner(ctx: JobContext, call_next: CallNext) -> Any:
        steps.append(f"inner in attempt={ctx.attempt}")
        return await call_next()

    @registry.job("sync_ok")
    def sync_ok(payload: dict[str, Any]) -> int:
        steps.append("handler sync_ok")
        return 7

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        steps.append("handler refuse")
        raise PermanentError("no")

    return registry


@pytest.mark.memory
async def test_middleware_runs_in_order_around_sync_and_async_handlers_and_sees_the_outcome(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    steps: list[str] = []
    async with running_worker(backend.endpoint_url, queues, traced_registry(steps), concurrency=1) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "sync_ok"})
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
        send(backend.endpoint_url, queues.queue_url, {"type": "refuse"})
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
    assert steps == [
        "outer in sync_ok",
        "inner in attempt=1",
        "handler sync_ok",
        "outer saw 7",
        "outer in refuse",
        "inner in attempt=1",
        "handler refuse",
        "outer saw PermanentError",
    ]
    assert running.recorder.of(Kind.DEAD_LETTERED)[0].category == "permanent"
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


@pytest.mark.memory
async def test_middleware_short_circuits_with_a_result_or_a_classified_error(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    ran: list[str] = []
    registry = Registry()

    @registry.middleware
    async def gate(ctx: JobContext, call_next: CallNext) -> Any:
        if ctx.job_type == "cached":
            return {"from": "cache"}  # the handler never runs; the job succeeds
        if ctx.job_type == "blocked":
            raise PermanentError("tenant suspended")
        if ctx.job_type == "broken":
            raise AttributeError("middleware bug")
        return await call_next()

    for name in ("cached", "blocked", "broken"):

        @registry.job(name)
        async def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            ran.append(ctx.job_type)

    async with running_worker(backend.endpoint_url, queues, registry) as running:
        for name in ("cached", "blocked", "broken"):
            send(backend.endpoint_url, queues.queue_url, {"type": name})
        await running.recorder.wait_for(lambda r: len(r.of(Kind.SUCCEEDED)) == 1 and len(r.of(Kind.DEAD_LETTERED)) == 2)
    assert ran == []
    dead = drain(backend.endpoint_url, queues.dlq_url, expect=2)
    attributes = [m["MessageAttributes"] for m in dead]
    reasons = sorted((a["error_category"]["StringValue"], a["error_message"]["StringValue"]) for a in attributes)
    assert reasons == [("bug", "AttributeError: middleware bug"), ("permanent", "PermanentError: tenant suspended")]
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


async def test_call_through_without_middleware_calls_the_handler() -> None:
    async def handler() -> str:
        return "done"

    assert await call_through([], None, handler) == "done"  # type: ignore[arg-type]


def test_registration_refuses_what_is_not_a_middleware() -> None:
    def sync(ctx: JobContext, call_next: CallNext) -> Any:
        return None

    async def one_argument(ctx: JobContext) -> Any:
        return None

    class Timing:
        async def __call__(self, ctx: JobContext, call_next: CallNext) -> Any:
            return await call_next()

    with pytest.raises(ConfigError, match="must be an `async def` taking"):
        check_middleware(sync)
    with pytest.raises(ConfigError, match="must take two arguments"):
        check_middleware(one_argument)
    timing = Timing()
    assert check_middleware(timing) is timing  # an object with an async __call__ (a class holding settings)
