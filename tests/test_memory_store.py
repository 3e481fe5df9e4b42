"""The in-memory ledger store against DynamoDB: the same conditional writes give the same answers and items.

The differential test runs every claim case of the ledger's state matrix, and every owned write, on a DynamoDB
endpoint (moto, LocalStack) and on ``MemoryStore`` side by side; the ledger scenarios then run on memory alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from uuid import uuid4

import pytest_asyncio

from tests.support.idempotency import FakeClock
from worker.backends.protocols import LedgerStore
from worker.idempotency import DynamoDBStore, Ledger, Status, create_table, payload_hash
from worker.idempotency.expressions import Absent, Update
from worker.idempotency.ledger import CLAIM_CONDITION, OWNED_CONDITION, REPLACE_CONDITION
from worker.idempotency.memory import MemoryStore

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

HASH = payload_hash("charge", {"order": 1})
OTHER_HASH = payload_hash("charge", {"order": 2})


@pytest_asyncio.fixture(loop_scope="function")
async def table(dynamodb: DynamoDBClient) -> str:
    name = f"ledger-{uuid4().hex[:12]}"
    await create_table(dynamodb, name)
    return name


def states(key: str, now_ms: int, now_s: int) -> list[dict[str, object] | None]:
    cases: list[dict[str, object] | None] = [None]
    for status in Status:
        for owner in ("holder", None):
            for lease_ms in (now_ms + 1, now_ms, 0):
                for hash_ in (HASH, OTHER_HASH):
                    for expiration in (now_s + 100, now_s, now_s - 1):
                        item: dict[str, object] = {
                            "key": key,
                            "status": status.value,
                            "token": 4,
                            "attempts": 3,
                            "lease_expires_at_ms": lease_ms,
                            "payload_hash": hash_,
                            "expiration": expiration,
                            "created_at": now_ms - 5000,
                            "updated_at": now_ms - 1000,
                        }
                        if owner is not None:
                            item["owner"] = owner
                        cases.append(item)
    return cases


async def test_memory_and_dynamodb_answer_every_conditional_write_alike(dynamodb: DynamoDBClient, table: str) -> None:
    now_s = int(time.time())
    now_ms = now_s * 1000 + 500
    dynamo: LedgerStore = DynamoDBStore(dynamodb, table)
    memory: LedgerStore = MemoryStore()
    claim = Update(
        assign={"status": "IN_PROGRESS", "owner": "me", "lease_expires_at_ms": now_ms + 30_000, "progress": 12.5},
        increment=("token", "attempts"),
        keep_if_present={"created_at": now_ms},
        remove=("result", "owner_note"),
    )
    claim_values = {
        "now_ms": now_ms,
        "now_s": now_s,
        "payload_hash": HASH,
        "in_progress": "IN_PROGRESS",
        "failed": "FAILED",
    }
    owned_values = {"in_progress": "IN_PROGRESS", "owner": "holder", "token": 4}
    compared = 0
    for index, case in enumerate(states("k", now_ms, now_s)):
        for name, condition, values in (
            ("claim", CLAIM_CONDITION, claim_values),
            ("owned", OWNED_CONDITION, owned_values),
            ("replace", REPLACE_CONDITION, {"seen_token": 4, "seen_updated_at": now_ms - 1000}),
        ):
            key = f"{name}-{index}-{uuid4().hex[:6]}"
            results: list[object] = []
            for store in (dynamo, memory):
                if case is not None:
                    put = await store.put({**case, "key": key}, condition=Absent("key"), values={})
                    assert put.ok
                results.append(await store.update(key, claim, condition=condition, values=values, return_new=True))
                results.append(await store.get(key))
            assert results[:2] == results[2:], (name, case)
            compared += 1
    assert compared == 3 * (1 + 3 * 2 * 3 * 2 * 3)


async def test_a_claim_runs_once_completes_and_is_then_a_duplicate() -> None:
    store, clock = MemoryStore(), FakeClock()
    first = Ledger(store=store, owner="w1", clock=clock)
    second = Ledger(store=store, owner="w2", clock=clock)
    claim = await first.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    assert (claim.outcome, claim.token, claim.attempts) == ("run", 1, 1)
    busy = await second.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    assert busy.outcome == "busy" and busy.retry_after_s == 30
    assert (await second.claim(key="k", job_type="charge", payload_hash=OTHER_HASH, lease_s=30)).outcome == "conflict"
    assert await first.complete(claim, result={"sent": True}) is True
    duplicate = await second.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    assert duplicate.outcome == "completed"
    assert duplicate.record is not None and duplicate.record.result == {"sent": True}


async def test_a_lapsed_lease_is_taken_over_and_the_stalled_owner_is_fenced() -> None:
    store, clock = MemoryStore(), FakeClock()
    stalled = Ledger(store=store, owner="w1", clock=clock)
    taker = Ledger(store=store, owner="w2", clock=clock)
    old = await stalled.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    clock.advance(31)
    new = await taker.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    assert (new.outcome, new.token, new.attempts) == ("run", 2, 2)
    assert await stalled.renew(old, lease_s=30) is False
    assert await stalled.complete(old) is False
    same_name = Ledger(store=store, owner="w2", clock=clock)
    assert await same_name.complete(old) is False  # the owner's name alone is not enough: the token fences
    assert await taker.complete(new) is True


async def test_release_and_fail_let_the_next_attempt_run_and_expired_items_are_replaced() -> None:
    store, clock = MemoryStore(), FakeClock()
    ledger = Ledger(store=store, owner="w1", clock=clock, ttl_s=60)
    claim = await ledger.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    await ledger.release(claim, error="ConnectionError: down")
    again = await ledger.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    assert (again.outcome, again.attempts) == ("run", 2)
    assert again.record is not None and again.record.last_error == "ConnectionError: down"
    await ledger.fail(again, error="PermanentError: no")
    third = await ledger.claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30)
    assert (third.outcome, third.attempts) == ("run", 3)
    await ledger.complete(third)
    clock.advance(3600)
    fresh = await ledger.claim(key="k", job_type="charge", payload_hash=OTHER_HASH, lease_s=30)
    assert (fresh.outcome, fresh.attempts, fresh.token) == ("run", 1, 4)


async def test_concurrent_claims_of_one_key_run_once() -> None:
    store = MemoryStore()
    ledgers = [Ledger(store=store, owner=f"w{i}") for i in range(3)]
    claims = await asyncio.gather(
        *(ledgers[i % 3].claim(key="k", job_type="charge", payload_hash=HASH, lease_s=30) for i in range(20))
    )
    assert sorted(claim.outcome for claim in claims) == ["busy"] * 19 + ["run"]
