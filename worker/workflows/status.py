"""Reading a workflow's status: its item, plus the ledger record of the job that ends it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from worker.budgets import LEDGER, Budget
from worker.idempotency import Ledger
from worker.workflows.model import ITEM_PREFIX, WorkflowStatus, callback_key, item_key, read_status, step_key
from worker.workflows.store import WorkflowStore


async def load_status(client: Any, table: str, workflow_id: str, *, budget: Budget = LEDGER) -> WorkflowStatus | None:
    """The status of workflow ``workflow_id`` (also accepted as ``workflow:<id>``), None when there is none."""
    store = WorkflowStore(client, table, budget=budget)
    key = workflow_id if workflow_id.startswith(ITEM_PREFIX) else item_key(workflow_id)
    item = await store.get_key(key)
    if item is None or item.get("kind") not in ("chain", "group"):
        return None
    found_id = str(item["key"])[len(ITEM_PREFIX) :]
    total = int(item.get("total", 0))
    final_key = callback_key(found_id) if item["kind"] == "group" else step_key(found_id, total - 1)
    final = await Ledger(client, table, owner="sqs-worker-status", budget=budget).get(final_key)
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
