"""serve-tasks takes no body a task could not hold: what it accepts, ``dlq requeue`` / ``redrive`` can send back
(413 ``too_large`` above that), and a POST without X-CloudTasks-TaskName runs as ``local-<hex>``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import dead_letters, make_dead_letter_table, post, serving, task_headers
from worker.backends.cloudtasks.contract import MAX_TASK_BODY_BYTES
from worker.backends.cloudtasks.producer import build_task
from worker.backends.cloudtasks.settings import CloudTasksSettings
from worker.jobs import Registry

REQUEUE_HEADERS = {  # what `dlq requeue` adds (cloudtasks.dlq.AUDIT_HEADERS), at realistic sizes
    "X-Worker-Requeued-By": "alice",
    "X-Worker-Requeued-At": "2026-11-30T09:00:00.000Z",
    "X-Worker-Requeue-Reason": "fixed in 1.4.2",
    "X-Worker-Requeued-From": "local-" + "0" * 32,
}


def registry() -> Registry:
    jobs = Registry()

    @jobs.job("ok")
    async def ok(payload: dict[str, Any]) -> None:
        return None

    return jobs


@pytest.fixture
def env(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    return backend


async def test_the_largest_accepted_body_can_be_requeued_and_one_more_byte_is_413(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    largest = b"x" * MAX_TASK_BODY_BYTES  # not JSON: dead-lettered as invalid_message, kept byte for byte
    async with serving(registry(), queue="q", dead_letter_table=table, tmp_path=tmp_path) as server:
        status, _, body = await asyncio.to_thread(post, server.url, largest + b"x", task_headers("t-over"))
        assert (status, body["outcome"]) == (413, "too_large")
        status, _, body = await asyncio.to_thread(post, server.url, b"x" * 1_048_578, task_headers("t-over-2"))
        assert status == 413  # the body the issue found accepted
        status, _, body = await asyncio.to_thread(post, server.url, largest, task_headers("t-largest"))
        assert (status, body["outcome"], body["detail"]) == (200, "dead_lettered", "invalid_message")
    (record,) = await dead_letters(env.endpoint_url, table, "q")
    assert record.body == largest
    settings = CloudTasksSettings(url="http://127.0.0.1:9/tasks", shared_secret="s" * 32)
    task = build_task(settings, "projects/p/locations/l/queues/q", record.body, headers=REQUEUE_HEADERS)
    assert task["http_request"]["body"] == largest  # the requeue's task is built, not refused as too large


async def test_a_post_without_a_task_name_runs_as_local_hex(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    headers = {k: v for k, v in task_headers().items() if k != "X-CloudTasks-TaskName"}
    async with serving(registry(), queue="q", dead_letter_table=table, tmp_path=tmp_path) as server:
        status, _, body = await asyncio.to_thread(post, server.url, b"{not json", headers)
        assert (status, body["outcome"]) == (200, "dead_lettered")
    (record,) = await dead_letters(env.endpoint_url, table, "q")
    assert re.fullmatch(r"local-[0-9a-f]{32}", record.task), record.task
