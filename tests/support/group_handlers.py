"""A handler for the WORKER_PROCESSES tests: each job records which process ran it, when it starts and ends."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tests.support.handlers import record
from worker import JobContext, job


@job("where", max_attempts=3, timeout_s=60)
async def where_job(payload: dict[str, Any], ctx: JobContext) -> None:
    record(f"start {payload['n']} {os.getpid()}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    record(f"end {payload['n']} {os.getpid()}")
