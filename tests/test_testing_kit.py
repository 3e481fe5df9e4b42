"""worker.testing: the real worker over the in-memory backend, run until idle; the sqs_worker fixture."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from worker import Breaker, JobContext, PermanentError, RetryableError
from worker.enqueue import job_ref
from worker.errors import ConfigError
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.testing import InMemoryWorker


class Email(BaseModel):
    to: str
    subject: str


def mail_registry(sent: list[str]) -> Registry:
    registry = Registry()

    @registry.job("send_email", max_attempts=3)
    async def send_email(payload: Email, ctx: JobContext) -> None:
        if payload.to.endswith("@closed.example"):
            raise PermanentError("the mailbox is closed")
        sent.append(payload.to)

    return registry


def test_one_succeeds_one_is_dead_lettered_as_permanent_and_the_effect_happens_once() -> None:
    sent: list[str] = []
    kit = InMemoryWorker(mail_registry(sent))
    ref = job_ref("send_email", Email)
    ref.enqueue(Email(to="ada@example.com", subject="Hi"), producer=kit.producer)
    ref.enqueue({"to": "bob@closed.example", "subject": "Hi"}, producer=kit.producer)
    result = kit.run_until_idle()
    assert (result.succeeded, result.retried, result.dead_lettered) == (1, 0, 1)
    assert sent == ["ada@example.com"]
    [dead] = result.dead_letters
    assert dead.category == "permanent"
    assert dead.error_message == "PermanentError: the mailbox is closed"
    assert dead.attempts == 1 and dead.job_type == "send_email"
    assert dead.payload == {"to": "bob@closed.example", "subject": "Hi"}
    assert dead.attributes["source_queue"] == "jobs"
    assert kit.counts().total == 0


def test_backoff_delays_pass_at_once_and_attempts_count_up() -> None:
    registry = Registry()
    attempts: list[int] = []

    @registry.job("flaky", max_attempts=4, backoff_base_s=60, backoff_max_s=600)
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RetryableError("upstream busy", delay_s=300 * ctx.attempt)
        return "done"

    kit = InMemoryWorker(registry)
    kit.enqueue("flaky", {})
    result = kit.run_until_idle(timeout_s=10)
    assert attempts == [1, 2, 3]
    assert (result.succeeded, result.retried, result.dead_lettered) == (1, 2, 0)
    assert result.skipped_s >= 900 - 1  # the 300 s and 600 s retry delays, skipped
    assert [e.delay_s for e in result.of(Kind.RETRY_SCHEDULED)] == [300, 600]


def test_exhausted_and_invalid_payloads_reach_the_dlq_with_their_category() -> None:
    registry = Registry()

    @registry.job("always_down", max_attempts=3, backoff_base_s=30)
    def always_down(payload: dict[str, Any]) -> None:  # a plain def: runs in a worker thread
        raise ConnectionError("refused")

    @registry.job("send_email")
    async def send_email(payload: Email) -> None:
        raise AssertionError("an invalid payload never reaches the handler")

    kit = InMemoryWorker(registry)
    kit.enqueue("always_down", {"n": 1})
    kit.enqueue("send_email", {"to": 42})
    kit.send_raw("not json")
    result = kit.run_until_idle()
    categories = sorted(str(dead.category) for dead in result.dead_letters)
    assert categories == ["exhausted", "invalid_message", "invalid_payload"]
    exhausted = next(dead for dead in result.dead_letters if dead.category == "exhausted")
    assert exhausted.attempts == 3 and exhausted.error_message == "ConnectionError: refused"
    assert exhausted.receive_count == 3 == int(exhausted.attributes["receive_count"])


def test_hostile_bodies_are_dead_letters_whose_job_type_and_payload_are_none() -> None:
    kit = InMemoryWorker(Registry())
    for body in ("[" * 100_000, '{"type": "x", "payload": {"n": ' + "9" * 5000 + "}}", "[1]"):
        kit.send_raw(body)
    result = kit.run_until_idle()
    assert [str(dead.category) for dead in result.dead_letters] == ["invalid_message"] * 3
    assert [(dead.job_type, dead.payload) for dead in result.dead_letters] == [(None, None)] * 3


def test_idempotency_keys_run_a_job_once() -> None:
    registry = Registry()
    charged: list[str] = []

    @registry.job("charge", key=lambda payload: payload["order"])
    async def charge(payload: dict[str, Any], ctx: JobContext) -> int:
        charged.append(payload["order"])
        return 42

    kit = InMemoryWorker(registry)
    kit.enqueue("charge", {"order": "o-1"})
    first = kit.run_until_idle()
    kit.enqueue("charge", {"order": "o-1"})
    kit.enqueue("charge", {"order": "o-1"}, idempotency_key=None)
    second = kit.run_until_idle()
    assert charged == ["o-1"]
    assert (first.succeeded, second.duplicates_skipped) == (1, 2)
    record = kit.ledger_record("charge:o-1")
    assert record is not None and record.result == 42


def test_fifo_groups_run_in_order_and_a_failure_holds_its_group() -> None:
    registry = Registry()
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    @registry.job("step", max_attempts=3, backoff_base_s=10)
    async def step(payload: dict[str, Any], ctx: JobContext) -> None:
        with lock:
            seen.append((payload["group"], payload["n"]))
        if payload["n"] == 1 and payload["group"] == "a" and ctx.attempt == 1:
            raise RetryableError("once", delay_s=120)

    kit = InMemoryWorker(registry, queue="jobs.fifo")
    for n in range(4):
        for group in ("a", "b"):
            kit.enqueue("step", {"group": group, "n": n}, group_id=group)
    result = kit.run_until_idle()
    assert result.succeeded == 8 and result.retried == 1
    for group in ("a", "b"):
        order = [n for g, n in seen if g == group]
        assert sorted(set(order)) == [0, 1, 2, 3]
        first_done = [n for i, n in enumerate(order) if n not in order[:i]]
        assert first_done == [0, 1, 2, 3]  # nothing of a group overtook its earlier message
    assert [n for g, n in seen if g == "a"] == [0, 1, 1, 2, 3]


def test_sqs_worker_fixture_routes_enqueue_to_memory(sqs_worker: InMemoryWorker) -> None:
    job_ref("nobody_handles_this").enqueue({"x": 1})
    result = sqs_worker.run_until_idle()
    [dead] = result.dead_letters
    assert dead.category == "unknown_type"


def test_run_until_idle_refuses_a_running_loop_and_bounds_a_job_that_never_ends() -> None:
    registry = Registry()

    @registry.job("forever", timeout_s=60)
    async def forever(payload: dict[str, Any]) -> None:
        kit.enqueue("forever", {})

    kit = InMemoryWorker(registry)
    kit.enqueue("forever", {})
    with pytest.raises(TimeoutError, match="not idle after 1 s"):
        kit.run_until_idle(timeout_s=1)


async def test_run_until_idle_inside_a_loop_says_what_to_use() -> None:
    kit = InMemoryWorker(Registry())
    with pytest.raises(ConfigError, match="run_until_idle_async"):
        kit.run_until_idle()
    assert (await kit.run_until_idle_async()).succeeded == 0


@pytest.mark.parametrize("delay", [{"delay_s": 901}, {"delay_s": 7200}, {"run_in_s": 30}])
def test_long_delays_and_run_at_pass_at_once(delay: dict[str, int]) -> None:
    sent: list[str] = []
    kit = InMemoryWorker(registry=mail_registry(sent))
    with kit.producing():
        ref = job_ref("send_email")
        if "run_in_s" in delay:
            ref.enqueue(Email(to="ada@example.com", subject="Hi"), run_at=datetime.now(UTC) + timedelta(seconds=30))
        else:
            ref.enqueue(Email(to="ada@example.com", subject="Hi"), delay_s=delay["delay_s"])
    result = kit.run_until_idle(timeout_s=10)
    assert sent == ["ada@example.com"]
    assert result.succeeded == 1 and kit.counts().total == 0


def test_rate_limit_holds_pass_on_the_skipping_clock_and_lose_nothing_on_fifo() -> None:
    """A rate limit's hold is a delay like a backoff: the clock skips it, and the gate sees that time pass (it did
    not: the held messages came back at once, again and again, until the redrive policy took them)."""
    registry = Registry()
    starts: list[tuple[int, int, int]] = []

    @registry.job("limited", rate_limit="1/m")
    async def limited(payload: dict[str, int], ctx: JobContext) -> None:
        starts.append((payload["id"], ctx.attempt, ctx.receive_count))

    kit = InMemoryWorker(registry, queue="jobs.fifo")
    for n in range(2):
        kit.enqueue("limited", {"id": n}, group_id=f"g{n}")
    result = kit.run_until_idle(timeout_s=20)
    assert (result.succeeded, result.dead_lettered) == (2, 0)
    assert sorted(n for n, _, _ in starts) == [0, 1]
    assert all(attempt == 1 and receives <= 3 for _, attempt, receives in starts), starts  # held once or twice
    # The second start is about 61 s after the first: skipped but for its reserved start (at most 5 s ahead), which
    # is waited in real time.
    assert 50 <= result.skipped_s <= 120


def test_a_breaker_cooldown_passes_on_the_skipping_clock() -> None:
    registry = Registry()
    runs: list[tuple[str, int]] = []

    @registry.job("down", max_attempts=1, breaker=Breaker(failures=1, window_s=60, cooldown_s=40))
    async def down(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((payload["id"], ctx.receive_count))
        if payload["fail"]:
            raise RuntimeError("down")

    kit = InMemoryWorker(registry, concurrency=1)
    kit.enqueue("down", {"id": "fail", "fail": True})
    kit.enqueue("down", {"id": "ok", "fail": False}, delay_s=1)  # arrives while the breaker is open
    result = kit.run_until_idle(timeout_s=20)
    assert (result.succeeded, result.dead_lettered) == (1, 1)
    [receives] = [count for job_id, count in runs if job_id == "ok"]
    assert receives <= 4, runs  # held through the cooldown a few times, not once per skipped second
    assert 39 <= result.skipped_s <= 200


def test_a_workflow_started_inside_the_kit_is_refused_not_sent_to_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """chain/group .start() would write to DynamoDB and send to SQS: inside the kit it says so instead (it had
    sent the first step to whatever queue the shell's AWS variables named, and the kit ran nothing)."""
    from worker.producer import Job
    from worker.workflows import chain, group

    monkeypatch.setenv("WORKER_QUEUE", "jobs")
    monkeypatch.setenv("WORKER_IDEMPOTENCY_TABLE", "ledger")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # were it reached: a refused connection, not AWS
    kit = InMemoryWorker(Registry())
    with kit.producing():
        with pytest.raises(ConfigError, match="the kit does not run workflows"):
            chain(Job("a", {}), Job("b", {})).start()
        with pytest.raises(ConfigError, match="the kit does not run workflows"):
            group([Job("a", {})], callback=Job("b", {})).start()
    assert kit.counts().total == 0
