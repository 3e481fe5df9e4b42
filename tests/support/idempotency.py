"""Helpers for the idempotency tests: a settable clock, a DynamoDB write counter, client factories."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

WRITE_OPERATIONS = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})


class FakeClock:
    """Epoch seconds that move only when a test moves them."""

    def __init__(self, start_s: float | None = None) -> None:
        self.now_s = time.time() if start_s is None else start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


class WriteCounter:
    """Counts DynamoDB write calls made through one client (botocore ``before-call`` event hook)."""

    def __init__(self, client: DynamoDBClient) -> None:
        self.operations: list[str] = []
        self.answered = 0
        self._changed = asyncio.Event()
        client.meta.events.register("before-call.dynamodb.*", self._on_call)
        client.meta.events.register("after-call.dynamodb.*", self._on_answer)

    def _on_call(self, model: Any, **_: Any) -> None:
        if model.name in WRITE_OPERATIONS:
            self.operations.append(model.name)

    def _on_answer(self, model: Any, **_: Any) -> None:
        if model.name in WRITE_OPERATIONS:
            self.answered += 1
            self._changed.set()

    @property
    def count(self) -> int:
        return len(self.operations)

    async def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        """Wait until at least ``count`` writes were answered by the server."""
        async with asyncio.timeout(timeout_s):
            while self.answered < count:
                self._changed.clear()
                await self._changed.wait()


@asynccontextmanager
async def dynamodb_client(endpoint_url: str, *, retries: int | None = None) -> AsyncIterator[DynamoDBClient]:
    """An aiobotocore DynamoDB client for a local endpoint; ``retries`` caps botocore's attempts."""
    config = AioConfig(connect_timeout=2, read_timeout=10)
    if retries is not None:
        retry_config = {"total_max_attempts": retries, "mode": "standard"}
        config = AioConfig(connect_timeout=1, read_timeout=5, retries=retry_config)
    async with get_session().create_client(
        "dynamodb", region_name="us-east-1", endpoint_url=endpoint_url, config=config
    ) as client:
        yield client
