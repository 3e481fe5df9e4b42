"""Handlers for the idempotency end-to-end tests (``sqs-worker run`` as real processes).

Each run appends one line to the file named by ``TEST_EFFECTS_FILE`` (``<event> <order> pid=<pid>``), so a test
sees which process ran what, and how often. Jobs sleep ``seconds`` (the work itself) so duplicates and crashes
land while a job is running.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from tests.support.handlers import record
from worker import JobContext, job


@job("charge", idempotent=True, max_attempts=5, timeout_s=60)
async def charge(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    order = payload["order"]
    record(f"charge {order} pid={os.getpid()} key={ctx.idempotency_key}")
    ctx.progress(50, "charging")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    return {"order": order, "pid": os.getpid()}


@job("slow_charge", key=lambda payload: str(payload["order"]), max_attempts=5, timeout_s=60)
def slow_charge(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    order = payload["order"]
    record(f"started {order} pid={os.getpid()}")
    ctx.progress(10, "started")
    time.sleep(float(payload.get("seconds", 3)))  # the work itself, in a thread
    record(f"finished {order} pid={os.getpid()}")
    return {"order": order, "pid": os.getpid()}
