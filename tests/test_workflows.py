"""Workflows on a real queue and table (moto and LocalStack): chains, groups, duplicates, a crash mid-callback."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
import pytest_asyncio
from aiobotocore.session import get_session

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.idempotency import dynamodb_client
from tests.support.queues import assert_queue_empty, message_count
from worker import JobContext, PermanentError
from worker.backends.sqs import Queue
from worker.envelope import parse_envelope
from worker.errors import QueueUnavailable
from worker.idempotency import Ledger, create_table
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.ops.bootstrap import Created
from worker.producer import Job
from worker.workflows import WorkflowHooks, WorkflowStore, chain, group, item_key, read_status
from worker.workflows.model import callback_input, inline_limit_bytes, pack_result
from worker.workflows.status import load_status


@dataclass
class Env:
    backend: Backend
    queues: Created
    table: str
    dynamodb: Any
    runs: list[tuple[str, Any]] = field(default_factory=list)
    fixed: bool = False  # the cause of the "fail" payloads is fixed: they succeed now
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def start_kwargs(self) -> dict[str, Any]:
        url = self.backend.endpoint_url
        return {
            "sqs": sqs_client(url),
            "dynamodb": boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1"),
            "queue": self.queues.queue_url,
            "table": self.table,
        }

    def hooks(self, queue: Queue, dlq: Queue) -> WorkflowHooks:
        return WorkflowHooks(WorkflowStore(self.dynamodb, self.table), queue=queue, dlq=dlq)

    def ledger(self) -> Ledger:
        return Ledger(self.dynamodb, self.table, owner=f"test-{uuid.uuid4().hex[:6]}", progress_min_interval_s=0)

    def record(self, name: str, value: Any) -> None:
        self.runs.append((name, value))
        self.changed.set()

    async def wait_runs(self, name: str, count: int, timeout_s: float = 30) -> list[Any]:
        async def waiter() -> None:
            while len(self.of(name)) < count:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(waiter(), timeout_s)
        return self.of(name)

    def of(self, name: str) -> list[Any]:
        return [value for run, value in self.runs if run == name]

    async def status(self, workflow_id: str) -> dict[str, Any]:
        """As ``sqs-worker status`` reads it: the workflow's item and the ledger record of the job that ends it."""
        status = await load_status(self.dynamodb, self.table, workflow_id)
        assert status is not None
        return status.to_json()


@pytest_asyncio.fixture(loop_scope="function")
async def env(backend: Backend) -> AsyncIterator[Env]:
    table = f"wf-{uuid.uuid4().hex[:12]}"
    async with dynamodb_client(backend.endpoint_url) as client:
        await create_table(client, table)
        yield Env(backend, make_queues(backend.endpoint_url, max_receive_count=20), table, client)


