"""Plain ``def`` handlers in the running worker: an overrunning one never starves the next, and at shutdown a
handler still running in its thread never has its message released (it would run twice)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, running_worker, send, sqs_client
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.runtime.worker import THREAD_FINISH_WAIT_S

BLOCKED_S = 20.0  # a blocked handler waits at most this for its event (bounds a failing test)


def counts(endpoint_url: str, queue_url: str) -> dict[str, int]:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs_client(endpoint_url).get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return {
        "visible": int(attributes[names[0]]),
        "not_visible": int(attributes[names[1]]),
        "delayed": int(attributes[names[2]]),
    }


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # no handler thread outlives its test for long


@pytest.mark.memory
async def test_an_overrunning_sync_job_does_not_starve_the_next(backend: Backend, release: threading.Event) -> None:
    """Concurrency 1: a quick job after one that overran its timeout runs at once and succeeds."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    quick_runs: list[int] = []

    @registry.job("overrun", max_attempts=1, timeout_s=0.5)
    def overrun(payload: dict[str, Any]) -> None:
        release.wait(BLOCKED_S)  # blocked far past its timeout

    @registry.job("quick", max_attempts=1, timeout_s=3)
    def quick(payload: dict[str, Any]) -> None:
        quick_runs.append(payload["n"])

    def finished(kind: Kind, job_type: str) -> list[Any]:
        return [e for e in running.recorder.events if e.kind is kind and e.job_type == job_type]

    async with running_worker(backend.endpoint_url, queues, registry, concurrency=1) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "overrun", "payload": {}})
        await running.recorder.wait_for(lambda _: bool(finished(Kind.DEAD_LETTERED, "overrun")), timeout_s=20)
        send(backend.endpoint_url, queues.queue_url, {"type": "quick", "payload": {"n": 1}})
        await running.recorder.wait_for(
            lambda _: bool(finished(Kind.SUCCEEDED, "quick") or finished(Kind.DEAD_LETTERED, "quick")), timeout_s=20
        )
        assert finished(Kind.DEAD_LETTERED, "quick") == []
        assert quick_runs == [1]
        # The overrun is reported: the stuck-threads gauge, until its thread comes back.
        await running.recorder.wait_for(lambda r: 1 in r.stuck_threads, timeout_s=5)
        release.set()
        await running.recorder.wait_for(lambda r: r.stuck_threads[-1] == 0, timeout_s=5)
    dead = finished(Kind.DEAD_LETTERED, "overrun")
    assert dead[0].error.startswith("TimeoutError: the handler ran longer than timeout_s=0.5")
    assert counts(backend.endpoint_url, queues.queue_url) == {"visible": 0, "not_visible": 0, "delayed": 0}


class _OnLog(logging.Handler):
    """Calls ``action`` when the worker logs a line containing ``text``."""

    def __init__(self, text: str, action: Any) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.action = action

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.action()


@pytest.mark.memory
async def test_shutdown_acknowledges_a_sync_job_that_finishes_after_the_grace(
    backend: Backend, release: threading.Event
) -> None:
    """Past the grace the job is cancelled, but its thread finishes within the wait: acknowledged, not released."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    started = threading.Event()
    effects: list[str] = []

    @registry.job("late", max_attempts=1, timeout_s=60)
    def late(payload: dict[str, Any]) -> None:
        started.set()
        release.wait(BLOCKED_S)
        effects.append("done")

    # The handler finishes the moment the worker says it waits for the threads it could not cancel.
    hook = _OnLog("still run in threads", release.set)
    logging.getLogger("worker").addHandler(hook)
    try:
        async with running_worker(
            backend.endpoint_url, queues, registry, concurrency=1, shutdown_grace_s=0.2
        ) as running:
            send(backend.endpoint_url, queues.queue_url, {"type": "late", "payload": {}})
            assert await asyncio.to_thread(started.wait, BLOCKED_S)
            running.stop.set()
    finally:
        logging.getLogger("worker").removeHandler(hook)
    assert effects == ["done"]
    assert running.recorder.of(Kind.RELEASED) == []
    assert len(running.recorder.of(Kind.SUCCEEDED)) == 1
    assert counts(backend.endpoint_url, queues.queue_url) == {"visible": 0, "not_visible": 0, "delayed": 0}


@pytest.mark.memory
async def test_shutdown_never_releases_a_sync_job_whose_thread_still_runs(
    backend: Backend, release: threading.Event
) -> None:
    """Its message stays invisible (it reappears after its visibility timeout) and the stop does not wait for it."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    started = threading.Event()
    effects: list[str] = []

    @registry.job("endless", max_attempts=3, timeout_s=60)
    def endless(payload: dict[str, Any]) -> None:
        started.set()
        release.wait(BLOCKED_S)
        effects.append("done")

    grace_s = 0.2
    async with running_worker(
        backend.endpoint_url, queues, registry, concurrency=1, shutdown_grace_s=grace_s
    ) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "endless", "payload": {}})
        assert await asyncio.to_thread(started.wait, BLOCKED_S)
        stopping = time.monotonic()
        running.stop.set()
        await asyncio.wait_for(asyncio.shield(running.task), timeout=grace_s + THREAD_FINISH_WAIT_S + 5)
    stop_s = time.monotonic() - stopping
    assert stop_s < grace_s + THREAD_FINISH_WAIT_S + 3
    assert running.recorder.of(Kind.RELEASED) == []
    assert counts(backend.endpoint_url, queues.queue_url) == {"visible": 0, "not_visible": 1, "delayed": 0}
    assert effects == []
