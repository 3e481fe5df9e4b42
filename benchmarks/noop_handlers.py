"""The no-op job for ``sqs-worker run`` in benchmarks/compare_celery.py (WORKER_HANDLERS=benchmarks.noop_handlers).

It does what the Celery task in benchmarks/celery_app.py does: record one line in the side channel, nothing else.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.effects import record
from worker import JobContext, job


@job("noop", max_attempts=3, timeout_s=30)
async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    record(float(payload["sent_at"]))


@job("burn", max_attempts=3, timeout_s=30)
async def burn(payload: dict[str, Any], ctx: JobContext) -> None:
    """Burn ``cpu_ms`` of CPU on the event loop (a CPU-bound handler), then record like the no-op."""
    until = time.thread_time() + float(payload["cpu_ms"]) / 1000
    while time.thread_time() < until:
        pass
    record(float(payload["sent_at"]))


@job("nap", max_attempts=3, timeout_s=60)
async def nap(payload: dict[str, Any], ctx: JobContext) -> None:
    """Wait ``sleep_s`` (an I/O-bound handler: many jobs in flight at once), then record like the no-op."""
    await asyncio.sleep(float(payload["sleep_s"]))
    record(float(payload["sent_at"]))
