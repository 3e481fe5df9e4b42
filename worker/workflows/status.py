"""Reading a workflow's status: its item, plus the ledger record of the job that ends it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from worker.budgets import LEDGER, Budget
from worker.idempotency import Ledger
from worker.workflows.model import WorkflowStatus, final_key, lookup_key, read_status
from worker.workflows.store import WorkflowStore


async def load_status(client: Any, table: str, workflow_id: str, *, budget: Budget = LEDGER) -> WorkflowStatus | None:
    """The status of workflow ``workflow_id`` (also accepted as ``workflow:<id>``), None when there is none."""
    store = WorkflowStore(client, table, budget=budget)
    item = await store.get_key(lookup_key(workflow_id))
    last = final_key(item) if item is not None else None
    if item is None or last is None:
        return None
    final = await Ledger(client, table, owner="sqs-worker-status", budget=budget).get(last)
    return read_status(item, final=final.to_json(int(time.time() * 1000)) if final else None)


def workflow_status(workflow_id: str, *, table: str | None = None) -> WorkflowStatus | None:
    """``load_status`` for a producer: the table from WORKER_IDEMPOTENCY_TABLE unless given, the AWS variables."""
    from worker.backends.aws import async_client
    from worker.errors import ConfigError
    from worker.settings import load_settings

    table = table or load_settings(queue="(not used)").idempotency_table
    if not table:
        raise ConfigError("workflows keep their state in the idempotency table: set WORKER_IDEMPOTENCY_TABLE")

    async def read() -> WorkflowStatus | None:
        async with async_client("dynamodb") as client:
            return await load_status(client, table, workflow_id)

    return asyncio.run(read())
