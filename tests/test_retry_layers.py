"""Retries are not stacked (issue 9, item 9): in the worker each try of a budget is one HTTP request (botocore
makes one attempt), in the CLI botocore's attempts are the only retries. Counted at a server answering 503."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.errorserver import Answer, error_server
from worker.backends.aws import async_client, call_with_budget, client_config, sync_client
from worker.budgets import CLI_BOTOCORE_ATTEMPTS, Budget
from worker.errors import LedgerUnavailable
from worker.idempotency import DynamoDBStore
from worker.settings import WorkerSettings

FAST = Budget(
    "test", first_delay_s=0.02, max_delay_s=0.05, give_up_after_s=1.0, then="raise"
)  # a first call may take 0.3 s


@pytest.mark.parametrize("service", ["sqs", "dynamodb"])
def test_each_try_of_a_worker_budget_is_one_request(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with error_server(Answer(503, "ServiceUnavailable")) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        tries = 0

        async def scenario() -> None:
            nonlocal tries
            async with async_client(service, config=client_config(WorkerSettings(queue="q"))) as client:

                async def call() -> Any:
                    nonlocal tries
                    tries += 1
                    if service == "sqs":
                        return await client.get_queue_url(QueueName="q")
                    return await client.get_item(TableName="t", Key={"key": {"S": "k"}})

                with pytest.raises(ClientError):
                    await call_with_budget(call, budget=FAST)

        asyncio.run(scenario())
        assert tries > 1, "the budget retried"
        assert server.requests == tries, f"{server.requests} requests for {tries} tries: botocore retried underneath"


def test_the_ledger_store_retries_by_its_budget_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    with error_server(Answer(500, "InternalServerError")) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)

        async def scenario() -> None:
            async with async_client("dynamodb", config=client_config(WorkerSettings(queue="q"))) as client:
                with pytest.raises(LedgerUnavailable, match="GetItem failed: InternalServerError"):
                    await DynamoDBStore(client, "t", budget=FAST).get("k")

        asyncio.run(scenario())
        assert 1 < server.requests < 200


def test_the_cli_tries_each_call_as_botocore_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    with error_server(Answer(503, "ServiceUnavailable")) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        with pytest.raises(ClientError):
            sync_client("sqs").get_queue_url(QueueName="q")
        assert server.requests == CLI_BOTOCORE_ATTEMPTS


def test_a_batch_is_retried_within_its_budget_then_its_callers_get_the_error() -> None:
    from worker.backends.batching import Batcher, EntryFailed
    from worker.errors import QueueUnavailable

    flushes: list[list[str]] = []

    async def flush(entries: list[str]) -> dict[int, EntryFailed]:
        flushes.append(entries)
        raise QueueUnavailable("DeleteMessageBatch: cannot reach SQS")

    async def scenario() -> None:
        batcher: Batcher[str] = Batcher(flush, name="delete", max_delay_s=0.001, budget=FAST)
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(batcher.submit("a"), batcher.submit("b"), return_exceptions=True)
        assert all(isinstance(result, QueueUnavailable) for result in results)
        assert loop.time() - started < (FAST.give_up_after_s or 0) + 0.5

    asyncio.run(scenario())
    assert len(flushes) > 1
    assert all(entries == ["a", "b"] for entries in flushes)
