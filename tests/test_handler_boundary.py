"""What a handler can do to its job but not to the worker: SystemExit, KeyboardInterrupt, GeneratorExit and any
other BaseException (pytest.fail's, a library's own) fail the job (retried like any exception, then dead-lettered
with the reason); the worker's timeout and a handler's own TimeoutError are told apart; a handler's time left
counts from its start, after the middleware."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from worker import CallNext, JobContext, Registry, RetryableError
from worker.policy import describe_error
from worker.testing import InMemoryWorker


class Halt(BaseException):
    """A library's own BaseException (as gevent's GreenletExit is)."""


@pytest.mark.parametrize(
    "error",
    [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), Halt("stop here"), pytest.fail.Exception("fake said no")],
    ids=lambda error: type(error).__name__,
)
@pytest.mark.parametrize("kind", ["async", "def"])
def test_a_handler_exiting_fails_its_job_not_the_worker(error: BaseException, kind: str) -> None:
    registry = Registry()

    if kind == "async":

        @registry.job("exits", max_attempts=2, backoff_base_s=1)
        async def exits(payload: dict[str, Any]) -> None:
            raise error

    else:

        @registry.job("exits", max_attempts=2, backoff_base_s=1)
        def exits_in_thread(payload: dict[str, Any]) -> None:
            raise error

    assert_fails_alone(registry, "exits", f"{describe_error(error)} (raised by the handler; the worker does not exit)")


def assert_fails_alone(registry: Registry, failing: str, error_message: str) -> None:
    """Run job ``failing`` beside three fine ones in the kit: the fine ones run, ``failing`` is retried once and
    dead-lettered as exhausted with ``error_message``, and the queue ends empty."""
    done: list[int] = []

    @registry.job("fine")
    async def fine(payload: dict[str, Any]) -> None:
        done.append(payload["n"])

    kit = InMemoryWorker(registry)
    kit.enqueue(failing, {})
    for n in range(3):
        kit.enqueue("fine", {"n": n})
    result = kit.run_until_idle()
    assert sorted(done) == [0, 1, 2]
    [dead] = result.dead_letters
    assert (dead.category, dead.attempts, result.retried) == ("exhausted", 2, 1)
    assert dead.error_message == error_message
    assert kit.counts().total == 0


@pytest.mark.parametrize("delay_s", [math.nan, math.inf, -1.0])
def test_a_retry_delay_must_be_a_finite_number_of_seconds(delay_s: float) -> None:
    with pytest.raises(ValueError, match="delay_s must be a finite number >= 0"):
        RetryableError("again", delay_s=delay_s)


def test_a_downstream_timeout_keeps_its_own_text_and_the_workers_names_timeout_s() -> None:
    registry = Registry()

    @registry.job("downstream", max_attempts=1)
    async def downstream(payload: dict[str, Any]) -> None:
        await asyncio.wait_for(asyncio.Event().wait(), 0.01)  # a call with a timeout of its own

    @registry.job("slow", max_attempts=1, timeout_s=0.05)
    async def slow(payload: dict[str, Any]) -> None:
        await asyncio.Event().wait()

    @registry.job("slow_def", max_attempts=1, timeout_s=0.05)
    def slow_def(payload: dict[str, Any]) -> None:
        time.sleep(0.3)

    kit = InMemoryWorker(registry)
    for name in ("downstream", "slow", "slow_def"):
        kit.enqueue(name, {})
    result = kit.run_until_idle()
    errors = {dead.job_type: dead.error_message for dead in result.dead_letters}
    assert errors == {
        "downstream": "TimeoutError",
        "slow": "TimeoutError: the handler ran longer than timeout_s=0.05",
        "slow_def": "TimeoutError: the handler ran longer than timeout_s=0.05",
    }


@pytest.mark.parametrize("kind", ["async", "def"])
def test_time_left_counts_from_the_handlers_start_after_the_middleware(kind: str) -> None:
    registry = Registry()
    left: list[float] = []

    @registry.middleware
    async def slow_middleware(ctx: JobContext, call_next: CallNext) -> Any:
        await asyncio.sleep(0.5)  # longer than the handler's whole timeout
        return await call_next()

    if kind == "async":

        @registry.job("timed", timeout_s=0.4)
        async def timed(payload: dict[str, Any], ctx: JobContext) -> None:
            left.append(ctx.time_left_s())

    else:

        @registry.job("timed", timeout_s=0.4)
        def timed_def(payload: dict[str, Any], ctx: JobContext) -> None:
            left.append(ctx.time_left_s())

    kit = InMemoryWorker(registry)
    kit.enqueue("timed", {})
    result = kit.run_until_idle()
    assert result.succeeded == 1
    [seconds] = left
    assert 0.2 < seconds <= 0.4


@pytest.mark.parametrize(
    "error", [SystemExit(4), KeyboardInterrupt(), GeneratorExit(), Halt("stop here")], ids=lambda e: type(e).__name__
)
def test_a_middleware_exiting_fails_its_job_not_the_worker(error: BaseException) -> None:
    """As a handler's: a middleware's SystemExit stopped the worker (and cut the other jobs' grace); a custom
    BaseException left the job without an outcome (back after its visibility timeout, an attempt lost)."""
    registry = Registry()

    @registry.middleware
    async def guard(ctx: JobContext, call_next: CallNext) -> Any:
        if ctx.job_type == "guarded":
            raise error
        return await call_next()

    @registry.job("guarded", max_attempts=2, backoff_base_s=1)
    async def guarded(payload: dict[str, Any]) -> None:
        raise AssertionError("the middleware stops it first")

    message = f"{describe_error(error)} (raised by the middleware; the worker does not exit)"
    assert_fails_alone(registry, "guarded", message)


def test_a_middleware_returning_call_next_unawaited_is_a_bug_not_a_success() -> None:
    """`return call_next()` without `await` made the job succeed (and be deleted) without its handler running."""
    registry = Registry()
    ran: list[str] = []

    @registry.middleware
    async def forgetful(ctx: JobContext, call_next: CallNext) -> Any:
        return call_next()  # the slip: no await

    @registry.job("send")
    async def send(payload: dict[str, Any]) -> None:
        ran.append("send")

    kit = InMemoryWorker(registry)
    kit.enqueue("send", {})
    result = kit.run_until_idle()
    assert ran == [] and result.succeeded == 0
    [dead] = result.dead_letters
    assert dead.category == "bug"
    assert (dead.error_message or "").startswith("TypeError: the job's result is an awaitable nobody awaited")
