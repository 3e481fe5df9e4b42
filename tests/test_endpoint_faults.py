"""Endpoint faults must not stall the worker: 1,000 no-op jobs drained through a fault-injecting proxy in front of
LocalStack (moto's cost grows with queue depth) take at most 3x the fault-free drain, and nothing is lost.

Both drains run the worker as ``sqs-worker run`` assembles it (``open_worker``: settings, client config), with the
same settings, through the same proxy; only the proxy's fault rates differ.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import BACKENDS
from tests.support.backends import Backend
from tests.support.faultproxy import ISSUE_MIX, NO_FAULTS, FaultProxy, FaultRates
from tests.support.harness import sqs_client
from worker.app import open_worker
from worker.bootstrap import ensure_queues
from worker.jobs import Registry
from worker.producer import Job, enqueue_many
from worker.settings import WorkerSettings

JOBS = 1_000
#: The settings of both drains: the defaults a user runs, except the claim length (see test docstring).
SETTINGS: dict[str, Any] = {"visibility_timeout_s": 30}
DRAIN_TIMEOUT_S = 120.0
MAX_SLOWDOWN = 3.0
COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed")


@dataclass
class Drain:
    seconds: float
    runs: int
    unique: int
    queue_left: int
    dlq_left: int
    fates: dict[str, int]
    marks: list[float]
    actions: dict[str, int]


def _left(client: Any, url: str) -> int:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=list(COUNTS))["Attributes"]
    return sum(int(attributes[name]) for name in COUNTS)


async def drain_through_proxy(
    endpoint_url: str, *, rates: FaultRates, seed: int, jobs: int = JOBS, job_s: float = 0.0, **settings: Any
) -> Drain:
    """Enqueue ``jobs`` no-op jobs directly, then drain them with a worker whose SQS endpoint is the proxy."""
    client = sqs_client(endpoint_url)
    created = ensure_queues(client, f"faults-{uuid.uuid4().hex[:8]}")
    enqueue_many(client, created.queue_url, [Job("noop", {"n": n}) for n in range(jobs)])
    registry = Registry()
    ran: list[int] = []
    seen: set[int] = set()
    all_ran = asyncio.Event()
    marks: list[float] = []
    finish_times: list[float] = []
    t0 = [time.monotonic()]

    @registry.job("noop")
    async def noop(payload: dict[str, int]) -> None:
        if job_s:
            await asyncio.sleep(job_s)  # the job's work
        ran.append(payload["n"])
        if payload["n"] not in seen:
            finish_times.append(round(time.monotonic() - t0[0], 2))
        seen.add(payload["n"])
        if len(seen) % 100 == 0 and len(seen) != len(marks) * 100:
            marks.append(round(time.monotonic() - t0[0], 2))
        if len(seen) == jobs:
            all_ran.set()

    proxy = FaultProxy(endpoint_url, rates=rates, seed=seed)
    proxy.start()
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint_url
    stop = asyncio.Event()
    try:
        worker_settings = WorkerSettings(queue=created.queue_url, dead_letter_queue=created.dlq_url, **settings)
        async with open_worker(worker_settings, registry, stop=stop) as worker:
            started = time.monotonic()
            t0[0] = started
            task = asyncio.create_task(worker.run(stop))
            try:
                await asyncio.wait_for(all_ran.wait(), timeout=DRAIN_TIMEOUT_S)
            except TimeoutError:
                pass
            seconds = time.monotonic() - started
            stop.set()
            await asyncio.wait_for(task, timeout=60)
    finally:
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved
        proxy.stop()
    if os.environ.get("DEBUG_DLQ"):
        print("last finishes", finish_times[-25:])
        got = client.receive_message(QueueUrl=created.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"])
        for m in got.get("Messages", []):
            print("DLQ", m["Body"], m.get("Attributes", {}).get("ApproximateReceiveCount"), {k: v.get("StringValue") for k, v in m.get("MessageAttributes", {}).items()})
    return Drain(
        seconds=seconds,
        runs=len(ran),
        unique=len(seen),
        queue_left=_left(client, created.queue_url),
        dlq_left=_left(client, created.dlq_url),
        fates=dict(proxy.by_fate()),
        marks=marks,
        actions={f"{a}:{f}": c for (a, f), c in proxy.faults.items()},
    )


@pytest.mark.skipif("localstack" not in BACKENDS, reason="1,000 messages belong on LocalStack (moto slows with depth)")
@pytest.mark.timeout(400)
async def test_faults_slow_a_drain_at_most_three_times(request: pytest.FixtureRequest) -> None:
    backend: Backend = request.getfixturevalue("localstack_backend")
    clean = await drain_through_proxy(backend.endpoint_url, rates=NO_FAULTS, seed=9, **SETTINGS)
    faulty = await drain_through_proxy(backend.endpoint_url, rates=ISSUE_MIX, seed=9, **SETTINGS)
    print(f"\nfault-free: {clean}\nfaulty:     {faulty}\nslowdown:   {faulty.seconds / clean.seconds:.1f}x")
    for drain in (clean, faulty):
        assert drain.unique == JOBS, f"only {drain.unique} of {JOBS} jobs ran"
        assert drain.queue_left == 0 and drain.dlq_left == 0, drain
    assert faulty.seconds <= MAX_SLOWDOWN * clean.seconds, (faulty.seconds, clean.seconds)
