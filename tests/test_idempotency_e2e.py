"""Idempotency end to end: real ``sqs-worker run`` processes, a real queue and table over HTTP.

The handlers (tests/support/idempotent_handlers.py) append a line per run to an effects file; the ledger item
tells how the job ended. Waits poll another process's effects (there is no event to await across processes),
always bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest_asyncio

from tests.support.backends import Backend
from tests.support.harness import make_queues, send, sqs_client
from tests.support.idempotency import dynamodb_client
from tests.support.process import lines, start, worker_env
from tests.support.proxy import Proxy
from tests.support.queues import message_count
from worker.idempotency import Ledger, Record, State, Status, canonical_json, create_table
from worker.ops.bootstrap import Created

HANDLERS = "tests.support.idempotent_handlers"
VISIBILITY_TIMEOUT_S = 5


@contextlib.contextmanager
def workers(count: int, env: dict[str, str], tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker processes; stopped with SIGTERM (then SIGKILL) on the way out, whatever happened."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(count):
            processes.append(start("run", env=env, stderr_path=tmp_path / f"worker-{index}.log"))
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


async def until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll another process's effect without blocking the event loop (a proxy may be serving on it)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.1)


def queue_is_empty(endpoint_url: str, queue_url: str) -> bool:
    return message_count(sqs_client(endpoint_url), queue_url) == 0


class Setup:
    """A queue, a table and the environment of the workers, for one test."""

    def __init__(self, backend: Backend, tmp_path: Path, queues: Created, table: str) -> None:
        self.backend = backend
        self.tmp_path = tmp_path
        self.queues = queues
        self.table = table
        self.effects = tmp_path / "effects.txt"

    def env(self, **overrides: str) -> dict[str, str]:
        return worker_env(
            self.backend.endpoint_url,
            TMP=str(self.tmp_path),
            WORKER_QUEUE=self.queues.queue_url,
            WORKER_HANDLERS=HANDLERS,
            WORKER_IDEMPOTENCY_TABLE=self.table,
            WORKER_VISIBILITY_TIMEOUT_S=str(VISIBILITY_TIMEOUT_S),
            WORKER_CONCURRENCY="4",
            WORKER_SHUTDOWN_GRACE_S="5",
            WORKER_LOG_FORMAT="json",
            TEST_EFFECTS_FILE=str(self.effects),
            **overrides,
        )

    def effect_lines(self, prefix: str) -> list[str]:
        return [line for line in lines(self.effects) if line.startswith(prefix + " ")]

    def drained(self) -> bool:
        return queue_is_empty(self.backend.endpoint_url, self.queues.queue_url)

    def log(self, index: int) -> str:
        path = self.tmp_path / f"worker-{index}.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    async def record(self, key: str) -> Record:
        async with dynamodb_client(self.backend.endpoint_url) as client:
            record = await Ledger(client, self.table, owner="test-reader").get(key)
        assert record is not None, f"no ledger item for {key!r}"
        return record


@pytest_asyncio.fixture(loop_scope="function")
async def setup(backend: Backend, tmp_path: Path) -> AsyncIterator[Setup]:
    queues = make_queues(backend.endpoint_url, max_receive_count=30)
    table = f"e2e-{uuid.uuid4().hex[:12]}"
    async with dynamodb_client(backend.endpoint_url) as client:
        await create_table(client, table)
    yield Setup(backend, tmp_path, queues, table)


def pid_of(line: str) -> int:
    match = re.search(r"pid=(\d+)", line)
    assert match is not None, line
    return int(match.group(1))


def envelope(job_type: str, payload: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": job_type, "payload": payload}
    if key is not None:
        body["idempotency_key"] = key
    return body


async def test_one_key_sent_twenty_times_to_three_workers_runs_once(setup: Setup) -> None:
    key = f"order-{uuid.uuid4().hex[:10]}"
    body = envelope("charge", {"order": key, "seconds": 2}, key)
    with workers(3, setup.env(), setup.tmp_path):
        for _ in range(20):
            send(setup.backend.endpoint_url, setup.queues.queue_url, body)
        await until(lambda: bool(setup.effect_lines("charge")), 60, "the first run")
        await until(setup.drained, 90, "every duplicate acknowledged")
    runs = setup.effect_lines("charge")
    assert len(runs) == 1, runs
    logs = "".join(setup.log(index) for index in range(3))
    assert logs.count("duplicate job skipped") >= 19  # (moto may hand one message to two receivers)
    assert "idempotency lease held elsewhere" in logs  # duplicates that arrived mid-run were put back, not run
    assert f"key={key}" in runs[0]
    record = await setup.record(key)
    assert (record.status, record.attempts, record.token) == (Status.COMPLETED, 1, 1)
    assert record.result == {"order": key, "pid": pid_of(runs[0])}
    assert (record.progress, record.progress_note) == (50.0, "charging")
    assert queue_is_empty(setup.backend.endpoint_url, setup.queues.dlq_url)


async def test_sigkill_mid_job_is_taken_over_after_the_lease_lapses(setup: Setup) -> None:
    order = uuid.uuid4().hex[:10]
    with workers(2, setup.env(), setup.tmp_path) as processes:
        send(
            setup.backend.endpoint_url, setup.queues.queue_url, envelope("slow_charge", {"order": order, "seconds": 4})
        )
        await until(lambda: bool(setup.effect_lines("started")), 60, "the job to start")
        victim = pid_of(setup.effect_lines("started")[0])
        killed = next(process for process in processes if process.pid == victim)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        await until(lambda: bool(setup.effect_lines("finished")), 60, "another worker to finish the job")
        await until(setup.drained, 30, "the message acknowledged")
    started = [pid_of(line) for line in setup.effect_lines("started")]
    finished = [pid_of(line) for line in setup.effect_lines("finished")]
    survivor = next(process.pid for process in processes if process.pid != victim)
    assert started == [victim, survivor]
    assert finished == [survivor]
    record = await setup.record(f"slow_charge:{order}")
    assert (record.status, record.attempts, record.token) == (Status.COMPLETED, 2, 2)
    assert record.owner is not None
    assert record.owner.split(":")[1] == str(survivor)
    assert record.result == {"order": order, "pid": survivor}


async def test_a_stalled_worker_cannot_overwrite_the_new_owners_result(setup: Setup) -> None:
    order = uuid.uuid4().hex[:10]
    key = f"slow_charge:{order}"
    with workers(2, setup.env(), setup.tmp_path) as processes:
        send(
            setup.backend.endpoint_url, setup.queues.queue_url, envelope("slow_charge", {"order": order, "seconds": 3})
        )
        await until(lambda: bool(setup.effect_lines("started")), 60, "the job to start")
        stalled = pid_of(setup.effect_lines("started")[0])
        os.kill(stalled, signal.SIGSTOP)  # a long GC pause, a frozen VM: the lease lapses under it
        await until(lambda: bool(setup.effect_lines("finished")), 60, "the other worker to finish the job")
        await until(setup.drained, 30, "the message acknowledged")
        new_owner = pid_of(setup.effect_lines("finished")[0])
        assert new_owner != stalled
        os.kill(stalled, signal.SIGCONT)
        index = next(i for i, process in enumerate(processes) if process.pid == stalled)
        await until(lambda: len(setup.effect_lines("finished")) == 2, 30, "the stalled handler to return")
        await until(lambda: "taken over" in setup.log(index), 30, "the stalled worker to see its lease lost")
    record = await setup.record(key)
    assert (record.status, record.token) == (Status.COMPLETED, 2)
    assert record.result == {"order": order, "pid": new_owner}
    assert record.owner is not None
    assert record.owner.split(":")[1] == str(new_owner)


async def test_table_outage_runs_nothing_then_every_job_once(setup: Setup) -> None:
    parsed = urlparse(setup.backend.endpoint_url)
    assert parsed.hostname is not None
    assert parsed.port is not None
    proxy = Proxy(parsed.hostname, parsed.port)  # not started: DynamoDB refuses connections
    orders = [uuid.uuid4().hex[:10] for _ in range(5)]
    try:
        with workers(1, setup.env(AWS_ENDPOINT_URL_DYNAMODB=proxy.endpoint_url), setup.tmp_path):
            for order in orders:
                send(setup.backend.endpoint_url, setup.queues.queue_url, envelope("charge", {"order": order}))
            await until(
                lambda: setup.log(0).count("idempotency table unreachable") >= len(orders),
                90,
                "every message put back while the table is down",
            )
            assert lines(setup.effects) == []  # fail closed: no handler ran without its guard
            await proxy.start()
            await until(lambda: len(setup.effect_lines("charge")) >= len(orders), 90, "the jobs after recovery")
            await until(setup.drained, 30, "every message acknowledged")
    finally:
        await proxy.stop()
    runs = sorted(line.split()[1] for line in setup.effect_lines("charge"))
    assert runs == sorted(orders)
    async with dynamodb_client(setup.backend.endpoint_url) as client:
        ledger = Ledger(client, setup.table, owner="test-reader")
        for order in orders:
            key = runs_key("charge", {"order": order})
            record = await ledger.get(key)
            assert record is not None
            assert record.state(int(time.time() * 1000)) is State.COMPLETED


def runs_key(job_type: str, payload: dict[str, Any]) -> str:
    """The key the worker derives for an ``idempotent=True`` job."""
    return f"{job_type}:" + hashlib.sha256(canonical_json(payload).encode()).hexdigest()
