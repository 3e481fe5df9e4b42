"""The ledger against a real DynamoDB endpoint over HTTP (moto server; LocalStack when configured)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING
from uuid import uuid4

import pytest
import pytest_asyncio
from botocore.exceptions import BotoCoreError

from tests.support.backends import Backend
from tests.support.idempotency import FakeClock, WriteCounter, dynamodb_client
from worker.budgets import Budget
from worker.dev.localaws import free_port
from worker.errors import LedgerUnavailable
from worker.idempotency import (
    CONFLICT_REASON,
    Ledger,
    Record,
    State,
    Status,
    create_table,
    decide_claim,
    parse_record,
    payload_hash,
)
from worker.idempotency.dynamodb import encode_value

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

HASH = payload_hash("charge", {"order": 1})
OTHER_HASH = payload_hash("charge", {"order": 2})
LEASE_S = 30.0


@pytest_asyncio.fixture(loop_scope="function")
async def table(dynamodb: DynamoDBClient) -> str:
    name = f"ledger-{uuid4().hex[:12]}"
    assert await create_table(dynamodb, name) is True
    return name


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_ledger(client: DynamoDBClient, table: str, clock: FakeClock, owner: str, **options: float) -> Ledger:
    return Ledger(client, table, owner=owner, clock=clock, **options)  # type: ignore[arg-type]


def new_key() -> str:
    return f"order-{uuid4().hex}"


async def test_create_table_is_on_demand_with_ttl_and_repeatable(dynamodb: DynamoDBClient, table: str) -> None:
    described = (await dynamodb.describe_table(TableName=table))["Table"]
    assert described["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert {a["AttributeName"]: a["AttributeType"] for a in described["AttributeDefinitions"]} == {
        "key": "S",
        "status": "S",  # the status index (the dashboard's lists): tests/test_dashboard_ledger.py
        "updated_at": "N",
    }
    assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = (await dynamodb.describe_time_to_live(TableName=table))["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED"
    assert ttl["AttributeName"] == "expiration"
    assert await create_table(dynamodb, table) is False  # exists: left alone, no error


async def test_claim_complete_then_duplicate_costs_two_writes(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    writes = WriteCounter(dynamodb)
    ledger = make_ledger(dynamodb, table, clock, "w1")
    key = new_key()

    claim = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert (claim.outcome, claim.token, claim.attempts) == ("run", 1, 1)
    assert await ledger.complete(claim, result={"charge_id": "ch_1"}) is True
    assert writes.operations == ["UpdateItem", "UpdateItem"]  # the common path: one claim, one completion

    duplicate = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert duplicate.outcome == "completed"
    assert duplicate.record is not None
    assert duplicate.record.result == {"charge_id": "ch_1"}
    assert writes.count == 3  # the refused claim is its own (billed) write; no read was needed

    record = await ledger.get(key)
    assert record is not None
    assert record.state(int(clock() * 1000)) is State.COMPLETED
    assert (record.status, record.attempts, record.owner, record.token) == (Status.COMPLETED, 1, "w1", 1)
    assert record.lease_expires_at_ms == 0
    assert record.expiration == int(clock()) + 7 * 24 * 3600
    assert record.created_at == record.updated_at == int(clock() * 1000)


async def test_live_lease_is_busy_with_its_remaining_time(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    first = make_ledger(dynamodb, table, clock, "w1")
    second = make_ledger(dynamodb, table, clock, "w2")
    key = new_key()
    assert (await first.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)).outcome == "run"

    clock.advance(10)
    busy = await second.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert busy.outcome == "busy"
    assert busy.retry_after_s == pytest.approx(20.0, abs=0.01)
    record = await second.get(key)
    assert record is not None
    assert (record.owner, record.attempts) == ("w1", 1)  # the refused claim changed nothing


async def test_renewal_keeps_the_lease_alive(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> None:
    first = make_ledger(dynamodb, table, clock, "w1")
    second = make_ledger(dynamodb, table, clock, "w2")
    key = new_key()
    claim = await first.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=10)
    clock.advance(8)
    assert await first.renew(claim, lease_s=10) is True
    clock.advance(8)  # 16 s after the claim: past the first lease, inside the renewed one
    busy = await second.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=10)
    assert busy.outcome == "busy"
    assert busy.retry_after_s == pytest.approx(2.0, abs=0.01)


async def test_lapsed_lease_is_taken_over_and_the_stalled_owner_is_fenced(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    stalled = make_ledger(dynamodb, table, clock, "w1")
    taker = make_ledger(dynamodb, table, clock, "w2")
    key = new_key()
    old = await stalled.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)

    clock.advance(LEASE_S + 0.001)
    new = await taker.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert (new.outcome, new.token, new.attempts) == ("run", 2, 2)

    # The stalled worker wakes up: it can neither extend, nor complete, nor release, nor fail the new attempt.
    assert await stalled.renew(old, lease_s=LEASE_S) is False
    assert await stalled.complete(old, result="stale") is False
    await stalled.release(old, error="stale release")
    await stalled.fail(old, error="stale failure")
    record = await taker.get(key)
    assert record is not None
    assert (record.status, record.owner, record.token, record.last_error) == (Status.IN_PROGRESS, "w2", 2, None)

    assert await taker.complete(new, result="fresh") is True
    assert await stalled.complete(old, result="stale") is False  # also after the new owner completed
    record = await taker.get(key)
    assert record is not None
    assert (record.status, record.owner, record.result) == (Status.COMPLETED, "w2", "fresh")


async def test_same_owner_name_with_an_old_token_is_fenced(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    """The token, not just the owner, fences: a restarted process reusing an owner id cannot complete."""
    ledger = make_ledger(dynamodb, table, clock, "same")
    key = new_key()
    old = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    clock.advance(LEASE_S)
    new = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert new.token == 2
    assert await ledger.complete(old, result="old") is False
    assert await ledger.complete(new, result="new") is True


@pytest.mark.parametrize("settled", ["in_progress", "completed", "failed"])
async def test_a_different_payload_under_the_same_key_is_a_conflict(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock, settled: str
) -> None:
    ledger = make_ledger(dynamodb, table, clock, "w1")
    key = new_key()
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    if settled == "completed":
        await ledger.complete(claim)
    elif settled == "failed":
        await ledger.fail(claim, error="PermanentError: card declined")
    conflict = await ledger.claim(key=key, job_type="charge", payload_hash=OTHER_HASH, lease_s=LEASE_S)
    assert conflict.outcome == "conflict"
    assert conflict.reason == CONFLICT_REASON
    assert conflict.token is None


async def test_release_keeps_attempts_and_last_error_and_lets_the_next_attempt_run(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    first = make_ledger(dynamodb, table, clock, "w1")
    second = make_ledger(dynamodb, table, clock, "w2")
    key = new_key()
    claim = await first.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    await first.release(claim, error="RetryableError: gateway timeout")

    record = await first.get(key)
    assert record is not None
    assert record.state(int(clock() * 1000)) is State.RETRY_PENDING
    assert (record.attempts, record.last_error, record.owner) == (1, "RetryableError: gateway timeout", None)
    # A heartbeat racing the release cannot revive the lease.
    assert await first.renew(claim, lease_s=LEASE_S) is False

    retry = await second.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert (retry.outcome, retry.token, retry.attempts) == ("run", 2, 2)
    assert retry.record is not None
    assert retry.record.last_error == "RetryableError: gateway timeout"  # kept across attempts
    assert await first.complete(claim) is False


async def test_fail_records_failed_and_a_later_claim_runs_again(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    ledger = make_ledger(dynamodb, table, clock, "w1")
    key = new_key()
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    await ledger.fail(claim, error="PermanentError: card declined")
    record = await ledger.get(key)
    assert record is not None
    assert record.state(int(clock() * 1000)) is State.FAILED
    assert (record.status, record.last_error, record.attempts, record.lease_expires_at_ms) == (
        Status.FAILED,
        "PermanentError: card declined",
        1,
        0,
    )
    # A redrive from the DLQ (same key, same payload) may run again; the record counts the new attempt.
    again = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert (again.outcome, again.attempts, again.token) == ("run", 2, 2)
    assert await ledger.complete(again) is True


async def test_an_expired_record_is_replaced_by_a_fresh_claim(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    ledger = make_ledger(dynamodb, table, clock, "w1", ttl_s=3600)
    key = new_key()
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    await ledger.complete(claim, result=1)
    clock.advance(3600)
    record = await ledger.get(key)
    assert record is not None
    assert record.state(int(clock() * 1000)) is State.EXPIRED  # TTL sweeps lag; the ledger treats it as gone

    writes = WriteCounter(dynamodb)
    fresh = await ledger.claim(key=key, job_type="charge", payload_hash=OTHER_HASH, lease_s=LEASE_S)
    assert (fresh.outcome, fresh.attempts, fresh.token) == ("run", 1, 2)  # token stays monotonic
    assert writes.operations == ["UpdateItem", "PutItem"]
    record = await ledger.get(key)
    assert record is not None
    assert (record.result, record.payload_hash, record.status) == (None, OTHER_HASH, Status.IN_PROGRESS)


async def test_complete_is_safe_to_repeat(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> None:
    """A completion retried after its response was lost finds its own COMPLETED item and reports success."""
    ledger = make_ledger(dynamodb, table, clock, "w1")
    claim = await ledger.claim(key=new_key(), job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert await ledger.complete(claim, result="r") is True
    assert await ledger.complete(claim, result="r") is True


@pytest.mark.parametrize(
    ("result", "stored", "note_part"),
    [
        ({"ok": True, "ids": [1, 2]}, {"ok": True, "ids": [1, 2]}, None),
        ("x" * 200, None, "exceed the 100-byte limit"),
        (object(), None, "not JSON-serialisable"),
    ],
)
async def test_results_are_size_capped(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock, result: object, stored: object, note_part: str | None
) -> None:
    ledger = make_ledger(dynamodb, table, clock, "w1", result_max_bytes=100)
    key = new_key()
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
    assert await ledger.complete(claim, result=result) is True
    record = await ledger.get(key)
    assert record is not None
    assert record.result == stored
    if note_part is None:
        assert record.result_note is None
    else:
        assert record.result_note is not None
        assert note_part in record.result_note


async def test_progress_is_rate_limited_and_the_last_value_lands_with_completion(
    dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    writes = WriteCounter(dynamodb)
    ledger = make_ledger(dynamodb, table, clock, "w1", progress_min_interval_s=3600)
    key = new_key()
    claim = await ledger.claim(key=key, job_type="report", payload_hash=HASH, lease_s=LEASE_S)
    for percent in range(1, 51):
        ledger.progress(claim, percent, f"row {percent}")
    await writes.wait_for(2)  # the first report goes out at once
    record = await ledger.get(key)
    assert record is not None
    assert (record.progress, record.progress_note) == (1.0, "row 1")

    assert await ledger.complete(claim, result="done") is True
    assert writes.count == 3  # claim, one progress write, completion (carrying the latest progress)
    record = await ledger.get(key)
    assert record is not None
    assert (record.progress, record.progress_note, record.status) == (50.0, "row 50", Status.COMPLETED)
    ledger.progress(claim, 99, "after the end")  # ignored: the attempt is over
    await ledger.aclose()
    assert writes.count == 3


async def test_progress_writes_again_after_the_interval(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> None:
    writes = WriteCounter(dynamodb)
    ledger = make_ledger(dynamodb, table, clock, "w1", progress_min_interval_s=0.05)
    key = new_key()
    claim = await ledger.claim(key=key, job_type="report", payload_hash=HASH, lease_s=LEASE_S)
    ledger.progress(claim, 10, None)
    await writes.wait_for(2)
    ledger.progress(claim, 20, "b")
    ledger.progress(claim, 30, "c")
    await writes.wait_for(3)  # one trailing write after the interval, with the latest value
    record = await ledger.get(key)
    assert record is not None
    assert (record.progress, record.progress_note) == (30.0, "c")
    await ledger.release(claim, error="RetryableError: later")
    assert writes.count == 4
    await ledger.aclose()


async def test_progress_from_a_handler_thread(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> None:
    ledger = make_ledger(dynamodb, table, clock, "w1", progress_min_interval_s=3600)
    key = new_key()
    claim = await ledger.claim(key=key, job_type="report", payload_hash=HASH, lease_s=LEASE_S)

    def sync_handler() -> None:
        for percent in range(0, 101, 10):
            ledger.progress(claim, percent, "thread")

    await asyncio.to_thread(sync_handler)
    await asyncio.sleep(0)  # let the callbacks the thread scheduled with call_soon_threadsafe run
    assert await ledger.complete(claim) is True
    record = await ledger.get(key)
    assert record is not None
    assert (record.progress, record.progress_note) == (100.0, "thread")


async def test_concurrent_claims_of_one_key_run_once(backend: Backend, table: str, clock: FakeClock) -> None:
    """20 claims of the same key from 3 ledgers, each with its own client and owner: exactly one runs."""
    key = new_key()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(dynamodb_client(backend.endpoint_url)) for _ in range(3)]
        ledgers = [make_ledger(client, table, clock, f"w{i}") for i, client in enumerate(clients)]
        claims = await asyncio.gather(
            *(ledgers[i % 3].claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S) for i in range(20))
        )
    outcomes = sorted(claim.outcome for claim in claims)
    assert outcomes == ["busy"] * 19 + ["run"]
    winner = next(claim for claim in claims if claim.outcome == "run")
    assert (winner.token, winner.attempts) == (1, 1)


async def test_missing_table_is_unavailable_with_a_hint(dynamodb: DynamoDBClient, clock: FakeClock) -> None:
    ledger = make_ledger(dynamodb, f"missing-{uuid4().hex[:8]}", clock, "w1")
    with pytest.raises(LedgerUnavailable, match=r"table .missing-.* does not exist: run `sqs-worker bootstrap`"):
        await ledger.claim(key=new_key(), job_type="charge", payload_hash=HASH, lease_s=LEASE_S)


async def test_unreachable_endpoint_raises_ledger_unavailable(clock: FakeClock) -> None:
    async with dynamodb_client(f"http://127.0.0.1:{free_port()}", retries=1) as client:
        quick = Budget("test", first_delay_s=0.01, max_delay_s=0.02, give_up_after_s=0.1, then="raise")
        ledger = Ledger(client, "any", owner="w1", clock=clock, budget=quick)
        with pytest.raises(LedgerUnavailable) as caught:
            await ledger.claim(key=new_key(), job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
        assert isinstance(caught.value.__cause__, BotoCoreError)
        with pytest.raises(LedgerUnavailable):
            await ledger.get("k")
        with pytest.raises(LedgerUnavailable):
            await create_table(client, "any")


async def test_the_claim_condition_agrees_with_decide_claim(dynamodb: DynamoDBClient, table: str) -> None:
    """Every combination of stored state, lease, expiry and payload, at the boundaries: the one conditional
    write grants exactly the claims the pure ``decide_claim`` says run (or replace, for expired items)."""
    clock = FakeClock(start_s=int(time.time()) + 0.5)  # exact in binary: now_ms and now_s have no rounding
    now_ms, now_s = int(clock() * 1000), int(clock())
    ledger = make_ledger(dynamodb, table, clock, "claimer")
    cases = [None] + [
        (status, owner, lease_ms, hash_, expiration)
        for status in Status
        for owner in ("holder", None)
        for lease_ms in (now_ms + 1, now_ms, 0)
        for hash_ in (HASH, OTHER_HASH)
        for expiration in (now_s + 100, now_s, now_s - 1)
    ]
    for case in cases:
        key = new_key()
        old: Record | None = None
        if case is not None:
            status, owner, lease_ms, hash_, expiration = case
            item: dict[str, object] = {
                "key": key,
                "status": status.value,
                "owner": owner,
                "token": 4,
                "attempts": 3,
                "lease_expires_at_ms": lease_ms,
                "payload_hash": hash_,
                "job_type": "charge",
                "expiration": expiration,
                "created_at": now_ms - 5000,
                "updated_at": now_ms - 1000,
            }
            await dynamodb.put_item(
                TableName=table, Item={name: encode_value(value) for name, value in item.items() if value is not None}
            )
            old = parse_record(item)
        expected = decide_claim(old, payload_hash=HASH, now_ms=now_ms)
        claim = await ledger.claim(key=key, job_type="charge", payload_hash=HASH, lease_s=LEASE_S)
        assert claim.outcome == ("run" if expected == "replace" else expected), case
        if claim.outcome == "run":
            fresh = old is None or expected == "replace"
            assert claim.token == (1 if old is None else 5), case
            assert claim.attempts == (1 if fresh else 4), case
        else:
            assert await ledger.get(key) == old, case  # a refused claim leaves the item untouched