def registry_for(env: Env) -> Registry:
    registry = Registry()

    @registry.job("add", max_attempts=2, backoff_base_s=0)
    def add(payload: dict[str, Any], ctx: JobContext) -> int:
        if payload.get("fail") and not env.fixed:
            raise PermanentError("refused on purpose")
        total = int(payload["n"]) + int(ctx.previous_result or 0)
        env.record("add", (ctx.workflow_id, ctx.previous_result, total))
        return total

    @registry.job("square", max_attempts=2, backoff_base_s=0)
    async def square(payload: dict[str, Any], ctx: JobContext) -> Any:
        if payload.get("fail"):
            raise PermanentError(f"member {payload['i']} refused")
        env.record("square", payload["i"])
        return "x" * 10_000 if payload.get("big") else payload["i"] ** 2

    @registry.job("collect", max_attempts=2, backoff_base_s=0)
    async def collect(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        env.record("collect", ctx.previous_result)
        return {"label": payload.get("label"), "count": len(ctx.previous_result["results"])}

    return registry


async def test_chain_passes_each_result_on_and_finishes(env: Env) -> None:
    flow = chain(Job("add", {"n": 1}), Job("add", {"n": 10}), Job("add", {"n": 100}))
    workflow_id = flow.start(**env.start_kwargs())
    async with running_worker(
        env.backend.endpoint_url, env.queues, registry_for(env), ledger=env.ledger(), workflows=env.hooks
    ) as running:
        runs = await env.wait_runs("add", 3)
        await running.recorder.wait_count(Kind.SUCCEEDED, 3)
    assert runs == [(workflow_id, None, 1), (workflow_id, 1, 11), (workflow_id, 11, 111)]
    status = await env.status(workflow_id)
    assert (status["state"], status["done"], status["total"], status["result"]) == ("succeeded", 3, 3, 111)
    assert_queue_empty(sqs_client(env.backend.endpoint_url), env.queues.queue_url)


async def test_a_failed_step_dead_letters_with_the_chain_id_and_stops_the_chain(env: Env) -> None:
    flow = chain(Job("add", {"n": 1}), Job("add", {"n": 2, "fail": True}), Job("add", {"n": 3}))
    workflow_id = flow.start(**env.start_kwargs())
    async with running_worker(
        env.backend.endpoint_url, env.queues, registry_for(env), ledger=env.ledger(), workflows=env.hooks
    ) as running:
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
        [dead] = drain(env.backend.endpoint_url, env.queues.dlq_url, expect=1)
        assert dead["MessageAttributes"]["workflow_id"]["StringValue"] == workflow_id
        assert dead["MessageAttributes"]["error_category"]["StringValue"] == "permanent"
        assert len(env.of("add")) == 1  # the third step never ran
        status = await env.status(workflow_id)
        assert (status["state"], status["done"], status["total"]) == ("failed", 1, 3)
        assert status["failed"] == [{"index": 1, "type": "add", "error": "PermanentError: refused on purpose"}]
        assert_queue_empty(sqs_client(env.backend.endpoint_url), env.queues.queue_url)
        # The cause fixed, the step requeued from the DLQ (its body as it was, as `dlq requeue` sends it): the
        # chain resumes where it stopped.
        env.fixed = True
        send(env.backend.endpoint_url, env.queues.queue_url, dead["Body"])
        runs = await env.wait_runs("add", 3)
        await running.recorder.wait_count(Kind.SUCCEEDED, 3)
    assert runs[1:] == [(workflow_id, 1, 3), (workflow_id, 3, 6)]
    status = await env.status(workflow_id)
    assert (status["state"], status["done"], status["failed"], status["result"]) == ("succeeded", 3, [], 6)


async def test_group_callback_runs_once_through_duplicate_deliveries(env: Env) -> None:
    members = [Job("square", {"i": i}) for i in range(6)]
    flow = group(members, callback=Job("collect", {"label": "squares"}))
    workflow_id = flow.start(**env.start_kwargs())
    # Every member delivered twice more (SQS's at-least-once): same bodies, as a redelivery brings them.
    sqs = sqs_client(env.backend.endpoint_url)
    sends: list[CrashingQueue] = []

    def counting(queue: Queue) -> Queue:
        sends.append(CrashingQueue(queue, crashes=0))
        return sends[0]

    bodies = []
    for message in drain(env.backend.endpoint_url, env.queues.queue_url, expect=6):
        bodies.append(message["Body"])
    for body in bodies * 3:
        send(env.backend.endpoint_url, env.queues.queue_url, body)
    async with running_worker(
        env.backend.endpoint_url,
        env.queues,
        registry_for(env),
        ledger=env.ledger(),
        workflows=lambda queue, dlq: env.hooks(counting(queue), dlq),
        visibility_timeout_s=3,  # a copy that met a running member's lease is put back until the lease ends
    ) as running:
        [callback] = await env.wait_runs("collect", 1)
        # 18 member copies and the callback (sent again by a duplicate that finds the group complete while the
        # first send is in flight, at most once per copy): each copy ends as run once or a completed duplicate.
        await running.recorder.wait_for(lambda r: message_count(sqs, env.queues.queue_url) == 0, timeout_s=60)
        skipped = running.recorder.of(Kind.DUPLICATE_SKIPPED)
        callbacks = [body for body in sends[0].sent if '"kind":"callback"' in body]
        print(f"group of 6, 18 copies: {len(skipped)} duplicates skipped, callback sent {len(callbacks)} time(s)")
        # Once; twice only when one MessageId reaches two receive loops at once (moto's receive takes no lock).
        assert 1 <= len(callbacks) <= 2
    assert_queue_empty(sqs, env.queues.queue_url)
    assert sorted(env.of("square")) == list(range(6))
    assert env.of("collect") == [callback]
    assert callback == {"group_id": workflow_id, "results": [0, 1, 4, 9, 16, 25], "failed": []}
    status = await env.status(workflow_id)
    assert (status["done"], status["total"], status["callback_state"]) == (6, 6, "sent")


async def test_failed_members_are_listed_for_the_callback(env: Env) -> None:
    members = [Job("square", {"i": 0}), Job("square", {"i": 1, "fail": True}), Job("square", {"i": 2, "big": True})]
    workflow_id = group(members, callback=Job("collect")).start(**env.start_kwargs())
    async with running_worker(
        env.backend.endpoint_url, env.queues, registry_for(env), ledger=env.ledger(), workflows=env.hooks
    ):
        [callback] = await env.wait_runs("collect", 1)
    assert callback["results"] == [0, None, {"result_ref": f"workflow:{workflow_id}:2"}]
    assert callback["failed"] == [{"index": 1, "type": "square", "error": "PermanentError: member 1 refused"}]
    [dead] = drain(env.backend.endpoint_url, env.queues.dlq_url, expect=1)  # the failed member itself
    assert dead["MessageAttributes"]["workflow_id"]["StringValue"] == workflow_id


async def test_a_member_of_unknown_type_counts_as_failed_so_the_group_finishes(env: Env) -> None:
    members = [Job("square", {"i": 3}), Job("no_such_job", {})]
    workflow_id = group(members, callback=Job("collect")).start(**env.start_kwargs())
    async with running_worker(
        env.backend.endpoint_url, env.queues, registry_for(env), ledger=env.ledger(), workflows=env.hooks
    ):
        [callback] = await env.wait_runs("collect", 1)
    assert callback["results"] == [9, None]
    [failure] = callback["failed"]
    assert (failure["index"], failure["type"]) == (1, "no_such_job")
    assert failure["error"].startswith("unknown_type: no handler is registered for job type 'no_such_job'")
    [dead] = drain(env.backend.endpoint_url, env.queues.dlq_url, expect=1)
    assert dead["MessageAttributes"]["error_category"]["StringValue"] == "unknown_type"
    assert dead["MessageAttributes"]["workflow_id"]["StringValue"] == workflow_id


async def test_dead_letter_policy_sends_the_callback_to_the_dlq(env: Env) -> None:
    members = [Job("square", {"i": 0}), Job("square", {"i": 1, "fail": True})]
    workflow_id = group(members, callback=Job("collect"), on_failure="dead_letter").start(**env.start_kwargs())
    async with running_worker(
        env.backend.endpoint_url, env.queues, registry_for(env), ledger=env.ledger(), workflows=env.hooks
    ) as running:
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
        dead = drain(env.backend.endpoint_url, env.queues.dlq_url, expect=2)
        assert env.of("collect") == []
        bodies = {json.loads(m["Body"])["type"]: m for m in dead}
        assert set(bodies) == {"square", "collect"}
        attributes = bodies["collect"]["MessageAttributes"]
        assert attributes["workflow_id"]["StringValue"] == workflow_id
        assert attributes["error_message"]["StringValue"].startswith(f"group {workflow_id}: 1 of 2 members failed")
        # The callback's send to the DLQ is marked right after it (no event says when): a bounded look.
        deadline = asyncio.get_running_loop().time() + 10
        while (state := (await env.status(workflow_id))["state"]) != "dead_lettered":
            assert asyncio.get_running_loop().time() < deadline, f"state stayed {state!r}"
            await asyncio.sleep(0.05)
        # Requeued once the cause is fixed (its body as it was, as `dlq requeue` sends it; to this worker: a new
        # one could lose it to the abandoned long poll of the one before): the callback runs, the group follows it.
        send(env.backend.endpoint_url, env.queues.queue_url, bodies["collect"]["Body"])
        await env.wait_runs("collect", 1)
        await running.recorder.wait_count(Kind.SUCCEEDED, 2)  # the member that succeeded, then the callback
    status = await env.status(workflow_id)
    assert (status["state"], status["result"]) == ("succeeded", {"label": None, "count": 2})


class CrashingQueue(Queue):
    """A queue whose next ``crashes`` sends fail: a worker killed between the flip and the callback's send."""

    def __init__(self, inner: Queue, crashes: int) -> None:
        super().__init__(inner.client, inner.url)
        self.crashes = crashes
        self.sent: list[str] = []

    async def send(self, body: str, **kwargs: Any) -> str:
        if self.crashes:
            self.crashes -= 1
            raise QueueUnavailable("killed before the send")
        self.sent.append(body)
        return await super().send(body, **kwargs)


async def test_a_crash_between_flip_and_send_is_repaired_by_the_redelivered_member(env: Env) -> None:
    """The hooks alone, step by step: the last member's finish flips ``callback_state`` and dies before its
    send; its message was never deleted, so it comes back as a completed duplicate and sends the callback."""
    workflow_id = group([Job("square", {"i": i}) for i in range(2)], callback=Job("collect")).start(
        **env.start_kwargs()
    )
    members = [parse_envelope(m["Body"]) for m in drain(env.backend.endpoint_url, env.queues.queue_url, expect=2)]
    members.sort(key=lambda e: e.workflow.index if e.workflow else 0)
    async with get_session().create_client(
        "sqs", endpoint_url=env.backend.endpoint_url, region_name="us-east-1"
    ) as client:
        queue = CrashingQueue(Queue(client, env.queues.queue_url), crashes=1)
        hooks = WorkflowHooks(
            WorkflowStore(env.dynamodb, env.table), queue=queue, dlq=Queue(client, env.queues.dlq_url)
        )
        ledger = env.ledger()  # the members' completions, as the worker records them before it tells the hooks
        for index, member in enumerate(members):
            assert member.idempotency_key is not None
            claim = await ledger.claim(key=member.idempotency_key, job_type="square", payload_hash="h", lease_s=30)
            assert await ledger.complete(claim, result=index * 10)
        await hooks.succeeded(members[0], 0, message_id="m0")
        with pytest.raises(QueueUnavailable):
            await hooks.succeeded(members[1], 1, message_id="m1")
        item = await WorkflowStore(env.dynamodb, env.table).get(workflow_id)
        assert item is not None and item["callback_state"] == "sending" and queue.sent == []
        await hooks.succeeded(members[0], 0, message_id="m0")  # another member's copy leaves the flag alone
        assert queue.sent == []
        await hooks.succeeded(members[1], 1, message_id="m1")  # the redelivered copy
        await hooks.succeeded(members[0], 0, message_id="m0")  # a late duplicate of the other: nothing more
        await hooks.succeeded(members[1], 1, message_id="m1")
        await queue.drain()
    assert len(queue.sent) == 1
    callback = parse_envelope(queue.sent[0])
    assert callback.idempotency_key == f"workflow:{workflow_id}:callback"
    assert callback.workflow is not None and callback.workflow.input["results"] == [0, 10]
    item = await WorkflowStore(env.dynamodb, env.table).get(workflow_id)
    assert item is not None and item["callback_state"] == "sent" and item["done"] == {"0", "1"}


# ----------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("result", "limit", "packed"),
    [(5, 10, 5), ("x" * 20, 10, {"result_ref": "k"}), ({"a": 1}, 7, {"a": 1}), (object(), 100, {"result_ref": "k"})],
)
def test_pack_result_inlines_small_json_and_refers_to_the_rest(result: Any, limit: int, packed: Any) -> None:
    assert pack_result(result, key="k", limit_bytes=limit) == packed


def test_inline_results_of_a_large_group_stay_within_the_budget() -> None:
    assert inline_limit_bytes(1) == 4096
    assert inline_limit_bytes(1000) * 1000 <= 200_000


def test_callback_input_lists_results_in_order_and_failures() -> None:
    item = {
        "key": item_key("g"),
        "total": 3,
        "types": '["a","b","c"]',
        "e_1": "boom",
        "failed": {"1"},
        "done": {"0", "1", "2"},
    }
    assert callback_input("g", item, [1, "stale", {"x": 2}]) == {
        "group_id": "g",
        "results": [1, None, {"x": 2}],
        "failed": [{"index": 1, "type": "b", "error": "boom"}],
    }
    status = read_status({**item, "kind": "group", "callback_state": "sent"}, final={"state": "COMPLETED", "result": 7})
    assert (status.state, status.percent, status.result) == ("succeeded", 100.0, 7)
    running = read_status({**item, "kind": "group", "done": {"0"}}, final=None)
    assert (running.state, running.percent) == ("running", 33.3)
    assert "1 of 3 done (33.3%)" in running.format()
