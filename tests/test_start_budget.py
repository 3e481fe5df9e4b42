"""`run` waits out an unreachable SQS at start for WORKER_START_TIMEOUT_S, then gives up with one line
(issue 9, items 8 and 9): the start budget of worker.budgets, against a real backend behind a proxy."""

from __future__ import annotations

import asyncio
from urllib.parse import urlparse

import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues
from tests.support.proxy import Proxy
from worker.backends.aws import async_client, client_config
from worker.errors import QueueUnavailable
from worker.runtime.assemble import wait_for_endpoint
from worker.settings import WorkerSettings


def proxy_for(backend: Backend) -> Proxy:
    target = urlparse(backend.endpoint_url)
    assert target.hostname is not None and target.port is not None
    return Proxy(target.hostname, target.port)  # not started: connections are refused


async def test_start_waits_for_an_endpoint_that_comes_up(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    created = make_queues(backend.endpoint_url)
    proxy = proxy_for(backend)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    settings = WorkerSettings(queue=created.queue_url.rsplit("/", 1)[-1], start_timeout_s=30)
    async with async_client("sqs", config=client_config(settings)) as client:
        resolving = asyncio.ensure_future(wait_for_endpoint(client, settings, asyncio.Event()))
        await asyncio.sleep(1.0)  # the endpoint stays down for a while: that is the scenario
        assert not resolving.done(), "gave up within its 30 s budget"
        await proxy.start()
        try:
            queue_url, dlq_url = await asyncio.wait_for(resolving, timeout=15)
        finally:
            await proxy.stop()
    assert queue_url.endswith(created.queue_url.rsplit("/", 1)[-1])
    assert dlq_url.endswith(created.dlq_url.rsplit("/", 1)[-1])


async def test_start_gives_up_after_its_budget(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = proxy_for(backend)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    settings = WorkerSettings(queue="jobs", start_timeout_s=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with async_client("sqs", config=client_config(settings)) as client:
        with pytest.raises(QueueUnavailable, match=r"cannot reach SQS at .*gave up after 0\.5 s") as caught:
            await asyncio.wait_for(wait_for_endpoint(client, settings, asyncio.Event()), timeout=10)
    assert loop.time() - started < 5
    assert "\n" not in str(caught.value)
