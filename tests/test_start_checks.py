"""What `run` checks about its queue at start, beside the settings: a redrive policy that would move retried jobs
to the DLQ before the worker dead-letters them is named in a warning (as `bootstrap` warns)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from worker.jobs import Registry
from worker.ops.bootstrap import ensure_queues
from worker.runtime.assemble import open_worker
from worker.settings import WorkerSettings


async def receive_count_warnings(queue_url: str, registry: Registry, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The maxReceiveCount warnings a worker for ``queue_url`` logs at start."""
    settings = WorkerSettings(queue=queue_url, metrics="off")
    with caplog.at_level(logging.WARNING, logger="worker"):
        async with open_worker(settings, registry, stop=asyncio.Event()):
            pass
    return [r.getMessage() for r in caplog.records if "moves a message to its DLQ" in r.getMessage()]


@pytest.mark.parametrize(("receives", "warned"), [(3, True), (7, False)])
async def test_a_redrive_policy_below_the_attempts_is_named_at_start(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, receives: int, warned: bool
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    created = ensure_queues(
        sqs_client(backend.endpoint_url), f"start-{uuid.uuid4().hex[:8]}", max_receive_count=receives
    )
    registry = Registry()

    @registry.job("flaky", max_attempts=5)
    async def flaky(payload: dict[str, Any]) -> None: ...

    lines = await receive_count_warnings(created.queue_url, registry, caplog)
    expected = f"after {receives} receives, not above the largest max_attempts (5)"
    assert (len(lines) == 1 and expected in lines[0]) if warned else lines == []


@pytest.mark.parametrize(("receives", "limited", "warned"), [(7, True, True), (100, True, False), (7, False, False)])
async def test_a_fifo_queue_too_low_for_held_jobs_is_named_at_start(
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    receives: int,
    limited: bool,
    warned: bool,
) -> None:
    """On a FIFO queue each hold of a rate-limited job is a receive: a count that covers the attempts is not enough."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    created = ensure_queues(
        sqs_client(backend.endpoint_url), f"start-{uuid.uuid4().hex[:8]}.fifo", max_receive_count=receives
    )
    registry = Registry()

    @registry.job("sync", max_attempts=5, rate_limit="10/s" if limited else None)
    async def sync(payload: dict[str, Any]) -> None: ...

    lines = await receive_count_warnings(created.queue_url, registry, caplog)
    expected = f"after {receives} receives, and each hold of a rate-limited or breaker job (sync) is a receive there"
    assert (len(lines) == 1 and expected in lines[0] and "at least 100" in lines[0]) if warned else lines == []
